/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Sentinel (test_sentinel_*): a master, 2 replicas and 3 sentinels on
 * loopback, and the test server "redis-sentinel" on them.
 */
#include "test_server.h"

/* The port sentinel i names as master of "dlock" (0: none, -1: unreachable). */
static int sentinel_names(test_redis *sen)
{
    redisContext *c = test__redis_connect(sen);
    redisReply *rep;
    int port = -1;

    if (c == NULL)
        return -1;
    rep = redisCommand(c, "SENTINEL get-master-addr-by-name dlock");
    if (rep != NULL && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2)
        port = atoi(rep->element[1]->str);
    else if (rep != NULL)
        port = 0;
    if (rep != NULL)
        freeReplyObject(rep);
    redisFree(c);
    return port;
}

/* Whether sentinel sen knows both replicas and the other sentinels. */
static int sentinel_ready(test_redis *sen)
{
    redisContext *c = test__redis_connect(sen);
    redisReply *rep;
    int replicas = -1, others = -1;

    if (c == NULL)
        return 0;
    rep = redisCommand(c, "SENTINEL master dlock");
    for (size_t i = 0; rep != NULL && rep->type == REDIS_REPLY_ARRAY && i + 1 < rep->elements;
         i += 2) {
        if (strcmp(rep->element[i]->str, "num-slaves") == 0)
            replicas = atoi(rep->element[i + 1]->str);
        if (strcmp(rep->element[i]->str, "num-other-sentinels") == 0)
            others = atoi(rep->element[i + 1]->str);
    }
    if (rep != NULL)
        freeReplyObject(rep);
    redisFree(c);
    return replicas == TEST_SENTINEL_REPLICAS && others == TEST_SENTINELS - 1;
}

static void sentinel_start(test_sentinel *s, const char *extra_args, int failover,
                           const test_tls *t)
{
    char extra[1200], tls[600] = "";
    size_t len;
    int ready = 0;

    char mextra[1200];

    memset(s, 0, sizeof(*s));
    if (t != NULL)
        test__redis_tls_args(tls, sizeof(tls), t);
    /* Redis 7 waits 5 s before a diskless full sync, in case more replicas
     * come: the replicas would not hold the master's data until then. */
    snprintf(mextra, sizeof(mextra), "%s%s %s", extra_args ? extra_args : "",
             failover == TEST_SENTINEL_SYNCING ? "" : " --repl-diskless-sync-delay 0", tls);
    test__redis_start_at(&s->nodes[0], mextra, t != NULL, NULL, 0);
    snprintf(extra, sizeof(extra), "%s --replicaof 127.0.0.1 %d %s",
             extra_args ? extra_args : "", test__redis_served_port(&s->nodes[0]), tls);

    for (int i = 1; i <= TEST_SENTINEL_REPLICAS; i++)
        test__redis_start_at(&s->nodes[i], extra, t != NULL, NULL, 0);
    len = (size_t)snprintf(s->url, sizeof(s->url), t != NULL ? "rediss-sentinel://"
                                                             : "redis-sentinel://");
    for (int i = 0; i < TEST_SENTINELS; i++) {
        test_redis *sen = &s->sentinels[i];
        char conf[sizeof(sen->conf)];
        FILE *f;

        /* The config must exist before the sentinel starts (which
         * rewrites it): in a directory of its own. */
        snprintf(conf, sizeof(conf), "/tmp/dlock-sentinel-XXXXXX");
        if (mkdtemp(conf) == NULL) {
            perror("mkdtemp");
            exit(1);
        }
        snprintf(conf + strlen(conf), sizeof(conf) - strlen(conf), "/sentinel.conf");
        if ((f = fopen(conf, "w")) == NULL) {
            perror(conf);
            exit(1);
        }
        fprintf(f, "sentinel monitor dlock 127.0.0.1 %d 2\n"
                   "sentinel down-after-milliseconds dlock %d\n"
                   "sentinel failover-timeout dlock 3000\n"
                   "sentinel parallel-syncs dlock 2\n", test__redis_served_port(&s->nodes[0]),
                failover ? 1000 : 600000);
        fclose(f);
        test__redis_start_at(sen, tls, t != NULL, conf, 0);
        len += (size_t)snprintf(s->url + len, len < sizeof(s->url) ? sizeof(s->url) - len : 0,
                                "%s127.0.0.1:%d", i > 0 ? "," : "", test__redis_served_port(sen));
    }
    if (t != NULL)
        snprintf(s->url + len, len < sizeof(s->url) ? sizeof(s->url) - len : 0,
                 "/dlock?cacert=%s/ca.crt", t->dir);
    else
        snprintf(s->url + len, len < sizeof(s->url) ? sizeof(s->url) - len : 0, "/dlock");
    for (int t = 0; t < 3000 && !ready; t++) {
        ready = 1;
        for (int i = 1; i <= TEST_SENTINEL_REPLICAS; i++)
            ready = ready &&
                    (failover == TEST_SENTINEL_SYNCING || test__redis_synced(&s->nodes[i], 0));
        for (int i = 0; i < TEST_SENTINELS; i++)
            ready = ready && (failover ? sentinel_ready(&s->sentinels[i])
                                       : sentinel_names(&s->sentinels[i]) ==
                                             test__redis_served_port(&s->nodes[0]));
        if (!ready)
            test_sleep_ms(20);
    }
    if (!ready) {
        fprintf(stderr, "test_sentinel_start: the sentinels did not find the replicas and "
                "each other within 60 s\n");
        exit(1);
    }
}

void test_sentinel_start(test_sentinel *s, const char *extra_args, int failover)
{
    sentinel_start(s, extra_args, failover, NULL);
}

void test_sentinel_start_tls(test_sentinel *s, const test_tls *t, int failover)
{
    sentinel_start(s, NULL, failover, t);
}

void test_sentinel_stop(test_sentinel *s)
{
    for (int i = 0; i < TEST_SENTINELS; i++) {
        char dir[96];
        snprintf(dir, sizeof(dir), "%s", s->sentinels[i].conf);
        test_redis_stop(&s->sentinels[i]);
        if (strrchr(dir, '/') != NULL) {
            char cmd[128];
            *strrchr(dir, '/') = '\0';
            snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
            if (system(cmd) != 0)
                fprintf(stderr, "could not remove %s\n", dir);
        }
    }
    for (int i = 0; i <= TEST_SENTINEL_REPLICAS; i++)
        test_redis_stop(&s->nodes[i]);
}

int test_sentinel_master(test_sentinel *s)
{
    int port = 0;

    for (int i = 0; i < TEST_SENTINELS; i++) {
        int p;
        if (s->sentinels[i].pid <= 0)
            continue;
        p = sentinel_names(&s->sentinels[i]);
        if (p <= 0 || (port != 0 && p != port))
            return -1;
        port = p;
    }
    for (int i = 0; i <= TEST_SENTINEL_REPLICAS; i++)
        if (test__redis_served_port(&s->nodes[i]) == port)
            return i;
    return -1;
}

int test_sentinel_failover(test_sentinel *s)
{
    int old = test_sentinel_master(s);

    if (old < 0)
        return -1;
    test_redis_kill(&s->nodes[old]);
    for (int t = 0; t < 3000; t++) {
        int now = test_sentinel_master(s);
        if (now >= 0 && now != old)
            return now;
        test_sleep_ms(20);
    }
    return -1;
}


/* ---- the test server "redis-sentinel" ---- */

/* The redis backend on the master the sentinels name; checks read that
 * master (s->redis, a copy of its test_redis). */
static void sentinel_server_start(test_server *s)
{
    if ((s->sentinel = malloc(sizeof(*s->sentinel))) == NULL)
        fprintf(stderr, "out of memory\n"), exit(1);
    test_sentinel_start(s->sentinel, NULL, 0);
    s->redis = s->sentinel->nodes[0];
    s->url = s->sentinel->url;
}

static void sentinel_server_stop(test_server *s)
{
    test_sentinel_stop(s->sentinel);
    free(s->sentinel);
    s->sentinel = NULL;
}

const test_server_ops test_server_sentinel = {
    .name = "redis-sentinel",
    .backend = "redis",
    .short_lease_ms = 300,
    .dense_fences = 1,
    .waiter_leftovers = 1,
    .start = sentinel_server_start,
    .stop = sentinel_server_stop,
    .pause = test__redis_server_pause,
    .held = test__redis_server_held,
    .leftovers = test__redis_server_leftovers,
    .requests = test__redis_server_requests,
};
