// The README's Tasks set-up, as written, with the example plugin
// docs/examples/my-video.js and its stand-in vendor
// docs/examples/video-vendor.mjs: upload, a type-61 channel bound to it,
// the per-second price, a submit through /v1/tasks/my-video, polling to
// SUCCESS, and the charge settled to the seconds the vendor reports.

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { assertOk, createDb, dropDb, startGateway, stopAll } from '../lib/harness.mjs';
import { account, expectUsed, uploadPlugin, waitFor, waitLedger } from '../lib/vendor.mjs';
import { startVideoVendor } from '../../docs/examples/video-vendor.mjs';

const EXAMPLES = path.join(path.dirname(new URL(import.meta.url).pathname), '../../docs/examples');
const USD = 500000;

describe('the example task plugin', { timeout: 120000 }, () => {
    let db, gw, vendor;

    before(async () => {
        db = await createDb();
        gw = await startGateway({ db, v8host: true, http: 'llmgw_task_poll_interval 200ms;' });
        vendor = await startVideoVendor({ port: 0, finishMs: 600 });
    });

    after(async () => {
        try {
            await stopAll(gw);
        } finally {
            await vendor?.close();
            await dropDb(db);
        }
    });

    test('my-video: uploaded, bound, priced per second; a task runs to SUCCESS and is settled', async () => {
        const up = await uploadPlugin(gw, fs.readFileSync(path.join(EXAMPLES, 'my-video.js'), 'utf8'));
        assert.equal(up.key, 'my-video');
        assertOk(await gw.admin('POST', '/api/channel', { name: 'video', type: 61,
            base_url: vendor.url, key: 'vendor-key', models: ['video-1'],
            settings: { task_plugin_key: 'my-video' } }));
        assertOk(await gw.admin('PUT', '/api/pricing',
            { 'my-video::video-1': { unit_prices: { seconds: 0.05 } } }));
        const acct = await account(gw);

        const submit = () => gw.req('POST', '/v1/tasks/my-video', { key: acct.key,
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ model: 'video-1', prompt: 'a red kite', duration: 8 }) });
        let r;
        await waitFor(async () => (r = await submit()).status === 200, 5000,
            { what: 'the plugin serves' });
        assert.match(r.json.task_id, /^task_/);
        assert.equal(r.json.status, 'SUBMITTED');

        let view;
        await waitFor(async () => {
            view = assertOk(await gw.req('GET', `/v1/tasks/${r.json.task_id}`, { key: acct.key })).json;
            return view.status === 'SUCCESS';
        }, 10000, { what: 'SUCCESS' });
        assert.equal(view.progress, '100%');
        assert.match(view.data.video_url, /^https:\/\/cdn\.example\/vid-.*\.mp4$/);

        /* reserved for the 8 s asked (not the plugin's 5 s default), settled
           to the 8 s made: 8 x 0.05 USD */
        const led = await waitLedger(db, r.json.task_id, ['reserve', 'settle']);
        assert.equal(led.reserve, Math.round(8 * 0.05 * USD));
        assert.equal(led.settle, 0);
        await expectUsed(gw, db, acct, Math.round(8 * 0.05 * USD));

        /* a form body reaches the plugin as its fields */
        const f = assertOk(await gw.req('POST', '/v1/tasks/my-video', { key: acct.key,
            headers: { 'Content-Type': 'application/x-www-form-urlencoded' },
            body: 'model=video-1&prompt=a+kite&duration=3' }));
        const fled = await waitLedger(db, f.json.task_id, ['reserve']);
        assert.equal(fled.reserve, Math.round(3 * 0.05 * USD));
    });
});
