// Mock model vendors on 127.0.0.1: an HTTP server that records every
// request and answers through a replaceable handler, plus builders for
// OpenAI- and Anthropic-style bodies and streams, and a DNS server for
// nginx's resolver.

import { randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/*
 * startMock(handler) -> {url, port, requests, handler, reset(), close()}
 * handler(req, res, rec) answers; rec = {method, path, headers, body, json, t}
 * is already in `requests` (the body has been read).  `mock.handler` may be
 * replaced between tests.  Without a handler the mock echoes: an OpenAI chat
 * completion, or an Anthropic message on a path ending in /v1/messages.
 */
export async function startMock(handler = echo) {
    const mock = {
        url: '', port: 0, requests: [], handler,
        reset() { mock.requests.length = 0; },
        close,
    };
    const server = http.createServer((req, res) => {
        const parts = [];
        req.on('data', (c) => parts.push(c));
        req.on('end', async () => {
            const body = Buffer.concat(parts).toString('utf8');
            let json;
            try {
                json = JSON.parse(body);
            } catch {
                json = undefined;
            }
            const rec = {
                method: req.method, path: req.url, headers: req.headers,
                body, json, t: Date.now(),
            };
            mock.requests.push(rec);
            try {
                await mock.handler(req, res, rec);
            } catch (e) {
                if (!res.headersSent) {
                    sendJson(res, 500, { error: { message: `mock: ${e.message}` } });
                } else {
                    res.destroy();
                }
            }
        });
    });
    server.keepAliveTimeout = 5000;
    await new Promise((resolve, reject) => {
        server.on('error', reject);
        server.listen(0, '127.0.0.1', resolve);
    });
    mock.port = server.address().port;
    mock.url = `http://127.0.0.1:${mock.port}`;

    function close() {
        return new Promise((resolve) => {
            server.closeAllConnections();
            server.close(() => resolve());
            setTimeout(resolve, 2000).unref();
        });
    }
    return mock;
}

/* A loopback port with nothing listening: connections are refused. */
export async function startClosedPort() {
    /*
     * Below the ephemeral range: a port freed there could be handed to the
     * next listen(0) of a test running alongside, which would then answer
     * in its place.  A port in use is passed over.
     */
    let low = 32768;
    try {
        low = Number(fs.readFileSync('/proc/sys/net/ipv4/ip_local_port_range',
                                     'utf8').trim().split(/\s+/)[0]) || low;
    } catch {
        /* the usual Linux default */
    }
    const from = Math.max(1024, low - 12000);
    for (let i = 0; i < 200; i++) {
        const port = from + randomBytes(2).readUInt16BE(0) % (low - from);
        const s = net.createServer();
        const ok = await new Promise((resolve) => {
            s.once('error', () => resolve(false));
            s.listen(port, '127.0.0.1', () => resolve(true));
        });
        if (ok) {
            await new Promise((resolve) => s.close(resolve));
            return { url: `http://127.0.0.1:${port}`, port };
        }
    }
    throw new Error('no free port below the ephemeral range');
}

/* Handler that accepts the request and never answers. */
export function hang() {
}

/* The default handler: echo the model back with fixed usage. */
export function echo(req, res, rec) {
    const model = rec.json && rec.json.model;
    if (rec.path.endsWith('/v1/messages')) {
        sendJson(res, 200, anthropicMessage({ model }));
    } else {
        sendJson(res, 200, openaiChat({ model }));
    }
}

export function sendJson(res, status, obj, headers = {}) {
    const body = typeof obj === 'string' ? obj : JSON.stringify(obj);
    res.writeHead(status, {
        'Content-Type': 'application/json',
        'Content-Length': Buffer.byteLength(body),
        ...headers,
    });
    res.end(body);
}

function id(prefix) {
    return `${prefix}${randomBytes(8).toString('hex')}`;
}

/* ---------------------------------------------------------------- */
/* OpenAI                                                            */
/* ---------------------------------------------------------------- */

export function openaiChat({ model = 'gpt-mock', content = 'hello from mock',
    usage = { prompt_tokens: 10, completion_tokens: 20 } } = {}) {
    const body = {
        id: id('chatcmpl-'),
        object: 'chat.completion',
        created: Math.floor(Date.now() / 1000),
        model,
        choices: [{
            index: 0,
            message: { role: 'assistant', content },
            finish_reason: 'stop',
        }],
    };
    if (usage) {
        body.usage = {
            ...usage,
            total_tokens: (usage.prompt_tokens || 0) + (usage.completion_tokens || 0),
        };
    }
    return body;
}

function sseHead(res) {
    res.writeHead(200, {
        'Content-Type': 'text/event-stream',
        'Cache-Control': 'no-cache',
    });
    res.flushHeaders();
}

/*
 * Streams chat.completion.chunk events, one per string in `chunks`, then an
 * optional usage chunk and `data: [DONE]`.  Waits delayMs between content
 * chunks.  Resolves to the times each content chunk was written.
 */
export async function openaiStream(res, chunks, { delayMs = 0, usage,
    model = 'gpt-mock', end = true } = {}) {
    sseHead(res);
    const cid = id('chatcmpl-');
    const created = Math.floor(Date.now() / 1000);
    const times = [];
    for (let i = 0; i < chunks.length; i++) {
        if (i > 0 && delayMs) {
            await sleep(delayMs);
        }
        const delta = i === 0
            ? { role: 'assistant', content: chunks[i] }
            : { content: chunks[i] };
        times.push(Date.now());
        res.write(`data: ${JSON.stringify({
            id: cid, object: 'chat.completion.chunk', created, model,
            choices: [{ index: 0, delta, finish_reason: null }],
        })}\n\n`);
    }
    if (!end) {
        return times;
    }
    res.write(`data: ${JSON.stringify({
        id: cid, object: 'chat.completion.chunk', created, model,
        choices: [{ index: 0, delta: {}, finish_reason: 'stop' }],
    })}\n\n`);
    if (usage) {
        res.write(`data: ${JSON.stringify({
            id: cid, object: 'chat.completion.chunk', created, model,
            choices: [],
            usage: {
                ...usage,
                total_tokens: (usage.prompt_tokens || 0) + (usage.completion_tokens || 0),
            },
        })}\n\n`);
    }
    res.end('data: [DONE]\n\n');
    return times;
}

export function openaiError(res, status, message, {
    type = 'invalid_request_error', code = null, headers = {},
} = {}) {
    sendJson(res, status, { error: { message, type, param: null, code } }, headers);
}

/* ---------------------------------------------------------------- */
/* Anthropic                                                         */
/* ---------------------------------------------------------------- */

export function anthropicMessage({ model = 'claude-mock',
    content = 'hello from claude mock',
    usage = { input_tokens: 10, output_tokens: 20 } } = {}) {
    return {
        id: id('msg_'),
        type: 'message',
        role: 'assistant',
        model,
        content: [{ type: 'text', text: content }],
        stop_reason: 'end_turn',
        stop_sequence: null,
        usage,
    };
}

/*
 * message_start, content_block_start, one content_block_delta per chunk
 * (delayMs apart), content_block_stop, message_delta with usage,
 * message_stop.  Resolves to the times each delta was written.
 */
export async function anthropicStream(res, chunks, { delayMs = 0,
    usage = { input_tokens: 10, output_tokens: 20 }, model = 'claude-mock' } = {}) {
    sseHead(res);
    const ev = (name, data) => res.write(
        `event: ${name}\ndata: ${JSON.stringify({ type: name, ...data })}\n\n`);
    ev('message_start', {
        message: {
            id: id('msg_'), type: 'message', role: 'assistant', model,
            content: [], stop_reason: null, stop_sequence: null,
            usage: { input_tokens: usage.input_tokens, output_tokens: 1 },
        },
    });
    ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } });
    const times = [];
    for (let i = 0; i < chunks.length; i++) {
        if (i > 0 && delayMs) {
            await sleep(delayMs);
        }
        times.push(Date.now());
        ev('content_block_delta', {
            index: 0, delta: { type: 'text_delta', text: chunks[i] },
        });
    }
    ev('content_block_stop', { index: 0 });
    ev('message_delta', {
        delta: { stop_reason: 'end_turn', stop_sequence: null },
        usage: { output_tokens: usage.output_tokens },
    });
    ev('message_stop', {});
    res.end();
    return times;
}

export function anthropicError(res, status, message,
    { type = 'invalid_request_error', headers = {} } = {}) {
    sendJson(res, status, { type: 'error', error: { type, message } }, headers);
}

/*
 * startDns(names) -> {port, queries, close()}: a DNS server on 127.0.0.1
 * (UDP) that answers A queries for each of names with 127.0.0.1, other
 * questions for them with no record, and everything else NXDOMAIN.
 */
export function startDns(names) {
    const known = new Set(names.map((n) => n.toLowerCase()));
    const seen = { queries: [] };
    const sock = dgram.createSocket('udp4');
    sock.on('message', (msg, rinfo) => {
        if (msg.length < 12) {
            return;
        }
        /* the question: labels, type, class */
        let off = 12;
        const labels = [];
        while (off < msg.length && msg[off] !== 0) {
            const n = msg[off];
            labels.push(msg.subarray(off + 1, off + 1 + n).toString());
            off += n + 1;
        }
        const qend = off + 5;
        const qtype = msg.readUInt16BE(off + 1);
        const name = labels.join('.').toLowerCase();
        seen.queries.push({ name, qtype });

        const ours = known.has(name);
        const answers = ours && qtype === 1 ? 1 : 0;
        const head = Buffer.alloc(12);
        msg.copy(head, 0, 0, 2);                                 /* id */
        head.writeUInt16BE(0x8180 | (ours ? 0 : 3), 2);          /* NOERROR / NXDOMAIN */
        head.writeUInt16BE(1, 4);                                /* one question */
        head.writeUInt16BE(answers, 6);
        const question = msg.subarray(12, qend);
        const parts = [head, question];
        if (answers) {
            const rr = Buffer.alloc(16);
            rr.writeUInt16BE(0xc00c, 0);                         /* the name */
            rr.writeUInt16BE(1, 2);                              /* A */
            rr.writeUInt16BE(1, 4);                              /* IN */
            rr.writeUInt32BE(30, 6);                             /* TTL */
            rr.writeUInt16BE(4, 10);
            Buffer.from([127, 0, 0, 1]).copy(rr, 12);
            parts.push(rr);
        }
        sock.send(Buffer.concat(parts), rinfo.port, rinfo.address);
    });
    return new Promise((resolve) => sock.bind(0, '127.0.0.1', () => {
        seen.port = sock.address().port;
        seen.close = () => new Promise((r) => sock.close(r));
        resolve(seen);
    }));
}
