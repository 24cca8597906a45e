/* SPDX-License-Identifier: MIT */
/*
 * kvrouter internals. The router is stateless: its cluster map comes from
 * the nodes (admin.GetMap) and is swapped whole on refresh. Each node
 * address has one rpc_chan (one REQ socket, a pool of contexts), created on
 * first use and kept for the router's life, so a map refresh never drops
 * connections.
 */
#ifndef KV_SHARD_ROUTER_H
#define KV_SHARD_ROUTER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/clock.h"
#include "common/limits.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"
#include "proto/statlist.h"
#include "shard/hotkeys.h"
#include "shard/repl.h"
#include "shard/router_mitigate.h"

#define ROUTER_MAX_RF REPL_MAX_RF

typedef struct router_config {
    char *listen;
    char *seeds; /* comma-separated node RPC addresses */
    char *auth;
    long workers;
    long max_inflight; /* calls admitted at once before refusing (0 = RPC default) */
    long refresh_ms;
    long hot_sample;    /* sample one key in N for hot-key detection (0 = off) */
    long hot_window_ms; /* detection window */
    long hot_k;         /* keys per sketch / report */
    bool hot_replica_reads;
    long hot_cache_ms;
    double hot_flag_rate;
    kv_limits limits;
    long probe_ms;    /* failure detector: admin.Ping period per node */
    long probe_fails; /* consecutive failed probes that mark a node down */
} router_config;

typedef struct router {
    router_config cfg;
    cmap_slot *maps;
    kv_hlc hlc;
    rpc_pool *peers; /* one channel per node address */
    rpc_server *rpc;
    pthread_t refresher;
    bool refresher_started;
    hk_window *hot;  /* NULL when detection is off */
    router_mit *mit; /* NULL when no mitigation is on */
    pthread_t hot_thread;
    bool hot_started;
    atomic_bool stopping;
    uint64_t started_ns;
    _Atomic uint64_t requests, map_refreshes;
    repl_stats stats; /* forwards, hints, read repairs (shard/repl.h) */
    repl_env env;     /* how the replication library reaches the nodes */
    /* failure detector (router_probe.c) */
    struct router_probe *probe;
    pthread_t probe_thread;
    bool probe_started;
} router;

/* ---- router_probe.c: failure detector ---- */
kv_err router_probe_start(router *r);
void router_probe_stop(router *r);
/* A new map was installed: carry the health of its nodes over. */
void router_probe_map_changed(router *r, cmap *old, cmap *m);
/* Appends the router's view (view.<id> = up|down|catching_up|...) to l. */
void router_probe_stats(router *r, rpc_statlist *l);

/* The channel for a node address (created on first use). NULL only when out
 * of memory or the address is invalid. Thread-safe. */
rpc_chan *router_chan(router *r, const char *addr);

/* Fetches the map from the nodes of the current map and the seeds, installs
 * it if newer. Returns KV_OK when the router has a map afterwards. */
kv_err router_refresh_map(router *r);
/* Installs a map carried in a FAILED_PRECONDITION reply body if newer. */
void router_learn_map(router *r, const uint8_t *body, size_t len);

/* Handlers (router_kv.c, router_admin.c). */
/* kv.Get/Put/Delete in two phases (rpc_method.start): the start checks the
 * request and sends it to the replicas, router_finish waits for them. */
kv_err router_get_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
kv_err router_put_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
kv_err router_delete_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
kv_err router_finish(rpc_ctx *c, void *state);
kv_err router_h_batch(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err router_h_ping(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err router_h_stats(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err router_h_get_map(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err router_h_hot_keys(rpc_ctx *c, const uint8_t *body, size_t len);

/* Hot-key detection (router_hot.c). */
kv_err router_hot_start(router *r);
void router_hot_stop(router *r);
/* Offers a routed key to the detector; worker = the RPC worker index. */
void router_hot_sample(router *r, int worker, const void *key, size_t klen);

/* Starts the map refresher and the RPC server. */
kv_err router_start(router *r, char *err, size_t errlen);
void router_stop(router *r);

#endif
