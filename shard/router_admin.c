/* SPDX-License-Identifier: MIT */
/*
 * kvrouter control path: node channels, cluster-map discovery and refresh
 * (from the seeds and the map's own nodes), admin.Ping/Stats/GetMap, and the
 * router's start/stop.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "proto/statlist.h"
#include "proto/stats.h"
#include "shard/router.h"

rpc_chan *router_chan(router *r, const char *addr)
{
    return rpc_pool_get(r->peers, addr);
}

/* Installs m, from the peer at from, if newer and trustworthy (cmap_vet);
 * true when the peer's map is usable (installed or not newer). */
static bool install_from(router *r, cmap *m, const char *from, bool verified)
{
    cmap *cur = cmap_slot_get(r->maps);
    char why[200];
    bool newer = !cur || cmap_epoch(m) > cmap_epoch(cur);
    kv_err rv =
        newer ? cmap_vet(cur, m, from, verified, r->cfg.sec.map_key, why, sizeof(why)) : KV_OK;
    cmap_unref(cur);
    if (rv != KV_OK) {
        atomic_fetch_add(&r->maps_refused, 1);
        KV_WARN("router", "refused cluster map epoch %llu from %s: %s%s",
                (unsigned long long)cmap_epoch(m), from, why,
                r->cfg.sec.map_key ? ""
                                   : " (--map-key-file, or TLS with --tls-ca, makes maps "
                                     "from peers verifiable)");
        return false;
    }
    if (newer && cmap_slot_install(r->maps, m) == KV_OK) {
        router_probe_map_changed(r, NULL, m);
        atomic_fetch_add(&r->map_refreshes, 1);
        KV_INFO("router", "cluster map epoch %llu from %s (%zu nodes, rf %u)",
                (unsigned long long)cmap_epoch(m), from, cmap_node_count(m), cmap_rf(m));
    }
    return true;
}

void router_learn_map(router *r, const rpc_reply *rep, const char *from)
{
    cmap *m = NULL;
    char err[256];
    if (cmap_decode(rep->body, rep->len, &m, err, sizeof(err)) != KV_OK) {
        KV_WARN("router", "node %s sent an undecodable map: %s", from, err);
        return;
    }
    install_from(r, m, from, rep->verified);
    cmap_unref(m);
}

/* Asks one address for its map; installs it if newer. */
static bool fetch_from(router *r, const char *addr)
{
    rpc_chan *ch = router_chan(r, addr);
    if (!ch)
        return false;
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply rep;
    bool got = false;
    if (rpc_call(ch, "admin.GetMap", 0, &req.base, 1000, &rep) == KV_OK) {
        Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, rep.len, rep.body);
        cmap *m = NULL;
        char err[256];
        if (g && g->has_map && g->map && cmap_from_pb(g->map, &m, err, sizeof(err)) == KV_OK) {
            got = install_from(r, m, addr, rep.verified);
            cmap_unref(m);
        }
        if (g)
            kv__get_map_reply__free_unpacked(g, NULL);
    }
    rpc_reply_free(&rep);
    return got;
}

kv_err router_refresh_map(router *r)
{
    cmap *m = cmap_slot_get(r->maps);
    bool got = false;
    for (size_t i = 0; m && !got && i < cmap_node_count(m); i++)
        got = fetch_from(r, cmap_node_at(m, i)->addr);
    cmap_unref(m);
    char *seeds = strdup(r->cfg.seeds ? r->cfg.seeds : "");
    char *save = NULL;
    for (char *s = strtok_r(seeds, ",", &save); !got && s; s = strtok_r(NULL, ",", &save))
        got = fetch_from(r, s);
    free(seeds);
    return cmap_slot_epoch(r->maps) ? KV_OK : KV_UNAVAILABLE;
}

static void *refresher_main(void *arg)
{
    router *r = arg;
    uint64_t last_warn = 0;
    while (!atomic_load(&r->stopping)) {
        if (router_refresh_map(r) != KV_OK && kv_now_ns() - last_warn > 5000000000ull) {
            KV_WARN("router", "no cluster map yet from seeds %s; retrying", r->cfg.seeds);
            last_warn = kv_now_ns();
        }
        long wait = cmap_slot_epoch(r->maps) ? r->cfg.refresh_ms : 200;
        for (long t = 0; t < wait && !atomic_load(&r->stopping); t += 50) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

kv_err router_h_ping(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    Kv__PingReply rep = KV__PING_REPLY__INIT;
    rep.id = "router";
    rep.role = "router";
    rep.map_epoch = cmap_slot_epoch(r->maps);
    rep.uptime_ms = (kv_now_ns() - r->started_ns) / 1000000ull;
    c->reply_epoch = rep.map_epoch;
    return rpc_reply_msg(c, &rep.base);
}

kv_err router_h_get_map(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    Kv__GetMapReply rep = KV__GET_MAP_REPLY__INIT;
    cmap *m = cmap_slot_get(r->maps);
    Kv__ClusterMap *pb = NULL;
    kv_err rv = m ? cmap_to_pb(m, &pb) : KV_OK;
    if (rv == KV_OK) {
        rep.has_map = m != NULL;
        rep.map = pb;
        c->reply_epoch = m ? cmap_epoch(m) : 0;
        rv = rpc_reply_msg(c, &rep.base);
    }
    if (pb)
        kv__cluster_map__free_unpacked(pb, NULL);
    cmap_unref(m);
    return rv;
}

/* admin.Stats with node_id: fetch it from that node. */
static kv_err proxy_stats(router *r, rpc_ctx *c, const Kv__StatsRequest *req)
{
    cmap *m = cmap_slot_get(r->maps);
    int i = m ? cmap_find(m, req->node_id) : -1;
    if (i < 0) {
        cmap_unref(m);
        return rpc_fail(c, KV_NOT_FOUND, "no node '%s' in the cluster map", req->node_id);
    }
    rpc_chan *ch = router_chan(r, cmap_node_at(m, (size_t)i)->addr);
    cmap_unref(m);
    rpc_reply rep = {0};
    kv_err rv = ch ? rpc_call(ch, "admin.Stats", 0, &req->base, repl_forward_deadline(c), &rep)
                   : KV_UNAVAILABLE;
    if (rv == KV_OK) {
        c->reply = rep.body;
        c->reply_len = rep.len;
        rep.body = NULL;
    } else {
        rpc_fail(c, rv == KV_DEADLINE_EXCEEDED ? KV_UNAVAILABLE : rv, "node %s: %s", req->node_id,
                 rep.message ? rep.message : kv_strerror(rv));
        rv = rv == KV_DEADLINE_EXCEEDED ? KV_UNAVAILABLE : rv;
    }
    rpc_reply_free(&rep);
    return rv;
}

kv_err router_h_stats(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    Kv__StatsRequest *req = kv__stats_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__StatsRequest body");
    if (req->node_id && *req->node_id) {
        kv_err rv = proxy_stats(r, c, req);
        kv__stats_request__free_unpacked(req, NULL);
        return rv;
    }
    kv__stats_request__free_unpacked(req, NULL);
    kv_stats ks;
    kv_stats_init(&ks);
    router_collect_stats(r, c->server, &ks);
    rpc_statlist l;
    rpc_stats_init(&l);
    kv_stats_to_statlist(&ks, &l);
    kv_stats_free(&ks);
    Kv__StatsReply rep = KV__STATS_REPLY__INIT;
    rep.id = "router";
    rep.role = "router";
    rep.n_stats = l.n;
    rep.stats = l.ptrs;
    kv_err rv =
        l.oom ? rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory") : rpc_reply_msg(c, &rep.base);
    rpc_stats_free(&l);
    return rv;
}

static const rpc_method router_methods[] = {
    {"kv.Get", NULL, router_get_start, router_finish, RPC_DATA, .start_async = router_get_async},
    {"kv.Put", NULL, router_put_start, router_finish, RPC_DATA, .start_async = router_put_async},
    {"kv.Delete", NULL, router_delete_start, router_finish, RPC_DATA,
     .start_async = router_delete_async},
    {"kv.Batch", router_h_batch, .access = RPC_DATA},
    {"kv.Scan", router_h_scan, .access = RPC_DATA},
    {"admin.Ping", router_h_ping, .access = RPC_DATA},
    {"admin.GetMap", router_h_get_map, .access = RPC_DATA},
    {"admin.Stats", router_h_stats}, /* admin credentials (rpc.h) */
    {"admin.HotKeys", router_h_hot_keys},
};

static rpc_chan *env_chan(void *user, const char *addr)
{
    return router_chan(user, addr);
}

static void env_learn_map(void *user, const rpc_reply *r, const char *from)
{
    router_learn_map(user, r, from);
}

/* What the handlers need, without threads or a listener: the channel pool,
 * the map slot, the replication environment and the prober's table (the
 * fuzz harness builds its router with this alone). */
static kv_err router_core_init(router *r, char *err, size_t errlen)
{
    kv_err rv;
    r->started_ns = kv_now_ns();
    rpc_chan_opts co = {.auth = rpc_sec_token(&r->cfg.sec),
                        .tls = rpc_sec_tls(&r->cfg.sec),
                        .recv_max = kv_limits_recv_max(&r->cfg.limits)};
    if ((rv = rpc_pool_create(&r->peers, &co)) != KV_OK ||
        (rv = cmap_slot_create(&r->maps)) != KV_OK)
        return rv;
    r->env = (repl_env){.user = r,
                        .maps = r->maps,
                        .hlc = &r->hlc,
                        .stats = &r->stats,
                        .stopping = &r->stopping,
                        .chan = env_chan,
                        .learn_map = env_learn_map,
                        .target_ctr = router_target_ctr};
    pthread_mutex_init(&r->targets_mu, NULL);
    if (!(r->targets = calloc(ROUTER_MAX_TARGETS, sizeof(*r->targets))))
        return KV_RESOURCE_EXHAUSTED;
    /* the prober's table exists before the refresher, which uses it */
    if ((rv = router_probe_start(r)) != KV_OK)
        snprintf(err, errlen, "cannot start the failure detector");
    return rv;
}

kv_err router_start(router *r, char *err, size_t errlen)
{
    kv_err rv = router_core_init(r, err, errlen);
    if (rv != KV_OK)
        return rv;
    if (pthread_create(&r->refresher, NULL, refresher_main, r) != 0) {
        snprintf(err, errlen, "cannot start the map refresher thread");
        return KV_RESOURCE_EXHAUSTED;
    }
    r->refresher_started = true;
    if ((rv = router_hot_start(r)) != KV_OK) {
        snprintf(err, errlen, "cannot start hot-key detection: %s", kv_strerror(rv));
        return rv;
    }
    rpc_server_opts ro = {.url = r->cfg.listen,
                          .methods = router_methods,
                          .nmethods = sizeof(router_methods) / sizeof(router_methods[0]),
                          .workers = (unsigned)r->cfg.workers,
                          .max_inflight = (unsigned)r->cfg.max_inflight,
                          .handlers_wait = true, /* forwards wait for the nodes */
                          .auth = r->cfg.sec.data_token,
                          .admin_auth = r->cfg.sec.admin_token,
                          .tls = rpc_sec_tls(&r->cfg.sec),
                          .recv_max = kv_limits_recv_max(&r->cfg.limits),
                          .user = r};
    if ((rv = rpc_metrics_create(&r->metrics, ro.methods, ro.nmethods)) != KV_OK)
        return rv;
    ro.observe = rpc_metrics_observe;
    ro.observe_arg = r->metrics;
    if ((rv = rpc_server_open(&r->rpc, &ro, err, errlen)) != KV_OK)
        return rv;
    return router_http_start(r, err, errlen);
}

void router_stop(router *r)
{
    router_http_stop(r);
    if (!rpc_server_close(r->rpc)) { /* a handler still runs and uses the rest */
        KV_ERROR("router", "a request handler did not finish; exiting without waiting for it");
        r->rpc = NULL;
        return;
    }
    r->rpc = NULL;
    atomic_store(&r->stopping, true);
    if (r->refresher_started)
        pthread_join(r->refresher, NULL);
    router_hot_stop(r);
    router_probe_stop(r);
    rpc_pool_destroy(r->peers);
    r->peers = NULL;
    cmap_slot_destroy(r->maps);
    r->maps = NULL;
    rpc_metrics_destroy(r->metrics);
    r->metrics = NULL;
    free(r->targets);
    r->targets = NULL;
}
