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
#include "shard/hotkeys.h"

typedef struct node_hot node_hot;

/* Bounds on what reports can make the view hold (see hot.c). */
#define NODE_HOT_MAX_KEY 4096u                      /* the memory tier's key limit */
#define NODE_HOT_MAX_RATE 1e9                       /* ops/s; higher rates are clamped */
#define NODE_HOT_MAX_WINDOW_MS HK_MAX_WINDOW_MS     /* 1 minute; longer windows are clamped */
#define NODE_HOT_MAX_REPORT_KEYS HK_REPORT_MAX_KEYS /* keys taken from one report */
#define NODE_HOT_MAX_BYTES (8u << 20)               /* key bytes held over all entries */

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
/* Checks a report against the bounds above, keys also against max_key
 * (the node's --max-key-bytes): KV_OK, or INVALID_ARGUMENT with a message
 * naming the limit (too many keys, window_ms over the limit, a key empty or
 * too long, a rate not finite or negative, keys without a router id). The
 * node's admin.HotKeys refuses such reports whole; node_hot_report does not
 * need it. */
kv_err node_hot_check(const Kv__HotKeysRequest *req, size_t max_key, char *err, size_t errlen);
/* Merges one router's report (req->router_id, window_ms, keys) and pins or
 * unpins keys whose summed fresh rate crossed the threshold. Whatever the
 * report holds, the view stays within the bounds above: unusable keys are
 * skipped, rates and window clamped, the keys past the per-report limit
 * ignored (logged once per report). */
void node_hot_report(node_hot *h, const Kv__HotKeysRequest *req, uint64_t now_ns);
/* The current view, best first; *out is malloc'ed, released with
 * node_hot_view_free(*out, n). Returns n. */
size_t node_hot_view(node_hot *h, uint64_t now_ns, node_hot_item **out);
void node_hot_view_free(node_hot_item *items, size_t n);
/* Number of keys in the view (reported hot by some router). */
size_t node_hot_tracked(node_hot *h);
/* Number of keys pinned by hints. */
size_t node_hot_pinned(node_hot *h);

#endif
