// Task artifacts end to end, through the real nginx, PostgreSQL and the
// plugin runtime, against the mock vendor of t/lib/vendor.mjs (which also
// serves the content) and a second mock as a public CDN, with the plugin
// fixtures/plugins/task-artifacts.js (host_video, listArtifacts,
// buildContentRequest):
//   - GET /v1/tasks/{id}/artifacts lists what listArtifacts projects, each
//     with a link to the public address, signed (?expires=&signature=) when
//     llmgw_crypto_secret is set; the host refuses a bad list (500
//     plugin_error); owner only; a plugin without the hooks lists nothing;
//   - GET|HEAD /v1/tasks/{id}/artifacts/{key}/content with the API key or
//     through a signed link: the vendor's answer streamed byte-exact with
//     only the allowed headers; 200, 206, 304 and 416 pass, 404/410 are
//     artifact_not_found, other failures 502; the client's safe range and
//     conditional headers reach the plugin; a credentialless CDN request
//     carries no credentials but the client's Range, redirects followed up
//     to 5 and each checked; a credentialed one goes nowhere but the
//     channel host;
//   - signed links: tampering is 403 invalid_signature, an expired link
//     403 link_expired, another secret rejects them, without a secret the
//     links are unsigned and the request's Host names the address;
//   - a credentialless request leaves the channel's origin only for
//     public addresses: the CDN on loopback needs
//     llmgw_content_allow_private (set here for it); without it the address
//     is refused where it is connected to, for the plugin's URL, each
//     redirect, a name that resolves to 127.0.0.1 and ::ffff:127.0.0.1;
//   - GET|HEAD /v1/videos/{id}/content[?variant=];
//   - the channel key and the secret reach no answer and no log line.
//
// Gateways poll every 200 ms.

import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import {
    assertCleanLog, assertError, hex, rawHttp, settle, startGateway, uniq,
} from '../lib/harness.mjs';
import { startDns } from '../lib/mock.mjs';
import {
    account, assertErrorShape, mapLimit, sleep, startVendor, taskSetup, vendorSuite, waitFor, waitStatus,
} from '../lib/vendor.mjs';

const FIXTURE = 'task-artifacts.js';
const PUBLIC = 'http://public.example:9999';
const SECRET_A = `sa-${hex(20)}`;   /* 43 characters */
const SECRET_B = `sb-${hex(20)}`;
const TTL_B = 3;                    /* seconds */
const BASE_HTTP = 'llmgw_task_poll_interval 200ms;\n  llmgw_task_poll_max_failures 3;';
/* the CDN mock is on loopback: not a public address */
const HTTP_A = `${BASE_HTTP}\n  llmgw_crypto_secret ${SECRET_A};\n` +
    `  llmgw_task_public_address ${PUBLIC};\n  llmgw_artifact_link_ttl 1h;\n` +
    '  llmgw_content_allow_private 127.0.0.1;';
const CDN_NAME = 'cdn.llmgw.test';
const HTTP_B = `${BASE_HTTP}\n  llmgw_crypto_secret ${SECRET_B};\n` +
    `  llmgw_artifact_link_ttl ${TTL_B}s;`;

const now = () => Math.floor(Date.now() / 1000);
const sha = (b) => createHash('sha256').update(b).digest('hex');
const reEsc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/* Strings no answer may hold (the channel key, the secrets). */
const SECRETS = [SECRET_A, SECRET_B];
const leaks = [];

/*
 * One request on its own connection, the body kept as bytes:
 * -> {status, headers, body: Buffer, text, json}.  Every answer is
 * searched for SECRETS.  body: an object sent as JSON.
 */
function bin(url, { method = 'GET', headers = {}, key, body, timeoutMs = 20000 } = {}) {
    return new Promise((resolve, reject) => {
        const u = new URL(url);
        const h = { ...headers };
        if (key) {
            h.Authorization = `Bearer ${key}`;
        }
        const payload = body === undefined ? undefined : JSON.stringify(body);
        if (payload !== undefined) {
            h['Content-Type'] = 'application/json';
            h['Content-Length'] = Buffer.byteLength(payload);
        }
        let done = false;
        const req = http.request({
            host: u.hostname, port: u.port, path: u.pathname + u.search, method,
            headers: h, agent: false,
        }, (res) => {
            const parts = [];
            res.on('data', (c) => parts.push(c));
            const finish = () => {
                if (done) {
                    return;
                }
                done = true;
                clearTimeout(timer);
                const body = Buffer.concat(parts);
                const text = body.length < 1048576 ? body.toString('utf8') : '';
                let json;
                try {
                    json = JSON.parse(text);
                } catch {
                    json = undefined;
                }
                const r = { status: res.statusCode, headers: res.headers, body, text, json,
                    complete: res.complete };
                const head = JSON.stringify(res.headers);
                for (const s of SECRETS) {
                    if (head.includes(s) || body.indexOf(s) >= 0) {
                        leaks.push(`${method} ${url} -> ${res.statusCode} holds ${s.slice(0, 6)}...`);
                    }
                }
                resolve(r);
            };
            res.on('end', finish);
            res.on('close', finish);
        });
        const timer = setTimeout(() => {
            if (!done) {
                done = true;
                req.destroy();
                reject(new Error(`${method} ${url}: no complete response in ${timeoutMs} ms`));
            }
        }, timeoutMs);
        req.on('error', (e) => {
            if (!done) {
                done = true;
                clearTimeout(timer);
                e.message = `${method} ${url}: ${e.message}`;
                reject(e);
            }
        });
        req.end(payload);
    });
}

/* ------------------------------------------------------------------ */
/* the content the mocks serve                                         */
/* ------------------------------------------------------------------ */

const LAST_MODIFIED = 'Tue, 03 Nov 2026 10:00:00 GMT';

/* A content entry: bytes served with Range and If-None-Match support. */
function content(body, type, name) {
    return { body, type, name, etag: `"${sha(body).slice(0, 16)}"` };
}

/*
 * The answer of a content entry: {status, headers, body} for the mock.
 * Headers the gateway must not pass ride along (Set-Cookie,
 * X-Vendor-Secret, both holding the channel key).
 */
function serve(rec, e, channelKey) {
    if (e.status) {
        return { status: e.status, headers: e.headers || {}, body: e.body === undefined ? '' : e.body };
    }
    const len = e.body.length;
    const common = {
        ETag: e.etag, 'Last-Modified': LAST_MODIFIED, 'Cache-Control': 'private, max-age=60',
        'Set-Cookie': `vendor_session=${channelKey}; Path=/`, 'X-Vendor-Secret': channelKey,
    };
    const inm = rec.headers['if-none-match'];
    if (inm !== undefined && inm.split(',').map((s) => s.trim()).includes(e.etag)) {
        return { status: 304, headers: common, body: '' };
    }
    const full = {
        ...common, 'Content-Type': e.type, 'Accept-Ranges': 'bytes',
        'Content-Disposition': `attachment; filename="${e.name}"`,
    };
    const range = rec.headers.range;
    if (range !== undefined) {
        const m = /^bytes=(\d*)-(\d*)$/.exec(range.trim());
        let start = NaN;
        let end = NaN;
        if (m && m[1] !== '') {
            start = Number(m[1]);
            end = m[2] === '' ? len - 1 : Math.min(Number(m[2]), len - 1);
        } else if (m && m[2] !== '') {
            start = Math.max(0, len - Number(m[2]));
            end = len - 1;
        }
        if (!(start <= end) || start >= len) {
            return { status: 416, headers: { ...common, 'Content-Range': `bytes */${len}`,
                'Content-Type': 'text/plain', 'Accept-Ranges': 'bytes' },
            body: 'range not satisfiable' };
        }
        return { status: 206, headers: { ...full, 'Content-Range': `bytes ${start}-${end}/${len}` },
            body: e.body.subarray(start, end + 1) };
    }
    /* HEAD: the mock's server leaves the body out, the length stays */
    return { status: 200, headers: full, body: e.body };
}

/* ------------------------------------------------------------------ */
/* the tests                                                           */
/* ------------------------------------------------------------------ */

describe('task artifacts', { timeout: 180000 }, () => {
    const s = vendorSuite({ http: HTTP_A });
    let db, gw, vendor, cdn, env, plain, other, channelKey;
    const logs = [];           /* error logs of the gateways stopped */
    const store = new Map();   /* "<upstream id>/<key>" -> content entry */
    const T = {};              /* name -> {id, up, data} */

    const MAIN_LIST = [
        { key: 'thumbnail', type: 'image', mimeType: 'image/png' },
        { key: 'video', type: 'video', mimeType: 'video/mp4' },
        { key: 'clip.v2_a-B9', type: 'file' },
        { key: 'audio', type: 'audio', mimeType: 'audio/mpeg' },
        { key: 'gone404', type: 'file' },
        { key: 'gone410', type: 'file' },
        { key: 'broken', type: 'file' },
        { key: 'denied', type: 'file' },
        { key: 'redir', type: 'file' },
    ];
    const DEFAULT_LIST = [
        { key: 'video', type: 'video', mimeType: 'video/mp4' },
        { key: 'thumbnail', type: 'image', mimeType: 'image/png' },
    ];
    const VIDEO = randomBytes(4 * 1024 * 1024 + 123);
    const THUMB = randomBytes(2000);
    const CDN_VIDEO = randomBytes(300 * 1024 + 7);
    const DVIDEO = randomBytes(10000);
    const CLIP = randomBytes(5000);
    const AUDIO = randomBytes(3000);
    const NOTES = Buffer.from('some notes\n');

    const api = (p, opts = {}) => bin(gw.url + p, { key: env.acct.key, ...opts });
    const anon = (p, opts = {}) => bin(gw.url + p, opts);
    const listPath = (id) => `/v1/tasks/${encodeURIComponent(id)}/artifacts`;
    const contentPath = (id, k) => `${listPath(id)}/${k}/content`;
    const list = (id, opts) => api(listPath(id), opts);
    const contentOf = (id, k, opts) => api(contentPath(id, k), opts);
    const vendorGot = (up, k) => vendor.requests.filter((q) => q.path === `/content/${up}/${k}`);
    const cdnGot = (k) => cdn.requests.filter((q) => q.path === `/cdn/${k}`);
    const ctxOf = (rec) => JSON.parse(rec.headers['x-ctx']);
    /* a link of the public address, to this gateway */
    const here = (url, g = gw) => g.url + url.slice(PUBLIC.length);

    function vendorContent(rec) {
        /* credentialless paths on the channel's own origin */
        if (rec.path.startsWith('/to-cdn/')) {
            return { status: 302, headers: { Location: `${cdn.url}/cdn/${rec.path.slice(8)}` },
                body: '' };
        }
        if (rec.path === '/public/video') {
            return serve(rec, cdnVideo, 'the-vendor-sets-no-key-here');
        }
        const m = /^\/content\/([^/]+)\/([^/]+)$/.exec(rec.path);
        const e = m && store.get(`${decodeURIComponent(m[1])}/${m[2]}`);
        if (!e) {
            return { status: 404, body: { error: { message: 'no such endpoint' } } };
        }
        if (e.redirect) {
            return { status: 302, headers: { Location: e.redirect }, body: '' };
        }
        return serve(rec, e, channelKey);
    }

    const cdnVideo = content(CDN_VIDEO, 'video/mp4', 'cdn.mp4');
    function cdnContent(rec) {
        const k = rec.path.startsWith('/cdn/') ? rec.path.slice(5) : '';
        const hop = /^hop-(\d+)$/.exec(k);
        if (k === 'video' || (hop && hop[1] === '0')) {
            return serve(rec, cdnVideo, 'cdn-has-no-key');
        }
        if (hop) {
            return { status: 302, headers: { Location: `/cdn/hop-${Number(hop[1]) - 1}` }, body: '' };
        }
        if (k === 'framed') {
            /* chunked framing with a length beside it that is not the body's */
            return { sse: ['hello world, ', 'more'], headers: { 'Content-Type': 'video/mp4',
                'Content-Length': '5', 'Transfer-Encoding': 'chunked' } };
        }
        if (k === 'slowhead') {
            /* the head comes late: a client may leave before */
            return { delayMs: 8000, ...serve(rec, cdnVideo, 'cdn-has-no-key') };
        }
        if (k === 'moved') {
            return { status: 302, headers: { Location: '/cdn/video' }, body: '' };
        }
        if (k === 'leak') {
            return { status: 302, headers: { Location: `/cdn/video?k=${channelKey}` }, body: '' };
        }
        return { status: 404, body: { error: { message: 'not on this CDN' } } };
    }


    before(async () => {
        ({ db, gw, vendor } = s);
        cdn = await startVendor();
        const t0 = Date.now();
        env = await taskSetup(gw, { fixture: FIXTURE, vendors: [vendor], models: 1, wait: false });
        plain = await taskSetup(gw, { vendors: [vendor], models: 1, wait: false });
        channelKey = env.channelKey;
        SECRETS.push(channelKey, plain.channelKey);
        other = await account(gw);
        vendor.onOther = vendorContent;
        cdn.onOther = cdnContent;
        await settle(t0);

        const edge = Array.from({ length: 64 }, (_, i) => ({ key: `k${i}`, type: 'file' }));
        edge[0] = { key: `${'Az09._-'.repeat(18)}Az`, type: 'video', mimeType: 'video/mp4' };
        assert.equal(edge[0].key.length, 128);
        const specs = {
            main: { artifacts: MAIN_LIST, url: 'https://cdn.example/v.mp4' },
            dflt: {},
            cdn: { cdn: `${cdn.url}/cdn`, artifacts: [
                { key: 'video', type: 'video', mimeType: 'video/mp4' },
                { key: 'moved', type: 'video' }, { key: 'hop-5', type: 'video' },
                { key: 'hop-6', type: 'video' }, { key: 'leak', type: 'video' },
                { key: 'gone', type: 'video' }, { key: 'framed', type: 'video' },
                { key: 'slowhead', type: 'video' }] },
            /* the content request is built slowly: a client may leave before */
            slowbuild: { cdn: `${cdn.url}/cdn`, contentSpinMs: 1000,
                artifacts: [{ key: 'slowhead', type: 'video' }] },
            /* a HEAD to the vendor, whatever the client asked */
            headonly: { contentMethod: 'HEAD' },
            /* the channel's origin, then a redirect to the CDN */
            tocdn: { cdn: `${vendor.url}/to-cdn`, artifacts: [{ key: 'video', type: 'video' }] },
            own: { cdn: `${vendor.url}/public`, artifacts: [{ key: 'video', type: 'video' }] },
            local: { cdn: `http://localhost:${cdn.port}/cdn`,
                artifacts: [{ key: 'video', type: 'video' }] },
            mapped: { cdn: `http://[::ffff:127.0.0.1]:${cdn.port}/cdn`,
                artifacts: [{ key: 'video', type: 'video' }] },
            named: { cdn: `http://${CDN_NAME}:${cdn.port}/cdn`,
                artifacts: [{ key: 'video', type: 'video' }] },
            decimal: { cdn: `http://2130706433:${cdn.port}/cdn`,
                artifacts: [{ key: 'video', type: 'video' }] },
            echo: { echoTask: true },
            novideo: { artifacts: [{ key: 'notes', type: 'file', mimeType: 'text/plain' },
                { key: 'poster', type: 'image' }] },
            pending: null,
            throwing: { contentThrow: true },
            foreign: { foreign: cdn.url },
            big: { artifacts: [{ key: 'big', type: 'video', mimeType: 'video/mp4' }] },
            edge: { artifacts: edge },
            /* lists the host must refuse */
            bad_dup: { artifacts: [{ key: 'a', type: 'file' }, { key: 'a', type: 'image' }] },
            bad_char: { artifacts: [{ key: 'a/b', type: 'file' }] },
            bad_space: { artifacts: [{ key: 'a b', type: 'file' }] },
            bad_empty: { artifacts: [{ key: '', type: 'file' }] },
            bad_long: { artifacts: [{ key: 'k'.repeat(129), type: 'file' }] },
            bad_dot: { artifacts: [{ key: '.', type: 'file' }] },
            bad_dotdot: { artifacts: [{ key: '..', type: 'file' }] },
            bad_type: { artifacts: [{ key: 'a', type: 'movie' }] },
            bad_nokey: { artifacts: [{ type: 'file' }] },
            bad_mime: { artifacts: [{ key: 'a', type: 'file', mimeType: 7 }] },
            bad_many: { artifacts: Array.from({ length: 65 }, (_, i) => ({ key: `k${i}`, type: 'file' })) },
            bad_object: { listResult: { key: 'a', type: 'file' } },
            bad_entry: { listResult: ['video'] },
            bad_throw: { listThrow: true },
        };
        await mapLimit(Object.entries(specs), 6, async ([name, data]) => {
            const up = uniq(`up-${name}`);
            vendor.setPoll(up, data === null ? { body: { status: 'running' } }
                : { body: { status: 'done', data } });
            const r = await bin(`${gw.url}/v1/videos`, { method: 'POST', key: env.acct.key,
                body: { model: env.model, up_id: up } });
            assert.equal(r.status, 200, `POST /v1/videos (${name}): ${r.status} ${r.text.slice(0, 300)}`);
            assert.match(r.json.id, /^task_/);
            T[name] = { id: r.json.id, up, data };
        });
        /* a task of a plugin without the artifact hooks (and not host_video) */
        const pu = uniq('up-plain');
        vendor.setPoll(pu, { body: { status: 'done' } });
        const pr = await bin(`${gw.url}/v1/tasks/${plain.key}`, { method: 'POST',
            key: plain.acct.key, body: { model: plain.model, up_id: pu } });
        assert.equal(pr.status, 200, `POST /v1/tasks/${plain.key}: ${pr.status} ${pr.text.slice(0, 300)}`);
        T.plain = { id: pr.json.task_id, up: pu };

        const put = (t, k, e) => store.set(`${T[t].up}/${k}`, e);
        put('main', 'thumbnail', content(THUMB, 'image/png', 'thumb.png'));
        put('main', 'video', content(VIDEO, 'video/mp4', 'video.mp4'));
        put('main', 'clip.v2_a-B9', content(CLIP, 'application/octet-stream', 'clip.bin'));
        put('main', 'audio', content(AUDIO, 'audio/mpeg', 'a.mp3'));
        put('main', 'gone404', { status: 404, body: { error: { message: 'no such file' } } });
        put('main', 'gone410', { status: 410, body: { error: { message: 'expired' } } });
        put('main', 'broken', { status: 500, headers: { 'X-Vendor-Secret': channelKey },
            body: { error: { message: `internal failure for key ${channelKey}` } } });
        put('main', 'denied', { status: 403, body: { error: { message: `key ${channelKey} may not` } } });
        put('main', 'redir', { redirect: `${cdn.url}/cdn/video` });
        put('dflt', 'video', content(DVIDEO, 'video/mp4', 'd.mp4'));
        put('headonly', 'video', content(DVIDEO, 'video/mp4', 'd.mp4'));
        put('dflt', 'thumbnail', content(THUMB, 'image/png', 'thumb.png'));
        put('novideo', 'notes', content(NOTES, 'text/plain', 'notes.txt'));
        put('throwing', 'video', content(DVIDEO, 'video/mp4', 'd.mp4'));
        put('foreign', 'video', content(DVIDEO, 'video/mp4', 'd.mp4'));

        await mapLimit(Object.keys(T).filter((n) => n !== 'pending'), 8, (n) =>
            waitStatus(gw, n === 'plain' ? plain.acct.key : env.acct.key, T[n].id, 'SUCCESS',
                { ms: 15000 }));
        await waitFor(() => vendor.polls(T.pending.up).length > 0, 5000,
            { what: 'the pending task polled' });
    });

    after(async () => {
        await cdn?.close();
    });

    test('the list: what listArtifacts projects, each with a link signed for the public address', async () => {
        const r = await list(T.main.id);
        assert.equal(r.status, 200, `${r.status} ${r.text.slice(0, 500)}`);
        assert.equal(r.json.object, 'list');
        assert.equal(r.json.task_id, T.main.id);
        /* mimeType only where the plugin gave one */
        assert.deepEqual(r.json.data.map(({ url, ...rest }) => rest), MAIN_LIST);
        const t = now();
        const sigs = new Set();
        for (const a of r.json.data) {
            const m = new RegExp(`^${reEsc(PUBLIC)}/v1/tasks/${T.main.id}/artifacts/` +
                `${reEsc(a.key)}/content\\?expires=(\\d+)&signature=([0-9a-fA-F]{64})$`).exec(a.url);
            assert.ok(m, `the link of ${a.key}: ${a.url}`);
            assert.ok(Math.abs(Number(m[1]) - (t + 3600)) <= 120, `expires ${m[1]}: now + 1 h`);
            sigs.add(m[2].toLowerCase());
        }
        assert.equal(sigs.size, MAIN_LIST.length, 'one signature per link');

        const d = await list(T.dflt.id);
        assert.equal(d.status, 200, d.text);
        assert.deepEqual(d.json.data.map(({ url, ...rest }) => rest), DEFAULT_LIST);

        /* what listArtifacts(task) is given */
        const e = await list(T.echo.id);
        assert.equal(e.status, 200, e.text);
        assert.deepEqual(e.json.data.map((a) => a.key), [`${T.echo.id}.SUCCESS.video.generate.1.0.0`]);

        /* 64 entries and a key of 128 characters are fine */
        const g = await list(T.edge.id);
        assert.equal(g.status, 200, g.text.slice(0, 500));
        assert.deepEqual(g.json.data.map(({ url, ...rest }) => rest), T.edge.data.artifacts);

        /* an unfinished task: what the plugin lists (nothing) */
        const view = await api(`/v1/tasks/${T.pending.id}`);
        assert.notEqual(view.json.status, 'SUCCESS');
        const p = await list(T.pending.id);
        assert.equal(p.status, 200, p.text);
        assert.deepEqual(p.json, { object: 'list', task_id: T.pending.id, data: [] });

        /* a plugin without the hooks lists nothing */
        const n = await list(T.plain.id, { key: plain.acct.key });
        assert.equal(n.status, 200, n.text);
        assert.deepEqual(n.json, { object: 'list', task_id: T.plain.id, data: [] });

        /* the owner's only */
        assertError(await list(T.main.id, { key: other.key }), 404, { code: 'task_not_found' });
        assertError(await list(T.plain.id), 404, { code: 'task_not_found' });
        assertError(await list('task_nonesuch'), 404, { code: 'task_not_found' });
        assertError(await anon(listPath(T.main.id)), 401, { code: 'invalid_token' });
        assertError(await list(T.main.id, { key: 'sk-wrong' }), 401, { code: 'invalid_token' });
    });

    test('a list the host refuses is 500 plugin_error, for the list and for the content', async () => {
        const bad = Object.keys(T).filter((n) => n.startsWith('bad_'));
        assert.equal(bad.length, 14);
        for (const n of bad) {
            const r = await list(T[n].id);
            assert.equal(r.status, 500, `${n}: ${r.status} ${r.text.slice(0, 300)}`);
            assertError(r, 500, { code: 'plugin_error' });
        }
        assertError(await contentOf(T.bad_dup.id, 'a'), 500, { code: 'plugin_error' });
        assertError(await contentOf(T.bad_throw.id, 'video'), 500, { code: 'plugin_error' });
        assert.equal(vendorGot(T.bad_dup.up, 'a').length, 0, 'nothing asked of the vendor');
    });

    test('content with the API key: the vendor\'s bytes exactly, only the allowed headers, the safe client headers to the plugin', async () => {
        const e = store.get(`${T.main.up}/video`);
        const r = await contentOf(T.main.id, 'video',
            { headers: { Cookie: 'c=1', 'X-Custom': 'x', Accept: '*/*' } });
        assert.equal(r.status, 200, `${r.status} ${r.text.slice(0, 300)}`);
        assert.equal(r.body.length, VIDEO.length);
        assert.equal(sha(r.body), sha(VIDEO), 'byte-exact');
        assert.equal(r.headers['content-type'], 'video/mp4');
        assert.equal(r.headers['content-length'], String(VIDEO.length));
        assert.equal(r.headers['accept-ranges'], 'bytes');
        assert.equal(r.headers.etag, e.etag);
        assert.equal(r.headers['last-modified'], LAST_MODIFIED);
        assert.equal(r.headers['cache-control'], 'private, max-age=60');
        assert.equal(r.headers['content-disposition'], 'attachment; filename="video.mp4"');
        assert.equal(r.headers['set-cookie'], undefined, 'Set-Cookie is not passed');
        assert.equal(r.headers['x-vendor-secret'], undefined, 'vendor headers are not passed');

        const got = vendorGot(T.main.up, 'video').at(-1);
        assert.ok(got, 'the vendor was asked');
        assert.equal(got.method, 'GET');
        assert.equal(got.headers.authorization, `Bearer ${channelKey}`);
        assert.equal(got.headers.cookie, undefined);
        assert.equal(got.headers['x-custom'], undefined);
        const c = ctxOf(got);
        assert.deepEqual(c.clientRequest, { method: 'GET', headers: {} });
        assert.equal(c.artifactKey, 'video');
        assert.equal(c.upstreamTaskId, T.main.up);
        assert.equal(c.model, env.model);
        assert.equal(c.baseUrl, vendor.url);
        assert.ok(c.dataKeys.includes('artifacts') && c.dataKeys.includes('url'),
            `ctx.data is the task data: ${c.dataKeys}`);
        assert.equal(c.apiKeyIsString, true, 'the driver context has the channel key');

        /* the six safe headers, lowercase, and nothing else */
        const safe = {
            range: 'bytes=0-9', 'if-range': e.etag, 'if-none-match': '"other"',
            'if-modified-since': LAST_MODIFIED, 'if-match': e.etag,
            'if-unmodified-since': 'Wed, 04 Nov 2026 10:00:00 GMT',
        };
        const r2 = await contentOf(T.main.id, 'video', { headers: {
            Range: safe.range, 'If-Range': safe['if-range'], 'If-None-Match': safe['if-none-match'],
            'If-Modified-Since': safe['if-modified-since'], 'If-Match': safe['if-match'],
            'If-Unmodified-Since': safe['if-unmodified-since'], Cookie: 'c=1', 'X-Custom': 'x',
            'Accept-Language': 'de', 'Accept-Encoding': 'gzip' } });
        assert.equal(r2.status, 206, `${r2.status} ${r2.text.slice(0, 300)}`);
        assert.ok(r2.body.equals(VIDEO.subarray(0, 10)));
        assert.deepEqual(ctxOf(vendorGot(T.main.up, 'video').at(-1)).clientRequest,
            { method: 'GET', headers: safe });

        /* ranges */
        const r3 = await contentOf(T.main.id, 'video', { headers: { Range: 'bytes=100-199' } });
        assert.equal(r3.status, 206, r3.text.slice(0, 300));
        assert.equal(r3.headers['content-range'], `bytes 100-199/${VIDEO.length}`);
        assert.equal(r3.headers['content-length'], '100');
        assert.equal(r3.headers['content-type'], 'video/mp4');
        assert.ok(r3.body.equals(VIDEO.subarray(100, 200)));
        const r4 = await contentOf(T.main.id, 'video', { headers: { Range: 'bytes=-10' } });
        assert.equal(r4.status, 206);
        assert.ok(r4.body.equals(VIDEO.subarray(VIDEO.length - 10)));
        const r5 = await contentOf(T.main.id, 'video', { headers: { Range: `bytes=${VIDEO.length}-` } });
        assert.equal(r5.status, 416, r5.text.slice(0, 300));
        assert.equal(r5.headers['content-range'], `bytes */${VIDEO.length}`);
        /* as the vendor answered it, not a page of the gateway's */
        assert.equal(r5.headers['content-type'], 'text/plain');
        assert.equal(r5.headers.etag, e.etag);
        assert.equal(r5.headers['last-modified'], LAST_MODIFIED);
        assert.equal(r5.headers['accept-ranges'], 'bytes');
        assert.equal(r5.text, 'range not satisfiable');
        /* a HEAD 416 has no body: the next answer on the connection follows
           its head at once */
        const auth = `Authorization: Bearer ${env.acct.key}\r\nHost: x\r\n`;
        const raw = await rawHttp(gw.port,
            `HEAD ${contentPath(T.main.id, 'video')} HTTP/1.1\r\n${auth}Range: bytes=${VIDEO.length}-\r\n\r\n`
            + `GET ${contentPath(T.main.id, 'thumbnail')} HTTP/1.1\r\n${auth}Connection: close\r\n\r\n`,
            { halfClose: false });
        assert.equal(raw.status, 416);
        assert.equal(raw.headers['content-length'], '21');
        assert.match(raw.body, /^HTTP\/1\.1 200 /, raw.body.slice(0, 200));

        /* conditional */
        const r6 = await contentOf(T.main.id, 'video', { headers: { 'If-None-Match': e.etag } });
        assert.equal(r6.status, 304, r6.text.slice(0, 300));
        assert.equal(r6.headers.etag, e.etag);
        assert.equal(r6.body.length, 0);

        /* HEAD: the headers without the body */
        const h = await contentOf(T.main.id, 'video', { method: 'HEAD' });
        assert.equal(h.status, 200);
        assert.equal(h.headers['content-length'], String(VIDEO.length));
        assert.equal(h.headers['content-type'], 'video/mp4');
        assert.equal(h.headers.etag, e.etag);
        assert.equal(h.body.length, 0);
        const hg = vendorGot(T.main.up, 'video').at(-1);
        assert.equal(hg.method, 'HEAD');
        assert.equal(ctxOf(hg).clientRequest.method, 'HEAD');

        /* the other artifacts */
        for (const [k, bytes, type] of [['thumbnail', THUMB, 'image/png'],
            ['clip.v2_a-B9', CLIP, 'application/octet-stream'], ['audio', AUDIO, 'audio/mpeg']]) {
            const a = await contentOf(T.main.id, k);
            assert.equal(a.status, 200, `${k}: ${a.status} ${a.text.slice(0, 300)}`);
            assert.ok(a.body.equals(bytes), `${k} byte-exact`);
            assert.equal(a.headers['content-type'], type);
        }
    });

    test('a content request of HEAD for a client\'s GET is 500 invalid_descriptor; for a HEAD it is sent', async () => {
        const before = vendorGot(T.headonly.up, 'video').length;
        assertError(await contentOf(T.headonly.id, 'video'), 500, { code: 'invalid_descriptor',
            message: /method HEAD answers no content/ });
        assert.equal(vendorGot(T.headonly.up, 'video').length, before);
        const h = await contentOf(T.headonly.id, 'video', { method: 'HEAD' });
        assert.equal(h.status, 200);
        assert.equal(h.headers['content-length'], String(DVIDEO.length));
        assert.equal(vendorGot(T.headonly.up, 'video').at(-1).method, 'HEAD');
    });

    test('a client that leaves before the vendor\'s head: the vendor request is stopped', async () => {
        const n = cdnGot('slowhead').length;
        await new Promise((resolve) => {
            const sock = net.connect(gw.port, '127.0.0.1', () => {
                sock.write(`GET ${contentPath(T.cdn.id, 'slowhead')} HTTP/1.1\r\nHost: x\r\n`
                    + `Authorization: Bearer ${env.acct.key}\r\n\r\n`);
                setTimeout(() => { sock.destroy(); resolve(); }, 300);
            });
            sock.on('error', () => {});
        });
        await waitFor(() => cdnGot('slowhead').length > n, 3000, { what: 'the CDN asked' });
        const rec = cdnGot('slowhead').at(-1);
        /* long before the vendor's 8 s, and llmgw_task_http_timeout's 60 s */
        await waitFor(() => rec.closed, 2500, { what: 'the CDN request stopped' });
    });

    test('a client that leaves while the content request is built: the vendor request is stopped', async () => {
        for (const p of [contentPath(T.slowbuild.id, 'slowhead'), `/v1/videos/${T.slowbuild.id}/content`]) {
            const n = cdnGot('slowhead').length;
            await new Promise((resolve) => {
                const sock = net.connect(gw.port, '127.0.0.1', () => {
                    sock.write(`GET ${p} HTTP/1.1\r\nHost: x\r\n`
                        + `Authorization: Bearer ${env.acct.key}\r\n\r\n`);
                    /* gone before buildContentRequest (1 s) has answered */
                    setTimeout(() => { sock.destroy(); resolve(); }, 300);
                });
                sock.on('error', () => {});
            });
            await sleep(1500);
            /* the CDN is not asked, or its request ends at once: not at its 8 s */
            await waitFor(() => cdnGot('slowhead').slice(n).every((q) => q.closed), 2500,
                { what: `${p}: the CDN request stopped` });
        }
    });

    test('failures: vendor 404 and 410 are artifact_not_found, others 502; unknown keys; hooks that throw; foreign hosts', async () => {
        assertError(await contentOf(T.main.id, 'gone404'), 404, { code: 'artifact_not_found' });
        assertError(await contentOf(T.main.id, 'gone410'), 404, { code: 'artifact_not_found' });
        for (const k of ['broken', 'denied']) {
            const r = await contentOf(T.main.id, k);
            assertError(r, 502, { type: 'upstream_error', code: 'bad_response_status_code' });
            assert.equal(r.headers['x-vendor-secret'], undefined);
        }

        const before0 = vendor.requests.length;
        assertError(await contentOf(T.main.id, 'nope'), 404, { code: 'artifact_not_found' });
        assertError(await contentOf(T.main.id, 'video.'), 404, { code: 'artifact_not_found' });
        assert.equal((await contentOf(T.main.id, 'nope', { method: 'HEAD' })).status, 404);
        assertError(await contentOf(T.pending.id, 'video'), 404, { code: 'artifact_not_found' });
        assertError(await contentOf(T.plain.id, 'video', { key: plain.acct.key }), 404,
            { code: 'artifact_not_found' });
        assert.equal(vendor.requests.slice(before0).filter((q) => q.kind === 'other').length, 0,
            'the vendor is not asked for an artifact it did not list');

        /* the owner's only */
        assertError(await contentOf(T.main.id, 'video', { key: other.key }), 404, { code: 'task_not_found' });
        assertError(await contentOf('task_nonesuch', 'video'), 404, { code: 'task_not_found' });
        assertError(await anon(contentPath(T.main.id, 'video')), 401, { code: 'invalid_token' });
        assertError(await contentOf(T.main.id, 'video', { key: 'sk-wrong' }), 401, { code: 'invalid_token' });

        assertError(await contentOf(T.throwing.id, 'video'), 500, { code: 'plugin_error' });

        /* a request with the channel credential goes nowhere but the channel host */
        const cdn0 = cdn.requests.length;
        const f = await contentOf(T.foreign.id, 'video');
        assert.ok([500, 502].includes(f.status), `a foreign host: ${f.status} ${f.text.slice(0, 300)}`);
        assertErrorShape(f, f.status);
        /* nor is it redirected there */
        const rd = await contentOf(T.main.id, 'redir');
        assertErrorShape(rd, 502);
        assert.equal(cdn.requests.length, cdn0, 'the CDN got nothing with credentials');
    });

    test('credentialless CDN: no credentials, the client\'s Range and conditions do go; redirects followed up to 5, each checked', async () => {
        const full = await contentOf(T.cdn.id, 'video', { headers: { Cookie: 'c=1', 'X-Custom': 'y' } });
        assert.equal(full.status, 200, `${full.status} ${full.text.slice(0, 300)}`);
        assert.equal(sha(full.body), sha(CDN_VIDEO));
        assert.equal(full.headers['content-type'], 'video/mp4');
        const g = cdnGot('video').at(-1);
        assert.equal(g.method, 'GET');
        for (const h of ['authorization', 'x-ctx', 'cookie', 'x-custom']) {
            assert.equal(g.headers[h], undefined, `the CDN got ${h}`);
        }

        const r = await contentOf(T.cdn.id, 'video', { headers: { Range: 'bytes=0-99',
            'If-None-Match': '"zzz"', Cookie: 'c=1' } });
        assert.equal(r.status, 206, r.text.slice(0, 300));
        assert.ok(r.body.equals(CDN_VIDEO.subarray(0, 100)));
        assert.equal(r.headers['content-range'], `bytes 0-99/${CDN_VIDEO.length}`);
        const g2 = cdnGot('video').at(-1);
        assert.equal(g2.headers.range, 'bytes=0-99');
        assert.equal(g2.headers['if-none-match'], '"zzz"');
        assert.equal(g2.headers.authorization, undefined);
        assert.equal(g2.headers.cookie, undefined);

        const nm = await contentOf(T.cdn.id, 'video', { headers: { 'If-None-Match': cdnVideo.etag } });
        assert.equal(nm.status, 304);

        const h = await contentOf(T.cdn.id, 'video', { method: 'HEAD' });
        assert.equal(h.status, 200);
        assert.equal(h.headers['content-length'], String(CDN_VIDEO.length));
        assert.equal(h.body.length, 0);
        assert.equal(cdnGot('video').at(-1).method, 'HEAD');

        /* a redirect: followed, the Range kept, still no credentials */
        const mv = await contentOf(T.cdn.id, 'moved', { headers: { Range: 'bytes=10-19' } });
        assert.equal(mv.status, 206, mv.text.slice(0, 300));
        assert.ok(mv.body.equals(CDN_VIDEO.subarray(10, 20)));
        const redirected = cdnGot('video').at(-1);
        assert.equal(redirected.headers.range, 'bytes=10-19');
        assert.equal(redirected.headers.authorization, undefined);

        /* five redirects are followed, a sixth is not */
        const h5 = await contentOf(T.cdn.id, 'hop-5');
        assert.equal(h5.status, 200, h5.text.slice(0, 300));
        assert.equal(sha(h5.body), sha(CDN_VIDEO));
        const end0 = cdnGot('hop-0').length;
        const h6 = await contentOf(T.cdn.id, 'hop-6');
        assertErrorShape(h6, 502);
        assert.equal(cdnGot('hop-0').length, end0, 'the sixth redirect was not followed');

        /* a redirect whose address holds the channel key is refused */
        const lk = await contentOf(T.cdn.id, 'leak');
        assertErrorShape(lk, 502);
        assert.equal(cdn.requests.filter((q) => q.url.includes(channelKey)).length, 0,
            'the channel key never went to the CDN');

        assertError(await contentOf(T.cdn.id, 'gone'), 404, { code: 'artifact_not_found' });

        /* chunked with a Content-Length beside it: the body by its framing,
           and no length that is not its own */
        const fr = await contentOf(T.cdn.id, 'framed');
        assert.equal(fr.status, 200, fr.text.slice(0, 300));
        assert.equal(fr.text, 'hello world, more');
        assert.notEqual(fr.headers['content-length'], '5');
        for (const q of cdn.requests) {
            assert.equal(q.headers.authorization, undefined, `the CDN got credentials at ${q.url}`);
        }

        /* llmgw_content_allow_private 127.0.0.1 admits it by every road */
        for (const n of ['tocdn', 'local', 'mapped']) {
            const x = await contentOf(T[n].id, 'video');
            assert.equal(x.status, 200, `${n}: ${x.status} ${x.text.slice(0, 300)}`);
            assert.equal(sha(x.body), sha(CDN_VIDEO), n);
        }
        /* 2130706433 is 127.0.0.1 to some parsers, a name to others */
        const cdn1 = cdn.requests.length;
        assertError(await contentOf(T.decimal.id, 'video'), 500, { code: 'invalid_descriptor',
            message: /url host "2130706433" is not valid \(an IPv4 address is four decimal numbers/ });
        assert.equal(cdn.requests.length, cdn1);
    });

    test('without llmgw_content_allow_private a plugin\'s content address reaches no loopback address: not directly, through a redirect, a name or ::ffff:', async () => {
        let gwE, dns;
        try {
            dns = await startDns([CDN_NAME]);
            gwE = await startGateway({ db, rootToken: gw.rootToken, v8host: true,
                http: `${BASE_HTTP}\n  resolver 127.0.0.1:${dns.port} ipv6=off;` });
            const onE = (id, k, opts = {}) => bin(gwE.url + contentPath(id, k),
                { key: env.acct.key, ...opts });
            const ready = await waitFor(async () => {
                const r = await onE(T.main.id, 'thumbnail');
                return r.status === 200 ? r : null;
            }, 8000, { what: 'the second gateway' });
            /* the channel's base URL is the operator's: loopback is fine there */
            assert.equal(sha(ready.body), sha(THUMB));
            const own = await onE(T.own.id, 'video');
            assert.equal(own.status, 200, `the channel's origin: ${own.status} ${own.text.slice(0, 300)}`);
            assert.equal(sha(own.body), sha(CDN_VIDEO));

            const cdn0 = cdn.requests.length;
            const refused = async (n, message) => {
                const r = await onE(T[n].id, 'video');
                assertError(r, 502, { code: 'do_request_failed', message });
                assert.equal(cdn.requests.length, cdn0, `${n}: the CDN got nothing`);
            };
            const port = reEsc(String(cdn.port));
            await refused('cdn', new RegExp(`the content request failed: 127\\.0\\.0\\.1:${port} is not a public address`));
            /* the first hop is the channel's origin, the redirect is not */
            const hop0 = vendor.requests.filter((q) => q.path === '/to-cdn/video').length;
            await refused('tocdn', new RegExp(`127\\.0\\.0\\.1:${port} is not a public address`));
            assert.equal(vendor.requests.filter((q) => q.path === '/to-cdn/video').length, hop0 + 1);
            await refused('local', new RegExp(`localhost:${port} has no public address`));
            await refused('mapped', new RegExp(`\\[::ffff:127\\.0\\.0\\.1\\]:${port} is not a public address`));
            await refused('named', new RegExp(`${reEsc(CDN_NAME)}:${port} has no public address`));
            assert.ok(dns.queries.some((q) => q.name === CDN_NAME), 'the name was looked up');
            assert.match(gwE.errorLog(), /\[warn\].*127\.0\.0\.1:\d+ is not a public address: refused for a content request \(llmgw_content_allow_private\)/);
        } finally {
            if (gwE) {
                await gwE.stop();
                logs.push(gwE.errorLog());
                assertCleanLog(gwE);
            }
            await dns?.close();
        }
    });

    test('signed links: no key needed, GET, HEAD and ranges; tampering is 403 invalid_signature', async () => {
        const links = Object.fromEntries((await list(T.main.id)).json.data.map((a) => [a.key, a.url]));
        const v = await bin(here(links.video));
        assert.equal(v.status, 200, `${v.status} ${v.text.slice(0, 300)}`);
        assert.equal(sha(v.body), sha(VIDEO));
        assert.equal(v.headers['content-type'], 'video/mp4');
        const h = await bin(here(links.video), { method: 'HEAD' });
        assert.equal(h.status, 200);
        assert.equal(h.headers['content-length'], String(VIDEO.length));
        assert.equal(h.body.length, 0);
        const rg = await bin(here(links.video), { headers: { Range: 'bytes=5-9' } });
        assert.equal(rg.status, 206);
        assert.ok(rg.body.equals(VIDEO.subarray(5, 10)));
        const t = await bin(here(links.thumbnail));
        assert.equal(t.status, 200);
        assert.ok(t.body.equals(THUMB));
        /* the vendor still gets the channel credential, never the link's */
        assert.equal(vendorGot(T.main.up, 'thumbnail').at(-1).headers.authorization, `Bearer ${channelKey}`);

        /* a CDN artifact through its link */
        const cl = (await list(T.cdn.id)).json.data.find((a) => a.key === 'video').url;
        const c = await bin(here(cl));
        assert.equal(c.status, 200);
        assert.equal(sha(c.body), sha(CDN_VIDEO));

        const u = new URL(links.video);
        const exp = Number(u.searchParams.get('expires'));
        const sig = u.searchParams.get('signature');
        const thumbSig = new URL(links.thumbnail).searchParams.get('signature');
        const flip = (x) => x.slice(0, -1) + (x.at(-1) === '0' ? '1' : '0');
        const at = (id, k, e, sg) => `${gw.url}${contentPath(id, k)}?expires=${e}&signature=${sg}`;
        const bad = {
            'a wrong signature': at(T.main.id, 'video', exp, flip(sig)),
            'a short signature': at(T.main.id, 'video', exp, sig.slice(0, 63)),
            'another link\'s signature': at(T.main.id, 'video', exp, thumbSig),
            'another key': at(T.main.id, 'thumbnail', exp, sig),
            'another task': at(T.dflt.id, 'video', exp, sig),
            'a later expiry': at(T.main.id, 'video', exp + 1, sig),
            /* the same time spelt otherwise is another link */
            'a leading zero': at(T.main.id, 'video', `0${exp}`, sig),
            'a plus sign': at(T.main.id, 'video', `%2B${exp}`, sig),
            'a leading space': at(T.main.id, 'video', `%20${exp}`, sig),
            'a trailing space': at(T.main.id, 'video', `${exp}+`, sig),
            /* a NUL ends no value early */
            'a NUL and more after the expiry': at(T.main.id, 'video', `${exp}%000`, sig),
            'a NUL and more after the signature': at(T.main.id, 'video', exp, `${sig}%00x`),
        };
        for (const [what, url] of Object.entries(bad)) {
            const r = await bin(url);
            assert.equal(r.status, 403, `${what}: ${r.status} ${r.text.slice(0, 300)}`);
            assertError(r, 403, { code: 'invalid_signature' });
        }
        /* neither a key nor a signature */
        assertError(await anon(contentPath(T.main.id, 'video')), 401, { code: 'invalid_token' });
    });

    test('/v1/videos/{id}/content: the first video artifact, or ?variant=', async () => {
        const vp = (id, q = '') => `/v1/videos/${encodeURIComponent(id)}/content${q}`;
        const n0 = vendorGot(T.main.up, 'video').length;
        const r = await api(vp(T.main.id));
        assert.equal(r.status, 200, `${r.status} ${r.text.slice(0, 300)}`);
        assert.equal(sha(r.body), sha(VIDEO), 'the first artifact of type video, not the first');
        assert.equal(r.headers['content-type'], 'video/mp4');
        assert.equal(vendorGot(T.main.up, 'video').length, n0 + 1);

        const t = await api(vp(T.main.id, '?variant=thumbnail'));
        assert.equal(t.status, 200, t.text.slice(0, 300));
        assert.ok(t.body.equals(THUMB));
        assert.equal(t.headers['content-type'], 'image/png');
        assertError(await api(vp(T.main.id, '?variant=nope')), 404, { code: 'artifact_not_found' });

        const h = await api(vp(T.main.id), { method: 'HEAD' });
        assert.equal(h.status, 200);
        assert.equal(h.headers['content-length'], String(VIDEO.length));
        assert.equal(h.body.length, 0);
        const rg = await api(vp(T.main.id), { headers: { Range: 'bytes=1000-1999' } });
        assert.equal(rg.status, 206);
        assert.ok(rg.body.equals(VIDEO.subarray(1000, 2000)));

        /* no video artifact: the first */
        const nv = await api(vp(T.novideo.id));
        assert.equal(nv.status, 200, nv.text.slice(0, 300));
        assert.ok(nv.body.equals(NOTES));
        const d = await api(vp(T.dflt.id));
        assert.equal(d.status, 200);
        assert.ok(d.body.equals(DVIDEO));
        const c = await api(vp(T.cdn.id));
        assert.equal(c.status, 200);
        assert.equal(sha(c.body), sha(CDN_VIDEO));

        assertError(await api(vp(T.pending.id)), 404, { code: 'artifact_not_found' });
        assertError(await api(vp(T.main.id), { key: other.key }), 404, { code: 'task_not_found' });
        assertError(await api(vp(T.plain.id), { key: plain.acct.key }), 404, { code: 'task_not_found' });
        assertError(await anon(vp(T.main.id)), 401, { code: 'invalid_token' });
    });

    test('a slow client: 64 MB stream through byte-exact, and the gateway does not hold them', async () => {
        const BIG = randomBytes(64 * 1024 * 1024);
        const bigSha = sha(BIG);
        store.set(`${T.big.up}/big`, content(BIG, 'video/mp4', 'big.mp4'));
        try {
            /* warm up, then the workers' resident memory as it is */
            assert.equal((await contentOf(T.main.id, 'thumbnail')).status, 200);
            const rss = () => gw.workerPids().reduce((sum, pid) => {
                try {
                    const m = /^VmRSS:\s*(\d+)\s*kB/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
                    return sum + (m ? Number(m[1]) * 1024 : 0);
                } catch {
                    return sum;
                }
            }, 0);
            const base = rss();
            const got = await slowRead(gw.url + contentPath(T.big.id, 'big'), env.acct.key, 2500, rss);
            assert.equal(got.status, 200);
            assert.equal(got.length, BIG.length);
            assert.equal(got.sha, bigSha, 'byte-exact');
            const grew = Math.max(...got.samples) - base;
            assert.ok(grew < 32 * 1024 * 1024,
                `the workers grew by ${(grew / 1048576).toFixed(1)} MB while the client paused`);
        } finally {
            store.delete(`${T.big.up}/big`);
        }
    });

    test('another secret rejects the links; without a public address the request\'s Host names it; llmgw_artifact_link_ttl', async () => {
        let gwB;
        try {
            gwB = await startGateway({ db, rootToken: gw.rootToken, v8host: true, http: HTTP_B });
            const onB = (p, opts = {}) => bin(gwB.url + p, opts);
            const lb = await waitFor(async () => {
                const r = await onB(listPath(T.main.id), { key: env.acct.key });
                return r.status === 200 ? r : null;
            }, 8000, { what: 'the list on the second gateway' });
            const tb = now();
            const vb = lb.json.data.find((a) => a.key === 'video').url;
            const m = new RegExp(`^${reEsc(gwB.url)}/v1/tasks/${T.main.id}/artifacts/video/` +
                'content\\?expires=(\\d+)&signature=([0-9a-fA-F]{64})$').exec(vb);
            assert.ok(m, `a link of the request's own address: ${vb}`);
            const exp = Number(m[1]);
            assert.ok(exp >= tb + TTL_B - 2 && exp <= tb + TTL_B + 1, `expires ${exp}, now ${tb}`);
            const ok = await bin(vb);
            assert.equal(ok.status, 200, `${ok.status} ${ok.text.slice(0, 300)}`);
            assert.equal(sha(ok.body), sha(VIDEO));

            /* each gateway's links fail on the other */
            const la = (await list(T.main.id)).json.data.find((a) => a.key === 'video').url;
            const path = (x) => { const u = new URL(x); return u.pathname + u.search; };
            assertError(await onB(path(la)), 403, { code: 'invalid_signature' });
            assertError(await anon(path(vb)), 403, { code: 'invalid_signature' });

            const lh = await onB(listPath(T.main.id), { key: env.acct.key,
                headers: { Host: 'links.example:8080' } });
            assert.equal(lh.status, 200, lh.text.slice(0, 300));
            assert.match(lh.json.data[0].url,
                new RegExp(`^http://links\\.example:8080/v1/tasks/${T.main.id}/artifacts/thumbnail/content\\?`));

            /* past its expiry */
            await sleep(Math.max(0, (exp + 1) * 1000 - Date.now()) + 100);
            assertError(await bin(vb), 403, { code: 'link_expired' });
        } finally {
            if (gwB) {
                await gwB.stop();
                logs.push(gwB.errorLog());
                assertCleanLog(gwB);
            }
        }
    });

    test('without llmgw_crypto_secret the links are unsigned and need the API key', async () => {
        let gwC;
        try {
            gwC = await startGateway({ db, rootToken: gw.rootToken, v8host: true, http: BASE_HTTP });
            const lc = await waitFor(async () => {
                const r = await bin(gwC.url + listPath(T.main.id), { key: env.acct.key });
                return r.status === 200 ? r : null;
            }, 8000, { what: 'the list on the gateway without a secret' });
            assert.deepEqual(lc.json.data.map((a) => a.url), MAIN_LIST.map((a) =>
                `${gwC.url}/v1/tasks/${T.main.id}/artifacts/${a.key}/content`));
            const url = lc.json.data.find((a) => a.key === 'video').url;
            const r = await bin(url, { key: env.acct.key });
            assert.equal(r.status, 200, `${r.status} ${r.text.slice(0, 300)}`);
            assert.equal(sha(r.body), sha(VIDEO));
            assertError(await bin(url), 401, { code: 'invalid_token' });
        } finally {
            if (gwC) {
                await gwC.stop();
                logs.push(gwC.errorLog());
                assertCleanLog(gwC);
            }
        }
    });

    test('under limit_rate the content still flows to its end (the delayed writes keep their timers)', async () => {
        let gwD;
        try {
            gwD = await startGateway({ db, rootToken: gw.rootToken, v8host: true,
                http: `${HTTP_A}\n  limit_rate 2m;` });
            const r = await waitFor(async () => {
                const x = await bin(gwD.url + contentPath(T.main.id, 'video'),
                    { key: env.acct.key, timeoutMs: 20000 });
                return x.status === 200 ? x : null;
            }, 25000, { what: 'the rate-limited download' });
            assert.equal(sha(r.body), sha(VIDEO));
        } finally {
            if (gwD) {
                await gwD.stop();
                logs.push(gwD.errorLog());
                assertCleanLog(gwD);
            }
        }
    });

    test('the channel key and the secrets reach no answer and no log line; the client\'s key no upstream', () => {
        assert.deepEqual(leaks, []);
        logs.push(gw.errorLog());
        for (const [i, log] of logs.entries()) {
            for (const x of SECRETS) {
                assert.equal(log.includes(x), false, `error log ${i} holds ${x.slice(0, 6)}...`);
            }
        }
        for (const q of [...vendor.requests, ...cdn.requests]) {
            assert.equal(`${q.url} ${JSON.stringify(q.headers)}`.includes(env.acct.key), false,
                `the client's key went upstream: ${q.method} ${q.url}`);
        }
    });
});

/*
 * GET url with the key, the answer left unread for pauseMs while sample()
 * is taken every 100 ms, then read to the end:
 * -> {status, length, sha, samples}.
 */
function slowRead(url, key, pauseMs, sample, timeoutMs = 30000) {
    return new Promise((resolve, reject) => {
        const u = new URL(url);
        let done = false;
        const fail = (e) => {
            if (!done) {
                done = true;
                clearTimeout(timer);
                req.destroy();
                reject(e);
            }
        };
        const req = http.request({ host: u.hostname, port: u.port, path: u.pathname + u.search,
            method: 'GET', headers: { Authorization: `Bearer ${key}` }, agent: false }, (res) => {
            res.pause();
            const samples = [sample()];
            const iv = setInterval(() => samples.push(sample()), 100);
            setTimeout(() => {
                clearInterval(iv);
                samples.push(sample());
                const h = createHash('sha256');
                let length = 0;
                res.on('data', (c) => {
                    h.update(c);
                    length += c.length;
                });
                res.on('end', () => {
                    if (!done) {
                        done = true;
                        clearTimeout(timer);
                        resolve({ status: res.statusCode, length, sha: h.digest('hex'), samples });
                    }
                });
                res.on('error', fail);
                res.resume();
            }, pauseMs);
        });
        const timer = setTimeout(() => fail(new Error(`GET ${url}: not read in ${timeoutMs} ms`)),
            timeoutMs);
        req.on('error', fail);
        req.end();
    });
}
