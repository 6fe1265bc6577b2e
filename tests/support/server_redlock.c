/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Redlock: independent redis-servers (test_redis_start_many), and the test
 * server "redlock" on 3 of them.
 */
#include "test_server.h"

void test_redis_start_many(test_redis *r, int n, const char *extra_args, char *url,
                           size_t size)
{
    size_t len = (size_t)snprintf(url, size, "redlock://");

    if (n > TEST_REDLOCK_MAX) {
        fprintf(stderr, "test_redis_start_many: at most %d servers\n", TEST_REDLOCK_MAX);
        exit(2);
    }
    for (int i = 0; i < n; i++) {
        test_redis_start(&r[i], extra_args);
        len += (size_t)snprintf(url + len, len < size ? size - len : 0, "%s127.0.0.1:%d",
                                i > 0 ? "," : "", r[i].port);
    }
}

/* ---- the test server "redlock" ---- */

static void redlock_start(test_server *s)
{
    s->nnodes = 3;
    test_redis_start_many(s->nodes, s->nnodes, NULL, s->redlock_url, sizeof(s->redlock_url));
    s->url = s->redlock_url;
}

static void redlock_stop(test_server *s)
{
    for (int i = 0; i < s->nnodes; i++)
        test_redis_stop(&s->nodes[i]);
}

static void redlock_pause(test_server *s, int paused)
{
    for (int i = 0; i < s->nnodes; i++)
        test__signal(s->nodes[i].pid, paused);
}

/* A quorum of nodes holds the lock's key. */
static int redlock_held(test_server *s, const char *name)
{
    int held = 0;

    for (int i = 0; i < s->nnodes; i++)
        held += s->nodes[i].pid > 0 &&
                test_redis_cmd(&s->nodes[i], "EXISTS dlock:{%s}", name) == 1;
    return held > s->nnodes / 2;
}

/* The lock's key on every node that is up (a waiter leaves nothing).
 * Acquire and release return once a quorum answered, so wait (a generous
 * bound) for the others to catch up: until every node that is up has the
 * key, or none has. */
static long long redlock_leftovers(test_server *s, const char *name)
{
    long long n = 0;

    for (int tries = 0; tries < 500; tries++) {
        int up = 0;
        n = 0;
        for (int i = 0; i < s->nnodes; i++)
            if (s->nodes[i].pid > 0) {
                up++;
                n += test_redis_cmd(&s->nodes[i], "EXISTS dlock:{%s}", name);
            }
        if (n == 0 || n == up)
            break;
        test_sleep_ms(10);
    }
    return n;
}

/* The first node gets one of every request. */
static long long redlock_requests(test_server *s)
{
    return test__redis_scripts(&s->nodes[0]);
}

const test_server_ops test_server_redlock = {
    .name = "redlock",
    .backend = "redlock",
    .short_lease_ms = 300,
    .start = redlock_start,
    .stop = redlock_stop,
    .pause = redlock_pause,
    .held = redlock_held,
    .leftovers = redlock_leftovers,
    .requests = redlock_requests,
};
