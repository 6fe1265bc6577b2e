/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The bytes between dlock and one Redis server: a nonblocking socket (TCP or
 * unix) with TLS through OpenSSL or not, hiredis's command formatting on the
 * way out and its reply parser (redisReader) on the way in. hiredis 0.14
 * (Debian's) has no TLS, so dlock owns the I/O and keeps only hiredis's
 * protocol code, which has no I/O of its own.
 *
 * Every wait is a poll() up to a deadline on the lease clock
 * (dlock__now_ms), so a connect, a TLS handshake, a write or a read is
 * bounded whatever the peer does. Sockets are close-on-exec. Writes to a
 * peer that went away give EPIPE, never SIGPIPE: clear text is sent with
 * MSG_NOSIGNAL; OpenSSL writes with write(2), so callers block SIGPIPE
 * around their I/O (dlock__sigpipe_block) as they did for hiredis.
 *
 * A failure leaves the transport failed (err set, as in hiredis:
 * REDIS_ERR_IO, _EOF, _PROTOCOL, _OOM, _OTHER) with a lower-case text in
 * errstr, until dlock__redis_tp_close. One function, dlock__redis_conn_io_error,
 * turns that into a dlock code and message. Not thread-safe: one user at a
 * time.
 */
#ifndef DLOCK_REDIS_TRANSPORT_H
#define DLOCK_REDIS_TRANSPORT_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Where to connect and how. Strings are borrowed (from the client's URL). */
typedef struct {
    const char *unix_path; /* set: a unix socket, host and port unused */
    const char *host;
    int port;
    int tls; /* rediss:// */
    /* TLS only. cacert NULL: the system's CAs. cert and key: a client
     * certificate. sni: the name sent and checked against the server's
     * certificate (default: host). insecure: no verification at all. */
    const char *cacert;
    const char *cert;
    const char *key;
    const char *sni;
    int insecure;
} dlock__redis_endpoint;

typedef struct dlock__redis_tp {
    int fd;
    struct ssl_st *ssl; /* NULL: clear text */
    redisReader *reader; /* NULL: closed */
    char *obuf;          /* formatted commands not yet written */
    size_t olen, opos, ocap;
    int err;       /* REDIS_ERR_*; 0: usable (if open) */
    int timed_out; /* the failure was a deadline, not a dead peer */
    int auth;      /* a TLS authentication failure (certificate, CA, name) */
    int config;    /* a configuration error (a file that cannot be read) */
    int cert_asked; /* TLS: the server sent a CertificateRequest */
    int client_cert; /* TLS: we have a client certificate to give */
    int got_data;  /* TLS: the server has sent application data */
    char errstr[256];
} dlock__redis_tp;

/* Connect and, for TLS, shake hands, all before deadline_ms (on
 * dlock__now_ms). The reader is created with fn (NULL: hiredis's defaults)
 * and privdata. Returns REDIS_OK, or REDIS_ERR with the transport failed (it
 * must still be closed). */
int dlock__redis_tp_open(dlock__redis_tp *tp, const dlock__redis_endpoint *ep,
                         int64_t deadline_ms, redisReplyObjectFunctions *fn, void *privdata);

/* Close and free; a closed or zeroed transport is a no-op. The output buffer
 * is wiped first (it may hold AUTH's password). */
void dlock__redis_tp_close(dlock__redis_tp *tp);

/* Open and not failed. */
int dlock__redis_tp_ok(const dlock__redis_tp *tp);

/* Queue one command: argc binary-safe arguments (append_argv) or hiredis's
 * printf-like format (append). REDIS_ERR: out of memory. */
int dlock__redis_tp_append_argv(dlock__redis_tp *tp, int argc, const char **argv,
                                const size_t *lens);
int dlock__redis_tp_append(dlock__redis_tp *tp, const char *fmt, ...);

/* A command's RESP encoding, for one formatted once and queued on several
 * connections (the Redlock fan-out): its length, and the bytes written to
 * to (resp_len bytes; no terminating NUL). No printf: a fan-out formats on
 * the critical path. */
size_t dlock__redis_resp_len(int argc, const size_t *lens);
void dlock__redis_resp_write(char *to, int argc, const char **argv, const size_t *lens);

/* Queue len bytes of commands already in RESP (dlock__redis_resp_write). */
int dlock__redis_tp_append_resp(dlock__redis_tp *tp, const char *resp, size_t len);

/* Write everything queued, waiting up to deadline_ms. */
int dlock__redis_tp_flush(dlock__redis_tp *tp, int64_t deadline_ms);

/* Read what the server sent into the reader: waits up to deadline_ms for at
 * least some bytes; deadline_ms < 0 does not wait (after poll() said the
 * socket is readable; nothing to read then is not a failure). Everything
 * OpenSSL decrypted is taken, so poll() on the socket afterwards is
 * accurate. */
int dlock__redis_tp_read(dlock__redis_tp *tp, int64_t deadline_ms);

/* What a recv(2) of the clear-text socket done elsewhere (io_uring: the
 * Redlock fan-out) gave: res bytes at buf, fed to the reader; 0, the peer
 * closed; below 0, -errno (-EAGAIN: nothing yet, not a failure). REDIS_ERR
 * with the transport failed otherwise, as dlock__redis_tp_read. */
int dlock__redis_tp_took(dlock__redis_tp *tp, const char *buf, ssize_t res);

/* Mark the transport failed by errno e of a write done elsewhere. */
void dlock__redis_tp_fail_errno(dlock__redis_tp *tp, int e);

/* One parsed reply from what was read, or *reply NULL when none is complete. */
int dlock__redis_tp_get_reply(dlock__redis_tp *tp, void **reply);

/* Mark the transport failed with a protocol error (for the reply caps). */
void dlock__redis_tp_fail(dlock__redis_tp *tp, int err, const char *text);

#endif
