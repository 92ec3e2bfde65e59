-- Prices learn cache ratios (cache reads and cache writes are billed at
-- their own multiple of the prompt price), and channel base URLs are held
-- to what the gateway can route: scheme, host, optional port, optional
-- path; no credentials, query or fragment.

CREATE OR REPLACE FUNCTION llmgw_v_base_url(v jsonb) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    s text := llmgw_v_str(v, 'base_url');
    m text[];
BEGIN
    m := regexp_match(s,
        '^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:([0-9]{1,5}))?(/[^?#\s]*)?$');
    IF m IS NULL THEN
        PERFORM llmgw_bad('base_url: must be http(s)://host[:port][/path] '
                          || 'without credentials, query or fragment');
    END IF;
    IF m[3] IS NOT NULL AND (m[3]::int < 1 OR m[3]::int > 65535) THEN
        PERFORM llmgw_bad('base_url: the port must be 1 to 65535');
    END IF;
    RETURN regexp_replace(s, '/+$', '');
END $$;

CREATE OR REPLACE FUNCTION llmgw_api_pricing(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_cur   jsonb;
    r       record;
    v_f     text;
    v_ratio boolean;
    v_price boolean;
    v_e     jsonb;
    k       text;
BEGIN
    IF p_method = 'GET' THEN
        RETURN coalesce(llmgw_option('pricing'), '{}');
    END IF;

    v_cur := coalesce(llmgw_option_lock('pricing', '{}'), '{}');
    FOR r IN SELECT key, value FROM jsonb_each(b) ORDER BY key LOOP
        v_f := 'pricing.' || r.key;
        IF btrim(r.key) = '' THEN
            PERFORM llmgw_bad('pricing: model names must be non-empty');
        END IF;
        IF r.value = 'null' THEN                            -- remove the model
            v_cur := v_cur - r.key;
            CONTINUE;
        END IF;
        IF jsonb_typeof(r.value) <> 'object' THEN
            PERFORM llmgw_bad(v_f || ': must be an object with ratio (and completion_ratio) or price, or null to remove it');
        END IF;
        -- A null member counts as absent (forms often send "price": null).
        v_ratio := coalesce(r.value -> 'ratio', 'null') <> 'null';
        v_price := coalesce(r.value -> 'price', 'null') <> 'null';
        IF v_ratio AND v_price THEN
            PERFORM llmgw_bad(v_f || ': give either ratio or price, not both');
        ELSIF v_price THEN
            v_e := jsonb_build_object(
                'price', llmgw_v_num(r.value -> 'price', v_f || '.price'));
        ELSIF v_ratio THEN
            v_e := jsonb_build_object(
                'ratio', llmgw_v_num(r.value -> 'ratio', v_f || '.ratio'));
            -- multiples of the prompt price; each defaults to 1
            FOREACH k IN ARRAY ARRAY['completion_ratio', 'cache_ratio',
                                     'cache_creation_ratio'] LOOP
                v_e := v_e || jsonb_build_object(k,
                    CASE WHEN coalesce(r.value -> k, 'null') = 'null'
                         THEN '1'::jsonb
                         ELSE llmgw_v_num(r.value -> k, v_f || '.' || k) END);
            END LOOP;
        ELSE
            PERFORM llmgw_bad(v_f || ': needs ratio (per token) or price (per call)');
        END IF;
        v_cur := v_cur || jsonb_build_object(r.key, v_e);
    END LOOP;

    PERFORM llmgw_option_set('pricing', v_cur);
    PERFORM llmgw_bump('config', 0);
    RETURN v_cur;
END $$;
