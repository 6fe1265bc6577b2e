#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# make_certs.sh DIR FAKETIME_LIB: the certificates of the TLS tests, made
# with openssl into DIR (which must exist): ca (a CA); server (127.0.0.1 and
# localhost), client and expired (a server certificate whose one day of
# validity ended 2000 days ago, signed under libfaketime), all signed by ca;
# other-ca and other (a server certificate for 127.0.0.1 from other-ca).
# Each as NAME.crt and NAME.key. Used by tests/support/test.c (test_tls_make)
# and tests/cli/lib.sh (BACKEND=rediss). openssl's chatter goes to
# DIR/openssl.log.
set -eu
dir=${1:?usage: make_certs.sh DIR FAKETIME_LIB}
faketime=${2:?usage: make_certs.sh DIR FAKETIME_LIB}
cd "$dir"
exec 2>openssl.log
ca() {
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.crt" -days 30 \
        -subj "/CN=dlock test $1" >/dev/null
}
# sign NAME CA SAN [DAYS [ENV...]]
sign() {
    name=$1 signer=$2 san=$3 days=${4:-30}
    shift 3
    [ $# -gt 0 ] && shift
    openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" \
        -subj "/CN=$name" >/dev/null
    printf 'subjectAltName=%s\n' "$san" >"$name.ext"
    env "$@" openssl x509 -req -in "$name.csr" -CA "$signer.crt" -CAkey "$signer.key" \
        -CAcreateserial -days "$days" -extfile "$name.ext" -out "$name.crt" >/dev/null
}
ca ca
ca other-ca
sign server ca 'IP:127.0.0.1,DNS:localhost'
sign client ca 'DNS:dlock-client'
sign other other-ca 'IP:127.0.0.1,DNS:localhost'
sign expired ca 'IP:127.0.0.1,DNS:localhost' 1 LD_PRELOAD="$faketime" FAKETIME=-2000d
chmod 600 ./*.key
