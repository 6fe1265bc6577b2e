/* SPDX-License-Identifier: BSD-3-Clause */
/* Passwords out of what the command prints (redact.h). */
#define _GNU_SOURCE /* memmem */
#include "redact.h"

#include <string.h>

/* A character of a URL scheme (RFC 3986: letters, digits, "+-."). */
static int scheme_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '+' || ch == '-' || ch == '.';
}

/* Where a URL, as it may stand in a message, ends. */
static int url_end(char ch)
{
    return ch == '\0' || ch == ' ' || (unsigned char)ch < 0x20 || ch == 0x7f;
}

/* out[*n] = the bytes of s (len of them), as far as they fit. */
static void put(char *out, size_t size, size_t *n, const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++, (*n)++)
        if (*n + 1 < size)
            out[*n] = s[i];
}

size_t cli_redact(char *out, size_t size, const char *text)
{
    size_t n = 0;
    const char *p = text;

    while (*p != '\0') {
        const char *at = NULL, *end, *colon, *cut;
        if (strncmp(p, "://", 3) != 0 || p == text || !scheme_char(p[-1])) {
            put(out, size, &n, p++, 1);
            continue;
        }
        put(out, size, &n, p, 3);
        p += 3;
        for (end = p; !url_end(*end); end++)
            if (*end == '@')
                at = end;
        if (at != NULL) {
            colon = memchr(p, ':', (size_t)(at - p));
            if (colon != NULL)
                put(out, size, &n, p, (size_t)(colon + 1 - p));
            put(out, size, &n, "***", 3);
            p = at;
        } else if ((cut = memmem(p, (size_t)(end - p), "...", 3)) != NULL) {
            /* Cut short before its '@', perhaps (the library shows a long
             * lock name so): what is left may be a password's start. */
            put(out, size, &n, "***", 3);
            p = cut;
        }
    }
    if (size > 0)
        out[n < size ? n : size - 1] = '\0';
    return n;
}
