/* SPDX-License-Identifier: MIT */
/*
 * node_hot: merging router reports, pin decisions, withdrawal of keys a
 * router leaves out, ageing without reports (a dead router's pins go), and
 * the table's in-place deletion keeping every surviving key findable.
 */
#include "tests/kv_testfw.h"
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
    report("gone", 0, 4, 1000, 100, kv_now_ns()); /* 100 ms windows: stale after 300 ms */
    cr_assert_eq(node_hot_pinned(hot), 4);
    size_t left = 4;
    for (int i = 0; i < 100 && left; i++) { /* up to 10 s; the ticker runs every 250 ms */
        usleep(100000);
        left = node_hot_pinned(hot);
    }
    cr_assert_eq(left, 0, "pins left with no report for 10 s: %zu", left);
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
