/* SPDX-License-Identifier: BSD-3-Clause */
/* Passwords out of what the command prints (redact.h). */
#define _GNU_SOURCE /* memmem */
#include "redact.h"

#include "core/url_secret.h"

#include <stdlib.h>
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
    const char *p = text, *url_stop = text; /* inside a URL while p < url_stop */

    while (*p != '\0') {
        const char *at = NULL, *end, *colon, *cut;
        if (p < url_stop && (*p == '?' || *p == '&')) {
            const char *key = p + 1, *eq = key;
            while (eq < url_stop && *eq != '=' && *eq != '&' && *eq != '#')
                eq++;
            put(out, size, &n, p++, 1);
            if (eq < url_stop && *eq == '=' && dlock__url_secret_param(key, (size_t)(eq - key))) {
                put(out, size, &n, key, (size_t)(eq + 1 - key));
                put(out, size, &n, "***", 3);
                for (p = eq + 1; p < url_stop && *p != '&' && *p != '#'; p++)
                    ;
            }
            continue;
        }
        if (strncmp(p, "://", 3) != 0 || p == text || !scheme_char(p[-1])) {
            put(out, size, &n, p++, 1);
            continue;
        }
        put(out, size, &n, p, 3);
        p += 3;
        for (end = p; !url_end(*end); end++)
            if (*end == '@')
                at = end;
        url_stop = end;
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

/* ---- Text for a terminal -------------------------------------------------- */

/* The length of the valid UTF-8 sequence at s (1 to 4), or 0 if none starts
 * there (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF). */
static size_t utf8_length(const unsigned char *s)
{
    unsigned char lo = 0x80, hi = 0xbf;
    size_t len;

    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf)
        len = 2;
    else if (s[0] >= 0xe0 && s[0] <= 0xef)
        len = 3, lo = s[0] == 0xe0 ? 0xa0 : 0x80, hi = s[0] == 0xed ? 0x9f : 0xbf;
    else if (s[0] >= 0xf0 && s[0] <= 0xf4)
        len = 4, lo = s[0] == 0xf0 ? 0x90 : 0x80, hi = s[0] == 0xf4 ? 0x8f : 0xbf;
    else
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

/* Whether the code point of the valid sequence s (len bytes) changes what a
 * terminal shows beyond its own glyph: C0 controls and DEL, the C1 controls
 * (U+0080 to U+009F: some terminals take U+009B as CSI), the line and
 * paragraph separators and the bidirectional controls (which reorder the
 * text around them). */
static int is_control(const unsigned char *s, size_t len)
{
    unsigned cp;

    if (len == 1)
        return s[0] < 0x20 || s[0] == 0x7f;
    if (len == 2)
        return s[0] == 0xc2 && s[1] < 0xa0;
    if (len != 3)
        return 0;
    cp = (unsigned)(s[0] & 0x0f) << 12 | (unsigned)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
    return (cp >= 0x200e && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202e) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

size_t cli_escape(char *out, size_t size, const char *text)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)text;
    size_t n = 0, written = 0, len;

    for (; *p != '\0'; p += len) {
        char unit[16];
        size_t k = 0;

        len = utf8_length(p);
        if (len == 0 || is_control(p, len)) {
            len = len ? len : 1;
            for (size_t i = 0; i < len; i++) {
                unit[k++] = '\\', unit[k++] = 'x';
                unit[k++] = hex[p[i] >> 4], unit[k++] = hex[p[i] & 0xf];
            }
        } else if (*p == '\\') {
            unit[k++] = '\\', unit[k++] = '\\';
        } else {
            memcpy(unit, p, len), k = len;
        }
        /* Whole units only: once one does not fit, copy no more, count on. */
        if (written == n && n + k < size)
            memcpy(out + n, unit, k), written += k;
        n += k;
    }
    if (size > 0)
        out[written] = '\0';
    return n;
}

size_t cli_printable(char *out, size_t size, const char *text)
{
    size_t need = cli_redact(NULL, 0, text);
    char *redacted = malloc(need + 1);

    if (redacted == NULL)
        return cli_escape(out, size, "(out of memory for a message)");
    cli_redact(redacted, need + 1, text);
    need = cli_escape(out, size, redacted);
    free(redacted);
    return need;
}
