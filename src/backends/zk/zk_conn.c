/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Sessions and calls. The multithreaded C client runs an I/O thread and a
 * completion thread per handle; its synchronous calls have no timeout of
 * their own, so every call here is the asynchronous one, waited for at most
 * the client's command timeout. A call whose wait ran out leaves its
 * completion to free what it shares (a reference count).
 *
 * The handle's watcher (the session's context) follows the session's state
 * and wakes the watches: a node event wakes those that target its path, a
 * change of the session's state wakes them all (a reason to look again).
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zk_int.h"

int64_t dlock__zk_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t dlock__zk_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* pthread_cond_timedwait until the CLOCK_MONOTONIC time deadline_ms. */
static int wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ms)
{
    struct timespec ts;
    ts.tv_sec = deadline_ms / 1000;
    ts.tv_nsec = (long)(deadline_ms % 1000) * 1000000;
    return pthread_cond_timedwait(cv, mu, &ts);
}

static void cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}

/* The C client logs to stderr by default; a library must not, unless
 * DLOCK_ZK_LOG is set (for debugging). */
static void quiet_log(const char *message)
{
    (void)message;
}

static void stderr_log(const char *message)
{
    fprintf(stderr, "zookeeper: %s\n", message);
}

/* ---- session state ------------------------------------------------------ */

static void wake_all(dlock__zk_sess *s)
{
    for (dlock__zk_watch *w = s->watches; w != NULL; w = w->next) {
        w->fired = 1;
        pthread_cond_signal(&w->cv);
    }
}

static void session_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    dlock__zk_sess *s = ctx;

    pthread_mutex_lock(&s->mu);
    if (zh != s->zh) {
        pthread_mutex_unlock(&s->mu);
        return; /* an older handle, being closed */
    }
    if (type == ZOO_SESSION_EVENT) {
        if (state == ZOO_CONNECTED_STATE) {
            const clientid_t *id = zoo_client_id(zh);
            s->connected = 1;
            s->session_id = id != NULL ? id->client_id : 0;
            s->timeout_ms = zoo_recv_timeout(zh);
            s->last_contact_ms = dlock__zk_now_ms();
        } else if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
            s->connected = 0;
            s->expired = 1;
            s->auth_failed |= state == ZOO_AUTH_FAILED_STATE;
        } else {
            s->connected = 0;
        }
        wake_all(s);
    } else if (path != NULL) {
        for (dlock__zk_watch *w = s->watches; w != NULL; w = w->next)
            if (w->target != NULL && strcmp(w->target, path) == 0) {
                w->fired = 1;
                pthread_cond_signal(&w->cv);
            }
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void dlock__zk_sess_init(dlock__zk_sess *s, dlock__zk_be *be, int64_t want_ms)
{
    memset(s, 0, sizeof(*s));
    s->be = be;
    s->want_ms = want_ms;
    pthread_mutex_init(&s->mu, NULL);
    cond_init(&s->cv);
}

void dlock__zk_sess_close(dlock__zk_sess *s)
{
    zhandle_t *zh;

    pthread_mutex_lock(&s->mu);
    zh = s->zh;
    s->zh = NULL;
    s->connected = 0;
    pthread_mutex_unlock(&s->mu);
    /* Closing ends the session on the server: its ephemeral nodes go at
     * once. Callbacks of zh see s->zh != zh and return. */
    if (zh != NULL)
        zookeeper_close(zh);
}

/* ---- the calls ------------------------------------------------------------ */

/* What a call and its completion share. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs, done, rc;
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

static op_t *op_new(dlock__zk_sess *s)
{
    op_t *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return NULL;
    pthread_mutex_init(&op->mu, NULL);
    cond_init(&op->cv);
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

/* The completion's end: a reply came (rc from the server or the client). */
static void op_done(op_t *op, int rc)
{
    if (rc != ZCONNECTIONLOSS && rc != ZOPERATIONTIMEOUT && rc != ZSESSIONEXPIRED &&
        rc != ZCLOSING && rc != ZINVALIDSTATE && rc != ZSESSIONMOVED) {
        /* The server answered: it heard from the session at op->sent or
         * later. */
        pthread_mutex_lock(&op->s->mu);
        if (op->gen == op->s->gen && op->sent > op->s->last_contact_ms)
            op->s->last_contact_ms = op->sent;
        pthread_mutex_unlock(&op->s->mu);
    } else if (rc == ZSESSIONEXPIRED) {
        /* Only for the session it was sent in: a newer one is not. */
        pthread_mutex_lock(&op->s->mu);
        if (op->gen == op->s->gen) {
            op->s->expired = 1;
            pthread_cond_broadcast(&op->s->cv);
        }
        pthread_mutex_unlock(&op->s->mu);
    }
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
    int64_t deadline = dlock__zk_mono_ms() + op->s->be->command_timeout_ms;
    int rc;

    if (submitted != ZOK) {
        /* Never sent: the completion will not run. */
        op->refs--;
        return submitted;
    }
    pthread_mutex_lock(&op->mu);
    while (!op->done)
        if (wait_until(&op->cv, &op->mu, deadline) == ETIMEDOUT)
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

#define NEW_OP(s, op, zh)                                                                          \
    do {                                                                                           \
        if (((zh) = handle_of(s)) == NULL)                                                         \
            return ZINVALIDSTATE;                                                                  \
        if (((op) = op_new(s)) == NULL)                                                            \
            return ZSYSTEMERROR;                                                                   \
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

static int children(dlock__zk_sess *s, const char *path, int watch, struct String_vector *out)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    NEW_OP(s, op, zh);
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
    return children(s, path, 0, out);
}

int dlock__zk_children_watch(dlock__zk_sess *s, const char *path, struct String_vector *out)
{
    return children(s, path, 1, out);
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

int dlock__zk_exists(dlock__zk_sess *s, const char *path, int watch, struct Stat *stat)
{
    zhandle_t *zh;
    op_t *op;
    int rc;

    NEW_OP(s, op, zh);
    rc = op_wait(op, zoo_aexists(zh, path, watch, on_stat, op));
    if (rc == ZOK && stat != NULL)
        *stat = op->stat;
    op_unref(op);
    return rc;
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

/* One multi of check ops over paths[0..n) that have ok[i] == -1 still. */
static int check_round(dlock__zk_sess *s, const char *const *paths, size_t n, int *ok, int *again)
{
    zhandle_t *zh;
    op_t *op;
    size_t m = 0, *idx;
    int rc;

    *again = 0;
    if ((idx = calloc(n, sizeof(*idx))) == NULL)
        return ZSYSTEMERROR;
    for (size_t i = 0; i < n; i++)
        if (ok[i] < 0)
            idx[m++] = i;
    if (m == 0) {
        free(idx);
        return ZOK;
    }
    if ((zh = handle_of(s)) == NULL || (op = op_new(s)) == NULL) {
        free(idx);
        return zh == NULL ? ZINVALIDSTATE : ZSYSTEMERROR;
    }
    op->ops = calloc(m, sizeof(*op->ops));
    op->results = calloc(m, sizeof(*op->results));
    op->paths = calloc(m, sizeof(*op->paths));
    if (op->ops == NULL || op->results == NULL || op->paths == NULL) {
        op->refs = 1;
        op_unref(op);
        free(idx);
        return ZSYSTEMERROR;
    }
    for (size_t j = 0; j < m; j++) {
        if ((op->paths[j] = strdup(paths[idx[j]])) == NULL) {
            op->n = j;
            op->refs = 1;
            op_unref(op);
            free(idx);
            return ZSYSTEMERROR;
        }
        zoo_check_op_init(&op->ops[j], op->paths[j], -1);
    }
    op->n = m;
    rc = op_wait(op, zoo_amulti(zh, (int)m, op->ops, op->results, on_void, op));
    if (rc == ZOK) {
        for (size_t j = 0; j < m; j++)
            ok[idx[j]] = 1;
    } else if (rc == ZNONODE || rc == ZBADVERSION) {
        /* The multi stops at the first missing node: it is gone, those
         * before it exist, those after it are not known yet. */
        int found = 0;
        for (size_t j = 0; j < m; j++) {
            int err = op->results[j].err;
            if (!found && err == ZOK) {
                ok[idx[j]] = 1;
            } else if (!found && err != ZRUNTIMEINCONSISTENCY) {
                ok[idx[j]] = 0;
                found = 1;
            }
        }
        if (!found) /* no op named: the first unknown is the culprit */
            for (size_t j = 0; j < m; j++)
                if (ok[idx[j]] < 0) {
                    ok[idx[j]] = 0;
                    break;
                }
        *again = 1;
        rc = ZOK;
    }
    op_unref(op);
    free(idx);
    return rc;
}

int dlock__zk_check_many(dlock__zk_sess *s, const char *const *paths, size_t n, int *ok)
{
    int rc, again = 1;

    for (size_t i = 0; i < n; i++)
        ok[i] = -1;
    while (again)
        if ((rc = check_round(s, paths, n, ok, &again)) != ZOK)
            return rc;
    return ZOK;
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
        op->refs = 1;
        op_unref(op);
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

/* ---- ACLs ---------------------------------------------------------------- */

#define ACL_MAX 16 /* acl= entries */

/* ZooKeeper's perms letters (zkCli's setAcl): each once. -1 if not. */
static int perms_of(const char *p)
{
    int perms = 0;

    if (*p == '\0')
        return -1;
    for (; *p != '\0'; p++) {
        const char *letters = "rwcda", *at = strchr(letters, *p);
        const int bits[] = {ZOO_PERM_READ, ZOO_PERM_WRITE, ZOO_PERM_CREATE, ZOO_PERM_DELETE,
                            ZOO_PERM_ADMIN};
        if (at == NULL || (perms & bits[at - letters]) != 0)
            return -1;
        perms |= bits[at - letters];
    }
    return perms;
}

/* A digest id: USER:HASH, HASH the 28-character base64 of a SHA-1. */
static int digest_id_ok(const char *id)
{
    const char *colon = strchr(id, ':');

    if (colon == NULL || colon == id || strlen(colon + 1) != 28 || colon[28] != '=')
        return 0;
    for (const char *c = colon + 1; c < colon + 28; c++)
        if (!isalnum((unsigned char)*c) && *c != '+' && *c != '/')
            return 0;
    return 1;
}

/* An ip id: an address, or ADDRESS/BITS. */
static int ip_id_ok(const char *id)
{
    return *id != '\0' && strspn(id, "0123456789abcdefABCDEF.:/") == strlen(id);
}

/* One acl= entry (n: its number, for messages) into *out. The messages
 * never show a digest's hash. */
static int acl_entry(const char *entry, int n, const char *url, struct ACL *out)
{
    const char *first = strchr(entry, ':'), *last = strrchr(entry, ':');
    char *scheme, *id;
    int perms;

    if (first == NULL || first == entry || last == first || last[1] == '\0')
        return dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl entry %d must be "
                                  "SCHEME:ID:PERMS, as zkCli's setAcl takes it "
                                  "(world:anyone:r, digest:USER:HASH:cdrwa, ip:10.0.0.0/8:r)",
                                  url, n);
    scheme = strndup(entry, (size_t)(first - entry));
    id = strndup(first + 1, (size_t)(last - first - 1));
    if (scheme == NULL || id == NULL) {
        free(scheme);
        free(id);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    perms = perms_of(last + 1);
    if (strcmp(scheme, "world") != 0 && strcmp(scheme, "digest") != 0 &&
        strcmp(scheme, "ip") != 0)
        perms = dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl entry %d: unknown scheme "
                                   "'%.32s' (world, digest or ip)", url, n, scheme);
    else if (perms < 0)
        perms = dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl entry %d (%s): perms "
                                   "'%.16s' must be one or more of the letters r, w, c, d, a, "
                                   "each once", url, n, scheme, last + 1);
    else if (strcmp(scheme, "world") == 0 && strcmp(id, "anyone") != 0)
        perms = dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl entry %d (world): world's "
                                   "only id is 'anyone'", url, n);
    else if (strcmp(scheme, "world") == 0 && perms != ZOO_PERM_READ)
        perms = dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl entry %d "
                                   "(world:anyone:%.16s): world may only read (perms r): with "
                                   "more, anyone who can reach the ensemble could break the "
                                   "locks", url, n, last + 1);
    else if (strcmp(scheme, "digest") == 0 && !digest_id_ok(id))
        perms = dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl entry %d (digest): the id "
                                   "must be USER:HASH, HASH being the 28-character base64 "
                                   "SHA-1 of USER:PASSWORD (zkCli's DigestAuthenticationProvider "
                                   "prints it)", url, n);
    else if (strcmp(scheme, "ip") == 0 && !ip_id_ok(id))
        perms = dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl entry %d (ip): '%.64s' is "
                                   "not an ADDRESS or ADDRESS/BITS", url, n, id);
    if (perms < 0) {
        free(scheme);
        free(id);
        return perms;
    }
    out->perms = perms;
    out->id.scheme = scheme;
    out->id.id = id;
    return DLOCK_OK;
}

int dlock__zk_acl_init(dlock__zk_be *be, const char *spec, const char *url)
{
    char *copy, *save = NULL, *entry;
    int rc = DLOCK_OK, n = 0;

    if (be->auth == NULL) {
        if (spec == NULL)
            return DLOCK_OK; /* open: anyone who reaches the ensemble (docs/zookeeper.md) */
        return dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl= needs user:password@ (the "
                                  "nodes' creator is the identity that keeps every right; "
                                  "without credentials every node is open to anyone)", url);
    }
    if ((be->acl.data = calloc(ACL_MAX + 1, sizeof(*be->acl.data))) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    /* First the creator: ZooKeeper's "auth" scheme stands for the digest
     * identity of the session that creates the node. */
    be->acl.data[0].perms = ZOO_PERM_ALL;
    be->acl.data[0].id.scheme = strdup("auth");
    be->acl.data[0].id.id = strdup("");
    be->acl.count = 1;
    if (be->acl.data[0].id.scheme == NULL || be->acl.data[0].id.id == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    if (spec == NULL)
        return DLOCK_OK;
    if ((copy = strdup(spec)) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    /* strsep, not strtok: an empty entry is an error, not skipped. */
    save = copy;
    while (rc == DLOCK_OK && (entry = strsep(&save, ",")) != NULL) {
        if (++n > ACL_MAX)
            rc = dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': acl= has more than %d entries",
                                    url, ACL_MAX);
        else if ((rc = acl_entry(entry, n, url, &be->acl.data[be->acl.count])) == DLOCK_OK)
            be->acl.count++;
    }
    free(copy);
    return rc;
}

void dlock__zk_acl_free(dlock__zk_be *be)
{
    for (int i = 0; be->acl.data != NULL && i <= ACL_MAX; i++) {
        free(be->acl.data[i].id.scheme);
        free(be->acl.data[i].id.id);
    }
    free(be->acl.data);
    be->acl.data = NULL;
    be->acl.count = 0;
}

/* ---- errors ---------------------------------------------------------------- */

int dlock__zk_fail(dlock__zk_sess *s, int zrc, const char *what, const char *path)
{
    const char *shown = s->be->shown;

    switch (zrc) {
    case ZOPERATIONTIMEOUT:
        return dlock_backend_fail(DLOCK_ECONN, "zk %s: %s %s: no reply within %lld ms", shown,
                                  what, path, (long long)s->be->command_timeout_ms);
    case ZCONNECTIONLOSS:
    case ZCLOSING:
    case ZINVALIDSTATE:
    case ZSESSIONMOVED:
        return dlock_backend_fail(DLOCK_ECONN, "zk %s: %s %s: %s", shown, what, path,
                                  zerror(zrc));
    case ZSESSIONEXPIRED: /* the completion marked the session expired */
        return dlock_backend_fail(DLOCK_ECONN, "zk %s: %s %s: session expired", shown, what,
                                  path);
    case ZNOAUTH:
    case ZAUTHFAILED:
        return dlock_backend_fail(DLOCK_EAUTH, "zk %s: %s %s: %s (check user:password@ and "
                                  "the ACL)", shown, what, path, zerror(zrc));
    case ZBADARGUMENTS:
        return dlock_backend_fail(DLOCK_EINVAL, "zk %s: %s %s: bad arguments (a path "
                                  "ZooKeeper refuses?)", shown, what, path);
    case ZSYSTEMERROR:
        return dlock_backend_fail(DLOCK_ENOMEM, "zk %s: %s %s: out of memory", shown, what,
                                  path);
    default:
        return dlock_backend_fail(DLOCK_ESERVER, "zk %s: %s %s: %s", shown, what, path,
                                  zerror(zrc));
    }
}

/* ---- opening and keeping sessions ----------------------------------------- */

/* The digest auth's answer, for the handle s has now (an older one's
 * threads are joined before a new one opens). */
static void on_auth(int rc, const void *data)
{
    dlock__zk_sess *s = (dlock__zk_sess *)data;

    pthread_mutex_lock(&s->mu);
    if (rc == ZOK)
        s->authed = 1;
    else if (rc == ZAUTHFAILED)
        s->auth_failed = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/*
 * Open a new handle in s (s->mu held; released while the library starts
 * its threads is not needed: zookeeper_init does not call back before it
 * returns the handle we store under the lock).
 */
static int open_handle(dlock__zk_sess *s)
{
    zhandle_t *zh;

    errno = 0;
    zh = zookeeper_init2(s->be->hosts, session_watcher, (int)s->want_ms, NULL, s, 0,
                         getenv("DLOCK_ZK_LOG") != NULL ? stderr_log : quiet_log);
    if (zh == NULL)
        return dlock_backend_fail(errno == EINVAL ? DLOCK_EINVAL : DLOCK_ECONN,
                                  "zk %s: cannot start a session: %s", s->be->shown,
                                  errno != 0 ? strerror(errno) : "zookeeper_init failed");
    s->zh = zh;
    s->gen++;
    s->connected = 0;
    s->expired = 0;
    s->session_id = 0;
    s->authed = s->be->auth == NULL;
    s->auth_failed = 0;
    /* Given before the connection is up, the client sends the auth first
     * thing on every connection of the session, ahead of any request: no
     * call of ours goes out unauthenticated, so none is refused the ACL. */
    if (s->be->auth != NULL &&
        zoo_add_auth(zh, "digest", s->be->auth, (int)strlen(s->be->auth), on_auth, s) != ZOK)
        return dlock_backend_fail(DLOCK_ECONN, "zk %s: cannot send the digest "
                                  "authentication", s->be->shown);
    return DLOCK_OK;
}

static int sess_ready_once(dlock__zk_sess *s, uint64_t *gen, int *fresh_expired);

int dlock__zk_sess_ready(dlock__zk_sess *s, uint64_t *gen)
{
    int fresh_expired = 0;
    int rc = sess_ready_once(s, gen, &fresh_expired);

    /* A session that expired as it was made (the server had just resumed
     * and expired the one before): once more. */
    if (fresh_expired)
        rc = sess_ready_once(s, gen, &fresh_expired);
    return rc;
}

static int sess_ready_once(dlock__zk_sess *s, uint64_t *gen, int *fresh_expired)
{
    dlock__zk_be *be = s->be;
    int64_t deadline = dlock__zk_mono_ms() + be->connect_timeout_ms;
    zhandle_t *old = NULL;
    int rc = DLOCK_OK, fresh = 0;

    pthread_mutex_lock(&s->mu);
    if (s->zh != NULL && s->expired) {
        old = s->zh;
        s->zh = NULL;
    }
    if (s->zh == NULL) {
        if (old != NULL) {
            /* Close the expired handle without the lock (its threads may
             * be waiting for it). */
            pthread_mutex_unlock(&s->mu);
            zookeeper_close(old);
            pthread_mutex_lock(&s->mu);
        }
        if (s->zh == NULL) {
            rc = open_handle(s);
            fresh = rc == DLOCK_OK;
        }
    }
    while (rc == DLOCK_OK && !(s->connected && s->authed) && !s->expired && !s->auth_failed)
        if (wait_until(&s->cv, &s->mu, deadline) == ETIMEDOUT)
            break;
    if (rc == DLOCK_OK && s->auth_failed)
        rc = dlock_backend_fail(DLOCK_EAUTH, "zk %s: digest authentication refused",
                                be->shown);
    else if (rc == DLOCK_OK && s->expired) {
        *fresh_expired = 1;
        rc = dlock_backend_fail(DLOCK_ECONN, "zk %s: session expired while connecting",
                                be->shown);
    }
    else if (rc == DLOCK_OK && !s->connected)
        rc = dlock_backend_fail(DLOCK_ECONN, "zk %s: not connected within %lld ms", be->shown,
                                (long long)be->connect_timeout_ms);
    else if (rc == DLOCK_OK && !s->authed)
        rc = dlock_backend_fail(DLOCK_ECONN, "zk %s: no answer to the digest authentication "
                                "within %lld ms", be->shown, (long long)be->connect_timeout_ms);
    if (gen != NULL)
        *gen = s->gen;
    pthread_mutex_unlock(&s->mu);
    if (rc == DLOCK_OK && fresh && be->log != NULL && s->gen > 1) {
        char msg[256];
        snprintf(msg, sizeof(msg), "zk %s: new session after the last one expired",
                 be->shown);
        be->log(DLOCK_LOG_INFO, msg, be->log_payload);
    }
    return rc;
}

int dlock__zk_sess_alive(dlock__zk_sess *s, uint64_t gen)
{
    int alive;

    pthread_mutex_lock(&s->mu);
    /* Connected or not: the server promised nothing past the last
     * contact + the timeout (after a stall the client may still believe
     * it is connected). A held lock's renewals keep last contact within
     * a third of its lease, and its lease within the timeout. */
    alive = s->zh != NULL && s->gen == gen && !s->expired &&
            dlock__zk_now_ms() < s->last_contact_ms + s->timeout_ms;
    pthread_mutex_unlock(&s->mu);
    return alive;
}

int dlock__zk_sess_open(dlock__zk_sess *s, uint64_t gen)
{
    int open;

    pthread_mutex_lock(&s->mu);
    open = s->zh != NULL && s->gen == gen && !s->expired;
    pthread_mutex_unlock(&s->mu);
    return open;
}

int dlock__zk_sess_for(dlock__zk_be *be, int64_t lease_ms, dlock__zk_sess **out, uint64_t *gen)
{
    int rc;

    for (int i = 0; i < 2; i++) {
        dlock__zk_sess *s = &be->sess[i];
        int64_t timeout;
        if ((rc = dlock__zk_sess_ready(s, gen)) != DLOCK_OK)
            return rc;
        pthread_mutex_lock(&s->mu);
        timeout = s->timeout_ms;
        pthread_mutex_unlock(&s->mu);
        if (lease_ms <= timeout) {
            *out = s;
            return DLOCK_OK;
        }
        if (i == 1)
            return dlock_backend_fail(DLOCK_EINVAL, "zk %s: lease_ms %lld is longer than the "
                                      "longest session the server grants (%lld ms: raise "
                                      "maxSessionTimeout in zoo.cfg, or use a shorter lease)",
                                      be->shown, (long long)lease_ms, (long long)timeout);
    }
    return DLOCK_EINVAL;
}
