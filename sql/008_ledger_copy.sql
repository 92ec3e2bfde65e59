-- The ledger writer sends its batches with COPY.
--
-- A batch that has never been sent goes straight into logs with
-- COPY logs FROM STDIN, followed in the same implicit transaction by
-- llmgw_flush_apply() with the balance changes the node summed itself.  A
-- row already in logs makes the COPY fail on UNIQUE (request_id, type), so
-- nothing of the batch is kept, and the node sends the batch again the
-- slow way: COPY into the session's staging table, then
-- llmgw_flush_staged(), which inserts with ON CONFLICT DO NOTHING and moves
-- balances only for the rows that are new.  A batch is sent the slow way
-- whenever it may have been written before (after a failure, a timeout, a
-- worker's death or exit).  llmgw_flush(jsonb) takes the slow way too.


-- Moves balances by the given sums and answers the balances of every id
-- given: {"tokens": {"<id>": remain_quota}, "users": {"<id>": quota}}.
-- Lock order: tokens by id, then users by id.
CREATE FUNCTION llmgw_flush_apply(p_tok bigint[], p_tok_d bigint[],
                                  p_usr bigint[], p_usr_d bigint[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_d   bigint[];
BEGIN
    SELECT array_agg(id ORDER BY id), array_agg(d ORDER BY id)
      INTO v_ids, v_d
      FROM (SELECT id, sum(delta)::bigint AS d
              FROM unnest(p_tok, p_tok_d) AS x(id, delta)
             WHERE id IS NOT NULL GROUP BY id HAVING sum(delta) <> 0) AS s;

    IF v_ids IS NOT NULL THEN
        PERFORM 1 FROM tokens WHERE id = ANY (v_ids) ORDER BY id FOR UPDATE;
        UPDATE tokens AS t
           SET remain_quota = CASE WHEN t.unlimited_quota THEN t.remain_quota
                                   ELSE t.remain_quota - x.delta END,
               used_quota   = t.used_quota + x.delta
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
               used_quota = u.used_quota + x.delta
          FROM unnest(v_ids, v_d) AS x(id, delta)
         WHERE u.id = x.id;
    END IF;

    RETURN jsonb_build_object(
        'tokens', coalesce((SELECT jsonb_object_agg(t.id::text, t.remain_quota)
                              FROM tokens AS t WHERE t.id = ANY (p_tok)),
                           '{}'::jsonb),
        'users', coalesce((SELECT jsonb_object_agg(u.id::text, u.quota)
                             FROM users AS u WHERE u.id = ANY (p_usr)),
                          '{}'::jsonb));
END $$;


-- Gives this session an empty staging table for the slow way (created on
-- first use; a temporary table, so each connection has its own).
CREATE FUNCTION llmgw_flush_stage() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF to_regclass('pg_temp.llmgw_flush_in') IS NULL THEN
        CREATE TEMP TABLE llmgw_flush_in ON COMMIT DELETE ROWS AS
            SELECT request_id, type, user_id, token_id, channel_id,
                   model_name, upstream_model, endpoint, channels_tried,
                   prompt_tokens, completion_tokens, cache_read_tokens,
                   cache_creation_tokens, quota, is_stream, status,
                   latency_ms, content, created_at
              FROM logs WITH NO DATA;
    ELSE
        TRUNCATE pg_temp.llmgw_flush_in;
    END IF;
END $$;


-- Writes the staged rows that are not in logs yet and moves balances by
-- those alone: idempotent by (request_id, type).  Inserts in (request_id,
-- type) order so that two flushes sharing rows wait on each other instead
-- of deadlocking.  Answers {"inserted": n} and the balances of every token
-- and user the batch names.
CREATE FUNCTION llmgw_flush_staged() RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_n     bigint;
    v_tok   bigint[];
    v_tok_d bigint[];
    v_usr   bigint[];
    v_usr_d bigint[];
BEGIN
    WITH ins AS (
        INSERT INTO logs (request_id, type, user_id, token_id, channel_id,
                          model_name, upstream_model, endpoint,
                          channels_tried, prompt_tokens, completion_tokens,
                          cache_read_tokens, cache_creation_tokens, quota,
                          is_stream, status, latency_ms, content, created_at)
        SELECT s.request_id, s.type,
               -- A row without user_id is charged to the token's owner.
               coalesce(s.user_id, (SELECT t.user_id FROM tokens AS t
                                     WHERE t.id = s.token_id)),
               s.token_id, s.channel_id, s.model_name, s.upstream_model,
               s.endpoint, s.channels_tried,
               coalesce(s.prompt_tokens, 0), coalesce(s.completion_tokens, 0),
               coalesce(s.cache_read_tokens, 0),
               coalesce(s.cache_creation_tokens, 0), coalesce(s.quota, 0),
               coalesce(s.is_stream, false), s.status, s.latency_ms,
               coalesce(s.content, ''), coalesce(s.created_at, now())
          FROM pg_temp.llmgw_flush_in AS s
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
        UNION ALL
        -- every id the batch names is answered, moved or not
        SELECT token_id, user_id, 0 FROM pg_temp.llmgw_flush_in
    ), tok AS (
        SELECT token_id AS id, sum(delta)::bigint AS delta FROM d
         WHERE token_id IS NOT NULL GROUP BY token_id
    ), usr AS (
        SELECT user_id AS id, sum(delta)::bigint AS delta FROM d
         WHERE user_id IS NOT NULL GROUP BY user_id
    )
    SELECT (SELECT count(*) FROM ins),
           (SELECT array_agg(id ORDER BY id) FROM tok),
           (SELECT array_agg(delta ORDER BY id) FROM tok),
           (SELECT array_agg(id ORDER BY id) FROM usr),
           (SELECT array_agg(delta ORDER BY id) FROM usr)
      INTO v_n, v_tok, v_tok_d, v_usr, v_usr_d;

    TRUNCATE pg_temp.llmgw_flush_in;

    RETURN jsonb_build_object('inserted', v_n)
           || llmgw_flush_apply(v_tok, v_tok_d, v_usr, v_usr_d);
END $$;


-- The JSON form, for callers other than the writer: the same slow way.
CREATE OR REPLACE FUNCTION llmgw_flush(rows jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof($1) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'llmgw_flush: rows must be a JSON array';
    END IF;

    PERFORM llmgw_flush_stage();

    INSERT INTO pg_temp.llmgw_flush_in
    SELECT r ->> 'request_id',
           r ->> 'type',
           nullif(r ->> 'user_id', '')::numeric::bigint,
           nullif(r ->> 'token_id', '')::numeric::bigint,
           nullif(r ->> 'channel_id', '')::numeric::bigint,
           r ->> 'model_name',
           r ->> 'upstream_model',
           r ->> 'endpoint',
           nullif(r -> 'channels_tried', 'null'),
           (r ->> 'prompt_tokens')::numeric::bigint,
           (r ->> 'completion_tokens')::numeric::bigint,
           (r ->> 'cache_read_tokens')::numeric::bigint,
           (r ->> 'cache_creation_tokens')::numeric::bigint,
           (r ->> 'quota')::numeric::bigint,
           (r ->> 'is_stream')::boolean,
           (r ->> 'status')::numeric::int,
           (r ->> 'latency_ms')::numeric::int,
           r ->> 'content',
           to_timestamp((r ->> 'created_at')::float8)
      FROM jsonb_array_elements($1) AS r;

    RETURN llmgw_flush_staged();
END $$;

DROP FUNCTION llmgw_flush_rows(jsonb);
