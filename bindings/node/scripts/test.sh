#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The binding's suite as make test runs it (ctest node.binding):
#   bindings/node/scripts/test.sh BUILD_DIR
# npm install builds the addon against BUILD_DIR's libdlock (and fetches
# node-addon-api, node-gyp and typescript from the npm registry, or npm's
# cache), then node's test runner runs test/binding.test.js.
set -eu
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
for p in node npm; do
    command -v $p >/dev/null || { echo "node.binding: $p is missing (apt-get install nodejs npm)" >&2; exit 1; }
done
export DLOCK_BUILD="$build"
npm install --no-audit --no-fund --loglevel=error
exec node --expose-gc --test test/binding.test.js
