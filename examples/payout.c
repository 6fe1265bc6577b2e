/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The payout job of seed 000, with libdlock.
 *
 * A scheduler fires this job on every instance at once. The instance that
 * gets the lock pays the pending orders; the others see the lock busy and
 * stop. The lock alone is not enough: a holder can stall (a GC pause, a
 * swapped-out page, SIGSTOP) past its lease while another instance takes
 * over. So the store checks the lock's fencing token:
 *
 *   1. the holder registers its fence with the store before it reads;
 *   2. every payment commits only if that fence is still the highest the
 *      store has seen for the job, in the same transaction as the payment.
 *
 * A stale holder that wakes up finds its writes refused. (Checking the fence
 * per order row instead, `... WHERE order_id = ? AND fence < ?`, is not
 * enough: the stale holder can still pay an order the new holder has not
 * reached yet. `dlock demo payout` shows both.)
 *
 *   payout [REDIS_URL] [DB_FILE]     defaults: redis://127.0.0.1:6379 payout.db
 *
 * Try six instances at once:  for i in 1 2 3 4 5 6; do ./payout & done; wait
 */
#include <dlock/dlock.h>

#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS payout("
    "  order_id INTEGER PRIMARY KEY, amount_cents INTEGER NOT NULL,"
    "  status TEXT NOT NULL DEFAULT 'PENDING', fence INTEGER NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS ledger(order_id INTEGER NOT NULL, fence INTEGER NOT NULL);"
    /* The highest fence the store has seen for the job. */
    "CREATE TABLE IF NOT EXISTS job_fence(job TEXT PRIMARY KEY, fence INTEGER NOT NULL);"
    "INSERT OR IGNORE INTO job_fence VALUES ('payout', 0);"
    /* A few orders to pay on the first run. */
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10)"
    "  INSERT INTO payout(amount_cents) SELECT 1000 * i FROM n"
    "  WHERE NOT EXISTS (SELECT 1 FROM payout);";

#define BATCH 100 /* orders paid per run, at most */

/* Run one statement with up to two integer parameters; returns the number of
 * rows it changed, or -1 (message printed). */
static int exec2(sqlite3 *db, const char *sql, sqlite3_int64 a, sqlite3_int64 b)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "payout: %s\n", sqlite3_errmsg(db));
        return -1;
    }
    if (sqlite3_bind_parameter_count(st) >= 1)
        sqlite3_bind_int64(st, 1, a);
    if (sqlite3_bind_parameter_count(st) >= 2)
        sqlite3_bind_int64(st, 2, b);
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) {
        fprintf(stderr, "payout: %s\n", sqlite3_errmsg(db));
        return -1;
    }
    return sqlite3_changes(db);
}

/* Pay one order if our fence is still the highest: the check and the write
 * are one statement inside one IMMEDIATE transaction, so no newer holder can
 * register in between. Returns 1 paid, 0 refused (stale), -1 error. */
static int pay(sqlite3 *db, sqlite3_int64 order, sqlite3_int64 fence)
{
    if (exec2(db, "BEGIN IMMEDIATE", 0, 0) < 0)
        return -1;
    int n = exec2(db,
                  "UPDATE payout SET status = 'PAID', fence = ?2"
                  " WHERE order_id = ?1 AND status = 'PENDING'"
                  "   AND ?2 = (SELECT fence FROM job_fence WHERE job = 'payout')",
                  order, fence);
    if (n == 1 && exec2(db, "INSERT INTO ledger VALUES (?1, ?2)", order, fence) < 0)
        n = -1;
    exec2(db, n < 0 ? "ROLLBACK" : "COMMIT", 0, 0);
    return n;
}

int main(int argc, char **argv)
{
    const char *url = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    const char *path = argc > 2 ? argv[2] : "payout.db";
    dlock_client *client = NULL;
    dlock_lock *lock = NULL;
    sqlite3 *db = NULL;
    sqlite3_stmt *st = NULL;
    int status = 1, rc;

    if (sqlite3_open(path, &db) != SQLITE_OK) {
        fprintf(stderr, "payout: %s: %s\n", path, sqlite3_errmsg(db));
        goto out;
    }
    sqlite3_busy_timeout(db, 5000); /* instances take turns on the file */
    if (sqlite3_exec(db, "PRAGMA journal_mode = WAL;", NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_exec(db, schema, NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "payout: %s: %s\n", path, sqlite3_errmsg(db));
        goto out;
    }

    if ((rc = dlock_client_open(&client, url, NULL)) != DLOCK_OK) {
        fprintf(stderr, "payout: %s\n", dlock_error_message());
        goto out;
    }
    /* Redisson's tryLock(0, 30s): do not wait; a 30 s lease that the
     * watchdog renews every 10 s for as long as we hold it. */
    dlock_acquire_options opts = DLOCK_ACQUIRE_OPTIONS_INIT;
    opts.wait_ms = 0;
    opts.lease_ms = 30000;
    rc = dlock_acquire(&lock, client, "payout-job", &opts);
    if (rc == DLOCK_EBUSY) {
        printf("payout: another instance is running the job\n");
        status = 0;
        goto out;
    }
    if (rc != DLOCK_OK) {
        fprintf(stderr, "payout: %s\n", dlock_error_message());
        goto out;
    }
    sqlite3_int64 fence = (sqlite3_int64)dlock_lock_fence(lock);

    /* 1. Register the fence before reading anything. */
    rc = exec2(db, "UPDATE job_fence SET fence = ?1 WHERE job = 'payout' AND fence < ?1", fence,
               0);
    if (rc <= 0) {
        if (rc == 0)
            fprintf(stderr, "payout: fence %lld is stale: a newer holder ran\n", (long long)fence);
        goto out;
    }

    /* 2. Read the pending orders (all of them before writing: a read left
     *    open across the writes would pin an old snapshot). */
    sqlite3_int64 orders[BATCH];
    int n = 0;
    if (sqlite3_prepare_v2(db, "SELECT order_id FROM payout WHERE status = 'PENDING' LIMIT 100",
                           -1, &st, NULL) != SQLITE_OK)
        goto out;
    while (n < BATCH && sqlite3_step(st) == SQLITE_ROW)
        orders[n++] = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    st = NULL;

    /* 3. Pay them one by one. */
    int paid = 0, refused = 0;
    for (int i = 0; i < n; i++) {
        int r = pay(db, orders[i], fence);
        if (r < 0)
            goto out;
        if (r == 0) {
            refused++; /* the store says a newer holder exists: stop */
            break;
        }
        paid++;
    }
    printf("payout: fence %lld: paid %d orders%s\n", (long long)fence, paid,
           refused ? ", then the store refused a stale write" : "");
    status = 0;

out:
    sqlite3_finalize(st);
    if (lock != NULL && dlock_release(lock) == DLOCK_ELOST)
        fprintf(stderr, "payout: the lock was lost before the release (the fence kept the "
                        "store safe)\n");
    dlock_client_free(client);
    sqlite3_close(db);
    return status;
}
