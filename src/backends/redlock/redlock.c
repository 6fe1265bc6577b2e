/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Redlock backend: one lock over N independent Redis masters, held
 * when a majority Q = N/2+1 granted it, with a fence that increases across
 * holders (docs/redlock.md has the design, what it assumes and why the fence
 * increases).
 *
 * Keys on every node, for lock NAME and the default prefix "dlock:":
 *   dlock:{NAME}          the lock: token, with PX = lease + drift
 *   dlock:{NAME}:fence    the node's fence high-water mark: the highest fence
 *                         a holder recorded there while it held the key;
 *                         never decreases (while the node keeps its data)
 *   dlock:{NAME}:release  the pub/sub channel a release is announced on
 *   dlock:{NAME}:holds    with an owner id (the key then holds the owner id):
 *                         HASH token -> fence recorded here, one per handle
 *   dlock:{NAME}:waiters  set (for a waiter's lease) by a waiter that found
 *                         the key busy here, or that won it while others of
 *                         its client wait: a release publishes only then
 *
 * Acquire: round 1 (acquire.lua) on all nodes at once, each with the
 * per-node timeout, until Q granted or Q no longer can; held if Q granted
 * and less than the lease has passed since the requests were sent. A node
 * that grants raises its mark by one in the same step and replies it; the
 * fence F is the highest value the granting nodes replied. When Q of them
 * replied F, F is recorded on a quorum while it holds our key, and it is
 * returned at once (one round). Otherwise round 2 (confirm.lua) writes F to
 * the granting nodes while the key is still ours there; only when Q confirm
 * is F returned. On any failure the lock is released on every node but
 * those held by another, including the nodes that did not answer.
 *
 * The lease: the nodes keep the key for lease + drift (drift = lease / 100 +
 * 2 ms, or drift_ms=), the core counts lease from when the requests were sent.
 * So the handle's validity is the nodes' time-to-live minus the elapsed time
 * minus the drift: Redlock's rule, the same for acquire, extend and renew.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "backends/redlock/redlock_int.h"
#include "core/clock.h"
#include "core/error.h"

typedef dlock__redlock_be redlock_backend;
typedef dlock__redlock_answer answer;

void dlock__redlock_make_key(dlock__redlock_key *k, const redlock_backend *be, const char *name,
                             const char *suffix)
{
    k->len = (size_t)snprintf(k->buf, sizeof(k->buf), "%s{%s}%s", be->prefix, name, suffix);
}

unsigned dlock__redlock_all_nodes(const redlock_backend *be)
{
    return (1u << be->n) - 1;
}

int64_t dlock__redlock_drift_ms(const redlock_backend *be, int64_t lease_ms)
{
    return be->drift_ms >= 0 ? be->drift_ms : lease_ms / 100 + 2;
}

/* What the nodes set: the lease plus the drift (see the top). */
int64_t dlock__redlock_node_px(const redlock_backend *be, int64_t lease_ms)
{
    return lease_ms + dlock__redlock_drift_ms(be, lease_ms);
}

int64_t dlock__redlock_node_timeout_ms(const redlock_backend *be, int64_t lease_ms)
{
    int64_t t = lease_ms / 10;

    if (be->node_timeout_ms >= 0)
        return be->node_timeout_ms;
    if (t > be->command_timeout_ms)
        t = be->command_timeout_ms;
    return t < 5 ? 5 : t;
}

static int is_int_triple(const redisReply *r)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
           r->element[0]->type == REDIS_REPLY_INTEGER &&
           r->element[1]->type == REDIS_REPLY_INTEGER &&
           r->element[2]->type == REDIS_REPLY_INTEGER && r->element[2]->integer >= 0;
}

/* The scripts' owner argument: the owner id, or "" for the plain mutex
 * (whose key holds the token). */
const char *dlock__redlock_owner_arg(const dlock_request *req)
{
    return req->owner != NULL ? req->owner : "";
}

void dlock__redlock_bad_reply(answer *a, const dlock__redlock_node *node, const char *what)
{
    a->code = dlock__fail(DLOCK_EPROTO, "%s: unexpected reply to %s", node->link[0].conn.where,
                          what);
    snprintf(a->why, sizeof(a->why), "%s", dlock_error_message());
}

/* ---- the callers' sets -------------------------------------------------- */

/* Whether token has requests owed on set, as it was last given back. */
static int pinned(const redlock_backend *be, int set, const char *token)
{
    for (size_t i = 0; i < be->npin[set]; i++)
        if (strncmp(be->pin[set][i], token, DLOCK_BACKEND_TOKEN_LEN) == 0)
            return 1;
    return 0;
}

int dlock__redlock_set_take(redlock_backend *be, const char *token)
{
    int pick = -1, first;

    pthread_mutex_lock(&be->cmd_mu);
    for (;;) {
        int want = -1;
        /* A token with requests owed on a set: that one. */
        for (int k = 0; token != NULL && k < DLOCK__REDLOCK_SETS && want < 0; k++)
            if (pinned(be, k, token))
                want = k;
        /* Else a free set that was used before (its connections may be
         * open), one no token waits for first, else the first free one. */
        if (want >= 0 && !be->set_busy[want])
            pick = want;
        for (int pass = 0; pass < 3 && pick < 0 && want < 0; pass++)
            for (int k = 0; k < DLOCK__REDLOCK_SETS && pick < 0; k++)
                if (!be->set_busy[k] && (pass == 2 || (be->set_used[k] &&
                                                       (pass == 1 || be->npin[k] == 0))))
                    pick = k;
        if (pick >= 0)
            break;
        pthread_cond_wait(&be->cmd_freed, &be->cmd_mu);
    }
    be->set_busy[pick] = 1;
    first = !be->set_used[pick];
    be->set_used[pick] = 1;
    pthread_mutex_unlock(&be->cmd_mu);
    if (first && pick > 0 && be->ring[0] != NULL) {
        /* Ours alone now. A kernel that gave the first set a ring gives
         * more; if not, this set waits with poll(2). */
        char saved[512];
        dlock__redlock_message_save(saved, sizeof(saved));
        if (dlock__redlock_ring_open(&be->ring[pick], be->n) != DLOCK_OK)
            be->ring[pick] = NULL;
        dlock__redlock_message_restore(saved);
    }
    return pick;
}

/* The tokens owed on set's connections now, into be->pin[set] (cmd_mu
 * held). Out of memory, the connections that owe a token's reply are
 * closed, as for a node that owes too many. */
static void pin_owed(redlock_backend *be, int set)
{
    size_t need = 0;

    be->npin[set] = 0;
    for (size_t i = 0; i < be->n; i++) {
        const dlock__redlock_link *l = &be->nodes[i].link[set];
        if (l->whose != NULL && dlock__redis_conn_is_open(&l->conn))
            need += (size_t)l->owed;
    }
    if (need > be->pin_cap[set]) {
        void *grown = realloc(be->pin[set], need * sizeof(*be->pin[set]));
        if (grown == NULL) {
            for (size_t i = 0; i < be->n; i++)
                if (be->nodes[i].link[set].whose != NULL)
                    dlock__redis_conn_close(&be->nodes[i].link[set].conn);
            return;
        }
        be->pin[set] = grown;
        be->pin_cap[set] = need;
    }
    for (size_t i = 0; i < be->n && need > 0; i++) {
        const dlock__redlock_link *l = &be->nodes[i].link[set];
        if (l->whose == NULL || !dlock__redis_conn_is_open(&l->conn))
            continue;
        for (int k = 0; k < l->owed; k++) {
            const char *t = l->whose[(l->first + k) % DLOCK__REDLOCK_OWED_SLOTS];
            if (t[0] != '\0')
                memcpy(be->pin[set][be->npin[set]++], t, DLOCK_BACKEND_TOKEN_LEN + 1);
        }
    }
}

void dlock__redlock_set_give(redlock_backend *be, int set)
{
    pthread_mutex_lock(&be->cmd_mu);
    pin_owed(be, set);
    be->set_busy[set] = 0;
    pthread_cond_broadcast(&be->cmd_freed);
    pthread_mutex_unlock(&be->cmd_mu);
}

/* ---- open / close ---------------------------------------------------- */

static void redlock_close(void *arg)
{
    redlock_backend *be = arg;

    if (be == NULL)
        return;
    for (size_t i = 0; i < be->n; i++) {
        dlock__redis_watcher_free(be->nodes[i].watcher);
        for (int k = 0; k <= DLOCK__REDLOCK_WD; k++) {
            dlock__redis_conn_close(&be->nodes[i].link[k].conn);
            free(be->nodes[i].link[k].whose);
        }
    }
    for (int k = 0; k < DLOCK__REDLOCK_SETS; k++)
        free(be->pin[k]);
    for (int k = 0; k <= DLOCK__REDLOCK_WD; k++)
        dlock__redlock_ring_close(be->ring[k]);
    pthread_cond_destroy(&be->cmd_freed);
    pthread_mutex_destroy(&be->cmd_mu);
    free(be->node_params);
    free(be->prefix);
    free(be);
}

static int ms_param(const dlock_url *url, const char *key, int64_t *out)
{
    const char *v = dlock_url_param_get(url, key);
    char *end;
    long long n;

    *out = -1;
    if (v == NULL)
        return DLOCK_OK;
    errno = 0;
    n = strtoll(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0 || n < 0 || n > 86400000)
        return dlock__fail(DLOCK_EINVAL, "redlock URL: %s must be a number of ms, got '%.32s'",
                           key, v);
    *out = n;
    return DLOCK_OK;
}

/* Checks the URL; *tls: tls=1 (every node over TLS, with the TLS
 * parameters of rediss://); *io: io= (DLOCK__REDLOCK_IO_*). */
static int check_url(const dlock_url *url, int *tls, int *io)
{
    const char *t = dlock_url_param_get(url, "tls");
    const char *v = dlock_url_param_get(url, "io");
    dlock__redis_endpoint ep;
    int rc;

    if (url->nhosts < 3 || url->nhosts % 2 == 0 || url->nhosts > DLOCK__REDLOCK_NODES_MAX)
        return dlock__fail(DLOCK_EINVAL, "redlock URL: expected an odd number of nodes from 3 "
                           "to %d (redlock://h1:p1,h2:p2,h3:p3), got %zu",
                           DLOCK__REDLOCK_NODES_MAX, url->nhosts);
    if (t != NULL && strcmp(t, "0") != 0 && strcmp(t, "1") != 0)
        return dlock__fail(DLOCK_EINVAL, "redlock URL: tls must be 0 or 1, got '%.32s'", t);
    if ((v = dlock_url_param_get(url, "strict")) != NULL && strcmp(v, "0") != 0 &&
        strcmp(v, "1") != 0)
        return dlock__fail(DLOCK_EINVAL, "redlock URL: strict must be 0 or 1, got '%.32s'", v);
    v = dlock_url_param_get(url, "io");
    *tls = t != NULL && strcmp(t, "1") == 0;
    if (v == NULL || strcmp(v, "auto") == 0)
        *io = DLOCK__REDLOCK_IO_AUTO;
    else if (strcmp(v, "poll") == 0)
        *io = DLOCK__REDLOCK_IO_POLL;
    else if (strcmp(v, "io_uring") == 0)
        *io = DLOCK__REDLOCK_IO_URING;
    else
        return dlock__fail(DLOCK_EINVAL, "redlock URL: io must be auto, poll or io_uring, got "
                           "'%.32s'", v);
    if (*io == DLOCK__REDLOCK_IO_URING && *tls)
        return dlock__fail(DLOCK_EINVAL, "redlock URL: io=io_uring is for clear text: with "
                           "tls=1 the nodes are read through OpenSSL, with poll");
    for (size_t i = 0; i < url->nparams; i++) {
        const char *k = url->params[i].key;
        if (dlock__redis_tls_param(k) && !*tls)
            /* Never clear text where the user asked for TLS. */
            return dlock__fail(DLOCK_EINVAL, "redlock URL: '%.32s' is a TLS parameter: add "
                               "tls=1", k);
        if (strcmp(k, "drift_ms") != 0 && strcmp(k, "node_timeout_ms") != 0 &&
            strcmp(k, "tls") != 0 && strcmp(k, "io") != 0 && strcmp(k, "strict") != 0 &&
            !dlock__redis_tls_param(k))
            return dlock__fail(DLOCK_EINVAL, "redlock URL: unknown parameter '%.32s' (known: "
                               "drift_ms, node_timeout_ms, io, strict, tls, and with tls=1 "
                               "cacert, cert, key, sni, insecure)", k);
    }
    memset(&ep, 0, sizeof(ep));
    if (*tls && (rc = dlock__redis_tls_params(&ep, url)) != DLOCK_OK)
        return rc;
    return DLOCK_OK;
}

static int redlock_open(void **out, const dlock_url *url, const dlock_client_options *opts)
{
    redlock_backend *be;
    answer conn[DLOCK__REDLOCK_NODES_MAX];
    size_t up = 0;
    unsigned mask = 0;
    int rc, first_rc = DLOCK_OK, tls = 0, io = DLOCK__REDLOCK_IO_AUTO, strict;
    char first[512] = "";

    *out = NULL;
    if ((rc = check_url(url, &tls, &io)) != DLOCK_OK)
        return rc;
    strict = dlock_url_param_get(url, "strict") != NULL &&
             strcmp(dlock_url_param_get(url, "strict"), "1") == 0;
    be = calloc(1, sizeof(*be));
    if (be == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    if (pthread_mutex_init(&be->cmd_mu, NULL) != 0) {
        free(be);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    }
    if (pthread_cond_init(&be->cmd_freed, NULL) != 0) {
        pthread_mutex_destroy(&be->cmd_mu);
        free(be);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a condition variable");
    }
    be->n = url->nhosts;
    be->tls = tls;
    be->quorum = be->n / 2 + 1;
    be->command_timeout_ms = opts->command_timeout_ms;
    if ((rc = ms_param(url, "drift_ms", &be->drift_ms)) != DLOCK_OK ||
        (rc = ms_param(url, "node_timeout_ms", &be->node_timeout_ms)) != DLOCK_OK)
        goto err;
    be->prefix = strdup(opts->key_prefix != NULL ? opts->key_prefix : "dlock:");
    if (be->prefix == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    /* io_uring where it can be had (io=auto), unless asked not to; io=io_uring
     * says why it cannot. */
    for (int k = 0; k < 2 && !tls && io != DLOCK__REDLOCK_IO_POLL; k++) {
        /* The first callers' set's, and the watchdog's. */
        if ((rc = dlock__redlock_ring_open(&be->ring[k == 0 ? 0 : DLOCK__REDLOCK_WD], be->n)) ==
            DLOCK_OK)
            continue;
        if (io == DLOCK__REDLOCK_IO_URING) {
            char why[256];
            snprintf(why, sizeof(why), "%s", dlock_error_message());
            dlock__fail(rc, "redlock URL: io=io_uring: %s", why);
            goto err;
        }
        dlock__redlock_ring_close(be->ring[0]);
        be->ring[0] = NULL;
        break;
    }
    if (tls && url->nparams > 0) {
        be->node_params = calloc(url->nparams, sizeof(*be->node_params));
        if (be->node_params == NULL) {
            rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
            goto err;
        }
        for (size_t i = 0; i < url->nparams; i++)
            if (dlock__redis_tls_param(url->params[i].key))
                be->node_params[be->nnode_params++] = url->params[i];
    }
    for (size_t i = 0; i < be->n; i++) {
        dlock__redlock_node *node = &be->nodes[i];
        /* Each node as a redis:// (or, with tls=1, rediss://) URL of its
         * own: same credentials and database, one host, none of redlock's
         * parameters but the TLS ones. */
        node->url = *url;
        node->url.scheme = tls ? "rediss" : "redis";
        node->url.hosts = &url->hosts[i];
        node->url.nhosts = 1;
        node->url.params = be->node_params;
        node->url.nparams = be->nnode_params;
        for (int k = 0; k <= DLOCK__REDLOCK_WD; k++)
            if ((rc = dlock__redis_conn_init(&node->link[k].conn, &node->url, opts,
                                             k == DLOCK__REDLOCK_WD ? "watchdog" : "cmd")) !=
                DLOCK_OK)
                goto err;
        if ((rc = dlock__redis_watcher_new(&node->watcher, &node->url, opts)) != DLOCK_OK)
            goto err;
    }
    /* Connect now, to every node at once: wrong credentials on any node,
     * or fewer than a quorum of nodes reachable, is reported by open. */
    dlock__redlock_connect(be, 0, dlock__redlock_all_nodes(be), conn);
    for (size_t i = 0; i < be->n; i++) {
        rc = conn[i].code;
        if (rc == DLOCK_OK) {
            up++;
        } else if (rc == DLOCK_EAUTH || rc == DLOCK_ENOMEM) {
            dlock__fail(rc, "%s", conn[i].why);
            goto err;
        } else if (first_rc == DLOCK_OK) {
            first_rc = rc;
            snprintf(first, sizeof(first), "%s", conn[i].why);
        }
    }
    if (up < be->quorum) {
        rc = dlock__fail(first_rc, "redlock: only %zu of %zu nodes reachable (quorum %zu): %s",
                         up, be->n, be->quorum, first);
        goto err;
    }
    for (size_t i = 0; i < be->n; i++)
        mask |= conn[i].code == DLOCK_OK ? 1u << i : 0;
    if ((rc = dlock__redlock_check_settings(be, mask, strict, opts)) != DLOCK_OK)
        goto err;
    dlock__clear_error();
    *out = be;
    return DLOCK_OK;

err:
    redlock_close(be);
    return rc;
}

/* ---- acquire --------------------------------------------------------- */

/* How long until fewer than Q nodes are held by another, from the PTTLs
 * the busy nodes gave (-1 no expiry: unknown); -1 if that never happens by
 * expiry alone. */
static int64_t quorum_free_in(const redlock_backend *be, int64_t *pttl, size_t nbusy)
{
    /* Sort descending (at most 15). */
    for (size_t i = 1; i < nbusy; i++)
        for (size_t j = i; j > 0 && pttl[j] > pttl[j - 1]; j--) {
            int64_t t = pttl[j];
            pttl[j] = pttl[j - 1];
            pttl[j - 1] = t;
        }
    /* Free once at most N - Q nodes are still held. */
    if (nbusy <= be->n - be->quorum)
        return 0;
    for (size_t i = 0; i < nbusy; i++)
        if (pttl[i] == -1)
            return -1;
    return pttl[be->n - be->quorum] < 0 ? 0 : pttl[be->n - be->quorum];
}

/* 0 to max - 1 ms, at random. */
static int64_t jitter_ms(int64_t max)
{
    unsigned v = 0;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v))
        v = (unsigned)dlock__now_ms();
    return (int64_t)(v % (unsigned)max);
}

/* ---- when a fan-out is decided ---------------------------------------- */

/* Nodes that said yes and nodes that did not (any other answer; failed:
 * no reply at all), for a fan-out that is decided once Q said yes or Q no
 * longer can. When nodes failed (down, refused) it waits for the others,
 * as far as their timeout allows: an error then counts and names every
 * node, and the nodes that are up answer at once anyway. */
typedef struct {
    const redlock_backend *be;
    size_t yes, no, failed;
} tally;

static int tally_add(tally *t, const answer *a, int yes)
{
    if (yes)
        t->yes++;
    else
        t->no++;
    t->failed += a->reply == NULL;
    return t->yes >= t->be->quorum || (t->no > t->be->n - t->be->quorum && t->failed == 0);
}

/* Round 1: a grant. */
static int granted_decided(void *arg, const answer *ans, size_t i)
{
    const redisReply *r = ans[i].reply;

    return tally_add(arg, &ans[i], r != NULL && is_int_triple(r) && r->element[0]->integer == 1);
}

/* Round 2 and release: the script answered 1 (the key was ours). */
static int ours_decided(void *arg, const answer *ans, size_t i)
{
    const redisReply *r = ans[i].reply;

    return tally_add(arg, &ans[i], r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1);
}

/* Run release.lua for req on the nodes of mask (answers in ans), until a
 * quorum gave it up or no quorum can: it is sent to every node of mask. */
static void release_fanout(redlock_backend *be, int set, const dlock_request *req,
                           unsigned mask, int64_t timeout_ms, answer *ans)
{
    dlock__redlock_key lock, chan;
    const char *argv[4];
    size_t lens[4];
    tally t = {be, 0, 0, 0};

    dlock__redlock_make_key(&lock, be, req->name, "");
    dlock__redlock_make_key(&chan, be, req->name, ":release");
    argv[0] = lock.buf;
    lens[0] = lock.len;
    argv[1] = req->token;
    lens[1] = strlen(req->token);
    argv[2] = chan.buf;
    lens[2] = chan.len;
    argv[3] = dlock__redlock_owner_arg(req);
    lens[3] = strlen(argv[3]);
    dlock__redlock_fanout(be, set, req->token, mask, &dlock__redlock_script_release, 1, 4, argv,
                          lens, timeout_ms, ours_decided, &t, ans);
}

/* Give a lock up on the nodes of mask, not waiting long for the answers:
 * on a node that did not answer a request of set, this one runs after it,
 * on the same connection. */
static void release_on(redlock_backend *be, int set, const dlock_request *req, unsigned mask,
                       int64_t timeout_ms)
{
    answer ans[DLOCK__REDLOCK_NODES_MAX];

    if (mask == 0)
        return;
    release_fanout(be, set, req, mask, timeout_ms, ans);
    dlock__redlock_answers_free(ans, be->n);
}

/*
 * The fence of a re-entry: the fence T of the owner's tenure when a quorum
 * of the granting nodes recorded T for the owner's holds (tenure[], each
 * node's highest) and no granting node's mark (high: the highest) is above
 * T; else 0: a new fence by the usual rule. Such a node held the owner's key
 * without a break since T was recorded there (a new key drops the holds,
 * and a hold set again by a renewal records no fence), so no other holder
 * took the lock with T or more before this round; docs/redlock.md,
 * "Reentrancy", has the argument.
 */
static uint64_t reentry_fence(const redlock_backend *be, const uint64_t *tenure, size_t n,
                              uint64_t high)
{
    for (size_t i = 0; i < n; i++) {
        size_t same = 0;
        if (tenure[i] == 0 || tenure[i] < high)
            continue;
        for (size_t j = 0; j < n; j++)
            same += tenure[j] == tenure[i];
        if (same >= be->quorum)
            return tenure[i];
    }
    return 0;
}

/* A quorum granted, but no validity is left. */
static int too_slow(const dlock_request *req, int64_t elapsed)
{
    return dlock__fail(DLOCK_ECONN, "redlock: the nodes took %lld ms to grant lock '%s', not "
                       "less than its lease of %lld ms", (long long)elapsed, req->name,
                       (long long)req->lease_ms);
}

/* Whether Q of the n granting nodes replied the value f: it is then
 * recorded on a quorum while that quorum holds our key (docs/redlock.md,
 * "Acquire" and "Why the fence increases"). */
static int quorum_replied(const redlock_backend *be, const uint64_t *value, size_t n,
                          uint64_t f)
{
    size_t same = 0;

    for (size_t i = 0; i < n; i++)
        same += value[i] == f;
    return same >= be->quorum;
}

static int acquire_on(redlock_backend *be, int set, const dlock_request *req, void *watch,
                      dlock_acquire_result *out)
{
    answer ans[DLOCK__REDLOCK_NODES_MAX], conf[DLOCK__REDLOCK_NODES_MAX];
    dlock__redlock_key lock, mark;
    char px[24], fence_text[24];
    const char *argv[7];
    size_t lens[7];
    int64_t pttl[DLOCK__REDLOCK_NODES_MAX];
    int64_t timeout = dlock__redlock_node_timeout_ms(be, req->lease_ms);
    uint64_t tenure[DLOCK__REDLOCK_NODES_MAX], value[DLOCK__REDLOCK_NODES_MAX];
    unsigned granted = 0, busy = 0;
    size_t ngranted = 0, nbusy = 0, nmine = 0;
    uint64_t high = 0, fence;
    int64_t elapsed;
    tally t = {be, 0, 0, 0};
    int rc;

    dlock__redlock_make_key(&lock, be, req->name, "");
    dlock__redlock_make_key(&mark, be, req->name, ":fence");
    snprintf(px, sizeof(px), "%lld", (long long)dlock__redlock_node_px(be, req->lease_ms));
    argv[0] = lock.buf;
    lens[0] = lock.len;
    argv[1] = mark.buf;
    lens[1] = mark.len;
    argv[2] = req->token;
    lens[2] = strlen(req->token);
    argv[3] = px;
    lens[3] = strlen(px);
    argv[4] = dlock__redlock_owner_arg(req);
    lens[4] = strlen(argv[4]);
    argv[5] = req->reentrant ? "1" : "0";
    lens[5] = 1;
    /* '2': other waiters of ours wait on the lock, flag it even on a win. */
    argv[6] = watch == NULL ? "0" : dlock__redlock_watch_shared(be, watch) ? "2" : "1";
    lens[6] = 1;

    /* Round 1: take the key on every node, each granting node raising its
     * mark; until Q granted or Q no longer can. With an owner id, every
     * node (in the node timeout): round 2 then records the owner's fence on
     * all that granted, so that a re-entry finds a quorum vouching for it
     * even when nodes restarted since (docs/redlock.md, "Reentrancy"). */
    dlock__redlock_fanout(be, set, req->token, dlock__redlock_all_nodes(be),
                          &dlock__redlock_script_acquire, 2, 7, argv, lens, timeout,
                          req->owner == NULL ? granted_decided : NULL, &t, ans);
    for (size_t i = 0; i < be->n; i++) {
        redisReply *r = ans[i].reply;
        if (r == NULL)
            continue;
        if (!is_int_triple(r) || r->element[0]->integer < -1 ||
            r->element[1]->integer < (r->element[0]->integer ? 0 : -2)) {
            dlock__redlock_bad_reply(&ans[i], &be->nodes[i], "the acquire script");
        } else if (r->element[0]->integer == 1) {
            granted |= 1u << i;
            value[ngranted] = (uint64_t)r->element[1]->integer;
            tenure[ngranted++] = (uint64_t)r->element[2]->integer;
            if ((uint64_t)r->element[1]->integer > high)
                high = (uint64_t)r->element[1]->integer;
        } else if (r->element[0]->integer == -1) {
            nmine++; /* the owner holds it there, not reentrant */
        } else {
            busy |= 1u << i;
            pttl[nbusy++] = r->element[1]->integer;
        }
    }
    elapsed = dlock__now_ms() - out->lease_from_ms;

    if (ngranted >= be->quorum && elapsed < req->lease_ms && req->owner == NULL &&
        quorum_replied(be, value, ngranted, high)) {
        /* One round: F = high is each mark of a quorum, raised there in the
         * step that gave us the key. */
        dlock__redlock_answers_free(ans, be->n);
        out->fence = high;
        return DLOCK_OK;
    }
    if (ngranted >= be->quorum && elapsed < req->lease_ms) {
        size_t nconfirmed = 0;
        /* Round 2: record the fence on the granting nodes while we hold
         * them, before anyone may use it. The plain mutex: the highest
         * value a granting node replied (each is 1 + that node's mark
         * before it granted). With an owner id: the owner's fence again
         * when this is a re-entry into a tenure a quorum vouches for, else
         * one above every value (a re-entered node replies its mark
         * unraised). */
        fence = high;
        if (req->owner != NULL) {
            fence = reentry_fence(be, tenure, ngranted, high);
            if (fence == 0)
                fence = high + 1;
        }
        snprintf(fence_text, sizeof(fence_text), "%llu", (unsigned long long)fence);
        argv[3] = fence_text; /* confirm: token, fence, owner */
        lens[3] = strlen(fence_text);
        t.yes = t.failed = 0;
        t.no = be->n - ngranted; /* only the granting nodes are asked */
        dlock__redlock_fanout(be, set, req->token, granted, &dlock__redlock_script_confirm, 2, 5,
                              argv, lens, timeout, req->owner == NULL ? ours_decided : NULL,
                              &t, conf);
        for (size_t i = 0; i < be->n; i++) {
            redisReply *r = conf[i].reply;
            if (r == NULL)
                continue;
            if (r->type != REDIS_REPLY_INTEGER)
                dlock__redlock_bad_reply(&conf[i], &be->nodes[i], "the confirm script");
            else if (r->integer == 1)
                nconfirmed++;
        }
        elapsed = dlock__now_ms() - out->lease_from_ms;
        if (nconfirmed >= be->quorum && elapsed < req->lease_ms) {
            dlock__redlock_answers_free(ans, be->n);
            dlock__redlock_answers_free(conf, be->n);
            out->fence = fence;
            return DLOCK_OK;
        }
        if (nconfirmed >= be->quorum) {
            rc = too_slow(req, elapsed);
        } else {
            /* A granting node died or our keys lapsed between the rounds:
             * no fence was issued. Busy: the next try starts over (and
             * round 1 reports it if the nodes stay down). */
            dlock__redlock_fail_quorum(be, "recording the fence", nconfirmed, conf, granted,
                                       DLOCK_ELOST);
            rc = DLOCK_EBUSY;
            out->retry_ms = jitter_ms(10);
        }
        dlock__redlock_answers_free(conf, be->n);
    } else if (ngranted >= be->quorum) {
        rc = too_slow(req, elapsed);
    } else if (nmine > 0 && ngranted + nmine >= be->quorum) {
        /* It would wait for itself. */
        rc = dlock__fail(DLOCK_EMISUSE, "redlock: lock '%s' is already held by this owner id, "
                         "and the acquisition is not reentrant", req->name);
    } else if (nbusy > 0) {
        int64_t left = quorum_free_in(be, pttl, nbusy);
        rc = DLOCK_EBUSY;
        /* 0: no one holds a majority (a split vote with other acquirers,
         * or nodes down): a short random pause, so the next tries differ. */
        out->retry_ms = left != 0 ? left : 5 + jitter_ms(20);
        if (watch != NULL) {
            /* A release on a node down now is never announced. */
            int64_t cap = req->lease_ms / 4 > 10 ? req->lease_ms / 4 : 10;
            if (out->retry_ms < 0 || out->retry_ms > cap)
                out->retry_ms = cap;
        }
    } else {
        rc = dlock__redlock_fail_quorum(be, "acquiring", ngranted, ans,
                                        dlock__redlock_all_nodes(be), DLOCK_ECONN);
    }
    dlock__redlock_answers_free(ans, be->n);
    /* Not ours: give back every key we may have taken, including on the
     * nodes that did not answer, or were not waited for (the release runs
     * after the acquire there). */
    release_on(be, set, req, dlock__redlock_all_nodes(be) & ~busy, timeout);
    return rc;
}

static int redlock_acquire(void *arg, const dlock_request *req, void *watch,
                           dlock_acquire_result *out)
{
    redlock_backend *be = arg;
    int set = dlock__redlock_set_take(be, req->token);
    char saved[1024];
    int rc;

    rc = acquire_on(be, set, req, watch, out);
    if (rc != DLOCK_OK)
        snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    dlock__redlock_set_give(be, set);
    return rc == DLOCK_OK ? rc : dlock__fail(rc, "%s", saved);
}

/* ---- release ----------------------------------------------------------- */

static int redlock_release(void *arg, const dlock_request *req)
{
    redlock_backend *be = arg;
    int set = dlock__redlock_set_take(be, req->token);
    answer ans[DLOCK__REDLOCK_NODES_MAX];
    size_t released = 0, unknown = 0;
    int rc = DLOCK_OK;

    /* Every node, with the command timeout: a node that did not answer the
     * acquire in time may hold the key all the same. Done once a quorum
     * gave it up (or cannot); the rest run it in turn, their replies read
     * at the next fan-out. */
    release_fanout(be, set, req, dlock__redlock_all_nodes(be), be->command_timeout_ms, ans);
    for (size_t i = 0; i < be->n; i++) {
        if (ans[i].reply == NULL)
            unknown++; /* a failure, or not waited for */
        else if (ans[i].reply->type != REDIS_REPLY_INTEGER)
            dlock__redlock_bad_reply(&ans[i], &be->nodes[i], "the release script"), unknown++;
        else if (ans[i].reply->integer == 1)
            released++;
    }
    if (released < be->quorum) {
        if (released + unknown >= be->quorum)
            rc = dlock__redlock_fail_quorum(be, "releasing", released, ans,
                                            dlock__redlock_all_nodes(be), DLOCK_ECONN);
        else
            rc = dlock__fail(DLOCK_ELOST, "redlock: lock '%s' was not held on a quorum "
                             "(%zu of %zu nodes had it)", req->name, released, be->n);
    }
    dlock__redlock_answers_free(ans, be->n);
    dlock__redlock_set_give(be, set);
    return rc;
}

/* ---- status, force release ------------------------------------------------ */

/*
 * The Redis backend's status script (same keys: the lock, and the fence key,
 * here the node's mark) on every node. Held when a quorum holds it; the
 * lease left is how long a quorum still will, less the drift; the fence the
 * highest mark.
 */
static int read_status(redlock_backend *be, const char *name, int force, dlock_lock_info *out)
{
    answer ans[DLOCK__REDLOCK_NODES_MAX];
    dlock__redlock_key lock, mark, chan;
    const char *argv[4];
    size_t lens[4], replied = 0, held = 0;
    int64_t ttl[DLOCK__REDLOCK_NODES_MAX];
    uint64_t fence = 0;
    int rc = DLOCK_OK, set;

    dlock__redlock_make_key(&lock, be, name, "");
    dlock__redlock_make_key(&mark, be, name, ":fence");
    dlock__redlock_make_key(&chan, be, name, ":release");
    argv[0] = lock.buf;
    lens[0] = lock.len;
    argv[1] = mark.buf;
    lens[1] = mark.len;
    argv[2] = force ? "force" : "read";
    lens[2] = strlen(argv[2]);
    argv[3] = chan.buf;
    lens[3] = chan.len;
    set = dlock__redlock_set_take(be, NULL);
    dlock__redlock_fanout(be, set, NULL, dlock__redlock_all_nodes(be), &dlock__redis_script_status,
                          2, 4, argv, lens, be->command_timeout_ms, NULL, NULL, ans);
    for (size_t i = 0; i < be->n; i++) {
        redisReply *r = ans[i].reply;
        if (r == NULL)
            continue;
        /* {held, pttl, fence, holder}: Redlock keeps no holder record, so
         * the fourth (the Redis backend's) is read by nobody. */
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
            r->element[0]->type != REDIS_REPLY_INTEGER ||
            r->element[1]->type != REDIS_REPLY_INTEGER ||
            r->element[2]->type != REDIS_REPLY_INTEGER) {
            dlock__redlock_bad_reply(&ans[i], &be->nodes[i], "the status script");
            continue;
        }
        replied++;
        if (r->element[0]->integer == 1)
            ttl[held++] = r->element[1]->integer;
        if (r->element[2]->integer > 0 && (uint64_t)r->element[2]->integer > fence)
            fence = (uint64_t)r->element[2]->integer;
    }
    if (replied < be->quorum) {
        rc = dlock__redlock_fail_quorum(be, force ? "force-releasing" : "reading the status",
                                        replied, ans, dlock__redlock_all_nodes(be), DLOCK_ECONN);
    } else {
        memset(out, 0, sizeof(*out));
        out->held = held >= be->quorum;
        out->fence = fence;
        if (out->held) {
            /* The quorum-th longest: how long a quorum still holds it. */
            for (size_t i = 1; i < held; i++)
                for (size_t j = i; j > 0 && (ttl[j] == -1 || (ttl[j - 1] != -1 &&
                                                               ttl[j] > ttl[j - 1])); j--) {
                    int64_t t = ttl[j];
                    ttl[j] = ttl[j - 1];
                    ttl[j - 1] = t;
                }
            out->ttl_ms = ttl[be->quorum - 1];
            if (out->ttl_ms > 0) {
                /* Less the drift (estimated from what is left when drift_ms
                 * is not set): the validity the holder has left. */
                out->ttl_ms -= be->drift_ms >= 0 ? be->drift_ms : out->ttl_ms / 100 + 2;
                if (out->ttl_ms < 1)
                    out->ttl_ms = 1;
            }
        }
    }
    dlock__redlock_answers_free(ans, be->n);
    dlock__redlock_set_give(be, set);
    return rc;
}

static int redlock_status(void *be, const char *name, dlock_lock_info *out)
{
    return read_status(be, name, 0, out);
}

static int redlock_force_release(void *be, const char *name, dlock_lock_info *removed)
{
    return read_status(be, name, 1, removed);
}

static const char *const redlock_schemes[] = {"redlock", NULL};

const dlock_backend dlock__redlock_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "redlock",
    .schemes = redlock_schemes,
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_OWNER_IDS,
    .open = redlock_open,
    .close = redlock_close,
    .acquire = redlock_acquire,
    .release = redlock_release,
    .extend = dlock__redlock_extend,
    .check = dlock__redlock_check,
    .renew = dlock__redlock_renew,
    .watch_begin = dlock__redlock_watch_begin,
    .watch_wait = dlock__redlock_watch_wait,
    .watch_end = dlock__redlock_watch_end,
    .watch_wake = dlock__redlock_watch_wake,
    .watch_notify = dlock__redlock_watch_notify,
    .status = redlock_status,
    .force_release = redlock_force_release,
};
