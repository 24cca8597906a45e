/* SPDX-License-Identifier: MIT */
/*
 * A small HTTP server for /metrics, /health and a router's dashboard, over
 * nng's HTTP server (no extra dependency). Routes are exact paths, or path
 * prefixes (a trailing '/' in the route, e.g. "/api/"); each is served by a
 * callback that fills a response. Callbacks run on nng's threads: they must
 * not block for long (they read counters and take short locks).
 *
 * With a token (kv_http_opts.token), every route not marked open answers
 * 401 unless the request carries "Authorization: Bearer TOKEN" or the query
 * parameter token=TOKEN (percent-encoded; for a browser's first page load);
 * the comparison takes the same time whatever prefix matches. An https://
 * URL serves TLS with the process's certificate and key (kv_http_opts.tls;
 * clients are not asked for certificates: the token authenticates them).
 */
#ifndef KV_PROTO_HTTP_H
#define KV_PROTO_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "kv/kv_err.h"

typedef struct kv_http kv_http;

/* What a route answers. body: malloc'ed by the callback, freed by the
 * server (may be NULL for an empty body). content_type: a literal. */
typedef struct kv_http_res {
    int status; /* 200 when left 0 */
    const char *content_type;
    char *body;
    size_t len;
} kv_http_res;

/* path: the request's path (no query); query: after '?', "" when none. */
typedef void (*kv_http_fn)(void *arg, const char *path, const char *query, kv_http_res *res);

typedef struct kv_http_route {
    const char *path; /* "/metrics", or "/api/" for every path under it */
    kv_http_fn fn;
    void *arg;
    bool open; /* served without the token (/health, for load balancers and probes) */
} kv_http_route;

struct rpc_tls;
typedef struct kv_http_opts {
    const char *token;         /* NULL or "" = no token: every route is open */
    const struct rpc_tls *tls; /* https://: its cert and key (ca is not used) */
} kv_http_opts;

/* Serves the routes on url ("http://HOST:PORT" or "https://HOST:PORT";
 * port 0 picks a free one). GET only (others get 405). opts may be NULL.
 * Returns KV_OK and *out, INVALID_ARGUMENT for a bad url or https:// without
 * a certificate and key, UNAVAILABLE when the address cannot be bound; err
 * gets a message. The routes array, its strings, the token and the TLS
 * settings must outlive the server. */
kv_err kv_http_open(kv_http **out, const char *url, const kv_http_route *routes, size_t n,
                    const kv_http_opts *opts, char *err, size_t errlen);
/* Fills res with l's metrics as a /metrics page (Prometheus text 0.0.4);
 * 500 when out of memory. l stays the caller's. */
struct kv_stats;
void kv_http_metrics_res(kv_http_res *res, const struct kv_stats *l);

/* The bound TCP port. */
int kv_http_port(const kv_http *h);
/* Stops serving and frees; NULL is a no-op. Not from a route callback. */
void kv_http_close(kv_http *h);

#endif
