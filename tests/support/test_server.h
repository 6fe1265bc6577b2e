/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The test servers as tables, inside tests/support: one test_server_ops per
 * backend, filled by tests/support/server_NAME.c and listed once in
 * test_server.c, which test_server_start and the calls after it go through
 * (as src/core/client.c goes through the backends' tables). Tests never
 * include this: they see test.h's test_server_* calls.
 *
 * Also what the support files share among themselves (test__ names): the
 * Redis starters of server_redis.c that the Sentinel, Cluster and Redlock
 * files build on.
 */
#ifndef DLOCK_TEST_SERVER_H
#define DLOCK_TEST_SERVER_H

#include <stdarg.h>

#include <hiredis/hiredis.h>

#include "test.h"

struct test_server_ops {
    const char *name;    /* as the tests name it: test_server_start(s, name) */
    const char *backend; /* dlock's backend under it, put in s->backend */
    /* Traits, copied into the test_server before start (see test.h). */
    int64_t short_lease_ms;
    int dense_fences;
    int waiter_leftovers;
    int conn_bound;
    /* Start the servers and set s->url (s is zeroed, backend and traits
     * set); exit the test with a message when they do not start. */
    void (*start)(test_server *s);
    /* Stop them and remove what they left on disk. */
    void (*stop)(test_server *s);
    /* As test.h's test_server_pause, _held, _leftovers and _requests. */
    void (*pause)(test_server *s, int paused);
    int (*held)(test_server *s, const char *name);
    long long (*leftovers)(test_server *s, const char *name);
    long long (*requests)(test_server *s);
};

/* SIGSTOP (paused) or SIGCONT process pid; exits the test when kill fails. */
void test__signal(int pid, int paused);

/* A loopback port the kernel picks (bind to port 0). */
int test__kernel_port(void);
/* Whether loopback port is free now (a bind to it works). */
int test__port_free(int port);

/* ---- server_redis.c ---- */

/* A connection to r's plain port (2 s to connect), NULL when it fails. */
redisContext *test__redis_connect(test_redis *r);
/* One command on a connection of its own to r (who: for the message when
 * it cannot connect, which exits the test). */
redisReply *test__redis_vcommand(test_redis *r, const char *who, const char *fmt, va_list ap);
/* A reply as test_redis_cmd tells it (-1: an error or none), freed. */
long long test__redis_number(redisReply *rep);
/* Start a server on port (0: a free one), on a TLS port too when tls, as
 * redis-sentinel with config file conf when set; r->url is redis:// (the
 * caller of a TLS one writes its own). Stopped at exit. */
void test__redis_start_at(test_redis *r, const char *extra_args, int tls, const char *conf,
                          int port);
/* The port a node is reached on by the sentinels, replicas and dlock: its
 * TLS port when it has one. */
int test__redis_served_port(const test_redis *r);
/* The redis-server / redis-sentinel arguments for TLS with t's "server"
 * certificate, client certificates required, and TLS for their own links. */
void test__redis_tls_args(char *buf, size_t size, const test_tls *t);
/* Whether replica r has finished its first sync with the master (or_master:
 * or r is a master). */
int test__redis_synced(test_redis *r, int or_master);
/* The scripts r ran (evalsha and eval calls): test_server_requests of the
 * Redis servers. */
long long test__redis_scripts(test_redis *r);
/* The calls of a test server on one redis-server, s->redis, under dlock's
 * key prefix "dlock:" ("redis", "rediss", "redis-sentinel": its master):
 * pause that server; held: the lock's key exists; leftovers: the lock (its
 * holder record) and its hand-off entry; requests: its scripts. */
void test__redis_server_pause(test_server *s, int paused);
int test__redis_server_held(test_server *s, const char *name);
long long test__redis_server_leftovers(test_server *s, const char *name);
long long test__redis_server_requests(test_server *s);

#endif
