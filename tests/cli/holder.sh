#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The operator's view (issue 16): status names the holder (host, pid of the
# dlock that holds the lock, since when, --label), status --json parses,
# list shows the held locks of a prefix and not a released one; run -v
# prints the library's log, --stats the counters at exit.
. "$(dirname "$0")/lib.sh"

A=$(name a)
B=$(name b)
C=$(name c)
PREFIX=$(name '')
dl() { "$DLOCK" --url "$URL" "$@"; }
HOST=$(hostname)

hold "$A" holder-a --ttl 20s --label "nightly backup"
PID_A=$HOLDER
hold "$B" holder-b --ttl 20s
PID_B=$HOLDER
expect 0 "a run of a third lock, released" dl run "$C" -- true

expect 0 "status of a held lock" dl status "$A"
grep_file "^$A: held, fence [0-9]+, ttl [0-9]+ ms, holder $HOST pid $PID_A since [0-9-]+T[0-9:.]+Z \(nightly backup\)$" \
    "$WORK/out" "status: the holder's host, pid and label"

expect 0 "status --json" dl status --json "$A"
if python3 -m json.tool "$WORK/out" >"$WORK/pretty" 2>"$WORK/json.err"; then
    pass "status --json parses"
else
    fail "status --json does not parse: $(cat "$WORK/json.err"): $(cat "$WORK/out")"
fi
python3 - "$WORK/out" "$A" "$HOST" "$PID_A" >"$WORK/check" 2>&1 <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
h = d["holder"]
assert d["name"] == sys.argv[2] and d["held"] is True and d["fence"] > 0 and d["ttl_ms"] > 0, d
assert h["host"] == sys.argv[3] and h["pid"] == int(sys.argv[4]), h
assert h["label"] == "nightly backup" and h["start_ms"] > 1500000000000, h
print("fields ok")
PY
grep_file '^fields ok$' "$WORK/check" "status --json: name, held, fence, ttl_ms, holder"

expect 0 "status --json of a free lock" dl status --json "$C"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["held"] is False and d["holder"] is None, d; print("free ok")' \
    "$WORK/out" >"$WORK/check" 2>&1
grep_file '^free ok$' "$WORK/check" "status --json of a free lock: held false, holder null"

expect 0 "list PREFIX" dl list "$PREFIX"
[ "$(wc -l <"$WORK/out")" -eq 2 ] && pass "list: two held locks" ||
    fail "list: want 2 lines: $(cat "$WORK/out")"
grep_file "^$A: held, .* holder $HOST pid $PID_A .*\(nightly backup\)$" "$WORK/out" "list: the first lock and its holder"
grep_file "^$B: held, .* holder $HOST pid $PID_B since [^ ]+$" "$WORK/out" "list: the second lock and its holder"
if grep -q "^$C:" "$WORK/out"; then fail "list shows the released lock"; else pass "list: not the released lock"; fi

expect 0 "list --json PREFIX" dl list --json "$PREFIX"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sorted(x["name"] for x in d))' \
    "$WORK/out" >"$WORK/check" 2>&1
grep_file "^\['$A', '$B'\]$" "$WORK/check" "list --json: an array of the two"
expect 0 "list --json of nothing" dl list --json "$PREFIX-none"
grep_file '^\[\]$' "$WORK/out" "list --json of nothing: []"

expect 64 "run --label empty" dl run --label= "$C" -- true
expect 64 "run --label with a control byte" dl run --label "$(printf 'a\tb')" "$C" -- true
expect 64 "list: two prefixes" dl list a b

# -v: the library's log. A lock broken under a run is a loss, logged as an
# error before dlock reports it.
hold "$C" holder-c --ttl 3s -v --stats
expect 0 "release --force under a -v run" dl release --force "$C"
expect_bg 76 "the -v holder finds its lock lost" "$HOLDER"
grep_file "^dlock: error: lock '$C' lost: " "$WORK/holder-c.err" "-v: the loss in the log"
grep_file "^dlock: stats: acquires 1, busy 0, waits 0, hand-offs 0, renewals [0-9]+, renew failures 0, losses 1$" \
    "$WORK/holder-c.err" "--stats: the counters at exit"
grep_file "^dlock: stats: round trips: ([0-9]+-[0-9]+us [0-9]+ ?)+" "$WORK/holder-c.err" \
    "--stats: the round-trip histogram"

expect 0 "--stats of a busy try" dl run --stats -E 0 "$A" -- true
grep_file "^dlock: stats: acquires 0, busy 1, waits 0," "$WORK/err" "--stats: a busy answer counted"
finish
