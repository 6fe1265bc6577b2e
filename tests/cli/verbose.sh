#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# run -v says when the lock was had, its fence, lease and renewal period,
# and at the end how long it was held and how often renewed; -vv adds a
# line per call to the server; without -v, nothing. (The busy message's holder line: busy.sh, on every backend.)
. "$(dirname "$0")/lib.sh"

N=$(name v)
# -v: the acquisition and the release, with the fence COMMAND got.
expect 0 "run -v" "$DLOCK" --url "$URL" run -v --ttl 600ms "$N" -- sh -c 'echo "$DLOCK_FENCE"; sleep 0.8'
fence=$(cat "$WORK/out")
grep_file "^dlock: acquired $N after [0-9]+\.[0-9] m?s, fence $fence, lease 600 ms, renewed every 200 ms$" \
    "$WORK/err" "-v: acquired, with the fence, lease and renewal period"
grep_file '^dlock: released after ([89][0-9]{2}\.[0-9] ms|[0-9]+\.[0-9] s) ' \
    "$WORK/err" "-v: released, after how long"
grep_file '^dlock: released after .* \([1-9][0-9]* renewals?\)$' "$WORK/err" "-v: the renewals counted"
# -vv: a debug line per call to the server, the try and the release named.
expect 0 "run -vv" "$DLOCK" --url "$URL" run -vv "$N" -- true
grep_file "^dlock: debug: acquire '$N': ok in [0-9]+\.[0-9]{3} ms$" "$WORK/err" "-vv: the try, its outcome and time"
grep_file "^dlock: debug: release '$N': ok in [0-9]+\.[0-9]{3} ms$" "$WORK/err" "-vv: the release"
grep_file "^dlock: acquired $N after " "$WORK/err" "-vv: what -v prints, too"
expect 0 "run -v (no debug)" "$DLOCK" --url "$URL" run -v "$N" -- true
if grep -q "^dlock: debug: " "$WORK/err"; then fail "-v printed debug lines: $(cat "$WORK/err")"; else pass "-v prints no debug line"; fi
expect 0 "run without -v" "$DLOCK" --url "$URL" run "$N" -- true
[ -s "$WORK/err" ] && fail "run without -v printed: $(cat "$WORK/err")" || pass "run without -v is silent"

finish
