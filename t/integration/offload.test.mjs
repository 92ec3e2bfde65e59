// Large request bodies are read, routed and converted in a thread pool
// (llmgw_offload_size): the worker serves other requests meanwhile, and the
// request goes on as if it had been read in the worker.

import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';
import { Worker } from 'node:worker_threads';

import {
    assertCleanLog, assertError, assertOk, createDb, makeChannel, makeUserKey,
    settle, startGateway, tearDown, uniq, waitLogs,
} from '../lib/harness.mjs';
import { startMock } from '../lib/mock.mjs';

/* A chat body of n one-letter text parts: cheap to send, slow to convert. */
function manyParts(model, n, extra = {}) {
    return JSON.stringify({
        model, max_tokens: 8, ...extra,
        messages: [{ role: 'user', content: Array.from({ length: n },
            () => ({ type: 'text', text: 'a' })) }],
    });
}

/* POST: {finished} resolves with the time the body was out, {done} with
   the answer. */
function send(port, path, key, body) {
    let finished;
    const out = new Promise((r) => { finished = r; });
    const done = new Promise((resolve, reject) => {
        const req = http.request({ host: '127.0.0.1', port, path, method: 'POST',
            headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json',
                'Content-Length': Buffer.byteLength(body) } }, (res) => {
            const parts = [];
            res.on('data', (c) => parts.push(c));
            res.on('end', () => resolve({ status: res.statusCode, headers: res.headers,
                text: Buffer.concat(parts).toString('utf8'),
                get json() { return JSON.parse(this.text); } }));
        });
        req.on('finish', () => finished(Date.now()));
        req.on('error', reject);
        req.setTimeout(60000, () => req.destroy(new Error('timed out')));
        req.end(body);
    });
    return { finished: out, done };
}

const post = (...args) => send(...args).done;

function get(port, path, key) {
    return new Promise((resolve, reject) => {
        const t0 = Date.now();
        http.get({ host: '127.0.0.1', port, path, headers: { Authorization: `Bearer ${key}` } },
            (res) => {
                res.resume();
                res.on('end', () => resolve({ status: res.statusCode, ms: Date.now() - t0 }));
            }).on('error', reject);
    });
}

/*
 * GETs one after another, from a thread of its own (the mocks parse large
 * bodies on this one, which would count in the times), until stop():
 * resolves to { slowest (ms), n }.
 */
function probeLoop(port, path, key) {
    const w = new Worker(`
        const { parentPort, workerData: d } = require('node:worker_threads');
        const http = require('node:http');
        let stop = false, slowest = 0, n = 0;
        parentPort.on('message', () => { stop = true; });
        const one = () => new Promise((resolve, reject) => {
            const t0 = Date.now();
            http.get({ host: '127.0.0.1', port: d.port, path: d.path,
                headers: { Authorization: 'Bearer ' + d.key } }, (res) => {
                res.resume();
                res.on('end', () => resolve(Date.now() - t0));
            }).on('error', reject);
        });
        (async () => {
            const end = Date.now() + 60000;
            while (!stop && Date.now() < end) {
                slowest = Math.max(slowest, await one());
                n++;
                await new Promise((r) => setTimeout(r, 10));
            }
            parentPort.postMessage({ slowest, n });
        })().catch((e) => parentPort.postMessage({ error: e.message }));
    `, { eval: true, workerData: { port, path, key } });
    const result = new Promise((resolve, reject) => {
        w.once('message', (m) => {
            w.terminate();
            if (m.error) {
                reject(new Error(m.error));
            } else {
                resolve(m);
            }
        });
        w.once('error', reject);
    });
    return {
        stop() {
            w.postMessage('stop');
            return result;
        },
    };
}

describe('large bodies in the thread pool', { timeout: 240000 }, () => {
    let db, gw, mock, key, model;

    before(async () => {
        db = await createDb();
        mock = await startMock();
        /* one worker: a body converted in it would hold up everything */
        gw = await startGateway({ db, workers: 1,
            server: 'client_max_body_size 16m; client_body_buffer_size 16m;' });
        model = uniq('claude-offload');
        await makeChannel(gw, { type: 14, base_url: mock.url, models: [model] });
        ({ key } = await makeUserKey(gw));
        await settle();
    });

    after(() => tearDown(db, [gw], [mock]));

    test('the worker serves others while a large body is converted; the body goes on whole', async () => {
        const n = 200000;
        const before = mock.requests.length;
        const big = send(gw.port, '/v1/chat/completions', key, manyParts(model, n));
        /* once the body is out, the request is being read and converted */
        const sent = await big.finished;
        await new Promise((r) => setTimeout(r, 20));
        const small = await get(gw.port, '/v1/models', key);
        const r = await big.done;
        assertOk(r);
        assert.equal(small.status, 200);

        const up = mock.requests[before];
        assert.ok(up, 'the upstream got the request');
        assert.equal(up.path, '/v1/messages');
        assert.equal(up.json.messages[0].content.length, n, 'every part, converted');
        assert.equal(up.json.model, model);

        /* the conversion took the time from the upload to the upstream; a
           request served meanwhile did not wait for it */
        const converting = up.t - sent;
        assert.ok(converting > 150, `the conversion takes a while (${converting} ms)`);
        assert.ok(small.ms < converting / 2,
            `a request during a ${converting} ms conversion took ${small.ms} ms`);

        const id = r.headers['x-request-id'];
        const { items } = await waitLogs(gw, { page_size: 50 },
            (it) => it.some((i) => i.request_id === id));
        assert.equal(items.find((i) => i.request_id === id).status, 200);
    });

    test('a retry on a channel of another type sends a body built in the thread too', async () => {
        const failing = await startMock((req, res) => {
            res.writeHead(500, { 'Content-Type': 'application/json' });
            res.end('{"error":{"message":"down","type":"server_error"}}');
        });
        try {
            const m2 = uniq('offload-retry');
            await makeChannel(gw, { base_url: failing.url, models: [m2], priority: 10 });
            await makeChannel(gw, { type: 14, base_url: mock.url, models: [m2], priority: 0 });
            await settle();
            const n = 200000;
            const before = mock.requests.length;
            const big = send(gw.port, '/v1/chat/completions', key, manyParts(m2, n));
            const sent = await big.finished;
            /* small requests all along: none waits for a conversion */
            const probe = probeLoop(gw.port, '/v1/models', key);
            const r = await big.done.catch(async (e) => {
                await probe.stop();
                throw e;
            });
            const { slowest, n: probes } = await probe.stop();
            assert.ok(probes > 0);
            assertOk(r);
            assert.equal(failing.requests.length, 1, 'the first channel was tried');
            const up = mock.requests[before];
            assert.equal(up.path, '/v1/messages');
            assert.equal(up.json.messages[0].content.length, n);
            const converting = up.t - sent;
            assert.ok(converting > 150, `the conversions take a while (${converting} ms)`);
            /* the thread converts three times (the route's check, then
               both tries' bodies); the worker converting the second try's
               body would hold a request for about a third of that */
            assert.ok(slowest < converting / 5,
                `a request during ${converting} ms of conversions waited ${slowest} ms`);
        } finally {
            await failing.close();
        }
    });

    test('refusals of a large body keep the error contract', async () => {
        const other = await makeUserKey(gw, {}, { models: ['something-else'] });
        let r = await post(gw.port, '/v1/chat/completions', other.key, manyParts(model, 20000));
        assertError(r, 403, { message: `no access to model ${model}` });
        r = await post(gw.port, '/v1/chat/completions', key, manyParts(uniq('nobody'), 20000));
        assertError(r, 503, { code: 'model_not_found' });
        r = await post(gw.port, '/v1/chat/completions', key,
            manyParts(model, 20000).slice(0, -1));
        assertError(r, 400, { code: 'invalid_json' });
    });

    test('a reload while a body is converted: the old worker finishes the request', async () => {
        const before = mock.requests.length;
        const big = send(gw.port, '/v1/chat/completions', key, manyParts(model, 200000));
        await big.finished;
        await new Promise((r) => setTimeout(r, 15));
        process.kill(gw.masterPid(), 'SIGHUP');
        const r = await big.done;
        assertOk(r);
        assert.equal(mock.requests.length, before + 1);
        const id = r.headers['x-request-id'];
        await waitLogs(gw, { page_size: 50 }, (it) => it.some((i) => i.request_id === id));
        assertCleanLog(gw);
    });

    test('a client that leaves while its body is converted: nothing breaks', async () => {
        const body = manyParts(model, 200000);
        const before = mock.requests.length;
        await new Promise((resolve) => {
            const req = http.request({ host: '127.0.0.1', port: gw.port,
                path: '/v1/chat/completions', method: 'POST',
                headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json',
                    'Content-Length': Buffer.byteLength(body) } });
            req.on('error', () => resolve());
            req.on('finish', () => setTimeout(() => { req.destroy(); resolve(); }, 30));
            req.end(body);
        });
        /* the gateway goes on serving, and its worker is alive */
        await new Promise((r) => setTimeout(r, 3000));
        assertOk(await post(gw.port, '/v1/chat/completions', key, manyParts(model, 3)));
        assert.ok(mock.requests.length >= before + 1);
        assertCleanLog(gw);
    });
});
