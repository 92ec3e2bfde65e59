-- llmgw core schema and the SQL API the nginx module calls.
--
-- The module stays thin: the admin API handler passes (method, path, query,
-- body) to llmgw_api() and returns its answer, the config loader reads
-- llmgw_snapshot(), key checks call llmgw_token_lookup(), and the ledger
-- writer calls llmgw_flush().  Every validation rule lives here.
--
-- migrate.sh wraps this file in one transaction; it must not contain
-- BEGIN/COMMIT itself.


-- ======================================================================
-- Tables
-- ======================================================================

CREATE TABLE users (
    id          bigserial   PRIMARY KEY,
    username    text        NOT NULL,
    quota       bigint      NOT NULL DEFAULT 0,
    used_quota  bigint      NOT NULL DEFAULT 0,
    "group"     text        NOT NULL DEFAULT 'default',
    status      text        NOT NULL DEFAULT 'enabled'
                            CHECK (status IN ('enabled', 'disabled')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    deleted_at  timestamptz
);

-- Unique among live users only, so a deleted user's name can be reused.
CREATE UNIQUE INDEX users_username_live ON users (username)
    WHERE deleted_at IS NULL;

CREATE TABLE tokens (
    id              bigserial   PRIMARY KEY,
    user_id         bigint      NOT NULL REFERENCES users (id),
    name            text        NOT NULL DEFAULT '',
    key_hash        text        NOT NULL UNIQUE,      -- sha256 hex of the key without "sk-"
    key_prefix      text        NOT NULL DEFAULT '',  -- first 6 chars after "sk-", for display
    remain_quota    bigint      NOT NULL DEFAULT 0,
    used_quota      bigint      NOT NULL DEFAULT 0,
    unlimited_quota boolean     NOT NULL DEFAULT false,
    expired_time    bigint      NOT NULL DEFAULT -1,  -- unix seconds, -1 never
    models          jsonb,                            -- null: every model; []: none
    allow_ips       jsonb,                            -- null: any address
    "group"         text        NOT NULL DEFAULT '',  -- '': the user's group
    status          text        NOT NULL DEFAULT 'enabled'
                                CHECK (status IN ('enabled', 'disabled')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    deleted_at      timestamptz
);

CREATE INDEX tokens_user ON tokens (user_id);

CREATE TABLE channels (
    id            bigserial   PRIMARY KEY,
    name          text        NOT NULL DEFAULT '',
    type          int         NOT NULL,
    base_url      text        NOT NULL,
    key           text        NOT NULL DEFAULT '',
    models        jsonb       NOT NULL DEFAULT '[]',
    groups        jsonb       NOT NULL DEFAULT '["default"]',
    priority      bigint      NOT NULL DEFAULT 0,
    weight        bigint      NOT NULL DEFAULT 1,
    model_mapping jsonb       NOT NULL DEFAULT '{}',
    status        text        NOT NULL DEFAULT 'enabled'
                              CHECK (status IN ('enabled', 'disabled')),
    settings      jsonb       NOT NULL DEFAULT '{}',
    created_at    timestamptz NOT NULL DEFAULT now(),
    deleted_at    timestamptz
);

CREATE TABLE options (
    name  text  PRIMARY KEY,
    value jsonb NOT NULL
);

INSERT INTO options (name, value) VALUES
    ('pricing',     '{}'),
    ('group_ratio', '{"default": {"ratio": 1, "deprecated": false}}'),
    ('rate_limit',  '{"default": null, "groups": {}}');

CREATE TABLE admin_tokens (
    hash       text        PRIMARY KEY,   -- sha256 hex of the admin key without "sk-"
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE config_revision (
    id  int    PRIMARY KEY CHECK (id = 1),
    rev bigint NOT NULL
);

INSERT INTO config_revision (id, rev) VALUES (1, 1);

-- The ledger.  No foreign keys: rows are history and must always insert.
CREATE TABLE logs (
    id                    bigserial   PRIMARY KEY,
    request_id            text        NOT NULL,
    type                  text        NOT NULL
                                      CHECK (type IN ('consume', 'refund', 'error', 'reserve')),
    user_id               bigint,
    token_id              bigint,
    model_name            text,
    upstream_model        text,
    channel_id            bigint,
    channels_tried        jsonb,
    endpoint              text,
    prompt_tokens         bigint      NOT NULL DEFAULT 0,
    completion_tokens     bigint      NOT NULL DEFAULT 0,
    cache_read_tokens     bigint      NOT NULL DEFAULT 0,
    cache_creation_tokens bigint      NOT NULL DEFAULT 0,
    quota                 bigint      NOT NULL DEFAULT 0,
    is_stream             boolean     NOT NULL DEFAULT false,
    status                int,
    latency_ms            int,
    content               text        NOT NULL DEFAULT '',
    created_at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (request_id, type)         -- makes llmgw_flush idempotent
);

CREATE INDEX logs_token_time ON logs (token_id, created_at);
CREATE INDEX logs_user_time  ON logs (user_id, created_at);
CREATE INDEX logs_model_time ON logs (model_name, created_at);
CREATE INDEX logs_time       ON logs (created_at);


-- ======================================================================
-- Small helpers
-- ======================================================================

CREATE FUNCTION llmgw_epoch(ts timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT floor(extract(epoch FROM ts))::bigint
$$;

-- Raises a user error.  llmgw_api catches SQLSTATE 'LG<status>' and answers
-- {"status", "message", "code"}; the code travels in the HINT.
CREATE FUNCTION llmgw_fail(p_status int, p_code text, p_message text)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'LG' || p_status::text,
                          MESSAGE = p_message, HINT = p_code;
END $$;

CREATE FUNCTION llmgw_bad(p_message text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM llmgw_fail(400, 'invalid_request', p_message);
END $$;

CREATE FUNCTION llmgw_option(p_name text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT value FROM options WHERE name = p_name
$$;

-- Reads an option row locked, so that concurrent merges do not lose updates.
CREATE FUNCTION llmgw_option_lock(p_name text, p_default jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE v jsonb;
BEGIN
    INSERT INTO options (name, value) VALUES (p_name, p_default)
        ON CONFLICT (name) DO NOTHING;
    SELECT value INTO v FROM options WHERE name = p_name FOR UPDATE;
    RETURN v;
END $$;

CREATE FUNCTION llmgw_option_set(p_name text, p_value jsonb) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO options (name, value) VALUES (p_name, p_value)
        ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value
$$;


-- ======================================================================
-- Revision bump: every admin mutation calls it so gateways reload
-- ======================================================================

CREATE FUNCTION llmgw_bump(kind text, id bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE v_rev bigint;
BEGIN
    IF kind IS NULL OR kind NOT IN ('user', 'token', 'channel', 'config') THEN
        RAISE EXCEPTION 'llmgw_bump: unknown kind %', kind;
    END IF;
    UPDATE config_revision SET rev = rev + 1 WHERE config_revision.id = 1
        RETURNING rev INTO v_rev;
    -- Delivered at commit, so listeners never see a rolled-back change.
    PERFORM pg_notify('llmgw_config',
        json_build_object('rev', v_rev, 'kind', kind, 'id', llmgw_bump.id)::text);
    RETURN v_rev;
END $$;


-- ======================================================================
-- Query strings
-- ======================================================================

-- application/x-www-form-urlencoded decoding: '+' is a space, %XX a byte.
-- A malformed %-sequence is kept as it is.
CREATE FUNCTION llmgw_urldecode(s text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_out bytea := '';
    v_i   int := 1;
    v_n   int;
    v_c   text;
BEGIN
    s := replace(s, '+', ' ');
    IF position('%' IN s) = 0 THEN
        RETURN s;
    END IF;
    v_n := length(s);
    WHILE v_i <= v_n LOOP
        v_c := substr(s, v_i, 1);
        IF v_c = '%' AND substr(s, v_i + 1, 2) ~ '^[0-9A-Fa-f]{2}$' THEN
            v_out := v_out || decode(substr(s, v_i + 1, 2), 'hex');
            v_i := v_i + 3;
        ELSE
            v_out := v_out || convert_to(v_c, 'UTF8');
            v_i := v_i + 1;
        END IF;
    END LOOP;
    RETURN convert_from(v_out, 'UTF8');
END $$;

-- The query string as a JSON object of name -> decoded value (the last of
-- repeated names wins; "name" without "=" has the value "").
CREATE FUNCTION llmgw_query_parse(p_query text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE v jsonb;
BEGIN
    SELECT coalesce(jsonb_object_agg(k, val ORDER BY ord), '{}')
      INTO v
      FROM (SELECT llmgw_urldecode(split_part(part, '=', 1)) AS k,
                   llmgw_urldecode(CASE WHEN position('=' IN part) > 0
                                        THEN substr(part, position('=' IN part) + 1)
                                        ELSE '' END) AS val,
                   ord
              FROM regexp_split_to_table(coalesce(p_query, ''), '&')
                   WITH ORDINALITY AS t(part, ord)
             WHERE part <> '') AS pairs;
    RETURN v;
EXCEPTION
    WHEN character_not_in_repertoire OR untranslatable_character THEN
        PERFORM llmgw_bad('query string is not valid UTF-8 once decoded');
        RETURN NULL;
END $$;

-- An integer query parameter; absent or empty gives the default.
CREATE FUNCTION llmgw_q_int(q jsonb, p_name text, p_default bigint,
                            p_lo bigint DEFAULT NULL, p_hi bigint DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    s text := q ->> p_name;
    n numeric;
BEGIN
    IF s IS NULL OR s = '' THEN
        RETURN p_default;
    END IF;
    IF s ~ '^-?[0-9]{1,30}$' THEN
        n := s::numeric;
        IF n BETWEEN coalesce(p_lo, -9223372036854775808)
                 AND coalesce(p_hi, 9223372036854775807) THEN
            RETURN n::bigint;
        END IF;
    END IF;
    PERFORM llmgw_bad(format('%s: must be an integer%s', p_name,
        CASE WHEN p_lo IS NOT NULL AND p_hi IS NOT NULL
                 THEN format(' between %s and %s', p_lo, p_hi)
             WHEN p_lo IS NOT NULL THEN ' >= ' || p_lo
             WHEN p_hi IS NOT NULL THEN ' <= ' || p_hi
             ELSE '' END));
    RETURN NULL;
END $$;

-- page / page_size for list routes.
CREATE FUNCTION llmgw_q_page(q jsonb, OUT page bigint, OUT page_size bigint,
                             OUT skip bigint)
LANGUAGE plpgsql AS $$
BEGIN
    page := llmgw_q_int(q, 'page', 1, 1);
    page_size := llmgw_q_int(q, 'page_size', 50, 1, 1000);
    skip := least((page - 1)::numeric * page_size, 9000000000000000000)::bigint;
END $$;


-- ======================================================================
-- Body field validators.  Each returns the checked value or raises a 400
-- whose message is "<field>: <rule>".
-- ======================================================================

CREATE FUNCTION llmgw_v_int(v jsonb, p_field text,
                            p_lo numeric DEFAULT NULL, p_hi numeric DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE n numeric;
BEGIN
    -- An integral JSON number (5 and 5.0 and 5e0 alike) inside bigint.
    IF jsonb_typeof(v) = 'number' THEN
        n := v::numeric;
        IF n = trunc(n)
           AND n BETWEEN coalesce(p_lo, -9223372036854775808)
                     AND coalesce(p_hi, 9223372036854775807) THEN
            RETURN n::bigint;
        END IF;
    END IF;
    PERFORM llmgw_bad(format('%s: must be an integer%s', p_field,
        CASE WHEN p_lo IS NOT NULL AND p_hi IS NOT NULL
                 THEN format(' between %s and %s', p_lo, p_hi)
             WHEN p_lo IS NOT NULL THEN ' >= ' || p_lo
             WHEN p_hi IS NOT NULL THEN ' <= ' || p_hi
             ELSE '' END));
    RETURN NULL;
END $$;

CREATE FUNCTION llmgw_v_num(v jsonb, p_field text) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(v) = 'number' AND v::numeric >= 0 THEN
        RETURN v;
    END IF;
    PERFORM llmgw_bad(p_field || ': must be a number >= 0');
    RETURN NULL;
END $$;

CREATE FUNCTION llmgw_v_str(v jsonb, p_field text,
                            p_nonempty boolean DEFAULT false,
                            p_maxlen int DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE s text;
BEGIN
    IF jsonb_typeof(v) IS DISTINCT FROM 'string' THEN
        PERFORM llmgw_bad(p_field || ': must be a string');
    END IF;
    s := v #>> '{}';
    IF p_nonempty AND btrim(s) = '' THEN
        PERFORM llmgw_bad(p_field || ': must be a non-empty string');
    END IF;
    IF p_maxlen IS NOT NULL AND length(s) > p_maxlen THEN
        PERFORM llmgw_bad(format('%s: must be at most %s characters', p_field, p_maxlen));
    END IF;
    RETURN s;
END $$;

CREATE FUNCTION llmgw_v_bool(v jsonb, p_field text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(v) IS DISTINCT FROM 'boolean' THEN
        PERFORM llmgw_bad(p_field || ': must be true or false');
    END IF;
    RETURN v::boolean;
END $$;

CREATE FUNCTION llmgw_v_status(v jsonb) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF v IS NULL OR v NOT IN ('"enabled"', '"disabled"') THEN
        PERFORM llmgw_bad('status: must be "enabled" or "disabled"');
    END IF;
    RETURN v #>> '{}';
END $$;

-- A list of names: an array of non-empty strings or, when p_comma, also a
-- comma-separated string.  Entries are trimmed; duplicates dropped in order.
CREATE FUNCTION llmgw_v_names(v jsonb, p_field text, p_comma boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_items text[] := '{}';
    v_e     jsonb;
    v_i     int := 0;
BEGIN
    IF p_comma AND jsonb_typeof(v) = 'string' THEN
        SELECT coalesce(array_agg(btrim(x) ORDER BY o), '{}') INTO v_items
          FROM regexp_split_to_table(v #>> '{}', ',') WITH ORDINALITY AS t(x, o)
         WHERE btrim(x) <> '';
    ELSIF jsonb_typeof(v) = 'array' THEN
        FOR v_e IN SELECT e FROM jsonb_array_elements(v) AS e LOOP
            IF jsonb_typeof(v_e) <> 'string' OR btrim(v_e #>> '{}') = '' THEN
                PERFORM llmgw_bad(format('%s[%s]: must be a non-empty string', p_field, v_i));
            END IF;
            v_items := v_items || btrim(v_e #>> '{}');
            v_i := v_i + 1;
        END LOOP;
    ELSE
        PERFORM llmgw_bad(p_field || ': must be an array of strings'
            || CASE WHEN p_comma THEN ' or a comma-separated string' ELSE '' END);
    END IF;
    RETURN (SELECT coalesce(jsonb_agg(x ORDER BY pos), '[]')
              FROM (SELECT x, min(o) AS pos
                      FROM unnest(v_items) WITH ORDINALITY AS u(x, o)
                     GROUP BY x) AS d);
END $$;

-- An IP allow list: null or [] (any address, stored as null) or an array of
-- IPv4/IPv6 addresses and CIDR blocks.
CREATE FUNCTION llmgw_v_ips(v jsonb) RETURNS jsonb
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
            -- inet accepts "a.b.c.d", "a.b.c.d/n" and IPv6 forms; the regex
            -- keeps out whatever else its parser tolerates.
            IF v_s !~ '^[0-9A-Fa-f:.]+(/[0-9]{1,3})?$' THEN
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

-- An object, or a string holding one ('' is {}): the admin UI of the Go
-- gateways sends model_mapping and settings as strings.
CREATE FUNCTION llmgw_v_object(v jsonb, p_field text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE o jsonb;
BEGIN
    IF jsonb_typeof(v) = 'object' THEN
        RETURN v;
    END IF;
    IF jsonb_typeof(v) = 'string' THEN
        IF btrim(v #>> '{}') = '' THEN
            RETURN '{}';
        END IF;
        BEGIN
            o := (v #>> '{}')::jsonb;
        EXCEPTION WHEN OTHERS THEN
            o := NULL;
        END;
        IF jsonb_typeof(o) = 'object' THEN
            RETURN o;
        END IF;
    END IF;
    PERFORM llmgw_bad(p_field || ': must be a JSON object (or a string holding one)');
    RETURN NULL;
END $$;

CREATE FUNCTION llmgw_v_mapping(v jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := llmgw_v_object(v, 'model_mapping');
    r record;
BEGIN
    FOR r IN SELECT key, value FROM jsonb_each(o) LOOP
        IF btrim(r.key) = '' THEN
            PERFORM llmgw_bad('model_mapping: model names must be non-empty');
        END IF;
        IF jsonb_typeof(r.value) <> 'string' OR btrim(r.value #>> '{}') = '' THEN
            PERFORM llmgw_bad(format('model_mapping.%s: must be a non-empty string', r.key));
        END IF;
    END LOOP;
    RETURN o;
END $$;

CREATE FUNCTION llmgw_v_expired_time(v jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(v) = 'number' AND v::numeric = trunc(v::numeric)
       AND (v::numeric = -1 OR v::numeric BETWEEN 1 AND 9223372036854775807) THEN
        RETURN v::numeric::bigint;
    END IF;
    PERFORM llmgw_bad('expired_time: must be -1 (never expires) or a positive unix time in seconds');
    RETURN NULL;
END $$;

CREATE FUNCTION llmgw_v_base_url(v jsonb) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE s text := llmgw_v_str(v, 'base_url');
BEGIN
    IF s !~ '^https?://[^/\s]+' OR s ~ '\s' THEN
        PERFORM llmgw_bad('base_url: must start with http:// or https:// followed by a host');
    END IF;
    RETURN regexp_replace(s, '/+$', '');
END $$;


-- ======================================================================
-- Object shapes returned by the admin API
-- ======================================================================

CREATE FUNCTION llmgw_user_json(u users) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', u.id, 'username', u.username, 'quota', u.quota,
        'used_quota', u.used_quota, 'group', u."group", 'status', u.status,
        'created_at', llmgw_epoch(u.created_at))
$$;

-- Never carries the key: it exists only in the POST /token answer.
CREATE FUNCTION llmgw_token_json(t tokens) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', t.id, 'user_id', t.user_id, 'name', t.name,
        'key_prefix', t.key_prefix, 'remain_quota', t.remain_quota,
        'used_quota', t.used_quota, 'unlimited_quota', t.unlimited_quota,
        'expired_time', t.expired_time, 'models', t.models,
        'allow_ips', t.allow_ips, 'group', t."group", 'status', t.status,
        'created_at', llmgw_epoch(t.created_at))
$$;

-- Never carries the channel credential, only whether one is set.
CREATE FUNCTION llmgw_channel_json(c channels) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', c.id, 'name', c.name, 'type', c.type, 'base_url', c.base_url,
        'models', c.models, 'groups', c.groups, 'priority', c.priority,
        'weight', c.weight, 'model_mapping', c.model_mapping,
        'status', c.status, 'settings', c.settings,
        'created_at', llmgw_epoch(c.created_at), 'key_set', c.key <> '')
$$;


-- ======================================================================
-- /user
-- ======================================================================

CREATE FUNCTION llmgw_api_user(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    u        users;
    pg       record;
    v_name   text;
    v_quota  bigint;
    v_group  text;
    v_status text;
BEGIN
    IF p_id IS NULL AND p_method = 'GET' THEN
        SELECT * INTO pg FROM llmgw_q_page(q);
        RETURN jsonb_build_object(
            'items', coalesce((SELECT jsonb_agg(llmgw_user_json(x.r) ORDER BY (x.r).id)
                                 FROM (SELECT r FROM users AS r WHERE r.deleted_at IS NULL
                                        ORDER BY r.id LIMIT pg.page_size OFFSET pg.skip) AS x),
                              '[]'),
            'total', (SELECT count(*) FROM users WHERE deleted_at IS NULL),
            'page', pg.page, 'page_size', pg.page_size);
    END IF;

    -- Validate everything given before touching anything.
    IF b ? 'username' THEN
        v_name := llmgw_v_str(b -> 'username', 'username', true, 64);
    ELSIF p_id IS NULL THEN
        PERFORM llmgw_bad('username: is required');
    END IF;
    IF b ? 'quota' THEN
        v_quota := llmgw_v_int(b -> 'quota', 'quota', 0);
    END IF;
    IF b ? 'group' THEN
        v_group := llmgw_v_str(b -> 'group', 'group', true, 64);
    END IF;
    IF b ? 'status' THEN
        v_status := llmgw_v_status(b -> 'status');
    END IF;

    IF p_id IS NULL THEN                                    -- POST /user
        IF EXISTS (SELECT 1 FROM users WHERE username = v_name AND deleted_at IS NULL) THEN
            PERFORM llmgw_fail(400, 'conflict', format('username %s already exists', v_name));
        END IF;
        INSERT INTO users (username, quota, "group", status)
            VALUES (v_name, coalesce(v_quota, 0), coalesce(v_group, 'default'),
                    coalesce(v_status, 'enabled'))
            RETURNING * INTO u;
        PERFORM llmgw_bump('user', u.id);
        RETURN llmgw_user_json(u);
    END IF;

    SELECT * INTO u FROM users WHERE id = p_id AND deleted_at IS NULL
        FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM llmgw_fail(404, 'not_found', format('user %s not found', p_id));
    END IF;

    IF p_method = 'GET' THEN
        RETURN llmgw_user_json(u);
    END IF;

    IF p_method = 'DELETE' THEN
        -- The user's tokens go with it; one 'user' bump tells gateways to
        -- drop every cached token of this user.
        UPDATE tokens SET deleted_at = now()
         WHERE user_id = p_id AND deleted_at IS NULL;
        UPDATE users SET deleted_at = now() WHERE id = p_id;
        PERFORM llmgw_bump('user', p_id);
        RETURN jsonb_build_object('id', p_id, 'deleted', true);
    END IF;

    -- PATCH
    IF v_name IS NOT NULL AND EXISTS (
            SELECT 1 FROM users
             WHERE username = v_name AND deleted_at IS NULL AND id <> p_id) THEN
        PERFORM llmgw_fail(400, 'conflict', format('username %s already exists', v_name));
    END IF;
    UPDATE users SET username = coalesce(v_name, username),
                     quota    = coalesce(v_quota, quota),
                     "group"  = coalesce(v_group, "group"),
                     status   = coalesce(v_status, status)
     WHERE id = p_id
     RETURNING * INTO u;
    PERFORM llmgw_bump('user', p_id);
    RETURN llmgw_user_json(u);
END $$;


-- ======================================================================
-- /token
-- ======================================================================

CREATE FUNCTION llmgw_api_token(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    t          tokens;
    pg         record;
    v_user     bigint;
    v_filter   bigint;
    v_name     text;
    v_remain   bigint;
    v_unlim    boolean;
    v_expired  bigint;
    v_models   jsonb;
    v_ips      jsonb;
    v_group    text;
    v_status   text;
    v_secret   text;
BEGIN
    IF p_id IS NULL AND p_method = 'GET' THEN
        SELECT * INTO pg FROM llmgw_q_page(q);
        v_filter := llmgw_q_int(q, 'user_id', NULL, 1);
        RETURN jsonb_build_object(
            'items', coalesce((SELECT jsonb_agg(llmgw_token_json(x.r) ORDER BY (x.r).id)
                                 FROM (SELECT r FROM tokens AS r
                                        WHERE r.deleted_at IS NULL
                                          AND (v_filter IS NULL OR r.user_id = v_filter)
                                        ORDER BY r.id LIMIT pg.page_size OFFSET pg.skip) AS x),
                              '[]'),
            'total', (SELECT count(*) FROM tokens
                       WHERE deleted_at IS NULL
                         AND (v_filter IS NULL OR user_id = v_filter)),
            'page', pg.page, 'page_size', pg.page_size);
    END IF;

    IF b ? 'name' THEN
        v_name := llmgw_v_str(b -> 'name', 'name');
    END IF;
    IF b ? 'remain_quota' THEN
        v_remain := llmgw_v_int(b -> 'remain_quota', 'remain_quota', 0);
    END IF;
    IF b ? 'unlimited_quota' THEN
        v_unlim := llmgw_v_bool(b -> 'unlimited_quota', 'unlimited_quota');
    END IF;
    IF b ? 'expired_time' THEN
        v_expired := llmgw_v_expired_time(b -> 'expired_time');
    END IF;
    IF b ? 'models' AND b -> 'models' <> 'null' THEN
        v_models := llmgw_v_names(b -> 'models', 'models', false);
    END IF;
    IF b ? 'allow_ips' THEN
        v_ips := llmgw_v_ips(b -> 'allow_ips');
    END IF;
    IF b ? 'group' THEN
        v_group := llmgw_v_str(b -> 'group', 'group', false, 64);
    END IF;
    IF b ? 'status' THEN
        v_status := llmgw_v_status(b -> 'status');
    END IF;

    IF p_id IS NULL THEN                                    -- POST /token
        IF NOT b ? 'user_id' THEN
            PERFORM llmgw_bad('user_id: is required');
        END IF;
        v_user := llmgw_v_int(b -> 'user_id', 'user_id', 1);
        -- FOR SHARE: a concurrent DELETE /user waits until this token exists,
        -- then deletes it too.
        PERFORM 1 FROM users WHERE id = v_user AND deleted_at IS NULL FOR SHARE;
        IF NOT FOUND THEN
            PERFORM llmgw_bad(format('user_id: user %s does not exist', v_user));
        END IF;
        -- 48 lowercase hex characters from two random UUIDs.
        v_secret := left(replace(gen_random_uuid()::text, '-', '')
                         || replace(gen_random_uuid()::text, '-', ''), 48);
        INSERT INTO tokens (user_id, name, key_hash, key_prefix, remain_quota,
                            unlimited_quota, expired_time, models, allow_ips,
                            "group", status)
            VALUES (v_user, coalesce(v_name, ''),
                    encode(sha256(convert_to(v_secret, 'UTF8')), 'hex'),
                    left(v_secret, 6), coalesce(v_remain, 0),
                    coalesce(v_unlim, false), coalesce(v_expired, -1),
                    v_models, v_ips, coalesce(v_group, ''),
                    coalesce(v_status, 'enabled'))
            RETURNING * INTO t;
        PERFORM llmgw_bump('token', t.id);
        RETURN llmgw_token_json(t) || jsonb_build_object('key', 'sk-' || v_secret);
    END IF;

    SELECT * INTO t FROM tokens WHERE id = p_id AND deleted_at IS NULL
        FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM llmgw_fail(404, 'not_found', format('token %s not found', p_id));
    END IF;

    IF p_method = 'GET' THEN
        RETURN llmgw_token_json(t);
    END IF;

    IF p_method = 'DELETE' THEN
        UPDATE tokens SET deleted_at = now() WHERE id = p_id;
        PERFORM llmgw_bump('token', p_id);
        RETURN jsonb_build_object('id', p_id, 'deleted', true);
    END IF;

    -- PATCH; models and allow_ips may be set back to null.
    UPDATE tokens SET
        name            = coalesce(v_name, name),
        remain_quota    = coalesce(v_remain, remain_quota),
        unlimited_quota = coalesce(v_unlim, unlimited_quota),
        expired_time    = coalesce(v_expired, expired_time),
        models          = CASE WHEN b ? 'models' THEN v_models ELSE models END,
        allow_ips       = CASE WHEN b ? 'allow_ips' THEN v_ips ELSE allow_ips END,
        "group"         = coalesce(v_group, "group"),
        status          = coalesce(v_status, status)
     WHERE id = p_id
     RETURNING * INTO t;
    PERFORM llmgw_bump('token', p_id);
    RETURN llmgw_token_json(t);
END $$;


-- ======================================================================
-- /channel
-- ======================================================================

CREATE FUNCTION llmgw_api_channel(p_method text, p_id bigint, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c          channels;
    pg         record;
    v_name     text;
    v_type     int;
    v_base     text;
    v_key      text;
    v_models   jsonb;
    v_groups   jsonb;
    v_priority bigint;
    v_weight   bigint;
    v_mapping  jsonb;
    v_status   text;
    v_settings jsonb;
BEGIN
    IF p_id IS NULL AND p_method = 'GET' THEN
        SELECT * INTO pg FROM llmgw_q_page(q);
        RETURN jsonb_build_object(
            'items', coalesce((SELECT jsonb_agg(llmgw_channel_json(x.r) ORDER BY (x.r).id)
                                 FROM (SELECT r FROM channels AS r WHERE r.deleted_at IS NULL
                                        ORDER BY r.id LIMIT pg.page_size OFFSET pg.skip) AS x),
                              '[]'),
            'total', (SELECT count(*) FROM channels WHERE deleted_at IS NULL),
            'page', pg.page, 'page_size', pg.page_size);
    END IF;

    IF p_id IS NULL THEN
        IF NOT b ? 'type' THEN
            PERFORM llmgw_bad('type: is required');
        END IF;
        IF NOT b ? 'base_url' THEN
            PERFORM llmgw_bad('base_url: is required');
        END IF;
        IF NOT b ? 'models' THEN
            PERFORM llmgw_bad('models: is required');
        END IF;
    END IF;
    IF b ? 'name' THEN
        v_name := llmgw_v_str(b -> 'name', 'name');
    END IF;
    IF b ? 'type' THEN
        v_type := llmgw_v_int(b -> 'type', 'type', 0, 2147483647);
    END IF;
    IF b ? 'base_url' THEN
        v_base := llmgw_v_base_url(b -> 'base_url');
    END IF;
    IF b ? 'key' THEN
        v_key := llmgw_v_str(b -> 'key', 'key');
    END IF;
    IF b ? 'models' THEN
        v_models := llmgw_v_names(b -> 'models', 'models', true);
    END IF;
    IF b ? 'groups' THEN
        v_groups := llmgw_v_names(b -> 'groups', 'groups', true);
    END IF;
    IF b ? 'priority' THEN
        v_priority := llmgw_v_int(b -> 'priority', 'priority');
    END IF;
    IF b ? 'weight' THEN
        v_weight := llmgw_v_int(b -> 'weight', 'weight', 0);
    END IF;
    IF b ? 'model_mapping' THEN
        v_mapping := llmgw_v_mapping(b -> 'model_mapping');
    END IF;
    IF b ? 'status' THEN
        v_status := llmgw_v_status(b -> 'status');
    END IF;
    IF b ? 'settings' THEN
        v_settings := llmgw_v_object(b -> 'settings', 'settings');
    END IF;

    IF p_id IS NULL THEN                                    -- POST /channel
        INSERT INTO channels (name, type, base_url, key, models, groups, priority,
                              weight, model_mapping, status, settings)
            VALUES (coalesce(v_name, ''), v_type, v_base, coalesce(v_key, ''),
                    v_models, coalesce(v_groups, '["default"]'),
                    coalesce(v_priority, 0), coalesce(v_weight, 1),
                    coalesce(v_mapping, '{}'), coalesce(v_status, 'enabled'),
                    coalesce(v_settings, '{}'))
            RETURNING * INTO c;
        PERFORM llmgw_bump('channel', c.id);
        RETURN llmgw_channel_json(c);
    END IF;

    SELECT * INTO c FROM channels WHERE id = p_id AND deleted_at IS NULL
        FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM llmgw_fail(404, 'not_found', format('channel %s not found', p_id));
    END IF;

    IF p_method = 'GET' THEN
        RETURN llmgw_channel_json(c);
    END IF;

    IF p_method = 'DELETE' THEN
        UPDATE channels SET deleted_at = now() WHERE id = p_id;
        PERFORM llmgw_bump('channel', p_id);
        RETURN jsonb_build_object('id', p_id, 'deleted', true);
    END IF;

    UPDATE channels SET
        name          = coalesce(v_name, name),
        type          = coalesce(v_type, type),
        base_url      = coalesce(v_base, base_url),
        key           = coalesce(v_key, key),
        models        = coalesce(v_models, models),
        groups        = coalesce(v_groups, groups),
        priority      = coalesce(v_priority, priority),
        weight        = coalesce(v_weight, weight),
        model_mapping = coalesce(v_mapping, model_mapping),
        status        = coalesce(v_status, status),
        settings      = coalesce(v_settings, settings)
     WHERE id = p_id
     RETURNING * INTO c;
    PERFORM llmgw_bump('channel', p_id);
    RETURN llmgw_channel_json(c);
END $$;


-- ======================================================================
-- /pricing
-- ======================================================================

CREATE FUNCTION llmgw_api_pricing(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_cur   jsonb;
    r       record;
    v_f     text;
    v_ratio boolean;
    v_price boolean;
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
        IF r.value = 'null' THEN                            -- remove the model
            v_cur := v_cur - r.key;
            CONTINUE;
        END IF;
        IF jsonb_typeof(r.value) <> 'object' THEN
            PERFORM llmgw_bad(v_f || ': must be an object with ratio (and completion_ratio) or price, or null to remove it');
        END IF;
        -- A null member counts as absent (forms often send "price": null).
        v_ratio := coalesce(r.value -> 'ratio', 'null') <> 'null';
        v_price := coalesce(r.value -> 'price', 'null') <> 'null';
        IF v_ratio AND v_price THEN
            PERFORM llmgw_bad(v_f || ': give either ratio or price, not both');
        ELSIF v_price THEN
            v_cur := v_cur || jsonb_build_object(r.key, jsonb_build_object(
                'price', llmgw_v_num(r.value -> 'price', v_f || '.price')));
        ELSIF v_ratio THEN
            v_cur := v_cur || jsonb_build_object(r.key, jsonb_build_object(
                'ratio', llmgw_v_num(r.value -> 'ratio', v_f || '.ratio'),
                'completion_ratio',
                    CASE WHEN coalesce(r.value -> 'completion_ratio', 'null') = 'null'
                         THEN '1'::jsonb
                         ELSE llmgw_v_num(r.value -> 'completion_ratio',
                                          v_f || '.completion_ratio') END));
        ELSE
            PERFORM llmgw_bad(v_f || ': needs ratio (per token) or price (per call)');
        END IF;
    END LOOP;

    PERFORM llmgw_option_set('pricing', v_cur);
    PERFORM llmgw_bump('config', 0);
    RETURN v_cur;
END $$;


-- ======================================================================
-- /group
-- ======================================================================

-- The group ratios in normal form {"<group>": {"ratio", "deprecated"}},
-- always with "default".  Bare numbers (hand-written rows) are normalised.
CREATE FUNCTION llmgw_groups() RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('default', jsonb_build_object('ratio', 1, 'deprecated', false))
           || coalesce((SELECT jsonb_object_agg(key,
                            CASE WHEN jsonb_typeof(value) = 'number'
                                 THEN jsonb_build_object('ratio', value, 'deprecated', false)
                                 ELSE value END)
                          FROM jsonb_each(coalesce(llmgw_option('group_ratio'), '{}'))),
                       '{}')
$$;

CREATE FUNCTION llmgw_api_group(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_cur  jsonb;
    v_old  jsonb;
    r      record;
    v_f    text;
    v_rat  jsonb;
    v_dep  boolean;
BEGIN
    IF p_method = 'GET' THEN
        RETURN llmgw_groups();
    END IF;

    PERFORM llmgw_option_lock('group_ratio', '{}');
    v_cur := llmgw_groups();
    FOR r IN SELECT key, value FROM jsonb_each(b) ORDER BY key LOOP
        v_f := 'group.' || r.key;
        IF btrim(r.key) = '' THEN
            PERFORM llmgw_bad('group: group names must be non-empty');
        END IF;
        IF r.value = 'null' THEN                            -- remove the group
            v_cur := v_cur - r.key;
            CONTINUE;
        END IF;
        -- Merge: what is not given keeps its stored value.
        v_old := coalesce(v_cur -> r.key, '{"ratio": 1, "deprecated": false}');
        IF jsonb_typeof(r.value) = 'number' THEN
            v_rat := llmgw_v_num(r.value, v_f);
            v_dep := (v_old ->> 'deprecated')::boolean;
        ELSIF jsonb_typeof(r.value) = 'object' THEN
            v_rat := CASE WHEN r.value ? 'ratio'
                          THEN llmgw_v_num(r.value -> 'ratio', v_f || '.ratio')
                          ELSE v_old -> 'ratio' END;
            v_dep := CASE WHEN r.value ? 'deprecated'
                          THEN llmgw_v_bool(r.value -> 'deprecated', v_f || '.deprecated')
                          ELSE (v_old ->> 'deprecated')::boolean END;
        ELSE
            PERFORM llmgw_bad(v_f || ': must be a number >= 0, an object {ratio, deprecated}, or null to remove it');
        END IF;
        v_cur := v_cur || jsonb_build_object(r.key,
            jsonb_build_object('ratio', v_rat, 'deprecated', coalesce(v_dep, false)));
    END LOOP;

    PERFORM llmgw_option_set('group_ratio', v_cur);
    PERFORM llmgw_bump('config', 0);
    RETURN llmgw_groups();
END $$;


-- ======================================================================
-- /rate_limit
-- ======================================================================

-- One limit {duration_minutes, total, success}; absent members are 0.
CREATE FUNCTION llmgw_v_limit(v jsonb, p_field text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_dur     bigint := 0;
    v_total   bigint := 0;
    v_success bigint := 0;
BEGIN
    IF jsonb_typeof(v) IS DISTINCT FROM 'object' THEN
        PERFORM llmgw_bad(p_field || ': must be an object {duration_minutes, total, success}');
    END IF;
    -- 366 days at most keeps the window in milliseconds far from overflow.
    IF v ? 'duration_minutes' THEN
        v_dur := llmgw_v_int(v -> 'duration_minutes', p_field || '.duration_minutes', 0, 527040);
    END IF;
    IF v ? 'total' THEN
        v_total := llmgw_v_int(v -> 'total', p_field || '.total', 0, 100000);
    END IF;
    IF v ? 'success' THEN
        v_success := llmgw_v_int(v -> 'success', p_field || '.success', 0, 100000);
    END IF;
    IF (v_total > 0 OR v_success > 0) AND v_dur < 1 THEN
        PERFORM llmgw_bad(p_field || '.duration_minutes: must be >= 1 when total or success is above 0');
    END IF;
    RETURN jsonb_build_object('duration_minutes', v_dur, 'total', v_total,
                              'success', v_success);
END $$;

CREATE FUNCTION llmgw_rate_limit() RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('default', coalesce(v -> 'default', 'null'),
                              'groups', coalesce(v -> 'groups', '{}'))
      FROM (SELECT coalesce(llmgw_option('rate_limit'), '{}') AS v) AS o
$$;

CREATE FUNCTION llmgw_api_rate_limit(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_default jsonb := 'null';
    v_groups  jsonb := '{}';
    r         record;
BEGIN
    IF p_method = 'GET' THEN
        RETURN llmgw_rate_limit();
    END IF;

    IF coalesce(b -> 'default', 'null') <> 'null' THEN
        v_default := llmgw_v_limit(b -> 'default', 'rate_limit.default');
    END IF;
    IF coalesce(b -> 'groups', 'null') <> 'null' THEN
        IF jsonb_typeof(b -> 'groups') <> 'object' THEN
            PERFORM llmgw_bad('rate_limit.groups: must be an object of group name to limit');
        END IF;
        FOR r IN SELECT key, value FROM jsonb_each(b -> 'groups') ORDER BY key LOOP
            IF btrim(r.key) = '' THEN
                PERFORM llmgw_bad('rate_limit.groups: group names must be non-empty');
            END IF;
            IF r.value <> 'null' THEN
                v_groups := v_groups || jsonb_build_object(r.key,
                    llmgw_v_limit(r.value, 'rate_limit.groups.' || r.key));
            END IF;
        END LOOP;
    END IF;

    PERFORM llmgw_option_lock('rate_limit', '{}');
    PERFORM llmgw_option_set('rate_limit',
        jsonb_build_object('default', v_default, 'groups', v_groups));
    PERFORM llmgw_bump('config', 0);
    RETURN llmgw_rate_limit();
END $$;


-- ======================================================================
-- /log
-- ======================================================================

CREATE FUNCTION llmgw_api_log(q jsonb) RETURNS jsonb
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
    IF v_type IS NOT NULL AND v_type NOT IN ('consume', 'refund', 'error', 'reserve') THEN
        PERFORM llmgw_bad('type: must be one of consume, refund, error, reserve');
    END IF;

    -- EXECUTE plans with the actual values, so absent filters fold away and
    -- the (x, created_at) indexes serve the present ones.  "to" is inclusive
    -- of its whole second.
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
-- The admin API dispatcher
-- ======================================================================

CREATE FUNCTION llmgw_api(method text, path text, query text, body text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_method text := upper(coalesce(method, ''));
    v_path   text := regexp_replace(coalesce(path, ''), '(.)/+$', '\1');
    v_m      text[];
    v_res    text;
    v_idtxt  text;
    v_id     bigint;
    v_allow  text[];
    v_q      jsonb;
    v_b      jsonb;
    v_out    jsonb;
    v_state  text;
    v_msg    text;
    v_hint   text;
    v_detail text;
BEGIN
    -- Everything inside runs in a subtransaction: a user error undoes the
    -- partial work (and its bump/notify) and becomes an answer.
    BEGIN
        v_m := regexp_match(v_path, '^/(user|token|channel|pricing|group|rate_limit|log)(?:/([^/]+))?$');
        IF v_m IS NULL OR (v_m[2] IS NOT NULL AND v_m[1] NOT IN ('user', 'token', 'channel')) THEN
            PERFORM llmgw_fail(404, 'not_found', 'unknown admin path ' || coalesce(path, ''));
        END IF;
        v_res := v_m[1];
        v_idtxt := v_m[2];

        IF v_idtxt IS NOT NULL THEN
            IF v_idtxt !~ '^[0-9]{1,18}$' OR v_idtxt::bigint = 0 THEN
                PERFORM llmgw_fail(404, 'not_found', format('%s %s not found', v_res, v_idtxt));
            END IF;
            v_id := v_idtxt::bigint;
            v_allow := ARRAY['GET', 'PATCH', 'DELETE'];
        ELSIF v_res IN ('user', 'token', 'channel') THEN
            v_allow := ARRAY['GET', 'POST'];
        ELSIF v_res = 'log' THEN
            v_allow := ARRAY['GET'];
        ELSE
            v_allow := ARRAY['GET', 'PUT'];
        END IF;

        IF NOT v_method = ANY (v_allow) THEN
            RETURN jsonb_build_object(
                'status', 405, 'code', 'method_not_allowed',
                'message', format('method %s is not allowed on %s (allowed: %s)',
                                  v_method, v_path, array_to_string(v_allow, ', ')),
                'allow', array_to_string(v_allow, ', '));
        END IF;

        IF v_method IN ('POST', 'PUT', 'PATCH') THEN
            BEGIN
                v_b := body::jsonb;
            EXCEPTION WHEN OTHERS THEN
                PERFORM llmgw_fail(400, 'invalid_json', 'invalid JSON request body');
            END;
            IF jsonb_typeof(v_b) IS DISTINCT FROM 'object' THEN
                PERFORM llmgw_bad('request body must be a JSON object');
            END IF;
        ELSE
            v_b := '{}';
        END IF;
        v_q := llmgw_query_parse(query);

        v_out := CASE v_res
            WHEN 'user'       THEN llmgw_api_user(v_method, v_id, v_q, v_b)
            WHEN 'token'      THEN llmgw_api_token(v_method, v_id, v_q, v_b)
            WHEN 'channel'    THEN llmgw_api_channel(v_method, v_id, v_q, v_b)
            WHEN 'pricing'    THEN llmgw_api_pricing(v_method, v_b)
            WHEN 'group'      THEN llmgw_api_group(v_method, v_b)
            WHEN 'rate_limit' THEN llmgw_api_rate_limit(v_method, v_b)
            WHEN 'log'        THEN llmgw_api_log(v_q)
        END;
        RETURN jsonb_build_object('status', 200, 'body', v_out);
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state  = RETURNED_SQLSTATE,
                                v_msg    = MESSAGE_TEXT,
                                v_hint   = PG_EXCEPTION_HINT,
                                v_detail = PG_EXCEPTION_DETAIL;
        IF v_state ~ '^LG[0-9]{3}$' THEN
            RETURN jsonb_build_object('status', substr(v_state, 3)::int,
                                      'message', v_msg, 'code', v_hint);
        ELSIF v_state = '23505' THEN
            -- Lost a race with a concurrent insert of the same username.
            RETURN jsonb_build_object('status', 400, 'code', 'conflict',
                                      'message', coalesce(nullif(v_detail, ''), v_msg));
        END IF;
        -- A bug or an outage, not a user error: log it and answer 500.
        RAISE WARNING 'llmgw_api % %: % (%)', v_method, v_path, v_msg, v_state;
        RETURN jsonb_build_object('status', 500, 'code', 'internal_error',
                                  'message', 'internal error: ' || v_msg);
    END;
END $$;


-- ======================================================================
-- Gateway-side functions
-- ======================================================================

-- Everything a gateway needs to route and check requests, read in one
-- statement so it is one consistent snapshot with its revision.
CREATE FUNCTION llmgw_snapshot() RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'revision', (SELECT rev FROM config_revision WHERE id = 1),
        'channels', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'id', c.id, 'name', c.name, 'type', c.type,
                       'base_url', c.base_url, 'key', c.key,
                       'models', c.models, 'groups', c.groups,
                       'priority', c.priority, 'weight', c.weight,
                       'model_mapping', c.model_mapping,
                       'settings', c.settings) ORDER BY c.id)
              FROM channels AS c
             WHERE c.deleted_at IS NULL AND c.status = 'enabled'), '[]'),
        'pricing', coalesce(llmgw_option('pricing'), '{}'),
        'groups', llmgw_groups(),
        'rate_limit', llmgw_rate_limit(),
        'admin_hashes', coalesce((SELECT jsonb_agg(hash ORDER BY hash)
                                    FROM admin_tokens), '[]'))
$$;

CREATE FUNCTION llmgw_token_lookup(key_hash text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'id', t.id, 'user_id', t.user_id, 'name', t.name, 'status', t.status,
        'expired_time', t.expired_time, 'remain_quota', t.remain_quota,
        'used_quota', t.used_quota, 'unlimited_quota', t.unlimited_quota,
        'models', t.models, 'allow_ips', t.allow_ips, 'group', t."group",
        'user', jsonb_build_object('id', u.id, 'status', u.status,
                                   'quota', u.quota, 'used_quota', u.used_quota,
                                   'group', u."group"))
      FROM tokens AS t
      JOIN users AS u ON u.id = t.user_id
     WHERE t.key_hash = $1
       AND t.deleted_at IS NULL
       AND u.deleted_at IS NULL
$$;

-- Writes ledger rows and applies their balances, once per (request_id, type).
CREATE FUNCTION llmgw_flush(rows jsonb) RETURNS jsonb
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
        -- Lock in id order: concurrent flushes touching the same tokens and
        -- users queue up instead of deadlocking.
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

-- Registers an admin key hash (sha256 hex of the key without "sk-").  A new
-- hash bumps the revision so running gateways accept it at once.
CREATE FUNCTION llmgw_admin_token_set(hash text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF $1 IS NULL OR lower($1) !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'llmgw_admin_token_set: expected a sha256 hex digest';
    END IF;
    INSERT INTO admin_tokens (hash) VALUES (lower($1)) ON CONFLICT DO NOTHING;
    IF FOUND THEN
        PERFORM llmgw_bump('config', 0);
    END IF;
END $$;
