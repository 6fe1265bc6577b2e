/* SPDX-License-Identifier: BSD-3-Clause */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "backends/redis/redis_transport.h"
#include "core/clock.h"

/* Each read takes at most this much, so a reply's size is checked as it
 * grows (the caps of redis_conn.h); also one TLS record's largest payload. */
#define READ_CHUNK (16 * 1024)

/* ---- failures -------------------------------------------------------- */

static int fail(dlock__redis_tp *tp, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(dlock__redis_tp *tp, int err, const char *fmt, ...)
{
    va_list ap;

    if (tp->err != 0)
        return REDIS_ERR; /* the first cause is the one to report */
    tp->err = err;
    va_start(ap, fmt);
    vsnprintf(tp->errstr, sizeof(tp->errstr), fmt, ap);
    va_end(ap);
    return REDIS_ERR;
}

void dlock__redis_tp_fail(dlock__redis_tp *tp, int err, const char *text)
{
    fail(tp, err, "%s", text);
}

static int fail_errno(dlock__redis_tp *tp, int e, const char *what)
{
    char text[128];

    snprintf(text, sizeof(text), "%s", strerror(e));
    if (text[0] >= 'A' && text[0] <= 'Z')
        text[0] = (char)(text[0] - 'A' + 'a');
    return fail(tp, REDIS_ERR_IO, "%s%s", what, text);
}

static int fail_timeout(dlock__redis_tp *tp, const char *what)
{
    tp->timed_out = 1;
    return fail(tp, REDIS_ERR_IO, "timed out (%s)", what);
}

/* ---- waiting --------------------------------------------------------- */

/* Wait until fd is ready for events or deadline_ms passes. 1: ready (or an
 * error or hang-up to be found by the next call), 0: deadline, -1: poll
 * failed (errno). */
static int wait_fd(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events, .revents = 0};
        int64_t left = deadline_ms - dlock__now_ms();
        int n;

        if (left <= 0)
            return 0;
        n = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* ---- connecting ------------------------------------------------------ */

static int connect_addr(dlock__redis_tp *tp, const struct sockaddr *sa, socklen_t len,
                        int64_t deadline_ms)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int e = 0, n;
    socklen_t elen = sizeof(e);

    if (fd < 0)
        return fail_errno(tp, errno, "socket: ");
    if (connect(fd, sa, len) != 0) {
        if (errno != EINPROGRESS && errno != EAGAIN) {
            e = errno;
            close(fd);
            return fail_errno(tp, e, "");
        }
        n = wait_fd(fd, POLLOUT, deadline_ms);
        if (n <= 0) {
            e = errno;
            close(fd);
            return n == 0 ? fail_timeout(tp, "connect") : fail_errno(tp, e, "poll: ");
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0)
            e = errno;
        if (e != 0) {
            close(fd);
            return fail_errno(tp, e, "");
        }
    }
    if (sa->sa_family != AF_UNIX) {
        int one = 1;
        /* Requests are small and each waits for its reply: no Nagle delay. */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    tp->fd = fd;
    return REDIS_OK;
}

static int connect_socket(dlock__redis_tp *tp, const dlock__redis_endpoint *ep,
                          int64_t deadline_ms)
{
    struct addrinfo hints, *res = NULL;
    char port[16];
    int rc;

    if (ep->unix_path != NULL) {
        struct sockaddr_un sun;
        memset(&sun, 0, sizeof(sun));
        sun.sun_family = AF_UNIX;
        if (strlen(ep->unix_path) >= sizeof(sun.sun_path))
            return fail(tp, REDIS_ERR_OTHER, "socket path too long");
        memcpy(sun.sun_path, ep->unix_path, strlen(ep->unix_path));
        return connect_addr(tp, (struct sockaddr *)&sun, sizeof(sun), deadline_ms);
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof(port), "%d", ep->port);
    rc = getaddrinfo(ep->host, port, &hints, &res);
    if (rc != 0)
        return fail(tp, REDIS_ERR_OTHER, "cannot resolve the host: %s", gai_strerror(rc));
    rc = REDIS_ERR;
    for (struct addrinfo *a = res; a != NULL && rc != REDIS_OK; a = a->ai_next) {
        if (a != res && !tp->timed_out) {
            tp->err = 0; /* the next address may answer */
            tp->errstr[0] = '\0';
        }
        if (tp->timed_out)
            break;
        rc = connect_addr(tp, a->ai_addr, a->ai_addrlen, deadline_ms);
    }
    freeaddrinfo(res);
    return rc;
}

/* ---- TLS --------------------------------------------------------------- */

/* The reason of the newest OpenSSL error, for a message. */
static const char *ssl_reason(char *buf, size_t size)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;

    snprintf(buf, size, "%s", r != NULL ? r : "unknown error");
    return buf;
}

/* Why OpenSSL failed, after SSL_get_error gave code; fail()s with a text
 * that names it. stage: "handshake", "read", "write". */
static int fail_ssl(dlock__redis_tp *tp, int code, const char *stage)
{
    unsigned long e = ERR_peek_last_error();
    int reason = ERR_GET_REASON(e);
    char why[160];
    long v;

    if ((code == SSL_ERROR_ZERO_RETURN || (code == SSL_ERROR_SYSCALL && e == 0)) &&
        tp->cert_asked && !tp->got_data) {
        /* In TLS 1.3 the server checks our certificate after our side of
         * the handshake is over: a refusal comes as an alert that a reset
         * connection may lose, so this is all we may ever see of it. */
        tp->auth = 1;
        return fail(tp, REDIS_ERR_OTHER, tp->client_cert
                    ? "TLS: the server refused our client certificate (it asked for one and "
                      "closed the connection before answering: is cert= signed by its CA?)"
                    : "TLS: the server requires a client certificate (give cert=FILE&key=FILE)");
    }
    if (code == SSL_ERROR_ZERO_RETURN)
        return fail(tp, REDIS_ERR_EOF, "server closed the connection");
    if (code == SSL_ERROR_SYSCALL && e == 0) {
        if (errno != 0 && errno != EAGAIN)
            return fail_errno(tp, errno, "TLS: ");
        if (strcmp(stage, "handshake") == 0)
            return fail(tp, REDIS_ERR_EOF, "TLS handshake failed: the server closed the "
                        "connection (is this a TLS port? rediss:// expects TLS)");
        return fail(tp, REDIS_ERR_EOF, "server closed the connection");
    }
    if (tp->ssl != NULL && (v = SSL_get_verify_result(tp->ssl)) != X509_V_OK &&
        strcmp(stage, "handshake") == 0) {
        tp->auth = 1;
        switch (v) {
        case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
        case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
        case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
        case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
        case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
        case X509_V_ERR_CERT_SIGNATURE_FAILURE:
            return fail(tp, REDIS_ERR_OTHER, "TLS: the server's certificate is not signed by a "
                        "trusted CA (unknown CA: %s; give the CA with cacert=FILE)",
                        X509_verify_cert_error_string(v));
        case X509_V_ERR_HOSTNAME_MISMATCH:
        case X509_V_ERR_IP_ADDRESS_MISMATCH:
            return fail(tp, REDIS_ERR_OTHER, "TLS: the server's certificate does not match "
                        "the name '%.64s' (name mismatch; sni=NAME gives the name to check)",
                        SSL_get_servername(tp->ssl, TLSEXT_NAMETYPE_host_name) != NULL
                            ? SSL_get_servername(tp->ssl, TLSEXT_NAMETYPE_host_name)
                            : X509_VERIFY_PARAM_get0_peername(SSL_get0_param(tp->ssl)) != NULL
                                  ? X509_VERIFY_PARAM_get0_peername(SSL_get0_param(tp->ssl))
                                  : "?");
        case X509_V_ERR_CERT_HAS_EXPIRED:
            return fail(tp, REDIS_ERR_OTHER, "TLS: the server's certificate has expired");
        case X509_V_ERR_CERT_NOT_YET_VALID:
            return fail(tp, REDIS_ERR_OTHER, "TLS: the server's certificate is not valid yet");
        default:
            return fail(tp, REDIS_ERR_OTHER, "TLS: the server's certificate was refused: %s",
                        X509_verify_cert_error_string(v));
        }
    }
    switch (reason) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        tp->auth = 1;
        return fail(tp, REDIS_ERR_OTHER, "TLS: the server requires a client certificate "
                    "(give cert=FILE&key=FILE)");
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
        tp->auth = 1;
        return fail(tp, REDIS_ERR_OTHER, "TLS: the server refused our client certificate (%s)",
                    ssl_reason(why, sizeof(why)));
    case SSL_R_SSLV3_ALERT_HANDSHAKE_FAILURE:
        tp->auth = 1;
        return fail(tp, REDIS_ERR_OTHER, "TLS %s failed: the server sent a handshake failure "
                    "alert (does it require a client certificate, cert=FILE&key=FILE?)", stage);
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_PACKET_LENGTH_TOO_LONG:
        return fail(tp, REDIS_ERR_IO, "TLS %s failed: the server does not speak TLS "
                    "(%s): is this a plain redis:// port?", stage, ssl_reason(why, sizeof(why)));
    default:
        return fail(tp, REDIS_ERR_IO, "TLS %s failed: %s", stage, ssl_reason(why, sizeof(why)));
    }
}

/* Why file cannot be read, or NULL when it can (then OpenSSL's reason is
 * the one to tell). */
static const char *unreadable(const char *file, char *buf, size_t size)
{
    if (file == NULL || access(file, R_OK) == 0)
        return NULL;
    snprintf(buf, size, "%s", strerror(errno));
    if (buf[0] >= 'A' && buf[0] <= 'Z')
        buf[0] = (char)(buf[0] - 'A' + 'a');
    return buf;
}

/* The CA, client certificate and key, read at each connect (so rotated
 * files are used from the next reconnect on). */
static SSL_CTX *make_ssl_ctx(dlock__redis_tp *tp, const dlock__redis_endpoint *ep)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    char why[160];
    const char *bad;

    if (ctx == NULL) {
        fail(tp, REDIS_ERR_OOM, "out of memory");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (ep->cacert != NULL ? SSL_CTX_load_verify_locations(ctx, ep->cacert, NULL) != 1
                           : SSL_CTX_set_default_verify_paths(ctx) != 1) {
        tp->config = 1;
        bad = unreadable(ep->cacert, why, sizeof(why));
        fail(tp, REDIS_ERR_OTHER, "TLS: cannot read the CA file cacert=%.100s: %s",
             ep->cacert != NULL ? ep->cacert : "(system default)",
             bad != NULL ? bad : ssl_reason(why, sizeof(why)));
        goto err;
    }
    if (ep->cert != NULL) {
        if (SSL_CTX_use_certificate_chain_file(ctx, ep->cert) != 1) {
            tp->config = 1;
            bad = unreadable(ep->cert, why, sizeof(why));
            fail(tp, REDIS_ERR_OTHER, "TLS: cannot read the client certificate cert=%.100s: %s",
                 ep->cert, bad != NULL ? bad : ssl_reason(why, sizeof(why)));
            goto err;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, ep->key, SSL_FILETYPE_PEM) != 1 ||
            SSL_CTX_check_private_key(ctx) != 1) {
            tp->config = 1;
            bad = unreadable(ep->key, why, sizeof(why));
            fail(tp, REDIS_ERR_OTHER, "TLS: cannot use the client key key=%.100s: %s", ep->key,
                 bad != NULL ? bad : ssl_reason(why, sizeof(why)));
            goto err;
        }
    }
    SSL_CTX_set_verify(ctx, ep->insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
    return ctx;

err:
    SSL_CTX_free(ctx);
    return NULL;
}

static int is_ip(const char *s)
{
    unsigned char buf[sizeof(struct in6_addr)];

    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

/* Notes a CertificateRequest from the server (see fail_ssl). */
static void on_tls_message(int write_p, int version, int content_type, const void *buf,
                           size_t len, SSL *ssl, void *arg)
{
    dlock__redis_tp *tp = arg;

    (void)version;
    (void)ssl;
    if (!write_p && content_type == SSL3_RT_HANDSHAKE && len > 0 &&
        ((const unsigned char *)buf)[0] == SSL3_MT_CERTIFICATE_REQUEST)
        tp->cert_asked = 1;
}

static int tls_handshake(dlock__redis_tp *tp, const dlock__redis_endpoint *ep,
                         int64_t deadline_ms)
{
    const char *name = ep->sni != NULL ? ep->sni : ep->host;
    SSL_CTX *ctx;

    ERR_clear_error();
    if ((ctx = make_ssl_ctx(tp, ep)) == NULL)
        return REDIS_ERR;
    tp->ssl = SSL_new(ctx);
    SSL_CTX_free(ctx); /* the SSL holds its own reference */
    if (tp->ssl == NULL || SSL_set_fd(tp->ssl, tp->fd) != 1)
        return fail(tp, REDIS_ERR_OOM, "out of memory");
    tp->client_cert = ep->cert != NULL;
    SSL_set_msg_callback(tp->ssl, on_tls_message);
    SSL_set_msg_callback_arg(tp->ssl, tp);
    /* SNI carries host names only (RFC 6066), never an address. */
    if (!is_ip(name) && SSL_set_tlsext_host_name(tp->ssl, name) != 1)
        return fail(tp, REDIS_ERR_OTHER, "TLS: bad server name '%.64s'", name);
    if (!ep->insecure) {
        int ok = is_ip(name) ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(tp->ssl), name)
                             : SSL_set1_host(tp->ssl, name);
        if (ok != 1)
            return fail(tp, REDIS_ERR_OTHER, "TLS: bad server name '%.64s'", name);
        SSL_set_hostflags(tp->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    }
    for (;;) {
        int rc, code, n;

        ERR_clear_error();
        errno = 0;
        rc = SSL_connect(tp->ssl);
        if (rc == 1)
            return REDIS_OK;
        code = SSL_get_error(tp->ssl, rc);
        if (code != SSL_ERROR_WANT_READ && code != SSL_ERROR_WANT_WRITE)
            return fail_ssl(tp, code, "handshake");
        n = wait_fd(tp->fd, code == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline_ms);
        if (n == 0)
            return fail_timeout(tp, "TLS handshake: no answer; is this a TLS port?");
        if (n < 0)
            return fail_errno(tp, errno, "poll: ");
    }
}

/* ---- the transport ---------------------------------------------------- */

int dlock__redis_tp_open(dlock__redis_tp *tp, const dlock__redis_endpoint *ep,
                         int64_t deadline_ms, redisReplyObjectFunctions *fn, void *privdata)
{
    memset(tp, 0, sizeof(*tp));
    tp->fd = -1;
    tp->reader = fn != NULL ? redisReaderCreateWithFunctions(fn) : redisReaderCreate();
    if (tp->reader == NULL)
        return fail(tp, REDIS_ERR_OOM, "out of memory");
    tp->reader->privdata = privdata;
    if (connect_socket(tp, ep, deadline_ms) != REDIS_OK)
        return REDIS_ERR;
    if (ep->tls)
        return tls_handshake(tp, ep, deadline_ms);
    return REDIS_OK;
}

void dlock__redis_tp_close(dlock__redis_tp *tp)
{
    if (tp->ssl != NULL)
        SSL_free(tp->ssl); /* no close_notify: it could block, and Redis needs none */
    if (tp->fd >= 0 && tp->reader != NULL)
        close(tp->fd);
    if (tp->reader != NULL)
        redisReaderFree(tp->reader);
    if (tp->obuf != NULL) {
        explicit_bzero(tp->obuf, tp->ocap);
        free(tp->obuf);
    }
    memset(tp, 0, sizeof(*tp));
    tp->fd = -1;
}

int dlock__redis_tp_ok(const dlock__redis_tp *tp)
{
    return tp->reader != NULL && tp->err == 0;
}

/* Room for len more bytes in the output buffer: a pointer to where they go,
 * or NULL (the transport failed: out of memory). */
static char *out_room(dlock__redis_tp *tp, size_t len)
{
    if (tp->opos == tp->olen)
        tp->opos = tp->olen = 0;
    if (tp->olen + len > tp->ocap) {
        size_t cap = tp->ocap * 2 > tp->olen + len ? tp->ocap * 2 : tp->olen + len + 256;
        char *grown = malloc(cap);
        if (grown == NULL) {
            fail(tp, REDIS_ERR_OOM, "out of memory");
            return NULL;
        }
        /* Not realloc: the old block may hold a password, wiped before free. */
        if (tp->obuf != NULL) {
            memcpy(grown, tp->obuf, tp->olen);
            explicit_bzero(tp->obuf, tp->ocap);
            free(tp->obuf);
        }
        tp->obuf = grown;
        tp->ocap = cap;
    }
    return tp->obuf + tp->olen;
}

/* hiredis's formatting (redisvFormatCommand), copied in and wiped. */
static int append_raw(dlock__redis_tp *tp, char *cmd, int len)
{
    char *to;

    if (len < 0)
        return fail(tp, REDIS_ERR_OOM, "out of memory");
    to = out_room(tp, (size_t)len);
    if (to != NULL) {
        memcpy(to, cmd, (size_t)len);
        tp->olen += (size_t)len;
    }
    explicit_bzero(cmd, (size_t)len);
    redisFreeCommand(cmd);
    return to != NULL ? REDIS_OK : REDIS_ERR;
}

/* Decimal digits of v, written backwards from end; returns the first. */
static char *put_decimal(char *end, size_t v)
{
    do {
        *--end = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    return end;
}

/* One RESP header line: c (the type), n, CRLF, at to; its length. */
static size_t put_header(char *to, char c, size_t n)
{
    char digits[24], *d = put_decimal(digits + sizeof(digits), n);
    size_t nd = (size_t)(digits + sizeof(digits) - d);

    to[0] = c;
    memcpy(to + 1, d, nd);
    to[1 + nd] = '\r';
    to[2 + nd] = '\n';
    return 3 + nd;
}

static size_t decimal_len(size_t v)
{
    size_t n = 1;

    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

size_t dlock__redis_resp_len(int argc, const size_t *lens)
{
    size_t len = 3 + decimal_len((size_t)argc);

    for (int i = 0; i < argc; i++)
        len += 3 + decimal_len(lens[i]) + lens[i] + 2;
    return len;
}

void dlock__redis_resp_write(char *to, int argc, const char **argv, const size_t *lens)
{
    to += put_header(to, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        to += put_header(to, '$', lens[i]);
        memcpy(to, argv[i], lens[i]);
        to += lens[i];
        to[0] = '\r';
        to[1] = '\n';
        to += 2;
    }
}

int dlock__redis_tp_append_argv(dlock__redis_tp *tp, int argc, const char **argv,
                                const size_t *lens)
{
    size_t len = dlock__redis_resp_len(argc, lens);
    char *to;

    if (!dlock__redis_tp_ok(tp) || (to = out_room(tp, len)) == NULL)
        return REDIS_ERR;
    dlock__redis_resp_write(to, argc, argv, lens);
    tp->olen += len;
    return REDIS_OK;
}

int dlock__redis_tp_append_resp(dlock__redis_tp *tp, const char *resp, size_t len)
{
    char *to;

    if (!dlock__redis_tp_ok(tp) || (to = out_room(tp, len)) == NULL)
        return REDIS_ERR;
    memcpy(to, resp, len);
    tp->olen += len;
    return REDIS_OK;
}

int dlock__redis_tp_append(dlock__redis_tp *tp, const char *fmt, ...)
{
    char *cmd = NULL;
    va_list ap;
    int len;

    if (!dlock__redis_tp_ok(tp))
        return REDIS_ERR;
    va_start(ap, fmt);
    len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    return append_raw(tp, cmd, len);
}

int dlock__redis_tp_flush(dlock__redis_tp *tp, int64_t deadline_ms)
{
    if (!dlock__redis_tp_ok(tp))
        return REDIS_ERR;
    while (tp->opos < tp->olen) {
        size_t want = tp->olen - tp->opos;
        short ev = POLLOUT;
        ssize_t n;
        int w;

        if (tp->ssl != NULL) {
            ERR_clear_error();
            errno = 0;
            n = SSL_write(tp->ssl, tp->obuf + tp->opos, want > INT32_MAX ? INT32_MAX : (int)want);
            if (n <= 0) {
                int code = SSL_get_error(tp->ssl, (int)n);
                if (code != SSL_ERROR_WANT_READ && code != SSL_ERROR_WANT_WRITE)
                    return fail_ssl(tp, code, "write");
                ev = code == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
            }
        } else {
            n = send(tp->fd, tp->obuf + tp->opos, want, MSG_NOSIGNAL);
            if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return fail_errno(tp, errno, "");
        }
        if (n > 0) {
            tp->opos += (size_t)n;
            continue;
        }
        w = wait_fd(tp->fd, ev, deadline_ms);
        if (w == 0)
            return fail_timeout(tp, "write");
        if (w < 0)
            return fail_errno(tp, errno, "poll: ");
    }
    tp->opos = tp->olen = 0;
    return REDIS_OK;
}

/* What a clear-text recv(2) of the socket gave (n, and e its errno when n <
 * 0): n bytes, 0 when nothing was there yet, or -1 with the transport
 * failed (the peer closed, or an error). */
static ssize_t received(dlock__redis_tp *tp, ssize_t n, int e)
{
    if (n > 0)
        return n;
    if (n == 0) {
        fail(tp, REDIS_ERR_EOF, "server closed the connection");
        return -1;
    }
    if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR)
        return 0;
    fail_errno(tp, e, "");
    return -1;
}

/* One read into buf: > 0 bytes, 0 would block (*ev: what to wait for),
 * -1 failed. */
static ssize_t read_some(dlock__redis_tp *tp, char *buf, size_t size, short *ev)
{
    ssize_t n;

    *ev = POLLIN;
    if (tp->ssl != NULL) {
        int code;
        ERR_clear_error();
        errno = 0;
        n = SSL_read(tp->ssl, buf, (int)size);
        if (n > 0) {
            tp->got_data = 1;
            return n;
        }
        code = SSL_get_error(tp->ssl, (int)n);
        if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) {
            *ev = code == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
            return 0;
        }
        fail_ssl(tp, code, "read");
        return -1;
    }
    n = recv(tp->fd, buf, size, 0);
    return received(tp, n, n < 0 ? errno : 0);
}

int dlock__redis_tp_read(dlock__redis_tp *tp, int64_t deadline_ms)
{
    char buf[READ_CHUNK];

    if (!dlock__redis_tp_ok(tp))
        return REDIS_ERR;
    for (;;) {
        short ev;
        ssize_t n = read_some(tp, buf, sizeof(buf), &ev);
        int w;

        if (n < 0)
            return REDIS_ERR;
        if (n > 0) {
            if (redisReaderFeed(tp->reader, buf, (size_t)n) != REDIS_OK)
                return fail(tp, REDIS_ERR_OOM, "out of memory");
            /* What OpenSSL holds decrypted the socket no longer shows. */
            if (tp->ssl != NULL && SSL_pending(tp->ssl) > 0)
                continue;
            return REDIS_OK;
        }
        if (deadline_ms < 0)
            return REDIS_OK;
        w = wait_fd(tp->fd, ev, deadline_ms);
        if (w == 0)
            return fail_timeout(tp, "read");
        if (w < 0)
            return fail_errno(tp, errno, "poll: ");
    }
}

int dlock__redis_tp_took(dlock__redis_tp *tp, const char *buf, ssize_t res)
{
    ssize_t n;

    if (!dlock__redis_tp_ok(tp) || tp->ssl != NULL)
        return REDIS_ERR;
    n = received(tp, res < 0 ? -1 : res, res < 0 ? (int)-res : 0);
    if (n < 0)
        return REDIS_ERR;
    if (n > 0 && redisReaderFeed(tp->reader, buf, (size_t)n) != REDIS_OK)
        return fail(tp, REDIS_ERR_OOM, "out of memory");
    return REDIS_OK;
}

void dlock__redis_tp_fail_errno(dlock__redis_tp *tp, int e)
{
    fail_errno(tp, e, "");
}

int dlock__redis_tp_get_reply(dlock__redis_tp *tp, void **reply)
{
    *reply = NULL;
    if (!dlock__redis_tp_ok(tp))
        return REDIS_ERR;
    if (redisReaderGetReply(tp->reader, reply) != REDIS_OK)
        return fail(tp, tp->reader->err == REDIS_ERR_OOM ? REDIS_ERR_OOM : REDIS_ERR_PROTOCOL,
                    "%s", tp->reader->errstr);
    return REDIS_OK;
}
