#!/usr/bin/env bash
# Put V8 10.2 headers and library into <repo>/.deps/libnode.
#
# Debian has no standalone V8 package: V8 10.2 ships inside libnode108
# (Node 18).  `apt-get install libnode-dev` conflicts with the preinstalled
# Node.js 20, so the two packages are downloaded and unpacked with dpkg -x;
# nothing is installed system-wide.  v8_host compiles against
# .deps/libnode/usr/include/node (never /usr/include/node: that is Node 20's
# V8 11.3, a silent ABI mismatch).
#
# Fast no-op when the tree is complete.  Runs `apt-get update` (as root)
# only when the download fails without it.
#
# Env: LIBNODE_DIR  destination (default <repo>/.deps/libnode)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
DEST=${LIBNODE_DIR:-$REPO/.deps/libnode}
PKGS=(libnode-dev libnode108)
ARCH=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)

complete() {
    [ -f "$1/.complete" ] && [ -f "$1/usr/include/node/v8.h" ] &&
        [ -e "$1/usr/lib/$ARCH/libnode.so" ]
}

if complete "$DEST"; then
    echo "v8: libnode present in ${DEST#"$REPO"/} ($(cat "$DEST/.complete"))"
    exit 0
fi

mkdir -p "$(dirname "$DEST")"
tmp=$(mktemp -d "$(dirname "$DEST")/.libnode-dl.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# apt-get download drops privileges to _apt, which must be able to write.
chmod 0777 "$tmp"

echo "v8: downloading ${PKGS[*]} (Debian's V8 10.2)"
if ! (cd "$tmp" && apt-get download -q "${PKGS[@]}"); then
    if [ "$(id -u)" -ne 0 ]; then
        echo "v8: apt-get download failed (run 'apt-get update' as root, then retry)" >&2
        exit 1
    fi
    echo "v8: retrying after apt-get update"
    apt-get update -q
    (cd "$tmp" && apt-get download -q "${PKGS[@]}")
fi

mkdir "$tmp/tree"
versions=()
for p in "${PKGS[@]}"; do
    deb=$(ls "$tmp"/"${p}"_*.deb)
    dpkg -x "$deb" "$tmp/tree"
    versions+=("$p $(dpkg-deb -f "$deb" Version)")
done

if [ ! -f "$tmp/tree/usr/include/node/v8.h" ]; then
    echo "v8: unpacked tree has no usr/include/node/v8.h" >&2
    exit 1
fi
major=$(sed -n 's/^#define V8_MAJOR_VERSION \([0-9]*\)/\1/p' "$tmp/tree/usr/include/node/v8-version.h")
minor=$(sed -n 's/^#define V8_MINOR_VERSION \([0-9]*\)/\1/p' "$tmp/tree/usr/include/node/v8-version.h")
if [ "$major.$minor" != "10.2" ]; then
    # v8_host is written against V8 10.2's API (Debian 12's libnode108).
    echo "v8: the downloaded libnode carries V8 $major.$minor, not 10.2" >&2
    exit 1
fi
echo "V8 $major.$minor; ${versions[*]}" >"$tmp/tree/.complete"

rm -rf "$DEST"
mv "$tmp/tree" "$DEST"
echo "v8: libnode unpacked into ${DEST#"$REPO"/} (V8 $major.$minor)"
