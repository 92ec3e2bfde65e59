// Plugin-hook helper for bench/hooks.sh (Node 20 built-ins only).
//
//   node hooks-client.mjs setup --url URL --token T --key K --body FILE
//       uploads the benchmark plugin (PLUGIN_SOURCE below, meta.key K) with
//       POST /api/plugin/task {source, enabled: true}, then repeats the dry
//       run in FILE (POST /api/plugin/task/dryrun) until 20 in a row answer
//       200 {"ok": true} (bounded: 20 s; every nginx worker learns of the
//       plugin through the database notice).  Prints the active version's
//       sha (the upload answer's versions[].sha).
//   node hooks-client.mjs status --socket S
//       one STATUS frame to the helper; prints
//       "calls errors timeouts memory restarts per-worker-calls,..." summed
//       over the helper's workers.
//   node hooks-client.mjs run --socket S --sha SHA --ctx JSON
//            --conc C --conns N --duration SECS --warmup SECS
//       the helper alone: C callers, each sending CALL
//       {"sha", "hook": "buildSubmitRequest", "args": [ctx]} and the next
//       one when the reply is in (closed loop), over N Unix socket
//       connections (caller i on connection i % N; a connection with more
//       than one caller carries them pipelined, answered in order).  A
//       warm-up of SECS first, then SECS measured: calls started in the
//       window and answered before its end count.  Prints
//       "calls/s p50_us p99_us calls 0 errors" (the 0 is the non-2xx field
//       of the wrk lines it sits next to).
//
// Frames (v8_host/README.md): a 12-byte header in network byte order --
// version 1, type, 0, 0, request id (u32), body length (u32) -- then JSON.
// Requests LOAD 1, CALL 2, STATUS 3; a reply is 0x80 | type with the
// request's id.  Every command has a deadline.

import fs from 'node:fs';
import { request } from './http.mjs';
import net from 'node:net';

const CALL = 2;
const STATUS = 3;
const REPLY = 0x80;
const OK_PREFIX = Buffer.from('{"ok":true');

/* The benchmark plugin: a valid per_task plugin whose buildSubmitRequest
 * only builds a small object from its context. */
export const PLUGIN_SOURCE = (key) => `// llmgw bench/hooks.sh plugin: trivial hooks.
export const meta = {
  apiVersion: 1,
  key: ${JSON.stringify(key)},
  name: 'Benchmark hooks',
  version: '1.0.0',
  author: { name: 'llmgw bench' },
  description: 'A trivial plugin for bench/hooks.sh',
  models: ['bench-hook-1'],
  fetchMode: 'per_task',
  auth: 'api_key',
};

export function buildSubmitRequest(ctx) {
  return {
    url: ctx.baseUrl + '/v1/tasks',
    method: 'POST',
    headers: { Authorization: 'Bearer ' + ctx.apiKey },
    body: { model: ctx.model, prompt: ctx.requestBody.value.prompt },
  };
}

export function parseSubmitResponse(ctx, res) {
  return { taskId: String(res.body && res.body.id), taskData: {} };
}

export function buildQueryRequest(ctx) {
  return { url: ctx.baseUrl + '/v1/tasks/' + ctx.taskId, method: 'GET',
           headers: { Authorization: 'Bearer ' + ctx.apiKey } };
}

export function parseTaskResult(ctx, body) {
  return { status: body && body.status === 'done' ? 'SUCCESS' : 'IN_PROGRESS' };
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

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function deadline(ms, what) {
    setTimeout(() => {
        console.error(`hooks-client.mjs ${what}: did not finish within ${ms / 1000} s`);
        process.exit(1);
    }, ms).unref();
}

/* ------------------------------------------------------------ admin API */


async function setup(o) {
    need(o, 'url', 'token', 'key', 'body');
    deadline(60000, 'setup');
    const up = await request(o.url, o.token, 'POST', '/api/plugin/task',
        { source: PLUGIN_SOURCE(o.key), enabled: true, remark: 'bench/hooks.sh' });
    if (up.status !== 200 || !up.json) {
        throw new Error(`upload: ${up.status} ${up.text.slice(0, 500)}`);
    }
    const active = up.json.active_version || up.json.version;
    const v = (up.json.versions || []).find((x) => x.version === active)
        || (up.json.versions || [])[0];
    if (!v || !/^[0-9a-f]{64}$/.test(v.sha || '')) {
        throw new Error(`upload answer has no versions[].sha: ${up.text.slice(0, 500)}`);
    }
    const body = fs.readFileSync(o.body, 'utf8');
    const end = Date.now() + 20000;
    let good = 0;
    let last = '';
    while (good < 20) {
        if (Date.now() > end) {
            throw new Error(`the dry run by key did not work in 20 s: ${last}`);
        }
        const r = await request(o.url, o.token, 'POST', '/api/plugin/task/dryrun', body);
        last = `${r.status} ${r.text.slice(0, 300)}`;
        good = r.status === 200 && r.json && r.json.ok === true ? good + 1 : 0;
        if (!good) {
            await sleep(100);
        }
    }
    process.stdout.write(`${v.sha}\n`);
}

/* --------------------------------------------------------------- frames */

function header(type, id, len) {
    const h = Buffer.alloc(12);
    h[0] = 1;
    h[1] = type;
    h.writeUInt32BE(id >>> 0, 4);
    h.writeUInt32BE(len >>> 0, 8);
    return h;
}

/*
 * One connection: sends frames, hands each reply (type, id, body) to
 * onReply in order.
 */
function connect(socketPath, onReply, onFail) {
    return new Promise((resolve, reject) => {
        const s = net.connect({ path: socketPath });
        let buf = Buffer.alloc(0);
        let ready = false;
        s.on('connect', () => {
            ready = true;
            resolve(s);
        });
        s.on('data', (chunk) => {
            buf = buf.length ? Buffer.concat([buf, chunk]) : chunk;
            let off = 0;
            while (buf.length - off >= 12) {
                const len = buf.readUInt32BE(off + 8);
                if (buf.length - off < 12 + len) {
                    break;
                }
                const type = buf[off + 1];
                const id = buf.readUInt32BE(off + 4);
                onReply(s, type, id, buf.subarray(off + 12, off + 12 + len));
                off += 12 + len;
            }
            buf = off === buf.length ? Buffer.alloc(0) : buf.subarray(off);
        });
        s.on('error', (e) => (ready ? onFail(e) : reject(e)));
        s.on('close', () => ready && onFail(new Error('the helper closed a connection')));
    });
}

/* One request on a fresh connection -> the reply body as JSON. */
async function oneFrame(socketPath, type, body, timeoutMs = 5000) {
    let done;
    const got = new Promise((resolve, reject) => {
        done = { resolve, reject };
    });
    const s = await connect(socketPath, (sock, t, id, b) => {
        if (t !== (REPLY | type) || id !== 7) {
            done.reject(new Error(`unexpected reply type ${t} id ${id}`));
        } else {
            done.resolve(JSON.parse(b.toString('utf8')));
        }
    }, (e) => done.reject(e));
    const payload = Buffer.from(JSON.stringify(body));
    s.write(Buffer.concat([header(type, 7, payload.length), payload]));
    const timer = setTimeout(() => done.reject(new Error('no reply in time')), timeoutMs);
    try {
        return await got;
    } finally {
        clearTimeout(timer);
        s.removeAllListeners('close');
        s.destroy();
    }
}

async function status(o) {
    need(o, 'socket');
    deadline(15000, 'status');
    const r = await oneFrame(o.socket, STATUS, {});
    if (!r.ok) {
        throw new Error(`STATUS: ${JSON.stringify(r).slice(0, 300)}`);
    }
    const sum = { calls: 0, errors: 0, timeouts: 0, memory: 0, restarts: 0 };
    for (const w of r.workers) {
        for (const k of Object.keys(sum)) {
            sum[k] += Number(w[k] || 0);
        }
    }
    const per = r.workers.map((w) => `${w.slot}:${w.calls}`).join(',');
    process.stdout.write(`${sum.calls} ${sum.errors} ${sum.timeouts} ${sum.memory} ${sum.restarts} ${per}\n`);
}

async function run(o) {
    need(o, 'socket', 'sha', 'ctx');
    const conc = Number(o.conc || 1);
    const nconns = Math.min(Number(o.conns || 1), conc);
    const durS = Number(o.duration || 10);
    const warmS = Number(o.warmup || 2);
    if (!(conc >= 1 && conc <= 4096 && nconns >= 1 && durS > 0 && durS <= 300
          && warmS >= 0 && warmS <= 60)) {
        throw new Error('--conc 1..4096, --conns >= 1, --duration 0..300, --warmup 0..60');
    }
    deadline((durS + warmS + 20) * 1000, 'run');

    const ctx = JSON.parse(o.ctx);
    const body = Buffer.from(JSON.stringify({ sha: o.sha, hook: 'buildSubmitRequest', args: [ctx] }));

    /* the sha must be known to the helper (the upload LOADed it) */
    const probe = await oneFrame(o.socket, CALL, JSON.parse(body.toString()));
    if (!probe.ok) {
        throw new Error(`CALL probe: ${JSON.stringify(probe).slice(0, 300)}`);
    }

    const template = Buffer.concat([header(CALL, 0, body.length), body]);
    const HIST_MAX = 1000000;                      /* 1 us buckets up to 1 s */
    const hist = new Uint32Array(HIST_MAX + 1);
    let recorded = 0;
    let errors = 0;
    let nextId = 1;
    let failed = null;

    const t0 = process.hrtime.bigint();
    const now = () => Number(process.hrtime.bigint() - t0) / 1000;   /* us */
    const tStart = warmS * 1e6;
    const tEnd = tStart + durS * 1e6;

    let active = conc;
    let finish;
    const finished = new Promise((resolve) => {
        finish = resolve;
    });

    const fifo = new Map();                    /* socket -> [{id, t, user}] */

    const send = (s, user) => {
        const f = Buffer.allocUnsafe(template.length);
        template.copy(f);
        const id = nextId;
        nextId = (nextId + 1) >>> 0 || 1;
        f.writeUInt32BE(id, 4);
        fifo.get(s).push({ id, t: now(), user });
        s.write(f);
    };

    const onReply = (s, type, id, b) => {
        const q = fifo.get(s);
        const head = q.shift();
        const t = now();
        if (!head || head.id !== id || type !== (REPLY | CALL)) {
            failed = failed || new Error(`reply out of order: type ${type} id ${id}, expected ${head && head.id}`);
            finish();
            return;
        }
        const ok = b.length >= OK_PREFIX.length && b.subarray(0, OK_PREFIX.length).equals(OK_PREFIX);
        if (!ok) {
            errors++;                       /* warm-up included */
        }
        if (head.t >= tStart && t <= tEnd) {
            hist[Math.min(HIST_MAX, Math.round(t - head.t))]++;
            recorded++;
        }
        if (t < tEnd) {
            send(s, head.user);
        } else if (--active === 0) {
            finish();
        }
    };

    const conns = [];
    for (let i = 0; i < nconns; i++) {
        const s = await connect(o.socket, onReply, (e) => {
            if (active > 0) {
                failed = failed || e;
                finish();
            }
        });
        fifo.set(s, []);
        conns.push(s);
    }
    for (let u = 0; u < conc; u++) {
        send(conns[u % nconns], u);
    }
    await finished;
    for (const s of conns) {
        s.removeAllListeners('close');
        s.destroy();
    }
    if (failed) {
        throw failed;
    }
    const pct = (p) => {
        const want = Math.ceil(recorded * p);
        let n = 0;
        for (let i = 0; i <= HIST_MAX; i++) {
            n += hist[i];
            if (n >= want) {
                return i;
            }
        }
        return HIST_MAX;
    };
    if (recorded === 0) {
        throw new Error('no call completed in the measured window');
    }
    const rps = recorded / durS;
    process.stdout.write(`${rps.toFixed(1)} ${pct(0.5)} ${pct(0.99)} ${recorded} 0 ${errors}\n`);
}

const [cmd, ...rest] = process.argv.slice(2);
const o = args(rest);
try {
    if (cmd === 'setup') {
        await setup(o);
    } else if (cmd === 'status') {
        await status(o);
    } else if (cmd === 'run') {
        await run(o);
    } else {
        throw new Error(`unknown command ${cmd}`);
    }
    process.exit(0);
} catch (e) {
    console.error(`hooks-client.mjs ${cmd}: ${e.message}`);
    process.exit(1);
}
