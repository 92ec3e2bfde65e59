// Native endpoints and format conversion:
//   - Gemini generateContent / streamGenerateContent passed through as is
//     (audio generation), with the key as Bearer, x-goog-api-key or ?key=
//     (masked in the access and error logs);
//   - rerank (/v1/rerank, /v2/rerank) over Cohere, Jina and OpenAI-compatible
//     upstreams, answered in one shape;
//   - /v1/chat/completions served by Anthropic and Gemini channels and
//     /v1/messages served by OpenAI channels, converted both ways.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import http2 from 'node:http2';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, eventually, hex, makeChannel, makeUserKey,
    freePort, rawHttp, settle, sha256hex, sseEvents, startGateway, stopAll, uniq, waitLogs,
} from '../lib/harness.mjs';
import {
    anthropicError, anthropicMessage, anthropicStream, echo, openaiChat,
    openaiError, openaiStream, sendJson, startClosedPort, startMock,
} from '../lib/mock.mjs';

/* ------------------------------------------------------------------ */
/* vendor shapes                                                       */
/* ------------------------------------------------------------------ */

const AUDIO_B64 = Buffer.from(Array.from({ length: 3000 }, (_, i) => (i * 37) & 255))
    .toString('base64');

/* A Gemini TTS answer, as text, with fields the gateway must not touch. */
function geminiAudioText() {
    return JSON.stringify({
        candidates: [{
            content: {
                role: 'model',
                parts: [{ inlineData: { mimeType: 'audio/L16;codec=pcm;rate=24000', data: AUDIO_B64 } }],
            },
            finishReason: 'STOP',
            index: 0,
            safetyRatings: [
                { category: 'HARM_CATEGORY_HATE_SPEECH', probability: 'NEGLIGIBLE' },
                { category: 'HARM_CATEGORY_DANGEROUS_CONTENT', probability: 'LOW', blocked: false },
            ],
        }],
        usageMetadata: {
            promptTokenCount: 9, candidatesTokenCount: 160, totalTokenCount: 169,
            promptTokensDetails: [{ modality: 'TEXT', tokenCount: 9 }],
        },
        modelVersion: 'gemini-2.5-flash-preview-tts',
        responseId: `resp-${hex(6)}`,
        vendorExtra: { keep: [1, 'two', null] },
    }, null, 1) + '\n';
}

function geminiText({ text = 'bonjour', finishReason = 'STOP', parts,
    usage = { promptTokenCount: 12, candidatesTokenCount: 30, totalTokenCount: 42 } } = {}) {
    return {
        candidates: [{
            content: { role: 'model', parts: parts || [{ text }] },
            finishReason, index: 0,
        }],
        usageMetadata: usage,
        modelVersion: 'gemini-mock',
    };
}

function sseHead(res) {
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    res.flushHeaders();
}

/* Gemini SSE frames, each data line one JSON chunk. */
function geminiStreamFrames(texts, final = { promptTokenCount: 5, candidatesTokenCount: 7, totalTokenCount: 12 }) {
    return texts.map((t, i) => `data: ${JSON.stringify({
        candidates: [{
            content: { role: 'model', parts: [{ text: t }] },
            ...(i === texts.length - 1 ? { finishReason: 'STOP' } : {}), index: 0,
        }],
        usageMetadata: i === texts.length - 1 ? final
            : { promptTokenCount: final.promptTokenCount, candidatesTokenCount: i + 1, totalTokenCount: final.promptTokenCount + i + 1 },
    })}\r\n\r\n`);
}

const DOCS = ['Paris is the capital of France.', 'Bananas are yellow.',
    'The Eiffel Tower is in Paris.', 'Rust is a language.'];
/* the scores every mock gives, by document index */
const SCORES = [0.71, 0.02, 0.93, 0.15];

/*
 * Rerank answers as the vendors give them.  Cohere sorts and returns
 * documents only when asked; Jina always returns them and has no id;
 * the OpenAI-compatible server answers every document in input order.
 */
function rerankUpstream(kind, body) {
    const n = body.documents.length;
    let results = Array.from({ length: n }, (_, i) => ({ index: i, relevance_score: SCORES[i % 4] }));
    const sorted = results.slice().sort((a, b) => b.relevance_score - a.relevance_score);
    const doc = (i) => (typeof body.documents[i] === 'string' ? body.documents[i] : body.documents[i].text);
    if (kind === 'cohere') {
        results = sorted.slice(0, body.top_n || n)
            .map((r) => (body.return_documents ? { ...r, document: { text: doc(r.index) } } : r));
        return {
            id: `co-${hex(6)}`, results,
            meta: { api_version: { version: '2' }, billed_units: { search_units: 1 } },
        };
    }
    if (kind === 'jina') {
        return {
            model: body.model, usage: { total_tokens: 33, prompt_tokens: 33 },
            results: sorted.slice(0, body.top_n || n)
                .map((r) => ({ index: r.index, document: { text: doc(r.index) }, relevance_score: r.relevance_score })),
        };
    }
    /* this one ignores top_n: the gateway must still show only top_n */
    return {
        id: `rr-${hex(6)}`, model: body.model, usage: { total_tokens: 21 },
        results: results.map((r) => ({ ...r, document: { text: doc(r.index) } })),
    };
}

/* chat.completion.chunk objects of an OpenAI stream (without [DONE]). */
function chatChunks(text) {
    return sseEvents(text).filter((e) => e.data !== '[DONE]').map((e) => JSON.parse(e.data));
}

const deltaText = (chunks) => chunks
    .map((c) => (c.choices && c.choices[0] && c.choices[0].delta && c.choices[0].delta.content) || '')
    .join('');

/* Text of an Anthropic system/content field (a string or text blocks). */
function blocksText(v) {
    if (typeof v === 'string') {
        return v;
    }
    if (Array.isArray(v)) {
        return v.filter((b) => b.type === 'text').map((b) => b.text).join('');
    }
    return undefined;
}

/* Text of an OpenAI message content (a string or text parts). */
function partsText(v) {
    if (typeof v === 'string') {
        return v;
    }
    if (Array.isArray(v)) {
        return v.filter((p) => p.type === 'text').map((p) => p.text).join('');
    }
    return undefined;
}

const WEATHER_SCHEMA = {
    type: 'object',
    properties: { city: { type: 'string', description: 'city name' } },
    required: ['city'],
};
const OPENAI_TOOLS = [{
    type: 'function',
    function: { name: 'get_weather', description: 'Weather of a city', parameters: WEATHER_SCHEMA },
}];
const ANTHROPIC_TOOLS = [{ name: 'get_weather', description: 'Weather of a city', input_schema: WEATHER_SCHEMA }];
const PNG_B64 = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';

/* ------------------------------------------------------------------ */

describe('native endpoints and conversion', { timeout: 300000 }, () => {
    let db, gw, key, token;
    let gm, rr, an, oa;
    const gmKey = `gm-${hex(8)}`;
    const anKey = `an-${hex(8)}`;
    const oaKey = `oa-${hex(8)}`;
    const rrKey = `rr-${hex(8)}`;
    const M = {
        tts: uniq('gemini-tts'), ttsMapped: uniq('gemini-tts-mapped'),
        keylog: uniq('gemini-keylog'),
        /* served through an internal redirect (try_files -> @gw) */
        redirected: uniq('redir'),
        /* what a URL path segment cannot hold as is */
        odd: `${uniq('gemini')} x?y#z%:w`, oddMapped: uniq('gemini-odd-mapped'),
        cohere: uniq('rerank-co'), jina: uniq('rerank-jina'), oaRerank: uniq('rerank-oa'),
        viaClaude: uniq('chat-via-claude'), viaGemini: uniq('chat-via-gemini'),
        viaOpenai: uniq('msg-via-openai'),
        /* an OpenAI channel first, an Anthropic one after it */
        mix: uniq('mixed'),
        /* a Gemini channel first, an OpenAI one after it */
        mixGemini: uniq('mixed-gemini'),
    };
    const last = (mock) => mock.requests[mock.requests.length - 1];
    let h2port, slowPort;

    before(async () => {
        db = await createDb();
        gm = await startMock((req, res) => sendJson(res, 200, geminiText()));
        rr = await startMock((req, res, rec) => {
            const kind = rec.path.startsWith('/cohere') ? 'cohere'
                : rec.path.startsWith('/jina') ? 'jina' : 'oa';
            sendJson(res, 200, rerankUpstream(kind, rec.json));
        });
        an = await startMock();
        oa = await startMock();
        const closed = await startClosedPort();
        h2port = await freePort();
        slowPort = await freePort();
        gw = await startGateway({
            db, http: `log_format keys '"$request" $request_uri $args $arg_key';
  server { listen 127.0.0.1:${slowPort}; client_header_timeout 1s;
    access_log keys.log keys; location / { llmgw_gateway; } }`,
            /* HTTP/2 without TLS (prior knowledge) on a second port */
            server: `listen 127.0.0.1:${h2port} http2; access_log keys.log keys;
    location ^~ /v1beta/models/redir { try_files /nonexistent @gw; }
    location @gw { llmgw_gateway; }`,
        });
        await makeChannel(gw, { type: 24, base_url: gm.url, key: gmKey,
            models: [M.tts, M.viaGemini, M.redirected] });
        /* a refused first try puts the request line into the error log */
        await makeChannel(gw, { type: 24, base_url: closed.url, models: [M.keylog], priority: 10 });
        await makeChannel(gw, { type: 24, base_url: gm.url, key: gmKey, models: [M.keylog] });
        await makeChannel(gw, {
            type: 24, base_url: gm.url, key: gmKey, models: [M.odd, M.oddMapped],
            model_mapping: { [M.oddMapped]: 'tuned/up x' },
        });
        await makeChannel(gw, {
            type: 24, base_url: gm.url, key: gmKey, models: [M.ttsMapped],
            model_mapping: { [M.ttsMapped]: 'gemini-2.5-flash-preview-tts' },
        });
        await makeChannel(gw, { type: 34, base_url: `${rr.url}/cohere`, key: rrKey, models: [M.cohere] });
        await makeChannel(gw, {
            type: 38, base_url: `${rr.url}/jina`, key: rrKey, models: [M.jina],
            model_mapping: { [M.jina]: 'jina-reranker-v2-base-multilingual' },
        });
        await makeChannel(gw, { type: 1, base_url: `${rr.url}/oa`, key: rrKey, models: [M.oaRerank] });
        await makeChannel(gw, {
            type: 14, base_url: an.url, key: anKey, models: [M.viaClaude],
            model_mapping: { [M.viaClaude]: 'claude-real-1' },
        });
        await makeChannel(gw, { type: 1, base_url: oa.url, key: oaKey, models: [M.viaOpenai] });
        await makeChannel(gw, { type: 1, base_url: oa.url, key: oaKey, models: [M.mix], priority: 10 });
        await makeChannel(gw, { type: 14, base_url: an.url, key: anKey, models: [M.mix] });
        await makeChannel(gw, { type: 24, base_url: gm.url, key: gmKey, models: [M.mixGemini], priority: 10 });
        await makeChannel(gw, { type: 1, base_url: oa.url, key: oaKey, models: [M.mixGemini] });
        ({ key, token } = await makeUserKey(gw));
        await settle();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all([gm, rr, an, oa].map((m) => m?.close()));
            await dropDb(db);
        }
    });

    /* ============================================================== */
    describe('Gemini native pass-through', () => {
        const ttsBody = (text = 'Say cheerfully: have a wonderful day!') => JSON.stringify({
            contents: [{ role: 'user', parts: [{ text }] }],
            generationConfig: {
                responseModalities: ['AUDIO'],
                speechConfig: { voiceConfig: { prebuiltVoiceConfig: { voiceName: 'Kore' } } },
                temperature: 0.7,
            },
            safetySettings: [{ category: 'HARM_CATEGORY_HARASSMENT', threshold: 'BLOCK_NONE' }],
        }, null, 2);

        test('generateContent: request and response bytes unchanged, channel key upstream', async () => {
            const answer = geminiAudioText();
            gm.handler = (req, res) => sendJson(res, 200, answer, { 'X-Vendor': 'g' });
            const body = ttsBody();
            const r = await gw.req('POST', `/v1beta/models/${M.tts}:generateContent`, {
                key, body, headers: { 'Content-Type': 'application/json' },
            });
            assertOk(r);
            assert.equal(r.text, answer, 'the answer passes through unchanged');
            assert.match(r.headers['content-type'], /^application\/json/);
            const up = last(gm);
            assert.equal(up.method, 'POST');
            assert.equal(up.path, `/v1beta/models/${M.tts}:generateContent`);
            assert.equal(up.headers['x-goog-api-key'], gmKey);
            assert.equal(up.body, body, 'the request body reaches the upstream unchanged');
            assert.ok(!JSON.stringify(up.headers).includes(key.slice(3)),
                'the client key never reaches the upstream');
            const row = (await waitLogs(gw, { token_id: token.id, model: M.tts },
                (items) => items.some((i) => i.request_id === r.headers['x-request-id'])))
                .items.find((i) => i.request_id === r.headers['x-request-id']);
            assert.equal(row.prompt_tokens, 9);
            assert.equal(row.completion_tokens, 160);
        });

        test('the key is accepted as Bearer, x-goog-api-key and ?key=, never sent upstream', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiAudioText());
            const p = `/v1beta/models/${M.tts}:generateContent`;
            const body = ttsBody();
            const ways = {
                bearer: await gw.req('POST', p, { body, headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' } }),
                header: await gw.req('POST', p, { body, headers: { 'x-goog-api-key': key, 'Content-Type': 'application/json' } }),
                query: await gw.req('POST', `${p}?key=${key}`, { body, headers: { 'Content-Type': 'application/json' } }),
            };
            for (const [how, r] of Object.entries(ways)) {
                assert.equal(r.status, 200, `${how}: ${r.status} ${r.text.slice(0, 300)}`);
            }
            for (const up of gm.requests.slice(-3)) {
                assert.equal(up.path, p, 'no client key in the upstream URL');
                assert.equal(up.headers['x-goog-api-key'], gmKey);
                assert.ok(!JSON.stringify(up.headers).includes(key.slice(3)));
            }
            const bad = `sk-${hex(24)}`;
            assertError(await gw.req('POST', p, { body, headers: { 'x-goog-api-key': bad } }), 401,
                { code: 'invalid_token' });
            assertError(await gw.req('POST', `${p}?key=${bad}`, { body }), 401, { code: 'invalid_token' });
            assertError(await gw.req('POST', p, { body }), 401, { code: 'invalid_token' });
        });

        test('a ?key= is read as a URL parser reads it: percent-encoded characters are the ones they encode', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiAudioText());
            const p = `/v1beta/models/${M.tts}:generateContent`;
            const body = ttsBody();
            const encoded = [...key].map((c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`).join('');
            assertOk(await gw.req('POST', `${p}?key=${encoded}`, { body }));
            assertOk(await gw.req('POST', `${p}?key=sk%2d${key.slice(3)}`, { body }));
            assertError(await gw.req('POST', `${p}?key=${key}%00`, { body }), 401, { code: 'invalid_token' });
            assertError(await gw.req('POST', `${p}?key=${key}%20`, { body }), 401, { code: 'invalid_token' });
        });

        test('a ?key= works and shows masked in the access and error logs', async () => {
            const p = `/v1beta/models/${M.keylog}`;
            const body = ttsBody('keylog');
            /* past client_header_buffer_size (1k): a large header buffer */
            const pad = 'p'.repeat(1500);
            const wrong = `sk-${hex(24)}`;
            const stars = '*'.repeat(key.length);
            const frames = geminiStreamFrames(['masked']);
            gm.handler = (req, res, rec) => {
                if (!rec.path.includes(':stream')) {
                    return sendJson(res, 200, geminiAudioText());
                }
                sseHead(res);
                res.end(frames.join(''));
            };

            assertOk(await gw.req('POST', `${p}:generateContent?key=${key}`, { body }));
            const s = assertOk(await gw.req('POST', `${p}:streamGenerateContent?alt=sse&key=${key}`,
                { body }));
            assert.equal(sseEvents(s.text).length, 1);
            assert.equal(last(gm).path, `${p}:streamGenerateContent?alt=sse`);
            assertOk(await gw.req('POST', `${p}:generateContent?pad=${pad}&key=${key}`, { body }));
            assertError(await gw.req('POST', `${p}:generateContent?key=${wrong}`, { body }), 401,
                { code: 'invalid_token' });
            assertError(await gw.req('GET', `/v1beta/models?key=${key}`), 404,
                { code: 'invalid_url' });

            /* a line is written just after its answer */
            const keyLines = (text) => text.split('\n').filter((l) => l.includes(M.keylog)
                || l.includes('/v1beta/models?'));
            const access = await eventually(() => {
                const text = fs.readFileSync(path.join(gw.dir, 'keys.log'), 'utf8');
                assert.equal(keyLines(text).length, 5, text);
                return text;
            }, { ms: 3000 });
            const errors = gw.errorLog();
            for (const secret of [key.slice(3), wrong.slice(3)]) {
                assert.ok(!access.includes(secret), `access log:\n${access}`);
                assert.ok(!errors.includes(secret), 'the error log holds a key');
            }
            const lines = keyLines(access);
            const q = `alt=sse&key=${stars}`;
            assert.equal(lines[1], `"POST ${p}:streamGenerateContent?${q} HTTP/1.1"`
                + ` ${p}:streamGenerateContent?${q} ${q} ${stars}`);
            assert.ok(lines[2].includes(`?pad=${pad}&key=${stars} HTTP/1.1"`), lines[2]);
            assert.ok(lines[3].includes(`?key=${'*'.repeat(wrong.length)} HTTP/1.1"`), lines[3]);
            assert.ok(lines[4].startsWith(`"GET /v1beta/models?key=${stars} `), lines[4]);
            assert.ok(errors.includes(`request: "POST ${p}:generateContent?key=${stars} HTTP/1.1"`),
                'the error log names the request, masked');
        });

        test('every spelling of a key parameter shows masked in the access and error logs: KEY=, %6Bey=, k%65y=, ;key=', async () => {
            const p = `/v1beta/models/${M.keylog}:generateContent`;
            const body = ttsBody('spellings');
            const other = `sk-${hex(24)}`;
            const stars = '*'.repeat(key.length);
            gm.handler = (req, res) => sendJson(res, 200, geminiAudioText());

            /* read as the key: the name in any case, after a '&' */
            assertOk(await gw.req('POST', `${p}?KEY=${key}&sp=1`, { body }));
            /* not read (no key is sent), but plainly keys */
            for (const q of [`%6Bey=${key}&sp=2`, `k%65y=${key}&sp=3`, `alt=json;key=${key}&sp=4`]) {
                assertError(await gw.req('POST', `${p}?${q}`, { body }), 401, { code: 'invalid_token' });
            }
            /* masked from the start: the refused first try logs the request */
            assertOk(await gw.req('POST', `${p}?sp=5&%6B%65%79=${other};x=1`, { key, body }));

            const access = await eventually(() => {
                const text = fs.readFileSync(path.join(gw.dir, 'keys.log'), 'utf8');
                assert.ok(text.includes('sp=5'), text);
                return text;
            }, { ms: 3000 });
            const errors = gw.errorLog();
            for (const secret of [key.slice(3), other.slice(3)]) {
                assert.ok(!access.includes(secret), `access log:\n${access}`);
                assert.ok(!errors.includes(secret), 'the error log holds a key');
            }
            const line = (q, argKey = '-') => `"POST ${p}?${q} HTTP/1.1" ${p}?${q} ${q} ${argKey}\n`;
            assert.ok(access.includes(line(`KEY=${stars}&sp=1`, stars)), access);
            assert.ok(access.includes(line(`%6Bey=${stars}&sp=2`)), access);
            assert.ok(access.includes(line(`k%65y=${stars}&sp=3`)), access);
            assert.ok(access.includes(line(`alt=json;key=${stars}&sp=4`)), access);
            const sp5 = `sp=5&%6B%65%79=${'*'.repeat(other.length + 4)}`;
            assert.ok(access.includes(line(sp5)), access);
            assert.ok(errors.includes(`request: "POST ${p}?KEY=${stars}&sp=1 HTTP/1.1"`),
                'the error log names the request, masked');
            assert.ok(errors.includes(`request: "POST ${p}?${sp5} HTTP/1.1"`),
                'the error log names the request, masked');
        });

        test('a ?key= is masked also where nginx refuses before the gateway, and on /api and /metrics', async () => {
            const p = `/v1beta/models/${M.keylog}:generateContent`;
            const stars = '*'.repeat(key.length);
            /* a Content-Length over client_max_body_size (1m) is refused
               before any location is chosen, and logged then */
            const big = JSON.stringify({ contents: [{ parts: [{ text: 'x'.repeat(1100000) }] }] });
            assertError(await gw.req('POST', `${p}?key=${key}`,
                { body: big, headers: { 'Content-Type': 'application/json' } }), 413,
            { code: 'request_too_large' });
            await gw.req('GET', `/api/user/1?key=${key}`);
            await gw.req('GET', `/metrics?key=${key}`);

            const access = await eventually(() => {
                const text = fs.readFileSync(path.join(gw.dir, 'keys.log'), 'utf8');
                assert.ok(text.includes('/metrics?key='), text);
                return text;
            }, { ms: 3000 });
            assert.ok(!access.includes(key.slice(3)), `access log:\n${access}`);
            assert.ok(!gw.errorLog().includes(key.slice(3)), 'the error log holds a key');
            assert.ok(access.includes(`"POST ${p}?key=${stars} HTTP/1.1"`), access);
            assert.ok(access.includes(`"GET /api/user/1?key=${stars} HTTP/1.1"`), access);
            assert.ok(gw.errorLog().includes(`client intended to send too large body`));
        });

        test('a key in a fragment, and in a head nginx refuses (a bad or too large header, a URI too long, a head that never ends), shows masked in the access log', async () => {
            /* a key of its own: nginx's info lines about such heads, written
               before any module sees them, quote the request as it came */
            const { key: k } = await makeUserKey(gw);
            const stars = '*'.repeat(k.length);
            const p = `/v1beta/models/${M.keylog}:generateContent`;
            const body = ttsBody('fragment');
            const post = (target) => rawHttp(gw.port, `POST ${target} HTTP/1.1\r\nHost: x\r\n`
                + `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n`
                + `Connection: close\r\n\r\n${body}`);
            const get = (target, head = '') => rawHttp(gw.port,
                `GET ${target} HTTP/1.1\r\nHost: x\r\n${head}Connection: close\r\n\r\n`);

            /* a fragment is no part of the query ($args ends before it),
               but $request and $request_uri show it as it came */
            const n = gm.requests.length;
            assert.equal((await post(`${p}?alt=json#&key=${k}`)).status, 401);
            assert.equal(gm.requests.length, n);
            assert.equal((await get(`${p}?key=${k}`, 'Host: y\r\n')).status, 400);
            assert.equal((await get(`${p}?key=${k}`, `X-Big: ${'b'.repeat(9000)}\r\n`)).status, 400);
            assert.equal((await get(`${p}?key=${k}&pad=${'p'.repeat(9000)}`)).status, 414);
            /* a head that never ends: nginx closes it after
               client_header_timeout, and logs it with 408 */
            for (const head of [`GET ${p}?key=${k}&cut=head HTTP/1.1\r\nHost: x\r\n`,
                `GET ${p}?key=${k}&cut=line`]) {
                await new Promise((resolve) => {
                    const sock = net.connect(slowPort, '127.0.0.1');
                    sock.on('close', resolve);
                    sock.on('error', resolve);
                    sock.setTimeout(5000, () => sock.destroy());
                    sock.write(head);
                });
            }

            const access = await eventually(() => {
                const text = fs.readFileSync(path.join(gw.dir, 'keys.log'), 'utf8');
                assert.ok(text.includes('&pad=ppp') && text.includes('&cut=line'), text);
                return text;
            }, { ms: 3000 });
            assert.ok(!access.includes(k.slice(3)), `access log:\n${access}`);
            const q = `alt=json#&key=${stars}`;
            assert.ok(access.includes(`"POST ${p}?${q} HTTP/1.1" ${p}?${q} alt=json -\n`), access);
            assert.equal(access.split(`"GET ${p}?key=${stars} HTTP/1.1" ${p}?key=${stars}`).length, 3,
                access);
            assert.ok(access.includes(`"GET ${p}?key=${stars}&pad=ppp`), access);
            assert.ok(access.includes(`"GET ${p}?key=${stars}&cut=head HTTP/1.1" `), access);
            assert.ok(access.includes(`"GET ${p}?key=${stars}&cut=line" - - -`), access);
            const loud = gw.errorLog().split('\n').filter((l) => l.includes(k.slice(3))
                && !/ \[(info|debug)\] /.test(l));
            assert.deepEqual(loud, []);
        });

        test('a ?key= works in a gateway location reached by an internal redirect', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiAudioText());
            const r = await gw.req('POST', `/v1beta/models/${M.redirected}:generateContent?key=${key}`,
                { body: ttsBody('redirected') });
            assertOk(r);
            assert.equal(last(gm).headers['x-goog-api-key'], gmKey);
        });

        test('over HTTP/2 a ?key= works and shows masked in the access and error logs', async () => {
            const p = `/v1beta/models/${M.keylog}:generateContent`;
            const stars = '*'.repeat(key.length);
            gm.handler = (req, res) => sendJson(res, 200, geminiAudioText());
            const session = http2.connect(`http://127.0.0.1:${h2port}`);
            try {
                const post = (query) => new Promise((resolve, reject) => {
                    const s = session.request({
                        ':method': 'POST', ':path': `${p}?${query}`,
                        'content-type': 'application/json',
                    });
                    let status = 0;
                    let text = '';
                    s.setEncoding('utf8');
                    s.on('response', (h) => { status = h[':status']; });
                    s.on('data', (d) => { text += d; });
                    s.on('end', () => resolve({ status, text }));
                    s.on('error', reject);
                    s.end(ttsBody('h2'));
                });
                const r = await post(`h2=1&key=${key}`);
                assert.equal(r.status, 200, r.text);
                assert.ok(JSON.parse(r.text).candidates);
            } finally {
                session.close();
            }
            assert.equal(last(gm).headers['x-goog-api-key'], gmKey);
            assert.ok(!last(gm).path.includes(key.slice(3)));

            /* the log line is written as the stream closes, just after
               the answer */
            const q = `h2=1&key=${stars}`;
            const access = await eventually(() => {
                const text = fs.readFileSync(path.join(gw.dir, 'keys.log'), 'utf8');
                assert.ok(text.includes(`"POST ${p}?${q} HTTP/2.0" ${p}?${q} ${q} ${stars}`), text);
                return text;
            }, { ms: 3000 });
            assert.ok(!access.includes(key.slice(3)), `access log:\n${access}`);
            assert.ok(!gw.errorLog().includes(key.slice(3)), 'the error log holds a key');
            assert.ok(gw.errorLog().includes(`request: "POST ${p}?${q} HTTP/2.0"`),
                'the error log names the request, masked');
        });

        test('model_mapping rewrites the model in the upstream URL only', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiAudioText());
            const body = ttsBody('mapped');
            const r = await gw.req('POST', `/v1beta/models/${M.ttsMapped}:generateContent`, { key, body });
            assertOk(r);
            assert.equal(last(gm).path, '/v1beta/models/gemini-2.5-flash-preview-tts:generateContent');
            assert.equal(last(gm).body, body);
        });

        test('the model is one escaped path segment upstream, the head exactly ours', async () => {
            const heads = [];
            gm.handler = (req, res) => {
                heads.push(req.rawHeaders.filter((h, i) => i % 2 === 0));
                sendJson(res, 200, geminiText());
            };
            assertOk(await gw.req('POST', `/v1beta/models/${encodeURIComponent(M.odd)}:generateContent`,
                { key, body: ttsBody('odd') }));
            assert.equal(last(gm).path,
                `/v1beta/models/${M.odd.replace(' x?y#z%:w', '%20x%3Fy%23z%25%3Aw')}:generateContent`);
            assertOk(await gw.chat(key, M.oddMapped));
            assert.equal(last(gm).path, '/v1beta/models/tuned%2Fup%20x:generateContent');
            for (const names of heads) {
                assert.deepEqual(names, ['Host', 'Content-Type', 'Content-Length', 'Connection',
                    'x-goog-api-key']);
            }
            assert.equal(last(gm).headers['x-goog-api-key'], gmKey);
        });

        test('streamGenerateContent?alt=sse: events pass through in order', async () => {
            const frames = geminiStreamFrames(['Hel', 'lo ', 'there']);
            gm.handler = async (req, res) => {
                sseHead(res);
                for (const f of frames) {
                    res.write(f);
                    await new Promise((s) => setTimeout(s, 50));
                }
                res.end();
            };
            const body = ttsBody('stream me');
            const r = await gw.req('POST', `/v1beta/models/${M.tts}:streamGenerateContent?alt=sse`, { key, body });
            assertOk(r);
            assert.match(r.headers['content-type'], /^text\/event-stream/);
            const up = last(gm);
            assert.equal(up.path, `/v1beta/models/${M.tts}:streamGenerateContent?alt=sse`);
            assert.equal(up.headers['x-goog-api-key'], gmKey);
            assert.equal(up.body, body);
            const got = sseEvents(r.text).map((e) => JSON.parse(e.data));
            const want = frames.map((f) => JSON.parse(f.slice(6)));
            assert.deepEqual(got, want);
        });

        test('streamGenerateContent without alt=sse: one JSON array, written as the events come', async () => {
            const frames = geminiStreamFrames(['Hel', 'lo ', 'there']);
            const want = frames.map((f) => JSON.parse(f.slice(6)));
            gm.handler = async (req, res) => {
                sseHead(res);
                for (const f of frames) {
                    res.write(f);
                    await new Promise((s) => setTimeout(s, 150));
                }
                res.end();
            };
            for (const q of ['', '?alt=json', `?key=${key}`]) {
                const r = await gw.req('POST', `/v1beta/models/${M.tts}:streamGenerateContent${q}`,
                    { key: q.includes('key=') ? undefined : key, body: ttsBody('array') });
                assertOk(r);
                assert.match(r.headers['content-type'], /^application\/json/);
                assert.equal(r.headers['content-length'], undefined);
                /* the upstream is always asked for events */
                assert.equal(last(gm).path, `/v1beta/models/${M.tts}:streamGenerateContent?alt=sse`);
                assert.deepEqual(JSON.parse(r.text), want);
                assert.ok(r.text.startsWith('['), r.text);
                /* the first answer reached the client before the upstream's last */
                const first = r.chunks.find((c) => c.text.toString().includes('Hel'));
                assert.ok(first.t <= r.tEnd - 200, `first answer at ${first.t - r.t0} ms, end at ${r.tEnd - r.t0} ms`);
            }
        });

        test('streamGenerateContent without alt=sse answered with one JSON body: an array of it', async () => {
            const whole = geminiAudioText();
            gm.handler = (req, res) => sendJson(res, 200, whole);
            const r = await gw.req('POST', `/v1beta/models/${M.tts}:streamGenerateContent`,
                { key, body: ttsBody('whole array') });
            assertOk(r);
            assert.match(r.headers['content-type'], /^application\/json/);
            assert.deepEqual(JSON.parse(r.text), [JSON.parse(whole)]);
        });

        test('streamGenerateContent answered with one JSON body: one event of that answer', async () => {
            const whole = geminiAudioText();       /* JSON text */
            gm.handler = (req, res) => sendJson(res, 200, whole);
            const r = await gw.req('POST', `/v1beta/models/${M.tts}:streamGenerateContent?alt=sse`,
                { key, body: ttsBody('whole') });
            assertOk(r);
            assert.match(r.headers['content-type'], /^text\/event-stream/);
            assert.deepEqual(sseEvents(r.text).map((e) => JSON.parse(e.data)),
                [JSON.parse(whole)]);
        });

        test('an upstream Gemini error comes back in Gemini\'s shape, with the request id', async () => {
            gm.handler = (req, res) => sendJson(res, 400, {
                error: { code: 400, message: 'Unsupported voice: Nobody', status: 'INVALID_ARGUMENT' },
            });
            for (const verb of ['generateContent', 'streamGenerateContent?alt=sse']) {
                const r = await gw.req('POST', `/v1beta/models/${M.tts}:${verb}`, { key, body: ttsBody() });
                assert.equal(r.status, 400, r.text);
                const id = r.headers['x-request-id'];
                assert.deepEqual(r.json, { error: {
                    code: 400, message: `Unsupported voice: Nobody (request id: ${id})`,
                    status: 'INVALID_ARGUMENT', type: 'upstream_error' } });
            }
            /* no status of its own: the one of the HTTP status */
            gm.handler = (req, res) => sendJson(res, 429, { error: { message: 'slow down' } });
            const r = await gw.req('POST', `/v1beta/models/${M.tts}:generateContent`, { key, body: ttsBody() });
            assert.equal(r.status, 429, r.text);
            assert.equal(r.json.error.status, 'RESOURCE_EXHAUSTED');
            assert.equal(r.json.error.code, 429);
            gm.handler = (req, res) => sendJson(res, 200, geminiAudioText());
        });

        test('400 when contents is missing; the upstream is not called', async () => {
            const n = gm.requests.length;
            const r = await gw.req('POST', `/v1beta/models/${M.tts}:generateContent`, {
                key, body: { generationConfig: { responseModalities: ['AUDIO'] } },
            });
            assertError(r, 400, { code: 'invalid_request' });
            assert.equal(gm.requests.length, n);
        });

        test('a speech model without generationConfig: 400 naming it, the upstream not called; a text model is served without it', async () => {
            const n = gm.requests.length;
            const contents = [{ role: 'user', parts: [{ text: 'Say hi' }] }];
            for (const verb of ['generateContent', 'streamGenerateContent?alt=sse']) {
                const r = await gw.req('POST', `/v1beta/models/${M.tts}:${verb}`,
                    { key, body: { contents } });
                assertError(r, 400, { code: 'invalid_request',
                    message: 'field generationConfig is required' });
            }
            assert.equal(gm.requests.length, n);

            gm.handler = (req, res) => sendJson(res, 200, geminiText());
            assertOk(await gw.req('POST', `/v1beta/models/${M.viaGemini}:generateContent`,
                { key, body: { contents } }));
            assert.equal(gm.requests.length, n + 1);
            gm.handler = (req, res) => sendJson(res, 200, geminiAudioText());
        });
    });

    /* ============================================================== */
    describe('rerank', () => {
        const rerank = (body, path = '/v1/rerank') => gw.req('POST', path, { key, body });

        /* The answer shape every upstream must be normalised to. */
        function assertRerank(r, { n, docs = false, input = DOCS }) {
            assertOk(r);
            const j = r.json;
            assert.ok(j && typeof j.id === 'string' && j.id.length > 0, `id: ${r.text}`);
            assert.ok(j.meta && typeof j.meta === 'object' && !Array.isArray(j.meta), `meta: ${r.text}`);
            assert.ok(Array.isArray(j.results), r.text);
            assert.equal(j.results.length, n, r.text);
            const seen = new Set();
            for (const x of j.results) {
                assert.ok(Number.isInteger(x.index) && x.index >= 0 && x.index < input.length, r.text);
                assert.ok(!seen.has(x.index), `index once: ${r.text}`);
                seen.add(x.index);
                assert.equal(x.relevance_score, SCORES[x.index % 4], `score of ${x.index}: ${r.text}`);
                if (docs) {
                    assert.deepEqual(x.document, { text: input[x.index] }, r.text);
                } else {
                    assert.ok(!('document' in x), `no document unless asked: ${r.text}`);
                }
            }
            for (let i = 1; i < j.results.length; i++) {
                assert.ok(j.results[i - 1].relevance_score >= j.results[i].relevance_score,
                    `sorted by score, highest first: ${r.text}`);
            }
            return j;
        }

        test('400 for a missing model, query or documents, or empty documents', async () => {
            const n = rr.requests.length;
            const cases = [
                [{ query: 'q', documents: DOCS }, 'model_not_specified'],
                [{ model: M.cohere, documents: DOCS }, 'invalid_request',
                    'field query is required'],
                [{ model: M.cohere, query: 'q' }, 'invalid_request', 'field documents is required'],
                [{ model: M.cohere, query: 'q', documents: [] }, 'invalid_request',
                    'documents must be a non-empty array'],
                /* given but of the wrong kind: said so */
                [{ model: M.cohere, query: 5, documents: DOCS }, 'invalid_request',
                    'query must be a non-empty string'],
                [{ model: M.cohere, query: '', documents: DOCS }, 'invalid_request',
                    'query must be a non-empty string'],
                [{ model: M.cohere, query: 'q', documents: 'aa' }, 'invalid_request',
                    'documents must be a non-empty array'],
            ];
            for (const [body, code, message] of cases) {
                const r = await rerank(body);
                assertError(r, 400, message ? { code, message } : { code });
            }
            assert.equal(rr.requests.length, n, 'no upstream call for an invalid request');
        });

        for (const [kind, model, prefix] of [
            ['Cohere (34)', 'cohere', '/cohere'],
            ['Jina (38)', 'jina', '/jina'],
            ['OpenAI-compatible (1)', 'oaRerank', '/oa'],
        ]) {
            test(`${kind}: <base_url>/v1/rerank with the channel key; sorted, no documents by default`, async () => {
                const r = await rerank({ model: M[model], query: 'Where is the Eiffel Tower?', documents: DOCS });
                const j = assertRerank(r, { n: DOCS.length, docs: false });
                assert.deepEqual(j.results.map((x) => x.index), [2, 0, 3, 1]);
                const up = last(rr);
                assert.equal(up.method, 'POST');
                assert.equal(up.path, `${prefix}/v1/rerank`);
                assert.equal(up.headers.authorization, `Bearer ${rrKey}`);
                assert.equal(up.json.query, 'Where is the Eiffel Tower?');
                assert.deepEqual(up.json.documents, DOCS);
                assert.ok(!('top_n' in up.json), `top_n not defaulted: ${up.body}`);
            });

            test(`${kind}: return_documents true gives each result its document; top_n as given`, async () => {
                const r = await rerank({
                    model: M[model], query: 'Paris', documents: DOCS, top_n: 2, return_documents: true,
                });
                const j = assertRerank(r, { n: 2, docs: true });
                assert.deepEqual(j.results.map((x) => x.index), [2, 0]);
                assert.equal(last(rr).json.top_n, 2);
            });
        }

        test('Cohere: meta carries the upstream billed_units', async () => {
            const j = assertRerank(await rerank({ model: M.cohere, query: 'q', documents: DOCS }),
                { n: DOCS.length });
            assert.deepEqual(j.meta.billed_units, { search_units: 1 });
        });

        test('Jina: model_mapping names the upstream model; an id is made when the upstream has none', async () => {
            const j = assertRerank(await rerank({ model: M.jina, query: 'q', documents: DOCS, return_documents: false }),
                { n: DOCS.length });
            assert.equal(last(rr).json.model, 'jina-reranker-v2-base-multilingual');
            assert.ok(j.id);
        });

        test('/v2/rerank (the Cohere v2 client) is served the same way', async () => {
            const r = await rerank({ model: M.cohere, query: 'q', documents: DOCS, top_n: 3 }, '/v2/rerank');
            const j = assertRerank(r, { n: 3 });
            assert.deepEqual(j.results.map((x) => x.index), [2, 0, 3]);
            assert.equal(last(rr).path, '/cohere/v1/rerank');
        });

        test('an upstream rerank error keeps its status and message', async () => {
            rr.handler = (req, res) => sendJson(res, 422, { message: 'too many documents for this model' });
            try {
                const r = await rerank({ model: M.cohere, query: 'q', documents: DOCS });
                assert.equal(r.status, 422, r.text);
                assert.ok(r.text.includes('too many documents'), r.text);
            } finally {
                rr.handler = (req, res, rec) => {
                    const kind = rec.path.startsWith('/cohere') ? 'cohere'
                        : rec.path.startsWith('/jina') ? 'jina' : 'oa';
                    sendJson(res, 200, rerankUpstream(kind, rec.json));
                };
            }
        });
    });

    /* ============================================================== */
    describe('format conversion', () => {
        /* the ledger row of an answer, by its request id */
        const rowOf = async (r, model) => (await waitLogs(gw, { token_id: token.id, model },
            (items) => items.some((i) => i.request_id === r.headers['x-request-id'])))
            .items.find((i) => i.request_id === r.headers['x-request-id']);
        const chatBody = (model, extra = {}) => ({
            model,
            messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello there' }],
            ...extra,
        });

        /* -------- chat -> Anthropic channel -------- */

        test('chat -> Anthropic: system, messages, max_tokens, stop; answer as chat.completion', async () => {
            an.handler = (req, res) => sendJson(res, 200, anthropicMessage({
                model: 'claude-real-1', content: 'Bonjour!',
                usage: { input_tokens: 11, output_tokens: 7 },
            }));
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: chatBody(M.viaClaude, { max_tokens: 50, stop: ['END'], temperature: 0.3 }),
            });
            assertOk(r);
            const up = last(an);
            assert.equal(up.path, '/v1/messages');
            assert.equal(up.headers['x-api-key'], anKey);
            assert.ok(up.headers['anthropic-version'], 'anthropic-version sent');
            assert.equal(up.json.model, 'claude-real-1');
            assert.equal(blocksText(up.json.system), 'be brief');
            assert.equal(up.json.messages.length, 1, up.body);
            assert.equal(up.json.messages[0].role, 'user');
            assert.equal(blocksText(up.json.messages[0].content), 'hello there');
            assert.equal(up.json.max_tokens, 50);
            assert.deepEqual(up.json.stop_sequences, ['END']);
            assert.equal(up.json.temperature, 0.3);

            const j = r.json;
            assert.equal(j.object, 'chat.completion', r.text);
            assert.equal(j.choices.length, 1);
            assert.equal(j.choices[0].message.role, 'assistant');
            assert.equal(j.choices[0].message.content, 'Bonjour!');
            assert.equal(j.choices[0].finish_reason, 'stop');
            assert.equal(j.usage.prompt_tokens, 11);
            assert.equal(j.usage.completion_tokens, 7);
            assert.equal(j.usage.total_tokens, 18);
        });

        test('chat -> Anthropic: max_tokens is always sent (Anthropic requires it)', async () => {
            an.handler = echo;
            assertOk(await gw.req('POST', '/v1/chat/completions', { key, body: chatBody(M.viaClaude) }));
            const mt = last(an).json.max_tokens;
            assert.ok(Number.isInteger(mt) && mt > 0, `max_tokens ${mt}`);
        });

        test('chat -> Anthropic: tools and tool calls both ways; max_tokens stop reason -> length', async () => {
            an.handler = (req, res, rec) => sendJson(res, 200, {
                id: `msg_${hex(6)}`, type: 'message', role: 'assistant', model: rec.json.model,
                content: [
                    { type: 'text', text: 'Let me check.' },
                    { type: 'tool_use', id: 'toolu_01A', name: 'get_weather', input: { city: 'Paris' } },
                ],
                stop_reason: 'tool_use', stop_sequence: null,
                usage: { input_tokens: 30, output_tokens: 12 },
            });
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: chatBody(M.viaClaude, { tools: OPENAI_TOOLS, tool_choice: 'auto' }),
            });
            assertOk(r);
            const upTools = last(an).json.tools;
            assert.equal(upTools.length, 1, last(an).body);
            assert.equal(upTools[0].name, 'get_weather');
            assert.equal(upTools[0].description, 'Weather of a city');
            assert.deepEqual(upTools[0].input_schema, WEATHER_SCHEMA);
            const msg = r.json.choices[0].message;
            assert.equal(r.json.choices[0].finish_reason, 'tool_calls');
            assert.equal(msg.tool_calls.length, 1, r.text);
            assert.equal(msg.tool_calls[0].type, 'function');
            assert.equal(msg.tool_calls[0].id, 'toolu_01A');
            assert.equal(msg.tool_calls[0].function.name, 'get_weather');
            assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris' });

            /* the follow-up turn with the tool result */
            an.handler = (req, res, rec) => sendJson(res, 200, {
                ...anthropicMessage({ model: rec.json.model, content: 'It is sunny.' }),
                stop_reason: 'max_tokens',
            });
            const r2 = await gw.req('POST', '/v1/chat/completions', {
                key,
                body: {
                    model: M.viaClaude, tools: OPENAI_TOOLS,
                    messages: [
                        { role: 'user', content: 'Weather in Paris?' },
                        { role: 'assistant', content: null, tool_calls: [{ id: 'toolu_01A', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
                        { role: 'tool', tool_call_id: 'toolu_01A', content: '{"sky":"sunny"}' },
                    ],
                },
            });
            assertOk(r2);
            const msgs = last(an).json.messages;
            assert.equal(msgs.length, 3, last(an).body);
            assert.equal(msgs[1].role, 'assistant');
            const use = msgs[1].content.find((b) => b.type === 'tool_use');
            assert.ok(use, last(an).body);
            assert.equal(use.id, 'toolu_01A');
            assert.equal(use.name, 'get_weather');
            assert.deepEqual(use.input, { city: 'Paris' });
            assert.equal(msgs[2].role, 'user');
            const res = msgs[2].content.find((b) => b.type === 'tool_result');
            assert.ok(res, last(an).body);
            assert.equal(res.tool_use_id, 'toolu_01A');
            assert.equal(blocksText(res.content), '{"sky":"sunny"}');
            assert.equal(r2.json.choices[0].message.content, 'It is sunny.');
            assert.equal(r2.json.choices[0].finish_reason, 'length');
        });

        test('chat -> Anthropic: a data-URL image becomes a base64 image block', async () => {
            an.handler = echo;
            const r = await gw.req('POST', '/v1/chat/completions', {
                key,
                body: {
                    model: M.viaClaude, max_tokens: 20,
                    messages: [{
                        role: 'user', content: [
                            { type: 'text', text: 'What is this?' },
                            { type: 'image_url', image_url: { url: `data:image/png;base64,${PNG_B64}` } },
                        ],
                    }],
                },
            });
            assertOk(r);
            const content = last(an).json.messages[0].content;
            assert.ok(Array.isArray(content), last(an).body);
            assert.deepEqual(content.find((b) => b.type === 'image'),
                { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG_B64 } });
            assert.equal(blocksText(content), 'What is this?');
        });

        test('chat -> Anthropic stream: chat.completion.chunk events, usage only when asked', async () => {
            an.handler = (req, res, rec) => anthropicStream(res, ['Bon', 'jour'], {
                model: rec.json.model, usage: { input_tokens: 10, output_tokens: 20 },
            });
            for (const asked of [false, true]) {
                const extra = asked ? { stream: true, stream_options: { include_usage: true } } : { stream: true };
                const r = await gw.req('POST', '/v1/chat/completions', { key, body: chatBody(M.viaClaude, extra) });
                assertOk(r);
                assert.match(r.headers['content-type'], /^text\/event-stream/);
                assert.equal(last(an).json.stream, true);
                const ev = sseEvents(r.text);
                assert.equal(ev[ev.length - 1].data, '[DONE]', r.text);
                const chunks = chatChunks(r.text);
                assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk'), r.text);
                assert.equal(deltaText(chunks), 'Bonjour');
                assert.ok(chunks.some((c) => c.choices && c.choices[0] && c.choices[0].finish_reason === 'stop'),
                    `finish_reason stop: ${r.text}`);
                const usage = chunks.filter((c) => c.usage);
                if (asked) {
                    assert.equal(usage.length, 1, r.text);
                    assert.equal(usage[0].usage.prompt_tokens, 10);
                    assert.equal(usage[0].usage.completion_tokens, 20);
                } else {
                    assert.equal(usage.length, 0, `no usage chunk unless asked: ${r.text}`);
                }
                const row = (await waitLogs(gw, { token_id: token.id, model: M.viaClaude },
                    (items) => items.some((i) => i.request_id === r.headers['x-request-id'])))
                    .items.find((i) => i.request_id === r.headers['x-request-id']);
                assert.equal(row.prompt_tokens, 10);
                assert.equal(row.completion_tokens, 20);
                assert.equal(row.is_stream, true);
            }
        });

        test('chat -> Anthropic: an upstream error comes back in the OpenAI error format', async () => {
            an.handler = (req, res) => anthropicError(res, 400, 'max_tokens: 999999 > 8192, the maximum');
            const r = await gw.req('POST', '/v1/chat/completions', { key, body: chatBody(M.viaClaude, { max_tokens: 999999 }) });
            assert.equal(r.status, 400, r.text);
            assert.ok(r.json && r.json.error && typeof r.json.error === 'object', r.text);
            assert.ok(r.json.error.message.includes('max_tokens: 999999 > 8192'), r.text);
            assert.equal(typeof r.json.error.type, 'string');
            assert.ok(!('type' in r.json && r.json.type === 'error'), `not the Anthropic shape: ${r.text}`);
        });

        /* -------- chat -> Gemini channel -------- */

        test('chat -> Gemini: contents, systemInstruction, generationConfig; answer as chat.completion', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiText({
                text: 'Salut!',
                usage: { promptTokenCount: 12, candidatesTokenCount: 30, thoughtsTokenCount: 5, totalTokenCount: 47 },
            }));
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: chatBody(M.viaGemini, { max_tokens: 64, temperature: 0.2, stop: ['END'] }),
            });
            assertOk(r);
            const up = last(gm);
            assert.equal(up.path, `/v1beta/models/${M.viaGemini}:generateContent`);
            assert.equal(up.headers['x-goog-api-key'], gmKey);
            assert.ok(!up.headers.authorization || !up.headers.authorization.includes(key.slice(3)));
            assert.deepEqual(up.json.contents, [{ role: 'user', parts: [{ text: 'hello there' }] }]);
            assert.deepEqual(up.json.systemInstruction.parts.map((p) => p.text).join(''), 'be brief');
            assert.equal(up.json.generationConfig.maxOutputTokens, 64);
            assert.equal(up.json.generationConfig.temperature, 0.2);
            assert.deepEqual(up.json.generationConfig.stopSequences, ['END']);
            assert.ok(!('model' in up.json) && !('messages' in up.json), up.body);

            const j = r.json;
            assert.equal(j.object, 'chat.completion', r.text);
            assert.equal(j.choices[0].message.role, 'assistant');
            assert.equal(j.choices[0].message.content, 'Salut!');
            assert.equal(j.choices[0].finish_reason, 'stop');
            assert.equal(j.usage.prompt_tokens, 12);
            assert.equal(j.usage.completion_tokens, 35, 'thoughts count as completion');
        });

        test('chat -> Gemini: tools become functionDeclarations; functionCall becomes tool_calls', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiText({
                parts: [{ functionCall: { name: 'get_weather', args: { city: 'Paris' } } }],
            }));
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: chatBody(M.viaGemini, { tools: OPENAI_TOOLS }),
            });
            assertOk(r);
            const decl = last(gm).json.tools.flatMap((t) => t.functionDeclarations || []);
            assert.equal(decl.length, 1, last(gm).body);
            assert.equal(decl[0].name, 'get_weather');
            assert.equal(decl[0].description, 'Weather of a city');
            assert.ok(decl[0].parameters && decl[0].parameters.properties.city, last(gm).body);
            const msg = r.json.choices[0].message;
            assert.equal(r.json.choices[0].finish_reason, 'tool_calls', r.text);
            assert.equal(msg.tool_calls.length, 1, r.text);
            assert.equal(msg.tool_calls[0].type, 'function');
            assert.ok(msg.tool_calls[0].id, 'a tool call id is made');
            assert.equal(msg.tool_calls[0].function.name, 'get_weather');
            assert.deepEqual(JSON.parse(msg.tool_calls[0].function.arguments), { city: 'Paris' });
        });

        test('chat -> Gemini: tool schemas get their $refs in place, allOf merged, a type everywhere', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiText());
            /* as pydantic and zod write them */
            const parameters = {
                type: 'object',
                $defs: { Address: { type: 'object', properties: { street: { type: 'string' } }, required: ['street'] } },
                properties: {
                    home: { $ref: '#/$defs/Address' },
                    unit: { enum: ['c', 'f'] },
                    anything: { description: 'any JSON value' },
                    both: { allOf: [{ $ref: '#/$defs/Address' }], description: 'where to ship' },
                },
                required: ['home', 'unit'],
            };
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: chatBody(M.viaGemini, { tools: [{ type: 'function', function: { name: 'save', parameters } }] }),
            });
            assertOk(r);
            const address = { type: 'object', properties: { street: { type: 'string' } }, required: ['street'] };
            assert.deepEqual(last(gm).json.tools[0].functionDeclarations[0].parameters, {
                type: 'object',
                properties: {
                    home: address,
                    unit: { type: 'string', enum: ['c', 'f'] },
                    anything: { type: 'string', description: 'any JSON value' },
                    both: { ...address, description: 'where to ship' },
                },
                required: ['home', 'unit'],
            });
        });

        test('chat -> Gemini: a tool schema Gemini cannot say is refused before any call, or goes elsewhere', async () => {
            const parameters = {
                type: 'object',
                $defs: { Node: { type: 'object', properties: { children: { type: 'array', items: { $ref: '#/$defs/Node' } } } } },
                properties: { root: { $ref: '#/$defs/Node' } },
            };
            const tools = [{ type: 'function', function: { name: 'walk', parameters } }];
            const g = gm.requests.length;
            for (const stream of [false, true]) {
                const r = await gw.req('POST', '/v1/chat/completions', {
                    key, body: chatBody(M.viaGemini, { stream, tools }),
                });
                assertError(r, 400, { code: 'invalid_request' });
                assert.match(r.json.error.message,
                    /^tools\[0\] \("walk"\): parameters\.properties\.root\.properties\.children\.items: the recursive \$ref "#\/\$defs\/Node"/);
            }
            assert.equal(gm.requests.length, g, 'the Gemini channel was not called');

            /* a model with an OpenAI channel too: that one takes it as is */
            oa.handler = (req, res, rec) => sendJson(res, 200, openaiChat({ model: rec.json.model }));
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: chatBody(M.mixGemini, { tools }),
            });
            assertOk(r);
            assert.deepEqual(last(oa).json.tools, tools);
            assert.equal(gm.requests.length, g, 'the Gemini channel was not called');
        });

        test('chat -> Gemini: images become inlineData; MAX_TOKENS -> length', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiText({ text: 'A pixel', finishReason: 'MAX_TOKENS' }));
            const r = await gw.req('POST', '/v1/chat/completions', {
                key,
                body: {
                    model: M.viaGemini,
                    messages: [{
                        role: 'user', content: [
                            { type: 'text', text: 'What is this?' },
                            { type: 'image_url', image_url: { url: `data:image/png;base64,${PNG_B64}` } },
                        ],
                    }],
                },
            });
            assertOk(r);
            const parts = last(gm).json.contents[0].parts;
            assert.deepEqual(parts.find((p) => p.inlineData), { inlineData: { mimeType: 'image/png', data: PNG_B64 } });
            assert.equal(parts.filter((p) => p.text).map((p) => p.text).join(''), 'What is this?');
            assert.equal(r.json.choices[0].finish_reason, 'length');
        });

        test('chat -> Gemini: empty text parts are not sent, nor a message left with none', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiText({ text: 'A pixel' }));
            const r = await gw.req('POST', '/v1/chat/completions', {
                key,
                body: {
                    model: M.viaGemini,
                    messages: [
                        { role: 'user', content: [
                            { type: 'text', text: '' },
                            { type: 'image_url', image_url: { url: `data:image/png;base64,${PNG_B64}` } },
                        ] },
                        { role: 'assistant', content: [{ type: 'text', text: 'seen' }] },
                        { role: 'user', content: [{ type: 'text', text: 'describe' }, { type: 'text', text: '' }] },
                        { role: 'assistant', content: [{ type: 'text', text: '' }] },
                    ],
                },
            });
            assertOk(r);
            assert.deepEqual(last(gm).json.contents, [
                { role: 'user', parts: [{ inlineData: { mimeType: 'image/png', data: PNG_B64 } }] },
                { role: 'model', parts: [{ text: 'seen' }] },
                { role: 'user', parts: [{ text: 'describe' }] },
            ]);
        });

        test('chat -> Gemini stream: streamGenerateContent?alt=sse re-framed as chunks', async () => {
            gm.handler = async (req, res) => {
                sseHead(res);
                for (const f of geminiStreamFrames(['Hel', 'lo'])) {
                    res.write(f);
                }
                res.end();
            };
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: chatBody(M.viaGemini, { stream: true, stream_options: { include_usage: true } }),
            });
            assertOk(r);
            assert.equal(last(gm).path, `/v1beta/models/${M.viaGemini}:streamGenerateContent?alt=sse`);
            assert.match(r.headers['content-type'], /^text\/event-stream/);
            const ev = sseEvents(r.text);
            assert.equal(ev[ev.length - 1].data, '[DONE]', r.text);
            const chunks = chatChunks(r.text);
            assert.ok(chunks.every((c) => c.object === 'chat.completion.chunk'), r.text);
            assert.equal(deltaText(chunks), 'Hello');
            assert.ok(chunks.some((c) => c.choices && c.choices[0] && c.choices[0].finish_reason === 'stop'), r.text);
            const u = chunks.filter((c) => c.usage);
            assert.equal(u.length, 1, r.text);
            assert.equal(u[0].usage.prompt_tokens, 5);
            assert.equal(u[0].usage.completion_tokens, 7);
        });

        test('chat -> Gemini: an upstream error comes back in the OpenAI error format', async () => {
            gm.handler = (req, res) => sendJson(res, 400, {
                error: { code: 400, message: 'Request contains an invalid argument.', status: 'INVALID_ARGUMENT' },
            });
            const r = await gw.req('POST', '/v1/chat/completions', { key, body: chatBody(M.viaGemini) });
            assert.equal(r.status, 400, r.text);
            assert.ok(r.json && r.json.error && typeof r.json.error.message === 'string', r.text);
            assert.ok(r.json.error.message.includes('Request contains an invalid argument.'), r.text);
            assert.equal(typeof r.json.error.type, 'string', r.text);
        });

        /* -------- messages -> OpenAI channel -------- */

        const msgBody = (extra = {}) => ({
            model: M.viaOpenai, max_tokens: 64, system: 'be brief',
            messages: [{ role: 'user', content: 'hello there' }], ...extra,
        });

        test('messages -> OpenAI: system, messages, max_tokens, stop; answer as an Anthropic message', async () => {
            oa.handler = (req, res, rec) => sendJson(res, 200, openaiChat({
                model: rec.json.model, content: 'Hi!', usage: { prompt_tokens: 13, completion_tokens: 4 },
            }));
            const r = await gw.req('POST', '/v1/messages', {
                key, body: msgBody({ stop_sequences: ['END'], temperature: 0.4 }),
            });
            assertOk(r);
            const up = last(oa);
            assert.equal(up.path, '/v1/chat/completions');
            assert.equal(up.headers.authorization, `Bearer ${oaKey}`);
            assert.equal(up.json.model, M.viaOpenai);
            assert.equal(up.json.messages.length, 2, up.body);
            assert.equal(up.json.messages[0].role, 'system');
            assert.equal(partsText(up.json.messages[0].content), 'be brief');
            assert.equal(up.json.messages[1].role, 'user');
            assert.equal(partsText(up.json.messages[1].content), 'hello there');
            assert.equal(up.json.max_tokens ?? up.json.max_completion_tokens, 64);
            assert.deepEqual([].concat(up.json.stop), ['END']);
            assert.equal(up.json.temperature, 0.4);

            const j = r.json;
            assert.equal(j.type, 'message', r.text);
            assert.equal(j.role, 'assistant');
            assert.deepEqual(j.content, [{ type: 'text', text: 'Hi!' }]);
            assert.equal(j.stop_reason, 'end_turn');
            assert.equal(j.usage.input_tokens, 13);
            assert.equal(j.usage.output_tokens, 4);
            assert.ok(typeof j.id === 'string' && j.id.length > 0);
        });

        test('messages -> OpenAI: tools and tool_use both ways; length -> max_tokens', async () => {
            oa.handler = (req, res, rec) => sendJson(res, 200, {
                id: 'chatcmpl-t', object: 'chat.completion', created: 1, model: rec.json.model,
                choices: [{
                    index: 0, finish_reason: 'tool_calls',
                    message: {
                        role: 'assistant', content: null,
                        tool_calls: [{ id: 'call_9', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }],
                    },
                }],
                usage: { prompt_tokens: 20, completion_tokens: 9, total_tokens: 29 },
            });
            const r = await gw.req('POST', '/v1/messages', { key, body: msgBody({ tools: ANTHROPIC_TOOLS }) });
            assertOk(r);
            const upTools = last(oa).json.tools;
            assert.equal(upTools.length, 1, last(oa).body);
            assert.equal(upTools[0].type, 'function');
            assert.equal(upTools[0].function.name, 'get_weather');
            assert.equal(upTools[0].function.description, 'Weather of a city');
            assert.deepEqual(upTools[0].function.parameters, WEATHER_SCHEMA);
            assert.equal(r.json.stop_reason, 'tool_use', r.text);
            const use = r.json.content.find((b) => b.type === 'tool_use');
            assert.ok(use, r.text);
            assert.equal(use.name, 'get_weather');
            assert.deepEqual(use.input, { city: 'Paris' });
            assert.ok(use.id, r.text);

            oa.handler = (req, res, rec) => sendJson(res, 200, {
                ...openaiChat({ model: rec.json.model, content: 'Sunny and' }),
                choices: [{ index: 0, message: { role: 'assistant', content: 'Sunny and' }, finish_reason: 'length' }],
            });
            const r2 = await gw.req('POST', '/v1/messages', {
                key,
                body: msgBody({
                    tools: ANTHROPIC_TOOLS,
                    messages: [
                        { role: 'user', content: 'Weather in Paris?' },
                        { role: 'assistant', content: [{ type: 'tool_use', id: use.id, name: 'get_weather', input: { city: 'Paris' } }] },
                        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny' }] },
                    ],
                }),
            });
            assertOk(r2);
            const msgs = last(oa).json.messages.filter((m) => m.role !== 'system');
            const asst = msgs.find((m) => m.role === 'assistant');
            assert.ok(asst && asst.tool_calls && asst.tool_calls.length === 1, last(oa).body);
            assert.equal(asst.tool_calls[0].id, use.id);
            assert.equal(asst.tool_calls[0].function.name, 'get_weather');
            assert.deepEqual(JSON.parse(asst.tool_calls[0].function.arguments), { city: 'Paris' });
            const tool = msgs.find((m) => m.role === 'tool');
            assert.ok(tool, last(oa).body);
            assert.equal(tool.tool_call_id, use.id);
            assert.equal(partsText(tool.content), 'sunny');
            assert.equal(r2.json.stop_reason, 'max_tokens');
        });

        test('messages -> OpenAI: metadata.user_id is the user, hashed when longer than 64', async () => {
            oa.handler = (req, res, rec) => sendJson(res, 200, openaiChat({ model: rec.json.model }));
            /* what Claude Code sends */
            const long = `user_${hex(32)}_account_${crypto.randomUUID()}_session_${crypto.randomUUID()}`;
            const short = `u-${hex(8)}`;
            for (const [id, user] of [[long, sha256hex(long)], [short, short]]) {
                const r = await gw.req('POST', '/v1/messages', {
                    key, body: msgBody({ metadata: { user_id: id } }),
                });
                assertOk(r);
                assert.equal(last(oa).json.user, user, last(oa).body);
            }
        });

        test('messages -> OpenAI: a base64 image block becomes an image_url data URL', async () => {
            oa.handler = echo;
            const r = await gw.req('POST', '/v1/messages', {
                key,
                body: msgBody({
                    messages: [{
                        role: 'user', content: [
                            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG_B64 } },
                            { type: 'text', text: 'What is this?' },
                        ],
                    }],
                }),
            });
            assertOk(r);
            const content = last(oa).json.messages.find((m) => m.role === 'user').content;
            assert.ok(Array.isArray(content), last(oa).body);
            const img = content.find((p) => p.type === 'image_url');
            assert.ok(img, last(oa).body);
            assert.equal(img.image_url.url, `data:image/png;base64,${PNG_B64}`);
            assert.equal(partsText(content), 'What is this?');
        });

        test('messages -> OpenAI stream: Anthropic events in order, usage from the upstream', async () => {
            oa.handler = (req, res, rec) => openaiStream(res, ['Hello', ' world'], {
                model: rec.json.model, usage: { prompt_tokens: 8, completion_tokens: 2 },
            });
            const r = await gw.req('POST', '/v1/messages', { key, body: msgBody({ stream: true }) });
            assertOk(r);
            assert.match(r.headers['content-type'], /^text\/event-stream/);
            const up = last(oa).json;
            assert.equal(up.stream, true);
            assert.equal(up.stream_options && up.stream_options.include_usage, true,
                'usage asked from the upstream');
            const ev = sseEvents(r.text);
            const names = ev.map((e) => e.event);
            assert.equal(names[0], 'message_start', r.text);
            assert.equal(names[names.length - 1], 'message_stop', r.text);
            for (const n of ['content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta']) {
                assert.ok(names.includes(n), `${n}: ${names}`);
            }
            assert.ok(names.indexOf('content_block_start') < names.indexOf('content_block_delta'));
            assert.ok(names.lastIndexOf('content_block_delta') < names.indexOf('content_block_stop'));
            assert.ok(names.indexOf('content_block_stop') < names.indexOf('message_delta'));
            const data = ev.map((e) => JSON.parse(e.data));
            data.forEach((d, i) => assert.equal(d.type, names[i], 'event name = data.type'));
            const text = data.filter((d) => d.type === 'content_block_delta')
                .map((d) => d.delta.text || '').join('');
            assert.equal(text, 'Hello world');
            const md = data.find((d) => d.type === 'message_delta');
            assert.equal(md.delta.stop_reason, 'end_turn');
            assert.equal(md.usage.output_tokens, 2);
            const row = (await waitLogs(gw, { token_id: token.id, model: M.viaOpenai },
                (items) => items.some((i) => i.request_id === r.headers['x-request-id'])))
                .items.find((i) => i.request_id === r.headers['x-request-id']);
            assert.equal(row.prompt_tokens, 8);
            assert.equal(row.completion_tokens, 2);
        });

        test('messages -> OpenAI stream: interleaved parallel tool calls become whole tool_use blocks', async () => {
            const call = (index, fn, extra = {}) => ({ tool_calls: [{ index, ...extra, function: fn }] });
            const deltas = [
                { role: 'assistant', content: 'Checking both.' },
                call(0, { name: 'get_weather', arguments: '' }, { id: 'call_p', type: 'function' }),
                call(1, { name: 'get_weather', arguments: '' }, { id: 'call_l', type: 'function' }),
                call(0, { arguments: '{"city":' }),
                call(1, { arguments: '{"city":' }),
                call(0, { arguments: '"Paris"}' }),
                call(1, { arguments: '"Lyon"}' }),
            ];
            oa.handler = (req, res, rec) => {
                sseHead(res);
                const chunk = (delta, finish = null, more = {}) => `data: ${JSON.stringify({
                    id: 'chatcmpl-par', object: 'chat.completion.chunk', created: 1, model: rec.json.model,
                    choices: delta ? [{ index: 0, delta, finish_reason: finish }] : [], ...more,
                })}\n\n`;
                for (const d of deltas) {
                    res.write(chunk(d));
                }
                res.write(chunk({}, 'tool_calls'));
                res.write(chunk(null, null, { usage: { prompt_tokens: 30, completion_tokens: 12, total_tokens: 42 } }));
                res.end('data: [DONE]\n\n');
            };
            const r = await gw.req('POST', '/v1/messages', {
                key, body: msgBody({ stream: true, tools: ANTHROPIC_TOOLS }),
            });
            assertOk(r);
            const data = sseEvents(r.text).map((e) => JSON.parse(e.data));
            assert.equal(data[0].type, 'message_start', r.text);
            assert.equal(data[data.length - 1].type, 'message_stop', r.text);

            /* what an Anthropic client assembles: each block's deltas
               between its start and its stop, indexes in order */
            const blocks = [];
            let open = null;
            for (const d of data) {
                if (d.type === 'content_block_start') {
                    assert.equal(open, null, `a block starts inside another: ${r.text}`);
                    assert.equal(d.index, blocks.length, r.text);
                    open = { ...d.content_block, json: '' };
                    blocks.push(open);
                } else if (d.type === 'content_block_delta') {
                    assert.ok(open && d.index === blocks.length - 1, `a delta outside its block: ${r.text}`);
                    if (d.delta.type === 'text_delta') {
                        open.text += d.delta.text;
                    } else {
                        assert.equal(d.delta.type, 'input_json_delta', r.text);
                        open.json += d.delta.partial_json;
                    }
                } else if (d.type === 'content_block_stop') {
                    assert.ok(open && d.index === blocks.length - 1, r.text);
                    open = null;
                } else if (d.type === 'message_delta') {
                    assert.equal(open, null, r.text);
                    assert.equal(d.delta.stop_reason, 'tool_use');
                    assert.equal(d.usage.output_tokens, 12);
                }
            }
            assert.equal(blocks.length, 3, r.text);
            assert.equal(blocks[0].type, 'text');
            assert.equal(blocks[0].text, 'Checking both.');
            assert.deepEqual(blocks.slice(1).map((b) => [b.type, b.id, b.name, JSON.parse(b.json)]), [
                ['tool_use', 'call_p', 'get_weather', { city: 'Paris' }],
                ['tool_use', 'call_l', 'get_weather', { city: 'Lyon' }],
            ]);
        });

        test('chat -> Anthropic stream: tool_use blocks become tool_calls 0, 1, arguments whole', async () => {
            an.handler = (req, res, rec) => {
                sseHead(res);
                const ev = (d) => `event: ${d.type}\ndata: ${JSON.stringify(d)}\n\n`;
                const out = [ev({ type: 'message_start', message: {
                    id: 'msg_par', type: 'message', role: 'assistant', content: [], model: rec.json.model,
                    usage: { input_tokens: 10, output_tokens: 1 },
                } })];
                ['Paris', 'Lyon'].forEach((city, index) => {
                    out.push(ev({ type: 'content_block_start', index, content_block: {
                        type: 'tool_use', id: `toolu_${city}`, name: 'get_weather', input: {},
                    } }));
                    for (const part of ['{"city":', `"${city}"}`]) {
                        out.push(ev({ type: 'content_block_delta', index,
                            delta: { type: 'input_json_delta', partial_json: part } }));
                    }
                    out.push(ev({ type: 'content_block_stop', index }));
                });
                out.push(ev({ type: 'message_delta', delta: { stop_reason: 'tool_use', stop_sequence: null },
                    usage: { output_tokens: 15 } }));
                out.push(ev({ type: 'message_stop' }));
                res.end(out.join(''));
            };
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: chatBody(M.viaClaude, { stream: true, tools: OPENAI_TOOLS }),
            });
            assertOk(r);
            const calls = [];
            for (const c of chatChunks(r.text)) {
                for (const tc of (c.choices[0] && c.choices[0].delta.tool_calls) || []) {
                    if (tc.index === calls.length) {
                        calls.push({ id: tc.id, name: tc.function.name, arguments: '' });
                    } else {
                        assert.equal(tc.index, calls.length - 1, `tool_calls index goes back: ${r.text}`);
                    }
                    calls[tc.index].arguments += tc.function.arguments || '';
                }
            }
            assert.deepEqual(calls.map((c) => [c.id, c.name, JSON.parse(c.arguments)]), [
                ['toolu_Paris', 'get_weather', { city: 'Paris' }],
                ['toolu_Lyon', 'get_weather', { city: 'Lyon' }],
            ]);
            const finish = chatChunks(r.text).find((c) => c.choices[0] && c.choices[0].finish_reason);
            assert.equal(finish.choices[0].finish_reason, 'tool_calls', r.text);
        });

        test('messages -> OpenAI: an upstream error comes back in the Anthropic error format', async () => {
            oa.handler = (req, res) => openaiError(res, 400, "Invalid value for 'temperature'");
            const r = await gw.req('POST', '/v1/messages', { key, body: msgBody({ temperature: 9 }) });
            assert.equal(r.status, 400, r.text);
            assert.ok(r.json, r.text);
            assert.equal(r.json.type, 'error', r.text);
            assert.equal(typeof r.json.error.type, 'string', r.text);
            assert.ok(r.json.error.message.includes("Invalid value for 'temperature'"), r.text);
        });

        /* -------- channels whose format cannot carry the request -------- */

        const audioPart = { type: 'input_audio', input_audio: { data: 'UklGRg==', format: 'wav' } };

        test('a part no channel format can carry: 400 invalid_request naming it; nothing sent', async () => {
            const n = an.requests.length;
            const r = await gw.req('POST', '/v1/chat/completions', {
                key, body: { model: M.viaClaude, messages: [{ role: 'user', content: [audioPart] }] },
            });
            assertError(r, 400, { code: 'invalid_request' });
            assert.match(r.json.error.message, /input_audio/);
            assert.equal(an.requests.length, n, 'the upstream was not called');
        });

        test('a channel that cannot carry the request is left out of the tries', async () => {
            /* the OpenAI channel fails; the Anthropic one cannot take audio:
               the OpenAI channel's error is the answer, as JSON */
            oa.handler = (req, res) => openaiError(res, 503, 'overloaded');
            const n = an.requests.length;
            for (const stream of [false, true]) {
                const r = await gw.req('POST', '/v1/chat/completions', {
                    key, body: { model: M.mix, stream, messages: [{ role: 'user', content: [audioPart] }] },
                });
                assertError(r, 503, { type: 'upstream_error' });
                assert.match(r.json.error.message, /overloaded/);
            }
            assert.equal(an.requests.length, n, 'the Anthropic channel was not called');

            /* an Anthropic server tool: only the Anthropic channel can take
               it, though the OpenAI one comes first */
            an.handler = (req, res) => sendJson(res, 200, anthropicMessage({ content: 'searched' }));
            const m = oa.requests.length;
            const r = await gw.req('POST', '/v1/messages', {
                key, body: {
                    model: M.mix, max_tokens: 32, messages: [{ role: 'user', content: 'news?' }],
                    tools: [{ type: 'web_search_20250305', name: 'web_search', max_uses: 1 }],
                },
            });
            assertOk(r);
            assert.equal(r.json.content[0].text, 'searched');
            assert.equal(oa.requests.length, m, 'the OpenAI channel was not called');
            assert.equal(last(an).json.tools[0].type, 'web_search_20250305');
        });

        test('n above 1 and logprobs: a Gemini channel is left out; with no other, 400 naming the part', async () => {
            oa.handler = (req, res, rec) => sendJson(res, 200, {
                ...openaiChat({ model: rec.json.model }),
                choices: [0, 1].map((index) => ({
                    index, message: { role: 'assistant', content: `choice ${index}` },
                    finish_reason: 'stop', logprobs: { content: [] },
                })),
            });
            const g = gm.requests.length;
            for (const extra of [{ n: 2 }, { logprobs: true, top_logprobs: 2 }]) {
                const r = await gw.req('POST', '/v1/chat/completions', {
                    key, body: chatBody(M.mixGemini, extra),
                });
                assertOk(r);
                assert.equal(r.json.choices.length, 2, r.text);
                assert.equal(last(oa).json.model, M.mixGemini);
                for (const [k, v] of Object.entries(extra)) {
                    assert.equal(last(oa).json[k], v, last(oa).body);
                }
            }
            assert.equal(gm.requests.length, g, 'the Gemini channel was not called');

            for (const [extra, part] of [[{ n: 3 }, /^n: /], [{ logprobs: true }, /^logprobs: /]]) {
                const r = await gw.req('POST', '/v1/chat/completions', {
                    key, body: chatBody(M.viaGemini, extra),
                });
                assertError(r, 400, { code: 'invalid_request' });
                assert.match(r.json.error.message, part);
            }
            assert.equal(gm.requests.length, g, 'the Gemini channel was not called');
        });

        test('a 2xx that cannot be put in the client format is no answer: 502 bad_response_body, uncharged', async () => {

            oa.handler = (req, res) => sendJson(res, 200,
                { error: { message: 'upstream quota exceeded', type: 'insufficient_quota' } });
            for (const stream of [false, true]) {
                const r = await gw.req('POST', '/v1/messages', { key, body: msgBody({ stream }) });
                assertError(r, 502, { type: 'upstream_error', code: 'bad_response_body' });
                const row = await rowOf(r, M.viaOpenai);
                assert.equal(row.type, 'error', JSON.stringify(row));
                assert.equal(row.quota, 0);
            }

            /* asked for a stream, answered one JSON error object under 200 */
            an.handler = (req, res) => sendJson(res, 200,
                { type: 'error', error: { type: 'overloaded_error', message: 'Overloaded' } });
            for (const stream of [false, true]) {
                const r = await gw.req('POST', '/v1/chat/completions', {
                    key, body: chatBody(M.viaClaude, { stream }),
                });
                assertError(r, 502, { type: 'upstream_error', code: 'bad_response_body' });
                assert.equal((await rowOf(r, M.viaClaude)).quota, 0);
            }

            /* the same in the client's own format: a stream request answered
               with one JSON body that is an error object makes no stream */
            const own = [
                [M.viaClaude, '/v1/messages', { ...msgBody({ stream: true }), model: M.viaClaude }],
                [M.viaOpenai, '/v1/chat/completions', chatBody(M.viaOpenai, { stream: true })],
            ];
            oa.handler = (req, res) => sendJson(res, 200,
                { error: { message: 'Rate limit reached', type: 'requests' } });
            for (const [model, path, body] of own) {
                const r = await gw.req('POST', path, { key, body });
                assertError(r, 502, { type: 'upstream_error', code: 'bad_response_body' });
                const row = await rowOf(r, model);
                assert.equal(row.type, 'error', JSON.stringify(row));
                assert.equal(row.quota, 0);
            }

            /* on the next channel when there is one */
            an.handler = (req, res) => sendJson(res, 200,
                anthropicMessage({ model: 'claude-real-1', content: 'from the next one' }));
            const r = await gw.req('POST', '/v1/chat/completions',
                { key, body: chatBody(M.mix, { stream: true }) });
            assertOk(r);
            assert.match(r.text, /from the next one/);
            const row = await rowOf(r, M.mix);
            assert.equal(row.type, 'consume', JSON.stringify(row));
            assert.equal(row.channels_tried.length, 2, JSON.stringify(row));
        });

        test('a stream that opens with the upstream error event is a failure, not charged', async () => {
            const overloaded = 'event: error\ndata: {"type":"error","error":'
                + '{"type":"overloaded_error","message":"Overloaded"}}\n\n';
            an.handler = (req, res) => {
                sseHead(res);
                res.end(overloaded);
            };
            const asks = [
                ['/v1/messages', { model: M.viaClaude, max_tokens: 32, stream: true,
                    messages: [{ role: 'user', content: 'hi' }] }],
                ['/v1/chat/completions', chatBody(M.viaClaude, { stream: true })],
            ];
            for (const [p, body] of asks) {
                const r = await gw.req('POST', p, { key, body });
                assert.equal(r.status, 200, r.text);
                assert.match(r.text, /Overloaded/);
                const row = await rowOf(r, M.viaClaude);
                assert.equal(row.type, 'error', JSON.stringify(row));
                assert.equal(row.status, 502);
                assert.equal(row.quota, 0);
            }

            /* text first, then the error: what was delivered is charged */
            an.handler = (req, res) => {
                sseHead(res);
                res.end('event: message_start\ndata: {"type":"message_start","message":'
                    + '{"id":"msg_1","type":"message","role":"assistant","content":[],'
                    + '"usage":{"input_tokens":10,"output_tokens":1}}}\n\n'
                    + 'event: content_block_delta\ndata: {"type":"content_block_delta",'
                    + '"index":0,"delta":{"type":"text_delta","text":"Hello there"}}\n\n'
                    + overloaded);
            };
            /* passed on or converted alike: cut short, its row says 502 */
            for (const [p, body] of asks) {
                const r = await gw.req('POST', p, { key, body });
                assert.match(r.text, /Hello there/);
                const row = await rowOf(r, M.viaClaude);
                assert.equal(row.type, 'consume', JSON.stringify(row));
                assert.equal(row.status, 502, `${p}: ${JSON.stringify(row)}`);
                assert.equal(row.prompt_tokens, 10, JSON.stringify(row));
                if (p === '/v1/chat/completions') {
                    const events = sseEvents(r.text);
                    const last = JSON.parse(events.at(-1).data);
                    const id = r.headers['x-request-id'];
                    assert.deepEqual(last, { error: { message: `Overloaded (request id: ${id})`,
                        type: 'upstream_error', code: 'overloaded_error' } });
                    assert.ok(!r.text.includes('[DONE]'), r.text);
                }
            }
        });

        test('a stream the upstream ends without one event is a failure, not charged', async () => {
            for (const tail of ['data: [DONE]\n\n', '', ': keep-alive\n\n']) {
                oa.handler = (req, res) => {
                    sseHead(res);
                    res.end(tail);
                };
                const r = await gw.req('POST', '/v1/messages', {
                    key, body: { ...msgBody(), stream: true },
                });
                assert.equal(r.status, 200, r.text);
                assert.match(r.text, /event: error/);
                const row = await rowOf(r, M.viaOpenai);
                assert.equal(row.type, 'error', JSON.stringify(row));
                assert.equal(row.status, 502);
            }
        });

        test('500 convert_request_failed: a chat or messages call for a rerank-only model', async () => {
            const n = rr.requests.length;
            const r = await gw.chat(key, M.cohere);
            assertError(r, 500, { code: 'convert_request_failed' });
            const r2 = await gw.messages(key, M.cohere);
            assert.equal(r2.status, 500, r2.text);
            assert.ok(r2.json && r2.json.error && typeof r2.json.error.message === 'string', r2.text);
            assert.equal(rr.requests.length, n, 'the upstream was not called');
        });
    });
});
