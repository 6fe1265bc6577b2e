/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Sessions: opening and keeping them, their state, digest auth, the ACL of
 * the nodes we create, errors. The calls are in zk_call.c.
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
int dlock__zk_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t deadline_ms)
{
    struct timespec ts;
    ts.tv_sec = deadline_ms / 1000;
    ts.tv_nsec = (long)(deadline_ms % 1000) * 1000000;
    return pthread_cond_timedwait(cv, mu, &ts);
}

void dlock__zk_cond_init(pthread_cond_t *cv)
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
        dlock__zk_watch_signal(w);
    }
}

static void session_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    dlock__zk_sess *s = ctx;
    uint64_t gen;

    pthread_mutex_lock(&s->mu);
    if (zh != s->zh) {
        pthread_mutex_unlock(&s->mu);
        return; /* an older handle, being closed */
    }
    gen = s->gen;
    if (type == ZOO_SESSION_EVENT) {
        if (state == ZOO_CONNECTED_STATE) {
            const clientid_t *id = zoo_client_id(zh);
            s->conn_epoch++;
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
        dlock__zk_watch_fire(s, path);
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    /* A held node's watch (zk.c, "Renewal"). Without s->mu: the holds
     * table's lock is never taken under it. This thread runs each event
     * before the replies that came after it, so a renewal that waits for a
     * reply sees the event counted. */
    if (type != ZOO_SESSION_EVENT && path != NULL)
        dlock__zk_hold_event(s->be, s, gen, type, path);
}

void dlock__zk_sess_init(dlock__zk_sess *s, dlock__zk_be *be, int64_t want_ms)
{
    memset(s, 0, sizeof(*s));
    s->be = be;
    s->want_ms = want_ms;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->qmu, NULL);
    dlock__zk_cond_init(&s->cv);
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

#define RESOLVE_DELAY_MS 5000

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
    /* The client resolves the host names each time it polls its socket,
     * by default: a getaddrinfo per request and reply, most of the client's
     * CPU while it renews thousands of locks. Once in a few seconds is
     * enough to see a DNS change (a lost connection resolves at once). */
    (void)zoo_set_servers_resolution_delay(zh, RESOLVE_DELAY_MS);
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
        if (dlock__zk_wait_until(&s->cv, &s->mu, deadline) == ETIMEDOUT)
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
