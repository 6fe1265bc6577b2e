/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target, in process: RESP replies as every Redis-family backend
 * reads them (Redis, Redlock, Sentinel, Cluster): hiredis's reader with the
 * element cap dlock puts on it (dlock__redis_reader_new), then dlock's own
 * reading of error replies (dlock__redis_conn_reply_error) and of a reader
 * that refused the bytes (dlock__redis_conn_io_error). No socket: the input
 * is fed from memory, in pieces as a server's writes might arrive.
 *
 * Input: byte 0 sets the size of the pieces (1..64 bytes, or all at once);
 * the rest is the byte stream, one or more replies.
 *
 * Invariants: every reply taken is a well-formed tree (strings NUL-ended at
 * their length, arrays with their elements) of at most
 * DLOCK__REDIS_MAX_REPLY_ELEMENTS elements; an error reply gives
 * DLOCK_EAUTH or DLOCK_ESERVER with a message naming the server and never
 * holding the connection's password; bytes the reader refuses give
 * DLOCK_EPROTO (or DLOCK_ENOMEM) with a message. No crash, leak or
 * undefined behaviour (ASan, UBSan, LSan).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_conn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define PASSWORD "pw-s3cr3t-9f"

static void die(const char *what)
{
    fprintf(stderr, "fuzz_resp: %s\n", what);
    abort();
}

/* The elements of r's tree (arrays' elements, nested included). */
static size_t check_tree(const redisReply *r, int depth)
{
    size_t n = 0;

    if (depth > 64)
        die("reply nested deeper than hiredis allows");
    switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
        if (r->str == NULL || r->str[r->len] != '\0')
            die("a string reply without its terminating NUL");
        break;
    case REDIS_REPLY_ARRAY:
        if (r->elements > 0 && r->element == NULL)
            die("an array without its elements");
        n = r->elements;
        for (size_t i = 0; i < r->elements; i++) {
            if (r->element[i] == NULL)
                die("an array with a NULL element");
            n += check_tree(r->element[i], depth + 1);
        }
        break;
    case REDIS_REPLY_INTEGER:
    case REDIS_REPLY_NIL:
        break;
    default:
        die("a reply of an unknown type");
    }
    return n;
}

static void check_message(int rc, const char *where)
{
    const char *msg = dlock_error_message();

    if (msg == NULL || strstr(msg, where) == NULL)
        die("a failure whose message does not name the server");
    if (strstr(msg, PASSWORD) != NULL)
        die("the password in an error message");
    (void)rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dlock__redis_conn conn;
    size_t piece, at = 1;

    if (size < 1)
        return 0;
    memset(&conn, 0, sizeof(conn));
    conn.tp.fd = -1;
    conn.password = PASSWORD;
    snprintf(conn.where, sizeof(conn.where), "redis fuzz:6379");
    if ((conn.tp.reader = dlock__redis_reader_new(&conn)) == NULL)
        return 0;
    piece = data[0] % 65 == 0 ? size : data[0] % 65;
    while (at < size) {
        size_t n = size - at < piece ? size - at : piece;
        void *v = NULL;

        if (redisReaderFeed(conn.tp.reader, (const char *)data + at, n) != REDIS_OK)
            die("the reader refused a feed");
        at += n;
        for (;;) {
            redisReply *r;
            int rc;

            if (dlock__redis_tp_get_reply(&conn.tp, &v) != REDIS_OK) {
                rc = dlock__redis_conn_io_error(&conn);
                if (rc != DLOCK_EPROTO && rc != DLOCK_ENOMEM)
                    die("refused bytes gave another code than EPROTO or ENOMEM");
                check_message(rc, conn.where);
                return 0; /* the connection is closed, its reader freed */
            }
            if (v == NULL)
                break;
            r = v;
            if (check_tree(r, 0) > DLOCK__REDIS_MAX_REPLY_ELEMENTS)
                die("a reply past the element cap was accepted");
            if (r->type == REDIS_REPLY_ERROR) {
                rc = dlock__redis_conn_reply_error(&conn, r);
                if (rc != DLOCK_EAUTH && rc != DLOCK_ESERVER)
                    die("an error reply gave another code than EAUTH or ESERVER");
                check_message(rc, conn.where);
            }
            freeReplyObject(r);
        }
        if (dlock__redis_conn_over_cap(&conn)) {
            if (dlock__redis_conn_io_error(&conn) != DLOCK_EPROTO)
                die("a reply over the byte cap gave another code than EPROTO");
            return 0;
        }
    }
    dlock__redis_tp_close(&conn.tp);
    return 0;
}
