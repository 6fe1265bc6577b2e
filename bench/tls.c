/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench on rediss://: the raw round trip is a PING over the very
 * transport dlock uses (src/backends/redis/redis_transport.c, compiled into
 * the bench), so the ratio compares dlock with the TLS round trip it pays,
 * not with hiredis (which has no TLS in Debian's build).
 */
#include "bench.h"

#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_transport.h"
#include "core/clock.h"

static int64_t deadline(void)
{
    return dlock__now_ms() + 5000;
}

static redisReply *roundtrip(dlock__redis_tp *tp)
{
    void *r = NULL;

    if (dlock__redis_tp_flush(tp, deadline()) != REDIS_OK)
        bench_die("TLS: %s", tp->errstr);
    while (r == NULL)
        if (dlock__redis_tp_get_reply(tp, &r) != REDIS_OK ||
            (r == NULL && dlock__redis_tp_read(tp, deadline()) != REDIS_OK))
            bench_die("TLS: %s", tp->errstr);
    return r;
}

void *bench_tls_connect(const bench_endpoint *ep)
{
    dlock__redis_tp *tp = calloc(1, sizeof(*tp));
    dlock__redis_endpoint e;
    redisReply *r;

    if (tp == NULL)
        bench_die("out of memory");
    memset(&e, 0, sizeof(e));
    e.host = ep->host;
    e.port = ep->port;
    e.tls = 1;
    e.cacert = ep->cacert[0] ? ep->cacert : NULL;
    e.cert = ep->cert[0] ? ep->cert : NULL;
    e.key = ep->key[0] ? ep->key : NULL;
    e.sni = ep->sni[0] ? ep->sni : NULL;
    e.insecure = ep->insecure;
    if (dlock__redis_tp_open(tp, &e, deadline(), NULL, NULL) != REDIS_OK)
        bench_die("TLS %s:%d: %s", ep->host, ep->port, tp->errstr);
    if (ep->password[0]) {
        if (ep->user[0])
            dlock__redis_tp_append(tp, "AUTH %s %s", ep->user, ep->password);
        else
            dlock__redis_tp_append(tp, "AUTH %s", ep->password);
        r = roundtrip(tp);
        if (r->type != REDIS_REPLY_STATUS)
            bench_die("TLS: AUTH refused");
        freeReplyObject(r);
    }
    return tp;
}

int64_t bench_tls_ping(void *conn)
{
    dlock__redis_tp *tp = conn;
    int64_t t0 = bench_now_ns();
    redisReply *r;

    dlock__redis_tp_append(tp, "PING");
    r = roundtrip(tp);
    if (r->type != REDIS_REPLY_STATUS || strcmp(r->str, "PONG") != 0)
        bench_die("TLS: PING: unexpected reply");
    freeReplyObject(r);
    return bench_now_ns() - t0;
}

void bench_tls_close(void *conn)
{
    dlock__redis_tp_close(conn);
    free(conn);
}
