// A paced OpenAI-style SSE upstream for bench/stream.sh.
//
//   node sse-upstream.mjs <port> [chunks=20] [interval_ms=50]
//
// Every POST is answered with text/event-stream: `chunks` chat.completion
// chunks, the first as soon as the request body has arrived, then one every
// interval_ms (scheduled against the start, so they do not drift), then a
// finish_reason chunk with the usage and `data: [DONE]`.  Each JSON chunk
// carries
//     "x_bench": {"seq": i, "recv_ns": "<request arrival>", "sent_ns": "<now>"}
// taken from process.hrtime (CLOCK_MONOTONIC: one clock for every process
// on the machine), so a client can compute arrival - send per chunk.
// Listens on 127.0.0.1 only.  Exits on SIGTERM/SIGINT.

import http from 'node:http';

const port = Number(process.argv[2]);
const CHUNKS = Number(process.argv[3] || 20);
const INTERVAL = Number(process.argv[4] || 50);
if (!Number.isInteger(port) || port <= 0) {
    console.error('usage: node sse-upstream.mjs <port> [chunks] [interval_ms]');
    process.exit(2);
}

const now = () => process.hrtime.bigint();
let served = 0;

const server = http.createServer((req, res) => {
    const parts = [];
    req.on('data', (c) => parts.push(c));
    req.on('end', () => {
        const recv = now();
        let model = 'bench-stream';
        try {
            model = JSON.parse(Buffer.concat(parts).toString('utf8')).model || model;
        } catch {
            /* keep the default */
        }
        served++;
        const id = `chatcmpl-bench-${served}`;
        const created = Math.floor(Date.now() / 1000);
        const recvNs = recv.toString();
        res.writeHead(200, {
            'Content-Type': 'text/event-stream',
            'Cache-Control': 'no-cache',
        });
        const chunk = (seq, choices, extra = {}) => `data: ${JSON.stringify({
            id, object: 'chat.completion.chunk', created, model, choices, ...extra,
            x_bench: { seq, recv_ns: recvNs, sent_ns: now().toString() },
        })}\n\n`;
        const t0 = performance.now();
        let seq = 0;
        let closed = false;
        res.on('close', () => { closed = true; });
        const step = () => {
            if (closed) {
                return;
            }
            if (seq < CHUNKS) {
                const delta = seq === 0
                    ? { role: 'assistant', content: `tok${seq} ` }
                    : { content: `tok${seq} ` };
                res.write(chunk(seq, [{ index: 0, delta, finish_reason: null }]));
                seq++;
                const due = t0 + seq * INTERVAL;
                setTimeout(step, Math.max(0, due - performance.now()));
                return;
            }
            res.write(chunk(seq, [{ index: 0, delta: {}, finish_reason: 'stop' }], {
                usage: { prompt_tokens: 9, completion_tokens: CHUNKS, total_tokens: 9 + CHUNKS },
            }));
            res.end('data: [DONE]\n\n');
        };
        step();
    });
});
server.keepAliveTimeout = 65000;
server.headersTimeout = 66000;
server.requestTimeout = 0;
server.maxHeadersCount = 100;
server.listen(port, '127.0.0.1', () => {
    console.log(`sse-upstream listening on 127.0.0.1:${port}`);
});
const stop = () => {
    server.close();
    server.closeAllConnections();
    setTimeout(() => process.exit(0), 200).unref();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
