/* SPDX-License-Identifier: MIT */
/*
 * Consistent hashing ring (ketama style, as in mcrouter, twemproxy and
 * Dynamo): a sorted array of points {hash, node}; a lookup is a binary search
 * for the first point at or after the key's hash, then a clockwise walk that
 * collects distinct nodes. Equal point hashes (astronomically rare) are
 * ordered by node id, so the ring is the same whatever the order of the
 * nodes given to ring_create.
 */
#include "shard/ring.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"

typedef struct ring_point {
    uint64_t hash;
    uint32_t node; /* index into the caller's nodes array */
    uint32_t rank; /* position of the node's id in sorted id order (ties) */
} ring_point;

struct ring {
    size_t nnodes;
    size_t npoints;
    ring_point *points; /* sorted by (hash, rank) */
};

typedef struct id_slot {
    const char *id;
    uint32_t idx;
} id_slot;

static int id_slot_cmp(const void *a, const void *b)
{
    return strcmp(((const id_slot *)a)->id, ((const id_slot *)b)->id);
}

static int point_cmp(const void *a, const void *b)
{
    const ring_point *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Checks ids (non-empty, unique) and writes each node's id rank to ranks. */
static kv_err rank_ids(const ring_node *nodes, size_t n, uint32_t *ranks)
{
    id_slot *ids = malloc(n * sizeof *ids);
    if (ids == NULL)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        if (nodes[i].id == NULL || nodes[i].id[0] == '\0') {
            free(ids);
            return KV_INVALID_ARGUMENT;
        }
        ids[i] = (id_slot){nodes[i].id, (uint32_t)i};
    }
    qsort(ids, n, sizeof *ids, id_slot_cmp);
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && strcmp(ids[i - 1].id, ids[i].id) == 0) {
            free(ids);
            return KV_INVALID_ARGUMENT;
        }
        ranks[ids[i].idx] = (uint32_t)i;
    }
    free(ids);
    return KV_OK;
}

/* Counts the points the ring will hold, or 0 if a limit is exceeded. */
static size_t count_points(const ring_node *nodes, size_t n, unsigned vnodes)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t w = nodes[i].weight ? nodes[i].weight : 1;
        if (w > RING_MAX_WEIGHT)
            return 0;
        total += (uint64_t)w * vnodes;
        if (total > RING_MAX_POINTS)
            return 0;
    }
    return (size_t)total;
}

static void fill_points(ring *r, const ring_node *nodes, const uint32_t *ranks, unsigned vnodes)
{
    char buf[4096];
    size_t k = 0;
    for (size_t i = 0; i < r->nnodes; i++) {
        uint32_t w = nodes[i].weight ? nodes[i].weight : 1;
        size_t idlen = strlen(nodes[i].id);
        for (uint32_t j = 0; j < w * vnodes; j++) {
            uint64_t h;
            if (idlen + 12 <= sizeof buf) {
                int len = snprintf(buf, sizeof buf, "%s-%u", nodes[i].id, j);
                h = kv_hash64(buf, (size_t)len, 0);
            } else { /* very long id: hash the id, then fold in "-<j>" */
                int len = snprintf(buf, sizeof buf, "-%u", j);
                h = kv_hash64(buf, (size_t)len, kv_hash64(nodes[i].id, idlen, 0));
            }
            r->points[k++] = (ring_point){h, (uint32_t)i, ranks[i]};
        }
    }
    qsort(r->points, r->npoints, sizeof *r->points, point_cmp);
}

kv_err ring_create(ring **out, const ring_node *nodes, size_t n, unsigned vnodes)
{
    if (out == NULL || nodes == NULL || n == 0 || n > UINT32_MAX)
        return KV_INVALID_ARGUMENT;
    if (vnodes == 0)
        vnodes = RING_DEFAULT_VNODES;
    if (vnodes > RING_MAX_VNODES)
        return KV_INVALID_ARGUMENT;
    size_t npoints = count_points(nodes, n, vnodes);
    if (npoints == 0)
        return KV_INVALID_ARGUMENT;
    uint32_t *ranks = malloc(n * sizeof *ranks);
    ring *r = calloc(1, sizeof *r);
    ring_point *points = malloc(npoints * sizeof *points);
    kv_err rv = KV_RESOURCE_EXHAUSTED;
    if (ranks != NULL && r != NULL && points != NULL)
        rv = rank_ids(nodes, n, ranks);
    if (rv != KV_OK) {
        free(ranks);
        free(r);
        free(points);
        return rv;
    }
    r->nnodes = n;
    r->npoints = npoints;
    r->points = points;
    fill_points(r, nodes, ranks, vnodes);
    free(ranks);
    *out = r;
    return KV_OK;
}

void ring_destroy(ring *r)
{
    if (r == NULL)
        return;
    free(r->points);
    free(r);
}

size_t ring_node_count(const ring *r)
{
    return r->nnodes;
}

size_t ring_point_count(const ring *r)
{
    return r->npoints;
}

uint64_t ring_point_hash(const ring *r, size_t i)
{
    return r->points[i].hash;
}

uint64_t ring_key_hash(const void *key, size_t klen)
{
    return kv_hash64(key, klen, 0);
}

/* Index of the first point with hash >= h, wrapping to 0 past the end. */
static size_t lower_bound(const ring *r, uint64_t h)
{
    size_t lo = 0, hi = r->npoints;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->points[mid].hash < h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo == r->npoints ? 0 : lo;
}

size_t ring_replicas_hash(const ring *r, uint64_t h, unsigned rf, uint32_t *out_idx)
{
    size_t want = rf < r->nnodes ? rf : r->nnodes;
    size_t got = 0;
    size_t p = lower_bound(r, h);
    /* Every node owns at least one point, so the walk ends within one lap. */
    for (size_t step = 0; got < want && step < r->npoints; step++) {
        uint32_t node = r->points[p].node;
        size_t k = 0;
        while (k < got && out_idx[k] != node)
            k++;
        if (k == got)
            out_idx[got++] = node;
        if (++p == r->npoints)
            p = 0;
    }
    return got;
}

size_t ring_replicas(const ring *r, const void *key, size_t klen, unsigned rf, uint32_t *out_idx)
{
    return ring_replicas_hash(r, ring_key_hash(key, klen), rf, out_idx);
}

uint32_t ring_owner(const ring *r, const void *key, size_t klen)
{
    return r->points[lower_bound(r, ring_key_hash(key, klen))].node;
}

void ring_shares(const ring *r, double *share_out)
{
    for (size_t i = 0; i < r->nnodes; i++)
        share_out[i] = 0.0;
    if (r->npoints == 1) {
        share_out[r->points[0].node] = 1.0;
        return;
    }
    /* Point i owns (points[i-1].hash, points[i].hash]; for i = 0 the arc wraps
     * around 2^64, which unsigned subtraction computes exactly. */
    const double scale = 1.0 / 18446744073709551616.0; /* 2^-64 */
    for (size_t i = 0; i < r->npoints; i++) {
        uint64_t prev = r->points[i == 0 ? r->npoints - 1 : i - 1].hash;
        share_out[r->points[i].node] += (double)(r->points[i].hash - prev) * scale;
    }
}
