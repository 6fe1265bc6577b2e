/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A tiny test harness. Each test is a function; a test binary runs the one
 * named on its command line, so CTest runs every test in its own process
 * with its own timeout (after libuv). A failed check prints where and exits 1.
 */
#ifndef DLOCK_TEST_H
#define DLOCK_TEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlock/async.h"
#include "dlock/dlock.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n  last dlock message: %s\n", __FILE__,      \
                    __LINE__, #cond, dlock_error_message());                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_RC(expr, want)                                                                       \
    do {                                                                                           \
        int check_rc_ = (expr);                                                                    \
        if (check_rc_ != (want)) {                                                                 \
            fprintf(stderr, "%s:%d: %s returned %d (%s), wanted %d (%s)\n  message: %s\n",        \
                    __FILE__, __LINE__, #expr, check_rc_, dlock_strerror(check_rc_), (want),       \
                    dlock_strerror(want), dlock_error_message());                                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_CONTAINS(haystack, needle)                                                           \
    do {                                                                                           \
        const char *check_h_ = (haystack);                                                         \
        if (check_h_ == NULL || strstr(check_h_, (needle)) == NULL) {                              \
            fprintf(stderr, "%s:%d: '%s' does not contain '%s'\n", __FILE__, __LINE__,           \
                    check_h_ ? check_h_ : "(null)", (needle));                                     \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A test case: its name, its function, and the CTest labels it adds to its
 * program's (";"-separated, NULL for none), e.g. "watchdog" for the cases
 * that also run under TSan. CMake reads the list from the program
 * (PROGRAM --list), so a case added here always runs. A child process's
 * entry point, run by a case and not a test by itself, has TEST_CHILD as its
 * labels: it is left out of the list. */
#define TEST_CHILD "(child)"
typedef struct {
    const char *name;
    void (*fn)(void);
    const char *labels;
} test_case;

#define TEST_MAIN(...)                                                                             \
    int main(int argc, char **argv)                                                                \
    {                                                                                              \
        static const test_case cases[] = {__VA_ARGS__};                                            \
        return test_run(cases, sizeof(cases) / sizeof(cases[0]), argc, argv);                      \
    }

/* PROGRAM CASE runs one case; PROGRAM --list prints "NAME LABELS" a line. */
int test_run(const test_case *cases, size_t n, int argc, char **argv);
/* For a suite run once per backend: PROGRAM BACKEND CASE runs one case with
 * *backend set to BACKEND; PROGRAM --list as test_run. */
int test_run_on(const test_case *cases, size_t n, int argc, char **argv, const char **backend);

/* DLOCK_ACQUIRE_OPTIONS_INIT with these three set. */
dlock_acquire_options test_opts(int64_t wait_ms, int64_t lease_ms, int auto_renew);
/* Reap child pid; fail the test unless it exited with status 0. */
void test_wait_child_ok(int pid);

/* dlock_acquire in a thread of its own: test_acquirer_init, then
 * pthread_create(&t, NULL, test_acquirer_main, &a). done turns 1 once the
 * call returned, with rc, lock and took_ms (how long it took) set, and on
 * failure the thread's dlock_error_message() in message (CHECK_RC on rc
 * prints the checking thread's, not this one's). */
typedef struct {
    dlock_client *c;
    const char *name;
    dlock_acquire_options o;
    atomic_int done;
    int rc;
    dlock_lock *lock;
    int64_t took_ms;
    char message[512];
} test_acquirer;

void test_acquirer_init(test_acquirer *a, dlock_client *c, const char *name,
                        dlock_acquire_options o);
void *test_acquirer_main(void *arg);

/* Release l: the waiter a (in thread t, joined here) then holds, with a
 * fence above l's. */
void test_hand_over(dlock_lock *l, test_acquirer *a, pthread_t t);

/* One asynchronous call's outcome (dlock/async.h), as its callback saw it:
 * test_async_acquired for dlock_acquire_async, test_async_done for the
 * calls that end with a code. calls counts the callbacks; msg is the
 * thread's message then; order the how-manieth callback of the process. */
typedef struct {
    int calls, rc;
    dlock_lock *lock;
    char msg[512];
    int order;
} test_async_outcome;

void test_async_acquired(int rc, dlock_lock *lock, void *arg);
void test_async_done(int rc, void *arg);

/* One turn of c's loop, as an event loop makes it: wait for its descriptor
 * up to the client's timeout (cap_ms at most), then process. */
void test_async_turn(dlock_client *c, int cap_ms);

/* Run c's loop until *calls reaches want, for ms at most (then the test
 * fails). */
void test_async_until(dlock_client *c, const int *calls, int want, int64_t ms);

/* An on_lost callback that counts its calls and keeps the last reason. */
extern atomic_int test_lost_calls;
extern atomic_int test_lost_reason;
void test_count_lost(dlock_lock *lock, int reason, void *payload);

/* A log callback (dlock_client_options.log) that appends "LEVEL MESSAGE\n"
 * to the process's log text (8 KiB, the rest cut off); test_log_text is it,
 * test_log_clear empties it. */
void test_log_record(int level, const char *message, void *payload);
const char *test_log_text(void);
void test_log_clear(void);

/* ---- a private redis-server, for tests that count its commands or
 * kill and restart it (server_redis.c) ---- */

typedef struct {
    int port;
    int pid;
    char dir[64];
    char url[512];    /* redis://, or rediss://...?cacert= with a TLS port */
    char extra[1024]; /* extra redis-server arguments, space separated */
    int tls_port;     /* also listening for TLS here (0: not) */
    char conf[96];    /* set: a redis-sentinel run with this config file */
} test_redis;

/* Start redis-server on a free loopback port in a new temp dir; exits the
 * test with a clear message if redis-server is missing. */
void test_redis_start(test_redis *r, const char *extra_args);
/* ---- TLS: certificates made with openssl at run time (server_redis.c) ---- */

typedef struct {
    char dir[64]; /* mkdtemp; holds every file below, as DIR/NAME */
} test_tls;

/*
 * Make, in a new temp dir: ca.crt/ca.key (a CA); server.crt/.key for
 * 127.0.0.1 and localhost, client.crt/.key, and expired.crt/.key (a server
 * certificate whose one day of validity ended 2000 days ago), all signed by that CA; and
 * other-ca.crt with other.crt/.key, a server certificate for 127.0.0.1 from
 * another CA. Exits the test with a message if openssl or faketime fails.
 */
void test_tls_make(test_tls *t);
void test_tls_remove(test_tls *t);
/* DIR/name into buf (static, one at a time: copy it). */
const char *test_tls_file(const test_tls *t, const char *name);

/* Start redis-server as test_redis_start, also listening for TLS with
 * certificate CERT (t's "server", "expired" or "other") on r->tls_port;
 * r->url is then rediss://127.0.0.1:TLS_PORT?cacert=DIR/ca.crt. The plain
 * port stays for the test's own commands (test_redis_cmd). extra_args may
 * add --tls-auth-clients yes (default here: no). */
void test_redis_start_tls(test_redis *r, const test_tls *t, const char *cert,
                          const char *extra_args);

/* Start it again on the same port and dir (after test_redis_kill). */
void test_redis_restart(test_redis *r);
/* kill -9 and reap. */
void test_redis_kill(test_redis *r);
/* Stop and remove its dir. */
void test_redis_stop(test_redis *r);
/* Run one command on it (hiredis, printf-style) and return its integer
 * reply, or the length of a string/array reply. */
long long test_redis_cmd(test_redis *r, const char *fmt, ...);
/* Run one command on it (as test_redis_cmd) and write its string reply
 * to buf (size bytes), "" for none or a reply of another type: a GET's
 * value, CLIENT LIST's lines. */
void test_redis_text(test_redis *r, char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Subscribers of a channel now (PUBSUB NUMSUB's count, not its reply's
 * length, which is always 2). */
long long test_redis_numsub(test_redis *r, const char *channel);
/* calls= of one command in INFO commandstats, e.g. "evalsha". */
long long test_redis_calls(test_redis *r, const char *command);

/* Start n (at most TEST_REDLOCK_MAX) independent redis-servers, each as
 * test_redis_start, and write the redlock:// URL over all of them to url
 * (size bytes; server_redlock.c). */
#define TEST_REDLOCK_MAX 5
void test_redis_start_many(test_redis *r, int n, const char *extra_args, char *url,
                           size_t size);

/* What this process's file descriptor fd is ("socket:[...]",
 * "anon_inode:[io_uring]", a path), from /proc/self/fd, in target; 0 when
 * fd is not open (or the name does not fit). */
int test_fd_target(int fd, char *target, size_t size);

/* Sleep ms milliseconds. */
void test_sleep_ms(long ms);
/* Milliseconds on clock (CLOCK_MONOTONIC, CLOCK_REALTIME ...). */
int64_t test_clock_ms(int clock);

/* libfaketime's multithreaded library (Debian package faketime), for
 * LD_PRELOAD in a child whose wall clock a test moves; NULL without it. */
const char *test_faketime_lib(void);


/* ---- private etcd members (single node or a cluster on loopback;
 * server_etcd.c) ---- */

#define TEST_ETCD_MAX 3

typedef struct {
    int n;                            /* members */
    int client_port[TEST_ETCD_MAX];
    int peer_port[TEST_ETCD_MAX];
    int pid[TEST_ETCD_MAX];           /* 0 while a member is down */
    char dir[64];                     /* member i lives in dir/mI, logs in dir/mI.log */
    char url[256];                    /* etcd://127.0.0.1:P0,127.0.0.1:P1,... */
    char member_url[TEST_ETCD_MAX][64]; /* etcd://127.0.0.1:PI */
    char extra[256];                  /* extra etcd arguments, space separated */
    char tls[80];                     /* with TLS: the dir of ca.pem, server.*, client.* */
} test_etcd;

/* Start members etcd members (1..TEST_ETCD_MAX) on free loopback ports in a
 * new temp dir, and wait until the cluster has a leader. Exits the test with
 * a clear message if etcd is missing (apt-get install etcd-server). Members
 * are killed at exit, also when a check fails, and die with the test process. */
void test_etcd_start(test_etcd *e, int members, const char *extra_args);
/* The same with https client URLs and client certificates required: makes a
 * CA, a server and a client certificate (openssl) in e->tls; e->url is then
 * etcds://...?cacert=...&cert=...&key=... */
void test_etcd_start_tls(test_etcd *e, int members);
/* kill -9 member i and reap it. */
void test_etcd_kill(test_etcd *e, int member);
/* Start member i again on its ports and data dir; waits until it is healthy. */
void test_etcd_restart(test_etcd *e, int member);
/* Kill every member and remove the dir. */
void test_etcd_stop(test_etcd *e);
/* The index of the member that leads now (waits up to 10 s for one). */
int test_etcd_leader(test_etcd *e);
/* POST json to path on member i's gateway; the reply body (malloc'd) or NULL
 * when the member cannot be reached. */
char *test_etcd_post(test_etcd *e, int member, const char *path, const char *json);
/* Keys whose name starts with prefix ("": all keys), read through any live
 * member. */
long long test_etcd_count(test_etcd *e, const char *prefix);
/* Delete the keys starting with prefix; returns how many. */
long long test_etcd_delete(test_etcd *e, const char *prefix);
/* Leases that exist now. */
/* Leases in use (a spare or session lease of dlock's with a key attached
 * included). */
long long test_etcd_leases(test_etcd *e);
/* dlock's spare leases (ID bit 62 set, 61 clear) with no key attached. */
long long test_etcd_spares(test_etcd *e);
/* Session leases (etcd_session.c) there are, with keys or not. */
long long test_etcd_sessions(test_etcd *e);
/* Sum of member i's Prometheus counters whose line starts with metric, e.g.
 * "grpc_server_started_total{grpc_method=\"Txn\"". */
long long test_etcd_metric(test_etcd *e, int member, const char *metric);
/* 1 if process pid still exists (not reaped, not gone). */
int test_process_alive(int pid);

/* A zeroed MAP_SHARED page of size bytes, shared with the processes forked
 * after (counters of who is inside, for tests of exclusion). */
void *test_shared_page(size_t size);

/* A free loopback port below the kernel's ephemeral range (no outgoing
 * connection takes it between this check and the server's bind). */
int test_free_port(void);

/* ---- private ZooKeeper servers (tests/support/test_zk.c): standalone or
 * an ensemble on loopback ---- */

#define TEST_ZK_MAX 3

typedef struct {
    int n;                          /* members */
    int client_port[TEST_ZK_MAX];
    int peer_port[TEST_ZK_MAX];
    int elect_port[TEST_ZK_MAX];
    int pid[TEST_ZK_MAX];           /* 0 while a member is down */
    char dir[64];                   /* member i: dir/mI (zoo.cfg, data), log dir/mI.log */
    char hosts[256];                /* 127.0.0.1:P0,127.0.0.1:P1,... */
    char url[320];                  /* zk://HOSTS?session_timeout_ms=2000 */
    char member_url[TEST_ZK_MAX][96]; /* zk://127.0.0.1:PI?session_timeout_ms=2000 */
    char extra[256];                /* extra zoo.cfg lines */
} test_zk;

/* Start members ZooKeeper servers (1: standalone; 3: an ensemble) on free
 * loopback ports in a new temp dir (ticks of 250 ms, sessions 500 ms to
 * 1 h), with extra_cfg (zoo.cfg lines, may be NULL), and wait until each
 * serves. Exits the test with its log if one does not start (apt-get
 * install zookeeper default-jdk-headless). Killed at exit. */
void test_zk_start(test_zk *z, int members, const char *extra_cfg);
/* kill -9 member i and reap it / start it again on its ports and data. */
void test_zk_kill(test_zk *z, int member);
void test_zk_restart(test_zk *z, int member);
/* SIGSTOP / SIGCONT member i. */
void test_zk_pause(test_zk *z, int member, int paused);
/* Kill every member and remove the dir. */
void test_zk_stop(test_zk *z);
/* The member that leads now (standalone: 0); waits up to 20 s. */
int test_zk_leader(test_zk *z);
/* A four-letter word's answer from member i (malloc'd), NULL if none. */
char *test_zk_4lw(test_zk *z, int member, const char *cmd);
/* One number from member i's mntr ("zk_cnt_readlatency"), -1 if none. */
long long test_zk_mntr(test_zk *z, int member, const char *key);
/* Children of path now (0 when it does not exist), through any live member. */
long long test_zk_children(test_zk *z, const char *path);
/* Their names, up to max. */
int test_zk_child_names(test_zk *z, const char *path, char names[][128], int max);

/* ---- Sentinel: a master, 2 replicas and 3 sentinels on loopback
 * (server_sentinel.c) ---- */

#define TEST_SENTINEL_REPLICAS 2
#define TEST_SENTINELS 3

typedef struct {
    test_redis nodes[1 + TEST_SENTINEL_REPLICAS]; /* [0] the first master */
    test_redis sentinels[TEST_SENTINELS];
    char url[512]; /* redis-sentinel://127.0.0.1:P1,.../dlock */
} test_sentinel;

/* Start them and wait until every sentinel names the master and both
 * replicas have synced. failover non-zero: down-after-milliseconds 1000
 * (else 600000: no failover while a test pauses the master),
 * failover-timeout 3000, and wait until every sentinel also knows both
 * replicas and the other sentinels (a failover needs a majority of them to
 * agree); TEST_SENTINEL_SYNCING: as 1, but without waiting for the
 * replicas' first sync (which Redis starts 5 s late, as it does by
 * default). extra_args go to every redis-server. Exits the test with a
 * message when one does not start. */
#define TEST_SENTINEL_SYNCING 2
void test_sentinel_start(test_sentinel *s, const char *extra_args, int failover);
/* The same over TLS with t's "server" certificate: every redis-server and
 * sentinel also listens on a TLS port (tls_port; the plain port stays for
 * the test's own commands) and requires a client certificate of t's CA,
 * replication and the sentinels' links use TLS (tls-replication yes), the
 * sentinels monitor the master's TLS port, and url is
 * rediss-sentinel://...TLS ports.../dlock?cacert=DIR/ca.crt (add cert=
 * and key=). */
void test_sentinel_start_tls(test_sentinel *s, const test_tls *t, int failover);
void test_sentinel_stop(test_sentinel *s);
/* The node the sentinels name as master now (-1: none, or they disagree). */
int test_sentinel_master(test_sentinel *s);
/* SIGKILL the master and wait (up to 60 s) until every live sentinel names
 * another node; returns that node's index, or -1 after the wait. */
int test_sentinel_failover(test_sentinel *s);

/* ---- a fake Redis node, for the attacks of a hostile server (a master a
 * lying sentinel names, a cluster node that redirects elsewhere) ---- */
typedef struct test_fake_node test_fake_node;
/* The reply to one command (argc arguments, each NUL-terminated), written
 * into buf (RESP), or NULL for none (the client waits). */
typedef const char *test_fake_answer(test_fake_node *f, int argc, char **argv, char *buf,
                                     size_t size);
struct test_fake_node {
    int port;                 /* on 127.0.0.1, set by test_fake_node_start */
    test_fake_answer *answer; /* NULL: never answers */
    void *arg;                /* for answer */
    atomic_int conns;         /* connections accepted */
    atomic_int auths;         /* AUTH commands received */
    /* internal */
    int fd;
    atomic_int stop;
    pthread_t thread;
    pthread_mutex_t mu;
    char seen[8192]; /* the first bytes received, all connections */
    size_t seen_len;
};
/* Listen on a free loopback port and serve from a thread of its own. */
void test_fake_node_start(test_fake_node *f, test_fake_answer *answer, void *arg);
void test_fake_node_stop(test_fake_node *f);
/* Whether needle is among the bytes it received. */
int test_fake_node_saw(test_fake_node *f, const char *needle);
/* ---- private MariaDB servers (test_mysql.c) ---- */

typedef struct {
    int port;       /* of 47400..47499 */
    int pid;        /* 0 while down */
    char dir[64];   /* data/, sock, err.log */
    char sock[96];
    char url[160];  /* mysql://dlock:dlockpw@127.0.0.1:PORT/dlock_test */
    char tls_dir[64];  /* set: TLS on, with certificate tls_cert of this test_tls */
    char tls_cert[16];
} test_mariadb;

/* Start mariadbd on a copy of a data directory made once (account dlock,
 * password dlockpw, database dlock_test); exits the test with a message if
 * MariaDB is missing. Killed at exit, also when a check fails. */
void test_mariadb_start(test_mariadb *m);
/* The same, with TLS on: certificate CERT (t's "server", "client", ...)
 * and t's ca.crt. */
void test_mariadb_start_tls(test_mariadb *m, const test_tls *t, const char *cert);
/* Start it again on the same port and data (after test_mariadb_kill). */
void test_mariadb_restart(test_mariadb *m);
/* kill -9 and reap. */
void test_mariadb_kill(test_mariadb *m);
/* Kill it and remove its dir. */
void test_mariadb_stop(test_mariadb *m);
/* Run one statement (printf-style) as root in dlock_test: the first column
 * of the first row as an integer (-1 for NULL or no row), or the rows a
 * statement without a result changed. */
long long test_mariadb_query(test_mariadb *m, const char *fmt, ...);

/* ---- Cluster: 3 masters on loopback (redis-cli --cluster create;
 * server_cluster.c) ---- */

#define TEST_CLUSTER_NODES 3

typedef struct {
    int n; /* nodes: TEST_CLUSTER_NODES masters, and as many replicas */
    test_redis nodes[2 * TEST_CLUSTER_NODES];
    char url[400]; /* redis-cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3 */
} test_cluster;

/* Start 3 cluster-enabled redis-servers on ports of 21200-21299 free then
 * (the cluster bus takes port+10000), join them with redis-cli --cluster
 * create (slots split in three) and wait until every node says
 * cluster_state:ok. extra_args go to every redis-server. */
void test_cluster_start(test_cluster *c, const char *extra_args);
/* The same over TLS with t's "server" certificate: each node also listens
 * on a TLS port (tls_port; the plain port stays for the test's own
 * commands) and requires a client certificate of t's CA, the cluster bus
 * and replication use TLS (tls-cluster yes, tls-replication yes), the
 * cluster is created by redis-cli over TLS, and url is
 * rediss-cluster://...TLS ports...?cacert=DIR/ca.crt (add cert= and key=). */
void test_cluster_start_tls(test_cluster *c, const test_tls *t);
/* 6 nodes: 3 masters with one replica each (redis-cli --cluster create
 * --cluster-replicas 1), returning once every replica has finished its
 * first sync; which are masters the slot map tells (test_cluster_owner,
 * which skips nodes the test killed). */
void test_cluster_start_replicas(test_cluster *c, const char *extra_args);
void test_cluster_stop(test_cluster *c);
/* Start one more node and join it to the cluster as a master with no
 * slot (redis-cli --cluster add-node), not in c->url; its index. */
int test_cluster_add_master(test_cluster *c);
/* The slot of key (CLUSTER KEYSLOT) and the node serving it now (-1:
 * none agrees). */
int test_cluster_slot(test_cluster *c, const char *key);
int test_cluster_owner(test_cluster *c, int slot);
/* Move slot to node to by hand, as redis-cli --cluster reshard does it
 * (SETSLOT IMPORTING / MIGRATING, MIGRATE of its keys, SETSLOT NODE),
 * pausing pause_ms between marking it migrating and moving its keys: ASK
 * and TRYAGAIN answer meanwhile. Exits the test when a step fails. */
void test_cluster_move_slot(test_cluster *c, int slot, int to, int pause_ms);
/* Its two halves: mark the slot importing on to and migrating on its
 * owner and move its keys (the slot stays half migrated: its owner answers
 * ASK); then give the slot to to on every node. */
void test_cluster_migrate_keys(test_cluster *c, int slot, int to, int pause_ms);
/* Its steps: mark the slot importing on to and migrating on its owner;
 * MIGRATE one key of it to to. */
void test_cluster_mark_migrating(test_cluster *c, int slot, int to);
void test_cluster_migrate_key(test_cluster *c, int slot, int to, const char *key);
void test_cluster_finish_slot(test_cluster *c, int slot, int to);
/* Run a command on the node serving key's slot (as test_redis_cmd). */
long long test_cluster_cmd(test_cluster *c, const char *key, const char *fmt, ...);

/* ---- ACL users (test_acl.c) ---- */

/* The README's minimal ACL (Security), as it is written there, and what
 * docs/family.md adds for the other kinds of the lock family. */
#define TEST_ACL_README                                                                            \
    "resetkeys ~dlock:* resetchannels &dlock:* -@all +evalsha +eval +get +set +incr +pexpire "    \
    "+pttl +del +publish +exists +subscribe +unsubscribe +client|setname +select +rpush +blpop"
#define TEST_ACL_FAMILY                                                                            \
    "+time +exists +pttl +pexpire +hset +hget +hdel +hlen +hexists +hvals +zadd +zrem +zscore "   \
    "+zcard +zrange +zrangebyscore +publish"

/* ACL SETUSER user reset on >pass RULES... on r (rules separated by
 * spaces, each one argument), as the default user; exits on an error. */
void test_acl_setuser(test_redis *r, const char *user, const char *pass, const char *rules);

/* dlock_client_open(url) with connect_timeout_ms connect_ms returns want,
 * its message (printed after what) naming where and cause. */
void test_open_refused(const char *url, int64_t connect_ms, int want, const char *what,
                       const char *where, const char *cause);
/* dlock_client_open(url) works and an acquire returns want, its message
 * (printed after what) naming cause and not holding secret. */
void test_acquire_refused(const char *url, int want, const char *what, const char *cause,
                          const char *secret);

/* After a failover: count lock in *survived if its holder still holds it
 * (dlock_lock_check), release it, take name again through c and count in
 * *back a fence not above before (the first 3 printed after label). */
void test_retake(dlock_client *c, dlock_lock *lock, const char *name, uint64_t before,
                 int *survived, int *back, const char *label);

/* The lock family through url (with connect_timeout_ms connect_ms): a
 * mutex (check, busy, a waiter woken by the release with a greater fence,
 * extend, status, force release), two readers then a writer, a semaphore
 * of 2, a fair lock, a multi-lock of one hash tag, and the mutex's fence
 * going on after all that. Returns 0, or the step that failed with its code
 * and message (size bytes) set. */
int test_acl_scenario(const char *url, int64_t connect_ms, int *code, char *msg, size_t size);

/* ---- either backend: the scenarios every backend must pass
 * (tests/integration/core) see the server only through these ---- */

/* What a test server does, one table per backend (test_server.h). */
typedef struct test_server_ops test_server_ops;

typedef struct {
    const test_server_ops *ops; /* of the name given to test_server_start */
    const char *backend; /* "redis", "plainredis" (tests/backend), "etcd",
                          * "redlock" (3 independent redis-servers) or "zk"
                          * (a standalone ZooKeeper); "rediss" starts "redis"
                          * over TLS (tls set); "redis-sentinel" starts
                          * "redis" as a master, 2 replicas and 3 sentinels;
                          * "redis-cluster" starts "redis" on a 3-master
                          * cluster */
    int tls;
    test_tls certs; /* tls */
    test_redis redis;    /* redis and plainredis; redis-sentinel: its master */
    test_sentinel *sentinel; /* redis-sentinel */
    test_cluster *cluster;   /* redis-cluster: 3 masters */
    test_redis nodes[TEST_REDLOCK_MAX]; /* redlock */
    int nnodes;
    char redlock_url[256];
    test_etcd etcd;
    test_zk zk;
    char plain_url[96];
    const char *url;
    int64_t short_lease_ms; /* the shortest lease the service keeps well */
    int dense_fences;       /* fences are 1, 2, 3 ... (Redis), not just increasing */
    test_mariadb mariadb;   /* mysql, mysql-named */
    int sql_named;          /* mysql-named: the URL's mode=named */
    int conn_bound;         /* the lock lives on a connection of its own (MySQL
                             * named mode): a renewal is a statement per lock on
                             * it, and one that times out ends the lock at once
                             * (the server ends it with the connection) */
    char sql_url[200];
    struct test_pg *pg;     /* postgres, postgres-advisory (test_pg.c) */
    int waiter_leftovers;   /* what a waiting acquisition keeps on the server, as
                             * test_server_leftovers counts it (Redis: the hand-off
                             * entry; etcd: its key and lease; plainredis: none) */
} test_server;

/* dlock_client_open(url) is DLOCK_EINVAL (before any I/O) with a message
 * containing needle. */
void test_url_refused(const char *url, const char *needle);

/* Start a throwaway server of backend: a name of test_server.c's list
 * ("redis", "rediss": redis over TLS, "etcd": one member, "plainredis": a
 * redis-server served by the out-of-tree backend of tests/backend,
 * registered with dlock_backend_register, ...; each a table of
 * tests/support/server_NAME.c). Exits the test with a message for any
 * other name. */
void test_server_start(test_server *s, const char *backend);
void test_server_stop(test_server *s);
/* 1 if the server holds the lock name for someone now (redlock: a quorum
 * of nodes holds its key). */
int test_server_held(test_server *s, const char *name);
/* Pause the server's process (SIGSTOP; etcd: its first member; redlock:
 * every node), or let it
 * go on (SIGCONT): while paused, connections stay open and requests go
 * unanswered, as with a server that hangs or a network that drops. */
void test_server_pause(test_server *s, int paused);
/* What the server keeps for name besides its fence counter: Redis, the lock,
 * its holder record and its hand-off entry; etcd, the keys under dlock/NAME/ (holder and
 * queued waiters) plus every lease there is; Redlock, the nodes holding the lock's key,
 * once every node that is up has it or none has (the slowest nodes run a request after
 * the call returned). 0 once nothing is left. */
long long test_server_leftovers(test_server *s, const char *name);
/* Requests so far that take, keep or give up locks (Redis: scripts; etcd:
 * Txn, Range, DeleteRange, Put and keepalive requests; redlock: the scripts
 * of its first node, which gets one of every request). */
long long test_server_requests(test_server *s);

#endif
