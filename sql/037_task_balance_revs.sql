-- Task balance moves (a submit's reservation, a settlement, a refund) answer
-- each balance with its revision, as a ledger flush does (015, 021).  A
-- reading without one can only lower what a node knows, so a refund read
-- without its revision was not learned: the key answered 401 and the user
-- 403 until a later reading, though the database held the refund.

CREATE OR REPLACE FUNCTION llmgw_task_balances(p_tok bigint[], p_usr bigint[])
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'tokens', coalesce((SELECT jsonb_object_agg(t.id::text, t.remain_quota)
                              FROM tokens AS t WHERE t.id = ANY (p_tok)), '{}'),
        'users', coalesce((SELECT jsonb_object_agg(u.id::text, u.quota)
                             FROM users AS u WHERE u.id = ANY (p_usr)), '{}'),
        'token_revs', coalesce((SELECT jsonb_object_agg(t.id::text, t.bal_rev)
                                  FROM tokens AS t WHERE t.id = ANY (p_tok)), '{}'),
        'user_revs', coalesce((SELECT jsonb_object_agg(u.id::text, u.bal_rev)
                                 FROM users AS u WHERE u.id = ANY (p_usr)), '{}'))
$$;

CREATE OR REPLACE FUNCTION llmgw_task_apply(p_tok jsonb, p_usr jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    n int;
BEGIN
    IF p_tok = '{}' AND p_usr = '{}' THEN
        RETURN '{"tokens": {}, "users": {}}';
    END IF;

    n := jsonb_array_length(jsonb_path_query_array(p_tok, '$.* ? (@ != 0)'));
    IF n > 1 THEN
        PERFORM 1 FROM tokens
         WHERE id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_tok)
                                WHERE value::numeric <> 0))
         ORDER BY id FOR UPDATE;
    END IF;
    IF n > 0 THEN
        UPDATE tokens AS t
           SET remain_quota = CASE WHEN t.unlimited_quota THEN t.remain_quota
                                   ELSE llmgw_add(t.remain_quota,
                                                  -(p_tok ->> t.id::text)::numeric) END,
               used_quota   = llmgw_add(t.used_quota, (p_tok ->> t.id::text)::numeric)
         WHERE t.id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_tok)
                                  WHERE value::numeric <> 0));
    END IF;

    n := jsonb_array_length(jsonb_path_query_array(p_usr, '$.* ? (@ != 0)'));
    IF n > 1 THEN
        PERFORM 1 FROM users
         WHERE id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_usr)
                                WHERE value::numeric <> 0))
         ORDER BY id FOR UPDATE;
    END IF;
    IF n > 0 THEN
        UPDATE users AS u
           SET quota      = llmgw_add(u.quota, -(p_usr ->> u.id::text)::numeric),
               used_quota = llmgw_add(u.used_quota, (p_usr ->> u.id::text)::numeric)
         WHERE u.id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_usr)
                                  WHERE value::numeric <> 0));
    END IF;

    RETURN llmgw_task_balances(
        ARRAY(SELECT key::bigint FROM jsonb_each_text(p_tok)),
        ARRAY(SELECT key::bigint FROM jsonb_each_text(p_usr)));
END $$;

CREATE OR REPLACE FUNCTION llmgw_task_apply_one(p_token bigint, p_user bigint, d bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF d <> 0 THEN
        IF p_token IS NOT NULL THEN
            UPDATE tokens
               SET remain_quota = CASE WHEN unlimited_quota THEN remain_quota
                                       ELSE llmgw_add(remain_quota, -d::numeric) END,
                   used_quota   = llmgw_add(used_quota, d)
             WHERE id = p_token;
        END IF;
        UPDATE users
           SET quota = llmgw_add(quota, -d::numeric), used_quota = llmgw_add(used_quota, d)
         WHERE id = p_user;
    END IF;
    RETURN llmgw_task_balances(ARRAY[p_token], ARRAY[p_user]);
END $$;
