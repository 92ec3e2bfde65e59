// /metrics: Prometheus text with request counts by endpoint, model and
// status (summed over workers), upstream latency histogram, retries and
// rate-limit refusals.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertOk, createDb, dropDb, eventually, httpRequest, makeChannel, makeFree,
    makeUserKey, settle, startGateway, stopAll, times, uniq,
} from '../lib/harness.mjs';
import { openaiChat, openaiError, sendJson, startMock } from '../lib/mock.mjs';

const SPREAD = { listen: 'reuseport', server: 'add_header X-Worker $pid always;' };
const SLOW_MS = 300;

/* Prometheus text -> [{name, labels, value}] */
function parseMetrics(text) {
    const out = [];
    for (const line of text.split('\n')) {
        if (!line || line.startsWith('#')) {
            continue;
        }
        const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
        assert.ok(m, `not a Prometheus sample line: ${line}`);
        const labels = {};
        if (m[3]) {
            for (const l of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) {
                labels[l[1]] = l[2].replace(/\\(.)/g, (x, c) => (c === 'n' ? '\n' : c));
            }
        }
        const v = m[4] === '+Inf' ? Infinity : Number(m[4]);
        out.push({ name: m[1], labels, value: v });
    }
    return out;
}

/* Sum of the samples of `name` whose labels include `want`. */
function sum(samples, name, want = {}) {
    return samples.filter((s) => s.name === name &&
        Object.entries(want).every(([k, v]) => s.labels[k] === v))
        .reduce((a, s) => a + s.value, 0);
}

describe('metrics', { timeout: 180000 }, () => {
    let db, gw, ok, slow, failer, key, rlKey;
    const M = uniq('gpt-met');
    const BAD = uniq('gpt-met-bad');
    const SLOW = uniq('gpt-met-slow');
    const RETRY = uniq('gpt-met-retry');

    async function scrape() {
        const r = await httpRequest(`${gw.url}/metrics`, {
            headers: { Authorization: `Bearer ${gw.rootToken}` },
        });
        assert.equal(r.status, 200, r.text);
        assert.match(r.headers['content-type'], /^text\/plain/);
        return parseMetrics(r.text);
    }

    before(async () => {
        db = await createDb();
        ok = await startMock((req, res, rec) => sendJson(res, 200, openaiChat({ model: rec.json.model })));
        slow = await startMock(async (req, res, rec) => {
            await new Promise((s) => setTimeout(s, SLOW_MS));
            sendJson(res, 200, openaiChat({ model: rec.json.model }));
        });
        failer = await startMock((req, res) => openaiError(res, 500, 'boom', { type: 'server_error' }));
        gw = await startGateway({ db, ...SPREAD });
        let r = await gw.admin('PUT', '/api/group', { default: 1, rl: 1 });
        assert.equal(r.status, 200, r.text);
        r = await gw.admin('PUT', '/api/rate_limit', {
            default: { duration_minutes: 1, total: 100000, success: 0 },
            groups: { rl: { duration_minutes: 1, total: 1, success: 0 } },
        });
        assert.equal(r.status, 200, r.text);
        await makeChannel(gw, { base_url: ok.url, models: [M], groups: ['default', 'rl'] });
        await makeChannel(gw, { base_url: ok.url, models: [BAD] });
        await makeChannel(gw, { base_url: slow.url, models: [SLOW] });
        await makeChannel(gw, { base_url: failer.url, models: [RETRY], priority: 10 });
        await makeChannel(gw, { base_url: ok.url, models: [RETRY], priority: 0 });
        ({ key } = await makeUserKey(gw));
        ({ key: rlKey } = await makeUserKey(gw, { group: 'rl' }));
        await settle();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all([ok, slow, failer].map((m) => m?.close()));
            await dropDb(db);
        }
    });

    test('requests are counted by endpoint, model and status over all workers', async () => {
        const rs = await times(16, () => gw.chat(key, M));
        rs.forEach((r) => assertOk(r));
        assert.equal(new Set(rs.map((r) => r.headers['x-worker'])).size, 2,
            'both workers served');
        await eventually(async () => {
            const s = await scrape();
            assert.equal(sum(s, 'llmgw_requests_total',
                { endpoint: 'chat', model: M, status: '200' }), 16);
        }, { ms: 2000 });
    });

    test('a model label is cut between characters; a model nobody priced gets no label of its own', async () => {
        /* a Gemini model comes from the URL, decoded: %FF is a raw byte.
           Unpriced, it is counted under model="": a client cannot make a
           series per name it sends (they are capped) */
        const bad = `${uniq('bad')}%FFx`;
        const r = await httpRequest(`${gw.url}/v1beta/models/${bad}:generateContent`, {
            method: 'POST', headers: { 'x-goog-api-key': key, 'Content-Type': 'application/json' },
            body: JSON.stringify({ contents: [] }),
        });
        assert.equal(r.status, 503, r.text);
        const junk = uniq('junk');
        assert.equal((await gw.chat(key, junk)).status, 503);
        /* priced, 200 two-byte characters: cut between characters, at
           128 bytes */
        const long = `${uniq('l')}${'é'.repeat(200)}`;
        const t0 = Date.now();
        await makeFree(gw, [long]);
        await settle(t0);
        assert.equal((await gw.chat(key, long)).status, 503);
        await eventually(async () => {
            const raw = await httpRequest(`${gw.url}/metrics`);
            assert.ok(!raw.text.includes('\uFFFD'), 'every label is valid UTF-8');
            const s = parseMetrics(raw.text);
            const models = s.filter((x) => x.name === 'llmgw_requests_total')
                .map((x) => x.labels.model);
            assert.ok(!models.some((m) => m.startsWith(bad.slice(0, 8)) || m === junk), `${models}`);
            assert.ok(sum(s, 'llmgw_requests_total', { endpoint: 'gemini', model: '', status: '503' }) >= 1);
            const cut = models.find((m) => m.startsWith(long.slice(0, 10)));
            assert.ok(cut && Buffer.byteLength(cut) <= 128 && Buffer.byteLength(cut) >= 127,
                `cut at 128 bytes between characters: ${cut}`);
        }, { ms: 2000 });
    });

    test('model names whose CRC-32 collide keep one series each', async () => {
        /* pairs with equal CRC-32 (the series tree's key), among others */
        const pairs = [['crc-8facb8', 'crc-1699080'], ['crc-8facb9', 'crc-1699081'],
            ['crc-8facb0', 'crc-1699088'], ['crc-8facb1', 'crc-1699089']];
        const fill = Array.from({ length: 12 * pairs.length }, () => uniq('crc-fill'));
        const t0 = Date.now();
        await makeFree(gw, [...pairs.flat(), ...fill]);
        await settle(t0);
        const ROUNDS = 3;
        for (let round = 0; round < ROUNDS; round++) {
            for (const [a, b] of pairs) {
                assert.equal((await gw.chat(key, a)).status, 503);
                for (let i = 0; i < (round === 0 ? 12 : 0); i++) {
                    assert.equal((await gw.chat(key, fill.pop())).status, 503);
                }
                assert.equal((await gw.chat(key, b)).status, 503);
            }
        }
        await eventually(async () => {
            const s = (await scrape()).filter((x) => x.name === 'llmgw_requests_total');
            for (const name of pairs.flat()) {
                const lines = s.filter((x) => x.labels.model === name);
                assert.equal(lines.length, 1, `one series for ${name}: ${JSON.stringify(lines)}`);
                assert.equal(lines[0].value, ROUNDS, name);
            }
        }, { ms: 2000 });
    });

    test('an upstream 400 is counted under status 400', async () => {
        ok.handler = (req, res) => openaiError(res, 400, 'nope');
        const r = await gw.chat(key, BAD);
        ok.handler = (req, res, rec) => sendJson(res, 200, openaiChat({ model: rec.json.model }));
        assert.equal(r.status, 400, r.text);
        await eventually(async () => {
            const s = await scrape();
            assert.equal(sum(s, 'llmgw_requests_total',
                { endpoint: 'chat', model: BAD, status: '400' }), 1);
            assert.equal(sum(s, 'llmgw_requests_total',
                { endpoint: 'chat', model: BAD, status: '200' }), 0);
        }, { ms: 2000 });
    });

    test('upstream latency lands in the right histogram buckets', async () => {
        const before = await scrape();
        const name = 'llmgw_upstream_latency_seconds';
        assert.ok(before.some((s) => s.name === `${name}_bucket`), 'histogram present');
        assertOk(await gw.chat(key, SLOW));
        let after;
        await eventually(async () => {
            after = await scrape();
            assert.equal(sum(after, `${name}_count`) - sum(before, `${name}_count`), 1);
        }, { ms: 2000 });
        const les = [...new Set(after.filter((s) => s.name === `${name}_bucket`)
            .map((s) => s.labels.le))];
        assert.ok(les.includes('+Inf'), `buckets: ${les}`);
        for (const le of les) {
            const d = sum(after, `${name}_bucket`, { le }) - sum(before, `${name}_bucket`, { le });
            const bound = le === '+Inf' ? Infinity : Number(le);
            if (bound < SLOW_MS / 1000) {
                assert.equal(d, 0, `a ${SLOW_MS} ms call counted in le=${le}`);
            } else if (bound >= 1) {
                assert.equal(d, 1, `a ${SLOW_MS} ms call missing from le=${le}`);
            }
        }
        const dsum = sum(after, `${name}_sum`) - sum(before, `${name}_sum`);
        /* millisecond clock, and the sums subtract as binary fractions */
        assert.ok(dsum >= SLOW_MS / 1000 - 0.0015 && dsum < 2, `_sum grew by ${dsum}`);
    });

    test('each retry is counted', async () => {
        const before = sum(await scrape(), 'llmgw_retries_total');
        assertOk(await gw.chat(key, RETRY));
        await eventually(async () => {
            assert.equal(sum(await scrape(), 'llmgw_retries_total') - before, 1);
        }, { ms: 2000 });
    });

    test('rate-limited requests are counted', async () => {
        const before = sum(await scrape(), 'llmgw_rate_limited_total');
        const rs = [];
        for (let i = 0; i < 3; i++) {
            rs.push(await gw.chat(rlKey, M));
        }
        assert.deepEqual(rs.map((r) => r.status), [200, 429, 429]);
        await eventually(async () => {
            assert.equal(sum(await scrape(), 'llmgw_rate_limited_total') - before, 2);
        }, { ms: 2000 });
    });
});
