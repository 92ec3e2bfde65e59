// A mock task vendor on 127.0.0.1 for the task engine tests, and the small
// helpers those tests share (plugin fixtures, multipart, SSE frames, worker
// lookup).  Node 20 built-ins only; every wait is bounded.
//
// Endpoints (any prefix before them, so a channel base URL may carry a path):
//   POST .../submit      submit: vendor.onSubmit(rec, n) or the default, which
//                        answers 200 {id} with id = body.up_id, else
//                        body.input.up_id, else "up-<port>-<n>"
//   GET  .../tasks/<id>  per-task poll: the next queued answer of <id>, else
//                        vendor.pollAnswer(id, n, rec) (default IN_PROGRESS)
//   POST .../batch       batch poll {ids: [...]}: {items: [{id, ...answer.body}]}
//                        from the same per-id answers, or vendor.onBatch(rec)
//   anything else        vendor.onOther(rec), default 404
//
// An answer is an object:
//   {status = 200, body (object -> JSON, string or Buffer), headers,
//    delayMs, before: () => Promise (awaited first), close: true (destroy
//    the socket without answering: a transport error),
//    sse: [frame strings] (a text/event-stream answer, chunked), frameDelayMs,
//    sseEnd: 'end' | 'hold' | 'close' (destroyed: the chunked body cut
//    short) | 'reset' (a TCP RST), what follows the last frame after
//    sseEndDelayMs}
// Every request is recorded before it is answered:
//   rec = {n, method, url, path, query, headers, body: Buffer, text, json,
//          remotePort, t, tEnd, closed, kind: submit|poll|batch|other|retired,
//          upId (submit and poll)}
// vendor.retire() answers everything 404 from then on (see there).

import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { after, before } from 'node:test';
import { fileURLToPath } from 'node:url';

import {
    createDb, dropDb, hex, makeKey, makeUser, psql, settle, startGateway, stopAll,
} from './harness.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const PLUGIN_FIXTURES = path.join(HERE, '..', 'integration', 'fixtures', 'plugins');

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* 500,000 quota = 1 USD (contract facts, billing units). */
export const QUOTA_PER_USD = 500000;

/* ------------------------------------------------------------------ */
/* waiting                                                             */
/* ------------------------------------------------------------------ */

/*
 * Calls fn until it returns a truthy value (returned) or ms pass; then
 * throws, naming `what` and the last value or error.
 */
export async function waitFor(fn, ms = 5000, { what = 'condition',
    intervalMs = 50 } = {}) {
    const end = Date.now() + ms;
    let last;
    for (;;) {
        try {
            last = await fn();
            if (last) {
                return last;
            }
        } catch (e) {
            last = e;
        }
        if (Date.now() >= end) {
            const why = last instanceof Error ? last.message : JSON.stringify(last);
            throw new Error(`${what}: not true within ${ms} ms (last: ${why})`);
        }
        await sleep(intervalMs);
    }
}

/* A promise the test opens: {promise, open(), opened}. */
export function gate() {
    let open;
    const promise = new Promise((r) => { open = r; });
    const g = { promise, opened: false };
    g.open = () => { g.opened = true; open(); };
    return g;
}

/* ------------------------------------------------------------------ */
/* the vendor                                                          */
/* ------------------------------------------------------------------ */

const IN_PROGRESS = { status: 200, body: { status: 'running' } };

export async function startVendor() {
    let counter = 0;
    const queues = new Map();    /* upstream id -> [answer] */
    const pollCount = new Map(); /* upstream id -> polls so far */
    const sockets = new Set();

    const v = {
        url: '', port: 0, requests: [],
        /* (rec, n) -> answer or undefined for the default */
        onSubmit: null,
        /* (id, n, rec) -> answer, when nothing is queued for id */
        pollAnswer: () => IN_PROGRESS,
        /* (rec) -> answer or undefined for the per-id answers */
        onBatch: null,
        onOther: () => ({ status: 404, body: { error: { message: 'no such endpoint' } } }),

        /* One-shot answers for the next polls of an upstream id. */
        queuePoll(id, ...answers) {
            if (!queues.has(id)) {
                queues.set(id, []);
            }
            queues.get(id).push(...answers);
        },

        /* The answer of every later poll of id (after queued ones). */
        setPoll(id, answer) {
            const prev = v.pollAnswer;
            v.pollAnswer = (i, n, rec) => (i === id ? answer : prev(i, n, rec));
        },

        submits: () => v.requests.filter((r) => r.kind === 'submit'),
        polls: (id) => v.requests.filter((r) => r.kind === 'poll' &&
            (id === undefined || r.upId === id)),
        batches: () => v.requests.filter((r) => r.kind === 'batch'),

        /* The upstream id the default submit gave a public task id. */
        upstreamIdOf(publicTaskId) {
            const s = v.submits().find((r) =>
                r.headers['x-public-task-id'] === publicTaskId);
            return s ? s.upId : undefined;
        },

        reset() {
            v.requests.length = 0;
            queues.clear();
            pollCount.clear();
        },

        /*
         * After its test: every request is answered 404 (a poll of 404 ends
         * a task at once), but the port stays taken, so that no later
         * vendor inherits the polls of this one's tasks.
         */
        retire() {
            v.retired = true;
            queues.clear();
        },
        retired: false,

        close,
    };

    function nextAnswer(id, rec) {
        const n = (pollCount.get(id) || 0) + 1;
        pollCount.set(id, n);
        const q = queues.get(id);
        if (q && q.length) {
            return q.shift();
        }
        return v.pollAnswer(id, n, rec) || IN_PROGRESS;
    }

    function defaultSubmit(rec) {
        const j = rec.json || {};
        const id = typeof j.up_id === 'string' ? j.up_id
            : (j.input && typeof j.input.up_id === 'string' ? j.input.up_id
                : `up-${v.port}-${rec.n}`);
        return { status: 200, body: { id, status: 'queued' } };
    }

    async function route(rec) {
        const p = rec.path;
        if (v.retired) {
            rec.kind = 'retired';
            return { status: 404, body: { error: { message: 'this vendor is retired' } } };
        }
        const m = /\/tasks\/([^/]+)$/.exec(p);
        if (rec.method === 'POST' && p.endsWith('/submit')) {
            rec.kind = 'submit';
            const a = (v.onSubmit && await v.onSubmit(rec, v.submits().length)) ||
                defaultSubmit(rec);
            if (a.body && typeof a.body === 'object' && !Buffer.isBuffer(a.body) &&
                typeof a.body.id === 'string') {
                rec.upId = a.body.id;
            } else if (a.upId) {
                rec.upId = a.upId;
            }
            return a;
        }
        if (rec.method === 'GET' && m) {
            rec.kind = 'poll';
            rec.upId = decodeURIComponent(m[1]);
            return nextAnswer(rec.upId, rec);
        }
        if (rec.method === 'POST' && p.endsWith('/batch')) {
            rec.kind = 'batch';
            const own = v.onBatch && await v.onBatch(rec);
            if (own) {
                return own;
            }
            const ids = (rec.json && Array.isArray(rec.json.ids)) ? rec.json.ids : [];
            const items = [];
            for (const id of ids) {
                const a = nextAnswer(String(id), rec);
                if (a.before) {
                    await a.before();
                }
                items.push({ id, ...(a.body || {}) });
            }
            return { status: 200, body: { items } };
        }
        rec.kind = 'other';
        return v.onOther(rec);
    }

    async function answer(rec, req, res, a) {
        if (a.before) {
            await a.before();
        }
        if (a.delayMs) {
            await sleep(a.delayMs);
        }
        if (res.destroyed || rec.closed) {
            return;
        }
        if (a.close) {
            /* A kept-alive connection closed before any answer is tried
               again once on a new one (the peer may have closed it while
               idle): a vendor that drops connections drops that one too,
               and it is not another poll. */
            if (rec.kind === 'poll' && req.socket.served > 1) {
                rec.kind = 'stale';
                pollCount.set(rec.upId, pollCount.get(rec.upId) - 1);
                if (!queues.has(rec.upId)) {
                    queues.set(rec.upId, []);
                }
                queues.get(rec.upId).unshift({ close: true });
            }
            req.socket.destroy();
            return;
        }
        if (a.sse) {
            res.writeHead(a.status || 200, {
                'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache',
                ...(a.headers || {}),
            });
            res.flushHeaders();
            for (const frame of a.sse) {
                if (a.frameDelayMs) {
                    await sleep(a.frameDelayMs);
                }
                if (res.destroyed) {
                    return;
                }
                res.write(frame);
            }
            if (a.sseEndDelayMs) {
                await sleep(a.sseEndDelayMs);
            }
            if (a.sseEnd === 'hold') {
                return;   /* left open; close() or the client ends it */
            }
            if (a.sseEnd === 'close') {
                req.socket.destroy();
                return;
            }
            if (a.sseEnd === 'reset') {
                req.socket.resetAndDestroy();
                return;
            }
            res.end();
            return;
        }
        let body = a.body === undefined ? '' : a.body;
        const h = { ...(a.headers || {}) };
        if (!Buffer.isBuffer(body) && typeof body !== 'string') {
            body = JSON.stringify(body);
            h['Content-Type'] = h['Content-Type'] || 'application/json';
        }
        h['Content-Length'] = Buffer.byteLength(body);
        res.writeHead(a.status || 200, h);
        res.end(body);
    }

    const server = http.createServer((req, res) => {
        req.socket.served = (req.socket.served || 0) + 1;
        const parts = [];
        req.on('data', (c) => parts.push(c));
        req.on('end', async () => {
            const body = Buffer.concat(parts);
            const u = new URL(req.url, 'http://vendor.invalid');
            const query = {};
            for (const [k, val] of u.searchParams) {
                (query[k] = query[k] || []).push(val);
            }
            const text = body.toString('utf8');
            let json;
            try {
                json = JSON.parse(text);
            } catch {
                json = undefined;
            }
            counter++;
            const rec = {
                n: counter, method: req.method, url: req.url, path: u.pathname,
                query, headers: req.headers, body, text, json,
                remotePort: req.socket.remotePort, t: Date.now(), tEnd: 0,
                closed: false, kind: 'other',
            };
            v.requests.push(rec);
            res.on('close', () => {
                if (!res.writableFinished) {
                    rec.closed = true;
                }
                rec.tEnd = Date.now();
            });
            try {
                await answer(rec, req, res, await route(rec));
            } catch (e) {
                if (!res.headersSent && !res.destroyed) {
                    res.writeHead(500, { 'Content-Type': 'application/json' });
                    res.end(JSON.stringify({ error: { message: `vendor mock: ${e.message}` } }));
                } else {
                    res.destroy();
                }
            }
        });
    });
    server.keepAliveTimeout = 5000;
    server.on('connection', (s) => {
        sockets.add(s);
        s.on('close', () => sockets.delete(s));
    });
    await new Promise((resolve, reject) => {
        server.on('error', reject);
        server.listen(0, '127.0.0.1', resolve);
    });
    v.port = server.address().port;
    v.url = `http://127.0.0.1:${v.port}`;

    function close() {
        return new Promise((resolve) => {
            for (const s of sockets) {
                s.destroy();
            }
            server.close(() => resolve());
            setTimeout(resolve, 2000).unref();
        });
    }
    return v;
}

/* ------------------------------------------------------------------ */
/* SSE and multipart                                                   */
/* ------------------------------------------------------------------ */

/* One event-stream frame; data may hold newlines (several data: lines). */
export function sseFrame({ event, id, data, crlf = false, comment }) {
    const nl = crlf ? '\r\n' : '\n';
    let s = '';
    if (comment !== undefined) {
        s += `: ${comment}${nl}`;
    }
    if (event !== undefined) {
        s += `event: ${event}${nl}`;
    }
    if (id !== undefined) {
        s += `id: ${id}${nl}`;
    }
    const d = typeof data === 'string' ? data : JSON.stringify(data);
    for (const line of d.split('\n')) {
        s += `data: ${line}${nl}`;
    }
    return s + nl;
}

/*
 * A multipart/form-data body: fields [[name, value]], files [{name,
 * filename, type, data: Buffer}] -> {body: Buffer, contentType}.
 */
export function multipartBody(fields = [], files = []) {
    const boundary = `----llmgw${randomBytes(12).toString('hex')}`;
    const chunks = [];
    for (const [name, value] of fields) {
        chunks.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; ` +
            `name="${name}"\r\n\r\n${value}\r\n`));
    }
    for (const f of files) {
        chunks.push(Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; ` +
            `name="${f.name}"; filename="${f.filename}"\r\n` +
            `Content-Type: ${f.type || 'application/octet-stream'}\r\n\r\n`));
        chunks.push(f.data, Buffer.from('\r\n'));
    }
    chunks.push(Buffer.from(`--${boundary}--\r\n`));
    return { body: Buffer.concat(chunks), contentType: `multipart/form-data; boundary=${boundary}` };
}

/* Parses a multipart/form-data body -> [{name, filename, type, data: Buffer}]. */
export function parseMultipart(body, contentType) {
    const m = /boundary=(?:"([^"]+)"|([^;]+))/i.exec(contentType || '');
    assert.ok(m, `no multipart boundary in ${contentType}`);
    const delim = Buffer.from(`--${m[1] || m[2].trim()}`);
    const parts = [];
    let pos = body.indexOf(delim);
    assert.ok(pos >= 0, 'multipart body without its boundary');
    for (;;) {
        pos += delim.length;
        if (body.slice(pos, pos + 2).toString() === '--') {
            break;
        }
        pos += 2; /* CRLF after the boundary */
        const headEnd = body.indexOf('\r\n\r\n', pos);
        assert.ok(headEnd >= 0, 'multipart part without a header end');
        const head = body.slice(pos, headEnd).toString('utf8');
        const next = body.indexOf(delim, headEnd + 4);
        assert.ok(next >= 0, 'multipart body not closed');
        const data = body.slice(headEnd + 4, next - 2); /* CRLF before delim */
        const disp = /content-disposition:[^\r\n]*/i.exec(head);
        const name = disp && /\bname="([^"]*)"/i.exec(disp[0]);
        const filename = disp && /\bfilename="([^"]*)"/i.exec(disp[0]);
        const type = /content-type:\s*([^\r\n]+)/i.exec(head);
        parts.push({
            name: name ? name[1] : undefined,
            filename: filename ? filename[1] : undefined,
            type: type ? type[1].trim() : undefined,
            data,
        });
        pos = next;
    }
    return parts;
}

/* ------------------------------------------------------------------ */
/* plugin fixtures                                                     */
/* ------------------------------------------------------------------ */

function replaceConst(src, name, value, file) {
    const re = new RegExp(`^const ${name} = .*;$`, 'm');
    assert.ok(re.test(src), `${file}: no one-line "const ${name} = ...;"`);
    return src.replace(re, () => `const ${name} = ${JSON.stringify(value)};`);
}

/*
 * A fixture of t/integration/fixtures/plugins with its `const` lines set:
 * key, models, and for task-vendor.js nativeModels (default the first
 * model), allowedHosts and errorRenderer; `consts` sets any other const
 * line by name.
 */
export function pluginSource(file, { key, models, nativeModels, allowedHosts,
    errorRenderer, consts = {} } = {}) {
    let src = fs.readFileSync(path.join(PLUGIN_FIXTURES, file), 'utf8');
    for (const [name, value] of Object.entries(consts)) {
        src = replaceConst(src, name, value, file);
    }
    if (key !== undefined) {
        assert.ok(key.length <= 30, `plugin key over 30 characters: ${key}`);
        src = replaceConst(src, 'KEY', key, file);
    }
    if (models !== undefined) {
        src = replaceConst(src, 'MODELS', models, file);
    }
    if (/^const NATIVE_MODELS = /m.test(src) && (nativeModels || models)) {
        src = replaceConst(src, 'NATIVE_MODELS', nativeModels || models.slice(0, 1), file);
    }
    if (allowedHosts !== undefined) {
        src = replaceConst(src, 'ALLOWED_HOSTS', allowedHosts, file);
    }
    if (errorRenderer !== undefined) {
        src = replaceConst(src, 'WITH_ERROR_RENDERER', Boolean(errorRenderer), file);
    }
    return src;
}

/* ------------------------------------------------------------------ */
/* processes                                                           */
/* ------------------------------------------------------------------ */

/* Inodes of the IPv4/IPv6 TCP sockets whose local port is `port`. */
function socketInodes(port) {
    const out = new Set();
    for (const f of ['/proc/net/tcp', '/proc/net/tcp6']) {
        let text;
        try {
            text = fs.readFileSync(f, 'utf8');
        } catch {
            continue;
        }
        for (const line of text.split('\n').slice(1)) {
            const cols = line.trim().split(/\s+/);
            if (cols.length < 10) {
                continue;
            }
            const local = cols[1].split(':');
            if (parseInt(local[local.length - 1], 16) === port) {
                out.add(cols[9]);
            }
        }
    }
    return out;
}

/*
 * Which of pids owns the client end of a connection whose local port is
 * `port` (the remotePort a vendor saw): via /proc/<pid>/fd.  null if none.
 */
export function pidOwningPort(port, pids) {
    const inodes = socketInodes(port);
    for (const pid of pids) {
        let fds;
        try {
            fds = fs.readdirSync(`/proc/${pid}/fd`);
        } catch {
            continue;
        }
        for (const fd of fds) {
            let link;
            try {
                link = fs.readlinkSync(`/proc/${pid}/fd/${fd}`);
            } catch {
                continue;
            }
            const m = /^socket:\[(\d+)\]$/.exec(link);
            if (m && inodes.has(m[1])) {
                return pid;
            }
        }
    }
    return null;
}

/*
 * Stops a gateway one of whose workers was killed on purpose: nginx's own
 * "exited on signal 9" alert is expected there, no other alert or emerg.
 */
export async function stopAfterKill(gw) {
    if (!gw) {
        return;
    }
    await gw.stop();
    const bad = gw.errorLog().split('\n')
        .filter((l) => /\[(alert|emerg)\]/.test(l) && !/exited on signal 9/.test(l));
    assert.deepEqual(bad, [], `error log of ${gw.dir} has alert/emerg lines`);
    assert.equal(gw.killed, false, `nginx in ${gw.dir} did not stop within 5 s of SIGQUIT`);
    if (gw.v8host) {
        assert.equal(gw.v8host.status, 'stopped', 'the plugin runtime helper still runs');
    }
    if (!process.env.LLMGW_KEEP) {
        gw.v8host?.cleanup();
        fs.rmSync(gw.dir, { recursive: true, force: true });
    }
}

/* ------------------------------------------------------------------ */
/* task test helpers (gateway side)                                    */
/* ------------------------------------------------------------------ */

/* Fields of the task view of /v1/tasks. */
export const VIEW_KEYS = ['task_id', 'status', 'progress', 'fail_reason', 'created_at',
    'updated_at', 'finished_at', 'data', 'model', 'action', 'plugin'];
export const TERMINAL = ['SUCCESS', 'FAILURE'];

export async function uploadPlugin(gw, source) {
    const r = await gw.admin('POST', '/api/plugin/task', { source, enabled: true });
    assert.equal(r.status, 200, `plugin upload: ${r.status} ${r.text.slice(0, 1000)}`);
    return r.json;
}

/* A user with a known quota and an unlimited key: {user, token, key, quota0}. */
export async function account(gw, { quota = 100000000 } = {}) {
    const user = await makeUser(gw, { quota });
    const token = await makeKey(gw, user.id, { unlimited_quota: true });
    return { user, token, key: token.key, quota0: quota };
}

let setupCounter = 0;

/*
 * One plugin variant bound to type-61 channels on the given vendors, priced,
 * and an account; waits until the change reached every worker and node.
 *   fixture       file under fixtures/plugins (task-vendor.js)
 *   vendors       mock vendors, one channel each (required)
 *   price         'call' (0.01 USD per task = 5000 quota) or 'unit'
 *                 ({pluginKey}::{model} at 0.01 USD per second of usage)
 *   mapping       true: each model maps to "<model>-up" on the channel
 *   allowedHosts, errorRenderer, nativeModels: see pluginSource()
 *   wait          false: do not wait for propagation (the caller will)
 *   channelKey    the channels' key (default a fresh vk-<24 hex>)
 * -> {key, models, model, upstreamModel, channels, channelKey, acct, vendor}
 */
export async function taskSetup(gw, { fixture = 'task-vendor.js', vendors, price = 'call',
    mapping = false, allowedHosts, errorRenderer, nativeModels, models: nModels = 2,
    wait = true, consts, channelKey = `vk-${hex(12)}` } = {}) {
    assert.ok(vendors && vendors.length, 'taskSetup needs {vendors}');
    const t0 = Date.now();
    setupCounter++;
    const key = `tk${setupCounter}-${hex(4)}`;
    const models = Array.from({ length: nModels }, () => `${key}-m${hex(3)}`);
    await uploadPlugin(gw, pluginSource(fixture, {
        key, models, nativeModels, allowedHosts, errorRenderer, consts,
    }));

    const prices = {};
    for (const m of models) {
        if (price === 'unit') {
            prices[`${key}::${m}`] = { unit_prices: { seconds: 0.01 } };
        } else {
            prices[m] = { price: 0.01 };
        }
    }
    const pr = await gw.admin('PUT', '/api/pricing', prices);
    assert.equal(pr.status, 200, `PUT /api/pricing: ${pr.text}`);

    const channels = [];
    for (const v of vendors) {
        const body = {
            name: `${key}-ch`, type: 61, base_url: v.url, key: channelKey,
            models, groups: ['default'], settings: { task_plugin_key: key },
        };
        if (mapping) {
            body.model_mapping = Object.fromEntries(models.map((m) => [m, `${m}-up`]));
        }
        const r = await gw.admin('POST', '/api/channel', body);
        assert.equal(r.status, 200, `POST /api/channel: ${r.status} ${r.text}`);
        channels.push(r.json);
    }
    const acct = await account(gw);
    if (wait) {
        await settle(t0);
    }
    return {
        key, models, model: models[0],
        upstreamModel: mapping ? `${models[0]}-up` : models[0],
        channels, channelKey, acct, vendor: vendors[0],
    };
}

/* POST /v1/tasks/{pluginKey} with the account's key (or `key: null`). */
export function submitTask(gw, env, body, { key = env.acct.key, plugin = env.key,
    timeoutMs = 30000 } = {}) {
    return gw.req('POST', `/v1/tasks/${plugin}`, { key: key || undefined, body, timeoutMs });
}

export function getTask(gw, key, id) {
    return gw.req('GET', `/v1/tasks/${encodeURIComponent(id)}`, { key });
}

/* Polls GET /v1/tasks/{id} until pred(view) holds: -> the view. */
export async function waitTask(gw, key, id, pred, { ms = 10000, what } = {}) {
    let last;
    try {
        return await waitFor(async () => {
            const r = await getTask(gw, key, id);
            last = `${r.status} ${r.text.slice(0, 500)}`;
            return r.status === 200 && pred(r.json) ? r.json : null;
        }, ms, { what: what || `task ${id}`, intervalMs: 100 });
    } catch (e) {
        e.message += `; last view: ${last}`;
        throw e;
    }
}

export const waitStatus = (gw, key, id, status, opts = {}) =>
    waitTask(gw, key, id, (v) => v.status === status,
        { what: `task ${id} status ${status}`, ...opts });

/* Ledger rows of one request id (a task id), straight from PostgreSQL. */
export async function ledgerRows(db, requestId) {
    const out = await psql(db.conninfo,
        `select coalesce(json_agg(json_build_object('type', type, 'quota', quota,
            'token_id', token_id) order by id), '[]')
           from logs where request_id = '${requestId.replace(/'/g, "''")}'`);
    return JSON.parse(out);
}

/* reserve + adjust + settle (+ consume) - refund. */
export function ledgerSum(rows) {
    let s = 0;
    for (const r of rows) {
        if (['reserve', 'adjust', 'settle', 'consume'].includes(r.type)) {
            s += Number(r.quota);
        } else if (r.type === 'refund') {
            s -= Number(r.quota);
        }
    }
    return s;
}

/* The ledger rows of a task, keyed by type, once `types` are all there. */
export async function waitLedger(db, taskId, types, { ms = 8000 } = {}) {
    let rows = [];
    await waitFor(async () => {
        rows = await ledgerRows(db, taskId);
        return types.every((t) => rows.some((r) => r.type === t));
    }, ms, { what: `ledger rows ${types} of ${taskId} (have ${JSON.stringify(rows)})`,
        intervalMs: 100 });
    const byType = {};
    for (const r of rows) {
        assert.ok(!(r.type in byType), `two ${r.type} rows for ${taskId}`);
        byType[r.type] = Number(r.quota);
    }
    return byType;
}

/*
 * Waits until the account shows `used` charged: the key's and the user's
 * used_quota, the user's quota, and the key's ledger sum all agree.
 */
export async function expectUsed(gw, db, acct, used, { ms = 8000 } = {}) {
    let last;
    await waitFor(async () => {
        const t = await gw.admin('GET', `/api/token/${acct.token.id}`);
        const u = await gw.admin('GET', `/api/user/${acct.user.id}`);
        const rows = JSON.parse(await psql(db.conninfo,
            `select coalesce(json_agg(json_build_object('type', type, 'quota', quota)), '[]')
               from logs where token_id = ${Number(acct.token.id)}`));
        last = {
            tokenUsed: t.json && t.json.used_quota, userUsed: u.json && u.json.used_quota,
            userQuota: u.json && u.json.quota, ledger: ledgerSum(rows),
        };
        return last.tokenUsed === used && last.userUsed === used &&
            last.userQuota === acct.quota0 - used && last.ledger === used;
    }, ms, { what: `account charged ${used}`, intervalMs: 200 }).catch((e) => {
        e.message += `; balances ${JSON.stringify(last)}`;
        throw e;
    });
    return last;
}

export async function pollFailures(db, taskId) {
    const out = await psql(db.conninfo,
        `select poll_failures from tasks where task_id = '${taskId.replace(/'/g, "''")}'`);
    return out === '' ? null : Number(out);
}

/* The error message without its " (request id: X)" tail. */
export function bareMessage(r) {
    const m = r.json && r.json.error && r.json.error.message;
    return typeof m === 'string' ? m.replace(/ \(request id: [^)]*\)$/, '') : m;
}

/* Runs fn over items with at most `limit` in flight: -> results in order. */
export async function mapLimit(items, limit, fn) {
    const out = new Array(items.length);
    let next = 0;
    async function worker() {
        while (next < items.length) {
            const i = next++;
            out[i] = await fn(items[i], i);
        }
    }
    await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
    return out;
}

/*
 * The error contract without a fixed type (the harness's assertError
 * defaults type to gateway_error): {error: {message, type, code}}, the
 * message ending with the X-Request-Id.  -> the error object.
 */
export function assertErrorShape(r, status, { code, message } = {}) {
    const ctx = `${r.status} ${r.text.slice(0, 500)}`;
    if (status !== undefined) {
        assert.equal(r.status, status, `status: ${ctx}`);
    }
    const e = r.json && r.json.error;
    assert.ok(e && typeof e === 'object', `error object: ${ctx}`);
    for (const k of ['message', 'type', 'code']) {
        assert.equal(typeof e[k], 'string', `error.${k} is a string: ${ctx}`);
    }
    const rid = r.headers['x-request-id'];
    assert.ok(rid, `X-Request-Id header missing: ${ctx}`);
    assert.ok(e.message.endsWith(` (request id: ${rid})`), `message ends with the request id: ${ctx}`);
    if (code !== undefined) {
        assert.equal(e.code, code, `error.code: ${ctx}`);
    }
    if (message !== undefined) {
        assert.match(e.message, message, `error.message: ${ctx}`);
    }
    return e;
}


/*
 * The before/after of a describe that needs its own database, a gateway
 * with the plugin runtime (startGateway options, v8host added) and a mock
 * vendor: -> an object whose db, gw and vendor are set in before().
 */
export function vendorSuite(gatewayOpts = {}) {
    const s = {};
    before(async () => {
        s.db = await createDb();
        s.gw = await startGateway({ db: s.db, v8host: true, ...gatewayOpts });
        s.vendor = await startVendor();
    });
    after(async () => {
        try {
            await stopAll(s.gw);
        } finally {
            await s.vendor?.close();
            await dropDb(s.db);
        }
    });
    return s;
}
