/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Throwaway ZooKeeper servers for the tests: a standalone server or an
 * ensemble of up to TEST_ZK_MAX members on loopback ports, each a JVM
 * running ZooKeeperServerMain from Debian's zookeeper package in its own
 * temp dir (zoo.cfg, myid, data), killed at exit. A member of an ensemble
 * runs QuorumPeerMain: ZooKeeperServerMain ignores the server.N lines and
 * serves alone. A JVM takes a second or
 * two to start: start one per test program where you can.
 *
 * The classpath is the jars the server needs, not every jar of /usr/share/java (which
 * holds hundreds of jars, and slows the start down tenfold on a loaded
 * machine).
 */
#include "test.h"

#ifndef DLOCK_TEST_ZK
/* Built without the ZooKeeper module (-DDLOCK_WITH_ZK=OFF). */
void test_zk_start(test_zk *z, int members, const char *extra_cfg)
{
    (void)z, (void)members, (void)extra_cfg;
    fprintf(stderr, "this build has no ZooKeeper backend (DLOCK_WITH_ZK=OFF)\n");
    exit(2);
}
void test_zk_stop(test_zk *z)
{
    (void)z;
}
long long test_zk_children(test_zk *z, const char *path)
{
    (void)z, (void)path;
    return 0;
}
long long test_zk_mntr(test_zk *z, int member, const char *key)
{
    (void)z, (void)member, (void)key;
    return -1;
}
#else
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define THREADED 1 /* the synchronous calls of the mt library */
#include <zookeeper/zookeeper.h>

#define JAVA_DIR "/usr/share/java/"

static const char *const jars[] = {
    "zookeeper.jar", "zookeeper-jute.jar", "slf4j-api.jar", "slf4j-simple.jar",
    "netty-handler.jar", "netty-common.jar", "netty-buffer.jar", "netty-transport.jar",
    "netty-resolver.jar", "netty-codec.jar", "netty-transport-native-epoll.jar",
    "netty-transport-native-unix-common.jar", "commons-io.jar", "metrics-core.jar",
    "snappy-java.jar", "commons-cli.jar", "log4j-1.2.jar",
};

static test_zk *zk_started[4];
static pid_t zk_owner;

static void zk_cleanup(void)
{
    if (getpid() != zk_owner)
        return;
    for (int i = 0; i < 4; i++)
        if (zk_started[i] != NULL)
            test_zk_stop(zk_started[i]);
}

static void zk_spawn(test_zk *z, int i)
{
    char cp[2048], cfg[160], log[160];
    size_t len;
    pid_t pid;

    len = (size_t)snprintf(cp, sizeof(cp), "%s/m%d", z->dir, i);
    for (size_t j = 0; j < sizeof(jars) / sizeof(jars[0]); j++)
        len += (size_t)snprintf(cp + len, sizeof(cp) - len, ":" JAVA_DIR "%s", jars[j]);
    snprintf(cfg, sizeof(cfg), "%s/m%d/zoo.cfg", z->dir, i);
    snprintf(log, sizeof(log), "%s/m%d.log", z->dir, i);
    pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
        setpgid(0, 0); /* a ^C of the test does not reach it first */
        execlp("java", "java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp", cp,
               z->n > 1 ? "org.apache.zookeeper.server.quorum.QuorumPeerMain"
                        : "org.apache.zookeeper.server.ZooKeeperServerMain",
               cfg, (char *)NULL);
        fprintf(stderr, "cannot run java: %s (apt-get install default-jdk-headless "
                "zookeeper)\n", strerror(errno));
        _exit(127);
    }
    z->pid[i] = pid;
}

char *test_zk_4lw(test_zk *z, int i, const char *cmd)
{
    struct sockaddr_in a;
    struct timeval tv = {3, 0};
    size_t len = 0, cap = 4096;
    char *out = malloc(cap);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ssize_t n;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)z->client_port[i]);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (out == NULL || fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        write(fd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd)) {
        if (fd >= 0)
            close(fd);
        free(out);
        return NULL;
    }
    while ((n = read(fd, out + len, cap - len - 1)) > 0) {
        len += (size_t)n;
        if (len + 1 >= cap) {
            char *bigger = realloc(out, cap * 2);
            if (bigger == NULL)
                break;
            out = bigger;
            cap *= 2;
        }
    }
    close(fd);
    out[len] = '\0';
    return out;
}

/* 1 when member i serves clients (standalone, leader or follower), and it
 * is ours: another test's server that took the port first (ours then exits
 * at start) would answer srvr too; only ours has its data in z->dir. */
static int zk_serving(test_zk *z, int i)
{
    char *r = test_zk_4lw(z, i, "srvr");
    int ok = r != NULL && strstr(r, "Mode: ") != NULL;
    free(r);
    if (!ok)
        return 0;
    r = test_zk_4lw(z, i, "conf");
    ok = r != NULL && strstr(r, z->dir) != NULL;
    free(r);
    return ok;
}

static void zk_show_log(test_zk *z, int i)
{
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "tail -n 30 %s/m%d.log >&2", z->dir, i);
    if (system(cmd) != 0)
        fprintf(stderr, "(no log)\n");
}

static int zk_wait_serving(test_zk *z, int i)
{
    for (int t = 0; t < 1200; t++) { /* 60 s: a JVM on a loaded machine */
        int status;
        if (zk_serving(z, i))
            return 1;
        if (waitpid(z->pid[i], &status, WNOHANG) == z->pid[i]) {
            fprintf(stderr, "zookeeper member %d exited at start (status %d); its log:\n", i,
                    status);
            z->pid[i] = 0;
            zk_show_log(z, i);
            return 0;
        }
        test_sleep_ms(50);
    }
    fprintf(stderr, "zookeeper member %d does not serve on port %d; its log:\n", i,
            z->client_port[i]);
    zk_show_log(z, i);
    return 0;
}

static void zk_write_config(test_zk *z, int i)
{
    char path[160];
    FILE *f;

    snprintf(path, sizeof(path), "%s/m%d/data", z->dir, i);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/m%d/data/myid", z->dir, i);
    if ((f = fopen(path, "w")) == NULL) {
        perror(path);
        exit(1);
    }
    fprintf(f, "%d\n", i + 1);
    fclose(f);
    snprintf(path, sizeof(path), "%s/m%d/zoo.cfg", z->dir, i);
    if ((f = fopen(path, "w")) == NULL) {
        perror(path);
        exit(1);
    }
    /* Short ticks, so that sessions can be short (2 ticks at least) and an
     * ensemble elects quickly; sessions up to an hour for long leases; no
     * fsync (the tests do not crash the machine); no admin server (it would
     * take port 8080). */
    fprintf(f,
            "tickTime=250\ninitLimit=40\nsyncLimit=20\n"
            "dataDir=%s/m%d/data\nclientPort=%d\nclientPortAddress=127.0.0.1\n"
            "minSessionTimeout=500\nmaxSessionTimeout=3600000\n"
            "admin.enableServer=false\n4lw.commands.whitelist=*\nforceSync=no\n"
            "maxClientCnxns=0\n%s",
            z->dir, i, z->client_port[i], z->extra);
    if (z->n > 1)
        for (int j = 0; j < z->n; j++)
            fprintf(f, "server.%d=127.0.0.1:%d:%d\n", j + 1, z->peer_port[j], z->elect_port[j]);
    fclose(f);
}

void test_zk_start(test_zk *z, int members, const char *extra_cfg)
{
    size_t used;

    if (zk_owner == 0) {
        zk_owner = getpid();
        atexit(zk_cleanup);
    }
    for (int i = 0; i < 4; i++)
        if (zk_started[i] == NULL || zk_started[i] == z) {
            zk_started[i] = z;
            break;
        }
    memset(z, 0, sizeof(*z));
    if (members < 1 || members > TEST_ZK_MAX) {
        fprintf(stderr, "test_zk_start: %d members (1..%d)\n", members, TEST_ZK_MAX);
        exit(2);
    }
    z->n = members;
    snprintf(z->extra, sizeof(z->extra), "%s", extra_cfg != NULL ? extra_cfg : "");
    snprintf(z->dir, sizeof(z->dir), "/tmp/dlock-zk-XXXXXX");
    if (mkdtemp(z->dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
    for (int i = 0; i < members; i++) {
        char d[96];
        snprintf(d, sizeof(d), "%s/m%d", z->dir, i);
        if (mkdir(d, 0755) != 0) {
            perror(d);
            exit(1);
        }
    }
    /* A free port may be taken by another test between test_free_port and
     * the JVM's bind: a member that exits at start is tried again, every
     * member on new ports. */
    for (int attempt = 0;; attempt++) {
        int failed = -1;
        for (int i = 0; i < members; i++) {
            z->client_port[i] = test_free_port();
            z->peer_port[i] = test_free_port();
            z->elect_port[i] = test_free_port();
        }
        used = (size_t)snprintf(z->hosts, sizeof(z->hosts), "127.0.0.1:%d", z->client_port[0]);
        for (int i = 1; i < members; i++)
            used += (size_t)snprintf(z->hosts + used, sizeof(z->hosts) - used, ",127.0.0.1:%d",
                                     z->client_port[i]);
        /* Sessions of 2 s: a stalled holder's node goes in about 2 s. */
        snprintf(z->url, sizeof(z->url), "zk://%s?session_timeout_ms=2000", z->hosts);
        for (int i = 0; i < members; i++) {
            snprintf(z->member_url[i], sizeof(z->member_url[i]),
                     "zk://127.0.0.1:%d?session_timeout_ms=2000", z->client_port[i]);
            zk_write_config(z, i);
            zk_spawn(z, i);
        }
        for (int i = 0; i < members && failed < 0; i++)
            if (!zk_wait_serving(z, i))
                failed = i;
        if (failed < 0)
            return;
        if (z->pid[failed] != 0 || attempt == 2) { /* did not serve in time, or 3 tries */
            test_zk_stop(z);
            exit(1);
        }
        fprintf(stderr, "zookeeper: starting again on other ports\n");
        for (int i = 0; i < members; i++)
            test_zk_kill(z, i);
    }
}

void test_zk_kill(test_zk *z, int i)
{
    if (z->pid[i] > 0) {
        kill(z->pid[i], SIGKILL);
        waitpid(z->pid[i], NULL, 0);
        z->pid[i] = 0;
    }
}

void test_zk_restart(test_zk *z, int i)
{
    test_zk_kill(z, i);
    zk_spawn(z, i);
    if (!zk_wait_serving(z, i))
        exit(1);
}

void test_zk_pause(test_zk *z, int i, int paused)
{
    if (z->pid[i] > 0 && kill(z->pid[i], paused ? SIGSTOP : SIGCONT) != 0) {
        fprintf(stderr, "kill -%s %d: %s\n", paused ? "STOP" : "CONT", z->pid[i],
                strerror(errno));
        exit(1);
    }
}

void test_zk_stop(test_zk *z)
{
    char cmd[128];

    for (int i = 0; i < z->n; i++) {
        if (z->pid[i] > 0)
            kill(z->pid[i], SIGCONT);
        test_zk_kill(z, i);
    }
    if (z->dir[0] != '\0') {
        snprintf(cmd, sizeof(cmd), "rm -rf %s", z->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", z->dir);
        z->dir[0] = '\0';
    }
    for (int i = 0; i < 4; i++)
        if (zk_started[i] == z)
            zk_started[i] = NULL;
}

int test_zk_leader(test_zk *z)
{
    for (int t = 0; t < 400; t++) {
        for (int i = 0; i < z->n; i++) {
            char *r = z->pid[i] > 0 ? test_zk_4lw(z, i, "srvr") : NULL;
            int leads = r != NULL && (strstr(r, "Mode: leader") != NULL ||
                                      strstr(r, "Mode: standalone") != NULL);
            free(r);
            if (leads)
                return i;
        }
        test_sleep_ms(50);
    }
    fprintf(stderr, "no zookeeper member leads after 20 s\n");
    exit(1);
}

long long test_zk_mntr(test_zk *z, int i, const char *key)
{
    char *r = test_zk_4lw(z, i, "mntr"), *at;
    size_t klen = strlen(key);
    long long v = -1;

    for (at = r; at != NULL && (at = strstr(at, key)) != NULL; at += klen)
        if ((at == r || at[-1] == '\n') && at[klen] == '\t') {
            v = atoll(at + klen + 1);
            break;
        }
    free(r);
    return v;
}

/* ---- reading the tree, through the C client ------------------------------ */

static void quiet(const char *m)
{
    (void)m;
}

static void nop_watcher(zhandle_t *zh, int type, int state, const char *path, void *ctx)
{
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

/* A connected handle to any live member (waits up to 20 s). */
static zhandle_t *zk_connect(test_zk *z)
{
    zhandle_t *zh = zookeeper_init2(z->hosts, nop_watcher, 10000, NULL, NULL, 0, quiet);

    for (int t = 0; zh != NULL && t < 400; t++) {
        if (zoo_state(zh) == ZOO_CONNECTED_STATE)
            return zh;
        test_sleep_ms(50);
    }
    fprintf(stderr, "cannot connect to zookeeper %s\n", z->hosts);
    exit(1);
}

long long test_zk_children(test_zk *z, const char *path)
{
    zhandle_t *zh = zk_connect(z);
    struct String_vector kids = {0, NULL};
    int rc = zoo_get_children(zh, path, 0, &kids);
    long long n = rc == ZOK ? kids.count : rc == ZNONODE ? 0 : -1;

    deallocate_String_vector(&kids);
    zookeeper_close(zh);
    if (n < 0) {
        fprintf(stderr, "zookeeper: get children %s: %s\n", path, zerror(rc));
        exit(1);
    }
    return n;
}

int test_zk_child_names(test_zk *z, const char *path, char names[][128], int max)
{
    zhandle_t *zh = zk_connect(z);
    struct String_vector kids = {0, NULL};
    int rc = zoo_get_children(zh, path, 0, &kids), n = 0;

    for (int i = 0; rc == ZOK && i < kids.count && n < max; i++)
        snprintf(names[n++], 128, "%s", kids.data[i]);
    deallocate_String_vector(&kids);
    zookeeper_close(zh);
    return n;
}
#endif
