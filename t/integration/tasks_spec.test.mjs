// Task plugin rules of the specification (gateway-spec.md, its contract
// facts, README "Tasks", docs/plugin-api/v1.d.ts) that the other task tests
// do not pin, end to end through the real nginx, PostgreSQL and the plugin
// runtime helper, against the mock vendor of t/lib/vendor.mjs:
//   - originTaskIds on two channels, on a disabled channel, of another
//     plugin; a query route asked for another plugin's task;
//   - how a poll result is stored: extra members merged into data, `data`
//     replacing it;
//   - the arguments of parseSubmitResponse and parseTaskResult; the
//     DriverContext's requestHeaders and auth;
//   - native.error for model_not_found and a throwing decoder, and for the
//     gateway's refusals before the route runs (401, 403, 429, 405);
//   - SSE submit: event ids, the per-event cap, a JSON answer;
//   - a legacy channel type claimed twice; meta.baseUrl and allowedHosts;
//   - the per-file cap of an upload; two plugins on equal route shapes.
//
// The plugin is written below (specSource) and installed under keys of each
// test's own; the file has its own database and gateway.

import assert from 'node:assert/strict';
import { after, afterEach, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, hex, makeKey, makeUserKey, settle, sleep, startGateway,
    stopAll,
} from '../lib/harness.mjs';
import {
    account, assertErrorShape, expectUsed, getTask, multipartBody, sseFrame, startVendor,
    uploadPlugin, waitTask,
} from '../lib/vendor.mjs';

const POLL_MS = 200;
const MAX_FILE = 2048;
const HTTP = `llmgw_task_poll_interval ${POLL_MS}ms;\n  llmgw_task_poll_max_failures 3;\n  ` +
    `llmgw_task_max_file_size ${MAX_FILE / 1024}k;`;

/* ------------------------------------------------------------------ */
/* the plugin                                                          */
/* ------------------------------------------------------------------ */

/*
 * A per_task plugin that says what the host gave it:
 *   submit  POST <baseUrl or input.target>/submit
 *           {up_id, input, ctx: {requestHeaders, auth, originTasks}}
 *           (input.sse: responseType "sse")
 *   submit answer {id, data?, echo?}: taskData is data, or with echo the
 *           statusCode and headers parseSubmitResponse got
 *   SSE     each event's id collected: the final state {id, data: {ids}}
 *   poll    {r: <result returned as is>} or {echo: true}: SUCCESS with
 *           data {http: <the third argument>}; else IN_PROGRESS
 * Routes: POST <prefix>/gen (submit; the body's `origin` are originTaskIds,
 * `throw` makes the decoder throw) and GET <prefix>/tasks/:task_id.
 */
function specSource({ key, models, prefix = null, errorRenderer = false, baseUrl = null,
    channelTypes = null, sortPriority = 0 }) {
    assert.ok(key.length <= 30, key);
    const extra = [
        baseUrl ? `baseUrl: ${JSON.stringify(baseUrl)},` : '',
        channelTypes ? `channelTypes: ${JSON.stringify(channelTypes)},` : '',
    ].join('\n  ');
    return `
const KEY = ${JSON.stringify(key)};
const P = ${prefix ? JSON.stringify(prefix) : "'/' + KEY + '/v1'"};

export const meta = {
  apiVersion: 1,
  key: KEY,
  name: 'Spec rules test vendor',
  version: '1.0.0',
  author: { name: 'llmgw tests' },
  description: 'Says what the host gave its hooks',
  models: ${JSON.stringify(models)},
  fetchMode: 'per_task',
  auth: 'api_key',
  sortPriority: ${sortPriority},
  submitResponseTypes: ['json', 'sse'],
  ${extra}
  routes: [
    { method: 'POST', path: P + '/gen', type: 'submit', decode: 'decodeGen', render: 'renderTask' },
    { method: 'GET', path: P + '/tasks/:task_id', type: 'query', render: 'renderTask' },
  ],
};

function input(ctx) {
  const b = ctx.requestBody;
  return b && typeof b === 'object' && !Array.isArray(b) ? b : {};
}

export function buildSubmitRequest(ctx) {
  const inp = input(ctx);
  const d = {
    url: (inp.target || ctx.baseUrl) + '/submit',
    method: 'POST',
    headers: { Authorization: ctx.authHeader, 'Content-Type': 'application/json',
               'X-Public-Task-Id': ctx.publicTaskId },
    body: { up_id: inp.up_id === undefined ? null : inp.up_id, input: inp,
            ctx: { requestHeaders: ctx.requestHeaders, auth: ctx.auth,
                   originTasks: ctx.originTasks === undefined ? '<undefined>' : ctx.originTasks } },
  };
  if (inp.sse) d.responseType = 'sse';
  return d;
}

export function parseSubmitResponse(ctx, res) {
  const b = res.body;
  if (!b || typeof b.id !== 'string') throw new Error('the vendor answered without a task id');
  if (b.echo) return { taskId: b.id, taskData: { statusCode: res.statusCode, headers: res.headers } };
  return { taskId: b.id, taskData: b.data === undefined ? { submitted: true } : b.data };
}

export function parseSubmitEvent(ctx, ev, prev) {
  const p = prev || { data: { ids: [] } };
  let d = {};
  try { d = JSON.parse(ev.data); } catch (e) { d = {}; }
  const state = { id: typeof d.id === 'string' ? d.id : p.id, data: { ids: p.data.ids.concat([ev.id]) } };
  return { state, done: ev.event === 'done' };
}

export function parseTaskResult(ctx, body, http) {
  if (body && body.echo) return { status: 'SUCCESS', data: { http } };
  if (body && body.r) return body.r;
  return { status: 'IN_PROGRESS' };
}

export function buildQueryRequest(ctx) {
  return { url: ctx.baseUrl + '/tasks/' + encodeURIComponent(ctx.taskId), method: 'GET',
           headers: { Authorization: ctx.authHeader } };
}

function jsonBody(req) {
  return req.body && req.body.kind === 'json' && req.body.value &&
    typeof req.body.value === 'object' ? req.body.value : {};
}

export const native = {
  decodeGen(req) {
    const v = jsonBody(req);
    if (v.throw) throw new Error(String(v.throw));
    const intent = { kind: 'submit', model: v.model, action: 'generate', requestBody: v };
    if (v.origin) intent.originTaskIds = v.origin;
    return intent;
  },
  renderTask(req, task) {
    return { plugin: KEY, task_id: task.task_id, status: task.status,
             data: task.data === undefined ? null : task.data };
  },
};
${errorRenderer === 'throw' ? `
native.error = function (req, e) {
  throw new Error('the error renderer failed too');
};` : errorRenderer ? `
native.error = function (req, e) {
  return { vendor_error: { code: e.code, message: e.message, status: e.httpStatus,
                           retryable: e.retryable, path: req.path, method: req.method,
                           params: req.params, query: req.query, body: req.body.kind } };
};` : ''}
`;
}

/* ------------------------------------------------------------------ */
/* the tests                                                           */
/* ------------------------------------------------------------------ */

describe('task plugin rules of the specification', { timeout: 180000 }, () => {
    let db, gw;
    const vendors = [];
    let counter = 0;

    async function newVendor() {
        const v = await startVendor();
        vendors.push(v);
        return v;
    }

    /*
     * Installs a variant of the plugin (own key and models, each priced at
     * 0.01 USD a task), a type-61 channel on each vendor (channels[i] may
     * add fields such as priority), and an account; waits for propagation.
     */
    async function setup({ vendors: vs, channels: chOpts = [], models: nModels = 2,
        wait = true, ...plugin } = {}) {
        const t0 = Date.now();
        counter++;
        const key = plugin.key || `ts${counter}-${hex(4)}`;
        const models = Array.from({ length: nModels }, (_, i) => `${key}-m${i}`);
        await uploadPlugin(gw, specSource({ key, models, ...plugin }));
        assertOk(await gw.admin('PUT', '/api/pricing',
            Object.fromEntries(models.map((m) => [m, { price: 0.01 }]))), 'PUT /api/pricing');
        const channelKey = `vk-${hex(12)}`;
        const channels = [];
        for (const [i, v] of (vs || []).entries()) {
            const r = await gw.admin('POST', '/api/channel', {
                name: `${key}-ch${i}`, type: 61, base_url: v.url, key: channelKey,
                models, groups: ['default'], settings: { task_plugin_key: key }, ...(chOpts[i] || {}),
            });
            assert.equal(r.status, 200, `POST /api/channel: ${r.status} ${r.text}`);
            channels.push(r.json);
        }
        const acct = await account(gw);
        if (wait) {
            await settle(t0);
        }
        return { key, models, model: models[0], channels, channelKey, acct, vendor: vs && vs[0] };
    }

    const native = (env, method, p, { key = env.acct.key, body, headers } = {}) =>
        gw.req(method, `/${env.key}/v1${p}`, { key, body, headers, timeoutMs: 30000 });
    const gen = (env, body, opts = {}) => native(env, 'POST', '/gen', { body, ...opts });
    const submit = (env, body, { key = env.acct.key, headers } = {}) =>
        gw.req('POST', `/v1/tasks/${env.key}`, { key, body, headers, timeoutMs: 30000 });

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true, http: HTTP });
    });

    /* a retired vendor answers 404: its tasks end at their next poll */
    afterEach(() => {
        vendors.forEach((v) => v.retire());
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all(vendors.map((v) => v.close()));
            await dropDb(db);
        }
    });

    /* ------------------------------------------------------------------ */
    /* originTaskIds and query routes                                      */
    /* ------------------------------------------------------------------ */

    /*
     * README, Submit: "originTaskIds (each must be the caller's task of
     * this plugin, all on one enabled channel, which is then used: else 400
     * invalid_origin_task)"; errors table: "they are on different or
     * disabled channels".
     */
    test('origin tasks on two different channels: 400 invalid_origin_task, nothing sent', async () => {
        const va = await newVendor();
        const vb = await newVendor();
        /* channel a first (priority), channel b when a is busy */
        const env = await setup({ vendors: [va, vb], channels: [{ priority: 10 }, { priority: 0 }] });
        const onA = assertOk(await gen(env, { model: env.model, up_id: 'on-a' }), 'task on a').json.task_id;
        va.onSubmit = () => ({ status: 503, body: { error: { message: 'busy' } } });
        const onB = assertOk(await gen(env, { model: env.model, up_id: 'on-b' }), 'task on b').json.task_id;
        va.onSubmit = null;
        assert.equal(vb.upstreamIdOf(onB), 'on-b', 'the second task landed on channel b');
        assert.equal(va.upstreamIdOf(onA), 'on-a', 'the first task landed on channel a');

        const na = va.submits().length;
        const nb = vb.submits().length;
        assertError(await gen(env, { model: env.model, origin: [onA, onB] }), 400,
            { code: 'invalid_origin_task' });
        await sleep(200);
        assert.equal(va.submits().length, na, 'nothing sent to channel a');
        assert.equal(vb.submits().length, nb, 'nothing sent to channel b');

        /* one origin task: its channel is used, even the lower-priority one */
        assertOk(await gen(env, { model: env.model, up_id: 'from-b', origin: [onB] }), 'origin on b');
        const sub = vb.submits().find((q) => q.upId === 'from-b');
        assert.ok(sub, 'the submit with an origin on b went to channel b');
        assert.deepEqual(sub.json.ctx.originTasks.map((o) => [o.taskId, o.upstreamTaskId]), [[onB, 'on-b']]);
        assert.equal(va.submits().length, na, 'channel a was not tried');
    });

    /* README errors table: invalid_origin_task when "they are on ... disabled channels". */
    test('an origin task on a disabled channel: 400 invalid_origin_task, nothing sent to any vendor', async () => {
        const va = await newVendor();
        const vb = await newVendor();
        const env = await setup({ vendors: [va, vb], channels: [{ priority: 10 }, { priority: 0 }] });
        const onA = assertOk(await gen(env, { model: env.model, up_id: 'on-a' }), 'task on a').json.task_id;
        assert.equal(va.upstreamIdOf(onA), 'on-a');

        const t0 = Date.now();
        assertOk(await gw.admin('PATCH', `/api/channel/${env.channels[0].id}`, { status: 'disabled' }),
            'disable channel a');
        await settle(t0);
        const na = va.submits().length;
        const nb = vb.submits().length;
        assertError(await gen(env, { model: env.model, origin: [onA] }), 400, { code: 'invalid_origin_task' });
        await sleep(200);
        assert.equal(va.submits().length, na, 'nothing sent to the disabled channel');
        assert.equal(vb.submits().length, nb, 'nor to the enabled one');
        /* without the origin the enabled channel serves */
        assertOk(await gen(env, { model: env.model, up_id: 'plain' }), 'no origin');
        assert.equal(vb.submits().length, nb + 1);
        await expectUsed(gw, db, env.acct, 2 * 5000);
    });

    /* an origin's channel is used only while it would be chosen anyway:
       serving the model to the key's group */
    test('an origin task whose channel left the key\'s group or the model: 400 invalid_origin_task, nothing sent', async () => {
        const va = await newVendor();
        const env = await setup({ vendors: [va] });
        const onA = assertOk(await gen(env, { model: env.model, up_id: 'on-a' }), 'task on a').json.task_id;
        const ch = `/api/channel/${env.channels[0].id}`;
        const patch = async (body) => {
            const t0 = Date.now();
            assertOk(await gw.admin('PATCH', ch, body), `PATCH ${JSON.stringify(body)}`);
            await settle(t0);
        };

        await patch({ groups: ['vip-only'] });
        const n = va.submits().length;
        assertError(await gen(env, { model: env.model, origin: [onA] }), 400,
            { code: 'invalid_origin_task', message: /does not serve model .* in group default/ });
        assertError(await gen(env, { model: env.model }), 503, { code: 'model_not_found' });

        await patch({ groups: ['default'], models: [`${env.model}-other`] });
        assertError(await gen(env, { model: env.model, origin: [onA] }), 400,
            { code: 'invalid_origin_task' });
        await sleep(200);
        assert.equal(va.submits().length, n, 'nothing sent');

        await patch({ models: [env.model] });
        assertOk(await gen(env, { model: env.model, up_id: 'again', origin: [onA] }), 'served again');
        assert.equal(va.submits().length, n + 1);
    });

    /*
     * README, Submit: each originTaskIds entry "must be the caller's task
     * of this plugin"; a query route reads "the task named by the path
     * parameter", 404 task_not_found when there is "no such task" (here:
     * none of this plugin).
     */
    test('another plugin\'s task of the same user: invalid_origin_task; its query route answers 404', async () => {
        const va = await newVendor();
        const vb = await newVendor();
        const a = await setup({ vendors: [va], wait: false });
        const b = await setup({ vendors: [vb] });
        const theirs = assertOk(await gen(b, { model: b.model }, { key: a.acct.key }),
            'plugin b task of the same user').json.task_id;
        assert.equal(vb.submits().length, 1);

        assertError(await gen(a, { model: a.model, origin: [theirs] }), 400, { code: 'invalid_origin_task' });
        assertError(await submit(a, { model: a.model, originTaskIds: [theirs] }), 400,
            { code: 'invalid_origin_task' });
        await sleep(200);
        assert.equal(va.submits().length, 0, 'nothing sent for plugin a');
        assert.equal(vb.submits().length, 1, 'nothing more sent for plugin b');

        assertError(await native(a, 'GET', `/tasks/${theirs}`), 404, { code: 'task_not_found' });
        /* the owner plugin's route and the generic view show it */
        const own = assertOk(await native(b, 'GET', `/tasks/${theirs}`, { key: a.acct.key }), 'b query route');
        assert.equal(own.json.plugin, b.key);
        assert.equal(own.json.task_id, theirs);
        assertOk(await getTask(gw, a.acct.key, theirs), 'GET /v1/tasks/{id}');
    });

    /* ------------------------------------------------------------------ */
    /* poll results                                                        */
    /* ------------------------------------------------------------------ */

    /*
     * v1.d.ts TaskResult: "data, when present, replaces the task's data,
     * otherwise the result's other members (url, ...) are merged into it".
     */
    test('a poll result: other members merged into data; data, when present, replaces it', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v] });
        v.onSubmit = (rec) => ({ body: { id: rec.json.up_id, data: { submitted: 1, keep: 'me' } } });
        const merged = assertOk(await submit(env, { model: env.model, up_id: 'up-merge' })).json.task_id;
        const replaced = assertOk(await submit(env, { model: env.model, up_id: 'up-replace' })).json.task_id;
        v.queuePoll('up-merge', { body: { r: { status: 'SUCCESS', url: 'https://cdn.example/m.png', size: 3 } } });
        v.queuePoll('up-replace', { body: { r: { status: 'SUCCESS', url: 'https://cdn.example/r.png',
            data: { only: 'this' } } } });

        const m = await waitTask(gw, env.acct.key, merged, (t) => t.status === 'SUCCESS');
        assert.deepEqual(m.data, { submitted: 1, keep: 'me', url: 'https://cdn.example/m.png', size: 3 });
        const r = await waitTask(gw, env.acct.key, replaced, (t) => t.status === 'SUCCESS');
        assert.deepEqual(r.data, { only: 'this' });
    });

    /* ------------------------------------------------------------------ */
    /* what hooks are given                                                */
    /* ------------------------------------------------------------------ */

    /*
     * Contract facts, hook signatures: parseSubmitResponse(ctx,
     * {statusCode, headers: {name: [values]}, body}); parseTaskResult(ctx,
     * body, {status, headers}).
     */
    test('parseSubmitResponse gets statusCode and headers as {name: [values]}; parseTaskResult {status, headers}', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v] });
        v.onSubmit = () => ({ status: 201, body: { id: 'up-echo', echo: true },
            headers: { 'X-Vendor-Trace': 'abc-1' } });
        v.queuePoll('up-echo', { status: 200, body: { echo: true }, headers: { 'X-Poll-Trace': 'p-2' } });
        const r = assertOk(await submit(env, { model: env.model }));
        const sd = r.json.data;
        assert.equal(sd.statusCode, 201, r.text);
        assert.ok(sd.headers && typeof sd.headers === 'object' && !Array.isArray(sd.headers), r.text);
        for (const [name, values] of Object.entries(sd.headers)) {
            assert.ok(Array.isArray(values) && values.every((x) => typeof x === 'string'),
                `header ${name}: ${JSON.stringify(values)}`);
        }
        assert.deepEqual(sd.headers['x-vendor-trace'], ['abc-1'], r.text);
        assert.deepEqual(sd.headers['content-type'], ['application/json'], r.text);

        const done = await waitTask(gw, env.acct.key, r.json.task_id, (t) => t.status === 'SUCCESS');
        const http = done.data.http;
        assert.deepEqual(Object.keys(http).sort(), ['headers', 'status'], JSON.stringify(done.data));
        assert.equal(http.status, 200);
        assert.deepEqual(http.headers['x-poll-trace'], ['p-2'], JSON.stringify(http));
        assert.deepEqual(http.headers['content-type'], ['application/json']);
    });

    /*
     * Spec, DriverContext: "request headers ... authentication information";
     * contract facts: "DriverContext also carries auth (the channel's auth
     * info) and apiKey/authHeader"; v1.d.ts ChannelAuth {authHeader, apiKey}.
     * The client's own credentials are not among the request headers.
     */
    test('DriverContext: requestHeaders without the client\'s Authorization, x-api-key and Cookie; auth', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v] });
        const r = assertOk(await submit(env, { model: env.model, up_id: 'up-hdr' }, {
            headers: { 'X-Custom': 'custom-1', 'x-api-key': 'sk-client-secret', Cookie: 'session=c00kie' },
        }));
        const sub = v.submits().find((q) => q.upId === 'up-hdr');
        assert.ok(sub, 'submitted');
        const { requestHeaders: h, auth } = sub.json.ctx;
        const names = Object.keys(h).map((n) => n.toLowerCase());
        for (const gone of ['authorization', 'x-api-key', 'cookie']) {
            assert.ok(!names.includes(gone), `${gone} is not given: ${JSON.stringify(h)}`);
        }
        const text = JSON.stringify(h);
        for (const secret of [env.acct.key, 'sk-client-secret', 'c00kie']) {
            assert.ok(!text.includes(secret), `${secret} not in ${text}`);
        }
        assert.equal(h['x-custom'], 'custom-1', text);
        assert.equal(h['content-type'], 'application/json', text);
        assert.equal(typeof h.host, 'string', text);
        assert.equal(auth.apiKey, env.channelKey, JSON.stringify(auth));
        assert.equal(auth.authHeader, `Bearer ${env.channelKey}`, JSON.stringify(auth));
        assert.match(r.json.task_id, /^task_/);
    });

    /* ------------------------------------------------------------------ */
    /* native.error                                                        */
    /* ------------------------------------------------------------------ */

    /* r is the envelope the plugin's native.error made for status and
       code, on the route and with the context of opts */
    function shaped(env, r, status, code, { method = 'POST', p = '/gen', params = {}, query, body } = {}) {
        assert.equal(r.status, status, r.text);
        const e = r.json && r.json.vendor_error;
        assert.ok(e, `shaped by native.error: ${r.text}`);
        assert.equal(r.json.error, undefined, r.text);
        assert.equal(e.code, code, r.text);
        assert.equal(e.status, status, r.text);
        assert.equal(e.retryable, status === 429 || status >= 500, r.text);
        assert.equal(typeof e.message, 'string', r.text);
        assert.equal(e.method, method, r.text);
        assert.equal(e.path, `/${env.key}/v1${p}`, r.text);
        assert.deepEqual(e.params, params, r.text);
        assert.deepEqual(e.query, query, r.text);
        assert.equal(e.body, body, r.text);
        assert.match(r.headers['x-request-id'] || '', /\S/, 'the request id header stays');
        return e;
    }

    /*
     * README, client API: "native.error, when exported, shapes that
     * plugin's errors"; contract facts: native.error(decode ctx, {code,
     * message, httpStatus, retryable}); 503 model_not_found; 500
     * plugin_error when "a hook threw (its message ...)".
     */
    test('native.error shapes model_not_found (503) and a throwing decoder\'s plugin_error (500)', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v], errorRenderer: true });
        const opts = { query: {}, body: 'json' };
        shaped(env, await gen(env, { model: `unknown-${hex(4)}` }), 503, 'model_not_found', opts);
        const e = shaped(env, await gen(env, { model: env.model, throw: 'decoder says no' }), 500,
            'plugin_error', opts);
        assert.match(e.message, /decoder says no/);
        await sleep(200);
        assert.equal(v.requests.length, 0, 'nothing reached the vendor');
        await expectUsed(gw, db, env.acct, 0);
    });

    /*
     * README, client API: native.error shapes the plugin's errors on its
     * routes, also the gateway's own refusals before the route runs: the
     * key (401), its address, group and model (403), the rate limit (429,
     * its Retry-After kept) and the method (405, its Allow kept).  The
     * hook gets the route's context (method, path, params, query, no body)
     * and never the key.
     */
    test('native.error shapes 401, 403, 429 and 405 on the plugin\'s routes, headers kept', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v], errorRenderer: true, wait: false });
        const group = `nelim-${hex(3)}`;
        const t0 = Date.now();
        assertOk(await gw.admin('PUT', '/api/group', { [group]: 1 }), 'PUT /api/group');
        assertOk(await gw.admin('PUT', '/api/rate_limit',
            { groups: { [group]: { duration_minutes: 1, total: 1, success: 0 } } }), 'PUT /api/rate_limit');
        await settle(t0);

        const refused = (r, status, code, opts = {}) =>
            shaped(env, r, status, code, { query: { q: ['1'] }, body: 'none', ...opts });

        /* 401: no key, a wrong key (which the hook never sees) */
        refused(await native(env, 'POST', '/gen?q=1', { key: null, body: { model: env.model } }),
            401, 'invalid_token');
        const wrong = `sk-${hex(24)}`;
        const r401 = await native(env, 'GET', '/tasks/task_x1?q=1', { key: wrong });
        refused(r401, 401, 'invalid_token', { method: 'GET', p: '/tasks/task_x1',
            params: { task_id: 'task_x1' } });
        assert.ok(!r401.text.includes(wrong), r401.text);

        /* 403: an address outside the key's list, the key's group, its models */
        const ipKey = (await makeKey(gw, env.acct.user.id, { allow_ips: ['203.0.113.0/24'] })).key;
        refused(await native(env, 'POST', '/gen?q=1', { key: ipKey, body: { model: env.model } }),
            403, 'access_denied');
        const noGroup = (await makeUserKey(gw, { group: `gone-${hex(3)}` })).key;
        refused(await native(env, 'POST', '/gen?q=1', { key: noGroup, body: { model: env.model } }),
            403, 'group_unavailable');
        const modelKey = (await makeKey(gw, env.acct.user.id,
            { models: [env.models[1]] })).key;
        /* (after the decoder, which read the body) */
        refused(await native(env, 'POST', '/gen?q=1', { key: modelKey, body: { model: env.model } }),
            403, 'model_not_allowed', { body: 'json' });

        /* 429, with its Retry-After */
        const limited = (await makeUserKey(gw, { group })).key;
        await native(env, 'POST', '/gen?q=1', { key: limited, body: { model: env.model } });
        const r429 = await native(env, 'POST', '/gen?q=1', { key: limited, body: { model: env.model } });
        refused(r429, 429, 'rate_limit_exceeded');
        assert.match(r429.headers['retry-after'] || '', /^[1-9][0-9]*$/, 'Retry-After kept');

        /* 405, with its Allow */
        const r405 = await native(env, 'DELETE', '/gen?q=1');
        refused(r405, 405, 'method_not_allowed', { method: 'DELETE' });
        assert.equal(r405.headers.allow, 'POST');

        await sleep(200);
        assert.equal(v.requests.length, 0, 'nothing reached the vendor');
    });

    /* A native.error that throws leaves the standard contract, headers and all. */
    test('a native.error that throws: the gateway\'s refusals in the error contract', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v], errorRenderer: 'throw' });
        assertError(await native(env, 'POST', '/gen', { key: `sk-${hex(24)}`, body: { model: env.model } }),
            401, { code: 'invalid_token' });
        const ipKey = (await makeKey(gw, env.acct.user.id, { allow_ips: ['203.0.113.0/24'] })).key;
        assertError(await native(env, 'POST', '/gen', { key: ipKey, body: { model: env.model } }),
            403, { code: 'access_denied' });
        const r405 = await native(env, 'PUT', '/gen');
        assertError(r405, 405, { code: 'method_not_allowed' });
        assert.equal(r405.headers.allow, 'POST');
        assertError(await gen(env, { model: `unknown-${hex(4)}` }), 503, { code: 'model_not_found' });
    });

    /* ------------------------------------------------------------------ */
    /* SSE submits                                                         */
    /* ------------------------------------------------------------------ */

    /*
     * Contract facts, SSE submit: "Framing owned by the host ... event ids
     * kept" (the event stream's last event id: an event without an id line
     * keeps it, an empty id line resets it).
     */
    test('SSE: an event without an id line keeps the last id; an empty id line resets it', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v], models: 1 });
        v.onSubmit = () => ({
            upId: 'up-ids',
            sse: [
                sseFrame({ event: 'accepted', id: '7', data: { id: 'up-ids' } }),
                sseFrame({ data: { x: 1 } }),
                'id:\ndata: {"y":2}\n\n',
                sseFrame({ data: { z: 3 } }),
                sseFrame({ event: 'done', id: '9', data: {} }),
            ],
        });
        const r = assertOk(await submit(env, { model: env.model, sse: true }), 'SSE submit');
        assert.deepEqual(r.json.data, { ids: ['7', '7', '', '', '9'] }, r.text);
        assert.equal(v.submits().length, 1);
    });

    /*
     * README, SSE submits: "Limits: 1 MiB per event ... whose event breaks
     * a limit fails the submit with 502 ... nothing is charged, and the
     * submit is never sent twice"; errors table: 502
     * bad_response_status_code, "an SSE submit failed after it was accepted".
     */
    test('SSE: one event over 1 MiB fails the submit with 502, once, uncharged', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v], models: 1 });
        v.onSubmit = () => ({
            upId: 'up-big',
            sse: [sseFrame({ data: { id: 'up-big', pad: 'y'.repeat(1024 * 1024 + 16) } }),
                sseFrame({ event: 'done', data: {} })],
        });
        assertErrorShape(await submit(env, { model: env.model, sse: true }), 502,
            { code: 'bad_response_status_code', message: /larger than 1 MiB/ });
        await sleep(300);
        assert.equal(v.submits().length, 1, 'never sent twice');
        assert.equal(v.polls().length, 0);
        await expectUsed(gw, db, env.acct, 0);
    });

    /*
     * README, SSE submits: the gateway "reads the vendor's event stream";
     * a 2xx that is no event stream fails the submit (502), uncharged.
     */
    test('SSE: a JSON 2xx answer to an SSE descriptor is 502 "did not answer with an event stream"', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v], models: 1 });
        v.onSubmit = () => ({ body: { id: 'up-json' } });
        const r = await submit(env, { model: env.model, sse: true });
        assertErrorShape(r, 502, { message: /did not answer with an event stream/ });
        await sleep(300);
        assert.equal(v.submits().length, 1, 'never sent twice');
        await expectUsed(gw, db, env.acct, 0);
    });

    /* ------------------------------------------------------------------ */
    /* manifests: channelTypes, baseUrl                                    */
    /* ------------------------------------------------------------------ */

    /*
     * Spec, meta.channelTypes: "Each legacy channel type belongs to exactly
     * one plugin"; README: "A legacy channel type ... claimed twice clashes
     * as well": 409 conflict naming that plugin, unless forced or disabled.
     */
    test('a legacy channel type claimed by a second plugin: 409 conflict naming the first', async () => {
        const first = `ct1-${hex(4)}`;
        const second = `ct2-${hex(4)}`;
        await uploadPlugin(gw, specSource({ key: first, models: [`${first}-m`], channelTypes: [57] }));
        const src = specSource({ key: second, models: [`${second}-m`], channelTypes: [57] });
        const r = await gw.admin('POST', '/api/plugin/task', { source: src, enabled: true });
        const e = assertError(r, 409, { code: 'conflict' });
        assert.match(e.message, new RegExp(`plugin ${first}\\b`));
        assert.match(e.message, /\b57\b/);
        assertError(await gw.admin('GET', `/api/plugin/task/${second}`), 404);
        /* stored disabled it does not clash */
        const off = assertOk(await gw.admin('POST', '/api/plugin/task', { source: src, enabled: false }));
        assert.equal(off.json.enabled, false);
    });

    /*
     * Spec, meta.allowedHosts: "The default baseUrl does not implicitly
     * widen this set"; README: a descriptor's host must be "the channel's
     * host or listed in meta.allowedHosts" (500 invalid_descriptor, nothing
     * sent).
     */
    test('meta.baseUrl does not widen the allowed hosts of a channel with its own base_url', async () => {
        const v = await newVendor();
        const other = await newVendor();
        const env = await setup({ vendors: [v], baseUrl: other.url });
        assertError(await submit(env, { model: env.model, target: other.url, up_id: 'up-other' }), 500,
            { code: 'invalid_descriptor' });
        await sleep(200);
        assert.equal(other.requests.length, 0, 'nothing sent to meta.baseUrl');
        assert.equal(v.requests.length, 0, 'nothing sent to the channel either');
        await expectUsed(gw, db, env.acct, 0);
        /* aimed at the channel's own host it is sent */
        assertOk(await submit(env, { model: env.model, target: v.url, up_id: 'up-own' }), 'channel host');
        assert.ok(v.submits().some((q) => q.upId === 'up-own'));
    });

    /* ------------------------------------------------------------------ */
    /* uploads                                                             */
    /* ------------------------------------------------------------------ */

    /*
     * README, Files: "Per file and per request caps:
     * llmgw_task_max_file_size, llmgw_task_max_files_total"; a file over
     * the per-file cap is refused with 413 file_too_large.
     */
    test('an uploaded file over llmgw_task_max_file_size: 413 file_too_large, nothing sent', async () => {
        const v = await newVendor();
        const env = await setup({ vendors: [v] });
        const post = (size) => {
            const mp = multipartBody([['model', env.model]],
                [{ name: 'image', filename: 'a.png', type: 'image/png', data: Buffer.alloc(size, 1) }]);
            return submit(env, mp.body, { headers: { 'Content-Type': mp.contentType } });
        };
        assertError(await post(MAX_FILE + 1), 413, { code: 'file_too_large' });
        await sleep(200);
        assert.equal(v.requests.length, 0, 'nothing sent');
        await expectUsed(gw, db, env.acct, 0);
        assertOk(await post(MAX_FILE), 'a file of exactly the cap');
        assert.equal(v.submits().length, 1);
    });

    /* ------------------------------------------------------------------ */
    /* routing                                                             */
    /* ------------------------------------------------------------------ */

    /*
     * README: "equal shapes go to the first plugin by key"; spec,
     * sortPriority: "Display order; larger is earlier. Does not affect
     * routing priority."
     */
    test('two plugins forced onto equal routes: the first by key serves, whatever sortPriority says', async () => {
        const va = await newVendor();
        const vb = await newVendor();
        const tag = hex(3);
        const prefix = `/shared-${tag}/v1`;
        /* b first and with the larger sortPriority, then a forced beside it */
        const t0 = Date.now();
        const b = await setup({ key: `eqb-${tag}`, vendors: [vb], prefix, sortPriority: 100, models: 1, wait: false });
        const src = specSource({ key: `eqa-${tag}`, models: [`eqa-${tag}-m0`], prefix, sortPriority: 0 });
        assertError(await gw.admin('POST', '/api/plugin/task', { source: src, enabled: true }), 409,
            { code: 'conflict' });
        assertOk(await gw.admin('POST', '/api/plugin/task?force=1', { source: src, enabled: true }), 'forced');
        const aModel = `eqa-${tag}-m0`;
        assertOk(await gw.admin('PUT', '/api/pricing', { [aModel]: { price: 0.01 } }));
        assertOk(await gw.admin('POST', '/api/channel', {
            name: 'eqa', type: 61, base_url: va.url, key: 'vk-a', models: [aModel],
            groups: ['default'], settings: { task_plugin_key: `eqa-${tag}` },
        }));
        await settle(t0);

        const list = assertOk(await gw.admin('GET', '/api/plugin/task?page_size=100')).json.items.map((p) => p.key);
        assert.ok(list.indexOf(`eqb-${tag}`) < list.indexOf(`eqa-${tag}`), `display order: ${list}`);

        const r = assertOk(await gw.req('POST', `${prefix}/gen`, { key: b.acct.key, body: { model: aModel } }));
        assert.equal(r.json.plugin, `eqa-${tag}`, r.text);
        assert.equal(va.submits().length, 1);
        /* b's model on the shared path reaches a's decoder, never b's vendor */
        const rb = await gw.req('POST', `${prefix}/gen`, { key: b.acct.key, body: { model: b.model } });
        assertError(rb, 503, { code: 'model_not_found', message: new RegExp(`\\(plugin eqa-${tag}\\)`) });
        await sleep(200);
        assert.equal(vb.requests.length, 0, 'plugin b never served');
        assert.equal(va.submits().length, 1);
    });
});
