-- Follow-ups to 023.
--
-- * Allow-lists stored before 023 may hold short IPv4 forms ("127/8",
--   "10.1/16") that PostgreSQL took and the gateway cannot read: such a
--   key now admits nobody.  They are written out in full ("127.0.0.0/8"),
--   as the gateway reads them, and the keys announced.
-- * A group name is checked only where a group is set, not where one is
--   removed (null): a group stored before 023 under a name it refuses can
--   still be removed.

DO $$
DECLARE
    t      record;
    v_e    jsonb;
    v_s    text;
    v_new  jsonb;
BEGIN
    FOR t IN SELECT id, allow_ips FROM tokens
              WHERE jsonb_typeof(allow_ips) = 'array' AND deleted_at IS NULL
    LOOP
        v_new := '[]';
        FOR v_e IN SELECT e FROM jsonb_array_elements(t.allow_ips) AS e LOOP
            v_s := v_e #>> '{}';
            IF jsonb_typeof(v_e) = 'string'
               AND v_s ~ '^[0-9]+(\.[0-9]+){0,2}/[0-9]{1,2}$'
            THEN
                BEGIN
                    v_s := abbrev(v_s::inet);
                EXCEPTION WHEN OTHERS THEN
                    NULL;
                END;
            END IF;
            v_new := v_new || jsonb_build_array(
                CASE WHEN jsonb_typeof(v_e) = 'string' THEN to_jsonb(v_s) ELSE v_e END);
        END LOOP;
        IF v_new IS DISTINCT FROM t.allow_ips THEN
            UPDATE tokens SET allow_ips = v_new WHERE id = t.id;
            PERFORM llmgw_bump('token', t.id);
        END IF;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION llmgw_api_group(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF p_method = 'PUT' THEN
        FOR r IN SELECT key, value FROM jsonb_each(b) ORDER BY key LOOP
            CONTINUE WHEN r.value = 'null';
            PERFORM llmgw_v_group_name(r.key, 'group');
            IF jsonb_typeof(r.value) = 'object' THEN
                PERFORM llmgw_v_members(r.value, ARRAY['ratio', 'deprecated'],
                                        '{}', 'group.' || r.key || '.');
            END IF;
        END LOOP;
    END IF;
    RETURN llmgw_api_group_base(p_method, b);
END $$;

CREATE OR REPLACE FUNCTION llmgw_api_rate_limit(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_rule text[] := ARRAY['duration_minutes', 'total', 'success'];
    r      record;
BEGIN
    IF p_method = 'PUT' THEN
        PERFORM llmgw_v_members(b, ARRAY['default', 'groups'], '{}', 'rate_limit.');
        IF jsonb_typeof(b -> 'default') = 'object' THEN
            PERFORM llmgw_v_members(b -> 'default', v_rule, '{}',
                                    'rate_limit.default.');
        END IF;
        IF jsonb_typeof(b -> 'groups') = 'object' THEN
            FOR r IN SELECT key, value FROM jsonb_each(b -> 'groups') ORDER BY key LOOP
                CONTINUE WHEN r.value = 'null';
                PERFORM llmgw_v_group_name(r.key, 'rate_limit.groups');
                IF jsonb_typeof(r.value) = 'object' THEN
                    PERFORM llmgw_v_members(r.value, v_rule, '{}',
                                            'rate_limit.groups.' || r.key || '.');
                END IF;
            END LOOP;
        END IF;
    END IF;
    RETURN llmgw_api_rate_limit_base(p_method, b);
END $$;
