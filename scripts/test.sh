#!/usr/bin/env bash
# The whole test suite (what `make test` and .ci/run run after deps.sh):
#
#   1. build      scripts/build.sh (the module the integration tests load)
#   2. unit       make unit (CMocka over src/)
#   2b. v8host    make v8host-test (t/v8host/ against the built helper)
#   3. test PostgreSQL at var/test (fresh every run), Unix socket only
#   4. sql        bash t/sql/test_sql.sh "<conninfo>" against a database
#                 created for it (if the script exists)
#   5. integration  node --test --test-concurrency=2 t/integration/
#                 (the harness creates its own databases on that server)
#
# One failing part does not stop the others.  Last line:
#   make test: unit ok|FAILED, sql ok|FAILED|skipped, integration ok|FAILED|skipped,
#              v8host ok|FAILED
# Exit status non-zero if anything FAILED.  The test server is stopped on
# exit; var/test stays for inspection until the next run.
#
# Exported to the SQL and integration tests:
#   LLMGW_REPO      repository root
#   LLMGW_MODULE    absolute path of the built .so
#   LLMGW_PG_SOCK   PostgreSQL socket folder   LLMGW_PG_PORT  its port
#   LLMGW_PG_USER   postgres (trust auth)
#   PGHOST PGPORT PGUSER   the same, for psql/libpq defaults
#
# Env: PGPORT_LLMGW_TEST (5434), LLMGW_VAR (<repo>/var),
#      LLMGW_INTEGRATION_TIMEOUT (seconds, 900), LLMGW_SQL_TIMEOUT (300)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
mkdir -p "${LLMGW_VAR:-$REPO/var}"
VAR=$(cd "${LLMGW_VAR:-$REPO/var}" && pwd)
TDIR=$VAR/test
TPORT=${PGPORT_LLMGW_TEST:-5434}
TSOCK=$TDIR/sock
INT_TIMEOUT=${LLMGW_INTEGRATION_TIMEOUT:-900}
SQL_TIMEOUT=${LLMGW_SQL_TIMEOUT:-300}
cd "$REPO"

t0=$(date +%s)
section() { printf '\n== %s  (+%ds)\n' "$*" "$(( $(date +%s) - t0 ))"; }

build=FAILED unit=FAILED sql=FAILED integration=FAILED v8host=FAILED pg_ok=

section build
if "$SCRIPT_DIR/build.sh"; then build=ok; fi

section unit
if make --no-print-directory unit; then unit=ok; fi
node --test t/plugin-api/ || unit=FAILED   # validator vs manifest.schema.json

section v8host
if make --no-print-directory v8host-test; then v8host=ok; fi

section "test PostgreSQL ($TDIR, port $TPORT)"
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$pg_ok" ]; then
        "$SCRIPT_DIR/pg.sh" stop "$TDIR" "$TPORT" >/dev/null 2>&1 || true
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Run "$@" under a time limit.  `timeout` puts the command in its own
# process group (so on expiry the whole group goes), which also shields it
# from the terminal's Ctrl-C: forward INT/TERM to it ourselves.
limited_pid=
run_limited() {
    local secs=$1 rc=0
    shift
    timeout -k 30 "$secs" "$@" &
    limited_pid=$!
    trap 'kill -TERM "$limited_pid" 2>/dev/null || true; wait "$limited_pid" 2>/dev/null || true; exit 130' INT
    trap 'kill -TERM "$limited_pid" 2>/dev/null || true; wait "$limited_pid" 2>/dev/null || true; exit 143' TERM
    wait "$limited_pid" || rc=$?
    trap 'exit 130' INT
    trap 'exit 143' TERM
    limited_pid=
    [ "$rc" -eq 124 ] && echo "test: timed out after ${secs}s: $*" >&2
    return "$rc"
}
"$SCRIPT_DIR/pg.sh" stop "$TDIR" "$TPORT" >/dev/null || true
rm -rf "$TDIR"
pg_ok=1
if ! "$SCRIPT_DIR/pg.sh" start "$TDIR" "$TPORT"; then
    pg_ok=
    echo "test: could not start the test PostgreSQL" >&2
fi

export LLMGW_REPO=$REPO
export LLMGW_MODULE=$REPO/build/nginx/ngx_http_llmgw_module.so
export LLMGW_PG_SOCK=$TSOCK LLMGW_PG_PORT=$TPORT LLMGW_PG_USER=postgres
export PGHOST=$TSOCK PGPORT=$TPORT PGUSER=postgres
unset PGDATABASE PGPASSWORD PGSERVICE || true

section sql
if [ ! -f t/sql/test_sql.sh ]; then
    sql=skipped
    echo "test: no t/sql/test_sql.sh"
elif [ -n "$pg_ok" ]; then
    db=llmgw_sqltest
    if psql -X -q -v ON_ERROR_STOP=1 "host=$TSOCK port=$TPORT user=postgres dbname=postgres" \
            -c "create database $db" &&
       run_limited "$SQL_TIMEOUT" bash t/sql/test_sql.sh "host=$TSOCK port=$TPORT dbname=$db user=postgres"; then
        sql=ok
    fi
fi

section integration
# Files node --test picks up in a folder (Node 20): *.test.js, *-test.js,
# *_test.js, test-*.js, test.js (also .mjs/.cjs) and anything under test/.
shopt -s globstar nullglob
int_files=()
for f in t/integration/**/*.{js,mjs,cjs}; do
    case "${f##*/}" in
        *.test.js|*.test.mjs|*.test.cjs|*-test.js|*-test.mjs|*-test.cjs|*_test.js|*_test.mjs|*_test.cjs|\
        test-*.js|test-*.mjs|test-*.cjs|test.js|test.mjs|test.cjs) int_files+=("$f") ;;
        *) case "/$f" in */test/*) int_files+=("$f") ;; esac ;;
    esac
done
shopt -u globstar nullglob

# npm dependencies of the test folders (installed when missing or stale).
npm_ok=1
for d in t t/lib t/integration t/sdk; do
    [ -f "$d/package.json" ] || continue
    stamp=$d/node_modules/.package-lock.json
    if [ ! -f "$stamp" ] || [ "$d/package.json" -nt "$stamp" ] ||
       { [ -f "$d/package-lock.json" ] && [ "$d/package-lock.json" -nt "$stamp" ]; }; then
        echo "test: npm install in $d"
        if [ -f "$d/package-lock.json" ]; then
            (cd "$d" && npm ci --no-audit --no-fund --loglevel=error) || npm_ok=
        else
            (cd "$d" && npm install --no-audit --no-fund --loglevel=error) || npm_ok=
        fi
    fi
done

if [ "${#int_files[@]}" -eq 0 ]; then
    echo "test: no integration test files in t/integration/"
    if [ "$build" = ok ]; then integration=skipped; fi
elif [ "$build" != ok ]; then
    echo "test: module did not build; integration tests not run" >&2
elif [ -z "$pg_ok" ]; then
    echo "test: no test PostgreSQL; integration tests not run" >&2
elif [ -z "$npm_ok" ]; then
    echo "test: npm install failed; integration tests not run" >&2
else
    echo "test: ${#int_files[@]} file(s), timeout ${INT_TIMEOUT}s"
    sdk=(); [ -f t/sdk/package.json ] && sdk=(t/sdk/)
    if run_limited "$INT_TIMEOUT" node --test --test-concurrency=2 --test-reporter=spec t/integration/ "${sdk[@]}"; then
        integration=ok
    fi
fi

[ "$build" = ok ] || echo "test: build FAILED (see above)"
printf '\n(%ds)\n' "$(( $(date +%s) - t0 ))"
echo "make test: unit $unit, sql $sql, integration $integration, v8host $v8host"
[ "$build" = ok ] && [ "$unit" = ok ] && [ "$sql" != FAILED ] && [ "$integration" != FAILED ] &&
    [ "$v8host" = ok ]
