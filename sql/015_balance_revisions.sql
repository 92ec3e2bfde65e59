-- Balance revisions: the order in which a node learns balances.
--
-- A node keeps each key's and user's balance in its shared zone as "what
-- PostgreSQL last said" and takes its own charges in flight off it.  It
-- learns balances from two places: the answer of a ledger write (after its
-- own update) and a key lookup (a read that may run before a concurrent
-- write commits).  Ordering those readings by when they were sent is wrong
-- when they run in the other order, and a write whose answer loses that
-- comparison is then forgotten by the zone (overspending).  So every change
-- of a balance bumps the row's bal_rev, in the database's own order (updates
-- of one row are serialised by its lock), and a node keeps the reading with
-- the highest bal_rev: a reading that includes a write has a revision at
-- least as high as the write's own.

ALTER TABLE tokens ADD COLUMN bal_rev bigint NOT NULL DEFAULT 0;
ALTER TABLE users  ADD COLUMN bal_rev bigint NOT NULL DEFAULT 0;

CREATE FUNCTION llmgw_bal_rev_tokens() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.remain_quota IS DISTINCT FROM OLD.remain_quota
       OR NEW.unlimited_quota IS DISTINCT FROM OLD.unlimited_quota
    THEN
        NEW.bal_rev := OLD.bal_rev + 1;
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION llmgw_bal_rev_users() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.quota IS DISTINCT FROM OLD.quota THEN
        NEW.bal_rev := OLD.bal_rev + 1;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tokens_bal_rev BEFORE UPDATE ON tokens
    FOR EACH ROW EXECUTE FUNCTION llmgw_bal_rev_tokens();
CREATE TRIGGER users_bal_rev BEFORE UPDATE ON users
    FOR EACH ROW EXECUTE FUNCTION llmgw_bal_rev_users();


-- The key lookup carries the revisions of the balances it read.
CREATE OR REPLACE FUNCTION llmgw_token_lookup(key_hash text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', t.id, 'user_id', t.user_id, 'name', t.name, 'status', t.status,
        'expired_time', t.expired_time, 'remain_quota', t.remain_quota,
        'used_quota', t.used_quota, 'unlimited_quota', t.unlimited_quota,
        'bal_rev', t.bal_rev,
        'models', t.models, 'allow_ips', t.allow_ips, 'group', t."group",
        'user', jsonb_build_object('id', u.id, 'status', u.status,
                                   'quota', u.quota, 'used_quota', u.used_quota,
                                   'bal_rev', u.bal_rev,
                                   'group', u."group"))
      FROM tokens AS t
      JOIN users AS u ON u.id = t.user_id
     WHERE t.key_hash = $1
       AND t.deleted_at IS NULL
       AND u.deleted_at IS NULL
$$;


-- A ledger write answers the revisions with the balances: read again, all
-- in one statement (one snapshot), so that each balance goes with its own
-- revision.
ALTER FUNCTION llmgw_flush_apply(bigint[], bigint[], bigint[], bigint[])
    RENAME TO llmgw_flush_apply_base;

CREATE FUNCTION llmgw_flush_apply(p_tok bigint[], p_tok_d bigint[],
                                  p_usr bigint[], p_usr_d bigint[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v jsonb;
BEGIN
    v := llmgw_flush_apply_base(p_tok, p_tok_d, p_usr, p_usr_d);

    RETURN v || jsonb_build_object(
        'tokens', coalesce((SELECT jsonb_object_agg(t.id::text, t.remain_quota)
                              FROM tokens AS t WHERE t.id = ANY (p_tok)),
                           '{}'::jsonb),
        'users', coalesce((SELECT jsonb_object_agg(u.id::text, u.quota)
                             FROM users AS u WHERE u.id = ANY (p_usr)),
                          '{}'::jsonb),
        'token_revs', coalesce((SELECT jsonb_object_agg(t.id::text, t.bal_rev)
                                  FROM tokens AS t WHERE t.id = ANY (p_tok)),
                               '{}'::jsonb),
        'user_revs', coalesce((SELECT jsonb_object_agg(u.id::text, u.bal_rev)
                                 FROM users AS u WHERE u.id = ANY (p_usr)),
                              '{}'::jsonb));
END $$;
