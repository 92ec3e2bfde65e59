// Helpers for the v8_host tests: start the helper, speak its frame protocol.
//
// Frame: 12-byte header (version 1, type, 0, 0, request id u32 BE,
// body length u32 BE) + JSON body.  Replies: type 0x80 | request type,
// the same request id.

import net from 'node:net';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';

export const LOAD = 1, CALL = 2, STATUS = 3, REPLY = 0x80;

export const HELPER = process.env.LLMGW_V8HOST
    ?? path.resolve(import.meta.dirname ?? path.dirname(new URL(import.meta.url).pathname),
                    '../../build/v8host/llmgw-v8host');

export function header({ version = 1, type, id, length }) {
    const h = Buffer.alloc(12);
    h[0] = version;
    h[1] = type;
    h.writeUInt32BE(id >>> 0, 4);
    h.writeUInt32BE(length >>> 0, 8);
    return h;
}

export function frame(type, id, body, opts = {}) {
    const b = Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    return Buffer.concat([header({ ...opts, type, id, length: b.length }), b]);
}

let nextId = 1000;

// One connection; requests are answered in order (the helper serves a
// connection one frame at a time).
export class Client {
    constructor(sock) {
        this.sock = sock;
        this.buf = Buffer.alloc(0);
        this.waiters = [];
        this.closed = new Promise((resolve) => {
            sock.on('close', () => {
                for (const w of this.waiters.splice(0)) {
                    w.reject(new Error('connection closed'));
                }
                resolve(true);
            });
        });
        sock.on('error', () => {});
        sock.on('data', (d) => this.onData(d));
    }

    static connect(socketPath) {
        return new Promise((resolve, reject) => {
            const s = net.createConnection(socketPath);
            s.once('connect', () => resolve(new Client(s)));
            s.once('error', reject);
        });
    }

    onData(d) {
        this.buf = Buffer.concat([this.buf, d]);
        while (this.buf.length >= 12) {
            const len = this.buf.readUInt32BE(8);
            if (this.buf.length < 12 + len) {
                break;
            }
            const reply = {
                version: this.buf[0],
                type: this.buf[1],
                id: this.buf.readUInt32BE(4),
                text: this.buf.subarray(12, 12 + len).toString('utf8'),
            };
            reply.body = JSON.parse(reply.text);
            this.buf = this.buf.subarray(12 + len);
            const w = this.waiters.shift();
            if (w) {
                w.resolve(reply);
            }
        }
    }

    // Raw bytes; resolves with the next reply frame.
    sendRaw(bytes) {
        return new Promise((resolve, reject) => {
            this.waiters.push({ resolve, reject });
            this.sock.write(bytes);
        });
    }

    async request(type, body, id = nextId++) {
        const reply = await this.sendRaw(frame(type, id, body));
        if (reply.id !== id || reply.type !== (REPLY | type)) {
            throw new Error(`reply ${reply.type}/${reply.id} for ${type}/${id}`);
        }
        return reply.body;
    }

    load(source) { return this.request(LOAD, { source }); }
    call(sha, hook, args = [], extra = {}) {
        return this.request(CALL, { sha, hook, args, ...extra });
    }
    status() { return this.request(STATUS, {}); }
    close() { this.sock.destroy(); return this.closed; }
}

export async function startHelper({ workers = 2, deadlineMs = 1000, heapMb = 32,
                                    maxFrame, extra = [] } = {}) {
    const dir = mkdtempSync(path.join(tmpdir(), 'v8host-test-'));
    const socket = path.join(dir, 'helper.sock');
    const args = ['--socket', socket, '--workers', String(workers),
                  '--deadline-ms', String(deadlineMs), '--heap-mb', String(heapMb),
                  '--pidfile', path.join(dir, 'helper.pid'), ...extra];
    if (maxFrame) {
        args.push('--max-frame', String(maxFrame));
    }

    const proc = spawn(HELPER, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    proc.stderr.on('data', (d) => {
        log += d;
        if (process.env.V8HOST_TEST_LOG) {
            process.stderr.write(d);
        }
    });
    const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));

    const readyCount = () => (log.match(/ ready \(/g) ?? []).length;
    const deadline = Date.now() + 10000;
    while (readyCount() < workers) {
        if (Date.now() > deadline || proc.exitCode !== null) {
            throw new Error(`helper did not start:\n${log}`);
        }
        await new Promise((r) => setTimeout(r, 20));
    }

    return {
        proc, socket, dir,
        log: () => log,
        readyCount,
        connect: () => Client.connect(socket),
        async stop() {
            if (proc.exitCode === null && proc.signalCode === null) {
                proc.kill('SIGTERM');
            }
            const r = await exited;
            rmSync(dir, { recursive: true, force: true });
            return r;
        },
    };
}

export async function waitFor(what, fn, ms = 5000) {
    const end = Date.now() + ms;
    for (;;) {
        const v = await fn();
        if (v) {
            return v;
        }
        if (Date.now() > end) {
            throw new Error(`timed out waiting for ${what}`);
        }
        await new Promise((r) => setTimeout(r, 25));
    }
}
