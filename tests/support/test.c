#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"

int test_run(const test_case *cases, size_t n, int argc, char **argv)
{
    /* SIGPIPE keeps its default action: the library must never raise it. */
    if (argc != 2) {
        fprintf(stderr, "usage: %s TEST\ntests:", argv[0]);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %s", cases[i].name);
        fprintf(stderr, "\n");
        return 2;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(cases[i].name, argv[1]) == 0) {
            cases[i].fn();
            printf("ok %s\n", cases[i].name);
            return 0;
        }
    }
    fprintf(stderr, "no test called %s\n", argv[1]);
    return 2;
}

void test_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0), port;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("free_port");
        exit(1);
    }
    port = ntohs(a.sin_port);
    close(fd);
    return port;
}

static redisContext *connect_raw(test_redis *r)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);

    if (c != NULL && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

static void spawn(test_redis *r)
{
    char port[16], *args[32];
    int n = 0;
    char extra[256];

    snprintf(port, sizeof(port), "%d", r->port);
    args[n++] = "redis-server";
    args[n++] = "--port";
    args[n++] = port;
    args[n++] = "--bind";
    args[n++] = "127.0.0.1";
    args[n++] = "--dir";
    args[n++] = r->dir;
    args[n++] = "--save";
    args[n++] = "";
    args[n++] = "--appendonly";
    args[n++] = "no";
    args[n++] = "--loglevel";
    args[n++] = "warning";
    snprintf(extra, sizeof(extra), "%s", r->extra);
    for (char *tok = strtok(extra, " "); tok != NULL && n < 30; tok = strtok(NULL, " "))
        args[n++] = tok;
    args[n] = NULL;

    r->pid = fork();
    if (r->pid == 0) {
        /* A test that fails exits at once: take the server with it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int devnull = open("/dev/null", 1);
        if (devnull >= 0)
            dup2(devnull, 1);
        execvp("redis-server", args);
        fprintf(stderr, "cannot run redis-server: %s (install it: apt-get install "
                "redis-server)\n", strerror(errno));
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        redisContext *c;
        int status;
        if (waitpid(r->pid, &status, WNOHANG) == r->pid) {
            fprintf(stderr, "redis-server exited at start (status %d)\n", status);
            exit(1);
        }
        if ((c = connect_raw(r)) != NULL) {
            redisReply *rep = redisCommand(c, "PING");
            int ok = rep != NULL && rep->type == REDIS_REPLY_STATUS;
            if (rep)
                freeReplyObject(rep);
            redisFree(c);
            if (ok || strstr(r->extra, "requirepass") != NULL)
                return;
        }
        test_sleep_ms(10);
    }
    fprintf(stderr, "redis-server did not start on port %d\n", r->port);
    exit(1);
}

/* Servers of this process, removed at exit even when a check failed. */
static test_redis *started[8];
static pid_t owner;

static void cleanup_servers(void)
{
    if (getpid() != owner) /* a forked test child exiting */
        return;
    for (int i = 0; i < 8; i++)
        if (started[i] != NULL && started[i]->pid > 0)
            test_redis_stop(started[i]);
}

void test_redis_start(test_redis *r, const char *extra_args)
{
    if (owner == 0) {
        owner = getpid();
        atexit(cleanup_servers);
    }
    for (int i = 0; i < 8; i++)
        if (started[i] == NULL || started[i] == r) {
            started[i] = r;
            break;
        }
    memset(r, 0, sizeof(*r));
    snprintf(r->dir, sizeof(r->dir), "/tmp/dlock-test-XXXXXX");
    if (mkdtemp(r->dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    snprintf(r->extra, sizeof(r->extra), "%s", extra_args ? extra_args : "");
    r->port = free_port();
    snprintf(r->url, sizeof(r->url), "redis://127.0.0.1:%d", r->port);
    spawn(r);
}

void test_redis_restart(test_redis *r)
{
    spawn(r);
}

void test_redis_kill(test_redis *r)
{
    if (r->pid > 0) {
        kill(r->pid, SIGKILL);
        waitpid(r->pid, NULL, 0);
        r->pid = 0;
    }
}

void test_redis_stop(test_redis *r)
{
    char cmd[128];

    for (int i = 0; i < 8; i++)
        if (started[i] == r)
            started[i] = NULL;
    test_redis_kill(r);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", r->dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", r->dir);
}

long long test_redis_cmd(test_redis *r, const char *fmt, ...)
{
    redisContext *c = connect_raw(r);
    redisReply *rep;
    long long v = -1;
    va_list ap;

    if (c == NULL) {
        fprintf(stderr, "test_redis_cmd: cannot connect to port %d\n", r->port);
        exit(1);
    }
    va_start(ap, fmt);
    rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (rep != NULL) {
        if (rep->type == REDIS_REPLY_INTEGER)
            v = rep->integer;
        else if (rep->type == REDIS_REPLY_STRING || rep->type == REDIS_REPLY_STATUS)
            v = (long long)rep->len;
        else if (rep->type == REDIS_REPLY_ARRAY)
            v = (long long)rep->elements;
        freeReplyObject(rep);
    }
    redisFree(c);
    return v;
}

long long test_redis_calls(test_redis *r, const char *command)
{
    redisContext *c = connect_raw(r);
    redisReply *rep;
    long long v = 0;
    char needle[64];

    if (c == NULL) {
        fprintf(stderr, "test_redis_calls: cannot connect\n");
        exit(1);
    }
    rep = redisCommand(c, "INFO commandstats");
    snprintf(needle, sizeof(needle), "cmdstat_%s:calls=", command);
    if (rep != NULL && rep->type == REDIS_REPLY_STRING) {
        const char *p = strstr(rep->str, needle);
        if (p != NULL)
            v = atoll(p + strlen(needle));
    }
    if (rep)
        freeReplyObject(rep);
    redisFree(c);
    return v;
}
