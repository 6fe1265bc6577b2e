/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The test server "plainredis": a redis-server served by the out-of-tree
 * backend of tests/backend (keys under "plain:"), registered at run time
 * with dlock_backend_register.
 */
#include "plain_backend.h"
#include "test_server.h"

static void plain_start(test_server *s)
{
    test_redis_start(&s->redis, NULL);
    if (dlock_backend_register("plainredis", &plain_backend) != DLOCK_OK)
        fprintf(stderr, "registering plainredis: %s\n", dlock_error_message()), exit(1);
    snprintf(s->plain_url, sizeof(s->plain_url), "plainredis://127.0.0.1:%d", s->redis.port);
    s->url = s->plain_url;
}

static void plain_stop(test_server *s)
{
    test_redis_stop(&s->redis);
}

static int plain_held(test_server *s, const char *name)
{
    return test_redis_cmd(&s->redis, "EXISTS plain:{%s}", name) == 1;
}

static long long plain_leftovers(test_server *s, const char *name)
{
    return test_redis_cmd(&s->redis, "EXISTS plain:{%s} plain:{%s}:next", name, name);
}

const test_server_ops test_server_plainredis = {
    .name = "plainredis",
    .backend = "plainredis",
    .short_lease_ms = 300,
    .dense_fences = 1,
    .start = plain_start,
    .stop = plain_stop,
    .pause = test__redis_server_pause,
    .held = plain_held,
    .leftovers = plain_leftovers,
    .requests = test__redis_server_requests,
};
