/* SPDX-License-Identifier: BSD-3-Clause */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_codec.h"

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *dlock__etcd_b64(const void *data, size_t len)
{
    const unsigned char *p = data;
    char *out = malloc(4 * ((len + 2) / 3) + 1), *o = out;
    size_t i = 0;

    if (out == NULL)
        return NULL;
    for (; i + 2 < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        *o++ = b64_chars[v >> 18 & 63];
        *o++ = b64_chars[v >> 12 & 63];
        *o++ = b64_chars[v >> 6 & 63];
        *o++ = b64_chars[v & 63];
    }
    if (i < len) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < len ? (unsigned)p[i + 1] << 8 : 0);
        *o++ = b64_chars[v >> 18 & 63];
        *o++ = b64_chars[v >> 12 & 63];
        *o++ = i + 1 < len ? b64_chars[v >> 6 & 63] : '=';
        *o++ = '=';
    }
    *o = '\0';
    return out;
}

static int b64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

int dlock__etcd_unb64(const char *text, char **out, size_t *len)
{
    size_t n = strlen(text), k = 0;
    unsigned acc = 0;
    int bits = 0;
    char *buf;

    while (n > 0 && text[n - 1] == '=')
        n--;
    buf = malloc(n * 3 / 4 + 1);
    if (buf == NULL)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int v = b64_value((unsigned char)text[i]);
        if (v < 0) {
            free(buf);
            return -1;
        }
        acc = (acc << 6 | (unsigned)v) & 0xffffff;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            buf[k++] = (char)(acc >> bits & 0xff);
        }
    }
    buf[k] = '\0';
    *out = buf;
    *len = k;
    return 0;
}

json_t *dlock__etcd_bytes(const void *data, size_t len)
{
    char *s = dlock__etcd_b64(data, len);
    json_t *j;

    if (s == NULL)
        return NULL;
    j = json_string(s);
    free(s);
    return j;
}

json_t *dlock__etcd_str(const char *s)
{
    return dlock__etcd_bytes(s, strlen(s));
}

int dlock__etcd_int(const json_t *obj, const char *field, int64_t *out)
{
    const json_t *v = json_is_object(obj) ? json_object_get(obj, field) : NULL;

    *out = 0;
    if (v == NULL || json_is_null(v))
        return 0;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        long long x;
        errno = 0;
        x = strtoll(s, &end, 10);
        if (*s == '\0' || *end != '\0' || errno != 0)
            return -1;
        *out = (int64_t)x;
        return 0;
    }
    return -1;
}

int dlock__etcd_kv_at(const json_t *range_reply, size_t i, dlock__etcd_kv *kv)
{
    return dlock__etcd_kv_in(range_reply, "kvs", i, kv);
}

int dlock__etcd_kv_in(const json_t *reply, const char *field, size_t i, dlock__etcd_kv *kv)
{
    const json_t *kvs = json_is_object(reply) ? json_object_get(reply, field) : NULL;
    const json_t *item, *key;

    memset(kv, 0, sizeof(*kv));
    if (kvs == NULL)
        return 0;
    if (!json_is_array(kvs))
        return -1;
    if (i >= json_array_size(kvs))
        return 0;
    item = json_array_get(kvs, i);
    key = json_object_get(item, "key");
    if (!json_is_string(key) ||
        dlock__etcd_unb64(json_string_value(key), &kv->key, &kv->key_len) != 0)
        return -1;
    /* A revision is a fence (cast to uint64_t): a negative one would be
     * read as one above INT64_MAX. */
    if (dlock__etcd_int(item, "create_revision", &kv->create_revision) != 0 ||
        dlock__etcd_int(item, "mod_revision", &kv->mod_revision) != 0 ||
        dlock__etcd_int(item, "lease", &kv->lease) != 0 || kv->create_revision < 0 ||
        kv->mod_revision < 0) {
        free(kv->key);
        kv->key = NULL;
        return -1;
    }
    return 1;
}

int dlock__etcd_kv_value_at(const json_t *range_reply, size_t i, char **value, size_t *len)
{
    const json_t *kvs = json_object_get(range_reply, "kvs");
    const json_t *v = json_object_get(json_array_get(kvs, i), "value");

    *value = NULL;
    *len = 0;
    if (v == NULL)
        return (*value = calloc(1, 1)) != NULL ? 0 : -1;
    if (!json_is_string(v))
        return -1;
    return dlock__etcd_unb64(json_string_value(v), value, len);
}

const json_t *dlock__etcd_txn_op(const json_t *txn_reply, size_t i, const char *kind)
{
    const json_t *rs = json_is_object(txn_reply) ? json_object_get(txn_reply, "responses") : NULL;
    const json_t *r;

    if (!json_is_array(rs) || i >= json_array_size(rs))
        return NULL;
    r = json_object_get(json_array_get(rs, i), kind);
    return json_is_object(r) ? r : NULL;
}

int64_t dlock__etcd_revision(const json_t *reply)
{
    int64_t rev = 0;

    if (json_is_object(reply))
        dlock__etcd_int(json_object_get(reply, "header"), "revision", &rev);
    /* Callers watch from rev + 1: INT64_MAX is no revision to count on. */
    return rev > 0 && rev < INT64_MAX ? rev : 0;
}

char *dlock__etcd_dir(const char *prefix, const char *name)
{
    size_t plen = strlen(prefix), nlen = strlen(name);
    char *out = malloc(plen + 3 * nlen + 2), *o;

    if (out == NULL)
        return NULL;
    memcpy(out, prefix, plen);
    o = out + plen;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if (*p == '/' || *p == '%' || *p <= ' ' || *p >= 127) {
            o += sprintf(o, "%%%02X", *p);
        } else {
            *o++ = (char)*p;
        }
    }
    *o++ = '/';
    *o = '\0';
    return out;
}

char *dlock__etcd_prefix_end(const char *prefix)
{
    size_t n = strlen(prefix);
    char *end = strdup(prefix);

    if (end == NULL)
        return NULL;
    while (n > 0) {
        unsigned char c = (unsigned char)end[n - 1];
        if (c < 0xff) {
            end[n - 1] = (char)(c + 1);
            end[n] = '\0';
            return end;
        }
        n--;
    }
    /* All 0xff (never for our keys, which end in '/'): "\0" means "to the
     * end of the key space" to etcd, which a C string cannot carry. */
    free(end);
    return NULL;
}

/* A decimal number of at most 6 digits at *p, moved past it; -1 if none. */
static long version_part(const char **p)
{
    long n = 0;
    int digits = 0;

    while (**p >= '0' && **p <= '9' && digits < 7) {
        n = n * 10 + (**p - '0');
        (*p)++;
        digits++;
    }
    return digits == 0 || digits > 6 ? -1 : n;
}

int dlock__etcd_version_fixed(const char *v)
{
    long major, minor, patch;
    int pre;

    if (v == NULL || (major = version_part(&v)) < 0 || *v++ != '.' ||
        (minor = version_part(&v)) < 0 || *v++ != '.' || (patch = version_part(&v)) < 0 ||
        (*v != '\0' && *v != '-' && *v != '+'))
        return 0;
    pre = *v == '-';
    if (major != 3)
        return major > 3;
    if (minor == 4)
        return patch > 25 || (patch == 25 && !pre);
    if (minor == 5)
        return patch > 8 || (patch == 8 && !pre);
    return minor > 5;
}
