#!/usr/bin/env bash
# Install the Debian packages llmgw needs, and only those that are missing.
#
# Fast no-op when everything is present (one dpkg-query call); runs
# `apt-get update` only when something has to be installed.
#
# Never installs Debian's nodejs / libnode-dev: Node.js 20 (with npm) is
# preinstalled on the machines we target and must not be downgraded.
#
# Env: LLMGW_EXTRA_PKGS    extra packages to ensure (space separated)
#      LLMGW_DEPS_DRYRUN=1 only print what would be installed
set -euo pipefail

PKGS=(
    # toolchain
    gcc g++ make pkg-config dpkg-dev
    # nginx + its configured source tree for building the dynamic module
    nginx nginx-dev
    # libraries used by src/ and ngx_modules/
    libjansson-dev libpq-dev libssl-dev libuv1-dev
    # unit tests
    libcmocka-dev
    # database (server + client tools)
    postgresql
    # benchmarks
    wrk
    # convenience: the curl lines that `make run` prints, the README's
    # plugin upload, the benchmarks' JSON reading
    curl ca-certificates jq
    # run-time libraries of libnode108, whose V8 v8_host links; the package
    # itself is only unpacked into .deps/libnode (v8_host/fetch-libnode.sh)
    libicu72 libbrotli1 libc-ares2 libnghttp2-14 libuv1 zlib1g libssl3
)
# shellcheck disable=SC2206
[ -n "${LLMGW_EXTRA_PKGS:-}" ] && PKGS+=(${LLMGW_EXTRA_PKGS})

missing=()
# One dpkg-query call for all packages.  Unknown packages make dpkg-query
# exit non-zero and print nothing for them, so compare name by name.
declare -A have=()
while read -r name status; do
    [ "$status" = "ii" ] && have["$name"]=1
done < <(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' "${PKGS[@]}" 2>/dev/null || true)

for p in "${PKGS[@]}"; do
    [ -n "${have[$p]:-}" ] && continue
    case "$p" in
        nodejs|libnode-dev|libnode[0-9]*)
            echo "deps: refusing to install $p (Node.js 20 is preinstalled)" >&2
            continue ;;
    esac
    missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "deps: all ${#PKGS[@]} packages present"
else
    if [ -n "${LLMGW_DEPS_DRYRUN:-}" ]; then
        echo "deps: would install: ${missing[*]}"
        exit 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "deps: missing packages: ${missing[*]} (run as root to install)" >&2
        exit 1
    fi
    echo "deps: installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q "${missing[@]}"
    # Re-check: apt-get can succeed while leaving a package unconfigured.
    still=()
    for p in "${missing[@]}"; do
        s=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
        [ "${s% }" = "ii" ] || still+=("$p")
    done
    if [ "${#still[@]}" -ne 0 ]; then
        echo "deps: still not installed: ${still[*]}" >&2
        exit 1
    fi
    echo "deps: installed ${#missing[@]} package(s)"
fi

# V8 10.2 for v8_host: Debian's libnode108 + libnode-dev downloaded and
# unpacked into <repo>/.deps/libnode (not installed; see the script).
if [ -z "${LLMGW_DEPS_DRYRUN:-}" ]; then
    "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/v8_host/fetch-libnode.sh"
fi

if ! command -v node >/dev/null 2>&1; then
    echo "deps: warning: node not found; integration tests need Node.js >= 20 (not installed by this script)" >&2
else
    major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if [ "$major" -lt 20 ]; then
        echo "deps: warning: node $(node --version) found; integration tests need Node.js >= 20" >&2
    fi
fi
