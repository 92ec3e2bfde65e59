#!/usr/bin/env bash
# A private PostgreSQL server on a Unix socket only.
#
#   scripts/pg.sh start  <dir> <port> [<sockdir>]
#   scripts/pg.sh stop   <dir> <port> [<sockdir>]
#   scripts/pg.sh status <dir> <port> [<sockdir>]
#
# Data in <dir>/pg (initdb on first use: trust auth, superuser "postgres",
# --no-sync), socket in <sockdir> (default <dir>/sock), server log in
# <dir>/pg/server.log.  No TCP listener (listen_addresses=''), fsync off.
#
# The socket dir is mode 0755 and every folder from / down to it is made
# traversable (o+x), because the postgres server and the nginx workers
# (user nobody when the master runs as root without a `user` directive)
# must both reach it.
#
# Connect with:  psql "host=<sockdir> port=<port> user=postgres dbname=..."
#
# Env: PGBIN  PostgreSQL bin dir; default the newest /usr/lib/postgresql/*/bin
#      PG_MAX_CONNECTIONS  default 200
set -euo pipefail

usage() { echo "usage: $0 {start|stop|status} <dir> <port> [<sockdir>]" >&2; exit 2; }
[ $# -ge 3 ] || usage
cmd=$1
PORT=$3
case "$PORT" in ''|*[!0-9]*) echo "pg: bad port '$PORT'" >&2; exit 2 ;; esac
if [ "$cmd" != start ] && [ ! -d "$2" ]; then
    echo "pg: not running ($2 does not exist)"
    [ "$cmd" = status ] && exit 3
    exit 0
fi
mkdir -p "$2"
DIR=$(cd "$2" && pwd)
SOCK=${4:-$DIR/sock}
[ "$cmd" = start ] && mkdir -p "$SOCK"
case "$SOCK" in /*) ;; *) SOCK=$PWD/$SOCK ;; esac
[ -d "$SOCK" ] && SOCK=$(cd "$SOCK" && pwd)
DATA=$DIR/pg
LOG=$DATA/server.log

if [ -z "${PGBIN:-}" ]; then
    PGBIN=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi
if [ -z "${PGBIN:-}" ] || [ ! -x "$PGBIN/pg_ctl" ]; then
    echo "pg: PostgreSQL server binaries not found (run 'make deps'; or set PGBIN)" >&2
    exit 1
fi

IS_ROOT=
[ "$(id -u)" -eq 0 ] && IS_ROOT=1

# Run a command as the postgres OS user (initdb and postgres refuse root).
as_pg() {
    if [ -n "$IS_ROOT" ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# Make every folder from / down to $1 traversable by others.
make_traversable() {
    local p=$1 cur=
    local IFS=/
    # shellcheck disable=SC2086
    set -- $p
    for part in "$@"; do
        [ -n "$part" ] || continue
        cur=$cur/$part
        if [ -d "$cur" ] && [ "$(( 0$(stat -c %a "$cur") & 01 ))" -eq 0 ]; then
            if [ -n "$IS_ROOT" ] || [ -O "$cur" ]; then
                echo "pg: chmod o+x $cur (the postgres server and nginx workers must reach $SOCK)"
                chmod o+x "$cur"
            else
                echo "pg: warning: $cur is not traversable by other users" >&2
            fi
        fi
    done
}

# Is $1 a live (not zombie) process?  An exited, daemonized postmaster can
# stay a zombie until init reaps it.
alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# pid of the running postmaster for $DATA, empty if none.
running_pid() {
    local pidfile=$DATA/postmaster.pid pid
    [ -f "$pidfile" ] || return 0
    pid=$(head -n 1 "$pidfile" 2>/dev/null || true)
    case "$pid" in ''|*[!0-9]*) return 0 ;; esac
    if alive "$pid" && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null || true)" = "$DATA" ]; then
        echo "$pid"
    fi
}

# Line 4 of postmaster.pid is the port, line 5 the socket dir.
running_port() { sed -n 4p "$DATA/postmaster.pid" 2>/dev/null || true; }
running_sock() { sed -n 5p "$DATA/postmaster.pid" 2>/dev/null || true; }

do_stop() {
    local pid
    pid=$(running_pid)
    if [ -z "$pid" ]; then
        echo "pg: not running ($DATA)"
        return 0
    fi
    as_pg "$PGBIN/pg_ctl" -D "$DATA" -m fast -w -t 30 stop >/dev/null 2>&1 || true
    # pg_ctl can fail if the data dir vanished; make sure the process is gone.
    for _ in $(seq 1 100); do
        alive "$pid" || { echo "pg: stopped ($DATA)"; return 0; }
        sleep 0.1
    done
    echo "pg: postmaster $pid did not stop in 10 s; sending SIGQUIT" >&2
    kill -QUIT "$pid" 2>/dev/null || true
    sleep 1
    alive "$pid" && { echo "pg: postmaster $pid still alive" >&2; return 1; }
    echo "pg: stopped ($DATA)"
}

do_start() {
    if [ -n "$IS_ROOT" ]; then
        id postgres >/dev/null 2>&1 || { echo "pg: no 'postgres' OS user (run 'make deps')" >&2; exit 1; }
    fi
    mkdir -p "$DATA" "$SOCK"
    make_traversable "$SOCK"
    make_traversable "$DIR"
    if [ -n "$IS_ROOT" ]; then
        chown postgres:postgres "$DATA" "$SOCK"
    fi
    chmod 0700 "$DATA"
    chmod 0755 "$SOCK"

    local pid
    pid=$(running_pid)
    if [ -n "$pid" ]; then
        if [ "$(running_port)" = "$PORT" ] && [ "$(running_sock)" = "$SOCK" ]; then
            echo "pg: already running (pid $pid, $SOCK port $PORT)"
            wait_ready
            return 0
        fi
        echo "pg: running with another port/socket ($(running_sock) port $(running_port)); restarting"
        do_stop
    fi

    if [ ! -f "$DATA/PG_VERSION" ]; then
        if [ -n "$(ls -A "$DATA" 2>/dev/null)" ]; then
            echo "pg: $DATA has no PG_VERSION (failed initdb?); wiping it"
            find "$DATA" -mindepth 1 -delete
        fi
        echo "pg: initdb $DATA"
        if ! as_pg "$PGBIN/initdb" -D "$DATA" -A trust -U postgres --no-sync -E UTF8 --locale=C.UTF-8 >"$DIR/initdb.log" 2>&1; then
            cat "$DIR/initdb.log" >&2
            echo "pg: initdb failed" >&2
            exit 1
        fi
    fi

    local maxc=${PG_MAX_CONNECTIONS:-200}
    local opts="-k '$SOCK' -p $PORT -c listen_addresses='' -c fsync=off -c max_connections=$maxc -c unix_socket_permissions=0777"
    if ! as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 -o "$opts" start >/dev/null; then
        tail -n 20 "$LOG" >&2 || true
        echo "pg: start failed (log: $LOG)" >&2
        exit 1
    fi
    wait_ready
    echo "pg: running (pid $(running_pid), socket $SOCK port $PORT)"
}

wait_ready() {
    for _ in $(seq 1 300); do
        if "$PGBIN/pg_isready" -q -h "$SOCK" -p "$PORT" -U postgres -d postgres; then
            return 0
        fi
        sleep 0.1
    done
    echo "pg: server not ready after 30 s (log: $LOG)" >&2
    exit 1
}

case "$cmd" in
    start) do_start ;;
    stop) do_stop ;;
    status)
        pid=$(running_pid)
        if [ -n "$pid" ]; then
            echo "pg: running (pid $pid, socket $(running_sock) port $(running_port), data $DATA)"
        else
            echo "pg: not running ($DATA)"
            exit 3
        fi ;;
    *) usage ;;
esac
