// Task-engine load for bench/tasks.sh (Node 20 built-ins only).
//
//   node tasks-client.mjs setup --url GW --token ROOT --plugin K --model M
//            --vendor URL --vendor-key VK [--price USD]
//       uploads and enables the benchmark plugin (PLUGIN_SOURCE below,
//       meta.key K, models [M], per_task), prices M per call (PUT
//       /api/pricing {M: {price: USD}}, 0 = free), creates a type-61 channel
//       {base_url: URL, key: VK, models: [M], settings: {task_plugin_key: K}},
//       a user with a big quota and an unlimited key, then submits until 3
//       in a row answer 200 (bounded: 20 s; the configuration reaches every
//       worker within about 1 s).  Prints the key.
//
//   node tasks-client.mjs submit --url GW --key KEY --plugin K --model M
//            --n N --conc C --timeout-s S [--cpu-roots label=pid,...]
//       N submits POST /v1/tasks/K {"model": M}, at most C in flight over a
//       keep-alive agent of C sockets, closed loop; each request times out
//       after 30 s and the run stops issuing after S seconds.  Prints one
//       JSON line: {n, sent, ok, non2xx, errors, wallMs, rps, p50, p90, p99,
//       max (ms), statuses, samples (first distinct failures), cpu}.
//
//   node tasks-client.mjs poll-cycle --vendor URL --n N --conninfo PG
//            --min-id ID --timeout-s S [--cpu-roots ...] [--sample-ms 50]
//       one full poll cycle of the N measured tasks: tells the vendor to
//       note first polls from now (mark-poll), makes the measured tasks
//       (tasks.id > ID) due now and the older ones (set-up probes) due in an
//       hour, in one psql statement, then samples the vendor's counters
//       until every measured task was polled once or S seconds pass.
//       Prints one JSON line: {n, polled, updated, updateMs, firstMs, lastMs,
//       polls, unknownPolls, cpu (first poll .. last), timeline: [per second
//       from the first poll: {t, polled, cpu}], firsts: {p50, p90, p99}}.
//
//   node tasks-client.mjs report --submit F --poll F --vendor F
//            --vendor-poll F [--funcs A,B,C,D]
//       the figures bench/tasks.sh prints, from the JSON of submit and
//       poll-cycle, the vendor's counters after the submits and before the
//       cycle, and pg_stat_user_functions before/after each phase (psql -At
//       "name|calls|total|self" files); settings in BENCH_* variables.
//
// Every command has a deadline; every request a timeout.

import { execFile } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import { performance } from 'node:perf_hooks';

import { diff as cpuDiff, fmt as cpuFmt, snapshot as cpuSnap } from './cpu.mjs';
import { request } from './http.mjs';

const clock = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* The benchmark plugin: per_task, the shapes of the engine's test fixture
 * (t/integration/fixtures/plugins/task-vendor.js), nothing else. */
export const PLUGIN_SOURCE = (key, model) => `// llmgw bench/tasks.sh plugin.
export const meta = {
  apiVersion: 1,
  key: ${JSON.stringify(key)},
  name: 'Benchmark tasks',
  version: '1.0.0',
  author: { name: 'llmgw bench' },
  description: 'Submits to the bench/tasks.sh mock vendor and polls one task at a time',
  models: [${JSON.stringify(model)}],
  fetchMode: 'per_task',
  auth: 'api_key',
};

export function buildSubmitRequest(ctx) {
  return {
    url: ctx.baseUrl + '/submit',
    method: 'POST',
    headers: { Authorization: ctx.authHeader },
    body: { model: ctx.upstreamModel, task: ctx.publicTaskId },
  };
}

export function parseSubmitResponse(ctx, res) {
  if (!res.body || typeof res.body.id !== 'string') {
    throw new Error('the vendor answered without a task id');
  }
  return { taskId: res.body.id };
}

export function buildQueryRequest(ctx) {
  return {
    url: ctx.baseUrl + '/tasks/' + encodeURIComponent(ctx.taskId),
    method: 'GET',
    headers: { Authorization: ctx.authHeader },
  };
}

const STATUS = { queued: 'QUEUED', running: 'IN_PROGRESS', done: 'SUCCESS', failed: 'FAILURE' };

export function parseTaskResult(ctx, body) {
  const status = (body && STATUS[body.status]) || 'UNKNOWN';
  return status === 'FAILURE' ? { status, reason: String(body.error || 'failed') } : { status };
}
`;

function args(argv) {
    const o = {};
    for (let i = 0; i < argv.length; i += 2) {
        o[argv[i].replace(/^--/, '')] = argv[i + 1];
    }
    return o;
}

function need(o, ...names) {
    for (const n of names) {
        if (o[n] === undefined) {
            throw new Error(`--${n} is required`);
        }
    }
}

function deadline(ms, what) {
    setTimeout(() => {
        console.error(`tasks-client.mjs ${what}: did not finish within ${ms / 1000} s`);
        process.exit(1);
    }, ms).unref();
}

const roots = (o) => (o['cpu-roots'] || `load=${process.pid}`).split(',').filter(Boolean);

function pct(sorted, p) {
    if (!sorted.length) {
        return NaN;
    }
    return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p / 100 * sorted.length) - 1))];
}

/* ---------------------------------------------------------------- setup */

async function setup(o) {
    need(o, 'url', 'token', 'plugin', 'model', 'vendor', 'vendor-key');
    deadline(60000, 'setup');
    const admin = async (method, path, body) => {
        const r = await request(o.url, o.token, method, path, body);
        if (r.status !== 200 || !r.json) {
            throw new Error(`${method} ${path}: ${r.status} ${r.text.slice(0, 500)}`);
        }
        return r.json;
    };
    const model = o.model;
    await admin('POST', '/api/plugin/task',
        { source: PLUGIN_SOURCE(o.plugin, model), enabled: true, remark: 'bench/tasks.sh' });
    await admin('PUT', '/api/pricing', { [model]: { price: Number(o.price || 0) } });
    await admin('POST', '/api/channel', {
        name: 'bench-tasks', type: 61, base_url: o.vendor, key: o['vendor-key'],
        models: [model], groups: ['default'], priority: 0, weight: 1,
        settings: { task_plugin_key: o.plugin },
    });
    const u = await admin('POST', '/api/user', {
        username: 'bench-tasks-user', quota: 1000000000000, group: 'default',
    });
    const t = await admin('POST', '/api/token', {
        user_id: u.id, name: 'bench-tasks-key', unlimited_quota: true,
        remain_quota: 0, expired_time: -1,
    });
    const end = Date.now() + 20000;
    let good = 0;
    let last = '';
    while (good < 3) {
        if (Date.now() > end) {
            throw new Error(`submits not served in 20 s: ${last}`);
        }
        const r = await request(o.url, t.key, 'POST', `/v1/tasks/${o.plugin}`, { model });
        last = `${r.status} ${r.text.slice(0, 300)}`;
        good = r.status === 200 && r.json && typeof r.json.task_id === 'string' ? good + 1 : 0;
        if (!good) {
            await sleep(100);
        }
    }
    process.stdout.write(`${t.key}\n`);
}

/* --------------------------------------------------------------- submit */

function oneSubmit(agent, u, path, headers, body, timeoutMs) {
    return new Promise((resolve) => {
        const t0 = performance.now();
        let done = false;
        const finish = (status, text, err) => {
            if (!done) {
                done = true;
                resolve({ status, text, err, ms: performance.now() - t0 });
            }
        };
        const req = http.request({
            host: u.hostname, port: u.port, path, method: 'POST', agent, headers,
            timeout: timeoutMs,
        }, (res) => {
            const parts = [];
            res.on('data', (ch) => parts.push(ch));
            res.on('end', () => finish(res.statusCode, Buffer.concat(parts).toString('utf8'), ''));
            res.on('error', (e) => finish(res.statusCode, '', e.message));
        });
        req.on('timeout', () => req.destroy(new Error('timed out')));
        req.on('error', (e) => finish(0, '', e.message));
        req.end(body);
    });
}

async function submit(o) {
    need(o, 'url', 'key', 'plugin', 'model');
    const n = Number(o.n || 10000);
    const conc = Number(o.conc || 64);
    const budget = Number(o['timeout-s'] || 120) * 1000;
    if (!(n >= 1 && n <= 1000000 && conc >= 1 && conc <= 4096 && budget > 0 && budget <= 600000)) {
        throw new Error('--n 1..1000000, --conc 1..4096, --timeout-s 1..600');
    }
    deadline(budget + 45000, 'submit');
    const u = new URL(o.url);
    const path = `/v1/tasks/${o.plugin}`;
    const body = JSON.stringify({ model: o.model });
    const headers = {
        Authorization: `Bearer ${o.key}`, 'Content-Type': 'application/json',
        'Content-Length': Buffer.byteLength(body),
    };
    const agent = new http.Agent({ keepAlive: true, maxSockets: conc, maxFreeSockets: conc });
    const lat = new Float64Array(n);
    const statuses = {};
    const samples = new Map();
    let sent = 0;
    let answered = 0;
    let ok = 0;
    let errors = 0;
    const cpu0 = cpuSnap(roots(o));
    const t0 = performance.now();
    const stopAt = t0 + budget;

    async function lane() {
        while (sent < n && performance.now() < stopAt) {
            sent++;
            const r = await oneSubmit(agent, u, path, headers, body, 30000);
            lat[answered++] = r.ms;
            statuses[r.status || 'none'] = (statuses[r.status || 'none'] || 0) + 1;
            if (r.status === 200) {
                ok++;
            } else {
                if (!r.status) {
                    errors++;
                }
                const what = `${r.status} ${r.err || r.text.slice(0, 300)}`;
                if (samples.size < 5 && !samples.has(what)) {
                    samples.set(what, 1);
                }
            }
        }
    }
    await Promise.all(Array.from({ length: Math.min(conc, n) }, lane));
    const wallMs = performance.now() - t0;
    const cpu = cpuDiff(cpu0, cpuSnap(roots(o)));
    agent.destroy();
    const s = lat.subarray(0, answered).sort();
    const res = {
        n, sent, answered, ok, non2xx: answered - ok - errors, errors, wallMs,
        rps: answered / (wallMs / 1000), okRps: ok / (wallMs / 1000),
        p50: pct(s, 50), p90: pct(s, 90), p99: pct(s, 99), max: s.length ? s[s.length - 1] : NaN,
        statuses, samples: [...samples.keys()], cpu, cpuText: cpuFmt(cpu),
        stoppedEarly: sent < n,
    };
    process.stdout.write(`${JSON.stringify(res)}\n`);
}

/* ----------------------------------------------------------- poll cycle */

async function vendorCall(base, method, path) {
    const r = await request(base, 'unused', method, path, undefined, 5000);
    if (r.status !== 200 || r.json === undefined) {
        throw new Error(`vendor ${method} ${path}: ${r.status} ${r.text.slice(0, 300)}`);
    }
    return r.json;
}

function psql(conninfo, sql) {
    return new Promise((resolve, reject) => {
        execFile('psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-At', '-d', conninfo, '-c', sql],
            { timeout: 60000 }, (err, stdout, stderr) => {
                if (err) {
                    reject(new Error(`psql: ${stderr || err.message}`));
                } else {
                    resolve(stdout.trim());
                }
            });
    });
}

async function pollCycle(o) {
    need(o, 'vendor', 'n', 'conninfo', 'min-id');
    const n = Number(o.n);
    const budget = Number(o['timeout-s'] || 120) * 1000;
    const sampleMs = Number(o['sample-ms'] || 50);
    const minId = Number(o['min-id']);
    if (!(n >= 1 && budget > 0 && budget <= 600000 && sampleMs >= 10 && Number.isInteger(minId))) {
        throw new Error('--n >= 1, --timeout-s 1..600, --sample-ms >= 10, --min-id an integer');
    }
    deadline(budget + 30000, 'poll-cycle');
    const rts = roots(o);

    const { markAt } = await vendorCall(o.vendor, 'POST', '/_bench/mark-poll');
    const cpuMark = cpuSnap(rts);
    /* one statement: the measured tasks due now, the set-up probes later */
    const out = await psql(o.conninfo,
        `with a as (update tasks set next_poll_at = case when id > ${minId} then now() ` +
        `else now() + interval '1 hour' end where status not in ('SUCCESS', 'FAILURE') ` +
        `returning id) select count(*) filter (where id > ${minId}) from a`);
    const updateMs = clock() - markAt;
    const updated = Number(out);

    let first = null;           /* {cpu, t} at the first poll seen */
    let st = null;
    const timeline = [];
    let prev = null;            /* {t, cpu} of the last timeline point */
    const end = markAt + budget;
    for (;;) {
        st = await vendorCall(o.vendor, 'GET', '/_bench/stats');
        const t = clock();
        if (!first && st.pollsSinceMark > 0) {
            first = { cpu: cpuSnap(rts), t };
            prev = { t, cpu: first.cpu };
        }
        if (first && (t - prev.t >= 1000 || st.polledMeasured >= n)) {
            const cpu = cpuSnap(rts);
            const d = cpuDiff(prev.cpu, cpu);
            timeline.push({
                t: Math.round(t - first.t), polled: st.polledMeasured, polls: st.pollsSinceMark,
                per: d.per, other: d.other, idle: d.idle, text: cpuFmt(d),
            });
            prev = { t, cpu };
        }
        if (st.polledMeasured >= n || t > end) {
            break;
        }
        await sleep(sampleMs);
    }
    const cpuEnd = cpuSnap(rts);
    const tEnd = clock();
    const firsts = await vendorCall(o.vendor, 'GET', '/_bench/firsts');
    const f = Float64Array.from(firsts);
    const fFirst = f.length ? f[0] : NaN;
    const res = {
        n, updated, updateMs, polled: st.polledMeasured, polls: st.pollsSinceMark,
        unknownPolls: st.unknownPolls, badAuth: st.badAuth, other: st.other,
        connections: st.connections, maxOpen: st.maxOpen,
        firstMs: fFirst, lastMs: f.length ? f[f.length - 1] : NaN,
        /* first polls after the first one, ms: when the cycle got through */
        firsts: {
            p50: pct(f, 50) - fFirst, p90: pct(f, 90) - fFirst, p99: pct(f, 99) - fFirst,
        },
        cpu: first ? cpuDiff(first.cpu, cpuEnd) : null,
        cpuWindowMs: first ? tEnd - first.t : NaN,
        cpuSinceMark: cpuDiff(cpuMark, cpuEnd),
        timeline,
    };
    res.cpuText = res.cpu ? cpuFmt(res.cpu) : '';
    process.stdout.write(`${JSON.stringify(res)}\n`);
}

/* --------------------------------------------------------------- report */

/*
 * CPU time per operation, us, of each label: its share of all cores over
 * the window times the cores and the window, over the operations.
 */
function perOp(cpu, windowMs, count, cores) {
    const us = {};
    for (const l of cpu.labels) {
        us[l] = (cpu.per[l] / 100) * cores * windowMs * 1000 / count;
    }
    return us;
}

function perOpLine(us) {
    const workers = Object.keys(us).filter((l) => l.startsWith('nginx-w'));
    const nginx = workers.reduce((a, l) => a + us[l], 0) + (us['nginx-master'] || 0);
    const f = (x) => (Number.isFinite(x) ? x.toFixed(0) : 'n/a');
    return `nginx ${f(nginx)} us (${workers.map((l) => `${l.slice(6)} ${f(us[l])}`).join(', ')}), ` +
        `helper ${f(us.v8host)} us, PostgreSQL ${f(us.pg)} us, vendor ${f(us.vendor)} us, ` +
        `client ${f(us.load)} us`;
}

/* psql -At output "name|calls|total ms|self ms" -> Map name -> numbers */
function readFuncs(file) {
    const m = new Map();
    for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
        const [name, calls, total, self] = line.split('|');
        if (name && calls !== undefined) {
            const e = m.get(name) || { calls: 0, total: 0, self: 0 };
            e.calls += Number(calls);
            e.total += Number(total);
            e.self += Number(self);
            m.set(name, e);
        }
    }
    return m;
}

/* The PostgreSQL functions a phase called: calls, and time per operation. */
function funcLines(out, a, b, count, what) {
    if (!a || !b || !b.size) {
        return;
    }
    const rows = [];
    for (const [name, e] of b) {
        const z = a.get(name) || { calls: 0, total: 0, self: 0 };
        const calls = e.calls - z.calls;
        if (calls > 0) {
            rows.push({ name, calls, total: e.total - z.total, self: e.self - z.self });
        }
    }
    rows.sort((x, y) => y.self - x.self);
    const top = rows.slice(0, 8);
    out.push(`  PostgreSQL functions (track_functions = pl; wall time inside the function, ` +
        `us per ${what}; the biggest by self time):`);
    out.push(`    ${'function'.padEnd(30)} ${'calls'.padStart(8)} ${'total us'.padStart(9)} ${'self us'.padStart(8)}`);
    for (const r of top) {
        out.push(`    ${r.name.padEnd(30)} ${String(r.calls).padStart(8)} ` +
            `${(r.total * 1000 / count).toFixed(0).padStart(9)} ${(r.self * 1000 / count).toFixed(0).padStart(8)}`);
    }
}

function report(o) {
    const read = (f) => JSON.parse(fs.readFileSync(f, 'utf8'));
    const s = read(o.submit);
    const p = read(o.poll);
    const v = read(o.vendor);
    const vp = read(o['vendor-poll']);
    const funcs = (o.funcs || '').split(',').filter(Boolean).map(readFuncs);
    const env = process.env;
    const cores = Number(env.BENCH_CORES || 1);
    const N = Number(env.BENCH_N);
    const f1 = (x) => (Number.isFinite(x) ? x.toFixed(1) : 'n/a');
    const f0 = (x) => (Number.isFinite(x) ? x.toFixed(0) : 'n/a');
    const out = [];
    const warn = [];

    out.push('');
    out.push(`submit: ${s.n} x POST /v1/tasks/<plugin> {"model"}, ${env.BENCH_CONC} in flight` +
        (s.stoppedEarly ? ` (STOPPED at the time budget after ${s.sent})` : ''));
    out.push(`  ${'submits/s'.padStart(10)} ${'p50 ms'.padStart(8)} ${'p90 ms'.padStart(8)} ` +
        `${'p99 ms'.padStart(8)} ${'max ms'.padStart(8)} ${'ok'.padStart(7)} ${'non-2xx'.padStart(8)} ` +
        `${'errors'.padStart(7)} ${'wall s'.padStart(7)}`);
    out.push(`  ${f0(s.okRps).padStart(10)} ${s.p50.toFixed(2).padStart(8)} ${s.p90.toFixed(2).padStart(8)} ` +
        `${s.p99.toFixed(2).padStart(8)} ${s.max.toFixed(1).padStart(8)} ${String(s.ok).padStart(7)} ` +
        `${String(s.non2xx).padStart(8)} ${String(s.errors).padStart(7)} ${(s.wallMs / 1000).toFixed(2).padStart(7)}`);
    out.push(`  answers by status: ${JSON.stringify(s.statuses)}`);
    for (const x of s.samples) {
        out.push(`  failure: ${x}`);
    }
    out.push(`  CPU, % of all ${cores} cores: ${s.cpuText}`);
    out.push(`  CPU per submit: ${perOpLine(perOp(s.cpu, s.wallMs, Math.max(1, s.answered), cores))}`);
    const early = vp.earlyPolls;
    out.push(`  vendor: ${v.measuredSubmits} measured submits (${v.submits} in all) on ${v.connections} ` +
        `connections opened so far (at most ${v.maxOpen} open at once); ` +
        `polls of measured tasks before the poll cycle: ${early}; 401s: ${v.badAuth}; other: ${v.other}`);
    out.push(`  tasks after the submits: ${env.BENCH_STATUS_SUBMIT || '?'}`);
    funcLines(out, funcs[0], funcs[1], Math.max(1, s.answered), 'submit');
    if (s.ok !== s.n) {
        warn.push(`${s.n - s.ok} of ${s.n} submits did not answer 200`);
    }
    if (early > 0) {
        warn.push(`${early} measured tasks were polled before the poll cycle (raise POLL_INTERVAL)`);
    }

    const cycle = p.lastMs - p.firstMs;
    out.push('');
    out.push(`poll cycle: ${p.updated} measured tasks made due at once (UPDATE tasks SET next_poll_at = now(), ` +
        `${f0(p.updateMs)} ms)`);
    out.push(`  UPDATE -> first poll: ${f0(p.firstMs)} ms (waiting for a worker's poll timer, ` +
        'at most the poll interval)');
    out.push(`  first poll -> all ${p.n} polled once: ${p.polled >= p.n ? `${f0(cycle)} ms` : `NOT DONE, ` +
        `${p.polled} of ${p.n} polled in the time budget`}  ` +
        `(half polled after ${f0(p.firsts.p50)} ms, 90% after ${f0(p.firsts.p90)} ms, ` +
        `99% after ${f0(p.firsts.p99)} ms)`);
    out.push(`  polls/s over that window: ${f0(p.polled / (cycle / 1000))}; polls after the mark: ${p.polls}` +
        ` (repeats ${p.polls - p.polled}, of tasks outside the measured set ${p.unknownPolls}); ` +
        `vendor connections opened in all: ${p.connections} (at most ${p.maxOpen} open at once)`);
    out.push(`  tasks after the cycle: ${env.BENCH_STATUS_POLL || '?'}`);
    if (p.cpu) {
        out.push(`  CPU from the first poll to the end, % of all ${cores} cores: ${p.cpuText}`);
        out.push(`  CPU per poll: ${perOpLine(perOp(p.cpu, p.cpuWindowMs, Math.max(1, p.polls), cores))}`);
    }
    funcLines(out, funcs[2], funcs[3], Math.max(1, p.polls), 'poll');
    if (p.timeline.length) {
        const labels = p.cpu.labels.filter((l) => l !== 'load');
        out.push('  timeline from the first poll (CPU % of all cores in each step):');
        out.push(`  ${'t ms'.padStart(7)} ${'polled'.padStart(7)} ${'polls/s'.padStart(8)} ` +
            labels.map((l) => l.padStart(Math.max(6, l.length))).join(' ') +
            ` ${'other'.padStart(6)} ${'idle'.padStart(6)}`);
        let prev = { t: 0, polls: 0 };
        for (const x of p.timeline) {
            const rate = (x.polls - prev.polls) / Math.max(0.001, (x.t - prev.t) / 1000);
            out.push(`  ${String(x.t).padStart(7)} ${String(x.polled).padStart(7)} ${f0(rate).padStart(8)} ` +
                labels.map((l) => f1(x.per[l]).padStart(Math.max(6, l.length))).join(' ') +
                ` ${f1(x.other).padStart(6)} ${f1(x.idle).padStart(6)}`);
            prev = x;
        }
    }
    if (p.badAuth || p.other) {
        warn.push(`the vendor saw ${p.badAuth} requests with a wrong key and ${p.other} to unknown paths`);
    }

    out.push('');
    out.push('targets:');
    const okRps = s.okRps;
    out.push(`  submits >= 1,000/s:                          ${f0(okRps).padStart(7)}/s   ` +
        `${okRps >= 1000 ? 'met' : 'MISSED'}`);
    const done = p.polled >= p.n;
    const secs = cycle / 1000;
    out.push(`  all 10,000 polled within 15 s of the first poll: ${done ? `${secs.toFixed(2)} s` : 'not all'}   ` +
        `${done && secs <= 15 && p.n >= 10000 ? 'met' : (p.n < 10000 && done && secs <= 15
            ? `met for ${p.n} tasks only` : 'MISSED')}`);
    if (p.n !== N) {
        out.push(`  (the cycle covered ${p.n} tasks, not N = ${N})`);
    }
    for (const w of warn) {
        out.push(`WARNING: ${w}`);
    }
    process.stdout.write(`${out.join('\n')}\n`);
}

const [cmd, ...rest] = process.argv.slice(2);
const o = args(rest);
try {
    if (cmd === 'setup') {
        await setup(o);
    } else if (cmd === 'submit') {
        await submit(o);
    } else if (cmd === 'poll-cycle') {
        await pollCycle(o);
    } else if (cmd === 'report') {
        report(o);
    } else {
        throw new Error(`unknown command ${cmd}`);
    }
    process.exit(0);
} catch (e) {
    console.error(`tasks-client.mjs ${cmd}: ${e.message}`);
    process.exit(1);
}
