/* SPDX-License-Identifier: MIT */
/*
 * node_hot: merging router reports, pin decisions, withdrawal of keys a
 * router leaves out, ageing without reports (a dead router's pins go), the
 * table's in-place deletion keeping every surviving key findable, and the
 * bounds on what a report can make the view hold.
 */
#include "tests/kv_testfw.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "node/engine.h"
#include "node/hot.h"

static char dir[64];
static engine *eng;
static node_hot *hot;

static void setup(void)
{
    /* mkdtemp fills in the template: each test needs a fresh one (under
     * TSan all tests share one process, tests/kv_testfw.h) */
    snprintf(dir, sizeof(dir), "/tmp/kv-hot-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    engine_opts o = {.fast_dir = dir, .mem_mb = 8, .sync = ENGINE_SYNC_NONE};
    char err[256];
    cr_assert_eq(engine_open(&eng, &o, err, sizeof(err)), KV_OK, "engine_open: %s", err);
    engine_thread_register();
}

static void teardown(void)
{
    node_hot_destroy(hot);
    hot = NULL;
    engine_thread_unregister();
    engine_close(eng);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(hot, .init = setup, .fini = teardown, .timeout = 60);

/* Sends a report of keys "k<first>".."k<first+n-1>" at rate ops/s from
 * router id, window window_ms, at time now. */
static void report(const char *id, int first, int n, double rate, uint32_t window_ms, uint64_t now)
{
    Kv__HotKey *hk = calloc((size_t)n + 1, sizeof(*hk));
    Kv__HotKey **ptrs = calloc((size_t)n + 1, sizeof(*ptrs));
    char(*keys)[16] = calloc((size_t)n + 1, sizeof(*keys));
    cr_assert(hk && ptrs && keys);
    for (int i = 0; i < n; i++) {
        snprintf(keys[i], sizeof(keys[i]), "k%d", first + i);
        kv__hot_key__init(&hk[i]);
        hk[i].key = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
        hk[i].ops_per_s = rate;
        ptrs[i] = &hk[i];
    }
    Kv__HotKeysRequest req = KV__HOT_KEYS_REQUEST__INIT;
    req.router_id = (char *)id;
    req.window_ms = window_ms;
    req.n_keys = (size_t)n;
    req.keys = ptrs;
    node_hot_report(hot, &req, now);
    free(keys);
    free(ptrs);
    free(hk);
}

/* The view's rate for key "k<i>", or -1 when it is not in the view. */
static double view_rate(int i, bool *pinned)
{
    char key[16];
    snprintf(key, sizeof(key), "k%d", i);
    node_hot_item *items;
    size_t n = node_hot_view(hot, kv_now_ns(), &items);
    double rate = -1;
    for (size_t j = 0; j < n; j++)
        if (items[j].klen == strlen(key) && memcmp(items[j].key, key, items[j].klen) == 0) {
            rate = items[j].ops_per_s;
            if (pinned)
                *pinned = items[j].pinned;
        }
    node_hot_view_free(items, n);
    return rate;
}

static size_t view_size(void)
{
    node_hot_item *items;
    size_t n = node_hot_view(hot, kv_now_ns(), &items);
    node_hot_view_free(items, n);
    return n;
}

Test(hot, rates_sum_over_routers_and_pin_at_threshold)
{
    cr_assert_eq(node_hot_create(&hot, eng, 100), KV_OK);
    uint64_t now = kv_now_ns(); /* 10-minute windows: nothing ages out here */
    report("r1", 0, 1, 60, 600000, now);
    bool pinned = true;
    cr_assert_float_eq(view_rate(0, &pinned), 60, 1e-9);
    cr_assert_not(pinned, "60 ops/s is under the threshold");
    report("r2", 0, 1, 60, 600000, now);
    cr_assert_float_eq(view_rate(0, &pinned), 120, 1e-9);
    cr_assert(pinned, "two routers together pass the threshold");
    cr_assert(engine_is_pinned(eng, "k0", 2));
    cr_assert_eq(node_hot_pinned(hot), 1);
    /* r2's next report leaves the key out: its share is withdrawn at once */
    report("r2", 1, 1, 5, 600000, now + 1000);
    cr_assert_float_eq(view_rate(0, &pinned), 60, 1e-9);
    cr_assert_not(pinned);
    cr_assert_not(engine_is_pinned(eng, "k0", 2));
}

Test(hot, threshold_zero_pins_nothing)
{
    cr_assert_eq(node_hot_create(&hot, eng, 0), KV_OK);
    report("r1", 0, 10, 1e6, 600000, kv_now_ns());
    cr_assert_eq(view_size(), 10);
    cr_assert_eq(node_hot_pinned(hot), 0);
}

/* A router that dies sends nothing more: its pins must still go once its
 * reports are AGE_WINDOWS windows old (no other report arrives). */
Test(hot, pins_of_a_silent_router_age_out)
{
    cr_assert_eq(node_hot_create(&hot, eng, 10), KV_OK);
    /* 1 s windows: stale after 3 s. The first check must come before the
     * ticker (every 250 ms) ages them out; 3 s leaves room for a descheduled
     * test thread under TSan on a loaded host (100 ms windows flaked in CI). */
    uint64_t t0 = kv_now_ns();
    report("gone", 0, 4, 1000, 1000, t0);
    size_t pinned = node_hot_pinned(hot);
    if (kv_now_ns() - t0 < 2500000000ull) /* else the ticker may rightly have aged them */
        cr_assert_eq(pinned, 4);
    size_t left = pinned;
    for (int i = 0; i < 200 && left; i++) { /* up to 20 s; the ticker runs every 250 ms */
        usleep(100000);
        left = node_hot_pinned(hot);
    }
    cr_assert_eq(left, 0, "pins left with no report for 20 s: %zu", left);
    cr_assert_eq(view_size(), 0, "the stale keys left the view");
    for (int i = 0; i < 4; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i);
        cr_assert_not(engine_is_pinned(eng, key, strlen(key)), "%s still pinned", key);
    }
}

/* Heavy churn through the open-addressing table: reports that drop most
 * keys and add new ones must leave exactly the reported keys, each findable
 * with its own rate (a broken backward-shift deletion loses or duplicates
 * entries that shared a probe run with a deleted one). */
Test(hot, churn_keeps_every_live_key)
{
    cr_assert_eq(node_hot_create(&hot, eng, 1e9), KV_OK);
    for (int round = 0; round < 20; round++) {
        int first = round * 1500, n = 6000; /* overlaps the previous round by 4500 */
        /* real time and long windows: the ticker must not age anything out */
        report("r1", first, n, 10 + round, 600000, kv_now_ns());
        cr_assert_eq(view_size(), (size_t)n, "round %d", round);
        for (int i = first; i < first + n; i += 97) {
            double r = view_rate(i, NULL);
            cr_assert_gt(r, 0, "round %d: k%d lost", round, i);
        }
        cr_assert_lt(view_rate(first - 1, NULL), 0, "round %d: withdrawn key kept", round);
    }
}

/* ---- bounds: a report is network input ---- */

/* Sends n keys of klen bytes (key i: 'a' + i % 26 repeated, then i in
 * decimal) at rate from router id. */
static void report_raw(const char *id, size_t n, size_t klen, double rate, uint32_t window_ms,
                       uint64_t now)
{
    Kv__HotKey *hk = calloc(n, sizeof(*hk));
    Kv__HotKey **ptrs = calloc(n, sizeof(*ptrs));
    uint8_t *keys = calloc(n, klen);
    cr_assert(hk && ptrs && keys);
    for (size_t i = 0; i < n; i++) {
        uint8_t *k = keys + i * klen;
        memset(k, 'a' + (int)(i % 26), klen);
        char num[24];
        int nl = snprintf(num, sizeof(num), "%zu", i);
        memcpy(k + klen - (size_t)nl, num, (size_t)nl);
        kv__hot_key__init(&hk[i]);
        hk[i].key = (ProtobufCBinaryData){klen, k};
        hk[i].ops_per_s = rate;
        ptrs[i] = &hk[i];
    }
    Kv__HotKeysRequest req = KV__HOT_KEYS_REQUEST__INIT;
    req.router_id = (char *)id;
    req.window_ms = window_ms;
    req.n_keys = n;
    req.keys = ptrs;
    char err[256];
    kv_err want = n <= NODE_HOT_MAX_REPORT_KEYS && window_ms <= NODE_HOT_MAX_WINDOW_MS &&
                          klen <= NODE_HOT_MAX_KEY && isfinite(rate) && rate >= 0
                      ? KV_OK
                      : KV_INVALID_ARGUMENT;
    cr_assert_eq(node_hot_check(&req, NODE_HOT_MAX_KEY, err, sizeof(err)), want, "node_hot_check");
    node_hot_report(hot, &req, now);
    free(keys);
    free(ptrs);
    free(hk);
}

/* Key bytes the view holds, and its size. */
static size_t view_bytes(size_t *n)
{
    node_hot_item *items;
    *n = node_hot_view(hot, kv_now_ns(), &items);
    size_t bytes = 0;
    for (size_t i = 0; i < *n; i++)
        bytes += items[i].klen;
    node_hot_view_free(items, *n);
    return bytes;
}

/* A rate of +inf with a window of 2^32 - 1 ms pinned a key for ~150 days;
 * NaN and negative rates were taken as they came. */
Test(hot, unusable_rates_are_skipped_and_windows_bounded)
{
    cr_assert_eq(node_hot_create(&hot, eng, 10), KV_OK);
    uint64_t now = kv_now_ns();
    report_raw("r1", 3, 8, INFINITY, UINT32_MAX, now);
    report_raw("r2", 3, 8, NAN, 1000, now);
    report_raw("r3", 3, 8, -5, 1000, now);
    size_t n;
    view_bytes(&n);
    cr_assert_eq(n, 0, "unusable rates entered the view");
    cr_assert_eq(node_hot_pinned(hot), 0);
    report_raw("r1", 1, 8, 1e300, UINT32_MAX, now); /* clamped rate, clamped window */
    node_hot_item *items;
    n = node_hot_view(hot, now, &items);
    cr_assert(n == 1 && items[0].ops_per_s == NODE_HOT_MAX_RATE && items[0].pinned);
    node_hot_view_free(items, n);
    uint64_t later = now + (uint64_t)3 * NODE_HOT_MAX_WINDOW_MS * 1000000ull + 1000000ull;
    report_raw("other", 0, 8, 1, 1000, later); /* a sweep after 3 bounded windows */
    cr_assert_eq(node_hot_pinned(hot), 0, "the pin outlived 3 windows of the bounded length");
    cr_assert_eq(node_hot_view(hot, later, &items), 0);
    node_hot_view_free(items, 0);
}

/* Keys over the key limit are refused; a report's keys and the view's
 * memory are bounded (60 reports of 4 MiB keys used to grow a node by
 * 430 MB for good). */
Test(hot, keys_per_report_and_key_bytes_are_bounded)
{
    cr_assert_eq(node_hot_create(&hot, eng, 1e9), KV_OK);
    uint64_t now = kv_now_ns();
    report_raw("big", 2, NODE_HOT_MAX_KEY + 1, 100, 60000, now);
    size_t n;
    cr_assert_eq(view_bytes(&n), 0, "an over-long key entered the view");
    report_raw("many", NODE_HOT_MAX_REPORT_KEYS + 1000, 8, 100, 60000, now);
    view_bytes(&n);
    cr_assert_eq(n, NODE_HOT_MAX_REPORT_KEYS, "keys taken from one report");
    for (int r = 0; r < 4; r++) { /* 4 x 4096 keys of 4 KiB: 64 MiB offered */
        char id[8];
        snprintf(id, sizeof(id), "w%d", r);
        report_raw(id, 4096, NODE_HOT_MAX_KEY, 100, 60000, now);
    }
    size_t bytes = view_bytes(&n);
    cr_assert_leq(bytes, NODE_HOT_MAX_BYTES, "the view holds %zu key bytes", bytes);
    cr_assert_gt(n, 0);
    uint64_t later = now + (uint64_t)3 * 60000 * 1000000ull + 1000000ull;
    report_raw("other", 0, 8, 1, 1000, later); /* everything ages out and is freed */
    bytes = view_bytes(&n);
    cr_assert(n == 0 && bytes == 0, "%zu keys left", n);
    report_raw("again", 100, NODE_HOT_MAX_KEY, 100, 60000, later); /* the budget came back */
    view_bytes(&n);
    cr_assert_eq(n, 100);
}
