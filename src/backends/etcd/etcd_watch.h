/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One etcd watch: over gRPC, a watch_id on the client's one Watch stream,
 * kept by a thread of its own (the hub); with the JSON gateway, a streaming
 * POST to /v3/watch on its own curl handle, driven by the waiting thread
 * itself (curl multi). It reports the deletion of one key (a waiter's), or
 * any change under a prefix (an election's observer).
 *
 * The watch starts at a revision, so a deletion that happened after that
 * revision but before the stream was open is still reported: the waiter
 * needs no confirmation round trip before it sleeps, and no release is
 * missed. A stream on another endpoint can take over from the same revision.
 */
#ifndef DLOCK_ETCD_WATCH_H
#define DLOCK_ETCD_WATCH_H

#include <stdint.h>

#include "backends/etcd/etcd_http.h"

typedef struct dlock__etcd_stream dlock__etcd_stream;

/* What a stream has seen so far. */
enum {
    DLOCK__ETCD_STREAM_RUNNING = 0,
    DLOCK__ETCD_STREAM_DELETED, /* the key was deleted (or, for a range: something
                                 * changed) at or after the start revision */
    DLOCK__ETCD_STREAM_CANCELED, /* etcd canceled the watch (compacted revision ...) */
    DLOCK__ETCD_STREAM_FAILED    /* the stream broke or was refused */
};

/* Start watching, from revision start_rev on the endpoint in use, for the
 * deletion of key (range_end NULL), or for any change of the keys from key to
 * range_end. No waiting: the connection is made while the caller waits in
 * dlock__etcd_stream_wait. wake_fd (or -1): the eventfd the caller passes
 * to dlock__etcd_stream_wait, which a watch of the client's gRPC stream
 * then also uses to tell a change of its state (borrowed, not closed),
 * instead of an eventfd of its own: one descriptor per waiter, not two.
 *
 * notify (NULL: none; gRPC only, as only the hub reads a stream without its
 * caller): called with arg by the hub's thread, with the hub's mutex held,
 * each time the state changes, until dlock__etcd_stream_close returns. It
 * must return at once and never call the stream. With notify and no
 * wake_fd the stream needs no descriptor at all: nobody waits on it. */
int dlock__etcd_stream_open(dlock__etcd_stream **out, dlock__etcd *e, const char *key,
                            const char *range_end, int64_t start_rev, int wake_fd,
                            void (*notify)(void *), void *arg);

/* Drive the stream for up to timeout_ms, or until its state is no longer
 * RUNNING, or until wake_fd (-1: none) is readable. Returns the state. */
int dlock__etcd_stream_wait(dlock__etcd_stream *s, int64_t timeout_ms, int wake_fd);

/* After a DELETED report: back to RUNNING, to report the next change. */
void dlock__etcd_stream_rearm(dlock__etcd_stream *s);

/* The revision to watch from to see nothing twice after a reconnect: one
 * past the last revision the stream reported, or its start revision. */
int64_t dlock__etcd_stream_next_rev(const dlock__etcd_stream *s);

/* The endpoint the stream is on (for messages). */
size_t dlock__etcd_stream_endpoint(const dlock__etcd_stream *s);

/* NULL is a no-op. */
void dlock__etcd_stream_close(dlock__etcd_stream *s);

/* Over gRPC every stream of a client is a watch on one Watch stream, kept
 * by a thread of this hub (etcd_watch_hub.c); the client's dlock__etcd holds
 * it (dlock__etcd_watch_hub). */
typedef struct dlock__etcd_hub dlock__etcd_hub;
int dlock__etcd_hub_new(dlock__etcd *e, dlock__etcd_hub **out);
/* Stops its thread; no stream of it may be open. NULL is a no-op. */
void dlock__etcd_hub_free(dlock__etcd_hub *h);
/* e's hub, made at the first call (etcd_http.c). */
int dlock__etcd_watch_hub(dlock__etcd *e, dlock__etcd_hub **out);

#endif
