/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The asynchronous API on a libuv loop (dlock/async.h and
 * dlock/adapters/libuv.h): a TCP server that holds a lock for each
 * connection, all of them on one thread.
 *
 *   async_uv [--no-threads] URL PORT [LOCKNAME]   LOCKNAME defaults to "conn"
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
 *   ./async_uv redis://127.0.0.1:6379 7000 &
 *   nc 127.0.0.1 7000          # fence 1
 *   nc 127.0.0.1 7000          # waits until the first nc quits, then fence 2
 *
 * examples/async_event.c is the same program on libevent.
 */
/* uv.h needs POSIX's types (pthread_rwlock_t), which -std=c11 leaves out
 * unless asked for before the first include. */
#define _POSIX_C_SOURCE 200809L

#include <dlock/adapters/libuv.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One TCP connection and the lock it asked for. It is freed once its
 * socket is closed and no dlock callback is due to name it. */
typedef struct conn {
    uv_tcp_t tcp;
    unsigned id;
    dlock_request_handle *acquiring; /* the acquisition in flight, or NULL */
    dlock_lock *lock;                /* held, or NULL */
    int releasing;                   /* a release in flight */
    int closed;                      /* the socket is closed */
    char line[16];                   /* what the peer sent since its last '\n' */
    size_t line_len;
    struct conn *next;
} conn;

static uv_loop_t *loop;
static dlock_client *client;
static const char *lock_name = "conn";
static uv_tcp_t server;
static uv_signal_t sigint_h, sigterm_h;
static conn *conns; /* every connection not freed yet */
static unsigned next_id = 1;

static void conn_maybe_free(conn *c)
{
    if (!c->closed || c->acquiring != NULL || c->releasing)
        return;
    for (conn **p = &conns; *p != NULL; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            break;
        }
    free(c);
}

static void on_closed(uv_handle_t *h)
{
    conn *c = h->data;
    c->closed = 1;
    conn_maybe_free(c);
}

static void conn_close(conn *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_closed);
}

/* The lines we send are a few bytes on a socket whose buffer is empty:
 * uv_try_write takes them at once, with no request to keep alive. */
static void conn_write(conn *c, const char *text)
{
    uv_buf_t buf = uv_buf_init((char *)text, (unsigned)strlen(text));
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
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
    char text[32];

    c->acquiring = NULL;
    if (rc == DLOCK_OK) {
        c->lock = lock;
        printf("conn %u: granted, fence %llu\n", c->id,
               (unsigned long long)dlock_lock_fence(lock));
        snprintf(text, sizeof(text), "fence %llu\n", (unsigned long long)dlock_lock_fence(lock));
        conn_write(c, text);
        if (uv_is_closing((uv_handle_t *)&c->tcp))
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

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char mem[256]; /* one read at a time on this thread */
    (void)h, (void)suggested;
    *buf = uv_buf_init(mem, sizeof(mem));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    conn *c = s->data;

    if (n < 0) { /* UV_EOF, or an error: the peer is gone */
        printf("conn %u: closed by peer\n", c->id);
        if (c->acquiring != NULL)
            dlock_request_cancel(c->acquiring); /* on_acquired gets DLOCK_ECANCELED */
        conn_release(c);
        conn_close(c);
        return;
    }
    for (ssize_t i = 0; i < n; i++) {
        if (buf->base[i] != '\n') {
            if (c->line_len < sizeof(c->line) - 1)
                c->line[c->line_len++] = buf->base[i];
            continue;
        }
        c->line[c->line_len] = '\0';
        c->line_len = 0;
        if (strcmp(c->line, "release") == 0 && c->lock != NULL) {
            printf("conn %u: release asked\n", c->id);
            conn_release(c);
        }
    }
}

static void on_connection(uv_stream_t *srv, int status)
{
    dlock_acquire_options opts = DLOCK_ACQUIRE_OPTIONS_INIT;
    conn *c;

    if (status < 0 || (c = calloc(1, sizeof(*c))) == NULL)
        return;
    uv_tcp_init(loop, &c->tcp);
    c->tcp.data = c;
    c->id = next_id++;
    c->next = conns;
    conns = c;
    if (uv_accept(srv, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
        conn_close(c);
        return;
    }
    opts.wait_ms = 10000;
    opts.lease_ms = 5000;
    opts.auto_renew = 1;
    opts.on_lost = on_lost;
    opts.payload = c;
    if (dlock_acquire_async(&c->acquiring, client, lock_name, &opts, on_acquired, c) != DLOCK_OK) {
        printf("conn %u: cannot ask for the lock: %s\n", c->id, dlock_error_message());
        conn_close(c);
        return;
    }
    printf("conn %u: waiting for lock %s\n", c->id, lock_name);
}

/* SIGINT, SIGTERM: leave nothing behind on the server, then let uv_run
 * return by closing every handle. */
static void on_signal(uv_signal_t *h, int signum)
{
    (void)h;
    printf("signal %d: shutting down\n", signum);
    /* Held locks are released now, not left to run out their leases while
     * others wait. A blocking release is allowed on the loop's thread, and
     * a round trip each is fine on the way out. */
    for (conn *c = conns; c != NULL; c = c->next)
        if (c->lock != NULL) {
            printf("conn %u: released (%s)\n", c->id, dlock_strerror(dlock_release(c->lock)));
            c->lock = NULL;
        }
    /* Acquisitions in flight get DLOCK_ECANCELED from inside this call, and
     * the adapter closes its handles. */
    dlock_client_free(client);
    client = NULL;
    for (conn *c = conns; c != NULL; c = c->next)
        conn_close(c);
    uv_close((uv_handle_t *)&server, NULL);
    uv_close((uv_handle_t *)&sigint_h, NULL);
    uv_close((uv_handle_t *)&sigterm_h, NULL);
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
    loop = uv_default_loop();

    /* Opening the client blocks (connect, AUTH): done before the loop runs. */
    if (dlock_client_open(&client, argv[1], &co) != DLOCK_OK) {
        fprintf(stderr, "async_uv: %s\n", dlock_error_message());
        return 1;
    }
    if ((rc = dlock_libuv_attach(client, loop)) != DLOCK_OK) {
        fprintf(stderr, "async_uv: attach: %s\n", dlock_strerror(rc));
        return 1;
    }
    uv_tcp_init(loop, &server);
    uv_ip4_addr("127.0.0.1", atoi(argv[2]), &addr);
    if ((rc = uv_tcp_bind(&server, (const struct sockaddr *)&addr, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&server, 128, on_connection)) != 0) {
        fprintf(stderr, "async_uv: 127.0.0.1:%s: %s\n", argv[2], uv_strerror(rc));
        return 1;
    }
    uv_signal_init(loop, &sigint_h);
    uv_signal_start(&sigint_h, on_signal, SIGINT);
    uv_signal_init(loop, &sigterm_h);
    uv_signal_start(&sigterm_h, on_signal, SIGTERM);
    printf("listening on 127.0.0.1:%s, lock %s\n", argv[2], lock_name);

    uv_run(loop, UV_RUN_DEFAULT); /* until on_signal has closed everything */
    uv_loop_close(loop);
    printf("bye\n");
    return 0;
}
