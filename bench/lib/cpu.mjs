// CPU accounting for the benchmarks: how much of the machine the benchmark's
// own processes used during a measurement, and how much went elsewhere
// (other users of a shared machine, the hypervisor's steal time).  The
// figures are noise indicators printed next to each round.
//
//   node cpu.mjs snap <root pid>...      prints a snapshot (one JSON line)
//   node cpu.mjs diff '<snap a>' '<snap b>'
//        prints "ours O% other F% irq I% steal S% idle D%" (percent of all
//        cores), a tab, other, a tab, steal
//
// ours: user+system time of the benchmark's processes; other: user+system
// time of every other process; irq: hard and soft interrupt time (on
// loopback much of the network stack runs there, for everyone); steal:
// time the hypervisor gave to other guests.
//
// "ours" is every live descendant of the root pids (utime+stime plus the
// reaped children's cutime+cstime, so a finished wrk counts through its
// parent), read from /proc.  Linux only; USER_HZ is taken as 100.

import fs from 'node:fs';

function readStat(pid) {
    try {
        const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
        const rest = s.slice(s.lastIndexOf(')') + 2).split(' ');
        /* rest[0] is field 3 (state); fields 14..17 are utime stime cutime cstime */
        return {
            ppid: Number(rest[1]),
            ticks: Number(rest[11]) + Number(rest[12]) + Number(rest[13]) + Number(rest[14]),
        };
    } catch {
        return null;
    }
}

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
    const seen = new Set();
    const todo = roots.map(Number).filter((p) => procs.has(p));
    let ours = 0;
    while (todo.length) {
        const p = todo.pop();
        if (seen.has(p)) {
            continue;
        }
        seen.add(p);
        ours += procs.get(p).ticks;
        todo.push(...(kids.get(p) || []));
    }
    const line = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/);
    const [user, nice, system, idle, iowait, irq, softirq, steal] = line.slice(1, 9).map(Number);
    return {
        ours,
        busy: user + nice + system, irq: irq + softirq,
        idle: idle + iowait, steal,
    };
}

/* Ticks of our processes that exited between a and b are lost unless a
 * tracked parent reaped them; pass the same roots to both snapshots. */
export function diff(a, b) {
    const busy = b.busy - a.busy;
    const irq = b.irq - a.irq;
    const idle = b.idle - a.idle;
    const steal = b.steal - a.steal;
    const all = busy + irq + idle + steal;
    const ours = Math.min(busy, Math.max(0, b.ours - a.ours));
    const pct = (x) => (all > 0 ? (100 * x) / all : 0);
    return {
        idle: pct(idle), ours: pct(ours), other: pct(busy - ours), irq: pct(irq),
        steal: pct(steal),
    };
}

export function fmt(d) {
    return `ours ${d.ours.toFixed(0)}% other ${d.other.toFixed(0)}% ` +
        `irq ${d.irq.toFixed(0)}% steal ${d.steal.toFixed(0)}% idle ${d.idle.toFixed(0)}%`;
}

if (process.argv[1] && process.argv[1].endsWith('cpu.mjs')) {
    const [cmd, ...args] = process.argv.slice(2);
    if (cmd === 'snap') {
        console.log(JSON.stringify(snapshot(args)));
    } else if (cmd === 'diff') {
        const d = diff(JSON.parse(args[0]), JSON.parse(args[1]));
        console.log(`${fmt(d)}\t${d.other.toFixed(1)}\t${d.steal.toFixed(1)}`);
    } else {
        console.error('usage: cpu.mjs snap <pid>... | diff <a> <b>');
        process.exit(2);
    }
}
