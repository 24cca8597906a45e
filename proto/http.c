/* SPDX-License-Identifier: MIT */
/* The HTTP server of /metrics, /health and the dashboard (http.h), over
 * nng's HTTP server: one nng handler per route, GET only. */
#include "proto/http.h"

#include <arpa/inet.h>
#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "proto/prom.h"
#include "proto/rpc_tls.h"
#include "proto/stats.h"

struct kv_http {
    nng_url *url;
    nng_http_server *srv;
    nng_http_handler **handlers;
    size_t n;
    int port;
    const char *token; /* NULL = every route open */
    bool tls;
    /* Hijacked https exchanges still writing or lingering (see
     * answer_and_linger); kv_http_close cancels them and waits. */
    nng_mtx *mtx;
    nng_cv *cv;
    struct http_linger *lingering;
    bool closing;
};

/* A handler's data: its route and the server (for the token). */
typedef struct http_route_ref {
    const kv_http_route *route;
    kv_http *srv;
} http_route_ref;

static int hexval(char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* The value of parameter name in query, percent-decoded into out (at most
 * cap bytes, '+' as a space); its length, or -1 when absent or too long. */
static long query_param(const char *query, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = query, *amp; p && *p; p = (amp = strchr(p, '&')) ? amp + 1 : NULL) {
        if (strncmp(p, name, nl) != 0 || p[nl] != '=')
            continue;
        size_t n = 0;
        for (const char *v = p + nl + 1; *v && *v != '&'; v++) {
            if (n == cap)
                return -1;
            if (*v == '%' && hexval(v[1]) >= 0 && hexval(v[2]) >= 0) {
                out[n++] = (char)(hexval(v[1]) * 16 + hexval(v[2]));
                v += 2;
            } else {
                out[n++] = *v == '+' ? ' ' : *v;
            }
        }
        return (long)n;
    }
    return -1;
}

/* Whether the request carries the server's token (or needs none). */
static bool authorized(const kv_http *s, const kv_http_route *route, nng_http_req *req,
                       const char *query)
{
    if (!s->token || route->open)
        return true;
    const char *h = nng_http_req_get_header(req, "Authorization");
    if (h && strncasecmp(h, "Bearer ", 7) == 0) {
        const char *t = h + 7;
        while (*t == ' ')
            t++;
        return rpc_token_eq(t, strlen(t), s->token);
    }
    char tok[4097];
    long n = query_param(query, "token", tok, sizeof(tok) - 1);
    bool ok = n >= 0 && rpc_token_eq(tok, (size_t)n, s->token);
    memset(tok, 0, sizeof(tok));
    return ok;
}

static const char unauthorized_body[] =
    "401 Unauthorized: this listener needs the HTTP token (--http-token): send "
    "\"Authorization: Bearer TOKEN\" or add ?token=TOKEN to the URL\n";

/*
 * nng 1.5.2's TLS stream closes the TCP stream at once on close, dropping
 * ciphertext still queued in its send ring (a record queued while the
 * previous one's send callback has not yet run), and nng's HTTP server
 * closes right after the last write of a "Connection: close" exchange
 * (HTTP/1.0, or that header). Over https such a reply could lose its body
 * (seen: the headers arrived, the body did not; 1 run in 60). So for those
 * exchanges a route takes the connection over (nng_http_hijack) and answers
 * itself: one write of the whole reply, then a lingering close, reading
 * until the client closes or HTTP_LINGER_MS pass, which gives the TLS layer
 * time to send what it queued; then it closes. Plain http and keep-alive
 * exchanges stay with nng's server.
 */
#define HTTP_LINGER_MS 1000

typedef struct http_linger {
    struct http_linger *next;
    kv_http *srv;
    nng_http_conn *conn;
    nng_http_req *req;
    nng_aio *aio;
    char *buf;
    bool reading;      /* the reply is written; reading until the deadline */
    nng_time deadline; /* when the lingering close ends */
    char sink[256];
} http_linger;

static void linger_cb(void *arg)
{
    http_linger *l = arg;
    kv_http *s = l->srv;
    int rv = nng_aio_result(l->aio);
    nng_time now = nng_clock();
    nng_mtx_lock(s->mtx);
    if (rv == 0 && !l->reading) { /* the reply is written: linger from now */
        l->reading = true;
        l->deadline = now + HTTP_LINGER_MS;
    }
    if (rv == 0 && !s->closing && now < l->deadline) {
        /* the reply is written (first call) or the client sent more: read
         * on until it closes or the deadline passes */
        nng_iov iov = {.iov_buf = l->sink, .iov_len = sizeof(l->sink)};
        nng_aio_set_iov(l->aio, 1, &iov);
        nng_aio_set_timeout(l->aio, (nng_duration)(l->deadline - now));
        nng_http_conn_read(l->conn, l->aio);
        nng_mtx_unlock(s->mtx);
        return;
    }
    for (http_linger **p = &s->lingering; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    if (!s->lingering)
        nng_cv_wake(s->cv);
    nng_mtx_unlock(s->mtx); /* s may be freed from here on */
    nng_http_conn_close(l->conn);
    nng_http_req_free(l->req);
    free(l->buf);
    nng_aio_reap(l->aio); /* not nng_aio_free: this is its callback */
    free(l);
}

/* Answers the exchange on conn itself (see above): takes over conn and req
 * and completes aio. False (nothing taken over) when out of memory. */
static bool answer_and_linger(kv_http *s, nng_aio *aio, nng_http_req *req, nng_http_res *res,
                              const char *extra, const kv_http_res *r)
{
    nng_http_conn *conn = nng_aio_get_input(aio, 2);
    http_linger *l = calloc(1, sizeof(*l));
    const char *reason = nng_http_res_get_reason(res);
    size_t cap = 160 + strlen(reason) + (extra ? strlen(extra) : 0) +
                 (r->content_type ? strlen(r->content_type) : 0) + r->len;
    if (!l || !conn || !(l->buf = malloc(cap)) || nng_aio_alloc(&l->aio, linger_cb, l) != 0) {
        if (l)
            free(l->buf);
        free(l);
        return false;
    }
    bool head = strcmp(nng_http_req_get_method(req), "HEAD") == 0;
    int n = snprintf(l->buf, cap,
                     "HTTP/1.1 %u %s\r\n%s%s%s%sCache-Control: no-store\r\nContent-Length: "
                     "%zu\r\nConnection: close\r\n\r\n",
                     (unsigned)nng_http_res_get_status(res), reason, extra ? extra : "",
                     r->content_type ? "Content-Type: " : "",
                     r->content_type ? r->content_type : "", r->content_type ? "\r\n" : "", r->len);
    size_t len = (size_t)n; /* < cap - r->len: the fixed text is under 160 bytes */
    if (!head && r->len) {
        memcpy(l->buf + len, r->body, r->len);
        len += r->len;
    }
    nng_http_hijack(conn);
    l->srv = s;
    l->conn = conn;
    l->req = req;
    nng_mtx_lock(s->mtx);
    l->next = s->lingering;
    s->lingering = l;
    nng_iov iov = {.iov_buf = l->buf, .iov_len = len};
    nng_aio_set_iov(l->aio, 1, &iov);
    nng_aio_set_timeout(l->aio, 10000); /* a client that reads nothing */
    nng_http_conn_write_all(conn, l->aio);
    nng_mtx_unlock(s->mtx);
    nng_aio_finish(aio, 0); /* no response: the server forgets the connection */
    return true;
}

/* Whether the exchange ends with the connection (HTTP/1.0, or the client
 * asked to close): nng's own rule. */
static bool closes(nng_http_req *req)
{
    const char *v = nng_http_req_get_version(req);
    const char *c = nng_http_req_get_header(req, "Connection");
    if (!v || strcmp(v, "HTTP/1.1") != 0)
        return true;
    for (; c && *c; c++)
        if (strncasecmp(c, "close", 5) == 0)
            return true;
    return false;
}

/* The nng handler of one route: runs its callback and answers. */
static void serve(nng_aio *aio)
{
    nng_http_req *req = nng_aio_get_input(aio, 0);
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    const http_route_ref *ref = nng_http_handler_get_data(h);
    const kv_http_route *route = ref->route;
    char path[1024];
    snprintf(path, sizeof(path), "%s", nng_http_req_get_uri(req));
    char *q = strchr(path, '?');
    const char *query = "";
    if (q) {
        *q = '\0';
        query = q + 1;
    }
    kv_http_res r = {0};
    bool ok = authorized(ref->srv, route, req, query);
    if (ok) {
        route->fn(route->arg, path, query, &r);
    } else {
        r.status = 401;
        r.content_type = "text/plain; charset=utf-8";
        r.body = strdup(unauthorized_body);
        r.len = r.body ? strlen(r.body) : 0;
    }
    nng_http_res *res = NULL;
    int rv = nng_http_res_alloc(&res);
    if (rv == 0)
        rv = nng_http_res_set_status(res, (uint16_t)(r.status ? r.status : 200));
    if (rv == 0 && ref->srv->tls && closes(req) &&
        answer_and_linger(ref->srv, aio, req, res,
                          ok ? NULL : "WWW-Authenticate: Bearer realm=\"hotkv\"\r\n", &r)) {
        nng_http_res_free(res);
        free(r.body);
        return;
    }
    if (rv == 0 && !ok)
        rv = nng_http_res_set_header(res, "WWW-Authenticate", "Bearer realm=\"hotkv\"");
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
    http_route_ref *ref = malloc(sizeof(*ref));
    if (!ref)
        return KV_RESOURCE_EXHAUSTED;
    *ref = (http_route_ref){route, s};
    nng_http_handler *h;
    char path[256];
    snprintf(path, sizeof(path), "%s", route->path);
    size_t len = strlen(path);
    bool tree = len > 1 && path[len - 1] == '/';
    if (tree)
        path[len - 1] = '\0'; /* nng matches a tree by its path without the slash */
    if (nng_http_handler_alloc(&h, path, serve) != 0) {
        free(ref);
        return KV_RESOURCE_EXHAUSTED;
    }
    int rv = nng_http_handler_set_method(h, "GET");
    if (rv == 0 && tree)
        rv = nng_http_handler_set_tree(h);
    if (rv == 0)
        rv = nng_http_handler_set_data(h, ref, free); /* the handler frees ref */
    else
        free(ref);
    if (rv == 0)
        rv = nng_http_server_add_handler(s->srv, h);
    if (rv != 0) {
        nng_http_handler_free(h);
        return KV_INTERNAL;
    }
    s->handlers[i] = h;
    return KV_OK;
}

/* The TLS configuration of an https:// server (certificate and key, no
 * client authentication). */
static kv_err set_tls(kv_http *s, const char *url, const rpc_tls *t, char *err, size_t errlen)
{
    if (!t || !t->cert || !t->key) {
        snprintf(err, errlen, "--http-listen %s needs --tls-cert and --tls-key", url);
        return KV_INVALID_ARGUMENT;
    }
    rpc_tls server = {.cert = t->cert, .key = t->key}; /* no ca: browsers have no certificate */
    nng_tls_config *cfg = NULL;
    char why[400];
    if (rpc_tls_config(&server, true, &cfg, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "--http-listen %s: %s", url, why);
        return KV_INVALID_ARGUMENT;
    }
    int rv = nng_http_server_set_tls(s->srv, cfg);
    nng_tls_config_free(cfg); /* the server holds its own reference */
    if (rv != 0) {
        snprintf(err, errlen, "--http-listen %s: TLS: %s", url, nng_strerror(rv));
        return KV_INTERNAL;
    }
    return KV_OK;
}

kv_err kv_http_open(kv_http **out, const char *url, const kv_http_route *routes, size_t n,
                    const kv_http_opts *opts, char *err, size_t errlen)
{
    kv_http *s = calloc(1, sizeof(*s));
    if (!s || !(s->handlers = calloc(n ? n : 1, sizeof(*s->handlers)))) {
        free(s);
        return KV_RESOURCE_EXHAUSTED;
    }
    s->n = n;
    if (nng_mtx_alloc(&s->mtx) != 0 || nng_cv_alloc(&s->cv, s->mtx) != 0) {
        kv_http_close(s);
        return KV_RESOURCE_EXHAUSTED;
    }
    s->token = opts && opts->token && *opts->token ? opts->token : NULL;
    bool https = strncmp(url, "https://", 8) == 0;
    s->tls = https;
    kv_err rv = KV_OK;
    if ((!https && strncmp(url, "http://", 7) != 0) || nng_url_parse(&s->url, url) != 0) {
        snprintf(err, errlen, "bad --http-listen '%s' (want http://HOST:PORT or https://HOST:PORT)",
                 url);
        rv = KV_INVALID_ARGUMENT;
    } else if (nng_http_server_hold(&s->srv, s->url) != 0) {
        snprintf(err, errlen, "cannot create an HTTP server for %s", url);
        rv = KV_INTERNAL;
    } else if (https) {
        rv = set_tls(s, url, opts ? opts->tls : NULL, err, errlen);
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
    if (h->mtx) {
        nng_mtx_lock(h->mtx);
        h->closing = true;
        for (http_linger *l = h->lingering; l; l = l->next)
            nng_aio_cancel(l->aio);
        while (h->lingering)
            nng_cv_wait(h->cv);
        nng_mtx_unlock(h->mtx);
    }
    if (h->cv)
        nng_cv_free(h->cv);
    if (h->mtx)
        nng_mtx_free(h->mtx);
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
