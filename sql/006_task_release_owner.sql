-- A stopping poller gives back every lease it holds, so its tasks are due
-- again at once instead of after the lease expires.

CREATE FUNCTION llmgw_task_release_owner(p_owner text)
RETURNS jsonb LANGUAGE sql AS $$
    WITH r AS (
        UPDATE tasks
           SET lease_owner = NULL, lease_until = NULL
         WHERE lease_owner = p_owner
           AND status NOT IN ('SUCCESS', 'FAILURE')
        RETURNING 1
    )
    SELECT jsonb_build_object('released', (SELECT count(*) FROM r))
$$;
