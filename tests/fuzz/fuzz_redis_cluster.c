/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target, in process: what the Redis Cluster backend parses of
 * the servers' answers (redis_cluster.c): a CLUSTER SLOTS reply into the
 * slot map (dlock__redis_cluster_map_reply), a MOVED/ASK redirection
 * (dlock__redis_redirect_parse) and the lines of CLUSTER NODES that may
 * vouch for an ASK's target (dlock__redis_nodes_line_master). No socket.
 *
 * Input: byte 0 is the length L of the redirection's text (the bytes that
 * follow; a NUL ends it early, as the C string it is); then the RESP
 * bytes of one CLUSTER SLOTS reply, read with dlock's reader; what follows
 * that reply is the CLUSTER NODES text, line by line.
 *
 * Invariants: the map is refused (DLOCK_EPROTO with a message) or every
 * slot a range of the reply names is served by that range's host:port (the
 * last range naming it wins), every other slot by no one; a redirection
 * parses to a slot in 0..16383, a port in 1..65535 and a host inside the
 * text, or is refused; a CLUSTER NODES line is only vouched for when it
 * carries the address asked for in its second field and "master" among
 * its flags. No crash, leak or undefined behaviour (ASan, UBSan, LSan).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_conn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what)
{
    fprintf(stderr, "fuzz_redis_cluster: %s\n", what);
    abort();
}

static char scheme[] = "redis-cluster";
static dlock_url url = {.scheme = scheme};

/* The map conn holds agrees with reply r, which it accepted. */
static void check_map(const dlock__redis_conn *conn, const redisReply *r)
{
    static short owner[DLOCK__REDIS_SLOTS];

    for (size_t s = 0; s < DLOCK__REDIS_SLOTS; s++)
        owner[s] = -1;
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i];
        for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++) {
            if (s < 0 || s >= DLOCK__REDIS_SLOTS)
                die("an accepted range outside 0..16383");
            owner[s] = (short)i;
        }
    }
    for (unsigned s = 0; s < DLOCK__REDIS_SLOTS; s++) {
        const char *host = NULL;
        int port = 0, known = dlock__redis_cluster_slot_master(conn, s, &host, &port);
        const redisReply *m;
        size_t want;

        if (owner[s] < 0) {
            if (known)
                die("a slot no range named has a master");
            continue;
        }
        if (!known)
            die("a slot a range named has no master");
        m = r->element[owner[s]]->element[2];
        if (port != m->element[1]->integer)
            die("a slot's master has another port than its range's");
        if (m->element[0]->len == 0)
            want = strlen("seed.example"), m = NULL;
        else
            want = m->element[0]->len < 255 ? m->element[0]->len : 255;
        if (strncmp(host, m != NULL ? m->element[0]->str : "seed.example", want) != 0)
            die("a slot's master has another host than its range's");
    }
}

static void check_redirect(const char *text, const char **host, size_t *hostlen, long *port)
{
    long slot = -1;

    *host = NULL;
    if (dlock__redis_redirect_parse(text, &slot, host, hostlen, port) != 0) {
        *host = NULL;
        return;
    }
    if (slot < 0 || slot >= DLOCK__REDIS_SLOTS)
        die("a redirection to a slot outside 0..16383");
    if (*port < 1 || *port > 65535)
        die("a redirection to a port outside 1..65535");
    if (*host < text || *host + *hostlen > text + strlen(text) || strchr(text, ' ') == NULL)
        die("a redirection's host outside its text");
}

static void check_nodes(const char *nodes, const char *host, size_t hostlen, long port)
{
    char addr[300];
    int alen = snprintf(addr, sizeof(addr), "%.*s:%ld@", (int)(hostlen < 200 ? hostlen : 200),
                        host != NULL ? host : "127.0.0.1", host != NULL ? port : 7000L);
    const char *line, *nl;

    for (line = nodes; line != NULL; line = nl != NULL ? nl + 1 : NULL) {
        const char *end, *sp;
        nl = strchr(line, '\n');
        end = nl != NULL ? nl : line + strlen(line);
        if (dlock__redis_nodes_line_master(line, end, addr, alen)) {
            sp = memchr(line, ' ', (size_t)(end - line));
            if (sp == NULL || end - sp - 1 < alen || memcmp(sp + 1, addr, (size_t)alen) != 0)
                die("a CLUSTER NODES line vouched for without the address asked for");
            if (memmem(line, (size_t)(end - line), "master", 6) == NULL)
                die("a CLUSTER NODES line vouched for without the master flag");
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dlock__redis_conn conn;
    redisReader *reader;
    char text[256], *nodes;
    const char *host;
    size_t tlen, hostlen = 0, rest;
    long port = 0;
    void *v = NULL;

    if (size < 1)
        return 0;
    tlen = data[0] < size - 1 ? data[0] : size - 1;
    memcpy(text, data + 1, tlen);
    text[tlen] = '\0';
    check_redirect(text, &host, &hostlen, &port);

    memset(&conn, 0, sizeof(conn));
    conn.tp.fd = -1;
    conn.url = &url;
    conn.is_cluster = 1;
    snprintf(conn.where, sizeof(conn.where), "redis-cluster seed.example:7000");
    if ((reader = dlock__redis_reader_new(&conn)) == NULL)
        return 0;
    if (redisReaderFeed(reader, (const char *)data + 1 + tlen, size - 1 - tlen) != REDIS_OK)
        die("the reader refused a feed");
    if (redisReaderGetReply(reader, &v) == REDIS_OK && v != NULL) {
        redisReply *r = v;
        int rc = dlock__redis_cluster_map_reply(&conn, "seed.example", 7000, r);

        if (rc == DLOCK_OK)
            check_map(&conn, r);
        else if (rc != DLOCK_EPROTO && rc != DLOCK_ENOMEM)
            die("a refused map gave another code than EPROTO or ENOMEM");
        else if (dlock_error_message()[0] == '\0')
            die("a refused map without a message");
        freeReplyObject(r);
    }
    /* What the reader did not take: the CLUSTER NODES text. */
    rest = reader->len > reader->pos ? reader->len - reader->pos : 0;
    if ((nodes = malloc(rest + 1)) != NULL) {
        if (rest > 0)
            memcpy(nodes, reader->buf + reader->pos, rest);
        nodes[rest] = '\0';
        check_nodes(nodes, host, hostlen, port);
        free(nodes);
    }
    redisReaderFree(reader);
    dlock__redis_conn_close(&conn);
    return 0;
}
