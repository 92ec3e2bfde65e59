// The host protocols end to end, through the real nginx, PostgreSQL and the
// plugin runtime, against the mock vendor of t/lib/vendor.mjs and the plugin
// fixtures/plugins/task-protocols.js:
//   - host_video: POST /v1/videos submits through the plugin whose channel
//     is tried first, GET /v1/videos/{id} renders the task; the host sets
//     id, object, model, status, progress, created_at and completed_at over
//     what render returns and removes a legacy task_id; a render that fails
//     still answers the host's own object; ownership, billing and refunds
//     as for any task; the marketplace spelling openai_video;
//   - host_image: a synchronous upstream (an immediate terminal result) is
//     answered inline and not retained, a failed one is 400 with its reason;
//     the host adds `created`; response_format b64_json downloads the
//     URLs (without credentials) and adds their base64, but off the
//     channel's origin reaches no loopback address (no
//     llmgw_content_allow_private here); an asynchronous one is polled inside the
//     request until it ends (results retained), and past
//     llmgw_task_wait_timeout the answer is 504 task_timeout while the task
//     goes on and is settled by the background pollers.
//
// Gateways poll every 200 ms.

import assert from 'node:assert/strict';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';

import { assertError, assertOk, psql, uniq } from '../lib/harness.mjs';
import { startMock } from '../lib/mock.mjs';
import {
    account, expectUsed, pluginSource, pollFailures, taskSetup, uploadPlugin,
    vendorSuite, waitFor, waitLedger,
} from '../lib/vendor.mjs';

const POLL_MS = 200;
const HTTP = `llmgw_task_poll_interval ${POLL_MS}ms;\n  llmgw_task_poll_max_failures 3;`;
const PER_TASK = 5000;      /* 0.01 USD */
const FIXTURE = 'task-protocols.js';

const now = () => Math.floor(Date.now() / 1000);

/* POST path with body: 504 task_timeout ("within <secs> s") in less than
   3 s */
async function timesOutOnTime(gw, key, path, body, secs) {
    const t0 = Date.now();
    const r = await gw.req('POST', path, { key, body, timeoutMs: 30000 });
    const took = Date.now() - t0;
    assertError(r, 504, { code: 'task_timeout', message: new RegExp(`did not finish within ${secs} s`) });
    assert.ok(took < 3000, `answered after ${took} ms`);
    return r;
}

/* vendor.onSubmit: a submit whose input has `sync` is answered at once
   with it as the immediate result; the others as usual */
const syncSubmit = (rec) => (rec.json.input.sync ? {
    status: 200, body: { id: `sync-${rec.n}`, immediate: rec.json.input.sync },
} : undefined);

/* A gateway with the fixture bound to one vendor: {db, gw, vendor, env}. */
function protocolSuite(http) {
    const s = vendorSuite({ http });
    before(async () => {
        s.env = await taskSetup(s.gw, { fixture: FIXTURE, vendors: [s.vendor], models: 1 });
    });
    return s;
}

describe('host protocols', { timeout: 180000 }, () => {
    const s = protocolSuite(HTTP);
    let db, gw, vendor, env;

    before(() => ({ db, gw, vendor, env } = s));

    const video = (body, { key = env.acct.key, headers } = {}) =>
        gw.req('POST', '/v1/videos', { key, body, headers });
    const getVideo = (id, { key = env.acct.key, query = '' } = {}) =>
        gw.req('GET', `/v1/videos/${encodeURIComponent(id)}${query}`, { key });
    const image = (body, op = 'generations', { key = env.acct.key, headers } = {}) =>
        gw.req('POST', `/v1/images/${op}`, { key, body, headers });

    function assertVideo(o, { status, progress, model = env.model }) {
        assert.match(o.id, /^task_/, JSON.stringify(o));
        assert.equal(o.object, 'video');
        assert.equal(o.model, model);
        assert.equal(o.status, status, JSON.stringify(o));
        assert.equal(o.progress, progress);
        assert.ok(Number.isInteger(o.created_at) && Math.abs(o.created_at - now()) < 120,
            `created_at ${o.created_at}`);
        if (status === 'completed' || status === 'failed') {
            assert.ok(Number.isInteger(o.completed_at) && o.completed_at >= o.created_at,
                `completed_at ${o.completed_at}`);
        } else {
            assert.equal(o.completed_at, null);
        }
        assert.equal('task_id' in o, false, 'the legacy task_id is removed');
    }

    test('POST /v1/videos submits through the plugin, and the host sets the standard members', async () => {
        const acct = await account(gw);
        const up = uniq('up-video');
        const r = assertOk(await video({ model: env.model, prompt: 'a cat', up_id: up },
            { key: acct.key }), 'POST /v1/videos');
        assertVideo(r.json, { status: 'queued', progress: 0 });
        /* the plugin's own members stay */
        assert.equal(r.json.size, '1280x720');
        assert.deepEqual(r.json.seen, {
            protocol: 'host_video', operation: 'generate', model: env.model, stream: false,
            params: {}, kind: 'json',
        });

        const sub = vendor.submits().find((s) => s.json.up_id === up);
        assert.ok(sub, 'the vendor got the submit');
        assert.equal(sub.json.action, 'video.generate');
        /* the host routes by the request's model, whatever the decoder says */
        assert.equal(sub.json.model, env.model);
        assert.equal(sub.json.input.prompt, 'a cat');
        assert.equal(sub.json.input.seen.operation, 'generate');

        /* a task like any other: reserved, polled, settled */
        const led = await waitLedger(db, r.json.id, ['reserve']);
        assert.equal(led.reserve, PER_TASK);
        const g = assertOk(await getVideo(r.json.id, { key: acct.key }), 'GET');
        assert.equal(g.json.id, r.json.id);
        assert.equal(g.json.seen.operation, 'retrieve');
        assert.deepEqual(g.json.seen.params, { video_id: r.json.id });

        vendor.setPoll(up, { body: { status: 'running', progress: '40%' } });
        await waitFor(async () => (await getVideo(r.json.id, { key: acct.key })).json.status
            === 'in_progress', 8000, { what: 'in_progress' });
        const mid = (await getVideo(r.json.id, { key: acct.key })).json;
        assertVideo(mid, { status: 'in_progress', progress: 40 });

        vendor.setPoll(up, { body: { status: 'done', data: { url: 'https://cdn.example/v.mp4' } } });
        await waitFor(async () => (await getVideo(r.json.id, { key: acct.key })).json.status
            === 'completed', 8000, { what: 'completed' });
        const done = (await getVideo(r.json.id, { key: acct.key })).json;
        assertVideo(done, { status: 'completed', progress: 100 });
        assert.equal(done.url, 'https://cdn.example/v.mp4');
        assert.equal(done.task_status, 'SUCCESS');
        await expectUsed(gw, db, acct, PER_TASK);
    });

    test('a failed video is refunded and says why', async () => {
        const acct = await account(gw);
        const up = uniq('up-vfail');
        const r = assertOk(await video({ model: env.model, up_id: up }, { key: acct.key }));
        vendor.setPoll(up, { body: { status: 'failed', error: 'content policy' } });
        await waitFor(async () => (await getVideo(r.json.id, { key: acct.key })).json.status
            === 'failed', 8000, { what: 'failed' });
        const v = (await getVideo(r.json.id, { key: acct.key })).json;
        assertVideo(v, { status: 'failed', progress: 0 });
        assert.deepEqual(v.error, { code: 'task_failed', message: 'content policy' });
        /* a render's error: null says nothing: the host's stands */
        const vn = (await getVideo(r.json.id, { key: acct.key, query: '?nullerror=1' })).json;
        assert.deepEqual(vn.error, { code: 'task_failed', message: 'content policy' });
        const led = await waitLedger(db, r.json.id, ['reserve', 'refund']);
        assert.equal(led.refund, led.reserve);
        await expectUsed(gw, db, acct, 0);
    });

    test('a render that fails still answers the host\'s object; another user\'s video is 404', async () => {
        const r = assertOk(await video({ model: env.model, up_id: uniq('up-v') }));
        const g = assertOk(await getVideo(r.json.id, { query: '?boom=1' }));
        assertVideo(g.json, { status: 'queued', progress: 0 });
        assert.equal(g.json.size, undefined, 'nothing of the failed render');

        const other = await account(gw);
        assertError(await getVideo(r.json.id, { key: other.key }), 404, { code: 'task_not_found' });
        assertError(await getVideo('task_nonesuch'), 404, { code: 'task_not_found' });
    });

    test('multipart bodies, and the refusals of the contract', async () => {
        const up = uniq('up-vmp');
        const boundary = 'b0undary';
        const mp = [`--${boundary}`, 'Content-Disposition: form-data; name="model"', '', env.model,
            `--${boundary}`, 'Content-Disposition: form-data; name="up_id"', '', up,
            `--${boundary}`, 'Content-Disposition: form-data; name="input_reference"; filename="a.png"',
            'Content-Type: image/png', '', 'PNGDATA', `--${boundary}--`, ''].join('\r\n');
        const r = assertOk(await video(mp, {
            headers: { 'Content-Type': `multipart/form-data; boundary=${boundary}` } }), 'multipart');
        assert.equal(r.json.seen.kind, 'multipart');
        const sub = vendor.submits().find((s) => s.json.up_id === up);
        assert.equal(sub.json.files.length, 1);
        assert.equal(sub.json.files[0].filename, 'a.png');

        assertError(await video({ prompt: 'no model' }), 400, { code: 'model_not_specified' });
        assertError(await video({ model: 7 }), 400, { code: 'invalid_request', message: 'model must be a string' });
        assertError(await video({ model: 'nobody-serves-this' }), 503, { code: 'model_not_found' });
        assertError(await video({ model: env.model }, { key: 'sk-wrong' }), 401);
        assertError(await video('{"model": ', { headers: { 'Content-Type': 'application/json' } }),
            400, { code: 'invalid_json' });
        assertError(await gw.req('GET', '/v1/videos', { key: env.acct.key }), 405);
        assertError(await gw.req('DELETE', `/v1/videos/${r.json.id}`, { key: env.acct.key }), 405);
        assertError(await video({ model: env.model, decode: 'throw' }), 500,
            { code: 'plugin_error', message: /the request cannot be decoded/ });
        assertError(await video({ model: env.model, decode: 'query' }), 500,
            { code: 'plugin_error', message: /no submit intent/ });
    });

    test('a task of a plugin that does not claim host_video is not a video', async () => {
        const other = await taskSetup(gw, { vendors: [vendor], models: 1 });
        const r = assertOk(await gw.req('POST', `/v1/tasks/${other.key}`,
            { key: other.acct.key, body: { model: other.model, up_id: uniq('up-t') } }));
        assertError(await getVideo(r.json.task_id, { key: other.acct.key }), 404,
            { code: 'task_not_found' });
        /* nor is its model served at /v1/videos: its channels cannot take it */
        assertError(await video({ model: other.model }, { key: other.acct.key }), 500,
            { code: 'convert_request_failed' });
    });

    test('a protocol reads only the tasks created through it; /v1/tasks reads them all', async () => {
        const acct = await account(gw);
        const get = (path) => gw.req('GET', path, { key: acct.key });
        const v = assertOk(await video({ model: env.model, up_id: uniq('up-xv') }, { key: acct.key }));
        const b = assertOk(await gw.req('POST', '/v1/responses', { key: acct.key,
            body: { model: env.model, input: 'hi', background: true, up_id: uniq('up-xr') } }));
        assert.equal(b.json.background, true);
        const t = assertOk(await gw.req('POST', `/v1/tasks/${env.key}`,
            { key: acct.key, body: { model: env.model, up_id: uniq('up-xt') } }));

        /* each through its own protocol */
        assertOk(await getVideo(v.json.id, { key: acct.key }));
        assertOk(await get(`/v1/responses/${b.json.id}`));
        /* the plugin claims both protocols for the model, yet neither reads
           the other's task, nor one made through its task route */
        for (const [path, what] of [[`/v1/responses/${v.json.id}`, 'a video as a Response'],
            [`/v1/videos/${b.json.id}`, 'a Response as a video'],
            [`/v1/videos/${b.json.id}/content`, 'a Response\'s video content'],
            [`/v1/videos/${t.json.task_id}`, 'a task route\'s task as a video'],
            [`/v1/responses/${t.json.task_id}`, 'a task route\'s task as a Response']]) {
            assert.equal((await get(path)).status, 404, what);
            assertError(await get(path), 404, { code: 'task_not_found' });
        }
        /* the generic view reads every task of the caller */
        for (const id of [v.json.id, b.json.id, t.json.task_id]) {
            assert.equal(assertOk(await get(`/v1/tasks/${id}`)).json.task_id, id);
        }
    });

    test('a form body for a create that takes JSON (or multipart), and a decoder\'s non-string action, are refused before anything is charged', async () => {
        const acct = await account(gw);
        const up = uniq('up-form');
        const form = { 'Content-Type': 'application/x-www-form-urlencoded' };
        const body = `model=${encodeURIComponent(env.model)}&prompt=x&up_id=${up}`;
        assertError(await image(body, 'edits', { key: acct.key, headers: form }), 400,
            { code: 'invalid_request', message: /POST \/v1\/images\/edits takes a JSON or multipart\/form-data body/ });
        assertError(await image(body, 'generations', { key: acct.key, headers: form }), 400,
            { code: 'invalid_request', message: /POST \/v1\/images\/generations takes a JSON body/ });
        assertError(await gw.req('POST', '/v1/responses', { key: acct.key, body, headers: form }), 400,
            { code: 'invalid_request', message: /POST \/v1\/responses takes a JSON body/ });
        assertError(await video(body, { key: acct.key, headers: form }), 400,
            { code: 'invalid_request', message: /POST \/v1\/videos takes a JSON or multipart\/form-data body/ });
        assertError(await gw.req('POST', '/v1/responses', { key: acct.key, body: 'hello',
            headers: { 'Content-Type': 'text/plain' } }), 400, { code: 'invalid_request' });
        assertError(await video({ model: env.model, up_id: up, decode: 'action' }, { key: acct.key }), 500,
            { code: 'plugin_error', message: /returned an action that is not a string/ });

        assert.equal(vendor.submits().filter((s) => s.json.up_id === up).length, 0,
            'nothing reached the vendor');
        await expectUsed(gw, db, acct, 0);
        const rows = await psql(db.conninfo, `select count(*) from tasks where user_id = ${acct.user.id}`);
        assert.equal(rows.trim(), '0', 'no task was created');
    });

    test('the marketplace spelling openai_video serves as host_video', async () => {
        const key = `mk${Date.now().toString(36).slice(-6)}`;
        const model = `${key}-m`;
        await uploadPlugin(gw, pluginSource(FIXTURE, { key, models: [model] })
            .replace("const VIDEO = 'host_video';", "const VIDEO = 'openai_video';")
            .replace("const IMAGE = 'host_image';", "const IMAGE = 'openai_image';"));
        assertOk(await gw.admin('PUT', '/api/pricing', { [model]: { price: 0.01 } }));
        assertOk(await gw.admin('POST', '/api/channel', {
            name: `${key}-ch`, type: 61, base_url: vendor.url, key: 'vk-x', models: [model],
            groups: ['default'], settings: { task_plugin_key: key } }));
        await waitFor(async () => (await video({ model, up_id: uniq('up-mk') })).status === 200,
            5000, { what: 'the aliased plugin serves' });
        const r = assertOk(await video({ model, up_id: uniq('up-mk') }));
        assert.equal(r.json.seen.protocol, 'host_video');
        assert.equal(r.json.model, model);
        /* and openai_image as host_image */
        vendor.onSubmit = (rec) => ({ status: 200, body: { id: `mk-${rec.n}`,
            immediate: { status: 'SUCCESS', data: { images: ['https://cdn.example/mk.png'] } } } });
        try {
            const i = assertOk(await image({ model }), 'openai_image');
            assert.equal(i.json.data[0].url, 'https://cdn.example/mk.png');
        } finally {
            vendor.onSubmit = null;
        }
    });

    test('image edits: file field names keep every file its own reference; a Content-Type the endpoint does not take names what it takes', async () => {
        const acct = await account(gw);
        const up = uniq('up-refs');
        const B = 'bNd';
        const part = (head, data) => Buffer.concat([Buffer.from(`--${B}\r\n`), Buffer.from(head),
            Buffer.from('\r\n\r\n'), Buffer.from(data), Buffer.from('\r\n')]);
        const field = (n, v) => part(`Content-Disposition: form-data; name="${n}"`, v);
        const file = (n, d) => part(`Content-Disposition: form-data; name="${n}"; filename="x.png"`, d);
        const mp = (...parts) => Buffer.concat([field('model', env.model), field('up_id', up), ...parts,
            Buffer.from(`--${B}--\r\n`)]);
        const headers = { 'Content-Type': `multipart/form-data; boundary=${B}` };

        /* "a#1" would be the reference of the second file of "a" */
        const hash = await image(mp(file('a#1', 'HASH'), file('a', 'A0'), file('a', 'A1')), 'edits',
            { key: acct.key, headers });
        assertError(hash, 400, { code: 'invalid_request', message: /multipart part 3: a file's field name may not hold "#"/ });
        /* a name that is not UTF-8 would reach the plugin as another text */
        const latin1 = await image(mp(Buffer.concat([Buffer.from('--bNd\r\nContent-Disposition: form-data; name="img'),
            Buffer.from([0xe9]), Buffer.from('"; filename="x.png"\r\n\r\nX\r\n')])), 'edits', { key: acct.key, headers });
        const e = assertError(latin1, 400, { code: 'invalid_request',
            message: /multipart part 3: a file's field name is not valid UTF-8/ });
        assert.ok(!/img/.test(e.message) && !e.message.includes('\ufffd'), e.message);
        assert.equal(vendor.submits().filter((x) => x.json.up_id === up).length, 0, 'nothing was sent');
        await expectUsed(gw, db, acct, 0);

        /* repeated fields still number their files; a text field may hold
           "#" (it has no reference) */
        vendor.onSubmit = (rec) => ({ status: 200, body: { id: `refs-${rec.n}`,
            immediate: { status: 'SUCCESS', data: { images: [] } } } });
        try {
            assertOk(await image(mp(field('note#1', 'text'), file('a', 'A0'), file('a', 'A1'), file('b', 'B0')),
                'edits', { key: acct.key, headers }), 'numbered refs');
            const sub = vendor.submits().filter((x) => x.json.up_id === up).at(-1);
            assert.deepEqual(sub.json.files.map((f) => f.ref),
                ['request_file:a', 'request_file:a#1', 'request_file:b']);
            assert.equal(sub.json.input['note#1'], 'text');
        } finally {
            vendor.onSubmit = null;
        }

        /* text/plain: edits take JSON or multipart, never a form */
        const plain = await image('hello', 'edits', { key: acct.key, headers: { 'Content-Type': 'text/plain' } });
        const pe = assertError(plain, 400, { code: 'invalid_request',
            message: /POST \/v1\/images\/edits takes a JSON or multipart\/form-data body/ });
        assert.ok(!/urlencoded/.test(pe.message), pe.message);
        assertError(await image('hello', 'generations', { key: acct.key, headers: { 'Content-Type': 'text/plain' } }),
            400, { code: 'invalid_request', message: /POST \/v1\/images\/generations takes a JSON body/ });
        /* no Content-Type at all */
        const none = await gw.req('POST', '/v1/images/edits', { key: acct.key, body: 'x=1' });
        assert.ok(!/urlencoded/.test(assertError(none, 400, { code: 'invalid_request' }).message));
    });

    test('host_image, synchronous: the result inline, not retained; created added', async () => {
        const acct = await account(gw);
        vendor.onSubmit = syncSubmit;
        try {
            const r = assertOk(await image({ model: env.model, prompt: 'a cat',
                sync: { status: 'SUCCESS', data: { images: ['https://cdn.example/1.png'] } } },
            'generations', { key: acct.key }), 'generations');
            assert.deepEqual(r.json.data, [{ url: 'https://cdn.example/1.png', revised_prompt: 'a cat' }]);
            assert.ok(Number.isInteger(r.json.created) && Math.abs(r.json.created - now()) < 120,
                `created ${r.json.created}`);
            const sub = vendor.submits().at(-1);
            assert.equal(sub.json.action, 'image.generate');

            /* its own created stays */
            const c = assertOk(await image({ model: env.model,
                sync: { status: 'SUCCESS', data: { images: [], created: 17 } } }));
            assert.equal(c.json.created, 17);

            /* edits take JSON, and multipart */
            const e = assertOk(await image({ model: env.model,
                sync: { status: 'SUCCESS', data: { images: ['https://cdn.example/2.png'] } } }, 'edits'));
            assert.equal(e.json.data[0].url, 'https://cdn.example/2.png');
            assert.equal(vendor.submits().at(-1).json.action, 'image.edit');

            /* not retained: the task row keeps no data, and the charge stands */
            const rows = JSON.parse(await psql(db.conninfo, `select coalesce(json_agg(json_build_object(
                'status', status, 'data', data, 'retain', retain_result)), '[]') from tasks
                where token_id = ${Number(acct.token.id)}`));
            assert.equal(rows.length, 1);
            assert.deepEqual(rows[0], { status: 'SUCCESS', data: null, retain: false });
            await expectUsed(gw, db, acct, PER_TASK);

            /* a terminal failure: 400 with its reason, refunded */
            const acct2 = await account(gw);
            assertError(await image({ model: env.model,
                sync: { status: 'FAILURE', reason: 'the prompt was refused' } },
            'generations', { key: acct2.key }), 400,
            { type: 'upstream_error', code: 'task_failed', message: /the prompt was refused/ });
            await expectUsed(gw, db, acct2, 0);

            /* generations take JSON only */
            assertError(await image(`model=${env.model}`, 'generations',
                { headers: { 'Content-Type': 'application/x-www-form-urlencoded' } }), 400,
            { code: 'invalid_request', message: /JSON/ });
            /* a render that is not {data: [...]} */
            assertError(await image({ model: env.model,
                sync: { status: 'SUCCESS', data: { render: { nope: 1 } } } }), 500,
            { code: 'plugin_error' });
        } finally {
            vendor.onSubmit = null;
        }
    });

    test('host_image with response_format b64_json: URLs downloaded and encoded, kept; a failed one stays a URL', async () => {
        const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0, 1, 2, 255]);
        vendor.onOther = (rec) => (rec.path === '/img/a.png'
            ? { status: 200, headers: { 'Content-Type': 'image/png' }, body: png }
            : rec.path === '/img/moved.png'
                ? { status: 302, headers: { Location: '/img/a.png' }, body: '' }
                : { status: 404, body: { error: { message: 'no such image' } } });
        vendor.onSubmit = syncSubmit;
        try {
            const urls = [`${vendor.url}/img/a.png`, `${vendor.url}/img/gone.png`,
                `${vendor.url}/img/moved.png`];
            const r = assertOk(await image({ model: env.model, response_format: 'b64_json',
                sync: { status: 'SUCCESS', data: { images: urls } } }), 'b64_json');
            assert.equal(r.json.data[0].url, urls[0]);
            assert.equal(r.json.data[0].b64_json, png.toString('base64'));
            assert.equal(r.json.data[1].url, urls[1]);
            assert.equal(r.json.data[1].b64_json, undefined);
            /* a redirect is followed (each address checked) */
            assert.equal(r.json.data[2].url, urls[2]);
            assert.equal(r.json.data[2].b64_json, png.toString('base64'));
            await waitFor(() => /downloading an image for b64_json failed \(HTTP 404\)/
                .test(gw.errorLog()), 3000, { what: 'the warning' });
            /* without it, nothing is downloaded */
            const before = vendor.requests.filter((q) => q.path === '/img/a.png').length;
            const plain = assertOk(await image({ model: env.model,
                sync: { status: 'SUCCESS', data: { images: urls } } }));
            assert.equal(plain.json.data[0].b64_json, undefined);
            assert.equal(vendor.requests.filter((q) => q.path === '/img/a.png').length, before);
            /* no credentials go with a download */
            const got = vendor.requests.filter((q) => q.path === '/img/a.png').at(-1);
            assert.equal(got.headers.authorization, undefined);
        } finally {
            vendor.onSubmit = null;
            vendor.onOther = () => ({ status: 404, body: { error: { message: 'no such endpoint' } } });
        }
    });

    test('b64_json: a download that gives no bytes is a failed one; the warning names the request and the task', async () => {
        const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 7]);
        vendor.onOther = (rec) => (rec.path === '/img/a.png'
            ? { status: 200, headers: { 'Content-Type': 'image/png' }, body: png }
            : rec.path === '/img/empty.png' ? { status: 200, body: '' }
                : rec.path === '/img/none.png' ? { status: 204, body: '' }
                    : { status: 404, body: { error: { message: 'no such image' } } });
        vendor.onSubmit = syncSubmit;
        try {
            const acct = await account(gw);
            const urls = [`${vendor.url}/img/empty.png`, `${vendor.url}/img/none.png`,
                `${vendor.url}/img/a.png`];
            const r = assertOk(await image({ model: env.model, response_format: 'b64_json',
                sync: { status: 'SUCCESS', data: { images: urls } } }, 'generations', { key: acct.key }));
            assert.deepEqual(r.json.data.map((d) => d.url), urls);
            assert.equal('b64_json' in r.json.data[0], false, JSON.stringify(r.json.data[0]));
            assert.equal('b64_json' in r.json.data[1], false, JSON.stringify(r.json.data[1]));
            assert.equal(r.json.data[2].b64_json, png.toString('base64'));
            const rid = r.headers['x-request-id'];
            const id = JSON.parse(await psql(db.conninfo, `select to_json(task_id) from tasks
                where token_id = ${Number(acct.token.id)}`));
            const esc = (x) => x.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
            await waitFor(() => new RegExp(`\\[warn\\].*llmgw: request ${esc(rid)}, task ${esc(id)}: `
                + 'downloading an image for b64_json failed \\(HTTP 200 with no content\\).*\\(2 notes\\)')
                .test(gw.errorLog()), 3000, { what: 'the warning naming the request and the task' });
        } finally {
            vendor.onSubmit = null;
            vendor.onOther = () => ({ status: 404, body: { error: { message: 'no such endpoint' } } });
        }
    });

    test('b64_json downloads off the channel\'s origin reach no loopback address without llmgw_content_allow_private', async () => {
        const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 9, 9]);
        const cdn = await startMock((req, res) => {
            res.writeHead(200, { 'Content-Type': 'image/png', 'Content-Length': png.length });
            res.end(png);
        });
        vendor.onOther = (rec) => (rec.path === '/img/to-cdn.png'
            ? { status: 302, headers: { Location: `${cdn.url}/x.png` }, body: '' }
            : { status: 404, body: { error: { message: 'no such image' } } });
        vendor.onSubmit = syncSubmit;
        try {
            /* directly, by name, as ::ffff:, and through a redirect from the channel */
            const urls = [`${cdn.url}/a.png`, `http://localhost:${cdn.port}/b.png`,
                `http://[::ffff:127.0.0.1]:${cdn.port}/c.png`, `${vendor.url}/img/to-cdn.png`];
            const r = assertOk(await image({ model: env.model, response_format: 'b64_json',
                sync: { status: 'SUCCESS', data: { images: urls } } }), 'b64_json');
            assert.deepEqual(r.json.data.map((d) => d.url), urls);
            for (const d of r.json.data) {
                assert.equal(d.b64_json, undefined, `${d.url} was downloaded`);
            }
            assert.equal(cdn.requests.length, 0, 'the loopback server got nothing');
            assert.equal(vendor.requests.filter((q) => q.path === '/img/to-cdn.png').length, 1);
            /* each address refused where it is connected to, and the first
               failure named in the request's warning */
            const port = cdn.port;
            const refusedAt = (peer) => new RegExp(`\\[warn\\].*is not a public address: refused for a content request \\(llmgw_content_allow_private\\), task peer: ${peer}:${port}`)
                .test(gw.errorLog());
            await waitFor(() => refusedAt('127\\.0\\.0\\.1') && refusedAt('localhost')
                && refusedAt('\\[::ffff:127\\.0\\.0\\.1\\]')
                && new RegExp(`downloading an image for b64_json failed \\(127\\.0\\.0\\.1:${port} is not a public address\\)`)
                    .test(gw.errorLog()),
            3000, { what: 'the warnings' });
        } finally {
            vendor.onSubmit = null;
            vendor.onOther = () => ({ status: 404, body: { error: { message: 'no such endpoint' } } });
            await cdn.close();
        }
    });

    test('host_image, asynchronous: the request waits for the task, polling it', async () => {
        const acct = await account(gw);
        const up = uniq('up-img');
        vendor.queuePoll(up, { body: { status: 'running' } }, { body: { status: 'running' } });
        vendor.setPoll(up, { body: { status: 'done',
            data: { images: ['https://cdn.example/a.png', 'https://cdn.example/b.png'] } } });
        const t0 = Date.now();
        const r = assertOk(await image({ model: env.model, up_id: up, prompt: 'two cats' },
            'generations', { key: acct.key }), 'async generations');
        assert.deepEqual(r.json.data.map((d) => d.url),
            ['https://cdn.example/a.png', 'https://cdn.example/b.png']);
        assert.ok(Number.isInteger(r.json.created));
        assert.ok(vendor.polls(up).length >= 3, `polled ${vendor.polls(up).length} times`);
        assert.ok(Date.now() - t0 < 10000);
        /* never two polls at once, whoever made them */
        const polls = vendor.polls(up).sort((a, b) => a.t - b.t);
        for (let i = 1; i < polls.length; i++) {
            assert.ok(polls[i].t >= polls[i - 1].tEnd, 'two polls of one task at once');
        }
        /* finished by polling: retained, and settled once */
        const rows = JSON.parse(await psql(db.conninfo, `select coalesce(json_agg(json_build_object(
            'status', status, 'data', data, 'retain', retain_result, 'id', task_id)), '[]') from tasks
            where token_id = ${Number(acct.token.id)}`));
        assert.equal(rows.length, 1);
        assert.equal(rows[0].status, 'SUCCESS');
        assert.equal(rows[0].retain, true);
        assert.deepEqual(rows[0].data.images, ['https://cdn.example/a.png', 'https://cdn.example/b.png']);
        const led = await waitLedger(db, rows[0].id, ['reserve', 'settle']);
        assert.equal(led.reserve, PER_TASK);
        await expectUsed(gw, db, acct, PER_TASK);

        /* one that fails while the request waits: 400 with its reason, refunded */
        const acct2 = await account(gw);
        const up2 = uniq('up-imgf');
        vendor.queuePoll(up2, { body: { status: 'running' } });
        vendor.setPoll(up2, { body: { status: 'failed', error: 'no cats allowed' } });
        assertError(await image({ model: env.model, up_id: up2 }, 'generations', { key: acct2.key }),
            400, { type: 'upstream_error', code: 'task_failed', message: /no cats allowed/ });
        await expectUsed(gw, db, acct2, 0);
    });

    test('a client that leaves an image or sync Responses wait ends its request at once; the task goes on', async () => {
        for (const [path, body] of [['/v1/images/generations', {}],
            ['/v1/responses', { input: 'hi' }]]) {
            const acct = await account(gw);
            const up = uniq('up-leave');
            vendor.setPoll(up, { body: { status: 'running' } });
            const req = http.request({ host: '127.0.0.1', port: gw.port, method: 'POST', path,
                headers: { Authorization: `Bearer ${acct.key}`, 'Content-Type': 'application/json' } });
            req.on('error', () => {});
            req.end(JSON.stringify({ model: env.model, up_id: up, ...body }));
            await waitFor(() => vendor.polls(up).length >= 1, 5000, { what: 'the request\'s poll' });
            req.destroy();
            const left = Date.now();
            /* the request is logged (499) when its client leaves, not at
               llmgw_task_wait_timeout (600 s here) */
            await waitFor(() => new RegExp(`"POST ${path} HTTP/1.1" 499 `).test(
                gw.accessLog().split('\n').filter((l) => l.includes(path)).slice(-1)[0] || ''),
            3000, { what: `the ${path} request ended` });
            assert.ok(Date.now() - left < 3000);
            const id = JSON.parse(await psql(db.conninfo, `select to_json(task_id) from tasks
                where token_id = ${Number(acct.token.id)}`));
            vendor.setPoll(up, { body: { status: 'done', data: { images: ['https://cdn.example/l.png'] } } });
            await waitFor(async () => JSON.parse(await psql(db.conninfo,
                `select to_json(status) from tasks where task_id = '${id}'`)) === 'SUCCESS',
            8000, { what: 'the task ends in the background' });
            await expectUsed(gw, db, acct, PER_TASK);
        }
    });
});

describe('host_image: a result the plugin cannot render', { timeout: 120000 }, () => {
    const s = vendorSuite({ http: 'llmgw_task_poll_interval 200ms;' });
    let db, gw, vendor, env;
    before(async () => {
        ({ db, gw, vendor } = s);
        env = await taskSetup(gw, { fixture: 'task-protocols.js', vendors: [vendor], models: 1 });
    });

    test('the task is failed and refunded, the error names it: synchronous and asynchronous', async () => {
        vendor.onSubmit = syncSubmit;
        try {
            const cases = [
                ['sync, render throws', { sync: { status: 'SUCCESS', data: { render: 'throw' } } }, /render broke/],
                ['sync, not {data}', { sync: { status: 'SUCCESS', data: { render: { data: 'nope' } } } },
                    /must return/],
                ['async, render throws', 'async', /render broke/],
            ];
            for (const [what, input, why] of cases) {
                const acct = await account(gw);
                let body = { model: env.model, prompt: 'x', ...input };
                if (input === 'async') {
                    const up = uniq('up-imgr');
                    vendor.setPoll(up, { body: { status: 'done', data: { render: 'throw' } } });
                    body = { model: env.model, prompt: 'x', up_id: up };
                }
                const r = await gw.req('POST', '/v1/images/generations', { key: acct.key, body });
                assertError(r, 500, { code: 'plugin_error', message: why });
                const rows = JSON.parse(await psql(db.conninfo, `select coalesce(json_agg(json_build_object(
                    'id', task_id, 'status', status, 'reason', fail_reason, 'quota', quota)), '[]')
                    from tasks where token_id = ${Number(acct.token.id)}`));
                assert.equal(rows.length, 1, what);
                assert.match(r.json.error.message, new RegExp(`task ${rows[0].id} was failed and refunded`),
                    what);
                assert.equal(rows[0].status, 'FAILURE', what);
                assert.match(rows[0].reason, /could not be rendered/, what);
                assert.equal(rows[0].quota, 0, what);
                const led = await waitLedger(db, rows[0].id, ['reserve', 'refund']);
                assert.equal(led.refund, PER_TASK, `${what}: ${JSON.stringify(led)}`);
                await expectUsed(gw, db, acct, 0);
                /* the task says so too */
                const t = await gw.req('GET', `/v1/tasks/${rows[0].id}`, { key: acct.key });
                assert.equal(t.status, 200, t.text);
                assert.match(JSON.stringify(t.json), /FAILURE/);
            }
        } finally {
            vendor.onSubmit = null;
        }
    });
});

describe('host_image past llmgw_task_wait_timeout', { timeout: 120000 }, () => {
    const s = protocolSuite(`${HTTP}\n  llmgw_task_wait_timeout 1s;`);
    let db, gw, vendor, env;

    before(() => ({ db, gw, vendor, env } = s));

    test('504 task_timeout, and the task still ends and is settled in the background', async () => {
        const up = uniq('up-slow');
        const t0 = Date.now();
        const r = await gw.req('POST', '/v1/images/generations',
            { key: env.acct.key, body: { model: env.model, up_id: up } });
        assertError(r, 504, { code: 'task_timeout', message: /did not finish within 1 s/ });
        assert.ok(Date.now() - t0 < 5000, `answered after ${Date.now() - t0} ms`);

        vendor.setPoll(up, { body: { status: 'done', data: { images: ['https://cdn.example/z.png'] } } });
        const id = JSON.parse(await psql(db.conninfo, `select to_json(task_id) from tasks
            where token_id = ${Number(env.acct.token.id)}`));
        await waitFor(async () => JSON.parse(await psql(db.conninfo,
            `select to_json(status) from tasks where task_id = '${id}'`)) === 'SUCCESS',
        8000, { what: 'the task ends in the background' });
        const led = await waitLedger(db, id, ['reserve', 'settle']);
        assert.equal(led.reserve, PER_TASK);
        await expectUsed(gw, db, env.acct, PER_TASK);

        /* a client that leaves: the task goes on just the same */
        const up2 = uniq('up-gone');
        const gone = await gw.req('POST', '/v1/images/generations',
            { key: env.acct.key, body: { model: env.model, up_id: up2 }, timeoutMs: 700 })
            .catch((e) => e);
        assert.ok(gone instanceof Error, 'the client gave up first');
        vendor.setPoll(up2, { body: { status: 'done', data: { images: [] } } });
        await waitFor(async () => JSON.parse(await psql(db.conninfo,
            `select to_json(count(*)) from tasks where token_id = ${Number(env.acct.token.id)}
               and status = 'SUCCESS'`)) === 2, 8000, { what: 'the second task ends' });
        await expectUsed(gw, db, env.acct, 2 * PER_TASK);
    });

    test('a poll the vendor does not answer ends with the wait: 504 on time, the poll uncounted', async () => {
        const acct = await account(gw);
        const up = uniq('up-hung');
        vendor.setPoll(up, { body: { status: 'running' }, delayMs: 20000 });
        await timesOutOnTime(gw, acct.key, '/v1/images/generations', { model: env.model, up_id: up }, 1);
        assert.ok(vendor.polls(up).length >= 1, 'the request was polling');

        /* the vendor was not given its time: no failure counted, and the
           request's lease is given back to the background pollers */
        const id = JSON.parse(await psql(db.conninfo, `select to_json(task_id) from tasks
            where token_id = ${Number(acct.token.id)}`));
        assert.equal(await pollFailures(db, id), 0);
        const owner = JSON.parse(await psql(db.conninfo,
            `select to_json(coalesce(lease_owner, '')) from tasks where task_id = '${id}'`));
        assert.ok(!owner.startsWith('request:'), `leased to ${owner}`);
        vendor.setPoll(up, { body: { status: 'done', data: { images: [] } } });
    });
});


describe('host_image: the downloads and the wait are bounded while something hangs', { timeout: 120000 }, () => {
    const s = protocolSuite(`${HTTP}\n  llmgw_task_http_timeout 1s;\n  llmgw_task_wait_timeout 2s;`);
    let db, gw, vendor, env;

    before(() => ({ db, gw, vendor, env } = s));

    test('b64_json downloads end together within llmgw_task_http_timeout; the rest keep their URLs', async () => {
        const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 3]);
        vendor.onOther = (rec) => (rec.path === '/img/a.png'
            ? { status: 200, body: png }
            : rec.path === '/img/hang.png' ? { status: 200, body: png, delayMs: 4000 }
                : { status: 404, body: { error: { message: 'no such image' } } });
        vendor.onSubmit = syncSubmit;
        try {
            const urls = [`${vendor.url}/img/a.png`, `${vendor.url}/img/hang.png`,
                `${vendor.url}/img/hang.png`, `${vendor.url}/img/hang.png`, `${vendor.url}/img/a.png`];
            const t0 = Date.now();
            const r = assertOk(await gw.req('POST', '/v1/images/generations', { key: env.acct.key,
                body: { model: env.model, response_format: 'b64_json',
                    sync: { status: 'SUCCESS', data: { images: urls } } },
                timeoutMs: 30000 }));
            const took = Date.now() - t0;
            assert.ok(took < 2500, `answered after ${took} ms`);
            assert.deepEqual(r.json.data.map((d) => d.url), urls);
            assert.equal(r.json.data[0].b64_json, png.toString('base64'));
            for (const d of r.json.data.slice(1)) {
                assert.equal(d.b64_json, undefined, JSON.stringify(d));
            }
            await waitFor(() => /downloading an image for b64_json failed \([^)]*timed out\).*\(4 notes\)/
                .test(gw.errorLog()), 3000, { what: 'the warning' });
        } finally {
            vendor.onSubmit = null;
            vendor.onOther = () => ({ status: 404, body: { error: { message: 'no such endpoint' } } });
        }
    });

    test('504 task_timeout on time while a poll hook runs; the task still ends and is settled once', async () => {
        const acct = await account(gw);
        const up = uniq('up-slowparse');
        vendor.setPoll(up, { body: { status: 'running', slowParseMs: 3500 } });
        await timesOutOnTime(gw, acct.key, '/v1/images/generations', { model: env.model, up_id: up }, 2);

        /* the hook's answer is the request's poll's: saved, the lease given
           back, no failure counted; then the task ends in the background */
        const id = JSON.parse(await psql(db.conninfo, `select to_json(task_id) from tasks
            where token_id = ${Number(acct.token.id)}`));
        await waitFor(async () => !JSON.parse(await psql(db.conninfo,
            `select to_json(coalesce(lease_owner, '')) from tasks where task_id = '${id}'`)).startsWith('request:'),
        6000, { what: 'the request\'s lease given back' });
        assert.equal(await pollFailures(db, id), 0);
        vendor.setPoll(up, { body: { status: 'done', data: { images: ['https://cdn.example/s.png'] } } });
        await waitFor(async () => JSON.parse(await psql(db.conninfo,
            `select to_json(status) from tasks where task_id = '${id}'`)) === 'SUCCESS',
        10000, { what: 'the task ends in the background' });
        const led = await waitLedger(db, id, ['reserve', 'settle']);
        assert.equal(led.reserve, PER_TASK);
        await expectUsed(gw, db, acct, PER_TASK);

        /* a client that leaves while the hook runs: its answer is saved
           as the poll's at once, the lease given back */
        const acct3 = await account(gw);
        const up3 = uniq('up-slowgone');
        vendor.setPoll(up3, { body: { status: 'done', slowParseMs: 1500,
            data: { images: ['https://cdn.example/g.png'] } } });
        const req = http.request({ host: '127.0.0.1', port: gw.port, method: 'POST',
            path: '/v1/images/generations',
            headers: { Authorization: `Bearer ${acct3.key}`, 'Content-Type': 'application/json' } });
        req.on('error', () => {});
        req.end(JSON.stringify({ model: env.model, up_id: up3 }));
        await waitFor(() => vendor.polls(up3).length >= 1, 5000, { what: 'the request\'s poll' });
        await new Promise((r) => setTimeout(r, 300));
        req.destroy();
        const gone = JSON.parse(await psql(db.conninfo, `select to_json(task_id) from tasks
            where token_id = ${Number(acct3.token.id)}`));
        await waitFor(async () => JSON.parse(await psql(db.conninfo,
            `select to_json(status) from tasks where task_id = '${gone}'`)) === 'SUCCESS',
        5000, { what: 'the poll\'s answer saved' });
        assert.equal(vendor.polls(up3).length, 1, 'the vendor was not asked again');
        await expectUsed(gw, db, acct3, PER_TASK);

        /* a sync Response waits as an image request does */
        const acct2 = await account(gw);
        const up2 = uniq('up-slowresp');
        vendor.setPoll(up2, { body: { status: 'running', slowParseMs: 3500 } });
        await timesOutOnTime(gw, acct2.key, '/v1/responses', { model: env.model, input: 'hi', up_id: up2 }, 2);
        vendor.setPoll(up2, { body: { status: 'done' } });
        await expectUsed(gw, db, acct2, PER_TASK, { ms: 15000 });
    });
});
