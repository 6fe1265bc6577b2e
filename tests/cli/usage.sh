#!/bin/sh
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
usage "run: fractional --ttl" --url "$DEAD" run --ttl 1.5s "$N" -- true
usage "run: negative --wait" --url "$DEAD" run --wait -1s "$N" -- true
usage "run: empty --grace" --url "$DEAD" run --grace= "$N" -- true
usage "run: --ttl without a value" --url "$DEAD" run "$N" --ttl
usage "run: zero --ttl" --url "$DEAD" run --ttl 0 "$N" -- true
usage "run: --grace equal to --ttl" --url "$DEAD" run --ttl 3s --grace 3s "$N" -- true
usage "run: --grace longer than --ttl" --url "$DEAD" run --ttl 3s --grace 1m "$N" -- true
usage "run: -E not a number" --url "$DEAD" run -E abc "$N" -- true
usage "run: -E over 255" --url "$DEAD" run -E 256 "$N" -- true
usage "run: -E negative" --url "$DEAD" run -E -1 "$N" -- true
usage "status: missing NAME" --url "$DEAD" status
usage "status: two names" --url "$DEAD" status "$N" other
usage "status: unknown option" --url "$DEAD" status --force "$N"
usage "release without --force" --url "$DEAD" release "$N"
usage "release: unknown option" --url "$DEAD" release --forse "$N"

# Accepted forms reach the server (here: the unreachable one, 69).
expect 69 "run: --opt=value forms and -E9" "$DLOCK" --url="$DEAD" run --ttl=2s --wait=0 \
    --grace=500ms -E9 "$N" -- true
expect 69 "run: options after NAME, 'forever'" "$DLOCK" --url "$DEAD" run "$N" --wait forever -- true
expect 69 "run: short --ttl with the default grace" "$DLOCK" --url "$DEAD" run --ttl 2s "$N" -- true

expect 0 "--help" "$DLOCK" --help
grep_file '^usage: dlock' "$WORK/out" "--help prints the usage on stdout"
expect 0 "run --help" "$DLOCK" run --help
grep_file '^usage: dlock' "$WORK/out" "run --help prints the usage on stdout"
expect 0 "--version" "$DLOCK" --version
grep_file '^dlock [0-9]+\.[0-9]+\.[0-9]+$' "$WORK/out" "--version prints 'dlock VERSION'"

finish
