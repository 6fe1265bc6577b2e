/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL backend's schema: the tables and the stored procedures that
 * make acquisition one round trip, created on first use (open) unless the
 * URL says create=0. docs/mysql.md shows the same DDL for an administrator
 * who creates them by hand; the procedures carry a version in their name,
 * so a changed body is a new procedure, never an ALTER under running
 * clients.
 */
#include <stdio.h>
#include <string.h>

#include <mysqld_error.h>

#include "mysql_int.h"

/* The fence counter: one row whose AUTO_INCREMENT id is the last fence
 * issued. REPLACE deletes it and inserts the next id (the ticket-server
 * idiom), so the table stays one row and MAX(id), which InnoDB before
 * MySQL 8 / MariaDB 10.2.4 rebuilt the counter from after a restart, is
 * always the last fence issued. */
static const char fence_ddl[] =
    "CREATE TABLE IF NOT EXISTS dlock_fence (\n"
    "  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,\n"
    "  stub CHAR(1) NOT NULL UNIQUE\n"
    ") ENGINE=InnoDB";

/* Lease mode: a row per lock name (kept after release, with token '', so
 * status can show the last fence). */
static const char locks_ddl[] =
    "CREATE TABLE IF NOT EXISTS dlock_locks (\n"
    "  name VARBINARY(640) NOT NULL PRIMARY KEY,\n"
    "  token VARBINARY(64) NOT NULL,\n"
    "  fence BIGINT UNSIGNED NOT NULL,\n"
    "  expires DATETIME(6) NOT NULL,\n"
    "  holder VARBINARY(512) NULL\n"
    ") ENGINE=InnoDB";

/*
 * Lease mode's lock family (mysql_family.c): a row per hold (an owner id's
 * mutex, a fair holder, a writer, each reader, each permit, a leader) and
 * per place in a queue (waiting = 1: a fair waiter, a waiting writer's
 * marker), each with its own lease. seq is the arrival order. Every change
 * of a name's rows is made under the row lock of its dlock_locks row,
 * which then has token '*' while any hold lives (expiring with the last),
 * so the plain mutex's procedure finds the name taken.
 */
static const char holds_ddl[] =
    "CREATE TABLE IF NOT EXISTS dlock_holds (\n"
    "  seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,\n"
    "  name VARBINARY(640) NOT NULL,\n"
    "  token VARBINARY(64) NOT NULL,\n"
    "  kind TINYINT NOT NULL,\n"
    "  waiting TINYINT NOT NULL,\n"
    "  owner VARBINARY(128) NULL,\n"
    "  fence BIGINT UNSIGNED NOT NULL,\n"
    "  expires DATETIME(6) NOT NULL,\n"
    "  holder VARBINARY(512) NULL,\n"
    "  identity VARBINARY(256) NULL,\n"
    "  UNIQUE KEY name_token (name, token)\n"
    ") ENGINE=InnoDB";

/* A semaphore's number of permits, set by its first acquisition and by
 * dlock_semaphore_set_permits. */
static const char permits_ddl[] =
    "CREATE TABLE IF NOT EXISTS dlock_permits (\n"
    "  name VARBINARY(640) NOT NULL PRIMARY KEY,\n"
    "  permits INT NOT NULL\n"
    ") ENGINE=InnoDB";

/*
 * Lease mode's acquire, one CALL: take the row if it is free, expired by
 * the server's clock or already ours (a retry after a lost reply keeps its
 * fence), and issue the fence in the same transaction. The clock is
 * UTC_TIMESTAMP(6): the time the statement began, as NOW(6) is, so never
 * before the client sent the request, replayed as is by statement-based
 * replication (SYSDATE(6) is not), and in UTC, so no session time zone or
 * daylight-saving change moves it. Returns one row: (1, fence, 0) taken,
 * (0, fence, ms left) held by another.
 */
static const char acquire_ddl[] =
    "CREATE PROCEDURE dlock_acquire_v1(IN p_name VARBINARY(640), IN p_token VARBINARY(64),\n"
    "                                  IN p_lease_ms BIGINT, IN p_holder VARBINARY(512))\n"
    "MODIFIES SQL DATA\n"
    "BEGIN\n"
    "  DECLARE v_token VARBINARY(64);\n"
    "  DECLARE v_fence BIGINT UNSIGNED;\n"
    "  DECLARE v_left BIGINT;\n"
    "  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;\n"
    "  START TRANSACTION;\n"
    "  INSERT INTO dlock_locks (name, token, fence, expires) VALUES (p_name, '', 0, UTC_TIMESTAMP(6))\n"
    "    ON DUPLICATE KEY UPDATE name = name;\n"
    "  SELECT token, fence, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires)\n"
    "    INTO v_token, v_fence, v_left FROM dlock_locks WHERE name = p_name FOR UPDATE;\n"
    "  IF v_token = p_token THEN\n"
    "    UPDATE dlock_locks SET expires = UTC_TIMESTAMP(6) + INTERVAL p_lease_ms * 1000 MICROSECOND\n"
    "      WHERE name = p_name;\n"
    "    COMMIT;\n"
    "    SELECT 1, v_fence, 0;\n"
    "  ELSEIF v_token <> '' AND v_left > 0 THEN\n"
    "    COMMIT;\n"
    "    SELECT 0, v_fence, CEIL(v_left / 1000);\n"
    "  ELSE\n"
    "    REPLACE INTO dlock_fence (stub) VALUES ('f');\n"
    "    SET v_fence = LAST_INSERT_ID();\n"
    "    UPDATE dlock_locks SET token = p_token, fence = v_fence, holder = p_holder,\n"
    "      expires = UTC_TIMESTAMP(6) + INTERVAL p_lease_ms * 1000 MICROSECOND WHERE name = p_name;\n"
    "    COMMIT;\n"
    "    SELECT 1, v_fence, 0;\n"
    "  END IF;\n"
    "END";

/* Named mode: who took each user-level lock last (fence, holder record,
 * the connection that holds it and its idle limit), for status; the lock
 * itself is the server's GET_LOCK, held by that connection. */
static const char named_ddl[] =
    "CREATE TABLE IF NOT EXISTS dlock_named (\n"
    "  name VARBINARY(640) NOT NULL PRIMARY KEY,\n"
    "  lockname VARCHAR(64) NOT NULL,\n"
    "  fence BIGINT UNSIGNED NOT NULL,\n"
    "  conn BIGINT UNSIGNED NOT NULL,\n"
    "  lease_s INT UNSIGNED NOT NULL,\n"
    "  holder VARBINARY(512) NULL\n"
    ") ENGINE=InnoDB";

/* Named mode's acquire, one CALL on the connection that will hold the
 * lock: GET_LOCK without waiting, the fence in the same round trip, and
 * the connection's wait_timeout set to the lease (whole seconds, rounded
 * up): a holder that stops renewing is cut off by the server, and the lock
 * with it. Returns (1, fence) taken, (0, 0) held by another. */
static const char named_acquire_ddl[] =
    "CREATE PROCEDURE dlock_named_acquire_v1(IN p_name VARBINARY(640), IN p_lock VARCHAR(64),\n"
    "                                        IN p_lease_s INT, IN p_holder VARBINARY(512))\n"
    "MODIFIES SQL DATA\n"
    "BEGIN\n"
    "  DECLARE v_fence BIGINT UNSIGNED;\n"
    "  DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; DO RELEASE_LOCK(p_lock); RESIGNAL; END;\n"
    "  IF GET_LOCK(p_lock, 0) = 1 THEN\n"
    "    SET SESSION wait_timeout = p_lease_s;\n"
    "    START TRANSACTION;\n"
    "    REPLACE INTO dlock_fence (stub) VALUES ('f');\n"
    "    SET v_fence = LAST_INSERT_ID();\n"
    "    INSERT INTO dlock_named (name, lockname, fence, conn, lease_s, holder)\n"
    "      VALUES (p_name, p_lock, v_fence, CONNECTION_ID(), p_lease_s, p_holder)\n"
    "      ON DUPLICATE KEY UPDATE lockname = VALUES(lockname), fence = VALUES(fence),\n"
    "        conn = VALUES(conn), lease_s = VALUES(lease_s), holder = VALUES(holder);\n"
    "    COMMIT;\n"
    "    SELECT 1, v_fence;\n"
    "  ELSE\n"
    "    SELECT 0, 0;\n"
    "  END IF;\n"
    "END";

static int run_ddl(dlock__my_be *be, MYSQL **slot, const char *sql)
{
    int rc = dlock__my_query(be, slot, sql, NULL, NULL);

    /* Another client created the procedure first. */
    if (rc != DLOCK_OK && *slot != NULL && mysql_errno(*slot) == ER_SP_ALREADY_EXISTS)
        return DLOCK_OK;
    return rc;
}

int dlock__my_schema(dlock__my_be *be, MYSQL **slot)
{
    static const char exists[] =
        "SELECT (SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"
        " AND table_name IN ('dlock_fence', '%s', '%s', '%s')),"
        " (SELECT COUNT(*) FROM information_schema.routines WHERE routine_schema = DATABASE()"
        " AND routine_name = '%s')";
    char sql[512];
    const char *table = be->named ? "dlock_named" : "dlock_locks";
    const char *proc = be->named ? "dlock_named_acquire_v1" : "dlock_acquire_v1";
    MYSQL_RES *res;
    int64_t v[2];
    int found, rc;

    /* Named mode has no lock family: the names repeat dlock_named. */
    snprintf(sql, sizeof(sql), exists, table, be->named ? table : "dlock_holds",
             be->named ? table : "dlock_permits", proc);
    if ((rc = dlock__my_query(be, slot, sql, &res, NULL)) != DLOCK_OK ||
        (rc = dlock__my_row_ints(be, res, v, 2, 0, &found, "the schema check")) != DLOCK_OK)
        return rc;
    if (v[0] == (be->named ? 2 : 4) && v[1] == 1)
        return DLOCK_OK;
    if (!be->create)
        return dlock_backend_fail(DLOCK_ESERVER,
                                  "%s: create=0 but table dlock_fence, table %s%s or procedure %s "
                                  "is missing (docs/mysql.md has the DDL)",
                                  be->where, table,
                                  be->named ? "" : ", dlock_holds, dlock_permits", proc);
    if ((rc = run_ddl(be, slot, fence_ddl)) != DLOCK_OK ||
        (rc = run_ddl(be, slot, be->named ? named_ddl : locks_ddl)) != DLOCK_OK ||
        (!be->named && (rc = run_ddl(be, slot, holds_ddl)) != DLOCK_OK) ||
        (!be->named && (rc = run_ddl(be, slot, permits_ddl)) != DLOCK_OK) ||
        (rc = run_ddl(be, slot, be->named ? named_acquire_ddl : acquire_ddl)) != DLOCK_OK)
        return rc;
    return DLOCK_OK;
}
