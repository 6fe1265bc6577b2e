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

/* A request a node has not answered yet (it timed out, or the outcome was
 * decided without it) stays owed on its connection: the reply comes later,
 * in order, and is skipped. A node that is only slower than the others owes
 * one or two, read at the next fan-out; one whose redis-server was not
 * scheduled for a few ms (a loaded host) owes one per round meanwhile, and
 * answers them all at once. Past this many owed replies the node is taken
 * for hung and the connection closed (a few hundred bytes each: they fit in
 * the socket's buffers, so writing to a hung node never blocks). */
#define DLOCK__REDLOCK_OWED_MAX 128

/* Room for whose the owed requests are: the most a connection keeps (one
 * past the limit) and the scripts loaded ahead. */
#define DLOCK__REDLOCK_OWED_SLOTS (DLOCK__REDLOCK_OWED_MAX + 8)

/* One connection to one node, with the replies it still owes. */
typedef struct {
    dlock__redis_conn conn;
    int owed;
    /* Whose each owed request is, oldest first from slot first (a ring of
     * DLOCK__REDLOCK_OWED_SLOTS): the token it was sent for, "" for a
     * script loaded ahead or a status read. Made with the first owed
     * request of a token; NULL: none is a token's. */
    char (*whose)[DLOCK_BACKEND_TOKEN_LEN + 1];
    int first;
} dlock__redlock_link;

/*
 * The connections of a client are in sets, one connection to each node per
 * set: a fan-out runs on one set, which nobody else uses meanwhile. Calls
 * of the client's threads that overlap each take a callers' set of their
 * own (dlock__redlock_set_take), up to this many at once: the next waits
 * for one to be given back. A set is connected when overlapping calls
 * first need it, so a client used by one thread at a time keeps one. The
 * watchdog has a set of its own beside them, DLOCK__REDLOCK_WD.
 */
#define DLOCK__REDLOCK_SETS 4
#define DLOCK__REDLOCK_WD DLOCK__REDLOCK_SETS

typedef struct {
    dlock_url url; /* the client's URL narrowed to this node (borrowed strings) */
    /* [0, DLOCK__REDLOCK_SETS): the callers' sets; [DLOCK__REDLOCK_WD]:
     * the watchdog's. */
    dlock__redlock_link link[DLOCK__REDLOCK_SETS + 1];
    dlock__redis_watcher *watcher;
} dlock__redlock_node;

/* An io_uring instance for fan-outs (redlock_ring.c); opaque. */
typedef struct dlock__redlock_ring dlock__redlock_ring;

/* io= in the URL: how a fan-out waits for the nodes. */
enum { DLOCK__REDLOCK_IO_AUTO, DLOCK__REDLOCK_IO_POLL, DLOCK__REDLOCK_IO_URING };

typedef struct {
    char *prefix;
    size_t n, quorum;
    int64_t drift_ms;        /* -1: lease / 100 + 2 */
    int64_t node_timeout_ms; /* -1: lease / 10, within [5, command timeout] */
    int64_t command_timeout_ms;
    /* Which callers' sets a call has (busy), and which were ever taken
     * (used: their connections may be open, so they are taken first). */
    pthread_mutex_t cmd_mu;
    pthread_cond_t cmd_freed;
    int set_busy[DLOCK__REDLOCK_SETS], set_used[DLOCK__REDLOCK_SETS];
    /* The tokens with requests owed on each callers' set when it was last
     * given back (repeats allowed): a call for one of them takes that set,
     * so that its requests reach each node in the order they were sent
     * (docs/redlock.md, "Why the fence increases", fact 3). */
    char (*pin[DLOCK__REDLOCK_SETS])[DLOCK_BACKEND_TOKEN_LEN + 1];
    size_t npin[DLOCK__REDLOCK_SETS], pin_cap[DLOCK__REDLOCK_SETS];
    /* tls=1: each node's URL is rediss:// with these parameters (the
     * client's TLS ones: cacert, cert, key, sni, insecure; borrowed). */
    dlock_url_param *node_params;
    size_t nnode_params;
    int tls; /* tls=1: SIGPIPE blocked around a fan-out's I/O */
    /* Each set's ring, used by the set's fan-outs; NULL: poll(2) (io=poll,
     * tls=1, or no io_uring here). The first callers' set's and the
     * watchdog's are opened with the client, the others' when their set is
     * first taken (and then only when the first set has one). */
    dlock__redlock_ring *ring[DLOCK__REDLOCK_SETS + 1];
    dlock__redlock_node nodes[DLOCK__REDLOCK_NODES_MAX];
} dlock__redlock_be;

/* What one node answered to a fan-out. */
typedef struct {
    redisReply *reply; /* when code is DLOCK_OK; freed by answers_free */
    int code;          /* DLOCK_OK, or why there is no reply */
    int pending;       /* no reply yet: the outcome was decided without it */
    char why[200];     /* the message for code, naming the node */
} dlock__redlock_answer;

/*
 * Whether a fan-out's outcome is decided, called with each node's answer as
 * it comes (ans[node]: its reply, or a failure). Nonzero: stop waiting for
 * the other nodes (e.g. a quorum granted, or no quorum can any more).
 */
typedef int (*dlock__redlock_decided_fn)(void *ctx, const dlock__redlock_answer *ans,
                                         size_t node);

/*
 * A callers' set for one call for token (NULL: a call that writes nothing
 * of a token's, as a status read), and the same given back (redlock.c).
 * A token with requests owed on a set takes that set, waiting for it;
 * another call takes a free set, waiting while every set is busy.
 */
int dlock__redlock_set_take(dlock__redlock_be *be, const char *token);
void dlock__redlock_set_give(dlock__redlock_be *be, int set);

/*
 * Run script s (the same keys and arguments) on the nodes whose bit is set
 * in mask, in parallel, on their connections of set (a callers' set the
 * caller took, or DLOCK__REDLOCK_WD for the watchdog's) for token (whose
 * requests they are: see dlock__redlock_set_take; NULL for none), and
 * wait at most timeout_ms for the replies, or until decided (NULL: wait for
 * every node) says the outcome is known. Every node in mask gets an answer:
 * its reply, a code and message (DLOCK_ETIMEOUT when it did not answer in
 * time), or pending set (with DLOCK_ETIMEOUT) when the outcome was decided
 * before its reply came. A request without its reply may still run on its
 * node later, in order with the next ones sent on that connection; its
 * reply is skipped then. Returns how many nodes replied.
 */
size_t dlock__redlock_fanout(dlock__redlock_be *be, int set, const char *token, unsigned mask,
                             const dlock__redis_script *s, int nkeys, int argc,
                             const char **argv, const size_t *lens, int64_t timeout_ms,
                             dlock__redlock_decided_fn decided, void *ctx,
                             dlock__redlock_answer *ans);
void dlock__redlock_answers_free(dlock__redlock_answer *ans, size_t n);

/*
 * Connect the nodes of mask whose connection of set is not open, all at
 * once (a thread each when more than one must): a node that does not
 * answer costs one connect timeout, not one per node before it. A new
 * connection gets the backend's scripts loaded ahead (SCRIPT LOAD, written
 * with the connection's first request and its replies skipped), so that
 * EVALSHA finds them. ans[i].code (and why) for each node of mask.
 */
void dlock__redlock_connect(dlock__redlock_be *be, int set, unsigned mask,
                            dlock__redlock_answer *ans);

/* A ring for fan-outs to a backend of that many nodes, or DLOCK_ENOTSUP
 * with a message when this kernel or build has none (a seccomp profile
 * that refuses io_uring_setup, Linux before 5.11, dlock built without
 * liburing). Close of NULL is a no-op; usable gives NULL for a ring that
 * must not be used any more. */
int dlock__redlock_ring_open(dlock__redlock_ring **out, size_t nodes);
void dlock__redlock_ring_close(dlock__redlock_ring *r);
dlock__redlock_ring *dlock__redlock_ring_usable(dlock__redlock_ring *r);

/* ---- a fan-out in progress: started and waited for with poll(2) in
 * redlock_nodes.c, waited for on a ring in redlock_ring.c ---- */

/* What each node of a fan-out is at. */
typedef struct {
    dlock__redlock_link *link;
    int waiting;  /* a reply of ours still to come */
    int reloaded; /* NOSCRIPT answered by sending EVAL */
    int reused;   /* the connection was open before this round */
    int resent;   /* sent again on a fresh connection */
    int queued;   /* the ring is to write the request (not written yet) */
    int resend;   /* to send again once the ring let go of the old socket */
    int cancelled; /* the old socket's receive cancelled, for resend */
} dlock__redlock_node_state;

/* The EVALSHA of a fan-out, formatted once for all its nodes. */
typedef struct {
    char *bytes;
    size_t len;
    char stack[1024];
} dlock__redlock_request;

/* A fan-out in progress (a round): the request, each node's state and
 * answer. */
typedef struct {
    dlock__redlock_be *be;
    const dlock__redis_script *s;
    int nkeys, argc;
    const char **argv;
    const size_t *lens;
    dlock__redlock_decided_fn decided;
    void *ctx;
    dlock__redlock_answer *ans;
    dlock__redlock_node_state st[DLOCK__REDLOCK_NODES_MAX];
    dlock__redlock_request q;
    size_t replied;
    int done;
} dlock__redlock_round;

/* redlock_nodes.c: keep the thread's message (dlock_error_message) across
 * calls whose own failures are not the caller's to report. */
void dlock__redlock_message_save(char *saved, size_t size);
void dlock__redlock_message_restore(const char *saved);

/* redlock_nodes.c: connect if needed and queue the request, left to the
 * ring with by_ring (node_start); node i sent something, now in its reader,
 * or reading failed (rc): take our reply, or send again (node_input); node
 * i failed with code (node_failed). Both ask whether the outcome is
 * decided. */
int dlock__redlock_node_start(dlock__redlock_node_state *st, const dlock__redlock_request *q,
                              int by_ring);
void dlock__redlock_node_input(dlock__redlock_round *f, size_t i, int rc, int by_ring);
void dlock__redlock_node_failed(dlock__redlock_round *f, size_t i, int code);

#ifdef DLOCK_HAVE_LIBURING
/* redlock_ring.c: send the queued requests on the ring and wait up to
 * deadline for the replies, or until f is decided; nothing is left in
 * flight on return. */
void dlock__redlock_wait_ring(dlock__redlock_round *f, dlock__redlock_ring *r, int64_t deadline);
#endif

/* A key on the nodes: prefix + '{' + name + '}' + suffix. */
#define DLOCK__REDLOCK_KEY_MAX (128 + DLOCK_NAME_MAX + 32)
typedef struct {
    char buf[DLOCK__REDLOCK_KEY_MAX];
    size_t len;
} dlock__redlock_key;

/* Helpers shared by redlock.c and redlock_renew.c (redlock.c): the key of
 * name + suffix; every node's bit; the drift kept on top of a lease; what
 * the nodes set (lease + drift); how long a node's reply is waited for;
 * the scripts' owner argument ("" for the plain mutex); a reply of the
 * wrong shape as the node's answer. */
void dlock__redlock_make_key(dlock__redlock_key *k, const dlock__redlock_be *be, const char *name,
                             const char *suffix);
unsigned dlock__redlock_all_nodes(const dlock__redlock_be *be);
int64_t dlock__redlock_drift_ms(const dlock__redlock_be *be, int64_t lease_ms);
int64_t dlock__redlock_node_px(const dlock__redlock_be *be, int64_t lease_ms);
int64_t dlock__redlock_node_timeout_ms(const dlock__redlock_be *be, int64_t lease_ms);
const char *dlock__redlock_owner_arg(const dlock_request *req);
void dlock__redlock_bad_reply(dlock__redlock_answer *a, const dlock__redlock_node *node,
                              const char *what);

/* The backend's extend, check and renew (redlock_renew.c). */
int dlock__redlock_extend(void *be, const dlock_request *req);
int dlock__redlock_check(void *be, const dlock_request *req);
int dlock__redlock_renew(void *be, dlock_renewal *items, size_t n);

/* Ask each node of up (connected) for the settings the fence needs (AOF
 * with appendfsync always, no eviction): a DLOCK_LOG_WARN for each that
 * breaks them, or DLOCK_ESERVER with strict (redlock_settings.c). */
int dlock__redlock_check_settings(dlock__redlock_be *be, unsigned up, int strict,
                                  const dlock_client_options *opts);

/* Set the thread's message for a call that did not reach a quorum: what
 * for, how many nodes agreed, and each failing node's reason (nodes not
 * waited for are left out). Returns the
 * code to report (the first failing node's, or fallback). */
int dlock__redlock_fail_quorum(const dlock__redlock_be *be, const char *what, size_t agreed,
                               const dlock__redlock_answer *ans, unsigned mask, int fallback);

/* ---- redlock_wait.c: waiting, subscribed on every node ---- */

int dlock__redlock_watch_begin(void *be, const dlock_request *req, void **watch);
int dlock__redlock_watch_wait(void *be, void *watch, int64_t timeout_ms);
void dlock__redlock_watch_end(void *be, void *watch);
void dlock__redlock_watch_wake(void *be, void *watch);
void dlock__redlock_watch_notify(void *be, void *watch, void (*fn)(void *), void *fn_arg);
/* 1 when another waiter of this client waits on watch's lock too. */
int dlock__redlock_watch_shared(dlock__redlock_be *be, void *watch);

/* The scripts beside this file (scripts/embed_lua.cmake). */
extern const dlock__redis_script dlock__redlock_script_acquire;
extern const dlock__redis_script dlock__redlock_script_confirm;
extern const dlock__redis_script dlock__redlock_script_release;
extern const dlock__redis_script dlock__redlock_script_renew;
extern const dlock__redis_script dlock__redlock_script_reset;

#endif
