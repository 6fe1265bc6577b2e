/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target, in process: the rows the SQL backends decode from the
 * server's text results: PostgreSQL's status and list rows (held, fence, ms
 * left, holder record; a listed name's hex: dlock__pg_fill_info, dlock__pg_unhex) and
 * MySQL/MariaDB's, in lease mode (dlock__my_lease_fill_info) and named mode
 * (dlock__my_named_fill_info: held, fence, ttl, holder, name, holding and
 * recorded connection). No server: a PGresult is built with libpq's
 * PQmakeEmptyPGresult/PQsetvalue, a MYSQL_ROW is an array of strings.
 *
 * Input: fields separated by '\n' (up to 7; "\N" is SQL NULL, missing
 * fields are NULL), each column's text as the server would send it.
 *
 * Invariants: a lock not held has no time left and no holder; a held one
 * has at least 1 ms left on PostgreSQL (the server rounds up), and its
 * holder's texts are NUL-ended; in named mode a holder is shown only when
 * the holding connection is the recorded one, else the time left is -1; a
 * listed name decodes only from hex digits, to the bytes they spell (no
 * NUL). No crash, leak or undefined behaviour (ASan, UBSan, LSan).
 */
#include <libpq-fe.h>
#include <mysql.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/mysql/mysql_int.h"
#include "backends/postgres/pg_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NF 7

static void die(const char *what)
{
    fprintf(stderr, "fuzz_sql_rows: %s\n", what);
    abort();
}

static void check_info(const dlock_lock_info *info, int pg)
{
    if (!info->held && (info->ttl_ms != 0 || info->has_holder))
        die("a lock not held with time left or a holder");
    if (pg && info->held && info->ttl_ms < 1)
        die("a held lock with less than 1 ms left");
    if (info->has_holder && (memchr(info->host, '\0', sizeof(info->host)) == NULL ||
                             memchr(info->label, '\0', sizeof(info->label)) == NULL))
        die("a holder text without its NUL");
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static void check_pg(char **f, unsigned long *lens)
{
    PGresAttDesc attrs[5];
    PGresult *r = PQmakeEmptyPGresult(NULL, PGRES_TUPLES_OK);
    dlock_lock_info info;
    char name[DLOCK_NAME_MAX + 1];

    if (r == NULL)
        return;
    memset(attrs, 0, sizeof(attrs));
    for (int c = 0; c < 5; c++) {
        attrs[c].name = (char *)"c";
        attrs[c].typid = 25; /* text */
        attrs[c].typlen = -1;
        attrs[c].atttypmod = -1;
    }
    if (!PQsetResultAttrs(r, 5, attrs))
        goto out;
    for (int c = 0; c < 5; c++)
        if (!PQsetvalue(r, 0, c, f[c], f[c] != NULL ? (int)lens[c] : -1))
            goto out;
    dlock__pg_fill_info(&info, r, 0, 1);
    check_info(&info, 1);
    /* A list row's name, as dlock__pg_lease_list reads it. */
    if (PQgetlength(r, 0, 0) <= 2 * DLOCK_NAME_MAX &&
        dlock__pg_unhex(name, PQgetvalue(r, 0, 0)) == 0) {
        const char *hex = PQgetvalue(r, 0, 0);
        size_t n = strlen(hex) / 2;
        if (strlen(name) != n)
            die("a listed name with a NUL inside");
        for (size_t i = 0; i < n; i++)
            if (hexval(hex[2 * i]) < 0 || hexval(hex[2 * i + 1]) < 0 ||
                (unsigned char)name[i] != hexval(hex[2 * i]) * 16 + hexval(hex[2 * i + 1]))
                die("a listed name decoded from what is not its hex");
    }
out:
    PQclear(r);
}

static void check_mysql(char **f, unsigned long *lens)
{
    dlock_lock_info info;
    int same;

    dlock__my_lease_fill_info(f, lens, &info);
    check_info(&info, 0);
    dlock__my_named_fill_info(f, lens, &info);
    check_info(&info, 0);
    same = f[5] != NULL && f[6] != NULL && strcmp(f[5], f[6]) == 0;
    if (info.held && !same && (info.has_holder || info.ttl_ms != -1))
        die("named mode: a holder or time left shown for another connection's lock");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf, *f[NF] = {NULL};
    unsigned long lens[NF] = {0};
    size_t n = 0;
    char *p;

    if ((buf = malloc(size + 1)) == NULL)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    p = buf;
    while (p != NULL && n < NF) {
        char *nl = memchr(p, '\n', (size_t)(buf + size - p));
        size_t len = nl != NULL ? (size_t)(nl - p) : (size_t)(buf + size - p);
        if (nl != NULL)
            *nl = '\0';
        if (!(len == 2 && p[0] == '\\' && p[1] == 'N')) {
            f[n] = p;
            lens[n] = (unsigned long)len;
        }
        n++;
        p = nl != NULL ? nl + 1 : NULL;
    }
    check_pg(f, lens);
    check_mysql(f, lens);
    free(buf);
    return 0;
}
