-- A cheaper balance update per ledger batch.  Every batch of the writer
-- ends with llmgw_flush_apply(), which moved each balance with an UPDATE
-- whose trigger (015) then ran a PL/pgSQL function per row to bump bal_rev,
-- and answered with six aggregate reads where two do.  About half of the
-- function's time went to those trigger calls.
--
-- Now the function bumps bal_rev itself, in the same UPDATE, and the
-- triggers run their function only for an update that changed a balance
-- without bumping bal_rev (the admin API's, say): same revisions as before,
-- one function call fewer per row.  An unlimited key's remain_quota does
-- not move, so neither does its bal_rev, as before.

CREATE OR REPLACE FUNCTION llmgw_flush_apply(p_tok bigint[], p_tok_d bigint[],
                                             p_usr bigint[], p_usr_d bigint[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_d   bigint[];
    v_t   jsonb;
    v_tr  jsonb;
    v_u   jsonb;
    v_ur  jsonb;
BEGIN
    SELECT array_agg(id ORDER BY id), array_agg(d ORDER BY id)
      INTO v_ids, v_d
      FROM (SELECT id, sum(delta)::bigint AS d
              FROM unnest(p_tok, p_tok_d) AS x(id, delta)
             WHERE id IS NOT NULL GROUP BY id HAVING sum(delta) <> 0) AS s;

    IF v_ids IS NOT NULL THEN
        -- Lock order: tokens by id, then users by id.
        PERFORM 1 FROM tokens WHERE id = ANY (v_ids) ORDER BY id FOR UPDATE;
        UPDATE tokens AS t
           SET remain_quota = CASE WHEN t.unlimited_quota THEN t.remain_quota
                                   ELSE t.remain_quota - x.delta END,
               used_quota   = t.used_quota + x.delta,
               bal_rev      = CASE WHEN t.unlimited_quota THEN t.bal_rev
                                   ELSE t.bal_rev + 1 END
          FROM unnest(v_ids, v_d) AS x(id, delta)
         WHERE t.id = x.id;
    END IF;

    SELECT array_agg(id ORDER BY id), array_agg(d ORDER BY id)
      INTO v_ids, v_d
      FROM (SELECT id, sum(delta)::bigint AS d
              FROM unnest(p_usr, p_usr_d) AS x(id, delta)
             WHERE id IS NOT NULL GROUP BY id HAVING sum(delta) <> 0) AS s;

    IF v_ids IS NOT NULL THEN
        PERFORM 1 FROM users WHERE id = ANY (v_ids) ORDER BY id FOR UPDATE;
        UPDATE users AS u
           SET quota      = u.quota - x.delta,
               used_quota = u.used_quota + x.delta,
               bal_rev    = u.bal_rev + 1
          FROM unnest(v_ids, v_d) AS x(id, delta)
         WHERE u.id = x.id;
    END IF;

    -- Each balance with its own revision: one read per table.
    SELECT jsonb_object_agg(t.id::text, t.remain_quota),
           jsonb_object_agg(t.id::text, t.bal_rev)
      INTO v_t, v_tr
      FROM tokens AS t WHERE t.id = ANY (p_tok);
    SELECT jsonb_object_agg(u.id::text, u.quota),
           jsonb_object_agg(u.id::text, u.bal_rev)
      INTO v_u, v_ur
      FROM users AS u WHERE u.id = ANY (p_usr);

    RETURN jsonb_build_object('tokens', coalesce(v_t, '{}'::jsonb),
                              'users', coalesce(v_u, '{}'::jsonb),
                              'token_revs', coalesce(v_tr, '{}'::jsonb),
                              'user_revs', coalesce(v_ur, '{}'::jsonb));
END $$;

DROP FUNCTION llmgw_flush_apply_base(bigint[], bigint[], bigint[], bigint[]);

DROP TRIGGER tokens_bal_rev ON tokens;
DROP TRIGGER users_bal_rev ON users;

CREATE TRIGGER tokens_bal_rev BEFORE UPDATE ON tokens
    FOR EACH ROW
    WHEN (NEW.bal_rev = OLD.bal_rev
          AND (NEW.remain_quota IS DISTINCT FROM OLD.remain_quota
               OR NEW.unlimited_quota IS DISTINCT FROM OLD.unlimited_quota))
    EXECUTE FUNCTION llmgw_bal_rev_tokens();
CREATE TRIGGER users_bal_rev BEFORE UPDATE ON users
    FOR EACH ROW
    WHEN (NEW.bal_rev = OLD.bal_rev AND NEW.quota IS DISTINCT FROM OLD.quota)
    EXECUTE FUNCTION llmgw_bal_rev_users();
