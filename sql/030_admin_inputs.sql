-- The admin API refuses what it used to store or drop without a word:
--
-- * base_url hosts that are neither a host name nor an IP address ("-",
--   "a..b", "[:::]", a label over 63 characters, "1.2.3"): the channel was
--   stored and every request to it failed to resolve.
-- * Model names over 1024 bytes (the longest a client may send), in a
--   channel's or a key's models, /api/pricing keys and model_mapping; and
--   /api/pricing and model_mapping keys with surrounding whitespace or a
--   control character: routing matches names exactly, so such a price or
--   mapping never applied.  A price is checked where it is set, not where
--   it is removed (null), so one stored before can still go.
-- * Numbers the gateway reads as 0 (a ratio of 1e-400 is 0 as a double):
--   prices, ratios and group ratios are 0 or at least 1e-300.
-- * Query parameters a call does not take (GET /api/token?userid=1 listed
--   every key), as GET /api/log already did (029).
-- * A DELETE of a user, key or channel with members in its body: such a
--   DELETE takes none (a plugin's DELETE takes force, 025).


-- ======================================================================
-- Query parameters
-- ======================================================================

-- Refuses a parameter of q not in p_known.
CREATE FUNCTION llmgw_v_query(q jsonb, p_known text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    SELECT key INTO k
      FROM jsonb_object_keys(q) AS key
     WHERE key <> ALL (p_known)
     ORDER BY key LIMIT 1;
    IF k IS NOT NULL THEN
        PERFORM llmgw_bad(format('%s: unknown query parameter (%s)', left(k, 64),
            CASE WHEN p_known = '{}' THEN 'this call takes none'
                 ELSE 'known: ' || array_to_string(p_known, ', ') END));
    END IF;
END $$;

-- The parameters a call takes, or NULL when the call is not one (a 404 or
-- a 405, answered as before) or checks its own (/log, 029).
CREATE FUNCTION llmgw_query_known(p_method text, p_path text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_path ~ '^/(user|channel)$'
            THEN CASE p_method WHEN 'GET' THEN ARRAY['page', 'page_size']
                               WHEN 'POST' THEN '{}'::text[] END
        -- an upload's (force) the gateway checks, as those of the calls it
        -- answers itself (llmgw_admin_check)
        WHEN p_path = '/plugin/task' AND p_method = 'GET'
            THEN ARRAY['page', 'page_size']
        WHEN p_path = '/token'
            THEN CASE p_method WHEN 'GET' THEN ARRAY['user_id', 'page', 'page_size']
                               WHEN 'POST' THEN '{}'::text[] END
        WHEN p_path ~ '^/(user|token|channel)/[^/]+$'
             AND p_method IN ('GET', 'PATCH', 'DELETE')
            THEN '{}'::text[]
        WHEN p_path ~ '^/(pricing|group|rate_limit)$' AND p_method IN ('GET', 'PUT')
            THEN '{}'::text[]
        -- force is read from the query as from the body (004)
        WHEN p_path ~ '^/plugin/task/[^/]+/activate$' AND p_method = 'POST'
            THEN ARRAY['force']
        WHEN p_path ~ '^/plugin/task/[^/]+$'
             AND p_path !~ '^/plugin/task/(dryrun|marketplace)$'
            THEN CASE p_method WHEN 'GET' THEN '{}'::text[]
                               WHEN 'PATCH' THEN ARRAY['force']
                               WHEN 'DELETE' THEN ARRAY['force'] END
    END
$$;


-- ======================================================================
-- The dispatcher
-- ======================================================================

-- The answer to an error caught at the top of an admin call: a user error
-- (SQLSTATE LGnnn, llmgw_fail) as it was raised, anything else a 500 that
-- is logged.
CREATE FUNCTION llmgw_api_caught(p_state text, p_msg text, p_hint text,
                                 p_what text)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF p_state ~ '^LG[0-9]{3}$' THEN
        RETURN jsonb_build_object('status', substr(p_state, 3)::int,
                                  'message', p_msg, 'code', p_hint);
    END IF;
    RAISE WARNING '%: % (%)', p_what, p_msg, p_state;
    RETURN jsonb_build_object('status', 500, 'code', 'internal_error',
                              'message', 'internal error: ' || p_msg);
END $$;

-- What a call refuses before it is dispatched: query parameters it does
-- not take, and members in the body of a DELETE that takes none.
CREATE FUNCTION llmgw_api_precheck(p_method text, p_path text, p_query text,
                                   p_body text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_known text[] := llmgw_query_known(p_method, p_path);
    v_b     jsonb;
BEGIN
    IF v_known IS NOT NULL THEN
        PERFORM llmgw_v_query(llmgw_query_parse(p_query), v_known);
    END IF;

    IF p_method = 'DELETE' AND p_path ~ '^/(user|token|channel)/[^/]+$'
       AND btrim(coalesce(p_body, ''), E' \t\r\n') <> ''
    THEN
        BEGIN
            v_b := p_body::jsonb;
        EXCEPTION WHEN OTHERS THEN
            PERFORM llmgw_fail(400, 'invalid_json', 'invalid JSON request body');
        END;
        IF jsonb_typeof(v_b) IS DISTINCT FROM 'object' THEN
            PERFORM llmgw_fail(400, 'invalid_json', 'request body must be a JSON object');
        END IF;
        SELECT format('%s: unknown field (a DELETE of a %s takes none)',
                      left(k, 64), split_part(p_path, '/', 2))
          INTO p_body
          FROM jsonb_object_keys(v_b) AS k ORDER BY k LIMIT 1;
        IF p_body IS NOT NULL THEN
            PERFORM llmgw_bad(p_body);
        END IF;
    END IF;
END $$;

ALTER FUNCTION llmgw_api(text, text, text, text) RENAME TO llmgw_api_dispatch;

CREATE FUNCTION llmgw_api(method text, path text, query text, body text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_state text;
    v_msg   text;
    v_hint  text;
BEGIN
    BEGIN
        PERFORM llmgw_api_precheck(upper(coalesce(method, '')),
                                   regexp_replace(coalesce(path, ''), '(.)/+$', '\1'),
                                   query, body);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE,
                                v_msg = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
        RETURN llmgw_api_caught(v_state, v_msg, v_hint,
                                format('llmgw_api %s %s', method, path));
    END;
    RETURN llmgw_api_dispatch(method, path, query, body);
END $$;

-- ======================================================================
-- Numbers
-- ======================================================================

ALTER FUNCTION llmgw_v_num(jsonb, text) RENAME TO llmgw_v_num_range;

CREATE FUNCTION llmgw_v_num(v jsonb, p_field text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    v := llmgw_v_num_range(v, p_field);
    -- a double ends near 1e-308; below that a price would read as 0
    IF v::numeric > 0 AND v::numeric < 1e-300 THEN
        PERFORM llmgw_bad(p_field || ': must be 0 or at least 1e-300 (a smaller number reads as 0)');
    END IF;
    RETURN v;
END $$;


-- ======================================================================
-- Model names
-- ======================================================================

-- A model name as routing matches it: at most 1024 bytes, as a client may
-- send; p_key also refuses what a key cannot be matched with (surrounding
-- whitespace, control characters).  p_what names the list in the message.
CREATE FUNCTION llmgw_v_model_name(s text, p_what text, p_key boolean)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF octet_length(s) > 1024 THEN
        PERFORM llmgw_bad(format('%s: a model name has at most 1024 bytes (%s has %s)',
                                 p_what, to_jsonb(left(s, 32) || '...'),
                                 octet_length(s)));
    END IF;
    IF NOT p_key THEN
        RETURN;
    END IF;
    IF llmgw_has_control(s) THEN
        PERFORM llmgw_bad(format('%s: %s must not contain control characters',
                                 p_what, to_jsonb(left(s, 64))));
    END IF;
    IF s ~ '^\s|\s$' THEN
        PERFORM llmgw_bad(format('%s: %s has leading or trailing whitespace '
                                 '(model names are matched exactly)',
                                 p_what, to_jsonb(left(s, 64))));
    END IF;
END $$;

ALTER FUNCTION llmgw_v_names(jsonb, text, boolean) RENAME TO llmgw_v_names_text;

CREATE FUNCTION llmgw_v_names(v jsonb, p_field text, p_comma boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := llmgw_v_names_text(v, p_field, p_comma);
    x text;
BEGIN
    -- the other lists of names (a channel's groups) have rules of their own
    IF p_field = 'models' THEN
        FOR x IN SELECT jsonb_array_elements_text(o) LOOP
            PERFORM llmgw_v_model_name(x, p_field, false);
        END LOOP;
    END IF;
    RETURN o;
END $$;

ALTER FUNCTION llmgw_v_mapping(jsonb) RENAME TO llmgw_v_mapping_text;

CREATE FUNCTION llmgw_v_mapping(v jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := llmgw_v_mapping_text(v);
    r record;
BEGIN
    FOR r IN SELECT key, value #>> '{}' AS value FROM jsonb_each(o) ORDER BY key LOOP
        PERFORM llmgw_v_model_name(r.key, 'model_mapping', true);
        PERFORM llmgw_v_model_name(r.value, 'model_mapping.' || left(r.key, 64), false);
    END LOOP;
    RETURN o;
END $$;

ALTER FUNCTION llmgw_api_pricing(text, jsonb) RENAME TO llmgw_api_pricing_members;

CREATE FUNCTION llmgw_api_pricing(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    IF p_method <> 'GET' THEN
        FOR k IN SELECT key FROM jsonb_each(b) WHERE value <> 'null' ORDER BY key LOOP
            PERFORM llmgw_v_model_name(k, 'pricing', true);
        END LOOP;
    END IF;
    RETURN llmgw_api_pricing_members(p_method, b);
END $$;


-- ======================================================================
-- base_url hosts
-- ======================================================================

-- Why host (of an http(s) URL, brackets kept) is neither a host name nor
-- an IP address, or NULL.  Names are labels of 1 to 63 letters, digits,
-- "-" (not first or last) and "_" (container and service names), at most
-- 253 characters, with one final dot allowed (a fully qualified name); a
-- name of digits and dots is an IPv4 address, which has four parts without
-- leading zeros (as allow_ips, 023).
CREATE FUNCTION llmgw_host_error(host text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_ip    inet;
    v_label text;
BEGIN
    IF host ~ '^\[.*\]$' THEN
        BEGIN
            v_ip := substr(host, 2, length(host) - 2)::inet;
        EXCEPTION WHEN invalid_text_representation OR data_exception THEN
            v_ip := NULL;
        END;
        IF v_ip IS NULL OR family(v_ip) <> 6 OR masklen(v_ip) <> 128
           OR host ~ '/' THEN
            RETURN format('%s is not an IPv6 address', host);
        END IF;
        RETURN NULL;
    END IF;
    IF host ~ '^[0-9.]+$' THEN
        IF host !~ '^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.|$)){4}$'
           OR host ~ '\.$' THEN
            RETURN format('%s is not an IPv4 address (four numbers 0-255 '
                          'without leading zeros)', host);
        END IF;
        RETURN NULL;
    END IF;
    IF length(host) > 253 THEN
        RETURN 'the host name is longer than 253 characters';
    END IF;
    FOREACH v_label IN ARRAY string_to_array(regexp_replace(host, '(.)\.$', '\1'), '.') LOOP
        IF v_label = '' THEN
            RETURN format('the host name %s has an empty label', left(host, 64));
        ELSIF length(v_label) > 63 THEN
            RETURN format('the host name %s has a label longer than 63 characters',
                          left(host, 64));
        ELSIF v_label ~ '^-|-$' THEN
            RETURN format('the host name %s has a label that starts or ends with "-"',
                          left(host, 64));
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

ALTER FUNCTION llmgw_v_base_url(jsonb) RENAME TO llmgw_v_base_url_form;

CREATE FUNCTION llmgw_v_base_url(v jsonb) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    s   text := llmgw_v_base_url_form(v);
    err text := llmgw_host_error(substring(s FROM '^https?://(\[[^]]*\]|[^/:]+)'));
BEGIN
    IF err IS NOT NULL THEN
        PERFORM llmgw_bad('base_url: ' || err);
    END IF;
    RETURN s;
END $$;
