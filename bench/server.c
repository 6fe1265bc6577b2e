/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-bench: the throwaway redis-server a run starts when it is given no
 * --url (the demo's launcher, demo/redis_embed.h), the signal handling that
 * makes sure it is stopped again, and the placement on CPUs.
 *
 * Signals are not handled in a handler: SIGINT, SIGTERM and SIGHUP stay
 * blocked in every thread and one thread takes them with sigwait, so the
 * clean-up (kill, waitpid, removing the directory) runs as ordinary code.
 */
#include "bench.h"

#include "redis_embed.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t server_mutex = PTHREAD_MUTEX_INITIALIZER;
static demo_redis *server; /* under server_mutex */
static sigset_t stop_signals;
atomic_int bench_interrupted;

/* ------------------------------------------------------------------------
 * Signals
 * ---------------------------------------------------------------------- */

static void *signal_thread(void *arg)
{
    (void)arg;
    int sig = 0;
    if (sigwait(&stop_signals, &sig) != 0)
        return NULL;
    /* The measuring threads will now fail on the dying server; they must
     * stay quiet and leave the exit to us. */
    atomic_store(&bench_interrupted, 1);
    static const char msg[] = "\ndlock-bench: interrupted, stopping the server\n";
    if (write(STDERR_FILENO, msg, sizeof msg - 1) < 0) {
        /* nothing to do about it */
    }
    bench_server_stop();
    _exit(128 + sig);
}

void bench_signals_init(void)
{
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    /* A server that dies under us must give an error, not kill us. */
    signal(SIGPIPE, SIG_IGN);

    pthread_t t;
    if (pthread_create(&t, NULL, signal_thread, NULL) != 0)
        bench_die("cannot start the signal thread");
    pthread_detach(t);
}

/* ------------------------------------------------------------------------
 * The server
 * ---------------------------------------------------------------------- */

void bench_server_start(char *url, size_t url_size)
{
    /* Held during the start, so that a signal meanwhile waits for the
     * server to be up and then stops it and removes its directory. */
    pthread_mutex_lock(&server_mutex);
    demo_redis_set_program("dlock-bench");
    int rc = demo_redis_start(&server, NULL);
    if (rc == 0)
        snprintf(url, url_size, "%s", demo_redis_url(server));
    pthread_mutex_unlock(&server_mutex);
    if (rc != 0)
        bench_die("cannot start a throwaway redis-server");
}

void bench_server_stop(void)
{
    pthread_mutex_lock(&server_mutex);
    demo_redis_stop(server);
    server = NULL;
    pthread_mutex_unlock(&server_mutex);
}

pid_t bench_server_pid(void)
{
    pthread_mutex_lock(&server_mutex);
    pid_t pid = server ? demo_redis_pid(server) : 0;
    pthread_mutex_unlock(&server_mutex);
    return pid;
}

/* ------------------------------------------------------------------------
 * Placement on CPUs
 * ---------------------------------------------------------------------- */

static cpu_set_t startup_mask;
static int startup_mask_taken;

static void take_startup_mask(void)
{
    if (!startup_mask_taken) {
        if (sched_getaffinity(0, sizeof startup_mask, &startup_mask) != 0)
            bench_die("sched_getaffinity: %s", strerror(errno));
        startup_mask_taken = 1;
    }
}

int bench_cpus(int *first, int *second)
{
    take_startup_mask();
    int n = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &startup_mask))
            continue;
        if (n == 0)
            *first = cpu;
        else if (n == 1)
            *second = cpu;
        n++;
    }
    return n;
}

void bench_pin(pid_t pid, int cpu)
{
    take_startup_mask();
    cpu_set_t set;
    if (cpu < 0) {
        set = startup_mask;
    } else {
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
    }
    /* Every thread: ours include the library's watchdog and subscriber. */
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", pid ? (int)pid : (int)getpid());
    DIR *d = opendir(dir);
    if (!d)
        bench_die("%s: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        pid_t tid = (pid_t)atoi(e->d_name);
        if (sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH)
            bench_die("sched_setaffinity(%d, cpu %d): %s", (int)tid, cpu, strerror(errno));
    }
    closedir(d);
}

const char *bench_server_version(redisContext *c)
{
    static char version[32];
    version[0] = 0;
    redisReply *r = redisCommand(c, "INFO server");
    if (r && r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, "redis_version:");
        if (p) {
            p += strlen("redis_version:");
            size_t n = strcspn(p, "\r\n");
            if (n >= sizeof version)
                n = sizeof version - 1;
            memcpy(version, p, n);
            version[n] = 0;
        }
    }
    if (r)
        freeReplyObject(r);
    return version;
}

void bench_stop_children(pid_t *pids, int *n, char *dir)
{
    for (int i = 0; i < *n; i++) {
        kill(pids[i], SIGTERM);
        waitpid(pids[i], NULL, 0);
    }
    *n = 0;
    if (dir[0]) {
        char cmd[320];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "dlock-bench: could not remove %s\n", dir);
        dir[0] = 0;
    }
}

void bench_spawn(pid_t *pids, int *n, char *const argv[])
{
    pid_t pid = fork();
    if (pid < 0)
        bench_die("fork: %s", strerror(errno));
    if (pid == 0) {
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_UNBLOCK, &all, NULL);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp(argv[0], argv);
        _exit(127);
    }
    pids[(*n)++] = pid;
}

void bench_cycle(dlock_client *c, const char *name, bench_series *s)
{
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_lock *l = NULL;
    o.wait_ms = 0;
    o.lease_ms = 10000;
    o.auto_renew = 0;
    int64_t t0 = bench_now_ns();
    int rc = dlock_acquire(&l, c, name, &o);
    if (rc != DLOCK_OK)
        bench_die("dlock_acquire: %s (%s)", dlock_strerror(rc), dlock_error_message());
    rc = dlock_release(l);
    if (rc != DLOCK_OK)
        bench_die("dlock_release: %s (%s)", dlock_strerror(rc), dlock_error_message());
    if (s)
        bench_series_add(s, bench_now_ns() - t0);
}

void bench_timed_ping(redisContext *raw, bench_series *s)
{
    int64_t t0 = bench_now_ns();
    redisReply *r = redisCommand(raw, "PING");
    if (r == NULL)
        bench_die("PING: %s", raw->errstr);
    freeReplyObject(r);
    bench_series_add(s, bench_now_ns() - t0);
}

void bench_random_password(char out[33])
{
    unsigned char b[16];

    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        bench_die("getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof b; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

void bench_write_conf(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    size_t len = strlen(text);

    if (fd < 0 || write(fd, text, len) != (ssize_t)len || close(fd) != 0)
        bench_die("%s: %s", path, strerror(errno));
}

redisContext *bench_connect_auth(const char *host, int port, const char *password)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);
    redisReply *r = NULL;
    int ok = c != NULL && !c->err && redisSetTimeout(c, tv) == REDIS_OK;

    if (ok && password[0]) {
        r = redisCommand(c, "AUTH %s", password);
        ok = r != NULL && r->type == REDIS_REPLY_STATUS;
        if (r)
            freeReplyObject(r);
    }
    if (!ok) {
        redisFree(c);
        return NULL;
    }
    return c;
}

void bench_require_auth(const char *host, int port, const char *what)
{
    redisContext *c = bench_connect_auth(host, port, "");
    redisReply *r = c ? redisCommand(c, "PING") : NULL;
    int refused = r != NULL && r->type == REDIS_REPLY_ERROR && strncmp(r->str, "NOAUTH", 6) == 0;

    if (r)
        freeReplyObject(r);
    redisFree(c);
    if (!refused)
        bench_die("%s %s:%d answers a client without its password", what, host, port);
}

void bench_url_password(const char *url, char *out, size_t size)
{
    const char *p = strstr(url, "://"), *at, *colon;

    out[0] = '\0';
    if (p == NULL)
        return;
    p += 3;
    at = p + strcspn(p, "@/?");
    if (*at != '@')
        return;
    if ((colon = memchr(p, ':', (size_t)(at - p))) != NULL)
        snprintf(out, size, "%.*s", (int)(at - colon - 1), colon + 1);
}
