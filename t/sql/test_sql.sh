#!/usr/bin/env bash
# Exercises sql/migrate.sh and every function of sql/001_core.sql against a
# scratch database.
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
expect_err "wrong method" 405 method_not_allowed "method DELETE is not allowed on /pricing (allowed: GET, PUT)"
expect "405 carries allow" '.allow == "GET, PUT"'
api PUT /user
expect "PUT /user is 405" '.status == 405 and .allow == "GET, POST"'
api POST /user/1 '' '{}'
expect "POST /user/1 is 405" '.status == 405 and .allow == "GET, PATCH, DELETE"'
api POST /log
expect "POST /log is 405" '.status == 405'
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
api POST /user '' "{\"username\":\"$U1\",\"quota\":100000,\"group\":\"vip\",\"ignored\":1}"
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
api PATCH "/user/$UID1" '' '{"quota":5000,"status":"disabled","group":"default","used_quota":7}'
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
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[\" 1.2.3.4\"]}"
expect_err "ip with space" 400 invalid_request 'allow_ips[0]: " 1.2.3.4" is not an IP address or CIDR'
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":[5]}"
expect_err "ip not a string" 400 invalid_request 'allow_ips[0]: must be a string'
api POST /token '' "{\"user_id\":$UID1,\"allow_ips\":\"1.2.3.4\"}"
expect_err "allow_ips not an array" 400 invalid_request 'allow_ips: must be an array of IP addresses or CIDRs, or null'
api POST /token '' "{\"user_id\":$UID1,\"models\":\"gpt-4o\"}"
expect_err "models not an array" 400 invalid_request 'models: must be an array of strings'
api POST /token '' "{\"user_id\":$UID1,\"models\":[\"a\",\"\"]}"
expect_err "models empty entry" 400 invalid_request 'models[1]: must be a non-empty string'
api POST /token '' "{\"user_id\":$UID1,\"expired_time\":0}"
expect_err "expired_time 0" 400 invalid_request 'expired_time: must be -1 (never expires) or a positive unix time in seconds'
api POST /token '' "{\"user_id\":$UID1,\"expired_time\":-5}"
expect "expired_time -5" '.status == 400 and (.message | startswith("expired_time:"))'
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
api PATCH "/token/$TID1" '' '{"name":"renamed","remain_quota":60000,"models":null,"allow_ips":["127.0.0.1"],"status":"disabled","key":"sk-evil","user_id":1}'
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
expect_err "weight negative" 400 invalid_request "weight: must be an integer >= 0"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"model_mapping":"{bad"}'
expect_err "mapping not JSON" 400 invalid_request "model_mapping: must be a JSON object (or a string holding one)"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"model_mapping":{"a":5}}'
expect_err "mapping values" 400 invalid_request "model_mapping.a: must be a non-empty string"
api POST /channel '' '{"type":1,"base_url":"https://x","models":["a"],"settings":[1]}'
expect_err "settings type" 400 invalid_request "settings: must be a JSON object (or a string holding one)"

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
expect "snapshot groups has default" '.groups.default.ratio != null and (.groups.default | has("deprecated"))'
expect "snapshot shape" '(. | keys) == ["admin_hashes","channels","groups","plugins","pricing","rate_limit","revision"]'

r0=$(rev)
api DELETE "/channel/$CID1"
expect "delete channel" ".status == 200 and .body == {\"id\": $CID1, \"deleted\": true}"
expect_eq "DELETE /channel bumps" "$(rev)" $((r0 + 1))
api GET "/channel/$CID1"
expect_err "deleted channel is gone" 404 not_found "channel $CID1 not found"
ANS=$(sql "SELECT llmgw_snapshot()")
expect "snapshot leaves out deleted channels" "[.channels[].id] | index($CID1) == null"


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
api PUT /pricing '' '{"gpt-4o":{"ratio":1,"price":1}}'
expect_err "pricing both" 400 invalid_request "pricing.gpt-4o: give either ratio or price, not both"
api PUT /pricing '' '{"gpt-4o":{}}'
expect_err "pricing neither" 400 invalid_request "pricing.gpt-4o: needs ratio (per token) or price (per call)"
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
api PUT /rate_limit '' '{"default":{"duration_minutes":1,"total":60,"success":30},"groups":{"vip":{"duration_minutes":5,"total":1000},"free":{"duration_minutes":0,"total":0,"success":0}},"x":1}'
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
expect_err "log type value" 400 invalid_request "type: must be one of consume, refund, error, reserve"
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


echo
echo "test_sql: $PASS passed, $FAIL failed"
[ "$FAIL" -eq 0 ]
