#!/bin/sh
# Applies sql/NNN_*.sql in name order, each at most once.
#
#   sql/migrate.sh "<libpq conninfo>"
#
# Applied file names are recorded in schema_migrations.  Everything runs in
# ONE psql session that holds an advisory lock from start to end, so two
# concurrent runs apply each file once: the second waits, then sees the
# first one's records and skips.  Each file runs in its own transaction
# together with its record, so a failing file leaves nothing behind and is
# retried next time.  Migration files must not contain BEGIN/COMMIT.
#
# Exit status: 0 on success (also when nothing was left to apply), non-zero
# on any failure.

set -eu

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: $0 \"<libpq conninfo>\"" >&2
    exit 2
fi
conninfo=$1
dir=$(cd "$(dirname "$0")" && pwd)

# Any fixed 64-bit number; it names this lock across the whole server.
lock_key=7300426610151208

# C collation: the glob lists 001_, 002_, ... in byte order.
LC_ALL=C
export LC_ALL
files=
for path in "$dir"/[0-9][0-9][0-9]_*.sql; do
    [ -e "$path" ] || continue
    f=${path##*/}
    case $f in
        *[!A-Za-z0-9_.-]*)
            echo "migrate: refusing file name $f (only A-Z a-z 0-9 _ . - allowed)" >&2
            exit 1 ;;
    esac
    files="$files $f"
done
if [ -z "$files" ]; then
    echo "migrate: no migration files in $dir" >&2
    exit 1
fi

# psql quotes: inside '...' a quote is written twice.
sq() {
    printf "'%s'" "$(printf '%s' "$1" | sed "s/'/''/g")"
}

script=$(
    cat <<EOF
\\set ON_ERROR_STOP 1
\\o /dev/null
SET client_min_messages = warning;
SELECT pg_advisory_lock($lock_key);
CREATE TABLE IF NOT EXISTS schema_migrations (
    name       text PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
EOF
    for f in $files; do
        # File names match [0-9A-Za-z_.-] only, so they need no escaping.
        cat <<EOF
SELECT NOT EXISTS (SELECT 1 FROM schema_migrations WHERE name = '$f') AS llmgw_todo \\gset
\\if :llmgw_todo
\\echo migrate: applying $f
BEGIN;
\\i $(sq "$dir/$f")
INSERT INTO schema_migrations (name, applied_at) VALUES ('$f', now());
COMMIT;
\\else
\\echo migrate: $f already applied
\\endif
EOF
    done
    echo "SELECT pg_advisory_unlock($lock_key);"
)

# -X: no ~/.psqlrc; \o /dev/null above hides query results but not \echo.
# On the first error psql exits non-zero and the session ends, which rolls
# back the open transaction and releases the lock.
if ! printf '%s\n' "$script" | psql "$conninfo" -X -q -v ON_ERROR_STOP=1 -f -; then
    echo "migrate: FAILED" >&2
    exit 1
fi
