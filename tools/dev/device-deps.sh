#!/bin/sh
# SPDX-License-Identifier: MIT
# Build dependencies for a machine without network (the GPU device machine).
#   tools/dev/device-deps.sh            on a networked machine: apt-get download the
#                                   .debs into .deps/debs (git-ignored)
#   tools/dev/device-deps.sh --unpack   on the target: dpkg -x them into .deps/prefix,
#                                   rewrite the .pc files, print the env to eval
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
debs="$root/.deps/debs"
prefix="$root/.deps/prefix"
pkgs="libjansson-dev libjansson4 check libsubunit-dev libsubunit0"

if [ "${1:-}" != "--unpack" ]; then
    mkdir -p "$debs"
    cd "$debs"
    apt-get download $pkgs
    ls -1 "$debs"
    exit 0
fi

mkdir -p "$prefix"
for d in "$debs"/*.deb; do
    dpkg -x "$d" "$prefix"
done
libdir="$prefix/usr/lib/x86_64-linux-gnu"
for pc in "$libdir"/pkgconfig/*.pc; do
    sed -i "s|^prefix=.*|prefix=$prefix/usr|" "$pc"
done
# the -dev packages' .so links may be absolute or relative; fix absolute ones
for l in "$libdir"/*.so; do
    if [ -L "$l" ]; then
        t=$(readlink "$l")
        case "$t" in /*) ln -sf "$prefix$t" "$l" ;; esac
    fi
done
echo "export PKG_CONFIG_PATH=$libdir/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
echo "export LD_LIBRARY_PATH=$libdir\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export LIBRARY_PATH=$libdir\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
