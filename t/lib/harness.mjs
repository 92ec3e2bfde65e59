// Integration harness: a private database per test file, the real nginx
// with the built module, and small HTTP helpers.  Node 20 built-ins only;
// every wait is bounded.
//
// Environment (set by scripts/test.sh):
//   LLMGW_MODULE   absolute path of ngx_http_llmgw_module.so
//   LLMGW_PG_SOCK  PostgreSQL unix socket dir
//   LLMGW_PG_PORT  PostgreSQL port
//   LLMGW_REPO     repository root
//   LLMGW_TEST_DIR where gateway prefix dirs go (default <repo>/var/test)
//   LLMGW_KEEP     keep gateway dirs even when the log is clean
//   LLMGW_V8HOST   the plugin runtime helper (default
//                  <repo>/build/v8host/llmgw-v8host), for startGateway({v8host})

import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HERE = path.dirname(fileURLToPath(import.meta.url));

export const REPO = process.env.LLMGW_REPO || path.resolve(HERE, '..', '..');
export const MODULE = process.env.LLMGW_MODULE ||
    path.join(REPO, 'build', 'nginx', 'ngx_http_llmgw_module.so');
export const PG_SOCK = process.env.LLMGW_PG_SOCK || '';
export const PG_PORT = process.env.LLMGW_PG_PORT || '5432';
export const NGINX = process.env.LLMGW_NGINX || '/usr/sbin/nginx';
export const V8HOST = process.env.LLMGW_V8HOST ||
    path.join(REPO, 'build', 'v8host', 'llmgw-v8host');
/* Where each gateway gets its prefix directory. */
export const GW_BASE = process.env.LLMGW_TEST_DIR || path.join(REPO, 'var', 'test');

/* Time the spec gives an admin change to reach every worker and node. */
export const PROPAGATION_MS = 1000;

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function hex(bytes) {
    return randomBytes(bytes).toString('hex');
}

let uniqCounter = 0;

/* A name no other test (or test file running in parallel) uses. */
export function uniq(prefix = 'm') {
    uniqCounter++;
    return `${prefix}-${process.pid}-${uniqCounter}-${hex(3)}`;
}

export function sha256hex(s) {
    return createHash('sha256').update(s).digest('hex');
}

/* ------------------------------------------------------------------ */
/* processes                                                           */
/* ------------------------------------------------------------------ */

/* Runs a program to completion (bounded); rejects with its stderr. */
export function run(file, args, { timeoutMs = 60000, env } = {}) {
    return new Promise((resolve, reject) => {
        execFile(file, args, {
            timeout: timeoutMs,
            killSignal: 'SIGKILL',
            maxBuffer: 64 * 1024 * 1024,
            env: env ? { ...process.env, ...env } : process.env,
        }, (err, stdout, stderr) => {
            if (err) {
                err.message = `${file} ${args.join(' ')} failed: ` +
                    `${err.message}\n${stderr}\n${stdout}`;
                reject(err);
                return;
            }
            resolve({ stdout, stderr });
        });
    });
}

/* ------------------------------------------------------------------ */
/* PostgreSQL                                                          */
/* ------------------------------------------------------------------ */

export function conninfoFor(dbname) {
    if (!PG_SOCK) {
        throw new Error('LLMGW_PG_SOCK is not set (run through scripts/test.sh)');
    }
    return `host=${PG_SOCK} port=${PG_PORT} dbname=${dbname} user=postgres`;
}

/* Runs SQL with psql -At; returns stdout without the final newline. */
export async function psql(conninfo, sql) {
    const { stdout } = await run('psql',
        ['-X', '-At', '-v', 'ON_ERROR_STOP=1', '-d', conninfo, '-c', sql],
        { timeoutMs: 30000 });
    return stdout.replace(/\n$/, '');
}

/* A fresh, migrated database: llmgw_t_<random>. */
export async function createDb() {
    const name = `llmgw_t_${hex(6)}`;
    await psql(conninfoFor('postgres'), `CREATE DATABASE ${name}`);
    const conninfo = conninfoFor(name);
    await run('bash', [path.join(REPO, 'sql', 'migrate.sh'), conninfo],
        { timeoutMs: 60000 });
    return { name, conninfo };
}

export async function dropDb(db) {
    if (!db) {
        return;
    }
    await psql(conninfoFor('postgres'),
        `DROP DATABASE IF EXISTS ${db.name} WITH (FORCE)`);
}

/* ------------------------------------------------------------------ */
/* HTTP client                                                         */
/* ------------------------------------------------------------------ */

/*
 * One request on its own connection (no keep-alive, so nothing lingers and
 * concurrent requests spread over connections).  Records when each body
 * chunk arrived, for streaming tests.
 *   -> {status, headers, text, json, chunks: [{t, text}], t0, tHeaders, tEnd,
 *       aborted}
 */
export function httpRequest(url, {
    method = 'GET', headers = {}, body, timeoutMs = 20000, socketPath,
} = {}) {
    return new Promise((resolve, reject) => {
        const u = new URL(url);
        let payload = body;
        const h = { ...headers };
        if (payload !== undefined && typeof payload !== 'string' &&
            !Buffer.isBuffer(payload)) {
            payload = JSON.stringify(payload);
            if (!Object.keys(h).some((k) => k.toLowerCase() === 'content-type')) {
                h['Content-Type'] = 'application/json';
            }
        }
        if (payload !== undefined) {
            h['Content-Length'] = Buffer.byteLength(payload);
        }
        const t0 = Date.now();
        let done = false;
        const req = http.request({
            ...(socketPath ? { socketPath } : { host: u.hostname, port: u.port }),
            path: u.pathname + u.search,
            method,
            headers: h,
            agent: false,
        }, (res) => {
            const tHeaders = Date.now();
            const chunks = [];
            let aborted = false;
            res.setEncoding('utf8');
            res.on('data', (c) => chunks.push({ t: Date.now(), text: c }));
            res.on('aborted', () => { aborted = true; });
            const finish = () => {
                if (done) {
                    return;
                }
                done = true;
                clearTimeout(timer);
                aborted = aborted || !res.complete;
                const text = chunks.map((c) => c.text).join('');
                let json;
                try {
                    json = JSON.parse(text);
                } catch {
                    json = undefined;
                }
                resolve({
                    status: res.statusCode, headers: res.headers, text, json,
                    chunks, t0, tHeaders, tEnd: Date.now(), aborted,
                });
            };
            res.on('end', finish);
            res.on('close', finish);
            res.on('error', () => { aborted = true; finish(); });
        });
        const timer = setTimeout(() => {
            if (!done) {
                done = true;
                req.destroy();
                reject(new Error(`${method} ${url}: no complete response ` +
                    `in ${timeoutMs} ms`));
            }
        }, timeoutMs);
        req.on('error', (err) => {
            if (!done) {
                done = true;
                clearTimeout(timer);
                err.message = `${method} ${url}: ${err.message}`;
                reject(err);
            }
        });
        if (payload !== undefined) {
            req.end(payload);
        } else {
            req.end();
        }
    });
}

/*
 * Raw HTTP/1.1 text (each character one byte) to 127.0.0.1:port, read until
 * the server closes; -> {status, headers, body}.
 */
export function rawHttp(port, text, { halfClose = true } = {}) {
    return new Promise((resolve, reject) => {
        const sock = net.connect(port, '127.0.0.1');
        let got = '';
        sock.setEncoding('latin1');
        sock.on('data', (d) => { got += d; });
        sock.on('error', reject);
        sock.on('close', () => {
            const [head, ...rest] = got.split('\r\n\r\n');
            const lines = head.split('\r\n');
            const headers = {};
            for (const l of lines.slice(1)) {
                const i = l.indexOf(':');
                headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
            }
            resolve({ status: Number(lines[0].split(' ')[1]), headers,
                body: rest.join('\r\n\r\n') });
        });
        sock.setTimeout(5000, () => sock.destroy());
        /* a half-close after the request reads as a client gone to a
           request that watches its client (nginx's proxy, content) */
        if (halfClose) {
            sock.end(Buffer.from(text, 'latin1'));
        } else {
            sock.write(Buffer.from(text, 'latin1'));
        }
    });
}

/* Parses a text/event-stream body into [{event, data}]. */
export function sseEvents(text) {
    const events = [];
    for (const block of text.replace(/\r\n?/g, '\n').split('\n\n')) {
        let event = 'message';
        const data = [];
        for (const line of block.split('\n')) {
            if (line.startsWith('data:')) {
                data.push(line.slice(5).replace(/^ /, ''));
            } else if (line.startsWith('event:')) {
                event = line.slice(6).trim();
            }
        }
        if (data.length) {
            events.push({ event, data: data.join('\n') });
        }
    }
    return events;
}

/* ------------------------------------------------------------------ */
/* gateway                                                             */
/* ------------------------------------------------------------------ */

export function freePort() {
    return new Promise((resolve, reject) => {
        const s = net.createServer();
        s.on('error', reject);
        s.listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
}

function portAnswers(port) {
    return new Promise((resolve) => {
        const sock = net.connect({ host: '127.0.0.1', port });
        const t = setTimeout(() => { sock.destroy(); resolve(false); }, 500);
        sock.on('connect', () => { clearTimeout(t); sock.destroy(); resolve(true); });
        sock.on('error', () => { clearTimeout(t); resolve(false); });
    });
}

function childPids(ppid) {
    const out = [];
    for (const ent of fs.readdirSync('/proc')) {
        if (!/^\d+$/.test(ent)) {
            continue;
        }
        let status;
        try {
            status = fs.readFileSync(`/proc/${ent}/status`, 'utf8');
        } catch {
            continue;
        }
        const pp = /^PPid:\s*(\d+)/m.exec(status);
        const st = /^State:\s*(\S)/m.exec(status);
        if (pp && Number(pp[1]) === ppid && st && st[1] !== 'Z') {
            out.push(Number(ent));
        }
    }
    return out.sort((a, b) => a - b);
}

/* ------------------------------------------------------------------ */
/* plugin runtime helper (v8_host)                                     */
/* ------------------------------------------------------------------ */

/* sun_path is 108 bytes with its NUL. */
const SUN_PATH_MAX = 107;

function processAlive(pid) {
    try {
        const st = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
        const m = /^State:\s*(\S)/m.exec(st);
        return Boolean(m) && m[1] !== 'Z' && m[1] !== 'X';
    } catch {
        return false;
    }
}

/*
 * Starts llmgw-v8host on <dir>/v8host.sock (a short folder under /tmp when
 * that path does not fit a Unix socket address), its stderr appended to
 * <dir>/v8host.log, and waits until every worker is ready.
 *   workers (2), deadlineMs (the helper's default 5000), heapMb (64),
 *   extra: more command-line arguments
 * -> {socket, dir, pid, proc, workerPids(), kill(sig), stop(), start(),
 *     log(), status: 'running'|'stopped'}
 * start() starts a new helper on the same socket after stop()/kill();
 * stop() is SIGTERM, then SIGKILL to the supervisor and its workers.
 */
export async function startV8host({ dir, workers = 2, deadlineMs, heapMb,
    extra = [] } = {}) {
    assert.ok(fs.existsSync(V8HOST), `helper not built: ${V8HOST} (make build)`);
    assert.ok(dir, 'startV8host needs {dir}');
    let sockDir = dir;
    let ownDir = false;
    if (path.join(dir, 'v8host.sock').length > SUN_PATH_MAX) {
        sockDir = fs.mkdtempSync('/tmp/llmgw-v8-');
        ownDir = true;
    }
    /* nginx workers run as nobody: they must reach the socket (0666). */
    fs.chmodSync(sockDir, 0o755);
    const socket = path.join(sockDir, 'v8host.sock');
    const pidfile = path.join(sockDir, 'v8host.pid');
    const logPath = path.join(dir, 'v8host.log');
    const args = ['--socket', socket, '--workers', String(workers),
        '--pidfile', pidfile];
    if (deadlineMs !== undefined) {
        args.push('--deadline-ms', String(deadlineMs));
    }
    if (heapMb !== undefined) {
        args.push('--heap-mb', String(heapMb));
    }
    args.push(...extra);

    const readLog = () => {
        try {
            return fs.readFileSync(logPath, 'utf8');
        } catch {
            return '';
        }
    };

    let proc = null;
    let exited = null;
    let exitPromise = Promise.resolve(null);

    const h = {
        socket, dir: sockDir, logPath, workers,
        get proc() { return proc; },
        get pid() { return proc && !exited ? proc.pid : null; },
        get status() { return proc && !exited ? 'running' : 'stopped'; },
        log: readLog,

        /* The live worker processes (they change when one is restarted). */
        workerPids() {
            return proc && !exited ? childPids(proc.pid) : [];
        },

        /* Waits until `n` workers are up (after a kill of one of them). */
        async waitWorkers(n = workers, ms = 5000) {
            const end = Date.now() + ms;
            while (Date.now() < end) {
                if (h.workerPids().length >= n) {
                    return h.workerPids();
                }
                await sleep(20);
            }
            throw new Error(`helper: ${n} workers not up in ${ms} ms\n${readLog()}`);
        },

        async start() {
            assert.ok(!proc || exited, 'the helper is already running');
            const before = (readLog().match(/ ready \(/g) || []).length;
            fs.rmSync(pidfile, { force: true });
            fs.appendFileSync(logPath, `--- harness: starting ${V8HOST} ${args.join(' ')}\n`);
            const fd = fs.openSync(logPath, 'a');
            exited = null;
            const p = spawn(V8HOST, args, { stdio: ['ignore', fd, fd] });
            fs.closeSync(fd);
            proc = p;
            exitPromise = new Promise((resolve) => {
                p.on('exit', (code, signal) => {
                    if (proc === p) {
                        exited = { code, signal };
                    }
                    resolve({ code, signal });
                });
            });
            const end = Date.now() + 10000;
            for (;;) {
                const ready = (readLog().match(/ ready \(/g) || []).length - before;
                if (ready >= workers && fs.existsSync(pidfile)) {
                    return h;
                }
                if (exited || Date.now() > end) {
                    if (!exited) {
                        p.kill('SIGKILL');
                    }
                    throw new Error(`helper did not start (${JSON.stringify(exited)}):\n` +
                        readLog());
                }
                await sleep(20);
            }
        },

        /* A signal to the supervisor (SIGKILL takes its workers too). */
        async kill(signal = 'SIGKILL') {
            if (!proc || exited) {
                return exited;
            }
            const workersBefore = childPids(proc.pid);
            proc.kill(signal);
            if (signal !== 'SIGKILL' && signal !== 'SIGTERM') {
                return null;
            }
            const r = await Promise.race([exitPromise, sleep(10000)]);
            /* workers die with the supervisor (PR_SET_PDEATHSIG) */
            const end = Date.now() + 3000;
            while (workersBefore.some(processAlive) && Date.now() < end) {
                await sleep(20);
            }
            return r;
        },

        async stop() {
            if (!proc || exited) {
                return exited;
            }
            const all = [proc.pid, ...childPids(proc.pid)];
            proc.kill('SIGTERM');
            /* a running call gets its deadline + 2 s */
            const grace = (deadlineMs ?? 5000) + 3000;
            const r = await Promise.race([exitPromise, sleep(grace)]);
            if (!r) {
                for (const p of all) {
                    try {
                        process.kill(p, 'SIGKILL');
                    } catch {
                        /* already gone */
                    }
                }
                await Promise.race([exitPromise, sleep(2000)]);
            }
            return exited;
        },

        /* After the last stop(): the folder made for a long socket path. */
        cleanup() {
            if (ownDir) {
                fs.rmSync(sockDir, { recursive: true, force: true });
            }
        },
    };

    await h.start();
    return h;
}

export function nginxConf({ dir, port, dbConninfo, http: httpExtra = '',
    server = '', workers = 2, listen = '', errorLevel = 'info' }) {
    return `load_module ${MODULE};
daemon off; master_process on; worker_processes ${workers};
error_log ${dir}/error.log ${errorLevel}; pid ${dir}/nginx.pid;
${process.env.LLMGW_CORE_DIR ? `worker_rlimit_core 2g; working_directory ${process.env.LLMGW_CORE_DIR};` : ''}
events { worker_connections 1024; }
http {
  access_log ${dir}/access.log;
  client_body_temp_path ${dir}/tmp/body; proxy_temp_path ${dir}/tmp/proxy; fastcgi_temp_path ${dir}/tmp/fcgi; uwsgi_temp_path ${dir}/tmp/uwsgi; scgi_temp_path ${dir}/tmp/scgi;
  client_max_body_size 1m; client_body_buffer_size 1m;
  llmgw_database "${dbConninfo}";
  ${httpExtra}
  server {
    listen 127.0.0.1:${port}${listen ? ' ' + listen : ''};
    ${server}
    location / { llmgw_gateway; }
    location /api/ { llmgw_admin; }
    location = /metrics { llmgw_metrics; }
  }
}
`;
}

/*
 * Starts nginx with the module on a free loopback port.
 *   db        {conninfo} from createDb()
 *   workers   worker_processes (2)
 *   http      text added to the http block
 *   server    text added to the server block
 *   listen    extra listen parameters, e.g. 'reuseport' so that the kernel
 *             spreads connections over all workers
 *   conf      the whole nginx.conf (overrides everything; may use
 *             {{DIR}} and {{PORT}} placeholders)
 *   rootToken reuse a root token (several gateways on one database)
 *   clock     true: nginx runs with a monotonic clock the test moves on
 *             with gw.clockForward(ms) (t/lib/clock.c, preloaded): the
 *             clock of its timers and rate limit windows; the wall clock
 *             is left alone
 *   v8host    true or {workers, deadlineMs, heapMb, extra}: start a plugin
 *             runtime helper for this gateway (socket in its folder; also
 *             {{V8SOCK}} in conf) and add `llmgw_v8host unix:<sock>;` to
 *             the http block.  gw.v8host is then {pid, socket,
 *             workerPids(), kill(sig), stop(), start(), waitWorkers(n),
 *             log()}; gw.stop() stops it after nginx.
 */
export async function startGateway({ db, workers = 2, http: httpExtra = '',
    server = '', listen = '', conf, rootToken, v8host, errorLevel,
    clock = false } = {}) {
    assert.ok(db && db.conninfo, 'startGateway needs {db}');
    assert.ok(fs.existsSync(MODULE), `module not built: ${MODULE}`);

    const dir = path.join(GW_BASE, `gw-${hex(6)}`);
    fs.mkdirSync(path.join(dir, 'tmp'), { recursive: true });
    for (const d of ['body', 'proxy', 'fcgi', 'uwsgi', 'scgi']) {
        fs.mkdirSync(path.join(dir, 'tmp', d), { recursive: true });
        fs.chmodSync(path.join(dir, 'tmp', d), 0o777);
    }
    fs.chmodSync(path.join(dir, 'tmp'), 0o777);
    fs.chmodSync(dir, 0o755);

    const token = rootToken || hex(24);
    await psql(db.conninfo,
        `select llmgw_admin_token_set('${sha256hex(token)}')`);

    let helper = null;
    if (v8host) {
        helper = await startV8host({ dir, ...(v8host === true ? {} : v8host) });
        httpExtra = `llmgw_v8host unix:${helper.socket};\n  ${httpExtra}`;
    }

    const env = clock ? {
        ...process.env, LD_PRELOAD: await clockLibrary(),
        LLMGW_TEST_CLOCK: path.join(dir, 'clock'),
    } : process.env;
    if (clock) {
        fs.writeFileSync(env.LLMGW_TEST_CLOCK, '0');
    }

    let lastFailure = '';
    /* A port picked by freePort() can be taken before nginx binds it. */
    for (let attempt = 0; attempt < 3; attempt++) {
        const port = await freePort();
        const text = conf
            ? conf.replaceAll('{{DIR}}', dir).replaceAll('{{PORT}}', String(port))
                .replaceAll('{{V8SOCK}}', helper ? helper.socket : '')
            : nginxConf({ dir, port, dbConninfo: db.conninfo, http: httpExtra,
                server, workers, listen, errorLevel });
        fs.writeFileSync(path.join(dir, 'nginx.conf'), text);
        const gw = await launch({ dir, port, token, db, helper, env });
        if (gw.ok) {
            return gw.gw;
        }
        lastFailure = gw.why;
        if (!/Address already in use/.test(gw.why)) {
            break;
        }
    }
    if (helper) {
        await helper.stop();
        helper.cleanup();
    }
    throw new Error(`nginx did not start (dir ${dir}):\n${lastFailure}`);
}

/* t/lib/clock.c built once into GW_BASE (several test files may ask at
   once: each builds its own copy and renames it into place). */
async function clockLibrary() {
    const so = path.join(GW_BASE, 'llmgw-test-clock.so');
    const src = path.join(HERE, 'clock.c');
    if (fs.existsSync(so) && fs.statSync(so).mtimeMs >= fs.statSync(src).mtimeMs) {
        return so;
    }
    fs.mkdirSync(GW_BASE, { recursive: true });
    const tmp = `${so}.${process.pid}.${hex(4)}`;
    await run('cc', ['-shared', '-fPIC', '-O2', '-o', tmp, src, '-ldl']);
    fs.renameSync(tmp, so);
    return so;
}

async function launch({ dir, port, token, db, helper = null, env = process.env }) {
    const stderrPath = path.join(dir, 'stderr.log');
    const errFd = fs.openSync(stderrPath, 'a');
    const proc = spawn(NGINX, ['-p', dir, '-c', path.join(dir, 'nginx.conf')], {
        stdio: ['ignore', errFd, errFd], env,
    });
    fs.closeSync(errFd);
    let exited = null;
    const exitPromise = new Promise((resolve) => {
        proc.on('exit', (code, signal) => {
            exited = { code, signal };
            resolve(exited);
        });
    });

    const readLog = (name) => {
        try {
            return fs.readFileSync(path.join(dir, name), 'utf8');
        } catch {
            return '';
        }
    };
    const why = () => `exit ${JSON.stringify(exited)}\nstderr:\n` +
        `${readLog('stderr.log')}\nerror.log:\n${readLog('error.log')}`;

    const deadline = Date.now() + 10000;
    let up = false;
    while (Date.now() < deadline && !exited) {
        if (await portAnswers(port)) {
            up = true;
            break;
        }
        await sleep(50);
    }
    if (!up) {
        if (!exited) {
            proc.kill('SIGKILL');
            await Promise.race([exitPromise, sleep(2000)]);
        }
        return { ok: false, why: why() };
    }

    const url = `http://127.0.0.1:${port}`;
    let killed = false;
    let workersSeen = childPids(proc.pid);

    const gw = {
        url, port, dir, rootToken: token, db, proc,
        v8host: helper,
        get killed() { return killed; },

        async admin(method, p, body, { token: tok = token, headers = {} } = {}) {
            const h = { ...headers };
            if (tok) {
                h.Authorization = `Bearer ${tok}`;
            }
            const r = await httpRequest(url + p, { method, headers: h, body });
            return { status: r.status, headers: r.headers, json: r.json, text: r.text };
        },

        async req(method, p, { headers = {}, body, key, timeoutMs } = {}) {
            const h = { ...headers };
            if (key) {
                h.Authorization = `Bearer ${key}`;
            }
            return httpRequest(url + p, { method, headers: h, body, timeoutMs });
        },

        /* POST /v1/chat/completions with a minimal valid body. */
        chat(key, model, { content = 'hi', headers, extra = {}, timeoutMs } = {}) {
            return gw.req('POST', '/v1/chat/completions', {
                key, headers, timeoutMs,
                body: { model, messages: [{ role: 'user', content }], ...extra },
            });
        },

        /* POST /v1/messages with a minimal valid body. */
        messages(key, model, { content = 'hi', headers, extra = {}, timeoutMs } = {}) {
            return gw.req('POST', '/v1/messages', {
                key, headers, timeoutMs,
                body: {
                    model, max_tokens: 16,
                    messages: [{ role: 'user', content }], ...extra,
                },
            });
        },

        /* Moves nginx's monotonic clock on by ms (startGateway({clock})):
           as if that much time had passed while nothing happened. */
        clockForward(ms) {
            const file = env.LLMGW_TEST_CLOCK;
            assert.ok(file, 'clockForward needs startGateway({clock: true})');
            const now = Number(fs.readFileSync(file, 'utf8')) + ms;
            fs.writeFileSync(`${file}.new`, String(now));
            fs.renameSync(`${file}.new`, file);
        },

        errorLog: () => readLog('error.log'),
        accessLog: () => readLog('access.log'),

        masterPid: () => proc.pid,

        workerPids() {
            if (exited) {
                return [];
            }
            return childPids(proc.pid);
        },

        async reload() {
            const before = new Set(gw.workerPids());
            proc.kill('SIGHUP');
            const end = Date.now() + 10000;
            while (Date.now() < end) {
                const now = gw.workerPids();
                if (now.length && now.every((p) => !before.has(p)) &&
                    await portAnswers(port)) {
                    workersSeen = now;
                    return;
                }
                await sleep(50);
            }
            throw new Error(`reload: workers not replaced in 10 s\n${why()}`);
        },

        /* nginx, then its plugin runtime helper (when it has one). */
        async stop() {
            try {
                return await stopNginx();
            } finally {
                if (helper) {
                    await helper.stop();
                }
            }
        },
    };

    async function stopNginx() {
        if (exited) {
            return exited;
        }
        const workers = childPids(proc.pid).concat(workersSeen);
        proc.kill('SIGQUIT');
        const r = await Promise.race([exitPromise, sleep(5000)]);
        if (!r) {
            killed = true;
            proc.kill('SIGKILL');
            for (const w of workers) {
                try {
                    process.kill(w, 'SIGKILL');
                } catch {
                    /* already gone */
                }
            }
            await Promise.race([exitPromise, sleep(2000)]);
        }
        return exited;
    }

    /*
     * The port answers as soon as the master listens; wait until the admin
     * API recognises the root token, so that tests start on a gateway that
     * has loaded its configuration.
     */
    let last = '';
    let good = 0;
    const readyBy = Date.now() + 10000;
    while (Date.now() < readyBy && !exited) {
        try {
            const r = await gw.admin('GET', '/api/user/0');
            last = `GET /api/user/0 -> ${r.status} ${r.text.slice(0, 200)}`;
            /*
             * And the proxy side has its configuration: a keyless request
             * is refused for the key, not with 503 "not loaded yet".
             * Several answers in a row, so that more than one worker had
             * a chance to answer.
             */
            let c = { status: 0, text: '' };
            if (r.status !== 401 && r.status !== 403 && r.status < 500) {
                c = await gw.chat(undefined, 'llmgw-readiness-probe');
                last = `keyless chat -> ${c.status} ${c.text.slice(0, 200)}`;
            }
            good = c.status === 401 ? good + 1 : 0;
            if (good >= 4) {
                return { ok: true, gw };
            }
        } catch (e) {
            last = e.message;
            good = 0;
        }
        await sleep(good ? 10 : 100);
    }
    await stopNginx();   /* the helper stays for startGateway's next try */
    return { ok: false, why: `gateway not ready in 10 s: ${last}\n${why()}` };
}

/*
 * After stop(): the spec requires that nginx's error log has no [alert] or
 * [emerg] line, and a graceful stop must finish on its own.
 */
export function assertCleanLog(gw) {
    if (!gw) {
        return;
    }
    const bad = gw.errorLog().split('\n')
        .filter((l) => /\[(alert|emerg)\]/.test(l));
    assert.deepEqual(bad, [], `error log of ${gw.dir} has alert/emerg lines`);
    assert.equal(gw.killed, false,
        `nginx in ${gw.dir} did not stop within 5 s of SIGQUIT`);
    if (gw.v8host) {
        assert.equal(gw.v8host.status, 'stopped',
            `the plugin runtime helper of ${gw.dir} is still running`);
    }
    if (!process.env.LLMGW_KEEP) {
        gw.v8host?.cleanup();
        fs.rmSync(gw.dir, { recursive: true, force: true });
    }
}

/* Stops gateways, then asserts each left a clean log. */
export async function stopAll(...gws) {
    const live = gws.filter(Boolean);
    await Promise.all(live.map((g) => g.stop()));
    for (const g of live) {
        assertCleanLog(g);
    }
}

/*
 * The usual after(): stops the gateways (their logs checked), then closes
 * the mock vendors and drops the database, whatever failed before.
 */
export async function tearDown(db, gws = [], mocks = []) {
    try {
        await stopAll(...gws);
    } finally {
        for (const m of mocks) {
            await m?.close();
        }
        await dropDb(db);
    }
}

/* ------------------------------------------------------------------ */
/* admin helpers                                                       */
/* ------------------------------------------------------------------ */

function expectOk(r, what) {
    assert.equal(r.status, 200, `${what}: ${r.status} ${r.text}`);
    assert.ok(r.json && typeof r.json === 'object', `${what}: not JSON: ${r.text}`);
    return r.json;
}

export async function makeUser(gw, opts = {}) {
    const r = await gw.admin('POST', '/api/user', {
        username: uniq('user'), quota: 1000000000, group: 'default', ...opts,
    });
    return expectOk(r, 'POST /api/user');
}

/* -> the created token, with its {id, key}. Unlimited unless told. */
export async function makeKey(gw, userId, opts = {}) {
    const r = await gw.admin('POST', '/api/token', {
        user_id: userId, name: uniq('key'), unlimited_quota: true,
        remain_quota: 0, expired_time: -1, ...opts,
    });
    const j = expectOk(r, 'POST /api/token');
    assert.match(j.key, /^sk-[0-9a-f]{48}$/, 'token key format');
    return j;
}

/* An OpenAI-type channel by default; pass {base_url, models, ...}. */
export async function makeChannel(gw, { free, ...opts } = {}) {
    const r = await gw.admin('POST', '/api/channel', {
        name: uniq('ch'), type: 1, key: `upstream-${hex(8)}`,
        groups: ['default'], priority: 0, weight: 1, ...opts,
    });
    const ch = expectOk(r, 'POST /api/channel');
    if (free !== false) {
        await makeFree(gw, ch.models || []);
    }
    return ch;
}

/*
 * The gateway serves only priced models; tests that are not about billing
 * make their models free (a ratio of 0), unless a price is already set.
 */
export async function makeFree(gw, models) {
    const cur = await gw.admin('GET', '/api/pricing');
    const body = {};
    for (const m of models) {
        if (!cur.json || !(m in cur.json)) {
            body[m] = { ratio: 0, completion_ratio: 1 };
        }
    }
    if (Object.keys(body).length) {
        expectOk(await gw.admin('PUT', '/api/pricing', body), 'PUT /api/pricing');
    }
}

/* A user and an unlimited key in one step: -> {user, token, key}. */
export async function makeUserKey(gw, userOpts = {}, keyOpts = {}) {
    const user = await makeUser(gw, userOpts);
    const token = await makeKey(gw, user.id, keyOpts);
    return { user, token, key: token.key };
}

/* ------------------------------------------------------------------ */
/* assertions and polling                                              */
/* ------------------------------------------------------------------ */

/*
 * The error contract: {"error": {message, type, code}}, the message ends
 * with " (request id: <id>)" and the id is the X-Request-Id header.
 */
export function assertError(r, status, { type = 'gateway_error', code,
    message } = {}) {
    const ctx = `${r.status} ${r.text.slice(0, 500)}`;
    assert.equal(r.status, status, `status: ${ctx}`);
    assert.ok(r.json && r.json.error && typeof r.json.error === 'object',
        `error object: ${ctx}`);
    const e = r.json.error;
    assert.equal(typeof e.message, 'string', `error.message: ${ctx}`);
    assert.equal(typeof e.code, 'string', `error.code is a string: ${ctx}`);
    if (type !== undefined) {
        assert.equal(e.type, type, `error.type: ${ctx}`);
    }
    if (code !== undefined) {
        assert.equal(e.code, code, `error.code: ${ctx}`);
    }
    const rid = r.headers['x-request-id'];
    assert.ok(rid, `X-Request-Id header missing: ${ctx}`);
    assert.ok(e.message.endsWith(` (request id: ${rid})`),
        `message ends with the request id ${rid}: ${e.message}`);
    if (message instanceof RegExp) {
        assert.match(e.message, message, `error.message: ${ctx}`);
    } else if (typeof message === 'string') {
        assert.ok(e.message.startsWith(message),
            `error.message starts with ${JSON.stringify(message)}: ${ctx}`);
    }
    return e;
}

export function assertOk(r, what = '') {
    assert.equal(r.status, 200, `${what} ${r.status} ${r.text.slice(0, 500)}`);
    return r;
}

/*
 * Retries fn (which throws on failure) until it passes or ms have passed
 * since `since`; an attempt started before the deadline counts.
 */
export async function eventually(fn, { ms = 5000, since = Date.now(),
    intervalMs = 50 } = {}) {
    let lastErr;
    for (;;) {
        const started = Date.now();
        try {
            return await fn();
        } catch (e) {
            lastErr = e;
        }
        if (started - since >= ms) {
            lastErr.message = `not true within ${ms} ms: ${lastErr.message}`;
            throw lastErr;
        }
        await sleep(Math.min(intervalMs, Math.max(0, since + ms - Date.now())));
    }
}

/* Waits until an admin change must have reached every worker and node. */
export async function settle(since = Date.now()) {
    const wait = since + PROPAGATION_MS + 100 - Date.now();
    if (wait > 0) {
        await sleep(wait);
    }
}

/* Runs n copies of fn(i) concurrently. */
export function times(n, fn) {
    return Promise.all(Array.from({ length: n }, (_, i) => fn(i)));
}

/* GET /api/log rows matching a query, polled until pred(items) holds. */
export async function waitLogs(gw, query, pred, { ms = 5000 } = {}) {
    const qs = new URLSearchParams(query).toString();
    let last;
    return eventually(async () => {
        const r = await gw.admin('GET', `/api/log?${qs}`);
        assert.equal(r.status, 200, `GET /api/log?${qs}: ${r.status} ${r.text}`);
        last = r.json;
        assert.ok(Array.isArray(last.items), `items: ${r.text}`);
        assert.ok(pred(last.items, last),
            `log rows for ${qs}: ${JSON.stringify(last).slice(0, 2000)}`);
        return last;
    }, { ms, intervalMs: 200 });
}

/* channels_tried as a list of numbers, whether stored as array or text. */
export function idList(v) {
    if (Array.isArray(v)) {
        return v.map((x) => Number(typeof x === 'object' && x ? x.id : x));
    }
    if (typeof v === 'string') {
        return (v.match(/\d+/g) || []).map(Number);
    }
    return [];
}
