/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * test_server_*: the test servers every backend's suites start
 * (tests/integration/core), each a table (test_server_ops) of
 * tests/support/server_NAME.c, found here by the name the tests give.
 */
#include <errno.h>
#include <signal.h>

#include "test_server.h"

/* The test servers, as the tests name them (test_server_start). A new
 * backend is one file, tests/support/server_NAME.c filling a
 * test_server_ops (added to dlock_test_support in tests/CMakeLists.txt),
 * and its table here: declared, and one line in the list, under the #ifdef
 * of its build condition when it has one. */
extern const test_server_ops test_server_redis;      /* server_redis.c */
extern const test_server_ops test_server_rediss;     /* server_redis.c: over TLS */
extern const test_server_ops test_server_sentinel;   /* server_sentinel.c */
extern const test_server_ops test_server_cluster;    /* server_cluster.c */
extern const test_server_ops test_server_plainredis; /* server_plainredis.c */
extern const test_server_ops test_server_etcd;       /* server_etcd.c */
extern const test_server_ops test_server_redlock;    /* server_redlock.c */
extern const test_server_ops test_server_zk;         /* server_zk.c */
extern const test_server_ops test_server_mysql, test_server_mysql_named; /* server_mysql.c */
#ifdef DLOCK_TEST_POSTGRES
extern const test_server_ops test_server_postgres, test_server_postgres_advisory;
#endif

static const test_server_ops *const servers[] = {
    &test_server_redis,
    &test_server_rediss,
    &test_server_sentinel,
    &test_server_cluster,
    &test_server_plainredis,
    &test_server_etcd,
    &test_server_redlock,
    &test_server_zk,
    &test_server_mysql,
    &test_server_mysql_named,
#ifdef DLOCK_TEST_POSTGRES
    &test_server_postgres,
    &test_server_postgres_advisory,
#endif
};

#define NSERVERS (sizeof(servers) / sizeof(servers[0]))

void test__signal(int pid, int paused)
{
    if (kill(pid, paused ? SIGSTOP : SIGCONT) != 0)
        fprintf(stderr, "kill -%s %d: %s\n", paused ? "STOP" : "CONT", pid, strerror(errno)),
            exit(1);
}

void test_server_start(test_server *s, const char *name)
{
    const test_server_ops *ops = NULL;

    for (size_t i = 0; i < NSERVERS && name != NULL; i++)
        if (strcmp(servers[i]->name, name) == 0)
            ops = servers[i];
    if (ops == NULL) {
        fprintf(stderr, "unknown backend '%s' (", name ? name : "");
        for (size_t i = 0; i < NSERVERS; i++)
            fprintf(stderr, "%s%s", i > 0 ? ", " : "", servers[i]->name);
        fprintf(stderr, ")\n");
        exit(2);
    }
    memset(s, 0, sizeof(*s));
    s->ops = ops;
    s->backend = ops->backend;
    s->short_lease_ms = ops->short_lease_ms;
    s->dense_fences = ops->dense_fences;
    s->waiter_leftovers = ops->waiter_leftovers;
    s->conn_bound = ops->conn_bound;
    ops->start(s);
}

void test_server_stop(test_server *s)
{
    s->ops->stop(s);
}

int test_server_held(test_server *s, const char *name)
{
    return s->ops->held(s, name);
}

void test_server_pause(test_server *s, int paused)
{
    s->ops->pause(s, paused);
}

long long test_server_leftovers(test_server *s, const char *name)
{
    return s->ops->leftovers(s, name);
}

long long test_server_requests(test_server *s)
{
    return s->ops->requests(s);
}
