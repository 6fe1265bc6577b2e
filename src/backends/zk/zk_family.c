/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family on ZooKeeper, laid out as Curator's recipes lay it out, so
 * that a dlock process and a Java process using the recipe on the same path
 * (prefix + NAME, "/dlock/NAME") exclude each other (docs/zookeeper.md, "The
 * family and Curator"):
 *
 *   read-write lock   InterProcessReadWriteLock: one EPHEMERAL_SEQUENTIAL
 *                     child of the lock's directory per acquisition,
 *                     "_c_<uuid>-__READ__<seq>" or "_c_<uuid>-__WRIT__<seq>",
 *                     ordered by sequence. A writer holds the lock when its
 *                     node is the first; a reader when no writer's node is
 *                     before its own. A waiting writer watches the node just
 *                     before its own, a waiting reader the first writer's.
 *   semaphore         InterProcessSemaphoreV2: NAME/locks holds a mutex
 *                     (InterProcessMutex's "_c_<uuid>-lock-<seq>") that an
 *                     acquirer holds while it creates its lease node
 *                     "_c_<uuid>-lease-<seq>" in NAME/leases and until the
 *                     children of NAME/leases are at most N; then it
 *                     releases the mutex and keeps the lease. N is the data
 *                     of NAME/leases, 4 bytes big-endian as Curator's
 *                     SharedCount writes it (so a Java process may read it
 *                     with a SharedCount on that path).
 *   leader election   LeaderLatch: "_c_<uuid>-latch-<seq>" children whose
 *                     data is the candidate's identity (Curator's
 *                     participant id); the first leads, the others watch the
 *                     node before theirs.
 *
 * The fence of each is the czxid of the acquisition's own node (the lease
 * node for a permit), as for the mutex: every create has a higher zxid than
 * all before it. Nodes are created with Curator's protection (the uuid is
 * the acquisition's token), so a create whose reply was lost is found again.
 *
 * A try-once leaves nothing behind when it finds the lock busy; a waiting
 * acquisition keeps its nodes in its watch between tries (its place in the
 * queue, and for the semaphore the mutex it holds while it waits for a
 * permit), and watch_end removes them unless it won.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zk_int.h"

#define RW_READ "__READ__"
#define RW_WRITE "__WRIT__"
/* Curator sorts read-write children by what follows the last "__READ__" or
 * "__WRIT__"; both end in "__", and no other "__" is in a protected name
 * ("_c_<uuid>-"), so sorting by what follows the last "__" is the same. */
#define RW_SORT "__"
#define LATCH_NAME "latch-"
#define LEASE_NAME "lease-"
#define SEM_LOCKS "locks"
#define SEM_LEASES "leases"
/* A watch of dlock_observe: kind is LEADER and extra is this marker's
 * state. */
#define OBSERVE_KIND (-1)

/* What a family acquisition keeps between tries (the watch's extra), or
 * for one try-once. */
typedef struct {
    uint64_t gen;      /* the session gen our nodes were made in */
    char *dir;         /* where our queue node lives: NAME, or NAME/leases */
    char *node;        /* our READ/WRIT/latch node, or our lease node */
    int maybe;         /* a create of node whose reply was lost */
    uint64_t czxid;    /* node's */
    char *locks;       /* semaphore: NAME/locks */
    char *lock;        /* semaphore: our node in NAME/locks */
    int lock_maybe;
    int have_lock;     /* semaphore: lock leads NAME/locks */
    int armed;         /* observe: the children watch is set */
} fam;

static void fam_free(void *arg)
{
    fam *f = arg;
    if (f == NULL)
        return;
    free(f->dir);
    free(f->node);
    free(f->locks);
    free(f->lock);
    free(f);
}

/* Forget nodes of an older session (they went with it). */
static void fam_gen(fam *f, uint64_t gen)
{
    if (f->gen == gen)
        return;
    free(f->node);
    free(f->lock);
    f->node = f->lock = NULL;
    f->maybe = f->lock_maybe = f->have_lock = 0;
    f->gen = gen;
}

static int oom(void)
{
    return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
}

/* Set up f for req: the directories. */
static int fam_init(fam *f, dlock__zk_be *be, const dlock_request *req, uint64_t gen)
{
    char *name_dir = dlock__zk_dir(be, req->name);

    memset(f, 0, sizeof(*f));
    f->gen = gen;
    if (name_dir == NULL)
        return oom();
    if (req->kind != DLOCK_KIND_SEMAPHORE) {
        f->dir = name_dir;
        return DLOCK_OK;
    }
    f->dir = dlock__zk_join(name_dir, SEM_LEASES);
    f->locks = dlock__zk_join(name_dir, SEM_LOCKS);
    free(name_dir);
    return f->dir != NULL && f->locks != NULL ? DLOCK_OK : oom();
}

/* Delete path (ZNONODE is fine); a failure sets the message. */
static int delete_node(dlock__zk_sess *s, const char *path)
{
    int rc = dlock__zk_delete(s, path, -1);
    return rc == ZOK || rc == ZNONODE ? DLOCK_OK : dlock__zk_fail(s, rc, "delete", path);
}

/* Remove whatever f queued (best effort: a failure leaves the ephemeral
 * nodes to the session, and their protection id to a later look). */
static void fam_leave(dlock__zk_sess *s, fam *f, const char *uuid)
{
    char *const *paths[2] = {&f->node, &f->lock};
    int *maybes[2] = {&f->maybe, &f->lock_maybe};
    const char *dirs[2] = {f->dir, f->locks};

    for (int i = 0; i < 2; i++) {
        if (*paths[i] == NULL && *maybes[i] && dirs[i] != NULL) {
            struct String_vector kids = {0, NULL};
            int at;
            if (dlock__zk_children(s, dirs[i], &kids) == ZOK &&
                (at = dlock__zk_find_protected(&kids, uuid)) >= 0) {
                char *p = dlock__zk_join(dirs[i], kids.data[at]);
                if (p != NULL)
                    dlock__zk_delete(s, p, -1);
                free(p);
            }
            deallocate_String_vector(&kids);
        } else if (*paths[i] != NULL) {
            dlock__zk_delete(s, *paths[i], -1);
        }
    }
    free(f->node);
    free(f->lock);
    f->node = f->lock = NULL;
    f->maybe = f->lock_maybe = f->have_lock = 0;
}

/* ---- the queue: one ordered directory ------------------------------------ */

/*
 * Who goes first in a queue of kind: the index of the node our node at
 * `at` must wait for, or -1 when ours holds. Writers, candidates and the
 * semaphore's mutex: the node just before ours. Readers: the first writer
 * before ours (Curator's read predicate).
 */
static int ahead_of(int kind, const struct String_vector *kids, int at)
{
    if (kind != DLOCK_KIND_READ)
        return at > 0 ? at - 1 : -1;
    for (int i = 0; i < at; i++)
        if (strstr(kids->data[i], RW_WRITE) != NULL)
            return i;
    return -1;
}

/*
 * One look at the queue in dir for our node *node (created if missing,
 * protected by uuid, as name_part with data): DLOCK_OK when it holds;
 * DLOCK_EBUSY with *retry_ms when it must wait: with w, the node ahead is
 * watched (INT64_MAX) or was gone already (0); without w, our node is
 * deleted again (-1). A node of ours that vanished (an operator, an
 * expired session) is created anew.
 */
static int queue_try(dlock__zk_sess *s, int kind, const char *dir, const char *uuid,
                     const char *name_part, const char *sort_name, const char *data, int len,
                     dlock__zk_watch *w, char **node, int *maybe, uint64_t *czxid,
                     int64_t *retry_ms)
{
    for (int round = 0; round < 3; round++) {
        struct String_vector kids = {0, NULL};
        struct Stat st;
        int rc, at, ahead;

        if (*node == NULL) {
            rc = dlock__zk_create_protected(s, dir, uuid, name_part, data, len,
                                            ZOO_EPHEMERAL_SEQUENTIAL, maybe, node, &st);
            if (rc != DLOCK_OK)
                return rc;
            *czxid = (uint64_t)st.czxid;
        }
        rc = dlock__zk_children(s, dir, &kids);
        if (rc != ZOK && rc != ZNONODE)
            return dlock__zk_fail(s, rc, "list", dir);
        dlock__zk_sort_children(&kids, sort_name);
        at = dlock__zk_find_protected(&kids, uuid);
        if (at < 0) {
            deallocate_String_vector(&kids);
            free(*node);
            *node = NULL;
            continue;
        }
        ahead = ahead_of(kind, &kids, at);
        if (ahead < 0) {
            deallocate_String_vector(&kids);
            return DLOCK_OK;
        }
        if (w == NULL) {
            deallocate_String_vector(&kids);
            rc = delete_node(s, *node);
            free(*node);
            *node = NULL;
            *retry_ms = -1;
            return rc != DLOCK_OK ? rc : DLOCK_EBUSY;
        }
        {
            char *path = dlock__zk_join(dir, kids.data[ahead]);
            deallocate_String_vector(&kids);
            if (path == NULL)
                return oom();
            rc = dlock__zk_watch_target(w, path);
            free(path);
        }
        if (rc < 0)
            return rc;
        *retry_ms = rc == 1 ? INT64_MAX : 0;
        return DLOCK_EBUSY;
    }
    *retry_ms = 0;
    return DLOCK_EBUSY;
}

/* ---- children watches ------------------------------------------------------ */

/*
 * Make w's next event come from dir: a change of its children or its data,
 * or its creation when it does not exist. 1 when set, or a dlock error.
 */
static int watch_dir(dlock__zk_watch *w, const char *dir)
{
    dlock__zk_sess *s = w->sess;
    char *copy = strdup(dir);
    int rc;

    if (copy == NULL)
        return oom();
    pthread_mutex_lock(&s->mu);
    dlock__zk_watch_retarget(w, copy);
    pthread_mutex_unlock(&s->mu);
    for (int round = 0; round < 3; round++) {
        struct String_vector kids = {0, NULL};
        /* exists sets a watch either way: data changes and deletion, or
         * creation; get-children adds the children's changes. */
        rc = dlock__zk_exists(s, dir, 1, NULL);
        if (rc == ZNONODE)
            return 1;
        if (rc != ZOK)
            return dlock__zk_fail(s, rc, "watch", dir);
        rc = dlock__zk_children_watch(s, dir, &kids);
        deallocate_String_vector(&kids);
        if (rc == ZOK)
            return 1;
        if (rc != ZNONODE)
            return dlock__zk_fail(s, rc, "watch", dir);
        /* deleted between the two: look again */
    }
    return 1;
}

/* ---- semaphore ------------------------------------------------------------- */

static void put_be32(char *out, int v)
{
    uint32_t u = (uint32_t)v;
    out[0] = (char)(u >> 24);
    out[1] = (char)(u >> 16);
    out[2] = (char)(u >> 8);
    out[3] = (char)u;
}

/* N of the semaphore whose leases live in leases: *n, or 0 when none is
 * stored (no directory, or one Curator made without a count). */
static int permits_get(dlock__zk_sess *s, const char *leases, int *n)
{
    char *data = NULL;
    int len = 0, rc = dlock__zk_get(s, leases, &data, &len, NULL);

    *n = 0;
    if (rc == ZNONODE)
        return DLOCK_OK;
    if (rc != ZOK)
        return dlock__zk_fail(s, rc, "read", leases);
    if (len == 4) {
        const unsigned char *u = (const unsigned char *)data;
        uint32_t v = (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
        *n = v > 0 && v <= 1000000 ? (int)v : 0;
    }
    free(data);
    return DLOCK_OK;
}

/* Store N in leases (created, with its parents, as containers when
 * missing, as the lease nodes' parents are): its data watchers wake. */
static int permits_set(dlock__zk_sess *s, const char *leases, int n)
{
    char data[4];
    int rc = ZNONODE;

    put_be32(data, n);
    for (int round = 0; round < 3; round++) {
        rc = dlock__zk_set(s, leases, data, 4, -1);
        if (rc != ZNONODE)
            break;
        rc = dlock__zk_make_parents(s, leases);
        if (rc == ZOK)
            rc = dlock__zk_create(s, leases, data, 4, ZOO_CONTAINER, NULL, NULL);
        if (rc != ZNODEEXISTS)
            break;
    }
    return rc == ZOK ? DLOCK_OK : dlock__zk_fail(s, rc, "set the permits of", leases);
}

/*
 * One try for a permit, InterProcessSemaphoreV2's way: hold NAME/locks,
 * create our lease, count the leases; at most N: release NAME/locks and
 * keep the lease. A waiter keeps both while the count is above N, watching
 * NAME/leases (its children, and its data: N).
 */
static int sem_try(dlock__zk_sess *s, const dlock_request *req, fam *f, const char *uuid,
                   dlock__zk_watch *w, const char *data, int len, int64_t *retry_ms)
{
    for (int round = 0; round < 3; round++) {
        struct String_vector kids = {0, NULL};
        struct Stat st;
        uint64_t lock_czxid = 0;
        int rc, n, count, mine;

        if (!f->have_lock) {
            rc = queue_try(s, DLOCK_KIND_MUTEX, f->locks, uuid, DLOCK__ZK_LOCK_NAME,
                           DLOCK__ZK_LOCK_NAME, NULL, -1, w, &f->lock, &f->lock_maybe,
                           &lock_czxid, retry_ms);
            if (rc != DLOCK_OK)
                return rc;
            f->have_lock = 1;
        }
        if ((rc = permits_get(s, f->dir, &n)) != DLOCK_OK)
            return rc;
        if (n == 0) {
            if (req->permits <= 0)
                return dlock_backend_fail(DLOCK_EINVAL, "zk %s: semaphore '%s' has no number "
                                          "of permits yet: set permits in the options",
                                          s->be->shown, req->name);
            if ((rc = permits_set(s, f->dir, req->permits)) != DLOCK_OK)
                return rc;
            n = req->permits;
        }
        if (f->node == NULL) {
            rc = dlock__zk_create_protected(s, f->dir, uuid, LEASE_NAME, data, len,
                                            ZOO_EPHEMERAL_SEQUENTIAL, &f->maybe, &f->node, &st);
            if (rc != DLOCK_OK)
                return rc;
            f->czxid = (uint64_t)st.czxid;
        }
        if (w != NULL) {
            int again;
            if ((rc = watch_dir(w, f->dir)) < 0)
                return rc;
            /* N again, now that the watch is set: a set_permits between
             * the first read and the watch would wake nobody (found by
             * family-zk.semaphore_permits_and_set_permits: a waiter slept
             * a minute after N was raised). */
            if ((rc = permits_get(s, f->dir, &again)) != DLOCK_OK)
                return rc;
            if (again > 0)
                n = again;
        }
        rc = dlock__zk_children(s, f->dir, &kids);
        if (rc != ZOK && rc != ZNONODE)
            return dlock__zk_fail(s, rc, "list", f->dir);
        count = kids.count;
        mine = dlock__zk_find_protected(&kids, uuid) >= 0;
        deallocate_String_vector(&kids);
        if (!mine) {
            /* Our lease vanished: make it again. */
            free(f->node);
            f->node = NULL;
            continue;
        }
        if (count <= n) {
            /* Kept on failure: watch_end or fam_leave deletes it. */
            if ((rc = delete_node(s, f->lock)) != DLOCK_OK)
                return rc;
            free(f->lock);
            f->lock = NULL;
            f->have_lock = 0;
            return DLOCK_OK;
        }
        if (w == NULL) {
            *retry_ms = -1;
            fam_leave(s, f, uuid);
            return DLOCK_EBUSY;
        }
        *retry_ms = INT64_MAX;
        return DLOCK_EBUSY;
    }
    *retry_ms = 0;
    return DLOCK_EBUSY;
}

/* ---- acquire --------------------------------------------------------------- */

static char *leader_data(const dlock_request *req, int *len)
{
    const char *id = req->identity != NULL ? req->identity : "";
    char *out = strdup(id);
    *len = (int)strlen(id);
    return out;
}

/* One try of kind READ, WRITE, SEMAPHORE or LEADER with f's state. */
static int fam_try(dlock__zk_be *be, dlock__zk_sess *s, uint64_t gen, const dlock_request *req,
                   fam *f, const char *uuid, dlock__zk_watch *w, dlock_acquire_result *out)
{
    char *data;
    int len = 0, rc;

    /* Curator's participant id is the whole data of a latch node: a
     * leader's node holds its identity only. */
    data = req->kind == DLOCK_KIND_LEADER ? leader_data(req, &len)
                                          : dlock__zk_node_data(req, req->lease_ms, &len);
    if (data == NULL)
        return oom();
    fam_gen(f, gen);
    if (req->kind == DLOCK_KIND_SEMAPHORE) {
        rc = sem_try(s, req, f, uuid, w, data, len, &out->retry_ms);
    } else {
        const char *part = req->kind == DLOCK_KIND_READ    ? RW_READ
                           : req->kind == DLOCK_KIND_WRITE ? RW_WRITE
                                                           : LATCH_NAME;
        const char *sort = req->kind == DLOCK_KIND_LEADER ? LATCH_NAME : RW_SORT;
        rc = queue_try(s, req->kind, f->dir, uuid, part, sort, data, len, w, &f->node,
                       &f->maybe, &f->czxid, &out->retry_ms);
    }
    free(data);
    if (rc != DLOCK_OK)
        return rc;
    if ((rc = dlock__zk_hold_add(be, req, s, gen, f->node, f->czxid)) != DLOCK_OK)
        return rc;
    out->fence = f->czxid;
    return DLOCK_OK;
}

int dlock__zk_family_acquire(dlock__zk_be *be, const dlock_request *req, dlock__zk_watch *w,
                             dlock_acquire_result *out)
{
    dlock__zk_sess *s;
    char uuid[DLOCK__ZK_UUID_LEN + 1];
    uint64_t gen;
    fam once;
    int rc;

    if (w != NULL) {
        if ((rc = dlock__zk_sess_ready(w->sess, &gen)) != DLOCK_OK)
            return rc;
        rc = fam_try(be, w->sess, gen, req, w->extra, w->uuid, w, out);
        if (rc == DLOCK_OK) {
            /* The holds table has the node now; our lock node is gone. */
            fam *f = w->extra;
            free(f->node);
            f->node = NULL;
            w->won = 1;
        }
        return rc;
    }
    if ((rc = dlock__zk_sess_for(be, req->lease_ms, &s, &gen)) != DLOCK_OK)
        return rc;
    dlock__zk_uuid(req->token, uuid);
    if ((rc = fam_init(&once, be, req, gen)) == DLOCK_OK) {
        rc = fam_try(be, s, gen, req, &once, uuid, NULL, out);
        if (rc != DLOCK_OK && rc != DLOCK_EBUSY)
            fam_leave(s, &once, uuid); /* a failed try leaves nothing either */
    }
    free(once.dir);
    free(once.node);
    free(once.locks);
    free(once.lock);
    return rc;
}

int dlock__zk_family_watch_begin(dlock__zk_watch *w, dlock__zk_be *be, const dlock_request *req)
{
    fam *f = calloc(1, sizeof(*f));
    int rc;

    if (f == NULL)
        return oom();
    if ((rc = fam_init(f, be, req, w->gen)) != DLOCK_OK) {
        fam_free(f);
        return rc;
    }
    w->extra = f;
    w->extra_free = fam_free;
    return DLOCK_OK;
}

void dlock__zk_family_watch_end(dlock__zk_watch *w)
{
    fam *f = w->extra;
    uint64_t gen = 0;

    if (f != NULL && w->kind != OBSERVE_KIND &&
        (f->node != NULL || f->maybe || f->lock != NULL || f->lock_maybe) &&
        dlock__zk_sess_ready(w->sess, &gen) == DLOCK_OK && gen == f->gen)
        fam_leave(w->sess, f, w->uuid);
    dlock__zk_watch_free(w);
}

/* ---- read-write: downgrade --------------------------------------------------- */

/*
 * Turn the write lock into a read lock with the same place in the queue:
 * create "_c_<uuid>-__READ__<S>" with S our write node's own sequence (a
 * plain, not sequential, create: the directory's counter is already past
 * S), then delete the write node. Both sort at S, before every other node,
 * so between the two steps we hold both sides and nobody can come in; a
 * writer queued behind us then waits for our read node, as Curator's
 * readers and writers order it.
 */
int dlock__zk_downgrade(void *arg, const dlock_request *req)
{
    dlock__zk_be *be = arg;
    dlock__zk_sess *s;
    uint64_t gen;
    char *node = NULL, *read = NULL, *data = NULL;
    const char *at;
    int rc, len = 0;

    if ((rc = dlock__zk_hold_find(be, req->token, &s, &gen, &node)) != DLOCK_OK)
        return rc;
    at = strstr(node, RW_WRITE);
    if (at == NULL) {
        free(node);
        return dlock_backend_fail(DLOCK_ELOST, "zk %s: lock '%s' is not a write lock",
                                  be->shown, req->name);
    }
    if (asprintf(&read, "%.*s" RW_READ "%s", (int)(at - node), node, at + strlen(RW_WRITE)) < 0 ||
        (data = dlock__zk_node_data(req, req->lease_ms, &len)) == NULL) {
        rc = oom();
        goto out;
    }
    rc = dlock__zk_create(s, read, data, len, ZOO_EPHEMERAL, NULL, NULL);
    if (rc == ZNONODE || rc == ZSESSIONEXPIRED) {
        rc = dlock_backend_fail(DLOCK_ELOST, "zk %s: lock '%s' is no longer ours", be->shown,
                                req->name);
        goto out;
    }
    if (rc != ZOK && rc != ZNODEEXISTS) { /* exists: an earlier try's reply was lost */
        rc = dlock__zk_fail(s, rc, "create", read);
        goto out;
    }
    if ((rc = dlock__zk_hold_move(be, req->token, read)) != DLOCK_OK)
        goto out;
    rc = delete_node(s, node);
out:
    free(node);
    free(read);
    free(data);
    return rc;
}

/* ---- semaphore: N ------------------------------------------------------------ */

int dlock__zk_set_permits(void *arg, const char *name, int permits)
{
    dlock__zk_be *be = arg;
    dlock__zk_sess *s;
    uint64_t gen;
    char *dir, *leases;
    int rc;

    if ((rc = dlock__zk_sess_for(be, 0, &s, &gen)) != DLOCK_OK)
        return rc;
    if ((dir = dlock__zk_dir(be, name)) == NULL)
        return oom();
    leases = dlock__zk_join(dir, SEM_LEASES);
    free(dir);
    if (leases == NULL)
        return oom();
    rc = permits_set(s, leases, permits);
    free(leases);
    return rc;
}

/* ---- leader election ----------------------------------------------------------- */

int dlock__zk_leader_get(void *arg, const char *name, dlock_leader_info *out)
{
    dlock__zk_be *be = arg;
    struct String_vector kids = {0, NULL};
    dlock__zk_sess *s;
    uint64_t gen;
    char *dir;
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = dlock__zk_sess_for(be, 0, &s, &gen)) != DLOCK_OK)
        return rc;
    if ((dir = dlock__zk_dir(be, name)) == NULL)
        return oom();
    rc = dlock__zk_children(s, dir, &kids);
    if (rc == ZNONODE) {
        free(dir);
        return DLOCK_OK;
    }
    if (rc != ZOK) {
        rc = dlock__zk_fail(s, rc, "list", dir);
        free(dir);
        return rc;
    }
    dlock__zk_sort_children(&kids, LATCH_NAME);
    rc = DLOCK_OK;
    /* As Curator's getLeader: the first latch node that is still there. */
    for (int i = 0; i < kids.count && !out->held; i++) {
        char *path, *data = NULL;
        struct Stat st;
        int len = 0, zrc;
        if (strstr(kids.data[i], LATCH_NAME) == NULL)
            continue;
        if ((path = dlock__zk_join(dir, kids.data[i])) == NULL) {
            rc = oom();
            break;
        }
        zrc = dlock__zk_get(s, path, &data, &len, &st);
        free(path);
        if (zrc == ZNONODE)
            continue;
        if (zrc != ZOK) {
            rc = dlock__zk_fail(s, zrc, "read", dir);
            break;
        }
        out->held = 1;
        out->fence = (uint64_t)st.czxid;
        /* The node lives as long as its session: its deletion is
         * announced (the observer's watch), there is no lease to count. */
        out->ttl_ms = -1;
        snprintf(out->identity, sizeof(out->identity), "%.*s",
                 len < DLOCK_IDENTITY_MAX ? len : DLOCK_IDENTITY_MAX, data);
        free(data);
    }
    deallocate_String_vector(&kids);
    free(dir);
    return rc;
}

int dlock__zk_observe_begin(void *arg, const char *name, void **watch)
{
    dlock__zk_be *be = arg;
    dlock__zk_sess *s;
    dlock__zk_watch *w;
    uint64_t gen;
    fam *f;
    int rc;

    if ((rc = dlock__zk_sess_for(be, 0, &s, &gen)) != DLOCK_OK)
        return rc;
    if ((rc = dlock__zk_watch_new(s, &w)) != DLOCK_OK)
        return rc;
    w->kind = OBSERVE_KIND;
    w->gen = gen;
    if ((f = calloc(1, sizeof(*f))) == NULL || (f->dir = dlock__zk_dir(be, name)) == NULL) {
        free(f);
        dlock__zk_watch_free(w);
        return oom();
    }
    w->extra = f;
    w->extra_free = fam_free;
    /* Set before the observer's first read, so that no change after it is
     * missed. */
    if ((rc = watch_dir(w, f->dir)) < 0) {
        dlock__zk_watch_free(w);
        return rc;
    }
    f->armed = 1;
    *watch = w;
    return DLOCK_OK;
}

/*
 * The observer's wait: ZooKeeper's watches fire once, so after an event the
 * watch is set again before returning, and the observer's next read sees
 * every change after it. A watch that could not be set (no connection) is
 * set at the next wait.
 */
int dlock__zk_observe_wait(dlock__zk_watch *w, int64_t timeout_ms)
{
    fam *f = w->extra;
    int rc;

    if (!f->armed && watch_dir(w, f->dir) == 1)
        f->armed = 1;
    rc = dlock__zk_watch_sleep(w, timeout_ms);
    if (rc == DLOCK_OK)
        f->armed = watch_dir(w, f->dir) == 1;
    return rc;
}

int dlock__zk_is_observe(const dlock__zk_watch *w)
{
    return w->kind == OBSERVE_KIND;
}
