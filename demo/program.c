/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * dlock-demo: the demo as a program of its own, `dlock-demo payout [options]`.
 * `dlock demo payout ...` runs it (cli/demo.c), with the same arguments.
 */
#include "demo.h"

#include <sys/prctl.h>

int main(int argc, char **argv)
{
    /* Its memory holds --url's and --store's passwords. `dlock` made itself
     * not dumpable and set a core limit of 0 (cli_protect_secrets); the limit
     * survives exec, dumpability does not: out of core dumps and debuggers
     * again. The instances it forks inherit it. */
    (void)prctl(PR_SET_DUMPABLE, 0L, 0L, 0L, 0L);
    return dlock_demo_main(argc, argv);
}
