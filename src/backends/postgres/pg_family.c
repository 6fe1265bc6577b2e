/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family in lease mode (docs/postgres.md, "The lock family"): fair
 * locks, read-write locks, semaphores and leader election, in a companion
 * table TABLE_family beside the mutex's table:
 *
 *   name     the lock's name (key_prefix + name, bytes), as in TABLE
 *   id       ''       the name's anchor row: every acquisition locks it
 *                     first (FOR UPDATE), so the takes of one name run one
 *                     at a time; fence is the last one issued, permits N
 *            a token  a hold: kind, fence, owner, expires, holder, identity
 *            a waiter id (128 random bits, never a token: the NOTIFY
 *                     channel is readable by anyone allowed to LISTEN)
 *                     a waiter's place: a fair waiter's (kind 1) or a
 *                     waiting writer's (kind 3), arrival from the fence
 *                     sequence, expires W after its last refresh
 *
 * An acquisition is one statement, the function TABLE_family_acquire
 * (ddl_tmpl below), so one round trip: PL/pgSQL is used because in READ
 * COMMITTED each of a function's statements reads a fresh snapshot, so once
 * the anchor row is locked the function sees every hold committed before
 * (a plain statement keeps the snapshot it began with). Fences come from
 * the mutex's sequence, drawn under the anchor's lock: strictly increasing
 * for a name across every kind. Expiries are the server's clock
 * (clock_timestamp()). Release, extend, check, downgrade and set_permits
 * are single statements on one row (no anchor lock needed: they only
 * shrink or move what an acquisition reads); those that may let a waiter
 * in NOTIFY the table's channel with the name, as the mutex's release does
 * (pg_wait.c wakes that name's watches).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pg_int.h"

#define FAM_SQL_MAX 16384

static const char *fill(const dlock__pg_be *be, char *buf, size_t size, const char *tmpl)
{
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
    snprintf(buf, size, tmpl, be->table, be->seq);
#pragma GCC diagnostic pop
    return buf;
}

/* Run tmpl (the table's names filled in) with $1 the hex of name's key and,
 * unless NULL, $2 arg; its result in *r (PQclear it). */
static int by_name(dlock__pg_be *be, const char *tmpl, const char *name, const char *arg,
                   PGresult **r)
{
    char sql[FAM_SQL_MAX / 4], *hex;
    const char *p[2];
    int rc;

    if ((hex = dlock__pg_key_hex(be, name)) == NULL)
        return DLOCK_ENOMEM;
    p[0] = hex;
    p[1] = arg;
    rc = dlock__pg_cmd(be, fill(be, sql, sizeof(sql), tmpl), arg != NULL ? 2 : 1, p, r);
    free(hex);
    return rc;
}

/* ---- DDL ----------------------------------------------------------------- */

/*
 * TABLE_family_acquire(name, token, owner, kind, lease ms, holder,
 * reentrant, waiter id (NULL: a try), W ms, permits, identity) returns
 * {1, fence}, {0, retry ms}, {-1, why} (1: the owner holds it and may not
 * take it again; 2: a read by the owner of the write lock; 3: a write by an
 * owner that reads: upgrade) or {-2, 0} (a semaphore without N).
 */
static const char ddl_tmpl[] =
    "BEGIN;"
    "SELECT pg_advisory_xact_lock(7033184922370137);"
    "CREATE TABLE IF NOT EXISTS %1$s_family ("
    " name bytea NOT NULL,"
    " id text NOT NULL,"
    " kind smallint NOT NULL,"
    " fence bigint,"
    " arrival bigint,"
    " owner bytea,"
    " expires timestamptz NOT NULL,"
    " holder text,"
    " identity text,"
    " permits int,"
    " PRIMARY KEY (name, id));"
    "CREATE OR REPLACE FUNCTION %1$s_family_acquire(p_name bytea, p_token text, p_owner bytea,"
    " p_kind int, p_lease bigint, p_holder text, p_reentrant bool, p_wid text, p_ttl bigint,"
    " p_permits int, p_identity text) RETURNS bigint[] LANGUAGE plpgsql AS $dlock$\n"
    "DECLARE\n"
    " v_now timestamptz; v_f bigint; v_n int; v_cnt bigint; v_busy bigint; v_head text;\n"
    " v_left bigint; v_lease interval := p_lease * interval '1 millisecond';\n"
    " v_refresh bigint := GREATEST(1, p_ttl / 3);\n"
    "BEGIN\n"
    " INSERT INTO %1$s_family AS a (name, id, kind, fence, expires)\n"
    "  VALUES (p_name, '', -1, 0, 'infinity') ON CONFLICT (name, id) DO NOTHING;\n"
    " SELECT a.permits INTO v_n FROM %1$s_family a WHERE a.name = p_name AND a.id = ''\n"
    "  FOR UPDATE;\n"
    " v_now := clock_timestamp();\n"
    " DELETE FROM %1$s_family h WHERE h.name = p_name AND h.id <> '' AND h.expires <= v_now;\n"
    /* A retry after a lost reply: the hold it took, with its fence. */
    " UPDATE %1$s_family h SET expires = GREATEST(h.expires, v_now + v_lease)\n"
    "  WHERE h.name = p_name AND h.id = p_token AND h.fence IS NOT NULL RETURNING h.fence\n"
    "  INTO v_f;\n"
    " IF v_f IS NOT NULL THEN RETURN ARRAY[1, v_f]; END IF;\n"
    " IF p_kind IN (1, 5) THEN\n"
    "  IF p_owner IS NOT NULL THEN\n"
    "   SELECT h.fence INTO v_f FROM %1$s_family h WHERE h.name = p_name AND h.id <> ''\n"
    "    AND h.fence IS NOT NULL AND h.owner = p_owner LIMIT 1;\n"
    "   IF v_f IS NOT NULL THEN\n"
    "    IF NOT p_reentrant THEN RETURN ARRAY[-1, 1]; END IF;\n"
    /* A re-entry: one more hold of the owner, the same fence; the holds
     * share the longest lease. */
    "    UPDATE %1$s_family h SET expires = GREATEST(h.expires, v_now + v_lease)\n"
    "     WHERE h.name = p_name AND h.id <> '' AND h.fence IS NOT NULL AND h.owner = p_owner;\n"
    "    SELECT max(h.expires) INTO v_now FROM %1$s_family h WHERE h.name = p_name\n"
    "     AND h.id <> '' AND h.fence IS NOT NULL AND h.owner = p_owner;\n"
    "    INSERT INTO %1$s_family (name, id, kind, fence, owner, expires, holder, identity)\n"
    "     VALUES (p_name, p_token, p_kind, v_f, p_owner, v_now, p_holder, p_identity);\n"
    "    RETURN ARRAY[1, v_f];\n"
    "   END IF;\n"
    "  END IF;\n"
    "  SELECT ceil(extract(epoch FROM max(h.expires) - v_now) * 1000)::bigint INTO v_busy\n"
    "   FROM %1$s_family h WHERE h.name = p_name AND h.id <> '' AND h.fence IS NOT NULL;\n"
    "  IF p_kind = 1 THEN\n"
    /* Free, but the head of the queue is another waiter: it comes first. */
    "   IF v_busy IS NULL THEN\n"
    "    SELECT h.id, ceil(extract(epoch FROM h.expires - v_now) * 1000)::bigint\n"
    "     INTO v_head, v_left FROM %1$s_family h WHERE h.name = p_name\n"
    "     AND h.arrival IS NOT NULL AND h.kind = 1 ORDER BY h.arrival LIMIT 1;\n"
    "    IF v_head IS NOT NULL AND v_head IS DISTINCT FROM p_wid THEN\n"
    "     v_busy := GREATEST(v_left, 0);\n"
    "    END IF;\n"
    "   END IF;\n"
    "   IF v_busy IS NOT NULL AND p_wid IS NOT NULL THEN\n"
    "    UPDATE %1$s_family h SET expires = v_now + p_ttl * interval '1 millisecond'\n"
    "     WHERE h.name = p_name AND h.id = p_wid AND h.arrival IS NOT NULL;\n"
    "    IF NOT FOUND THEN\n"
    "     INSERT INTO %1$s_family (name, id, kind, arrival, expires) VALUES (p_name, p_wid,\n"
    "      1, nextval('%2$s'), v_now + p_ttl * interval '1 millisecond');\n"
    "    END IF;\n"
    "    v_busy := LEAST(v_busy, v_refresh);\n"
    "   END IF;\n"
    "  END IF;\n"
    "  IF v_busy IS NOT NULL THEN RETURN ARRAY[0, GREATEST(v_busy, 0)]; END IF;\n"
    " ELSIF p_kind = 2 THEN\n"
    "  IF p_owner IS NOT NULL AND EXISTS (SELECT 1 FROM %1$s_family h WHERE h.name = p_name\n"
    "    AND h.id <> '' AND h.fence IS NOT NULL AND h.kind = 3 AND h.owner = p_owner) THEN\n"
    "   RETURN ARRAY[-1, 2];\n"
    "  END IF;\n"
    "  SELECT ceil(extract(epoch FROM max(h.expires) - v_now) * 1000)::bigint INTO v_busy\n"
    "   FROM %1$s_family h WHERE h.name = p_name AND h.id <> '' AND h.fence IS NOT NULL\n"
    "   AND h.kind <> 2;\n"
    /* Writer preference: a waiting writer's place keeps new readers out,
     * but not a nested read of an owner that reads already. */
    "  IF v_busy IS NULL AND NOT (p_owner IS NOT NULL AND EXISTS (SELECT 1 FROM %1$s_family h\n"
    "    WHERE h.name = p_name AND h.id <> '' AND h.fence IS NOT NULL AND h.kind = 2\n"
    "    AND h.owner = p_owner)) THEN\n"
    "   SELECT ceil(extract(epoch FROM max(h.expires) - v_now) * 1000)::bigint INTO v_busy\n"
    "    FROM %1$s_family h WHERE h.name = p_name AND h.arrival IS NOT NULL AND h.kind = 3;\n"
    "  END IF;\n"
    "  IF v_busy IS NOT NULL THEN RETURN ARRAY[0, GREATEST(v_busy, 0)]; END IF;\n"
    " ELSIF p_kind = 3 THEN\n"
    "  IF p_owner IS NOT NULL THEN\n"
    "   IF EXISTS (SELECT 1 FROM %1$s_family h WHERE h.name = p_name AND h.id <> ''\n"
    "     AND h.fence IS NOT NULL AND h.kind = 3 AND h.owner = p_owner) THEN\n"
    "    RETURN ARRAY[-1, 1];\n"
    "   END IF;\n"
    "   IF EXISTS (SELECT 1 FROM %1$s_family h WHERE h.name = p_name AND h.id <> ''\n"
    "     AND h.fence IS NOT NULL AND h.kind = 2 AND h.owner = p_owner) THEN\n"
    "    RETURN ARRAY[-1, 3];\n"
    "   END IF;\n"
    "  END IF;\n"
    "  SELECT ceil(extract(epoch FROM max(h.expires) - v_now) * 1000)::bigint INTO v_busy\n"
    "   FROM %1$s_family h WHERE h.name = p_name AND h.id <> '' AND h.fence IS NOT NULL;\n"
    "  IF v_busy IS NOT NULL THEN\n"
    "   IF p_wid IS NOT NULL THEN\n"
    "    UPDATE %1$s_family h SET expires = v_now + p_ttl * interval '1 millisecond'\n"
    "     WHERE h.name = p_name AND h.id = p_wid AND h.arrival IS NOT NULL;\n"
    "    IF NOT FOUND THEN\n"
    "     INSERT INTO %1$s_family (name, id, kind, arrival, expires) VALUES (p_name, p_wid,\n"
    "      3, nextval('%2$s'), v_now + p_ttl * interval '1 millisecond');\n"
    "    END IF;\n"
    "    v_busy := LEAST(v_busy, v_refresh);\n"
    "   END IF;\n"
    "   RETURN ARRAY[0, GREATEST(v_busy, 0)];\n"
    "  END IF;\n"
    " ELSIF p_kind = 4 THEN\n"
    "  IF v_n IS NULL THEN\n"
    "   IF p_permits IS NULL OR p_permits < 1 THEN RETURN ARRAY[-2, 0]; END IF;\n"
    "   UPDATE %1$s_family a SET permits = p_permits WHERE a.name = p_name AND a.id = '';\n"
    "   v_n := p_permits;\n"
    "  END IF;\n"
    "  SELECT count(*), ceil(extract(epoch FROM min(h.expires) - v_now) * 1000)::bigint\n"
    "   INTO v_cnt, v_busy FROM %1$s_family h WHERE h.name = p_name AND h.id <> ''\n"
    "   AND h.fence IS NOT NULL;\n"
    "  IF v_cnt >= v_n THEN RETURN ARRAY[0, GREATEST(v_busy, 0)]; END IF;\n"
    " ELSE\n"
    "  RAISE EXCEPTION 'dlock: unknown lock kind %%', p_kind;\n"
    " END IF;\n"
    /* Taken: the waiter's place goes, the fence is drawn under the lock. */
    " IF p_wid IS NOT NULL THEN\n"
    "  DELETE FROM %1$s_family h WHERE h.name = p_name AND h.id = p_wid\n"
    "   AND h.arrival IS NOT NULL;\n"
    " END IF;\n"
    " v_f := nextval('%2$s');\n"
    " INSERT INTO %1$s_family (name, id, kind, fence, owner, expires, holder, identity)\n"
    "  VALUES (p_name, p_token, p_kind, v_f, p_owner, v_now + v_lease, p_holder, p_identity);\n"
    " UPDATE %1$s_family a SET fence = v_f WHERE a.name = p_name AND a.id = '';\n"
    " IF p_kind = 5 THEN PERFORM pg_notify('%1$s', encode(p_name, 'hex')); END IF;\n"
    " RETURN ARRAY[1, v_f];\n"
    "END\n"
    "$dlock$;"
    "COMMIT";

static const char exists_tmpl[] = "SELECT to_regclass('%1$s_family') IS NOT NULL";

int dlock__pg_fam_create(dlock__pg_be *be, int create)
{
    char *sql = malloc(FAM_SQL_MAX);
    PGresult *r;
    int rc, have;

    if (sql == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    if ((rc = dlock__pg_cmd(be, fill(be, sql, FAM_SQL_MAX, exists_tmpl), 0, NULL, &r)) != DLOCK_OK)
        goto out;
    have = PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
    PQclear(r);
    be->has_family = have;
    if (have || !create)
        goto out; /* without it, the mutex still works; the family says why not */
    if ((rc = dlock__pg_cmd(be, fill(be, sql, FAM_SQL_MAX, ddl_tmpl), 0, NULL, &r)) != DLOCK_OK)
        goto out;
    PQclear(r);
    be->has_family = 1;
out:
    free(sql);
    return rc;
}

static int no_family(dlock__pg_be *be)
{
    if (be->has_family)
        return DLOCK_OK;
    return dlock_backend_fail(DLOCK_ESERVER,
                              "%s: table %s_family (the lock family's) does not exist, and "
                              "create=0 says not to create it (docs/postgres.md has the DDL)",
                              be->where, be->table);
}

/* ---- acquire ------------------------------------------------------------- */

static const char acquire_tmpl[] =
    "SELECT %1$s_family_acquire(decode($1, 'hex'), $2, decode($3, 'hex'), $4::int,"
    " $5::bigint, $6, $7::bool, $8, $9::bigint, $10::int, $11)";

/* W in dlock.h: how long a waiter's place lives past its last refresh. */
static int64_t waiter_ttl_ms(int64_t lease_ms)
{
    return lease_ms < 1000 ? 1000 : lease_ms > 30000 ? 30000 : lease_ms;
}

static int misuse(dlock__pg_be *be, const dlock_request *req, int64_t why)
{
    switch (why) {
    case 1:
        if (req->kind == DLOCK_KIND_WRITE)
            return dlock_backend_fail(DLOCK_EMISUSE, "%s: write lock '%s' is already held by "
                                      "this owner id (read-write locks are not reentrant)",
                                      be->where, req->name);
        return dlock_backend_fail(DLOCK_EMISUSE, "%s: lock '%s' is already held by this owner "
                                  "id and reentrant is off: set reentrant to take it again",
                                  be->where, req->name);
    case 2:
        return dlock_backend_fail(DLOCK_EMISUSE, "%s: read lock '%s' asked by the owner id that "
                                  "holds its write lock: downgrade the write lock instead "
                                  "(dlock_lock_downgrade)", be->where, req->name);
    case 3:
        return dlock_backend_fail(DLOCK_EMISUSE, "%s: write lock '%s' asked by an owner id that "
                                  "holds a read lock on it: upgrade is refused (two upgrading "
                                  "readers would wait for each other for ever); release the "
                                  "read lock first", be->where, req->name);
    default:
        return dlock_backend_fail(DLOCK_EPROTO, "%s: lock '%s': refused with reason %lld",
                                  be->where, req->name, (long long)why);
    }
}

/* "{a,b}" as the function returns it. */
static int parse_pair(const char *s, long long *a, long long *b)
{
    return sscanf(s, "{%lld,%lld}", a, b) == 2 ? 0 : -1;
}

int dlock__pg_fam_acquire(dlock__pg_be *be, const dlock_request *req, const char *wid,
                          dlock_acquire_result *out)
{
    char sql[FAM_SQL_MAX / 4], kind[8], lease[24], ttl[24], permits[16], *name, *owner = NULL;
    const char *p[11];
    long long status, value;
    PGresult *r;
    int rc;

    if ((rc = no_family(be)) != DLOCK_OK)
        return rc;
    if ((name = dlock__pg_key_hex(be, req->name)) == NULL)
        return DLOCK_ENOMEM;
    if (req->owner != NULL) {
        if ((owner = malloc(2 * strlen(req->owner) + 1)) == NULL) {
            free(name);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
        dlock__pg_hex(owner, req->owner, strlen(req->owner));
    }
    snprintf(kind, sizeof(kind), "%d", req->kind);
    snprintf(lease, sizeof(lease), "%lld", (long long)req->lease_ms);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)waiter_ttl_ms(req->lease_ms));
    snprintf(permits, sizeof(permits), "%d", req->permits);
    p[0] = name;
    p[1] = req->token;
    p[2] = owner;
    p[3] = kind;
    p[4] = lease;
    p[5] = req->holder;
    p[6] = req->reentrant ? "t" : "f";
    p[7] = wid;
    p[8] = ttl;
    p[9] = permits;
    p[10] = req->kind == DLOCK_KIND_LEADER ? req->identity : NULL;
    rc = dlock__pg_cmd(be, fill(be, sql, sizeof(sql), acquire_tmpl), 11, p, &r);
    free(name);
    free(owner);
    if (rc != DLOCK_OK)
        return rc;
    if (PQntuples(r) != 1 || PQgetisnull(r, 0, 0) ||
        parse_pair(PQgetvalue(r, 0, 0), &status, &value) != 0) {
        PQclear(r);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: acquire: unexpected reply", be->where);
    }
    PQclear(r);
    switch (status) {
    case 1:
        if (value <= 0)
            return dlock_backend_fail(DLOCK_EPROTO, "%s: acquire: fence %lld", be->where,
                                      value);
        out->fence = (uint64_t)value;
        return DLOCK_OK;
    case 0:
        out->retry_ms = value;
        return dlock_backend_fail(DLOCK_EBUSY, "%s: lock '%s' is held by another owner",
                                  be->where, req->name);
    case -2:
        return dlock_backend_fail(DLOCK_EINVAL, "%s: semaphore '%s' has no number of permits "
                                  "yet: give options.permits (or call "
                                  "dlock_semaphore_set_permits)", be->where, req->name);
    default:
        return misuse(be, req, value);
    }
}

/* ---- release, extend, check, downgrade, leave ------------------------------ */

/* $1 name (hex), $2 token. A row when it was ours; NOTIFY then: a fair
 * lock's release names the head of its queue ("HEX WAITER-ID"), which
 * wakes that waiter alone (pg_wait.c); the others wake every waiter of the
 * name, since several readers or permit holders may get in. */
static const char release_tmpl[] =
    "WITH d AS (DELETE FROM %1$s_family h WHERE h.name = decode($1, 'hex') AND h.id = $2"
    "  AND h.fence IS NOT NULL AND h.expires > clock_timestamp() RETURNING h.kind),"
    " q AS (SELECT h.id FROM %1$s_family h WHERE h.name = decode($1, 'hex')"
    "  AND h.arrival IS NOT NULL AND h.kind = 1 AND h.expires > clock_timestamp()"
    "  ORDER BY h.arrival LIMIT 1)"
    " SELECT d.kind, pg_notify('%1$s', CASE WHEN d.kind = 1 AND EXISTS (SELECT 1 FROM q)"
    "  THEN $1 || ' ' || (SELECT id FROM q) ELSE $1 END) FROM d";

static const char extend_tmpl[] =
    "UPDATE %1$s_family h SET expires = clock_timestamp() + $3::bigint * interval '1 millisecond'"
    " WHERE h.name = decode($1, 'hex') AND h.id = $2 AND h.fence IS NOT NULL"
    "  AND h.expires > clock_timestamp()";

static const char check_tmpl[] =
    "SELECT 1 FROM %1$s_family h WHERE h.name = decode($1, 'hex') AND h.id = $2"
    " AND h.fence IS NOT NULL AND h.expires > clock_timestamp()";

/* The read lease is set from now, as the core counts it from the request. */
static const char downgrade_tmpl[] =
    "WITH u AS (UPDATE %1$s_family h SET kind = 2,"
    "  expires = clock_timestamp() + $3::bigint * interval '1 millisecond'"
    "  WHERE h.name = decode($1, 'hex') AND h.id = $2 AND h.kind = 3 AND h.fence IS NOT NULL"
    "  AND h.expires > clock_timestamp() RETURNING h.id)"
    " SELECT u.id IS NOT NULL, pg_notify('%1$s', $1) FROM u";

/* $2 a waiter id: its place goes. A fair queue's head that leaves names
 * the next in line (who may find the lock free now); a writer that leaves
 * wakes the name's waiters (readers it held back); a fair waiter behind
 * the head wakes nobody. */
static const char leave_tmpl[] =
    "WITH d AS (DELETE FROM %1$s_family h WHERE h.name = decode($1, 'hex') AND h.id = $2"
    "  AND h.arrival IS NOT NULL RETURNING h.id, h.kind, h.arrival),"
    " q AS (SELECT h.id, h.arrival FROM %1$s_family h WHERE h.name = decode($1, 'hex')"
    "  AND h.arrival IS NOT NULL AND h.kind = 1 AND h.expires > clock_timestamp()"
    "  ORDER BY h.arrival LIMIT 2)"
    " SELECT pg_notify('%1$s', CASE WHEN d.kind = 1 THEN coalesce($1 || ' ' ||"
    "  (SELECT q.id FROM q WHERE q.id <> d.id ORDER BY q.arrival LIMIT 1), $1) ELSE $1 END)"
    " FROM d WHERE d.kind <> 1 OR d.arrival <= (SELECT min(q.arrival) FROM q)";

/* Run tmpl about name: $1 name, $2 id, [$3 lease]; the rows it touched or
 * returned in *rows. */
static int on_row(dlock__pg_be *be, const char *tmpl, const char *name_s, const char *id,
                  const int64_t *lease_ms, int *rows)
{
    char sql[FAM_SQL_MAX / 8], lease[24], *name;
    const char *p[3];
    PGresult *r;
    int rc;

    if ((rc = no_family(be)) != DLOCK_OK)
        return rc;
    if ((name = dlock__pg_key_hex(be, name_s)) == NULL)
        return DLOCK_ENOMEM;
    snprintf(lease, sizeof(lease), "%lld", lease_ms != NULL ? (long long)*lease_ms : 0LL);
    p[0] = name;
    p[1] = id;
    p[2] = lease;
    rc = dlock__pg_cmd(be, fill(be, sql, sizeof(sql), tmpl), lease_ms != NULL ? 3 : 2, p, &r);
    free(name);
    if (rc != DLOCK_OK)
        return rc;
    *rows = PQresultStatus(r) == PGRES_TUPLES_OK ? PQntuples(r) : atoi(PQcmdTuples(r));
    PQclear(r);
    return DLOCK_OK;
}

static int not_ours(dlock__pg_be *be, const dlock_request *req)
{
    return dlock_backend_fail(DLOCK_ELOST, "%s: lock '%s' is no longer held by this handle",
                              be->where, req->name);
}

int dlock__pg_fam_release(dlock__pg_be *be, const dlock_request *req)
{
    int rows, rc = on_row(be, release_tmpl, req->name, req->token, NULL, &rows);
    return rc != DLOCK_OK ? rc : rows == 1 ? DLOCK_OK : not_ours(be, req);
}

int dlock__pg_fam_extend(dlock__pg_be *be, const dlock_request *req)
{
    int rows, rc = on_row(be, extend_tmpl, req->name, req->token, &req->lease_ms, &rows);
    return rc != DLOCK_OK ? rc : rows == 1 ? DLOCK_OK : not_ours(be, req);
}

int dlock__pg_fam_check(dlock__pg_be *be, const dlock_request *req)
{
    int rows, rc = on_row(be, check_tmpl, req->name, req->token, NULL, &rows);
    return rc != DLOCK_OK ? rc : rows == 1 ? DLOCK_OK : not_ours(be, req);
}

int dlock__pg_fam_downgrade(dlock__pg_be *be, const dlock_request *req)
{
    int rows, rc = on_row(be, downgrade_tmpl, req->name, req->token, &req->lease_ms, &rows);
    return rc != DLOCK_OK ? rc : rows == 1 ? DLOCK_OK : not_ours(be, req);
}

int dlock__pg_fam_leave(dlock__pg_be *be, const char *name, const char *wid)
{
    int rows;
    return on_row(be, leave_tmpl, name, wid, NULL, &rows);
}

/* ---- semaphore permits, leader -------------------------------------------- */

static const char permits_tmpl[] =
    "WITH u AS (INSERT INTO %1$s_family AS a (name, id, kind, fence, expires, permits)"
    "  VALUES (decode($1, 'hex'), '', -1, 0, 'infinity', $2::int)"
    "  ON CONFLICT (name, id) DO UPDATE SET permits = EXCLUDED.permits RETURNING a.id)"
    " SELECT pg_notify('%1$s', $1) FROM u";

int dlock__pg_fam_set_permits(dlock__pg_be *be, const char *name, int permits)
{
    char n[16];
    PGresult *r;
    int rc;

    if ((rc = no_family(be)) != DLOCK_OK)
        return rc;
    snprintf(n, sizeof(n), "%d", permits);
    rc = by_name(be, permits_tmpl, name, n, &r);
    if (rc == DLOCK_OK)
        PQclear(r);
    return rc;
}

static const char leader_tmpl[] =
    "SELECT h.fence, ceil(extract(epoch FROM h.expires - clock_timestamp()) * 1000)::bigint,"
    " h.identity FROM %1$s_family h WHERE h.name = decode($1, 'hex') AND h.id <> ''"
    " AND h.kind = 5 AND h.fence IS NOT NULL AND h.expires > clock_timestamp()"
    " ORDER BY h.fence DESC LIMIT 1";

int dlock__pg_fam_leader_get(dlock__pg_be *be, const char *name, dlock_leader_info *out)
{
    PGresult *r;
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = no_family(be)) != DLOCK_OK ||
        (rc = by_name(be, leader_tmpl, name, NULL, &r)) != DLOCK_OK)
        return rc;
    if (PQntuples(r) == 1) {
        out->held = 1;
        out->fence = (uint64_t)dlock__pg_num(r, 0, 0);
        out->ttl_ms = dlock__pg_num(r, 0, 1);
        if (out->ttl_ms < 1)
            out->ttl_ms = 1;
        if (!PQgetisnull(r, 0, 2))
            snprintf(out->identity, sizeof(out->identity), "%s", PQgetvalue(r, 0, 2));
    }
    PQclear(r);
    return DLOCK_OK;
}

/* ---- status, holders, force release ---------------------------------------- */

/* The family's state of a name, in the columns of dlock__pg_fill_info and two
 * more: held, the last fence issued, the longest lease left, the oldest
 * holder's record (lowest fence), how many hold it, and what (a writer
 * when one does). FROM the anchor a LEFT JOIN its live holds h. */
#define FAM_INFO_COLS                                                                             \
    "count(h.id) > 0, a.fence,"                                                                   \
    " ceil(extract(epoch FROM max(h.expires) - clock_timestamp()) * 1000)::bigint,"               \
    " (array_agg(h.holder ORDER BY h.fence))[1], count(h.id),"                                    \
    " CASE WHEN bool_or(h.kind = 3) THEN 3 ELSE min(h.kind) END"

#define FAM_LIVE(a)                                                                               \
    "h.name = " a ".name AND h.id <> '' AND h.fence IS NOT NULL"                                  \
    " AND h.expires > clock_timestamp()"

static const char status_tmpl[] =
    "SELECT " FAM_INFO_COLS " FROM %1$s_family a LEFT JOIN %1$s_family h ON " FAM_LIVE("a")
    " WHERE a.name = decode($1, 'hex') AND a.id = '' GROUP BY a.name, a.fence";

/* Columns col.. as FAM_INFO_COLS writes them. */
void dlock__pg_fam_fill(dlock_lock_info *out, const PGresult *r, int row, int col)
{
    dlock__pg_fill_info(out, r, row, col);
    out->holders = out->held ? (int)dlock__pg_num(r, row, col + 4) : 0;
    out->kind = out->held ? (int)dlock__pg_num(r, row, col + 5) : -1;
    if (out->kind < DLOCK_KIND_MUTEX || out->kind > DLOCK_KIND_LEADER)
        out->kind = -1;
}

/* Run tmpl, a query of the family's state of name in FAM_INFO_COLS, and
 * merge its row into *out, which holds the mutex's (the held one wins; the
 * higher fence). */
static int merge_family(dlock__pg_be *be, const char *tmpl, const char *name,
                        dlock_lock_info *out)
{
    dlock_lock_info fam;
    PGresult *r;
    int rc;

    if (!be->has_family)
        return DLOCK_OK;
    if ((rc = by_name(be, tmpl, name, NULL, &r)) != DLOCK_OK)
        return rc;
    if (PQntuples(r) == 1) {
        uint64_t fence;

        dlock__pg_fam_fill(&fam, r, 0, 0);
        fence = out->fence > fam.fence ? out->fence : fam.fence;
        if (!out->held && fam.held)
            *out = fam;
        out->fence = fence;
    }
    PQclear(r);
    return DLOCK_OK;
}

int dlock__pg_fam_status(dlock__pg_be *be, const char *name, dlock_lock_info *out)
{
    return merge_family(be, status_tmpl, name, out);
}

/* Each holder: the mutex's row (one per token of a reentrant owner), then
 * the family's holds, each with its own fence, lease and record. */
static const char holders_tmpl[] =
    "WITH f AS (SELECT h.* FROM %1$s_family h WHERE h.name = decode($1, 'hex') AND h.id <> ''"
    "  AND h.fence IS NOT NULL AND h.expires > clock_timestamp()),"
    " w AS (SELECT bool_or(kind = 3) AS writer, count(*) AS n FROM f)"
    " SELECT true, o.fence,"
    "  ceil(extract(epoch FROM o.expires - clock_timestamp()) * 1000)::bigint, o.holder,"
    "  cardinality(o.tokens), 0"
    " FROM %1$s o, unnest(o.tokens) t WHERE o.name = decode($1, 'hex')"
    "  AND o.expires > clock_timestamp()"
    " UNION ALL"
    " SELECT true, f.fence,"
    "  ceil(extract(epoch FROM f.expires - clock_timestamp()) * 1000)::bigint, f.holder,"
    "  w.n, f.kind FROM f, w";

int dlock__pg_fam_holders(dlock__pg_be *be, const char *name, dlock_list_cb cb, void *payload)
{
    PGresult *r;
    int rc;

    if ((rc = no_family(be)) != DLOCK_OK ||
        (rc = by_name(be, holders_tmpl, name, NULL, &r)) != DLOCK_OK)
        return rc;
    for (int row = 0; row < PQntuples(r); row++) {
        dlock_lock_info info;

        dlock__pg_fam_fill(&info, r, row, 0);
        if (cb(name, &info, payload) != 0)
            break;
    }
    PQclear(r);
    return DLOCK_OK;
}

/* The state before (the statement's snapshot), then every hold gone. */
static const char force_tmpl[] =
    "WITH d AS (DELETE FROM %1$s_family x WHERE x.name = decode($1, 'hex') AND x.id <> ''"
    "  AND x.fence IS NOT NULL RETURNING x.id)"
    " SELECT " FAM_INFO_COLS ", (SELECT count(*) FROM d), pg_notify('%1$s', $1)"
    " FROM %1$s_family a LEFT JOIN %1$s_family h ON " FAM_LIVE("a")
    " WHERE a.name = decode($1, 'hex') AND a.id = '' GROUP BY a.name, a.fence";

int dlock__pg_fam_force_release(dlock__pg_be *be, const char *name, dlock_lock_info *removed)
{
    return merge_family(be, force_tmpl, name, removed);
}

/* dlock_list's rows of the family: hex name after the key prefix, then
 * FAM_INFO_COLS; $1 key_prefix + prefix (hex), $2 the key prefix's length. */
static const char list_tmpl[] =
    "SELECT encode(substr(a.name, $2::int + 1), 'hex'), " FAM_INFO_COLS
    " FROM %1$s_family a JOIN %1$s_family h ON " FAM_LIVE("a")
    " WHERE a.id = '' AND substr(a.name, 1, length(decode($1, 'hex'))) = decode($1, 'hex')"
    " GROUP BY a.name, a.fence ORDER BY a.name";

int dlock__pg_fam_list(dlock__pg_be *be, const char *prefix, dlock_list_cb cb, void *payload)
{
    char sql[FAM_SQL_MAX / 8], plen[24], *hex;
    const char *p[2];
    PGresult *r;
    int rc;

    if (!be->has_family)
        return DLOCK_OK;
    if ((hex = dlock__pg_key_hex(be, prefix)) == NULL)
        return DLOCK_ENOMEM;
    snprintf(plen, sizeof(plen), "%zu", be->prefix_len);
    p[0] = hex;
    p[1] = plen;
    rc = dlock__pg_cmd(be, fill(be, sql, sizeof(sql), list_tmpl), 2, p, &r);
    free(hex);
    if (rc != DLOCK_OK)
        return rc;
    for (int row = 0; row < PQntuples(r); row++) {
        char name[DLOCK_NAME_MAX + 1];
        dlock_lock_info info;

        if (PQgetlength(r, row, 0) > 2 * DLOCK_NAME_MAX ||
            dlock__pg_unhex(name, PQgetvalue(r, row, 0)))
            continue;
        dlock__pg_fam_fill(&info, r, row, 1);
        if (cb(name, &info, payload) != 0)
            break;
    }
    PQclear(r);
    return DLOCK_OK;
}
