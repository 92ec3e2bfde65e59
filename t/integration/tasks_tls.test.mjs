// The task engine's HTTP client over TLS: a vendor with a certificate the
// gateway trusts (llmgw_task_ssl_trusted_certificate), one it does not, and
// verification turned off (llmgw_task_ssl_verify off).

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { execFileSync } from 'node:child_process';

import { assertError, createDb, dropDb, startGateway, stopAll } from '../lib/harness.mjs';
import { submitTask, taskSetup, waitStatus } from '../lib/vendor.mjs';

function makeCert(dir) {
    const key = path.join(dir, 'tls.key');
    const crt = path.join(dir, 'tls.crt');
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes',
        '-keyout', key, '-out', crt, '-days', '2', '-subj', '/CN=localhost',
        '-addext', 'subjectAltName=DNS:localhost'], { stdio: 'ignore' });
    fs.chmodSync(crt, 0o644);
    return { key, crt };
}

/* An HTTPS vendor: submits get {id}, polls say done; records SNI names. */
function startTlsVendor(cert) {
    const seen = { submits: 0, polls: 0, servernames: [] };
    const server = https.createServer({
        key: fs.readFileSync(cert.key), cert: fs.readFileSync(cert.crt),
    }, (req, res) => {
        let body = '';
        req.on('data', (d) => { body += d; });
        req.on('end', () => {
            seen.servernames.push(req.socket.servername);
            let out;
            if (req.method === 'POST' && req.url.endsWith('/submit')) {
                seen.submits++;
                const up = (JSON.parse(body || '{}').up_id) || `tls-${seen.submits}`;
                out = { id: up };
            } else {
                seen.polls++;
                out = { status: 'done', result: { url: 'https://cdn.example/v.mp4' } };
            }
            const text = JSON.stringify(out);
            res.writeHead(200, { 'content-type': 'application/json',
                                 'content-length': Buffer.byteLength(text) });
            res.end(text);
        });
    });
    return new Promise((resolve) => {
        server.listen(0, '127.0.0.1', () => {
            seen.url = `https://localhost:${server.address().port}`;
            seen.close = () => new Promise((r) => server.close(r));
            resolve(seen);
        });
    });
}

describe('task requests over TLS', () => {
    let dir, cert, vendor, trusted, untrusted, noverify;
    /*
     * A database each: nodes sharing one poll each other's tasks, and these
     * three are configured to disagree about the same vendor.
     */
    const dbs = [];
    const poll = 'llmgw_task_poll_interval 200ms;';

    before(async () => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmgw-task-tls-'));
        fs.chmodSync(dir, 0o755);
        cert = makeCert(dir);
        vendor = await startTlsVendor(cert);
        for (let i = 0; i < 3; i++) {
            dbs.push(await createDb());
        }
        trusted = await startGateway({ db: dbs[0], v8host: true,
            http: `${poll}\n  llmgw_task_ssl_trusted_certificate ${cert.crt};` });
        untrusted = await startGateway({ db: dbs[1], v8host: true, http: poll });
        noverify = await startGateway({ db: dbs[2], v8host: true,
            http: `${poll}\n  llmgw_task_ssl_verify off;` });
    });

    after(async () => {
        await stopAll(trusted, untrusted, noverify);
        await vendor?.close();
        for (const db of dbs) {
            await dropDb(db);
        }
        fs.rmSync(dir, { recursive: true, force: true });
    });

    test('a trusted certificate: submitted with SNI, polled to SUCCESS', async () => {
        const env = await taskSetup(trusted, { vendors: [vendor] });
        const before = vendor.submits;
        const r = await submitTask(trusted, env, { model: env.model });
        assert.equal(r.status, 200, r.text);
        assert.equal(vendor.submits, before + 1);
        assert.ok(vendor.servernames.includes('localhost'), 'SNI is the host name');
        await waitStatus(trusted, env.acct.key, r.json.task_id, 'SUCCESS');
    });

    test('an untrusted certificate: 502 do_request_failed, nothing submitted', async () => {
        const env = await taskSetup(untrusted, { vendors: [vendor] });
        const before = vendor.submits;
        const r = await submitTask(untrusted, env, { model: env.model });
        assertError(r, 502, { type: 'upstream_error', code: 'do_request_failed' });
        assert.match(r.json.error.message, /certificate|verif/i);
        assert.equal(vendor.submits, before, 'the request is never written');
    });

    test('llmgw_task_ssl_verify off: the same vendor is accepted', async () => {
        const env = await taskSetup(noverify, { vendors: [vendor] });
        const r = await submitTask(noverify, env, { model: env.model });
        assert.equal(r.status, 200, r.text);
    });
});
