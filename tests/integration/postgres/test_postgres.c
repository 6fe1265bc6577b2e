/* SPDX-License-Identifier: BSD-3-Clause */
#include "test_pg.h"

static void bad_url(void)
{
}

TEST_MAIN({"bad_url", bad_url, NULL})
