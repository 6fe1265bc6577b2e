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
 * last renewal that succeeded; a renewal here is one sync through the
 * leader (and the nodes' watches: "Renewal" below), which proves the
 * session alive at its send time, so the server keeps the nodes at least
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
        dlock__zk_watch_table_free(&be->sess[i]);
        pthread_mutex_destroy(&be->sess[i].mu);
        pthread_mutex_destroy(&be->sess[i].qmu);
        pthread_cond_destroy(&be->sess[i].cv);
    }
    dlock__zk_holds_free(be);
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
    dlock__zk_hold *h = dlock__zk_hold_take(be, req->token);
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
            dlock__zk_hold_free(h);
            return DLOCK_ELOST;
        }
        s = h->sess;
        gen = h->gen;
        node = h->node;
        h->node = NULL;
        dlock__zk_hold_free(h);
    } else {
        /* A try whose reply was lost: find its node by protection id. */
        orphan = h != NULL;
        dlock__zk_hold_free(h);
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
static int check_hold(dlock__zk_be *be, const dlock_request *req, dlock__zk_hold *h)
{
    int rc;

    if (!dlock__zk_hold_copy(be, req->token, h))
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
    dlock__zk_hold h;
    int rc = check_hold(arg, req, &h);
    free(h.node);
    return rc;
}

static int zk_extend(void *arg, const dlock_request *req)
{
    dlock__zk_be *be = arg;
    dlock__zk_hold h;
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
                dlock__zk_hold_touch(be, req->token, req->lease_ms);
        }
    }
    free(h.node);
    return rc;
}

/*
 * Renewal. ZooKeeper keeps every ephemeral node of a session as long as the
 * session, so a renewal confirms the session, not each node: per session,
 * one sync, which goes through the leader and whose reply proves the
 * session alive at its send time (the lease counts from before it, as
 * before). That a node is still there is known from its watch: an exists
 * with a watch, sent at the hold's first renewal, after a reconnect (a
 * watch set on an earlier connection is not counted on, though the client
 * sets it again) and after any event of the node (a watch fires once: a
 * change of its data ends it), and whose reply itself tells whether the
 * node is there. The session's watcher counts each event of a held node
 * and marks the hold gone at its deletion (an operator's force release),
 * and since it runs every event before the replies that came after it, the
 * sync's reply comes after the deletion event of every node deleted before
 * the sync was sent. So a hold is renewed when its watch was set on this
 * connection and no event came for it until the sync's reply; one whose
 * event came (not a deletion) is asked with an exists again; a gone one is
 * lost. A renewal of 128 watched locks is one request, not 128 ops.
 *
 * A lock whose session expired, or was cut off longer than its timeout, is
 * lost without asking. A session that is disconnected but may still be
 * alive fails the batch (DLOCK_ECONN): the core retries until the lease
 * runs out.
 */
enum { R_LOST, R_WATCHED, R_EXISTS, R_DONE };

typedef struct {
    int state;       /* R_* */
    unsigned events; /* the hold's event count when its request was sent */
    char *node;      /* R_EXISTS: the path asked */
} renew_item;

/* What the renewal needs of session s, under s->mu. */
typedef struct {
    uint64_t gen, epoch;
    int alive, connected;
    int64_t timeout_ms;
} sess_view;

static void view_of(dlock__zk_sess *s, sess_view *v)
{
    pthread_mutex_lock(&s->mu);
    v->gen = s->gen;
    v->epoch = s->conn_epoch;
    v->connected = s->connected;
    v->timeout_ms = s->timeout_ms;
    v->alive = s->zh != NULL && !s->expired &&
               dlock__zk_now_ms() < s->last_contact_ms + s->timeout_ms;
    pthread_mutex_unlock(&s->mu);
}

/* One round for session si: the sync (when a watched hold counts on it)
 * and an exists with a watch of each R_EXISTS hold, all in one go; then
 * each hold's result. Watched holds that an event or a reconnect left
 * unsure become R_EXISTS, for another round. */
static int renew_round(dlock__zk_be *be, int si, dlock_renewal *items, renew_item *st,
                       size_t n, const char **paths, size_t *idx, int *rcs)
{
    dlock__zk_sess *s = &be->sess[si];
    sess_view v, after;
    size_t m = 0;
    int sync = 0, zrc;

    view_of(s, &v);
    pthread_mutex_lock(&be->mu);
    for (size_t i = 0; i < n; i++) {
        dlock__zk_hold *h;
        if (st[i].state != R_WATCHED && st[i].state != R_EXISTS)
            continue;
        if ((h = dlock__zk_hold_get(be, items[i].req->token)) == NULL || h->gone) {
            st[i].state = R_LOST; /* released meanwhile, or deleted */
            continue;
        }
        if (h->sess != s)
            continue; /* the other session's round */
        st[i].events = h->events;
        if (st[i].state == R_WATCHED) {
            sync = 1;
        } else {
            idx[m] = i;
            paths[m++] = st[i].node;
        }
    }
    pthread_mutex_unlock(&be->mu);
    if (!sync && m == 0)
        return DLOCK_OK;
    if (!v.connected)
        return dlock_backend_fail(DLOCK_ECONN, "zk %s: disconnected; the session is kept "
                                  "while it reconnects within its timeout", be->shown);
    zrc = dlock__zk_confirm(s, sync, paths, m, rcs);
    if (zrc != ZOK)
        return dlock__zk_fail(s, zrc, "renew (sync, stat)", "the held nodes");
    view_of(s, &after);
    pthread_mutex_lock(&be->mu);
    for (size_t j = 0; j < m; j++) {
        size_t i = idx[j];
        dlock__zk_hold *h = dlock__zk_hold_get(be, items[i].req->token);
        st[i].state = R_DONE;
        if (h == NULL || h->sess != s || h->gen != v.gen || strcmp(h->node, st[i].node) != 0)
            continue; /* released meanwhile: lost to this renewal */
        if (rcs[j] == ZNONODE) {
            h->gone = 1;
            continue;
        }
        items[i].result = DLOCK_OK;
        dlock__zk_hold_touch_locked(be, h, items[i].req->lease_ms);
        /* Its watch counts from now on if it was set on this connection
         * and did not fire since. */
        if (after.epoch == v.epoch && h->events == st[i].events &&
            dlock__zk_hold_watchable(h))
            h->armed = v.epoch;
    }
    for (size_t i = 0; sync && i < n; i++) {
        dlock__zk_hold *h;
        if (st[i].state != R_WATCHED)
            continue;
        h = dlock__zk_hold_get(be, items[i].req->token);
        if (h != NULL && h->sess != s)
            continue; /* the other session's round */
        st[i].state = R_DONE;
        if (h == NULL || h->gen != v.gen || h->gone)
            continue;
        if (after.epoch != v.epoch || h->events != st[i].events || h->armed != v.epoch) {
            /* Its watch may have ended before a deletion: ask. */
            if ((st[i].node = strdup(h->node)) == NULL) {
                pthread_mutex_unlock(&be->mu);
                return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
            }
            st[i].state = R_EXISTS;
            continue;
        }
        items[i].result = DLOCK_OK;
        dlock__zk_hold_touch_locked(be, h, items[i].req->lease_ms);
    }
    pthread_mutex_unlock(&be->mu);
    return DLOCK_OK;
}

static int zk_renew(void *arg, dlock_renewal *items, size_t n)
{
    dlock__zk_be *be = arg;
    renew_item *st = calloc(n > 0 ? n : 1, sizeof(*st));
    const char **paths = calloc(n > 0 ? n : 1, sizeof(*paths));
    size_t *idx = calloc(n > 0 ? n : 1, sizeof(*idx));
    int *rcs = calloc(n > 0 ? n : 1, sizeof(*rcs));
    sess_view v[2];
    int rc = DLOCK_OK;

    if (st == NULL || paths == NULL || idx == NULL || rcs == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    view_of(&be->sess[0], &v[0]);
    view_of(&be->sess[1], &v[1]);
    pthread_mutex_lock(&be->mu);
    for (size_t i = 0; i < n; i++) {
        dlock__zk_hold *h = dlock__zk_hold_get(be, items[i].req->token);
        sess_view *sv;
        items[i].result = DLOCK_ELOST;
        st[i].state = R_LOST;
        if (h == NULL || h->gone)
            continue;
        sv = &v[h->sess == &be->sess[0] ? 0 : 1];
        /* The server promised nothing past the session's timeout, which a
         * reconnect may have shortened below the lease (fits_session). */
        if (h->gen != sv->gen || !sv->alive || items[i].req->lease_ms > sv->timeout_ms)
            continue;
        if (h->armed != 0 && h->armed == sv->epoch) {
            st[i].state = R_WATCHED;
        } else if ((st[i].node = strdup(h->node)) != NULL) {
            st[i].state = R_EXISTS;
        } else {
            pthread_mutex_unlock(&be->mu);
            rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
            goto out;
        }
    }
    pthread_mutex_unlock(&be->mu);
    /* Per session: a round, and a second for the holds the first left
     * unsure (the second only asks exists, whose replies decide). */
    for (int si = 0; si < 2 && rc == DLOCK_OK; si++)
        for (int round = 0; round < 2 && rc == DLOCK_OK; round++)
            rc = renew_round(be, si, items, st, n, paths, idx, rcs);
    for (size_t i = 0; rc == DLOCK_OK && i < n; i++)
        if (st[i].state == R_WATCHED || st[i].state == R_EXISTS)
            rc = dlock_backend_fail(DLOCK_ECONN, "zk %s: the held nodes changed while being "
                                    "renewed: trying again", be->shown);
out:
    for (size_t i = 0; st != NULL && i < n; i++)
        free(st[i].node);
    free(st);
    free(paths);
    free(idx);
    free(rcs);
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
            DLOCK_CAP_KIND(DLOCK_KIND_LEADER) | DLOCK_CAP_OWNER_IDS | DLOCK_CAP_QUEUE_FIRST,
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
    .watch_notify = dlock__zk_watch_notify,
    .status = dlock__zk_status,
    .force_release = dlock__zk_force_release,
    .list = dlock__zk_list,
    .holders = dlock__zk_holders_list,
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
