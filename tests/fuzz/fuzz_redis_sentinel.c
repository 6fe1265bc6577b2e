/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target, in process: the Sentinel replies the Redis backend
 * reads at connect time (redis_conn.c): SENTINEL get-master-addr-by-name
 * (dlock__redis_sentinel_addr), the master's ROLE
 * (dlock__redis_role_master) and the pub/sub message that ends the wait for
 * a +switch-master (dlock__redis_switch_message). No socket.
 *
 * Input: byte 0 sets the size of the host buffer (1..256 bytes); the rest
 * is a RESP stream, read with dlock's reader; each reply goes to all three.
 *
 * Invariants: an address is taken only from a two-string array, whole (the
 * host as sent, NUL-ended, shorter than the buffer, with no NUL inside),
 * with a port in 1..65535; ROLE passes only for "master" as its first
 * element, and its refusals are DLOCK_EPROTO or DLOCK_ECONN with a message
 * naming the server; a switch message is a three-element array that starts
 * with "message". No crash, leak or undefined behaviour.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_conn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what)
{
    fprintf(stderr, "fuzz_redis_sentinel: %s\n", what);
    abort();
}

static void check(const dlock__redis_conn *conn, const redisReply *r, size_t hsize)
{
    char host[256];
    int port = 0, rc, is_array = r->type == REDIS_REPLY_ARRAY;
    const redisReply *e0 = is_array && r->elements > 0 ? r->element[0] : NULL;

    memset(host, 'x', sizeof(host));
    if (dlock__redis_sentinel_addr(r, host, hsize, &port)) {
        if (!is_array || r->elements != 2 || e0->type != REDIS_REPLY_STRING ||
            r->element[1]->type != REDIS_REPLY_STRING)
            die("an address taken from a reply that is not two strings");
        if (port < 1 || port > 65535)
            die("a master port outside 1..65535");
        if (e0->len >= hsize || strlen(host) != e0->len || memcmp(host, e0->str, e0->len) != 0)
            die("a master host that is not the one sent, whole");
    } else if (memchr(host, '\0', sizeof(host)) != NULL) {
        die("a refused address written to the host buffer");
    }

    rc = dlock__redis_role_master(conn, r);
    if (rc == DLOCK_OK) {
        if (e0 == NULL || e0->type != REDIS_REPLY_STRING || strcmp(e0->str, "master") != 0)
            die("ROLE passed without \"master\"");
    } else if ((rc != DLOCK_EPROTO && rc != DLOCK_ECONN) ||
               strstr(dlock_error_message(), conn->where) == NULL) {
        die("a ROLE refusal without its code or its message");
    }

    if (dlock__redis_switch_message(r) &&
        (!is_array || r->elements != 3 || e0->type != REDIS_REPLY_STRING ||
         strcmp(e0->str, "message") != 0))
        die("a switch message that is not a pub/sub message");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dlock__redis_conn conn;
    redisReader *reader;
    size_t hsize;
    void *v = NULL;

    if (size < 1)
        return 0;
    hsize = 1 + (size_t)data[0];
    memset(&conn, 0, sizeof(conn));
    conn.tp.fd = -1;
    snprintf(conn.where, sizeof(conn.where), "redis-sentinel mymaster (master m.example:6379)");
    if ((reader = dlock__redis_reader_new(&conn)) == NULL)
        return 0;
    if (redisReaderFeed(reader, (const char *)data + 1, size - 1) != REDIS_OK)
        die("the reader refused a feed");
    while (redisReaderGetReply(reader, &v) == REDIS_OK && v != NULL) {
        check(&conn, v, hsize);
        freeReplyObject(v);
        v = NULL;
    }
    redisReaderFree(reader);
    return 0;
}
