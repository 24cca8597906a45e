/* SPDX-License-Identifier: MIT */
/*
 * Planning over cluster maps (DESIGN.md §4): the arcs of the ring with their
 * replica sets, the ranges a node replicates, the streams a membership
 * transition needs, and the maps that complete or roll back a transition.
 * Pure functions of immutable maps: any thread.
 */
#ifndef KV_SHARD_CMAP_PLAN_H
#define KV_SHARD_CMAP_PLAN_H

#include "shard/clustermap.h"

/* An arc of the ring and its replica sets: cur in the current ring, next in
 * the pending ring (equal to cur without a transition), owner first. */
typedef struct cmap_arc {
    cmap_range r;
    uint32_t ncur, nnext;
    uint32_t cur[CMAP_MAX_RF], next[CMAP_MAX_RF];
} cmap_arc;

/* Every arc between consecutive points of the current and pending rings, in
 * ring order, adjacent arcs with identical sets merged. On success *out is a
 * malloc'ed array of *n arcs (free()). RESOURCE_EXHAUSTED when out of
 * memory. */
kv_err cmap_arcs(const cmap *m, cmap_arc **out, size_t *n);

/* The ranges (adjacent arcs merged) in which node i is a replica: of the
 * current sets, or of the next sets when next is true. *out malloc'ed
 * (free()); *n may be 0. */
kv_err cmap_node_ranges(const cmap *m, size_t i, bool next, cmap_range **out, size_t *n);

/* Plans the streams of m's open transition (its own streams are ignored).
 * In each arc, every node that the next set gains pulls the arc from the
 * node the set loses in its place (Cassandra's consistent range movement:
 * the new replica takes over exactly the copy it replaces); when that node
 * is one of dead[0..ndead) (kvctl node replace), it pulls from every
 * surviving replica of the arc instead (last-writer-wins merges them).
 * Streams are grouped by (source, target), ids "E-SOURCE-TARGET" with E the
 * map's epoch. On success *out is a malloc'ed array of *n malloc'ed plans
 * (free each with kv__stream_plan__free_unpacked(p, NULL), then the array).
 * FAILED_PRECONDITION (message in err) when an arc has no live source. */
kv_err cmap_plan_streams(const cmap *m, const char *const *dead, size_t ndead,
                         Kv__StreamPlan ***out, size_t *n, char *err, size_t errlen);
void cmap_plan_free(Kv__StreamPlan **plans, size_t n);

/* The map completing m's transition: epoch + 1, JOINING nodes UP, LEAVING
 * nodes gone, next weights in force, no transition. The map that rolls it
 * back: epoch + 1, JOINING nodes gone, LEAVING nodes UP, next weights
 * dropped. The caller frees *out with kv__cluster_map__free_unpacked.
 * INVALID_ARGUMENT when m has no transition. */
kv_err cmap_completed_pb(const cmap *m, Kv__ClusterMap **out);
kv_err cmap_aborted_pb(const cmap *m, Kv__ClusterMap **out);

#endif
