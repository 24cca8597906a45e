/* SPDX-License-Identifier: MIT */
/*
 * Tests for bench/workload: zipfian and hotspot skew against their closed
 * forms, uniform coverage, op mixes, determinism by seed, hot-set shifts,
 * misses, inserts and key formatting. Statistical checks use enough draws
 * that the tolerances sit many standard deviations away from the mean.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench/workload.h"

static wl_model model(wl_workload w, wl_dist d, uint64_t keys, double theta)
{
    wl_config c;
    wl_config_default(&c);
    c.workload = w;
    c.dist = d;
    c.keys = keys;
    c.theta = theta;
    c.hot_pct = 5.0;
    wl_model m;
    char err[128] = "";
    kv_err rv = wl_model_init(&m, &c, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "wl_model_init: %s (%s)", kv_strerror(rv), err);
    return m;
}

static uint32_t *histogram(const wl_model *m, size_t draws)
{
    uint32_t *h = calloc(m->cfg.keys, sizeof(*h));
    cr_assert_not_null(h);
    wl_gen g;
    wl_gen_init(&g, m, 0, 1);
    for (size_t i = 0; i < draws; i++) {
        uint64_t id = wl_gen_key(&g);
        cr_assert_lt(id, m->cfg.keys);
        h[id]++;
    }
    return h;
}

Test(zipf, top_rank_share_matches_closed_form_at_theta_099)
{
    wl_model m = model(WL_C, WL_ZIPF, 100000, 0.99);
    size_t draws = 1000000;
    uint32_t *h = histogram(&m, draws);
    double expect0 = 1.0 / m.zipf.zetan; /* P(rank 0) = 1 / zeta(n, theta) */
    cr_assert_float_eq(expect0, wl_zipf_prob(&m.zipf, 0), 1e-12);
    cr_assert_float_eq((double)h[0] / draws, expect0, 0.05 * expect0, "top share %g vs %g",
                       (double)h[0] / draws, expect0);
    double top10 = 0, exp10 = 0;
    for (int k = 0; k < 10; k++) {
        top10 += h[k];
        exp10 += wl_zipf_prob(&m.zipf, k);
    }
    /* YCSB's approximation overstates the head slightly; 10% is generous. */
    cr_assert_float_eq(top10 / draws, exp10, 0.10 * exp10);
    cr_assert_gt(h[0], h[1]);
    cr_assert_gt(h[1], h[10]);
    free(h);
}

Test(zipf, theta_122_is_more_skewed)
{
    wl_model m = model(WL_C, WL_ZIPF, 100000, 1.22);
    size_t draws = 500000;
    uint32_t *h = histogram(&m, draws);
    double expect0 = 1.0 / m.zipf.zetan;
    cr_assert_gt(expect0, 0.15);
    cr_assert_float_eq((double)h[0] / draws, expect0, 0.05 * expect0);
    free(h);
}

Test(zipf, incremental_zeta_equals_full_computation)
{
    wl_zipf a, b;
    cr_assert_eq(wl_zipf_init(&a, 1000, 0.99), KV_OK);
    wl_zipf_grow(&a, 5000);
    cr_assert_eq(wl_zipf_init(&b, 5000, 0.99), KV_OK);
    cr_assert_eq(a.n, b.n);
    cr_assert_float_eq(a.zetan, b.zetan, 1e-9);
    cr_assert_float_eq(a.eta, b.eta, 1e-9);
    cr_assert_eq(wl_zipf_init(&a, 10, 1.0), KV_INVALID_ARGUMENT);
    cr_assert_eq(wl_zipf_init(&a, 0, 0.5), KV_INVALID_ARGUMENT);
}

Test(zipf, scrambled_spreads_hot_ids_but_keeps_the_skew)
{
    wl_model m = model(WL_C, WL_SCRAMBLED_ZIPF, 100000, 0.99);
    size_t draws = 500000;
    uint32_t *h = histogram(&m, draws);
    uint32_t max = 0;
    uint64_t argmax = 0;
    for (uint64_t i = 0; i < m.cfg.keys; i++) {
        if (h[i] > max) {
            max = h[i];
            argmax = i;
        }
    }
    cr_assert_neq(argmax, 0, "the hottest id should not stay at rank 0");
    double expect0 = 1.0 / m.zipf.zetan;
    cr_assert_float_eq((double)max / draws, expect0, 0.10 * expect0);
    free(h);
}

Test(hotspot, five_percent_of_keys_get_95_percent)
{
    wl_model m = model(WL_C, WL_HOTSPOT, 100000, 0.99);
    size_t draws = 400000;
    uint32_t *h = histogram(&m, draws);
    uint64_t hot = 0;
    for (uint64_t i = 0; i < 5000; i++)
        hot += h[i];
    cr_assert_float_eq((double)hot / draws, 0.95, 0.005, "hot share %g", (double)hot / draws);
    free(h);
}

Test(uniform, covers_every_key_evenly)
{
    wl_model m = model(WL_C, WL_UNIFORM, 1000, 0.99);
    size_t draws = 400000; /* mean 400 per key, sd 20 */
    uint32_t *h = histogram(&m, draws);
    for (uint64_t i = 0; i < m.cfg.keys; i++) {
        cr_assert_gt(h[i], 300, "key %lu drawn %u times", (unsigned long)i, h[i]);
        cr_assert_lt(h[i], 500, "key %lu drawn %u times", (unsigned long)i, h[i]);
    }
    free(h);
}

Test(trace, deterministic_by_seed_and_thread)
{
    wl_model m = model(WL_A, WL_SCRAMBLED_ZIPF, 10000, 0.99);
    wl_op *a, *b, *c;
    cr_assert_eq(wl_trace_make(&m, 0, 2, 5000, &a), KV_OK);
    cr_assert_eq(wl_trace_make(&m, 0, 2, 5000, &b), KV_OK);
    cr_assert_eq(wl_trace_make(&m, 1, 2, 5000, &c), KV_OK);
    cr_assert_eq(memcmp(a, b, 5000 * sizeof(*a)), 0);
    cr_assert_neq(memcmp(a, c, 5000 * sizeof(*a)), 0);
    m.cfg.seed = 2;
    free(b);
    cr_assert_eq(wl_trace_make(&m, 0, 2, 5000, &b), KV_OK);
    cr_assert_neq(memcmp(a, b, 5000 * sizeof(*a)), 0);
    free(a);
    free(b);
    free(c);
}

static void mix(wl_workload w, double *share)
{
    wl_model m = model(w, WL_UNIFORM, 10000, 0.99);
    size_t n = 200000;
    wl_op *t;
    cr_assert_eq(wl_trace_make(&m, 0, 1, n, &t), KV_OK);
    memset(share, 0, 4 * sizeof(*share));
    for (size_t i = 0; i < n; i++)
        share[t[i].type] += 1.0 / n;
    free(t);
}

Test(trace, op_mixes_follow_ycsb)
{
    double s[4];
    mix(WL_A, s);
    cr_assert_float_eq(s[WL_OP_UPDATE], 0.50, 0.01);
    mix(WL_B, s);
    cr_assert_float_eq(s[WL_OP_UPDATE], 0.05, 0.005);
    mix(WL_C, s);
    cr_assert_float_eq(s[WL_OP_READ], 1.0, 1e-9);
    mix(WL_D, s);
    cr_assert_float_eq(s[WL_OP_INSERT], 0.05, 0.005);
    mix(WL_F, s);
    cr_assert_float_eq(s[WL_OP_RMW], 0.50, 0.01);
}

Test(trace, inserts_are_new_disjoint_ids_and_latest_reads_them)
{
    wl_model m = model(WL_D, WL_ZIPF, 10000, 0.99);
    cr_assert_eq(m.cfg.dist, WL_LATEST);
    wl_op *t[2];
    size_t n = 20000;
    uint64_t inserted[2] = {0, 0}, recent = 0, reads = 0;
    for (unsigned th = 0; th < 2; th++) {
        cr_assert_eq(wl_trace_make(&m, th, 2, n, &t[th]), KV_OK);
        for (size_t i = 0; i < n; i++) {
            wl_op op = t[th][i];
            if (op.type == WL_OP_INSERT) {
                cr_assert_eq(op.key, 10000 + th + 2 * inserted[th]);
                inserted[th]++;
                continue;
            }
            cr_assert_lt(op.key, 10000 + 2 * inserted[th]);
            reads++;
            recent += op.key >= 10000 + 2 * inserted[th] - 100;
        }
    }
    cr_assert_gt(inserted[0], 0);
    cr_assert_gt((double)recent / reads, 0.3, "latest should favour the newest ids");
    free(t[0]);
    free(t[1]);
}

Test(trace, miss_ratio_and_offset)
{
    wl_config c;
    wl_config_default(&c);
    c.keys = 10000;
    c.miss_ratio = 0.25;
    wl_model m;
    char err[64];
    cr_assert_eq(wl_model_init(&m, &c, err, sizeof(err)), KV_OK);
    wl_op *t;
    size_t n = 100000, miss = 0;
    cr_assert_eq(wl_trace_make(&m, 0, 1, n, &t), KV_OK);
    for (size_t i = 0; i < n; i++)
        miss += (t[i].key & WL_MISS_BIT) != 0;
    cr_assert_float_eq((double)miss / n, 0.25, 0.01);
    free(t);
    /* A rotated key space moves the hottest id by the offset. */
    c.miss_ratio = 0;
    c.offset = 5000;
    cr_assert_eq(wl_model_init(&m, &c, err, sizeof(err)), KV_OK);
    uint32_t *h = histogram(&m, 100000);
    cr_assert_gt(h[5000], h[0] * 10 + 100);
    free(h);
    c.miss_ratio = 1.5;
    cr_assert_eq(wl_model_init(&m, &c, err, sizeof(err)), KV_INVALID_ARGUMENT);
}

Test(keys, binary_and_string_forms)
{
    unsigned char k[WL_KEY8_LEN];
    wl_key8(0x0102030405060708ull, k);
    cr_assert_eq(k[0], 1);
    cr_assert_eq(k[7], 8);
    cr_assert_eq(wl_key8_id(k), 0x0102030405060708ull);
    char s[WL_KEYSTR_MAX];
    cr_assert_eq(wl_key_str(42, s, sizeof(s)), 15);
    cr_assert_str_eq(s, "key000000000042");
    cr_assert_eq(wl_key_str(42, s, 4), 0);
    cr_assert_eq(wl_workload_parse("d"), WL_D);
    cr_assert_eq(wl_dist_parse("hotspot"), WL_HOTSPOT);
    cr_assert_eq(wl_dist_parse("nope"), -1);
}

Test(load, order_is_a_permutation)
{
    uint64_t *o;
    cr_assert_eq(wl_load_order(10000, 7, &o), KV_OK);
    char *seen = calloc(10000, 1);
    size_t fixed = 0;
    for (uint64_t i = 0; i < 10000; i++) {
        cr_assert_lt(o[i], 10000);
        cr_assert_eq(seen[o[i]], 0);
        seen[o[i]] = 1;
        fixed += o[i] == i;
    }
    cr_assert_lt(fixed, 20);
    free(seen);
    free(o);
}
