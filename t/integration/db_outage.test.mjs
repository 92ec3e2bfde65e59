// The database goes away under a running gateway: keys a worker has read
// go on being served from their records (llmgw_key_cache_stale), with
// exact balances, and every charge reaches the ledger once the database
// is back, whichever worker of the node read the key; a key no worker has
// read is 503.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, eventually, makeChannel,
    makeUserKey, psql, startGateway, stopAll, uniq,
} from '../lib/harness.mjs';
import { startMock } from '../lib/mock.mjs';
import { startPgProxy } from '../lib/pgproxy.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/* echo's usage: 10 + 20 tokens at ratio 1 */
const PER_CALL = 30;

describe('database outage', { timeout: 120000 }, () => {
    let db, px, mock, gw, strict;

    before(async () => {
        db = await createDb();
        px = await startPgProxy();
        mock = await startMock();
        const viaProxy = { ...db, conninfo: px.conninfo(db.name) };
        const http = 'llmgw_key_cache_ttl 1s; llmgw_pg_timeout 2s;';
        gw = await startGateway({ db: viaProxy, workers: 1, http });
        strict = await startGateway({ db: viaProxy, workers: 1,
            rootToken: gw.rootToken,
            http: `${http} llmgw_key_cache_stale 0;` });
    });

    after(async () => {
        try {
            await px?.restore().catch(() => {});
            await stopAll(gw, strict);
        } finally {
            await mock?.close();
            await px?.close();
            await dropDb(db);
        }
    });

    test('a key read before the outage is served from its record, charged once, and an unread key is 503', async () => {
        const model = uniq('gpt-out');
        await makeChannel(gw, { base_url: mock.url, models: [model], free: false });
        assertOk(await gw.admin('PUT', '/api/pricing',
            { [model]: { ratio: 1, completion_ratio: 1 } }));
        const a = await makeUserKey(gw, {}, { unlimited_quota: false, remain_quota: 100000 });
        const b = await makeUserKey(gw);
        await eventually(async () => assertOk(await gw.chat(a.key, model)), { ms: 3000 });
        await eventually(async () => assertOk(await strict.chat(a.key, model)), { ms: 3000 });
        let served = 2;

        /* older than llmgw_key_cache_ttl: each gateway would read it again */
        await sleep(1500);
        await px.cut();

        const t0 = Date.now();
        assertOk(await gw.chat(a.key, model), 'first request in the outage');
        served++;
        for (let i = 0; i < 5; i++) {
            assertOk(await gw.chat(a.key, model), `request ${i} in the outage`);
            served++;
        }
        assert.ok(Date.now() - t0 < 4000, `served in ${Date.now() - t0} ms`);

        assertError(await gw.chat(b.key, model), 503, { code: 'service_unavailable' });
        assertError(await strict.chat(a.key, model), 503, { code: 'service_unavailable' });
        /* no key has this shape: refused without asking the database */
        for (const k of ['sk-short', `${a.key}0`, a.key.toUpperCase().replace('SK-', 'sk-')]) {
            const r = await gw.chat(k, model);
            assertError(r, 401, { code: 'invalid_token' });
            assert.match(r.json.error.message, /^Invalid token/);
        }
        assert.match(gw.errorLog(), new RegExp(
            `the database cannot be read: key ${a.token.id} is served from its record of \\d+ ms ago`));
        assert.doesNotMatch(gw.errorLog(), new RegExp(a.key.slice(3, 20)));

        await px.restore();
        await eventually(async () => assertOk(await gw.chat(b.key, model)), { ms: 8000 });

        /* every charge of key a written once, the balance to the unit */
        await eventually(async () => {
            const rows = await psql(db.conninfo, `select count(*), count(distinct request_id),
                coalesce(sum(quota), 0) from logs where token_id = ${a.token.id} and type = 'consume'`);
            assert.equal(rows, `${served}|${served}|${served * PER_CALL}`);
            const tok = await gw.admin('GET', `/api/token/${a.token.id}`);
            assert.equal(tok.json.remain_quota, 100000 - served * PER_CALL);
            assert.equal(tok.json.used_quota, served * PER_CALL);
        }, { ms: 8000 });
    });

    test('a record older than llmgw_key_cache_ttl + llmgw_key_cache_stale is not used', async () => {
        const model = uniq('gpt-out2');
        await makeChannel(gw, { base_url: mock.url, models: [model] });
        const a = await makeUserKey(gw);
        const late = await startGateway({ db: { ...db, conninfo: px.conninfo(db.name) },
            workers: 1, rootToken: gw.rootToken,
            http: 'llmgw_key_cache_ttl 1s; llmgw_pg_timeout 1s; llmgw_key_cache_stale 4s;' });
        try {
            /* the record is read after sent and before ok */
            let sent = 0;
            await eventually(async () => {
                sent = Date.now();
                assertOk(await late.chat(a.key, model));
            }, { ms: 3000 });
            const ok = Date.now();
            assert.ok(ok - sent < 1000, `read in ${ok - sent} ms`);
            await sleep(1200);
            await px.cut();
            /* at most about 2.5 s old: within 1 s + 4 s */
            assertOk(await late.chat(a.key, model), 'within ttl + stale');
            await sleep(Math.max(0, ok + 5500 - Date.now()));
            assertError(await late.chat(a.key, model), 503, { code: 'service_unavailable' });
        } finally {
            await px.restore();
            await stopAll(late);
        }
    });

    test('a key one worker read is served by every worker; a key changed since is not', async () => {
        /* two workers, each with its own listening socket: the kernel
           spreads new connections (the harness opens one per request)
           over both */
        const two = await startGateway({ db: { ...db, conninfo: px.conninfo(db.name) },
            workers: 2, listen: 'reuseport', rootToken: gw.rootToken,
            http: 'llmgw_key_cache_ttl 1s; llmgw_pg_timeout 2s;' });
        try {
            const model = uniq('gpt-out3');
            await makeChannel(two, { base_url: mock.url, models: [model] });
            const ready = await makeUserKey(two);
            await eventually(async () => assertOk(await two.chat(ready.key, model)), { ms: 3000 });

            /* read by one worker, then disabled */
            const gone = await makeUserKey(two);
            assertOk(await two.chat(gone.key, model));
            assertOk(await two.admin('PATCH', `/api/token/${gone.token.id}`, { status: 'disabled' }));
            await sleep(600);

            /* read by exactly one worker */
            const a = await makeUserKey(two);
            assertOk(await two.chat(a.key, model));
            await sleep(1500);
            await px.cut();

            const pids = new Set();
            for (let i = 0; i < 12; i++) {
                assertOk(await two.chat(a.key, model), `request ${i} in the outage`);
            }
            const said = new RegExp(`\\[warn\\] (\\d+)#\\d+: .*the database cannot be read: key ${a.token.id} is served`, 'g');
            for (const m of two.errorLog().matchAll(said)) {
                pids.add(m[1]);
            }
            assert.equal(pids.size, 2, `served by ${[...pids].join(', ')}`);

            for (let i = 0; i < 6; i++) {
                assertError(await two.chat(gone.key, model), 503, { code: 'service_unavailable' });
            }
        } finally {
            await px.restore();
            await stopAll(two);
        }
    });

    test('llmgw_key_cache_stale takes 0 to 366d', async () => {
        await assert.rejects(startGateway({ db, workers: 1,
            http: 'llmgw_key_cache_stale 400d;' }), /must be between 0 and 366d/);
    });
});
