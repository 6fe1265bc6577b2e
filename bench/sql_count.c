/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What a SQL cycle sends: send() and connect() of this process counted on
 * their way to libc. libpq and MariaDB Connector/C write each request with
 * one send() (a statement, or a batch of them sent together), so the sends
 * of a cycle are its requests, and with nothing pipelined its round trips;
 * a connect() is a new session. Defined in the program, these take the
 * place of libc's for every library it loads (the symbols are looked up in
 * the program first); they only count.
 */
#include "bench.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <sys/socket.h>

static atomic_long sends, connects;

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
    static ssize_t (*real)(int, const void *, size_t, int);

    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "send");
    atomic_fetch_add(&sends, 1);
    return real(fd, buf, len, flags);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    static int (*real)(int, const struct sockaddr *, socklen_t);

    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "connect");
    atomic_fetch_add(&connects, 1);
    return real(fd, addr, len);
}

void bench_sql_count(long *out_sends, long *out_connects)
{
    *out_sends = atomic_load(&sends);
    *out_connects = atomic_load(&connects);
}
