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
        n = snprintf(k->buf, sizeof(k->buf), "%s{%s}%s", be->prefix, name, suffix);
    }
    k->len = (size_t)n;
}

void dlock__redis_fence_keys(dlock__redis_key_buf *floor, dlock__redis_key_buf *registry,
                             const dlock__redis_be *be, const char *name)
{
    char tag[24] = "";
    int n;

    if (be->cmd[0].is_cluster) {
        /* The floor of the slot of name's keys: a counter and the floor it
         * is retired into always live on one master, and move together. */
        dlock__redis_key_buf k;
        dlock__redis_key(&k, be, name, "");
        tag[0] = '{';
        dlock__redis_slot_tag(dlock__redis_key_slot(k.buf, k.len), tag + 1, sizeof(tag) - 2);
        strcat(tag, "}");
    }
    n = snprintf(floor->buf, sizeof(floor->buf), "%s%s%s", be->prefix, tag,
                 DLOCK__REDIS_FENCE_FLOOR);
    floor->len = (size_t)n;
    n = snprintf(registry->buf, sizeof(registry->buf), "%s%s%s", be->prefix, tag,
                 DLOCK__REDIS_FENCE_REGISTRY);
    registry->len = (size_t)n;
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
    dlock__redis_conn *conn = dlock__redis_cmd_take(be);
    int rc = dlock__redis_conn_script(conn, s, out, nkeys, argc, argv, lens);

    dlock__redis_cmd_give(be, conn);
    return rc;
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
    for (int i = 0; i < DLOCK__REDIS_CMD_MAX; i++)
        dlock__redis_conn_close(&be->cmd[i]);
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
    if ((rc = dlock__redis_conn_init(&be->wd, url, opts, "watchdog")) != DLOCK_OK ||
        (rc = dlock__redis_watcher_new(&be->watcher, url, opts)) != DLOCK_OK)
        goto err;
    /* Connect now so that a wrong address or password is reported by open. */
    if ((rc = dlock__redis_conn_connect(&be->cmd[0])) != DLOCK_OK)
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

/* How long a waiter of the plain mutex sleeps at most between tries (each
 * try keeps its hand-off entry alive), and how long the entry outlives it. */
static int64_t handoff_refresh_ms(int64_t lease_ms)
{
    return lease_ms / 4 > 10 ? lease_ms / 4 : 10;
}

/* A waiter's hand-off entry, made on its first try: "WAITER-ID TOKEN LEASE". */
static int handoff_entry(dlock__redis_watch *w, const char *owner, int64_t lease_ms)
{
    const char *wid = dlock__redis_watch_id(w->waiter);
    size_t n = strlen(wid) + strlen(owner) + 24;
    char *token;

    if (w->entry != NULL)
        return DLOCK_OK;
    /* w->token held the waiter's id until now; leaving needs the owner's. */
    if ((token = strdup(owner)) == NULL || (w->entry = malloc(n)) == NULL) {
        free(token);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    snprintf(w->entry, n, "%s %s %lld", wid, owner, (long long)lease_ms);
    free(w->token);
    w->token = token;
    return DLOCK_OK;
}

static int mutex_acquire(redis_backend *be, const dlock_request *req, void *watch,
                         dlock_acquire_result *out)
{
    const char *name = req->name, *owner = req->token;
    int64_t lease_ms = req->lease_ms;
    uint64_t *fence = &out->fence;
    int64_t *retry_ms = &out->retry_ms;
    dlock__redis_watch *w = watch;
    key_buf keys[MUTEX_KEYS];
    args a = {0};
    redisReply *r;
    int rc;

    /* A release may have handed us the lock while we slept (release.lua):
     * this try is what confirms it, finding our token in the key, and the
     * lease counts from when this try was sent. A grant message alone is
     * never trusted: it may be late, for a hand-off whose key has expired
     * and been taken by another since. */
    if (w != NULL && (rc = handoff_entry(w, owner, lease_ms)) != DLOCK_OK)
        return rc;
    mutex_keys(be, name, keys, &a);
    arg_str(&a, owner);
    arg_num(&a, lease_ms);
    arg_str(&a, req->holder != NULL ? req->holder : "");
    if (w != NULL) {
        arg_str(&a, w->entry);
        arg_num(&a, 2 * handoff_refresh_ms(lease_ms) + 100);
        /* From here the server may hold our entry, or the lock, even if no
         * reply comes back (a timeout after the server ran the script):
         * giving up must clean up (watch_end, mutex_leave.lua). */
        w->leave = 1;
    }
    if ((rc = cmd_script(be, &dlock__redis_script_acquire, &r, MUTEX_KEYS, a.argc, a.argv,
                         a.lens)) != DLOCK_OK)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
        freeReplyObject(r);
        return bad_reply(be->cmd, "the acquire script");
    }
    if (r->element[0]->integer == DLOCK__REDIS_TAKEN ||
        r->element[0]->integer == DLOCK__REDIS_HANDED) {
        out->handed = r->element[0]->integer == DLOCK__REDIS_HANDED;
        if (r->element[1]->integer <= 0) {
            freeReplyObject(r);
            return bad_reply(be->cmd, "the acquire script (fence <= 0)");
        }
        *fence = (uint64_t)r->element[1]->integer;
        if (w != NULL)
            w->leave = 0;
        rc = DLOCK_OK;
    } else {
        /* PTTL: -1 the key has no expiry, -2 it vanished just now (retry). */
        long long pttl = r->element[1]->integer;
        *retry_ms = pttl == -2 ? 0 : pttl;
        if (w != NULL) {
            /* Our entry may be in the slot: come back before it expires. */
            int64_t refresh = handoff_refresh_ms(lease_ms);
            if (*retry_ms < 0 || *retry_ms > refresh)
                *retry_ms = refresh;
        }
        rc = DLOCK_EBUSY;
    }
    freeReplyObject(r);
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

static int mutex_release(redis_backend *be, const char *name, const char *owner)
{
    key_buf keys[MUTEX_KEYS], chan;
    args a = {0};

    mutex_keys(be, name, keys, &a);
    make_key(&chan, be, name, ":release");
    arg_str(&a, owner);
    arg_key(&a, &chan);
    arg_num(&a, DLOCK__REDIS_HANDOFF_CONFIRM_MS);
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
                           : dlock__redis_family_acquire(be, req, watch, &out->fence,
                                                         &out->retry_ms);

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

/* status.lua's kind words, as DLOCK_KIND_*; -1 for '' (free, or a hold of
 * an older dlock). */
static int kind_of(const redisReply *r)
{
    static const struct {
        const char *word;
        int kind;
    } kinds[] = {{"mutex", DLOCK_KIND_MUTEX},   {"fair", DLOCK_KIND_FAIR},
                 {"write", DLOCK_KIND_WRITE},   {"leader", DLOCK_KIND_LEADER},
                 {"read", DLOCK_KIND_READ},     {"sem", DLOCK_KIND_SEMAPHORE}};

    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (r->len == strlen(kinds[i].word) && memcmp(r->str, kinds[i].word, r->len) == 0)
            return kinds[i].kind;
    return -1;
}

/* status.lua's reply: {held, pttl, fence, kind, then fence, ttl, record
 * for each holder}. */
static int status_reply_ok(const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4 || (r->elements - 4) % 3 != 0 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[2]->type != REDIS_REPLY_INTEGER || r->element[3]->type != REDIS_REPLY_STRING)
        return 0;
    for (size_t i = 4; i < r->elements; i += 3)
        if (r->element[i]->type != REDIS_REPLY_INTEGER ||
            r->element[i + 1]->type != REDIS_REPLY_INTEGER ||
            r->element[i + 2]->type != REDIS_REPLY_STRING)
            return 0;
    return 1;
}

/*
 * Read name's state with status.lua (force: and break it). *out gets the
 * lock's state, its holder fields those of the oldest holder (the lowest
 * fence) when several hold it (readers, permits, a reentrant owner's
 * handles); each, when not NULL, is called for every holder with *out as
 * that holder sees it (its fence, its lease left, its record), until it
 * returns non-zero. A record that is not one (a key set by hand) shows no
 * holder.
 */
static int read_status(redis_backend *be, const char *name, int force, dlock_lock_info *out,
                       dlock_list_cb each, void *payload)
{
    key_buf lock, counter, chan;
    uint64_t oldest = UINT64_MAX;
    args a = {0};
    redisReply *r;
    int rc;

    make_key(&lock, be, name, "");
    make_key(&counter, be, name, ":fence");
    make_key(&chan, be, name, ":release");
    arg_key(&a, &lock);
    arg_key(&a, &counter);
    arg_str(&a, force ? "force" : "read");
    arg_key(&a, &chan);
    if ((rc = cmd_script(be, &dlock__redis_script_status, &r, 2, a.argc, a.argv, a.lens)) !=
        DLOCK_OK)
        return rc;
    if (!status_reply_ok(r)) {
        freeReplyObject(r);
        return bad_reply(be->cmd, "the status script");
    }
    out->held = r->element[0]->integer == 1;
    out->ttl_ms = out->held ? r->element[1]->integer : 0;
    out->fence = r->element[2]->integer > 0 ? (uint64_t)r->element[2]->integer : 0;
    out->kind = out->held ? kind_of(r->element[3]) : -1;
    out->holders = out->held ? (int)((r->elements - 4) / 3) : 0;
    for (size_t i = 4; out->held && i < r->elements; i += 3) {
        uint64_t fence = (uint64_t)r->element[i]->integer;
        dlock_lock_info one = *out;

        if (fence < oldest && r->element[i + 2]->len > 0 &&
            dlock_holder_parse(&one, r->element[i + 2]->str, r->element[i + 2]->len) ==
                DLOCK_OK) {
            oldest = fence;
            *out = one;
        }
    }
    for (size_t i = 4; each != NULL && out->held && i < r->elements; i += 3) {
        dlock_lock_info one = *out;

        one.fence = r->element[i]->integer > 0 ? (uint64_t)r->element[i]->integer : 0;
        one.ttl_ms = r->element[i + 1]->integer;
        if (r->element[i + 2]->len == 0 ||
            dlock_holder_parse(&one, r->element[i + 2]->str, r->element[i + 2]->len) != DLOCK_OK)
            dlock_holder_parse(&one, NULL, 0); /* clears the fields: no record */
        if (each(name, &one, payload) != 0)
            break;
    }
    freeReplyObject(r);
    return DLOCK_OK;
}

static int redis_status(void *arg, const char *name, dlock_lock_info *out)
{
    return read_status(arg, name, 0, out, NULL, NULL);
}

static int redis_holders(void *arg, const char *name, dlock_list_cb cb, void *payload)
{
    dlock_lock_info info;

    memset(&info, 0, sizeof(info));
    return read_status(arg, name, 0, &info, cb, payload);
}

static int redis_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    return read_status(arg, name, 1, removed, NULL, NULL);
}

/* ---- listing ----------------------------------------------------------- */

/* Append text to a SCAN pattern, with Redis' glob characters escaped. */
static size_t glob_escape(char *out, size_t at, const char *text)
{
    for (; *text != '\0'; text++) {
        if (strchr("*?[]\\", *text) != NULL)
            out[at++] = '\\';
        out[at++] = *text;
    }
    out[at] = '\0';
    return at;
}

/* The keys a lock is listed by, as status.lua reads them: "PREFIX{NAME}"
 * (the exclusive kinds), "...}:readers" and "...}:sem" (shared holds), with
 * the kinds status then reports for it. */
static const struct {
    const char *suffix;
    int shared; /* 0: any kind but READ and SEMAPHORE; else that kind */
} list_keys[] = {{"}", 0}, {"}:readers", DLOCK_KIND_READ}, {"}:sem", DLOCK_KIND_SEMAPHORE}};

/* The name in a key of list_keys, into name (DLOCK_NAME_MAX + 1 bytes);
 * the entry's index, or -1 for another key. */
static int list_key_name(const redis_backend *be, const redisReply *k, char *name)
{
    size_t plen = strlen(be->prefix);

    if (k->type != REDIS_REPLY_STRING || k->len < plen + 3)
        return -1;
    if (k->str[plen] == '}' && k->str[plen + 1] == '{') {
        /* PREFIX}{TAG}{NAME}...: a cluster's key for a name starting with
         * '}' (dlock__redis_key); the rest is read as PREFIX{NAME}... */
        const char *close = memchr(k->str + plen + 2, '}', k->len - plen - 2);
        if (close == NULL || close + 1 >= k->str + k->len || close[1] != '{')
            return -1;
        plen = (size_t)(close + 1 - k->str);
        if (k->len < plen + 3)
            return -1;
    }
    for (int i = 0; i < (int)(sizeof(list_keys) / sizeof(list_keys[0])); i++) {
        size_t slen = strlen(list_keys[i].suffix), n;

        if (k->len < plen + 1 + slen + 1 ||
            memcmp(k->str + k->len - slen, list_keys[i].suffix, slen) != 0)
            continue;
        n = k->len - plen - 1 - slen;
        if (n > DLOCK_NAME_MAX || memchr(k->str + plen + 1, '\0', n) != NULL)
            return -1;
        memcpy(name, k->str + plen + 1, n);
        name[n] = '\0';
        return i;
    }
    return -1;
}

/*
 * SCAN for the keys a lock is listed by (list_keys) whose NAME starts with
 * name_prefix (the prefix's own keys have no brace), then read each one's
 * state as status does: one round trip per lock, for an operator's
 * listing. A name is listed by the key its state was read from, so once
 * (a read-write lock whose writer holds it now, and whose readers' keys
 * are not gone yet, is listed by its writer's key).
 */
static int list_on(redis_backend *be, const char *pattern, int slot, dlock_list_cb cb,
                   void *payload, int *stopped)
{
    char cursor[32] = "0";
    int rc = DLOCK_OK, stop = 0;

    do {
        const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
        size_t lens[6] = {4, strlen(cursor), 5, strlen(pattern), 5, 4};
        dlock__redis_conn *conn = dlock__redis_cmd_take(be);
        redisReply *r;

        rc = dlock__redis_conn_command_slot(conn, &r, 6, argv, lens, slot);
        dlock__redis_cmd_give(be, conn);
        if (rc != DLOCK_OK)
            break;
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= sizeof(cursor) ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
            freeReplyObject(r);
            rc = bad_reply(be->cmd, "SCAN");
            break;
        }
        memcpy(cursor, r->element[0]->str, r->element[0]->len);
        cursor[r->element[0]->len] = '\0';
        for (size_t i = 0; i < r->element[1]->elements && !stop && rc == DLOCK_OK; i++) {
            char name[DLOCK_NAME_MAX + 1];
            int key = list_key_name(be, r->element[1]->element[i], name);
            dlock_lock_info info;
            int shared;

            if (key < 0)
                continue;
            memset(&info, 0, sizeof(info));
            rc = read_status(be, name, 0, &info, NULL, NULL);
            shared = info.kind == DLOCK_KIND_READ || info.kind == DLOCK_KIND_SEMAPHORE;
            if (rc == DLOCK_OK && info.held &&
                (list_keys[key].shared ? info.kind == list_keys[key].shared : !shared))
                stop = cb(name, &info, payload) != 0;
        }
        freeReplyObject(r);
    } while (rc == DLOCK_OK && !stop && strcmp(cursor, "0") != 0);
    *stopped = stop;
    return rc;
}

/* A single server is scanned once; a cluster, master by master (each
 * reached by a slot it serves). */
static int redis_list(void *arg, const char *name_prefix, dlock_list_cb cb, void *payload)
{
    redis_backend *be = arg;
    size_t plen = strlen(be->prefix);
    char *pattern = malloc(2 * (plen + strlen(name_prefix)) + 8);
    char *alt = malloc(2 * (plen + strlen(name_prefix)) + 12);
    int slots[DLOCK__REDIS_LIST_MASTERS], n = 1, rc = DLOCK_OK, stop = 0;

    if (pattern == NULL || alt == NULL) {
        free(pattern);
        free(alt);
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    size_t at = glob_escape(pattern, 0, be->prefix);
    pattern[at++] = '{';
    at = glob_escape(pattern, at, name_prefix);
    memcpy(pattern + at, "*}*", 4);
    /* A cluster's names that start with '}' (dlock__redis_key). */
    at = glob_escape(alt, 0, be->prefix);
    memcpy(alt + at, "}{*}{", 5);
    at = glob_escape(alt, at + 5, name_prefix);
    memcpy(alt + at, "*}*", 4);
    slots[0] = -1;
    if (be->cmd[0].is_cluster) {
        dlock__redis_conn *conn = dlock__redis_cmd_take(be);
        n = dlock__redis_cluster_masters(conn, slots, DLOCK__REDIS_LIST_MASTERS);
        dlock__redis_cmd_give(be, conn);
        if (n < 0)
            rc = n;
    }
    for (int i = 0; i < n && rc == DLOCK_OK && !stop; i++) {
        rc = list_on(be, pattern, slots[i], cb, payload, &stop);
        if (rc == DLOCK_OK && !stop && be->cmd[0].is_cluster &&
            (name_prefix[0] == '\0' || name_prefix[0] == '}') &&
            strchr(be->prefix, '{') == NULL)
            rc = list_on(be, alt, slots[i], cb, payload, &stop);
    }
    free(pattern);
    free(alt);
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
    return dlock__redis_watch_wait(((redis_backend *)arg)->watcher,
                                   ((dlock__redis_watch *)watch)->waiter, timeout_ms);
}

static void redis_watch_end(void *arg, void *watch)
{
    dlock__redis_watch_close(arg, watch);
}

static void redis_watch_wake(void *arg, void *watch)
{
    dlock__redis_watch_wake(((redis_backend *)arg)->watcher, ((dlock__redis_watch *)watch)->waiter);
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
    .status = redis_status,
    .force_release = redis_force_release,
    .list = redis_list,
    .holders = redis_holders,
    .downgrade = dlock__redis_downgrade,
    .set_permits = dlock__redis_set_permits,
    .leader_get = dlock__redis_leader_get,
    .observe_begin = dlock__redis_observe_begin,
    .multi_atomic = dlock__redis_multi_atomic,
    .multi_acquire = redis_multi_acquire,
};
