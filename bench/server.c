/*
 * dlock-bench: the throwaway redis-server a run starts when it is given no
 * --url, and the signal handling that makes sure it is stopped again.
 *
 * Signals are not handled in a handler: SIGINT, SIGTERM and SIGHUP stay
 * blocked in every thread and one thread takes them with sigwait, so the
 * clean-up (kill, waitpid, removing the directory) runs as ordinary code.
 */
#include "bench.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t server_mutex = PTHREAD_MUTEX_INITIALIZER;
static pid_t server_pid;
static char server_dir[256];
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
 * Starting and stopping the server
 * ---------------------------------------------------------------------- */

/* The full path of name in $PATH, or -1. */
static int find_in_path(char *out, size_t out_size, const char *name)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *colon = strchr(path, ':');
        size_t len = colon ? (size_t)(colon - path) : strlen(path);
        if (len > 0 && (size_t)snprintf(out, out_size, "%.*s/%s", (int)len, path, name) < out_size &&
            access(out, X_OK) == 0)
            return 0;
        path += len;
        if (*path == ':')
            path++;
    }
    return -1;
}

/* A loopback port that was free a moment ago: bind port 0 and ask. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        bench_die("socket: %s", strerror(errno));
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = 0;
    socklen_t len = sizeof sa;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) != 0)
        bench_die("finding a free port: %s", strerror(errno));
    close(fd);
    return ntohs(sa.sin_port);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR) {
    }
}

/* Print the last part of the server's log, to say why it did not start. */
static void show_log(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/redis.log", server_dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    char buf[2048];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    fprintf(stderr, "--- redis-server log (%s) ---\n%s\n---\n", path, buf);
}

/* Fork and exec redis-server on port; 0 once it answers PING, -1 if it died
 * (port taken by someone else in between, most likely). */
static int try_start(const char *exe, int port)
{
    char port_s[16], log_path[300];
    snprintf(port_s, sizeof port_s, "%d", port);
    snprintf(log_path, sizeof log_path, "%s/redis.log", server_dir);
    char *argv[] = {(char *)exe, "--port", port_s, "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "no", "--dir", server_dir, "--daemonize", "no",
                    "--logfile", "", NULL};

    /* Everything the child needs is prepared above: after fork in a
     * threaded process it may only make async-signal-safe calls. */
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        bench_die("fork: %s", strerror(errno));
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        setpgid(0, 0); /* Ctrl-C reaches us, and we stop it in order */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
        }
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0)
            dup2(null, STDIN_FILENO);
        execv(exe, argv);
        _exit(127);
    }

    pthread_mutex_lock(&server_mutex);
    server_pid = pid;
    pthread_mutex_unlock(&server_mutex);

    struct timeval tv = {0, 200000};
    for (int i = 0; i < 250; i++) { /* up to ~5 s */
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            pthread_mutex_lock(&server_mutex);
            server_pid = 0;
            pthread_mutex_unlock(&server_mutex);
            return -1;
        }
        redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "PING");
            int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "PONG") == 0;
            if (r)
                freeReplyObject(r);
            redisFree(c);
            if (ok)
                return 0;
        } else if (c) {
            redisFree(c);
        }
        sleep_ms(20);
    }
    show_log();
    bench_die("redis-server on port %d did not answer within 5 s", port);
}

void bench_server_start(char *url, size_t url_size)
{
    char exe[1024];
    if (find_in_path(exe, sizeof exe, "redis-server") != 0)
        bench_die("redis-server not found in PATH: install it (apt-get install redis-server) "
                  "or give --url");

    const char *tmp = getenv("TMPDIR");
    pthread_mutex_lock(&server_mutex);
    snprintf(server_dir, sizeof server_dir, "%s/dlock-bench.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int made = mkdtemp(server_dir) != NULL;
    if (!made)
        server_dir[0] = 0;
    pthread_mutex_unlock(&server_mutex);
    if (!made)
        bench_die("mkdtemp: %s", strerror(errno));

    for (int attempt = 0; attempt < 3; attempt++) {
        int port = free_port();
        if (try_start(exe, port) == 0) {
            snprintf(url, url_size, "redis://127.0.0.1:%d", port);
            return;
        }
    }
    show_log();
    bench_die("redis-server (%s) exited at start three times", exe);
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                unlinkat(dirfd(d), e->d_name, 0);
        }
        closedir(d);
    }
    rmdir(dir);
}

void bench_server_stop(void)
{
    pthread_mutex_lock(&server_mutex);
    if (server_pid > 0) {
        kill(server_pid, SIGTERM);
        int status;
        int gone = 0;
        for (int i = 0; i < 300 && !gone; i++) { /* up to ~3 s, then SIGKILL */
            if (waitpid(server_pid, &status, WNOHANG) == server_pid)
                gone = 1;
            else
                sleep_ms(10);
        }
        if (!gone) {
            kill(server_pid, SIGKILL);
            waitpid(server_pid, &status, 0);
        }
        server_pid = 0;
    }
    if (server_dir[0]) {
        remove_dir(server_dir);
        server_dir[0] = 0;
    }
    pthread_mutex_unlock(&server_mutex);
}

pid_t bench_server_pid(void)
{
    pthread_mutex_lock(&server_mutex);
    pid_t pid = server_pid;
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
