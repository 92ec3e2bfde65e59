// CPU accounting for the benchmarks: where the machine's CPU went during a
// measurement, per part of the benchmark, and how much went elsewhere
// (other users of a shared machine, interrupts, the hypervisor's steal).
// Printed next to each round as a sign of noise and of who was busy.
//
//   node cpu.mjs snap label=pid ...      prints a snapshot (one JSON line)
//   node cpu.mjs diff '<snap a>' '<snap b>'
//        prints "<label> N% ... other O% irq I% steal S% idle D%" (percent
//        of all cores), a tab, other% + steal% (the share of the machine
//        the benchmark did not get), a tab, "label=percent ..." 
//
// A label's share is its root process and every descendant not claimed by
// an earlier label (list specific roots first and a catch-all such as the
// benchmark shell last): utime+stime, plus cutime+cstime so that a child
// that exited and was reaped (a finished wrk, a PostgreSQL backend) still
// counts.  other: user+system time of all other processes; irq: hard and
// soft interrupt time (on loopback much of the network stack runs there,
// for everyone).  Linux /proc only.

import fs from 'node:fs';

function readStat(pid) {
    try {
        const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
        const rest = s.slice(s.lastIndexOf(')') + 2).split(' ');
        /* rest[0] is field 3 (state); fields 14..17: utime stime cutime cstime */
        return {
            ppid: Number(rest[1]),
            ticks: Number(rest[11]) + Number(rest[12]) + Number(rest[13]) + Number(rest[14]),
        };
    } catch {
        return null;
    }
}

/* roots: ["label=pid", ...] or [[label, pid], ...] */
export function snapshot(roots) {
    const procs = new Map();
    for (const ent of fs.readdirSync('/proc')) {
        if (/^\d+$/.test(ent)) {
            const st = readStat(ent);
            if (st) {
                procs.set(Number(ent), st);
            }
        }
    }
    const kids = new Map();
    for (const [pid, st] of procs) {
        if (!kids.has(st.ppid)) {
            kids.set(st.ppid, []);
        }
        kids.get(st.ppid).push(pid);
    }
    const pairs = roots.map((r) => (Array.isArray(r) ? r : String(r).split('=')))
        .map(([label, pid]) => [label, Number(pid)]);
    const claimed = new Set(pairs.map(([, pid]) => pid));
    const seen = new Set();
    const per = {};
    for (const [label, root] of pairs) {
        per[label] = per[label] || 0;
        const pending = procs.has(root) ? [root] : [];
        while (pending.length) {
            const p = pending.pop();
            if (seen.has(p)) {
                continue;
            }
            seen.add(p);
            per[label] += procs.get(p).ticks;
            for (const k of kids.get(p) || []) {
                if (!claimed.has(k)) {
                    pending.push(k);
                }
            }
        }
    }
    const line = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/);
    const [user, nice, system, idle, iowait, irq, softirq, steal] = line.slice(1, 9).map(Number);
    return {
        per, labels: pairs.map(([l]) => l),
        busy: user + nice + system, irq: irq + softirq,
        idle: idle + iowait, steal,
    };
}

/*
 * Shares of all cores between snapshots a and b.  A label's ticks can only
 * grow while its processes live; a process of ours that exits unreaped by a
 * tracked parent takes its ticks with it (clamped at 0).
 */
export function diff(a, b) {
    const busy = b.busy - a.busy;
    const irq = b.irq - a.irq;
    const idle = b.idle - a.idle;
    const steal = b.steal - a.steal;
    const all = busy + irq + idle + steal;
    const pct = (x) => (all > 0 ? (100 * x) / all : 0);
    const per = {};
    let ours = 0;
    for (const l of b.labels) {
        const t = Math.max(0, (b.per[l] || 0) - (a.per[l] || 0));
        per[l] = pct(t);
        ours += t;
    }
    ours = Math.min(ours, busy);
    return {
        labels: b.labels, per, ours: pct(ours), other: pct(busy - ours),
        elsewhere: pct(busy - ours + steal),
        irq: pct(irq), steal: pct(steal), idle: pct(idle),
    };
}

export function fmt(d) {
    const parts = d.labels.map((l) => `${l} ${d.per[l].toFixed(0)}%`);
    return `${parts.join(' ')} | other ${d.other.toFixed(0)}% irq ${d.irq.toFixed(0)}% ` +
        `steal ${d.steal.toFixed(0)}% idle ${d.idle.toFixed(0)}%`;
}

if (process.argv[1] && process.argv[1].endsWith('cpu.mjs')) {
    const [cmd, ...args] = process.argv.slice(2);
    if (cmd === 'snap') {
        console.log(JSON.stringify(snapshot(args)));
    } else if (cmd === 'diff') {
        const d = diff(JSON.parse(args[0]), JSON.parse(args[1]));
        const words = d.labels.map((l) => `${l}=${d.per[l].toFixed(2)}`).join(' ');
        console.log(`${fmt(d)}\t${d.elsewhere.toFixed(1)}\t${words}`);
    } else {
        console.error('usage: cpu.mjs snap label=pid ... | diff <a> <b>');
        process.exit(2);
    }
}
