#!/usr/bin/env bash
# Stop what `make run` (and an interrupted `make test`) started.
# Tolerant: stopping what does not run is not an error.
#
#   scripts/stop.sh                nginx, then the plugin runtime helper,
#                                  then PostgreSQL (var/pg, var/test/pg)
#   scripts/stop.sh --nginx-only   nginx only
#   scripts/stop.sh --v8host-only  the helper only
#
# nginx: graceful quit (SIGQUIT to the master named in the pid file, the
# same as `nginx -s quit` without re-parsing the configuration), wait up to
# 10 s, then SIGTERM, then SIGKILL to the master's process group.
#
# helper (var/v8host.pid): SIGTERM to the supervisor (it stops its workers,
# giving a running call its deadline + 2 s), wait up to 15 s, then SIGKILL
# to its process group (run.sh starts it in its own session).  nginx goes
# first so that no request is cut off by a missing helper.
#
# Env: LLMGW_VAR (default <repo>/var), PGPORT_LLMGW (default 5433),
#      PGPORT_LLMGW_TEST (default 5434)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
VAR=${LLMGW_VAR:-$REPO/var}
PIDFILE=$VAR/nginx/logs/nginx.pid
V8PID=$VAR/v8host.pid
V8SOCK=$VAR/v8host.sock
nginx_only= v8host_only=
case "${1:-}" in
    --nginx-only) nginx_only=1 ;;
    --v8host-only) v8host_only=1 ;;
    '') ;;
    *) echo "usage: $0 [--nginx-only | --v8host-only]" >&2; exit 2 ;;
esac

alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

wait_gone() {   # pid tenths
    local i
    for ((i = 0; i < $2; i++)); do
        alive "$1" || return 0
        sleep 0.1
    done
    ! alive "$1"
}

stop_nginx() {
    local pid
    if [ ! -f "$PIDFILE" ]; then
        echo "stop: nginx not running (no $PIDFILE)"
        return 0
    fi
    pid=$(tr -dc 0-9 <"$PIDFILE")
    if [ -z "$pid" ] || ! alive "$pid" ||
       [[ "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" != *nginx* ]]; then
        echo "stop: nginx not running (stale $PIDFILE)"
        rm -f "$PIDFILE"
        return 0
    fi
    echo "stop: nginx quit (pid $pid)"
    kill -QUIT "$pid" 2>/dev/null || true
    if wait_gone "$pid" 100; then
        echo "stop: nginx stopped"
        return 0
    fi
    echo "stop: nginx still running after 10 s; SIGTERM" >&2
    kill -TERM "$pid" 2>/dev/null || true
    if wait_gone "$pid" 30; then
        echo "stop: nginx stopped"
        return 0
    fi
    echo "stop: nginx still running; SIGKILL to process group $pid" >&2
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 20 || { echo "stop: could not stop nginx $pid" >&2; return 1; }
    rm -f "$PIDFILE"
}

stop_helper() {
    local pid
    if [ ! -f "$V8PID" ]; then
        echo "stop: plugin runtime helper not running (no $V8PID)"
        return 0
    fi
    pid=$(tr -dc 0-9 <"$V8PID")
    if [ -z "$pid" ] || ! alive "$pid" ||
       [[ "$(readlink "/proc/$pid/exe" 2>/dev/null || true)" != *llmgw-v8host* ]]; then
        echo "stop: plugin runtime helper not running (stale $V8PID)"
        rm -f "$V8PID"
        return 0
    fi
    echo "stop: plugin runtime helper SIGTERM (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    if wait_gone "$pid" 150; then
        echo "stop: plugin runtime helper stopped"
        rm -f "$V8PID"
        return 0
    fi
    echo "stop: helper still running after 15 s; SIGKILL to process group $pid" >&2
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 20 || { echo "stop: could not stop the helper $pid" >&2; return 1; }
    # a killed supervisor leaves its pid file and socket behind
    rm -f "$V8PID" "$V8SOCK"
}

if [ -n "$v8host_only" ]; then
    stop_helper
    exit
fi

stop_nginx
[ -n "$nginx_only" ] && exit 0

# PostgreSQL is stopped even when the helper would not go.
rc=0
stop_helper || rc=1

if [ -d "$VAR/pg" ]; then
    "$SCRIPT_DIR/pg.sh" stop "$VAR" "${PGPORT_LLMGW:-5433}" "$VAR/pg-sock"
else
    echo "stop: no PostgreSQL under $VAR/pg"
fi
# A `make test` that was killed before its trap ran leaves its server up.
if [ -f "$VAR/test/pg/postmaster.pid" ]; then
    "$SCRIPT_DIR/pg.sh" stop "$VAR/test" "${PGPORT_LLMGW_TEST:-5434}"
fi
exit "$rc"
