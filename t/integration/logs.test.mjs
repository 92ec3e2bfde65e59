// Request log and billing: one row per proxied request with the client's
// model name, the upstream model, the channels tried, usage and quota; the
// charge lands on the key and the user.

import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import {
    assertOk, createDb, dropDb, eventually, hex, idList, makeChannel, makeKey,
    makeUser, settle, sleep, startGateway, stopAll, uniq, waitLogs,
} from '../lib/harness.mjs';
import {
    openaiChat, openaiError, openaiStream, sendJson, startMock,
} from '../lib/mock.mjs';

/* 500,000 quota = 1 USD; ratio 1 = 1 quota per token. */
const USAGE = { prompt_tokens: 10, completion_tokens: 20 };

describe('request log and billing', { timeout: 180000 }, () => {
    let db, gw, ok, bad, streamer, failer;
    const M = uniq('gpt-log');
    const MAPPED = uniq('gpt-log-mapped');
    const RETRY = uniq('gpt-log-retry');
    const STREAM = uniq('gpt-log-stream');
    const ERR = uniq('gpt-log-err');
    const PERCALL = uniq('gpt-log-percall');
    const ch = {};

    before(async () => {
        db = await createDb();
        ok = await startMock((req, res, rec) => sendJson(res, 200,
            openaiChat({ model: rec.json.model, usage: USAGE })));
        bad = await startMock((req, res) => openaiError(res, 400, 'bad input'));
        failer = await startMock((req, res) => openaiError(res, 500, 'boom',
            { type: 'server_error' }));
        streamer = await startMock((req, res, rec) => openaiStream(res, ['a', 'b', 'c'], {
            model: rec.json.model, usage: { prompt_tokens: 7, completion_tokens: 9 },
        }));
        gw = await startGateway({ db });

        let r = await gw.admin('PUT', '/api/pricing', {
            [M]: { ratio: 1, completion_ratio: 2 },
            [MAPPED]: { ratio: 1, completion_ratio: 2 },
            [RETRY]: { ratio: 1, completion_ratio: 2 },
            [STREAM]: { ratio: 1, completion_ratio: 2 },
            [ERR]: { ratio: 1, completion_ratio: 2 },
            [PERCALL]: { price: 0.01 },
        });
        assert.equal(r.status, 200, r.text);
        r = await gw.admin('PUT', '/api/group', { default: 1, double: 2 });
        assert.equal(r.status, 200, r.text);

        ch.main = await makeChannel(gw, {
            base_url: ok.url, models: [M, PERCALL], groups: ['default', 'double'],
        });
        ch.mapped = await makeChannel(gw, {
            base_url: ok.url, models: [MAPPED], model_mapping: { [MAPPED]: 'vendor-x-1' },
        });
        ch.retryA = await makeChannel(gw, { base_url: failer.url, models: [RETRY], priority: 10 });
        ch.retryB = await makeChannel(gw, { base_url: ok.url, models: [RETRY], priority: 1 });
        ch.stream = await makeChannel(gw, { base_url: streamer.url, models: [STREAM] });
        ch.err = await makeChannel(gw, { base_url: bad.url, models: [ERR] });
        await settle();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all([ok, bad, failer, streamer].map((m) => m?.close()));
            await dropDb(db);
        }
    });

    async function freshKey(userOpts = {}) {
        const u = await makeUser(gw, userOpts);
        const t = await makeKey(gw, u.id, { unlimited_quota: false, remain_quota: 100000 });
        return { user: u, token: t, key: t.key };
    }

    const oneRow = (q) => waitLogs(gw, q, (items) => items.length >= 1)
        .then((l) => l.items[0]);

    test('one row per request: ids, models, channel, usage, quota', async () => {
        const { token, key } = await freshKey();
        const r = assertOk(await gw.chat(key, M));
        const log = await waitLogs(gw, { token_id: token.id }, (items) => items.length >= 1);
        /* a second row would be a double write; give a late one time to appear */
        await sleep(1500);
        const again = await waitLogs(gw, { token_id: token.id }, () => true);
        assert.equal(again.items.length, 1, JSON.stringify(again.items));
        assert.equal(again.total, 1);
        const row = log.items[0];
        assert.equal(row.request_id, r.headers['x-request-id']);
        assert.equal(row.model_name, M);
        assert.equal(row.channel_id, ch.main.id);
        assert.deepEqual(idList(row.channels_tried), [ch.main.id]);
        assert.equal(row.prompt_tokens, 10);
        assert.equal(row.completion_tokens, 20);
        assert.equal(row.quota, 10 + 20 * 2, 'ratio 1, completion ratio 2, group ratio 1');
        assert.equal(Number(row.status), 200);
        assert.equal(row.is_stream, false);
    });

    test('request ids begin with the time in milliseconds, so they sort in time order on every worker', async () => {
        const { key } = await freshKey();
        const ids = [];
        for (let i = 0; i < 6; i++) {
            const t0 = Date.now();
            /* one request per connection: nginx hands them to any worker */
            const r = assertOk(await gw.chat(key, M, { headers: { connection: 'close' } }));
            const t1 = Date.now();
            const id = r.headers['x-request-id'];
            assert.match(id, /^[0-9a-f]{32}$/);
            const ms = parseInt(id.slice(0, 12), 16);
            /* nginx's cached clock may lag the request by a few ms */
            assert.ok(ms >= t0 - 1000 && ms <= t1, `${id}: ${ms} not in [${t0}, ${t1}]`);
            ids.push(id);
            await sleep(3);
        }
        assert.deepEqual([...ids].sort(), ids, 'ids sort in the order they were made');
        assert.equal(new Set(ids).size, ids.length);
    });

    test('the charge lands on the key and the user', async () => {
        const { user, token, key } = await freshKey();
        assertOk(await gw.chat(key, M));
        await eventually(async () => {
            const t = await gw.admin('GET', `/api/token/${token.id}`);
            assert.equal(t.json.used_quota, 50, t.text);
            assert.equal(t.json.remain_quota, 100000 - 50, t.text);
            const u = await gw.admin('GET', `/api/user/${user.id}`);
            assert.equal(u.json.used_quota, 50, u.text);
        }, { ms: 5000, intervalMs: 200 });
    });

    test('the group ratio multiplies the price', async () => {
        const { token, key } = await freshKey({ group: 'double' });
        assertOk(await gw.chat(key, M));
        const row = await oneRow({ token_id: token.id });
        assert.equal(row.quota, (10 + 20 * 2) * 2);
    });

    test('a per-call price bills the call, not the tokens', async () => {
        const { token, key } = await freshKey();
        assertOk(await gw.chat(key, PERCALL));
        const row = await oneRow({ token_id: token.id });
        assert.equal(row.quota, 0.01 * 500000);
    });

    test('with model_mapping the row keeps the client model and names the upstream one', async () => {
        const { token, key } = await freshKey();
        assertOk(await gw.chat(key, MAPPED));
        const row = await oneRow({ token_id: token.id });
        assert.equal(row.model_name, MAPPED);
        assert.equal(row.upstream_model, 'vendor-x-1');
        assert.equal(row.channel_id, ch.mapped.id);
    });

    test('a retried request lists every channel tried', async () => {
        const { token, key } = await freshKey();
        assertOk(await gw.chat(key, RETRY));
        const row = await oneRow({ token_id: token.id });
        assert.deepEqual(idList(row.channels_tried), [ch.retryA.id, ch.retryB.id]);
        assert.equal(row.channel_id, ch.retryB.id);
        assert.equal(row.quota, 50, 'billed once');
    });

    test('a stream is logged with the usage it reported', async () => {
        const { token, key } = await freshKey();
        const r = assertOk(await gw.chat(key, STREAM, { extra: { stream: true } }));
        assert.ok(r.text.includes('[DONE]'));
        const row = await oneRow({ token_id: token.id });
        assert.equal(row.is_stream, true);
        assert.equal(row.prompt_tokens, 7);
        assert.equal(row.completion_tokens, 9);
        assert.equal(row.quota, 7 + 9 * 2);
    });

    test('an upstream error is logged and costs nothing', async () => {
        const { token, key } = await freshKey();
        const r = await gw.chat(key, ERR);
        assert.equal(r.status, 400, r.text);
        const row = await oneRow({ token_id: token.id });
        assert.equal(Number(row.status), 400);
        assert.equal(row.quota, 0);
        assert.equal(row.request_id, r.headers['x-request-id']);
        /* the pre-consumed estimate must have come back */
        await eventually(async () => {
            const t = await gw.admin('GET', `/api/token/${token.id}`);
            assert.equal(t.json.used_quota, 0, t.text);
            assert.equal(t.json.remain_quota, 100000, t.text);
        }, { ms: 5000, intervalMs: 200 });
    });

    test('a body refused with 400 is logged under the model it names', async () => {
        const { token, key } = await freshKey();
        const r = await gw.req('POST', '/v1/chat/completions', { key, body: { model: M } });
        assert.equal(r.status, 400, r.text);
        const row = await oneRow({ token_id: token.id });
        assert.equal(row.model_name, M);
        assert.equal(Number(row.status), 400);
        assert.equal(row.quota, 0);
        /* one that names none (or not as a string) has none */
        const other = await freshKey();
        const r2 = await gw.req('POST', '/v1/chat/completions', { key: other.key, body: { model: 7 } });
        assert.equal(r2.status, 400, r2.text);
        assert.equal((await oneRow({ token_id: other.token.id })).model_name, '');
    });

    test('a client that leaves during its body\'s upload is logged as 499', async () => {
        const { token, key } = await freshKey();
        const body = JSON.stringify({ model: M, messages: [{ role: 'user', content: 'hi' }] });
        const u = new URL(gw.url);
        await new Promise((resolve, reject) => {
            const c = net.connect(Number(u.port), u.hostname, () => {
                c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n`
                    + `Authorization: Bearer ${key}\r\nContent-Type: application/json\r\n`
                    + `Content-Length: ${body.length + 500}\r\n\r\n${body}`);
                setTimeout(() => c.end(), 300);
            });
            c.on('data', () => {});
            c.on('close', resolve);
            c.on('error', reject);
            setTimeout(() => { c.destroy(); resolve(); }, 10000);
        });
        const row = await oneRow({ token_id: token.id });
        assert.equal(Number(row.status), 499, JSON.stringify(row));
        assert.equal(row.quota, 0);
    });

    test('filters: model and user_id', async () => {
        const model = uniq('gpt-log-filter');
        await makeChannel(gw, { base_url: ok.url, models: [model] });
        const { user, key } = await freshKey();
        const other = await freshKey();
        await settle();
        assertOk(await gw.chat(key, model));
        assertOk(await gw.chat(key, model));
        assertOk(await gw.chat(other.key, model));
        const byModel = await waitLogs(gw, { model }, (items, l) => l.total >= 3);
        assert.equal(byModel.total, 3);
        assert.ok(byModel.items.every((i) => i.model_name === model));
        const byUser = await waitLogs(gw, { user_id: user.id, model }, (items, l) => l.total >= 2);
        assert.equal(byUser.total, 2);
        /* a filter it does not know is refused, not ignored */
        const typo = await gw.admin('GET', `/api/log?token=${user.id}`);
        assert.equal(typo.status, 400, typo.text);
        assert.equal(typo.json.error.code, 'invalid_request');
        assert.match(typo.json.error.message, /^unknown filter: token \(known: token_id, /);
        const none = await gw.admin('GET', `/api/log?model=${uniq('nothing')}-${hex(2)}`);
        assert.equal(none.status, 200, none.text);
        assert.equal(none.json.total, 0);
        assert.deepEqual(none.json.items, []);
    });
});
