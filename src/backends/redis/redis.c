/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Redis backend: one node, or the master of a Sentinel deployment
 * (redis-sentinel://, found and followed by redis_conn.c).
 *
 * Keys, for lock NAME and the default prefix "dlock:":
 *   dlock:{NAME}          the lock: owner token, with the lease as its PX expiry
 *   dlock:{NAME}:fence    the fence counter, INCR'd by every acquisition
 *   dlock:{NAME}:release  the pub/sub channel a release is announced on
 *   dlock:{NAME}:next     the hand-off slot: "WAITER-ID TOKEN LEASE" of one
 *                         waiter, whom the release gives the lock (PX: it
 *                         lapses unless the waiter keeps trying)
 * The braces are a hash tag: the three live in one cluster slot. Two keys
 * per prefix keep the fences bounded (lib/fence.lua): dlock:fence-floor and
 * dlock:fence-registry. The lock family's keys are in redis_family.c.
 *
 * Connections: "cmd" for callers (one at a time, under cmd_mu), "watchdog"
 * for renewals (the watchdog thread's alone), "sub" for waiting (the
 * subscriber thread's alone).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_int.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"
#include "core/token.h"

/*
 * PREFIX{NAME}SUFFIX. On a cluster, a NAME that starts with '}' would make
 * the hash tag empty ("dlock:{}x}"): Redis then hashes each whole key, the
 * keys of one lock scatter over slots and every script fails with
 * CROSSSLOT. Such a NAME gets PREFIX}{TAG}{NAME}SUFFIX instead, TAG its
 * first DLOCK__REDIS_ALT_TAG bytes with the braces turned into parentheses:
 * never empty, and, starting "PREFIX}", never the key of another name.
 * Every other name keeps its keys, and a single server keeps them for all.
 */
void dlock__redis_key(dlock__redis_key_buf *k, const dlock__redis_be *be, const char *name,
                      const char *suffix)
{
    int n;

    if (name[0] == '}' && be->cmd[0].is_cluster && strchr(be->prefix, '{') == NULL) {
        char tag[DLOCK__REDIS_ALT_TAG + 1];
        size_t i;

        for (i = 0; i < DLOCK__REDIS_ALT_TAG && name[i] != '\0'; i++)
            tag[i] = name[i] == '{' ? '(' : name[i] == '}' ? ')' : name[i];
        tag[i] = '\0';
        n = snprintf(k->buf, sizeof(k->buf), "%s}{%s}{%s}%s", be->prefix, tag, name, suffix);
    } else {
        /* The common case, by hand: a watchdog's batch makes 128 of these. */
        size_t p = strlen(be->prefix), nl = strlen(name), sl = strlen(suffix);

        if (p + nl + sl + 3 <= sizeof(k->buf)) {
            char *at = k->buf;
            memcpy(at, be->prefix, p);
            at += p;
            *at++ = '{';
            memcpy(at, name, nl);
            at += nl;
            *at++ = '}';
            memcpy(at, suffix, sl + 1);
            k->len = p + nl + sl + 2;
            return;
        }
        n = snprintf(k->buf, sizeof(k->buf), "%s{%s}%s", be->prefix, name, suffix);
    }
    k->len = (size_t)n;
}

/* k = a b c, cut at the buffer's end as snprintf would (a prefix that long
 * is refused when the client is made). By hand: every call of a lock makes
 * two of these. */
static void key_cat(dlock__redis_key_buf *k, const char *a, const char *b, const char *c)
{
    const char *part[3] = {a, b, c};

    k->len = 0;
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(part[i]);

        if (n > sizeof(k->buf) - 1 - k->len)
            n = sizeof(k->buf) - 1 - k->len;
        memcpy(k->buf + k->len, part[i], n);
        k->len += n;
    }
    k->buf[k->len] = '\0';
}

void dlock__redis_fence_keys(dlock__redis_key_buf *floor, dlock__redis_key_buf *registry,
                             const dlock__redis_be *be, const char *name)
{
    char tag[24] = "";

    if (be->cmd[0].is_cluster) {
        /* The floor of the slot of name's keys: a counter and the floor it
         * is retired into always live on one master, and move together. */
        dlock__redis_key_buf k;
        dlock__redis_key(&k, be, name, "");
        tag[0] = '{';
        dlock__redis_slot_tag(dlock__redis_key_slot(k.buf, k.len), tag + 1, sizeof(tag) - 2);
        strcat(tag, "}");
    }
    key_cat(floor, be->prefix, tag, DLOCK__REDIS_FENCE_FLOOR);
    key_cat(registry, be->prefix, tag, DLOCK__REDIS_FENCE_REGISTRY);
}

int dlock__redis_bad_reply(const dlock__redis_conn *conn, const char *what)
{
    return dlock__fail(DLOCK_EPROTO, "%s: unexpected reply to %s", conn->where, what);
}

dlock__redis_conn *dlock__redis_cmd_take(dlock__redis_be *be)
{
    int pick = -1;

    pthread_mutex_lock(&be->cmd_mu);
    for (;;) {
        for (int i = 0; i < DLOCK__REDIS_CMD_MAX; i++) {
            if (be->cmd_busy[i])
                continue;
            if (dlock__redis_conn_is_open(&be->cmd[i])) {
                pick = i;
                break;
            }
            if (pick < 0)
                pick = i;
        }
        if (pick >= 0)
            break;
        pthread_cond_wait(&be->cmd_freed, &be->cmd_mu);
    }
    be->cmd_busy[pick] = 1;
    pthread_mutex_unlock(&be->cmd_mu);
    return &be->cmd[pick];
}

void dlock__redis_cmd_give(dlock__redis_be *be, dlock__redis_conn *conn)
{
    pthread_mutex_lock(&be->cmd_mu);
    be->cmd_busy[conn - be->cmd] = 0;
    pthread_cond_signal(&be->cmd_freed);
    pthread_mutex_unlock(&be->cmd_mu);
}

int dlock__redis_cmd_script(dlock__redis_be *be, const dlock__redis_script *s,
                            redisReply **out, int nkeys, int argc, const char **argv,
                            const size_t *lens)
{
    return dlock__redis_mux_script(&be->mux, s, out, nkeys, argc, argv, lens);
}

/* Short names for this file; redis_int.h has the shared ones. */
typedef dlock__redis_be redis_backend;
typedef dlock__redis_key_buf key_buf;
typedef dlock__redis_args args;
#define arg_key dlock__redis_arg_key
#define arg_str dlock__redis_arg_str
#define arg_num dlock__redis_arg_num
#define make_key dlock__redis_key
#define bad_reply dlock__redis_bad_reply
#define cmd_script dlock__redis_cmd_script

static int int_reply(const dlock__redis_conn *conn, redisReply *r, const char *what,
                     long long *value)
{
    if (r->type != REDIS_REPLY_INTEGER) {
        freeReplyObject(r);
        return bad_reply(conn, what);
    }
    *value = r->integer;
    freeReplyObject(r);
    return DLOCK_OK;
}

/* ---- open / close ---------------------------------------------------- */

static void redis_close(void *arg)
{
    redis_backend *be = arg;

    if (be == NULL)
        return;
    dlock__redis_watcher_free(be->watcher);
    dlock__redis_places_destroy(&be->places);
    dlock__redis_mux_destroy(&be->mux);
    for (int i = 0; i < DLOCK__REDIS_CMD_MAX; i++)
        dlock__redis_conn_close(&be->cmd[i]);
    dlock__redis_listen_close(be);
    dlock__redis_conn_close(&be->wd);
    pthread_cond_destroy(&be->cmd_freed);
    pthread_mutex_destroy(&be->cmd_mu);
    free(be->prefix);
    free(be);
}

static int redis_open(void **out, const dlock_url *url, const dlock_client_options *opts)
{
    redis_backend *be;
    int rc;

    *out = NULL;
    be = calloc(1, sizeof(*be));
    if (be == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    memset(be->listen_pipe, -1, sizeof(be->listen_pipe));
    if (pthread_mutex_init(&be->cmd_mu, NULL) != 0) {
        free(be);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a mutex");
    }
    if (dlock__cond_init(&be->cmd_freed) != 0) {
        pthread_mutex_destroy(&be->cmd_mu);
        free(be);
        return dlock__fail(DLOCK_ENOMEM, "cannot create a condition variable");
    }
    be->prefix = strdup(opts->key_prefix != NULL ? opts->key_prefix : "dlock:");
    if (be->prefix == NULL) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    for (int i = 0; i < DLOCK__REDIS_CMD_MAX; i++)
        if ((rc = dlock__redis_conn_init(&be->cmd[i], url, opts, "cmd")) != DLOCK_OK)
            goto err;
    for (int i = 0; i < DLOCK__REDIS_LISTEN_MAX; i++) {
        if ((rc = dlock__redis_conn_init(&be->listen[i], url, opts, "listener")) != DLOCK_OK)
            goto err;
        /* On a cluster, to one node: the master of the lock it listens
         * for (redis_listen.c). */
        be->listen[i].is_cluster = 0;
    }
    if ((rc = dlock__redis_conn_init(&be->wd, url, opts, "watchdog")) != DLOCK_OK ||
        (rc = dlock__redis_watcher_new(&be->watcher, url, opts)) != DLOCK_OK ||
        (rc = dlock__redis_places_init(&be->places)) != DLOCK_OK)
        goto err;
    dlock__redis_watcher_set_upkeep(be->watcher, dlock__redis_places_upkeep, be);
    be->no_threads = (opts->flags & DLOCK_CLIENT_NO_THREADS) != 0;
    if (be->no_threads && (be->cmd[0].is_cluster || be->cmd[0].min_replicas > 0)) {
        rc = dlock__fail(DLOCK_ENOTSUP, "dlock_client_open: DLOCK_CLIENT_NO_THREADS is served "
                         "on one Redis server or a Sentinel's master, not %s",
                         be->cmd[0].is_cluster ? "on a cluster"
                                               : "with min_replicas (its WAIT is paired by "
                                                 "the blocking calls)");
        goto err;
    }
    if ((rc = dlock__redis_mux_init(&be->mux, &be->cmd[0])) != DLOCK_OK)
        goto err;
    /* Connect now so that a wrong address or password is reported by open
     * (on the connection the first acquisition will use). */
    if ((rc = dlock__redis_mux_connect(&be->mux)) != DLOCK_OK)
        goto err;
    *out = be;
    return DLOCK_OK;

err:
    redis_close(be);
    return rc;
}

/* ---- the lock operations --------------------------------------------- */

/* The keys of acquire.lua and release.lua, in their order: the lock, its
 * fence counter, the fence floor and registry, the hand-off slot. */
#define MUTEX_KEYS 5

static void mutex_keys(redis_backend *be, const char *name, key_buf keys[MUTEX_KEYS],
                       args *a)
{
    make_key(&keys[0], be, name, "");
    make_key(&keys[1], be, name, ":fence");
    dlock__redis_fence_keys(&keys[2], &keys[3], be, name);
    make_key(&keys[4], be, name, ":next");
    for (int i = 0; i < MUTEX_KEYS; i++)
        arg_key(a, &keys[i]);
}

/* A waiter's hand-off entry, made on its first try: "WAITER-ID TOKEN
 * LEASE", or "WAITER-ID TOKEN LEASE L[ HOLDER]" when it listens for its
 * grant (redis_listen.c; release.lua then writes HOLDER with the key). */
static int handoff_entry(redis_backend *be, dlock__redis_watch *w, const dlock_request *req)
{
    const char *wid = dlock__redis_watch_id(w->waiter), *owner = req->token;
    const char *holder = req->holder != NULL ? req->holder : "";
    size_t n = strlen(wid) + strlen(owner) + strlen(holder) + 28;
    char *token;

    if (w->entry != NULL)
        return DLOCK_OK;
    /* w->token held the waiter's id until now; leaving needs the owner's. */
    if ((token = strdup(owner)) == NULL || (w->entry = malloc(n)) == NULL) {
        free(token);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    w->listens = !w->told && dlock__redis_listen_on(be);
    w->lease_ms = req->lease_ms;
    snprintf(w->entry, n, "%s %s %lld%s%s%s", wid, owner, (long long)req->lease_ms,
             w->listens ? " L" : "", w->listens && holder[0] != '\0' ? " " : "",
             w->listens ? holder : "");
    free(w->token);
    w->token = token;
    return DLOCK_OK;
}

/* The acquire script's keys and arguments for req, with w's hand-off entry
 * when it waits (keys must outlive a). */
static void acquire_args(redis_backend *be, const dlock_request *req, dlock__redis_watch *w,
                         key_buf keys[MUTEX_KEYS], args *a)
{
    mutex_keys(be, req->name, keys, a);
    arg_str(a, req->token);
    arg_num(a, req->lease_ms);
    arg_str(a, req->holder != NULL ? req->holder : "");
    if (w != NULL) {
        arg_str(a, w->entry);
        arg_num(a, 2 * dlock__redis_handoff_refresh_ms(req->lease_ms) + 100);
    }
}

/* The acquire script's reply r (freed): the fence, or busy and when to
 * come back. */
static int acquire_reply(redis_backend *be, redisReply *r, dlock__redis_watch *w,
                         int64_t lease_ms, dlock_acquire_result *out)
{
    int rc;

    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || r->elements > 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
        freeReplyObject(r);
        return bad_reply(be->cmd, "the acquire script");
    }
    /* {0, pttl, 1}: busy, and our entry is in the hand-off slot. */
    if (w != NULL)
        w->in_slot = r->elements == 3;
    if (r->element[0]->integer == DLOCK__REDIS_TAKEN ||
        r->element[0]->integer == DLOCK__REDIS_HANDED) {
        out->handed = r->element[0]->integer == DLOCK__REDIS_HANDED;
        if (r->element[1]->integer <= 0) {
            freeReplyObject(r);
            return bad_reply(be->cmd, "the acquire script (fence <= 0)");
        }
        out->fence = (uint64_t)r->element[1]->integer;
        if (w != NULL)
            w->leave = 0;
        rc = DLOCK_OK;
    } else {
        /* PTTL: -1 the key has no expiry, -2 it vanished just now (retry). */
        long long pttl = r->element[1]->integer;
        out->retry_ms = pttl == -2 ? 0 : pttl;
        if (w != NULL) {
            /* Our entry may be in the slot: come back before it expires. */
            int64_t refresh = dlock__redis_handoff_refresh_ms(lease_ms);
            if (out->retry_ms < 0 || out->retry_ms > refresh)
                out->retry_ms = refresh;
        }
        rc = DLOCK_EBUSY;
    }
    freeReplyObject(r);
    return rc;
}

static int mutex_acquire(redis_backend *be, const dlock_request *req, void *watch,
                         dlock_acquire_result *out)
{
    dlock__redis_watch *w = watch;
    key_buf keys[MUTEX_KEYS];
    args a = {0};
    redisReply *r;
    int rc, confirm = 0;

    /* A release may have handed us the lock while we slept (release.lua):
     * this try is what confirms it, finding our token in the key, and the
     * lease counts from when this try was sent. A grant message alone is
     * never trusted: it may be late, for a hand-off whose key has expired
     * and been taken by another since. */
    if (w != NULL && (rc = handoff_entry(be, w, req)) != DLOCK_OK)
        return rc;
    /* A grant popped from our list (redis_listen.c) is the lock, with no
     * try, when its bound leaves enough of the lease; else this try
     * confirms it. */
    if (w != NULL && w->granted != 0) {
        confirm = 1;
        if (dlock__redis_listen_granted(w, req, out))
            return DLOCK_OK;
    }
    /* No grant of this wait can be pushed before its first try is sent. */
    if (w != NULL && w->bound_ms == 0)
        w->bound_ms = out->lease_from_ms;
    acquire_args(be, req, w, keys, &a);
    /* From here the server may hold our entry, or the lock, even if no
     * reply comes back (a timeout after the server ran the script): giving
     * up must clean up (watch_end, mutex_leave.lua). */
    if (w != NULL)
        w->leave = 1;
    if ((rc = cmd_script(be, &dlock__redis_script_acquire, &r, MUTEX_KEYS, a.argc, a.argv,
                         a.lens)) != DLOCK_OK)
        return rc;
    rc = acquire_reply(be, r, w, req->lease_ms, out);
    if (rc == DLOCK_OK && confirm)
        out->handed = 1; /* our record was written with the key */
    return rc;
}

/* Run an owner-checked script, whose reply is DLOCK__REDIS_DONE or _NOT_OURS. */
static int owned_script(redis_backend *be, const dlock__redis_script *s, int nkeys,
                        args *a, const char *what)
{
    redisReply *r;
    long long v = 0;
    int rc;

    if ((rc = cmd_script(be, s, &r, nkeys, a->argc, a->argv, a->lens)) != DLOCK_OK)
        return rc;
    if ((rc = int_reply(be->cmd, r, what, &v)) != DLOCK_OK)
        return rc;
    return v == DLOCK__REDIS_DONE ? DLOCK_OK : DLOCK_ELOST;
}

/* The release script's keys and arguments (keys and chan must outlive a). */
static void release_args(redis_backend *be, const char *name, const char *owner,
                         key_buf keys[MUTEX_KEYS], key_buf *chan, args *a)
{
    mutex_keys(be, name, keys, a);
    make_key(chan, be, name, ":release");
    arg_str(a, owner);
    arg_key(a, chan);
    arg_num(a, DLOCK__REDIS_HANDOFF_CONFIRM_MS);
}

static int mutex_release(redis_backend *be, const char *name, const char *owner)
{
    key_buf keys[MUTEX_KEYS], chan;
    args a = {0};

    release_args(be, name, owner, keys, &chan, &a);
    return owned_script(be, &dlock__redis_script_release, MUTEX_KEYS, &a, "the release script");
}

static int mutex_extend(redis_backend *be, const char *name, const char *owner,
                        int64_t lease_ms)
{
    key_buf lock;
    args a = {0};

    make_key(&lock, be, name, "");
    arg_key(&a, &lock);
    arg_str(&a, owner);
    arg_num(&a, lease_ms);
    return owned_script(be, &dlock__redis_script_extend, 1, &a, "the extend script");
}

/* Is a plain mutex's value, "TOKEN[ HOLDER]" (acquire.lua), token's? */
static int value_is_token(const char *value, size_t len, const char *token)
{
    size_t n = strlen(token);

    return len >= n && memcmp(value, token, n) == 0 && (len == n || value[n] == ' ');
}

static int mutex_check(redis_backend *be, const char *name, const char *owner)
{
    key_buf lock;
    const char *argv[2] = {"GET", lock.buf};
    size_t lens[2] = {3, 0};
    dlock__redis_conn *conn;
    redisReply *r;
    int rc;

    make_key(&lock, be, name, "");
    lens[1] = lock.len;
    conn = dlock__redis_cmd_take(be);
    rc = dlock__redis_conn_command(conn, &r, 2, argv, lens);
    dlock__redis_cmd_give(be, conn);
    if (rc != DLOCK_OK)
        return rc;
    if (r->type == REDIS_REPLY_NIL)
        rc = DLOCK_ELOST;
    else if (r->type != REDIS_REPLY_STRING)
        rc = bad_reply(be->cmd, "GET");
    else
        rc = value_is_token(r->str, r->len, owner) ? DLOCK_OK : DLOCK_ELOST;
    freeReplyObject(r);
    return rc;
}

/* ---- one call per job: the plain mutex here, the family in redis_family.c ---- */

/* The plain mutex: its own keys and scripts (above), the hand-off slot. */
static int is_mutex(const dlock_request *req)
{
    return req->kind == DLOCK_KIND_MUTEX && req->owner == NULL;
}

static int redis_release(void *be, const dlock_request *req)
{
    return is_mutex(req) ? mutex_release(be, req->name, req->token)
                         : dlock__redis_family_release(be, req);
}

/* min_replicas=N (Sentinel): a hold that fewer than N replicas acknowledged
 * in time is given back at once (owner-checked, as any release) and the
 * acquisition fails with DLOCK_ESERVER, "... 0 of 1 replicas acknowledged
 * ...: the lock was released"; when the server refused WAIT itself (an ACL
 * user without it), with WAIT's error (DLOCK_EAUTH). */
static int give_back_unreplicated(void *be, const dlock_request *reqs, size_t n)
{
    char saved[512];
    int code = dlock__redis_wait_fail("the lock was released");

    snprintf(saved, sizeof(saved), "%s", dlock_error_message());
    for (size_t i = 0; i < n; i++)
        redis_release(be, &reqs[i]);
    return dlock__fail(code, "%s", saved);
}

static int redis_acquire(void *be, const dlock_request *req, void *watch,
                         dlock_acquire_result *out)
{
    int rc = is_mutex(req) ? mutex_acquire(be, req, watch, out)
                           : dlock__redis_family_acquire(be, req, watch, out);

    if (rc == DLOCK_OK && dlock__redis_wait_short())
        return give_back_unreplicated(be, req, 1);
    return rc;
}

/* min_replicas: an extension fewer replicas acknowledged fails, the lock
 * still held on the master (the caller may release it or try again). */
static int redis_extend(void *be, const dlock_request *req)
{
    int rc = is_mutex(req) ? mutex_extend(be, req->name, req->token, req->lease_ms)
                           : dlock__redis_family_extend(be, req);

    if (rc == DLOCK_OK && dlock__redis_wait_short())
        return dlock__redis_wait_fail("the lease was extended on the master only");
    return rc;
}

static int redis_check(void *be, const dlock_request *req)
{
    return is_mutex(req) ? mutex_check(be, req->name, req->token)
                         : dlock__redis_family_check(be, req);
}

/* Called from the watchdog thread only: uses the watchdog's connection. One
 * script renews a batch of locks of any kind (family_renew.lua), so a
 * watchdog holding a mutex and a reader pays one round trip. */
static int redis_renew(void *arg, dlock_renewal *items, size_t n)
{
    redis_backend *be = arg;

    int rc = dlock__redis_family_renew(be, &be->wd, items, n, 1);

    /* min_replicas: a renewal fewer replicas acknowledged counts as a
     * failed one: the watchdog tries again until the lease runs out. */
    if (rc == DLOCK_OK && dlock__redis_wait_short())
        return dlock__redis_wait_fail("renewed on the master only");
    return rc;
}

/* ---- waiting ----------------------------------------------------------- */

int dlock__redis_watch_open(redis_backend *be, const char *channel, const char *name,
                            const char *token, dlock__redis_watch **out)
{
    dlock__redis_watch *w = calloc(1, sizeof(*w));
    int rc;

    *out = NULL;
    if (w == NULL || (name != NULL && (w->name = strdup(name)) == NULL) ||
        (token != NULL && (w->token = strdup(token)) == NULL)) {
        rc = dlock__fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    if ((rc = dlock__redis_watch_begin(be->watcher, channel, token, &w->waiter)) != DLOCK_OK)
        goto err;
    *out = w;
    return DLOCK_OK;
err:
    if (w != NULL) {
        free(w->name);
        free(w->token);
    }
    free(w);
    return rc;
}

void dlock__redis_watch_close(redis_backend *be, dlock__redis_watch *w)
{
    if (w == NULL)
        return;
    /* First, so that the upkeep renews no place this waiter leaves. */
    dlock__redis_place_drop(be, w);
    dlock__redis_listen_end(be, w);
    if (w->leave) {
        /* Best effort: if this fails, the server drops the place, marker or
         * hand-off entry when its expiry passes. */
        key_buf base, chan;
        args a = {0};
        redisReply *r = NULL;
        char saved[512];

        snprintf(saved, sizeof(saved), "%s", dlock_error_message());
        make_key(&base, be, w->name, "");
        make_key(&chan, be, w->name, ":release");
        arg_key(&a, &base);
        arg_str(&a, w->token);
        arg_key(&a, &chan);
        if (w->entry != NULL)
            arg_str(&a, w->entry);
        else if (w->grant_token != NULL) {
            /* A waiter of the family that listened: a hold handed to it
             * goes back. */
            arg_str(&a, w->grant_token);
            arg_str(&a, w->grant_value);
        }
        if (cmd_script(be, w->entry != NULL ? &dlock__redis_script_mutex_leave
                                            : &dlock__redis_script_leave,
                       &r, 1, a.argc, a.argv, a.lens) == DLOCK_OK)
            freeReplyObject(r);
        /* The caller reports why it gave up, not how leaving went. */
        dlock__fail(DLOCK_OK, "%s", saved);
    }
    dlock__redis_watch_end(be->watcher, w->waiter);
    free(w->name);
    free(w->token);
    free(w->entry);
    free(w->grant_token);
    free(w->grant_value);
    free(w);
}

static int mutex_watch_begin(redis_backend *be, const char *name, void **watch)
{
    key_buf chan;
    char wid[DLOCK__TOKEN_LEN + 1];
    int rc;

    /* The waiter's id is what a hand-off message names: not its owner
     * token, which must not travel on a channel others can read. */
    if ((rc = dlock__token_new(wid)) != DLOCK_OK)
        return rc;
    make_key(&chan, be, name, ":release");
    return dlock__redis_watch_open(be, chan.buf, name, wid, (dlock__redis_watch **)watch);
}

static int redis_watch_begin(void *be, const dlock_request *req, void **watch)
{
    return is_mutex(req) ? mutex_watch_begin(be, req->name, watch)
                         : dlock__redis_family_watch_begin(be, req, watch);
}

static int redis_watch_wait(void *arg, void *watch, int64_t timeout_ms)
{
    dlock__redis_watch *w = watch;

    if (w->listens && (w->in_slot || w->ln != NULL))
        return dlock__redis_listen_wait(arg, w, timeout_ms);
    return dlock__redis_watch_wait(((redis_backend *)arg)->watcher, w->waiter, timeout_ms);
}

static void redis_watch_end(void *arg, void *watch)
{
    dlock__redis_watch_close(arg, watch);
}

static void redis_watch_wake(void *arg, void *watch)
{
    dlock__redis_watch_wake(((redis_backend *)arg)->watcher, ((dlock__redis_watch *)watch)->waiter);
}

/* ---- without blocking: the asynchronous API's loop ------------------------ */

/* A request sent by redis_start or redis_renew_start, until its reply;
 * its arguments kept for an EVAL after NOSCRIPT. */
#define OP_RENEW 0
typedef struct {
    redis_backend *be;
    const dlock__redis_script *script;
    int op, nkeys;
    int64_t lease_ms;
    dlock_acquire_result *res;
    dlock_renewal *items; /* OP_RENEW: n of them, their arguments in block */
    size_t n;
    void *block;
    void (*done)(void *, int);
    void *arg;
    int argc, evaled;
    const char **argv;
    size_t *lens;
    const char *own_argv[16];
    size_t own_lens[16];
    char bytes[]; /* what own_argv points to */
} started;

/* Send st's script: EVALSHA, or EVAL (which loads it) when eval. */
static int started_send(started *st, int eval, int again);

static void started_free(started *st)
{
    free(st->block);
    free(st);
}

/* Its reply, on whichever thread read it, the mux's mutex held. */
static void started_reply(void *ctx, int rc, redisReply *r)
{
    started *st = ctx;
    long long v = 0;

    if (rc != DLOCK_OK) {
        /* The connection failed: the thread's message says how. */
    } else if (r->type == REDIS_REPLY_ERROR && r->len >= 8 &&
               strncmp(r->str, "NOSCRIPT", 8) == 0 && !st->evaled) {
        /* The server restarted or flushed its scripts: EVAL loads it. */
        freeReplyObject(r);
        if (started_send(st, 1, 1) == DLOCK_OK)
            return;
        rc = DLOCK_ENOTSUP;
    } else if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "READONLY", 8) == 0) {
        /* A master demoted by a failover: the blocking call follows it. */
        rc = dlock__fail(DLOCK_ENOTSUP, "%s: READONLY", st->be->mux.conn.where);
        freeReplyObject(r);
    } else if (r->type == REDIS_REPLY_ERROR) {
        rc = dlock__redis_conn_reply_error(&st->be->mux.conn, r);
        freeReplyObject(r);
    } else if (st->op == OP_RENEW) {
        rc = dlock__redis_renew_reply(&st->be->mux.conn, r, st->items, st->n);
        freeReplyObject(r);
    } else if (st->op == DLOCK_BACKEND_OP_ACQUIRE) {
        rc = acquire_reply(st->be, r, NULL, st->lease_ms, st->res);
    } else if ((rc = int_reply(st->be->cmd, r, "the release script", &v)) == DLOCK_OK) {
        rc = v == DLOCK__REDIS_DONE ? DLOCK_OK : DLOCK_ELOST;
    }
    st->done(st->arg, rc);
    started_free(st);
}

/* Without threads, the loop's thread makes the connection itself. */
static int async_ready(redis_backend *be)
{
    if (!be->mux.on || be->mux.conn.is_cluster)
        return DLOCK_ENOTSUP;
    return be->no_threads ? dlock__redis_mux_connect(&be->mux) : DLOCK_OK;
}

/* A try-once acquire or a release of a plain mutex, sent on the shared
 * pipelined connection without waiting (redis_mux.h): on one server, TLS
 * or Sentinel, without min_replicas (whose WAIT the blocking call pairs). */
static int redis_start(void *arg, int op, const dlock_request *req, dlock_acquire_result *res,
                       void (*done)(void *, int), void *done_arg)
{
    redis_backend *be = arg;
    const dlock__redis_script *script = op == DLOCK_BACKEND_OP_ACQUIRE
                                            ? &dlock__redis_script_acquire
                                            : &dlock__redis_script_release;
    key_buf keys[MUTEX_KEYS], chan;
    args a = {0};
    size_t total = 0;
    started *st;
    char *at;
    int rc;

    if (!is_mutex(req) || dlock__redis_script_waits(&be->mux.conn, script)) {
        return be->no_threads ? dlock__fail(DLOCK_ENOTSUP, "not served without threads: a "
                                            "plain mutex only")
                              : DLOCK_ENOTSUP;
    }
    if ((rc = async_ready(be)) != DLOCK_OK)
        return rc;
    if (op == DLOCK_BACKEND_OP_ACQUIRE)
        acquire_args(be, req, NULL, keys, &a);
    else
        release_args(be, req->name, req->token, keys, &chan, &a);
    for (int i = 0; i < a.argc; i++)
        total += a.lens[i];
    if ((st = calloc(1, sizeof(*st) + total)) == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    st->be = be;
    st->script = script;
    st->op = op;
    st->nkeys = MUTEX_KEYS;
    st->lease_ms = req->lease_ms;
    st->res = res;
    st->done = done;
    st->arg = done_arg;
    st->argc = a.argc;
    st->argv = st->own_argv;
    st->lens = st->own_lens;
    at = st->bytes;
    for (int i = 0; i < a.argc; i++) {
        memcpy(at, a.argv[i], a.lens[i]);
        st->own_argv[i] = at;
        st->own_lens[i] = a.lens[i];
        at += a.lens[i];
    }
    if ((rc = started_send(st, 0, 0)) != DLOCK_OK)
        started_free(st);
    return rc;
}

/* A renewal batch (or an extension: a batch of one) sent so. */
static int redis_renew_start(void *arg, dlock_renewal *items, size_t n,
                             void (*done)(void *, int), void *done_arg)
{
    redis_backend *be = arg;
    started *st;
    int rc;

    if (dlock__redis_script_waits(&be->mux.conn, &dlock__redis_script_family_renew))
        return dlock__fail(DLOCK_ENOTSUP, "not served without threads: min_replicas");
    if ((rc = async_ready(be)) != DLOCK_OK)
        return rc;
    if ((st = calloc(1, sizeof(*st))) == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    st->be = be;
    st->script = &dlock__redis_script_family_renew;
    st->op = OP_RENEW;
    st->nkeys = (int)n;
    st->items = items;
    st->n = n;
    st->done = done;
    st->arg = done_arg;
    if ((rc = dlock__redis_renew_args(be, items, n, 1, &st->block, &st->argc, &st->argv,
                                      &st->lens)) != DLOCK_OK ||
        (rc = started_send(st, 0, 0)) != DLOCK_OK)
        started_free(st);
    return rc;
}

static int started_send(started *st, int eval, int again)
{
    dlock__redis_script_cmd c;
    int rc;

    if ((rc = dlock__redis_script_cmd_init(&c, st->script, 0, st->nkeys, st->argc, st->argv,
                                           st->lens)) != DLOCK_OK)
        return rc;
    if (eval) {
        dlock__redis_script_cmd_eval(&c, st->script);
        st->evaled = 1;
    }
    rc = again ? dlock__redis_mux_send_again(&st->be->mux, c.argc, c.av, c.al, started_reply, st)
               : dlock__redis_mux_send_async(&st->be->mux, c.argc, c.av, c.al, started_reply, st);
    dlock__redis_script_cmd_free(&c);
    return rc;
}

static int redis_async_fds(void *arg, int *fds, unsigned *gens, int max)
{
    redis_backend *be = arg;

    if (max < 1 || !be->mux.on || (fds[0] = dlock__redis_mux_fd(&be->mux, &gens[0])) < 0)
        return 0;
    return 1;
}

static int64_t redis_async_step(void *arg)
{
    redis_backend *be = arg;

    return be->mux.on ? dlock__redis_mux_pump(&be->mux) : -1;
}

static void redis_watch_notify(void *arg, void *watch, void (*fn)(void *), void *fn_arg)
{
    dlock__redis_watch *w = watch;

    /* A waiter told of releases (the asynchronous API's) sleeps in no
     * watch_wait, so it cannot pop a grant: its entry must not say it
     * listens (a pushed grant is announced to nobody). */
    if (fn != NULL)
        w->told = 1;
    dlock__redis_watch_notify(((redis_backend *)arg)->watcher, w->waiter, fn, fn_arg);
}

static int redis_multi_acquire(void *be, const dlock_request *reqs, size_t n, uint64_t *fences,
                               dlock_acquire_result *out)
{
    int rc = dlock__redis_multi_acquire(be, reqs, n, fences, out);

    if (rc == DLOCK_OK && dlock__redis_wait_short())
        return give_back_unreplicated(be, reqs, n);
    return rc;
}

static const char *const redis_schemes[] = {"redis", "unix", "rediss", "redis-sentinel",
                                            "rediss-sentinel", "redis-cluster",
                                            "rediss-cluster", NULL};

const dlock_backend dlock__redis_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "redis",
    .schemes = redis_schemes,
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_KIND(DLOCK_KIND_FAIR) |
            DLOCK_CAP_KIND(DLOCK_KIND_READ) | DLOCK_CAP_KIND(DLOCK_KIND_WRITE) |
            DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE) | DLOCK_CAP_KIND(DLOCK_KIND_LEADER) |
            DLOCK_CAP_OWNER_IDS,
    .open = redis_open,
    .close = redis_close,
    .acquire = redis_acquire,
    .release = redis_release,
    .extend = redis_extend,
    .check = redis_check,
    .renew = redis_renew,
    .watch_begin = redis_watch_begin,
    .watch_wait = redis_watch_wait,
    .watch_end = redis_watch_end,
    .watch_wake = redis_watch_wake,
    .status = dlock__redis_status,
    .force_release = dlock__redis_force_release,
    .list = dlock__redis_list,
    .holders = dlock__redis_holders,
    .downgrade = dlock__redis_downgrade,
    .set_permits = dlock__redis_set_permits,
    .leader_get = dlock__redis_leader_get,
    .observe_begin = dlock__redis_observe_begin,
    .multi_atomic = dlock__redis_multi_atomic,
    .multi_acquire = redis_multi_acquire,
    .watch_notify = redis_watch_notify,
    .start = redis_start,
    .async_fds = redis_async_fds,
    .async_step = redis_async_step,
    .renew_start = redis_renew_start,
};
