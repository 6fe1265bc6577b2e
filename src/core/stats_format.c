/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock_stats_format: a client's counters (dlock_client_stats) as JSON or as
 * Prometheus' text exposition format 0.0.4. Pure: no I/O, no allocation.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "dlock/dlock.h"

/* The text so far: written into buf while it fits, counted in len always. */
typedef struct {
    char *buf;
    size_t size;
    size_t len;
} out_text;

static void put(out_text *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(out_text *o, const char *fmt, ...)
{
    va_list ap;
    int fits = o->len < o->size;
    int n;

    /* vsnprintf writes what fits of the piece after the text so far, and
     * NUL-terminates it there; past the end it only measures. */
    va_start(ap, fmt);
    n = vsnprintf(fits ? o->buf + o->len : NULL, fits ? o->size - o->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

/* text quoted: JSON string (json 1) or Prometheus label value (json 0). */
static void put_quoted(out_text *o, const char *text, int json)
{
    put(o, "\"");
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            put(o, "\\%c", *p);
        else if (*p == '\n')
            put(o, "\\n");
        else if (json && *p < 0x20)
            put(o, "\\u%04x", *p);
        else
            put(o, "%c", *p);
    }
    put(o, "\"");
}

static const struct {
    const char *name; /* JSON key; Prometheus: dlock_NAME_total */
    const char *help;
    size_t offset;
} counters[] = {
    {"acquires", "Acquisitions that succeeded.", offsetof(dlock_stats, acquires)},
    {"busy", "Tries the server answered held by another.", offsetof(dlock_stats, busy)},
    {"waits", "Acquisitions that waited for a release.", offsetof(dlock_stats, waits)},
    {"handoffs", "Acquisitions handed the lock by the holder's release.",
     offsetof(dlock_stats, handoffs)},
    {"renewals", "Leases renewed by the watchdog.", offsetof(dlock_stats, renewals)},
    {"renew_failures", "Renewals that could not reach the server.",
     offsetof(dlock_stats, renew_failures)},
    {"losses", "Locks found lost.", offsetof(dlock_stats, losses)},
};
#define NCOUNTERS (sizeof(counters) / sizeof(counters[0]))

static uint64_t counter(const dlock_stats *st, size_t i)
{
    uint64_t v;
    memcpy(&v, (const char *)st + counters[i].offset, sizeof v);
    return v;
}

static void json_buckets(out_text *o, const char *key, const uint64_t *h)
{
    put(o, ",\"%s\":[", key);
    for (int i = 0; i < DLOCK_STATS_BUCKETS; i++)
        put(o, "%s%" PRIu64, i ? "," : "", h[i]);
    put(o, "]");
}

static void format_json(out_text *o, const dlock_stats *st, const char *backend)
{
    put(o, "{");
    if (backend != NULL) {
        put(o, "\"backend\":");
        put_quoted(o, backend, 1);
        put(o, ",");
    }
    for (size_t i = 0; i < NCOUNTERS; i++)
        put(o, "%s\"%s\":%" PRIu64, i ? "," : "", counters[i].name, counter(st, i));
    json_buckets(o, "round_trip_us", st->round_trip_us);
    json_buckets(o, "wait_us", st->wait_us);
    if (st->version >= 2)
        put(o, ",\"round_trip_us_sum\":%" PRIu64 ",\"wait_us_sum\":%" PRIu64,
            st->round_trip_us_sum, st->wait_us_sum);
    put(o, "}\n");
}

/* name{backend="..."[,extra]} or name{extra} or name. */
static void prom_name(out_text *o, const char *name, const char *backend, const char *le)
{
    put(o, "%s", name);
    if (backend == NULL && le == NULL)
        return;
    put(o, "{");
    if (backend != NULL) {
        put(o, "backend=");
        put_quoted(o, backend, 0);
    }
    if (le != NULL)
        put(o, "%sle=\"%s\"", backend != NULL ? "," : "", le);
    put(o, "}");
}

/* sum_us: the times' sum, or NULL for none (a version 1 dlock_stats). */
static void prom_histogram(out_text *o, const char *name, const char *help, const uint64_t *h,
                           const uint64_t *sum_us, const char *backend)
{
    char metric[64], le[32];
    uint64_t total = 0;

    put(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    snprintf(metric, sizeof metric, "%s_bucket", name);
    /* Bucket i counts times under 2^i us (bucket 0: under 1 us); the last
     * one, every longer time, only in +Inf. */
    for (int i = 0; i < DLOCK_STATS_BUCKETS - 1; i++) {
        uint64_t us = (uint64_t)1 << i;
        char *end;

        total += h[i];
        /* us as seconds, exactly: 2^i is never a whole number of seconds,
         * so the fraction always stays; its trailing zeros go. */
        snprintf(le, sizeof le, "%" PRIu64 ".%06" PRIu64, us / 1000000, us % 1000000);
        end = le + strlen(le);
        while (end[-1] == '0')
            *--end = '\0';
        prom_name(o, metric, backend, le);
        put(o, " %" PRIu64 "\n", total);
    }
    total += h[DLOCK_STATS_BUCKETS - 1];
    prom_name(o, metric, backend, "+Inf");
    put(o, " %" PRIu64 "\n", total);
    if (sum_us != NULL) {
        snprintf(metric, sizeof metric, "%s_sum", name);
        prom_name(o, metric, backend, NULL);
        put(o, " %" PRIu64 ".%06" PRIu64 "\n", *sum_us / 1000000, *sum_us % 1000000);
    }
    snprintf(metric, sizeof metric, "%s_count", name);
    prom_name(o, metric, backend, NULL);
    put(o, " %" PRIu64 "\n", total);
}

static void format_prometheus(out_text *o, const dlock_stats *st, const char *backend)
{
    char metric[64];

    for (size_t i = 0; i < NCOUNTERS; i++) {
        snprintf(metric, sizeof metric, "dlock_%s_total", counters[i].name);
        put(o, "# HELP %s %s\n# TYPE %s counter\n", metric, counters[i].help, metric);
        prom_name(o, metric, backend, NULL);
        put(o, " %" PRIu64 "\n", counter(st, i));
    }
    prom_histogram(o, "dlock_round_trip_seconds",
                   "Round trips of the calls to the server for a lock, in seconds.",
                   st->round_trip_us, st->version >= 2 ? &st->round_trip_us_sum : NULL, backend);
    prom_histogram(o, "dlock_wait_seconds",
                   "How long acquisitions that waited waited, in seconds.", st->wait_us,
                   st->version >= 2 ? &st->wait_us_sum : NULL, backend);
}

int dlock_stats_format(char *buf, size_t size, const dlock_stats *st, const char *backend,
                       int format)
{
    out_text o = {buf, buf != NULL ? size : 0, 0};

    if (st == NULL || st->version < 1 ||
        (format != DLOCK_STATS_JSON && format != DLOCK_STATS_PROMETHEUS))
        return -1;
    if (o.size > 0)
        o.buf[0] = '\0';
    if (format == DLOCK_STATS_JSON)
        format_json(&o, st, backend);
    else
        format_prometheus(&o, st, backend);
    return o.len > (size_t)INT32_MAX ? -1 : (int)o.len;
}
