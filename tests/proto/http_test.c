/* SPDX-License-Identifier: MIT */
/* The HTTP server (proto/http.c) and the Prometheus text format
 * (proto/prom.c): routes, prefixes, 404/405, bad URLs, histogram output. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/http.h"
#include "proto/prom.h"

static void hello(void *arg, const char *path, const char *query, kv_http_res *res)
{
    char buf[256];
    int n = snprintf(buf, sizeof(buf), "%s path=%s query=%s\n", (const char *)arg, path, query);
    res->body = strdup(buf);
    res->len = (size_t)n;
    res->content_type = "text/plain";
    res->status = strcmp(query, "fail") == 0 ? 503 : 200;
}

/* GET url with curl-free plain sockets: returns the status, body in out. */
static int get(int port, const char *path, char *out, size_t len)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "exec 3<>/dev/tcp/127.0.0.1/%d && printf 'GET %s HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n' "
             ">&3 && cat <&3",
             port, path);
    char full[1024];
    snprintf(full, sizeof(full), "bash -c \"%s\"", cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    pclose(p);
    int status = 0;
    sscanf(out, "HTTP/1.%*d %d", &status);
    return status;
}

Test(http, routes_prefixes_and_errors)
{
    kv_http_route routes[] = {{"/metrics", hello, "m"}, {"/api/", hello, "a"}};
    kv_http *h = NULL;
    char err[256];
    cr_assert_eq(kv_http_open(&h, "http://127.0.0.1:0", routes, 2, err, sizeof(err)), KV_OK, "%s",
                 err);
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
    cr_expect_eq(kv_http_open(&h, "tcp://127.0.0.1:0", routes, 2, err, sizeof(err)),
                 KV_INVALID_ARGUMENT);
    cr_expect(strstr(err, "http://HOST:PORT"), "%s", err);
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
