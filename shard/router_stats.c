/* SPDX-License-Identifier: MIT */
/*
 * kvrouter's statistics: one typed list (proto/stats.h) for admin.Stats and
 * /metrics (hotkv_router_*), forwards counted per target node, and the
 * HTTP listener of --http-listen: /metrics, /health and the dashboard
 * (router_dash.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "shard/router.h"

fan_ctr *router_target_ctr(void *user, const char *id)
{
    router *r = user;
    if (!r->targets)
        return NULL;
    size_t n = atomic_load_explicit(&r->ntargets, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (strcmp(r->targets[i].id, id) == 0)
            return &r->targets[i].ctr;
    pthread_mutex_lock(&r->targets_mu);
    n = atomic_load_explicit(&r->ntargets, memory_order_relaxed);
    fan_ctr *c = NULL;
    for (size_t i = 0; i < n && !c; i++) /* another thread may have added it */
        if (strcmp(r->targets[i].id, id) == 0)
            c = &r->targets[i].ctr;
    if (!c && n < ROUTER_MAX_TARGETS) {
        snprintf(r->targets[n].id, sizeof(r->targets[n].id), "%s", id);
        c = &r->targets[n].ctr;
        atomic_store_explicit(&r->ntargets, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&r->targets_mu);
    return c;
}

static void target_stats(router *r, kv_stats *l)
{
    size_t n = r->targets ? atomic_load_explicit(&r->ntargets, memory_order_acquire) : 0;
    for (size_t i = 0; i < n; i++) {
        const router_target *t = &r->targets[i];
        char lab[CMAP_MAX_ID + 32], key[CMAP_MAX_ID + 32];
        kv_stat_label(lab, sizeof(lab), "node", t->id);
        snprintf(key, sizeof(key), "forwards.%s", t->id);
        kv_stat_counter(l, key, "hotkv_router_forwards_total", lab,
                        "Requests forwarded to a node (replica calls), by target node.",
                        atomic_load(&t->ctr.calls));
        snprintf(key, sizeof(key), "forward_errors.%s", t->id);
        kv_stat_counter(l, key, "hotkv_router_forward_errors_total", lab,
                        "Forwards that got no answer from the node (unavailable, deadline "
                        "exceeded, cancelled), by target node.",
                        atomic_load(&t->ctr.errors));
        snprintf(key, sizeof(key), "forward_latency.%s", t->id);
        kv_stat_hist(l, key, "hotkv_router_forward_duration_seconds", lab,
                     "Time from a forward's send to its reply, by target node.", &t->ctr.lat);
    }
}

void router_collect_stats(router *r, const rpc_server *srv, kv_stats *l)
{
    kv_stats_add(l, &(kv_stat){.kind = KV_STAT_COUNTER,
                               .key = "uptime_ms",
                               .metric = "hotkv_router_uptime_seconds_total",
                               .help = "Time since the router started.",
                               .u = (kv_now_ns() - r->started_ns) / 1000000ull,
                               .scale = 1e-3});
    kv_stat_gauge(l, "map_epoch", "hotkv_router_map_epoch", NULL,
                  "Epoch of the router's cluster map (0 = none yet).", cmap_slot_epoch(r->maps));
    kv_stat_counter(l, "requests", NULL, NULL, NULL, atomic_load(&r->requests));
    kv_stat_counter(l, "forwards", NULL, NULL, NULL, atomic_load(&r->stats.forwards));
    kv_stat_counter(l, "forward_errors", "hotkv_router_requests_failed_total", NULL,
                    "Requests that failed for want of replica acknowledgements.",
                    atomic_load(&r->stats.forward_errors));
    kv_stat_counter(l, "map_refreshes", "hotkv_router_map_installs_total", NULL,
                    "Cluster maps installed.", atomic_load(&r->map_refreshes));
    kv_stat_counter(l, "maps_refused", "hotkv_router_maps_refused_total", NULL,
                    "Cluster maps from nodes that the router refused (failed vetting).",
                    atomic_load(&r->maps_refused));
    kv_stat_text(l, "hot.detection", "%s", r->hot ? "on" : "off");
    kv_stat_gauge(l, "hot.tracked", "hotkv_router_hot_keys_tracked", NULL,
                  "Hot keys in the router's last detection window report.",
                  atomic_load(&r->hot_reported));
    kv_stat_counter(l, "hot.cache_hits", "hotkv_router_hot_cache_hits_total", NULL,
                    "Reads served from the router's hot-key cache.", router_mit_hits(r->mit));
    kv_stat_counter(l, "hints_sent", "hotkv_router_hints_sent_total", NULL,
                    "Hinted records sent for unreachable replicas.",
                    atomic_load(&r->stats.hints_sent));
    kv_stat_counter(l, "hint_errors", "hotkv_router_hint_errors_total", NULL,
                    "Hints that could not be stored.", atomic_load(&r->stats.hint_errors));
    kv_stat_counter(l, "read_repairs", "hotkv_router_read_repairs_total", NULL,
                    "Read repairs sent to stale replicas.", atomic_load(&r->stats.read_repairs));
    kv_stat_counter(l, "writes_skipped_down", "hotkv_router_writes_skipped_down_total", NULL,
                    "Writes not sent to a node the failure detector holds down (hinted).",
                    atomic_load(&r->stats.skipped_down));
    router_probe_stats(r, l);
    target_stats(r, l);
    rpc_server_stats(srv, l, "hotkv_router");
    rpc_metrics_stats(r->metrics, l, "hotkv_router");
}

bool router_healthy(router *r, char *detail, size_t len)
{
    cmap *m = cmap_slot_get(r->maps);
    if (!m) {
        snprintf(detail, len, "no cluster map yet (seeds %s)", r->cfg.seeds ? r->cfg.seeds : "");
        return false;
    }
    size_t up = 0, n = cmap_node_count(m);
    for (size_t i = 0; i < n; i++) {
        uint64_t since;
        double rtt;
        const char *v = router_probe_view(r, cmap_node_at(m, i)->id, &since, &rtt);
        up += strcmp(v, "down") != 0 && strcmp(v, "unknown") != 0;
    }
    bool probing = r->probe != NULL && r->cfg.probe_ms > 0;
    if (!probing) /* no failure detector: the map is all we know */
        up = n;
    snprintf(detail, len, "map epoch %llu, %zu of %zu nodes reachable",
             (unsigned long long)cmap_epoch(m), up, n);
    cmap_unref(m);
    return up > 0;
}

/* ---- HTTP -------------------------------------------------------------- */

static void h_metrics(void *arg, const char *path, const char *query, kv_http_res *res)
{
    router *r = arg;
    kv_stats l;
    kv_stats_init(&l);
    router_collect_stats(r, r->rpc, &l);
    kv_http_metrics_res(res, &l);
    kv_stats_free(&l);
}

static void h_health(void *arg, const char *path, const char *query, kv_http_res *res)
{
    router *r = arg;
    char why[256];
    bool ok = router_healthy(r, why, sizeof(why));
    char *body = malloc(512);
    if (!body) {
        res->status = 500;
        return;
    }
    /* why holds ids and numbers only: no character to escape but quotes */
    for (char *p = why; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
            *p = ' ';
    int len = snprintf(body, 512, "{\"status\":\"%s\",\"role\":\"router\",\"detail\":\"%s\"}\n",
                       ok ? "serving" : "unavailable", why);
    res->status = ok ? 200 : 503;
    res->content_type = "application/json";
    res->body = body;
    res->len = (size_t)len;
}

kv_err router_http_start(router *r, char *err, size_t errlen)
{
    if (!r->cfg.http_listen || !*r->cfg.http_listen)
        return KV_OK;
    kv_http_route *routes = r->http_routes;
    size_t n = 0;
    routes[n++] = (kv_http_route){"/metrics", h_metrics, r};
    routes[n++] = (kv_http_route){"/health", h_health, r, .open = true};
    kv_err rv = router_dash_start(r);
    if (rv != KV_OK) {
        snprintf(err, errlen, "cannot start the dashboard's sampler");
        return rv;
    }
    n += router_dash_routes(r, routes + n, sizeof(r->http_routes) / sizeof(routes[0]) - n);
    kv_http_opts ho = {.token = r->cfg.sec.http_token, .tls = rpc_sec_tls(&r->cfg.sec)};
    rv = kv_http_open(&r->http, r->cfg.http_listen, routes, n, &ho, err, errlen);
    if (rv == KV_OK)
        KV_INFO("router", "HTTP on %s (port %d): /metrics, /health, dashboard at /",
                r->cfg.http_listen, kv_http_port(r->http));
    return rv;
}

void router_http_stop(router *r)
{
    kv_http_close(r->http);
    r->http = NULL;
    router_dash_stop(r);
}
