/* SPDX-License-Identifier: MIT */
/* The HTTP server of /metrics, /health and the dashboard (http.h), over
 * nng's HTTP server: one nng handler per route, GET only. */
#include "proto/http.h"

#include <arpa/inet.h>
#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/prom.h"
#include "proto/stats.h"

struct kv_http {
    nng_url *url;
    nng_http_server *srv;
    nng_http_handler **handlers;
    size_t n;
    int port;
};

/* The nng handler of one route: runs its callback and answers. */
static void serve(nng_aio *aio)
{
    nng_http_req *req = nng_aio_get_input(aio, 0);
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    const kv_http_route *route = nng_http_handler_get_data(h);
    char path[1024];
    snprintf(path, sizeof(path), "%s", nng_http_req_get_uri(req));
    char *q = strchr(path, '?');
    const char *query = "";
    if (q) {
        *q = '\0';
        query = q + 1;
    }
    kv_http_res r = {0};
    route->fn(route->arg, path, query, &r);
    nng_http_res *res = NULL;
    int rv = nng_http_res_alloc(&res);
    if (rv == 0)
        rv = nng_http_res_set_status(res, (uint16_t)(r.status ? r.status : 200));
    if (rv == 0 && r.content_type)
        rv = nng_http_res_set_header(res, "Content-Type", r.content_type);
    if (rv == 0)
        rv = nng_http_res_set_header(res, "Cache-Control", "no-store");
    if (rv == 0 && r.len)
        rv = nng_http_res_copy_data(res, r.body, r.len);
    free(r.body);
    if (rv != 0) {
        nng_http_res_free(res);
        nng_aio_finish(aio, rv);
        return;
    }
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static kv_err add_route(kv_http *s, const kv_http_route *route, size_t i)
{
    nng_http_handler *h;
    char path[256];
    snprintf(path, sizeof(path), "%s", route->path);
    size_t len = strlen(path);
    bool tree = len > 1 && path[len - 1] == '/';
    if (tree)
        path[len - 1] = '\0'; /* nng matches a tree by its path without the slash */
    if (nng_http_handler_alloc(&h, path, serve) != 0)
        return KV_RESOURCE_EXHAUSTED;
    int rv = nng_http_handler_set_method(h, "GET");
    if (rv == 0 && tree)
        rv = nng_http_handler_set_tree(h);
    if (rv == 0)
        rv = nng_http_handler_set_data(h, (void *)route, NULL);
    if (rv == 0)
        rv = nng_http_server_add_handler(s->srv, h);
    if (rv != 0) {
        nng_http_handler_free(h);
        return KV_INTERNAL;
    }
    s->handlers[i] = h;
    return KV_OK;
}

kv_err kv_http_open(kv_http **out, const char *url, const kv_http_route *routes, size_t n,
                    char *err, size_t errlen)
{
    kv_http *s = calloc(1, sizeof(*s));
    if (!s || !(s->handlers = calloc(n ? n : 1, sizeof(*s->handlers)))) {
        free(s);
        return KV_RESOURCE_EXHAUSTED;
    }
    s->n = n;
    kv_err rv = KV_OK;
    if (strncmp(url, "http://", 7) != 0 || nng_url_parse(&s->url, url) != 0) {
        snprintf(err, errlen, "bad --http-listen '%s' (want http://HOST:PORT)", url);
        rv = KV_INVALID_ARGUMENT;
    } else if (nng_http_server_hold(&s->srv, s->url) != 0) {
        snprintf(err, errlen, "cannot create an HTTP server for %s", url);
        rv = KV_INTERNAL;
    }
    for (size_t i = 0; rv == KV_OK && i < n; i++)
        rv = add_route(s, &routes[i], i);
    int nrv = rv == KV_OK ? nng_http_server_start(s->srv) : 0;
    nng_sockaddr sa;
    if (rv == KV_OK && nrv != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", url, nng_strerror(nrv));
        rv = KV_UNAVAILABLE;
    } else if (rv == KV_OK && nng_http_server_get_addr(s->srv, &sa) == 0) {
        s->port = sa.s_family == NNG_AF_INET ? ntohs(sa.s_in.sa_port) : ntohs(sa.s_in6.sa_port);
    }
    if (rv != KV_OK) {
        kv_http_close(s);
        return rv;
    }
    *out = s;
    return KV_OK;
}

int kv_http_port(const kv_http *h)
{
    return h->port;
}

void kv_http_close(kv_http *h)
{
    if (!h)
        return;
    if (h->srv) {
        nng_http_server_stop(h->srv);
        for (size_t i = 0; i < h->n; i++)
            if (h->handlers[i])
                nng_http_server_del_handler(h->srv, h->handlers[i]);
        nng_http_server_release(h->srv);
    }
    for (size_t i = 0; i < h->n; i++)
        if (h->handlers[i])
            nng_http_handler_free(h->handlers[i]);
    if (h->url)
        nng_url_free(h->url);
    free(h->handlers);
    free(h);
}

void kv_http_metrics_res(kv_http_res *res, const kv_stats *l)
{
    prom_buf b;
    prom_init(&b);
    kv_stats_to_prom(l, &b);
    if (b.oom || l->oom) {
        prom_free(&b);
        res->status = 500;
        return;
    }
    res->content_type = "text/plain; version=0.0.4; charset=utf-8";
    res->body = b.p;
    res->len = b.len;
}
