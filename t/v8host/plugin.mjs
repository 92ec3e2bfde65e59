// The plugin the v8_host tests load: a valid manifest (it passes the real
// validator), and buildSubmitRequest dispatching on ctx.op to the
// behaviour a test wants to see.

export const TEST_PLUGIN = String.raw`
// Words that must not trip the async/await/import scan:
// "await import async" in a comment, /* import x from 'y' */
const words = ['await', "async function", ` + '`import ${"await"}`' + String.raw`, /import|await/g];
const flags = { async: true, await: false, import: 1 };
const member = flags.async && flags.import;

export const meta = {
  apiVersion: 1,
  key: 'v8host-test',
  name: 'v8_host test plugin',
  version: '1.0.0',
  author: { name: 'llmgw tests' },
  models: ['test-model'],
  fetchMode: 'per_task',
  requiredCapabilities: ['json-clone@1'],
  routes: [{ method: 'POST', path: '/v8host-test/tasks', type: 'submit',
             decode: 'create', render: 'created' }],
};

function nest(levels, leaf) {
  let v = leaf;
  for (let i = 0; i < levels; i++) v = [v];
  return v;
}

const cloneCases = {
  depth32: () => nest(32, 1),
  depth33: () => nest(33, 1),
  nodes32768: () => new Array(32767).fill(0),
  nodes32769: () => new Array(32768).fill(0),
  bytesMax: () => 'x'.repeat(1048576 - 2),
  bytesOver: () => 'x'.repeat(1048576 - 1),
  undefinedMember: () => ({ a: { b: undefined } }),
  fn: () => ({ a: [1, () => 1] }),
  symbol: () => ({ s: Symbol('x') }),
  bigint: () => ({ n: 10n }),
  date: () => ({ when: new Date(0) }),
  map: () => ({ m: new Map() }),
  sparse: () => ({ list: [1, , 3] }),
  cycle: () => { const a = { b: { c: {} } }; a.b.c.back = a; return a; },
  nan: () => ({ x: NaN }),
  infinity: () => ({ x: -Infinity }),
  instance: () => ({ p: new (class Point { constructor() { this.x = 1; } })() }),
};

const ops = {
  echo: (ctx) => ({ url: 'https://example.com/submit', body: ctx.body }),
  mutate: (ctx) => { ctx.model = 'changed'; return {}; },
  mutateDeep: (ctx) => { ctx.body.list.push(4); return {}; },
  loop: () => { for (;;) {} },
  bomb: () => { const a = []; for (;;) a.push(new Array(10000).fill('x' + a.length)); },
  eval: () => eval('1 + 1'),
  newFunction: () => new Function('return 1')(),
  functionCtor: () => (function () {}).constructor('return 1')(),
  globals: () => {
    const names = ['fetch', 'require', 'process', 'setTimeout', 'setInterval',
                   'queueMicrotask', 'WebAssembly', 'SharedArrayBuffer', 'Atomics',
                   'utils'];
    const out = {};
    for (const n of names) out[n] = typeof globalThis[n];
    return out;
  },
  writeUtils: () => { utils.hmacSHA256 = null; return {}; },
  returnFunction: () => ({ url: 'x', foo: () => 1 }),
  returnCycle: () => { const a = { b: {} }; a.b.c = a; return a; },
  returnBigInt: () => ({ n: [1n] }),
  returnUndefined: () => undefined,
  returnNull: () => null,
  throwSecret: (ctx) => {
    throw new Error('upstream refused Bearer ' + ctx.token + ' with key ' + ctx.key
                    + ' and {"api_key": "' + ctx.apiKey + '"} id ' + ctx.aws);
  },
  throwLong: () => { throw new Error('x'.repeat(10000)); },
  throwString: () => { throw 'plain string thrown'; },
  util: (ctx) => {
    try {
      const fn = ctx.fn === 'json.clone' ? utils.json.clone : utils[ctx.fn];
      return { value: fn(...ctx.args) };
    } catch (e) {
      return { error: e.name + ': ' + e.message };
    }
  },
  clone: (ctx) => {
    try {
      const copy = utils.json.clone(cloneCases[ctx.case]());
      return { ok: true, size: JSON.stringify(copy).length };
    } catch (e) {
      return { error: e.name + ': ' + e.message };
    }
  },
  cloneProto: () => {
    const src = JSON.parse('{"__proto__": {"polluted": true}, "a": 1}');
    const copy = utils.json.clone(src);
    return {
      keys: Object.keys(copy),
      ownProto: Object.prototype.hasOwnProperty.call(copy, '__proto__'),
      plainPrototype: Object.getPrototypeOf(copy) === Object.prototype,
      polluted: copy.polluted === true,
      inner: copy['__proto__'],
    };
  },
  cloneFrozenArgs: (ctx) => {
    const copy = utils.json.clone(ctx.body);
    copy.list.push(4);
    copy.extra = true;
    return { copy, original: ctx.body, sameObject: copy === ctx.body };
  },
};

export function buildSubmitRequest(ctx) { return ops[ctx.op](ctx); }
export function parseSubmitResponse(ctx, res) { return { taskId: 'task-1' }; }
export function parseTaskResult(ctx, body) { return { status: 'SUCCESS' }; }
export function buildQueryRequest(ctx) { return { url: 'https://example.com/q/' + ctx.taskId }; }

export const native = {
  create(req) { return { kind: 'submit', model: 'test-model' }; },
  created(req, task) { return { id: task.task_id, self: this === native }; },
};
`;

// Minimal valid plugin with a given extra body (for the rejection tests).
export function pluginWith(extra) {
  return `${extra}
export const meta = { apiVersion: 1, key: 'v8host-small', name: 'Small',
  version: '1.0.0', author: { name: 'tests' }, models: ['m'], fetchMode: 'per_task' };
export function buildSubmitRequest(ctx) { return { url: 'https://example.com' }; }
export function parseSubmitResponse() { return { taskId: '1' }; }
export function parseTaskResult() { return { status: 'SUCCESS' }; }
export function buildQueryRequest() { return { url: 'https://example.com/q' }; }
`;
}

// A plugin whose buildSubmitRequest reports what its utils hold.  caps:
// the requiredCapabilities expression as source text (null: none);
// comment: text put in a comment of the source.
export function capabilityPlugin(caps, comment = '') {
  return `// ${comment}
export const meta = { apiVersion: 1, key: 'v8host-caps', name: 'Caps',
  version: '1.0.0', author: { name: 'tests' }, models: ['m'], fetchMode: 'per_task'${
    caps === null ? '' : `,\n  requiredCapabilities: ${caps}`} };
const atLoad = typeof utils.json;
export function buildSubmitRequest() {
  return { atLoad, json: typeof utils.json,
           clone: utils.json ? utils.json.clone({ a: [1] }) : null,
           has: utils.hasCapability('json-clone@1') };
}
export function parseSubmitResponse() { return { taskId: '1' }; }
export function parseTaskResult() { return { status: 'SUCCESS' }; }
export function buildQueryRequest() { return { url: 'https://example.com/q' }; }
`;
}
