/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The etcd backend's names: the directory of a lock NAME under the key
 * prefix, the key of one acquisition in it (named by a key id the client
 * reuses, or by the owner token) and the lease it lives on (derived from the
 * token: see the top of etcd.c for why), and the range requests that read a
 * directory's keys.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/etcd/etcd_int.h"
#include "core/error.h"

/* ---- names ------------------------------------------------------------- */

static uint64_t hex64(const char *s)
{
    uint64_t v = 0;

    for (int i = 0; i < 16 && s[i] != '\0'; i++) {
        char ch = s[i];
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : 0;
        v = v << 4 | (uint64_t)d;
    }
    return v;
}

/* splitmix64's finaliser: spreads the TTL over all bits. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ x >> 31;
}

static int64_t positive(uint64_t v)
{
    v &= (uint64_t)INT64_MAX;
    return v != 0 ? (int64_t)v : 1;
}

/* etcd leases are whole seconds, at least 1: round up, so that the server
 * never lets a lease go before the client's deadline. */
static int64_t ttl_of(int64_t lease_ms)
{
    int64_t s = (lease_ms + 999) / 1000;
    return s > 0 ? s : 1;
}

/* Bit 62 clear: spare leases have it set (etcd_spare.c). */
int64_t dlock__etcd_lease_for(const char *owner, int64_t ttl)
{
    return positive((hex64(owner) ^ mix(hex64(owner + 16) + (uint64_t)ttl)) &
                    ~DLOCK__ETCD_ID_BITS);
}

/*
 * Key ids are reused. etcd keeps every key ever written in its index until
 * the key's revisions are compacted away, deleted keys too, and a range
 * over a lock's directory (every acquire reads the first key) walks all of
 * them: with a new key per acquisition, a lock taken N times since the last
 * compaction costs N steps per acquire (measured: about +0.25 ms per 1000
 * acquisitions on one etcd 3.4 member, 8 ms after 60000). So an id whose key
 * a release saw deleted goes back to a list, and the next acquisition of
 * the client borrows it: a lock taken again and again by one client names
 * the same key, as etcd's own Mutex does with its session's lease.
 *
 * The core's tokens are random, and each call names the acquisition by its
 * token alone; the backend keeps the loans, token -> id, for the life of
 * each acquisition, and an acquisition without one names its keys by the
 * first half of its token, as before. A loan starts with the acquisition's
 * first try (a try that will not wait, or the first try through a watch:
 * etcd.c) and ends when the backend sees the acquisition end: its release,
 * a try that will not wait and failed for sure (a busy one gives its id
 * back: it put nothing), a watch left without the lock. The parts of an
 * atomic multi-lock borrow none: a try of theirs made while waiting whose
 * outcome is not known ends without a call the backend would see. An id is
 * in one acquisition's hands at a time (the list hands it out once), and
 * only a delete's answer puts it back (or a busy try's, which put nothing);
 * ids of acquisitions that end otherwise are dropped. The lease IDs stay
 * derived from the whole token (random), so they stay unique.
 */

/* Loans at most: past that, acquisitions name their keys by their tokens. */
#define LENT_MAX 1024

/* Caller holds ids_mu. The loan of token, or NULL. */
static dlock__etcd_loan *loan_of(dlock__etcd_be *be, const char *token)
{
    for (size_t i = 0; i < be->nlent; i++)
        if (strcmp(be->lent[i].token, token) == 0)
            return &be->lent[i];
    return NULL;
}

int64_t dlock__etcd_key_id(dlock__etcd_be *be, const char *token)
{
    dlock__etcd_loan *loan;
    int64_t id = 0;

    pthread_mutex_lock(&be->ids_mu);
    if ((loan = loan_of(be, token)) != NULL)
        id = loan->id;
    pthread_mutex_unlock(&be->ids_mu);
    return id != 0 ? id : positive(hex64(token));
}

void dlock__etcd_key_id_lend(dlock__etcd_be *be, const char *token)
{
    dlock__etcd_loan *grown;

    if (strlen(token) >= sizeof(be->lent[0].token))
        return;
    pthread_mutex_lock(&be->ids_mu);
    if (be->nfree == 0 || be->nlent == LENT_MAX || loan_of(be, token) != NULL)
        goto out;
    if (be->nlent == be->lent_cap) {
        size_t cap = be->lent_cap != 0 ? be->lent_cap * 2 : 8;
        /* Out of memory: no loan, the token names the keys. */
        if ((grown = realloc(be->lent, cap * sizeof(*grown))) == NULL)
            goto out;
        be->lent = grown;
        be->lent_cap = cap;
    }
    memcpy(be->lent[be->nlent].token, token, strlen(token) + 1);
    be->lent[be->nlent++].id = be->free_ids[--be->nfree];
out:
    pthread_mutex_unlock(&be->ids_mu);
}

/* Caller holds ids_mu. End token's loan, if it has one: its id, else 0. */
static int64_t loan_end(dlock__etcd_be *be, const char *token)
{
    dlock__etcd_loan *loan = loan_of(be, token);
    int64_t id;

    if (loan == NULL)
        return 0;
    id = loan->id;
    *loan = be->lent[--be->nlent];
    return id;
}

void dlock__etcd_key_id_free(dlock__etcd_be *be, const char *token)
{
    int64_t id;
    int i;

    pthread_mutex_lock(&be->ids_mu);
    if ((id = loan_end(be, token)) == 0)
        id = positive(hex64(token));
    for (i = 0; i < be->nfree && be->free_ids[i] != id; i++) {
    }
    if (i == be->nfree && be->nfree < DLOCK__ETCD_FREE_IDS)
        be->free_ids[be->nfree++] = id;
    pthread_mutex_unlock(&be->ids_mu);
}

void dlock__etcd_key_id_give_back(dlock__etcd_be *be, const char *token)
{
    int64_t id;
    int i;

    pthread_mutex_lock(&be->ids_mu);
    if ((id = loan_end(be, token)) != 0) {
        for (i = 0; i < be->nfree && be->free_ids[i] != id; i++) {
        }
        if (i == be->nfree && be->nfree < DLOCK__ETCD_FREE_IDS)
            be->free_ids[be->nfree++] = id;
    }
    pthread_mutex_unlock(&be->ids_mu);
}

void dlock__etcd_key_id_drop(dlock__etcd_be *be, const char *token)
{
    pthread_mutex_lock(&be->ids_mu);
    loan_end(be, token);
    pthread_mutex_unlock(&be->ids_mu);
}

void dlock__etcd_keys_free(dlock__etcd_keys *k)
{
    free(k->dir);
    free(k->dir_end);
    free(k->dir_all);
    free(k->key);
    memset(k, 0, sizeof(*k));
}

/* owner may be NULL (status, force release: the directory only). */
int dlock__etcd_keys_make(dlock__etcd_keys *k, dlock__etcd_be *be, const char *name,
                          const char *owner, int64_t lease_ms)
{
    memset(k, 0, sizeof(*k));
    k->value = be->value;
    k->dir = dlock__etcd_dir(be->prefix, name);
    k->dir_all = k->dir != NULL ? dlock__etcd_prefix_end(k->dir) : NULL;
    if (k->dir_all == NULL || asprintf(&k->dir_end, "%sg", k->dir) < 0) {
        k->dir_end = NULL;
        goto oom;
    }
    if (owner != NULL) {
        size_t n = strlen(k->dir) + 17;
        k->key = malloc(n);
        if (k->key == NULL)
            goto oom;
        snprintf(k->key, n, "%s%016" PRIx64, k->dir, (uint64_t)dlock__etcd_key_id(be, owner));
        k->ttl = ttl_of(lease_ms);
        k->lease = dlock__etcd_lease_for(owner, k->ttl);
    }
    return DLOCK_OK;
oom:
    dlock__etcd_keys_free(k);
    return dlock__fail(DLOCK_ENOMEM, "out of memory");
}

int dlock__etcd_same_key(const dlock__etcd_kv *kv, const char *key)
{
    return kv->key != NULL && kv->key_len == strlen(key) && memcmp(kv->key, key, kv->key_len) == 0;
}

/* ---- range requests ---------------------------------------------------- */

/* Range requests, bare (for /v3/kv/range) or as a txn operation. */
json_t *dlock__etcd_as_op(json_t *range)
{
    return range != NULL ? json_pack("{s:o}", "request_range", range) : NULL;
}

/* The first key of the directory by create revision: the holder. */
json_t *dlock__etcd_range_first(const dlock__etcd_keys *k)
{
    return json_pack("{s:o, s:o, s:s, s:s, s:I, s:b}", "key", dlock__etcd_str(k->dir),
                     "range_end", dlock__etcd_str(k->dir_end), "sort_order", "ASCEND",
                     "sort_target", "CREATE", "limit", (json_int_t)1, "keys_only", 1);
}

/* The key just ahead of create revision rev: the one to wait for. */
json_t *dlock__etcd_range_ahead(const dlock__etcd_keys *k, int64_t rev)
{
    return json_pack("{s:o, s:o, s:s, s:s, s:I, s:I, s:b}", "key", dlock__etcd_str(k->dir),
                     "range_end", dlock__etcd_str(k->dir_end), "sort_order", "DESCEND",
                     "sort_target", "CREATE", "max_create_revision", (json_int_t)(rev - 1),
                     "limit", (json_int_t)1, "keys_only", 1);
}

json_t *dlock__etcd_range_key(const char *key)
{
    return json_pack("{s:o, s:b}", "key", dlock__etcd_str(key), "keys_only", 1);
}

