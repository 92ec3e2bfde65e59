// Uploads larger than client_body_buffer_size: nginx spools them to its
// temp file and the task engine maps them from there; the vendor still gets
// every byte, and a spooled JSON body is read as well as a small one.

import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';

import {
    assertOk, createDb, dropDb, startGateway, stopAll,
} from '../lib/harness.mjs';
import {
    multipartBody, parseMultipart, startVendor, submitTask, taskSetup,
} from '../lib/vendor.mjs';

describe('spooled uploads', () => {
    let db, gw, vendor;

    before(async () => {
        db = await createDb();
        gw = await startGateway({
            db, v8host: true, http: 'llmgw_task_poll_interval 200ms;',
            /* a 16k buffer: anything larger is spooled to a temp file */
            server: 'client_body_buffer_size 16k; client_max_body_size 8m;',
        });
        vendor = await startVendor();
    });

    after(async () => {
        await stopAll(gw);
        await vendor?.close();
        if (db) {
            await dropDb(db);
        }
    });

    test('a 3 MB multipart upload reaches the vendor byte-identical', async () => {
        const env = await taskSetup(gw, { vendors: [vendor] });
        const files = [
            { name: 'image[]', filename: 'big.bin', type: 'application/octet-stream',
              data: randomBytes(3 * 1024 * 1024) },
            { name: 'image[]', filename: 'small.png', type: 'image/png',
              data: randomBytes(100) },
        ];
        const mp = multipartBody([['model', env.model], ['behave', 'multipart']], files);
        assert.ok(mp.body.length > 16 * 1024);
        const before = vendor.requests.length;
        const r = await gw.req('POST', `/${env.key}/v1/edit`, {
            key: env.acct.key, body: mp.body, timeoutMs: 30000,
            headers: { 'Content-Type': mp.contentType },
        });
        assertOk(r, 'spooled multipart submit');

        const sub = vendor.requests.slice(before).find((q) => q.method === 'POST');
        const parts = parseMultipart(sub.body, sub.headers['content-type']);
        const images = parts.filter((p) => p.name === 'image');
        assert.equal(images.length, 2);
        assert.ok(images[0].data.equals(files[0].data), 'the big file is byte-identical');
        assert.ok(images[1].data.equals(files[1].data), 'the small file is byte-identical');
        const decoded = JSON.parse(parts.find((p) => p.name === 'decoded').data.toString());
        assert.equal(decoded.files[0].size, files[0].data.length);
    });

    test('a spooled JSON body is read like a small one', async () => {
        const env = await taskSetup(gw, { vendors: [vendor] });
        const prompt = 'x'.repeat(64 * 1024);
        const r = await submitTask(gw, env, { model: env.model, prompt });
        assertOk(r, 'spooled JSON submit');
        const sub = vendor.submits().find((q) => q.json?.input?.prompt === prompt);
        assert.ok(sub, 'the vendor got the whole prompt');
    });
});
