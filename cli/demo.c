/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * `dlock demo ...`: the demo is a program of its own, dlock-demo, installed
 * beside dlock (demo/). It links SQLite and libpq for its store; apart, it
 * keeps them out of the command, whose only library is libdlock.
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define DEMO_PROGRAM "dlock-demo"

int cli_demo(int argc, char **argv)
{
    char self[PATH_MAX], path[PATH_MAX];
    (void)argc;

    /* Beside the running dlock, wherever the tree was installed or moved:
     * not $PATH, which might find another version's demo. */
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        cli_error("cannot find the demo: readlink /proc/self/exe: %s", strerror(errno));
        return CLI_EXIT_SOFTWARE;
    }
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash == NULL || (size_t)snprintf(path, sizeof path, "%.*s/" DEMO_PROGRAM,
                                          (int)(slash - self), self) >= sizeof path) {
        cli_error("cannot find the demo beside %s", self);
        return CLI_EXIT_SOFTWARE;
    }
    /* RLIMIT_CORE stays 0 (the demo holds passwords too); dlock-demo makes
     * itself not dumpable again. */
    argv[0] = DEMO_PROGRAM;
    execv(path, argv);
    int err = errno;
    if (err == ENOENT) {
        cli_error("the demo is not installed: no %s (build with -DDLOCK_BUILD_DEMO=ON, "
                  "or install the dlock-demo package)", path);
        return CLI_EXIT_UNAVAILABLE;
    }
    cli_error("cannot run the demo %s: %s", path, strerror(err));
    return CLI_EXIT_SOFTWARE;
}
