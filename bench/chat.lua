-- wrk script for bench/chat.sh: POST /v1/chat/completions with a small
-- chat body, cycling over the keys in $BENCH_KEYS_FILE (one per line), so
-- the per-user rate limit (at most 100000 per minute each) never trips.
-- The same script drives bare nginx (which ignores the key) and the gateway,
-- so the load generator does the same work for both.

local reqs = {}
local n = 0
local i = 0

function init(args)
    local path = os.getenv("BENCH_KEYS_FILE")
    local model = os.getenv("BENCH_MODEL") or "bench-model"
    local body = '{"model":"' .. model ..
        '","messages":[{"role":"user","content":"hi"}]}'
    local f = assert(io.open(path, "r"), "cannot open " .. tostring(path))
    for line in f:lines() do
        if #line > 0 then
            reqs[#reqs + 1] = wrk.format("POST", "/v1/chat/completions", {
                ["Content-Type"] = "application/json",
                ["Authorization"] = "Bearer " .. line,
            }, body)
        end
    end
    f:close()
    n = #reqs
    assert(n > 0, "no keys in " .. path)
    -- threads start at different keys
    i = (tonumber(tostring({}):match("0x(%x+)"), 16) or 0) % n
end

function request()
    i = i % n + 1
    return reqs[i]
end
