-- An IPv4 part with a leading zero ("0127.0.0.1", "10.01.0.0/16") is
-- refused in key allow-lists: PostgreSQL and the gateway read it as
-- decimal, other tools as octal, so what it admits would be ambiguous.
-- (IPv6 groups such as "0db8" stay valid: only dotted decimal parts are
-- looked at.)

CREATE OR REPLACE FUNCTION llmgw_v_ips(v jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_e jsonb;
    v_s text;
    v_i int := 0;
BEGIN
    IF v IS NULL OR v = 'null' OR v = '[]' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'array' THEN
        PERFORM llmgw_bad('allow_ips: must be an array of IP addresses or CIDRs, or null');
    END IF;
    FOR v_e IN SELECT e FROM jsonb_array_elements(v) AS e LOOP
        IF jsonb_typeof(v_e) <> 'string' THEN
            PERFORM llmgw_bad(format('allow_ips[%s]: must be a string', v_i));
        END IF;
        v_s := v_e #>> '{}';
        BEGIN
            -- inet accepts "a.b.c.d", "a.b.c.d/n" and IPv6 forms; the regex
            -- keeps out whatever else its parser tolerates.
            IF v_s !~ '^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$'
               OR v_s ~ '(^|[:.])0[0-9]+\.'
               OR v_s ~ '\.0[0-9]+(/|$)'
            THEN
                RAISE invalid_text_representation;
            END IF;
            PERFORM v_s::inet;
        EXCEPTION WHEN invalid_text_representation OR invalid_binary_representation
                       OR data_exception THEN
            PERFORM llmgw_bad(format('allow_ips[%s]: %s is not an IP address or CIDR',
                                     v_i, v_e::text));
        END;
        v_i := v_i + 1;
    END LOOP;
    RETURN v;
END $$;
