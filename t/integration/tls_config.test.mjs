// TLS to channels (SNI, certificate verification, kept-alive TLS
// connections) and nginx -t refusing bad directive values by name.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { execFileSync, spawnSync } from 'node:child_process';

import {
    MODULE, NGINX, assertCleanLog, assertError, createDb, makeChannel,
    makeUserKey, startGateway, stopAll, uniq,
} from '../lib/harness.mjs';

/* A throwaway CA-less self-signed certificate for "localhost". */
function makeCert(dir) {
    const key = path.join(dir, 'tls.key');
    const crt = path.join(dir, 'tls.crt');
    execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes',
        '-keyout', key, '-out', crt, '-days', '2', '-subj', '/CN=localhost',
        '-addext', 'subjectAltName=DNS:localhost'], { stdio: 'ignore' });
    return { key, crt };
}

function startTlsMock(cert) {
    const seen = { requests: [], connections: 0, servernames: [] };
    const server = https.createServer({
        key: fs.readFileSync(cert.key), cert: fs.readFileSync(cert.crt),
    }, (req, res) => {
        let body = '';
        req.on('data', (d) => { body += d; });
        req.on('end', () => {
            seen.requests.push({ path: req.url, headers: req.headers, body });
            seen.servernames.push(req.socket.servername);
            const out = JSON.stringify({
                id: 'chatcmpl-tls', object: 'chat.completion', model: 'x',
                choices: [{ index: 0, message: { role: 'assistant', content: 'over tls' },
                            finish_reason: 'stop' }],
                usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
            });
            res.writeHead(200, { 'content-type': 'application/json',
                                 'content-length': Buffer.byteLength(out) });
            res.end(out);
        });
    });
    server.on('secureConnection', () => { seen.connections++; });
    return new Promise((resolve) => {
        server.listen(0, '127.0.0.1', () => {
            seen.port = server.address().port;
            seen.close = () => new Promise((r) => server.close(r));
            resolve(seen);
        });
    });
}

describe('TLS channels', () => {
    let dir, cert, tls, db, trusted, untrusted, key;
    const M = uniq('tls-model');

    before(async () => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmgw-tls-'));
        cert = makeCert(dir);
        fs.chmodSync(dir, 0o755);
        fs.chmodSync(cert.crt, 0o644);
        tls = await startTlsMock(cert);
        db = await createDb();
        trusted = await startGateway({
            db, http: `llmgw_ssl_trusted_certificate ${cert.crt};` });
        untrusted = await startGateway({ db });
        await makeChannel(trusted, {
            base_url: `https://localhost:${tls.port}`, models: [M],
            key: 'sk-upstream-tls',
        });
        ({ key } = await makeUserKey(trusted));
    });

    after(async () => {
        await stopAll(trusted, untrusted);
        await tls.close();
        fs.rmSync(dir, { recursive: true, force: true });
        assertCleanLog(trusted);
        assertCleanLog(untrusted);
    });

    test('a trusted certificate: the call goes over TLS with SNI', async () => {
        const r = await trusted.chat(key, M);
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json.choices[0].message.content, 'over tls');
        const seen = tls.requests.at(-1);
        assert.equal(seen.path, '/v1/chat/completions');
        assert.equal(seen.headers.authorization, 'Bearer sk-upstream-tls');
        assert.equal(tls.servernames.at(-1), 'localhost', 'SNI names the host');
    });

    test('TLS connections are kept alive between calls', async () => {
        const before = tls.connections;
        for (let i = 0; i < 6; i++) {
            const r = await trusted.chat(key, M);
            assert.equal(r.status, 200, r.text);
        }
        /* two workers may each open one; never one per call */
        assert.ok(tls.connections - before <= 2,
                  `${tls.connections - before} TLS handshakes for 6 calls`);
    });

    test('an unverifiable certificate is refused: 502 do_request_failed', async () => {
        const n = tls.requests.length;
        const r = await untrusted.chat(key, M);
        assertError(r, 502, { code: 'do_request_failed' });
        assert.equal(tls.requests.length, n, 'nothing was sent to the host');
        assert.match(untrusted.errorLog(), /certificate verify error/);
    });
});

/*
 * nginx -t on a configuration with one line of our choosing at line 6, in
 * the http{} block of a server with a gateway location (or, with at
 * 'location', in that location).  The database is named on line 5 unless
 * the line names it (or database is false).
 */
function nginxTest(line, at = 'http', database = true) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmgw-t-'));
    const conf = path.join(dir, 'nginx.conf');
    const [http, loc] = at === 'http' ? [line, ''] : ['', line];
    const db = database && !line.startsWith('llmgw_database')
        ? 'llmgw_database "dbname=llmgw";' : '';
    fs.writeFileSync(conf, `load_module ${MODULE};
error_log ${dir}/error.log;
pid ${dir}/nginx.pid;
events {}
http { ${db}
  ${http}
  server { listen 127.0.0.1:1; location / { llmgw_gateway;
  ${loc}
  } }
}
`);
    const r = spawnSync(NGINX, ['-t', '-p', dir, '-c', conf],
                        { encoding: 'utf8', timeout: 10000 });
    fs.rmSync(dir, { recursive: true, force: true });
    return { status: r.status, stderr: r.stderr,
             where: `in ${conf}:${at === 'http' ? 6 : 8}` };
}

describe('nginx -t names the directive of a bad value and its line', () => {
    const cases = [
        ['llmgw_max_tries 0;', /must be between 1 and 10/],
        ['llmgw_max_tries 11;', /must be between 1 and 10/],
        ['llmgw_read_timeout soon;', /invalid value/],
        ['llmgw_zone_size 1k;', /must be at least \d+k/],
        ['llmgw_pg_pool_size 0;', /must be between 1 and 64/],
        ['llmgw_v8host 127.0.0.1:9;', /unix:\/path/],
        ['llmgw_database "";', /libpq connection string/],
        ['llmgw_database "host=/tmp dbnam=llmgw";', /libpq accepts: invalid connection option "dbnam"/],
        ['llmgw_database "dbname=\'unterminated";', /libpq accepts in /],
        ['llmgw_database "user=a password secret-word";', /libpq accepts in /],
        ['llmgw_database "postgresql://h/db?bogus=1";', /libpq accepts/],
        ['llmgw_ssl_verify maybe;', /must be "on" or "off"/],
        ['llmgw_flush_interval 0;', /must be between 1ms and 366d/],
        ['llmgw_refresh_interval 0;', /must be between 1ms and 366d/],
        ['llmgw_task_poll_interval 0;', /must be between 1ms and 366d/],
        ['llmgw_task_wait_timeout 0;', /must be between 1ms and 366d/],
        ['llmgw_pg_timeout 0;', /must be between 1ms and 366d/],
        ['llmgw_ledger_backlog 0;', /must be between 1 and 100000000/],
        ['llmgw_request_id_header "";', /must not be empty/],
        ['llmgw_request_id_header "X-Id: 1";', /must be a header name/],
        ['llmgw_v8host_max_frame 17m;', /must be between 64k and 16m/],
        ['llmgw_v8host_max_frame 0;', /must be between 64k and 16m/],
        ['llmgw_v8host_max_frame 65535;', /must be between 64k and 16m/],
        ['llmgw_v8host_max_inflight 0;', /must be between 1 and 100000/],
        ['llmgw_buffer_size 0;', /must be between 4k and 1m/],
        ['llmgw_buffer_size 4095;', /must be between 4k and 1m/],
        ['llmgw_connect_timeout 0;', /must be between 1ms and 366d/],
        ['llmgw_send_timeout 0;', /must be between 1ms and 366d/],
        ['llmgw_read_timeout 0;', /must be between 1ms and 366d/],
        ['llmgw_task_max_response 0;', /must be at least 64k/],
        ['llmgw_task_max_file_size 0;', /must be at least 1k/],
        ['llmgw_task_max_files_total 1023;', /must be at least 1k/],
        ['llmgw_keepalive 100000000;', /must be between 0 and 10000/],
        ['llmgw_reserve_tokens 9223372036854775807;', /invalid value|must be between 0 and 10000000/],
        ['llmgw_reserve_tokens 10000001;', /must be between 0 and 10000000/],
        ['llmgw_thread_pool "";', /needs a pool name/],
        ['llmgw_crypto_secret short-secret;', /must be at least 32 characters long/],
        ['llmgw_task_public_address public.example;', /must be an http:\/\/ or https:\/\/ address/],
        ['llmgw_task_public_address "http://a b";', /without spaces, query or fragment/],
        ['llmgw_server_address http:///x;', /with a host/],
        ['llmgw_server_address https://gw.example/?x=1;', /without spaces, query or fragment/],
        ['llmgw_artifact_link_ttl 0;', /must be between 1ms and 366d/],
        ['llmgw_content_allow_private 10.0.0.0/33;', /invalid address "10\.0\.0\.0\/33" in/],
        ['llmgw_content_allow_private yes;', /invalid address "yes" in .*: on, off or addresses/],
        ['llmgw_content_allow_private 10.0.0.0/8 on;', /invalid address "on" in/],
        ['llmgw_content_allow_private localhost;', /invalid address "localhost" in/],
        ['llmgw_content_allow_private off; llmgw_content_allow_private on;', /is duplicate/],
    ];

    for (const [line, re] of cases) {
        test(line, () => {
            const r = nginxTest(line);
            /* libpq's own message may quote the string: never a password */
            assert.ok(!r.stderr.includes('secret-word'), r.stderr);
            assert.notEqual(r.status, 0, `nginx -t accepted ${line}`);
            const name = line.split(' ')[0];
            assert.match(r.stderr, /\[emerg\]/);
            assert.ok(r.stderr.includes(`"${name}"`), r.stderr);
            assert.match(r.stderr, re);
            assert.ok(r.stderr.includes(r.where), r.stderr);
        });
    }

    test('llmgw_thread_pool naming no pool: nginx -t fails at its line', () => {
        const r = nginxTest('llmgw_thread_pool nosuchpool;');
        assert.notEqual(r.status, 0);
        assert.ok(r.stderr.includes(`unknown thread pool "nosuchpool" ${r.where}`), r.stderr);
    });

    for (const [line, message] of [
        ['llmgw_request_id_header "";', 'must not be empty'],
        ['llmgw_buffer_size 1k;', 'must be between 4k and 1m'],
        ['llmgw_buffer_size 2m;', 'must be between 4k and 1m'],
    ]) {
        test(`${line} in a location points at its line`, () => {
            const r = nginxTest(line, 'location');
            assert.notEqual(r.status, 0);
            assert.ok(r.stderr.includes(`"${line.split(' ')[0]}" directive ` +
                                        `${message} ${r.where}`), r.stderr);
        });
    }
});

describe('nginx -t wants the database where the gateway serves', () => {
    test('a gateway location without llmgw_database', () => {
        const r = nginxTest('llmgw_max_tries 2;', 'http', false);
        assert.notEqual(r.status, 0, 'nginx -t accepted no database');
        assert.match(r.stderr, /\[emerg\] .*"llmgw_gateway" and "llmgw_admin" need "llmgw_database"/);
    });

    test('a bare database name, a key=value string and a URI are taken', () => {
        for (const line of ['llmgw_database llmgw;', 'llmgw_database "host=/tmp dbname=llmgw";',
            'llmgw_database "postgresql://localhost/llmgw";']) {
            const r = nginxTest(line);
            assert.equal(r.status, 0, `${line}: ${r.stderr}`);
        }
    });

    test('metrics alone need none', () => {
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmgw-t-'));
        const conf = path.join(dir, 'nginx.conf');
        fs.writeFileSync(conf, `load_module ${MODULE};
error_log ${dir}/error.log;
pid ${dir}/nginx.pid;
events {}
http { server { listen 127.0.0.1:1; location = /metrics { llmgw_metrics; } } }
`);
        const r = spawnSync(NGINX, ['-t', '-p', dir, '-c', conf],
                            { encoding: 'utf8', timeout: 10000 });
        fs.rmSync(dir, { recursive: true, force: true });
        assert.equal(r.status, 0, r.stderr);
    });
});

describe('nginx -t accepts the bounds', () => {
    const page = Number(execFileSync('getconf', ['PAGESIZE'],
                                     { encoding: 'utf8' }));
    const lines = [
        `llmgw_zone_size ${8 * page};`,
        'llmgw_request_id_header X-Trace_Id.1;',
        'llmgw_v8host_max_frame 16m;',
        'llmgw_v8host_max_frame 64k;',
        'llmgw_v8host_max_inflight 1;',
        'llmgw_buffer_size 4k;',
        'llmgw_connect_timeout 1ms;',
        'llmgw_send_timeout 1ms;',
        'llmgw_read_timeout 1ms;',
        'llmgw_task_max_response 64k;',
        'llmgw_task_max_file_size 1k;',
        'llmgw_task_max_files_total 1k;',
        'llmgw_task_wait_timeout 1ms;',
        'llmgw_crypto_secret 0123456789abcdef0123456789abcdef;',
        'llmgw_task_public_address https://gw.example:8443/llm/;',
        'llmgw_server_address http://10.0.0.1;',
        'llmgw_artifact_link_ttl 7d;',
        'llmgw_content_allow_private on;',
        'llmgw_content_allow_private off;',
        'llmgw_content_allow_private 10.0.0.0/8 fd00::/8 127.0.0.1 ::1;',
    ];

    for (const line of lines) {
        test(line, () => {
            const r = nginxTest(line);
            assert.equal(r.status, 0, r.stderr);
        });
    }
});

describe('nginx -t reads the CA bundles', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmgw-ca-'));
    const notPem = path.join(dir, 'not-pem.crt');
    fs.writeFileSync(notPem, 'not a certificate\n');
    const cert = makeCert(dir);

    after(() => fs.rmSync(dir, { recursive: true, force: true }));

    for (const name of ['llmgw_ssl_trusted_certificate',
                        'llmgw_task_ssl_trusted_certificate']) {
        for (const [file, message] of [
            ['/nonexistent/ca.pem', 'cannot open "/nonexistent/ca.pem" ' +
                                    '(2: No such file or directory)'],
            [notPem, `cannot load "${notPem}" as PEM certificates ` +
                     '(no certificate or crl found)'],
        ]) {
            test(`${name} ${file} is refused`, () => {
                const r = nginxTest(`${name} ${file};`);
                assert.notEqual(r.status, 0, r.stderr);
                assert.ok(r.stderr.includes(`[emerg]`), r.stderr);
                assert.ok(r.stderr.includes(`"${name}" ${message} ${r.where}`),
                          r.stderr);
            });
        }

        test(`${name} "" is refused`, () => {
            const r = nginxTest(`${name} "";`);
            assert.notEqual(r.status, 0, r.stderr);
            assert.ok(r.stderr.includes(
                `"${name}" directive must name a file ${r.where}`), r.stderr);
        });

        test(`${name} of a PEM certificate is accepted`, () => {
            const r = nginxTest(`${name} ${cert.crt};`);
            assert.equal(r.status, 0, r.stderr);
        });
    }

    test('a missing bundle is refused with verification off too', () => {
        const ca = 'llmgw_ssl_trusted_certificate /nonexistent/ca.pem;';
        const r = nginxTest(`llmgw_ssl_verify off; ${ca}`);
        assert.notEqual(r.status, 0, r.stderr);
        assert.ok(r.stderr.includes('"llmgw_ssl_trusted_certificate" cannot ' +
                                    `open "/nonexistent/ca.pem"`), r.stderr);
    });
});
