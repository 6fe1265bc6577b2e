/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One Redis connection with its timeouts, credentials and database, that
 * reconnects on next use after it dropped. Not thread-safe: each user (the
 * command path under its mutex, the watchdog, the subscriber thread) has its
 * own.
 */
#ifndef DLOCK_REDIS_CONN_H
#define DLOCK_REDIS_CONN_H

#include <hiredis/hiredis.h>

#include "backends/redis/redis_cluster.h"
#include "backends/redis/redis_scripts.h"
#include "backends/redis/redis_transport.h"
#include "core/fmt.h"
#include "dlock/sys/backend.h"

typedef struct dlock__redis_conn {
    const dlock_url *url; /* borrowed from the client */
    dlock__redis_endpoint ep; /* where and how (TCP, unix socket, TLS) */
    int db;
    char client_name[80];
    int64_t connect_ms;
    int64_t command_ms; /* each command's whole round trip */
    char where[128]; /* "redis 127.0.0.1:6379", "rediss ...", for messages */
    dlock__redis_tp tp;
    int timed_out; /* the last I/O failure was a timeout, not a dead peer */
    /* Array elements of the reply being read (see bounded_create_array). */
    size_t reply_elements;
    /* Why the last reply was refused: DLOCK__REDIS_REFUSED_* (0: it was not). */
    int refused;
    /* The client's log, told when the connection is made again after it
     * broke (connected: it was made once). */
    dlock_log_cb log;
    void *log_payload;
    const char *role;
    int connected;
    /* The master's credentials: the URL's user:password, or password= on a
     * Sentinel URL. NULL: none. */
    const char *user;
    const char *password;
    /* Sentinel (redis-sentinel://, rediss-sentinel://): the master is asked
     * of the sentinels (the URL's hosts) at each connect and its ROLE
     * checked; ep.host then points at master_host. NULL: not Sentinel. */
    const char *master_name;
    const char *sentinel_user;     /* NULL: the sentinels' default user */
    const char *sentinel_password;
    char master_host[256];
    size_t sentinel_next; /* the sentinel that answered last, asked first */
    /* min_replicas=N: scripts that write a hold are followed, in the same
     * round trip, by WAIT N wait_ms (docs/redis-sentinel.md). */
    int min_replicas;
    int64_t wait_ms;
    int readonly; /* the last error reply was READONLY (a demoted master) */
    /* Cluster (redis-cluster://, rediss-cluster://): commands are routed to
     * the master of their key's slot (redis_cluster.c), each on a connection
     * of its own; tp is a connection to any node (the subscriber's: PUBLISH
     * reaches every node of a cluster). The routing state is made on first
     * use and freed by dlock__redis_conn_close. */
    int is_cluster;
    dlock__redis_cluster *cluster;
    /* The last error reply when it was a cluster redirection or a
     * transient cluster state (MOVED, ASK, TRYAGAIN, CLUSTERDOWN), else "". */
    char redirect[160];
} dlock__redis_conn;

enum {
    DLOCK__REDIS_REFUSED_ELEMENTS = 1, /* past DLOCK__REDIS_MAX_REPLY_ELEMENTS */
    DLOCK__REDIS_REFUSED_BYTES         /* past DLOCK__REDIS_MAX_REPLY_BYTES */
};

/*
 * A reply may hold at most this many array elements in all (nested arrays
 * count too). hiredis 0.14 allocates an array's element pointers as soon as
 * it reads the "*N" header, before any element has arrived: unchecked, a
 * broken or hostile server could make a 12-byte reply allocate 16 GiB.
 */
#define DLOCK__REDIS_MAX_REPLY_ELEMENTS (1 << 20)

/*
 * A bulk string or a line (status, error, integer) may be at most this long.
 * hiredis 0.14 reads a bulk string until it has all of it, whatever length
 * its header announces: a hostile server could make the client buffer
 * gigabytes. dlock's replies are tokens, owner ids, identities, short error
 * texts and integers: a few KiB at most.
 */
#define DLOCK__REDIS_MAX_REPLY_BYTES (1 << 20)

/* Fill conn from the URL and options; no I/O. DLOCK_EINVAL for a bad URL.
 * redis://, unix:// and rediss:// (TLS: cacert, cert, key, sni, insecure;
 * docs/redis-tls.md); redis-sentinel:// and rediss-sentinel://
 * (docs/redis-sentinel.md). */
int dlock__redis_conn_init(dlock__redis_conn *conn, const dlock_url *url,
                           const dlock_client_options *opts, const char *role);

/* The TLS parameters of url (cacert, cert, key, sni, insecure) into ep;
 * DLOCK_EINVAL for a bad value or a key without its cert. Parameters that
 * are not TLS ones are left for the caller to check. */
int dlock__redis_tls_params(dlock__redis_endpoint *ep, const dlock_url *url);

/* Whether key is one of dlock__redis_tls_params's. */
int dlock__redis_tls_param(const char *key);

/* Connected and not failed: the next command goes out on this connection. */
int dlock__redis_conn_is_open(const dlock__redis_conn *conn);

/* Connect (AUTH, SELECT, CLIENT SETNAME) unless connected. */
int dlock__redis_conn_connect(dlock__redis_conn *conn);

void dlock__redis_conn_close(dlock__redis_conn *conn);

/*
 * Send one command and read its reply into *out (the caller frees it with
 * freeReplyObject). An error reply is turned into a code and message and *out
 * is NULL. A connection that was already open and turns out dead (the server
 * restarted) is re-opened and the command sent once more, so every command
 * sent through here must be safe to repeat.
 */
int dlock__redis_conn_command(dlock__redis_conn *conn, redisReply **out, int argc,
                              const char **argv, const size_t *lens);

/* The command that runs an embedded script: EVALSHA sha1 (or EVAL body)
 * numkeys, then argv. av/al point into the struct for up to 16 arguments,
 * else at allocations that dlock__redis_script_cmd_free gives back. */
typedef struct {
    const char *stack_av[19];
    size_t stack_al[19];
    const char **av;
    size_t *al;
    char numkeys[DLOCK__FMT_LL_MAX + 1];
    int argc; /* of av */
} dlock__redis_script_cmd;

int dlock__redis_script_cmd_init(dlock__redis_script_cmd *c, const dlock__redis_script *script,
                                 int eval, int nkeys, int argc, const char **argv,
                                 const size_t *lens);
/* Turn the command into EVAL (the script's body) after a NOSCRIPT. */
void dlock__redis_script_cmd_eval(dlock__redis_script_cmd *c, const dlock__redis_script *script);
void dlock__redis_script_cmd_free(dlock__redis_script_cmd *c);

/* How a script's command goes out (dlock__redis_script_send): one command
 * and its reply, DLOCK_ENOTSUP for NOSCRIPT. */
typedef int (*dlock__redis_send_fn)(void *ctx, redisReply **out, int argc, const char **argv,
                                    const size_t *lens);

/* An embedded script sent by send: EVALSHA, then EVAL (which loads it) on
 * NOSCRIPT. argv holds the nkeys keys then the arguments (argc in all). */
int dlock__redis_script_send(const dlock__redis_script *script, redisReply **out, int nkeys,
                             int argc, const char **argv, const size_t *lens,
                             dlock__redis_send_fn send, void *ctx);

/* Run an embedded script with EVALSHA, loading it with EVAL on NOSCRIPT.
 * argv holds the nkeys keys then the arguments (argc in all). With
 * min_replicas=N and a script that writes a hold (acquire, extend, renew),
 * WAIT N follows it in the same round trip; how many replicas acknowledged
 * is then told by dlock__redis_wait_short. */
int dlock__redis_conn_script(dlock__redis_conn *conn, const dlock__redis_script *script,
                             redisReply **out, int nkeys, int argc, const char **argv,
                             const size_t *lens);

/*
 * After the last dlock__redis_conn_script of this thread: 1 if it was
 * followed by WAIT and fewer than min_replicas replicas acknowledged, or
 * WAIT was refused (an ACL user without it) (the script's reply was still
 * given back: the caller, which knows what the
 * script took, gives it back and fails with dlock__redis_wait_fail), else 0.
 * Thread-local, as the script call is synchronous on the caller's thread.
 */
int dlock__redis_wait_short(void);

/* For a script sent without WAIT elsewhere (redis_mux.c): the next
 * dlock__redis_wait_short of this thread says 0. */
void dlock__redis_wait_clear(void);

/* A command's outcome: WAIT's reply w (or NULL) freed, and the command's r
 * given to *out when rc is DLOCK_OK, else freed. Returns rc. */
int dlock__redis_reply_keep(int rc, redisReply *r, redisReply *w, redisReply **out);

/* What WAIT min_replicas answered (w, after a script that writes a hold),
 * for this thread's dlock__redis_wait_short; DLOCK_EPROTO for a reply WAIT
 * cannot give. */
int dlock__redis_wait_reply(const dlock__redis_conn *conn, const redisReply *w);

/* Whether the scripts that take, extend or renew a hold are followed by
 * WAIT min_replicas on conn. */
int dlock__redis_script_waits(const dlock__redis_conn *conn, const dlock__redis_script *script);

/* DLOCK_ESERVER, "WHERE: N of M replicas acknowledged the write within W ms
 * (min_replicas=M): what" (what: "the lock was released", ...); when WAIT
 * was refused, its error's code and text, then what. */
int dlock__redis_wait_fail(const char *what);

/*
 * A reader as dlock's connections make them: hiredis's, with the element
 * cap above counted in conn (conn->reply_elements, conn->refused). For
 * readers fed from memory (tests/fuzz). NULL: out of memory.
 */
redisReader *dlock__redis_reader_new(dlock__redis_conn *conn);

/* Sentinel (redis_sentinel.c): whether key is a Sentinel URL parameter;
 * the URL's sentinels and master name into conn (no I/O); connect conn to
 * the master a majority of the sentinels name, within the connect timeout. */
int dlock__redis_sentinel_param(const char *key);
int dlock__redis_sentinel_init(dlock__redis_conn *conn, const dlock_url *url);
int dlock__redis_sentinel_connect(dlock__redis_conn *conn);

/* min_replicas=N (Sentinel and Cluster): WAIT N after each script that
 * writes a hold. mr: the parameter's value, NULL when not given. */
int dlock__redis_min_replicas_init(dlock__redis_conn *conn, const dlock_url *url, const char *mr);

/* Send one command (then WAIT min_replicas, when wait) and read its reply:
 * no reconnect, no retry. */
int dlock__redis_conn_command_once(dlock__redis_conn *conn, redisReply **out, int argc,
                                   const char **argv, const size_t *lens, int wait);

/*
 * Sentinel replies, read at connect time (redis_sentinel.c). sentinel_addr: 1
 * when r, a reply to SENTINEL get-master-addr-by-name, names an address
 * (host, without NUL, copied to host if shorter than size; port 1..65535),
 * else 0. role_master: DLOCK_OK when r, a reply to ROLE, says "master", else
 * DLOCK_EPROTO or DLOCK_ECONN with a message. switch_message: 1 when m is a
 * pub/sub message (a +switch-master that ends the wait), else 0.
 */
int dlock__redis_sentinel_addr(const redisReply *r, char *host, size_t size, int *port);
int dlock__redis_role_master(const dlock__redis_conn *conn, const redisReply *r);
int dlock__redis_switch_message(const redisReply *m);

/*
 * Read one reply (sending what is queued first) within the command timeout,
 * refusing a reply whose part still to be parsed grows past
 * DLOCK__REDIS_MAX_REPLY_BYTES: the transport then fails with
 * REDIS_ERR_PROTOCOL and conn->refused set. Returns REDIS_OK or REDIS_ERR.
 */
int dlock__redis_conn_get_reply(dlock__redis_conn *conn, redisReply **out);

/* Cluster: send one command to the master of slot (-1: any node), following
 * MOVED and ASK and waiting out TRYAGAIN, CLUSTERDOWN and a master that went
 * away, all within the command timeout (redis_cluster.c); wait: WAIT
 * min_replicas follows it on that master, as for a Sentinel's
 * (dlock__redis_wait_short). */
int dlock__redis_cluster_command(dlock__redis_conn *conn, redisReply **out, int argc,
                                 const char **argv, const size_t *lens, int slot, int wait);
/* One command on a plain connection (a cluster node's), with WAIT
 * min_replicas behind it when wait. */
int dlock__redis_conn_command_wait(dlock__redis_conn *conn, redisReply **out, int argc,
                                   const char **argv, const size_t *lens, int wait);

/* The routing state the callers' scripts share (redis_mux.h): conn's own,
 * made now, with a mutex; each master's commands go out on a mux of its
 * own. DLOCK_ENOMEM. */
int dlock__redis_cluster_share(dlock__redis_conn *conn);

/* As dlock__redis_cluster_command, on the shared routing state and the
 * masters' muxes, for any number of threads at once: DLOCK_OK with the
 * command's reply as the server gave it (an error reply other than a
 * redirection or a cluster state too) and WAIT's (*wait_out; NULL without),
 * *where the connection of the master that answered, for its messages. */
int dlock__redis_cluster_mux_command(dlock__redis_conn *conn, redisReply **out,
                                     redisReply **wait_out, int argc, const char **argv,
                                     const size_t *lens, int slot, int wait,
                                     const dlock__redis_conn **where);

/* dlock__redis_conn_command, routed by slot on a cluster (-1: any node). */
int dlock__redis_conn_command_slot(dlock__redis_conn *conn, redisReply **out, int argc,
                                   const char **argv, const size_t *lens, int slot);

/* Cluster: one slot served by each master (up to max), to reach each in
 * turn; the number of masters, or a negative DLOCK_E* code. */
#define DLOCK__REDIS_LIST_MASTERS 256
int dlock__redis_cluster_masters(dlock__redis_conn *conn, int *slots, int max);

/* Cluster: connect conn's own transport to the first node that answers. */
int dlock__redis_cluster_connect_any(dlock__redis_conn *conn);

/*
 * The cluster's parsers (redis_cluster.c), reachable for replies fed from
 * memory (tests/fuzz). map_reply: fill conn's slot map from r, a CLUSTER
 * SLOTS reply of node host:port, as a refresh does (DLOCK_EPROTO for a
 * reply it refuses); slot_master: 1 with the master of slot in the map, 0
 * when none is known. redirect_parse: "MOVED 3999 HOST:PORT" / "ASK ..."
 * into the slot (0..16383), the host (within text, brackets of [::1]
 * off) and the port (1..65535); 0, or -1 when it does not parse.
 * nodes_line_master: whether one line of CLUSTER NODES ("ID
 * HOST:PORT@BUSPORT[,HOSTNAME] FLAGS ...", up to end) is addr ("HOST:PORT@",
 * alen bytes) and a master in good standing (not failing, not joining, with
 * an address).
 */
int dlock__redis_cluster_map_reply(dlock__redis_conn *conn, const char *host, int port,
                                   const redisReply *r);
int dlock__redis_cluster_slot_master(const dlock__redis_conn *conn, unsigned slot,
                                     const char **host, int *port);
/* The master of slot as conn's slot map knows it now, its host copied to
 * host (size bytes; taken under the map's mutex when it is shared): 1, or 0
 * when none is known. The hand-off's listener (redis_listen.c) connects
 * there. */
int dlock__redis_cluster_master_copy(dlock__redis_conn *conn, unsigned slot, char *host,
                                     size_t size, int *port);
int dlock__redis_redirect_parse(const char *text, long *slot, const char **host, size_t *hostlen,
                                long *port);
int dlock__redis_nodes_line_master(const char *line, const char *end, const char *addr, int alen);

/* Open conn->ep and shake hands before deadline_ms (redis_conn.c). */
int dlock__redis_conn_open_endpoint(dlock__redis_conn *conn, int64_t deadline_ms);

/* Whether the reader holds more unparsed bytes than a reply may have (then
 * the transport is failed as above). For readers that feed it themselves (the
 * subscriber, Redlock's fan-out), after they took every complete reply. */
int dlock__redis_conn_over_cap(dlock__redis_conn *conn);

/* Turn a transport failure into a code and message (closing it): the one
 * place that writes the text of an I/O or TLS failure. */
int dlock__redis_conn_io_error(dlock__redis_conn *conn);

/* Turn an error reply into a code and message. */
int dlock__redis_conn_reply_error(const dlock__redis_conn *conn, const redisReply *r);

#endif
