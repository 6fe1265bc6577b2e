/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A throwaway redis-server: the demo's embedded default, also used by
 * dlock-bench. Found in PATH, started without persistence and without a TCP
 * port (--port 0), on a unix socket DIR/redis.sock (--unixsocketperm 700) in
 * a folder of mode 0700: it asks for no password, so only its user may
 * reach it. Stopped with SIGTERM (SIGKILL after 3 s).
 *
 * The server dies with its parent (PR_SET_PDEATHSIG, from the thread that
 * called demo_redis_start) and is in its own process group, so a Ctrl-C on
 * the terminal reaches only the caller, which stops the server itself.
 * Not thread-safe: a caller that stops it from another thread serialises.
 */
#ifndef DLOCK_DEMO_REDIS_EMBED_H
#define DLOCK_DEMO_REDIS_EMBED_H

#include <sys/types.h>

typedef struct demo_redis demo_redis;

/*
 * Start redis-server with dir as its working folder (its log is
 * dir/redis.log, its socket dir/redis.sock), or, when dir is NULL, in a
 * fresh mkdtemp folder under $TMPDIR that demo_redis_stop removes. dir must
 * be the caller's own with mode 0700 (mkdtemp makes it so), and short enough
 * for a socket path. Returns DEMO_EXIT_OK (0) and *out once the socket
 * accepts connections; else DEMO_EXIT_UNAVAILABLE (69),
 * DEMO_EXIT_INTERRUPTED (130) or DEMO_EXIT_SOFTWARE (70), with the reason
 * (and the tail of the server's log) already on stderr.
 */
int demo_redis_start(demo_redis **out, const char *dir);
/* "unix:///DIR/redis.sock", borrowed for the server's lifetime. */
const char *demo_redis_url(const demo_redis *redis);
/* The server's process id. */
pid_t demo_redis_pid(const demo_redis *redis);
/* Stop the server, remove the folder if start made it, free. NULL is a no-op. */
void demo_redis_stop(demo_redis *redis);

/*
 * The program the launcher's messages on stderr are from ("dlock-bench"
 * gives "dlock-bench: ..."); the default is the demo's "dlock demo: ...".
 * Call before demo_redis_start.
 */
void demo_redis_set_program(const char *name);

#endif /* DLOCK_DEMO_REDIS_EMBED_H */
