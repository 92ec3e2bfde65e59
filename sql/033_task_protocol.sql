-- A task remembers the host protocol it was created through, so that a
-- protocol's retrieval (GET /v1/videos/{id}, its content, GET
-- /v1/responses/{id}) finds only its own tasks: a plugin may claim several
-- protocols for one model, and its tasks from /v1/tasks/{key}, a native
-- route or another protocol are none of that protocol's.
--
--   tasks.protocol: host_video, host_image or host_responses; '' for a
--   task created otherwise; NULL for a task created before this file, or
--   by a gateway from before it (still running while an upgrade is rolled
--   out), which recorded nothing: such a task is read as before, through
--   any protocol its plugin claims for its model.
--
--   tasks.background: a Response created with background: true, whose
--   retrieval says so while it runs.
--
-- llmgw_task_create takes the members protocol (a gateway from before this
-- file sends none) and background; llmgw_task_json (the rows of
-- llmgw_task_lookup) gives them.

ALTER TABLE tasks ADD COLUMN protocol text;
-- after the ADD, so that the rows already there keep NULL
ALTER TABLE tasks ALTER COLUMN protocol SET DEFAULT '';
ALTER TABLE tasks ADD COLUMN background boolean NOT NULL DEFAULT false;

ALTER FUNCTION llmgw_task_create(jsonb) RENAME TO llmgw_task_create_base;

-- A protocol's task is marked after its insert, and one from a gateway
-- that does not know protocols is left unknown; the others keep the
-- default and cost no second write.  A repeated create changes nothing.
CREATE FUNCTION llmgw_task_create(t jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    r jsonb := llmgw_task_create_base(t);
BEGIN
    IF NOT t ? 'protocol' OR coalesce(t ->> 'protocol', '') <> '' THEN
        UPDATE tasks SET protocol = nullif(t ->> 'protocol', ''),
                         background = coalesce(t -> 'background' = 'true', false)
         WHERE task_id = t ->> 'task_id' AND protocol = '';
    END IF;
    RETURN r;
END $$;

CREATE OR REPLACE FUNCTION llmgw_task_json(t tasks) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT llmgw_task_json_text(t)::jsonb
           || jsonb_build_object('protocol', t.protocol,
                                 'background', t.background)
$$;
