/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The runner (test_run) and the helpers any test uses; the servers are in
 * test_server.c (test_server_*) and server_NAME.c, ZooKeeper's, MariaDB's
 * and PostgreSQL's in test_zk.c, test_mysql.c and test_pg.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <stdarg.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_server.h"

int test_run(const test_case *cases, size_t n, int argc, char **argv)
{
    /* SIGPIPE keeps its default action: the library must never raise it. */
    if (argc != 2) {
        fprintf(stderr, "usage: %s TEST | --list\ntests:", argv[0]);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %s", cases[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    if (strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < n; i++) {
            if (cases[i].labels != NULL && strcmp(cases[i].labels, TEST_CHILD) == 0)
                continue;
            printf("%s %s\n", cases[i].name, cases[i].labels ? cases[i].labels : "");
        }
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(cases[i].name, argv[1]) == 0) {
            cases[i].fn();
            printf("ok %s\n", cases[i].name);
            return 0;
        }
    }
    fprintf(stderr, "no test called %s\n", argv[1]);
    return 2;
}

int test_run_on(const test_case *cases, size_t n, int argc, char **argv, const char **backend)
{
    if (argc == 2 && strcmp(argv[1], "--list") == 0)
        return test_run(cases, n, argc, argv);
    if (argc < 2) {
        fprintf(stderr, "usage: %s BACKEND CASE | --list\n", argv[0]);
        return 2;
    }
    *backend = argv[1];
    return test_run(cases, n, argc - 1, argv + 1);
}

int64_t test_clock_ms(int clock)
{
    struct timespec ts;

    clock_gettime((clockid_t)clock, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int test_fd_target(int fd, char *target, size_t size)
{
    char path[64];
    ssize_t n;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, target, size - 1);
    if (n <= 0 || (size_t)n >= size - 1)
        return 0;
    target[n] = '\0';
    return 1;
}

void test_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

const char *test_faketime_lib(void)
{
    static const char *const paths[] = {
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
    };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        if (access(paths[i], R_OK) == 0)
            return paths[i];
    return NULL;
}

/* Bind a socket to loopback port (0: one the kernel picks) and close it:
 * the port bound, or 0 when the bind failed. */
static int loopback_bind(int port)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), bound = 0;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        bound = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return bound;
}

int test__kernel_port(void)
{
    int port = loopback_bind(0);

    if (port == 0) {
        perror("test__kernel_port");
        exit(1);
    }
    return port;
}

int test__port_free(int port)
{
    return loopback_bind(port) == port;
}

void *test_shared_page(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    CHECK(p != MAP_FAILED);
    memset(p, 0, size);
    return p;
}

/* A free loopback port below the kernel's ephemeral range, so that no
 * outgoing connection (of this or a parallel test) takes it between this
 * check and the server's bind (etcd, ZooKeeper). */
int test_free_port(void)
{
    static unsigned seed;
    int low = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

    if (f != NULL) {
        if (fscanf(f, "%d", &low) != 1)
            low = 32768;
        fclose(f);
    }
    if (seed == 0)
        seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    for (int tries = 0; low > 12000 && tries < 200; tries++) {
        struct sockaddr_in a;
        int fd = socket(AF_INET, SOCK_STREAM, 0), port, ok;
        port = 10000 + (int)(rand_r(&seed) % (unsigned)(low - 10000));
        memset(&a, 0, sizeof(a));
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
        if (fd >= 0)
            close(fd);
        if (ok)
            return port;
    }
    return test__kernel_port();
}

int test_process_alive(int pid)
{
    char path[64], buf[256];
    FILE *f;
    int alive = 0;

    if (pid <= 0 || kill(pid, 0) != 0)
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    f = fopen(path, "r");
    if (f == NULL)
        return 0;
    if (fgets(buf, sizeof(buf), f) != NULL) {
        char *close_paren = strrchr(buf, ')');
        alive = close_paren != NULL && close_paren[1] == ' ' && close_paren[2] != 'Z';
    }
    fclose(f);
    return alive;
}

/* ------------------------------------------------------------------------
 * A fake Redis node: RESP commands in, the test's answers out
 * ---------------------------------------------------------------------- */

typedef struct {
    int fd;
    char buf[16384];
    size_t len;
} fake_client;

/* A "*N" or "$N" line at *p (type '*' or '$'): 1 with N in *v and *p past
 * it, 0 when more bytes are needed, -1 when it is not that line. */
static int fake_line(char **p, char *end, char type, long *v)
{
    char *nl;

    if (*p >= end)
        return 0;
    if (**p != type)
        return -1;
    if ((nl = memchr(*p, '\n', (size_t)(end - *p))) == NULL)
        return 0;
    *v = strtol(*p + 1, NULL, 10);
    *p = nl + 1;
    return 1;
}

/* One whole command at the start of c->buf: its length, 0 when more bytes
 * are needed, -1 when it is not RESP (the connection is dropped). */
static long fake_parse(fake_client *c, int *argc, char **argv, int max)
{
    char *p = c->buf, *end = c->buf + c->len;
    long n;
    int ok;

    if ((ok = fake_line(&p, end, '*', &n)) <= 0)
        return ok;
    if (n < 1 || n > max)
        return -1;
    for (long i = 0; i < n; i++) {
        long len;
        if ((ok = fake_line(&p, end, '$', &len)) <= 0)
            return ok;
        if (len < 0 || len > (long)sizeof(c->buf))
            return -1;
        if (end - p < len + 2)
            return 0;
        argv[i] = p;
        p += len + 2;
        argv[i][len] = '\0'; /* over the \r */
    }
    *argc = (int)n;
    return p - c->buf;
}

static void fake_serve(test_fake_node *f, fake_client *c)
{
    ssize_t got = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len);
    long used;
    int argc;
    char *argv[32], out[8192];

    if (got <= 0) {
        close(c->fd);
        c->fd = -1;
        return;
    }
    pthread_mutex_lock(&f->mu);
    if (f->seen_len < sizeof(f->seen) - 1) {
        size_t take = (size_t)got < sizeof(f->seen) - 1 - f->seen_len
                          ? (size_t)got : sizeof(f->seen) - 1 - f->seen_len;
        /* NULs as dots, so that strstr sees everything. */
        for (size_t i = 0; i < take; i++)
            f->seen[f->seen_len + i] = c->buf[c->len + i] != '\0' ? c->buf[c->len + i] : '.';
        f->seen_len += take;
    }
    pthread_mutex_unlock(&f->mu);
    c->len += (size_t)got;
    while ((used = fake_parse(c, &argc, argv, 32)) > 0) {
        const char *a;
        if (strcasecmp(argv[0], "AUTH") == 0)
            atomic_fetch_add(&f->auths, 1);
        a = f->answer != NULL ? f->answer(f, argc, argv, out, sizeof(out)) : NULL;
        if (a != NULL && write(c->fd, a, strlen(a)) < 0)
            break;
        memmove(c->buf, c->buf + used, c->len - (size_t)used);
        c->len -= (size_t)used;
    }
    if (used < 0 || c->len == sizeof(c->buf)) {
        close(c->fd);
        c->fd = -1;
    }
}

static void *fake_main(void *arg)
{
    test_fake_node *f = arg;
    fake_client cl[16];

    for (int i = 0; i < 16; i++)
        cl[i].fd = -1;
    while (!atomic_load(&f->stop)) {
        struct pollfd p[17];
        int at[17], n = 0;

        p[n].fd = f->fd;
        p[n].events = POLLIN;
        at[n++] = -1;
        for (int i = 0; i < 16; i++)
            if (cl[i].fd >= 0) {
                p[n].fd = cl[i].fd;
                p[n].events = POLLIN;
                at[n++] = i;
            }
        if (poll(p, (nfds_t)n, 20) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (at[k] >= 0) {
                fake_serve(f, &cl[at[k]]);
                continue;
            }
            int fd = accept(f->fd, NULL, NULL);
            if (fd < 0)
                continue;
            atomic_fetch_add(&f->conns, 1);
            for (int i = 0; i < 16 && fd >= 0; i++)
                if (cl[i].fd < 0) {
                    cl[i].fd = fd;
                    cl[i].len = 0;
                    fd = -1;
                }
            if (fd >= 0)
                close(fd);
        }
    }
    for (int i = 0; i < 16; i++)
        if (cl[i].fd >= 0)
            close(cl[i].fd);
    return NULL;
}

void test_fake_node_start(test_fake_node *f, test_fake_answer *answer, void *arg)
{
    struct sockaddr_in a = {0};
    socklen_t len = sizeof(a);

    memset(f, 0, sizeof(*f));
    f->answer = answer;
    f->arg = arg;
    pthread_mutex_init(&f->mu, NULL);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((f->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        bind(f->fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(f->fd, 16) != 0 ||
        getsockname(f->fd, (struct sockaddr *)&a, &len) != 0 ||
        pthread_create(&f->thread, NULL, fake_main, f) != 0) {
        perror("test_fake_node_start");
        exit(1);
    }
    f->port = ntohs(a.sin_port);
}

void test_fake_node_stop(test_fake_node *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    close(f->fd);
    pthread_mutex_destroy(&f->mu);
}

int test_fake_node_saw(test_fake_node *f, const char *needle)
{
    int saw;

    pthread_mutex_lock(&f->mu);
    f->seen[f->seen_len] = '\0';
    saw = strstr(f->seen, needle) != NULL;
    pthread_mutex_unlock(&f->mu);
    return saw;
}

void test_url_refused(const char *url, const char *needle)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
    fprintf(stderr, "refused as expected: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), needle);
}

dlock_acquire_options test_opts(int64_t wait_ms, int64_t lease_ms, int auto_renew)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;

    o.wait_ms = wait_ms;
    o.lease_ms = lease_ms;
    o.auto_renew = auto_renew;
    return o;
}

void test_wait_child_ok(int pid)
{
    int status;

    CHECK(waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "child %d failed (status %d)\n", pid, status);
        exit(1);
    }
}

atomic_int test_lost_calls;
atomic_int test_lost_reason;

void test_count_lost(dlock_lock *lock, int reason, void *payload)
{
    (void)lock;
    (void)payload;
    atomic_store(&test_lost_reason, reason);
    atomic_fetch_add(&test_lost_calls, 1);
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static char log_text[8192];

void test_log_record(int level, const char *message, void *payload)
{
    size_t n;

    (void)payload;
    pthread_mutex_lock(&log_mu);
    n = strlen(log_text);
    snprintf(log_text + n, sizeof(log_text) - n, "%d %s\n", level, message);
    pthread_mutex_unlock(&log_mu);
}

const char *test_log_text(void)
{
    return log_text;
}

void test_log_clear(void)
{
    pthread_mutex_lock(&log_mu);
    log_text[0] = '\0';
    pthread_mutex_unlock(&log_mu);
}

void test_acquirer_init(test_acquirer *a, dlock_client *c, const char *name,
                        dlock_acquire_options o)
{
    memset(a, 0, sizeof(*a));
    a->c = c;
    a->name = name;
    a->o = o;
}

void *test_acquirer_main(void *arg)
{
    test_acquirer *a = arg;
    struct timespec t0, t1;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    a->rc = dlock_acquire(&a->lock, a->c, a->name, &a->o);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    a->took_ms = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    if (a->rc != DLOCK_OK)
        snprintf(a->message, sizeof(a->message), "%s", dlock_error_message());
    atomic_store(&a->done, 1);
    return NULL;
}

static int async_callbacks_run;

void test_async_acquired(int rc, dlock_lock *lock, void *arg)
{
    test_async_outcome *o = arg;

    o->calls++;
    o->rc = rc;
    o->lock = lock;
    o->order = ++async_callbacks_run;
    snprintf(o->msg, sizeof(o->msg), "%s", dlock_error_message());
    CHECK((rc == DLOCK_OK) == (lock != NULL));
}

void test_async_done(int rc, void *arg)
{
    test_async_outcome *o = arg;

    o->calls++;
    o->rc = rc;
    o->order = ++async_callbacks_run;
    snprintf(o->msg, sizeof(o->msg), "%s", dlock_error_message());
}

void test_async_turn(dlock_client *c, int cap_ms)
{
    struct pollfd p = {dlock_async_fd(c), POLLIN, 0};
    int64_t due = dlock_async_timeout_ms(c);

    CHECK(p.fd >= 0);
    if (poll(&p, 1, due >= 0 && due < cap_ms ? (int)due : cap_ms) > 0 || due >= 0)
        CHECK(dlock_async_process(c) >= 0);
}

void test_async_until(dlock_client *c, const int *calls, int want, int64_t ms)
{
    struct timespec t0, t;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (*calls < want) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        CHECK((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
        test_async_turn(c, 10);
    }
}

void test_hand_over(dlock_lock *l, test_acquirer *a, pthread_t t)
{
    uint64_t fence = dlock_lock_fence(l);

    CHECK_RC(dlock_release(l), DLOCK_OK);
    CHECK(pthread_join(t, NULL) == 0);
    CHECK_RC(a->rc, DLOCK_OK);
    CHECK(dlock_lock_fence(a->lock) > fence);
}
