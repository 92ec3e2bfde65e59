// Request-rate limits: exact across workers, failed requests counted, a
// separate success limit, per-group limits, Retry-After.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, eventually, makeChannel, makeKey, makeUserKey, settle,
    startGateway, tearDown, times, uniq, waitLogs,
} from '../lib/harness.mjs';
import { echo, startMock } from '../lib/mock.mjs';

/* reuseport: the kernel spreads connections over both workers. */
const SPREAD = { listen: 'reuseport', server: 'add_header X-Worker $pid always;' };

describe('rate limits', { timeout: 180000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-rl'), PRICED = uniq('gpt-rl-priced');
    const upstreamCalls = () => mock.requests.length;
    const badJson = (key) => gw.req('POST', '/v1/chat/completions', {
        key, headers: { 'Content-Type': 'application/json' }, body: '{"model":',
    });

    /* The suite's limits, the totals of "two" and "chg" as given; returns
       once they apply on every worker. */
    async function putLimits({ two = 2, chg = 10 } = {}) {
        const t0 = Date.now();
        const r = await gw.admin('PUT', '/api/rate_limit', {
            default: { duration_minutes: 1, total: 5, success: 0 },
            groups: {
                two: { duration_minutes: 1, total: two, success: 0 },
                succ: { duration_minutes: 1, total: 100, success: 2 },
                chg: { duration_minutes: 1, total: chg, success: 0 },
            },
        });
        assert.equal(r.status, 200, r.text);
        await settle(t0);
    }

    before(async () => {
        db = await createDb();
        mock = await startMock();
        gw = await startGateway({ db, ...SPREAD });
        let r = await gw.admin('PUT', '/api/group', { default: 1, two: 1, succ: 1, chg: 1 });
        assert.equal(r.status, 200, r.text);
        /* PRICED costs 30 a call: the mock reports 10 + 20 tokens */
        r = await gw.admin('PUT', '/api/pricing', { [PRICED]: { ratio: 1, completion_ratio: 1 } });
        assert.equal(r.status, 200, r.text);
        await makeChannel(gw, { base_url: mock.url, models: [M, PRICED], groups: ['default', 'two', 'succ', 'chg'] });
        await putLimits();
    });

    after(() => tearDown(db, [gw], [mock]));

    function assertLimited(r, re) {
        const e = assertError(r, 429, { code: 'rate_limit_exceeded', message: re });
        const ra = r.headers['retry-after'];
        assert.match(String(ra), /^\d+$/, `Retry-After is whole seconds: ${ra}`);
        assert.ok(Number(ra) >= 1 && Number(ra) <= 60, `Retry-After ${ra} within the 1 min window`);
        return e;
    }

    test('20 concurrent requests, limit 5 per minute: exactly 5 pass, on both workers', async () => {
        const { key } = await makeUserKey(gw);
        const before = upstreamCalls();
        const rs = await times(20, () => gw.chat(key, M));
        const passed = rs.filter((r) => r.status !== 429);
        assert.equal(passed.length, 5, `statuses: ${rs.map((r) => r.status).join(',')}`);
        passed.forEach((r) => assertOk(r));
        rs.filter((r) => r.status === 429)
            .forEach((r) => assertLimited(r, /at most 5 requests in 1 minute\b/));
        assert.equal(upstreamCalls() - before, 5, 'limited requests reach no upstream');
        const workers = new Set(rs.map((r) => r.headers['x-worker']));
        assert.equal(workers.size, 2, `served by workers ${[...workers]}`);
    });

    test('failed requests count toward the total limit', async () => {
        const { key } = await makeUserKey(gw);
        for (let i = 0; i < 5; i++) {
            assertError(await badJson(key), 400, { code: 'invalid_json' });
        }
        assertLimited(await gw.chat(key, M), /at most 5 requests in 1 minute\b/);
    });

    test('model listings count toward the total limit, and are limited too', async () => {
        const { key } = await makeUserKey(gw, { group: 'two' });
        assertOk(await gw.req('GET', '/v1/models', { key }));
        assertOk(await gw.chat(key, M));
        assertLimited(await gw.chat(key, M), /at most 2 requests in 1 minute\b/);
        assertLimited(await gw.req('GET', '/v1/models', { key }),
            /at most 2 requests in 1 minute\b/);
    });

    test('a key spent within the key cache is refused before the limit: its 401s do not count', async () => {
        /* group "two": 2 requests a minute for all the user's keys */
        const { user, key } = await makeUserKey(gw, { group: 'two' },
            { unlimited_quota: false, remain_quota: 30 });
        const other = (await makeKey(gw, user.id)).key;
        assertOk(await gw.chat(key, PRICED, { extra: { max_tokens: 5 } }), 'spends the key');
        const before = upstreamCalls();
        for (let i = 0; i < 3; i++) {
            assertError(await gw.chat(key, PRICED, { extra: { max_tokens: 5 } }), 401,
                { code: 'invalid_token', message: /^Invalid token/ });
        }
        assert.equal(upstreamCalls(), before);
        /* the user's other key has the second request of the window */
        assertOk(await gw.chat(other, M), 'the 401s took no slot');
        assertLimited(await gw.chat(other, M), /at most 2 requests in 1 minute\b/);
    });

    test('keys of other users keep their own budget', async () => {
        const a = await makeUserKey(gw);
        const b = await makeUserKey(gw);
        const rs = await times(6, () => gw.chat(a.key, M));
        assert.equal(rs.filter((r) => r.status === 429).length, 1);
        assertOk(await gw.chat(b.key, M), 'another user is not limited');
    });

    test('a group limit replaces the default one', async () => {
        const { key } = await makeUserKey(gw, { group: 'two' });
        assertOk(await gw.chat(key, M));
        assertOk(await gw.chat(key, M));
        assertLimited(await gw.chat(key, M), /at most 2 requests in 1 minute\b/);
    });

    test('the success limit counts only successful requests', async () => {
        const { key } = await makeUserKey(gw, { group: 'succ' });
        for (let i = 0; i < 3; i++) {
            assertError(await badJson(key), 400, { code: 'invalid_json' });
        }
        const before = upstreamCalls();
        assertOk(await gw.chat(key, M));
        assertOk(await gw.chat(key, M));
        assertLimited(await gw.chat(key, M),
            /at most 2 successful requests in 1 minute \(a request under way holds a slot until it ends\)/);
        assert.equal(upstreamCalls() - before, 2);
    });

    test('requests still running hold their success slots: 20 at once, success limit 2', async () => {
        const { key } = await makeUserKey(gw, { group: 'succ' });
        const plain = mock.handler;
        /* all 20 are admitted before any has succeeded */
        mock.handler = async (req, res, rec) => {
            await new Promise((r) => setTimeout(r, 300));
            return plain(req, res, rec);
        };
        try {
            const before = upstreamCalls();
            const rs = await times(20, () => gw.chat(key, M));
            assert.equal(rs.filter((r) => r.status === 200).length, 2,
                `statuses: ${rs.map((r) => r.status).join(',')}`);
            rs.filter((r) => r.status !== 200).forEach((r) =>
                assertLimited(r, /at most 2 successful requests in 1 minute\b/));
            assert.equal(upstreamCalls() - before, 2);
        } finally {
            mock.handler = plain;
        }
    });

    test('a changed limit counts what was used before it', async () => {
        const { key } = await makeUserKey(gw, { group: 'chg' });
        for (let i = 0; i < 4; i++) {
            assertOk(await gw.chat(key, M));
        }
        /* lowered below what was used: refused */
        await putLimits({ chg: 3 });
        assertLimited(await gw.chat(key, M), /at most 3 requests in 1 minute\b/);

        /* another user spends the 3, then the limit is raised to 5: two more */
        const other = (await makeUserKey(gw, { group: 'chg' })).key;
        for (let i = 0; i < 3; i++) {
            assertOk(await gw.chat(other, M));
        }
        assertLimited(await gw.chat(other, M), /at most 3 requests in 1 minute\b/);
        await putLimits({ chg: 5 });
        assertOk(await gw.chat(other, M));
        assertOk(await gw.chat(other, M));
        assertLimited(await gw.chat(other, M), /at most 5 requests in 1 minute\b/);

        /* the first user's 4 still count after the limit went down and up
           again: one more */
        assertOk(await gw.chat(key, M));
        assertLimited(await gw.chat(key, M), /at most 5 requests in 1 minute\b/);
    });

    test('keys of one user in two groups: each group keeps its own log', async () => {
        /* the user's key under the default limit (5), another under "two" (2) */
        const { user, key } = await makeUserKey(gw);
        const other = (await makeKey(gw, user.id, { group: 'two' })).key;
        for (let i = 0; i < 5; i++) {
            assertOk(await gw.chat(key, M));
        }
        assertLimited(await gw.chat(key, M), /at most 5 requests in 1 minute\b/);
        /* a request under the other group neither resets nor shrinks it */
        assertOk(await gw.chat(other, M));
        assertOk(await gw.chat(other, M));
        assertLimited(await gw.chat(other, M), /at most 2 requests in 1 minute\b/);
        assertLimited(await gw.chat(key, M), /at most 5 requests in 1 minute\b/);
    });

    test('a changed limit applies within 1 s', async () => {
        const { key } = await makeUserKey(gw, { group: 'two' });
        await putLimits({ two: 3 });
        const rs = await times(8, () => gw.chat(key, M));
        assert.equal(rs.filter((x) => x.status === 200).length, 3,
            `statuses: ${rs.map((x) => x.status).join(',')}`);
        const limited = rs.filter((x) => x.status === 429);
        assert.equal(limited.length, 5);
        assertLimited(limited[0], /at most 3 requests in 1 minute\b/);
    });
});

describe('rate limit windows that a changed limit lengthens', { timeout: 60000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-rlwin');

    async function putWindow(minutes) {
        const t0 = Date.now();
        const r = await gw.admin('PUT', '/api/rate_limit', {
            default: null, groups: { win: { duration_minutes: minutes, total: 3, success: 0 } },
        });
        assert.equal(r.status, 200, r.text);
        await settle(t0);
    }

    before(async () => {
        db = await createDb();
        mock = await startMock();
        /* a clock moved on instead of minutes waited */
        gw = await startGateway({ db, clock: true });
        const r = await gw.admin('PUT', '/api/group', { default: 1, win: 1 });
        assert.equal(r.status, 200, r.text);
        await makeChannel(gw, { base_url: mock.url, models: [M], groups: ['default', 'win'] });
        await putWindow(1);
    });

    after(() => tearDown(db, [gw], [mock]));

    test('requests made under the old window count in the new one, also after the old one passed', async () => {
        const { key } = await makeUserKey(gw, { group: 'win' });
        for (let i = 0; i < 3; i++) {
            assertOk(await gw.chat(key, M));
        }
        assertError(await gw.chat(key, M), 429, { code: 'rate_limit_exceeded' });

        /* 62 s later, past the 1-minute window, the window becomes 10 minutes */
        gw.clockForward(62000);
        await putWindow(10);
        const r = await gw.chat(key, M);
        assertError(r, 429, { code: 'rate_limit_exceeded', message: /at most 3 requests in 10 minutes\b/ });
        const ra = Number(r.headers['retry-after']);
        assert.ok(ra > 500 && ra <= 538, `Retry-After ${ra}: the oldest of the 3 leaves 10 minutes after it was made`);

        /* and they leave it when that time has passed */
        gw.clockForward(ra * 1000);
        assertOk(await gw.chat(key, M));
    });
});

describe('rate limit logs in a full zone', { timeout: 180000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-rlzone');

    before(async () => {
        db = await createDb();
        mock = await startMock();
        /* 64k: a few dozen logs of 400 entries (3.2 KB each) fill it */
        gw = await startGateway({ db, http: 'llmgw_zone_size 64k;' });
        const r = await gw.admin('PUT', '/api/rate_limit', {
            default: { duration_minutes: 60, total: 400, success: 0 },
        });
        assert.equal(r.status, 200, r.text);
        await makeChannel(gw, { base_url: mock.url, models: [M] });
        await gw.admin('PUT', '/api/pricing', { [M]: { ratio: 1, completion_ratio: 1 } });
        await settle();
    });

    after(() => tearDown(db, [gw], [mock]));

    test('give way to ledger rows: every request served is recorded and charged', async () => {
        const users = [];
        for (let i = 0; i < 30; i++) {
            users.push(await makeUserKey(gw, {}, { unlimited_quota: false, remain_quota: 100000 }));
        }
        for (let round = 0; round < 2; round++) {
            for (const u of users) {
                assertOk(await gw.chat(u.key, M), `round ${round}`);
            }
        }
        /* 30 (prompt 10 + completion 20) per request, two each */
        await waitLogs(gw, { model: M }, (items, l) => l.total >= 60, { ms: 10000 });
        for (const u of users.slice(0, 5)) {
            const t = (await gw.admin('GET', `/api/token/${u.token.id}`)).json;
            assert.equal(t.used_quota, 60, JSON.stringify(t));
        }
        const log = gw.errorLog();
        assert.doesNotMatch(log, /could not be queued|out of shared memory/);
        assert.doesNotMatch(log, /\[crit\] .*ngx_slab_alloc\(\) failed/);
        assert.match(log, /\[warn\] .*rate limit window of user \d+ was dropped/);
    });
});

describe('success slots of a worker killed with kill -9', { timeout: 120000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-rlkill');
    let slow = true;

    before(async () => {
        db = await createDb();
        mock = await startMock(async (req, res, rec) => {
            if (slow) {
                await new Promise((r) => setTimeout(r, 4000));
            }
            return echo(req, res, rec);
        });
        gw = await startGateway({ db, workers: 1 });
        const r = await gw.admin('PUT', '/api/rate_limit', {
            default: { duration_minutes: 60, total: 0, success: 4 },
        });
        assert.equal(r.status, 200, r.text);
        await makeChannel(gw, { base_url: mock.url, models: [M] });
        await settle();
    });

    after(async () => {
        try {
            await gw?.stop();
            const bad = (gw?.errorLog() || '').split('\n')
                .filter((l) => /\[(alert|emerg)\]/.test(l) && !/exited on signal 9/.test(l));
            assert.deepEqual(bad, []);
        } finally {
            await mock?.close();
            await dropDb(db);
        }
    });

    test('are given back when another worker finds the dead one', async () => {
        const { key } = await makeUserKey(gw);
        /* three requests hold slots inside the upstream */
        const inflight = times(3, () => gw.chat(key, M).catch(() => null));
        await eventually(() => assert.equal(mock.requests.length, 3), { ms: 5000 });
        const pids = gw.workerPids();
        for (const p of pids) {
            process.kill(p, 'SIGKILL');
        }
        await inflight;
        await eventually(() => {
            const now = gw.workerPids();
            assert.ok(now.length === 1 && !pids.includes(now[0]));
        }, { ms: 5000 });
        slow = false;
        const rs = [];
        for (let i = 0; i < 5; i++) {
            rs.push((await gw.chat(key, M)).status);
        }
        assert.deepEqual(rs, [200, 200, 200, 200, 429]);
    });
});
