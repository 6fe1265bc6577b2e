/* SPDX-License-Identifier: BSD-3-Clause */
/* The results as JSON (`--json FILE`), for scripts and the tests. */
#include "demo_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* A JSON string: escapes quotes, backslashes and control bytes. */
static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

int demo_json_write(const char *path, const demo_options *o, const char *store_kind, int embedded,
                    const demo_result *res, size_t n, int ok)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        demo_err("--json %s: %s", path, strerror(errno));
        return -1;
    }
    fprintf(f, "{\n  \"demo\": \"payout\",\n  \"seed\": %" PRIu64 ",\n", o->seed);
    fprintf(f, "  \"instances\": %d,\n  \"orders_per_round\": %d,\n  \"rounds\": %d,\n",
            o->instances, o->orders, o->rounds);
    fprintf(f, "  \"ttl_ms\": %lld,\n  \"pay_ms\": %lld,\n  \"pause\": %s,\n",
            (long long)o->ttl_ms, (long long)o->pay_ms, o->pause ? "true" : "false");
    fprintf(f, "  \"lock_server\": \"%s\",\n  \"store\": ", embedded ? "embedded" : "url");
    put_str(f, store_kind);
    fprintf(f, ",\n  \"ok\": %s,\n  \"modes\": {", ok ? "true" : "false");
    int first = 1;
    for (size_t k = 0; k < n; k++) {
        const demo_result *r = &res[k];
        if (!r->ran)
            continue;
        fprintf(f, "%s\n    ", first ? "" : ",");
        first = 0;
        put_str(f, demo_mode_name(r->mode));
        fprintf(f, ": {\"rounds\": %d, \"pauses\": %d, \"orders\": %" PRId64
                   ", \"payouts\": %" PRId64 ", \"double_payouts\": %" PRId64
                   ", \"stale_writes_refused\": %" PRId64 ", \"unpaid\": %" PRId64
                   ", \"errors\": %d, \"acquire_attempts\": %" PRId64 ", ",
                r->rounds, r->pauses, r->orders, r->payouts, r->double_paid, r->refused,
                r->unpaid, r->errors, r->acquires);
        if (r->acquires > 0)
            fprintf(f, "\"acquire_p50_ms\": %.3f, \"acquire_p99_ms\": %.3f, ", r->p50_ms, r->p99_ms);
        else
            fprintf(f, "\"acquire_p50_ms\": null, \"acquire_p99_ms\": null, ");
        fprintf(f, "\"highest_fence\": %" PRIu64 ", \"seconds\": %.3f}", r->highest_fence,
                (r->t1_us - r->t0_us) / 1e6);
    }
    fprintf(f, "\n  }\n}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        demo_err("--json %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
