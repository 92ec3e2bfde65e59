// A small JSON Schema (draft 2020-12) validator for the keywords
// docs/plugin-api/manifest.schema.json uses.  An unknown keyword is an
// error, so the schema can never lean on something ignored here.
//
//   validate(schema, value) -> [] or ["<instance path>: <keyword> ...", ...]

const ANNOTATIONS = new Set([
    '$schema', '$id', '$comment', 'title', 'description', 'default',
    'examples', '$defs',
]);

const KEYWORDS = new Set([
    '$ref', 'type', 'const', 'enum', 'pattern', 'minLength', 'maxLength',
    'minimum', 'maximum', 'minItems', 'maxItems', 'uniqueItems', 'items',
    'properties', 'required', 'additionalProperties', 'propertyNames',
    'minProperties', 'maxProperties', 'allOf', 'anyOf', 'oneOf', 'not',
    'if', 'then', 'else',
]);

function typeOf(v) {
    if (v === null) return 'null';
    if (Array.isArray(v)) return 'array';
    return typeof v;            // object, string, number, boolean
}

function hasType(v, t) {
    switch (t) {
    case 'integer': return typeof v === 'number' && Number.isInteger(v);
    case 'number': return typeof v === 'number' && Number.isFinite(v);
    default: return typeOf(v) === t;
    }
}

export function equal(a, b) {
    if (a === b) return true;
    if (typeOf(a) !== typeOf(b)) return false;
    if (Array.isArray(a)) {
        return a.length === b.length && a.every((x, i) => equal(x, b[i]));
    }
    if (typeOf(a) === 'object') {
        const ka = Object.keys(a), kb = Object.keys(b);
        return ka.length === kb.length &&
            ka.every((k) => Object.hasOwn(b, k) && equal(a[k], b[k]));
    }
    return false;
}

const regexCache = new Map();

function regex(p) {
    let r = regexCache.get(p);
    if (!r) {
        r = new RegExp(p, 'u');
        regexCache.set(p, r);
    }
    return r;
}

function resolve(root, ref) {
    if (!ref.startsWith('#/')) throw new Error(`unsupported $ref ${ref}`);
    let node = root;
    for (const part of ref.slice(2).split('/')) {
        const key = part.replace(/~1/g, '/').replace(/~0/g, '~');
        if (node == null || !Object.hasOwn(node, key)) {
            throw new Error(`unresolved $ref ${ref}`);
        }
        node = node[key];
    }
    return node;
}

// Appends errors for value at path against schema; returns nothing.
function check(root, schema, value, path, errors) {
    if (schema === true) return;
    if (schema === false) {
        errors.push(`${path}: not allowed`);
        return;
    }
    if (typeOf(schema) !== 'object') {
        throw new Error(`schema at ${path} is not an object or boolean`);
    }

    for (const k of Object.keys(schema)) {
        if (!KEYWORDS.has(k) && !ANNOTATIONS.has(k)) {
            throw new Error(`unsupported schema keyword "${k}" (at ${path})`);
        }
    }

    const fail = (msg) => errors.push(`${path}: ${msg}`);
    const sub = (s, v, p) => {
        const e = [];
        check(root, s, v, p, e);
        return e;
    };

    if ('$ref' in schema) check(root, resolve(root, schema.$ref), value, path, errors);

    if ('type' in schema) {
        const types = Array.isArray(schema.type) ? schema.type : [schema.type];
        if (!types.some((t) => hasType(value, t))) {
            fail(`type: want ${types.join('|')}, got ${typeOf(value)}`);
            return;             // the other keywords would only add noise
        }
    }

    if ('const' in schema && !equal(value, schema.const)) {
        fail(`const: want ${JSON.stringify(schema.const)}`);
    }
    if ('enum' in schema && !schema.enum.some((x) => equal(value, x))) {
        fail(`enum: want one of ${JSON.stringify(schema.enum)}`);
    }

    if (typeof value === 'string') {
        const len = [...value].length;  // code points, as the spec says
        if ('minLength' in schema && len < schema.minLength) fail(`minLength ${schema.minLength}`);
        if ('maxLength' in schema && len > schema.maxLength) fail(`maxLength ${schema.maxLength}`);
        if ('pattern' in schema && !regex(schema.pattern).test(value)) {
            fail(`pattern ${schema.pattern}`);
        }
    }

    if (typeof value === 'number') {
        if ('minimum' in schema && value < schema.minimum) fail(`minimum ${schema.minimum}`);
        if ('maximum' in schema && value > schema.maximum) fail(`maximum ${schema.maximum}`);
    }

    if (Array.isArray(value)) {
        if ('minItems' in schema && value.length < schema.minItems) fail(`minItems ${schema.minItems}`);
        if ('maxItems' in schema && value.length > schema.maxItems) fail(`maxItems ${schema.maxItems}`);
        if (schema.uniqueItems) {
            for (let i = 0; i < value.length; i++) {
                for (let j = 0; j < i; j++) {
                    if (equal(value[i], value[j])) fail(`uniqueItems: [${i}] repeats [${j}]`);
                }
            }
        }
        if ('items' in schema) {
            value.forEach((v, i) => check(root, schema.items, v, `${path}[${i}]`, errors));
        }
    }

    if (typeOf(value) === 'object') {
        const keys = Object.keys(value);
        if ('minProperties' in schema && keys.length < schema.minProperties) fail(`minProperties ${schema.minProperties}`);
        if ('maxProperties' in schema && keys.length > schema.maxProperties) fail(`maxProperties ${schema.maxProperties}`);
        for (const r of schema.required ?? []) {
            if (!Object.hasOwn(value, r)) fail(`required "${r}"`);
        }
        const props = schema.properties ?? {};
        for (const k of keys) {
            const p = `${path}.${k}`;
            if ('propertyNames' in schema) {
                for (const e of sub(schema.propertyNames, k, p)) errors.push(`${e} (property name)`);
            }
            if (Object.hasOwn(props, k)) {
                check(root, props[k], value[k], p, errors);
            } else if ('additionalProperties' in schema) {
                if (schema.additionalProperties === false) {
                    errors.push(`${p}: additionalProperties: not allowed`);
                } else {
                    check(root, schema.additionalProperties, value[k], p, errors);
                }
            }
        }
    }

    for (const s of schema.allOf ?? []) check(root, s, value, path, errors);
    if ('anyOf' in schema && !schema.anyOf.some((s) => sub(s, value, path).length === 0)) {
        fail('anyOf: no alternative matches');
    }
    if ('oneOf' in schema) {
        const n = schema.oneOf.filter((s) => sub(s, value, path).length === 0).length;
        if (n !== 1) fail(`oneOf: ${n} alternatives match`);
    }
    if ('not' in schema && sub(schema.not, value, path).length === 0) fail('not: matches');
    if ('if' in schema) {
        if (sub(schema.if, value, path).length === 0) {
            if ('then' in schema) check(root, schema.then, value, path, errors);
        } else if ('else' in schema) {
            check(root, schema.else, value, path, errors);
        }
    }
}

export function validate(schema, value) {
    const errors = [];
    check(schema, schema, value, '$', errors);
    return errors;
}

// Walks every subschema once so that an unsupported keyword or a bad
// pattern fails even where no example reaches it.
export function checkSchema(schema) {
    const seen = new Set();
    const walk = (s, path) => {
        if (typeof s === 'boolean' || seen.has(s)) return;
        if (typeOf(s) !== 'object') throw new Error(`schema at ${path} is not an object`);
        seen.add(s);
        for (const k of Object.keys(s)) {
            if (!KEYWORDS.has(k) && !ANNOTATIONS.has(k)) {
                throw new Error(`unsupported schema keyword "${k}" at ${path}`);
            }
        }
        if ('pattern' in s) regex(s.pattern);
        if ('$ref' in s) resolve(schema, s.$ref);
        for (const k of ['items', 'additionalProperties', 'propertyNames', 'not', 'if', 'then', 'else']) {
            if (k in s) walk(s[k], `${path}/${k}`);
        }
        for (const k of ['allOf', 'anyOf', 'oneOf']) {
            (s[k] ?? []).forEach((x, i) => walk(x, `${path}/${k}/${i}`));
        }
        for (const k of ['properties', '$defs']) {
            for (const [n, x] of Object.entries(s[k] ?? {})) walk(x, `${path}/${k}/${n}`);
        }
    };
    walk(schema, '#');
}
