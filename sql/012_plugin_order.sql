-- GET /api/plugin/task lists plugins in display order: a larger
-- meta.sortPriority first, then by key (the manifest validator made
-- sortPriority a signed 32-bit integer, 0 when absent).

ALTER FUNCTION llmgw_api_plugin(text, text, jsonb, jsonb)
    RENAME TO llmgw_api_plugin_base;

CREATE FUNCTION llmgw_api_plugin(p_method text, p_path text, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF p_method = 'GET' AND p_path ~ '^/plugin/task/?$' THEN
        RETURN jsonb_build_object('items', coalesce((
            SELECT jsonb_agg(llmgw_plugin_json(p.key)
                             ORDER BY coalesce((a.manifest ->> 'sortPriority')::int, 0)
                                      DESC, p.key)
              FROM task_plugins AS p
              LEFT JOIN task_plugin_versions AS a
                ON a.key = p.key AND a.version = p.active_version), '[]'));
    END IF;

    RETURN llmgw_api_plugin_base(p_method, p_path, q, b);
END $$;
