#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The names dlock's libraries give a program that links them:
#   tests/install/check_symbols.sh LIBDLOCK_SO ARCHIVE...
# 1. every global symbol an archive defines (libdlock.a, libdlock_zk.a, ...)
#    starts with dlock_ (the API) or dlock__ (internal): a static program
#    shares one namespace with them, and etcd's protobuf-c messages
#    (scripts/etcd_pb_names.cmake) or a helper's short name would collide
#    with the program's own;
# 2. libdlock.so exports the API alone: dlock_ names, no dlock__ one.
# No exceptions: a name that must stay unprefixed would be listed here, with
# why. Needs nm (binutils). Exits non-zero, listing the names, on failure.
set -eu
fail() { echo "check_symbols: FAIL: $*" >&2; exit 1; }
ok() { echo "check_symbols: ok: $*"; }
[ $# -ge 2 ] || fail "usage: check_symbols.sh LIBDLOCK_SO ARCHIVE..."
so=$1
shift

# nm prints "address type name" for a symbol (and "member.o:" headers).
for a in "$@"; do
    [ -f "$a" ] || fail "no $a"
    all=$(nm -g --defined-only "$a" | awk 'NF == 3 { print $3 }' | sort -u)
    [ -n "$all" ] || fail "$a defines no global symbol (not an archive of dlock's?)"
    bad=$(echo "$all" | grep -v '^dlock_' || true)
    if [ -n "$bad" ]; then
        echo "$bad" | sed 's/^/    /' | head -n 40 >&2
        fail "$(basename "$a"): $(echo "$bad" | wc -l) of $(echo "$all" | wc -l) global symbols lack the dlock_/dlock__ prefix"
    fi
    ok "$(basename "$a"): all $(echo "$all" | wc -l) global symbols are dlock_ or dlock__"
done

[ -f "$so" ] || fail "no $so"
all=$(nm -D --defined-only "$so" | awk 'NF == 3 { print $3 }' | sort -u)
bad=$(echo "$all" | grep -v '^dlock_' || true)
internal=$(echo "$all" | grep '^dlock__' || true)
if [ -n "$bad$internal" ]; then
    printf '%s\n%s\n' "$bad" "$internal" | sed '/^$/d; s/^/    /' >&2
    fail "$(basename "$so") exports names beside the API (dlock_ but not dlock__)"
fi
ok "$(basename "$so"): exports $(echo "$all" | wc -l) names, all of the API"
