#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# dlock run passes COMMAND's status through (128+N for signal N), and maps
# what goes wrong around it: 127/126 COMMAND not found / not executable,
# 69 server unreachable, 77 credentials refused, 64 a URL it cannot use.
# With etcd (DLOCK_CLI_BACKEND=etcd), credentials are checked against a private
# etcd with auth on.
. "$(dirname "$0")/lib.sh"

N=$(name a)
run() { "$DLOCK" --url "$URL" run "$N" -- "$@"; }

expect 0 "COMMAND succeeds" run true
expect 3 "COMMAND's status passes through" run sh -c 'exit 3'
expect 255 "status 255 passes through" run sh -c 'exit 255'
expect 137 "COMMAND killed by SIGKILL: 128+9" run sh -c 'kill -9 $$'
expect 143 "COMMAND killed by SIGTERM: 128+15" run sh -c 'kill -TERM $$'

# COMMAND's own 75 looks like dlock's "busy" (docs/cli.md); with
# --command-status-offset N its non-zero status moves up by N (at most 255),
# out of dlock's codes, while 0 stays 0.
expect 75 "COMMAND's 75 passes through, as dlock's busy would" run sh -c 'exit 75'
off() { "$DLOCK" --url "$URL" run --command-status-offset 128 "$N" -- "$@"; }
expect 0 "--command-status-offset: 0 stays 0" off true
expect 203 "--command-status-offset 128: COMMAND's 75 is 203" off sh -c 'exit 75'
expect 129 "--command-status-offset 128: COMMAND's 1 is 129" off sh -c 'exit 1'
expect 255 "--command-status-offset 128: COMMAND's 200 is 255 (at most)" off sh -c 'exit 200'
expect 255 "--command-status-offset 128: killed by SIGTERM (143) is 255" off sh -c 'kill -TERM $$'
expect 127 "--command-status-offset: not found stays dlock's 127" off "no-such-command-$$"
expect 176 "--command-status-offset=100 form: COMMAND's 76 is 176" \
    "$DLOCK" --url "$URL" run --command-status-offset=100 "$N" -- sh -c 'exit 76'
if [ "$BACKEND" = redlock ]; then
    # Redlock offers no election: refused with a message (DLOCK_ENOTSUP).
    expect 64 "elect on $BACKEND is not supported" \
        "$DLOCK" --url "$URL" elect --once "$N" -- true
    grep_file 'does not implement leader election' "$WORK/err" "elect on $BACKEND: the message says why"
else
    expect 205 "elect --once --command-status-offset 128: COMMAND's 77 is 205" \
        "$DLOCK" --url "$URL" elect --once --command-status-offset 128 "$N" -- sh -c 'exit 77'
fi

expect 127 "COMMAND not found" run "no-such-command-$$"
grep_file '^dlock: .*no-such-command' "$WORK/err" "not found: message names COMMAND"
# COMMAND is looked up before the lock is taken; what passes the look-up
# and still fails to exec (here: its interpreter is missing, ENOENT) is
# reported by the child through a pipe, after the lock was taken.
printf '#!/no/such/interpreter-%s\n' "$$" >"$WORK/badinterp"
chmod 755 "$WORK/badinterp"
expect 127 "COMMAND's interpreter not found" run "$WORK/badinterp"
grep_file '^dlock: .*badinterp' "$WORK/err" "interpreter not found: message names COMMAND"
# The exec-error report must survive however dlock's own descriptors lie:
# none above 2 (as under CI), or one inherited far above the ones dlock opens.
only_std_fds() {
    python3 -c 'import os, sys; os.closerange(3, 65536); os.execvp(sys.argv[1], sys.argv[1:])' "$@"
}
expect 127 "exec fails, no fd above 2 inherited" only_std_fds "$DLOCK" --url "$URL" run "$N" -- "$WORK/badinterp"
grep_file '^dlock: .*badinterp' "$WORK/err" "exec fails, no fd inherited: message names COMMAND"
high_fd() {
    python3 -c 'import os, sys; os.dup2(os.open("/dev/null", os.O_RDONLY), 200); os.execvp(sys.argv[1], sys.argv[1:])' "$@"
}
expect 127 "exec fails, fd 200 inherited" high_fd "$DLOCK" --url "$URL" run "$N" -- "$WORK/badinterp"
grep_file '^dlock: .*badinterp' "$WORK/err" "exec fails, fd 200 inherited: message names COMMAND"
expect 0 "COMMAND inherits fd 200, as flock(1) would pass it" high_fd "$DLOCK" --url "$URL" run "$N" -- sh -c '[ -e /proc/$$/fd/200 ]'
printf 'echo hi\n' >"$WORK/script"
chmod 644 "$WORK/script"
expect 126 "COMMAND not executable" run "$WORK/script"

# The lock is released when COMMAND ends, however it ended.
expect 0 "status after the runs" "$DLOCK" --url "$URL" status "$N"
grep_file "^$N: free, fence [0-9]+$" "$WORK/out" "lock released after every run"

# Nothing listens on port 1 (Redlock: nor on 2 and 3).
DOWN=${URL%%://*}://127.0.0.1:1
if [ "$BACKEND" = redlock ]; then DOWN=redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3; fi
if [ "$BACKEND" = mysql ]; then DOWN=mysql://127.0.0.1:1/$MYSQL_DB; fi
for cmd in "run $N -- true" "status $N" "release --force $N"; do
    # shellcheck disable=SC2086 # cmd is split on purpose
    expect 69 "unreachable server: $cmd" "$DLOCK" --url "$DOWN" $cmd
    grep_file '^dlock: .*127\.0\.0\.1:1' "$WORK/err" "unreachable: message names the server"
done
expect 69 "unreachable server from \$DLOCK_URL" env DLOCK_URL="$DOWN" "$DLOCK" status "$N"

if [ "$BACKEND" = etcd ]; then
    # The shared etcd runs without auth: a private one with auth on, whose
    # root user has another password.
    start_etcd "right-$$"
    expect 0 "the right password is accepted" "$DLOCK" --url "etcd://root:right-$$@$ETCD_HOSTPORT?insecure_auth=1" run "$N" -- true
    BAD_CREDENTIALS="etcd://root:secret@$ETCD_HOSTPORT?insecure_auth=1"
elif [ "$BACKEND" = redlock ]; then
    BAD_CREDENTIALS="redlock://nosuchuser-$$:secret@$HOSTS"
elif [ "$BACKEND" = zk ]; then
    # ZooKeeper's digest auth refuses nobody (user:password only names who
    # may touch a node that has an ACL): nothing to refuse here.
    BAD_CREDENTIALS=""
elif [ "$BACKEND" = mysql ]; then
    BAD_CREDENTIALS="mysql://nosuchuser-$$:secret@$HOSTPORT/$MYSQL_DB"
elif [ "$BACKEND" = postgres ]; then
    # scripts/test.sh's PostgreSQL asks TCP clients for their password.
    BAD_CREDENTIALS="postgres://dlock:secret@$HOSTPORT/postgres"
else
    # The server has no such user: AUTH fails with WRONGPASS.
    BAD_CREDENTIALS="redis://nosuchuser-$$:secret@$HOSTPORT"
fi
if [ -n "$BAD_CREDENTIALS" ]; then
    expect 77 "credentials refused" "$DLOCK" --url "$BAD_CREDENTIALS" run "$N" -- true
    if grep -q secret "$WORK/err"; then fail "the password appears in the message: $(cat "$WORK/err")"; fi
fi

if [ "$BACKEND" = etcd ]; then
    expect 77 "no credentials for a server with auth on" "$DLOCK" --url "$ETCD_URL" status "$N"
    # https asked for, plain http found: say so, not "connection reset".
    expect 69 "etcds:// to a plain-http etcd" "$DLOCK" --url "etcds://$HOSTPORT" status "$N"
    grep_file 'TLS was expected' "$WORK/err" "etcds:// to plain http: the message says TLS was expected"
    # What rediss:// checks for Redis: what was meant for https is never sent
    # in clear text.
    expect 64 "a TLS option on etcd:// is refused, never clear text" \
        "$DLOCK" --url "etcd://$HOSTPORT?cacert=/dev/null" status "$N"
    expect 64 "malformed URL" "$DLOCK" --url "etcd://$HOSTPORT/notaprefix" status "$N"
elif [ "$BACKEND" = zk ]; then
    expect 64 "a TLS option on zk:// is refused, never clear text" \
        "$DLOCK" --url "zk://$HOSTPORT?cacert=/dev/null" status "$N"
    grep_file "unknown parameter 'cacert'" "$WORK/err" "a TLS option on zk://: the message names it"
    expect 64 "session_timeout_ms out of range" "$DLOCK" --url "zk://$HOSTPORT?session_timeout_ms=5" status "$N"
    grep_file "session_timeout_ms '5'" "$WORK/err" "session_timeout_ms out of range: the message names it"
elif [ "$BACKEND" = mysql ]; then
    expect 64 "malformed URL: no database" "$DLOCK" --url "mysql://$HOSTPORT" status "$N"
    expect 64 "malformed URL: a mode there is not" "$DLOCK" --url "$URL?mode=advisory" status "$N"
elif [ "$BACKEND" = postgres ]; then
    expect 69 "sslmode=require to a server without TLS" \
        "$DLOCK" --url "$URL&sslmode=require" status "$N"
    grep_file 'SSL' "$WORK/err" "sslmode=require: the message says the server has no SSL"
    expect 64 "an unknown URL parameter" "$DLOCK" --url "$URL&nosuchparam=1" status "$N"
    grep_file 'nosuchparam' "$WORK/err" "an unknown parameter: the message names it"
elif [ "$BACKEND" = redlock ]; then
    expect 64 "malformed URL" "$DLOCK" --url "redlock://$HOSTS/notadb" status "$N"
    expect 64 "an even number of nodes" "$DLOCK" --url "redlock://$HOSTS,$HOSTPORT" status "$N"
else
    expect 64 "a TLS option on redis:// is refused, never clear text" \
        "$DLOCK" --url "redis://$HOSTPORT?cacert=/dev/null" status "$N"
    expect 69 "rediss:// to a plain port: the handshake gets no answer" \
        "$DLOCK" --url "rediss://$HOSTPORT" status "$N"
    grep_file 'TLS handshake' "$WORK/err" "rediss:// to a plain port: the message says TLS handshake"
    expect 64 "malformed URL" "$DLOCK" --url "redis://$HOSTPORT/notadb" status "$N"
fi
expect 64 "empty NAME" "$DLOCK" --url "$URL" run "" -- true
expect 64 "a 10 kB NAME" "$DLOCK" --url "$URL" run "$(head -c 10240 /dev/zero | tr '\0' n)" -- true
grep_file 'at most 512' "$WORK/err" "a 10 kB NAME: the message says why"
# The longest NAME works on the server, for run, status and release.
LONGEST=$(name long)
LONGEST=$LONGEST$(head -c $((512 - ${#LONGEST})) /dev/zero | tr '\0' n)
expect 0 "a NAME of 512 bytes" "$DLOCK" --url "$URL" run "$LONGEST" -- true
expect 0 "status of a NAME of 512 bytes" "$DLOCK" --url "$URL" status "$LONGEST"
expect 0 "release --force of a NAME of 512 bytes" "$DLOCK" --url "$URL" release --force "$LONGEST"
expect 64 "--ttl 1ms" "$DLOCK" --url "$URL" run --ttl 1ms "$N" -- true

finish
