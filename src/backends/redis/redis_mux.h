/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One connection that a client's callers share, pipelined (issue 28): each
 * caller appends its command and sends it at once, behind whatever the
 * others sent, and the replies come back in the order the commands went
 * out. No thread of its own: one waiting caller at a time is the reader
 * (it polls the socket and hands each reply to its caller), as the
 * leader/followers pattern has it; the others sleep on a semaphore of their
 * own until their reply is there or they are made the reader, posted once
 * the reader has let go of the lock (redis_mux.c, tell). So 8
 * threads on one client put 8 commands on the wire together, where a
 * connection per call would have them queue for a connection, and the
 * server reads and answers them in one go.
 *
 * Used for the callers' scripts, the path every acquisition, release,
 * extension and waiter's upkeep takes (the watchdog renews on a connection
 * of its own: redis.c), on a single server (redis://, unix://, rediss://),
 * on the master Sentinel names (a script that writes a hold is followed by
 * its WAIT min_replicas, matched to it), and on each master of a cluster
 * (one mux per master, the routing shared: redis_cluster.c). The other
 * commands (status, list) keep a connection per call (redis.c,
 * dlock__redis_cmd_take).
 *
 * Failures: a reply that does not come within the command timeout, or a
 * connection that breaks, fails every command in flight on it (replies are
 * matched by order, so none after it can be placed); the connection is
 * made again by the next command. A command that went out on a
 * connection this call did not open, and failed because the connection
 * was found dead (not by a timeout), is sent once more on a new one, as
 * dlock__redis_conn_command does: every script sent here is safe to
 * repeat. On a Sentinel URL, a command whose master went away or was
 * demoted (READONLY) is sent once more on a connection to the master the
 * sentinels name then.
 */
#ifndef DLOCK_REDIS_MUX_H
#define DLOCK_REDIS_MUX_H

#include <pthread.h>

#include "backends/redis/redis_conn.h"

typedef struct dlock__redis_mux_req dlock__redis_mux_req;

typedef struct {
    int on; /* 0: this client's URL keeps a connection per call */
    pthread_mutex_t mu;
    pthread_cond_t idle; /* the reader let go of a connection that failed */
    dlock__redis_conn conn;
    /* Commands written (or being written), their replies awaited in this
     * order. */
    dlock__redis_mux_req *head, *tail;
    dlock__redis_mux_req *told; /* callers to wake when mu is let go */
    int reading; /* a caller polls the socket for replies (without mu) */
    int wake_fd; /* an eventfd: its poll ends when the loop read for it */
    unsigned long answered; /* requests whose replies were handed over */
    unsigned gen; /* counts the connections failed (and closed) */
} dlock__redis_mux;

/* Set up mux with a connection like conn (no I/O); DLOCK_ENOMEM. On a
 * cluster URL, mux's connection gets a routing state of its own, shared by
 * the callers (dlock__redis_cluster_share). */
int dlock__redis_mux_init(dlock__redis_mux *mux, const dlock__redis_conn *conn);

/* Close the connection and free; a zeroed mux is a no-op. No call may be
 * running on it. */
void dlock__redis_mux_destroy(dlock__redis_mux *mux);

/* Connect now, unless connected (dlock__redis_conn_connect's codes). */
int dlock__redis_mux_connect(dlock__redis_mux *mux);

/* dlock__redis_conn_script on the shared connection: EVALSHA, then EVAL
 * on NOSCRIPT. An error reply is a code and message, *out NULL. */
int dlock__redis_mux_script(dlock__redis_mux *mux, const dlock__redis_script *script,
                            redisReply **out, int nkeys, int argc, const char **argv,
                            const size_t *lens);

/*
 * One command sent once, with ASKING before it when asking and WAIT
 * min_replicas after it when wait: DLOCK_OK with its reply as the server
 * gave it, an error reply too (*out), and WAIT's (*wait_out, NULL without);
 * else a connection failure's code and message, *timed_out when by the
 * command timeout. For the cluster's router, which follows redirections
 * itself.
 */
int dlock__redis_mux_call(dlock__redis_mux *mux, redisReply **out, redisReply **wait_out,
                          int argc, const char **argv, const size_t *lens, int wait, int asking,
                          int *timed_out);

/*
 * Asynchronous requests, for the asynchronous API's loop: a command sent
 * now, behind whatever is in flight, without waiting for its reply. cb(arg,
 * rc, reply) is called once, with mux's mutex held, from whichever thread
 * reads the reply (a caller waiting for its own, or the loop in
 * dlock__redis_mux_pump): DLOCK_OK with the reply (cb's to free), or the
 * connection's failure (reply NULL, the thread's message set). It must not
 * call into mux. DLOCK_ENOTSUP when the connection is not open (connecting
 * blocks: use the blocking calls), or on a cluster URL.
 */
typedef void (*dlock__redis_mux_cb)(void *arg, int rc, redisReply *reply);
int dlock__redis_mux_send_async(dlock__redis_mux *mux, int argc, const char **argv,
                                const size_t *lens, dlock__redis_mux_cb cb, void *arg);

/* The same from inside a cb (mux's mutex held): a command sent after an
 * answer, as EVAL after NOSCRIPT. */
int dlock__redis_mux_send_again(dlock__redis_mux *mux, int argc, const char **argv,
                                const size_t *lens, dlock__redis_mux_cb cb, void *arg);

/* Read what the socket has, without waiting, and hand the complete replies
 * to their requests; fail what waited past its timeout. Returns the lease-
 * clock ms by which it must run again for an asynchronous request in
 * flight, -1 when there is none. */
int64_t dlock__redis_mux_pump(dlock__redis_mux *mux);

/* The connection's descriptor (-1 when it is not open) and its generation
 * (another connection, perhaps on the same descriptor, has another). */
int dlock__redis_mux_fd(dlock__redis_mux *mux, unsigned *gen);

#endif
