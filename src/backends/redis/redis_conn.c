/* SPDX-License-Identifier: BSD-3-Clause */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/redis/redis_conn.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/thread.h"

static const char *const tls_keys[] = {"cacert", "cert", "key", "sni", "insecure", NULL};

int dlock__redis_tls_param(const char *key)
{
    for (int i = 0; tls_keys[i] != NULL; i++)
        if (strcmp(key, tls_keys[i]) == 0)
            return 1;
    return 0;
}

int dlock__redis_tls_params(dlock__redis_endpoint *ep, const dlock_url *url)
{
    const char *insecure = dlock_url_param_get(url, "insecure");

    ep->cacert = dlock_url_param_get(url, "cacert");
    ep->cert = dlock_url_param_get(url, "cert");
    ep->key = dlock_url_param_get(url, "key");
    ep->sni = dlock_url_param_get(url, "sni");
    for (int i = 0; tls_keys[i] != NULL; i++) {
        const char *v = dlock_url_param_get(url, tls_keys[i]);
        if (v != NULL && v[0] == '\0')
            return dlock__fail(DLOCK_EINVAL, "%s URL: %s= is empty", url->scheme, tls_keys[i]);
    }
    if ((ep->cert == NULL) != (ep->key == NULL))
        return dlock__fail(DLOCK_EINVAL, "%s URL: a client certificate needs both cert=FILE "
                           "and key=FILE", url->scheme);
    if (insecure != NULL && strcmp(insecure, "0") != 0 && strcmp(insecure, "1") != 0)
        return dlock__fail(DLOCK_EINVAL, "%s URL: insecure must be 0 or 1, got '%.32s'",
                           url->scheme, insecure);
    ep->insecure = insecure != NULL && strcmp(insecure, "1") == 0;
    if (ep->insecure && (ep->cacert != NULL || ep->sni != NULL))
        return dlock__fail(DLOCK_EINVAL, "%s URL: insecure=1 verifies nothing, so cacert= and "
                           "sni= would be ignored: drop one or the other", url->scheme);
    return DLOCK_OK;
}

/* min_replicas=N (Sentinel and Cluster): WAIT N after each script that
 * writes a hold. mr: the parameter's value, NULL when not given. */
int dlock__redis_min_replicas_init(dlock__redis_conn *conn, const dlock_url *url, const char *mr)
{
    char *end;
    long v;

    if (mr == NULL)
        return DLOCK_OK;
    errno = 0;
    v = strtol(mr, &end, 10);
    if (*mr == '\0' || *end != '\0' || errno != 0 || v < 0 || v > 1000)
        return dlock__fail(DLOCK_EINVAL, "%s URL: min_replicas must be a number from 0 to "
                           "1000, got '%.32s'", url->scheme, mr);
    conn->min_replicas = (int)v;
    return DLOCK_OK;
}

int dlock__redis_conn_init(dlock__redis_conn *conn, const dlock_url *url,
                           const dlock_client_options *opts, const char *role)
{
    const char *db = NULL, *param_db;
    int rc;

    memset(conn, 0, sizeof(*conn));
    conn->tp.fd = -1;
    conn->url = url;
    conn->log = opts->log;
    conn->log_payload = opts->log_payload;
    conn->role = role;
    conn->user = url->user;
    conn->password = url->password;
    conn->ep.tls = strcmp(url->scheme, "rediss") == 0 ||
                   strcmp(url->scheme, "rediss-sentinel") == 0 ||
                   strcmp(url->scheme, "rediss-cluster") == 0;
    /* (The TLS schemes differ by an 's' inside the word: compare whole.) */
    if (strcmp(url->scheme, "redis-sentinel") == 0 ||
        strcmp(url->scheme, "rediss-sentinel") == 0) {
        if ((rc = dlock__redis_sentinel_init(conn, url)) != DLOCK_OK)
            return rc;
    } else if (strcmp(url->scheme, "redis-cluster") == 0 ||
               strcmp(url->scheme, "rediss-cluster") == 0) {
        /* redis-cluster://[user:pass@]h1:p1,h2:p2,...: the hosts are seeds,
         * any node of the cluster; the slot map says the rest. */
        if (url->nhosts == 0)
            return dlock__fail(DLOCK_EINVAL, "%s URL: no node given (expected %s://HOST:PORT,"
                               "HOST:PORT,...)", url->scheme, url->scheme);
        if (url->path != NULL && strcmp(url->path, "/") != 0)
            return dlock__fail(DLOCK_EINVAL, "%s URL: a cluster has no database number or "
                               "path, got '%.32s'", url->scheme, url->path);
        conn->is_cluster = 1;
        if ((rc = dlock__redis_min_replicas_init(conn, url, dlock_url_param_get(url, "min_replicas"))) !=
            DLOCK_OK)
            return rc;
        conn->ep.host = url->hosts[0].host;
        conn->ep.port = url->hosts[0].port != 0 ? url->hosts[0].port : 6379;
        snprintf(conn->where, sizeof(conn->where), "%s %.64s:%d", url->scheme, conn->ep.host,
                 conn->ep.port);
    } else if (strcmp(url->scheme, "unix") == 0) {
        if (url->nhosts != 0 || url->path == NULL || url->path[0] != '/')
            return dlock__fail(DLOCK_EINVAL, "unix URL: expected unix:///path/to/redis.sock");
        conn->ep.unix_path = url->path;
        snprintf(conn->where, sizeof(conn->where), "redis unix:%.100s", url->path);
    } else {
        if (url->nhosts != 1)
            return dlock__fail(DLOCK_EINVAL, "%s URL: expected exactly one host, got %zu",
                               url->scheme, url->nhosts);
        conn->ep.host = url->hosts[0].host;
        conn->ep.port = url->hosts[0].port != 0 ? url->hosts[0].port : 6379;
        if (url->path != NULL && strcmp(url->path, "/") != 0)
            db = url->path + 1;
        snprintf(conn->where, sizeof(conn->where), strchr(conn->ep.host, ':') ? "%s [%.64s]:%d"
                 : "%s %.64s:%d", conn->ep.tls ? "rediss" : "redis", conn->ep.host,
                 conn->ep.port);
    }
    /* db=N: the database on every scheme but a cluster's (one database),
     * beside the path's /N on redis:// and rediss://, never both. */
    if (!conn->is_cluster && (param_db = dlock_url_param_get(url, "db")) != NULL) {
        if (db != NULL)
            return dlock__fail(DLOCK_EINVAL, "%s URL: the database is given twice, as the "
                               "path '/%.32s' and as db=%.32s: give it once", url->scheme, db,
                               param_db);
        db = param_db;
    }
    for (size_t i = 0; i < url->nparams; i++) {
        const char *k = url->params[i].key;
        if (conn->ep.tls && dlock__redis_tls_param(k))
            continue;
        if (dlock__redis_tls_param(k))
            /* Never clear text where the user asked for TLS. */
            return dlock__fail(DLOCK_EINVAL, "%s URL: '%.32s' is a TLS parameter: use "
                               "%s://", url->scheme, k,
                               conn->master_name != NULL ? "rediss-sentinel"
                               : conn->is_cluster        ? "rediss-cluster"
                                                         : "rediss");
        if (conn->master_name != NULL && dlock__redis_sentinel_param(k))
            continue;
        if (conn->is_cluster && strcmp(k, "min_replicas") == 0)
            continue;
        if (strcmp(k, "db") != 0 || conn->is_cluster)
            return dlock__fail(DLOCK_EINVAL, "%s URL: unknown parameter '%.32s' (known: %s%s%s)",
                               url->scheme, k,
                               conn->is_cluster ? "min_replicas" : "db",
                               conn->master_name != NULL
                                   ? ", min_replicas, password, sentinel_user, "
                                     "sentinel_password" : "",
                               conn->ep.tls ? ", cacert, cert, key, sni, insecure" : "");
    }
    if (conn->ep.tls && (rc = dlock__redis_tls_params(&conn->ep, url)) != DLOCK_OK)
        return rc;
    if (db != NULL) {
        char *end;
        long v;
        errno = 0;
        v = strtol(db, &end, 10);
        if (*db == '\0' || *end != '\0' || errno != 0 || v < 0 || v > 1000000)
            return dlock__fail(DLOCK_EINVAL, "%s URL: database must be a number, got '%.32s'",
                               url->scheme, db);
        conn->db = (int)v;
    }
    snprintf(conn->client_name, sizeof(conn->client_name), "%s-%s",
             opts->client_name != NULL ? opts->client_name : "dlock", role);
    conn->connect_ms = opts->connect_timeout_ms;
    conn->command_ms = opts->command_timeout_ms;
    /* WAIT gets half of the round trip's time; the other half is the
     * script's and the network's. */
    conn->wait_ms = conn->command_ms / 2 > 0 ? conn->command_ms / 2 : 1;
    return DLOCK_OK;
}

int dlock__redis_conn_is_open(const dlock__redis_conn *conn)
{
    return dlock__redis_tp_ok(&conn->tp);
}

void dlock__redis_conn_close(dlock__redis_conn *conn)
{
    dlock__redis_tp_close(&conn->tp);
    dlock__redis_cluster_free(conn->cluster);
    conn->cluster = NULL;
}

int dlock__redis_conn_io_error(dlock__redis_conn *conn)
{
    dlock__redis_tp *tp = &conn->tp;
    int code = DLOCK_ECONN;
    char what[300];

    conn->timed_out = 0;
    if (tp->err == 0)
        return dlock__fail(DLOCK_ECONN, "%s: not connected", conn->where);
    switch (conn->refused ? -1 : tp->err) {
    case -1:
        /* bounded_functions or get_reply refused the reply. */
        code = DLOCK_EPROTO;
        if (conn->refused == DLOCK__REDIS_REFUSED_ELEMENTS)
            snprintf(what, sizeof(what), "reply with more than %d array elements, refused",
                     DLOCK__REDIS_MAX_REPLY_ELEMENTS);
        else
            snprintf(what, sizeof(what), "reply string or line longer than %d bytes, refused "
                     "(connection dropped)", DLOCK__REDIS_MAX_REPLY_BYTES);
        break;
    case REDIS_ERR_OOM:
        code = DLOCK_ENOMEM;
        snprintf(what, sizeof(what), "out of memory");
        break;
    case REDIS_ERR_PROTOCOL:
        code = DLOCK_EPROTO;
        snprintf(what, sizeof(what), "not a Redis reply (%s)", tp->errstr);
        break;
    default:
        /* TLS failures: a certificate, CA or name the other side refused
         * is an authentication failure, an unreadable file a bad setting;
         * neither goes away by trying again. */
        if (tp->auth)
            code = DLOCK_EAUTH;
        else if (tp->config)
            code = DLOCK_EINVAL;
        conn->timed_out = tp->timed_out;
        snprintf(what, sizeof(what), "%s", tp->errstr[0] ? tp->errstr : "I/O error");
        break;
    }
    conn->refused = 0;
    dlock__redis_conn_close(conn);
    return dlock__fail(code, "%s: %s", conn->where, what);
}

/*
 * Copy a server's error text for a message, with the password cut out: a
 * server may quote the command it refused ("unknown command 'AUTH', with args
 * beginning with: 'user' 'secret'"), and dlock never prints a password.
 */
static const char *scrub(char *buf, size_t size, const dlock__redis_conn *conn,
                         const redisReply *r)
{
    const char *pws[2] = {conn->password, conn->sentinel_password};
    const char *in = r->str != NULL ? r->str : "";
    size_t inlen = r->str != NULL ? r->len : 0;
    size_t i = 0, o = 0;

    while (i < inlen && o + 4 < size) {
        size_t left = inlen - i, cut = 0;
        /* A password, or the start of one where the reply was cut off. */
        for (int p = 0; p < 2 && cut == 0; p++) {
            size_t pwlen = pws[p] != NULL ? strlen(pws[p]) : 0;
            if (pwlen > 0 && memcmp(in + i, pws[p], left < pwlen ? left : pwlen) == 0 &&
                (left >= pwlen || left >= 3))
                cut = left < pwlen ? left : pwlen;
        }
        if (cut > 0) {
            memcpy(buf + o, "***", 3);
            o += 3;
            i += cut;
            continue;
        }
        buf[o++] = (unsigned char)in[i] < 32 ? ' ' : in[i];
        i++;
    }
    buf[o] = '\0';
    return buf;
}

int dlock__redis_conn_reply_error(const dlock__redis_conn *conn, const redisReply *r)
{
    char text[256];
    const char *s = scrub(text, sizeof(text), conn, r);
    int n = (int)strlen(s);

    if (strncmp(s, "NOAUTH", 6) == 0 || strncmp(s, "WRONGPASS", 9) == 0 ||
        strncmp(s, "NOPERM", 6) == 0 || strstr(s, "invalid password") != NULL ||
        strstr(s, "invalid username-password") != NULL)
        return dlock__fail(DLOCK_EAUTH, "%s: authentication failed: %.*s", conn->where, n, s);
    if (strstr(s, "user executing the script can't run") != NULL)
        return dlock__fail(DLOCK_EAUTH, "%s: permission denied by the server's ACL: %.*s",
                           conn->where, n, s);
    if (strncmp(s, "OOM", 3) == 0)
        return dlock__fail(DLOCK_ESERVER, "%s: server out of memory (maxmemory reached): %.*s",
                           conn->where, n, s);
    if (strncmp(s, "READONLY", 8) == 0)
        return dlock__fail(DLOCK_ESERVER, "%s: server is a read-only replica: %.*s",
                           conn->where, n, s);
    return dlock__fail(DLOCK_ESERVER, "%s: server refused the command: %.*s", conn->where, n,
                       s);
}

/* AUTH, SELECT and CLIENT SETNAME, pipelined into one round trip. */
static int handshake(dlock__redis_conn *conn)
{
    int sent = 0, rc = DLOCK_OK;

    if (conn->password != NULL) {
        if (conn->user != NULL)
            dlock__redis_tp_append(&conn->tp, "AUTH %s %s", conn->user, conn->password);
        else
            dlock__redis_tp_append(&conn->tp, "AUTH %s", conn->password);
        sent++;
    }
    if (conn->db != 0) {
        dlock__redis_tp_append(&conn->tp, "SELECT %d", conn->db);
        sent++;
    }
    dlock__redis_tp_append(&conn->tp, "CLIENT SETNAME %s", conn->client_name);
    sent++;
    for (int i = 0; i < sent; i++) {
        redisReply *r = NULL;
        if (dlock__redis_conn_get_reply(conn, &r) != REDIS_OK)
            return dlock__redis_conn_io_error(conn);
        if (r->type == REDIS_REPLY_ERROR && rc == DLOCK_OK) {
            rc = dlock__redis_conn_reply_error(conn, r);
            if (rc == DLOCK_ESERVER && i == 0 && conn->password != NULL) {
                /* Whatever the server says to AUTH, it is an authentication
                 * failure (its text may quote the password: scrubbed). */
                char text[256];
                if (strncmp(r->str, "ERR AUTH", 8) == 0)
                    rc = dlock__fail(DLOCK_EAUTH, "%s: authentication failed: the server has "
                                     "no password set but the URL gives one", conn->where);
                else
                    rc = dlock__fail(DLOCK_EAUTH, "%s: authentication failed: AUTH refused: %s",
                                     conn->where, scrub(text, sizeof(text), conn, r));
            }
        } else if (r->type != REDIS_REPLY_STATUS && r->type != REDIS_REPLY_ERROR && rc == DLOCK_OK) {
            rc = dlock__fail(DLOCK_EPROTO, "%s: unexpected reply to the connection handshake",
                             conn->where);
        }
        freeReplyObject(r);
    }
    if (rc != DLOCK_OK)
        dlock__redis_conn_close(conn);
    return rc;
}

/*
 * hiredis' reply functions, but an array is refused (hiredis then reports
 * REDIS_ERR_OOM, and io_error tells the two apart by conn->refused) once the
 * reply being read would hold more than DLOCK__REDIS_MAX_REPLY_ELEMENTS
 * elements in all. The count restarts at each reply's outermost array.
 * (Integers outside int64_t hiredis refuses itself: "Bad integer value".)
 */
static redisReplyObjectFunctions bounded_functions;
static void *(*default_create_array)(const redisReadTask *task, int elements);
static pthread_once_t bounded_once = PTHREAD_ONCE_INIT;

static void *bounded_create_array(const redisReadTask *task, int elements)
{
    dlock__redis_conn *conn = task->privdata;

    if (task->parent == NULL)
        conn->reply_elements = 0;
    if (elements > 0)
        conn->reply_elements += (size_t)elements;
    if (conn->reply_elements > DLOCK__REDIS_MAX_REPLY_ELEMENTS) {
        conn->refused = DLOCK__REDIS_REFUSED_ELEMENTS;
        return NULL;
    }
    return default_create_array(task, elements);
}

static void bounded_functions_init(void)
{
    redisReader *reader = redisReaderCreate();

    if (reader == NULL)
        return;
    bounded_functions = *reader->fn;
    default_create_array = bounded_functions.createArray;
    bounded_functions.createArray = bounded_create_array;
    redisReaderFree(reader);
}

redisReader *dlock__redis_reader_new(dlock__redis_conn *conn)
{
    redisReader *reader;

    pthread_once(&bounded_once, bounded_functions_init);
    if (default_create_array == NULL || (reader = redisReaderCreateWithFunctions(
                                             &bounded_functions)) == NULL)
        return NULL;
    reader->privdata = conn;
    return reader;
}

int dlock__redis_conn_over_cap(dlock__redis_conn *conn)
{
    redisReader *reader = conn->tp.reader;

    if (reader == NULL || reader->len - reader->pos <= DLOCK__REDIS_MAX_REPLY_BYTES)
        return 0;
    conn->refused = DLOCK__REDIS_REFUSED_BYTES;
    dlock__redis_tp_fail(&conn->tp, REDIS_ERR_PROTOCOL, "reply too long");
    return 1;
}

int dlock__redis_conn_get_reply(dlock__redis_conn *conn, redisReply **out)
{
    dlock__redis_tp *tp = &conn->tp;
    int64_t deadline = dlock__now_ms() + conn->command_ms;
    void *r = NULL;

    *out = NULL;
    if (dlock__redis_tp_get_reply(tp, &r) != REDIS_OK)
        return REDIS_ERR;
    if (r == NULL && dlock__redis_tp_flush(tp, deadline) != REDIS_OK)
        return REDIS_ERR;
    while (r == NULL) {
        /* Each read adds at most 16 KiB: the cap is checked as it grows. */
        if (dlock__redis_tp_read(tp, deadline) != REDIS_OK ||
            dlock__redis_tp_get_reply(tp, &r) != REDIS_OK)
            return REDIS_ERR;
        if (r == NULL && dlock__redis_conn_over_cap(conn))
            return REDIS_ERR;
    }
    *out = r;
    return REDIS_OK;
}

/* Connect to conn->ep and shake hands, before deadline_ms. */
static int open_endpoint(dlock__redis_conn *conn, int64_t deadline_ms)
{
    /* The transport only: a cluster's routing state outlives its own
     * connection to any node. */
    dlock__redis_tp_close(&conn->tp);
    pthread_once(&bounded_once, bounded_functions_init);
    if (default_create_array == NULL)
        return dlock__fail(DLOCK_ENOMEM, "%s: out of memory", conn->where);
    conn->reply_elements = 0;
    conn->refused = 0;
    /* The transport's socket is close-on-exec: a program that forks and
     * execs must not hand its authenticated connection to the child. */
    if (dlock__redis_tp_open(&conn->tp, &conn->ep, deadline_ms, &bounded_functions, conn) !=
        REDIS_OK)
        return dlock__redis_conn_io_error(conn);
    return handshake(conn);
}

int dlock__redis_conn_open_endpoint(dlock__redis_conn *conn, int64_t deadline_ms)
{
    return open_endpoint(conn, deadline_ms);
}

static int connect_now(dlock__redis_conn *conn)
{
    if (conn->master_name != NULL)
        return dlock__redis_sentinel_connect(conn);
    if (conn->is_cluster)
        return dlock__redis_cluster_connect_any(conn);
    return open_endpoint(conn, dlock__now_ms() + conn->connect_ms);
}

int dlock__redis_conn_connect(dlock__redis_conn *conn)
{
    dlock__sigpipe_guard guard;
    int rc;

    if (dlock__redis_conn_is_open(conn))
        return DLOCK_OK;
    dlock__sigpipe_block(&guard);
    rc = connect_now(conn);
    dlock__sigpipe_restore(&guard);
    if (rc == DLOCK_OK && conn->connected && conn->log != NULL) {
        char msg[200];
        snprintf(msg, sizeof(msg), "%s: connected again (%s connection)", conn->where,
                 conn->role);
        conn->log(DLOCK_LOG_INFO, msg, conn->log_payload);
    }
    if (rc == DLOCK_OK)
        conn->connected = 1;
    return rc;
}

static int bad_wait(const dlock__redis_conn *conn, const redisReply *w)
{
    return dlock__fail(DLOCK_EPROTO, "%s: unexpected reply to WAIT (type %d)", conn->where,
                       w->type);
}

/* What the last script's WAIT found, for dlock__redis_wait_short. */
static _Thread_local struct {
    int short_of;
    long long acked;
    int wanted;
    long long wait_ms;
    char where[128];
    int code;        /* not DLOCK_OK: WAIT itself was refused, */
    char error[320]; /* with this message */
} wait_result;

int dlock__redis_wait_short(void)
{
    return wait_result.short_of;
}

void dlock__redis_wait_clear(void)
{
    wait_result.short_of = 0;
}

int dlock__redis_wait_reply(const dlock__redis_conn *conn, const redisReply *w)
{
    if (w->type == REDIS_REPLY_ERROR) {
        /* WAIT refused (an ACL user without it): the script's write stands
         * on the master, acknowledged by no one we know of. Short, so that
         * the caller gives a hold back as for too few replicas, and fails
         * with WAIT's own error (dlock__redis_wait_fail). */
        wait_result.code = dlock__redis_conn_reply_error(conn, w);
        snprintf(wait_result.error, sizeof(wait_result.error), "%s", dlock_error_message());
        wait_result.short_of = 1;
        wait_result.acked = 0;
    } else if (w->type != REDIS_REPLY_INTEGER) {
        return bad_wait(conn, w);
    } else {
        wait_result.code = DLOCK_OK;
        wait_result.short_of = w->integer < conn->min_replicas;
        wait_result.acked = w->integer;
    }
    wait_result.wanted = conn->min_replicas;
    wait_result.wait_ms = conn->wait_ms;
    snprintf(wait_result.where, sizeof(wait_result.where), "%s", conn->where);
    return DLOCK_OK;
}

int dlock__redis_wait_fail(const char *what)
{
    if (wait_result.code != DLOCK_OK)
        return dlock__fail(wait_result.code, "%s (WAIT, for min_replicas=%d): %s",
                           wait_result.error, wait_result.wanted, what);
    return dlock__fail(DLOCK_ESERVER, "%s: %lld of %d replicas acknowledged the write within "
                       "%lld ms (min_replicas=%d): %s", wait_result.where, wait_result.acked,
                       wait_result.wanted, wait_result.wait_ms, wait_result.wanted, what);
}

/* Send one command (then WAIT min_replicas, when wait) and read its
 * reply (and WAIT's, into wait_result). */
int dlock__redis_conn_command_once(dlock__redis_conn *conn, redisReply **out, int argc,
                                   const char **argv, const size_t *lens, int wait)
{
    dlock__sigpipe_guard guard;
    redisReply *r = NULL, *w = NULL;
    int rc = DLOCK_OK;
    /* OpenSSL writes with write(2) (and may write while it reads): a server
     * gone away must not raise SIGPIPE in the application. Clear text needs
     * no guard, its send(2) has MSG_NOSIGNAL (redis_transport.c): that
     * spares each command four system calls. */
    int guarded = conn->tp.ssl != NULL;

    *out = NULL;
    conn->readonly = 0;
    conn->redirect[0] = '\0';
    if (guarded)
        dlock__sigpipe_block(&guard);
    if (dlock__redis_tp_append_argv(&conn->tp, argc, argv, lens) != REDIS_OK ||
        (wait && dlock__redis_tp_append(&conn->tp, "WAIT %d %lld", conn->min_replicas,
                                        (long long)conn->wait_ms) != REDIS_OK) ||
        dlock__redis_conn_get_reply(conn, &r) != REDIS_OK ||
        (wait && dlock__redis_conn_get_reply(conn, &w) != REDIS_OK)) {
        if (guarded)
            dlock__sigpipe_restore(&guard);
        if (r != NULL)
            freeReplyObject(r);
        return dlock__redis_conn_io_error(conn);
    }
    if (guarded)
        dlock__sigpipe_restore(&guard);
    if (r->type == REDIS_REPLY_ERROR) {
        rc = dlock__redis_conn_reply_error(conn, r);
        /* A master demoted by a failover answers writes with READONLY (a
         * script's with "... READONLY ..."). */
        conn->readonly = strstr(r->str, "READONLY") != NULL;
        /* Cluster redirections: the router follows them (redis_cluster.c). */
        if (strncmp(r->str, "MOVED ", 6) == 0 || strncmp(r->str, "ASK ", 4) == 0 ||
            strncmp(r->str, "TRYAGAIN", 8) == 0 || strncmp(r->str, "CLUSTERDOWN", 11) == 0)
            snprintf(conn->redirect, sizeof(conn->redirect), "%.*s",
                     (int)(r->len < sizeof(conn->redirect) - 1 ? r->len
                                                               : sizeof(conn->redirect) - 1),
                     r->str);
        /* Keep NOSCRIPT apart: the caller reloads the script. */
        if (r->len >= 8 && strncmp(r->str, "NOSCRIPT", 8) == 0)
            rc = DLOCK_ENOTSUP;
    } else if (wait) {
        rc = dlock__redis_wait_reply(conn, w);
    }
    return dlock__redis_reply_keep(rc, r, w, out);
}

int dlock__redis_reply_keep(int rc, redisReply *r, redisReply *w, redisReply **out)
{
    if (w != NULL)
        freeReplyObject(w);
    if (rc != DLOCK_OK) {
        freeReplyObject(r);
        return rc;
    }
    *out = r;
    return DLOCK_OK;
}

static int command(dlock__redis_conn *conn, redisReply **out, int argc, const char **argv,
                   const size_t *lens, int wait, int slot)
{
    int reused = dlock__redis_conn_is_open(conn);
    int rc;

    *out = NULL;
    if (conn->is_cluster)
        return dlock__redis_cluster_command(conn, out, argc, argv, lens, slot, wait);
    if ((rc = dlock__redis_conn_connect(conn)) != DLOCK_OK)
        return rc;
    rc = dlock__redis_conn_command_once(conn, out, argc, argv, lens, wait);
    if (conn->master_name != NULL && ((rc == DLOCK_ECONN && !conn->timed_out) ||
                                      conn->readonly)) {
        /* A failover: the master died or was demoted. Ask the sentinels
         * again (within the connect timeout) and send once more. */
        dlock__redis_conn_close(conn);
        if ((rc = dlock__redis_conn_connect(conn)) != DLOCK_OK)
            return rc;
        rc = dlock__redis_conn_command_once(conn, out, argc, argv, lens, wait);
    } else if (rc == DLOCK_ECONN && reused && !conn->timed_out) {
        /* The connection was dead before we used it (server restart, idle
         * timeout): one fresh try, then report. Not after a timeout: a
         * silent server would make the call take twice the timeout. */
        if ((rc = dlock__redis_conn_connect(conn)) != DLOCK_OK)
            return rc;
        rc = dlock__redis_conn_command_once(conn, out, argc, argv, lens, wait);
    }
    return rc;
}

int dlock__redis_conn_command(dlock__redis_conn *conn, redisReply **out, int argc,
                              const char **argv, const size_t *lens)
{
    /* The key of the commands sent here (GET KEY) is the first argument;
     * SCAN has none. */
    int slot = argc >= 2 && strcmp(argv[0], "SCAN") != 0
                   ? (int)dlock__redis_key_slot(argv[1], lens[1]) : -1;

    return command(conn, out, argc, argv, lens, 0, slot);
}

int dlock__redis_conn_command_wait(dlock__redis_conn *conn, redisReply **out, int argc,
                                   const char **argv, const size_t *lens, int wait)
{
    return command(conn, out, argc, argv, lens, wait, -1);
}

int dlock__redis_conn_command_slot(dlock__redis_conn *conn, redisReply **out, int argc,
                                   const char **argv, const size_t *lens, int slot)
{
    return command(conn, out, argc, argv, lens, 0, slot);
}

void dlock__redis_script_cmd_eval(dlock__redis_script_cmd *c, const dlock__redis_script *script)
{
    c->av[0] = "EVAL";
    c->al[0] = 4;
    c->av[1] = script->body;
    c->al[1] = script->len;
}

int dlock__redis_script_cmd_init(dlock__redis_script_cmd *c, const dlock__redis_script *script,
                                 int eval, int nkeys, int argc, const char **argv,
                                 const size_t *lens)
{
    c->av = c->stack_av;
    c->al = c->stack_al;
    c->argc = argc + 3;
    if (c->argc > 19) {
        c->av = malloc((size_t)c->argc * sizeof(*c->av));
        c->al = malloc((size_t)c->argc * sizeof(*c->al));
        if (c->av == NULL || c->al == NULL) {
            free(c->av);
            free(c->al);
            c->av = NULL;
            c->al = NULL;
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        }
    }
    c->av[0] = "EVALSHA";
    c->al[0] = 7;
    c->av[1] = script->sha1;
    c->al[1] = 40;
    c->av[2] = c->numkeys;
    c->al[2] = dlock__fmt_ll(c->numkeys, nkeys);
    memcpy(c->av + 3, argv, (size_t)argc * sizeof(*c->av));
    memcpy(c->al + 3, lens, (size_t)argc * sizeof(*c->al));
    if (eval)
        dlock__redis_script_cmd_eval(c, script);
    return DLOCK_OK;
}

void dlock__redis_script_cmd_free(dlock__redis_script_cmd *c)
{
    if (c->av != c->stack_av) {
        free(c->av);
        free(c->al);
    }
}

/* The scripts that write a hold (take, extend or renew one): with
 * min_replicas, WAIT follows them. */
static int writes_hold(const dlock__redis_script *script)
{
    static const dlock__redis_script *const holds[] = {
        &dlock__redis_script_acquire,     &dlock__redis_script_extend,
        &dlock__redis_script_excl_acquire, &dlock__redis_script_rw_acquire,
        &dlock__redis_script_sem_acquire, &dlock__redis_script_family_renew,
        &dlock__redis_script_multi_acquire};

    for (size_t i = 0; i < sizeof(holds) / sizeof(holds[0]); i++)
        if (holds[i] == script)
            return 1;
    return 0;
}

int dlock__redis_script_waits(const dlock__redis_conn *conn, const dlock__redis_script *script)
{
    return conn->min_replicas > 0 && writes_hold(script);
}

int dlock__redis_script_send(const dlock__redis_script *script, redisReply **out, int nkeys,
                             int argc, const char **argv, const size_t *lens,
                             dlock__redis_send_fn send, void *ctx)
{
    dlock__redis_script_cmd c;
    int rc;

    if ((rc = dlock__redis_script_cmd_init(&c, script, 0, nkeys, argc, argv, lens)) != DLOCK_OK)
        return rc;
    rc = send(ctx, out, c.argc, c.av, c.al);
    if (rc == DLOCK_ENOTSUP) {
        /* NOSCRIPT: the server restarted or flushed its script cache. EVAL
         * runs the script and caches it for the next EVALSHA. */
        dlock__redis_script_cmd_eval(&c, script);
        rc = send(ctx, out, c.argc, c.av, c.al);
        if (rc == DLOCK_OK)
            dlock__clear_error(); /* the NOSCRIPT was handled */
    }
    dlock__redis_script_cmd_free(&c);
    return rc;
}

/* dlock__redis_conn_script's way to send: command() with its WAIT and slot. */
typedef struct {
    dlock__redis_conn *conn;
    int wait, slot;
} conn_send;

static int send_on_conn(void *ctx, redisReply **out, int argc, const char **argv,
                        const size_t *lens)
{
    conn_send *cs = ctx;

    return command(cs->conn, out, argc, argv, lens, cs->wait, cs->slot);
}

int dlock__redis_conn_script(dlock__redis_conn *conn, const dlock__redis_script *script,
                             redisReply **out, int nkeys, int argc, const char **argv,
                             const size_t *lens)
{
    /* A script's keys all share one slot (redis_family.c, redis.c): the
     * first one routes it. */
    conn_send cs = {conn, dlock__redis_script_waits(conn, script),
                    nkeys > 0 ? (int)dlock__redis_key_slot(argv[0], lens[0]) : -1};

    wait_result.short_of = 0;
    return dlock__redis_script_send(script, out, nkeys, argc, argv, lens, send_on_conn, &cs);
}
