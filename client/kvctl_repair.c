/* SPDX-License-Identifier: MIT */
/*
 * kvctl repair [NODE_ID] [--ranges LO:HI,...]: anti-entropy (DESIGN.md §4).
 * For every arc of the ring (of NODE_ID's arcs, cut to --ranges) each
 * replica hashes its records into Merkle leaves (admin.Digest: 2^d equal
 * parts of the arc, a leaf's hash the sum of xxh64 over (key, version,
 * tombstone)); kvctl compares the leaves and, where two replicas differ,
 * has each pull the other's leaf in diff mode (admin.StreamStart): it reads
 * the source's digests and fetches only the records newer than its own, so
 * only the differing records move, and last-writer-wins makes it safe to
 * run online, interrupt and rerun. A node that lost its data (no map) gets
 * the map first. Once every arc of a node was compared with all its
 * replicas, its NEEDS_REPAIR mark and the peers' lost-hints marks are
 * cleared (admin.Repaired).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvctl_stream.h"
#include "common/clock.h"
#include "shard/cmap_plan.h"

#define DIGEST_MS 3600000u /* digests are paced: a big node takes long */
#define LEAF_KEYS 32       /* records a leaf aims at */

typedef struct item {
    cmap_range r;
    uint32_t n, rep[CMAP_MAX_RF];
    size_t slot[CMAP_MAX_RF]; /* index of the range in each replica's digest request */
} item;

typedef struct repair {
    kvctl_env *env;
    cmap *m;
    item *items;
    size_t nitems;
    uint32_t leaves;
    Kv__DigestReply **dig; /* per node, NULL = not answered */
    uint64_t hashed, compared_keys, diff_leaves;
    size_t incomplete;
} repair;

/* ---- ranges ------------------------------------------------------------ */

/* (lo, hi] as linear inclusive pieces; returns their number (1 or 2). */
static int pieces(cmap_range r, uint64_t p[2][2])
{
    if (r.lo == r.hi) {
        p[0][0] = 0, p[0][1] = UINT64_MAX;
        return 1;
    }
    if (r.lo < r.hi) {
        p[0][0] = r.lo + 1, p[0][1] = r.hi;
        return 1;
    }
    int k = 0;
    if (r.lo != UINT64_MAX)
        p[k][0] = r.lo + 1, p[k][1] = UINT64_MAX, k++;
    p[k][0] = 0, p[k][1] = r.hi, k++;
    return k;
}

static int parse_ranges(const char *spec, cmap_range **out, size_t *n)
{
    char *copy = strdup(spec), *save = NULL;
    cmap_range *v = NULL;
    size_t k = 0;
    for (char *w = strtok_r(copy, ",", &save); w; w = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(w, ':'), *e1, *e2;
        cmap_range r = {0};
        if (colon) {
            *colon = '\0';
            r.lo = strtoull(w, &e1, 0);
            r.hi = strtoull(colon + 1, &e2, 0);
        }
        cmap_range *nv =
            colon && !*e1 && !*e2 && *w && colon[1] ? realloc(v, (k + 1) * sizeof(*v)) : NULL;
        if (!nv) {
            fprintf(stderr,
                    "kvctl: INVALID_ARGUMENT: --ranges: '%s' is not LO:HI (numbers, "
                    "0x for hex)\n",
                    w);
            free(v);
            free(copy);
            return KVCTL_USAGE;
        }
        v = nv;
        v[k++] = r;
    }
    free(copy);
    *out = v;
    *n = k;
    return k ? KVCTL_OK : KVCTL_USAGE;
}

static int add_item(repair *rp, const cmap_arc *a, cmap_range r)
{
    item *ni = realloc(rp->items, (rp->nitems + 1) * sizeof(*ni));
    if (!ni)
        return kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    rp->items = ni;
    item *it = &rp->items[rp->nitems++];
    memset(it, 0, sizeof(*it));
    it->r = r;
    it->n = a->ncur;
    memcpy(it->rep, a->cur, a->ncur * sizeof(a->cur[0]));
    return KVCTL_OK;
}

/* The arc cut to the filter ranges (each intersection one item). */
static int clip_arc(repair *rp, const cmap_arc *a, const cmap_range *f, size_t nf)
{
    if (!nf)
        return add_item(rp, a, a->r);
    uint64_t pa[2][2], pf[2][2];
    int na = pieces(a->r, pa), code = KVCTL_OK;
    for (size_t k = 0; code == KVCTL_OK && k < nf; k++) {
        int nfp = pieces(f[k], pf);
        for (int x = 0; x < na; x++)
            for (int y = 0; y < nfp && code == KVCTL_OK; y++) {
                uint64_t lo = pa[x][0] > pf[y][0] ? pa[x][0] : pf[y][0];
                uint64_t hi = pa[x][1] < pf[y][1] ? pa[x][1] : pf[y][1];
                if (lo <= hi && !(lo == 0 && hi == UINT64_MAX))
                    code = add_item(rp, a, (cmap_range){lo - 1, hi}); /* lo 0: (MAX, hi] */
                else if (lo <= hi)
                    code = add_item(rp, a, (cmap_range){0, 0});
            }
    }
    return code;
}

static int select_items(repair *rp, int node, const cmap_range *f, size_t nf)
{
    cmap_arc *arcs;
    size_t na;
    if (cmap_arcs(rp->m, &arcs, &na) != KV_OK)
        return kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    int code = KVCTL_OK;
    for (size_t j = 0; code == KVCTL_OK && j < na; j++) {
        bool mine = node < 0;
        for (uint32_t k = 0; k < arcs[j].ncur; k++)
            mine |= arcs[j].cur[k] == (uint32_t)node;
        if (mine && arcs[j].ncur > 1)
            code = clip_arc(rp, &arcs[j], f, nf);
    }
    free(arcs);
    return code;
}

/* ---- digests ----------------------------------------------------------- */

static uint64_t stat_u64(const Kv__StatsReply *s, const char *name)
{
    for (size_t i = 0; s && i < s->n_stats; i++)
        if (strcmp(s->stats[i]->name, name) == 0)
            return strtoull(s->stats[i]->value, NULL, 10);
    return 0;
}

/* Leaves per range: about LEAF_KEYS records per leaf on the fullest node. */
static void pick_leaves(repair *rp)
{
    uint64_t most = 0;
    for (size_t i = 0; i < cmap_node_count(rp->m); i++) {
        rpc_chan *ch = kvctl_open_chan(rp->env, cmap_node_at(rp->m, i)->addr);
        Kv__StatsRequest req = KV__STATS_REQUEST__INIT;
        rpc_reply rep;
        if (ch && kvctl_call(rp->env, ch, "admin.Stats", &req.base, 0, &rep, true) == KVCTL_OK) {
            Kv__StatsReply *s = kv__stats_reply__unpack(NULL, rep.len, rep.body);
            uint64_t k = stat_u64(s, "records_estimate");
            most = k > most ? k : most;
            if (s)
                kv__stats_reply__free_unpacked(s, NULL);
            rpc_reply_free(&rep);
        }
        rpc_chan_close(ch);
    }
    uint64_t per_range = rp->nitems ? most / rp->nitems : 0;
    rp->leaves = 1;
    while (rp->leaves < 1024 && (uint64_t)rp->leaves * LEAF_KEYS < per_range)
        rp->leaves *= 2;
}

/* admin.Digest of every item node x replicates. */
static void digest_node(repair *rp, uint32_t x)
{
    Kv__Range *rs = calloc(rp->nitems, sizeof(*rs));
    Kv__Range **ptrs = calloc(rp->nitems, sizeof(*ptrs));
    size_t k = 0;
    for (size_t i = 0; rs && ptrs && i < rp->nitems; i++)
        for (uint32_t q = 0; q < rp->items[i].n; q++)
            if (rp->items[i].rep[q] == x) {
                kv__range__init(&rs[k]);
                rs[k].lo = rp->items[i].r.lo;
                rs[k].hi = rp->items[i].r.hi;
                rp->items[i].slot[q] = k;
                ptrs[k] = &rs[k];
                k++;
            }
    Kv__DigestRequest req = KV__DIGEST_REQUEST__INIT;
    req.n_ranges = k;
    req.ranges = ptrs;
    req.leaves = rp->leaves;
    req.mbps = (uint32_t)rp->env->stream_mbps;
    rpc_chan *ch = k ? kvctl_open_chan(rp->env, cmap_node_at(rp->m, x)->addr) : NULL;
    rpc_reply rep;
    if (ch &&
        kvctl_call(rp->env, ch, "admin.Digest", &req.base, DIGEST_MS, &rep, false) == KVCTL_OK) {
        Kv__DigestReply *d = kv__digest_reply__unpack(NULL, rep.len, rep.body);
        if (d && d->n_ranges == k)
            rp->dig[x] = d;
        else if (d)
            kv__digest_reply__free_unpacked(d, NULL);
        rpc_reply_free(&rep);
    }
    rpc_chan_close(ch);
    free(rs);
    free(ptrs);
}

/* ---- comparing --------------------------------------------------------- */

typedef struct flow {
    uint32_t src, dst;
    cmap_range *r;
    size_t n;
} flow;

typedef struct flows {
    flow *f;
    size_t n;
} flows;

static int flow_add(flows *fs, uint32_t src, uint32_t dst, cmap_range r)
{
    flow *f = NULL;
    for (size_t i = 0; i < fs->n && !f; i++)
        if (fs->f[i].src == src && fs->f[i].dst == dst)
            f = &fs->f[i];
    if (!f) {
        flow *nf = realloc(fs->f, (fs->n + 1) * sizeof(*nf));
        if (!nf)
            return KVCTL_SERVER;
        fs->f = nf;
        f = &fs->f[fs->n++];
        *f = (flow){.src = src, .dst = dst};
    }
    if (f->n && f->r[f->n - 1].hi == r.lo) {
        f->r[f->n - 1].hi = r.hi;
        return KVCTL_OK;
    }
    cmap_range *nr = realloc(f->r, (f->n + 1) * sizeof(*nr));
    if (!nr)
        return KVCTL_SERVER;
    f->r = nr;
    f->r[f->n++] = r;
    return KVCTL_OK;
}

/* Leaf l of (lo, hi] cut in `leaves` parts, as the node's leaf_of cuts it:
 * offsets off = h - lo - 1 with floor(off * leaves / span) = l. */
static cmap_range leaf_range(cmap_range r, uint32_t l, uint32_t leaves)
{
    unsigned __int128 span =
        r.hi - r.lo ? (unsigned __int128)(r.hi - r.lo) : ((unsigned __int128)1 << 64);
    uint64_t a = (uint64_t)((span * l + leaves - 1) / leaves);
    uint64_t b = (uint64_t)((span * (l + 1) + leaves - 1) / leaves);
    if (leaves == 1)
        return r;
    return (cmap_range){r.lo + a, r.lo + b};
}

/* Compares the replicas' leaves of item i; differing pairs pull each other. */
static int compare_item(repair *rp, const item *it, flows *fs)
{
    const Kv__RangeDigest *d[CMAP_MAX_RF];
    for (uint32_t q = 0; q < it->n; q++) {
        const Kv__DigestReply *dr = rp->dig[it->rep[q]];
        d[q] = dr ? dr->ranges[it->slot[q]] : NULL;
        if (!d[q] || d[q]->n_leaf_hash != rp->leaves || d[q]->n_leaf_count != rp->leaves) {
            rp->incomplete++;
            return KVCTL_OK;
        }
    }
    int code = KVCTL_OK;
    for (uint32_t l = 0; code == KVCTL_OK && l < rp->leaves; l++) {
        uint32_t most = 0;
        bool differ = false;
        for (uint32_t q = 0; q < it->n; q++) {
            rp->hashed += d[q]->leaf_count[l];
            most = d[q]->leaf_count[l] > most ? d[q]->leaf_count[l] : most;
            differ |= d[q]->leaf_hash[l] != d[0]->leaf_hash[l] ||
                      d[q]->leaf_count[l] != d[0]->leaf_count[l];
        }
        rp->compared_keys += most;
        if (!differ)
            continue;
        rp->diff_leaves++;
        cmap_range lr = leaf_range(it->r, l, rp->leaves);
        if (lr.lo == lr.hi && rp->leaves > 1)
            continue; /* an empty leaf of a tiny arc: it cannot differ */
        for (uint32_t a = 0; a < it->n; a++)
            for (uint32_t b = 0; b < it->n && code == KVCTL_OK; b++)
                if (a != b && d[a]->leaf_count[l] &&
                    (d[a]->leaf_hash[l] != d[b]->leaf_hash[l] ||
                     d[a]->leaf_count[l] != d[b]->leaf_count[l]))
                    code = flow_add(fs, it->rep[a], it->rep[b], lr);
    }
    return code;
}

/* ---- running ----------------------------------------------------------- */

/* The pull jobs of the flows (job.ranges point into rs, which the caller
 * frees after the streams). */
static kvctl_stream *make_jobs(repair *rp, const flows *fs, Kv__Range ***rs_out)
{
    kvctl_stream *s = calloc(fs->n ? fs->n : 1, sizeof(*s));
    Kv__Range **rs = calloc(fs->n ? fs->n : 1, sizeof(*rs));
    uint64_t stamp = kv_wall_ms();
    for (size_t i = 0; s && rs && i < fs->n; i++) {
        const flow *f = &fs->f[i];
        Kv__Range *r = calloc(f->n, sizeof(*r));
        Kv__Range **ptrs = calloc(f->n, sizeof(*ptrs));
        char *id = malloc(3 * CMAP_MAX_ID + 40);
        if (!r || !ptrs || !id) {
            free(r), free(ptrs), free(id);
            continue;
        }
        for (size_t k = 0; k < f->n; k++) {
            kv__range__init(&r[k]);
            r[k].lo = f->r[k].lo;
            r[k].hi = f->r[k].hi;
            ptrs[k] = &r[k];
        }
        rs[i] = r;
        const cmap_node *src = cmap_node_at(rp->m, f->src), *dst = cmap_node_at(rp->m, f->dst);
        snprintf(id, 3 * CMAP_MAX_ID + 40, "repair-%llu-%s-%s", (unsigned long long)stamp, dst->id,
                 src->id);
        kv__stream_job__init(&s[i].job);
        s[i].job.id = id;
        s[i].job.source_id = (char *)src->id;
        s[i].job.source_addr = (char *)src->addr;
        s[i].job.n_ranges = f->n;
        s[i].job.ranges = ptrs;
        s[i].job.mbps = (uint32_t)rp->env->stream_mbps;
        s[i].job.diff = true;
        s[i].source = src->id;
        s[i].target = dst->id;
        s[i].target_addr = dst->addr;
    }
    *rs_out = rs;
    return s;
}

static void free_jobs(kvctl_stream *s, Kv__Range **rs, size_t n)
{
    for (size_t i = 0; s && i < n; i++) {
        free(s[i].job.id);
        free(s[i].job.ranges);
        free(rs ? rs[i] : NULL);
    }
    free(s);
    free(rs);
}

/* Clears the repair marks of the nodes whose every arc was compared. */
static void mark_repaired(repair *rp, int node, bool whole)
{
    for (size_t x = 0; x < cmap_node_count(rp->m); x++) {
        if (!(whole || (int)x == node))
            continue;
        for (size_t y = 0; y < cmap_node_count(rp->m); y++) {
            Kv__RepairedRequest req = KV__REPAIRED_REQUEST__INIT;
            req.node_id = (char *)cmap_node_at(rp->m, x)->id;
            rpc_chan *ch = kvctl_open_chan(rp->env, cmap_node_at(rp->m, y)->addr);
            rpc_reply rep;
            if (ch &&
                kvctl_call(rp->env, ch, "admin.Repaired", &req.base, 0, &rep, true) == KVCTL_OK)
                rpc_reply_free(&rep);
            rpc_chan_close(ch);
        }
    }
}

static void report(repair *rp, const kvctl_stream *s, size_t n, double secs, bool marked)
{
    kvctl_totals t;
    kvctl_streams_total(s, n, &t);
    if (rp->env->json) {
        printf("{\"event\":\"done\",\"ranges\":%zu,\"ranges_incomplete\":%zu,\"leaves\":%u,"
               "\"leaves_differing\":%llu,\"records_hashed\":%llu,\"keys_compared\":%llu,"
               "\"keys_checked\":%llu,\"keys_repaired\":%llu,\"bytes\":%llu,\"streams\":%zu,"
               "\"seconds\":%.1f,\"marks_cleared\":%s}\n",
               rp->nitems, rp->incomplete, rp->leaves, (unsigned long long)rp->diff_leaves,
               (unsigned long long)rp->hashed, (unsigned long long)rp->compared_keys,
               (unsigned long long)t.compared, (unsigned long long)t.applied,
               (unsigned long long)t.bytes, n, secs, marked ? "true" : "false");
        return;
    }
    char b[32];
    kvctl_human((double)t.bytes, b, sizeof(b));
    printf("repair: %zu ranges (%u leaves each), %llu keys compared, %llu leaves differed; %llu "
           "keys checked, %llu repaired, %s streamed in %.1f s\n",
           rp->nitems, rp->leaves, (unsigned long long)rp->compared_keys,
           (unsigned long long)rp->diff_leaves, (unsigned long long)t.compared,
           (unsigned long long)t.applied, b, secs);
    if (rp->incomplete)
        printf("repair: %zu ranges were not compared (a replica did not answer): rerun when it "
               "is back\n",
               rp->incomplete);
}

/* A node that lost its data has no map: give it the map first. */
static int give_map(repair *rp, int node)
{
    const cmap_node *nd = cmap_node_at(rp->m, (size_t)node);
    rpc_chan *ch = kvctl_open_chan(rp->env, nd->addr);
    Kv__PingReply *p = ch ? kvctl_ping_rpc(rp->env, ch, NULL, false) : NULL;
    int code = p ? KVCTL_OK : KVCTL_SERVER;
    if (p && p->serving == KV__SERVING__NO_MAP) {
        Kv__ClusterMap *pb = NULL;
        Kv__SetMapRequest req = KV__SET_MAP_REQUEST__INIT;
        rpc_reply rep;
        if (kvctl_map_pb(rp->env, rp->m, &pb) == KV_OK) {
            req.map = pb;
            code = kvctl_call(rp->env, ch, "admin.SetMap", &req.base, 0, &rep, false);
            if (code == KVCTL_OK)
                rpc_reply_free(&rep);
            kv__cluster_map__free_unpacked(pb, NULL);
        }
        if (code == KVCTL_OK && !rp->env->json)
            printf("node %s had no cluster map (lost data?): gave it epoch %llu\n", nd->id,
                   (unsigned long long)cmap_epoch(rp->m));
    }
    if (p)
        kv__ping_reply__free_unpacked(p, NULL);
    rpc_chan_close(ch);
    return code;
}

static int run_repair(repair *rp, int node, bool whole)
{
    uint64_t t0 = kv_now_ns();
    pick_leaves(rp);
    for (size_t x = 0; x < cmap_node_count(rp->m); x++)
        digest_node(rp, (uint32_t)x);
    flows fs = {0};
    int code = KVCTL_OK;
    for (size_t i = 0; code == KVCTL_OK && i < rp->nitems; i++)
        code = compare_item(rp, &rp->items[i], &fs);
    Kv__Range **rs = NULL;
    kvctl_stream *s = code == KVCTL_OK ? make_jobs(rp, &fs, &rs) : NULL;
    if (code == KVCTL_OK && !s)
        code = kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    kvctl_catch_sigint();
    if (code == KVCTL_OK && fs.n)
        code = kvctl_streams_start(rp->env, s, fs.n);
    if (code == KVCTL_OK && fs.n && !rp->env->no_wait)
        code = kvctl_streams_wait(rp->env, s, fs.n, "repair");
    if (code == KVCTL_INTERRUPTED)
        fprintf(stderr, "kvctl: interrupted; the repair streams go on on the nodes: rerun the "
                        "command to check the result\n");
    bool marked = code == KVCTL_OK && !rp->incomplete && !rp->env->no_wait && (whole || node >= 0);
    if (marked)
        mark_repaired(rp, node, whole);
    if (code == KVCTL_OK)
        report(rp, s, fs.n, (double)(kv_now_ns() - t0) / 1e9, marked);
    free_jobs(s, rs, fs.n);
    for (size_t i = 0; i < fs.n; i++)
        free(fs.f[i].r);
    free(fs.f);
    if (code == KVCTL_OK && rp->incomplete)
        code = KVCTL_SERVER;
    return code;
}

int kvctl_repair(kvctl_env *env, int argc, char **argv)
{
    repair rp = {.env = env};
    cmap_range *f = NULL;
    size_t nf = 0;
    if (env->ranges && parse_ranges(env->ranges, &f, &nf) != KVCTL_OK)
        return KVCTL_USAGE;
    int code = kvctl_fetch_latest_map(env, &rp.m);
    int node = -1;
    if (code == KVCTL_OK && cmap_transition(rp.m))
        code = kvctl_fail(KV_FAILED_PRECONDITION, "a membership change is in progress: finish "
                                                  "or abort it (kvctl node ...) before a repair");
    if (code == KVCTL_OK && argc == 1 && (node = cmap_find(rp.m, argv[0])) < 0) {
        char msg[200];
        snprintf(msg, sizeof(msg), "no node %s in the cluster map", argv[0]);
        code = kvctl_fail(KV_NOT_FOUND, msg);
    }
    if (code == KVCTL_OK && node >= 0)
        code = give_map(&rp, node);
    if (code == KVCTL_OK)
        code = select_items(&rp, node, f, nf);
    rp.dig = code == KVCTL_OK ? calloc(cmap_node_count(rp.m), sizeof(*rp.dig)) : NULL;
    if (code == KVCTL_OK && !rp.dig)
        code = kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    if (code == KVCTL_OK)
        code = run_repair(&rp, node, node < 0 && nf == 0);
    for (size_t x = 0; rp.dig && x < cmap_node_count(rp.m); x++)
        if (rp.dig[x])
            kv__digest_reply__free_unpacked(rp.dig[x], NULL);
    free(rp.dig);
    free(rp.items);
    free(f);
    cmap_unref(rp.m);
    return code;
}
