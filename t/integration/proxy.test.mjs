// Proxying: what reaches the upstream (path, credentials, mapped model),
// what comes back (bodies unchanged, upstream errors passed on) and
// streaming without buffering.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, hex, makeChannel, makeUserKey,
    settle, sseEvents, startGateway, stopAll, times, uniq, waitLogs,
} from '../lib/harness.mjs';
import {
    anthropicError, anthropicMessage, anthropicStream, echo, openaiChat,
    openaiError, openaiStream, sendJson, startMock,
} from '../lib/mock.mjs';

/* Time the mock waits between two stream chunks. */
const GAP_MS = 800;

describe('proxy', { timeout: 180000 }, () => {
    let db, gw, oa, an, key;
    const M = uniq('gpt-proxy');
    const PREFIXED = uniq('gpt-prefixed');
    const MAPPED = uniq('gpt-mapped');
    const AM = uniq('claude-proxy');
    const GM = uniq('gemini-proxy');
    const oaKey = `oa-${hex(8)}`;
    const anKey = `an-${hex(8)}`;
    const gmKey = `gm-${hex(8)}`;

    before(async () => {
        db = await createDb();
        oa = await startMock();
        an = await startMock();
        gw = await startGateway({ db });
        await makeChannel(gw, { base_url: oa.url, key: oaKey, models: [M] });
        await makeChannel(gw, {
            base_url: `${oa.url}/prefix/openai`, key: oaKey, models: [PREFIXED],
        });
        await makeChannel(gw, {
            base_url: oa.url, key: oaKey, models: [MAPPED],
            model_mapping: { [MAPPED]: 'vendor-real-model' },
        });
        await makeChannel(gw, { type: 14, base_url: an.url, key: anKey, models: [AM] });
        await makeChannel(gw, { type: 24, base_url: oa.url, key: gmKey, models: [GM] });
        ({ key } = await makeUserKey(gw));
        await settle();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await oa?.close();
            await an?.close();
            await dropDb(db);
        }
    });

    const last = (mock) => mock.requests[mock.requests.length - 1];

    test('OpenAI JSON: upstream gets the channel key and the request; client gets the body unchanged', async () => {
        const upstreamBody = '{"id":"chatcmpl-x",  "object":"chat.completion","created":1,' +
            `"model":"${M}","choices":[{"index":0,"message":{"role":"assistant",` +
            '"content":"h\\u00e9llo \u2713"},"finish_reason":"stop"}],' +
            '"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7},' +
            '"vendor_extra":{"a":[1,2,{"b":null}]}}\n';
        oa.handler = (req, res) => sendJson(res, 200, upstreamBody, { 'X-Vendor': 'yes' });
        const body = {
            model: M, temperature: 0.25, user: 'end-user-1',
            messages: [{ role: 'system', content: 'be brief' },
                { role: 'user', content: 'hello there' }],
        };
        const r = await gw.req('POST', '/v1/chat/completions', { key, body });
        oa.handler = echo;
        assertOk(r);
        assert.equal(r.text, upstreamBody, 'response body passes through unchanged');
        assert.match(r.headers['content-type'], /^application\/json/);

        const up = last(oa);
        assert.equal(up.method, 'POST');
        assert.equal(up.path, '/v1/chat/completions');
        assert.equal(up.headers.authorization, `Bearer ${oaKey}`);
        assert.equal(up.json.model, M);
        assert.deepEqual(up.json.messages, body.messages);
        assert.equal(up.json.temperature, 0.25);
        assert.equal(up.json.user, 'end-user-1');
        assert.ok(!JSON.stringify(up.headers).includes(key.slice(3)),
            'the client key never reaches the upstream');
    });

    test('the channel base_url path is kept in front of /v1/chat/completions', async () => {
        assertOk(await gw.chat(key, PREFIXED));
        assert.equal(last(oa).path, '/prefix/openai/v1/chat/completions');
    });

    test('model_mapping rewrites the model sent upstream', async () => {
        assertOk(await gw.chat(key, MAPPED));
        assert.equal(last(oa).json.model, 'vendor-real-model');
    });

    test('a large JSON response passes through intact', async () => {
        const content = 'abcdefghij'.repeat(30000);
        oa.handler = (req, res, rec) => sendJson(res, 200, openaiChat({
            model: rec.json.model, content,
        }));
        const r = await gw.chat(key, M);
        oa.handler = echo;
        assertOk(r);
        assert.equal(r.json.choices[0].message.content, content);
    });

    test('concurrent requests each get their own answer', async () => {
        oa.handler = async (req, res, rec) => {
            await new Promise((s) => setTimeout(s, Math.random() * 100));
            sendJson(res, 200, openaiChat({
                model: rec.json.model, content: `echo:${rec.json.messages[0].content}`,
            }));
        };
        const rs = await times(12, (i) => gw.chat(key, M, { content: `tag-${i}` }));
        oa.handler = echo;
        rs.forEach((r, i) => {
            assertOk(r);
            assert.equal(r.json.choices[0].message.content, `echo:tag-${i}`);
        });
    });

    test('Anthropic: x-api-key + default anthropic-version upstream, body unchanged', async () => {
        const msg = anthropicMessage({ model: AM, content: 'bonjour' });
        const text = JSON.stringify(msg);
        an.handler = (req, res) => sendJson(res, 200, text);
        const body = { model: AM, max_tokens: 32, messages: [{ role: 'user', content: 'salut' }] };
        const r = await gw.req('POST', '/v1/messages', { key, body });
        an.handler = echo;
        assertOk(r);
        assert.equal(r.text, text);
        const up = last(an);
        assert.equal(up.path, '/v1/messages');
        assert.equal(up.headers['x-api-key'], anKey);
        assert.equal(up.headers['anthropic-version'], '2023-06-01');
        assert.deepEqual(up.json.messages, body.messages);
        assert.equal(up.json.max_tokens, 32);
        assert.ok(!JSON.stringify(up.headers).includes(key.slice(3)),
            'the client key never reaches the upstream');
    });

    test('Anthropic: the client anthropic-version is passed on; x-api-key client auth', async () => {
        const r = await gw.req('POST', '/v1/messages', {
            headers: { 'x-api-key': key, 'anthropic-version': '2024-10-22' },
            body: { model: AM, max_tokens: 8, messages: [{ role: 'user', content: 'x' }] },
        });
        assertOk(r);
        const up = last(an);
        assert.equal(up.headers['anthropic-version'], '2024-10-22');
        assert.equal(up.headers['x-api-key'], anKey);
    });

    test('Anthropic: anthropic-beta sent as several lines reaches the upstream as one list', async () => {
        const body = { model: AM, max_tokens: 8, messages: [{ role: 'user', content: 'x' }] };
        /* an array: one header line per value */
        assertOk(await gw.req('POST', '/v1/messages', {
            headers: { 'x-api-key': key, 'anthropic-beta': ['tools-1', 'cache-2'] }, body }));
        assert.equal(last(an).headers['anthropic-beta'], 'tools-1, cache-2');
        assertOk(await gw.req('POST', '/v1/messages', {
            headers: { 'x-api-key': key, 'anthropic-beta': 'tools-1,cache-2' }, body }));
        assert.equal(last(an).headers['anthropic-beta'], 'tools-1,cache-2');
        /* an empty line is an empty member; a version is not a list */
        assertOk(await gw.req('POST', '/v1/messages', {
            headers: { 'x-api-key': key, 'anthropic-beta': ['', 'tools-2'],
                'anthropic-version': ['2023-06-01', '2024-10-22'] }, body }));
        assert.equal(last(an).headers['anthropic-beta'], ', tools-2');
        assert.equal(last(an).headers['anthropic-version'], '2023-06-01');
    });

    test('an upstream 400 keeps its status and message as upstream_error', async () => {
        oa.handler = (req, res) => openaiError(res, 400,
            'Unsupported value: temperature 7', { code: 'unsupported_value' });
        const r = await gw.chat(key, M, { extra: { temperature: 7 } });
        oa.handler = echo;
        assertError(r, 400, {
            type: 'upstream_error', message: 'Unsupported value: temperature 7',
        });
    });

    test('an upstream 429 keeps its status and message', async () => {
        oa.handler = (req, res) => openaiError(res, 429, 'Rate limit reached for requests',
            { type: 'requests', code: 'rate_limit_exceeded' });
        const r = await gw.chat(key, M);
        oa.handler = echo;
        assertError(r, 429, {
            type: 'upstream_error', message: 'Rate limit reached for requests',
        });
    });

    test('an Anthropic upstream error keeps its status and message', async () => {
        an.handler = (req, res) => anthropicError(res, 400, 'max_tokens: must be positive');
        const r = await gw.messages(key, AM);
        an.handler = echo;
        assert.equal(r.status, 400, r.text);
        assert.ok(r.text.includes('max_tokens: must be positive'), r.text);
        assert.ok(r.headers['x-request-id']);
        /* in Anthropic's shape, with Anthropic's own error type */
        assert.equal(r.json.type, 'error');
        assert.equal(r.json.error.type, 'invalid_request_error');

        an.handler = (req, res) => anthropicError(res, 529, 'Overloaded', { type: 'overloaded_error' });
        const o = await gw.messages(key, AM);
        an.handler = echo;
        assert.equal(o.status, 529, o.text);
        assert.equal(o.json.error.type, 'overloaded_error');
    });

    test('an upstream error quoting the channel key shows [credential] instead', async () => {
        /* what vendors do: "Incorrect API key provided: <what we sent>" */
        const sent = (rec) => rec.headers.authorization || rec.headers['x-api-key']
            || rec.headers['x-goog-api-key'];
        const asJson = (req, res, rec) => openaiError(res, 401,
            `Incorrect API key provided: ${sent(rec)}`, { code: 'invalid_api_key' });
        const asText = (req, res, rec) => {
            res.writeHead(500, { 'Content-Type': 'text/plain' });
            res.end(`bad key ${sent(rec)}`);
        };
        const gemini = { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] };
        try {
            for (const [handler, status] of [[asJson, 401], [asText, 500]]) {
                oa.handler = handler;
                an.handler = handler;
                const answers = {
                    chat: await gw.chat(key, M),
                    'chat stream': await gw.chat(key, M, { extra: { stream: true } }),
                    messages: await gw.messages(key, AM),
                    gemini: await gw.req('POST', `/v1beta/models/${GM}:generateContent`,
                        { key, body: gemini }),
                };
                for (const [what, r] of Object.entries(answers)) {
                    const ctx = `${what}: ${r.status} ${r.text}`;
                    assert.equal(r.status, status, ctx);
                    for (const k of [oaKey, anKey, gmKey]) {
                        assert.ok(!r.text.includes(k), ctx);
                    }
                    const m = r.json.error.message;
                    assert.match(m, /^(Incorrect API key provided: |bad key )(Bearer )?\[credential\] \(request id: /, ctx);
                }
            }
        } finally {
            oa.handler = echo;
            an.handler = echo;
        }
    });

    test('a header quoting the channel key percent-encoded or with \\/ shows [credential]', async () => {
        const odd = `sk-Ab/Cd+Ef=${hex(12)}`;
        const model = uniq('gpt-oddkey');
        const prev = oa.handler;
        await makeChannel(gw, { base_url: oa.url, key: odd, models: [model] });
        await new Promise((r) => setTimeout(r, 1100));
        oa.handler = (req, res, rec) => {
            res.writeHead(200, {
                'Content-Type': 'application/json',
                'X-Upstream-Url': `https://vendor.example/v1/chat?key=${encodeURIComponent(odd)}`,
                'X-Lower': `key=${encodeURIComponent(odd).replace(/%[0-9A-F]{2}/g, (m) => m.toLowerCase())}`,
                'X-Escaped': JSON.stringify(odd).replaceAll('/', '\\/'),
                'X-Plain': 'nothing to hide',
            });
            res.end(JSON.stringify(openaiChat({ model: rec.json.model })));
        };
        try {
            const r = assertOk(await gw.chat(key, model));
            for (const h of ['x-upstream-url', 'x-lower', 'x-escaped']) {
                assert.equal(r.headers[h], '[credential]', `${h}: ${JSON.stringify(r.headers)}`);
            }
            assert.equal(r.headers['x-plain'], 'nothing to hide');
        } finally {
            oa.handler = prev;
        }
    });

    test('a 2xx answer, stream event or header quoting the channel key shows [credential]', async () => {
        const sent = (rec) => rec.headers.authorization || rec.headers['x-api-key'];
        const head = (rec) => ({
            'Content-Type': 'text/event-stream', 'X-Debug-Auth': sent(rec),
            'OpenAI-Organization': 'org-operator', 'WWW-Authenticate': 'Bearer realm="up"',
        });
        /* a few words, then the vendor's error event quoting the key */
        oa.handler = (req, res, rec) => {
            if (!rec.json.stream) {
                res.writeHead(200, { 'Content-Type': 'application/json', 'X-Debug-Auth': sent(rec) });
                /* an answer quoting it (an error object alone under a 200
                   is no answer: the next channel, else 502) */
                res.end(JSON.stringify(openaiChat({ model: rec.json.model,
                    content: `The key you sent is ${sent(rec)}` })));
                return;
            }
            res.writeHead(200, head(rec));
            res.write('data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
                + '"delta":{"role":"assistant","content":"Hi"}}]}\n\n');
            const ev = `data: ${JSON.stringify({ error: { message: `Incorrect API key provided: ${sent(rec)}` } })}\n\n`;
            /* the key cut in two writes */
            const at = ev.indexOf(oaKey) + 5;
            res.write(ev.slice(0, at));
            setTimeout(() => res.end(ev.slice(at)), 30);
        };
        an.handler = (req, res, rec) => {
            res.writeHead(200, head(rec));
            res.write(`event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: {
                id: 'msg_1', type: 'message', role: 'assistant', model: AM, content: [],
                stop_reason: null, usage: { input_tokens: 3, output_tokens: 0 } } })}\n\n`);
            res.end(`event: error\ndata: ${JSON.stringify({ type: 'error',
                error: { type: 'authentication_error', message: `invalid x-api-key ${sent(rec)}` } })}\n\n`);
        };
        try {
            const answers = {
                'chat stream': await gw.chat(key, M, { extra: { stream: true } }),
                'messages stream, converted': await gw.messages(key, M, { extra: { stream: true } }),
                'messages stream': await gw.messages(key, AM, { extra: { stream: true } }),
                'chat stream, converted': await gw.chat(key, AM, { extra: { stream: true } }),
                'chat, a 200 answer quoting it': await gw.chat(key, M),
            };
            for (const [what, r] of Object.entries(answers)) {
                const ctx = `${what}: ${r.status} ${JSON.stringify(r.headers)} ${r.text}`;
                for (const k of [oaKey, anKey]) {
                    assert.ok(!r.text.includes(k), ctx);
                    assert.ok(!JSON.stringify(r.headers).includes(k), ctx);
                }
                assert.ok(r.text.includes('[credential]'), ctx);
                assert.equal(r.headers['openai-organization'], undefined, ctx);
                assert.equal(r.headers['www-authenticate'], undefined, ctx);
            }
            assert.match(answers['chat stream'].headers['x-debug-auth'], /^\[credential\]$/);

            /* the errors the gateway writes into a converted stream are the
               contract's, with the request id */
            const chat = answers['chat stream, converted'];
            const err = sseEvents(chat.text).map((e) => JSON.parse(e.data)).find((d) => d.error);
            assert.deepEqual(err, { error: {
                message: `invalid x-api-key [credential] (request id: ${chat.headers['x-request-id']})`,
                type: 'upstream_error', code: 'authentication_error' } });
            const msgs = answers['messages stream, converted'];
            const ev = sseEvents(msgs.text).find((e) => e.event === 'error');
            assert.ok(ev, msgs.text);
            assert.match(JSON.parse(ev.data).error.message,
                new RegExp(`\\(request id: ${msgs.headers['x-request-id']}\\)$`));
        } finally {
            oa.handler = echo;
            an.handler = echo;
        }
    });

    test('a channel key read from a file works; one holding CR or LF is refused', async () => {
        const m = uniq('gpt-keyfile');
        for (const bad of ['sk-up\r\nX-Injected: yes', 'sk-up\nX-Injected: yes']) {
            const r = await gw.admin('POST', '/api/channel',
                { type: 1, base_url: oa.url, models: [m], key: bad });
            assertError(r, 400, { code: 'invalid_request',
                message: 'key: must not contain control characters' });
            assert.ok(!r.text.includes('Injected'), r.text);
        }
        const fileKey = `sk-file-${hex(8)}`;
        await makeChannel(gw, { base_url: oa.url, key: `${fileKey}\n`, models: [m] });
        await settle();
        assertOk(await gw.chat(key, m));
        assert.equal(last(oa).headers.authorization, `Bearer ${fileKey}`);
    });

    test('OpenAI streaming reaches the client chunk by chunk', async () => {
        let written;
        oa.handler = async (req, res, rec) => {
            written = await openaiStream(res, ['Hel', 'lo', ' world'], {
                delayMs: GAP_MS, model: rec.json.model,
                usage: { prompt_tokens: 5, completion_tokens: 3 },
            });
        };
        const r = await gw.chat(key, M, { extra: { stream: true } });
        oa.handler = echo;
        assertOk(r);
        assert.match(r.headers['content-type'], /^text\/event-stream/);
        assert.equal(last(oa).json.stream, true);

        const events = sseEvents(r.text);
        assert.equal(events[events.length - 1].data, '[DONE]');
        const text = events.filter((e) => e.data !== '[DONE]')
            .map((e) => JSON.parse(e.data))
            .map((c) => (c.choices && c.choices[0] && c.choices[0].delta &&
                c.choices[0].delta.content) || '')
            .join('');
        assert.equal(text, 'Hello world');

        let acc = '';
        const first = r.chunks.find((c) => (acc += c.text).includes('"Hel"'));
        assert.ok(first, 'first chunk received');
        assert.ok(first.t <= written[1] - GAP_MS / 2,
            `first chunk reached the client ${first.t - written[0]} ms after it was ` +
            `written; the next was written ${written[1] - written[0]} ms after it`);
    });

    test('an upstream that answers a stream request whole: the client still gets its stream, billed from the answer', async () => {
        oa.handler = (req, res, rec) => sendJson(res, 200, openaiChat({
            model: rec.json.model, content: 'whole answer',
            usage: { prompt_tokens: 7, completion_tokens: 31 },
        }));
        try {
            const r = await gw.chat(key, M, { extra: { stream: true } });
            assertOk(r);
            assert.match(r.headers['content-type'], /^text\/event-stream/);
            const ev = sseEvents(r.text);
            assert.equal(ev[ev.length - 1].data, '[DONE]');
            const first = JSON.parse(ev[0].data);
            assert.equal(first.object, 'chat.completion.chunk');
            assert.equal(first.choices[0].delta.content, 'whole answer');
            assert.equal(first.choices[0].finish_reason, 'stop');
            assert.equal(ev.length, 2, 'no usage chunk the client did not ask for');
            const id = r.headers['x-request-id'];
            await waitLogs(gw, { model: M }, (items) => items.some((i) =>
                i.request_id === id && i.completion_tokens === 31 && i.prompt_tokens === 7));

            /* a Messages client of the same OpenAI channel */
            const m = await gw.messages(key, M, { extra: { stream: true } });
            assertOk(m);
            assert.deepEqual(sseEvents(m.text).map((e) => e.event), [
                'message_start', 'content_block_start', 'content_block_delta',
                'content_block_stop', 'message_delta', 'message_stop',
            ]);
            const delta = JSON.parse(sseEvents(m.text)[2].data);
            assert.equal(delta.delta.text, 'whole answer');
            const md = JSON.parse(sseEvents(m.text)[4].data);
            assert.equal(md.delta.stop_reason, 'end_turn');
            assert.equal(md.usage.output_tokens, 31);
        } finally {
            oa.handler = echo;
        }

        /* an Anthropic channel: thinking keeps its signature */
        an.handler = (req, res, rec) => sendJson(res, 200, {
            id: 'msg_w', type: 'message', role: 'assistant', model: rec.json.model,
            content: [{ type: 'thinking', thinking: 'hm', signature: 'sig-123' },
                { type: 'text', text: 'ok' }],
            stop_reason: 'end_turn', stop_sequence: null,
            usage: { input_tokens: 3, output_tokens: 4 },
        });
        try {
            const a = await gw.messages(key, AM, { extra: { stream: true } });
            assertOk(a);
            const ev = sseEvents(a.text).map((e) => JSON.parse(e.data));
            assert.ok(ev.some((e) => e.delta && e.delta.type === 'signature_delta' &&
                e.delta.signature === 'sig-123'), a.text);
            assert.ok(ev.some((e) => e.delta && e.delta.text === 'ok'), a.text);
        } finally {
            an.handler = echo;
        }
    });

    test('Anthropic streaming reaches the client event by event', async () => {
        let written;
        an.handler = async (req, res, rec) => {
            written = await anthropicStream(res, ['Bon', 'jour'], {
                delayMs: GAP_MS, model: rec.json.model,
            });
        };
        const r = await gw.messages(key, AM, { extra: { stream: true } });
        an.handler = echo;
        assertOk(r);
        assert.match(r.headers['content-type'], /^text\/event-stream/);
        const events = sseEvents(r.text);
        assert.deepEqual(events.map((e) => e.event), [
            'message_start', 'content_block_start', 'content_block_delta',
            'content_block_delta', 'content_block_stop', 'message_delta', 'message_stop',
        ]);
        let acc = '';
        const first = r.chunks.find((c) => (acc += c.text).includes('"Bon"'));
        assert.ok(first, 'first delta received');
        assert.ok(first.t <= written[1] - GAP_MS / 2,
            `first delta reached the client ${first.t - written[0]} ms after it was written`);
    });
});
