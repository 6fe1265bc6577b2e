/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A peer library's side of a table (python-etcd3 for --etcd, Curator for
 * --zk): a child process driven over two pipes, a command a line, so that
 * its cycles run between dlock's, round by round, on the same server.
 */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

int bench_peer_line(bench_peer *p, char *line, size_t size)
{
    if (p->to == NULL || fgets(line, (int)size, p->from) == NULL)
        return 0;
    line[strcspn(line, "\n")] = 0;
    return 1;
}

void bench_peer_stop(bench_peer *p, const char *why)
{
    if (why != NULL && p->why[0] == 0)
        snprintf(p->why, sizeof p->why, "%s", why);
    if (p->to != NULL) {
        fclose(p->to);
        fclose(p->from);
        p->to = p->from = NULL;
        waitpid(p->pid, NULL, 0);
    }
}

void bench_peer_start(bench_peer *p, char *const argv[], char *const env[], const char *fail_why)
{
    char line[256] = "";
    int in[2], out[2];

    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", fail_why);
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
        bench_die("pipe: %s", strerror(errno));
    p->pid = fork();
    if (p->pid < 0)
        bench_die("fork: %s", strerror(errno));
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        dup2(out[1], 2);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* Secrets by the environment, not argv, which every local user
         * can read. */
        for (size_t i = 0; env != NULL && env[i] != NULL; i += 2)
            if (setenv(env[i], env[i + 1], 1) != 0)
                _exit(127);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    if ((p->to = fdopen(in[1], "w")) == NULL || (p->from = fdopen(out[0], "r")) == NULL)
        bench_die("fdopen: %s", strerror(errno));
    /* Anything before "ready" is why not: its last line (a traceback's
     * exception, a usage line). */
    if (!bench_peer_line(p, line, sizeof line) || strcmp(line, "ready") != 0) {
        char next[256];
        while (bench_peer_line(p, next, sizeof next))
            if (next[0])
                snprintf(line, sizeof line, "%s", next);
        bench_peer_stop(p, line[0] ? line : fail_why);
    }
}

void bench_peer_cmd(bench_peer *p, const char *cmd, long n)
{
    char line[256] = "";

    if (p->to == NULL)
        return;
    if (n >= 0)
        fprintf(p->to, "%s %ld\n", cmd, n);
    else
        fprintf(p->to, "%s\n", cmd);
    fflush(p->to);
    if (!bench_peer_line(p, line, sizeof line) || strcmp(line, "ok") != 0)
        bench_peer_stop(p, line[0] ? line : p->name);
}

int bench_peer_report(bench_peer *p, double *v, int n)
{
    char line[256] = "", *s = line, *end;
    int got = 0;

    if (p->to == NULL)
        return 0;
    fprintf(p->to, "report\n");
    fflush(p->to);
    if (bench_peer_line(p, line, sizeof line))
        for (; got < n; got++, s = end) {
            v[got] = strtod(s, &end);
            if (end == s)
                break;
        }
    bench_peer_stop(p, got == n && v[0] > 0 ? NULL : line[0] ? line : p->name);
    return got == n && v[0] > 0;
}
