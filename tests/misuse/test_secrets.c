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
 * What it cannot see: copies the libraries dlock calls make and free
 * themselves (hiredis's output buffer of AUTH, jansson's string in the
 * login request, libcurl's request buffer), whose free() calls are their
 * own; and a copy moved by realloc(). README says so.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdatomic.h>
#include <string.h>

#include "test.h"

/* A password no other bytes of the test contain. */
#define SECRET "Wq4-wipe-me-9xPassw0rd"

void __real_free(void *p);
void __wrap_free(void *p);

static _Atomic(const char *) watched;
static atomic_int leaked;

void __wrap_free(void *p)
{
    const char *secret = atomic_load(&watched);

    if (p != NULL && secret != NULL) {
        size_t n = malloc_usable_size(p);
        /* Half the password is enough to give it away. */
        size_t want = strlen(secret) / 2;
        if (n >= want && memmem(p, n, secret + strlen(secret) - want, want) != NULL)
            atomic_fetch_add(&leaked, 1);
    }
    __real_free(p);
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

/* etcd's user:password: the URL's copy and the login request's body. */
static void etcd_password_wiped(void)
{
    test_etcd e;
    char url[200], body[200];
    char *reply;
    static const char *const setup[][2] = {
        {"/v3/auth/user/grant", "{\"user\":\"root\",\"role\":\"root\"}"},
        {"/v3/auth/enable", "{}"},
    };

    test_etcd_start(&e, 1, NULL);
    snprintf(body, sizeof(body), "{\"name\":\"root\",\"password\":\"%s\"}", SECRET);
    CHECK((reply = test_etcd_post(&e, 0, "/v3/auth/user/add", body)) != NULL);
    free(reply);
    for (size_t i = 0; i < sizeof(setup) / sizeof(setup[0]); i++) {
        CHECK((reply = test_etcd_post(&e, 0, setup[i][0], setup[i][1])) != NULL);
        free(reply);
    }
    atomic_store(&watched, SECRET);
    snprintf(url, sizeof(url), "etcd://root:%s@127.0.0.1:%d?insecure_auth=1", SECRET, e.client_port[0]);
    use_client(url);
    atomic_store(&watched, NULL);
    fprintf(stderr, "blocks freed with the password in them: %d\n", atomic_load(&leaked));
    CHECK(atomic_load(&leaked) == 0);
    test_etcd_stop(&e);
}

TEST_MAIN({"redis_password_wiped", redis_password_wiped, NULL},
          {"etcd_password_wiped", etcd_password_wiped, "etcd"})
