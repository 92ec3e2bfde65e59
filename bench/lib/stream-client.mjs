// Streaming load client and report for bench/stream.sh (Node built-ins).
//
//   node stream-client.mjs run --targets name=URL,... --dir DIR
//        [--keyed name,...] [--key K] [--n 500] [--rounds 3] [--warmup 50]
//        [--model M] [--chunks 20] [--stagger-ms 50] [--timeout-ms 30000]
//        [--cpu-roots label=pid,...] [--other-max 10] [--retries 2]
//
//     One process for the whole plan: a warm-up batch of `warmup` streams
//     per target, then `rounds` rounds visiting the targets in order (the
//     key goes to the --keyed targets only).  Each batch is N concurrent POST /v1/chat/completions {"stream":true} through one
//     http.Agent (maxSockets N), started over stagger-ms so they do not all
//     tick in the same millisecond.  Per stream it records, against the
//     upstream's own hrtime stamps (x_bench in every chunk; CLOCK_MONOTONIC
//     is shared by all processes):
//       ttft        first content chunk arrival - request issued
//       added ttft  ttft - (upstream first send - upstream request arrival),
//                   i.e. what the path adds in both directions
//       per chunk   arrival - upstream send, for every chunk after the first
//                   (including the final usage chunk)
//     and whether the stream completed: status 200, every chunk in order,
//     the usage chunk and `data: [DONE]`.  Everything is bounded by
//     timeout-ms; streams still open then count as stalled.
//     CPU use during each batch (lib/cpu.mjs, per label=pid root of
//     --cpu-roots) is recorded as a sign of noise and of who was busy; a
//     measured batch during which more than other-max % of the CPU went to
//     processes outside the roots or to steal time is run again (at most `retries` times) and
//     the quietest attempt kept.  DIR/totals.json: streams sent per target.
//     Writes each measured batch's samples as JSON to DIR/<name>-r<i>.json
//     and a one-line summary per batch to stdout.
//
//   node stream-client.mjs report [--targets direct,bare,gateway]
//        [--base bare] [--gw gateway] FILE...
//     (files named <target>-*.json) pools each target's samples, prints
//     p50/p99 per target and the difference gw - base.  Exit status 3 if a
//     stream stalled.

import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

import { diff as cpuDiff, fmt as cpuFmt, snapshot as cpuSnap } from './cpu.mjs';

const now = () => process.hrtime.bigint();
const sleep = (t) => new Promise((r) => setTimeout(r, t));
const ms = (ns) => Number(ns) / 1e6;

function parseArgs(argv) {
    const o = { _: [] };
    for (let i = 0; i < argv.length; i++) {
        if (argv[i].startsWith('--')) {
            o[argv[i].slice(2)] = argv[i + 1];
            i++;
        } else {
            o._.push(argv[i]);
        }
    }
    return o;
}

function pct(sorted, p) {
    if (!sorted.length) {
        return NaN;
    }
    const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p / 100 * sorted.length) - 1));
    return sorted[i];
}

function stats(arr) {
    const s = Float64Array.from(arr).sort();
    return {
        n: s.length, p50: pct(s, 50), p90: pct(s, 90), p99: pct(s, 99),
        max: s.length ? s[s.length - 1] : NaN,
    };
}

function oneStream(agent, u, body, headers, chunks, deadline) {
    return new Promise((resolve) => {
        const rec = {
            status: 0, ttft: NaN, addedTtft: NaN, perChunk: [], seqs: 0,
            usage: false, done: false, error: '', maxGapMs: 0,
        };
        let buf = '';
        let lastArrival = null;
        let nextSeq = 0;
        let finished = false;
        const t0 = now();
        const finish = (err) => {
            if (finished) {
                return;
            }
            finished = true;
            clearTimeout(timer);
            if (err && !rec.error) {
                rec.error = err;
            }
            resolve(rec);
        };
        const req = http.request({
            host: u.hostname, port: u.port, path: '/v1/chat/completions',
            method: 'POST', agent, headers,
        }, (res) => {
            rec.status = res.statusCode;
            res.setEncoding('utf8');
            res.on('data', (text) => {
                const t = now();
                if (lastArrival !== null) {
                    const gap = ms(t - lastArrival);
                    if (gap > rec.maxGapMs) {
                        rec.maxGapMs = gap;
                    }
                }
                lastArrival = t;
                buf += text;
                let i;
                while ((i = buf.search(/\r?\n\r?\n/)) >= 0) {
                    const ev = buf.slice(0, i);
                    buf = buf.slice(i).replace(/^\r?\n\r?\n/, '');
                    const data = ev.split(/\r?\n/).filter((l) => l.startsWith('data:'))
                        .map((l) => l.slice(5).trim()).join('\n');
                    if (!data) {
                        continue;
                    }
                    if (data === '[DONE]') {
                        rec.done = true;
                        continue;
                    }
                    const m = /"x_bench":\{"seq":(\d+),"recv_ns":"(\d+)","sent_ns":"(\d+)"\}/.exec(data);
                    if (!m) {
                        rec.error = rec.error || `chunk without x_bench: ${data.slice(0, 200)}`;
                        continue;
                    }
                    const seq = Number(m[1]);
                    if (seq !== nextSeq) {
                        rec.error = rec.error || `chunk ${seq} arrived when ${nextSeq} was due`;
                    }
                    nextSeq = seq + 1;
                    const sent = BigInt(m[3]);
                    if (seq === 0) {
                        rec.ttft = ms(t - t0);
                        rec.addedTtft = rec.ttft - ms(sent - BigInt(m[2]));
                    } else {
                        rec.perChunk.push(ms(t - sent));
                    }
                    if (seq < chunks) {
                        rec.seqs++;
                    } else if (/"usage":\{/.test(data)) {
                        rec.usage = true;
                    }
                }
            });
            res.on('end', () => finish(res.complete ? '' : 'response not complete'));
            res.on('aborted', () => finish('aborted'));
            res.on('error', (e) => finish(e.message));
        });
        const timer = setTimeout(() => {
            req.destroy();
            finish('timed out');
        }, Math.max(0, deadline - Date.now()));
        req.on('error', (e) => finish(e.message));
        req.end(body);
    });
}

async function batch({ agent, url, key, n, chunks, stagger, timeoutMs, model, target, out, roots }) {
    const u = new URL(url);
    const body = JSON.stringify({
        model, stream: true, messages: [{ role: 'user', content: 'hi' }],
    });
    const headers = {
        'Content-Type': 'application/json',
        'Content-Length': Buffer.byteLength(body),
    };
    if (key) {
        headers.Authorization = `Bearer ${key}`;
    }
    const deadline = Date.now() + timeoutMs;
    const started = Date.now();
    const cpu0 = cpuSnap(roots);
    const all = [];
    for (let i = 0; i < n; i++) {
        all.push(new Promise((resolve) => {
            setTimeout(() => {
                oneStream(agent, u, body, headers, chunks, deadline).then(resolve);
            }, (i * stagger) / n);
        }));
    }
    const recs = await Promise.all(all);
    const cpu = cpuDiff(cpu0, cpuSnap(roots));
    const wall = Date.now() - started;

    const stalled = recs.filter((r) => !(r.status === 200 && r.seqs === chunks &&
        r.usage && r.done && !r.error));
    const res = {
        target, n, chunks, wallMs: wall, cpu,
        completed: n - stalled.length, stalled: stalled.length,
        errors: [...new Set(stalled.map((r) => `${r.status} ${r.error || 'incomplete'} ` +
            `(chunks ${r.seqs}/${chunks}, usage ${r.usage}, done ${r.done})`))].slice(0, 5),
        maxGapMs: Math.max(...recs.map((r) => r.maxGapMs)),
        ttft: recs.map((r) => r.ttft).filter(Number.isFinite),
        addedTtft: recs.map((r) => r.addedTtft).filter(Number.isFinite),
        perChunk: recs.flatMap((r) => r.perChunk),
    };
    const a = stats(res.addedTtft);
    const c = stats(res.perChunk);
    console.log(`${path.basename(out || 'warm-up ' + target)}: ${res.completed}/${n} streams complete, ` +
        `added TTFT p50 ${a.p50.toFixed(3)} p99 ${a.p99.toFixed(3)} ms, ` +
        `per chunk p50 ${c.p50.toFixed(3)} p99 ${c.p99.toFixed(3)} ms, wall ${wall} ms, ` +
        `cpu: ${cpuFmt(cpu)}`);
    return res;
}

/*
 * One process for the whole plan, so that every target meets the same
 * warmed-up client: a warm-up batch per target, then ROUNDS rounds that
 * visit the targets in order.
 */
async function run(o) {
    const targets = (o.targets || '').split(',').filter(Boolean).map((t) => {
        const i = t.indexOf('=');
        return { name: t.slice(0, i), url: t.slice(i + 1) };
    });
    if (!targets.length || !o.dir) {
        throw new Error('run needs --targets name=url,... and --dir');
    }
    const keyed = new Set((o.keyed || '').split(',').filter(Boolean));
    const common = {
        chunks: Number(o.chunks || 20),
        stagger: Number(o['stagger-ms'] || 50),
        timeoutMs: Number(o['timeout-ms'] || 30000),
        model: o.model || 'bench-stream',
    };
    const n = Number(o.n || 500);
    /* label=pid roots; this process falls under the last one (the shell) */
    const roots = (o['cpu-roots'] || `load=${process.pid}`).split(',').filter(Boolean);
    common.roots = roots;
    const rounds = Number(o.rounds || 3);
    const warm = Number(o.warmup || 50);
    const pause = Number(o['pause-ms'] || 500);
    const otherMax = Number(o['other-max'] ?? 10);
    const retries = Number(o.retries ?? 2);
    const totals = {};
    const key = (t) => (keyed.has(t.name) ? o.key : undefined);
    /*
     * One keep-alive agent per target for the whole plan: the warm-up opens
     * the client connections, the rounds reuse them, so TTFT measures the
     * request path rather than a burst of TCP handshakes.
     */
    for (const t of targets) {
        t.agent = new http.Agent({ keepAlive: true, maxSockets: n, maxFreeSockets: n,
            keepAliveMsecs: 1000, scheduling: 'fifo' });
    }
    try {
        for (const t of targets) {
            if (warm > 0) {
                await batch({ ...common, agent: t.agent, url: t.url, key: key(t), n: warm, target: t.name });
                await sleep(pause);
            }
        }
        for (let r = 1; r <= rounds; r++) {
            for (const t of targets) {
                /* a batch disturbed by other processes is run again */
                let best = null;
                for (let a = 0; a <= retries; a++) {
                    const out = path.join(o.dir, `${t.name}-r${r}.json`);
                    const res = await batch({
                        ...common, agent: t.agent, url: t.url, key: key(t), n, target: t.name,
                        out: a ? `${out} (retry ${a})` : out,
                    });
                    res.attempts = a + 1;
                    totals[t.name] = (totals[t.name] || 0) + n;
                    if (!best || res.cpu.elsewhere < best.cpu.elsewhere) {
                        best = res;
                    }
                    await sleep(pause);
                    if (res.cpu.elsewhere <= otherMax) {
                        break;
                    }
                    if (a < retries) {
                        console.log(`  ${res.cpu.elsewhere.toFixed(1)}% of the CPU went elsewhere (other processes, steal): again`);
                    }
                }
                fs.writeFileSync(path.join(o.dir, `${t.name}-r${r}.json`), JSON.stringify(best));
            }
        }
        fs.writeFileSync(path.join(o.dir, 'totals.json'), JSON.stringify(totals));
    } finally {
        for (const t of targets) {
            t.agent.destroy();
        }
    }
}

/*
 * The slow first tokens of a round come in runs of consecutive streams
 * (one starts every STAGGER_MS / STREAMS ms), each late by about as much:
 * moments when the whole machine (hypervisor, client) stops.  They hit
 * every target alike, so a round's p99 mostly counts how many fell into
 * it.  Returns their count, the streams in them, and the TTFT+ of the
 * streams outside them.
 */
const PAUSE_RUN = 5;
const PAUSE_MS = 3;

function machinePauses(added) {
    let runs = 0;
    let inRuns = 0;
    const mark = new Array(added.length).fill(false);
    for (let i = 0; i < added.length; ) {
        let j = i;
        while (j < added.length && added[j] > PAUSE_MS) {
            j++;
        }
        if (j - i >= PAUSE_RUN) {
            runs++;
            inRuns += j - i;
            mark.fill(true, i, j);
        }
        i = j > i ? j : i + 1;
    }
    return { runs, inRuns, outside: added.filter((_, k) => !mark[k]) };
}

function report(o) {
    const targets = (o.targets || 'bare,gateway').split(',');
    const pooled = {};
    const rounds = {};
    for (const f of o._) {
        const t = path.basename(f).split('-')[0];
        const j = JSON.parse(fs.readFileSync(f, 'utf8'));
        pooled[t] ||= { ttft: [], addedTtft: [], perChunk: [], n: 0, completed: 0, stalled: 0, maxGapMs: 0, errors: [] };
        const p = pooled[t];
        p.ttft.push(...j.ttft);
        p.addedTtft.push(...j.addedTtft);
        p.perChunk.push(...j.perChunk);
        p.n += j.n;
        p.completed += j.completed;
        p.stalled += j.stalled;
        p.maxGapMs = Math.max(p.maxGapMs, j.maxGapMs);
        p.errors.push(...j.errors);
        (rounds[t] ||= []).push({
            file: path.basename(f), a: stats(j.addedTtft), c: stats(j.perChunk), cpu: j.cpu,
            pauses: machinePauses(j.addedTtft),
        });
    }
    const f3 = (x) => (Number.isFinite(x) ? x.toFixed(3) : 'n/a').padStart(9);
    console.log('per round (ms):');
    console.log(`${'round'.padEnd(22)} ${'TTFT+ p50'.padStart(9)} ${'TTFT+ p99'.padStart(9)} ` +
        `${'chunk+ p50'.padStart(10)} ${'chunk+ p99'.padStart(10)}`);
    for (const t of targets) {
        for (const r of rounds[t] || []) {
            console.log(`${r.file.replace(/\.json$/, '').padEnd(22)} ${f3(r.a.p50)} ${f3(r.a.p99)} ` +
                ` ${f3(r.c.p50)}  ${f3(r.c.p99)}`);
        }
    }
    console.log('');
    console.log('CPU during each round, % of all cores (load = the Node client; other = not ours):');
    for (const t of targets) {
        for (const r of rounds[t] || []) {
            console.log(`${r.file.replace(/\.json$/, '').padEnd(22)} ${r.cpu ? cpuFmt(r.cpu) : ''}`);
        }
    }
    console.log('');
    console.log('pooled over rounds (ms):');
    console.log(`${'target'.padEnd(10)} ${'streams'.padStart(9)} ${'stalled'.padStart(8)} ` +
        `${'TTFT p50'.padStart(9)} ${'TTFT+ p50'.padStart(9)} ${'TTFT+ p99'.padStart(9)} ` +
        `${'chunk+ p50'.padStart(10)} ${'chunk+ p99'.padStart(10)} ${'max gap'.padStart(9)}`);
    const S = {};
    for (const t of targets) {
        const p = pooled[t];
        if (!p) {
            continue;
        }
        S[t] = { ttft: stats(p.ttft), a: stats(p.addedTtft), c: stats(p.perChunk) };
        console.log(`${t.padEnd(10)} ${String(p.n).padStart(9)} ${String(p.stalled).padStart(8)} ` +
            `${f3(S[t].ttft.p50)} ${f3(S[t].a.p50)} ${f3(S[t].a.p99)}  ${f3(S[t].c.p50)}  ` +
            `${f3(S[t].c.p99)} ${f3(p.maxGapMs)}`);
    }
    const [base, gw] = [o.base || 'bare', o.gw || 'gateway'];
    const med = (xs) => {
        const v = xs.filter(Number.isFinite).sort((x, y) => x - y);
        return v.length ? v[Math.floor((v.length - 1) / 2)] : NaN;
    };
    const sign = (x) => `${x >= 0 ? '+' : ''}${x.toFixed(3)}`;
    if (S[base] && S[gw]) {
        const dA50 = S[gw].a.p50 - S[base].a.p50;
        const dA99 = S[gw].a.p99 - S[base].a.p99;
        const dC50 = S[gw].c.p50 - S[base].c.p50;
        const dC99 = S[gw].c.p99 - S[base].c.p99;
        console.log('');
        console.log(`${gw} - ${base}: added TTFT p50 ${sign(dA50)} ms, ` +
            `p99 ${sign(dA99)} ms (target < 1 ms: ${dA99 < 1 ? 'met' : 'MISSED'})`);
        console.log(`${gw} - ${base}: added per-chunk p50 ${sign(dC50)} ms, ` +
            `p99 ${sign(dC99)} ms (target < 1 ms: ${dC99 < 1 ? 'met' : 'MISSED'})`);
        /* one disturbed round dominates a pooled p99; the median round does not */
        const mA = (t) => med(rounds[t].map((r) => r.a.p99));
        const mC = (t) => med(rounds[t].map((r) => r.c.p99));
        console.log(`median over rounds of the round p99: added TTFT ${base} ${mA(base).toFixed(3)}, ` +
            `${gw} ${mA(gw).toFixed(3)} (${sign(mA(gw) - mA(base))}) ms; per chunk ${base} ` +
            `${mC(base).toFixed(3)}, ${gw} ${mC(gw).toFixed(3)} (${sign(mC(gw) - mC(base))}) ms`);
    }
    /* a diagnostic, not the figure: see machinePauses() */
    console.log('');
    console.log(`pauses of the whole machine: runs of >= ${PAUSE_RUN} consecutive streams (in start ` +
        `order) each with TTFT+ > ${PAUSE_MS} ms:`);
    const outside = {};
    for (const t of targets) {
        const rs = rounds[t] || [];
        const runs = rs.reduce((n, r) => n + r.pauses.runs, 0);
        const inRuns = rs.reduce((n, r) => n + r.pauses.inRuns, 0);
        outside[t] = stats(rs.flatMap((r) => r.pauses.outside));
        console.log(`${t.padEnd(10)} ${String(runs).padStart(3)} runs, ${String(inRuns).padStart(4)} ` +
            `streams in them; TTFT+ p99 of the other streams ${f3(outside[t].p99).trim()} ms`);
    }
    if (outside[base] && outside[gw]) {
        console.log(`${gw} - ${base} outside those runs: added TTFT p99 ` +
            `${sign(outside[gw].p99 - outside[base].p99)} ms`);
    }
    console.log('');
    let stalledAny = 0;
    for (const t of Object.keys(pooled)) {
        const p = pooled[t];
        stalledAny += p.stalled;
        console.log(`${t}: ${p.completed}/${p.n} streams got all chunks, the usage chunk and [DONE]` +
            (p.stalled ? `; STALLED ${p.stalled}: ${[...new Set(p.errors)].slice(0, 3).join('; ')}` : ''));
    }
    process.exitCode = stalledAny ? 3 : 0;
}

const [cmd, ...rest] = process.argv.slice(2);
const o = parseArgs(rest);
if (cmd === 'run') {
    await run(o);
} else if (cmd === 'report') {
    report(o);
} else {
    console.error('usage: stream-client.mjs run|report ...');
    process.exit(2);
}
