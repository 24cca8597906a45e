/* SPDX-License-Identifier: MIT */
/*
 * Router-side hot-key mitigations (replica spreading and a short-lived
 * value cache for flagged hot keys); see router_mitigate.c for their
 * consistency cost. All functions are thread-safe.
 */
#ifndef KV_SHARD_ROUTER_MITIGATE_H
#define KV_SHARD_ROUTER_MITIGATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"
#include "shard/hotkeys.h"

typedef struct router_mit router_mit;

kv_err router_mit_create(router_mit **out, bool replica_reads, long cache_ms, double flag_rate);
void router_mit_destroy(router_mit *m);
/* True when any mitigation is on. */
bool router_mit_active(const router_mit *m);
/* Replaces the flagged set with the keys of rep at or above the flag rate. */
void router_mit_update(router_mit *m, const hk_report *rep);
bool router_mit_flagged(router_mit *m, const void *key, size_t klen);
/* Which replica (index into the replica list) a hot read at ONE goes to. */
size_t router_mit_pick(router_mit *m, size_t nreplicas);
/* Cache lookup: on a hit *body (malloc'ed, the caller's) holds a packed
 * GetReply. *gen is always set, for router_mit_cache_put. */
bool router_mit_cache_get(router_mit *m, const void *key, size_t klen, uint8_t **body, size_t *blen,
                          uint64_t *gen);
/* Stores a read's reply unless a write invalidated the key since gen. */
void router_mit_cache_put(router_mit *m, const void *key, size_t klen, const uint8_t *body,
                          size_t blen, uint64_t gen);
/* Drops key's entry (every write through the router calls it). */
void router_mit_invalidate(router_mit *m, const void *key, size_t klen);
uint64_t router_mit_hits(const router_mit *m);

#endif
