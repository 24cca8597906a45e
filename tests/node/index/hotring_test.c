/* SPDX-License-Identifier: MIT */
/*
 * Tests for the HotRing index (node/index): keyed operations, write
 * conditions, in-place vs RCU updates, the W_t head choice, hotspot
 * inheritance, pinning, sampling/random movement, rehash splitting, batched
 * reads and keys whose tags collide.
 */
#include "tests/kv_testfw.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/hash.h"
#include "node/index/hotring.h"
#include "tests/node/index/hr_check.h"

static hr_index *open_with(hr_opts o)
{
    hr_index *idx = NULL;
    kv_err rv = hr_open(&idx, &o);
    cr_assert_eq(rv, KV_OK, "hr_open: %s", kv_strerror(rv));
    return idx;
}

static hr_index *open_idx(uint64_t buckets, hr_mode mode, bool rehash)
{
    return open_with((hr_opts){buckets, mode, 5, rehash, 0});
}

static void setup(void)
{
    hr_thread_register();
}
static void teardown(void)
{
    hr_barrier();
    hr_thread_unregister();
}
TestSuite(hotring, .init = setup, .fini = teardown);

typedef struct got {
    int n;
    char key[64], val[256];
    size_t vlen;
    hr_meta meta;
    const void *keyptr;
} got;

static void grab(void *arg, const hr_view *v)
{
    got *g = arg;
    g->n++;
    memcpy(g->key, v->key, v->klen);
    g->key[v->klen] = 0;
    memcpy(g->val, v->val, v->vlen);
    g->vlen = v->vlen;
    g->meta = v->meta;
    g->keyptr = v->key;
}

static kv_err put(hr_index *idx, const char *k, const char *v, uint64_t version)
{
    hr_meta m = {version, version, 0, HR_F_DIRTY};
    return hr_upsert(idx, k, strlen(k), v, strlen(v), &m, NULL, NULL);
}

static got get(hr_index *idx, const char *k, kv_err want)
{
    got g = {0};
    kv_err rv = hr_get(idx, k, strlen(k), grab, &g);
    cr_assert_eq(rv, want, "get %s: %s", k, kv_strerror(rv));
    return g;
}

Test(hotring, basic_get_upsert_remove)
{
    hr_index *idx = open_idx(4, HR_MODE_NONE, false);
    char k[32], v[32];
    for (int i = 0; i < 500; i++) {
        snprintf(k, sizeof k, "key-%d", i);
        snprintf(v, sizeof v, "v%d", i);
        cr_assert_eq(put(idx, k, v, i + 1), KV_OK);
    }
    for (int i = 0; i < 500; i++) {
        snprintf(k, sizeof k, "key-%d", i);
        snprintf(v, sizeof v, "v%d", i);
        got g = get(idx, k, KV_OK);
        cr_assert_eq(g.n, 1);
        cr_assert_str_eq(g.val, v);
        cr_assert_eq(g.meta.version, (uint64_t)i + 1);
        cr_assert_eq(g.meta.flags, HR_F_DIRTY);
    }
    get(idx, "absent", KV_NOT_FOUND);
    for (int i = 0; i < 500; i += 2) {
        snprintf(k, sizeof k, "key-%d", i);
        cr_assert_eq(hr_remove(idx, k, strlen(k), NULL, NULL), KV_OK);
        cr_assert_eq(hr_remove(idx, k, strlen(k), NULL, NULL), KV_NOT_FOUND);
    }
    for (int i = 0; i < 500; i++) {
        snprintf(k, sizeof k, "key-%d", i);
        get(idx, k, i % 2 ? KV_OK : KV_NOT_FOUND);
    }
    cr_assert_eq(hr_check_rings(idx), 250);
    hr_stats st;
    hr_get_stats(idx, &st);
    cr_assert_eq(st.items, 250);
    cr_assert_eq(st.buckets, 4);
    cr_assert_gt(st.bytes, 0);
    hr_close(idx);
}

Test(hotring, invalid_arguments)
{
    hr_index *idx = NULL;
    hr_opts bad = {16, (hr_mode)7, 5, false, 0};
    cr_assert_eq(hr_open(&idx, &bad), KV_INVALID_ARGUMENT);
    cr_assert_null(idx);
    cr_assert_eq(hr_open(NULL, NULL), KV_INVALID_ARGUMENT);
    cr_assert_eq(hr_open(&idx, NULL), KV_OK); /* defaults */
    char big[4097] = {0};
    cr_assert_eq(hr_get(idx, "", 0, NULL, NULL), KV_INVALID_ARGUMENT);
    cr_assert_eq(hr_get(idx, big, sizeof big, NULL, NULL), KV_INVALID_ARGUMENT);
    cr_assert_eq(hr_upsert(idx, "k", 1, NULL, 3, NULL, NULL, NULL), KV_INVALID_ARGUMENT);
    cr_assert_eq(hr_upsert(idx, big, 4096, NULL, 0, NULL, NULL, NULL), KV_OK);
    cr_assert_eq(hr_get(idx, big, 4096, NULL, NULL), KV_OK);
    hr_close(idx);
    hr_close(NULL);
}

static void count_cb(void *arg, const hr_view *v)
{
    int *seen = arg;
    char k[32] = {0};
    int i = -1;
    cr_assert_lt(v->klen, sizeof k);
    memcpy(k, v->key, v->klen);
    cr_assert_eq(sscanf(k, "it-%d", &i), 1);
    cr_assert(i >= 0 && i < 300);
    seen[i]++;
}

Test(hotring, iterate_visits_each_item_once)
{
    hr_index *idx = open_idx(8, HR_MODE_SAMPLE, false);
    static int seen[300];
    char k[32];
    for (int i = 0; i < 300; i++) {
        snprintf(k, sizeof k, "it-%d", i);
        cr_assert_eq(put(idx, k, "x", 1), KV_OK);
    }
    for (int i = 0; i < 300; i += 3) {
        snprintf(k, sizeof k, "it-%d", i);
        cr_assert_eq(hr_remove(idx, k, strlen(k), NULL, NULL), KV_OK);
    }
    hr_iterate(idx, count_cb, seen);
    for (int i = 0; i < 300; i++)
        cr_assert_eq(seen[i], i % 3 ? 1 : 0, "item %d seen %d times", i, seen[i]);
    hr_close(idx);
}

Test(hotring, set_flags_checks_seqno)
{
    hr_index *idx = open_idx(4, HR_MODE_NONE, false);
    cr_assert_eq(put(idx, "a", "small", 7), KV_OK);
    cr_assert_eq(put(idx, "b", "a value longer than eight bytes", 9), KV_OK);
    cr_assert_eq(hr_set_flags(idx, "a", 1, 6, 0, HR_F_DIRTY), KV_FAILED_PRECONDITION);
    cr_assert_eq(get(idx, "a", KV_OK).meta.flags, HR_F_DIRTY);
    cr_assert_eq(hr_set_flags(idx, "a", 1, 7, HR_F_PINNED, HR_F_DIRTY), KV_OK);
    got g = get(idx, "a", KV_OK);
    cr_assert_eq(g.meta.flags, HR_F_PINNED);
    cr_assert_str_eq(g.val, "small");
    cr_assert_eq(hr_set_flags(idx, "b", 1, 9, 0, HR_F_DIRTY), KV_OK);
    g = get(idx, "b", KV_OK);
    cr_assert_eq(g.meta.flags, 0);
    cr_assert_str_eq(g.val, "a value longer than eight bytes");
    cr_assert_eq(hr_set_flags(idx, "zz", 2, 9, 0, 0), KV_NOT_FOUND);
    hr_close(idx);
}

/* Write condition: last-writer-wins on version, records what it saw. */
typedef struct lww {
    uint64_t version;
    int calls, saw_absent;
    uint64_t saw_version;
} lww;

static kv_err lww_cond(void *arg, const hr_view *cur)
{
    lww *c = arg;
    c->calls++;
    c->saw_absent = cur == NULL;
    c->saw_version = cur ? cur->meta.version : 0;
    if (cur && cur->meta.version >= c->version)
        return KV_FAILED_PRECONDITION;
    return KV_OK;
}

Test(hotring, cond_callback_semantics)
{
    hr_index *idx = open_idx(4, HR_MODE_NONE, false);
    hr_meta m = {10, 1, 0, 0};
    lww c = {10};
    cr_assert_eq(hr_upsert(idx, "k", 1, "v1", 2, &m, lww_cond, &c), KV_OK);
    cr_assert(c.saw_absent);
    m.version = 5;
    c = (lww){5};
    cr_assert_eq(hr_upsert(idx, "k", 1, "old", 3, &m, lww_cond, &c), KV_FAILED_PRECONDITION);
    cr_assert_eq(c.saw_version, 10);
    cr_assert_str_eq(get(idx, "k", KV_OK).val, "v1");
    m.version = 11;
    c = (lww){11};
    cr_assert_eq(hr_upsert(idx, "k", 1, "v2", 2, &m, lww_cond, &c), KV_OK);
    cr_assert_str_eq(get(idx, "k", KV_OK).val, "v2");
    c = (lww){3};
    cr_assert_eq(hr_remove(idx, "k", 1, lww_cond, &c), KV_FAILED_PRECONDITION);
    cr_assert_eq(c.saw_version, 11);
    get(idx, "k", KV_OK);
    c = (lww){12};
    cr_assert_eq(hr_remove(idx, "k", 1, lww_cond, &c), KV_OK);
    get(idx, "k", KV_NOT_FOUND);
    c = (lww){0};
    cr_assert_eq(hr_remove(idx, "k", 1, lww_cond, &c), KV_NOT_FOUND);
    cr_assert_eq(c.calls, 0, "cond not called for a missing key on remove");
    hr_close(idx);
}

Test(hotring, in_place_vs_rcu_updates)
{
    hr_index *idx = open_idx(4, HR_MODE_NONE, false);
    cr_assert_eq(put(idx, "small", "12345678", 1), KV_OK);
    const void *p1 = get(idx, "small", KV_OK).keyptr;
    cr_assert_eq(put(idx, "small", "abc", 2), KV_OK);
    got g = get(idx, "small", KV_OK);
    cr_assert_eq(g.keyptr, p1, "8-byte update must be in place");
    cr_assert_str_eq(g.val, "abc");
    cr_assert_eq(g.vlen, 3);
    cr_assert_eq(g.meta.version, 2);
    cr_assert_eq(put(idx, "small", "now a long value of 26 ch", 3), KV_OK);
    g = get(idx, "small", KV_OK);
    cr_assert_neq(g.keyptr, p1, "a larger value must be an RCU update");
    cr_assert_str_eq(g.val, "now a long value of 26 ch");
    const void *p2 = g.keyptr;
    cr_assert_eq(put(idx, "small", "tiny", 4), KV_OK);
    g = get(idx, "small", KV_OK);
    cr_assert_neq(g.keyptr, p2, "a big-value item is replaced, not written in place");
    cr_assert_str_eq(g.val, "tiny");
    cr_assert_eq(g.meta.version, 4);
    cr_assert_eq(hr_upsert(idx, "empty", 5, NULL, 0, NULL, NULL, NULL), KV_OK);
    cr_assert_eq(get(idx, "empty", KV_OK).vlen, 0);
    cr_assert_eq(hr_check_rings(idx), 2);
    hr_close(idx);
}

/* ------------------------------------------------------------ W_t units */

static unsigned best_of(const uint32_t *cnt, unsigned len, const uint8_t *pin)
{
    static hr_ring_view rv;
    memset(&rv, 0, sizeof rv);
    rv.len = len;
    for (unsigned i = 0; i < len; i++) {
        rv.cnt[i] = cnt[i];
        rv.cand[i] = 1;
        rv.pin[i] = pin ? pin[i] : 0;
        rv.total += cnt[i];
    }
    return hr_best_head(&rv);
}

/* Brute force W_t = sum_k n_k * dist(t, k). */
static uint64_t wt(const uint32_t *cnt, unsigned len, unsigned t)
{
    uint64_t w = 0;
    for (unsigned k = 0; k < len; k++)
        w += (uint64_t)cnt[k] * ((k + len - t) % len);
    return w;
}

Test(hotring, wt_single_hotspot)
{
    uint32_t c[8] = {1, 0, 1, 0, 0, 40, 1, 0};
    cr_assert_eq(best_of(c, 8, NULL), 5);
    uint32_t first[8] = {50, 1, 1, 1, 1, 1, 1, 1};
    cr_assert_eq(best_of(first, 8, NULL), 0, "hot head stays");
}

Test(hotring, wt_multiple_hotspots_prefers_the_earlier_of_a_pair)
{
    /* Two equally hot items at 2 and 3: heading at 2 costs 1 hop for item 3,
     * heading at 3 costs 7 hops for item 2 (Fig. 5: the head goes to the item
     * from which the hot set is reached in the fewest steps). */
    uint32_t c[8] = {0, 0, 20, 20, 0, 0, 0, 0};
    cr_assert_eq(best_of(c, 8, NULL), 2);
    uint32_t wrap[8] = {20, 0, 0, 0, 0, 0, 0, 20};
    cr_assert_eq(best_of(wrap, 8, NULL), 7, "hot pair across the wrap point");
}

Test(hotring, wt_matches_brute_force)
{
    uint32_t c[13];
    unsigned seed = 1;
    for (int round = 0; round < 200; round++) {
        unsigned len = 1 + round % 13;
        for (unsigned i = 0; i < len; i++) {
            seed = seed * 1103515245 + 12345;
            c[i] = (seed >> 16) % 50;
        }
        unsigned b = best_of(c, len, NULL), bf = 0;
        for (unsigned t = 1; t < len; t++)
            if (wt(c, len, t) < wt(c, len, bf))
                bf = t;
        cr_assert_eq(wt(c, len, b), wt(c, len, bf), "round %d: %u vs %u", round, b, bf);
    }
}

Test(hotring, wt_pin_prior)
{
    /* Item 0, the head, pinned: item 4 is hotter, the head stays. */
    uint32_t c[8] = {10, 0, 0, 0, 14, 0, 0, 0};
    uint8_t pin[8] = {1, 0, 0, 0, 0, 0, 0, 0};
    cr_assert_eq(best_of(c, 8, NULL), 4);
    cr_assert_eq(best_of(c, 8, pin), 0);
    /* Whatever the counts of unpinned items: a replica sees few reads of a
     * key the cluster reports hot (reads at ONE go to its primary). */
    uint32_t d[8] = {1, 0, 0, 0, 60, 0, 0, 0};
    cr_assert_eq(best_of(d, 8, pin), 0);
    uint32_t none[8] = {0, 3, 0, 5, 60, 0, 2, 0};
    cr_assert_eq(best_of(none, 8, pin), 0);
    /* Between pinned items, W_t decides. */
    uint8_t two[8] = {1, 0, 0, 0, 1, 0, 0, 0};
    cr_assert_eq(best_of(c, 8, two), 4);
    cr_assert_eq(best_of(d, 8, two), 4);
    /* An unpinned head: a pinned item competes at half its W_t. */
    uint8_t later[8] = {0, 0, 0, 0, 1, 0, 0, 0};
    uint32_t e[8] = {12, 0, 0, 0, 10, 0, 0, 0}; /* W_0 = 40, W_4 = 48 */
    cr_assert_eq(best_of(e, 8, NULL), 0);
    cr_assert_eq(best_of(e, 8, later), 4);
    uint32_t f[8] = {40, 0, 0, 0, 10, 0, 0, 0}; /* W_0 = 40, W_4 = 160 */
    cr_assert_eq(best_of(f, 8, later), 0);
}

/* ------------------------------------------------- hotspots and heads */

static void fill(hr_index *idx, int n, const char *fmt)
{
    char k[32];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof k, fmt, i);
        cr_assert_eq(put(idx, k, "v", 1), KV_OK);
    }
}

static void hammer(hr_index *idx, const char *hot, int n, int cold_every, const char *fmt)
{
    char k[32];
    for (int i = 0; i < n; i++) {
        if (cold_every && i % cold_every == 0) {
            snprintf(k, sizeof k, fmt, (i / cold_every) % 16);
            hr_get(idx, k, strlen(k), NULL, NULL);
        } else {
            hr_get(idx, hot, strlen(hot), NULL, NULL);
        }
    }
}

static uint64_t bucket_of(hr_index *idx, const char *k)
{
    hr_table *t = atomic_load(&idx->cur);
    return hr_bucket(t, hr_key_tag(k, strlen(k)));
}

Test(hotring, sampling_moves_head_to_hotspot)
{
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    fill(idx, 16, "s-%d");
    /* a fresh ring: the first guess moves the head to the hot key */
    hammer(idx, "s-11", 5000, 10, "s-%d");
    cr_assert(hr_test_is(hr_test_head(idx, "s-11", 4), "s-11"), "head did not move to hot key");
    hr_stats a, st;
    hr_get_stats(idx, &a);
    hammer(idx, "s-11", 1000, 0, "s-%d");
    hr_get_stats(idx, &st);
    cr_assert_eq(st.head_hits - a.head_hits, 1000, "every read of the hot key hits the head");
    cr_assert_eq(st.read_visited - a.read_visited, 1000);
    /* the hotspot shifts to another key of the ring: sampling rounds move it */
    char other[16] = "";
    for (int i = 0; i < 16 && !other[0]; i++) {
        char k[16];
        snprintf(k, sizeof k, "s-%d", i);
        if (i != 11 && bucket_of(idx, k) == bucket_of(idx, "s-11"))
            strcpy(other, k);
    }
    cr_assert(other[0], "no second key in the ring");
    hammer(idx, other, 5000, 10, "s-%d");
    cr_assert(hr_test_is(hr_test_head(idx, other, strlen(other)), other),
              "sampling did not follow the hotspot to %s", other);
    hr_get_stats(idx, &st);
    cr_assert_gt(st.sample_rounds, 0);
    cr_assert_gt(st.head_moves, 1);
    cr_assert_eq(hr_check_rings(idx), 16);
    hr_close(idx);
}

/* A fresh ring (sampling never evaluated it: here, after a load) moves its
 * head at its first read that the head does not answer, whatever the
 * thread's tick: with R = 1000 one read places it. From then on the ring is
 * no longer fresh, and single reads of its other keys leave the head alone
 * until a thread's R-th access. */
Test(hotring, fresh_ring_guesses_at_its_first_cold_read)
{
    hr_index *idx = open_with((hr_opts){2, HR_MODE_SAMPLE, 1000, false, 0});
    fill(idx, 16, "f-%d");
    char cold[16] = "", other[16] = "";
    for (int i = 0; i < 16 && !other[0]; i++) {
        char k[16];
        snprintf(k, sizeof k, "f-%d", i);
        if (hr_test_is(hr_test_head(idx, k, strlen(k)), k))
            continue; /* the head answers it: not a cold read */
        if (!cold[0])
            strcpy(cold, k);
        else if (bucket_of(idx, k) == bucket_of(idx, cold))
            strcpy(other, k);
    }
    cr_assert(cold[0] && other[0], "no two keys off the head in one ring");
    hr_stats a, st;
    hr_get_stats(idx, &a);
    cr_assert_eq(hr_get(idx, cold, strlen(cold), NULL, NULL), KV_OK);
    cr_assert(hr_test_is(hr_test_head(idx, cold, strlen(cold)), cold),
              "the first cold read did not move the head");
    hr_get_stats(idx, &st);
    cr_assert_eq(st.head_moves - a.head_moves, 1);
    for (int i = 0; i < 100; i++) /* 100 < R: no tick, and the ring is not fresh */
        cr_assert_eq(hr_get(idx, other, strlen(other), NULL, NULL), KV_OK);
    cr_assert(hr_test_is(hr_test_head(idx, cold, strlen(cold)), cold),
              "a ring past its first guess moved off its tick");
    hr_get_stats(idx, &st);
    cr_assert_eq(st.head_moves - a.head_moves, 1);
    cr_assert_eq(st.sample_rounds - a.sample_rounds, 0);
    cr_assert_eq(hr_check_rings(idx), 16);
    hr_close(idx);
}

/* A fresh ring whose pinned head never moves goes through the hotspot hook
 * on every cold access; that must not restart the thread's tick, or a
 * thread that keeps reading such a ring never reaches an R-th access for
 * any other ring (here ring B's head would stay on b0 for good). */
Test(hotring, pinned_fresh_ring_keeps_the_threads_ticks)
{
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    fill(idx, 32, "t-%d");
    char a[2][16] = {"", ""}, bk[2][16] = {"", ""};
    for (int i = 0; i < 32; i++) {
        char k[16];
        snprintf(k, sizeof k, "t-%d", i);
        char(*set)[16] = bucket_of(idx, k) == bucket_of(idx, "t-0") ? a : bk;
        if (!set[0][0])
            strcpy(set[0], k);
        else if (!set[1][0])
            strcpy(set[1], k);
    }
    cr_assert(a[1][0] && bk[1][0], "two keys in each ring wanted");
    cr_assert_eq(hr_pin(idx, a[0], strlen(a[0])), KV_OK); /* ring A stays fresh */
    const char *b0 = hr_test_is(hr_test_head(idx, bk[0], strlen(bk[0])), bk[0]) ? bk[1] : bk[0];
    const char *b1 = b0 == bk[0] ? bk[1] : bk[0];
    get(idx, b0, KV_OK); /* ring B: first guess on b0, no longer fresh */
    cr_assert(hr_test_is(hr_test_head(idx, b0, strlen(b0)), b0));
    for (int i = 0; i < 2000; i++) {
        get(idx, a[1], KV_OK); /* a cold read of ring A: its pinned head stays */
        get(idx, b1, KV_OK);
    }
    cr_assert(hr_test_is(hr_test_head(idx, a[0], strlen(a[0])), a[0]));
    cr_assert(hr_test_is(hr_test_head(idx, b1, strlen(b1)), b1),
              "ring B never reached a sampling round");
    cr_assert_eq(hr_check_rings(idx), 32);
    hr_close(idx);
}

/* Without a hotspot a ring calms down: sampling rounds become rare, and a
 * hotspot that appears later is still found. */
Test(hotring, uniform_access_calms_sampling)
{
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    fill(idx, 16, "u-%d");
    char k[32];
    for (int i = 0; i < 20000; i++) { /* round robin: every key equally hot */
        snprintf(k, sizeof k, "u-%d", i % 16);
        hr_get(idx, k, strlen(k), NULL, NULL);
    }
    hr_table *t = atomic_load(&idx->cur);
    /* A calm ring still starts an occasional round (1 in 2^HR_CALM_SHIFT
     * turns), and a round's sampled counts can by chance show a spurious
     * hotspot (state SEEN, eager again until its next round). What must
     * hold is that uniform rings settle: all of them idle and calm at once
     * within a bounded number of further accesses. Eager rings never get
     * there (their idle total is SEEN). */
    int settled = 0;
    for (int i = 0; !settled && i < 20000; i++) {
        settled = 1;
        for (uint64_t b = 0; b < t->nb; b++)
            settled &= (atomic_load(&t->heads[b]) & (HR_H_ACTIVE | HR_H_TOTAL_MASK)) == HR_H_CALM;
        snprintf(k, sizeof k, "u-%d", i % 16);
        if (!settled)
            hr_get(idx, k, strlen(k), NULL, NULL);
    }
    cr_assert(settled, "uniform rings never settled to calm at once");
    hr_stats a, st;
    hr_get_stats(idx, &a);
    for (int i = 0; i < 20000; i++) {
        snprintf(k, sizeof k, "u-%d", i % 16);
        hr_get(idx, k, strlen(k), NULL, NULL);
    }
    hr_get_stats(idx, &st);
    /* eager rings would start a round on every 5th access (~4000 here) */
    cr_assert_lt(st.sample_rounds - a.sample_rounds, 400, "%llu rounds",
                 (unsigned long long)(st.sample_rounds - a.sample_rounds));
    /* a hotspot in a calm ring: sampling still moves the head to it */
    hammer(idx, "u-6", 20000, 10, "u-%d");
    cr_assert(hr_test_is(hr_test_head(idx, "u-6", 3), "u-6"), "calm ring missed the hotspot");
    cr_assert_eq(hr_check_rings(idx), 16);
    hr_close(idx);
}

/* Random uniform reads (not round robin): a round's chance counts often
 * show a head that would save a quarter of the walk, but rarely one item
 * with half of the samples, so the rings stay calm and rounds stay rare. */
Test(hotring, random_uniform_reads_keep_rings_calm)
{
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    fill(idx, 16, "w-%d");
    unsigned seed = 11;
    char k[32];
    for (int i = 0; i < 20000; i++) { /* past every ring's first rounds */
        snprintf(k, sizeof k, "w-%d", rand_r(&seed) % 16);
        hr_get(idx, k, strlen(k), NULL, NULL);
    }
    hr_stats a, st;
    hr_get_stats(idx, &a);
    for (int i = 0; i < 40000; i++) {
        snprintf(k, sizeof k, "w-%d", rand_r(&seed) % 16);
        hr_get(idx, k, strlen(k), NULL, NULL);
    }
    hr_get_stats(idx, &st);
    /* Calm rings start a round on 1 in 2^HR_CALM_SHIFT of their R-th cold
     * accesses: about 40000 * 7/8 / 5 / 32 = 219 rounds, a few more for the
     * rare eager spells (241 measured). With eagerness on a quarter's gain
     * alone about 70 % of the rounds made their ring eager: 528 rounds. */
    uint64_t rounds = st.sample_rounds - a.sample_rounds;
    cr_assert_lt(rounds, 400, "%llu rounds in 40000 uniform reads", (unsigned long long)rounds);
    cr_assert_eq(hr_check_rings(idx), 16);
    hr_close(idx);
}

Test(hotring, random_movement_moves_head)
{
    hr_index *idx = open_idx(2, HR_MODE_RANDOM, false);
    fill(idx, 16, "r-%d");
    hammer(idx, "r-3", 200, 0, "r-%d");
    cr_assert(hr_test_is(hr_test_head(idx, "r-3", 3), "r-3"));
    hr_close(idx);
}

Test(hotring, mode_none_never_moves)
{
    hr_index *idx = open_idx(2, HR_MODE_NONE, false);
    fill(idx, 16, "n-%d");
    hr_item *h = hr_test_head(idx, "n-3", 3);
    hammer(idx, "n-3", 500, 0, "n-%d");
    cr_assert_eq(hr_test_head(idx, "n-3", 3), h);
    hr_close(idx);
}

Test(hotring, pin_makes_head_and_resists_random_moves)
{
    hr_index *idx = open_idx(2, HR_MODE_RANDOM, false);
    fill(idx, 16, "p-%d");
    cr_assert_eq(hr_pin(idx, "p-5", 3), KV_OK);
    cr_assert_eq(hr_pin(idx, "nope", 4), KV_NOT_FOUND);
    hr_item *h = hr_test_head(idx, "p-5", 3);
    cr_assert(hr_test_is(h, "p-5"));
    cr_assert(get(idx, "p-5", KV_OK).meta.flags & HR_F_PINNED);
    /* hammer another key of the same bucket, if any, with random movement */
    char k[32];
    for (int i = 0; i < 16; i++) {
        snprintf(k, sizeof k, "p-%d", i);
        if (hr_test_head(idx, k, strlen(k)) == h && i != 5)
            hammer(idx, k, 200, 0, "p-%d");
    }
    cr_assert_eq(hr_test_head(idx, "p-5", 3), h, "random movement left a pinned head");
    hr_close(idx);
}

/* The replica's view of a pinned key: its ring's other keys take every
 * read, and sampling runs round after round (R = 1) without moving the
 * pinned head; once unpinned, the same reads move it. */
Test(hotring, pinned_head_holds_against_sampling)
{
    hr_index *idx = open_with((hr_opts){2, HR_MODE_SAMPLE, 1, false, 0});
    fill(idx, 32, "r-%d");
    char others[32][16];
    int n = 0;
    for (int i = 1; i < 32; i++) {
        snprintf(others[n], sizeof others[n], "r-%d", i);
        if (bucket_of(idx, others[n]) == bucket_of(idx, "r-0"))
            n++;
    }
    cr_assert_geq(n, 3, "too few keys in r-0's ring (%d)", n);
    /* Reads before the pin: the ring leaves its fresh state (a fresh ring
     * with a pinned head never samples) and its head goes to others[0]. */
    for (int i = 0; i < 100; i++)
        get(idx, others[0], KV_OK);
    cr_assert(hr_test_is(hr_test_head(idx, "r-0", 3), others[0]));
    cr_assert_eq(hr_pin(idx, "r-0", 3), KV_OK);
    hr_item *h = hr_test_head(idx, "r-0", 3);
    cr_assert(hr_test_is(h, "r-0"));
    hr_stats a, st;
    hr_get_stats(idx, &a);
    for (int i = 0; i < 20000; i++) /* skewed: others[0] takes 95 % */
        get(idx, others[i % 20 ? 0 : 1 + (i / 20) % (n - 1)], KV_OK);
    hr_get_stats(idx, &st);
    cr_assert_gt(st.sample_rounds - a.sample_rounds, 0, "no sampling round ran");
    cr_assert_eq(hr_test_head(idx, "r-0", 3), h, "sampling moved a pinned head");
    cr_assert_eq(st.head_moves, a.head_moves);
    got g = get(idx, "r-0", KV_OK);
    cr_assert_eq(hr_set_flags(idx, "r-0", 3, g.meta.seqno, 0, HR_F_PINNED), KV_OK);
    for (int i = 0; i < 20000; i++)
        get(idx, others[i % 20 ? 0 : 1 + (i / 20) % (n - 1)], KV_OK);
    cr_assert(hr_test_is(hr_test_head(idx, "r-0", 3), others[0]),
              "unpinned, the head did not follow the reads to %s", others[0]);
    cr_assert_eq(hr_check_rings(idx), 32);
    hr_close(idx);
}

Test(hotring, pinned_read_statistics)
{
    /* 2 buckets, 64 keys: every ring holds ~32 colliding keys. */
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    fill(idx, 64, "q-%d");
    hr_stats a, b;
    hr_get_stats(idx, &a);
    hammer(idx, "q-9", 500, 0, "q-%d"); /* unpinned reads never count */
    hr_get_stats(idx, &b);
    cr_assert_eq(b.pinned_reads, a.pinned_reads);
    cr_assert_eq(b.pinned_head_hits, a.pinned_head_hits);
    cr_assert_eq(hr_pin(idx, "q-40", 4), KV_OK);
    hr_get_stats(idx, &a);
    cr_assert_eq(a.pinned_reads, 0);
    /* The pinned key is its ring's head, so each of its reads is a head hit
     * (with and without a snapshot callback). */
    const int n = 1000;
    for (int i = 0; i < n; i++) {
        got g = {0};
        kv_err rv = hr_get(idx, "q-40", 4, i % 2 ? grab : NULL, &g);
        cr_assert_eq(rv, KV_OK);
    }
    hr_get_stats(idx, &b);
    cr_assert_eq(b.pinned_reads - a.pinned_reads, (uint64_t)n);
    cr_assert_eq(b.pinned_head_hits - a.pinned_head_hits, (uint64_t)n);
    cr_assert_eq(b.head_hits - a.head_hits, (uint64_t)n);
    /* Reads of the other keys of the pinned key's ring are not pinned reads. */
    char k[32];
    int others = 0;
    hr_get_stats(idx, &a);
    for (int i = 0; i < 64; i++) {
        snprintf(k, sizeof k, "q-%d", i);
        if (i == 40 || bucket_of(idx, k) != bucket_of(idx, "q-40"))
            continue;
        others++;
        for (int j = 0; j < 10; j++)
            get(idx, k, KV_OK);
    }
    hr_get_stats(idx, &b);
    cr_assert_gt(others, 4, "too few colliding keys (%d)", others);
    cr_assert_eq(b.reads - a.reads, (uint64_t)others * 10);
    cr_assert_eq(b.pinned_reads, a.pinned_reads);
    cr_assert_eq(b.pinned_head_hits, a.pinned_head_hits);
    /* A miss in that ring does not count either. */
    get(idx, "q-absent", KV_NOT_FOUND);
    hr_get_stats(idx, &a);
    cr_assert_eq(a.pinned_reads, b.pinned_reads);
    hr_close(idx);
}

Test(hotring, inheritance_on_rcu_update_and_delete_of_head)
{
    hr_index *idx = open_idx(2, HR_MODE_NONE, false);
    fill(idx, 16, "h-%d");
    cr_assert_eq(hr_pin(idx, "h-7", 3), KV_OK);
    cr_assert(hr_test_is(hr_test_head(idx, "h-7", 3), "h-7"));
    hr_item *old = hr_test_head(idx, "h-7", 3);
    cr_assert_eq(put(idx, "h-7", "a value needing an RCU update", 2), KV_OK);
    hr_item *nh = hr_test_head(idx, "h-7", 3);
    cr_assert(hr_test_is(nh, "h-7"), "RCU update of the head must move the head to it");
    cr_assert_neq(nh, old);
    hr_item *succ = hr_addr(atomic_load(&nh->next));
    cr_assert_eq(hr_remove(idx, "h-7", 3, NULL, NULL), KV_OK);
    cr_assert_eq(hr_test_head(idx, "h-7", 3), succ, "delete of the head moves it to the next item");
    cr_assert_eq(hr_check_rings(idx), 15);
    hr_close(idx);
}

Test(hotring, last_item_of_ring_removed_and_reinserted)
{
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(put(idx, "solo", "a long value, RCU-updated", 1), KV_OK);
        cr_assert_eq(put(idx, "solo", "and again replaced by RCU", 2), KV_OK);
        cr_assert_str_eq(get(idx, "solo", KV_OK).val, "and again replaced by RCU");
        cr_assert_eq(hr_remove(idx, "solo", 4, NULL, NULL), KV_OK);
        get(idx, "solo", KV_NOT_FOUND);
        cr_assert_null(hr_test_head(idx, "solo", 4));
    }
    hr_close(idx);
}

/* ------------------------------------------------------------ rehash */

Test(hotring, rehash_keeps_every_key_reachable_and_ordered)
{
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    char k[32], v[48];
    for (int i = 0; i < 2000; i++) {
        snprintf(k, sizeof k, "rh-%d", i);
        snprintf(v, sizeof v, i % 2 ? "%d" : "long value number %d", i);
        cr_assert_eq(put(idx, k, v, 1), KV_OK);
    }
    hammer(idx, "rh-77", 3000, 4, "rh-%d");
    for (int r = 0; r < 5; r++) {
        cr_assert_eq(hr_rehash(idx), KV_OK);
        cr_assert_eq(hr_check_rings(idx), 2000);
    }
    hr_stats st;
    hr_get_stats(idx, &st);
    cr_assert_eq(st.buckets, 64);
    cr_assert_eq(st.rehashes, 5);
    for (int i = 0; i < 2000; i++) {
        snprintf(k, sizeof k, "rh-%d", i);
        snprintf(v, sizeof v, i % 2 ? "%d" : "long value number %d", i);
        cr_assert_str_eq(get(idx, k, KV_OK).val, v);
    }
    hr_close(idx);
}

Test(hotring, access_cost_triggers_rehash)
{
    hr_index *idx = open_with((hr_opts){2, HR_MODE_NONE, 5, true, 4.0});
    fill(idx, 400, "c-%d");
    char k[32];
    hr_stats st = {0};
    for (int round = 0; round < 200 && st.rehashes == 0; round++) {
        for (int i = 0; i < 400; i++) {
            snprintf(k, sizeof k, "c-%d", i);
            hr_get(idx, k, strlen(k), NULL, NULL);
        }
        hr_get_stats(idx, &st);
        if (st.rehashes == 0)
            usleep(10000);
    }
    cr_assert_gt(st.rehashes, 0, "long rings did not trigger a rehash");
    hr_close(idx);
}

/* A rehash paused in its first grace period (a reader holds a read-side
 * section) leaves the new table's buckets as halves joined through the old
 * wrap links; here every upper half holds only its split item. Writes, reads
 * and deletes of keys in those halves must complete while the rehash is
 * still paused: they must not wait for it (the rehash waits for them). */
typedef struct pause_ctx {
    hr_index *idx;
    _Atomic int held, release, done;
    kv_err rv;
} pause_ctx;

static void *pause_reader(void *arg)
{
    pause_ctx *c = arg;
    hr_thread_register();
    hr_rcu_lock();
    atomic_store(&c->held, 1);
    while (!atomic_load(&c->release))
        usleep(1000);
    hr_rcu_unlock();
    hr_thread_unregister();
    return NULL;
}

static void *pause_rehasher(void *arg)
{
    pause_ctx *c = arg;
    hr_thread_register();
    c->rv = hr_rehash(c->idx);
    atomic_store(&c->done, 1);
    hr_thread_unregister();
    return NULL;
}

/* n keys "fmt" whose hash has bit 62 equal to upper (2 -> 4 buckets: the
 * upper half of an old bucket). */
static int half_keys(char keys[][32], int n, const char *fmt, int upper)
{
    int got = 0;
    for (int i = 0; got < n && i < 100000; i++) {
        snprintf(keys[got], 32, fmt, i);
        uint32_t tag = hr_key_tag(keys[got], strlen(keys[got]));
        if ((int)(tag >> 30 & 1) == upper)
            got++;
    }
    return got;
}

Test(hotring, ops_on_half_split_rings_do_not_wait_for_the_rehash, .timeout = 60)
{
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    static char lo[16][32], up[16][32];
    cr_assert_eq(half_keys(lo, 16, "lo-%d", 0), 16);
    cr_assert_eq(half_keys(up, 16, "up-%d", 1), 16);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(put(idx, lo[i], "v", 1), KV_OK);
    static pause_ctx c;
    c = (pause_ctx){.idx = idx};
    pthread_t rd, rh;
    pthread_create(&rd, NULL, pause_reader, &c);
    while (!atomic_load(&c.held))
        usleep(1000);
    pthread_create(&rh, NULL, pause_rehasher, &c);
    while (atomic_load(&idx->cur)->bits != 2) /* split done, tables swapped */
        usleep(1000);
    cr_assert_not_null(atomic_load(&idx->aux));
    /* Upper halves: only split items. Miss, insert, read, delete, reinsert. */
    get(idx, up[0], KV_NOT_FOUND);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(put(idx, up[i], i % 2 ? "a value long enough for RCU" : "x", 2), KV_OK);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(hr_remove(idx, up[i], strlen(up[i]), NULL, NULL), KV_OK);
    get(idx, up[3], KV_NOT_FOUND);
    for (int i = 0; i < 16; i++)
        cr_assert_eq(put(idx, up[i], "back", 3), KV_OK);
    /* Lower halves: RCU updates and a delete. */
    for (int i = 0; i < 16; i++)
        cr_assert_eq(put(idx, lo[i], "lower, replaced by RCU", 4), KV_OK);
    cr_assert_eq(hr_remove(idx, lo[0], strlen(lo[0]), NULL, NULL), KV_OK);
    cr_assert_eq(hr_pin(idx, up[5], strlen(up[5])), KV_OK);
    cr_assert_eq(atomic_load(&c.done), 0, "the rehash finished while a reader held it");
    atomic_store(&c.release, 1);
    pthread_join(rd, NULL);
    pthread_join(rh, NULL);
    cr_assert_eq(c.rv, KV_OK);
    cr_assert_eq(hr_check_rings(idx), 31);
    get(idx, lo[0], KV_NOT_FOUND);
    for (int i = 1; i < 16; i++)
        cr_assert_str_eq(get(idx, lo[i], KV_OK).val, "lower, replaced by RCU");
    for (int i = 0; i < 16; i++)
        cr_assert_str_eq(get(idx, up[i], KV_OK).val, "back");
    hr_close(idx);
}

/* ------------------------------------------------- write conditions */

static kv_err refuse_with(void *arg, const hr_view *cur)
{
    (void)cur;
    return *(const kv_err *)arg;
}

/* The index's own retries never use a kv_err: a condition may return any
 * code, KV_ABORTED included, and the caller gets it back. */
Test(hotring, cond_may_return_any_error, .timeout = 30)
{
    hr_index *idx = open_idx(4, HR_MODE_SAMPLE, false);
    for (int e = 1; e < KV_ERR_COUNT_; e++) {
        kv_err want = (kv_err)e;
        cr_assert_eq(hr_upsert(idx, "absent", 6, "v", 1, NULL, refuse_with, &want), want);
        cr_assert_eq(put(idx, "here", "v", 1), KV_OK);
        cr_assert_eq(hr_upsert(idx, "here", 4, "w", 1, NULL, refuse_with, &want), want);
        cr_assert_eq(
            hr_upsert(idx, "here", 4, "a long value for RCU", 20, NULL, refuse_with, &want), want);
        cr_assert_eq(hr_remove(idx, "here", 4, refuse_with, &want), want);
        cr_assert_str_eq(get(idx, "here", KV_OK).val, "v");
        get(idx, "absent", KV_NOT_FOUND);
    }
    cr_assert_eq(hr_check_rings(idx), 1);
    hr_close(idx);
}

/* ------------------------------------------------------- batched reads */

typedef struct batch_got {
    int n[128];
    char val[128][64];
    size_t vlen[128];
    uint64_t version[128];
    size_t last; /* calls come in increasing i */
    int calls;
} batch_got;

static void grab_at(void *arg, size_t i, const hr_view *v)
{
    batch_got *g = arg;
    cr_assert_lt(i, 128);
    cr_assert(g->calls == 0 || i > g->last, "fn called out of order (%zu after %zu)", i, g->last);
    g->last = i;
    g->calls++;
    g->n[i]++;
    cr_assert_lt(v->vlen, sizeof g->val[i]);
    memcpy(g->val[i], v->val, v->vlen);
    g->vlen[i] = v->vlen;
    g->version[i] = v->meta.version;
}

/* The value and metadata of a hit (keys may be long: not copied). */
static void grab_val(void *arg, const hr_view *v)
{
    got *g = arg;
    g->n++;
    cr_assert_lt(v->vlen, sizeof g->val);
    memcpy(g->val, v->val, v->vlen);
    g->vlen = v->vlen;
    g->meta = v->meta;
}

/* Every key of the batch gets the answer hr_get gives it: hits with their
 * record, misses without a call, a key given twice answered twice; long
 * rings (4 buckets), long keys and big values included. */
Test(hotring, get_batch_matches_get)
{
    hr_index *idx = open_idx(4, HR_MODE_SAMPLE, false);
    static char keys[100][600];
    hr_key ks[100];
    for (int i = 0; i < 100; i++) {
        if (i % 10 == 9) { /* a key of HR_KLEN_LONG bytes or more */
            memset(keys[i], 'a' + i % 26, 599);
            snprintf(keys[i], 16, "long-%d-", i);
            keys[i][strlen(keys[i])] = 'x';
            keys[i][599] = 0;
        } else {
            snprintf(keys[i], sizeof keys[i], "b-%d", i % 3 == 2 ? 1000 + i : i);
        }
        ks[i] = (hr_key){keys[i], strlen(keys[i])};
    }
    ks[50] = ks[4]; /* a duplicate */
    char v[64];
    for (int i = 0; i < 100; i++) {
        if (i % 3 == 2 || i == 50)
            continue; /* absent keys */
        snprintf(v, sizeof v, i % 2 ? "%d" : "a value longer than eight bytes %d", i);
        cr_assert_eq(put(idx, keys[i], v, (uint64_t)i + 1), KV_OK);
    }
    for (int round = 0; round < 3; round++) { /* later rounds after head moves */
        batch_got g = {0};
        size_t hits = 12345;
        hr_stats a, st;
        hr_get_stats(idx, &a);
        cr_assert_eq(hr_get_batch(idx, ks, 100, grab_at, &g, &hits), KV_OK);
        hr_get_stats(idx, &st);
        cr_assert_eq(st.reads - a.reads, 100);
        size_t want = 0;
        for (int i = 0; i < 100; i++) {
            got one = {0};
            kv_err rv = hr_get(idx, ks[i].key, ks[i].klen, grab_val, &one);
            cr_assert_eq(g.n[i], rv == KV_OK ? 1 : 0, "key %d: %d calls, hr_get %s", i, g.n[i],
                         kv_strerror(rv));
            if (rv != KV_OK)
                continue;
            want++;
            cr_assert_eq(g.vlen[i], one.vlen);
            cr_assert(memcmp(g.val[i], one.val, one.vlen) == 0, "key %d: value differs", i);
            cr_assert_eq(g.version[i], one.meta.version);
        }
        cr_assert_eq(want, 100 - 33 + 1); /* 33 absent keys, plus the duplicate of a present one */
        cr_assert_eq(hits, want);
        cr_assert_eq((size_t)g.calls, want);
    }
    hr_close(idx);
}

Test(hotring, get_batch_arguments)
{
    hr_index *idx = open_idx(4, HR_MODE_NONE, false);
    cr_assert_eq(put(idx, "k", "v", 1), KV_OK);
    batch_got g = {0};
    size_t hits = 77;
    hr_key ok[2] = {{"k", 1}, {"absent", 6}};
    hr_key bad[2] = {{"k", 1}, {"", 0}};
    cr_assert_eq(hr_get_batch(NULL, ok, 2, grab_at, &g, &hits), KV_INVALID_ARGUMENT);
    cr_assert_eq(hr_get_batch(idx, NULL, 2, grab_at, &g, &hits), KV_INVALID_ARGUMENT);
    cr_assert_eq(hr_get_batch(idx, bad, 2, grab_at, &g, &hits), KV_INVALID_ARGUMENT);
    cr_assert_eq(g.calls, 0, "no key is looked up when one is invalid");
    cr_assert_eq(hits, 77, "hits written only on success");
    cr_assert_eq(hr_get_batch(idx, NULL, 0, grab_at, &g, &hits), KV_OK);
    cr_assert_eq(hits, 0);
    cr_assert_eq(hr_get_batch(idx, ok, 2, NULL, NULL, &hits), KV_OK); /* existence check */
    cr_assert_eq(hits, 1);
    cr_assert_eq(hr_get_batch(idx, ok, 2, grab_at, &g, NULL), KV_OK);
    cr_assert_eq(g.calls, 1);
    hr_close(idx);
}

typedef struct tag_of {
    uint32_t tag;
    int i;
} tag_of;

static int tag_cmp(const void *a, const void *b)
{
    const tag_of *x = a, *y = b;
    return x->tag != y->tag ? (x->tag < y->tag ? -1 : 1) : x->i - y->i;
}

/* Two keys whose 32-bit tags (the top hash bits, which also pick the
 * bucket) are equal: found by brute force over "tc-%d". */
static void tag_twins(char *a, char *b, size_t len)
{
    enum { N = 300000 };
    tag_of *t = malloc(N * sizeof *t);
    cr_assert_not_null(t);
    char k[32];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof k, "tc-%d", i);
        t[i] = (tag_of){hr_key_tag(k, strlen(k)), i};
    }
    qsort(t, N, sizeof *t, tag_cmp);
    int found = -1;
    for (int i = 1; i < N && found < 0; i++)
        if (t[i].tag == t[i - 1].tag)
            found = i;
    cr_assert_geq(found, 0, "no two keys with the same tag among %d", N);
    snprintf(a, len, "tc-%d", t[found - 1].i);
    snprintf(b, len, "tc-%d", t[found].i);
    free(t);
}

/* Keys with the same tag share a ring and are ordered by their bytes: both
 * are found (by hr_get and by a batch), whichever one the head points at,
 * after the other is removed and re-inserted, and through rehashes (which
 * split rings by tag, so the twins always stay together). */
Test(hotring, tag_collisions_in_one_ring, .timeout = 30)
{
    char a[32], b[32];
    tag_twins(a, b, sizeof a);
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    cr_assert_eq(bucket_of(idx, a), bucket_of(idx, b));
    fill(idx, 64, "tn-%d");
    cr_assert_eq(put(idx, a, "va", 1), KV_OK);
    cr_assert_eq(put(idx, b, "vb", 2), KV_OK);
    uint64_t seq_a = 1, seq_b = 2; /* put() writes version = seqno */
    for (int r = 0; r < 4; r++) {
        const char *hot = r % 2 ? a : b; /* make each twin the ring head in turn */
        cr_assert_eq(hr_pin(idx, hot, strlen(hot)), KV_OK);
        cr_assert(hr_test_is(hr_test_head(idx, hot, strlen(hot)), hot));
        cr_assert_str_eq(get(idx, a, KV_OK).val, "va");
        cr_assert_str_eq(get(idx, b, KV_OK).val, "vb");
        hr_key ks[3] = {{a, strlen(a)}, {b, strlen(b)}, {"tc-absent", 9}};
        batch_got g = {0};
        size_t hits = 0;
        cr_assert_eq(hr_get_batch(idx, ks, 3, grab_at, &g, &hits), KV_OK);
        cr_assert_eq(hits, 2);
        cr_assert(g.n[0] == 1 && g.n[1] == 1 && g.n[2] == 0);
        cr_assert(memcmp(g.val[0], "va", 2) == 0 && memcmp(g.val[1], "vb", 2) == 0);
        /* remove one twin: the other stays; put it back */
        const char *gone = r % 2 ? b : a;
        cr_assert_eq(hr_remove(idx, gone, strlen(gone), NULL, NULL), KV_OK);
        get(idx, gone, KV_NOT_FOUND);
        cr_assert_str_eq(get(idx, hot, KV_OK).val, hot == a ? "va" : "vb");
        uint64_t *seq_gone = gone == a ? &seq_a : &seq_b;
        *seq_gone = 3 + (uint64_t)r;
        cr_assert_eq(put(idx, gone, gone == a ? "va" : "vb", *seq_gone), KV_OK);
        cr_assert_eq(hr_check_rings(idx), 66);
        uint64_t seq_hot = hot == a ? seq_a : seq_b;
        cr_assert_eq(hr_set_flags(idx, hot, strlen(hot), seq_hot, 0, HR_F_PINNED), KV_OK);
        cr_assert_eq(hr_rehash(idx), KV_OK); /* 4, 8, 16, 32 buckets */
        cr_assert_eq(hr_check_rings(idx), 66);
        cr_assert_eq(bucket_of(idx, a), bucket_of(idx, b));
    }
    hr_close(idx);
}

/* Batched reads while the table doubles under them: every key stays found
 * with its value. */
Test(hotring, get_batch_across_rehashes, .timeout = 30)
{
    hr_index *idx = open_idx(2, HR_MODE_SAMPLE, false);
    enum { N = 1000 };
    static char keys[N][16];
    static hr_key ks[N];
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "gr-%d", i);
        ks[i] = (hr_key){keys[i], strlen(keys[i])};
        cr_assert_eq(put(idx, keys[i], keys[i], 1), KV_OK);
    }
    for (int r = 0; r < 6; r++) {
        size_t hits = 0;
        cr_assert_eq(hr_get_batch(idx, ks, N, NULL, NULL, &hits), KV_OK);
        cr_assert_eq(hits, N);
        for (int i = 0; i < N; i += 100) {
            batch_got g = {0};
            cr_assert_eq(hr_get_batch(idx, &ks[i], 100, grab_at, &g, &hits), KV_OK);
            cr_assert_eq(hits, 100);
            for (int j = 0; j < 100; j++)
                cr_assert(g.vlen[j] == ks[i + j].klen &&
                          memcmp(g.val[j], ks[i + j].key, g.vlen[j]) == 0);
        }
        cr_assert_eq(hr_rehash(idx), KV_OK);
    }
    cr_assert_eq(hr_check_rings(idx), N);
    hr_close(idx);
}
