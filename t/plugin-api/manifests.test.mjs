// The manifest validator (src/manifest.cpp) and the published JSON Schema
// (docs/plugin-api/manifest.schema.json) must agree: every example in
// manifests/valid is accepted by both, every one in manifests/invalid is
// rejected by both.  The examples exercise the structural rules, the ones
// JSON Schema can express; each is run through the C validator with the
// exports its declarations call for, so only the manifest decides.
// Accepted manifests are also checked for a stable normal form: it passes
// the schema and validates again to itself.
//
//   node --test t/plugin-api/          (from the repository root)
//
// Builds build/unit/libllmgw_core.a (make) and build/plugin-api/validate.

import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { checkSchema, equal, validate } from './schema-subset.mjs';

const HERE = dirname(fileURLToPath(import.meta.url));
const REPO = resolve(HERE, '../..');
const BIN = join(REPO, 'build/plugin-api/validate');
const SCHEMA = JSON.parse(readFileSync(join(REPO, 'docs/plugin-api/manifest.schema.json'), 'utf8'));

const list = (v) => (Array.isArray(v) ? v : []);

// The exports a plugin with this manifest needs (spelled as the manifest
// spells its protocols, as a marketplace plugin would).
export function exportsFor(meta) {
    const ex = new Set(['buildSubmitRequest', 'parseSubmitResponse', 'parseTaskResult']);

    if (meta?.fetchMode === 'batch') {
        ex.add('buildBatchQueryRequest');
        ex.add('parseBatchResult');
    } else {
        ex.add('buildQueryRequest');
    }

    for (const r of list(meta?.routes)) {
        for (const f of ['decode', 'render']) {
            if (typeof r?.[f] === 'string') ex.add(`native.${r[f]}`);
        }
    }

    for (const c of list(meta?.protocols)) {
        const name = typeof c === 'string' ? c : c?.name;
        if (typeof name !== 'string') continue;
        const base = `protocols.${name}.`;
        ex.add(`${base}decodeRequest`);
        if (!name.endsWith('_responses')) {
            ex.add(`${base}render`);
            continue;
        }
        const s = c?.supports;
        const on = (m) => (Array.isArray(s) ? s.includes(m) : s?.[m] === true);
        if (on('stream')) ex.add(`${base}renderEvents`);
        if (on('sync') || on('background')) ex.add(`${base}renderFinal`);
    }

    if (list(meta?.submitResponseTypes).includes('sse')) {
        ex.add(list(meta?.requiredCapabilities).includes('submit-sse-delta@1')
            ? 'parseSubmitEventDelta' : 'parseSubmitEvent');
    }

    return [...ex];
}

function runC(file, exports) {
    const r = spawnSync(BIN, [file, JSON.stringify(exports)], { encoding: 'utf8' });
    if (r.status !== 0 && r.status !== 1) {
        throw new Error(`${BIN} ${file}: exit ${r.status}: ${r.stderr}`);
    }
    const out = JSON.parse(r.stdout);
    assert.equal(out.ok, r.status === 0);
    return out;
}

before(() => {
    execFileSync('make', ['--no-print-directory', '-s', 'build/unit/libllmgw_core.a'],
        { cwd: REPO, stdio: 'inherit' });
    mkdirSync(dirname(BIN), { recursive: true });
    execFileSync('gcc', ['-std=gnu11', '-O1', '-g', '-Wall', '-Wextra', '-Isrc',
        '-o', BIN, 't/plugin-api/validate.c', 'build/unit/libllmgw_core.a',
        '-ljansson', '-lcrypto', '-lstdc++', '-lm', '-pthread'],
    { cwd: REPO, stdio: 'inherit' });
});

test('the schema uses only keywords the subset validator knows', () => {
    checkSchema(SCHEMA);
    assert.equal(SCHEMA.$schema, 'https://json-schema.org/draft/2020-12/schema');
});

for (const kind of ['valid', 'invalid']) {
    const dir = join(HERE, 'manifests', kind);
    const files = readdirSync(dir).filter((f) => f.endsWith('.json')).sort();

    test(`manifests/${kind} is not empty`, () => assert.ok(files.length > 0));

    for (const f of files) {
        test(`${kind}/${f}: validator and schema ${kind === 'valid' ? 'accept' : 'reject'}`, () => {
            const file = join(dir, f);
            const meta = JSON.parse(readFileSync(file, 'utf8'));
            const c = runC(file, exportsFor(meta));
            const s = validate(SCHEMA, meta);
            const detail = `\n  validator: ${JSON.stringify(c.errors ?? 'accepted')}` +
                `\n  schema:    ${JSON.stringify(s.length ? s : 'accepted')}`;

            assert.equal(c.ok, kind === 'valid', `validator disagrees${detail}`);
            assert.equal(s.length === 0, kind === 'valid', `schema disagrees${detail}`);

            if (kind === 'valid') {
                // the normal form uses spec names and passes both again
                const norm = c.normalized;
                assert.deepEqual(validate(SCHEMA, norm), [], 'normalised manifest fails the schema');
                const again = join(dirname(BIN), `normalized-${f}`);
                writeFileSync(again, JSON.stringify(norm));
                const c2 = runC(again, exportsFor(norm));
                assert.ok(c2.ok, `normalised manifest rejected: ${JSON.stringify(c2.errors)}`);
                assert.ok(equal(c2.normalized, norm), 'normalisation is not idempotent');
                for (const p of list(norm.protocols)) {
                    assert.ok(!String(p.name).startsWith('openai_'), 'alias left in the normal form');
                }
                assert.ok(!list(norm.upstreams).includes('new_api'), 'new_api left in the normal form');
            }
        });
    }
}
