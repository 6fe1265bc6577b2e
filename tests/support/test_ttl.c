/* SPDX-License-Identifier: BSD-3-Clause */
/* The server's remaining lease, per backend (test_ttl.h). */
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/etcd/etcd_codec.h"
#include "test_ttl.h"
#ifdef DLOCK_TEST_POSTGRES
#include "test_pg.h"
#endif

/* test_zk.c's tickTime: a session expires at most a tick after its timeout. */
#define ZK_TICK_MS 250

static int64_t redis_pttl(test_redis *r, const char *prefix, const char *name)
{
    long long v = test_redis_cmd(r, "PTTL %s{%s}", prefix, name);

    return v >= 0 ? v : -1; /* -2: no key; -1: no expiry, never dlock's */
}

static int by_size_down(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return x < y ? 1 : x > y ? -1 : 0;
}

/* The lock holds while a majority of nodes keeps its key: the majority-th
 * longest PTTL. */
static int64_t redlock_ttl(test_server *s, const char *name)
{
    int64_t t[TEST_REDLOCK_MAX];

    for (int i = 0; i < s->nnodes; i++)
        t[i] = s->nodes[i].pid > 0 ? redis_pttl(&s->nodes[i], "dlock:", name) : -1;
    qsort(t, (size_t)s->nnodes, sizeof(t[0]), by_size_down);
    return t[s->nnodes / 2];
}

static json_t *etcd_call(test_server *s, const char *path, const char *body)
{
    char *r = test_etcd_post(&s->etcd, 0, path, body);
    json_t *j = r != NULL ? json_loads(r, 0, NULL) : NULL;

    free(r);
    if (!json_is_object(j) || json_object_get(j, "error") != NULL) {
        fprintf(stderr, "etcd %s: no answer\n", path);
        exit(1);
    }
    return j;
}

/* The TTL of lease id (LeaseTimeToLive: int64(Remaining().Seconds()), so
 * what is left lies in [TTL, TTL + 1) s), -1 when it is gone. */
static int64_t etcd_lease_ttl(test_server *s, int64_t id)
{
    char body[64];
    int64_t ttl = -1;
    json_t *t;

    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", id);
    t = etcd_call(s, "/v3/lease/timetolive", body);
    if (dlock__etcd_int(t, "TTL", &ttl) != 0 || ttl < 0)
        ttl = -1;
    json_decref(t);
    return ttl;
}

static int64_t etcd_ttl(test_server *s, const char *name)
{
    char prefix[600], body[1024];
    char *k, *end, *kend;
    json_t *j;
    const json_t *kvs;
    int64_t ttl = -1, next, leases[8];
    size_t n = 0;

    snprintf(prefix, sizeof(prefix), "dlock/%s/", name);
    k = dlock__etcd_b64(prefix, strlen(prefix));
    end = dlock__etcd_prefix_end(prefix);
    kend = dlock__etcd_b64(end, strlen(end));
    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"range_end\":\"%s\"}", k, kend);
    free(k);
    free(end);
    free(kend);
    j = etcd_call(s, "/v3/kv/range", body);
    kvs = json_object_get(j, "kvs");
    for (size_t i = 0; i < json_array_size(kvs) && n < sizeof(leases) / sizeof(leases[0]); i++)
        if (dlock__etcd_int(json_array_get(kvs, i), "lease", &leases[n]) == 0 && leases[n] != 0)
            n++;
    json_decref(j);
    if (n != 1) { /* the longest of them, to the second */
        for (size_t i = 0; i < n; i++)
            if ((next = etcd_lease_ttl(s, leases[i])) > ttl)
                ttl = next;
        return ttl < 0 ? -1 : ttl * 1000 + 999;
    }
    /* The holder's lease alone: read until its TTL steps down, when what
     * is left is just under TTL + 1 s, a bound to the few ms of a read. */
    ttl = etcd_lease_ttl(s, leases[0]);
    for (int64_t until = test_clock_ms(CLOCK_MONOTONIC) + 1100;
         ttl > 0 && test_clock_ms(CLOCK_MONOTONIC) < until; test_sleep_ms(1))
        if ((next = etcd_lease_ttl(s, leases[0])) != ttl) {
            ttl = next;
            break;
        }
    return ttl < 0 ? -1 : ttl * 1000 + 999;
}

/* The field "key=NUMBER" in text (up to the next ',' or ')'), or -1. */
static int64_t field(const char *text, const char *key)
{
    const char *at = strstr(text, key);

    return at != NULL ? strtoll(at + strlen(key), NULL, 10) : -1;
}

static int64_t zk_ttl(test_server *s)
{
    char *cons = test_zk_4lw(&s->zk, 0, "cons"), *copy, *line, *save = NULL;
    int64_t last = -1;

    if (cons == NULL) {
        fprintf(stderr, "zk: no answer to cons\n");
        exit(1);
    }
    /* Every session's connection (the test's own 4lw one has no lresp):
     * the latest end is an upper bound of the lock's session's. */
    copy = strdup(cons);
    CHECK(copy != NULL);
    for (line = strtok_r(copy, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        int64_t lresp = field(line, "lresp="), to = field(line, ",to=");
        if (lresp > 0 && to > 0 && lresp + to > last)
            last = lresp + to;
    }
    if (last < 0)
        fprintf(stderr, "zk: no session in cons:\n%s\n", cons);
    free(copy);
    free(cons);
    /* ZooKeeper's times are Time.currentElapsedTime(): System.nanoTime(),
     * CLOCK_MONOTONIC on Linux, in ms. */
    return last < 0 ? -1 : last + ZK_TICK_MS - test_clock_ms(CLOCK_MONOTONIC);
}

int64_t test_server_ttl_ms(test_server *s, const char *name)
{
    const char *b = s->backend;

#ifdef DLOCK_TEST_POSTGRES
    if (s->pg != NULL) {
        if (strstr(s->url, "mode=advisory") != NULL)
            goto none;
        return test_pg_query(s->pg,
                             "/* dlock-test */ SELECT coalesce(max(ceil(extract(epoch FROM "
                             "expires - clock_timestamp()) * 1000)), -1)::bigint FROM dlock_locks"
                             " WHERE name = convert_to('dlock:%s', 'UTF8') AND tokens IS NOT NULL"
                             " AND expires > clock_timestamp()",
                             name);
    }
#endif
    if (strcmp(b, "mysql") == 0) {
        if (s->sql_named)
            goto none;
        return test_mariadb_query(&s->mariadb,
                                  "SELECT COALESCE(MAX(CEIL(TIMESTAMPDIFF(MICROSECOND, "
                                  "UTC_TIMESTAMP(6), expires) / 1000)), -1) FROM dlock_locks "
                                  "WHERE name = 'dlock:%s' AND token <> '' AND expires > "
                                  "UTC_TIMESTAMP(6)",
                                  name);
    }
    if (strcmp(b, "redlock") == 0)
        return redlock_ttl(s, name);
    if (strcmp(b, "etcd") == 0)
        return etcd_ttl(s, name);
    if (strcmp(b, "zk") == 0)
        return zk_ttl(s);
    if (strcmp(b, "redis") == 0 && s->cluster == NULL)
        return redis_pttl(&s->redis, "dlock:", name);
    if (strcmp(b, "plainredis") == 0)
        return redis_pttl(&s->redis, "plain:", name);
none:
    fprintf(stderr, "test_server_ttl_ms: no lease to read on %s (%s)\n", b, s->url);
    exit(1);
}
