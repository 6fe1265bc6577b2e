/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the files of the Redlock backend share: the backend's state (N
 * independent Redis masters, each reached through the Redis backend's
 * connection code), one request to every node at once, and the scripts.
 * Private to src/backends/redlock. docs/redlock.md has the design.
 */
#ifndef DLOCK_REDLOCK_INT_H
#define DLOCK_REDLOCK_INT_H

#include <pthread.h>

#include "backends/redis/redis_conn.h"
#include "backends/redis/redis_scripts.h"
#include "backends/redis/redis_watch.h"

/* Most nodes in a redlock:// URL. */
#define DLOCK__REDLOCK_NODES_MAX 15

/* A request a node has not answered yet stays owed on its connection (the
 * reply comes later, in order, and is skipped); past this many owed
 * replies the node is taken for hung and the connection closed. */
#define DLOCK__REDLOCK_OWED_MAX 4

/* One connection to one node, with the replies it still owes. */
typedef struct {
    dlock__redis_conn conn;
    int owed;
} dlock__redlock_link;

typedef struct {
    dlock_url url; /* the client's URL narrowed to this node (borrowed strings) */
    dlock__redlock_link cmd; /* callers', under cmd_mu */
    dlock__redlock_link wd;  /* the watchdog's */
    dlock__redis_watcher *watcher;
} dlock__redlock_node;

typedef struct {
    char *prefix;
    size_t n, quorum;
    int64_t drift_ms;        /* -1: lease / 100 + 2 */
    int64_t node_timeout_ms; /* -1: lease / 10, within [5, command timeout] */
    int64_t command_timeout_ms;
    pthread_mutex_t cmd_mu;
    /* tls=1: each node's URL is rediss:// with these parameters (the
     * client's TLS ones: cacert, cert, key, sni, insecure; borrowed). */
    dlock_url_param *node_params;
    size_t nnode_params;
    dlock__redlock_node nodes[DLOCK__REDLOCK_NODES_MAX];
} dlock__redlock_be;

/* What one node answered to a fan-out. */
typedef struct {
    redisReply *reply; /* when code is DLOCK_OK; freed by answers_free */
    int code;          /* DLOCK_OK, or why there is no reply */
    char why[200];     /* the message for code, naming the node */
} dlock__redlock_answer;

/*
 * Run script s (the same keys and arguments) on the nodes whose bit is set
 * in mask, in parallel, on their watchdog (wd) or command connections, and
 * wait at most timeout_ms for all the replies. Every node in mask gets an
 * answer: its reply, or a code and message (DLOCK_ETIMEOUT when it did not
 * answer in time: the request may still run on it later, in order with the
 * next ones sent on that connection). Returns how many nodes replied.
 */
size_t dlock__redlock_fanout(dlock__redlock_be *be, int wd, unsigned mask,
                             const dlock__redis_script *s, int nkeys, int argc,
                             const char **argv, const size_t *lens, int64_t timeout_ms,
                             dlock__redlock_answer *ans);
void dlock__redlock_answers_free(dlock__redlock_answer *ans, size_t n);

/* Set the thread's message for a call that did not reach a quorum: what
 * for, how many nodes agreed, and each failing node's reason. Returns the
 * code to report (the first failing node's, or fallback). */
int dlock__redlock_fail_quorum(const dlock__redlock_be *be, const char *what, size_t agreed,
                               const dlock__redlock_answer *ans, unsigned mask, int fallback);

/* ---- redlock_wait.c: waiting, subscribed on every node ---- */

int dlock__redlock_watch_begin(void *be, const dlock_request *req, void **watch);
int dlock__redlock_watch_wait(void *be, void *watch, int64_t timeout_ms);
void dlock__redlock_watch_end(void *be, void *watch);
void dlock__redlock_watch_wake(void *be, void *watch);

/* The scripts beside this file (scripts/embed_lua.cmake). */
extern const dlock__redis_script dlock__redlock_script_acquire;
extern const dlock__redis_script dlock__redlock_script_confirm;
extern const dlock__redis_script dlock__redlock_script_release;
extern const dlock__redis_script dlock__redlock_script_renew;
extern const dlock__redis_script dlock__redlock_script_reset;

#endif
