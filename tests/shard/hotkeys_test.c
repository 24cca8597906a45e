/* SPDX-License-Identifier: MIT */
/* Tests for shard/hotkeys.c: exact counts on small streams, zipf top-K
 * accuracy, the count/error interval, merges, long-tail churn, and the
 * sampling window (including concurrent samplers). */
#include "tests/kv_testfw.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_err.h"
#include "shard/hotkeys.h"

static hk_sketch *mk(size_t k)
{
    hk_sketch *s = NULL;
    kv_err rv = hk_sketch_create(&s, k);
    cr_assert_eq(rv, KV_OK, "hk_sketch_create: %s", kv_strerror(rv));
    return s;
}

static size_t kname(char *buf, unsigned i)
{
    return (size_t)snprintf(buf, 24, "key:%u", i);
}

static void add_n(hk_sketch *s, unsigned key, uint64_t w)
{
    char buf[24];
    size_t len = kname(buf, key);
    kv_err rv = hk_sketch_add(s, buf, len, w);
    cr_assert_eq(rv, KV_OK, "hk_sketch_add: %s", kv_strerror(rv));
}

static unsigned key_id(const hk_entry *e)
{
    char buf[24];
    cr_assert_lt(e->klen, sizeof buf);
    memcpy(buf, e->key, e->klen);
    buf[e->klen] = '\0';
    return (unsigned)strtoul(buf + 4, NULL, 10);
}

/* Checks count - error <= truth <= count for every monitored key and
 * truth <= floor for every other key of a universe of n keys. */
static void check_bounds(const hk_sketch *s, const uint32_t *truth, unsigned n)
{
    char buf[24];
    for (unsigned i = 0; i < n; i++) {
        uint64_t c, e;
        size_t len = kname(buf, i);
        bool mon = hk_sketch_estimate(s, buf, len, &c, &e);
        cr_assert(c - e <= truth[i] && truth[i] <= c, "key %u: true %u not in [%llu, %llu] (%s)", i,
                  truth[i], (unsigned long long)(c - e), (unsigned long long)c,
                  mon ? "monitored" : "floor");
    }
}

Test(hotkeys, exact_on_a_small_stream)
{
    hk_sketch *s = mk(16);
    for (unsigned k = 0; k < 10; k++)
        for (unsigned j = 0; j <= k; j++)
            add_n(s, k, 1 + (j % 2));
    hk_entry top[16];
    size_t n = hk_sketch_topk(s, top, 16);
    cr_assert_eq(n, 10);
    for (size_t i = 0; i < n; i++) {
        unsigned k = 9 - (unsigned)i, expect = 0;
        for (unsigned j = 0; j <= k; j++)
            expect += 1 + (j % 2);
        cr_expect_eq(key_id(&top[i]), k, "rank %zu", i);
        cr_expect_eq(top[i].count, expect);
        cr_expect_eq(top[i].error, 0);
        cr_expect_eq(top[i].guaranteed, expect);
    }
    cr_expect_eq(hk_sketch_topk(s, NULL, 0), 0);
    cr_expect_eq(hk_sketch_topk(s, top, 3), 3);
    cr_expect_eq(key_id(&top[0]), 9);
    cr_expect_eq(key_id(&top[2]), 7);
    cr_expect_eq(hk_sketch_floor(s), 0);
    cr_expect_eq(hk_sketch_add(s, "", 0, 1), KV_INVALID_ARGUMENT);
    cr_expect_eq(hk_sketch_add(s, "x", HK_MAX_KEY + 1, 1), KV_INVALID_ARGUMENT);
    cr_expect_eq(hk_sketch_add(s, "x", 1, 0), KV_INVALID_ARGUMENT);
    hk_sketch_reset(s);
    cr_expect_eq(hk_sketch_size(s), 0);
    cr_expect_eq(hk_sketch_total(s), 0);
    hk_sketch_destroy(s);
    hk_sketch_destroy(NULL);
}

/* Zipf(theta) over n keys by inverse CDF. Key i has rank i (0 = hottest). */
typedef struct zipf {
    double *cdf;
    unsigned n;
    uint64_t rng;
} zipf;

static void zipf_init(zipf *z, unsigned n, double theta, uint64_t seed)
{
    z->cdf = malloc(n * sizeof *z->cdf);
    z->n = n;
    z->rng = seed;
    double sum = 0;
    for (unsigned i = 0; i < n; i++)
        z->cdf[i] = (sum += 1.0 / pow(i + 1.0, theta));
    for (unsigned i = 0; i < n; i++)
        z->cdf[i] /= sum;
}

static unsigned zipf_next(zipf *z)
{
    z->rng = z->rng * 6364136223846793005ull + 1442695040888963407ull;
    double u = (double)(z->rng >> 11) * 0x1.0p-53;
    unsigned lo = 0, hi = z->n - 1;
    while (lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        if (z->cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of key in the true top-m by count (ties broken by id), or -1. */
static int true_rank(const uint32_t *truth, unsigned n, unsigned key, unsigned m)
{
    unsigned better = 0;
    for (unsigned i = 0; i < n && better < m; i++)
        if (truth[i] > truth[key] || (truth[i] == truth[key] && i < key))
            better++;
    return better < m ? (int)better : -1;
}

Test(hotkeys, zipf_top10_found, .timeout = 60)
{
    enum { NKEYS = 1000000, DRAWS = 2000000 };
    zipf z;
    zipf_init(&z, NKEYS, 0.99, 42);
    uint32_t *truth = calloc(NKEYS, sizeof *truth);
    hk_sketch *s = mk(HK_DEFAULT_K);
    for (unsigned i = 0; i < DRAWS; i++) {
        unsigned k = zipf_next(&z);
        truth[k]++;
        add_n(s, k, 1);
    }
    hk_entry top[20];
    cr_assert_eq(hk_sketch_topk(s, top, 20), 20);
    /* The true top-10: keys ranked 0..9 by true count. */
    for (unsigned i = 0; i < NKEYS; i++) {
        int r = true_rank(truth, NKEYS, i, 10);
        if (r < 0)
            continue;
        bool found = false;
        for (int j = 0; j < 20; j++)
            found |= key_id(&top[j]) == i;
        cr_expect(found, "true rank %d (key %u, %u hits) missing from the reported top-20", r, i,
                  truth[i]);
    }
    int good = 0;
    for (int j = 0; j < 10; j++)
        good += true_rank(truth, NKEYS, key_id(&top[j]), 20) >= 0;
    cr_expect_geq(good, 9, "only %d of the reported top-10 are in the true top-20", good);
    for (int j = 0; j < 20; j++) {
        unsigned k = key_id(&top[j]);
        cr_expect(top[j].guaranteed <= truth[k] && truth[k] <= top[j].count);
    }
    hk_sketch_destroy(s);
    free(truth);
    free(z.cdf);
}

Test(hotkeys, error_bounds_hold_including_after_merge)
{
    enum { NKEYS = 5000, DRAWS = 100000 };
    zipf z;
    zipf_init(&z, NKEYS, 0.8, 7);
    uint32_t *ta = calloc(NKEYS, sizeof *ta), *tb = calloc(NKEYS, sizeof *tb);
    uint32_t *tall = calloc(NKEYS, sizeof *tall);
    hk_sketch *a = mk(100), *b = mk(100);
    for (unsigned i = 0; i < DRAWS; i++) {
        unsigned k = zipf_next(&z);
        /* b sees a shifted popularity, so the sketches disagree. */
        unsigned kb = (k + 37) % NKEYS;
        uint64_t w = 1 + i % 3;
        add_n(a, k, w);
        add_n(b, kb, 1);
        ta[k] += (uint32_t)w;
        tb[kb]++;
    }
    check_bounds(a, ta, NKEYS);
    check_bounds(b, tb, NKEYS);
    cr_expect_gt(hk_sketch_floor(a), 0, "the stream should overflow the sketch");
    for (unsigned i = 0; i < NKEYS; i++)
        tall[i] = ta[i] + tb[i];
    uint64_t total = hk_sketch_total(a) + hk_sketch_total(b);
    cr_assert_eq(hk_sketch_merge(a, b), KV_OK);
    cr_expect_eq(hk_sketch_size(a), 100);
    cr_expect_eq(hk_sketch_total(a), total);
    check_bounds(a, tall, NKEYS);
    cr_expect_eq(hk_sketch_merge(a, a), KV_INVALID_ARGUMENT);
    /* Updates after a merge keep the bounds too. */
    for (unsigned i = 0; i < DRAWS / 10; i++) {
        unsigned k = zipf_next(&z);
        add_n(a, k, 1);
        tall[k]++;
    }
    check_bounds(a, tall, NKEYS);
    hk_sketch_destroy(a);
    hk_sketch_destroy(b);
    free(ta);
    free(tb);
    free(tall);
    free(z.cdf);
}

Test(hotkeys, merge_of_two_exact_sketches_sums_counts)
{
    hk_sketch *a = mk(64), *b = mk(64);
    for (unsigned k = 0; k < 20; k++)
        add_n(a, k, 10 + k);
    for (unsigned k = 10; k < 30; k++)
        add_n(b, k, 100);
    cr_assert_eq(hk_sketch_merge(a, b), KV_OK);
    cr_expect_eq(hk_sketch_size(a), 30);
    cr_expect_eq(hk_sketch_floor(a), 0);
    hk_entry top[64];
    size_t n = hk_sketch_topk(a, top, 64);
    cr_assert_eq(n, 30);
    for (size_t i = 0; i < n; i++) {
        unsigned k = key_id(&top[i]);
        uint64_t want = (k < 20 ? 10 + k : 0) + (k >= 10 ? 100 : 0);
        cr_expect_eq(top[i].count, want, "key %u", k);
        cr_expect_eq(top[i].error, 0, "key %u", k);
    }
    cr_expect_eq(key_id(&top[0]), 19); /* 29 + 100 */
    /* Merging into a smaller sketch keeps the K largest and raises the floor. */
    hk_sketch *c = mk(8);
    cr_assert_eq(hk_sketch_merge(c, a), KV_OK);
    cr_expect_eq(hk_sketch_size(c), 8);
    cr_expect_eq(hk_sketch_topk(c, top, 1), 1);
    cr_expect_eq(key_id(&top[0]), 19);
    cr_expect_gt(hk_sketch_floor(c), 0);
    hk_sketch_destroy(a);
    hk_sketch_destroy(b);
    hk_sketch_destroy(c);
}

Test(hotkeys, long_tail_churn_never_outranks_hot_keys)
{
    hk_sketch *s = mk(64);
    enum { HOT = 5, HOT_HITS = 20000, COLD = 100000 };
    unsigned cold = 1000;
    for (unsigned i = 0; i < HOT_HITS; i++) {
        for (unsigned h = 0; h < HOT; h++)
            add_n(s, h, 1);
        for (int c = 0; c < COLD / HOT_HITS; c++)
            add_n(s, cold++, 1); /* each cold key appears once */
    }
    for (unsigned c = 0; c < 2000; c++) /* a burst of tail at the end */
        add_n(s, cold++, 1);
    hk_entry top[64];
    size_t n = hk_sketch_topk(s, top, 64);
    cr_assert_eq(n, 64);
    for (size_t i = 0; i < HOT; i++)
        cr_expect_lt(key_id(&top[i]), HOT, "rank %zu is cold key %u", i, key_id(&top[i]));
    uint64_t max_cold_count = 0;
    for (size_t i = HOT; i < n; i++) {
        cr_expect_geq(key_id(&top[i]), 1000);
        cr_expect_leq(top[i].guaranteed, 1, "a cold key is guaranteed only its one hit");
        if (top[i].count > max_cold_count)
            max_cold_count = top[i].count;
    }
    /* Raw counts of churned-in cold keys are inflated by the floor; the
     * guaranteed ranking is what keeps them below the hot keys. */
    cr_expect_gt(max_cold_count, 1000);
    hk_sketch_destroy(s);
}

Test(hotkeys, window_scales_samples_and_rotates)
{
    hk_window *w = NULL;
    cr_assert_eq(hk_window_create(&w, 2, 32, 1, 1000000000ull), KV_OK);
    for (int i = 0; i < 300; i++) {
        hk_window_sample(w, 0, "hot", 3);
        hk_window_sample(w, 1, i % 2 ? "hot" : "warm", i % 2 ? 3 : 4);
    }
    hk_window_sample(w, 1, "", 0); /* ignored */
    hk_report r;
    cr_assert_eq(hk_window_rotate(w, 3000000000ull, 0, &r), KV_OK);
    cr_assert_eq(r.n, 2);
    cr_expect_eq(r.seconds, 2.0);
    cr_expect_eq(r.sampled, 600);
    cr_expect_eq(r.total_est, 600);
    cr_expect(r.items[0].klen == 3 && memcmp(r.items[0].key, "hot", 3) == 0);
    cr_expect_eq(r.items[0].est_count, 450);
    cr_expect_eq(r.items[0].guaranteed, 450);
    cr_expect_eq(r.items[0].rate, 225.0);
    cr_expect_eq(r.items[1].est_count, 150);
    hk_report_free(&r);
    cr_assert_eq(hk_window_rotate(w, 4000000000ull, 0, &r), KV_OK);
    cr_expect_eq(r.n, 0, "a new window starts empty");
    hk_report_free(&r);
    hk_report_free(NULL);
    hk_window_destroy(w);

    /* One in 8 sampled: counts are scaled back to an estimate of the total. */
    cr_assert_eq(hk_window_create(&w, 1, 0, 8, 0), KV_OK);
    for (int i = 0; i < 80000; i++)
        hk_window_sample(w, 0, i % 4 ? "a" : "b", 1);
    cr_assert_eq(hk_window_rotate(w, 1000000000ull, 1, &r), KV_OK);
    cr_assert_eq(r.n, 1);
    cr_expect(r.sampled > 8000 && r.sampled < 12000, "sampled %llu", (unsigned long long)r.sampled);
    cr_expect(r.items[0].est_count > 50000 && r.items[0].est_count < 70000, "a ≈ 60000: %llu",
              (unsigned long long)r.items[0].est_count);
    hk_report_free(&r);
    hk_window_destroy(w);
    hk_window_destroy(NULL);
    cr_expect_eq(hk_window_create(&w, 0, 0, 1, 0), KV_INVALID_ARGUMENT);
}

typedef struct sampler_arg {
    hk_window *w;
    size_t idx;
} sampler_arg;

static void *sampler(void *p)
{
    sampler_arg *a = p;
    char buf[24];
    for (unsigned i = 0; i < 200000; i++) {
        size_t len = kname(buf, i % 3 == 0 ? 1 : 1000 + i % 5000);
        hk_window_sample(a->w, a->idx, buf, len);
    }
    return NULL;
}

Test(hotkeys, concurrent_samplers_and_rotation)
{
    hk_window *w = NULL;
    cr_assert_eq(hk_window_create(&w, 2, 128, 2, 0), KV_OK);
    pthread_t t[2];
    sampler_arg args[2] = {{w, 0}, {w, 1}};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, sampler, &args[i]), 0);
    uint64_t sampled = 0, now = 0;
    hk_report r;
    for (int round = 0; round < 20; round++) {
        cr_assert_eq(hk_window_rotate(w, now += 1000000, 4, &r), KV_OK);
        sampled += r.sampled;
        hk_report_free(&r);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(hk_window_rotate(w, now += 1000000, 4, &r), KV_OK);
    sampled += r.sampled;
    cr_expect(sampled > 150000 && sampled < 250000, "sampled %llu of 400000 at 1/2",
              (unsigned long long)sampled);
    hk_report_free(&r);
    hk_window_destroy(w);
}
