/* SPDX-License-Identifier: MIT */
/*
 * kvnode internals shared by main.c and server.c: the node's configuration,
 * its engine, its cluster map slot and its RPC server.
 */
#ifndef KV_NODE_NODE_H
#define KV_NODE_NODE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/ticker.h"

#include "common/limits.h"
#include "node/engine.h"
#include "node/hot.h"
#include "proto/rpc.h"
#include "proto/http.h"
#include "proto/rpc_metrics.h"
#include "proto/rpc_sec.h"
#include "proto/statlist.h"
#include "proto/stats.h"
#include "shard/clustermap.h"
#include "shard/repl.h"

typedef struct node_config {
    char *id;
    char *listen;
    char *data_dir;
    rpc_sec sec;    /* tokens and TLS (--auth*, --admin-auth*, --tls-*) */
    char *fast_dir; /* default DATA_DIR/fast */
    char *slow_dir; /* NULL = every level on the fast volume */
    long fast_mb;
    long fast_stop_pct; /* flushes wait above this % of fast_mb (lsm_opts.fd_stop_pct) */
    int sync;           /* engine_sync */
    long sync_ms;
    long write_buffer_mb;
    long wal_max_mb;      /* the WAL's most bytes on FD, MiB; 0 = 4 x the write buffer */
    long write_buffer_kb; /* finer, for tests; wins when set */
    bool no_io_uring;
    bool hotrap;
    char *compression; /* --compression (lsm_compression_parse), NULL = auto */
    nhc_opts nhc;      /* NHC scheduler (--nhc*); used with --slow-dir and HotRAP */
    long twin_entries; /* twin-map bound, 0 = from --fast-mb */
    long mem_mb;
    long workers;
    long coord_workers;   /* workers for calls the node coordinates (smart clients) */
    long max_inflight;    /* calls admitted at once before refusing (0 = RPC default) */
    double hot_threshold; /* ops/s summed over routers that pins a key */
    kv_limits limits;
    long stream_mbps;        /* default throttle of stream jobs, MiB/s */
    long cleanup_delay_s;    /* cleanup this long after a transition completes (<0 = never) */
    long map_refresh_ms;     /* how often a peer is asked for a newer map */
    long hints_max_mb;       /* bound on stored hints */
    long hint_window_s;      /* hints older than this are dropped (repair needed) */
    long tombstone_grace_s;  /* tombstones are kept at least this long */
    long catchup_timeout_ms; /* a peer silent this long is skipped by the catch-up */
    bool force_stale_start;  /* start even after a downtime longer than the grace */
    int wal_recovery;        /* engine_wal_recovery: WAL corruption before its tail */
    int engine;              /* engine_kind: lsm or kallax (--engine) */
    long kallax_blocks;      /* kallax: home blocks (--kallax-blocks, or from --kallax-gb) */
    char *http_listen;       /* --http-listen: /metrics and /health (NULL = off) */
} node_config;

/* How far ahead of the node's wall clock a write's version may be
 * (server.c: node_check_version). */
#define NODE_VERSION_MAX_AHEAD_MS (10u * 60u * 1000u)

typedef struct node_streams node_streams; /* stream.c */
typedef struct node_handoff node_handoff; /* handoff.c */

typedef struct node {
    node_config cfg;
    engine *eng;
    node_hot *hot;
    cmap_slot *maps; /* the node's cluster map (empty before cluster init) */
    rpc_server *rpc;
    uint64_t started_ns;
    /* nodemap.c: map installs are serialised by map_mu (check, persist,
     * install as one step: the compare-and-set of admin.SetMap). */
    pthread_mutex_t map_mu;
    _Atomic int serving;            /* Kv__Serving */
    _Atomic bool needs_repair;      /* persisted as DATA_DIR/NEEDS_REPAIR */
    _Atomic bool catching_up;       /* until the peers' hints for this node are drained */
    _Atomic uint64_t seen_epoch;    /* highest map epoch seen on a request */
    _Atomic uint64_t cleanup_at_ms; /* automatic cleanup due (0 = none) */
    kv_ticker *map_ticker;
    uint64_t alive_next_ms; /* when the refresher writes DATA_DIR/ALIVE next */
    size_t refresh_next;    /* round-robin peer index of the refresher */
    rpc_pool *peers;        /* one channel per peer address */
    node_streams *streams;
    node_handoff *handoff;
    /* coord.c: coordinating requests for smart clients */
    repl_env env;
    repl_stats coord;
    _Atomic uint64_t coord_requests;
    _Atomic bool stopping; /* node_stop began: no more side writes */
    rpc_metrics *metrics;  /* per-method requests and latency (stats.c) */
    kv_http *http;         /* --http-listen (stats.c) */
    kv_http_route http_routes[2];
} node;

/* ---- nodemap.c: the map, the serving state, peers ---- */

/* The channel to a peer address (created on first use, kept until
 * node_stop). NULL when out of memory or the address is invalid. Any
 * thread. */
rpc_chan *node_chan(node *n, const char *addr);
/* Loads DATA_DIR/cluster.map and the NEEDS_REPAIR mark (node_start). */
kv_err node_map_load(node *n, char *err, size_t errlen);
/* Refuses (FAILED_PRECONDITION, message in err) to start a cluster member
 * that was down longer than --tombstone-grace (DATA_DIR/ALIVE is rewritten
 * every minute): peers may have purged tombstones of deletes it missed, and
 * its copies would resurrect those keys. Then records that it is alive. */
kv_err node_check_downtime(node *n, char *err, size_t errlen);
/* Starts / stops the map refresher (asks a peer for a newer map every
 * map_refresh_ms, at once when a request showed a newer epoch) and the
 * automatic cleanup after a transition. */
kv_err node_map_start(node *n);
void node_map_stop(node *n);
/* A request carried map epoch e: remember it, so the refresher fetches a
 * newer map at once. Any thread. */
void node_map_saw_epoch(node *n, uint64_t e);
/* The node's serving state (Kv__Serving) and a one-line reason. */
int node_serving(node *n, char *detail, size_t len);
/* The same under map m (NULL: none), which the caller holds; *why points to
 * a static string. Formats nothing: the read path asks on every request. */
int node_serving_in(node *n, const cmap *m, const char **why);
/* Sets or clears NEEDS_REPAIR (persisted). */
kv_err node_set_needs_repair(node *n, bool on, const char *why);
/* True when node index self of m holds key (current or pending replica). */
bool node_holds(node *n, cmap *m, const void *key, size_t klen);
/* Installs the map in the FAILED_PRECONDITION reply of the replica at from
 * (body: a kv.ClusterMap) when it is newer, lists the node and is
 * trustworthy (cmap_vet), as a map fetched from a peer. Any thread. */
void node_map_learn(node *n, const rpc_reply *rep, const char *from);
/* Handlers (nodemap.c). */
kv_err node_h_get_map(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err node_h_set_map(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err node_h_cleanup(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err node_h_repaired(rpc_ctx *c, const uint8_t *body, size_t len);
/* Drops the records of ranges the node no longer replicates (admin.Cleanup
 * and the automatic cleanup). */
kv_err node_cleanup(node *n, uint64_t *dropped, uint64_t *kept);

/* ---- stream.c / stream_src.c: streaming, repair, apply ---- */
kv_err node_streams_open(node *n, node_streams **out, char *err, size_t errlen);
void node_streams_close(node_streams *s);
/* The map changed: cancel transition jobs whose transition is gone. */
void node_streams_map_changed(node *n);
kv_err node_h_stream_read(rpc_ctx *c, const uint8_t *body, size_t len);
/* Closes the iterators streams left open between chunks (node_stop, before
 * the engine closes). */
void node_stream_src_close(node *n);
/* stream.chunks_continued / stream.iterators_opened (admin.Stats). */
void node_stream_src_stats(kv_stats *l);
kv_err node_h_stream_start(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err node_h_stream_status(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err node_h_digest(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err node_h_apply(rpc_ctx *c, const uint8_t *body, size_t len);
/* Applies one versioned record (last-writer-wins); *applied true when it
 * was newer than the local copy. */
kv_err node_apply_record(node *n, const Kv__Record *r, bool *applied, char *err, size_t errlen);
/* KV_OK when version is at most NODE_VERSION_MAX_AHEAD_MS ahead of the
 * wall clock, else INVALID_ARGUMENT with a message in err. */
kv_err node_check_version(uint64_t version, char *err, size_t errlen);

/* ---- handoff.c: hints and catching up ---- */
kv_err node_handoff_open(node *n, node_handoff **out, char *err, size_t errlen);
void node_handoff_close(node_handoff *h);
kv_err node_h_hint(rpc_ctx *c, const uint8_t *body, size_t len);
kv_err node_h_hint_status(rpc_ctx *c, const uint8_t *body, size_t len);
void node_handoff_stats(node *n, kv_stats *l);
/* kvctl repair rebuilt target: clear its lost-hints mark. */
kv_err node_handoff_repaired(node *n, const char *target);

/* ---- coord.c: coordinating for smart clients (Envelope.coordinate) ---- */
/* Fills n->env (after the engine and the map slot exist). */
void node_coord_init(node *n);
/* kv.* with c->coordinate: checked against the limits, then coordinated by
 * the replication library (shard/repl.h) as a router would; Get/Put/Delete
 * in two phases (rpc_method.start: sent at the start, waited for at
 * node_coord_finish) and asynchronously (rpc_method.start_async, coord.c:
 * no worker waits for the other replicas), Batch in one. */
kv_err node_coord_get_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
kv_err node_coord_put_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
kv_err node_coord_delete_start(rpc_ctx *c, const uint8_t *body, size_t len, void **state);
bool node_coord_get_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a);
bool node_coord_put_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a);
bool node_coord_delete_async(rpc_ctx *c, const uint8_t *body, size_t len, rpc_async *a);
kv_err node_coord_finish(rpc_ctx *c, void *state);
/* A coordinate call on a node without a cluster map runs as its plain call
 * (server.c): a node in no cluster is every key's only replica, and a smart
 * client whose address is such a node gets what a plain client gets. */
kv_err node_plain_call(rpc_ctx *c, const uint8_t *body, size_t len);
/* A coordinate kv.Get served on the receiving thread (rpc_method.
 * inline_coordinate): when this node's own replica answers it alone
 * (repl_read_alone) from memory, as node_coord_get_async would, without
 * the replication library's call state; false, c untouched, otherwise. */
bool node_coord_get_inline(rpc_ctx *c, const uint8_t *body, size_t len, kv_err *rv);
/* server.c: kv.Get of an unpacked request from the memory tier only: false
 * when the record is not there (c untouched), else true with the status in
 * *out and c filled as the handler leaves it. mine: a map the caller holds
 * in which this node is one of the key's replicas and whose epoch c
 * carries (the coordinator's own replica call), or NULL to look both up. */
bool node_get_mem(rpc_ctx *c, const Kv__GetRequest *req, cmap *mine, kv_err *out);
kv_err node_coord_batch(rpc_ctx *c, const uint8_t *body, size_t len);
void node_coord_stats(node *n, kv_stats *l);
/* The replication library's in-process call to this node's own replica
 * (repl_local_fn; server.c): runs the handler of method as a replica call
 * from a coordinator with map epoch epoch. user is the node. */
void node_local_call(void *user, const char *method, uint64_t epoch, const uint8_t *body,
                     size_t len, uint32_t deadline_ms, rpc_reply *out);
/* The same through the method's try_inline (repl_env.local_try): false,
 * nothing done, when it would block (a read the memory tier cannot answer). */
bool node_local_try(void *user, const char *method, uint64_t epoch, const uint8_t *body, size_t len,
                    uint32_t deadline_ms, rpc_reply *out);

/* Creates the data directory, loads a persisted map, opens the engine and
 * starts serving on cfg->listen. On failure writes a message to err. */
kv_err node_start(node *n, char *err, size_t errlen);
/* ---- scan.c: kv.Scan on the node's engine, live keys ---- */
kv_err node_h_scan(rpc_ctx *c, const uint8_t *body, size_t len);
/* The node's live keys (not deleted, not expired, in ranges it replicates):
 * an exact count by a scan of the engine, reused for 5 s. Any registered
 * thread; one count runs at a time. */
kv_err node_live_keys(node *n, uint64_t *out);

/* ---- stats.c: statistics, /metrics, /health ---- */
/* Appends the node's statistics to l (admin.Stats and /metrics); verbose
 * adds the per-tier detail (always on for /metrics). Any thread registered
 * with engine_thread_register. */
/* srv: the RPC server whose admission counters are listed (the caller's:
 * an admin.Stats handler passes its rpc_ctx's server, which n->rpc may not
 * hold yet while rpc_server_open returns). */
void node_collect_stats(node *n, const rpc_server *srv, kv_stats *l, bool verbose);
/* The store's figures (the LSM's levels, volumes, WAL, HotRAP; or
 * kallax.*) and the NHC scheduler's (nhc.*, only nhc.state "off" without
 * one). */
void node_engine_store_stats(engine *e, kv_stats *l);
void node_engine_nhc_stats(engine *e, kv_stats *l);
/* node_engine_store_stats as admin.Stats pairs (tests, benchmarks); l is
 * initialised here, the caller frees it (rpc_stats_free). */
void node_engine_statlist(engine *e, rpc_statlist *l);
/* Starts the HTTP server of --http-listen (nothing without it): /metrics,
 * /health. On failure writes a message to err. */
kv_err node_http_start(node *n, char *err, size_t errlen);
void node_http_stop(node *n);

/* Stops serving (in-flight calls finish) and closes everything. */
void node_stop(node *n);

#endif
