-- The plugin admin API follows the contract of the rest of the admin API:
--
-- An upload takes force from the query as PATCH, activate and DELETE do
-- (?force=1 or ?force=true, llmgw_api_plugin_base in 004): the gateway
-- passes the request's query string as "query" (src/plugin.cpp).
--
-- GET /plugin/task is a list like /user and /token: page and page_size
-- (llmgw_q_page), answered as {items, total, page, page_size}, the items in
-- display order (012).

ALTER FUNCTION llmgw_plugin_upload(jsonb) RENAME TO llmgw_plugin_upload_body;

CREATE FUNCTION llmgw_plugin_upload(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_q     jsonb;
    v_state text;
    v_msg   text;
    v_hint  text;
BEGIN
    BEGIN
        v_q := llmgw_query_parse(p ->> 'query');
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

    IF coalesce(v_q ->> 'force', '') IN ('1', 'true') THEN
        p := p || '{"force": true}';
    END IF;

    RETURN llmgw_plugin_upload_body(p - 'query');
END $$;


CREATE OR REPLACE FUNCTION llmgw_api_plugin(p_method text, p_path text, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_m     text[];
    v_allow text[];
    pg      record;
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
        SELECT * INTO pg FROM llmgw_q_page(q);
        RETURN jsonb_build_object(
            'items', coalesce((
                SELECT jsonb_agg(llmgw_plugin_json(x.key) ORDER BY x.prio DESC, x.key)
                  FROM (SELECT p.key,
                               coalesce((a.manifest ->> 'sortPriority')::int, 0) AS prio
                          FROM task_plugins AS p
                          LEFT JOIN task_plugin_versions AS a
                            ON a.key = p.key AND a.version = p.active_version
                         ORDER BY prio DESC, p.key
                         LIMIT pg.page_size OFFSET pg.skip) AS x), '[]'),
            'total', (SELECT count(*) FROM task_plugins),
            'page', pg.page, 'page_size', pg.page_size);
    END IF;

    RETURN llmgw_api_plugin_base(p_method, p_path, q, b);
END $$;
