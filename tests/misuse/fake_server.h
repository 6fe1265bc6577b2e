/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A fake TCP "Redis" for the misuse tests: it answers each command it
 * receives with the next reply of a script, byte for byte, so a test decides
 * exactly what the client reads (garbage, wrong types, half a reply, an error
 * that echoes the command's arguments, silence).
 *
 * Not a stand-in for Redis in any other test: it exists to be wrong.
 */
#ifndef DLOCK_FAKE_SERVER_H
#define DLOCK_FAKE_SERVER_H

#include <pthread.h>
#include <stddef.h>

/* Script entries with a special meaning; any other string is sent as is. */
#define FAKE_CLOSE "@close"   /* close the connection instead of answering */
#define FAKE_SILENT "@silent" /* never answer this or any later command */
#define FAKE_CLOSE_AFTER "@close-after:" /* send what follows, then close */
#define FAKE_ECHO "@echo"     /* -ERR unknown command '<cmd>', with args beginning with: '<a1>' ... */
/* A bulk string of FAKE_BIG_BYTES, sent in chunks while the client takes
 * them (big_sent counts them; big_cut is set if the client hung up first). */
#define FAKE_BIG_BULK "@big-bulk"
#define FAKE_BIG_BYTES (60 * 1024 * 1024)

#define FAKE_MAX_CONNS 8

typedef struct {
    int listen_fd;
    int port;
    int stop_pipe[2];
    pthread_t thread;
    /* scripts[i] is what connection number i (in accept order) is told; a
     * NULL-terminated list. Connections past the last script get the last. */
    const char *const *scripts[FAKE_MAX_CONNS];
    size_t nscripts;
    /* Filled by the server thread; read after fake_stop. */
    int accepted;
    int commands;
    size_t big_sent;
    int big_cut;
    int greet; /* send scripts[i][0] on accept, before any command */
    char url[64];
} fake_server;

/* Listen on a free loopback port and serve in a thread. */
void fake_start(fake_server *f);
/* Stop the thread and close everything. */
void fake_stop(fake_server *f);

#endif
