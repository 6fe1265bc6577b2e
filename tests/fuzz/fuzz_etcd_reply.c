/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target: the etcd backend's reply handling, through the real
 * code paths. A fake HTTP server on a loopback TCP port answers each request
 * with the next part of the fuzz input, and a client connected with
 * etcd://127.0.0.1:PORT?transport=gateway (the JSON gateway: the gRPC
 * transcoder has fuzz_etcd_grpc) runs a public-API scenario chosen by the first byte:
 * acquire (try once, or waiting on a watch stream), extend, check, release,
 * status, force-release, watchdog renewals (lease keepalive), a login, a
 * campaign and an observer.
 *
 * Input: byte 0 picks the scenario; the rest, split on NUL bytes, are the
 * replies to the successive requests the server receives (from any thread
 * of the client, in arrival order). The first byte of each reply picks its
 * framing (below); the rest is the body. Once the replies run out, every
 * request gets a gRPC error, so each run ends quickly.
 *
 * Lease IDs and key names come from the owner token, which is random: no
 * input could name them. So the server fills them in: in a body, "$I" stands
 * for the last lease ID a request of this run named ("ID" or "lease"; not
 * a revoke's or a timetolive's),
 * "$K" for the first "key" of the request being answered and "$J" for its
 * second (the put of an acquire txn). That lets the fuzzer reach the paths
 * behind "this is our key, our lease" (keepalives, the waiter's queue, the
 * renewal) instead of stopping at the first mismatch.
 *
 * Why a server rather than feeding the parsers directly: the checks to
 * exercise are in the backend's I/O paths (HTTP status, error bodies, line
 * splitting of streams, failover and retries), and a harness calling copies
 * of them would fuzz the copies.
 *
 * Invariants: no crash, leak or undefined behaviour (ASan, UBSan, LSan);
 * every failure carries a message naming the server; nothing but the
 * documented codes comes back; a call never blocks past its timeouts.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dlock/dlock.h"

/* libFuzzer's entry points. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_INPUT 8192
#define MAX_CONNS 64
#define MAX_REQUEST 65536
#define MAX_CHUNKS 256

/* Framing of a reply, by its first byte modulo 16. */
enum {
    FRAME_400 = 10,     /* status 400, Content-Length */
    FRAME_404 = 11,     /* status 404 */
    FRAME_503 = 12,     /* status 503 */
    FRAME_OPEN = 13,    /* 200, chunked, never finished: the client times out */
    FRAME_CHUNKED = 14, /* 200, chunked, in pieces of byte/16 + 1 bytes */
    FRAME_RAW = 15      /* the bytes as they are, HTTP or not */
    /* 0..9: status 200, Content-Length */
};

static const char no_more[] =
    "{\"error\":\"fuzz: no more replies\",\"code\":9,\"message\":\"fuzz: no more replies\"}\n";

static int port;
static int listen_fd = -1;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t input[MAX_INPUT];
static size_t chunk_at[MAX_CHUNKS], chunk_len[MAX_CHUNKS];
static size_t nchunks, next_chunk;
static char last_id[24]; /* the last lease ID a request named */

typedef struct {
    int fd;
    int answered; /* then only drain until the client hangs up */
    char *req;
    size_t len;
} conn;

/* ---- the fake gateway --------------------------------------------------- */

static void send_all(int fd, const void *p, size_t n)
{
    const char *b = p;

    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        b += w;
        n -= (size_t)w;
    }
}

/* The value of the n-th (0-based) "key":"..." in the request body, or "". */
static void find_key(const char *body, int n, char *out, size_t size)
{
    const char *p = body;

    out[0] = '\0';
    while ((p = strstr(p, "\"key\":\"")) != NULL) {
        p += 7;
        if (n-- == 0) {
            size_t k = 0;
            while (p[k] != '\0' && p[k] != '"' && k + 1 < size) {
                out[k] = p[k];
                k++;
            }
            out[k] = '\0';
            return;
        }
    }
}

/* Remember the lease ID a request names ("ID":N, "ID":"N", "lease":N). */
static void note_id(const char *body)
{
    static const char *const fields[] = {"\"ID\":", "\"lease\":"};

    for (int f = 0; f < 2; f++) {
        const char *p = strstr(body, fields[f]);
        size_t k = 0;
        if (p == NULL)
            continue;
        p += strlen(fields[f]);
        if (*p == '"')
            p++;
        while ((p[k] == '-' || (p[k] >= '0' && p[k] <= '9')) && k + 1 < sizeof(last_id))
            k++;
        if (k > 0) {
            memcpy(last_id, p, k);
            last_id[k] = '\0';
            return;
        }
    }
}

/* Append n bytes to the growing buffer *out. */
static void append(char **out, size_t *len, size_t *cap, const void *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        *cap = 2 * (*len + n + 1);
        if ((*out = realloc(*out, *cap)) == NULL)
            abort();
    }
    memcpy(*out + *len, p, n);
    *len += n;
    (*out)[*len] = '\0';
}

/* The body with $I, $K, $J filled in; malloc'd. */
static char *expand(const uint8_t *b, size_t n, const char *reqbody, size_t *len)
{
    char k0[512], k1[512], *out = NULL;
    size_t cap = 0;

    *len = 0;
    append(&out, len, &cap, "", 0);
    find_key(reqbody, 0, k0, sizeof(k0));
    find_key(reqbody, 1, k1, sizeof(k1));
    for (size_t i = 0; i < n; i++) {
        const char *sub = NULL;
        if (b[i] == '$' && i + 1 < n)
            sub = b[i + 1] == 'I' ? last_id : b[i + 1] == 'K' ? k0 : b[i + 1] == 'J' ? k1 : NULL;
        if (sub != NULL) {
            append(&out, len, &cap, sub, strlen(sub));
            i++;
        } else {
            append(&out, len, &cap, &b[i], 1);
        }
    }
    return out;
}

/* Answer one complete request on c with the next chunk of the input. */
static void answer(conn *c, const char *reqbody)
{
    uint8_t mode = 0;
    const uint8_t *body = (const uint8_t *)no_more;
    size_t blen = sizeof(no_more) - 1, piece;
    int frame = FRAME_400, done = 1;
    char head[256], *text;
    size_t tlen;

    pthread_mutex_lock(&mu);
    /* A revoke or timetolive names a lease on its way out, or another's. */
    if (strncmp(c->req, "POST /v3/lease/revoke ", 22) != 0 &&
        strncmp(c->req, "POST /v3/lease/timetolive ", 26) != 0)
        note_id(reqbody);
    if (next_chunk < nchunks) {
        const uint8_t *ch = input + chunk_at[next_chunk];
        size_t n = chunk_len[next_chunk];
        next_chunk++;
        mode = n > 0 ? ch[0] : 0;
        frame = mode % 16;
        body = n > 0 ? ch + 1 : ch;
        blen = n > 0 ? n - 1 : 0;
    }
    text = expand(body, blen, reqbody, &tlen);
    pthread_mutex_unlock(&mu);

    switch (frame) {
    case FRAME_RAW:
        send_all(c->fd, text, tlen);
        break;
    case FRAME_OPEN:
    case FRAME_CHUNKED:
        snprintf(head, sizeof(head), "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     "Transfer-Encoding: chunked\r\n\r\n");
        send_all(c->fd, head, strlen(head));
        piece = frame == FRAME_OPEN ? tlen : (size_t)(mode / 16 + 1);
        for (size_t off = 0; off < tlen; off += piece) {
            size_t n = tlen - off < piece ? tlen - off : piece;
            snprintf(head, sizeof(head), "%zx\r\n", n);
            send_all(c->fd, head, strlen(head));
            send_all(c->fd, text + off, n);
            send_all(c->fd, "\r\n", 2);
        }
        if (frame == FRAME_OPEN)
            done = 0;
        else
            send_all(c->fd, "0\r\n\r\n", 5);
        break;
    default:
        snprintf(head, sizeof(head),
                 "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n",
                 frame == FRAME_400   ? "400 Bad Request"
                 : frame == FRAME_404 ? "404 Not Found"
                 : frame == FRAME_503 ? "503 Service Unavailable"
                                      : "200 OK",
                 tlen);
        send_all(c->fd, head, strlen(head));
        send_all(c->fd, text, tlen);
        break;
    }
    free(text);
    if (done)
        shutdown(c->fd, SHUT_WR);
}

/* Is the request in c complete (headers and Content-Length bytes)? Returns
 * the body's offset, or 0 when more is to come. */
static size_t complete(const conn *c)
{
    const char *end = strstr(c->req, "\r\n\r\n"), *cl;
    size_t hlen, want = 0;

    if (end == NULL)
        return c->len >= MAX_REQUEST - 1 ? c->len : 0;
    hlen = (size_t)(end - c->req) + 4;
    for (cl = c->req; (cl = strchr(cl, '\n')) != NULL && cl < end;) {
        cl++;
        if (strncasecmp(cl, "Content-Length:", 15) == 0) {
            want = strtoul(cl + 15, NULL, 10);
            break;
        }
    }
    if (c->len >= hlen + want || c->len >= MAX_REQUEST - 1)
        return hlen;
    return 0;
}

static void conn_close(conn *c)
{
    close(c->fd);
    free(c->req);
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

static void *serve(void *arg)
{
    struct pollfd fds[MAX_CONNS + 1];
    conn conns[MAX_CONNS];
    int n = 0;

    (void)arg;
    for (;;) {
        fds[0].fd = n < MAX_CONNS ? listen_fd : -1;
        fds[0].events = POLLIN;
        for (int i = 0; i < n; i++) {
            fds[i + 1].fd = conns[i].fd;
            fds[i + 1].events = POLLIN;
        }
        if (poll(fds, (nfds_t)n + 1, -1) < 0)
            continue;
        for (int i = 0; i < n; i++) {
            conn *c = &conns[i];
            ssize_t r;
            size_t at;
            if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (c->answered) {
                char sink[4096];
                r = recv(c->fd, sink, sizeof(sink), 0);
            } else {
                r = recv(c->fd, c->req + c->len, MAX_REQUEST - 1 - c->len, 0);
                if (r > 0) {
                    c->len += (size_t)r;
                    c->req[c->len] = '\0';
                    if ((at = complete(c)) != 0) {
                        answer(c, c->req + at);
                        c->answered = 1;
                    }
                }
            }
            if (r <= 0)
                conn_close(c);
        }
        /* Compact: closed connections out. */
        for (int i = 0; i < n;) {
            if (conns[i].fd < 0)
                conns[i] = conns[--n];
            else
                i++;
        }
        if ((fds[0].revents & POLLIN) && n < MAX_CONNS) {
            int fd = accept(listen_fd, NULL, NULL);
            if (fd >= 0) {
                conns[n].fd = fd;
                conns[n].answered = 0;
                conns[n].len = 0;
                conns[n].req = malloc(MAX_REQUEST);
                if (conns[n].req == NULL)
                    abort();
                conns[n].req[0] = '\0';
                n++;
            }
        }
    }
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);
    pthread_t t;

    (void)argc;
    (void)argv;
    signal(SIGPIPE, SIG_IGN);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(listen_fd, 64) != 0 || getsockname(listen_fd, (struct sockaddr *)&a, &alen) != 0) {
        perror("fuzz_etcd_reply: listen");
        exit(1);
    }
    port = ntohs(a.sin_port);
    if (pthread_create(&t, NULL, serve, NULL) != 0)
        exit(1);
    pthread_detach(t);
    return 0;
}

/* ---- the client's side ------------------------------------------------------ */

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {0, ms * 1000000L};

    nanosleep(&ts, NULL);
}

static char where[64]; /* "etcd 127.0.0.1:PORT" */

/* Codes a call may return when the server answers nonsense, within limit_ms
 * of t0. */
static void check_rc(int rc, int64_t t0, int64_t limit_ms)
{
    if (rc > 0 || rc < DLOCK_ESERVER || rc == DLOCK_EINVAL || rc == DLOCK_EMISUSE ||
        rc == DLOCK_ENOTSUP)
        abort();
    if (rc != DLOCK_OK && rc != DLOCK_EBUSY && rc != DLOCK_ELOST && rc != DLOCK_ETIMEOUT) {
        const char *m = dlock_error_message();
        /* The message names the cause and the server. */
        if (m[0] == '\0' || (rc != DLOCK_ENOMEM && strstr(m, where) == NULL)) {
            fprintf(stderr, "rc %d without the server in the message: '%s'\n", rc, m);
            abort();
        }
    }
    if (now_ms() - t0 > limit_ms) {
        fprintf(stderr, "a call took %lld ms (limit %lld): %d %s\n", (long long)(now_ms() - t0),
                (long long)limit_ms, rc, dlock_error_message());
        abort(); /* blocked past its timeouts */
    }
}

static void lost_cb(dlock_lock *l, int reason, void *payload)
{
    (void)l;
    (void)payload;
    if (reason != DLOCK_ELOST && reason != DLOCK_ECONN)
        abort();
}

static void observe_cb(const dlock_leader_info *leader, void *payload)
{
    (void)payload;
    if (leader->held != 0 && leader->held != 1)
        abort();
    if (memchr(leader->identity, '\0', sizeof(leader->identity)) == NULL)
        abort();
}

/* Release l (if held) within limit. */
static void release(dlock_lock *l, int64_t limit)
{
    int64_t t0 = now_ms();

    if (l == NULL)
        return;
    if (dlock_lock_fence(l) == 0)
        abort(); /* a held lock always has a fence > 0 */
    check_rc(dlock_release(l), t0, limit);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dlock_client_options co = DLOCK_CLIENT_OPTIONS_INIT;
    dlock_acquire_options o = DLOCK_ACQUIRE_OPTIONS_INIT;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    dlock_lock_info info;
    dlock_leader_info leader;
    dlock_observer *ob = NULL;
    char url[200];
    int op, rc, login;
    int64_t t0, req;

    if (size < 1 || size - 1 > MAX_INPUT)
        return 0;
    op = data[0] % 9;
    login = op == 6;

    pthread_mutex_lock(&mu);
    memcpy(input, data + 1, size - 1);
    nchunks = 0;
    next_chunk = 0;
    last_id[0] = '\0';
    for (size_t from = 0, i = 0; i <= size - 1 && nchunks < MAX_CHUNKS; i++) {
        if (i == size - 1 || input[i] == '\0') {
            chunk_at[nchunks] = from;
            chunk_len[nchunks] = i - from;
            nchunks++;
            from = i + 1;
        }
    }
    pthread_mutex_unlock(&mu);

    co.connect_timeout_ms = 200;
    co.command_timeout_ms = 200;
    /* One request to the gateway: its budget is command_timeout_ms, retries
     * and their pauses included; a login the reply asks for has a budget of
     * its own. Plus scheduling slack. */
    req = (login ? 2 : 1) * co.command_timeout_ms + 100;
    snprintf(where, sizeof(where), "etcd 127.0.0.1:%d", port);
    if (login)
        snprintf(url, sizeof(url), "etcd://fuzzer:pw@127.0.0.1:%d?insecure_auth=1&transport=gateway",
                 port);
    else
        snprintf(url, sizeof(url), "etcd://127.0.0.1:%d?transport=gateway", port);
    t0 = now_ms();
    rc = dlock_client_open(&c, url, &co);
    /* The login, then the range that checks the prefix. */
    check_rc(rc, t0, 2 * req);
    if (rc != DLOCK_OK)
        return 0;

    o.lease_ms = 60000;
    o.auto_renew = 0;
    o.on_lost = lost_cb;
    /* Every other input of a scenario: a FAIR lock (the family calls). */
    if ((data[0] / 9) % 2 == 1)
        o.kind = DLOCK_KIND_FAIR;
    t0 = now_ms();
    switch (op) {
    case 0:
    case 6:
        /* Try once: grant, txn, and when busy revoke and timetolive. */
        rc = dlock_acquire(&l, c, "f", &o);
        check_rc(rc, t0, 4 * req);
        release(l, 2 * req);
        break;
    case 1:
        rc = dlock_acquire(&l, c, "f", &o);
        check_rc(rc, t0, 4 * req);
        if (rc != DLOCK_OK)
            break;
        /* Another TTL: range, grant, txn, revoke. The same: range,
         * keepalive. */
        t0 = now_ms();
        check_rc(dlock_lock_extend(l, 30000), t0, 4 * req);
        t0 = now_ms();
        check_rc(dlock_lock_extend(l, 30000), t0, 4 * req);
        t0 = now_ms();
        check_rc(dlock_lock_check(l), t0, req);
        release(l, 2 * req);
        break;
    case 2:
        rc = dlock_status(&info, c, "f");
        check_rc(rc, t0, 2 * req);
        if (rc == DLOCK_OK && info.held && info.ttl_ms < -1)
            abort();
        break;
    case 3:
        /* Range, timetolive, txn, revoke. */
        check_rc(dlock_force_release(&info, c, "f"), t0, 4 * req);
        break;
    case 4:
    case 7:
        /* Busy on the try, then queued: the key ahead's watch stream, the
         * lease's keepalive while waiting. Past the wait, what is under way
         * finishes: a keepalive of the wait (1), a try (the keepalive and
         * txn pair, each resent alone when it failed: 3; then, the lease
         * gone, grant, the enqueue txn twice around a grant, the range of the
         * key ahead: 5 more), and leaving the queue (revoke: 1). The first
         * try (4) may itself run past the wait, but then no wait's
         * keepalive comes before the next try. */
        o.wait_ms = 30;
        if (op == 7)
            o.kind = DLOCK_KIND_MUTEX; /* a campaign's kind is its own */
        if (op == 4)
            rc = dlock_acquire(&l, c, "f", &o);
        else
            rc = dlock_campaign(&l, c, "f", "fuzz-leader", &o);
        check_rc(rc, t0, o.wait_ms + (4 + 8 + 1) * req);
        if (op == 7) {
            t0 = now_ms();
            rc = dlock_leader(&leader, c, "f");
            check_rc(rc, t0, 2 * req);
            if (rc == DLOCK_OK && memchr(leader.identity, '\0', sizeof(leader.identity)) == NULL)
                abort();
        }
        release(l, 2 * req);
        break;
    case 5:
        /* Renewed every 10 ms on the watchdog's connection: keepalive and
         * a txn reading the key. */
        o.lease_ms = 30;
        o.auto_renew = 1;
        o.kind = DLOCK_KIND_MUTEX;
        rc = dlock_acquire(&l, c, "f", &o);
        check_rc(rc, t0, 4 * req);
        if (rc == DLOCK_OK)
            sleep_ms(25);
        /* A renewal under way finishes first. */
        release(l, 2 * req + 2 * req);
        break;
    case 8:
        /* The range that gives the start revision; then the observer's
         * thread reads the leader (range, timetolive) and watches. */
        rc = dlock_observe(&ob, c, "f", observe_cb, NULL);
        check_rc(rc, t0, req);
        if (rc == DLOCK_OK) {
            sleep_ms(30);
            t0 = now_ms();
            dlock_observer_free(ob);
            check_rc(DLOCK_OK, t0, 2 * req);
        }
        break;
    }
    dlock_client_free(c);
    return 0;
}
