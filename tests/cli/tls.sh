#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# The dlock command over rediss:// (DLOCK_CLI_BACKEND=rediss: lib.sh starts
# a private TLS redis-server): a lock run through TLS, and each refusal with
# its exit code and a message that names what failed: an unknown CA and a
# name mismatch (77, the server's identity not proven), a CA file that
# cannot be read (64), a plain port (69), and a server that requires client
# certificates (77 without one; works with one).
. "$(dirname "$0")/lib.sh"
[ "$BACKEND" = rediss ] || { fail "run with DLOCK_CLI_BACKEND=rediss"; finish; }
T=$WORK/tls

N=$(name t)
expect 0 "run over TLS" "$DLOCK" --url "$URL" run "$N" -- sh -c 'echo "fence $DLOCK_FENCE"'
grep_file '^fence [0-9]+$' "$WORK/out" "COMMAND ran with a fence"
expect 0 "status over TLS" "$DLOCK" --url "$URL" status "$N"

B=rediss://127.0.0.1:$TLS_PORT
expect 77 "unknown CA" "$DLOCK" --url "$B?cacert=$T/other-ca.crt" run "$N" -- true
grep_file "rediss 127.0.0.1:$TLS_PORT: TLS: .*unknown CA" "$WORK/err" "unknown CA: named"
expect 77 "name mismatch" "$DLOCK" --url "$B?cacert=$T/ca.crt&sni=redis.example.com" run "$N" -- true
grep_file "name mismatch" "$WORK/err" "name mismatch: named"
expect 0 "sni= the certificate's name" "$DLOCK" --url "$B?cacert=$T/ca.crt&sni=localhost" run "$N" -- true
expect 64 "CA file missing" "$DLOCK" --url "$B?cacert=$T/missing.crt" run "$N" -- true
grep_file "cannot read the CA file cacert=$T/missing.crt: no such file" "$WORK/err" "missing CA file: named"
expect 64 "TLS option on redis://" "$DLOCK" --url "redis://127.0.0.1:$TLS_PORT?cacert=$T/ca.crt" run "$N" -- true
grep_file "use rediss://" "$WORK/err" "TLS option on redis://: says rediss"
expect 69 "rediss:// to the plain port" "$DLOCK" --url "rediss://$HOSTPORT?cacert=$T/ca.crt" \
    run "$N" -- true
grep_file "timed out \(TLS handshake" "$WORK/err" "plain port: the handshake timed out"

# A second server that requires client certificates.
kill -TERM "$REDIS_TLS_PID"
wait "$REDIS_TLS_PID" 2>/dev/null
start_redis_tls --tls-auth-clients yes
B=rediss://127.0.0.1:$TLS_PORT
expect 77 "no client certificate" "$DLOCK" --url "$URL" run "$N" -- true
grep_file "requires a client certificate" "$WORK/err" "no client certificate: named"
expect 0 "with a client certificate" "$DLOCK" \
    --url "$B?cacert=$T/ca.crt&cert=$T/client.crt&key=$T/client.key" run "$N" -- true
finish
