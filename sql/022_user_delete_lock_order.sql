-- DELETE /api/user took the user's row lock, then its tokens' (to mark them
-- deleted), while every ledger write locks tokens first, then users: a
-- delete during traffic could deadlock with a ledger write (PostgreSQL
-- then failed one of them after deadlock_timeout, usually the delete, with
-- a 500).  A delete now locks the user's tokens first, in id order, as the
-- ledger writes do.

ALTER FUNCTION llmgw_api_user(text, bigint, jsonb, jsonb)
    RENAME TO llmgw_api_user_base;

CREATE FUNCTION llmgw_api_user(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF p_method = 'DELETE' AND p_id IS NOT NULL THEN
        -- Lock order: tokens by id, then users by id.
        PERFORM 1 FROM tokens
          WHERE user_id = p_id AND deleted_at IS NULL
          ORDER BY id FOR UPDATE;
    END IF;

    RETURN llmgw_api_user_base(p_method, p_id, q, b);
END $$;
