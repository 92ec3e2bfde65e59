// Upstreams that misbehave at the HTTP level: what is no answer (a 101, a
// body encoded in a way the gateway does not read) goes to the next
// channel, else is a 502 in the error contract, never passed on.

import assert from 'node:assert/strict';
import net from 'node:net';
import zlib from 'node:zlib';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, makeChannel, makeUserKey, settle, startGateway,
    tearDown, uniq, waitLogs,
} from '../lib/harness.mjs';
import { openaiChat, sendJson, startMock } from '../lib/mock.mjs';

/*
 * A raw TCP upstream: each request (head and Content-Length body read) is
 * handed to answer(socket, request); the handler writes what it likes.
 */
async function rawUpstream(answer) {
    const sockets = new Set();
    const requests = [];
    const server = net.createServer((s) => {
        sockets.add(s);
        s.on('close', () => sockets.delete(s));
        s.on('error', () => {});
        let buf = Buffer.alloc(0);
        s.on('data', (d) => {
            buf = Buffer.concat([buf, d]);
            const end = buf.indexOf('\r\n\r\n');
            if (end < 0) {
                return;
            }
            const head = buf.subarray(0, end).toString();
            const m = /content-length:\s*(\d+)/i.exec(head);
            const len = m ? Number(m[1]) : 0;
            if (buf.length < end + 4 + len) {
                return;
            }
            const body = buf.subarray(end + 4, end + 4 + len).toString();
            buf = buf.subarray(end + 4 + len);
            const req = { head, json: JSON.parse(body) };
            requests.push(req);
            answer(s, req);
        });
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    return {
        url: `http://127.0.0.1:${server.address().port}`,
        requests,
        async close() {
            for (const s of sockets) {
                s.destroy();
            }
            await new Promise((r) => server.close(r));
        },
    };
}

const USAGE = { prompt_tokens: 10, completion_tokens: 20, total_tokens: 30 };

describe('upstream answers that are no answer', { timeout: 120000 }, () => {
    let db, gw, good, key;
    const raws = [];

    before(async () => {
        db = await createDb();
        good = await startMock((req, res, rec) =>
            sendJson(res, 200, openaiChat({ model: rec.json.model, usage: USAGE })));
        gw = await startGateway({ db });
        ({ key } = await makeUserKey(gw));
    });

    after(async () => {
        for (const r of raws) {
            await r.close();
        }
        await tearDown(db, [gw], [good]);
    });

    /* a model served only by the raw upstream, and one with a good
       channel behind it */
    async function models(answer) {
        const raw = await rawUpstream(answer);
        raws.push(raw);
        const alone = uniq('gpt-raw');
        const backed = uniq('gpt-raw-backed');
        await makeChannel(gw, { base_url: raw.url, models: [alone, backed], priority: 10 });
        await makeChannel(gw, { base_url: good.url, models: [backed], priority: 0 });
        await settle();
        return { raw, alone, backed };
    }

    const secret = () => JSON.stringify(openaiChat({ usage: USAGE,
        content: 'a body the gateway cannot read' }));

    test('Content-Encoding identity, none or empty: an answer like any other', async () => {
        for (const coding of ['identity', 'none', 'IDENTITY', '']) {
            const { alone } = await models((s) => {
                const body = JSON.stringify(openaiChat({ usage: USAGE }));
                s.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n' +
                    `Content-Encoding: ${coding}\r\n` +
                    `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
            });
            const r = assertOk(await gw.chat(key, alone, { timeoutMs: 10000 }), coding);
            assert.equal(r.json.usage.completion_tokens, 20);
        }
    });

    test('a broken chunk in the read that brought the head: the client gets what came before it', async () => {
        const { alone } = await models((s) => {
            const ev = `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk',
                choices: [{ index: 0, delta: { content: 'partial' }, finish_reason: null }] })}\n\n`;
            s.write('HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n' +
                'Transfer-Encoding: chunked\r\n\r\n' +
                `${Buffer.byteLength(ev).toString(16)}\r\n${ev}\r\nQQ\r\n`);
        });
        const r = await gw.chat(key, alone, { extra: { stream: true }, timeoutMs: 10000 });
        assert.equal(r.status, 200);
        assert.match(r.text, /"content":"partial"/);
        const id = r.headers['x-request-id'];
        const { items } = await waitLogs(gw, { page_size: 50 },
            (it) => it.some((i) => i.request_id === id));
        assert.equal(items.find((i) => i.request_id === id).status, 502);
    });

    test('usage that is no count (negative, a string, {}) is billed by estimate, not as 0', async () => {
        const content = 'x'.repeat(400);
        for (const usage of [{}, { prompt_tokens: '900', completion_tokens: '900' },
            { prompt_tokens: -1, completion_tokens: -1 }, { prompt_tokens: 1e300 }]) {
            const m = uniq('gpt-bad-usage');
            const up = await startMock((req, res) => sendJson(res, 200, {
                ...openaiChat({ model: m, content, usage: null }), usage }));
            try {
                await makeChannel(gw, { base_url: up.url, models: [m], free: false });
                assertOk(await gw.admin('PUT', '/api/pricing',
                    { [m]: { ratio: 1, completion_ratio: 1 } }));
                await settle();
                const r = assertOk(await gw.chat(key, m));
                const id = r.headers['x-request-id'];
                const { items } = await waitLogs(gw, { page_size: 50 },
                    (it) => it.some((i) => i.request_id === id));
                const row = items.find((i) => i.request_id === id);
                assert.equal(row.completion_tokens, 100, JSON.stringify(usage));
                assert.ok(row.prompt_tokens > 0, JSON.stringify(row));
                assert.equal(row.quota, row.prompt_tokens + 100, JSON.stringify(row));
            } finally {
                await up.close();
            }
        }
    });

    for (const [what, answer, code, message] of [
        ['a 101', (s) => s.end('HTTP/1.1 101 Switching Protocols\r\n' +
            'Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n'),
        'bad_response_status_code', /with a status that is no answer \(101\)/],
        ['a gzip answer without a length, ended by close', (s) => {
            const z = zlib.gzipSync(secret());
            s.write('HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n' +
                'Content-Encoding: gzip\r\n\r\n');
            s.end(z);
        }, 'bad_response_body', /without a valid response body/],
        ['a gzip answer with a length', (s) => {
            const z = zlib.gzipSync(secret());
            s.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n' +
                `Content-Encoding: gzip\r\nContent-Length: ${z.length}\r\n\r\n`);
            s.write(z);
        }, 'bad_response_body', /without a valid response body/],
        ['a Transfer-Encoding gzip', (s) => {
            const z = zlib.gzipSync(secret());
            s.write('HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n' +
                'Transfer-Encoding: gzip\r\nConnection: close\r\n\r\n');
            s.end(z);
        }, 'bad_response_body', /without a valid response body/],
    ]) {
        test(`${what}: the next channel, else 502 ${code}, nothing passed on or charged`, async () => {
            const { raw, alone, backed } = await models(answer);
            const r = await gw.chat(key, alone, { timeoutMs: 10000 });
            assertError(r, 502, { type: 'upstream_error', code, message });
            assert.equal(r.headers['content-encoding'], undefined);
            assert.equal(raw.requests.length, 1);

            const b = assertOk(await gw.chat(key, backed, { timeoutMs: 10000 }));
            assert.equal(b.json.usage.completion_tokens, 20);

            const id = r.headers['x-request-id'];
            const { items } = await waitLogs(gw, { page_size: 50 },
                (it) => it.some((i) => i.request_id === id));
            const row = items.find((i) => i.request_id === id);
            assert.equal(row.status, 502);
            assert.equal(row.quota, 0);
        });
    }
});
