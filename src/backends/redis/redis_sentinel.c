/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Redis Sentinel (redis-sentinel://, rediss-sentinel://): the URL's
 * sentinels and master name, and, at each connect, the master a majority of
 * the sentinels name, checked with ROLE (docs/redis-sentinel.md). The
 * connection itself is redis_conn.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/redis/redis_conn.h"
#include "core/clock.h"
#include "core/error.h"

/* ---- Sentinel: the URL ------------------------------------------------- */

static const char *const sentinel_keys[] = {"min_replicas", "password", "sentinel_password",
                                            "sentinel_user", NULL};

int dlock__redis_sentinel_param(const char *key)
{
    for (int i = 0; sentinel_keys[i] != NULL; i++)
        if (strcmp(key, sentinel_keys[i]) == 0)
            return 1;
    return 0;
}


/*
 * redis-sentinel://[user:pass@]s1:26379,s2:26379/MASTERNAME[?db=N
 * &min_replicas=N&password=P&sentinel_user=SU&sentinel_password=SP]: the
 * hosts are sentinels (port 26379 by default), the path the master's name,
 * db the master's database (0 by default). user:pass
 * and password= are the master's (one or the other), sentinel_user and
 * sentinel_password the sentinels' (an ACL user, or requirepass alone).
 */
int dlock__redis_sentinel_init(dlock__redis_conn *conn, const dlock_url *url)
{
    const char *mr = dlock_url_param_get(url, "min_replicas");
    const char *pw = dlock_url_param_get(url, "password");

    if (url->nhosts == 0)
        return dlock__fail(DLOCK_EINVAL, "%s URL: no sentinel given (expected %s://HOST:PORT,"
                           ".../MASTERNAME)", url->scheme, url->scheme);
    if (url->path == NULL || url->path[0] != '/' || url->path[1] == '\0' ||
        strchr(url->path + 1, '/') != NULL)
        return dlock__fail(DLOCK_EINVAL, "%s URL: expected the master's name as the path "
                           "(%s://HOST:PORT,.../MASTERNAME)", url->scheme, url->scheme);
    conn->master_name = url->path + 1;
    for (int i = 0; sentinel_keys[i] != NULL; i++) {
        const char *v = dlock_url_param_get(url, sentinel_keys[i]);
        if (v != NULL && v[0] == '\0')
            return dlock__fail(DLOCK_EINVAL, "%s URL: %s= is empty", url->scheme,
                               sentinel_keys[i]);
    }
    if (pw != NULL && url->password != NULL)
        return dlock__fail(DLOCK_EINVAL, "%s URL: the master's password is given twice "
                           "(user:password@ and password=): keep one", url->scheme);
    if (pw != NULL)
        conn->password = pw;
    conn->sentinel_password = dlock_url_param_get(url, "sentinel_password");
    conn->sentinel_user = dlock_url_param_get(url, "sentinel_user");
    if (conn->sentinel_user != NULL && conn->sentinel_password == NULL)
        return dlock__fail(DLOCK_EINVAL, "%s URL: sentinel_user= needs sentinel_password=",
                           url->scheme);
    snprintf(conn->where, sizeof(conn->where), "%s %.64s (master not asked yet)", url->scheme,
             conn->master_name);
    return dlock__redis_min_replicas_init(conn, url, mr);
}

/* ---- Sentinel: finding the master -------------------------------------- */

/* Between tries to find the master, a sentinel's +switch-master is waited
 * for this long at most (a failover ends with one; a master that comes
 * back where it was sends none). */
#define SENTINEL_RETRY_MS 250

static int is_fatal(int rc)
{
    return rc == DLOCK_EAUTH || rc == DLOCK_EINVAL || rc == DLOCK_ENOMEM;
}

int dlock__redis_sentinel_addr(const redisReply *r, char *host, size_t size, int *port)
{
    int p;

    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_STRING && r->element[0]->len < size &&
        r->element[1]->len < 6 && (p = atoi(r->element[1]->str)) > 0 && p < 65536 &&
        memchr(r->element[0]->str, '\0', r->element[0]->len) == NULL) {
        memcpy(host, r->element[0]->str, r->element[0]->len);
        host[r->element[0]->len] = '\0';
        *port = p;
        return 1;
    }
    return 0;
}

int dlock__redis_role_master(const dlock__redis_conn *conn, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING)
        return dlock__fail(DLOCK_EPROTO, "%s: unexpected reply to ROLE", conn->where);
    if (strcmp(r->element[0]->str, "master") != 0)
        return dlock__fail(DLOCK_ECONN, "%s: the sentinels named it but it is not the master "
                           "(ROLE: %.32s)", conn->where, r->element[0]->str);
    return DLOCK_OK;
}

int dlock__redis_switch_message(const redisReply *m)
{
    return m->type == REDIS_REPLY_ARRAY && m->elements == 3 &&
           m->element[0]->type == REDIS_REPLY_STRING && strcmp(m->element[0]->str, "message") == 0;
}

/* The sentinels' answers: one address and how many named it. */
typedef struct {
    char host[256];
    int port;
    size_t votes;
} master_vote;

/*
 * Ask the sentinels, from the one that answered last, for the master's
 * address (SENTINEL get-master-addr-by-name), each within its share of the
 * time left, until a majority of the sentinels the URL names (not of those
 * that answered) name one address: a sentinel anyone can reach and
 * reconfigure (SENTINEL MONITOR needs no more than its password) cannot
 * alone send the client, and its password, elsewhere. With 3 sentinels one
 * may be down or lying; one sentinel is its own majority. The last one
 * asked stays open in *s when it answered (for switch_wait). why gets each
 * failure's text; a fatal one (a refused password) is returned when no
 * majority formed without it.
 */
static int ask_sentinels(dlock__redis_conn *conn, dlock__redis_conn *s, int64_t deadline,
                         int *port, char *why, size_t whysize)
{
    const dlock_url *u = conn->url;
    size_t n = u->nhosts, need = n / 2 + 1, nvotes = 0, asked = 0;
    master_vote *votes = calloc(n, sizeof(*votes));
    int fatal = DLOCK_OK, rc = DLOCK_ECONN;
    char fatal_msg[300] = "";

    memset(s, 0, sizeof(*s));
    s->tp.fd = -1;
    if (votes == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        size_t at = (conn->sentinel_next + i) % n, best = 0;
        const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", conn->master_name};
        size_t lens[3] = {8, 23, strlen(conn->master_name)};
        int64_t left = deadline - dlock__now_ms(), share = left / (int64_t)(n - i);
        redisReply *r = NULL;
        char host[sizeof(votes[0].host)];
        int p;

        for (size_t v = 0; v < nvotes; v++)
            best = votes[v].votes > best ? votes[v].votes : best;
        if (left <= 0 || best + (n - i) < need)
            break; /* no address can reach a majority any more */
        dlock__redis_conn_close(s);
        memset(s, 0, sizeof(*s));
        s->tp.fd = -1;
        s->url = u;
        s->ep = conn->ep;
        s->ep.host = u->hosts[at].host;
        s->ep.port = u->hosts[at].port != 0 ? u->hosts[at].port : 26379;
        s->user = conn->sentinel_user;
        s->password = conn->sentinel_password;
        s->role = conn->role;
        snprintf(s->client_name, sizeof(s->client_name), "%s", conn->client_name);
        s->connect_ms = s->command_ms = share < 100 ? (left < 100 ? left : 100) : share;
        snprintf(s->where, sizeof(s->where), "sentinel %.64s:%d", s->ep.host, s->ep.port);
        asked++;
        if ((rc = dlock__redis_conn_connect(s)) == DLOCK_OK)
            rc = dlock__redis_conn_command_once(s, &r, 3, argv, lens, 0);
        if (rc != DLOCK_OK) {
            snprintf(why, whysize, "%s", dlock_error_message());
            dlock__redis_conn_close(s);
            if (is_fatal(rc) && fatal == DLOCK_OK) {
                fatal = rc;
                snprintf(fatal_msg, sizeof(fatal_msg), "%s", dlock_error_message());
            }
            if (rc == DLOCK_ENOMEM)
                goto out;
            continue;
        }
        if (dlock__redis_sentinel_addr(r, host, sizeof(host), &p)) {
            size_t v;
            for (v = 0; v < nvotes; v++)
                if (votes[v].port == p && strcmp(votes[v].host, host) == 0)
                    break;
            if (v == nvotes) {
                memcpy(votes[v].host, host, sizeof(host));
                votes[v].port = p;
                votes[v].votes = 0;
                nvotes++;
            }
            freeReplyObject(r);
            if (++votes[v].votes >= need) {
                snprintf(conn->master_host, sizeof(conn->master_host), "%s", votes[v].host);
                *port = p;
                conn->sentinel_next = at;
                rc = DLOCK_OK;
                goto out;
            }
            continue;
        }
        snprintf(why, whysize, "%s: %s", s->where,
                 r->type == REDIS_REPLY_NIL ? "does not know this master name"
                                            : "unexpected reply to SENTINEL get-master-addr-by-name");
        freeReplyObject(r);
    }
    if (nvotes > 0) {
        /* Some named a master, too few the same one: say who said what. */
        size_t len = (size_t)snprintf(why, whysize, "no address named by a majority of the %zu "
                                      "sentinels (%zu needed; %zu asked):", n, need, asked);
        for (size_t v = 0; v < nvotes && len < whysize; v++)
            len += (size_t)snprintf(why + len, whysize - len, "%s %.64s:%d by %zu",
                                    v > 0 ? "," : "", votes[v].host, votes[v].port,
                                    votes[v].votes);
    }
    /* The refusal, with its own text (later sentinels may have failed
     * otherwise since). */
    rc = fatal != DLOCK_OK ? dlock__fail(fatal, "%s", fatal_msg) : DLOCK_ECONN;
out:
    free(votes);
    return rc;
}

/* Connect to the master the sentinels named and check with ROLE that it
 * is one: a sentinel may name an old master that came back as a replica,
 * before it learns of the failover. */
static int master_open(dlock__redis_conn *conn, int port, int64_t deadline)
{
    const char *argv[1] = {"ROLE"};
    size_t lens[1] = {4};
    redisReply *r = NULL;
    int rc;

    conn->ep.host = conn->master_host;
    conn->ep.port = port;
    snprintf(conn->where, sizeof(conn->where), "%.16s %.24s (master %.64s:%d)", conn->url->scheme,
             conn->master_name, conn->master_host, port);
    if ((rc = dlock__redis_conn_open_endpoint(conn, deadline)) != DLOCK_OK ||
        (rc = dlock__redis_conn_command_once(conn, &r, 1, argv, lens, 0)) != DLOCK_OK) {
        dlock__redis_conn_close(conn);
        return rc;
    }
    rc = dlock__redis_role_master(conn, r);
    freeReplyObject(r);
    if (rc != DLOCK_OK)
        dlock__redis_conn_close(conn);
    return rc;
}

/* Wait on sentinel s for +switch-master until until_ms (s open), or just
 * until then (no sentinel answered: nothing to wait on). */
static void switch_wait(dlock__redis_conn *s, int64_t until_ms)
{
    if (!dlock__redis_conn_is_open(s)) {
        int64_t ms = until_ms - dlock__now_ms();
        if (ms > 0) {
            struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
        }
        return;
    }
    if (dlock__redis_tp_append(&s->tp, "SUBSCRIBE +switch-master") != REDIS_OK ||
        dlock__redis_tp_flush(&s->tp, until_ms) != REDIS_OK)
        return;
    while (dlock__redis_tp_read(&s->tp, until_ms) == REDIS_OK) {
        void *v = NULL;
        while (dlock__redis_tp_get_reply(&s->tp, &v) == REDIS_OK && v != NULL) {
            int done = dlock__redis_switch_message(v);
            freeReplyObject(v);
            if (done)
                return;
        }
        if (dlock__redis_conn_over_cap(s))
            return;
    }
}

/*
 * Sentinel: ask the sentinels for the master, connect to it and check its
 * role; again until that works or the connect timeout is over, waiting
 * between tries on a sentinel's +switch-master (a failover under way).
 */
int dlock__redis_sentinel_connect(dlock__redis_conn *conn)
{
    int64_t deadline = dlock__now_ms() + conn->connect_ms;
    char why[400] = "no sentinel answered";
    int rc;

    for (;;) {
        dlock__redis_conn s;
        int port = 0;
        int64_t now;

        rc = ask_sentinels(conn, &s, deadline, &port, why, sizeof(why));
        if (rc == DLOCK_OK) {
            if ((rc = master_open(conn, port, deadline)) == DLOCK_OK) {
                dlock__redis_conn_close(&s);
                return DLOCK_OK;
            }
            snprintf(why, sizeof(why), "%s", dlock_error_message());
        }
        if (is_fatal(rc)) {
            dlock__redis_conn_close(&s);
            return rc;
        }
        now = dlock__now_ms();
        if (now >= deadline) {
            dlock__redis_conn_close(&s);
            break;
        }
        switch_wait(&s, now + SENTINEL_RETRY_MS < deadline ? now + SENTINEL_RETRY_MS : deadline);
        dlock__redis_conn_close(&s);
    }
    return dlock__fail(DLOCK_ECONN, "%s %s: no master found within the connect timeout "
                       "(%lld ms): %s", conn->url->scheme, conn->master_name,
                       (long long)conn->connect_ms, why);
}
