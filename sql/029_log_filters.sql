-- GET /api/log refuses a filter it does not know (a misspelt ?token=5 would
-- otherwise list the whole ledger, as if it had filtered).

ALTER FUNCTION llmgw_api_log(jsonb) RENAME TO llmgw_api_log_rows;

CREATE FUNCTION llmgw_api_log(q jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE v_unknown text;
BEGIN
    SELECT string_agg(k, ', ' ORDER BY k) INTO v_unknown
      FROM jsonb_object_keys(coalesce(q, '{}')) AS k
     WHERE k NOT IN ('token_id', 'user_id', 'model', 'type', 'from', 'to',
                     'page', 'page_size');
    IF v_unknown IS NOT NULL THEN
        PERFORM llmgw_bad(format('unknown filter: %s (known: token_id, user_id, model, '
                                 'type, from, to, page, page_size)',
                                 left(v_unknown, 200)));
    END IF;
    RETURN llmgw_api_log_rows(q);
END $$;
