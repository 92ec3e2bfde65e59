// Task plugins through the real nginx and the real plugin runtime helper
// (llmgw-v8host): upload and validation, versions and activation, route
// conflicts, dry runs and the helper's limits, a helper worker killed
// mid-call, the helper stopped and restarted, runtime status, two nodes on
// one database, and the root-only admin API.
//
// Fixtures: t/integration/fixtures/plugins/ (video-task.js is the valid
// plugin; the invalid sources are small edits of it, or files of their own).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import {
    assertError, assertOk, createDb, dropDb, eventually, hex, makeChannel,
    makeUserKey, settle, sleep, startGateway, stopAll, uniq, PROPAGATION_MS,
} from '../lib/harness.mjs';
import { startMock } from '../lib/mock.mjs';

const FIXTURES = path.join(path.dirname(fileURLToPath(import.meta.url)),
    'fixtures', 'plugins');
const fixture = (name) => fs.readFileSync(path.join(FIXTURES, name), 'utf8');

/* Helper limits: short, so that the limit tests stay quick. */
const DEADLINE_MS = 1500;
const HEAP_MB = 32;
/* nginx's wait for a helper answer; above the helper's deadline. */
const NGINX_TIMEOUT_MS = 10000;
const V8HOST = { workers: 2, deadlineMs: DEADLINE_MS, heapMb: HEAP_MB };
const HTTP = `llmgw_v8host_timeout ${NGINX_TIMEOUT_MS}ms;`;

const VIDEO = fixture('video-task.js');
const KEY = 'itest-video';

/* The valid plugin under another key, routes and version. */
function variant(key, { version = '1.0.0', source = VIDEO } = {}) {
    return source
        .replace(`key: '${KEY}'`, `key: '${key}'`)
        .replaceAll('/itest/v1/', `/${key}/v1/`)
        .replace("const VERSION = '1.0.0';", `const VERSION = '${version}';`);
}

/* A DriverContext for buildSubmitRequest; behave: see video-task.js. */
function driverCtx({ behave, apiKey = `sk-${hex(24)}` } = {}) {
    return {
        action: 'generate', model: 'itest-video-1', upstreamModel: 'itest-video-1',
        baseUrl: 'https://upstream.example', apiKey, authHeader: `Bearer ${apiKey}`,
        headers: {}, publicTaskId: 'task_x', upstream: { kind: 'vendor' },
        requestBody: { kind: 'json', value: { prompt: 'a cat', ...(behave ? { behave } : {}) } },
    };
}

const upload = (gw, body) => gw.admin('POST', '/api/plugin/task', body);
const dryrun = (gw, body) => gw.admin('POST', '/api/plugin/task/dryrun', body);
const status = (gw) => gw.admin('GET', '/api/plugin/task/runtime/status');

function assertUploaded(r, key, version) {
    assertOk(r, `upload ${key} ${version}`);
    assert.equal(r.json.key, key, r.text);
    assert.equal(r.json.version, version, r.text);
    return r.json;
}

/* A dry run that worked: -> the hook's result. */
function assertRan(r, what = 'dry run') {
    assertOk(r, what);
    assert.equal(r.json.ok, true, `${what}: ${r.text.slice(0, 500)}`);
    return r.json.result;
}

/* A dry run whose hook failed: -> the error {kind, message}. */
function assertHookFailed(r, kind) {
    assertOk(r, `dry run expecting ${kind}`);
    assert.equal(r.json.ok, false, r.text.slice(0, 500));
    assert.equal(r.json.error?.kind, kind, r.text.slice(0, 500));
    assert.equal(typeof r.json.error.message, 'string', r.text.slice(0, 500));
    return r.json.error;
}

/* The node's published plugins, as seen by whichever worker answers. */
async function nodePlugins(gw) {
    const r = await status(gw);
    assertOk(r, 'runtime/status');
    return r.json.node.plugins;
}

/* CPU ticks (utime + stime) of a process, or -1. */
function cpuTicks(pid) {
    try {
        const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
        const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
        return Number(f[11]) + Number(f[12]);
    } catch {
        return -1;
    }
}

describe('task plugins through nginx and the v8 helper', { timeout: 120000 }, () => {
    let db, a, b, mock, client, model;

    before(async () => {
        db = await createDb();
        mock = await startMock();
        [a, b] = await Promise.all([
            startGateway({ db, v8host: V8HOST, http: HTTP }),
            startGateway({ db, v8host: V8HOST, http: HTTP }),
        ]);
        model = uniq('gpt-plug');
        await makeChannel(a, { base_url: mock.url, models: [model] });
        client = await makeUserKey(a);
    });

    after(async () => {
        try {
            await stopAll(a, b);
        } finally {
            await mock?.close();
            await dropDb(db);
        }
    });

    test('the admin plugin API is root only: no token 401, a client key 403', async () => {
        const calls = [
            ['GET', '/api/plugin/task'],
            ['POST', '/api/plugin/task', { source: VIDEO, enabled: true }],
            ['POST', '/api/plugin/task/dryrun', { source: VIDEO, hook: 'buildSubmitRequest', args: [{}] }],
            ['GET', '/api/plugin/task/runtime/status'],
            ['GET', `/api/plugin/task/${KEY}`],
        ];
        for (const [method, p, body] of calls) {
            assertError(await a.admin(method, p, body, { token: null }), 401,
                { code: 'invalid_token' });
            assertError(await a.admin(method, p, body, { token: client.key }), 403);
        }
        /* nothing was stored by the refused upload */
        const r = await a.admin('GET', '/api/plugin/task');
        assertOk(r);
        assert.deepEqual(r.json.items, []);
    });

    test('a valid plugin uploads, lists and shows its normalised manifest', async () => {
        const up = assertUploaded(await upload(a, { source: VIDEO, remark: 'first', enabled: true }),
            KEY, '1.0.0');
        assert.equal(up.enabled, true);
        assert.equal(up.active_version, '1.0.0');

        const list = await a.admin('GET', '/api/plugin/task');
        assertOk(list);
        const item = list.json.items.find((p) => p.key === KEY);
        assert.ok(item, list.text);
        assert.equal(item.active_version, '1.0.0');
        assert.equal(item.enabled, true);
        assert.equal(item.remark, 'first');
        assert.deepEqual(item.versions.map((v) => v.version), ['1.0.0']);
        assert.match(item.versions[0].sha, /^[0-9a-f]{64}$/);

        const one = await a.admin('GET', `/api/plugin/task/${KEY}`);
        assertOk(one);
        const m = one.json.manifest;
        assert.equal(m.key, KEY);
        assert.equal(m.version, '1.0.0');
        assert.equal(m.fetchMode, 'per_task');
        assert.deepEqual(m.description, { en: 'Submits a video task upstream and polls it' });
        assert.deepEqual(m.models, ['itest-video-1', 'itest-video-2']);
        assert.deepEqual(m.routes.map((r) => `${r.method} ${r.path} ${r.type}`),
            ['POST /itest/v1/videos submit', 'GET /itest/v1/videos/:task_id query']);

        /* published: every worker of this node, and the other node */
        for (const gw of [a, b]) {
            await eventually(async () => {
                const ps = await nodePlugins(gw);
                assert.ok(ps.some((p) => p.key === KEY && p.version === '1.0.0'),
                    JSON.stringify(ps));
            }, { ms: PROPAGATION_MS });
        }
    });

    test('the list is in display order: larger sortPriority first, then by key', async () => {
        const prio = (key, n) => variant(key).replace('sortPriority: 10,', `sortPriority: ${n},`);
        for (const [key, n] of [['zsort-b', 7], ['zsort-a', 7], ['zsort-c', 2000000], ['zsort-d', -5]]) {
            assertOk(await upload(a, { source: prio(key, n), enabled: false }), key);
        }
        const list = await a.admin('GET', '/api/plugin/task');
        assertOk(list);
        const order = list.json.items.map((p) => p.key).filter((k) => k.startsWith('zsort-'));
        assert.deepEqual(order, ['zsort-c', 'zsort-a', 'zsort-b', 'zsort-d']);
        for (const key of order) {
            assertOk(await a.admin('DELETE', `/api/plugin/task/${key}`));
        }
    });

    test('the list is paged as the other admin lists: page, page_size, {items, total, page, page_size}', async () => {
        for (const key of ['zpage-a', 'zpage-b', 'zpage-c']) {
            assertOk(await upload(a, { source: variant(key), enabled: false }), key);
        }
        try {
            const all = await a.admin('GET', '/api/plugin/task?page_size=1000');
            assertOk(all);
            assert.equal(all.json.total, all.json.items.length, all.text.slice(0, 300));
            assert.ok(all.json.total >= 4, all.text.slice(0, 300));
            assert.equal(all.json.page, 1);
            assert.equal(all.json.page_size, 1000);

            /* pages of two make the whole list, in display order */
            const keys = [];
            for (let page = 1; page <= Math.ceil(all.json.total / 2) + 1; page++) {
                const r = await a.admin('GET', `/api/plugin/task?page=${page}&page_size=2`);
                assertOk(r, `page ${page}`);
                assert.equal(r.json.total, all.json.total);
                assert.equal(r.json.page, page);
                assert.equal(r.json.page_size, 2);
                assert.ok(r.json.items.length <= 2, r.text.slice(0, 300));
                keys.push(...r.json.items.map((p) => p.key));
            }
            assert.deepEqual(keys, all.json.items.map((p) => p.key));

            const first = await a.admin('GET', '/api/plugin/task/');
            assertOk(first);
            assert.equal(first.json.page, 1);
            assert.equal(first.json.page_size, 50);

            /* refused as /api/user refuses the same parameters */
            for (const q of ['page=0', 'page=x', 'page_size=0', 'page_size=1001']) {
                const user = await a.admin('GET', `/api/user?${q}`);
                const e = assertError(user, 400, { code: 'invalid_request' });
                assertError(await a.admin('GET', `/api/plugin/task?${q}`), 400, {
                    code: 'invalid_request',
                    message: e.message.replace(/ \(request id: [^)]*\)$/, ''),
                });
            }
        } finally {
            for (const key of ['zpage-a', 'zpage-b', 'zpage-c']) {
                assertOk(await a.admin('DELETE', `/api/plugin/task/${key}`), key);
            }
        }
    });

    test('versions: 1.1.0 uploads, activate 1.0.0, disable, delete', async () => {
        const key = 'itest-life';
        assertUploaded(await upload(a, { source: variant(key), enabled: true }), key, '1.0.0');
        const up = assertUploaded(await upload(a, {
            source: variant(key, { version: '1.1.0' }), enabled: true,
        }), key, '1.1.0');
        assert.equal(up.active_version, '1.1.0');
        assert.deepEqual(up.versions.map((v) => v.version).sort(), ['1.0.0', '1.1.0']);

        /* the same version with another source is refused */
        const again = await upload(a, {
            source: variant(key, { version: '1.1.0' }).replace('a video task', 'a clip'),
        });
        assertError(again, 409, { code: 'conflict', message: /1\.1\.0/ });

        const act = await a.admin('POST', `/api/plugin/task/${key}/activate`, { version: '1.0.0' });
        assertOk(act, 'activate');
        assert.equal(act.json.active_version, '1.0.0');
        assert.equal(act.json.manifest.version, '1.0.0');
        await eventually(async () => {
            const ps = await nodePlugins(a);
            assert.ok(ps.some((p) => p.key === key && p.version === '1.0.0'), JSON.stringify(ps));
        }, { ms: PROPAGATION_MS });
        /* the dry run by key runs the active version */
        await eventually(async () => {
            const res = assertRan(await dryrun(a, {
                key, hook: 'buildSubmitRequest', args: [driverCtx()],
            }));
            assert.equal(res.body.version, '1.0.0');
        }, { ms: PROPAGATION_MS });

        assertError(await a.admin('POST', `/api/plugin/task/${key}/activate`, { version: '9.9.9' }),
            400, { message: /9\.9\.9/ });

        const off = await a.admin('PATCH', `/api/plugin/task/${key}`, { enabled: false });
        assertOk(off, 'PATCH enabled false');
        assert.equal(off.json.enabled, false);
        await eventually(async () => {
            const ps = await nodePlugins(a);
            assert.ok(!ps.some((p) => p.key === key), JSON.stringify(ps));
            assertError(await dryrun(a, { key, hook: 'buildSubmitRequest', args: [driverCtx()] }),
                404, { code: 'not_found' });
        }, { ms: PROPAGATION_MS });

        const del = await a.admin('DELETE', `/api/plugin/task/${key}`);
        assertOk(del, 'DELETE');
        assert.equal(del.json.deleted, true);
        assertError(await a.admin('GET', `/api/plugin/task/${key}`), 404, { code: 'not_found' });
        const list = await a.admin('GET', '/api/plugin/task');
        assert.ok(!list.json.items.some((p) => p.key === key), list.text);
    });

    test('405 on the plugin paths: the error contract and an Allow header naming the methods the path takes', async () => {
        const key = 'itest-allow';
        assertUploaded(await upload(a, { source: variant(key), enabled: false }), key, '1.0.0');

        for (const [method, p, allow] of [
            ['PUT', '/api/plugin/task', 'GET, POST'],
            ['DELETE', '/api/plugin/task/', 'GET, POST'],
            ['POST', `/api/plugin/task/${key}`, 'GET, PATCH, DELETE'],
            ['PUT', `/api/plugin/task/${key}`, 'GET, PATCH, DELETE'],
            ['PUT', '/api/plugin/task/itest-no-such-plugin', 'GET, PATCH, DELETE'],
            ['GET', `/api/plugin/task/${key}/activate`, 'POST'],
            ['DELETE', `/api/plugin/task/${key}/activate`, 'POST'],
            /* the gateway's own POSTs count where a plugin key can be too */
            ['PUT', '/api/plugin/task/dryrun', 'GET, POST, PATCH, DELETE'],
            ['PUT', '/api/plugin/task/marketplace', 'GET, POST, PATCH, DELETE'],
            /* paths only the gateway answers */
            ['PUT', '/api/plugin/task/runtime/status', 'GET'],
            ['POST', '/api/plugin/task/runtime/status/', 'GET'],
            ['DELETE', `/api/plugin/task/${key}/icon`, 'GET'],
            ['POST', '/api/plugin/task/itest-no-such-plugin/icon/', 'GET'],
        ]) {
            const r = await a.admin(method, p, method === 'GET' ? undefined : {});
            const where = p.replace(/\/$/, '');
            assertError(r, 405, {
                code: 'method_not_allowed',
                message: `method ${method} is not allowed on ${where} (allowed: ${allow})`,
            });
            assert.equal(r.headers.allow, allow, `${method} ${p}`);
        }

        /* the methods named are taken */
        assertOk(await a.admin('GET', '/api/plugin/task'));
        assertOk(await a.admin('GET', `/api/plugin/task/${key}`));
        assertOk(await a.admin('PATCH', `/api/plugin/task/${key}`, { remark: 'allow' }));
        assertOk(await a.admin('POST', `/api/plugin/task/${key}/activate`, { version: '1.0.0' }));

        /* the path and the method are the client's text: they cannot make
           the header, even where the message is cut */
        for (const [method, p, allow] of [
            ['PUT', '/api/plugin/task/x(allowed:%20a%0d%0aSet-Cookie:%20evil=1)', 'GET, PATCH, DELETE'],
            ['PUT', '/api/plugin/task/x(allowed:%20GET,%20PUT)', 'GET, PATCH, DELETE'],
            /* a cut at 480 bytes would end with the key's own list */
            ['PUT', `/api/plugin/task/${'0'.repeat(424)}(allowed:%20PUT)`, 'GET, PATCH, DELETE'],
            ['A'.repeat(600), '/api/plugin/task', 'GET, POST'],
            ['PUT', '/api/plugin/task/x(allowed:%20PUT)/icon', 'GET'],
            ['PUT', `/api/plugin/task/${'0'.repeat(440)}(allowed:%20PUT)/icon`, 'GET'],
            ['A'.repeat(600), '/api/plugin/task/runtime/status', 'GET'],
        ]) {
            const r = await a.admin(method, p, {});
            assertError(r, 405, { code: 'method_not_allowed' });
            assert.equal(r.headers.allow, allow, `${method.slice(0, 8)} ${p.slice(0, 60)}`);
            assert.equal(r.headers['set-cookie'], undefined);
        }

        assertOk(await a.admin('DELETE', `/api/plugin/task/${key}`));
    });

    test('a trailing slash names the same plugin path, as on /api/user/', async () => {
        const key = 'itest-slash';
        assertOk(await a.admin('POST', '/api/user/', { username: uniq('slash') }), 'POST /api/user/');

        assertUploaded(await a.admin('POST', '/api/plugin/task/', { source: variant(key), enabled: true }),
            key, '1.0.0');
        await eventually(async () => {
            const r = await a.admin('GET', '/api/plugin/task/runtime/status/');
            assertOk(r, 'runtime/status/');
            assert.ok(r.json.node.plugins.some((p) => p.key === key), r.text);
        }, { ms: PROPAGATION_MS });
        await eventually(async () => {
            assertRan(await a.admin('POST', '/api/plugin/task/dryrun/', {
                key, hook: 'buildSubmitRequest', args: [driverCtx()],
            }));
        }, { ms: PROPAGATION_MS });
        const icon = await a.admin('GET', `/api/plugin/task/${key}/icon/`);
        assert.equal(icon.status, 200, icon.text);
        assert.match(icon.headers['content-type'], /image\/svg\+xml/);
        /* the marketplace reads the body: not a 405 */
        assertError(await a.admin('POST', '/api/plugin/task/marketplace/', {}), 400,
            { code: 'invalid_request', message: /^url:/ });

        /* a 405's Allow names no method that is then refused with 405 */
        const none = 'itest-no-such-plugin';
        for (const p of ['/api/plugin/task', '/api/plugin/task/dryrun', '/api/plugin/task/marketplace',
            `/api/plugin/task/${none}`, `/api/plugin/task/${none}/activate`,
            '/api/plugin/task/runtime/status', `/api/plugin/task/${none}/icon`]) {
            for (const path of [p, `${p}/`]) {
                const r = await a.admin('PUT', path, {});
                assertError(r, 405, { code: 'method_not_allowed' });
                assert.ok(r.headers.allow, `PUT ${path}: ${r.text}`);
                for (const method of r.headers.allow.split(', ')) {
                    const t = await a.admin(method, path, method === 'GET' ? undefined : {});
                    assert.notEqual(t.status, 405, `${method} ${path} (Allow: ${r.headers.allow}): ${t.text}`);
                }
            }
        }

        assertOk(await a.admin('DELETE', `/api/plugin/task/${key}/`));
        assertError(await a.admin('GET', `/api/plugin/task/${key}`), 404, { code: 'not_found' });
    });

    test('each class of invalid source is refused with 400 listing the errors', async () => {
        const cases = [
            ['a key over 30 characters', variant('itest-' + 'k'.repeat(25)), /meta\.key/],
            ['a missing required export',
                VIDEO.replace('export function buildQueryRequest', 'function buildQueryRequest'),
                /needs export buildQueryRequest/],
            ['async function',
                VIDEO.replace('export function parseTaskResult', 'export async function parseTaskResult'),
                /`async` functions are not allowed/],
            ['await',
                VIDEO.replace("const status = STATUS[", "const status = await STATUS["),
                /`await` is not allowed/],
            ['import', `import { x } from './other.js';\n${VIDEO}`, /`import` is not allowed \(line 1\)/],
            ['dynamic import(',
                VIDEO.replace('behave(ctx);\n  const body', "behave(ctx);\n  const lib = import('./lib.js');\n  const body"),
                /dynamic `import\(\)` is not allowed/],
            ['host_responses with stream but no renderEvents',
                fixture('responses-stream-no-events.js'),
                /meta\.protocols\[0\].*"stream" needs export protocols\.host_responses\.renderEvents/],
            ['an unknown required capability',
                VIDEO.replace("fetchMode: 'per_task',", "fetchMode: 'per_task',\n  requiredCapabilities: ['json-clone@1', 'teleport@1'],"),
                /requiredCapabilities.*teleport@1/],
            ['a legacy field',
                VIDEO.replace("fetchMode: 'per_task',", "fetchMode: 'per_task',\n  endpoints: [{ path: '/x' }],"),
                /meta\.endpoints.*legacy/],
            ['a usage description quoting a price and ending in a period',
                VIDEO.replace("fetchMode: 'per_task',", "fetchMode: 'per_task',\n  usageSchema: " +
                    "{ seconds: { type: 'number', unit: 'second', description: 'Seconds at 0.05 USD each.' } },"),
                /meta\.usageSchema\.seconds\.description: no trailing punctuation.*no prices: they are set with \/api\/pricing/s],
        ];
        for (const [what, source, re] of cases) {
            const r = await upload(a, { source, enabled: true });
            const e = assertError(r, 400, { code: 'invalid_plugin' });
            assert.match(e.message, re, `${what}: ${e.message}`);
        }
        /* several errors are all listed */
        const two = await upload(a, {
            source: variant('itest-' + 'k'.repeat(25)).replace("fetchMode: 'per_task',",
                "fetchMode: 'per_task',\n  endpoints: [],"),
        });
        const e = assertError(two, 400, { code: 'invalid_plugin' });
        assert.match(e.message, /meta\.key/);
        assert.match(e.message, /meta\.endpoints/);

        /* a source that never finishes loading is the plugin's fault */
        const t0 = Date.now();
        const loop = await upload(a, { source: fixture('loops-at-load.js'), enabled: true });
        assertError(loop, 400, { code: 'invalid_plugin' });
        assert.ok(Date.now() - t0 < DEADLINE_MS + 6000, `took ${Date.now() - t0} ms`);

        /* no body source at all */
        assertError(await upload(a, { remark: 'x' }), 400);

        const list = await a.admin('GET', '/api/plugin/task');
        assert.deepEqual(list.json.items.map((p) => p.key), [KEY]);
        /* the helper survived all of that */
        assertRan(await dryrun(a, { source: VIDEO, hook: 'buildSubmitRequest', args: [driverCtx()] }));
    });

    test('a second plugin on the same native route: 409, unless forced or disabled', async () => {
        const rival = fixture('video-task-rival.js');
        const r = await upload(a, { source: rival, enabled: true });
        const e = assertError(r, 409, { code: 'conflict' });
        assert.match(e.message, /POST \/itest\/v1\/videos/);
        assert.match(e.message, new RegExp(`plugin ${KEY}\\b`));
        assertError(await a.admin('GET', '/api/plugin/task/itest-video-rival'), 404);

        const off = await upload(a, { source: rival, enabled: false });
        assertUploaded(off, 'itest-video-rival', '1.0.0');
        assert.equal(off.json.enabled, false);
        /* enabling it now conflicts too */
        assertError(await a.admin('PATCH', '/api/plugin/task/itest-video-rival', { enabled: true }),
            409, { code: 'conflict' });

        const forced = await upload(a, { source: rival, enabled: true, force: true });
        assertUploaded(forced, 'itest-video-rival', '1.0.0');
        assert.equal(forced.json.enabled, true);
        assert.deepEqual(forced.json.manifest.description, { en: 'Claims the same native routes', 'zh-CN': '相同的路由' });

        assertOk(await a.admin('DELETE', '/api/plugin/task/itest-video-rival'), 'DELETE rival');
    });

    test('an upload takes force from the query as PATCH and activate do: ?force=1 or ?force=true', async () => {
        const rival = fixture('video-task-rival.js');
        const up = (q, body) => a.admin('POST', `/api/plugin/task${q}`, body);
        for (const q of ['?force=0', '?force=false']) {
            assertError(await up(q, { source: rival, enabled: true }), 409,
                { code: 'conflict', message: /POST \/itest\/v1\/videos/ });
        }
        /* a misspelt force is named, not dropped */
        assertError(await up('?forced=1', { source: rival, enabled: true }), 400,
            { code: 'invalid_request', message: /^forced: unknown query parameter \(known: force\)/ });
        assertError(await a.admin('GET', '/api/plugin/task/itest-video-rival'), 404);
        for (const q of ['?force=1', '?force=true', '?&force=1']) {
            const r = await up(q, { source: rival, enabled: true, force: false });
            assert.equal(assertUploaded(r, 'itest-video-rival', '1.0.0').enabled, true, q);
            assertOk(await a.admin('DELETE', '/api/plugin/task/itest-video-rival'), q);
        }

        /* another source under a stored version: 409 naming the way out */
        const key = 'itest-resource';
        assertUploaded(await upload(a, { source: variant(key), enabled: false }), key, '1.0.0');
        const changed = variant(key).replace('a video task', 'a clip');
        assertError(await upload(a, { source: changed, enabled: false }), 409, {
            code: 'conflict',
            message: `plugin ${key} version 1.0.0 is already stored with another source; ` +
                'raise the version, or upload with force',
        });
        const forced = await up('?force=1', { source: changed, enabled: false });
        assertUploaded(forced, key, '1.0.0');
        assert.equal(forced.json.versions.length, 1, forced.text.slice(0, 300));
        assertOk(await a.admin('DELETE', `/api/plugin/task/${key}`));
    });

    test('?force is read as strictly as force in a body: a value other than 1, true, 0 or false is 400 naming it', async () => {
        const key = 'itest-force-q';
        const rival = fixture('video-task-rival.js');
        assertUploaded(await upload(a, { source: rival, enabled: false }), 'itest-video-rival', '1.0.0');
        assertUploaded(await upload(a, { source: variant(key), enabled: false }), key, '1.0.0');
        try {
            for (const v of ['yes', 'maybe', '', 'TRUE', '2']) {
                for (const [method, p, body] of [
                    ['POST', '/api/plugin/task', { source: rival, enabled: true }],
                    ['POST', '/api/plugin/task/marketplace', { url: '/nonexistent/index.json' }],
                    ['PATCH', '/api/plugin/task/itest-video-rival', { enabled: true }],
                    ['POST', '/api/plugin/task/itest-video-rival/activate', { version: '1.0.0' }],
                    ['DELETE', `/api/plugin/task/${key}`, {}],
                ]) {
                    assertError(await a.admin(method, `${p}?force=${v}`, body), 400, {
                        code: 'invalid_request', message: 'force: must be true or false (1 or 0) (request id: ',
                    });
                }
            }
            /* nothing changed: the rival is still disabled, the other stored */
            const rv = await a.admin('GET', '/api/plugin/task/itest-video-rival');
            assert.equal(assertOk(rv).json.enabled, false, rv.text.slice(0, 300));
            assertOk(await a.admin('GET', `/api/plugin/task/${key}`));
            /* false and 0 are read as not forced */
            for (const v of ['0', 'false']) {
                assertError(await a.admin('PATCH', `/api/plugin/task/itest-video-rival?force=${v}`,
                    { enabled: true }), 409, { code: 'conflict' });
            }
            assertOk(await a.admin('PATCH', '/api/plugin/task/itest-video-rival?force=true', { remark: 'r' }));
            assertOk(await a.admin('DELETE', `/api/plugin/task/${key}?force=false`));
        } finally {
            await a.admin('DELETE', '/api/plugin/task/itest-video-rival?force=1');
            await a.admin('DELETE', `/api/plugin/task/${key}?force=1`);
        }
    });

    test('concurrent calls that would clash, on one node or two: one is stored, the other is 409', async () => {
        /* two plugins on one route, each the variant of its own key */
        const onRoute = (key, route, extra = '') =>
            variant(key).replace(`'/${key}/v1/videos'`, `'${route}'`) + extra;
        const PAIRS = 10;
        for (const [label, g1, g2] of [['one node', a, a], ['two nodes', a, b]]) {
            const tag = label === 'one node' ? 'o' : 't';
            /* enabling two disabled plugins at once */
            for (let i = 0; i < PAIRS; i++) {
                const route = `/itest-sh${tag}${i}/v1/videos`;
                const [k1, k2] = [`itest-x${tag}${i}`, `itest-y${tag}${i}`];
                assertUploaded(await upload(a, { source: onRoute(k1, route), enabled: false }), k1, '1.0.0');
                assertUploaded(await upload(a, { source: onRoute(k2, route), enabled: false }), k2, '1.0.0');
                const rs = await Promise.all([
                    g1.admin('PATCH', `/api/plugin/task/${k1}`, { enabled: true }),
                    g2.admin('PATCH', `/api/plugin/task/${k2}`, { enabled: true }),
                ]);
                assert.deepEqual(rs.map((r) => r.status).sort(), [200, 409],
                    `${label} PATCH pair ${i}: ${rs.map((r) => r.text.slice(0, 200)).join(' | ')}`);
                assertError(rs.find((r) => r.status === 409), 409, { code: 'conflict',
                    message: new RegExp(`^route POST ${route} is already served by plugin itest-[xy]${tag}${i}; enable with force`) });
                for (const k of [k1, k2]) {
                    assertOk(await a.admin('DELETE', `/api/plugin/task/${k}`), `DELETE ${k}`);
                }
            }
            /* uploading two keys on one route at once */
            for (let i = 0; i < PAIRS; i++) {
                const route = `/itest-su${tag}${i}/v1/videos`;
                const [k1, k2] = [`itest-u${tag}${i}`, `itest-v${tag}${i}`];
                const rs = await Promise.all([
                    upload(g1, { source: onRoute(k1, route), enabled: true }),
                    upload(g2, { source: onRoute(k2, route), enabled: true }),
                ]);
                assert.deepEqual(rs.map((r) => r.status).sort(), [200, 409],
                    `${label} upload pair ${i}: ${rs.map((r) => r.text.slice(0, 200)).join(' | ')}`);
                assertError(rs.find((r) => r.status === 409), 409, { code: 'conflict',
                    message: /; upload with force, or with enabled false/ });
                assertOk(await a.admin('DELETE', `/api/plugin/task/${rs.find((r) => r.status === 200).json.key}`));
            }
            /* one version uploaded with two sources at once: the answer
               that is 200 names the sha the database holds */
            for (let i = 0; i < PAIRS; i++) {
                const key = `itest-sv${tag}${i}`;
                const rs = await Promise.all([
                    upload(g1, { source: variant(key) + '\n// one\n', enabled: true }),
                    upload(g2, { source: variant(key) + '\n// two\n', enabled: true }),
                ]);
                assert.deepEqual(rs.map((r) => r.status).sort(), [200, 409],
                    `${label} version pair ${i}: ${rs.map((r) => r.text.slice(0, 200)).join(' | ')}`);
                assertError(rs.find((r) => r.status === 409), 409, { code: 'conflict',
                    message: `plugin ${key} version 1.0.0 is already stored with another source; ` +
                        'raise the version, or upload with force' });
                const won = rs.find((r) => r.status === 200).json;
                const stored = await a.admin('GET', `/api/plugin/task/${key}`);
                assert.equal(assertOk(stored).json.versions[0].sha, won.versions[0].sha, stored.text.slice(0, 300));
                assertOk(await a.admin('DELETE', `/api/plugin/task/${key}`));
            }
        }
    });

    test('a text with a control character anywhere in the manifest is 400 invalid_plugin naming it, never a 503', async () => {
        const key = 'itest-ctl';
        const nul = "' + String.fromCharCode(0) + '";
        const cases = [
            ["author: { name: 'llmgw tests'", `author: { name: 'x${nul}'`, 'meta.author.name'],
            ["models: ['itest-video-1', 'itest-video-2']", `models: ['itest-video-1', 'm${nul}']`, 'meta.models[1]'],
            ["author: { name: 'llmgw tests'", "author: { name: 'a\\u0007b'", 'meta.author.name'],
            ["fetchMode: 'per_task',", `fetchMode: 'per_task',\n  usageSchema: { seconds: { type: 'number', unit: 'second', description: 'x${nul}y' } },`,
                'meta.usageSchema.seconds.description'],
        ];
        for (const [from, to, field] of cases) {
            const source = variant(key).replace(from, to);
            assert.notEqual(source, variant(key), from);
            const r = await upload(a, { source, enabled: false });
            assertError(r, 400, { code: 'invalid_plugin',
                message: new RegExp(`^the plugin was refused: ${field.replace(/[.[\]]/g, '\\$&')}[^;]*: must not contain control characters`) });
        }
        assertError(await a.admin('GET', `/api/plugin/task/${key}`), 404);

        /* a NUL in a body is refused before it reaches the database */
        assertError(await upload(a, { source: variant(key), enabled: false, remark: 'a\u0000b' }), 400,
            { code: 'invalid_json' });
        assertError(await a.admin('GET', `/api/plugin/task/${key}`), 404);
    });

    test('routes nginx could never deliver (percent-escapes, dot segments) are refused with 400 invalid_plugin', async () => {
        const key = 'itest-dots';
        const withPath = (p) => variant(key).replace(`'/${key}/v1/videos'`, `'${p}'`);
        for (const [p, re] of [
            ['/itest-dots/v1/vid%65os', /must not contain '%'/],
            ['/x/../itest-dots/v1/videos', /must not contain "\." or "\.\." segments/],
            ['/itest-dots/./v1/videos', /must not contain "\." or "\.\." segments/],
            ['/itest-dots//v1/videos', /must not contain empty segments/],
        ]) {
            assertError(await upload(a, { source: withPath(p), enabled: true, force: true }), 400,
                { code: 'invalid_plugin', message: new RegExp(`meta\\.routes\\[0\\]\\.path: ${re.source}`) });
        }
        assertError(await a.admin('GET', `/api/plugin/task/${key}`), 404);
        /* a dot inside a segment is a plain character */
        assertUploaded(await upload(a, { source: withPath('/itest-dots/v1.5/.videos'), enabled: false }), key, '1.0.0');
        assertOk(await a.admin('DELETE', `/api/plugin/task/${key}`));
    });

    test('plugin calls refuse members they do not take and flags that are not booleans: 400, nothing changed', async () => {
        const key = 'itest-members';
        const src = variant(key);
        const bad = [
            [{ source: src, enabeld: false }, 'enabeld: unknown field (known: source, remark, enabled, force)'],
            [{ source: src, force: 'yes' }, 'force: must be true or false'],
            [{ source: src, enabled: 'no' }, 'enabled: must be true or false'],
            [{ source: src, remark: 5 }, 'remark: must be a string'],
        ];
        for (const [body, message] of bad) {
            const e = assertError(await upload(a, body), 400, { code: 'invalid_request' });
            assert.ok(e.message.startsWith(message), e.message);
        }
        /* none of them stored the plugin */
        assertError(await a.admin('GET', `/api/plugin/task/${key}`), 404);

        assertUploaded(await upload(a, { source: src, enabled: false, remark: 'kept' }), key, '1.0.0');
        const path = `/api/plugin/task/${key}`;
        const refused = [
            ['PATCH', path, { enabeld: true }, 'enabeld: unknown field (known: enabled, remark, force)'],
            ['PATCH', path, { enabled: 1 }, 'enabled: must be true or false'],
            ['PATCH', path, { force: 'abc', enabled: true }, 'force: must be true or false'],
            ['PATCH', path, { remark: 5 }, 'remark: must be a string'],
            ['POST', `${path}/activate`, { version: '1.0.0', bogus: 1 }, 'bogus: unknown field (known: version, force)'],
            ['POST', `${path}/activate`, { version: 1 }, 'version: must be a string'],
            ['DELETE', path, { forced: true }, 'forced: unknown field (known: force)'],
            ['DELETE', path, { force: 1 }, 'force: must be true or false'],
        ];
        for (const [method, p, body, message] of refused) {
            const e = assertError(await a.admin(method, p, body), 400, { code: 'invalid_request' });
            assert.ok(e.message.startsWith(message), `${method} ${p}: ${e.message}`);
        }
        const one = await a.admin('GET', path);
        assertOk(one);
        assert.equal(one.json.enabled, false);
        assert.equal(one.json.remark, 'kept');

        /* a 405 names the path as written, under /api */
        assertError(await a.admin('PUT', path, {}), 405,
            { message: new RegExp(`^method PUT is not allowed on /api/plugin/task/${key} \\(allowed: GET, PATCH, DELETE\\)`) });
        assertError(await a.admin('PUT', '/api/user', {}), 405,
            { message: /^method PUT is not allowed on \/api\/user \(allowed: GET, POST\)/ });

        /* a DELETE's body is read: force there lifts the unfinished-tasks rule as ?force=1 does */
        assertOk(await a.admin('DELETE', path, { force: true }));
        assertError(await a.admin('GET', path), 404);
    });

    test('what the gateway answers itself is checked as the rest: bodies, paths and query parameters are 400s in the contract', async () => {
        const key = 'itest-checked';
        assertUploaded(await upload(a, { source: variant(key), enabled: false }), key, '1.0.0');
        const json = { headers: { 'Content-Type': 'application/json' } };

        /* a dry run's body that is not one JSON object is the caller's */
        for (const body of ['bad', '{"key":', '[]', '']) {
            assertError(await a.admin('POST', '/api/plugin/task/dryrun', body, json), 400,
                { code: 'invalid_json' });
        }
        /* a path that is not UTF-8 once decoded: not "database unreachable" */
        for (const p of ['/api/plugin/task/%FF/icon', '/api/plugin/task/%FF']) {
            assertError(await a.admin('GET', p), 400,
                { code: 'invalid_request', message: /^the URL is not valid UTF-8/ });
        }
        /* a DELETE's body is JSON like any other */
        assertError(await a.admin('DELETE', `/api/plugin/task/${key}`, 'bad json', json), 400,
            { code: 'invalid_json' });
        assertOk(await a.admin('GET', `/api/plugin/task/${key}`), 'not deleted');
        /* parameters a call does not take */
        for (const [method, p, message] of [
            ['GET', '/api/plugin/task/runtime/status?x=1', 'x: unknown query parameter (this call takes none)'],
            ['GET', `/api/plugin/task/${key}/icon?size=64`, 'size: unknown query parameter (this call takes none)'],
            ['POST', '/api/plugin/task/dryrun?force=1', 'force: unknown query parameter (this call takes none)'],
            ['GET', '/api/plugin/task?pagesize=1', 'pagesize: unknown query parameter (known: page, page_size)'],
            ['DELETE', `/api/plugin/task/${key}?forced=1`, 'forced: unknown query parameter (known: force)'],
        ]) {
            const e = assertError(await a.admin(method, p, method === 'GET' ? undefined : {}), 400,
                { code: 'invalid_request' });
            assert.ok(e.message.startsWith(message), `${method} ${p}: ${e.message}`);
        }
        assertOk(await a.admin('GET', '/api/plugin/task/runtime/status'));
        assertOk(await a.admin('DELETE', `/api/plugin/task/${key}?force=1`));
    });

    test('a plugin whose routes can take another plugin\'s paths: 409; forced, the more specific route serves', async () => {
        /* sorts before itest-video and claims its paths with a parameter */
        const wild = fixture('video-task-rival.js')
            .replace("key: 'itest-video-rival'", "key: 'itest-any-video'")
            .replace("path: '/itest/v1/videos/'", "path: '/:vendor/v1/videos'")
            .replace("path: '/itest/v1/videos/:video_id'", "path: '/:vendor/v1/videos/:video_id'")
            .replace('export const native = {', 'export const native = {\n  error(req, e) { return { wild: e.code }; },');
        const r = await upload(a, { source: wild, enabled: true });
        const e = assertError(r, 409, { code: 'conflict' });
        assert.match(e.message, /route POST \/:vendor\/v1\/videos overlaps route POST \/itest\/v1\/videos of plugin itest-video /);
        assertError(await a.admin('GET', '/api/plugin/task/itest-any-video'), 404);

        const since = Date.now();
        assertUploaded(await upload(a, { source: wild, enabled: true, force: true }),
            'itest-any-video', '1.0.0');
        try {
            await settle(since);
            /* itest-any-video answers its errors with native.error; the
               gateway's own 503 (no channel for the model) names the plugin */
            const req = (method, p) => a.req(method, p,
                { key: client.key, body: method === 'POST' ? {} : undefined });
            for (const p of ['/itest/v1/videos', '/itest/v1/videos/', '/itest//v1/videos']) {
                assertError(await req('POST', p), 503,
                    { code: 'model_not_found', message: /\(plugin itest-video\)/ });
            }
            assertError(await req('GET', '/itest/v1/videos/task_nope'), 404,
                { code: 'task_not_found' });
            for (const [method, p, status, code] of [
                ['POST', '/other/v1/videos', 503, 'model_not_found'],
                ['GET', '/other/v1/videos/task_nope', 404, 'task_not_found'],
            ]) {
                const r2 = await req(method, p);
                assert.equal(r2.status, status, `${method} ${p}: ${r2.text}`);
                assert.deepEqual(r2.json, { wild: code }, `${method} ${p}`);
            }
        } finally {
            assertOk(await a.admin('DELETE', '/api/plugin/task/itest-any-video'),
                'DELETE itest-any-video');
        }
    });

    test('routes on paths the gateway serves itself: 400 naming the route, even forced', async () => {
        const withRoute = (route) => fixture('video-task-rival.js')
            .replace("key: 'itest-video-rival'", "key: 'itest-gw-path'")
            .replace(/routes: \[[\s\S]*?\n  \],/, `routes: [${route}],`);
        const cases = [
            ["{ method: 'POST', path: '/v1/chat/completions', type: 'submit', decode: 'decode', render: 'render' }",
                /meta\.routes\[0\]\.path: "\/v1\/chat\/completions" is a path the gateway serves itself/],
            ["{ method: 'GET', path: '/v1/tasks/:task_id', type: 'query', render: 'render' }",
                /meta\.routes\[0\]\.path: "\/v1\/tasks\/:task_id" is under \/v1\/tasks, a path the gateway serves itself/],
            ["{ method: 'POST', path: '/api/user', type: 'submit', decode: 'decode', render: 'render' }",
                /meta\.routes\[0\]\.path: "\/api\/user" is under \/api, a path the gateway serves itself/],
            ["{ method: 'POST', path: '/v1beta/models/itest-rival-1:generateContent', type: 'submit', decode: 'decode', render: 'render' }",
                /meta\.routes\[0\]\.path: "\/v1beta\/models\/itest-rival-1:generateContent" is a path the gateway serves itself/],
        ];
        for (const [route, re] of cases) {
            const r = await upload(a, { source: withRoute(route), enabled: true, force: true });
            const e = assertError(r, 400, { code: 'invalid_plugin' });
            assert.match(e.message, re, route);
        }
        assertError(await a.admin('GET', '/api/plugin/task/itest-gw-path'), 404);

        /* a parameter where the gateway has a literal is a plugin's path */
        const ok = await upload(a, { enabled: true, source: withRoute(
            "{ method: 'POST', path: '/:version/chat/completions', type: 'submit', decode: 'decode', render: 'render' }") });
        assertUploaded(ok, 'itest-gw-path', '1.0.0');
        assertOk(await a.admin('DELETE', '/api/plugin/task/itest-gw-path'), 'DELETE itest-gw-path');
    });

    test('dry run by source and by key', async () => {
        const ctx = driverCtx();
        const bySource = assertRan(await dryrun(a, {
            source: VIDEO, hook: 'buildSubmitRequest', args: [ctx],
        }), 'dry run by source');
        assert.equal(bySource.url, 'https://upstream.example/v1/video/tasks');
        assert.equal(bySource.method, 'POST');
        assert.deepEqual(bySource.body, { model: 'itest-video-1', prompt: 'a cat', version: '1.0.0' });

        const byKey = assertRan(await dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [ctx] }));
        assert.deepEqual(byKey, bySource);

        /* other hooks, a native decoder among them */
        const parsed = assertRan(await dryrun(a, {
            key: KEY, hook: 'parseSubmitResponse',
            args: [ctx, { statusCode: 200, headers: {}, body: { id: 'up-1' } }],
        }));
        assert.equal(parsed.taskId, 'up-1');
        const decoded = assertRan(await dryrun(a, {
            key: KEY, hook: 'native.decodeSubmit',
            args: [{ method: 'POST', path: '/itest/v1/videos', params: {}, query: {},
                body: { kind: 'json', value: { model: 'itest-video-2' } } }],
        }));
        assert.equal(decoded.kind, 'submit');
        assert.equal(decoded.model, 'itest-video-2');

        /* a hook the plugin does not export */
        assertHookFailed(await dryrun(a, { key: KEY, hook: 'buildBatchQueryRequest', args: [] }), 'plugin');
        /* no such plugin, however long its key; a key that is not a string */
        for (const key of ['itest-nope', 'k'.repeat(64), 'k'.repeat(200), '']) {
            assertError(await dryrun(a, { key, hook: 'buildSubmitRequest', args: [] }), 404,
                { code: 'not_found', message: 'no enabled plugin has that key' });
        }
        for (const key of [7, null, ['itest-video'], { k: 1 }]) {
            assertError(await dryrun(a, { key, hook: 'buildSubmitRequest', args: [] }), 400,
                { code: 'invalid_request', message: 'key must be a string' });
        }
        /* a dry run of an invalid source answers like an upload would refuse it */
        const bad = await dryrun(a, { source: `import x from 'y';\n${VIDEO}`, hook: 'buildSubmitRequest', args: [ctx] });
        if (bad.status === 200) {
            assert.match(assertHookFailed(bad, 'plugin').message, /`import` is not allowed/);
        } else {
            assertError(bad, 400, { message: /`import` is not allowed/ });
        }
    });

    test('a hook that throws: ok false, kind plugin, the credential redacted', async () => {
        const secret = `sk-${hex(24)}`;
        const err = assertHookFailed(await dryrun(a, {
            key: KEY, hook: 'buildSubmitRequest', args: [driverCtx({ behave: 'throw', apiKey: secret })],
        }), 'plugin');
        assert.match(err.message, /upstream refused the key/);
        assert.ok(!err.message.includes(secret), err.message);
        assert.ok(!err.message.includes(secret.slice(3)), err.message);
        assert.match(err.message, /\[redacted\]/);

        /* the same through a source dry run */
        const err2 = assertHookFailed(await dryrun(a, {
            source: VIDEO, hook: 'buildSubmitRequest', args: [driverCtx({ behave: 'throw', apiKey: secret })],
        }), 'plugin');
        assert.ok(!err2.message.includes(secret.slice(3)), err2.message);
    });

    test('a runaway loop times out within the deadline; the next call works', async () => {
        const t0 = Date.now();
        const r = await dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [driverCtx({ behave: 'loop' })] });
        const took = Date.now() - t0;
        assertHookFailed(r, 'timeout');
        assert.ok(took >= DEADLINE_MS - 100 && took < DEADLINE_MS + 4000, `took ${took} ms`);
        assertRan(await dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [driverCtx()] }));
    });

    test('an allocation bomb hits the heap cap (kind memory); the next call works', async () => {
        const r = await dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [driverCtx({ behave: 'bomb' })] });
        assertHookFailed(r, 'memory');
        for (let i = 0; i < 3; i++) {
            assertRan(await dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [driverCtx()] }));
        }
        /* by source too (a fresh isolate compiles it again) */
        assertRan(await dryrun(a, { source: VIDEO, hook: 'buildSubmitRequest', args: [driverCtx()] }));
    });

    test('runtime status: helper workers and the node generation', async () => {
        const r = await status(a);
        assertOk(r, 'runtime/status');
        const { helper, node } = r.json;
        assert.equal(helper.ok, true, r.text);
        assert.equal(helper.workers.length, 2, r.text);
        const pids = a.v8host.workerPids();
        for (const w of helper.workers) {
            for (const k of ['pid', 'calls', 'errors', 'timeouts', 'restarts']) {
                assert.equal(typeof w[k], 'number', `${k}: ${r.text}`);
            }
            assert.ok(pids.includes(w.pid), `worker pid ${w.pid} not in ${pids}`);
        }
        /* the loop and the bomb above were counted */
        const sum = (k) => helper.workers.reduce((n, w) => n + w[k], 0);
        assert.ok(sum('calls') >= 3, r.text);
        assert.ok(sum('timeouts') >= 1, r.text);
        assert.ok(sum('errors') >= 1, r.text);
        assert.equal(typeof node.generation, 'number', r.text);
        assert.deepEqual(node.plugins.map((p) => [p.key, p.version]), [[KEY, '1.0.0']]);
        assert.match(node.plugins[0].sha, /^[0-9a-f]{64}$/);
    });

    test('kill -9 of a helper worker mid-call: that call fails, the next works', async () => {
        const before = await a.v8host.waitWorkers(2);
        const pending = dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [driverCtx({ behave: 'loop' })] });
        /* the worker running the loop is the one burning CPU */
        let busy;
        for (let i = 0; i < 20 && !busy; i++) {
            await sleep(100);
            const t0 = before.map(cpuTicks);
            await sleep(150);
            const d = before.map((p, j) => cpuTicks(p) - t0[j]);
            const j = d.indexOf(Math.max(...d));
            if (d[j] >= 5) {
                busy = before[j];
            }
        }
        assert.ok(busy, `no helper worker of ${before} was busy`);
        const t0 = Date.now();
        process.kill(busy, 'SIGKILL');
        const r = await pending;
        assert.ok(Date.now() - t0 < DEADLINE_MS, `the killed call took ${Date.now() - t0} ms`);
        if (r.status === 200) {
            assertHookFailed(r, 'timeout');
        } else if (r.status === 504) {
            assertError(r, 504, { code: 'plugin_runtime_timeout' });
        } else {
            assertError(r, 502, { code: 'plugin_runtime_error' });
        }

        assertRan(await dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [driverCtx()] }),
            'the call after the kill');
        /* the supervisor replaced the worker (throttled to once a second) */
        const now = await a.v8host.waitWorkers(2);
        assert.ok(!now.includes(busy), `${busy} still listed in ${now}`);
        const st = await status(a);
        assertOk(st);
        assert.ok(st.json.helper.workers.some((w) => w.restarts >= 1), st.text);
        for (let i = 0; i < 4; i++) {
            assertRan(await dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [driverCtx()] }));
        }
    });

    test('helper stopped: plugin calls answer 502/503, chat still served; restarted: works', async () => {
        assertOk(await a.chat(client.key, model), 'chat before');
        await a.v8host.stop();
        assert.equal(a.v8host.workerPids().length, 0);
        try {
            /* chat requests are served while a plugin call is outstanding */
            const t0 = Date.now();
            const pending = upload(a, { source: variant('itest-down'), enabled: true });
            const chats = await Promise.all([1, 2, 3, 4].map(() => a.chat(client.key, model)));
            chats.forEach((c) => assertOk(c, 'chat while the helper is down'));
            assert.ok(Math.max(...chats.map((c) => c.tEnd - c.t0)) < 1000,
                'chat answered late while the helper was down');
            const r = await pending;
            const took = Date.now() - t0;
            assert.ok([502, 503].includes(r.status),
                `upload while the helper is down: expected 502/503, got ${r.status} ` +
                `after ${took} ms: ${r.text}`);
            assertError(r, r.status);
            assertError(await status(a), r.status);
        } finally {
            await a.v8host.start();
        }
        /* a new helper has no source: the gateway loads it from the database */
        await eventually(async () => {
            assertRan(await dryrun(a, { key: KEY, hook: 'buildSubmitRequest', args: [driverCtx()] }),
                'after the restart');
        }, { ms: 2000 });
        assertUploaded(await upload(a, { source: variant('itest-down'), enabled: true }),
            'itest-down', '1.0.0');
        assertOk(await a.admin('DELETE', '/api/plugin/task/itest-down'));
        assertOk(await status(a));
    });

    test('two nodes: activated through A, published on B within 1 s; B dry-runs it from the database', async () => {
        const key = 'itest-multi';
        assertUploaded(await upload(a, { source: variant(key), enabled: true }), key, '1.0.0');
        /* 1.1.0 stored but not made active (enabled false keeps 1.0.0) */
        const up = await upload(a, { source: variant(key, { version: '1.1.0' }), enabled: false });
        assertUploaded(up, key, '1.1.0');
        assert.equal(up.json.active_version, '1.0.0');

        const t0 = Date.now();
        const act = await a.admin('POST', `/api/plugin/task/${key}/activate`, { version: '1.1.0' });
        assertOk(act, 'activate through A');
        await eventually(async () => {
            const ps = await nodePlugins(b);
            assert.ok(ps.some((p) => p.key === key && p.version === '1.1.0'), JSON.stringify(ps));
        }, { since: t0, ms: PROPAGATION_MS });

        /* B's helper never had this source: B reads it from the database */
        assert.notEqual(b.v8host.socket, a.v8host.socket);
        await eventually(async () => {
            const res = assertRan(await dryrun(b, { key, hook: 'buildSubmitRequest', args: [driverCtx()] }),
                'dry run by key through B');
            assert.equal(res.body.version, '1.1.0');
            assert.equal(res.url, 'https://upstream.example/v1/video/tasks');
        }, { since: t0, ms: PROPAGATION_MS });

        /* and disabled through B, gone from A */
        const t1 = Date.now();
        assertOk(await b.admin('PATCH', `/api/plugin/task/${key}`, { enabled: false }));
        await eventually(async () => {
            const ps = await nodePlugins(a);
            assert.ok(!ps.some((p) => p.key === key), JSON.stringify(ps));
        }, { since: t1, ms: PROPAGATION_MS });
    });
});
