/* SPDX-License-Identifier: MIT */
/*
 * Cluster-map planning: arcs and their replica sets, per-node ranges, the
 * streams of a transition, completed and rolled-back maps. The arcs are the
 * intervals between consecutive points of the union of the current and the
 * pending ring: on each arc both replica sets are constant (a position's set
 * is decided by the first point at or after it, and no point of either ring
 * lies strictly inside an arc), so each set is computed once, at the arc's
 * upper end.
 */
#include "shard/cmap_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorted, unique point positions of both rings. */
static kv_err boundaries(const cmap *m, uint64_t **out, size_t *n)
{
    const ring *a = cmap_ring(m), *b = cmap_ring_next(m);
    size_t na = ring_point_count(a), nb = b != a ? ring_point_count(b) : 0;
    uint64_t *h = malloc((na + nb) * sizeof *h);
    if (h == NULL)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < na; i++)
        h[i] = ring_point_hash(a, i);
    for (size_t i = 0; i < nb; i++)
        h[na + i] = ring_point_hash(b, i);
    qsort(h, na + nb, sizeof *h, u64_cmp);
    size_t k = 0;
    for (size_t i = 0; i < na + nb; i++)
        if (k == 0 || h[k - 1] != h[i])
            h[k++] = h[i];
    *out = h;
    *n = k;
    return KV_OK;
}

static bool same_sets(const cmap_arc *x, const cmap_arc *y)
{
    return x->ncur == y->ncur && x->nnext == y->nnext &&
           memcmp(x->cur, y->cur, x->ncur * sizeof x->cur[0]) == 0 &&
           memcmp(x->next, y->next, x->nnext * sizeof x->next[0]) == 0;
}

kv_err cmap_arcs(const cmap *m, cmap_arc **out, size_t *n)
{
    uint64_t *b;
    size_t nb;
    kv_err rv = boundaries(m, &b, &nb);
    if (rv != KV_OK)
        return rv;
    cmap_arc *arcs = malloc(nb * sizeof *arcs);
    if (arcs == NULL) {
        free(b);
        return KV_RESOURCE_EXHAUSTED;
    }
    size_t k = 0;
    for (size_t j = 0; j < nb; j++) {
        cmap_arc a = {.r = {nb == 1 ? b[0] : b[j == 0 ? nb - 1 : j - 1], b[j]}};
        a.ncur = (uint32_t)cmap_replicas_hash(m, b[j], a.cur);
        a.nnext = (uint32_t)cmap_next_replicas_hash(m, b[j], a.next);
        if (k > 0 && same_sets(&arcs[k - 1], &a) && arcs[k - 1].r.hi == a.r.lo)
            arcs[k - 1].r.hi = a.r.hi;
        else
            arcs[k++] = a;
    }
    free(b);
    *out = arcs;
    *n = k;
    return KV_OK;
}

static bool has(const uint32_t *set, uint32_t n, uint32_t i)
{
    for (uint32_t k = 0; k < n; k++)
        if (set[k] == i)
            return true;
    return false;
}

/* Appends r to a range list, merging it with the last range when adjacent. */
static kv_err range_push(cmap_range **v, size_t *n, size_t *cap, cmap_range r)
{
    if (*n > 0 && (*v)[*n - 1].hi == r.lo && (*v)[*n - 1].lo != (*v)[*n - 1].hi) {
        (*v)[*n - 1].hi = r.hi;
        return KV_OK;
    }
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        cmap_range *nv = realloc(*v, nc * sizeof *nv);
        if (nv == NULL)
            return KV_RESOURCE_EXHAUSTED;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = r;
    return KV_OK;
}

kv_err cmap_node_ranges(const cmap *m, size_t i, bool next, cmap_range **out, size_t *n)
{
    cmap_arc *arcs;
    size_t na, k = 0, cap = 0;
    kv_err rv = cmap_arcs(m, &arcs, &na);
    if (rv != KV_OK)
        return rv;
    cmap_range *v = NULL;
    for (size_t j = 0; rv == KV_OK && j < na; j++) {
        bool in = next ? has(arcs[j].next, arcs[j].nnext, (uint32_t)i)
                       : has(arcs[j].cur, arcs[j].ncur, (uint32_t)i);
        if (in)
            rv = range_push(&v, &k, &cap, arcs[j].r);
    }
    free(arcs);
    if (rv != KV_OK) {
        free(v);
        return rv;
    }
    *out = v;
    *n = k;
    return KV_OK;
}

/* ---- stream planning --------------------------------------------------- */

typedef struct flow {
    uint32_t src, dst;
    cmap_range *r;
    size_t n, cap;
} flow;

typedef struct flows {
    flow *f;
    size_t n, cap;
} flows;

static kv_err flow_add(flows *fs, uint32_t src, uint32_t dst, cmap_range r)
{
    for (size_t i = 0; i < fs->n; i++)
        if (fs->f[i].src == src && fs->f[i].dst == dst)
            return range_push(&fs->f[i].r, &fs->f[i].n, &fs->f[i].cap, r);
    if (fs->n == fs->cap) {
        size_t nc = fs->cap ? fs->cap * 2 : 8;
        flow *nf = realloc(fs->f, nc * sizeof *nf);
        if (nf == NULL)
            return KV_RESOURCE_EXHAUSTED;
        fs->f = nf;
        fs->cap = nc;
    }
    fs->f[fs->n++] = (flow){.src = src, .dst = dst};
    return range_push(&fs->f[fs->n - 1].r, &fs->f[fs->n - 1].n, &fs->f[fs->n - 1].cap, r);
}

static bool is_dead(const cmap *m, uint32_t i, const char *const *dead, size_t ndead)
{
    for (size_t k = 0; k < ndead; k++)
        if (strcmp(cmap_node_at(m, i)->id, dead[k]) == 0)
            return true;
    return false;
}

/* The flows of one arc: each gained node pulls from the lost node paired
 * with it, or from every live survivor when that node is dead. */
static kv_err arc_flows(const cmap *m, const cmap_arc *a, const char *const *dead, size_t ndead,
                        flows *fs, char *err, size_t errlen)
{
    uint32_t gained[CMAP_MAX_RF], lost[CMAP_MAX_RF], ng = 0, nl = 0;
    for (uint32_t k = 0; k < a->nnext; k++)
        if (!has(a->cur, a->ncur, a->next[k]))
            gained[ng++] = a->next[k];
    for (uint32_t k = 0; k < a->ncur; k++)
        if (!has(a->next, a->nnext, a->cur[k]))
            lost[nl++] = a->cur[k];
    kv_err rv = KV_OK;
    for (uint32_t g = 0; rv == KV_OK && g < ng; g++) {
        if (g < nl && !is_dead(m, lost[g], dead, ndead)) {
            rv = flow_add(fs, lost[g], gained[g], a->r);
            continue;
        }
        int sources = 0;
        for (uint32_t k = 0; rv == KV_OK && k < a->ncur; k++) {
            if (is_dead(m, a->cur[k], dead, ndead) || !has(a->next, a->nnext, a->cur[k]))
                continue;
            rv = flow_add(fs, a->cur[k], gained[g], a->r);
            sources++;
        }
        if (rv == KV_OK && sources == 0) {
            snprintf(err, errlen,
                     "no live replica holds the range (%016llx, %016llx] that %s takes over "
                     "(rf %u: its only copy was on a dead node)",
                     (unsigned long long)a->r.lo, (unsigned long long)a->r.hi,
                     cmap_node_at(m, gained[g])->id, cmap_rf(m));
            rv = KV_FAILED_PRECONDITION;
        }
    }
    return rv;
}

void cmap_plan_free(Kv__StreamPlan **plans, size_t n)
{
    for (size_t i = 0; plans != NULL && i < n; i++)
        if (plans[i] != NULL)
            kv__stream_plan__free_unpacked(plans[i], NULL);
    free(plans);
}

/* Turns one flow into a heap-allocated StreamPlan (free_unpacked-able). */
static Kv__StreamPlan *plan_of(const cmap *m, const flow *f)
{
    Kv__StreamPlan *p = malloc(sizeof *p);
    if (p == NULL)
        return NULL;
    kv__stream_plan__init(p);
    char id[3 * CMAP_MAX_ID + 32];
    const char *s = cmap_node_at(m, f->src)->id, *d = cmap_node_at(m, f->dst)->id;
    snprintf(id, sizeof id, "%llu-%s-%s", (unsigned long long)cmap_epoch(m), s, d);
    p->id = strdup(id);
    p->source = strdup(s);
    p->target = strdup(d);
    p->ranges = calloc(f->n ? f->n : 1, sizeof *p->ranges);
    bool ok = p->id && p->source && p->target && p->ranges;
    for (size_t i = 0; ok && i < f->n; i++) {
        Kv__Range *r = malloc(sizeof *r);
        if (!(ok = r != NULL))
            break;
        kv__range__init(r);
        r->lo = f->r[i].lo;
        r->hi = f->r[i].hi;
        p->ranges[p->n_ranges++] = r;
    }
    if (!ok) {
        kv__stream_plan__free_unpacked(p, NULL);
        return NULL;
    }
    return p;
}

kv_err cmap_plan_streams(const cmap *m, const char *const *dead, size_t ndead,
                         Kv__StreamPlan ***out, size_t *n, char *err, size_t errlen)
{
    if (cmap_transition(m) == NULL) {
        snprintf(err, errlen, "the map has no transition to plan");
        return KV_INVALID_ARGUMENT;
    }
    cmap_arc *arcs;
    size_t na;
    kv_err rv = cmap_arcs(m, &arcs, &na);
    if (rv != KV_OK)
        return rv;
    flows fs = {0};
    for (size_t j = 0; rv == KV_OK && j < na; j++)
        rv = arc_flows(m, &arcs[j], dead, ndead, &fs, err, errlen);
    free(arcs);
    Kv__StreamPlan **plans = rv == KV_OK ? calloc(fs.n ? fs.n : 1, sizeof *plans) : NULL;
    if (rv == KV_OK && plans == NULL)
        rv = KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; rv == KV_OK && i < fs.n; i++)
        if ((plans[i] = plan_of(m, &fs.f[i])) == NULL)
            rv = KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < fs.n; i++)
        free(fs.f[i].r);
    free(fs.f);
    if (rv != KV_OK) {
        cmap_plan_free(plans, fs.n);
        return rv;
    }
    *out = plans;
    *n = fs.n;
    return KV_OK;
}

/* ---- ending a transition ----------------------------------------------- */

/* Builds epoch + 1 from m without its transition; keep(i) decides which
 * nodes stay, and each kept node is UP with weight w(i). */
static kv_err end_pb(const cmap *m, bool complete, Kv__ClusterMap **out)
{
    if (cmap_transition(m) == NULL)
        return KV_INVALID_ARGUMENT;
    Kv__ClusterMap *pb;
    kv_err rv = cmap_to_pb(m, &pb);
    if (rv != KV_OK)
        return rv;
    size_t k = 0;
    for (size_t i = 0; i < pb->n_nodes; i++) {
        Kv__NodeInfo *ni = pb->nodes[i];
        cmap_state st = (cmap_state)ni->state;
        bool gone = complete ? st == CMAP_LEAVING : st == CMAP_JOINING;
        if (gone) {
            kv__node_info__free_unpacked(ni, NULL);
            continue;
        }
        if (complete && ni->next_weight)
            ni->weight = ni->next_weight;
        ni->next_weight = 0;
        if (st == CMAP_JOINING || st == CMAP_LEAVING)
            ni->state = KV__NODE_STATE__UP;
        pb->nodes[k++] = ni;
    }
    pb->n_nodes = k;
    pb->epoch = cmap_epoch(m) + 1;
    kv__transition__free_unpacked(pb->transition, NULL);
    pb->transition = NULL;
    *out = pb;
    return KV_OK;
}

kv_err cmap_completed_pb(const cmap *m, Kv__ClusterMap **out)
{
    return end_pb(m, true, out);
}

kv_err cmap_aborted_pb(const cmap *m, Kv__ClusterMap **out)
{
    return end_pb(m, false, out);
}
