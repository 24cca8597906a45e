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
#include "proto/rpc_sec.h"
#include "shard/clustermap.h"
#include "proto/http.h"
#include "proto/rpc_metrics.h"
#include "proto/stats.h"
#include "shard/fan.h"
#include "shard/hotkeys.h"
#include "shard/repl.h"
#include "shard/router_mitigate.h"

#define ROUTER_MAX_RF REPL_MAX_RF

typedef struct router_config {
    char *listen;
    char *seeds; /* comma-separated node RPC addresses */
    rpc_sec sec; /* tokens and TLS (--auth*, --admin-auth*, --tls-*) */
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
    long probe_ms;     /* failure detector: admin.Ping period per node */
    long probe_fails;  /* consecutive failed probes that mark a node down */
    char *http_listen; /* --http-listen: /metrics, /health, the dashboard (NULL = off) */
} router_config;

/* Forward counters of one node (router_stats.c), by node id. */
typedef struct router_target {
    char id[CMAP_MAX_ID + 1];
    fan_ctr ctr;
} router_target;
#define ROUTER_MAX_TARGETS 1024
/* Hot-key sketches for nng threads (asynchronous calls), after the workers' */
#define ROUTER_HOT_NNG_SLOTS 16

typedef struct router_dash router_dash; /* router_dash.c */

typedef struct router {
    router_config cfg;
    cmap_slot *maps;
    kv_hlc hlc;
    rpc_pool *peers; /* one channel per node address */
    rpc_server *rpc;
    pthread_t refresher;
    bool refresher_started;
    hk_window *hot;            /* NULL when detection is off */
    _Atomic int hot_nng_slots; /* nng threads given a sketch (router_hot.c) */
    router_mit *mit;           /* NULL when no mitigation is on */
    pthread_t hot_thread;
    bool hot_started;
    atomic_bool stopping;
    uint64_t started_ns;
    _Atomic uint64_t requests, map_refreshes, maps_refused;
    repl_stats stats; /* forwards, hints, read repairs (shard/repl.h) */
    repl_env env;     /* how the replication library reaches the nodes */
    /* failure detector (router_probe.c) */
    struct router_probe *probe;
    pthread_t probe_thread;
    bool probe_started;
    /* router_stats.c: per-method request metrics, forwards per node (an
     * append-only table: entries below ntargets are published), HTTP */
    rpc_metrics *metrics;
    router_target *targets;
    _Atomic size_t ntargets;
    pthread_mutex_t targets_mu;    /* serialises appends */
    _Atomic uint64_t hot_reported; /* keys in the last hot-key window report */
    kv_http *http;
    kv_http_route http_routes[8];
    router_dash *dash;
} router;

/* ---- router_stats.c: statistics, /metrics, /health ---- */
/* The forward counters of node id (repl_env.target_ctr); NULL when the
 * table is full or out of memory. Any thread. */
fan_ctr *router_target_ctr(void *user, const char *id);
/* Appends the router's statistics to l (admin.Stats and /metrics). */
/* srv: as node_collect_stats's (the handler's own server; r->rpc for /metrics,
 * whose server starts after the RPC one). */
void router_collect_stats(router *r, const rpc_server *srv, kv_stats *l);
/* Whether the router can serve: a map and at least one reachable node;
 * detail gets a reason. */
bool router_healthy(router *r, char *detail, size_t len);
/* Starts/stops --http-listen (/metrics, /health and the dashboard). */
kv_err router_http_start(router *r, char *err, size_t errlen);
void router_http_stop(router *r);

/* ---- router_dash.c: the dashboard (/, /api/...) ---- */
/* Starts the sampler (polls the nodes' stats every second into a ring
 * buffer) and adds the dashboard's routes to routes (returns how many). */
kv_err router_dash_start(router *r);
void router_dash_stop(router *r);
size_t router_dash_routes(router *r, kv_http_route *routes, size_t cap);

/* ---- router_probe.c: failure detector ---- */
kv_err router_probe_start(router *r);
void router_probe_stop(router *r);
/* A new map was installed: carry the health of its nodes over. */
void router_probe_map_changed(router *r, cmap *old, cmap *m);
/* Appends the router's view (view.<id> = up|down|catching_up|...) to l. */
void router_probe_stats(router *r, kv_stats *l);
/* The view of node id: "up", "down", "catching_up", ... ("unknown" when
 * not probed); *since_ms its wall-clock time of change, *rtt_ms the last
 * ping's round trip. */
const char *router_probe_view(router *r, const char *id, uint64_t *since_ms, double *rtt_ms);

/* The channel for a node address (created on first use). NULL only when out
 * of memory or the address is invalid. Thread-safe. */
rpc_chan *router_chan(router *r, const char *addr);

/* Fetches the map from the nodes of the current map and the seeds, installs
 * it if newer. Returns KV_OK when the router has a map afterwards. */
kv_err router_refresh_map(router *r);
/* Installs a map carried in a FAILED_PRECONDITION reply of the node at from
 * if newer and trustworthy (cmap_vet). */
void router_learn_map(router *r, const rpc_reply *rep, const char *from);

/* Handlers (router_kv.c, router_admin.c). */
/* kv.Get/Put/Delete in two phases (rpc_method.start): the start checks the
 * request and sends it to the replicas, router_finish waits for them. */
kv_err router_get_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
kv_err router_put_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
kv_err router_delete_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
kv_err router_finish(rpc_ctx *c, void *state);
/* The same started on the receiving nng thread and completed by the replies
 * (rpc_async_fn): no worker waits for the nodes. */
bool router_get_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a);
bool router_put_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a);
bool router_delete_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a);
kv_err router_h_batch(rpc_ctx *c, const uint8_t *body, size_t len);
/* kv.Scan: the nodes' ordered pages merged (router_scan.c). */
kv_err router_h_scan(rpc_ctx *c, const uint8_t *body, size_t len);
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
