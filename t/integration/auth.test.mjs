// Client key checks: 401 for every unusable key, 403 for model, IP and
// group restrictions, the places a key may be sent.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, eventually, hex, httpRequest, makeChannel, makeKey,
    makeUser, makeUserKey, psql, rawHttp, settle, startGateway, tearDown, uniq, PROPAGATION_MS,
} from '../lib/harness.mjs';
import { startMock } from '../lib/mock.mjs';

const REALIP = 'set_real_ip_from 127.0.0.1; real_ip_header X-Forwarded-For;';
/* a Unix-socket listener too (realip trusts only 127.0.0.1) */
const UNIX_SOCK = path.join(os.tmpdir(), `llmgw-auth-${process.pid}-${hex(4)}.sock`);

describe('authentication', { timeout: 180000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-auth');
    const M2 = uniq('gpt-auth-other');
    const AM = uniq('claude-auth');
    const NOPRICE = uniq('gpt-auth-noprice');
    const k = {};

    before(async () => {
        db = await createDb();
        mock = await startMock();
        gw = await startGateway({ db, server: `${REALIP} listen unix:${UNIX_SOCK};` });

        let r = await gw.admin('PUT', '/api/group',
            { default: 1, g1: 1, g2: 1, old: 1 });
        assert.equal(r.status, 200, r.text);
        await makeChannel(gw, {
            base_url: mock.url, models: [M, M2], groups: ['default', 'g1', 'g2', 'old'],
        });
        await makeChannel(gw, { type: 14, base_url: mock.url, models: [AM] });
        await makeChannel(gw, { base_url: mock.url, models: [NOPRICE], free: false });

        const user = await makeUser(gw);
        const now = Math.floor(Date.now() / 1000);
        const mk = (opts) => makeKey(gw, user.id, opts).then((t) => t.key);
        k.ok = await mk({});
        k.future = await mk({ expired_time: now + 3600 });
        k.expired = await mk({ expired_time: now - 60 });
        k.disabled = await mk({ status: 'disabled' });
        k.exhausted = await mk({ unlimited_quota: false, remain_quota: 0 });
        k.models = await mk({ models: [M] });
        k.noModels = await mk({ models: [] });
        k.ipOther = await mk({ allow_ips: ['203.0.113.0/24'] });
        k.ipLocal = await mk({ allow_ips: ['127.0.0.1'] });
        k.ipLocalNet = await mk({ allow_ips: ['10.0.0.0/8', '127.0.0.0/8'] });
        k.ip6 = await mk({ allow_ips: ['2001:db8::/32'] });
        k.g1 = await mk({ group: 'g1' });
        k.g2 = await mk({ group: 'g2' });
        k.old = await mk({ group: 'old' });

        /* g2 is removed and "old" deprecated after their keys exist. */
        r = await gw.admin('PUT', '/api/group',
            { default: 1, g1: 1, g2: null, old: { ratio: 1, deprecated: true } });
        assert.equal(r.status, 200, r.text);
        await settle();
    });

    after(async () => {
        await tearDown(db, [gw], [mock]);
        fs.rmSync(UNIX_SOCK, { force: true });
    });

    /* k.ok is unlimited with remain_quota 0: unlimited wins. */
    test('a valid key is accepted with and without the sk- prefix', async () => {
        const a = assertOk(await gw.chat(k.ok, M));
        assert.equal(a.json.object, 'chat.completion');
        assert.ok(a.headers['x-request-id'], 'X-Request-Id on success');
        assertOk(await gw.chat(k.ok.slice(3), M), 'key without sk-');
        assertOk(await gw.chat(k.future, M), 'key expiring in an hour');
    });

    test('missing, empty, wrong and truncated keys get 401 Invalid token', async () => {
        const before = mock.requests.length;
        const cases = {
            missing: await gw.chat(undefined, M),
            empty: await gw.chat(undefined, M, { headers: { Authorization: 'Bearer ' } }),
            wrong: await gw.chat(`sk-${hex(24)}`, M),
            truncatedByOne: await gw.chat(k.ok.slice(0, -1), M),
            truncatedHalf: await gw.chat(k.ok.slice(0, 27), M),
            extended: await gw.chat(`${k.ok}0`, M),
        };
        for (const [what, r] of Object.entries(cases)) {
            assert.equal(r.status, 401, `${what}: ${r.status} ${r.text}`);
            assertError(r, 401, { code: 'invalid_token', message: 'Invalid token' });
        }
        assert.equal(mock.requests.length, before, 'refused requests reach no upstream');
    });

    /* what the README says of error_log levels: nginx, not the gateway,
       quotes both lines, at info, before any module sees the request */
    test('two Authorization headers get 400; nginx quotes both keys at info only', async () => {
        const { key } = await makeUserKey(gw);
        const other = `sk-${hex(24)}`;
        const before = mock.requests.length;
        const r = await rawHttp(gw.port, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n`
            + `Authorization: Bearer ${key}\r\nAuthorization: Bearer ${other}\r\n`
            + 'Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}');
        assert.equal(r.status, 400);
        assert.equal(JSON.parse(r.body).error.code, 'bad_request');
        assert.equal(mock.requests.length, before);

        const lines = await eventually(() => {
            const found = gw.errorLog().split('\n').filter((l) => l.includes(key.slice(3))
                || l.includes(other.slice(3)));
            assert.equal(found.length, 1, 'one line names the keys');
            return found;
        }, { ms: 3000 });
        assert.match(lines[0], / \[info\] .*client sent duplicate header line: "Authorization: Bearer sk-\w+", previous value: "Authorization: Bearer sk-\w+" while reading client request headers/);
        assert.ok(lines[0].includes(other.slice(3)) && lines[0].includes(key.slice(3)));
    });

    test('disabled, expired and exhausted keys get 401', async () => {
        for (const what of ['disabled', 'expired', 'exhausted']) {
            const r = await gw.chat(k[what], M);
            assert.equal(r.status, 401, `${what}: ${r.status} ${r.text}`);
            assertError(r, 401, { code: 'invalid_token', message: 'Invalid token' });
        }
    });

    test('a deleted key stops working within 1 s', async () => {
        const user = await makeUser(gw);
        const t = await makeKey(gw, user.id);
        await eventually(async () => assertOk(await gw.chat(t.key, M)),
            { ms: PROPAGATION_MS });
        const r = await gw.admin('DELETE', `/api/token/${t.id}`);
        assert.equal(r.status, 200, r.text);
        const t0 = Date.now();
        await eventually(async () => assertError(await gw.chat(t.key, M), 401,
            { code: 'invalid_token', message: 'Invalid token' }),
        { since: t0, ms: PROPAGATION_MS });
    });

    test('a key disabled through PATCH stops working within 1 s', async () => {
        const user = await makeUser(gw);
        const t = await makeKey(gw, user.id);
        await eventually(async () => assertOk(await gw.chat(t.key, M)),
            { ms: PROPAGATION_MS });
        const r = await gw.admin('PATCH', `/api/token/${t.id}`, { status: 'disabled' });
        assert.equal(r.status, 200, r.text);
        const t0 = Date.now();
        await eventually(async () => assertError(await gw.chat(t.key, M), 401,
            { code: 'invalid_token', message: 'Invalid token' }),
        { since: t0, ms: PROPAGATION_MS });
    });

    test('keys of a disabled user get 401', async () => {
        const { user, key } = await makeUserKey(gw);
        await eventually(async () => assertOk(await gw.chat(key, M)),
            { ms: PROPAGATION_MS });
        const r = await gw.admin('PATCH', `/api/user/${user.id}`, { status: 'disabled' });
        assert.equal(r.status, 200, r.text);
        const t0 = Date.now();
        await eventually(async () => assertError(await gw.chat(key, M), 401,
            { code: 'invalid_token', message: 'Invalid token' }),
        { since: t0, ms: PROPAGATION_MS });
    });

    test('/v1/messages accepts x-api-key and Bearer', async () => {
        const body = {
            model: AM, max_tokens: 8, messages: [{ role: 'user', content: 'hi' }],
        };
        let r = await gw.req('POST', '/v1/messages',
            { headers: { 'x-api-key': k.ok }, body });
        assertOk(r, 'x-api-key');
        assert.equal(r.json.type, 'message');
        r = await gw.req('POST', '/v1/messages', { key: k.ok, body });
        assertOk(r, 'Bearer');
        r = await gw.req('POST', '/v1/messages',
            { headers: { 'x-api-key': `sk-${hex(24)}` }, body });
        assertError(r, 401, { code: 'invalid_token', message: 'Invalid token' });
    });

    test('a model outside the key list gets 403 no access to model', async () => {
        assertOk(await gw.chat(k.models, M), 'listed model');
        const r = await gw.chat(k.models, M2);
        assertError(r, 403, {
            code: 'model_not_allowed', message: `no access to model ${M2}`,
        });
    });

    test('an empty model list gets 403 no access to any model', async () => {
        const r = await gw.chat(k.noModels, M);
        assertError(r, 403, { message: 'no access to any model' });
    });

    test('IP allow lists: CIDR v4 and exact addresses', async () => {
        assertOk(await gw.chat(k.ipLocal, M), '127.0.0.1 listed');
        assertOk(await gw.chat(k.ipLocalNet, M), '127.0.0.0/8 listed');
        const r = await gw.chat(k.ipOther, M);
        assertError(r, 403, { code: 'access_denied' });
    });

    test('IP allow lists on a Unix-socket listener: a client of no IP address matches no list', async () => {
        const viaUnix = (key) => httpRequest(`${gw.url}/v1/chat/completions`, {
            method: 'POST', socketPath: UNIX_SOCK,
            headers: { Authorization: `Bearer ${key}` },
            body: { model: M, messages: [{ role: 'user', content: 'hi' }] },
        });
        assertOk(await viaUnix(k.ok), 'a key without a list is served over the socket');
        const r = await viaUnix(k.ipLocal);
        assertError(r, 403, { code: 'access_denied' });
        assert.match(r.json.error.message, /IP unix: is not allowed to use this key/, r.text);
        assertError(await viaUnix(k.ipLocalNet), 403, { code: 'access_denied' });
    });

    test('an allow list the gateway cannot read admits nobody', async () => {
        /* the API refuses short IPv4 forms ("10/8"); a list stored before
           it did, or by hand, is one the gateway cannot read */
        const user = await makeUser(gw);
        const t = await makeKey(gw, user.id, { allow_ips: ['127.0.0.1'] });
        await psql(db.conninfo, `UPDATE tokens SET allow_ips = '["10/8", "127.0.0.0/8"]'
                                  WHERE id = ${t.id}; SELECT llmgw_bump('token', ${t.id})`);
        await eventually(async () => assertError(await gw.chat(t.key, M), 403,
            { code: 'access_denied' }));
        const r = await gw.admin('POST', '/api/token', { user_id: user.id, allow_ips: ['10/8'] });
        assertError(r, 400, { code: 'invalid_request',
            message: 'allow_ips[0]: "10/8" is not an IP address or CIDR' });
    });

    test('IP allow lists follow realip X-Forwarded-For (v4 and v6)', async () => {
        const xff = (ip) => ({ headers: { 'X-Forwarded-For': ip } });
        assertOk(await gw.chat(k.ipOther, M, xff('203.0.113.9')), 'forwarded v4 inside');
        assertError(await gw.chat(k.ipLocal, M, xff('198.51.100.1')), 403,
            { code: 'access_denied' });
        assertOk(await gw.chat(k.ip6, M, xff('2001:db8::5')), 'forwarded v6 inside');
        assertError(await gw.chat(k.ip6, M, xff('2001:db9::1')), 403,
            { code: 'access_denied' });
        assertError(await gw.chat(k.ip6, M), 403, { code: 'access_denied' });
    });

    test('a key in a listed group is served', async () => {
        assertOk(await gw.chat(k.g1, M));
    });

    test('a key whose group is gone gets 403 no access to group', async () => {
        const r = await gw.chat(k.g2, M);
        assertError(r, 403, { code: 'group_unavailable', message: 'no access to group g2' });
    });

    test('GET /v1/models lists what the key may use: its list, its group, priced models', async () => {
        const ids = async (key) => {
            const r = await gw.req('GET', '/v1/models', { key });
            assertOk(r);
            assert.equal(r.json.object, 'list');
            return r.json.data.map((m) => m.id).sort();
        };
        assert.deepEqual(await ids(k.ok), [M, M2, AM].sort(),
            'every priced model of the default group (no unpriced one)');
        assert.deepEqual(await ids(k.models), [M]);
        assert.deepEqual(await ids(k.noModels), []);
        assert.deepEqual(await ids(k.g1), [M, M2].sort());
        assertError(await gw.chat(k.ok, NOPRICE), 400, { code: 'model_price_error' });
        assertError(await gw.req('GET', '/v1/models', { key: 'sk-nope' }), 401, {});

        /* HEAD: the head GET would send, without the list */
        const get = await gw.req('GET', '/v1/models', { key: k.ok });
        const head = await gw.req('HEAD', '/v1/models', { key: k.ok });
        assert.equal(head.status, 200);
        assert.equal(head.text, '');
        assert.equal(head.headers['content-type'], 'application/json');
        assert.equal(head.headers['content-length'], get.headers['content-length']);
        const refused = await gw.req('HEAD', '/v1/models', { key: 'sk-nope' });
        assert.equal(refused.status, 401);
        assert.equal(refused.text, '');
    });

    test('a key in a deprecated group gets 403 group deprecated', async () => {
        const r = await gw.chat(k.old, M);
        assertError(r, 403, { code: 'group_deprecated', message: 'group old deprecated' });
    });
});
