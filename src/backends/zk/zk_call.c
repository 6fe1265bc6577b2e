/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The ZooKeeper calls. The multithreaded C client runs an I/O thread and a
 * completion thread per handle; its synchronous calls have no timeout of
 * their own, so every call here is the asynchronous one, waited for at most
 * the client's command timeout. A call whose wait ran out leaves its
 * completion to free what it shares (a reference count).
 *
 * In flight. A session sends at most DLOCK__ZK_INFLIGHT requests of
 * callers at once; a caller beyond waits its turn here (first come, first
 * served) as long as the line moves: it gives up (ZOPERATIONTIMEOUT) when
 * no request of the session ended for a command timeout. Its own request
 * then has the command timeout for its reply. Thousands of callers waiting
 * on one client queue at once (each a create, a list and a watch): sent
 * all together they made a queue of thousands on the server, which serves
 * every session's requests in one line, and the renewals of every client
 * (this one's, others') waited behind it until leases ran out. A renewal
 * (dlock__zk_confirm, the watchdog's) does not wait here: it passes the
 * callers' queue, and no caller's request is sent while it waits for its
 * replies: its sync, which the server answers after every request the
 * session sent before it, waits behind at most DLOCK__ZK_INFLIGHT of them.
 * Nor do a queued waiter's look after its wake-up and its winner's watch
 * (dlock__zk_children_now, dlock__zk_exists_now): one per release, and
 * the lease of the lock they take runs already.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "zk_int.h"

/* ---- in flight ------------------------------------------------------------- */

/* A caller waiting for its turn to send (on its stack), in s->qhead. */
struct dlock__zk_slot_wait {
    pthread_cond_t cv;
    struct dlock__zk_slot_wait *next, *prev;
    int granted;
};

/* A turn to send: ZOK, or ZOPERATIONTIMEOUT when no request of the
 * session ended for a whole command timeout while we waited (the server
 * does not answer). While replies come, the line moves and we wait on. */
static int slot_take(dlock__zk_sess *s)
{
    int64_t timeout = s->be->command_timeout_ms, start;
    struct dlock__zk_slot_wait me;

    pthread_mutex_lock(&s->qmu);
    if (s->inflight < DLOCK__ZK_INFLIGHT && s->qhead == NULL && s->renewing == 0) {
        s->inflight++;
        pthread_mutex_unlock(&s->qmu);
        return ZOK;
    }
    dlock__zk_cond_init(&me.cv);
    me.granted = 0;
    me.next = NULL;
    me.prev = s->qtail;
    if (s->qtail != NULL)
        s->qtail->next = &me;
    else
        s->qhead = &me;
    s->qtail = &me;
    start = dlock__zk_mono_ms();
    while (!me.granted) {
        /* The line last moved at last (or we came then). */
        int64_t last = s->last_turn_ms > start ? s->last_turn_ms : start;
        if (dlock__zk_mono_ms() >= last + timeout)
            break;
        dlock__zk_wait_until(&me.cv, &s->qmu, last + timeout);
    }
    if (!me.granted) {
        if (me.prev != NULL)
            me.prev->next = me.next;
        else
            s->qhead = me.next;
        if (me.next != NULL)
            me.next->prev = me.prev;
        else
            s->qtail = me.prev;
    }
    pthread_mutex_unlock(&s->qmu);
    pthread_cond_destroy(&me.cv);
    return me.granted ? ZOK : ZOPERATIONTIMEOUT;
}

/* A request's turn ends (its completion ran, or it was never sent): the
 * next caller's begins. */
static void slot_give(dlock__zk_sess *s)
{
    struct dlock__zk_slot_wait *w;

    pthread_mutex_lock(&s->qmu);
    s->last_turn_ms = dlock__zk_mono_ms();
    if ((w = s->qhead) != NULL && s->renewing == 0) {
        /* The turn passes on: inflight stays. */
        s->qhead = w->next;
        if (s->qhead != NULL)
            s->qhead->prev = NULL;
        else
            s->qtail = NULL;
        w->granted = 1;
        pthread_cond_signal(&w->cv);
    } else {
        s->inflight--;
    }
    pthread_mutex_unlock(&s->qmu);
}

/* A renewal of s begins: no caller's request is sent until it ends, so
 * that its sync waits behind those in flight only. */
static void renewal_begin(dlock__zk_sess *s)
{
    pthread_mutex_lock(&s->qmu);
    s->renewing++;
    pthread_mutex_unlock(&s->qmu);
}

/* It ended: the callers waiting take the free turns. */
static void renewal_end(dlock__zk_sess *s)
{
    pthread_mutex_lock(&s->qmu);
    if (--s->renewing == 0) {
        while (s->qhead != NULL && s->inflight < DLOCK__ZK_INFLIGHT) {
            struct dlock__zk_slot_wait *w = s->qhead;
            s->qhead = w->next;
            if (s->qhead != NULL)
                s->qhead->prev = NULL;
            else
                s->qtail = NULL;
            s->inflight++;
            w->granted = 1;
            pthread_cond_signal(&w->cv);
        }
    }
    pthread_mutex_unlock(&s->qmu);
}

/* ---- calls ------------------------------------------------------------------ */

/* What a call and its completion share. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, done, rc;
    int64_t deadline;    /* CLOCK_MONOTONIC: the command timeout's end */
    int turn;            /* it waited for a turn (zk_call.c, "In flight") */
    dlock__zk_sess *s;
    uint64_t gen;        /* the session's gen when sent */
    int64_t sent;
    struct Stat stat;
    char *str;
    struct String_vector kids;
    char *data;
    int len;
    zoo_op_t *ops;
    zoo_op_result_t *results;
    char **paths;
    size_t n;
    struct ACL_vector acl;
} op_t;

/* A call's state, once it is this caller's turn to send (NULL with *zrc:
 * ZSYSTEMERROR, or ZOPERATIONTIMEOUT when the turn did not come within
 * the command timeout). */
static op_t *op_new_turn(dlock__zk_sess *s, int *zrc, int turn)
{
    op_t *op;

    if (turn && (*zrc = slot_take(s)) != ZOK)
        return NULL;
    if ((op = calloc(1, sizeof(*op))) == NULL) {
        if (turn)
            slot_give(s);
        *zrc = ZSYSTEMERROR;
        return NULL;
    }
    op->turn = turn;
    op->deadline = dlock__zk_mono_ms() + s->be->command_timeout_ms;
    pthread_mutex_init(&op->mu, NULL);
    dlock__zk_cond_init(&op->cv);
    op->refs = 2; /* the caller and the completion */
    op->s = s;
    op->sent = dlock__zk_now_ms();
    pthread_mutex_lock(&s->mu);
    op->gen = s->gen;
    pthread_mutex_unlock(&s->mu);
    return op;
}

static void op_unref(op_t *op)
{
    int left;

    pthread_mutex_lock(&op->mu);
    left = --op->refs;
    pthread_mutex_unlock(&op->mu);
    if (left > 0)
        return;
    free(op->str);
    free(op->data);
    deallocate_String_vector(&op->kids);
    free(op->ops);
    free(op->results);
    for (size_t i = 0; op->paths != NULL && i < op->n; i++)
        free(op->paths[i]);
    free(op->paths);
    deallocate_ACL_vector(&op->acl);
    pthread_cond_destroy(&op->cv);
    pthread_mutex_destroy(&op->mu);
    free(op);
}

/* A reply to a request of session gen of s sent at sent (rc from the
 * server or the client). */
static void note_reply(dlock__zk_sess *s, uint64_t gen, int64_t sent, int rc)
{
    if (rc != ZCONNECTIONLOSS && rc != ZOPERATIONTIMEOUT && rc != ZSESSIONEXPIRED &&
        rc != ZCLOSING && rc != ZINVALIDSTATE && rc != ZSESSIONMOVED) {
        /* The server answered: it heard from the session at sent or
         * later. */
        pthread_mutex_lock(&s->mu);
        if (gen == s->gen && sent > s->last_contact_ms)
            s->last_contact_ms = sent;
        pthread_mutex_unlock(&s->mu);
    } else if (rc == ZSESSIONEXPIRED) {
        /* Only for the session it was sent in: a newer one is not. */
        pthread_mutex_lock(&s->mu);
        if (gen == s->gen) {
            s->expired = 1;
            pthread_cond_broadcast(&s->cv);
        }
        pthread_mutex_unlock(&s->mu);
    }
}

/* op's turn ends, if it waited for one. */
static void op_turn_end(op_t *op)
{
    if (op->turn)
        slot_give(op->s);
}

/* The completion's end: a reply came (rc from the server or the client). */
static void op_done(op_t *op, int rc)
{
    note_reply(op->s, op->gen, op->sent, rc);
    op_turn_end(op);
    pthread_mutex_lock(&op->mu);
    op->rc = rc;
    op->done = 1;
    pthread_cond_signal(&op->cv);
    pthread_mutex_unlock(&op->mu);
    op_unref(op);
}

static void on_string_stat(int rc, const char *value, const struct Stat *stat, const void *data)
{
    op_t *op = (op_t *)data;
    if (rc == ZOK) {
        op->str = value != NULL ? strdup(value) : NULL;
        if (stat != NULL)
            op->stat = *stat;
    }
    op_done(op, rc);
}

static void on_strings(int rc, const struct String_vector *strings, const void *data)
{
    op_t *op = (op_t *)data;
    if (rc == ZOK && strings != NULL) {
        op->kids.count = 0;
        op->kids.data = calloc((size_t)(strings->count > 0 ? strings->count : 1), sizeof(char *));
        for (int i = 0; op->kids.data != NULL && i < strings->count; i++)
            if ((op->kids.data[op->kids.count] = strdup(strings->data[i])) != NULL)
                op->kids.count++;
        if (op->kids.data == NULL || op->kids.count != strings->count)
            rc = ZSYSTEMERROR; /* out of memory */
    }
    op_done(op, rc);
}

static void on_void(int rc, const void *data)
{
    op_done((op_t *)data, rc);
}

static void on_stat(int rc, const struct Stat *stat, const void *data)
{
    op_t *op = (op_t *)data;
    if (rc == ZOK && stat != NULL)
        op->stat = *stat;
    op_done(op, rc);
}

static void on_data(int rc, const char *value, int len, const struct Stat *stat, const void *data)
{
    op_t *op = (op_t *)data;
    if (rc == ZOK) {
        op->len = len > 0 ? len : 0;
        op->data = malloc((size_t)op->len + 1);
        if (op->data == NULL) {
            rc = ZSYSTEMERROR;
        } else {
            if (op->len > 0)
                memcpy(op->data, value, (size_t)op->len);
            op->data[op->len] = '\0';
        }
        if (stat != NULL)
            op->stat = *stat;
    }
    op_done(op, rc);
}

/* A copy of the ACL: the library frees its own after the completion. */
static void on_acl(int rc, struct ACL_vector *acl, struct Stat *stat, const void *data)
{
    op_t *op = (op_t *)data;
    (void)stat;
    if (rc == ZOK && acl != NULL && acl->count > 0) {
        int bad = (op->acl.data = calloc((size_t)acl->count, sizeof(*acl->data))) == NULL;
        for (int i = 0; !bad && i < acl->count; i++) {
            struct ACL *a = &op->acl.data[op->acl.count++];
            a->perms = acl->data[i].perms;
            a->id.scheme = strdup(acl->data[i].id.scheme);
            a->id.id = strdup(acl->data[i].id.id);
            bad = a->id.scheme == NULL || a->id.id == NULL;
        }
        if (bad)
            rc = ZSYSTEMERROR; /* out of memory */
    }
    op_done(op, rc);
}

/* The handle of s, or NULL with *zrc (not connected yet: never opened). */
static zhandle_t *handle_of(dlock__zk_sess *s)
{
    zhandle_t *zh;
    pthread_mutex_lock(&s->mu);
    zh = s->zh;
    pthread_mutex_unlock(&s->mu);
    return zh;
}

/* After zoo_a* returned submitted: wait for the completion up to the
 * command timeout. The caller reads op's results when this returns ZOK,
 * then unrefs. */
static int op_wait(op_t *op, int submitted)
{
    int rc;

    if (submitted != ZOK) {
        /* Never sent: the completion will not run. */
        op->refs--;
        op_turn_end(op);
        return submitted;
    }
    pthread_mutex_lock(&op->mu);
    while (!op->done)
        if (dlock__zk_wait_until(&op->cv, &op->mu, op->deadline) == ETIMEDOUT)
            break;
    rc = op->done ? op->rc : ZOPERATIONTIMEOUT;
    pthread_mutex_unlock(&op->mu);
    return rc;
}

/* The ACL of the nodes we create (be->acl, or open without credentials). */
static const struct ACL_vector *acl_of(const dlock__zk_be *be)
{
    return be->acl.count > 0 ? &be->acl : &ZOO_OPEN_ACL_UNSAFE;
}

/* op, never sent: its turn ends and it is freed (the completion, which
 * held the second reference, will not run). */
static void op_abandon(op_t *op)
{
    op->refs = 1;
    op_turn_end(op);
    op_unref(op);
}

/* A call's state after its turn (turn: it waits for one) and the handle to
 * send it on: ZOK, or op_new_turn's code, or ZINVALIDSTATE (the session
 * was never opened). */
static int op_start(dlock__zk_sess *s, int turn, op_t **op, zhandle_t **zh)
{
    int rc;

    *zh = NULL;
    if ((*op = op_new_turn(s, &rc, turn)) == NULL)
        return rc;
    if ((*zh = handle_of(s)) == NULL) {
        op_abandon(*op);
        return ZINVALIDSTATE;
    }
    return ZOK;
}

#define NEW_OP(s, op, zh)                                                                          \
    do {                                                                                           \
        int zrc_ = op_start(s, 1, &(op), &(zh));                                                   \
        if (zrc_ != ZOK)                                                                           \
            return zrc_;                                                                           \
    } while (0)

int dlock__zk_create(dlock__zk_sess *s, const char *path, const char *data, int len, int flags,
                     char **created, struct Stat *stat)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    NEW_OP(s, op, zh);
    rc = op_wait(op, zoo_acreate2(zh, path, data, len, acl_of(s->be), flags, on_string_stat,
                                  op));
    if (rc == ZOK) {
        if (created != NULL) {
            *created = op->str;
            op->str = NULL;
        }
        if (stat != NULL)
            *stat = op->stat;
    }
    op_unref(op);
    return rc;
}

int dlock__zk_create_list(dlock__zk_sess *s, const char *path, const char *data, int len,
                          int flags, char **created, struct Stat *stat, const char *dir,
                          struct String_vector *kids, int *listed)
{
    zhandle_t *zh;
    op_t *op, *list;
    int rc, lrc;

    *listed = 0;
    NEW_OP(s, op, zh);
    /* The list rides on the create's turn. */
    if ((list = op_new_turn(s, &lrc, 0)) == NULL) {
        op_abandon(op);
        return lrc;
    }
    rc = zoo_acreate2(zh, path, data, len, acl_of(s->be), flags, on_string_stat, op);
    lrc = rc == ZOK ? zoo_aget_children(zh, dir, 0, on_strings, list) : rc;
    rc = op_wait(op, rc);
    lrc = op_wait(list, lrc);
    if (rc == ZOK) {
        if (created != NULL) {
            *created = op->str;
            op->str = NULL;
        }
        if (stat != NULL)
            *stat = op->stat;
        if (lrc == ZOK) {
            *kids = list->kids;
            list->kids.count = 0;
            list->kids.data = NULL;
            *listed = 1;
        }
    }
    op_unref(op);
    op_unref(list);
    return rc;
}

static int children(dlock__zk_sess *s, const char *path, int watch, struct String_vector *out,
                    int turn)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    if ((rc = op_start(s, turn, &op, &zh)) != ZOK)
        return rc;
    rc = op_wait(op, zoo_aget_children(zh, path, watch, on_strings, op));
    if (rc == ZOK) {
        *out = op->kids;
        op->kids.count = 0;
        op->kids.data = NULL;
    }
    op_unref(op);
    return rc;
}

int dlock__zk_children(dlock__zk_sess *s, const char *path, struct String_vector *out)
{
    return children(s, path, 0, out, 1);
}

int dlock__zk_children_now(dlock__zk_sess *s, const char *path, struct String_vector *out)
{
    return children(s, path, 0, out, 0);
}

int dlock__zk_children_watch(dlock__zk_sess *s, const char *path, struct String_vector *out)
{
    return children(s, path, 1, out, 1);
}

int dlock__zk_delete(dlock__zk_sess *s, const char *path, int version)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    NEW_OP(s, op, zh);
    rc = op_wait(op, zoo_adelete(zh, path, version, on_void, op));
    op_unref(op);
    return rc;
}

static int exists(dlock__zk_sess *s, const char *path, int watch, struct Stat *stat, int turn)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    if ((rc = op_start(s, turn, &op, &zh)) != ZOK)
        return rc;
    rc = op_wait(op, zoo_aexists(zh, path, watch, on_stat, op));
    if (rc == ZOK && stat != NULL)
        *stat = op->stat;
    op_unref(op);
    return rc;
}

int dlock__zk_exists(dlock__zk_sess *s, const char *path, int watch, struct Stat *stat)
{
    return exists(s, path, watch, stat, 1);
}

int dlock__zk_exists_now(dlock__zk_sess *s, const char *path, int watch, struct Stat *stat)
{
    return exists(s, path, watch, stat, 0);
}

int dlock__zk_get(dlock__zk_sess *s, const char *path, char **data, int *len, struct Stat *stat)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    NEW_OP(s, op, zh);
    rc = op_wait(op, zoo_aget(zh, path, 0, on_data, op));
    if (rc == ZOK) {
        *data = op->data;
        *len = op->len;
        op->data = NULL;
        if (stat != NULL)
            *stat = op->stat;
    }
    op_unref(op);
    return rc;
}

int dlock__zk_get_acl(dlock__zk_sess *s, const char *path, struct ACL_vector *acl)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    NEW_OP(s, op, zh);
    rc = op_wait(op, zoo_aget_acl(zh, path, on_acl, op));
    if (rc == ZOK) {
        *acl = op->acl;
        op->acl.count = 0;
        op->acl.data = NULL;
    }
    op_unref(op);
    return rc;
}

int dlock__zk_set(dlock__zk_sess *s, const char *path, const char *data, int len, int version)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    NEW_OP(s, op, zh);
    rc = op_wait(op, zoo_aset(zh, path, data, len, version, on_stat, op));
    op_unref(op);
    return rc;
}

/* ---- a renewal's round trip ------------------------------------------------ */

/* What the requests of dlock__zk_confirm share with their completions:
 * freed by the last of them, the caller being one. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, left;
    dlock__zk_sess *s;
    uint64_t gen;
    int64_t sent;
    int sync_rc;
    int *rcs;      /* one per exists */
    struct slot {
        void *batch;
        int i;     /* the exists' index, -1 for the sync */
    } *slots;
} confirm_t;

static void confirm_unref(confirm_t *b)
{
    int left;

    pthread_mutex_lock(&b->mu);
    left = --b->refs;
    pthread_mutex_unlock(&b->mu);
    if (left > 0)
        return;
    free(b->rcs);
    free(b->slots);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

static void confirm_done(struct slot *slot, int rc)
{
    confirm_t *b = slot->batch;

    note_reply(b->s, b->gen, b->sent, rc);
    pthread_mutex_lock(&b->mu);
    if (slot->i < 0)
        b->sync_rc = rc;
    else
        b->rcs[slot->i] = rc;
    if (--b->left == 0)
        pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    confirm_unref(b);
}

static void on_confirm_sync(int rc, const char *value, const void *data)
{
    (void)value;
    confirm_done((struct slot *)data, rc);
}

static void on_confirm_exists(int rc, const struct Stat *stat, const void *data)
{
    (void)stat;
    confirm_done((struct slot *)data, rc);
}

int dlock__zk_confirm(dlock__zk_sess *s, int sync, const char *const *paths, size_t n,
                      int *rcs)
{
    int64_t deadline = dlock__zk_mono_ms() + s->be->command_timeout_ms;
    zhandle_t *zh = handle_of(s);
    confirm_t *b;
    int rc = ZOK;

    if (zh == NULL)
        return ZINVALIDSTATE;
    if ((b = calloc(1, sizeof(*b))) == NULL)
        return ZSYSTEMERROR;
    b->rcs = calloc(n > 0 ? n : 1, sizeof(*b->rcs));
    b->slots = calloc(n + 1, sizeof(*b->slots));
    if (b->rcs == NULL || b->slots == NULL) {
        free(b->rcs);
        free(b->slots);
        free(b);
        return ZSYSTEMERROR;
    }
    pthread_mutex_init(&b->mu, NULL);
    dlock__zk_cond_init(&b->cv);
    b->s = s;
    b->sent = dlock__zk_now_ms();
    pthread_mutex_lock(&s->mu);
    b->gen = s->gen;
    pthread_mutex_unlock(&s->mu);
    b->sync_rc = ZOK;
    b->refs = 1;
    renewal_begin(s);
    /* Each request submitted is one more reference and one more reply to
     * wait for (counted before it is sent: its reply may come at once).
     * The sync goes last: its reply comes after every other's. */
    for (size_t i = 0; i <= n && rc == ZOK; i++) {
        struct slot *slot = &b->slots[i];
        int zrc;
        slot->batch = b;
        slot->i = i < n ? (int)i : -1;
        if (i == n && !sync)
            break;
        pthread_mutex_lock(&b->mu);
        b->refs++;
        b->left++;
        pthread_mutex_unlock(&b->mu);
        zrc = i < n ? zoo_aexists(zh, paths[i], 1, on_confirm_exists, slot)
                    : zoo_async(zh, "/", on_confirm_sync, slot);
        if (zrc != ZOK) {
            pthread_mutex_lock(&b->mu);
            b->refs--;
            b->left--;
            pthread_mutex_unlock(&b->mu);
            rc = zrc;
        }
    }
    pthread_mutex_lock(&b->mu);
    while (b->left > 0)
        if (dlock__zk_wait_until(&b->cv, &b->mu, deadline) == ETIMEDOUT)
            break;
    if (rc == ZOK && b->left > 0)
        rc = ZOPERATIONTIMEOUT;
    if (rc == ZOK && b->sync_rc != ZOK)
        rc = b->sync_rc;
    for (size_t i = 0; rc == ZOK && i < n; i++) {
        rcs[i] = b->rcs[i];
        if (rcs[i] != ZOK && rcs[i] != ZNONODE)
            rc = rcs[i];
    }
    pthread_mutex_unlock(&b->mu);
    renewal_end(s);
    confirm_unref(b);
    return rc;
}

int dlock__zk_check_create(dlock__zk_sess *s, const char *check, const char *path,
                           const char *data, int len, int flags)
{
    zhandle_t *zh;
    op_t *op;
    size_t plen = strlen(path) + 1;
    int rc;

    NEW_OP(s, op, zh);
    /* Everything the completion writes belongs to op, which outlives a
     * caller that gave up waiting: the results and the created path. */
    op->ops = calloc(2, sizeof(*op->ops));
    op->results = calloc(2, sizeof(*op->results));
    op->paths = calloc(2, sizeof(*op->paths));
    if (op->ops == NULL || op->results == NULL || op->paths == NULL ||
        (op->paths[0] = strdup(check)) == NULL || (op->paths[1] = malloc(plen)) == NULL) {
        op->n = 2;
        op_abandon(op);
        return ZSYSTEMERROR;
    }
    op->n = 2;
    zoo_check_op_init(&op->ops[0], op->paths[0], -1);
    zoo_create_op_init(&op->ops[1], path, data, len, acl_of(s->be), flags, op->paths[1],
                       (int)plen);
    rc = op_wait(op, zoo_amulti(zh, 2, op->ops, op->results, on_void, op));
    if (rc != ZOK && rc != ZOPERATIONTIMEOUT && op->results[0].err != ZOK &&
        op->results[0].err != ZRUNTIMEINCONSISTENCY)
        rc = op->results[0].err == ZBADVERSION ? ZNONODE : op->results[0].err;
    else if (rc != ZOK && rc != ZOPERATIONTIMEOUT && op->results[1].err != ZOK &&
             op->results[1].err != ZRUNTIMEINCONSISTENCY)
        rc = op->results[1].err;
    op_unref(op);
    return rc;
}

int dlock__zk_make_parents(dlock__zk_sess *s, const char *path)
{
    char *p = strdup(path), *slash;
    int rc = ZOK;

    if (p == NULL)
        return ZSYSTEMERROR;
    /* Each prefix ending before a '/' past the first. */
    for (slash = strchr(p + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        rc = dlock__zk_create(s, p, NULL, -1, ZOO_CONTAINER, NULL, NULL);
        *slash = '/';
        if (rc == ZNODEEXISTS)
            rc = ZOK;
        if (rc != ZOK)
            break;
    }
    free(p);
    return rc;
}
