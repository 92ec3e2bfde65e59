// Format conversion at its edges, through nginx with mock vendors that
// record what they got:
//   - tool schemas Gemini's Schema would refuse (an array without items, an
//     object without properties) made into what it takes, at any depth;
//   - images a tool returns reach Anthropic and Gemini;
//   - cache_control on system and assistant parts reaches Anthropic;
//   - a Gemini conversation left without a turn is refused, not sent.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, makeChannel, makeUserKey, settle,
    sseEvents, startGateway, tearDown, uniq, waitLogs,
} from '../lib/harness.mjs';
import { sendJson, startMock } from '../lib/mock.mjs';

const PNG_B64 = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==';
const PNG_URL = `data:image/png;base64,${PNG_B64}`;

function sseHead(res) {
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    res.flushHeaders();
}

/* An Anthropic stream event, its type in the data as Anthropic writes it. */
const anthropicEvent = (type, data = {}) =>
    `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;

/* An OpenAI chunk of one choice, or [DONE]. */
const chunk = (delta, finish = null, extra = {}) => `data: ${JSON.stringify({
    id: 'chatcmpl-cv', object: 'chat.completion.chunk', created: 1, model: 'up',
    choices: [{ index: 0, delta, finish_reason: finish }], ...extra,
})}\n\n`;
const usageChunk = (usage) => `data: ${JSON.stringify({
    id: 'chatcmpl-cv', object: 'chat.completion.chunk', created: 1, model: 'up',
    choices: [], usage,
})}\n\n`;
const DONE = 'data: [DONE]\n\n';

/* The data of each event of a stream, parsed ([DONE] as the string). */
const eventData = (text) => sseEvents(text)
    .map((e) => (e.data === '[DONE]' ? e.data : JSON.parse(e.data)));

/*
 * Every schema under s says what Gemini's Schema takes: an object has
 * properties, an array its items.  -> the paths that do not.
 */
function geminiRefusals(s, where = 'parameters') {
    if (!s || typeof s !== 'object') {
        return [];
    }
    const bad = [];
    if (s.type === 'object' && Object.keys(s.properties || {}).length === 0) {
        bad.push(`${where}: object without properties`);
    }
    if (s.type === 'array' && !s.items) {
        bad.push(`${where}: array without items`);
    }
    for (const [k, v] of Object.entries(s.properties || {})) {
        bad.push(...geminiRefusals(v, `${where}.${k}`));
    }
    bad.push(...geminiRefusals(s.items, `${where}.items`));
    (s.anyOf || []).forEach((v, i) => bad.push(...geminiRefusals(v, `${where}.anyOf[${i}]`)));
    return bad;
}

/*
 * A Messages stream's content blocks, checked to be well formed (each
 * block's deltas between its start and its stop, one block open at a time)
 * -> [{type, id?, name?, text, json}] where json is the tool input text.
 */
function messagesBlocks(text) {
    const blocks = [];
    let open = -1;
    for (const d of eventData(text)) {
        if (d.type === 'content_block_start') {
            assert.equal(open, -1, `block ${d.index} starts inside block ${open}: ${text}`);
            assert.equal(d.index, blocks.length, `block index: ${text}`);
            open = d.index;
            const b = d.content_block;
            blocks.push({ type: b.type, id: b.id, name: b.name, text: '', json: '' });
        } else if (d.type === 'content_block_delta') {
            assert.equal(d.index, open, `a delta for block ${d.index} while ${open} is open: ${text}`);
            blocks[open].text += d.delta.text || '';
            blocks[open].json += d.delta.partial_json || '';
        } else if (d.type === 'content_block_stop') {
            assert.equal(d.index, open, `stop of block ${d.index} while ${open} is open: ${text}`);
            open = -1;
        }
    }
    assert.equal(open, -1, `a block left open: ${text}`);
    return blocks;
}

describe('format conversion at its edges', { timeout: 240000 }, () => {
    let db, gw, key, token, an, gm, oa;
    const M = { claude: uniq('cv-claude'), gem: uniq('cv-gem'), oai: uniq('cv-oai') };
    const last = (mock) => mock.requests[mock.requests.length - 1];

    before(async () => {
        db = await createDb();
        an = await startMock();
        gm = await startMock();
        oa = await startMock();
        gw = await startGateway({ db });
        await makeChannel(gw, { type: 14, base_url: an.url, models: [M.claude] });
        await makeChannel(gw, { type: 24, base_url: gm.url, models: [M.gem] });
        await makeChannel(gw, { type: 1, base_url: oa.url, models: [M.oai] });
        ({ key, token } = await makeUserKey(gw));
        await settle();
    });

    after(async () => {
        await tearDown(db, [gw], [an, gm, oa]);
    });

    const chat = (body) => gw.req('POST', '/v1/chat/completions', { key, body });
    const messages = (body) => gw.req('POST', '/v1/messages', { key, body: { max_tokens: 64, ...body } });

    /* the ledger row of an answer, by its request id */
    async function rowOf(r) {
        const id = r.headers['x-request-id'];
        const { items } = await waitLogs(gw, { token_id: token.id },
            (it) => it.some((i) => i.request_id === id));
        return items.find((i) => i.request_id === id);
    }

    const geminiAnswer = (parts, usageMetadata = { promptTokenCount: 3, candidatesTokenCount: 2 }) => ({
        candidates: [{ content: { role: 'model', parts }, finishReason: 'STOP', index: 0 }],
        ...(usageMetadata ? { usageMetadata } : {}),
    });
    const anthropicAnswer = (content, extra = {}) => ({
        id: 'msg_cv', type: 'message', role: 'assistant', model: 'up', content,
        stop_reason: 'end_turn', stop_sequence: null,
        usage: { input_tokens: 5, output_tokens: 2 }, ...extra,
    });

    /* ============================================================== */

    test('chat -> Gemini: an array without items and an object without properties become what Gemini takes, at any depth', async () => {
        gm.handler = (req, res) => sendJson(res, 200, geminiAnswer([{ text: 'ok' }]));
        const parameters = {
            type: 'object',
            properties: {
                tags: { type: 'array', description: 'labels' },
                meta: { type: 'object', description: 'anything' },
                labels: { type: 'object', additionalProperties: { type: 'string' } },
                rows: { type: 'array', items: { type: 'object' } },
                deep: { type: 'object', properties: {
                    inner: { type: 'array' },
                    opt: { type: ['object', 'null'], properties: {} },
                } },
                either: { anyOf: [{ type: 'array' }, { type: 'integer' }] },
            },
            required: ['tags', 'meta'],
        };
        const r = await chat({
            model: M.gem, messages: [{ role: 'user', content: 'go' }],
            tools: [{ type: 'function', function: { name: 'save', parameters } }],
        });
        assertOk(r);
        const got = last(gm).json.tools[0].functionDeclarations[0].parameters;
        assert.deepEqual(geminiRefusals(got), [], JSON.stringify(got));
        const p = got.properties;
        /* an array of anything holds strings, as a schema of anything does */
        assert.deepEqual(p.tags, { type: 'array', description: 'labels', items: { type: 'string' } });
        assert.deepEqual(p.deep.properties.inner, { type: 'array', items: { type: 'string' } });
        assert.deepEqual(p.either.anyOf[0], { type: 'array', items: { type: 'string' } });
        /* an object Gemini cannot describe is asked for as JSON text */
        assert.equal(p.meta.type, 'string');
        assert.match(p.meta.description, /^anything \(a JSON object/);
        assert.equal(p.labels.type, 'string');
        assert.match(p.labels.description, /^a JSON object/);
        assert.equal(p.rows.items.type, 'string');
        assert.equal(p.deep.properties.opt.type, 'string');
        assert.equal(p.deep.properties.opt.nullable, true);
        assert.equal(p.deep.properties.opt.properties, undefined);
        assert.deepEqual(got.required, ['tags', 'meta']);

        /* a response schema Gemini could only say wrongly asks for JSON alone */
        const j = await chat({
            model: M.gem, messages: [{ role: 'user', content: 'go' }],
            response_format: { type: 'json_schema', json_schema: { name: 'x', schema: {
                type: 'object', properties: { list: { type: 'array' } },
            } } },
        });
        assertOk(j);
        const gc = last(gm).json.generationConfig;
        assert.equal(gc.responseMimeType, 'application/json');
        assert.equal(gc.responseSchema, undefined, JSON.stringify(gc));
    });

    /* ============================================================== */

    test('images a tool returns reach Anthropic and Gemini, and OpenAI from a tool_result', async () => {
        const history = [
            { role: 'user', content: 'look' },
            { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
                function: { name: 'shot', arguments: '{}' } }] },
            { role: 'tool', tool_call_id: 'call_1', content: [
                { type: 'text', text: 'see image' },
                { type: 'image_url', image_url: { url: PNG_URL } },
            ] },
        ];
        const tools = [{ type: 'function', function: { name: 'shot', parameters: { type: 'object', properties: {} } } }];

        an.handler = (req, res) => sendJson(res, 200, anthropicAnswer([{ type: 'text', text: 'a pixel' }]));
        assertOk(await chat({ model: M.claude, messages: history, tools }));
        const result = last(an).json.messages[2].content[0];
        assert.equal(result.type, 'tool_result', JSON.stringify(result));
        assert.equal(result.tool_use_id, 'call_1');
        assert.deepEqual(result.content, [
            { type: 'text', text: 'see image' },
            { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG_B64 } },
        ]);

        gm.handler = (req, res) => sendJson(res, 200, geminiAnswer([{ text: 'a pixel' }]));
        assertOk(await chat({ model: M.gem, messages: [...history, { role: 'user', content: 'and?' }], tools }));
        assert.deepEqual(last(gm).json.contents[2], { role: 'user', parts: [
            { functionResponse: { name: 'shot', response: { content: 'see image' } } },
            { inlineData: { mimeType: 'image/png', data: PNG_B64 } },
            { text: 'and?' },
        ] });

        oa.handler = (req, res) => sendJson(res, 200, {
            id: 'chatcmpl-i', object: 'chat.completion', created: 1, model: 'up',
            choices: [{ index: 0, message: { role: 'assistant', content: 'a pixel' }, finish_reason: 'stop' }],
            usage: { prompt_tokens: 1, completion_tokens: 1 },
        });
        assertOk(await messages({ model: M.oai, messages: [
            { role: 'user', content: 'look' },
            { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'shot', input: {} }] },
            { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [
                { type: 'text', text: 'see image' },
                { type: 'image', source: { type: 'base64', media_type: 'image/png', data: PNG_B64 } },
            ] }] },
        ] }));
        const sent = last(oa).json.messages;
        assert.deepEqual(sent.slice(2), [
            { role: 'tool', tool_call_id: 'toolu_1', content: 'see image' },
            { role: 'user', content: [{ type: 'image_url', image_url: { url: PNG_URL } }] },
        ]);
    });

    /* ============================================================== */

    test('chat -> Anthropic: cache_control on system and assistant parts is kept', async () => {
        an.handler = (req, res) => sendJson(res, 200, anthropicAnswer([{ type: 'text', text: 'k' }]));
        const cc = { type: 'ephemeral' };
        assertOk(await chat({ model: M.claude, messages: [
            { role: 'system', content: [{ type: 'text', text: 'long system prompt', cache_control: cc }] },
            { role: 'system', content: 'and more' },
            { role: 'user', content: [{ type: 'text', text: 'u1', cache_control: cc }] },
            { role: 'assistant', content: [{ type: 'text', text: 'a1' }, { type: 'text', text: 'a2', cache_control: cc }] },
            { role: 'user', content: 'u2' },
        ] }));
        const up = last(an).json;
        assert.deepEqual(up.system, [
            { type: 'text', text: 'long system prompt', cache_control: cc },
            { type: 'text', text: 'and more' },
        ]);
        assert.deepEqual(up.messages[1], { role: 'assistant', content: [
            { type: 'text', text: 'a1' }, { type: 'text', text: 'a2', cache_control: cc },
        ] });

        /* without a hint the system prompt stays one text */
        assertOk(await chat({ model: M.claude, messages: [
            { role: 'system', content: [{ type: 'text', text: 's1' }] },
            { role: 'developer', content: 's2' },
            { role: 'user', content: 'u' },
        ] }));
        assert.equal(last(an).json.system, 's1\ns2');
    });

    /* ============================================================== */

    test('chat -> Gemini: a conversation whose last message is empty is refused, naming it; nothing sent', async () => {
        gm.handler = (req, res) => sendJson(res, 200, geminiAnswer([{ text: 'x' }]));
        const n = gm.requests.length;
        for (const msgs of [
            [{ role: 'user', content: '' }],
            [{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'yes?' }, { role: 'user', content: '' }],
            [{ role: 'system', content: 'be brief' }, { role: 'user', content: [{ type: 'text', text: '' }] }],
        ]) {
            const r = await chat({ model: M.gem, messages: msgs });
            assertError(r, 400, { code: 'invalid_request' });
            assert.match(r.json.error.message, new RegExp(`messages\\[${msgs.length - 1}\\]: an empty message`),
                r.text);
        }
        assert.equal(gm.requests.length, n, 'the upstream was not called');
    });
});
