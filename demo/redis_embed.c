/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The embedded default: a throwaway redis-server with no persistence and no
 * TCP port, on a unix socket in the demo's 0700 temporary folder (or in one
 * of its own). dlock-bench starts its server with it too (redis_embed.h).
 */
#include "demo_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define START_TIMEOUT_US ((int64_t)10 * 1000000)

struct demo_redis {
    pid_t pid;
    char url[160];          /* "unix://" and a socket path (at most 107 bytes) */
    char own_dir[PATH_MAX]; /* the folder start made, removed by stop; "" if none */
};

/* Who the messages are from: the demo (demo_err's prefix) unless dlock-bench
 * said otherwise. */
static const char *program = "dlock demo";

void demo_redis_set_program(const char *name)
{
    program = name;
}

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", program);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* The first executable redis-server in PATH, into buf. */
static int find_redis_server(char *buf, size_t len)
{
    const char *path = getenv("PATH");
    if (path == NULL || path[0] == '\0')
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path != '\0') {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        int w = snprintf(buf, len, "%.*s/redis-server", (int)n, n ? path : ".");
        if (w > 0 && (size_t)w < len && access(buf, X_OK) == 0)
            return 0;
        path += n;
        if (*path == ':')
            path++;
    }
    return -1;
}

/* Whether the server's socket accepts connections yet. */
static int socket_answers(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/* The server's folder must be ours alone: whoever can enter it can reach
 * the socket, and the server asks for no password. */
static int folder_is_private(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) != 0) {
        say("%s: %s", dir, strerror(errno));
        return 0;
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        say("%s is not a folder of this user's with mode 0700: the server's socket would be "
            "open to others", dir);
        return 0;
    }
    return 1;
}

/* The last lines of redis-server's log, to say why it did not start. */
static void show_log_tail(const char *log)
{
    FILE *f = fopen(log, "r");
    if (f == NULL)
        return;
    char tail[4096];
    size_t n = 0;
    if (fseek(f, -(long)(sizeof tail - 1), SEEK_END) != 0)
        rewind(f);
    n = fread(tail, 1, sizeof tail - 1, f);
    fclose(f);
    tail[n] = '\0';
    /* Last three lines. */
    int lines = 0;
    char *p = tail + n;
    while (p > tail) {
        p--;
        if (*p == '\n' && p[1] != '\0' && ++lines == 4) {
            p++;
            break;
        }
    }
    fprintf(stderr, "redis-server said:\n%s", p);
}

/* Start the server in dir; 0 once its socket answers, -1 failed (said). */
static int start_server(demo_redis *r, const char *exe, const char *dir)
{
    char log[PATH_MAX], sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if (snprintf(log, sizeof log, "%s/redis.log", dir) >= (int)sizeof log ||
        snprintf(sock, sizeof sock, "%s/redis.sock", dir) >= (int)sizeof sock) {
        say("temporary folder path too long for a unix socket: %s", dir);
        return -1;
    }
    if (!folder_is_private(dir))
        return -1;
    /* No TCP port: only the socket, in a folder only this user can enter,
     * so no other local user can reach a server that has no password. */
    char *argv[] = {
        (char *)exe, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
        "--save", "", "--appendonly", "no", "--dir", (char *)dir, "--daemonize", "no",
        "--logfile", "", NULL,
    };
    int logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (logfd < 0) {
        say("%s: %s", log, strerror(errno));
        return -1;
    }
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        say("fork: %s", strerror(errno));
        close(logfd);
        return -1;
    }
    if (pid == 0) {
        /* Dies with the demo, and a Ctrl-C on the terminal reaches only the
         * demo, which then stops this server itself. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        setpgid(0, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        /* A caller that takes its signals with sigwait (dlock-bench) has
         * them blocked, and exec would keep them blocked. */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
        dup2(logfd, 1);
        dup2(logfd, 2);
        execv(exe, argv);
        dprintf(2, "exec %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    close(logfd);
    r->pid = pid;

    int64_t deadline = demo_now_us() + START_TIMEOUT_US;
    for (;;) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            r->pid = 0;
            say("redis-server exited before it was ready");
            show_log_tail(log);
            return -1;
        }
        if (socket_answers(sock))
            break;
        if (demo_interrupted() || demo_now_us() > deadline) {
            if (!demo_interrupted()) {
                say("redis-server did not answer on %s within %lld s", sock,
                    (long long)(START_TIMEOUT_US / 1000000));
                show_log_tail(log);
            }
            return -1;
        }
        /* Starting a server: no event to wait on but its socket opening. */
        demo_sleep_us(5000);
    }
    snprintf(r->url, sizeof r->url, "unix://%s", sock);
    return 0;
}

int demo_redis_start(demo_redis **out, const char *dir)
{
    *out = NULL;
    char exe[PATH_MAX];
    if (find_redis_server(exe, sizeof exe) != 0) {
        say("redis-server is not installed (not found in PATH); install it with: "
            "apt-get install redis-server   (or pass --url redis://HOST:PORT)");
        return DEMO_EXIT_UNAVAILABLE;
    }
    demo_redis *r = calloc(1, sizeof *r);
    if (r == NULL) {
        say("out of memory");
        return DEMO_EXIT_SOFTWARE;
    }
    if (dir == NULL) {
        const char *tmp = getenv("TMPDIR");
        if (tmp == NULL || tmp[0] == '\0')
            tmp = "/tmp";
        snprintf(r->own_dir, sizeof r->own_dir, "%s/dlock-redis-XXXXXX", tmp);
        if (mkdtemp(r->own_dir) == NULL) {
            say("cannot create a temporary folder in %s: %s", tmp, strerror(errno));
            r->own_dir[0] = '\0';
            demo_redis_stop(r);
            return DEMO_EXIT_UNAVAILABLE;
        }
        dir = r->own_dir;
    }
    if (start_server(r, exe, dir) == 0) {
        *out = r;
        return DEMO_EXIT_OK;
    }
    int interrupted = demo_interrupted();
    demo_redis_stop(r);
    return interrupted ? DEMO_EXIT_INTERRUPTED : DEMO_EXIT_UNAVAILABLE;
}

const char *demo_redis_url(const demo_redis *redis)
{
    return redis->url;
}

pid_t demo_redis_pid(const demo_redis *redis)
{
    return redis->pid;
}

void demo_redis_stop(demo_redis *redis)
{
    if (redis == NULL)
        return;
    if (redis->pid > 0) {
        int st;
        kill(redis->pid, SIGTERM);
        int64_t deadline = demo_now_us() + 3 * 1000000;
        pid_t w;
        while ((w = waitpid(redis->pid, &st, WNOHANG)) == 0 && demo_now_us() < deadline)
            demo_sleep_us(5000);
        if (w == 0) {
            kill(redis->pid, SIGKILL);
            waitpid(redis->pid, &st, 0);
        }
    }
    demo_rmtree(redis->own_dir);
    free(redis);
}
