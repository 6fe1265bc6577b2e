/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Redlock: extend, check and renew. Each runs renew.lua on every node at
 * once and holds when a quorum still has the key for the token; a renewal
 * that a quorum no longer grants gives the lock up (reset.lua) where it
 * still holds, so that no minority keeps it (docs/redlock.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redlock/redlock_int.h"
#include "core/error.h"

typedef dlock__redlock_be redlock_backend;
typedef dlock__redlock_answer answer;

/* One lock's arguments to renew.lua and reset.lua: token, PX, owner. */
static void lock_args(const char **argv, size_t *lens, const dlock_request *req,
                      const char *px)
{
    argv[0] = req->token;
    argv[1] = px;
    argv[2] = dlock__redlock_owner_arg(req);
    for (int i = 0; i < 3; i++)
        lens[i] = strlen(argv[i]);
}

/* A renewal's fan-out (n locks, each node's reply an array of n) is decided
 * once every lock is: Q nodes had it, or Q no longer can. Failed nodes make
 * it wait for the rest, as tally does. */
typedef struct {
    const redlock_backend *be;
    size_t n, failed;
    size_t yes[128], no[128];
} renew_tally;

static int renew_decided(void *arg, const answer *ans, size_t node)
{
    renew_tally *t = arg;
    const redisReply *r = ans[node].reply;
    int all = 1;

    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != t->n) {
        t->failed++;
        return 0;
    }
    for (size_t i = 0; i < t->n; i++) {
        if (r->element[i]->type == REDIS_REPLY_INTEGER && r->element[i]->integer == 1)
            t->yes[i]++;
        else
            t->no[i]++;
        all &= t->yes[i] >= t->be->quorum || t->no[i] > t->be->n - t->be->quorum;
    }
    return all && t->failed == 0;
}

/*
 * Renew (lease_ms > 0 in each request) or check n locks on all nodes in one
 * round, on the connections of set (the watchdog's, or a callers' set the
 * caller took). A lock a
 * quorum holds for its token is set again on the nodes that lost it (they
 * restarted empty). results[i]: DLOCK_OK, DLOCK_ELOST, or unknown (a
 * connection error) when the nodes that answered cannot decide: then the
 * call returns that error. It returns once every lock is decided: a node
 * not waited for is renewed when the request reaches it, or set again at
 * a later renewal if it lost the key.
 */
static int renew_on(redlock_backend *be, int set, dlock_renewal *items, size_t n, int renew)
{
    answer ans[DLOCK__REDLOCK_NODES_MAX];
    size_t nargs = 4 * n, ours[128] = {0}, others[128] = {0};
    unsigned absent[128] = {0};
    dlock__redlock_key *keys;
    char (*pxs)[24];
    const char **argv;
    size_t *lens;
    renew_tally *rt;
    int64_t timeout = INT64_MAX;
    int rc = DLOCK_OK;

    if (n == 0)
        return DLOCK_OK;
    if (n > 128)
        return dlock__fail(DLOCK_EINVAL, "redlock: at most 128 locks per renewal");
    keys = malloc(n * sizeof(*keys));
    pxs = malloc(n * sizeof(*pxs));
    argv = malloc(nargs * sizeof(*argv));
    lens = malloc(nargs * sizeof(*lens));
    rt = calloc(1, sizeof(*rt));
    if (keys == NULL || pxs == NULL || argv == NULL || lens == NULL || rt == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const dlock_request *req = items[i].req;
        int64_t t = dlock__redlock_node_timeout_ms(be, req->lease_ms);
        dlock__redlock_make_key(&keys[i], be, req->name, "");
        snprintf(pxs[i], sizeof(pxs[i]), "%lld",
                 renew ? (long long)dlock__redlock_node_px(be, req->lease_ms) : 0LL);
        argv[i] = keys[i].buf;
        lens[i] = keys[i].len;
        lock_args(argv + n + 3 * i, lens + n + 3 * i, req, pxs[i]);
        if (t < timeout)
            timeout = t;
    }
    rt->be = be;
    rt->n = n;
    dlock__redlock_fanout(be, set, set == DLOCK__REDLOCK_WD ? NULL : items[0].req->token,
                          dlock__redlock_all_nodes(be), &dlock__redlock_script_renew, (int)n,
                          (int)(4 * n), argv, lens, timeout, renew_decided, rt, ans);
    for (size_t j = 0; j < be->n; j++) {
        redisReply *r = ans[j].reply;
        if (r == NULL)
            continue;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
            dlock__redlock_bad_reply(&ans[j], &be->nodes[j], "the renew script");
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            long long v = r->element[i]->type == REDIS_REPLY_INTEGER ? r->element[i]->integer
                                                                    : -1;
            if (v == 1)
                ours[i]++;
            else if (v == 0)
                absent[i] |= 1u << j;
            else
                others[i]++;
        }
    }
    for (size_t i = 0; i < n && rc == DLOCK_OK; i++) {
        size_t known = ours[i] + others[i];
        for (unsigned m = absent[i]; m; m &= m - 1)
            known++;
        if (ours[i] >= be->quorum)
            items[i].result = DLOCK_OK;
        else if (ours[i] + (be->n - known) < be->quorum)
            items[i].result = DLOCK_ELOST;
        else
            rc = dlock__redlock_fail_quorum(be, renew ? "renewing" : "checking", ours[i], ans,
                                            dlock__redlock_all_nodes(be), DLOCK_ECONN);
    }
    dlock__redlock_answers_free(ans, be->n);
    if (rc != DLOCK_OK || !renew)
        goto out;

    /* Set again what a quorum holds and some nodes lost, one batch per
     * node (the locks it lost). Best effort: the quorum holds already. */
    for (size_t j = 0; j < be->n; j++) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (items[i].result != DLOCK_OK || !(absent[i] & (1u << j)))
                continue;
            argv[k] = keys[i].buf;
            lens[k] = keys[i].len;
            k++;
        }
        if (k == 0)
            continue;
        /* The arguments follow the keys: rebuild them for these k locks. */
        for (size_t i = 0, m = 0; i < n; i++) {
            if (items[i].result != DLOCK_OK || !(absent[i] & (1u << j)))
                continue;
            lock_args(argv + k + 3 * m, lens + k + 3 * m, items[i].req, pxs[i]);
            m++;
        }
        dlock__redlock_fanout(be, set, set == DLOCK__REDLOCK_WD ? NULL : items[0].req->token,
                              1u << j, &dlock__redlock_script_reset, (int)k,
                              (int)(4 * k), argv, lens, timeout, NULL, NULL, ans);
        dlock__redlock_answers_free(ans, be->n);
    }
out:
    free(rt);
    free(keys);
    free(pxs);
    free(argv);
    free(lens);
    return rc;
}

int dlock__redlock_renew(void *arg, dlock_renewal *items, size_t n)
{
    /* The watchdog's own set: no lock needed (one call at a time). */
    return renew_on(arg, DLOCK__REDLOCK_WD, items, n, 1);
}

static int one_on_cmd(redlock_backend *be, const dlock_request *req, int renew)
{
    dlock_renewal item = {req, DLOCK_EPROTO};
    int set = dlock__redlock_set_take(be, req->token);
    char saved[1024];
    int rc;

    rc = renew_on(be, set, &item, 1, renew);
    snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    dlock__redlock_set_give(be, set);
    if (rc != DLOCK_OK)
        return dlock__fail(rc, "%s", saved);
    if (item.result == DLOCK_ELOST)
        return dlock__fail(DLOCK_ELOST, "redlock: lock '%s' is not held on a quorum",
                           req->name);
    return DLOCK_OK;
}

int dlock__redlock_extend(void *be, const dlock_request *req)
{
    return one_on_cmd(be, req, 1);
}

int dlock__redlock_check(void *be, const dlock_request *req)
{
    return one_on_cmd(be, req, 0);
}
