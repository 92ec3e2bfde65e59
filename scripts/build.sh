#!/usr/bin/env bash
# Build the llmgw nginx dynamic module against Debian's nginx-dev tree.
#
#   scripts/build.sh            -> <repo>/build/nginx/ngx_http_llmgw_module.so
#                                  and <repo>/build/v8host/llmgw-v8host
#
# configure runs from /usr/share/nginx/src with Debian's own flags
# (conf_flags) plus --add-dynamic-module=<repo> --builddir=<repo>/build/nginx.
# Verified: with --builddir, configure and `make modules` write only into the
# build dir (feature tests, Makefile, headers, objects), never into the
# nginx-dev tree, so the tree is used in place.  Debian's tree has no
# top-level Makefile: the generated one is called with -f.
#
# configure is re-run only when build/nginx/Makefile is missing, when
# `config` (or Debian's conf_flags) is newer than it, or when the configure
# arguments changed.
#
# Env:
#   REPO_MODULE_DIR  module source dir (has `config`); default: the repo.
#                    The build goes to $REPO_MODULE_DIR/build/nginx.
#   NGX_SRC          nginx source tree; default /usr/share/nginx/src
#   LLMGW_CC_OPT     extra compiler flags (e.g. "-O0" or "-fsanitize=address")
#   LLMGW_LD_OPT     extra linker flags
#   JOBS             parallel jobs for make; default nproc
#   LLMGW_RECONFIGURE=1  force configure
#   LLMGW_NO_V8HOST=1  do not build the plugin runtime helper
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
MODULE_DIR=$(cd "${REPO_MODULE_DIR:-$REPO}" && pwd)
NGX_SRC=${NGX_SRC:-/usr/share/nginx/src}
BUILD=$MODULE_DIR/build/nginx
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

if [ ! -f "$MODULE_DIR/config" ]; then
    echo "build: no nginx addon script at $MODULE_DIR/config" >&2
    exit 1
fi
if [ ! -x "$NGX_SRC/configure" ] || [ ! -f "$NGX_SRC/conf_flags" ]; then
    echo "build: nginx source tree not found at $NGX_SRC (run 'make deps': it installs nginx-dev)" >&2
    exit 1
fi

# Debian's configure flags: defines the bash array NGX_CONF_FLAGS.
# shellcheck disable=SC1091
. "$NGX_SRC/conf_flags"

cc_opt="$(dpkg-buildflags --get CFLAGS) -fPIC $(dpkg-buildflags --get CPPFLAGS)${LLMGW_CC_OPT:+ $LLMGW_CC_OPT}"
ld_opt="$(dpkg-buildflags --get LDFLAGS) -fPIC${LLMGW_LD_OPT:+ $LLMGW_LD_OPT}"
args=(--with-cc-opt="$cc_opt" --with-ld-opt="$ld_opt" "${NGX_CONF_FLAGS[@]}"
      --add-dynamic-module="$MODULE_DIR" --builddir="$BUILD")

stamp=$BUILD/.configure-args
want=$(printf '%s\n' "$NGX_SRC" "${args[@]}")

need_configure=
why=
if [ -n "${LLMGW_RECONFIGURE:-}" ]; then
    need_configure=1; why="forced"
elif [ ! -f "$BUILD/Makefile" ] || [ ! -f "$stamp" ]; then
    need_configure=1; why="no build/nginx/Makefile yet"
elif [ "$MODULE_DIR/config" -nt "$BUILD/Makefile" ]; then
    need_configure=1; why="config is newer than build/nginx/Makefile"
elif [ "$NGX_SRC/conf_flags" -nt "$BUILD/Makefile" ]; then
    need_configure=1; why="nginx-dev changed"
elif [ "$(cat "$stamp")" != "$want" ]; then
    need_configure=1; why="configure arguments changed"
fi

if [ -n "$need_configure" ]; then
    echo "build: configuring ($why)"
    mkdir -p "$BUILD"
    rm -f "$stamp"
    log=$BUILD/configure.log
    if ! (cd "$NGX_SRC" && ./configure "${args[@]}") >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "build: configure failed; full log: $log (and $BUILD/autoconf.err)" >&2
        exit 1
    fi
    printf '%s\n' "$want" >"$stamp"
fi

echo "build: make modules (-j$JOBS)"
make -j"$JOBS" -f "$BUILD/Makefile" -C "$NGX_SRC" modules

shopt -s nullglob
sos=("$BUILD"/*.so)
if [ "${#sos[@]}" -eq 0 ]; then
    echo "build: no .so produced in $BUILD" >&2
    exit 1
fi
for so in "${sos[@]}"; do
    echo "build: module: $so"
done

# The plugin runtime helper (`make v8host`: V8 from .deps/libnode, unpacked
# there first when missing).
if [ -z "${LLMGW_NO_V8HOST:-}" ]; then
    echo "build: v8host"
    make --no-print-directory -C "$REPO" -j"$JOBS" v8host
    echo "build: helper: $REPO/build/v8host/llmgw-v8host"
fi
