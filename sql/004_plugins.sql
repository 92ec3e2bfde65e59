-- Task plugins: their versions (source and the manifest v8_host compiled
-- from it), which version is active, and the admin API under
-- /api/plugin/task.  Validation of a source happens in v8_host before
-- llmgw_plugin_upload() is called; here live storage, versions, conflicts
-- and publication (a bump makes every node reload its snapshot, whose
-- "plugins" list is the generation a request uses from start to end).

-- A published plugin change is a notice of its own kind.
CREATE OR REPLACE FUNCTION llmgw_bump(kind text, id bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE v_rev bigint;
BEGIN
    IF kind IS NULL OR kind NOT IN ('user', 'token', 'channel', 'config',
                                    'plugin') THEN
        RAISE EXCEPTION 'llmgw_bump: unknown kind %', kind;
    END IF;
    UPDATE config_revision SET rev = rev + 1 WHERE config_revision.id = 1
        RETURNING rev INTO v_rev;
    -- Delivered at commit, so listeners never see a rolled-back change.
    PERFORM pg_notify('llmgw_config',
        json_build_object('rev', v_rev, 'kind', kind, 'id', llmgw_bump.id)::text);
    RETURN v_rev;
END $$;


CREATE TABLE task_plugins (
    key             text PRIMARY KEY,
    enabled         boolean NOT NULL DEFAULT true,
    active_version  text,
    remark          text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE task_plugin_versions (
    key         text NOT NULL REFERENCES task_plugins (key) ON DELETE CASCADE,
    version     text NOT NULL,
    sha         text NOT NULL,
    source      text NOT NULL,
    manifest    jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, version)
);

CREATE INDEX task_plugin_versions_sha ON task_plugin_versions (sha);


-- The route shape two plugins must not share: the method and the path with
-- every parameter segment (":id", "{id}") made one placeholder.
CREATE FUNCTION llmgw_route_shape(p_route jsonb) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT upper(coalesce(p_route ->> 'method', 'GET')) || ' ' ||
           regexp_replace(regexp_replace(coalesce(p_route ->> 'path', ''),
                                         '/(:[^/]+|\{[^/]+\})', '/:', 'g'),
                          '/+$', '')
$$;


-- What the manifest claims that another enabled plugin already holds, or
-- NULL: a legacy channel type, a native route, or an unrestricted host
-- protocol binding (plugins may share models under one protocol).
CREATE FUNCTION llmgw_plugin_conflict(p_key text, p_manifest jsonb)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    o record;
    v text;
BEGIN
    FOR o IN
        SELECT p.key, v.manifest
          FROM task_plugins AS p
          JOIN task_plugin_versions AS v
            ON v.key = p.key AND v.version = p.active_version
         WHERE p.enabled AND p.key <> p_key
    LOOP
        SELECT t INTO v
          FROM jsonb_array_elements_text(coalesce(p_manifest -> 'channelTypes', '[]')) AS t
         WHERE t IN (SELECT jsonb_array_elements_text(coalesce(o.manifest -> 'channelTypes', '[]')))
         LIMIT 1;
        IF v IS NOT NULL THEN
            RETURN format('channel type %s is already adapted by plugin %s', v, o.key);
        END IF;

        SELECT llmgw_route_shape(r) INTO v
          FROM jsonb_array_elements(coalesce(p_manifest -> 'routes', '[]')) AS r
         WHERE llmgw_route_shape(r) IN (
                 SELECT llmgw_route_shape(x)
                   FROM jsonb_array_elements(coalesce(o.manifest -> 'routes', '[]')) AS x)
         LIMIT 1;
        IF v IS NOT NULL THEN
            RETURN format('route %s is already served by plugin %s', v, o.key);
        END IF;

        SELECT c ->> 'name' INTO v
          FROM jsonb_array_elements(coalesce(p_manifest -> 'protocols', '[]')) AS c
         WHERE coalesce(jsonb_array_length(c -> 'models'), 0) = 0
           AND c ->> 'name' IN (
                 SELECT x ->> 'name'
                   FROM jsonb_array_elements(coalesce(o.manifest -> 'protocols', '[]')) AS x
                  WHERE coalesce(jsonb_array_length(x -> 'models'), 0) = 0)
         LIMIT 1;
        IF v IS NOT NULL THEN
            RETURN format('host protocol %s is already bound by plugin %s', v, o.key);
        END IF;
    END LOOP;
    RETURN NULL;
END $$;


CREATE FUNCTION llmgw_plugin_json(p_key text) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'key', p.key,
        'name', coalesce(a.manifest ->> 'name', p.key),
        'enabled', p.enabled,
        'active_version', p.active_version,
        'remark', p.remark,
        'manifest', a.manifest,
        'created_at', llmgw_epoch(p.created_at),
        'updated_at', llmgw_epoch(p.updated_at),
        'versions', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'version', v.version, 'sha', v.sha,
                       'created_at', llmgw_epoch(v.created_at))
                       ORDER BY v.created_at, v.version)
              FROM task_plugin_versions AS v WHERE v.key = p.key), '[]'))
      FROM task_plugins AS p
      LEFT JOIN task_plugin_versions AS a
        ON a.key = p.key AND a.version = p.active_version
     WHERE p.key = p_key
$$;


-- Stores a validated version ({manifest, source, sha, remark, enabled,
-- force}); an enabled upload becomes the active version at once.
CREATE FUNCTION llmgw_plugin_upload(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_key      text := p -> 'manifest' ->> 'key';
    v_version  text := p -> 'manifest' ->> 'version';
    v_enabled  boolean := coalesce((p ->> 'enabled')::boolean, true);
    v_force    boolean := coalesce((p ->> 'force')::boolean, false);
    v_old      text;
    v_conflict text;
    v_state    text;
    v_msg      text;
    v_hint     text;
BEGIN
    BEGIN
        IF v_key IS NULL OR v_version IS NULL THEN
            PERFORM llmgw_bad('the manifest has no key or version');
        END IF;

        SELECT sha INTO v_old FROM task_plugin_versions
         WHERE key = v_key AND version = v_version;
        IF v_old IS NOT NULL AND v_old <> p ->> 'sha' AND NOT v_force THEN
            PERFORM llmgw_fail(409, 'conflict', format(
                'plugin %s version %s is already stored with another source; '
                'raise the version, or upload with force', v_key, v_version));
        END IF;

        IF v_enabled AND NOT v_force THEN
            v_conflict := llmgw_plugin_conflict(v_key, p -> 'manifest');
            IF v_conflict IS NOT NULL THEN
                PERFORM llmgw_fail(409, 'conflict', v_conflict
                    || '; upload with force, or with enabled false');
            END IF;
        END IF;

        INSERT INTO task_plugins (key, enabled, active_version, remark)
        VALUES (v_key, v_enabled, v_version, coalesce(p ->> 'remark', ''))
        ON CONFLICT (key) DO UPDATE
           SET enabled = CASE WHEN v_enabled THEN true ELSE task_plugins.enabled END,
               active_version = CASE WHEN v_enabled THEN v_version
                                     ELSE coalesce(task_plugins.active_version, v_version) END,
               remark = CASE WHEN p ? 'remark' THEN p ->> 'remark' ELSE task_plugins.remark END,
               updated_at = now();

        INSERT INTO task_plugin_versions (key, version, sha, source, manifest)
        VALUES (v_key, v_version, p ->> 'sha', p ->> 'source', p -> 'manifest')
        ON CONFLICT (key, version) DO UPDATE
           SET sha = EXCLUDED.sha, source = EXCLUDED.source,
               manifest = EXCLUDED.manifest, created_at = now();

        PERFORM llmgw_bump('plugin', 0);

        RETURN jsonb_build_object('status', 200,
            'body', llmgw_plugin_json(v_key) || jsonb_build_object('version', v_version));
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE,
                                v_msg = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
        IF v_state ~ '^LG[0-9]{3}$' THEN
            RETURN jsonb_build_object('status', substr(v_state, 3)::int,
                                      'message', v_msg, 'code', v_hint);
        END IF;
        RAISE WARNING 'llmgw_plugin_upload: % (%)', v_msg, v_state;
        RETURN jsonb_build_object('status', 500, 'code', 'internal_error',
                                  'message', 'internal error: ' || v_msg);
    END;
END $$;


-- The source of a compiled plugin, for v8_host when it lost its copy.
CREATE FUNCTION llmgw_plugin_source(p_sha text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT source FROM task_plugin_versions WHERE sha = p_sha LIMIT 1
$$;


-- /plugin/task[/{key}[/activate]]: list, one, enable/disable, activate,
-- delete.  Upload, dry run and runtime status go through v8_host and are
-- answered by the gateway itself.
CREATE FUNCTION llmgw_api_plugin(p_method text, p_path text, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_m        text[];
    v_key      text;
    v_p        task_plugins;
    v_version  text;
    v_manifest jsonb;
    v_conflict text;
    v_force    boolean;
    v_busy     bigint;
BEGIN
    v_m := regexp_match(p_path, '^/plugin/task(?:/([^/]+)(?:/(activate))?)?$');
    IF v_m IS NULL THEN
        PERFORM llmgw_fail(404, 'not_found', 'unknown admin path /api' || p_path);
    END IF;
    v_key := v_m[1];

    IF v_key IS NULL THEN
        IF p_method <> 'GET' THEN
            PERFORM llmgw_fail(405, 'method_not_allowed',
                               format('method %s is not allowed on %s', p_method, p_path));
        END IF;
        RETURN jsonb_build_object('items', coalesce((
            SELECT jsonb_agg(llmgw_plugin_json(key) ORDER BY key) FROM task_plugins), '[]'));
    END IF;

    SELECT * INTO v_p FROM task_plugins WHERE key = v_key FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM llmgw_fail(404, 'not_found', format('plugin %s not found', v_key));
    END IF;

    v_force := coalesce((b ->> 'force')::boolean, false)
               OR coalesce(q ->> 'force', '') IN ('1', 'true');

    IF v_m[2] = 'activate' THEN
        IF p_method <> 'POST' THEN
            PERFORM llmgw_fail(405, 'method_not_allowed',
                               format('method %s is not allowed on %s', p_method, p_path));
        END IF;
        v_version := b ->> 'version';
        SELECT manifest INTO v_manifest FROM task_plugin_versions
         WHERE key = v_key AND version = v_version;
        IF v_manifest IS NULL THEN
            PERFORM llmgw_bad(format('version: plugin %s has no version %s',
                                     v_key, coalesce(v_version, 'null')));
        END IF;
        IF v_p.enabled AND NOT v_force THEN
            v_conflict := llmgw_plugin_conflict(v_key, v_manifest);
            IF v_conflict IS NOT NULL THEN
                PERFORM llmgw_fail(409, 'conflict', v_conflict || '; activate with force');
            END IF;
        END IF;
        UPDATE task_plugins SET active_version = v_version, updated_at = now()
         WHERE key = v_key;
        PERFORM llmgw_bump('plugin', 0);
        RETURN llmgw_plugin_json(v_key);
    END IF;

    IF p_method = 'GET' THEN
        RETURN llmgw_plugin_json(v_key);

    ELSIF p_method = 'PATCH' THEN
        IF b ? 'enabled' AND jsonb_typeof(b -> 'enabled') <> 'boolean' THEN
            PERFORM llmgw_bad('enabled: must be true or false');
        END IF;
        IF coalesce((b ->> 'enabled')::boolean, false) AND NOT v_p.enabled
           AND NOT v_force
        THEN
            SELECT manifest INTO v_manifest FROM task_plugin_versions
             WHERE key = v_key AND version = v_p.active_version;
            v_conflict := llmgw_plugin_conflict(v_key, v_manifest);
            IF v_conflict IS NOT NULL THEN
                PERFORM llmgw_fail(409, 'conflict', v_conflict || '; enable with force');
            END IF;
        END IF;
        UPDATE task_plugins
           SET enabled = coalesce((b ->> 'enabled')::boolean, enabled),
               remark = coalesce(b ->> 'remark', remark),
               updated_at = now()
         WHERE key = v_key;
        PERFORM llmgw_bump('plugin', 0);
        RETURN llmgw_plugin_json(v_key);

    ELSIF p_method = 'DELETE' THEN
        -- tasks arrive with the task engine; until then nothing uses a plugin
        IF to_regclass('tasks') IS NOT NULL AND NOT v_force THEN
            EXECUTE 'SELECT count(*) FROM tasks WHERE plugin_key = $1
                      AND status NOT IN (''SUCCESS'', ''FAILURE'')'
               INTO v_busy USING v_key;
            IF v_busy > 0 THEN
                PERFORM llmgw_fail(409, 'conflict', format(
                    'plugin %s has %s unfinished tasks; delete with force',
                    v_key, v_busy));
            END IF;
        END IF;
        DELETE FROM task_plugins WHERE key = v_key;
        PERFORM llmgw_bump('plugin', 0);
        RETURN jsonb_build_object('key', v_key, 'deleted', true);
    END IF;

    PERFORM llmgw_fail(405, 'method_not_allowed',
                       format('method %s is not allowed on %s', p_method, p_path));
    RETURN NULL;
END $$;


-- The dispatcher learns /plugin/task.
ALTER FUNCTION llmgw_api(text, text, text, text) RENAME TO llmgw_api_core;

CREATE FUNCTION llmgw_api(method text, path text, query text, body text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_method text := upper(coalesce(method, ''));
    v_path   text := regexp_replace(coalesce(path, ''), '(.)/+$', '\1');
    v_b      jsonb := '{}';
    v_state  text;
    v_msg    text;
    v_hint   text;
BEGIN
    IF v_path !~ '^/plugin/task' THEN
        RETURN llmgw_api_core(method, path, query, body);
    END IF;

    BEGIN
        IF v_method IN ('POST', 'PUT', 'PATCH') AND coalesce(body, '') <> '' THEN
            BEGIN
                v_b := body::jsonb;
            EXCEPTION WHEN OTHERS THEN
                PERFORM llmgw_fail(400, 'invalid_json', 'invalid JSON request body');
            END;
            IF jsonb_typeof(v_b) IS DISTINCT FROM 'object' THEN
                PERFORM llmgw_bad('request body must be a JSON object');
            END IF;
        END IF;
        RETURN jsonb_build_object('status', 200, 'body',
            llmgw_api_plugin(v_method, v_path, llmgw_query_parse(query), v_b));
    EXCEPTION WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE,
                                v_msg = MESSAGE_TEXT, v_hint = PG_EXCEPTION_HINT;
        IF v_state ~ '^LG[0-9]{3}$' THEN
            RETURN jsonb_build_object('status', substr(v_state, 3)::int,
                                      'message', v_msg, 'code', v_hint);
        END IF;
        RAISE WARNING 'llmgw_api % %: % (%)', v_method, v_path, v_msg, v_state;
        RETURN jsonb_build_object('status', 500, 'code', 'internal_error',
                                  'message', 'internal error: ' || v_msg);
    END;
END $$;


-- The snapshot carries the published generation of plugins.
ALTER FUNCTION llmgw_snapshot() RENAME TO llmgw_snapshot_core;

CREATE FUNCTION llmgw_snapshot() RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT llmgw_snapshot_core() || jsonb_build_object(
        'plugins', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'key', p.key, 'version', v.version, 'sha', v.sha,
                       'manifest', v.manifest) ORDER BY p.key)
              FROM task_plugins AS p
              JOIN task_plugin_versions AS v
                ON v.key = p.key AND v.version = p.active_version
             WHERE p.enabled), '[]'))
$$;
