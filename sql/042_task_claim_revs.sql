-- The refunds of the tasks a claim finds past their deadline answer each
-- balance with its revision, as the other task balance moves do (037):
-- the poller learns them at once.  Without them (and unread) the key whose
-- quota an expired task held was refused until a later reading, though
-- the database held the refund.
--
-- llmgw_task_claim(owner, limit, lease_ms, skip): as 026's, its answer
-- with token_revs and user_revs beside tokens and users.

CREATE OR REPLACE FUNCTION llmgw_task_claim(p_owner text, p_limit int, p_lease_ms int,
                                            p_skip bigint[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v         tasks;
    v_tok     jsonb := '{}';
    v_usr     jsonb := '{}';
    v_expired int := 0;
    v_old     bigint;
    d         bigint;
    v_tasks   text;
    v_bal     jsonb;
BEGIN
    IF coalesce(p_owner, '') = '' OR p_limit IS NULL OR p_limit < 1
       OR p_lease_ms IS NULL OR p_lease_ms < 1 THEN
        RAISE EXCEPTION 'llmgw_task_claim: needs an owner, a limit >= 1 and a lease >= 1 ms';
    END IF;

    -- The outer deadline, whatever the channel: fail and refund what is
    -- past it, once (SKIP LOCKED and the status guard, as in 005).
    FOR v IN
        SELECT * FROM tasks
         WHERE status NOT IN ('SUCCESS', 'FAILURE') AND deadline <= now()
         ORDER BY deadline
         LIMIT greatest(p_limit, 100)
           FOR UPDATE SKIP LOCKED
    LOOP
        v_old := v.quota;
        UPDATE tasks
           SET status = 'FAILURE', fail_reason = 'task timed out', quota = 0,
               data = CASE WHEN retain_result THEN data END,
               finished_at = now(), updated_at = now(),
               lease_owner = NULL, lease_until = NULL
         WHERE id = v.id
        RETURNING * INTO v;
        d := llmgw_task_step(v, 'refund', v_old);
        v_tok := llmgw_task_acc(v_tok, v.token_id, d);
        v_usr := llmgw_task_acc(v_usr, v.user_id, d);
        v_expired := v_expired + 1;
    END LOOP;

    WITH claimed AS (
        UPDATE tasks AS t
           SET lease_owner = p_owner,
               lease_until = now() + make_interval(secs => p_lease_ms / 1000.0)
         WHERE t.id = ANY (ARRAY(
                   SELECT id FROM tasks
                    WHERE status NOT IN ('SUCCESS', 'FAILURE')
                      AND next_poll_at <= now()
                      AND (lease_until IS NULL OR lease_until <= now())
                      AND deadline > now()
                      AND coalesce(channel_id, 0) <> ALL (coalesce(p_skip, '{}'))
                    ORDER BY next_poll_at
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED))
        RETURNING t.*
    )
    SELECT coalesce(json_agg(llmgw_task_json_text(c) ORDER BY c.next_poll_at, c.id)::text, '[]')
      INTO v_tasks
      FROM claimed AS c;

    v_bal := llmgw_task_apply(v_tok, v_usr);
    RETURN ('{"expired": ' || v_expired
            || ', "tokens": ' || (v_bal -> 'tokens')::text
            || ', "users": ' || (v_bal -> 'users')::text
            || ', "token_revs": ' || coalesce(v_bal -> 'token_revs', '{}')::text
            || ', "user_revs": ' || coalesce(v_bal -> 'user_revs', '{}')::text
            || ', "tasks": ' || v_tasks || '}')::jsonb;
END $$;
