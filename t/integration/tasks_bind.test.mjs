// Task plugins bound to channels, priced and reached, end to end through the
// real nginx, PostgreSQL and the plugin runtime helper, against the mock
// vendor of t/lib/vendor.mjs:
//   - type 60 peer gateway channels (settings.task_plugin_key and
//     task_extend_plugin_keys; ctx.upstream, apiKey and authHeader; the
//     marketplace alias new_api; a plugin without peer_gateway refused);
//   - type 61 binding errors and the channel base URL filled from the
//     plugin's meta.baseUrl;
//   - meta.channelTypes binding a legacy channel type without settings;
//   - task prices: "<pluginKey>::<model>" before "<model>", unit prices with
//     enum multipliers, the usage profile chosen by upstream model, then
//     client model, then the defaults; a model without a price;
//   - a `dynamic` native route submitting, and querying several tasks;
//   - key model lists, disabled keys and rate limits on task routes.
//
// Every test installs its own variants of fixtures/plugins/task-bind-vendor.js
// (own key, models, channel) on a vendor of its own.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, hex, makeKey, makeUser, settle,
    sleep, startGateway, stopAll,
} from '../lib/harness.mjs';
import {
    account, expectUsed, getTask, PLUGIN_FIXTURES, startVendor, submitTask,
    uploadPlugin, waitFor, waitLedger,
} from '../lib/vendor.mjs';

const POLL_MS = 200;
const PER_TASK = 5000;      /* 0.01 USD */
const HTTP = `llmgw_task_poll_interval ${POLL_MS}ms;\n  llmgw_task_poll_max_failures 3;`;
const FIXTURE = 'task-bind-vendor.js';

/* ------------------------------------------------------------------ */
/* helpers                                                             */
/* ------------------------------------------------------------------ */

let pluginCounter = 0;

function setConst(src, name, value) {
    const re = new RegExp(`^const ${name} = .*;$`, 'm');
    assert.ok(re.test(src), `${FIXTURE}: no one-line "const ${name} = ...;"`);
    return src.replace(re, () => `const ${name} = ${JSON.stringify(value)};`);
}

/*
 * Installs a variant of the fixture: {key, models}.  models default to two
 * of its own; upstreams, channelTypes, baseUrl, profiles (usageProfiles)
 * are left out of the manifest unless given.
 */
async function installPlugin(gw, { models, upstreams = null, channelTypes = null,
    baseUrl = null, profiles = null } = {}) {
    pluginCounter++;
    const key = `tb${pluginCounter}-${hex(4)}`;
    const ms = models || [`${key}-m${hex(3)}`, `${key}-m${hex(3)}`];
    let src = fs.readFileSync(path.join(PLUGIN_FIXTURES, FIXTURE), 'utf8');
    for (const [name, value] of [['KEY', key], ['MODELS', ms], ['UPSTREAMS', upstreams],
        ['CHANNEL_TYPES', channelTypes], ['BASE_URL', baseUrl], ['USAGE_PROFILES', profiles]]) {
        src = setConst(src, name, value);
    }
    await uploadPlugin(gw, src);
    return { key, models: ms };
}

function postChannel(gw, body) {
    return gw.admin('POST', '/api/channel', {
        name: `bind-${hex(4)}`, key: `vk-${hex(12)}`, groups: ['default'], ...body,
    });
}

async function addChannel(gw, body) {
    const r = await postChannel(gw, body);
    assert.equal(r.status, 200, `POST /api/channel ${JSON.stringify(body)}: ${r.status} ${r.text}`);
    return r.json;
}

async function setPrices(gw, prices) {
    const r = await gw.admin('PUT', '/api/pricing', prices);
    assert.equal(r.status, 200, `PUT /api/pricing: ${r.text}`);
}

/* The vendor's submit request of one upstream id (the client's up_id). */
const submitOf = (vendor, up) => {
    const s = vendor.submits().find((q) => q.upId === up);
    assert.ok(s, `the vendor received the submit of ${up}; it has ` +
        JSON.stringify(vendor.requests.map((q) => `${q.method} ${q.url}`)));
    return s;
};

/* A submit through /v1/tasks/{plugin}: -> the response (asserted 200). */
async function submitOk(gw, plugin, acct, body, what = 'submit') {
    const r = assertOk(await submitTask(gw, { key: plugin.key, acct }, body), what);
    assert.match(r.json.task_id, /^task_/, r.text);
    return r;
}

/* ------------------------------------------------------------------ */
/* channel bindings                                                    */
/* ------------------------------------------------------------------ */

describe('task plugins bound to channels: types 60 and 61, channelTypes', { timeout: 300000 }, () => {
    let db, gw;
    const vendors = [];

    async function newVendor() {
        const v = await startVendor();
        vendors.push(v);
        return v;
    }

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true, http: HTTP });
    });

    /* a retired vendor answers 404: its tasks end at their next poll */
    afterEach(() => {
        vendors.forEach((v) => v.retire());
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all(vendors.map((v) => v.close()));
            await dropDb(db);
        }
    });

    test('type 60: peer gateway context for the main plugin and an extended one (new_api)', async () => {
        const v = await newVendor();
        const t0 = Date.now();
        const main = await installPlugin(gw, { upstreams: ['vendor', 'peer_gateway'] });
        const ext = await installPlugin(gw, { upstreams: ['new_api'] });
        await addChannel(gw, {
            type: 60, base_url: v.url, key: 'peer-secret',
            models: [main.models[0], ext.models[0]],
            settings: { task_plugin_key: main.key, task_extend_plugin_keys: [ext.key] },
        });
        await setPrices(gw, { [main.models[0]]: { price: 0.01 }, [ext.models[0]]: { price: 0.01 } });
        const acct = await account(gw);
        await settle(t0);

        for (const [what, p] of [['task_plugin_key', main], ['task_extend_plugin_keys', ext]]) {
            const up = `up-${hex(4)}`;
            await submitOk(gw, p, acct, { model: p.models[0], up_id: up }, what);
            const sub = submitOf(v, up);
            assert.equal(sub.headers.authorization, 'Bearer peer-secret', what);
            const c = sub.json.ctx;
            assert.deepEqual(c.upstream, { kind: 'peer_gateway' }, `${what}: ${JSON.stringify(c)}`);
            assert.equal(c.apiKey, 'peer-secret', what);
            assert.equal(c.authHeader, 'Bearer peer-secret', what);
            assert.equal(c.baseUrl, v.url, what);

            /* the query context of a peer gateway task says so too */
            const poll = await waitFor(() => v.polls(up)[0], 5000, { what: `a poll of ${up}` });
            const q = JSON.parse(poll.headers['x-ctx']);
            assert.deepEqual(q.upstream, { kind: 'peer_gateway' }, `${what} poll: ${JSON.stringify(q)}`);
            assert.equal(q.authHeader, 'Bearer peer-secret', `${what} poll`);
        }
        await expectUsed(gw, db, acct, 2 * PER_TASK);
    });

    test('type 60 refuses a plugin without peer_gateway in upstreams (400, clear message)', async () => {
        const v = await newVendor();
        const plain = await installPlugin(gw);
        const vendorOnly = await installPlugin(gw, { upstreams: ['vendor'] });
        const alias = await installPlugin(gw, { upstreams: ['new_api'] });
        const cases = [
            ['no meta.upstreams, as task_plugin_key', { task_plugin_key: plain.key }, plain.key],
            ['upstreams [vendor], as task_plugin_key', { task_plugin_key: vendorOnly.key }, vendorOnly.key],
            ['no meta.upstreams, as an extended key',
                { task_plugin_key: alias.key, task_extend_plugin_keys: [plain.key] }, plain.key],
        ];
        const names = [];
        for (const [what, settings, culprit] of cases) {
            const name = `refused-${hex(4)}`;
            names.push(name);
            const r = await postChannel(gw, {
                name, type: 60, base_url: v.url, key: 'peer-secret',
                models: [...alias.models, ...plain.models], settings,
            });
            const e = assertError(r, 400);
            assert.ok(e.message.includes(culprit), `${what}: names the plugin: ${e.message}`);
            assert.match(e.message, /peer|upstreams/i, `${what}: says why: ${e.message}`);
        }
        const list = await gw.admin('GET', '/api/channel?page_size=100');
        assert.equal(list.status, 200, list.text);
        for (const n of names) {
            assert.ok(!list.json.items.some((c) => c.name === n), `channel ${n} was not saved`);
        }

        /* the alias alone allows type 60; the plain plugin still binds type 61 */
        await addChannel(gw, {
            type: 60, base_url: v.url, key: 'peer-secret', models: alias.models,
            settings: { task_plugin_key: alias.key },
        });
        await addChannel(gw, {
            type: 61, base_url: v.url, models: plain.models, settings: { task_plugin_key: plain.key },
        });
    });

    test('type 61: a missing task_plugin_key or an unknown plugin is refused with 400', async () => {
        const v = await newVendor();
        const p = await installPlugin(gw, { upstreams: ['peer_gateway'] });
        const unknown = `nope-${hex(4)}`;
        const cases = [
            ['no settings', { type: 61 }, /task_plugin_key/],
            ['settings {}', { type: 61, settings: {} }, /task_plugin_key/],
            ['an empty key', { type: 61, settings: { task_plugin_key: '' } }, /task_plugin_key/],
            ['an unknown plugin', { type: 61, settings: { task_plugin_key: unknown } },
                new RegExp(`${unknown}.*not installed|not installed.*${unknown}`)],
            ['type 60, an unknown extended plugin',
                { type: 60, settings: { task_plugin_key: p.key, task_extend_plugin_keys: [unknown] } },
                new RegExp(unknown)],
            ['type 60, no settings', { type: 60 }, /task_plugin_key/],
        ];
        for (const [what, body, re] of cases) {
            const r = await postChannel(gw, { base_url: v.url, models: p.models, ...body });
            const e = assertError(r, 400);
            assert.match(e.message, re, `${what}: ${e.message}`);
        }
    });

    test('type 61: an empty base_url is filled from meta.baseUrl, and submits reach it', async () => {
        const v = await newVendor();
        const base = `${v.url}/pfx`;
        const t0 = Date.now();
        const p = await installPlugin(gw, { baseUrl: base });
        const blank = await addChannel(gw, {
            type: 61, base_url: '', models: [p.models[0]], settings: { task_plugin_key: p.key },
        });
        const absent = await addChannel(gw, {
            type: 61, models: [p.models[1]], settings: { task_plugin_key: p.key },
        });
        for (const [what, ch] of [['base_url ""', blank], ['no base_url', absent]]) {
            const g = await gw.admin('GET', `/api/channel/${ch.id}`);
            assert.equal(g.status, 200, g.text);
            assert.equal(g.json.base_url, base, `${what}: ${g.text}`);
        }
        await setPrices(gw, { [p.models[0]]: { price: 0.01 }, [p.models[1]]: { price: 0.01 } });
        const acct = await account(gw);
        await settle(t0);
        for (const m of p.models) {
            const up = `up-${hex(4)}`;
            await submitOk(gw, p, acct, { model: m, up_id: up });
            const sub = submitOf(v, up);
            assert.equal(sub.path, '/pfx/submit');
            assert.equal(sub.json.ctx.baseUrl, base);
        }

        /* without a baseUrl in the plugin an empty base_url is refused */
        const bare = await installPlugin(gw);
        const e = assertError(await postChannel(gw, {
            type: 61, base_url: '', models: bare.models, settings: { task_plugin_key: bare.key },
        }), 400);
        assert.match(e.message, /base_?url/i, e.message);
    });

    test('meta.channelTypes: a legacy channel type without settings serves the plugin', async () => {
        const v = await newVendor();
        const t0 = Date.now();
        const legacy = await installPlugin(gw, { channelTypes: [57] });
        const other = await installPlugin(gw);
        const ch = await addChannel(gw, {
            type: 57, base_url: v.url, key: 'legacy-key',
            models: [legacy.models[0], other.models[0]],
        });
        assert.deepEqual(ch.settings || {}, {}, 'the channel has no settings');
        await setPrices(gw, { [legacy.models[0]]: { price: 0.01 }, [other.models[0]]: { price: 0.01 } });
        const acct = await account(gw);
        await settle(t0);

        const up = `up-${hex(4)}`;
        await submitOk(gw, legacy, acct, { model: legacy.models[0], up_id: up });
        const sub = submitOf(v, up);
        assert.equal(sub.headers.authorization, 'Bearer legacy-key');
        assert.equal(sub.json.ctx.apiKey, 'legacy-key');
        assert.deepEqual(sub.json.ctx.upstream, { kind: 'vendor' });

        /* the same channel does not serve a plugin that does not declare the type */
        assertError(await submitTask(gw, { key: other.key, acct }, { model: other.models[0] }), 503,
            { code: 'model_not_found' });
        assert.equal(v.submits().length, 1);
    });

    test('meta.channelTypes naming a type the gateway proxies binds only channels that name the plugin', async () => {
        const v = await newVendor();
        const t0 = Date.now();
        const grab = await installPlugin(gw, { channelTypes: [1, 14] });
        const m = grab.models[0];
        /* an operator's OpenAI and Anthropic channels that happen to list the model */
        await addChannel(gw, { type: 1, base_url: v.url, key: 'openai-secret', models: [m] });
        await addChannel(gw, { type: 14, base_url: v.url, key: 'anthropic-secret', models: [m] });
        await setPrices(gw, { [m]: { price: 0.01 } });
        const acct = await account(gw);
        await settle(t0);

        assertError(await submitTask(gw, { key: grab.key, acct }, { model: m }), 503,
            { code: 'model_not_found' });
        assert.equal(v.submits().length, 0, 'no vendor key reached the plugin');

        /* a channel of such a type that names the plugin in its settings serves it */
        await addChannel(gw, {
            type: 1, base_url: v.url, key: 'opted-in', models: [m],
            settings: { task_plugin_key: grab.key },
        });
        await settle(Date.now());
        const up = `up-${hex(4)}`;
        await submitOk(gw, grab, acct, { model: m, up_id: up });
        assert.equal(submitOf(v, up).json.ctx.apiKey, 'opted-in');
    });
});

/* ------------------------------------------------------------------ */
/* prices, dynamic routes, keys                                        */
/* ------------------------------------------------------------------ */

describe('task prices, dynamic routes and key checks', { timeout: 300000 }, () => {
    let db, gw;
    const vendors = [];

    async function newVendor() {
        const v = await startVendor();
        vendors.push(v);
        return v;
    }

    /*
     * A plugin (installPlugin options) on one type-61 channel of a new
     * vendor, a per-call price of 0.01 USD per model unless prices are
     * given, and an account: -> {key, models, model, vendor, acct}.
     */
    async function bound(pluginOpts = {}, { prices, channel = {}, groups = ['default'] } = {}) {
        const vendor = await newVendor();
        const t0 = Date.now();
        const p = await installPlugin(gw, pluginOpts);
        await addChannel(gw, {
            type: 61, base_url: vendor.url, models: p.models, groups,
            settings: { task_plugin_key: p.key }, ...channel,
        });
        if (prices !== null) {
            await setPrices(gw, prices || Object.fromEntries(p.models.map((m) => [m, { price: 0.01 }])));
        }
        const acct = await account(gw);
        await settle(t0);
        return { ...p, model: p.models[0], vendor, acct };
    }

    const dyn = (env, body, key = env.acct.key) =>
        gw.req('POST', `/${env.key}/v1/dyn`, { key, body, timeoutMs: 30000 });

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true, http: HTTP });
        let r = await gw.admin('PUT', '/api/group', { default: 1, tasklim: 1 });
        assert.equal(r.status, 200, r.text);
        r = await gw.admin('PUT', '/api/rate_limit', {
            groups: { tasklim: { duration_minutes: 1, total: 2, success: 0 } },
        });
        assert.equal(r.status, 200, r.text);
    });

    afterEach(() => {
        vendors.forEach((v) => v.retire());
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await Promise.all(vendors.map((v) => v.close()));
            await dropDb(db);
        }
    });

    /* ---------------------------- prices ---------------------------- */

    test('pricing: "<pluginKey>::<model>" wins over "<model>"', async () => {
        const shared = `shared-${hex(4)}`;
        const a = await bound({ models: [shared] }, { prices: null });
        const b = await bound({ models: [shared] }, { prices: null });
        const t0 = Date.now();
        await setPrices(gw, { [`${a.key}::${shared}`]: { price: 0.02 }, [shared]: { price: 0.01 } });
        await settle(t0);
        const ra = await submitOk(gw, a, a.acct, { model: shared, up_id: `up-${hex(4)}` }, 'plugin a');
        const rb = await submitOk(gw, b, b.acct, { model: shared, up_id: `up-${hex(4)}` }, 'plugin b');
        assert.equal((await waitLedger(db, ra.json.task_id, ['reserve'])).reserve, 2 * PER_TASK,
            'plugin a: its own price');
        assert.equal((await waitLedger(db, rb.json.task_id, ['reserve'])).reserve, PER_TASK,
            'plugin b: the model price');
        assert.equal(a.vendor.submits().length, 1);
        assert.equal(b.vendor.submits().length, 1);
    });

    test('pricing: unit price with multipliers on an enum usage field', async () => {
        const env = await bound({}, { prices: null });
        const t0 = Date.now();
        await setPrices(gw, {
            [`${env.key}::${env.model}`]: {
                unit_prices: { seconds: 0.013 },
                multipliers: { resolution: { '720p': 1, '1080p': 2 } },
            },
        });
        await settle(t0);
        const cases = [
            [{ seconds: 3, resolution: '1080p' }, 39000],   /* 3 x 0.013 x 2 USD */
            [{ seconds: 3, resolution: '720p' }, 19500],
            [{ seconds: 3 }, 19500],                        /* no value, no factor */
        ];
        let total = 0;
        for (const [usage, quota] of cases) {
            const r = await submitOk(gw, env, env.acct, { model: env.model, usage });
            const led = await waitLedger(db, r.json.task_id, ['reserve']);
            assert.equal(led.reserve, quota, `${JSON.stringify(usage)}: ${JSON.stringify(led)}`);
            total += quota;
        }
        /* an enum value the schema does not declare is the plugin's error */
        const bad = await submitTask(gw, env, { model: env.model, usage: { seconds: 1, resolution: '4k' } });
        const e = assertError(bad, 500, { code: 'plugin_error' });
        assert.match(e.message, /resolution/, e.message);
        assert.equal(env.vendor.submits().length, cases.length, 'the refused submit sent nothing');
        await expectUsed(gw, db, env.acct, total);
    });

    test('usageProfiles: the upstream model\'s profile, then the client model\'s, then the defaults', async () => {
        const k = hex(3);
        const [mapped, inProfile, plain, upstream] = ['mapped', 'prof', 'plain', 'up'].map((s) => `pf${k}-${s}`);
        const enumField = { enum: ['720p', '1080p'], description: 'Resolution of the generated media' };
        const env = await bound({
            models: [mapped, inProfile, plain, upstream],
            profiles: [
                { models: [upstream], schema: {
                    frames: { type: 'number', unit: 'count', description: 'Frames generated' },
                    resolution: enumField } },
                { models: [mapped, inProfile], schema: {
                    clips: { type: 'number', unit: 'count', description: 'Clips generated' } } },
            ],
        }, {
            prices: null,
            channel: { models: [mapped, inProfile, plain], model_mapping: { [mapped]: upstream } },
        });
        const t0 = Date.now();
        await setPrices(gw, {
            [mapped]: { unit_prices: { frames: 0.001 }, multipliers: { resolution: { '1080p': 2 } } },
            [inProfile]: { unit_prices: { clips: 0.005 } },
            [plain]: { unit_prices: { seconds: 0.01 }, multipliers: { resolution: { '720p': 1.5 } } },
        });
        await settle(t0);

        /* [model, facts, quota or the refused field] */
        const cases = [
            [mapped, { frames: 10, resolution: '1080p' }, 10000],
            [mapped, { clips: 1 }, 'clips'],
            [mapped, { seconds: 1 }, 'seconds'],
            [inProfile, { clips: 3 }, 7500],
            [inProfile, { frames: 1 }, 'frames'],
            [inProfile, { seconds: 1 }, 'seconds'],
            [plain, { seconds: 2, resolution: '720p' }, 15000],
            [plain, { frames: 1 }, 'frames'],
            [plain, { clips: 1 }, 'clips'],
        ];
        let sent = 0;
        let total = 0;
        for (const [model, usage, want] of cases) {
            const what = `${model} ${JSON.stringify(usage)}`;
            const r = await submitTask(gw, env, { model, usage });
            if (typeof want === 'number') {
                assertOk(r, what);
                sent++;
                total += want;
                const led = await waitLedger(db, r.json.task_id, ['reserve']);
                assert.equal(led.reserve, want, `${what}: ${JSON.stringify(led)}`);
            } else {
                const e = assertError(r, 500, { code: 'plugin_error' });
                assert.match(e.message, new RegExp(`\\b${want}\\b`), `${what}: ${e.message}`);
            }
        }
        assert.equal(env.vendor.submits().length, sent, 'refused submits sent nothing');
        assert.equal(env.vendor.submits()[0].json.ctx.upstreamModel, upstream, 'the mapping applied');
        await expectUsed(gw, db, env.acct, total);
    });

    test('a task model without any price: 400 model_price_error, nothing sent or charged', async () => {
        const env = await bound({}, { prices: null });
        const r = await submitTask(gw, env, { model: env.model, usage: { seconds: 1 } });
        assertError(r, 400, { code: 'model_price_error' });
        const d = await dyn(env, { model: env.model });
        assertError(d, 400, { code: 'model_price_error' });
        await sleep(300);
        assert.equal(env.vendor.requests.length, 0);
        await expectUsed(gw, db, env.acct, 0);
    });

    /* ------------------------ dynamic routes ------------------------ */

    test('a dynamic route submits like a submit route', async () => {
        const env = await bound();
        const up = `up-${hex(4)}`;
        const body = { model: env.model, prompt: 'a boat', up_id: up };
        const r = assertOk(await dyn(env, body), 'dynamic submit');
        const one = r.json.one;
        assert.ok(one, `rendered by renderDynamic: ${r.text}`);
        assert.match(one.id, /^task_/, r.text);
        const c = submitOf(env.vendor, up).json.ctx;
        assert.equal(c.action, 'dyn');
        assert.deepEqual(c.requestBody, body, 'the decoder\'s requestBody');
        assert.equal(c.publicTaskId, one.id);
        const g = assertOk(await getTask(gw, env.acct.key, one.id));
        assert.equal(g.json.action, 'dyn');
        assert.equal(g.json.plugin, env.key);
        assert.equal((await waitLedger(db, one.id, ['reserve'])).reserve, PER_TASK);
    });

    test('a dynamic route query intent renders an array of the caller\'s tasks only', async () => {
        const env = await bound();
        const a = (await submitOk(gw, env, env.acct, { model: env.model })).json.task_id;
        const b = assertOk(await dyn(env, { model: env.model })).json.one.id;
        const stranger = await account(gw);
        const theirs = (await submitOk(gw, env, stranger, { model: env.model })).json.task_id;
        const unknown = `task_${hex(12)}`;
        const n = env.vendor.submits().length;

        const r = assertOk(await dyn(env, { ids: [b, theirs, unknown, a] }), 'dynamic query');
        assert.ok(Array.isArray(r.json.tasks), `an array was rendered: ${r.text}`);
        assert.deepEqual(r.json.tasks.map((t) => t.id), [b, a], r.text);
        for (const t of r.json.tasks) {
            assert.equal(typeof t.status, 'string', r.text);
        }
        const s = assertOk(await dyn(env, { ids: [a, b, theirs] }, stranger.key), 'the stranger\'s query');
        assert.deepEqual(s.json.tasks.map((t) => t.id), [theirs], s.text);
        assert.deepEqual(assertOk(await dyn(env, { ids: [] })).json.tasks, []);
        assert.equal(env.vendor.submits().length, n, 'a query submits nothing');
    });

    /* Not in the brief's list: a query route answers 404 for the caller's
       task of another plugin, so a multi-task query should leave it out. */
    test('a dynamic route query leaves out the caller\'s tasks of another plugin', async () => {
        const env = await bound();
        const other = await bound();
        const mine = (await submitOk(gw, env, env.acct, { model: env.model })).json.task_id;
        const foreign = (await submitOk(gw, other, env.acct, { model: other.model })).json.task_id;
        const r = assertOk(await dyn(env, { ids: [mine, foreign] }), 'dynamic query');
        assert.deepEqual(r.json.tasks.map((t) => t.id), [mine], r.text);
    });

    /* ------------------------- keys, limits ------------------------- */

    test('a key whose models list excludes the model: 403 on /v1/tasks and on a native route', async () => {
        const env = await bound();
        const token = await makeKey(gw, env.acct.user.id, { models: [env.models[1]] });
        for (const [what, r] of [
            ['/v1/tasks', await submitTask(gw, env, { model: env.model }, { key: token.key })],
            ['dynamic route', await dyn(env, { model: env.model }, token.key)],
        ]) {
            const e = assertError(r, 403, { code: 'model_not_allowed' });
            assert.ok(e.message.includes(env.model), `${what}: ${e.message}`);
        }
        await sleep(300);
        assert.equal(env.vendor.requests.length, 0, 'refused submits sent nothing');
        await submitOk(gw, env, { key: token.key }, { model: env.models[1] }, 'the listed model');
    });

    test('a disabled key: 401 on submit, on the task view and on a native route', async () => {
        const env = await bound();
        const id = (await submitOk(gw, env, env.acct, { model: env.model })).json.task_id;
        const disabled = await makeKey(gw, env.acct.user.id, { status: 'disabled' });
        const n = env.vendor.submits().length;
        for (const [what, r] of [
            ['submit', await submitTask(gw, env, { model: env.model }, { key: disabled.key })],
            ['view', await getTask(gw, disabled.key, id)],
            ['dynamic submit', await dyn(env, { model: env.model }, disabled.key)],
            ['dynamic query', await dyn(env, { ids: [id] }, disabled.key)],
        ]) {
            assert.equal(r.status, 401, `${what}: ${r.status} ${r.text}`);
            assertError(r, 401, { code: 'invalid_token' });
        }
        await sleep(300);
        assert.equal(env.vendor.submits().length, n, 'nothing more was sent');
    });

    test('the group rate limit counts task requests: the third in a minute is 429', async () => {
        const env = await bound({}, { groups: ['default', 'tasklim'] });
        const user = await makeUser(gw, { group: 'tasklim' });
        const token = await makeKey(gw, user.id);
        const acct = { key: token.key };
        const first = await submitOk(gw, env, acct, { model: env.model }, 'first');
        assertOk(await getTask(gw, token.key, first.json.task_id), 'second request: a view');
        const r = await submitTask(gw, env, { model: env.model }, { key: token.key });
        assertError(r, 429, { code: 'rate_limit_exceeded' });
        const ra = Number(r.headers['retry-after']);
        assert.ok(ra >= 1 && ra <= 60, `Retry-After ${r.headers['retry-after']}`);
        assertError(await dyn(env, { model: env.model }, token.key), 429, { code: 'rate_limit_exceeded' });
        await sleep(300);
        assert.equal(env.vendor.submits().length, 1, 'limited submits sent nothing');
        /* another user of the group keeps its own budget */
        const other = await makeUser(gw, { group: 'tasklim' });
        const otherKey = await makeKey(gw, other.id);
        await submitOk(gw, env, { key: otherKey.key }, { model: env.model }, 'another user');
    });
});
