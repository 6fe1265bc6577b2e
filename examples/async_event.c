/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous API on a libevent loop (dlock/async.h and
 * dlock/adapters/libevent.h): a TCP server that holds a lock for each
 * connection, all of them on one thread.
 *
 *   async_event [--no-threads] URL PORT [LOCKNAME]   LOCKNAME defaults to "conn"
 *
 * For every connection to 127.0.0.1:PORT it asks for the lock without
 * blocking the loop (waiting up to 10 s, a 5 s lease that the client
 * renews), and when it gets it writes "fence N\n" to the connection. It
 * keeps the lock until the peer closes the connection or sends "release\n"
 * (answered "released\n"); then the next connection in line gets it. A
 * connection that does not get the lock is closed. One line per event on
 * stdout. SIGINT or SIGTERM: held locks are released, the client is freed
 * (waiting connections see their requests canceled), and it exits 0.
 *
 * --no-threads opens the client with DLOCK_CLIENT_NO_THREADS: the library
 * starts no thread, the lock's renewals run on this loop as well, and the
 * whole program is one thread (a wait then polls: docs/async.md).
 *
 *   redis-server --port 6379 &
 *   ./async_event redis://127.0.0.1:6379 7000 &
 *   nc 127.0.0.1 7000          # fence 1
 *   nc 127.0.0.1 7000          # waits until the first nc quits, then fence 2
 *
 * examples/async_uv.c is the same program on libuv.
 */
/* POSIX's types and calls (suseconds_t, signal), which -std=c11 leaves out
 * unless asked for before the first include. */
#define _POSIX_C_SOURCE 200809L

#include <dlock/adapters/libevent.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/listener.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One TCP connection and the lock it asked for. It is freed once its
 * socket is closed and no dlock callback is due to name it. */
typedef struct conn {
    struct bufferevent *bev;         /* NULL once closed */
    unsigned id;
    dlock_request_handle *acquiring; /* the acquisition in flight, or NULL */
    dlock_lock *lock;                /* held, or NULL */
    int releasing;                   /* a release in flight */
    struct conn *next;
} conn;

static struct event_base *base;
static dlock_client *client;
static const char *lock_name = "conn";
static struct evconnlistener *listener;
static struct event *sigint_ev, *sigterm_ev;
static conn *conns; /* every connection not freed yet */
static unsigned next_id = 1;

/* The last thing a caller does with c. */
static void conn_maybe_free(conn *c)
{
    if (c->bev != NULL || c->acquiring != NULL || c->releasing)
        return;
    for (conn **p = &conns; *p != NULL; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    free(c);
}

static void conn_close(conn *c)
{
    if (c->bev != NULL)
        bufferevent_free(c->bev); /* and the socket: BEV_OPT_CLOSE_ON_FREE */
    c->bev = NULL;
}

static void conn_write(conn *c, const char *text)
{
    if (c->bev != NULL)
        bufferevent_write(c->bev, text, strlen(text));
}

static void on_released(int rc, void *arg)
{
    conn *c = arg;
    c->releasing = 0;
    printf("conn %u: released (%s)\n", c->id, dlock_strerror(rc));
    conn_write(c, "released\n");
    conn_maybe_free(c);
}

/* Give the lock back without waiting for the server's answer. */
static void conn_release(conn *c)
{
    dlock_lock *lock = c->lock;
    if (lock == NULL)
        return;
    c->lock = NULL;
    c->releasing = 1;
    if (dlock_release_async(NULL, lock, on_released, c) != DLOCK_OK) {
        printf("conn %u: release failed: %s\n", c->id, dlock_error_message());
        dlock_release(lock); /* a blocking release frees the handle in any case */
        c->releasing = 0;
    }
}

/* Called from dlock_async_process (or dlock_client_free), on the loop. */
static void on_acquired(int rc, dlock_lock *lock, void *arg)
{
    conn *c = arg;
    char text[64];

    c->acquiring = NULL;
    if (rc == DLOCK_OK) {
        c->lock = lock;
        printf("conn %u: granted, fence %llu\n", c->id,
               (unsigned long long)dlock_lock_fence(lock));
        snprintf(text, sizeof(text), "fence %llu\n", (unsigned long long)dlock_lock_fence(lock));
        conn_write(c, text);
        if (c->bev == NULL)
            conn_release(c); /* the connection went meanwhile: pass the lock on */
    } else {
        if (rc == DLOCK_ECANCELED)
            printf("conn %u: canceled (%s)\n", c->id, dlock_strerror(rc));
        else
            printf("conn %u: not granted: %s\n", c->id, dlock_error_message());
        conn_close(c);
    }
    conn_maybe_free(c);
}

/* The lease could not be kept (the server is gone, or gave the lock to
 * another after a stall): whoever relies on the lock must stop now. */
static void on_lost(dlock_lock *lock, int reason, void *payload)
{
    conn *c = payload;
    (void)lock;
    printf("conn %u: lock lost (%s)\n", c->id, dlock_strerror(reason));
    conn_write(c, "lost\n");
    conn_release(c);
}

static void on_read(struct bufferevent *bev, void *arg)
{
    conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    char *line;

    while ((line = evbuffer_readln(in, NULL, EVBUFFER_EOL_LF)) != NULL) {
        if (strcmp(line, "release") == 0 && c->lock != NULL) {
            printf("conn %u: release asked\n", c->id);
            conn_release(c);
        }
        free(line);
    }
}

/* EOF or an error: the peer is gone. */
static void on_bev_event(struct bufferevent *bev, short what, void *arg)
{
    conn *c = arg;
    (void)bev;
    if (!(what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)))
        return;
    printf("conn %u: closed by peer\n", c->id);
    if (c->acquiring != NULL)
        dlock_request_cancel(c->acquiring); /* on_acquired gets DLOCK_ECANCELED */
    conn_release(c);
    conn_close(c);
    conn_maybe_free(c);
}

static void on_accept(struct evconnlistener *l, evutil_socket_t fd, struct sockaddr *sa,
                      int salen, void *arg)
{
    dlock_acquire_options opts = DLOCK_ACQUIRE_OPTIONS_INIT;
    conn *c;

    (void)l, (void)sa, (void)salen, (void)arg;
    if ((c = calloc(1, sizeof(*c))) == NULL ||
        (c->bev = bufferevent_socket_new(base, fd, BEV_OPT_CLOSE_ON_FREE)) == NULL) {
        free(c);
        evutil_closesocket(fd);
        return;
    }
    c->id = next_id++;
    c->next = conns;
    conns = c;
    bufferevent_setcb(c->bev, on_read, NULL, on_bev_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);

    opts.wait_ms = 10000;
    opts.lease_ms = 5000;
    opts.auto_renew = 1;
    opts.on_lost = on_lost;
    opts.payload = c;
    if (dlock_acquire_async(&c->acquiring, client, lock_name, &opts, on_acquired, c) != DLOCK_OK) {
        printf("conn %u: cannot ask for the lock: %s\n", c->id, dlock_error_message());
        conn_close(c);
        conn_maybe_free(c);
        return;
    }
    printf("conn %u: waiting for lock %s\n", c->id, lock_name);
}

/* SIGINT, SIGTERM: leave nothing behind on the server, then let
 * event_base_dispatch return by removing every event. */
static void on_signal(evutil_socket_t signum, short what, void *arg)
{
    conn *c, *next;
    (void)what, (void)arg;

    printf("signal %d: shutting down\n", (int)signum);
    /* Held locks are released now, not left to run out their leases while
     * others wait. A blocking release is allowed on the loop's thread, and
     * a round trip each is fine on the way out. */
    for (c = conns; c != NULL; c = c->next)
        if (c->lock != NULL) {
            printf("conn %u: released (%s)\n", c->id, dlock_strerror(dlock_release(c->lock)));
            c->lock = NULL;
        }
    /* Acquisitions in flight get DLOCK_ECANCELED from inside this call, and
     * the adapter removes its events. */
    dlock_client_free(client);
    client = NULL;
    for (c = conns; c != NULL; c = next) {
        next = c->next;
        conn_close(c);
        conn_maybe_free(c);
    }
    evconnlistener_free(listener);
    event_free(sigint_ev);
    event_free(sigterm_ev);
}

int main(int argc, char **argv)
{
    struct sockaddr_in addr;
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    int rc;

    if (argc > 1 && strcmp(argv[1], "--no-threads") == 0) {
        /* The library starts no thread: renewals run on this loop too. */
        co.flags = DLOCK_CLIENT_NO_THREADS;
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: %s [--no-threads] URL PORT [LOCKNAME]\n", argv[0]);
        return 2;
    }
    if (argc == 4)
        lock_name = argv[3];
    setvbuf(stdout, NULL, _IOLBF, 0); /* one line per event, also into a pipe */
    signal(SIGPIPE, SIG_IGN);         /* a peer gone mid-write is an error, not death */
    if ((base = event_base_new()) == NULL)
        return 1;

    /* Opening the client blocks (connect, AUTH): done before the loop runs. */
    if (dlock_client_open(&client, argv[1], &co) != DLOCK_OK) {
        fprintf(stderr, "async_event: %s\n", dlock_error_message());
        return 1;
    }
    if ((rc = dlock_libevent_attach(client, base)) != DLOCK_OK) {
        fprintf(stderr, "async_event: attach: %s\n", dlock_strerror(rc));
        return 1;
    }

    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_port = htons((unsigned short)atoi(argv[2]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    listener = evconnlistener_new_bind(base, on_accept, NULL,
                                       LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 128,
                                       (struct sockaddr *)&addr, sizeof(addr));
    if (listener == NULL) {
        perror("async_event: 127.0.0.1");
        return 1;
    }
    sigint_ev = evsignal_new(base, SIGINT, on_signal, NULL);
    sigterm_ev = evsignal_new(base, SIGTERM, on_signal, NULL);
    evsignal_add(sigint_ev, NULL);
    evsignal_add(sigterm_ev, NULL);
    printf("listening on 127.0.0.1:%s, lock %s\n", argv[2], lock_name);

    event_base_dispatch(base); /* until on_signal has removed everything */
    event_base_free(base);
    printf("bye\n");
    return 0;
}
