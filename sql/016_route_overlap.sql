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

    -- each path split once; method and segment count filter the pairs
    -- before their segments are compared
    WITH mine AS MATERIALIZED (
        SELECT i, r ->> 'path' AS path,
               upper(coalesce(r ->> 'method', 'GET')) AS method,
               llmgw_route_segments(r ->> 'path') AS seg
          FROM jsonb_array_elements(coalesce(p_manifest -> 'routes', '[]'))
               WITH ORDINALITY AS a(r, i)
    ), theirs AS MATERIALIZED (
        SELECT p.key, j, x ->> 'path' AS path,
               upper(coalesce(x ->> 'method', 'GET')) AS method,
               llmgw_route_segments(x ->> 'path') AS seg
          FROM task_plugins AS p
          JOIN task_plugin_versions AS pv
            ON pv.key = p.key AND pv.version = p.active_version,
               jsonb_array_elements(coalesce(pv.manifest -> 'routes', '[]'))
               WITH ORDINALITY AS b(x, j)
         WHERE p.enabled AND p.key <> p_key
    )
    SELECT format('route %s %s overlaps route %s %s of plugin %s '
                  '(one request path can match both)',
                  m.method, m.path, t.method, t.path, t.key)
      INTO v
      FROM mine AS m
      JOIN theirs AS t
        ON t.method = m.method
       AND cardinality(t.seg) = cardinality(m.seg)
       -- routes mostly begin with a literal of their own: most pairs end
       -- at the first segments, without looking at the rest
       AND coalesce(m.seg[1] = t.seg[1], true)
       AND coalesce(m.seg[2] = t.seg[2], true)
     WHERE NOT EXISTS (
               SELECT 1 FROM unnest(m.seg, t.seg) AS z(a, b) WHERE a <> b)
     ORDER BY t.key, m.i, t.j
     LIMIT 1;

    RETURN v;
END $$;
