// Billing: the exact quota charged for known usage on every endpoint and
// upstream type, group ratios and per-call prices, refunds, the quota
// checks made before the upstream call, and a ledger that loses nothing and
// charges nothing twice (failed flushes, kill -9, reload, graceful stop).
//
// Units: 500,000 quota = 1 USD.  A per-token price gives
//   quota = round((prompt + cache_read x cache_ratio + cache_write x
//                  cache_creation_ratio + completion x completion_ratio)
//                 x ratio x group)
// (prompt without cached tokens; the cache multiples default to 1, which is
// (prompt + completion x completion_ratio) x ratio x group), and a per-call
// price round(price x 500,000 x group).

import assert from 'node:assert/strict';
import fs from 'node:fs';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, eventually, hex, makeChannel,
    makeKey, makeUser, psql, settle, sleep, sseEvents, startGateway, stopAll,
    times, uniq, waitLogs,
} from '../lib/harness.mjs';
import {
    anthropicMessage, echo, openaiChat, openaiError, openaiStream, sendJson,
    startClosedPort, startMock,
} from '../lib/mock.mjs';

const QUOTA_PER_USD = 500000;

/* ------------------------------------------------------------------ */
/* upstream answers this file needs beyond t/lib/mock.mjs              */
/* ------------------------------------------------------------------ */

function sseHead(res) {
    res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
    res.flushHeaders();
}

/* An Anthropic stream whose message_start carries cache usage. */
function anthropicCacheStream(res, model, { input, output, cacheRead = 0,
    cacheCreation = 0, text = ['Hel', 'lo'] }) {
    sseHead(res);
    const ev = (name, data) => res.write(
        `event: ${name}\ndata: ${JSON.stringify({ type: name, ...data })}\n\n`);
    ev('message_start', {
        message: {
            id: `msg_${hex(8)}`, type: 'message', role: 'assistant', model,
            content: [], stop_reason: null, stop_sequence: null,
            usage: {
                input_tokens: input, output_tokens: 1,
                cache_read_input_tokens: cacheRead,
                cache_creation_input_tokens: cacheCreation,
            },
        },
    });
    ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
    for (const t of text) {
        ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: t } });
    }
    ev('content_block_stop', { index: 0 });
    ev('message_delta', {
        delta: { stop_reason: 'end_turn', stop_sequence: null },
        usage: { output_tokens: output },
    });
    ev('message_stop', {});
    res.end();
}

function geminiAnswer({ text = 'hi there', usage }) {
    return {
        candidates: [{
            content: { role: 'model', parts: [{ text }] },
            finishReason: 'STOP', index: 0,
            safetyRatings: [{ category: 'HARM_CATEGORY_HARASSMENT', probability: 'NEGLIGIBLE' }],
        }],
        usageMetadata: usage,
        modelVersion: 'gemini-mock-001',
    };
}

/* Gemini streams repeat a cumulative usageMetadata in every chunk. */
function geminiStream(res, parts, final) {
    sseHead(res);
    parts.forEach((text, i) => {
        const last = i === parts.length - 1;
        const usage = last ? final : {
            promptTokenCount: final.promptTokenCount,
            candidatesTokenCount: i + 1,
            totalTokenCount: final.promptTokenCount + i + 1,
        };
        const chunk = {
            candidates: [{
                content: { role: 'model', parts: [{ text }] },
                ...(last ? { finishReason: 'STOP' } : {}), index: 0,
            }],
            usageMetadata: usage,
            modelVersion: 'gemini-mock-001',
        };
        res.write(`data: ${JSON.stringify(chunk)}\r\n\r\n`);
    });
    res.end();
}

/* A Gemini stream of texts without usage, which the upstream cuts short. */
async function geminiCutStream(res, texts) {
    sseHead(res);
    for (const t of texts) {
        res.write(`data: ${JSON.stringify({
            candidates: [{ content: { role: 'model', parts: [{ text: t }] }, index: 0 }],
        })}\r\n\r\n`);
    }
    await sleep(100);
    res.destroy();
}

/* The three rerank answer shapes in common use. */
function rerankAnswer(kind, docs) {
    const results = docs.map((d, i) => ({
        index: i, relevance_score: Math.round((0.1 + 0.8 * ((i * 7) % docs.length) /
            docs.length) * 1000) / 1000,
    }));
    if (kind === 'cohere') {
        return {
            id: `cohere-${hex(6)}`,
            results: results.slice().sort((a, b) => b.relevance_score - a.relevance_score),
            meta: { api_version: { version: '1' }, billed_units: { search_units: 3 } },
        };
    }
    if (kind === 'jina') {
        return {
            model: 'jina-reranker-mock',
            usage: { total_tokens: 57, prompt_tokens: 57 },
            results: results.map((r) => ({ ...r, document: { text: docs[r.index] } }))
                .sort((a, b) => b.relevance_score - a.relevance_score),
        };
    }
    return {
        id: `rerank-${hex(6)}`, model: 'bge-mock', object: 'rerank',
        usage: { prompt_tokens: 41, total_tokens: 41 },
        results: results.map((r) => ({ ...r, document: { text: docs[r.index] } })),
    };
}

/* ------------------------------------------------------------------ */
/* helpers                                                             */
/* ------------------------------------------------------------------ */

async function balances(gw, token, user) {
    const t = await gw.admin('GET', `/api/token/${token.id}`);
    assert.equal(t.status, 200, t.text);
    const u = await gw.admin('GET', `/api/user/${user.id}`);
    assert.equal(u.status, 200, u.text);
    return {
        remain: t.json.remain_quota, tokenUsed: t.json.used_quota,
        userQuota: u.json.quota, userUsed: u.json.used_quota,
    };
}

/* Waits until the key and its user show `used` charged (flush included). */
async function expectCharged(gw, { token, user, remain0, quota0 }, used, { ms = 6000 } = {}) {
    return eventually(async () => {
        const b = await balances(gw, token, user);
        assert.equal(b.tokenUsed, used, `token used_quota ${JSON.stringify(b)}`);
        if (remain0 !== undefined) {
            assert.equal(b.remain, remain0 - used, `token remain_quota ${JSON.stringify(b)}`);
        }
        assert.equal(b.userUsed, used, `user used_quota ${JSON.stringify(b)}`);
        assert.equal(b.userQuota, quota0 - used, `user quota ${JSON.stringify(b)}`);
        return b;
    }, { ms, intervalMs: 200 });
}

/* The single ledger row of a request id (waits for the flush). */
async function rowOf(gw, token, requestId, { ms = 6000 } = {}) {
    assert.ok(requestId, 'response has X-Request-Id');
    const l = await waitLogs(gw, { token_id: token.id, page_size: 1000 },
        (items) => items.some((i) => i.request_id === requestId), { ms });
    const rows = l.items.filter((i) => i.request_id === requestId);
    assert.equal(rows.length, 1, `one row for ${requestId}: ${JSON.stringify(rows)}`);
    return rows[0];
}

/* Ledger rows per request id and balances, straight from PostgreSQL. */
async function dbRows(db, table = 'logs') {
    const out = await psql(db.conninfo,
        `select coalesce(json_agg(json_build_object('request_id', request_id, 'type', type,
            'token_id', token_id, 'user_id', user_id, 'quota', quota, 'status', status)), '[]')
           from ${table}`);
    return JSON.parse(out);
}

async function dbBalance(db, token, user) {
    const out = await psql(db.conninfo,
        `select json_build_object(
            'remain', (select remain_quota from tokens where id = ${Number(token.id)}),
            'tokenUsed', (select used_quota from tokens where id = ${Number(token.id)}),
            'userQuota', (select quota from users where id = ${Number(user.id)}),
            'userUsed', (select used_quota from users where id = ${Number(user.id)}))`);
    return JSON.parse(out);
}

/*
 * The ledger agrees with the balances to the unit: for every key and user,
 * used_quota is the sum of its consume rows, and error rows cost nothing.
 */
async function assertLedgerAgrees(db) {
    const bad = await psql(db.conninfo, `
        select coalesce(json_agg(x), '[]') from (
          select 'token' as kind, t.id, t.used_quota as used,
                 coalesce(sum(l.quota) filter (where l.type = 'consume'), 0) as ledger
            from tokens t left join logs l on l.token_id = t.id
           group by t.id
          having t.used_quota <> coalesce(sum(l.quota) filter (where l.type = 'consume'), 0)
          union all
          select 'user', u.id, u.used_quota,
                 coalesce(sum(l.quota) filter (where l.type = 'consume'), 0)
            from users u left join logs l on l.user_id = u.id
           group by u.id
          having u.used_quota <> coalesce(sum(l.quota) filter (where l.type = 'consume'), 0)) x`);
    assert.deepEqual(JSON.parse(bad), [], 'used_quota differs from the ledger sum');
    const errCost = await psql(db.conninfo,
        `select count(*) from logs where type = 'error' and quota <> 0`);
    assert.equal(errCost, '0', 'error rows cost nothing');
    const types = await psql(db.conninfo,
        `select coalesce(string_agg(distinct type, ','), '') from logs
          where type not in ('consume', 'error')`);
    assert.equal(types, '', 'only consume and error rows');
    const dup = await psql(db.conninfo,
        `select count(*) from (select request_id from logs group by request_id
          having count(*) > 1) d`);
    assert.equal(dup, '0', 'one row per request id');
}

/* A user with a known quota and a key with a known remain (or unlimited). */
async function account(gw, { quota = 100000000, group = 'default', remain,
    unlimited = remain === undefined } = {}) {
    const user = await makeUser(gw, { quota, group });
    const token = await makeKey(gw, user.id, unlimited
        ? { unlimited_quota: true }
        : { unlimited_quota: false, remain_quota: remain });
    return { user, token, key: token.key, remain0: unlimited ? undefined : remain, quota0: quota };
}

/* Stops a gateway whose workers were killed on purpose: nginx's own
 * "exited on signal 9" alert is expected there, no other alert. */
async function stopAfterKill(gw) {
    if (!gw) {
        return;
    }
    await gw.stop();
    const bad = gw.errorLog().split('\n')
        .filter((l) => /\[(alert|emerg)\]/.test(l) && !/exited on signal 9/.test(l));
    assert.deepEqual(bad, [], `error log of ${gw.dir} has alert/emerg lines`);
    assert.equal(gw.killed, false, 'nginx stopped within 5 s of SIGQUIT');
    if (!process.env.LLMGW_KEEP) {
        fs.rmSync(gw.dir, { recursive: true, force: true });
    }
}

/* ------------------------------------------------------------------ */
/* the charge for known usage                                          */
/* ------------------------------------------------------------------ */

describe('billing: the charge for known usage', { timeout: 240000 }, () => {
    let db, gw, oa, an, gm, rr, closed;
    const M = {
        oa: uniq('gpt-bill'), an: uniq('claude-bill'), gm: uniq('gemini-bill'),
        perCall: uniq('gpt-bill-call'), failing: uniq('gpt-bill-500'),
        down: uniq('gpt-bill-down'), cheap: uniq('gpt-bill-r1'),
        noPrice: uniq('gpt-bill-noprice'), oaCache: uniq('gpt-bill-cache'),
        round: uniq('gpt-bill-round'), roundHalf: uniq('gpt-bill-half'),
        cohere: uniq('rerank-cohere'), jina: uniq('rerank-jina'), oaRerank: uniq('rerank-oa'),
        bareRerank: uniq('rerank-bare'), gmCall: uniq('gemini-bill-call'),
    };
    /* what the OpenAI mock reports, settable per test */
    let oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
    async function oaAnswer(req, res, rec) {
        if (rec.json && rec.json.stream) {
            /* like OpenAI: a usage chunk only when asked for */
            const asked = rec.json.stream_options && rec.json.stream_options.include_usage;
            await openaiStream(res, ['Hel', 'lo'], {
                model: rec.json.model, usage: asked ? oaUsage : undefined,
            });
            return;
        }
        sendJson(res, 200, openaiChat({ model: rec.json && rec.json.model, usage: oaUsage }));
    }

    before(async () => {
        db = await createDb();
        oa = await startMock(oaAnswer);
        an = await startMock();
        gm = await startMock();
        rr = await startMock((req, res, rec) => {
            if (rec.path.startsWith('/bare')) {
                /* a self-hosted server: no usage, the documents echoed when asked */
                sendJson(res, 200, {
                    results: rec.json.documents.map((d, index) => ({
                        index, relevance_score: 1 / (index + 1),
                        ...(rec.json.return_documents ? { document: { text: d } } : {}),
                    })),
                });
                return;
            }
            const kind = rec.path.startsWith('/cohere') ? 'cohere'
                : rec.path.startsWith('/jina') ? 'jina' : 'oa';
            sendJson(res, 200, rerankAnswer(kind, rec.json.documents));
        });
        const failer = await startMock((req, res) => openaiError(res, 500, 'upstream exploded',
            { type: 'server_error' }));
        closed = await startClosedPort();
        gw = await startGateway({ db });
        gw.extraMocks = [failer];

        let r = await gw.admin('PUT', '/api/pricing', {
            [M.oa]: { ratio: 2, completion_ratio: 3 },
            /* cache reads and writes at their own multiple of the prompt price */
            [M.an]: { ratio: 1.5, completion_ratio: 4, cache_ratio: 0.1, cache_creation_ratio: 1.25 },
            [M.oaCache]: { ratio: 1, completion_ratio: 2, cache_ratio: 0.5 },
            [M.round]: { ratio: 0.25, completion_ratio: 1 },
            [M.roundHalf]: { ratio: 0.7, completion_ratio: 1 },
            [M.gm]: { ratio: 0.5, completion_ratio: 2 },
            [M.perCall]: { price: 0.003 },
            [M.failing]: { ratio: 1, completion_ratio: 1 },
            [M.down]: { ratio: 1, completion_ratio: 1 },
            [M.cheap]: { ratio: 1, completion_ratio: 1 },
            [M.cohere]: { ratio: 100, completion_ratio: 1 },
            [M.jina]: { ratio: 100, completion_ratio: 1 },
            [M.oaRerank]: { ratio: 100, completion_ratio: 1 },
            [M.bareRerank]: { ratio: 1, completion_ratio: 4 },
            [M.gmCall]: { price: 0.002 },
        });
        assert.equal(r.status, 200, r.text);
        r = await gw.admin('PUT', '/api/group', { default: 1, vip: 0.25 });
        assert.equal(r.status, 200, r.text);

        const groups = ['default', 'vip'];
        await makeChannel(gw, {
            base_url: oa.url, models: [M.oa, M.perCall, M.cheap, M.oaCache, M.round, M.roundHalf], groups,
        });
        await makeChannel(gw, { base_url: oa.url, models: [M.noPrice], free: false });
        await makeChannel(gw, { type: 14, base_url: an.url, models: [M.an], groups });
        await makeChannel(gw, { type: 24, base_url: gm.url, models: [M.gm, M.gmCall], groups });
        await makeChannel(gw, { base_url: failer.url, models: [M.failing] });
        await makeChannel(gw, { base_url: closed.url, models: [M.down] });
        await makeChannel(gw, { type: 34, base_url: `${rr.url}/cohere`, models: [M.cohere] });
        await makeChannel(gw, { type: 38, base_url: `${rr.url}/jina`, models: [M.jina] });
        await makeChannel(gw, { type: 1, base_url: `${rr.url}/oa`, models: [M.oaRerank] });
        await makeChannel(gw, { type: 1, base_url: `${rr.url}/bare`, models: [M.bareRerank] });
        await settle();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all([oa, an, gm, rr, ...(gw?.extraMocks || [])].map((m) => m?.close()));
            await dropDb(db);
        }
    });

    /* One request, then: its row's usage and quota, and the balances. */
    async function charged(acct, r, { prompt, completion, quota, cacheRead, isStream = false }) {
        assertOk(r);
        const row = await rowOf(gw, acct.token, r.headers['x-request-id']);
        assert.equal(row.type, 'consume', JSON.stringify(row));
        if (prompt !== undefined) {
            assert.equal(row.prompt_tokens, prompt, `prompt_tokens ${JSON.stringify(row)}`);
        }
        if (completion !== undefined) {
            assert.equal(row.completion_tokens, completion,
                `completion_tokens ${JSON.stringify(row)}`);
        }
        if (cacheRead !== undefined) {
            assert.equal(row.cache_read_tokens, cacheRead,
                `cache_read_tokens ${JSON.stringify(row)}`);
        }
        assert.equal(row.is_stream, isStream, `is_stream ${JSON.stringify(row)}`);
        assert.equal(row.quota, quota, `quota ${JSON.stringify(row)}`);
        await expectCharged(gw, acct, quota);
        return row;
    }

    test('OpenAI JSON: (prompt + completion x completion_ratio) x ratio', async () => {
        oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
        const a = await account(gw, { remain: 1000000 });
        const r = await gw.chat(a.key, M.oa);
        await charged(a, r, { prompt: 123, completion: 45, quota: (123 + 45 * 3) * 2 });
    });

    test('OpenAI stream: the usage the gateway asked for is billed and not shown to the client', async () => {
        oaUsage = { prompt_tokens: 77, completion_tokens: 11 };
        const a = await account(gw, { remain: 1000000 });
        const r = assertOk(await gw.chat(a.key, M.oa, { extra: { stream: true } }));
        const up = oa.requests[oa.requests.length - 1];
        assert.equal(up.json.stream_options && up.json.stream_options.include_usage, true,
            'the gateway asks the upstream for usage');
        const chunks = sseEvents(r.text).filter((e) => e.data !== '[DONE]')
            .map((e) => JSON.parse(e.data));
        assert.ok(chunks.length >= 2, r.text);
        assert.ok(chunks.every((c) => !c.usage), `no usage chunk for the client: ${r.text}`);
        assert.ok(r.text.trimEnd().endsWith('data: [DONE]'), r.text);
        await charged(a, r, { prompt: 77, completion: 11, quota: (77 + 11 * 3) * 2, isStream: true });
    });

    test('OpenAI stream: a client that asked for usage gets it and is billed the same', async () => {
        oaUsage = { prompt_tokens: 77, completion_tokens: 11 };
        const a = await account(gw);
        const r = assertOk(await gw.chat(a.key, M.oa, {
            extra: { stream: true, stream_options: { include_usage: true } },
        }));
        const chunks = sseEvents(r.text).filter((e) => e.data !== '[DONE]')
            .map((e) => JSON.parse(e.data));
        const u = chunks.filter((c) => c.usage);
        assert.equal(u.length, 1, r.text);
        assert.equal(u[0].usage.prompt_tokens, 77);
        assert.equal(u[0].usage.completion_tokens, 11);
        await charged(a, r, { prompt: 77, completion: 11, quota: 220, isStream: true });
    });

    test('OpenAI stream cut off without usage: billed for the delivered text (bytes / 4)', async () => {
        const text = ['a'.repeat(100), 'b'.repeat(100), 'c'.repeat(200)]; /* 400 bytes */
        oa.handler = async (req, res, rec) => {
            await openaiStream(res, text, { model: rec.json.model, end: false });
            await sleep(100);
            res.destroy();
        };
        try {
            const a = await account(gw);
            const r = await gw.chat(a.key, M.oa, { extra: { stream: true } });
            assert.equal(r.status, 200, r.text);
            assert.ok(r.text.includes('c'.repeat(200)), 'what was sent was delivered');
            const row = await rowOf(gw, a.token, r.headers['x-request-id']);
            assert.equal(row.completion_tokens, 100, JSON.stringify(row));
            assert.ok(row.quota > 0, JSON.stringify(row));
            assert.equal(row.quota, (row.prompt_tokens + 100 * 3) * 2, JSON.stringify(row));
            await expectCharged(gw, a, row.quota);
        } finally {
            oa.handler = oaAnswer;
        }
    });

    test('a stream without usage written with spaces after the colons (Python json.dumps): its text is billed', async () => {
        const py = (o) => JSON.stringify(o).replace(/":/g, '": ').replace(/,"/g, ', "');
        const X = 'x'.repeat(400); /* 100 tokens */
        const chunk = py({ choices: [{ index: 0, delta: { content: X } }] });
        const endings = {
            whole: `data: ${py({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\ndata: [DONE]\n\n`,
            /* an error after the text: the text was delivered, and billed */
            error: `data: ${py({ error: { message: 'boom' } })}\n\n`,
        };
        let ending;
        oa.handler = (req, res) => {
            sseHead(res);
            res.end(`data: ${chunk}\n\n${endings[ending]}`);
        };
        try {
            for (const [e, status] of [['whole', 200], ['error', 502]]) {
                ending = e;
                const a = await account(gw);
                const r = await gw.chat(a.key, M.oa, { extra: { stream: true } });
                assert.equal(r.status, 200, r.text);
                const row = await rowOf(gw, a.token, r.headers['x-request-id']);
                assert.equal(row.type, 'consume', `${e}: ${JSON.stringify(row)}`);
                assert.equal(row.status, status, `${e}: ${JSON.stringify(row)}`);
                assert.equal(row.completion_tokens, 100, `${e}: ${JSON.stringify(row)}`);
                assert.equal(row.quota, (row.prompt_tokens + 100 * 3) * 2, JSON.stringify(row));
                await expectCharged(gw, a, row.quota);
            }
        } finally {
            oa.handler = oaAnswer;
        }
    });

    test('a JSON answer without usage is billed for its tool arguments, reasoning and thinking', async () => {
        const X = 'x'.repeat(200);
        oa.handler = (req, res, rec) => sendJson(res, 200, {
            id: 'c', object: 'chat.completion', model: rec.json.model,
            choices: [{ index: 0, finish_reason: 'tool_calls', message: {
                role: 'assistant', content: null, reasoning_content: X,
                tool_calls: [{ id: 't', type: 'function', function: { name: 'f', arguments: X } }],
            } }],
        });
        an.handler = (req, res, rec) => sendJson(res, 200, {
            id: 'm', type: 'message', role: 'assistant', model: rec.json.model,
            stop_reason: 'tool_use', content: [
                { type: 'thinking', thinking: X, signature: 's' },
                /* its input as JSON text: 200 bytes */
                { type: 'tool_use', id: 't', name: 'f', input: { a: 'y'.repeat(192) } },
            ],
        });
        try {
            for (const [model, call] of [[M.oa, 'chat'], [M.an, 'messages']]) {
                const a = await account(gw);
                const r = assertOk(await gw[call](a.key, model));
                const row = await rowOf(gw, a.token, r.headers['x-request-id']);
                assert.equal(row.completion_tokens, 100, `${model}: ${JSON.stringify(row)}`);
                await expectCharged(gw, a, row.quota);
            }
        } finally {
            oa.handler = oaAnswer;
            an.handler = echo;
        }
    });

    test('quotas are rounded to the nearest unit', async () => {
        const a = await account(gw);
        oaUsage = { prompt_tokens: 3, completion_tokens: 3 };
        const r1 = assertOk(await gw.chat(a.key, M.round));
        const row1 = await rowOf(gw, a.token, r1.headers['x-request-id']);
        assert.equal(row1.quota, 2, '6 x 0.25 = 1.5 -> 2');
        oaUsage = { prompt_tokens: 1, completion_tokens: 4 };
        const r2 = assertOk(await gw.chat(a.key, M.round));
        const row2 = await rowOf(gw, a.token, r2.headers['x-request-id']);
        assert.equal(row2.quota, 1, '5 x 0.25 = 1.25 -> 1');
        /* a half in decimals that binary floating point holds a hair under */
        oaUsage = { prompt_tokens: 45, completion_tokens: 0 };
        const r3 = assertOk(await gw.chat(a.key, M.roundHalf));
        const row3 = await rowOf(gw, a.token, r3.headers['x-request-id']);
        assert.equal(row3.quota, 32, '45 x 0.7 = 31.5 -> 32');
        await expectCharged(gw, a, 35);
        oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
    });

    test('OpenAI JSON with cached prompt tokens: the cached part at cache_ratio', async () => {
        oaUsage = {
            prompt_tokens: 1000, completion_tokens: 10,
            prompt_tokens_details: { cached_tokens: 800 },
        };
        try {
            const a = await account(gw, { remain: 1000000 });
            const r = await gw.chat(a.key, M.oaCache);
            /* (200 uncached + 800 x 0.5 + 10 x 2) x 1 */
            await charged(a, r, { completion: 10, cacheRead: 800, quota: 620 });
        } finally {
            oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
        }
    });

    test('Anthropic JSON with cache tokens: reads and writes at their own ratios', async () => {
        an.handler = (req, res, rec) => sendJson(res, 200, anthropicMessage({
            model: rec.json.model,
            usage: {
                input_tokens: 100, output_tokens: 50,
                cache_read_input_tokens: 1000, cache_creation_input_tokens: 200,
            },
        }));
        const a = await account(gw, { remain: 1000000 });
        const r = await gw.messages(a.key, M.an);
        /* (100 + 1000 x 0.1 + 200 x 1.25 + 50 x 4) x 1.5 */
        await charged(a, r, { prompt: 100, completion: 50, cacheRead: 1000, quota: 975 });
    });

    test('Anthropic stream with cache tokens: message_start + message_delta usage', async () => {
        an.handler = (req, res, rec) => anthropicCacheStream(res, rec.json.model,
            { input: 60, output: 40, cacheRead: 500 });
        const a = await account(gw);
        const r = await gw.messages(a.key, M.an, { extra: { stream: true } });
        assert.ok(r.text.includes('message_stop'), r.text);
        /* (60 + 500 x 0.1 + 40 x 4) x 1.5 */
        await charged(a, r, {
            prompt: 60, completion: 40, cacheRead: 500, quota: 405, isStream: true,
        });
    });

    test('Gemini JSON: thoughts are billed as output', async () => {
        gm.handler = (req, res) => sendJson(res, 200, geminiAnswer({
            usage: {
                promptTokenCount: 12, candidatesTokenCount: 300, thoughtsTokenCount: 20,
                totalTokenCount: 332,
            },
        }));
        const a = await account(gw, { remain: 1000000 });
        const r = await gw.req('POST', `/v1beta/models/${M.gm}:generateContent`, {
            key: a.key, body: { contents: [{ role: 'user', parts: [{ text: 'hello' }] }] },
        });
        await charged(a, r, { prompt: 12, completion: 320, quota: (12 + 320 * 2) * 0.5 });
    });

    test('Gemini stream: the last usageMetadata counts, once', async () => {
        gm.handler = (req, res) => geminiStream(res, ['a', 'b', 'c'],
            { promptTokenCount: 12, candidatesTokenCount: 100, totalTokenCount: 112 });
        const a = await account(gw);
        const r = await gw.req('POST',
            `/v1beta/models/${M.gm}:streamGenerateContent?alt=sse`, {
                key: a.key, body: { contents: [{ role: 'user', parts: [{ text: 'hello' }] }] },
            });
        assert.equal(sseEvents(r.text).length, 3, r.text);
        await charged(a, r, { prompt: 12, completion: 100, quota: (12 + 100 * 2) * 0.5, isStream: true });
    });

    test('Gemini tool-use prompt tokens are billed as prompt: JSON, stream and a converted chat answer', async () => {
        /* promptTokenCount leaves them out: total = 10 + 900 + 5 */
        const usage = {
            promptTokenCount: 10, toolUsePromptTokenCount: 900, candidatesTokenCount: 5,
            totalTokenCount: 915,
        };
        const quota = (910 + 5 * 2) * 0.5;
        const body = { contents: [{ role: 'user', parts: [{ text: 'what is 6 x 7' }] }] };
        gm.handler = (req, res) => sendJson(res, 200, geminiAnswer({ text: '42', usage }));
        let a = await account(gw);
        let r = await gw.req('POST', `/v1beta/models/${M.gm}:generateContent`, { key: a.key, body });
        await charged(a, r, { prompt: 910, completion: 5, quota });

        a = await account(gw);
        r = assertOk(await gw.chat(a.key, M.gm));
        assert.equal(r.json.usage.prompt_tokens, 910, r.text);
        assert.equal(r.json.usage.total_tokens, 915, r.text);
        await charged(a, r, { prompt: 910, completion: 5, quota });

        gm.handler = (req, res) => geminiStream(res, ['4', '2'], usage);
        a = await account(gw);
        r = await gw.req('POST', `/v1beta/models/${M.gm}:streamGenerateContent?alt=sse`,
            { key: a.key, body });
        await charged(a, r, { prompt: 910, completion: 5, quota, isStream: true });
    });

    test('Gemini stream: a count a later chunk leaves out keeps what an earlier chunk said', async () => {
        gm.handler = (req, res) => {
            sseHead(res);
            const chunk = (text, usageMetadata, last) => `data: ${JSON.stringify({
                candidates: [{ content: { role: 'model', parts: [{ text }] }, index: 0,
                    ...(last ? { finishReason: 'STOP' } : {}) }],
                usageMetadata,
            })}\r\n\r\n`;
            res.end(chunk('a', { promptTokenCount: 1000, candidatesTokenCount: 1 }, false)
                + chunk('b', { candidatesTokenCount: 10, totalTokenCount: 1010 }, true));
        };
        const a = await account(gw);
        const r = await gw.req('POST', `/v1beta/models/${M.gm}:streamGenerateContent?alt=sse`, {
            key: a.key, body: { contents: [{ role: 'user', parts: [{ text: 'hello' }] }] },
        });
        await charged(a, r, {
            prompt: 1000, completion: 10, quota: (1000 + 10 * 2) * 0.5, isStream: true,
        });
    });

    test('Gemini stream without alt=sse: one JSON array, billed from the last usageMetadata', async () => {
        gm.handler = (req, res) => geminiStream(res, ['a', 'b', 'c'],
            { promptTokenCount: 10, candidatesTokenCount: 40, totalTokenCount: 50 });
        const a = await account(gw);
        const r = await gw.req('POST', `/v1beta/models/${M.gm}:streamGenerateContent`, {
            key: a.key, body: { contents: [{ role: 'user', parts: [{ text: 'hello' }] }] },
        });
        assert.equal(r.status, 200, r.text);
        assert.equal(JSON.parse(r.text).length, 3, r.text);
        await charged(a, r, { prompt: 10, completion: 40, quota: (10 + 40 * 2) * 0.5, isStream: true });
    });

    test('Gemini array stream cut off: left unclosed, billed for the delivered text', async () => {
        /* 80 bytes */
        gm.handler = (req, res) => geminiCutStream(res, ['x'.repeat(40), 'y'.repeat(40)]);
        const a = await account(gw);
        const r = await gw.req('POST', `/v1beta/models/${M.gm}:streamGenerateContent?alt=json`, {
            key: a.key, body: { contents: [{ role: 'user', parts: [{ text: 'hello' }] }] },
        });
        assert.equal(r.status, 200, r.text);
        assert.ok(r.text.startsWith('[{') && r.text.includes('y'.repeat(40)), r.text);
        assert.throws(() => JSON.parse(r.text), 'a cut array is not closed');
        const row = await rowOf(gw, a.token, r.headers['x-request-id']);
        assert.equal(row.completion_tokens, 20, JSON.stringify(row));
        await expectCharged(gw, a, row.quota);
    });

    test('Gemini stream cut off without usage: billed for the delivered text (bytes / 4)', async () => {
        /* 120 bytes */
        gm.handler = (req, res) => geminiCutStream(res,
            ['x'.repeat(40), 'y'.repeat(40), 'z'.repeat(40)]);
        const a = await account(gw);
        const r = await gw.req('POST',
            `/v1beta/models/${M.gm}:streamGenerateContent?alt=sse`, {
                key: a.key, body: { contents: [{ role: 'user', parts: [{ text: 'hello' }] }] },
            });
        assert.equal(r.status, 200, r.text);
        assert.ok(r.text.includes('z'.repeat(40)), 'what was sent was delivered');
        const row = await rowOf(gw, a.token, r.headers['x-request-id']);
        assert.equal(row.completion_tokens, 30, JSON.stringify(row));
        assert.equal(row.quota, Math.round((row.prompt_tokens + 30 * 2) * 0.5), JSON.stringify(row));
        assert.ok(row.quota > 0);
        await expectCharged(gw, a, row.quota);
    });

    for (const [kind, model, units] of [
        ['Cohere (34): meta.billed_units.search_units', 'cohere', 3],
        ['Jina (38): usage.total_tokens', 'jina', 57],
        ['OpenAI-compatible (1): usage tokens', 'oaRerank', 41],
    ]) {
        test(`rerank via ${kind}`, async () => {
            const a = await account(gw);
            const r = await gw.req('POST', '/v1/rerank', {
                key: a.key,
                body: { model: M[model], query: 'q', documents: ['d0', 'd1', 'd2', 'd3'] },
            });
            assert.equal(r.status, 200, r.text);
            await charged(a, r, { prompt: units, completion: 0, quota: units * 100 });
        });
    }

    test('the rerank meta the client sees says what is billed', async () => {
        const handler = rr.handler;
        const cases = [
            /* refused for billing: billed by the estimate, not shown */
            [{ billed_units: { search_units: -1 } }, { total_tokens: 2 ** 41 }, {}, undefined],
            [{ billed_units: { search_units: -1 } }, { total_tokens: 7 },
                { tokens: { input_tokens: 7 } }, 7],
            /* search units, when given, are billed rather than input tokens */
            [{ billed_units: { search_units: 2, input_tokens: 100 } }, undefined,
                { billed_units: { search_units: 2 } }, 2],
        ];
        try {
            for (const [meta, usage, shown, units] of cases) {
                rr.handler = (req, res, rec) => sendJson(res, 200, {
                    id: `cohere-${hex(6)}`,
                    results: rec.json.documents.map((d, index) => ({
                        index, relevance_score: 1 / (index + 1) })),
                    meta, ...(usage ? { usage } : {}),
                });
                const a = await account(gw);
                const r = assertOk(await gw.req('POST', '/v1/rerank', {
                    key: a.key, body: { model: M.cohere, query: 'q', documents: ['d0', 'd1'] } }));
                assert.deepEqual(r.json.meta, shown, r.text);
                const row = await rowOf(gw, a.token, r.headers['x-request-id']);
                if (units !== undefined) {
                    assert.equal(row.prompt_tokens, units, JSON.stringify(row));
                } else {
                    /* the estimate of a few short strings */
                    assert.ok(row.prompt_tokens > 0 && row.prompt_tokens < 20,
                        JSON.stringify(row));
                }
                await expectCharged(gw, a, row.quota);
            }
        } finally {
            rr.handler = handler;
        }
    });

    test('rerank without usage: the query and documents by estimate, nothing as output, with or without documents back', async () => {
        const documents = ['a'.repeat(800), 'b'.repeat(800), 'c'.repeat(800), 'd'.repeat(800)];
        const rows = [];
        for (const ret of [false, true]) {
            const a = await account(gw);
            const r = await gw.req('POST', '/v1/rerank', {
                key: a.key,
                body: { model: M.bareRerank, query: 'which', documents, return_documents: ret },
            });
            assert.equal(r.status, 200, r.text);
            assert.equal(r.json.results.length, 4);
            assert.equal(r.json.results.every((x) => 'document' in x), ret, r.text.slice(0, 200));
            const row = await rowOf(gw, a.token, r.headers['x-request-id']);
            assert.equal(row.completion_tokens, 0, JSON.stringify(row));
            /* 3,200 bytes of documents, 4 to a token, at least */
            assert.ok(row.prompt_tokens >= 800 && row.prompt_tokens < 900, JSON.stringify(row));
            assert.equal(row.quota, row.prompt_tokens, JSON.stringify(row));
            await expectCharged(gw, a, row.quota);
            rows.push(row);
        }
        assert.equal(rows[0].quota, rows[1].quota, 'the echoed documents cost nothing');
    });

    test('a rerank reserves its query and documents only, no output: a key that covers the call is served', async () => {
        /* 3 search units x 100 = 300; the estimate of the prompt (the
           strings / 4 + 4: under 15 tokens) x 100 fits in 3,000, where
           1,024 output tokens more would not */
        const a = await account(gw, { remain: 3000 });
        const r = await gw.req('POST', '/v1/rerank', {
            key: a.key, body: { model: M.cohere, query: 'q', documents: ['d0', 'd1', 'd2', 'd3'] },
        });
        await charged(a, r, { prompt: 3, completion: 0, quota: 300 });
        /* a max_tokens in the body changes nothing */
        const b = await account(gw, { remain: 3000 });
        const r2 = await gw.req('POST', '/v1/rerank', {
            key: b.key, body: { model: M.cohere, query: 'q', documents: ['d0'], max_tokens: 1000 },
        });
        await charged(b, r2, { prompt: 3, completion: 0, quota: 300 });
        /* what the estimate does not cover is still refused */
        const c = await account(gw, { remain: 3000 });
        const r3 = await gw.req('POST', '/v1/rerank', {
            key: c.key, body: { model: M.cohere, query: 'q', documents: ['d'.repeat(200)] },
        });
        assertError(r3, 403, { code: 'pre_consume_token_quota_failed' });
    });

    test('a per-call price is not charged for a stream the upstream cut; a whole one is', async () => {
        const events = (n) => Array.from({ length: n }, (_, i) => `data: ${JSON.stringify({
            candidates: [{ content: { role: 'model', parts: [{ text: `part ${i} ` }] }, index: 0,
                ...(i === n - 1 ? { finishReason: 'STOP' } : {}) }],
        })}\r\n\r\n`).join('');
        const body = { contents: [{ role: 'user', parts: [{ text: 'hello' }] }] };
        const a = await account(gw);

        gm.handler = async (req, res) => {
            sseHead(res);
            res.write(events(3).split('\r\n\r\n').slice(0, 2).join('\r\n\r\n') + '\r\n\r\n');
            await sleep(100);
            res.destroy();
        };
        const cut = await gw.req('POST', `/v1beta/models/${M.gmCall}:streamGenerateContent?alt=sse`,
            { key: a.key, body });
        assert.equal(cut.status, 200, cut.text);
        const cutRow = await rowOf(gw, a.token, cut.headers['x-request-id']);
        assert.equal(cutRow.status, 502, JSON.stringify(cutRow));
        assert.equal(cutRow.quota, 0, JSON.stringify(cutRow));

        gm.handler = async (req, res) => {
            sseHead(res);
            res.end(events(3));
        };
        const whole = await gw.req('POST', `/v1beta/models/${M.gmCall}:streamGenerateContent?alt=sse`,
            { key: a.key, body });
        assert.equal(whole.status, 200, whole.text);
        const row = await rowOf(gw, a.token, whole.headers['x-request-id']);
        assert.equal(row.status, 200, JSON.stringify(row));
        assert.equal(row.quota, 0.002 * QUOTA_PER_USD, JSON.stringify(row));
        await expectCharged(gw, a, row.quota);
    });

    test('the group ratio multiplies token and per-call prices', async () => {
        oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
        const a = await account(gw, { group: 'vip' });
        const r1 = assertOk(await gw.chat(a.key, M.oa));
        const row1 = await rowOf(gw, a.token, r1.headers['x-request-id']);
        assert.equal(row1.quota, (123 + 45 * 3) * 2 * 0.25);
        const r2 = assertOk(await gw.chat(a.key, M.perCall));
        const row2 = await rowOf(gw, a.token, r2.headers['x-request-id']);
        assert.equal(row2.quota, Math.round(0.003 * QUOTA_PER_USD * 0.25));
        await expectCharged(gw, a, row1.quota + row2.quota);
    });

    test('a per-call price bills each call the same, whatever the tokens', async () => {
        const a = await account(gw, { remain: 100000 });
        oaUsage = { prompt_tokens: 5000, completion_tokens: 9000 };
        assertOk(await gw.chat(a.key, M.perCall));
        oaUsage = { prompt_tokens: 1, completion_tokens: 1 };
        assertOk(await gw.chat(a.key, M.perCall));
        assertOk(await gw.chat(a.key, M.perCall, { extra: { stream: true } }));
        const l = await waitLogs(gw, { token_id: a.token.id }, (items) => items.length >= 3);
        assert.deepEqual(l.items.map((i) => i.quota), [1500, 1500, 1500]);
        await expectCharged(gw, a, 4500);
        oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
    });

    test('upstream 500: the reservation comes back in full, error row with quota 0', async () => {
        const a = await account(gw, { remain: 50000, quota: 60000 });
        const r = await gw.chat(a.key, M.failing, { extra: { max_tokens: 2000 } });
        assert.equal(r.status, 500, r.text);
        const row = await rowOf(gw, a.token, r.headers['x-request-id']);
        assert.equal(row.type, 'error');
        assert.equal(row.quota, 0);
        assert.equal(Number(row.status), 500);
        await sleep(1200); /* a late charge would have been flushed by now */
        await expectCharged(gw, a, 0);
        /* and all of it can be reserved again */
        const again = await gw.chat(a.key, M.cheap, { extra: { max_tokens: 49000 } });
        assertOk(again, 'the whole remain is available again');
    });

    test('transport failure: nothing charged, error row with quota 0', async () => {
        const a = await account(gw, { remain: 50000, quota: 60000 });
        const r = await gw.chat(a.key, M.down, { extra: { max_tokens: 2000 } });
        assertError(r, 502, { code: 'do_request_failed' });
        const row = await rowOf(gw, a.token, r.headers['x-request-id']);
        assert.equal(row.type, 'error');
        assert.equal(row.quota, 0);
        await sleep(1200);
        await expectCharged(gw, a, 0);
    });

    test('403 pre_consume_token_quota_failed when the key cannot cover the estimate', async () => {
        const a = await account(gw, { remain: 100 });
        const before = oa.requests.length;
        const r = await gw.chat(a.key, M.cheap, { extra: { max_tokens: 1000 } });
        assertError(r, 403, { code: 'pre_consume_token_quota_failed' });
        /* no max_tokens: llmgw_reserve_tokens (1024) is reserved */
        const r2 = await gw.chat(a.key, M.cheap);
        assertError(r2, 403, { code: 'pre_consume_token_quota_failed' });
        assert.equal(oa.requests.length, before, 'the upstream was not called');
        /* a small max_tokens fits: the check is about this request's estimate */
        oaUsage = { prompt_tokens: 5, completion_tokens: 7 };
        const ok = await gw.chat(a.key, M.cheap, { extra: { max_tokens: 10 } });
        assertOk(ok);
        await expectCharged(gw, a, 12);
        oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
    });

    test('the reservation covers what the upstream is allowed: the larger limit, every choice, text documents', async () => {
        const a = await account(gw, { remain: 2000, quota: 1000000 });
        const before = oa.requests.length;
        /* max_completion_tokens 0 is "not given" to many upstreams, which
           then take max_tokens */
        let r = await gw.chat(a.key, M.cheap,
            { extra: { max_completion_tokens: 0, max_tokens: 50000 } });
        assertError(r, 403, { code: 'pre_consume_token_quota_failed' });
        /* eight answers of 500 each */
        r = await gw.chat(a.key, M.cheap, { extra: { max_tokens: 500, n: 8 } });
        assertError(r, 403, { code: 'pre_consume_token_quota_failed' });
        /* a long text document is prompt text */
        r = await gw.req('POST', '/v1/chat/completions', { key: a.key, body: {
            model: M.cheap, max_tokens: 10, messages: [{ role: 'user', content: [
                { type: 'text', text: 'summarise' },
                { type: 'file', file: { filename: 'a.txt', file_data: 'data:text/plain;base64,AAAA' } },
            ] }, { role: 'user', content: 'lorem ipsum '.repeat(1000) }] } });
        assertError(r, 403, { code: 'pre_consume_token_quota_failed' });
        /* a member only a case-blind upstream would read as "model" */
        r = await gw.req('POST', '/v1/chat/completions', { key: a.key, body: {
            model: M.cheap, Model: 'gpt-4-32k', max_tokens: 1,
            messages: [{ role: 'user', content: 'hi' }] } });
        assertError(r, 400, { code: 'invalid_request', message: 'member "Model" differs' });
        /* nor inside the objects the gateway reads or rewrites: a case-blind
           upstream would take "Include_Usage": false over the include_usage
           the gateway adds, send no usage and be billed by the estimate */
        r = await gw.chat(a.key, M.cheap, { extra: {
            stream: true, max_tokens: 1, stream_options: { Include_Usage: false } } });
        assertError(r, 400, {
            code: 'invalid_request', message: 'member "stream_options.Include_Usage" differs' });
        assert.equal(oa.requests.length, before, 'the upstream was not called');
        const gmBefore = gm.requests.length;
        r = await gw.req('POST', `/v1beta/models/${M.gm}:generateContent`, { key: a.key, body: {
            contents: [{ role: 'user', parts: [{ text: 'hi' }] }],
            generationConfig: { maxOutputTokens: 1, MaxOutputTokens: 100000 } } });
        assertError(r, 400, {
            code: 'invalid_request', message: 'member "generationConfig.MaxOutputTokens" differs' });
        assert.equal(gm.requests.length, gmBefore, 'the Gemini upstream was not called');
        /* the rerank options the gateway reads: a case-blind upstream would
           take "TOP_N" as the top_n the gateway did not check */
        const rrBefore = rr.requests.length;
        for (const member of ['TOP_N', 'Return_Documents']) {
            r = await gw.req('POST', '/v1/rerank', { key: a.key, body: {
                model: M.cohere, query: 'q', documents: ['a', 'b'], [member]: 1 } });
            assertError(r, 400, { code: 'invalid_request', message: `member "${member}" differs` });
        }
        assert.equal(rr.requests.length, rrBefore, 'the rerank upstream was not called');
        await sleep(1200);
        await expectCharged(gw, a, 0);

        /* no limit, converted for Anthropic: sent max_tokens 4096, so that
           much is reserved (4096 x 4 x 1.5 = 24576), not 1024's 6144 */
        const b = await account(gw, { remain: 10000, quota: 1000000 });
        const anBefore = an.requests.length;
        assertError(await gw.chat(b.key, M.an), 403, { code: 'pre_consume_token_quota_failed' });
        assert.equal(an.requests.length, anBefore);
    });

    test('403 insufficient_user_quota when the user cannot cover the estimate', async () => {
        const a = await account(gw, { quota: 100 });
        const before = oa.requests.length;
        const r = await gw.chat(a.key, M.cheap, { extra: { max_tokens: 1000 } });
        assertError(r, 403, { code: 'insufficient_user_quota' });
        assert.equal(oa.requests.length, before, 'the upstream was not called');
        await sleep(1200);
        await expectCharged(gw, a, 0);
    });

    test('a key charged down to 0 is refused with 401 invalid_token', async () => {
        oaUsage = { prompt_tokens: 10, completion_tokens: 20 };
        try {
            const a = await account(gw, { remain: 60 });
            /* each call reserves about 15 and costs 30 */
            for (let i = 0; i < 2; i++) {
                assertOk(await gw.chat(a.key, M.cheap, { extra: { max_tokens: 1 } }), `call ${i}`);
            }
            const b = await expectCharged(gw, a, 60);
            assert.equal(b.remain, 0);
            const r = await gw.chat(a.key, M.cheap, { extra: { max_tokens: 1 } });
            assertError(r, 401, { code: 'invalid_token' });
            const l = await waitLogs(gw, { token_id: a.token.id }, () => true);
            assert.equal(l.items.filter((i) => i.type === 'consume').length, 2);
        } finally {
            oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
        }
    });

    test('400 model_price_error for a model without a price; served once priced', async () => {
        const a = await account(gw, { remain: 100000 });
        const before = oa.requests.length;
        const r = await gw.chat(a.key, M.noPrice);
        assertError(r, 400, { code: 'model_price_error' });
        assert.equal(oa.requests.length, before, 'the upstream was not called');
        const since = Date.now();
        const p = await gw.admin('PUT', '/api/pricing', {
            [M.noPrice]: { ratio: 1, completion_ratio: 1 },
        });
        assert.equal(p.status, 200, p.text);
        await settle(since);
        oaUsage = { prompt_tokens: 3, completion_tokens: 4 };
        assertOk(await gw.chat(a.key, M.noPrice));
        await expectCharged(gw, a, 7);
        oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
    });

    test('concurrent requests on one key: each charged once, balances exact', async () => {
        oaUsage = { prompt_tokens: 123, completion_tokens: 45 };
        const a = await account(gw, { remain: 1000000 });
        const rs = await times(16, (i) => (i % 2
            ? gw.chat(a.key, M.oa)
            : gw.chat(a.key, M.oa, { extra: { stream: true } })));
        rs.forEach((r) => assertOk(r));
        const l = await waitLogs(gw, { token_id: a.token.id }, (items) => items.length >= 16);
        assert.equal(l.total, 16);
        assert.deepEqual(new Set(l.items.map((i) => i.request_id)),
            new Set(rs.map((r) => r.headers['x-request-id'])));
        assert.ok(l.items.every((i) => i.quota === 516), JSON.stringify(l.items));
        await expectCharged(gw, a, 16 * 516);
    });

    test('ledger and balances agree to the unit', async () => {
        await sleep(1500);
        await assertLedgerAgrees(db);
    });
});

/* ------------------------------------------------------------------ */
/* a ledger that loses nothing and charges nothing twice              */
/* ------------------------------------------------------------------ */

describe('billing: the ledger survives failures', { timeout: 300000 }, () => {
    let mock;
    const USAGE = { prompt_tokens: 10, completion_tokens: 20 };
    const PRICE = { ratio: 1, completion_ratio: 2 }; /* 50 a call */
    const COST = 50;

    before(async () => {
        mock = await startMock((req, res, rec) => {
            if (rec.json && rec.json.stream) {
                return openaiStream(res, ['x', 'y'], { model: rec.json.model, usage: USAGE });
            }
            return sendJson(res, 200, openaiChat({ model: rec.json.model, usage: USAGE }));
        });
    });

    after(async () => {
        await mock?.close();
    });

    /* A database + gateway + one priced model + a limited key. */
    async function setup(gwOpts = {}) {
        const db = await createDb();
        const gw = await startGateway({ db, ...gwOpts });
        const model = uniq('gpt-ledger');
        const r = await gw.admin('PUT', '/api/pricing', { [model]: PRICE });
        assert.equal(r.status, 200, r.text);
        await makeChannel(gw, { base_url: mock.url, models: [model] });
        const a = await account(gw, { remain: 1000000, quota: 2000000 });
        await settle();
        return { db, gw, model, a };
    }

    async function burst(gw, key, model, n) {
        const rs = await times(n, (i) => gw.chat(key, model,
            { extra: i % 3 === 2 ? { stream: true } : {} }));
        rs.forEach((r) => assertOk(r));
        return rs.map((r) => r.headers['x-request-id']);
    }

    /* Every id exactly once in the ledger, balances equal to its sum. */
    async function expectWritten(db, ids, a, { ms = 10000 } = {}) {
        await eventually(async () => {
            const rows = await dbRows(db);
            const mine = rows.filter((x) => ids.includes(x.request_id));
            assert.equal(mine.length, ids.length,
                `rows written: ${mine.length} of ${ids.length}`);
        }, { ms, intervalMs: 250 });
        const rows = (await dbRows(db)).filter((x) => ids.includes(x.request_id));
        for (const id of ids) {
            assert.equal(rows.filter((x) => x.request_id === id).length, 1, `once: ${id}`);
        }
        assert.ok(rows.every((x) => x.type === 'consume' && Number(x.quota) === COST),
            JSON.stringify(rows));
        const b = await dbBalance(db, a.token, a.user);
        const used = ids.length * COST;
        assert.deepEqual(b, {
            remain: a.remain0 - used, tokenUsed: used,
            userQuota: a.quota0 - used, userUsed: used,
        });
        await assertLedgerAgrees(db);
    }

    test('failed flushes keep the rows; once the table is back each is written once', async () => {
        const { db, gw, model, a } = await setup();
        try {
            await psql(db.conninfo, 'ALTER TABLE logs RENAME TO logs_x');
            let ids;
            try {
                ids = await burst(gw, a.key, model, 9);
                /* several flush intervals fail */
                await sleep(2500);
                const during = await dbRows(db, 'logs_x');
                assert.equal(during.filter((x) => ids.includes(x.request_id)).length, 0,
                    'nothing could be written while the table was away');
                const b = await dbBalance(db, a.token, a.user);
                assert.equal(b.tokenUsed, 0, 'no balance moved without its row');
                /* the key's spending is still held against it meanwhile */
                const more = await burst(gw, a.key, model, 3);
                ids = ids.concat(more);
                await sleep(1200);
            } finally {
                await psql(db.conninfo, 'ALTER TABLE logs_x RENAME TO logs');
            }
            await expectWritten(db, ids, a);
            /* and through the API as well */
            await expectCharged(gw, a, ids.length * COST);
            /* nothing else arrives later */
            await sleep(2500);
            await expectWritten(db, ids, a);
        } finally {
            await stopAll(gw);
            await dropDb(db);
        }
    });

    test('kill -9 of the workers right after the requests loses no queued row', async () => {
        const { db, gw, model, a } = await setup();
        try {
            /*
             * Writes are blocked so that every row is still queued in shared
             * memory when the workers die (with the 1 s flush interval a row
             * could otherwise be written before the kill).  The kill comes as
             * soon as the last answer is complete: a request whose answer the
             * client has must already have its row queued.
             */
            let ids, pids;
            await psql(db.conninfo, 'ALTER TABLE logs RENAME TO logs_x');
            try {
                ids = await burst(gw, a.key, model, 12);
                pids = gw.workerPids();
                assert.ok(pids.length >= 1);
                for (const p of pids) {
                    process.kill(p, 'SIGKILL');
                }
            } finally {
                await psql(db.conninfo, 'ALTER TABLE logs_x RENAME TO logs');
            }
            /* nginx respawns them and they keep serving */
            await eventually(() => {
                const now = gw.workerPids();
                assert.ok(now.length === pids.length && now.every((p) => !pids.includes(p)),
                    `workers respawned: ${pids} -> ${now}`);
            }, { ms: 5000 });
            await expectWritten(db, ids, a);
            const more = await burst(gw, a.key, model, 3);
            await expectWritten(db, ids.concat(more), a);
        } finally {
            await stopAfterKill(gw);
            await dropDb(db);
        }
    });

    test('a worker killed while its batch is being written: the batch is sent again, charged once', async () => {
        const { db, gw, model, a } = await setup();
        try {
            /* every ledger write sleeps while the flag row exists */
            await psql(db.conninfo, `
                CREATE TABLE slow_flush (x int);
                INSERT INTO slow_flush VALUES (1);
                CREATE FUNCTION slow_flush_t() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF EXISTS (SELECT 1 FROM slow_flush) THEN PERFORM pg_sleep(3); END IF;
                    RETURN NULL;
                END $$;
                CREATE TRIGGER slow_flush_t AFTER INSERT ON logs
                    FOR EACH STATEMENT EXECUTE FUNCTION slow_flush_t();`);
            const ids = await burst(gw, a.key, model, 6);
            /* wait until a flush carrying rows is inside PostgreSQL */
            await eventually(async () => {
                const n = await psql(db.conninfo,
                    `select count(*) from pg_stat_activity where datname = current_database()
                        and wait_event = 'PgSleep' and pid <> pg_backend_pid()`);
                assert.ok(Number(n) >= 1, 'a ledger write is in progress');
            }, { ms: 5000, intervalMs: 50 });
            const pids = gw.workerPids();
            for (const p of pids) {
                process.kill(p, 'SIGKILL');
            }
            await psql(db.conninfo, 'DELETE FROM slow_flush');
            await eventually(() => {
                const now = gw.workerPids();
                assert.ok(now.length === pids.length && now.every((p) => !pids.includes(p)));
            }, { ms: 5000 });
            await expectWritten(db, ids, a, { ms: 15000 });
            await expectCharged(gw, a, ids.length * COST);
        } finally {
            await stopAfterKill(gw);
            await dropDb(db);
        }
    });

    test('nginx -s reload right after the requests loses no row', async () => {
        const { db, gw, model, a } = await setup({ http: 'llmgw_flush_interval 3s;' });
        try {
            const ids = await burst(gw, a.key, model, 12);
            await gw.reload();
            await expectWritten(db, ids, a, { ms: 12000 });
            const more = await burst(gw, a.key, model, 3);
            await expectWritten(db, ids.concat(more), a, { ms: 12000 });
        } finally {
            await stopAll(gw);
            await dropDb(db);
        }
    });

    test('a graceful stop right after the requests writes every row before exiting', async () => {
        /* a long interval: only the exit flush can write these rows */
        const { db, gw, model, a } = await setup({ http: 'llmgw_flush_interval 60s;' });
        try {
            const ids = await burst(gw, a.key, model, 12);
            const t0 = Date.now();
            const ex = await gw.stop();
            assert.ok(ex, 'nginx exited');
            assert.equal(gw.killed, false, 'stopped on its own within 5 s');
            assert.ok(Date.now() - t0 < 5000);
            /* no waiting: the rows must be there when nginx is gone */
            await expectWritten(db, ids, a, { ms: 0 });
        } finally {
            await stopAll(gw);
            await dropDb(db);
        }
    });
});
