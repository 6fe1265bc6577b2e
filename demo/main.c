/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `dlock demo payout`: options, the embedded lock server, the modes one after
 * the other, and the table at the end.
 */
#include "demo.h"
#include "demo_int.h"
#include "redact.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: dlock demo payout [options]\n"
    "\n"
    "The payout job of the seed, run for real: several instance processes fire the\n"
    "same job each round, the lock holder is frozen (SIGSTOP) past its lease, and the\n"
    "store counts what got paid twice. Modes: nolock, ttl, fence-per-row, fence.\n"
    "\n"
    "  --url URL          lock server (default: a throwaway redis-server started here),\n"
    "  --lock URL         e.g. redis://..., etcd://..., postgres://..., mysql://... (the same option)\n"
    "  --store URL        postgres://..., mysql://... or a SQLite file path\n"
    "                     (default: a SQLite file in a temporary folder)\n"
    "  --instances N      instance processes (default 6)\n"
    "  --orders N         new pending orders before each round (default 20)\n"
    "  --rounds N         rounds per mode (default 10)\n"
    "  --ttl DUR          lock lease, e.g. 300ms, 2s (default 300ms)\n"
    "  --pay-time DUR     time a transfer takes before it commits (default 5ms)\n"
    "  --pause on|off     freeze the holder past its lease in some rounds (default on)\n"
    "  --mode MODE|all    nolock, ttl, fence-per-row, fence, a comma list, or all\n"
    "                     (default all)\n"
    "  --seed N           seed of the orders and the pauses (default: random, printed)\n"
    "  --report FILE      write a self-contained HTML page with a timeline per instance\n"
    "  --json FILE        write the results as JSON\n"
    "  --lock-name NAME   base lock name, the mode is appended (default dlock-demo:payout)\n"
    "  -v, --verbose      print every event as it happens\n"
    "  -h, --help         this text\n"
    "\n"
    "Exit status: 0 when the fence mode paid no order twice, 1 when it did, 64 usage,\n"
    "69 lock server or store unavailable, 70 other failure, 130 interrupted.\n";

/* ------------------------------------------------------------------------
 * Modes and signals
 * ---------------------------------------------------------------------- */

static const char *const mode_names[DEMO_MODE_COUNT] = {"nolock", "ttl", "fence-per-row", "fence"};

const char *demo_mode_name(demo_mode mode)
{
    return (unsigned)mode < DEMO_MODE_COUNT ? mode_names[mode] : "?";
}

int demo_mode_parse(const char *name)
{
    for (int m = 0; m < DEMO_MODE_COUNT; m++)
        if (strcmp(name, mode_names[m]) == 0)
            return m;
    return -1;
}

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

int demo_interrupted(void)
{
    return interrupted != 0;
}

typedef struct {
    struct sigaction intr, term, pipe;
} saved_signals;

static void signals_install(saved_signals *saved)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll() returns EINTR */
    interrupted = 0;
    sigaction(SIGINT, &sa, &saved->intr);
    sigaction(SIGTERM, &sa, &saved->term);
    sa.sa_handler = SIG_IGN; /* a dead instance's pipe gives EPIPE instead */
    sigaction(SIGPIPE, &sa, &saved->pipe);
}

static void signals_restore(const saved_signals *saved)
{
    sigaction(SIGINT, &saved->intr, NULL);
    sigaction(SIGTERM, &saved->term, NULL);
    sigaction(SIGPIPE, &saved->pipe, NULL);
}

/* ------------------------------------------------------------------------
 * Options
 * ---------------------------------------------------------------------- */

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    char buf[512], shown[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    /* An option's value may be a URL with a password (--url, --store). */
    cli_redact(shown, sizeof shown, buf);
    fprintf(stderr, "dlock demo: %s\n(see `dlock demo payout --help`)\n", shown);
    return DEMO_EXIT_USAGE;
}

static int parse_int(const char *opt, const char *text, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi)
        return usage_error("%s %s: expected a whole number from %lld to %lld", opt, text, lo, hi);
    *out = v;
    return 0;
}

static int parse_duration(const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v;
    if (dlock_duration_parse(&v, text) != DLOCK_OK || v < lo || v > hi)
        return usage_error("%s %s: expected a duration from %lldms to %lldms (like 300ms or 2s)",
                           opt, text, (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

static int parse_modes(const char *text, unsigned *out)
{
    if (strcmp(text, "all") == 0) {
        *out = (1u << DEMO_MODE_COUNT) - 1;
        return 0;
    }
    char buf[128];
    if (snprintf(buf, sizeof buf, "%s", text) >= (int)sizeof buf)
        return usage_error("--mode %s: too long", text);
    unsigned modes = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        int m = demo_mode_parse(tok);
        if (m < 0)
            return usage_error("--mode %s: unknown mode (nolock, ttl, fence-per-row, fence, all)",
                               tok);
        modes |= 1u << m;
    }
    if (modes == 0)
        return usage_error("--mode: no mode given");
    *out = modes;
    return 0;
}

/*
 * --url and --store may hold a password, and argv is the command line every
 * user can read (ps, /proc/PID/cmdline) for as long as the demo runs: keep
 * a copy and blank the argument, as `dlock run` does with --url. *slot
 * takes the copy (the last one given wins); drop_secret frees it.
 */
static void drop_secret(const char **slot)
{
    char *copy = (char *)*slot;
    if (copy != NULL) {
        explicit_bzero(copy, strlen(copy)); /* a memset before free may be optimised away */
        free(copy);
    }
    *slot = NULL;
}

static int take_secret(const char **slot, const char *val)
{
    drop_secret(slot);
    char *copy = strdup(val);
    if (copy == NULL) {
        demo_err("out of memory");
        return DEMO_EXIT_SOFTWARE;
    }
    memset((char *)val, '*', strlen(val));
    *slot = copy;
    return 0;
}

static int parse_options(demo_options *o, int argc, char **argv, int *help)
{
    long long v = 0; /* set by parse_int before use; gcc -O3 cannot tell */
    int seed_given = 0;
    *help = 0;
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            *help = 1;
            return 0;
        }
        if (strcmp(arg, "-v") == 0 || strcmp(arg, "--verbose") == 0) {
            o->verbose = 1;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0)
            return usage_error("unexpected argument: %s", arg);
        /* --name value or --name=value */
        char name[32];
        const char *val = NULL;
        const char *eq = strchr(arg, '=');
        size_t nlen = eq ? (size_t)(eq - arg) : strlen(arg);
        if (nlen >= sizeof name)
            return usage_error("unknown option: %s", arg);
        memcpy(name, arg, nlen);
        name[nlen] = '\0';
        if (eq != NULL) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", name);
            val = argv[++i];
        }
        if (strcmp(name, "--url") == 0 || strcmp(name, "--lock") == 0) {
            /* --lock is --url's other name: `--lock postgres://...` reads
             * well beside `--store postgres://...`. */
            if (take_secret(&o->url, val) != 0)
                return DEMO_EXIT_SOFTWARE;
        } else if (strcmp(name, "--store") == 0) {
            if (val[0] == '\0')
                return usage_error("--store: empty");
            if (take_secret(&o->store, val) != 0)
                return DEMO_EXIT_SOFTWARE;
        } else if (strcmp(name, "--instances") == 0) {
            if (parse_int(name, val, 2, DEMO_MAX_INSTANCES, &v) != 0)
                return DEMO_EXIT_USAGE;
            o->instances = (int)v;
        } else if (strcmp(name, "--orders") == 0) {
            if (parse_int(name, val, 1, 100000, &v) != 0)
                return DEMO_EXIT_USAGE;
            o->orders = (int)v;
        } else if (strcmp(name, "--rounds") == 0) {
            if (parse_int(name, val, 1, 10000, &v) != 0)
                return DEMO_EXIT_USAGE;
            o->rounds = (int)v;
        } else if (strcmp(name, "--ttl") == 0) {
            if (parse_duration(name, val, 10, 600000, &o->ttl_ms) != 0)
                return DEMO_EXIT_USAGE;
        } else if (strcmp(name, "--pay-time") == 0) {
            if (parse_duration(name, val, 0, 10000, &o->pay_ms) != 0)
                return DEMO_EXIT_USAGE;
        } else if (strcmp(name, "--pause") == 0) {
            if (strcmp(val, "on") == 0)
                o->pause = 1;
            else if (strcmp(val, "off") == 0)
                o->pause = 0;
            else
                return usage_error("--pause %s: expected on or off", val);
        } else if (strcmp(name, "--mode") == 0) {
            if (parse_modes(val, &o->modes) != 0)
                return DEMO_EXIT_USAGE;
        } else if (strcmp(name, "--seed") == 0) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(val, &end, 10);
            if (errno != 0 || end == val || *end != '\0' || val[0] == '-')
                return usage_error("--seed %s: expected a non-negative whole number", val);
            o->seed = s;
            seed_given = 1;
        } else if (strcmp(name, "--report") == 0) {
            o->report = val;
        } else if (strcmp(name, "--json") == 0) {
            o->json = val;
        } else if (strcmp(name, "--lock-name") == 0) {
            if (val[0] == '\0' || strlen(val) > 200)
                return usage_error("--lock-name: 1 to 200 bytes");
            o->lock_name = val;
        } else {
            return usage_error("unknown option: %s", name);
        }
    }
    if (!seed_given) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ (uint64_t)getpid();
        o->seed = demo_rand(&x) % 1000000;
    }
    if (o->ttl_ms <= 3 * o->pay_ms)
        return usage_error("--ttl %lldms must be longer than 3 x --pay-time (%lldms)",
                           (long long)o->ttl_ms, (long long)o->pay_ms);
    return 0;
}

/* ------------------------------------------------------------------------
 * Output
 * ---------------------------------------------------------------------- */

static void print_table(const demo_result *res, size_t n)
{
    printf("\n%-14s %6s %6s %6s %7s %7s %8s %8s %8s %7s\n", "", "", "", "", "", "double",
           "stale", "acquire", "acquire", "highest");
    printf("%-14s %6s %6s %6s %7s %7s %8s %8s %8s %7s\n", "mode", "rounds", "pauses", "orders",
           "payouts", "payouts", "refused", "p50 ms", "p99 ms", "fence");
    for (size_t k = 0; k < n; k++) {
        const demo_result *r = &res[k];
        if (!r->ran)
            continue;
        char p50[16] = "-", p99[16] = "-", fence[24] = "-";
        if (r->mode != DEMO_NOLOCK) {
            snprintf(p50, sizeof p50, "%.2f", r->p50_ms);
            snprintf(p99, sizeof p99, "%.2f", r->p99_ms);
            snprintf(fence, sizeof fence, "%" PRIu64, r->highest_fence);
        }
        printf("%-14s %6d %6d %6" PRId64 " %7" PRId64 " %7" PRId64 " %8" PRId64 " %8s %8s %7s\n",
               demo_mode_name(r->mode), r->rounds, r->pauses, r->orders, r->payouts,
               r->double_paid, r->refused, p50, p99, fence);
    }
    printf("\n");
    for (size_t k = 0; k < n; k++) {
        const demo_result *r = &res[k];
        if (!r->ran)
            continue;
        switch (r->mode) {
        case DEMO_NOLOCK:
            printf("  nolock         no lock: every instance pays every pending order it\n"
                   "                 reads (%" PRId64 " of %" PRId64 " orders paid more than once).\n",
                   r->double_paid, r->orders);
            break;
        case DEMO_TTL:
            printf("  ttl            a lease, renewed by the watchdog, checked before each\n"
                   "                 transfer: a holder frozen past its lease, once thawed,\n"
                   "                 commits the transfer it had prepared, and the next holder\n"
                   "                 pays it too (%" PRId64 " double payouts in %d pauses).\n",
                   r->double_paid, r->pauses);
            break;
        case DEMO_FENCE_ROW:
            printf("  fence-per-row  `... WHERE order_id = $o AND fence < $f` checks one row:\n"
                   "                 the stale holder writes its fence on an order the new\n"
                   "                 holder has not reached yet (the row is still at 0), then\n"
                   "                 the new holder's higher fence pays it again (%" PRId64 ").\n",
                   r->double_paid);
            break;
        case DEMO_FENCE:
            printf("  fence          the store keeps the job's highest fence; a holder registers\n"
                   "                 its fence before reading, and each transfer commits only if\n"
                   "                 that fence is still the highest: %" PRId64 " stale writes\n"
                   "                 refused, %" PRId64 " double payouts.\n",
                   r->refused, r->double_paid);
            break;
        default:
            break;
        }
    }
    fflush(stdout);
}

/* ------------------------------------------------------------------------
 * dlock_demo_main
 * ---------------------------------------------------------------------- */

/* The lock server given by --url must answer before instances are forked,
 * so a typo is one clear message rather than six. */
static int check_url(const char *url)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(&c, url, NULL);
    if (rc == DLOCK_OK) {
        dlock_client_free(c);
        return DEMO_EXIT_OK;
    }
    demo_dlock_err("--url", rc);
    return (rc == DLOCK_EINVAL || rc == DLOCK_ENOTSUP) ? DEMO_EXIT_USAGE : DEMO_EXIT_UNAVAILABLE;
}

static int make_tempdir(char *buf, size_t len)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0')
        tmp = "/tmp";
    if (snprintf(buf, len, "%s/dlock-demo-XXXXXX", tmp) >= (int)len) {
        demo_err("TMPDIR too long: %s", tmp);
        return -1;
    }
    if (mkdtemp(buf) == NULL) {
        demo_err("cannot create a temporary folder in %s: %s", tmp, strerror(errno));
        buf[0] = '\0';
        return -1;
    }
    return 0;
}

static int payout(demo_options *o)
{
    int status = DEMO_EXIT_SOFTWARE;
    char tmpdir[PATH_MAX] = "";
    char store_path[PATH_MAX + 16];
    char store_ns[64];
    demo_redis *redis = NULL;
    demo_result results[DEMO_MODE_COUNT];
    size_t nres = 0;
    const char *url = o->url;
    saved_signals saved;

    memset(results, 0, sizeof results);
    signals_install(&saved);

    if (make_tempdir(tmpdir, sizeof tmpdir) != 0)
        goto out;
    if (url == NULL) {
        status = demo_redis_start(&redis, tmpdir);
        if (status != DEMO_EXIT_OK)
            goto out;
        url = demo_redis_url(redis);
    } else {
        status = check_url(url);
        if (status != DEMO_EXIT_OK)
            goto out;
    }
    status = DEMO_EXIT_SOFTWARE;

    const char *store_spec = o->store;
    if (store_spec == NULL) {
        snprintf(store_path, sizeof store_path, "%s/store.db", tmpdir);
        store_spec = store_path;
    }
    /* The store must answer before anything is forked, like the lock server. */
    {
        char err[512];
        demo_store *st = demo_store_open(store_spec, "dlock_demo_check", err, sizeof err);
        if (st == NULL) {
            demo_err("store: %s", err);
            status = DEMO_EXIT_UNAVAILABLE;
            goto out;
        }
        demo_store_close(st);
    }
    /* A schema of this run's own, when the store is a shared PostgreSQL. */
    uint64_t nsr = o->seed ^ (uint64_t)getpid() ^ (uint64_t)demo_now_us();
    snprintf(store_ns, sizeof store_ns, "dlock_demo_%d_%06llx", (int)getpid(),
             (unsigned long long)(demo_rand(&nsr) & 0xffffff));

    printf("dlock demo payout: %d instances, %d orders a round, %d rounds, lease %lldms, "
           "transfer %lldms, pauses %s, seed %" PRIu64 "\n",
           o->instances, o->orders, o->rounds, (long long)o->ttl_ms, (long long)o->pay_ms,
           o->pause ? "on" : "off", o->seed);
    char url_shown[512], store_shown[512];
    demo_redact_url(url_shown, sizeof url_shown, url);
    demo_redact_url(store_shown, sizeof store_shown,
                    o->store ? o->store : "SQLite file in a temporary folder");
    if (redis != NULL)
        printf("lock server: throwaway redis-server at %s\n", url_shown);
    else
        printf("lock server: %s\n", url_shown);
    printf("store: %s\n", store_shown);
    fflush(stdout);

    for (int m = 0; m < DEMO_MODE_COUNT; m++) {
        if (!(o->modes & (1u << m)))
            continue;
        printf("running %-14s%s", demo_mode_name((demo_mode)m), o->verbose ? "\n" : "");
        fflush(stdout);
        demo_result *r = &results[nres++];
        int rc = demo_run_mode(r, o, (demo_mode)m, url, store_spec, store_ns);
        if (rc != DEMO_EXIT_OK) {
            printf("%s\n", rc == DEMO_EXIT_INTERRUPTED ? "interrupted" : "failed");
            if (r->first_error[0])
                demo_err("%s: %s", demo_mode_name((demo_mode)m), r->first_error);
            status = rc;
            goto out;
        }
        printf("%.1f s, %d pauses%s\n", (r->t1_us - r->t0_us) / 1e6, r->pauses,
               r->errors ? ", with errors" : "");
        if (r->errors)
            demo_err("%s: %d errors, the first: %s", demo_mode_name((demo_mode)m), r->errors,
                     r->first_error);
    }
    print_table(results, nres);

    int errors = 0, lost = 0;
    for (size_t k = 0; k < nres; k++) {
        errors += results[k].errors;
        if (results[k].mode == DEMO_FENCE && results[k].double_paid > 0)
            lost = 1;
    }
    int fence_ran = (o->modes & (1u << DEMO_FENCE)) != 0;
    if (fence_ran) {
        const demo_result *f = &results[nres - 1];
        if (lost)
            printf("FAILED: the fence mode paid %" PRId64 " orders twice.\n", f->double_paid);
        else
            printf("OK: the fence mode paid no order twice over %d pauses.\n", f->pauses);
    }
    status = lost ? DEMO_EXIT_LOST : errors ? DEMO_EXIT_SOFTWARE : DEMO_EXIT_OK;

    const char *store_kind = "sqlite";
    if (o->store != NULL && (strncmp(o->store, "postgres", 8) == 0))
        store_kind = "postgres";
    else if (o->store != NULL &&
             (strncmp(o->store, "mysql://", 8) == 0 || strncmp(o->store, "mariadb://", 10) == 0))
        store_kind = "mysql";
    if (o->json != NULL &&
        demo_json_write(o->json, o, store_kind, redis != NULL, results, nres, !lost) != 0 &&
        status == DEMO_EXIT_OK)
        status = DEMO_EXIT_SOFTWARE;
    if (o->report != NULL) {
        if (demo_report_write(o->report, o, redis != NULL ? "throwaway redis-server" : url_shown,
                              o->store ? store_shown : "SQLite (temporary)", results, nres) != 0) {
            if (status == DEMO_EXIT_OK)
                status = DEMO_EXIT_SOFTWARE;
        } else {
            printf("report: %s\n", o->report);
        }
    }

out:
    if (o->store != NULL && nres > 0) {
        /* Drop this run's schema (PostgreSQL); SQLite files are left as they are. */
        char err[512];
        demo_store *st = demo_store_open(o->store, store_ns, err, sizeof err);
        if (st != NULL) {
            if (demo_store_teardown(st) != 0)
                demo_err("store: %s", demo_store_error(st));
            demo_store_close(st);
        }
    }
    for (size_t k = 0; k < nres; k++)
        demo_result_free(&results[k]);
    demo_redis_stop(redis);
    demo_rmtree(tmpdir);
    if (demo_interrupted()) {
        demo_err("interrupted; stopped the instances%s and removed the temporary folder",
                 redis != NULL ? " and redis-server" : "");
        status = DEMO_EXIT_INTERRUPTED;
    }
    fflush(stdout);
    signals_restore(&saved);
    return status;
}

int dlock_demo_main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(usage_text, argc < 2 ? stderr : stdout);
        return argc < 2 ? DEMO_EXIT_USAGE : DEMO_EXIT_OK;
    }
    if (strcmp(argv[1], "payout") != 0)
        return usage_error("unknown demo: %s (the demo is `payout`)", argv[1]);

    demo_options o;
    memset(&o, 0, sizeof o);
    o.instances = 6;
    o.orders = 20;
    o.rounds = 10;
    o.pause = 1;
    o.ttl_ms = 300;
    o.pay_ms = 5;
    o.modes = (1u << DEMO_MODE_COUNT) - 1;
    o.lock_name = "dlock-demo:payout";
    int help;
    int rc = parse_options(&o, argc, argv, &help);
    if (rc == 0 && help) {
        fputs(usage_text, stdout);
    } else if (rc == 0 && o.store != NULL) {
        char err[512];
        if (demo_store_unsupported(o.store, err, sizeof err)) {
            demo_err("%s", err);
            rc = DEMO_EXIT_USAGE;
        }
    }
    if (rc == 0 && !help)
        rc = payout(&o);
    drop_secret(&o.url);
    drop_secret(&o.store);
    return rc;
}
