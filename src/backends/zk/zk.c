/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The ZooKeeper backend (docs/zookeeper.md), a loadable module:
 *
 *   zk://[user:password@]h1:2181,h2:2181,h3:2181[/chroot][?session_timeout_ms=N]
 *
 * A lock NAME is the directory /dlock/NAME (the key prefix "dlock/" under
 * the chroot); each acquisition one EPHEMERAL_SEQUENTIAL child named as
 * Curator's InterProcessMutex names it (zk_lock.c), so dlock and Curator
 * processes exclude each other. The fence is the holder node's czxid.
 *
 * The lease. ZooKeeper keeps an ephemeral node as long as the session that
 * made it: until the server has not heard from the client for the session
 * timeout. The core counts a lease of lease_ms from the send time of the
 * last renewal that succeeded; a renewal here is one multi request that
 * checks every renewed node exists, which proves to the server that the
 * session is alive at that time, so the server keeps the nodes at least
 * until then + the session timeout. For the core's count never to outlive
 * that, a lock lives in a session whose timeout is at least its lease: the
 * short session (session_timeout_ms, default 10 s) for leases up to it, a
 * long one (the longest timeout the server grants) for longer leases. And
 * so that a live holder that stops renewing (auto_renew off) frees the lock
 * when its lease ends, as on the other backends, a reaper thread deletes
 * the node of a hold whose lease ran out unrenewed.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zk_int.h"

#define DEFAULT_SESSION_MS 10000
/* What the long session asks for: the server grants at most its
 * maxSessionTimeout (20 ticks, 40 s, by default). */
#define LONG_SESSION_MS (24 * 3600 * 1000)

/* ---- holds ---------------------------------------------------------------- */

typedef struct dlock__zk_hold {
    struct dlock__zk_hold *next;
    char *token;
    char *node;
    dlock__zk_sess *sess;
    uint64_t gen;
    uint64_t czxid;
    int64_t lease_ms;
    int64_t expires_ms; /* CLOCK_BOOTTIME: the reaper deletes the node then */
    /* An orphan: a node that may exist in a live session but that nobody
     * will release (a create whose reply was lost, a leave or release that
     * could not reach the server). The reaper deletes it (finding it by its
     * protection id when node is NULL), once a second until it succeeds or
     * the session is gone. */
    int orphan;
    char *dir;
    char uuid[DLOCK__ZK_UUID_LEN + 1];
} hold_t;

static void hold_free(hold_t *h)
{
    if (h == NULL)
        return;
    free(h->token);
    free(h->node);
    free(h->dir);
    free(h);
}

#define ORPHAN_RETRY_MS 1000

/* be->mu held. */
static hold_t *hold_find(dlock__zk_be *be, const char *token)
{
    for (hold_t *h = be->holds; h != NULL; h = h->next)
        if (strcmp(h->token, token) == 0)
            return h;
    return NULL;
}

/* Take the hold of token out of the table (NULL if none). */
static hold_t *hold_take(dlock__zk_be *be, const char *token)
{
    hold_t *h = NULL;

    pthread_mutex_lock(&be->mu);
    for (hold_t **p = &be->holds; *p != NULL; p = &(*p)->next)
        if (strcmp((*p)->token, token) == 0) {
            h = *p;
            *p = h->next;
            break;
        }
    pthread_mutex_unlock(&be->mu);
    return h;
}

/* A copy of token's hold (node and session), for a call without be->mu. */
static int hold_copy(dlock__zk_be *be, const char *token, hold_t *out)
{
    hold_t *h;
    int found = 0;

    memset(out, 0, sizeof(*out));
    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, token)) != NULL && !h->orphan && h->node != NULL &&
        (out->node = strdup(h->node)) != NULL) {
        out->sess = h->sess;
        out->gen = h->gen;
        out->czxid = h->czxid;
        out->lease_ms = h->lease_ms;
        out->expires_ms = h->expires_ms;
        found = 1;
    }
    pthread_mutex_unlock(&be->mu);
    return found;
}

/* The lease of token's hold runs lease_ms from now (a renewal that was
 * sent at sent_ms succeeded: count from its reply, which is later). */
static void hold_touch(dlock__zk_be *be, const char *token, int64_t lease_ms)
{
    hold_t *h;

    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, token)) != NULL && !h->orphan) {
        h->lease_ms = lease_ms;
        h->expires_ms = dlock__zk_now_ms() + lease_ms;
        pthread_cond_signal(&be->reap_cv);
    }
    pthread_mutex_unlock(&be->mu);
}

/* Delete h's node (found by its protection id if not known). 1 done (or
 * nothing to delete), 0 when the server could not be reached. */
static int reap(hold_t *h)
{
    int rc;

    if (h->node == NULL && h->dir != NULL) {
        struct String_vector kids = {0, NULL};
        int i;
        rc = dlock__zk_children(h->sess, h->dir, &kids);
        if (rc == ZNONODE)
            return 1;
        if (rc != ZOK)
            return rc != ZCONNECTIONLOSS && rc != ZOPERATIONTIMEOUT && rc != ZINVALIDSTATE;
        i = dlock__zk_find_protected(&kids, h->uuid);
        if (i >= 0)
            h->node = dlock__zk_join(h->dir, kids.data[i]);
        deallocate_String_vector(&kids);
        if (h->node == NULL)
            return 1;
    }
    if (h->node == NULL)
        return 1;
    rc = dlock__zk_delete(h->sess, h->node, -1);
    return rc != ZCONNECTIONLOSS && rc != ZOPERATIONTIMEOUT && rc != ZINVALIDSTATE;
}

/*
 * The reaper: deletes the node of each hold whose lease ran out without a
 * renewal (auto_renew off, or renewals that failed), so that a live holder
 * frees the lock at the end of its lease as on the other backends. It
 * counts from after the reply that set the lease, so it never deletes
 * before the core's deadline, which counts from before the request.
 */
static void *reaper_main(void *arg)
{
    dlock__zk_be *be = arg;

    pthread_mutex_lock(&be->mu);
    while (!be->stopping) {
        int64_t now = dlock__zk_now_ms(), next = INT64_MAX;
        hold_t *due = NULL;

        for (hold_t **p = &be->holds; *p != NULL; p = &(*p)->next) {
            if ((*p)->expires_ms <= now) {
                due = *p;
                *p = due->next;
                break;
            }
            if ((*p)->expires_ms < next)
                next = (*p)->expires_ms;
        }
        if (due != NULL) {
            int gone = 1;
            pthread_mutex_unlock(&be->mu);
            /* Not sess_alive: a session cut off past its timeout by our
             * clock may live on at the server (dlock__zk_sess_open); a
             * node dropped here would stay ahead of every waiter for as
             * long as this process lives (chaos zk3 leader-kill). */
            if (dlock__zk_sess_open(due->sess, due->gen))
                gone = reap(due);
            pthread_mutex_lock(&be->mu);
            if (gone) {
                hold_free(due);
            } else {
                /* The server could not be reached: again in a second. */
                due->orphan = 1;
                due->expires_ms = dlock__zk_now_ms() + ORPHAN_RETRY_MS;
                due->next = be->holds;
                be->holds = due;
            }
            continue;
        }
        if (next == INT64_MAX) {
            pthread_cond_wait(&be->reap_cv, &be->mu);
        } else {
            struct timespec ts;
            int64_t at = dlock__zk_mono_ms() + (next - now);
            ts.tv_sec = at / 1000;
            ts.tv_nsec = (long)(at % 1000) * 1000000;
            pthread_cond_timedwait(&be->reap_cv, &be->mu, &ts);
        }
    }
    pthread_mutex_unlock(&be->mu);
    return NULL;
}

/* Start the reaper if it is not running, and wake it (be->mu held). */
static int reaper_poke(dlock__zk_be *be)
{
    int rc = DLOCK_OK;

    if (!be->reaper_running) {
        if (pthread_create(&be->reaper, NULL, reaper_main, be) == 0)
            be->reaper_running = 1;
        else
            rc = dlock_backend_fail(DLOCK_ENOMEM, "zk: cannot start the lease reaper thread");
    }
    pthread_cond_signal(&be->reap_cv);
    return rc;
}

int dlock__zk_hold_add(dlock__zk_be *be, const dlock_request *req, dlock__zk_sess *s,
                       uint64_t gen, const char *node, uint64_t czxid)
{
    hold_t *h;
    int rc = DLOCK_OK;

    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, req->token)) == NULL) {
        if ((h = calloc(1, sizeof(*h))) == NULL || (h->token = strdup(req->token)) == NULL ||
            (h->node = strdup(node)) == NULL) {
            hold_free(h);
            pthread_mutex_unlock(&be->mu);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
        h->next = be->holds;
        be->holds = h;
    }
    if (h->node == NULL || strcmp(h->node, node) != 0) {
        free(h->node);
        if ((h->node = strdup(node)) == NULL) {
            pthread_mutex_unlock(&be->mu);
            return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        }
    }
    h->orphan = 0;
    h->sess = s;
    h->gen = gen;
    h->czxid = czxid;
    h->lease_ms = req->lease_ms;
    h->expires_ms = dlock__zk_now_ms() + req->lease_ms;
    rc = reaper_poke(be);
    pthread_mutex_unlock(&be->mu);
    return rc;
}

int dlock__zk_orphan_add(dlock__zk_be *be, const char *token, dlock__zk_sess *s, uint64_t gen,
                         const char *dir, const char *uuid, const char *node)
{
    hold_t *h = calloc(1, sizeof(*h));
    int rc = DLOCK_OK;

    if (h == NULL || (h->token = strdup(token != NULL ? token : uuid)) == NULL ||
        (dir != NULL && (h->dir = strdup(dir)) == NULL) ||
        (node != NULL && (h->node = strdup(node)) == NULL)) {
        hold_free(h);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    snprintf(h->uuid, sizeof(h->uuid), "%s", uuid);
    h->orphan = 1;
    h->sess = s;
    h->gen = gen;
    h->expires_ms = dlock__zk_now_ms() + ORPHAN_RETRY_MS;
    pthread_mutex_lock(&be->mu);
    h->next = be->holds;
    be->holds = h;
    rc = reaper_poke(be);
    pthread_mutex_unlock(&be->mu);
    return rc;
}

int dlock__zk_hold_find(dlock__zk_be *be, const char *token, dlock__zk_sess **s, uint64_t *gen,
                        char **node)
{
    hold_t h;

    if (!hold_copy(be, token, &h) || !dlock__zk_sess_alive(h.sess, h.gen)) {
        free(h.node);
        return dlock_backend_fail(DLOCK_ELOST, "zk %s: the lock is no longer ours", be->shown);
    }
    *s = h.sess;
    *gen = h.gen;
    *node = h.node;
    return DLOCK_OK;
}

int dlock__zk_hold_move(dlock__zk_be *be, const char *token, const char *node)
{
    char *copy = strdup(node);
    hold_t *h;

    if (copy == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_lock(&be->mu);
    if ((h = hold_find(be, token)) != NULL) {
        free(h->node);
        h->node = copy;
        copy = NULL;
    }
    pthread_mutex_unlock(&be->mu);
    free(copy);
    return h != NULL ? DLOCK_OK : dlock_backend_fail(DLOCK_ELOST, "zk %s: the lock is no "
                                                     "longer ours", be->shown);
}

/* ---- open and close ------------------------------------------------------ */

static void zk_close(void *arg)
{
    dlock__zk_be *be = arg;

    if (be == NULL)
        return;
    if (be->reaper_running) {
        pthread_mutex_lock(&be->mu);
        be->stopping = 1;
        pthread_cond_signal(&be->reap_cv);
        pthread_mutex_unlock(&be->mu);
        pthread_join(be->reaper, NULL);
    }
    /* Closing the sessions deletes their ephemeral nodes at once. */
    for (int i = 0; i < 2; i++) {
        dlock__zk_sess_close(&be->sess[i]);
        pthread_mutex_destroy(&be->sess[i].mu);
        pthread_cond_destroy(&be->sess[i].cv);
    }
    while (be->holds != NULL) {
        hold_t *h = be->holds;
        be->holds = h->next;
        hold_free(h);
    }
    pthread_mutex_destroy(&be->mu);
    pthread_cond_destroy(&be->reap_cv);
    free(be->hosts);
    free(be->shown);
    if (be->auth != NULL)
        explicit_bzero(be->auth, strlen(be->auth));
    free(be->auth);
    dlock__zk_acl_free(be);
    free(be->prefix);
    free(be);
}

/* "/" + key_prefix, checked: ZooKeeper paths have no empty, "." or ".."
 * component. */
static int make_prefix(dlock__zk_be *be, const char *key_prefix)
{
    const char *kp = key_prefix != NULL ? key_prefix : "dlock/";
    const char *p;

    if (asprintf(&be->prefix, "%s%s", kp[0] == '/' ? "" : "/", kp) < 0) {
        be->prefix = NULL;
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    for (p = be->prefix; *p != '\0'; p++) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20 || c >= 0x7f || (c == '/' && p[1] == '/') ||
            (c == '/' && p[1] == '.' && (p[2] == '/' || (p[2] == '.' && p[3] == '/'))))
            return dlock_backend_fail(DLOCK_EINVAL, "client options: key_prefix '%s' is not a "
                                      "ZooKeeper path prefix (printable ASCII, no empty, '.' "
                                      "or '..' component)", kp);
    }
    return DLOCK_OK;
}

static int parse_url(dlock__zk_be *be, const dlock_url *url, int64_t *session_ms)
{
    size_t len = 0, cap = 64;
    char *hosts;
    const char *v;

    if (url->nhosts == 0)
        return dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': no host", be->shown);
    for (size_t i = 0; i < url->nparams; i++)
        if (strcmp(url->params[i].key, "session_timeout_ms") != 0 &&
            strcmp(url->params[i].key, "acl") != 0)
            return dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': unknown parameter '%s' (zk "
                                      "takes session_timeout_ms and acl)", be->shown,
                                      url->params[i].key);
    *session_ms = DEFAULT_SESSION_MS;
    if ((v = dlock_url_param_get(url, "session_timeout_ms")) != NULL) {
        char *end;
        long long ms = strtoll(v, &end, 10);
        if (*v == '\0' || *end != '\0' || ms < 100 || ms > LONG_SESSION_MS)
            return dlock_backend_fail(DLOCK_EINVAL, "zk URL '%s': session_timeout_ms '%s' must "
                                      "be a number of ms from 100 to %d", be->shown, v,
                                      LONG_SESSION_MS);
        *session_ms = ms;
    }
    for (size_t i = 0; i < url->nhosts; i++)
        cap += strlen(url->hosts[i].host) + 16;
    if (url->path != NULL)
        cap += strlen(url->path);
    if ((hosts = malloc(cap)) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < url->nhosts; i++) {
        const char *h = url->hosts[i].host;
        int v6 = strchr(h, ':') != NULL;
        len += (size_t)snprintf(hosts + len, cap - len, "%s%s%s%s:%d", i > 0 ? "," : "",
                                v6 ? "[" : "", h, v6 ? "]" : "",
                                url->hosts[i].port > 0 ? url->hosts[i].port : 2181);
    }
    /* The chroot: the path, without a trailing '/'. */
    if (url->path != NULL && strcmp(url->path, "/") != 0 && url->path[0] == '/') {
        size_t plen = strlen(url->path);
        while (plen > 1 && url->path[plen - 1] == '/')
            plen--;
        len += (size_t)snprintf(hosts + len, cap - len, "%.*s", (int)plen, url->path);
    }
    be->hosts = hosts;
    return DLOCK_OK;
}

/*
 * With credentials, the node the lock directories are made in (the
 * prefix's, /dlock by default) is the trust domain's root. ZooKeeper checks
 * DELETE on a node's parent, so whoever may create a lock's directory may
 * delete every holder's node in it: that node must not let world create,
 * delete or change its ACL. Made here, with this client's ACL, when it is
 * missing; persistent, since a container goes when its last lock does and
 * could then be made again, open, by anyone under an open parent. One
 * round trip or three, at open only.
 */
static int secure_prefix(dlock__zk_be *be)
{
    dlock__zk_sess *s = &be->sess[0];
    const char *slash = strrchr(be->prefix, '/');
    struct ACL_vector acl = {0, NULL};
    char *node;
    int zrc, open_to_world = 0;

    if ((node = strndup(be->prefix, slash > be->prefix ? (size_t)(slash - be->prefix) : 1)) ==
        NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    zrc = dlock__zk_get_acl(s, node, &acl);
    if (zrc == ZNONODE) {
        zrc = dlock__zk_make_parents(s, node);
        if (zrc == ZOK)
            zrc = dlock__zk_create(s, node, NULL, -1, ZOO_PERSISTENT, NULL, NULL);
        if (zrc == ZOK || zrc == ZNODEEXISTS)
            zrc = dlock__zk_get_acl(s, node, &acl);
    }
    if (zrc != ZOK) {
        int rc = dlock__zk_fail(s, zrc, "read the ACL of", node);
        free(node);
        return rc;
    }
    for (int i = 0; i < acl.count; i++)
        if (strcmp(acl.data[i].id.scheme, "world") == 0 &&
            (acl.data[i].perms & (ZOO_PERM_CREATE | ZOO_PERM_DELETE | ZOO_PERM_ADMIN)) != 0)
            open_to_world = 1;
    deallocate_ACL_vector(&acl);
    if (open_to_world) {
        int rc = dlock_backend_fail(DLOCK_EAUTH, "zk %s: %s lets anyone create or delete in it "
                                    "(world:anyone), so anyone could delete a holder's node: "
                                    "set its ACL (zkCli: addauth digest USER:PASSWORD, then "
                                    "setAcl %s auth::cdrwa), or use a key_prefix or chroot "
                                    "of your own", be->shown, node, node);
        free(node);
        return rc;
    }
    free(node);
    return DLOCK_OK;
}

static int zk_open(void **out, const dlock_url *url, const dlock_client_options *opts)
{
    dlock__zk_be *be = calloc(1, sizeof(*be));
    int64_t session_ms = DEFAULT_SESSION_MS;
    uint64_t gen;
    int rc, zrc;

    if (be == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&be->mu, NULL);
    {
        pthread_condattr_t a;
        pthread_condattr_init(&a);
        pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
        pthread_cond_init(&be->reap_cv, &a);
        pthread_condattr_destroy(&a);
    }
    be->connect_timeout_ms = opts->connect_timeout_ms;
    be->command_timeout_ms = opts->command_timeout_ms;
    be->log = opts->log;
    be->log_payload = opts->log_payload;
    if ((be->shown = strdup(url->redacted)) == NULL) { /* acl= is hidden there too */
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    if ((rc = parse_url(be, url, &session_ms)) != DLOCK_OK)
        goto err;
    dlock__zk_sess_init(&be->sess[0], be, session_ms);
    dlock__zk_sess_init(&be->sess[1], be, LONG_SESSION_MS);
    if (url->user != NULL &&
        asprintf(&be->auth, "%s:%s", url->user, url->password != NULL ? url->password : "") < 0) {
        be->auth = NULL;
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    if ((rc = dlock__zk_acl_init(be, dlock_url_param_get(url, "acl"), be->shown)) !=
        DLOCK_OK)
        goto err;
    if ((rc = make_prefix(be, opts->key_prefix)) != DLOCK_OK)
        goto err;
    if ((rc = dlock__zk_sess_ready(&be->sess[0], &gen)) != DLOCK_OK)
        goto err;
    /* A round trip: the server answers (and the chroot is readable). */
    zrc = dlock__zk_exists(&be->sess[0], "/", 0, NULL);
    if (zrc != ZOK) {
        rc = dlock__zk_fail(&be->sess[0], zrc, "stat", "/");
        goto err;
    }
    if (be->auth != NULL && (rc = secure_prefix(be)) != DLOCK_OK)
        goto err;
    *out = be;
    return DLOCK_OK;
err:
    if (be->sess[0].be == NULL) {
        dlock__zk_sess_init(&be->sess[0], be, session_ms);
        dlock__zk_sess_init(&be->sess[1], be, LONG_SESSION_MS);
    }
    zk_close(be);
    return rc;
}

/* ---- release, extend, check, renew --------------------------------------- */

/* The node of an acquisition not in the table (a try whose reply was lost):
 * found by its protection id. 1 found (*node), 0 none, or an error. */
static int find_by_uuid(dlock__zk_be *be, const dlock_request *req, dlock__zk_sess **s,
                        char **node)
{
    struct String_vector kids = {0, NULL};
    char uuid[DLOCK__ZK_UUID_LEN + 1], *dir;
    int rc, i;

    if ((rc = dlock__zk_sess_ready(&be->sess[0], NULL)) != DLOCK_OK)
        return rc;
    *s = &be->sess[0];
    if ((dir = dlock__zk_dir(be, req->name)) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    dlock__zk_uuid(req->token, uuid);
    rc = dlock__zk_children(*s, dir, &kids);
    if (rc == ZNONODE) {
        free(dir);
        return 0;
    }
    if (rc != ZOK) {
        rc = dlock__zk_fail(*s, rc, "list", dir);
        free(dir);
        return rc;
    }
    i = dlock__zk_find_protected(&kids, uuid);
    *node = i >= 0 ? dlock__zk_join(dir, kids.data[i]) : NULL;
    deallocate_String_vector(&kids);
    free(dir);
    if (i >= 0 && *node == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    return i >= 0;
}

static int zk_release(void *arg, const dlock_request *req)
{
    dlock__zk_be *be = arg;
    hold_t *h = hold_take(be, req->token);
    dlock__zk_sess *s = &be->sess[0];
    char *node = NULL;
    int rc;

    uint64_t gen = 0;
    int orphan = 0;

    if (h != NULL && !h->orphan) {
        if (!dlock__zk_sess_alive(h->sess, h->gen)) {
            /* Lost to us; but the server may have kept the session, and
             * its node with it: the reaper deletes it while it may. */
            if (dlock__zk_sess_open(h->sess, h->gen)) {
                char uuid[DLOCK__ZK_UUID_LEN + 1];
                dlock__zk_uuid(req->token, uuid);
                dlock__zk_orphan_add(be, req->token, h->sess, h->gen, NULL, uuid, h->node);
            }
            hold_free(h);
            return DLOCK_ELOST;
        }
        s = h->sess;
        gen = h->gen;
        node = h->node;
        h->node = NULL;
        hold_free(h);
    } else {
        /* A try whose reply was lost: find its node by protection id. */
        orphan = h != NULL;
        hold_free(h);
        if ((rc = find_by_uuid(be, req, &s, &node)) <= 0) {
            if (rc < 0 && orphan) {
                char uuid[DLOCK__ZK_UUID_LEN + 1], *dir = dlock__zk_dir(be, req->name);
                dlock__zk_uuid(req->token, uuid);
                dlock__zk_orphan_add(be, req->token, &be->sess[0], be->sess[0].gen, dir, uuid,
                                     NULL);
                free(dir);
            }
            return rc == 0 ? DLOCK_ELOST : rc;
        }
        gen = s->gen;
    }
    rc = dlock__zk_delete(s, node, -1);
    if (rc == ZNONODE) {
        rc = DLOCK_ELOST;
    } else if (rc != ZOK) {
        char uuid[DLOCK__ZK_UUID_LEN + 1];
        rc = dlock__zk_fail(s, rc, "delete", node);
        /* Still ours on the server, maybe: the reaper deletes it later. */
        dlock__zk_uuid(req->token, uuid);
        dlock__zk_orphan_add(be, req->token, s, gen, NULL, uuid, node);
    }
    free(node);
    return rc;
}

/*
 * Whether a lease of lease_ms still fits session s. ZooKeeper keeps a
 * session only until the last contact + the timeout negotiated at the last
 * (re)connect, and a reconnect may negotiate a shorter one than the lease
 * was taken under (a server restarted with a lower maxSessionTimeout, an
 * ensemble member with one): a renewal would then count the lease past
 * what the server promises. Such a hold is lost, not renewed.
 */
static int fits_session(dlock__zk_sess *s, int64_t lease_ms)
{
    int64_t timeout;

    pthread_mutex_lock(&s->mu);
    timeout = s->timeout_ms;
    pthread_mutex_unlock(&s->mu);
    return lease_ms <= timeout;
}

/* ZOK if token's node exists in the session that made it; DLOCK_ELOST if
 * not; or an error. h: the hold, copied. */
static int check_hold(dlock__zk_be *be, const dlock_request *req, hold_t *h)
{
    int rc;

    if (!hold_copy(be, req->token, h))
        return DLOCK_ELOST;
    if (!dlock__zk_sess_alive(h->sess, h->gen) || !fits_session(h->sess, h->lease_ms))
        return DLOCK_ELOST;
    rc = dlock__zk_exists(h->sess, h->node, 0, NULL);
    if (rc == ZNONODE)
        return DLOCK_ELOST;
    if (rc != ZOK)
        return dlock__zk_fail(h->sess, rc, "stat", h->node);
    return DLOCK_OK;
}

static int zk_check(void *arg, const dlock_request *req)
{
    hold_t h;
    int rc = check_hold(arg, req, &h);
    free(h.node);
    return rc;
}

static int zk_extend(void *arg, const dlock_request *req)
{
    dlock__zk_be *be = arg;
    hold_t h;
    int64_t timeout;
    int rc = check_hold(be, req, &h);

    if (rc == DLOCK_OK) {
        pthread_mutex_lock(&h.sess->mu);
        timeout = h.sess->timeout_ms;
        pthread_mutex_unlock(&h.sess->mu);
        if (req->lease_ms > timeout) {
            rc = dlock_backend_fail(DLOCK_EINVAL, "zk %s: lease_ms %lld is longer than the "
                                    "session the lock lives in (%lld ms): take the lock with "
                                    "the longer lease instead", be->shown,
                                    (long long)req->lease_ms, (long long)timeout);
        } else {
            /* The new lease in the node's data, for status (one write:
             * extending is rare, renewing is not), the fence kept (a
             * re-entry's node stores it). */
            int len;
            char *data = dlock__zk_node_data_fenced(req, req->lease_ms, h.czxid, &len);
            int zrc = data != NULL ? dlock__zk_set(h.sess, h.node, data, len, -1) : ZSYSTEMERROR;
            free(data);
            if (zrc == ZNONODE)
                rc = DLOCK_ELOST;
            else if (zrc != ZOK)
                rc = dlock__zk_fail(h.sess, zrc, "set", h.node);
            else
                hold_touch(be, req->token, req->lease_ms);
        }
    }
    free(h.node);
    return rc;
}

/*
 * One multi request of check ops per session, whatever the number of locks:
 * a round trip that proves the session alive and each node still there.
 * A lock whose session expired, or was cut off longer than its timeout, is
 * lost without asking. A session that is disconnected but may still be
 * alive fails the batch (DLOCK_ECONN): the core retries until the lease
 * runs out.
 */
static int zk_renew(void *arg, dlock_renewal *items, size_t n)
{
    dlock__zk_be *be = arg;
    hold_t *hs = calloc(n > 0 ? n : 1, sizeof(*hs));
    const char **paths = calloc(n > 0 ? n : 1, sizeof(*paths));
    int *ok = calloc(n > 0 ? n : 1, sizeof(*ok));
    size_t *idx = calloc(n > 0 ? n : 1, sizeof(*idx));
    int rc = DLOCK_OK;

    if (hs == NULL || paths == NULL || ok == NULL || idx == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        items[i].result = DLOCK_ELOST;
        if (hold_copy(be, items[i].req->token, &hs[i]) &&
            (!dlock__zk_sess_alive(hs[i].sess, hs[i].gen) ||
             !fits_session(hs[i].sess, items[i].req->lease_ms))) {
            free(hs[i].node);
            hs[i].node = NULL;
        }
    }
    for (int si = 0; si < 2 && rc == DLOCK_OK; si++) {
        dlock__zk_sess *s = &be->sess[si];
        size_t m = 0;
        int connected, zrc;

        for (size_t i = 0; i < n; i++)
            if (hs[i].node != NULL && hs[i].sess == s) {
                idx[m] = i;
                paths[m++] = hs[i].node;
            }
        if (m == 0)
            continue;
        pthread_mutex_lock(&s->mu);
        connected = s->connected;
        pthread_mutex_unlock(&s->mu);
        if (!connected) {
            rc = dlock_backend_fail(DLOCK_ECONN, "zk %s: disconnected; the session is kept "
                                    "while it reconnects within its timeout", be->shown);
            break;
        }
        zrc = dlock__zk_check_many(s, paths, m, ok);
        if (zrc != ZOK) {
            rc = dlock__zk_fail(s, zrc, "check", "the held nodes");
            break;
        }
        for (size_t j = 0; j < m; j++)
            if (ok[j] == 1) {
                items[idx[j]].result = DLOCK_OK;
                hold_touch(be, items[idx[j]].req->token, items[idx[j]].req->lease_ms);
            }
    }
out:
    for (size_t i = 0; hs != NULL && i < n; i++)
        free(hs[i].node);
    free(hs);
    free(paths);
    free(ok);
    free(idx);
    return rc;
}

/* ---- status, holders, force release, list ------------------------------- */

/*
 * Who holds a name, in whichever of the layouts it has (zk_family.c; the
 * kind is read from the children's names, as a Curator process would):
 *   mutex, fair  "_c_<uuid>-lock-<S>": the lowest sequence S holds, with
 *                the owner's re-entries at S (zk_lock.c, reenter)
 *   read-write   "..-__WRIT__<S>" / "..-__READ__<S>": the first if a
 *                writer, else every reader before the first writer
 *   semaphore    NAME/leases "..-lease-<S>": every lease node, but the one
 *                of the acquirer that holds NAME/locks while it waits for
 *                a permit (its node is over N)
 *   election     "..-latch-<S>": the first (its data is the identity, not
 *                a holder record)
 * Each holder's fence is its node's czxid (or its "fence=", for a re-entry
 * or a downgraded read), its record and lease from its data.
 */
typedef struct {
    char *path;
    dlock_lock_info info;
} zk_holder;

typedef struct {
    int kind; /* DLOCK_KIND_*, -1 when free */
    int n;
    zk_holder *h;
} zk_holders;

#define RW_READ "__READ__"
#define RW_WRITE "__WRIT__"

static void holders_free(zk_holders *hs)
{
    for (int i = 0; i < hs->n; i++)
        free(hs->h[i].path);
    free(hs->h);
    hs->h = NULL;
    hs->n = 0;
    hs->kind = -1;
}

static int holders_add(zk_holders *hs, const char *dir, const char *child)
{
    zk_holder *h = realloc(hs->h, (size_t)(hs->n + 1) * sizeof(*h));

    if (h == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    hs->h = h;
    memset(&h[hs->n], 0, sizeof(h[0]));
    if ((h[hs->n].path = dlock__zk_join(dir, child)) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    hs->n++;
    return DLOCK_OK;
}

/* The children of path, sorted by what follows sort_name; none when it is
 * missing. */
static int sorted_kids(dlock__zk_sess *s, const char *path, const char *sort_name,
                       struct String_vector *kids)
{
    int rc = dlock__zk_children(s, path, kids);

    if (rc == ZNONODE) {
        kids->count = 0;
        kids->data = NULL;
        return DLOCK_OK;
    }
    if (rc != ZOK)
        return dlock__zk_fail(s, rc, "list", path);
    dlock__zk_sort_children(kids, sort_name);
    return DLOCK_OK;
}

static int any_kid(const struct String_vector *kids, const char *part, int whole)
{
    for (int i = 0; i < kids->count; i++)
        if (whole ? strcmp(kids->data[i], part) == 0 : strstr(kids->data[i], part) != NULL)
            return 1;
    return 0;
}

/* A semaphore's permit holders: the lease nodes of dir/leases, less the
 * waiting acquirer's (the head of dir/locks) when they are over N. */
static int sem_holders(dlock__zk_sess *s, const char *dir, zk_holders *hs)
{
    struct String_vector leases = {0, NULL}, locks = {0, NULL};
    char *lpath = dlock__zk_join(dir, "leases"), *kpath = dlock__zk_join(dir, "locks");
    char *data = NULL;
    int len = 0, rc, skip = -1;
    long permits = -1;
    struct Stat st;

    if (lpath == NULL || kpath == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    if ((rc = sorted_kids(s, lpath, "lease-", &leases)) != DLOCK_OK)
        goto out;
    rc = dlock__zk_get(s, lpath, &data, &len, &st);
    if (rc == ZOK && len == 4)
        permits = (long)((unsigned char)data[0] << 24 | (unsigned char)data[1] << 16 |
                         (unsigned char)data[2] << 8 | (unsigned char)data[3]);
    rc = DLOCK_OK;
    if (permits >= 0 && leases.count > permits) {
        if ((rc = sorted_kids(s, kpath, DLOCK__ZK_LOCK_NAME, &locks)) != DLOCK_OK)
            goto out;
        if (locks.count > 0 && strncmp(locks.data[0], DLOCK__ZK_PROTECT,
                                       strlen(DLOCK__ZK_PROTECT)) == 0 &&
            strlen(locks.data[0]) > strlen(DLOCK__ZK_PROTECT) + DLOCK__ZK_UUID_LEN) {
            char uuid[DLOCK__ZK_UUID_LEN + 1];
            memcpy(uuid, locks.data[0] + strlen(DLOCK__ZK_PROTECT), DLOCK__ZK_UUID_LEN);
            uuid[DLOCK__ZK_UUID_LEN] = '\0';
            skip = dlock__zk_find_protected(&leases, uuid);
        }
    }
    for (int i = 0; i < leases.count && rc == DLOCK_OK; i++)
        if (i != skip)
            rc = holders_add(hs, lpath, leases.data[i]);
    hs->kind = DLOCK_KIND_SEMAPHORE;
out:
    deallocate_String_vector(&leases);
    deallocate_String_vector(&locks);
    free(data);
    free(lpath);
    free(kpath);
    return rc;
}

/* The holders' nodes of dir, by layout (no data read yet). */
static int holder_nodes(dlock__zk_sess *s, const char *dir, zk_holders *hs)
{
    struct String_vector kids = {0, NULL};
    int rc = sorted_kids(s, dir, DLOCK__ZK_LOCK_NAME, &kids);

    if (rc != DLOCK_OK || kids.count == 0) {
        deallocate_String_vector(&kids);
        return rc;
    }
    if (any_kid(&kids, "leases", 1)) {
        rc = sem_holders(s, dir, hs);
    } else if (any_kid(&kids, RW_READ, 0) || any_kid(&kids, RW_WRITE, 0)) {
        /* Curator sorts by what follows the last "__READ__" / "__WRIT__". */
        dlock__zk_sort_children(&kids, "__");
        hs->kind = strstr(kids.data[0], RW_WRITE) != NULL ? DLOCK_KIND_WRITE : DLOCK_KIND_READ;
        for (int i = 0; i < kids.count && rc == DLOCK_OK; i++) {
            if (hs->kind == DLOCK_KIND_WRITE ? i > 0 : strstr(kids.data[i], RW_WRITE) != NULL)
                break;
            if (strstr(kids.data[i], RW_READ) != NULL || hs->kind == DLOCK_KIND_WRITE)
                rc = holders_add(hs, dir, kids.data[i]);
        }
    } else if (any_kid(&kids, "-latch-", 0)) {
        dlock__zk_sort_children(&kids, "latch-");
        hs->kind = DLOCK_KIND_LEADER;
        rc = holders_add(hs, dir, kids.data[0]);
    } else {
        const char *seq = dlock__zk_mutex_seq(kids.data[0]);
        hs->kind = DLOCK_KIND_MUTEX; /* FAIR: read from the data below */
        rc = holders_add(hs, dir, kids.data[0]);
        for (int i = 1; seq != NULL && i < kids.count && rc == DLOCK_OK; i++) {
            const char *q = dlock__zk_mutex_seq(kids.data[i]);
            if (q == NULL || strcmp(q, seq) != 0)
                break;
            rc = holders_add(hs, dir, kids.data[i]); /* the owner's re-entries */
        }
    }
    deallocate_String_vector(&kids);
    return rc;
}

/* Every holder of name with its record, in one consistent look (a node
 * gone between the listing and its read: look again). */
static int read_holders(dlock__zk_be *be, dlock__zk_sess *s, const char *name, zk_holders *hs)
{
    char *dir = dlock__zk_dir(be, name);
    int rc = DLOCK_OK;

    hs->kind = -1;
    hs->n = 0;
    hs->h = NULL;
    if (dir == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    for (int attempt = 0; attempt < 5; attempt++) {
        int gone = 0;

        holders_free(hs);
        if ((rc = holder_nodes(s, dir, hs)) != DLOCK_OK)
            break;
        for (int i = 0; i < hs->n && rc == DLOCK_OK && !gone; i++) {
            zk_holder *h = &hs->h[i];
            struct Stat st;
            char *data = NULL;
            int len = 0, zrc = dlock__zk_get(s, h->path, &data, &len, &st);

            if (zrc == ZNONODE) {
                gone = 1;
                break;
            }
            if (zrc != ZOK) {
                rc = dlock__zk_fail(s, zrc, "get", h->path);
                break;
            }
            h->info.held = 1;
            h->info.fence = (uint64_t)st.czxid;
            h->info.kind = -1;
            if (hs->kind == DLOCK_KIND_LEADER)
                h->info.ttl_ms = -1; /* the data is the identity */
            else
                dlock__zk_parse_data(data, len, &h->info);
            free(data);
            if (h->info.kind == DLOCK_KIND_FAIR && hs->kind == DLOCK_KIND_MUTEX)
                hs->kind = DLOCK_KIND_FAIR;
            /* Our own hold: the lease left, as the reaper counts it. */
            pthread_mutex_lock(&be->mu);
            for (hold_t *o = be->holds; o != NULL; o = o->next)
                if (strcmp(o->node, h->path) == 0) {
                    int64_t left = o->expires_ms - dlock__zk_now_ms();
                    h->info.ttl_ms = left > 0 ? left : 1;
                }
            pthread_mutex_unlock(&be->mu);
        }
        if (rc != DLOCK_OK || !gone) {
            free(dir);
            if (rc != DLOCK_OK)
                holders_free(hs);
            return rc;
        }
    }
    free(dir);
    if (rc == DLOCK_OK)
        rc = dlock_backend_fail(DLOCK_ESERVER, "zk %s: '%s': the holders changed five times "
                                "while reading them", be->shown, name);
    holders_free(hs);
    return rc;
}

/* One holder's state as dlock_status_holders gives it. */
static void holder_info(const zk_holders *hs, int i, dlock_lock_info *out)
{
    *out = hs->h[i].info;
    out->held = 1;
    out->holders = hs->n;
    out->kind = hs->kind;
}

/* The name's state: the oldest holder's (the lowest fence), and how many. */
static void holders_status(const zk_holders *hs, dlock_lock_info *out)
{
    int oldest = 0;

    memset(out, 0, sizeof(*out));
    out->kind = -1;
    if (hs->n == 0)
        return;
    for (int i = 1; i < hs->n; i++)
        if (hs->h[i].info.fence < hs->h[oldest].info.fence)
            oldest = i;
    holder_info(hs, oldest, out);
}

static int zk_status(void *arg, const char *name, dlock_lock_info *out)
{
    dlock__zk_be *be = arg;
    zk_holders hs;
    int rc;

    if ((rc = dlock__zk_sess_ready(&be->sess[0], NULL)) != DLOCK_OK)
        return rc;
    if ((rc = read_holders(be, &be->sess[0], name, &hs)) != DLOCK_OK)
        return rc;
    holders_status(&hs, out);
    holders_free(&hs);
    return DLOCK_OK;
}

static int zk_holders_list(void *arg, const char *name, dlock_list_cb cb, void *payload)
{
    dlock__zk_be *be = arg;
    zk_holders hs;
    int rc;

    if ((rc = dlock__zk_sess_ready(&be->sess[0], NULL)) != DLOCK_OK)
        return rc;
    if ((rc = read_holders(be, &be->sess[0], name, &hs)) != DLOCK_OK)
        return rc;
    for (int i = 0; i < hs.n; i++) {
        dlock_lock_info info;
        holder_info(&hs, i, &info);
        if (cb(name, &info, payload))
            break;
    }
    holders_free(&hs);
    return DLOCK_OK;
}

/* Delete every holder's node (readers, permits, an owner's re-entries):
 * the waiters watching them go on. */
static int zk_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    dlock__zk_be *be = arg;
    dlock__zk_sess *s = &be->sess[0];
    zk_holders hs;
    int rc, deleted = 0;

    if ((rc = dlock__zk_sess_ready(s, NULL)) != DLOCK_OK)
        return rc;
    if ((rc = read_holders(be, s, name, &hs)) != DLOCK_OK)
        return rc;
    holders_status(&hs, removed);
    for (int i = 0; i < hs.n && rc == DLOCK_OK; i++) {
        int zrc = dlock__zk_delete(s, hs.h[i].path, -1);
        if (zrc == ZOK)
            deleted++;
        else if (zrc != ZNONODE)
            rc = dlock__zk_fail(s, zrc, "delete", hs.h[i].path);
    }
    if (rc == DLOCK_OK && deleted == 0) {
        memset(removed, 0, sizeof(*removed)); /* its holders released it meanwhile */
        removed->kind = -1;
    }
    holders_free(&hs);
    return rc;
}

static int zk_list(void *arg, const char *name_prefix, dlock_list_cb cb, void *payload)
{
    dlock__zk_be *be = arg;
    dlock__zk_sess *s = &be->sess[0];
    struct String_vector kids = {0, NULL};
    const char *slash = strrchr(be->prefix, '/');
    const char *part = slash + 1; /* the prefix's last component: a name prefix */
    size_t plen = strlen(part), nlen = strlen(name_prefix);
    char *parent;
    int rc, zrc;

    if ((rc = dlock__zk_sess_ready(s, NULL)) != DLOCK_OK)
        return rc;
    if ((parent = strndup(be->prefix, slash == be->prefix ? 1 : (size_t)(slash - be->prefix))) ==
        NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    zrc = dlock__zk_children(s, parent, &kids);
    if (zrc == ZNONODE) {
        free(parent);
        return DLOCK_OK;
    }
    if (zrc != ZOK) {
        rc = dlock__zk_fail(s, zrc, "list", parent);
        free(parent);
        return rc;
    }
    for (int i = 0; i < kids.count && rc == DLOCK_OK; i++) {
        dlock_lock_info info;
        char *name;

        if (strncmp(kids.data[i], part, plen) != 0 ||
            (name = dlock__zk_unescape(kids.data[i] + plen)) == NULL)
            continue;
        if (strncmp(name, name_prefix, nlen) == 0 && name[0] != '\0' &&
            (rc = zk_status(be, name, &info)) == DLOCK_OK && info.held && cb(name, &info, payload))
            i = kids.count;
        free(name);
    }
    deallocate_String_vector(&kids);
    free(parent);
    return rc;
}

/* ---- the table ------------------------------------------------------------- */

static const char *const zk_schemes[] = {"zk", NULL};

static const dlock_backend zk_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "zk",
    .schemes = zk_schemes,
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX) | DLOCK_CAP_KIND(DLOCK_KIND_FAIR) |
            DLOCK_CAP_KIND(DLOCK_KIND_READ) |
            DLOCK_CAP_KIND(DLOCK_KIND_WRITE) | DLOCK_CAP_KIND(DLOCK_KIND_SEMAPHORE) |
            DLOCK_CAP_KIND(DLOCK_KIND_LEADER) | DLOCK_CAP_OWNER_IDS,
    .open = zk_open,
    .close = zk_close,
    .acquire = dlock__zk_acquire,
    .release = zk_release,
    .extend = zk_extend,
    .check = zk_check,
    .renew = zk_renew,
    .watch_begin = dlock__zk_watch_begin,
    .watch_wait = dlock__zk_watch_wait,
    .watch_end = dlock__zk_watch_end,
    .watch_wake = dlock__zk_watch_wake,
    .status = zk_status,
    .force_release = zk_force_release,
    .list = zk_list,
    .holders = zk_holders_list,
    .downgrade = dlock__zk_downgrade,
    .set_permits = dlock__zk_set_permits,
    .leader_get = dlock__zk_leader_get,
    .observe_begin = dlock__zk_observe_begin,
};

DLOCK_BACKEND_MODULE(zk_backend)

/* For static programs and the tests: the table without loading a module. */
DLOCK_EXTERN const dlock_backend *dlock_zk_backend(void);
const dlock_backend *dlock_zk_backend(void)
{
    return &zk_backend;
}
