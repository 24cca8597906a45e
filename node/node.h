/* SPDX-License-Identifier: MIT */
/*
 * kvnode internals shared by main.c and server.c: the node's configuration,
 * its engine, its cluster map slot and its RPC server.
 */
#ifndef KV_NODE_NODE_H
#define KV_NODE_NODE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/limits.h"
#include "node/engine.h"
#include "node/hot.h"
#include "proto/rpc.h"
#include "proto/statlist.h"
#include "shard/clustermap.h"

typedef struct node_config {
    char *id;
    char *listen;
    char *data_dir;
    char *auth;
    char *fast_dir; /* default DATA_DIR/fast */
    char *slow_dir; /* NULL = every level on the fast volume */
    long fast_mb;
    int sync; /* engine_sync */
    long sync_ms;
    long write_buffer_mb;
    long write_buffer_kb; /* finer, for tests; wins when set */
    bool no_io_uring;
    bool hotrap;
    nhc_opts nhc;      /* NHC scheduler (--nhc*); used with --slow-dir and HotRAP */
    long twin_entries; /* twin-map bound, 0 = from --fast-mb */
    long mem_mb;
    long workers;
    double hot_threshold; /* ops/s summed over routers that pins a key */
    kv_limits limits;
} node_config;

typedef struct node {
    node_config cfg;
    engine *eng;
    node_hot *hot;
    cmap_slot *maps; /* the node's cluster map (empty before cluster init) */
    rpc_server *rpc;
    uint64_t started_ns;
} node;

/* Creates the data directory, loads a persisted map, opens the engine and
 * starts serving on cfg->listen. On failure writes a message to err. */
kv_err node_start(node *n, char *err, size_t errlen);
/* Appends the node's statistics to l (admin.Stats); verbose adds the
 * per-tier detail. */
void node_collect_stats(node *n, rpc_statlist *l, bool verbose);

/* Stops serving (in-flight calls finish) and closes everything. */
void node_stop(node *n);

#endif
