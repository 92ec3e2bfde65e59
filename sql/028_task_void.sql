-- A request that created a task and then could not answer its result (the
-- plugin's render of a finished image or Response failed) fails the task
-- and refunds it, so that the client, who got an error and will retry, does
-- not pay for a result it never saw.
--
-- llmgw_task_void(task_id, reason) -> {voided, refunded, tokens, users}:
-- a SUCCESS task becomes FAILURE with the reason, its net charge refunded
-- in one 'refund' row (written once: a second call finds FAILURE and does
-- nothing); any other task is left as it is (voided false).

CREATE FUNCTION llmgw_task_void(p_task_id text, p_reason text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v     tasks;
    v_old bigint;
    d     bigint;
BEGIN
    SELECT * INTO v FROM tasks WHERE task_id = p_task_id FOR UPDATE;
    IF NOT FOUND OR v.status IS DISTINCT FROM 'SUCCESS' THEN
        RETURN jsonb_build_object('voided', false, 'refunded', 0);
    END IF;

    v_old := v.quota;
    UPDATE tasks
       SET status = 'FAILURE', fail_reason = left(coalesce(p_reason, ''), 1000),
           quota = 0, updated_at = now()
     WHERE id = v.id
    RETURNING * INTO v;

    d := llmgw_task_step(v, 'refund', v_old);
    RETURN jsonb_build_object('voided', true, 'refunded', -d)
        || llmgw_task_apply_one(v.token_id, v.user_id, d);
END $$;
