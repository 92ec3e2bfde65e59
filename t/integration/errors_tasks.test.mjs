// One error contract on every endpoint: the task and host-protocol
// endpoints refuse what the model endpoints refuse, with the same status
// and code; the request id header is the gateway's alone; nginx's own 505
// is not called a fault of the gateway.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, httpRequest, makeChannel, makeKey, makeUser, rawHttp,
    settle, startGateway, tearDown, uniq,
} from '../lib/harness.mjs';
import { anthropicMessage, openaiChat, sendJson, startMock } from '../lib/mock.mjs';
import { startVendor, taskSetup } from '../lib/vendor.mjs';

describe('the error contract of the task endpoints', { timeout: 180000 }, () => {
    let db, gw, mock, vendor, env, key, onlyTM, chatModel, claudeModel, geminiModel, rerankModel, user;

    before(async () => {
        db = await createDb();
        /* Anthropic's API answers its own Request-Id: an operator may pick that name */
        mock = await startMock((req, res, rec) => {
            const h = { 'request-id': 'req_upstream_0123' };
            if (rec.path.includes('rerank')) {
                return sendJson(res, 200, { id: 'r1', results: [{ index: 0, relevance_score: 0.9 }],
                    meta: { billed_units: { search_units: 1 } } }, h);
            }
            if (rec.path.includes(':generateContent')) {
                return sendJson(res, 200, { candidates: [{ content: { role: 'model', parts: [{ text: 'hi' }] },
                    finishReason: 'STOP' }], usageMetadata: { promptTokenCount: 3, candidatesTokenCount: 2,
                    totalTokenCount: 5 } }, h);
            }
            if (rec.path.endsWith('/v1/messages')) {
                return sendJson(res, 200, anthropicMessage({ model: rec.json && rec.json.model }), h);
            }
            return sendJson(res, 200, openaiChat({ model: rec.json && rec.json.model }), h);
        });
        vendor = await startVendor();
        gw = await startGateway({ db, v8host: true,
            http: 'llmgw_request_id_header Request-Id; llmgw_task_wait_timeout 2s;' });
        chatModel = uniq('gpt-ec');
        claudeModel = uniq('claude-ec');
        geminiModel = uniq('gem-ec');
        rerankModel = uniq('rr-ec');
        await makeChannel(gw, { base_url: mock.url, models: [chatModel, rerankModel] });
        await makeChannel(gw, { type: 14, base_url: mock.url, models: [claudeModel] });
        await makeChannel(gw, { type: 24, base_url: mock.url, models: [geminiModel] });
        env = await taskSetup(gw, { fixture: 'task-protocols.js', vendors: [vendor], models: 1, wait: false });
        user = await makeUser(gw);
        key = (await makeKey(gw, user.id)).key;
        onlyTM = (await makeKey(gw, user.id, { models: [env.model] })).key;
        await settle();
    });

    after(async () => {
        await tearDown(db, [gw], [mock, vendor]);
    });

    const post = (path, body, k = key) => httpRequest(gw.url + path, { method: 'POST',
        headers: { Authorization: `Bearer ${k}`, 'Content-Type': 'application/json',
            'X-Request-Id': 'ignored' },
        body: typeof body === 'string' ? body : JSON.stringify(body) });
    /* assertError reads the id from X-Request-Id: here it is Request-Id */
    const asError = (r) => ({ ...r, headers: { ...r.headers, 'x-request-id': r.headers['request-id'] } });
    const TASK_PATHS = () => [`/v1/tasks/${env.key}`, '/v1/images/generations', '/v1/videos', '/v1/responses'];

    test('the upstream\'s header of the request id\'s name is not passed on: one id, the gateway\'s', async () => {
        const messages = [{ role: 'user', content: 'hi' }];
        const sent = mock.requests.length;
        for (const [path, body] of [
            ['/v1/chat/completions', { model: chatModel, messages }],
            ['/v1/messages', { model: claudeModel, max_tokens: 8, messages }],
            [`/v1beta/models/${geminiModel}:generateContent`, { contents: [{ role: 'user', parts: [{ text: 'hi' }] }] }],
            ['/v1/rerank', { model: rerankModel, query: 'q', documents: ['a', 'b'] }],
        ]) {
            const r = await post(path, body);
            assertOk(r);
            /* two headers of one name would come joined by ", " */
            assert.match(r.headers['request-id'], /^[0-9a-f]{32}$/, `${path}: ${r.headers['request-id']}`);
            assert.ok(!r.text.includes('req_upstream_0123'), path);
        }
        assert.equal(mock.requests.length, sent + 4, 'each went upstream');
    });

    test('a body that is no JSON object is 400 invalid_json everywhere', async () => {
        for (const path of ['/v1/chat/completions', ...TASK_PATHS()]) {
            for (const body of ['null', '[]', '"x"', '42', '']) {
                assertError(asError(await post(path, body)), 400, { code: 'invalid_json' });
            }
        }
    });

    test('a model name with a NUL is that whole name: no model, for a key of its first part too', async () => {
        for (const path of TASK_PATHS()) {
            const r = await post(path, { model: `${env.model}\u0000anything`, prompt: 'p', input: 'p' }, onlyTM);
            assert.notEqual(r.status, 200, `${path}: ${r.text.slice(0, 200)}`);
            assert.ok([403, 503].includes(r.status), `${path}: ${r.status} ${r.text.slice(0, 200)}`);
        }
        assert.equal(vendor.requests.filter((q) => q.kind === 'submit').length, 0);
    });

    test('a model name with a NUL is 503 model_not_found, the NUL shown as \\u0000 as chat shows it', async () => {
        for (const [path, m] of [['/v1/chat/completions', chatModel], ...TASK_PATHS().map((p) => [p, env.model])]) {
            const e = assertError(asError(await post(path, { model: `${m}\u0000any\u0001thing`, prompt: 'p',
                input: 'p', messages: [{ role: 'user', content: 'hi' }] })), 503, { code: 'model_not_found' });
            assert.ok(e.message.includes(`model ${m}\\u0000any\\u0001thing in group `), `${path}: ${e.message}`);
            assert.ok(!/[\u0000-\u001f]/.test(e.message), `${path}: a control character in ${JSON.stringify(e.message)}`);
        }
    });

    test('a task id with a control character is shown as \\u0001 in task_not_found and invalid_origin_task', async () => {
        for (const path of ['/v1/tasks/a%01b', '/v1/videos/a%01b', '/v1/responses/a%1Bb', '/v1/tasks/a%01b/artifacts/k/content']) {
            const r = await httpRequest(gw.url + path, { headers: { Authorization: `Bearer ${key}` } });
            const e = assertError(asError(r), 404, { code: 'task_not_found' });
            assert.match(e.message, /^task a\\u00(01|1b)b not found/, path);
        }
        const e = assertError(asError(await post(`/v1/tasks/${env.key}`, { model: env.model, prompt: 'p',
            originTaskIds: ['task_nope\u0000x'] })), 400, { code: 'invalid_origin_task' });
        assert.match(e.message, /^origin task task_nope\\u0000x not found/);
    });

    test('a model outside the key\'s list is 403 model_not_allowed everywhere, whatever serves it', async () => {
        const submits = vendor.requests.length;
        for (const path of ['/v1/chat/completions', ...TASK_PATHS()]) {
            for (const m of [uniq('nope'), chatModel, `${env.model}\u0000anything`]) {
                assertError(asError(await post(path, { model: m, prompt: 'p', input: 'p',
                    messages: [{ role: 'user', content: 'hi' }] }, onlyTM)), 403,
                { code: 'model_not_allowed', message: /^no access to model / });
            }
        }
        assert.equal(vendor.requests.length, submits, 'nothing sent');
    });

    test('a model that is no string is 400 invalid_request everywhere; a null one names none', async () => {
        for (const path of ['/v1/chat/completions', '/v1/messages', '/v1/rerank', ...TASK_PATHS()]) {
            const body = { prompt: 'p', input: 'p', query: 'q', documents: ['a'], max_tokens: 8,
                messages: [{ role: 'user', content: 'hi' }] };
            for (const m of [123, true, ['x'], { name: 'x' }]) {
                assertError(asError(await post(path, { ...body, model: m })), 400,
                    { code: 'invalid_request', message: /^model must be a string/ });
            }
            assertError(asError(await post(path, { ...body, model: null })), 400,
                { code: 'model_not_specified', message: /^Model name not specified/ });
        }
    });

    test('a model name over 1024 bytes is 400 invalid_request everywhere', async () => {
        for (const path of ['/v1/chat/completions', ...TASK_PATHS()]) {
            assertError(asError(await post(path, { model: 'm'.repeat(2000), prompt: 'p', input: 'p',
                messages: [{ role: 'user', content: 'hi' }] })), 400,
            { code: 'invalid_request', message: /a model name has at most 1024 bytes/ });
        }
    });

    test('a model whose channels cannot take a host protocol is 500 convert_request_failed; an unknown one 503', async () => {
        for (const path of ['/v1/images/generations', '/v1/videos', '/v1/responses']) {
            assertError(asError(await post(path, { model: chatModel, prompt: 'p', input: 'p' })), 500,
                { code: 'convert_request_failed', message: new RegExp(`cannot take POST ${path}`) });
            assertError(asError(await post(path, { model: uniq('nope'), prompt: 'p', input: 'p' })), 503,
                { code: 'model_not_found' });
        }
    });

    test('/v1/responses: stream and background are booleans', async () => {
        const before = vendor.requests.length;
        for (const [flag, v] of [['stream', 'true'], ['stream', 1], ['background', 'yes']]) {
            assertError(asError(await post('/v1/responses', { model: env.model, input: 'p', [flag]: v })),
                400, { code: 'invalid_request', message: new RegExp(`${flag} must be a boolean`) });
        }
        assert.equal(vendor.requests.length, before, 'nothing sent');
        const t = await gw.admin('GET', `/api/log?user_id=${user.id}`);
        assert.ok(!(t.json.data || []).some((row) => row.quota > 0), 'nothing charged');
    });

    test('nginx\'s 505 is http_version_not_supported, not a fault of the gateway', async () => {
        const r = await rawHttp(gw.port, 'GET /v1/models HTTP/2.0\r\nHost: x\r\n\r\n');
        assert.equal(r.status, 505);
        const j = JSON.parse(r.body);
        assert.equal(j.error.code, 'http_version_not_supported');
        assert.equal(j.error.type, 'gateway_error');
    });
});
