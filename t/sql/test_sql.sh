#!/usr/bin/env bash
# Exercises sql/migrate.sh and every function of sql/001_core.sql and of
# the later migrations (tasks: sql/005_tasks.sql) against a scratch database.
#
#   t/sql/test_sql.sh "<libpq conninfo>"
#
# Works on a fresh or an already migrated database: names carry a per-run
# suffix and counts are compared before/after.  Needs psql, jq, sha256sum.
# Exits non-zero when any assertion fails.

set -u

if [ $# -ne 1 ]; then
    echo "usage: $0 \"<libpq conninfo>\"" >&2
    exit 2
fi
CONN=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
for tool in psql jq sha256sum; do
    command -v "$tool" >/dev/null || { echo "test_sql: $tool is required" >&2; exit 2; }
done

PASS=0
FAIL=0
RUN=$$_$RANDOM          # per-run suffix for unique names
ANS=

ok()   { PASS=$((PASS + 1)); }
bad()  { FAIL=$((FAIL + 1)); echo "FAIL: $*"; }

# Scalar SQL: prints the single value.
sql() {
    psql "$CONN" -X -At -q -v ON_ERROR_STOP=1 -c "$1"
}

# api METHOD PATH [QUERY [BODY]]: the answer of llmgw_api in $ANS.
api() {
    ANS=$(psql "$CONN" -X -At -q -v ON_ERROR_STOP=1 \
        -v m="$1" -v p="$2" -v q="${3:-}" -v b="${4:-}" -f - <<'EOF'
SELECT llmgw_api(:'m', :'p', :'q', :'b');
EOF
    ) || { bad "psql failed for $1 $2"; ANS='{}'; }
}

# expect DESCRIPTION JQ_FILTER: the filter must yield true on $ANS.
expect() {
    if jq -e "$2" >/dev/null 2>&1 <<<"$ANS"; then
        ok
    else
        bad "$1"
        echo "    filter: $2"
        echo "    answer: $ANS"
    fi
}

# expect_err DESCRIPTION STATUS CODE MESSAGE (exact message)
expect_err() {
    if jq -e --argjson s "$2" --arg c "$3" --arg m "$4" \
            '.status == $s and .code == $c and .message == $m' >/dev/null 2>&1 <<<"$ANS"; then
        ok
    else
        bad "$1"
        echo "    want: $2 $3 \"$4\""
        echo "    answer: $ANS"
    fi
}

# expect_eq DESCRIPTION ACTUAL WANTED
expect_eq() {
    if [ "$2" = "$3" ]; then ok; else bad "$1: got [$2], want [$3]"; fi
}

rev() { sql "SELECT rev FROM config_revision WHERE id = 1"; }


echo "== migrate"
# Two concurrent runs must not race (advisory lock), then a third is a no-op.
"$ROOT/sql/migrate.sh" "$CONN" >/tmp/llmgw_mig1.$$ 2>&1 &
p1=$!
"$ROOT/sql/migrate.sh" "$CONN" >/tmp/llmgw_mig2.$$ 2>&1 &
p2=$!
wait $p1; r1=$?
wait $p2; r2=$?
expect_eq "concurrent migrate 1 exit" "$r1" 0
expect_eq "concurrent migrate 2 exit" "$r2" 0
applied=$(cat /tmp/llmgw_mig1.$$ /tmp/llmgw_mig2.$$ | grep -c 'applying 001_core.sql')
[ "$applied" -le 1 ] && ok || bad "001_core.sql applied $applied times concurrently"
rm -f /tmp/llmgw_mig1.$$ /tmp/llmgw_mig2.$$
out=$("$ROOT/sql/migrate.sh" "$CONN" 2>&1); r=$?
expect_eq "second migrate exit" "$r" 0
case $out in
    *"001_core.sql already applied"*) ok ;;
    *) bad "second migrate is not a no-op: $out" ;;
esac
expect_eq "schema_migrations rows" "$(sql "SELECT count(*) FROM schema_migrations WHERE name = '001_core.sql'")" 1
if "$ROOT/sql/migrate.sh" "host=/nonexistent/socket dbname=x connect_timeout=2" >/dev/null 2>&1; then
    bad "migrate against a bad conninfo exits 0"
else
    ok
fi
if "$ROOT/sql/migrate.sh" >/dev/null 2>&1; then
    bad "migrate without arguments exits 0"
else
    ok
fi


echo "== llmgw_bump"
r0=$(rev)
expect_eq "bump returns the new rev" "$(sql "SELECT llmgw_bump('config', 0)")" $((r0 + 1))
expect_eq "bump stored" "$(rev)" $((r0 + 1))
notice=$(psql "$CONN" -X -At -q -c "LISTEN llmgw_config" -c "SELECT llmgw_bump('channel', 42)" 2>&1)
case $notice in
    *'"rev"'*$((r0 + 2))*'"kind"'*'"channel"'*'"id"'*42*) ok ;;
    *) bad "bump notification payload: $notice" ;;
esac
psql "$CONN" -X -At -q -c "SELECT llmgw_bump('bogus', 1)" >/dev/null 2>&1 \
    && bad "bump accepts an unknown kind" || ok


echo "== dispatcher"
api GET /xyz
expect_err "unknown path" 404 not_found "unknown admin path /xyz"
api GET /log/3
expect_err "log has no ids" 404 not_found "unknown admin path /log/3"
api DELETE /pricing
expect_err "wrong method" 405 method_not_allowed "method DELETE is not allowed on /api/pricing (allowed: GET, PUT)"
expect "405 carries allow" '.allow == "GET, PUT"'
api PUT /user
expect "PUT /user is 405" '.status == 405 and .allow == "GET, POST"'
api POST /user/1 '' '{}'
expect "POST /user/1 is 405" '.status == 405 and .allow == "GET, PATCH, DELETE"'
api POST /log
expect "POST /log is 405" '.status == 405'
api PUT /plugin/task
expect_err "PUT /plugin/task is 405" 405 method_not_allowed "method PUT is not allowed on /api/plugin/task (allowed: GET, POST)"
api POST /plugin/task/ '' '{}'
expect_err "POST /plugin/task/ is not the gateway's upload" 405 method_not_allowed "method POST is not allowed on /api/plugin/task (allowed: GET, POST)"
api PUT "/plugin/task/nope_$RUN" '' '{}'
expect_err "PUT /plugin/task/{key} is 405, known key or not" 405 method_not_allowed "method PUT is not allowed on /api/plugin/task/nope_$RUN (allowed: GET, PATCH, DELETE)"
api DELETE /plugin/task/dryrun
expect "DELETE /plugin/task/dryrun is the plugin's" '.status == 404 and .code == "not_found"'
api PUT /plugin/task/marketplace
expect_err "the gateway's POST counts on /plugin/task/marketplace" 405 method_not_allowed "method PUT is not allowed on /api/plugin/task/marketplace (allowed: GET, POST, PATCH, DELETE)"
api GET "/plugin/task/nope_$RUN/activate"
expect_err "GET /plugin/task/{key}/activate is 405" 405 method_not_allowed "method GET is not allowed on /api/plugin/task/nope_$RUN/activate (allowed: POST)"
api GET "/plugin/task/nope_$RUN"
expect_err "an unknown plugin is still 404" 404 not_found "plugin nope_$RUN not found"
for q in force=yes force= force force=TRUE; do
    api PATCH "/plugin/task/nope_$RUN" "$q" '{}'
    expect_err "?$q is refused, as a force that is not a boolean in a body" 400 invalid_request "force: must be true or false (1 or 0)"
done
api POST "/plugin/task/nope_$RUN/activate" 'force=maybe' '{"version":"1.0.0"}'
expect_err "activate reads ?force strictly" 400 invalid_request "force: must be true or false (1 or 0)"
api PATCH "/plugin/task/nope_$RUN" 'force=false' '{}'
expect_err "?force=false is read, then the plugin is looked up" 404 not_found "plugin nope_$RUN not found"
api POST /user '' 'not json'
expect_err "invalid JSON" 400 invalid_json "invalid JSON request body"
api POST /user '' ''
expect_err "empty body" 400 invalid_json "invalid JSON request body"
api PUT /pricing '' '{"a":'
expect_err "truncated JSON" 400 invalid_json "invalid JSON request body"
api POST /user '' '[1,2]'
expect_err "non-object body" 400 invalid_request "request body must be a JSON object"
api GET /user/abc
expect_err "non-numeric id" 404 not_found "user abc not found"
api GET /user/ 'page_size=1'
expect "trailing slash accepted" '.status == 200 and .body.page_size == 1'
api get /user
expect "method is case-insensitive" '.status == 200'


echo "== /user"
U1=alice_$RUN
api GET /user 'page_size=1000'
users_before=$(jq .body.total <<<"$ANS")
r0=$(rev)
api POST /user '' "{\"username\":\"$U1\",\"quota\":100000,\"group\":\"vip\",\"qouta\":1}"
expect_err "a misspelt field is refused, not dropped" 400 invalid_request "qouta: unknown field (known: username, quota, group, status)"
api POST /user '' "{\"username\":\"$U1\",\"quota\":100000,\"group\":\"vip\",\"used_quota\":0}"
expect_err "a read-only field is refused" 400 invalid_request "used_quota: is read-only"
api POST /user '' "{\"username\":\"$U1\",\"quota\":100000,\"group\":\"vip\"}"
expect "create user" ".status == 200 and .body.username == \"$U1\" and .body.quota == 100000 and .body.used_quota == 0 and .body.group == \"vip\" and .body.status == \"enabled\""
expect "user created_at is unix seconds" '(.body.created_at | type) == "number" and .body.created_at > 1600000000'
expect "user has exactly the documented fields" '(.body | keys) == ["created_at","group","id","quota","status","used_quota","username"]'
UID1=$(jq .body.id <<<"$ANS")
expect_eq "POST /user bumps" "$(rev)" $((r0 + 1))
api POST /user '' "{\"username\":\"b_$RUN\"}"
expect "user defaults" '.status == 200 and .body.quota == 0 and .body.group == "default" and .body.status == "enabled"'
UID2=$(jq .body.id <<<"$ANS")

r0=$(rev)
api POST /user '' "{\"username\":\"$U1\"}"
expect_err "duplicate username" 400 conflict "username $U1 already exists"
expect_eq "failed POST does not bump" "$(rev)" "$r0"
api POST /user '' '{}'
expect_err "username required" 400 invalid_request "username: is required"
api POST /user '' '{"username":""}'
expect_err "username empty" 400 invalid_request "username: must be a non-empty string"
api POST /user '' '{"username":5}'
expect_err "username type" 400 invalid_request "username: must be a string"
api POST /user '' "{\"username\":\"$(printf 'x%.0s' $(seq 65))\"}"
expect_err "username too long" 400 invalid_request "username: must be at most 64 characters"
api POST /user '' '{"username":"q1","quota":-1}'
expect_err "quota negative" 400 invalid_request "quota: must be an integer >= 0"
api POST /user '' '{"username":"q1","quota":1.5}'
expect_err "quota fractional" 400 invalid_request "quota: must be an integer >= 0"
api POST /user '' '{"username":"q1","quota":"10"}'
expect_err "quota string" 400 invalid_request "quota: must be an integer >= 0"
api POST /user '' '{"username":"q1","quota":1e30}'
expect_err "quota beyond bigint" 400 invalid_request "quota: must be an integer >= 0"
api POST /user '' '{"username":"q1","status":"on"}'
expect_err "status value" 400 invalid_request 'status: must be "enabled" or "disabled"'
api POST /user '' '{"username":"q1","group":1}'
expect_err "group type" 400 invalid_request "group: must be a string"
api POST /user '' '{"username":"q1","quota":null}'
expect_err "quota null" 400 invalid_request "quota: must be an integer >= 0"

api GET /user 'page_size=1000'
expect "list total grew by 2" ".status == 200 and .body.total == $((users_before + 2))"
expect "list is ordered by id" '[.body.items[].id] == ([.body.items[].id] | sort)'
api GET /user 'page=1&page_size=1'
expect "page_size honoured" '(.body.items | length) == 1 and .body.page == 1 and .body.page_size == 1'
api GET /user 'page=x'
expect_err "page not an integer" 400 invalid_request "page: must be an integer >= 1"
api GET /user 'page_size=0'
expect_err "page_size range" 400 invalid_request "page_size: must be an integer between 1 and 1000"
api GET /user 'page_size=1001'
expect "page_size above 1000" '.status == 400'
api GET /user 'page=99999&page_size=10'
expect "page past the end is empty" '.status == 200 and .body.items == []'

api GET "/user/$UID1"
expect "get user" ".status == 200 and .body.id == $UID1 and .body.username == \"$U1\""
r0=$(rev)
api PATCH "/user/$UID1" '' '{"quota":5000,"used_quota":7}'
expect_err "used_quota follows the ledger: read-only" 400 invalid_request "used_quota: is read-only"
api PATCH "/user/$UID1" '' '{"quota":5000,"status":"disabled","group":"default"}'
expect "patch user" '.status == 200 and .body.quota == 5000 and .body.status == "disabled" and .body.group == "default" and .body.used_quota == 0'
expect_eq "PATCH /user bumps" "$(rev)" $((r0 + 1))
api PATCH "/user/$UID1" '' "{\"username\":\"b_$RUN\"}"
expect_err "patch to a taken username" 400 conflict "username b_$RUN already exists"
api PATCH "/user/$UID1" '' "{\"username\":\"$U1\"}"
expect "patch to its own username" '.status == 200'
api PATCH "/user/$UID1" '' '{"quota":"x"}'
expect_err "patch validates" 400 invalid_request "quota: must be an integer >= 0"
api PATCH "/user/$UID1" '' '{"status":"enabled","quota":100000}'
expect "re-enable" '.status == 200 and .body.status == "enabled"'
api GET /user/999999999
expect_err "unknown user" 404 not_found "user 999999999 not found"
api PATCH /user/999999999 '' '{}'
expect_err "patch unknown user" 404 not_found "user 999999999 not found"


echo "== /token"
r0=$(rev)
api POST /token '' "{\"user_id\":$UID1,\"name\":\"main\",\"remain_quota\":50000,\"models\":[\"gpt-4o\",\"claude-3\"],\"allow_ips\":[\"10.0.0.0/8\",\"192.168.1.7\",\"::1\",\"2001:db8::/32\"],\"group\":\"vip\"}"
expect "create token" ".status == 200 and .body.user_id == $UID1 and .body.name == \"main\" and .body.remain_quota == 50000 and .body.used_quota == 0 and .body.unlimited_quota == false and .body.expired_time == -1 and .body.models == [\"gpt-4o\",\"claude-3\"] and (.body.allow_ips | length) == 4 and .body.group == \"vip\" and .body.status == \"enabled\""
expect "key format" '.body.key | test("^sk-[0-9a-f]{48}$")'
expect "key_prefix is the first 6 after sk-" '.body.key_prefix == .body.key[3:9]'
expect_eq "POST /token bumps" "$(rev)" $((r0 + 1))
KEY1=$(jq -r .body.key <<<"$ANS")
TID1=$(jq .body.id <<<"$ANS")
HASH1=$(printf '%s' "${KEY1#sk-}" | sha256sum | cut -d' ' -f1)
expect_eq "key_hash is sha256 of the key without sk-" \
    "$(sql "SELECT key_hash FROM tokens WHERE id = $TID1")" "$HASH1"

api POST /token '' "{\"user_id\":$UID1}"
expect "token defaults" '.status == 200 and .body.name == "" and .body.remain_quota == 0 and .body.unlimited_quota == false and .body.expired_time == -1 and .body.models == null and .body.allow_ips == null and .body.group == "" and .body.status == "enabled"'
TID2=$(jq .body.id <<<"$ANS")
KEY2=$(jq -r .body.key <<<"$ANS")
[ "$KEY1" != "$KEY2" ] && ok || bad "two tokens got the same key"
api POST /token '' "{\"user_id\":$UID1,\"unlimited_quota\":true,\"allow_ips\":[],\"models\":[],\"expired_time\":4102444800}"
expect "unlimited token, [] ips means any, [] models kept" '.status == 200 and .body.unlimited_quota == true and .body.allow_ips == null and .body.models == [] and .body.expired_time == 4102444800'
TID3=$(jq .body.id <<<"$ANS")
HASH3=$(printf '%s' "$(jq -r '.body.key[3:]' <<<"$ANS")" | sha256sum | cut -d' ' -f1)

api POST /token '' '{}'
expect_err "user_id required" 400 invalid_request "user_id: is required"
api POST /token '' '{"user_id":999999999}'
expect_err "user_id unknown" 400 invalid_request "user_id: user 999999999 does not exist"
api POST /token '' '{"user_id":"1"}'
expect_err "user_id type" 400 invalid_request "user_id: must be an integer >= 1"
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\"1.2.3.4\",\"300.1.1.1\"]}"
expect_err "bad ip" 400 invalid_request 'allow_ips[1]: "300.1.1.1" is not an IP address or CIDR'
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\"10.0.0.0/33\"]}"
expect_err "bad cidr" 400 invalid_request 'allow_ips[0]: "10.0.0.0/33" is not an IP address or CIDR'
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\"0127.0.0.1\"]}"
expect_err "ip with a leading zero" 400 invalid_request 'allow_ips[0]: "0127.0.0.1" is not an IP address or CIDR'
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\"10.0.0.01/32\"]}"
expect_err "last part with a leading zero" 400 invalid_request 'allow_ips[0]: "10.0.0.01/32" is not an IP address or CIDR'
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\"2001:0db8::0001\",\"10.0.0.0/8\",\"::ffff:10.0.0.1\"]}"
expect "v6 groups with leading zeros stay valid" '.status == 200'
api DELETE "/token/$(jq .body.id <<<"$ANS")"
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\" 1.2.3.4\"]}"
expect_err "ip with space" 400 invalid_request 'allow_ips[0]: " 1.2.3.4" is not an IP address or CIDR'
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[5]}"
expect_err "ip not a string" 400 invalid_request 'allow_ips[0]: must be a string'
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":\"1.2.3.4\"}"
expect_err "allow_ips not an array" 400 invalid_request 'allow_ips: must be an array of IP addresses or CIDRs, or null'
api POST /token '' "{\"user_id\":$UID1,\"models\":[\"a\\nb\"]}"
expect_err "key model name with LF" 400 invalid_request 'models: "a\nb" must not contain control characters'
api POST /token '' "{\"user_id\":$UID1,\"models\":\"gpt-4o\"}"
expect_err "models not an array" 400 invalid_request 'models: must be an array of strings'
api POST /token '' "{\"user_id\":$UID1,\"models\":[\"a\",\"\"]}"
expect_err "models empty entry" 400 invalid_request 'models[1]: must be a non-empty string'
api POST /token '' "{\"user_id\":$UID1,\"expired_time\":0}"
expect_err "expired_time 0" 400 invalid_request 'expired_time: must be -1 (never expires) or a positive unix time in seconds'
api POST /token '' "{\"user_id\":$UID1,\"expired_time\":-5}"
expect "expired_time -5" '.status == 400 and (.message | startswith("expired_time:"))'
api POST /token '' "{\"user_id\":$UID1,\"expired_time\":1795000000000}"
expect_err "expired_time in milliseconds" 400 invalid_request 'expired_time: must be -1 (never expires) or a positive unix time in seconds (this looks like milliseconds)'
for short in 10/8 10.0/16 1.2.3/24 ffff::1.2.3 10; do
    api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\"10.0.0.0/8\",\"$short\"]}"
    expect_err "short IPv4 form $short" 400 invalid_request "allow_ips[1]: \"$short\" is not an IP address or CIDR"
done
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\"::ffff:1.2.3.4/120\",\"0.0.0.0/0\",\"::\"]}"
expect "IPv4 inside IPv6, and every address" '.status == 200 and (.body.allow_ips | length) == 3'
api DELETE "/token/$(jq .body.id <<<"$ANS")"
api POST /token '' "{\"user_id\":$UID1,\"group\":\"a\\tb\"}"
expect_err "a key group with a control character" 400 invalid_request "group: group names must not contain control characters"
api POST /token '' "{\"user_id\":$UID1,\"unlimited_quota\":1}"
expect_err "unlimited_quota type" 400 invalid_request 'unlimited_quota: must be true or false'
api POST /token '' "{\"user_id\":$UID1,\"remain_quota\":-3}"
expect_err "remain_quota negative" 400 invalid_request 'remain_quota: must be an integer >= 0'
api POST /token '' "{\"user_id\":$UID1,\"status\":\"gone\"}"
expect_err "token status" 400 invalid_request 'status: must be "enabled" or "disabled"'

api GET "/token/$TID1"
expect "get token hides the key" ".status == 200 and .body.id == $TID1 and (.body | has(\"key\") | not) and .body.key_prefix == \"${KEY1:3:6}\""
grep -q "${KEY1#sk-}" <<<"$ANS" && bad "key text appears in GET /token/id" || ok
api GET /token "user_id=$UID1"
expect "list tokens by user" ".status == 200 and .body.total == 3 and ([.body.items[].user_id] | unique) == [$UID1] and ([.body.items[] | has(\"key\")] | any | not)"
grep -q "${KEY1#sk-}" <<<"$ANS" && bad "key text appears in GET /token" || ok
api GET /token "user_id=$UID2"
expect "no tokens for other user" '.status == 200 and .body.total == 0 and .body.items == []'
api GET /token "user_id=abc"
expect_err "user_id filter type" 400 invalid_request "user_id: must be an integer >= 1"
api GET /token
expect "list all tokens" '.status == 200 and .body.total >= 3'

r0=$(rev)
api PATCH "/token/$TID1" '' '{"name":"renamed","key":"sk-evil"}'
expect_err "a key's secret cannot be set" 400 invalid_request "key: is read-only"
api PATCH "/token/$TID1" '' '{"name":"renamed","user_id":1}'
expect_err "a key cannot move to another user" 400 invalid_request "user_id: is read-only"
api PATCH "/token/$TID1" '' '{"name":"renamed","remain_qouta":1}'
expect_err "a misspelt key field" 400 invalid_request "remain_qouta: unknown field (known: name, remain_quota, unlimited_quota, expired_time, models, allow_ips, group, status)"
api PATCH "/token/$TID1" '' '{"name":"renamed","remain_quota":60000,"models":null,"allow_ips":["127.0.0.1"],"status":"disabled"}'
expect "patch token" ".status == 200 and .body.name == \"renamed\" and .body.remain_quota == 60000 and .body.models == null and .body.allow_ips == [\"127.0.0.1\"] and .body.status == \"disabled\" and .body.user_id == $UID1"
expect_eq "PATCH /token bumps" "$(rev)" $((r0 + 1))
expect_eq "patch cannot change the key" "$(sql "SELECT key_hash FROM tokens WHERE id = $TID1")" "$HASH1"
api PATCH "/token/$TID1" '' '{"allow_ips":["::ffff:1.2.3.4","nope"]}'
expect_err "patch validates ips" 400 invalid_request 'allow_ips[1]: "nope" is not an IP address or CIDR'
api PATCH "/token/$TID1" '' '{"status":"enabled","models":["gpt-4o"],"expired_time":-1}'
expect "patch back" '.status == 200 and .body.status == "enabled" and .body.models == ["gpt-4o"] and .body.allow_ips == ["127.0.0.1"]'
api GET /token/999999999
expect_err "unknown token" 404 not_found "token 999999999 not found"


echo "== llmgw_token_lookup"
LK=$(sql "SELECT llmgw_token_lookup('$HASH1')")
ANS=$LK
expect "lookup by hash" ".id == $TID1 and .user_id == $UID1 and .name == \"renamed\" and .status == \"enabled\" and .expired_time == -1 and .remain_quota == 60000 and .used_quota == 0 and .unlimited_quota == false and .models == [\"gpt-4o\"] and .allow_ips == [\"127.0.0.1\"] and .group == \"vip\""
expect "lookup carries the user" ".user.id == $UID1 and .user.status == \"enabled\" and .user.quota == 100000 and .user.used_quota == 0 and .user.group == \"default\""
expect_eq "lookup of an unknown hash is NULL" "$(sql "SELECT llmgw_token_lookup(repeat('0', 64)) IS NULL")" t


echo "== /channel"
r0=$(rev)
api POST /channel '' '{"name":"oa","type":1,"base_url":"https://api.example.com/v1//","key":"sk-upstream-secret","models":"gpt-4o, gpt-4o-mini,, gpt-4o","groups":"default,vip","priority":5,"weight":3,"model_mapping":"{\"gpt-4o\":\"gpt-4o-2024-08-06\"}","settings":{"x":1}}'
expect "create channel" '.status == 200 and .body.name == "oa" and .body.type == 1 and .body.base_url == "https://api.example.com/v1" and .body.models == ["gpt-4o","gpt-4o-mini"] and .body.groups == ["default","vip"] and .body.priority == 5 and .body.weight == 3 and .body.model_mapping == {"gpt-4o":"gpt-4o-2024-08-06"} and .body.settings == {"x":1} and .body.status == "enabled" and .body.key_set == true'
expect "channel answer hides the key" '(.body | has("key") | not)'
expect_eq "POST /channel bumps" "$(rev)" $((r0 + 1))
CID1=$(jq .body.id <<<"$ANS")
api POST /channel '' '{"type":14,"base_url":"http://10.0.0.5:8080","models":["claude-3"]}'
expect "channel defaults" '.status == 200 and .body.name == "" and .body.groups == ["default"] and .body.priority == 0 and .body.weight == 1 and .body.model_mapping == {} and .body.settings == {} and .body.key_set == false'
CID2=$(jq .body.id <<<"$ANS")
api POST /channel '' '{"base_url":"https://x","models":["a"]}'
expect_err "type required" 400 invalid_request "type: is required"
api POST /channel '' '{"type":1,"models":["a"]}'
expect_err "base_url required" 400 invalid_request "base_url: is required"
api POST /channel '' '{"type":1,"base_url":"https://x"}'
expect_err "models required" 400 invalid_request "models: is required"
api POST /channel '' '{"type":"1","base_url":"https://x","models":["a"]}'
expect "type must be an integer" '.status == 400 and (.message | startswith("type: must be an integer"))'
api POST /channel '' '{"type":1,"base_url":"ftp://x","models":["a"]}'
expect_err "base_url scheme" 400 invalid_request "base_url: must be http(s)://host[:port][/path] without credentials, query or fragment"
api POST /channel '' '{"type":1,"base_url":"https://user:pw@x","models":["a"]}'
expect "base_url credentials" '.status == 400 and (.message | startswith("base_url:"))'
api POST /channel '' '{"type":1,"base_url":"https://x/v1?a=b","models":["a"]}'
expect "base_url query" '.status == 400 and (.message | startswith("base_url:"))'
api POST /channel '' '{"type":1,"base_url":"http://x:70000","models":["a"]}'
expect "base_url port" '.status == 400 and .message == "base_url: the port must be 1 to 65535"'
api POST /channel '' '{"type":1,"base_url":"https://","models":["a"]}'
expect "base_url without host" '.status == 400 and (.message | startswith("base_url:"))'
api POST /channel '' '{"type":1,"base_url":"https://x","models":[1]}'
expect_err "models entries" 400 invalid_request "models[0]: must be a non-empty string"
api POST /channel '' '{"type":1,"base_url":"https://x","models":{"a":1}}'
expect_err "models type" 400 invalid_request "models: must be an array of strings or a comma-separated string"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"weight":-1}'
expect_err "weight negative" 400 invalid_request "weight: must be an integer between 0 and 1000000"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"weight":3000000}'
expect_err "weight above what routing shares out" 400 invalid_request "weight: must be an integer between 0 and 1000000"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"model_maping":{"a":"b"}}'
expect_err "a misspelt channel field" 400 invalid_request "model_maping: unknown field (known: name, type, base_url, key, models, groups, priority, weight, model_mapping, status, settings)"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"key_set":true}'
expect_err "key_set is read-only" 400 invalid_request "key_set: is read-only"
api POST /channel '' '{"type":1,"base_url":"https://x/a\u0001b","models":["a"]}'
expect_err "a control character in base_url" 400 invalid_request "base_url: must be printable ASCII (percent-encode other characters)"
api POST /channel '' '{"type":1,"base_url":"https://x/caf\u00e9","models":["a"]}'
expect_err "non-ASCII in base_url" 400 invalid_request "base_url: must be printable ASCII (percent-encode other characters)"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"model_mapping":"{bad"}'
expect_err "mapping not JSON" 400 invalid_request "model_mapping: must be a JSON object (or a string holding one)"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"model_mapping":{"a":5}}'
expect_err "mapping values" 400 invalid_request "model_mapping.a: must be a non-empty string"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"settings":[1]}'
expect_err "settings type" 400 invalid_request "settings: must be a JSON object (or a string holding one)"

# text written into upstream request heads: no control characters
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"key":"sk-up\r\nX-Injected: yes"}'
expect_err "key with CR LF" 400 invalid_request "key: must not contain control characters"
grep -q "Injected" <<<"$ANS" && bad "the refusal repeats the key" || ok
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"key":"sk-up\u007fdel"}'
expect_err "key with DEL" 400 invalid_request "key: must not contain control characters"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"key":5}'
expect_err "key type" 400 invalid_request "key: must be a string"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"key":" \tsk-from-a-file\r\n"}'
expect "key with surrounding whitespace" '.status == 200 and .body.key_set == true'
CID3=$(jq .body.id <<<"$ANS")
expect_eq "key stored trimmed" "$(sql "SELECT key = 'sk-from-a-file' FROM channels WHERE id = $CID3")" t
api PATCH "/channel/$CID3" '' '{"key":"sk-other\n"}'
expect_eq "PATCH trims the key" "$(sql "SELECT key = 'sk-other' FROM channels WHERE id = $CID3")" t
api PATCH "/channel/$CID3" '' '{"key":"sk-a\nb"}'
expect_err "PATCH refuses a key with LF" 400 invalid_request "key: must not contain control characters"
api POST /channel '' '{"type":24,"base_url":"https://x","models":["gem\r\nX-Injected: 1"]}'
expect_err "model name with CR LF" 400 invalid_request 'models: "gem\r\nX-Injected: 1" must not contain control characters'
api POST /channel '' '{"type":24,"base_url":"https://x","models":"a, g\tb"}'
expect_err "model name with a tab, comma-separated" 400 invalid_request 'models: "g\tb" must not contain control characters'
api POST /channel '' '{"type":24,"base_url":"https://x","models":["a"],"groups":["vip\n"]}'
expect_err "group with LF" 400 invalid_request 'groups: "vip\n" must not contain control characters'
api POST /channel '' '{"type":24,"base_url":"https://x","models":["a"],"model_mapping":{"a":"up\r\nX: 1"}}'
expect_err "mapped name with CR LF" 400 invalid_request "model_mapping.a: must not contain control characters"
api POST /channel '' '{"type":24,"base_url":"https://x","models":["a"],"model_mapping":{"a\nb":"up"}}'
expect_err "mapping key with LF" 400 invalid_request 'model_mapping: "a\nb" must not contain control characters'
api POST /channel '' '{"type":24,"base_url":"https://x","models":["gem x?y#z%/é"],"model_mapping":{"gem x?y#z%/é":"up x"}}'
expect "spaces, ?, #, %, / and UTF-8 in model names are fine" '.status == 200 and .body.models == ["gem x?y#z%/é"]'
api DELETE "/channel/$(jq .body.id <<<"$ANS")"
api DELETE "/channel/$CID3"

api GET "/channel/$CID1"
expect "get channel" ".status == 200 and .body.id == $CID1 and .body.key_set == true and (.body | has(\"key\") | not)"
grep -q "sk-upstream-secret" <<<"$ANS" && bad "channel key in GET" || ok
api GET /channel
expect "list channels" ".status == 200 and ([.body.items[].id] | index($CID1) != null) and ([.body.items[] | has(\"key\")] | any | not)"
api PATCH "/channel/$CID2" '' '{"status":"disabled","models":["claude-3","claude-3-5"],"model_mapping":""}'
expect "patch channel" '.status == 200 and .body.status == "disabled" and .body.models == ["claude-3","claude-3-5"] and .body.model_mapping == {}'
api PATCH "/channel/$CID2" '' '{"base_url":"nope"}'
expect "patch validates base_url" '.status == 400 and (.message | startswith("base_url:"))'

SNAP=$(sql "SELECT llmgw_snapshot()")
ANS=$SNAP
expect "snapshot revision" ".revision == $(rev)"
expect "snapshot has the enabled channel with its key" "[.channels[] | select(.id == $CID1)][0] | .key == \"sk-upstream-secret\" and .base_url == \"https://api.example.com/v1\" and .models == [\"gpt-4o\",\"gpt-4o-mini\"] and .groups == [\"default\",\"vip\"] and .priority == 5 and .weight == 3 and .model_mapping == {\"gpt-4o\":\"gpt-4o-2024-08-06\"} and .settings == {\"x\":1} and .type == 1 and .name == \"oa\""
expect "snapshot leaves out disabled channels" "[.channels[].id] | index($CID2) == null"
expect "snapshot keeps disabled channels for polling only" "[.poll_channels[].id] | index($CID2) != null"
expect "snapshot groups has default" '.groups.default.ratio != null and (.groups.default | has("deprecated"))'
expect "snapshot shape" '(. | keys) == ["admin_hashes","channels","groups","plugins","poll_channels","poll_plugins","pricing","rate_limit","revision"]'

r0=$(rev)
api DELETE "/channel/$CID1"
expect "delete channel" ".status == 200 and .body == {\"id\": $CID1, \"deleted\": true}"
expect_eq "DELETE /channel bumps" "$(rev)" $((r0 + 1))
api GET "/channel/$CID1"
expect_err "deleted channel is gone" 404 not_found "channel $CID1 not found"
ANS=$(sql "SELECT llmgw_snapshot()")
expect "snapshot leaves out deleted channels" "[.channels[].id, .poll_channels[].id] | index($CID1) == null"


echo "== /pricing"
api PUT /pricing '' '{"t-gpt":{"ratio":2.5,"completion_ratio":4},"t-img":{"price":0.04},"t-emb":{"ratio":0.1},"t-old":{"ratio":1}}'
expect "put pricing" '.status == 200 and .body["t-gpt"] == {"ratio":2.5,"completion_ratio":4,"cache_ratio":1,"cache_creation_ratio":1} and .body["t-img"] == {"price":0.04} and .body["t-emb"] == {"ratio":0.1,"completion_ratio":1,"cache_ratio":1,"cache_creation_ratio":1}'
r0=$(rev)
api PUT /pricing '' '{"t-old":null,"t-img":{"price":0.05,"ratio":null}}'
expect "pricing merge and removal" '.status == 200 and (.body | has("t-old") | not) and .body["t-img"] == {"price":0.05} and .body["t-gpt"].ratio == 2.5'
expect_eq "PUT /pricing bumps" "$(rev)" $((r0 + 1))
api PUT /pricing '' '{"gpt-4o":{"ratio":-1}}'
expect_err "pricing ratio" 400 invalid_request "pricing.gpt-4o.ratio: must be a number >= 0"
api PUT /pricing '' '{"gpt-4o":{"ratio":"1"}}'
expect_err "pricing ratio type" 400 invalid_request "pricing.gpt-4o.ratio: must be a number >= 0"
api PUT /pricing '' '{"gpt-4o":{"ratio":1,"completion_ratio":-2}}'
expect_err "pricing completion_ratio" 400 invalid_request "pricing.gpt-4o.completion_ratio: must be a number >= 0"
api PUT /pricing '' '{"gpt-4o":{"price":-0.1}}'
expect_err "pricing price" 400 invalid_request "pricing.gpt-4o.price: must be a number >= 0"
api PUT /pricing '' '{"gpt-4o":{"ratio":1e300}}'
expect_err "pricing ratio out of bounds" 400 invalid_request "pricing.gpt-4o.ratio: must be at most 1000000000"
api PUT /pricing '' '{"gpt-4o":{"ratio":1,"price":1}}'
expect_err "pricing both" 400 invalid_request "pricing.gpt-4o: give either ratio or price, not both"
api PUT /pricing '' '{"gpt-4o":{"ratio":1,"completion_rate":4}}'
expect_err "pricing unknown field" 400 invalid_request "pricing.gpt-4o.completion_rate: unknown field (known: ratio, completion_ratio, cache_ratio, cache_creation_ratio, price, unit_prices, multipliers)"
api GET /pricing
expect "a refused PUT stores nothing" '.status == 200 and (.body | has("gpt-4o") | not)'
api PUT /pricing '' '{"gpt-4o":{}}'
expect_err "pricing neither" 400 invalid_request "pricing.gpt-4o: needs ratio (per token), price (per call) or unit_prices (per usage unit)"
api PUT /pricing '' '{"gpt-4o":3}'
expect "pricing entry type" '.status == 400 and (.message | startswith("pricing.gpt-4o: must be an object"))'
api PUT /pricing '' '{"t-new":{"ratio":1},"bad":{"ratio":-1}}'
expect "a failed PUT changes nothing" '.status == 400'
api GET /pricing
expect "get pricing" '.status == 200 and (.body | has("t-new") | not) and .body["t-gpt"].completion_ratio == 4'
ANS=$(sql "SELECT llmgw_snapshot()")
expect "snapshot pricing" '.pricing["t-gpt"] == {"ratio":2.5,"completion_ratio":4,"cache_ratio":1,"cache_creation_ratio":1}'


echo "== /group"
api PUT /group '' '{"t-vip":2,"t-old":{"ratio":0.5,"deprecated":true}}'
expect "put group" '.status == 200 and .body["t-vip"] == {"ratio":2,"deprecated":false} and .body["t-old"] == {"ratio":0.5,"deprecated":true} and .body.default != null'
r0=$(rev)
api PUT /group '' '{"t-old":{"deprecated":false},"t-vip":null}'
expect "group merge keeps the ratio, null removes" '.status == 200 and .body["t-old"] == {"ratio":0.5,"deprecated":false} and (.body | has("t-vip") | not)'
expect_eq "PUT /group bumps" "$(rev)" $((r0 + 1))
api PUT /group '' '{"x":-1}'
expect_err "group ratio" 400 invalid_request "group.x: must be a number >= 0"
api PUT /group '' '{"x":{"ratio":-1}}'
expect_err "group object ratio" 400 invalid_request "group.x.ratio: must be a number >= 0"
api PUT /group '' '{"x":{"ratoi":0.5}}'
expect_err "a misspelt group member" 400 invalid_request "group.x.ratoi: unknown field (known: ratio, deprecated)"
api PUT /group '' '{"x":1e300}'
expect_err "a group ratio out of bounds" 400 invalid_request "group.x: must be at most 1000000000"
api PUT /group '' "{\"$(printf 'g%.0s' $(seq 65))\":1}"
expect_err "a group name too long" 400 invalid_request "group: group names must be at most 64 characters"
api PUT /group '' "{\"$(printf 'g%.0s' $(seq 65))\":null}"
expect "removing a group is not checked for its name (one stored before the rule)" '.status == 200'
api PUT /group '' '{"x":{"deprecated":"yes"}}'
expect_err "group deprecated" 400 invalid_request "group.x.deprecated: must be true or false"
api PUT /group '' '{"x":"2"}'
expect "group value type" '.status == 400 and (.message | startswith("group.x: must be"))'
api PUT /group '' '{"default":null}'
expect "default always present" '.status == 200 and .body.default == {"ratio":1,"deprecated":false}'
api PUT /group '' '{"default":1.5}'
expect "default can be set" '.status == 200 and .body.default == {"ratio":1.5,"deprecated":false}'
api GET /group
expect "get group" '.status == 200 and .body.default.ratio == 1.5 and .body["t-old"].ratio == 0.5'
ANS=$(sql "SELECT llmgw_snapshot()")
expect "snapshot groups" '.groups.default == {"ratio":1.5,"deprecated":false} and .groups["t-old"] == {"ratio":0.5,"deprecated":false}'
api PUT /group '' '{"default":{"ratio":1}}'


echo "== /rate_limit"
r0=$(rev)
api PUT /rate_limit '' '{"default":{"duration_minutes":1,"total":60,"success":30},"groups":{"vip":{"duration_minutes":5,"total":1000},"free":{"duration_minutes":0,"total":0,"success":0}}}'
expect "put rate_limit" '.status == 200 and .body == {"default":{"duration_minutes":1,"total":60,"success":30},"groups":{"vip":{"duration_minutes":5,"total":1000,"success":0},"free":{"duration_minutes":0,"total":0,"success":0}}}'
expect_eq "PUT /rate_limit bumps" "$(rev)" $((r0 + 1))
api PUT /rate_limit '' '{"default":{"total":5}}'
expect_err "duration needed" 400 invalid_request "rate_limit.default.duration_minutes: must be >= 1 when total or success is above 0"
api PUT /rate_limit '' '{"default":{"duration_minutes":1,"total":100001}}'
expect_err "total cap" 400 invalid_request "rate_limit.default.total: must be an integer between 0 and 100000"
api PUT /rate_limit '' '{"groups":{"vip":{"duration_minutes":1,"success":-1}}}'
expect_err "success range" 400 invalid_request "rate_limit.groups.vip.success: must be an integer between 0 and 100000"
api PUT /rate_limit '' '{"groups":{"vip":{"duration_minutes":1.5,"total":1}}}'
expect "duration integer" '.status == 400 and (.message | startswith("rate_limit.groups.vip.duration_minutes: must be an integer"))'
api PUT /rate_limit '' '{"groups":[1]}'
expect_err "groups type" 400 invalid_request "rate_limit.groups: must be an object of group name to limit"
api PUT /rate_limit '' '{"default":5}'
expect_err "default type" 400 invalid_request "rate_limit.default: must be an object {duration_minutes, total, success}"
api PUT /rate_limit '' '{"defualt":{"duration_minutes":1,"total":60}}'
expect_err "a misspelt part is refused (PUT replaces both)" 400 invalid_request "rate_limit.defualt: unknown field (known: default, groups)"
api PUT /rate_limit '' '{"default":{"duration_minutes":1,"totals":60}}'
expect_err "a misspelt limit member" 400 invalid_request "rate_limit.default.totals: unknown field (known: duration_minutes, total, success)"
api PUT /rate_limit '' '{"groups":{"vip":{"duration_minutes":1,"sucess":2}}}'
expect_err "a misspelt group limit member" 400 invalid_request "rate_limit.groups.vip.sucess: unknown field (known: duration_minutes, total, success)"
api PUT /rate_limit '' '{"groups":{"a\tb":{"duration_minutes":1,"total":2}}}'
expect_err "a group name with a control character" 400 invalid_request "rate_limit.groups: group names must not contain control characters"
api GET /rate_limit
expect "failed PUT kept the value" '.status == 200 and .body.default.total == 60 and .body.groups.vip.total == 1000'
ANS=$(sql "SELECT llmgw_snapshot()")
expect "snapshot rate_limit" '.rate_limit.default.total == 60 and .rate_limit.groups.vip.duration_minutes == 5'
api PUT /rate_limit '' '{"groups":{"vip":{"duration_minutes":2,"total":3}}}'
expect "put replaces" '.status == 200 and .body.default == null and .body.groups == {"vip":{"duration_minutes":2,"total":3,"success":0}}'
api PUT /rate_limit '' '{}'
expect "put empty clears" '.status == 200 and .body == {"default":null,"groups":{}}'


echo "== llmgw_flush"
flush() {
    psql "$CONN" -X -At -q -v ON_ERROR_STOP=1 -v rows="$1" -f - <<'EOF'
SELECT llmgw_flush(:'rows'::jsonb);
EOF
}
bal() {   # token remain/used user quota/used
    sql "SELECT t.remain_quota || ' ' || t.used_quota || ' ' || u.quota || ' ' || u.used_quota
           FROM tokens t JOIN users u ON u.id = t.user_id WHERE t.id = $1"
}
# Start: token 1 remain 60000 used 0; user quota 100000 used 0.
expect_eq "balances before" "$(bal "$TID1")" "60000 0 100000 0"
ROWS=$(cat <<EOF
[
 {"request_id":"r1-$RUN","type":"reserve","user_id":$UID1,"token_id":$TID1,"model_name":"gpt-4o","quota":1000,"created_at":1700000000.25,"channel_id":$CID1,"channels_tried":[$CID1],"endpoint":"/v1/chat/completions","is_stream":true,"status":0,"latency_ms":0},
 {"request_id":"r1-$RUN","type":"consume","user_id":$UID1,"token_id":$TID1,"model_name":"gpt-4o","upstream_model":"gpt-4o-2024-08-06","quota":300,"prompt_tokens":10,"completion_tokens":20,"cache_read_tokens":3,"cache_creation_tokens":4,"created_at":1700000000.75,"status":200,"latency_ms":812,"content":"ok"},
 {"request_id":"r2-$RUN","type":"reserve","user_id":$UID1,"token_id":$TID1,"model_name":"claude-3","quota":500,"created_at":1700000100.5},
 {"request_id":"r2-$RUN","type":"refund","user_id":$UID1,"token_id":$TID1,"model_name":"claude-3","quota":500,"created_at":1700000101.5},
 {"request_id":"r3-$RUN","type":"error","user_id":$UID1,"token_id":$TID1,"model_name":"gpt-4o","quota":0,"status":502,"created_at":1700000200,"content":"upstream failed"},
 {"request_id":"r4-$RUN","type":"consume","token_id":$TID3,"model_name":"gpt-4o","quota":700,"created_at":1700000300}
]
EOF
)
ANS=$(flush "$ROWS")
expect "first flush inserts all" '.inserted == 6'
# token1: -1000 -300 -500 +500 = -1300 ; user: that plus token3's 700.
expect_eq "token balances after flush" "$(bal "$TID1")" "58700 1300 98000 2000"
expect_eq "unlimited token: used grows, remain untouched" "$(bal "$TID3")" "0 700 98000 2000"
ANS=$(flush "$ROWS")
expect "second flush inserts nothing" '.inserted == 0'
expect_eq "second flush changes no balance" "$(bal "$TID1")" "58700 1300 98000 2000"
# Partial overlap, and duplicates inside one batch.
ROWS2=$(cat <<EOF
[
 {"request_id":"r1-$RUN","type":"consume","user_id":$UID1,"token_id":$TID1,"quota":300},
 {"request_id":"r5-$RUN","type":"consume","user_id":$UID1,"token_id":$TID1,"model_name":"gpt-4o","quota":100,"created_at":1700000400},
 {"request_id":"r5-$RUN","type":"consume","user_id":$UID1,"token_id":$TID1,"model_name":"gpt-4o","quota":100,"created_at":1700000400}
]
EOF
)
ANS=$(flush "$ROWS2")
expect "overlapping flush inserts only the new row once" '.inserted == 1'
expect_eq "balances after overlap" "$(bal "$TID1")" "58600 1400 97900 2100"
ANS=$(flush '[]')
expect "empty flush" '.inserted == 0'
psql "$CONN" -X -At -q -c "SELECT llmgw_flush('{}')" >/dev/null 2>&1 && bad "flush accepts a non-array" || ok
expect_eq "ledger row stored" \
    "$(sql "SELECT prompt_tokens || ' ' || completion_tokens || ' ' || cache_read_tokens || ' ' || cache_creation_tokens || ' ' || status || ' ' || latency_ms || ' ' || content || ' ' || upstream_model || ' ' || extract(epoch FROM created_at) FROM logs WHERE request_id = 'r1-$RUN' AND type = 'consume'")" \
    "10 20 3 4 200 812 ok gpt-4o-2024-08-06 1700000000.750000"
expect_eq "user_id taken from the token when absent" \
    "$(sql "SELECT user_id FROM logs WHERE request_id = 'r4-$RUN'")" "$UID1"
ANS=$(sql "SELECT llmgw_token_lookup('$HASH1')")
expect "lookup sees flushed balances" '.remain_quota == 58600 and .used_quota == 1400 and .user.quota == 97900 and .user.used_quota == 2100'

# Balances saturate rather than fail the batch (and every batch after it).
# A row is at most LLMGW_QUOTA_MAX (1e15), so a batch's sum fits; what
# its balances already hold may not.
api POST /user '' "{\"username\":\"rich_$RUN\",\"quota\":9223372036854775807}"
RU=$(jq .body.id <<<"$ANS")
api POST /token '' "{\"user_id\":$RU,\"unlimited_quota\":true}"
RT=$(jq .body.id <<<"$ANS")
api POST /user '' "{\"username\":\"other_$RUN\",\"quota\":100}"
OU=$(jq .body.id <<<"$ANS")
api POST /token '' "{\"user_id\":$OU,\"remain_quota\":50}"
OT=$(jq .body.id <<<"$ANS")
for i in 1 2; do
    ANS=$(flush "[{\"request_id\":\"big$i-$RUN\",\"type\":\"consume\",\"token_id\":$RT,\"quota\":5000000000000000000},
                  {\"request_id\":\"small$i-$RUN\",\"type\":\"consume\",\"token_id\":$OT,\"quota\":1}]" 2>&1)
    expect "an overflowing balance does not fail the batch ($i)" '.inserted == 2'
done
expect_eq "the used quota saturates, the quota does not go past its range" \
    "$(bal "$RT")" "0 9223372036854775807 -776627963145224193 9223372036854775807"
expect_eq "the other rows of the batch moved their balances" "$(bal "$OT")" "48 2 98 2"
api DELETE "/user/$RU"
api DELETE "/user/$OU"


echo "== ledger COPY: the writer's two ways"
COLS="request_id, type, user_id, token_id, channel_id, model_name, upstream_model, endpoint, channels_tried, prompt_tokens, completion_tokens, cache_read_tokens, cache_creation_tokens, quota, is_stream, status, latency_ms, created_at"
TAB=$'\t'
api POST /user '' "{\"username\":\"copy_$RUN\",\"quota\":100000}"
CU=$(jq .body.id <<<"$ANS")
api POST /token '' "{\"user_id\":$CU,\"remain_quota\":60000}"
CT=$(jq .body.id <<<"$ANS")
api POST /token '' "{\"user_id\":$CU,\"unlimited_quota\":true}"
CTU=$(jq .body.id <<<"$ANS")
cline() {   # request_id quota [token_id [user_id]]
    printf '%s\n' "$1${TAB}consume${TAB}${4-$CU}${TAB}${3:-$CT}${TAB}$CID1${TAB}gpt-4o${TAB}gpt-4o-x${TAB}chat${TAB}[$CID1]${TAB}10${TAB}20${TAB}0${TAB}0${TAB}$2${TAB}f${TAB}200${TAB}5${TAB}2023-11-14 22:13:20.250+00"
}
# new: COPY straight into logs, then llmgw_flush_apply with the sums, in one transaction
copy_new() {   # apply-arguments, then the lines on stdin
    { echo "COPY logs ($COLS) FROM STDIN;"; cat; echo '\.'; echo "SELECT llmgw_flush_apply($1)::text;"; } |
        psql "$CONN" -X -At -q -1 -v ON_ERROR_STOP=1 -f - 2>/dev/null
}
# again: COPY into the session's staging table, then llmgw_flush_staged
copy_again() {
    { echo "SELECT llmgw_flush_stage();"; echo "COPY pg_temp.llmgw_flush_in ($COLS) FROM STDIN;"; cat; echo '\.';
      echo "SELECT llmgw_flush_staged()::text;"; } |
        psql "$CONN" -X -At -q -1 -v ON_ERROR_STOP=1 -f - | tail -n 1
}
ANS=$( { cline "c1-$RUN" 100; cline "c2-$RUN" 50; } | copy_new "'{$CT}','{150}','{$CU}','{150}'")
expect "new batch: balances answered" ".tokens[\"$CT\"] == 59850 and .users[\"$CU\"] == 99850"
expect_eq "new batch: rows stored with their fields" \
    "$(sql "SELECT count(*) || ' ' || sum(quota) || ' ' || min(channels_tried::text) || ' ' || min(extract(epoch FROM created_at)) || ' ' || bool_or(is_stream) FROM logs WHERE request_id IN ('c1-$RUN', 'c2-$RUN')")" \
    "2 150 [$CID1] 1700000000.250000 false"
expect_eq "new batch: balances moved by the sums" "$(bal "$CT")" "59850 150 99850 150"
ANS=$( { cline "c3-$RUN" 7; cline "c1-$RUN" 100; } | copy_new "'{$CT}','{107}','{$CU}','{107}'") \
    && bad "a batch with a row already written is refused" || ok
expect_eq "a refused new batch keeps nothing" "$(sql "SELECT count(*) FROM logs WHERE request_id = 'c3-$RUN'")" 0
expect_eq "a refused new batch moves no balance" "$(bal "$CT")" "59850 150 99850 150"
ANS=$( { cline "c3-$RUN" 7; cline "c1-$RUN" 100; cline "c3-$RUN" 7; cline "c4-$RUN" 3 "$CTU" '\N'; } | copy_again)
expect "again: only the new rows, once" '.inserted == 2'
expect "again: answers every id of the batch" ".tokens[\"$CT\"] == 59843 and .tokens[\"$CTU\"] == 0 and .users[\"$CU\"] == 99840"
expect_eq "again: balances moved by the new rows alone" "$(bal "$CT")" "59843 157 99840 160"
expect_eq "again: a row without user_id is charged to the token's owner" \
    "$(sql "SELECT user_id FROM logs WHERE request_id = 'c4-$RUN'")" "$CU"
ANS=$( { cline "c3-$RUN" 7; cline "c4-$RUN" 3 "$CTU" '\N'; } | copy_again)
expect "again, twice: nothing" '.inserted == 0'
expect_eq "again, twice: no balance moves" "$(bal "$CT")" "59843 157 99840 160"
ANS=$(sql "SELECT llmgw_flush_apply('{$CT,$CTU}', '{0,0}', '{$CU}', '{0}')")
expect "apply without charges answers balances" ".tokens == {\"$CT\": 59843, \"$CTU\": 0} and .users == {\"$CU\": 99840}"
expect_eq "apply without charges moves nothing" "$(bal "$CT")" "59843 157 99840 160"
ANS=$(sql "SELECT llmgw_flush_apply('{$CTU}', '{40}', '{}', '{}')")
expect_eq "apply: an unlimited token's remain_quota stays" "$(bal "$CTU")" "0 43 99840 160"

echo "== balance revisions (015, 021)"
trev() { sql "SELECT bal_rev FROM tokens WHERE id = $1"; }
urev() { sql "SELECT bal_rev FROM users WHERE id = $1"; }
TR=$(trev "$CT"); TRU=$(trev "$CTU"); UR=$(urev "$CU")
ANS=$(sql "SELECT llmgw_flush_apply('{$CT,$CTU}', '{5,2}', '{$CU}', '{7}')")
expect "apply answers each balance with its revision" \
    ".tokens[\"$CT\"] == 59838 and .token_revs[\"$CT\"] == $((TR + 1)) and .token_revs[\"$CTU\"] == $TRU and .users[\"$CU\"] == 99833 and .user_revs[\"$CU\"] == $((UR + 1))"
expect_eq "apply: a moved balance goes one revision on" "$(trev "$CT") $(urev "$CU")" "$((TR + 1)) $((UR + 1))"
expect_eq "apply: an unlimited key's revision stays with its balance" "$(trev "$CTU")" "$TRU"
sql "UPDATE tokens SET remain_quota = remain_quota + 1 WHERE id = $CT" >/dev/null
sql "UPDATE users SET quota = quota + 1 WHERE id = $CU" >/dev/null
expect_eq "another update of a balance goes one revision on" "$(trev "$CT") $(urev "$CU")" "$((TR + 2)) $((UR + 2))"
sql "UPDATE tokens SET name = name || '' WHERE id = $CT" >/dev/null
expect_eq "an update that moves no balance keeps the revision" "$(trev "$CT")" "$((TR + 2))"
sql "UPDATE tokens SET unlimited_quota = NOT unlimited_quota WHERE id = $CTU" >/dev/null

echo "== deleting a user while a ledger write holds its key (022)"
api POST /user '' '{"username":"del-under-load","quota":1000}'
DU=$(jq -r '.body.id' <<<"$ANS")
api POST /token '' "{\"user_id\":$DU,\"remain_quota\":1000}"
DT=$(jq -r '.body.id' <<<"$ANS")
# a ledger write's order: the key's row, then (a moment later) the user's
WERR=$(mktemp)
psql "$CONN" -X -At -q -v ON_ERROR_STOP=1 >/dev/null 2>"$WERR" <<EOF2 &
BEGIN;
SELECT 1 FROM tokens WHERE id = $DT FOR UPDATE;
SELECT pg_sleep(0.6);
UPDATE users SET used_quota = used_quota WHERE id = $DU;
COMMIT;
EOF2
writer=$!
sleep 0.2
api DELETE "/user/$DU"
expect "the delete waits for the write, then succeeds" '.status == 200 and .body.deleted == true'
if wait "$writer"; then ok; else bad "the ledger write failed: $(cat "$WERR")"; fi
rm -f "$WERR"
expect_eq "the user's key went with it" "$(sql "SELECT deleted_at IS NOT NULL FROM tokens WHERE id = $DT")" t
expect_eq "unlimited switched: a new revision" "$(trev "$CTU")" "$((TRU + 1))"
sql "UPDATE tokens SET unlimited_quota = NOT unlimited_quota WHERE id = $CTU" >/dev/null


echo "== ledger indexes: only what readers need (009)"
expect_eq "logs indexes" \
    "$(sql "SELECT string_agg(indexname, ' ' ORDER BY indexname) FROM pg_indexes WHERE tablename = 'logs'")" \
    "logs_request_id_type_key logs_time_brin logs_token_time logs_user_time"
expect_eq "rows are identified by (request_id, type) (020)" \
    "$(sql "SELECT relreplident FROM pg_class WHERE relname = 'logs'")" "i"
expect_eq "request ids compare byte-wise" \
    "$(sql "SELECT string_agg(coalesce(collation_name, '-'), ' ' ORDER BY column_name) FROM information_schema.columns WHERE table_name = 'logs' AND column_name IN ('request_id', 'type')")" \
    "C C"
expect_eq "ids are taken 1,000 at a time (010)" \
    "$(sql "SELECT seqcache FROM pg_sequence WHERE seqrelid = 'logs_id_seq'::regclass")" \
    "1000"
expect_eq "created_at summarised by block range" \
    "$(sql "SELECT indexdef FROM pg_indexes WHERE indexname = 'logs_time_brin'")" \
    "CREATE INDEX logs_time_brin ON public.logs USING brin (created_at) WITH (autosummarize='on')"

echo "== /log"
api GET /log "token_id=$TID1"
expect "log by token" ".status == 200 and .body.total == 6 and .body.page == 1 and (.body.items | length) == 6"
expect "log newest first" '[.body.items[].created_at] == ([.body.items[].created_at] | sort | reverse)'
expect "log item shape" '(.body.items[0] | keys) == (["cache_creation_tokens","cache_read_tokens","channel_id","channels_tried","completion_tokens","created_at","endpoint","id","is_stream","latency_ms","model_name","prompt_tokens","quota","request_id","status","token_id","type","upstream_model","user_id"] | sort)'
api GET /log "token_id=$TID1&type=reserve"
expect "log by type" ".status == 200 and .body.total == 2 and ([.body.items[].type] | unique) == [\"reserve\"]"
api GET /log "user_id=$UID1&model=claude-3"
expect "log by user and model" '.status == 200 and .body.total == 2'
api GET /log "user_id=$UID1&model=gpt%2D4o&from=1700000000&to=1700000000"
expect "log by time: to covers its whole second, url-decoded model" '.status == 200 and .body.total == 2 and ([.body.items[].created_at] | unique) == [1700000000]'
api GET /log "user_id=$UID1&from=1700000200"
expect "log from" '.status == 200 and .body.total == 3'
api GET /log "user_id=$UID1&page=2&page_size=4"
expect "log paging" '.status == 200 and .body.total == 7 and .body.page == 2 and (.body.items | length) == 3'
api GET /log "token_id=$TID1&type=reserve&page_size=1"
expect "reserve row fields" ".body.items[0].request_id == \"r2-$RUN\" and .body.items[0].quota == 500 and .body.items[0].created_at == 1700000100"
api GET /log "token_id=$TID1&type=consume&model=gpt-4o&page_size=1&page=2"
expect "consume row fields" ".body.items[0].request_id == \"r1-$RUN\" and .body.items[0].prompt_tokens == 10 and .body.items[0].upstream_model == \"gpt-4o-2024-08-06\" and .body.items[0].is_stream == false"
api GET /log "token_id=$TID1&type=reserve&model=gpt-4o"
expect "stream flag and channels_tried" ".body.items[0].is_stream == true and .body.items[0].channels_tried == [$CID1] and .body.items[0].endpoint == \"/v1/chat/completions\""
api GET /log "token_id=x"
expect_err "log token_id type" 400 invalid_request "token_id: must be an integer"
api GET /log "from=yesterday"
expect "log from type" '.status == 400 and (.message | startswith("from: must be an integer"))'
api GET /log "type=bogus"
expect_err "log type value" 400 invalid_request "type: must be one of consume, refund, error, reserve, adjust, settle"
api GET /log "page_size=1001"
expect_err "log page_size cap" 400 invalid_request "page_size: must be an integer between 1 and 1000"
api GET /log "model=%E4%BD%A0+x&page_size=5"
expect "url-decoding of utf-8 and +" '.status == 200 and .body.total == 0'
api GET /log "model=%FF"
expect "invalid utf-8 in query" '.status == 400'


echo "== delete cascades"
r0=$(rev)
api DELETE "/token/$TID2"
expect "delete token" ".status == 200 and .body == {\"id\": $TID2, \"deleted\": true}"
expect_eq "DELETE /token bumps" "$(rev)" $((r0 + 1))
api GET "/token/$TID2"
expect_err "deleted token gone" 404 not_found "token $TID2 not found"
HASH2=$(printf '%s' "${KEY2#sk-}" | sha256sum | cut -d' ' -f1)
expect_eq "lookup of a deleted token is NULL" "$(sql "SELECT llmgw_token_lookup('$HASH2') IS NULL")" t
api DELETE "/token/$TID2"
expect "deleting twice is 404" '.status == 404'

r0=$(rev)
api DELETE "/user/$UID1"
expect "delete user" ".status == 200 and .body == {\"id\": $UID1, \"deleted\": true}"
expect_eq "DELETE /user bumps" "$(rev)" $((r0 + 1))
api GET "/user/$UID1"
expect_err "deleted user is gone" 404 not_found "user $UID1 not found"
api GET /token "user_id=$UID1"
expect "the user's tokens are gone" '.status == 200 and .body.total == 0'
expect_eq "lookup after user delete is NULL" "$(sql "SELECT llmgw_token_lookup('$HASH1') IS NULL AND llmgw_token_lookup('$HASH3') IS NULL")" t
api POST /token '' "{\"user_id\":$UID1}"
expect_err "token for a deleted user" 400 invalid_request "user_id: user $UID1 does not exist"
api POST /user '' "{\"username\":\"$U1\"}"
expect "a deleted user's name can be reused" '.status == 200'


echo "== llmgw_admin_token_set"
AH=$(printf '%s' "admin-$RUN" | sha256sum | cut -d' ' -f1)
r0=$(rev)
sql "SELECT llmgw_admin_token_set('$AH')" >/dev/null
sql "SELECT llmgw_admin_token_set('$AH')" >/dev/null
expect_eq "admin hash stored once" "$(sql "SELECT count(*) FROM admin_tokens WHERE hash = '$AH'")" 1
expect_eq "a new admin hash bumps once" "$(rev)" $((r0 + 1))
ANS=$(sql "SELECT llmgw_snapshot()")
expect "snapshot admin_hashes" ".admin_hashes | index(\"$AH\") != null"
psql "$CONN" -X -At -q -c "SELECT llmgw_admin_token_set('nothex')" >/dev/null 2>&1 \
    && bad "admin_token_set accepts a non-hash" || ok


# ======================================================================
# sql/005_tasks.sql: task billing, tasks, leases, task pricing, bindings
# ======================================================================

# q2 SQL [A [B]]: runs SQL with psql variables a and b; prints the value.
q2() {
    psql "$CONN" -X -At -q -v ON_ERROR_STOP=1 -v a="${2:-}" -v b="${3:-}" -f - <<<"$1"
}
# task_* helpers put the answer in $ANS.
task_create() { ANS=$(q2 "SELECT llmgw_task_create(:'a'::jsonb)" "$1") || { bad "task_create failed"; ANS='{}'; }; }
task_claim()  { ANS=$(q2 "SELECT llmgw_task_claim(:'a', $2, $3)" "$1") || { bad "task_claim failed"; ANS='{}'; }; }
task_update() {   # OWNER ('' = NULL) UPDATES
    ANS=$(q2 "SELECT llmgw_task_update(nullif(:'a', ''), :'b'::jsonb)" "$1" "$2") \
        || { bad "task_update failed"; ANS='{}'; }
}
task_release() { ANS=$(q2 "SELECT llmgw_task_release(:'a', :'b'::jsonb)" "$1" "$2") || { bad "task_release failed"; ANS='{}'; }; }
task_lookup()  { ANS=$(q2 "SELECT llmgw_task_lookup($1, :'a'::jsonb)" "$2") || { bad "task_lookup failed"; ANS='{}'; }; }
# mine: the claimed task ids of this run, sorted, as a JSON array
mine() { jq -c "[.tasks[].task_id | select(startswith(\"task_$RUN\"))] | sort" <<<"$ANS"; }
tcol() { sql "SELECT $2 FROM tasks WHERE task_id = '$1'"; }
nlog() { sql "SELECT count(*) || ':' || coalesce(sum(quota), 0) FROM logs WHERE request_id = '$1' AND type = '$2'"; }


echo "== tasks: setup"
api POST /user '' "{\"username\":\"tu_$RUN\",\"quota\":1000000}"
TU=$(jq .body.id <<<"$ANS")
api POST /user '' "{\"username\":\"tu2_$RUN\",\"quota\":50000}"
TU2=$(jq .body.id <<<"$ANS")
api POST /token '' "{\"user_id\":$TU,\"remain_quota\":500000}"
TT=$(jq .body.id <<<"$ANS")
api POST /token '' "{\"user_id\":$TU,\"unlimited_quota\":true}"
TTU=$(jq .body.id <<<"$ANS")
api POST /token '' "{\"user_id\":$TU2,\"remain_quota\":50000}"
TT2=$(jq .body.id <<<"$ANS")
[ -n "$TU" ] && [ -n "$TT" ] && [ -n "$TTU" ] && [ -n "$TT2" ] && ok || bad "task setup"
T=task_$RUN    # every public id of this run starts with it
PRICE='{"unit_prices":{"seconds":0.1},"multipliers":{}}'
# base JSON of a task: task id, then extra members
tj() {
    jq -cn --arg id "${T}_$1" --argjson u "$TU" --argjson tok "${3:-$TT}" \
        --argjson extra "$2" --argjson price "$PRICE" \
        '{task_id: $id, upstream_task_id: ("up-" + $id), plugin_key: "tp",
          plugin_version: "1.0.0", channel_id: 7, user_id: $u, token_id: $tok,
          request_id: ("req-" + $id), action: "generate", model: "video-x",
          upstream_model: "video-x-2", status: "SUBMITTED", progress: "0%",
          data: {"a": 1}, state: {"s": 1}, retain_result: true,
          usage: {"seconds": 5}, group_ratio: 1.5, price: $price,
          poll_interval_ms: 0, timeout_ms: 3600000} + $extra'
}


echo "== tasks: logs.type and llmgw_flush learn adjust and settle"
ANS=$(flush "[{\"request_id\":\"fl-$RUN\",\"type\":\"adjust\",\"user_id\":$TU,\"token_id\":$TT,\"quota\":70},
              {\"request_id\":\"fl-$RUN\",\"type\":\"settle\",\"user_id\":$TU,\"token_id\":$TT,\"quota\":-20}]")
expect "flush inserts adjust and settle" '.inserted == 2'
expect_eq "adjust/settle move balances by +quota" "$(bal "$TT")" "499950 50 999950 50"
expect "flush answers balances" ".tokens[\"$TT\"] == 499950 and .users[\"$TU\"] == 999950"
psql "$CONN" -X -At -q -c "INSERT INTO logs (request_id, type) VALUES ('x-$RUN', 'bogus')" >/dev/null 2>&1 \
    && bad "logs accept an unknown type" || ok
api GET /log "token_id=$TT&type=settle"
expect "GET /log filters settle rows" '.status == 200 and .body.total == 1 and .body.items[0].quota == -20'
api GET /log "token_id=$TT&type=adjust"
expect "GET /log filters adjust rows" '.status == 200 and .body.total == 1 and .body.items[0].quota == 70'
api GET /log "token=$TT"
expect_err "GET /log refuses a filter it does not know" 400 invalid_request \
    "unknown filter: token (known: token_id, user_id, model, type, from, to, page, page_size)"


echo "== tasks: llmgw_task_create"
task_create "$(tj 1 '{"quota_reserve":1000,"quota_submit":1200}')"
expect "create answers the public view" "(.task | keys) == ([\"task_id\",\"status\",\"progress\",\"fail_reason\",\"created_at\",\"updated_at\",\"finished_at\",\"data\",\"model\",\"action\",\"plugin\"] | sort) and .task.task_id == \"${T}_1\" and .task.status == \"SUBMITTED\" and .task.data == {\"a\":1} and .task.plugin == \"tp\" and .task.model == \"video-x\" and .task.action == \"generate\" and .task.finished_at == null and .task.created_at > 1600000000"
expect "the view hides private fields" '(.task | has("upstream_task_id") or has("state") or has("quota")) | not'
expect "create answers the balances it left" ".tokens == {\"$TT\": 498750} and .users == {\"$TU\": 998750}"
expect_eq "reserve row" "$(nlog "${T}_1" reserve)" "1:1000"
expect_eq "adjust row is the delta" "$(nlog "${T}_1" adjust)" "1:200"
expect_eq "task quota is the net charge" "$(tcol "${T}_1" quota)" 1200
expect_eq "stored fields" "$(tcol "${T}_1" "upstream_task_id || ' ' || plugin_version || ' ' || channel_id || ' ' || request_id || ' ' || upstream_model || ' ' || state::text || ' ' || usage::text || ' ' || group_ratio || ' ' || (price->'unit_prices'->>'seconds') || ' ' || retain_result || ' ' || poll_failures")" \
    "up-${T}_1 1.0.0 7 req-${T}_1 video-x-2 {\"s\": 1} {\"seconds\": 5} 1.5 0.1 true 0"
expect_eq "deadline from timeout_ms" "$(tcol "${T}_1" "round(extract(epoch FROM deadline - created_at))")" 3600
expect_eq "ledger row carries the task's facts" \
    "$(sql "SELECT user_id || ' ' || token_id || ' ' || model_name || ' ' || upstream_model || ' ' || channel_id || ' ' || channels_tried::text || ' ' || endpoint FROM logs WHERE request_id = '${T}_1' AND type = 'reserve'")" \
    "$TU $TT video-x video-x-2 7 [7] task:tp"

task_create "$(tj 1 '{"quota_reserve":99999,"quota_submit":5,"status":"FAILURE"}')"
expect "create is idempotent on task_id" ".task.status == \"SUBMITTED\" and .tokens == {\"$TT\": 498750} and .users == {\"$TU\": 998750}"
expect_eq "a repeated create writes no ledger row" "$(sql "SELECT count(*) FROM logs WHERE request_id = '${T}_1'")" 2
expect_eq "a repeated create keeps the quota" "$(tcol "${T}_1" quota)" 1200

task_create "$(tj 2 '{"quota_reserve":500,"final_quota":300,"status":"SUCCESS","retain_result":false,"data":{"url":"https://x/v.mp4"}}')"
expect "immediate SUCCESS" '.task.status == "SUCCESS" and .task.data == null and (.task.finished_at | type) == "number"'
expect_eq "immediate SUCCESS settles to final_quota" "$(nlog "${T}_2" settle)" "1:-200"
expect_eq "immediate SUCCESS quota" "$(tcol "${T}_2" quota)" 300
expect_eq "retain_result false: data not persisted" "$(tcol "${T}_2" "data IS NULL")" t

task_create "$(tj 3 '{"quota_reserve":700,"quota_submit":800,"status":"FAILURE","fail_reason":"rejected by vendor"}')"
expect "immediate FAILURE" '.task.status == "FAILURE" and .task.fail_reason == "rejected by vendor" and .task.data == {"a":1}'
expect_eq "immediate FAILURE refunds all charged" "$(nlog "${T}_3" refund)" "1:800"
expect_eq "immediate FAILURE quota" "$(tcol "${T}_3" quota)" 0
expect_eq "immediate FAILURE refund row carries the reason" \
    "$(sql "SELECT content FROM logs WHERE request_id = '${T}_3' AND type = 'refund'")" "rejected by vendor"

task_create "$(tj 4 '{"quota_reserve":100}' "$TTU")"
expect "unlimited token: remain untouched" ".tokens == {\"$TTU\": 0}"
expect_eq "unlimited token: used grows" "$(sql "SELECT used_quota FROM tokens WHERE id = $TTU")" 100

task_create "$(tj 5 '{"quota_reserve":1000,"quota_submit":400}')"
expect_eq "negative adjust" "$(nlog "${T}_5" adjust)" "1:-600"
task_create "$(tj 5b '{"quota_reserve":0,"quota_submit":0,"poll_interval_ms":60000}')"
expect_eq "zero adjust is still a step" "$(nlog "${T}_5b" adjust)" "1:0"
task_create "$(tj 5c '{"quota_reserve":10,"poll_interval_ms":60000}')"
expect_eq "no quota_submit, no adjust step" "$(nlog "${T}_5c" adjust)" "0:0"

task_create "$(tj x '{"quota_reserve":1}' "$TT2" | jq -c --argjson u "$TU2" '.user_id = $u')"
TX=${T}_x    # another user's task
psql "$CONN" -X -At -q -c "SELECT llmgw_task_create('{\"task_id\":\"${T}_bad\",\"plugin_key\":\"tp\",\"user_id\":$TU,\"status\":\"DONE\"}')" >/dev/null 2>&1 \
    && bad "create accepts an unknown status" || ok
psql "$CONN" -X -At -q -c "SELECT llmgw_task_create('{\"task_id\":\"${T}_bad\",\"plugin_key\":\"tp\",\"user_id\":$TU,\"quota_reserve\":-5}')" >/dev/null 2>&1 \
    && bad "create accepts a negative quota" || ok
expect_eq "a failed create leaves nothing" "$(sql "SELECT count(*) FROM tasks WHERE task_id = '${T}_bad'")" 0

# sql/033: the protocol a task was created through ('' for none); a create
# that names none (a gateway from before 033) leaves it unknown (NULL)
task_create "$(tj p1 '{"quota_reserve":0,"poll_interval_ms":60000,"protocol":"host_responses","background":true}')"
task_create "$(tj p2 '{"quota_reserve":0,"poll_interval_ms":60000,"protocol":""}')"
task_create "$(tj p3 '{"quota_reserve":0,"poll_interval_ms":60000}')"
task_create "$(tj p1 '{"quota_reserve":0,"poll_interval_ms":60000,"protocol":"host_video"}')"
expect_eq "tasks.protocol: named, none, unknown; a repeated create changes nothing" \
    "$(sql "SELECT string_agg(coalesce(protocol, 'NULL') || ' ' || background, ',' ORDER BY task_id) FROM tasks WHERE task_id IN ('${T}_p1', '${T}_p2', '${T}_p3')")" "host_responses true, false,NULL false"
task_lookup "$TU" "[\"${T}_p1\",\"${T}_p3\"]"
expect "llmgw_task_lookup gives the protocol and the background mode" '[.tasks[] | [.protocol, .background]] == [["host_responses", true], [null, false]]'


echo "== tasks: llmgw_task_void"
task_create "$(tj v '{"quota_reserve":500,"final_quota":300,"status":"SUCCESS"}')"
rq0=$(sql "SELECT remain_quota FROM tokens WHERE id = $TT")
ANS=$(q2 "SELECT llmgw_task_void(:'a', 'the result could not be rendered: boom')" "${T}_v") || { bad "task_void failed"; ANS='{}'; }
expect "void of a SUCCESS task refunds its net charge" ".voided == true and .refunded == 300 and .tokens[\"$TT\"] == $((rq0 + 300))"
expect_eq "the voided task is FAILURE with the reason, quota 0" \
    "$(tcol "${T}_v" "status || ' ' || quota || ' ' || fail_reason")" "FAILURE 0 the result could not be rendered: boom"
expect_eq "one refund row of the net charge" "$(nlog "${T}_v" refund)" "1:300"
ANS=$(q2 "SELECT llmgw_task_void(:'a', 'again')" "${T}_v") || { bad "task_void failed"; ANS='{}'; }
expect "a second void does nothing" '.voided == false and .refunded == 0'
expect_eq "... and writes no row" "$(nlog "${T}_v" refund)" "1:300"
expect_eq "... nor moves the balance" "$(sql "SELECT remain_quota FROM tokens WHERE id = $TT")" "$((rq0 + 300))"
ANS=$(q2 "SELECT llmgw_task_void(:'a', 'x')" "${T}_5") || { bad "task_void failed"; ANS='{}'; }
expect "an unfinished task is not voided" '.voided == false'
expect_eq "... and stays as it was" "$(tcol "${T}_5" status)" SUBMITTED
ANS=$(q2 "SELECT llmgw_task_void(:'a', 'x')" "${T}_nope") || { bad "task_void failed"; ANS='{}'; }
expect "no such task: nothing" '.voided == false'


echo "== tasks: llmgw_task_claim"
ANS=$(q2 "SELECT llmgw_task_claim(:'a', 1000, 60000, '{8,7}')" "S_$RUN") || { bad "task_claim with skip failed"; ANS='{}'; }
expect_eq "claim leaves out the channels it is told to skip" "$(mine)" "[]"
expect_eq "... and leases none of them" "$(sql "SELECT count(*) FROM tasks WHERE lease_owner = 'S_$RUN'")" 0
task_claim "A_$RUN" 1000 60000
expect_eq "claim takes due non-terminal tasks" "$(mine)" "[\"${T}_1\",\"${T}_4\",\"${T}_5\",\"${T}_x\"]"
expect "claimed rows are full" "[.tasks[] | select(.task_id == \"${T}_1\")][0] | .upstream_task_id == \"up-${T}_1\" and .state == {\"s\":1} and .quota == 1200 and .price.unit_prices.seconds == 0.1 and .group_ratio == 1.5 and .usage == {\"seconds\":5} and .plugin_key == \"tp\" and .plugin_version == \"1.0.0\" and .channel_id == 7 and .user_id == $TU and .token_id == $TT and .action == \"generate\" and .model == \"video-x\" and .upstream_model == \"video-x-2\" and .status == \"SUBMITTED\" and .progress == \"0%\" and .data == {\"a\":1} and .poll_failures == 0 and (.created_at | type) == \"number\" and .lease_owner == \"A_$RUN\""
expect_eq "lease stored" "$(tcol "${T}_1" "lease_owner || ' ' || (lease_until > now() + interval '50 seconds')")" "A_$RUN true"
task_claim "B_$RUN" 1000 60000
expect_eq "a leased task is not claimed again" "$(mine)" "[]"
psql "$CONN" -X -At -q -c "SELECT llmgw_task_claim('', 1, 1)" >/dev/null 2>&1 && bad "claim without an owner" || ok


echo "== tasks: llmgw_task_update"
task_update "B_$RUN" "[{\"task_id\":\"${T}_1\",\"status\":\"IN_PROGRESS\",\"next_poll_ms\":0}]"
expect "another owner's update is skipped" ".applied == [] and .skipped == [\"${T}_1\"]"
task_update "A_$RUN" "[{\"task_id\":\"${T}_1\",\"status\":\"IN_PROGRESS\",\"progress\":\"50%\",\"poll_failures\":2,\"next_poll_ms\":0}]"
expect "the owner's update applies" ".applied == [\"${T}_1\"] and .skipped == []"
expect_eq "absent data and state are kept, lease released" \
    "$(tcol "${T}_1" "status || ' ' || progress || ' ' || poll_failures || ' ' || data::text || ' ' || state::text || ' ' || (lease_owner IS NULL) || ' ' || (lease_until IS NULL)")" \
    'IN_PROGRESS 50% 2 {"a": 1} {"s": 1} true true'
task_update "A_$RUN" "[{\"task_id\":\"${T}_1\",\"status\":\"IN_PROGRESS\"}]"
expect "a released lease no longer lets the old owner in" ".skipped == [\"${T}_1\"]"
task_update "" "[{\"task_id\":\"${T}_1\",\"status\":\"QUEUED\",\"state\":{\"s\":2},\"data\":null,\"upstream_task_id\":\"up2\",\"next_poll_ms\":120000}]"
expect "a NULL owner updates any task" ".applied == [\"${T}_1\"]"
expect_eq "state replaced, data cleared, next poll pushed" \
    "$(tcol "${T}_1" "state::text || ' ' || (data IS NULL) || ' ' || upstream_task_id || ' ' || (next_poll_at > now() + interval '100 seconds')")" \
    '{"s": 2} true up2 true'
psql "$CONN" -X -At -q -c "SELECT llmgw_task_update(NULL, '[{\"task_id\":\"${T}_1\",\"status\":\"DONE\"}]')" >/dev/null 2>&1 \
    && bad "update accepts an unknown status" || ok

# Exactly once: a second session waits on the row lock, then sees SUCCESS.
upd='[{"task_id":"'${T}_1'","status":"SUCCESS","final_quota":900,"usage":{"seconds":9},"data":{"url":"u"}}]'
psql "$CONN" -X -At -q -v b="$upd" -f - >/tmp/llmgw_upd1.$$ 2>&1 <<'EOF' &
BEGIN;
SELECT llmgw_task_update(NULL, :'b'::jsonb);
SELECT pg_sleep(0.5);
COMMIT;
EOF
p1=$!
sleep 0.2
psql "$CONN" -X -At -q -v b="$upd" -f - >/tmp/llmgw_upd2.$$ 2>&1 <<'EOF' &
SELECT llmgw_task_update(NULL, :'b'::jsonb);
EOF
p2=$!
wait $p1; wait $p2
a1=$(grep -c "\"applied\": \[\"${T}_1\"\]" /tmp/llmgw_upd1.$$ /tmp/llmgw_upd2.$$ | awk -F: '{s+=$2} END {print s}')
s1=$(grep -c "\"skipped\": \[\"${T}_1\"\]" /tmp/llmgw_upd1.$$ /tmp/llmgw_upd2.$$ | awk -F: '{s+=$2} END {print s}')
expect_eq "two concurrent SUCCESS updates: one applies" "$a1" 1
expect_eq "two concurrent SUCCESS updates: one is skipped" "$s1" 1
rm -f /tmp/llmgw_upd1.$$ /tmp/llmgw_upd2.$$
task_update "" "$upd"
expect "a repeated SUCCESS is skipped" ".applied == [] and .skipped == [\"${T}_1\"]"
expect_eq "one settle row, the delta to final_quota" "$(nlog "${T}_1" settle)" "1:-300"
expect_eq "settled task" "$(tcol "${T}_1" "status || ' ' || quota || ' ' || usage::text || ' ' || (finished_at IS NOT NULL) || ' ' || data::text")" \
    'SUCCESS 900 {"seconds": 9} true {"url": "u"}'

task_update "A_$RUN" "[{\"task_id\":\"${T}_5\",\"status\":\"FAILURE\",\"fail_reason\":\"vendor said no\"},{\"task_id\":\"${T}_4\",\"status\":\"SUCCESS\"},{\"task_id\":\"nope_$RUN\",\"status\":\"SUCCESS\"}]"
expect "batch update: applied and skipped" ".applied == [\"${T}_4\",\"${T}_5\"] and .skipped == [\"nope_$RUN\"]"
expect "update answers touched balances" ".tokens | has(\"$TT\") and has(\"$TTU\")"
expect_eq "FAILURE refunds the net charge" "$(nlog "${T}_5" refund)" "1:400"
expect_eq "FAILURE task" "$(tcol "${T}_5" "status || ' ' || quota || ' ' || fail_reason")" "FAILURE 0 vendor said no"
expect_eq "SUCCESS without final_quota settles 0" "$(nlog "${T}_4" settle)" "1:0"
expect_eq "SUCCESS without final_quota keeps the quota" "$(tcol "${T}_4" quota)" 100
task_update "" "[{\"task_id\":\"${T}_5\",\"status\":\"SUCCESS\",\"final_quota\":5}]"
expect "a FAILURE task cannot become SUCCESS" ".skipped == [\"${T}_5\"]"
expect_eq "no settle after a refund" "$(nlog "${T}_5" settle)" "0:0"

task_create "$(tj 7 '{"quota_reserve":50,"retain_result":false,"poll_interval_ms":60000}')"
expect_eq "retain_result false keeps data while running" "$(tcol "${T}_7" "data::text")" '{"a": 1}'
task_update "" "[{\"task_id\":\"${T}_7\",\"status\":\"SUCCESS\",\"data\":{\"url\":\"u\"},\"final_quota\":50}]"
expect_eq "retain_result false drops data at the end" "$(tcol "${T}_7" "status || ' ' || (data IS NULL)")" "SUCCESS true"


echo "== tasks: lease expiry and re-claim"
task_create "$(tj 6 '{"quota_reserve":10}')"
task_claim "A_$RUN" 1000 300
expect_eq "A claims with a short lease" "$(mine)" "[\"${T}_6\"]"
task_claim "B_$RUN" 1000 60000
expect_eq "B cannot take it while the lease runs" "$(mine)" "[]"
sleep 0.5
task_claim "B_$RUN" 1000 60000
expect_eq "B takes it after the lease expired" "$(mine)" "[\"${T}_6\"]"
task_update "A_$RUN" "[{\"task_id\":\"${T}_6\",\"status\":\"SUCCESS\",\"final_quota\":10}]"
expect "the dead poller's late update is skipped" ".skipped == [\"${T}_6\"]"
task_update "B_$RUN" "[{\"task_id\":\"${T}_6\",\"status\":\"IN_PROGRESS\",\"next_poll_ms\":0}]"
expect "the new owner's update applies" ".applied == [\"${T}_6\"]"


echo "== tasks: llmgw_task_release"
task_claim "A_$RUN" 1000 60000
expect_eq "A claims again" "$(mine)" "[\"${T}_6\"]"
task_release "B_$RUN" "[\"${T}_6\"]"
expect "release by another owner does nothing" '.released == []'
task_release "A_$RUN" "[\"${T}_6\",\"nope_$RUN\"]"
expect "release gives the lease back" ".released == [\"${T}_6\"]"
expect_eq "release changes nothing else" "$(tcol "${T}_6" "status || ' ' || (lease_owner IS NULL) || ' ' || (next_poll_at <= now())")" "IN_PROGRESS true true"
task_claim "B_$RUN" 1000 60000
expect_eq "a released task is claimed at once" "$(mine)" "[\"${T}_6\"]"


echo "== tasks: deadline"
task_create "$(tj 8 '{"quota_reserve":300,"quota_submit":350,"timeout_ms":1,"poll_interval_ms":60000}')"
sleep 0.05
task_claim "C_$RUN" 1000 60000
expect "a task past its deadline is expired, not claimed" ".expired >= 1 and ([.tasks[].task_id] | index(\"${T}_8\") == null)"
expect "expiry answers balances" ".tokens | has(\"$TT\")"
expect "expiry answers each balance with its revision (042)" \
    ".token_revs[\"$TT\"] == $(trev "$TT") and .user_revs[\"$TU\"] == $(urev "$TU") and .users[\"$TU\"] == $(sql "SELECT quota FROM users WHERE id = $TU")"
expect_eq "expired task" "$(tcol "${T}_8" "status || ' ' || fail_reason || ' ' || quota || ' ' || (finished_at IS NOT NULL)")" "FAILURE task timed out 0 true"
expect_eq "expiry refunds once" "$(nlog "${T}_8" refund)" "1:350"
task_claim "C_$RUN" 1000 60000
expect_eq "a second pass does not refund again" "$(nlog "${T}_8" refund)" "1:350"
# leased by a poller that died: still expires
task_create "$(tj 9 '{"quota_reserve":20}')"
task_claim "D_$RUN" 1000 600000
sql "UPDATE tasks SET deadline = now() - interval '1 second' WHERE task_id = '${T}_9'" >/dev/null
task_claim "E_$RUN" 1000 60000
expect_eq "a leased task past its deadline expires too" "$(tcol "${T}_9" "status || ' ' || (lease_owner IS NULL)")" "FAILURE true"
task_update "D_$RUN" "[{\"task_id\":\"${T}_9\",\"status\":\"SUCCESS\"}]"
expect "the old lease holder cannot settle it" ".skipped == [\"${T}_9\"]"


echo "== tasks: llmgw_task_lookup"
task_lookup "$TU" "[\"${T}_2\",\"$TX\",\"${T}_1\",\"nope_$RUN\",\"${T}_2\"]"
expect "lookup: own tasks in the order asked, others absent" "[.tasks[].task_id] == [\"${T}_2\",\"${T}_1\"]"
expect "lookup rows are full" ".tasks[1].upstream_task_id == \"up2\" and .tasks[1].quota == 900 and .tasks[1].status == \"SUCCESS\" and .tasks[0].data == null"
task_lookup "$TU2" "[\"$TX\",\"${T}_1\"]"
expect "lookup by the other user" "[.tasks[].task_id] == [\"$TX\"]"
task_lookup "$TU" '[]'
expect "lookup of nothing" '.tasks == []'


echo "== tasks: batches (sql/007: set-based path, row-by-row rest)"
api POST /user '' "{\"username\":\"tu3_$RUN\",\"quota\":100000}"
TU3=$(jq .body.id <<<"$ANS")
api POST /token '' "{\"user_id\":$TU3,\"remain_quota\":100000}"
TT3=$(jq .body.id <<<"$ANS")
tj3() { tj "$1" "$2" "$TT3" | jq -c --argjson u "$TU3" '.user_id = $u'; }
lease() { sql "UPDATE tasks SET lease_owner = '$1', lease_until = now() + interval '1 minute' WHERE task_id = '${T}_$2'" >/dev/null; }
for n in b1 b2 b3 b4 b5 b6 b7 b8; do
    task_create "$(tj3 "$n" '{"quota_reserve":100,"poll_interval_ms":60000}')"
    lease "F_$RUN" "$n"
done
lease "G_$RUN" b4

task_update "F_$RUN" '[]'
expect "an empty batch" '. == {"applied": [], "skipped": [], "tokens": {}, "users": {}}'

task_update "F_$RUN" "[{\"task_id\":\"${T}_b3\",\"status\":\"QUEUED\",\"progress\":\"30%\"},
                      {\"task_id\":\"${T}_b1\",\"status\":\"IN_PROGRESS\",\"state\":{\"s\":9},\"next_poll_ms\":120000},
                      {\"task_id\":\"${T}_b2\",\"poll_failures\":3,\"data\":null}]"
expect "a running batch: applied in task_id order" ". == {\"applied\": [\"${T}_b1\",\"${T}_b2\",\"${T}_b3\"], \"skipped\": [], \"tokens\": {}, \"users\": {}}"
expect_eq "a running batch: each row as 005 would set it" \
    "$(sql "SELECT string_agg(status || ' ' || progress || ' ' || state::text || ' ' || coalesce(data::text, '-') || ' ' || poll_failures || ' ' || (lease_owner IS NULL) || ' ' || round(extract(epoch FROM next_poll_at - updated_at)), ' | ' ORDER BY task_id) FROM tasks WHERE task_id IN ('${T}_b1', '${T}_b2', '${T}_b3')")" \
    'IN_PROGRESS 0% {"s": 9} {"a": 1} 0 true 120 | SUBMITTED 0% {"s": 1} - 3 true 15 | QUEUED 30% {"s": 1} {"a": 1} 0 true 15'
expect_eq "a running batch writes no ledger row" "$(sql "SELECT count(*) FROM logs WHERE request_id IN ('${T}_b1', '${T}_b2', '${T}_b3') AND type <> 'reserve'")" 0

task_update "F_$RUN" "[{\"task_id\":\"nope_$RUN\",\"status\":\"QUEUED\"},
                      {\"task_id\":\"${T}_b6\",\"status\":\"FAILURE\",\"fail_reason\":\"gone\"},
                      {\"task_id\":\"${T}_b4\",\"status\":\"QUEUED\"},
                      {\"task_id\":\"${T}_b5\",\"status\":\"SUCCESS\",\"final_quota\":70},
                      {\"task_id\":\"${T}_b7\",\"progress\":\"70%\"},
                      {\"task_id\":\"${T}_b1\",\"status\":\"QUEUED\"}]"
expect "a mixed batch: both lists in task_id order" ".applied == [\"${T}_b5\",\"${T}_b6\",\"${T}_b7\"] and .skipped == [\"nope_$RUN\",\"${T}_b1\",\"${T}_b4\"]"
expect "a mixed batch answers the balances it moved" ".tokens == {\"$TT3\": $(sql "SELECT remain_quota FROM tokens WHERE id = $TT3")} and .users == {\"$TU3\": $(sql "SELECT quota FROM users WHERE id = $TU3")}"
expect_eq "a mixed batch bills its terminal rows once" "$(nlog "${T}_b5" settle) $(nlog "${T}_b6" refund) $(tcol "${T}_b5" quota) $(tcol "${T}_b6" quota)" "1:-30 1:100 70 0"
expect_eq "a mixed batch: the running row and the skipped ones" \
    "$(tcol "${T}_b7" "status || ' ' || progress || ' ' || (lease_owner IS NULL)") $(tcol "${T}_b4" "status || ' ' || lease_owner")" \
    "SUBMITTED 70% true SUBMITTED G_$RUN"

task_update "" "[{\"task_id\":\"${T}_b8\",\"progress\":\"1\"},{\"task_id\":\"${T}_b8\",\"status\":\"QUEUED\",\"progress\":\"2\"}]"
expect "a task named twice, no owner: both apply, in order" ".applied == [\"${T}_b8\",\"${T}_b8\"] and .skipped == []"
expect_eq "a task named twice: the second update wins" "$(tcol "${T}_b8" "status || ' ' || progress")" "QUEUED 2"
lease "F_$RUN" b8
task_update "F_$RUN" "[{\"task_id\":\"${T}_b8\",\"progress\":\"3\"},{\"task_id\":\"${T}_b8\",\"progress\":\"4\"}]"
expect "a task named twice by its owner: the first releases the lease" ".applied == [\"${T}_b8\"] and .skipped == [\"${T}_b8\"]"
expect_eq "a task named twice by its owner: the first update stays" "$(tcol "${T}_b8" progress)" 3

lease "F_$RUN" b7
lease "F_$RUN" b8
psql "$CONN" -X -At -q -c "SELECT llmgw_task_update('F_$RUN', '[{\"task_id\":\"${T}_b7\",\"progress\":\"x\"},{\"task_id\":\"${T}_b8\",\"next_poll_ms\":-1}]')" >/dev/null 2>&1 \
    && bad "a batch with a bad number is accepted" || ok
psql "$CONN" -X -At -q -c "SELECT llmgw_task_update('F_$RUN', '[{\"task_id\":\"${T}_b8\",\"poll_failures\":1.5}]')" 2>&1 \
    | grep -q "poll_failures must be an integer >= 0, not 1.5" && ok || bad "a single update with a bad number raises 005's error"
expect_eq "a batch that raised changed nothing" "$(tcol "${T}_b7" "progress || ' ' || lease_owner") $(tcol "${T}_b8" "lease_owner")" "70% F_$RUN F_$RUN"

# Exactly once without a lock-first step: a running-status update that
# meets an uncommitted SUCCESS waits, then sees it and is skipped.
psql "$CONN" -X -At -q -v b="[{\"task_id\":\"${T}_b7\",\"status\":\"SUCCESS\",\"final_quota\":100}]" -f - >/tmp/llmgw_upd3.$$ 2>&1 <<'EOF' &
BEGIN;
SELECT llmgw_task_update(NULL, :'b'::jsonb);
SELECT pg_sleep(0.5);
COMMIT;
EOF
p1=$!
sleep 0.2
task_update "" "[{\"task_id\":\"${T}_b7\",\"status\":\"IN_PROGRESS\",\"progress\":\"late\"}]"
wait $p1
expect "a running update after a concurrent SUCCESS is skipped" ".applied == [] and .skipped == [\"${T}_b7\"]"
expect_eq "the concurrent SUCCESS stays" "$(tcol "${T}_b7" "status || ' ' || progress || ' ' || quota")" "SUCCESS 70% 100"
grep -q "\"applied\": \[\"${T}_b7\"\]" /tmp/llmgw_upd3.$$ && ok || bad "the SUCCESS update applied"
rm -f /tmp/llmgw_upd3.$$
# Two polls of one leased task at once: the first releases the lease, so
# the second is skipped.
psql "$CONN" -X -At -q -v b="[{\"task_id\":\"${T}_b8\",\"progress\":\"p1\"}]" -v o="F_$RUN" -f - >/tmp/llmgw_upd4.$$ 2>&1 <<'EOF' &
BEGIN;
SELECT llmgw_task_update(:'o', :'b'::jsonb);
SELECT pg_sleep(0.5);
COMMIT;
EOF
p1=$!
sleep 0.2
task_update "F_$RUN" "[{\"task_id\":\"${T}_b8\",\"progress\":\"p2\"}]"
wait $p1
expect "the second of two concurrent polls is skipped" ".applied == [] and .skipped == [\"${T}_b8\"]"
expect_eq "the first poll's update stays" "$(tcol "${T}_b8" progress)" p1
rm -f /tmp/llmgw_upd4.$$
expect_eq "token 3: used_quota == ledger sum" \
    "$(sql "SELECT used_quota FROM tokens WHERE id = $TT3")" \
    "$(sql "SELECT sum(CASE type WHEN 'refund' THEN -quota ELSE quota END) FROM logs WHERE token_id = $TT3")"


echo "== tasks: the ledger balances to the unit"
for tok in "$TT" "$TTU" "$TT2"; do
    expect_eq "token $tok: used_quota == ledger sum" \
        "$(sql "SELECT used_quota FROM tokens WHERE id = $tok")" \
        "$(sql "SELECT coalesce(sum(CASE type WHEN 'refund' THEN -quota WHEN 'error' THEN 0 ELSE quota END), 0) FROM logs WHERE token_id = $tok")"
done
expect_eq "limited token: remain + used == initial" "$(sql "SELECT remain_quota + used_quota FROM tokens WHERE id = $TT")" 500000
expect_eq "user: used_quota == its tokens' ledger" \
    "$(sql "SELECT used_quota FROM users WHERE id = $TU")" \
    "$(sql "SELECT sum(CASE type WHEN 'refund' THEN -quota WHEN 'error' THEN 0 ELSE quota END) FROM logs WHERE user_id = $TU")"
expect_eq "user: quota + used == initial" "$(sql "SELECT quota + used_quota FROM users WHERE id = $TU")" 1000000
# the run's task charges: 1:900 2:300 3:0 4:100 5:0 5b:0 5c:10 6:10 7:50 8:0 9:0 and fl: +50
expect_eq "token used is the sum of the settled charges" "$(sql "SELECT used_quota FROM tokens WHERE id = $TT")" $((900 + 300 + 10 + 10 + 50 + 50))
expect_eq "task quotas equal their ledger" \
    "$(sql "SELECT count(*) FROM tasks t WHERE task_id LIKE '${T}_%' AND quota <> (SELECT coalesce(sum(CASE type WHEN 'refund' THEN -quota ELSE quota END), 0) FROM logs l WHERE l.request_id = t.task_id)")" 0


echo "== tasks: /pricing"
api PUT /pricing '' '{"tp::video-x":{"unit_prices":{"seconds":0.1,"frames":0},"multipliers":{"resolution":{"720p":1,"1080p":1.5},"audio":{"true":2}}},"video-y":{"unit_prices":{"seconds":0.05},"multipliers":null}}'
expect "task pricing stored in normal form" '.status == 200 and .body["tp::video-x"] == {"unit_prices":{"seconds":0.1,"frames":0},"multipliers":{"resolution":{"720p":1,"1080p":1.5},"audio":{"true":2}}} and .body["video-y"] == {"unit_prices":{"seconds":0.05},"multipliers":{}}'
api PUT /pricing '' '{"tp::video-z":{"price":0.3}}'
expect "per-call price under a plugin key" '.status == 200 and .body["tp::video-z"] == {"price":0.3}'
api PUT /pricing '' '{"v":{"unit_prices":{}}}'
expect_err "unit_prices empty" 400 invalid_request "pricing.v.unit_prices: must be a non-empty object of usage field to USD per unit"
api PUT /pricing '' '{"v":{"unit_prices":[0.1]}}'
expect_err "unit_prices type" 400 invalid_request "pricing.v.unit_prices: must be a non-empty object of usage field to USD per unit"
api PUT /pricing '' '{"v":{"unit_prices":{"seconds":-0.1}}}'
expect_err "unit price negative" 400 invalid_request "pricing.v.unit_prices.seconds: must be a number >= 0"
api PUT /pricing '' '{"v":{"unit_prices":{"seconds":"1"}}}'
expect_err "unit price type" 400 invalid_request "pricing.v.unit_prices.seconds: must be a number >= 0"
api PUT /pricing '' '{"v":{"unit_prices":{"seconds":1},"multipliers":{"resolution":{"720p":-1}}}}'
expect_err "multiplier negative" 400 invalid_request "pricing.v.multipliers.resolution.720p: must be a number >= 0"
api PUT /pricing '' '{"v":{"unit_prices":{"seconds":1},"multipliers":{"resolution":2}}}'
expect_err "multiplier field type" 400 invalid_request "pricing.v.multipliers.resolution: must be a non-empty object of value to factor"
api PUT /pricing '' '{"v":{"unit_prices":{"seconds":1},"multipliers":[1]}}'
expect_err "multipliers type" 400 invalid_request "pricing.v.multipliers: must be an object of usage field to {value: factor}"
api PUT /pricing '' '{"v":{"price":1,"multipliers":{"a":{"b":1}}}}'
expect_err "multipliers without unit_prices" 400 invalid_request "pricing.v.multipliers: only allowed with unit_prices"
api PUT /pricing '' '{"v":{"price":1,"unit_prices":{"seconds":1}}}'
expect_err "unit_prices with price" 400 invalid_request "pricing.v: give only one of ratio, price or unit_prices"
api PUT /pricing '' '{"::v":{"price":1}}'
expect_err "plugin part empty" 400 invalid_request "pricing.::v: a task price key is <pluginKey>::<model>, both non-empty"
api PUT /pricing '' '{"tp::":{"price":1}}'
expect_err "model part empty" 400 invalid_request "pricing.tp::: a task price key is <pluginKey>::<model>, both non-empty"
api PUT /pricing '' '{"t-gpt":{"ratio":3}}'
expect "token pricing still works" '.status == 200 and .body["t-gpt"] == {"ratio":3,"completion_ratio":1,"cache_ratio":1,"cache_creation_ratio":1}'
ANS=$(sql "SELECT llmgw_snapshot()")
expect "snapshot carries task pricing" '.pricing["tp::video-x"].unit_prices.seconds == 0.1'
api PUT /pricing '' '{"tp::video-x":null,"video-y":null,"tp::video-z":null}'
expect "task prices can be removed" '.status == 200 and (.body | has("tp::video-x") or has("video-y") | not)'


echo "== tasks: channel bindings"
PV=tv_$RUN; PP=tpeer_$RUN; PN=tnew_$RUN
sql "INSERT INTO task_plugins (key, active_version) VALUES ('$PV', '1.0.0'), ('$PP', '2.0.0'), ('$PN', '1.0.0');
     INSERT INTO task_plugin_versions (key, version, sha, source, manifest) VALUES
       ('$PV', '1.0.0', 'sha-$PV', 'x', '{\"key\":\"$PV\",\"baseUrl\":\"https://vendor.example.com/api\",\"upstreams\":[\"vendor\"]}'),
       ('$PP', '1.0.0', 'sha-$PP-1', 'x', '{\"key\":\"$PP\",\"upstreams\":[\"vendor\"]}'),
       ('$PP', '2.0.0', 'sha-$PP-2', 'x', '{\"key\":\"$PP\",\"upstreams\":[\"vendor\",\"peer_gateway\"]}'),
       ('$PN', '1.0.0', 'sha-$PN', 'x', '{\"key\":\"$PN\",\"baseUrl\":\"\",\"upstreams\":[\"new_api\"]}')" >/dev/null
api POST /channel '' '{"type":61,"base_url":"https://v.example.com","models":["video-x"]}'
expect_err "type 61 without a plugin" 400 invalid_request "channel type 61 needs settings.task_plugin_key"
api POST /channel '' '{"type":61,"base_url":"https://v.example.com","models":["video-x"],"settings":{"task_plugin_key":""}}'
expect_err "type 61 with an empty plugin key" 400 invalid_request "channel type 61 needs settings.task_plugin_key"
api POST /channel '' '{"type":61,"base_url":"https://v.example.com","models":["video-x"],"settings":{"task_plugin_key":5}}'
expect_err "type 61 plugin key type" 400 invalid_request "settings.task_plugin_key: must be a non-empty string"
api POST /channel '' "{\"type\":61,\"base_url\":\"https://v.example.com\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"nope_$RUN\"}}"
expect_err "type 61 with an unknown plugin" 400 invalid_request "task plugin nope_$RUN is not installed"
api POST /channel '' "{\"type\":61,\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PV\"}}"
expect "type 61 without base_url takes the plugin's baseUrl" ".status == 200 and .body.base_url == \"https://vendor.example.com/api\" and .body.settings.task_plugin_key == \"$PV\""
C61=$(jq .body.id <<<"$ANS")
api POST /channel '' "{\"type\":61,\"base_url\":\"\",\"models\":[\"video-x\"],\"settings\":\"{\\\"task_plugin_key\\\":\\\"$PV\\\"}\"}"
expect "type 61 with an empty base_url (settings as a string)" '.status == 200 and .body.base_url == "https://vendor.example.com/api"'
api POST /channel '' "{\"type\":61,\"base_url\":\"https://own.example.com/v2/\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PV\"}}"
expect "type 61 keeps its own base_url" '.status == 200 and .body.base_url == "https://own.example.com/v2"'
api POST /channel '' "{\"type\":61,\"base_url\":\"\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PN\"}}"
expect_err "type 61: no base_url anywhere" 400 invalid_request "base_url: plugin $PN has no baseUrl, so the channel needs one"
api POST /channel '' "{\"type\":61,\"base_url\":\"ftp://x\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PV\"}}"
expect "type 61: a given base_url is still validated" '.status == 400 and (.message | startswith("base_url: must be"))'

api POST /channel '' "{\"type\":60,\"base_url\":\"https://peer.example.com\",\"models\":[\"video-x\"]}"
expect_err "type 60 without a plugin" 400 invalid_request "channel type 60 needs settings.task_plugin_key"
api POST /channel '' "{\"type\":60,\"base_url\":\"https://peer.example.com\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PV\"}}"
expect_err "type 60 with a vendor-only plugin" 400 invalid_request "plugin $PV does not allow peer gateway channels (meta.upstreams)"
api POST /channel '' "{\"type\":60,\"base_url\":\"https://peer.example.com\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PP\",\"task_extend_plugin_keys\":[\"$PN\"]}}"
expect "type 60 binds peer plugins (active version; new_api alias)" ".status == 200 and .body.settings.task_extend_plugin_keys == [\"$PN\"]"
C60=$(jq .body.id <<<"$ANS")
api POST /channel '' "{\"type\":60,\"base_url\":\"https://peer.example.com\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PP\",\"task_extend_plugin_keys\":[\"$PN\",\"$PV\"]}}"
expect_err "type 60 with a vendor-only extension" 400 invalid_request "plugin $PV does not allow peer gateway channels (meta.upstreams)"
api POST /channel '' "{\"type\":60,\"base_url\":\"https://peer.example.com\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PP\",\"task_extend_plugin_keys\":[\"nope_$RUN\"]}}"
expect_err "type 60 with an unknown extension" 400 invalid_request "task plugin nope_$RUN is not installed"
api POST /channel '' "{\"type\":60,\"base_url\":\"https://peer.example.com\",\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PP\",\"task_extend_plugin_keys\":\"$PN\"}}"
expect_err "type 60 extensions type" 400 invalid_request "settings.task_extend_plugin_keys: must be an array of plugin keys"
api POST /channel '' "{\"type\":60,\"models\":[\"video-x\"],\"settings\":{\"task_plugin_key\":\"$PP\"}}"
expect_err "type 60 still needs a base_url" 400 invalid_request "base_url: is required"
api POST /channel '' "{\"type\":1,\"base_url\":\"https://api.example.com\",\"models\":[\"m\"],\"settings\":{\"task_plugin_key\":\"nope\"}}"
expect "other types are not bound" '.status == 200'
CT1=$(jq .body.id <<<"$ANS")

api PATCH "/channel/$C61" '' "{\"settings\":{\"task_plugin_key\":\"nope_$RUN\"}}"
expect_err "PATCH to an unknown plugin" 400 invalid_request "task plugin nope_$RUN is not installed"
api PATCH "/channel/$C61" '' '{"base_url":"https://other.example.com"}'
expect "PATCH base_url of a type 61 channel" '.status == 200 and .body.base_url == "https://other.example.com"'
api PATCH "/channel/$C61" '' '{"base_url":""}'
expect "PATCH an empty base_url refills it" '.status == 200 and .body.base_url == "https://vendor.example.com/api"'
api PATCH "/channel/$CT1" '' '{"type":61,"settings":{}}'
expect_err "PATCH to type 61 without a plugin" 400 invalid_request "channel type 61 needs settings.task_plugin_key"
api PATCH "/channel/$CT1" '' '{"type":60}'
expect_err "PATCH to type 60 with settings naming no plugin" 400 invalid_request "task plugin nope is not installed"
api PATCH "/channel/$C60" '' "{\"settings\":{\"task_plugin_key\":\"$PV\"}}"
expect_err "PATCH a type 60 channel to a vendor-only plugin" 400 invalid_request "plugin $PV does not allow peer gateway channels (meta.upstreams)"
sql "DELETE FROM task_plugins WHERE key = '$PV'" >/dev/null
api PATCH "/channel/$C61" '' '{"status":"disabled","name":"orphan"}'
expect "a channel whose plugin is gone can still be disabled" '.status == 200 and .body.status == "disabled"'
api PATCH "/channel/$C61" '' '{"base_url":""}'
expect_err "but not refilled" 400 invalid_request "task plugin $PV is not installed"
api PATCH /channel/999999999 '' '{"type":61}'
expect_err "PATCH of an unknown channel" 404 not_found "channel 999999999 not found"

echo "== plugins: overlapping native routes conflict (016)"
# Every route carries the run's suffix in a literal segment, so plugins
# left by an earlier run on the same database never overlap these.
RA=ra_$RUN; RB=rb_$RUN
sql "INSERT INTO task_plugins (key, active_version) VALUES ('$RA', '1.0.0');
     INSERT INTO task_plugin_versions (key, version, sha, source, manifest) VALUES
       ('$RA', '1.0.0', 'sha-$RA', 'x', '{\"key\":\"$RA\",\"routes\":[
          {\"method\":\"POST\",\"path\":\"/$RA/submit_$RUN\"},
          {\"method\":\"GET\",\"path\":\"/$RA/q_$RUN/:task_id\"}]}')" >/dev/null
# conflict ROUTES: llmgw_plugin_conflict of plugin RB claiming ROUTES
conflict() {
    sql "SELECT coalesce(llmgw_plugin_conflict('$RB', '{\"routes\":$1}'), '-')"
}
# overlap_msg NEW OLD: the message for route NEW overlapping RA's route OLD
overlap_msg() {
    echo "route $1 overlaps route $2 of plugin $RA (one request path can match both)"
}
expect_eq "a parameter segment overlaps a literal one" \
    "$(conflict "[{\"method\":\"POST\",\"path\":\"/:x/submit_$RUN\"}]")" \
    "$(overlap_msg "POST /:x/submit_$RUN" "POST /$RA/submit_$RUN")"
expect_eq "so does a query route with parameters on both sides" \
    "$(conflict "[{\"method\":\"GET\",\"path\":\"/:x/q_$RUN/:id\"}]")" \
    "$(overlap_msg "GET /:x/q_$RUN/:id" "GET /$RA/q_$RUN/:task_id")"
expect_eq "a literal where the other has a parameter overlaps too" \
    "$(conflict "[{\"method\":\"GET\",\"path\":\"/$RA/q_$RUN/latest\"}]")" \
    "$(overlap_msg "GET /$RA/q_$RUN/latest" "GET /$RA/q_$RUN/:task_id")"
expect_eq "a doubled slash is not a segment" \
    "$(conflict "[{\"method\":\"POST\",\"path\":\"/$RA//submit_$RUN\"}]")" \
    "$(overlap_msg "POST /$RA//submit_$RUN" "POST /$RA/submit_$RUN")"
expect_eq "the same shape keeps its message (trailing slash)" \
    "$(conflict "[{\"method\":\"POST\",\"path\":\"/$RA/submit_$RUN/\"}]")" \
    "route POST /$RA/submit_$RUN is already served by plugin $RA"
expect_eq "the same shape keeps its message ({id} parameter)" \
    "$(conflict "[{\"method\":\"GET\",\"path\":\"/$RA/q_$RUN/{id}\"}]")" \
    "route GET /$RA/q_$RUN/: is already served by plugin $RA"
expect_eq "another method does not overlap" \
    "$(conflict "[{\"method\":\"PUT\",\"path\":\"/:x/submit_$RUN\"}]")" -
expect_eq "another segment count does not overlap" \
    "$(conflict "[{\"method\":\"POST\",\"path\":\"/:x/submit_$RUN/:y\"}]")" -
expect_eq "another literal does not overlap" \
    "$(conflict "[{\"method\":\"POST\",\"path\":\"/$RB/submit_$RUN\"}]")" -
RB_SRC="{\"key\":\"$RB\",\"version\":\"1.0.0\",\"routes\":[{\"method\":\"POST\",\"path\":\"/:x/submit_$RUN\"}]}"
ANS=$(sql "SELECT llmgw_plugin_upload(jsonb_build_object('manifest', '$RB_SRC'::jsonb, 'source', 'x', 'sha', 'sha-$RB', 'enabled', true))")
expect_err "an enabled upload of an overlapping route is refused" 409 conflict \
    "$(overlap_msg "POST /:x/submit_$RUN" "POST /$RA/submit_$RUN"); upload with force, or with enabled false"
ANS=$(sql "SELECT llmgw_plugin_upload(jsonb_build_object('manifest', '$RB_SRC'::jsonb, 'source', 'x', 'sha', 'sha-$RB', 'enabled', true, 'force', true))")
expect "forced, it is stored" ".status == 200 and .body.key == \"$RB\" and .body.enabled == true"
sql "UPDATE task_plugins SET enabled = false WHERE key = '$RA'" >/dev/null
expect_eq "a disabled plugin's routes do not conflict" \
    "$(conflict "[{\"method\":\"POST\",\"path\":\"/:x/submit_$RUN\"}]")" -
sql "DELETE FROM task_plugins WHERE key IN ('$RA', '$RB')" >/dev/null

echo "== plugins: force in the upload's query, the list paged (019)"
FA=fa_$RUN; FB=fb_$RUN
FA_SRC="{\"key\":\"$FA\",\"version\":\"1.0.0\",\"sortPriority\":5,\"routes\":[{\"method\":\"POST\",\"path\":\"/$FA/submit_$RUN\"}]}"
FB_SRC="{\"key\":\"$FB\",\"version\":\"1.0.0\",\"routes\":[{\"method\":\"POST\",\"path\":\"/:x/submit_$RUN\"}]}"
# upload MANIFEST SHA [EXTRA]: llmgw_plugin_upload with enabled true
upload() {
    ANS=$(sql "SELECT llmgw_plugin_upload(jsonb_build_object('manifest', '$1'::jsonb,
        'source', 'x', 'sha', '$2', 'enabled', true)${3:+ || '$3'::jsonb})")
}
upload "$FA_SRC" "sha-$FA"
expect "the first plugin is stored" ".status == 200 and .body.key == \"$FA\""
for q in 'force=0' 'force=yes' 'forced=1' ''; do
    upload "$FB_SRC" "sha-$FB" "{\"query\":\"$q\"}"
    expect "query \"$q\" does not force" '.status == 409 and .code == "conflict"'
done
upload "$FB_SRC" "sha-$FB" '{"query":"force=%FF"}'
expect_err "a query that is not UTF-8 once decoded" 400 invalid_request "query string is not valid UTF-8 once decoded"
upload "$FB_SRC" "sha-$FB" '{"query":"x=1&force=1","force":false}'
expect "?force=1 forces, whatever the body says" ".status == 200 and .body.key == \"$FB\" and .body.enabled == true and (.body | has(\"query\") | not)"
upload "$FB_SRC" "sha-$FB-2" '{"query":"force=true"}'
expect "?force=true forces another source under a stored version" ".status == 200 and .body.versions[0].sha == \"sha-$FB-2\""
upload "$FB_SRC" "sha-$FB-3"
expect "without force another source under a stored version is refused" \
    '.status == 409 and (.message | test("already stored with another source; raise the version, or upload with force$"))'

api GET /plugin/task 'page_size=1000'
plugins=$(sql "SELECT count(*) FROM task_plugins")
expect "the list answers items, total, page and page_size" \
    ".status == 200 and .body.total == $plugins and (.body.items | length) == $plugins and .body.page == 1 and .body.page_size == 1000"
all=$(jq -c '[.body.items[].key]' <<<"$ANS")
api GET /plugin/task
expect "page_size defaults to 50" '.status == 200 and .body.page_size == 50 and .body.page == 1'
paged='[]'
for n in $(seq 1 "$plugins"); do
    api GET /plugin/task/ "page=$n&page_size=1"
    paged=$(jq -c --argjson p "$paged" '$p + [.body.items[].key]' <<<"$ANS")
done
expect_eq "pages of one are the list in display order" "$paged" "$all"
api GET /plugin/task "page=$((plugins + 1))&page_size=1"
expect "a page past the end is empty" ".status == 200 and .body.items == [] and .body.total == $plugins"
api GET /plugin/task 'page_size=0'
expect_err "page_size is checked as on /user" 400 invalid_request "page_size: must be an integer between 1 and 1000"
api GET /plugin/task 'page=x'
expect_err "page is checked as on /user" 400 invalid_request "page: must be an integer >= 1"

echo "== plugin calls and /pricing refuse members they do not take (025)"
api PATCH "/plugin/task/$FA" '' '{"enabeld":true}'
expect_err "PATCH: an unknown member" 400 invalid_request "enabeld: unknown field (known: enabled, remark, force)"
api PATCH "/plugin/task/$FA" '' '{"force":"abc","enabled":true}'
expect_err "PATCH: force that is not a boolean" 400 invalid_request "force: must be true or false"
api PATCH "/plugin/task/$FA" '' '{"remark":5}'
expect_err "PATCH: a remark that is not a string" 400 invalid_request "remark: must be a string"
api POST "/plugin/task/$FA/activate" '' '{"version":"1.0.0","bogus":1}'
expect_err "activate: an unknown member" 400 invalid_request "bogus: unknown field (known: version, force)"
api DELETE "/plugin/task/$FA" '' '{"force":1}'
expect_err "DELETE: its body is read" 400 invalid_request "force: must be true or false"
api GET "/plugin/task/$FA"
expect "nothing changed" ".status == 200 and .body.key == \"$FA\""
api PUT /pricing '' '{"pm":{"price":1,"completion_ratio":4}}'
expect_err "a completion ratio next to a per-call price" 400 invalid_request "pricing.pm.completion_ratio: only with ratio (a per-token price); a per-call price or unit_prices has no completion_ratio"
api PUT /pricing '' '{"um":{"unit_prices":{"seconds":1},"cache_ratio":0}}'
expect_err "a cache ratio next to unit prices" 400 invalid_request "pricing.um.cache_ratio: only with ratio (a per-token price); a per-call price or unit_prices has no cache_ratio"
api PUT /pricing '' '{"pm":{"price":1,"completion_ratio":null}}'
expect "a null multiple counts as absent" '.status == 200 and .body.pm == {"price": 1}'
api PUT /pricing '' '{"pm":null}'
api DELETE /pricing
expect_err "a 405 names the path under /api" 405 method_not_allowed "method DELETE is not allowed on /api/pricing (allowed: GET, PUT)"

sql "DELETE FROM task_plugins WHERE key IN ('$FA', '$FB')" >/dev/null

echo "== what the admin API used to store or drop without a word (030)"
DU=$(sql "SELECT (llmgw_api('POST', '/user', '', '{\"username\":\"del-body-$RUN\"}') -> 'body' ->> 'id')")
api GET /token 'userid=1&page_size=1'
expect_err "a misspelt list filter is refused, not dropped" 400 invalid_request "userid: unknown query parameter (known: user_id, page, page_size)"
api GET /token 'user_id=1&page_size=1'
expect "the filters a list takes are taken" '.status == 200 and .body.page_size == 1'
api GET /user 'sort=id'
expect_err "GET /user takes page and page_size" 400 invalid_request "sort: unknown query parameter (known: page, page_size)"
api GET /plugin/task 'x=1'
expect_err "GET /plugin/task takes page and page_size" 400 invalid_request "x: unknown query parameter (known: page, page_size)"
api GET /pricing 'model=gpt-4o'
expect_err "a call without parameters takes none" 400 invalid_request "model: unknown query parameter (this call takes none)"
api PATCH "/user/$DU" 'quota=5' '{}'
expect_err "nor does a write" 400 invalid_request "quota: unknown query parameter (this call takes none)"
api PATCH "/plugin/task/$FA" 'forse=1' '{}'
expect_err "a plugin's PATCH takes force" 400 invalid_request "forse: unknown query parameter (known: force)"
api PUT /user 'x=1' '{}'
expect "a 405 still comes first" '.status == 405'
api GET /nosuch 'x=1'
expect "and a 404" '.status == 404'

for host in '-' 'a..b' '[:::]' '[1.2.3.4]' '1.2.3' '010.0.0.1' 'a.b..' '.a' '.' 'a-.b' \
            "$(printf 'a%.0s' $(seq 64)).com"; do
    api POST /channel '' "{\"type\":1,\"base_url\":\"http://$host/v1\",\"models\":[\"m\"]}"
    expect "base_url host $host is refused" '.status == 400 and (.message | startswith("base_url: "))'
done
api POST /channel '' '{"type":1,"base_url":"http://a..b","models":["m"]}'
expect_err "an empty label is named" 400 invalid_request "base_url: the host name a..b has an empty label"
api POST /channel '' '{"type":1,"base_url":"http://[:::]:8080","models":["m"]}'
expect_err "an IPv6 literal is checked" 400 invalid_request "base_url: [:::] is not an IPv6 address"
for host in '[::1]:8080' '[::ffff:10.0.0.1]' '10.0.0.1' 'my_llm:8000' 'api.example.com.' "$(printf 'a%.0s' $(seq 63)).example"; do
    api POST /channel '' "{\"type\":1,\"base_url\":\"http://$host\",\"models\":[\"m\"]}"
    expect "base_url host $host is taken" '.status == 200'
done
api POST /channel '' '{"type":987,"base_url":"http://x","models":["m"]}'
expect "an unknown channel type is stored as given" '.status == 200 and .body.type == 987'

LONG=$(printf 'x%.0s' $(seq 1025))
api POST /channel '' "{\"type\":1,\"base_url\":\"http://x\",\"models\":\"a, $LONG\"}"
expect_err "a channel's model name over 1024 bytes" 400 invalid_request "models: a model name has at most 1024 bytes (\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\" has 1025)"
api POST /token '' "{\"user_id\":$DU,\"models\":[\"$LONG\"]}"
expect "a key's model name over 1024 bytes" '.status == 400 and (.message | startswith("models: a model name has at most 1024 bytes"))'
api POST /channel '' "{\"type\":1,\"base_url\":\"http://x\",\"models\":[\"m\"],\"model_mapping\":{\"m\":\"$LONG\"}}"
expect "an upstream name over 1024 bytes" '.status == 400 and (.message | startswith("model_mapping.m: a model name has at most 1024 bytes"))'
api POST /channel '' '{"type":1,"base_url":"http://x","models":["m"],"model_mapping":{"m ":"up"}}'
expect_err "a mapped name with trailing whitespace" 400 invalid_request 'model_mapping: "m " has leading or trailing whitespace (model names are matched exactly)'
api POST /channel '' "{\"type\":1,\"base_url\":\"http://x\",\"models\":[\"$(printf 'y%.0s' $(seq 1024))\"]}"
expect "1024 bytes are taken" '.status == 200'
r0=$(rev)
api PUT /pricing '' "{\"ok-$RUN\":{\"ratio\":1},\"$LONG\":{\"ratio\":1}}"
expect "a price keyed over 1024 bytes" '.status == 400 and (.message | startswith("pricing: a model name has at most 1024 bytes"))'
api PUT /pricing '' '{" lead":{"ratio":1}}'
expect_err "a price key with leading whitespace" 400 invalid_request 'pricing: " lead" has leading or trailing whitespace (model names are matched exactly)'
api PUT /pricing '' '{"c\u0001m":{"ratio":1}}'
expect_err "a price key with a control character" 400 invalid_request 'pricing: "c\u0001m" must not contain control characters'
api PUT /pricing '' '{"p1":{"ratio":1e-400}}'
expect_err "a ratio that reads as 0" 400 invalid_request "pricing.p1.ratio: must be 0 or at least 1e-300 (a smaller number reads as 0)"
api PUT /pricing '' '{"p1":{"unit_prices":{"seconds":1e-301}}}'
expect_err "a unit price that reads as 0" 400 invalid_request "pricing.p1.unit_prices.seconds: must be 0 or at least 1e-300 (a smaller number reads as 0)"
api PUT /group '' '{"g1":{"ratio":5e-324}}'
expect_err "a group ratio that reads as 0" 400 invalid_request "group.g1.ratio: must be 0 or at least 1e-300 (a smaller number reads as 0)"
expect_eq "nothing stored" "$(rev)" "$r0"
api PUT /pricing '' '{"p1":{"ratio":1e-300,"completion_ratio":0}}'
expect "1e-300 and 0 are taken" '.status == 200 and .body.p1.completion_ratio == 0'
sql "UPDATE options SET value = value || '{\" stored-before \": {\"price\": 1}}' WHERE name = 'pricing'" >/dev/null
api PUT /pricing '' '{" stored-before ":null,"p1":null}'
expect "a price stored before the rule can be removed" '.status == 200 and (.body | has(" stored-before ") | not)'

api DELETE "/user/$DU" '' '{"force":true}'
expect_err "a DELETE of a user takes no members" 400 invalid_request "force: unknown field (a DELETE of a user takes none)"
api DELETE "/user/$DU" '' 'not json'
expect_err "a DELETE's body is JSON" 400 invalid_json "invalid JSON request body"
api DELETE "/user/$DU" '' '[]'
expect_err "a DELETE's body is an object" 400 invalid_json "request body must be a JSON object"
api GET "/user/$DU"
expect "nothing was deleted" '.status == 200'
api DELETE "/user/$DU" '' ' {} '
expect "an empty object is no member" '.status == 200 and .body.deleted == true'

echo "== upgrade: 014 trims channel keys stored before it"
# A scratch database migrated to 013 only (a copy of migrate.sh next to the
# first 13 files), a channel stored with a padded key, then the real
# migrate.sh: the key comes out trimmed and the change is announced.
UPDB=llmgw_upgrade_$RUN
UPDIR=$(mktemp -d)
if sql "CREATE DATABASE $UPDB" >/dev/null; then
    UPCONN="$CONN dbname=$UPDB"
    cp "$ROOT/sql/migrate.sh" "$UPDIR/"
    for f in "$ROOT"/sql/0[0-9][0-9]_*.sql; do
        case ${f##*/} in 01[4-9]_*|0[2-9]*) ;; *) cp "$f" "$UPDIR/" ;; esac
    done
    if sh "$UPDIR/migrate.sh" "$UPCONN" >/dev/null 2>&1; then
        ok
    else
        bad "migrating a scratch database to 013"
    fi
    up_id=$(psql "$UPCONN" -X -At -q -v ON_ERROR_STOP=1 -c \
        "SELECT (llmgw_api('POST', '/channel', '', json_build_object('type', 1,
            'base_url', 'https://api.example.com', 'models', json_build_array('m'),
            'key', E'  sk-padded\\n')::text)::jsonb -> 'body' ->> 'id')")
    expect_eq "the key is stored padded before 014" \
        "$(psql "$UPCONN" -X -At -c "SELECT key = E'  sk-padded\\n' FROM channels WHERE id = $up_id")" t
    up_user=$(psql "$UPCONN" -X -At -q -v ON_ERROR_STOP=1 -c \
        "SELECT (llmgw_api('POST', '/user', '', '{\"username\":\"short-ip\"}')::jsonb -> 'body' ->> 'id')")
    up_tok=$(psql "$UPCONN" -X -At -q -v ON_ERROR_STOP=1 -c \
        "SELECT (llmgw_api('POST', '/token', '', json_build_object('user_id', $up_user,
            'allow_ips', json_build_array('127/8', '10.1/16', '::1', '192.168.0.7'))::text)::jsonb -> 'body' ->> 'id')")
    rev0=$(psql "$UPCONN" -X -At -c "SELECT rev FROM config_revision WHERE id = 1")
    if sh "$ROOT/sql/migrate.sh" "$UPCONN" >/dev/null 2>&1; then ok; else bad "migrating 013 -> latest"; fi
    expect_eq "short IPv4 allow-list forms are written out in full (024)" \
        "$(psql "$UPCONN" -X -At -c "SELECT allow_ips::text FROM tokens WHERE id = $up_tok")" \
        '["127.0.0.0/8", "10.1.0.0/16", "::1", "192.168.0.7"]'
    expect_eq "the stored key is trimmed by 014" \
        "$(psql "$UPCONN" -X -At -c "SELECT key FROM channels WHERE id = $up_id")" sk-padded
    expect_eq "and the change is announced (config revision)" \
        "$(psql "$UPCONN" -X -At -c "SELECT rev > $rev0 FROM config_revision WHERE id = 1")" t
    sql "DROP DATABASE $UPDB" >/dev/null || bad "dropping $UPDB"
else
    bad "creating $UPDB"
fi
rm -rf "$UPDIR"

echo
echo "test_sql: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
