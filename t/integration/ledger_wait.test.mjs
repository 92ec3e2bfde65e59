// Ledger admission: when llmgw_ledger_backlog rows are queued and not yet
// written, a new model request is not refused at once: it waits up to
// llmgw_ledger_wait for room and is served as soon as the ledger catches
// up; if no room appears in time it is answered 503 service_unavailable
// ("the ledger is behind; retry shortly"), leaves no ledger row and is
// charged nothing.
//
// The ledger is made unable to write by a separate psql session holding
// LOCK TABLE logs IN SHARE MODE, which conflicts with the RowExclusiveLock
// of the gateway's COPY: while it is held, every row stays queued.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, eventually, httpRequest, makeChannel, makeKey,
    makeUser, psql, settle, sleep, startGateway, stopAll, uniq,
} from '../lib/harness.mjs';
import { openaiChat, sendJson, startMock } from '../lib/mock.mjs';

const USAGE = { prompt_tokens: 10, completion_tokens: 20 };
const PRICE = { ratio: 1, completion_ratio: 2 };
/* (10 + 20 x 2) x 1 x group 1 */
const COST = 50;

const BACKLOG = 3;

/* ------------------------------------------------------------------ */
/* a session that keeps the ledger from being written                  */
/* ------------------------------------------------------------------ */

/* `p`, or null when it has not settled in `ms` (the timer is cleared). */
function within(p, ms) {
    let timer;
    return Promise.race([
        p,
        new Promise((resolve) => { timer = setTimeout(() => resolve(null), ms); }),
    ]).finally(() => clearTimeout(timer));
}

/*
 * Starts psql in a transaction holding SHARE on logs and resolves once
 * pg_locks shows the lock granted.  The session stays idle in its
 * transaction until release() commits it; should the test die, killing
 * psql ends the session, and idle_in_transaction_session_timeout is the
 * last resort.  -> {release(), kill(), held()}
 */
async function lockLogs(db) {
    const app = uniq('ledger-lock').replaceAll('-', '_');
    const child = spawn('psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1',
        '-d', `${db.conninfo} application_name=${app}`],
    { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = '';
    let exited = null;
    const exit = new Promise((resolve) => {
        child.on('exit', (code, signal) => {
            exited = { code, signal };
            resolve(exited);
        });
    });
    child.stdout.on('data', (c) => { out += c; });
    child.stderr.on('data', (c) => { out += c; });
    child.stdin.on('error', () => { /* psql gone; reported below */ });
    child.stdin.write("SET idle_in_transaction_session_timeout = '15s';\n" +
        'BEGIN;\nLOCK TABLE logs IN SHARE MODE;\n\\echo locked\n');

    let released = false;
    const h = {
        /* Commits (the lock goes away) and waits for psql to exit. */
        async release() {
            if (released) {
                return exited;
            }
            released = true;
            if (!exited) {
                child.stdin.end('COMMIT;\n');
            }
            const r = await within(exit, 5000);
            if (!r) {
                await h.kill();
                assert.fail(`the lock session did not exit after COMMIT: ${out}`);
            }
            assert.equal(r.code, 0, `the lock session failed: ${out}`);
            return r;
        },
        /* Cleanup: always ends the session, whatever state it is in. */
        async kill() {
            released = true;
            if (!exited) {
                child.kill('SIGKILL');
                await within(exit, 5000);
            }
            /* the backend goes when its client does; make sure of it */
            await psql(db.conninfo, `select pg_terminate_backend(pid)
                from pg_stat_activity where application_name = '${app}'`)
                .catch(() => {});
        },
        async held() {
            return psql(db.conninfo, `select count(*) from pg_locks l
                join pg_stat_activity a on a.pid = l.pid
               where l.locktype = 'relation' and l.relation = 'logs'::regclass
                 and l.mode = 'ShareLock' and l.granted
                 and a.application_name = '${app}'`);
        },
    };

    try {
        await eventually(async () => {
            assert.equal(exited, null, `the lock session exited: ${out}`);
            assert.match(out, /locked/, 'psql reports the lock');
            assert.equal(await h.held(), '1', 'pg_locks shows SHARE on logs');
        }, { ms: 5000, intervalMs: 50 });
    } catch (e) {
        await h.kill();
        throw e;
    }
    return h;
}

/* ------------------------------------------------------------------ */
/* helpers                                                             */
/* ------------------------------------------------------------------ */

/* Ledger rows of the given request ids, straight from PostgreSQL. */
async function rowsOf(db, ids) {
    const list = ids.map((id) => `'${String(id).replace(/'/g, "''")}'`).join(',');
    const out = await psql(db.conninfo,
        `select coalesce(json_agg(json_build_object('request_id', request_id,
            'type', type, 'token_id', token_id, 'user_id', user_id,
            'quota', quota, 'status', status) order by id), '[]')
           from logs where request_id in (${list})`);
    return JSON.parse(out);
}

/* All ledger rows of a user. */
async function rowsOfUser(db, user) {
    const out = await psql(db.conninfo,
        `select coalesce(json_agg(json_build_object('request_id', request_id,
            'type', type, 'quota', quota) order by id), '[]')
           from logs where user_id = ${Number(user.id)}`);
    return JSON.parse(out);
}

async function dbBalance(db, a) {
    const out = await psql(db.conninfo,
        `select json_build_object(
            'remain', (select remain_quota from tokens where id = ${Number(a.token.id)}),
            'tokenUsed', (select used_quota from tokens where id = ${Number(a.token.id)}),
            'userQuota', (select quota from users where id = ${Number(a.user.id)}),
            'userUsed', (select used_quota from users where id = ${Number(a.user.id)}))`);
    return JSON.parse(out);
}

function expectedBalance(a, n) {
    return {
        remain: a.remain0 - n * COST, tokenUsed: n * COST,
        userQuota: a.quota0 - n * COST, userUsed: n * COST,
    };
}

/* Every id has exactly one consume row of COST (waits for the flush). */
async function expectWritten(db, ids, { ms = 6000 } = {}) {
    return eventually(async () => {
        const rows = await rowsOf(db, ids);
        for (const id of ids) {
            const mine = rows.filter((x) => x.request_id === id);
            assert.equal(mine.length, 1, `one row for ${id}: ${JSON.stringify(rows)}`);
            assert.equal(mine[0].type, 'consume', JSON.stringify(mine[0]));
            assert.equal(Number(mine[0].quota), COST, JSON.stringify(mine[0]));
        }
        return rows;
    }, { ms, intervalMs: 100 });
}

/* Fails unless `p` is still pending after `ms`. */
async function stillPending(p, ms) {
    let settled = null;
    p.then((r) => { settled = `answered ${r.status} ${r.text.slice(0, 300)}`; },
        (e) => { settled = `failed: ${e.message}`; });
    await sleep(ms);
    assert.equal(settled, null, `still waiting for ledger room after ${ms} ms`);
}

/* ------------------------------------------------------------------ */
/* tests                                                               */
/* ------------------------------------------------------------------ */

describe('ledger admission: requests wait for ledger room', { timeout: 60000 }, () => {
    let mock;

    before(async () => {
        mock = await startMock((req, res, rec) =>
            sendJson(res, 200, openaiChat({ model: rec.json && rec.json.model, usage: USAGE })));
    });

    after(async () => {
        await mock?.close();
    });

    /*
     * A database and gateway with `http` directives, one priced model, and
     * an account with a known quota and a limited key; the ledger is
     * drained (a warm-up request's row is written) before it returns.
     */
    async function setup(http) {
        const db = await createDb();
        let gw;
        try {
            gw = await startGateway({ db, http });
            const model = uniq('gpt-ledger-wait');
            const r = await gw.admin('PUT', '/api/pricing', { [model]: PRICE });
            assert.equal(r.status, 200, r.text);
            await makeChannel(gw, { base_url: mock.url, models: [model] });
            const quota0 = 10000000;
            const remain0 = 5000000;
            const user = await makeUser(gw, { quota: quota0, group: 'default' });
            const token = await makeKey(gw, user.id,
                { unlimited_quota: false, remain_quota: remain0 });
            const warm = await makeUser(gw, { quota: quota0, group: 'default' });
            const warmKey = await makeKey(gw, warm.id);
            await settle();
            /* the queue is FIFO: once this row is written, nothing older waits */
            const w = assertOk(await gw.chat(warmKey.key, model), 'warm-up');
            await expectWritten(db, [w.headers['x-request-id']]);
            return { db, gw, model, a: { user, token, key: token.key, remain0, quota0 } };
        } catch (e) {
            await stopAll(gw).catch(() => {});
            await dropDb(db).catch(() => {});
            throw e;
        }
    }

    /* The ledger's numbers in /metrics. */
    async function ledgerMetrics(gw) {
        const r = await httpRequest(`${gw.url}/metrics`);
        assert.equal(r.status, 200, r.text);
        const value = (name) => {
            const m = r.text.match(new RegExp(`^${name} (\\d+)$`, 'm'));
            assert.ok(m, `${name} in /metrics`);
            return Number(m[1]);
        };
        return {
            rows: value('llmgw_ledger_rows'),
            waits: value('llmgw_ledger_waits_total'),
            refused: value('llmgw_ledger_refused_total'),
        };
    }

    /* BACKLOG served requests while the ledger cannot write: their ids. */
    async function fillBacklog(gw, a, model) {
        const ids = [];
        for (let i = 0; i < BACKLOG; i++) {
            const r = assertOk(await gw.chat(a.key, model), `request ${i + 1} of the backlog`);
            ids.push(r.headers['x-request-id']);
        }
        return ids;
    }

    /* Each served request (ids) has its row, was charged once, and no other. */
    async function expectServedOnce(db, a, ids) {
        await expectWritten(db, ids);
        await eventually(async () => {
            assert.deepEqual(await dbBalance(db, a), expectedBalance(a, ids.length));
        }, { ms: 5000, intervalMs: 100 });
        const mine = await rowsOfUser(db, a.user);
        assert.deepEqual(mine.map((x) => x.request_id).sort(), ids.slice().sort(),
            `the user's rows are exactly the served requests: ${JSON.stringify(mine)}`);
    }

    /*
     * A gateway with llmgw_ledger_wait `wait`, the ledger locked and the
     * backlog full of served requests (their ids): body(...) runs, then
     * everything is stopped and dropped.
     */
    async function withFullLedger(wait, body) {
        const { db, gw, model, a } = await setup(`llmgw_ledger_backlog ${BACKLOG};
  llmgw_ledger_wait ${wait}; llmgw_flush_interval 100ms; llmgw_pg_timeout 10s;`);
        let lock;
        try {
            lock = await lockLogs(db);
            const ids = await fillBacklog(gw, a, model);
            await body({ db, gw, model, a, lock, ids });
        } finally {
            try {
                await lock?.kill();
                await stopAll(gw);
            } finally {
                await dropDb(db);
            }
        }
    }

    test('beyond the backlog a request waits, and is served once the ledger catches up', async () => {
        await withFullLedger('5s', async ({ db, gw, model, a, lock, ids }) => {
            /* the flushes are stuck behind the lock: nothing written yet */
            await sleep(300);
            assert.deepEqual(await rowsOf(db, ids), [], 'no row can be written under the lock');

            assert.deepEqual(await ledgerMetrics(gw), { rows: BACKLOG, waits: 0, refused: 0 },
                'the backlog is full, nobody waited yet');

            const upstreamBefore = mock.requests.length;
            const p4 = gw.chat(a.key, model, { timeoutMs: 15000 });
            await stillPending(p4, 600);
            assert.deepEqual(await ledgerMetrics(gw), { rows: BACKLOG, waits: 1, refused: 0 },
                'one request waits');
            assert.equal(mock.requests.length, upstreamBefore,
                'the waiting request has not gone upstream');
            assert.equal(await lock.held(), '1', 'the lock is still held');

            const tRelease = Date.now();
            await lock.release();
            const r4 = assertOk(await p4, 'the waiting request is served');
            assert.ok(r4.tEnd - r4.t0 >= 600,
                `it waited for room: ${r4.tEnd - r4.t0} ms`);
            assert.ok(r4.tEnd - tRelease < 2000,
                `it is served as soon as room appears: ${r4.tEnd - tRelease} ms after the release`);
            assert.equal(mock.requests.length, upstreamBefore + 1, 'then it went upstream once');
            ids.push(r4.headers['x-request-id']);
            assert.equal(new Set(ids).size, BACKLOG + 1, `distinct request ids: ${ids}`);

            /* every request has its own row, and was charged once */
            await expectServedOnce(db, a, ids);
            await eventually(async () => {
                assert.deepEqual(await ledgerMetrics(gw), { rows: 0, waits: 1, refused: 0 });
            }, { ms: 5000, intervalMs: 100 });
        });
    });

    for (const signal of ['reload', 'stop']) {
        test(`a ${signal} while a request waits for room: it still waits, and is served`, async () => {
            await withFullLedger('5s', async ({ db, gw, model, a, lock, ids }) => {
                await sleep(200);
                const p4 = gw.chat(a.key, model, { timeoutMs: 15000 });
                await stillPending(p4, 400);
                const signalled = signal === 'reload' ? gw.reload() : gw.stop();
                await stillPending(p4, 500);
                await lock.release();
                const r4 = assertOk(await p4, `the waiting request, after the ${signal}`);
                await signalled;
                if (signal === 'stop') {
                    assert.equal(gw.killed, false);
                }
                ids.push(r4.headers['x-request-id']);
                await expectServedOnce(db, a, ids);
            });
        });
    }

    test('no room within llmgw_ledger_wait: 503 service_unavailable, no row, nothing charged', async () => {
        await withFullLedger('300ms', async ({ db, gw, model, a, lock, ids }) => {
            await sleep(200);

            const upstreamBefore = mock.requests.length;
            const r4 = await gw.chat(a.key, model, { timeoutMs: 10000 });
            assertError(r4, 503, {
                type: 'gateway_error', code: 'service_unavailable',
                message: 'the ledger is behind; retry shortly',
            });
            assert.equal(r4.headers['retry-after'], '1', 'Retry-After: 1');
            const waited = r4.tEnd - r4.t0;
            assert.ok(waited >= 250, `it waited about llmgw_ledger_wait first: ${waited} ms`);
            assert.ok(waited < 1500, `refused after the wait, not the lock: ${waited} ms`);
            assert.equal(mock.requests.length, upstreamBefore, 'the upstream was not called');
            const refused = r4.headers['x-request-id'];
            assert.ok(!ids.includes(refused), 'a request id of its own');
            assert.deepEqual(await ledgerMetrics(gw), { rows: BACKLOG, waits: 1, refused: 1 },
                'it waited, then was refused');

            /* the lock outlives the wait by far; then it goes */
            await sleep(500);
            assert.equal(await lock.held(), '1', 'the lock was held throughout');
            await lock.release();

            /* the served requests are written and charged ... */
            await expectWritten(db, ids);
            await eventually(async () => {
                assert.deepEqual(await dbBalance(db, a), expectedBalance(a, BACKLOG));
            }, { ms: 5000, intervalMs: 100 });
            /* ... the refused one left nothing, even after more flushes */
            await sleep(500);
            assert.deepEqual(await rowsOf(db, [refused]), [], 'no ledger row for the refused request');
            assert.deepEqual(await dbBalance(db, a), expectedBalance(a, BACKLOG),
                'nothing charged for the refused request');

            /* room is back: the next request is served at once */
            const r5 = assertOk(await gw.chat(a.key, model), 'served once the ledger caught up');
            assert.ok(r5.tEnd - r5.t0 < 1000, `not held back: ${r5.tEnd - r5.t0} ms`);
            ids.push(r5.headers['x-request-id']);
            await expectServedOnce(db, a, ids);
        });
    });
});
