/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A small TCP fault proxy between the workers and the server, on loopback:
 * every accepted connection gets its own upstream connection and two pump
 * threads. The runner switches its mode at any time:
 *
 *   pass       forward as is
 *   delay      hold every chunk delay_ms before forwarding it (each way)
 *   delay one reply  hold the next chunk from the server delay_ms, then pass:
 *              a request the server ran whose reply comes too late
 *   blackhole  forward nothing, accept and read nothing: bytes wait in the
 *              kernel's buffers, as in a partition, and are delivered late
 *              when it heals, if the connection is still open
 *   drop       (an action, not a mode) close every open connection
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "chaos_proxy.h"

typedef struct pair {
    int client_fd, server_fd;
    int refs;   /* pump threads still running */
    int closed; /* shut down by drop */
    struct pair *next;
} pair;

struct chaos_proxy {
    int listen_fd;
    int port;
    int upstream_port;
    _Atomic int mode;
    _Atomic int delay_ms;
    _Atomic int stopping;
    _Atomic int accepted;
    _Atomic int connect_mode; /* an HTTP CONNECT proxy: answer CONNECT first */
    _Atomic int connects;     /* CONNECT requests answered */
    pthread_t acceptor;
    pthread_mutex_t mu;
    pthread_cond_t gone;
    pair *pairs;
    int threads; /* pump threads alive */
};

typedef struct {
    chaos_proxy *p;
    pair *pr;
    int from, to;
} pump_arg;

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

static void pair_release(chaos_proxy *p, pair *pr)
{
    pthread_mutex_lock(&p->mu);
    if (--pr->refs == 0) {
        pair **pp = &p->pairs;
        while (*pp != pr)
            pp = &(*pp)->next;
        *pp = pr->next;
        close(pr->client_fd);
        close(pr->server_fd);
        free(pr);
    }
    p->threads--;
    pthread_cond_broadcast(&p->gone);
    pthread_mutex_unlock(&p->mu);
}

static int one_reply_delayed(chaos_proxy *p)
{
    int want = CHAOS_PROXY_DELAY_ONE_REPLY;

    return atomic_compare_exchange_strong(&p->mode, &want, CHAOS_PROXY_PASS);
}

static void *pump(void *arg)
{
    pump_arg a = *(pump_arg *)arg;
    chaos_proxy *p = a.p;
    char buf[16384];

    free(arg);
    while (!atomic_load(&p->stopping)) {
        struct pollfd pfd = {a.from, POLLIN, 0};
        ssize_t n;
        int delay;

        if (atomic_load(&p->mode) == CHAOS_PROXY_BLACKHOLE) {
            nap_ms(5);
            continue;
        }
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        n = recv(a.from, buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        delay = atomic_load(&p->delay_ms);
        if (atomic_load(&p->mode) == CHAOS_PROXY_DELAY && delay > 0)
            nap_ms(delay);
        if (a.from == a.pr->server_fd && one_reply_delayed(p) && delay > 0)
            nap_ms(delay);
        while (atomic_load(&p->mode) == CHAOS_PROXY_BLACKHOLE && !atomic_load(&p->stopping))
            nap_ms(5); /* read just before the partition: deliver after it */
        if (write_all(a.to, buf, (size_t)n) != 0)
            break;
    }
    /* One side is done: the other pump sees EOF or an error. */
    shutdown(a.from, SHUT_RDWR);
    shutdown(a.to, SHUT_RDWR);
    pair_release(p, a.pr);
    return NULL;
}

/* In DELAY_ONE_REPLY mode, the first chunk from the server on any connection
 * is delayed, and the proxy passes everything from then on. */
static int connect_upstream(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static int start_pump(chaos_proxy *p, pair *pr, int from, int to)
{
    pump_arg *a = malloc(sizeof(*a));
    pthread_t t;

    if (a == NULL)
        return -1;
    *a = (pump_arg){p, pr, from, to};
    if (pthread_create(&t, NULL, pump, a) != 0) {
        free(a);
        return -1;
    }
    pthread_detach(t);
    return 0;
}

/* CONNECT mode: read the client's request head and answer 200 when it is
 * a CONNECT (to whatever it names: the tunnel goes to the upstream port).
 * 0 when the tunnel is open, -1 to drop the connection. */
static int answer_connect(chaos_proxy *p, int cfd)
{
    static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
    char head[4096];
    size_t n = 0;

    while (n < sizeof(head) - 1) {
        struct pollfd pfd = {cfd, POLLIN, 0};
        ssize_t got;
        if (poll(&pfd, 1, 5000) <= 0)
            return -1;
        /* One byte at a time: nothing past the head may be consumed. */
        if ((got = read(cfd, head + n, 1)) <= 0)
            return -1;
        n++;
        head[n] = '\0';
        if (n >= 4 && memcmp(head + n - 4, "\r\n\r\n", 4) == 0)
            break;
    }
    if (strncmp(head, "CONNECT ", 8) != 0) {
        static const char no[] = "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n";
        write_all(cfd, no, sizeof(no) - 1);
        return -1;
    }
    atomic_fetch_add(&p->connects, 1);
    return write_all(cfd, ok, sizeof(ok) - 1);
}

static void *acceptor(void *arg)
{
    chaos_proxy *p = arg;

    while (!atomic_load(&p->stopping)) {
        struct pollfd pfd = {p->listen_fd, POLLIN, 0};
        int cfd, sfd, one = 1;
        pair *pr;

        if (atomic_load(&p->mode) == CHAOS_PROXY_BLACKHOLE) {
            /* The connection completes in the kernel's backlog; nothing
             * more happens until the partition heals. */
            nap_ms(5);
            continue;
        }
        if (poll(&pfd, 1, 50) <= 0)
            continue;
        cfd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0)
            continue;
        atomic_fetch_add(&p->accepted, 1);
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (atomic_load(&p->connect_mode) && answer_connect(p, cfd) != 0) {
            close(cfd);
            continue;
        }
        sfd = connect_upstream(p->upstream_port);
        if (sfd < 0) {
            close(cfd); /* server down: the client sees the connection close */
            continue;
        }
        pr = calloc(1, sizeof(*pr));
        if (pr == NULL) {
            close(cfd);
            close(sfd);
            continue;
        }
        pr->client_fd = cfd;
        pr->server_fd = sfd;
        pr->refs = 2;
        pthread_mutex_lock(&p->mu);
        pr->next = p->pairs;
        p->pairs = pr;
        p->threads += 2;
        pthread_mutex_unlock(&p->mu);
        if (start_pump(p, pr, cfd, sfd) != 0 || start_pump(p, pr, sfd, cfd) != 0) {
            fprintf(stderr, "chaos proxy: cannot start a pump thread\n");
            exit(1);
        }
    }
    return NULL;
}

int chaos_proxy_start(chaos_proxy **out, int upstream_port)
{
    chaos_proxy *p = calloc(1, sizeof(*p));
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int one = 1;

    *out = NULL;
    if (p == NULL)
        return -1;
    p->upstream_port = upstream_port;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->gone, NULL);
    p->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(p->listen_fd, 128) != 0 ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &len) != 0) {
        perror("chaos proxy: listen");
        free(p);
        return -1;
    }
    p->port = ntohs(a.sin_port);
    if (pthread_create(&p->acceptor, NULL, acceptor, p) != 0) {
        close(p->listen_fd);
        free(p);
        return -1;
    }
    *out = p;
    return 0;
}

int chaos_proxy_port(const chaos_proxy *p)
{
    return p->port;
}

void chaos_proxy_connect_mode(chaos_proxy *p)
{
    atomic_store(&p->connect_mode, 1);
}

int chaos_proxy_connects(chaos_proxy *p)
{
    return atomic_load(&p->connects);
}

int chaos_proxy_accepted(chaos_proxy *p)
{
    return atomic_load(&p->accepted);
}

void chaos_proxy_set(chaos_proxy *p, int mode, int delay_ms)
{
    atomic_store(&p->delay_ms, delay_ms);
    atomic_store(&p->mode, mode);
}

int chaos_proxy_drop(chaos_proxy *p)
{
    int n = 0;

    pthread_mutex_lock(&p->mu);
    for (pair *pr = p->pairs; pr != NULL; pr = pr->next) {
        if (pr->closed)
            continue;
        pr->closed = 1;
        shutdown(pr->client_fd, SHUT_RDWR);
        shutdown(pr->server_fd, SHUT_RDWR);
        n++;
    }
    pthread_mutex_unlock(&p->mu);
    return n;
}

void chaos_proxy_stop(chaos_proxy *p)
{
    if (p == NULL)
        return;
    atomic_store(&p->stopping, 1);
    pthread_join(p->acceptor, NULL);
    chaos_proxy_drop(p);
    pthread_mutex_lock(&p->mu);
    while (p->threads > 0)
        pthread_cond_wait(&p->gone, &p->mu);
    pthread_mutex_unlock(&p->mu);
    close(p->listen_fd);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->gone);
    free(p);
}
