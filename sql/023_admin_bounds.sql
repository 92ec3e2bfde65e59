-- The admin API holds what it stores to what the gateway reads the same
-- way, and the ledger cannot be stopped by a balance that would overflow.
--
-- * allow_ips: PostgreSQL's inet takes short IPv4 forms ("10/8",
--   "1.2.3/24", "ffff::1.2.3") that the gateway's parser does not; such a
--   list was stored and then read as unreadable.  An IPv4 address (also one
--   inside an IPv6 form) now needs its four parts.
-- * Unknown members are refused, as /api/pricing already did: a misspelt
--   field ("qouta", "ratoi", "totals", "defualt") was dropped with a 200,
--   and for /api/rate_limit (which PUT replaces) that removed every limit.
--   The members a GET shows but a write cannot change (id, used_quota,
--   created_at, ...) are refused as read-only rather than ignored.
-- * Numbers the gateway would bound differently: a channel weight above
--   1,000,000 (routing clamps there), an expired_time above 1e11 (unix
--   seconds end near the year 5138; that is milliseconds), prices, ratios
--   and group ratios above 1e9.
-- * Group names and base URLs: no control characters, names at most 64
--   characters, base URLs printable ASCII.
-- * Balances move with saturating arithmetic: one charge that would take a
--   used_quota past the bigint range (a price of 1e300 on a key of a user
--   with quota 2^63-1) failed every ledger batch that held it, so no row of
--   any user was written until the balance was fixed by hand.


-- ======================================================================
-- Validators
-- ======================================================================

CREATE OR REPLACE FUNCTION llmgw_v_ips(v jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_e jsonb;
    v_s text;
    v_i int := 0;
BEGIN
    IF v IS NULL OR v = 'null' OR v = '[]' THEN
        RETURN NULL;
    END IF;
    IF jsonb_typeof(v) <> 'array' THEN
        PERFORM llmgw_bad('allow_ips: must be an array of IP addresses or CIDRs, or null');
    END IF;
    FOR v_e IN SELECT e FROM jsonb_array_elements(v) AS e LOOP
        IF jsonb_typeof(v_e) <> 'string' THEN
            PERFORM llmgw_bad(format('allow_ips[%s]: must be a string', v_i));
        END IF;
        v_s := v_e #>> '{}';
        BEGIN
            -- inet accepts "a.b.c.d", "a.b.c.d/n" and IPv6 forms, and more
            -- than the gateway reads: the regexes keep out the rest (other
            -- characters; dotted parts with a leading zero, which tools read
            -- as octal; IPv4 short of four parts).
            IF v_s !~ '^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$'
               OR v_s ~ '(^|[:.])0[0-9]+\.'
               OR v_s ~ '\.0[0-9]+(/|$)'
               OR ((v_s !~ ':' OR v_s ~ '\.')
                   AND v_s !~ '(^|:)[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(/[0-9]{1,3})?$')
            THEN
                RAISE invalid_text_representation;
            END IF;
            PERFORM v_s::inet;
        EXCEPTION WHEN invalid_text_representation OR invalid_binary_representation
                       OR data_exception THEN
            PERFORM llmgw_bad(format('allow_ips[%s]: %s is not an IP address or CIDR',
                                     v_i, v_e::text));
        END;
        v_i := v_i + 1;
    END LOOP;
    RETURN v;
END $$;

CREATE OR REPLACE FUNCTION llmgw_v_num(v jsonb, p_field text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(v) IS DISTINCT FROM 'number' OR v::numeric < 0 THEN
        PERFORM llmgw_bad(p_field || ': must be a number >= 0');
    END IF;
    IF v::numeric > 1000000000 THEN
        PERFORM llmgw_bad(p_field || ': must be at most 1000000000');
    END IF;
    RETURN v;
END $$;

CREATE OR REPLACE FUNCTION llmgw_v_expired_time(v jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(v) = 'number' AND v::numeric = trunc(v::numeric)
       AND (v::numeric = -1 OR v::numeric BETWEEN 1 AND 100000000000) THEN
        RETURN v::numeric::bigint;
    END IF;
    PERFORM llmgw_bad('expired_time: must be -1 (never expires) or a positive unix time in seconds'
                      || CASE WHEN jsonb_typeof(v) = 'number' AND v::numeric > 100000000000
                              THEN ' (this looks like milliseconds)' ELSE '' END);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION llmgw_v_base_url(v jsonb) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    s text := llmgw_v_str(v, 'base_url');
    m text[];
BEGIN
    IF s ~ '[^ -~]' THEN
        PERFORM llmgw_bad('base_url: must be printable ASCII (percent-encode other characters)');
    END IF;
    m := regexp_match(s,
        '^https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:([0-9]{1,5}))?(/[^?#\s]*)?$');
    IF m IS NULL THEN
        PERFORM llmgw_bad('base_url: must be http(s)://host[:port][/path] '
                          || 'without credentials, query or fragment');
    END IF;
    IF m[3] IS NOT NULL AND (m[3]::int < 1 OR m[3]::int > 65535) THEN
        PERFORM llmgw_bad('base_url: the port must be 1 to 65535');
    END IF;
    RETURN regexp_replace(s, '/+$', '');
END $$;

-- A group name as users, keys, /api/group and /api/rate_limit take it.
CREATE FUNCTION llmgw_v_group_name(s text, p_field text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF btrim(s) = '' THEN
        PERFORM llmgw_bad(p_field || ': group names must be non-empty');
    END IF;
    IF length(s) > 64 THEN
        PERFORM llmgw_bad(p_field || ': group names must be at most 64 characters');
    END IF;
    IF s ~ '[[:cntrl:]]' THEN
        PERFORM llmgw_bad(p_field || ': group names must not contain control characters');
    END IF;
    RETURN s;
END $$;

-- Refuses a member of object b that is not in p_known: read-only when in
-- p_readonly, else unknown.  p_prefix names the object ('' for a body).
CREATE FUNCTION llmgw_v_members(b jsonb, p_known text[],
                                p_readonly text[] DEFAULT '{}',
                                p_prefix text DEFAULT '')
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    k text;
BEGIN
    SELECT key INTO k
      FROM jsonb_object_keys(b) AS key
     WHERE key <> ALL (p_known)
     ORDER BY key LIMIT 1;
    IF k IS NULL THEN
        RETURN;
    END IF;
    IF k = ANY (p_readonly) THEN
        PERFORM llmgw_bad(format('%s%s: is read-only', p_prefix, k));
    END IF;
    PERFORM llmgw_bad(format('%s%s: unknown field (known: %s)', p_prefix, k,
                             array_to_string(p_known, ', ')));
END $$;


-- ======================================================================
-- Bodies of the admin API
-- ======================================================================

CREATE OR REPLACE FUNCTION llmgw_api_user(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF p_method IN ('POST', 'PATCH') THEN
        PERFORM llmgw_v_members(b, ARRAY['username', 'quota', 'group', 'status'],
                                ARRAY['id', 'used_quota', 'created_at']);
        IF jsonb_typeof(b -> 'group') = 'string' THEN
            PERFORM llmgw_v_group_name(b ->> 'group', 'group');
        END IF;
    END IF;

    IF p_method = 'DELETE' AND p_id IS NOT NULL THEN
        -- Lock order: tokens by id, then users by id.
        PERFORM 1 FROM tokens
          WHERE user_id = p_id AND deleted_at IS NULL
          ORDER BY id FOR UPDATE;
    END IF;

    RETURN llmgw_api_user_base(p_method, p_id, q, b);
END $$;

ALTER FUNCTION llmgw_api_token(text, bigint, jsonb, jsonb)
    RENAME TO llmgw_api_token_base;

CREATE FUNCTION llmgw_api_token(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_known text[] := ARRAY['name', 'remain_quota', 'unlimited_quota',
                            'expired_time', 'models', 'allow_ips', 'group',
                            'status'];
BEGIN
    IF p_method IN ('POST', 'PATCH') THEN
        -- a key cannot move to another user
        IF p_id IS NULL THEN
            v_known := v_known || 'user_id'::text;
        END IF;
        PERFORM llmgw_v_members(b, v_known,
            ARRAY['id', 'user_id', 'key', 'key_prefix', 'used_quota', 'created_at']);
        -- '' is a key's "the user's group"
        IF jsonb_typeof(b -> 'group') = 'string' AND b ->> 'group' <> '' THEN
            PERFORM llmgw_v_group_name(b ->> 'group', 'group');
        END IF;
    END IF;
    RETURN llmgw_api_token_base(p_method, p_id, q, b);
END $$;

ALTER FUNCTION llmgw_api_channel(text, bigint, jsonb, jsonb)
    RENAME TO llmgw_api_channel_keyed;

CREATE FUNCTION llmgw_api_channel(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF p_method IN ('POST', 'PATCH') THEN
        PERFORM llmgw_v_members(b,
            ARRAY['name', 'type', 'base_url', 'key', 'models', 'groups',
                  'priority', 'weight', 'model_mapping', 'status', 'settings'],
            ARRAY['id', 'created_at', 'key_set']);
        -- routing shares a priority level out by weight up to this
        IF b ? 'weight' THEN
            PERFORM llmgw_v_int(b -> 'weight', 'weight', 0, 1000000);
        END IF;
    END IF;
    RETURN llmgw_api_channel_keyed(p_method, p_id, q, b);
END $$;

ALTER FUNCTION llmgw_api_group(text, jsonb) RENAME TO llmgw_api_group_base;

CREATE FUNCTION llmgw_api_group(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF p_method = 'PUT' THEN
        FOR r IN SELECT key, value FROM jsonb_each(b) ORDER BY key LOOP
            PERFORM llmgw_v_group_name(r.key, 'group');
            IF jsonb_typeof(r.value) = 'object' THEN
                PERFORM llmgw_v_members(r.value, ARRAY['ratio', 'deprecated'],
                                        '{}', 'group.' || r.key || '.');
            END IF;
        END LOOP;
    END IF;
    RETURN llmgw_api_group_base(p_method, b);
END $$;

ALTER FUNCTION llmgw_api_rate_limit(text, jsonb) RENAME TO llmgw_api_rate_limit_base;

CREATE FUNCTION llmgw_api_rate_limit(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_rule text[] := ARRAY['duration_minutes', 'total', 'success'];
    r      record;
BEGIN
    IF p_method = 'PUT' THEN
        PERFORM llmgw_v_members(b, ARRAY['default', 'groups'], '{}', 'rate_limit.');
        IF jsonb_typeof(b -> 'default') = 'object' THEN
            PERFORM llmgw_v_members(b -> 'default', v_rule, '{}',
                                    'rate_limit.default.');
        END IF;
        IF jsonb_typeof(b -> 'groups') = 'object' THEN
            FOR r IN SELECT key, value FROM jsonb_each(b -> 'groups') ORDER BY key LOOP
                PERFORM llmgw_v_group_name(r.key, 'rate_limit.groups');
                IF jsonb_typeof(r.value) = 'object' THEN
                    PERFORM llmgw_v_members(r.value, v_rule, '{}',
                                            'rate_limit.groups.' || r.key || '.');
                END IF;
            END LOOP;
        END IF;
    END IF;
    RETURN llmgw_api_rate_limit_base(p_method, b);
END $$;


-- ======================================================================
-- Balances
-- ======================================================================

-- a + d, held to the bigint range.
CREATE FUNCTION llmgw_add(a bigint, d numeric) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT greatest(least(a::numeric + d, 9223372036854775807),
                    -9223372036854775808)::bigint
$$;

CREATE OR REPLACE FUNCTION llmgw_flush_apply(p_tok bigint[], p_tok_d bigint[],
                                             p_usr bigint[], p_usr_d bigint[])
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_d   numeric[];
    v_t   jsonb;
    v_tr  jsonb;
    v_u   jsonb;
    v_ur  jsonb;
BEGIN
    SELECT array_agg(id ORDER BY id), array_agg(d ORDER BY id)
      INTO v_ids, v_d
      FROM (SELECT id, sum(delta) AS d
              FROM unnest(p_tok, p_tok_d) AS x(id, delta)
             WHERE id IS NOT NULL GROUP BY id HAVING sum(delta) <> 0) AS s;

    IF v_ids IS NOT NULL THEN
        -- Lock order: tokens by id, then users by id.
        PERFORM 1 FROM tokens WHERE id = ANY (v_ids) ORDER BY id FOR UPDATE;
        UPDATE tokens AS t
           SET remain_quota = CASE WHEN t.unlimited_quota THEN t.remain_quota
                                   ELSE llmgw_add(t.remain_quota, -x.delta) END,
               used_quota   = llmgw_add(t.used_quota, x.delta),
               bal_rev      = CASE WHEN t.unlimited_quota THEN t.bal_rev
                                   ELSE t.bal_rev + 1 END
          FROM unnest(v_ids, v_d) AS x(id, delta)
         WHERE t.id = x.id;
    END IF;

    SELECT array_agg(id ORDER BY id), array_agg(d ORDER BY id)
      INTO v_ids, v_d
      FROM (SELECT id, sum(delta) AS d
              FROM unnest(p_usr, p_usr_d) AS x(id, delta)
             WHERE id IS NOT NULL GROUP BY id HAVING sum(delta) <> 0) AS s;

    IF v_ids IS NOT NULL THEN
        PERFORM 1 FROM users WHERE id = ANY (v_ids) ORDER BY id FOR UPDATE;
        UPDATE users AS u
           SET quota      = llmgw_add(u.quota, -x.delta),
               used_quota = llmgw_add(u.used_quota, x.delta),
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

-- 007's task balance moves, with the same arithmetic.
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
                                WHERE value::numeric <> 0))
         ORDER BY id FOR UPDATE;
    END IF;
    IF n > 0 THEN
        UPDATE tokens AS t
           SET remain_quota = CASE WHEN t.unlimited_quota THEN t.remain_quota
                                   ELSE llmgw_add(t.remain_quota,
                                                  -(p_tok ->> t.id::text)::numeric) END,
               used_quota   = llmgw_add(t.used_quota, (p_tok ->> t.id::text)::numeric)
         WHERE t.id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_tok)
                                  WHERE value::numeric <> 0));
    END IF;

    n := jsonb_array_length(jsonb_path_query_array(p_usr, '$.* ? (@ != 0)'));
    IF n > 1 THEN
        PERFORM 1 FROM users
         WHERE id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_usr)
                                WHERE value::numeric <> 0))
         ORDER BY id FOR UPDATE;
    END IF;
    IF n > 0 THEN
        UPDATE users AS u
           SET quota      = llmgw_add(u.quota, -(p_usr ->> u.id::text)::numeric),
               used_quota = llmgw_add(u.used_quota, (p_usr ->> u.id::text)::numeric)
         WHERE u.id = ANY (ARRAY(SELECT key::bigint FROM jsonb_each_text(p_usr)
                                  WHERE value::numeric <> 0));
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

CREATE OR REPLACE FUNCTION llmgw_task_apply_one(p_token bigint, p_user bigint, d bigint)
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
                                   ELSE llmgw_add(remain_quota, -d::numeric) END,
               used_quota   = llmgw_add(used_quota, d)
         WHERE id = p_token
        RETURNING jsonb_build_object(id::text, remain_quota) INTO v_tok;
    END IF;
    UPDATE users
       SET quota = llmgw_add(quota, -d::numeric), used_quota = llmgw_add(used_quota, d)
     WHERE id = p_user
    RETURNING jsonb_build_object(id::text, quota) INTO v_usr;
    RETURN jsonb_build_object('tokens', coalesce(v_tok, '{}'),
                              'users', coalesce(v_usr, '{}'));
END $$;
