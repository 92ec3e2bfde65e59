// The task engine end to end, through the real nginx, PostgreSQL and the
// plugin runtime helper, against the mock vendor of t/lib/vendor.mjs:
// the generic task API (/v1/tasks), native plugin routes, descriptor
// validation (nothing is sent when a descriptor breaks a rule), reserve /
// adjust / settle / refund in the ledger, immediate results, retainResult,
// originTaskIds, multipart files and placeholders, SSE submits in snapshot
// and delta mode, the task timeout, and plugins sharing the plugin runtime.
// Polling classification, batch plugins, two nodes and a killed worker are
// in tasks_poll.test.mjs.
//
// Every test uploads its own variant of a fixture (fixtures/plugins/task-*.js)
// with its own key, models and channel on a vendor of its own.
// Prices: 0.01 USD per task (5000 quota) or 0.01 USD per second of usage.

import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';

import {
    assertError, assertOk, conninfoFor, createDb, dropDb, hex, httpRequest, makeKey, makeUser,
    psql, settle, sleep, startGateway, stopAll, tearDown,
} from '../lib/harness.mjs';
import {
    account, assertErrorShape, bareMessage, expectUsed, gate, getTask, ledgerSum,
    multipartBody, parseMultipart, sseFrame, startVendor, submitTask, taskSetup,
    TERMINAL, vendorSuite, VIEW_KEYS, waitFor, waitLedger, waitStatus,
} from '../lib/vendor.mjs';

const PER_TASK = 5000;      /* 0.01 USD */
const PER_SECOND = 5000;    /* 0.01 USD per second of usage */
const POLL_MS = 200;
const SSE_IDLE_MS = 2000;
/* Under the total cap: one file of TWICE_FILE bytes; inlined twice: over it. */
const FILES_TOTAL = 256 * 1024;
const TWICE_FILE = 160 * 1024;

const HTTP = [
    `llmgw_task_poll_interval ${POLL_MS}ms;`,
    'llmgw_task_poll_max_failures 3;',
    `llmgw_task_sse_idle_timeout ${SSE_IDLE_MS}ms;`,
    `llmgw_task_max_files_total ${FILES_TOTAL};`,
    /* the $llmgw_* variables of every request, in the gateway's folder */
    'log_format vars \'$llmgw_request_id model=$llmgw_model up=$llmgw_upstream_model \'',
    '                \'channel=$llmgw_channel tries=$llmgw_tries "$request" $status\';',
    'access_log vars.log vars;',
].join('\n  ');

const bytes = (n) => randomBytes(n);

describe('task engine: submit, native routes, descriptors, billing', { timeout: 600000 }, () => {
    let db, gw, foreign, allowed;
    const vendors = [];

    /* A vendor of this test; retired after it (its tasks end), closed with
       the file. */
    async function newVendor() {
        const v = await startVendor();
        vendors.push(v);
        return v;
    }

    async function setup(opts = {}) {
        const vendor = opts.vendor || await newVendor();
        return taskSetup(gw, { vendors: [vendor], ...opts });
    }

    const submit = (env, body, opts) => submitTask(gw, env, body, opts);

    /* The vars.log line of an answered request, without its request id. */
    async function varsLine(r) {
        const rid = r.headers['x-request-id'];
        assert.ok(rid, `X-Request-Id: ${r.text.slice(0, 200)}`);
        let line;
        await waitFor(() => {
            line = fs.readFileSync(path.join(gw.dir, 'vars.log'), 'utf8')
                .split('\n').find((l) => l.startsWith(`${rid} `));
            return line;
        }, 5000, { what: `the vars.log line of ${rid}` });
        return line.slice(rid.length + 1);
    }

    /* A sample of /metrics: the value of the series with exactly these
       labels (0 when absent). */
    async function metric(name, labels = '') {
        const r = await httpRequest(`${gw.url}/metrics`);
        assert.equal(r.status, 200, r.text);
        const series = labels ? `${name}{${labels}} ` : `${name} `;
        const line = r.text.split('\n').find((l) => l.startsWith(series));
        return line ? Number(line.slice(series.length)) : 0;
    }
    const native = (env, method, p, { key = env.acct.key, body, headers } = {}) =>
        gw.req(method, `/${env.key}/v1${p}`, { key, body, headers, timeoutMs: 30000 });

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true, http: HTTP });
        foreign = await startVendor();
        allowed = await startVendor();
    });

    afterEach(() => {
        vendors.forEach((v) => v.retire());
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all([foreign, allowed, ...vendors].map((v) => v?.close()));
            await dropDb(db);
        }
    });

    /* ------------------------------------------------------------------ */
    /* the generic task API                                                */
    /* ------------------------------------------------------------------ */

    test('POST /v1/tasks/{key}: the driver context, the task view, a reserve', async () => {
        const env = await setup({ mapping: true });
        const up = `up-${hex(4)}`;
        const body = { model: env.model, prompt: 'a cat on a sofa', nested: { n: [1, 2] }, up_id: up };
        const r = assertOk(await submit(env, body), 'submit');
        const view = r.json;
        assert.match(view.task_id, /^task_/, r.text);
        for (const k of VIEW_KEYS) {
            assert.ok(k in view, `task view has ${k}: ${r.text}`);
        }
        assert.equal(view.model, env.model);
        assert.equal(view.plugin, env.key);
        assert.ok(!TERMINAL.includes(view.status), r.text);
        assert.equal(view.data.submit_status, 200, 'data is what parseSubmitResponse returned');

        const subs = env.vendor.submits();
        assert.equal(subs.length, 1);
        assert.equal(subs[0].headers.authorization, `Bearer ${env.channelKey}`);
        const c = subs[0].json.ctx;
        assert.deepEqual(c.requestBody, body, 'requestBody is the client body');
        assert.equal(c.model, env.model);
        assert.equal(c.upstreamModel, env.upstreamModel, 'after the channel model_mapping');
        assert.equal(c.baseUrl, env.vendor.url);
        assert.equal(c.apiKey, env.channelKey);
        assert.equal(c.authHeader, `Bearer ${env.channelKey}`);
        assert.deepEqual(c.upstream, { kind: 'vendor' });
        assert.equal(c.publicTaskId, view.task_id);
        assert.deepEqual(c.files, []);
        assert.equal(c.originTasks, '<undefined>');
        assert.equal(typeof c.action, 'string');

        const g = assertOk(await getTask(gw, env.acct.key, view.task_id), 'GET task');
        assert.equal(g.json.task_id, view.task_id);
        assert.equal(g.json.model, env.model);
        assert.equal(g.json.plugin, env.key);
        for (const k of VIEW_KEYS) {
            assert.ok(k in g.json, `GET view has ${k}: ${g.text}`);
        }

        const led = await waitLedger(db, view.task_id, ['reserve']);
        assert.equal(led.reserve, PER_TASK);
        await expectUsed(gw, db, env.acct, PER_TASK);
    });

    test('POST /v1/tasks: no key 401, unknown plugin 404, no model 400, unserved model 503', async () => {
        const env = await setup({ wait: false });
        const other = await setup();
        const base = { prompt: 'x' };
        assertError(await submit(env, { model: env.model, ...base }, { key: null }), 401);
        assertError(await submit(env, { model: env.model, ...base }, { plugin: `nope-${hex(4)}` }), 404);
        assertError(await submit(env, base), 400, { message: 'Model name not specified' });
        /* served, but by a channel bound to another plugin */
        assertError(await submit(env, { model: other.model, ...base }), 503, { code: 'model_not_found' });
        assertError(await submit(env, { model: `unknown-${hex(4)}`, ...base }), 503,
            { code: 'model_not_found' });
        await sleep(300);
        assert.equal(env.vendor.requests.length, 0, 'nothing reached the vendor');
        assert.equal(other.vendor.requests.length, 0, 'nothing reached the other vendor');
        await expectUsed(gw, db, env.acct, 0);
    });

    test('GET /v1/tasks/{id}: another user\'s task and an unknown id are the same 404', async () => {
        const env = await setup();
        const r = assertOk(await submit(env, { model: env.model }));
        const id = r.json.task_id;
        const stranger = await account(gw);
        const theirs = await getTask(gw, stranger.key, id);
        assertError(theirs, 404, { code: 'task_not_found' });
        const unknownId = `task_${hex(12)}`;
        const none = await getTask(gw, env.acct.key, unknownId);
        assertError(none, 404, { code: 'task_not_found' });
        assert.equal(theirs.json.error.type, none.json.error.type);
        assert.equal(bareMessage(theirs).replace(id, '<id>'), bareMessage(none).replace(unknownId, '<id>'),
            'the answers cannot tell the two apart');
        assertOk(await getTask(gw, env.acct.key, id), 'the owner still sees it');
    });

    test('a non-2xx submit answer: that status, upstream_error, the vendor message; nothing charged', async () => {
        const env = await setup();
        for (const [status, msg] of [[429, 'vendor is busy, slow down'], [400, 'prompt too long for vendor']]) {
            env.vendor.onSubmit = () => ({ status, body: { error: { message: msg, type: 'vendor' } } });
            const r = await submit(env, { model: env.model, prompt: 'x' });
            const e = assertError(r, status, { type: 'upstream_error' });
            assert.ok(e.message.includes(msg), `the vendor's message: ${e.message}`);
        }
        assert.ok(env.vendor.submits().length >= 2);
        await settle();
        await expectUsed(gw, db, env.acct, 0);
        const rows = JSON.parse(await psql(db.conninfo,
            `select coalesce(json_agg(type), '[]') from logs where token_id = ${env.acct.token.id}`));
        for (const t of rows) {
            assert.ok(['reserve', 'refund', 'error'].includes(t), `unexpected ledger row ${t}`);
        }
        assert.equal(rows.filter((t) => t === 'reserve').length, rows.filter((t) => t === 'refund').length,
            `each reserve refunded: ${rows}`);
        assert.equal(env.vendor.polls().length, 0, 'no task to poll');
    });

    test('any 2xx submit status goes to parseSubmitResponse (202 Accepted)', async () => {
        const env = await setup();
        env.vendor.onSubmit = (rec) => ({ status: 202, body: { id: rec.json.up_id } });
        const r = assertOk(await submit(env, { model: env.model, up_id: `up-${hex(4)}` }));
        assert.equal(r.json.data.submit_status, 202, r.text);
    });

    test('a throwing hook: 500 plugin_error, its message with the key redacted; nothing sent or charged', async () => {
        const env = await setup();
        const r = await submit(env, { model: env.model, behave: 'throw' });
        const e = assertError(r, 500, { code: 'plugin_error' });
        assert.match(e.message, /vendor refused key/);
        assert.ok(!e.message.includes(env.channelKey), e.message);
        assert.ok(!e.message.includes(env.channelKey.slice(3)), e.message);
        assert.equal(env.vendor.requests.length, 0);
        await settle();
        await expectUsed(gw, db, env.acct, 0);
    });

    test('a throwing hook quoting a short channel key (no long secret-looking run): redacted too', async () => {
        const channelKey = `pw-${hex(4)}`;
        const env = await setup({ channelKey });
        const r = await submit(env, { model: env.model, behave: 'throw' });
        const e = assertError(r, 500, { code: 'plugin_error' });
        assert.match(e.message, /vendor refused key \[credential\] for/, e.message);
        assert.ok(!e.message.includes(channelKey), e.message);
        assert.ok(!gw.errorLog().includes(channelKey), 'the error log does not quote the key');
    });

    /* ------------------------------------------------------------------ */
    /* descriptors                                                         */
    /* ------------------------------------------------------------------ */

    test('descriptor violations: 500 invalid_descriptor naming the rule, nothing sent, nothing charged', async () => {
        const env = await setup({ allowedHosts: [`127.0.0.1:${allowed.port}`] });
        foreign.reset();
        allowed.reset();
        const cases = [
            ['a host outside allowedHosts', { behave: 'foreign', target: foreign.url },
                new RegExp(`host|127\\.0\\.0\\.1:${foreign.port}`, 'i')],
            ['the channel key to another host', { behave: 'leak', target: foreign.url },
                new RegExp(`host|127\\.0\\.0\\.1:${foreign.port}`, 'i')],
            ['credentialless with a body', { behave: 'credentialless' }, /credentialless/i],
            ['responseType sse not declared', { behave: 'sse' }, /sse/i],
        ];
        for (const [what, extra, re] of cases) {
            const r = await submit(env, { model: env.model, up_id: `up-${hex(4)}`, ...extra });
            const e = assertError(r, 500, { code: 'invalid_descriptor' });
            assert.match(e.message, re, `${what}: ${e.message}`);
            assert.ok(!e.message.includes(env.channelKey.slice(3)), `${what}: the key in ${e.message}`);
        }
        await sleep(300);
        assert.deepEqual(foreign.requests.map((q) => q.url), [], 'the foreign host received nothing');
        assert.deepEqual(env.vendor.requests.map((q) => q.url), [], 'the vendor received nothing');
        await expectUsed(gw, db, env.acct, 0);

        /* the same descriptor to a host in allowedHosts is sent, credentials and all */
        const up = `up-${hex(4)}`;
        const ok = assertOk(await submit(env, { model: env.model, up_id: up, behave: 'foreign', target: allowed.url }));
        assert.match(ok.json.task_id, /^task_/);
        assert.equal(allowed.submits().length, 1);
        assert.equal(allowed.submits()[0].headers.authorization, `Bearer ${env.channelKey}`);
        assert.equal(foreign.requests.length, 0);
    });

    test('redirects are re-checked: same host followed, a foreign host never contacted', async () => {
        const env = await setup();
        foreign.reset();
        env.vendor.onSubmit = (rec) => (rec.path === '/submit'
            ? { status: 307, headers: { Location: rec.json.up_id === 'away' ? `${foreign.url}/submit` : '/moved/submit' } }
            : { status: 200, body: { id: `up-${hex(4)}` } });
        const ok = assertOk(await submit(env, { model: env.model, up_id: 'here' }), 'same-host redirect');
        assert.match(ok.json.task_id, /^task_/);
        assert.deepEqual(env.vendor.submits().map((q) => q.path), ['/submit', '/moved/submit']);

        const r = await submit(env, { model: env.model, up_id: 'away' });
        assert.ok(r.status >= 400, `a redirect to a foreign host is refused: ${r.status} ${r.text}`);
        assertErrorShape(r);
        await sleep(300);
        assert.equal(foreign.requests.length, 0, 'the foreign host received nothing');
    });

    /* ------------------------------------------------------------------ */
    /* logs and metrics                                                    */
    /* ------------------------------------------------------------------ */

    test('a submit logs its model, upstream model, channel and tries, and is counted under its model', async () => {
        const env = await setup({ mapping: true });
        const series = (m) => `endpoint="task",model="${m}",status="200"`;
        const r = assertOk(await submit(env, { model: env.model, prompt: 'x' }), 'submit');
        assert.equal(await varsLine(r), `model=${env.model} up=${env.upstreamModel} ` +
            `channel=${env.channels[0].id} tries=1 "POST /v1/tasks/${env.key} HTTP/1.1" 200`);

        const n = assertOk(await native(env, 'POST', '/generate',
            { body: { model: env.model, prompt: 'x' } }), 'native submit');
        assert.equal(await varsLine(n), `model=${env.model} up=${env.upstreamModel} ` +
            `channel=${env.channels[0].id} tries=1 "POST /${env.key}/v1/generate HTTP/1.1" 200`);

        /* nothing was sent: the model, but no channel */
        const none = await submit(env, { model: env.model, behave: 'throw' });
        assertError(none, 500, { code: 'plugin_error' });
        assert.equal(await varsLine(none), `model=${env.model} up=- channel=0 tries=0 ` +
            `"POST /v1/tasks/${env.key} HTTP/1.1" 500`);

        assert.equal(await metric('llmgw_requests_total', series(env.model)), 2);
    });

    test('a submit tried on a second channel logs that channel and two tries; the retry is counted', async () => {
        const [v1, v2] = [await newVendor(), await newVendor()];
        const env = await taskSetup(gw, { vendors: [v1, v2], models: 1 });
        /* the channels share a priority: whichever is tried first fails */
        const order = [];
        const failFirst = (v) => () => {
            order.push(v);
            return order.length === 1
                ? { status: 500, body: { error: { message: 'vendor down' } } } : undefined;
        };
        v1.onSubmit = failFirst(v1);
        v2.onSubmit = failFirst(v2);
        const retries = await metric('llmgw_retries_total');
        const r = assertOk(await submit(env, { model: env.model, prompt: 'x' }), 'submit');
        assert.equal(order.length, 2);
        assert.notEqual(order[0], order[1], 'the second try went to the other channel');
        const ch = env.channels[order[1] === v1 ? 0 : 1];
        assert.equal(await varsLine(r), `model=${env.model} up=${env.model} channel=${ch.id} ` +
            `tries=2 "POST /v1/tasks/${env.key} HTTP/1.1" 200`);
        assert.equal(await metric('llmgw_retries_total'), retries + 1);
    });

    test('a model priced only under its plugin (<key>::<model>) has its own metrics series', async () => {
        const env = await setup({ price: 'unit' });
        env.vendor.onSubmit = () => ({ body: { id: `up-${hex(4)}`, data: { seconds: 2 } } });
        const r = assertOk(await submit(env, { model: env.model, duration: 2 }), 'submit');
        assert.match(await varsLine(r), new RegExp(`^model=${env.model} up=${env.model} ` +
            `channel=${env.channels[0].id} tries=1 `));
        assert.equal(await metric('llmgw_requests_total',
            `endpoint="task",model="${env.model}",status="200"`), 1);
    });

    /* ------------------------------------------------------------------ */
    /* native routes                                                       */
    /* ------------------------------------------------------------------ */

    test('native submit and query routes answer what render returned', async () => {
        const env = await setup();
        const up = `up-${hex(4)}`;
        const body = { model: env.model, prompt: 'a dog', up_id: up };
        /* a key= in the query is the plugin's: masked in the logs only */
        const r = assertOk(await native(env, 'POST',
            '/generate?x=1&x=2&key=vendor-arg-1&y=1;key=vendor-arg-2', { body }), 'native submit');
        const id = r.json.vendor_id;
        assert.match(id, /^task_/, r.text);
        assert.equal(r.json.route, `/${env.key}/v1/generate`);
        assert.deepEqual(r.json.query, { x: ['1', '2'], key: ['vendor-arg-1'], y: ['1;key=vendor-arg-2'] });
        assert.ok(!TERMINAL.includes(r.json.state), r.text);
        const c = env.vendor.submits()[0].json.ctx;
        assert.deepEqual(c.requestBody, body, 'the decoder\'s requestBody');
        assert.equal(c.action, 'generate');
        assert.equal(c.publicTaskId, id);

        const q = assertOk(await native(env, 'GET', `/tasks/${id}`), 'native query');
        assert.equal(q.json.vendor_id, id);
        assert.deepEqual(q.json.params, { task_id: id });
        assert.equal(typeof q.json.state, 'string');
        const j = assertOk(await native(env, 'GET', `/jobs/${id}`), 'query route with taskIdParam');
        assert.deepEqual(j.json.params, { job: id });

        /* the generic view of the same task */
        const g = assertOk(await getTask(gw, env.acct.key, id));
        assert.equal(g.json.action, 'generate');

        const stranger = await account(gw);
        assertError(await native(env, 'GET', `/tasks/${id}`, { key: stranger.key }), 404,
            { code: 'task_not_found' });
        assertError(await native(env, 'GET', `/tasks/${id}`, { key: null }), 401);
        assert.equal(env.vendor.submits().length, 1);
    });

    test('a render may answer any JSON value; a render that fails answers the task anyway', async () => {
        const env = await setup();
        for (const value of ['hello', 42, null, '', true, [1, 'a']]) {
            const r = await native(env, 'POST', '/generate',
                { body: { model: env.model, prompt: 'p', render_as: value } });
            assert.equal(r.status, 200, `render_as ${JSON.stringify(value)}: ${r.text}`);
            assert.equal(r.text, JSON.stringify(value));
        }

        /* the vendor took the task and it is charged: the client learns
           its id (an error would be retried, and paid twice) */
        const r = assertOk(await native(env, 'POST', '/generate',
            { body: { model: env.model, prompt: 'p', render_as: 'throw' } }));
        assert.match(r.json.task_id, /^task_/, r.text);
        const g = assertOk(await getTask(gw, env.acct.key, r.json.task_id));
        assert.equal(g.json.task_id, r.json.task_id);
        assert.equal(env.vendor.submits().length, 7);

        /* a query's render that fails is the plugin's error: no task was
           made by it */
        assertError(await native(env, 'GET', `/tasks/${r.json.task_id}?boom=1`), 500,
            { code: 'plugin_error' });
    });

    test('route models: a missing, non-string or unlisted model is 400 and sends nothing', async () => {
        const env = await setup();
        for (const [what, model] of [['missing', undefined], ['a number', 42],
            ['a model of the plugin not listed on the route', env.models[1]], ['unknown', `zz-${hex(3)}`]]) {
            const r = await native(env, 'POST', '/generate', { body: { model, prompt: 'x' } });
            assert.equal(r.status, 400, `${what}: ${r.status} ${r.text}`);
            assertError(r, 400);
        }
        assert.equal(env.vendor.requests.length, 0);
        assertOk(await native(env, 'POST', '/generate', { body: { model: env.model } }), 'a listed model');
        /* the generic API is not a route: the plugin's other model is served there */
        assertOk(await submit(env, { model: env.models[1] }), 'generic API, second model');
    });

    test('native.error shapes the errors of that plugin\'s routes, and only those', async () => {
        const env = await setup({ errorRenderer: true });
        const shaped = (r, status) => {
            assert.equal(r.status, status, r.text);
            const e = r.json && r.json.vendor_error;
            assert.ok(e, `shaped by native.error: ${r.text}`);
            assert.equal(e.status, status);
            assert.equal(typeof e.code, 'string');
            assert.equal(typeof e.message, 'string');
            assert.equal(typeof e.retryable, 'boolean');
            assert.equal(r.json.error, undefined, r.text);
            return e;
        };
        shaped(await native(env, 'POST', '/generate', { body: { model: env.models[1] } }), 400);
        const e404 = shaped(await native(env, 'GET', `/tasks/task_${hex(12)}`), 404);
        assert.equal(e404.code, 'task_not_found');
        env.vendor.onSubmit = () => ({ status: 429, body: { error: { message: 'vendor quota hit' } } });
        const e429 = shaped(await native(env, 'POST', '/generate', { body: { model: env.model } }), 429);
        assert.match(e429.message, /vendor quota hit/);
        /* a body the gateway cannot read, before any decoder ran */
        for (const [body, type, code] of [['{"model": ', 'application/json', 'invalid_json'],
            ['x', 'text/plain', 'invalid_request']]) {
            const e = shaped(await native(env, 'POST', '/generate',
                { body, headers: { 'Content-Type': type } }), 400);
            assert.equal(e.code, code, `${type}: ${JSON.stringify(e)}`);
            assert.equal(e.path, `/${env.key}/v1/generate`);
        }
        assert.equal(env.vendor.submits().length, 1);
        /* not the plugin's route: the gateway's contract */
        assertError(await submit(env, { prompt: 'no model' }), 400, { message: 'Model name not specified' });
        assertError(await gw.req('POST', `/v1/tasks/${env.key}`, { key: env.acct.key, body: '{"model": ',
            headers: { 'Content-Type': 'application/json' } }), 400, { code: 'invalid_json' });
        /* nested deeper than hooks take (and than the gateway's parser reads) */
        for (const depth of [513, 2046, 5000]) {
            const deep = `{"model": "${env.model}", "x": ${'['.repeat(depth - 1)}${']'.repeat(depth - 1)}}`;
            assertError(await gw.req('POST', `/v1/tasks/${env.key}`, { key: env.acct.key, body: deep,
                headers: { 'Content-Type': 'application/json' } }), 400,
            { code: 'invalid_json', message: depth === 5000 ? 'invalid JSON request body'
                : 'invalid JSON request body: nested more than 512 levels deep' });
        }
        assert.equal(env.vendor.submits().length, 1, 'none of them was sent');
        assertError(await getTask(gw, env.acct.key, `task_${hex(12)}`), 404, { code: 'task_not_found' });
    });

    /* ------------------------------------------------------------------ */
    /* billing                                                             */
    /* ------------------------------------------------------------------ */

    test('per-unit price: reserve from extractUsage, adjust at submit, settle at SUCCESS', async () => {
        const env = await setup({ price: 'unit' });
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({ body: { id: up, data: { seconds: 5 } } });
        env.vendor.queuePoll(up, { body: { status: 'running', progress: '40%' } },
            { body: { status: 'done', seconds: 6, result: 'https://cdn.example/v.mp4' } });
        const r = assertOk(await submit(env, { model: env.model, duration: 4 }));
        const id = r.json.task_id;
        const done = await waitStatus(gw, env.acct.key, id, 'SUCCESS');
        assert.ok(done.finished_at, JSON.stringify(done));
        const led = await waitLedger(db, id, ['reserve', 'adjust', 'settle']);
        assert.deepEqual(led, { reserve: 4 * PER_SECOND, adjust: PER_SECOND, settle: PER_SECOND },
            'reserve 4 s, adjust to 5 s, settle at 6 s');
        await expectUsed(gw, db, env.acct, 6 * PER_SECOND);
        /* nothing polls a finished task */
        const n = env.vendor.polls(up).length;
        await sleep(4 * POLL_MS);
        assert.equal(env.vendor.polls(up).length, n);
    });

    test('a vendor answer quoting the channel key is stored and shown with [credential]', async () => {
        const env = await setup();
        const up = `up-${hex(4)}`;
        /* what vendors echo: the Authorization they were sent */
        env.vendor.onSubmit = (rec) => ({ body: { id: up,
            data: { received_authorization: rec.headers.authorization } } });
        env.vendor.queuePoll(up, { body: { status: 'failed',
            error: `Invalid API key ${env.channelKey}` } });
        const r = assertOk(await submit(env, { model: env.model }));
        assert.equal(r.json.data.received_authorization, 'Bearer [credential]', r.text);
        const v = await waitStatus(gw, env.acct.key, r.json.task_id, 'FAILURE');
        assert.match(v.fail_reason, /^Invalid API key \[credential\]/);
        await waitLedger(db, r.json.task_id, ['reserve', 'refund']);
        const stored = await psql(db.conninfo,
            `select count(*) from tasks where task_id = '${r.json.task_id}' and
               (data::text like '%${env.channelKey}%' or fail_reason like '%${env.channelKey}%')`);
        assert.equal(stored.trim(), '0');
        const logged = await psql(db.conninfo,
            `select count(*) from logs where content like '%${env.channelKey}%'`);
        assert.equal(logged.trim(), '0');
    });

    test('the channel key in base64 (an echoed Basic header, a token wrapping it) is shown as [credential]', async () => {
        const env = await setup();
        const basic = Buffer.from(`${env.channelKey}:`).toString('base64');
        const token = Buffer.from(`u.${env.channelKey}`).toString('base64url');
        const failed = `up-${hex(4)}`, done = `up-${hex(4)}`;
        env.vendor.queuePoll(failed, { body: { status: 'failed', error: `refused Basic ${basic}` } });
        env.vendor.queuePoll(done, { body: { status: 'done', result: { token } } });
        const ids = [];
        for (const up of [failed, done]) {
            env.vendor.onSubmit = () => ({ body: { id: up } });
            ids.push(assertOk(await submit(env, { model: env.model })).json.task_id);
        }
        const f = await waitStatus(gw, env.acct.key, ids[0], 'FAILURE');
        assert.match(f.fail_reason, /^refused Basic \[credential\]/, f.fail_reason);
        const d = await waitStatus(gw, env.acct.key, ids[1], 'SUCCESS');
        assert.match(d.data.result.token, /\[credential\]/, JSON.stringify(d.data));
        /* of the key's base64 no run of 8 characters is left anywhere */
        const shown = JSON.stringify([f, d]);
        for (const b64 of [basic, token]) {
            for (let at = 3; at + 8 <= b64.length - 3; at++) {
                assert.ok(!shown.includes(b64.slice(at, at + 8)), `${b64.slice(at, at + 8)} in ${shown}`);
            }
        }
        await waitLedger(db, ids[0], ['reserve', 'refund']);
        await waitLedger(db, ids[1], ['reserve', 'settle']);
        const stored = await psql(db.conninfo,
            `select count(*) from tasks where task_id in ('${ids[0]}', '${ids[1]}') and
               (data::text like '%${basic.slice(4, 40)}%' or fail_reason like '%${basic.slice(4, 40)}%'
                or data::text like '%${token.slice(4, 40)}%')`);
        assert.equal(stored.trim(), '0');
    });

    test('FAILURE refunds everything charged for the task', async () => {
        const env = await setup({ price: 'unit' });
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({ body: { id: up, data: { seconds: 3 } } });
        env.vendor.queuePoll(up, { body: { status: 'failed', error: 'vendor gave up' } });
        const r = assertOk(await submit(env, { model: env.model, duration: 2 }));
        const v = await waitStatus(gw, env.acct.key, r.json.task_id, 'FAILURE');
        assert.match(v.fail_reason, /vendor gave up/);
        const led = await waitLedger(db, r.json.task_id, ['reserve', 'refund']);
        assert.equal(led.reserve, 2 * PER_SECOND);
        assert.equal(led.refund, led.reserve + (led.adjust || 0));
        assert.ok(!('settle' in led), JSON.stringify(led));
        await expectUsed(gw, db, env.acct, 0);
    });

    test('a refund is known at once: a key whose quota the task had taken is served again right after', async () => {
        const env = await setup();
        const user = await makeUser(gw, { quota: 100000000 });
        /* exactly one task's price (0.01 USD) */
        const tok = await makeKey(gw, user.id, { unlimited_quota: false, remain_quota: 5000 });
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({ body: { id: up } });
        env.vendor.queuePoll(up, { body: { status: 'failed', error: 'vendor gave up' } });
        const r = assertOk(await submit(env, { model: env.model }, { key: tok.key }));
        await waitLedger(db, r.json.task_id, ['reserve', 'refund']);
        /* the refund row and the balance are one transaction; the worker
           learns the balance from its answer, a moment after the commit
           (without the balance's revision the refund was not learned: the
           next request was 401 Invalid token) */
        await sleep(50);
        env.vendor.onSubmit = () => ({ body: { id: `up-${hex(4)}` } });
        assertOk(await submit(env, { model: env.model }, { key: tok.key }));
    });

    test('immediate SUCCESS: settled at submit, never polled; its members join the task data', async () => {
        const env = await setup({ price: 'unit' });
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({
            body: { id: up, immediate: { status: 'SUCCESS', seconds: 3, result: 'inline' } },
        });
        const r = assertOk(await submit(env, { model: env.model, duration: 2 }));
        assert.equal(r.json.status, 'SUCCESS', r.text);
        /* a result without `data` is merged into the taskData, as a poll's is */
        const merged = { submit_status: 200, seconds: 3, result: 'inline' };
        assert.deepEqual(r.json.data, merged, r.text);
        assert.deepEqual((await getTask(gw, env.acct.key, r.json.task_id)).json.data, merged);
        const led = await waitLedger(db, r.json.task_id, ['reserve', 'settle']);
        assert.equal(led.reserve + (led.adjust || 0) + led.settle, 3 * PER_SECOND, JSON.stringify(led));
        await expectUsed(gw, db, env.acct, 3 * PER_SECOND);
        await sleep(5 * POLL_MS);
        assert.equal(env.vendor.polls().length, 0, 'the vendor got no poll');
        assert.equal((await getTask(gw, env.acct.key, r.json.task_id)).json.status, 'SUCCESS');
    });

    test('usage hooks that fail once the vendor has the task: it stands at the charge so far, noted in the error log', async () => {
        const env = await setup({ price: 'unit' });
        const ups = [0, 1, 2, 3].map(() => `up-${hex(4)}`);
        const answers = [
            { id: ups[0], data: { usage_throw: 'submit usage broke' } },
            { id: ups[1], data: { seconds: -4 } },
            { id: ups[2], immediate: { status: 'SUCCESS', usage_throw: 'final usage broke' } },
            { id: ups[3], data: { seconds: 3 } },
        ];
        let n = 0;
        env.vendor.onSubmit = () => ({ body: answers[n++] });
        env.vendor.queuePoll(ups[0], { body: { status: 'done', seconds: 6 } });
        env.vendor.queuePoll(ups[1], { body: { status: 'done' } });
        env.vendor.queuePoll(ups[3], { body: { status: 'done', seconds: 9, usage_throw: 'poll usage broke' } });
        const ids = [];
        for (let i = 0; i < answers.length; i++) {
            const r = assertOk(await submit(env, { model: env.model, duration: 2 }));
            assert.equal(r.json.status, i === 2 ? 'SUCCESS' : 'SUBMITTED', r.text);
            ids.push(r.json.task_id);
        }
        for (const id of ids) {
            await waitStatus(gw, env.acct.key, id, 'SUCCESS');
        }
        /* the submit hook threw: the reservation stood until the completion's facts settled it */
        let led = await waitLedger(db, ids[0], ['reserve', 'settle']);
        assert.deepEqual(led, { reserve: 2 * PER_SECOND, settle: 4 * PER_SECOND });
        /* facts the schema refuses: the reservation stands */
        led = await waitLedger(db, ids[1], ['reserve', 'settle']);
        assert.equal(led.reserve + (led.adjust || 0) + led.settle, 2 * PER_SECOND, JSON.stringify(led));
        /* an immediate result's completion hook threw: the reservation stands */
        led = await waitLedger(db, ids[2], ['reserve', 'settle']);
        assert.equal(led.reserve + (led.adjust || 0) + led.settle, 2 * PER_SECOND, JSON.stringify(led));
        /* a poll's completion hook threw: the submit's adjusted charge stands */
        led = await waitLedger(db, ids[3], ['reserve', 'adjust', 'settle']);
        assert.equal(led.reserve + led.adjust + led.settle, 3 * PER_SECOND, JSON.stringify(led));
        await expectUsed(gw, db, env.acct, (6 + 2 + 2 + 3) * PER_SECOND);
        const log = gw.errorLog();
        assert.match(log, new RegExp(`${ids[0]}: extractUsageOnSubmit failed: .*submit usage broke.*; the charge so far stands`));
        assert.match(log, new RegExp(`${ids[1]}: extractUsageOnSubmit: .*; the charge so far stands`));
        assert.match(log, new RegExp(`${ids[2]}: extractUsageOnComplete failed: .*final usage broke.*; the charge so far stands`));
        assert.match(log, new RegExp(`${ids[3]}: extractUsageOnComplete failed: .*poll usage broke`));
    });

    test('immediate FAILURE: refunded at submit, never polled', async () => {
        const env = await setup();
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({
            body: { id: up, immediate: { status: 'FAILURE', reason: 'content policy refused it' } },
        });
        const r = assertOk(await submit(env, { model: env.model }));
        assert.equal(r.json.status, 'FAILURE', r.text);
        assert.match(r.json.fail_reason, /content policy/);
        await waitLedger(db, r.json.task_id, ['reserve', 'refund']);
        await expectUsed(gw, db, env.acct, 0);
        await sleep(5 * POLL_MS);
        assert.equal(env.vendor.polls().length, 0, 'the vendor got no poll');
    });

    test('immediate IN_PROGRESS or QUEUED: stored with that status, polled as any task, charged once at its end', async () => {
        const env = await setup({ price: 'unit' });
        const cases = [
            ['IN_PROGRESS', { progress: 10, state: { step: 1 } }, 5],
            ['QUEUED', { result: 'waiting' }, 4],
        ];
        for (const [status, extra, seconds] of cases) {
            const up = `up-${hex(4)}`;
            env.vendor.onSubmit = () => ({
                body: { id: up, data: { seconds: 3 }, immediate: { status, ...extra } },
            });
            const held = gate();
            env.vendor.queuePoll(up, { body: { status: 'running' }, before: () => held.promise },
                { body: { status: 'done', seconds } });
            const r = assertOk(await submit(env, { model: env.model, duration: 2 }), status);
            assert.equal(r.json.status, status, r.text);
            const id = r.json.task_id;
            if (status === 'IN_PROGRESS') {
                assert.equal(r.json.progress, '10%', r.text);
            } else {
                /* its members join the task data, as a poll's result's do */
                assert.equal(r.json.data.result, 'waiting', r.text);
            }
            /* until it ends: the reservation, adjusted by the submit's facts */
            let led = await waitLedger(db, id, ['reserve', 'adjust']);
            assert.equal(led.reserve + led.adjust, 3 * PER_SECOND, JSON.stringify(led));
            await waitFor(() => env.vendor.polls(up).length === 1, 5000, { what: 'polled' });
            assert.equal((await getTask(gw, env.acct.key, id)).json.status, status);
            if (status === 'IN_PROGRESS') {
                assert.deepEqual(JSON.parse(await psql(db.conninfo,
                    `select state from tasks where task_id = '${id}'`)), { step: 1 });
            }
            held.open();
            await waitStatus(gw, env.acct.key, id, 'SUCCESS');
            led = await waitLedger(db, id, ['reserve', 'adjust', 'settle']);
            assert.equal(led.reserve + led.adjust + led.settle, seconds * PER_SECOND, JSON.stringify(led));
            assert.equal(env.vendor.submits().filter((x) => x.upId === up).length, 1, 'submitted once');
        }
        await expectUsed(gw, db, env.acct, (5 + 4) * PER_SECOND);
    });

    test('immediate with an UNKNOWN or no status: 500 plugin_error', async () => {
        const env = await setup();
        for (const immediate of [{ status: 'UNKNOWN' }, { progress: 5 }, { status: 'running' }]) {
            env.vendor.onSubmit = () => ({ body: { id: `up-${hex(4)}`, immediate } });
            const r = await submit(env, { model: env.model });
            assertError(r, 500, { code: 'plugin_error' });
            assert.match(bareMessage(r), /immediate must be a result with a standard status other than UNKNOWN/);
        }
    });

    test('retainResult false: the submit answers the result; the task is billed, its data not kept', async () => {
        const env = await setup();
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({
            body: { id: up, data: { secret_result: 'b64-image-bytes' },
                    immediate: { status: 'SUCCESS', result: 'b64-image-bytes' } },
        });
        const r = assertOk(await native(env, 'POST', '/instant', { body: { model: env.model } }));
        const id = r.json.vendor_id;
        assert.match(id, /^task_/, r.text);
        assert.equal(r.json.state, 'SUCCESS', r.text);
        /* the client gets the result once, from the submit's render */
        assert.equal(r.json.data?.secret_result, 'b64-image-bytes', `rendered: ${r.text}`);
        const g = assertOk(await getTask(gw, env.acct.key, id));
        assert.equal(g.json.status, 'SUCCESS');
        assert.equal(g.json.data, null, `data not persisted: ${g.text}`);
        const led = await waitLedger(db, id, ['reserve', 'settle']);
        assert.equal(ledgerSum(Object.entries(led).map(([type, quota]) => ({ type, quota }))), PER_TASK);
        await expectUsed(gw, db, env.acct, PER_TASK);
        await sleep(3 * POLL_MS);
        assert.equal(env.vendor.polls().length, 0);
    });

    test('taskData or state over 1 MiB at submit: 500 plugin_error, nothing stored or charged', async () => {
        const env = await setup();
        const big = 'x'.repeat(1536 * 1024);
        for (const [what, body] of [['data', { data: { big } }], ['state', { state: { big } }]]) {
            env.vendor.onSubmit = () => ({ body: { id: `up-${hex(4)}`, ...body } });
            const r = await submit(env, { model: env.model });
            assertError(r, 500, { code: 'plugin_error' });
            assert.match(bareMessage(r), new RegExp(`task's ${what} is larger than 1 MiB`));
        }
        assert.equal(env.vendor.submits().length, 2);
        assert.equal(await psql(db.conninfo, `select count(*) from tasks where plugin_key = '${env.key}'`), '0');
        await expectUsed(gw, db, env.acct, 0);

        /* the result of a retainResult false route is not stored: any size */
        env.vendor.onSubmit = () => ({
            body: { id: `up-${hex(4)}`, immediate: { status: 'SUCCESS', data: { big } } },
        });
        const r = assertOk(await native(env, 'POST', '/instant', { body: { model: env.model } }));
        assert.equal(r.json.data?.big?.length, big.length, r.text.slice(0, 300));
        await expectUsed(gw, db, env.acct, PER_TASK);
    });

    /* ------------------------------------------------------------------ */
    /* originTaskIds                                                       */
    /* ------------------------------------------------------------------ */

    test('originTaskIds: the caller\'s task reaches the driver as originTasks; another user\'s is refused', async () => {
        const env = await setup();
        const up1 = `up-${hex(4)}`;
        const first = assertOk(await native(env, 'POST', '/generate',
            { body: { model: env.model, up_id: up1 } }));
        const origin = first.json.vendor_id;

        const up2 = `up-${hex(4)}`;
        const r = assertOk(await native(env, 'POST', '/remix',
            { body: { model: env.model, up_id: up2, origin: [origin] } }), 'remix');
        assert.ok(!r.text.includes(up1), `the upstream id is not rendered: ${r.text}`);
        const sub = env.vendor.submits().find((q) => q.upId === up2);
        assert.ok(sub, 'the remix was submitted');
        const ot = sub.json.ctx.originTasks;
        assert.ok(Array.isArray(ot) && ot.length === 1, JSON.stringify(ot));
        assert.equal(ot[0].taskId, origin);
        assert.equal(ot[0].upstreamTaskId, up1);
        assert.equal(ot[0].action, 'generate');
        assert.equal(typeof ot[0].status, 'string');
        assert.ok('data' in ot[0], JSON.stringify(ot[0]));
        assert.equal(sub.json.ctx.action, 'remix');

        const n = env.vendor.submits().length;
        const stranger = await account(gw);
        const theirs = await native(env, 'POST', '/remix',
            { key: stranger.key, body: { model: env.model, origin: [origin] } });
        assertError(theirs, 400, { code: 'invalid_origin_task' });
        const unknownId = `task_${hex(12)}`;
        const none = await native(env, 'POST', '/remix',
            { key: stranger.key, body: { model: env.model, origin: [unknownId] } });
        assertError(none, 400, { code: 'invalid_origin_task' });
        assert.equal(bareMessage(theirs).replace(origin, '<id>'), bareMessage(none).replace(unknownId, '<id>'),
            'another user\'s task answers like a nonexistent one');
        assert.equal(env.vendor.submits().length, n, 'refused remixes sent nothing');
        await expectUsed(gw, db, stranger, 0);
    });

    /* ------------------------------------------------------------------ */
    /* files                                                               */
    /* ------------------------------------------------------------------ */

    const twoImages = () => [
        { name: 'image[]', filename: 'first.png', type: 'image/png',
          data: Buffer.concat([Buffer.from('\r\n--\0\xff'), bytes(3000)]) },
        { name: 'image[]', filename: 'second.jpg', type: 'image/jpeg', data: bytes(2048) },
    ];

    function postMultipart(env, p, fields, files) {
        const mp = multipartBody(fields, files);
        return native(env, 'POST', p, { body: mp.body, headers: { 'Content-Type': mp.contentType } });
    }

    test('multipart: repeated file fields get #index refs and reach the vendor byte-identical', async () => {
        const env = await setup();
        const files = twoImages();
        const r = assertOk(await postMultipart(env, '/edit',
            [['model', env.model], ['prompt', 'make it blue'], ['behave', 'multipart']], files), 'multipart submit');
        assert.match(r.json.vendor_id, /^task_/);

        const sub = env.vendor.submits()[0];
        assert.match(sub.headers['content-type'], /^multipart\/form-data; boundary=/);
        assert.equal(sub.headers.authorization, `Bearer ${env.channelKey}`);
        const parts = parseMultipart(sub.body, sub.headers['content-type']);
        const byName = (n) => parts.filter((p) => p.name === n);
        assert.equal(byName('prompt')[0].data.toString(), 'make it blue');

        const decoded = JSON.parse(byName('decoded')[0].data.toString());
        assert.equal(decoded.kind, 'multipart');
        assert.deepEqual(decoded.fields, { model: [env.model], prompt: ['make it blue'], behave: ['multipart'] });
        assert.deepEqual(decoded.files, [
            { ref: 'request_file:image[]', field: 'image[]', filename: 'first.png',
              mimeType: 'image/png', size: files[0].data.length },
            { ref: 'request_file:image[]#1', field: 'image[]', filename: 'second.jpg',
              mimeType: 'image/jpeg', size: files[1].data.length },
        ]);
        assert.deepEqual(JSON.parse(byName('ctx_files')[0].data.toString()), decoded.files,
            'ctx.files lists the same references');

        const images = byName('image');
        assert.equal(images.length, 2);
        assert.ok(images[0].data.equals(files[0].data), 'first file byte-identical');
        assert.ok(images[1].data.equals(files[1].data), 'second file byte-identical');
        assert.equal(images[0].filename, 'first.png');
        assert.equal(images[1].filename, 'second.jpg');
        assert.equal(images[0].type, 'image/png');
    });

    test('JSON file placeholders arrive as base64 and as a data URL', async () => {
        const env = await setup();
        const files = twoImages();
        assertOk(await postMultipart(env, '/edit',
            [['model', env.model], ['behave', 'inline'], ['up_id', `up-${hex(4)}`]], files));
        const j = env.vendor.submits()[0].json;
        assert.ok(j, 'a JSON body');
        assert.equal(j.first, files[0].data.toString('base64'));
        assert.equal(j.nested[0].second, `data:image/png;base64,${files[1].data.toString('base64')}`);
    });

    test('placeholders over maxBytes or over the total cap: invalid_descriptor, nothing sent', async () => {
        const env = await setup();
        const r1 = await postMultipart(env, '/edit', [['model', env.model], ['behave', 'oversize']], twoImages());
        assertError(r1, 500, { code: 'invalid_descriptor' });
        const big = [{ name: 'image[]', filename: 'big.png', type: 'image/png', data: bytes(TWICE_FILE) }];
        const r2 = await postMultipart(env, '/edit', [['model', env.model], ['behave', 'twice']], big);
        assertError(r2, 500, { code: 'invalid_descriptor' });
        await sleep(300);
        assert.equal(env.vendor.requests.length, 0, 'the vendor received nothing');
        await expectUsed(gw, db, env.acct, 0);
        /* the same file once is under the cap */
        assertOk(await postMultipart(env, '/edit', [['model', env.model], ['behave', 'multipart']], big));
    });

    /* ------------------------------------------------------------------ */
    /* SSE submit                                                          */
    /* ------------------------------------------------------------------ */

    test('SSE snapshot: host framing, the final state is the submit body, one submit', async () => {
        const env = await setup({ fixture: 'task-sse.js', models: 1 });
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({
            upId: up, frameDelayMs: 20,
            sse: [
                sseFrame({ comment: 'hello', event: 'accepted', id: '1', data: { id: up }, crlf: true }),
                sseFrame({ event: 'progress', id: '2', data: '{"progress":\n50}' }),
                ': a comment line alone\n\n',
                sseFrame({ data: { progress: 90 } }),
                sseFrame({ event: 'done', id: '4', data: {} }),
            ],
        });
        env.vendor.queuePoll(up, { body: { status: 'done' } });
        const r = assertOk(await submit(env, { model: env.model }), 'SSE submit');
        const s = r.json.data.stream;
        assert.ok(s, r.text);
        assert.equal(s.id, up);
        assert.equal(s.progress, 90);
        assert.deepEqual(s.events, ['accepted', 'progress', 'message', 'done']);
        assert.equal(s.ids[0], '1');
        assert.equal(s.ids[1], '2');
        assert.equal(s.ids[3], '4');
        assert.equal(s.datas[1], '{"progress":\n50}', 'data lines joined with \\n');
        await waitStatus(gw, env.acct.key, r.json.task_id, 'SUCCESS');
        assert.equal(env.vendor.submits().length, 1);
        await expectUsed(gw, db, env.acct, PER_TASK);
    });

    test('SSE delta: set, append and appendText build the submit body', async () => {
        const env = await setup({ fixture: 'task-sse-delta.js', models: 1 });
        const up = `up-${hex(4)}`;
        const ev = (changes, event) => sseFrame({ event, data: { changes } });
        env.vendor.onSubmit = () => ({
            upId: up, frameDelayMs: 10,
            sse: [
                ev([{ op: 'set', path: [], value: { id: up, text: '', items: [], meta: { a: 1 } } }]),
                ev([{ op: 'appendText', path: ['text'], value: 'Hel' },
                    { op: 'append', path: ['items'], value: { k: 1 } }]),
                ev([{ op: 'appendText', path: ['text'], value: 'lo' },
                    { op: 'set', path: ['meta', 'a'], value: 2 },
                    { op: 'set', path: ['items', 0, 'k'], value: 5 }]),
                ev([{ op: 'append', path: ['items'], value: 'last' }], 'done'),
            ],
        });
        env.vendor.queuePoll(up, { body: { status: 'done' } });
        const r = assertOk(await submit(env, { model: env.model }), 'SSE delta submit');
        assert.deepEqual(r.json.data.stream,
            { id: up, text: 'Hello', items: [{ k: 5 }, 'last'], meta: { a: 2 } });
        await waitStatus(gw, env.acct.key, r.json.task_id, 'SUCCESS');
        assert.equal(env.vendor.submits().length, 1);
    });

    test('SSE: EOF without done fails the submit (502), refunded, never retried', async () => {
        const env = await setup({ fixture: 'task-sse.js', models: 1 });
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({
            upId: up, sse: [sseFrame({ event: 'accepted', id: '1', data: { id: up } })], sseEnd: 'end',
        });
        assertErrorShape(await submit(env, { model: env.model }), 502);
        await sleep(1000);
        assert.equal(env.vendor.submits().length, 1, 'never retried');
        assert.equal(env.vendor.polls().length, 0);
        await expectUsed(gw, db, env.acct, 0);
    });

    test('SSE: a 429 or 5xx (not 504) before the vendor accepted moves to the next channel, as JSON does', async () => {
        const [v1, v2] = [await newVendor(), await newVendor()];
        const env = await taskSetup(gw, { fixture: 'task-sse.js', vendors: [v1, v2], models: 1 });
        const ids = [];
        for (const status of [429, 502, 504]) {
            /* the channels share a priority: whichever is tried first refuses */
            const order = [];
            const up = `up-${hex(4)}`;
            const refuseFirst = (v) => () => {
                order.push(v);
                return order.length === 1
                    ? { status, body: { error: { message: `vendor says ${status}` } } }
                    : { upId: up, sse: [sseFrame({ event: 'accepted', id: '1', data: { id: up } }),
                                        sseFrame({ event: 'done', id: '2', data: {} })] };
            };
            v1.onSubmit = refuseFirst(v1);
            v2.onSubmit = refuseFirst(v2);
            const r = await submit(env, { model: env.model });
            if (status === 504) {
                assertError(r, 504, { type: 'upstream_error' });
                assert.match(bareMessage(r), /vendor says 504/);
                assert.equal(order.length, 1, '504: never tried elsewhere');
                continue;
            }
            assertOk(r, `${status}, then the other channel`);
            assert.equal(order.length, 2, `${status}: tried twice`);
            assert.notEqual(order[0], order[1], `${status}: the second try went to the other channel`);
            assert.equal(r.json.data.stream.id, up, r.text);
            ids.push(r.json.task_id);
        }
        /* the refused tries cost nothing: one reserve per task */
        for (const id of ids) {
            const led = await waitLedger(db, id, ['reserve']);
            assert.equal(led.reserve, PER_TASK, JSON.stringify(led));
        }
    });

    test('SSE delta limits: 256 changes pass; 257, a bad path, a bad append or a big state fail once', async () => {
        const env = await setup({ fixture: 'task-sse-delta.js', models: 1 });
        const root = (up) => sseFrame({ data: { changes: [{ op: 'set', path: [], value: { id: up, items: [], s: 'x' } }] } });
        const appends = (n) => Array.from({ length: n }, (_, i) => ({ op: 'append', path: ['items'], value: i }));
        const done = sseFrame({ event: 'done', data: { changes: [] } });
        const cases = {
            'exactly 256 changes': [sseFrame({ data: { changes: appends(256) } })],
            '257 changes': [sseFrame({ data: { changes: appends(257) } })],
            'set under a missing parent': [sseFrame({ data: { changes: [{ op: 'set', path: ['no', 'such'], value: 1 }] } })],
            'append to a string': [sseFrame({ data: { changes: [{ op: 'append', path: ['s'], value: 1 }] } })],
            'appendText to an array': [sseFrame({ data: { changes: [{ op: 'appendText', path: ['items'], value: 'x' }] } })],
            'a state over 64 KiB': [sseFrame({ data: { changes: [], big_state: 70 * 1024 } })],
        };
        for (const [what, frames] of Object.entries(cases)) {
            const up = `up-${hex(4)}`;
            env.vendor.reset();
            env.vendor.onSubmit = () => ({ upId: up, sse: [root(up), ...frames, done] });
            const r = await submit(env, { model: env.model });
            if (what === 'exactly 256 changes') {
                assertOk(r, what);
                assert.equal(r.json.data.stream.items.length, 256);
                continue;
            }
            /* what the plugin returned broke the contract's limits */
            assertError(r, 500, { code: 'plugin_error' });
            assert.match(bareMessage(r), /^parseSubmitEventDelta returned a result the contract does not allow: /);
            await sleep(200);
            assert.equal(env.vendor.submits().length, 1, `${what}: never retried`);
        }
        await expectUsed(gw, db, env.acct, PER_TASK);
    });

    test('SSE: an event result outside the contract is 500 plugin_error saying why; nothing charged', async () => {
        const env = await setup({ fixture: 'task-sse.js', models: 1 });
        for (const [ret, why] of [[{ state: {}, done: 'yes' }, ': "done" is not a boolean'],
            ['text', ' is not an object with state, done'],
            [{ state: {} }, ' has no "done" (it needs exactly state, done)']]) {
            env.vendor.reset();
            env.vendor.onSubmit = () => ({ upId: `up-${hex(4)}`, sse: [sseFrame({ data: { ret } })] });
            const r = await submit(env, { model: env.model });
            assertError(r, 500, { code: 'plugin_error' });
            assert.equal(bareMessage(r),
                `parseSubmitEvent returned a result the contract does not allow: submit event result${why}`);
            assert.equal(env.vendor.submits().length, 1, 'never retried');
        }
        await expectUsed(gw, db, env.acct, 0);
    });

    test('SSE: an idle stream fails after the idle timeout, once', async () => {
        const env = await setup({ fixture: 'task-sse.js', models: 1 });
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({
            upId: up, sse: [sseFrame({ event: 'accepted', id: '1', data: { id: up } })], sseEnd: 'hold',
        });
        const t0 = Date.now();
        const r = await submit(env, { model: env.model });
        const took = Date.now() - t0;
        assert.ok(r.status >= 500, `${r.status} ${r.text}`);
        assertErrorShape(r);
        assert.ok(took >= SSE_IDLE_MS - 200 && took < SSE_IDLE_MS + 5000, `failed after ${took} ms`);
        await sleep(500);
        assert.equal(env.vendor.submits().length, 1, 'never retried');
        await expectUsed(gw, db, env.acct, 0);
    });

    test('SSE: events received before the connection failed still reach the plugin; a done among them makes the task', async () => {
        const env = await setup({ fixture: 'task-sse.js', models: 1 });
        const N = 20;
        /* the plugin takes 30 ms an event: the reset or the cut chunked
           body comes while most events still wait for it */
        for (const end of ['reset', 'close']) {
            const up = `up-${hex(4)}`;
            env.vendor.onSubmit = () => ({
                upId: up, sseEnd: end, sseEndDelayMs: 100,
                sse: [sseFrame({ event: 'accepted', data: { id: up, spin: 30 } }),
                    ...Array.from({ length: N }, (_, i) => sseFrame({ data: { progress: i, spin: 30 } })),
                    sseFrame({ event: 'done', data: {} })],
            });
            const r = assertOk(await submit(env, { model: env.model }), `done, then ${end}`);
            const st = r.json.data.stream;
            assert.equal(st.id, up, r.text);
            assert.deepEqual(st.events, ['accepted', ...Array(N).fill('message'), 'done'],
                'every event, in order');
            assert.equal(st.progress, N - 1);
        }
        assert.equal(env.vendor.submits().length, 2, 'never retried');
        await expectUsed(gw, db, env.acct, 2 * PER_TASK);
    });

    test('SSE: a head slower than llmgw_task_sse_idle_timeout is waited for (llmgw_task_http_timeout)', async () => {
        const env = await setup({ fixture: 'task-sse.js', models: 1 });
        const up = `up-${hex(4)}`;
        env.vendor.onSubmit = () => ({
            upId: up, delayMs: SSE_IDLE_MS + 800,
            sse: [sseFrame({ event: 'accepted', data: { id: up } }),
                sseFrame({ event: 'done', data: {} })],
        });
        const r = assertOk(await submit(env, { model: env.model }), 'a slow head');
        assert.equal(r.json.data.stream.id, up, r.text);
    });

    test('SSE: the Content-Type is text/event-stream in any case, with parameters, and nothing else', async () => {
        const env = await setup({ fixture: 'task-sse.js', models: 1 });
        for (const type of ['Text/Event-Stream; charset=utf-8', 'TEXT/EVENT-STREAM',
            'text/event-streamx', 'application/json; x=text/event-stream']) {
            const up = `up-${hex(4)}`;
            env.vendor.onSubmit = () => ({
                upId: up, headers: { 'Content-Type': type },
                sse: [sseFrame({ event: 'accepted', data: { id: up } }),
                    sseFrame({ event: 'done', data: {} })],
            });
            const r = await submit(env, { model: env.model });
            if (/^text\/event-stream$/i.test(type.split(';')[0].trim())) {
                assert.equal(assertOk(r, type).json.data.stream.id, up, r.text);
            } else {
                assertError(r, 502, { type: 'upstream_error', code: 'bad_response_status_code' });
                assert.match(bareMessage(r), /did not answer with an event stream/, type);
            }
        }
        assert.equal(env.vendor.submits().length, 4, 'never retried');
        await expectUsed(gw, db, env.acct, 2 * PER_TASK);
    });
});

describe('SSE submit timeouts: the head within llmgw_task_http_timeout, the stream within llmgw_task_sse_idle_timeout', { timeout: 120000 }, () => {
    const HTTP_MS = 1500;
    const IDLE_MS = 3000;
    const s = vendorSuite({
        http: `llmgw_task_poll_interval ${POLL_MS}ms;\n  llmgw_task_http_timeout ${HTTP_MS}ms;\n  ` +
            `llmgw_task_sse_idle_timeout ${IDLE_MS}ms;`,
    });

    test('a head later than the HTTP timeout fails; silences in the stream longer than it do not', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { fixture: 'task-sse.js', vendors: [vendor], models: 1 });
        const frames = (up) => [sseFrame({ event: 'accepted', data: { id: up } }),
            sseFrame({ event: 'done', data: {} })];

        vendor.onSubmit = () => ({ delayMs: HTTP_MS + 1000, sse: frames(`up-${hex(4)}`) });
        let t0 = Date.now();
        const late = await submitTask(gw, env, { model: env.model });
        let took = Date.now() - t0;
        assertError(late, 504, { type: 'upstream_error', code: 'do_request_failed' });
        assert.match(bareMessage(late), /timed out/);
        assert.ok(took >= HTTP_MS - 200 && took < IDLE_MS, `failed after ${took} ms`);

        const up = `up-${hex(4)}`;
        vendor.onSubmit = () => ({ upId: up, frameDelayMs: HTTP_MS + 500, sse: frames(up) });
        t0 = Date.now();
        const r = assertOk(await submitTask(gw, env, { model: env.model }), 'events slower than the HTTP timeout');
        took = Date.now() - t0;
        assert.equal(r.json.data.stream.id, up, r.text);
        assert.ok(took >= 2 * HTTP_MS, `answered after ${took} ms`);
        await expectUsed(gw, db, env.acct, PER_TASK);
    });
});

describe('task timeout: the outer deadline fails and refunds', { timeout: 120000 }, () => {
    const TIMEOUT_S = 3;
    /* one worker: the one that read a key's record is the one asked again */
    const s = vendorSuite({
        workers: 1,
        http: `llmgw_task_poll_interval ${POLL_MS}ms;\n  llmgw_task_poll_max_failures 3;\n  ` +
            `llmgw_task_timeout ${TIMEOUT_S}s;`,
    });

    test('a task still IN_PROGRESS after llmgw_task_timeout is FAILURE and refunded', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor] });
        const t0 = Date.now();
        const r = assertOk(await submitTask(gw, env, { model: env.model }));
        const id = r.json.task_id;
        await waitFor(async () => vendor.polls().length >= 2, 3000, { what: 'polled' });
        const seen = await waitTask2(gw, env.acct.key, id, t0);
        assert.ok(seen.at >= TIMEOUT_S * 1000 - 500, `FAILURE after ${seen.at} ms, before the timeout`);
        assert.ok(seen.at < TIMEOUT_S * 1000 + 6000, `FAILURE only after ${seen.at} ms`);
        assert.ok(seen.view.fail_reason, JSON.stringify(seen.view));
        await waitLedger(db, id, ['reserve', 'refund']);
        await expectUsed(gw, db, env.acct, 0);
        const n = vendor.polls().length;
        await sleep(4 * POLL_MS);
        assert.equal(vendor.polls().length, n, 'no poll after the timeout');
    });
    test('a refund at the deadline is known at once: the key whose quota the task held is served right after', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor] });
        const user = await makeUser(gw, { quota: 100000000 });
        /* exactly one task's price (0.01 USD) */
        const tok = await makeKey(gw, user.id, { unlimited_quota: false, remain_quota: PER_TASK });
        const r = assertOk(await submitTask(gw, env, { model: env.model }, { key: tok.key }));
        /* spent: refused as a key without quota */
        assertError(await submitTask(gw, env, { model: env.model }, { key: tok.key }), 401);
        /* the key's record read again after the charge (a change of the
           key drops it): it says no quota left, and is kept for
           llmgw_key_cache_ttl (10 s) */
        assertOk(await gw.admin('PATCH', `/api/token/${tok.id}`, { name: 'read-again' }));
        await sleep(300);
        assertError(await submitTask(gw, env, { model: env.model }, { key: tok.key }), 401);
        /* the claim that finds the task past its deadline refunds it, and
           the worker learns the balance from the claim's answer (without
           its revision the refund was not learned: the key stayed refused) */
        await waitLedger(db, r.json.task_id, ['reserve', 'refund'], { ms: TIMEOUT_S * 1000 + 5000 });
        /* the claim's answer reaches the worker a moment after its commit;
           without the revisions, or with the record's word taken over the
           zone's, the key is refused until its record is read again */
        let again;
        for (const end = Date.now() + 1500; Date.now() < end; await sleep(100)) {
            again = await submitTask(gw, env, { model: env.model }, { key: tok.key });
            if (again.status === 200) {
                break;
            }
        }
        assertOk(again, 'served after the refund');
    });
});

describe('a task create that outlives llmgw_pg_timeout', { timeout: 120000 }, () => {
    const s = vendorSuite({ workers: 1, http: `${HTTP}\n  llmgw_pg_timeout 2s;` });

    test('commits late: the submit still answers the task, charged once', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor], models: 1 });
        /* a task insert commits 2.5 s after its row is in: past the 2 s
           statement deadline (a repeat waits for it, then finds the row) */
        await psql(db.conninfo, `
            CREATE FUNCTION slow_create_t() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(2.5); RETURN NEW; END $$;
            CREATE TRIGGER slow_create_t AFTER INSERT ON tasks
                FOR EACH ROW EXECUTE FUNCTION slow_create_t();`);
        let r;
        try {
            r = await submitTask(gw, env, { model: env.model });
        } finally {
            await psql(db.conninfo, 'DROP TRIGGER slow_create_t ON tasks');
        }
        assertOk(r, 'the submit');
        const id = r.json.task_id;
        const rows = await psql(db.conninfo,
            `select count(*) from tasks where task_id = '${id}'`);
        assert.equal(Number(rows), 1);
        const led = await waitLedger(db, id, ['reserve']);
        assert.equal(led.reserve, PER_TASK);
        assert.equal(vendor.submits().length, 1, 'one task at the vendor');
        await expectUsed(gw, db, env.acct, PER_TASK);
    });
});

describe('a task the vendor took while the database cannot be reached', { timeout: 120000 }, () => {
    const s = vendorSuite({ workers: 1, http: `${HTTP}\n  llmgw_pg_timeout 2s;` });

    test('is saved once the database is back: the submit answers it, charged once', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor], models: 1 });
        vendor.onSubmit = async () => {
            await sleep(1000);
            return undefined;
        };
        const admin = conninfoFor('postgres');
        const submitted = submitTask(gw, env, { model: env.model });
        try {
            await waitFor(() => vendor.submits().length >= 1, 5000,
                { what: 'the submit at the vendor' });
            await psql(admin, `ALTER DATABASE ${db.name} ALLOW_CONNECTIONS false`);
            await psql(admin, 'select pg_terminate_backend(pid) from pg_stat_activity ' +
                `where datname = '${db.name}'`);
            /* longer than two tries of the create (2 s each) */
            await sleep(6000);
        } finally {
            await psql(admin, `ALTER DATABASE ${db.name} ALLOW_CONNECTIONS true`);
        }
        const r = assertOk(await submitted, 'the submit');
        const id = r.json.task_id;
        assert.equal(Number(await psql(db.conninfo,
            `select count(*) from tasks where task_id = '${id}'`)), 1);
        const led = await waitLedger(db, id, ['reserve']);
        assert.equal(led.reserve, PER_TASK);
        assert.equal(vendor.submits().length, 1, 'one task at the vendor');
    });
});

describe('plugins share the plugin runtime', { timeout: 120000 }, () => {
    let db, gw, vendor;

    before(async () => {
        db = await createDb();
        vendor = await startVendor();
        /* one nginx worker: every call goes through its connections */
        gw = await startGateway({ db, workers: 1, v8host: { workers: 2, deadlineMs: 2000 },
                                  http: `${HTTP}\n  llmgw_v8host_timeout 4s;` });
    });

    after(() => tearDown(db, [gw], [vendor]));

    test('a plugin whose hooks run into the deadline does not hold up another plugin', async () => {
        const bad = await taskSetup(gw, { vendors: [vendor] });
        const good = await taskSetup(gw, { vendors: [vendor] });
        const timed = async (env, body) => {
            const t0 = Date.now();
            const r = await submitTask(gw, env, { model: env.model, ...body });
            return { r, ms: Date.now() - t0 };
        };
        assertOk((await timed(good, {})).r, 'a submit before');

        /* more looping submits than the connections the worker keeps idle */
        const loops = Array.from({ length: 20 }, () => timed(bad, { behave: 'loop' }));
        await sleep(300);
        for (let i = 0; i < 5; i++) {
            const { r, ms } = await timed(good, { up_id: `good-${i}` });
            assertOk(r, `good submit ${i}`);
            /* behind a looping call it would wait for the 2 s deadline */
            assert.ok(ms < 1900, `good submit ${i} took ${ms} ms`);
        }

        /* the looping plugin's own submits: stopped at the deadline, or,
           waiting behind each other, past llmgw_v8host_timeout */
        const codes = (await Promise.all(loops)).map(({ r }) => `${r.status} ${r.json?.error?.code}`);
        assert.ok(codes.includes('500 plugin_error'), codes.join(', '));
        for (const c of codes) {
            assert.ok(c === '500 plugin_error' || c === '502 plugin_unavailable', c);
        }
    });
});

/* Watches a task until FAILURE: -> {view, at: ms after t0}; it must not
   be SUCCESS on the way. */
async function waitTask2(gw, key, id, t0, ms = 15000) {
    const end = Date.now() + ms;
    for (;;) {
        const r = await getTask(gw, key, id);
        assert.equal(r.status, 200, r.text);
        assert.notEqual(r.json.status, 'SUCCESS', r.text);
        if (r.json.status === 'FAILURE') {
            return { view: r.json, at: Date.now() - t0 };
        }
        assert.ok(Date.now() < end, `task ${id} not FAILURE within ${ms} ms: ${r.text}`);
        await sleep(100);
    }
}
