/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench: shared declarations of the benchmark program.
 *
 * The benchmark uses dlock only through its public API. It also talks to the
 * same Redis server directly through hiredis, to measure the raw round trip
 * that every dlock figure is compared with.
 */
#ifndef DLOCK_BENCH_H
#define DLOCK_BENCH_H

#include <stddef.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include <dlock/dlock.h>
#include <hiredis/hiredis.h>
#include <semaphore.h>

/* ------------------------------------------------------------------------
 * main.c
 * ---------------------------------------------------------------------- */

/* Now on CLOCK_MONOTONIC, in nanoseconds. */
int64_t bench_now_ns(void);

/*
 * Print "dlock-bench: <message>" on stderr, stop the throwaway server if this
 * run started one, and exit with status 1. Safe to call from any thread.
 */
void bench_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* ------------------------------------------------------------------------
 * server.c: the throwaway redis-server (the demo's launcher), signals, CPUs
 * ---------------------------------------------------------------------- */

/* Set once SIGINT, SIGTERM or SIGHUP arrived and the clean-up began. */
extern atomic_int bench_interrupted;

/*
 * Block SIGINT, SIGTERM and SIGHUP in this thread (and so in every thread
 * created after it, the library's included) and start a thread that waits for
 * them, stops the throwaway server, removes its directory and exits with
 * 128 + signal. Call first thing in main, before any other thread exists.
 */
void bench_signals_init(void);

/*
 * Start redis-server (found in PATH) on a free loopback port, without
 * persistence, in a fresh mkdtemp directory, and wait until it accepts
 * connections (demo_redis_start). Writes "redis://127.0.0.1:PORT" to url.
 * Dies on failure.
 */
void bench_server_start(char *url, size_t url_size);

/* Stop the server started by bench_server_start and remove its directory.
 * Idempotent, thread-safe; a no-op when no server was started. */
void bench_server_stop(void);

/* The pid of the server started by bench_server_start, or 0. */
pid_t bench_server_pid(void);

/* SIGTERM and reap the n servers in pids (n becomes 0), then remove dir
 * (a mkdtemp folder; "" when none) and make it "". */
void bench_stop_children(pid_t *pids, int *n, char *dir);

/* Run argv (a redis-server or redis-sentinel) with the bench's signals
 * unblocked (they survive exec), dying with the bench (PR_SET_PDEATHSIG);
 * its pid goes to pids[(*n)++]. Dies when fork fails. */
void bench_spawn(pid_t *pids, int *n, char *const argv[]);

/* A fresh random password for a throwaway server: 32 hex digits from the
 * kernel's CSPRNG into out. Dies if there is none. */
void bench_random_password(char out[33]);

/* Write a server's config file path (mode 0600, in the bench's private
 * mkdtemp folder) with text as its lines: a password given there is not
 * on the server's command line, which every local user can read. */
void bench_write_conf(const char *path, const char *text);

/* Connect to host:port and AUTH with password ("" for none). NULL when the
 * server cannot be reached or refuses the password. */
redisContext *bench_connect_auth(const char *host, int port, const char *password);

/* Die unless the server at host:port refuses a client that gives no
 * password (-NOAUTH): what each server the bench starts must do (issue
 * 26, item 9). what names the server in the message. */
void bench_require_auth(const char *host, int port, const char *what);

/* The password in url's user information ("" if none) into out. */
void bench_url_password(const char *url, char *out, size_t size);

/*
 * CPUs this process may run on (its affinity when it started): returns how
 * many, and sets *first and *second to the first two of them.
 */
int bench_cpus(int *first, int *second);

/*
 * Pin every thread of process pid (0: this one) to cpu, or back to this
 * process's startup CPUs when cpu is -1. Threads the pinned threads create
 * later inherit it. Dies on failure.
 */
void bench_pin(pid_t pid, int cpu);

/* The server's version string ("7.0.15"), or "" when unknown. */
const char *bench_server_version(redisContext *c);

/* ------------------------------------------------------------------------
 * raw.c: direct hiredis connections for the baseline
 * ---------------------------------------------------------------------- */

/* Where the server is, taken from the same URL dlock is given. */
typedef struct {
    int is_unix;
    char host[256];
    int port;
    char path[1024];
    char user[256];
    char password[256];
    int db;
    int tls; /* rediss:// */
    char cacert[256], cert[256], key[256], sni[256];
    int insecure;
} bench_endpoint;

/*
 * Parse the URL forms dlock accepts (redis://[user:password@]host[:port][/db],
 * unix:///path[?db=N]) well enough to reach the same server. Returns 0, or -1
 * with a reason in err.
 */
int bench_endpoint_parse(bench_endpoint *out, const char *url, char *err, size_t err_size);

/* ------------------------------------------------------------------------
 * tls.c: rediss://, the raw round trip over dlock's own transport
 * ---------------------------------------------------------------------- */

/* Connect over TLS with the transport dlock uses (redis_transport.c, built
 * into the bench), AUTH as the URL says. Dies on failure. */
void *bench_tls_connect(const bench_endpoint *ep);
/* One PING over it, its round trip in ns. Dies on failure. */
int64_t bench_tls_ping(void *conn);
void bench_tls_close(void *conn);

/* Connect, AUTH and SELECT as the URL says. Dies on failure. */
redisContext *bench_raw_connect(const bench_endpoint *ep);

/*
 * Send one command and check the reply's type (and, for a status reply, its
 * text when expect_status is not NULL). Dies on any mismatch. The reply is
 * freed.
 */
void bench_raw_expect(redisContext *c, int type, const char *expect_status, const char *fmt,
                      ...);

/* ------------------------------------------------------------------------
 * series.c: latency samples and their percentiles
 * ---------------------------------------------------------------------- */

/* Latency samples in nanoseconds: n of them in v, room for cap; {0} is
 * empty. The owner frees v. */
typedef struct {
    int64_t *v;
    size_t n, cap;
} bench_series;

/* Append one sample, doubling the room when it is full. Dies when out of
 * memory. */
void bench_series_add(bench_series *s, int64_t ns);

/* Nearest-rank percentile p (0..100] of the samples, in microseconds (0
 * when there are none). Sorts the samples in place. */
double bench_series_us(bench_series *s, double p);

/* Sort n doubles in ascending order (throughput's rates, for their
 * median). */
void bench_sort_doubles(double *v, size_t n);

/* ------------------------------------------------------------------------
 * etcd.c: dlock-bench --etcd
 * ---------------------------------------------------------------------- */

/* The etcd section: cycle and hand-off beside the raw /v3/kv/range round
 * trip. url NULL: a throwaway etcd from PATH. Returns the exit status. */
int bench_etcd(const char *url, long iterations);

/* One uncontended cycle on c: acquire name (10 s lease, no watchdog, no
 * wait) and release it, its time added to s (NULL: a warm-up). Dies when a
 * call fails. (bench/server.c; --sentinel and --cluster.) */
void bench_cycle(dlock_client *c, const char *name, bench_series *s);

/*
 * Operations a second of nthreads threads (at most 64), thread i calling
 * op(args[i]) in a loop: 50 untimed calls each, then all start together,
 * and the result is the median of the rates over the 100 ms slices of
 * seconds, so that a moment of outside load (a neighbour on the host of a
 * virtual machine) does not decide it. (bench/throughput.c)
 */
double bench_throughput(int nthreads, double seconds, void (*op)(void *arg), void *const *args);

/* One raw PING on raw, its round trip added to s. Dies when it fails. */
void bench_timed_ping(redisContext *raw, bench_series *s);

/* The hand-off's B: count times, waits for go, acquires name on c (waiting
 * forever, lease_ms if not 0), notes when the call returned (end) and the
 * fence, releases, posts done. Dies on failure. */
typedef struct {
    dlock_client *c;
    const char *name;
    long count;
    long lease_ms;
    sem_t go, done;
    int64_t end;
    uint64_t fence;
} bench_waiter;

void *bench_waiter_main(void *arg);

/* Bind a loopback TCP socket to port (0: any) and close it: the port it
 * got, or -1 when port is taken. */
int bench_bind_port(int port);
/* A free TCP port on 127.0.0.1 (bound, read, closed: free a moment ago). */
int bench_free_port(void);

/* ------------------------------------------------------------------------
 * redlock.c: dlock-bench --redlock
 * ---------------------------------------------------------------------- */

/* Cycle and hand-off on 5 nodes beside 5 parallel PINGs and node-redlock.
 * url NULL: 5 throwaway redis-servers. Returns the exit status. */
int bench_redlock(const char *url, long iterations);

/* --sentinel (bench/sentinel.c): min_replicas=1's cycle beside 0's and a
 * raw PING to the master. */
int bench_sentinel(const char *url, long iterations);

/* --cluster (bench/cluster.c): the cycle on Redis Cluster beside a raw PING
 * to the master of the lock's slot. url NULL: 3 throwaway masters. */
int bench_cluster(const char *url, long iterations);

/* --async (bench/async.c): the async API's cycle and hand-off beside the
 * blocking API's, then `waiters` async waiters on one client and one loop
 * thread (RSS and threads, the time to grant them all). url NULL: the
 * throwaway redis-server. */
int bench_async(const char *url, long iterations, long waiters);

/* ------------------------------------------------------------------------
 * postgres.c: dlock-bench --postgres
 * ---------------------------------------------------------------------- */

/* Each mode's cycle beside the same statements sent raw through libpq,
 * and the ratio. url NULL: a throwaway PostgreSQL. Returns the exit
 * status. */
int bench_postgres(const char *url, long iterations);

/* ------------------------------------------------------------------------
 * mysql.c: dlock-bench --mysql
 * ---------------------------------------------------------------------- */

/* The same for MySQL / MariaDB through libmariadb. url NULL: a throwaway
 * MariaDB. Returns the exit status. */
int bench_mysql(const char *url, long iterations);

/* ------------------------------------------------------------------------
 * sql_count.c: what the SQL sections send
 * ---------------------------------------------------------------------- */

/* send() and connect() calls of this process so far. */
void bench_sql_count(long *sends, long *connects);

/* One cycle of kind w of a SQL section (timed into s when not NULL). */
typedef void (*bench_sql_one_fn)(void *ctx, int w, bench_series *s);

/*
 * A SQL section's measurement of its n kinds of cycle: a warm-up, then
 * iterations cycles of each kind, cycle by cycle, each kind in turn (a
 * machine whose speed changes every few seconds changes it for all of them
 * alike), into s[w]; then p50[w], and the requests and new sessions per
 * cycle of each kind (req[w], conn[w], over 200 more cycles).
 */
void bench_sql_measure(void *ctx, bench_sql_one_fn one, int n, long iterations, bench_series *s,
                       double *p50, double *req, double *conn);

/* The table's header, and the block of what each kind sends. */
void bench_sql_print_header(void);
void bench_sql_print_sends(const char *const *labels, int n, const double *req,
                           const double *conn);

/* ------------------------------------------------------------------------
 * peer.c: a peer library in a child process, driven over pipes
 * ---------------------------------------------------------------------- */

/* Its protocol: it prints "ready" once connected and warmed up, answers
 * each command line ("cycles N" ...) with "ok", and "report" with its
 * figures on one line, then exits. */
typedef struct {
    pid_t pid;
    FILE *to, *from; /* NULL once stopped */
    char why[256];   /* why it stopped early */
    char name[128];  /* what to say when it ends without a word */
} bench_peer;

/* Start argv (execvp; env: NULL or NAME, VALUE, ..., NULL set in the
 * child); on return it is ready, or stopped with why (its first line, or
 * fail_why). */
void bench_peer_start(bench_peer *p, char *const argv[], char *const env[], const char *fail_why);
/* A line from the peer; 0 at its end. */
int bench_peer_line(bench_peer *p, char *line, size_t size);
/* Stop it (why: NULL for a normal end). */
void bench_peer_stop(bench_peer *p, const char *why);
/* "cmd n" (n < 0: "cmd"), answered "ok"; else it is stopped, with why. */
void bench_peer_cmd(bench_peer *p, const char *cmd, long n);
/* "report": its n numbers into v; 1 when all came (the first > 0), else 0
 * and it is stopped with why. It is stopped either way. */
int bench_peer_report(bench_peer *p, double *v, int n);

/* ------------------------------------------------------------------------
 * zk.c: dlock-bench --zk
 * ---------------------------------------------------------------------- */

/* The cycle beside Curator's InterProcessMutex and the raw C client's
 * calls. url NULL: a throwaway ZooKeeper. Returns the exit status. */
int bench_zk(const char *url, long iterations);

/* ------------------------------------------------------------------------
 * main.c: the table
 * ---------------------------------------------------------------------- */

/* The table's two header lines (measurement, p50 us, ... result). */
void bench_print_header(void);

/* One row of the table. Numbers < 0 print as "-"; target <= 0 means none. */
void bench_print_row(const char *name, double p50, double p99, double ops, const char *baseline,
                     double ratio, double target);

/* ------------------------------------------------------------------------
 * family.c: the lock family's hand-offs
 * ---------------------------------------------------------------------- */

/*
 * Rows for the hand-off latency of the fair lock (release -> the head of
 * the queue) and of the read-write lock (writer -> waiting reader, last
 * reader -> waiting writer), count each, beside the PING and the mutex
 * hand-off medians measured in the same section. Keys under key_base.
 * Returns how many hand-offs broke exclusion (must be 0).
 */
long bench_family(const char *url, const char *key_base, long count, double ping50_us,
                  double mutex_handoff50_us);

/* url with its password, if any, shown as "***" (a static buffer). */
const char *bench_redacted(const char *url);

#endif /* DLOCK_BENCH_H */
