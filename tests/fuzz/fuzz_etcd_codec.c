/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target, in process: the etcd backend's reading of the JSON
 * gateway's replies (etcd_codec.c): base64 keys and values, integers sent
 * as strings, a range's key-values, a txn's responses, the header's
 * revision; and the key-space helpers that turn a lock name into a
 * directory and a prefix into its range end. No socket (fuzz_etcd_grpc
 * covers the gRPC frames; fuzz_etcd_reply the HTTP paths).
 *
 * Input: a JSON text, as a reply body; also the whole input as base64 text
 * and as a lock name.
 *
 * Invariants: a key-value taken has revisions >= 0 (they are fences) and
 * its key, base64 again and decoded, is the same bytes; a decoded value
 * likewise; a revision is in 1..INT64_MAX-1 or 0; a txn response is an
 * object; a directory escapes '/', '%', controls, space and non-ASCII so
 * that it holds one '/' past the prefix, at its end; a range end is above
 * every key that starts with the prefix. No crash, leak or undefined
 * behaviour (ASan, UBSan, LSan).
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void die(const char *what)
{
    fprintf(stderr, "fuzz_etcd_codec: %s\n", what);
    abort();
}

/* bytes, to base64 and back: the same. */
static void round_trip(const char *bytes, size_t len)
{
    char *b64 = dlock__etcd_b64(bytes, len), *back = NULL;
    size_t blen = 0;

    if (b64 == NULL)
        return;
    if (dlock__etcd_unb64(b64, &back, &blen) != 0 || blen != len ||
        memcmp(back, bytes, len) != 0)
        die("base64 does not give back the bytes it was made of");
    free(back);
    free(b64);
}

static void check_text(const char *text)
{
    char *out = NULL;
    size_t len = 0;

    if (dlock__etcd_unb64(text, &out, &len) == 0) {
        if (len > strlen(text) * 3 / 4 || out[len] != '\0')
            die("decoded base64 longer than its text allows");
        round_trip(out, len);
        free(out);
    }
}

static void check_reply(const json_t *j)
{
    const json_t *kvs = json_is_object(j) ? json_object_get(j, "kvs") : NULL;
    size_t n = json_is_array(kvs) ? json_array_size(kvs) + 1 : 2;
    int64_t rev = dlock__etcd_revision(j), x;
    static const char *const fields[] = {"kvs", "prev_kvs", "events"};
    static const char *const kinds[] = {"response_range", "response_put",
                                        "response_delete_range", "response_txn"};

    if (rev < 0 || rev == INT64_MAX)
        die("a revision outside 0..INT64_MAX-1");
    for (size_t f = 0; f < 3; f++)
        for (size_t i = 0; i < n; i++) {
            dlock__etcd_kv kv;
            int rc = dlock__etcd_kv_in(j, fields[f], i, &kv);
            if (rc < -1 || rc > 1)
                die("kv_in gave another result than -1, 0 or 1");
            if (rc != 1) {
                if (kv.key != NULL)
                    die("a key left behind by a refused key-value");
                continue;
            }
            if (kv.create_revision < 0 || kv.mod_revision < 0)
                die("a negative revision taken (a fence above INT64_MAX)");
            round_trip(kv.key, kv.key_len);
            free(kv.key);
        }
    for (size_t i = 0; i < n; i++) {
        char *value = NULL;
        size_t len = 0;
        if (dlock__etcd_kv_value_at(j, i, &value, &len) == 0) {
            if (value == NULL || value[len] != '\0')
                die("a value without its NUL");
            round_trip(value, len);
        }
        free(value);
    }
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < 3; i++) {
            const json_t *op = dlock__etcd_txn_op(j, i, kinds[k]);
            if (op != NULL && !json_is_object(op))
                die("a txn response that is not an object");
            if (op != NULL)
                (void)dlock__etcd_revision(op);
        }
    if (json_is_object(j)) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)j, key, v) {
            (void)dlock__etcd_int(j, key, &x);
            if (json_is_string(v))
                check_text(json_string_value(v));
        }
    }
}

static void check_names(const char *s)
{
    static const char prefix[] = "/dlock/";
    char *dir = dlock__etcd_dir(prefix, s), *end;
    size_t dlen;

    if (dir != NULL) {
        dlen = strlen(dir);
        if (strncmp(dir, prefix, sizeof(prefix) - 1) != 0 || dir[dlen - 1] != '/' ||
            strchr(dir + sizeof(prefix) - 1, '/') != dir + dlen - 1)
            die("a lock's directory with a '/' inside its name");
        for (const unsigned char *p = (const unsigned char *)dir; *p; p++)
            if (*p <= ' ' || *p >= 127)
                die("a lock's directory with a byte left unescaped");
        if ((end = dlock__etcd_prefix_end(dir)) == NULL)
            die("no range end for a directory");
        /* Above dir and every key under it: the first byte that differs
         * is higher, within dir's length. */
        if (strncmp(end, dir, strlen(end) - 1) != 0 ||
            (unsigned char)end[strlen(end) - 1] <= (unsigned char)dir[strlen(end) - 1])
            die("a range end not above its prefix");
        free(end);
        free(dir);
    }
    if ((end = dlock__etcd_prefix_end(s)) != NULL) {
        size_t elen = strlen(end);
        if (elen == 0 || elen > strlen(s) || strncmp(end, s, elen - 1) != 0 ||
            (unsigned char)end[elen - 1] != (unsigned char)s[elen - 1] + 1)
            die("a range end not the prefix's next");
        free(end);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t jerr;
    json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY, &jerr);
    char *s;

    if (j != NULL) {
        check_reply(j);
        json_decref(j);
    }
    if ((s = malloc(size + 1)) == NULL)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    check_text(s);
    check_names(s);
    free(s);
    return 0;
}
