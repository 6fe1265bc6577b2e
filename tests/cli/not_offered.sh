#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# On a backend that does not offer the rest of the lock family (Redlock):
# run --shared / --exclusive / --permits and elect exit 64 ("not
# supported") with a message naming the backend and the kind, and COMMAND
# never runs. The plain run works on the same name.
. "$(dirname "$0")/lib.sh"

dl() { "$DLOCK" --url "$URL" "$@"; }

N=$(name n)
for how in --shared --exclusive; do
    expect 64 "run $how: not supported" dl run "$how" "$N" -- touch "$WORK/ran"
    grep_file "$BACKEND backend does not implement read-write locks" "$WORK/err" \
        "run $how: the message names the backend and the kind"
done
expect 64 "run --permits 2: not supported" dl run --permits 2 "$N" -- touch "$WORK/ran"
grep_file "$BACKEND backend does not implement semaphores" "$WORK/err" \
    "run --permits: the message names the backend and the kind"
expect 64 "elect: not supported" dl elect --once "$N" -- touch "$WORK/ran"
grep_file "$BACKEND backend does not implement leader election" "$WORK/err" \
    "elect: the message names the backend and the kind"
if [ -e "$WORK/ran" ]; then fail "COMMAND ran for a kind not offered"; fi
expect 0 "the plain run on the same name" dl run "$N" -- true
finish
