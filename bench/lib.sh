# Shared helpers for bench/chat.sh and bench/stream.sh (sourced, not run).
#
# Everything a benchmark starts lives under one run folder
# ($REPO/var/bench/<name>-<pid>) and is stopped by bench_cleanup (installed
# as the EXIT/INT/TERM trap by bench_init): nginx masters (and their
# workers), Node helpers, the private PostgreSQL server.  Only 127.0.0.1 is
# ever listened on or connected to.
#
# Env common to both benchmarks:
#   LLMGW_MODULE  module .so (default build/nginx/ngx_http_llmgw_module.so)
#   NGINX         nginx binary (default /usr/sbin/nginx)
#   BENCH_KEEP=1  keep the run folder (logs, configs) after a clean run;
#                 it is always kept when the script fails

BENCH_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$BENCH_LIB_DIR/.." && pwd)
MODULE=${LLMGW_MODULE:-$REPO/build/nginx/ngx_http_llmgw_module.so}
NGINX=${NGINX:-/usr/sbin/nginx}

BENCH_PIDS=()          # processes we started, stopped in reverse order
BENCH_PG_DIR=          # set once our PostgreSQL runs
BENCH_PG_PORT=
BENCH_RUN=
BENCH_OK=

die() { echo "bench: $*" >&2; exit 1; }
log() { echo "bench: $*" >&2; }

# Is $1 a live (not zombie) process?
bench_alive() {
    local st
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed -n 's/^State:[[:space:]]*\([A-Z]\).*/\1/p' "/proc/$1/status" 2>/dev/null || true)
    [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}

# Direct children of $1 (nginx workers), by pid.
bench_children() {
    local p pp
    for p in /proc/[0-9]*; do
        pp=$(sed -n 's/^PPid:[[:space:]]*//p' "$p/status" 2>/dev/null || true)
        [ "$pp" = "$1" ] && echo "${p#/proc/}"
    done
    return 0
}

# Stop one process we started: $2 (QUIT for nginx, TERM otherwise), then
# KILL after 5 s, children included.
bench_stop_pid() {
    local pid=$1 sig=${2:-TERM} kids i
    bench_alive "$pid" || return 0
    kids=$(bench_children "$pid")
    kill "-$sig" "$pid" 2>/dev/null || true
    for i in $(seq 1 50); do
        bench_alive "$pid" || break
        sleep 0.1
    done
    if bench_alive "$pid"; then
        log "pid $pid did not stop within 5 s of SIG$sig; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    for k in $kids; do
        bench_alive "$k" && kill -KILL "$k" 2>/dev/null || true
    done
    wait "$pid" 2>/dev/null || true
}

bench_cleanup() {
    local rc=$? i entry
    trap - EXIT INT TERM
    for ((i = ${#BENCH_PIDS[@]} - 1; i >= 0; i--)); do
        entry=${BENCH_PIDS[$i]}
        bench_stop_pid "${entry%%:*}" "${entry#*:}"
    done
    if [ -n "$BENCH_PG_DIR" ]; then
        "$REPO/scripts/pg.sh" stop "$BENCH_PG_DIR" "$BENCH_PG_PORT" >/dev/null 2>&1 || true
    fi
    if [ -n "$BENCH_RUN" ] && [ -d "$BENCH_RUN" ]; then
        if [ "$rc" -eq 0 ] && [ -n "$BENCH_OK" ] && [ -z "${BENCH_KEEP:-}" ]; then
            rm -rf "$BENCH_RUN"
        else
            echo "bench: run folder kept: $BENCH_RUN" >&2
        fi
    fi
    exit "$rc"
}

# bench_init <name>: run folder, traps, tool checks.
bench_init() {
    local t
    for t in node wrk curl psql "$NGINX"; do
        command -v "$t" >/dev/null 2>&1 || die "$t not found (run 'make deps')"
    done
    [ -f "$MODULE" ] || die "module not built: $MODULE (run 'make build')"
    MODULE=$(cd "$(dirname "$MODULE")" && pwd)/$(basename "$MODULE")
    mkdir -p "$REPO/var/bench"
    chmod 0755 "$REPO/var" "$REPO/var/bench" 2>/dev/null || true
    BENCH_RUN=$REPO/var/bench/$1-$$
    rm -rf "$BENCH_RUN"
    mkdir -p "$BENCH_RUN"
    chmod 0755 "$BENCH_RUN"
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# A free loopback TCP port (the kernel's choice).
free_port() {
    node -e "const s=require('net').createServer();s.listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})"
}

# wait_port <port> <pid> <what>: until 127.0.0.1:<port> accepts (10 s).
wait_port() {
    local i
    for i in $(seq 1 100); do
        bench_alive "$2" || return 1
        if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# nginx_prefix <dir>: folders nginx and its nobody workers need.
nginx_prefix() {
    local d
    mkdir -p "$1/logs" "$1/tmp"
    for d in body proxy fcgi uwsgi scgi; do mkdir -p "$1/tmp/$d"; done
    chmod 0755 "$1" "$1/logs"
    chmod 0777 "$1/tmp" "$1"/tmp/*
}

# Common nginx.conf head; $1 prefix, $2 worker_processes, $3 extra main text.
nginx_head() {
    cat <<EOF
$3
daemon off;
master_process on;
worker_processes $2;
worker_rlimit_nofile 16384;
error_log $1/logs/error.log warn;
pid $1/logs/nginx.pid;
events { worker_connections 8192; }
EOF
}

# Temp paths, logging and keep-alive settings shared by every http block.
nginx_http_common() {
    cat <<EOF
  access_log off;
  client_body_temp_path $1/tmp/body; proxy_temp_path $1/tmp/proxy;
  fastcgi_temp_path $1/tmp/fcgi; uwsgi_temp_path $1/tmp/uwsgi; scgi_temp_path $1/tmp/scgi;
  client_max_body_size 1m; client_body_buffer_size 64k;
  keepalive_requests 1000000; keepalive_timeout 65s;
  server_tokens off;
EOF
}

# start_nginx <prefix> <port> <what>: runs nginx in the foreground of a
# background job (so its pid is ours), waits for the port.
start_nginx() {
    local pid
    "$NGINX" -p "$1" -c "$1/nginx.conf" >"$1/logs/stderr.log" 2>&1 &
    pid=$!
    NGINX_PID=$pid
    BENCH_PIDS+=("$pid:QUIT")
    if ! wait_port "$2" "$pid"; then
        cat "$1/logs/stderr.log" "$1/logs/error.log" >&2 2>/dev/null || true
        die "$3 (nginx in $1) did not start"
    fi
    log "$3: nginx pid $pid on 127.0.0.1:$2"
}

# start_node <log> <script> [args...]: a Node helper in the background;
# sets NODE_PID.
start_node() {
    local logf=$1
    shift
    node "$@" >"$logf" 2>&1 &
    NODE_PID=$!
    BENCH_PIDS+=("$NODE_PID:TERM")
}

# start_pg: private PostgreSQL + one migrated database + root token.
# Sets PG_CONNINFO, ROOT_TOKEN.
start_pg() {
    BENCH_PG_DIR=$BENCH_RUN/pg
    BENCH_PG_PORT=${BENCH_PGPORT:-5440}
    BENCH_PG_SOCK=$BENCH_PG_DIR/sock
    PG_MAX_CONNECTIONS=100 "$REPO/scripts/pg.sh" start "$BENCH_PG_DIR" "$BENCH_PG_PORT" >"$BENCH_RUN/pg.log" 2>&1 \
        || { cat "$BENCH_RUN/pg.log" >&2; die "PostgreSQL did not start"; }
    local admin="host=$BENCH_PG_SOCK port=$BENCH_PG_PORT dbname=postgres user=postgres"
    psql -X -q -v ON_ERROR_STOP=1 -d "$admin" -c "create database llmgw_bench" >/dev/null
    PG_CONNINFO="host=$BENCH_PG_SOCK port=$BENCH_PG_PORT dbname=llmgw_bench user=postgres"
    bash "$REPO/sql/migrate.sh" "$PG_CONNINFO" >"$BENCH_RUN/migrate.log" 2>&1 \
        || { cat "$BENCH_RUN/migrate.log" >&2; die "migrations failed"; }
    ROOT_TOKEN=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
    local sha
    sha=$(printf '%s' "$ROOT_TOKEN" | sha256sum | cut -d' ' -f1)
    psql -X -q -v ON_ERROR_STOP=1 -d "$PG_CONNINFO" -Atc "select llmgw_admin_token_set('$sha')" >/dev/null
    log "PostgreSQL in $BENCH_PG_DIR (socket only)"
}

# pid of our postmaster (its backends are its children).
pg_pid() {
    head -n 1 "$BENCH_PG_DIR/pg/postmaster.pid" 2>/dev/null || true
}

# cpu_snap / cpu_diff: CPU accounting around a measurement (lib/cpu.mjs).
# CPU_ROOTS: label=pid words, specific roots first; "load" (this script's
# own tree: wrk or the Node client) last.
CPU_ROOTS=()
cpu_snap() {
    node "$BENCH_LIB_DIR/lib/cpu.mjs" snap "${CPU_ROOTS[@]}" "pg=$(pg_pid)" "load=$$"
}
cpu_diff() {
    node "$BENCH_LIB_DIR/lib/cpu.mjs" diff "$1" "$2"
}

# start_static <port>: stock nginx answering every request with a small
# OpenAI chat.completion; one worker.
start_static() {
    local p=$BENCH_RUN/static
    nginx_prefix "$p"
    {
        nginx_head "$p" 1 ""
        echo "http {"
        nginx_http_common "$p"
        cat <<'EOF'
  default_type application/json;
EOF
        cat <<EOF
  server {
    listen 127.0.0.1:$1 backlog=4096;
    location / {
      return 200 '{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there."},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}';
    }
  }
}
EOF
    } >"$p/nginx.conf"
    start_nginx "$p" "$1" "static upstream"
    CPU_ROOTS+=("upstream=$NGINX_PID")
}

# start_bare <port> <upstream port> <extra location text>: stock nginx
# proxy_pass with upstream keep-alive.
start_bare() {
    local p=$BENCH_RUN/bare
    nginx_prefix "$p"
    {
        nginx_head "$p" auto ""
        echo "http {"
        nginx_http_common "$p"
        cat <<EOF
  upstream bench_up {
    server 127.0.0.1:$2;
    keepalive 64;
    keepalive_requests 1000000;
  }
  server {
    listen 127.0.0.1:$1 backlog=4096;
    location / {
      proxy_pass http://bench_up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      $3
    }
  }
}
EOF
    } >"$p/nginx.conf"
    start_nginx "$p" "$1" "bare nginx proxy_pass"
    CPU_ROOTS+=("bare=$NGINX_PID")
}

# start_gateway <port>: nginx with the llmgw module on our database.
start_gateway() {
    local p=$BENCH_RUN/gw
    nginx_prefix "$p"
    {
        nginx_head "$p" auto "load_module $MODULE;"
        echo "http {"
        nginx_http_common "$p"
        cat <<EOF
  llmgw_database "$PG_CONNINFO";
  llmgw_zone_size ${BENCH_ZONE_SIZE:-64m};
  ${FLUSH_INTERVAL:+llmgw_flush_interval $FLUSH_INTERVAL;}
  server {
    listen 127.0.0.1:$1 backlog=4096;
    location / { llmgw_gateway; }
    location /api/ { llmgw_admin; }
    location = /metrics { llmgw_metrics; }
  }
}
EOF
    } >"$p/nginx.conf"
    start_nginx "$p" "$1" "gateway"
    CPU_ROOTS+=("gateway=$NGINX_PID")
}

# Admin helper (bench/lib/admin.mjs) bound to the gateway.
admin() {
    BENCH_GW_URL=$GW_URL BENCH_ROOT_TOKEN=$ROOT_TOKEN node "$BENCH_LIB_DIR/lib/admin.mjs" "$@"
}

# Lines of a gateway error log at [alert] or [emerg] (or crit/error counts).
gw_log_summary() {
    local f=$BENCH_RUN/gw/logs/error.log n_alert n_err
    [ -f "$f" ] || { echo "no error log"; return; }
    n_alert=$(grep -c '\[\(alert\|emerg\|crit\)\]' "$f" || true)
    n_err=$(grep -c '\[error\]' "$f" || true)
    echo "gateway error.log: $n_alert alert/emerg/crit, $n_err error lines"
}

machine_line() {
    local cpu
    cpu=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)
    echo "$(nproc) cores ($cpu), $(uname -sr), nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///'), node $(node --version)"
}


# parse_wrk <file> <ms|us>: "rps p50 p99 non2xx socket_errors requests"
# from a `wrk --latency` report, latencies in the unit asked for.
parse_wrk() {
    awk -v unit="$2" '
    function conv(v, f) {
        if (v ~ /us$/) { sub(/us$/, "", v); f = 0.001 }
        else if (v ~ /ms$/) { sub(/ms$/, "", v); f = 1 }
        else if (v ~ /m$/)  { sub(/m$/, "", v);  f = 60000 }
        else if (v ~ /s$/)  { sub(/s$/, "", v);  f = 1000 }
        else f = 1
        return unit == "us" ? v * f * 1000 : v * f
    }
    /Latency Distribution/ { dist = 1; next }
    dist && $1 == "50%" { p50 = conv($2) }
    dist && $1 == "99%" { p99 = conv($2); dist = 0 }
    / requests in / { reqs = $1 }
    /Socket errors:/ {
        for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) { v = $i; sub(/,/, "", v); errs += v }
    }
    /Non-2xx or 3xx responses:/ { non2xx = $NF }
    /^Requests\/sec:/ { rps = $2 }
    END {
        if (rps == "" || p99 == "") exit 1
        fmt = unit == "us" ? "%.1f %.0f %.0f %d %d %d\n" : "%.1f %.3f %.3f %d %d %d\n"
        printf fmt, rps, p50, p99, non2xx, errs, reqs
    }' "$1"
}


# ------------------------------------------------------------ plugin runtime

# bench_v8host: starts build/v8host/llmgw-v8host ($V8HOST) with $V8_WORKERS
# workers and waits until it answers a status call.  Its socket goes under
# the run folder, or under /tmp when that path would be too long for a Unix
# socket (at most 107 bytes; removed on exit).  Sets SOCK_DIR, SOCK and
# HELPER_PID.
bench_v8host() {
    SOCK_DIR=$BENCH_RUN/v8
    SOCK_TMP=
    if [ ${#SOCK_DIR} -gt 90 ]; then
        SOCK_TMP=$(mktemp -d /tmp/llmgw-bench-XXXXXX)
        SOCK_DIR=$SOCK_TMP
        trap bench_v8host_cleanup EXIT
    fi
    mkdir -p "$SOCK_DIR"
    chmod 0755 "$SOCK_DIR"   # nginx workers run as nobody
    SOCK=$SOCK_DIR/v8host.sock

    "$V8HOST" --socket "$SOCK" --workers "$V8_WORKERS" \
        --pidfile "$SOCK_DIR/v8host.pid" >"$BENCH_RUN/v8host.log" 2>&1 &
    HELPER_PID=$!
    BENCH_PIDS+=("$HELPER_PID:TERM")

    local up= _
    for _ in $(seq 1 100); do
        bench_alive "$HELPER_PID" || break
        if [ -S "$SOCK" ] && timeout -k 2 20 node "$BENCH_LIB_DIR/lib/hooks-client.mjs" \
               status --socket "$SOCK" >/dev/null 2>&1
        then
            up=1
            break
        fi
        sleep 0.1
    done
    [ -n "$up" ] || { cat "$BENCH_RUN/v8host.log" >&2; die "the helper did not start"; }
    log "helper: pid $HELPER_PID, $V8_WORKERS workers, $SOCK"
}

bench_v8host_cleanup() {
    local rc=$?
    rm -rf "$SOCK_TMP"
    (exit "$rc")
    bench_cleanup
}
