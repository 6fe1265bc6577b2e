/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The scripted fake server (fake_server.h). One thread polls the listening
 * socket and every connection; commands are parsed with hiredis' own reader,
 * so pipelined commands (the handshake) are answered one by one, in order.
 */
#include "fake_server.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    int fd;
    int index;  /* accept order */
    size_t next; /* next script entry */
    int silent;
    redisReader *reader;
} conn;

static void die(const char *what)
{
    perror(what);
    exit(1);
}

/* Returns how much was sent: less than n if the client went away. */
static size_t send_all(int fd, const char *p, size_t n)
{
    size_t sent = 0;

    while (sent < n) {
        ssize_t w = send(fd, p + sent, n - sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break; /* the client went away: its problem */
        sent += (size_t)w;
    }
    return sent;
}

/* FAKE_BIG_BULK: the whole string unless the client hangs up. */
static void send_big_bulk(fake_server *f, int fd)
{
    static char chunk[64 * 1024];
    char head[32];
    int n = snprintf(head, sizeof(head), "$%d\r\n", FAKE_BIG_BYTES);
    size_t total = 0;

    memset(chunk, 'x', sizeof(chunk));
    if (send_all(fd, head, (size_t)n) != (size_t)n) {
        f->big_cut = 1;
        return;
    }
    while (total < FAKE_BIG_BYTES) {
        size_t want = FAKE_BIG_BYTES - total < sizeof(chunk) ? FAKE_BIG_BYTES - total
                                                             : sizeof(chunk);
        size_t got = send_all(fd, chunk, want);
        total += got;
        if (got < want) {
            f->big_cut = 1;
            break;
        }
    }
    __atomic_store_n(&f->big_sent, total, __ATOMIC_SEQ_CST);
    if (!f->big_cut)
        send_all(fd, "\r\n", 2);
}

static const char *const *script_of(fake_server *f, int index)
{
    size_t i = (size_t)index < f->nscripts ? (size_t)index : f->nscripts - 1;
    return f->scripts[i];
}

static void echo_error(int fd, const redisReply *cmd)
{
    char buf[1024];
    int n;

    if (cmd->type != REDIS_REPLY_ARRAY || cmd->elements == 0) {
        send_all(fd, "-ERR what?\r\n", 12);
        return;
    }
    n = snprintf(buf, sizeof(buf), "-ERR unknown command '%s', with args beginning with:",
                 cmd->element[0]->str);
    for (size_t i = 1; i < cmd->elements && n < (int)sizeof(buf) - 80; i++)
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, " '%.60s'", cmd->element[i]->str);
    n += snprintf(buf + n, sizeof(buf) - (size_t)n, "\r\n");
    send_all(fd, buf, (size_t)n);
}

/* Answer one command; returns 0 to keep the connection, -1 to close it. */
static int answer(fake_server *f, conn *c, const redisReply *cmd)
{
    const char *const *script = script_of(f, c->index);
    const char *reply;

    __atomic_add_fetch(&f->commands, 1, __ATOMIC_SEQ_CST);
    if (c->silent)
        return 0;
    reply = script[c->next];
    if (reply == NULL)
        return -1; /* script over: hang up */
    c->next++;
    if (strcmp(reply, FAKE_CLOSE) == 0)
        return -1;
    if (strcmp(reply, FAKE_SILENT) == 0) {
        c->silent = 1;
        return 0;
    }
    if (strncmp(reply, FAKE_CLOSE_AFTER, strlen(FAKE_CLOSE_AFTER)) == 0) {
        reply += strlen(FAKE_CLOSE_AFTER);
        send_all(c->fd, reply, strlen(reply));
        return -1;
    }
    if (strcmp(reply, FAKE_BIG_BULK) == 0) {
        send_big_bulk(f, c->fd);
        return f->big_cut ? -1 : 0;
    }
    if (strcmp(reply, FAKE_ECHO) == 0) {
        echo_error(c->fd, cmd);
        return 0;
    }
    send_all(c->fd, reply, strlen(reply));
    return 0;
}

static void close_conn(conn *c)
{
    close(c->fd);
    redisReaderFree(c->reader);
    c->fd = -1;
    c->reader = NULL;
}

static void *serve(void *arg)
{
    fake_server *f = arg;
    conn conns[64];
    size_t nconns = 0;

    for (;;) {
        struct pollfd fds[66];
        size_t n = 0;

        fds[n++] = (struct pollfd){f->stop_pipe[0], POLLIN, 0};
        fds[n++] = (struct pollfd){f->listen_fd, POLLIN, 0};
        for (size_t i = 0; i < nconns; i++)
            fds[n++] = (struct pollfd){conns[i].fd, POLLIN, 0};
        if (poll(fds, n, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("fake_server poll");
        }
        if (fds[0].revents)
            break;
        if ((fds[1].revents & POLLIN) && nconns < 64) {
            int fd = accept(f->listen_fd, NULL, NULL);
            if (fd >= 0) {
                conn *c = &conns[nconns++];
                c->fd = fd;
                c->index = f->accepted;
                __atomic_add_fetch(&f->accepted, 1, __ATOMIC_SEQ_CST);
                c->next = 0;
                c->silent = 0;
                c->reader = redisReaderCreate();
                if (f->greet) {
                    const char *g = script_of(f, c->index)[0];
                    if (g != NULL)
                        send_all(fd, g, strlen(g));
                    c->next = 1;
                }
            }
        }
        for (size_t i = 2; i < n; i++) {
            conn *c = &conns[i - 2];
            char buf[4096];
            ssize_t r;

            if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            r = recv(c->fd, buf, sizeof(buf), 0);
            if (r <= 0) {
                close_conn(c);
                continue;
            }
            redisReaderFeed(c->reader, buf, (size_t)r);
            for (;;) {
                void *cmd = NULL;
                if (redisReaderGetReply(c->reader, &cmd) != REDIS_OK) {
                    close_conn(c);
                    break;
                }
                if (cmd == NULL)
                    break;
                if (answer(f, c, cmd) != 0) {
                    freeReplyObject(cmd);
                    close_conn(c);
                    break;
                }
                freeReplyObject(cmd);
            }
        }
        /* Forget closed connections. */
        for (size_t i = 0; i < nconns;) {
            if (conns[i].fd < 0)
                conns[i] = conns[--nconns];
            else
                i++;
        }
    }
    for (size_t i = 0; i < nconns; i++)
        close_conn(&conns[i]);
    return NULL;
}

void fake_start(fake_server *f)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);

    f->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (f->listen_fd < 0 || bind(f->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(f->listen_fd, 16) != 0 ||
        getsockname(f->listen_fd, (struct sockaddr *)&a, &len) != 0)
        die("fake_server listen");
    f->port = ntohs(a.sin_port);
    snprintf(f->url, sizeof(f->url), "redis://127.0.0.1:%d", f->port);
    if (pipe(f->stop_pipe) != 0)
        die("fake_server pipe");
    if (pthread_create(&f->thread, NULL, serve, f) != 0)
        die("fake_server thread");
}

void fake_stop(fake_server *f)
{
    if (write(f->stop_pipe[1], "x", 1) != 1)
        die("fake_server stop");
    pthread_join(f->thread, NULL);
    close(f->listen_fd);
    close(f->stop_pipe[0]);
    close(f->stop_pipe[1]);
}
