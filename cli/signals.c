/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock run and elect: the self-pipe that wakes the supervising loop, what
 * writes to it (the signal handlers, the lock's on_lost callback), the
 * signal dispositions saved, installed and restored, and the interrupter
 * thread that makes a waiting dlock leave the queue on SIGINT, SIGTERM or
 * SIGHUP and then die of the signal. See run.c for how the parts fit.
 */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* ========================================================================
 * Wake-ups: the self-pipe and what writes to it
 * ====================================================================== */

/* The self-pipe's write end. Set before the lock and the handlers exist;
 * reset to -1 only after the client (and so the watchdog thread) is gone,
 * when a late signal can only interrupt the main thread itself. */
static volatile sig_atomic_t wake_fd = -1;

int cli_wake_pipe_open(int wake_pipe[2])
{
    if (pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        cli_error("pipe: %s", strerror(errno));
        return CLI_EXIT_SOFTWARE;
    }
    wake_fd = wake_pipe[1];
    return 0;
}

void cli_wake_pipe_close(int wake_pipe[2])
{
    if (wake_pipe[0] >= 0) {
        wake_fd = -1;
        close(wake_pipe[0]);
        close(wake_pipe[1]);
    }
}

/* Called from signal handlers and from the watchdog thread. */
static void wake(unsigned char byte)
{
    int saved = errno;
    /* Non-blocking, so a writer never waits. The loop drains the pipe on
     * every wake-up, so it cannot fill with the few bytes written to it. */
    while (write(wake_fd, &byte, 1) < 0 && errno == EINTR)
        ;
    errno = saved;
}

static void on_signal(int sig, siginfo_t *info, void *context)
{
    (void)context;
    /* ^C or a hangup from the terminal (si_code SI_KERNEL) already went to
     * the whole foreground process group, COMMAND included: forwarding it
     * would deliver it twice (a second ^C often means "abort cleanup").
     * It is only noted (elect stops campaigning). */
    if (sig != SIGCHLD && info && info->si_code == SI_KERNEL) {
        wake((unsigned char)(CLI_WAKE_NOTED + sig));
        return;
    }
    wake((unsigned char)sig);
}

void cli_on_lost(dlock_lock *lock, int reason, void *payload)
{
    (void)lock;
    (void)payload;
    wake((unsigned char)(CLI_WAKE_LOST - reason));
}

/* The signals dlock handles, and the ones COMMAND must get back as dlock
 * found them (SIGPIPE: cli_ignore_sigpipe). */
static const int forwarded_signals[] = {SIGINT, SIGTERM, SIGHUP};
static const int restored_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE};
#define NRESTORED (sizeof restored_signals / sizeof restored_signals[0])

static struct sigaction initial_actions[NRESTORED];

void cli_save_signal_actions(void)
{
    for (size_t k = 0; k < NRESTORED; k++)
        sigaction(restored_signals[k], NULL, &initial_actions[k]);
}

/* Put the dispositions back as dlock found them: elect, between terms, is
 * ended by a signal like run while it waits. */
void cli_restore_signal_actions(void)
{
    for (size_t k = 0; k < NRESTORED; k++)
        sigaction(restored_signals[k], &initial_actions[k], NULL);
}

int cli_install_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    for (size_t k = 0; k < sizeof forwarded_signals / sizeof forwarded_signals[0]; k++) {
        struct sigaction old;
        if (sigaction(forwarded_signals[k], NULL, &old) != 0)
            return -1;
        /* Ignored when dlock started (nohup, a background job of a script):
         * keep it ignored; COMMAND inherits that, as it would without dlock. */
        if (old.sa_handler == SIG_IGN)
            continue;
        if (sigaction(forwarded_signals[k], &sa, NULL) != 0)
            return -1;
    }
    sa.sa_flags |= SA_NOCLDSTOP;
    return sigaction(SIGCHLD, &sa, NULL);
}

/* ========================================================================
 * Waiting for the lock, interruptibly
 * ====================================================================== */

static sigset_t stop_signals(void)
{
    sigset_t set;
    sigemptyset(&set);
    for (size_t k = 0; k < sizeof forwarded_signals / sizeof forwarded_signals[0]; k++)
        sigaddset(&set, forwarded_signals[k]);
    return set;
}

static void *interrupter_main(void *arg)
{
    cli_interrupter *it = arg;
    sigset_t set = stop_signals();
    struct pollfd pfd = {.fd = it->wake_read, .events = POLLIN};

    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    for (;;) {
        unsigned char byte;
        ssize_t n = read(it->wake_read, &byte, 1);
        if (n < 0 && errno == EAGAIN) {
            poll(&pfd, 1, -1);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || byte == CLI_WAKE_QUIT)
            return NULL;
        int sig = byte >= CLI_WAKE_NOTED && byte < CLI_WAKE_LOST ? byte - CLI_WAKE_NOTED : byte;
        if (sig != SIGCHLD && byte < CLI_WAKE_LOST && it->signal == 0) {
            it->signal = sig;
            dlock_client_interrupt(it->client);
        }
    }
}

int cli_interrupter_start(cli_interrupter *it, dlock_client *client, int wake_read)
{
    sigset_t set = stop_signals();

    it->client = client;
    it->wake_read = wake_read;
    it->signal = 0;
    pthread_sigmask(SIG_BLOCK, &set, &it->saved_mask);
    int e = pthread_create(&it->thread, NULL, interrupter_main, it);
    if (e != 0) {
        pthread_sigmask(SIG_SETMASK, &it->saved_mask, NULL);
        cli_error("cannot start a thread: %s", strerror(e));
        return CLI_EXIT_SOFTWARE;
    }
    return 0;
}

/* Returns the stop signal that came while waiting, 0 if none. */
int cli_interrupter_stop(cli_interrupter *it)
{
    wake(CLI_WAKE_QUIT);
    pthread_join(it->thread, NULL);
    pthread_sigmask(SIG_SETMASK, &it->saved_mask, NULL);
    return it->signal;
}

/* End dlock by sig, as the signal's default action would have: a waiter
 * stopped by ^C dies of SIGINT, and the shell that ran it sees that. */
int cli_die_of(int sig)
{
    struct sigaction sa;
    sigset_t set;

    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, NULL);
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    raise(sig);
    return 128 + sig; /* not reached: the default action of the three ends dlock */
}

