/* SPDX-License-Identifier: MIT */
/*
 * White-box checks shared by the HotRing tests: walks every ring of an index
 * (no concurrent writers) and verifies the structural invariants: each ring is
 * a cycle through its head, every item belongs to the ring's bucket, the ring
 * is sorted with at most one wrap point, no rehash item or occupied item is
 * left, and the packed head/next words hold sane counters and addresses.
 */
#ifndef KV_TESTS_HR_CHECK_H
#define KV_TESTS_HR_CHECK_H

#include "tests/kv_testfw.h"

#include "common/hash.h"

#include "node/index/hr_internal.h"

/* Returns the number of items, asserting the invariants above. */
static inline uint64_t hr_check_rings(hr_index *idx)
{
    uint64_t total = 0;
    hr_rcu_lock();
    hr_table *t = atomic_load(&idx->cur);
    cr_assert_null(atomic_load(&idx->aux), "rehash still in progress");
    for (uint64_t b = 0; b < t->nb; b++) {
        uint64_t hw = atomic_load(&t->heads[b]);
        hr_item *h = hr_addr(hw), *x = h;
        if (!h) {
            cr_assert_eq(hw, 0, "empty head with bits set");
            continue;
        }
        unsigned wraps = 0, n = 0, steps = 0;
        do {
            uint64_t w = atomic_load(&x->next);
            hr_item *nx = hr_addr(w);
            cr_assert_not_null(nx);
            cr_assert_eq((uintptr_t)nx & 7, 0, "misaligned next address");
            cr_assert_eq(w & HR_N_REHASH, 0, "rehash item left in ring");
            bool dead = (w & HR_N_OCC) != 0;
            cr_assert(!hr_is_rehash(x), "rehash item left in ring");
            if (hr_bucket(t, x->tag) != b) {
                hr_item *y = h;
                do {
                    uint64_t yw = atomic_load(&y->next);
                    fprintf(stderr, "  b%llu item %p bucket %llu rh %d occ %d cnt %llu\n",
                            (unsigned long long)b, (void *)y,
                            (unsigned long long)hr_bucket(t, y->tag), hr_is_rehash(y),
                            !!(yw & HR_N_OCC), (unsigned long long)(yw >> 48 & 0x3fff));
                    y = hr_addr(yw);
                } while (y != h);
            }
            cr_assert_eq(hr_bucket(t, x->tag), b, "item in the wrong bucket");
            int c = hr_cmp_items(x, nx);
            if (nx != x) {
                bool ndead = (atomic_load(&nx->next) & HR_N_OCC) != 0;
                cr_assert(c != 0 || dead || ndead, "two live items with one key");
                wraps += c > 0;
                steps += c != 0;
            }
            n++;
            total += !dead;
            cr_assert_lt(n, 10000000u, "ring does not cycle back to its head");
            x = nx;
        } while (x != h);
        cr_assert_leq(wraps, 1, "ring order broken (%u wraps)", wraps);
        if (steps) /* some distinct keys (all equal: replaced versions of one key) */
            cr_assert_eq(wraps, 1, "a ring of %u items must wrap once", n);
    }
    hr_rcu_unlock();
    return total;
}

/* Head item of key's bucket (quiescent use only). */
static inline hr_item *hr_test_head(hr_index *idx, const void *key, size_t klen)
{
    hr_table *t = atomic_load(&idx->cur);
    uint32_t tag = hr_key_tag(key, klen);
    return hr_addr(atomic_load(&t->heads[hr_bucket(t, tag)]));
}

static inline bool hr_test_is(const hr_item *x, const char *key)
{
    return x && hr_item_klen(x) == strlen(key) && memcmp(hr_item_key(x), key, strlen(key)) == 0;
}

#endif
