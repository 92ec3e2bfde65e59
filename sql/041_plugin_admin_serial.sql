-- Plugin changes are made one at a time, across every node of a database.
--
-- Whether an upload, an enable or an activation clashes with another
-- enabled plugin (llmgw_plugin_conflict, 004 and 016), and whether an
-- upload's version is already stored with another source, is read from
-- the other plugins' rows, which the call does not lock.  Two calls at
-- once (on one node or on two) each saw the other's plugin as it was
-- before, and both were stored: two enabled plugins serving one route, or
-- an upload answered with a sha the database no longer held.  Every call
-- that changes a plugin now first takes one transaction-scoped advisory
-- lock, so the second call reads the plugins after the first committed,
-- and is refused with 409 as if it had come later.  Reads take no lock.
--
-- ?force in the query is read as strictly as "force" in the body: 1, true,
-- 0 or false (the gateway checks it for the upload and the marketplace
-- install it answers itself); "?force=yes" was taken as false.


-- Held until the calling transaction ends.  Any fixed 64-bit number (one
-- other than migrate.sh's); it names this lock across the whole server.
CREATE FUNCTION llmgw_plugin_lock() RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(7300426610151241)
$$;


ALTER FUNCTION llmgw_plugin_upload_body(jsonb) RENAME TO llmgw_plugin_upload_store;

CREATE FUNCTION llmgw_plugin_upload_body(p jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM llmgw_plugin_lock();
    -- a new statement: it sees what the call before this one committed
    RETURN llmgw_plugin_upload_store(p);
END $$;


ALTER FUNCTION llmgw_api_plugin(text, text, jsonb, jsonb)
    RENAME TO llmgw_api_plugin_unlocked;

CREATE FUNCTION llmgw_api_plugin(p_method text, p_path text, q jsonb, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF q ? 'force'
       AND 'force' = ANY (coalesce(llmgw_query_known(p_method, p_path), '{}'))
       AND coalesce(q ->> 'force', '') NOT IN ('1', 'true', '0', 'false')
    THEN
        PERFORM llmgw_bad('force: must be true or false (1 or 0)');
    END IF;

    IF p_method <> 'GET' THEN
        PERFORM llmgw_plugin_lock();
    END IF;

    RETURN llmgw_api_plugin_unlocked(p_method, p_path, q, b);
END $$;
