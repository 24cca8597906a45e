/* SPDX-License-Identifier: MIT */
/*
 * The smart client end to end (issue 15): real kvnode and kvrouter
 * processes on loopback and a kv_client opened with direct. Its requests go
 * straight to each key's primary replica, which coordinates them with the
 * shared replication library: writes reach the key's rf replicas at the
 * requested level (checked on each node's own copy), survive a replica
 * being down (the hint reaches it once it is back), follow a membership
 * change, and go to the routers while the map is unknown.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "harness.h"
#include "kv/kv.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"

static kvt_cluster cl;

static kv_client *client(const char *url, bool direct)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = 5000, .direct = direct};
    cr_assert_eq(kv_client_open(&c, url, &o), KV_OK, "%s", kv_last_error());
    return c;
}

static void start(int nodes, int rf)
{
    static const char *const quiet[] = {"--cleanup-delay", "-1", NULL};
    kvt_node_extra = quiet;
    kv_err rv = kvt_cluster_start(&cl, nodes, rf, NULL);
    cr_assert_eq(rv, KV_OK, "cluster start: %s (logs in %s)", kv_err_name(rv), cl.dir);
}

/* A statistic of url (admin.Stats, verbose), -1 when missing. */
static long stat_of(const char *url, const char *name)
{
    char v[KVT_STAT_LEN];
    return kvt_stat(url, NULL, NULL, name, v) == KV_OK ? strtol(v, NULL, 10) : -1;
}

static long coordinated(void)
{
    long sum = 0;
    for (int i = 0; i < cl.nnodes; i++)
        if (cl.node_pid[i])
            sum += stat_of(cl.node_url[i], "coord.requests");
    return sum;
}

/* Writes until the client's requests reach a node as coordinate calls: the
 * client has learned the map. */
static void wait_direct(kv_client *c)
{
    long before = coordinated();
    for (int i = 0; i < 100 && coordinated() == before; i++) {
        cr_assert_eq(kv_put(c, "warm", 4, "w", 1, NULL, NULL), KV_OK, "%s", kv_last_error());
        usleep(50000);
    }
    cr_assert_gt(coordinated(), before, "the direct client never sent to a node");
}

/* The version node url holds for key (its own copy: a plain call is served
 * by the node as one replica), 0 when it has none. */
static uint64_t version_on(const char *url, const char *key)
{
    kv_client *c = client(url, false);
    kv_value v;
    uint64_t ver = 0;
    if (kv_get_ex(c, key, strlen(key), KV_CONSISTENCY_ONE, &v) == KV_OK) {
        ver = v.version;
        kv_value_free(&v);
    }
    kv_client_close(c);
    return ver;
}

static int copies(const char *key, uint64_t version)
{
    int n = 0;
    for (int i = 0; i < cl.nnodes; i++)
        n += cl.node_pid[i] && version_on(cl.node_url[i], key) == version;
    return n;
}

Test(direct, writes_reach_rf_replicas_at_the_level, .timeout = 300)
{
    start(3, 3);
    kv_client *c = client(cl.router_url, true);
    wait_direct(c);
    long routed = stat_of(cl.router_url, "requests");
    static const kv_consistency levels[] = {KV_CONSISTENCY_ONE, KV_CONSISTENCY_QUORUM,
                                            KV_CONSISTENCY_ALL};
    static const int at_once[] = {1, 2, 3};
    for (int l = 0; l < 3; l++) {
        for (int k = 0; k < 20; k++) {
            char key[32];
            snprintf(key, sizeof(key), "lvl%d-%d", l, k);
            kv_put_opts po = {.consistency = levels[l]};
            uint64_t ver = 0;
            cr_assert_eq(kv_put(c, key, strlen(key), key, strlen(key), &po, &ver), KV_OK, "%s: %s",
                         key, kv_last_error());
            cr_assert_gt(ver, 0, "the coordinating node gives the version");
            cr_expect_geq(copies(key, ver), at_once[l], "%s: fewer copies than its level", key);
            for (int w = 0; w < 50 && copies(key, ver) < 3; w++)
                usleep(20000);
            cr_expect_eq(copies(key, ver), 3, "%s did not reach its 3 replicas", key);
            kv_value v;
            cr_assert_eq(kv_get_ex(c, key, strlen(key), KV_CONSISTENCY_QUORUM, &v), KV_OK);
            cr_expect(v.len == strlen(key) && memcmp(v.data, key, v.len) == 0 && v.version == ver);
            kv_value_free(&v);
        }
    }
    kv_op ops[8];
    char keys[8][16];
    for (int i = 0; i < 8; i++) {
        snprintf(keys[i], sizeof(keys[i]), "lvl%d-%d", i % 3, i);
        ops[i] = (kv_op){.type = KV_OP_GET, .key = keys[i], .klen = strlen(keys[i])};
    }
    cr_assert_eq(kv_batch(c, ops, 8, KV_CONSISTENCY_QUORUM), KV_OK, "%s", kv_last_error());
    for (int i = 0; i < 8; i++)
        cr_expect(ops[i].status == KV_OK && ops[i].found, "batch op %d", i);
    kv_batch_free(ops, 8);
    cr_expect_eq(stat_of(cl.router_url, "requests"), routed, "requests went through the router");
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}

static long nodes_stat(const char *name)
{
    long sum = 0;
    for (int i = 0; i < cl.nnodes; i++)
        if (cl.node_pid[i])
            sum += stat_of(cl.node_url[i], name);
    return sum;
}

/* Writes n keys "pfx-i" (value: the key and round) through c at ALL. */
static void write_keys(kv_client *c, const char *pfx, int n, int round)
{
    for (int i = 0; i < n; i++) {
        char key[32], val[48];
        snprintf(key, sizeof(key), "%s-%d", pfx, i);
        snprintf(val, sizeof(val), "%s-r%d", key, round);
        kv_put_opts po = {.consistency = KV_CONSISTENCY_ALL};
        cr_assert_eq(kv_put(c, key, strlen(key), val, strlen(val), &po, NULL), KV_OK, "%s: %s", key,
                     kv_last_error());
    }
}

/* Every replica holds round's value of each key. */
static void check_keys(const char *pfx, int n, int round)
{
    for (int node = 0; node < cl.nnodes; node++) {
        kv_client *c = client(cl.node_url[node], false);
        for (int i = 0; i < n; i++) {
            char key[32], val[48];
            snprintf(key, sizeof(key), "%s-%d", pfx, i);
            snprintf(val, sizeof(val), "%s-r%d", key, round);
            kv_value v;
            cr_assert_eq(kv_get_ex(c, key, strlen(key), KV_CONSISTENCY_ONE, &v), KV_OK);
            cr_assert(v.len == strlen(val) && memcmp(v.data, val, v.len) == 0,
                      "node %d: %s is not %s", node + 1, key, val);
            kv_value_free(&v);
        }
        kv_client_close(c);
    }
}

/* A coordinating node takes a smart client's writes without a waiting
 * worker (rpc.async): its own replica is written on the receiving thread
 * when the record is in memory or the put needs no lookup (its version is
 * above every stored one, as the node's own versions are); a write that
 * needs a record not in memory (a delete of a key never written: it may be
 * in the LSM) hands the rest to a worker (rpc.async_handoffs). Either way
 * every replica gets the write. */
Test(direct, coordinated_writes_complete_asynchronously, .timeout = 300)
{
    start(3, 3);
    kv_client *c = client(cl.router_url, true);
    wait_direct(c);
    long async0 = nodes_stat("rpc.async"), hand0 = nodes_stat("rpc.async_handoffs");
    cr_assert(async0 >= 0 && hand0 >= 0, "the nodes report rpc.async and rpc.async_handoffs");
    write_keys(c, "async", 100, 1); /* new keys */
    long async1 = nodes_stat("rpc.async"), hand1 = nodes_stat("rpc.async_handoffs");
    cr_assert_geq(async1 - async0, 100, "new keys' writes were asynchronous calls");
    cr_assert_lt(hand1 - hand0, 10, "new keys' puts need no lookup (%ld of %ld handed off)",
                 hand1 - hand0, async1 - async0);
    check_keys("async", 100, 1);
    for (int i = 0; i < 100; i++) {
        char key[32];
        snprintf(key, sizeof(key), "never-%d", i);
        kv_delete_opts dopt = {.consistency = KV_CONSISTENCY_ALL};
        bool existed = true;
        cr_assert_eq(kv_delete(c, key, strlen(key), &dopt, &existed), KV_OK, "%s: %s", key,
                     kv_last_error());
        cr_assert_not(existed, "%s was never written", key);
    }
    long hand_d = nodes_stat("rpc.async_handoffs");
    cr_assert_geq(hand_d - hand1, 100, "a delete of a key not in memory went to a worker");
    hand1 = hand_d;
    async1 = nodes_stat("rpc.async");
    write_keys(c, "async", 100, 2); /* the records are in memory now */
    long async2 = nodes_stat("rpc.async"), hand2 = nodes_stat("rpc.async_handoffs");
    cr_assert_geq(async2 - async1, 100, "overwrites were asynchronous calls");
    cr_assert_lt(hand2 - hand1, 10, "overwrites finished without a worker (%ld of %ld handed off)",
                 hand2 - hand1, async2 - async1);
    check_keys("async", 100, 2);
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}

Test(direct, survives_a_replica_down, .timeout = 300)
{
    start(3, 3);
    kv_client *c = client(cl.router_url, true);
    wait_direct(c);
    kvt_kill_node(&cl, 1, SIGKILL);
    usleep(300000); /* the peers' connections to n2 are gone */
    uint64_t ver[60];
    for (int k = 0; k < 60; k++) {
        char key[32];
        snprintf(key, sizeof(key), "down-%d", k);
        kv_put_opts po = {.consistency = KV_CONSISTENCY_QUORUM};
        cr_assert_eq(kv_put(c, key, strlen(key), "v", 1, &po, &ver[k]), KV_OK, "%s: %s", key,
                     kv_last_error());
        kv_value v;
        cr_assert_eq(kv_get_ex(c, key, strlen(key), KV_CONSISTENCY_QUORUM, &v), KV_OK, "%s: %s",
                     key, kv_last_error());
        kv_value_free(&v);
    }
    kv_put_opts all = {.consistency = KV_CONSISTENCY_ALL};
    cr_expect_eq(kv_put(c, "all", 3, "v", 1, &all, NULL), KV_UNAVAILABLE,
                 "ALL cannot be met with a replica down");
    cr_assert_eq(kvt_node_restart(&cl, 1), KV_OK, "restart n2");
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__SERVING, 60000), "n2 caught up");
    int missing = 0;
    for (int k = 0; k < 60; k++) {
        char key[32];
        snprintf(key, sizeof(key), "down-%d", k);
        missing += version_on(cl.node_url[1], key) != ver[k];
    }
    cr_expect_eq(missing, 0, "%d writes made while n2 was down did not reach it", missing);
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}

/* n4's copy of every key it replicates in the map of node url. */
static int missing_on_n4(const char *url, int from, int to)
{
    kv_client *m = client(url, false);
    rpc_chan *ch;
    rpc_chan_opts o = {0};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply r;
    cr_assert_eq(rpc_call(ch, "admin.GetMap", 0, &req.base, 5000, &r), KV_OK);
    Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, r.len, r.body);
    cmap *map = NULL;
    cr_assert(g && g->has_map && cmap_from_pb(g->map, &map, NULL, 0) == KV_OK);
    kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    kv_client_close(m);
    int n4 = cmap_find(map, "n4"), missing = 0;
    cr_assert_geq(n4, 0, "n4 is in the map");
    for (int k = from; k < to; k++) {
        char key[32];
        snprintf(key, sizeof(key), "mc-%d", k);
        if (cmap_holds(map, (size_t)n4, key, strlen(key)))
            missing += version_on(cl.node_url[3], key) == 0;
    }
    cmap_unref(map);
    return missing;
}

Test(direct, follows_a_map_change, .timeout = 600)
{
    start(3, 2);
    kv_client *c = client(cl.router_url, true);
    wait_direct(c);
    for (int k = 0; k < 200; k++) {
        char key[32];
        snprintf(key, sizeof(key), "mc-%d", k);
        cr_assert_eq(kv_put(c, key, strlen(key), key, strlen(key), NULL, NULL), KV_OK);
    }
    cr_assert_eq(kvt_node_restart(&cl, 3), KV_OK, "start n4");
    char out[8192], args[256];
    snprintf(args, sizeof(args), "node add n4=%s", cl.node_url[3]);
    int rc = kvt_kvctl(&cl, args, out, sizeof(out));
    cr_assert_eq(rc, 0, "kvctl node add: %d %s", rc, out);
    usleep(4000000); /* the client's periodic refresh (3 s) */
    long before = stat_of(cl.node_url[3], "coord.requests");
    for (int k = 200; k < 400; k++) {
        char key[32];
        snprintf(key, sizeof(key), "mc-%d", k);
        cr_assert_eq(kv_put(c, key, strlen(key), key, strlen(key), NULL, NULL), KV_OK, "%s: %s",
                     key, kv_last_error());
    }
    cr_expect_gt(stat_of(cl.node_url[3], "coord.requests"), before,
                 "the client sends to the new node as a primary");
    cr_expect_eq(missing_on_n4(cl.node_url[0], 0, 400), 0, "n4 lacks keys it replicates");
    for (int k = 0; k < 400; k++) {
        char key[32];
        snprintf(key, sizeof(key), "mc-%d", k);
        kv_value v;
        cr_assert_eq(kv_get_ex(c, key, strlen(key), KV_CONSISTENCY_QUORUM, &v), KV_OK, "%s: %s",
                     key, kv_last_error());
        cr_expect(v.len == strlen(key) && memcmp(v.data, key, v.len) == 0);
        kv_value_free(&v);
    }
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}

Test(direct, uses_the_router_while_the_map_is_unknown, .timeout = 300)
{
    start(3, 3);
    long routed = stat_of(cl.router_url, "requests");
    kv_client *c = client(cl.router_url, true);
    /* the map is fetched in the background: the first call goes to the router */
    cr_assert_eq(kv_put(c, "early", 5, "v", 1, NULL, NULL), KV_OK, "%s", kv_last_error());
    cr_expect_gt(stat_of(cl.router_url, "requests"), routed, "the first write used the router");
    kv_client_close(c);
    kvt_cluster_stop(&cl);
    /* a node without a cluster map: no map to learn, every call to it plain */
    char dir[] = "/tmp/kv_direct_test.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", kvt_free_port());
    pid_t pid = kvt_node_start(dir, "solo", url, NULL);
    cr_assert_gt(pid, 0);
    c = client(url, true);
    usleep(500000); /* several refresh attempts */
    cr_assert_eq(kv_put(c, "k", 1, "v", 1, NULL, NULL), KV_OK, "%s", kv_last_error());
    kv_value v;
    cr_assert_eq(kv_get(c, "k", 1, &v), KV_OK, "%s", kv_last_error());
    kv_value_free(&v);
    cr_expect_eq(stat_of(url, "coord.requests"), 0, "a node without a map coordinated");
    kv_client_close(c);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    kvt_forget(pid);
    char cmd[128], out[64];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    kvt_run(cmd, out, sizeof(out));
}

/* A smart client given only a node's address: while it has no map its
 * requests go to that address, still asking to be coordinated, so they
 * reach every replica (they used to go as plain calls, which the node
 * applied as one replica: acknowledged, not replicated). */
Test(direct, a_node_address_alone_gets_coordinated_writes_before_the_map, .timeout = 300)
{
    start(3, 3);
    kv_client *c = client(cl.node_url[0], true);
    for (int k = 0; k < 20; k++) { /* at once: the first ones before the map is known */
        char key[32];
        snprintf(key, sizeof(key), "seed-%d", k);
        uint64_t ver = 0;
        cr_assert_eq(kv_put(c, key, strlen(key), key, strlen(key), NULL, &ver), KV_OK, "%s: %s",
                     key, kv_last_error());
        cr_assert_gt(ver, 0);
        cr_expect_geq(copies(key, ver), 2, "%s: acknowledged by fewer than a quorum", key);
        for (int w = 0; w < 50 && copies(key, ver) < 3; w++)
            usleep(20000);
        cr_expect_eq(copies(key, ver), 3, "%s did not reach its 3 replicas", key);
    }
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}

/* A plain client writing to one node of an rf-3 cluster: the node would
 * store the write on its own replica only, so it refuses it and says
 * where writes go; reads are served (from that replica). */
Test(direct, a_plain_write_to_one_replica_is_refused, .timeout = 300)
{
    start(3, 3);
    kv_client *c = client(cl.node_url[0], false);
    cr_assert_eq(kv_put(c, "plain", 5, "v", 1, NULL, NULL), KV_FAILED_PRECONDITION);
    cr_expect(strstr(kv_last_error(), "without a version") &&
                  strstr(kv_last_error(), "through a router"),
              "%s", kv_last_error());
    cr_expect_eq(copies("plain", 0), 3, "no replica may hold the refused write");
    cr_assert_eq(kv_delete(c, "plain", 5, NULL, NULL), KV_FAILED_PRECONDITION, "%s",
                 kv_last_error());
    kv_op ops[2] = {{.type = KV_OP_PUT, .key = "b1", .klen = 2, .val = "v", .vlen = 1},
                    {.type = KV_OP_GET, .key = "b1", .klen = 2}};
    cr_assert_eq(kv_batch(c, ops, 2, KV_CONSISTENCY_DEFAULT), KV_OK, "%s", kv_last_error());
    cr_expect_eq(ops[0].status, KV_FAILED_PRECONDITION, "the batch's write was applied");
    cr_expect(ops[1].status == KV_OK && !ops[1].found);
    kv_batch_free(ops, 2);
    kv_value v;
    cr_expect_eq(kv_get(c, "plain", 5, &v), KV_NOT_FOUND, "%s", kv_last_error());
    /* the same write through the router, or coordinated, is replicated */
    kv_client *r = client(cl.router_url, false);
    uint64_t ver = 0;
    cr_assert_eq(kv_put(r, "plain", 5, "v", 1, NULL, &ver), KV_OK, "%s", kv_last_error());
    for (int w = 0; w < 50 && copies("plain", ver) < 3; w++)
        usleep(20000);
    cr_expect_eq(copies("plain", ver), 3);
    kv_client_close(r);
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}

/* Reads at ONE that the primary answers alone from memory are served on
 * the receiving thread (rpc_method.inline_coordinate): same answers as the
 * full path, counted as coordinated requests; a level above ONE still
 * takes the replication library (and reaches another replica). */
Test(direct, reads_the_primary_answers_alone_are_served_inline, .timeout = 300)
{
    start(3, 3);
    kv_client *r = client(cl.router_url, false);
    uint64_t vers[20];
    for (int k = 0; k < 20; k++) {
        char key[32];
        snprintf(key, sizeof(key), "in-%d", k);
        cr_assert_eq(kv_put(r, key, strlen(key), key, strlen(key), NULL, &vers[k]), KV_OK);
    }
    kv_client *c = client(cl.router_url, true);
    wait_direct(c);
    long req0 = coordinated(), inl0 = nodes_stat("rpc.inline");
    for (int k = 0; k < 20; k++) {
        char key[32];
        snprintf(key, sizeof(key), "in-%d", k);
        kv_value v;
        cr_assert_eq(kv_get_ex(c, key, strlen(key), KV_CONSISTENCY_ONE, &v), KV_OK, "%s",
                     kv_last_error());
        cr_expect(v.len == strlen(key) && memcmp(v.data, key, v.len) == 0 && v.version == vers[k],
                  "%s", key);
        kv_value_free(&v);
    }
    cr_expect_eq(kv_get_ex(c, "in-none", 7, KV_CONSISTENCY_ONE, &(kv_value){0}), KV_NOT_FOUND);
    long req1 = coordinated(), inl1 = nodes_stat("rpc.inline");
    cr_expect_geq(req1 - req0, 21, "every read was coordinated by a node");
    /* every read found in memory is served inline: these nodes have no
     * HotRAP tracker whose run write would make engine_get_mem decline a
     * sampled read (before, 1 in 16 went to a worker: all 20 in 27 % of runs) */
    cr_expect_geq(inl1 - inl0, 20, "the reads found in memory were not all served inline (%ld)",
                  inl1 - inl0);
    /* QUORUM: not the primary's alone, so the replication library asks two */
    long fw0 = nodes_stat("coord.forwards");
    kv_value v;
    cr_assert_eq(kv_get_ex(c, "in-0", 4, KV_CONSISTENCY_QUORUM, &v), KV_OK, "%s", kv_last_error());
    cr_expect(v.version == vers[0]);
    kv_value_free(&v);
    cr_expect_geq(nodes_stat("coord.forwards") - fw0, 2, "a QUORUM read asked one replica");
    kv_client_close(c);
    kv_client_close(r);
    kvt_cluster_stop(&cl);
}
