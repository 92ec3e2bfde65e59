-- wrk script for bench/hooks.sh: the same POST to every target, so the
-- load generator does the same work for each -- a JSON body read once from
-- $BENCH_BODY_FILE and the root token in Authorization.  The target is the
-- URL's path:
--   /api/plugin/task/dryrun  {"key": <the benchmark plugin>, ...}: runs the
--                            hook, nginx -> helper -> nginx
--   /api/plugin/task/dryrun  {"key": <no such plugin>, ...}: the same admin
--                            path (root token, body, key lookup) answered
--                            404 before the helper
--   /ping                    `return 200;` (the body is discarded)
-- The request is set once here (no request() function), so wrk builds it
-- once per thread.

local path = os.getenv("BENCH_BODY_FILE")
local f = assert(io.open(path, "r"), "cannot open " .. tostring(path))
local body = f:read("*a")
f:close()

wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. assert(os.getenv("BENCH_ROOT_TOKEN"), "BENCH_ROOT_TOKEN")
