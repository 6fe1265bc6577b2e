/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Which query parameters of a URL hold a secret: one rule for the library's
 * redacted URL (url.c) and for the command's redactor (cli/redact.c, which
 * includes this header alone of the library's internals), so that the two
 * cannot drift apart.
 */
#ifndef DLOCK_CORE_URL_SECRET_H
#define DLOCK_CORE_URL_SECRET_H

#include <stddef.h>
#include <string.h>
#include <strings.h>

/* Whether a query parameter named key (len bytes, not NUL-terminated) holds
 * a secret: the password, sentinel_password, sslpassword and key_secret the
 * backends take, ZooKeeper's acl (a digest id carries a hash of its
 * password, open to guessing offline), and, so that a new one is hidden
 * before anyone thinks of it, every name ending in "password", "passwd",
 * "secret", "token" or "key" (any case; an sslkey= path too: hiding a path
 * costs little). */
static inline int dlock__url_secret_param(const char *key, size_t len)
{
    static const char *const ends[] = {"password", "passwd", "secret", "token", "key"};

    if (len == 3 && strncasecmp(key, "acl", 3) == 0)
        return 1;

    for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]); i++) {
        size_t n = strlen(ends[i]);
        if (len >= n && strncasecmp(key + len - n, ends[i], n) == 0)
            return 1;
    }
    return 0;
}

#endif
