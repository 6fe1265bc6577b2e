/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target: the one URL parser (dlock__url_parse) and the Redis
 * backend's reading of a parsed URL (dlock__redis_conn_init, no I/O).
 *
 * Beyond "no crash, no leak, no undefined behaviour" it checks what the
 * parser promises: on failure *out is empty and the message is set and
 * never quotes the password; on success the scheme is lower case, every
 * host is non-empty, and the redacted form hides the password.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/redis/redis_conn.h"
#include "core/url.h"

/* libFuzzer's entry points. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The password as written (still percent-encoded), or NULL. The checks use
 * it only when it occurs once in the URL and holds no '*' (the redaction's
 * own character): then any copy of it in a message came from the userinfo. */
static char *raw_password(const char *text)
{
    const char *rest = strstr(text, "://"), *end, *at = NULL, *colon;

    if (rest == NULL)
        return NULL;
    rest += 3;
    end = rest + strcspn(rest, "/?");
    for (const char *p = rest; p < end; p++)
        if (*p == '@')
            at = p;
    if (at == NULL || (colon = memchr(rest, ':', (size_t)(at - rest))) == NULL)
        return NULL;
    if (memchr(colon + 1, '*', (size_t)(at - colon - 1)) != NULL)
        return NULL;
    /* Messages quote the text they show with ': a password of '@' signs
     * and a quote is "found" in "got '/u:@@@@@@@@@@@@'", a path's text and
     * the closing quote, though nothing of the password was copied. */
    if (memchr(colon + 1, '\'', (size_t)(at - colon - 1)) != NULL)
        return NULL;
    return strndup(colon + 1, (size_t)(at - colon - 1));
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;

    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* count() in text with its scheme (what comes before "://") in lower case. */
static size_t count_scheme_lowered(const char *text, const char *needle)
{
    char *copy = strdup(text), *end;
    size_t n;

    if (copy == NULL)
        return 0;
    if ((end = strstr(copy, "://")) != NULL)
        for (char *p = copy; p < end; p++)
            if (*p >= 'A' && *p <= 'Z')
                *p = (char)(*p - 'A' + 'a');
    n = count(copy, needle);
    free(copy);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1), *pw;
    dlock_url u;
    int rc;

    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    rc = dlock__url_parse(&u, text);
    pw = raw_password(text);
    if (rc != DLOCK_OK) {
        if (rc != DLOCK_EINVAL && rc != DLOCK_ENOMEM)
            abort();
        if (u.scheme != NULL || u.hosts != NULL || u.redacted != NULL || u.password != NULL)
            abort();
        if (dlock_error_message()[0] == '\0')
            abort();
        /* A long password written once in the URL must not reach the text.
         * Once, also with the scheme in lower case, as messages show it: a
         * scheme "redioOnassnasss" names "oonassnass" there, not the
         * password of the same letters (a fresh seed found it). */
        if (pw != NULL && strlen(pw) >= 10 && count(text, pw) == 1 &&
            count_scheme_lowered(text, pw) == 1 && strstr(dlock_error_message(), pw) != NULL)
            abort();
    } else {
        dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
        dlock__redis_conn conn;

        for (const char *p = u.scheme; *p; p++)
            if (*p >= 'A' && *p <= 'Z')
                abort();
        for (size_t i = 0; i < u.nhosts; i++)
            if (u.hosts[i].host == NULL || u.hosts[i].host[0] == '\0' || u.hosts[i].port < 0 ||
                u.hosts[i].port > 65535)
                abort();
        if (u.redacted == NULL)
            abort();
        if (u.password != NULL && strstr(u.redacted, ":***@") == NULL)
            abort();
        if (pw != NULL && strlen(pw) >= 10 && count(text, pw) == 1 && strstr(u.redacted, pw))
            abort();
        if (strcmp(u.scheme, "redis") == 0 || strcmp(u.scheme, "unix") == 0) {
            rc = dlock__redis_conn_init(&conn, &u, &o, "cmd");
            if (rc == DLOCK_OK && (conn.where[0] == '\0' || conn.db < 0))
                abort();
            if (rc != DLOCK_OK && rc != DLOCK_EINVAL)
                abort();
            if (pw != NULL && strlen(pw) >= 10 && count(text, pw) == 1 &&
                (strstr(conn.where, pw) || (rc != DLOCK_OK && strstr(dlock_error_message(), pw))))
                abort();
        }
        dlock__url_free(&u);
    }
    free(pw);
    free(text);
    return 0;
}
