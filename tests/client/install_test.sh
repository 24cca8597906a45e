#!/bin/sh
# SPDX-License-Identifier: MIT
# `cmake --install` into a temporary prefix: the binaries are there, and a
# program built with `pkg-config --cflags --libs kvclient` from that prefix
# (moved after the install, so nothing may point at the old path) links and
# runs.
set -eu
build="$1"
san="${2:-}" # the build's sanitizers: the test program must link them too
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/a" >/dev/null
for b in kvnode kvrouter kvctl; do
  [ -x "$tmp/a/bin/$b" ] || { echo "missing bin/$b" >&2; exit 1; }
done
mv "$tmp/a" "$tmp/b"
pc=$(find "$tmp/b" -name kvclient.pc)
[ -n "$pc" ] || { echo "no kvclient.pc installed" >&2; exit 1; }
cat > "$tmp/t.c" <<'C'
#include <kv/kv.h>
#include <stdio.h>
#include <string.h>
int main(void) { return strcmp(kv_err_name(KV_NOT_FOUND), "NOT_FOUND") != 0; }
C
flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs kvclient)
cc ${san:+-fsanitize=$san} "$tmp/t.c" $flags -o "$tmp/t"
LD_LIBRARY_PATH=$(dirname "$(dirname "$pc")") "$tmp/t"
"$tmp/b/bin/kvctl" --version | grep -q '^kvctl '
echo "ok: install, relocated pkg-config, kvctl --version"
