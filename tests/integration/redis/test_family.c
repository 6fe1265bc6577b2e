/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What only Redis has in the lock family (docs/family.md): the fair queue's
 * keys, channels and script counts, the multi-lock's one-script path, the
 * fence counters' bounded state, server time under skewed clocks, the
 * family's ACL and bad input, and the holder records in the keys. The
 * contracts every backend keeps are family-<backend>.* (tests/integration/
 * core/test_family_suite.c), run on Redis too. Each test starts its own
 * throwaway server; no test decides by how long something took.
 */
#define _GNU_SOURCE
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/redis/redis_scripts.h"
#include "test.h"
#include "test_family.h"

static dlock_client *open_client(const test_redis *r)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, r->url, NULL), DLOCK_OK);
    return c;
}

static dlock_acquire_options kopts(int kind, int64_t wait_ms, int64_t lease_ms)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.kind = kind;
    o.wait_ms = wait_ms;
    o.lease_ms = lease_ms;
    return o;
}

static void *shared_page(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    CHECK(p != MAP_FAILED);
    memset(p, 0, size);
    return p;
}

static void kill_child(pid_t pid)
{
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, NULL, 0) == pid);
}

/* Wait (at most 20 s) until a server command's integer reply is want. */
static void wait_cmd(test_redis *r, long long want, const char *fmt, const char *arg)
{
    for (int i = 0; i < 2000; i++) {
        if (test_redis_cmd(r, fmt, arg) == want)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "'%s' (%s) never became %lld\n", fmt, arg, want);
    exit(1);
}

/* Wait (at most 20 s) for an atomic flag in shared memory to reach want. */
static void wait_atomic(atomic_int *v, int want, const char *what)
{
    for (int i = 0; i < 2000; i++) {
        if (atomic_load(v) >= want)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "%s: %d, never reached %d\n", what, atomic_load(v), want);
    exit(1);
}

/* A raw command on the server, for keys the family keeps: out gets the
 * string reply, or the last element of an array reply ("" for nil). */
static void raw_string(test_redis *r, char *out, size_t size, const char *fmt, ...)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep;
    va_list ap;

    CHECK(c != NULL && !c->err);
    va_start(ap, fmt);
    rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    CHECK(rep != NULL);
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements > 0 &&
        rep->element[rep->elements - 1]->type == REDIS_REPLY_STRING)
        snprintf(out, size, "%s", rep->element[rep->elements - 1]->str);
    else
        snprintf(out, size, "%s", rep->type == REDIS_REPLY_STRING ? rep->str : "");
    freeReplyObject(rep);
    redisFree(c);
}

/* Make the registry entry of a fence counter due now, as if its retention
 * had passed. The entry must exist: ZADD XX CH counts it only if it did
 * (and its score changed), where a plain ZADD XX returns 0 either way. */
static void make_due_in(test_redis *r, const char *registry, const char *counter)
{
    char v[32];

    CHECK(test_redis_cmd(r, "ZADD %s XX CH 0 %s", registry, counter) == 1);
    raw_string(r, v, sizeof(v), "ZSCORE %s %s", registry, counter);
    CHECK(strcmp(v, "0") == 0);
}

static void make_due(test_redis *r, const char *counter)
{
    make_due_in(r, "dlock:fence-registry", counter);
}

/* ---------------------------------------------------------------------- */
/* Fair */

/* Ten waiters, each a process, queue one after the other and get the lock
 * in that order; each release wakes only the next waiter. */
static void fair_fifo_ten_waiters(void)
{
    enum { WAITERS = 10 };
    test_redis r;
    dlock_client *c;
    dlock_lock *holder;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0, 10000);
    struct {
        atomic_int next;
        int order[WAITERS];
    } *sh = shared_page(4096);
    pid_t pids[WAITERS];
    long long before, used;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    /* The holder is not renewed (a long lease instead): this process must
     * have no thread of the library's when it forks the waiters. */
    o.lease_ms = 120000;
    o.auto_renew = 0;
    CHECK_RC(dlock_acquire(&holder, c, "fifo", &o), DLOCK_OK);
    for (int i = 0; i < WAITERS; i++) {
        pids[i] = fork();
        CHECK(pids[i] >= 0);
        if (pids[i] == 0) {
            dlock_client *cc = open_client(&r);
            dlock_acquire_options w = kopts(DLOCK_KIND_FAIR, 60000, 10000);
            dlock_lock *l;
            CHECK_RC(dlock_acquire(&l, cc, "fifo", &w), DLOCK_OK);
            sh->order[atomic_fetch_add(&sh->next, 1)] = i;
            test_sleep_ms(20);
            CHECK_RC(dlock_release(l), DLOCK_OK);
            dlock_client_free(cc);
            _exit(0);
        }
        /* The next one starts once this one has its place. */
        wait_cmd(&r, i + 1, "ZCARD %s", "dlock:{fifo}:queue");
    }
    /* A try does not jump the queue, even when the lock is free for the
     * head that is on its way. */
    {
        dlock_lock *l = NULL;
        CHECK_RC(dlock_acquire(&l, c, "fifo", &o), DLOCK_EBUSY);
    }
    before = test_redis_calls(&r, "evalsha");
    CHECK_RC(dlock_release(holder), DLOCK_OK);
    for (int i = 0; i < WAITERS; i++)
        test_wait_child_ok(pids[i]);
    used = test_redis_calls(&r, "evalsha") - before;
    for (int i = 0; i < WAITERS; i++) {
        if (sh->order[i] != i) {
            fprintf(stderr, "position %d went to waiter %d:", i, sh->order[i]);
            for (int j = 0; j < WAITERS; j++)
                fprintf(stderr, " %d", sh->order[j]);
            fprintf(stderr, "\n");
            exit(1);
        }
    }
    /* Each hand-off: one release and one acquire by the woken head (a
     * refresh or two at most). Waking every waiter at each release would
     * cost some 55 more. */
    fprintf(stderr, "scripts for %d fair hand-offs: %lld\n", WAITERS, used);
    CHECK(used <= 3 * WAITERS);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{fifo}:queue") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* Every message published on the prefix's channels, read by a spy with
 * PSUBSCRIBE dlock:* until one on dlock:spy-stop. */
typedef struct {
    int port;
    atomic_int subscribed;
    int n;
    char msgs[64][160];
} spy_state;

static void *spy_main(void *p)
{
    spy_state *s = p;
    redisContext *c = redisConnect("127.0.0.1", s->port);
    redisReply *rep;

    CHECK(c != NULL && !c->err);
    rep = redisCommand(c, "PSUBSCRIBE dlock:*");
    CHECK(rep != NULL);
    freeReplyObject(rep);
    atomic_store(&s->subscribed, 1);
    for (;;) {
        CHECK(redisGetReply(c, (void **)&rep) == REDIS_OK);
        CHECK(rep->type == REDIS_REPLY_ARRAY && rep->elements == 4);
        if (strcmp(rep->element[2]->str, "dlock:spy-stop") == 0) {
            freeReplyObject(rep);
            break;
        }
        CHECK(s->n < 64);
        snprintf(s->msgs[s->n++], sizeof(s->msgs[0]), "%s", rep->element[3]->str);
        freeReplyObject(rep);
    }
    redisFree(c);
    return NULL;
}

/* The fair queue's hand-offs wake the head waiter by name, on a channel
 * anyone with SUBSCRIBE on the prefix reads: the name is a random id of the
 * waiter's, never an owner token (which release and extend check). A spy
 * sees every message of two hand-offs; none holds the holder's or a
 * waiter's token (read from the server's holds), and the targeted ones
 * name the queued ids. */
static void fair_tokens_never_on_channels(void)
{
    test_redis r;
    dlock_client *ch, *cw[2];
    dlock_lock *h;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 60000, 10000);
    test_acquirer w[2];
    pthread_t t[2], spy;
    spy_state *s = calloc(1, sizeof(*s));
    char tokens[3][64], ids[2][64];
    int named = 0;

    test_redis_start(&r, NULL);
    s->port = r.port;
    CHECK(pthread_create(&spy, NULL, spy_main, s) == 0);
    wait_atomic(&s->subscribed, 1, "spy subscribed");
    ch = open_client(&r);
    CHECK_RC(dlock_acquire(&h, ch, "ft", &o), DLOCK_OK);
    raw_string(&r, tokens[0], sizeof(tokens[0]), "HKEYS dlock:{ft}:holds");
    for (int i = 0; i < 2; i++) {
        cw[i] = open_client(&r);
        test_acquirer_init(&w[i], cw[i], "ft", o);
        CHECK(pthread_create(&t[i], NULL, test_acquirer_main, &w[i]) == 0);
        wait_cmd(&r, i + 1, "ZCARD %s", "dlock:{ft}:queue");
    }
    raw_string(&r, ids[0], sizeof(ids[0]), "ZRANGE dlock:{ft}:queue 0 0");
    raw_string(&r, ids[1], sizeof(ids[1]), "ZRANGE dlock:{ft}:queue 1 1");
    CHECK_RC(dlock_release(h), DLOCK_OK);
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK_RC(w[i].rc, DLOCK_OK);
        raw_string(&r, tokens[i + 1], sizeof(tokens[i + 1]), "HKEYS dlock:{ft}:holds");
        CHECK_RC(dlock_release(w[i].lock), DLOCK_OK);
    }
    CHECK(test_redis_cmd(&r, "PUBLISH dlock:spy-stop x") == 1);
    CHECK(pthread_join(spy, NULL) == 0);
    for (int i = 0; i < 3; i++)
        CHECK(strlen(tokens[i]) == 32);
    for (int m = 0; m < s->n; m++) {
        fprintf(stderr, "message %d: %s\n", m, s->msgs[m]);
        for (int i = 0; i < 3; i++)
            if (strstr(s->msgs[m], tokens[i]) != NULL) {
                fprintf(stderr, "  holds the owner token of %s\n", i ? "a waiter" : "the holder");
                exit(1);
            }
        named += strcmp(s->msgs[m], ids[0]) == 0 || strcmp(s->msgs[m], ids[1]) == 0;
    }
    /* Each release named the next waiter, or, to one that listens, pushed
     * the fence to its list (excl_release) and published nothing. */
    fprintf(stderr, "named %d, pushed %lld\n", named, test_redis_calls(&r, "rpush"));
    CHECK(named + test_redis_calls(&r, "rpush") == 2);
    for (int i = 0; i < 2; i++)
        dlock_client_free(cw[i]);
    dlock_client_free(ch);
    free(s);
    test_redis_stop(&r);
}

/* A waiter killed in the queue does not block it: its place expires in
 * server time and the next waiter gets the lock. One that gives up leaves
 * at once. */
static void fair_killed_waiter_does_not_block(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *holder, *late = NULL;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0, 2000);
    dlock_acquire_options quick = kopts(DLOCK_KIND_FAIR, 300, 2000);
    pid_t dead, next;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    /* Not renewed (a long lease instead): no thread of the library's in
     * this process when it forks. */
    o.lease_ms = 120000;
    o.auto_renew = 0;
    CHECK_RC(dlock_acquire(&holder, c, "q", &o), DLOCK_OK);
    dead = fork();
    if (dead == 0) {
        dlock_client *cc = open_client(&r);
        dlock_acquire_options w = kopts(DLOCK_KIND_FAIR, DLOCK_WAIT_FOREVER, 2000);
        dlock_lock *l;
        dlock_acquire(&l, cc, "q", &w);
        _exit(3); /* never gets here: killed in the queue */
    }
    wait_cmd(&r, 1, "ZCARD %s", "dlock:{q}:queue");
    next = fork();
    if (next == 0) {
        dlock_client *cc = open_client(&r);
        dlock_acquire_options w = kopts(DLOCK_KIND_FAIR, 30000, 2000);
        dlock_lock *l;
        CHECK_RC(dlock_acquire(&l, cc, "q", &w), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        dlock_client_free(cc);
        _exit(0);
    }
    wait_cmd(&r, 2, "ZCARD %s", "dlock:{q}:queue");
    kill_child(dead);
    /* One that gives up leaves at once: the last in the queue is still the
     * second to arrive, not this third. */
    CHECK_RC(dlock_acquire(&late, c, "q", &quick), DLOCK_ETIMEOUT);
    {
        char last[32];
        raw_string(&r, last, sizeof(last), "ZRANGE dlock:{q}:queue -1 -1 WITHSCORES");
        CHECK(strcmp(last, "2") == 0);
    }
    CHECK_RC(dlock_release(holder), DLOCK_OK);
    /* The head is dead: the next waiter gets the lock once the dead one's
     * place has expired (2 s of server time after its last refresh). */
    test_wait_child_ok(next);
    CHECK(test_redis_cmd(&r, "ZCARD dlock:{q}:queue") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* How many times the server ran script s with token among its arguments
 * (an acquisition's try) since the last SLOWLOG RESET (the slow log keeps
 * every command: slowlog-log-slower-than 0). */
static int tries_of(test_redis *r, const dlock__redis_script *s, const char *token)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep;
    int n = 0;

    CHECK(c != NULL && !c->err);
    rep = redisCommand(c, "SLOWLOG GET 100000");
    CHECK(rep != NULL && rep->type == REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < rep->elements; i++) {
        const redisReply *e = rep->element[i], *argv;
        CHECK(e->type == REDIS_REPLY_ARRAY && e->elements >= 4);
        argv = e->element[3];
        if (argv->type != REDIS_REPLY_ARRAY || argv->elements < 3 ||
            strcasecmp(argv->element[0]->str, "evalsha") != 0 ||
            strcmp(argv->element[1]->str, s->sha1) != 0)
            continue;
        for (size_t k = 2; k < argv->elements; k++)
            if (argv->element[k]->type == REDIS_REPLY_STRING &&
                strcmp(argv->element[k]->str, token) == 0) {
                n++;
                break;
            }
    }
    freeReplyObject(rep);
    redisFree(c);
    return n;
}

/* Keep every command in the slow log, from an empty one (tries_of). */
static void slowlog_all(test_redis *r)
{
    CHECK(test_redis_cmd(r, "CONFIG SET slowlog-max-len 100000") >= 0);
    CHECK(test_redis_cmd(r, "CONFIG SET slowlog-log-slower-than 0") >= 0);
    CHECK(test_redis_cmd(r, "SLOWLOG RESET") >= 0);
}

/* A waiter of name with wo on a client of its own (*wc), in a thread of
 * its own (*t, acquiring into *a), started once the previous ones are in:
 * its grant entry, the nth, is in the hash grants (it listens). */
static void start_listener(test_redis *r, const char *name, dlock_acquire_options wo,
                           const char *grants, int nth, dlock_client **wc, test_acquirer *a,
                           pthread_t *t)
{
    *wc = open_client(r);
    test_acquirer_init(a, *wc, name, wo);
    CHECK(pthread_create(t, NULL, test_acquirer_main, a) == 0);
    wait_cmd(r, nth, "HLEN %s", grants);
}

static int64_t server_ms(test_redis *r);

/* The handle believes its hold no longer than the server keeps it. Read
 * in this order, the server's clock first, then the handle's belief, then
 * the hold's expiry (member's score in zset, or key's PEXPIRETIME when
 * member is NULL), a watchdog's extension or a slow machine between the
 * reads can only make the check easier, never fail it. */
static void check_believed(test_redis *r, dlock_lock *l, const char *zset, const char *member)
{
    int64_t now = server_ms(r);
    int64_t believed = dlock_lock_valid_ms(l);
    int64_t until;
    char v[64];

    if (member != NULL) {
        raw_string(r, v, sizeof(v), "ZSCORE %s %s", zset, member);
        CHECK(v[0] != '\0');
        until = atoll(v);
    } else {
        until = test_redis_cmd(r, "PEXPIRETIME %s", zset);
        CHECK(until > 0);
    }
    if (believed > until - now + 5) {
        fprintf(stderr, "believed %lld ms, the server keeps it %lld ms\n", (long long)believed,
                (long long)(until - now));
        CHECK(!"the handle believes longer than the server keeps");
    }
}

/*
 * A fair waiter listens for its grant (redis_listen.c): its entry is in
 * base:queue-grant, and the release that finds it at the head of the queue
 * hands it the lock, pushing the next fence to its list (excl_release).
 * Two waiters, each on a client of its own, get the lock in their order:
 * no message and no try of theirs after each release (the slow log holds
 * none of the head's tries from the release on), one push each, the next
 * fence each time, a lease the handle believes no longer than the key's,
 * extended by the watchdog past the confirm window, and nothing left.
 */
static void fair_grant_pushed_to_the_head(void)
{
    test_redis r;
    dlock_client *hc, *wc[2];
    dlock_lock *held;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0, 20000);
    test_acquirer w[2];
    pthread_t t[2];
    char token[64];

    test_redis_start(&r, NULL);
    hc = open_client(&r);
    o.auto_renew = 0;
    CHECK_RC(dlock_acquire(&held, hc, "fg", &o), DLOCK_OK);
    for (int i = 0; i < 2; i++)
        start_listener(&r, "fg", kopts(DLOCK_KIND_FAIR, 20000, 8000), "dlock:{fg}:queue-grant",
                       i + 1, &wc[i], &w[i], &t[i]);
    CHECK(test_redis_cmd(&r, "ZCARD dlock:{fg}:queue") == 2);
    for (int i = 0; i < 2; i++) {
        dlock_lock *prev = i == 0 ? held : w[0].lock;
        uint64_t fence = dlock_lock_fence(prev);

        test_sleep_ms(100); /* the head's BLPOP is out */
        slowlog_all(&r);
        CHECK_RC(dlock_release(prev), DLOCK_OK);
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK_RC(w[i].rc, DLOCK_OK);
        CHECK(dlock_lock_fence(w[i].lock) == fence + 1);
        CHECK(test_redis_calls(&r, "rpush") == i + 1);
        check_believed(&r, w[i].lock, "dlock:{fg}", NULL);
        raw_string(&r, token, sizeof(token), "HKEYS dlock:{fg}:holds");
        CHECK(strlen(token) == 32);
        CHECK(tries_of(&r, &dlock__redis_script_excl_acquire, token) == 0);
        /* The watchdog extends the window to the whole lease. */
        for (int k = 0; k < 300 && test_redis_cmd(&r, "PTTL dlock:{fg}") <= 2000; k++)
            test_sleep_ms(10);
        CHECK(test_redis_cmd(&r, "PTTL dlock:{fg}") > 2000);
        CHECK(!dlock_lock_lost(w[i].lock));
        CHECK(test_redis_cmd(&r, "HLEN dlock:{fg}:queue-grant") == 1 - i);
    }
    CHECK_RC(dlock_release(w[1].lock), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{fg} dlock:{fg}:queue dlock:{fg}:queue-exp "
                             "dlock:{fg}:queue-grant") == 0);
    CHECK(test_redis_cmd(&r, "KEYS dlock:{fg}:grant:*") == 0); /* popped: gone */
    dlock_client_free(hc);
    for (int i = 0; i < 2; i++)
        dlock_client_free(wc[i]);
    test_redis_stop(&r);
}


/* Wait (at most 5 s) until the watchdog has extended a hold handed over
 * for the confirm window past it: member's expiry in zset (server ms). */
static void wait_extended(test_redis *r, const char *zset, const char *member)
{
    for (int i = 0; i < 500; i++) {
        char v[64];
        raw_string(r, v, sizeof(v), "ZSCORE %s %s", zset, member);
        if (v[0] != '\0' && atoll(v) - server_ms(r) > 2500)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "%s %s was never extended past the confirm window\n", zset, member);
    exit(1);
}

/*
 * The read-write lock hands itself over to the waiters that listen
 * (rw_release): the writer's release gives each listening reader a read
 * lock with a fence of its own and pushes it to its list; the last
 * reader's release gives the write lock to the waiting writer that holds
 * the marker. No try of theirs from the release on (the slow log), one
 * push each, fences above the last, leases the handles believe no longer
 * than the server keeps, extended by the watchdog; nothing left after.
 */
static void rw_grant_pushed(void)
{
    test_redis r;
    dlock_client *hc, *rc[2], *wc;
    dlock_lock *held;
    dlock_acquire_options o = kopts(DLOCK_KIND_WRITE, 0, 20000);
    test_acquirer rd[2], wr;
    pthread_t t[2], tw;
    uint64_t fence;
    char tok[2][64];

    test_redis_start(&r, NULL);
    hc = open_client(&r);
    o.auto_renew = 0;
    CHECK_RC(dlock_acquire(&held, hc, "rg", &o), DLOCK_OK);
    fence = dlock_lock_fence(held);
    for (int i = 0; i < 2; i++)
        start_listener(&r, "rg", kopts(DLOCK_KIND_READ, 20000, 8000), "dlock:{rg}:listen-grant",
                       i + 1, &rc[i], &rd[i], &t[i]);
    test_sleep_ms(100); /* their BLPOPs are out */
    slowlog_all(&r);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    for (int i = 0; i < 2; i++) {
        char score[64];
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK_RC(rd[i].rc, DLOCK_OK);
        CHECK(dlock_lock_fence(rd[i].lock) > fence);
        raw_string(&r, score, sizeof(score), "ZRANGE dlock:{rg}:readers %d %d", i, i);
        snprintf(tok[i], sizeof(tok[i]), "%s", score);
        CHECK(strlen(tok[i]) == 32);
        CHECK(tries_of(&r, &dlock__redis_script_rw_acquire, tok[i]) == 0);
    }
    CHECK(dlock_lock_fence(rd[0].lock) != dlock_lock_fence(rd[1].lock));
    CHECK(test_redis_calls(&r, "rpush") == 2);
    for (int i = 0; i < 2; i++) {
        check_believed(&r, rd[i].lock, "dlock:{rg}:readers", tok[i]);
        wait_extended(&r, "dlock:{rg}:readers", tok[i]);
    }
    /* A writer waits, listening; the last reader's release hands it over. */
    start_listener(&r, "rg", kopts(DLOCK_KIND_WRITE, 20000, 8000), "dlock:{rg}:listen-grant", 1,
                   &wc, &wr, &tw);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{rg}:writer-wait") == 1);
    fence = dlock_lock_fence(rd[0].lock) > dlock_lock_fence(rd[1].lock)
                ? dlock_lock_fence(rd[0].lock)
                : dlock_lock_fence(rd[1].lock);
    test_sleep_ms(100);
    slowlog_all(&r);
    CHECK_RC(dlock_release(rd[0].lock), DLOCK_OK);
    CHECK(test_redis_calls(&r, "rpush") == 2); /* a reader is still in */
    CHECK_RC(dlock_release(rd[1].lock), DLOCK_OK);
    CHECK(pthread_join(tw, NULL) == 0);
    CHECK_RC(wr.rc, DLOCK_OK);
    CHECK(dlock_lock_fence(wr.lock) == fence + 1);
    CHECK(test_redis_calls(&r, "rpush") == 3);
    raw_string(&r, tok[0], sizeof(tok[0]), "HKEYS dlock:{rg}:holds");
    CHECK(tries_of(&r, &dlock__redis_script_rw_acquire, tok[0]) == 0);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{rg}:writer-wait") == 0);
    check_believed(&r, wr.lock, "dlock:{rg}", NULL);
    for (int k = 0; k < 300 && test_redis_cmd(&r, "PTTL dlock:{rg}") <= 2000; k++)
        test_sleep_ms(10);
    CHECK(test_redis_cmd(&r, "PTTL dlock:{rg}") > 2000);
    CHECK_RC(dlock_release(wr.lock), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{rg} dlock:{rg}:readers dlock:{rg}:listen "
                             "dlock:{rg}:listen-exp dlock:{rg}:listen-grant") == 0);
    CHECK(test_redis_cmd(&r, "KEYS dlock:{rg}:grant:*") == 0);
    dlock_client_free(hc);
    dlock_client_free(wc);
    for (int i = 0; i < 2; i++)
        dlock_client_free(rc[i]);
    test_redis_stop(&r);
}

/* A semaphore's permit given back goes to the first waiter that listens
 * (sem_release): a permit of its own with the next fence, pushed to its
 * list, no try of its own from the release on; the watchdog then extends
 * it. A second waiter, registered after, gets the next permit given back. */
static void semaphore_grant_pushed(void)
{
    test_redis r;
    dlock_client *hc, *wc[2];
    dlock_lock *held;
    dlock_acquire_options o = kopts(DLOCK_KIND_SEMAPHORE, 0, 20000);
    test_acquirer w[2];
    pthread_t t[2];

    test_redis_start(&r, NULL);
    hc = open_client(&r);
    o.auto_renew = 0;
    o.permits = 1;
    CHECK_RC(dlock_acquire(&held, hc, "sg", &o), DLOCK_OK);
    for (int i = 0; i < 2; i++) {
        dlock_acquire_options wo = kopts(DLOCK_KIND_SEMAPHORE, 20000, 8000);
        wo.permits = 1;
        start_listener(&r, "sg", wo, "dlock:{sg}:listen-grant", i + 1, &wc[i], &w[i], &t[i]);
    }
    for (int i = 0; i < 2; i++) {
        dlock_lock *prev = i == 0 ? held : w[0].lock;
        uint64_t fence = dlock_lock_fence(prev);
        char tok[64];

        test_sleep_ms(100);
        slowlog_all(&r);
        CHECK_RC(dlock_release(prev), DLOCK_OK);
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK_RC(w[i].rc, DLOCK_OK);
        CHECK(dlock_lock_fence(w[i].lock) == fence + 1);
        CHECK(test_redis_calls(&r, "rpush") == i + 1);
        raw_string(&r, tok, sizeof(tok), "ZRANGE dlock:{sg}:sem 0 0");
        CHECK(strlen(tok) == 32);
        CHECK(tries_of(&r, &dlock__redis_script_sem_acquire, tok) == 0);
        check_believed(&r, w[i].lock, "dlock:{sg}:sem", tok);
        wait_extended(&r, "dlock:{sg}:sem", tok);
        CHECK(test_redis_cmd(&r, "HLEN dlock:{sg}:listen-grant") == 1 - i);
    }
    CHECK_RC(dlock_release(w[1].lock), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{sg}:sem dlock:{sg}:listen dlock:{sg}:listen-exp "
                             "dlock:{sg}:listen-grant") == 0);
    CHECK(test_redis_cmd(&r, "KEYS dlock:{sg}:grant:*") == 0);
    dlock_client_free(hc);
    for (int i = 0; i < 2; i++)
        dlock_client_free(wc[i]);
    test_redis_stop(&r);
}

/* One hand-over to a waiter of kind (a reader behind a writer, or a
 * permit) with lease_ms and no auto_renew: the waiter's tries from the
 * release on, checking that the handle believes no longer than the server
 * keeps its hold (its expiry in zset). */
static int hand_over_unrenewed(int kind, int64_t lease_ms)
{
    const char *zset = kind == DLOCK_KIND_READ ? "dlock:{hu}:readers" : "dlock:{hu}:sem";
    const dlock__redis_script *script = kind == DLOCK_KIND_READ
                                            ? &dlock__redis_script_rw_acquire
                                            : &dlock__redis_script_sem_acquire;
    test_redis r;
    dlock_client *hc, *wc;
    dlock_lock *held;
    dlock_acquire_options o = kopts(kind == DLOCK_KIND_READ ? DLOCK_KIND_WRITE : kind, 0, 20000);
    dlock_acquire_options wo = kopts(kind, 20000, lease_ms);
    test_acquirer w;
    pthread_t t;
    char tok[64];
    int tries;

    test_redis_start(&r, NULL);
    hc = open_client(&r);
    o.auto_renew = wo.auto_renew = 0;
    o.permits = wo.permits = 1;
    if (kind == DLOCK_KIND_READ)
        o.permits = wo.permits = 0;
    CHECK_RC(dlock_acquire(&held, hc, "hu", &o), DLOCK_OK);
    start_listener(&r, "hu", wo, "dlock:{hu}:listen-grant", 1, &wc, &w, &t);
    test_sleep_ms(100);
    slowlog_all(&r);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK(test_redis_calls(&r, "rpush") == 1);
    raw_string(&r, tok, sizeof(tok), "ZRANGE %s 0 0", zset);
    check_believed(&r, w.lock, zset, tok);
    tries = tries_of(&r, script, tok);
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
    dlock_client_free(hc);
    dlock_client_free(wc);
    test_redis_stop(&r);
    return tries;
}

/* Without auto_renew, a reader's or a permit's lease within the confirm
 * window is the popped grant's, with no try; a longer one, which nothing
 * would extend past the window, is confirmed by one try, which sets the
 * hold's expiry to the whole lease (rw_acquire and sem_acquire find the
 * hold theirs). */
static void handed_without_renewal_confirmed(void)
{
    CHECK(hand_over_unrenewed(DLOCK_KIND_READ, 1500) == 0);
    CHECK(hand_over_unrenewed(DLOCK_KIND_READ, 10000) == 1);
    CHECK(hand_over_unrenewed(DLOCK_KIND_SEMAPHORE, 1500) == 0);
    CHECK(hand_over_unrenewed(DLOCK_KIND_SEMAPHORE, 10000) == 1);
}

/* A reader or a permit handed over after the waiter's last try goes back
 * when it gives up (leave.lua, run on the state such a race leaves), and
 * its registration goes. */
static void leave_gives_back_read_and_permit(void)
{
    const dlock__redis_script *s = &dlock__redis_script_leave;
    const char *token = "0123456789abcdef0123456789abcdef";
    test_redis r;

    test_redis_start(&r, NULL);
    CHECK(test_redis_cmd(&r, "ZADD dlock:{lg}:readers 99999999999999 %s", token) == 1);
    CHECK(test_redis_cmd(&r, "HSET dlock:{lg}:reader-fences %s %s", token, "3 \n") == 1);
    CHECK(test_redis_cmd(&r, "ZADD dlock:{lg}:sem 99999999999999 %s", token) == 1);
    CHECK(test_redis_cmd(&r, "HSET dlock:{lg}:sem-fences %s %s", token, "4 \n") == 1);
    CHECK(test_redis_cmd(&r, "ZADD dlock:{lg}:listen 1 00ff") == 1);
    CHECK(test_redis_cmd(&r, "ZADD dlock:{lg}:listen-exp 99999999999999 00ff") == 1);
    CHECK(test_redis_cmd(&r, "HSET dlock:{lg}:listen-grant 00ff entry") == 1);
    CHECK(test_redis_cmd(&r, "ZADD dlock:{lg}:readers 99999999999999 other") == 1);
    CHECK(test_redis_cmd(&r, "EVAL %b 1 dlock:{lg} 00ff dlock:{lg}:release %s %s", s->body,
                         s->len, token, token) == 1);
    CHECK(test_redis_cmd(&r, "ZSCORE dlock:{lg}:readers %s", token) == -1);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{lg}:reader-fences dlock:{lg}:sem "
                             "dlock:{lg}:sem-fences dlock:{lg}:listen dlock:{lg}:listen-exp "
                             "dlock:{lg}:listen-grant") == 0);
    CHECK(test_redis_cmd(&r, "ZCARD dlock:{lg}:readers") == 1); /* another's stays */
    test_redis_stop(&r);
}

/* A fair waiter that gives up just after a release handed it the lock
 * (the grant came after its last try): its leave gives the lock back and
 * names the next waiter. Run on the server state such a race leaves, as
 * watch_end does. A lock that is not its own stays. */
static void fair_leave_gives_back_a_grant(void)
{
    const dlock__redis_script *s = &dlock__redis_script_leave;
    const char *token = "0123456789abcdef0123456789abcdef";
    test_redis r;

    test_redis_start(&r, NULL);
    CHECK(test_redis_cmd(&r, "SET dlock:{fl} %s PX 5000", token) >= 0);
    CHECK(test_redis_cmd(&r, "HSET dlock:{fl}:holds %s %s", token, "7 host 1 2\nfair") == 1);
    CHECK(test_redis_cmd(&r, "ZADD dlock:{fl}:queue 2 next") == 1);
    CHECK(test_redis_cmd(&r, "ZADD dlock:{fl}:queue-exp 99999999999999 next") == 1);
    /* Nobody subscribed: PUBLISH reaches no one, but is counted. */
    CHECK(test_redis_cmd(&r, "EVAL %b 1 dlock:{fl} 00ff dlock:{fl}:release %s %s", s->body,
                         s->len, token, token) == 1);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{fl} dlock:{fl}:holds") == 0);
    CHECK(test_redis_calls(&r, "publish") == 1); /* "next" named */
    /* Another's lock stays, and so do its holds. */
    CHECK(test_redis_cmd(&r, "SET dlock:{fl} other PX 5000") >= 0);
    CHECK(test_redis_cmd(&r, "HSET dlock:{fl}:holds othertoken %s", "8 \nfair") == 1);
    CHECK(test_redis_cmd(&r, "EVAL %b 1 dlock:{fl} 00ff dlock:{fl}:release %s %s", s->body,
                         s->len, token, token) == 1);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{fl} dlock:{fl}:holds") == 2);
    test_redis_stop(&r);
}

/* A fair waiter whose listening connection is killed under its BLPOP stops
 * listening for the rest of its wait: its next try drops its entry from
 * base:queue-grant, and the release names it on the channel instead (no
 * push); it then takes the lock by a try, with the whole lease. */
static void fair_listener_lost_falls_back(void)
{
    test_redis r;
    dlock_client *hc, *wc;
    dlock_lock *held;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0, 20000);
    test_acquirer w;
    pthread_t t;
    char clients[8192], *at;
    long long id;

    test_redis_start(&r, NULL);
    hc = open_client(&r);
    o.auto_renew = 0;
    CHECK_RC(dlock_acquire(&held, hc, "fd", &o), DLOCK_OK);
    start_listener(&r, "fd", kopts(DLOCK_KIND_FAIR, 20000, 8000), "dlock:{fd}:queue-grant", 1,
                   &wc, &w, &t);
    test_redis_text(&r, clients, sizeof(clients), "CLIENT LIST");
    CHECK((at = strstr(clients, "name=dlock-listener")) != NULL);
    while (at > clients && at[-1] != '\n')
        at--;
    CHECK(sscanf(at, "id=%lld", &id) == 1);
    CHECK(test_redis_cmd(&r, "CLIENT KILL ID %lld", id) == 1);
    wait_cmd(&r, 0, "HLEN %s", "dlock:{fd}:queue-grant");
    CHECK(test_redis_cmd(&r, "ZCARD dlock:{fd}:queue") == 1); /* still queued */
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK(test_redis_calls(&r, "rpush") == 0);
    CHECK(test_redis_cmd(&r, "PTTL dlock:{fd}") > 2000); /* its try: the whole lease */
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
    dlock_client_free(hc);
    dlock_client_free(wc);
    test_redis_stop(&r);
}

typedef struct {
    dlock_client *c;
    char name[32];
    int64_t wait_ms, took_ms;
    int rc;
    dlock_lock *l;
} fair_waiter;

static void *fair_waiter_main(void *p)
{
    fair_waiter *w = p;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, w->wait_ms, 1000);
    int64_t start = test_clock_ms(CLOCK_MONOTONIC);

    w->rc = dlock_acquire(&w->l, w->c, w->name, &o);
    w->took_ms = test_clock_ms(CLOCK_MONOTONIC) - start;
    return NULL;
}

static long long evalsha_calls(test_redis *r)
{
    char info[8192];
    const char *p;

    raw_string(r, info, sizeof(info), "INFO commandstats");
    p = strstr(info, "cmdstat_evalsha:calls=");
    return p != NULL ? atoll(p + strlen("cmdstat_evalsha:calls=")) : 0;
}

/*
 * The places of a client's fair waiters are kept in batches by its
 * subscriber thread (redis_places.c), not by a try of each waiter each
 * third of the place's expiry: 40 waiters of one client, on 40 locks held
 * elsewhere without renewal, with places that expire in 1 s, cost the
 * server a few scripts a second, where their own tries would be 120. The
 * places stay (the queues still hold every waiter), and each waiter gets
 * its lock at the release.
 */
#define KEPT_WAITERS 40
static void fair_places_kept_in_batches(void)
{
    test_redis r;
    dlock_client *holder, *c;
    dlock_lock *held[KEPT_WAITERS];
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0, 60000);
    fair_waiter w[KEPT_WAITERS];
    pthread_t t[KEPT_WAITERS];
    long long before, calls;

    test_redis_start(&r, NULL);
    holder = open_client(&r);
    c = open_client(&r);
    o.auto_renew = 0;
    for (int i = 0; i < KEPT_WAITERS; i++) {
        snprintf(w[i].name, sizeof(w[i].name), "kept-%d", i);
        CHECK_RC(dlock_acquire(&held[i], holder, w[i].name, &o), DLOCK_OK);
        w[i].c = c;
        w[i].wait_ms = 60000;
        w[i].rc = -1;
        CHECK(pthread_create(&t[i], NULL, fair_waiter_main, &w[i]) == 0);
    }
    for (int i = 0; i < KEPT_WAITERS; i++) {
        char queue[64];
        snprintf(queue, sizeof(queue), "dlock:{%s}:queue", w[i].name);
        wait_cmd(&r, 1, "ZCARD %s", queue);
    }
    /* Three expiries of every place. */
    before = evalsha_calls(&r);
    test_sleep_ms(3000);
    calls = evalsha_calls(&r) - before;
    fprintf(stderr, "%d fair waiters of one client: %lld scripts in 3 s\n", KEPT_WAITERS, calls);
    CHECK(calls < KEPT_WAITERS); /* a try each: 3 * 3 * KEPT_WAITERS */
    for (int i = 0; i < KEPT_WAITERS; i++) {
        char queue[64];
        snprintf(queue, sizeof(queue), "dlock:{%s}:queue", w[i].name);
        CHECK(test_redis_cmd(&r, "ZCARD %s", queue) == 1);
        CHECK_RC(dlock_release(held[i]), DLOCK_OK);
    }
    for (int i = 0; i < KEPT_WAITERS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK_RC(w[i].rc, DLOCK_OK);
        CHECK_RC(dlock_release(w[i].l), DLOCK_OK);
    }
    dlock_client_free(c);
    dlock_client_free(holder);
    test_redis_stop(&r);
}

/* A fair waiter whose place the subscriber thread keeps is woken when its
 * holder's lease runs out without a release (no message comes): it gets the
 * lock a third of its place's expiry after the lease at most, where it
 * would otherwise try again only after a minute (PLACE_RECHECK_MS) or at
 * the end of its wait. The bound checked, half the wait, is far from both. */
static void fair_waiter_woken_at_holder_expiry(void)
{
    test_redis r;
    dlock_client *holder, *c;
    dlock_lock *held;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, 0, 1500);
    fair_waiter w = {.wait_ms = 20000, .rc = -1};
    pthread_t t;

    test_redis_start(&r, NULL);
    holder = open_client(&r);
    c = open_client(&r);
    o.auto_renew = 0;
    CHECK_RC(dlock_acquire(&held, holder, "lapse", &o), DLOCK_OK);
    w.c = c;
    snprintf(w.name, sizeof(w.name), "lapse");
    CHECK(pthread_create(&t, NULL, fair_waiter_main, &w) == 0);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    fprintf(stderr, "the waiter got the lock after %lld ms (the holder's lease: 1500 ms)\n",
            (long long)w.took_ms);
    CHECK(w.took_ms < w.wait_ms / 2);
    CHECK_RC(dlock_release(held), DLOCK_ELOST);
    CHECK_RC(dlock_release(w.l), DLOCK_OK);
    dlock_client_free(c);
    dlock_client_free(holder);
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* Semaphore */

/* ---------------------------------------------------------------------- */
/* Multi-lock */

/* The one-slot path (one script for both names) under processes locking
 * {a,b} and {b,a} of one hash tag: none deadlocks and each pair is held
 * alone (family-<backend>.multi_no_deadlock runs the ordered path). */
static void multi_no_deadlock_one_slot(void)
{
    static const int kinds[6] = {DLOCK_KIND_MULTI, DLOCK_KIND_MULTI, DLOCK_KIND_MULTI,
                                 DLOCK_KIND_MULTI, DLOCK_KIND_MULTI, DLOCK_KIND_MULTI};
    static const char *const names[2] = {"{t}a", "{t}b"};
    test_redis r;
    test_contend_opts o = {0};
    test_contend_result res;

    test_redis_start(&r, NULL);
    o.url = r.url;
    o.names = names;
    o.kinds = kinds;
    o.procs = 6;
    o.turns = 30;
    o.hold_us = 200;
    test_contend_run(&o, &res);
    test_redis_stop(&r);
}

/* All or nothing on Redis' two paths, by the commands they run: one slot,
 * nothing written; ordered, taken and rolled back (the contract itself is
 * family-<backend>.multi_all_or_nothing). */
static void multi_commands_per_path(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *held, *m = NULL;
    dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 0, 5000);
    const char *spread[3] = {"x", "y", "z"};
    const char *tagged[3] = {"{g}x", "{g}y", "{g}z"};
    long long sets;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    CHECK_RC(dlock_acquire(&held, c, "z", &o), DLOCK_OK);
    sets = test_redis_calls(&r, "set");
    CHECK_RC(dlock_acquire_multi(&m, c, spread, 3, &o), DLOCK_EBUSY);
    CHECK(m == NULL);
    CHECK_CONTAINS(dlock_error_message(), "'z'");
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{x} dlock:{y}") == 0);
    /* x and y taken (then rolled back), z tried: three SET NX (the holder
     * records are in the values: no SET of their own). */
    CHECK(test_redis_calls(&r, "set") - sets == 3);
    CHECK_RC(dlock_release(held), DLOCK_OK);

    CHECK_RC(dlock_acquire(&held, c, "{g}y", &o), DLOCK_OK);
    sets = test_redis_calls(&r, "set");
    CHECK_RC(dlock_acquire_multi(&m, c, tagged, 3, &o), DLOCK_EBUSY);
    CHECK(test_redis_calls(&r, "set") == sets); /* one script: nothing written */
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{{g}x} dlock:{{g}z}") == 0);
    CHECK_RC(dlock_release(held), DLOCK_OK);
    CHECK_RC(dlock_acquire_multi(&m, c, tagged, 3, &o), DLOCK_OK);
    CHECK(dlock_lock_kind(m) == DLOCK_KIND_MULTI);
    CHECK(dlock_lock_fence_at(m, 1) == 2 && dlock_lock_fence_at(m, 0) == 1);
    CHECK(dlock_lock_name_at(m, 3) == NULL && dlock_lock_fence_at(m, 3) == 0);
    CHECK_RC(dlock_lock_check(m), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(m, 8000), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "PTTL dlock:{{g}z}") > 5000);
    CHECK_RC(dlock_release(m), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{{g}x} dlock:{{g}y} dlock:{{g}z}") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* Server time */

/* The server's clock (TIME), in ms. */
static int64_t server_ms(test_redis *r)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep;
    int64_t ms;

    CHECK(c != NULL && !c->err);
    rep = redisCommand(c, "TIME");
    CHECK(rep != NULL && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2);
    ms = atoll(rep->element[0]->str) * 1000 + atoll(rep->element[1]->str) / 1000;
    freeReplyObject(rep);
    redisFree(c);
    return ms;
}

/* How far past the server's clock the expiry a ZSET gives member-less
 * entries lies: its highest score minus TIME, in ms. */
static int64_t expiry_ahead_ms(test_redis *r, const char *zset)
{
    char score[64];

    raw_string(r, score, sizeof(score), "ZRANGE %s -1 -1 WITHSCORES", zset);
    CHECK(score[0] != '\0');
    return atoll(score) - server_ms(r);
}

static void *fair_wait_main(void *p)
{
    dlock_client *c = p;
    dlock_acquire_options o = kopts(DLOCK_KIND_FAIR, DLOCK_WAIT_FOREVER, 1000);
    dlock_lock *l;

    dlock_acquire(&l, c, "skew-fair", &o);
    return NULL;
}

/* Run by skewed_clocks in a process of its own whose wall clock libfaketime
 * moves by a day: a reader, a permit and a fair waiter with 1 s leases,
 * renewed, until it is killed. Says "ready" on stdout once all three are
 * in. Not a test by itself (TEST_CHILD: not in CTest). */
static void skewed_holder(void)
{
    const char *url = getenv("DLOCK_TEST_SKEW_URL");
    dlock_client *c = NULL, *c2 = NULL;
    dlock_lock *rd, *pm;
    dlock_acquire_options o = kopts(DLOCK_KIND_READ, 0, 1000);
    pthread_t t;

    CHECK(url != NULL);
    CHECK(time(NULL) > 0);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_client_open(&c2, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&rd, c, "skew-rw", &o), DLOCK_OK);
    o.kind = DLOCK_KIND_SEMAPHORE;
    o.permits = 1;
    CHECK_RC(dlock_acquire(&pm, c, "skew-sem", &o), DLOCK_OK);
    CHECK(pthread_create(&t, NULL, fair_wait_main, c2) == 0);
    printf("ready %ld\n", (long)time(NULL));
    fflush(stdout);
    for (;;)
        pause();
}

/*
 * Expiries of readers, permits and fair waiters are counted in server time
 * (docs/family.md): a client whose wall clock is a day ahead or behind
 * (libfaketime; its lease clock is left alone, as with a real clock step)
 * gets expiries a lease past the server's clock, keeps them while it
 * renews, and loses them a lease after it dies. With the client's clock in
 * the scores, a day behind would expire them at once, a day ahead never.
 * Not run under TSan (no watchdog label): libfaketime's wrappers make TSan
 * report the child's first pthread_mutex_lock as a double lock.
 */
static void skewed_clocks(void)
{
    static const char *const skews[] = {"+1d", "-1d"};
    const char *lib = test_faketime_lib();
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    test_redis r;
    dlock_client *c;
    dlock_lock *fair;
    dlock_acquire_options fo = kopts(DLOCK_KIND_FAIR, 0, 60000);

    if (lib == NULL) {
        fprintf(stderr, "libfaketime is missing (apt-get install faketime): this test needs it\n");
        exit(1);
    }
    CHECK(n > 0);
    exe[n] = '\0';
    test_redis_start(&r, NULL);
    c = open_client(&r);
    for (size_t k = 0; k < sizeof(skews) / sizeof(skews[0]); k++) {
        int out[2];
        pid_t pid;
        char line[64] = "";
        FILE *f;
        long child_time;
        dlock_lock *l = NULL;
        dlock_acquire_options wo = kopts(DLOCK_KIND_WRITE, 0, 5000);
        dlock_acquire_options so = kopts(DLOCK_KIND_SEMAPHORE, 0, 5000);

        so.permits = 1;
        fo.auto_renew = 0;
        CHECK_RC(dlock_acquire(&fair, c, "skew-fair", &fo), DLOCK_OK);
        CHECK(pipe(out) == 0);
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            const char *asan = getenv("ASAN_OPTIONS");
            char buf[512];
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* kept across exec */
            dup2(out[1], 1);
            close(out[0]);
            setenv("DLOCK_TEST_SKEW_URL", r.url, 1);
            setenv("LD_PRELOAD", lib, 1);
            setenv("FAKETIME", skews[k], 1);
            setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1);
            /* tests/chaos/README.md: else cond waits on CLOCK_MONOTONIC spin. */
            setenv("FAKETIME_FORCE_MONOTONIC_FIX", "0", 1);
            snprintf(buf, sizeof(buf), "%s%sverify_asan_link_order=0", asan ? asan : "",
                     asan ? ":" : "");
            setenv("ASAN_OPTIONS", buf, 1);
            execl(exe, exe, "skewed_holder", (char *)NULL);
            _exit(127);
        }
        close(out[1]);
        f = fdopen(out[0], "r");
        CHECK(f != NULL && fgets(line, sizeof(line), f) != NULL);
        fclose(f);
        CHECK(sscanf(line, "ready %ld", &child_time) == 1);
        /* Its clock really is a day off. */
        CHECK(labs(child_time - (long)time(NULL)) > 80000);
        wait_cmd(&r, 1, "ZCARD %s", "dlock:{skew-fair}:queue-exp"); /* its place */

        for (int round = 0; round < 3; round++) {
            /* A lease (or W, 1 s) past the server's clock, whatever the client's. */
            int64_t rd = expiry_ahead_ms(&r, "dlock:{skew-rw}:readers");
            int64_t sm = expiry_ahead_ms(&r, "dlock:{skew-sem}:sem");
            int64_t fq = expiry_ahead_ms(&r, "dlock:{skew-fair}:queue-exp");
            fprintf(stderr, "client clock %s: expiries %lld, %lld, %lld ms ahead of the server\n",
                    skews[k], (long long)rd, (long long)sm, (long long)fq);
            CHECK(rd > 0 && rd <= 1000);
            CHECK(sm > 0 && sm <= 1000);
            CHECK(fq > 0 && fq <= 1000);
            /* Held while it renews: past its 1 s leases. */
            CHECK_RC(dlock_acquire(&l, c, "skew-rw", &wo), DLOCK_EBUSY);
            CHECK_RC(dlock_acquire(&l, c, "skew-sem", &so), DLOCK_EBUSY);
            test_sleep_ms(700);
        }
        kill_child(pid);
        /* Dead: a lease (1 s of server time) later the others get in. */
        wo.wait_ms = so.wait_ms = 20000;
        CHECK_RC(dlock_acquire(&l, c, "skew-rw", &wo), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        CHECK_RC(dlock_acquire(&l, c, "skew-sem", &so), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
        CHECK_RC(dlock_release(fair), DLOCK_OK);
        /* Its place in the fair queue went with it (W of server time), or
         * the release handed it the lock (it listened: excl_release), which
         * is then kept for it for its lease (1 s) at most. */
        wait_cmd(&r, 0, "ZCARD %s", "dlock:{skew-fair}:queue-exp");
        wait_cmd(&r, 0, "EXISTS %s", "dlock:{skew-fair}");
    }
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* Bounded state */

/* A counter nobody used for its retention is retired into the floor; the
 * name's next fence is still above every fence it had. */
static void fence_counter_retired_stays_monotonic(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 0, 5000);
    char v[32];

    test_redis_start(&r, NULL);
    c = open_client(&r);
    for (int i = 0; i < 3; i++) {
        CHECK_RC(dlock_acquire(&l, c, "old", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    /* Registered, due in a day or more. */
    CHECK(test_redis_cmd(&r, "ZCARD dlock:fence-registry") == 1);
    /* A day passes for "old" (its entry is made due now). The next
     * acquisition that keeps the registry retires it: a name's first. */
    make_due(&r, "dlock:{old}:fence");
    CHECK_RC(dlock_acquire(&l, c, "other", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{old}:fence") == 0);
    raw_string(&r, v, sizeof(v), "GET dlock:fence-floor");
    CHECK(strcmp(v, "3") == 0);
    CHECK_RC(dlock_acquire(&l, c, "old", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 4); /* above 3, though its counter was gone */
    CHECK_RC(dlock_release(l), DLOCK_OK);

    /* A busy name keeps the registry too: one acquisition in 16. */
    make_due(&r, "dlock:{old}:fence");
    for (int i = 0; i < 16 && test_redis_cmd(&r, "EXISTS dlock:{old}:fence") == 1; i++) {
        CHECK_RC(dlock_acquire(&l, c, "other", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{old}:fence") == 0);
    /* The family issues its fences the same way. */
    o.kind = DLOCK_KIND_SEMAPHORE;
    o.permits = 2;
    CHECK_RC(dlock_acquire(&l, c, "old", &o), DLOCK_OK);
    CHECK(dlock_lock_fence(l) == 5);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    /* So does a multi-lock in several slots (a lock at a time, in order):
     * taking "new-1" first, with a new counter, retires "old"'s into the
     * floor, and "old" then starts from there. */
    make_due(&r, "dlock:{old}:fence");
    {
        const char *names[2] = {"new-1", "old"};
        o = kopts(DLOCK_KIND_MUTEX, 0, 5000);
        CHECK_RC(dlock_acquire_multi(&l, c, names, 2, &o), DLOCK_OK);
        CHECK(dlock_lock_fence_at(l, 1) == 6);
        raw_string(&r, v, sizeof(v), "GET dlock:fence-floor");
        CHECK(strcmp(v, "5") == 0); /* old's counter was retired, at 5 */
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    /* A counter SET by hand past 2^53 (Lua numbers are doubles) is retired
     * into the floor digit for digit, and no fence is issued from it: the
     * scripts could not return it exactly. */
    o = kopts(DLOCK_KIND_MUTEX, 0, 5000);
    CHECK_RC(dlock_acquire(&l, c, "huge", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "SET dlock:{huge}:fence 10000000000000001") == 2); /* +OK */
    make_due(&r, "dlock:{huge}:fence");
    CHECK_RC(dlock_acquire(&l, c, "new-2", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    raw_string(&r, v, sizeof(v), "GET dlock:fence-floor");
    CHECK(strcmp(v, "10000000000000001") == 0);
    CHECK_RC(dlock_acquire(&l, c, "huge", &o), DLOCK_ESERVER);
    CHECK_CONTAINS(dlock_error_message(), "would pass 9007199254740991 (2^53 - 1)");
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{huge} dlock:{huge}:fence") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* A multi-lock in one hash slot is one script (multi_acquire.lua), which
 * keeps the registry too: its new counters retire the due ones into the
 * floor, and a name whose counter was retired gets its fence from the
 * floor, above every fence issued before. */
static void multi_one_slot_fence_from_floor(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 0, 5000);
    const char *fresh[2] = {"{g}a", "{g}b"};
    const char *again[2] = {"{g}a", "{g}old"};
    long long scripts;
    char v[32];

    test_redis_start(&r, NULL);
    c = open_client(&r);
    for (int i = 0; i < 3; i++) {
        CHECK_RC(dlock_acquire(&l, c, "{g}old", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    /* A counter raised by hand, as after a failover (README): the floor
     * must end up above it, not at old's 3. */
    CHECK_RC(dlock_acquire(&l, c, "{g}big", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "SET dlock:{{g}big}:fence 100") == 2); /* +OK */
    make_due(&r, "dlock:{{g}old}:fence");
    make_due(&r, "dlock:{{g}big}:fence");

    CHECK_RC(dlock_acquire_multi(&l, c, fresh, 2, &o), DLOCK_OK);
    CHECK(dlock_lock_fence_at(l, 0) == 1 && dlock_lock_fence_at(l, 1) == 1);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{{g}old}:fence dlock:{{g}big}:fence") == 0);
    raw_string(&r, v, sizeof(v), "GET dlock:fence-floor");
    CHECK(strcmp(v, "100") == 0);

    /* {g}old's counter is gone: its fence comes from the floor, in the one
     * script (cached now: one EVALSHA for both locks). */
    scripts = test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval");
    CHECK_RC(dlock_acquire_multi(&l, c, again, 2, &o), DLOCK_OK);
    CHECK(test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval") - scripts == 1);
    CHECK(dlock_lock_fence_at(l, 0) == 2);
    CHECK(dlock_lock_fence_at(l, 1) == 101);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* Thousands of names used once leave nothing behind once retired, and
 * every key of every kind but the counter has an expiry. */
static void unused_names_leave_bounded_state(void)
{
    enum { NAMES = 300 };
    static const int kinds[] = {DLOCK_KIND_MUTEX, DLOCK_KIND_FAIR, DLOCK_KIND_READ,
                                DLOCK_KIND_WRITE, DLOCK_KIND_SEMAPHORE};
    test_redis r;
    dlock_client *c;
    dlock_lock *l;
    struct timeval tv = {2, 0};
    redisContext *raw;
    redisReply *keys;
    long long before;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    for (int i = 0; i < NAMES; i++) {
        char name[32];
        dlock_acquire_options o = kopts(kinds[i % 5], 0, 5000);
        snprintf(name, sizeof(name), "job-%d", i);
        o.permits = kinds[i % 5] == DLOCK_KIND_SEMAPHORE ? 2 : 0;
        if (i % 7 == 0 && kinds[i % 5] == DLOCK_KIND_MUTEX) {
            o.owner = "me";
            o.reentrant = 1;
        }
        CHECK_RC(dlock_acquire(&l, c, name, &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    /* Only counters and the semaphores' N (kept a day) have no short
     * expiry; nothing has none at all but the counters and the two global
     * keys. */
    raw = redisConnectWithTimeout("127.0.0.1", r.port, tv);
    CHECK(raw != NULL && !raw->err);
    keys = redisCommand(raw, "KEYS *");
    CHECK(keys != NULL && keys->type == REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < keys->elements; i++) {
        const char *k = keys->element[i]->str;
        redisReply *ttl = redisCommand(raw, "PTTL %s", k);
        size_t len = strlen(k);
        int permanent = (len > 6 && strcmp(k + len - 6, ":fence") == 0) ||
                        strcmp(k, "dlock:fence-registry") == 0;
        if (!permanent && ttl->integer < 0) {
            fprintf(stderr, "key %s has no expiry\n", k);
            exit(1);
        }
        freeReplyObject(ttl);
    }
    freeReplyObject(keys);
    before = test_redis_cmd(&r, "DBSIZE");
    fprintf(stderr, "keys after %d names: %lld\n", NAMES, before);
    CHECK(before >= NAMES);

    /* A day passes for all of them; the registry is drained by the next
     * acquisitions of a busy name, two counters at each that keeps the
     * registry (one in 16). */
    CHECK(test_redis_cmd(&r, "ZUNIONSTORE dlock:fence-registry 1 dlock:fence-registry "
                         "WEIGHTS 0") == NAMES);
    for (int i = 0; i < 16 * (NAMES / 2 + 1); i++) {
        dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 0, 5000);
        CHECK_RC(dlock_acquire(&l, c, "hot", &o), DLOCK_OK);
        CHECK_RC(dlock_release(l), DLOCK_OK);
    }
    redisFree(raw);
    /* Left: hot's counter, the registry, the floor, and the N of the
     * semaphores (kept a day, then gone). */
    fprintf(stderr, "keys after retiring: %lld\n", test_redis_cmd(&r, "DBSIZE"));
    CHECK(test_redis_cmd(&r, "DBSIZE") <= 3 + NAMES / 5);
    CHECK(test_redis_cmd(&r, "ZCARD dlock:fence-registry") == 1);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* ---------------------------------------------------------------------- */
/* Bad input */

static void family_bad_input_before_network(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l = NULL;
    dlock_observer *ob = NULL;
    dlock_acquire_options o;
    char big[DLOCK_IDENTITY_MAX + 2];
    const char *dup[2] = {"a", "a"};
    const char *names[DLOCK_MULTI_MAX + 1];
    long long before;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    before = test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval");
    memset(big, 'o', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';

    o = kopts(DLOCK_KIND_MUTEX, 0, 1000);
    o.owner = "";
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o.owner = big; /* over DLOCK_OWNER_MAX */
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "owner id");
    o = kopts(DLOCK_KIND_MUTEX, 0, 1000);
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "needs an owner id");
    o.owner = "x";
    o.reentrant = 2;
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o = kopts(DLOCK_KIND_READ, 0, 1000);
    o.owner = "x";
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o = kopts(DLOCK_KIND_MUTEX, 0, 1000);
    o.permits = 3;
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o = kopts(DLOCK_KIND_SEMAPHORE, 0, 1000);
    o.permits = -1;
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o.permits = DLOCK_PERMITS_MAX + 1;
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o.permits = 1;
    o.owner = "x";
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o = kopts(99, 0, 1000);
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    o = kopts(DLOCK_KIND_LEADER, 0, 1000);
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "dlock_campaign");
    o = kopts(DLOCK_KIND_MULTI, 0, 1000);
    CHECK_RC(dlock_acquire(&l, c, "n", &o), DLOCK_EINVAL);

    o = kopts(DLOCK_KIND_MUTEX, 0, 1000);
    CHECK_RC(dlock_acquire_multi(&l, c, dup, 0, &o), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire_multi(&l, c, dup, 2, &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_error_message(), "the same");
    for (int i = 0; i <= DLOCK_MULTI_MAX; i++)
        names[i] = "n";
    CHECK_RC(dlock_acquire_multi(&l, c, names, DLOCK_MULTI_MAX + 1, &o), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire_multi(&l, c, NULL, 1, &o), DLOCK_EINVAL);
    o.kind = DLOCK_KIND_FAIR;
    CHECK_RC(dlock_acquire_multi(&l, c, dup, 1, &o), DLOCK_EINVAL);

    CHECK_RC(dlock_campaign(&l, c, "n", big, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_campaign(&l, c, "n", "", NULL), DLOCK_EINVAL);
    o = kopts(DLOCK_KIND_SEMAPHORE, 0, 1000);
    CHECK_RC(dlock_campaign(&l, c, "n", "me", &o), DLOCK_EINVAL);
    CHECK_RC(dlock_semaphore_set_permits(c, "n", 0), DLOCK_EINVAL);
    CHECK_RC(dlock_semaphore_set_permits(c, "", 1), DLOCK_EINVAL);
    CHECK_RC(dlock_observe(&ob, c, "n", NULL, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_lock_downgrade(NULL), DLOCK_EINVAL);
    CHECK(dlock_lock_kind(NULL) == -1 && dlock_lock_count(NULL) == 0);
    CHECK(l == NULL && ob == NULL);
    CHECK(test_redis_calls(&r, "evalsha") + test_redis_calls(&r, "eval") == before);
    dlock_observer_free(NULL);
    dlock_client_free(c);
    test_redis_stop(&r);
}

static atomic_int family_lost_calls;

static void count_family_lost(dlock_lock *l, int reason, void *payload)
{
    (void)l;
    (void)payload;
    if (reason == DLOCK_ELOST)
        atomic_fetch_add(&family_lost_calls, 1);
}

/* A reader, a permit and a leader taken away on the server: the watchdog
 * finds each lost and calls on_lost once; release says ELOST. */
static void family_on_lost_once(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *rd, *pm, *ld;
    dlock_acquire_options o = kopts(DLOCK_KIND_READ, 0, 300);

    test_redis_start(&r, NULL);
    c = open_client(&r);
    o.on_lost = count_family_lost;
    CHECK_RC(dlock_acquire(&rd, c, "lost-r", &o), DLOCK_OK);
    o.kind = DLOCK_KIND_SEMAPHORE;
    o.permits = 4;
    CHECK_RC(dlock_acquire(&pm, c, "lost-s", &o), DLOCK_OK);
    o.kind = DLOCK_KIND_MUTEX;
    o.permits = 0;
    CHECK_RC(dlock_campaign(&ld, c, "lost-l", "me", &o), DLOCK_OK);
    test_sleep_ms(500); /* renewed meanwhile */
    CHECK(atomic_load(&family_lost_calls) == 0);
    CHECK(test_redis_cmd(&r, "DEL dlock:{lost-r}:readers dlock:{lost-s}:sem dlock:{lost-l}") == 3);
    wait_atomic(&family_lost_calls, 3, "on_lost calls");
    test_sleep_ms(400);
    CHECK(atomic_load(&family_lost_calls) == 3);
    CHECK(dlock_lock_lost(rd) && dlock_lock_lost(pm) && dlock_lock_lost(ld));
    CHECK_RC(dlock_release(rd), DLOCK_ELOST);
    CHECK_RC(dlock_release(pm), DLOCK_ELOST);
    CHECK_RC(dlock_resign(ld), DLOCK_ELOST);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* The ACL that docs/family.md gives for the family is enough for every
 * kind, and the registry upkeep runs under it. */
#define PLAIN_ACL "+evalsha +eval +get +set +incr +pexpire +pttl +del +publish +exists " \
                  "+subscribe +unsubscribe +client|setname"
#define FAMILY_ACL "+time +exists +pttl +pexpire +hset +hget +hdel +hlen +hexists +hvals " \
                   "+zadd +zrem +zscore +zcard +zrange +zrangebyscore +publish"

static void family_acl_documented_set(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *l, *l2;
    test_leader_watch seen;
    dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 0, 2000);
    const char *names[2] = {"{t}a", "{t}b"}, *spread[2] = {"a", "b"};
    char url[160];

    test_redis_start(&r, NULL);
    CHECK(test_redis_cmd(&r, "ACL SETUSER fam on >pw resetkeys ~dlock:* resetchannels &dlock:* "
                         "-@all " PLAIN_ACL " " FAMILY_ACL) >= 0);
    snprintf(url, sizeof(url), "redis://fam:pw@127.0.0.1:%d", r.port);
    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);

    CHECK_RC(dlock_acquire(&l, c, "m", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "ZCARD dlock:fence-registry") == 1); /* upkeep ran */
    o.owner = "me";
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&l, c, "re", &o), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l2, c, "re", &o), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(l2, 3000), DLOCK_OK);
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    o.kind = DLOCK_KIND_FAIR;
    CHECK_RC(dlock_acquire(&l, c, "f", &o), DLOCK_OK);
    o.owner = NULL;
    o.reentrant = 0;
    o.wait_ms = 100;
    CHECK_RC(dlock_acquire(&l2, c, "f", &o), DLOCK_ETIMEOUT); /* queued, then left */
    CHECK_RC(dlock_release(l), DLOCK_OK);
    o.kind = DLOCK_KIND_WRITE;
    o.owner = "w";
    CHECK_RC(dlock_acquire(&l, c, "rw", &o), DLOCK_OK);
    CHECK_RC(dlock_lock_downgrade(l), DLOCK_OK);
    CHECK_RC(dlock_lock_check(l), DLOCK_OK);
    o.owner = NULL;
    CHECK_RC(dlock_acquire(&l2, c, "rw", &o), DLOCK_ETIMEOUT); /* marker set, then dropped */
    o.kind = DLOCK_KIND_READ;
    CHECK_RC(dlock_acquire(&l2, c, "rw", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l2), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    o = kopts(DLOCK_KIND_SEMAPHORE, 0, 2000);
    o.permits = 1;
    CHECK_RC(dlock_acquire(&l, c, "s", &o), DLOCK_OK);
    CHECK_RC(dlock_semaphore_set_permits(c, "s", 2), DLOCK_OK);
    CHECK_RC(dlock_lock_extend(l, 3000), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    o = kopts(DLOCK_KIND_MUTEX, 0, 2000);
    CHECK_RC(dlock_acquire_multi(&l, c, names, 2, &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK_RC(dlock_acquire_multi(&l, c, spread, 2, &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    test_leader_watch_start(&seen, c, "lead");
    CHECK_RC(dlock_campaign(&l, c, "lead", "me", &o), DLOCK_OK);
    test_leader_watch_wait(&seen, "me");
    CHECK_RC(dlock_resign(l), DLOCK_OK);
    test_leader_watch_wait(&seen, "");
    test_leader_watch_stop(&seen);
    /* The retiring side of the upkeep. */
    make_due(&r, "dlock:{m}:fence");
    CHECK_RC(dlock_acquire(&l, c, "m2", &o), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{m}:fence") == 0);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/*
 * The fence floor and trust domains (docs/fencing.md, "Who can move a
 * fence back"). The floor PREFIX fence-floor is the only record of a
 * retired counter, and every client of the prefix must be able to write it
 * (its scripts run as its ACL user): so whoever may use a prefix may also
 * move its fences back. Isolation is per key prefix, one ACL user per trust
 * domain. (a) Within one domain the attack works, and this test says so:
 * the victim's next fence goes back to 1. (b) A user of another domain
 * (~b:* &b:*) gets NOPERM on a:'s floor, registry and channels, whether by
 * a plain command, a script or dlock itself, and a:'s fences keep rising.
 */
static void acl_user_cmd(test_redis *r, const char *user, int want_ok, const char *fmt, ...)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep;
    va_list ap;

    CHECK(c != NULL && !c->err);
    rep = redisCommand(c, "AUTH %s pw-%s", user, user);
    CHECK(rep != NULL && rep->type == REDIS_REPLY_STATUS);
    freeReplyObject(rep);
    va_start(ap, fmt);
    rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    CHECK(rep != NULL);
    fprintf(stderr, "as %s: %s -> %s\n", user, fmt,
            rep->type == REDIS_REPLY_ERROR ? rep->str : "ok");
    if (want_ok)
        CHECK(rep->type != REDIS_REPLY_ERROR);
    else
        CHECK(rep->type == REDIS_REPLY_ERROR &&
              (strncmp(rep->str, "NOPERM", 6) == 0 || /* a script, on a key it names: */
               strstr(rep->str, "user executing the script can't access") != NULL));
    freeReplyObject(rep);
    redisFree(c);
}

static dlock_client *tenant_client(test_redis *r, const char *user, const char *prefix)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_client *c = NULL;
    char url[160];

    co.key_prefix = prefix;
    snprintf(url, sizeof(url), "redis://%s:pw-%s@127.0.0.1:%d", user, user, r->port);
    CHECK_RC(dlock_client_open(&c, url, &co), DLOCK_OK);
    return c;
}

/* Take and release name on c; returns its fence. */
static uint64_t fence_of_next(dlock_client *c, const char *name)
{
    dlock_acquire_options o = kopts(DLOCK_KIND_MUTEX, 0, 5000);
    dlock_lock *l;
    uint64_t f;

    CHECK_RC(dlock_acquire(&l, c, name, &o), DLOCK_OK);
    f = dlock_lock_fence(l);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    return f;
}

static void fence_floor_per_trust_domain(void)
{
    test_redis r;
    dlock_client *ca, *ca2, *cb;
    dlock_lock *l = NULL;
    char v[32];
    uint64_t f;

    test_redis_start(&r, NULL);
    CHECK(test_redis_cmd(&r, "ACL SETUSER tena on >pw-tena resetkeys ~a:* resetchannels &a:* "
                         "-@all " PLAIN_ACL " " FAMILY_ACL) >= 0);
    CHECK(test_redis_cmd(&r, "ACL SETUSER tenb on >pw-tenb resetkeys ~b:* resetchannels &b:* "
                         "-@all " PLAIN_ACL " " FAMILY_ACL) >= 0);
    ca = tenant_client(&r, "tena", "a:");
    cb = tenant_client(&r, "tenb", "b:");

    /* (a) One domain: retire v's counter (3) into the floor, then SET the
     * floor to 0 as the same ACL user: v's next fence goes back. */
    for (int i = 0; i < 3; i++)
        fence_of_next(ca, "v");
    make_due_in(&r, "a:fence-registry", "a:{v}:fence");
    fence_of_next(ca, "w"); /* a new name: its upkeep retires v's counter */
    CHECK(test_redis_cmd(&r, "EXISTS a:{v}:fence") == 0);
    raw_string(&r, v, sizeof(v), "GET a:fence-floor");
    CHECK(strcmp(v, "3") == 0);
    acl_user_cmd(&r, "tena", 1, "SET a:fence-floor 0");
    f = fence_of_next(ca, "v");
    fprintf(stderr, "within one domain, after SET a:fence-floor 0: v's fence %llu (was 3)\n",
            (unsigned long long)f);
    CHECK(f == 1); /* the documented limit: the floor does not protect a domain from itself */

    /* (b) Another domain. v's counter goes to 3 again and is retired. */
    fence_of_next(ca, "v");
    fence_of_next(ca, "v");
    make_due_in(&r, "a:fence-registry", "a:{v}:fence");
    fence_of_next(ca, "w2");
    raw_string(&r, v, sizeof(v), "GET a:fence-floor");
    CHECK(strcmp(v, "3") == 0); /* raised from 0 to 3 */
    acl_user_cmd(&r, "tenb", 0, "SET a:fence-floor 0");
    acl_user_cmd(&r, "tenb", 0, "DEL a:fence-floor");
    acl_user_cmd(&r, "tenb", 0, "EVAL %s 1 %s", "return redis.call('SET', KEYS[1], '0')",
                 "a:fence-floor");
    acl_user_cmd(&r, "tenb", 0, "EVAL %s 0", "return redis.call('SET', 'a:fence-floor', '0')");
    acl_user_cmd(&r, "tenb", 0, "ZADD a:fence-registry 0 a:{v}:fence");
    acl_user_cmd(&r, "tenb", 0, "SET a:{v}:fence 0");
    acl_user_cmd(&r, "tenb", 0, "PUBLISH a:{v}:release released");
    acl_user_cmd(&r, "tenb", 0, "SUBSCRIBE a:{v}:release");
    /* dlock itself, with B's user and A's prefix: refused too. */
    ca2 = tenant_client(&r, "tenb", "a:");
    CHECK_RC(dlock_acquire(&l, ca2, "v", NULL), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_error_message(), "NOPERM");
    dlock_client_free(ca2);
    /* B's own names count apart, from its own floor. */
    CHECK(fence_of_next(cb, "v") == 1);
    raw_string(&r, v, sizeof(v), "GET a:fence-floor");
    CHECK(strcmp(v, "3") == 0);
    f = fence_of_next(ca, "v");
    fprintf(stderr, "after tenant B's attempts: v's fence %llu\n", (unsigned long long)f);
    CHECK(f == 4);

    /* The scripts retire only their own prefix's counters: a registry entry
     * naming b:'s counter, run by a user whom no ACL stops (the default
     * user), is dropped, not retired into a:'s floor. */
    CHECK(test_redis_cmd(&r, "ZADD a:fence-registry 0 b:{v}:fence") == 1);
    {
        dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
        co.key_prefix = "a:";
        CHECK_RC(dlock_client_open(&ca2, r.url, &co), DLOCK_OK);
        fence_of_next(ca2, "w3");
        dlock_client_free(ca2);
    }
    CHECK(test_redis_cmd(&r, "ZSCORE a:fence-registry b:{v}:fence") == -1); /* nil: dropped */
    CHECK(test_redis_cmd(&r, "EXISTS b:{v}:fence") == 1);
    dlock_client_free(ca);
    dlock_client_free(cb);
    test_redis_stop(&r);
}

/* ---- holder records of every kind (issue 16) ---------------------------- */

/* What dlock_list gave, for the holder tests. */
typedef struct {
    int n;
    int holders[8], kinds[8];
} listing;

static int collect_listed(const char *name, const dlock_lock_info *info, void *payload)
{
    listing *l = payload;

    (void)name;
    if (l->n < 8) {
        l->holders[l->n] = info->holders;
        l->kinds[l->n] = info->kind;
    }
    l->n++;
    return 0;
}

/* The holders of a lock, as dlock_status_holders gives them. */
typedef struct {
    int n;
    dlock_lock_info each[8];
} holders_seen;

static int see_holder(const char *name, const dlock_lock_info *info, void *payload)
{
    holders_seen *h = payload;

    (void)name;
    if (h->n < 8)
        h->each[h->n] = *info;
    h->n++;
    return 0;
}

static holders_seen holders_of(dlock_client *c, const char *name)
{
    holders_seen h;

    memset(&h, 0, sizeof(h));
    CHECK_RC(dlock_status_holders(c, name, see_holder, &h), DLOCK_OK);
    return h;
}

/* The holder with this label among h, or NULL. */
static const dlock_lock_info *labelled(const holders_seen *h, const char *label)
{
    for (int i = 0; i < h->n && i < 8; i++)
        if (h->each[i].has_holder && strcmp(h->each[i].label, label) == 0)
            return &h->each[i];
    return NULL;
}

/* Status shows one holder, of kind, labelled label (NULL: no record). */
static void check_one_holder(dlock_client *c, const char *name, int kind, const char *label)
{
    dlock_lock_info info;
    holders_seen h;

    CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
    if (!info.held || info.kind != kind || info.holders != 1 || !info.has_holder ||
        info.pid != getpid() || strcmp(info.label, label) != 0) {
        fprintf(stderr, "%s: held %d kind %d holders %d has_holder %d label '%s', wanted "
                "held, kind %d, 1 holder, label '%s'\n", name, info.held, info.kind, info.holders,
                info.has_holder, info.label, kind, label);
        exit(1);
    }
    h = holders_of(c, name);
    CHECK(h.n == 1 && labelled(&h, label) != NULL);
}

/* Status shows name free, with no holder, and lists no holder of it. */
static void check_no_holder(dlock_client *c, const char *name)
{
    dlock_lock_info info;
    holders_seen h;

    CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
    if (info.held || info.has_holder || info.holders != 0 || info.kind != -1) {
        fprintf(stderr, "%s: held %d has_holder %d holders %d kind %d label '%s': wanted "
                "no holder\n", name, info.held, info.has_holder, info.holders, info.kind,
                info.label);
        exit(1);
    }
    h = holders_of(c, name);
    CHECK(h.n == 0);
}

/* Wait (at most 20 s) until status shows name free. */
static void wait_free(dlock_client *c, const char *name)
{
    dlock_lock_info info;

    for (int i = 0; i < 2000; i++) {
        CHECK_RC(dlock_status(&info, c, name), DLOCK_OK);
        if (!info.held)
            return;
        test_sleep_ms(10);
    }
    fprintf(stderr, "%s still held after 20 s\n", name);
    exit(1);
}

static dlock_acquire_options labelled_opts(int kind, int64_t lease_ms, const char *label)
{
    dlock_acquire_options o = kopts(kind, 0, lease_ms);

    o.label = label;
    return o;
}

/* A waiter in a thread: takes name as o says, with wait_ms forever. */
typedef struct {
    dlock_client *c;
    const char *name;
    dlock_acquire_options o;
    dlock_lock *lock;
    int rc;
} waiter_arg;

static void *waiter_main(void *p)
{
    waiter_arg *w = p;

    w->o.wait_ms = DLOCK_WAIT_FOREVER;
    w->rc = dlock_acquire(&w->lock, w->c, w->name, &w->o);
    return NULL;
}

/* Start a waiter of kind and wait until it is queued (its kind's own sign
 * on the server: queued_fmt's reply is 1); status still shows the holder
 * (its kind, its label) alone. Release the holder, and check the waiter's
 * record replaced the holder's, and went with the waiter's release. */
static void hand_off(test_redis *r, dlock_client *c, dlock_lock *holder, const char *label,
                     int kind, const char *queued_fmt)
{
    char name[64];
    waiter_arg w = {c, name, labelled_opts(kind, 20000, "waiter"), NULL, -1};
    pthread_t t;

    snprintf(name, sizeof(name), "%s", dlock_lock_name(holder)); /* it goes with holder */
    CHECK(pthread_create(&t, NULL, waiter_main, &w) == 0);
    wait_cmd(r, 1, queued_fmt, name);
    check_one_holder(c, name, dlock_lock_kind(holder), label);
    CHECK_RC(dlock_release(holder), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(w.rc, DLOCK_OK);
    check_one_holder(c, name, kind, "waiter");
    CHECK_RC(dlock_release(w.lock), DLOCK_OK);
    check_no_holder(c, name);
}

/* The exclusive kinds: the plain mutex (its hand-off slot), one with owner
 * ids (two handles of a reentrant owner), the fair lock, the leader. Each
 * record goes with the lock: release, expiry, force release, hand-off. */
static void holder_exclusive_kinds(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *a, *b;
    dlock_acquire_options o;
    dlock_lock_info info;
    holders_seen h;

    test_redis_start(&r, NULL);
    c = open_client(&r);

    /* Plain mutex: release, hand-off (the waiter confirms with its own
     * record), expiry. */
    o = labelled_opts(DLOCK_KIND_MUTEX, 20000, "plain");
    CHECK_RC(dlock_acquire(&a, c, "hm", &o), DLOCK_OK);
    check_one_holder(c, "hm", DLOCK_KIND_MUTEX, "plain");
    hand_off(&r, c, a, "plain", DLOCK_KIND_MUTEX, "EXISTS dlock:{%s}:next");
    o = labelled_opts(DLOCK_KIND_MUTEX, 300, "short");
    o.auto_renew = 0;
    CHECK_RC(dlock_acquire(&a, c, "hm", &o), DLOCK_OK);
    check_one_holder(c, "hm", DLOCK_KIND_MUTEX, "short");
    wait_free(c, "hm");
    check_no_holder(c, "hm");
    CHECK_RC(dlock_release(a), DLOCK_ELOST);

    /* Owner ids, reentrant: two handles, two holders, one fence. */
    o = labelled_opts(DLOCK_KIND_MUTEX, 20000, "first");
    o.owner = "job-7";
    o.reentrant = 1;
    CHECK_RC(dlock_acquire(&a, c, "ho", &o), DLOCK_OK);
    check_one_holder(c, "ho", DLOCK_KIND_MUTEX, "first");
    o.label = "second";
    CHECK_RC(dlock_acquire(&b, c, "ho", &o), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "ho"), DLOCK_OK);
    CHECK(info.held && info.holders == 2 && info.kind == DLOCK_KIND_MUTEX && info.has_holder);
    h = holders_of(c, "ho");
    CHECK(h.n == 2 && labelled(&h, "first") && labelled(&h, "second"));
    CHECK(labelled(&h, "first")->fence == dlock_lock_fence(a));
    CHECK(labelled(&h, "second")->fence == dlock_lock_fence(a));
    CHECK_RC(dlock_release(a), DLOCK_OK);
    check_one_holder(c, "ho", DLOCK_KIND_MUTEX, "second");
    CHECK_RC(dlock_release(b), DLOCK_OK);
    check_no_holder(c, "ho");

    /* Fair: release, the head of the queue handed the lock, force. */
    o = labelled_opts(DLOCK_KIND_FAIR, 20000, "fair");
    CHECK_RC(dlock_acquire(&a, c, "hf", &o), DLOCK_OK);
    check_one_holder(c, "hf", DLOCK_KIND_FAIR, "fair");
    hand_off(&r, c, a, "fair", DLOCK_KIND_FAIR, "ZCARD dlock:{%s}:queue");
    CHECK_RC(dlock_acquire(&a, c, "hf", &o), DLOCK_OK);
    CHECK_RC(dlock_force_release(&info, c, "hf"), DLOCK_OK);
    CHECK(info.held && info.has_holder && strcmp(info.label, "fair") == 0 &&
          info.kind == DLOCK_KIND_FAIR);
    check_no_holder(c, "hf");
    CHECK(test_redis_cmd(&r, "EXISTS dlock:{%s}:holds", "hf") == 0);
    CHECK_RC(dlock_release(a), DLOCK_ELOST);

    /* Leader: the leader's record, gone when it resigns. */
    o = labelled_opts(DLOCK_KIND_MUTEX, 20000, "leader");
    CHECK_RC(dlock_campaign(&a, c, "hl", "alpha", &o), DLOCK_OK);
    check_one_holder(c, "hl", DLOCK_KIND_LEADER, "leader");
    CHECK_RC(dlock_resign(a), DLOCK_OK);
    check_no_holder(c, "hl");

    dlock_client_free(c);
    test_redis_stop(&r);
}

/* The read-write lock: the readers (how many, each with its own fence and
 * lease), or the writer; each reader's record goes with its release or
 * its lease; a downgrade keeps the writer's record. Listed once. */
static void holder_rw_lock(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *r1, *r2, *w;
    dlock_acquire_options o;
    dlock_lock_info info;
    holders_seen h;
    listing l;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    o = labelled_opts(DLOCK_KIND_READ, 20000, "reader one");
    CHECK_RC(dlock_acquire(&r1, c, "hrw", &o), DLOCK_OK);
    o = labelled_opts(DLOCK_KIND_READ, 300, "reader two");
    o.auto_renew = 0;
    CHECK_RC(dlock_acquire(&r2, c, "hrw", &o), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "hrw"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_READ && info.holders == 2);
    /* The oldest reader's record (the lowest fence), the longest lease. */
    CHECK(info.has_holder && strcmp(info.label, "reader one") == 0 && info.ttl_ms > 10000);
    h = holders_of(c, "hrw");
    CHECK(h.n == 2 && labelled(&h, "reader one") && labelled(&h, "reader two"));
    CHECK(labelled(&h, "reader one")->fence == dlock_lock_fence(r1));
    CHECK(labelled(&h, "reader two")->fence == dlock_lock_fence(r2));
    CHECK(labelled(&h, "reader two")->ttl_ms <= 300);
    memset(&l, 0, sizeof(l));
    CHECK_RC(dlock_list(c, "hrw", collect_listed, &l), DLOCK_OK);
    CHECK(l.n == 1 && l.holders[0] == 2 && l.kinds[0] == DLOCK_KIND_READ);

    /* Reader two's lease ends: its record with it. */
    for (int i = 0; i < 2000 && holders_of(c, "hrw").n != 1; i++)
        test_sleep_ms(10);
    check_one_holder(c, "hrw", DLOCK_KIND_READ, "reader one");
    CHECK_RC(dlock_release(r2), DLOCK_ELOST);
    CHECK_RC(dlock_release(r1), DLOCK_OK);
    check_no_holder(c, "hrw");

    /* The writer; its downgrade keeps its record as a reader's. */
    o = labelled_opts(DLOCK_KIND_WRITE, 20000, "writer");
    CHECK_RC(dlock_acquire(&w, c, "hrw", &o), DLOCK_OK);
    check_one_holder(c, "hrw", DLOCK_KIND_WRITE, "writer");
    memset(&l, 0, sizeof(l));
    CHECK_RC(dlock_list(c, "hrw", collect_listed, &l), DLOCK_OK);
    CHECK(l.n == 1 && l.kinds[0] == DLOCK_KIND_WRITE);
    CHECK_RC(dlock_lock_downgrade(w), DLOCK_OK);
    check_one_holder(c, "hrw", DLOCK_KIND_READ, "writer");
    CHECK_RC(dlock_release(w), DLOCK_OK);
    check_no_holder(c, "hrw");

    /* A writer waiting for the readers is handed the lock by the last
     * reader's release. */
    o = labelled_opts(DLOCK_KIND_READ, 20000, "reader one");
    CHECK_RC(dlock_acquire(&r1, c, "hrw", &o), DLOCK_OK);
    hand_off(&r, c, r1, "reader one", DLOCK_KIND_WRITE, "EXISTS dlock:{%s}:writer-wait");
    check_no_holder(c, "hrw");
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* The semaphore: each permit holder, gone with its release; a force
 * release takes them all (their holders find their permits lost). */
static void holder_semaphore(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *p1, *p2;
    dlock_acquire_options o;
    dlock_lock_info info;
    holders_seen h;
    listing l;

    test_redis_start(&r, NULL);
    c = open_client(&r);
    o = labelled_opts(DLOCK_KIND_SEMAPHORE, 20000, "permit one");
    o.permits = 3;
    CHECK_RC(dlock_acquire(&p1, c, "hs", &o), DLOCK_OK);
    check_one_holder(c, "hs", DLOCK_KIND_SEMAPHORE, "permit one");
    o.label = "permit two";
    CHECK_RC(dlock_acquire(&p2, c, "hs", &o), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "hs"), DLOCK_OK);
    CHECK(info.held && info.kind == DLOCK_KIND_SEMAPHORE && info.holders == 2 &&
          strcmp(info.label, "permit one") == 0);
    h = holders_of(c, "hs");
    CHECK(h.n == 2 && labelled(&h, "permit one") && labelled(&h, "permit two"));
    CHECK(labelled(&h, "permit two")->fence == dlock_lock_fence(p2));
    memset(&l, 0, sizeof(l));
    CHECK_RC(dlock_list(c, "", collect_listed, &l), DLOCK_OK);
    CHECK(l.n == 1 && l.holders[0] == 2 && l.kinds[0] == DLOCK_KIND_SEMAPHORE);
    CHECK_RC(dlock_release(p1), DLOCK_OK);
    check_one_holder(c, "hs", DLOCK_KIND_SEMAPHORE, "permit two");
    o.label = "permit three";
    CHECK_RC(dlock_acquire(&p1, c, "hs", &o), DLOCK_OK);
    CHECK_RC(dlock_force_release(&info, c, "hs"), DLOCK_OK);
    CHECK(info.held && info.holders == 2);
    check_no_holder(c, "hs");
    CHECK_RC(dlock_lock_check(p1), DLOCK_ELOST);
    CHECK_RC(dlock_release(p1), DLOCK_ELOST);
    CHECK_RC(dlock_release(p2), DLOCK_ELOST);
    dlock_client_free(c);
    test_redis_stop(&r);
}

/* Multi-locks: each name shows the holder, in one slot (one script) and
 * spread (one name at a time); all go with the release. */
static void holder_multi(void)
{
    test_redis r;
    dlock_client *c;
    dlock_lock *m;
    dlock_acquire_options o = labelled_opts(DLOCK_KIND_MUTEX, 20000, "multi");
    const char *tagged[2] = {"{g}a", "{g}b"};
    const char *spread[2] = {"ma", "mb"};
    const char *const *sets[2] = {tagged, spread};

    test_redis_start(&r, NULL);
    c = open_client(&r);
    for (int k = 0; k < 2; k++) {
        CHECK_RC(dlock_acquire_multi(&m, c, sets[k], 2, &o), DLOCK_OK);
        for (int i = 0; i < 2; i++)
            check_one_holder(c, sets[k][i], DLOCK_KIND_MUTEX, "multi");
        CHECK_RC(dlock_release(m), DLOCK_OK);
        for (int i = 0; i < 2; i++)
            check_no_holder(c, sets[k][i]);
    }
    dlock_client_free(c);
    test_redis_stop(&r);
}

TEST_MAIN({"fair_fifo_ten_waiters", fair_fifo_ten_waiters, NULL},
          {"fair_killed_waiter_does_not_block", fair_killed_waiter_does_not_block, NULL},
          {"fair_tokens_never_on_channels", fair_tokens_never_on_channels, NULL},
          {"fair_grant_pushed_to_the_head", fair_grant_pushed_to_the_head, "watchdog"},
          {"fair_leave_gives_back_a_grant", fair_leave_gives_back_a_grant, NULL},
          {"fair_listener_lost_falls_back", fair_listener_lost_falls_back, NULL},
          {"rw_grant_pushed", rw_grant_pushed, "watchdog"},
          {"semaphore_grant_pushed", semaphore_grant_pushed, "watchdog"},
          {"leave_gives_back_read_and_permit", leave_gives_back_read_and_permit, NULL},
          {"handed_without_renewal_confirmed", handed_without_renewal_confirmed, NULL},
          {"fair_places_kept_in_batches", fair_places_kept_in_batches, NULL},
          {"fair_waiter_woken_at_holder_expiry", fair_waiter_woken_at_holder_expiry, NULL},
          {"multi_no_deadlock_one_slot", multi_no_deadlock_one_slot, NULL},
          {"multi_commands_per_path", multi_commands_per_path, NULL},
          {"fence_counter_retired_stays_monotonic", fence_counter_retired_stays_monotonic, NULL},
          {"multi_one_slot_fence_from_floor", multi_one_slot_fence_from_floor, NULL},
          {"skewed_clocks", skewed_clocks, NULL}, {"skewed_holder", skewed_holder, TEST_CHILD},
          {"unused_names_leave_bounded_state", unused_names_leave_bounded_state, NULL},
          {"family_bad_input_before_network", family_bad_input_before_network, NULL},
          {"family_on_lost_once", family_on_lost_once, "watchdog"},
          {"family_acl_documented_set", family_acl_documented_set, "watchdog"},
          {"fence_floor_per_trust_domain", fence_floor_per_trust_domain, NULL},
          {"holder_exclusive_kinds", holder_exclusive_kinds, NULL},
          {"holder_rw_lock", holder_rw_lock, NULL},
          {"holder_semaphore", holder_semaphore, NULL},
          {"holder_multi", holder_multi, NULL})
