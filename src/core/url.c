/* SPDX-License-Identifier: BSD-3-Clause */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/url.h"
#include "core/url_secret.h"

#define URL_MAX 4096

static char *dup_range(const char *s, size_t n)
{
    char *p = malloc(n + 1);

    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

int dlock__hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Percent-decode s[0..n) into a new string; a NUL byte is refused because the
 * result is used as a C string. *bad is set on malformed escapes. */
static char *decode_range(const char *s, size_t n, int *bad)
{
    char *out = malloc(n + 1), *o = out;

    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%') {
            if (i + 2 >= n) {
                *bad = 1;
                break;
            }
            int a = dlock__hexval((unsigned char)s[i + 1]);
            int b = dlock__hexval((unsigned char)s[i + 2]);
            if (a < 0 || b < 0 || (a == 0 && b == 0)) {
                *bad = 1;
                break;
            }
            *o++ = (char)(a * 16 + b);
            i += 2;
        } else {
            *o++ = s[i];
        }
    }
    *o = '\0';
    return out;
}

/* Free s after overwriting it: no secret is left in freed heap memory. */
static void free_wiped(char *s)
{
    if (s != NULL) {
        volatile char *p = s;
        while (*p)
            *p++ = 0;
    }
    free(s);
}

void dlock__url_free(dlock_url *url)
{
    if (url == NULL)
        return;
    free(url->scheme);
    free(url->user);
    free_wiped(url->password);
    for (size_t i = 0; i < url->nhosts; i++)
        free(url->hosts[i].host);
    free(url->hosts);
    free(url->path);
    for (size_t i = 0; i < url->nparams; i++) {
        /* password=, key_secret=, ...: the secrets redaction hides. */
        if (url->params[i].key != NULL &&
            dlock__url_secret_param(url->params[i].key, strlen(url->params[i].key)))
            free_wiped(url->params[i].value);
        else
            free(url->params[i].value);
        free(url->params[i].key);
    }
    free(url->params);
    free(url->redacted);
    memset(url, 0, sizeof(*url));
}

const char *dlock_url_param_get(const dlock_url *url, const char *key)
{
    for (size_t i = 0; url != NULL && i < url->nparams; i++)
        if (strcmp(url->params[i].key, key) == 0)
            return url->params[i].value;
    return NULL;
}

int dlock_url_host_is_local(const char *host, size_t n)
{
    char buf[64];
    struct in_addr a4;
    struct in6_addr a6;

    if (host == NULL || n == 0 || host[0] == '/' || host[0] == '@')
        return 1;
    if (n >= sizeof(buf))
        return 0;
    memcpy(buf, host, n);
    buf[n] = '\0';
    if (strcasecmp(buf, "localhost") == 0)
        return 1;
    if (inet_pton(AF_INET, buf, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, buf, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

/* Parse one "host[:port]" or "[v6]:port" of length n. */
static int parse_host(dlock_url_host *h, const char *s, size_t n, const char *scheme)
{
    const char *host = s, *colon = NULL;
    size_t hlen = n;

    if (n == 0)
        return dlock__fail(DLOCK_EINVAL, "%s URL: empty host", scheme);
    if (s[0] == '[') {
        const char *close = memchr(s, ']', n);
        if (close == NULL)
            return dlock__fail(DLOCK_EINVAL, "%s URL: unterminated '[' in host", scheme);
        host = s + 1;
        hlen = (size_t)(close - s) - 1;
        if (close + 1 < s + n) {
            if (close[1] != ':')
                return dlock__fail(DLOCK_EINVAL, "%s URL: junk after ']' in host", scheme);
            colon = close + 1;
        }
        if (hlen == 0)
            return dlock__fail(DLOCK_EINVAL, "%s URL: empty host", scheme);
    } else {
        colon = memchr(s, ':', n);
        if (colon != NULL)
            hlen = (size_t)(colon - s);
        if (hlen == 0)
            return dlock__fail(DLOCK_EINVAL, "%s URL: empty host", scheme);
        for (size_t i = 0; i < hlen; i++) {
            unsigned char c = (unsigned char)s[i];
            if (!isalnum(c) && c != '.' && c != '-' && c != '_')
                return dlock__fail(DLOCK_EINVAL, "%s URL: invalid character in host", scheme);
        }
    }
    h->port = 0;
    if (colon != NULL) {
        const char *p = colon + 1, *end = s + n;
        long port = 0;
        if (p == end)
            return dlock__fail(DLOCK_EINVAL, "%s URL: empty port", scheme);
        for (; p < end; p++) {
            if (*p < '0' || *p > '9' || (port = port * 10 + (*p - '0')) > 65535)
                return dlock__fail(DLOCK_EINVAL, "%s URL: port must be a number from 1 to 65535",
                                   scheme);
        }
        if (port == 0)
            return dlock__fail(DLOCK_EINVAL, "%s URL: port must be a number from 1 to 65535",
                               scheme);
        h->port = (int)port;
    }
    h->host = dup_range(host, hlen);
    return h->host == NULL ? dlock__fail(DLOCK_ENOMEM, "out of memory") : DLOCK_OK;
}

static int parse_query(dlock_url *u, const char *q, const char *end)
{
    while (q < end) {
        const char *amp = memchr(q, '&', (size_t)(end - q));
        const char *stop = amp != NULL ? amp : end;
        const char *eq = memchr(q, '=', (size_t)(stop - q));
        dlock_url_param *grown;
        int bad = 0;

        if (eq == NULL || eq == q)
            return dlock__fail(DLOCK_EINVAL, "%s URL: query parameters must be key=value",
                               u->scheme);
        grown = realloc(u->params, (u->nparams + 1) * sizeof(*grown));
        if (grown == NULL)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        u->params = grown;
        grown[u->nparams].key = dup_range(q, (size_t)(eq - q));
        grown[u->nparams].value = decode_range(eq + 1, (size_t)(stop - eq - 1), &bad);
        u->nparams++;
        if (grown[u->nparams - 1].key == NULL || grown[u->nparams - 1].value == NULL)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        if (bad)
            return dlock__fail(DLOCK_EINVAL, "%s URL: bad %%-escape in query", u->scheme);
        q = stop == end ? end : stop + 1;
    }
    return DLOCK_OK;
}

/*
 * u->redacted: text as written, but for the password of its user
 * information (auth_start to auth_end, or none) and the value of each secret
 * query parameter (dlock__url_secret_param), each shown as "***". The query starts at
 * the first '?' from query_from.
 */
static int build_redacted(dlock_url *u, const char *text, const char *auth_start,
                          const char *auth_end, const char *query_from)
{
    size_t n = strlen(text), k = 0;
    const char *colon = auth_start != NULL ? memchr(auth_start, ':', (size_t)(auth_end - auth_start))
                                           : NULL;
    const char *query = strchr(query_from, '?'), *p = text;
    char *out = malloc(4 * n + 4); /* each "***" stands for at least its '&' or '?' */

    if (out == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    while (*p != '\0') {
        if (colon != NULL && p == colon + 1) {
            memcpy(out + k, "***", 3), k += 3;
            p = auth_end;
            colon = NULL; /* once: an empty password leaves p where it was */
            continue;
        }
        out[k++] = *p;
        if (query != NULL && p >= query && (*p == '?' || *p == '&')) {
            const char *key = p + 1, *eq = key + strcspn(key, "=&#");
            if (*eq == '=' && dlock__url_secret_param(key, (size_t)(eq - key))) {
                memcpy(out + k, key, (size_t)(eq + 1 - key)), k += (size_t)(eq + 1 - key);
                memcpy(out + k, "***", 3), k += 3;
                p = eq + 1 + strcspn(eq + 1, "&#");
                continue;
            }
        }
        p++;
    }
    out[k] = '\0';
    u->redacted = out;
    return DLOCK_OK;
}

static int parse(dlock_url *u, const char *text)
{
    const char *sep, *rest, *at, *hosts_end, *path_end, *end;
    size_t len;
    int rc;

    len = strnlen(text, URL_MAX + 1);
    if (len == 0)
        return dlock__fail(DLOCK_EINVAL, "URL is empty");
    if (len > URL_MAX)
        return dlock__fail(DLOCK_EINVAL, "URL is longer than %d bytes", URL_MAX);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)text[i] <= ' ' || text[i] == 127)
            return dlock__fail(DLOCK_EINVAL, "URL contains a space or control character");
    end = text + len;

    sep = strstr(text, "://");
    if (sep == NULL || sep == text)
        return dlock__fail(DLOCK_EINVAL, "URL must start with a scheme, like redis://host:6379");
    u->scheme = dup_range(text, (size_t)(sep - text));
    if (u->scheme == NULL)
        return dlock__fail(DLOCK_ENOMEM, "out of memory");
    for (char *p = u->scheme; *p; p++) {
        if (!isalnum((unsigned char)*p) && *p != '+' && *p != '-' && *p != '.')
            return dlock__fail(DLOCK_EINVAL, "URL scheme contains an invalid character");
        *p = (char)tolower((unsigned char)*p);
    }
    rest = sep + 3;

    /* The authority ends at the first '/' or '?'; userinfo is before its last '@'. */
    hosts_end = rest + strcspn(rest, "/?");
    at = NULL;
    for (const char *p = rest; p < hosts_end; p++)
        if (*p == '@')
            at = p;
    if ((rc = build_redacted(u, text, at != NULL ? rest : NULL, at, hosts_end)) != DLOCK_OK)
        return rc;
    if (at != NULL) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        int bad = 0;
        const char *uend = colon != NULL ? colon : at;
        if (uend > rest)
            u->user = decode_range(rest, (size_t)(uend - rest), &bad);
        if (colon != NULL)
            u->password = decode_range(colon + 1, (size_t)(at - colon - 1), &bad);
        if ((uend > rest && u->user == NULL) || (colon != NULL && u->password == NULL))
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        if (bad)
            return dlock__fail(DLOCK_EINVAL, "%s URL: bad %%-escape in user or password",
                               u->scheme);
        rest = at + 1;
    }

    while (rest < hosts_end) {
        const char *comma = memchr(rest, ',', (size_t)(hosts_end - rest));
        const char *stop = comma != NULL ? comma : hosts_end;
        dlock_url_host *grown = realloc(u->hosts, (u->nhosts + 1) * sizeof(*grown));
        if (grown == NULL)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
        u->hosts = grown;
        grown[u->nhosts].host = NULL;
        u->nhosts++;
        if ((rc = parse_host(&grown[u->nhosts - 1], rest, (size_t)(stop - rest), u->scheme)))
            return rc;
        rest = stop == hosts_end ? hosts_end : stop + 1;
        if (stop == comma && rest == hosts_end)
            return dlock__fail(DLOCK_EINVAL, "%s URL: empty host after ','", u->scheme);
    }

    path_end = rest + strcspn(rest, "?");
    if (path_end > rest) {
        u->path = dup_range(rest, (size_t)(path_end - rest));
        if (u->path == NULL)
            return dlock__fail(DLOCK_ENOMEM, "out of memory");
    }
    if (*path_end == '?')
        return parse_query(u, path_end + 1, end);
    return DLOCK_OK;
}

int dlock__url_parse(dlock_url *out, const char *text)
{
    int rc;

    memset(out, 0, sizeof(*out));
    if (text == NULL)
        return dlock__fail(DLOCK_EINVAL, "URL is NULL");
    rc = parse(out, text);
    if (rc != DLOCK_OK)
        dlock__url_free(out);
    return rc;
}
