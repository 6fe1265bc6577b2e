#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# No RUNPATH or RPATH of ours makes the loader search a directory the user
# did not choose (issue 26, item 10):
#   tests/install/check_rpath.sh BUILD_DIR
# Every ELF file of the build tree (programs, libdlock, backend modules,
# tests, bench) and of a `cmake --install` of it: each entry of its RUNPATH
# or RPATH is an absolute directory or starts with $ORIGIN. An empty entry
# (a leading, trailing or doubled ':') means the current directory to the
# loader, and a relative one a directory below it: a program run from a
# directory someone else can write would load their libdlock.so.
# Needs readelf (binutils), cmake. Exits non-zero, naming each bad file.
set -eu
build=$(cd "$1" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/dlock-rpath-XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
command -v readelf >/dev/null || { echo "check_rpath: FAIL: readelf not found (apt-get install binutils)" >&2; exit 1; }
bad=0 seen=0

# scan DIR: check every ELF file under DIR that has a dynamic section.
scan() {
    find "$1" -type f ! -name '*.o' ! -name '*.a' ! -path '*/CMakeFiles/*' >"$work/files"
    while IFS= read -r f; do
        [ "$(head -c 4 "$f" | od -An -c | tr -d ' ')" = '177ELF' ] || continue
        seen=$((seen + 1))
        readelf -d "$f" 2>/dev/null | sed -n 's/.*Library r[a-z]*path: \[\(.*\)\]$/\1/p' >"$work/paths"
        while IFS= read -r p; do
            case ":$p:" in
            *::*) echo "check_rpath: FAIL: $f: an empty entry in [$p]" >&2; bad=$((bad + 1)) ;;
            esac
            old_ifs=$IFS IFS=:
            for e in $p; do
                case $e in
                '' | /* | '$ORIGIN' | '$ORIGIN/'* | '${ORIGIN}' | '${ORIGIN}/'*) ;;
                *) echo "check_rpath: FAIL: $f: a relative entry '$e' in [$p]" >&2; bad=$((bad + 1)) ;;
                esac
            done
            IFS=$old_ifs
        done <"$work/paths"
    done <"$work/files"
}

scan "$build"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log" >&2; echo "check_rpath: FAIL: cmake --install" >&2; exit 1; }
n_build=$seen
scan "$work/prefix"
[ "$n_build" -gt 0 ] && [ "$seen" -gt "$n_build" ] ||
    { echo "check_rpath: FAIL: no ELF files found (build tree $n_build, with the installed tree $seen)" >&2; exit 1; }
[ "$bad" -eq 0 ] || { echo "check_rpath: FAIL: $bad bad entries" >&2; exit 1; }
echo "check_rpath: ok: $n_build ELF files in the build tree, $((seen - n_build)) installed: no empty or relative RUNPATH entry"
