/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The statements of a PostgreSQL lock's cycle, one place for both their
 * users: the backend (pg_lease.c, pg_advisory.c), and dlock-bench
 * --postgres (bench/postgres.c), which sends the same text raw through
 * libpq beside dlock, so that its baseline is these statements and not a
 * copy that may drift. In lease mode's templates %1$s is the lock table
 * (also the NOTIFY channel), %2$s its fence sequence; advisory mode's say
 * what they take.
 */
#ifndef DLOCK_PG_SQL_H
#define DLOCK_PG_SQL_H

/* ---- lease mode (pg_lease.c) --------------------------------------------- */

/* $1 name (hex), $2 token, $3 owner (hex) or NULL, $4 lease ms, $5 holder,
 * $6 reentrant. One row: the fence when taken (else NULL), whether the
 * row was held before, its lease left then (ms), whether by this owner. */
static const char dlock__pg_acquire_tmpl[] =
    "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now),"
    " ins AS ("
    "  INSERT INTO %1$s AS t (name, tokens, owner, fence, expires, holder)"
    "  SELECT decode($1, 'hex'), ARRAY[$2::text], decode($3, 'hex'), nextval('%2$s'),"
    "         c.now + $4::bigint * interval '1 millisecond', $5::text FROM c"
    "  ON CONFLICT (name) DO UPDATE SET"
    "   tokens = CASE WHEN t.tokens IS NULL OR t.expires <= (SELECT now FROM c)"
    "                 THEN ARRAY[$2::text]"
    "                 WHEN $2::text = ANY(t.tokens) THEN t.tokens"
    "                 ELSE t.tokens || $2::text END,"
    "   fence = CASE WHEN t.tokens IS NULL OR t.expires <= (SELECT now FROM c)"
    "                THEN nextval('%2$s') ELSE t.fence END,"
    "   owner = CASE WHEN t.tokens IS NULL OR t.expires <= (SELECT now FROM c)"
    "                THEN EXCLUDED.owner ELSE t.owner END,"
    "   holder = CASE WHEN t.tokens IS NULL OR t.expires <= (SELECT now FROM c)"
    "                 THEN EXCLUDED.holder ELSE t.holder END,"
    "   expires = CASE WHEN t.tokens IS NULL OR t.expires <= (SELECT now FROM c)"
    "                  THEN EXCLUDED.expires ELSE GREATEST(t.expires, EXCLUDED.expires) END"
    "  WHERE t.tokens IS NULL OR t.expires <= (SELECT now FROM c)"
    "     OR $2::text = ANY(t.tokens) OR ($6::bool AND t.owner = decode($3, 'hex'))"
    "  RETURNING t.fence)"
    " SELECT (SELECT fence FROM ins),"
    "        o.tokens IS NOT NULL AND o.expires > c.now,"
    "        CASE WHEN o.expires > c.now"
    "             THEN ceil(extract(epoch FROM o.expires - c.now) * 1000)::bigint END,"
    "        o.owner IS NOT NULL AND o.owner = decode($3, 'hex')"
    " FROM c LEFT JOIN %1$s o ON o.name = decode($1, 'hex')";

/* $1 name (hex), $2 token. A row when it was ours; a NOTIFY when freed. */
static const char dlock__pg_release_tmpl[] =
    "WITH r AS ("
    " UPDATE %1$s SET"
    "  tokens = CASE WHEN cardinality(tokens) > 1 THEN array_remove(tokens, $2::text) END,"
    "  owner = CASE WHEN cardinality(tokens) > 1 THEN owner END,"
    "  holder = CASE WHEN cardinality(tokens) > 1 THEN holder END,"
    "  expires = CASE WHEN cardinality(tokens) > 1 THEN expires ELSE '-infinity' END"
    " WHERE name = decode($1, 'hex') AND $2::text = ANY(tokens) AND expires > clock_timestamp()"
    " RETURNING tokens IS NULL AS freed)"
    " SELECT freed, CASE WHEN freed THEN pg_notify('%1$s', $1) END FROM r";

/* ---- advisory mode (pg_advisory.c) ------------------------------------------ */

/* $1 the advisory key; %1$s the lease (ms) for idle_session_timeout, %2$s
 * the fence sequence. One row: the fence when taken, else NULL. The
 * session's lease is set with the lock, in the same statement, and only
 * when it was taken (OFFSET 0: the subquery, and its volatile calls, run
 * once). The lease is in the text, where pg_stat_activity shows it (a
 * connection prepares each text it sends: one or two leases a program). */
static const char dlock__pg_adv_acquire_tmpl[] =
    "SELECT f, CASE WHEN f IS NOT NULL"
    " THEN set_config('idle_session_timeout', '%1$lld', false) END"
    " FROM (SELECT CASE WHEN pg_try_advisory_lock($1::bigint) THEN nextval('%2$s') END AS f"
    " OFFSET 0) s";

/* $1 the advisory key, $2 the name (hex) for the waiters; %s the lock
 * table, whose channel they listen on. One row: whether it was held. */
static const char dlock__pg_adv_release_tmpl[] =
    "SELECT pg_advisory_unlock($1::bigint), pg_notify('%s', $2)";

#endif
