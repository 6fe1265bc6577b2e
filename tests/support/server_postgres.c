/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The test servers "postgres" (the lease table) and "postgres-advisory"
 * (the URL's mode=advisory: session advisory locks) on a private
 * PostgreSQL (test_pg.c; both built only with PostgreSQL).
 */
#include "test_pg.h"
#include "test_server.h"

static int advisory(const test_server *s)
{
    return strstr(s->url, "mode=advisory") != NULL;
}

static void pg_start(test_server *s, const char *mode)
{
    s->pg = calloc(1, sizeof(*s->pg));
    CHECK(s->pg != NULL);
    test_pg_start(s->pg);
    snprintf(s->plain_url, sizeof(s->plain_url), "%s%s", s->pg->url, mode);
    s->url = s->plain_url;
}

static void pg_lease_start(test_server *s)
{
    pg_start(s, "");
}

static void pg_advisory_start(test_server *s)
{
    pg_start(s, "?mode=advisory");
}

/* Freed here, as Sentinel's and Cluster's: test_pg_stop took it off the
 * exit list, which kept it reachable for LeakSanitizer. */
static void pg_stop(test_server *s)
{
    test_pg_stop(s->pg);
    free(s->pg);
    s->pg = NULL;
}

static void pg_pause(test_server *s, int paused)
{
    test_pg_pause(s->pg, paused);
}

static void hex(char *out, const char *name)
{
    static const char d[] = "0123456789abcdef";
    const char *all[2] = {"dlock:", name};
    size_t n = 0;

    for (int k = 0; k < 2; k++)
        for (const unsigned char *q = (const unsigned char *)all[k]; *q; q++) {
            out[n++] = d[*q >> 4];
            out[n++] = d[*q & 15];
        }
    out[n] = '\0';
}

static long long pg_leftovers(test_server *s, const char *name)
{
    char h[2 * (DLOCK_NAME_MAX + 8) + 1];
    unsigned long long k = test_pg_advisory_key(name);
    long long family = 0;

    if (advisory(s))
        return test_pg_query(s->pg,
                             "/* dlock-test */ SELECT count(*) FROM pg_locks WHERE locktype = "
                             "'advisory' AND classid = %u AND objid = %u AND objsubid = 1",
                             (unsigned)(k >> 32), (unsigned)(k & 0xffffffffu));
    hex(h, name);
    /* A free row keeps the name's fence: it counts as the fence counter;
     * so does the family's anchor row (id ''), which keeps N too. Live
     * holds and waiters' places count. */
    if (test_pg_query(s->pg, "/* dlock-test */ SELECT count(*) FROM pg_class WHERE relname = "
                             "'dlock_locks_family'") > 0)
        family = test_pg_query(s->pg,
                               "/* dlock-test */ SELECT count(*) FROM dlock_locks_family WHERE "
                               "name = decode('%s', 'hex') AND id <> '' AND "
                               "expires > clock_timestamp()",
                               h);
    return family + test_pg_query(s->pg,
                         "/* dlock-test */ SELECT count(*) FROM dlock_locks WHERE name = "
                         "decode('%s', 'hex') AND tokens IS NOT NULL AND "
                         "expires > clock_timestamp()",
                         h);
}

static int pg_held(test_server *s, const char *name)
{
    return pg_leftovers(s, name) > 0;
}

static long long pg_requests(test_server *s)
{
    return test_pg_query(s->pg, "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                                " WHERE (query LIKE '%%dlock_locks%%' OR query LIKE "
                                "'%%pg_backend_pid()%%') AND query NOT LIKE '%%dlock-test%%'"
                                " AND query NOT LIKE '%%pg_stat_statements%%'");
}

/* As MySQL's short lease: with 300 ms (a renewal every 100 ms, the
 * watchdog's first one opening its connection) a loaded machine let
 * holders' leases run out (core threads_share_a_client, family
 * leader_killed_new_leader). */
const test_server_ops test_server_postgres = {
    .name = "postgres",
    .backend = "postgres",
    .short_lease_ms = 1000,
    .start = pg_lease_start,
    .stop = pg_stop,
    .pause = pg_pause,
    .held = pg_held,
    .leftovers = pg_leftovers,
    .requests = pg_requests,
};

const test_server_ops test_server_postgres_advisory = {
    .name = "postgres-advisory",
    .backend = "postgres",
    .short_lease_ms = 1000,
    .start = pg_advisory_start,
    .stop = pg_stop,
    .pause = pg_pause,
    .held = pg_held,
    .leftovers = pg_leftovers,
    .requests = pg_requests,
};
