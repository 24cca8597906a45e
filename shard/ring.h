/* SPDX-License-Identifier: MIT */
/*
 * Consistent hashing ring, ketama style (DESIGN.md §4). A key's position is
 * xxh64(key, seed 0); node i owns vnodes × weight points, point j hashed as
 * xxh64("<id>-<j>", seed 0) (libketama's "<server>-<j>" naming), so a node's points depend only on
 * its id and weight: they are stable across processes and independent of the order of the nodes,
 * and adding a node only moves keys onto that node. The replicas of a key are the first rf distinct
 * nodes met clockwise from its position (a point owns the arc ending at it, inclusive). Points are
 * placed at random, so with 128 vnodes a node's share deviates from 1/n by about 9%/sqrt(weight)
 * relative (one standard deviation). A ring is immutable once created, so any number of threads may
 * read it concurrently without locks.
 */
#ifndef KV_SHARD_RING_H
#define KV_SHARD_RING_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

#define RING_DEFAULT_VNODES 128u
#define RING_MAX_VNODES 1024u
#define RING_MAX_WEIGHT 1000u
/* Upper bound on vnodes × Σ weights (16 bytes of memory per point). */
#define RING_MAX_POINTS (1u << 21)

typedef struct ring ring;

/* One member of the ring. `weight` 0 counts as 1. */
typedef struct ring_node {
    const char *id;
    uint32_t weight;
} ring_node;

/* Builds a ring over nodes[0..n) with `vnodes` points per unit of weight
 * (0 → RING_DEFAULT_VNODES). Ids must be non-empty and unique; the ids are
 * hashed during the call and not kept. Returns INVALID_ARGUMENT for n == 0, a
 * NULL/empty/duplicate id, weight > RING_MAX_WEIGHT, vnodes > RING_MAX_VNODES
 * or more than RING_MAX_POINTS points; RESOURCE_EXHAUSTED when out of memory.
 * On success *out is a new ring owned by the caller (ring_destroy). */
kv_err ring_create(ring **out, const ring_node *nodes, size_t n, unsigned vnodes);

/* Frees a ring; NULL is a no-op. No reader may still be using it. */
void ring_destroy(ring *r);

/* Number of nodes / points. Thread-safe. */
size_t ring_node_count(const ring *r);
size_t ring_point_count(const ring *r);

/* Position of point i (0 <= i < ring_point_count), ascending in i. */
uint64_t ring_point_hash(const ring *r, size_t i);

/* Hash of a key on the ring: xxh64(key, klen, 0). */
uint64_t ring_key_hash(const void *key, size_t klen);

/* Writes the indices (into the nodes array given to ring_create) of the
 * first min(rf, n) distinct nodes clockwise from the key's position to
 * out_idx, owner first, and returns that count. out_idx must have room for
 * min(rf, n) entries. Thread-safe, lock-free, allocation-free. */
size_t ring_replicas(const ring *r, const void *key, size_t klen, unsigned rf, uint32_t *out_idx);

/* Same as ring_replicas for a position already hashed with ring_key_hash. */
size_t ring_replicas_hash(const ring *r, uint64_t h, unsigned rf, uint32_t *out_idx);

/* Index of the primary owner of a key. Thread-safe. */
uint32_t ring_owner(const ring *r, const void *key, size_t klen);

/* Writes to share_out[i] (room for ring_node_count() doubles) the fraction of
 * the 2^64 hash space whose primary owner is node i; the shares sum to 1.
 * Thread-safe. */
void ring_shares(const ring *r, double *share_out);

#endif
