/* SPDX-License-Identifier: MIT */
/*
 * The versioned cluster map (DESIGN.md §4): {epoch, rf, vnodes, nodes[{id,
 * addr, weight, state}]} plus the consistent-hashing ring built from it. A
 * map is validated when it is built (from protobuf, wire bytes or `ID=ADDR`
 * specs) and immutable afterwards, so any number of threads may read it
 * without locks. Every node, whatever its state, keeps its place in the ring
 * (a DOWN node is never ejected; states are for the router to act on).
 *
 * Membership transitions (DESIGN.md §4): a map may carry an open transition
 * (kv.Transition). Its current ring holds every node but the JOINING ones; its
 * pending ring every node but the LEAVING ones, each with its next_weight
 * where set. Reads use the current replicas of a key; writes go to the
 * current replicas and to the pending ones (cmap_pending), whose acks come on
 * top of the consistency level. A node's ring points are hashed from its
 * ring name (its id unless a replacement inherited another node's name).
 *
 * Lifetime: a map is reference counted (atomic). It is created with one
 * reference; cmap_ref() takes another, cmap_unref()/cmap_destroy() drop one,
 * the last drop frees it. A reader that uses a map beyond the statement that
 * fetched it must hold a reference. To publish a map that other threads swap
 * and read, use a cmap_slot: cmap_slot_get() returns the current map with a
 * new reference, so a refresh can install a newer map while readers finish
 * with the old one.
 */
#ifndef KV_SHARD_CLUSTERMAP_H
#define KV_SHARD_CLUSTERMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"
#include "proto/kv.pb-c.h"
#include "shard/ring.h"

#define CMAP_MAX_ID 64    /* bytes of a node id, [A-Za-z0-9._-] */
#define CMAP_MAX_ADDR 256 /* bytes of a node address, tcp://host:port */
#define CMAP_MAX_NODES 4096
#define CMAP_MAX_RF 16 /* replicas of a key; also the room callers give idx_out */

/* Same numbers as kv.NodeState. */
typedef enum cmap_state {
    CMAP_UP = 0,
    CMAP_DOWN = 1,
    CMAP_JOINING = 2,
    CMAP_LEAVING = 3,
} cmap_state;

/* A read-only view of one node; strings live as long as the map. */
typedef struct cmap_node {
    const char *id;
    const char *addr;
    uint32_t weight; /* 1..1000 */
    cmap_state state;
    const char *ring_name; /* what the ring points are hashed from (the id by default) */
    uint32_t next_weight;  /* weight in the pending ring, 0 = unchanged */
} cmap_node;

/* An arc of the hash ring: positions h with lo < h <= hi, wrapping past
 * 2^64 - 1 when lo > hi; lo == hi is the whole ring. */
typedef struct cmap_range {
    uint64_t lo, hi;
} cmap_range;

/* True when h lies in r. */
static inline int cmap_range_has(cmap_range r, uint64_t h)
{
    if (r.lo < r.hi)
        return h > r.lo && h <= r.hi;
    if (r.lo > r.hi)
        return h > r.lo || h <= r.hi;
    return 1;
}

typedef struct cmap cmap;

/* Builds a map from a decoded ClusterMap, validating it: epoch >= 1, at least
 * one node (at most CMAP_MAX_NODES), 1 <= rf <= node count, ids non-empty,
 * unique, at most 64 bytes of [A-Za-z0-9._-], addresses unique and of the
 * form tcp://host:port (host a name, IPv4 or [IPv6], port 1..65535), weight
 * 1..1000 (0 means 1), a known state, vnodes 0..1024 (0 means 128), rf at
 * most CMAP_MAX_RF; JOINING, LEAVING and next_weight only with a transition,
 * at least rf nodes in each ring and ring names unique in each ring. On
 * failure returns INVALID_ARGUMENT (RESOURCE_EXHAUSTED when out of memory),
 * writes a message naming the problem to err (if errlen > 0) and leaves *out
 * untouched. On success *out holds one reference owned by the caller; the
 * map copies everything it needs from pb. Thread-safe. */
kv_err cmap_from_pb(const Kv__ClusterMap *pb, cmap **out, char *err, size_t errlen);

/* Decodes a serialized kv.ClusterMap and validates it as cmap_from_pb does.
 * Malformed bytes give INVALID_ARGUMENT. Thread-safe. */
kv_err cmap_decode(const uint8_t *buf, size_t len, cmap **out, char *err, size_t errlen);

/* Serializes the map as a kv.ClusterMap into a malloc'ed buffer: on success
 * *buf (caller frees with free()) and *len are written. Returns
 * RESOURCE_EXHAUSTED when out of memory. Thread-safe. */
kv_err cmap_encode(const cmap *m, uint8_t **buf, size_t *len);

/* Builds a heap-allocated kv.ClusterMap equal to the map (vnodes written
 * explicitly), e.g. to embed in a GetMapReply. The caller frees it with
 * kv__cluster_map__free_unpacked(pb, NULL). Thread-safe. */
kv_err cmap_to_pb(const cmap *m, Kv__ClusterMap **out);

/* Parses `ID=ADDR` or `ID=ADDR@WEIGHT` words (kvctl cluster init --rf N
 * ID=ADDR ...) into a map with the given epoch and rf, every node UP and
 * vnodes 128, then validates it as cmap_from_pb does. Errors name the word. */
kv_err cmap_parse_spec(uint64_t epoch, unsigned rf, char *const *specs, int n, cmap **out,
                       char *err, size_t errlen);

/* Returns m after taking a reference. Thread-safe. */
cmap *cmap_ref(cmap *m);
/* Drops a reference; the last one frees the map. NULL is a no-op.
 * Thread-safe. */
void cmap_unref(cmap *m);
/* Same as cmap_unref: drops the creator's reference. */
void cmap_destroy(cmap *m);

/* Accessors; thread-safe. cmap_node_at(m, i) requires i < cmap_node_count. */
uint64_t cmap_epoch(const cmap *m);
unsigned cmap_rf(const cmap *m);
unsigned cmap_vnodes(const cmap *m);
size_t cmap_node_count(const cmap *m);
const cmap_node *cmap_node_at(const cmap *m, size_t i);
/* The current ring; its node indices are its own (not the map's: JOINING
 * nodes are not in it), so use the cmap_* lookups. Lives as long as m. */
const ring *cmap_ring(const cmap *m);

/* Writes the map indices of the key's current replicas (min(rf, ring
 * members)) to idx_out, owner first, and returns that count; idx_out needs
 * room for cmap_rf(m) entries. Thread-safe, allocation-free. */
size_t cmap_replicas(const cmap *m, const void *key, size_t klen, uint32_t *idx_out);
/* The same for a ring position (ring_key_hash). */
size_t cmap_replicas_hash(const cmap *m, uint64_t h, uint32_t *idx_out);
/* The key's pending replicas: members of its replica set in the pending
 * ring that are not current replicas (writes go to them too). 0 without a
 * transition. idx_out needs room for cmap_rf(m) entries. */
size_t cmap_pending(const cmap *m, const void *key, size_t klen, uint32_t *idx_out);
size_t cmap_pending_hash(const cmap *m, uint64_t h, uint32_t *idx_out);
/* The replica set in the pending ring (the set once the transition
 * completes); the current set without a transition. */
size_t cmap_next_replicas_hash(const cmap *m, uint64_t h, uint32_t *idx_out);
/* True when node i is a current or pending replica of key. */
bool cmap_holds(const cmap *m, size_t i, const void *key, size_t klen);
/* Index of the key's primary owner (current ring). */
uint32_t cmap_owner(const cmap *m, const void *key, size_t klen);
/* share_out[i] (room for cmap_node_count) = the fraction of the ring whose
 * primary is node i, in the current ring (next: the pending ring). */
void cmap_shares(const cmap *m, bool next, double *share_out);

/* The pending ring (the current ring without a transition). */
const ring *cmap_ring_next(const cmap *m);

/* The open transition, NULL when none; lives as long as m. */
const Kv__Transition *cmap_transition(const cmap *m);

/* Router-side health of node i (a mutable byte beside the immutable map,
 * which the prober of a router sets and its request path reads; relaxed
 * atomics, any thread). A new map starts UNKNOWN (treated as usable). */
typedef enum cmap_health {
    CMAP_HEALTH_UNKNOWN = 0,
    CMAP_HEALTH_UP = 1,          /* answers and serves */
    CMAP_HEALTH_NOT_SERVING = 2, /* answers, takes writes, must not serve reads */
    CMAP_HEALTH_DOWN = 3,        /* does not answer */
} cmap_health;
void cmap_set_health(const cmap *m, size_t i, cmap_health h);
cmap_health cmap_get_health(const cmap *m, size_t i);
/* Usable for reads: UNKNOWN or UP. */
bool cmap_readable(const cmap *m, size_t i);

/* Index of the node with this id / address, or -1. Thread-safe. */
int cmap_find(const cmap *m, const char *id);
int cmap_find_addr(const cmap *m, const char *addr);

/* Returns the name of a state ("UP", "DOWN", "JOINING", "LEAVING", "?"). */
const char *cmap_state_name(cmap_state s);

/* ---- cmap_slot: the current map of a process, swapped on refresh ---- */

typedef struct cmap_slot cmap_slot;

/* Creates an empty slot. Returns RESOURCE_EXHAUSTED when out of memory. */
kv_err cmap_slot_create(cmap_slot **out);
/* Drops the slot's reference to its map and frees the slot; NULL is a no-op.
 * No other thread may use the slot any more. */
void cmap_slot_destroy(cmap_slot *s);
/* Returns the current map with a new reference the caller must drop with
 * cmap_unref, or NULL when no map is installed. Thread-safe (a short mutex
 * held only to load the pointer and take the reference). */
cmap *cmap_slot_get(cmap_slot *s);
/* Epoch of the current map, 0 when none. Thread-safe. */
uint64_t cmap_slot_epoch(cmap_slot *s);
/* Installs m (taking its own reference) if the slot is empty or m's epoch is
 * newer than the current map's; the old map is unreferenced. Returns
 * FAILED_PRECONDITION, installing nothing, when m is not newer. The caller
 * keeps its own reference either way. Thread-safe. */
kv_err cmap_slot_install(cmap_slot *s, cmap *m);

/* How far a map from an unverified peer may move the epoch at once. */
#define CMAP_MAX_EPOCH_JUMP 64u

/* Signed maps (docs/protocol.md "Signed maps"): ClusterMap.mac is the
 * HMAC-SHA256, keyed with the cluster's map key (--map-key-file), of the
 * map's canonical encoding without the mac (cmap_encode of the decoded map,
 * so a map keeps its signature through every decode and re-encode). */
#define CMAP_MAC_LEN 32u

/* Sets pb->mac (freeing any old one) to m's signature under key; pb is m
 * as cmap_to_pb made it (or any encoding of the same map). */
kv_err cmap_sign_pb(const cmap *m, const char *key, Kv__ClusterMap *pb);
/* Whether a and b are the same map (their canonical encodings, macs aside). */
bool cmap_same(const cmap *a, const cmap *b);
/* Whether m carries a mac (checked or not). */
bool cmap_signed(const cmap *m);
/* KV_OK when m's mac verifies under key; PERMISSION_DENIED (unsigned, or
 * signed with another key) with the reason in why. Constant time in the
 * mac's bytes. */
kv_err cmap_check_sig(const cmap *m, const char *key, char *why, size_t len);

/* Whether m may replace cur (NULL = no map yet) when it came from the peer
 * at addr (NULL = unknown) in a reply (admin.GetMap, a FAILED_PRECONDITION
 * body); verified: the reply proved its sender (rpc_reply.verified: TLS
 * with the cluster's CA). docs/protocol.md "Cluster maps from peers".
 * With a map key (key non-NULL and non-empty) only the signature counts:
 * m must be signed with that key, whoever sent it. Without one, a verified
 * map is taken; an unverified one only when it is plausible: it lists a
 * node at addr (the sender is a member where it answered) and its epoch is
 * at most CMAP_MAX_EPOCH_JUMP past cur's; with no map yet, the first one is
 * taken (from the operator's seeds). KV_OK, or PERMISSION_DENIED with the
 * reason in why. */
kv_err cmap_vet(const cmap *cur, const cmap *m, const char *addr, bool verified, const char *key,
                char *why, size_t len);

#endif
