/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rediss:// against Debian's redis-server with TLS on, certificates made by
 * openssl at run time (test_tls_make): what is verified and what each
 * refusal says. The conformance suite runs on rediss too (core-rediss).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "test.h"

/* url = the server's TLS port with the query given. */
static void tls_url(char *url, size_t size, const test_redis *r, const char *query)
{
    snprintf(url, size, "rediss://127.0.0.1:%d?%s", r->tls_port, query);
}

/* Open url, take and give back a lock: the whole path over TLS. */
static void lock_cycle(const char *url)
{
    dlock_client *c = NULL;
    dlock_lock *l = NULL;

    CHECK_RC(dlock_client_open(&c, url, NULL), DLOCK_OK);
    CHECK_RC(dlock_acquire(&l, c, "tls", NULL), DLOCK_OK);
    CHECK(dlock_lock_fence(l) > 0);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
}

/* dlock_client_open(url) fails with want within connect_ms, the message
 * naming needle. */
static void refused_within(const char *url, int64_t connect_ms, int want, const char *needle)
{
    dlock_client *c = NULL;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;

    o.connect_timeout_ms = connect_ms;
    CHECK_RC(dlock_client_open(&c, url, &o), want);
    CHECK(c == NULL);
    fprintf(stderr, "refused as expected: %s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), needle);
    CHECK_CONTAINS(dlock_error_message(), "rediss 127.0.0.1:");
}

static void refused(const char *url, int want, const char *needle)
{
    refused_within(url, 5000, want, needle);
}

/* The CA's certificate for the server's: verified, and the name given by
 * sni= is the one checked. */
static void verified_and_name_checked(void)
{
    test_tls t;
    test_redis r;
    char url[1024], q[256];

    test_tls_make(&t);
    test_redis_start_tls(&r, &t, "server", NULL);
    lock_cycle(r.url);
    snprintf(q, sizeof(q), "cacert=%s&sni=localhost", test_tls_file(&t, "ca.crt"));
    tls_url(url, sizeof(url), &r, q);
    lock_cycle(url);
    snprintf(q, sizeof(q), "cacert=%s&sni=redis.example.com", test_tls_file(&t, "ca.crt"));
    tls_url(url, sizeof(url), &r, q);
    refused(url, DLOCK_EAUTH, "does not match the name 'redis.example.com' (name mismatch");
    /* localhost as the host: the certificate's DNS name, checked too. */
    snprintf(url, sizeof(url), "rediss://localhost:%d?cacert=%s", r.tls_port,
             test_tls_file(&t, "ca.crt"));
    lock_cycle(url);
    test_redis_stop(&r);
    test_tls_remove(&t);
}

/* A certificate from a CA the client was not given: refused, unless
 * insecure=1 turns verification off. With no cacert= the system's CAs are
 * used, which do not know the test CA either. */
static void unknown_ca_refused(void)
{
    test_tls t;
    test_redis r;
    char url[1024], q[256];

    test_tls_make(&t);
    test_redis_start_tls(&r, &t, "other", NULL);
    refused(r.url, DLOCK_EAUTH, "not signed by a trusted CA (unknown CA");
    tls_url(url, sizeof(url), &r, "sni=localhost");
    refused(url, DLOCK_EAUTH, "unknown CA");
    snprintf(q, sizeof(q), "cacert=%s", test_tls_file(&t, "other-ca.crt"));
    tls_url(url, sizeof(url), &r, q);
    lock_cycle(url);
    tls_url(url, sizeof(url), &r, "insecure=1");
    lock_cycle(url);
    test_redis_stop(&r);
    test_tls_remove(&t);
}

static void expired_refused(void)
{
    test_tls t;
    test_redis r;

    test_tls_make(&t);
    test_redis_start_tls(&r, &t, "expired", NULL);
    refused(r.url, DLOCK_EAUTH, "certificate has expired");
    test_redis_stop(&r);
    test_tls_remove(&t);
}

/* --tls-auth-clients yes: no client certificate, or one of another CA, is
 * refused with a message that says so; the CA's client certificate works. */
static void client_certificates(void)
{
    test_tls t;
    test_redis r;
    char url[1024], q[512], ca[128], cert[128];

    test_tls_make(&t);
    test_redis_start_tls(&r, &t, "server", "--tls-auth-clients yes");
    refused(r.url, DLOCK_EAUTH, "requires a client certificate (give cert=FILE&key=FILE)");
    snprintf(ca, sizeof(ca), "%s", test_tls_file(&t, "ca.crt"));
    snprintf(cert, sizeof(cert), "%s", test_tls_file(&t, "client.crt"));
    snprintf(q, sizeof(q), "cacert=%s&cert=%s&key=%s", ca, cert, test_tls_file(&t, "client.key"));
    tls_url(url, sizeof(url), &r, q);
    lock_cycle(url);
    snprintf(cert, sizeof(cert), "%s", test_tls_file(&t, "other.crt"));
    snprintf(q, sizeof(q), "cacert=%s&cert=%s&key=%s", ca, cert, test_tls_file(&t, "other.key"));
    tls_url(url, sizeof(url), &r, q);
    refused(url, DLOCK_EAUTH, "refused our client certificate");
    test_redis_stop(&r);
    test_tls_remove(&t);
}

/* Files that cannot be read, and a plain port behind rediss://. */
static void bad_files_and_plain_port(void)
{
    test_tls t;
    test_redis r;
    char url[1024], q[512];

    test_tls_make(&t);
    test_redis_start_tls(&r, &t, "server", NULL);
    tls_url(url, sizeof(url), &r, "cacert=/nonexistent/ca.crt");
    refused(url, DLOCK_EINVAL, "cannot read the CA file cacert=/nonexistent/ca.crt: no such "
            "file or directory");
    snprintf(q, sizeof(q), "cacert=%s&cert=/nonexistent/c.crt&key=/nonexistent/c.key",
             test_tls_file(&t, "ca.crt"));
    tls_url(url, sizeof(url), &r, q);
    refused(url, DLOCK_EINVAL, "cannot read the client certificate cert=/nonexistent/c.crt");
    /* A key that is not the certificate's. */
    snprintf(q, sizeof(q), "cacert=%s&", test_tls_file(&t, "ca.crt"));
    snprintf(q + strlen(q), sizeof(q) - strlen(q), "cert=%s&", test_tls_file(&t, "client.crt"));
    snprintf(q + strlen(q), sizeof(q) - strlen(q), "key=%s", test_tls_file(&t, "other.key"));
    tls_url(url, sizeof(url), &r, q);
    refused(url, DLOCK_EINVAL, "cannot use the client key key=");
    snprintf(url, sizeof(url), "rediss://127.0.0.1:%d?cacert=%s", r.port,
             test_tls_file(&t, "ca.crt"));
    /* redis-server reads the ClientHello as an inline command that never
     * ends: no answer, so the connect timeout ends the handshake. */
    refused_within(url, 500, DLOCK_ECONN, "timed out (TLS handshake: no answer; is this a TLS "
                   "port?)");
    test_redis_stop(&r);
    test_tls_remove(&t);
}

/* A peer that accepts TCP and never answers the ClientHello: the handshake
 * ends at the connect timeout. */
static void handshake_bounded_by_connect_timeout(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    dlock_client *c = NULL;
    dlock_client_options o = DLOCK_CLIENT_OPTIONS_INIT;
    char url[128];

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 4) == 0 &&
          getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    /* The kernel completes the TCP handshake; nobody reads. */
    snprintf(url, sizeof(url), "rediss://127.0.0.1:%d?insecure=1", ntohs(a.sin_port));
    o.connect_timeout_ms = 300;
    o.command_timeout_ms = 60000;
    CHECK_RC(dlock_client_open(&c, url, &o), DLOCK_ECONN);
    fprintf(stderr, "%s\n", dlock_error_message());
    CHECK_CONTAINS(dlock_error_message(), "timed out (TLS handshake");
    close(fd);
}

/* The server killed and started again: the next call connects again, over
 * TLS. */
static void reconnect_after_restart(void)
{
    test_tls t;
    test_redis r;
    dlock_client *c = NULL;
    dlock_lock *l = NULL;
    dlock_lock_info info;

    test_tls_make(&t);
    test_redis_start_tls(&r, &t, "server", NULL);
    CHECK_RC(dlock_client_open(&c, r.url, NULL), DLOCK_OK);
    CHECK_RC(dlock_status(&info, c, "tls"), DLOCK_OK);
    test_redis_kill(&r);
    CHECK_RC(dlock_status(&info, c, "tls"), DLOCK_ECONN);
    test_redis_restart(&r);
    CHECK_RC(dlock_acquire(&l, c, "tls", NULL), DLOCK_OK);
    CHECK_RC(dlock_release(l), DLOCK_OK);
    dlock_client_free(c);
    test_redis_stop(&r);
    test_tls_remove(&t);
}

/* Redlock with tls=1: every node over TLS; a node whose certificate is not
 * the CA's makes open fail (a wrong certificate is a setting to fix, not
 * an outage to outvote). */
static void redlock_url(char *url, size_t size, const test_redis r[3], const test_tls *t)
{
    size_t n = (size_t)snprintf(url, size, "redlock://");

    for (int i = 0; i < 3; i++)
        n += (size_t)snprintf(url + n, size - n, "%s127.0.0.1:%d", i ? "," : "", r[i].tls_port);
    snprintf(url + n, size - n, "?tls=1&cacert=%s", test_tls_file(t, "ca.crt"));
}

static void redlock_over_tls(void)
{
    test_tls t;
    test_redis r[3];
    char url[1024];

    test_tls_make(&t);
    for (int i = 0; i < 3; i++)
        test_redis_start_tls(&r[i], &t, "server", NULL);
    redlock_url(url, sizeof(url), r, &t);
    lock_cycle(url);
    test_redis_stop(&r[2]);
    test_redis_start_tls(&r[2], &t, "other", NULL);
    redlock_url(url, sizeof(url), r, &t);
    refused(url, DLOCK_EAUTH, "unknown CA");
    for (int i = 0; i < 3; i++)
        test_redis_stop(&r[i]);
    test_tls_remove(&t);
}

TEST_MAIN({"verified_and_name_checked", verified_and_name_checked, NULL},
          {"unknown_ca_refused", unknown_ca_refused, NULL},
          {"expired_refused", expired_refused, NULL},
          {"client_certificates", client_certificates, NULL},
          {"bad_files_and_plain_port", bad_files_and_plain_port, NULL},
          {"handshake_bounded_by_connect_timeout", handshake_bounded_by_connect_timeout, NULL},
          {"reconnect_after_restart", reconnect_after_restart, NULL},
          {"redlock_over_tls", redlock_over_tls, "redlock"})
