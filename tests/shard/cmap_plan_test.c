/* SPDX-License-Identifier: MIT */
/* Tests for membership transitions in shard/clustermap.c and the planning of
 * shard/cmap_plan.c: current and pending replica sets, validation of
 * transition maps, arcs, per-node ranges, the streams of add / remove /
 * replace / reweight (checked against the replica sets at random ring
 * positions), and the maps that complete or roll back a transition. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_err.h"
#include "shard/clustermap.h"
#include "shard/cmap_plan.h"

typedef struct tmap {
    Kv__ClusterMap pb;
    Kv__NodeInfo nodes[6];
    Kv__NodeInfo *ptrs[6];
    Kv__Transition tr;
    char ids[6][8], addrs[6][32];
} tmap;

/* n nodes n1..nN, all UP, rf given, epoch 10, no transition. */
static void base(tmap *t, int n, unsigned rf)
{
    kv__cluster_map__init(&t->pb);
    kv__transition__init(&t->tr);
    t->pb.epoch = 10;
    t->pb.rf = rf;
    t->pb.n_nodes = (size_t)n;
    t->pb.nodes = t->ptrs;
    for (int i = 0; i < 6; i++) {
        kv__node_info__init(&t->nodes[i]);
        snprintf(t->ids[i], sizeof t->ids[i], "n%d", i + 1);
        snprintf(t->addrs[i], sizeof t->addrs[i], "tcp://127.0.0.1:%d", 7001 + i);
        t->nodes[i].id = t->ids[i];
        t->nodes[i].addr = t->addrs[i];
        t->nodes[i].weight = 1;
        t->ptrs[i] = &t->nodes[i];
    }
}

static cmap *build(tmap *t)
{
    cmap *m = NULL;
    char err[256] = "";
    kv_err rv = cmap_from_pb(&t->pb, &m, err, sizeof err);
    cr_assert_eq(rv, KV_OK, "%s: %s", kv_err_name(rv), err);
    return m;
}

static void expect_invalid(tmap *t, const char *needle)
{
    cmap *m = NULL;
    char err[256] = "";
    cr_expect_eq(cmap_from_pb(&t->pb, &m, err, sizeof err), KV_INVALID_ARGUMENT, "%s", needle);
    cr_expect(strstr(err, needle) != NULL, "error \"%s\" should mention \"%s\"", err, needle);
    cmap_unref(m);
}

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static bool in(const uint32_t *s, size_t n, uint32_t i)
{
    for (size_t k = 0; k < n; k++)
        if (s[k] == i)
            return true;
    return false;
}

/* For random positions h: every node the next set gains at h is the target
 * of a stream covering h, whose source is allowed (the lost node paired with
 * it, or a survivor when that one is dead); no stream covers h needlessly. */
static void check_plan(cmap *m, const char *dead)
{
    Kv__StreamPlan **p = NULL;
    size_t np = 0;
    char err[256] = "";
    const char *d[1] = {dead};
    cr_assert_eq(cmap_plan_streams(m, d, dead ? 1 : 0, &p, &np, err, sizeof err), KV_OK, "%s", err);
    cr_assert_gt(np, 0);
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 20000; round++) {
        uint64_t h = rnd(&x);
        uint32_t cur[CMAP_MAX_RF], next[CMAP_MAX_RF], pend[CMAP_MAX_RF];
        size_t nc = cmap_replicas_hash(m, h, cur), nn = cmap_next_replicas_hash(m, h, next);
        size_t npend = cmap_pending_hash(m, h, pend);
        size_t gained = 0;
        for (size_t k = 0; k < nn; k++)
            gained += !in(cur, nc, next[k]);
        cr_assert_eq(npend, gained, "pending = next minus current");
        for (size_t s = 0; s < np; s++) {
            bool covers = false;
            for (size_t r = 0; r < p[s]->n_ranges; r++)
                covers |= cmap_range_has((cmap_range){p[s]->ranges[r]->lo, p[s]->ranges[r]->hi}, h);
            if (!covers)
                continue;
            int src = cmap_find(m, p[s]->source), dst = cmap_find(m, p[s]->target);
            cr_assert(in(pend, npend, (uint32_t)dst),
                      "stream %s covers a position its target "
                      "does not gain",
                      p[s]->id);
            cr_assert(in(cur, nc, (uint32_t)src), "source %s holds the position", p[s]->source);
            if (dead)
                cr_assert_str_neq(p[s]->source, dead, "a dead node is never a source");
        }
        for (size_t k = 0; k < npend; k++) { /* every gained node is fed */
            bool fed = false;
            for (size_t s = 0; s < np && !fed; s++) {
                if (cmap_find(m, p[s]->target) != (int)pend[k])
                    continue;
                for (size_t r = 0; r < p[s]->n_ranges; r++)
                    fed |=
                        cmap_range_has((cmap_range){p[s]->ranges[r]->lo, p[s]->ranges[r]->hi}, h);
            }
            cr_assert(fed, "node %s gains %016llx but no stream feeds it",
                      cmap_node_at(m, pend[k])->id, (unsigned long long)h);
        }
    }
    cmap_plan_free(p, np);
}

Test(cmap_plan, add_node_streams_from_the_replaced_replica)
{
    tmap t;
    base(&t, 4, 2);
    t.nodes[3].state = KV__NODE_STATE__JOINING;
    t.tr.kind = "add";
    t.pb.transition = &t.tr;
    cmap *m = build(&t);
    char key[32];
    uint32_t idx[CMAP_MAX_RF];
    for (int i = 0; i < 2000; i++) { /* n4 is never a current replica */
        size_t len = (size_t)snprintf(key, sizeof key, "k%d", i);
        size_t n = cmap_replicas(m, key, len, idx);
        cr_assert_eq(n, 2);
        cr_assert(!in(idx, n, 3));
        if (cmap_pending(m, key, len, idx) > 0)
            cr_assert(cmap_holds(m, 3, key, len));
    }
    double cur[6], next[6];
    cmap_shares(m, false, cur);
    cmap_shares(m, true, next);
    cr_expect_eq(cur[3], 0.0);
    cr_expect_gt(next[3], 0.1, "n4 owns about a quarter once joined: %f", next[3]);
    check_plan(m, NULL);
    cmap_unref(m);
}

Test(cmap_plan, remove_streams_from_the_leaving_node)
{
    tmap t;
    base(&t, 4, 3);
    t.nodes[1].state = KV__NODE_STATE__LEAVING;
    t.tr.kind = "remove";
    t.pb.transition = &t.tr;
    cmap *m = build(&t);
    Kv__StreamPlan **p;
    size_t np;
    char err[128];
    cr_assert_eq(cmap_plan_streams(m, NULL, 0, &p, &np, err, sizeof err), KV_OK);
    for (size_t s = 0; s < np; s++)
        cr_expect_str_eq(p[s]->source, "n2", "only the leaving node streams");
    cmap_plan_free(p, np);
    check_plan(m, NULL);
    cmap_unref(m);
}

Test(cmap_plan, replace_inherits_ring_and_streams_from_survivors)
{
    tmap t;
    base(&t, 4, 2);
    t.nodes[0].state = KV__NODE_STATE__LEAVING;
    t.nodes[3].state = KV__NODE_STATE__JOINING;
    t.nodes[3].ring_name = "n1";
    t.tr.kind = "replace";
    t.pb.transition = &t.tr;
    cmap *m = build(&t);
    uint64_t x = 7;
    for (int i = 0; i < 5000; i++) { /* n4 takes exactly n1's place */
        uint64_t h = rnd(&x);
        uint32_t cur[CMAP_MAX_RF], next[CMAP_MAX_RF];
        size_t nc = cmap_replicas_hash(m, h, cur), nn = cmap_next_replicas_hash(m, h, next);
        cr_assert_eq(nc, nn);
        for (size_t k = 0; k < nc; k++)
            cr_assert_eq(next[k], cur[k] == 0 ? 3u : cur[k]);
    }
    check_plan(m, "n1");
    Kv__ClusterMap *done;
    cr_assert_eq(cmap_completed_pb(m, &done), KV_OK);
    cmap *m2 = NULL;
    cr_assert_eq(cmap_from_pb(done, &m2, NULL, 0), KV_OK);
    cr_expect_eq(cmap_epoch(m2), 11);
    cr_expect_eq(cmap_node_count(m2), 3);
    cr_expect_eq(cmap_find(m2, "n1"), -1);
    cr_expect_str_eq(cmap_node_at(m2, (size_t)cmap_find(m2, "n4"))->ring_name, "n1");
    cr_expect_null(cmap_transition(m2));
    /* encode/decode keeps the ring name */
    uint8_t *buf;
    size_t len;
    cr_assert_eq(cmap_encode(m2, &buf, &len), KV_OK);
    cmap *m3 = NULL;
    cr_assert_eq(cmap_decode(buf, len, &m3, NULL, 0), KV_OK);
    cr_expect_str_eq(cmap_node_at(m3, (size_t)cmap_find(m3, "n4"))->ring_name, "n1");
    free(buf);
    cmap_unref(m3);
    cmap_unref(m2);
    kv__cluster_map__free_unpacked(done, NULL);
    cmap_unref(m);
}

Test(cmap_plan, replace_with_rf1_has_no_source)
{
    tmap t;
    base(&t, 3, 1);
    t.nodes[0].state = KV__NODE_STATE__LEAVING;
    t.nodes[2].state = KV__NODE_STATE__JOINING;
    t.nodes[2].ring_name = "n1";
    t.tr.kind = "replace";
    t.pb.transition = &t.tr;
    cmap *m = build(&t);
    Kv__StreamPlan **p;
    size_t np;
    char err[256] = "";
    const char *dead[] = {"n1"};
    cr_expect_eq(cmap_plan_streams(m, dead, 1, &p, &np, err, sizeof err), KV_FAILED_PRECONDITION);
    cr_expect(strstr(err, "no live replica") != NULL, "%s", err);
    cmap_unref(m);
}

Test(cmap_plan, reweight_and_abort)
{
    tmap t;
    base(&t, 3, 2);
    t.nodes[2].next_weight = 3;
    t.tr.kind = "weight";
    t.pb.transition = &t.tr;
    cmap *m = build(&t);
    check_plan(m, NULL);
    Kv__ClusterMap *back;
    cr_assert_eq(cmap_aborted_pb(m, &back), KV_OK);
    cmap *m2 = NULL;
    cr_assert_eq(cmap_from_pb(back, &m2, NULL, 0), KV_OK);
    cr_expect_eq(cmap_node_at(m2, 2)->weight, 1);
    cr_expect_eq(cmap_node_at(m2, 2)->next_weight, 0);
    cr_expect_eq(cmap_epoch(m2), 11);
    kv__cluster_map__free_unpacked(back, NULL);
    cmap_unref(m2);
    cr_assert_eq(cmap_completed_pb(m, &back), KV_OK);
    cr_assert_eq(cmap_from_pb(back, &m2, NULL, 0), KV_OK);
    cr_expect_eq(cmap_node_at(m2, 2)->weight, 3);
    kv__cluster_map__free_unpacked(back, NULL);
    cmap_unref(m2);
    cmap_unref(m);
}

Test(cmap_plan, arcs_and_node_ranges_cover_the_ring)
{
    tmap t;
    base(&t, 3, 2);
    cmap *m = build(&t);
    cmap_arc *arcs;
    size_t na;
    cr_assert_eq(cmap_arcs(m, &arcs, &na), KV_OK);
    cr_assert_gt(na, 2);
    for (size_t j = 0; j < na; j++) /* contiguous, in order, wrapping at the end */
        cr_assert_eq(arcs[j].r.lo, arcs[j == 0 ? na - 1 : j - 1].r.hi);
    double share = 0;
    cmap_range *r;
    size_t nr;
    cr_assert_eq(cmap_node_ranges(m, 1, false, &r, &nr), KV_OK);
    uint64_t x = 99;
    for (int i = 0; i < 20000; i++) {
        uint64_t h = rnd(&x);
        uint32_t idx[CMAP_MAX_RF];
        size_t n = cmap_replicas_hash(m, h, idx);
        bool mine = in(idx, n, 1), covered = false;
        for (size_t k = 0; k < nr; k++)
            covered |= cmap_range_has(r[k], h);
        cr_assert_eq(mine, covered, "ranges of n2 at %016llx", (unsigned long long)h);
        share += covered;
    }
    cr_expect(share / 20000 > 0.5 && share / 20000 < 0.85, "rf 2 of 3: about 2/3 (%f)",
              share / 20000);
    free(r);
    free(arcs);
    cmap_unref(m);
}

Test(cmap_plan, invalid_transition_maps)
{
    tmap t;
    base(&t, 3, 2);
    t.nodes[2].state = KV__NODE_STATE__JOINING;
    expect_invalid(&t, "without a transition");
    base(&t, 3, 2);
    t.tr.kind = "add";
    t.pb.transition = &t.tr;
    expect_invalid(&t, "transition without");
    base(&t, 3, 3);
    t.nodes[2].state = KV__NODE_STATE__LEAVING;
    t.tr.kind = "remove";
    t.pb.transition = &t.tr;
    expect_invalid(&t, "fewer than rf");
    base(&t, 3, 2);
    t.nodes[2].ring_name = "n1";
    expect_invalid(&t, "share the ring name");
    base(&t, 3, 2);
    t.nodes[2].ring_name = "bad name";
    expect_invalid(&t, "invalid ring name");
    base(&t, 3, 2);
    t.pb.rf = 17;
    t.pb.n_nodes = 3;
    expect_invalid(&t, "rf 17");
}
