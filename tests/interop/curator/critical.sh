#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The critical section of the Curator interop test, run under a lock by both
# sides (`dlock run ... -- sh critical.sh` and CuratorWorker's loop), so that
# both do exactly the same thing. What one section sees of another goes to
# DIR/violations, one line each; interop.sh wants it empty.
#
#   critical.sh write DIR   read-modify-write of DIR/register (a counter),
#                           alone: no other writer, no reader inside; the
#                           fence ($DLOCK_FENCE from dlock, $FENCE from
#                           Curator: the holder node's czxid) must be above
#                           the last one written.
#   critical.sh read DIR    read DIR/register twice with a pause: no writer
#                           inside, the value unchanged.
#   critical.sh permit N DIR  one of at most N inside at once.
set -u
mode=$1
pause() { sleep 0.02; }
violation() { echo "$mode $$: $*" >>"$DIR/violations"; }

case $mode in
write)
    DIR=$2
    fence=${DLOCK_FENCE:-${FENCE:-0}}
    mkdir "$DIR/writer" 2>/dev/null || violation "another writer is inside"
    [ -z "$(ls "$DIR/readers")" ] || violation "readers inside: $(ls "$DIR/readers")"
    v=$(cat "$DIR/register")
    pause
    echo $((v + 1)) >"$DIR/register"
    if [ "$fence" != 0 ]; then
        last=$(cat "$DIR/fence")
        [ "$fence" -gt "$last" ] || violation "fence $fence not above the last one, $last"
        echo "$fence" >"$DIR/fence"
    fi
    rmdir "$DIR/writer" 2>/dev/null
    ;;
read)
    DIR=$2
    touch "$DIR/readers/$$"
    [ ! -d "$DIR/writer" ] || violation "a writer is inside"
    v1=$(cat "$DIR/register")
    pause
    v2=$(cat "$DIR/register")
    [ "$v1" = "$v2" ] || violation "the register changed under a reader: $v1 then $v2"
    echo "$v1" >>"$DIR/reads"
    rm -f "$DIR/readers/$$"
    ;;
permit)
    n=$2 DIR=$3
    # Each is inside from its touch to its rm, and counts after its touch:
    # when k are inside at once, the last of them to enter sees all k.
    touch "$DIR/inside/$$"
    k=$(ls "$DIR/inside" | wc -l)
    [ "$k" -le "$n" ] || violation "$k inside, at most $n allowed"
    echo "$k" >>"$DIR/counts"
    pause
    rm -f "$DIR/inside/$$"
    ;;
*)
    echo "critical.sh: unknown mode '$mode' (write, read, permit)" >&2
    exit 2
    ;;
esac
exit 0
