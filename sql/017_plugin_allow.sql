-- A 405 under /api/plugin/task names the methods the path takes at the end
-- of its message, as the other 405s of the admin API do (" (allowed: GET,
-- POST)"); the gateway sends them in the Allow header (RFC 9110 15.5.6).
-- They include what the gateway answers before the database
-- (ngx_llmgw_admin_plugin): POST /plugin/task uploads, POST
-- /plugin/task/dryrun and /plugin/task/marketplace, which are also the
-- paths of plugins keyed "dryrun" and "marketplace".  As on /user/{id}, the
-- method is checked before the plugin is looked up, so the 405s of
-- llmgw_api_plugin_base() (004) are no longer reached.

CREATE OR REPLACE FUNCTION llmgw_api_plugin(p_method text, p_path text, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_m     text[];
    v_allow text[];
BEGIN
    v_m := regexp_match(p_path, '^/plugin/task(?:/([^/]+)(/activate)?)?$');

    IF v_m IS NOT NULL THEN
        v_allow := CASE
            WHEN v_m[1] IS NULL THEN ARRAY['GET', 'POST']
            WHEN v_m[2] IS NOT NULL THEN ARRAY['POST']
            WHEN v_m[1] IN ('dryrun', 'marketplace')
                THEN ARRAY['GET', 'POST', 'PATCH', 'DELETE']
            ELSE ARRAY['GET', 'PATCH', 'DELETE']
        END;

        -- a POST the gateway answers itself arrives here only on a path
        -- it did not take as sent (one with a trailing slash)
        IF NOT p_method = ANY (v_allow)
           OR (p_method = 'POST' AND v_m[2] IS NULL)
        THEN
            PERFORM llmgw_fail(405, 'method_not_allowed',
                               format('method %s is not allowed on %s (allowed: %s)',
                                      p_method, p_path,
                                      array_to_string(v_allow, ', ')));
        END IF;
    END IF;

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
