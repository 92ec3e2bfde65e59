-- The plugin admin calls and /pricing follow the rule of the rest of the
-- admin API: a member a body does not take is refused, never dropped with
-- a 200.
--
--   * PATCH /plugin/task/{key} takes enabled, remark and force;
--     POST .../activate takes version and force; DELETE takes force (its
--     body is read now, as the README always said).  enabled and force
--     are true or false, remark a string (a "force": "yes" was cast by
--     PostgreSQL: true, or a 500 for "abc").  The upload and the
--     marketplace check their bodies in the gateway (src/plugin.cpp).
--   * /pricing refuses completion_ratio, cache_ratio and
--     cache_creation_ratio next to a per-call price or unit_prices: they
--     apply to per-token prices alone, and were dropped.
--   * A 405 names the path as the client wrote it, under /api.


-- Refuses members of a plugin call's body that are not in p_known, and
-- flags that are not booleans or remarks that are not strings.
CREATE FUNCTION llmgw_v_plugin_body(b jsonb, p_known text[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    PERFORM llmgw_v_members(b, p_known);
    FOREACH k IN ARRAY ARRAY['enabled', 'force'] LOOP
        IF b ? k AND jsonb_typeof(b -> k) <> 'boolean' THEN
            PERFORM llmgw_bad(k || ': must be true or false');
        END IF;
    END LOOP;
    IF b ? 'remark' AND jsonb_typeof(b -> 'remark') <> 'string' THEN
        PERFORM llmgw_bad('remark: must be a string');
    END IF;
    IF b ? 'version' AND jsonb_typeof(b -> 'version') <> 'string' THEN
        PERFORM llmgw_bad('version: must be a string');
    END IF;
END $$;


ALTER FUNCTION llmgw_api_plugin(text, text, jsonb, jsonb)
    RENAME TO llmgw_api_plugin_paths;

CREATE FUNCTION llmgw_api_plugin(p_method text, p_path text, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_m text[];
BEGIN
    -- only methods the path takes: any other is a 405 first
    v_m := regexp_match(p_path, '^/plugin/task/([^/]+)(/activate)?$');
    IF v_m IS NOT NULL THEN
        IF v_m[2] IS NOT NULL AND p_method = 'POST' THEN
            PERFORM llmgw_v_plugin_body(b, ARRAY['version', 'force']);
        ELSIF v_m[2] IS NULL AND v_m[1] NOT IN ('dryrun', 'marketplace') THEN
            IF p_method = 'PATCH' THEN
                PERFORM llmgw_v_plugin_body(b, ARRAY['enabled', 'remark', 'force']);
            ELSIF p_method = 'DELETE' THEN
                PERFORM llmgw_v_plugin_body(b, ARRAY['force']);
            END IF;
        END IF;
    END IF;

    RETURN llmgw_api_plugin_paths(p_method, p_path, q, b);
END $$;


-- 004's dispatcher, with DELETE bodies read and 405s named under /api.
CREATE OR REPLACE FUNCTION llmgw_api(method text, path text, query text, body text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_method text := upper(coalesce(method, ''));
    v_path   text := regexp_replace(coalesce(path, ''), '(.)/+$', '\1');
    v_b      jsonb := '{}';
    v_out    jsonb;
    v_state  text;
    v_msg    text;
    v_hint   text;
BEGIN
    IF v_path !~ '^/plugin/task' THEN
        v_out := llmgw_api_core(method, path, query, body);
    ELSE
        BEGIN
            IF v_method IN ('POST', 'PUT', 'PATCH', 'DELETE')
               AND coalesce(body, '') <> ''
            THEN
                BEGIN
                    v_b := body::jsonb;
                EXCEPTION WHEN OTHERS THEN
                    PERFORM llmgw_fail(400, 'invalid_json', 'invalid JSON request body');
                END;
                IF jsonb_typeof(v_b) IS DISTINCT FROM 'object' THEN
                    PERFORM llmgw_bad('request body must be a JSON object');
                END IF;
            END IF;
            v_out := jsonb_build_object('status', 200, 'body',
                llmgw_api_plugin(v_method, v_path, llmgw_query_parse(query), v_b));
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE,
                                    v_msg = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
            IF v_state ~ '^LG[0-9]{3}$' THEN
                v_out := jsonb_build_object('status', substr(v_state, 3)::int,
                                            'message', v_msg, 'code', v_hint);
            ELSE
                RAISE WARNING 'llmgw_api % %: % (%)', v_method, v_path, v_msg, v_state;
                v_out := jsonb_build_object('status', 500, 'code', 'internal_error',
                                            'message', 'internal error: ' || v_msg);
            END IF;
        END;
    END IF;

    IF v_out ->> 'status' = '405' AND v_out ? 'message' THEN
        v_out := v_out || jsonb_build_object('message',
            replace(v_out ->> 'message', ' is not allowed on /', ' is not allowed on /api/'));
    END IF;
    RETURN v_out;
END $$;


-- The per-token multiples go with ratio alone; 018's check of the member
-- names, and the entries themselves, follow.
ALTER FUNCTION llmgw_api_pricing(text, jsonb) RENAME TO llmgw_api_pricing_known;

CREATE FUNCTION llmgw_api_pricing(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r  record;
    k  text;
BEGIN
    IF p_method <> 'GET' THEN
        FOR r IN SELECT key, value FROM jsonb_each(b) ORDER BY key LOOP
            CONTINUE WHEN jsonb_typeof(r.value) IS DISTINCT FROM 'object'
                       OR coalesce(r.value -> 'ratio', 'null') <> 'null'
                       OR (coalesce(r.value -> 'price', 'null') = 'null'
                           AND coalesce(r.value -> 'unit_prices', 'null') = 'null');
            FOREACH k IN ARRAY ARRAY['cache_creation_ratio', 'cache_ratio',
                                     'completion_ratio'] LOOP
                IF coalesce(r.value -> k, 'null') <> 'null' THEN
                    PERFORM llmgw_bad(format('pricing.%s.%s: only with ratio (a per-token price); '
                                             'a per-call price or unit_prices has no %s',
                                             r.key, k, k));
                END IF;
            END LOOP;
        END LOOP;
    END IF;

    RETURN llmgw_api_pricing_known(p_method, b);
END $$;
