// Format conversion at its edges, through nginx with mock vendors that
// record what they got:
//   - tool schemas Gemini's Schema would refuse (an array without items, an
//     object without properties) made into what it takes, at any depth;
//   - a Messages stream from an OpenAI channel whose tool argument pieces
//     come around text still has every piece in its tool_use block;
//   - the usage a converted answer shows is what its ledger row bills;
//   - a finish "stop" beside tool calls is a tool_use stop;
//   - images a tool returns reach Anthropic and Gemini;
//   - cache_control on system and assistant parts reaches Anthropic;
//   - an Anthropic stream without message_delta still ends with a finish
//     chunk and [DONE];
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

    test('messages -> OpenAI stream: argument pieces around text all reach their tool_use block', async () => {
        oa.handler = (req, res) => {
            sseHead(res);
            res.write(chunk({ role: 'assistant', content: null }));
            res.write(chunk({ tool_calls: [{ index: 0, id: 'call_a', type: 'function',
                function: { name: 'f', arguments: '{"a":' } }] }));
            res.write(chunk({ content: '\n' }));
            res.write(chunk({ tool_calls: [{ index: 0, function: { arguments: '1}' } }] }));
            res.write(chunk({ tool_calls: [{ index: 1, id: 'call_b', type: 'function',
                function: { name: 'g', arguments: '' } }] }));
            res.write(chunk({ reasoning_content: 'hmm' }));
            res.write(chunk({ tool_calls: [{ index: 1, function: { arguments: '{"b":' } }] }));
            res.write(chunk({ content: 'and' }));
            res.write(chunk({ tool_calls: [{ index: 1, function: { arguments: '[2]}' } }] }));
            res.write(chunk({}, 'stop'));
            res.write(usageChunk({ prompt_tokens: 4, completion_tokens: 9 }));
            res.end(DONE);
        };
        const r = await messages({ model: M.oai, stream: true, messages: [{ role: 'user', content: 'x' }] });
        assertOk(r);
        const blocks = messagesBlocks(r.text);
        const tools = blocks.filter((b) => b.type === 'tool_use');
        assert.deepEqual(tools.map((b) => [b.id, b.name, JSON.parse(b.json)]),
            [['call_a', 'f', { a: 1 }], ['call_b', 'g', { b: [2] }]], r.text);
        assert.equal(blocks.filter((b) => b.type === 'text').map((b) => b.text).join(''), '\nand', r.text);
        assert.equal(blocks.filter((b) => b.type === 'thinking').length, 1, r.text);
        /* finish_reason "stop" beside tool calls: the client must run them */
        const md = eventData(r.text).find((d) => d.type === 'message_delta');
        assert.equal(md.delta.stop_reason, 'tool_use', r.text);
    });

    /* ============================================================== */

    test('a finish "stop" beside tool calls is a tool_use stop; Gemini\'s STOP beside a call is tool_calls', async () => {
        oa.handler = (req, res) => sendJson(res, 200, {
            id: 'chatcmpl-t', object: 'chat.completion', created: 1, model: 'up',
            choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: null,
                tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'f', arguments: '{}' } }] } }],
            usage: { prompt_tokens: 1, completion_tokens: 1 },
        });
        const r = await messages({ model: M.oai, messages: [{ role: 'user', content: 'x' }],
            tools: [{ name: 'f', input_schema: { type: 'object' } }] });
        assertOk(r);
        assert.equal(r.json.stop_reason, 'tool_use', r.text);
        assert.equal(r.json.content[0].type, 'tool_use', r.text);

        gm.handler = (req, res) => sendJson(res, 200, geminiAnswer([{ functionCall: { name: 'f', args: {} } }]));
        const g = await chat({ model: M.gem, messages: [{ role: 'user', content: 'x' }] });
        assertOk(g);
        assert.equal(g.json.choices[0].finish_reason, 'tool_calls', g.text);
    });

    /* ============================================================== */

    describe('the usage a converted answer shows is what its row bills', () => {
        /* the chat usage of a row: the cached part is in the prompt */
        const chatCounts = (row) => ({
            prompt_tokens: row.prompt_tokens + row.cache_read_tokens + row.cache_creation_tokens,
            completion_tokens: row.completion_tokens,
        });
        const messagesCounts = (row) => ({
            input_tokens: row.prompt_tokens, output_tokens: row.completion_tokens,
        });
        const pick = (u, keys) => Object.fromEntries(keys.map((k) => [k, u && u[k]]));

        test('chat <- Anthropic answer without usage, whole and asked as a stream', async () => {
            an.handler = (req, res) => sendJson(res, 200,
                anthropicAnswer([{ type: 'text', text: 'hello world hello world' }], { usage: undefined }));
            const r = await chat({ model: M.claude, messages: [{ role: 'user', content: 'count me' }] });
            assertOk(r);
            const row = await rowOf(r);
            assert.ok(row.prompt_tokens > 0 && row.completion_tokens > 0, JSON.stringify(row));
            assert.deepEqual(pick(r.json.usage, ['prompt_tokens', 'completion_tokens']), chatCounts(row));

            const s = await chat({ model: M.claude, stream: true, stream_options: { include_usage: true },
                messages: [{ role: 'user', content: 'count me' }] });
            assertOk(s);
            const u = eventData(s.text).find((d) => d.usage).usage;
            assert.deepEqual(pick(u, ['prompt_tokens', 'completion_tokens']), chatCounts(await rowOf(s)));
        });

        test('chat <- Gemini answer without usageMetadata', async () => {
            gm.handler = (req, res) => sendJson(res, 200, geminiAnswer([{ text: 'hello world hello world' }], null));
            const r = await chat({ model: M.gem, messages: [{ role: 'user', content: 'count me' }] });
            assertOk(r);
            const row = await rowOf(r);
            assert.ok(row.completion_tokens > 0, JSON.stringify(row));
            assert.deepEqual(pick(r.json.usage, ['prompt_tokens', 'completion_tokens']), chatCounts(row));
        });

        test('messages <- OpenAI answer without usage, whole and asked as a stream', async () => {
            oa.handler = (req, res) => sendJson(res, 200, {
                id: 'chatcmpl-n', object: 'chat.completion', created: 1, model: 'up',
                choices: [{ index: 0, message: { role: 'assistant', content: 'hello world hello world' },
                    finish_reason: 'stop' }],
            });
            const r = await messages({ model: M.oai, messages: [{ role: 'user', content: 'count me' }] });
            assertOk(r);
            const row = await rowOf(r);
            assert.ok(row.prompt_tokens > 0 && row.completion_tokens > 0, JSON.stringify(row));
            assert.deepEqual(pick(r.json.usage, ['input_tokens', 'output_tokens']), messagesCounts(row));

            const s = await messages({ model: M.oai, stream: true, messages: [{ role: 'user', content: 'count me' }] });
            assertOk(s);
            const md = eventData(s.text).find((d) => d.type === 'message_delta');
            assert.deepEqual(pick(md.usage, ['input_tokens', 'output_tokens']), messagesCounts(await rowOf(s)));
        });

        test('messages <- OpenAI stream with usage in every chunk: message_delta waits for the last count', async () => {
            oa.handler = (req, res) => {
                sseHead(res);
                const u = (c) => ({ usage: { prompt_tokens: 10, completion_tokens: c } });
                res.write(chunk({ role: 'assistant', content: 'a' }, null, u(1)));
                res.write(chunk({ content: 'b' }, null, u(2)));
                res.write(chunk({}, 'stop', u(2)));
                res.write(usageChunk({ prompt_tokens: 10, completion_tokens: 50 }));
                res.end(DONE);
            };
            const r = await messages({ model: M.oai, stream: true, messages: [{ role: 'user', content: 'x' }] });
            assertOk(r);
            const md = eventData(r.text).filter((d) => d.type === 'message_delta');
            assert.equal(md.length, 1, r.text);
            assert.deepEqual(pick(md[0].usage, ['input_tokens', 'output_tokens']),
                { input_tokens: 10, output_tokens: 50 }, r.text);
            assert.deepEqual(messagesCounts(await rowOf(r)), { input_tokens: 10, output_tokens: 50 });
        });
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

    test('chat <- Anthropic stream that ends with message_stop but no message_delta: a finish chunk and [DONE]', async () => {
        const stream = (blocks) => (req, res) => {
            sseHead(res);
            res.write(anthropicEvent('message_start', { message: { id: 'msg_s', type: 'message', role: 'assistant',
                model: 'up', content: [], stop_reason: null, usage: { input_tokens: 10, output_tokens: 1 } } }));
            blocks.forEach((b, index) => {
                res.write(anthropicEvent('content_block_start', { index, content_block: b.start }));
                if (b.delta) {
                    res.write(anthropicEvent('content_block_delta', { index, delta: b.delta }));
                }
                res.write(anthropicEvent('content_block_stop', { index }));
            });
            res.end(anthropicEvent('message_stop'));
        };
        const finishes = (text) => eventData(text)
            .filter((d) => d !== '[DONE]' && d.choices && d.choices[0] && d.choices[0].finish_reason)
            .map((d) => d.choices[0].finish_reason);

        an.handler = stream([{ start: { type: 'text', text: '' }, delta: { type: 'text_delta', text: 'hi' } }]);
        const r = await chat({ model: M.claude, stream: true, stream_options: { include_usage: true },
            messages: [{ role: 'user', content: 'x' }] });
        assertOk(r);
        const data = eventData(r.text);
        assert.deepEqual(finishes(r.text), ['stop'], r.text);
        assert.equal(data[data.length - 1], '[DONE]', r.text);
        assert.ok(data[data.length - 2].usage, `the usage chunk before [DONE]: ${r.text}`);
        assert.equal((await rowOf(r)).status, 200);

        an.handler = stream([{ start: { type: 'tool_use', id: 'toolu_1', name: 'f', input: {} },
            delta: { type: 'input_json_delta', partial_json: '{"a":1}' } }]);
        const t = await chat({ model: M.claude, stream: true, messages: [{ role: 'user', content: 'x' }] });
        assertOk(t);
        assert.deepEqual(finishes(t.text), ['tool_calls'], t.text);
        assert.equal(eventData(t.text).at(-1), '[DONE]', t.text);
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
