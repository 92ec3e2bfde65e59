// What counts as an answer: a 2xx whose body is no answer (HTML, broken or
// cut JSON, nothing) is an upstream fault that the next channel takes over
// and that is never charged; a connect timeout moves on, a read timeout is
// final; streams cut short are billed for their prompt and what was
// delivered, and a converted stream cut short says so instead of [DONE].

import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, idList, makeChannel, makeUserKey, sleep,
    sseEvents, startGateway, tearDown, uniq, waitLogs,
} from '../lib/harness.mjs';
import {
    anthropicStream, hang, openaiChat, sendJson, startMock,
} from '../lib/mock.mjs';

/* One Anthropic stream event, its type in the data as Anthropic writes it. */
function anthropicEvent(res, name, data) {
    res.write(`event: ${name}\ndata: ${JSON.stringify({ type: name, ...data })}\n\n`);
}

describe('answers and faults', { timeout: 180000 }, () => {
    let db, gw, bad, good, silent;
    const sockets = new Set();

    before(async () => {
        db = await createDb();
        bad = await startMock();
        good = await startMock();
        /* accepts TCP and never speaks: a TLS handshake to it times out
           before any of the request went out */
        silent = net.createServer((s) => { sockets.add(s); s.on('error', () => {}); });
        await new Promise((r) => silent.listen(0, '127.0.0.1', r));
        gw = await startGateway({
            db,
            http: 'llmgw_connect_timeout 500ms; llmgw_read_timeout 1500ms;',
        });
    });

    after(async () => {
        for (const s of sockets) {
            s.destroy();
        }
        silent?.close();
        await tearDown(db, [gw], [bad, good]);
    });

    /* A model on the faulty mock (priority 10) with a good backup. */
    async function pair(primaryUrl = bad.url, { backup = true } = {}) {
        const model = uniq('ans');
        const primary = await makeChannel(gw, { base_url: primaryUrl, models: [model], priority: 10 });
        const second = backup
            ? await makeChannel(gw, { base_url: good.url, models: [model], priority: 0 })
            : null;
        await sleep(1100);
        return { model, primary, second };
    }

    async function rowOf(r) {
        const id = r.headers['x-request-id'];
        const { items } = await waitLogs(gw, { page_size: 1000 },
            (it) => it.some((i) => i.request_id === id));
        const row = items.find((i) => i.request_id === id);
        return { ...row, channels_tried: idList(row.channels_tried) };
    }

    const faults = {
        'an HTML page': (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/html' });
            res.end('<html><body>' + 'welcome '.repeat(2000) + '</body></html>');
        },
        'broken JSON': (req, res) => sendJson(res, 200, '{"id":"x","choices":[{"message":'),
        'an empty body': (req, res) => sendJson(res, 200, ''),
        'an error object': (req, res) => sendJson(res, 200, {
            error: { message: 'bad', type: 'invalid_request_error', code: null } }),
        'a JSON body cut short': (req, res) => {
            const body = JSON.stringify(openaiChat({ content: 'y'.repeat(4000) }));
            res.writeHead(200, { 'Content-Type': 'application/json',
                'Content-Length': Buffer.byteLength(body) });
            res.write(body.slice(0, 1000));
            setTimeout(() => res.destroy(), 50);
        },
        'a chunked JSON body cut short': (req, res) => {
            res.writeHead(200, { 'Content-Type': 'application/json' });
            res.write(JSON.stringify(openaiChat()).slice(0, 40));
            setTimeout(() => res.destroy(), 50);
        },
    };

    for (const [what, handler] of Object.entries(faults)) {
        test(`a 200 with ${what} goes to the next channel, charged once`, async () => {
            bad.handler = handler;
            const { model, primary, second } = await pair();
            const { key } = await makeUserKey(gw);
            const r = await gw.chat(key, model);
            assertOk(r);
            assert.equal(r.json.choices[0].message.content, 'hello from mock');
            assert.equal(r.headers['content-length'], String(Buffer.byteLength(r.text)));
            const row = await rowOf(r);
            assert.equal(row.type, 'consume', JSON.stringify(row));
            assert.equal(row.channel_id, second.id);
            assert.deepEqual(row.channels_tried, [primary.id, second.id]);
        });
    }

    test('a 200 that is no answer, with no other channel: 502 bad_response_body, nothing charged',
        async () => {
            bad.handler = faults['an HTML page'];
            const { model } = await pair(bad.url, { backup: false });
            await gw.admin('PUT', '/api/pricing', { [model]: { ratio: 1, completion_ratio: 1 } });
            const { key, token } = await makeUserKey(gw, {},
                { unlimited_quota: false, remain_quota: 100000 });
            await sleep(1100);
            for (const stream of [false, true]) {
                const r = await gw.chat(key, model, { extra: { stream } });
                assertError(r, 502, { type: 'upstream_error', code: 'bad_response_body' });
                const row = await rowOf(r);
                assert.equal(row.type, 'error');
                assert.equal(row.quota, 0);
            }
            const t = (await gw.admin('GET', `/api/token/${token.id}`)).json;
            assert.equal(t.used_quota, 0);
            assert.equal(t.remain_quota, 100000);
        });

    test('an error object under a 200 on the native paths: 502 bad_response_body, nothing charged; an answer with error: null passes',
        async () => {
            const { key, token } = await makeUserKey(gw, {},
                { unlimited_quota: false, remain_quota: 100000 });
            const native = {
                chat: { type: 1, body: { error: { message: 'bad', type: 'invalid_request_error' } },
                    answer: { ...openaiChat({ content: 'fine',
                        usage: { prompt_tokens: 3, completion_tokens: 2 } }), error: null } },
                messages: { type: 14, body: { type: 'error',
                    error: { type: 'overloaded_error', message: 'bad' } },
                answer: { id: 'msg_1', type: 'message', role: 'assistant', model: 'm',
                    content: [{ type: 'text', text: 'fine' }], stop_reason: 'end_turn',
                    error: null, usage: { input_tokens: 3, output_tokens: 2 } } },
                gemini: { type: 24, body: { error: { code: 400, message: 'bad',
                    status: 'INVALID_ARGUMENT' } },
                answer: { candidates: [{ content: { role: 'model', parts: [{ text: 'fine' }] },
                    finishReason: 'STOP', index: 0 }], error: null,
                    usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 2 } } },
            };
            for (const [call, { type, body, answer }] of Object.entries(native)) {
                const model = uniq('ans-err');
                await makeChannel(gw, { type, base_url: bad.url, models: [model] });
                await gw.admin('PUT', '/api/pricing', { [model]: { ratio: 1, completion_ratio: 1 } });
                await sleep(1100);
                const ask = () => (call === 'gemini'
                    ? gw.req('POST', `/v1beta/models/${model}:generateContent`, { key, body: {
                        contents: [{ role: 'user', parts: [{ text: 'hi' }] }] } })
                    : gw[call](key, model));
                bad.handler = (req, res) => sendJson(res, 200, body);
                const r = await ask();
                assertError(r, 502, { type: 'upstream_error', code: 'bad_response_body' });
                const row = await rowOf(r);
                assert.equal(row.type, 'error', `${call}: ${JSON.stringify(row)}`);
                assert.equal(row.quota, 0, `${call}: ${JSON.stringify(row)}`);

                bad.handler = (req, res) => sendJson(res, 200, answer);
                const ok = assertOk(await ask(), call);
                assert.ok(ok.text.includes('fine'), ok.text);
                const paid = await rowOf(ok);
                assert.equal(paid.type, 'consume', `${call}: ${JSON.stringify(paid)}`);
                assert.equal(paid.quota, 5, `${call}: ${JSON.stringify(paid)}`);
            }
            const t = (await gw.admin('GET', `/api/token/${token.id}`)).json;
            assert.ok(t.used_quota <= 15, JSON.stringify(t));
        });

    test('held answers: cut on the last channel is JSON 502; slow bodies get the read timeout per read',
        async () => {
            const { key } = await makeUserKey(gw);
            bad.handler = faults['a JSON body cut short'];
            const alone = await pair(bad.url, { backup: false });
            const cut = await gw.chat(key, alone.model);
            assertError(cut, 502, {});
            assert.match(cut.headers['content-type'], /application\/json/);

            /* five pieces 700 ms apart under a 1500 ms read timeout */
            bad.handler = async (req, res) => {
                const body = JSON.stringify(openaiChat({ content: 'slow' }));
                res.writeHead(200, { 'Content-Type': 'application/json',
                    'Content-Length': Buffer.byteLength(body) });
                const step = Math.ceil(body.length / 5);
                for (let i = 0; i < body.length; i += step) {
                    res.write(body.slice(i, i + step));
                    await sleep(700);
                }
                res.end();
            };
            const slow = await gw.chat(key, alone.model, { timeoutMs: 10000 });
            assertOk(slow);
            assert.equal(slow.json.choices[0].message.content, 'slow');
        });

    test('a body cut on a kept-alive connection goes to the next channel, logged', async () => {
        let n = 0;
        bad.handler = (req, res, rec) => {
            n++;
            if (n % 2 === 1) {
                return sendJson(res, 200, openaiChat({ content: 'whole' }));
            }
            return faults['a JSON body cut short'](req, res, rec);
        };
        const { model, primary, second } = await pair();
        const { key } = await makeUserKey(gw);
        /* one connection: the first answer leaves it kept alive */
        assertOk(await gw.chat(key, model));
        bad.reset();
        good.reset();
        const r = await gw.chat(key, model);
        assertOk(r);
        assert.equal(r.json.choices[0].message.content, 'hello from mock');
        assert.equal(bad.requests.length, 1, 'the cut channel got the request once');
        assert.deepEqual((await rowOf(r)).channels_tried, [primary.id, second.id]);
    });

    test('a 204 is no answer; an interim 103 before the answer is skipped', async () => {
        const { key } = await makeUserKey(gw);
        bad.handler = (req, res) => { res.writeHead(204); res.end(); };
        const alone = await pair(bad.url, { backup: false });
        assertError(await gw.chat(key, alone.model), 502, { type: 'upstream_error', code: 'bad_response_body' });

        bad.handler = (req, res) => {
            res.writeEarlyHints({ link: '</x>; rel=preload' });
            sendJson(res, 200, openaiChat({ content: 'after hints' }));
        };
        const r = await gw.chat(key, alone.model);
        assertOk(r);
        assert.equal(r.json.choices[0].message.content, 'after hints');
    });

    test('an upstream error is read whole: one cut short is a transport error', async () => {
        bad.handler = (req, res) => {
            const body = JSON.stringify({ error: { message: 'bad things '.repeat(200),
                type: 'invalid_request_error' } });
            res.writeHead(400, { 'Content-Type': 'application/json',
                'Content-Length': Buffer.byteLength(body) });
            res.write(body.slice(0, 100));
            setTimeout(() => res.destroy(), 50);
        };
        const { model, primary, second } = await pair();
        const { key } = await makeUserKey(gw);
        const r = await gw.chat(key, model);
        assertOk(r);
        assert.deepEqual((await rowOf(r)).channels_tried, [primary.id, second.id]);

        /* a whole one comes back complete, with its length */
        bad.handler = (req, res) => sendJson(res, 400,
            { error: { message: 'no such thing', type: 'invalid_request_error' } });
        const whole = await pair(bad.url, { backup: false });
        const e = await gw.chat(key, whole.model);
        assertError(e, 400, { type: 'upstream_error' });
        assert.match(e.json.error.message, /^no such thing \(request id: /);
        assert.equal(e.headers['content-length'], String(Buffer.byteLength(e.text)));
        assert.equal(e.aborted, false);
    });

    test('a connect timeout goes to the next channel; a read timeout is final', async () => {
        const slow = await pair(`https://127.0.0.1:${silent.address().port}`);
        const { key } = await makeUserKey(gw);
        const t0 = Date.now();
        const r = await gw.chat(key, slow.model);
        assertOk(r);
        assert.ok(Date.now() - t0 < 2500, `took ${Date.now() - t0} ms`);
        assert.deepEqual((await rowOf(r)).channels_tried, [slow.primary.id, slow.second.id]);

        bad.handler = hang;
        const stuck = await pair();
        good.reset();
        const r2 = await gw.chat(key, stuck.model);
        assertError(r2, 504, { code: 'do_request_failed' });
        assert.equal(good.requests.length, 0, 'the backup was not tried');
    });

    test('a stream request answered with JSON under another Content-Type is a stream', async () => {
        bad.handler = (req, res) => sendJson(res, 200, openaiChat({
            model: 'x', content: 'whole', usage: { prompt_tokens: 7, completion_tokens: 3 },
        }), { 'Content-Type': 'text/plain' });
        const { model } = await pair(bad.url, { backup: false });
        const { key } = await makeUserKey(gw);
        const r = await gw.chat(key, model, { extra: { stream: true } });
        assertOk(r);
        assert.match(r.headers['content-type'], /text\/event-stream/);
        const evs = sseEvents(r.text);
        assert.equal(evs.at(-1).data, '[DONE]');
        assert.ok(r.text.includes('whole'), r.text);
        const row = await rowOf(r);
        assert.equal(row.prompt_tokens, 7);
        assert.equal(row.completion_tokens, 3);
    });

    test('a Content-Type that only mentions text/event-stream is no stream: its JSON is made one', async () => {
        bad.handler = (req, res) => sendJson(res, 200, openaiChat({
            model: 'x', content: 'whole', usage: { prompt_tokens: 5, completion_tokens: 2 },
        }), { 'Content-Type': 'application/json; profile=text/event-stream' });
        const { model } = await pair(bad.url, { backup: false });
        const { key } = await makeUserKey(gw);
        const r = await gw.chat(key, model, { extra: { stream: true } });
        assertOk(r);
        assert.match(r.headers['content-type'], /^text\/event-stream/);
        const evs = sseEvents(r.text);
        assert.equal(evs.at(-1).data, '[DONE]', r.text);
        assert.ok(r.text.includes('whole'), r.text);
        const row = await rowOf(r);
        assert.equal(row.prompt_tokens, 5);
        assert.equal(row.completion_tokens, 2);
    });

    test('events labelled text/plain are streamed as they come, and billed', async () => {
        bad.handler = async (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/plain' });
            const chunk = (body) => res.write(`data: ${JSON.stringify({
                id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'x', ...body,
            })}\n\n`);
            chunk({ choices: [{ index: 0, delta: { role: 'assistant', content: 'first' },
                finish_reason: null }] });
            await sleep(600);
            chunk({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] });
            chunk({ choices: [], usage: { prompt_tokens: 4, completion_tokens: 2,
                total_tokens: 6 } });
            res.end('data: [DONE]\n\n');
        };
        const { model } = await pair(bad.url, { backup: false });
        const { key } = await makeUserKey(gw);
        const r = await gw.chat(key, model, { extra: { stream: true } });
        assertOk(r);
        const first = r.chunks.find((c) => c.text.includes('first'));
        assert.ok(first && r.tEnd - first.t >= 400, 'the first event came before the rest');
        assert.equal(sseEvents(r.text).at(-1).data, '[DONE]');
        assert.ok(!r.text.includes('"usage"'), 'the usage chunk it did not ask for is hidden');
        const row = await rowOf(r);
        assert.equal(row.prompt_tokens, 4);
        assert.equal(row.completion_tokens, 2);
    });

    /* A streaming chat whose reader hangs up once `until` shows up. */
    function chatUntil(key, model, body, until) {
        return new Promise((resolve, reject) => {
            const req = http.request(`${gw.url}/v1/chat/completions`, {
                method: 'POST',
                headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
            }, (res) => {
                let text = '';
                res.setEncoding('utf8');
                res.on('data', (c) => {
                    text += c;
                    if (text.includes(until)) {
                        req.destroy();
                        resolve({ headers: res.headers, text });
                    }
                });
                res.on('end', () => resolve({ headers: res.headers, text }));
            });
            req.on('error', () => {});
            setTimeout(() => reject(new Error('no answer in 10 s')), 10000).unref();
            req.end(JSON.stringify({ model, stream: true, ...body }));
        });
    }

    test('a reader that hangs up before the usage chunk still pays for its prompt', async () => {
        bad.handler = async (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/event-stream' });
            const chunk = (delta, finish = null) => res.write(`data: ${JSON.stringify({
                id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'x',
                choices: [{ index: 0, delta, finish_reason: finish }],
            })}\n\n`);
            chunk({ role: 'assistant', content: 'z'.repeat(40) });
            chunk({}, 'stop');
            await sleep(3000);
            res.destroy();
        };
        const { model } = await pair(bad.url, { backup: false });
        const { key } = await makeUserKey(gw);
        const prompt = 'p'.repeat(4000);
        const r = await chatUntil(key, model,
            { messages: [{ role: 'user', content: prompt }] }, '"finish_reason":"stop"');
        const row = await rowOf(r);
        assert.equal(row.type, 'consume');
        assert.equal(row.status, 499, 'the row says the client left');
        assert.ok(row.prompt_tokens >= 900, JSON.stringify(row));
        assert.equal(row.completion_tokens, 10, JSON.stringify(row));
    });

    test('tool arguments count in a stream billed by estimate', async () => {
        bad.handler = async (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/event-stream' });
            for (let i = 0; i < 4; i++) {
                res.write(`data: ${JSON.stringify({
                    id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'x',
                    choices: [{ index: 0, finish_reason: null, delta: { tool_calls: [{
                        index: 0, ...(i === 0 ? { id: 'call_1', type: 'function' } : {}),
                        function: { ...(i === 0 ? { name: 'f' } : {}), arguments: 'a'.repeat(100) },
                    }] } }],
                })}\n\n`);
            }
            await sleep(100);
            res.destroy();
        };
        const { model } = await pair(bad.url, { backup: false });
        const { key } = await makeUserKey(gw);
        const r = await gw.chat(key, model, { extra: { stream: true } });
        assert.equal(r.status, 200);
        const row = await rowOf(r);
        assert.equal(row.completion_tokens, 100, JSON.stringify(row));
    });

    test('an Anthropic stream cut short: billed for what was delivered, not the 1 of message_start',
        async () => {
            bad.handler = async (req, res) => {
                res.writeHead(200, { 'Content-Type': 'text/event-stream' });
                const ev = (name, data) => anthropicEvent(res, name, data);
                ev('message_start', { message: { id: 'msg_1', type: 'message',
                    role: 'assistant', model: 'x', content: [],
                    usage: { input_tokens: 50, output_tokens: 1 } } });
                ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
                for (let i = 0; i < 4; i++) {
                    ev('content_block_delta', { index: 0,
                        delta: { type: 'text_delta', text: 'q'.repeat(100) } });
                }
                await sleep(100);
                res.destroy();
            };
            const model = uniq('ans-claude');
            await makeChannel(gw, { type: 14, base_url: bad.url, models: [model] });
            await sleep(1100);
            const { key } = await makeUserKey(gw);

            const m = await gw.messages(key, model, { extra: { stream: true } });
            assert.equal(m.status, 200);
            const mrow = await rowOf(m);
            assert.equal(mrow.type, 'consume');
            assert.equal(mrow.status, 502, 'the row says the upstream cut it');
            assert.equal(mrow.prompt_tokens, 50);
            assert.equal(mrow.completion_tokens, 100, JSON.stringify(mrow));

            /* a chat client of that channel learns the answer was cut */
            const c = await gw.chat(key, model, { extra: { stream: true } });
            assert.equal(c.status, 200);
            const evs = sseEvents(c.text);
            assert.ok(!evs.some((e) => e.data === '[DONE]'), c.text);
            const last = JSON.parse(evs.at(-1).data);
            assert.match(last.error.message, /ended before its finish reason/);
            assert.equal((await rowOf(c)).completion_tokens, 100);
        });

    test('a converted stream the upstream ends cleanly but short of its end: an error event, and a 502 row', async () => {
        /* Anthropic, for a chat client: no message_delta, no message_stop */
        bad.handler = async (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/event-stream' });
            const ev = (name, data) => anthropicEvent(res, name, data);
            ev('message_start', { message: { id: 'msg_2', type: 'message',
                role: 'assistant', model: 'x', content: [],
                usage: { input_tokens: 30, output_tokens: 1 } } });
            ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
            ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'w'.repeat(80) } });
            res.end();
        };
        const claude = uniq('ans-claude-end');
        await makeChannel(gw, { type: 14, base_url: bad.url, models: [claude] });
        /* OpenAI, for a messages client: no finish_reason, no [DONE] */
        const goodHandler = good.handler;
        good.handler = (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/event-stream' });
            res.end(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk',
                choices: [{ index: 0, delta: { role: 'assistant', content: 'v'.repeat(80) } }] })}\n\n`);
        };
        const gpt = uniq('ans-gpt-end');
        await makeChannel(gw, { base_url: good.url, models: [gpt] });
        await sleep(1100);
        const { key } = await makeUserKey(gw);

        const c = await gw.chat(key, claude, { extra: { stream: true } });
        assert.equal(c.status, 200);
        const last = JSON.parse(sseEvents(c.text).at(-1).data);
        assert.match(last.error.message, /ended before its finish reason/);
        const crow = await rowOf(c);
        assert.equal(crow.status, 502, JSON.stringify(crow));
        assert.equal(crow.type, 'consume');
        assert.equal(crow.completion_tokens, 20, 'what was delivered');

        try {
            const m = await gw.messages(key, gpt, { extra: { stream: true } });
            assert.equal(m.status, 200);
            const mev = sseEvents(m.text).at(-1);
            assert.equal(mev.event, 'error', m.text);
            const mrow = await rowOf(m);
            assert.equal(mrow.status, 502, JSON.stringify(mrow));
            assert.equal(mrow.completion_tokens, 20);
        } finally {
            good.handler = goodHandler;
        }
    });

    test('a stream passed on as it came, ended cleanly but short of its end: a 502 row; one that said its end: 200',
        async () => {
            const chunk = (obj) => `data: ${JSON.stringify(obj)}\n\n`;
            const oaChunk = (content, finish = null) => chunk({ id: 'c', object: 'chat.completion.chunk',
                choices: [{ index: 0, delta: { content }, finish_reason: finish }] });
            /* what each mock answers, by the model the gateway sent */
            const streams = {
                'oa-short': [oaChunk('v'.repeat(80))],
                /* a finish reason and no [DONE]: complete */
                'oa-finished': [oaChunk('v'.repeat(80)), oaChunk('', 'stop')],
                'claude-short': [
                    `event: message_start\n${chunk({ type: 'message_start', message: { id: 'm',
                        type: 'message', role: 'assistant', content: [],
                        usage: { input_tokens: 30, output_tokens: 1 } } })}`,
                    `event: content_block_delta\n${chunk({ type: 'content_block_delta', index: 0,
                        delta: { type: 'text_delta', text: 'w'.repeat(80) } })}`,
                ],
                'gemini-short': [chunk({ candidates: [{ index: 0,
                    content: { role: 'model', parts: [{ text: 'g'.repeat(80) }] } }] })],
                'gemini-finished': [chunk({ candidates: [{ index: 0, finishReason: 'STOP',
                    content: { role: 'model', parts: [{ text: 'g'.repeat(80) }] } }] })],
            };
            const handler = good.handler;
            good.handler = (req, res, rec) => {
                const which = Object.keys(streams).find((k) => req.url.includes(k)
                    || rec.json?.model?.includes(k));
                res.writeHead(200, { 'Content-Type': 'text/event-stream' });
                res.end(streams[which].join(''));
            };
            try {
                const m = Object.fromEntries(Object.keys(streams).map((k) => [k, uniq(k)]));
                await makeChannel(gw, { base_url: good.url, models: [m['oa-short'], m['oa-finished']] });
                await makeChannel(gw, { type: 14, base_url: good.url, models: [m['claude-short']] });
                await makeChannel(gw, { type: 24, base_url: good.url,
                    models: [m['gemini-short'], m['gemini-finished']] });
                await sleep(1100);
                const { key } = await makeUserKey(gw);
                const gemini = (model) => gw.req('POST',
                    `/v1beta/models/${model}:streamGenerateContent?alt=sse`,
                    { key, body: { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] } });

                const calls = {
                    'oa-short': [() => gw.chat(key, m['oa-short'], { extra: { stream: true } }), 502],
                    'oa-finished': [() => gw.chat(key, m['oa-finished'], { extra: { stream: true } }), 200],
                    'claude-short': [() => gw.messages(key, m['claude-short'], { extra: { stream: true } }), 502],
                    'gemini-short': [() => gemini(m['gemini-short']), 502],
                    'gemini-finished': [() => gemini(m['gemini-finished']), 200],
                };
                for (const [name, [call, status]] of Object.entries(calls)) {
                    const r = await call();
                    assert.equal(r.status, 200, `${name}: ${r.text}`);
                    assert.ok(/([vwg])\1{79}/.test(r.text), `${name}: the text came through`);
                    const row = await rowOf(r);
                    assert.equal(row.status, status, `${name}: ${JSON.stringify(row)}`);
                    assert.equal(row.type, 'consume', name);
                    assert.equal(row.completion_tokens, 20, `${name}: what was delivered`);
                }
            } finally {
                good.handler = handler;
            }
        });

    test('a Gemini stream with no usageMetadata: a chat client that asked for usage gets what it is billed', async () => {
        bad.handler = (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/event-stream' });
            for (const [text, finish] of [['x'.repeat(40), undefined], ['y'.repeat(40), 'STOP']]) {
                res.write(`data: ${JSON.stringify({ candidates: [{ index: 0,
                    content: { role: 'model', parts: [{ text }] },
                    ...(finish ? { finishReason: finish } : {}) }] })}\r\n\r\n`);
            }
            res.end();
        };
        const model = uniq('ans-gem-nouse');
        await makeChannel(gw, { type: 24, base_url: bad.url, models: [model] });
        await sleep(1100);
        const { key } = await makeUserKey(gw);
        const c = await gw.chat(key, model, {
            extra: { stream: true, stream_options: { include_usage: true } },
        });
        assertOk(c);
        const evs = sseEvents(c.text);
        assert.equal(evs.at(-1).data, '[DONE]');
        const usage = JSON.parse(evs.at(-2).data);
        assert.deepEqual(usage.choices, [], c.text);
        const row = await rowOf(c);
        assert.equal(usage.usage.prompt_tokens, row.prompt_tokens, JSON.stringify(row));
        assert.equal(usage.usage.completion_tokens, row.completion_tokens);
        assert.equal(row.completion_tokens, 20, '80 bytes of text, 4 to a token');

        /* one that did not ask gets no usage chunk */
        const plain = await gw.chat(key, model, { extra: { stream: true } });
        assert.ok(!sseEvents(plain.text).some((e) => e.data.includes('"usage"')), plain.text);

        /* Anthropic: no usage anywhere, or only message_start's partial 1 */
        for (const startUsage of [undefined, { input_tokens: 50, output_tokens: 1 }]) {
            bad.handler = (req, res) => {
                res.writeHead(200, { 'Content-Type': 'text/event-stream' });
                const ev = (name, data) => anthropicEvent(res, name, data);
                ev('message_start', { message: { id: 'msg_3', type: 'message', role: 'assistant',
                    model: 'x', content: [], ...(startUsage ? { usage: startUsage } : {}) } });
                ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
                ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'z'.repeat(120) } });
                ev('content_block_stop', { index: 0 });
                ev('message_delta', { delta: { stop_reason: 'end_turn' } });
                ev('message_stop', {});
                res.end();
            };
            const claude = uniq('ans-claude-nouse');
            await makeChannel(gw, { type: 14, base_url: bad.url, models: [claude] });
            await sleep(1100);
            const a = await gw.chat(key, claude, {
                extra: { stream: true, stream_options: { include_usage: true } },
            });
            assertOk(a);
            const aev = sseEvents(a.text);
            assert.equal(aev.at(-1).data, '[DONE]');
            const au = JSON.parse(aev.at(-2).data);
            const arow = await rowOf(a);
            assert.equal(au.usage.prompt_tokens, arow.prompt_tokens, a.text);
            assert.equal(au.usage.completion_tokens, arow.completion_tokens, a.text);
            assert.equal(arow.completion_tokens, 30, '120 bytes delivered, 4 to a token');
            assert.equal(aev.filter((e) => e.data.includes('"usage"')).length, 1, a.text);
        }

        /* a Messages client of an OpenAI channel that reports no usage: its
           message_delta says what is billed */
        bad.handler = (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/event-stream' });
            for (const [content, finish] of [['q'.repeat(60), null], ['', 'stop']]) {
                res.write(`data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk',
                    choices: [{ index: 0, delta: { content }, finish_reason: finish }] })}\n\n`);
            }
            res.end('data: [DONE]\n\n');
        };
        const gpt = uniq('ans-gpt-nouse');
        await makeChannel(gw, { base_url: bad.url, models: [gpt] });
        await sleep(1100);
        const m = await gw.messages(key, gpt, { extra: { stream: true } });
        assertOk(m);
        const delta = sseEvents(m.text).find((e) => e.event === 'message_delta');
        assert.ok(delta, m.text);
        const mrow = await rowOf(m);
        const du = JSON.parse(delta.data).usage;
        assert.equal(du.output_tokens, mrow.completion_tokens, m.text);
        assert.equal(du.input_tokens + du.cache_read_input_tokens, mrow.prompt_tokens, m.text);
        assert.equal(mrow.completion_tokens, 15, '60 bytes delivered, 4 to a token');
    });

    test('a Gemini stream event of 2 MiB (inline audio) is read for its usage', async () => {
        const audio = 'A'.repeat(2 * 1024 * 1024);
        bad.handler = (req, res) => {
            res.writeHead(200, { 'Content-Type': 'text/event-stream' });
            res.write(`data: ${JSON.stringify({
                candidates: [{ content: { role: 'model', parts: [{ inlineData: {
                    mimeType: 'audio/L16;codec=pcm;rate=24000', data: audio } }] },
                finishReason: 'STOP', index: 0 }],
                usageMetadata: { promptTokenCount: 10, candidatesTokenCount: 750,
                    totalTokenCount: 760 },
            })}\r\n\r\n`);
            res.end();
        };
        const model = uniq('ans-tts');
        await makeChannel(gw, { type: 24, base_url: bad.url, models: [model] });
        await sleep(1100);
        const { key } = await makeUserKey(gw);
        const r = await gw.req('POST', `/v1beta/models/${model}:streamGenerateContent?alt=sse`, {
            key, body: { contents: [{ role: 'user', parts: [{ text: 'say hi' }] }],
                generationConfig: { responseModalities: ['AUDIO'] } },
        });
        assertOk(r);
        assert.ok(r.text.includes(audio), 'the audio came through whole');
        const row = await rowOf(r);
        assert.equal(row.prompt_tokens, 10, JSON.stringify(row));
        assert.equal(row.completion_tokens, 750, JSON.stringify(row));
    });

    test('an answer over the 16 MiB hold limit: billed by its usage; not converted but refused', async () => {
        const echoHandler = good.handler;
        const audio = 'A'.repeat(17 * 1024 * 1024);
        bad.handler = (req, res) => sendJson(res, 200, JSON.stringify({
            candidates: [{ content: { role: 'model', parts: [{ inlineData: {
                mimeType: 'audio/L16;codec=pcm;rate=24000', data: audio } }] },
            finishReason: 'STOP', index: 0 }],
            usageMetadata: { promptTokenCount: 12, candidatesTokenCount: 4000,
                totalTokenCount: 4012 },
        }));
        const model = uniq('ans-long-tts');
        await makeChannel(gw, { type: 24, base_url: bad.url, models: [model] });
        await sleep(1100);
        const { key } = await makeUserKey(gw);
        const r = await gw.req('POST', `/v1beta/models/${model}:generateContent`, {
            key, body: { contents: [{ role: 'user', parts: [{ text: 'read a long story' }] }],
                generationConfig: { responseModalities: ['AUDIO'] } },
            timeoutMs: 60000,
        });
        assertOk(r);
        assert.ok(r.text.includes(audio), 'the audio came through whole');
        const row = await rowOf(r);
        assert.equal(row.prompt_tokens, 12, JSON.stringify(row));
        assert.equal(row.completion_tokens, 4000, 'the upstream\'s count, not the size');

        /* chunked, in 64 KiB chunks, past the limit inside a chunk: whole,
           and billed by its usage too; a chunked body of exactly 16 MiB is
           held (the chunks' framing does not count) */
        const chatOf = (content) => JSON.stringify(openaiChat({ content,
            usage: { prompt_tokens: 10, completion_tokens: 20 } }));
        const frame = chatOf('').length;
        for (const pad of [17 * 1024 * 1024, 16 * 1024 * 1024 - frame]) {
            const text = chatOf('q'.repeat(pad));
            good.handler = (req, res) => {
                res.writeHead(200, { 'Content-Type': 'application/json' });
                for (let at = 0; at < text.length; at += 65536) {
                    res.write(text.slice(at, at + 65536));
                }
                res.end();
            };
            const gpt = uniq('ans-long-gpt');
            await makeChannel(gw, { base_url: good.url, models: [gpt] });
            await sleep(1100);
            try {
                const g = await gw.chat(key, gpt, { timeoutMs: 60000 });
                assertOk(g);
                assert.equal(g.text, text);
                assert.equal(g.headers['content-length'] !== undefined, text.length <= 16 * 1024 * 1024,
                    `${text.length} bytes: held with its length, or passed on`);
                const grow = await rowOf(g);
                assert.equal(grow.completion_tokens, 20, JSON.stringify(grow));
            } finally {
                good.handler = echoHandler;
            }
        }

        /* a chat call to that Gemini channel would get Gemini's shape: 502 */
        const c = await gw.chat(key, model, { timeoutMs: 60000 });
        assertError(c, 502, { type: 'upstream_error', code: 'bad_response_body', message: /larger than 16777216 bytes and cannot be converted/ });
        const crow = await rowOf(c);
        assert.equal(Number(crow.quota), 0, JSON.stringify(crow));
    });

    test('a whole Anthropic stream still ends with [DONE] for a chat client', async () => {
        bad.handler = (req, res) => anthropicStream(res, ['hello'], {
            usage: { input_tokens: 5, output_tokens: 2 } });
        const model = uniq('ans-claude');
        await makeChannel(gw, { type: 14, base_url: bad.url, models: [model] });
        await sleep(1100);
        const { key } = await makeUserKey(gw);
        const c = await gw.chat(key, model, { extra: { stream: true } });
        assertOk(c);
        assert.equal(sseEvents(c.text).at(-1).data, '[DONE]');
    });
});
