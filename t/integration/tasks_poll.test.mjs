// Task polling end to end, through the real nginx, PostgreSQL and the plugin
// runtime helper, against the mock vendor of t/lib/vendor.mjs:
//   - the poll classification table of the contract facts, row by row
//     (2xx parse; 404/410 fail at once; 401/403/429/5xx/transport counted;
//     other 4xx parsed with their status; UNKNOWN, empty status and a
//     throwing hook counted; a valid non-terminal 2xx resets the counter;
//     llmgw_task_poll_max_failures consecutive failures fail and refund);
//   - a hook that ends its runtime worker: the plugin's failure, counted;
//   - the query context and the plugin state kept across polls;
//   - a batch plugin polled with one request per channel for several tasks;
//   - two nodes on one database polling 1,000 tasks, each settled once;
//   - a worker killed with SIGKILL mid-poll: the lease expires and the task
//     still finishes.
//
// Gateways poll every 200 ms and fail a task after 3 consecutive failures.
// Gates (t/lib/vendor.mjs gate()) hold a chosen poll answer, so that the
// test can read the task between two polls without racing the poller.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, psql, sleep, startGateway, stopAll,
    tearDown, times, uniq,
} from '../lib/harness.mjs';
import {
    account, expectUsed, gate, getTask, ledgerRows, mapLimit, pidOwningPort,
    pluginSource, pollFailures, sseFrame, startVendor, stopAfterKill, submitTask, taskSetup,
    TERMINAL,
    vendorSuite, waitFor, waitLedger, waitStatus, waitTask,
} from '../lib/vendor.mjs';

const POLL_MS = 200;
const MAX_FAILURES = 3;
const PER_TASK = 5000;      /* 0.01 USD */
const PER_SECOND = 5000;    /* 0.01 USD per second of usage */
const HTTP = `llmgw_task_poll_interval ${POLL_MS}ms;\n  ` +
    `llmgw_task_poll_max_failures ${MAX_FAILURES};`;

const running = (extra = {}) => ({ status: 200, body: { status: 'running', ...extra } });
const held = (g, answer) => ({ ...answer, before: () => g.promise });

/* The X-Ctx echo of buildQueryRequest in a poll the vendor received. */
const queryCtx = (rec) => JSON.parse(rec.headers['x-ctx']);

describe('poll classification', { timeout: 300000 }, () => {
    let db, gw, vendor, env;

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true, http: HTTP });
        vendor = await startVendor();
        env = await taskSetup(gw, { vendors: [vendor], mapping: true });
        vendor.onSubmit = (rec) => {
            const up = rec.json && rec.json.up_id;
            return submitExtra.has(up) ? { body: { id: up, ...submitExtra.get(up) } } : undefined;
        };
    });

    after(() => tearDown(db, [gw], [vendor]));

    /* Extra fields of the submit answer, by upstream id. */
    const submitExtra = new Map();

    /* A task of a fresh account whose polls get `answers` first; `submit`
       adds fields (state, data) to the vendor's submit answer. */
    async function startTask(answers, { acct, body = {}, submit } = {}) {
        acct = acct || await account(gw);
        const up = uniq('up');
        vendor.queuePoll(up, ...answers);
        if (submit) {
            submitExtra.set(up, submit);
        }
        const r = assertOk(await submitTask(gw, env, { model: env.model, up_id: up, ...body },
            { key: acct.key }), 'submit');
        return { id: r.json.task_id, up, acct, view: r.json };
    }

    const polls = (t) => vendor.polls(t.up).length;

    /* Waits until the task has `n` recorded failures while its poll number
       `polled` is held at the vendor; -> the view then. */
    async function heldAt(t, n, polled) {
        await waitFor(() => polls(t) >= polled, 8000, { what: `poll ${polled} of ${t.id}` });
        await waitFor(async () => (await pollFailures(db, t.id)) === n, 5000,
            { what: `poll_failures = ${n} for ${t.id}` });
        const r = assertOk(await getTask(gw, t.acct.key, t.id));
        return r.json;
    }

    /* FAILURE, every charge refunded, and no poll after it. */
    async function expectFailedAndRefunded(t, { polled } = {}) {
        const v = await waitStatus(gw, t.acct.key, t.id, 'FAILURE', { ms: 8000 });
        const led = await waitLedger(db, t.id, ['reserve', 'refund']);
        assert.equal(led.refund, led.reserve + (led.adjust || 0), JSON.stringify(led));
        await expectUsed(gw, db, t.acct, 0);
        const n = polls(t);
        await sleep(3 * POLL_MS);
        assert.equal(polls(t), n, 'no poll after FAILURE');
        if (polled !== undefined) {
            assert.equal(n, polled, `polls of ${t.id}`);
        }
        return v;
    }

    test('2xx: statuses and progress move; the query context; state kept until replaced', async () => {
        const g = Array.from({ length: 5 }, () => gate());
        const t = await startTask([
            held(g[0], { body: { status: 'queued' } }),
            held(g[1], { body: { status: 'running', progress: '30%', state: { n: 1 } } }),
            held(g[2], { body: { status: 'running', progress: '60%' } }),
            held(g[3], { body: { status: 'running', progress: '80%', state: { n: 3 } } }),
            held(g[4], { body: { status: 'done', progress: '100%' } }),
        ], { submit: { state: { n: 0 }, data: { kind: 'clip' } } });
        const steps = [
            ['QUEUED', undefined], ['IN_PROGRESS', '30%'], ['IN_PROGRESS', '60%'],
            ['IN_PROGRESS', '80%'], ['SUCCESS', '100%'],
        ];
        for (let i = 0; i < steps.length; i++) {
            await waitFor(() => polls(t) >= i + 1, 5000, { what: `poll ${i + 1}` });
            g[i].open();
            const [status, progress] = steps[i];
            const v = await waitTask(gw, t.acct.key, t.id, (x) => x.status === status &&
                (progress === undefined || x.progress === progress), { ms: 5000 });
            if (status === 'SUCCESS') {
                assert.ok(v.finished_at, JSON.stringify(v));
            } else {
                assert.ok(!v.finished_at, `not finished yet: ${JSON.stringify(v)}`);
            }
        }
        const ctxs = vendor.polls(t.up).map(queryCtx);
        assert.equal(ctxs.length, 5);
        for (const c of ctxs) {
            assert.equal(c.taskId, t.up, 'ctx.taskId is the upstream id');
            assert.equal(c.publicTaskId, t.id);
            assert.equal(c.model, env.model);
            assert.equal(c.upstreamModel, env.upstreamModel);
            assert.equal(typeof c.action, 'string');
            assert.equal(c.requestBody, '<undefined>', 'no requestBody when polling');
            assert.deepEqual(c.upstream, { kind: 'vendor' });
            assert.equal(c.baseUrl, vendor.url);
        }
        assert.equal(vendor.polls(t.up)[0].headers.authorization, `Bearer ${env.channelKey}`);
        assert.equal(ctxs[0].data.kind, 'clip', 'data from parseSubmitResponse');
        assert.deepEqual(ctxs.map((c) => c.state), [{ n: 0 }, { n: 0 }, { n: 1 }, { n: 1 }, { n: 3 }],
            'the state changes only when a hook returns one');
        await waitLedger(db, t.id, ['reserve', 'settle']);
        await expectUsed(gw, db, t.acct, PER_TASK);
    });

    for (const code of [404, 410]) {
        test(`${code}: FAILURE at once, refunded`, async () => {
            const t = await startTask([running(), { status: code, body: { error: 'no such task' } }]);
            await expectFailedAndRefunded(t, { polled: 2 });
        });
    }

    const COUNTED = [
        [401, { status: 401, body: { error: 'bad key' } }],
        [403, { status: 403, body: { error: 'forbidden' } }],
        [429, { status: 429, body: { error: 'slow down' } }],
        [500, { status: 500, body: { error: 'oops' } }],
        [502, { status: 502, body: 'bad gateway' }],
        [503, { status: 503, body: { error: 'unavailable' } }],
        [504, { status: 504, body: 'timeout' }],
        ['a transport error', { close: true }],
    ];
    for (const [what, fail] of COUNTED) {
        test(`${what}: status unchanged, counted; ${MAX_FAILURES} in a row fail and refund`, async () => {
            const g = gate();
            const t = await startTask([running({ progress: '10%' }), fail, fail, held(g, fail)]);
            const v = await heldAt(t, 2, 4);
            assert.equal(v.status, 'IN_PROGRESS', `unchanged: ${JSON.stringify(v)}`);
            assert.equal(v.progress, '10%');
            g.open();
            await expectFailedAndRefunded(t, { polled: 4 });
            if (what === 401 || what === 403) {
                /* the channel is not disabled, but the operator is told */
                const log = fs.readFileSync(path.join(gw.dir, 'error.log'), 'utf8');
                assert.match(log, new RegExp(`\\[warn\\].*channel ${env.channels[0].id} ` +
                    'refused the channel\'s credentials'));
            }
        });
    }

    test('other 4xx: the parse hook gets the status; non-terminal answers count as failures', async () => {
        const g = gate();
        const a = await startTask([running(),
            { status: 400, body: { status: 'running' } },
            { status: 422, body: { status: 'running' } },
            held(g, { status: 400, body: { status: 'queued' } })]);
        const v = await heldAt(a, 2, 4);
        assert.equal(v.status, 'IN_PROGRESS', JSON.stringify(v));
        g.open();
        await expectFailedAndRefunded(a, { polled: 4 });

        /* a terminal answer under 422 ends the task through the hook */
        const b = await startTask([running(), { status: 422, body: { status: 'failed', error: 'bad prompt' } }]);
        const fb = await expectFailedAndRefunded(b, { polled: 2 });
        assert.match(fb.fail_reason, /bad prompt \(http 422\)/, 'the hook saw HTTP 422');
    });

    test('UNKNOWN, an empty status and a throwing parse hook count; UNKNOWN is not in progress', async () => {
        const g = gate();
        const t = await startTask([{ body: { status: 'queued' } },
            { body: { status: 'mystery' } },
            { body: { status: '' } },
            held(g, { body: { throw: 'cannot read this answer' } })]);
        const v = await heldAt(t, 2, 4);
        assert.equal(v.status, 'QUEUED', `UNKNOWN is not taken as progress: ${JSON.stringify(v)}`);
        g.open();
        await expectFailedAndRefunded(t, { polled: 4 });
    });

    test('data or state over 1 MiB is not stored, not cut: each such poll counts as failed', async () => {
        const big = 'x'.repeat(1100 * 1024);
        const t = await startTask([{ body: { status: 'queued' } },
            { body: { status: 'running', result: big } },
            { body: { status: 'running', state: { big } } },
            { body: { status: 'done', result: big } }]);
        const v = await expectFailedAndRefunded(t, { polled: 4 });
        assert.match(v.fail_reason, /larger than 1 MiB/);
        assert.ok(JSON.stringify(v).length < 100000, 'nothing of the big values was kept');
    });

    test('a progress longer than 1024 bytes is cut there, as a fail reason is', async () => {
        const g = gate();
        const long = 'é'.repeat(1024 * 1024);
        const t = await startTask([{ body: { status: 'running', progress: long } },
            held(g, { body: { status: 'running', progress: long } }),
            { body: { status: 'done' } }]);
        const v = await heldAt(t, 0, 2);
        assert.equal(v.status, 'IN_PROGRESS');
        /* 512 two-byte characters: cut on a character, not inside one */
        assert.equal(v.progress, 'é'.repeat(512));
        const stored = await psql(db.conninfo,
            `select octet_length(progress) from tasks where task_id = '${t.id}'`);
        assert.equal(stored, '1024');
        g.open();
        await waitStatus(gw, t.acct.key, t.id, 'SUCCESS');
    });

    test('a result nested deeper than the gateway reads counts as a failed poll (not a runtime outage)', async () => {
        const deep = { body: { status: 'done', deep: 3000 } };
        const t = await startTask([deep, deep, deep]);
        const v = await expectFailedAndRefunded(t, { polled: 3 });
        assert.match(v.fail_reason, /parseTaskResult failed: .*nested over 512 levels deep/);
    });

    test('a valid non-terminal 2xx resets the failure counter', async () => {
        const g = [gate(), gate(), gate()];
        const fail = { status: 500, body: { error: 'oops' } };
        const t = await startTask([fail, fail,
            held(g[0], running({ progress: '50%' })),
            held(g[1], fail),
            held(g[2], fail),
            { body: { status: 'done' } }]);
        await heldAt(t, 2, 3);
        g[0].open();
        await heldAt(t, 0, 4);
        g[1].open();
        await heldAt(t, 1, 5);
        g[2].open();
        /* without the reset the counter would have reached 3 at poll 5 */
        await waitStatus(gw, t.acct.key, t.id, 'SUCCESS', { ms: 5000 });
        assert.equal(polls(t), 6);
        await waitLedger(db, t.id, ['reserve', 'settle']);
        await expectUsed(gw, db, t.acct, PER_TASK);
    });

    test('SUCCESS settles with extractUsageOnComplete\'s facts', async () => {
        const unit = await taskSetup(gw, { vendors: [vendor], price: 'unit' });
        const up = uniq('up');
        vendor.queuePoll(up, running(), { body: { status: 'done', seconds: 7 } });
        const r = assertOk(await submitTask(gw, unit, { model: unit.model, up_id: up, duration: 2 }));
        await waitStatus(gw, unit.acct.key, r.json.task_id, 'SUCCESS');
        const led = await waitLedger(db, r.json.task_id, ['reserve', 'settle']);
        assert.equal(led.reserve, 2 * PER_SECOND);
        assert.equal(led.reserve + (led.adjust || 0) + led.settle, 7 * PER_SECOND, JSON.stringify(led));
        await expectUsed(gw, db, unit.acct, 7 * PER_SECOND);
    });
});

/* A task whose every poll answer (`answer`) makes parseTaskResult run
   out of time: each poll counts, and the limit fails and refunds it. */
async function expectParseTimeoutsFail({ db, gw, vendor, env }, answer) {
    const acct = await account(gw);
    const up = uniq('up');
    vendor.setPoll(up, { body: answer });
    const r = assertOk(await submitTask(gw, env, { model: env.model, up_id: up },
        { key: acct.key }), 'submit');
    const id = r.json.task_id;
    await waitFor(async () => (await pollFailures(db, id)) === 1, 15000,
        { what: 'the first failure counted' });
    const v = await waitStatus(gw, acct.key, id, 'FAILURE', { ms: 30000 });
    assert.match(v.fail_reason,
        new RegExp(`polling failed ${MAX_FAILURES} times in a row: parseTaskResult failed: timeout`));
    assert.equal(vendor.polls(up).length, MAX_FAILURES);
    const led = await waitLedger(db, id, ['reserve', 'refund']);
    assert.equal(led.refund, led.reserve + (led.adjust || 0), JSON.stringify(led));
    await expectUsed(gw, db, acct, 0);
}

describe('a hook that ends its runtime worker', { timeout: 120000 }, () => {
    let db, gw, vendor, env;

    before(async () => {
        db = await createDb();
        vendor = await startVendor();
        /* a short deadline: the worker ends 2 s after it */
        gw = await startGateway({ db, v8host: { deadlineMs: 300 }, http: HTTP });
        env = await taskSetup(gw, { vendors: [vendor] });
    });

    after(() => tearDown(db, [gw], [vendor]));

    test('a submit hook that ends its worker is the plugin\'s error (500), not the runtime\'s', async () => {
        const r = await submitTask(gw, env, { model: env.model, behave: 'stuck' });
        assert.equal(r.status, 500, r.text);
        assert.equal(r.json.error.code, 'plugin_error');
        assert.match(r.json.error.message, /buildSubmitRequest failed: the hook ran past its deadline/);
        assert.equal(vendor.submits().length, 0);
    });

    test('a parse hook that ends its worker counts as a failed poll; the limit fails and refunds', async () => {
        await expectParseTimeoutsFail({ db, gw, vendor, env }, { stuck: true });
        assert.match(fs.readFileSync(gw.v8host.logPath, 'utf8'),
            /worker \d ended during a call of plugin [0-9a-f]{16}: timeout/);
    });
});

describe('llmgw_v8host_timeout below the runtime\'s deadline', { timeout: 120000 }, () => {
    let db, gw, vendor, env;

    before(async () => {
        db = await createDb();
        vendor = await startVendor();
        /* nginx waits 2 s for a call, the runtime would let a hook run 5 s */
        gw = await startGateway({ db, v8host: { deadlineMs: 5000 },
            http: `${HTTP}\n  llmgw_v8host_timeout 2s;` });
        env = await taskSetup(gw, { vendors: [vendor] });
    });

    after(() => tearDown(db, [gw], [vendor]));

    test('a parse hook that loops forever ends at the deadline nginx sends: counted, the limit fails and refunds', async () => {
        await expectParseTimeoutsFail({ db, gw, vendor, env }, { loop: true });
        assert.doesNotMatch(gw.errorLog(), /did not answer in time/);
    });
});

describe('the plugin runtime out once the vendor has the task', { timeout: 120000 }, () => {
    const V8_TIMEOUT_MS = 1500;
    const s = vendorSuite({ http: `${HTTP}\n  llmgw_v8host_timeout ${V8_TIMEOUT_MS}ms;`,
        workers: 1, v8host: { workers: 2 } });
    let env, sseEnv;

    before(async () => {
        env = await taskSetup(s.gw, { vendors: [s.vendor], models: 1 });
        sseEnv = await taskSetup(s.gw, { fixture: 'task-sse.js', vendors: [s.vendor], models: 1 });
    });

    /* The SSE answer to a submit: events the runtime is out for, in time. */
    const stream = (rec) => ({
        upId: rec.json.up_id, frameDelayMs: 300,
        sse: [sseFrame({ event: 'accepted', data: { id: rec.json.up_id } }),
            sseFrame({ data: { progress: 50 } }),
            sseFrame({ event: 'done', data: {} })],
    });

    /*
     * Two submits held at the vendor; the runtime goes out (out()), the
     * vendor answers (JSON, or an event stream with sse), the runtime
     * comes back (back()) after calls of parseSubmitResponse (or
     * parseSubmitEvent) have failed: both tasks are stored and charged,
     * also the one whose client left meanwhile, and nothing is sent twice.
     */
    async function outWhileAnswering(out, back, { sse = false } = {}) {
        const { gw, vendor, db } = s;
        const acct = await account(gw);
        const held = gate();
        const ups = [uniq('up-rt'), uniq('up-rt')];
        const e = sse ? sseEnv : env;
        vendor.onSubmit = async (rec) => {
            await held.promise;
            return sse ? stream(rec) : undefined;
        };
        try {
            const stays = submitTask(gw, e, { model: e.model, up_id: ups[0] },
                { key: acct.key, timeoutMs: 60000 });
            const leaves = submitTask(gw, e, { model: e.model, up_id: ups[1] },
                { key: acct.key, timeoutMs: V8_TIMEOUT_MS * 2 }).then(
                () => assert.fail('the client was to leave first'), (e) => e);
            await waitFor(() => ups.every((up) => vendor.submits().some((r) => r.upId === up
                || r.json?.up_id === up)), 10000, { what: 'both submits at the vendor' });
            await out();
            held.open();
            /* past two failed calls, and the second client gone */
            await sleep(V8_TIMEOUT_MS * 2 + 1000);
            assert.match((await leaves).message, /no complete response/);
            await back();

            const r = assertOk(await stays, 'the submit whose answer waited for the runtime');
            assert.match(r.json.task_id, /^task_/);
            if (sse) {
                /* every event, once, in order */
                assert.deepEqual(r.json.data.stream.events, ['accepted', 'message', 'done'], r.text);
                assert.equal(r.json.data.stream.progress, 50);
            }
            await waitFor(async () => Number(await psql(db.conninfo,
                `select count(*) from tasks where user_id = ${acct.user.id}`)) === 2,
            10000, { what: 'the task of the client that left, stored' });
            const rows = JSON.parse(await psql(db.conninfo, `select json_agg(upstream_task_id
                order by upstream_task_id) from tasks where user_id = ${acct.user.id}`));
            assert.deepEqual(rows, [...ups].sort());
            for (const up of ups) {
                assert.equal(vendor.submits().filter((x) => x.upId === up).length, 1,
                    'each submit reached the vendor once');
            }
            await expectUsed(gw, db, acct, 2 * PER_TASK);
        } finally {
            held.open();
            vendor.onSubmit = null;
        }
    }

    test('stopped: the answer is read once it runs again', async () => {
        const h = s.gw.v8host;
        await outWhileAnswering(async () => h.proc.kill('SIGSTOP'),
            async () => h.proc.kill('SIGCONT'));
    });

    test('killed: the answer is read once it is started again', async () => {
        const h = s.gw.v8host;
        await outWhileAnswering(() => h.kill('SIGKILL'), () => h.start());
    });

    test('SSE, stopped: the events are read once it runs again', async () => {
        const h = s.gw.v8host;
        await outWhileAnswering(async () => h.proc.kill('SIGSTOP'),
            async () => h.proc.kill('SIGCONT'), { sse: true });
    });

    test('SSE, killed: the events are read once it is started again', async () => {
        const h = s.gw.v8host;
        await outWhileAnswering(() => h.kill('SIGKILL'), () => h.start(), { sse: true });
    });

    /* Once the vendor has answered recs, the runtime is killed while the
       usage hook those answers lead to spins (0.6 s, within the hook's
       deadline of 0.75 s under llmgw_v8host_timeout 1.5 s) */
    async function killDuring(recs) {
        await waitFor(() => recs().length > 0 && recs().every((r) => r.tEnd), 10000,
            { what: 'the vendor answered' });
        await sleep(250);
        await s.gw.v8host.kill('SIGKILL');
    }

    test('killed while extractUsageOnSubmit or an immediate result\'s extractUsageOnComplete runs: waited out, charged the usage', async () => {
        const { gw, vendor, db } = s;
        const u = await taskSetup(gw, { vendors: [vendor], models: 1, price: 'unit' });
        const acct = await account(gw);
        const ups = [uniq('up-su'), uniq('up-fu')];
        vendor.onSubmit = (rec) => ({ body: rec.json.up_id === ups[0]
            ? { id: ups[0], data: { seconds: 3, usage_spin: 600 } }
            : { id: ups[1], immediate: { status: 'SUCCESS', seconds: 4, usage_spin: 600 } } });
        try {
            const answers = ups.map((up) => submitTask(gw, u, { model: u.model, up_id: up, duration: 2 },
                { key: acct.key, timeoutMs: 60000 }));
            await killDuring(() => vendor.submits().filter((r) => ups.includes(r.upId)));
            /* past calls that failed while the runtime was out */
            await sleep(V8_TIMEOUT_MS + 1000);
            assert.equal(Number(await psql(db.conninfo,
                `select count(*) from tasks where user_id = ${acct.user.id}`)), 0,
            'nothing is stored while the usage hooks wait for the runtime');
            await s.gw.v8host.start();
            const [sub, fin] = await Promise.all(answers);
            assertOk(sub, 'the submit whose usage waited');
            assert.equal(assertOk(fin, 'the immediate result').json.status, 'SUCCESS', fin.text);
            let led = await waitLedger(db, sub.json.task_id, ['reserve', 'adjust']);
            assert.equal(led.reserve + led.adjust, 3 * PER_SECOND, JSON.stringify(led));
            led = await waitLedger(db, fin.json.task_id, ['reserve', 'settle']);
            assert.equal(led.reserve + (led.adjust || 0) + led.settle, 4 * PER_SECOND,
                JSON.stringify(led));
            await expectUsed(gw, db, acct, 7 * PER_SECOND);
            for (const up of ups) {
                assert.equal(vendor.submits().filter((x) => x.upId === up).length, 1,
                    'each submit reached the vendor once');
            }
            assert.doesNotMatch(gw.errorLog(), /the charge so far stands/);
        } finally {
            vendor.onSubmit = null;
        }
    });

    test('killed while a poll\'s extractUsageOnComplete runs: the task stays as it was, then is settled with its usage', async () => {
        const { gw, vendor, db } = s;
        const u = await taskSetup(gw, { vendors: [vendor], models: 1, price: 'unit' });
        const acct = await account(gw);
        const up = uniq('up-pu');
        vendor.queuePoll(up, { body: { status: 'done', seconds: 6, usage_spin: 600 } });
        vendor.setPoll(up, { body: { status: 'done', seconds: 6 } });
        const r = assertOk(await submitTask(gw, u, { model: u.model, up_id: up, duration: 2 },
            { key: acct.key }));
        const id = r.json.task_id;
        await killDuring(() => vendor.polls(up).slice(0, 1));
        /* polls meet the runtime out: none settles the task */
        await sleep(V8_TIMEOUT_MS + 5 * POLL_MS);
        const row = JSON.parse(await psql(db.conninfo,
            `select json_build_object('status', status, 'failures', poll_failures)
               from tasks where task_id = '${id}'`));
        assert.deepEqual(row, { status: 'SUBMITTED', failures: 0 });
        assert.deepEqual((await ledgerRows(db, id)).map((x) => x.type), ['reserve']);
        await s.gw.v8host.start();
        await waitStatus(gw, acct.key, id, 'SUCCESS');
        const led = await waitLedger(db, id, ['reserve', 'settle']);
        assert.equal(led.reserve + (led.adjust || 0) + led.settle, 6 * PER_SECOND, JSON.stringify(led));
        await expectUsed(gw, db, acct, 6 * PER_SECOND);
        assert.match(gw.errorLog(), new RegExp(`${id}: extractUsageOnComplete: the plugin runtime is unavailable`));
    });
});

describe('batch plugin', { timeout: 120000 }, () => {
    let db, gw, v1, v2;

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true, http: HTTP });
        v1 = await startVendor();
        v2 = await startVendor();
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all([v1, v2].map((v) => v?.close()));
            await dropDb(db);
        }
    });

    test('one batch request per channel covers several tasks; each reaches SUCCESS', async () => {
        /* two channels of one plugin and model: the tasks spread over both */
        const env = await taskSetup(gw, { fixture: 'task-batch.js', vendors: [v1, v2], models: 1 });
        for (const v of [v1, v2]) {
            v.pollAnswer = (id, n) => (n >= 2 ? { body: { status: 'done' } } : running());
        }
        const N = 12;
        const rs = await times(N, () => submitTask(gw, env, { model: env.model }));
        rs.forEach((r) => assertOk(r, 'submit'));
        const ids = rs.map((r) => r.json.task_id);
        for (const id of ids) {
            await waitStatus(gw, env.acct.key, id, 'SUCCESS', { ms: 10000 });
        }
        const submitted = new Map();    /* vendor -> upstream ids it created */
        for (const v of [v1, v2]) {
            submitted.set(v, new Set(v.submits().map((s) => s.upId)));
            assert.equal(v.polls().length, 0, 'no per-task poll for a batch plugin');
        }
        assert.equal(submitted.get(v1).size + submitted.get(v2).size, N);
        let largest = 0;
        const covered = new Set();
        for (const v of [v1, v2]) {
            for (const b of v.batches()) {
                const bids = b.json.ids;
                assert.equal(b.json.public.length, bids.length);
                for (const id of bids) {
                    assert.ok(submitted.get(v).has(id),
                        `a batch to one channel holds only that channel's tasks: ${id}`);
                    covered.add(id);
                }
                assert.equal(new Set(bids).size, bids.length, 'no task twice in a batch');
                largest = Math.max(largest, bids.length);
            }
        }
        assert.equal(covered.size, N, 'every task was polled');
        assert.ok(largest >= 2, `some batch request covered several tasks (largest ${largest})`);
        for (const id of ids) {
            await waitLedger(db, id, ['reserve', 'settle']);
        }
        await expectUsed(gw, db, env.acct, N * PER_TASK);
    });
    test('a 404 or 410 to the batch query is one more failure for each task in it, not its end', async () => {
        const v = await startVendor();
        try {
            const env = await taskSetup(gw, { fixture: 'task-batch.js', vendors: [v], models: 1 });
            /* the batch route is missing twice for every task (a misrouted
               URL), then answers: the tasks go on to SUCCESS */
            const missed = new Map();
            v.onBatch = (rec) => {
                const ids = rec.json.ids;
                if (!ids.every((id) => (missed.get(id) || 0) < MAX_FAILURES - 1)) {
                    return undefined;
                }
                ids.forEach((id) => missed.set(id, (missed.get(id) || 0) + 1));
                return { status: rec.n % 2 ? 404 : 410, body: { error: 'no such route' } };
            };
            v.pollAnswer = () => ({ body: { status: 'done' } });
            const ups = [uniq('up-b404'), uniq('up-b404'), uniq('up-b404')];
            const rs = await Promise.all(ups.map((up) =>
                submitTask(gw, env, { model: env.model, up_id: up })));
            const ids = rs.map((r) => assertOk(r, 'submit').json.task_id);
            for (const id of ids) {
                await waitStatus(gw, env.acct.key, id, 'SUCCESS', { ms: 10000 });
                await waitLedger(db, id, ['reserve', 'settle']);
            }
            for (const up of ups) {
                assert.ok(missed.get(up) >= 1, `${up} was in a batch answered 404 or 410`);
            }
            await expectUsed(gw, db, env.acct, ups.length * PER_TASK);

            /* a batch route that stays missing ends its tasks at the limit */
            v.onBatch = () => ({ status: 404, body: { error: 'no such route' } });
            const r = assertOk(await submitTask(gw, env, { model: env.model }), 'submit');
            const view = await waitStatus(gw, env.acct.key, r.json.task_id, 'FAILURE', { ms: 10000 });
            assert.equal(view.fail_reason, `polling failed ${MAX_FAILURES} times in a row: `
                + 'the upstream answered HTTP 404 to the batch query');
            assert.equal(await pollFailures(db, r.json.task_id), MAX_FAILURES);
            await waitLedger(db, r.json.task_id, ['reserve', 'refund']);
        } finally {
            await v.close();
        }
    });

    test('a NUL in a poll result is stored; an update the database refuses holds up no other task of its batch', async () => {
        const v = await startVendor();
        const nul = uniq('up-nul');
        const bad = uniq('up-bad');
        const oks = [uniq('up-ok'), uniq('up-ok')];
        /* the database refuses any update that sets this progress */
        await psql(db.conninfo, `
            CREATE FUNCTION poison_t() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.progress = 'poison' THEN RAISE EXCEPTION 'poisoned update'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER poison_t BEFORE UPDATE ON tasks
                FOR EACH ROW EXECUTE FUNCTION poison_t();`);
        try {
            const env = await taskSetup(gw, { fixture: 'task-batch.js', vendors: [v], models: 1 });
            v.pollAnswer = (id, n) => {
                if (id === bad) {
                    return running({ progress: 'poison' });
                }
                if (id === nul) {
                    return running({ progress: 'a\u0000b' });
                }
                return n < 2 ? running() : { body: { status: 'done' } };
            };
            const rs = await Promise.all([nul, bad, ...oks].map((up) =>
                submitTask(gw, env, { model: env.model, up_id: up })));
            rs.forEach((r) => assertOk(r, 'submit'));
            const [tNul, tBad, ...tOks] = rs.map((r) => r.json.task_id);
            for (const id of tOks) {
                await waitStatus(gw, env.acct.key, id, 'SUCCESS', { ms: 10000 });
                await waitLedger(db, id, ['reserve', 'settle']);
            }
            /* the NUL is stored as U+FFFD */
            await waitTask(gw, env.acct.key, tNul, (t) => t.progress === 'a\uFFFDb',
                { what: 'the progress of the NUL task' });
            /* the refused task: a failed poll each time, then FAILURE, refunded */
            const vb = await waitStatus(gw, env.acct.key, tBad, 'FAILURE', { ms: 10000 });
            assert.match(JSON.stringify(vb), /could not be saved/);
            const led = await waitLedger(db, tBad, ['reserve', 'refund']);
            assert.equal(led.refund, led.reserve + (led.adjust || 0), JSON.stringify(led));
            assert.ok(v.batches().some((b) => b.json.ids.includes(bad) && b.json.ids.length > 1),
                'the refused task was polled in a batch with others');
            /* two settled, one still running (reserved), one refunded */
            await expectUsed(gw, db, env.acct, 3 * PER_TASK);
            assert.match(gw.errorLog(), /llmgw: polling: .*poisoned update/);
        } finally {
            await psql(db.conninfo, 'DROP TRIGGER poison_t ON tasks; DROP FUNCTION poison_t()');
            await v.close();
        }
    });
});


describe('disabling a channel or a plugin', { timeout: 120000 }, () => {
    const s = vendorSuite({ http: HTTP });

    test('running tasks are still polled to SUCCESS and settled; new submits are refused', async () => {
        const { db, gw, vendor } = s;
        for (const what of ['channel', 'plugin']) {
            const env = await taskSetup(gw, { vendors: [vendor], models: 1 });
            const g = gate();
            const up = uniq('up-off');
            vendor.queuePoll(up, held(g, running()));
            vendor.setPoll(up, { body: { status: 'done' } });
            const r = assertOk(await submitTask(gw, env, { model: env.model, up_id: up }));
            const id = r.json.task_id;
            await waitFor(() => vendor.polls(up).length >= 1, 8000, { what: 'the first poll' });
            const off = what === 'channel'
                ? await gw.admin('PATCH', `/api/channel/${env.channels[0].id}`, { status: 'disabled' })
                : await gw.admin('PATCH', `/api/plugin/task/${env.key}`, { enabled: false });
            assertOk(off, `disable the ${what}`);
            await sleep(1500);      /* every worker has the new configuration */
            g.open();
            await waitStatus(gw, env.acct.key, id, 'SUCCESS', { ms: 10000 });
            const led = await waitLedger(db, id, ['reserve', 'settle']);
            assert.ok(!('refund' in led), `settled, not refunded (${what}): ${JSON.stringify(led)}`);
            assert.equal(await pollFailures(db, id), 0, 'no poll counted as failed');
            const again = await submitTask(gw, env, { model: env.model, up_id: uniq('up-new') });
            assert.ok(again.status >= 400, `a new submit after disabling the ${what}: ${again.status}`);
        }
    });

    test('a deleted channel: its running task fails and is refunded', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor], models: 1 });
        const up = uniq('up-del');
        vendor.setPoll(up, running());
        const r = assertOk(await submitTask(gw, env, { model: env.model, up_id: up }));
        await waitFor(() => vendor.polls(up).length >= 1, 8000, { what: 'the first poll' });
        assertOk(await gw.admin('DELETE', `/api/channel/${env.channels[0].id}`));
        await waitStatus(gw, env.acct.key, r.json.task_id, 'FAILURE', { ms: 10000 });
        const led = await waitLedger(db, r.json.task_id, ['reserve', 'refund']);
        assert.equal(led.refund, led.reserve + (led.adjust || 0), JSON.stringify(led));
    });

    test('a plugin with a running task: DELETE is 409; forced, the task fails after its polls and is refunded', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor], models: 1 });
        const up = uniq('up-pdel');
        vendor.setPoll(up, running());
        const r = assertOk(await submitTask(gw, env, { model: env.model, up_id: up }));
        const id = r.json.task_id;
        await waitFor(() => vendor.polls(up).length >= 1, 8000, { what: 'the first poll' });
        assertError(await gw.admin('DELETE', `/api/plugin/task/${env.key}`), 409, {
            code: 'conflict',
            message: `plugin ${env.key} has 1 unfinished tasks; delete with force`,
        });
        assertOk(await gw.admin('GET', `/api/plugin/task/${env.key}`), 'still there');
        assertOk(await gw.admin('DELETE', `/api/plugin/task/${env.key}?force=1`), 'DELETE with force');
        const v = await waitStatus(gw, env.acct.key, id, 'FAILURE', { ms: 10000 });
        assert.match(v.fail_reason, new RegExp(`polling failed ${MAX_FAILURES} times in a row: ` +
            `the plugin ${env.key} was deleted`));
        const led = await waitLedger(db, id, ['reserve', 'refund']);
        assert.equal(led.refund, led.reserve + (led.adjust || 0), JSON.stringify(led));
    });
});

describe('a pass larger than its lease', { timeout: 120000 }, () => {
    /* one poll at a time per channel, each 250 ms, a 2 s lease: a poll
       started before 3/4 of the lease ends before the lease does, with
       250 ms to spare for the rest of its job */
    const s = vendorSuite({
        workers: 2,
        http: `${HTTP}\n  llmgw_task_lease 2s;\n  llmgw_task_poll_concurrency 1;`,
    });

    test('jobs still waiting when most of their lease is gone are left to a later pass: never two polls of one task at once', async () => {
        const { gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor], models: 1 });
        vendor.pollAnswer = () => ({ ...running(), before: () => sleep(250) });
        const ups = Array.from({ length: 16 }, () => uniq('up-lease'));
        const rs = await Promise.all(ups.map((up) =>
            submitTask(gw, env, { model: env.model, up_id: up })));
        rs.forEach((r) => assertOk(r, 'submit'));
        await sleep(6000);
        for (const up of ups) {
            const polls = vendor.polls(up).sort((a, b) => a.t - b.t);
            assert.ok(polls.length >= 1, `${up} was polled`);
            for (let i = 1; i < polls.length; i++) {
                assert.ok(polls[i].t >= polls[i - 1].tEnd,
                    `two polls of ${up} at once: ${polls.map((p) => `${p.t}-${p.tEnd}`)}`);
            }
        }
        assert.match(gw.errorLog(), /poll jobs waited through 3\/4 of llmgw_task_lease/);
    });
});

describe('a poll longer than its lease', { timeout: 120000 }, () => {
    const s = vendorSuite({
        workers: 2,
        http: `${HTTP}\n  llmgw_task_lease 2s;\n  llmgw_task_poll_concurrency 1;`,
    });

    test('times out before the lease ends and counts: a vendor that never answers fails the task, refunded once', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor], models: 1 });
        const up = uniq('up-long');
        /* every poll of it takes 3 s: longer than 7/8 of the lease (1.75 s),
           shorter than llmgw_task_http_timeout (60 s) */
        vendor.pollAnswer = () => ({ ...running(), before: () => sleep(3000) });
        const r = await submitTask(gw, env, { model: env.model, up_id: up });
        assertOk(r, 'submit');
        const t0 = Date.now();
        const v = await waitStatus(gw, env.acct.key, r.json.task_id, 'FAILURE', { ms: 30000 });
        assert.match(v.fail_reason, new RegExp(`polling failed ${MAX_FAILURES} times in a row: .*timed out`),
            v.fail_reason);
        assert.ok(Date.now() - t0 < 25000, `failed after ${Date.now() - t0} ms`);
        const polls = vendor.polls(up).sort((a, b) => a.t - b.t);
        assert.equal(polls.length, MAX_FAILURES, `${polls.length} polls`);
        for (let i = 1; i < polls.length; i++) {
            assert.ok(polls[i].t >= polls[i - 1].tEnd,
                `two polls at once: ${polls.map((p) => `${p.t}-${p.tEnd}`)}`);
        }
        /* each gave up within the lease: before 7/8 of it */
        for (const p of polls) {
            assert.ok(p.tEnd - p.t < 1750, `a poll held ${p.tEnd - p.t} ms`);
        }
        const led = await waitLedger(db, r.json.task_id, ['reserve', 'refund']);
        assert.equal(led.refund, led.reserve);
        await expectUsed(gw, db, env.acct, 0);
    });
});

describe('a worker told to stop while polls run and wait', { timeout: 120000 }, () => {
    /* one poll at a time per channel, each 8 s */
    const s = vendorSuite({
        workers: 1,
        http: `${HTTP}\n  llmgw_task_poll_concurrency 1;`,
    });

    test('gives up the poll under way, starts none of the others, and gives the tasks back', async () => {
        const { db, gw, vendor } = s;
        const env = await taskSetup(gw, { vendors: [vendor], models: 1 });
        vendor.pollAnswer = () => ({ ...running(), before: () => sleep(8000) });
        const ups = Array.from({ length: 4 }, () => uniq('up-quit'));
        const rs = await Promise.all(ups.map((up) =>
            submitTask(gw, env, { model: env.model, up_id: up })));
        rs.forEach((r) => assertOk(r, 'submit'));
        await waitFor(() => ups.some((up) => vendor.polls(up).length > 0), 10000,
            { what: 'a poll under way' });
        const t0 = Date.now();
        await gw.stop();
        const took = Date.now() - t0;
        assert.equal(gw.killed, false);
        /* not the 8 s of the poll under way */
        assert.ok(took < 2500, `quit took ${took} ms`);
        assert.equal(ups.filter((up) => vendor.polls(up).length > 0).length, 1,
            'one poll only');
        const held = await psql(db.conninfo, 'select count(*), ' +
            'count(*) filter (where lease_owner is not null) from tasks ' +
            `where upstream_task_id in (${ups.map((u) => `'${u}'`).join(',')})`);
        assert.equal(held, '4|0', 'the claims are given back');
    });
});

describe('a worker told to stop while parse hooks run', { timeout: 120000 }, () => {
    const LEASE = '20s';
    const http = `${HTTP}\n  llmgw_task_lease ${LEASE};`;
    let db, gw, gw2, vendor;

    before(async () => {
        db = await createDb();
        vendor = await startVendor();
        gw = await startGateway({ db, v8host: true, http });
    });

    after(() => tearDown(db, [gw, gw2].filter(Boolean), [vendor]));

    test('drops the hooks, exits at once, counts nothing, and another gateway finishes the tasks at once', async () => {
        const env = await taskSetup(gw, { vendors: [vendor] });
        const acct = await account(gw);
        const tasks = [];
        for (let i = 0; i < 3; i++) {
            const up = uniq('up-hook');
            /* the second poll's parse hook runs 4 s */
            vendor.queuePoll(up, running(), running({ spin: 4000 }));
            vendor.setPoll(up, { body: { status: 'done' } });
            const r = assertOk(await submitTask(gw, env, { model: env.model, up_id: up },
                { key: acct.key }), 'submit');
            tasks.push({ id: r.json.task_id, up });
        }
        await waitFor(() => tasks.every((t) => vendor.polls(t.up).length >= 2), 10000,
            { what: 'the second polls' });
        await sleep(300);

        const t0 = Date.now();
        const exit = new Promise((resolve) => gw.proc.once('exit', resolve));
        gw.proc.kill('SIGQUIT');
        await Promise.race([exit, sleep(6000)]);
        const took = Date.now() - t0;
        /* not the 4 s of the hooks under way, nor llmgw_v8host_timeout */
        assert.ok(took < 2000, `quit took ${took} ms`);
        assert.doesNotMatch(gw.errorLog(), /did not answer in time|plugin runtime is unavailable/);
        const rows = await psql(db.conninfo, 'select count(*), count(*) filter (where ' +
            'lease_owner is null and poll_failures = 0) from tasks where task_id in ' +
            `(${tasks.map((t) => `'${t.id}'`).join(',')})`);
        assert.equal(rows, '3|3', 'the claims are given back, nothing counted');

        /* claimed at once, not after the 20 s lease */
        const t1 = Date.now();
        gw2 = await startGateway({ db, v8host: true, http, rootToken: gw.rootToken });
        for (const t of tasks) {
            await waitStatus(gw2, acct.key, t.id, 'SUCCESS', { ms: 10000 });
            /* one row of each (waitLedger refuses two) */
            await waitLedger(db, t.id, ['reserve', 'settle']);
        }
        assert.ok(Date.now() - t1 < 15000, `finished after ${Date.now() - t1} ms`);
        await expectUsed(gw2, db, acct, 3 * PER_TASK);
    });
});

describe('two nodes on one database poll 1,000 tasks', { timeout: 180000 }, () => {
    let db, a, b, vendor;

    before(async () => {
        db = await createDb();
        vendor = await startVendor();
        a = await startGateway({ db, v8host: true, http: HTTP });
        b = await startGateway({ db, v8host: true, http: HTTP, rootToken: a.rootToken });
    });

    after(async () => {
        try {
            await stopAll(a, b);
        } finally {
            await vendor?.close();
            await dropDb(db);
        }
    });

    test('every task SUCCESS, settled exactly once, the ledger balanced to the unit', async () => {
        const N = 1000;
        const env = await taskSetup(a, { vendors: [vendor], price: 'unit', models: 1 });
        /* a small delay makes two overlapping polls of one task visible */
        vendor.pollAnswer = (id, n) => (n >= 2
            ? { delayMs: 10, body: { status: 'done', seconds: 2 } }
            : { delayMs: 10, body: { status: 'running' } });

        const t0 = Date.now();
        const rs = await mapLimit(Array.from({ length: N }, (_, i) => i), 32, (i) =>
            submitTask(i % 2 ? b : a, env, { model: env.model, duration: 1 }));
        const bad = rs.filter((r) => r.status !== 200);
        assert.equal(bad.length, 0, `failed submits: ${bad.slice(0, 3).map((r) => r.text)}`);
        const ids = rs.map((r) => r.json.task_id);
        assert.equal(new Set(ids).size, N, 'distinct task ids');
        const tSubmitted = Date.now() - t0;

        const tok = Number(env.acct.token.id);
        await waitFor(async () => Number(await psql(db.conninfo,
            `select count(*) from logs where token_id = ${tok} and type = 'settle'`)) === N,
        45000, { what: `${N} settle rows`, intervalMs: 500 });
        const tAll = Date.now() - t0;

        const views = await mapLimit(ids, 32, (id, i) => getTask(i % 2 ? a : b, env.acct.key, id));
        const notDone = views.filter((r) => r.status !== 200 || r.json.status !== 'SUCCESS');
        assert.equal(notDone.length, 0, `not SUCCESS: ${notDone.slice(0, 3).map((r) => r.text)}`);

        const twice = await psql(db.conninfo,
            `select count(*) from (select request_id, type from logs where token_id = ${tok}
              group by request_id, type having count(*) > 1) d`);
        assert.equal(twice, '0', 'one row per task and type');
        const perType = JSON.parse(await psql(db.conninfo,
            `select json_object_agg(type, n) from (select type, count(distinct request_id) n
               from logs where token_id = ${tok} group by type) x`));
        assert.equal(perType.reserve, N, JSON.stringify(perType));
        assert.equal(perType.settle, N, JSON.stringify(perType));
        assert.equal(perType.refund, undefined, JSON.stringify(perType));
        const sample = await ledgerRows(db, ids[0]);
        assert.deepEqual(sample.map((r) => r.type).sort(), ['reserve', 'settle']);
        await expectUsed(a, db, env.acct, N * 2 * PER_SECOND, { ms: 15000 });

        /* never two polls of one task at a time, and none after SUCCESS */
        const byId = new Map();
        for (const p of vendor.polls()) {
            if (!byId.has(p.upId)) {
                byId.set(p.upId, []);
            }
            byId.get(p.upId).push(p);
        }
        assert.equal(byId.size, N);
        for (const [id, ps] of byId) {
            ps.sort((x, y) => x.t - y.t);
            for (let i = 1; i < ps.length; i++) {
                assert.ok(ps[i].t >= ps[i - 1].tEnd,
                    `overlapping polls of ${id}: ${ps.map((p) => [p.t, p.tEnd])}`);
            }
            assert.equal(ps.length, 2, `${id} polled ${ps.length} times`);
        }
        console.log(`# ${N} tasks: submitted in ${tSubmitted} ms, all settled after ${tAll} ms`);
    });
});

describe('a worker killed mid-poll', { timeout: 120000 }, () => {
    let db, gw, vendor;
    const LEASE_MS = 2000;

    before(async () => {
        db = await createDb();
        vendor = await startVendor();
        gw = await startGateway({
            db, v8host: true, http: `${HTTP}\n  llmgw_task_lease ${LEASE_MS}ms;`,
        });
    });

    after(async () => {
        try {
            await stopAfterKill(gw);
        } finally {
            await vendor?.close();
            await dropDb(db);
        }
    });

    test('SIGKILL of the polling worker: after the lease another worker finishes the task', async () => {
        const env = await taskSetup(gw, { vendors: [vendor] });
        const up = uniq('up');
        /* the first poll never gets an answer; later ones say done and
           note which worker asked */
        vendor.queuePoll(up, { before: () => new Promise(() => {}) });
        vendor.pollAnswer = (i, n, rec) => {
            rec.pid = pidOwningPort(rec.remotePort, gw.workerPids());
            return { body: { status: 'done' } };
        };
        const r = assertOk(await submitTask(gw, env, { model: env.model, up_id: up }));
        const id = r.json.task_id;

        await waitFor(() => vendor.polls(up).length >= 1, 5000, { what: 'the first poll' });
        const first = vendor.polls(up)[0];
        const workers = gw.workerPids();
        const pid = pidOwningPort(first.remotePort, workers);
        assert.ok(pid, `no worker of ${workers} holds the poll connection (port ${first.remotePort})`);
        const tKill = Date.now();
        process.kill(pid, 'SIGKILL');
        await waitFor(() => first.closed, 3000, { what: 'the held poll closed by the kill' });

        const v = await waitStatus(gw, env.acct.key, id, 'SUCCESS', { ms: LEASE_MS + 10000 });
        assert.ok(!TERMINAL.includes(r.json.status));
        const later = vendor.polls(up).slice(1);
        assert.ok(later.length >= 1, 'polled again');
        assert.ok(later[0].t >= tKill, 'the next poll came after the kill');
        assert.ok(later[0].pid, 'a live worker of this gateway polled again');
        assert.notEqual(later[0].pid, pid);
        assert.ok(v.finished_at, JSON.stringify(v));
        const led = await waitLedger(db, id, ['reserve', 'settle']);
        assert.equal(led.reserve, PER_TASK);
        await expectUsed(gw, db, env.acct, PER_TASK);
    });
});


describe('hook frames over llmgw_v8host_max_frame', { timeout: 120000 }, () => {
    let db, gw, vendor, env;

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true,
            http: `${HTTP}\n  llmgw_v8host_max_frame 64k;` });
        vendor = await startVendor();
        env = await taskSetup(gw, { vendors: [vendor] });
    });

    after(() => tearDown(db, [gw], [vendor]));

    async function failsCounted(answer, reason) {
        const acct = await account(gw);
        const up = uniq('up');
        vendor.queuePoll(up, answer, answer, answer);
        const r = assertOk(await submitTask(gw, env, { model: env.model, up_id: up },
            { key: acct.key }), 'submit');
        const v = await waitStatus(gw, acct.key, r.json.task_id, 'FAILURE', { ms: 8000 });
        assert.match(v.fail_reason, reason);
        assert.equal(vendor.polls(up).length, MAX_FAILURES, 'each poll counted once');
        const led = await waitLedger(db, r.json.task_id, ['reserve', 'refund']);
        assert.equal(led.refund, led.reserve, JSON.stringify(led));
        await expectUsed(gw, db, acct, 0);
    }

    test('a result larger than the frame: each poll counts, the task fails and is refunded', async () => {
        await failsCounted({ body: { status: 'done', grow: 100 * 1024 } },
            /parseTaskResult failed: the result is \d+ bytes of JSON, over llmgw_v8host_max_frame/);
    });

    test('an upload whose source is over the frame: 413 request_too_large, nothing stored', async () => {
        const source = pluginSource('task-vendor.js', { key: 'itest-big-frame', models: ['itest-big-1'] })
            + `\n/* ${'z'.repeat(70 * 1024)} */\n`;
        const r = await gw.admin('POST', '/api/plugin/task', { source, enabled: false });
        assertError(r, 413, { code: 'request_too_large',
            message: 'the source or the arguments are larger than llmgw_v8host_max_frame' });
        assertError(await gw.admin('GET', '/api/plugin/task/itest-big-frame'), 404);
    });

    test('a vendor answer too large to hand to the hook: each poll counts, the task fails', async () => {
        await failsCounted({ body: { status: 'running', result: 'y'.repeat(100 * 1024) } },
            /parseTaskResult failed: its arguments are larger than llmgw_v8host_max_frame/);
    });
});

describe('one channel whose polls are slow', { timeout: 120000 }, () => {
    /* one worker, one poll at a time per channel: the slow channel's poll
       takes 3 s, during which the fast channel is due every 200 ms */
    let db, gw, slow, fast;

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true, workers: 1,
            http: `${HTTP}\n  llmgw_task_poll_concurrency 1;` });
        slow = await startVendor();
        fast = await startVendor();
    });

    after(() => tearDown(db, [gw], [slow, fast]));

    test('holds up no other channel\'s polling, and its own tasks are not polled twice at once', async () => {
        const envSlow = await taskSetup(gw, { vendors: [slow], models: 1 });
        const envFast = await taskSetup(gw, { vendors: [fast], models: 1 });
        slow.pollAnswer = () => ({ ...running(), before: () => sleep(3000) });
        const upSlow = [uniq('up-slow'), uniq('up-slow')];
        const upFast = uniq('up-fast');
        for (const up of upSlow) {
            assertOk(await submitTask(gw, envSlow, { model: envSlow.model, up_id: up }), 'slow submit');
        }
        assertOk(await submitTask(gw, envFast, { model: envFast.model, up_id: upFast }), 'fast submit');

        /* a slow poll has begun: count the fast channel's polls while it runs */
        await waitFor(() => upSlow.some((up) => slow.polls(up).length > 0), 5000,
            { what: 'a slow poll' });
        const from = Date.now();
        await sleep(2500);
        const during = fast.polls(upFast).filter((p) => p.t >= from && p.t < from + 2500);
        assert.ok(during.length >= 4,
            `the fast channel was polled ${during.length} times in 2.5 s of a 3 s slow poll`);

        /* the slow channel had room for one poll at a time, and got it */
        await sleep(4000);
        const all = upSlow.flatMap((up) => slow.polls(up)).sort((a, b) => a.t - b.t);
        assert.ok(all.length >= 2, `slow polls: ${all.length}`);
        for (let i = 1; i < all.length; i++) {
            assert.ok(all[i - 1].tEnd > 0 && all[i].t >= all[i - 1].tEnd,
                `two slow polls at once: ${all.map((p) => `${p.t}-${p.tEnd}`)}`);
        }
    });
});
