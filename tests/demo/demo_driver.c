/* SPDX-License-Identifier: BSD-3-Clause */
/* Stands in for the `dlock` command when the tree has no CLI:
 * `demo_driver demo payout ...` -> dlock_demo_main({"demo", "payout", ...}). */
#include "demo.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "demo") != 0) {
        fprintf(stderr, "usage: %s demo payout [options]\n", argv[0]);
        return 64;
    }
    return dlock_demo_main(argc - 1, argv + 1);
}
