// Routing and retries: priority, weight, which failures move to the next
// channel (with its own URL and key), the try limit, and never after a
// stream started.

import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, hex, makeChannel, makeUserKey,
    settle, startGateway, stopAll, times, uniq, waitLogs,
} from '../lib/harness.mjs';
import {
    echo, openaiChat, openaiError, sendJson, startClosedPort, startMock,
} from '../lib/mock.mjs';

const failWith = (status, message) => (req, res) => openaiError(res, status, message,
    { type: 'server_error' });
const answer = (content) => (req, res, rec) => sendJson(res, 200,
    openaiChat({ model: rec.json.model, content }));

describe('routing and retries', { timeout: 240000 }, () => {
    let db, gw, gw2, key;
    const mocks = [];
    const M = {};
    const ch = {};

    async function mock(handler) {
        const m = await startMock(handler);
        mocks.push(m);
        return m;
    }

    /* A channel on its own mock; -> {mock, key, channel} */
    async function channel(model, handler, opts = {}) {
        const m = opts.base_url ? null : await mock(handler);
        const k = `up-${hex(6)}`;
        const c = await makeChannel(gw, {
            base_url: m ? m.url : opts.base_url, key: k, models: [model], ...opts,
        });
        return { mock: m, key: k, channel: c };
    }

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db });
        gw2 = await startGateway({ db, http: 'llmgw_max_tries 2;', rootToken: gw.rootToken });
        const closed = await startClosedPort();
        const closed2 = await startClosedPort();

        for (const name of ['on500', 'on429', 'onConn', 'on504', 'on400', 'max3',
            'allConn', 'stream', 'tries2', 'prio', 'weight', 'noAddr', 'noAddrOnly',
            'split', 'cutHeader', 'errThenConn', 'closeGood', 'closeBad', 'on529Conn',
            'on529', 'on304', 'on304Only', 'closeLarge']) {
            M[name] = uniq(`gpt-${name}`);
        }
        ch.on500 = [await channel(M.on500, failWith(500, 'A exploded'), { priority: 10 }),
            await channel(M.on500, answer('from B'), {
                priority: 5, model_mapping: { [M.on500]: 'b-model' },
            })];
        ch.on429 = [await channel(M.on429, failWith(429, 'A busy'), { priority: 10 }),
            await channel(M.on429, answer('from B'), { priority: 5 })];
        ch.onConn = [await channel(M.onConn, null, { priority: 10, base_url: closed.url }),
            await channel(M.onConn, answer('from B'), { priority: 5 })];
        ch.on504 = [await channel(M.on504, failWith(504, 'A gateway timeout'), { priority: 10 }),
            await channel(M.on504, answer('from B'), { priority: 5 })];
        ch.on400 = [await channel(M.on400, failWith(400, 'A bad request'), { priority: 10 }),
            await channel(M.on400, answer('from B'), { priority: 5 })];
        ch.max3 = [];
        for (let i = 1; i <= 4; i++) {
            ch.max3.push(await channel(M.max3, failWith(503, `fail-${i}`),
                { priority: 50 - i * 10 }));
        }
        ch.errThenConn = [await channel(M.errThenConn, failWith(500, 'A broke'), { priority: 10 }),
            await channel(M.errThenConn, null, { priority: 5, base_url: closed.url })];
        /* 5xx that nginx itself would not retry (Anthropic's 529 overloaded) */
        ch.on529Conn = [await channel(M.on529Conn, failWith(529, 'A overloaded'), { priority: 10 }),
            await channel(M.on529Conn, null, { priority: 5, base_url: closed.url })];
        ch.on529 = [await channel(M.on529, failWith(529, 'A overloaded'), { priority: 10 }),
            await channel(M.on529, answer('from B'), { priority: 5 })];
        /* 304 answers no POST of this API */
        const notModified = (req, res) => { res.writeHead(304, { 'Content-Length': '50' }); res.end(); };
        ch.on304 = [await channel(M.on304, notModified, { priority: 10 }),
            await channel(M.on304, answer('from B'), { priority: 5 })];
        ch.on304Only = [await channel(M.on304Only, notModified)];
        ch.allConn = [await channel(M.allConn, null, { priority: 10, base_url: closed.url }),
            await channel(M.allConn, null, { priority: 5, base_url: closed2.url })];
        ch.stream = [await channel(M.stream, async (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/event-stream' });
            res.write('data: {"id":"c1","object":"chat.completion.chunk","choices":' +
                '[{"index":0,"delta":{"role":"assistant","content":"partial"}}]}\n\n');
            await new Promise((s) => setTimeout(s, 300));
            res.destroy();
        }, { priority: 10 }),
        await channel(M.stream, echo, { priority: 5 })];
        ch.tries2 = [];
        for (let i = 1; i <= 3; i++) {
            ch.tries2.push(await channel(M.tries2, failWith(500, `t2-fail-${i}`),
                { priority: 40 - i * 10 }));
        }
        ch.prio = [await channel(M.prio, answer('high'), { priority: 10 }),
            await channel(M.prio, answer('low'), { priority: 0 }),
            await channel(M.prio, answer('disabled'), { priority: 100, status: 'disabled' })];
        ch.weight = [await channel(M.weight, answer('heavy'), { priority: 0, weight: 3 }),
            await channel(M.weight, answer('light'), { priority: 0, weight: 1 })];

        /* a host name with no "resolver" in the configuration: no address */
        ch.noAddr = [await channel(M.noAddr, null,
            { priority: 10, base_url: 'http://upstream-a.invalid:9' }),
        await channel(M.noAddr, answer('from B'), { priority: 5 })];
        ch.noAddrOnly = [await channel(M.noAddrOnly, null,
            { base_url: 'http://upstream-b.invalid:9' })];

        /* raw upstreams: a status line in two pieces; a header line cut off */
        const split = await rawUpstream(async (sock) => {
            const body = JSON.stringify(openaiChat({ model: M.split, content: 'split status' }));
            sock.write('HTTP/1.1 2');
            await new Promise((s) => setTimeout(s, 100));
            sock.end(`00 OK\r\nContent-Type: application/json\r\nContent-Length: ${body.length}` +
                `\r\nConnection: close\r\n\r\n${body}`);
        });
        ch.split = [await channel(M.split, null, { base_url: split.url })];
        const cut = await rawUpstream(async (sock) => {
            sock.write('HTTP/1.1 200 OK\r\nContent-Typ');
            await new Promise((s) => setTimeout(s, 50));
            sock.destroy();
        });
        ch.cutHeader = [await channel(M.cutHeader, null, { priority: 10, base_url: cut.url }),
            await channel(M.cutHeader, answer('from B'), { priority: 5 })];

        /* HTTP/1.0 answers that only the upstream's closing ends */
        const closing = (body) => rawUpstream((sock) => sock.end(
            `HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n${body}`));
        assertOk(await gw.admin('PUT', '/api/pricing', {
            [M.closeGood]: { ratio: 1, completion_ratio: 2 },
            [M.closeBad]: { ratio: 1, completion_ratio: 2 },
        }));
        ch.closeGood = [await channel(M.closeGood, null, {
            base_url: (await closing(JSON.stringify(openaiChat({
                model: M.closeGood, content: 'closed',
                usage: { prompt_tokens: 10, completion_tokens: 20, total_tokens: 30 },
            })))).url,
        })];
        ch.closeBad = [await channel(M.closeBad, null, {
            base_url: (await closing('<html>maintenance</html>')).url,
        })];
        /* a Gemini answer over the 16 MiB hold limit, for a chat client */
        assertOk(await gw.admin('PUT', '/api/pricing', { [M.closeLarge]: { ratio: 1 } }));
        ch.closeLarge = [await channel(M.closeLarge, null, {
            type: 24,
            base_url: (await closing(JSON.stringify({
                candidates: [{ content: { role: 'model', parts: [{ text: 'w'.repeat(17 << 20) }] },
                    finishReason: 'STOP', index: 0 }],
                usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 5 },
            }))).url,
        })];

        ({ key } = await makeUserKey(gw));
        await settle();
    });

    /* A TCP upstream that answers each request with answer(socket). */
    async function rawUpstream(answer) {
        const server = net.createServer((sock) => {
            let seen = '';
            sock.on('error', () => {});
            sock.on('data', (d) => {
                seen += d.toString('latin1');
                const head = seen.indexOf('\r\n\r\n');
                const len = /content-length: *(\d+)/i.exec(seen);
                if (head >= 0 && (!len || seen.length >= head + 4 + Number(len[1]))) {
                    seen = '';
                    answer(sock);
                }
            });
        });
        await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
        const m = { url: `http://127.0.0.1:${server.address().port}`,
            close: () => new Promise((r) => server.close(() => r())) };
        mocks.push(m);
        return m;
    }

    after(async () => {
        try {
            await stopAll(gw, gw2);
        } finally {
            await Promise.all(mocks.map((m) => m.close()));
            await dropDb(db);
        }
    });

    const count = (c) => c.mock.requests.length;

    for (const [name, what] of [['on500', 'a 500'], ['on429', 'a 429']]) {
        test(`${what} moves to the next channel with its own URL, key and mapping`, async () => {
            const [a, b] = ch[name];
            const r = await gw.chat(key, M[name]);
            assertOk(r);
            assert.equal(r.json.choices[0].message.content, 'from B');
            assert.equal(count(a), 1);
            assert.equal(count(b), 1);
            assert.equal(a.mock.requests[0].headers.authorization, `Bearer ${a.key}`);
            assert.equal(b.mock.requests[0].headers.authorization, `Bearer ${b.key}`);
            if (name === 'on500') {
                assert.equal(a.mock.requests[0].json.model, M[name]);
                assert.equal(b.mock.requests[0].json.model, 'b-model');
            }
        });
    }

    test('a refused connection moves to the next channel', async () => {
        const r = await gw.chat(key, M.onConn);
        assertOk(r);
        assert.equal(r.json.choices[0].message.content, 'from B');
        assert.equal(count(ch.onConn[1]), 1);
    });

    test('an upstream 504 is not retried', async () => {
        const [a, b] = ch.on504;
        const r = await gw.chat(key, M.on504);
        assertError(r, 504, { type: 'upstream_error', message: 'A gateway timeout' });
        assert.equal(count(a), 1);
        assert.equal(count(b), 0);
    });

    test('an upstream 400 is not retried', async () => {
        const [a, b] = ch.on400;
        const r = await gw.chat(key, M.on400);
        assertError(r, 400, { type: 'upstream_error', message: 'A bad request' });
        assert.equal(count(a), 1);
        assert.equal(count(b), 0);
    });

    test('at most 3 tries; the last upstream error comes back', async () => {
        const r = await gw.chat(key, M.max3);
        assertError(r, 503, { type: 'upstream_error', message: 'fail-3' });
        assert.deepEqual(ch.max3.map(count), [1, 1, 1, 0]);
    });

    test('an upstream error, then a channel not reached: that error comes back', async () => {
        for (const stream of [false, true]) {
            const r = await gw.chat(key, M.errThenConn, { extra: { stream } });
            assertError(r, 500, { type: 'upstream_error', message: 'A broke' });
        }
        const m = await gw.messages(key, M.errThenConn);
        assert.equal(m.status, 500, m.text);
        assert.equal(m.json.type, 'error', m.text);
        assert.match(m.json.error.message, /A broke/);
    });

    test('a 5xx nginx would not retry moves on too, and comes back when no later channel answers', async () => {
        const ok = await gw.chat(key, M.on529);
        assert.equal(ok.status, 200, ok.text);
        assert.equal(ok.json.choices[0].message.content, 'from B');
        for (const stream of [false, true]) {
            const r = await gw.chat(key, M.on529Conn, { extra: { stream } });
            assertError(r, 529, { type: 'upstream_error', message: 'A overloaded' });
        }
        const m = await gw.messages(key, M.on529Conn);
        assert.equal(m.status, 529, m.text);
        assert.equal(m.json.type, 'error', m.text);
        assert.match(m.json.error.message, /A overloaded/);
    });

    test('an upstream 304 is no answer: the next channel, else 502 bad_response_status_code', async () => {
        const ok = await gw.chat(key, M.on304);
        assert.equal(ok.status, 200, ok.text);
        assert.equal(ok.json.choices[0].message.content, 'from B');
        const r = await gw.chat(key, M.on304Only);
        assertError(r, 502, { type: 'upstream_error', code: 'bad_response_status_code' });

        /* two requests in one write on one connection: the error is framed
           (its length, its body), and the next answer follows it */
        const req = (model, conn) => {
            const body = JSON.stringify({ model, messages: [{ role: 'user', content: 'hi' }] });
            return `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\n` +
                `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n` +
                `Connection: ${conn}\r\n\r\n${body}`;
        };
        const raw = await new Promise((resolve, reject) => {
            const sock = net.connect(gw.port, '127.0.0.1');
            let out = '';
            sock.setTimeout(10000, () => { sock.destroy(); reject(new Error(`timeout: ${out}`)); });
            sock.on('connect', () => sock.write(req(M.on304Only, 'keep-alive') + req(M.on529, 'close')));
            sock.on('data', (d) => { out += d; });
            sock.on('end', () => resolve(out));
            sock.on('error', reject);
        });
        const first = raw.match(/^HTTP\/1\.1 502 [^\r]*\r\n([\s\S]*?)\r\n\r\n/);
        assert.ok(first, raw);
        const len = Number(first[1].match(/content-length: (\d+)/i)?.[1]);
        const body = raw.slice(first[0].length, first[0].length + len);
        assert.equal(JSON.parse(body).error.code, 'bad_response_status_code', raw);
        assert.match(raw.slice(first[0].length + len), /^HTTP\/1\.1 200 [\s\S]*from B/, raw);
    });

    test('every channel unreachable: 502 do_request_failed', async () => {
        const r = await gw.chat(key, M.allConn);
        assertError(r, 502, { code: 'do_request_failed' });
    });

    test('a channel whose host has no address is passed over; alone it is a 502', async () => {
        const pids = gw.workerPids().sort();
        for (let i = 0; i < 4; i++) {
            const r = await gw.chat(key, M.noAddr);
            assertOk(r);
            assert.equal(r.json.choices[0].message.content, 'from B');
            assertError(await gw.chat(key, M.noAddrOnly), 502, { code: 'do_request_failed' });
        }
        assert.equal(count(ch.noAddr[1]), 4);
        assert.deepEqual(gw.workerPids().sort(), pids, 'no worker died');
    });

    test('a status line that arrives in two pieces is read whole', async () => {
        for (let i = 0; i < 2; i++) {
            const r = await gw.chat(key, M.split);
            assertOk(r);
            assert.equal(r.json.choices[0].message.content, 'split status');
        }
    });

    test('a try cut off inside a header line leaves nothing behind for the next channel', async () => {
        for (let i = 0; i < 2; i++) {
            const r = await gw.chat(key, M.cutHeader);
            assertOk(r);
            assert.equal(r.json.choices[0].message.content, 'from B');
        }
    });

    test('an answer ended by the upstream closing: charged when it is one, not when it is none', async () => {
        const good = await gw.chat(key, M.closeGood);
        assertOk(good);
        assert.equal(good.json.choices[0].message.content, 'closed');
        /* its head went out before the end could be seen: passed on as it
           came, but an error row, and nothing charged */
        const bad = await gw.chat(key, M.closeBad);
        assert.equal(bad.status, 200);
        assert.equal(bad.text, '<html>maintenance</html>');
        const g = await waitLogs(gw, { model: M.closeGood }, (items) => items.length === 1);
        assert.equal(g.items[0].type, 'consume');
        assert.equal(Number(g.items[0].quota), 10 + 20 * 2);
        const b = await waitLogs(gw, { model: M.closeBad }, (items) => items.length === 1);
        assert.equal(b.items[0].type, 'error');
        assert.equal(Number(b.items[0].quota), 0);
        assert.equal(Number(b.items[0].status ?? b.items[0].code), 502);
        assert.match(gw.errorLog(), /without a JSON answer, ended by its closing/);
    });

    test('an answer ended by the upstream closing, too large to convert: cut short, nothing charged', async () => {
        /* none of it in the channel's format reaches the client: the
           connection is cut (nginx had not written the head yet) */
        let text = '';
        try {
            text = (await gw.chat(key, M.closeLarge, { timeoutMs: 60000 })).text;
        } catch (e) {
            assert.match(e.message, /socket hang up|aborted|ECONNRESET/);
        }
        assert.ok(!text.includes('candidates'), text.slice(0, 200));
        const row = (await waitLogs(gw, { model: M.closeLarge }, (items) => items.length === 1)).items[0];
        assert.equal(Number(row.quota), 0, JSON.stringify(row));
        assert.equal(Number(row.status), 502, JSON.stringify(row));
    });

    test('no retry once a stream has started', async () => {
        const [a, b] = ch.stream;
        const r = await gw.chat(key, M.stream, { extra: { stream: true } });
        assert.equal(r.status, 200, r.text);
        assert.ok(r.text.includes('partial'), `the started stream reached the client: ${r.text}`);
        assert.equal(count(a), 1);
        assert.equal(count(b), 0, 'the second channel was not tried');
    });

    test('llmgw_max_tries 2 limits the tries', async () => {
        const r = await gw2.chat(key, M.tries2);
        assertError(r, 500, { type: 'upstream_error', message: 't2-fail-2' });
        assert.deepEqual(ch.tries2.map(count), [1, 1, 0]);
    });

    test('the highest priority enabled channel serves every request', async () => {
        const rs = await times(10, () => gw.chat(key, M.prio));
        for (const r of rs) {
            assertOk(r);
            assert.equal(r.json.choices[0].message.content, 'high');
        }
        assert.deepEqual(ch.prio.map(count), [10, 0, 0]);
    });

    test('weights split traffic inside one priority', async () => {
        for (let i = 0; i < 8; i++) {
            const rs = await times(10, () => gw.chat(key, M.weight));
            rs.forEach((r) => assertOk(r));
        }
        const [heavy, light] = ch.weight.map(count);
        assert.equal(heavy + light, 80);
        assert.ok(light > 0, `weight 1 channel got ${light} of 80`);
        assert.ok(heavy > light, `weight 3: ${heavy}, weight 1: ${light}`);
    });
});

describe('a kept-alive channel connection that closes without answering', { timeout: 60000 }, () => {
    let db, gw, key, a, b;
    const M = uniq('gpt-kaclose');

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, workers: 1 });
        a = await startMock(answer('from A'));
        b = await startMock(answer('from B'));
        await makeChannel(gw, { base_url: a.url, models: [M], priority: 10 });
        await makeChannel(gw, { base_url: b.url, models: [M], priority: 5 });
        ({ key } = await makeUserKey(gw));
        await settle();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await a?.close();
            await b?.close();
            await dropDb(db);
        }
    });

    test('is retried once afresh, then the next channel: the tries stay bounded', async () => {
        assertOk(await gw.chat(key, M));        /* A's connection is kept */
        /* from now on A reads each request and hangs up */
        a.handler = (req) => { req.socket.destroy(); };
        a.reset();
        const t0 = Date.now();
        const r = await gw.chat(key, M, { timeoutMs: 10000 });
        assertOk(r);
        assert.equal(r.json.choices[0].message.content, 'from B');
        assert.ok(Date.now() - t0 < 3000, `answered after ${Date.now() - t0} ms`);
        assert.equal(a.requests.length, 2, 'A: the kept connection, then one new one');
        /* A alone: a 502, after the same two tries */
        b.handler = (req) => { req.socket.destroy(); };
        a.reset();
        b.reset();
        const r2 = await gw.chat(key, M, { timeoutMs: 10000 });
        assertError(r2, 502, { code: 'do_request_failed' });
        assert.ok(a.requests.length <= 2 && b.requests.length <= 2,
            `tries: A ${a.requests.length}, B ${b.requests.length}`);
    });
});
