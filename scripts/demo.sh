#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# `make demo`: run the payout demo with its defaults, after the build.
#   scripts/demo.sh BUILD_DIR
# The demo starts and stops its own throwaway redis-server and keeps its
# SQLite store in a temporary folder; it leaves only the HTML report behind.
set -eu
build="${1:-build}"
dlock="$build/cli/dlock"
if [ ! -x "$dlock" ]; then
    echo "demo.sh: $dlock not found; build first (make build)" >&2
    exit 70
fi
# `dlock demo` runs the program dlock-demo beside it.
if [ ! -x "$build/cli/dlock-demo" ]; then
    echo "demo.sh: $build/cli/dlock-demo not found; the build has no demo (cmake -DDLOCK_BUILD_DEMO=ON)" >&2
    exit 70
fi
report="$build/demo-report.html"
status=0
"$dlock" demo payout --report "$report" || status=$?
if [ -f "$report" ]; then
    echo "open $report in a browser for the timeline of every instance."
fi
exit "$status"
