#!/usr/bin/env bash
# Run llmgw locally: PostgreSQL + migrations + root token + the plugin
# runtime helper (v8_host) + nginx.
# (`make run` builds first; this script expects the module and the helper
# to exist.)
#
# Layout under var/ (kept between runs; `make stop` stops everything):
#   var/pg/            PostgreSQL data          var/pg-sock/   its socket
#   var/root-token     admin root token (48 hex chars, mode 600, made once)
#   var/nginx/conf/nginx.conf   rendered from conf/example.conf.in
#   var/nginx/logs/    error.log, access.log, nginx.pid
#   var/nginx/tmp/     temp folders (world-writable: workers run as nobody)
#   var/v8host.sock    the helper's socket (mode 0666: nginx workers connect)
#   var/v8host.pid     the helper supervisor's pid    var/v8host.log  its stderr
#
# The helper starts before nginx.  A running helper is kept, unless its
# binary was rebuilt since it started (then it is restarted; nginx reopens
# its connections by itself).  nginx is started, reloaded, or restarted when
# the module was rebuilt.  A reload the master refuses (its error.log says
# why, e.g. a port in use) fails the run, as does a port that does not
# answer as the gateway afterwards, with its configuration loaded from
# PostgreSQL, within 5 s.
#
# Env:
#   PORT           gateway listen port on 127.0.0.1 (default 8080)
#   PGPORT_LLMGW   PostgreSQL port (default 5433; Unix socket only)
#   LLMGW_VAR      var folder (default <repo>/var)
#   LLMGW_MODULE   module .so (default <repo>/build/nginx/ngx_http_llmgw_module.so)
#   NGINX          nginx binary (default /usr/sbin/nginx)
#   LLMGW_V8HOST   helper binary (default <repo>/build/v8host/llmgw-v8host)
#   V8HOST_WORKERS helper worker processes (default 4)
#   LLMGW_RESOLVER arguments of nginx's "resolver" directive (default the
#                  first nameserver of /etc/resolv.conf, else 127.0.0.1)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
mkdir -p "${LLMGW_VAR:-$REPO/var}"
VAR=$(cd "${LLMGW_VAR:-$REPO/var}" && pwd)
PORT=${PORT:-8080}
PGPORT=${PGPORT_LLMGW:-5433}
PGSOCK=$VAR/pg-sock
MODULE=${LLMGW_MODULE:-$REPO/build/nginx/ngx_http_llmgw_module.so}
NGINX=${NGINX:-/usr/sbin/nginx}
PREFIX=$VAR/nginx
CONF=$PREFIX/conf/nginx.conf
PIDFILE=$PREFIX/logs/nginx.pid
TEMPLATE=$REPO/conf/example.conf.in
CONNINFO="host=$PGSOCK port=$PGPORT dbname=llmgw user=postgres"
HELPER=${LLMGW_V8HOST:-$REPO/build/v8host/llmgw-v8host}
V8SOCK=$VAR/v8host.sock
V8PID=$VAR/v8host.pid
V8LOG=$VAR/v8host.log
V8WORKERS=${V8HOST_WORKERS:-4}

die() { echo "run: $*" >&2; exit 1; }

[ -f "$MODULE" ] || die "module not built: $MODULE (run 'make build')"
MODULE=$(cd "$(dirname "$MODULE")" && pwd)/$(basename "$MODULE")
[ -x "$NGINX" ] || die "nginx not found at $NGINX (run 'make deps')"
[ -f "$TEMPLATE" ] || die "missing $TEMPLATE"
[ -x "$HELPER" ] || die "plugin runtime helper not built: $HELPER (run 'make build')"
HELPER=$(cd "$(dirname "$HELPER")" && pwd)/$(basename "$HELPER")
# sun_path holds 107 bytes and a NUL
[ "${#V8SOCK}" -le 107 ] || die "helper socket path too long (${#V8SOCK} > 107 bytes): $V8SOCK; set LLMGW_VAR to a shorter folder"

# --- PostgreSQL ----------------------------------------------------------
"$SCRIPT_DIR/pg.sh" start "$VAR" "$PGPORT" "$PGSOCK"

psql_admin() { psql -X -q -v ON_ERROR_STOP=1 "host=$PGSOCK port=$PGPORT dbname=postgres user=postgres" "$@"; }
if [ "$(psql_admin -Atc "select 1 from pg_database where datname = 'llmgw'")" != 1 ]; then
    echo "run: createdb llmgw"
    psql_admin -c "create database llmgw"
fi

MIGRATE=$REPO/sql/migrate.sh
[ -f "$MIGRATE" ] || die "missing $MIGRATE"
echo "run: migrations"
bash "$MIGRATE" "$CONNINFO"

# --- root token ----------------------------------------------------------
TOKEN_FILE=$VAR/root-token
if [ ! -s "$TOKEN_FILE" ]; then
    (umask 077; od -An -tx1 -N24 /dev/urandom | tr -d ' \n' >"$TOKEN_FILE.tmp")
    mv "$TOKEN_FILE.tmp" "$TOKEN_FILE"
    echo "run: created $TOKEN_FILE"
fi
chmod 600 "$TOKEN_FILE"
TOKEN=$(tr -d '[:space:]' <"$TOKEN_FILE")
[ -n "$TOKEN" ] || die "$TOKEN_FILE is empty"
case "$TOKEN" in *[!A-Za-z0-9._~+/=-]*) die "$TOKEN_FILE holds unexpected characters" ;; esac
TOKEN_SHA=$(printf '%s' "$TOKEN" | sha256sum | cut -d' ' -f1)
psql -X -q -v ON_ERROR_STOP=1 "$CONNINFO" -Atc "select llmgw_admin_token_set('$TOKEN_SHA')" >/dev/null

# --- plugin runtime helper (v8_host) ---------------------------------------
# The supervisor writes its pid file after it listens; its workers accept on
# that socket, so a connection made before they are up just waits.
alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

helper_pid() {   # the live supervisor named in the pid file, or nothing
    local pid
    [ -f "$V8PID" ] || return 0
    pid=$(tr -dc 0-9 <"$V8PID")
    [ -n "$pid" ] && alive "$pid" || return 0
    case "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" in
        *llmgw-v8host*) echo "$pid" ;;
    esac
}

helper_stale() {   # the running helper is older than its binary
    local pid=$1
    # a rebuilt binary replaced by the linker shows up as "(deleted)"
    case "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" in
        *" (deleted)") return 0 ;;
    esac
    [ "$HELPER" -nt "$V8PID" ]
}

start_helper() {
    local pid i
    rm -f "$V8PID"
    mkdir -p "$(dirname "$V8LOG")"
    echo "--- $(date -u '+%Y-%m-%dT%H:%M:%SZ') run.sh: starting $HELPER" >>"$V8LOG"
    # Its own session: no terminal, and `make run` returning does not end it.
    setsid nohup "$HELPER" --socket "$V8SOCK" --workers "$V8WORKERS" \
        --pidfile "$V8PID" </dev/null >/dev/null 2>>"$V8LOG" &
    for i in $(seq 1 100); do
        pid=$(helper_pid)
        if [ -n "$pid" ] && [ -S "$V8SOCK" ]; then
            return 0
        fi
        sleep 0.1
    done
    tail -n 20 "$V8LOG" >&2 2>/dev/null || true
    die "the plugin runtime helper did not start (log: $V8LOG)"
}

v8pid=$(helper_pid)
if [ -z "$v8pid" ]; then
    echo "run: starting the plugin runtime helper"
    start_helper
elif helper_stale "$v8pid"; then
    echo "run: helper rebuilt since it started: restarting it (pid $v8pid)"
    "$SCRIPT_DIR/stop.sh" --v8host-only
    start_helper
else
    echo "run: plugin runtime helper running (pid $v8pid): kept"
fi
v8pid=$(helper_pid)

# --- nginx configuration -------------------------------------------------
mkdir -p "$PREFIX/conf" "$PREFIX/logs" "$PREFIX/tmp"
for d in client_body proxy fastcgi uwsgi scgi; do
    mkdir -p "$PREFIX/tmp/$d"
done
chmod 0777 "$PREFIX/tmp" "$PREFIX"/tmp/*
chmod 0755 "$VAR" "$PREFIX" "$PREFIX/conf" "$PREFIX/logs"

# nginx's resolver does not read /etc/resolv.conf: take its first
# nameserver that the directive can name (IPv6 in brackets; a zone such as
# fe80::1%eth0 cannot be written), else 127.0.0.1 as the C library does.
if [ -n "${LLMGW_RESOLVER:-}" ]; then
    RESOLVER=$LLMGW_RESOLVER RESOLVER_FROM='$LLMGW_RESOLVER'
    case "$RESOLVER" in
        *[\;\{\}\#\"\'\\$'\n']*) die "LLMGW_RESOLVER holds characters nginx.conf cannot take: $RESOLVER" ;;
    esac
else
    RESOLVER=$(awk '$1 == "nameserver" && $2 ~ /^[0-9A-Fa-f:.]+$/ {
                        print ($2 ~ /:/ ? "[" $2 "]" : $2); exit
                    }' /etc/resolv.conf 2>/dev/null || true)
    RESOLVER_FROM=/etc/resolv.conf
    if [ -z "$RESOLVER" ]; then
        RESOLVER=127.0.0.1 RESOLVER_FROM="no nameserver in /etc/resolv.conf"
    fi
fi

# Escape for the replacement side of sed s|...|...|.
sed_esc() { printf '%s' "$1" | sed -e 's/[\\|&]/\\&/g'; }
{
echo "# Generated by scripts/run.sh from conf/example.conf.in; edits are overwritten."
sed -e '/^##/d' \
    -e "s|@MODULE@|$(sed_esc "$MODULE")|g" \
    -e "s|@VAR@|$(sed_esc "$VAR")|g" \
    -e "s|@PORT@|$(sed_esc "$PORT")|g" \
    -e "s|@PGSOCK@|$(sed_esc "$PGSOCK")|g" \
    -e "s|@PGPORT@|$(sed_esc "$PGPORT")|g" \
    -e "s|@RESOLVER@|$(sed_esc "$RESOLVER")|g" \
    "$TEMPLATE"
} >"$CONF.tmp"
if grep -n '@[A-Z]*@' "$CONF.tmp" >&2; then
    die "unreplaced placeholders in $CONF.tmp"
fi
if ! "$NGINX" -p "$PREFIX/" -c "$CONF.tmp" -t -q; then
    die "nginx -t failed for $CONF.tmp"
fi
# The previous file stays until the running master has taken the new one.
if [ -f "$CONF" ]; then
    cp -p "$CONF" "$CONF.prev"
fi
mv "$CONF.tmp" "$CONF"

ngx() { "$NGINX" -p "$PREFIX/" -c "$CONF" "$@"; }

# --- start or reload nginx -------------------------------------------------
master_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 0
    pid=$(tr -dc 0-9 <"$PIDFILE")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    case "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" in
        *nginx*) echo "$pid" ;;
    esac
}

start_nginx() {
    rm -f "$PIDFILE"
    if ! ngx; then
        tail -n 20 "$PREFIX/logs/error.log" >&2 2>/dev/null || true
        die "nginx failed to start"
    fi
    for _ in $(seq 1 50); do
        [ -n "$(master_pid)" ] && return 0
        sleep 0.1
    done
    tail -n 20 "$PREFIX/logs/error.log" >&2 2>/dev/null || true
    die "nginx did not write $PIDFILE"
}

URL=http://127.0.0.1:$PORT
ERRLOG=$PREFIX/logs/error.log

# GET without a key: llmgw answers with its JSON error naming a request id,
# and the same id in a response header (X-Request-Id unless
# llmgw_request_id_header renames it); prints the error's code.  A worker
# answers "invalid_token" once it has loaded its configuration from
# PostgreSQL, "service_unavailable" before.
gateway_code() {
    local out id
    out=$(curl -s -m 2 -D - -A llmgw-run-check "$URL/v1/models" 2>/dev/null |
          tr -d '\r') || return 1
    id=$(printf '%s\n' "$out" |
         sed -n '/"type":"gateway_error"/s/.*(request id: \([0-9a-f]\{1,\}\)).*/\1/p' |
         head -n 1)
    [ -n "$id" ] && printf '%s\n' "$out" | grep -qi "^[a-z0-9-]*: $id\$" || return 1
    printf '%s\n' "$out" | sed -n 's/.*"code":"\([a-z_]*\)".*/\1/p' | head -n 1
}

check_gateway() {
    local code=
    for _ in $(seq 1 50); do
        code=$(gateway_code) || code=
        [ "$code" = invalid_token ] && return 0
        sleep 0.1
    done
    if [ -n "$code" ]; then
        tail -n 20 "$ERRLOG" >&2 2>/dev/null || true
        die "llmgw on $URL answers \"$code\" after 5 s: it has not loaded its configuration from PostgreSQL (see $ERRLOG)"
    fi
    echo "run: GET $URL/v1/models:" >&2
    curl -s -m 2 -i "$URL/v1/models" 2>&1 | head -n 20 >&2 || true
    die "$URL does not answer as llmgw (another program on port $PORT?)"
}

# The outcome of a reload as the master logs it after $1 (a byte offset of
# error.log): "ok" once it starts workers with the new configuration,
# "failed" on an [emerg] that ends the attempt.  A port in use is retried
# for 2.5 s (five "(98: Address already in use)" lines, then "still could
# not bind()"), so only that retried line does not end it.
reload_outcome() {
    tail -c +"$(($1 + 1))" "$ERRLOG" 2>/dev/null | awk -v m="] $2#" '
        index($0, m) == 0 { next }
        /: start worker processes$/ { print "ok"; exit }
        /\[emerg\]/ && !/\(98: Address already in use\)$/ { print "failed"; exit }'
}

# $CONF stays what the running master uses.
restore_conf() {
    if [ -f "$CONF.prev" ]; then
        mv "$CONF.prev" "$CONF"
    fi
}

reload_nginx() {
    local pid=$1 off out outcome=
    off=$(stat -c %s "$ERRLOG" 2>/dev/null || echo 0)
    if ! out=$(ngx -s reload 2>&1); then
        echo "$out" >&2
        restore_conf
        die "nginx reload failed"
    fi
    # The signal is all that `nginx -s reload` does: the master applies the
    # configuration later and, when it cannot (a port in use, a zone that
    # does not fit), logs why and keeps running the previous one.
    for _ in $(seq 1 100); do
        outcome=$(reload_outcome "$off" "$pid")
        [ -n "$outcome" ] && break
        sleep 0.1
    done
    case "$outcome" in
        ok) ;;
        failed)
            tail -c +"$((off + 1))" "$ERRLOG" | grep -E '\[(emerg|alert|crit)\]' >&2 || true
            restore_conf
            die "nginx (pid $pid) refused the configuration for 127.0.0.1:$PORT and runs the previous one (lines above, from $ERRLOG)" ;;
        *)
            # error_log above "notice" hides the outcome; the check of the
            # port below still tells.
            echo "run: $ERRLOG does not show the reload's outcome within 10 s" >&2 ;;
    esac
}

pid=$(master_pid)
if [ -z "$pid" ]; then
    echo "run: starting nginx"
    start_nginx
elif [ "$MODULE" -nt "$PIDFILE" ]; then
    # A reload keeps the already-loaded .so (dlopen of the same path returns
    # the same handle), so a rebuilt module needs a real restart.
    echo "run: module rebuilt since nginx started: restarting nginx (pid $pid)"
    "$SCRIPT_DIR/stop.sh" --nginx-only
    start_nginx
else
    # Also when PORT changed: a reload binds the new port before it lets go
    # of the old one, so a port that turns out to be taken leaves the
    # gateway serving on its previous port (and in-flight streams finish),
    # where a stop and start would leave nothing running.
    echo "run: nginx running (pid $pid): reload"
    reload_nginx "$pid"
fi
rm -f "$CONF.prev"
check_gateway

v8pid=$(helper_pid)
if [ -n "$v8pid" ]; then
    v8workers=$(pgrep -P "$v8pid" 2>/dev/null | tr '\n' ' ' | sed 's/ $//' || true)
    v8state="running (pid $v8pid, workers: ${v8workers:-starting}), socket $V8SOCK"
else
    v8state="NOT running (see $V8LOG): plugin uploads, dry runs and hooks answer 502/503"
fi
cat <<EOT

llmgw is running: $URL   (master pid $(master_pid))
  config  $CONF
  logs    $PREFIX/logs/error.log  $PREFIX/logs/access.log
  v8host  $v8state
          log $V8LOG
  db      psql "$CONNINFO"
  token   $TOKEN_FILE
  dns     resolver $RESOLVER  ($RESOLVER_FROM)
  stop    make stop

Next: the Quick start in README.md (a first chat completion through a local
stand-in upstream), which begins with these two lines:

GW=$URL
ROOT=\$(cat $TOKEN_FILE)
EOT
