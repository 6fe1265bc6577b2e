#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Every URL scheme the library knows (dlock --list-schemes, from
# dlock_scheme, which test_module.schemes_match_tables checks against the
# backends' tables) is shown wherever a user looks for one: --help, the
# bash completion of --url, man dlock's URLS, libdlock(3), the header's
# dlock_client_open comment, and the unknown-scheme error. No server.
. "$(dirname "$0")/lib.sh"

SRC=$(dirname "$0")/../..
expect 0 "--list-schemes" "$DLOCK" --list-schemes
cp "$WORK/out" "$WORK/schemes"
n=$(wc -l <"$WORK/schemes")
# The built-in ones at least (redis 7, etcd 2, redlock 1); the modules' when
# the build has them.
[ "$n" -ge 10 ] && pass "--list-schemes lists $n schemes" ||
    fail "--list-schemes lists $n schemes: $(cat "$WORK/schemes")"
for s in redis unix rediss redis-sentinel rediss-sentinel redis-cluster rediss-cluster etcd \
         etcds redlock zk postgres postgresql mysql mariadb; do
    grep -qx "$s" "$WORK/schemes" || fail "--list-schemes lacks $s"
done

expect 0 "--help" "$DLOCK" --help
cp "$WORK/out" "$WORK/help"
expect 64 "unknown scheme" "$DLOCK" --url "reids://127.0.0.1:1" status x
cp "$WORK/err" "$WORK/unknown"
COMPLETION=$SRC/completions/dlock.bash
offered=$(bash -c '. "$0"; COMP_WORDS=("$1" --url ""); COMP_CWORD=2; _dlock; echo " ${COMPREPLY[*]} "' \
    "$COMPLETION" "$DLOCK")
# The header's and libdlock(3)'s text before their next section.
sed -n '/^ \* URLs/,/^ \* Returns DLOCK_OK and \*out/p' "$SRC/include/dlock/dlock.h" >"$WORK/header"
sed -n '/^\*dlock_client_open\*/,/^\*dlock_client_free\*/p' "$SRC/man/libdlock.3.scd" >"$WORK/man3"
sed -n '/^# URLS/,/^# SIGNALS/p' "$SRC/man/dlock.1.scd" >"$WORK/man1"
missing=""
while read -r s; do
    grep -qF " $s://" "$WORK/help" || missing="$missing help:$s"
    grep -qF " $s://" "$WORK/unknown" || missing="$missing error:$s"
    case $offered in *" $s:// "*) ;; *) missing="$missing completion:$s" ;; esac
    grep -qF "$s://" "$WORK/header" || missing="$missing dlock.h:$s"
    grep -qF "*$s://*" "$WORK/man3" || missing="$missing libdlock.3:$s"
    grep -qF "*$s://*" "$WORK/man1" || missing="$missing dlock.1:$s"
done <"$WORK/schemes"
[ -z "$missing" ] && pass "help, completion, error, header and man pages name every scheme" ||
    fail "not named:$missing"
# What was wrong before: the header promised DLOCK_ENOTSUP for rediss://.
if grep -q 'rediss://.*ENOTSUP\|ENOTSUP.*rediss://' "$WORK/header"; then
    fail "dlock.h still says rediss:// is DLOCK_ENOTSUP"
fi
# A module that is not installed: its name and where it was looked for.
expect 64 "missing module" env DLOCK_MODULE_DIR="$WORK/nothing" "$DLOCK" --url "zk://127.0.0.1:1" status x
grep_file "zk.so.*$WORK/nothing" "$WORK/err" "missing module: names zk.so and the directory"
expect 0 "--help without modules" env DLOCK_MODULE_DIR="$WORK/nothing" "$DLOCK" --help
grep_file ' zk://\*' "$WORK/out" "--help marks a scheme whose module is missing"
finish
