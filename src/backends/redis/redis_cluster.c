/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Redis Cluster routing (redis_cluster.h; docs/redis-cluster.md).
 *
 * Every script dlock runs for lock NAME declares keys of NAME's slot only
 * (PREFIX{NAME}..., and the slot's fence floor and registry,
 * PREFIX{fence:N}fence-floor: dlock__redis_slot_tag), so each command goes
 * whole to one master: the one the slot map names for its first key. The map
 * comes from CLUSTER SLOTS, asked of any node that answers (the known
 * masters first, then the URL's seeds); MOVED updates it and is followed,
 * ASK is followed once with ASKING on the node it names (either only to a
 * master of the map: redirect_target), TRYAGAIN (a slot half migrated) and
 * CLUSTERDOWN (a failover under way) are waited out, and a master that went
 * away makes the map be asked again: all within the command timeout. Every
 * command sent through here is safe to repeat (the scripts are idempotent
 * for the same token, as for a lost reply).
 *
 * Two uses. A routing state of a connection's own (status, list: one user
 * at a time, the connection's), whose commands go out on each node's
 * conn; and the one the callers' scripts share (dlock__redis_cluster_share,
 * redis_mux.h), whose map and nodes mu guards, and whose commands go out on
 * each node's mux, pipelined with the other callers'. Either asks for the
 * map on the nodes' conns.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/redis/redis_conn.h"
#include "backends/redis/redis_mux.h"
#include "core/clock.h"
#include "core/error.h"

/* At most this many redirections (MOVED, ASK) per command, whatever the
 * time left: a cluster that keeps redirecting is broken, not busy. The
 * waits (TRYAGAIN, CLUSTERDOWN, a lost master) are bounded by the command's
 * timeout alone: a slot migration or a failover takes what it takes. */
#define CLUSTER_MAX_TRIES 64
/* Between tries after TRYAGAIN, CLUSTERDOWN or a lost master: 20 ms, then
 * doubled up to 200 ms, so a long wait costs the cluster a few requests a
 * second. */
#define CLUSTER_RETRY_MS 20
#define CLUSTER_RETRY_MAX_MS 200

typedef struct {
    char host[256];
    int port;
    dlock__redis_conn conn; /* plain: is_cluster 0 */
    dlock__redis_mux mux;   /* shared routing: the callers' commands (on when used) */
} node;

struct dlock__redis_cluster {
    node **nodes; /* pointers: a conn's reader keeps its address */
    size_t n, cap;
    short slot[DLOCK__REDIS_SLOTS]; /* index into nodes; -1: not known */
    int have_map;
    int shared;         /* dlock__redis_cluster_share's: mu guards the above */
    pthread_mutex_t mu;
};

/* ---- slots ------------------------------------------------------------- */

/* CRC16-CCITT (XMODEM), as Redis Cluster hashes keys. */
static unsigned crc16(const char *buf, size_t len)
{
    unsigned crc = 0;

    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned)(unsigned char)buf[i] << 8;
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
    }
    return crc;
}

unsigned dlock__redis_key_slot(const char *key, size_t len)
{
    size_t s, e;

    for (s = 0; s < len && key[s] != '{'; s++)
        ;
    if (s < len) {
        for (e = s + 1; e < len && key[e] != '}'; e++)
            ;
        if (e < len && e > s + 1)
            return crc16(key + s + 1, e - s - 1) & (DLOCK__REDIS_SLOTS - 1);
    }
    return crc16(key, len) & (DLOCK__REDIS_SLOTS - 1);
}

static unsigned slot_tag_n[DLOCK__REDIS_SLOTS];
static pthread_once_t slot_tag_once = PTHREAD_ONCE_INIT;

/* The smallest N with "fence:N" in each slot: about 170,000 CRCs, once. */
static void slot_tags_init(void)
{
    size_t left = DLOCK__REDIS_SLOTS;
    char buf[24];

    for (unsigned i = 0; i < DLOCK__REDIS_SLOTS; i++)
        slot_tag_n[i] = ~0u;
    for (unsigned n = 0; left > 0; n++) {
        int len = snprintf(buf, sizeof(buf), "fence:%u", n);
        unsigned s = crc16(buf, (size_t)len) & (DLOCK__REDIS_SLOTS - 1);
        if (slot_tag_n[s] == ~0u) {
            slot_tag_n[s] = n;
            left--;
        }
    }
}

void dlock__redis_slot_tag(unsigned slot, char *buf, size_t size)
{
    pthread_once(&slot_tag_once, slot_tags_init);
    snprintf(buf, size, "fence:%u", slot_tag_n[slot & (DLOCK__REDIS_SLOTS - 1)]);
}

/* ---- nodes and the slot map --------------------------------------------- */

void dlock__redis_cluster_free(dlock__redis_cluster *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n; i++) {
        dlock__redis_mux_destroy(&c->nodes[i]->mux);
        dlock__redis_conn_close(&c->nodes[i]->conn);
        free(c->nodes[i]);
    }
    if (c->shared)
        pthread_mutex_destroy(&c->mu);
    free(c->nodes);
    free(c);
}

/* The node at host:port among those known, or -1. */
static int node_find(const dlock__redis_cluster *c, const char *host, size_t hostlen, int port)
{
    for (size_t i = 0; i < c->n; i++)
        if (c->nodes[i]->port == port && strlen(c->nodes[i]->host) == hostlen &&
            memcmp(c->nodes[i]->host, host, hostlen) == 0)
            return (int)i;
    return -1;
}

/* The node at host:port (added, with a connection like parent's, if new),
 * or -1 when out of memory. */
static int node_at(dlock__redis_conn *parent, const char *host, size_t hostlen, int port)
{
    dlock__redis_cluster *c = parent->cluster;
    node *nd;

    int at;

    if (hostlen >= sizeof(nd->host))
        hostlen = sizeof(nd->host) - 1;
    if ((at = node_find(c, host, hostlen, port)) >= 0)
        return at;
    if (c->n >= 30000)
        return -1;
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 8;
        node **nodes = realloc(c->nodes, cap * sizeof(*nodes));
        if (nodes == NULL)
            return -1;
        c->nodes = nodes;
        c->cap = cap;
    }
    if ((nd = calloc(1, sizeof(*nd))) == NULL)
        return -1;
    memcpy(nd->host, host, hostlen);
    nd->host[hostlen] = '\0';
    nd->port = port;
    /* The parent's settings (credentials, TLS, timeouts, names), not its
     * transport or routing. */
    nd->conn = *parent;
    memset(&nd->conn.tp, 0, sizeof(nd->conn.tp));
    nd->conn.tp.fd = -1;
    nd->conn.is_cluster = 0;
    nd->conn.cluster = NULL;
    nd->conn.connected = 0;
    nd->conn.ep.unix_path = NULL;
    nd->conn.ep.host = nd->host;
    nd->conn.ep.port = port;
    snprintf(nd->conn.where, sizeof(nd->conn.where),
             strchr(nd->host, ':') ? "%s [%.64s]:%d" : "%s %.64s:%d", parent->url->scheme,
             nd->host, port);
    c->nodes[c->n++] = nd;
    return (int)(c->n - 1);
}

static int cluster_alloc(dlock__redis_conn *conn)
{
    if (conn->cluster != NULL)
        return DLOCK_OK;
    if ((conn->cluster = calloc(1, sizeof(*conn->cluster))) == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < DLOCK__REDIS_SLOTS; i++)
        conn->cluster->slot[i] = -1;
    return DLOCK_OK;
}

int dlock__redis_cluster_share(dlock__redis_conn *conn)
{
    int rc;

    if ((rc = cluster_alloc(conn)) != DLOCK_OK)
        return rc;
    if (pthread_mutex_init(&conn->cluster->mu, NULL) != 0)
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    conn->cluster->shared = 1;
    return DLOCK_OK;
}

/* Fill the map from one CLUSTER SLOTS reply of node asked. */
static int map_from(dlock__redis_conn *conn, node *asked, const redisReply *r)
{
    dlock__redis_cluster *c = conn->cluster;

    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0)
        return dlock__fail(DLOCK_EPROTO, "%s: CLUSTER SLOTS gave no slot (is the cluster "
                           "created?)", asked->conn.where);
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i], *m;
        const char *host;
        size_t hostlen;
        int at;

        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            (m = e->element[2])->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER || e->element[0]->integer < 0 ||
            e->element[1]->integer >= DLOCK__REDIS_SLOTS ||
            e->element[0]->integer > e->element[1]->integer || m->element[1]->integer <= 0 ||
            m->element[1]->integer > 65535)
            return dlock__fail(DLOCK_EPROTO, "%s: unexpected reply to CLUSTER SLOTS",
                               asked->conn.where);
        /* An empty host: the node we asked (a node that knows no address
         * of its own). */
        host = m->element[0]->len > 0 ? m->element[0]->str : asked->host;
        hostlen = m->element[0]->len > 0 ? m->element[0]->len : strlen(asked->host);
        if ((at = node_at(conn, host, hostlen, (int)m->element[1]->integer)) < 0)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++)
            c->slot[s] = (short)at;
    }
    c->have_map = 1;
    return DLOCK_OK;
}

int dlock__redis_cluster_map_reply(dlock__redis_conn *conn, const char *host, int port,
                                   const redisReply *r)
{
    int rc, at;

    if ((rc = cluster_alloc(conn)) != DLOCK_OK)
        return rc;
    if ((at = node_at(conn, host, strlen(host), port)) < 0)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    return map_from(conn, conn->cluster->nodes[at], r);
}

int dlock__redis_cluster_slot_master(const dlock__redis_conn *conn, unsigned slot,
                                     const char **host, int *port)
{
    const dlock__redis_cluster *c = conn->cluster;
    int at = c != NULL && slot < DLOCK__REDIS_SLOTS ? c->slot[slot] : -1;

    if (at < 0)
        return 0;
    *host = c->nodes[at]->host;
    *port = c->nodes[at]->port;
    return 1;
}

int dlock__redis_cluster_master_copy(dlock__redis_conn *conn, unsigned slot, char *host,
                                     size_t size, int *port)
{
    dlock__redis_cluster *c = conn->cluster;
    const char *known;
    int found;

    if (c == NULL)
        return 0;
    if (c->shared)
        pthread_mutex_lock(&c->mu);
    found = dlock__redis_cluster_slot_master(conn, slot, &known, port) && strlen(known) < size;
    if (found)
        memcpy(host, known, strlen(known) + 1);
    if (c->shared)
        pthread_mutex_unlock(&c->mu);
    return found;
}

/* Ask CLUSTER SLOTS of the known nodes, then of the seeds, until one
 * answers before deadline. */
static int map_refresh(dlock__redis_conn *conn, int64_t deadline)
{
    const dlock_url *u = conn->url;
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    size_t lens[2] = {7, 5};
    char why[300] = "no node known";
    int rc;

    for (size_t i = 0; i < u->nhosts; i++)
        if (node_at(conn, u->hosts[i].host, strlen(u->hosts[i].host),
                    u->hosts[i].port != 0 ? u->hosts[i].port : 6379) < 0)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < conn->cluster->n && dlock__now_ms() < deadline; i++) {
        node *nd = conn->cluster->nodes[i];
        redisReply *r = NULL;

        rc = dlock__redis_conn_command(&nd->conn, &r, 2, argv, lens);
        if (rc == DLOCK_OK) {
            rc = map_from(conn, nd, r);
            freeReplyObject(r);
            if (rc == DLOCK_OK || rc == DLOCK_ENOMEM)
                return rc;
        }
        if (rc == DLOCK_EAUTH || rc == DLOCK_EINVAL)
            return rc;
        snprintf(why, sizeof(why), "%s", dlock_error_message());
    }
    return dlock__fail(DLOCK_ECONN, "%s: no node gave the slot map (CLUSTER SLOTS): %s",
                       u->scheme, why);
}

int dlock__redis_cluster_connect_any(dlock__redis_conn *conn)
{
    const dlock_url *u = conn->url;
    int64_t deadline = dlock__now_ms() + conn->connect_ms;
    int rc = DLOCK_ECONN;

    for (size_t i = 0; i < u->nhosts; i++) {
        conn->ep.host = u->hosts[i].host;
        conn->ep.port = u->hosts[i].port != 0 ? u->hosts[i].port : 6379;
        snprintf(conn->where, sizeof(conn->where),
                 strchr(conn->ep.host, ':') ? "%s [%.64s]:%d" : "%s %.64s:%d", u->scheme,
                 conn->ep.host, conn->ep.port);
        rc = dlock__redis_conn_open_endpoint(conn, deadline);
        if (rc == DLOCK_OK || rc == DLOCK_EAUTH || rc == DLOCK_EINVAL)
            break;
    }
    return rc;
}

int dlock__redis_cluster_masters(dlock__redis_conn *conn, int *slots, int max)
{
    dlock__redis_cluster *c;
    int n = 0, rc;

    if ((rc = cluster_alloc(conn)) != DLOCK_OK ||
        (rc = map_refresh(conn, dlock__now_ms() + conn->command_ms)) != DLOCK_OK)
        return rc;
    c = conn->cluster;
    for (int s = 0; s < DLOCK__REDIS_SLOTS && n < max; s++) {
        int seen = c->slot[s] < 0;
        for (int i = 0; i < n && !seen; i++)
            seen = c->slot[slots[i]] == c->slot[s];
        if (!seen)
            slots[n++] = s;
    }
    return n;
}

/* ---- routing ----------------------------------------------------------- */

static void pause_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Whether the slot map names node at as the master of some slot. */
static int in_map(const dlock__redis_cluster *c, int at)
{
    for (int s = 0; s < DLOCK__REDIS_SLOTS; s++)
        if (c->slot[s] == at)
            return 1;
    return 0;
}

/* The index of host:port when it serves a slot of the map, else -1. */
static int map_master(const dlock__redis_cluster *c, const char *host, size_t hostlen, int port)
{
    int at = node_find(c, host, hostlen, port);

    return at >= 0 && in_map(c, at) ? at : -1;
}

int dlock__redis_nodes_line_master(const char *line, const char *end, const char *addr, int alen)
{
    const char *a = memchr(line, ' ', (size_t)(end - line)), *f, *fe;
    char flags[128];

    if (a == NULL || end - (a + 1) <= alen || memcmp(a + 1, addr, (size_t)alen) != 0 ||
        (f = memchr(a + 1, ' ', (size_t)(end - a - 1))) == NULL)
        return 0;
    if ((fe = memchr(f + 1, ' ', (size_t)(end - f - 1))) == NULL)
        fe = end;
    snprintf(flags, sizeof(flags), ",%.*s,", (int)(fe - f - 1), f + 1);
    return strstr(flags, ",master,") != NULL && strstr(flags, ",fail") == NULL &&
           strstr(flags, ",handshake,") == NULL && strstr(flags, ",noaddr,") == NULL;
}

/*
 * Whether a master of the map lists host:port as a master in good standing
 * (CLUSTER NODES): the one master an ASK may name outside the slot map, a
 * new master that serves no slot yet while the first is migrated onto it
 * (CLUSTER SLOTS lists masters with slots only). No answer, or a user
 * without +cluster|nodes, leaves it unknown.
 */
static int cluster_member(dlock__redis_conn *conn, const char *host, size_t hostlen, int port,
                          int64_t deadline)
{
    const char *argv[2] = {"CLUSTER", "NODES"};
    size_t lens[2] = {7, 5};
    dlock__redis_cluster *c = conn->cluster;
    char addr[300];
    int alen = snprintf(addr, sizeof(addr), "%.*s:%d@", (int)hostlen, host, port);

    for (size_t i = 0; i < c->n && dlock__now_ms() < deadline; i++) {
        const char *line, *nl;
        redisReply *r = NULL;
        int found = 0;

        if (!in_map(c, (int)i) ||
            dlock__redis_conn_command(&c->nodes[i]->conn, &r, 2, argv, lens) != DLOCK_OK)
            continue;
        for (line = r->type == REDIS_REPLY_STRING ? r->str : NULL; line != NULL && !found;
             line = nl != NULL ? nl + 1 : NULL) {
            nl = strchr(line, '\n');
            found = dlock__redis_nodes_line_master(line, nl != NULL ? nl : line + strlen(line), addr, alen);
        }
        freeReplyObject(r);
        return found;
    }
    return 0;
}

/*
 * "MOVED 3999 127.0.0.1:6381" / "ASK ...": the slot and the index of the
 * node it names, which must be a master of the slot map: a redirection to
 * any other address (a node that lies, or a man in the middle) would send
 * the client, with its password, where the user never pointed it. An
 * address the map does not hold has the map asked again of a known node
 * (a node added since); still unknown, the redirection is refused, but for
 * an ASK to a master a known node's CLUSTER NODES lists (cluster_member). A
 * negative DLOCK_E* code when it is refused or does not parse.
 */
int dlock__redis_redirect_parse(const char *text, long *slot, const char **host, size_t *hostlen,
                                long *port)
{
    const char *sp, *addr, *colon;
    char *end;

    if ((sp = strchr(text, ' ')) == NULL)
        return -1;
    *slot = strtol(sp + 1, &end, 10);
    if (end == sp + 1 || *end != ' ' || *slot < 0 || *slot >= DLOCK__REDIS_SLOTS)
        return -1;
    addr = end + 1;
    if ((colon = strrchr(addr, ':')) == NULL || colon == addr)
        return -1;
    *port = strtol(colon + 1, &end, 10);
    if (*end != '\0' || *port <= 0 || *port > 65535)
        return -1;
    *host = addr;
    *hostlen = (size_t)(colon - addr);
    if (addr[0] == '[' && colon[-1] == ']') { /* [::1]:6379 */
        *host = addr + 1;
        *hostlen -= 2;
    }
    return 0;
}

/* The node a redirection (text, from the node at where) names: its index,
 * or a negative DLOCK_E* code (see above). */
static int redirect_target(dlock__redis_conn *conn, const char *redirect, const char *where,
                           int64_t deadline, long *slot)
{
    char text[sizeof(conn->redirect)];
    const char *host;
    size_t hostlen;
    long port;
    int at, rc;

    /* A copy: asking the map again may use the connection it came from. */
    snprintf(text, sizeof(text), "%s", redirect);
    if (dlock__redis_redirect_parse(text, slot, &host, &hostlen, &port) != 0)
        goto bad;
    if ((at = map_master(conn->cluster, host, hostlen, (int)port)) >= 0)
        return at;
    if ((rc = map_refresh(conn, deadline)) != DLOCK_OK)
        return rc;
    if ((at = map_master(conn->cluster, host, hostlen, (int)port)) >= 0)
        return at;
    if (strncmp(text, "ASK ", 4) == 0 && cluster_member(conn, host, hostlen, (int)port, deadline)) {
        if ((at = node_at(conn, host, hostlen, (int)port)) < 0)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        return at;
    }
    return dlock__fail(DLOCK_EPROTO, "%s: refused to follow '%.100s': %.*s:%ld is not a "
                       "master in the cluster's slot map, asked again of a known node",
                       where, text, (int)(hostlen < 100 ? hostlen : 100), host, port);
bad:
    return dlock__fail(DLOCK_EPROTO, "%s: cannot follow '%.100s'", where, text);
}

/* The node to send a command for slot to (-1: any), or asking's (>= 0):
 * its index in *at, the map asked for first if need be. */
static int route(dlock__redis_conn *conn, int asking, int slot, int64_t deadline, int *at)
{
    dlock__redis_cluster *c = conn->cluster;
    int rc;

    if (!c->have_map && (rc = map_refresh(conn, deadline)) != DLOCK_OK)
        return rc;
    *at = asking >= 0 ? asking : slot >= 0 ? c->slot[slot] : 0;
    if (*at < 0) {
        c->have_map = 0;
        return dlock__fail(DLOCK_ECONN, "%s: no master serves slot %d (a cluster with slots "
                           "not covered)", conn->url->scheme, slot);
    }
    return DLOCK_OK;
}

int dlock__redis_cluster_command(dlock__redis_conn *conn, redisReply **out, int argc,
                                 const char **argv, const size_t *lens, int slot, int wait)
{
    int64_t deadline = dlock__now_ms() + conn->command_ms;
    const char *asking_argv[1] = {"ASKING"};
    size_t asking_len[1] = {6};
    int asking = -1, redirects = 0;
    int64_t pause = CLUSTER_RETRY_MS;
    int rc;

    *out = NULL;
    if ((rc = cluster_alloc(conn)) != DLOCK_OK)
        return rc;
    for (int tries = 0;; tries++) {
        dlock__redis_cluster *c = conn->cluster;
        int at;
        node *nd;
        long s;

        if (tries > 0 && (redirects >= CLUSTER_MAX_TRIES || dlock__now_ms() >= deadline))
            return rc; /* the last try's failure */
        if ((rc = route(conn, asking, slot, deadline, &at)) != DLOCK_OK)
            goto retry;
        nd = c->nodes[at];
        if (asking >= 0) {
            redisReply *ok = NULL;
            asking = -1;
            if ((rc = dlock__redis_conn_command(&nd->conn, &ok, 1, asking_argv, asking_len)) !=
                DLOCK_OK)
                goto retry;
            freeReplyObject(ok);
        }
        rc = dlock__redis_conn_command_wait(&nd->conn, out, argc, argv, lens, wait);
        if (rc == DLOCK_OK)
            return DLOCK_OK;
        if (strncmp(nd->conn.redirect, "MOVED ", 6) == 0) {
            /* The slot moved for good: note where, and ask for the whole
             * map on the next try (more slots may have moved with it). */
            if ((at = redirect_target(conn, nd->conn.redirect, nd->conn.where, deadline, &s)) < 0)
                return at;
            c->slot[s] = (short)at;
            if (redirects++ > 0)
                c->have_map = 0;
            continue;
        }
        if (strncmp(nd->conn.redirect, "ASK ", 4) == 0) {
            /* The slot is migrating and this key has gone: this command
             * only, on the importing node. */
            if ((asking = redirect_target(conn, nd->conn.redirect, nd->conn.where, deadline,
                                          &s)) < 0)
                return asking;
            redirects++;
            continue;
        }
        if (nd->conn.redirect[0] == '\0' &&
            !(rc == DLOCK_ECONN && !nd->conn.timed_out))
            return rc; /* the command's own failure, or a silent server */
        /* TRYAGAIN, CLUSTERDOWN, or a master that went away (a failover):
         * wait a little and ask for the map again. */
        if (nd->conn.redirect[0] == '\0' || strncmp(nd->conn.redirect, "CLUSTERDOWN", 11) == 0)
            c->have_map = 0;
    retry:
        if (rc == DLOCK_EAUTH || rc == DLOCK_EINVAL || rc == DLOCK_ENOMEM)
            return rc;
        if (dlock__now_ms() + pause >= deadline) {
            /* The time left is shorter than a pause: one last try at its end. */
            if (dlock__now_ms() + 1 >= deadline)
                return rc;
            pause = deadline - dlock__now_ms() - 1;
        }
        pause_ms(pause);
        pause = pause * 2 < CLUSTER_RETRY_MAX_MS ? pause * 2 : CLUSTER_RETRY_MAX_MS;
    }
}

/* ---- the shared routing state ---------------------------------------------------- */

/* The text of an error reply the router acts on (a redirection, or a
 * cluster state to wait out), else "". */
static void redirect_of(const redisReply *r, char *buf, size_t size)
{
    buf[0] = '\0';
    if (r->type == REDIS_REPLY_ERROR &&
        (strncmp(r->str, "MOVED ", 6) == 0 || strncmp(r->str, "ASK ", 4) == 0 ||
         strncmp(r->str, "TRYAGAIN", 8) == 0 || strncmp(r->str, "CLUSTERDOWN", 11) == 0))
        snprintf(buf, size, "%.*s", (int)(r->len < size - 1 ? r->len : size - 1), r->str);
}

int dlock__redis_cluster_mux_command(dlock__redis_conn *conn, redisReply **out,
                                     redisReply **wait_out, int argc, const char **argv,
                                     const size_t *lens, int slot, int wait,
                                     const dlock__redis_conn **where)
{
    dlock__redis_cluster *c = conn->cluster;
    int64_t deadline = dlock__now_ms() + conn->command_ms;
    int64_t pause = CLUSTER_RETRY_MS;
    int asking = -1, redirects = 0;
    int rc = DLOCK_ECONN;

    *out = *wait_out = NULL;
    pthread_mutex_lock(&c->mu);
    for (int tries = 0;; tries++) {
        char redirect[sizeof(conn->redirect)];
        redisReply *r = NULL, *w = NULL;
        int at, ask, timed_out = 0;
        node *nd;
        long s;

        if (tries > 0 && (redirects >= CLUSTER_MAX_TRIES || dlock__now_ms() >= deadline))
            break; /* with the last try's failure */
        if ((rc = route(conn, asking, slot, deadline, &at)) != DLOCK_OK)
            goto retry;
        /* Nodes are freed with the routing state only: nd outlives mu. */
        nd = c->nodes[at];
        if (!nd->mux.on && (rc = dlock__redis_mux_init(&nd->mux, &nd->conn)) != DLOCK_OK)
            break;
        ask = asking >= 0;
        asking = -1;
        pthread_mutex_unlock(&c->mu);
        rc = dlock__redis_mux_call(&nd->mux, &r, &w, argc, argv, lens, wait, ask, &timed_out);
        pthread_mutex_lock(&c->mu);
        if (rc != DLOCK_OK) {
            if (!(rc == DLOCK_ECONN && !timed_out))
                break; /* the command's own failure, or a silent server */
            c->have_map = 0; /* a master that went away (a failover) */
            goto retry;
        }
        redirect_of(r, redirect, sizeof(redirect));
        if (redirect[0] == '\0') {
            pthread_mutex_unlock(&c->mu);
            *out = r;
            *wait_out = w;
            *where = &nd->conn;
            return DLOCK_OK;
        }
        rc = dlock__redis_conn_reply_error(&nd->conn, r);
        freeReplyObject(r);
        if (w != NULL)
            freeReplyObject(w);
        if (strncmp(redirect, "MOVED ", 6) == 0) {
            /* As dlock__redis_cluster_command does. */
            if ((at = redirect_target(conn, redirect, nd->conn.where, deadline, &s)) < 0) {
                rc = at;
                break;
            }
            c->slot[s] = (short)at;
            if (redirects++ > 0)
                c->have_map = 0;
            continue;
        }
        if (strncmp(redirect, "ASK ", 4) == 0) {
            if ((asking = redirect_target(conn, redirect, nd->conn.where, deadline, &s)) < 0) {
                rc = asking;
                break;
            }
            redirects++;
            continue;
        }
        if (strncmp(redirect, "CLUSTERDOWN", 11) == 0)
            c->have_map = 0;
    retry:
        if (rc == DLOCK_EAUTH || rc == DLOCK_EINVAL || rc == DLOCK_ENOMEM)
            break;
        if (dlock__now_ms() + pause >= deadline) {
            if (dlock__now_ms() + 1 >= deadline)
                break;
            pause = deadline - dlock__now_ms() - 1;
        }
        pthread_mutex_unlock(&c->mu);
        pause_ms(pause);
        pthread_mutex_lock(&c->mu);
        pause = pause * 2 < CLUSTER_RETRY_MAX_MS ? pause * 2 : CLUSTER_RETRY_MAX_MS;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}
