/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internal declarations of the payout demo, shared by its files.
 *
 * Process structure: the scheduler (the process that called dlock_demo_main)
 * forks one process per instance for each mode. Each instance opens its own
 * dlock client and its own store connection, then runs the payout job every
 * time the scheduler fires it. Instances report what they do as fixed-size
 * events over a pipe; the scheduler decides when to freeze one (SIGSTOP) and
 * when to let it carry on (SIGCONT).
 */
#ifndef DLOCK_DEMO_INT_H
#define DLOCK_DEMO_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "redis_embed.h" /* the embedded redis-server */

/* Exit statuses (see demo.h). */
#define DEMO_EXIT_OK 0
#define DEMO_EXIT_LOST 1
#define DEMO_EXIT_USAGE 64
#define DEMO_EXIT_UNAVAILABLE 69
#define DEMO_EXIT_SOFTWARE 70
#define DEMO_EXIT_INTERRUPTED 130

#define DEMO_MAX_INSTANCES 64

/* ------------------------------------------------------------------------
 * Modes
 * ---------------------------------------------------------------------- */

typedef enum {
    DEMO_NOLOCK,     /* every instance pays */
    DEMO_TTL,        /* the lock with a lease, no fencing */
    DEMO_FENCE_ROW,  /* the seed's per-row `... AND fence < $f` */
    DEMO_FENCE,      /* highest fence per job, registered before reading */
    DEMO_MODE_COUNT
} demo_mode;

const char *demo_mode_name(demo_mode mode);
/* -1 when name is not a mode. */
int demo_mode_parse(const char *name);

/* ------------------------------------------------------------------------
 * Options
 * ---------------------------------------------------------------------- */

typedef struct {
    const char *url;       /* lock server; NULL: embedded redis-server */
    const char *store;     /* NULL: SQLite file in the temporary folder */
    int instances;
    int orders;            /* new pending orders before each round */
    int rounds;
    int pause;             /* inject SIGSTOP pauses */
    int64_t ttl_ms;        /* the lease */
    int64_t pay_ms;        /* time one transfer takes before it commits */
    unsigned modes;        /* bit (1u << demo_mode) for each mode to run */
    uint64_t seed;
    const char *report;    /* HTML report path, or NULL */
    const char *json;      /* JSON results path, or NULL */
    const char *lock_name; /* base lock name; the mode is appended */
    int verbose;
} demo_options;

/* ------------------------------------------------------------------------
 * Events (instance -> scheduler) and commands (scheduler -> instance)
 *
 * Both are fixed-size and smaller than PIPE_BUF, so one write() is atomic:
 * an instance's main thread and its watchdog callback can both report on the
 * same pipe without interleaving.
 * ---------------------------------------------------------------------- */

typedef enum {
    EV_READY = 1,    /* instance opened its client and store */
    EV_ACQUIRED,     /* got the lock: fence, latency_us */
    EV_BUSY,         /* lock held by another: latency_us */
    EV_READ,         /* read the pending orders: count */
    EV_PAID,         /* a payment committed: order, fence */
    EV_REFUSED,      /* the store refused a stale payment: order, fence */
    EV_REG_REFUSED,  /* the store refused to register the fence */
    EV_PAUSE_POINT,  /* at the chosen point, waiting to be frozen or not */
    EV_LOST,         /* on_lost fired (watchdog thread): code */
    EV_DONE,         /* job over for this round: code = release result */
    EV_ERROR,        /* something failed: code, text */
    /* Recorded by the scheduler itself, for the timeline. */
    EV_FIRE,         /* job fired on the instance */
    EV_FROZEN,       /* SIGSTOP delivered */
    EV_EXPIRED,      /* the frozen holder's lease is gone */
    EV_RESUMED       /* SIGCONT delivered */
} demo_event_type;

typedef struct {
    int32_t type;
    int32_t instance;
    int32_t round;
    int32_t code;
    int64_t at_us;      /* CLOCK_MONOTONIC, comparable across processes */
    int64_t order;      /* order id, or a count */
    uint64_t fence;
    int64_t latency_us;
    char text[192];
} demo_event;

typedef enum {
    CMD_ROUND = 1,  /* run the job: round, pause_at */
    CMD_CONTINUE,   /* carry on after the pause point */
    CMD_QUIT
} demo_command_type;

typedef struct {
    int32_t type;
    int32_t round;
    int32_t pause_at; /* index in the batch where to stop, -1: none */
    int32_t unused;
} demo_command;

/* ------------------------------------------------------------------------
 * Store: the protected resource (orders and a ledger of transfers)
 * ---------------------------------------------------------------------- */

typedef struct demo_store demo_store;

/* Outcome of a payment or a registration. */
typedef enum { STORE_OK = 0, STORE_REFUSED = 1, STORE_ERROR = -1 } demo_store_result;

typedef struct {
    int64_t orders;
    int64_t payouts;        /* ledger rows */
    int64_t double_paid;    /* orders with more than one ledger row */
    int64_t unpaid;         /* orders still pending */
    int64_t *doubles;       /* ids of the double-paid orders, ascending */
    size_t ndoubles;
} demo_store_summary;

/*
 * Open a connection to the store described by spec: "postgres://..." or
 * "postgresql://...", else a SQLite file path (an optional "sqlite:" prefix
 * is removed). ns is a namespace (a PostgreSQL schema) private to this run,
 * ignored by SQLite. On failure returns NULL and writes the reason to err.
 */
demo_store *demo_store_open(const char *spec, const char *ns, char *err, size_t errlen);
void demo_store_close(demo_store *store);   /* NULL is a no-op */
/* "sqlite" or "postgres". */
const char *demo_store_kind(const demo_store *store);
/* The last failure on this connection, never NULL. */
const char *demo_store_error(const demo_store *store);
/* 1 when the spec names a backend this build cannot serve; err says why. */
int demo_store_unsupported(const char *spec, char *err, size_t errlen);

/* Scheduler side. */
int demo_store_setup(demo_store *store);      /* (re)create empty tables */
int demo_store_teardown(demo_store *store);   /* drop what setup made (PostgreSQL) */
int demo_store_add_orders(demo_store *store, int round, int count, uint64_t *rng);
int demo_store_summary_get(demo_store *store, demo_store_summary *out);
void demo_store_summary_free(demo_store_summary *summary);

/* Instance side. */
int demo_store_pending(demo_store *store, int64_t **ids, size_t *count);
demo_store_result demo_store_register(demo_store *store, uint64_t fence);
demo_store_result demo_store_pay(demo_store *store, demo_mode mode, int64_t order,
                                 uint64_t fence, int instance);

/* ------------------------------------------------------------------------
 * Pieces
 * ---------------------------------------------------------------------- */

/* Run one instance process until CMD_QUIT; returns its exit status. */
typedef struct {
    int index;
    int cmd_fd;
    int ev_fd;
    demo_mode mode;
    const char *url;
    const char *store_spec;
    const char *store_ns;
    const char *lock_name;   /* full name, mode included */
    int64_t ttl_ms;
    int64_t pay_ms;
} demo_instance_config;

int demo_instance_run(const demo_instance_config *cfg);

/* Results of one mode. */
typedef struct {
    demo_mode mode;
    int ran;
    int rounds;
    int pauses;
    int errors;
    int64_t orders;
    int64_t payouts;
    int64_t double_paid;
    int64_t refused;
    int64_t unpaid;
    int64_t acquires;      /* acquire attempts measured */
    double p50_ms, p99_ms;
    uint64_t highest_fence;
    int64_t t0_us, t1_us;  /* run span, for the report */
    demo_event *events;    /* everything that happened, in arrival order */
    size_t nevents;
    int64_t *doubles;      /* ids of double-paid orders */
    size_t ndoubles;
    char first_error[256];
} demo_result;

void demo_result_free(demo_result *result);

/* Run one mode: fork instances, fire the rounds, collect the results.
 * Returns a DEMO_EXIT_* status (0 when the run itself went through). */
int demo_run_mode(demo_result *out, const demo_options *opts, demo_mode mode,
                  const char *url, const char *store_spec, const char *store_ns);

int demo_report_write(const char *path, const demo_options *opts, const char *url_shown,
                      const char *store_shown, const demo_result *results, size_t n);
int demo_json_write(const char *path, const demo_options *opts, const char *store_kind,
                    int embedded, const demo_result *results, size_t n, int ok);

/* ------------------------------------------------------------------------
 * Utilities
 * ---------------------------------------------------------------------- */

int64_t demo_now_us(void);
void demo_sleep_us(int64_t us);
uint64_t demo_rand(uint64_t *state);
/* Uniform in [0, n), n > 0. */
uint64_t demo_rand_below(uint64_t *state, uint64_t n);
/* Error message on stderr, prefixed with "dlock demo: ". */
void demo_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* 1 once SIGINT or SIGTERM arrived. */
int demo_interrupted(void);
/* Write all of buf, retrying on EINTR; 0 or -1. */
int demo_write_all(int fd, const void *buf, size_t len);
/* Remove a directory tree; errors are ignored. */
void demo_rmtree(const char *path);
/* url with its password, if any, replaced by "***", into buf. */
void demo_redact_url(char *buf, size_t len, const char *url);
/* Print the last dlock failure of this thread as "what: detail". */
void demo_dlock_err(const char *what, int code);

#endif /* DLOCK_DEMO_INT_H */
