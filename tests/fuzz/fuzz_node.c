/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for every kvnode handler, in-process: this file
 * compiles node/server.c itself (its method table and kv.* handlers are
 * file-local; the rest of the node comes from kv_node_fuzz, the node
 * library without server.c), starts a node on a fresh data directory with
 * small limits (and no RPC server), and runs a program of calls from the
 * input (fuzz_rpc.h: method, epoch choice, body) straight into the
 * handlers, checking each reply. The input is [u8 flags][peer script][calls]:
 * flags bit 0 installs a one-node map (id n1, rf 1) before the calls, bit 1
 * a three-node map with a joining fourth node (a transition), bit 2 turns
 * io_uring off; the script (fz_peers_script) makes the peers n2, n3 answer
 * what the node asks them (stream chunks, maps, hint status) with fuzzed
 * replies. The node is stopped and its directory removed after each input,
 * so no state carries over (tens to a hundred inputs a second).
 */
#include "node/server.c"

#include "fuzz_rpc.h"

/* The calls go straight to the handlers: node_start's RPC server is not
 * needed, and closing one costs tens of milliseconds on a loaded machine
 * (this harness links with -Wl,--wrap=rpc_server_open). */
kv_err __wrap_rpc_server_open(rpc_server **out, const rpc_server_opts *opts, char *err,
                              size_t errlen);
kv_err __wrap_rpc_server_open(rpc_server **out, const rpc_server_opts *opts, char *err,
                              size_t errlen)
{
    *out = NULL; /* rpc_server_close(NULL) is a no-op */
    return KV_OK;
}

#define MAX_CALLS 12

static uint64_t node_epoch(void *user)
{
    return cmap_slot_epoch(((node *)user)->maps);
}

static void config(node *n, const char *dir, uint8_t flags)
{
    n->cfg = (node_config){.id = "n1",
                           .listen = "inproc://hotkv-fuzz-node",
                           .data_dir = (char *)dir,
                           .fast_mb = 64,
                           .sync = ENGINE_SYNC_NONE,
                           .sync_ms = 5,
                           .write_buffer_kb = 32,
                           .no_io_uring = flags & 4,
                           .mem_mb = 8,
                           .workers = 1,
                           .hot_threshold = 100,
                           .limits = kv_default_limits,
                           .stream_mbps = 64,
                           .cleanup_delay_s = -1,
                           .map_refresh_ms = 3600 * 1000,
                           .hints_max_mb = 4,
                           .hint_window_s = 3600,
                           .tombstone_grace_s = 0,
                           .catchup_timeout_ms = 50};
    nhc_opts_default(&n->cfg.nhc);
    n->cfg.limits.max_value = 64 << 10;
}

/* Installs a test map through admin.SetMap, as kvctl cluster init does. */
static void install_map(node *n, int which)
{
    cmap *m = fz_test_map(which);
    Kv__ClusterMap *pb = NULL;
    FZ_CHECK(cmap_to_pb(m, &pb) == KV_OK, "cmap_to_pb");
    Kv__SetMapRequest req = KV__SET_MAP_REQUEST__INIT;
    req.map = pb;
    uint8_t buf[4096];
    FZ_CHECK(kv__set_map_request__get_packed_size(&req) <= sizeof(buf), "map too big");
    size_t len = kv__set_map_request__pack(&req, buf);
    rpc_ctx c = {.method = "admin.SetMap", .deadline_ns = kv_now_ns() + 1000000000ull, .user = n};
    kv_err rv = node_h_set_map(&c, buf, len);
    FZ_CHECK(rv == KV_OK, "installing the map: %s", c.message);
    free(c.reply);
    kv__cluster_map__free_unpacked(pb, NULL);
    cmap_unref(m);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fz_quiet();
    rpc_runtime_init(0);
    fz_peers_start();
    engine_thread_register();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    fz_peers_script(&in);
    char dir[512], err[512];
    fz_fresh_dir(dir, sizeof(dir), "node");
    node n = {0};
    config(&n, dir, flags);
    kv_err rv = node_start(&n, err, sizeof(err));
    FZ_CHECK(rv == KV_OK, "node_start: %s", err);
    if (flags & 3)
        install_map(&n, flags & 2 ? FZ_MAP_JOINING : FZ_MAP_ONE);
    fz_calls t = {.methods = node_methods,
                  .n = sizeof(node_methods) / sizeof(node_methods[0]),
                  .user = &n,
                  .epoch = node_epoch,
                  .node = true};
    fz_run_calls(&t, &in, MAX_CALLS);
    node_stop(&n);
    pthread_mutex_destroy(&n.map_mu);
    return 0;
}
