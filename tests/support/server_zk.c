/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The test server "zk": a standalone ZooKeeper (test_zk.c, which exits the
 * test with a message in a build without ZooKeeper).
 */
#include "test_server.h"

/* The directory of lock name (names in the tests need no escaping). */
static const char *zk_dir(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "/dlock/%s", name);
    return buf;
}

static void zk_server_start(test_server *s)
{
    test_zk_start(&s->zk, 1, NULL);
    s->url = s->zk.url;
}

static void zk_server_stop(test_server *s)
{
    test_zk_stop(&s->zk);
}

static void zk_server_pause(test_server *s, int paused)
{
    test__signal(s->zk.pid[0], paused);
}

static int zk_server_held(test_server *s, const char *name)
{
    char dir[600];

    return test_zk_children(&s->zk, zk_dir(dir, sizeof(dir), name)) > 0;
}

/* The holder's node and the waiters'. */
static long long zk_server_leftovers(test_server *s, const char *name)
{
    char dir[600];

    return test_zk_children(&s->zk, zk_dir(dir, sizeof(dir), name));
}

/* Every request the server answered, pings included. */
static long long zk_server_requests(test_server *s)
{
    return test_zk_mntr(&s->zk, 0, "zk_cnt_readlatency") +
           test_zk_mntr(&s->zk, 0, "zk_cnt_updatelatency");
}

const test_server_ops test_server_zk = {
    .name = "zk",
    .backend = "zk",
    /* Up to the 2 s session of the URL: locks live in the short session,
     * whose node goes 2 s after its holder stalls. */
    .short_lease_ms = 1000,
    .waiter_leftovers = 1, /* its node in the queue */
    .start = zk_server_start,
    .stop = zk_server_stop,
    .pause = zk_server_pause,
    .held = zk_server_held,
    .leftovers = zk_server_leftovers,
    .requests = zk_server_requests,
};
