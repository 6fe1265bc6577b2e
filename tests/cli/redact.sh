#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# No password in anything dlock prints (issue 19, item 5): a URL with
# credentials echoed by a usage error (--url after 'run', a misspelt
# --uri=..., a URL where NAME, COMMAND or an option's value goes), by the
# library's detail, by the demo's usage errors, or by status's output (a
# URL given as NAME), shows "user:***@" instead. Each invocation's stdout and
# stderr must hold no trace of the password, and the message must still be
# there (redacted, not dropped).
. "$(dirname "$0")/lib.sh"

PW=Pw0rd$$Secret
DEAD=127.0.0.1:1

# unseen CODE WHAT ARGS...: exit CODE; the password in neither stream.
# hidden CODE WHAT ARGS...: the same, and the redacted form "***" in one of
# them (the URL is echoed, redacted).
unseen() {
    want=$1 what=$2
    shift 2
    expect "$want" "$what" "$DLOCK" "$@"
    if grep -q -- "$PW" "$WORK/out" "$WORK/err"; then
        fail "$what: the password shows: $(cat "$WORK/out" "$WORK/err")"
        return 1
    fi
}
hidden() {
    unseen "$@" || return
    what=$2
    if ! grep -q -- '\*\*\*' "$WORK/out" "$WORK/err"; then
        fail "$what: no redacted URL in the output: $(cat "$WORK/out" "$WORK/err")"
    else
        pass "$what: password redacted"
    fi
}

N=$(name x)
hidden 64 "--url=... after run" run --url=redis://:$PW@$DEAD "$N" -- true
hidden 64 "--url=... after elect" elect --url=redis://:$PW@$DEAD "$N" -- true
hidden 64 "misspelt --uri=... before run" --uri=redis://:$PW@$DEAD run "$N" -- true
hidden 64 "misspelt --uri=... after run, user and password" \
    run --uri=redis://user:$PW@$DEAD "$N" -- true
hidden 64 "misspelt --uri=... after status" status --uri=etcd://root:$PW@$DEAD "$N"
hidden 64 "misspelt --urll=... after release" release --force --urll=redis://:$PW@$DEAD "$N"
hidden 64 "a URL as the command" redis://:$PW@$DEAD status "$N"
hidden 64 "a URL as a second NAME" --url redis://$DEAD run "$N" redis://:$PW@$DEAD -- true
hidden 64 "a URL as --ttl" --url redis://$DEAD run --ttl redis://:$PW@$DEAD "$N" -- true
hidden 64 "a URL as -E" --url redis://$DEAD run -E redis://:$PW@$DEAD "$N" -- true
hidden 64 "a URL as --permits" --url redis://$DEAD run --permits redis://:$PW@$DEAD "$N" -- true
hidden 64 "a password without a user" run --url=redis://$PW@$DEAD "$N" -- true
hidden 127 "a URL as COMMAND" --url redis://$DEAD run "$N" -- redis://:$PW@$DEAD
unseen 64 "a bad URL with a password" --url "redis://:$PW@127.0.0.1:99999" status "$N"
unseen 69 "an unreachable URL with a password" --url "redis://:$PW@$DEAD" status "$N"
# A long NAME is shown cut short: cut after the redaction, never before.
hidden 64 "a 10 kB URL as NAME" --url redis://$DEAD run \
    "redis://:$PW$(head -c 10240 /dev/zero | tr '\0' p)@$DEAD" -- true
LONG="redis://:$PW$(head -c 300 /dev/zero | tr '\0' p)@$DEAD"
hold "$LONG" long
hidden 75 "a long URL as NAME, busy: shown cut short" --url "$URL" run "$LONG" -- true
kill -TERM "$HOLDER"
wait "$HOLDER"
# And on stdout: status and release --force print NAME.
hidden 0 "a URL as NAME, status's output" --url "$URL" status "redis://:$PW@$DEAD"
grep_file '^redis://:\*\*\*@127\.0\.0\.1:1: free' "$WORK/out" "status's output: NAME redacted"
hidden 0 "a URL as NAME, release's output" --url "$URL" release --force "redis://u:$PW@$DEAD"
# Secrets in the query (issue 26, item 8): password=, sentinel_password=,
# sslpassword=, key_secret= and any parameter whose name ends in password,
# secret or key show "=***" in usage errors, the library's detail, the -v log
# and status's output.
for q in password sentinel_password sslpassword key_secret tls_key my_secret; do
    hidden 64 "$q= in a misspelt --uri=..." status --uri="redis://$DEAD/?db=1&$q=$PW" "$N"
    grep_file "[?&]$q=\\*\\*\\*" "$WORK/err" "$q=: value shown as ***"
    hidden 0 "$q= in a URL as NAME, status's output" --url "$URL" status "redis://$DEAD?$q=$PW&x=1"
    grep_file "^redis://127\\.0\\.0\\.1:1\\?$q=\\*\\*\\*&x=1: free" "$WORK/out" \
        "status's output: $q= redacted, the rest kept"
done
unseen 64 "password= in a URL refused by the library" --url "redis://$DEAD?password=$PW&bogus=1" status "$N"
unseen 64 "zk:// with key_secret= refused by the library" \
    --url "zk://$DEAD?session_timeout_ms=5&key_secret=$PW" status "$N"
unseen 64 "run -v, a URL with sentinel_password=" \
    --url "redis://$DEAD?sentinel_password=$PW" run -v "$N" -- true
# The demo's usage errors.
unseen 64 "demo: misspelt --uri=..." demo payout --uri=redis://:$PW@$DEAD
hidden 64 "demo: a URL as an argument" demo payout redis://:$PW@$DEAD
hidden 64 "demo: a URL as --pause" demo payout --pause redis://:$PW@$DEAD

finish
