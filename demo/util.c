/* SPDX-License-Identifier: BSD-3-Clause */
/* Small helpers of the demo: clock, random numbers, messages, files. */
#include "demo_int.h"
#include "redact.h"

#include <dlock/dlock.h>

#include <errno.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int64_t demo_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Sleeps the whole time even across signals (a SIGSTOP/SIGCONT pair or a
 * SIGINT that the scheduler handles by its flag). */
void demo_sleep_us(int64_t us)
{
    if (us <= 0)
        return;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += us / 1000000;
    deadline.tv_nsec += (us % 1000000) * 1000;
    if (deadline.tv_nsec >= 1000000000) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &deadline, NULL) == EINTR)
        ;
}

/* splitmix64: small, fast, and the same sequence on every platform, so a
 * seed reproduces a run's orders and pauses. */
uint64_t demo_rand(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t demo_rand_below(uint64_t *state, uint64_t n)
{
    return demo_rand(state) % n;
}

void demo_err(const char *fmt, ...)
{
    char buf[1024], shown[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    cli_redact(shown, sizeof shown, buf);
    fprintf(stderr, "dlock demo: %s\n", shown);
}

void demo_dlock_err(const char *what, int code)
{
    const char *detail = dlock_error_message();
    if (detail == NULL || detail[0] == '\0')
        detail = dlock_strerror(code);
    demo_err("%s: %s", what, detail);
}

int demo_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

void demo_rmtree(const char *path)
{
    if (path != NULL && path[0] != '\0')
        nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void demo_redact_url(char *buf, size_t len, const char *url)
{
    /* scheme://user:password@host... -> scheme://user:***@host... */
    const char *scheme_end = strstr(url, "://");
    const char *auth = scheme_end ? scheme_end + 3 : NULL;
    const char *at = NULL, *colon = NULL;
    if (auth != NULL) {
        size_t hostpart = strcspn(auth, "/?#");
        for (const char *p = auth; p < auth + hostpart; p++)
            if (*p == '@')
                at = p;
        if (at != NULL)
            colon = memchr(auth, ':', (size_t)(at - auth));
    }
    if (colon == NULL)
        snprintf(buf, len, "%s", url);
    else
        snprintf(buf, len, "%.*s***%s", (int)(colon + 1 - url), url, at);
}
