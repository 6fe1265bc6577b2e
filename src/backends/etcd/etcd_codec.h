/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The gateway's JSON conventions: bytes fields in base64, int64 fields as
 * decimal strings, and every zero field left out of a reply. Pure functions,
 * no I/O.
 */
#ifndef DLOCK_ETCD_CODEC_H
#define DLOCK_ETCD_CODEC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Standard base64 with padding, NUL-terminated, malloc'd; NULL when out of
 * memory. */
char *dlock__etcd_b64(const void *data, size_t len);

/* Decode standard (or URL-safe) base64, padded or not, into a malloc'd
 * buffer with a NUL after the len bytes. -1 on bad input or no memory. */
int dlock__etcd_unb64(const char *text, char **out, size_t *len);

/* A JSON string holding data in base64 (NULL when out of memory). */
json_t *dlock__etcd_bytes(const void *data, size_t len);
json_t *dlock__etcd_str(const char *s);

/* An int64 field that arrives as a string ("12") or a number; a missing
 * field is 0, as the gateway leaves zeros out. -1 when present but not an
 * integer. */
int dlock__etcd_int(const json_t *obj, const char *field, int64_t *out);

/* A key-value of a range reply. key is decoded and NUL-terminated. */
typedef struct {
    char *key;
    size_t key_len;
    int64_t create_revision;
    int64_t mod_revision;
    int64_t lease;
} dlock__etcd_kv;

/* Parse kvs[i] of a range reply (obj holds "kvs"); 1 found, 0 none at i, -1
 * malformed. Free kv->key after use. */
int dlock__etcd_kv_at(const json_t *range_reply, size_t i, dlock__etcd_kv *kv);
/* The value of kvs[i], decoded, malloc'd with a NUL after len bytes ("" when
 * etcd left it out). 0, or -1 when malformed or out of memory. */
int dlock__etcd_kv_value_at(const json_t *range_reply, size_t i, char **value, size_t *len);
/* The same for another array field ("prev_kvs" of a deleterange reply). */
int dlock__etcd_kv_in(const json_t *reply, const char *field, size_t i, dlock__etcd_kv *kv);

/* The reply of the i-th operation of a txn: the object under
 * "response_range" / "response_put" / "response_delete_range". NULL when
 * absent (an empty reply object is left out too: callers treat NULL as
 * "no kvs"). */
const json_t *dlock__etcd_txn_op(const json_t *txn_reply, size_t i, const char *kind);

/* header.revision of a reply: 0 when missing, or not a revision (not a
 * positive int64, or INT64_MAX, after which nothing can be watched). */
int64_t dlock__etcd_revision(const json_t *reply);

/*
 * The key of a lock name under prefix: prefix, the name with '/', '%' and
 * bytes outside printable ASCII %-escaped, then '/'. The escaping keeps every
 * name's directory apart: no name's directory is a prefix of another's.
 * Returns the malloc'd directory, or NULL when out of memory.
 */
char *dlock__etcd_dir(const char *prefix, const char *name);

/* The end of the range of all keys starting with prefix (the prefix with
 * its last byte plus one), malloc'd. */
char *dlock__etcd_prefix_end(const char *prefix);

/*
 * Whether an etcd server of version text v (the Maintenance Status reply's
 * "version", e.g. "3.5.8") answers a lease keepalive only as the current
 * leader: the fix of etcd-io/etcd#15247 (a stale leader, stuck or cut off,
 * renewed leases the real leader was revoking), in 3.4.25, 3.5.8 and every
 * later release. 0 for older servers, a pre-release of those two, and any
 * text that is not MAJOR.MINOR.PATCH[-...|+...] (NULL included): a server
 * dlock cannot place is taken for an old one (docs/etcd.md).
 */
int dlock__etcd_version_fixed(const char *v);

#endif
