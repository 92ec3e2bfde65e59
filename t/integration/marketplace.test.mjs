// Marketplace sources (POST /api/plugin/task/marketplace) from a local
// index file and over HTTP, with their checks (sha256, the manifest's key
// and version, where an index may point), and plugin icons.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import {
    assertError, assertOk, createDb, dropDb, eventually, httpRequest, startGateway,
    stopAll,
} from '../lib/harness.mjs';

const FIXTURES = path.join(path.dirname(fileURLToPath(import.meta.url)),
    'fixtures', 'plugins');
const VIDEO = fs.readFileSync(path.join(FIXTURES, 'video-task.js'), 'utf8');

function variant(key, version) {
    return VIDEO
        .replace("key: 'itest-video'", `key: '${key}'`)
        .replaceAll('/itest/v1/', `/${key}/v1/`)
        .replace("const VERSION = '1.0.0';", `const VERSION = '${version}';`);
}

const sha = (s) => createHash('sha256').update(s).digest('hex');

/*
 * A marketplace folder: index.json and <key>/<version>/plugin.js.
 * entries: [{key, version, source?, digest?, path?}]
 */
function writeMarket(dir, entries, extra = {}) {
    const plugins = new Map();
    for (const e of entries) {
        const source = e.source ?? variant(e.key, e.version);
        const rel = e.path ?? `${e.key}/${e.version}/plugin.js`;
        if (!e.path) {
            fs.mkdirSync(path.join(dir, e.key, e.version), { recursive: true });
            fs.writeFileSync(path.join(dir, rel), source);
        }
        const p = plugins.get(e.key) || {
            key: e.key, name: `Plugin ${e.key}`, channelTypes: [], models: ['m'],
            latest: e.version, versions: [],
        };
        p.latest = e.version;
        p.versions.push({ version: e.version, path: rel,
            sha256: e.digest ?? sha(source), minApiVersion: 1, kind: 'task' });
        plugins.set(e.key, p);
    }
    const index = { indexVersion: 1, name: 'test market', ...extra,
                    plugins: [...plugins.values()] };
    fs.writeFileSync(path.join(dir, 'index.json'), JSON.stringify(index));
    return index;
}

/* Serves a folder over HTTP; counts requests. */
function serveDir(dir) {
    const seen = { paths: [] };
    const server = http.createServer((req, res) => {
        seen.paths.push(req.url);
        const file = path.join(dir, decodeURIComponent(req.url.split('?')[0]));
        if (!file.startsWith(dir) || !fs.existsSync(file)
            || !fs.statSync(file).isFile()) {
            res.writeHead(404).end('no');
            return;
        }
        res.writeHead(200, { 'content-type': 'application/octet-stream' });
        res.end(fs.readFileSync(file));
    });
    return new Promise((resolve) => server.listen(0, '127.0.0.1', () => {
        seen.url = `http://127.0.0.1:${server.address().port}`;
        seen.close = () => new Promise((r) => server.close(r));
        resolve(seen);
    }));
}

const market = (gw, body) => gw.admin('POST', '/api/plugin/task/marketplace', body);

describe('marketplace sources', () => {
    let db, gw, dir, web;

    before(async () => {
        dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llmgw-market-'));
        fs.chmodSync(dir, 0o755);
        writeMarket(dir, [
            { key: 'mk-local', version: '1.0.0' },
            { key: 'mk-local', version: '1.1.0' },
            { key: 'mk-web', version: '2.0.0' },
            { key: 'mk-off', version: '1.0.0' },
            { key: 'mk-badsum', version: '1.0.0', digest: 'a'.repeat(64) },
            { key: 'mk-liar', version: '1.0.0', source: variant('mk-other', '1.0.0') },
        ]);
        // the node running nginx reads the folder: make it world-readable
        for (const f of fs.readdirSync(dir, { recursive: true })) {
            fs.chmodSync(path.join(dir, f), fs.statSync(path.join(dir, f)).isDirectory()
                ? 0o755 : 0o644);
        }
        web = await serveDir(dir);
        db = await createDb();
        gw = await startGateway({ db, v8host: true });
    });

    after(async () => {
        await stopAll(gw);
        await web?.close();
        if (db) {
            await dropDb(db);
        }
        fs.rmSync(dir, { recursive: true, force: true });
    });

    test('a local index is listed with what is installed', async () => {
        const r = await market(gw, { url: `file://${dir}/index.json` });
        assertOk(r, 'listing');
        assert.equal(r.json.name, 'test market');
        const local = r.json.plugins.find((p) => p.key === 'mk-local');
        assert.equal(local.latest, '1.1.0');
        assert.deepEqual(local.versions.map((v) => v.version), ['1.0.0', '1.1.0']);
        assert.equal(local.installed, null);
    });

    test('a member the call does not take, or a flag that is not a boolean: 400 naming it, nothing installed', async () => {
        const url = `file://${dir}/index.json`;
        const bad = [
            [{ url, key: 'mk-local', enabeld: true },
                'enabeld: unknown field (known: url, key, version, remark, enabled, force)'],
            [{ url, key: 'mk-local', force: 'yes' }, 'force: must be true or false'],
            [{ url, key: 'mk-local', remark: {} }, 'remark: must be a string'],
        ];
        for (const [body, message] of bad) {
            assertError(await market(gw, body), 400, { code: 'invalid_request', message });
        }
        assertError(await gw.admin('GET', '/api/plugin/task/mk-local'), 404);
    });

    test('installing from a local index: the latest, or a named version', async () => {
        let r = await market(gw, { url: `${dir}/index.json`, key: 'mk-local',
                                    version: '1.0.0', enabled: true });
        assertOk(r, 'install 1.0.0');
        r = await market(gw, { url: `file://${dir}/index.json`, key: 'mk-local',
                               enabled: true });
        assertOk(r, 'install latest');

        const p = await gw.admin('GET', '/api/plugin/task/mk-local');
        assertOk(p, 'GET plugin');
        const text = JSON.stringify(p.json);
        assert.match(text, /1\.0\.0/);
        assert.match(text, /1\.1\.0/);

        const l = await market(gw, { url: `file://${dir}/index.json` });
        await new Promise((res) => setTimeout(res, 1200));
        const again = await market(gw, { url: `file://${dir}/index.json` });
        assert.equal(again.json.plugins.find((x) => x.key === 'mk-local').installed,
            '1.1.0', JSON.stringify(l.json));
    });

    test('installing over HTTP reads the index and the source from the server', async () => {
        const before = web.paths.length;
        const r = await market(gw, { url: `${web.url}/index.json`, key: 'mk-web',
                                     enabled: true });
        assertOk(r, 'install over http');
        const asked = web.paths.slice(before);
        assert.deepEqual(asked, ['/index.json', '/mk-web/2.0.0/plugin.js']);
        const p = await gw.admin('GET', '/api/plugin/task/mk-web');
        assertOk(p, 'GET plugin');
    });

    test('a source whose sha256 differs from the index is refused', async () => {
        const r = await market(gw, { url: `${web.url}/index.json`, key: 'mk-badsum' });
        assertError(r, 502, { code: 'checksum_mismatch' });
        const p = await gw.admin('GET', '/api/plugin/task/mk-badsum');
        assert.equal(p.status, 404);
    });

    test('a plugin whose manifest names another key than the index is refused', async () => {
        const r = await market(gw, { url: `file://${dir}/index.json`, key: 'mk-liar' });
        assertError(r, 502, { code: 'invalid_marketplace' });
        assert.match(r.json.error.message, /mk-other/);
    });

    test('unknown plugins and versions are 404; bad bodies 400', async () => {
        assertError(await market(gw, { url: `file://${dir}/index.json`, key: 'nope' }),
            404, { code: 'not_found' });
        assertError(await market(gw, { url: `file://${dir}/index.json`, key: 'mk-local',
                                       version: '9.9.9' }), 404, { code: 'not_found' });
        assertError(await market(gw, {}), 400, { code: 'invalid_request' });
        assertError(await market(gw, { url: 'ftp://x/index.json' }), 400,
            { code: 'invalid_request' });
    });

    test('an unreadable index is 502 marketplace_unavailable', async () => {
        assertError(await market(gw, { url: `${dir}/missing.json` }), 502,
            { code: 'marketplace_unavailable' });
        assertError(await market(gw, { url: `${web.url}/missing.json` }), 502,
            { code: 'marketplace_unavailable' });
    });

    test('an index may not point outside its folder or from the web to the disk', async () => {
        const sub = fs.mkdtempSync(path.join(os.tmpdir(), 'llmgw-market-evil-'));
        fs.chmodSync(sub, 0o755);
        writeMarket(sub, [
            { key: 'mk-up', version: '1.0.0', path: '../etc/passwd', digest: 'b'.repeat(64) },
            { key: 'mk-abs', version: '1.0.0', path: 'file:///etc/passwd', digest: 'b'.repeat(64) },
        ]);
        fs.chmodSync(path.join(sub, 'index.json'), 0o644);
        try {
            for (const key of ['mk-up', 'mk-abs']) {
                const r = await market(gw, { url: `file://${sub}/index.json`, key });
                assertError(r, 502, { code: 'invalid_marketplace' });
            }
        } finally {
            fs.rmSync(sub, { recursive: true, force: true });
        }
    });

    test('an index that publishes a credential is refused: 502 invalid_marketplace, naming where but not the secret', async () => {
        const sub = fs.mkdtempSync(path.join(dir, 'secret-'));
        fs.chmodSync(sub, 0o755);
        const src = variant('mk-cred', '1.0.0');
        fs.writeFileSync(path.join(sub, 'plugin.js'), src);
        const entry = (version) => ({ key: 'mk-cred', name: 'c', channelTypes: [], models: ['m'],
            latest: '1.0.0', versions: [{ version: '1.0.0', path: 'plugin.js', sha256: sha(src),
                                          minApiVersion: 1, kind: 'task', ...version }] });
        const cases = [
            /* a remote index naming its source with user:pass@ */
            [{ path: `${web.url.replace('//', '//mk:hunter2@')}/secret/plugin.js` },
                'plugins[0].versions[0].path (a URL with a user name or password)'],
            [{ downloadToken: 'hunter2' }, 'plugins[0].versions[0].downloadToken (a member named like a secret)'],
            [{ auth: { password: 'hunter2' } }, 'plugins[0].versions[0].auth (a member named like a secret)'],
        ];
        for (const [version, where] of cases) {
            fs.writeFileSync(path.join(sub, 'index.json'),
                JSON.stringify({ indexVersion: 1, name: 'leaky', plugins: [entry(version)] }));
            fs.chmodSync(path.join(sub, 'index.json'), 0o644);
            const url = `${web.url}/${path.basename(sub)}/index.json`;
            for (const body of [{ url }, { url, key: 'mk-cred' }]) {
                const r = await market(gw, body);
                assertError(r, 502, { code: 'invalid_marketplace',
                    message: `the marketplace index carries a credential at ${where}` });
                assert.ok(!r.text.includes('hunter2'), r.text);
            }
        }
        assertError(await gw.admin('GET', '/api/plugin/task/mk-cred'), 404);

        /* the same index without them installs */
        fs.writeFileSync(path.join(sub, 'index.json'),
            JSON.stringify({ indexVersion: 1, name: 'clean', plugins: [entry({})] }));
        assertOk(await market(gw, { url: `${web.url}/${path.basename(sub)}/index.json`,
                                    key: 'mk-cred' }), 'install without credentials');
    });

    test('a FIFO as the index or as a source is refused at once, and the worker keeps serving', async () => {
        const sub = fs.mkdtempSync(path.join(os.tmpdir(), 'llmgw-market-fifo-'));
        fs.chmodSync(sub, 0o755);
        const fifo = path.join(sub, 'pipe');
        await new Promise((resolve, reject) => execFile('mkfifo', ['-m', '0666', fifo],
            (e) => (e ? reject(e) : resolve())));
        fs.chmodSync(fifo, 0o666);
        fs.writeFileSync(path.join(sub, 'index.json'), JSON.stringify({ indexVersion: 1, name: 'fifo',
            plugins: [{ key: 'mk-fifo', name: 'f', channelTypes: [], models: ['m'], latest: '1.0.0',
                        versions: [{ version: '1.0.0', path: 'pipe', sha256: 'c'.repeat(64),
                                     minApiVersion: 1, kind: 'task' }] }] }));
        fs.chmodSync(path.join(sub, 'index.json'), 0o644);
        /* one worker: a blocked open would hold every other request */
        const one = await startGateway({ db, workers: 1, v8host: true });
        try {
            for (const [body, what] of [
                [{ url: fifo }, 'the index'],
                [{ url: `file://${sub}/index.json`, key: 'mk-fifo' }, 'a source'],
            ]) {
                const t0 = Date.now();
                const r = await httpRequest(`${one.url}/api/plugin/task/marketplace`, {
                    method: 'POST', body, timeoutMs: 5000,
                    headers: { Authorization: `Bearer ${one.rootToken}` },
                });
                assertError(r, 502, { code: 'marketplace_unavailable',
                    message: /not a regular file/ });
                assert.ok(Date.now() - t0 < 5000, `${what}: ${Date.now() - t0} ms`);
                assertOk(await one.admin('GET', '/api/plugin/task'), `served after ${what}`);
            }
            assertError(await one.admin('GET', '/api/plugin/task/mk-fifo'), 404);
        } finally {
            /* should a worker wait in open(), a writer lets it go */
            try {
                fs.closeSync(fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK));
            } catch { /* no reader: nothing waits */ }
            await stopAll(one);
            fs.rmSync(sub, { recursive: true, force: true });
        }
    });

    test('a source holding a NUL byte is the request\'s fault: 400, not a 503 to retry', async () => {
        const sub = fs.mkdtempSync(path.join(dir, 'nul-'));
        fs.chmodSync(sub, 0o755);
        /* a NUL in a comment: the source compiles, its text cannot be stored */
        const src = variant('mk-nul', '1.0.0') + '\n// \u0000\n';
        fs.writeFileSync(path.join(sub, 'plugin.js'), src);
        fs.writeFileSync(path.join(sub, 'index.json'), JSON.stringify({ indexVersion: 1, name: 'nul',
            plugins: [{ key: 'mk-nul', name: 'n', channelTypes: [], models: ['m'], latest: '1.0.0',
                        versions: [{ version: '1.0.0', path: 'plugin.js', sha256: sha(src),
                                     minApiVersion: 1, kind: 'task' }] }] }));
        for (const f of ['plugin.js', 'index.json']) {
            fs.chmodSync(path.join(sub, f), 0o644);
        }
        assertError(await market(gw, { url: `file://${sub}/index.json`, key: 'mk-nul' }), 400, {
            code: 'invalid_request',
            message: 'the request holds a value the database cannot store (such as a NUL character, \\u0000)',
        });
        assertError(await gw.admin('GET', '/api/plugin/task/mk-nul'), 404);
        assert.doesNotMatch(gw.errorLog(), /admin statement failed/);
    });

    test('a plugin installed disabled is listed with the version it stores', async () => {
        const url = `file://${dir}/index.json`;
        assertOk(await market(gw, { url, key: 'mk-off', enabled: false }), 'install disabled');
        const p = await gw.admin('GET', '/api/plugin/task/mk-off');
        assert.equal(assertOk(p).json.enabled, false, p.text.slice(0, 300));
        /* the worker that installed it answers at once, the others soon */
        await eventually(async () => {
            for (let i = 0; i < 4; i++) {
                const l = await market(gw, { url });
                assertOk(l, 'listing');
                const off = l.json.plugins.find((x) => x.key === 'mk-off');
                assert.equal(off.installed, '1.0.0', JSON.stringify(off));
            }
        });
    });

    test('the icon of a plugin is an SVG image', async () => {
        const r = await gw.req('GET', '/api/plugin/task/mk-web/icon',
            { key: gw.rootToken });
        assert.equal(r.status, 200, r.text);
        assert.match(r.headers['content-type'], /image\/svg\+xml/);
        assert.match(r.text, /^<svg /);
        assert.match(r.text, />IT</, 'the fixture icon is text:IT');
        const none = await gw.req('GET', '/api/plugin/task/nope/icon',
            { key: gw.rootToken });
        assertError(none, 404, { code: 'not_found' });
    });
});
