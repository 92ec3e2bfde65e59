-- Native routes of two plugins conflict when one request can match both,
-- not only when their shapes are equal: "POST /:x/submit" takes requests
-- of "POST /zz-a/submit".  Two routes overlap when they have the same
-- method and as many segments, and at each position the segments are equal
-- or one of them is a parameter.  Segments are counted as the gateway
-- matches requests (src/task.cpp): empty ones (a trailing or a doubled
-- slash) do not count.  An exact-shape conflict keeps its message.

-- The segments of a route path; a parameter (":id", "{id}") is NULL.
CREATE FUNCTION llmgw_route_segments(p_path text) RETURNS text[]
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(array_agg(CASE WHEN s ~ '^(:.+|\{.+\})$' THEN NULL ELSE s END
                              ORDER BY n), '{}')
      FROM unnest(string_to_array(coalesce(p_path, ''), '/'))
           WITH ORDINALITY AS u(s, n)
     WHERE s <> ''
$$;


-- Whether one request can match both routes.
CREATE FUNCTION llmgw_routes_overlap(a jsonb, b jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT upper(coalesce(a ->> 'method', 'GET'))
               = upper(coalesce(b ->> 'method', 'GET'))
       AND cardinality(x) = cardinality(y)
       AND NOT EXISTS (
               SELECT 1 FROM generate_subscripts(x, 1) AS i
                WHERE x[i] IS NOT NULL AND y[i] IS NOT NULL AND x[i] <> y[i])
      FROM llmgw_route_segments(a ->> 'path') AS x,
           llmgw_route_segments(b ->> 'path') AS y
$$;


-- What 004 finds first (a shared channel type, an equal route shape, an
-- unrestricted host protocol bound twice: their messages stay), then the
-- first overlapping route, other plugins read in key order so that the
-- message names the same one every time.
ALTER FUNCTION llmgw_plugin_conflict(text, jsonb)
    RENAME TO llmgw_plugin_conflict_shape;

CREATE FUNCTION llmgw_plugin_conflict(p_key text, p_manifest jsonb)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    v text := llmgw_plugin_conflict_shape(p_key, p_manifest);
BEGIN
    IF v IS NOT NULL THEN
        RETURN v;
    END IF;

    SELECT format('route %s %s overlaps route %s %s of plugin %s '
                  '(one request path can match both)',
                  upper(coalesce(r ->> 'method', 'GET')), r ->> 'path',
                  upper(coalesce(x ->> 'method', 'GET')), x ->> 'path', p.key)
      INTO v
      FROM task_plugins AS p
      JOIN task_plugin_versions AS pv
        ON pv.key = p.key AND pv.version = p.active_version,
           jsonb_array_elements(coalesce(p_manifest -> 'routes', '[]'))
           WITH ORDINALITY AS a(r, i),
           jsonb_array_elements(coalesce(pv.manifest -> 'routes', '[]'))
           WITH ORDINALITY AS b(x, j)
     WHERE p.enabled AND p.key <> p_key AND llmgw_routes_overlap(r, x)
     ORDER BY p.key, i, j
     LIMIT 1;

    RETURN v;
END $$;
