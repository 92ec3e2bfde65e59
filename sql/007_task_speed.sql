-- The task engine's functions from 005, made cheaper: same signatures, same
-- answers, same guarantees (exactly-once billing steps, lock order, leases,
-- idempotent create).
--
-- Where their time went (profiled with calls like the task benchmark's):
--   * statements: each pays executor start-up, so a poll result that keeps
--     its task running is now one UPDATE (one for a whole batch), a create
--     one statement for the task and its ledger rows, and a balance that
--     does not move is only read (for the answer);
--   * plans: "id IN (SELECT .. FROM jsonb_array_elements(..))" is planned
--     for 100 ids, which on a table of a few thousand tasks, tokens or users
--     is a sequential scan per call; ids now go in as arrays, deltas are
--     looked up by key;
--   * SQL functions the planner cannot inline (IMMUTABLE around STABLE
--     calls: llmgw_epoch(), llmgw_task_acc()) are run, and llmgw_task_acc()
--     even parsed, on every call;
--   * a claim's answer, most of a megabyte of jsonb for a thousand rows,
--     was copied whole by each jsonb_build_object() or || around it.


-- ======================================================================
-- Views: llmgw_epoch() written out so the planner can inline them
-- ======================================================================

CREATE OR REPLACE FUNCTION llmgw_task_view(t tasks) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'task_id', t.task_id, 'status', t.status, 'progress', t.progress,
        'fail_reason', t.fail_reason,
        'created_at', floor(extract(epoch FROM t.created_at))::bigint,
        'updated_at', floor(extract(epoch FROM t.updated_at))::bigint,
        'finished_at', floor(extract(epoch FROM t.finished_at))::bigint,
        'data', t.data, 'model', t.model, 'action', t.action,
        'plugin', t.plugin_key)
$$;

-- llmgw_task_json() as json text: a claim builds its rows as text and
-- parses the whole answer once (see llmgw_task_claim).
CREATE FUNCTION llmgw_task_json_text(t tasks) RETURNS json
LANGUAGE sql STABLE AS $$
    SELECT json_build_object(
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
        'created_at', floor(extract(epoch FROM t.created_at))::bigint,
        'updated_at', floor(extract(epoch FROM t.updated_at))::bigint,
        'submitted_at', floor(extract(epoch FROM t.submitted_at))::bigint,
        'finished_at', floor(extract(epoch FROM t.finished_at))::bigint,
        'next_poll_at', floor(extract(epoch FROM t.next_poll_at))::bigint,
        'deadline', floor(extract(epoch FROM t.deadline))::bigint,
        'lease_owner', t.lease_owner,
        'lease_until', floor(extract(epoch FROM t.lease_until))::bigint)
$$;

-- The same value 005's jsonb_build_object() gave: the text holds the same
-- members, and the cast parses numbers and strings as that did.
CREATE OR REPLACE FUNCTION llmgw_task_json(t tasks) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT llmgw_task_json_text(t)::jsonb
$$;


-- ======================================================================
-- Arguments
-- ======================================================================

-- True when llmgw_task_int(p, name, default, p_lo) would not raise for
-- v = p -> name.  (005's checks stay PL/pgSQL: inlined, this body would
-- look v up once per use.)
CREATE FUNCTION llmgw_task_int_ok(v jsonb, p_lo bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v IS NULL OR v = 'null' THEN true
                WHEN jsonb_typeof(v) <> 'number' THEN false
                ELSE v::numeric = trunc(v::numeric) AND v::numeric >= p_lo
                     AND v::numeric <= 9223372036854775807 END
$$;


-- ======================================================================
-- Balances
-- ======================================================================

-- As in 005, but STABLE like the jsonb_build_object() in its body: 005's
-- IMMUTABLE kept the planner from inlining it, so every call parsed and
-- planned the body again.
CREATE OR REPLACE FUNCTION llmgw_task_acc(m jsonb, p_id bigint, d bigint) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN p_id IS NULL THEN m
                ELSE m || jsonb_build_object(p_id::text,
                              coalesce((m ->> p_id::text)::bigint, 0) + d) END
$$;

-- As in 005: moves balances by {"<token id>": delta} and {"<user id>":
-- delta} (an unlimited token keeps its remain_quota), tokens before users,
-- each in id order, and answers {"tokens": {id: remain_quota}, "users":
-- {id: quota}} for every id given.  Nothing given: no statement at all (a
-- poll that ends no task, a claim that expires none).  A table whose
-- deltas are all zero is only read; a single row is locked by its UPDATE.
-- Ids are looked up as arrays and deltas by key, never joined: 005's
-- "id IN (SELECT .. jsonb_each_text(..))" is planned for 100 ids and became
-- a sequential scan of all tokens or users once those were a few thousand.
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
                                WHERE value::bigint <> 0))
         ORDER BY id FOR UPDATE;
    END IF;
    IF n > 0 THEN
        UPDATE tokens AS t
           SET remain_quota = CASE WHEN t.unlimited_quota THEN t.remain_quota
                                   ELSE t.remain_quota - (p_tok ->> t.id::text)::bigint END,
               used_quota   = t.used_quota + (p_tok ->> t.id::text)::bigint
         WHERE t.id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_tok)
                                  WHERE value::bigint <> 0));
    END IF;

    n := jsonb_array_length(jsonb_path_query_array(p_usr, '$.* ? (@ != 0)'));
    IF n > 1 THEN
        PERFORM 1 FROM users
         WHERE id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_usr)
                                WHERE value::bigint <> 0))
         ORDER BY id FOR UPDATE;
    END IF;
    IF n > 0 THEN
        UPDATE users AS u
           SET quota      = u.quota - (p_usr ->> u.id::text)::bigint,
               used_quota = u.used_quota + (p_usr ->> u.id::text)::bigint
         WHERE u.id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_usr)
                                  WHERE value::bigint <> 0));
    END IF;

    RETURN jsonb_build_object(
        'tokens', coalesce((SELECT jsonb_object_agg(t.id::text, t.remain_quota)
                              FROM tokens AS t
                             WHERE t.id = ANY (ARRAY(SELECT key::bigint
                                                       FROM jsonb_each_text(p_tok)))),
                           '{}'),
        'users', coalesce((SELECT jsonb_object_agg(u.id::text, u.quota)
                             FROM users AS u
                            WHERE u.id = ANY (ARRAY(SELECT key::bigint
                                                      FROM jsonb_each_text(p_usr)))),
                          '{}'));
END $$;

-- One task's balances after a move of d (token first, then user, as
-- everywhere): {"tokens": {id: remain_quota}, "users": {id: quota}}, an
-- id left out when it has no row -- llmgw_task_apply's answer for
-- {"<token>": d} and {"<user>": d}.
CREATE FUNCTION llmgw_task_apply_one(p_token bigint, p_user bigint, d bigint)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_tok jsonb;
    v_usr jsonb;
BEGIN
    IF d = 0 THEN
        RETURN jsonb_build_object(
            'tokens', coalesce((SELECT jsonb_build_object(t.id::text, t.remain_quota)
                                  FROM tokens AS t WHERE t.id = p_token), '{}'),
            'users', coalesce((SELECT jsonb_build_object(u.id::text, u.quota)
                                 FROM users AS u WHERE u.id = p_user), '{}'));
    END IF;
    IF p_token IS NOT NULL THEN
        UPDATE tokens
           SET remain_quota = CASE WHEN unlimited_quota THEN remain_quota
                                   ELSE remain_quota - d END,
               used_quota   = used_quota + d
         WHERE id = p_token
        RETURNING jsonb_build_object(id::text, remain_quota) INTO v_tok;
    END IF;
    UPDATE users
       SET quota = quota - d, used_quota = used_quota + d
     WHERE id = p_user
    RETURNING jsonb_build_object(id::text, quota) INTO v_usr;
    RETURN jsonb_build_object('tokens', coalesce(v_tok, '{}'),
                              'users', coalesce(v_usr, '{}'));
END $$;


-- ======================================================================
-- llmgw_task_create: the task row and its ledger rows in one statement
-- ======================================================================

CREATE OR REPLACE FUNCTION llmgw_task_create(t jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_status  text;
    v_reserve bigint;
    v_submit  bigint;
    v_final   bigint;
    v_quota   bigint;
    v_retain  boolean;
    v_user    bigint;
    r         record;
    v         tasks;
    d         bigint := 0;
BEGIN
    -- Checked in 005's order, so a bad argument raises the same error.
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
    v_user    := llmgw_task_int(t, 'user_id', NULL, 1);
    IF v_user IS NULL THEN
        RAISE EXCEPTION 'llmgw_task_create: user_id is required';
    END IF;

    -- The quota the row ends with after its steps.
    v_quota := coalesce(v_submit, v_reserve);
    IF v_status = 'SUCCESS' THEN
        v_quota := coalesce(v_final, v_quota);
    ELSIF v_status = 'FAILURE' THEN
        v_quota := 0;
    END IF;

    -- The steps of 005 in its order: reserve, adjust (when quota_submit is
    -- given), then settle or refund for a task that is born terminal.  The
    -- ledger sees only a task row this statement inserted, and d sums the
    -- steps whose rows are new.
    WITH ins AS (
        INSERT INTO tasks AS n
               (task_id, upstream_task_id, plugin_key, plugin_version,
                channel_id, user_id, token_id, request_id, action, model,
                upstream_model, status, progress, fail_reason, data, state,
                retain_result, quota, usage, group_ratio, price,
                submitted_at, finished_at, next_poll_at, deadline)
        VALUES (t ->> 'task_id', t ->> 'upstream_task_id', t ->> 'plugin_key',
                t ->> 'plugin_version',
                llmgw_task_int(t, 'channel_id', NULL, 1),
                v_user,
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
        RETURNING n
    ), steps (o, type, quota) AS (
        SELECT o, type, quota
          FROM (VALUES (1, 'reserve', v_reserve, true),
                       (2, 'adjust', v_submit - v_reserve, v_submit IS NOT NULL),
                       (3, 'settle', v_quota - coalesce(v_submit, v_reserve),
                        v_status = 'SUCCESS'),
                       (3, 'refund', coalesce(v_submit, v_reserve),
                        v_status = 'FAILURE')) AS s (o, type, quota, taken)
         WHERE taken
    ), led AS (
        INSERT INTO logs (request_id, type, user_id, token_id, model_name,
                          upstream_model, channel_id, channels_tried, endpoint,
                          quota, content)
        SELECT (i.n).task_id, s.type, (i.n).user_id, (i.n).token_id,
               (i.n).model, (i.n).upstream_model, (i.n).channel_id,
               CASE WHEN (i.n).channel_id IS NULL THEN NULL
                    ELSE jsonb_build_array((i.n).channel_id) END,
               'task:' || (i.n).plugin_key, s.quota,
               CASE WHEN s.type = 'refund' THEN coalesce((i.n).fail_reason, '')
                    ELSE coalesce((i.n).usage::text, '') END
          FROM ins AS i CROSS JOIN steps AS s
         ORDER BY s.o
        ON CONFLICT (request_id, type) DO NOTHING
        RETURNING type, quota
    )
    SELECT i.n AS task,
           (SELECT coalesce(sum(CASE WHEN l.type = 'refund' THEN -l.quota
                                     ELSE l.quota END), 0)
              FROM led AS l) AS d
      INTO r
      FROM ins AS i;

    IF FOUND THEN
        v := r.task;
        d := r.d;
    ELSE
        -- A repeated create (a retried statement): report, change nothing.
        SELECT * INTO v FROM tasks WHERE task_id = t ->> 'task_id';
    END IF;

    RETURN jsonb_build_object('task', llmgw_task_view(v))
        || llmgw_task_apply_one(v.token_id, v.user_id, d);
END $$;


-- ======================================================================
-- llmgw_task_claim: due tasks for one poller
-- ======================================================================

-- As in 005.  The answer is built as JSON text and parsed once: a jsonb
-- built from the aggregated rows is copied whole by every further
-- jsonb_build_object() or ||, and a claim of a thousand rows is most of a
-- megabyte.  The claimed rows are updated by id (an array, planned as index
-- probes) rather than joined.
CREATE OR REPLACE FUNCTION llmgw_task_claim(p_owner text, p_limit int, p_lease_ms int)
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
            || ', "tasks": ' || v_tasks || '}')::jsonb;
END $$;


-- ======================================================================
-- llmgw_task_update: one UPDATE for every result that keeps the task
-- running; 005's row-by-row path for the rest
-- ======================================================================

-- True when 005 would apply update u to a running task without raising and
-- the task stays running: the new status (absent: the current, running
-- one) is not terminal and every number is valid.
CREATE FUNCTION llmgw_task_update_ok(u jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT (u ->> 'status' IS NULL
            OR u ->> 'status' IN ('NOT_START', 'SUBMITTED', 'QUEUED', 'IN_PROGRESS', 'UNKNOWN'))
       AND llmgw_task_int_ok(u -> 'final_quota', 0)
       AND llmgw_task_int_ok(u -> 'poll_failures', 0)
       AND llmgw_task_int_ok(u -> 'next_poll_ms', 0)
$$;

CREATE OR REPLACE FUNCTION llmgw_task_update(p_owner text, p_updates jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_len     int;
    v_ids     text[];      -- the updates the set-based UPDATE may take ...
    v_us      jsonb[];     -- ... by task_id
    v_fast    jsonb;       -- the task ids it applied, sorted
    v_n       int := 0;    -- how many
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
    v_len := jsonb_array_length(p_updates);

    -- An update that leaves its task running, and that 005 would apply
    -- without raising (llmgw_task_update_ok), takes one set-based UPDATE:
    -- 005's SET for a non-terminal status (no billing, the data kept
    -- whatever retain_result says, no finished_at), and 005's skips (no such
    -- task, terminal, another's lease) in its WHERE.  Every other update,
    -- and so every update that ends a task (billing), goes through 005's
    -- loop at the end.  The two UPDATEs differ only in their FROM: keep
    -- their SET lists the same.
    IF v_len = 1 THEN
        -- The common poll result.  One row needs no lock order, and the
        -- UPDATE re-checks its WHERE on the newest version of a row another
        -- transaction changed meanwhile: no lock-first step.
        u := p_updates -> 0;
        IF llmgw_task_update_ok(u) THEN
            UPDATE tasks AS t SET
                status           = coalesce(x.u ->> 'status', t.status),
                progress         = CASE WHEN x.u ? 'progress' THEN x.u ->> 'progress' ELSE t.progress END,
                fail_reason      = CASE WHEN x.u ? 'fail_reason' THEN x.u ->> 'fail_reason' ELSE t.fail_reason END,
                data             = CASE WHEN x.u ? 'data' THEN nullif(x.u -> 'data', 'null') ELSE t.data END,
                state            = CASE WHEN x.u ? 'state' THEN nullif(x.u -> 'state', 'null') ELSE t.state END,
                upstream_task_id = coalesce(x.u ->> 'upstream_task_id', t.upstream_task_id),
                poll_failures    = coalesce(nullif(x.u -> 'poll_failures', 'null')::numeric::bigint,
                                            t.poll_failures),
                usage            = CASE WHEN x.u ? 'usage' THEN nullif(x.u -> 'usage', 'null') ELSE t.usage END,
                finished_at      = NULL,
                next_poll_at     = now() + make_interval(secs =>
                                       coalesce(nullif(x.u -> 'next_poll_ms', 'null')::numeric::bigint,
                                                15000) / 1000.0),
                updated_at       = now(),
                lease_owner      = NULL,
                lease_until      = NULL
              FROM (SELECT u AS u) AS x
             WHERE t.task_id = x.u ->> 'task_id'
               AND NOT llmgw_task_terminal(t.status)
               AND (p_owner IS NULL OR t.lease_owner = p_owner)
            RETURNING jsonb_build_array(t.task_id) INTO v_fast;
            IF FOUND THEN
                RETURN jsonb_build_object('applied', v_fast, 'skipped', '[]'::jsonb,
                                          'tokens', '{}'::jsonb, 'users', '{}'::jsonb);
            END IF;
        END IF;
        PERFORM 1 FROM tasks WHERE task_id = u ->> 'task_id' FOR UPDATE;

    ELSIF v_len > 1 THEN
        -- Lock every named task in task_id order first: two callers with
        -- overlapping batches queue instead of deadlocking, and the second
        -- sees the first one's status.  The ids go in as an array, so the
        -- lookup is planned as index probes whatever the batch size.
        PERFORM 1 FROM tasks
         WHERE task_id = ANY (ARRAY(SELECT e ->> 'task_id'
                                      FROM jsonb_array_elements(p_updates) AS e))
         ORDER BY task_id FOR UPDATE;

        -- A task_id named twice is left to the loop: its updates must
        -- apply one after the other.
        SELECT array_agg(x.task_id), array_agg(x.u)
          INTO v_ids, v_us
          FROM (SELECT e ->> 'task_id' AS task_id, e AS u,
                       count(*) OVER (PARTITION BY e ->> 'task_id') AS n
                  FROM jsonb_array_elements(p_updates) AS e) AS x
         WHERE x.n = 1 AND llmgw_task_update_ok(x.u);

        -- (SELECT ..) hides the arrays from the planner: seeing their
        -- length, it would plan a small batch as cheaper than the generic
        -- plan and so plan every call anew; hidden, the generic plan (an
        -- index probe per update) is kept after five calls.
        IF v_ids IS NOT NULL THEN
            WITH fast AS (
                UPDATE tasks AS t SET
                    status           = coalesce(x.u ->> 'status', t.status),
                    progress         = CASE WHEN x.u ? 'progress' THEN x.u ->> 'progress' ELSE t.progress END,
                    fail_reason      = CASE WHEN x.u ? 'fail_reason' THEN x.u ->> 'fail_reason' ELSE t.fail_reason END,
                    data             = CASE WHEN x.u ? 'data' THEN nullif(x.u -> 'data', 'null') ELSE t.data END,
                    state            = CASE WHEN x.u ? 'state' THEN nullif(x.u -> 'state', 'null') ELSE t.state END,
                    upstream_task_id = coalesce(x.u ->> 'upstream_task_id', t.upstream_task_id),
                    poll_failures    = coalesce(nullif(x.u -> 'poll_failures', 'null')::numeric::bigint,
                                                t.poll_failures),
                    usage            = CASE WHEN x.u ? 'usage' THEN nullif(x.u -> 'usage', 'null') ELSE t.usage END,
                    finished_at      = NULL,
                    next_poll_at     = now() + make_interval(secs =>
                                           coalesce(nullif(x.u -> 'next_poll_ms', 'null')::numeric::bigint,
                                                    15000) / 1000.0),
                    updated_at       = now(),
                    lease_owner      = NULL,
                    lease_until      = NULL
                  FROM unnest((SELECT v_ids), (SELECT v_us)) AS x(task_id, u)
                 WHERE t.task_id = x.task_id
                   AND NOT llmgw_task_terminal(t.status)
                   AND (p_owner IS NULL OR t.lease_owner = p_owner)
                RETURNING t.task_id
            )
            SELECT jsonb_agg(to_jsonb(task_id) ORDER BY task_id), count(*)
              INTO v_fast, v_n
              FROM fast;
            IF v_n = v_len THEN
                RETURN jsonb_build_object('applied', v_fast, 'skipped', '[]'::jsonb,
                                          'tokens', '{}'::jsonb, 'users', '{}'::jsonb);
            END IF;
        END IF;
    END IF;

    -- 005's loop over the rest, in its order.
    FOR u IN
        SELECT e FROM jsonb_array_elements(p_updates) WITH ORDINALITY AS x(e, o)
         WHERE e ->> 'task_id' IS NULL OR NOT coalesce(v_fast ? (e ->> 'task_id'), false)
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

    -- Both lists in task_id order, as 005 gives them.
    IF v_fast IS NOT NULL AND v_applied <> '[]' THEN
        SELECT jsonb_agg(a ORDER BY a #>> '{}')
          INTO v_applied
          FROM (SELECT jsonb_array_elements(v_fast)
                UNION ALL
                SELECT jsonb_array_elements(v_applied)) AS s(a);
    ELSIF v_fast IS NOT NULL THEN
        v_applied := v_fast;
    END IF;
    RETURN jsonb_build_object('applied', v_applied, 'skipped', v_skipped)
        || llmgw_task_apply(v_tok, v_usr);
END $$;
