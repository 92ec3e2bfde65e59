-- A client request that waits for its own task (host_image with an
-- asynchronous upstream) polls it with the ordinary query hooks, under a
-- lease like any poller's, so that it and the background pollers never
-- poll one task at once.
--
-- llmgw_task_claim_one(owner, task_id, lease_ms) -> {task, claimed}: the
-- task's row (as llmgw_task_claim gives rows), leased to owner when it is
-- unfinished, within its deadline and nobody else's lease; task null when
-- the row is locked by another transaction this instant (or does not
-- exist): the caller asks again later.

CREATE FUNCTION llmgw_task_claim_one(p_owner text, p_task_id text, p_lease_ms int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v         tasks;
    v_claimed boolean := false;
BEGIN
    IF coalesce(p_owner, '') = '' OR p_lease_ms IS NULL OR p_lease_ms < 1 THEN
        RAISE EXCEPTION 'llmgw_task_claim_one: needs an owner and a lease >= 1 ms';
    END IF;

    SELECT * INTO v FROM tasks WHERE task_id = p_task_id FOR UPDATE SKIP LOCKED;

    IF NOT FOUND THEN
        RETURN jsonb_build_object('task', NULL, 'claimed', false);
    END IF;

    IF v.status NOT IN ('SUCCESS', 'FAILURE') AND v.deadline > now()
       AND (v.lease_until IS NULL OR v.lease_until <= now()) THEN
        UPDATE tasks
           SET lease_owner = p_owner,
               lease_until = now() + make_interval(secs => p_lease_ms / 1000.0)
         WHERE id = v.id
        RETURNING * INTO v;
        v_claimed := true;
    END IF;

    RETURN jsonb_build_object('task', llmgw_task_json_text(v)::jsonb,
                              'claimed', v_claimed);
END $$;
