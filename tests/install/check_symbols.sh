#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The names dlock's libraries give a program that links them:
#   tests/install/check_symbols.sh LIBDLOCK_SO ARCHIVE.a... MODULE.so...
# 1. every global symbol an archive defines (libdlock.a, libdlock_zk.a, ...)
#    starts with dlock_ (the API) or dlock__ (internal): a static program
#    shares one namespace with them, and etcd's protobuf-c messages
#    (scripts/etcd_pb_names.cmake) or a helper's short name would collide
#    with the program's own;
# 2. libdlock.so exports the API alone: dlock_ names, no dlock__ one;
# 3. a backend module (zk.so, ...) needs of dlock only what libdlock.so
#    exports: it resolves those calls in the program that loads it.
# No exceptions: a name that must stay unprefixed would be listed here, with
# why. Needs nm (binutils). Exits non-zero, listing the names, on failure.
set -eu
fail() { echo "check_symbols: FAIL: $*" >&2; exit 1; }
ok() { echo "check_symbols: ok: $*"; }
[ $# -ge 2 ] || fail "usage: check_symbols.sh LIBDLOCK_SO ARCHIVE.a... MODULE.so..."
so=$1
shift
# nm prints "address type name" for a symbol defined (and "member.o:"
# headers), "U name" for one needed.
[ -f "$so" ] || fail "no $so"
api=$(nm -D --defined-only "$so" | awk 'NF == 3 { print $3 }' | sort -u)
bad=$(echo "$api" | grep -v '^dlock_' || true)
internal=$(echo "$api" | grep '^dlock__' || true)
if [ -n "$bad$internal" ]; then
    printf '%s\n%s\n' "$bad" "$internal" | sed '/^$/d; s/^/    /' >&2
    fail "$(basename "$so") exports names beside the API (dlock_ but not dlock__)"
fi
ok "$(basename "$so"): exports $(echo "$api" | wc -l) names, all of the API"

for f in "$@"; do
    [ -f "$f" ] || fail "no $f"
    case $f in
    *.a)
        all=$(nm -g --defined-only "$f" | awk 'NF == 3 { print $3 }' | sort -u)
        [ -n "$all" ] || fail "$f defines no global symbol (not an archive of dlock's?)"
        bad=$(echo "$all" | grep -v '^dlock_' || true)
        if [ -n "$bad" ]; then
            echo "$bad" | sed 's/^/    /' | head -n 40 >&2
            fail "$(basename "$f"): $(echo "$bad" | wc -l) of $(echo "$all" | wc -l) global symbols lack the dlock_/dlock__ prefix"
        fi
        ok "$(basename "$f"): all $(echo "$all" | wc -l) global symbols are dlock_ or dlock__"
        ;;
    *.so)
        needs=$(nm -D --undefined-only "$f" | awk '$2 ~ /^dlock/ { print $2 }' | sort -u)
        [ -n "$needs" ] || fail "$(basename "$f") needs no dlock call (not a backend module?)"
        missing=$(echo "$needs" | while read -r n; do echo "$api" | grep -qx "$n" || echo "$n"; done)
        if [ -n "$missing" ]; then
            echo "$missing" | sed 's/^/    /' >&2
            fail "$(basename "$f") needs dlock calls that $(basename "$so") does not export"
        fi
        ok "$(basename "$f") needs $(echo "$needs" | wc -l) dlock calls, all exported: $(echo "$needs" | tr "\n" " ")"
        ;;
    *) fail "$f: neither an archive (.a) nor a module (.so)" ;;
    esac
done
