// A stand-in for the video vendor docs/examples/my-video.js adapts, for
// trying the plugin on one machine (it listens on 127.0.0.1 only):
//
//   node docs/examples/video-vendor.mjs [port]      (default 9200)
//
//   POST /v1/videos       {model, prompt, duration}  -> {id}
//   GET  /v1/videos/{id}  -> {id, status, progress, duration?, video_url?}
//
// A task is queued, runs, and succeeds after FINISH_MS (3 s; each poll
// moves its progress), reporting the duration it was asked for.  Tasks
// live in memory; at most 10,000 are kept.

import http from 'node:http';

const FINISH_MS = 3000;
const MAX_TASKS = 10000;

export function startVideoVendor({ port = 9200, finishMs = FINISH_MS } = {}) {
    const tasks = new Map();
    let n = 0;

    const send = (res, status, body) => {
        const text = JSON.stringify(body);
        res.writeHead(status, { 'Content-Type': 'application/json',
            'Content-Length': Buffer.byteLength(text) });
        res.end(text);
    };

    const server = http.createServer((req, res) => {
        let raw = '';
        req.setEncoding('utf8');
        req.on('data', (c) => { raw += c; });
        req.on('end', () => {
            if (!/^Bearer \S+/.test(req.headers.authorization || '')) {
                return send(res, 401, { error: 'a bearer key is required' });
            }
            if (req.method === 'POST' && req.url === '/v1/videos') {
                let body;
                try {
                    body = JSON.parse(raw);
                } catch {
                    return send(res, 400, { error: 'the body is not JSON' });
                }
                if (tasks.size >= MAX_TASKS) {
                    tasks.delete(tasks.keys().next().value);
                }
                const id = `vid-${Date.now().toString(36)}-${++n}`;
                tasks.set(id, { started: Date.now(), duration: Number(body.duration) || 5 });
                return send(res, 200, { id });
            }
            const m = /^\/v1\/videos\/([^/?]+)$/.exec(req.url);
            const t = m && req.method === 'GET' && tasks.get(decodeURIComponent(m[1]));
            if (!t) {
                return send(res, 404, { error: 'no such task' });
            }
            const age = Date.now() - t.started;
            if (age >= finishMs) {
                return send(res, 200, { id: m[1], status: 'succeeded', progress: 100,
                    duration: t.duration, video_url: `https://cdn.example/${m[1]}.mp4` });
            }
            return send(res, 200, { id: m[1], status: age < finishMs / 3 ? 'queued' : 'running',
                progress: Math.floor((age * 100) / finishMs) });
        });
    });

    return new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, '127.0.0.1', () => resolve({
            url: `http://127.0.0.1:${server.address().port}`,
            close: () => new Promise((r) => server.close(r)),
        }));
    });
}

if (import.meta.url === `file://${process.argv[1]}`) {
    const v = await startVideoVendor({ port: Number(process.argv[2]) || 9200 });
    console.log(`video vendor on ${v.url}`);
}
