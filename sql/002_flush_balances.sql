-- llmgw_flush answers with the balances it leaves, so that a gateway node
-- can true up its shared-memory view of every key and user it just charged
-- without another round trip.

ALTER FUNCTION llmgw_flush(jsonb) RENAME TO llmgw_flush_rows;

CREATE FUNCTION llmgw_flush(rows jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_res  jsonb;
BEGIN
    v_res := llmgw_flush_rows($1);

    RETURN v_res || jsonb_build_object(
        'tokens', coalesce((
            SELECT jsonb_object_agg(t.id::text, t.remain_quota)
              FROM tokens AS t
             WHERE t.id IN (SELECT (r ->> 'token_id')::numeric::bigint
                              FROM jsonb_array_elements($1) AS r
                             WHERE nullif(r ->> 'token_id', '') IS NOT NULL)),
            '{}'::jsonb),
        'users', coalesce((
            SELECT jsonb_object_agg(u.id::text, u.quota)
              FROM users AS u
             WHERE u.id IN (SELECT (r ->> 'user_id')::numeric::bigint
                              FROM jsonb_array_elements($1) AS r
                             WHERE nullif(r ->> 'user_id', '') IS NOT NULL)),
            '{}'::jsonb));
END $$;
