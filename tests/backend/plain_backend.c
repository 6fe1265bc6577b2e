/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * plainredis: about the simplest backend the conformance suite can run, kept
 * outside the library and built on <dlock/dlock.h>, <dlock/sys/backend.h>
 * and hiredis only. Plain mutexes, one Redis server, no hand-off, no queue.
 *
 * Keys, for lock NAME (key_prefix is not used: the keys are fixed):
 *   plain:{NAME}           the lock: the holder's token, the lease as its PX
 *   plain:{NAME}:fence     the fence counter, INCR'd by every acquisition
 *   plain:{NAME}:released  the channel a release is announced on
 *
 * Connections: "cmd" for callers, one command at a time under be->mu;
 * "wd" for renew, the watchdog thread's alone (so no lock); and one per
 * watch, SUBSCRIBEd to its lock's channel, the waiter's alone. Each is
 * opened when first needed and, once broken, freed and opened again on
 * next use. Every connect is bounded by connect_timeout_ms and every reply
 * by command_timeout_ms.
 *
 * Waiting: every waiter on a name is woken by each release (pub/sub
 * broadcasts); the losers find the lock taken and sleep again. Nothing is
 * queued on the server, so a waiter that gives up leaves nothing behind but
 * a lock a try whose reply was lost may have taken (watch_end gives it back).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "plain_backend.h"

/* "plain:{" NAME "}:released" and a NUL. */
#define KEY_MAX (DLOCK_NAME_MAX + 32)

typedef struct {
    char *host;
    int port;
    char where[96]; /* "plainredis HOST:PORT", for messages */
    struct timeval connect_tv, command_tv;
    pthread_mutex_t mu; /* guards cmd */
    redisContext *cmd;
    redisContext *wd;
} plain_be;

typedef struct {
    redisContext *sub;  /* SUBSCRIBEd to channel; NULL while broken */
    int wake_fd;        /* eventfd: watch_wake rings it */
    char *name;
    char *lost_token;   /* the token of the last try if its outcome is unknown */
    char channel[KEY_MAX];
} plain_watch;

/* ---- scripts ------------------------------------------------------------ */

/* KEYS[1] the lock, KEYS[2] its fence counter; ARGV[1] token, ARGV[2] lease (ms).
 * Returns {1, fence} held, {0, pttl} held by another. A lock never exists
 * without its fence: if INCR fails the lock is taken back. */
static const char acquire_lua[] =
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
    "  local ok, fence = pcall(redis.call, 'INCR', KEYS[2])\n"
    "  if not ok then\n"
    "    redis.call('DEL', KEYS[1])\n"
    "    return redis.error_reply('fence counter ' .. KEYS[2] .. ': ' ..\n"
    "                             (type(fence) == 'table' and fence.err or tostring(fence)))\n"
    "  end\n"
    "  return {1, fence}\n"
    "end\n"
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  -- A retry after a lost reply: nobody took a fence since ours.\n"
    "  local fence = tonumber(redis.call('GET', KEYS[2]))\n"
    "  if not fence then\n"
    "    return redis.error_reply('fence counter ' .. KEYS[2] .. ' of a held lock is gone')\n"
    "  end\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  return {1, fence}\n"
    "end\n"
    "return {0, redis.call('PTTL', KEYS[1])}\n";

/* KEYS[1] the lock; ARGV[1] token, ARGV[2] channel. Returns 1 released, 0 not ours. */
static const char release_lua[] =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n"
    "redis.call('DEL', KEYS[1])\n"
    "redis.call('PUBLISH', ARGV[2], 'released')\n"
    "return 1\n";

/* KEYS[1] the lock; ARGV[1] token, ARGV[2] lease (ms). Returns 1 set, 0 not ours. */
static const char extend_lua[] =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end\n"
    "redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "return 1\n";

/* KEYS[i] lock i; ARGV[2i-1] its token, ARGV[2i] its lease (ms).
 * Returns {r1 .. rn}: 1 renewed, 0 not ours. */
static const char renew_lua[] =
    "local out = {}\n"
    "for i = 1, #KEYS do\n"
    "  if redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then\n"
    "    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])\n"
    "    out[i] = 1\n"
    "  else\n"
    "    out[i] = 0\n"
    "  end\n"
    "end\n"
    "return out\n";

/* KEYS[1] the lock, KEYS[2] its fence counter; ARGV[1] "force" to delete
 * the lock, ARGV[2] channel. Returns {held, pttl, fence}; fence -1 when the
 * counter is not a number. */
static const char status_lua[] =
    "local pttl = redis.call('PTTL', KEYS[1])\n"
    "local fence = tonumber(redis.call('GET', KEYS[2]) or '0') or -1\n"
    "if pttl == -2 then return {0, 0, fence} end\n"
    "if ARGV[1] == 'force' then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  redis.call('PUBLISH', ARGV[2], 'released')\n"
    "end\n"
    "return {1, pttl, fence}\n";

/* ---- connections -------------------------------------------------------- */

static struct timeval to_tv(int64_t ms)
{
    struct timeval tv;

    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    return tv;
}

/* hiredis writes with write(2): a server that went away must not kill the
 * program with SIGPIPE. Block it around each write, and swallow one we
 * raised. */
typedef struct {
    sigset_t old;
    int was_pending;
} pipe_guard;

static void sigpipe_block(pipe_guard *g)
{
    sigset_t set, pending;

    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
    sigpending(&pending);
    g->was_pending = sigismember(&pending, SIGPIPE);
}

static void sigpipe_restore(pipe_guard *g)
{
    sigset_t set, pending;
    struct timespec zero = {0, 0};

    sigpending(&pending);
    if (!g->was_pending && sigismember(&pending, SIGPIPE)) {
        sigemptyset(&set);
        sigaddset(&set, SIGPIPE);
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* Report c's I/O failure and free it: the next use reconnects. */
static int io_fail(const plain_be *be, redisContext **slot)
{
    redisContext *c = *slot;
    int rc;

    if (c->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK))
        rc = dlock_backend_fail(DLOCK_ECONN, "%s: no reply within %lld ms", be->where,
                                (long long)be->command_tv.tv_sec * 1000 +
                                    be->command_tv.tv_usec / 1000);
    else if (c->err == REDIS_ERR_PROTOCOL)
        rc = dlock_backend_fail(DLOCK_EPROTO, "%s: not a Redis reply (%s)", be->where, c->errstr);
    else if (c->err == REDIS_ERR_OOM)
        rc = dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
    else
        rc = dlock_backend_fail(DLOCK_ECONN, "%s: %s", be->where,
                                c->errstr[0] ? c->errstr : "connection lost");
    redisFree(c);
    *slot = NULL;
    return rc;
}

static int connect_slot(const plain_be *be, redisContext **slot)
{
    redisContext *c;
    int rc;

    if (*slot != NULL)
        return DLOCK_OK;
    c = redisConnectWithTimeout(be->host, be->port, be->connect_tv);
    if (c == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
    if (c->err) {
        rc = dlock_backend_fail(DLOCK_ECONN, "%s: cannot connect: %s", be->where, c->errstr);
        redisFree(c);
        return rc;
    }
    /* hiredis 0.14 leaves the socket inheritable; a child must not get it. */
    fcntl(c->fd, F_SETFD, fcntl(c->fd, F_GETFD) | FD_CLOEXEC);
    if (redisSetTimeout(c, be->command_tv) != REDIS_OK) {
        *slot = c;
        return io_fail(be, slot);
    }
    *slot = c;
    return DLOCK_OK;
}

/*
 * One command on *slot (connected first if need be). *unknown (may be NULL)
 * is set when the command may have run on the server although no reply came
 * back. A server's error reply is DLOCK_ESERVER.
 */
static int command(const plain_be *be, redisContext **slot, redisReply **out, int argc,
                   const char **argv, const size_t *lens, int *unknown)
{
    pipe_guard g;
    redisReply *r;
    int rc;

    *out = NULL;
    if (unknown != NULL)
        *unknown = 0;
    if ((rc = connect_slot(be, slot)) != DLOCK_OK)
        return rc;
    sigpipe_block(&g);
    r = redisCommandArgv(*slot, argc, argv, lens);
    sigpipe_restore(&g);
    if (r == NULL) {
        if (unknown != NULL)
            *unknown = 1;
        return io_fail(be, slot);
    }
    if (r->type == REDIS_REPLY_ERROR) {
        rc = dlock_backend_fail(DLOCK_ESERVER, "%s: server refused the command: %.200s",
                                be->where, r->str);
        freeReplyObject(r);
        return rc;
    }
    *out = r;
    return DLOCK_OK;
}

/* EVAL script with nkeys keys, then the other strings of args[0..n-1]. */
static int eval(const plain_be *be, redisContext **slot, const char *script, int nkeys,
                const char *const *args, size_t n, redisReply **out, int *unknown)
{
    const char **argv = malloc((n + 3) * sizeof(*argv));
    size_t *lens = malloc((n + 3) * sizeof(*lens));
    char numkeys[16];
    int rc;

    if (argv == NULL || lens == NULL) {
        free(argv);
        free(lens);
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
    }
    snprintf(numkeys, sizeof(numkeys), "%d", nkeys);
    argv[0] = "EVAL";
    argv[1] = script;
    argv[2] = numkeys;
    for (size_t i = 0; i < n; i++)
        argv[3 + i] = args[i];
    for (size_t i = 0; i < n + 3; i++)
        lens[i] = strlen(argv[i]);
    rc = command(be, slot, out, (int)(n + 3), argv, lens, unknown);
    free(argv);
    free(lens);
    return rc;
}

/* eval on the callers' connection. */
static int cmd_eval(plain_be *be, const char *script, int nkeys, const char *const *args,
                    size_t n, redisReply **out, int *unknown)
{
    int rc;

    pthread_mutex_lock(&be->mu);
    rc = eval(be, &be->cmd, script, nkeys, args, n, out, unknown);
    pthread_mutex_unlock(&be->mu);
    return rc;
}

static int bad_reply(const plain_be *be, redisReply *r, const char *what)
{
    freeReplyObject(r);
    return dlock_backend_fail(DLOCK_EPROTO, "%s: unexpected reply to %s", be->where, what);
}

/* "plain:{NAME}" and a suffix. */
static int make_key(char *buf, const plain_be *be, const char *name, const char *suffix)
{
    if (strlen(name) > DLOCK_NAME_MAX)
        return dlock_backend_fail(DLOCK_EINVAL, "%s: lock name longer than %d bytes", be->where,
                                  DLOCK_NAME_MAX);
    snprintf(buf, KEY_MAX, "plain:{%s}%s", name, suffix);
    return DLOCK_OK;
}

/* ---- open / close ------------------------------------------------------- */

static void plain_close(void *arg)
{
    plain_be *be = arg;

    if (be == NULL)
        return;
    if (be->cmd != NULL)
        redisFree(be->cmd);
    if (be->wd != NULL)
        redisFree(be->wd);
    pthread_mutex_destroy(&be->mu);
    free(be->host);
    free(be);
}

static int plain_open(void **out, const dlock_url *url, const dlock_client_options *opts)
{
    plain_be *be;
    redisReply *r;
    const char *ping = "PING";
    size_t ping_len = 4;
    int rc;

    *out = NULL;
    if (url->nhosts != 1)
        return dlock_backend_fail(DLOCK_EINVAL, "plainredis URL: expected one host, got %zu",
                                  url->nhosts);
    if (url->user != NULL || url->password != NULL || url->nparams != 0 ||
        (url->path != NULL && strcmp(url->path, "") != 0 && strcmp(url->path, "/") != 0))
        return dlock_backend_fail(DLOCK_EINVAL, "%s: plainredis takes host and port only",
                                  url->redacted);
    if ((be = calloc(1, sizeof(*be))) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    if (pthread_mutex_init(&be->mu, NULL) != 0) {
        free(be);
        return dlock_backend_fail(DLOCK_ENOMEM, "cannot create a mutex");
    }
    if ((be->host = strdup(url->hosts[0].host)) == NULL) {
        plain_close(be);
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    }
    be->port = url->hosts[0].port != 0 ? url->hosts[0].port : 6379;
    snprintf(be->where, sizeof(be->where),
             strchr(be->host, ':') != NULL ? "plainredis [%.64s]:%d" : "plainredis %.64s:%d",
             be->host, be->port);
    be->connect_tv = to_tv(opts != NULL ? opts->connect_timeout_ms : 2000);
    be->command_tv = to_tv(opts != NULL ? opts->command_timeout_ms : 5000);

    /* Connect now, so that a wrong address is reported by open. */
    if ((rc = command(be, &be->cmd, &r, 1, &ping, &ping_len, NULL)) != DLOCK_OK) {
        plain_close(be);
        return rc;
    }
    if (r->type != REDIS_REPLY_STATUS || strcmp(r->str, "PONG") != 0) {
        rc = bad_reply(be, r, "PING");
        plain_close(be);
        return rc;
    }
    freeReplyObject(r);
    *out = be;
    return DLOCK_OK;
}

/* ---- the lock ----------------------------------------------------------- */

static int plain_acquire(void *arg, const dlock_request *req, void *watch,
                         dlock_acquire_result *out)
{
    plain_be *be = arg;
    plain_watch *w = watch;
    char lock[KEY_MAX], counter[KEY_MAX], lease[24];
    const char *args[4] = {lock, counter, req->token, lease};
    redisReply *r;
    long long a, b;
    int rc, unknown = 0;

    if ((rc = make_key(lock, be, req->name, "")) != DLOCK_OK ||
        (rc = make_key(counter, be, req->name, ":fence")) != DLOCK_OK)
        return rc;
    snprintf(lease, sizeof(lease), "%lld", (long long)req->lease_ms);
    rc = cmd_eval(be, acquire_lua, 2, args, 4, &r, &unknown);
    if (w != NULL) {
        /* The lock this try may have taken is ours to give back if the
         * waiter gives up (watch_end); any answer settles it. */
        free(w->lost_token);
        w->lost_token = unknown ? strdup(req->token) : NULL;
    }
    if (rc != DLOCK_OK)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER)
        return bad_reply(be, r, "the acquire script");
    a = r->element[0]->integer;
    b = r->element[1]->integer;
    freeReplyObject(r);
    if (a == 1) {
        if (b <= 0)
            return dlock_backend_fail(DLOCK_EPROTO, "%s: fence %lld for %s is not positive",
                                      be->where, b, lock);
        out->fence = (uint64_t)b;
        return DLOCK_OK;
    }
    /* PTTL: -1 no expiry (unknown), -2 the key vanished just now. */
    out->retry_ms = b == -2 ? 0 : b < 0 ? -1 : b;
    return DLOCK_EBUSY;
}

/* Run an owner-checked script whose reply is 1 done, 0 not ours. */
static int owned(plain_be *be, const char *script, const char *const *args, size_t n,
                 const char *what)
{
    redisReply *r;
    long long v;
    int rc;

    if ((rc = cmd_eval(be, script, 1, args, n, &r, NULL)) != DLOCK_OK)
        return rc;
    if (r->type != REDIS_REPLY_INTEGER)
        return bad_reply(be, r, what);
    v = r->integer;
    freeReplyObject(r);
    return v == 1 ? DLOCK_OK : DLOCK_ELOST;
}

static int release_token(plain_be *be, const char *name, const char *token)
{
    char lock[KEY_MAX], chan[KEY_MAX];
    const char *args[3] = {lock, token, chan};
    int rc;

    if ((rc = make_key(lock, be, name, "")) != DLOCK_OK ||
        (rc = make_key(chan, be, name, ":released")) != DLOCK_OK)
        return rc;
    return owned(be, release_lua, args, 3, "the release script");
}

static int plain_release(void *arg, const dlock_request *req)
{
    return release_token(arg, req->name, req->token);
}

static int plain_extend(void *arg, const dlock_request *req)
{
    plain_be *be = arg;
    char lock[KEY_MAX], lease[24];
    const char *args[3] = {lock, req->token, lease};
    int rc;

    if ((rc = make_key(lock, be, req->name, "")) != DLOCK_OK)
        return rc;
    snprintf(lease, sizeof(lease), "%lld", (long long)req->lease_ms);
    return owned(be, extend_lua, args, 3, "the extend script");
}

static int plain_check(void *arg, const dlock_request *req)
{
    plain_be *be = arg;
    char lock[KEY_MAX];
    const char *argv[2] = {"GET", lock};
    size_t lens[2];
    redisReply *r;
    int rc;

    if ((rc = make_key(lock, be, req->name, "")) != DLOCK_OK)
        return rc;
    lens[0] = 3;
    lens[1] = strlen(lock);
    pthread_mutex_lock(&be->mu);
    rc = command(be, &be->cmd, &r, 2, argv, lens, NULL);
    pthread_mutex_unlock(&be->mu);
    if (rc != DLOCK_OK)
        return rc;
    if (r->type == REDIS_REPLY_NIL)
        rc = DLOCK_ELOST;
    else if (r->type != REDIS_REPLY_STRING)
        return bad_reply(be, r, "GET");
    else
        rc = strlen(req->token) == r->len && memcmp(r->str, req->token, r->len) == 0
                 ? DLOCK_OK
                 : DLOCK_ELOST;
    freeReplyObject(r);
    return rc;
}

/* The watchdog thread's only: on be->wd, without be->mu. */
static int plain_renew(void *arg, dlock_renewal *items, size_t n)
{
    plain_be *be = arg;
    char (*keys)[KEY_MAX] = NULL, (*leases)[24] = NULL;
    const char **args = NULL;
    redisReply *r = NULL;
    int rc;

    if (n == 0)
        return DLOCK_OK;
    keys = malloc(n * sizeof(*keys));
    leases = malloc(n * sizeof(*leases));
    args = malloc(3 * n * sizeof(*args));
    if (keys == NULL || leases == NULL || args == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if ((rc = make_key(keys[i], be, items[i].req->name, "")) != DLOCK_OK)
            goto done;
        snprintf(leases[i], sizeof(leases[i]), "%lld", (long long)items[i].req->lease_ms);
        args[i] = keys[i];
        args[n + 2 * i] = items[i].req->token;
        args[n + 2 * i + 1] = leases[i];
    }
    if ((rc = eval(be, &be->wd, renew_lua, (int)n, args, 3 * n, &r, NULL)) != DLOCK_OK)
        goto done;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != n) {
        rc = bad_reply(be, r, "the renew script");
        r = NULL;
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (r->element[i]->type != REDIS_REPLY_INTEGER) {
            rc = bad_reply(be, r, "the renew script");
            r = NULL;
            goto done;
        }
        items[i].result = r->element[i]->integer == 1 ? DLOCK_OK : DLOCK_ELOST;
    }
done:
    if (r != NULL)
        freeReplyObject(r);
    free(keys);
    free(leases);
    free(args);
    return rc;
}

static int read_status(plain_be *be, const char *name, const char *mode, dlock_lock_info *out)
{
    char lock[KEY_MAX], counter[KEY_MAX], chan[KEY_MAX];
    const char *args[4] = {lock, counter, mode, chan};
    redisReply *r;
    int rc;

    if ((rc = make_key(lock, be, name, "")) != DLOCK_OK ||
        (rc = make_key(counter, be, name, ":fence")) != DLOCK_OK ||
        (rc = make_key(chan, be, name, ":released")) != DLOCK_OK)
        return rc;
    if ((rc = cmd_eval(be, status_lua, 2, args, 4, &r, NULL)) != DLOCK_OK)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3)
        return bad_reply(be, r, "the status script");
    for (size_t i = 0; i < 3; i++)
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            return bad_reply(be, r, "the status script");
    if (r->element[2]->integer < 0) {
        freeReplyObject(r);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: fence counter %s is not a number",
                                  be->where, counter);
    }
    out->held = r->element[0]->integer == 1;
    out->ttl_ms = out->held ? r->element[1]->integer : 0;
    out->fence = (uint64_t)r->element[2]->integer;
    freeReplyObject(r);
    return DLOCK_OK;
}

static int plain_status(void *arg, const char *name, dlock_lock_info *out)
{
    return read_status(arg, name, "read", out);
}

static int plain_force_release(void *arg, const char *name, dlock_lock_info *removed)
{
    return read_status(arg, name, "force", removed);
}

/* ---- waiting ------------------------------------------------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Open w->sub and SUBSCRIBE it; the server has confirmed when this returns OK. */
static int subscribe(const plain_be *be, plain_watch *w)
{
    const char *argv[2] = {"SUBSCRIBE", w->channel};
    size_t lens[2] = {9, strlen(w->channel)};
    redisReply *r;
    int rc;

    if ((rc = command(be, &w->sub, &r, 2, argv, lens, NULL)) != DLOCK_OK)
        return rc;
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "subscribe") != 0) {
        redisFree(w->sub);
        w->sub = NULL;
        return bad_reply(be, r, "SUBSCRIBE");
    }
    freeReplyObject(r);
    return DLOCK_OK;
}

static int plain_watch_begin(void *arg, const dlock_request *req, void **watch)
{
    plain_be *be = arg;
    plain_watch *w;
    int rc;

    *watch = NULL;
    if ((w = calloc(1, sizeof(*w))) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    w->wake_fd = -1;
    if ((rc = make_key(w->channel, be, req->name, ":released")) != DLOCK_OK)
        goto err;
    if ((w->name = strdup(req->name)) == NULL) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
        goto err;
    }
    if ((w->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
        rc = dlock_backend_fail(DLOCK_ENOMEM, "%s: cannot make an eventfd: %s", be->where,
                                strerror(errno));
        goto err;
    }
    if ((rc = subscribe(be, w)) != DLOCK_OK)
        goto err;
    *watch = w;
    return DLOCK_OK;
err:
    if (w->wake_fd >= 0)
        close(w->wake_fd);
    free(w->name);
    free(w);
    return rc;
}

/* 1 if w->sub has a message already read, 0 if not, -1 if it is broken. */
static int next_message(plain_watch *w)
{
    for (;;) {
        redisReply *r = NULL;
        int message;

        if (redisGetReplyFromReader(w->sub, (void **)&r) != REDIS_OK)
            return -1;
        if (r == NULL)
            return 0;
        message = r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
                  r->element[0]->type == REDIS_REPLY_STRING &&
                  strcmp(r->element[0]->str, "message") == 0;
        freeReplyObject(r);
        if (message)
            return 1;
    }
}

/*
 * While the subscription is broken a release may go unannounced: each
 * reconnection that works is a reason to try (DLOCK_OK), and until one
 * works the waiter looks again every second.
 */
static int plain_watch_wait(void *arg, void *watch, int64_t timeout_ms)
{
    plain_be *be = arg;
    plain_watch *w = watch;
    int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;

    for (;;) {
        struct pollfd fds[2];
        int64_t left = deadline < 0 ? -1 : deadline - now_ms();
        int nfds = 1, n;

        if (w->sub != NULL) {
            if ((n = next_message(w)) != 0) {
                if (n < 0) {
                    redisFree(w->sub);
                    w->sub = NULL;
                }
                return DLOCK_OK;
            }
        } else if (subscribe(be, w) == DLOCK_OK) {
            return DLOCK_OK;
        }
        if (deadline >= 0 && left < 0)
            left = 0;
        if (w->sub == NULL && (left < 0 || left > 1000))
            left = 1000;
        fds[0].fd = w->wake_fd;
        fds[0].events = POLLIN;
        fds[0].revents = 0;
        if (w->sub != NULL) {
            fds[1].fd = w->sub->fd;
            fds[1].events = POLLIN;
            fds[1].revents = 0;
            nfds = 2;
        }
        n = poll(fds, (nfds_t)nfds, left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno != EINTR)
            return DLOCK_OK; /* cannot sleep: let the core look */
        if (fds[0].revents & POLLIN) {
            uint64_t count;
            if (read(w->wake_fd, &count, sizeof(count)) < 0) {
                /* EAGAIN: another read took it; woken all the same. */
            }
            return DLOCK_OK;
        }
        if (nfds == 2 && fds[1].revents != 0 && redisBufferRead(w->sub) != REDIS_OK) {
            redisFree(w->sub);
            w->sub = NULL;
            return DLOCK_OK;
        }
        if (deadline >= 0 && now_ms() >= deadline)
            return DLOCK_ETIMEOUT;
    }
}

static void plain_watch_end(void *arg, void *watch)
{
    plain_watch *w = watch;

    if (w == NULL)
        return;
    if (w->lost_token != NULL) {
        /* Best effort, and the caller's message is kept: it reports why the
         * waiter gave up. If this fails, the lease runs out. */
        char saved[512];
        snprintf(saved, sizeof(saved), "%s", dlock_error_message());
        if (release_token(arg, w->name, w->lost_token) != DLOCK_OK)
            dlock_backend_fail(DLOCK_OK, "%s", saved);
        free(w->lost_token);
    }
    if (w->sub != NULL)
        redisFree(w->sub); /* the server drops the subscription with it */
    close(w->wake_fd);
    free(w->name);
    free(w);
}

static void plain_watch_wake(void *arg, void *watch)
{
    plain_watch *w = watch;
    uint64_t one = 1;

    (void)arg;
    /* EAGAIN: the counter is full, so the waiter wakes anyway. */
    if (write(w->wake_fd, &one, sizeof(one)) < 0) {
    }
}

/* ---- the table ---------------------------------------------------------- */

static const char *const plain_schemes[] = {"plainredis", NULL};

const dlock_backend plain_backend = {
    .version = DLOCK_BACKEND_VERSION,
    .size = sizeof(dlock_backend),
    .name = "plainredis",
    .schemes = plain_schemes,
    .caps = DLOCK_CAP_KIND(DLOCK_KIND_MUTEX),
    .open = plain_open,
    .close = plain_close,
    .acquire = plain_acquire,
    .release = plain_release,
    .extend = plain_extend,
    .check = plain_check,
    .renew = plain_renew,
    .watch_begin = plain_watch_begin,
    .watch_wait = plain_watch_wait,
    .watch_end = plain_watch_end,
    .watch_wake = plain_watch_wake,
    .status = plain_status,
    .force_release = plain_force_release,
};
