/* SPDX-License-Identifier: MIT */
/* The HTTP server (proto/http.c) and the Prometheus text format
 * (proto/prom.c): routes, prefixes, 404/405, bad URLs, histogram output. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/http.h"
#include "proto/prom.h"
#include "proto/rpc.h"

static void hello(void *arg, const char *path, const char *query, kv_http_res *res)
{
    char buf[256];
    int n = snprintf(buf, sizeof(buf), "%s path=%s query=%s\n", (const char *)arg, path, query);
    res->body = strdup(buf);
    res->len = (size_t)n;
    res->content_type = "text/plain";
    res->status = strcmp(query, "fail") == 0 ? 503 : 200;
}

/* Runs shell command cmd: what it printed, in out. */
static void run(const char *cmd, char *out, size_t len)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    pclose(p);
}

/* Runs cmd (a shell command printing an HTTP response): the status, the
 * response in out. */
static int response(const char *cmd, char *out, size_t len)
{
    run(cmd, out, len);
    int status = 0;
    sscanf(out, "HTTP/1.%*d %d", &status);
    return status;
}

/* GET path with an extra header line (NULL = none) over plain TCP (bash's
 * /dev/tcp, no curl needed). */
static int get_h(int port, const char *path, const char *header, char *out, size_t len)
{
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "bash -c \"exec 3<>/dev/tcp/127.0.0.1/%d && printf 'GET %%s HTTP/1.0\\r\\nHost: "
             "x\\r\\n%%b\\r\\n' '%s' '%s%s' >&3 && cat <&3\"",
             port, path, header ? header : "", header ? "\\r\\n" : "");
    return response(cmd, out, len);
}

static int get(int port, const char *path, char *out, size_t len)
{
    return get_h(port, path, NULL, out, len);
}

Test(http, routes_prefixes_and_errors)
{
    kv_http_route routes[] = {{"/metrics", hello, "m"}, {"/api/", hello, "a"}};
    kv_http *h = NULL;
    char err[256];
    cr_assert_eq(kv_http_open(&h, "http://127.0.0.1:0", routes, 2, NULL, err, sizeof(err)), KV_OK,
                 "%s", err);
    int port = kv_http_port(h);
    cr_assert_gt(port, 0);
    char out[4096];
    cr_expect_eq(get(port, "/metrics", out, sizeof(out)), 200, "%s", out);
    cr_expect(strstr(out, "m path=/metrics query=\n"), "%s", out);
    cr_expect(strstr(out, "Content-Type: text/plain"), "%s", out);
    cr_expect_eq(get(port, "/api/nodes?x=1", out, sizeof(out)), 200, "%s", out);
    cr_expect(strstr(out, "a path=/api/nodes query=x=1"), "%s", out);
    cr_expect_eq(get(port, "/metrics?fail", out, sizeof(out)), 503, "%s", out);
    cr_expect_eq(get(port, "/nothing", out, sizeof(out)), 404, "%s", out);
    kv_http_close(h);
    cr_expect_eq(kv_http_open(&h, "tcp://127.0.0.1:0", routes, 2, NULL, err, sizeof(err)),
                 KV_INVALID_ARGUMENT);
    cr_expect(strstr(err, "http://HOST:PORT"), "%s", err);
    cr_expect_eq(kv_http_open(&h, "https://127.0.0.1:0", routes, 2, NULL, err, sizeof(err)),
                 KV_INVALID_ARGUMENT);
    cr_expect(strstr(err, "--tls-cert"), "https without a certificate names the flag: %s", err);
}

Test(http, token_guards_every_route_but_open_ones)
{
    kv_http_route routes[] = {{"/metrics", hello, "m"}, {"/health", hello, "h", .open = true}};
    kv_http_opts o = {.token = "s3cret/+x"};
    kv_http *h = NULL;
    char err[256], out[4096];
    cr_assert_eq(kv_http_open(&h, "http://127.0.0.1:0", routes, 2, &o, err, sizeof(err)), KV_OK,
                 "%s", err);
    int port = kv_http_port(h);
    cr_expect_eq(get(port, "/metrics", out, sizeof(out)), 401, "%s", out);
    cr_expect(strstr(out, "WWW-Authenticate: Bearer"), "%s", out);
    cr_expect(strstr(out, "--http-token"), "the 401 names the flag: %s", out);
    cr_expect(!strstr(out, "m path="), "no data without the token: %s", out);
    cr_expect_eq(get_h(port, "/metrics", "Authorization: Bearer s3cret/+y", out, sizeof(out)), 401,
                 "%s", out);
    cr_expect_eq(get_h(port, "/metrics", "Authorization: Bearer s3cret/+", out, sizeof(out)), 401,
                 "a prefix of the token is refused: %s", out);
    cr_expect_eq(get_h(port, "/metrics", "Authorization: Basic czNjcmV0", out, sizeof(out)), 401,
                 "%s", out);
    cr_expect_eq(get_h(port, "/metrics", "Authorization: Bearer s3cret/+x", out, sizeof(out)), 200,
                 "%s", out);
    cr_expect(strstr(out, "m path=/metrics"), "%s", out);
    cr_expect_eq(get_h(port, "/metrics", "authorization: bearer s3cret/+x", out, sizeof(out)), 200,
                 "header name and scheme are case-insensitive: %s", out);
    /* the query form, percent-encoded ('/' and '+' escaped; a raw '+' is a space) */
    cr_expect_eq(get(port, "/metrics?a=1&token=s3cret%2F%2Bx", out, sizeof(out)), 200, "%s", out);
    cr_expect_eq(get(port, "/metrics?token=s3cret/+x", out, sizeof(out)), 401, "%s", out);
    cr_expect_eq(get(port, "/metrics?token=s3cret%2F%2Bx%00", out, sizeof(out)), 401, "%s", out);
    cr_expect_eq(get(port, "/metrics?token=", out, sizeof(out)), 401, "%s", out);
    cr_expect_eq(get(port, "/health", out, sizeof(out)), 200, "open routes need no token: %s", out);
    kv_http_close(h);
}

/* A temporary directory (mkdtemp) holding a self-signed certificate for
 * 127.0.0.1 (cert) and its key. */
typedef struct tls_dir {
    char dir[32], cert[64], key[64];
} tls_dir;

static void tls_dir_make(tls_dir *t)
{
    snprintf(t->dir, sizeof(t->dir), "/tmp/hotkv-http-tls-XXXXXX"); /* mkdtemp's template */
    cr_assert_not_null(mkdtemp(t->dir));
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
             "-keyout k.pem -out c.pem -days 2 -subj /CN=127.0.0.1 >/dev/null 2>&1",
             t->dir);
    cr_assert_eq(system(cmd), 0, "openssl req failed (is openssl installed?)");
    snprintf(t->cert, sizeof(t->cert), "%s/c.pem", t->dir);
    snprintf(t->key, sizeof(t->key), "%s/k.pem", t->dir);
}

static void tls_dir_remove(const tls_dir *t)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", t->dir);
    cr_expect_eq(system(cmd), 0);
}

Test(http, https_serves_with_the_process_certificate, .timeout = 60)
{
    tls_dir td;
    tls_dir_make(&td);
    const char *cert = td.cert;
    char cmd[1024], out[4096];
    rpc_tls t = {.cert = cert, .key = td.key, .ca = cert};
    kv_http_opts o = {.token = "tok", .tls = &t};
    kv_http_route routes[] = {{"/metrics", hello, "m"}};
    kv_http *h = NULL;
    char err[512];
    cr_assert_eq(kv_http_open(&h, "https://127.0.0.1:0", routes, 1, &o, err, sizeof(err)), KV_OK,
                 "%s", err);
    int port = kv_http_port(h);
    /* no client certificate: the ca is not used to ask for one */
    snprintf(cmd, sizeof(cmd),
             "printf 'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\nAuthorization: Bearer "
             "tok\\r\\n\\r\\n' | timeout 20 openssl s_client -quiet -connect 127.0.0.1:%d "
             "-CAfile %s 2>/dev/null",
             port, cert);
    cr_expect_eq(response(cmd, out, sizeof(out)), 200, "%s", out);
    cr_expect(strstr(out, "m path=/metrics"), "%s", out);
    /* plain HTTP to the TLS port gets no page */
    cr_expect_neq(get_h(port, "/metrics", "Authorization: Bearer tok", out, sizeof(out)), 200, "%s",
                  out);
    kv_http_close(h);
    tls_dir_remove(&td);
}

/* A client that asks to close (HTTP/1.0) and reads each reply up to its
 * Content-Length (or the server's close), as curl does: prints how many of
 * N replies arrived whole. */
static const char closing_client[] =
    "import socket, ssl, sys\n"
    "port, n = int(sys.argv[1]), int(sys.argv[2])\n"
    "ctx = ssl.create_default_context(cafile=sys.argv[3])\n"
    "ctx.check_hostname = False\n"
    "whole = 0\n"
    "for i in range(n):\n"
    "    with socket.create_connection(('127.0.0.1', port), timeout=20) as raw:\n"
    "        s = ctx.wrap_socket(raw)\n"
    "        s.sendall(b'GET /metrics HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n')\n"
    "        data = b''\n"
    "        while True:\n"
    "            head, sep, body = data.partition(b'\\r\\n\\r\\n')\n"
    "            if sep:\n"
    "                cl = [l for l in head.split(b'\\r\\n') if "
    "l.lower().startswith(b'content-length:')]\n"
    "                if cl and len(body) >= int(cl[0].split(b':')[1]):\n"
    "                    break\n"
    "            try:\n"
    "                chunk = s.recv(65536)\n"
    "            except (ssl.SSLError, OSError):\n"
    "                chunk = b''\n"
    "            if not chunk:\n"
    "                break\n"
    "            data += chunk\n"
    "        whole += data.startswith(b'HTTP/1.1 200') and data.endswith(b'm path=/metrics "
    "query=\\n')\n"
    "print(whole)\n";

/* Over TLS, replies the server closes after arrive whole, body included
 * (nng's TLS stream once dropped a queued last record on close). */
Test(http, https_closing_replies_arrive_whole, .timeout = 120)
{
    tls_dir td;
    tls_dir_make(&td);
    char cmd[1024], script[64];
    snprintf(script, sizeof(script), "%s/client.py", td.dir);
    FILE *f = fopen(script, "w");
    cr_assert_not_null(f);
    fputs(closing_client, f);
    fclose(f);
    rpc_tls t = {.cert = td.cert, .key = td.key};
    kv_http_opts o = {.tls = &t};
    kv_http_route routes[] = {{"/metrics", hello, "m"}};
    kv_http *h = NULL;
    char err[512];
    cr_assert_eq(kv_http_open(&h, "https://127.0.0.1:0", routes, 1, &o, err, sizeof(err)), KV_OK,
                 "%s", err);
    int n = 150;
    snprintf(cmd, sizeof(cmd), "python3 %s %d %d %s 2>&1", script, kv_http_port(h), n, td.cert);
    char out[4096];
    run(cmd, out, sizeof(out));
    cr_expect_eq(atoi(out), n, "replies that arrived whole, of %d: %s", n, out);
    kv_http_close(h);
    tls_dir_remove(&td);
}

Test(prom, samples_and_histograms)
{
    prom_buf b;
    prom_init(&b);
    prom_sample(&b, "hotkv_requests_total", "counter", "Requests.", "method=\"kv.Get\"", 3);
    prom_sample(&b, "hotkv_requests_total", "counter", "Requests.", "method=\"kv.Put\"", 4);
    prom_hist h = {0};
    prom_hist_observe(&h, 30000);      /* 30 us */
    prom_hist_observe(&h, 2000000);    /* 2 ms */
    prom_hist_observe(&h, 9000000000); /* 9 s: above the last bucket */
    prom_histogram(&b, "hotkv_request_seconds", "Latency.", "method=\"kv.Get\"", &h);
    cr_assert(!b.oom);
    cr_assert_not_null(b.p);
    cr_expect_eq(strstr(b.p, "# TYPE hotkv_requests_total counter") -
                     strstr(b.p, "# TYPE hotkv_requests_total counter"),
                 0);
    const char *first = strstr(b.p, "# HELP hotkv_requests_total");
    cr_expect(first && !strstr(first + 1, "# HELP hotkv_requests_total"), "HELP once:\n%s", b.p);
    cr_expect(strstr(b.p, "hotkv_requests_total{method=\"kv.Put\"} 4\n"), "%s", b.p);
    cr_expect(strstr(b.p, "hotkv_request_seconds_bucket{method=\"kv.Get\",le=\"5e-05\"} 1\n"), "%s",
              b.p);
    cr_expect(strstr(b.p, "hotkv_request_seconds_bucket{method=\"kv.Get\",le=\"0.0025\"} 2\n"),
              "%s", b.p);
    cr_expect(strstr(b.p, "hotkv_request_seconds_bucket{method=\"kv.Get\",le=\"+Inf\"} 3\n"), "%s",
              b.p);
    cr_expect(strstr(b.p, "hotkv_request_seconds_count{method=\"kv.Get\"} 3\n"), "%s", b.p);
    char esc[64];
    prom_label_escape("a\"b\\c\nd", esc, sizeof(esc));
    cr_expect_str_eq(esc, "a\\\"b\\\\c\\nd");
    prom_free(&b);
}
