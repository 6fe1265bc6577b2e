/* SPDX-License-Identifier: BSD-3-Clause */
/* The harness's TCP fault proxy (chaos_proxy.c). */
#ifndef DLOCK_CHAOS_PROXY_H
#define DLOCK_CHAOS_PROXY_H

enum { CHAOS_PROXY_PASS = 0, CHAOS_PROXY_DELAY, CHAOS_PROXY_BLACKHOLE, CHAOS_PROXY_DELAY_ONE_REPLY };

typedef struct chaos_proxy chaos_proxy;

/* Listen on a free loopback port, forwarding to 127.0.0.1:upstream_port. */
int chaos_proxy_start(chaos_proxy **out, int upstream_port);
int chaos_proxy_port(const chaos_proxy *p);
/* Connections accepted so far. */
int chaos_proxy_accepted(chaos_proxy *p);
/* Act as an HTTP CONNECT proxy from now on: each connection's first request
 * must be a CONNECT, answered 200, and then relayed to upstream_port as
 * before (whatever host it names); anything else gets 405 and is closed.
 * How many CONNECTs were answered. */
void chaos_proxy_connect_mode(chaos_proxy *p);
int chaos_proxy_connects(chaos_proxy *p);
/* Switch mode (CHAOS_PROXY_*); delay_ms is used by CHAOS_PROXY_DELAY and by
 * CHAOS_PROXY_DELAY_ONE_REPLY, which delays the next chunk the server sends
 * on any connection and then turns to CHAOS_PROXY_PASS by itself. */
void chaos_proxy_set(chaos_proxy *p, int mode, int delay_ms);
/* Close every open connection now; returns how many. */
int chaos_proxy_drop(chaos_proxy *p);
/* Close everything and wait for the threads. NULL is a no-op. */
void chaos_proxy_stop(chaos_proxy *p);

#endif
