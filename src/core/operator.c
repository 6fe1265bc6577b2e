/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What an operator sees of a client and its locks: the holder record each
 * acquisition leaves on the server (and its parsing back, for status and
 * list), the listing, the log callback, the counters, and the pipe that
 * lets dlock_client_interrupt be called from a signal handler.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/client.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fmt.h"
#include "core/thread.h"

/* ---- holder records ------------------------------------------------------ */

/* Printable ASCII, no space (a host name's bytes in the record). */
static int is_word(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] <= 0x20 || s[i] >= 0x7f)
            return 0;
    return n > 0;
}

/* The host name as a record's word, read again at most once a second on
 * each thread: gethostname is a system call, and every acquisition makes a
 * record. A name longer than the buffer, or none, or one with odd bytes,
 * is recorded as "?". */
static const char *holder_host(time_t now_sec)
{
    static _Thread_local char host[DLOCK_HOST_MAX + 1];
    static _Thread_local time_t read_at = -1;

    if (read_at != now_sec) {
        if (gethostname(host, sizeof(host)) != 0 || host[sizeof(host) - 1] != '\0' ||
            !is_word(host, strlen(host)))
            snprintf(host, sizeof(host), "?");
        read_at = now_sec;
    }
    return host;
}

char *dlock__holder_new(const char *label)
{
    struct timespec now;
    const char *host;
    size_t hl, ll = label != NULL ? strlen(label) : 0, n;
    char *out;

    clock_gettime(CLOCK_REALTIME, &now);
    host = holder_host(now.tv_sec);
    hl = strlen(host);
    /* "HOST PID START_MS[ LABEL]", by hand (asprintf cost more than the
     * rest of an acquisition's strings together). */
    out = malloc(hl + ll + 2 * (DLOCK__FMT_LL_MAX + 1) + 2);
    if (out == NULL)
        return NULL;
    memcpy(out, host, hl);
    n = hl;
    out[n++] = ' ';
    n += dlock__fmt_ll(out + n, (long long)getpid());
    out[n++] = ' ';
    n += dlock__fmt_ll(out + n, (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
    if (label != NULL) {
        out[n++] = ' ';
        memcpy(out + n, label, ll + 1);
    }
    return out;
}

/* A decimal number of n bytes, >= 0. */
static int parse_num(const char *s, size_t n, int64_t *out)
{
    int64_t v = 0;

    if (n == 0 || n > 18)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

int dlock_holder_parse(dlock_lock_info *info, const char *text, size_t len)
{
    const char *field[3], *end = text + len, *p = text;
    size_t flen[3];
    int64_t pid, start;

    if (info == NULL)
        return DLOCK_EINVAL;
    info->has_holder = 0;
    info->host[0] = info->label[0] = '\0';
    info->pid = info->start_ms = 0;
    if (text == NULL)
        return DLOCK_EPROTO;
    for (int i = 0; i < 3; i++) {
        const char *sp = memchr(p, ' ', (size_t)(end - p));
        field[i] = p;
        flen[i] = (size_t)((sp != NULL ? sp : end) - p);
        if (i < 2 && sp == NULL)
            return DLOCK_EPROTO;
        p = sp != NULL ? sp + 1 : end;
    }
    if (!is_word(field[0], flen[0]) || flen[0] > DLOCK_HOST_MAX ||
        parse_num(field[1], flen[1], &pid) != 0 || parse_num(field[2], flen[2], &start) != 0 ||
        (size_t)(end - p) > DLOCK_LABEL_MAX)
        return DLOCK_EPROTO;
    for (const char *q = p; q < end; q++)
        if (*q < 0x20 || *q >= 0x7f)
            return DLOCK_EPROTO;
    memcpy(info->host, field[0], flen[0]);
    info->host[flen[0]] = '\0';
    memcpy(info->label, p, (size_t)(end - p));
    info->label[end - p] = '\0';
    info->pid = pid;
    info->start_ms = start;
    info->has_holder = 1;
    return DLOCK_OK;
}

/* ---- the listing --------------------------------------------------------- */

void dlock__info_settle(dlock_lock_info *info)
{
    if (info->holders == 0) {
        info->kind = -1;
        info->holders = info->held ? 1 : 0;
    }
}

/* The caller's callback, given each backend answer settled. */
typedef struct {
    dlock_list_cb cb;
    void *payload;
} settled;

static int settle_each(const char *name, const dlock_lock_info *info, void *payload)
{
    settled *s = payload;
    dlock_lock_info copy = *info;

    dlock__info_settle(&copy);
    return s->cb(name, &copy, s->payload);
}

int dlock_status_holders(dlock_client *c, const char *name, dlock_list_cb cb, void *payload)
{
    settled s = {cb, payload};
    dlock_lock_info info;
    dlock__call k;
    int rc;

    dlock__clear_error();
    if (c == NULL || cb == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_status_holders: %s is NULL",
                           c == NULL ? "client" : "cb");
    if ((rc = dlock__check_name(name, "dlock_status_holders")) != DLOCK_OK)
        return rc;
    if (c->backend->holders != NULL) {
        dlock__call_begin(c, &k, "holders", name, 1, 0);
        return dlock__call_end(c, &k, c->backend->holders(c->be, name, settle_each, &s));
    }
    /* No list of holders: the one status reads. */
    if ((rc = dlock_status(&info, c, name)) == DLOCK_OK && info.held)
        cb(name, &info, payload);
    return rc;
}

int dlock_list(dlock_client *c, const char *prefix, dlock_list_cb cb, void *payload)
{
    settled s = {cb, payload};
    dlock__call k;

    dlock__clear_error();
    if (c == NULL || cb == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_list: %s is NULL", c == NULL ? "client" : "cb");
    if (prefix == NULL)
        prefix = "";
    if (strnlen(prefix, DLOCK_NAME_MAX + 1) > DLOCK_NAME_MAX)
        return dlock__fail(DLOCK_EINVAL, "dlock_list: prefix is longer than %d bytes",
                           DLOCK_NAME_MAX);
    if (c->backend->list == NULL)
        return dlock__not_supported(c, "listing locks (dlock_list)");
    dlock__call_begin(c, &k, "list", NULL, 0, 0);
    return dlock__call_end(c, &k, c->backend->list(c->be, prefix, settle_each, &s));
}

/* ---- log and counters ---------------------------------------------------- */

void dlock__log(dlock_client *c, int level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    if (c == NULL || c->log == NULL || level < c->log_level)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* The text may quote a server's: keep the line one line. */
    for (char *p = msg; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    c->log(level, msg, c->log_payload);
}

void dlock__histogram_add(_Atomic uint64_t *hist, _Atomic uint64_t *sum_us, int64_t us)
{
    int b = 0;

    if (us < 0)
        us = 0;
    atomic_fetch_add(sum_us, (uint64_t)us);
    /* Bucket i holds [2^(i-1), 2^i) us; the last one everything longer. */
    while (us > 0 && b < DLOCK_STATS_BUCKETS - 1) {
        us >>= 1;
        b++;
    }
    atomic_fetch_add(&hist[b], 1);
}

/* ---- traced calls -------------------------------------------------------- */

static void trace(dlock_client *c, const dlock__call *k, int phase, int64_t us, int rc)
{
    dlock_trace_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.phase = phase;
    ev.id = k->id;
    ev.call = k->call;
    ev.name = k->name;
    ev.count = k->count;
    ev.duration_us = us;
    ev.result = rc;
    c->trace(&ev, c->trace_payload);
}

void dlock__call_begin(dlock_client *c, dlock__call *k, const char *call, const char *name,
                       size_t count, int flags)
{
    k->call = call;
    k->name = name;
    k->count = count;
    k->flags = flags;
    k->id = atomic_fetch_add(&c->last_call_id, 1) + 1;
    if (c->trace != NULL)
        trace(c, k, DLOCK_TRACE_BEGIN, 0, 0);
    k->start_us = dlock__now_us(); /* after the hook: its time is not the server's */
}

int dlock__call_end(dlock_client *c, const dlock__call *k, int rc)
{
    int64_t us = dlock__now_us() - k->start_us;

    if (k->flags & DLOCK__CALL_TIMED)
        dlock__histogram_add(c->stats.round_trip_us, &c->stats.round_trip_us_sum, us);
    if (c->trace != NULL)
        trace(c, k, DLOCK_TRACE_END, us, rc);
    if (c->log != NULL && c->log_level <= DLOCK_LOG_DEBUG) {
        char shown[80], what[120];
        if (k->name != NULL)
            snprintf(what, sizeof(what), "%s '%s'", k->call,
                     dlock__printable(shown, sizeof(shown), k->name));
        else
            snprintf(what, sizeof(what), "%s of %zu lock%s", k->call, k->count,
                     k->count == 1 ? "" : "s");
        dlock__log(c, DLOCK_LOG_DEBUG, "%s: %s in %lld.%03lld ms", what,
                   rc == DLOCK_OK ? "ok" : dlock_strerror(rc), (long long)(us / 1000),
                   (long long)(us % 1000));
    }
    return rc;
}

int dlock_client_stats(dlock_stats *out, const dlock_client *client)
{
    dlock_client *c = (dlock_client *)client; /* atomics are read, never written */
    const dlock__counters *k;

    dlock__clear_error();
    if (out == NULL || c == NULL)
        return dlock__fail(DLOCK_EINVAL, "dlock_client_stats: %s is NULL",
                           out == NULL ? "out" : "client");
    if (out->version < 1 || out->version > DLOCK_STATS_VERSION)
        return dlock__fail(DLOCK_EINVAL, "dlock_client_stats: version %u, this library knows "
                           "1..%d (initialise with DLOCK_STATS_INIT)", out->version,
                           DLOCK_STATS_VERSION);
    k = &c->stats;
    out->acquires = atomic_load(&k->acquires);
    out->busy = atomic_load(&k->busy);
    out->waits = atomic_load(&k->waits);
    out->handoffs = atomic_load(&k->handoffs);
    out->renewals = atomic_load(&k->renewals);
    out->renew_failures = atomic_load(&k->renew_failures);
    out->losses = atomic_load(&k->losses);
    for (int i = 0; i < DLOCK_STATS_BUCKETS; i++) {
        out->round_trip_us[i] = atomic_load(&k->round_trip_us[i]);
        out->wait_us[i] = atomic_load(&k->wait_us[i]);
    }
    if (out->version >= 2) {
        out->round_trip_us_sum = atomic_load(&k->round_trip_us_sum);
        out->wait_us_sum = atomic_load(&k->wait_us_sum);
    }
    return DLOCK_OK;
}

/* ---- interruption from a signal handler ---------------------------------- */

/*
 * dlock_client_interrupt may run in a signal handler, where no mutex may be
 * taken: it sets the flag and writes a byte to a pipe, and this thread,
 * started before the first wait, takes the mutex and wakes the waiters. A
 * waiter that lists itself after the thread went through the list sees the
 * flag before it sleeps (dlock__check_interrupt at the top of the loop).
 */
void dlock__waiting_wake_all(dlock_client *c)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__waiter *w = c->waiting; w != NULL; w = w->next)
        c->backend->watch_wake(c->be, w->watch);
    pthread_mutex_unlock(&c->mu);
}

static void *interrupt_main(void *arg)
{
    dlock_client *c = arg;
    char byte;

    for (;;) {
        ssize_t n = read(c->interrupt_read, &byte, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || byte == 'q')
            return NULL;
        dlock__waiting_wake_all(c);
    }
}

int dlock__interrupt_ready(dlock_client *c)
{
    int fds[2], rc = DLOCK_OK;

    pthread_mutex_lock(&c->mu);
    if (atomic_load(&c->interrupt_fd) >= 0)
        goto out;
    /* The write end does not block: a handler never waits on a full pipe
     * (one byte in it is enough to wake the thread). */
    if (pipe2(fds, O_CLOEXEC) != 0 || fcntl(fds[1], F_SETFL, O_NONBLOCK) != 0) {
        rc = dlock__fail(DLOCK_ENOMEM, "cannot make the interrupt pipe: %s", strerror(errno));
        goto out;
    }
    c->interrupt_read = fds[0];
    if (dlock__thread_create(&c->interrupt_thread, interrupt_main, c) != 0) {
        close(fds[0]);
        close(fds[1]);
        rc = dlock__fail(DLOCK_ENOMEM, "cannot start the interrupt thread");
        goto out;
    }
    atomic_store(&c->interrupt_fd, fds[1]);
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}

void dlock__interrupt_stop(dlock_client *c)
{
    int fd = atomic_exchange(&c->interrupt_fd, -1);
    char quit = 'q';

    if (fd < 0)
        return;
    /* A pipe full of wake-ups (EAGAIN) is being drained by the thread. */
    while (write(fd, &quit, 1) < 0 && (errno == EINTR || errno == EAGAIN))
        sched_yield();
    pthread_join(c->interrupt_thread, NULL);
    close(fd);
    close(c->interrupt_read);
}

void dlock_client_interrupt(dlock_client *c)
{
    int saved = errno, fd;
    char byte = 'w';

    if (c == NULL)
        return;
    atomic_store(&c->interrupted, 1);
    fd = atomic_load(&c->interrupt_fd);
    /* fd < 0: no call has waited yet, and one that starts sees the flag. A
     * full pipe (EAGAIN) already holds a wake-up. */
    if (fd >= 0)
        while (write(fd, &byte, 1) < 0 && errno == EINTR)
            ;
    errno = saved;
}
