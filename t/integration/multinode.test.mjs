// Two nginx nodes on one database: a change made through one node is in
// force on the other within 1 s, on all of its workers, without reload.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, eventually, makeChannel, makeKey,
    makeUser, psql, settle, startGateway, stopAll, times, uniq, PROPAGATION_MS,
} from '../lib/harness.mjs';
import { startMock } from '../lib/mock.mjs';

const SPREAD = { listen: 'reuseport', server: 'add_header X-Worker $pid always;' };

describe('two nodes on one database', { timeout: 180000 }, () => {
    let db, a, b, mock;

    before(async () => {
        db = await createDb();
        mock = await startMock();
        a = await startGateway({ db, ...SPREAD });
        b = await startGateway({ db, ...SPREAD, rootToken: a.rootToken });
    });

    after(async () => {
        try {
            await stopAll(a, b);
        } finally {
            await mock?.close();
            await dropDb(db);
        }
    });

    async function onEveryWorkerOfB(t0, send, check) {
        await settle(t0);
        const rs = await times(16, () => send());
        rs.forEach(check);
        const workers = new Set(rs.map((r) => r.headers['x-worker']));
        assert.equal(workers.size, 2, `B answered from workers ${[...workers]}`);
    }

    test('a channel and key created through A serve through B within 1 s', async () => {
        const model = uniq('gpt-mn');
        const t0 = Date.now();
        await makeChannel(a, { base_url: mock.url, models: [model] });
        const u = await makeUser(a);
        const t = await makeKey(a, u.id);
        await eventually(async () => assertOk(await b.chat(t.key, model)),
            { since: t0, ms: PROPAGATION_MS });
        await onEveryWorkerOfB(t0, () => b.chat(t.key, model), (r) => assertOk(r));
    });

    test('a key disabled through A is refused by B within 1 s', async () => {
        const model = uniq('gpt-mn-off');
        await makeChannel(a, { base_url: mock.url, models: [model] });
        const u = await makeUser(a);
        const t = await makeKey(a, u.id);
        await eventually(async () => assertOk(await b.chat(t.key, model)), { ms: 2 * PROPAGATION_MS });
        const t0 = Date.now();
        const r = await a.admin('PATCH', `/api/token/${t.id}`, { status: 'disabled' });
        assert.equal(r.status, 200, r.text);
        await eventually(async () => assertError(await b.chat(t.key, model), 401,
            { code: 'invalid_token' }), { since: t0, ms: PROPAGATION_MS });
        await onEveryWorkerOfB(t0, () => b.chat(t.key, model),
            (x) => assertError(x, 401, { code: 'invalid_token' }));
    });

    test('a channel deleted through B stops serving on A within 1 s', async () => {
        const model = uniq('gpt-mn-del');
        const c = await makeChannel(b, { base_url: mock.url, models: [model] });
        const u = await makeUser(b);
        const t = await makeKey(b, u.id);
        await eventually(async () => assertOk(await a.chat(t.key, model)), { ms: 2 * PROPAGATION_MS });
        const t0 = Date.now();
        const r = await b.admin('DELETE', `/api/channel/${c.id}`);
        assert.equal(r.status, 200, r.text);
        await eventually(async () => assertError(await a.chat(t.key, model), 503,
            { code: 'model_not_found' }), { since: t0, ms: PROPAGATION_MS });
    });

    test('a key created through A is readable through B with the same data', async () => {
        const u = await makeUser(a);
        const t = await makeKey(a, u.id, { unlimited_quota: false, remain_quota: 4242 });
        const r = await b.admin('GET', `/api/token/${t.id}`);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.remain_quota, 4242);
        assert.equal(r.json.id, t.id);
    });

    test('database connections the server ends: both nodes reconnect, serve, and log no alert', async () => {
        const u = await makeUser(a);
        const t = await makeKey(a, u.id);
        const M = uniq('gpt-mn-drop');
        await makeChannel(a, { base_url: mock.url, models: [M] });
        await settle();
        (await times(4, () => b.chat(t.key, M))).forEach((r) => assertOk(r));
        /* every connection of both nodes, LISTEN ones included */
        const n = await psql(db.conninfo, `select count(pg_terminate_backend(pid))
            from pg_stat_activity where datname = current_database()
             and pid <> pg_backend_pid()`);
        assert.ok(Number(n) >= 4, `ended ${n} connections`);
        await eventually(async () => {
            (await times(4, () => a.chat(t.key, M))).forEach((r) => assertOk(r));
            (await times(4, () => b.chat(t.key, M))).forEach((r) => assertOk(r));
        }, { ms: 8000 });
        /* and a change still reaches the other node */
        assertOk(await a.admin('PATCH', `/api/token/${t.id}`, { status: 'disabled' }));
        await eventually(async () => {
            assertError(await b.chat(t.key, M), 401, {});
        }, { ms: 3000 });
        for (const gw of [a, b]) {
            const alerts = gw.errorLog().split('\n').filter((l) => /\[alert\]/.test(l));
            assert.deepEqual(alerts, [], 'no alert lines');
        }
    });
});
