/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * etcd's gRPC methods, the JSON <-> protobuf transcoder and gRPC framing.
 * See etcd_grpc.h for the mapping. The transcoder walks protoc-c's runtime
 * descriptors, so it knows no message by name: every message of etcd's
 * rpc.proto goes through the same few functions.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backends/etcd/etcd_codec.h"
#include "backends/etcd/etcd_grpc.h"
#include "core/url.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb-c.h"

/* Deeper nesting than any etcd message has (a txn in a txn in ...). */
#define MAX_DEPTH 32

/* ---- methods ------------------------------------------------------------ */

static const struct {
    const char *path, *service, *method;
} routes[] = {
#include "etcd_routes.h"
};

static const ProtobufCServiceDescriptor *const services[] = {
    &etcdserverpb__kv__descriptor,      &etcdserverpb__watch__descriptor,
    &etcdserverpb__lease__descriptor,   &etcdserverpb__cluster__descriptor,
    &etcdserverpb__maintenance__descriptor, &etcdserverpb__auth__descriptor,
};

const ProtobufCMethodDescriptor *dlock__etcd_grpc_method(const char *path, char *grpc_path,
                                                         size_t size)
{
    for (size_t r = 0; r < sizeof(routes) / sizeof(routes[0]); r++) {
        if (strcmp(routes[r].path, path) != 0)
            continue;
        for (size_t s = 0; s < sizeof(services) / sizeof(services[0]); s++) {
            const ProtobufCMethodDescriptor *m;
            if (strcmp(services[s]->name, routes[r].service) != 0)
                continue;
            m = protobuf_c_service_descriptor_get_method_by_name(services[s], routes[r].method);
            if (m != NULL)
                snprintf(grpc_path, size, "/%s/%s", routes[r].service, routes[r].method);
            return m;
        }
        return NULL;
    }
    return NULL;
}

/* ---- JSON to protobuf --------------------------------------------------- */

static int fail(char *err, size_t size, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(err, size, fmt, ap);
    va_end(ap);
    return -1;
}

/* The size of one element of a field of type t (of a repeated field's array). */
static size_t elem_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return 8;
    case PROTOBUF_C_TYPE_FLOAT:
        return sizeof(float);
    case PROTOBUF_C_TYPE_DOUBLE:
        return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM:
        return sizeof(int);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
    default:
        return sizeof(ProtobufCMessage *);
    }
}

/* An integer given as a JSON number or a decimal string. */
static int json_to_i64(const json_t *v, int is_unsigned, int64_t *s, uint64_t *u)
{
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (is_unsigned && x < 0)
            return -1;
        *s = (int64_t)x;
        *u = (uint64_t)x;
        return 0;
    }
    if (json_is_string(v)) {
        const char *t = json_string_value(v);
        char *end;
        errno = 0;
        if (t[0] == '\0' || t[0] == ' ')
            return -1;
        if (is_unsigned) {
            if (t[0] == '-')
                return -1;
            *u = strtoull(t, &end, 10);
            *s = (int64_t)*u;
        } else {
            *s = strtoll(t, &end, 10);
            *u = (uint64_t)*s;
        }
        return errno != 0 || *end != '\0' ? -1 : 0;
    }
    return -1;
}

static ProtobufCMessage *from_json(const ProtobufCMessageDescriptor *d, const json_t *j,
                                   int depth, char *err, size_t size);

/* Set the value v of field f at p (a struct member, or an array element). */
static int set_value(const ProtobufCFieldDescriptor *f, const json_t *v, void *p, int depth,
                     char *err, size_t size)
{
    int64_t s = 0;
    uint64_t u = 0;

    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        if (json_to_i64(v, 0, &s, &u) != 0 || s < INT32_MIN || s > INT32_MAX)
            return fail(err, size, "field '%s' wants a 32-bit integer", f->name);
        *(int32_t *)p = (int32_t)s;
        return 0;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        if (json_to_i64(v, 1, &s, &u) != 0 || u > UINT32_MAX)
            return fail(err, size, "field '%s' wants an unsigned 32-bit integer", f->name);
        *(uint32_t *)p = (uint32_t)u;
        return 0;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        if (json_to_i64(v, 0, &s, &u) != 0)
            return fail(err, size, "field '%s' wants a 64-bit integer", f->name);
        *(int64_t *)p = s;
        return 0;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        if (json_to_i64(v, 1, &s, &u) != 0)
            return fail(err, size, "field '%s' wants an unsigned 64-bit integer", f->name);
        *(uint64_t *)p = u;
        return 0;
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE:
        if (!json_is_number(v))
            return fail(err, size, "field '%s' wants a number", f->name);
        if (f->type == PROTOBUF_C_TYPE_FLOAT)
            *(float *)p = (float)json_number_value(v);
        else
            *(double *)p = json_number_value(v);
        return 0;
    case PROTOBUF_C_TYPE_BOOL:
        if (!json_is_boolean(v))
            return fail(err, size, "field '%s' wants true or false", f->name);
        *(protobuf_c_boolean *)p = json_is_true(v);
        return 0;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *ed = f->descriptor;
        const ProtobufCEnumValue *ev = NULL;
        /* By name, or any number: proto3 enums are open, and a value newer
         * than the .proto is written as its number (value_json). */
        if (json_is_integer(v) && json_integer_value(v) >= INT32_MIN &&
            json_integer_value(v) <= INT32_MAX) {
            *(int *)p = (int)json_integer_value(v);
            return 0;
        }
        if (json_is_string(v))
            ev = protobuf_c_enum_descriptor_get_value_by_name(ed, json_string_value(v));
        if (ev == NULL)
            return fail(err, size, "field '%s': not a value of %s", f->name, ed->name);
        *(int *)p = ev->value;
        return 0;
    }
    case PROTOBUF_C_TYPE_STRING: {
        char *copy;
        if (!json_is_string(v))
            return fail(err, size, "field '%s' wants a string", f->name);
        if ((copy = malloc(json_string_length(v) + 1)) == NULL)
            return fail(err, size, "out of memory");
        memcpy(copy, json_string_value(v), json_string_length(v) + 1);
        *(char **)p = copy;
        return 0;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = p;
        char *data;
        size_t len;
        if (!json_is_string(v) || dlock__etcd_unb64(json_string_value(v), &data, &len) != 0)
            return fail(err, size, "field '%s' wants base64 bytes", f->name);
        b->data = (uint8_t *)data;
        b->len = len;
        return 0;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        ProtobufCMessage *m = from_json(f->descriptor, v, depth + 1, err, size);
        if (m == NULL)
            return -1;
        *(ProtobufCMessage **)p = m;
        return 0;
    }
    }
    return fail(err, size, "field '%s' has a type dlock cannot encode", f->name);
}

static ProtobufCMessage *from_json(const ProtobufCMessageDescriptor *d, const json_t *j,
                                   int depth, char *err, size_t size)
{
    ProtobufCMessage *m;
    const char *name;
    json_t *v;

    if (!json_is_object(j)) {
        fail(err, size, "%s wants a JSON object", d->name);
        return NULL;
    }
    if (depth > MAX_DEPTH) {
        fail(err, size, "%s nested too deeply", d->name);
        return NULL;
    }
    if ((m = malloc(d->sizeof_message)) == NULL) {
        fail(err, size, "out of memory");
        return NULL;
    }
    protobuf_c_message_init(d, m);
    json_object_foreach((json_t *)j, name, v) {
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, name);
        char *member;

        if (f == NULL) {
            fail(err, size, "%s has no field '%s'", d->name, name);
            goto err;
        }
        if (json_is_null(v))
            continue;
        member = (char *)m + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = json_is_array(v) ? json_array_size(v) : 0, es = elem_size(f->type);
            size_t *count = (size_t *)((char *)m + f->quantifier_offset);
            void *arr;
            if (!json_is_array(v)) {
                fail(err, size, "field '%s' of %s wants a list", name, d->name);
                goto err;
            }
            if (n == 0)
                continue;
            /* Freed by protobuf_c_message_free_unpacked, with the count of
             * elements set so far: zeroed, so a half-filled array frees. */
            if ((arr = calloc(n, es)) == NULL) {
                fail(err, size, "out of memory");
                goto err;
            }
            *(void **)member = arr;
            for (size_t i = 0; i < n; i++) {
                *count = i;
                if (set_value(f, json_array_get(v, i), (char *)arr + i * es, depth, err, size) != 0)
                    goto err;
            }
            *count = n;
            continue;
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t *which = (uint32_t *)((char *)m + f->quantifier_offset);
            if (*which != 0) {
                fail(err, size, "%s: field '%s' and another of its oneof are both set", d->name,
                     name);
                goto err;
            }
            if (set_value(f, v, member, depth, err, size) != 0)
                goto err;
            *which = f->id;
            continue;
        }
        if (set_value(f, v, member, depth, err, size) != 0)
            goto err;
        if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
            f->type != PROTOBUF_C_TYPE_STRING)
            *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 1;
    }
    return m;

err:
    dlock__etcd_pb_free(m, 1);
    return NULL;
}

ProtobufCMessage *dlock__etcd_pb_from_json(const ProtobufCMessageDescriptor *d, const json_t *j,
                                           char *err, size_t errsize)
{
    return from_json(d, j, 0, err, errsize);
}

/* ---- protobuf to JSON --------------------------------------------------- */

static json_t *i64_text(int64_t v)
{
    char buf[24];

    snprintf(buf, sizeof(buf), "%" PRId64, v);
    return json_string(buf);
}

static json_t *u64_text(uint64_t v)
{
    char buf[24];

    snprintf(buf, sizeof(buf), "%" PRIu64, v);
    return json_string(buf);
}

/* The JSON of the value at p; NULL when out of memory. *zero: it is its
 * type's zero (to be left out unless a oneof member). */
static json_t *value_json(const ProtobufCFieldDescriptor *f, const void *p, int *zero)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        *zero = *(const int32_t *)p == 0;
        return json_integer(*(const int32_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        *zero = *(const uint32_t *)p == 0;
        return json_integer(*(const uint32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        *zero = *(const int64_t *)p == 0;
        return i64_text(*(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        *zero = *(const uint64_t *)p == 0;
        return u64_text(*(const uint64_t *)p);
    case PROTOBUF_C_TYPE_FLOAT:
        *zero = *(const float *)p == 0;
        return json_real(*(const float *)p);
    case PROTOBUF_C_TYPE_DOUBLE:
        *zero = *(const double *)p == 0;
        return json_real(*(const double *)p);
    case PROTOBUF_C_TYPE_BOOL:
        *zero = !*(const protobuf_c_boolean *)p;
        return json_boolean(*(const protobuf_c_boolean *)p);
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor,
                                                                            *(const int *)p);
        *zero = *(const int *)p == 0;
        /* A value newer than the .proto: its number, as jsonpb does. */
        return ev != NULL ? json_string(ev->name) : json_integer(*(const int *)p);
    }
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)p;
        *zero = s == NULL || s[0] == '\0';
        return json_string(s != NULL ? s : "");
    }
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        *zero = b->len == 0;
        return dlock__etcd_bytes(b->data != NULL ? (const void *)b->data : "", b->len);
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
        *zero = m == NULL;
        return m != NULL ? dlock__etcd_pb_to_json(m) : json_object();
    }
    }
    *zero = 1;
    return json_null();
}

json_t *dlock__etcd_pb_to_json(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    json_t *obj = json_object();

    if (obj == NULL)
        return NULL;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *member = (const char *)m + f->offset;
        json_t *v;
        int zero = 0;

        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)((const char *)m + f->quantifier_offset);
            const char *arr = *(char *const *)member;
            size_t es = elem_size(f->type);
            if (n == 0)
                continue;
            if ((v = json_array()) == NULL)
                goto oom;
            for (size_t k = 0; k < n; k++)
                if (json_array_append_new(v, value_json(f, arr + k * es, &zero)) != 0) {
                    json_decref(v);
                    goto oom;
                }
        } else {
            int oneof = (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0;
            if (oneof && *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
                continue;
            if (!oneof && f->label == PROTOBUF_C_LABEL_OPTIONAL &&
                f->type != PROTOBUF_C_TYPE_MESSAGE && f->type != PROTOBUF_C_TYPE_STRING &&
                !*(const protobuf_c_boolean *)((const char *)m + f->quantifier_offset))
                continue;
            if ((v = value_json(f, member, &zero)) == NULL)
                goto oom;
            if (zero && !oneof) {
                json_decref(v);
                continue;
            }
        }
        if (json_object_set_new(obj, f->name, v) != 0)
            goto oom;
    }
    return obj;

oom:
    json_decref(obj);
    return NULL;
}

/* ---- freeing ------------------------------------------------------------ */

static void wipe(const ProtobufCMessage *m)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;

    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *member = (const char *)m + f->offset;
        size_t n = 1, es = elem_size(f->type);
        const char *base = member;

        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_BYTES &&
            f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)((const char *)m + f->quantifier_offset) != f->id)
            continue;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(const size_t *)((const char *)m + f->quantifier_offset);
            base = *(char *const *)member;
        }
        for (size_t k = 0; k < n && base != NULL; k++) {
            const void *p = base + k * es;
            if (f->type == PROTOBUF_C_TYPE_STRING) {
                char *s = *(char *const *)p;
                if (s != NULL && s != f->default_value)
                    explicit_bzero(s, strlen(s));
            } else if (f->type == PROTOBUF_C_TYPE_BYTES) {
                const ProtobufCBinaryData *b = p;
                if (b->data != NULL && b->len > 0)
                    explicit_bzero(b->data, b->len);
            } else if (*(ProtobufCMessage *const *)p != NULL) {
                wipe(*(ProtobufCMessage *const *)p);
            }
        }
    }
}

void dlock__etcd_pb_free(ProtobufCMessage *m, int wipe_secrets)
{
    if (m == NULL)
        return;
    if (wipe_secrets)
        wipe(m);
    protobuf_c_message_free_unpacked(m, NULL);
}

/* ---- framing ------------------------------------------------------------ */

/* Append j, as a message of type d, framed, to *buf (*n bytes used of *cap). */
static int append_frame(const ProtobufCMessageDescriptor *d, const json_t *j, int wipe_secrets,
                        uint8_t **buf, size_t *n, size_t *cap, char *err, size_t errsize)
{
    ProtobufCMessage *m = dlock__etcd_pb_from_json(d, j, err, errsize);
    size_t size;
    uint8_t *at;

    if (m == NULL)
        return -1;
    size = protobuf_c_message_get_packed_size(m);
    if (size > UINT32_MAX || *cap - *n < size + 5) {
        size_t want = *n + size + 5 + 64;
        uint8_t *grown = size <= UINT32_MAX ? malloc(want) : NULL;
        if (grown == NULL) {
            dlock__etcd_pb_free(m, wipe_secrets);
            return fail(err, errsize, "out of memory");
        }
        if (*buf != NULL) {
            memcpy(grown, *buf, *n);
            explicit_bzero(*buf, *cap);
            free(*buf);
        }
        *buf = grown;
        *cap = want;
    }
    at = *buf + *n;
    at[0] = 0;
    at[1] = (uint8_t)(size >> 24);
    at[2] = (uint8_t)(size >> 16);
    at[3] = (uint8_t)(size >> 8);
    at[4] = (uint8_t)size;
    protobuf_c_message_pack(m, at + 5);
    *n += size + 5;
    dlock__etcd_pb_free(m, wipe_secrets);
    return 0;
}

int dlock__etcd_grpc_pack(const ProtobufCMessageDescriptor *d, const json_t *j, int wipe_secrets,
                          uint8_t **out, size_t *len, char *err, size_t errsize)
{
    size_t cap = 0;

    *out = NULL;
    *len = 0;
    return append_frame(d, j, wipe_secrets, out, len, &cap, err, errsize);
}

int dlock__etcd_grpc_body(const ProtobufCMessageDescriptor *d, const char *text, int wipe_secrets,
                          uint8_t **out, size_t *len, char *err, size_t errsize)
{
    size_t textlen = strlen(text), cap = 0, n = 0;
    uint8_t *buf = NULL;

    *out = NULL;
    *len = 0;
    for (size_t pos = 0;;) {
        json_error_t jerr;
        json_t *j;
        int rc;

        while (pos < textlen && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\r'))
            pos++;
        if (pos >= textlen && n > 0)
            break;
        j = json_loadb(text + pos, textlen - pos, JSON_DISABLE_EOF_CHECK, &jerr);
        if (j == NULL) {
            fail(err, errsize, "request is not JSON: %s", jerr.text);
            goto err;
        }
        pos += (size_t)jerr.position;
        rc = append_frame(d, j, wipe_secrets, &buf, &n, &cap, err, errsize);
        json_decref(j);
        if (rc != 0)
            goto err;
    }
    *out = buf;
    *len = n;
    return 0;

err:
    if (buf != NULL) {
        explicit_bzero(buf, cap);
        free(buf);
    }
    return -1;
}

int dlock__etcd_grpc_frame(const uint8_t *buf, size_t len, size_t *pos, size_t max,
                           const uint8_t **msg, size_t *msg_len)
{
    size_t at = *pos, n;

    if (len - at < 5)
        return 0;
    if (buf[at] != 0) /* compressed: dlock asks for none */
        return -1;
    n = (size_t)buf[at + 1] << 24 | (size_t)buf[at + 2] << 16 | (size_t)buf[at + 3] << 8 |
        buf[at + 4];
    if (n > max)
        return -1;
    if (len - at - 5 < n)
        return 0;
    *msg = buf + at + 5;
    *msg_len = n;
    *pos = at + 5 + n;
    return 1;
}

int dlock__etcd_grpc_header(const char *line, size_t n, int *status, char *message, size_t size)
{
    static const char st[] = "grpc-status:", msg[] = "grpc-message:";
    size_t k = 0;

    while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == '\n' || line[n - 1] == ' '))
        n--;
    if (n >= sizeof(st) - 1 && strncasecmp(line, st, sizeof(st) - 1) == 0) {
        int v = 0, digits = 0;
        for (size_t i = sizeof(st) - 1; i < n; i++) {
            if (line[i] == ' ')
                continue;
            if (line[i] < '0' || line[i] > '9' || ++digits > 3) {
                v = 2; /* not a status: UNKNOWN */
                break;
            }
            v = v * 10 + (line[i] - '0');
        }
        *status = digits == 0 ? 2 : v;
        return 1;
    }
    if (n >= sizeof(msg) - 1 && strncasecmp(line, msg, sizeof(msg) - 1) == 0) {
        size_t i = sizeof(msg) - 1;
        while (i < n && line[i] == ' ')
            i++;
        /* grpc-message is percent-encoded. */
        for (; i < n && k + 1 < size; i++) {
            if (line[i] == '%' && i + 2 < n && dlock__hexval((unsigned char)line[i + 1]) >= 0 &&
                dlock__hexval((unsigned char)line[i + 2]) >= 0) {
                message[k++] = (char)(dlock__hexval((unsigned char)line[i + 1]) << 4 |
                                      dlock__hexval((unsigned char)line[i + 2]));
                i += 2;
            } else {
                message[k++] = line[i];
            }
        }
        if (size > 0)
            message[k] = '\0';
        return 1;
    }
    return 0;
}
