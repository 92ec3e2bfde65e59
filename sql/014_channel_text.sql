-- Channel text that the gateway writes into upstream request heads: the key
-- is a header value, and model names (after model_mapping) go into the
-- request line of Gemini channels.  A CR or LF there would start a header
-- of its own, so:
--   - the key is trimmed of surrounding whitespace (a key read from a file
--     ends with a newline) and refused with a control character inside;
--   - model names (of channels and of keys), groups and model_mapping
--     entries are refused with a control character.
-- Keys stored before are trimmed here; a channel still holding a control
-- character is left out by the gateway, which logs which one.

-- Whether s holds a byte below 0x20 or DEL (NUL cannot be in a text).
CREATE FUNCTION llmgw_has_control(s text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT s ~ '[\x01-\x1f\x7f]'
$$;

CREATE FUNCTION llmgw_trim_space(s text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT btrim(s, E' \t\r\n\f' || chr(11))
$$;

-- A credential: trimmed, then refused when a control character is left.
-- The message never repeats the value.
CREATE FUNCTION llmgw_v_credential(v jsonb, p_field text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE s text := llmgw_trim_space(llmgw_v_str(v, p_field));
BEGIN
    IF llmgw_has_control(s) THEN
        PERFORM llmgw_bad(p_field || ': must not contain control characters');
    END IF;
    RETURN s;
END $$;

ALTER FUNCTION llmgw_v_names(jsonb, text, boolean)
    RENAME TO llmgw_v_names_any;

CREATE FUNCTION llmgw_v_names(v jsonb, p_field text, p_comma boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := llmgw_v_names_any(v, p_field, p_comma);
    x text;
BEGIN
    FOR x IN SELECT jsonb_array_elements_text(o) LOOP
        IF llmgw_has_control(x) THEN
            PERFORM llmgw_bad(format('%s: %s must not contain control characters',
                                     p_field, to_jsonb(x)));
        END IF;
    END LOOP;
    RETURN o;
END $$;

ALTER FUNCTION llmgw_v_mapping(jsonb) RENAME TO llmgw_v_mapping_any;

CREATE FUNCTION llmgw_v_mapping(v jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := llmgw_v_mapping_any(v);
    r record;
BEGIN
    FOR r IN SELECT key, value #>> '{}' AS value FROM jsonb_each(o) LOOP
        IF llmgw_has_control(r.key) THEN
            PERFORM llmgw_bad(format('model_mapping: %s must not contain control characters',
                                     to_jsonb(r.key)));
        END IF;
        IF llmgw_has_control(r.value) THEN
            PERFORM llmgw_bad(format('model_mapping.%s: must not contain control characters',
                                     r.key));
        END IF;
    END LOOP;
    RETURN o;
END $$;

ALTER FUNCTION llmgw_api_channel(text, bigint, jsonb, jsonb)
    RENAME TO llmgw_api_channel_bound;

-- The key checked and trimmed, then 005's function (plugin bindings) and
-- 001's do the rest.
CREATE FUNCTION llmgw_api_channel(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF p_method IN ('POST', 'PATCH') AND b ? 'key' THEN
        b := b || jsonb_build_object('key', llmgw_v_credential(b -> 'key', 'key'));
    END IF;
    RETURN llmgw_api_channel_bound(p_method, p_id, q, b);
END $$;

WITH trimmed AS (
    UPDATE channels SET key = llmgw_trim_space(key)
     WHERE key <> llmgw_trim_space(key)
    RETURNING id
)
SELECT llmgw_bump('channel', id) FROM trimmed;
