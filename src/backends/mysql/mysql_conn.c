/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The MySQL backend's connection job: the URL, connecting with the client
 * library's timeouts, one statement with its results drained, error codes,
 * and how names become SQL (hex literals, so no user byte is ever parsed
 * as SQL; GET_LOCK names within the server's 64 characters).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <errmsg.h>
#include <mysqld_error.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "mysql_int.h"

int64_t dlock__my_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- the URL ------------------------------------------------------------ */

static const char *const known_params[] = {
    "mode", "socket", "create", "ssl", "ssl-ca", "ssl-capath", "ssl-cert", "ssl-key",
    "ssl-cipher", "ssl-verify", "allow_cleartext", "key_secret", NULL,
};

/* A 0/1 parameter into *out: -1 when absent. */
static int flag_param(const dlock_url *url, const char *key, int *out)
{
    const char *v = dlock_url_param_get(url, key);

    *out = -1;
    if (v == NULL)
        return DLOCK_OK;
    if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return dlock_backend_fail(DLOCK_EINVAL, "%s: %s must be 0 or 1, not '%.40s'",
                                  url->redacted, key, v);
    *out = v[0] == '1';
    return DLOCK_OK;
}

static int dup_param(const dlock_url *url, const char *key, char **out)
{
    const char *v = dlock_url_param_get(url, key);

    *out = NULL;
    if (v == NULL)
        return DLOCK_OK;
    if ((*out = strdup(v)) == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

/* Seconds for the client library's timeouts, which count whole seconds:
 * rounded up, at least 1. */
static unsigned to_seconds(int64_t ms)
{
    int64_t s = (ms + 999) / 1000;

    return s < 1 ? 1 : s > 86400 ? 86400 : (unsigned)s;
}

int dlock__my_parse_url(dlock__my_be *be, const dlock_url *url, const dlock_client_options *opts)
{
    const char *mode = dlock_url_param_get(url, "mode");
    const char *prefix = opts != NULL && opts->key_prefix != NULL ? opts->key_prefix : "dlock:";
    int create, ssl, verify, cleartext, rc;

    for (size_t i = 0; i < url->nparams; i++) {
        size_t k = 0;
        while (known_params[k] != NULL && strcmp(known_params[k], url->params[i].key) != 0)
            k++;
        if (known_params[k] == NULL)
            return dlock_backend_fail(DLOCK_EINVAL,
                                      "%s: unknown parameter '%.40s' (mode, socket, create, "
                                      "ssl, ssl-ca, ssl-capath, ssl-cert, ssl-key, ssl-cipher, "
                                      "ssl-verify, allow_cleartext, key_secret)",
                                      url->redacted, url->params[i].key);
    }
    if (mode == NULL || strcmp(mode, "lease") == 0)
        be->named = 0;
    else if (strcmp(mode, "named") == 0)
        be->named = 1;
    else
        return dlock_backend_fail(DLOCK_EINVAL, "%s: mode must be lease or named, not '%.40s'",
                                  url->redacted, mode);
    if ((rc = flag_param(url, "create", &create)) != DLOCK_OK ||
        (rc = flag_param(url, "ssl", &ssl)) != DLOCK_OK ||
        (rc = flag_param(url, "ssl-verify", &verify)) != DLOCK_OK ||
        (rc = flag_param(url, "allow_cleartext", &cleartext)) != DLOCK_OK)
        return rc;
    be->create = create != 0;
    be->allow_cleartext = cleartext == 1;
    if (url->nhosts > 1)
        return dlock_backend_fail(DLOCK_EINVAL, "%s: expected one host, got %zu", url->redacted,
                                  url->nhosts);
    if (url->path == NULL || url->path[0] != '/' || url->path[1] == '\0' ||
        strchr(url->path + 1, '/') != NULL)
        return dlock_backend_fail(DLOCK_EINVAL,
                                  "%s: the URL names no database (mysql://USER:PASS@HOST:PORT/DB)",
                                  url->redacted);
    if (strlen(prefix) > DLOCK__MY_KEY_MAX - DLOCK_NAME_MAX)
        return dlock_backend_fail(DLOCK_EINVAL, "%s: key prefix longer than %d bytes",
                                  url->redacted, DLOCK__MY_KEY_MAX - DLOCK_NAME_MAX);
    if ((be->db = strdup(url->path + 1)) == NULL || (be->prefix = strdup(prefix)) == NULL ||
        (url->user != NULL && (be->user = strdup(url->user)) == NULL) ||
        (url->password != NULL && (be->password = strdup(url->password)) == NULL) ||
        (url->nhosts == 1 && (be->host = strdup(url->hosts[0].host)) == NULL))
        return dlock_backend_fail(DLOCK_ENOMEM, "out of memory");
    if ((rc = dup_param(url, "socket", &be->socket)) != DLOCK_OK ||
        (rc = dup_param(url, "ssl-ca", &be->ssl_ca)) != DLOCK_OK ||
        (rc = dup_param(url, "ssl-capath", &be->ssl_capath)) != DLOCK_OK ||
        (rc = dup_param(url, "ssl-cert", &be->ssl_cert)) != DLOCK_OK ||
        (rc = dup_param(url, "ssl-key", &be->ssl_key)) != DLOCK_OK ||
        (rc = dup_param(url, "ssl-cipher", &be->ssl_cipher)) != DLOCK_OK ||
        (rc = dup_param(url, "key_secret", &be->key_secret)) != DLOCK_OK)
        return rc;
    /* Asking for TLS in any way makes it required (dlock__my_connect checks the
     * session is encrypted); a CA given always verifies the server. */
    be->tls = ssl == 1 || verify >= 0 || be->ssl_ca != NULL || be->ssl_capath != NULL ||
              be->ssl_cert != NULL || be->ssl_key != NULL || be->ssl_cipher != NULL;
    be->ssl_verify = verify == 1 || be->ssl_ca != NULL || be->ssl_capath != NULL;
    if (ssl == 0 && be->tls)
        return dlock_backend_fail(DLOCK_EINVAL,
                                  "%s: ssl=0 with another ssl parameter, which asks for TLS: "
                                  "drop one", url->redacted);
    if (verify == 0 && be->ssl_verify)
        return dlock_backend_fail(DLOCK_EINVAL,
                                  "%s: ssl-verify=0 with ssl-ca or ssl-capath: a CA given always "
                                  "verifies the server's certificate and name (drop one)",
                                  url->redacted);
    if (be->key_secret != NULL && be->key_secret[0] == '\0')
        return dlock_backend_fail(DLOCK_EINVAL, "%s: key_secret is empty", url->redacted);
    if (be->host == NULL && be->socket == NULL)
        return dlock_backend_fail(DLOCK_EINVAL, "%s: the URL names no host (or socket=PATH)",
                                  url->redacted);
    be->port = url->nhosts == 1 && url->hosts[0].port != 0 ? (unsigned)url->hosts[0].port : 3306;
    if (be->socket != NULL)
        snprintf(be->where, sizeof(be->where), "mysql %.100s/%.64s", be->socket, be->db);
    else
        snprintf(be->where, sizeof(be->where),
                 strchr(be->host, ':') != NULL ? "mysql [%.64s]:%u/%.64s" : "mysql %.64s:%u/%.64s",
                 be->host, be->port, be->db);
    be->connect_s = to_seconds(opts != NULL ? opts->connect_timeout_ms : 2000);
    be->command_ms = opts != NULL ? opts->command_timeout_ms : 5000;
    be->read_s = be->write_s = to_seconds(be->command_ms);
    return DLOCK_OK;
}

/* ---- connections -------------------------------------------------------- */

void dlock__my_drop(MYSQL **slot)
{
    if (*slot != NULL) {
        mysql_close(*slot);
        *slot = NULL;
    }
}

/* Client errors (2000..2999) that leave the connection unusable. */
static int broken(unsigned e)
{
    return e >= 2000 && e < 3000;
}

int dlock__my_fail(dlock__my_be *be, MYSQL **slot, const char *what, int *unknown)
{
    unsigned e = mysql_errno(*slot);
    const char *text = mysql_error(*slot);
    int code;

    if (unknown != NULL)
        *unknown = 0;
    switch (e) {
    case ER_ACCESS_DENIED_ERROR:
    case ER_DBACCESS_DENIED_ERROR:
    case ER_TABLEACCESS_DENIED_ERROR:
    case ER_PROCACCESS_DENIED_ERROR:
    case 1698: /* ER_ACCESS_DENIED_NO_PASSWORD_ERROR */
        code = DLOCK_EAUTH;
        break;
    case ER_LOCK_DEADLOCK:
    case ER_LOCK_WAIT_TIMEOUT:
        code = DLOCK_ECONN; /* rolled back: try again */
        break;
    case CR_OUT_OF_MEMORY:
        code = DLOCK_ENOMEM;
        break;
    case CR_MALFORMED_PACKET:
    case CR_COMMANDS_OUT_OF_SYNC:
        code = DLOCK_EPROTO;
        break;
    default:
        code = broken(e) ? DLOCK_ECONN : DLOCK_ESERVER;
    }
    if (broken(e) && unknown != NULL && e != CR_CONNECTION_ERROR && e != CR_CONN_HOST_ERROR &&
        e != CR_UNKNOWN_HOST)
        *unknown = 1;
    if (e == CR_SERVER_LOST || e == CR_SERVER_LOST_EXTENDED)
        code = dlock_backend_fail(code, "%s: %s: no reply (lost connection or no reply within "
                                  "%u s): %.200s", be->where, what, be->read_s, text);
    else
        code = dlock_backend_fail(code, "%s: %s: %.300s (error %u)", be->where, what, text, e);
    if (broken(e))
        dlock__my_drop(slot);
    return code;
}

static int session_setup(dlock__my_be *be, MYSQL **slot)
{
    char sql[128];

    if (mysql_query(*slot, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED") != 0)
        return dlock__my_fail(be, slot, "setting up the session", NULL);
    /* A row lock waited for may not outlast the client's read timeout. */
    snprintf(sql, sizeof(sql), "SET SESSION innodb_lock_wait_timeout = %u", be->read_s);
    if (mysql_query(*slot, sql) != 0)
        return dlock__my_fail(be, slot, "setting up the session", NULL);
    return DLOCK_OK;
}

/* The authentication methods the client answers (the client library's
 * restricted_auth), so that a server, or a man in the middle, that switches
 * to another is refused before anything is sent. None of SAFE_AUTH sends
 * the password itself. caching_sha2_password and sha256_password send it
 * over TLS, or without TLS encrypted to an RSA key the server supplies
 * (anyone's, in the middle): answered only over verified TLS, a unix
 * socket or to this machine (127.0.0.0/8, ::1: no one in the middle; MySQL
 * 8's default method). mysql_clear_password and dialog (PAM's) send it as it is: only
 * with allow_cleartext=1, which allows all of these. */
#define SAFE_AUTH "mysql_native_password,client_ed25519,parsec,auth_gssapi_client"
#define SHA2_AUTH ",caching_sha2_password,sha256_password"

static const char *auth_methods(const dlock__my_be *be)
{
    if (be->allow_cleartext)
        return SAFE_AUTH SHA2_AUTH ",mysql_clear_password,dialog";
    if (be->ssl_verify || be->socket != NULL ||
        (be->host != NULL && dlock_url_host_is_local(be->host, strlen(be->host))))
        return SAFE_AUTH SHA2_AUTH;
    return SAFE_AUTH;
}

/* A connection that failed to open: its error as a DLOCK_E* code, said the
 * way the cause needs (a refused method, TLS). Closes *slot. */
static int connect_failed(dlock__my_be *be, MYSQL **slot)
{
    unsigned e = mysql_errno(*slot);
    int rc;

    /* (The library's text may name the method wrongly: not repeated.) */
    if (e == CR_PLUGIN_NOT_ALLOWED)
        rc = dlock_backend_fail(DLOCK_EAUTH,
                                "%s: cannot connect: the server asked for an authentication "
                                "method that would give the password away, refused (error %u): "
                                "mysql_clear_password and dialog send it in clear text, "
                                "caching_sha2_password and sha256_password without verified TLS "
                                "to a key the server supplies; allow_cleartext=1 allows them",
                                be->where, e);
    else if (be->tls && e == CR_SSL_CONNECTION_ERROR)
        rc = dlock_backend_fail(DLOCK_ECONN, "%s: cannot connect: TLS was required: %.300s (error "
                                "%u)", be->where, mysql_error(*slot), e);
    else
        rc = dlock__my_fail(be, slot, "cannot connect", NULL);
    dlock__my_drop(slot);
    return rc;
}

/* dlock__my_connect, with the client flags extra besides dlock's own. */
static int connect_with(dlock__my_be *be, MYSQL **out, unsigned long extra)
{
    MYSQL *c = mysql_init(NULL);
    my_bool no = 0;
    const char *cipher;
    int rc;

    *out = NULL;
    if (c == NULL)
        return dlock_backend_fail(DLOCK_ENOMEM, "%s: out of memory", be->where);
    mysql_options(c, MYSQL_OPT_CONNECT_TIMEOUT, &be->connect_s);
    mysql_options(c, MYSQL_OPT_READ_TIMEOUT, &be->read_s);
    mysql_options(c, MYSQL_OPT_WRITE_TIMEOUT, &be->write_s);
    mysql_options(c, MYSQL_OPT_RECONNECT, &no);
    mysql_options(c, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    mysql_options(c, MYSQL_READ_DEFAULT_GROUP, NULL);
    if (mysql_optionsv(c, MARIADB_OPT_RESTRICTED_AUTH, auth_methods(be)) != 0) {
        dlock__my_drop(&c);
        return dlock_backend_fail(DLOCK_ENOTSUP, "%s: the client library cannot restrict the "
                                  "authentication methods it answers (MariaDB Connector/C 3.3 "
                                  "or later needed)", be->where);
    }
    if (be->tls) {
        my_bool yes = 1, verify = (my_bool)be->ssl_verify;
        mysql_ssl_set(c, be->ssl_key, be->ssl_cert, be->ssl_ca, be->ssl_capath, be->ssl_cipher);
        mysql_options(c, MYSQL_OPT_SSL_ENFORCE, &yes);
        mysql_options(c, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &verify);
    }
    if (mysql_real_connect(c, be->socket != NULL ? "localhost" : be->host, be->user,
                           be->password, be->db, be->port, be->socket,
                           CLIENT_MULTI_RESULTS | CLIENT_FOUND_ROWS | extra) == NULL)
        return connect_failed(be, &c);
    /* The library's own enforcement is not trusted alone: a session asked
     * to be encrypted that is not goes no further. */
    if (be->tls && ((cipher = mysql_get_ssl_cipher(c)) == NULL || cipher[0] == '\0')) {
        dlock__my_drop(&c);
        return dlock_backend_fail(DLOCK_ECONN, "%s: TLS was required (an ssl parameter) but the "
                                  "session is not encrypted: refused", be->where);
    }
    {
        int fd = (int)mysql_get_socket(c);
        if (fd >= 0)
            fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
    }
    if ((rc = session_setup(be, &c)) != DLOCK_OK) {
        dlock__my_drop(&c);
        return rc;
    }
    *out = c;
    return DLOCK_OK;
}

int dlock__my_connect(dlock__my_be *be, MYSQL **out)
{
    return connect_with(be, out, 0);
}

/* The connection of *slot, opened. The wake connection takes several
 * statements in one request: the lease's release sends its UPDATE and the
 * channel's RELEASE_LOCK together (mysql_lease.c). Every statement sent on
 * it is fixed text and hex literals, nothing a caller wrote. */
static int connect_slot(dlock__my_be *be, MYSQL **slot)
{
    return connect_with(be, slot, slot == &be->wake ? CLIENT_MULTI_STATEMENTS : 0);
}

/* An idle connection has nothing to read: if it has, the server closed it
 * (or said why before it did), and a statement sent on it would be lost
 * with its outcome unknown. */
static int closed_by_server(MYSQL *c)
{
    struct pollfd pf = {.fd = (int)mysql_get_socket(c), .events = POLLIN};

    return pf.fd >= 0 && poll(&pf, 1, 0) > 0;
}

int dlock__my_query(dlock__my_be *be, MYSQL **slot, const char *sql, MYSQL_RES **res, int *unknown)
{
    return dlock__my_query_rows(be, slot, sql, res, unknown, NULL);
}

int dlock__my_query_rows(dlock__my_be *be, MYSQL **slot, const char *sql, MYSQL_RES **res,
                         int *unknown, uint64_t *affected)
{
    MYSQL_RES *first = NULL;
    int rc, more;

    if (res != NULL)
        *res = NULL;
    if (unknown != NULL)
        *unknown = 0;
    if (*slot != NULL && closed_by_server(*slot))
        dlock__my_drop(slot); /* a restart, a KILL, wait_timeout: connect again */
    if (*slot == NULL && ((slot == &be->cmd && be->cmd_tx) || (slot == &be->wd && be->wd_tx)))
        /* Not on a new connection: the transaction, and its row locks,
         * ended with the old one. */
        return dlock_backend_fail(DLOCK_ECONN, "%s: the connection ended during a transaction",
                                  be->where);
    if (*slot == NULL) {
        if ((rc = connect_slot(be, slot)) != DLOCK_OK)
            return rc;
        if (be->log != NULL)
            be->log(DLOCK_LOG_INFO, be->where, be->log_payload);
    }
    if (mysql_real_query(*slot, sql, (unsigned long)strlen(sql)) != 0)
        return dlock__my_fail(be, slot, "statement failed", unknown);
    /* Every result of the statement, the first kept: a CALL ends with a
     * status result that must be read before the next statement. */
    do {
        MYSQL_RES *r;
        /* Read before the results are drained, which resets it. */
        if (affected != NULL && mysql_field_count(*slot) == 0)
            *affected = (uint64_t)mysql_affected_rows(*slot);
        r = mysql_store_result(*slot);
        if (r == NULL && mysql_field_count(*slot) != 0) {
            if (first != NULL)
                mysql_free_result(first);
            return dlock__my_fail(be, slot, "reading the reply", unknown);
        }
        if (r != NULL) {
            if (first == NULL)
                first = r;
            else
                mysql_free_result(r);
        }
        more = mysql_next_result(*slot);
        if (more > 0) {
            if (first != NULL)
                mysql_free_result(first);
            return dlock__my_fail(be, slot, "statement failed", unknown);
        }
    } while (more == 0);
    if (res != NULL)
        *res = first;
    else if (first != NULL)
        mysql_free_result(first);
    return DLOCK_OK;
}

int dlock__my_send(dlock__my_be *be, MYSQL **slot, const char *sql)
{
    int rc;

    if (*slot != NULL && closed_by_server(*slot))
        dlock__my_drop(slot);
    if (*slot == NULL && (rc = connect_slot(be, slot)) != DLOCK_OK)
        return rc;
    if (mysql_send_query(*slot, sql, (unsigned long)strlen(sql)) != 0)
        return dlock__my_fail(be, slot, "statement failed", NULL);
    return DLOCK_OK;
}

int dlock__my_read(dlock__my_be *be, MYSQL **slot, MYSQL_RES **res)
{
    MYSQL_RES *first = NULL;
    int more;

    *res = NULL;
    if (*slot == NULL)
        return DLOCK_ECONN;
    if (mysql_read_query_result(*slot) != 0)
        return dlock__my_fail(be, slot, "reading the reply", NULL);
    do {
        MYSQL_RES *r = mysql_store_result(*slot);
        if (r == NULL && mysql_field_count(*slot) != 0)
            more = 1; /* the result could not be read */
        else {
            if (first == NULL)
                first = r;
            else if (r != NULL)
                mysql_free_result(r);
            more = mysql_next_result(*slot);
        }
        if (more > 0) {
            if (first != NULL)
                mysql_free_result(first);
            return dlock__my_fail(be, slot, "reading the reply", NULL);
        }
    } while (more == 0);
    *res = first;
    return DLOCK_OK;
}

int dlock__my_cmd(dlock__my_be *be, const char *sql, MYSQL_RES **res, int *unknown)
{
    int rc;

    pthread_mutex_lock(&be->mu);
    rc = dlock__my_query(be, &be->cmd, sql, res, unknown);
    pthread_mutex_unlock(&be->mu);
    return rc;
}

int dlock__my_row_ints(dlock__my_be *be, MYSQL_RES *res, int64_t *v, int n, int64_t def, int *found,
                       const char *what)
{
    MYSQL_ROW row;

    *found = 0;
    if (res == NULL)
        return dlock_backend_fail(DLOCK_EPROTO, "%s: %s returned no result", be->where, what);
    if (mysql_num_fields(res) < (unsigned)n) {
        mysql_free_result(res);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: %s returned %u columns, wanted %d",
                                  be->where, what, mysql_num_fields(res), n);
    }
    if ((row = mysql_fetch_row(res)) != NULL) {
        *found = 1;
        for (int i = 0; i < n; i++)
            v[i] = row[i] == NULL ? def : strtoll(row[i], NULL, 10);
    }
    mysql_free_result(res);
    return DLOCK_OK;
}

int dlock__my_list_query(dlock__my_be *be, const char *sql, unsigned ncols, dlock__my_fill_fn fill,
                         dlock_list_cb cb, void *payload)
{
    char name[DLOCK_NAME_MAX + 1];
    size_t lp = strlen(be->prefix);
    MYSQL_RES *res = NULL;
    MYSQL_ROW row;
    int rc;

    if ((rc = dlock__my_cmd(be, sql, &res, NULL)) != DLOCK_OK)
        return rc;
    if (res == NULL || mysql_num_fields(res) != ncols) {
        if (res != NULL)
            mysql_free_result(res);
        return dlock_backend_fail(DLOCK_EPROTO, "%s: the list query returned no rows", be->where);
    }
    while ((row = mysql_fetch_row(res)) != NULL) {
        unsigned long *lens = mysql_fetch_lengths(res);
        dlock_lock_info info;
        /* A name not under our prefix, or with a NUL, is no lock name. */
        if (lens[4] < lp || lens[4] - lp > DLOCK_NAME_MAX ||
            memchr(row[4] + lp, '\0', lens[4] - lp) != NULL)
            continue;
        memcpy(name, row[4] + lp, lens[4] - lp);
        name[lens[4] - lp] = '\0';
        fill(row, lens, &info);
        if (cb(name, &info, payload) != 0)
            break;
    }
    mysql_free_result(res);
    return DLOCK_OK;
}

/* ---- names -------------------------------------------------------------- */

void dlock__my_hex(char *out, const char *s, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    char *p = out;

    *p++ = 'X';
    *p++ = '\'';
    for (size_t i = 0; i < len; i++) {
        *p++ = digits[(unsigned char)s[i] >> 4];
        *p++ = digits[(unsigned char)s[i] & 15];
    }
    *p++ = '\'';
    *p = '\0';
}

/* key_prefix + name into key (DLOCK__MY_KEY_MAX + 1 bytes). */
static int make_key(dlock__my_be *be, const char *name, char *key)
{
    size_t lp = strlen(be->prefix), ln = strlen(name);

    if (ln > DLOCK_NAME_MAX || lp + ln > DLOCK__MY_KEY_MAX)
        return dlock_backend_fail(DLOCK_EINVAL, "%s: lock name longer than %d bytes", be->where,
                                  DLOCK_NAME_MAX);
    memcpy(key, be->prefix, lp);
    memcpy(key + lp, name, ln + 1);
    return DLOCK_OK;
}

int dlock__my_key_hex(dlock__my_be *be, const char *name, char *out)
{
    char key[DLOCK__MY_KEY_MAX + 1];
    int rc;

    if ((rc = make_key(be, name, key)) != DLOCK_OK)
        return rc;
    dlock__my_hex(out, key, strlen(key));
    return DLOCK_OK;
}

int dlock__my_lock_expr(dlock__my_be *be, const char *name, char tag, char *out)
{
    char key[DLOCK__MY_KEY_MAX + 1], hex[DLOCK__MY_HEX_MAX];
    size_t len;
    int plain;
    int rc;

    if ((rc = make_key(be, name, key)) != DLOCK_OK)
        return rc;
    len = strlen(key);
    if (be->key_secret != NULL) {
        /* 'dlock$' and 58 hex digits of the HMAC (232 bits): only a holder
         * of the secret can name the lock to block it. */
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned mlen = 0;
        if (HMAC(EVP_sha256(), be->key_secret, (int)strlen(be->key_secret),
                 (const unsigned char *)key, len, mac, &mlen) == NULL || mlen < 29)
            return dlock_backend_fail(DLOCK_ENOMEM, "%s: HMAC-SHA256 failed", be->where);
        dlock__my_hex(hex, (const char *)mac, 29);
        /* dlock__my_hex wrote X'..': the 58 digits are from hex + 2. */
        snprintf(out, DLOCK__MY_LOCKEXPR_MAX, "'%s%.58s'", tag == 'n' ? "dlock$" : "dlckw$",
                 hex + 2);
        return DLOCK_OK;
    }
    plain = tag == 'n' && len <= 64;
    for (size_t i = 0; plain && i < len; i++)
        plain = key[i] > 0x20 && key[i] < 0x7f && key[i] != '\'' && key[i] != '\\';
    if (plain) {
        snprintf(out, DLOCK__MY_LOCKEXPR_MAX, "'%s'", key);
        return DLOCK_OK;
    }
    /* 'dlock#' and 58 hex digits of SHA-256 (232 bits): 64 characters. */
    dlock__my_hex(hex, key, len);
    snprintf(out, DLOCK__MY_LOCKEXPR_MAX, "CONCAT('%s', LEFT(SHA2(%s, 256), 58))",
             tag == 'n' ? "dlock#" : "dlckw#", hex);
    return DLOCK_OK;
}

void dlock__my_holder_fill(dlock_lock_info *info, const char *text, unsigned long len)
{
    info->has_holder = 0;
    if (text != NULL && len > 0)
        dlock_holder_parse(info, text, len);
}
