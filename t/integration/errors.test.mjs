// The error contract for the gateway's own refusals: bad bodies, bad URLs,
// oversized bodies, unknown models, dead and slow upstreams.  The server has
// an error_page for every status used here: it must not replace the
// contract on llmgw locations, and does elsewhere.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, makeChannel, makeUserKey, rawHttp,
    settle, startGateway, stopAll, uniq, waitLogs,
} from '../lib/harness.mjs';
import { hang, startClosedPort, startMock } from '../lib/mock.mjs';

describe('error contract', { timeout: 180000 }, () => {
    let db, gw, mock, slow, key;
    const M = uniq('gpt-err');
    const AM = uniq('claude-err');
    const DOWN = uniq('gpt-down');
    const SLOW = uniq('gpt-slow');
    const DISABLED = uniq('gpt-disabled');
    const OTHER_GROUP = uniq('gpt-other-group');

    before(async () => {
        db = await createDb();
        mock = await startMock();
        slow = await startMock(hang);
        const closed = await startClosedPort();
        gw = await startGateway({
            db, http: 'llmgw_read_timeout 1s;',
            server: 'error_page 400 403 404 413 500 502 503 504 /oops;\n' +
                '    location = /oops { default_type text/plain; return 200 "operator page\\n"; }\n' +
                '    location = /plain502 { return 502; }',
        });
        let r = await gw.admin('PUT', '/api/group', { default: 1, other: 1 });
        assert.equal(r.status, 200, r.text);
        await makeChannel(gw, { base_url: mock.url, models: [M] });
        await makeChannel(gw, { type: 14, base_url: mock.url, models: [AM] });
        await makeChannel(gw, { base_url: closed.url, models: [DOWN] });
        await makeChannel(gw, { base_url: slow.url, models: [SLOW] });
        await makeChannel(gw, { base_url: mock.url, models: [DISABLED], status: 'disabled' });
        await makeChannel(gw, { base_url: mock.url, models: [OTHER_GROUP], groups: ['other'] });
        ({ key } = await makeUserKey(gw));
        await settle();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await mock?.close();
            await slow?.close();
            await dropDb(db);
        }
    });

    test('successes carry a distinct X-Request-Id', async () => {
        const a = assertOk(await gw.chat(key, M));
        const b = assertOk(await gw.chat(key, M));
        assert.ok(a.headers['x-request-id']);
        assert.ok(b.headers['x-request-id']);
        assert.notEqual(a.headers['x-request-id'], b.headers['x-request-id']);
    });

    test('errors are JSON with distinct request ids', async () => {
        const a = await gw.chat(undefined, M);
        const b = await gw.chat(undefined, M);
        assertError(a, 401, { code: 'invalid_token' });
        assertError(b, 401, { code: 'invalid_token' });
        assert.match(a.headers['content-type'], /^application\/json/);
        assert.notEqual(a.headers['x-request-id'], b.headers['x-request-id']);
    });

    test('400 invalid JSON request body', async () => {
        for (const p of ['/v1/chat/completions', '/v1/messages']) {
            const r = await gw.req('POST', p, {
                key, headers: { 'Content-Type': 'application/json' },
                body: `{"model": "${M}", "messages": [`,
            });
            assertError(r, 400, { code: 'invalid_json', message: 'invalid JSON request body' });
        }
    });

    test('400 Model name not specified', async () => {
        const r = await gw.req('POST', '/v1/chat/completions', {
            key, body: { messages: [{ role: 'user', content: 'hi' }] },
        });
        assertError(r, 400, {
            code: 'model_not_specified', message: 'Model name not specified',
        });
    });

    test('400 field messages is required', async () => {
        let r = await gw.req('POST', '/v1/chat/completions', { key, body: { model: M } });
        assertError(r, 400, {
            code: 'invalid_request', message: 'field messages is required',
        });
        r = await gw.req('POST', '/v1/messages', { key, body: { model: AM, max_tokens: 8 } });
        assertError(r, 400, {
            code: 'invalid_request', message: 'field messages is required',
        });
        assert.equal(mock.requests.filter((q) => q.json?.model === AM).length, 0,
            'invalid requests reach no upstream');
    });

    test('400 invalid_request for a stream that is not a boolean; nothing is sent', async () => {
        const before = mock.requests.length;
        for (const stream of ['true', 1]) {
            const msg = { role: 'user', content: 'hi' };
            assertError(await gw.req('POST', '/v1/chat/completions',
                { key, body: { model: M, stream, messages: [msg] } }), 400,
            { code: 'invalid_request', message: 'stream must be a boolean' });
            assertError(await gw.req('POST', '/v1/messages',
                { key, body: { model: AM, max_tokens: 8, stream, messages: [msg] } }), 400,
            { code: 'invalid_request', message: 'stream must be a boolean' });
        }
        assert.equal(mock.requests.length, before, 'nothing reached an upstream');
    });

    test('404 Invalid URL explains a doubled, missing or bare version, or a trailing slash', async () => {
        const body = { model: M, messages: [{ role: 'user', content: 'hi' }] };
        const cases = [
            ['/v1/v1/chat/completions', /\/v1 twice/],
            ['/chat/completions', /missing \/v1/],
            ['/v1', /only \/v1/],
            ['/v1/v1beta/models/m:generateContent', /\/v1 before \/v1beta; set the base URL to the host only/],
            ['/v2/v2/rerank', /\/v2 twice/],
            ['/v1beta', /only \/v1beta/],
            ['/v1/chat/completions/', /ends with a slash/],
            ['/v1/no-such-endpoint', null],
            ['/something/else', null],
        ];
        for (const [p, re] of cases) {
            const r = await gw.req('POST', p, { key, body });
            const e = assertError(r, 404, { code: 'invalid_url', message: 'Invalid URL' });
            if (re) {
                assert.match(e.message, re, `${p}: ${e.message}`);
            }
        }
    });

    test('404 Invalid URL explains a missing or doubled /v1 before a task, protocol, rerank or messages path', async () => {
        const paths = [
            ['POST', '/videos'], ['GET', '/videos/video_1'], ['GET', '/videos/video_1/content'],
            ['POST', '/responses'], ['GET', '/responses/resp_1'],
            ['POST', '/images/generations'], ['POST', '/images/edits'],
            ['POST', '/rerank'], ['POST', '/messages'],
            ['POST', '/tasks/some-plugin'], ['GET', '/tasks/task_1/artifacts'],
        ];
        for (const [method, p] of paths) {
            for (const [path, hint] of [
                [p, 'the path is missing /v1; add /v1 to the base URL'],
                [`/v1/v1${p}`, 'the path has /v1 twice; set the base URL to the host plus one /v1'],
            ]) {
                const r = await gw.req(method, path, { key, body: method === 'GET' ? undefined : {} });
                const e = assertError(r, 404, { code: 'invalid_url', message: 'Invalid URL' });
                assert.match(e.message, new RegExp(`^Invalid URL \\(${method} ${path}\\): ${hint} \\(request id: `),
                    `${method} ${path}: ${e.message}`);
            }
        }
    });

    test('405 method_not_allowed names the allowed methods in its Allow header', async () => {
        for (const [method, p, allow] of [
            ['GET', '/v1/chat/completions', 'POST'], ['PUT', '/v1/messages', 'POST'],
            ['POST', '/v1/models', 'GET, HEAD'], ['DELETE', '/v1/rerank', 'POST'],
            ['PATCH', '/api/pricing', 'GET, PUT'], ['POST', '/metrics', 'GET, HEAD'],
        ]) {
            const r = p.startsWith('/api/') ? await gw.admin(method, p, {})
                : await gw.req(method, p, { key, body: method === 'GET' ? undefined : {} });
            assertError(r, 405, { code: 'method_not_allowed' });
            assert.equal(r.headers.allow, allow, `${method} ${p}`);
        }
        /* the path is the client's text: it cannot make the header */
        for (const model of ['x(allowed:%20a%0d%0aSet-Cookie:%20evil=1)', 'x(allowed:%20GET,%20DELETE)']) {
            const r = await gw.req('GET', `/v1beta/models/${model}:generateContent`, { key });
            assertError(r, 405, { code: 'method_not_allowed' });
            assert.equal(r.headers.allow, 'POST');
            assert.equal(r.headers['set-cookie'], undefined);
        }
        /* nor can a long method push the gateway's list out of the message,
           leaving a path cut at 128 bytes to end it */
        const model = `${'0'.repeat(128 - '/v1beta/models/'.length - '(allowed: GET)'.length)}` +
            '(allowed:%20GET)';
        const r = await gw.req('A'.repeat(357), `/v1beta/models/${model}:generateContent`, { key });
        assertError(r, 405, { code: 'method_not_allowed' });
        assert.equal(r.headers.allow, 'POST');
    });

    test('413 request_too_large over client_max_body_size', async () => {
        const big = JSON.stringify({
            model: M, messages: [{ role: 'user', content: 'x'.repeat(1100 * 1024) }],
        });
        const r = await gw.req('POST', '/v1/chat/completions', {
            key, headers: { 'Content-Type': 'application/json' }, body: big,
        });
        assertError(r, 413, { code: 'request_too_large' });
    });

    test('a body just under the limit is accepted', async () => {
        const r = await gw.chat(key, M, { content: 'y'.repeat(900 * 1024) });
        assertOk(r);
    });

    test('503 model_not_found for unknown, padded, disabled or foreign-group models', async () => {
        for (const m of [uniq('no-such-model'), `${M} `, DISABLED, OTHER_GROUP]) {
            const r = await gw.chat(key, m);
            assertError(r, 503, { code: 'model_not_found' });
        }
    });

    test('502 do_request_failed when the upstream refuses connections', async () => {
        const r = await gw.chat(key, DOWN);
        assertError(r, 502, { code: 'do_request_failed' });
        const id = r.headers['x-request-id'];
        await waitLogs(gw, { model: DOWN },
            (items) => items.some((i) => i.request_id === id && i.type === 'error'));
    });

    const raw = (text) => rawHttp(gw.port, text);

    test('errors nginx makes before any location are JSON too', async () => {
        const cases = [
            [`GET /v1/models?${'a'.repeat(20000)} HTTP/1.1\r\nHost: x\r\n\r\n`, 414, 'uri_too_long'],
            [`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: ${'b'.repeat(20000)}\r\n\r\n`, 400, 'bad_request'],
            ['POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n', 400, 'bad_request'],
            ['POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n', 501, 'not_implemented'],
            /* refused on every path before a location is picked, so no
               Allow can name the path's methods */
            ['TRACE /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 405, 'method_not_allowed'],
            ['CONNECT /api/user HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n', 405, 'method_not_allowed'],
        ];
        for (const [text, status, code] of cases) {
            const r = await raw(text);
            assert.equal(r.status, status, `${text.slice(0, 60)}: ${r.status} ${r.body}`);
            assert.match(r.headers['content-type'] || '', /application\/json/, r.body);
            const id = r.headers['x-request-id'];
            assert.ok(id, 'a request id header');
            const j = JSON.parse(r.body);
            assert.equal(j.error.code, code);
            assert.equal(j.error.type, 'gateway_error');
            assert.ok(j.error.message.endsWith(`(request id: ${id})`), j.error.message);
        }
    });

    test('an error answering a HEAD is a head only: the next answer on the connection follows it at once', async () => {
        const heads = [
            ['/v1/no-such-endpoint', '', 404],
            ['/v1/models', '', 401],
            ['/v1/models', 'Authorization: Bearer sk-nope\r\n', 401],
            ['/v1/chat/completions', `Authorization: Bearer ${key}\r\n`, 405],
            ['/v1/tasks/task_x/artifacts/video/content', '', 401],
            ['/v1/tasks/task_x/artifacts/video/content?expires=1&signature=00', '', 403],
            ['/api/user', '', 401],
        ];
        const r = await raw(heads.map(([p, h]) => `HEAD ${p} HTTP/1.1\r\nHost: x\r\n${h}\r\n`).join('')
            + 'GET /v1/no-such-endpoint HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
        /* the first head as rawHttp read it, then each in the rest */
        const first = `HTTP/1.1 ${r.status} x\r\nContent-Length: ${r.headers['content-length']}`;
        const parts = [first, ...r.body.split('\r\n\r\n')];
        heads.forEach(([p, , status], i) => {
            assert.match(parts[i], new RegExp(`^HTTP/1\\.1 ${status} `), `HEAD ${p}: ${parts[i]}`);
            assert.match(parts[i], /\r\nContent-Length: [1-9]/i, `HEAD ${p} says the length of a GET's body`);
        });
        assert.match(parts[heads.length], /^HTTP\/1\.1 404 /, parts.slice(heads.length).join('|'));
        assert.equal(JSON.parse(parts.slice(heads.length + 1).join('\r\n\r\n')).error.code, 'invalid_url');

        /* pages nginx makes itself, the last on their connection */
        for (const [text, status] of [
            ['HEAD /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n', 413],
            [`HEAD /v1/models?${'a'.repeat(20000)} HTTP/1.1\r\nHost: x\r\n\r\n`, 414],
            ['HEAD /v1/models HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n', 501],
        ]) {
            const h = await raw(text);
            assert.equal(h.status, status, h.body);
            assert.match(h.headers['content-type'], /application\/json/);
            assert.equal(h.body, '', `${text.slice(0, 40)}: no body after the head`);
        }
    });

    test('the server\'s error_page still serves locations without llmgw', async () => {
        const r = await gw.req('GET', '/plain502');
        assert.equal(r.status, 502);
        assert.equal(r.text, 'operator page\n');
    });

    test('504 when the upstream does not answer within llmgw_read_timeout', async () => {
        const t0 = Date.now();
        const r = await gw.chat(key, SLOW, { timeoutMs: 15000 });
        const took = Date.now() - t0;
        assertError(r, 504, {});
        assert.ok(took >= 900 && took < 5000, `answered after ${took} ms, read timeout 1 s`);
        assert.equal(slow.requests.length, 1, '504 is not retried');
    });
});
