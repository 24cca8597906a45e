/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for every kvrouter handler, in-process: this file
 * compiles shard/router_admin.c itself (its method table is file-local; the
 * rest of the router comes from kv_router_fuzz, the router library without
 * router_admin.c) and builds a router by hand, as router_start would but
 * without its threads (refresher, prober, hot-key reporter) so each input
 * runs alone: the hot-key window is rotated after every call instead, as
 * the reporter would. The input is [u8 flags][peer script][calls]: flags
 * bits 0-1 pick the map (none, one node, three nodes rf 2, three nodes and
 * a joining fourth), bit 2 turns hot-key detection and both mitigations on;
 * the script (fz_peers_script) makes the nodes at tcp://127.0.0.1:1..3
 * answer forwards with fuzzed replies (maps in FAILED_PRECONDITION bodies,
 * GetReplies for read repair, ...), or not at all. The calls are then run
 * against the router's method table (fuzz_rpc.h). Everything is torn down
 * after each input.
 */
#include "shard/router_admin.c"

#include "fuzz_rpc.h"

#define MAX_CALLS 8

static uint64_t router_epoch(void *user)
{
    return cmap_slot_epoch(((router *)user)->maps);
}

/* What hot_main does at the end of a window, without the pushes. */
static void rotate(void *user, int call)
{
    router *r = user;
    hk_report rep = {0};
    if (!r->hot || hk_window_rotate(r->hot, kv_now_ns(), (size_t)r->cfg.hot_k, &rep) != KV_OK)
        return;
    router_mit_update(r->mit, &rep);
    hk_report_free(&rep);
}

static void setup(router *r, uint8_t flags)
{
    *r = (router){.cfg = {.listen = "inproc://hotkv-fuzz-router",
                          .seeds = "tcp://127.0.0.1:1",
                          .workers = 1,
                          .refresh_ms = 3600 * 1000,
                          .hot_sample = flags & 4 ? 1 : 0,
                          .hot_window_ms = 1000,
                          .hot_k = 16,
                          .hot_replica_reads = true,
                          .hot_cache_ms = 1000,
                          .hot_flag_rate = 0.001,
                          .limits = kv_default_limits,
                          .probe_ms = 0,
                          .probe_fails = 2}};
    r->cfg.limits.max_value = 64 << 10;
    char err[256];
    FZ_CHECK(router_core_init(r, err, sizeof(err)) == KV_OK, "router_core_init: %s", err);
    if (flags & 4) {
        FZ_CHECK(router_mit_create(&r->mit, true, r->cfg.hot_cache_ms, r->cfg.hot_flag_rate) ==
                     KV_OK,
                 "router_mit_create");
        FZ_CHECK(hk_window_create(&r->hot, 1, (size_t)r->cfg.hot_k, 1, kv_now_ns()) == KV_OK,
                 "hk_window_create");
    }
    if (flags & 3) {
        cmap *m = fz_test_map(flags & 3);
        FZ_CHECK(cmap_slot_install(r->maps, m) == KV_OK, "install");
        cmap_unref(m);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fz_quiet();
    rpc_runtime_init(0);
    fz_peers_start();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    size_t before = in.n;
    fz_peers_script(&in);
    bool scripted = in.n + 1 < before; /* more than a zero count was read */
    router r;
    setup(&r, flags);
    fz_calls t = {.methods = router_methods,
                  .n = sizeof(router_methods) / sizeof(router_methods[0]),
                  .user = &r,
                  .epoch = router_epoch,
                  .after = rotate,
                  .deadline_ms = 100,
                  .relayed = scripted}; /* a node's reply body is passed on as it is */
    fz_run_calls(&t, &in, MAX_CALLS);
    router_stop(&r);
    return 0;
}
