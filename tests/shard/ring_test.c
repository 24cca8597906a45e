/* SPDX-License-Identifier: MIT */
/* Tests for shard/ring.c: balance, minimal movement on growth, distinct
 * replicas, weights, and independence from node order. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "kv/kv_err.h"
#include "shard/ring.h"

#define NKEYS 100000

static ring *make(const ring_node *nodes, size_t n)
{
    ring *r = NULL;
    kv_err rv = ring_create(&r, nodes, n, 128);
    cr_assert_eq(rv, KV_OK, "ring_create: %s", kv_strerror(rv));
    return r;
}

static size_t key(char *buf, int i)
{
    return (size_t)snprintf(buf, 32, "user:%08x", (unsigned)i * 2654435761u);
}

static void count_owners(const ring *r, size_t *counts, size_t n)
{
    char buf[32];
    memset(counts, 0, n * sizeof *counts);
    for (int i = 0; i < NKEYS; i++) {
        size_t len = key(buf, i);
        counts[ring_owner(r, buf, len)]++;
    }
}

Test(ring, balance_three_nodes)
{
    ring_node nodes[] = {{"n1", 1}, {"n2", 1}, {"n3", 1}};
    ring *r = make(nodes, 3);
    size_t counts[3];
    double shares[3], sum = 0;
    count_owners(r, counts, 3);
    ring_shares(r, shares);
    for (int i = 0; i < 3; i++) {
        double frac = (double)counts[i] / NKEYS;
        cr_expect(frac > 1.0 / 3 - 0.05 && frac < 1.0 / 3 + 0.05, "node %d owns %.3f", i, frac);
        cr_expect(shares[i] > frac - 0.01 && shares[i] < frac + 0.01, "share %.3f vs keys %.3f",
                  shares[i], frac);
        sum += shares[i];
    }
    cr_expect(sum > 0.999999 && sum < 1.000001, "shares sum to %f", sum);
    cr_expect_eq(ring_point_count(r), 3 * 128);
    ring_destroy(r);
}

Test(ring, adding_a_node_moves_keys_only_to_it)
{
    ring_node nodes[] = {{"n1", 1}, {"n2", 1}, {"n3", 1}, {"n4", 1}};
    ring *r3 = make(nodes, 3), *r4 = make(nodes, 4);
    char buf[32];
    int moved = 0;
    for (int i = 0; i < NKEYS; i++) {
        size_t len = key(buf, i);
        uint32_t a = ring_owner(r3, buf, len), b = ring_owner(r4, buf, len);
        if (a != b) {
            moved++;
            cr_assert_eq(b, 3, "key %s moved from n%u to n%u", buf, a + 1, b + 1);
        }
    }
    cr_expect(moved <= NKEYS * 3 / 10, "%d of %d keys moved", moved, NKEYS);
    cr_expect(moved > NKEYS / 10, "only %d keys moved to the new node", moved);
    ring_destroy(r3);
    ring_destroy(r4);
}

Test(ring, replicas_are_distinct_owner_first)
{
    ring_node nodes[] = {{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}, {"e", 1}};
    ring *r = make(nodes, 5);
    char buf[32];
    uint32_t idx[8];
    for (int i = 0; i < 10000; i++) {
        size_t len = key(buf, i);
        cr_assert_eq(ring_replicas(r, buf, len, 3, idx), 3);
        cr_assert_eq(idx[0], ring_owner(r, buf, len));
        cr_assert(idx[0] != idx[1] && idx[0] != idx[2] && idx[1] != idx[2]);
        cr_assert(idx[0] < 5 && idx[1] < 5 && idx[2] < 5);
    }
    cr_assert_eq(ring_replicas(r, "k", 1, 8, idx), 5, "rf > n gives n replicas");
    cr_assert_eq(ring_replicas(r, "k", 1, 0, idx), 0);
    ring_destroy(r);
}

Test(ring, weight_two_gets_twice_the_share)
{
    ring_node nodes[] = {{"n1", 1}, {"n2", 2}, {"n3", 1}};
    ring *r = make(nodes, 3);
    size_t counts[3];
    count_owners(r, counts, 3);
    double ratio = (double)counts[1] / ((counts[0] + counts[2]) / 2.0);
    cr_expect(ratio > 1.7 && ratio < 2.3, "weight-2 node owns %.2fx the others", ratio);
    cr_expect_eq(ring_point_count(r), 4 * 128);
    ring_destroy(r);
}

Test(ring, independent_of_node_order)
{
    ring_node fwd[] = {{"alpha", 1}, {"beta", 3}, {"gamma", 1}, {"delta", 2}};
    ring_node rev[] = {{"delta", 2}, {"gamma", 1}, {"beta", 3}, {"alpha", 1}};
    ring *a = make(fwd, 4), *b = make(rev, 4);
    char buf[32];
    uint32_t ia[3], ib[3];
    for (int i = 0; i < 20000; i++) {
        size_t len = key(buf, i);
        cr_assert_eq(ring_replicas(a, buf, len, 3, ia), 3);
        cr_assert_eq(ring_replicas(b, buf, len, 3, ib), 3);
        for (int k = 0; k < 3; k++)
            cr_assert_str_eq(fwd[ia[k]].id, rev[ib[k]].id, "key %s replica %d", buf, k);
    }
    ring_destroy(a);
    ring_destroy(b);
}

Test(ring, single_node_owns_everything)
{
    ring_node one[] = {{"solo", 1}};
    ring *r = NULL;
    cr_assert_eq(ring_create(&r, one, 1, 1), KV_OK);
    double share;
    ring_shares(r, &share);
    cr_expect_eq(share, 1.0);
    cr_expect_eq(ring_owner(r, "x", 1), 0);
    ring_destroy(r);
    ring_destroy(NULL);
}

Test(ring, rejects_bad_nodes)
{
    ring *r = (ring *)0x1;
    ring_node dup[] = {{"a", 1}, {"a", 1}};
    ring_node empty[] = {{"", 1}};
    ring_node heavy[] = {{"a", 1001}};
    cr_expect_eq(ring_create(&r, dup, 2, 0), KV_INVALID_ARGUMENT);
    cr_expect_eq(ring_create(&r, empty, 1, 0), KV_INVALID_ARGUMENT);
    cr_expect_eq(ring_create(&r, heavy, 1, 0), KV_INVALID_ARGUMENT);
    cr_expect_eq(ring_create(&r, dup, 0, 0), KV_INVALID_ARGUMENT);
    cr_expect_eq(ring_create(&r, dup, 1, RING_MAX_VNODES + 1), KV_INVALID_ARGUMENT);
    cr_expect_eq(r, (ring *)0x1, "out untouched on failure");
}
