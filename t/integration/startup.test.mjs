// A worker new from a reload loads its configuration before it can serve:
// requests that reach it first wait for that load instead of being refused.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, test } from 'node:test';

import {
    assertOk, createDb, makeChannel, makeUserKey, psql,
    settle, sleep, startGateway, tearDown, uniq,
} from '../lib/harness.mjs';
import { startMock } from '../lib/mock.mjs';

describe('a new worker and its first configuration', { timeout: 120000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-start');

    before(async () => {
        db = await createDb();
        mock = await startMock();
        gw = await startGateway({ db });
        await makeChannel(gw, { base_url: mock.url, models: [M] });
        await settle();
    });

    after(() => tearDown(db, [gw], [mock]));

    test('requests during a slow first load wait for it, then are served', async () => {
        const { key } = await makeUserKey(gw);
        assertOk(await gw.chat(key, M));

        /* the configuration cannot be read while this transaction holds
           the channels table */
        const locker = spawn('psql', ['-X', '-q', '-v', 'ON_ERROR_STOP=1', db.conninfo],
            { stdio: ['pipe', 'ignore', 'inherit'] });
        const locked = new Promise((resolve) => locker.on('exit', resolve));
        try {
            locker.stdin.write('BEGIN; LOCK TABLE channels IN ACCESS EXCLUSIVE MODE;\n');
            for (let i = 0; i < 50; i++) {
                const n = await psql(db.conninfo, "select count(*) from pg_locks l " +
                    "join pg_class c on c.oid = l.relation where c.relname = 'channels' " +
                    "and l.mode = 'AccessExclusiveLock' and l.granted");
                if (String(n).trim() === '1') {
                    break;
                }
                await sleep(100);
            }

            await gw.reload();
            const t0 = Date.now();
            const pending = [gw.chat(key, M), gw.admin('GET', '/api/pricing')];
            await sleep(1000);
            locker.stdin.end('COMMIT;\n');

            const [chat, admin] = await Promise.all(pending);
            assertOk(chat, 'chat during the first load');
            assertOk(admin, 'admin during the first load');
            assert.ok(Date.now() - t0 >= 900, 'they waited for the load');
            /* each load is an info line naming its revision */
            assert.match(gw.errorLog(), /\[info\] .*llmgw: configuration revision \d+ loaded/);
        } finally {
            locker.stdin.end();
            await Promise.race([locked, sleep(5000)]);
            locker.kill();
        }
    });
});

describe('with the error log at debug level', { timeout: 120000 }, () => {
    let db, gw, mock;
    const M = uniq('gpt-debug');

    before(async () => {
        db = await createDb();
        mock = await startMock();
        /* the helper too: its kick and the task poll timer are the module's */
        gw = await startGateway({ db, errorLevel: 'debug', v8host: true });
        await makeChannel(gw, { base_url: mock.url, models: [M] });
        await settle();
    });

    /* stopAll() fails on the [alert] "worker process exited on signal 11"
       lines a crashed worker leaves */
    after(() => tearDown(db, [gw], [mock]));

    test('the module timers log their debug lines and the workers serve', async () => {
        const { key } = await makeUserKey(gw);
        assertOk(await gw.chat(key, M));
        /* the ledger flush and configuration refresh timers fire again */
        await sleep(1500);
        assertOk(await gw.chat(key, M));
        assert.match(gw.errorLog(), /event timer add: -1: /);
        assert.doesNotMatch(gw.errorLog(), /exited on signal/);
    });
});
