// Admin-API helper for the benchmarks (Node 20 built-ins only).
//
//   BENCH_GW_URL=http://127.0.0.1:P BENCH_ROOT_TOKEN=... node admin.mjs <cmd>
//
//   setup --upstream URL --model M [--users N] [--rl-total T] [--probe chat|stream|none]
//       pricing for M, a rate limit of T requests per minute per user (the
//       limiter runs on every request), one OpenAI channel for M at URL,
//       N users each with one unlimited key.  Waits (bounded) until every
//       key is served (probe), then prints the keys, one per line.
//   log-total --model M
//       prints `total` of GET /api/log?model=M
//
// Every request has a timeout; the whole command has a deadline.

import { request as httpRequest } from './http.mjs';

const URL_ = process.env.BENCH_GW_URL;
const TOKEN = process.env.BENCH_ROOT_TOKEN;
if (!URL_ || !TOKEN) {
    console.error('admin.mjs: BENCH_GW_URL and BENCH_ROOT_TOKEN are required');
    process.exit(2);
}
setTimeout(() => {
    console.error('admin.mjs: did not finish within 60 s');
    process.exit(1);
}, 60000).unref();

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function request(method, path, { body, token = TOKEN, timeoutMs = 10000 } = {}) {
    return httpRequest(URL_, token, method, path, body, timeoutMs);
}

async function ok(method, path, body) {
    const r = await request(method, path, { body });
    if (r.status !== 200) {
        throw new Error(`${method} ${path}: ${r.status} ${r.text.slice(0, 500)}`);
    }
    return r.json;
}

function args(argv) {
    const o = {};
    for (let i = 0; i < argv.length; i += 2) {
        o[argv[i].replace(/^--/, '')] = argv[i + 1];
    }
    return o;
}

async function probe(key, model, kind) {
    const body = { model, messages: [{ role: 'user', content: 'hi' }] };
    if (kind === 'stream') {
        body.stream = true;
    }
    return request('POST', '/v1/chat/completions', { body, token: key, timeoutMs: 10000 });
}

async function setup(o) {
    const model = o.model;
    const users = Number(o.users || 1);
    const total = Number(o['rl-total'] || 100000);
    const kind = o.probe || 'chat';
    await ok('PUT', '/api/pricing', { [model]: { ratio: 1, completion_ratio: 2 } });
    await ok('PUT', '/api/rate_limit', {
        default: { duration_minutes: 1, total, success: 0 },
    });
    await ok('POST', '/api/channel', {
        name: 'bench-upstream', type: 1, key: 'sk-bench-upstream',
        base_url: o.upstream, models: [model], groups: ['default'],
        priority: 0, weight: 1,
    });
    const keys = [];
    for (let i = 0; i < users; i++) {
        const u = await ok('POST', '/api/user', {
            username: `bench-user-${i}`, quota: 1000000000000, group: 'default',
        });
        const t = await ok('POST', '/api/token', {
            user_id: u.id, name: `bench-key-${i}`, unlimited_quota: true,
            remain_quota: 0, expired_time: -1,
        });
        keys.push(t.key);
    }
    if (kind !== 'none') {
        /* The configuration reaches the workers within about 1 s. */
        const deadline = Date.now() + 20000;
        for (const key of keys) {
            let good = 0;
            let last = '';
            while (good < 3) {
                if (Date.now() > deadline) {
                    throw new Error(`key not served in 20 s: ${last}`);
                }
                const r = await probe(key, model, kind);
                last = `${r.status} ${r.text.slice(0, 300)}`;
                good = r.status === 200 ? good + 1 : 0;
                if (!good) {
                    await sleep(100);
                }
            }
        }
    }
    process.stdout.write(keys.join('\n') + '\n');
}

async function logTotal(o) {
    const j = await ok('GET', `/api/log?model=${encodeURIComponent(o.model)}&page_size=1`);
    process.stdout.write(`${j.total}\n`);
}

const [cmd, ...rest] = process.argv.slice(2);
const o = args(rest);
try {
    if (cmd === 'setup') {
        await setup(o);
    } else if (cmd === 'log-total') {
        await logTotal(o);
    } else {
        throw new Error(`unknown command ${cmd}`);
    }
    process.exit(0);
} catch (e) {
    console.error(`admin.mjs ${cmd}: ${e.message}`);
    process.exit(1);
}
