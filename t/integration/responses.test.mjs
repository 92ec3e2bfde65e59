// The host protocol host_responses end to end, through the real nginx,
// PostgreSQL and the plugin runtime, against the mock vendor of
// t/lib/vendor.mjs and the plugin fixtures/plugins/task-responses.js:
//   - POST /v1/responses as the request asks: sync (the request waits for
//     its task and answers renderFinal's Response), background (the host's
//     pending Response at once), stream (renderEvents on every change of
//     the task, as server-sent events, until the plugin says done);
//   - a mode the plugin does not declare is 400 naming those it does;
//   - GET /v1/responses/{id}: the host's pending Response until the task
//     ends, then renderFinal's (a stream-only plugin: the Response its
//     events carry); the host sets id, object, model and created_at;
//   - a finished task's artifacts reach the render hooks as
//     ctx.artifacts[key].url, a signed link that serves the content;
//   - billing, refunds and ownership as for any task; past
//     llmgw_task_wait_timeout a sync request is 504 task_timeout and a
//     stream ends with an error event.
//
// Gateways poll every 200 ms.

import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';

import { assertError, assertOk, sseEvents, uniq } from '../lib/harness.mjs';
import {
    account, expectUsed, pollFailures, sleep, taskSetup, vendorSuite, waitFor,
    waitLedger,
} from '../lib/vendor.mjs';

const POLL_MS = 200;
const SECRET = 'responses-test-secret-0123456789abcdef';
const HTTP = `llmgw_task_poll_interval ${POLL_MS}ms;
  llmgw_task_poll_max_failures 3;
  llmgw_task_wait_timeout 4s;
  llmgw_crypto_secret ${SECRET};
  llmgw_content_allow_private 127.0.0.1;`;   /* the CDN mock is on loopback */
const PER_TASK = 5000;      /* 0.01 USD */
const FIXTURE = 'task-responses.js';

const now = () => Math.floor(Date.now() / 1000);

/* A public "CDN" with one image. */
async function startCdn() {
    const png = Buffer.from('89504e470d0a1a0a' + '00'.repeat(64), 'hex');
    const seen = [];
    const server = http.createServer((req, res) => {
        seen.push({ url: req.url, headers: req.headers });
        res.writeHead(200, { 'Content-Type': 'image/png', 'Content-Length': png.length });
        res.end(req.method === 'HEAD' ? undefined : png);
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    return {
        png, seen, url: `http://127.0.0.1:${server.address().port}`,
        close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
    };
}

describe('host_responses', { timeout: 180000 }, () => {
    const s = vendorSuite({ http: HTTP });
    let db, gw, vendor, env, streamOnly, syncOnly, cdn;

    before(async () => {
        ({ db, gw, vendor } = s);
        cdn = await startCdn();
        env = await taskSetup(gw, { fixture: FIXTURE, vendors: [vendor], models: 1 });
        streamOnly = await taskSetup(gw, { fixture: FIXTURE, vendors: [vendor], models: 1,
            consts: { SUPPORTS: { stream: true } } });
        syncOnly = await taskSetup(gw, { fixture: FIXTURE, vendors: [vendor], models: 1,
            consts: { SUPPORTS: { sync: true } } });
    });
    after(() => cdn?.close());

    const create = (body, { key = env.acct.key, timeoutMs } = {}) =>
        gw.req('POST', '/v1/responses', { key, body, timeoutMs });
    const retrieve = (id, { key = env.acct.key } = {}) =>
        gw.req('GET', `/v1/responses/${encodeURIComponent(id)}`, { key });

    function assertResponse(o, { status, model = env.model }) {
        assert.match(o.id, /^task_/, JSON.stringify(o));
        assert.equal(o.object, 'response');
        assert.equal(o.model, model);
        assert.equal(o.status, status, JSON.stringify(o));
        assert.ok(Number.isInteger(o.created_at) && Math.abs(o.created_at - now()) < 120,
            `created_at ${o.created_at}`);
    }

    test('sync: the request waits for its task and answers renderFinal, with ctx.artifacts', async () => {
        const acct = await account(gw);
        const up = uniq('up-sync');
        const image = `${cdn.url}/img-${up}.png`;
        vendor.queuePoll(up, { body: { status: 'running', progress: '50%' } });
        vendor.setPoll(up, { body: { status: 'done', data: { text: 'hello', image } } });

        const r = assertOk(await create({ model: env.model, input: 'hi', up_id: up },
            { key: acct.key }), 'POST /v1/responses');
        assertResponse(r.json, { status: 'completed' });
        /* the plugin's members stay; the host's win */
        assert.deepEqual(r.json.seen, {
            protocol: 'host_responses', operation: 'create', model: env.model, stream: false,
            params: {},
        });
        assert.equal(r.json.output[0].content[0].text, 'hello');
        assert.ok(vendor.polls(up).length >= 2, 'polled inside the request until it ended');

        /* the artifact link: signed, serves the content without the key */
        const link = r.json.output[0].content[1].url;
        assert.match(link, new RegExp(`/v1/tasks/${r.json.id}/artifacts/image/content\\?expires=\\d+&signature=[0-9a-f]{64}$`));
        const u = new URL(link);
        const c = await gw.req('GET', u.pathname + u.search);
        assert.equal(c.status, 200, c.text);
        assert.equal(c.headers['content-type'], 'image/png');

        /* the decoder's model is not the one routed by */
        const sub = vendor.submits().find((x) => x.json.up_id === up);
        assert.equal(sub.json.model, env.model);
        assert.equal(sub.json.action, 'responses.create');

        /* retrieval renders the same task */
        const g = assertOk(await retrieve(r.json.id, { key: acct.key }), 'GET');
        assertResponse(g.json, { status: 'completed' });
        assert.equal(g.json.id, r.json.id);
        assert.equal(g.json.seen.operation, 'retrieve');
        assert.deepEqual(g.json.seen.params, { response_id: r.json.id });

        const led = await waitLedger(db, r.json.id, ['reserve']);
        assert.equal(led.reserve, PER_TASK);
        await expectUsed(gw, db, acct, PER_TASK);

        /* another user's response is not there */
        const other = await account(gw);
        assertError(await retrieve(r.json.id, { key: other.key }), 404, { code: 'task_not_found' });
    });

    test('sync: a failed task answers the failed Response and is refunded', async () => {
        const acct = await account(gw);
        const up = uniq('up-fail');
        vendor.setPoll(up, { body: { status: 'failed', error: 'the vendor gave up' } });
        const r = assertOk(await create({ model: env.model, input: 'hi', up_id: up },
            { key: acct.key }));
        assertResponse(r.json, { status: 'failed' });
        assert.deepEqual(r.json.error, { code: 'vendor_failed', message: 'the vendor gave up' });
        const led = await waitLedger(db, r.json.id, ['reserve', 'refund']);
        assert.equal(led.refund, led.reserve);
        await expectUsed(gw, db, acct, 0);
    });

    test('sync: a renderFinal that fails fails the task and refunds it; a retrieval leaves it', async () => {
        const acct = await account(gw);
        const up = uniq('up-rthrow');
        vendor.setPoll(up, { body: { status: 'done', data: { text: 'hi', render: 'throw' } } });
        const r = await create({ model: env.model, input: 'hi', up_id: up }, { key: acct.key });
        assertError(r, 500, { code: 'plugin_error', message: /render broke.*; task \S+ was failed and refunded/ });
        const id = /task (\S+) was failed/.exec(r.json.error.message)[1];
        const led = await waitLedger(db, id, ['reserve', 'refund']);
        assert.equal(led.refund, PER_TASK, JSON.stringify(led));
        await expectUsed(gw, db, acct, 0);

        /* a background task whose retrieval fails to render stays charged */
        const acct2 = await account(gw);
        const up2 = uniq('up-rthrow-bg');
        vendor.setPoll(up2, { body: { status: 'done', data: { text: 'hi', render: 'throw' } } });
        const b = assertOk(await create({ model: env.model, input: 'hi', up_id: up2, background: true },
            { key: acct2.key }));
        await waitLedger(db, b.json.id, ['reserve', 'settle']);
        assertError(await retrieve(b.json.id, { key: acct2.key }), 500, { code: 'plugin_error' });
        await expectUsed(gw, db, acct2, PER_TASK);
    });

    test('background: the host\'s pending Response at once, renderFinal once it ended', async () => {
        const up = uniq('up-bg');
        const r = assertOk(await create({ model: env.model, input: 'hi', up_id: up,
            background: true }));
        assertResponse(r.json, { status: 'queued' });
        assert.equal(r.json.background, true);
        assert.deepEqual(r.json.output, []);
        assert.equal(r.json.error, null);

        vendor.setPoll(up, { body: { status: 'running', progress: '30%' } });
        await waitFor(async () => (await retrieve(r.json.id)).json.status === 'in_progress',
            8000, { what: 'in_progress' });
        /* retrieved while it runs, it is still the background Response it was made */
        assert.equal((await retrieve(r.json.id)).json.background, true);
        /* the mode is the host's record, not part of the task's data */
        const tv = assertOk(await gw.req('GET', `/v1/tasks/${r.json.id}`, { key: env.acct.key }));
        assert.equal(JSON.stringify(tv.json.data ?? null).includes('background'), false,
            JSON.stringify(tv.json));
        vendor.setPoll(up, { body: { status: 'done', data: { text: 'later' } } });
        await waitFor(async () => (await retrieve(r.json.id)).json.status === 'completed',
            8000, { what: 'completed' });
        const g = (await retrieve(r.json.id)).json;
        assertResponse(g, { status: 'completed' });
        assert.equal(g.id, r.json.id);
        assert.equal(g.output[0].content[0].text, 'later');
        assert.equal(g.output[0].content.length, 1, 'no artifacts, no links');
    });

    test('stream: renderEvents on every change, sent as they come, until done', async () => {
        const up = uniq('up-stream');
        const image = `${cdn.url}/img-${up}.png`;
        const pending = create({ model: env.model, input: 'hi', up_id: up, stream: true },
            { timeoutMs: 30000 });

        await waitFor(() => vendor.submits().some((x) => x.json.up_id === up), 8000,
            { what: 'the submit' });
        await sleep(600);
        vendor.setPoll(up, { body: { status: 'running', progress: '40%' } });
        await waitFor(() => vendor.polls(up).length >= 2, 8000, { what: 'polls' });
        await sleep(600);
        const tDone = Date.now();
        vendor.setPoll(up, { body: { status: 'done', data: { text: 'streamed', image } } });

        const r = await pending;
        assert.equal(r.status, 200, r.text);
        assert.match(r.headers['content-type'], /^text\/event-stream/);
        const events = sseEvents(r.text);
        const names = events.map((e) => e.event);
        assert.deepEqual(names, ['response.created', 'response.in_progress',
            'response.output_text.delta', 'note', 'response.completed'], r.text);
        assert.equal(JSON.parse(events[1].data).progress, '40%');
        assert.equal(JSON.parse(events[2].data).delta, 'streamed');
        /* a framed event: its event name, id and data as given, a data line
           for each line however it ends (a lone CR too) */
        assert.match(r.text, /event: note\nid: n1\ndata: two\ndata: lines\ndata: three\ndata: four\n\n/);
        /* the Responses the events carry get the host's members: the task's id */
        const created = JSON.parse(events[0].data).response;
        assertResponse(created, { status: 'in_progress' });
        const tid = vendor.submits().find((x) => x.json.up_id === up).headers['x-public-task-id'];
        assert.equal(created.id, tid);
        const done = JSON.parse(events[4].data).response;
        assertResponse(done, { status: 'completed' });
        assert.equal(done.id, tid, 'the plugin\'s id is replaced');
        assert.equal(done.seen.stream, true);
        assert.match(done.output[0].content[1].url, /\/artifacts\/image\/content\?expires=/);

        /* the first events reached the client before the task ended */
        const first = r.chunks.find((c) => c.text.includes('response.created'));
        assert.ok(first && first.t < tDone, 'response.created arrived before the end');
        assert.ok(!r.aborted, 'the stream ended cleanly');
    });

    test('stream: a failed task ends the stream with the failed event', async () => {
        const up = uniq('up-sfail');
        vendor.setPoll(up, { body: { status: 'failed', error: 'no luck' } });
        const r = await create({ model: env.model, input: 'hi', up_id: up, stream: true });
        assert.equal(r.status, 200, r.text);
        const events = sseEvents(r.text);
        assert.deepEqual(events.map((e) => e.event), ['response.created', 'response.failed']);
        assert.equal(JSON.parse(events[1].data).response.error.message, 'no luck');
    });

    test('a mode the plugin does not declare is 400 naming the ones it does', async () => {
        const r = await create({ model: syncOnly.model, input: 'hi', stream: true },
            { key: syncOnly.acct.key });
        assertError(r, 400, { code: 'invalid_request',
            message: /does not support stream: true; it supports neither stream nor background/ });
        const b = await create({ model: streamOnly.model, input: 'hi', background: true },
            { key: streamOnly.acct.key });
        assertError(b, 400, { code: 'invalid_request',
            message: /does not support background: true; it supports stream: true/ });
        const y = await create({ model: streamOnly.model, input: 'hi' },
            { key: streamOnly.acct.key });
        assertError(y, 400, { code: 'invalid_request', message: /it supports stream: true/ });
        assert.equal(vendor.submits().filter((x) => x.json.model === syncOnly.model
            || x.json.model === streamOnly.model).length, 0, 'nothing was submitted');
    });

    test('a stream-only plugin answers a retrieval with the Response its events carry', async () => {
        const up = uniq('up-so');
        vendor.setPoll(up, { body: { status: 'done', data: { text: 'only events' } } });
        const r = await create({ model: streamOnly.model, input: 'hi', up_id: up, stream: true },
            { key: streamOnly.acct.key });
        assert.equal(r.status, 200, r.text);
        const completed = sseEvents(r.text).find((e) => e.event === 'response.completed');
        assert.ok(completed, r.text);
        const task = vendor.submits().find((x) => x.json.up_id === up);
        assert.ok(task, 'submitted');
        const tid = task.headers['x-public-task-id'];
        const g = assertOk(await retrieve(tid, { key: streamOnly.acct.key }), 'GET');
        assertResponse(g.json, { status: 'completed', model: streamOnly.model });
        assert.equal(g.json.id, tid);
        assert.equal(g.json.output[0].content[0].text, 'only events');
        assert.equal(g.json.seen.operation, 'retrieve');
    });

    test('stream: a renderEvents that fails fails the task and refunds it, and says so', async () => {
        /* a result final at once: nothing was sent, the answer is the error */
        const acct = await account(gw);
        vendor.onSubmit = (rec, n) => ({ status: 200, body: { id: `evt-${n}`,
            immediate: { status: 'SUCCESS', data: { text: 'hi', events: 'throw' } } } });
        let r;
        try {
            r = await create({ model: streamOnly.model, input: 'hi', stream: true }, { key: acct.key });
        } finally {
            vendor.onSubmit = null;
        }
        assertError(r, 500, { code: 'plugin_error',
            message: /events broke.*; task \S+ was failed and refunded/ });
        const id = /task (\S+) was failed/.exec(r.json.error.message)[1];
        assert.equal((await waitLedger(db, id, ['reserve', 'refund'])).refund, PER_TASK);
        await expectUsed(gw, db, acct, 0);

        /* polled to its end: the stream's error event says it */
        const acct2 = await account(gw);
        const up = uniq('up-evthrow');
        vendor.setPoll(up, { body: { status: 'done', data: { text: 'hi', events: 'throw' } } });
        const st = await create({ model: streamOnly.model, input: 'hi', up_id: up, stream: true },
            { key: acct2.key });
        assert.equal(st.status, 200, st.text);
        let events = sseEvents(st.text);
        assert.deepEqual(events.map((e) => e.event), ['response.created', 'error'], st.text);
        let e = JSON.parse(events[1].data);
        assert.equal(e.code, 'plugin_error');
        assert.match(e.message, /events broke.*; task (\S+) was failed and refunded \(request id: [0-9a-f]+\)$/);
        const id2 = /task (\S+) was failed/.exec(e.message)[1];
        assert.equal((await waitLedger(db, id2, ['reserve', 'refund'])).refund, PER_TASK);
        await expectUsed(gw, db, acct2, 0);
        /* its retrieval answers the failed Response, not an error */
        const g = assertOk(await retrieve(id2, { key: acct2.key }), 'GET');
        assertResponse(g.json, { status: 'failed', model: streamOnly.model });
        assert.match(g.json.error.message, /^the result could not be rendered: .*events broke/);

        /* a render that fails while the task runs: the client gets no result
           either, so the task fails and is refunded there and then */
        const acct3 = await account(gw);
        const up3 = uniq('up-evrun');
        vendor.setPoll(up3, { body: { status: 'running', progress: 'unrenderable' } });
        const st3 = await create({ model: env.model, input: 'hi', up_id: up3, stream: true },
            { key: acct3.key });
        events = sseEvents(st3.text);
        assert.deepEqual(events.map((x) => x.event), ['response.created', 'error'], st3.text);
        e = JSON.parse(events[1].data);
        assert.match(e.message, /events broke while running.*; task \S+ was failed and refunded/);
        const id3 = /task (\S+) was failed/.exec(e.message)[1];
        assert.equal((await waitLedger(db, id3, ['reserve', 'refund'])).refund, PER_TASK);
        /* the vendor finishing later changes nothing */
        vendor.setPoll(up3, { body: { status: 'done', data: { text: 'late' } } });
        await sleep(4 * POLL_MS);
        assertResponse(assertOk(await retrieve(id3, { key: acct3.key })).json, { status: 'failed' });
        await expectUsed(gw, db, acct3, 0);
    });

    test('past llmgw_task_wait_timeout: sync is 504 task_timeout, a stream ends with an error event', async () => {
        const up = uniq('up-slow');
        const r = await create({ model: env.model, input: 'hi', up_id: up },
            { timeoutMs: 20000 });
        assertError(r, 504, { code: 'task_timeout', message: /did not finish within 4 s/ });

        const up2 = uniq('up-slow2');
        const st = await create({ model: env.model, input: 'hi', up_id: up2, stream: true },
            { timeoutMs: 20000 });
        assert.equal(st.status, 200);
        const events = sseEvents(st.text);
        assert.equal(events[0].event, 'response.created');
        const last = events[events.length - 1];
        assert.equal(last.event, 'error');
        const e = JSON.parse(last.data);
        assert.equal(e.type, 'error');
        assert.equal(e.code, 'task_timeout');
        assert.match(e.message, /\(request id: [0-9a-f]+\)$/);

        /* retrieved while it runs: not a background Response */
        const pendingTid = vendor.submits().find((x) => x.json.up_id === up).headers['x-public-task-id'];
        const p = assertOk(await retrieve(pendingTid));
        assert.equal(p.json.id, pendingTid);
        assert.equal(p.json.background, false, JSON.stringify(p.json));

        /* the tasks go on in the background and end */
        vendor.setPoll(up, { body: { status: 'done', data: { text: 'late' } } });
        vendor.setPoll(up2, { body: { status: 'done', data: { text: 'late' } } });
        const tid = vendor.submits().find((x) => x.json.up_id === up).headers['x-public-task-id'];
        await waitFor(async () => (await retrieve(tid)).json.status === 'completed', 8000,
            { what: 'the task ended in the background' });
    });

    test('a poll the vendor does not answer ends with the wait: 504 or the error event on time', async () => {
        const up = uniq('up-hung');
        vendor.setPoll(up, { body: { status: 'running' }, delayMs: 30000 });
        let t0 = Date.now();
        const r = await create({ model: env.model, input: 'hi', up_id: up }, { timeoutMs: 40000 });
        let took = Date.now() - t0;
        assertError(r, 504, { code: 'task_timeout', message: /did not finish within 4 s/ });
        assert.ok(took < 6000, `answered after ${took} ms`);

        const up2 = uniq('up-hung2');
        vendor.setPoll(up2, { body: { status: 'running' }, delayMs: 30000 });
        t0 = Date.now();
        const st = await create({ model: env.model, input: 'hi', up_id: up2, stream: true },
            { timeoutMs: 40000 });
        took = Date.now() - t0;
        const events = sseEvents(st.text);
        assert.equal(events.at(-1).event, 'error', st.text);
        assert.equal(JSON.parse(events.at(-1).data).code, 'task_timeout');
        assert.ok(took < 6000, `ended after ${took} ms`);

        /* the polls cut short counted no failure against the tasks */
        for (const u of [up, up2]) {
            const tid = vendor.submits().find((x) => x.json.up_id === u).headers['x-public-task-id'];
            assert.equal(await pollFailures(db, tid), 0);
            vendor.setPoll(u, { body: { status: 'done', data: { text: 'late' } } });
        }
    });
});
