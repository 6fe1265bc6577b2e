/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The fenced register in SQLite (chaos.h). The pattern of docs/fencing.md:
 * the store keeps the highest fence seen for the job and refuses a lower
 * one, checked in the same transaction (BEGIN IMMEDIATE takes the write lock
 * first) as the read or the write it guards.
 */
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "chaos.h"

struct chaos_store {
    sqlite3 *db;
};

int64_t chaos_now_us(void)
{
    struct timespec ts;

    /* The raw system call: libfaketime, preloaded into the workers of the
     * clock-jump nemesis, cannot touch it. */
    syscall(SYS_clock_gettime, CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

const char *const chaos_broken_names[CHAOS_BROKEN_COUNT] = {
    [CHAOS_OK] = "ok",
    [CHAOS_NO_LOCK] = "no-lock",
    [CHAOS_REUSE_FENCE] = "reuse-fence",
    [CHAOS_IGNORE_LOST] = "ignore-lost",
    [CHAOS_RAW_DEL] = "raw-del",
    [CHAOS_SLOW_CLOCK] = "slow-clock",
    [CHAOS_SUPPRESS_LOST] = "suppress-lost",
    [CHAOS_SKIP_FENCE] = "skip-fence",
    [CHAOS_NEVER_RELEASE] = "never-release",
};

static const char schema[] =
    "PRAGMA journal_mode=WAL;"
    "CREATE TABLE reg(id INTEGER PRIMARY KEY CHECK (id = 1), fence INTEGER NOT NULL,"
    "                 value INTEGER NOT NULL);"
    "INSERT INTO reg VALUES (1, 0, 0);"
    "CREATE TABLE writes(seq INTEGER PRIMARY KEY AUTOINCREMENT, worker INTEGER NOT NULL,"
    "                    fence INTEGER NOT NULL, read_value INTEGER NOT NULL,"
    "                    new_value INTEGER NOT NULL);";

int chaos_store_create(const char *path, char *err, size_t errsize)
{
    sqlite3 *db = NULL;
    char *msg = NULL;
    int rc = sqlite3_open(path, &db);

    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, schema, NULL, NULL, &msg);
    if (rc != SQLITE_OK)
        snprintf(err, errsize, "sqlite %s: %s", path, msg ? msg : sqlite3_errmsg(db));
    sqlite3_free(msg);
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}

int chaos_store_open(chaos_store **out, const char *path)
{
    chaos_store *s = calloc(1, sizeof(*s));

    *out = NULL;
    if (s == NULL)
        return -1;
    if (sqlite3_open(path, &s->db) != SQLITE_OK) {
        sqlite3_close(s->db);
        free(s);
        return -1;
    }
    /* A holder paused inside a transaction makes the others wait, as a
     * row lock would: long enough never to give up during a pause. */
    sqlite3_busy_timeout(s->db, 60000);
    *out = s;
    return 0;
}

void chaos_store_close(chaos_store *s)
{
    if (s == NULL)
        return;
    sqlite3_close(s->db);
    free(s);
}

static int exec(chaos_store *s, const char *sql)
{
    return sqlite3_exec(s->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : -1;
}

/* Inside a transaction: the highest fence and the value. */
static int current(chaos_store *s, int64_t *fence, int64_t *value)
{
    sqlite3_stmt *st;
    int rc = -1;

    if (sqlite3_prepare_v2(s->db, "SELECT fence, value FROM reg WHERE id = 1", -1, &st, NULL) !=
        SQLITE_OK)
        return -1;
    if (sqlite3_step(st) == SQLITE_ROW) {
        *fence = sqlite3_column_int64(st, 0);
        *value = sqlite3_column_int64(st, 1);
        rc = 0;
    }
    sqlite3_finalize(st);
    return rc;
}

/* Run sql with its n integer parameters ?1..?n. */
static int update(chaos_store *s, const char *sql, int n, const int64_t *params)
{
    sqlite3_stmt *st;
    int rc;

    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK)
        return -1;
    for (int i = 0; i < n; i++)
        sqlite3_bind_int64(st, i + 1, params[i]);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : -1;
    sqlite3_finalize(st);
    return rc;
}

int chaos_store_read(chaos_store *s, uint64_t fence, int64_t *value)
{
    int64_t highest, v;

    if (exec(s, "BEGIN IMMEDIATE") != 0)
        return -1;
    if (current(s, &highest, &v) != 0)
        goto err;
    if ((int64_t)fence < highest) {
        exec(s, "ROLLBACK");
        return 0;
    }
    if ((int64_t)fence > highest &&
        update(s, "UPDATE reg SET fence = ?1 WHERE id = 1", 1, (int64_t[]){(int64_t)fence}) != 0)
        goto err;
    if (exec(s, "COMMIT") != 0)
        goto err;
    *value = v;
    return 1;
err:
    exec(s, "ROLLBACK");
    return -1;
}

int chaos_store_write(chaos_store *s, uint64_t fence, int64_t read_value, int worker)
{
    int64_t highest, v;

    if (exec(s, "BEGIN IMMEDIATE") != 0)
        return -1;
    if (current(s, &highest, &v) != 0)
        goto err;
    if ((int64_t)fence < highest) {
        exec(s, "ROLLBACK");
        return 0;
    }
    /* Deliberately no check that v == read_value: that is the lock's and
     * the fence's job, and the checker counts where they failed. */
    if (update(s, "UPDATE reg SET fence = ?1, value = ?2 WHERE id = 1", 2,
               (int64_t[]){(int64_t)fence, read_value + 1}) != 0 ||
        update(s, "INSERT INTO writes(worker, fence, read_value, new_value) "
                  "VALUES (?1, ?2, ?3, ?4)", 4,
               (int64_t[]){worker, (int64_t)fence, read_value, read_value + 1}) != 0)
        goto err;
    if (exec(s, "COMMIT") != 0)
        goto err;
    return 1;
err:
    exec(s, "ROLLBACK");
    return -1;
}

int chaos_store_write_unfenced(chaos_store *s, uint64_t fence, int64_t read_value, int worker)
{
    if (exec(s, "BEGIN IMMEDIATE") != 0)
        return -1;
    if (update(s, "UPDATE reg SET value = ?1 WHERE id = 1", 1, (int64_t[]){read_value + 1}) != 0 ||
        update(s, "INSERT INTO writes(worker, fence, read_value, new_value) "
                  "VALUES (?1, ?2, ?3, ?4)", 4,
               (int64_t[]){worker, (int64_t)fence, read_value, read_value + 1}) != 0 ||
        exec(s, "COMMIT") != 0) {
        exec(s, "ROLLBACK");
        return -1;
    }
    return 1;
}

int64_t chaos_store_highest(chaos_store *s)
{
    int64_t highest, v;

    if (exec(s, "BEGIN") != 0)
        return -1;
    if (current(s, &highest, &v) != 0)
        highest = -1;
    exec(s, "COMMIT");
    return highest;
}

int chaos_store_check(const char *path, chaos_store_report *out, char *err, size_t errsize)
{
    chaos_store *s;
    sqlite3_stmt *st;
    int64_t fence, prev = 0, prev_fence = 0;
    unsigned char *seen = NULL;
    size_t seen_size = 0;

    memset(out, 0, sizeof(*out));
    if (chaos_store_open(&s, path) != 0) {
        snprintf(err, errsize, "cannot open the store %s", path);
        return -1;
    }
    if (current(s, &fence, &out->final_value) != 0 ||
        sqlite3_prepare_v2(s->db, "SELECT read_value, new_value, fence FROM writes ORDER BY seq", -1,
                           &st, NULL) != SQLITE_OK) {
        snprintf(err, errsize, "store %s: %s", path, sqlite3_errmsg(s->db));
        chaos_store_close(s);
        return -1;
    }
    while (sqlite3_step(st) == SQLITE_ROW) {
        int64_t read_value = sqlite3_column_int64(st, 0);
        int64_t new_value = sqlite3_column_int64(st, 1);
        int64_t wfence = sqlite3_column_int64(st, 2);

        out->writes++;
        /* The store's own record of fences: applied writes never go down. */
        if (wfence < prev_fence)
            out->fence_down++;
        else
            prev_fence = wfence;
        /* Each accepted write must build on the one before it. */
        if (read_value != prev)
            out->lost++;
        if (new_value >= 0) {
            if ((size_t)new_value >= seen_size) {
                size_t n = (size_t)new_value * 2 + 1024;
                unsigned char *grown = realloc(seen, n);
                if (grown == NULL)
                    break;
                memset(grown + seen_size, 0, n - seen_size);
                seen = grown;
                seen_size = n;
            }
            if (seen[new_value]++)
                out->dup++;
        }
        prev = new_value;
    }
    sqlite3_finalize(st);
    free(seen);
    chaos_store_close(s);
    if (out->final_value != prev) {
        snprintf(err, errsize, "store %s: register is %lld, last logged write %lld", path,
                 (long long)out->final_value, (long long)prev);
        return -1;
    }
    return 0;
}
