#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# Usage errors exit 64 with a "dlock: " message, and are found before any
# connection: the URL given is unreachable, so checking the command line
# after connecting would exit 69 instead. --help and --version exit 0.
. "$(dirname "$0")/lib.sh"

DEAD=redis://127.0.0.1:1
N=$(name x)

usage() { # WHAT ARGS...: exit 64, and a message on stderr that starts "dlock: "
    what=$1
    shift
    expect 64 "$what" "$DLOCK" "$@"
    if ! head -n 1 "$WORK/err" | grep -q '^dlock: \|^usage: '; then
        fail "$what: stderr does not start with 'dlock: ': $(cat "$WORK/err")"
    fi
}

usage "no arguments"
usage "unknown global option" --bogus run "$N" -- true
usage "unknown command" --url "$DEAD" lock "$N"
usage "--url without a value" --url
usage "run: unknown option" --url "$DEAD" run --bogus "$N" -- true
usage "run: --url after run" --url "$DEAD" run --url "$DEAD" "$N" -- true
usage "run: missing NAME" --url "$DEAD" run -- true
usage "run: missing --" --url "$DEAD" run "$N" true
usage "run: missing COMMAND" --url "$DEAD" run "$N" --
usage "run: two names" --url "$DEAD" run "$N" other -- true
usage "run: bad --ttl unit" --url "$DEAD" run --ttl 5x "$N" -- true
usage "run: --ttl with a fraction of a ms" --url "$DEAD" run --ttl 1.0005s "$N" -- true
usage "run: --wait with units out of order" --url "$DEAD" run --wait=30m1h "$N" -- true
grep_file 'longest to the shortest' "$WORK/err" "units out of order: the message says so"
usage "run: negative --wait" --url "$DEAD" run --wait -1s "$N" -- true
usage "run: empty --grace" --url "$DEAD" run --grace= "$N" -- true
usage "run: --ttl without a value" --url "$DEAD" run "$N" --ttl
usage "run: zero --ttl" --url "$DEAD" run --ttl 0 "$N" -- true
usage "run: --grace equal to --ttl" --url "$DEAD" run --ttl 3s --grace 3s "$N" -- true
usage "run: --grace longer than --ttl" --url "$DEAD" run --ttl 3s --grace 1m "$N" -- true
usage "run: -E not a number" --url "$DEAD" run -E abc "$N" -- true
usage "run: -E over 255" --url "$DEAD" run -E 256 "$N" -- true
usage "run: -E negative" --url "$DEAD" run -E -1 "$N" -- true
usage "run: --command-status-offset 0" --url "$DEAD" run --command-status-offset 0 "$N" -- true
usage "run: --command-status-offset 256" --url "$DEAD" run --command-status-offset 256 "$N" -- true
usage "elect: --command-status-offset abc" --url "$DEAD" elect --command-status-offset abc "$N" -- true
usage "status: missing NAME" --url "$DEAD" status
usage "status: two names" --url "$DEAD" status "$N" other
usage "status: unknown option" --url "$DEAD" status --force "$N"
usage "release without --force" --url "$DEAD" release "$N"
usage "release: unknown option" --url "$DEAD" release --forse "$N"

# NAME: 1 to 512 bytes, checked before any connection; a message about a
# long one says why, and shows only its start.
LONG=$(head -c 10240 /dev/zero | tr '\0' n)
usage "run: a 10 kB NAME" --url "$DEAD" run "$LONG" -- true
grep_file 'NAME is 10240 bytes long, at most 512' "$WORK/err" "a 10 kB NAME: the message says why"
if [ "$(wc -c <"$WORK/err")" -lt 200 ]; then
    pass "a 10 kB NAME: the message abbreviates it"
else
    fail "a 10 kB NAME: the message is $(wc -c <"$WORK/err") bytes long"
fi
usage "elect: a 10 kB NAME" --url "$DEAD" elect "$LONG" -- true
usage "status: a 10 kB NAME" --url "$DEAD" status "$LONG"
usage "release: a 10 kB NAME" --url "$DEAD" release --force "$LONG"
usage "run: empty NAME" --url "$DEAD" run "" -- true
grep_file 'NAME is empty' "$WORK/err" "empty NAME: the message says so"
usage "elect: empty NAME" --url "$DEAD" elect "" -- true
usage "status: empty NAME" --url "$DEAD" status ""
usage "release: empty NAME" --url "$DEAD" release --force ""

# Leases under 100 ms are refused (renewals every third of one must get
# through), and under a second on etcd (whole seconds), before connecting.
usage "run: --ttl 1ms" --url "$DEAD" run --ttl 1ms "$N" -- true
grep_file 'ttl must be at least 100 ms' "$WORK/err" "--ttl 1ms: the message gives the minimum"
usage "run: --ttl 999ms on etcd" --url etcd://127.0.0.1:1 run --ttl 999ms "$N" -- true
grep_file 'at least 1000 ms .*etcd' "$WORK/err" "--ttl 999ms on etcd: the message names etcd"
usage "elect: --ttl 500ms on etcds" --url etcds://127.0.0.1:1 elect --ttl 500ms "$N" -- true
expect 69 "run: --ttl 500ms on Redis reaches the server" "$DLOCK" --url "$DEAD" run --ttl 500ms "$N" -- true
expect 69 "run: --ttl 1.5s --wait 1h30m reach the server" "$DLOCK" --url "$DEAD" run --ttl 1.5s --wait 1h30m "$N" -- true

# COMMAND is looked up (PATH, the executable bit) before any connection:
# 127 not found, 126 not executable, as a shell says.
expect 127 "run: COMMAND not found, with the server down" \
    "$DLOCK" --url "$DEAD" run "$N" -- "no-such-command-$$"
grep_file "^dlock: run: cannot run 'no-such-command-$$': command not found" "$WORK/err" \
    "COMMAND not found: the message says so"
expect 127 "run: COMMAND given by a path that does not exist" \
    "$DLOCK" --url "$DEAD" run "$N" -- "$WORK/no-such-file"
printf 'echo hi\n' >"$WORK/script"
chmod 644 "$WORK/script"
expect 126 "run: COMMAND not executable, with the server down" \
    "$DLOCK" --url "$DEAD" run "$N" -- "$WORK/script"
expect 126 "run: COMMAND is a directory" "$DLOCK" --url "$DEAD" run "$N" -- "$WORK"
expect 127 "elect: COMMAND not found, with the server down" \
    "$DLOCK" --url "$DEAD" elect "$N" -- "no-such-command-$$"
mkdir "$WORK/bin"
printf '#!/bin/sh\nexit 0\n' >"$WORK/bin/not-exec-$$"
chmod 644 "$WORK/bin/not-exec-$$"
expect 126 "run: found in PATH, not executable" \
    env PATH="$WORK/bin:$PATH" "$DLOCK" --url "$DEAD" run "$N" -- "not-exec-$$"

# Accepted forms reach the server (here: the unreachable one, 69).
expect 69 "run: --opt=value forms and -E9" "$DLOCK" --url="$DEAD" run --ttl=2s --wait=0 \
    --grace=500ms -E9 "$N" -- true
expect 69 "run: options after NAME, 'forever'" "$DLOCK" --url "$DEAD" run "$N" --wait forever -- true
expect 69 "run: short --ttl with the default grace" "$DLOCK" --url "$DEAD" run --ttl 2s "$N" -- true
expect 69 "run: --ttl 1s, the shortest" "$DLOCK" --url "$DEAD" run --ttl 1s "$N" -- true
expect 69 "run: a NAME of 512 bytes, the longest" "$DLOCK" --url "$DEAD" run \
    "$(head -c 512 /dev/zero | tr '\0' n)" -- true

expect 0 "--help" "$DLOCK" --help
grep_file '^usage: dlock' "$WORK/out" "--help prints the usage on stdout"
for scheme in redis:// unix:// rediss:// etcd:// etcds://; do
    grep_file "$scheme" "$WORK/out" "--help names $scheme"
done
# SUBCOMMAND --help: that subcommand's usage and options, not the others'.
for sub in run elect status list release; do
    expect 0 "$sub --help" "$DLOCK" "$sub" --help
    grep_file "^usage: dlock \[--url URL\] $sub " "$WORK/out" "$sub --help: its own synopsis first"
    grep_file 'unit d, h, m, s or ms' "$WORK/out" "$sub --help: the duration units"
    for other in run elect status list release; do
        [ "$other" = "$sub" ] && continue
        if grep -q "dlock \[--url URL\] $other " "$WORK/out"; then
            fail "$sub --help also shows the synopsis of $other"
        fi
    done
done
grep_file '^  --force' "$WORK/out" "release --help: --force"
expect 0 "run --help after NAME" "$DLOCK" run "$N" --help
grep_file 'label TEXT' "$WORK/out" "run --help: --label"
grep_file ' --stats ' "$WORK/out" "run --help: --stats"
expect 0 "status --help" "$DLOCK" status --help
grep_file ' --json ' "$WORK/out" "status --help: --json"
expect 0 "--help lists list and status --json" "$DLOCK" --help
grep_file 'list \[--json\] \[PREFIX\]' "$WORK/out" "--help: list"
grep_file 'status \[--json\] NAME' "$WORK/out" "--help: status --json"
for scheme in redis:// unix:// rediss:// etcd:// etcds://; do
    grep_file "$scheme" "$WORK/out" "--help names $scheme"
done
expect 69 "run: --ttl in hours" "$DLOCK" --url "$DEAD" run --ttl 1h "$N" -- true
expect 69 "run: --wait in days" "$DLOCK" --url "$DEAD" run --wait 2d "$N" -- true
usage "run: --wait over 30 days" --url "$DEAD" run --wait 31d "$N" -- true
usage "run: --ttl in weeks" --url "$DEAD" run --ttl 1w "$N" -- true
grep_file 'd, h, m, s or ms' "$WORK/err" "a bad unit names the units"
# The bash completion (completions/dlock.bash) offers the subcommands and
# each one's options, and what --help lists.
COMPLETION=$(dirname "$0")/../../completions/dlock.bash
complete_words() { # WORD...: what completing the last word offers
    bash -c '. "$0"; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _dlock; echo "${COMPREPLY[*]}"' \
        "$COMPLETION" "$@"
}
[ "$(complete_words dlock li)" = list ] && pass "completion: list" ||
    fail "completion of 'dlock li': '$(complete_words dlock li)'"
[ "$(complete_words dlock status --j)" = --json ] && pass "completion: status --json" ||
    fail "completion of 'dlock status --j': '$(complete_words dlock status --j)'"
"$DLOCK" run --help >"$WORK/runhelp"
for opt in $(sed -n 's/^  \(-[-a-zA-Z]*\).*/\1/p' "$WORK/runhelp" | sort -u); do
    case $opt in --url | --force | --json | --id | --once) continue ;; esac
    case " $(complete_words dlock run "$N" -) " in
    *" $opt "*) ;;
    *) fail "completion: run does not offer $opt" ;;
    esac
done
pass "completion: run offers every run option of --help"

# The man page (man/dlock.1.scd) has every option, subcommand and exit code
# --help lists.
MAN=$(dirname "$0")/../../man/dlock.1.scd
"$DLOCK" --help >"$WORK/help"
missing=""
for opt in $(grep -oE -- '(^| |\[)--?[a-zA-Z][-a-zA-Z]*' "$WORK/help" | tr -d ' [' | sort -u); do
    grep -qF -- "*$opt*" "$MAN" || missing="$missing $opt"
done
for word in run elect status list release demo DLOCK_URL DLOCK_NAME DLOCK_FENCE; do
    grep -qF -- "*$word*" "$MAN" || missing="$missing $word"
done
for code in 64 69 70 75 76 77 126 127; do
    grep -qx -- "\*$code\*" "$MAN" || missing="$missing exit-$code"
done
[ -z "$missing" ] && pass "dlock.1.scd has every option, subcommand and exit code" ||
    fail "dlock.1.scd lacks:$missing"

expect 0 "--version" "$DLOCK" --version
grep_file '^dlock [0-9]+\.[0-9]+\.[0-9]+$' "$WORK/out" "--version prints 'dlock VERSION'"

finish
