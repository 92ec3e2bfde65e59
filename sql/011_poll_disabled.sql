-- Disabling a channel or a task plugin stops new submits; the tasks a
-- vendor already accepted through it are still polled to their end (and
-- settled or refunded), so the snapshot also carries disabled channels and
-- the active versions of disabled plugins, for the poller only.  Deleted
-- ones are gone: their tasks fail and are refunded.

CREATE OR REPLACE FUNCTION llmgw_snapshot() RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT llmgw_snapshot_core() || (
        -- one pass over the plugins: enabled ones route, disabled ones poll
        SELECT jsonb_build_object(
                   'plugins', coalesce(jsonb_agg(x.o ORDER BY x.key)
                                       FILTER (WHERE x.enabled), '[]'),
                   'poll_plugins', coalesce(jsonb_agg(x.o ORDER BY x.key)
                                            FILTER (WHERE NOT x.enabled), '[]'))
          FROM (SELECT p.key, p.enabled,
                       jsonb_build_object('key', p.key, 'version', v.version,
                                          'sha', v.sha, 'manifest', v.manifest) AS o
                  FROM task_plugins AS p
                  JOIN task_plugin_versions AS v
                    ON v.key = p.key AND v.version = p.active_version) AS x
    ) || jsonb_build_object(
        'poll_channels', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'id', c.id, 'name', c.name, 'type', c.type,
                       'base_url', c.base_url, 'key', c.key,
                       'models', c.models, 'groups', c.groups,
                       'priority', c.priority, 'weight', c.weight,
                       'model_mapping', c.model_mapping,
                       'settings', c.settings) ORDER BY c.id)
              FROM channels AS c
             WHERE c.deleted_at IS NULL AND c.status <> 'enabled'), '[]'))
$$;
