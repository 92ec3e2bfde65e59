// A node's view of a key's balance follows the database's order of writes:
// a key lookup that read the balance before a ledger write committed must
// not bring back a balance from before that write once the write's charge
// has left what the node holds as pending (that overspends the key).

import assert from 'node:assert/strict';
import { once } from 'node:events';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, conninfoFor, createDb, eventually, hex, makeChannel,
    makeUserKey, psql,
    settle, sleep, startGateway, stopAll, tearDown, uniq,
} from '../lib/harness.mjs';
import { openaiChat, sendJson, startMock } from '../lib/mock.mjs';

describe('balances in the shared zone', { timeout: 120000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-bal');

    before(async () => {
        db = await createDb();
        mock = await startMock((req, res) => sendJson(res, 200, openaiChat({
            usage: { prompt_tokens: 25, completion_tokens: 25 } })));
        gw = await startGateway({
            db, workers: 1,
            http: 'llmgw_flush_interval 1s; llmgw_key_cache_ttl 3s;',
        });
        await makeChannel(gw, { base_url: mock.url, models: [M], free: false });
        assertOk(await gw.admin('PUT', '/api/pricing', { [M]: { ratio: 1, completion_ratio: 1 } }));
        await settle();
    });

    after(() => tearDown(db, [gw], [mock]));

    test('a lookup that read the balance before a ledger write does not undo the write', async () => {
        const { key, token } = await makeUserKey(gw, {},
            { unlimited_quota: false, remain_quota: 1100 });
        const small = { extra: { max_tokens: 40 } };
        const dbRemain = async () => Number(await psql(db.conninfo,
            `select remain_quota from tokens where id = ${token.id}`));
        /* what the node lets the key spend, from its refusal of a huge request */
        const avail = async () => {
            const r = await gw.chat(key, M, { extra: { max_tokens: 1e8 } });
            assert.equal(r.status, 403, r.text);
            return Number(/remaining quota \((-?\d+)\)/.exec(r.text)[1]);
        };

        /* the next ledger write sleeps 4 s inside PostgreSQL */
        await psql(db.conninfo, `
            CREATE TABLE slow_flush (x int); INSERT INTO slow_flush VALUES (1);
            CREATE FUNCTION slow_flush_t() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF EXISTS (SELECT 1 FROM slow_flush) THEN
                    DELETE FROM slow_flush; PERFORM pg_sleep(4);
                END IF;
                RETURN NULL;
            END $$;
            CREATE TRIGGER slow_flush_t AFTER INSERT ON logs
                FOR EACH STATEMENT EXECUTE FUNCTION slow_flush_t();`);
        const sleeping = async () => Number(await psql(db.conninfo,
            "select count(*) from pg_stat_activity where datname = current_database() " +
            "and wait_event = 'PgSleep'")) > 0;

        const t0 = Date.now();
        for (let i = 0; i < 20; i++) {
            assertOk(await gw.chat(key, M, small));    /* 20 x 50 = 1000 */
        }
        for (let i = 0; i < 100 && !(await sleeping()); i++) {
            await sleep(50);
        }
        assert.ok(await sleeping(), 'the ledger write is under way');

        /* the cached key is older than its ttl: this reads it again, from
           before the write commits */
        await sleep(Math.max(0, t0 + 3300 - Date.now()));
        await avail();
        for (let i = 0; i < 200 && (await sleeping()); i++) {
            await sleep(50);
        }

        /* rows of requests after the first tick go in a later write */
        const d = await eventually(async () => {
            const v = await dbRemain();
            assert.equal(v, 100);
            return v;
        });
        const a = await avail();
        assert.ok(a <= d, `the node lets the key spend ${a}, the database holds ${d}`);

        /* and a burst can spend no more than there is */
        const rs = await Promise.all(Array.from({ length: 10 }, () => gw.chat(key, M, small)));
        assert.ok(rs.filter((r) => r.status === 200).length <= 2);
        await sleep(2500);
        assert.ok(await dbRemain() >= 0, 'never below 0');
    });

    test('a key lookup sent on a connection the server just ended is sent again', async () => {
        for (let i = 0; i < 5; i++) {
            const { key } = await makeUserKey(gw);
            await psql(conninfoFor('postgres'), 'select pg_terminate_backend(pid) ' +
                `from pg_stat_activity where datname = '${db.name}'`);
            assertOk(await gw.chat(key, M), `try ${i}`);
        }
    });

    for (const back of [true, false]) {
        test(`a stopping worker with a statement waiting for a connection: the database ${
            back ? 'back, it connects' : 'still refusing, it answers at once'}`, async () => {
            /* its connections down long enough to wait 2 s between tries */
            const g = await startGateway({
                db, workers: 1, rootToken: gw.rootToken,
                http: 'llmgw_flush_interval 1s; llmgw_pg_timeout 8s;',
            });
            const admin = conninfoFor('postgres');
            const allow = () => psql(admin,
                `ALTER DATABASE ${db.name} ALLOW_CONNECTIONS true`);
            try {
                await psql(admin, `ALTER DATABASE ${db.name} ALLOW_CONNECTIONS false`);
                await psql(admin, 'select pg_terminate_backend(pid) from pg_stat_activity ' +
                    `where datname = '${db.name}'`);
                await sleep(3500);
                /* an unknown key: its lookup waits for a connection */
                const lookup = g.chat(`sk-${hex(24)}`, M, { timeoutMs: 20000 });
                await sleep(200);
                if (back) {
                    await allow();
                }
                const t0 = Date.now();
                await g.stop();
                const took = Date.now() - t0;
                if (back) {
                    assertError(await lookup, 401, { message: /Invalid token/ });
                } else {
                    const r = await lookup;
                    assert.ok(r.status >= 500, `${r.status} ${r.text}`);
                    assertError(r, r.status);
                }
                assert.equal(g.killed, false);
                /* well before the statement's 8 s */
                assert.ok(took < 4900, `quit took ${took} ms`);
            } finally {
                await allow();
                await stopAll(g);
            }
        });
    }

    test('a stopping worker whose connections the server ended connects again for a statement queued later', async () => {
        const g = await startGateway({
            db, workers: 1, rootToken: gw.rootToken,
            http: 'llmgw_flush_interval 1s; llmgw_pg_timeout 8s;',
        });
        const sock = net.connect(g.port, '127.0.0.1');
        try {
            await once(sock, 'connect');
            let text = '';
            sock.on('data', (d) => { text += d; });
            /* a request under way (not an idle connection) when told to stop */
            sock.write('POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n');
            await sleep(200);
            const t0 = Date.now();
            const stopping = g.stop();
            await sleep(300);
            /* nothing queued: the worker's connections end and stay down */
            await psql(conninfoFor('postgres'), 'select pg_terminate_backend(pid) ' +
                `from pg_stat_activity where datname = '${db.name}'`);
            await sleep(500);
            /* an unknown key: a lookup queued now */
            const body = JSON.stringify({ model: M, messages: [{ role: 'user', content: 'hi' }] });
            sock.write(`Authorization: Bearer sk-${hex(24)}\r\n` +
                'Content-Type: application/json\r\n' +
                `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
            await stopping;
            const took = Date.now() - t0;
            assert.match(text, /^HTTP\/1.1 401 /, text);
            assert.equal(g.killed, false);
            assert.ok(took < 4900, `quit took ${took} ms`);
        } finally {
            sock.destroy();
            await stopAll(g);
        }
    });

    test('a zone full of rate-limit logs does not give a spent key its old balance back', async () => {
        /* a small zone, and a limit whose logs (one per user) fill it */
        const g = await startGateway({
            db, workers: 1, rootToken: gw.rootToken,
            http: 'llmgw_zone_size 128k; llmgw_flush_interval 200ms;',
        });
        try {
            assertOk(await g.admin('PUT', '/api/rate_limit',
                { default: { duration_minutes: 60, total: 2000, success: 0 } }));
            const others = [];
            for (let i = 0; i < 40; i++) {
                others.push((await makeUserKey(g)).key);
            }
            const { key, token } = await makeUserKey(g, {},
                { unlimited_quota: false, remain_quota: 1100 });
            await settle();
            const small = { extra: { max_tokens: 40 } };   /* 50 each */
            /* served while the rest covers a reservation (about 50, with
               the model name's length) */
            let n = 0;
            while (n < 30 && (await g.chat(key, M, small)).status === 200) {
                n++;
            }
            assert.ok(n >= 20 && n <= 22, `${n} served`);
            const left = 1100 - n * 50;
            await eventually(async () => assert.equal(Number(await psql(db.conninfo,
                `select remain_quota from tokens where id = ${token.id}`)), left));
            for (const k of others) {
                assertOk(await g.chat(k, M, small));
            }
            assert.match(g.errorLog(), /rate limit window .* was dropped/,
                'the zone filled up');
            const burst = await Promise.all(Array.from({ length: 10 },
                () => g.chat(key, M, small)));
            assert.deepEqual(burst.filter((r) => r.status === 200), [],
                'nothing more is served');
            await sleep(1000);
            assert.equal(Number(await psql(db.conninfo,
                `select remain_quota from tokens where id = ${token.id}`)), left);
        } finally {
            assertOk(await gw.admin('PUT', '/api/rate_limit', { default: null }));
            await stopAll(g);
        }
    });

    test('a key whose rest is held by requests under way is refused 403, not as an invalid key', async () => {
        const slow = await startMock(async (req, res) => {
            await sleep(1500);
            sendJson(res, 500, { error: { message: 'down', type: 'server_error' } });
        });
        try {
            const m = uniq('gpt-held');
            await makeChannel(gw, { base_url: slow.url, models: [m], free: false });
            assertOk(await gw.admin('PUT', '/api/pricing', { [m]: { ratio: 1, completion_ratio: 1 } }));
            await settle();
            const small = { extra: { max_tokens: 40 } };
            /* what one request reserves, from a refusal that says it */
            const probe = await makeUserKey(gw, {}, { unlimited_quota: false, remain_quota: 1 });
            const refused = assertError(await gw.chat(probe.key, m, small), 403,
                { code: 'pre_consume_token_quota_failed' });
            const held = Number(/reservation \((\d+)\)/.exec(refused.message)[1]);
            /* five of them hold the whole rest */
            const { key } = await makeUserKey(gw, {},
                { unlimited_quota: false, remain_quota: 5 * held });
            const first = Array.from({ length: 5 }, () => gw.chat(key, m, small));
            await sleep(500);
            const r = await gw.chat(key, m, small);
            assertError(r, 403, { code: 'pre_consume_token_quota_failed' });
            for (const f of await Promise.all(first)) {
                assertError(f, 500, { type: 'upstream_error' });
            }
            /* the failures gave the holds back */
            assertError(await gw.chat(key, m, small), 500, { type: 'upstream_error' });
        } finally {
            await slow.close();
        }
    });

    test('rows a stopping worker cannot write are said so', async () => {
        /* a key cached for longer than this test can take on a busy
           machine: the requests below are served without the database */
        const lone = await startGateway({
            db, workers: 1, rootToken: gw.rootToken,
            http: 'llmgw_flush_interval 1s; llmgw_key_cache_ttl 120s;',
        });
        try {
            const { key } = await makeUserKey(lone);
            assertOk(await lone.chat(key, M));    /* the key is cached */
            const admin = conninfoFor('postgres');
            await psql(admin, `ALTER DATABASE ${db.name} ALLOW_CONNECTIONS false`);
            try {
                await psql(admin, 'select pg_terminate_backend(pid) from pg_stat_activity ' +
                    `where datname = '${db.name}'`);
                for (let i = 0; i < 3; i++) {
                    assertOk(await lone.chat(key, M));
                }
                await lone.stop();
                assert.match(lone.errorLog(), /\[crit\].*ledger rows left queued at exit/);
            } finally {
                await psql(admin, `ALTER DATABASE ${db.name} ALLOW_CONNECTIONS true`);
            }
        } finally {
            await stopAll(lone);
        }
    });
});
