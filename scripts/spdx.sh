#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# The licence line of every source file (LICENSE: BSD-3-Clause).
#   scripts/spdx.sh           add "SPDX-License-Identifier: BSD-3-Clause" where missing
#   scripts/spdx.sh --check   list the files without it; exit 1 if there is one
#
# Sources: *.c *.h *.lua *.sh *.py *.cmake *.pml *.in, CMakeLists.txt, Makefile,
# .ci/run. Not the fuzz corpora and regressions (inputs, not code), nor the
# man pages (scdoc wants its title first) and debian/ (debian/copyright says
# it). The line goes first, after a "#!" line if there is one, in the
# file's own comment syntax; a Lua line is a comment, so the embedded
# scripts still run, and scripts/embed_lua.cmake hashes the text it embeds.
set -eu
cd "$(dirname "$0")/.."
tag="SPDX-License-Identifier: BSD-3-Clause"
check=0
[ "${1:-}" = "--check" ] && check=1

sources() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files --cached --others --exclude-standard
    else
        find . -path ./.git -prune -o -path './build*' -prune -o -path './obj-*' -prune \
            -o -path ./debian -prune -o -type f -print | sed 's|^\./||'
    fi | grep -E '(\.(c|h|lua|sh|py|cmake|pml|in)|/CMakeLists\.txt|^CMakeLists\.txt|^Makefile|^\.ci/run)$' |
        grep -vE '^(tests/fuzz/(corpus|regressions)/|debian/|man/)'
}

missing=0
for f in $(sources); do
    [ -f "$f" ] || continue
    head -n 3 "$f" | grep -q "SPDX-License-Identifier:" && continue
    if [ "$check" = 1 ]; then
        echo "spdx: $f has no SPDX-License-Identifier line (scripts/spdx.sh adds it)" >&2
        missing=$((missing + 1))
        continue
    fi
    case "$f" in
    *.c | *.h | *.pml | *.h.in) line="/* $tag */" ;;
    *.lua) line="-- $tag" ;;
    *) line="# $tag" ;;
    esac
    tmp="$f.spdx.$$"
    if head -n 1 "$f" | grep -q '^#!'; then
        { head -n 1 "$f"; echo "$line"; tail -n +2 "$f"; } >"$tmp"
    else
        { echo "$line"; cat "$f"; } >"$tmp"
    fi
    chmod --reference="$f" "$tmp"
    mv "$tmp" "$f"
    echo "spdx: $f"
done
[ "$missing" -eq 0 ] || { echo "spdx: $missing file(s) without the licence line" >&2; exit 1; }
