/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The lock family and its fences as an ACL user (test.h, test_acl_scenario):
 * run on Sentinel and Cluster URLs by test_sentinel and test_cluster, whose
 * nodes carry the README's minimal ACL.
 */
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#include "test.h"

void test_acl_setuser(test_redis *r, const char *user, const char *pass, const char *rules)
{
    struct timeval tv = {2, 0};
    const char *argv[128];
    char buf[2048], pw[128];
    redisContext *c;
    redisReply *rep;
    int n = 0;

    snprintf(buf, sizeof(buf), "%s", rules);
    snprintf(pw, sizeof(pw), ">%s", pass);
    argv[n++] = "ACL";
    argv[n++] = "SETUSER";
    argv[n++] = user;
    argv[n++] = "reset";
    argv[n++] = "on";
    argv[n++] = pw;
    for (char *tok = strtok(buf, " "); tok != NULL && n < 128; tok = strtok(NULL, " "))
        argv[n++] = tok;
    c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    CHECK(c != NULL && c->err == 0);
    rep = redisCommandArgv(c, n, argv, NULL);
    if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "ACL SETUSER %s on port %d: %s\n", user, r->port,
                rep != NULL ? rep->str : "no reply");
        exit(1);
    }
    freeReplyObject(rep);
    redisFree(c);
}

void test_open_refused(const char *url, int64_t connect_ms, int want, const char *what,
                       const char *where, const char *cause)
{
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL;

    o.connect_timeout_ms = connect_ms;
    CHECK_RC(dlock_client_open(&c, url, &o), want);
    fprintf(stderr, "%s: %s\n", what, dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), where);
    CHECK_CONTAINS(dlock_error_message(), cause);
}

void test_acquire_refused(const char *url, int want, const char *what, const char *cause,
                          const char *secret)
{
    dlock_client *c = NULL;
    dlock_lock *l = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "refused", NULL), want);
    fprintf(stderr, "%s: %s\n", what, dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), cause);
    CHECK(strstr(dlock_error_message(), secret) == NULL);
    dlock_client_free(c);
}

void test_retake(dlock_client *c, dlock_lock *lock, const char *name, uint64_t before,
                 int *survived, int *back, const char *label)
{
    dlock_acquire_options ao = test_opts(0, 120000, 0);
    dlock_lock *again = NULL;

    if (dlock_lock_check(lock) == DLOCK_OK)
        ++*survived;
    dlock_release(lock);
    CHECK_RC(dlock_acquire(&again, c, name, &ao), DLOCK_OK);
    if (dlock_lock_fence(again) <= before && ++*back <= 3)
        fprintf(stderr, "%s: %s: fence %llu after the failover, %llu before\n", label, name,
                (unsigned long long)dlock_lock_fence(again), (unsigned long long)before);
    CHECK_RC(dlock_release(again), DLOCK_OK);
}

/* The step that failed, its code and message. */
typedef struct {
    int step;
    int code;
    char *msg;
    size_t size;
} acl_run;

/* One step: want is the code expected; on a mismatch the step and the
 * message are kept and 0 returned. */
static int step(acl_run *r, int rc, int want, const char *what)
{
    r->step++;
    if (rc == want)
        return 1;
    r->code = rc;
    snprintf(r->msg, r->size, "%s: %s (%s)", what, dlock_strerror(rc), dlock_error_message());
    return 0;
}

/* A check of a value, not of a call. */
static int holds(acl_run *r, int ok, const char *fmt, ...)
{
    va_list ap;

    r->step++;
    if (ok)
        return 1;
    r->code = DLOCK_EPROTO;
    va_start(ap, fmt);
    vsnprintf(r->msg, r->size, fmt, ap);
    va_end(ap);
    return 0;
}

int test_acl_scenario(const char *url, int64_t connect_ms, int *code, char *msg, size_t size)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options o = test_opts(0, 20000, 1);
    dlock_client *c = NULL, *c2 = NULL;
    dlock_lock *a = NULL, *b = NULL, *r1 = NULL, *r2 = NULL, *w = NULL, *s1 = NULL,
               *s2 = NULL, *s3 = NULL, *m = NULL;
    const char *tagged[2] = {"{aclm}a", "{aclm}b"};
    dlock_lock_info info;
    test_acquirer wt;
    pthread_t t;
    acl_run r = {0, 0, msg, size};
    uint64_t f1 = 0;
    int ok = 0;

    msg[0] = '\0';
    co.connect_timeout_ms = connect_ms;
    if (!step(&r, dlock_client_open(&c, url, &co), DLOCK_OK, "open") ||
        !step(&r, dlock_client_open(&c2, url, &co), DLOCK_OK, "open a second client") ||
        /* mutex: fence, busy, a waiter woken by the release */
        !step(&r, dlock_acquire(&a, c, "acl-mutex", &o), DLOCK_OK, "acquire") ||
        !step(&r, dlock_lock_check(a), DLOCK_OK, "check") ||
        !step(&r, dlock_acquire(&b, c2, "acl-mutex", &o), DLOCK_EBUSY, "try a held lock"))
        goto out;
    f1 = dlock_lock_fence(a);
    test_acquirer_init(&wt, c2, "acl-mutex", test_opts(60000, 20000, 1));
    if (pthread_create(&t, NULL, test_acquirer_main, &wt) != 0)
        goto out;
    /* The waiter is asleep on the channel after its first try (a look
     * takes well under this); the release wakes it. */
    test_sleep_ms(300);
    ok = step(&r, dlock_lock_extend(a, 20000), DLOCK_OK, "extend") &&
         step(&r, dlock_release(a), DLOCK_OK, "release");
    a = NULL;
    pthread_join(t, NULL);
    b = wt.lock;
    if (!ok || !step(&r, wt.rc, DLOCK_OK, "the waiter's acquire") ||
        !holds(&r, dlock_lock_fence(b) > f1, "the waiter's fence %llu is not above %llu",
               (unsigned long long)dlock_lock_fence(b), (unsigned long long)f1) ||
        !step(&r, dlock_status(&info, c, "acl-mutex"), DLOCK_OK, "status") ||
        !holds(&r, info.held == 1 && info.fence == dlock_lock_fence(b),
               "status: held %d fence %llu", info.held, (unsigned long long)info.fence) ||
        !step(&r, dlock_force_release(&info, c, "acl-mutex"), DLOCK_OK, "force release") ||
        !step(&r, dlock_release(b), DLOCK_ELOST, "release after a force release"))
        goto out;
    b = NULL;
    ok = 0;
    /* read-write */
    o.kind = DLOCK_KIND_READ;
    if (!step(&r, dlock_acquire(&r1, c, "acl-rw", &o), DLOCK_OK, "read") ||
        !step(&r, dlock_acquire(&r2, c2, "acl-rw", &o), DLOCK_OK, "a second read"))
        goto out;
    o.kind = DLOCK_KIND_WRITE;
    if (!step(&r, dlock_acquire(&w, c2, "acl-rw", &o), DLOCK_EBUSY, "write while read") ||
        !step(&r, dlock_release(r1), DLOCK_OK, "release a read"))
        goto out;
    r1 = NULL;
    if (!step(&r, dlock_release(r2), DLOCK_OK, "release the other read"))
        goto out;
    r2 = NULL;
    if (!step(&r, dlock_acquire(&w, c2, "acl-rw", &o), DLOCK_OK, "write") ||
        !step(&r, dlock_release(w), DLOCK_OK, "release the write"))
        goto out;
    w = NULL;
    /* semaphore of 2 */
    o.kind = DLOCK_KIND_SEMAPHORE;
    o.permits = 2;
    if (!step(&r, dlock_acquire(&s1, c, "acl-sem", &o), DLOCK_OK, "permit 1") ||
        !step(&r, dlock_acquire(&s2, c2, "acl-sem", &o), DLOCK_OK, "permit 2") ||
        !step(&r, dlock_acquire(&s3, c2, "acl-sem", &o), DLOCK_EBUSY, "permit 3 of 2"))
        goto out;
    o.permits = 0;
    /* fair */
    o.kind = DLOCK_KIND_FAIR;
    if (!step(&r, dlock_acquire(&a, c, "acl-fair", &o), DLOCK_OK, "fair") ||
        !step(&r, dlock_release(a), DLOCK_OK, "release fair"))
        goto out;
    a = NULL;
    /* multi, one hash tag */
    o.kind = DLOCK_KIND_MUTEX;
    if (!step(&r, dlock_acquire_multi(&m, c, tagged, 2, &o), DLOCK_OK, "multi") ||
        !step(&r, dlock_release(m), DLOCK_OK, "release multi"))
        goto out;
    m = NULL;
    /* The fence goes on from where it was. */
    if (!step(&r, dlock_acquire(&a, c, "acl-mutex", &o), DLOCK_OK, "acquire again") ||
        !holds(&r, dlock_lock_fence(a) == f1 + 2, "fence %llu after %llu and %llu",
               (unsigned long long)dlock_lock_fence(a), (unsigned long long)f1,
               (unsigned long long)f1 + 1))
        goto out;
    r.step = 0;
out:
    *code = r.step ? r.code : DLOCK_OK;
    dlock_release(a);
    dlock_release(b);
    dlock_release(r1);
    dlock_release(r2);
    dlock_release(w);
    dlock_release(s1);
    dlock_release(s2);
    dlock_release(s3);
    dlock_release(m);
    dlock_client_free(c);
    dlock_client_free(c2);
    return r.step;
}
