/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target: the Redis backend's reply handling, through the real
 * code paths. A fake server on a unix socket answers every connection with
 * the fuzz input's bytes as its replies (then closes its side), and a client
 * connected with unix:///path runs a public-API scenario chosen by the first
 * byte: handshake (with AUTH and SELECT or not), acquire, extend, check,
 * release, status, force-release, a waiting acquire (the subscriber thread
 * reads the same bytes as pub/sub messages), and watchdog renewals.
 *
 * Why a socket rather than feeding hiredis' reader directly: the checks to
 * exercise are dlock's (types, arity, values of each reply, error replies,
 * NOSCRIPT, EOF mid-reply) and they sit in the backend's I/O paths; a
 * harness that re-implemented the "same checks" would fuzz a copy. The
 * socket costs speed, not coverage.
 *
 * Invariants: no crash, leak or undefined behaviour (ASan, UBSan, LSan);
 * every failure carries a message naming the server; nothing but the
 * documented codes comes back; a call never blocks past its timeouts.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dlock/dlock.h"

/* libFuzzer's entry points. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_REPLY 8192

static char sock_path[108];
static int listen_fd = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t reply[MAX_REPLY];
static size_t reply_len;

/* Serve: on each new connection send the current reply bytes and shut the
 * write side; read and drop what the client sends until it hangs up. */
static void *serve(void *arg)
{
    struct pollfd fds[65];
    int nfds = 1;

    (void)arg;
    fds[0].fd = listen_fd;
    fds[0].events = POLLIN;
    for (;;) {
        if (poll(fds, (nfds_t)nfds, -1) < 0)
            continue;
        if ((fds[0].revents & POLLIN) && nfds < 65) {
            int fd = accept(listen_fd, NULL, NULL);
            if (fd >= 0) {
                size_t off = 0;
                pthread_mutex_lock(&mu);
                while (off < reply_len) {
                    ssize_t w = send(fd, reply + off, reply_len - off, MSG_NOSIGNAL);
                    if (w <= 0)
                        break;
                    off += (size_t)w;
                }
                pthread_mutex_unlock(&mu);
                shutdown(fd, SHUT_WR);
                fds[nfds].fd = fd;
                fds[nfds].events = POLLIN;
                fds[nfds].revents = 0;
                nfds++;
            }
        }
        for (int i = 1; i < nfds; i++) {
            char buf[4096];
            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (recv(fds[i].fd, buf, sizeof(buf), 0) <= 0) {
                close(fds[i].fd);
                fds[i] = fds[--nfds];
                i--;
            }
        }
    }
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct sockaddr_un a;
    pthread_t t;

    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    snprintf(sock_path, sizeof(sock_path), "/tmp/dlock-fuzz-%d.sock", (int)getpid());
    unlink(sock_path);
    memset(&a, 0, sizeof(a));
    a.sun_family = AF_UNIX;
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
    listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(listen_fd, 64) != 0) {
        perror("fuzz_redis_reply: listen");
        exit(1);
    }
    if (pthread_create(&t, NULL, serve, NULL) != 0)
        exit(1);
    pthread_detach(t);
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Codes a call may return when the server answers nonsense. */
static void check_rc(int rc, int64_t t0, int64_t limit_ms)
{
    if (rc > 0 || rc < DLOCK_ESERVER || rc == DLOCK_EINVAL || rc == DLOCK_EMISUSE)
        abort();
    if (rc != DLOCK_OK && rc != DLOCK_EBUSY && rc != DLOCK_ELOST && rc != DLOCK_ETIMEOUT) {
        const char *m = dlock_error_message();
        /* The message names the cause and the server. */
        if (m[0] == '\0' || strstr(m, "redis unix:") == NULL)
            abort();
    }
    if (now_ms() - t0 > limit_ms) {
        fprintf(stderr, "a call took %lld ms (limit %lld): %d %s\n", (long long)(now_ms() - t0),
                (long long)limit_ms, rc, dlock_error_message());
        abort(); /* blocked past its timeouts */
    }
}

static void lost_cb(dlock_lock *l, int reason, void *payload)
{
    (void)l;
    (void)payload;
    if (reason != DLOCK_ELOST && reason != DLOCK_ECONN)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    dlock_lock_info info;
    char url[200];
    int op, rc;
    int64_t t0, limit;

    if (size < 1 || size - 1 > MAX_REPLY)
        return 0;
    op = data[0] % 8;
    pthread_mutex_lock(&mu);
    memcpy(reply, data + 1, size - 1);
    reply_len = size - 1;
    pthread_mutex_unlock(&mu);

    co.connect_timeout_ms = 200;
    co.command_timeout_ms = 200;
    /* Each call: a command, a reconnect and its handshake, once more. */
    limit = 4 * co.command_timeout_ms + 2 * co.connect_timeout_ms + 500;
    if (op == 6)
        snprintf(url, sizeof(url), "unix://fuzzer:pw@%s?db=3", sock_path);
    else
        snprintf(url, sizeof(url), "unix://%s", sock_path);
    t0 = now_ms();
    rc = dlock_client_open(&c, url, &co);
    check_rc(rc, t0, limit);
    if (rc != DLOCK_OK)
        return 0;

    o.lease_ms = 60000;
    o.auto_renew = 0;
    o.on_lost = lost_cb;
    t0 = now_ms();
    switch (op) {
    case 0:
    case 6:
        rc = dlock_acquire(&l, c, "f", &o);
        break;
    case 1:
        rc = dlock_acquire(&l, c, "f", &o);
        check_rc(rc, t0, limit);
        if (rc == DLOCK_OK) {
            t0 = now_ms();
            check_rc(dlock_lock_extend(l, 30000), t0, limit);
            t0 = now_ms();
            rc = dlock_lock_check(l);
        }
        break;
    case 2:
        rc = dlock_status(&info, c, "f");
        break;
    case 3:
        rc = dlock_force_release(&info, c, "f");
        break;
    case 4:
        o.wait_ms = 30;
        rc = dlock_acquire(&l, c, "f", &o);
        /* Wait 30 ms, plus one try that may reconnect. */
        limit += 30;
        break;
    case 5:
        o.lease_ms = 30; /* renewed every 10 ms on the watchdog's connection */
        o.auto_renew = 1;
        rc = dlock_acquire(&l, c, "f", &o);
        if (rc == DLOCK_OK) {
            struct timespec ts = {0, 25 * 1000000};
            nanosleep(&ts, NULL);
            t0 = now_ms();
        }
        break;
    case 7: {
        dlock_lock *more[2] = {NULL, NULL};
        rc = dlock_acquire(&l, c, "f", &o);
        check_rc(rc, t0, limit);
        t0 = now_ms();
        check_rc(dlock_acquire(&more[0], c, "g", &o), t0, limit);
        t0 = now_ms();
        check_rc(dlock_acquire(&more[1], c, "h", &o), t0, limit);
        for (int i = 0; i < 2; i++) {
            t0 = now_ms();
            check_rc(dlock_release(more[i]), t0, limit);
        }
        t0 = now_ms();
        rc = DLOCK_OK; /* checked above; the message is the last call's now */
        break;
    }
    }
    check_rc(rc, t0, limit);
    if (l != NULL) {
        if (dlock_lock_fence(l) == 0)
            abort(); /* a held lock always has a fence > 0 */
        t0 = now_ms();
        check_rc(dlock_release(l), t0, limit);
    }
    dlock_client_free(c);
    return 0;
}
