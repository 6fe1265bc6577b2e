#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# run --stats=prometheus and --stats=json (issue 32, item 7): the client's
# counters at exit on stderr as dlock_stats_format writes them, COMMAND's
# stdout left alone; an unknown format is a usage error.
. "$(dirname "$0")/lib.sh"

N=$(name s)
expect 0 "run --stats=prometheus" "$DLOCK" --url "$URL" run --stats=prometheus "$N" -- echo ran
grep_file '^ran$' "$WORK/out" "--stats=prometheus: COMMAND's stdout as it was"
grep_file '^# TYPE dlock_acquires_total counter$' "$WORK/err" "--stats=prometheus: a TYPE line"
grep_file "^dlock_acquires_total\{backend=\"$BACKEND\"\} 1$" "$WORK/err" \
    "--stats=prometheus: one acquisition, labelled with the backend"
grep_file "^dlock_round_trip_seconds_count\{backend=\"$BACKEND\"\} [1-9][0-9]*$" "$WORK/err" \
    "--stats=prometheus: the round trips counted"
grep_file "^dlock_round_trip_seconds_bucket\{backend=\"$BACKEND\",le=\"\+Inf\"\} [1-9][0-9]*$" \
    "$WORK/err" "--stats=prometheus: the +Inf bucket"
grep_file "^dlock_round_trip_seconds_sum\{backend=\"$BACKEND\"\} [0-9]+\.[0-9]{6}$" "$WORK/err" \
    "--stats=prometheus: the round trips' sum, in seconds"
if grep -q '^dlock: ' "$WORK/err"; then fail "--stats=prometheus: a 'dlock: ' line: $(cat "$WORK/err")"; else pass "--stats=prometheus: nothing but the exposition"; fi

expect 0 "run --stats=json" "$DLOCK" --url "$URL" run --stats=json "$N" -- true
grep_file "^\{\"backend\":\"$BACKEND\",\"acquires\":1,\"busy\":0,\"waits\":0,\"handoffs\":0,\"renewals\":[0-9]+,\"renew_failures\":0,\"losses\":0,\"round_trip_us\":\[[0-9,]+\],\"wait_us\":\[[0-9,]+\],\"round_trip_us_sum\":[1-9][0-9]*,\"wait_us_sum\":0\}$" \
    "$WORK/err" "--stats=json: one object, its keys in order"

expect 64 "run --stats=yaml" "$DLOCK" --url "$URL" run --stats=yaml "$N" -- true
grep_file "^dlock: run: --stats takes text, json or prometheus, not 'yaml'$" "$WORK/err" \
    "--stats=yaml: the message says which formats there are"

finish
