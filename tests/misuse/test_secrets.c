/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Secrets in freed memory (README, Security: "a password is zeroed in
 * memory when the client is freed"; docs/etcd.md: the login request).
 *
 * This binary is linked with -Wl,--wrap=free: every free() called by code
 * linked into it, the library's own (dlock_static) included, goes through
 * __wrap_free below, which looks for the password in the block before it is
 * freed. A copy that dlock frees without wiping it first is counted, at
 * any time in the client's life: open, log in, acquire, release, free.
 *
 * jansson and libcurl take allocator functions: the etcd cases route their
 * frees through the same check, so jansson's copies of the login request
 * and curl's copies of the header lines are watched too.
 *
 * What it cannot see: copies hiredis makes and frees itself (the output
 * buffer of AUTH); a copy moved by realloc(). And what it sees but dlock
 * cannot wipe: libcurl's request buffer, which holds the header lines and
 * the body as sent (the login request's password, the token) and is freed
 * as it is; etcd_token_header_wiped therefore counts only blocks that are a
 * header line, not the request that contains one. README says so.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdatomic.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

#include "test.h"

/* A password no other bytes of the test contain. */
#define SECRET "Wq4-wipe-me-9xPassw0rd"

void __real_free(void *p);
void __wrap_free(void *p);

static _Atomic(const char *) watched;
/* A header line freed as it is: a block that begins with it and goes on. */
static _Atomic(const char *) watched_line;
static atomic_int leaked;

void __wrap_free(void *p)
{
    const char *secret = atomic_load(&watched), *line = atomic_load(&watched_line);
    size_t n = p != NULL ? malloc_usable_size(p) : 0;

    if (p != NULL && secret != NULL) {
        /* Half the password is enough to give it away. */
        size_t want = strlen(secret) / 2;
        if (n >= want && memmem(p, n, secret + strlen(secret) - want, want) != NULL)
            atomic_fetch_add(&leaked, 1);
    }
    if (p != NULL && line != NULL && n > strlen(line) && memcmp(p, line, strlen(line)) == 0 &&
        ((const char *)p)[strlen(line)] != '\0')
        atomic_fetch_add(&leaked, 1);
    __real_free(p);
}

/* jansson's and libcurl's allocations, freed through the check above. */
static void *lib_malloc(size_t n)
{
    return malloc(n);
}

static void *lib_realloc(void *p, size_t n)
{
    return realloc(p, n);
}

static char *lib_strdup(const char *s)
{
    return strdup(s);
}

static void *lib_calloc(size_t n, size_t size)
{
    return calloc(n, size);
}

/* A user "root" with password SECRET, and auth on. */
static void etcd_start_with_auth(test_etcd *e)
{
    char body[200];
    char *reply;
    static const char *const setup[][2] = {
        {"/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}"},
        {"/v3/auth/enable", "{}"},
    };

    test_etcd_start(e, 1, NULL);
    snprintf(body, sizeof(body), "{\"name\":\"root\",\"password\":\"%s\"}", SECRET);
    CHECK((reply = test_etcd_post(e, 0, "/v3/auth/user/add", body)) != NULL);
    free(reply);
    for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++) {
        CHECK((reply = test_etcd_post(e, 0, setup[i][0], setup[i][1])) != NULL);
        free(reply);
    }
}

static void use_client(const char *url)
{
    dlock_client *c = NULL;
    dlock_lock *l;
    dlock_lock_info info;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "secret", NULL), DLOCK_OK);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "secret"), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
}

/* The password of a redis:// URL: dlock's copies are wiped before they
 * are freed. A wrong password too (the failed open frees what it had). */
static void redis_password_wiped(void)
{
    test_redis r;
    char url[200];
    dlock_client *c = NULL;

    test_redis_start(&r, "--requirepass " SECRET);
    atomic_store(&watched, SECRET);
    snprintf(url, sizeof(url), "redis://:%s@127.0.0.1:%d", SECRET, r.port);
    use_client(url);
    snprintf(url, sizeof(url), "redis://:x%s@127.0.0.1:%d", SECRET, r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EAUTH);
    atomic_store(&watched, NULL);
    fprintf(stderr, "blocks freed with the password in them: %d\n", atomic_load(&leaked));
    CHECK(atomic_load(&leaked) == 0);
    test_redis_stop(&r);
}

/* A secret query parameter (password=, key_secret=, ...: the ones
 * redaction hides) is wiped as the URL's password is, here by a refused
 * open, which frees the parsed URL. */
static void query_secret_wiped(void)
{
    dlock_client *c = NULL;

    atomic_store(&watched, SECRET);
    CHECK_RC(dlock_client_open(&c, "redis://127.0.0.1:1?key_secret=" SECRET, NULL),
             DLOCK_EINVAL);
    atomic_store(&watched, NULL);
    fprintf(stderr, "blocks freed with the secret in them: %d\n", atomic_load(&leaked));
    CHECK(atomic_load(&leaked) == 0);
}

/* Use a client of an etcd with auth on, watching for the password
 * (password 1) or for header lines with the token (password 0): no block
 * freed may hold one. */
static void etcd_watched_use(int password, const char *what)
{
    test_etcd e;
    char url[200];

    json_set_alloc_funcs(lib_malloc, __wrap_free);
    etcd_start_with_auth(&e);
    atomic_store(password ? &watched : &watched_line, password ? SECRET : "token: ");
    snprintf(url, sizeof(url), "etcd://root:%s@127.0.0.1:%d?insecure_auth=1", SECRET,
             e.client_port[0]);
    use_client(url);
    atomic_store(password ? &watched : &watched_line, NULL);
    fprintf(stderr, "blocks freed with %s in them: %d\n", what, atomic_load(&leaked));
    CHECK(atomic_load(&leaked) == 0);
    test_etcd_stop(&e);
}

/* etcd's user:password: the URL's copy and the login request's body, ours
 * and jansson's. */
static void etcd_password_wiped(void)
{
    etcd_watched_use(1, "the password");
}

/* etcd's token: the "Authorization: TOKEN" lines, dlock's and the copies
 * curl_slist_append makes (freed by libcurl), wiped before they are freed. */
static void etcd_token_header_wiped(void)
{
    CHECK(curl_global_init_mem(CURL_GLOBAL_DEFAULT, lib_malloc, __wrap_free, lib_realloc,
                               lib_strdup, lib_calloc) == CURLE_OK);
    etcd_watched_use(0, "a header line with the token");
}

TEST_MAIN({"redis_password_wiped", redis_password_wiped, NULL},
          {"query_secret_wiped", query_secret_wiped, NULL},
          {"etcd_password_wiped", etcd_password_wiped, "etcd"},
          {"etcd_token_header_wiped", etcd_token_header_wiped, "etcd"})
