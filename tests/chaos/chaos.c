/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The chaos runner: for each backend and nemesis, start a fresh server (for
 * Redlock 5 of them), K worker processes (chaos_worker) and the fault proxy
 * (one a server), inject faults for the run's duration, then check the
 * history and the store and print one row.
 *
 *   chaos [--workers 8] [--lease MS] [--duration S] [--runs N] [--seed N]
 *         [--nemesis a,b,...] [--backend redis,etcd,etcd3,redlock,zk,zk3,...]
 *         [--url URL] [--keep] [--markdown FILE] [--self-test]
 *
 * Exit status 0 when no row failed: a row fails when two holders believed
 * they held the lock at the same time (each logs, before every store step,
 * the deadline the library gives it: now + dlock_lock_valid_ms()), on any
 * lost or duplicated update at the register, any fence-order violation
 * (except where the row says it is a documented limit), any overtaken
 * holder that was never told (no on_lost, no DLOCK_ELOST), a worker that
 * crashed or hung, or a nemesis that injected nothing. Holds that overlap
 * in time are reported and do not fail a row by themselves: a paused
 * holder still "holds" when it resumes, but its deadline has passed.
 *
 * --self-test runs deliberately broken workers (chaos.h) instead, one row
 * each, and exits 0 only if the checker failed every one of them (and
 * passed a row of correct workers).
 *
 * A backend is a URL plus, for the nemeses that kill the server, how to
 * start, kill and restart it (backends[] below). --url runs the nemeses that
 * need no control of the server against any URL.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chaos.h"
#include "chaos_proxy.h"
#include "test.h"
#ifdef DLOCK_TEST_POSTGRES
#include "test_pg.h"
#endif

/* ---- options ------------------------------------------------------------ */

static int opt_workers = 8;
static int64_t opt_lease_ms;  /* 0: the backend's default */
static int opt_duration_s = 5; /* per run, for a 400 ms lease: scaled with the lease */
/* In force for the backend being run. */
static int64_t lease_ms;
static int duration_s;
static int opt_runs = 1;
static long opt_faults; /* --faults N: a row runs until it has injected N faults */
static unsigned opt_seed;
static int opt_keep;
static const char *opt_url;
static const char *opt_backend = "redis";
static const char *opt_markdown;
static int opt_self_test;
static int opt_rw;  /* --kind rw: readers and writers of a read-write lock */
static int opt_sem; /* --kind sem: permit holders of a semaphore of CHAOS_SEM_PERMITS */
static int opt_fair; /* --kind fair: holders of a fair lock (exclusive, as the mutex) */
static char worker_path[PATH_MAX];

/* ---- backends ----------------------------------------------------------- */

/* The minimal ACL of README.md (Security): the workers run as this user;
 * with a kind of the family (--kind), with the family's commands too
 * (docs/family.md, "ACL"). */
static const char chaos_acl[] =
    "user chaos on >chaos-pw ~dlock:* &dlock:* -@all +evalsha +eval +get +set +incr +pexpire "
    "+pttl +del +publish +exists +subscribe +unsubscribe +client|setname +rpush +blpop";
static const char chaos_acl_family[] =
    " +time +hset +hget +hdel +hlen +hexists +hvals +zadd +zrem +zscore +zcard +zrange "
    "+zrangebyscore";

/* Redlock's nodes, an ensemble's members (etcd3, zk3); 1 for the others. */
#define CHAOS_NODES_MAX TEST_REDLOCK_MAX

typedef struct server {
    test_redis r[CHAOS_NODES_MAX]; /* redis: r[0]; redlock: one per node */
    test_etcd e;
    test_zk z;
    test_mariadb m;
#ifdef DLOCK_TEST_POSTGRES
    test_pg pg;
#endif
    int port[CHAOS_NODES_MAX]; /* each node's loopback port */
} server;

typedef struct {
    const char *name;
    /* Default lease: the shortest the service keeps well on loopback. */
    int64_t lease_ms;
    /* 1 if the service can run without persistence (server-kill-volatile). */
    int volatile_option;
    /* Servers the workers' URL names, each killed and cut off (behind a
     * proxy of its own) on its own: Redlock's independent nodes, or the
     * members of one replicated service (etcd3, zk3); 1 for a single
     * server. */
    int nodes;
    /* Start a fresh server (every node), keeping what files it needs in
     * dir; persist: its data survives kill -9. */
    void (*start)(server *s, const char *dir, int persist);
    /* Kill -9 one node, and start it again on its data. */
    void (*kill)(server *s, int node);
    void (*restart)(server *s, int node);
    void (*stop)(server *s);
    /* The workers' URL for the nodes (or their proxies) on these loopback
     * ports, one a node. */
    void (*url)(char *buf, size_t size, const int *port);
    /* How long, beyond its lease, a dead holder's lock may stay taken on
     * this backend, waiters' wake-up included (the unavailability bound). */
    int64_t detect_ms;
    /* 1: the lock belongs to a server session (PostgreSQL's advisory mode,
     * MySQL's named mode), which the server ends with its connection, at
     * once, whatever the lease; the holder hears of it at its next
     * renewal. A connection the network closes (proxy-drop) then lets the
     * next holder in while the holder still believes: a documented limit
     * of session locks (docs/postgres.md, docs/mysql.md), shown ok*. */
    int session_bound;
    /* An ensemble (etcd3, zk3): the member that leads now (waits for an
     * election to end), for leader-kill; NULL where there is no leader (a
     * single server, Redlock's independent nodes). */
    int (*leader)(server *s);
    /* How long, after its leader dies, the ensemble may take to elect
     * another and serve the clients again (leader-kill's unavailability
     * bound adds it to detect_ms). */
    int64_t elect_ms;
} backend;

/* The ACL file in dir, and redis-server's arguments for it. */
static void redis_args(char *extra, size_t size, const char *dir, int persist)
{
    char acl[200];
    FILE *f;

    snprintf(acl, sizeof(acl), "%s/users.acl", dir);
    f = fopen(acl, "w");
    if (f == NULL || fputs(chaos_acl, f) < 0 ||
        fputs(opt_rw || opt_sem || opt_fair ? chaos_acl_family : "", f) < 0 ||
        fputs("\n", f) < 0 || fclose(f) != 0) {
        perror("chaos: users.acl");
        exit(1);
    }
    /* appendfsync always: a reply is sent only once its write is on disk. */
    snprintf(extra, size, "--aclfile %s%s", acl,
             persist ? " --appendonly yes --appendfsync always" : "");
}

static void redis_start(server *s, const char *dir, int persist)
{
    char extra[256];

    redis_args(extra, sizeof(extra), dir, persist);
    test_redis_start(&s->r[0], extra);
    s->port[0] = s->r[0].port;
}

static void redis_kill(server *s, int node)
{
    test_redis_kill(&s->r[node]);
}

static void redis_restart(server *s, int node)
{
    test_redis_restart(&s->r[node]);
}

static void redis_stop(server *s)
{
    test_redis_stop(&s->r[0]);
}

static void redis_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "redis://chaos:chaos-pw@127.0.0.1:%d", port[0]);
}

/* Redlock: 5 independent redis-servers; persist: each with its fence
 * marks on disk (appendfsync always, as docs/redlock.md requires). */
#define REDLOCK_NODES 5

static void redlock_start(server *s, const char *dir, int persist)
{
    char extra[256];

    redis_args(extra, sizeof(extra), dir, persist);
    for (int i = 0; i < REDLOCK_NODES; i++) {
        test_redis_start(&s->r[i], extra);
        s->port[i] = s->r[i].port;
    }
}

static void redlock_stop(server *s)
{
    for (int i = 0; i < REDLOCK_NODES; i++)
        test_redis_stop(&s->r[i]);
}

static void redlock_url(char *buf, size_t size, const int *port)
{
    size_t len = (size_t)snprintf(buf, size, "redlock://chaos:chaos-pw@");

    for (int i = 0; i < REDLOCK_NODES; i++)
        len += (size_t)snprintf(buf + len, len < size ? size - len : 0, "%s127.0.0.1:%d",
                                i > 0 ? "," : "", port[i]);
}

/* etcd: one member; its WAL is always on disk, so there is no
 * no-persistence variant. */
static void etcd_start(server *s, const char *dir, int persist)
{
    (void)dir;
    (void)persist;
    test_etcd_start(&s->e, 1, NULL);
    s->port[0] = s->e.client_port[0];
}

static void etcd_kill(server *s, int node)
{
    test_etcd_kill(&s->e, node);
}

static void etcd_restart(server *s, int node)
{
    test_etcd_restart(&s->e, node);
}

static void etcd_stop(server *s)
{
    test_etcd_stop(&s->e);
}

static void etcd_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "etcd://127.0.0.1:%d", port[0]);
}

/* etcd3: a cluster of 3 members (elections after 500 ms without a
 * heartbeat: tests/support), the workers' URL naming every member; the
 * client fails over between them (docs/etcd.md, "Endpoints and failover"). */
#define ENSEMBLE_MEMBERS 3

static void etcd3_start(server *s, const char *dir, int persist)
{
    (void)dir;
    (void)persist;
    test_etcd_start(&s->e, ENSEMBLE_MEMBERS, NULL);
    for (int i = 0; i < ENSEMBLE_MEMBERS; i++)
        s->port[i] = s->e.client_port[i];
}

static void etcd3_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "etcd://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d", port[0], port[1],
             port[2]);
}

/* The member whose /v3/maintenance/status says it leads. */
static int etcd3_leader(server *s)
{
    return test_etcd_leader(&s->e);
}

/* ZooKeeper: one standalone server; its transaction log is written before
 * it answers (without fsync in the tests, but kill -9 of the JVM keeps what
 * the kernel has), so there is no no-persistence variant. */
static void zk_start(server *s, const char *dir, int persist)
{
    (void)dir;
    (void)persist;
    test_zk_start(&s->z, 1, NULL);
    s->port[0] = s->z.client_port[0];
}

static void zk_kill(server *s, int node)
{
    test_zk_kill(&s->z, node);
}

static void zk_restart(server *s, int node)
{
    test_zk_restart(&s->z, node);
}

static void zk_stop(server *s)
{
    test_zk_stop(&s->z);
}

/* A short session (1.5 s, above the 1 s lease): a paused or killed holder's
 * node goes soon after its lease, as on the other backends. */
static void zk_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "zk://127.0.0.1:%d?session_timeout_ms=1500", port[0]);
}

/* zk3: an ensemble of 3 QuorumPeerMain members, the same session, the
 * workers' URL naming every member (the C client moves to another when its
 * member goes). */
static void zk3_start(server *s, const char *dir, int persist)
{
    (void)dir;
    (void)persist;
    test_zk_start(&s->z, ENSEMBLE_MEMBERS, NULL);
    for (int i = 0; i < ENSEMBLE_MEMBERS; i++)
        s->port[i] = s->z.client_port[i];
}

static void zk3_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "zk://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d?session_timeout_ms=1500",
             port[0], port[1], port[2]);
}

/* The member whose srvr four-letter word says "Mode: leader". */
static int zk3_leader(server *s)
{
    return test_zk_leader(&s->z);
}

/* PostgreSQL: one private server (tests/support/test_pg.c), lease-table
 * mode or advisory mode (mode=advisory: a session lock, which the server
 * ends with the session). Its WAL is on disk: the kill is PostgreSQL's
 * immediate shutdown (SIGQUIT to the postmaster: every backend goes at
 * once, no checkpoint, crash recovery at the next start), as with a crash. */
#ifdef DLOCK_TEST_POSTGRES
static void pg_start(server *s, const char *dir, int persist)
{
    (void)dir;
    (void)persist;
    test_pg_start(&s->pg);
    s->port[0] = s->pg.port;
}

static void pg_kill(server *s, int node)
{
    (void)node;
    if (s->pg.pid > 0) {
        kill(s->pg.pid, SIGCONT);
        kill(s->pg.pid, SIGQUIT);
        waitpid(s->pg.pid, NULL, 0);
        s->pg.pid = 0;
    }
}

static void pg_restart(server *s, int node)
{
    (void)node;
    test_pg_restart(&s->pg); /* the postmaster is down: only starts it */
}

static void pg_stop(server *s)
{
    test_pg_stop(&s->pg);
}

static void pg_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "postgres://dlock@127.0.0.1:%d/postgres", port[0]);
}

static void pg_advisory_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "postgres://dlock@127.0.0.1:%d/postgres?mode=advisory", port[0]);
}
#endif

/* MySQL/MariaDB: one private mariadbd (tests/support/test_mysql.c), killed
 * with -9 and started on its data; lease-table mode, or named mode
 * (mode=named: GET_LOCK, held by a connection of its own). */
static void mysql_start(server *s, const char *dir, int persist)
{
    (void)dir;
    (void)persist;
    test_mariadb_start(&s->m);
    s->port[0] = s->m.port;
}

static void mysql_kill(server *s, int node)
{
    (void)node;
    test_mariadb_kill(&s->m);
}

static void mysql_restart(server *s, int node)
{
    (void)node;
    test_mariadb_restart(&s->m);
}

static void mysql_stop(server *s)
{
    test_mariadb_stop(&s->m);
}

static void mysql_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test", port[0]);
}

static void mysql_named_url(char *buf, size_t size, const int *port)
{
    snprintf(buf, size, "mysql://dlock:dlockpw@127.0.0.1:%d/dlock_test?mode=named", port[0]);
}

/* detect_ms: Redis and Redlock expire a key on its TTL, and a waiter that
 * heard no release retries within a lease; etcd's lease is whole seconds,
 * expired by the leader's check every 500 ms; ZooKeeper deletes a dead
 * holder's node when its session (1.5 s) ends, checked every tick
 * (250 ms). elect_ms (the last field, ensembles only): 3 s, twice the
 * longest election seen on loaded cores (1.6 s from the kill). etcd elects
 * after 500 ms without a heartbeat, and its new leader gives every lease
 * its TTL again + that 500 ms, so the key of a holder whose release could
 * not get through stays up to 1.5 s past the election (a 60-kill run came
 * to 4.7 leases, over the 5 of a 2 s elect_ms); a ZooKeeper follower sees
 * its leader's connection close at once, elects (200 ms of notifications
 * at least) and syncs, and the new leader gives every session its whole
 * timeout again. */
static const backend backends[] = {
    {"redis", 400, 1, 1, redis_start, redis_kill, redis_restart, redis_stop, redis_url, 400, 0,
     NULL, 0},
    /* etcd leases are whole seconds. */
    {"etcd", 1000, 0, 1, etcd_start, etcd_kill, etcd_restart, etcd_stop, etcd_url, 1000, 0, NULL,
     0},
    {"etcd3", 1000, 0, ENSEMBLE_MEMBERS, etcd3_start, etcd_kill, etcd_restart, etcd_stop,
     etcd3_url, 1000, 0, etcd3_leader, 3000},
    /* A node must answer within lease / 10 (the node timeout): at 400 ms
     * that is 40 ms, which an fsync on a loaded disk can exceed. */
    {"redlock", 1000, 1, REDLOCK_NODES, redlock_start, redis_kill, redis_restart, redlock_stop,
     redlock_url, 1000, 0, NULL, 0},
    /* A lease must fit in the session (docs/zookeeper.md): 1 s in 1.5 s. */
    {"zk", 1000, 0, 1, zk_start, zk_kill, zk_restart, zk_stop, zk_url, 1500, 0, NULL, 0},
    {"zk3", 1000, 0, ENSEMBLE_MEMBERS, zk3_start, zk_kill, zk_restart, zk_stop, zk3_url, 1500, 0,
     zk3_leader, 3000},
    /* SQL: a statement's round trip and a commit's fsync are slower than
     * Redis'; a waiter polls (detection: a lease). */
#ifdef DLOCK_TEST_POSTGRES
    {"postgres", 1000, 0, 1, pg_start, pg_kill, pg_restart, pg_stop, pg_url, 1000, 0, NULL, 0},
    {"postgres-advisory", 1000, 0, 1, pg_start, pg_kill, pg_restart, pg_stop, pg_advisory_url,
     1000, 1, NULL, 0},
#endif
    {"mysql", 1000, 0, 1, mysql_start, mysql_kill, mysql_restart, mysql_stop, mysql_url, 1000, 0,
     NULL, 0},
    {"mysql-named", 1000, 0, 1, mysql_start, mysql_kill, mysql_restart, mysql_stop,
     mysql_named_url, 1000, 1, NULL, 0},
};
#define NBACKENDS (sizeof(backends) / sizeof(backends[0]))

/* ---- nemeses ------------------------------------------------------------ */

enum {
    N_NONE,
    N_PAUSE,
    N_KILL,
    N_SERVER_PERSIST,
    N_SERVER_VOLATILE,
    N_DELAY,
    N_DROP,
    N_BLACKHOLE,
    N_CLOCK,
    N_WAITER,
    N_SESSION,
    N_MIXED,
    N_LEADER_KILL, /* after mixed: the older rows keep their seeds */
    N_COUNT
};

static const struct {
    const char *name;
    int needs_server;
    int needs_proxy;
    const char *what;
} nemeses[N_COUNT] = {
    [N_NONE] = {"none", 0, 0, "no faults"},
    [N_PAUSE] = {"pause", 0, 0, "SIGSTOP a holder for 1.5-3 leases, then SIGCONT"},
    [N_KILL] = {"kill-holder", 0, 0, "SIGKILL a holder, start a new worker"},
    [N_SERVER_PERSIST] = {"server-kill", 1, 0, "kill -9 the server (Redlock: one node), restart "
                                               "it (data on disk; Redis: AOF, fsync always)"},
    [N_SERVER_VOLATILE] = {"server-kill-volatile", 1, 0, "kill -9 the server (Redlock: one "
                                                         "node), restart it empty (Redis "
                                                         "without persistence)"},
    /* Redlock: each node has its proxy, and a fault hits a minority. */
    [N_DELAY] = {"proxy-delay", 0, 1, "proxy delays each chunk 20-120 ms each way"},
    [N_DROP] = {"proxy-drop", 0, 1, "proxy closes every connection"},
    [N_BLACKHOLE] = {"proxy-blackhole", 0, 1, "proxy forwards nothing for 0.5-2.5 leases"},
    [N_CLOCK] = {"clock-jump", 0, 0, "libfaketime: workers' wall clock jumps +-hours/days"},
    [N_WAITER] = {"waiter", 0, 0, "SIGKILL (then a new worker) or SIGSTOP for 1.5-3 leases a "
                                  "worker waiting for the lock, most often not the first in line"},
    [N_SESSION] = {"session-expiry", 0, 1, "proxy forwards nothing for the backend's detection "
                                           "time + 1-2 leases (ZooKeeper: past the session)"},
    [N_MIXED] = {"mixed", 1, 1, "a random one of pause, kill-holder, server-kill, "
                                "proxy-*, waiter (etcd3, zk3: leader-kill too), each step"},
    [N_LEADER_KILL] = {"leader-kill", 1, 0, "kill -9 the member that leads (etcd3, zk3 only), "
                                            "restart it on its data 1-3 leases later"},
};

/* ---- one run ------------------------------------------------------------ */

typedef struct {
    char dir[96];
    char store[160];
    char state[160];
    char runner_log[160];
    char faketime_file[160];
    char url[256];
    const backend *be;
    server srv;
    int have_server;
    chaos_proxy *proxy[CHAOS_NODES_MAX]; /* one a node, for the proxy nemeses */
    chaos_slot *slots;
    pid_t pids[CHAOS_MAX_WORKERS];
    int next_id;
    int64_t until_us;
    int runner_fd;
    int faketime;
    double real_skew; /* the runner's wall clock minus chaos_now_us, in s */
    unsigned seed;
    int crashed; /* workers that exited non-zero or died of a signal we did not send */
    int hung;    /* workers still running long after the end */
    int faults;  /* faults injected */
    int stopped_slot; /* slot of a worker we froze, -1 */
    int64_t max_elect_ms; /* leader-kill: the longest election */
    int broken;       /* CHAOS_OK, or the broken worker of a self-test row */
} run_ctx;

/* An event of the runner at time t (chaos_now_us). */
static void runner_event_at(run_ctx *c, int64_t t, const char *kind, long long a, long long b)
{
    char line[CHAOS_HISTORY_LINE];
    int n = snprintf(line, sizeof(line), "%lld -1 %s %lld %lld 0\n", (long long)t, kind, a, b);

    if (write(c->runner_fd, line, (size_t)n) != n) {
        perror("chaos: runner history");
        exit(1);
    }
}

static void runner_event(run_ctx *c, const char *kind, long long a, long long b)
{
    runner_event_at(c, chaos_now_us(), kind, a, b);
}

/*
 * Signal sig to the worker in slot, and log it as kind, timed before the
 * signal is sent: a stop or kill ends the worker's belief, and timed after,
 * a runner descheduled between the two (a loaded CI machine) made the next
 * holder of a session-bound lock (released the moment the killed process's
 * connection closes) look as if it began while the victim still held.
 */
static void signal_event(run_ctx *c, int slot, int sig, const char *kind, long long a,
                         long long b)
{
    int64_t t = chaos_now_us();

    kill(c->pids[slot], sig);
    runner_event_at(c, t, kind, a, b);
}

static unsigned rnd(run_ctx *c, unsigned n)
{
    return n == 0 ? 0 : (unsigned)rand_r(&c->seed) % n;
}

static void sleep_until_or(run_ctx *c, int64_t ms)
{
    int64_t end = chaos_now_us() + ms * 1000;

    if (end > c->until_us)
        end = c->until_us;
    while (chaos_now_us() < end)
        test_sleep_ms(5);
}

static void spawn_worker(run_ctx *c, int slot)
{
    char history[192], slot_s[16], id_s[16], lease_s[32], until_s[32], seed_s[32];
    int id = c->next_id++;
    pid_t pid;

    snprintf(history, sizeof(history), "%s/worker-%d.log", c->dir, id);
    snprintf(slot_s, sizeof(slot_s), "%d", slot);
    snprintf(id_s, sizeof(id_s), "%d", id);
    snprintf(lease_s, sizeof(lease_s), "%lld", (long long)lease_ms);
    snprintf(until_s, sizeof(until_s), "%lld", (long long)c->until_us);
    snprintf(seed_s, sizeof(seed_s), "%u", c->seed + (unsigned)id * 7919u);
    pid = fork();
    if (pid < 0) {
        perror("chaos: fork");
        exit(1);
    }
    if (pid == 0) {
        if (c->faketime) {
            const char *asan = getenv("ASAN_OPTIONS");
            char buf[512];
            /* Only the wall clock moves, as with an NTP step: a real clock
             * jump never moves CLOCK_MONOTONIC. */
            setenv("LD_PRELOAD", test_faketime_lib(), 1);
            setenv("FAKETIME_TIMESTAMP_FILE", c->faketime_file, 1);
            /* Every clock read reads the file: with a cache of 1 s the
             * workers saw a jump up to 2 s late, and a 4 s run on a loaded
             * CI machine saw none at all. */
            setenv("FAKETIME_NO_CACHE", "1", 1);
            setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1);
            /* libfaketime 0.9.10 turns its "monotonic fix" on by itself on
             * recent glibc, and then every pthread_cond_timedwait on a
             * CLOCK_MONOTONIC condition returns at once: a bug of the
             * preload library (a real clock step does no such thing) that
             * makes the watchdog spin. Off. */
            setenv("FAKETIME_FORCE_MONOTONIC_FIX", "0", 1);
            snprintf(buf, sizeof(buf), "%s%sverify_asan_link_order=0", asan ? asan : "",
                     asan ? ":" : "");
            setenv("ASAN_OPTIONS", buf, 1);
        }
        execl(worker_path, "chaos_worker", c->url, "chaos", c->store, history, c->state, slot_s,
              id_s, lease_s, until_s, seed_s, chaos_broken_names[c->broken], (char *)NULL);
        fprintf(stderr, "chaos: cannot run %s: %s\n", worker_path, strerror(errno));
        _exit(127);
    }
    c->pids[slot] = pid;
    atomic_store(&c->slots[slot].pid, (int)pid);
    atomic_store(&c->slots[slot].id, id);
}

/* Reap workers that ended; a worker that failed counts as a crash. */
static void reap(run_ctx *c, int block_until_ms)
{
    int64_t end = chaos_now_us() + (int64_t)block_until_ms * 1000;

    for (;;) {
        int alive = 0;
        for (int i = 0; i < opt_workers; i++) {
            int status;
            if (c->pids[i] <= 0)
                continue;
            if (waitpid(c->pids[i], &status, WNOHANG) == c->pids[i]) {
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                    fprintf(stderr, "chaos: worker in slot %d (pid %d) failed: status %d\n", i,
                            (int)c->pids[i], status);
                    c->crashed++;
                }
                c->pids[i] = 0;
            } else {
                alive++;
            }
        }
        if (alive == 0 || chaos_now_us() >= end)
            return;
        test_sleep_ms(10);
    }
}

/* A slot whose worker holds the lock, preferring one between its store
 * transactions; -1 if none within wait_ms. */
static int pick_holder(run_ctx *c, int64_t wait_ms)
{
    int64_t start = chaos_now_us();

    while (chaos_now_us() - start < wait_ms * 1000 && chaos_now_us() < c->until_us) {
        int strict = chaos_now_us() - start < wait_ms * 1000 / 2;
        int first = (int)rnd(c, (unsigned)opt_workers);
        for (int k = 0; k < opt_workers; k++) {
            int i = (first + k) % opt_workers;
            int ph = atomic_load(&c->slots[i].phase);
            if (c->pids[i] <= 0 || i == c->stopped_slot)
                continue;
            if (ph == PHASE_THINKING || (!strict && (ph == PHASE_IN_STORE ||
                                                     ph == PHASE_RELEASING)))
                return i;
        }
        usleep(200);
    }
    return -1;
}

/* SIGSTOP the worker in slot for ms, then SIGCONT: one fault. fence: what
 * it held (0 for a waiter), for the history. */
static void stop_for(run_ctx *c, int slot, int64_t ms, long long fence)
{
    int id = atomic_load(&c->slots[slot].id);

    signal_event(c, slot, SIGSTOP, "stop", id, fence);
    c->stopped_slot = slot;
    c->faults++;
    test_sleep_ms((long)ms);
    kill(c->pids[slot], SIGCONT);
    c->stopped_slot = -1;
    runner_event(c, "cont", id, 0);
}

/* SIGKILL the worker in slot and start a new one there: one fault. */
static void kill_slot(run_ctx *c, int slot, long long fence)
{
    int id = atomic_load(&c->slots[slot].id);

    signal_event(c, slot, SIGKILL, "kill", id, fence);
    waitpid(c->pids[slot], NULL, 0);
    c->pids[slot] = 0;
    c->faults++;
    atomic_store(&c->slots[slot].phase, PHASE_IDLE);
    spawn_worker(c, slot);
}

static void do_pause(run_ctx *c)
{
    int64_t pause_ms = lease_ms * 3 / 2 + rnd(c, (unsigned)(lease_ms * 3 / 2));
    int64_t left_ms = (c->until_us - chaos_now_us()) / 1000;
    int slot;

    /* A holder that resumes after the others have left tests nothing: the
     * pause ends a lease before the run does, shortened to fit (never below
     * 1.5 leases), so that a short run in CI still pauses someone. */
    if (pause_ms > left_ms - lease_ms)
        pause_ms = left_ms - lease_ms;
    if (pause_ms < lease_ms * 3 / 2)
        return;
    if ((slot = pick_holder(c, 400)) < 0)
        return;
    stop_for(c, slot, pause_ms, (long long)atomic_load(&c->slots[slot].fence));
}

static void do_kill(run_ctx *c)
{
    int slot = pick_holder(c, 400);

    if (slot >= 0)
        kill_slot(c, slot, (long long)atomic_load(&c->slots[slot].fence));
}

/* The nodes a proxy fault hits, as a bit mask: the server, or for a lock
 * over several nodes 1 to (nodes - 1) / 2 of them, a minority: a majority
 * cut off is an outage, which the backend reports, not a fault it is
 * meant to ride out. */
static unsigned pick_minority(run_ctx *c)
{
    int nodes = c->be->nodes, k, n = 0;
    unsigned mask = 0;

    if (nodes == 1)
        return 1;
    k = 1 + (int)rnd(c, (unsigned)(nodes - 1) / 2);
    while (n < k) {
        unsigned bit = 1u << rnd(c, (unsigned)nodes);
        n += (mask & bit) == 0;
        mask |= bit;
    }
    return mask;
}

/* Set the proxies of the nodes in mask to mode, and log it (the last field
 * of the line is the mask). */
static void proxy_set(run_ctx *c, unsigned mask, int mode, int delay_ms)
{
    char line[CHAOS_HISTORY_LINE];
    int n;

    for (int i = 0; i < c->be->nodes; i++)
        if (mask & (1u << i))
            chaos_proxy_set(c->proxy[i], mode, delay_ms);
    n = snprintf(line, sizeof(line), "%lld -1 proxy %d %d %u\n", (long long)chaos_now_us(), mode,
                 delay_ms, mask);
    if (write(c->runner_fd, line, (size_t)n) != n) {
        perror("chaos: runner history");
        exit(1);
    }
}

/*
 * Kill -9 one node (the server, unless the backend spans several) and
 * restart it (on its data, unless server-kill-volatile).
 *
 * Over several nodes, every other step is Kleppmann's case against
 * Redlock: a minority of the other nodes is cut off first, so that a
 * holder takes the lock and records its fence on a majority that includes
 * the node about to die; the holder is paused (a GC pause), the node
 * killed and restarted, and the minority let back in at once: the next
 * majority (the restarted node and the minority) meets the paused holder's
 * only in the node that restarted. If that node forgot the key and the
 * fence mark, the next holder gets the lock within the paused one's lease
 * and a fence that is not above its fence; if it kept them, neither.
 */
static void do_server_kill(run_ctx *c)
{
    int64_t down_ms = 100 + rnd(c, (unsigned)(lease_ms * 2));
    int nodes = c->be->nodes, node = (int)rnd(c, (unsigned)nodes), slot = -1, id = 0;
    unsigned cut = 0;

    if (nodes > 1 && rnd(c, 2)) {
        while (__builtin_popcount(cut) < (nodes - 1) / 2)
            cut |= (1u << rnd(c, (unsigned)nodes)) & ~(1u << node);
        proxy_set(c, cut, CHAOS_PROXY_BLACKHOLE, 0);
        /* A hold taken while the minority is cut off. */
        sleep_until_or(c, lease_ms / 2);
        if ((slot = pick_holder(c, lease_ms)) >= 0) {
            id = atomic_load(&c->slots[slot].id);
            signal_event(c, slot, SIGSTOP, "stop", id,
                         (long long)atomic_load(&c->slots[slot].fence));
            c->stopped_slot = slot;
        }
        down_ms = 50;
    }
    c->be->kill(&c->srv, node);
    runner_event(c, "server_kill", node, cut);
    c->faults++;
    test_sleep_ms((long)down_ms);
    c->be->restart(&c->srv, node);
    runner_event(c, "server_up", node, cut);
    if (cut != 0)
        proxy_set(c, cut, CHAOS_PROXY_PASS, 0);
    if (slot >= 0) {
        test_sleep_ms((long)lease_ms * 3 / 2);
        kill(c->pids[slot], SIGCONT);
        c->stopped_slot = -1;
        runner_event(c, "cont", id, 0);
    }
}

/*
 * Kill -9 the member that leads the ensemble now, and start it again on its
 * data 1-3 leases later: the other two elect a leader meanwhile, and the
 * clients on the dead member move to another. One fault; how long the
 * election took (from the kill to a member that says it leads) goes into
 * the history and the row.
 */
static void do_leader_kill(run_ctx *c)
{
    int64_t down_ms = lease_ms + rnd(c, (unsigned)(lease_ms * 2)), killed_at, elect_ms;
    int node = c->be->leader(&c->srv), next;

    c->be->kill(&c->srv, node);
    killed_at = chaos_now_us();
    runner_event(c, "leader_kill", node, 0);
    c->faults++;
    next = c->be->leader(&c->srv); /* waits for the election */
    elect_ms = (chaos_now_us() - killed_at) / 1000;
    runner_event(c, "elected", next, elect_ms);
    if (elect_ms > c->max_elect_ms)
        c->max_elect_ms = elect_ms;
    if (next == node) { /* the dead member cannot lead: a helper's mistake */
        fprintf(stderr, "chaos: member %d leads after it was killed\n", node);
        exit(1);
    }
    sleep_until_or(c, down_ms - elect_ms);
    c->be->restart(&c->srv, node);
    runner_event(c, "server_up", node, 0);
}

static void do_delay(run_ctx *c)
{
    static const int delays[] = {20, 60, 120};
    int d = delays[rnd(c, 3)];
    unsigned mask = pick_minority(c);

    proxy_set(c, mask, CHAOS_PROXY_DELAY, d);
    c->faults++;
    sleep_until_or(c, 600 + rnd(c, 600));
    proxy_set(c, mask, CHAOS_PROXY_PASS, 0);
}

static void do_drop(run_ctx *c)
{
    unsigned mask = pick_minority(c);
    int n = 0;

    for (int i = 0; i < c->be->nodes; i++)
        if (mask & (1u << i))
            n += chaos_proxy_drop(c->proxy[i]);
    runner_event(c, "proxy_drop", n, mask);
    if (n > 0) /* a fault only if some connection was really closed */
        c->faults++;
}

static void do_blackhole(run_ctx *c)
{
    int64_t ms = lease_ms / 2 + rnd(c, (unsigned)(lease_ms * 2));
    unsigned mask = pick_minority(c);

    proxy_set(c, mask, CHAOS_PROXY_BLACKHOLE, 0);
    c->faults++;
    test_sleep_ms((long)ms);
    proxy_set(c, mask, CHAOS_PROXY_PASS, 0);
}

/* A waiter: a worker inside dlock_acquire that is not the holder. With 8
 * workers there are several; which one is first in line the runner cannot
 * see, so most picks are in the middle of the queue, and the lock's next
 * grant passes over them (killed: their queue entry goes with their lease
 * or session; stopped: they hold up the line until they are). */
static void do_waiter(run_ctx *c)
{
    int64_t start = chaos_now_us(), pause_ms = lease_ms * 3 / 2 + rnd(c, (unsigned)(lease_ms * 3 / 2));
    int slot = -1, first;

    while (slot < 0 && chaos_now_us() - start < 400000 && chaos_now_us() < c->until_us) {
        first = (int)rnd(c, (unsigned)opt_workers);
        for (int k = 0; k < opt_workers && slot < 0; k++) {
            int i = (first + k) % opt_workers;
            if (c->pids[i] > 0 && i != c->stopped_slot &&
                atomic_load(&c->slots[i].phase) == PHASE_ACQUIRING)
                slot = i;
        }
        if (slot < 0)
            usleep(500);
    }
    if (slot < 0)
        return;
    /* A stall must end a lease before the run does. */
    if (rnd(c, 2) == 0 && (c->until_us - chaos_now_us()) / 1000 > pause_ms + lease_ms)
        stop_for(c, slot, pause_ms, 0);
    else
        kill_slot(c, slot, 0);
}

/* Cut every client off for longer than the backend takes to end a silent
 * holder (ZooKeeper: its session), with the clients running: the server
 * ends their sessions and leases while they cannot hear it, and they must
 * see it when they come back. */
static void do_session(run_ctx *c)
{
    int64_t ms = c->be->detect_ms + lease_ms + rnd(c, (unsigned)lease_ms);
    unsigned mask = pick_minority(c);

    /* Longer than a short run has left, often: the clients come back
     * after its end, and finish their step then. */
    proxy_set(c, mask, CHAOS_PROXY_BLACKHOLE, 0);
    c->faults++;
    test_sleep_ms((long)ms);
    proxy_set(c, mask, CHAOS_PROXY_PASS, 0);
}

static void do_clock(run_ctx *c)
{
    /* Never 0: every step must move the workers' wall clock. */
    static const long offsets[] = {3600, -3600, 86400, -3 * 86400, 7 * 86400, -86400};
    long off = offsets[rnd(c, sizeof(offsets) / sizeof(offsets[0]))];
    char tmp[200];
    FILE *f;

    snprintf(tmp, sizeof(tmp), "%s.tmp", c->faketime_file);
    f = fopen(tmp, "w");
    if (f == NULL || fprintf(f, "%+lds\n", off) < 0 || fclose(f) != 0 ||
        rename(tmp, c->faketime_file) != 0) {
        perror("chaos: faketime file");
        exit(1);
    }
    runner_event(c, "clock", off, 0);
    c->faults++;
}

static void nemesis_step(run_ctx *c, int n)
{
    switch (n) {
    case N_NONE:
        sleep_until_or(c, 1000);
        break;
    case N_PAUSE:
        sleep_until_or(c, lease_ms / 2 + rnd(c, (unsigned)lease_ms));
        do_pause(c);
        break;
    case N_KILL:
        sleep_until_or(c, lease_ms / 2 + rnd(c, (unsigned)lease_ms));
        do_kill(c);
        break;
    case N_SERVER_PERSIST:
    case N_SERVER_VOLATILE:
        sleep_until_or(c, lease_ms + rnd(c, (unsigned)lease_ms * 2));
        if (chaos_now_us() < c->until_us - lease_ms * 1000)
            do_server_kill(c);
        break;
    case N_DELAY:
        sleep_until_or(c, 300 + rnd(c, 500));
        do_delay(c);
        break;
    case N_DROP:
        sleep_until_or(c, 150 + rnd(c, 500));
        do_drop(c);
        break;
    case N_BLACKHOLE:
        sleep_until_or(c, lease_ms + rnd(c, (unsigned)lease_ms));
        do_blackhole(c);
        break;
    case N_CLOCK:
        /* The first jump only once the workers (slow to start under ASan
         * with libfaketime preloaded) have logged their unjumped clock. */
        sleep_until_or(c, (c->faults == 0 ? 1200 : 400) + rnd(c, 600));
        do_clock(c);
        break;
    case N_WAITER:
        sleep_until_or(c, lease_ms / 2 + rnd(c, (unsigned)lease_ms));
        do_waiter(c);
        break;
    case N_SESSION:
        /* The first cut only once the workers have held the lock (slow to
         * start on a loaded machine): a cut before any hold tests nothing. */
        sleep_until_or(c, (c->faults == 0 ? 1000 : 0) + lease_ms + rnd(c, (unsigned)lease_ms));
        do_session(c);
        break;
    case N_MIXED: {
        /* leader-kill last: picked only on an ensemble (the other backends
         * draw as before). */
        static const int pick[] = {N_PAUSE, N_KILL,   N_SERVER_PERSIST, N_DELAY,
                                   N_DROP,  N_BLACKHOLE, N_WAITER,      N_LEADER_KILL};
        unsigned npick = sizeof(pick) / sizeof(pick[0]) - (c->be->leader == NULL);
        nemesis_step(c, pick[rnd(c, npick)]);
        break;
    }
    case N_LEADER_KILL:
        sleep_until_or(c, lease_ms + rnd(c, (unsigned)lease_ms * 2));
        if (chaos_now_us() < c->until_us - lease_ms * 1000)
            do_leader_kill(c);
        break;
    }
}

/* ---- the checker --------------------------------------------------------- */

typedef struct {
    int64_t t;
    int worker;
    char kind[16];
    long long a, b, c;
} event;

typedef struct {
    int worker;
    uint64_t fence;
    int64_t t_start, t_ok, t_end;
    int64_t valid_end; /* when it stopped being a valid hold: end, pause, kill, on_lost */
    int ended;         /* rel_start seen */
    int killed;
    int lost;          /* on_lost fired */
    int rel_rc;
    int has_rel_rc;
    int shared; /* 1 a read lock's (--kind rw), 2 a permit's (--kind sem): may
                 * overlap other shared holds */
    int reentry; /* a read of the worker's owner id that re-entered the tenure
                  * of its own earlier read, whose release failed */
    int has_on_lost;  /* the handle has an on_lost (acq_ok b) */
    int waited;       /* the holder saw its loss and waited for on_lost (wait_lost) */
    int wait_told;    /* ... and on_lost came */
    int rel_saw_lost; /* dlock_lock_lost() just before its release (rel_start c) */
} hold;

/* What a holder believed: from the moment it logged a `valid` event until
 * its deadline, cut short by its release, a stop, a kill or on_lost. */
typedef struct {
    int worker;
    uint64_t fence;
    int64_t start, end;
    int open;   /* not cut short yet */
    int shared; /* 1 a reader's: only readers' may overlap it; 2 a permit
                 * holder's: up to CHAOS_SEM_PERMITS - 1 others' may */
} belief;

typedef struct {
    int runs;
    long holds;
    long faults;
    long overlaps;
    long viol;  /* beliefs that began while another worker's was still on */
    long readers_together; /* --kind rw, sem: shared beliefs begun beside another's (allowed) */
    long reentries;        /* --kind rw: reads that re-entered their owner's unreleased read */
    long fence_viol;
    long lost_updates;
    long missed_on_lost;
    long told_by_release;
    long writes_acked; /* register writes the store accepted, by the workers' histories */
    long on_lost;
    long refused;
    long acq_fail;
    double max_unavail; /* in leases */
    double unavail_bound; /* in leases; 0: none for this nemesis */
    int64_t max_elect_ms; /* leader-kill: the longest election, kill to new leader */
    int conn_ends_lock; /* a session lock under a nemesis that closes connections */
    int crashed, hung, store_errors, no_effect, wall_jumps;
    int ran_nothing;
} row;

static int cmp_event(const void *x, const void *y)
{
    const event *a = x, *b = y;
    return a->t < b->t ? -1 : a->t > b->t;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* Indexes into sort_holds, by worker, fence, then index (start order). */
static const hold *sort_holds;

static int cmp_failed(const void *x, const void *y)
{
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    const hold *a = &sort_holds[i], *b = &sort_holds[j];
    if (a->worker != b->worker)
        return a->worker < b->worker ? -1 : 1;
    if (a->fence != b->fence)
        return a->fence < b->fence ? -1 : 1;
    return i < j ? -1 : i > j;
}

static int cmp_hold_ok(const void *x, const void *y)
{
    const hold *a = x, *b = y;
    return a->t_ok < b->t_ok ? -1 : a->t_ok > b->t_ok;
}

static int read_history(const char *dir, event **out, size_t *n)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t cap = 4096;

    *n = 0;
    *out = malloc(cap * sizeof(**out));
    if (d == NULL || *out == NULL)
        return -1;
    while ((e = readdir(d)) != NULL) {
        char path[512], line[256];
        FILE *f;
        if (strstr(e->d_name, ".log") == NULL)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if ((f = fopen(path, "r")) == NULL)
            continue;
        while (fgets(line, sizeof(line), f) != NULL) {
            event ev;
            long long t;
            if (sscanf(line, "%lld %d %15s %lld %lld %lld", &t, &ev.worker, ev.kind, &ev.a,
                       &ev.b, &ev.c) != 6)
                continue; /* a line cut by SIGKILL */
            ev.t = t;
            if (*n == cap) {
                cap *= 2;
                *out = realloc(*out, cap * sizeof(**out));
                if (*out == NULL)
                    exit(1);
            }
            (*out)[(*n)++] = ev;
        }
        fclose(f);
    }
    closedir(d);
    qsort(*out, *n, sizeof(**out), cmp_event);
    return 0;
}

static hold *current_hold(hold *holds, size_t nholds, int worker, int open_only)
{
    for (size_t i = nholds; i-- > 0;)
        if (holds[i].worker == worker)
            return (!open_only || !holds[i].ended) ? &holds[i] : NULL;
    return NULL;
}

/* dlock_lock_valid_ms() counts whole milliseconds: a deadline it gives may
 * be up to 1 ms late. */
#define BELIEF_SLACK_US 1000

static int cmp_belief(const void *x, const void *y)
{
    const belief *a = x, *b = y;
    return a->start < b->start ? -1 : a->start > b->start;
}

/*
 * Mutual exclusion, judged by the holders' own beliefs: each `valid` event
 * says "I hold the lock until deadline". A belief ends at its deadline, or
 * earlier when its worker releases, is stopped or killed, or is told by
 * on_lost; a belief logged after any of those is a new one. A belief that
 * begins while another worker's is still on is a violation, whatever the
 * nemesis: a correct lease lock counts every lease from before the request
 * that set it was sent, so the server can let nobody else in before the
 * holder's deadline has passed.
 */
static void check_beliefs(const event *ev, size_t nev, row *r, const char *dir)
{
    belief *b = calloc(nev + 1, sizeof(*b));
    size_t nb = 0, shown = 0;

    if (b == NULL)
        exit(1);
    for (size_t i = 0; i < nev; i++) {
        const event *e = &ev[i];
        int who = -2;

        if (e->worker >= 0 && strcmp(e->kind, "valid") == 0) {
            b[nb].worker = e->worker;
            b[nb].fence = (uint64_t)e->a;
            b[nb].start = e->t;
            b[nb].end = e->b - BELIEF_SLACK_US > e->t ? e->b - BELIEF_SLACK_US : e->t;
            b[nb].open = 1;
            b[nb].shared = (int)e->c;
            nb++;
            continue;
        }
        if (e->worker >= 0 && (strcmp(e->kind, "rel_start") == 0 ||
                               strcmp(e->kind, "lost") == 0 || strcmp(e->kind, "exit") == 0))
            who = e->worker;
        else if (e->worker < 0 && (strcmp(e->kind, "stop") == 0 || strcmp(e->kind, "kill") == 0))
            who = (int)e->a;
        if (who == -2)
            continue;
        for (size_t k = nb; k-- > 0;) {
            if (b[k].worker != who || !b[k].open)
                continue;
            b[k].open = 0;
            if (e->t < b[k].end)
                b[k].end = e->t;
        }
    }
    qsort(b, nb, sizeof(*b), cmp_belief);
    for (size_t j = 0; j < nb; j++) {
        int beside[CHAOS_SEM_PERMITS], nbeside = 0;
        for (size_t i = 0; i < j; i++) {
            int64_t both_until = b[i].end < b[j].end ? b[i].end : b[j].end;
            int k = 0;
            if (b[i].worker == b[j].worker || both_until <= b[j].start)
                continue;
            /* Readers beside any readers; a permit holder beside at most
             * N - 1 other workers' (one worker's beliefs overlap each
             * other: workers are counted). */
            if (b[i].shared && b[i].shared == b[j].shared) {
                if (b[j].shared == 1) {
                    nbeside = 1;
                    continue;
                }
                while (k < nbeside && beside[k] != b[i].worker)
                    k++;
                if (k < nbeside)
                    continue;
                if (nbeside < CHAOS_SEM_PERMITS - 1) {
                    beside[nbeside++] = b[i].worker;
                    continue;
                }
            }
            r->viol++;
            if (shown++ < 5)
                fprintf(stderr, "chaos: %s: at %+.3f s worker %d (fence %llu) and worker %d "
                        "(fence %llu) both believed they held the lock, for %.1f ms\n",
                        dir, (double)(b[j].start - b[0].start) / 1e6, b[j].worker,
                        (unsigned long long)b[j].fence, b[i].worker,
                        (unsigned long long)b[i].fence, (double)(both_until - b[j].start) / 1e3);
            break;
        }
        r->readers_together += nbeside > 0;
    }
    free(b);
}

/*
 * Was the holder of h never told of a lease that lapsed? A lease lapsed
 * when a later holder overtook it, when the release answered DLOCK_ELOST,
 * or when the holder itself saw the loss (dlock_lock_lost, a refused store
 * step) and waited for on_lost. A handle with an on_lost must have had it
 * (a "lost" line) in each case, but one: the release's DLOCK_ELOST may be
 * its only word when the loss reached the handle after the holder's last
 * look (dlock_lock_lost() false at rel_start): the lease ran out in
 * between, or a renewal in flight, which the release waits for, found the
 * lock gone; a handle being released gets no callback. A handle without
 * on_lost is told by the release's DLOCK_ELOST. Killed holders tell nobody anything. forgets:
 * the server lost its data, and the lock with it (a release then finds the
 * key gone with no lapse the library could see; a fence counter that
 * restarted gets a holder refused by the store with its lease intact).
 */
static int missed(const hold *h, int overtaken, int forgets, row *r)
{
    int rel_lost = h->has_rel_rc && h->rel_rc == DLOCK_ELOST;

    if (h->killed || h->lost)
        return 0;
    if (h->has_on_lost && h->waited && !h->wait_told && !forgets) {
        r->missed_on_lost++; /* saw its loss; on_lost never came */
        return 1;
    }
    if (!overtaken && !rel_lost)
        return 0;
    if (rel_lost && (!h->has_on_lost || forgets || !h->rel_saw_lost)) {
        r->told_by_release++;
        return 0;
    }
    r->missed_on_lost++;
    return 1;
}

/* A session lock (backend.session_bound) under a nemesis that ends
 * sessions: the server ends the lock with its connection, closed by the
 * proxy or by the server's own crash (docs/postgres.md, "the window
 * between a session's end and the next keepalive"; docs/mysql.md). */
static int conn_ends_lock(const backend *be, int nemesis)
{
    return be->session_bound &&
           (nemesis == N_DROP || nemesis == N_MIXED || nemesis == N_SERVER_PERSIST);
}

static void check_run(run_ctx *c, row *r, int nemesis)
{
    event *ev;
    size_t nev, nholds = 0;
    hold *holds;
    int64_t run_start = INT64_MAX, run_end = 0;
    double wall_min = 1e18, wall_max = -1e18;
    chaos_store_report rep;
    char err[256];
    long acked = 0, hist_lost;

    if (read_history(c->dir, &ev, &nev) != 0) {
        fprintf(stderr, "chaos: cannot read the history in %s\n", c->dir);
        exit(1);
    }
    check_beliefs(ev, nev, r, c->dir);
    holds = calloc(nev + 1, sizeof(*holds));
    for (size_t i = 0; i < nev; i++) {
        event *e = &ev[i];
        hold *h;

        if (e->worker < 0) {
            if (strcmp(e->kind, "kill") == 0 &&
                (h = current_hold(holds, nholds, (int)e->a, 1)) != NULL) {
                h->t_end = e->t;
                h->ended = h->killed = 1;
                if (e->t < h->valid_end)
                    h->valid_end = e->t;
            } else if (strcmp(e->kind, "stop") == 0 &&
                       (h = current_hold(holds, nholds, (int)e->a, 1)) != NULL) {
                if (e->t < h->valid_end)
                    h->valid_end = e->t;
            }
            continue;
        }
        if (strcmp(e->kind, "acq_start") == 0) {
            h = &holds[nholds++];
            h->worker = e->worker;
            h->t_start = e->t;
            h->t_ok = -1;
            h->valid_end = INT64_MAX;
            h->ended = 1; /* not a hold until acq_ok */
        } else if (strcmp(e->kind, "acq_ok") == 0) {
            h = current_hold(holds, nholds, e->worker, 0);
            if (h == NULL || h->t_ok >= 0)
                continue;
            h->fence = (uint64_t)e->a;
            h->t_ok = e->t;
            h->ended = 0;
            h->shared = (int)e->c;
            h->has_on_lost = e->b != 0;
            if (e->t < run_start)
                run_start = e->t;
        } else if (strcmp(e->kind, "acq_fail") == 0) {
            r->acq_fail++;
        } else if (strcmp(e->kind, "read") == 0 || strcmp(e->kind, "write") == 0) {
            if (e->c == 1 && e->kind[0] == 'w')
                acked++;
            if (e->c == 0)
                r->refused++;
            else if (e->c < 0)
                r->store_errors++;
        } else if (strcmp(e->kind, "lost") == 0) {
            h = current_hold(holds, nholds, e->worker, 0);
            r->on_lost++;
            if (h != NULL && h->fence == (uint64_t)e->a) {
                h->lost = 1;
                if (e->t < h->valid_end)
                    h->valid_end = e->t;
            }
        } else if (strcmp(e->kind, "wait_lost") == 0) {
            h = current_hold(holds, nholds, e->worker, 1);
            if (h != NULL && h->t_ok >= 0) {
                h->waited = 1;
                h->wait_told = e->c != 0;
            }
        } else if (strcmp(e->kind, "rel_start") == 0) {
            h = current_hold(holds, nholds, e->worker, 1);
            if (h != NULL && h->t_ok >= 0) {
                h->t_end = e->t;
                h->ended = 1;
                h->rel_saw_lost = e->c != 0;
            }
        } else if (strcmp(e->kind, "rel_end") == 0) {
            h = current_hold(holds, nholds, e->worker, 0);
            if (h != NULL && h->fence == (uint64_t)e->a) {
                h->rel_rc = (int)e->b;
                h->has_rel_rc = 1;
            }
        } else if (strcmp(e->kind, "wall") == 0) {
            double skew = (double)e->a - (double)e->t / 1e6;
            if (skew < wall_min)
                wall_min = skew;
            if (skew > wall_max)
                wall_max = skew;
        }
        if (e->t > run_end)
            run_end = e->t;
    }
    /* Drop the acquisitions that never succeeded; close what a crash left open. */
    {
        size_t k = 0;
        for (size_t i = 0; i < nholds; i++) {
            if (holds[i].t_ok < 0)
                continue;
            if (!holds[i].ended)
                holds[i].t_end = run_end;
            if (holds[i].t_end < holds[i].valid_end)
                holds[i].valid_end = holds[i].t_end;
            holds[k++] = holds[i];
        }
        nholds = (size_t)k;
    }
    r->holds += (long)nholds;
    qsort(holds, nholds, sizeof(*holds), cmp_hold_ok);

    /* A reader's owner id is its worker's. When a read's release fails (the
     * server down, say), its reader key stays until its lease runs out, and
     * the worker's next read with that owner id nests into it, as a re-entry
     * of the owner's read tenure (docs/etcd.md, "Nested reads"), with that
     * tenure's fence. That is not a fence given twice: such a hold is left
     * out of the fence checks below, and counted. */
    {
        /* The reads whose release failed, by (worker, fence, start order):
         * a read re-enters when the first of its key started before it. */
        size_t nf = 0, *failed = malloc((nholds + 1) * sizeof(*failed));
        if (failed == NULL) {
            fprintf(stderr, "chaos: out of memory\n");
            exit(1);
        }
        for (size_t i = 0; i < nholds; i++)
            if (holds[i].shared == 1 && holds[i].has_rel_rc && holds[i].rel_rc != 0)
                failed[nf++] = i;
        sort_holds = holds;
        qsort(failed, nf, sizeof(*failed), cmp_failed);
        for (size_t i = 0; i < nholds && nf > 0; i++) {
            size_t lo = 0, hi = nf;
            if (holds[i].shared != 1)
                continue;
            while (lo < hi) { /* the first of (worker, fence) */
                size_t mid = lo + (hi - lo) / 2;
                const hold *m = &holds[failed[mid]];
                if (m->worker < holds[i].worker ||
                    (m->worker == holds[i].worker && m->fence < holds[i].fence))
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo < nf && holds[failed[lo]].worker == holds[i].worker &&
                holds[failed[lo]].fence == holds[i].fence && failed[lo] < i) {
                holds[i].reentry = 1;
                r->reentries++;
            }
        }
        free(failed);
    }

    /* Overlapping holds, and holders overtaken by a later one. */
    for (size_t i = 0; i < nholds; i++) {
        int overtaken = 0;
        int overlapped = 0;
        for (size_t j = i + 1; j < nholds && holds[j].t_ok < holds[i].t_end; j++) {
            if (holds[j].worker == holds[i].worker || (holds[i].shared && holds[j].shared))
                continue;
            overlapped = 1;
            if (holds[j].fence > holds[i].fence)
                overtaken = 1;
        }
        r->overlaps += overlapped;
        if (missed(&holds[i], overtaken,
                   nemesis == N_SERVER_VOLATILE || conn_ends_lock(c->be, nemesis), r))
            fprintf(stderr, "chaos: %s: worker %d, fence %llu: %s, never told (release %d%s)\n",
                    c->dir, holds[i].worker, (unsigned long long)holds[i].fence,
                    holds[i].waited ? "saw its loss" : overtaken ? "overtaken" : "lease lapsed",
                    holds[i].rel_rc, holds[i].waited ? ", on_lost never came" : "");
    }

    /* Fence order: a hold that started after another had its fence must
     * have a greater fence. Walk holds by start, with the highest fence
     * issued to holds acquired before that start. */
    {
        hold **by_start = malloc((nholds + 1) * sizeof(*by_start));
        size_t p = 0;
        uint64_t highest = 0;
        for (size_t i = 0; i < nholds; i++)
            by_start[i] = &holds[i];
        for (size_t i = 1; i < nholds; i++) /* insertion sort: nearly sorted already */
            for (size_t j = i; j > 0 && by_start[j - 1]->t_start > by_start[j]->t_start; j--) {
                hold *t = by_start[j];
                by_start[j] = by_start[j - 1];
                by_start[j - 1] = t;
            }
        for (size_t i = 0; i < nholds; i++) {
            while (p < nholds && holds[p].t_ok < by_start[i]->t_start) {
                if (holds[p].fence > highest)
                    highest = holds[p].fence;
                p++;
            }
            if (by_start[i]->fence <= highest && !by_start[i]->reentry)
                r->fence_viol++;
        }
        free(by_start);
    }
    /* Two holds with one fence, however their acquisitions overlapped in
     * time: one of them came after the other, with a fence not above its
     * fence. (The walk above counts a hold only when its acquisition began
     * after the other's ended, and misses a waiter that started before a
     * holder and got its fence again; Redlock with a node that forgot its
     * marks does this.) */
    {
        uint64_t *f = malloc((nholds + 1) * sizeof(*f));
        if (f == NULL)
            exit(1);
        size_t nf = 0;
        for (size_t i = 0; i < nholds; i++)
            if (!holds[i].reentry)
                f[nf++] = holds[i].fence;
        qsort(f, nf, sizeof(*f), cmp_u64);
        for (size_t i = 1; i < nf; i++)
            if (f[i] == f[i - 1]) {
                r->fence_viol++;
                fprintf(stderr, "chaos: %s: fence %llu given to two holds\n", c->dir,
                        (unsigned long long)f[i]);
            }
        free(f);
    }

    /* Unavailability: the longest time no valid hold existed, in leases. */
    {
        int64_t covered = run_start;
        for (size_t i = 0; i < nholds; i++) {
            if (holds[i].t_ok > covered) {
                double gap = (double)(holds[i].t_ok - covered) / 1000.0 / (double)lease_ms;
                if (gap > r->max_unavail)
                    r->max_unavail = gap;
            }
            if (holds[i].valid_end > covered)
                covered = holds[i].valid_end;
        }
        /* And to the end of the run, when workers stop asking: a lock that
         * nobody got again (never released) counts too. */
        if (nholds > 0 && c->until_us > covered) {
            double gap = (double)(c->until_us - covered) / 1000.0 / (double)lease_ms;
            if (gap > r->max_unavail)
                r->max_unavail = gap;
        }
    }

    if (chaos_store_check(c->store, &rep, err, sizeof(err)) != 0) {
        fprintf(stderr, "chaos: %s\n", err);
        r->store_errors++;
    }
    /* Two models of the register, neither of which trusts the fence check:
     * the store's log of applied writes (each must build on the value
     * before it, write a value not written before, with a fence not below
     * the last), and the workers' own account: every write the store
     * acknowledged added one to the register, so more acknowledged writes
     * than the final value is that many updates lost. (A worker killed
     * between the store's commit and its history line makes the second
     * count low, never high.) */
    hist_lost = acked > rep.final_value ? acked - (long)rep.final_value : 0;
    r->writes_acked += acked;
    {
        long store_lost = (long)(rep.lost + rep.dup + rep.fence_down);
        r->lost_updates += store_lost > hist_lost ? store_lost : hist_lost;
    }
    if (rep.lost + rep.dup + rep.fence_down > 0 || hist_lost > 0)
        fprintf(stderr, "chaos: %s: store log: %lld lost, %lld duplicated updates, %lld writes "
                "with a fence below an earlier write's, in %lld writes; histories: %ld "
                "acknowledged writes, register %lld\n",
                c->dir, (long long)rep.lost, (long long)rep.dup, (long long)rep.fence_down,
                (long long)rep.writes, acked, (long long)rep.final_value);
    /* The clock-jump nemesis had an effect when a worker saw its wall clock
     * away from the runner's, which libfaketime does not touch: a worker
     * that only started after the first jump (slow under ASan with
     * libfaketime) shows no unjumped clock, so the spread alone may be 0. */
    if (nemesis == N_CLOCK &&
        (wall_max - c->real_skew > 1800 || c->real_skew - wall_min > 1800 ||
         wall_max - wall_min > 1800))
        r->wall_jumps++;
    if (nholds == 0 || (rep.writes == 0 && !opt_sem)) /* permit holders never write */
        r->ran_nothing++;
    free(holds);
    free(ev);
}

/* ---- a run, and the rows ------------------------------------------------- */

/*
 * The unavailability bound, in leases, for the nemeses that leave the
 * server and the network alone (none, pause, kill-holder, clock-jump): the
 * longest a hold may run (a think of up to 2 leases ends in a release, or a
 * stopped or killed holder's lease runs out within 1 lease of its last
 * renewal), plus the backend's detection time. leader-kill adds the
 * ensemble's election (elect_ms): the two members left serve on their own,
 * so the dead member's downtime does not count, only the time without a
 * leader. 0: no bound (the server or the network is down for a while, by
 * design).
 */
static double unavail_bound(const backend *be, int nemesis)
{
    if (nemesis == N_LEADER_KILL)
        return 2.0 + (double)(be->detect_ms + be->elect_ms) / (double)lease_ms;
    if (nemesis != N_NONE && nemesis != N_PAUSE && nemesis != N_KILL && nemesis != N_CLOCK)
        return 0;
    return 2.0 + (double)be->detect_ms / (double)lease_ms;
}

static void run_once(const backend *be, int nemesis, int broken, unsigned seed, row *r)
{
    run_ctx c;
    char err[256];
    int fd;

    memset(&c, 0, sizeof(c));
    c.be = be;
    c.broken = broken;
    c.seed = seed;
    c.stopped_slot = -1;
    snprintf(c.dir, sizeof(c.dir), "/tmp/dlock-chaos-XXXXXX");
    if (mkdtemp(c.dir) == NULL) {
        perror("chaos: mkdtemp");
        exit(1);
    }
    snprintf(c.store, sizeof(c.store), "%s/store.db", c.dir);
    snprintf(c.state, sizeof(c.state), "%s/state", c.dir);
    snprintf(c.runner_log, sizeof(c.runner_log), "%s/runner.log", c.dir);
    snprintf(c.faketime_file, sizeof(c.faketime_file), "%s/faketime", c.dir);
    if (chaos_store_create(c.store, err, sizeof(err)) != 0) {
        fprintf(stderr, "chaos: %s\n", err);
        exit(1);
    }
    fd = open(c.state, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, sizeof(chaos_slot) * CHAOS_MAX_WORKERS) != 0) {
        perror("chaos: state file");
        exit(1);
    }
    c.slots = mmap(NULL, sizeof(chaos_slot) * CHAOS_MAX_WORKERS, PROT_READ | PROT_WRITE,
                   MAP_SHARED, fd, 0);
    close(fd);
    if (c.slots == MAP_FAILED) {
        perror("chaos: mmap");
        exit(1);
    }
    c.runner_fd = open(c.runner_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

    if (opt_url == NULL) {
        /* A Redis server persists only where it is killed (faster);
         * Redlock's nodes run as docs/redlock.md requires, but under
         * server-kill-volatile. */
        be->start(&c.srv, c.dir, nemesis == N_SERVER_PERSIST || nemesis == N_MIXED ||
                                     (be->nodes > 1 && nemesis != N_SERVER_VOLATILE));
        c.have_server = 1;
    }
    /* Over several nodes, server-kill cuts nodes off too (do_server_kill). */
    if (nemeses[nemesis].needs_proxy ||
        (be->nodes > 1 && (nemesis == N_SERVER_PERSIST || nemesis == N_SERVER_VOLATILE))) {
        int port[CHAOS_NODES_MAX];
        if (!c.have_server) {
            const char *p = strrchr(opt_url, ':');
            c.srv.port[0] = p != NULL ? atoi(p + 1) : 0;
        }
        for (int i = 0; i < be->nodes; i++) {
            if (chaos_proxy_start(&c.proxy[i], c.srv.port[i]) != 0)
                exit(1);
            port[i] = chaos_proxy_port(c.proxy[i]);
        }
        be->url(c.url, sizeof(c.url), port);
    } else if (c.have_server) {
        be->url(c.url, sizeof(c.url), c.srv.port);
    } else {
        snprintf(c.url, sizeof(c.url), "%s", opt_url);
    }
    if (nemesis == N_CLOCK) {
        FILE *f = fopen(c.faketime_file, "w");
        if (test_faketime_lib() == NULL) {
            fprintf(stderr, "chaos: libfaketime is missing (apt-get install faketime): the "
                            "clock-jump nemesis cannot run\n");
            r->no_effect++;
            r->runs++;
            if (f)
                fclose(f);
            goto out;
        }
        if (f == NULL || fputs("+0s\n", f) < 0 || fclose(f) != 0) {
            perror("chaos: faketime file");
            exit(1);
        }
        c.faketime = 1;
    }

    c.real_skew = (double)time(NULL) - (double)chaos_now_us() / 1e6;
    c.until_us = chaos_now_us() + (int64_t)duration_s * 1000000;
    for (int i = 0; i < opt_workers; i++)
        spawn_worker(&c, i);
    while (chaos_now_us() < c.until_us) {
        nemesis_step(&c, nemesis);
        reap(&c, 0);
    }
    for (int i = 0; i < be->nodes; i++)
        if (c.proxy[i] != NULL)
            chaos_proxy_set(c.proxy[i], CHAOS_PROXY_PASS, 0);
    /* Workers finish their iteration: a wait of 3 leases, a lost-lock wait,
     * timeouts. Anything still running well after is hung. */
    reap(&c, (int)(lease_ms * 12) + 10000);
    for (int i = 0; i < opt_workers; i++) {
        if (c.pids[i] > 0) {
            fprintf(stderr, "chaos: worker in slot %d (pid %d) hung; killing it\n", i,
                    (int)c.pids[i]);
            kill(c.pids[i], SIGKILL);
            waitpid(c.pids[i], NULL, 0);
            c.hung++;
        }
    }
    for (int i = 0; i < be->nodes; i++) {
        chaos_proxy_stop(c.proxy[i]);
        c.proxy[i] = NULL;
    }

    r->runs++;
    r->faults += c.faults;
    r->unavail_bound = unavail_bound(be, nemesis);
    r->conn_ends_lock = conn_ends_lock(be, nemesis);
    r->crashed += c.crashed;
    r->hung += c.hung;
    if (c.max_elect_ms > r->max_elect_ms)
        r->max_elect_ms = c.max_elect_ms;
    if (nemesis != N_NONE && c.faults == 0)
        r->no_effect++;
    check_run(&c, r, nemesis);
    if (nemesis == N_CLOCK && r->wall_jumps == 0)
        r->no_effect++;
out:
    if (c.have_server)
        be->stop(&c.srv);
    close(c.runner_fd);
    munmap(c.slots, sizeof(chaos_slot) * CHAOS_MAX_WORKERS);
    if (opt_keep) {
        fprintf(stderr, "chaos: history kept in %s\n", c.dir);
    } else if (strncmp(c.dir, "/tmp/dlock-chaos-", 17) != 0) {
        /* Seen once on postgres: c.dir garbage by here (cause not found
         * yet). Never rm -rf what is not our run's folder. */
        fprintf(stderr, "chaos: the run's folder name was overwritten: not removed\n");
        r->crashed++;
    } else {
        char cmd[160];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", c.dir);
        if (system(cmd) != 0)
            fprintf(stderr, "chaos: could not remove %s\n", c.dir);
    }
}

/* The verdict of a row, and why. Two holders at once and repeated fences
 * are a documented limit where the server forgets its data (no
 * persistence): it forgets the lock and its fence counter. */
static const char *verdict(const row *r, int nemesis, char *why, size_t size)
{
    int forgets = nemesis == N_SERVER_VOLATILE || r->conn_ends_lock;

    why[0] = '\0';
    if (r->viol && !forgets)
        snprintf(why, size, "two holders believed they held the lock");
    else if (r->lost_updates)
        snprintf(why, size, "lost updates");
    else if (r->fence_viol && !forgets)
        snprintf(why, size, "fence order");
    else if (r->missed_on_lost && !r->conn_ends_lock)
        snprintf(why, size, "holder never told");
    else if (r->crashed || r->hung)
        snprintf(why, size, "%d crashed, %d hung workers", r->crashed, r->hung);
    else if (r->store_errors)
        snprintf(why, size, "store errors");
    else if (r->unavail_bound > 0 && r->max_unavail > r->unavail_bound)
        snprintf(why, size, "unavailable for %.2f leases (bound %.2f)", r->max_unavail,
                 r->unavail_bound);
    else if (r->no_effect)
        snprintf(why, size, "nemesis had no effect");
    else if (r->ran_nothing)
        snprintf(why, size, "no hold or write in a run");
    if (why[0] != '\0')
        return "FAIL";
    if ((r->fence_viol || r->viol || r->missed_on_lost) && r->conn_ends_lock) {
        snprintf(why, size, "a session lock ends with its dropped connection, before its holder "
                 "can know (documented)");
        return "ok*";
    }
    if ((r->fence_viol || r->viol) && forgets) {
        snprintf(why, size, "the lock and its fences restart with the data (documented)");
        return "ok*";
    }
    return "ok";
}

static void print_rows(FILE *f, int markdown, const char *be_name, const int *which, int nw,
                       row *rows, int header)
{
    const char *h = markdown ? "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n"
                             : "%-17s %-20s %4s %6s %6s %8s %5s %6s %7s %7s %7s %7s %8s %s\n";
    char why[96];

    if (header)
        fprintf(f, h, "backend", "nemesis", "runs", "holds", "faults", "overlaps", "viol",
                "fence", "lost-up", "on_lost", "missed", "refused", "unavail", "result");
    if (markdown && header)
        fprintf(f, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n");
    for (int i = 0; i < nw; i++) {
        const row *r = &rows[i];
        const char *v = verdict(r, which[i], why, sizeof(why));
        if (r->runs == 0)
            continue;
        fprintf(f, markdown ? "| %s | %s | %d | %ld | %ld | %ld | %ld | %ld | %ld | %ld | %ld | "
                              "%ld | %.2f | %s%s%s |\n"
                            : "%-17s %-20s %4d %6ld %6ld %8ld %5ld %6ld %7ld %7ld %7ld %7ld %8.2f "
                              "%s%s%s\n",
                be_name, nemeses[which[i]].name, r->runs, r->holds, r->faults, r->overlaps,
                r->viol, r->fence_viol, r->lost_updates, r->on_lost, r->missed_on_lost,
                r->refused, r->max_unavail, v, why[0] ? ": " : "", why);
    }
}

/* One line a backend: its rows' sums. violations: two believing holders and
 * fence order, except where the server forgets its data (documented, ok*);
 * unavail: the longest, and the worst against its bound (bounded nemeses). */
static void print_summary(FILE *f, int markdown, const backend *const *chosen, int nb,
                          const int *which, int nw, row rows[][N_COUNT * 4])
{
    fprintf(f, markdown ? "| backend | rows | runs | faults | violations | lost updates | "
                          "missed losses | unavailability (leases) | worst vs bound | failed rows |\n"
                          "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n"
                        : "\n%-17s %4s %5s %7s %10s %12s %13s %8s %10s %6s\n",
            "backend", "rows", "runs", "faults", "violations", "lost-updates", "missed-losses",
            "unavail", "vs-bound", "failed");
    for (int b = 0; b < nb; b++) {
        long nrows = 0, runs = 0, faults = 0, viol = 0, lost = 0, missed = 0, failed = 0;
        double unavail = 0, worst = 0;
        char name[32], why[96];
        snprintf(name, sizeof(name), "%s%s", chosen[b]->name,
                 opt_rw ? "-rw" : opt_sem ? "-sem" : opt_fair ? "-fair" : "");
        for (int i = 0; i < nw; i++) {
            const row *r = &rows[b][i];
            if (r->runs == 0)
                continue;
            nrows++;
            runs += r->runs;
            faults += r->faults;
            if (which[i] != N_SERVER_VOLATILE && !r->conn_ends_lock)
                viol += r->viol + r->fence_viol;
            lost += r->lost_updates;
            missed += r->conn_ends_lock ? 0 : r->missed_on_lost;
            if (r->max_unavail > unavail)
                unavail = r->max_unavail;
            if (r->unavail_bound > 0 && r->max_unavail / r->unavail_bound > worst)
                worst = r->max_unavail / r->unavail_bound;
            failed += strcmp(verdict(r, which[i], why, sizeof(why)), "FAIL") == 0;
        }
        fprintf(f, markdown ? "| %s | %ld | %ld | %ld | %ld | %ld | %ld | %.2f | %.2f | %ld |\n"
                            : "%-17s %4ld %5ld %7ld %10ld %12ld %13ld %8.2f %10.2f %6ld\n",
                name, nrows, runs, faults, viol, lost, missed, unavail, worst, failed);
    }
}

static int parse_nemeses(const char *list, int *which)
{
    char buf[512], *save = NULL;
    int n = 0;

    if (list == NULL || strcmp(list, "all") == 0) {
        for (int i = 0; i < N_COUNT; i++)
            which[n++] = i;
        return n;
    }
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int found = -1;
        for (int i = 0; i < N_COUNT; i++)
            if (strcmp(nemeses[i].name, tok) == 0)
                found = i;
        if (found < 0) {
            fprintf(stderr, "chaos: unknown nemesis '%s'; known:", tok);
            for (int i = 0; i < N_COUNT; i++)
                fprintf(stderr, " %s", nemeses[i].name);
            fprintf(stderr, "\n");
            exit(64);
        }
        which[n++] = found;
    }
    return n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: chaos [--workers N] [--lease MS] [--duration S] [--runs N] [--seed N]\n"
            "             [--nemesis all|a,b,...] [--backend redis,etcd,etcd3,zk,zk3,...]\n"
            "             [--url URL] [--keep] [--markdown FILE] [--self-test]\n"
            "             [--kind mutex|rw|sem|fair] [--faults N]\n"
            "--faults N: each row runs (more runs of --duration) until N faults\n"
            "--kind rw: a read-write lock, half the holds reads (no register step;\n"
            "           readers may overlap readers, nothing else)\n"
            "--kind sem: a semaphore of 3 permits (no register step; up to 3 together)\n"
            "--kind fair: a fair lock (FIFO; the register step, as the mutex's)\n"
            "nemeses:\n");
    for (int i = 0; i < N_COUNT; i++)
        fprintf(stderr, "  %-20s %s\n", nemeses[i].name, nemeses[i].what);
    fprintf(stderr, "backends:");
    for (size_t i = 0; i < NBACKENDS; i++)
        fprintf(stderr, " %s", backends[i].name);
    fprintf(stderr, "\n(etcd3, zk3: a 3-member etcd cluster, ZooKeeper ensemble)\n");
}

/* ---- the self-test ------------------------------------------------------ */

/* Each broken worker with a fault nemesis that gives its fault a chance,
 * and what the checker must find; every check of the checker has a broken
 * worker (viol, fence, lost-up, missed, unavail). The first row, of correct
 * workers, must pass. */
static const struct {
    int broken;
    int nemesis;
    const char *must_find;
    int longer; /* runs twice as long: a fault only shows after a pause */
} self_rows[] = {
    {CHAOS_OK, N_PAUSE, NULL, 1},
    {CHAOS_NO_LOCK, N_KILL, "viol", 0},
    {CHAOS_REUSE_FENCE, N_DROP, "fence", 0},
    {CHAOS_IGNORE_LOST, N_PAUSE, "viol", 1},
    {CHAOS_RAW_DEL, N_PAUSE, "viol", 1},
    {CHAOS_SLOW_CLOCK, N_DELAY, "viol", 0},
    {CHAOS_SUPPRESS_LOST, N_PAUSE, "missed", 1},
    {CHAOS_SKIP_FENCE, N_PAUSE, "lost-up", 1},
    {CHAOS_NEVER_RELEASE, N_CLOCK, "unavail", 1},
};

/* Whether row i of self_rows came out as it must: correct workers pass, a
 * broken worker fails its row for what it does (not because it crashed or
 * ran nothing). */
static int self_row_right(const row *r, int i, const char **verdict_out, char *why, size_t size)
{
    const char *want = self_rows[i].must_find;
    const char *v = verdict(r, self_rows[i].nemesis, why, size);
    int found = want == NULL                      ? 0
                : strcmp(want, "viol") == 0       ? r->viol > 0
                : strcmp(want, "fence") == 0      ? r->fence_viol > 0
                : strcmp(want, "lost-up") == 0    ? r->lost_updates > 0
                : strcmp(want, "missed") == 0     ? r->missed_on_lost > 0
                : strcmp(want, "unavail") == 0    ? r->unavail_bound > 0 &&
                                                        r->max_unavail > r->unavail_bound
                                                  : 0;
    int sound = !r->crashed && !r->hung && !r->store_errors && !r->no_effect && !r->ran_nothing;

    if (verdict_out != NULL)
        *verdict_out = v;
    return want == NULL ? strcmp(v, "FAIL") != 0 : strcmp(v, "FAIL") == 0 && found && sound;
}

/* Run every row of self_rows on be; returns how many came out wrong. A
 * broken worker's fault shows only when the nemesis meets it at the right
 * moment (a pause while it thinks, not while it releases), so a row that
 * must fail gets up to SELF_TRIES runs, with other seeds, to be caught; the
 * correct workers' row runs once and must pass. */
enum { SELF_TRIES = 3 };
static int self_test(const backend *be)
{
    enum { NROWS = sizeof(self_rows) / sizeof(self_rows[0]) };
    row rows[NROWS];
    int wrong = 0;

    printf("chaos --self-test: backend %s, %d workers, lease %lld ms, %d s a row, seed %u\n",
           be->name, opt_workers, (long long)lease_ms, duration_s, opt_seed);
    fflush(stdout);
    for (int i = 0; i < (int)NROWS; i++) {
        int normal = duration_s;
        duration_s *= self_rows[i].longer ? 2 : 1;
        for (int t = 0; t < SELF_TRIES; t++) {
            char why[96];

            memset(&rows[i], 0, sizeof(rows[i]));
            run_once(be, self_rows[i].nemesis, self_rows[i].broken,
                     opt_seed + (unsigned)i * 1000 + (unsigned)t * 7919, &rows[i]);
            if (self_rows[i].must_find == NULL || self_row_right(&rows[i], i, NULL, why, sizeof(why)))
                break;
            fprintf(stderr, "chaos: self-test %s not caught in run %d of %d\n",
                    chaos_broken_names[self_rows[i].broken], t + 1, SELF_TRIES);
        }
        duration_s = normal;
        fprintf(stderr, "chaos: self-test %s done\n", chaos_broken_names[self_rows[i].broken]);
    }
    printf("\n%-7s %-13s %-12s %6s %5s %6s %7s %7s %7s  %s\n", "backend", "worker", "nemesis",
           "holds", "viol", "fence", "lost-up", "missed", "unavail", "checker");
    for (int i = 0; i < (int)NROWS; i++) {
        const row *r = &rows[i];
        const char *want = self_rows[i].must_find;
        char why[96];
        const char *v;
        int right = self_row_right(r, i, &v, why, sizeof(why));
        printf("%-7s %-13s %-12s %6ld %5ld %6ld %7ld %7ld %7.2f  %s: %s%s%s\n", be->name,
               chaos_broken_names[self_rows[i].broken], nemeses[self_rows[i].nemesis].name,
               r->holds, r->viol, r->fence_viol, r->lost_updates, r->missed_on_lost, r->max_unavail,
               right ? (want == NULL ? "passed, as it must" : "caught")
                     : (want == NULL ? "WRONG (correct workers failed)" : "MISSED"),
               v, why[0] ? ": " : "", why);
        wrong += !right;
    }
    return wrong;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"workers", 1, NULL, 'w'}, {"lease", 1, NULL, 'l'},   {"duration", 1, NULL, 'd'},
        {"runs", 1, NULL, 'r'},    {"seed", 1, NULL, 's'},    {"nemesis", 1, NULL, 'n'},
        {"backend", 1, NULL, 'b'}, {"url", 1, NULL, 'u'},     {"keep", 0, NULL, 'k'},
        {"markdown", 1, NULL, 'm'}, {"help", 0, NULL, 'h'},   {"self-test", 0, NULL, 't'},
        {"kind", 1, NULL, 'K'},    {"faults", 1, NULL, 'f'},  {NULL, 0, NULL, 0}};
    const char *nemesis_list = NULL;
    const backend *chosen[NBACKENDS];
    int which[N_COUNT * 4] = {0}, nw, nb = 0, failed = 0, total = 0, opt;
    row rows[NBACKENDS][N_COUNT * 4];
    char *slash, list[256], *save = NULL;
    FILE *md = NULL;

    opt_seed = (unsigned)time(NULL);
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'w': opt_workers = atoi(optarg); break;
        case 'l': opt_lease_ms = atoll(optarg); break;
        case 'd': opt_duration_s = atoi(optarg); break;
        case 'r': opt_runs = atoi(optarg); break;
        case 'f': opt_faults = atol(optarg); break;
        case 's': opt_seed = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'n': nemesis_list = optarg; break;
        case 'b': opt_backend = optarg; break;
        case 'u': opt_url = optarg; break;
        case 'k': opt_keep = 1; break;
        case 'm': opt_markdown = optarg; break;
        case 't': opt_self_test = 1; break;
        case 'K':
            /* The workers read it (chaos_worker.c): read-write locks. */
            if (strcmp(optarg, "rw") != 0 && strcmp(optarg, "sem") != 0 &&
                strcmp(optarg, "fair") != 0 && strcmp(optarg, "mutex") != 0) {
                usage();
                return 64;
            }
            opt_rw = strcmp(optarg, "rw") == 0;
            opt_sem = strcmp(optarg, "sem") == 0;
            opt_fair = strcmp(optarg, "fair") == 0;
            if (opt_rw || opt_sem || opt_fair)
                setenv("CHAOS_KIND", optarg, 1);
            else
                unsetenv("CHAOS_KIND");
            break;
        default: usage(); return opt == 'h' ? 0 : 64;
        }
    }
    if (opt_workers < 2 || opt_workers > CHAOS_MAX_WORKERS ||
        (opt_lease_ms != 0 && opt_lease_ms < 50) || opt_duration_s < 1 || opt_runs < 1 ||
        opt_faults < 0) {
        usage();
        return 64;
    }
    snprintf(list, sizeof(list), "%s", opt_backend);
    for (char *tok = strtok_r(list, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        const backend *be = NULL;
        for (size_t i = 0; i < NBACKENDS; i++)
            if (strcmp(backends[i].name, tok) == 0)
                be = &backends[i];
        if (be == NULL) {
            fprintf(stderr, "chaos: unknown backend '%s'; known:", tok);
            for (size_t i = 0; i < NBACKENDS; i++)
                fprintf(stderr, " %s", backends[i].name);
            fprintf(stderr, "\n");
            return 64;
        }
        if (nb == (int)NBACKENDS) {
            fprintf(stderr, "chaos: more than %d backends in --backend\n", (int)NBACKENDS);
            return 64;
        }
        chosen[nb++] = be;
    }
    signal(SIGPIPE, SIG_IGN);
    /* The worker is built beside the runner. */
    if (readlink("/proc/self/exe", worker_path, sizeof(worker_path) - 32) < 0) {
        perror("chaos: /proc/self/exe");
        return 1;
    }
    slash = strrchr(worker_path, '/');
    strcpy(slash + 1, "chaos_worker");

    if (opt_self_test) {
        int wrong = 0;
        if (opt_url != NULL) {
            fprintf(stderr, "chaos: --self-test starts servers of its own; no --url\n");
            return 64;
        }
        for (int b = 0; b < nb; b++) {
            lease_ms = opt_lease_ms != 0 ? opt_lease_ms : chosen[b]->lease_ms;
            duration_s = (int)((opt_duration_s * lease_ms + 399) / 400);
            wrong += self_test(chosen[b]);
        }
        printf("\n%s\n", wrong ? "self-test FAILED: the checker let a broken worker pass (or "
                                  "failed correct ones)" : "self-test passed: every broken worker "
                                  "was caught");
        return wrong ? 1 : 0;
    }
    nw = parse_nemeses(nemesis_list, which);
    for (int b = 0; b < nb; b++) {
        const backend *be = chosen[b];

        lease_ms = opt_lease_ms != 0 ? opt_lease_ms : be->lease_ms;
        duration_s = (int)((opt_duration_s * lease_ms + 399) / 400);
        printf("chaos: backend %s, %d workers, lease %lld ms, %d run(s) of %d s per nemesis, "
               "seed %u\n", be->name, opt_workers, (long long)lease_ms, opt_runs, duration_s,
               opt_seed);
        fflush(stdout);
        for (int i = 0; i < nw; i++) {
            memset(&rows[b][i], 0, sizeof(rows[b][i]));
            if (opt_url != NULL && nemeses[which[i]].needs_server) {
                fprintf(stderr, "chaos: %s needs a server of its own; skipped with --url\n",
                        nemeses[which[i]].name);
                continue;
            }
            if (opt_url != NULL && nemeses[which[i]].needs_proxy && be->nodes > 1) {
                fprintf(stderr, "chaos: %s puts a proxy before each node: not with --url for "
                        "%s\n", nemeses[which[i]].name, be->name);
                continue;
            }
            if (which[i] == N_SERVER_VOLATILE && !be->volatile_option)
                continue; /* the service always persists */
            if (which[i] == N_LEADER_KILL && be->leader == NULL) {
                if (nemesis_list != NULL && strcmp(nemesis_list, "all") != 0)
                    fprintf(stderr, "chaos: leader-kill needs an ensemble (etcd3, zk3): "
                            "skipped on %s\n", be->name);
                continue;
            }
            /* --runs runs at least; with --faults, more until the row has
             * injected that many faults (a run that injects none ends it:
             * its row fails, "no effect"). */
            for (int k = 0; k < opt_runs || (opt_faults > 0 && which[i] != N_NONE &&
                                             rows[b][i].faults < opt_faults); k++) {
                long before = rows[b][i].faults;
                run_once(be, which[i], CHAOS_OK, opt_seed + (unsigned)i * 100003u + (unsigned)k,
                         &rows[b][i]);
                if (k + 1 >= opt_runs && rows[b][i].faults == before)
                    break;
                if (opt_faults > 0 && k + 1 >= opt_runs && which[i] != N_NONE)
                    fprintf(stderr, "chaos: %s %s: %ld of %ld faults after %d runs\n", be->name,
                            nemeses[which[i]].name, rows[b][i].faults, opt_faults, k + 1);
            }
            if (opt_rw)
                fprintf(stderr, "chaos: %s %s done: %ld reads began beside another, %ld "
                        "re-entered their owner's unreleased read\n", be->name,
                        nemeses[which[i]].name, rows[b][i].readers_together,
                        rows[b][i].reentries);
            else if (opt_sem)
                fprintf(stderr, "chaos: %s %s done: %ld permit holds began beside another\n",
                        be->name, nemeses[which[i]].name, rows[b][i].readers_together);
            else if (which[i] == N_LEADER_KILL)
                fprintf(stderr, "chaos: %s %s done: the longest election took %lld ms\n",
                        be->name, nemeses[which[i]].name, (long long)rows[b][i].max_elect_ms);
            else
                fprintf(stderr, "chaos: %s %s done\n", be->name, nemeses[which[i]].name);
        }
    }
    printf("\n");
    if (opt_markdown != NULL && (md = fopen(opt_markdown, "w")) == NULL)
        perror(opt_markdown);
    for (int b = 0; b < nb; b++) {
        char shown[32];
        snprintf(shown, sizeof(shown), "%s%s", chosen[b]->name,
                 opt_rw ? "-rw" : opt_sem ? "-sem" : opt_fair ? "-fair" : "");
        print_rows(stdout, 0, shown, which, nw, rows[b], b == 0);
        if (md != NULL)
            print_rows(md, 1, shown, which, nw, rows[b], b == 0);
    }
    print_summary(stdout, 0, chosen, nb, which, nw, rows);
    if (md != NULL) {
        fprintf(md, "\n");
        print_summary(md, 1, chosen, nb, which, nw, rows);
        fprintf(md, "\nseed %u, %d workers, %d s a run (a 400 ms lease; scaled with the lease)%s\n",
                opt_seed, opt_workers, opt_duration_s,
                opt_faults > 0 ? ", each row until its fault count" : "");
        fclose(md);
    }
    printf("\nholds: lock acquisitions; faults: injected; overlaps: holds during which another\n"
           "process entered the critical section (expected under pauses and partitions);\n"
           "viol: beliefs (now + dlock_lock_valid_ms(), logged before each store step) that\n"
           "began while another holder's had not run out, been released, stopped, killed or\n"
           "told by on_lost: two holders at once by their own account (fails the row);\n"
           "fence: holds that started after a hold with an equal or higher fence had it,\n"
           "and fences given to two holds; lost-up: lost or duplicated register updates; on_lost: callbacks fired; missed:\n"
           "overtaken holders never told (no on_lost, no ELOST); refused: stale reads and\n"
           "writes the store refused; unavail: longest time without a valid holder, in\n"
           "leases (server-kill rows include the server's downtime).\n");
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < nw; i++) {
            char why[96];
            if (rows[b][i].runs == 0)
                continue;
            total++;
            if (strcmp(verdict(&rows[b][i], which[i], why, sizeof(why)), "FAIL") == 0)
                failed++;
        }
    printf("%d passed, %d failed\n", total - failed, failed);
    return failed ? 1 : 0;
}
