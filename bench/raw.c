/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench: direct hiredis connections, used for the raw round-trip
 * baseline that the dlock figures are compared with.
 *
 * The URL parser here only has to find the server dlock is pointed at; the
 * library's own parser stays the one that decides what a valid URL is (the
 * library is opened with the same string, and fails first if it is bad, so
 * rediss:// and unknown schemes never get here).
 */
#include "bench.h"

#include <ctype.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

/* Copy src[0..len) into dst, decoding %XX escapes. Returns 0, or -1 when it
 * does not fit or an escape is malformed. */
static int copy_decoded(char *dst, size_t dst_size, const char *src, size_t len)
{
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        int ch = (unsigned char)src[i];
        if (ch == '%') {
            if (i + 2 >= len || !isxdigit((unsigned char)src[i + 1]) ||
                !isxdigit((unsigned char)src[i + 2]))
                return -1;
            char hex[3] = {src[i + 1], src[i + 2], 0};
            ch = (int)strtol(hex, NULL, 16);
            i += 2;
        }
        if (o + 1 >= dst_size)
            return -1;
        dst[o++] = (char)ch;
    }
    dst[o] = 0;
    return 0;
}

static int parse_db(const char *s, int *db)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < 0 || v > 1000000)
        return -1;
    *db = (int)v;
    return 0;
}

int bench_endpoint_parse(bench_endpoint *out, const char *url, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    out->port = 6379;

    if (strncmp(url, "unix://", 7) == 0) {
        const char *path = url + 7;
        const char *q = strchr(path, '?');
        size_t len = q ? (size_t)(q - path) : strlen(path);
        out->is_unix = 1;
        if (len == 0 || copy_decoded(out->path, sizeof out->path, path, len) != 0) {
            snprintf(err, err_size, "bad socket path in %s", url);
            return -1;
        }
        if (q && (strncmp(q, "?db=", 4) != 0 || parse_db(q + 4, &out->db) != 0)) {
            snprintf(err, err_size, "bad query in %s (only ?db=N)", url);
            return -1;
        }
        return 0;
    }
    if (strncmp(url, "rediss://", 9) == 0)
        out->tls = 1;
    else if (strncmp(url, "redis://", 8) != 0)
        goto bad;

    const char *auth = url + (out->tls ? 9 : 8);
    const char *query = strchr(auth, '?');
    const char *slash = memchr(auth, '/', query ? (size_t)(query - auth) : strlen(auth));
    const char *end = slash ? slash : query ? query : auth + strlen(auth);
    /* rediss's TLS settings (the library has checked them already). */
    for (const char *p = query; p != NULL && *p != 0; p = strchr(p + 1, '&')) {
        static const struct { const char *name; size_t off; } keys[] = {
            {"cacert=", offsetof(bench_endpoint, cacert)},
            {"cert=", offsetof(bench_endpoint, cert)},
            {"key=", offsetof(bench_endpoint, key)},
            {"sni=", offsetof(bench_endpoint, sni)},
        };
        const char *kv = p + 1, *amp = strchr(kv, '&');
        size_t len = amp ? (size_t)(amp - kv) : strlen(kv);
        if (strncmp(kv, "insecure=1", len) == 0 && len == 10)
            out->insecure = 1;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
            size_t n = strlen(keys[i].name);
            if (len > n && strncmp(kv, keys[i].name, n) == 0 &&
                copy_decoded((char *)out + keys[i].off, 256, kv + n, len - n) != 0)
                goto bad;
        }
    }
    const char *at = NULL;
    for (const char *p = auth; p < end; p++)
        if (*p == '@')
            at = p;
    const char *host = auth;
    if (at) {
        const char *colon = memchr(auth, ':', (size_t)(at - auth));
        if (colon) {
            if (copy_decoded(out->user, sizeof out->user, auth, (size_t)(colon - auth)) != 0 ||
                copy_decoded(out->password, sizeof out->password, colon + 1,
                             (size_t)(at - colon - 1)) != 0)
                goto bad;
        } else if (copy_decoded(out->password, sizeof out->password, auth,
                                (size_t)(at - auth)) != 0) {
            goto bad;
        }
        host = at + 1;
    }

    const char *host_end;
    const char *port = NULL;
    if (*host == '[') {
        const char *close = memchr(host, ']', (size_t)(end - host));
        if (!close)
            goto bad;
        host_end = close;
        host++;
        if (close + 1 < end) {
            if (close[1] != ':')
                goto bad;
            port = close + 2;
        }
    } else {
        const char *colon = memchr(host, ':', (size_t)(end - host));
        host_end = colon ? colon : end;
        if (colon)
            port = colon + 1;
    }
    if (host_end == host || (size_t)(host_end - host) >= sizeof out->host)
        goto bad;
    memcpy(out->host, host, (size_t)(host_end - host));
    out->host[host_end - host] = 0;

    if (port) {
        char *e;
        long v = strtol(port, &e, 10);
        if (e == port || e != end || v <= 0 || v > 65535)
            goto bad;
        out->port = (int)v;
    }
    if (slash && slash + 1 != (query ? query : slash + 1 + strlen(slash + 1))) {
        char db[16];
        size_t n = (size_t)((query ? query : slash + strlen(slash)) - slash - 1);
        if (n >= sizeof db)
            goto bad;
        memcpy(db, slash + 1, n);
        db[n] = 0;
        if (parse_db(db, &out->db) != 0)
            goto bad;
    }
    return 0;

bad:
    snprintf(err, err_size, "malformed URL %s", url);
    return -1;
}

static const char *reply_text(const redisReply *r)
{
    return r && r->str ? r->str : "";
}

redisContext *bench_raw_connect(const bench_endpoint *ep)
{
    struct timeval tv = {2, 0};
    redisContext *c = ep->is_unix ? redisConnectUnixWithTimeout(ep->path, tv)
                                  : redisConnectWithTimeout(ep->host, ep->port, tv);
    if (!c)
        bench_die("cannot allocate a hiredis context");
    if (c->err && ep->is_unix)
        bench_die("hiredis unix:%s: %s", ep->path, c->errstr);
    if (c->err)
        bench_die("hiredis %s:%d: %s", ep->host, ep->port, c->errstr);

    struct timeval cmd_tv = {10, 0};
    redisSetTimeout(c, cmd_tv);

    if (ep->password[0]) {
        redisReply *r = ep->user[0] ? redisCommand(c, "AUTH %s %s", ep->user, ep->password)
                                    : redisCommand(c, "AUTH %s", ep->password);
        if (!r || r->type == REDIS_REPLY_ERROR)
            bench_die("hiredis AUTH refused: %s", r ? reply_text(r) : c->errstr);
        freeReplyObject(r);
    }
    if (ep->db)
        bench_raw_expect(c, REDIS_REPLY_STATUS, "OK", "SELECT %d", ep->db);
    return c;
}

void bench_raw_expect(redisContext *c, int type, const char *expect_status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r)
        bench_die("hiredis %s: %s", fmt, c->errstr);
    if (r->type != type ||
        (expect_status && (r->type != REDIS_REPLY_STATUS || strcmp(r->str, expect_status) != 0)))
        bench_die("hiredis %s: unexpected reply (type %d) %s", fmt, r->type, reply_text(r));
    freeReplyObject(r);
}
