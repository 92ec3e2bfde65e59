-- The task engine's state: durable tasks, the poll leases that let many
-- workers on many nodes share them, and task billing.
--
-- A task is billed in steps, each one ledger row whose request_id is the
-- public task id: 'reserve' at submit, 'adjust' when extractUsageOnSubmit
-- corrects it, then 'settle' at SUCCESS or 'refund' (everything charged so
-- far) at FAILURE.  UNIQUE (request_id, type) makes every step happen once,
-- and a step moves balances only when its row is new, so two nodes that see
-- the same terminal status settle it once.
--
-- Lock order everywhere: task rows (by task_id), then ledger rows, then
-- tokens by id, then users by id -- the order llmgw_flush uses for the last
-- three -- so concurrent callers queue instead of deadlocking.


-- ======================================================================
-- Ledger: the task billing steps
-- ======================================================================

ALTER TABLE logs DROP CONSTRAINT logs_type_check;
ALTER TABLE logs ADD CONSTRAINT logs_type_check
    CHECK (type IN ('consume', 'refund', 'error', 'reserve', 'adjust', 'settle'));

-- As in 001, with 'adjust' and 'settle': signed charges (+quota) like
-- 'consume', should a node ever flush them.
CREATE OR REPLACE FUNCTION llmgw_flush_rows(rows jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_n     bigint;
    v_tok   bigint[];
    v_tok_d bigint[];
    v_usr   bigint[];
    v_usr_d bigint[];
BEGIN
    IF jsonb_typeof($1) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'llmgw_flush: rows must be a JSON array';
    END IF;

    -- Insert in (request_id, type) order so two concurrent flushes that
    -- share rows wait on each other instead of deadlocking.  Only the rows
    -- RETURNING gives back (the new ones) move balances.
    WITH src AS (
        SELECT r ->> 'request_id' AS request_id,
               r ->> 'type' AS type,
               nullif(r ->> 'user_id', '')::numeric::bigint AS user_id,
               nullif(r ->> 'token_id', '')::numeric::bigint AS token_id,
               r ->> 'model_name' AS model_name,
               r ->> 'upstream_model' AS upstream_model,
               nullif(r ->> 'channel_id', '')::numeric::bigint AS channel_id,
               nullif(r -> 'channels_tried', 'null') AS channels_tried,
               r ->> 'endpoint' AS endpoint,
               coalesce((r ->> 'prompt_tokens')::numeric, 0)::bigint AS prompt_tokens,
               coalesce((r ->> 'completion_tokens')::numeric, 0)::bigint AS completion_tokens,
               coalesce((r ->> 'cache_read_tokens')::numeric, 0)::bigint AS cache_read_tokens,
               coalesce((r ->> 'cache_creation_tokens')::numeric, 0)::bigint AS cache_creation_tokens,
               coalesce((r ->> 'quota')::numeric, 0)::bigint AS quota,
               coalesce((r ->> 'is_stream')::boolean, false) AS is_stream,
               (r ->> 'status')::numeric::int AS status,
               (r ->> 'latency_ms')::numeric::int AS latency_ms,
               coalesce(r ->> 'content', '') AS content,
               coalesce(to_timestamp((r ->> 'created_at')::float8), now()) AS created_at
          FROM jsonb_array_elements($1) AS r
    ), ins AS (
        INSERT INTO logs (request_id, type, user_id, token_id, model_name,
                          upstream_model, channel_id, channels_tried, endpoint,
                          prompt_tokens, completion_tokens, cache_read_tokens,
                          cache_creation_tokens, quota, is_stream, status,
                          latency_ms, content, created_at)
        SELECT s.request_id, s.type,
               -- A row without user_id is charged to the token's owner.
               coalesce(s.user_id, (SELECT t.user_id FROM tokens AS t WHERE t.id = s.token_id)),
               s.token_id, s.model_name, s.upstream_model, s.channel_id,
               s.channels_tried, s.endpoint, s.prompt_tokens, s.completion_tokens,
               s.cache_read_tokens, s.cache_creation_tokens, s.quota, s.is_stream,
               s.status, s.latency_ms, s.content, s.created_at
          FROM src AS s
         ORDER BY s.request_id, s.type
        ON CONFLICT (request_id, type) DO NOTHING
        RETURNING logs.type, logs.token_id, logs.user_id, logs.quota
    ), d AS (
        SELECT token_id, user_id,
               CASE type WHEN 'consume' THEN quota
                         WHEN 'reserve' THEN quota
                         WHEN 'adjust'  THEN quota
                         WHEN 'settle'  THEN quota
                         WHEN 'refund'  THEN -quota
                         ELSE 0 END AS delta
          FROM ins
    ), tok AS (
        SELECT token_id AS id, sum(delta)::bigint AS delta FROM d
         WHERE token_id IS NOT NULL GROUP BY token_id HAVING sum(delta) <> 0
    ), usr AS (
        SELECT user_id AS id, sum(delta)::bigint AS delta FROM d
         WHERE user_id IS NOT NULL GROUP BY user_id HAVING sum(delta) <> 0
    )
    SELECT (SELECT count(*) FROM ins),
           (SELECT array_agg(id ORDER BY id) FROM tok),
           (SELECT array_agg(delta ORDER BY id) FROM tok),
           (SELECT array_agg(id ORDER BY id) FROM usr),
           (SELECT array_agg(delta ORDER BY id) FROM usr)
      INTO v_n, v_tok, v_tok_d, v_usr, v_usr_d;

    IF v_tok IS NOT NULL THEN
        PERFORM 1 FROM tokens WHERE id = ANY (v_tok) ORDER BY id FOR UPDATE;
        UPDATE tokens AS t
           SET remain_quota = CASE WHEN t.unlimited_quota THEN t.remain_quota
                                   ELSE t.remain_quota - x.delta END,
               used_quota   = t.used_quota + x.delta
          FROM unnest(v_tok, v_tok_d) AS x(id, delta)
         WHERE t.id = x.id;
    END IF;
    IF v_usr IS NOT NULL THEN
        PERFORM 1 FROM users WHERE id = ANY (v_usr) ORDER BY id FOR UPDATE;
        UPDATE users AS u
           SET quota      = u.quota - x.delta,
               used_quota = u.used_quota + x.delta
          FROM unnest(v_usr, v_usr_d) AS x(id, delta)
         WHERE u.id = x.id;
    END IF;

    RETURN jsonb_build_object('inserted', v_n);
END $$;

-- As in 001, with the task steps accepted as a type filter.
CREATE OR REPLACE FUNCTION llmgw_api_log(q jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    pg      record;
    v_token bigint := llmgw_q_int(q, 'token_id', NULL);
    v_user  bigint := llmgw_q_int(q, 'user_id', NULL);
    v_from  bigint := llmgw_q_int(q, 'from', NULL, 0, 100000000000);
    v_to    bigint := llmgw_q_int(q, 'to', NULL, 0, 100000000000);
    v_model text   := nullif(q ->> 'model', '');
    v_type  text   := nullif(q ->> 'type', '');
    v_where text;
    v_items jsonb;
    v_total bigint;
BEGIN
    SELECT * INTO pg FROM llmgw_q_page(q);
    IF v_type IS NOT NULL AND v_type NOT IN ('consume', 'refund', 'error', 'reserve',
                                             'adjust', 'settle') THEN
        PERFORM llmgw_bad('type: must be one of consume, refund, error, reserve, adjust, settle');
    END IF;

    v_where := 'WHERE ($1 IS NULL OR token_id = $1)
                  AND ($2 IS NULL OR user_id = $2)
                  AND ($3 IS NULL OR model_name = $3)
                  AND ($4 IS NULL OR type = $4)
                  AND ($5 IS NULL OR created_at >= to_timestamp($5))
                  AND ($6 IS NULL OR created_at < to_timestamp($6 + 1))';

    EXECUTE 'SELECT count(*) FROM logs ' || v_where
        INTO v_total
        USING v_token, v_user, v_model, v_type, v_from, v_to;

    EXECUTE 'SELECT coalesce(jsonb_agg(jsonb_build_object(
                 ''id'', id, ''request_id'', request_id, ''type'', type,
                 ''user_id'', user_id, ''token_id'', token_id,
                 ''model_name'', model_name, ''upstream_model'', upstream_model,
                 ''channel_id'', channel_id, ''channels_tried'', channels_tried,
                 ''endpoint'', endpoint, ''prompt_tokens'', prompt_tokens,
                 ''completion_tokens'', completion_tokens,
                 ''cache_read_tokens'', cache_read_tokens,
                 ''cache_creation_tokens'', cache_creation_tokens,
                 ''quota'', quota, ''is_stream'', is_stream, ''status'', status,
                 ''latency_ms'', latency_ms,
                 ''created_at'', llmgw_epoch(created_at))
                 ORDER BY created_at DESC, id DESC), ''[]'')
               FROM (SELECT * FROM logs ' || v_where || '
                      ORDER BY created_at DESC, id DESC
                      LIMIT $7 OFFSET $8) AS l'
        INTO v_items
        USING v_token, v_user, v_model, v_type, v_from, v_to,
              pg.page_size, pg.skip;

    RETURN jsonb_build_object('items', v_items, 'total', v_total,
                              'page', pg.page, 'page_size', pg.page_size);
END $$;


-- ======================================================================
-- Tasks
-- ======================================================================

-- No foreign keys, as for logs: a task outlives a deleted plugin, channel
-- or key, and stays for billing and history.
CREATE TABLE tasks (
    id               bigserial   PRIMARY KEY,
    task_id          text        NOT NULL UNIQUE,   -- public "task_..."
    upstream_task_id text,                          -- private, never shown
    plugin_key       text        NOT NULL,
    plugin_version   text,
    channel_id       bigint,
    user_id          bigint      NOT NULL,
    token_id         bigint,
    request_id       text,                          -- of the submit request
    action           text,
    model            text,                          -- the client's
    upstream_model   text,
    status           text        NOT NULL
                                 CHECK (status IN ('NOT_START', 'SUBMITTED', 'QUEUED',
                                                   'IN_PROGRESS', 'SUCCESS', 'FAILURE',
                                                   'UNKNOWN')),
    progress         text,
    fail_reason      text,
    data             jsonb,
    state            jsonb,                         -- the plugin's
    retain_result    boolean     NOT NULL DEFAULT true,
    poll_failures    int         NOT NULL DEFAULT 0,
    quota            bigint      NOT NULL DEFAULT 0, -- charged so far, net
    usage            jsonb,                         -- facts last used
    group_ratio      float8      NOT NULL DEFAULT 1,
    price            jsonb,                         -- the pricing entry used
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    submitted_at     timestamptz,
    finished_at      timestamptz,
    next_poll_at     timestamptz NOT NULL DEFAULT now(),
    lease_owner      text,
    lease_until      timestamptz,
    deadline         timestamptz NOT NULL
);

-- The pollers' queries repeat these predicates word for word so that the
-- planner can use the partial indexes.
CREATE INDEX tasks_due ON tasks (next_poll_at)
    WHERE status NOT IN ('SUCCESS', 'FAILURE');
CREATE INDEX tasks_deadline ON tasks (deadline)
    WHERE status NOT IN ('SUCCESS', 'FAILURE');
CREATE INDEX tasks_user_time ON tasks (user_id, created_at);


-- What callers and renderers see (the public task view).
CREATE FUNCTION llmgw_task_view(t tasks) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'task_id', t.task_id, 'status', t.status, 'progress', t.progress,
        'fail_reason', t.fail_reason,
        'created_at', llmgw_epoch(t.created_at),
        'updated_at', llmgw_epoch(t.updated_at),
        'finished_at', llmgw_epoch(t.finished_at),
        'data', t.data, 'model', t.model, 'action', t.action,
        'plugin', t.plugin_key)
$$;

-- Everything the gateway needs to poll or render a task, private fields
-- included; never sent to a client as it is.
CREATE FUNCTION llmgw_task_json(t tasks) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'task_id', t.task_id, 'upstream_task_id', t.upstream_task_id,
        'plugin_key', t.plugin_key, 'plugin_version', t.plugin_version,
        'channel_id', t.channel_id, 'user_id', t.user_id,
        'token_id', t.token_id, 'request_id', t.request_id,
        'action', t.action, 'model', t.model,
        'upstream_model', t.upstream_model, 'status', t.status,
        'progress', t.progress, 'fail_reason', t.fail_reason,
        'data', t.data, 'state', t.state, 'retain_result', t.retain_result,
        'poll_failures', t.poll_failures, 'quota', t.quota,
        'usage', t.usage, 'group_ratio', t.group_ratio, 'price', t.price,
        'created_at', llmgw_epoch(t.created_at),
        'updated_at', llmgw_epoch(t.updated_at),
        'submitted_at', llmgw_epoch(t.submitted_at),
        'finished_at', llmgw_epoch(t.finished_at),
        'next_poll_at', llmgw_epoch(t.next_poll_at),
        'deadline', llmgw_epoch(t.deadline),
        'lease_owner', t.lease_owner,
        'lease_until', llmgw_epoch(t.lease_until))
$$;

CREATE FUNCTION llmgw_task_terminal(p_status text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_status IN ('SUCCESS', 'FAILURE')
$$;

-- A member that must be an integral JSON number (or absent/null: p_default).
CREATE FUNCTION llmgw_task_int(p jsonb, p_name text, p_default bigint,
                               p_lo bigint DEFAULT 0)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE v jsonb := p -> p_name;
BEGIN
    IF v IS NULL OR v = 'null' THEN
        RETURN p_default;
    END IF;
    IF jsonb_typeof(v) <> 'number' OR v::numeric <> trunc(v::numeric)
       OR v::numeric < p_lo OR v::numeric > 9223372036854775807 THEN
        RAISE EXCEPTION 'llmgw_task: % must be an integer >= %, not %',
            p_name, p_lo, v::text;
    END IF;
    RETURN v::numeric::bigint;
END $$;

CREATE FUNCTION llmgw_task_status_arg(p jsonb, p_default text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE s text := coalesce(p ->> 'status', p_default);
BEGIN
    IF s IS NULL OR s NOT IN ('NOT_START', 'SUBMITTED', 'QUEUED', 'IN_PROGRESS',
                              'SUCCESS', 'FAILURE', 'UNKNOWN') THEN
        RAISE EXCEPTION 'llmgw_task: unknown status %', coalesce(p ->> 'status', 'null');
    END IF;
    RETURN s;
END $$;

-- Adds d to the entry for id in {"<id>": delta}; a zero still records the
-- id, so its balance is reported.
CREATE FUNCTION llmgw_task_acc(m jsonb, p_id bigint, d bigint) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_id IS NULL THEN m
                ELSE m || jsonb_build_object(p_id::text,
                              coalesce((m ->> p_id::text)::bigint, 0) + d) END
$$;

-- Writes one billing step of a task; answers the balance delta it causes
-- (+quota for a charge, -quota for a refund), 0 when the step was written
-- before.
CREATE FUNCTION llmgw_task_step(t tasks, p_type text, p_quota bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO logs (request_id, type, user_id, token_id, model_name,
                      upstream_model, channel_id, channels_tried, endpoint,
                      quota, content)
    VALUES (t.task_id, p_type, t.user_id, t.token_id, t.model,
            t.upstream_model, t.channel_id,
            CASE WHEN t.channel_id IS NULL THEN NULL
                 ELSE jsonb_build_array(t.channel_id) END,
            'task:' || t.plugin_key, p_quota,
            CASE WHEN p_type = 'refund' THEN coalesce(t.fail_reason, '')
                 ELSE coalesce(t.usage::text, '') END)
    ON CONFLICT (request_id, type) DO NOTHING;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    RETURN CASE WHEN p_type = 'refund' THEN -p_quota ELSE p_quota END;
END $$;

-- Moves balances by {"<token id>": delta} and {"<user id>": delta} the way
-- llmgw_flush does (an unlimited token keeps its remain_quota), locking in
-- id order; answers {"tokens": {id: remain_quota}, "users": {id: quota}}
-- for every id given.
CREATE FUNCTION llmgw_task_apply(p_tok jsonb, p_usr jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM tokens
     WHERE id IN (SELECT key::bigint FROM jsonb_each_text(p_tok) WHERE value::bigint <> 0)
     ORDER BY id FOR UPDATE;
    UPDATE tokens AS t
       SET remain_quota = CASE WHEN t.unlimited_quota THEN t.remain_quota
                               ELSE t.remain_quota - x.d END,
           used_quota   = t.used_quota + x.d
      FROM (SELECT key::bigint AS id, value::bigint AS d
              FROM jsonb_each_text(p_tok)) AS x
     WHERE t.id = x.id AND x.d <> 0;

    PERFORM 1 FROM users
     WHERE id IN (SELECT key::bigint FROM jsonb_each_text(p_usr) WHERE value::bigint <> 0)
     ORDER BY id FOR UPDATE;
    UPDATE users AS u
       SET quota      = u.quota - x.d,
           used_quota = u.used_quota + x.d
      FROM (SELECT key::bigint AS id, value::bigint AS d
              FROM jsonb_each_text(p_usr)) AS x
     WHERE u.id = x.id AND x.d <> 0;

    RETURN jsonb_build_object(
        'tokens', coalesce((SELECT jsonb_object_agg(t.id::text, t.remain_quota)
                              FROM tokens AS t
                             WHERE t.id IN (SELECT key::bigint FROM jsonb_each_text(p_tok))),
                           '{}'),
        'users', coalesce((SELECT jsonb_object_agg(u.id::text, u.quota)
                             FROM users AS u
                            WHERE u.id IN (SELECT key::bigint FROM jsonb_each_text(p_usr))),
                          '{}'));
END $$;


-- ----------------------------------------------------------------------
-- llmgw_task_create(t): the task row and its submit-time billing steps
-- ----------------------------------------------------------------------

CREATE FUNCTION llmgw_task_create(t jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v         tasks;
    v_status  text;
    v_reserve bigint;
    v_submit  bigint;
    v_final   bigint;
    v_quota   bigint;
    v_retain  boolean;
    v_tok     jsonb := '{}';
    v_usr     jsonb := '{}';
    d         bigint;
BEGIN
    IF jsonb_typeof(t) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'llmgw_task_create: the argument must be a JSON object';
    END IF;
    IF coalesce(t ->> 'task_id', '') = '' OR coalesce(t ->> 'plugin_key', '') = '' THEN
        RAISE EXCEPTION 'llmgw_task_create: task_id and plugin_key are required';
    END IF;
    v_status  := llmgw_task_status_arg(t, 'SUBMITTED');
    v_reserve := llmgw_task_int(t, 'quota_reserve', 0);
    v_submit  := llmgw_task_int(t, 'quota_submit', NULL);
    v_final   := llmgw_task_int(t, 'final_quota', NULL);
    v_retain  := coalesce((t ->> 'retain_result')::boolean, true);
    IF llmgw_task_int(t, 'user_id', NULL, 1) IS NULL THEN
        RAISE EXCEPTION 'llmgw_task_create: user_id is required';
    END IF;

    -- The quota the row ends with after the steps below.
    v_quota := coalesce(v_submit, v_reserve);
    IF v_status = 'SUCCESS' THEN
        v_quota := coalesce(v_final, v_quota);
    ELSIF v_status = 'FAILURE' THEN
        v_quota := 0;
    END IF;

    INSERT INTO tasks (task_id, upstream_task_id, plugin_key, plugin_version,
                       channel_id, user_id, token_id, request_id, action, model,
                       upstream_model, status, progress, fail_reason, data, state,
                       retain_result, quota, usage, group_ratio, price,
                       submitted_at, finished_at, next_poll_at, deadline)
    VALUES (t ->> 'task_id', t ->> 'upstream_task_id', t ->> 'plugin_key',
            t ->> 'plugin_version',
            llmgw_task_int(t, 'channel_id', NULL, 1),
            llmgw_task_int(t, 'user_id', NULL, 1),
            llmgw_task_int(t, 'token_id', NULL, 1),
            t ->> 'request_id', t ->> 'action', t ->> 'model',
            t ->> 'upstream_model', v_status, t ->> 'progress',
            t ->> 'fail_reason',
            -- retainResult false: a terminal result is billed, not kept
            CASE WHEN llmgw_task_terminal(v_status) AND NOT v_retain THEN NULL
                 ELSE nullif(t -> 'data', 'null') END,
            nullif(t -> 'state', 'null'), v_retain, v_quota,
            nullif(t -> 'usage', 'null'),
            coalesce((t ->> 'group_ratio')::float8, 1),
            nullif(t -> 'price', 'null'),
            now(),
            CASE WHEN llmgw_task_terminal(v_status) THEN now() END,
            now() + make_interval(secs => llmgw_task_int(t, 'poll_interval_ms', 15000) / 1000.0),
            now() + make_interval(secs => llmgw_task_int(t, 'timeout_ms', 86400000) / 1000.0))
    ON CONFLICT (task_id) DO NOTHING
    RETURNING * INTO v;

    IF NOT FOUND THEN
        -- A repeated create (a retried statement): report, change nothing.
        SELECT * INTO v FROM tasks WHERE task_id = t ->> 'task_id';
        RETURN jsonb_build_object('task', llmgw_task_view(v))
            || llmgw_task_apply(llmgw_task_acc('{}', v.token_id, 0),
                                llmgw_task_acc('{}', v.user_id, 0));
    END IF;

    d := llmgw_task_step(v, 'reserve', v_reserve);
    v_tok := llmgw_task_acc(v_tok, v.token_id, d);
    v_usr := llmgw_task_acc(v_usr, v.user_id, d);

    IF v_submit IS NOT NULL THEN
        d := llmgw_task_step(v, 'adjust', v_submit - v_reserve);
        v_tok := llmgw_task_acc(v_tok, v.token_id, d);
        v_usr := llmgw_task_acc(v_usr, v.user_id, d);
    END IF;

    IF v_status = 'SUCCESS' THEN
        d := llmgw_task_step(v, 'settle', v_quota - coalesce(v_submit, v_reserve));
    ELSIF v_status = 'FAILURE' THEN
        d := llmgw_task_step(v, 'refund', coalesce(v_submit, v_reserve));
    ELSE
        d := 0;
    END IF;
    v_tok := llmgw_task_acc(v_tok, v.token_id, d);
    v_usr := llmgw_task_acc(v_usr, v.user_id, d);

    RETURN jsonb_build_object('task', llmgw_task_view(v))
        || llmgw_task_apply(v_tok, v_usr);
END $$;


-- ----------------------------------------------------------------------
-- llmgw_task_claim(owner, limit, lease_ms): due tasks for one poller
-- ----------------------------------------------------------------------

CREATE FUNCTION llmgw_task_claim(p_owner text, p_limit int, p_lease_ms int)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v         tasks;
    v_tok     jsonb := '{}';
    v_usr     jsonb := '{}';
    v_expired int := 0;
    v_old     bigint;
    d         bigint;
    v_tasks   jsonb;
BEGIN
    IF coalesce(p_owner, '') = '' OR p_limit IS NULL OR p_limit < 1
       OR p_lease_ms IS NULL OR p_lease_ms < 1 THEN
        RAISE EXCEPTION 'llmgw_task_claim: needs an owner, a limit >= 1 and a lease >= 1 ms';
    END IF;

    -- The outer deadline: fail and refund what is past it.  SKIP LOCKED
    -- leaves a task another transaction is finishing to that transaction;
    -- the status guard makes each expiry happen once.
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

    WITH due AS (
        SELECT id FROM tasks
         WHERE status NOT IN ('SUCCESS', 'FAILURE')
           AND next_poll_at <= now()
           AND (lease_until IS NULL OR lease_until <= now())
           AND deadline > now()
         ORDER BY next_poll_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    ), claimed AS (
        UPDATE tasks AS t
           SET lease_owner = p_owner,
               lease_until = now() + make_interval(secs => p_lease_ms / 1000.0)
          FROM due
         WHERE t.id = due.id
        RETURNING t.*
    )
    SELECT coalesce(jsonb_agg(llmgw_task_json(c) ORDER BY c.next_poll_at, c.id), '[]')
      INTO v_tasks
      FROM claimed AS c;

    RETURN jsonb_build_object('tasks', v_tasks, 'expired', v_expired)
        || llmgw_task_apply(v_tok, v_usr);
END $$;


-- ----------------------------------------------------------------------
-- llmgw_task_update(owner, updates): poll results, transitions, settlement
-- ----------------------------------------------------------------------

CREATE FUNCTION llmgw_task_update(p_owner text, p_updates jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    u         jsonb;
    v         tasks;
    v_status  text;
    v_final   bigint;
    v_old     bigint;
    v_applied jsonb := '[]';
    v_skipped jsonb := '[]';
    v_tok     jsonb := '{}';
    v_usr     jsonb := '{}';
    d         bigint;
BEGIN
    IF jsonb_typeof(p_updates) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'llmgw_task_update: updates must be a JSON array';
    END IF;

    -- Lock every named task in task_id order first: two callers with
    -- overlapping batches queue instead of deadlocking, and the second sees
    -- the first one's status.
    PERFORM 1 FROM tasks
     WHERE task_id IN (SELECT e ->> 'task_id' FROM jsonb_array_elements(p_updates) AS e)
     ORDER BY task_id FOR UPDATE;

    FOR u IN
        SELECT e FROM jsonb_array_elements(p_updates) WITH ORDINALITY AS x(e, o)
         ORDER BY e ->> 'task_id', o
    LOOP
        SELECT * INTO v FROM tasks WHERE task_id = u ->> 'task_id';
        IF NOT FOUND OR llmgw_task_terminal(v.status)
           OR (p_owner IS NOT NULL AND v.lease_owner IS DISTINCT FROM p_owner) THEN
            v_skipped := v_skipped || to_jsonb(u ->> 'task_id');
            CONTINUE;
        END IF;

        v_status := llmgw_task_status_arg(u, v.status);
        v_final := llmgw_task_int(u, 'final_quota', NULL);
        v_old := v.quota;

        UPDATE tasks SET
            status           = v_status,
            progress         = CASE WHEN u ? 'progress' THEN u ->> 'progress' ELSE progress END,
            fail_reason      = CASE WHEN u ? 'fail_reason' THEN u ->> 'fail_reason' ELSE fail_reason END,
            data             = CASE WHEN llmgw_task_terminal(v_status) AND NOT retain_result THEN NULL
                                    WHEN u ? 'data' THEN nullif(u -> 'data', 'null')
                                    ELSE data END,
            state            = CASE WHEN u ? 'state' THEN nullif(u -> 'state', 'null') ELSE state END,
            upstream_task_id = coalesce(u ->> 'upstream_task_id', upstream_task_id),
            poll_failures    = llmgw_task_int(u, 'poll_failures', poll_failures),
            usage            = CASE WHEN u ? 'usage' THEN nullif(u -> 'usage', 'null') ELSE usage END,
            quota            = CASE v_status WHEN 'SUCCESS' THEN coalesce(v_final, quota)
                                             WHEN 'FAILURE' THEN 0
                                             ELSE quota END,
            finished_at      = CASE WHEN llmgw_task_terminal(v_status) THEN now() END,
            next_poll_at     = now() + make_interval(secs =>
                                   llmgw_task_int(u, 'next_poll_ms', 15000) / 1000.0),
            updated_at       = now(),
            lease_owner      = NULL,
            lease_until      = NULL
         WHERE id = v.id
        RETURNING * INTO v;

        IF v_status = 'SUCCESS' THEN
            d := llmgw_task_step(v, 'settle', v.quota - v_old);
        ELSIF v_status = 'FAILURE' THEN
            d := llmgw_task_step(v, 'refund', v_old);
        ELSE
            d := 0;
        END IF;
        IF llmgw_task_terminal(v_status) THEN
            v_tok := llmgw_task_acc(v_tok, v.token_id, d);
            v_usr := llmgw_task_acc(v_usr, v.user_id, d);
        END IF;
        v_applied := v_applied || to_jsonb(v.task_id);
    END LOOP;

    RETURN jsonb_build_object('applied', v_applied, 'skipped', v_skipped)
        || llmgw_task_apply(v_tok, v_usr);
END $$;


-- Gives leases back untouched (a poller shutting down), so another poller
-- takes the tasks at once.  A NULL owner releases whoever holds them.
CREATE FUNCTION llmgw_task_release(p_owner text, p_ids jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE v_ids jsonb;
BEGIN
    IF jsonb_typeof(p_ids) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'llmgw_task_release: ids must be a JSON array';
    END IF;
    WITH r AS (
        UPDATE tasks
           SET lease_owner = NULL, lease_until = NULL
         WHERE task_id IN (SELECT jsonb_array_elements_text(p_ids))
           AND lease_owner IS NOT NULL
           AND (p_owner IS NULL OR lease_owner = p_owner)
        RETURNING task_id
    )
    SELECT coalesce(jsonb_agg(task_id ORDER BY task_id), '[]') INTO v_ids FROM r;
    RETURN jsonb_build_object('released', v_ids);
END $$;


-- The caller's tasks among public ids, in the order asked; another user's
-- task is simply absent (so ids cannot be probed).
CREATE FUNCTION llmgw_task_lookup(p_user_id bigint, p_ids jsonb)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('tasks', coalesce((
        SELECT jsonb_agg(llmgw_task_json(t) ORDER BY w.o)
          FROM (SELECT id, min(o) AS o
                  FROM jsonb_array_elements_text(
                           CASE WHEN jsonb_typeof(p_ids) = 'array' THEN p_ids
                                ELSE '[]' END) WITH ORDINALITY AS x(id, o)
                 GROUP BY id) AS w
          JOIN tasks AS t ON t.task_id = w.id
         WHERE t.user_id = p_user_id), '[]'))
$$;


-- ======================================================================
-- /pricing: task prices
-- ======================================================================

-- {"unit_prices": {"<usage field>": usd per unit}, "multipliers":
-- {"<enum or boolean field>": {"<value>": factor}}} in normal form
-- (multipliers always present).
CREATE FUNCTION llmgw_v_unit_prices(v jsonb, p_f text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    r      record;
    m      record;
    v_up   jsonb := '{}';
    v_mul  jsonb := '{}';
    v_one  jsonb;
BEGIN
    IF jsonb_typeof(v -> 'unit_prices') IS DISTINCT FROM 'object'
       OR v -> 'unit_prices' = '{}' THEN
        PERFORM llmgw_bad(p_f || '.unit_prices: must be a non-empty object of usage field to USD per unit');
    END IF;
    FOR r IN SELECT key, value FROM jsonb_each(v -> 'unit_prices') ORDER BY key LOOP
        IF btrim(r.key) = '' THEN
            PERFORM llmgw_bad(p_f || '.unit_prices: usage field names must be non-empty');
        END IF;
        v_up := v_up || jsonb_build_object(r.key,
            llmgw_v_num(r.value, p_f || '.unit_prices.' || r.key));
    END LOOP;

    IF coalesce(v -> 'multipliers', 'null') <> 'null' THEN
        IF jsonb_typeof(v -> 'multipliers') <> 'object' THEN
            PERFORM llmgw_bad(p_f || '.multipliers: must be an object of usage field to {value: factor}');
        END IF;
        FOR r IN SELECT key, value FROM jsonb_each(v -> 'multipliers') ORDER BY key LOOP
            IF btrim(r.key) = '' THEN
                PERFORM llmgw_bad(p_f || '.multipliers: usage field names must be non-empty');
            END IF;
            IF jsonb_typeof(r.value) <> 'object' OR r.value = '{}' THEN
                PERFORM llmgw_bad(format('%s.multipliers.%s: must be a non-empty object of value to factor',
                                         p_f, r.key));
            END IF;
            v_one := '{}';
            FOR m IN SELECT key, value FROM jsonb_each(r.value) ORDER BY key LOOP
                v_one := v_one || jsonb_build_object(m.key,
                    llmgw_v_num(m.value, format('%s.multipliers.%s.%s', p_f, r.key, m.key)));
            END LOOP;
            v_mul := v_mul || jsonb_build_object(r.key, v_one);
        END LOOP;
    END IF;

    RETURN jsonb_build_object('unit_prices', v_up, 'multipliers', v_mul);
END $$;

-- As in 003, plus unit_prices entries; keys may be "<pluginKey>::<model>".
CREATE OR REPLACE FUNCTION llmgw_api_pricing(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_cur   jsonb;
    r       record;
    v_f     text;
    v_ratio boolean;
    v_price boolean;
    v_units boolean;
    v_e     jsonb;
    k       text;
BEGIN
    IF p_method = 'GET' THEN
        RETURN coalesce(llmgw_option('pricing'), '{}');
    END IF;

    v_cur := coalesce(llmgw_option_lock('pricing', '{}'), '{}');
    FOR r IN SELECT key, value FROM jsonb_each(b) ORDER BY key LOOP
        v_f := 'pricing.' || r.key;
        IF btrim(r.key) = '' THEN
            PERFORM llmgw_bad('pricing: model names must be non-empty');
        END IF;
        IF position('::' IN r.key) > 0
           AND (btrim(split_part(r.key, '::', 1)) = ''
                OR btrim(substr(r.key, position('::' IN r.key) + 2)) = '') THEN
            PERFORM llmgw_bad(v_f || ': a task price key is <pluginKey>::<model>, both non-empty');
        END IF;
        IF r.value = 'null' THEN                            -- remove the model
            v_cur := v_cur - r.key;
            CONTINUE;
        END IF;
        IF jsonb_typeof(r.value) <> 'object' THEN
            PERFORM llmgw_bad(v_f || ': must be an object with ratio (and completion_ratio), price or unit_prices, or null to remove it');
        END IF;
        -- A null member counts as absent (forms often send "price": null).
        v_ratio := coalesce(r.value -> 'ratio', 'null') <> 'null';
        v_price := coalesce(r.value -> 'price', 'null') <> 'null';
        v_units := coalesce(r.value -> 'unit_prices', 'null') <> 'null';
        IF v_units AND (v_ratio OR v_price) THEN
            PERFORM llmgw_bad(v_f || ': give only one of ratio, price or unit_prices');
        ELSIF v_ratio AND v_price THEN
            PERFORM llmgw_bad(v_f || ': give either ratio or price, not both');
        ELSIF coalesce(r.value -> 'multipliers', 'null') <> 'null' AND NOT v_units THEN
            PERFORM llmgw_bad(v_f || '.multipliers: only allowed with unit_prices');
        ELSIF v_units THEN
            v_e := llmgw_v_unit_prices(r.value, v_f);
        ELSIF v_price THEN
            v_e := jsonb_build_object(
                'price', llmgw_v_num(r.value -> 'price', v_f || '.price'));
        ELSIF v_ratio THEN
            v_e := jsonb_build_object(
                'ratio', llmgw_v_num(r.value -> 'ratio', v_f || '.ratio'));
            -- multiples of the prompt price; each defaults to 1
            FOREACH k IN ARRAY ARRAY['completion_ratio', 'cache_ratio',
                                     'cache_creation_ratio'] LOOP
                v_e := v_e || jsonb_build_object(k,
                    CASE WHEN coalesce(r.value -> k, 'null') = 'null'
                         THEN '1'::jsonb
                         ELSE llmgw_v_num(r.value -> k, v_f || '.' || k) END);
            END LOOP;
        ELSE
            PERFORM llmgw_bad(v_f || ': needs ratio (per token), price (per call) or unit_prices (per usage unit)');
        END IF;
        v_cur := v_cur || jsonb_build_object(r.key, v_e);
    END LOOP;

    PERFORM llmgw_option_set('pricing', v_cur);
    PERFORM llmgw_bump('config', 0);
    RETURN v_cur;
END $$;


-- ======================================================================
-- /channel: binding task plugins (types 60 and 61)
-- ======================================================================

-- The active manifest of an installed plugin, or NULL.
CREATE FUNCTION llmgw_plugin_manifest(p_key text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT v.manifest
      FROM task_plugins AS p
      JOIN task_plugin_versions AS v
        ON v.key = p.key AND v.version = p.active_version
     WHERE p.key = p_key
$$;

-- Checks the plugins a type 60/61 channel binds through its settings and
-- answers the manifest of settings.task_plugin_key.
CREATE FUNCTION llmgw_channel_binding(p_type int, p_settings jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_key   text;
    v_keys  text[];
    v_ext   jsonb := p_settings -> 'task_extend_plugin_keys';
    v_man   jsonb;
    v_first jsonb;
    e       jsonb;
BEGIN
    IF NOT p_settings ? 'task_plugin_key'
       OR p_settings -> 'task_plugin_key' = 'null'
       OR p_settings -> 'task_plugin_key' = '""' THEN
        PERFORM llmgw_bad(format('channel type %s needs settings.task_plugin_key', p_type));
    END IF;
    IF jsonb_typeof(p_settings -> 'task_plugin_key') <> 'string'
       OR btrim(p_settings ->> 'task_plugin_key') = '' THEN
        PERFORM llmgw_bad('settings.task_plugin_key: must be a non-empty string');
    END IF;
    v_keys := ARRAY[p_settings ->> 'task_plugin_key'];

    IF p_type = 60 AND coalesce(v_ext, 'null') <> 'null' THEN
        IF jsonb_typeof(v_ext) <> 'array' THEN
            PERFORM llmgw_bad('settings.task_extend_plugin_keys: must be an array of plugin keys');
        END IF;
        FOR e IN SELECT x FROM jsonb_array_elements(v_ext) AS x LOOP
            IF jsonb_typeof(e) <> 'string' OR btrim(e #>> '{}') = '' THEN
                PERFORM llmgw_bad('settings.task_extend_plugin_keys: must be an array of plugin keys');
            END IF;
            v_keys := v_keys || (e #>> '{}');
        END LOOP;
    END IF;

    FOREACH v_key IN ARRAY v_keys LOOP
        v_man := llmgw_plugin_manifest(v_key);
        IF v_man IS NULL THEN
            PERFORM llmgw_bad(format('task plugin %s is not installed', v_key));
        END IF;
        -- new_api is the marketplace spelling of peer_gateway
        IF p_type = 60 AND NOT (coalesce(v_man -> 'upstreams', '[]') ?| ARRAY['peer_gateway', 'new_api']) THEN
            PERFORM llmgw_bad(format('plugin %s does not allow peer gateway channels (meta.upstreams)',
                                     v_key));
        END IF;
        v_first := coalesce(v_first, v_man);
    END LOOP;
    RETURN v_first;
END $$;

ALTER FUNCTION llmgw_api_channel(text, bigint, jsonb, jsonb)
    RENAME TO llmgw_api_channel_core;

-- Checks task plugin bindings, fills a type 61 channel's empty base_url
-- from its plugin's baseUrl, then lets 001's function do the rest.  On
-- PATCH only a change of type, settings or an emptied base_url is checked,
-- so a channel whose plugin was removed can still be disabled or renamed.
CREATE FUNCTION llmgw_api_channel(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c          channels;
    v_type     int;
    v_settings jsonb;
    v_no_base  boolean;
    v_man      jsonb;
    v_base     text;
BEGIN
    IF p_method = 'POST' AND p_id IS NULL AND b ? 'type' THEN
        v_type := llmgw_v_int(b -> 'type', 'type', 0, 2147483647);
        v_settings := '{}';
    ELSIF p_method = 'PATCH' AND p_id IS NOT NULL THEN
        SELECT * INTO c FROM channels WHERE id = p_id AND deleted_at IS NULL
            FOR UPDATE;
        IF FOUND THEN
            v_type := CASE WHEN b ? 'type'
                           THEN llmgw_v_int(b -> 'type', 'type', 0, 2147483647)
                           ELSE c.type END;
            v_settings := c.settings;
        END IF;
    END IF;
    IF v_type IS NULL OR v_type NOT IN (60, 61) THEN
        RETURN llmgw_api_channel_core(p_method, p_id, q, b);
    END IF;

    IF b ? 'settings' THEN
        v_settings := llmgw_v_object(b -> 'settings', 'settings');
    END IF;
    -- absent on POST, or given as null or blank
    v_no_base := CASE WHEN b ? 'base_url'
                      THEN b -> 'base_url' = 'null'
                           OR (jsonb_typeof(b -> 'base_url') = 'string'
                               AND btrim(b ->> 'base_url') = '')
                      ELSE p_id IS NULL END;

    IF p_id IS NULL OR b ?| ARRAY['type', 'settings'] OR v_no_base THEN
        v_man := llmgw_channel_binding(v_type, coalesce(v_settings, '{}'));
        IF v_type = 61 AND v_no_base THEN
            v_base := nullif(btrim(coalesce(v_man ->> 'baseUrl', '')), '');
            IF v_base IS NULL THEN
                PERFORM llmgw_bad(format('base_url: plugin %s has no baseUrl, so the channel needs one',
                                         v_settings ->> 'task_plugin_key'));
            END IF;
            b := b || jsonb_build_object('base_url', v_base);
        END IF;
    END IF;

    RETURN llmgw_api_channel_core(p_method, p_id, q, b);
END $$;
