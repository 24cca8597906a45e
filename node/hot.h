/* SPDX-License-Identifier: MIT */
/*
 * node_hot: the node's merged view of the hot-key reports routers push
 * (admin.HotKeys), and the pin decisions taken from it. All functions are
 * thread-safe.
 */
#ifndef KV_NODE_HOT_H
#define KV_NODE_HOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "node/engine.h"
#include "proto/kv.pb-c.h"

typedef struct node_hot node_hot;

typedef struct node_hot_item {
    uint8_t *key; /* owned by the view */
    size_t klen;
    double ops_per_s; /* summed over routers with a fresh report */
    bool pinned;
} node_hot_item;

/* Keys whose summed rate reaches threshold ops/s are pinned in e; threshold
 * 0 pins nothing (hints off). */
kv_err node_hot_create(node_hot **out, engine *e, double threshold);
/* Unpins nothing (the engine is closing too); NULL is a no-op. */
void node_hot_destroy(node_hot *h);
/* Merges one router's report (req->router_id, window_ms, keys) and pins or
 * unpins keys whose summed fresh rate crossed the threshold. */
void node_hot_report(node_hot *h, const Kv__HotKeysRequest *req, uint64_t now_ns);
/* The current view, best first; *out is malloc'ed, released with
 * node_hot_view_free(*out, n). Returns n. */
size_t node_hot_view(node_hot *h, uint64_t now_ns, node_hot_item **out);
void node_hot_view_free(node_hot_item *items, size_t n);
/* Number of keys pinned by hints. */
size_t node_hot_pinned(node_hot *h);

#endif
