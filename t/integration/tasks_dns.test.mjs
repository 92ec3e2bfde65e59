// Task requests to vendors, and chat requests to channels, named by host
// name: they are resolved with nginx's resolver (the http{} `resolver`
// directive), here a tiny DNS server on loopback that knows one name.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
    assertError, assertOk, createDb, dropDb, makeChannel, makeUserKey, settle, startGateway,
    stopAll, uniq,
} from '../lib/harness.mjs';
import { openaiChat, sendJson, startDns, startMock } from '../lib/mock.mjs';
import { expectUsed, startVendor, submitTask, taskSetup, waitStatus } from '../lib/vendor.mjs';

const NAME = 'vendor.llmgw.test';

describe('task vendors named by host name', () => {
    let db, gw, dns, vendor;

    before(async () => {
        dns = await startDns([NAME]);
        vendor = await startVendor();
        db = await createDb();
        gw = await startGateway({ db, v8host: true, http:
            `llmgw_task_poll_interval 200ms;\n  resolver 127.0.0.1:${dns.port} ipv6=off;` });
    });

    after(async () => {
        await stopAll(gw);
        await vendor?.close();
        await dns?.close();
        if (db) {
            await dropDb(db);
        }
    });

    test('the vendor host is resolved through the resolver; submit and poll reach it', async () => {
        const port = new URL(vendor.url).port;
        const named = { ...vendor, url: `http://${NAME}:${port}` };
        const env = await taskSetup(gw, { vendors: [named] });
        const r = await submitTask(gw, env, { model: env.model });
        assertOk(r, 'submit to a named vendor');
        assert.ok(dns.queries.some((q) => q.name === NAME), 'the name was looked up');
        assert.equal(vendor.submits().at(-1).headers.host, `${NAME}:${port}`);
        /* the mock answers polls IN_PROGRESS: the status moves only by a poll */
        await waitStatus(gw, env.acct.key, r.json.task_id, 'IN_PROGRESS', { ms: 10000 });
    });

    test('chat channels named by host name, with or without a trailing dot, are served', async () => {
        const up = await startMock((req, res, rec) => sendJson(res, 200,
            openaiChat({ model: rec.json.model, content: 'by name' })));
        try {
            const port = new URL(up.url).port;
            const plain = uniq('gpt-named');
            const dotted = uniq('gpt-dotted');
            await makeChannel(gw, { base_url: `http://${NAME}:${port}`, models: [plain] });
            /* the resolver drops the final dot; the worker must still find its answer */
            await makeChannel(gw, { base_url: `http://${NAME}.:${port}`, models: [dotted] });
            const { key } = await makeUserKey(gw);
            await settle();
            const pids = gw.workerPids().sort();
            for (let i = 0; i < 3; i++) {
                for (const model of [plain, dotted]) {
                    const r = await gw.chat(key, model);
                    assertOk(r, `chat to ${model}`);
                    assert.equal(r.json.choices[0].message.content, 'by name');
                }
            }
            assert.equal(up.requests.length, 6);
            assert.deepEqual(gw.workerPids().sort(), pids, 'no worker died');
        } finally {
            await up.close();
        }
    });

    test('a name the resolver does not know: 502 do_request_failed, nothing charged', async () => {
        const port = new URL(vendor.url).port;
        const env = await taskSetup(gw, { vendors: [{ ...vendor, url: `http://nowhere.llmgw.test:${port}` }] });
        const r = await submitTask(gw, env, { model: env.model });
        assertError(r, 502, { type: 'upstream_error', code: 'do_request_failed' });
        assert.match(r.json.error.message, /resolve/);
        await expectUsed(gw, db, env.acct, 0);
    });
});
