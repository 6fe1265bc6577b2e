#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Lock names reach other users' terminals (issue 26, item 6): a name holding
# ESC ] 0 ; ... BEL (retitles the window), a newline (forges a line of
# output) and a byte that is not UTF-8 is shown by status, list and the
# command's messages with each such byte as \xNN, never raw; valid UTF-8
# (é) is shown as it is, and --json keeps JSON's escapes.
. "$(dirname "$0")/lib.sh"

ESC=$(printf '\033') FF=$(printf '\377') EACUTE=$(printf '\303\251')
PREFIX=$(name "")
N="$PREFIX${ESC}]0;pwned$(printf '\007')-line
dlock: forged-${FF}-${EACUTE}"
SHOWN="${PREFIX}\\\\x1b]0;pwned\\\\x07-line\\\\x0adlock: forged-\\\\xff-${EACUTE}"

# clean FILE WHAT: FILE holds no control byte but its newlines, no \377,
# and the name as SHOWN on one line.
clean() {
    raw=$(LC_ALL=C tr -d '\n\040-\176\200-\376' <"$1" | od -An -c | tr -d ' \n')
    if [ -n "$raw" ]; then
        fail "$2: raw control bytes ($raw): $(od -c "$1" | head -5)"
    elif LC_ALL=C grep -q "$FF" "$1"; then
        fail "$2: a raw \\377 byte: $(od -c "$1" | head -5)"
    elif ! grep -q -- "$SHOWN" "$1"; then
        fail "$2: the name is not shown escaped: $(cat "$1")"
    elif grep -q '^dlock: forged' "$1"; then
        fail "$2: a forged line: $(cat "$1")"
    else
        pass "$2: name escaped, é kept"
    fi
}

hold "$N" esc
expect 0 "status of a name with control bytes" "$DLOCK" --url "$URL" status "$N"
clean "$WORK/out" "status"
grep_file '^.*: held, fence [0-9]+' "$WORK/out" "status: still one line with the state"
[ "$(wc -l <"$WORK/out")" -eq 1 ] && pass "status: one line" || fail "status: $(wc -l <"$WORK/out") lines"
expect 0 "list of a name with control bytes" "$DLOCK" --url "$URL" list "$PREFIX"
clean "$WORK/out" "list"
[ "$(wc -l <"$WORK/out")" -eq 1 ] && pass "list: one line" || fail "list: $(wc -l <"$WORK/out") lines"
# A message that carries the name (stderr): busy.
expect 75 "run of the held name" "$DLOCK" --url "$URL" run "$N" -- true
LC_ALL=C tr -d '\n\040-\176\200-\376' <"$WORK/err" | grep -q . &&
    fail "busy message: raw control bytes: $(od -c "$WORK/err" | head -5)" ||
    pass "busy message: no raw control byte"
grep_file 'x1b\]0;pwned' "$WORK/err" "busy message: the name, escaped"
# JSON: JSON's own escapes, as before.
expect 0 "status --json" "$DLOCK" --url "$URL" status --json "$N"
grep_file '\\u001b\]0;pwned\\u0007-line\\u000adlock' "$WORK/out" "status --json: JSON escapes"
kill -TERM "$HOLDER"
wait "$HOLDER"

finish
