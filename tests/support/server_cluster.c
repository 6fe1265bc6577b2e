/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Cluster (test_cluster_*): 3 masters on loopback, and the test server
 * "redis-cluster" on them.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "test_server.h"

/* Claim port among this machine's test processes: an flock on a file of
 * its own, held until this process exits (parallel tests would otherwise
 * see the same port free and race to start on it). */
static int port_claim(int port)
{
    char path[64];
    int fd;

    snprintf(path, sizeof(path), "/tmp/dlock-test-port-%d.lock", port);
    if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
        return 0;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return 0;
    }
    return 1; /* fd stays open: the claim lasts as long as the process */
}

/* A port of 21200-21299 whose cluster bus port (+10000) is free too,
 * from a random start (parallel tests), skipping taken ones. Both below
 * the kernel's ephemeral range (32768-60999): with 48200-48299 a bus port
 * of 582xx was now and then the local port of some test's connection, and
 * the node could not start on any of its five tries (core-redis-cluster
 * under TSan in CI). The other test servers take kernel-picked ports, all
 * in that range, so none of them takes these. */
static int cluster_port(const test_cluster *c, int upto)
{
    static unsigned seed;
    if (seed == 0)
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    int start = (int)(rand_r(&seed) % 100);
    for (int i = 0; i < 100; i++) {
        int port = 21200 + (start + i) % 100, mine = 0;
        for (int j = 0; j < upto; j++)
            mine = mine || c->nodes[j].port == port;
        if (!mine && test__port_free(port) && test__port_free(port + 10000) && port_claim(port))
            return port;
    }
    fprintf(stderr, "test_cluster_start: no free port pair in 21200-21299 (+10000)\n");
    exit(1);
}

static redisReply *cluster_raw(test_redis *r, const char *fmt, ...)
{
    redisReply *rep;
    va_list ap;

    va_start(ap, fmt);
    rep = test__redis_vcommand(r, "cluster", fmt, ap);
    va_end(ap);
    return rep;
}

static int cluster_ok(test_redis *r)
{
    redisReply *rep = cluster_raw(r, "CLUSTER INFO");
    int ok = rep != NULL && rep->type == REDIS_REPLY_STRING &&
             strstr(rep->str, "cluster_state:ok") != NULL;
    if (rep != NULL)
        freeReplyObject(rep);
    return ok;
}

static void cluster_start(test_cluster *c, const char *extra_args, const test_tls *t,
                          int replicas)
{
    char extra[1024], cmd[1024], tls[600] = "";
    size_t len;

    memset(c, 0, sizeof(*c));
    c->n = replicas ? 2 * TEST_CLUSTER_NODES : TEST_CLUSTER_NODES;
    if (t != NULL)
        test__redis_tls_args(tls, sizeof(tls), t);
    /* (Redis 7 waits 5 s before a diskless full sync, in case more
     * replicas come.) */
    snprintf(extra, sizeof(extra), "--cluster-enabled yes --cluster-config-file nodes.conf "
             "--cluster-node-timeout 5000 --repl-diskless-sync-delay 0 %s%s%s",
             extra_args ? extra_args : "", tls, t != NULL ? " --tls-cluster yes" : "");
    for (int i = 0; i < c->n; i++)
        test__redis_start_at(&c->nodes[i], extra, t != NULL, NULL, cluster_port(c, i));
    /* Over TLS, redis-cli reaches the nodes on their TLS ports with the
     * servers' certificate as its client certificate. */
    if (t != NULL)
        len = (size_t)snprintf(cmd, sizeof(cmd), "redis-cli --tls --cacert %s/ca.crt --cert "
                               "%s/server.crt --key %s/server.key --cluster create", t->dir,
                               t->dir, t->dir);
    else
        len = (size_t)snprintf(cmd, sizeof(cmd), "redis-cli --cluster create");
    for (int i = 0; i < c->n; i++)
        len += (size_t)snprintf(cmd + len, sizeof(cmd) - len, " 127.0.0.1:%d",
                                test__redis_served_port(&c->nodes[i]));
    snprintf(cmd + len, sizeof(cmd) - len, "%s --cluster-yes >%s/create.log 2>&1",
             replicas ? " --cluster-replicas 1" : "", c->nodes[0].dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_cluster_start: redis-cli --cluster create failed (%s/create.log)"
                "\n", c->nodes[0].dir);
        exit(1);
    }
    len = (size_t)snprintf(c->url, sizeof(c->url), t != NULL ? "rediss-cluster://"
                                                             : "redis-cluster://");
    for (int i = 0; i < c->n; i++)
        len += (size_t)snprintf(c->url + len, sizeof(c->url) - len, "%s127.0.0.1:%d",
                                i ? "," : "", test__redis_served_port(&c->nodes[i]));
    if (t != NULL)
        snprintf(c->url + len, sizeof(c->url) - len, "?cacert=%s/ca.crt", t->dir);
    for (int t = 0; t < 3000; t++) { /* up to 60 s on a loaded machine */
        int ok = 1;
        for (int i = 0; i < c->n; i++)
            ok = ok && cluster_ok(&c->nodes[i]) &&
                 (!replicas || test__redis_synced(&c->nodes[i], 1));
        if (ok)
            return;
        test_sleep_ms(20);
    }
    fprintf(stderr, "test_cluster_start: the cluster did not reach cluster_state:ok\n");
    exit(1);
}

void test_cluster_start(test_cluster *c, const char *extra_args)
{
    cluster_start(c, extra_args, NULL, 0);
}

int test_cluster_add_master(test_cluster *c)
{
    int i = c->n;
    char cmd[512];

    if (i >= 2 * TEST_CLUSTER_NODES) {
        fprintf(stderr, "test_cluster_add_master: no room for node %d\n", i);
        exit(1);
    }
    test__redis_start_at(&c->nodes[i], "--cluster-enabled yes --cluster-config-file nodes.conf "
                   "--cluster-node-timeout 5000", 0, NULL, cluster_port(c, i));
    snprintf(cmd, sizeof(cmd), "redis-cli --cluster add-node 127.0.0.1:%d 127.0.0.1:%d "
             ">%s/add-node.log 2>&1", c->nodes[i].port, c->nodes[0].port, c->nodes[i].dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "test_cluster_add_master: redis-cli --cluster add-node failed "
                "(%s/add-node.log)\n", c->nodes[i].dir);
        exit(1);
    }
    c->n++;
    for (int t = 0; t < 3000; t++) { /* every node knows it, as a master */
        int ok = cluster_ok(&c->nodes[i]);
        for (int k = 0; k < i && ok; k++) {
            redisReply *rep = cluster_raw(&c->nodes[k], "CLUSTER NODES");
            char needle[32];
            snprintf(needle, sizeof(needle), ":%d@", c->nodes[i].port);
            ok = rep != NULL && rep->type == REDIS_REPLY_STRING &&
                 strstr(rep->str, needle) != NULL;
            if (rep != NULL)
                freeReplyObject(rep);
        }
        if (ok)
            return i;
        test_sleep_ms(20);
    }
    fprintf(stderr, "test_cluster_add_master: the cluster did not take node %d in\n", i);
    exit(1);
}

void test_cluster_start_replicas(test_cluster *c, const char *extra_args)
{
    cluster_start(c, extra_args, NULL, 1);
}

void test_cluster_start_tls(test_cluster *c, const test_tls *t)
{
    cluster_start(c, NULL, t, 0);
}

void test_cluster_stop(test_cluster *c)
{
    for (int i = 0; i < c->n; i++)
        test_redis_stop(&c->nodes[i]);
}

int test_cluster_slot(test_cluster *c, const char *key)
{
    return (int)test_redis_cmd(&c->nodes[0], "CLUSTER KEYSLOT %s", key);
}

/* The node id of node i. */
static void cluster_id(test_cluster *c, int i, char *id, size_t size)
{
    redisReply *rep = cluster_raw(&c->nodes[i], "CLUSTER MYID");
    if (rep == NULL || rep->type != REDIS_REPLY_STRING) {
        fprintf(stderr, "cluster: CLUSTER MYID failed on port %d\n", c->nodes[i].port);
        exit(1);
    }
    snprintf(id, size, "%s", rep->str);
    freeReplyObject(rep);
}

int test_cluster_owner(test_cluster *c, int slot)
{
    /* The node that serves a key of the slot: COUNTKEYSINSLOT answers on
     * every node, so ask each whether it has the slot in its own map. */
    for (int i = 0; i < c->n; i++) {
        redisReply *rep;
        int mine = 0;
        if (c->nodes[i].pid <= 0) /* killed by the test */
            continue;
        rep = cluster_raw(&c->nodes[i], "CLUSTER SLOTS");
        for (size_t e = 0; rep != NULL && rep->type == REDIS_REPLY_ARRAY && e < rep->elements;
             e++) {
            redisReply *r = rep->element[e];
            if (r->element[0]->integer <= slot && slot <= r->element[1]->integer &&
                (r->element[2]->element[1]->integer == c->nodes[i].port ||
                 r->element[2]->element[1]->integer == test__redis_served_port(&c->nodes[i])))
                mine = 1;
        }
        if (rep != NULL)
            freeReplyObject(rep);
        if (mine)
            return i;
    }
    return -1;
}

static void cluster_must(redisReply *rep, const char *what)
{
    if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "cluster: %s failed: %s\n", what,
                rep != NULL ? rep->str : "no reply");
        exit(1);
    }
    freeReplyObject(rep);
}

void test_cluster_mark_migrating(test_cluster *c, int slot, int to)
{
    int from = test_cluster_owner(c, slot);
    char from_id[64], to_id[64];

    if (from < 0 || from == to) {
        fprintf(stderr, "cluster: slot %d is on node %d, cannot move it to %d\n", slot, from,
                to);
        exit(1);
    }
    cluster_id(c, from, from_id, sizeof(from_id));
    cluster_id(c, to, to_id, sizeof(to_id));
    cluster_must(cluster_raw(&c->nodes[to], "CLUSTER SETSLOT %d IMPORTING %s", slot, from_id),
                 "SETSLOT IMPORTING");
    cluster_must(cluster_raw(&c->nodes[from], "CLUSTER SETSLOT %d MIGRATING %s", slot, to_id),
                 "SETSLOT MIGRATING");
}

void test_cluster_migrate_key(test_cluster *c, int slot, int to, const char *key)
{
    cluster_must(cluster_raw(&c->nodes[test_cluster_owner(c, slot)],
                             "MIGRATE 127.0.0.1 %d %s 0 5000",
                             test__redis_served_port(&c->nodes[to]), key),
                 "MIGRATE");
}

void test_cluster_migrate_keys(test_cluster *c, int slot, int to, int pause_ms)
{
    int from = test_cluster_owner(c, slot);

    test_cluster_mark_migrating(c, slot, to);
    test_sleep_ms(pause_ms);
    for (;;) {
        redisReply *keys = cluster_raw(&c->nodes[from], "CLUSTER GETKEYSINSLOT %d 100", slot);
        size_t n = keys != NULL && keys->type == REDIS_REPLY_ARRAY ? keys->elements : 0;
        for (size_t i = 0; i < n; i++) {
            /* One key at a time: the others of the slot wait meanwhile,
             * as with a reshard's batches. */
            test_cluster_migrate_key(c, slot, to, keys->element[i]->str);
            test_sleep_ms(pause_ms / 4);
        }
        if (keys != NULL)
            freeReplyObject(keys);
        if (n == 0)
            break;
    }
}

void test_cluster_finish_slot(test_cluster *c, int slot, int to)
{
    int from = test_cluster_owner(c, slot);
    char to_id[64];

    cluster_id(c, to, to_id, sizeof(to_id));
    cluster_must(cluster_raw(&c->nodes[to], "CLUSTER SETSLOT %d NODE %s", slot, to_id),
                 "SETSLOT NODE (target)");
    cluster_must(cluster_raw(&c->nodes[from], "CLUSTER SETSLOT %d NODE %s", slot, to_id),
                 "SETSLOT NODE (source)");
    for (int i = 0; i < c->n; i++)
        if (i != from && i != to)
            cluster_must(cluster_raw(&c->nodes[i], "CLUSTER SETSLOT %d NODE %s", slot, to_id),
                         "SETSLOT NODE (other)");
}

void test_cluster_move_slot(test_cluster *c, int slot, int to, int pause_ms)
{
    test_cluster_migrate_keys(c, slot, to, pause_ms);
    test_cluster_finish_slot(c, slot, to);
}

long long test_cluster_cmd(test_cluster *c, const char *key, const char *fmt, ...)
{
    int at = test_cluster_owner(c, test_cluster_slot(c, key));
    redisReply *rep;
    va_list ap;

    if (at < 0) {
        fprintf(stderr, "test_cluster_cmd: no node serves %s\n", key);
        exit(1);
    }
    va_start(ap, fmt);
    rep = test__redis_vcommand(&c->nodes[at], "test_cluster_cmd", fmt, ap);
    va_end(ap);
    return test__redis_number(rep);
}


/* ---- the test server "redis-cluster" ---- */

/* The redis backend on 3 masters; checks ask the node serving the name's
 * slot. */
static void cluster_server_start(test_server *s)
{
    if ((s->cluster = malloc(sizeof(*s->cluster))) == NULL)
        fprintf(stderr, "out of memory\n"), exit(1);
    test_cluster_start(s->cluster, NULL);
    s->url = s->cluster->url;
}

static void cluster_server_stop(test_server *s)
{
    test_cluster_stop(s->cluster);
    free(s->cluster);
    s->cluster = NULL;
}

static void cluster_server_pause(test_server *s, int paused)
{
    for (int i = 0; i < s->cluster->n; i++)
        if (kill(s->cluster->nodes[i].pid, paused ? SIGSTOP : SIGCONT) != 0)
            fprintf(stderr, "kill: %s\n", strerror(errno)), exit(1);
}

static int cluster_server_held(test_server *s, const char *name)
{
    char key[600];

    snprintf(key, sizeof(key), "dlock:{%s}", name);
    return test_cluster_cmd(s->cluster, key, "EXISTS %s", key) == 1;
}

static long long cluster_server_leftovers(test_server *s, const char *name)
{
    char key[600];

    snprintf(key, sizeof(key), "dlock:{%s}", name);
    return test_cluster_cmd(s->cluster, key, "EXISTS %s %s:next", key, key);
}

static long long cluster_server_requests(test_server *s)
{
    long long n = 0;

    for (int k = 0; k < s->cluster->n; k++)
        n += test__redis_scripts(&s->cluster->nodes[k]);
    return n;
}

const test_server_ops test_server_cluster = {
    .name = "redis-cluster",
    .backend = "redis",
    .short_lease_ms = 300,
    .dense_fences = 1,
    .waiter_leftovers = 1,
    .start = cluster_server_start,
    .stop = cluster_server_stop,
    .pause = cluster_server_pause,
    .held = cluster_server_held,
    .leftovers = cluster_server_leftovers,
    .requests = cluster_server_requests,
};
