/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Stock deduction of seed 003, with libdlock.
 *
 * The seed's endpoint reads the stock, checks it is above zero and writes it
 * back minus one, under a Redis lock so that two requests cannot sell the
 * same unit. Its five versions fix the lock itself (expiry, a random owner
 * value, a Lua release, Redisson's watchdog); libdlock does all of that. What
 * no lock can fix is a request that stalls past its lease between its read
 * and its write: another request takes the lock, reads the same stock, and
 * both write "stock - 1" for two sales. So the row checks the fencing token:
 *
 *   1. register:  UPDATE stock SET fence = $f WHERE sku = $s AND fence < $f
 *   2. read:      SELECT qty FROM stock WHERE sku = $s
 *   3. write:     UPDATE stock SET qty = $qty - 1 WHERE sku = $s AND fence = $f
 *
 * The write goes through only if no newer holder registered since step 1.
 * (A plain `SET qty = qty - 1 WHERE qty > 0` needs no lock at all, the
 * seed's point about databases; the lock is for when the work between the
 * read and the write is more than one statement.)
 *
 *   stock [REDIS_URL] [DB_FILE] [SKU] [REQUESTS]
 *         defaults: redis://127.0.0.1:6379 stock.db sku-1 1
 *
 * A new SKU starts with 100 units. Try four clients buying 30 each:
 *   for i in 1 2 3 4; do ./stock redis://127.0.0.1:6379 stock.db sku-1 30 & done; wait
 * and the store ends with exactly 100 sold and 0 left.
 */
#include <dlock/dlock.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>

/* Run sql with a text and two integer parameters (?1, ?2, ?3). Returns rows
 * changed (or the first column of the first row when want_row), -1 on error. */
static sqlite3_int64 exec(sqlite3 *db, const char *sql, const char *sku, sqlite3_int64 a,
                          sqlite3_int64 b, int want_row)
{
    sqlite3_stmt *st = NULL;
    sqlite3_int64 result = -1;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        goto out;
    sqlite3_bind_text(st, 1, sku, -1, SQLITE_STATIC);
    if (sqlite3_bind_parameter_count(st) >= 2)
        sqlite3_bind_int64(st, 2, a);
    if (sqlite3_bind_parameter_count(st) >= 3)
        sqlite3_bind_int64(st, 3, b);
    int rc = sqlite3_step(st);
    if (want_row && rc == SQLITE_ROW)
        result = sqlite3_column_int64(st, 0);
    else if (!want_row && rc == SQLITE_DONE)
        result = sqlite3_changes(db);
out:
    if (result < 0)
        fprintf(stderr, "stock: %s\n", sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return result;
}

/* One purchase request. Returns 1 sold, 0 sold out, 2 refused as stale
 * (the caller may retry), -1 error. */
static int buy_one(dlock_client *client, sqlite3 *db, const char *sku, const char *lock_name)
{
    dlock_lock *lock = NULL;
    /* Redisson's tryLock(3s, 10s): wait up to 3 s for the lock (woken by
     * the release, not by polling), hold it for a 10 s renewed lease. */
    dlock_acquire_options opts = DLOCK_ACQUIRE_OPTIONS_INIT;
    opts.wait_ms = 3000;
    opts.lease_ms = 10000;
    int rc = dlock_acquire(&lock, client, lock_name, &opts);
    if (rc != DLOCK_OK) {
        fprintf(stderr, "stock: %s: %s\n", dlock_strerror(rc), dlock_error_message());
        return -1;
    }
    sqlite3_int64 fence = (sqlite3_int64)dlock_lock_fence(lock);
    int result = -1;

    sqlite3_int64 n = exec(db, "UPDATE stock SET fence = ?2 WHERE sku = ?1 AND fence < ?2", sku,
                           fence, 0, 0);
    if (n < 0)
        goto out;
    if (n == 0) {
        result = 2; /* a newer holder registered first */
        goto out;
    }
    sqlite3_int64 qty = exec(db, "SELECT qty FROM stock WHERE sku = ?1", sku, 0, 0, 1);
    if (qty < 0)
        goto out;
    if (qty == 0) {
        result = 0;
        goto out;
    }
    /* ... whatever the request does between its read and its write ... */
    n = exec(db, "UPDATE stock SET qty = ?3 WHERE sku = ?1 AND fence = ?2", sku, fence, qty - 1, 0);
    if (n >= 0)
        result = n == 1 ? 1 : 2;
out:
    dlock_release(lock); /* DLOCK_ELOST here means we stalled: the fence covered it */
    return result;
}

int main(int argc, char **argv)
{
    const char *url = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    const char *path = argc > 2 ? argv[2] : "stock.db";
    const char *sku = argc > 3 ? argv[3] : "sku-1";
    int requests = argc > 4 ? atoi(argv[4]) : 1;
    dlock_client *client = NULL;
    sqlite3 *db = NULL;
    int status = 1;
    int sold = 0, sold_out = 0, stale = 0;
    char lock_name[256];
    snprintf(lock_name, sizeof lock_name, "stock:%s", sku);

    if (sqlite3_open(path, &db) != SQLITE_OK) {
        fprintf(stderr, "stock: %s: %s\n", path, sqlite3_errmsg(db));
        goto out;
    }
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_exec(db,
                     "PRAGMA journal_mode = WAL;"
                     "CREATE TABLE IF NOT EXISTS stock(sku TEXT PRIMARY KEY,"
                     "  qty INTEGER NOT NULL CHECK (qty >= 0), fence INTEGER NOT NULL DEFAULT 0);",
                     NULL, NULL, NULL) != SQLITE_OK ||
        exec(db, "INSERT OR IGNORE INTO stock(sku, qty) VALUES (?1, 100)", sku, 0, 0, 0) < 0) {
        fprintf(stderr, "stock: %s: %s\n", path, sqlite3_errmsg(db));
        goto out;
    }
    if (dlock_client_open(&client, url, NULL) != DLOCK_OK) {
        fprintf(stderr, "stock: %s\n", dlock_error_message());
        goto out;
    }
    for (int i = 0; i < requests; i++) {
        int r = buy_one(client, db, sku, lock_name);
        if (r < 0)
            goto out;
        sold += r == 1;
        sold_out += r == 0;
        stale += r == 2;
    }
    printf("stock: %s: sold %d, sold out %d, stale writes refused %d\n", sku, sold, sold_out,
           stale);
    status = 0;
out:
    dlock_client_free(client);
    sqlite3_close(db);
    return status;
}
