// v8_host: frames, plugin loading, hook calls, limits, utilities and the
// supervisor, against the real helper binary (make v8host).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import crypto from 'node:crypto';

import { startHelper, Client, frame, header, waitFor,
         LOAD, CALL, STATUS, REPLY } from './lib.mjs';
import { TEST_PLUGIN, capabilityPlugin, pluginWith } from './plugin.mjs';

const DEADLINE_MS = 1000;
const MAX_FRAME = 4 * 1024 * 1024;

let helper;
let client;
let sha;

before(async () => {
    helper = await startHelper({ workers: 2, deadlineMs: DEADLINE_MS, heapMb: 32,
                                 maxFrame: MAX_FRAME });
    client = await helper.connect();
    const r = await client.load(TEST_PLUGIN);
    assert.equal(r.ok, true, JSON.stringify(r));
    sha = r.sha;
});

after(async () => {
    await client?.close();
    const r = await helper?.stop();
    // A clean SIGTERM shutdown: exit 0, and nothing logged at error level.
    assert.deepEqual(r, { code: 0, sig: null });
    assert.doesNotMatch(helper.log(), / error: /);
});

const op = (o, extra = {}) => client.call(sha, 'buildSubmitRequest', [{ op: o, ...extra }]);
const util = async (fn, ...args) => {
    const r = await client.call(sha, 'buildSubmitRequest', [{ op: 'util', fn, args }]);
    assert.equal(r.ok, true, JSON.stringify(r));
    return r.result;
};

// ---- frames ----

test('a reply echoes the request id and type', async () => {
    const c = await helper.connect();
    const reply = await c.sendRaw(frame(STATUS, 0xdeadbeef, {}));
    assert.equal(reply.version, 1);
    assert.equal(reply.id, 0xdeadbeef);
    assert.equal(reply.type, REPLY | STATUS);
    assert.equal(reply.body.ok, true);
    await c.close();
});

test('frames sent together are answered in order, then a bad one closes', async () => {
    const c = await helper.connect();
    const replies = [c.sendRaw(Buffer.alloc(0)), c.sendRaw(Buffer.alloc(0))];
    const closed = c.sendRaw(Buffer.alloc(0)).then(() => 'replied', () => 'closed');
    c.sock.write(Buffer.concat([frame(STATUS, 11, {}), frame(CALL, 12, { hook: 'x' }),
                                header({ version: 9, type: STATUS, id: 13, length: 0 })]));
    const [a, b] = await Promise.all(replies);
    assert.deepEqual([a.id, a.type, b.id, b.type], [11, REPLY | STATUS, 12, REPLY | CALL]);
    assert.equal(b.body.error.kind, 'bad_request');
    assert.equal(await closed, 'closed');
});

test('a connection stalled mid-frame does not hold up others', async () => {
    const slow = await helper.connect();
    slow.sock.write(frame(STATUS, 21, {}).subarray(0, 7));
    const others = await Promise.all([1, 2, 3].map(async () => {
        const c = await helper.connect();
        const s = await c.status();
        await c.close();
        return s.ok;
    }));
    assert.deepEqual(others, [true, true, true]);
    const reply = slow.sendRaw(frame(STATUS, 21, {}).subarray(7));
    assert.equal((await reply).id, 21);
    await slow.close();
});

async function expectClosed(bytes) {
    const c = await helper.connect();
    const outcome = await Promise.race([
        c.sendRaw(bytes).then(() => 'replied', () => 'closed'),
        new Promise((r) => setTimeout(() => r('hung'), 3000)),
    ]);
    assert.equal(outcome, 'closed');
    c.close();
}

test('a frame with a wrong version closes the connection', async () => {
    const body = Buffer.from('{}');
    await expectClosed(Buffer.concat([header({ version: 2, type: STATUS, id: 1,
                                                length: body.length }), body]));
});

test('a length over --max-frame closes the connection before the body', async () => {
    await expectClosed(header({ type: LOAD, id: 2, length: MAX_FRAME + 1 }));
});

test('an unknown type or a reply frame closes the connection', async () => {
    await expectClosed(frame(9, 3, {}));
    await expectClosed(frame(REPLY | CALL, 4, {}));
});

test('the connection keeps working after an error reply', async () => {
    const c = await helper.connect();
    const bad = await c.request(CALL, { hook: 'x' });
    assert.equal(bad.error.kind, 'bad_request');
    const notJson = await c.sendRaw(frame(LOAD, 7, 'not json'));
    assert.equal(notJson.body.error.kind, 'bad_request');
    assert.equal((await c.status()).ok, true);
    await c.close();
});

// ---- LOAD ----

test('LOAD returns the sha of the source, the manifest and the exports', async () => {
    const r = await client.load(TEST_PLUGIN);
    assert.equal(r.ok, true);
    assert.equal(r.sha, crypto.createHash('sha256').update(TEST_PLUGIN).digest('hex'));
    assert.equal(r.manifest.key, 'v8host-test');
    assert.deepEqual([...r.exports].sort(), [
        'buildQueryRequest', 'buildSubmitRequest', 'native.create', 'native.created',
        'parseSubmitResponse', 'parseTaskResult',
    ]);
});

test('words in strings, comments, templates, regexes, keys and members are not refused', async () => {
    const source = pluginWith([
        '// await import async in a comment, /* import x from "y" */',
        "const words = ['await', \"async function\", `import ${'await'}`, /import|await/g];",
        'const flags = { async: true, await: false, import: 1 };',
        'const member = flags.async && flags.import && flags.await;',
        'const async = 1, fn = (async) => async + 1;',
    ].join('\n'));
    const r = await client.load(source);
    assert.equal(r.ok, true, JSON.stringify(r));
});

for (const [name, extra, message] of [
    ['async function', '\n\nexport async function later() {}',
     'plugins are synchronous: `async` functions are not allowed (line 3)'],
    ['async arrow', 'const f = async () => 1;',
     'plugins are synchronous: `async` functions are not allowed (line 1)'],
    ['await', 'const x = 1;\nconst y = await x;',
     'plugins are synchronous: `await` is not allowed (line 2)'],
    ['static import', "import fs from 'fs';",
     'plugins cannot import modules: `import` is not allowed (line 1)'],
    ['dynamic import', "\nconst m = () => import('fs');",
     'plugins cannot import modules: dynamic `import()` is not allowed (line 2)'],
]) {
    test(`LOAD refuses ${name}`, async () => {
        const r = await client.load(pluginWith(extra));
        assert.equal(r.ok, false);
        assert.equal(r.error.kind, 'plugin');
        assert.equal(r.error.message, message);
        assert.deepEqual(r.error.errors, [message]);
    });
}

test('LOAD refuses a re-export from another module', async () => {
    const r = await client.load(pluginWith("export { x } from './other.js';"));
    assert.equal(r.error.kind, 'plugin');
    assert.match(r.error.message, /plugins cannot import modules: ".\/other.js"/);
});

test('LOAD reports a syntax error with its line', async () => {
    const r = await client.load(pluginWith('\nconst = 1;'));
    assert.equal(r.error.kind, 'plugin');
    assert.match(r.error.message, /^SyntaxError: .* \(line 2\)$/);
});

test('LOAD reports an invalid manifest with every validation error', async () => {
    const r = await client.load(pluginWith('').replace("apiVersion: 1", "apiVersion: 2")
                                              .replace("key: 'v8host-small'", "key: 'x'.repeat(31)"));
    assert.equal(r.error.kind, 'plugin');
    assert.match(r.error.message, /^invalid manifest: /);
    assert.ok(r.error.errors.length >= 2, JSON.stringify(r.error.errors));
    assert.ok(r.error.errors.some((e) => e.includes('apiVersion')));
    assert.ok(r.error.errors.some((e) => e.includes('meta.key')));
});

test('LOAD needs meta to be an exported JSON object', async () => {
    const noMeta = pluginWith('').replace('export const meta', 'const meta');
    assert.equal((await client.load(noMeta)).error.message, 'the plugin does not export `meta`');
    const fnMeta = pluginWith('').replace("fetchMode: 'per_task'", "fetchMode: 'per_task', f() {}");
    assert.equal((await client.load(fnMeta)).error.message, 'meta contains a function at .f');
});

test('LOAD stops a module whose top level never ends', async () => {
    const t0 = Date.now();
    const r = await client.load(pluginWith('for (;;) {}'));
    assert.equal(r.error.kind, 'timeout');
    assert.ok(Date.now() - t0 < DEADLINE_MS + 1000);
});

// ---- CALL ----

test('CALL runs a hook with JSON arguments and returns its JSON result', async () => {
    const r = await op('echo', { body: { list: [1, 2, 3], s: 'é😀' } });
    assert.deepEqual(r, { ok: true, result: { url: 'https://example.com/submit',
                                              body: { list: [1, 2, 3], s: 'é😀' } } });
});

test('CALL bodies: escapes decoded, capabilities checked, malformed bodies refused', async () => {
    const c = await helper.connect();
    const raw = (text) => c.sendRaw(frame(CALL, 77, text)).then((r) => r.body);

    // "\u0053" is S; the args text goes to V8 as is (surrogate pairs, big numbers).
    const ok = await raw(`{"sha":"${sha}","hook":"build\\u0053ubmitRequest",`
                         + `"args":[{"op":"echo","body":["\\ud83d\\ude00",12345678901234567890,-0.5e-3]}],`
                         + `"capabilities":["json-clone@1","submit-sse-delta@1"],"deadline_ms":null,"extra":{"x":[1,{}]}}`);
    assert.deepEqual(ok, { ok: true, result: { url: 'https://example.com/submit',
                                               body: ['😀', 12345678901234567000, -0.0005] } });

    const cap = await raw(`{"sha":"${sha}","hook":"buildSubmitRequest","args":[],"capabilities":["json-clone@9"]}`);
    assert.equal(cap.error.kind, 'plugin');
    assert.match(cap.error.message, /capability "json-clone@9" is not supported/);

    for (const bad of [
        `{"sha":"${sha}","hook":"buildSubmitRequest","args":{}}`,
        `{"sha":"${sha}","hook":"buildSubmitRequest","args":[1,]}`,
        `{"sha":"${sha}","hook":"buildSubmitRequest"} trailing`,
        `{"sha":"${sha}","hook":"build\\ud800"}`,
        `{"sha":1,"hook":"x"}`,
        `{"hook":"x"}`,
        `{"sha":"${sha}"}`,
        `[]`,
    ]) {
        const r = await raw(bad);
        assert.equal(r.error?.kind, 'bad_request', bad);
    }
    await c.close();
});

test('native functions are called with their object as this', async () => {
    const r = await client.call(sha, 'native.created', [{}, { task_id: 'tk' }]);
    assert.deepEqual(r, { ok: true, result: { id: 'tk', self: true } });
});

test('CALL of an unknown sha answers not_loaded', async () => {
    const r = await client.call('0'.repeat(64), 'buildSubmitRequest', [{}]);
    assert.equal(r.error.kind, 'not_loaded');
});

test('CALL of a hook the plugin does not export is the plugin\'s error', async () => {
    const r = await client.call(sha, 'buildBatchQueryRequest', [{}]);
    assert.equal(r.error.kind, 'plugin');
    assert.match(r.error.message, /does not export buildBatchQueryRequest/);
});

test('CALL with the source instead of the sha (dry run)', async () => {
    const r = await client.request(CALL, { source: TEST_PLUGIN, hook: 'buildQueryRequest',
                                           args: [{ taskId: 'abc' }] });
    assert.deepEqual(r, { ok: true, result: { url: 'https://example.com/q/abc' } });
    const bad = await client.request(CALL, { source: pluginWith('await 1'), hook: 'x', args: [] });
    assert.equal(bad.error.kind, 'plugin');
    assert.match(bad.error.message, /`await` is not allowed/);
});

test('a source loaded by one worker is callable on another (shared store)', async () => {
    // A looping call keeps one worker busy: the LOAD goes to the other, and
    // the next call to the first idle slot, the one that ran the loop and
    // has never seen the source.
    const busy = await helper.connect();
    const other = await helper.connect();
    const looping = busy.call(sha, 'buildSubmitRequest', [{ op: 'loop' }], { deadline_ms: 500 });
    await new Promise((r) => setTimeout(r, 50));

    const during = await other.status();
    const slot = during.workers.findIndex((w) => w.busy);
    assert.equal(during.workers[slot].plugin, sha);
    const fresh = pluginWith('// only loaded by the other worker');
    const loaded = await other.load(fresh);
    assert.equal(loaded.ok, true);

    assert.equal((await looping).error.kind, 'timeout');
    const calls = (await other.status()).workers[slot].calls;
    assert.deepEqual(await busy.call(loaded.sha, 'buildQueryRequest', []),
                     { ok: true, result: { url: 'https://example.com/q' } });
    assert.equal((await other.status()).workers[slot].calls, calls + 1,
                 'served by the worker that ran the loop');
    await Promise.all([busy.close(), other.close()]);
});

test('arguments are frozen snapshots: writing to them is a TypeError for the caller', async () => {
    const top = await op('mutate', { model: 'm' });
    assert.equal(top.error.kind, 'plugin');
    assert.match(top.error.message, /^TypeError: Cannot assign to read only property 'model'/);
    const deep = await op('mutateDeep', { body: { list: [1, 2, 3] } });
    assert.equal(deep.error.kind, 'plugin');
    assert.match(deep.error.message, /^TypeError: .*not extensible/);
});

test('results that are not JSON are refused, naming the hook and the place', async () => {
    assert.deepEqual((await op('returnFunction')).error,
                     { kind: 'plugin', message: 'buildSubmitRequest returned a function at .foo' });
    assert.deepEqual((await op('returnCycle')).error,
                     { kind: 'plugin', message: 'buildSubmitRequest returned a cycle at .b.c' });
    assert.deepEqual((await op('returnBigInt')).error,
                     { kind: 'plugin', message: 'buildSubmitRequest returned a BigInt at .n[0]' });
    assert.deepEqual((await op('returnUndefined')).error,
                     { kind: 'plugin', message: 'buildSubmitRequest returned undefined' });
    assert.deepEqual(await op('returnNull'), { ok: true, result: null });
});

test('no fetch, require, process, timers, WebAssembly, SharedArrayBuffer or Atomics', async () => {
    const r = await op('globals');
    assert.deepEqual(r.result, {
        fetch: 'undefined', require: 'undefined', process: 'undefined',
        setTimeout: 'undefined', setInterval: 'undefined', queueMicrotask: 'undefined',
        WebAssembly: 'undefined', SharedArrayBuffer: 'undefined', Atomics: 'undefined',
        utils: 'object',
    });
});

test('eval and the Function constructor refuse strings', async () => {
    for (const o of ['eval', 'newFunction', 'functionCtor']) {
        const r = await op(o);
        assert.equal(r.error.kind, 'plugin', o);
        assert.match(r.error.message, /^EvalError: Code generation from strings disallowed/, o);
    }
});

test('utils is read-only', async () => {
    const r = await op('writeUtils');
    assert.equal(r.error.kind, 'plugin');
    assert.match(r.error.message, /^TypeError: Cannot assign to read only property 'hmacSHA256'/);
});

test('a thrown message is cleaned of credentials and cut to 2 KiB', async () => {
    const secrets = {
        token: 'eyJhbGciOiJIUzI1NiJ9.abc.def',
        key: 'sk-proj-Ab3dEf6hIj9kLmN0pQrStUvWx',
        apiKey: 'short-but-named',
        aws: 'AKIAIOSFODNN7EXAMPLE',
    };
    const r = await op('throwSecret', secrets);
    assert.equal(r.error.kind, 'plugin');
    for (const s of Object.values(secrets)) {
        assert.ok(!r.error.message.includes(s), `${s} leaked: ${r.error.message}`);
    }
    assert.match(r.error.message, /^Error: upstream refused Bearer \[redacted\] with key \[redacted\]/);
    assert.match(r.error.message, /"api_key": "\[redacted\]"/);

    const long = await op('throwLong');
    assert.ok(Buffer.byteLength(long.error.message) <= 2048, String(long.error.message.length));
    assert.match(long.error.message, /^Error: x+\.\.\.$/);

    assert.match((await op('throwString')).error.message, /^plain string thrown/);
});

test('an endless loop is stopped at its deadline and the worker serves the next call', async () => {
    const t0 = Date.now();
    const r = await client.call(sha, 'buildSubmitRequest', [{ op: 'loop' }], { deadline_ms: 300 });
    const took = Date.now() - t0;
    assert.deepEqual(r.error, { kind: 'timeout',
                                message: 'buildSubmitRequest did not finish within 300 ms' });
    assert.ok(took >= 290 && took < 300 + 700, `took ${took} ms`);

    // deadline_ms is capped by --deadline-ms
    const t1 = Date.now();
    const capped = await client.call(sha, 'buildSubmitRequest', [{ op: 'loop' }],
                                     { deadline_ms: 60000 });
    assert.equal(capped.error.kind, 'timeout');
    assert.ok(Date.now() - t1 < DEADLINE_MS + 700);

    assert.equal((await op('echo', { body: 1 })).ok, true);
});

test('an allocation bomb is stopped at the heap cap and the next call succeeds', async () => {
    const r = await op('bomb');
    assert.deepEqual(r.error, { kind: 'memory',
                                message: 'buildSubmitRequest exceeded the heap limit of 32 MiB' });
    // The isolate was replaced; the plugin comes back from the shared store.
    assert.deepEqual(await op('echo', { body: 'after' }),
                     { ok: true, result: { url: 'https://example.com/submit', body: 'after' } });
});

// ---- utilities ----

test('hmacSHA256: RFC 4231 test case 2', async () => {
    assert.deepEqual(await util('hmacSHA256', 'Jefe', 'what do ya want for nothing?'),
                     { value: '5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843' });
});

test('base64, base64URL and base64URLDecode', async () => {
    assert.deepEqual(await util('base64', 'hello world'), { value: 'aGVsbG8gd29ybGQ=' });
    assert.deepEqual(await util('base64', 'ÿþ'), { value: 'w7/Dvg==' });
    assert.deepEqual(await util('base64URL', 'ÿþ'), { value: 'w7_Dvg' });
    assert.deepEqual(await util('base64URL', 'a'), { value: 'YQ' });
    assert.deepEqual(await util('base64URLDecode', 'w7_Dvg'), { value: 'ÿþ' });
    assert.deepEqual(await util('base64URLDecode', 'YQ=='), { value: 'a' });
    for (const bad of ['w7/Dvg', 'abc!', 'a', '_w']) {
        const r = await util('base64URLDecode', bad);
        assert.match(r.error ?? '', /^TypeError: utils\.base64URLDecode: /, bad);
    }
    assert.match((await util('base64', {})).error, /^TypeError: utils\.base64: /);
});

test('jwtSignHS256 matches the well-known HS256 example', async () => {
    const claims = { sub: '1234567890', name: 'John Doe', iat: 1516239022 };
    assert.deepEqual(await util('jwtSignHS256', claims, 'your-256-bit-secret'), {
        value: 'eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.'
             + 'eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.'
             + 'SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c',
    });
});

test('unixNow, uuid and hasCapability', async () => {
    const now = (await util('unixNow')).value;
    assert.ok(Number.isInteger(now) && Math.abs(now - Date.now() / 1000) < 3);
    const a = (await util('uuid')).value, b = (await util('uuid')).value;
    assert.match(a, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.notEqual(a, b);
    assert.deepEqual(await util('hasCapability', 'json-clone@1'), { value: true });
    assert.deepEqual(await util('hasCapability', 'submit-sse-delta@1'), { value: true });
    assert.deepEqual(await util('hasCapability', 'json-clone@2'), { value: false });
    assert.deepEqual(await util('hasCapability', 'json-clone'), { value: false });
});

// Volcengine V4, written again from the documented steps with Node's crypto.
function volcReference({ method, path, query, headers, body, accessKeyId,
                         secretAccessKey, region, service, date }) {
    const hmac = (k, d) => crypto.createHmac('sha256', k).update(d).digest();
    const hash = (d) => crypto.createHash('sha256').update(d).digest('hex');
    const enc = (s) => encodeURIComponent(s).replace(/[!'()*]/g,
        (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase());
    const bodyHash = hash(body);
    const pairs = [];
    for (const [k, v] of Object.entries(query)) {
        for (const one of [].concat(v)) pairs.push([enc(k), enc(String(one))]);
    }
    pairs.sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0));
    const lower = Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));
    const signed = [];
    if (lower['content-type'] !== undefined) signed.push(['content-type', lower['content-type']]);
    signed.push(['host', lower.host], ['x-content-sha256', bodyHash], ['x-date', date]);
    const canonical = [
        method, path.split('/').map(enc).join('/'),
        pairs.map(([k, v]) => `${k}=${v}`).join('&'),
        signed.map(([k, v]) => `${k}:${v.trim()}\n`).join(''),
        signed.map(([k]) => k).join(';'),
        bodyHash,
    ].join('\n');
    const short = date.slice(0, 8);
    const scope = `${short}/${region}/${service}/request`;
    const toSign = ['HMAC-SHA256', date, scope, hash(canonical)].join('\n');
    let key = hmac(secretAccessKey, short);
    key = hmac(key, region);
    key = hmac(key, service);
    key = hmac(key, 'request');
    return {
        Authorization: `HMAC-SHA256 Credential=${accessKeyId}/${scope}, `
                     + `SignedHeaders=${signed.map(([k]) => k).join(';')}, `
                     + `Signature=${hmac(key, toSign).toString('hex')}`,
        'X-Date': date,
        'X-Content-Sha256': bodyHash,
    };
}

test('volcSignV4 matches an independent implementation of the V4 steps', async () => {
    const req = {
        method: 'POST', path: '/api/v3/tasks',
        query: { Version: '2022-08-31', Action: 'CVSubmitTask', 'a b': ['z', 'x*'] },
        headers: { Host: 'visual.volcengineapi.com', 'Content-Type': 'application/json',
                   'X-Other': 'not signed' },
        body: '{"req_key":"jimeng","prompt":"a cat ☕"}',
        accessKeyId: 'AKLTexample', secretAccessKey: 'WkdJeE9HRXdaVGN6',
        region: 'cn-north-1', service: 'cv', date: '20250102T030405Z',
    };
    const expected = volcReference(req);
    assert.deepEqual(await util('volcSignV4', req), { value: expected });
    assert.match(expected.Authorization,
                 /^HMAC-SHA256 Credential=AKLTexample\/20250102\/cn-north-1\/cv\/request, SignedHeaders=content-type;host;x-content-sha256;x-date, Signature=[0-9a-f]{64}$/);

    // Without Content-Type it is not signed; the date defaults to now.
    const get = { ...req, method: 'GET', body: '', headers: { host: 'open.volcengineapi.com' } };
    delete get.date;
    const r = (await util('volcSignV4', get)).value;
    assert.match(r['X-Date'], /^\d{8}T\d{6}Z$/);
    assert.deepEqual(r, volcReference({ ...get, date: r['X-Date'] }));
    assert.match(r.Authorization, /SignedHeaders=host;x-content-sha256;x-date,/);

    assert.match((await util('volcSignV4', { ...req, headers: {} })).error,
                 /^TypeError: utils\.volcSignV4: headers\.Host is required/);
});

test('json.clone: limits of 32 levels, 32,768 nodes and 1 MiB', async () => {
    const clone = async (c) => (await op('clone', { case: c })).result;
    assert.equal((await clone('depth32')).ok, true);
    assert.match((await clone('depth33')).error, /^RangeError: utils\.json\.clone: .*32 levels/);
    assert.equal((await clone('nodes32768')).ok, true);
    assert.match((await clone('nodes32769')).error, /^RangeError: utils\.json\.clone: .*32768 nodes/);
    assert.deepEqual(await clone('bytesMax'), { ok: true, size: 1048576 });
    assert.match((await clone('bytesOver')).error, /^RangeError: utils\.json\.clone: .*1048576 bytes/);
});

test('json.clone: only JSON values, errors name the path', async () => {
    const clone = async (c) => (await op('clone', { case: c })).result.error;
    assert.equal(await clone('undefinedMember'), 'TypeError: utils.json.clone: undefined at .a.b is not JSON');
    assert.equal(await clone('fn'), 'TypeError: utils.json.clone: a function at .a[1] is not JSON');
    assert.equal(await clone('symbol'), 'TypeError: utils.json.clone: a symbol at .s is not JSON');
    assert.equal(await clone('bigint'), 'TypeError: utils.json.clone: a BigInt at .n is not JSON');
    assert.equal(await clone('date'), 'TypeError: utils.json.clone: a Date at .when is not JSON');
    assert.equal(await clone('map'), 'TypeError: utils.json.clone: a Map at .m is not JSON');
    assert.equal(await clone('sparse'), 'TypeError: utils.json.clone: a hole in a sparse array at .list[1] is not JSON');
    assert.equal(await clone('cycle'), 'TypeError: utils.json.clone: a cycle at .b.c.back is not JSON');
    assert.equal(await clone('nan'), 'TypeError: utils.json.clone: NaN at .x is not JSON');
    assert.equal(await clone('infinity'), 'TypeError: utils.json.clone: an infinite number at .x is not JSON');
    assert.equal(await clone('instance'), 'TypeError: utils.json.clone: a Point at .p is not JSON');
});

test('json.clone keeps __proto__ as an own key and copies frozen args into mutable values', async () => {
    assert.deepEqual((await op('cloneProto')).result, {
        keys: ['__proto__', 'a'], ownProto: true, plainPrototype: true, polluted: false,
        inner: { polluted: true },
    });
    assert.deepEqual((await op('cloneFrozenArgs', { body: { list: [1, 2, 3] } })).result, {
        copy: { list: [1, 2, 3, 4], extra: true },
        original: { list: [1, 2, 3] },
        sameObject: false,
    });
});

test('utils.json.clone only for a plugin that declares json-clone@1, however its source spells it', async () => {
    const present = { atLoad: 'object', json: 'object', clone: { a: [1] }, has: true };
    const absent = { atLoad: 'undefined', json: 'undefined', clone: null, has: true };
    for (const [caps, comment, want] of [
        [null, '', absent],
        [null, 'json-clone@1 named in a comment only', absent],
        ["['submit-sse-delta@1']", 'not json-clone@1', absent],
        ["['json-clone@1']", '', present],
        ["['json-clone@' + (0 + 1)]", 'built at run time', present],
    ]) {
        const r = await client.load(capabilityPlugin(caps, comment));
        assert.equal(r.ok, true, JSON.stringify(r));
        const c = await client.call(r.sha, 'buildSubmitRequest', [{}]);
        assert.equal(c.ok, true, JSON.stringify(c));
        assert.deepEqual(c.result, want, `${caps} / ${comment}`);
    }
});

// ---- STATUS and the supervisor ----

test('STATUS lists every worker with its counters', async () => {
    const s = await client.status();
    assert.equal(s.ok, true);
    assert.equal(s.workers.length, 2);
    for (const w of s.workers) {
        for (const k of ['pid', 'calls', 'errors', 'timeouts', 'memory', 'restarts', 'plugins']) {
            assert.equal(typeof w[k], 'number', k);
        }
        assert.equal(w.busy, false);
    }
    const sum = (k) => s.workers.reduce((n, w) => n + w[k], 0);
    assert.ok(sum('calls') > 0 && sum('timeouts') >= 1 && sum('memory') >= 1 && sum('plugins') >= 1,
              JSON.stringify(s.workers));
    assert.equal(s.pid, helper.proc.pid, 'answered by the supervisor');
    assert.equal(s.queued, 0);
    assert.ok(s.sources >= 1);
    assert.equal(typeof s.uptime_s, 'number');
});

test('kill -9 of a worker during a call: that call fails, the worker is restarted (throttled), new calls succeed', async () => {
    const victim = await helper.connect();
    const watcher = await helper.connect();
    const readyBefore = helper.readyCount();

    const pending = victim.call(sha, 'buildSubmitRequest', [{ op: 'loop' }]);
    await new Promise((r) => setTimeout(r, 150));
    const { workers } = await watcher.status();
    const slot = workers.findIndex((w) => w.busy);
    const { pid, restarts: restartsBefore } = workers[slot];
    process.kill(pid, 'SIGKILL');
    // killed from outside: the runtime's trouble, not the plugin's
    await assert.rejects(pending, /connection closed/);
    await watcher.close();

    await waitFor('the restarted worker', () => helper.readyCount() > readyBefore);
    const s = await waitFor('a new pid in the slot', async () => {
        const c = await helper.connect();
        const st = await c.status();
        await c.close();
        return st.workers[slot].pid !== pid && st.workers[slot].pid > 0 ? st : null;
    });
    assert.equal(s.workers[slot].restarts, restartsBefore + 1);
    assert.match(helper.log(), new RegExp(`worker ${slot} \\(pid ${pid}\\) killed by signal 9; restarting`));

    // A crash right after a restart waits for the throttle: one restart per
    // second per slot.
    const again = helper.readyCount();
    const t0 = Date.now();
    process.kill(s.workers[slot].pid, 'SIGKILL');
    await waitFor('the throttled restart', () => helper.readyCount() > again);
    assert.ok(Date.now() - t0 >= 500, `restarted after ${Date.now() - t0} ms`);
    assert.match(helper.log(), /restarting in under a second \(throttled\)/);

    // Every worker, the new one included, answers (the sha comes from the store).
    for (let i = 0; i < 6; i++) {
        const c = await helper.connect();
        const r = await c.call(sha, 'buildQueryRequest', [{ taskId: String(i) }]);
        assert.deepEqual(r, { ok: true, result: { url: `https://example.com/q/${i}` } });
        await c.close();
    }
});

// ---- isolation between calls and plugins ----

/* A plugin of its own key whose buildSubmitRequest(ctx) is `body`. */
const hookPlugin = (key, body) => `
export const meta = { apiVersion: 1, key: '${key}', name: 'Hook', version: '1.0.0',
  author: { name: 'tests' }, models: ['m'], fetchMode: 'per_task' };
export function buildSubmitRequest(ctx) { ${body} }
export function parseSubmitResponse() { return { taskId: '1' }; }
export function parseTaskResult() { return { status: 'SUCCESS' }; }
export function buildQueryRequest() { return { url: 'https://example.com/q' }; }
`;

/* A helper of one worker for a test of its own; stopped by the test. */
async function soloHelper(t, opts = {}) {
    const h = await startHelper({ workers: 1, deadlineMs: 500, heapMb: 32, ...opts });
    t.after(() => h.stop());
    return h;
}

test('microtasks a call leaves queued never run in the next call', async (t) => {
    const h = await soloHelper(t);
    const c = await h.connect();
    const loop = 'Promise.resolve().then(() => { for (;;) {} });';
    const victim = await c.load(hookPlugin('mt-victim', 'return { ok: 1 };'));
    const viaJson = await c.load(hookPlugin('mt-tojson',
        `return { toJSON() { ${loop} return 1; } };`));
    const viaThrow = await c.load(hookPlugin('mt-throw', `${loop} throw new Error('boom');`));
    for (const p of [victim, viaJson, viaThrow]) {
        assert.equal(p.ok, true, JSON.stringify(p));
    }

    // queued while the result was serialized: the call itself succeeded
    assert.deepEqual(await c.call(viaJson.sha, 'buildSubmitRequest', [{}]),
                     { ok: true, result: 1 });
    let t0 = Date.now();
    assert.deepEqual(await c.call(victim.sha, 'buildSubmitRequest', [{}]),
                     { ok: true, result: { ok: 1 } });
    assert.ok(Date.now() - t0 < 300, 'the other plugin ran no leftover loop');

    // queued by a hook that then threw
    const r = await c.call(viaThrow.sha, 'buildSubmitRequest', [{}]);
    assert.equal(r.error.kind, 'plugin');
    t0 = Date.now();
    assert.deepEqual(await c.call(victim.sha, 'buildSubmitRequest', [{}]),
                     { ok: true, result: { ok: 1 } });
    assert.ok(Date.now() - t0 < 300);
    assert.equal((await c.status()).workers[0].timeouts, 0);
    await c.close();
});

test('a builtin that ignores termination: the worker ends after deadline + 2 s, the call is a timeout', async (t) => {
    const h = await soloHelper(t);
    const c = await h.connect();
    const c2 = await h.connect();
    const p = await c.load(hookPlugin('stuck-builtin',
        'return Array.prototype.indexOf.call({ length: 2 ** 40 }, 1);'));
    assert.equal(p.ok, true, JSON.stringify(p));
    const q = await c2.load(hookPlugin('after-stuck', 'return 2;'));
    assert.equal(q.ok, true, JSON.stringify(q));
    const { workers: [{ pid }] } = await c2.status();
    const ready = h.readyCount();
    const t0 = Date.now();
    const stuck = c.call(p.sha, 'buildSubmitRequest', [{}]);
    await new Promise((r) => setTimeout(r, 100));
    // another plugin's call waits for the only worker, and is not failed
    // when that worker ends
    const queued = c2.call(q.sha, 'buildSubmitRequest', [{}]);
    const r = await stuck;
    const took = Date.now() - t0;
    assert.equal(r.ok, false);
    assert.equal(r.error.kind, 'timeout', JSON.stringify(r));
    assert.match(r.error.message, /ignored termination; its worker was replaced/);
    assert.ok(took >= 2400 && took < 6000, `the worker ended after ${took} ms`);
    assert.match(h.log(), /a call kept running 2000 ms after its deadline despite termination; worker exits/);
    assert.match(h.log(), /worker 0 ended during a call of plugin [0-9a-f]{16}: timeout/);
    assert.deepEqual(await queued, { ok: true, result: 2 });
    await waitFor('the restarted worker', () => h.readyCount() > ready);
    const st = await c2.status();
    assert.notEqual(st.workers[0].pid, pid);
    assert.equal(st.workers[0].restarts, 1);
    const again = await c.call(p.sha, 'buildQueryRequest', [{}]);
    assert.deepEqual(again, { ok: true, result: { url: 'https://example.com/q' } });
    await Promise.all([c.close(), c2.close()]);
});

test('a worker that crashes during a call: the call is the plugin\'s error, other connections stay', async (t) => {
    const h = await soloHelper(t, { deadlineMs: 3000 });
    const [c, watcher] = [await h.connect(), await h.connect()];
    const p = await c.load(hookPlugin('crasher', 'if (ctx.loop) for (;;) {} return 3;'));
    assert.equal(p.ok, true, JSON.stringify(p));
    const pending = c.call(p.sha, 'buildSubmitRequest', [{ loop: 1 }]);
    await new Promise((r) => setTimeout(r, 150));
    const { workers: [w] } = await watcher.status();
    assert.equal(w.busy, true);
    process.kill(w.pid, 'SIGSEGV');
    const r = await pending;
    assert.deepEqual(r.error, { kind: 'plugin',
        message: 'the hook crashed its worker (signal 11); the worker was replaced' });
    // the same connections go on, served by the new worker
    assert.deepEqual(await c.call(p.sha, 'buildSubmitRequest', [{}]), { ok: true, result: 3 });
    assert.notEqual((await watcher.status()).workers[0].pid, w.pid);
    await Promise.all([c.close(), watcher.close()]);
});

test('a worker stopped during a call is killed some seconds past the deadline and replaced', { timeout: 30000 }, async (t) => {
    const h = await soloHelper(t, { deadlineMs: 300 });
    const [c, watcher] = [await h.connect(), await h.connect()];
    const p = await c.load(hookPlugin('stopped', 'if (ctx.loop) for (;;) {} return 4;'));
    assert.equal(p.ok, true, JSON.stringify(p));
    const pending = c.call(p.sha, 'buildSubmitRequest', [{ loop: 1 }]).catch((e) => e);
    await new Promise((r) => setTimeout(r, 100));
    const { workers: [w] } = await watcher.status();
    assert.equal(w.busy, true);
    /* its own watchdog cannot run: the supervisor ends it */
    process.kill(w.pid, 'SIGSTOP');
    const t0 = Date.now();
    await pending;
    const ms = Date.now() - t0;
    assert.ok(ms > 3000 && ms < 15000, `reclaimed after ${ms} ms`);
    const c2 = await h.connect();
    assert.deepEqual(await c2.call(p.sha, 'buildSubmitRequest', [{}]), { ok: true, result: 4 });
    assert.notEqual((await watcher.status()).workers[0].pid, w.pid);
    await Promise.all([c2.close(), watcher.close()]);
});

test('SIGHUP to a worker (a terminal hanging up its process group) is ignored', async (t) => {
    const h = await soloHelper(t);
    const c = await h.connect();
    const p = await c.load(hookPlugin('hangup', 'return 5;'));
    assert.equal(p.ok, true, JSON.stringify(p));
    const { workers: [w] } = await c.status();
    process.kill(w.pid, 'SIGHUP');
    await new Promise((r) => setTimeout(r, 200));
    assert.deepEqual(await c.call(p.sha, 'buildSubmitRequest', [{}]), { ok: true, result: 5 });
    const after = (await c.status()).workers[0];
    assert.equal(after.pid, w.pid, 'the same worker');
    assert.equal(after.restarts, 0);
    await c.close();
});

test('a call whose client hung up before it was served is not run', async (t) => {
    const h = await soloHelper(t);
    const [c1, c2, c3] = [await h.connect(), await h.connect(), await h.connect()];
    const p = await c1.load(hookPlugin('hung-up', 'if (ctx.loop) for (;;) {} return 1;'));
    assert.equal(p.ok, true, JSON.stringify(p));
    await c2.status();
    await c3.status();
    // c1 keeps the worker busy; c2's call arrives and c2 closes meanwhile
    // (c1's call is given time to reach the worker first: sent together,
    // the runtime may read c2's first, and then that one is running)
    const busy = c1.call(p.sha, 'buildSubmitRequest', [{ loop: 1 }]);
    await new Promise((r) => setTimeout(r, 150));
    c2.sock.write(frame(CALL, 7, { sha: p.sha, hook: 'buildSubmitRequest', args: [{ loop: 1 }] }));
    c2.sock.destroy();
    await new Promise((r) => setTimeout(r, 100));
    assert.deepEqual(await c3.call(p.sha, 'buildSubmitRequest', [{}]), { ok: true, result: 1 });
    assert.equal((await busy).error.kind, 'timeout');
    assert.equal((await c3.status()).workers[0].timeouts, 1, 'only the first loop ran');
    await c1.close();
    await c3.close();
});

// ---- sharing the workers between plugins ----

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* Resolves with [reply, ms since t0]. */
const timed = async (t0, pending) => {
    const r = await pending;
    return [r, Date.now() - t0];
};

test('a plugin whose hooks all run into the deadline holds up only its own calls', async (t) => {
    const h = await startHelper({ workers: 2, deadlineMs: 3000, heapMb: 32 });
    t.after(() => h.stop());
    const c = await h.connect();
    const bad = await c.load(hookPlugin('fair-bad', 'for (;;) {}'));
    const good = await c.load(hookPlugin('fair-good', 'return ctx.n;'));
    assert.equal(bad.ok && good.ok, true);

    // two looping calls, each on a connection of its own (as nginx sends
    // them): without a limit they would take both workers
    const [b1, b2] = [await h.connect(), await h.connect()];
    const t0 = Date.now();
    const loops = [timed(t0, b1.call(bad.sha, 'buildSubmitRequest', [{}]))];
    await sleep(100);
    loops.push(timed(t0, b2.call(bad.sha, 'buildSubmitRequest', [{}])));
    await sleep(100);

    // meanwhile another plugin's calls are answered at once, on new
    // connections and on an old one
    for (let i = 0; i < 5; i++) {
        const g = await h.connect();
        const t1 = Date.now();
        assert.deepEqual(await g.call(good.sha, 'buildSubmitRequest', [{ n: i }]),
                         { ok: true, result: i });
        assert.ok(Date.now() - t1 < 1000, `call ${i} took ${Date.now() - t1} ms`);
        await g.close();
    }
    assert.deepEqual(await c.call(good.sha, 'buildSubmitRequest', [{ n: 9 }]), { ok: true, result: 9 });
    const st = await c.status();
    assert.ok(Date.now() - t0 < 1500, `answered ${Date.now() - t0} ms after the loops began`);
    assert.deepEqual(st.workers.filter((w) => w.busy).map((w) => w.plugin), [bad.sha]);
    assert.equal(st.queued, 1, 'the second loop waits for the first');

    // the looping calls ran one after the other, each to its deadline
    const [[r1, ms1], [r2, ms2]] = await Promise.all(loops);
    assert.equal(r1.error.kind, 'timeout');
    assert.equal(r2.error.kind, 'timeout');
    assert.ok(ms1 >= 2900 && ms1 < 4500, `first loop ended after ${ms1} ms`);
    assert.ok(ms2 >= 5900, `second loop ended after ${ms2} ms`);
    await Promise.all([c.close(), b1.close(), b2.close()]);
});

test('plugins take turns for a worker; a plugin\'s own calls go oldest first', async (t) => {
    const h = await soloHelper(t);
    const c = await h.connect();
    const a = await c.load(hookPlugin('turn-a', 'for (;;) {}'));
    const b = await c.load(hookPlugin('turn-b', 'return "b";'));
    const conns = await Promise.all([0, 1, 2, 3].map(() => h.connect()));
    const t0 = Date.now();
    const done = [];
    const send = (i, sha, label) => conns[i].call(sha, 'buildSubmitRequest', [{}])
        .then((r) => done.push([label, r.ok ? r.result : r.error.kind, Date.now() - t0]));

    // a1 runs; a2 and a3 wait; then b1 arrives
    const all = [send(0, a.sha, 'a1')];
    await sleep(50);
    all.push(send(1, a.sha, 'a2'));
    await sleep(20);
    all.push(send(2, a.sha, 'a3'));
    await sleep(20);
    all.push(send(3, b.sha, 'b1'));
    await Promise.all(all);

    assert.deepEqual(done.map(([label, what]) => [label, what]),
                     [['a1', 'timeout'], ['a2', 'timeout'], ['b1', 'b'], ['a3', 'timeout']]);
    const b1 = done.find(([label]) => label === 'b1')[2];
    assert.ok(b1 < 1400, `b1 answered after ${b1} ms: it waited for one call of a, not two`);
    await Promise.all([c, ...conns].map((x) => x.close()));
});

test('--plugin-workers lets one plugin take more workers', async (t) => {
    const h = await startHelper({ workers: 2, deadlineMs: 500, heapMb: 32,
                                  extra: ['--plugin-workers', '2'] });
    t.after(() => h.stop());
    const c = await h.connect();
    const p = await c.load(hookPlugin('both-workers', 'for (;;) {}'));
    const conns = [await h.connect(), await h.connect()];
    const t0 = Date.now();
    const rs = await Promise.all(conns.map((x) => timed(t0, x.call(p.sha, 'buildSubmitRequest', [{}]))));
    for (const [r, ms] of rs) {
        assert.equal(r.error.kind, 'timeout');
        assert.ok(ms < 950, `both loops ran at once: ended after ${ms} ms`);
    }
    assert.match(h.log(), /listening on .* with 2 worker\(s\), at most 2 per plugin/);
    await Promise.all([c, ...conns].map((x) => x.close()));
});

test('volcSignV4: a value nested in an array, or more than 1000 values, is refused', async (t) => {
    const h = await soloHelper(t);
    const c = await h.connect();
    const p = await c.load(hookPlugin('volc-nested', `
        return utils.volcSignV4({ method: 'GET', accessKeyId: 'a', secretAccessKey: 'b',
            region: 'r', service: 's', headers: { Host: 'h' }, query: { a: ctx.v } });`));
    assert.equal(p.ok, true, JSON.stringify(p));
    const nested = await c.call(p.sha, 'buildSubmitRequest', [{ v: ['x', ['y']] }]);
    assert.match(nested.error.message, /query\.a must be a string or an array of strings/);
    const many = await c.call(p.sha, 'buildSubmitRequest', [{ v: Array(1001).fill('x') }]);
    assert.match(many.error.message, /query\.a has more than 1000 values/);
    const ok = await c.call(p.sha, 'buildSubmitRequest', [{ v: ['x', 'y'] }]);
    assert.equal(ok.ok, true, JSON.stringify(ok));
    await c.close();
});

test('a plugin that keeps memory in its globals does not starve the others', async (t) => {
    // about memory, not time: compiling the hog again (20 MiB at its top
    // level, near the heap limit) may take longer than 500 ms on a busy
    // machine
    const h = await soloHelper(t, { deadlineMs: 5000 });
    const c = await h.connect();
    // keeps 20 MiB of the 32 in its globals (its module's top level
    // allocates them, so a worker compiling it on demand keeps them too)
    const hog = await c.load(`const keep = [];
for (let i = 0; i < 20; i++) keep.push(new Array(1 << 17).fill(i));
${hookPlugin('heap-hog', 'return keep.length;')}`);
    assert.equal(hog.ok, true, JSON.stringify(hog));
    // alone, it is served, call after call
    for (let i = 0; i < 3; i++) {
        assert.deepEqual(await c.call(hog.sha, 'buildSubmitRequest', [{}]),
                         { ok: true, result: 20 });
    }
    assert.doesNotMatch(h.log(), /isolate replaced/);

    const other = await c.load(hookPlugin('heap-other',
        'const a = []; for (let i = 0; i < 12; i++) a.push(new Array(1 << 17).fill(i)); return a.length;'));
    assert.equal(other.ok, true, JSON.stringify(other));

    assert.deepEqual(await c.call(hog.sha, 'buildSubmitRequest', [{}]), { ok: true, result: 20 });
    assert.deepEqual(await c.call(other.sha, 'buildSubmitRequest', [{}]), { ok: true, result: 12 });
    assert.match(h.log(), /isolate replaced after plugins kept more than half of the heap limit of 32 MiB/);
    // the hog is compiled again on demand, and served
    assert.deepEqual(await c.call(hog.sha, 'buildSubmitRequest', [{}]), { ok: true, result: 20 });
    await c.close();
});

test('a call that compiles its plugin first has one deadline for both', async (t) => {
    const h = await soloHelper(t, { deadlineMs: 1000 });
    const c = await h.connect();
    // a module whose top level takes 600 ms, and a hook that never ends
    const source = `const until = Date.now() + 600; while (Date.now() < until) {}
${hookPlugin('slow-compile', 'for (;;) {}')}`;
    const t0 = Date.now();
    const r = await c.request(CALL, { source, hook: 'buildSubmitRequest', args: [{}] });
    const took = Date.now() - t0;
    assert.equal(r.error.kind, 'timeout', JSON.stringify(r));
    assert.ok(took < 1000 + 450, `the frame took ${took} ms, its deadline is 1000 ms`);
    await c.close();
});

test('a key cut by the 8 KiB limit on raw messages is not shown in part', async (t) => {
    const h = await soloHelper(t);
    const c = await h.connect();
    // "Error: " + 8,176 bytes whose secret field shrinks to [redacted], then
    // a key that the 8 KiB cut leaves 9 characters of
    const p = await c.load(hookPlugin('cut-key',
        'throw new Error(\'{"password":"\' + "p".repeat(8160) + \'"} sk-\' + "a1".repeat(30));'));
    assert.equal(p.ok, true, JSON.stringify(p));
    const r = await c.call(p.sha, 'buildSubmitRequest', [{}]);
    assert.equal(r.error.kind, 'plugin');
    assert.match(r.error.message, /"password":"\[redacted\]"/);
    assert.ok(!r.error.message.includes('sk-a1'), r.error.message);

    // 40 characters left of a key whose digits all come after the cut
    const q = await c.load(hookPlugin('cut-key-2',
        'throw new Error(\'{"password":"\' + "p".repeat(8129) + \'"} \' + "abcdefghij".repeat(4) + "0123456789".repeat(3));'));
    const r2 = await c.call(q.sha, 'buildSubmitRequest', [{}]);
    assert.ok(!r2.error.message.includes('abcdefghij'), r2.error.message);
    assert.match(r2.error.message, /\[redacted\]$/);
    await c.close();
});

test('--max-memory-mb bounds a worker: a call needing more fails, the next is served', async (t) => {
    const h = await soloHelper(t, { heapMb: 64, extra: ['--max-memory-mb', '160'] });
    const c = await h.connect();
    const p = await c.load(hookPlugin('mem-bound', "return { s: 'x'.repeat(ctx.n) };"));
    assert.equal(p.ok, true, JSON.stringify(p));
    assert.equal((await c.call(p.sha, 'buildSubmitRequest', [{ n: 1 << 20 }])).ok, true);
    const ready = h.readyCount();
    // 48 MiB of string, then its JSON: more than 160 MiB in all
    const big = await c.call(p.sha, 'buildSubmitRequest', [{ n: 48 << 20 }])
        .then((r) => r.error && r.error.kind, (e) => e.message);
    assert.ok(big === 'memory' || big === 'connection closed', String(big));
    if (big === 'connection closed') {
        await waitFor('the restarted worker', () => h.readyCount() > ready);
    }
    const c2 = await h.connect();
    assert.deepEqual(await c2.call(p.sha, 'buildQueryRequest', [{}]),
                     { ok: true, result: { url: 'https://example.com/q' } });
    await c2.close();
});
