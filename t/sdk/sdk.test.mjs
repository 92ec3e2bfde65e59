// The official client SDKs, pointed only at the gateway's base URL, work
// against it: OpenAI (chat, streamed chat), Anthropic (messages, stream),
// Google GenAI (audio generateContent, stream), Cohere v2 (rerank); and a
// gateway refusal reaches each as that SDK's own error class with the
// right status and message.
//
// Needs `npm install` in t/sdk (scripts/test.sh does it when package.json
// is newer than node_modules) and the same environment as t/integration.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import { ApiError, GoogleGenAI } from '@google/genai';
import { CohereClientV2, CohereError } from 'cohere-ai';
import OpenAI from 'openai';

import {
    createDb, dropDb, hex, makeChannel, makeUserKey, settle, startGateway,
    stopAll, uniq, waitLogs,
} from '../lib/harness.mjs';
import {
    anthropicMessage, anthropicStream, openaiChat, openaiStream, sendJson,
    startMock,
} from '../lib/mock.mjs';

const AUDIO_B64 = Buffer.from(Array.from({ length: 4800 }, (_, i) => (i * 13) & 255))
    .toString('base64');
const DOCS = ['Paris is the capital of France.', 'Bananas are yellow.',
    'The Eiffel Tower is in Paris.'];
const SCORES = [0.61, 0.03, 0.95];

function geminiAudio() {
    return {
        candidates: [{
            content: {
                role: 'model',
                parts: [{ inlineData: { mimeType: 'audio/L16;codec=pcm;rate=24000', data: AUDIO_B64 } }],
            },
            finishReason: 'STOP', index: 0,
            safetyRatings: [{ category: 'HARM_CATEGORY_HATE_SPEECH', probability: 'NEGLIGIBLE' }],
        }],
        usageMetadata: { promptTokenCount: 8, candidatesTokenCount: 150, totalTokenCount: 158 },
        modelVersion: 'gemini-2.5-flash-preview-tts',
    };
}

/* The request id a gateway error message ends with. */
const ridOf = (message) => (/\(request id: ([^)]+)\)/.exec(message) || [])[1];

describe('official SDKs against the gateway', { timeout: 180000 }, () => {
    let db, gw, oa, an, gm, co, key, token;
    const oaKey = `oa-${hex(8)}`;
    const anKey = `an-${hex(8)}`;
    const gmKey = `gm-${hex(8)}`;
    const coKey = `co-${hex(8)}`;
    const M = {
        oa: uniq('gpt-sdk'), an: uniq('claude-sdk'), gm: uniq('gemini-tts-sdk'),
        /* a text model: a speech model's request needs generationConfig */
        gmText: uniq('gemini-sdk'), co: uniq('rerank-sdk'),
    };
    const badKey = `sk-${hex(24)}`;
    const last = (mock) => mock.requests[mock.requests.length - 1];

    before(async () => {
        db = await createDb();
        oa = await startMock(async (req, res, rec) => {
            if (rec.json.stream) {
                await openaiStream(res, ['Hel', 'lo', ' world'], {
                    model: rec.json.model, usage: { prompt_tokens: 5, completion_tokens: 3 },
                });
                return;
            }
            sendJson(res, 200, openaiChat({
                model: rec.json.model, content: 'hello from mock',
                usage: { prompt_tokens: 9, completion_tokens: 4 },
            }));
        });
        an = await startMock(async (req, res, rec) => {
            if (rec.json.stream) {
                await anthropicStream(res, ['Bon', 'jour'], {
                    model: rec.json.model, usage: { input_tokens: 6, output_tokens: 2 },
                });
                return;
            }
            sendJson(res, 200, anthropicMessage({
                model: rec.json.model, content: 'hello from claude',
                usage: { input_tokens: 7, output_tokens: 3 },
            }));
        });
        gm = await startMock((req, res, rec) => {
            if (rec.path.includes(':streamGenerateContent')) {
                res.writeHead(200, { 'Content-Type': 'text/event-stream' });
                for (const [i, t] of ['Good ', 'day'].entries()) {
                    res.write(`data: ${JSON.stringify({
                        candidates: [{
                            content: { role: 'model', parts: [{ text: t }] },
                            ...(i === 1 ? { finishReason: 'STOP' } : {}), index: 0,
                        }],
                        usageMetadata: { promptTokenCount: 4, candidatesTokenCount: i + 1, totalTokenCount: 5 + i },
                    })}\r\n\r\n`);
                }
                res.end();
                return;
            }
            sendJson(res, 200, geminiAudio());
        });
        co = await startMock((req, res, rec) => {
            const top = rec.json.top_n || rec.json.documents.length;
            sendJson(res, 200, {
                id: `co-${hex(6)}`,
                results: rec.json.documents.map((d, i) => ({ index: i, relevance_score: SCORES[i] }))
                    .sort((a, b) => b.relevance_score - a.relevance_score).slice(0, top),
                meta: { api_version: { version: '2' }, billed_units: { search_units: 1 } },
            });
        });
        gw = await startGateway({ db });
        await makeChannel(gw, { type: 1, base_url: oa.url, key: oaKey, models: [M.oa] });
        await makeChannel(gw, { type: 14, base_url: an.url, key: anKey, models: [M.an] });
        await makeChannel(gw, { type: 24, base_url: gm.url, key: gmKey, models: [M.gm, M.gmText] });
        await makeChannel(gw, { type: 34, base_url: co.url, key: coKey, models: [M.co] });
        ({ key, token } = await makeUserKey(gw));
        await settle();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all([oa, an, gm, co].map((m) => m?.close()));
            await dropDb(db);
        }
    });

    /* ---------------- OpenAI ---------------- */

    const openai = (apiKey = key) => new OpenAI({
        apiKey, baseURL: `${gw.url}/v1`, maxRetries: 0, timeout: 20000,
    });

    test('openai: chat.completions.create', async () => {
        const c = await openai().chat.completions.create({
            model: M.oa, messages: [{ role: 'user', content: 'hi' }],
        });
        assert.equal(c.choices[0].message.content, 'hello from mock');
        assert.equal(c.usage.prompt_tokens, 9);
        assert.equal(c.usage.completion_tokens, 4);
        const up = last(oa);
        assert.equal(up.path, '/v1/chat/completions');
        assert.equal(up.headers.authorization, `Bearer ${oaKey}`);
        assert.equal(up.json.model, M.oa);
    });

    test('openai: streamed chat completion', async () => {
        const stream = await openai().chat.completions.create({
            model: M.oa, messages: [{ role: 'user', content: 'hi' }], stream: true,
        });
        let text = '';
        let finish = null;
        let usageChunks = 0;
        for await (const chunk of stream) {
            if (chunk.usage) {
                usageChunks++;
            }
            const ch = chunk.choices[0];
            if (ch) {
                text += ch.delta.content || '';
                finish = ch.finish_reason || finish;
            }
        }
        assert.equal(text, 'Hello world');
        assert.equal(finish, 'stop');
        assert.equal(usageChunks, 0, 'the usage the gateway asked for is not shown');
    });

    test('openai: a bad key raises AuthenticationError 401 with the gateway message', async () => {
        await assert.rejects(openai(badKey).chat.completions.create({
            model: M.oa, messages: [{ role: 'user', content: 'hi' }],
        }), (e) => {
            assert.ok(e instanceof OpenAI.AuthenticationError, `class ${e && e.constructor.name}: ${e}`);
            assert.equal(e.status, 401);
            assert.match(e.message, /Invalid token/);
            assert.equal(e.code, 'invalid_token');
            assert.ok(e.requestID, 'request id from the X-Request-Id header');
            assert.equal(ridOf(e.message), e.requestID);
            return true;
        });
    });

    /* ---------------- Anthropic ---------------- */

    const anthropic = (apiKey = key) => new Anthropic({
        apiKey, baseURL: gw.url, maxRetries: 0, timeout: 20000,
    });

    test('anthropic: messages.create', async () => {
        const m = await anthropic().messages.create({
            model: M.an, max_tokens: 64, messages: [{ role: 'user', content: 'hi' }],
        });
        assert.equal(m.type, 'message');
        assert.deepEqual(m.content.map((b) => b.text), ['hello from claude']);
        assert.equal(m.usage.input_tokens, 7);
        assert.equal(m.usage.output_tokens, 3);
        const up = last(an);
        assert.equal(up.path, '/v1/messages');
        assert.equal(up.headers['x-api-key'], anKey);
        assert.ok(up.headers['anthropic-version'], 'the SDK version header is passed on');
        assert.ok(!JSON.stringify(up.headers).includes(key.slice(3)));
    });

    test('anthropic: messages.stream', async () => {
        const stream = anthropic().messages.stream({
            model: M.an, max_tokens: 64, messages: [{ role: 'user', content: 'hi' }],
        });
        let text = '';
        stream.on('text', (t) => { text += t; });
        const m = await stream.finalMessage();
        assert.equal(text, 'Bonjour');
        assert.equal(m.stop_reason, 'end_turn');
        assert.equal(m.usage.output_tokens, 2);
        assert.equal(last(an).json.stream, true);
    });

    test('anthropic: a bad key raises AuthenticationError 401 with the gateway message', async () => {
        await assert.rejects(anthropic(badKey).messages.create({
            model: M.an, max_tokens: 16, messages: [{ role: 'user', content: 'hi' }],
        }), (e) => {
            assert.ok(e instanceof Anthropic.AuthenticationError, `class ${e && e.constructor.name}: ${e}`);
            assert.equal(e.status, 401);
            assert.match(e.message, /Invalid token/);
            return true;
        });
    });

    /* ---------------- Google GenAI ---------------- */

    /*
     * @google/genai 3.x calls /v1/models/... by default (1.x used v1beta);
     * the gateway serves both and always calls the channel's /v1beta.
     */
    const genai = (apiKey = key) => new GoogleGenAI({
        apiKey,
        httpOptions: {
            baseUrl: gw.url, timeout: 20000, retryOptions: { attempts: 1 },
        },
    });

    test('genai: generateContent for audio; the SDK request reaches the vendor as sent', async () => {
        const resp = await genai().models.generateContent({
            model: M.gm,
            contents: 'Say cheerfully: have a wonderful day!',
            config: {
                responseModalities: ['AUDIO'],
                speechConfig: { voiceConfig: { prebuiltVoiceConfig: { voiceName: 'Kore' } } },
            },
        });
        const part = resp.candidates[0].content.parts[0];
        assert.equal(part.inlineData.mimeType, 'audio/L16;codec=pcm;rate=24000');
        assert.equal(part.inlineData.data, AUDIO_B64);
        assert.equal(resp.candidates[0].finishReason, 'STOP');
        assert.equal(resp.usageMetadata.promptTokenCount, 8);
        assert.equal(resp.usageMetadata.candidatesTokenCount, 150);

        const up = last(gm);
        assert.equal(up.method, 'POST');
        assert.equal(up.path, `/v1beta/models/${M.gm}:generateContent`);
        assert.equal(up.headers['x-goog-api-key'], gmKey, 'the channel key, not the client key');
        assert.ok(!JSON.stringify(up.headers).includes(key.slice(3)));
        assert.deepEqual(up.json.contents, [{ role: 'user', parts: [{ text: 'Say cheerfully: have a wonderful day!' }] }]);
        assert.deepEqual(up.json.generationConfig.responseModalities, ['AUDIO']);
        assert.equal(up.json.generationConfig.speechConfig.voiceConfig.prebuiltVoiceConfig.voiceName, 'Kore');

        const l = await waitLogs(gw, { token_id: token.id, model: M.gm }, (items) => items.length >= 1);
        assert.equal(l.items[0].prompt_tokens, 8);
        assert.equal(l.items[0].completion_tokens, 150);
    });

    test('genai: generateContentStream', async () => {
        const stream = await genai().models.generateContentStream({ model: M.gmText, contents: 'greet' });
        let text = '';
        for await (const chunk of stream) {
            text += chunk.text || '';
        }
        assert.equal(text, 'Good day');
        const up = last(gm);
        assert.equal(up.path, `/v1beta/models/${M.gmText}:streamGenerateContent?alt=sse`);
        assert.equal(up.headers['x-goog-api-key'], gmKey);
    });

    test('genai: a bad key raises ApiError with status 401 and the gateway message', async () => {
        await assert.rejects(genai(badKey).models.generateContent({ model: M.gm, contents: 'hi' }), (e) => {
            assert.ok(e instanceof ApiError, `class ${e && e.constructor.name}: ${e}`);
            assert.equal(e.status, 401);
            assert.match(e.message, /Invalid token/);
            return true;
        });
    });

    /* ---------------- Cohere ---------------- */

    const cohere = (token_ = key) => new CohereClientV2({ token: token_, environment: gw.url });

    test('cohere: v2 rerank', async () => {
        const r = await cohere().rerank(
            { model: M.co, query: 'Where is the Eiffel Tower?', documents: DOCS, topN: 2 },
            { maxRetries: 0, timeoutInSeconds: 20 });
        assert.deepEqual(r.results.map((x) => x.index), [2, 0]);
        assert.deepEqual(r.results.map((x) => x.relevanceScore), [0.95, 0.61]);
        assert.ok(r.id);
        const up = last(co);
        assert.equal(up.path, '/v1/rerank');
        assert.equal(up.headers.authorization, `Bearer ${coKey}`);
        assert.equal(up.json.top_n, 2);
        assert.deepEqual(up.json.documents, DOCS);
    });

    test('cohere: a bad key raises CohereError with statusCode 401 and the gateway message', async () => {
        await assert.rejects(cohere(badKey).rerank(
            { model: M.co, query: 'q', documents: DOCS }, { maxRetries: 0 }), (e) => {
            assert.ok(e instanceof CohereError, `class ${e && e.constructor.name}: ${e}`);
            assert.equal(e.statusCode, 401);
            assert.match(JSON.stringify(e.body), /Invalid token/);
            return true;
        });
    });
});
