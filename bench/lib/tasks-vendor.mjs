// The mock task vendor of bench/tasks.sh (Node 20 built-ins only).
//
//   node tasks-vendor.mjs --port P --key K
//
// Listens on 127.0.0.1:P (HTTP/1.1, keep-alive, no per-socket request cap)
// and answers, cheaply and without recording bodies:
//   POST /submit          200 {"id": "v<n>", "status": "queued"}
//   GET  /tasks/<id>      200 {"status": "running"}  (the plugin maps it to
//                         IN_PROGRESS, so no task ever ends)
//   a request without "Authorization: Bearer K" on those two: 401 (counted)
//   anything else: 404 (counted)
// and, for the benchmark script (never called by the gateway):
//   POST /_bench/mark-submit  ids handed out from now on are the measured set
//                             (replacing the previous one)
//   POST /_bench/mark-poll    from now on, note each measured id's first poll
//   GET  /_bench/stats        counters (JSON, see stats() below; earlyPolls:
//                             polls of measured ids before mark-poll)
//   GET  /_bench/firsts       the measured ids' first-poll times since
//                             mark-poll, ms after it, ascending (JSON array)
// Times are wall-clock milliseconds (performance.timeOrigin + now(), with
// fractions) so that the client can compare them with its own.

import http from 'node:http';
import { performance } from 'node:perf_hooks';

function args(argv) {
    const o = {};
    for (let i = 0; i < argv.length; i += 2) {
        o[argv[i].replace(/^--/, '')] = argv[i + 1];
    }
    return o;
}

const o = args(process.argv.slice(2));
const PORT = Number(o.port);
const AUTH = `Bearer ${o.key || ''}`;
if (!(PORT > 0 && PORT < 65536) || !o.key) {
    console.error('usage: tasks-vendor.mjs --port P --key K');
    process.exit(2);
}

const clock = () => performance.timeOrigin + performance.now();

const c = {
    submits: 0, polls: 0, badAuth: 0, other: 0, connections: 0, open: 0, maxOpen: 0,
    unknownPolls: 0, measuredSubmits: 0, pollsSinceMark: 0, earlyPolls: 0,
};
let nextId = 0;
let measuring = false;          /* after mark-submit */
const measured = new Set();     /* ids handed out after mark-submit */
let markAt = 0;                 /* mark-poll time, 0 before it */
const firstPoll = new Map();    /* measured id -> ms after markAt */
let lastFirst = 0;

const SUBMIT_HEAD = { 'Content-Type': 'application/json' };
const POLL_BODY = Buffer.from('{"status":"running"}');
const POLL_HEAD = {
    'Content-Type': 'application/json', 'Content-Length': String(POLL_BODY.length),
};

function send(res, status, body, headers = SUBMIT_HEAD) {
    res.writeHead(status, headers);
    res.end(body);
}

function stats() {
    return {
        ...c, ids: nextId, measured: measured.size, markAt,
        polledMeasured: firstPoll.size, lastFirstMs: lastFirst,
        now: clock(),
    };
}

function onPoll(req, res, id) {
    c.polls++;
    if (markAt) {
        c.pollsSinceMark++;
        if (measured.has(id)) {
            if (!firstPoll.has(id)) {
                lastFirst = clock() - markAt;
                firstPoll.set(id, lastFirst);
            }
        } else {
            c.unknownPolls++;
        }
    } else if (measured.has(id)) {
        c.earlyPolls++;
    }
    res.writeHead(200, POLL_HEAD);
    res.end(POLL_BODY);
}

function onSubmit(req, res) {
    c.submits++;
    const id = `v${++nextId}`;
    if (measuring) {
        measured.add(id);
        c.measuredSubmits++;
    }
    send(res, 200, `{"id":"${id}","status":"queued"}`);
}

function onBench(req, res, path) {
    if (req.method === 'POST' && path === '/_bench/mark-submit') {
        measuring = true;
        measured.clear();
        c.measuredSubmits = 0;
        c.earlyPolls = 0;
        return send(res, 200, '{"ok":true}');
    }
    if (req.method === 'POST' && path === '/_bench/mark-poll') {
        firstPoll.clear();
        lastFirst = 0;
        c.pollsSinceMark = 0;
        c.unknownPolls = 0;
        markAt = clock();
        return send(res, 200, JSON.stringify({ markAt }));
    }
    if (req.method === 'GET' && path === '/_bench/stats') {
        return send(res, 200, JSON.stringify(stats()));
    }
    if (req.method === 'GET' && path === '/_bench/firsts') {
        const t = Float64Array.from(firstPoll.values()).sort();
        return send(res, 200, JSON.stringify(Array.from(t, (x) => Math.round(x * 10) / 10)));
    }
    c.other++;
    return send(res, 404, '{"error":{"message":"no such endpoint"}}');
}

const server = http.createServer({ keepAlive: true }, (req, res) => {
    const path = req.url.split('?', 1)[0];
    /* bodies are not needed: drain them, answer at their end */
    req.resume();
    req.on('end', () => {
        if (path.startsWith('/_bench/')) {
            return onBench(req, res, path);
        }
        const m = /^\/tasks\/([^/]+)$/.exec(path);
        const known = (req.method === 'POST' && path === '/submit') || (req.method === 'GET' && m);
        if (!known) {
            c.other++;
            return send(res, 404, '{"error":{"message":"no such endpoint"}}');
        }
        if (req.headers.authorization !== AUTH) {
            c.badAuth++;
            return send(res, 401, '{"error":{"message":"bad key"}}');
        }
        return m ? onPoll(req, res, decodeURIComponent(m[1])) : onSubmit(req, res);
    });
});
server.keepAliveTimeout = 120000;
server.headersTimeout = 125000;
server.requestTimeout = 60000;
server.maxRequestsPerSocket = 0;
server.on('connection', (s) => {
    c.connections++;
    c.open++;
    c.maxOpen = Math.max(c.maxOpen, c.open);
    s.on('close', () => c.open--);
});
server.listen(PORT, '127.0.0.1');

for (const sig of ['SIGTERM', 'SIGINT']) {
    process.on(sig, () => {
        server.closeAllConnections();
        server.close(() => process.exit(0));
        setTimeout(() => process.exit(0), 2000).unref();
    });
}
