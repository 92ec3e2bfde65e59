// The admin API: root-only access, CRUD of users, keys and channels,
// validation, and changes reaching every worker within 1 s without reload.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, eventually, hex, makeChannel, makeKey,
    makeUser, makeUserKey, rawHttp, settle, startGateway, tearDown, times, uniq,
    PROPAGATION_MS,
} from '../lib/harness.mjs';
import { startMock } from '../lib/mock.mjs';

/* reuseport: the kernel spreads connections over both workers. */
const SPREAD = { listen: 'reuseport', server: 'add_header X-Worker $pid always;' };

describe('admin API', { timeout: 180000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-admin');

    before(async () => {
        db = await createDb();
        mock = await startMock();
        gw = await startGateway({ db, ...SPREAD });
        await makeChannel(gw, { base_url: mock.url, models: [M] });
        await settle();
    });

    after(() => tearDown(db, [gw], [mock]));

    /*
     * 16 requests on separate connections, after the change had its 1 s:
     * every one must show it, and both workers must have answered.
     */
    async function everyWorker(t0, send, check) {
        await settle(t0);
        const rs = await times(16, () => send());
        rs.forEach((r, i) => check(r, i));
        const workers = new Set(rs.map((r) => r.headers['x-worker']));
        assert.equal(workers.size, 2, `answered by workers ${[...workers]}`);
    }

    test('no token: 401; a client key: 403; a wrong root token: 401', async () => {
        const { key } = await makeUserKey(gw);
        await eventually(async () => assertOk(await gw.chat(key, M)), { ms: PROPAGATION_MS });
        for (const p of ['/api/user/1', '/api/token/1', '/api/channel/1', '/api/log']) {
            assertError(await gw.admin('GET', p, undefined, { token: null }), 401,
                { code: 'invalid_token' });
            assertError(await gw.admin('GET', p, undefined, { token: `${hex(24)}` }), 401,
                { code: 'invalid_token' });
            assertError(await gw.admin('GET', p, undefined, { token: key }), 403, {});
        }
        /* a key the client API refuses is unknown here too: 401, not 403 */
        const off = await makeUserKey(gw, {}, { status: 'disabled' });
        const spent = await makeUserKey(gw, {}, { unlimited_quota: false, remain_quota: 0 });
        const gone = await makeUserKey(gw, {}, { expired_time: 1000 });
        for (const k of [off.key, spent.key, gone.key]) {
            assertError(await gw.admin('GET', '/api/user/1', undefined, { token: k }), 401,
                { code: 'invalid_token' });
        }
        const before = await gw.admin('POST', '/api/user',
            { username: uniq('intruder'), quota: 1, group: 'default' }, { token: key });
        assertError(before, 403, {});
    });

    test('users: create, read, update, delete', async () => {
        const name = uniq('alice');
        let r = await gw.admin('POST', '/api/user', { username: name, quota: 12345, group: 'default' });
        assert.equal(r.status, 200, r.text);
        const u = r.json;
        assert.equal(typeof u.id, 'number');
        assert.equal(u.username, name);
        assert.equal(u.quota, 12345);
        assert.equal(u.used_quota, 0);
        assert.equal(u.group, 'default');
        assert.ok('status' in u, 'status field');

        r = await gw.admin('GET', `/api/user/${u.id}`);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.username, name);
        assert.equal(r.json.quota, 12345);

        r = await gw.admin('PATCH', `/api/user/${u.id}`, { quota: 999 });
        assert.equal(r.status, 200, r.text);
        r = await gw.admin('GET', `/api/user/${u.id}`);
        assert.equal(r.json.quota, 999);
        assert.equal(r.json.username, name, 'PATCH keeps other fields');

        r = await gw.admin('DELETE', `/api/user/${u.id}`);
        assert.equal(r.status, 200, r.text);
        assertError(await gw.admin('GET', `/api/user/${u.id}`), 404, {});
    });

    test('tokens: the key is shown once, never by GET', async () => {
        const u = await makeUser(gw);
        let r = await gw.admin('POST', '/api/token', {
            user_id: u.id, name: 'ci', remain_quota: 777, unlimited_quota: false,
            expired_time: -1, models: [M], allow_ips: ['127.0.0.1', '::1/128'],
            group: 'default', status: 'enabled',
        });
        assert.equal(r.status, 200, r.text);
        const t = r.json;
        assert.match(t.key, /^sk-[0-9a-f]{48}$/);
        assert.equal(t.remain_quota, 777);
        assert.equal(t.used_quota, 0);

        r = await gw.admin('GET', `/api/token/${t.id}`);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.name, 'ci');
        assert.equal(r.json.remain_quota, 777);
        assert.deepEqual(r.json.models, [M]);
        assert.ok(!r.text.includes(t.key.slice(3)), `GET shows the key: ${r.text}`);
        assert.ok(!r.text.includes(t.key.slice(3, 27)), 'GET shows part of the key');

        r = await gw.admin('PATCH', `/api/token/${t.id}`, { name: 'renamed', remain_quota: 500 });
        assert.equal(r.status, 200, r.text);
        r = await gw.admin('GET', `/api/token/${t.id}`);
        assert.equal(r.json.name, 'renamed');
        assert.equal(r.json.remain_quota, 500);

        r = await gw.admin('DELETE', `/api/token/${t.id}`);
        assert.equal(r.status, 200, r.text);
        assertError(await gw.admin('GET', `/api/token/${t.id}`), 404, {});
    });

    test('channels: create, read, update, delete; groups default to ["default"]', async () => {
        const name = uniq('chan');
        let r = await gw.admin('POST', '/api/channel', {
            name, type: 1, base_url: mock.url, key: 'k-1', models: ['x-model'],
            priority: 3, weight: 2,
        });
        assert.equal(r.status, 200, r.text);
        const c = r.json;
        assert.equal(typeof c.id, 'number');

        r = await gw.admin('GET', `/api/channel/${c.id}`);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.name, name);
        assert.equal(r.json.type, 1);
        assert.equal(r.json.base_url, mock.url);
        assert.deepEqual(r.json.models, ['x-model']);
        assert.deepEqual(r.json.groups, ['default']);
        assert.equal(r.json.priority, 3);
        assert.equal(r.json.weight, 2);

        r = await gw.admin('PATCH', `/api/channel/${c.id}`, { priority: 7 });
        assert.equal(r.status, 200, r.text);
        r = await gw.admin('GET', `/api/channel/${c.id}`);
        assert.equal(r.json.priority, 7);
        assert.equal(r.json.name, name);

        r = await gw.admin('DELETE', `/api/channel/${c.id}`);
        assert.equal(r.status, 200, r.text);
        assertError(await gw.admin('GET', `/api/channel/${c.id}`), 404, {});
    });

    test('invalid admin input gets 400 in the error contract', async () => {
        const u = await makeUser(gw);
        const cases = [
            ['POST', '/api/user', '{"username":'],
            ['POST', '/api/user', { quota: 5 }],
            ['POST', '/api/token', { name: 'no user' }],
            ['POST', '/api/token', { user_id: u.id, allow_ips: ['not-an-ip'] }],
            ['POST', '/api/token', { user_id: u.id, allow_ips: ['10.0.0.0/33'] }],
            ['POST', '/api/token', { user_id: u.id, status: 'sleeping' }],
            ['POST', '/api/channel', { name: 'c', type: 1, key: 'k', models: ['m'] }],
            ['POST', '/api/channel', {
                name: 'c', type: 1, key: 'k', models: ['m'], base_url: 'not a url',
            }],
            ['PUT', '/api/pricing', { m: 'cheap' }],
            ['PUT', '/api/pricing', { m: { ratio: 1, completion_rate: 4 } }],
            ['PUT', '/api/group', { g: 'high' }],
            ['PUT', '/api/rate_limit', { default: { duration_minutes: 1, total: -1, success: 0 } }],
        ];
        for (const [method, p, body] of cases) {
            const r = await gw.admin(method, p, body,
                typeof body === 'string' ? { headers: { 'Content-Type': 'application/json' } } : {});
            assert.equal(r.status, 400, `${method} ${p} ${JSON.stringify(body)}: ${r.status} ${r.text}`);
            assertError(r, 400, {});
        }
        /* a body that is JSON but not an object, or not JSON: invalid_json */
        for (const [method, p, body] of [['POST', '/api/user', '[]'],
            ['PUT', '/api/pricing', '"x"'], ['PATCH', `/api/user/${u.id}`, '{"quota":'],
            ['POST', '/api/channel', 'not json']]) {
            const r = await gw.admin(method, p, body,
                { headers: { 'Content-Type': 'application/json' } });
            assertError(r, 400, { code: 'invalid_json' });
        }
        /*
         * What the database would store but the gateway could not read back
         * (a number beyond a double), and what it would refuse as text
         * (invalid UTF-8, a NUL byte that would cut the body short): 400,
         * nothing stored, and the configuration still loads.
         */
        for (const [method, p, body] of [
            ['PUT', '/api/pricing', '{"m-huge":{"ratio":1e400}}'],
            ['PUT', '/api/group', '{"g-huge":-1e400}'],
            ['POST', '/api/channel', '{"name":"c","type":1,"key":"k","models":["m"],' +
                '"base_url":"http://127.0.0.1:9","settings":{"x":1e999}}'],
            ['PATCH', `/api/user/${u.id}`, Buffer.from('{"username":"\xff\xfe"}', 'latin1')],
            ['PATCH', `/api/user/${u.id}`, Buffer.from('{"quota":7}\0{"quota":"x"}', 'latin1')],
        ]) {
            const r = await gw.admin(method, p, body,
                { headers: { 'Content-Type': 'application/json' } });
            assertError(r, 400, { code: 'invalid_json' });
        }
        assert.equal((await gw.admin('GET', `/api/user/${u.id}`)).json.quota, u.quota);
        assert.equal((await gw.admin('GET', '/api/pricing')).json['m-huge'], undefined);
        /* a query string that is not UTF-8: 400, not "database unreachable" */
        const r = await gw.admin('GET', '/api/log?model=%FF', undefined, {});
        assert.notEqual(r.status, 503, r.text);
        const raw = await rawHttp(gw.port, 'GET /api/user/1?x=\xff HTTP/1.1\r\n' +
            `Host: x\r\nAuthorization: Bearer ${gw.rootToken}\r\nConnection: close\r\n\r\n`);
        assert.equal(raw.status, 400, raw.body);
        assert.match(raw.body, /not valid UTF-8/);
    });

    test('what used to be stored or dropped without a word is refused with 400 naming it', async () => {
        const u = await makeUser(gw);
        const ch = { type: 1, base_url: mock.url, models: ['m-checked'] };
        const long = 'x'.repeat(1025);
        const cases = [
            /* a query parameter the call does not take (a misspelt filter listed everything) */
            ['GET', `/api/token?userid=${u.id}`, undefined,
                'userid: unknown query parameter (known: user_id, page, page_size)'],
            ['GET', '/api/channel?page_size=1&sort=id', undefined,
                'sort: unknown query parameter (known: page, page_size)'],
            ['GET', `/api/user/${u.id}?fields=id`, undefined,
                'fields: unknown query parameter (this call takes none)'],
            /* a DELETE of a user takes no members */
            ['DELETE', `/api/user/${u.id}`, { force: true },
                'force: unknown field (a DELETE of a user takes none)'],
            /* hosts that are no host name or IP address */
            ['POST', '/api/channel', { ...ch, base_url: 'http://-/' }, 'base_url: the host name - has a label'],
            ['POST', '/api/channel', { ...ch, base_url: 'http://a..b/' }, 'base_url: the host name a..b has an empty label'],
            ['POST', '/api/channel', { ...ch, base_url: 'http://[:::]/' }, 'base_url: [:::] is not an IPv6 address'],
            ['POST', '/api/channel', { ...ch, base_url: `http://${'a'.repeat(64)}.example/` },
                'base_url: the host name'],
            /* model names routing could never match */
            ['POST', '/api/channel', { ...ch, models: [long] }, 'models: a model name has at most 1024 bytes'],
            ['POST', '/api/token', { user_id: u.id, models: [long] }, 'models: a model name has at most 1024 bytes'],
            ['POST', '/api/channel', { ...ch, model_mapping: { 'm-checked': long } },
                'model_mapping.m-checked: a model name has at most 1024 bytes'],
            ['POST', '/api/channel', { ...ch, model_mapping: { 'm-checked ': 'up' } },
                'model_mapping: "m-checked " has leading or trailing whitespace'],
            ['PUT', '/api/pricing', { [long]: { ratio: 1 } }, 'pricing: a model name has at most 1024 bytes'],
            ['PUT', '/api/pricing', { 'm-checked ': { ratio: 1 } }, 'pricing: "m-checked " has leading or trailing whitespace'],
            ['PUT', '/api/pricing', { 'm\u0001x': { ratio: 1 } }, 'pricing: "m\\u0001x" must not contain control characters'],
            /* numbers the gateway reads as 0 */
            ['PUT', '/api/pricing', '{"m-checked":{"ratio":1e-400}}',
                'pricing.m-checked.ratio: must be 0 or at least 1e-300'],
            ['PUT', '/api/group', '{"g-checked":1e-400}', 'group.g-checked: must be 0 or at least 1e-300'],
        ];
        for (const [method, p, body, message] of cases) {
            const r = await gw.admin(method, p, body,
                typeof body === 'string' ? { headers: { 'Content-Type': 'application/json' } } : {});
            assertError(r, 400, { code: 'invalid_request', message });
        }
        /* a DELETE's body is JSON too; nothing was deleted or stored */
        assertError(await gw.admin('DELETE', `/api/user/${u.id}`, '{"force":'), 400,
            { code: 'invalid_json' });
        assertOk(await gw.admin('GET', `/api/user/${u.id}`));
        const prices = (await gw.admin('GET', '/api/pricing')).json;
        assert.equal(prices['m-checked'], undefined);
        assert.equal(prices['m-checked '], undefined);

        /* what is right is taken: an unknown channel type is stored as given */
        for (const base of ['http://[::1]:9', 'http://my_llm:8000', `http://${'a'.repeat(63)}.example`]) {
            assertOk(await gw.admin('POST', '/api/channel', { ...ch, base_url: base }), base);
        }
        const odd = await gw.admin('POST', '/api/channel', { ...ch, type: 987 });
        assertOk(odd);
        assert.equal(odd.json.type, 987);
        const listed = await gw.admin('GET', `/api/token?user_id=${u.id}&page_size=1`);
        assertOk(listed);
        assert.equal(listed.json.page_size, 1);
        assertOk(await gw.admin('DELETE', `/api/user/${u.id}`, {}));
    });

    test('prices come back as they were written', async () => {
        assertOk(await gw.admin('PUT', '/api/pricing',
            { 'm-exact': { ratio: 0.075, completion_ratio: 4 } }));
        const r = await gw.admin('GET', '/api/pricing');
        assertOk(r);
        assert.match(r.text, /"ratio": ?0\.075[,}]/, r.text);
    });

    test('unknown admin objects and paths get 404', async () => {
        assertError(await gw.admin('GET', '/api/user/987654321'), 404, {});
        assertError(await gw.admin('GET', '/api/no-such-thing'), 404, {});
    });

    test('a new channel serves on every worker within 1 s', async () => {
        const model = uniq('gpt-new');
        const { key } = await makeUserKey(gw);
        const t0 = Date.now();
        await makeChannel(gw, { base_url: mock.url, models: [model] });
        await eventually(async () => assertOk(await gw.chat(key, model)),
            { since: t0, ms: PROPAGATION_MS });
        await everyWorker(t0, () => gw.chat(key, model), (r) => assertOk(r));
    });

    test('a changed model_mapping reaches every worker within 1 s', async () => {
        const model = uniq('gpt-remap');
        const { key } = await makeUserKey(gw);
        const c = await makeChannel(gw, { base_url: mock.url, models: [model] });
        await eventually(async () => assertOk(await gw.chat(key, model)), { ms: PROPAGATION_MS });
        const t0 = Date.now();
        const r = await gw.admin('PATCH', `/api/channel/${c.id}`,
            { model_mapping: { [model]: 'remapped-upstream' } });
        assert.equal(r.status, 200, r.text);
        await everyWorker(t0, () => gw.chat(key, model, { content: 'remap-check' }), (x) => assertOk(x));
        const seen = mock.requests.filter((q) => q.json?.messages?.[0]?.content === 'remap-check')
            .slice(-16).map((q) => q.json.model);
        assert.deepEqual([...new Set(seen)], ['remapped-upstream']);
    });

    test('a disabled key is refused on every worker within 1 s', async () => {
        const u = await makeUser(gw);
        const t = await makeKey(gw, u.id);
        await eventually(async () => assertOk(await gw.chat(t.key, M)), { ms: PROPAGATION_MS });
        const t0 = Date.now();
        const r = await gw.admin('PATCH', `/api/token/${t.id}`, { status: 'disabled' });
        assert.equal(r.status, 200, r.text);
        await everyWorker(t0, () => gw.chat(t.key, M),
            (x) => assertError(x, 401, { code: 'invalid_token' }));
    });

    test('a deleted channel stops serving on every worker within 1 s', async () => {
        const model = uniq('gpt-gone');
        const { key } = await makeUserKey(gw);
        const c = await makeChannel(gw, { base_url: mock.url, models: [model] });
        await eventually(async () => assertOk(await gw.chat(key, model)), { ms: PROPAGATION_MS });
        const t0 = Date.now();
        const r = await gw.admin('DELETE', `/api/channel/${c.id}`);
        assert.equal(r.status, 200, r.text);
        await everyWorker(t0, () => gw.chat(key, model),
            (x) => assertError(x, 503, { code: 'model_not_found' }));
    });

    test('a group made deprecated is refused on every worker within 1 s', async () => {
        let r = await gw.admin('PUT', '/api/group', { default: 1, team: 1 });
        assert.equal(r.status, 200, r.text);
        const model = uniq('gpt-team');
        await makeChannel(gw, { base_url: mock.url, models: [model], groups: ['team'] });
        const { key } = await makeUserKey(gw, { group: 'team' });
        await eventually(async () => assertOk(await gw.chat(key, model)), { ms: PROPAGATION_MS });
        const t0 = Date.now();
        r = await gw.admin('PUT', '/api/group', { default: 1, team: { ratio: 1, deprecated: true } });
        assert.equal(r.status, 200, r.text);
        await everyWorker(t0, () => gw.chat(key, model),
            (x) => assertError(x, 403, { code: 'group_deprecated' }));
    });
});
