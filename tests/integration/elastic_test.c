/* SPDX-License-Identifier: MIT */
/*
 * Elastic membership end to end (issue 13): real kvnode, kvrouter and kvctl
 * processes on loopback. A checking load (load.h: writes and reads at
 * QUORUM, every acknowledged write remembered) runs while nodes are added,
 * removed and replaced; afterwards every key is read back at QUORUM, each
 * node's share of the keys is checked against the ring, and after cleanup
 * the records over all nodes add up to rf x keys. Also: a joining node and
 * kvctl killed mid-transition, two admins racing, and the refusals.
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
#include "load.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"
#include "shard/cmap_plan.h"

#define KEYS 200000

static kvt_cluster cl;
static kvt_load ld;
static const char *const quiet_nodes[] = {"--cleanup-delay", "-1", NULL};

static void start(int nodes, int rf)
{
    kvt_node_extra = quiet_nodes;
    kv_err rv = kvt_cluster_start(&cl, nodes, rf, NULL);
    cr_assert_eq(rv, KV_OK, "cluster start: %s (logs in %s)", kv_err_name(rv), cl.dir);
}

static void stop(void)
{
    kvt_cluster_stop(&cl);
}

static void load_init(int keys)
{
    kvt_load_opts o = {.url = cl.router_url,
                       .nkeys = keys,
                       .writers = 2,
                       .readers = 2,
                       .wcons = KV_CONSISTENCY_QUORUM,
                       .rcons = KV_CONSISTENCY_QUORUM};
    kv_err rv = kvt_load_init(&ld, &o);
    cr_assert_eq(rv, KV_OK, "initial load: %s", ld.first_error);
}

/* The map node url holds (the test's reference after a change). */
static cmap *map_of(const char *url)
{
    rpc_chan *ch;
    rpc_chan_opts o = kvt_chan_opts(NULL);
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply r;
    cr_assert_eq(rpc_call(ch, "admin.GetMap", 0, &req.base, 5000, &r), KV_OK);
    Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, r.len, r.body);
    cmap *m = NULL;
    if (g && g->has_map)
        cmap_from_pb(g->map, &m, NULL, 0);
    if (g)
        kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    return m;
}

/* Fraction of the ring node id replicates in m. */
static double replica_share(cmap *m, const char *id)
{
    cmap_range *r;
    size_t n;
    cr_assert_eq(cmap_node_ranges(m, (size_t)cmap_find(m, id), false, &r, &n), KV_OK);
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += r[i].lo == r[i].hi ? 1.0 : (double)(r[i].hi - r[i].lo) / 18446744073709551616.0;
    free(r);
    return s;
}

static uint64_t live_on(int i)
{
    uint64_t live = 0, tombs = 0;
    kv_err rv = kvt_node_count(cl.node_url[i], NULL, &live, &tombs);
    cr_assert_eq(rv, KV_OK, "count on n%d: %s", i + 1, kv_err_name(rv));
    return live;
}

/* Stops the load and checks it saw no error and no stale read, then reads
 * every key back at QUORUM. */
static void check_load(void)
{
    kvt_load_stop(&ld);
    cr_expect_eq(ld.write_errors + ld.read_errors, 0,
                 "%llu write and %llu read errors during the change, first: %s",
                 (unsigned long long)ld.write_errors, (unsigned long long)ld.read_errors,
                 ld.first_error);
    cr_expect_eq(ld.stale, 0, "%llu reads returned less than an acknowledged write",
                 (unsigned long long)ld.stale);
    cr_expect_gt(ld.writes, 100, "the load ran (%llu writes)", (unsigned long long)ld.writes);
    uint64_t stale = 0, errors = 0;
    kvt_load_verify(&ld, cl.router_url, KV_CONSISTENCY_QUORUM, &stale, &errors);
    cr_expect_eq(stale + errors, 0, "after the change: %llu keys stale or missing, %llu errors",
                 (unsigned long long)stale, (unsigned long long)errors);
}

/* node id holds its share of the keys (+-20%), and after cleanup the nodes
 * of the map hold rf x keys records. */
static void check_placement(const char *id, int keys)
{
    cmap *m = map_of(cl.node_url[0][0] ? cl.router_url : cl.router_url);
    cr_assert_not_null(m);
    cr_assert_null(cmap_transition(m), "the change completed");
    if (id) {
        double want = replica_share(m, id) * keys;
        uint64_t got = live_on(kvt_node_index(&cl, id));
        cr_expect(got > want * 0.8 && got < want * 1.2, "%s holds %llu keys, its share is %.0f", id,
                  (unsigned long long)got, want);
    }
    char out[4096], args[64];
    uint64_t sum = 0;
    for (size_t i = 0; i < cmap_node_count(m); i++) {
        snprintf(args, sizeof(args), "node cleanup %s", cmap_node_at(m, i)->id);
        cr_assert_eq(kvt_kvctl(&cl, args, out, sizeof(out)), 0, "%s", out);
        sum += live_on(kvt_node_index(&cl, cmap_node_at(m, i)->id));
    }
    cr_expect_eq(sum, (uint64_t)cmap_rf(m) * (uint64_t)keys, "records after cleanup: %llu",
                 (unsigned long long)sum);
    cmap_unref(m);
}

Test(elastic, add_a_node_under_load, .timeout = 600)
{
    start(3, 2);
    load_init(KEYS);
    cr_assert_eq(kvt_load_start(&ld), KV_OK);
    usleep(500000);
    cr_assert_eq(kvt_node_restart(&cl, 3), KV_OK, "start n4");
    char out[8192], args[256];
    snprintf(args, sizeof(args), "node add n4=%s", cl.node_url[3]);
    int rc = kvt_kvctl(&cl, args, out, sizeof(out));
    cr_assert_eq(rc, 0, "kvctl node add: %d %s", rc, out);
    cr_expect(strstr(out, "add n4 done") != NULL, "%s", out);
    usleep(1000000);
    check_load();
    check_placement("n4", KEYS);
    kvt_load_free(&ld);
    stop();
}

Test(elastic, remove_a_node_under_load, .timeout = 600)
{
    start(4, 2);
    load_init(KEYS);
    cr_assert_eq(kvt_load_start(&ld), KV_OK);
    usleep(500000);
    char out[8192];
    int rc = kvt_kvctl(&cl, "node remove n2", out, sizeof(out));
    cr_assert_eq(rc, 0, "kvctl node remove: %d %s", rc, out);
    usleep(1000000);
    check_load();
    cmap *m = map_of(cl.node_url[0]);
    cr_expect_eq(cmap_find(m, "n2"), -1, "n2 left the map");
    cr_expect_eq(cmap_node_count(m), 3);
    cmap_unref(m);
    check_placement(NULL, KEYS);
    kvt_load_free(&ld);
    stop();
}

Test(elastic, replace_a_dead_node, .timeout = 600)
{
    start(3, 2);
    load_init(KEYS / 4);
    kvt_kill_node(&cl, 1, SIGKILL);
    kvt_node_wipe(&cl, 1);
    cr_assert_eq(kvt_node_restart(&cl, 3), KV_OK, "start n4");
    char out[8192], args[256];
    snprintf(args, sizeof(args), "node replace n2 n4=%s", cl.node_url[3]);
    int rc = kvt_kvctl(&cl, args, out, sizeof(out));
    cr_assert_eq(rc, 0, "kvctl node replace: %d %s", rc, out);
    cmap *m = map_of(cl.node_url[0]);
    cr_assert_eq(cmap_find(m, "n2"), -1);
    cr_expect_str_eq(cmap_node_at(m, (size_t)cmap_find(m, "n4"))->ring_name, "n2");
    uint64_t sum = live_on(0) + live_on(2) + live_on(3);
    cr_expect_eq(sum, 2ull * (KEYS / 4), "every key has rf copies: %llu records",
                 (unsigned long long)sum);
    /* reads at ONE straight from n4 return every key it replicates */
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = 10000};
    cr_assert_eq(kv_client_open(&c, cl.node_url[3], &o), KV_OK);
    uint64_t mine = 0, missing = 0;
    char key[16];
    for (int k = 0; k < KEYS / 4; k++) {
        size_t len = (size_t)snprintf(key, sizeof(key), "k%08d", k);
        if (!cmap_holds(m, (size_t)cmap_find(m, "n4"), key, len))
            continue;
        mine++;
        kv_value v;
        kv_err rv = kv_get(c, key, len, &v);
        if (rv == KV_OK)
            kv_value_free(&v);
        else
            missing++;
    }
    cr_expect_gt(mine, 0);
    cr_expect_eq(missing, 0, "%llu of %llu keys missing on n4", (unsigned long long)missing,
                 (unsigned long long)mine);
    kv_client_close(c);
    cmap_unref(m);
    kvt_load_free(&ld);
    stop();
}

static int wait_pid(pid_t pid)
{
    int st = 0;
    waitpid(pid, &st, 0);
    kvt_forget(pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(elastic, joining_node_and_kvctl_killed_mid_stream, .timeout = 600)
{
    start(3, 2);
    load_init(KEYS);
    cr_assert_eq(kvt_load_start(&ld), KV_OK);
    cr_assert_eq(kvt_node_restart(&cl, 3), KV_OK, "start n4");
    char addarg[128], log[400];
    snprintf(addarg, sizeof(addarg), "n4=%s", cl.node_url[3]);
    snprintf(log, sizeof(log), "%s/kvctl-add.log", cl.dir);
    const char *args[] = {"--stream-mbps", "1", "node", "add", addarg, NULL};
    pid_t k1 = kvt_kvctl_spawn(&cl, args, log);
    /* until kvctl has checked n4 and opened the transition (up to 30 s on a
     * loaded host), then into the streams: 1 MiB/s, ~11 MiB for n4 */
    bool opened = false;
    for (int i = 0; i < 300 && !opened; i++) {
        cmap *m = map_of(cl.node_url[0]);
        opened = m && cmap_transition(m);
        cmap_unref(m);
        if (!opened)
            usleep(100000);
    }
    cr_assert(opened, "kvctl node add did not open the transition in 30 s");
    usleep(1500000);
    kvt_kill_node(&cl, 3, SIGKILL);
    usleep(500000);
    cr_assert_eq(kvt_node_restart(&cl, 3), KV_OK, "restart n4 mid-stream");
    usleep(2000000);
    kill(k1, SIGKILL);
    wait_pid(k1);
    cmap *mid = map_of(cl.node_url[0]);
    cr_assert_not_null(cmap_transition(mid), "the transition is still open after kvctl died");
    cmap_unref(mid);
    const char *rerun[] = {"node", "add", addarg, NULL};
    pid_t k2 = kvt_kvctl_spawn(&cl, rerun, log);
    int rc = wait_pid(k2);
    char out[8192] = "";
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "cat %s", log);
    kvt_run(cmd, out, sizeof(out));
    cr_assert_eq(rc, 0, "rerun of kvctl node add: %d\n%s", rc, out);
    cr_expect(strstr(out, "resuming") != NULL, "the rerun resumed: %s", out);
    check_load();
    check_placement("n4", KEYS);
    kvt_load_free(&ld);
    stop();
}

Test(elastic, two_admins_racing, .timeout = 300)
{
    start(3, 2);
    load_init(KEYS / 20);
    cr_assert_eq(kvt_node_restart(&cl, 3), KV_OK, "start n4");
    cr_assert_eq(kvt_node_restart(&cl, 4), KV_OK, "start n5");
    char a4[128], a5[128], l4[400], l5[400];
    snprintf(a4, sizeof(a4), "n4=%s", cl.node_url[3]);
    snprintf(a5, sizeof(a5), "n5=%s", cl.node_url[4]);
    snprintf(l4, sizeof(l4), "%s/kvctl-n4.log", cl.dir);
    snprintf(l5, sizeof(l5), "%s/kvctl-n5.log", cl.dir);
    const char *x4[] = {"node", "add", a4, NULL}, *x5[] = {"node", "add", a5, NULL};
    pid_t p4 = kvt_kvctl_spawn(&cl, x4, l4), p5 = kvt_kvctl_spawn(&cl, x5, l5);
    int r4 = wait_pid(p4), r5 = wait_pid(p5);
    cr_expect((r4 == 0) != (r5 == 0), "exactly one add wins (exit codes %d and %d)", r4, r5);
    char out[4096] = "", cmd[600];
    snprintf(cmd, sizeof(cmd), "cat %s", r4 ? l4 : l5);
    kvt_run(cmd, out, sizeof(out));
    cr_expect(strstr(out, "FAILED_PRECONDITION") != NULL, "the loser says why: %s", out);
    /* one map per epoch: every member holds the same final map */
    cmap *ref = map_of(cl.node_url[0]);
    uint8_t *rb;
    size_t rl;
    cr_assert_eq(cmap_encode(ref, &rb, &rl), KV_OK);
    for (size_t i = 0; i < cmap_node_count(ref); i++) {
        cmap *m = map_of(cl.node_url[kvt_node_index(&cl, cmap_node_at(ref, i)->id)]);
        uint8_t *b;
        size_t l;
        cr_assert_eq(cmap_encode(m, &b, &l), KV_OK);
        cr_expect(l == rl && memcmp(b, rb, l) == 0, "node %s holds another map at epoch %llu",
                  cmap_node_at(ref, i)->id, (unsigned long long)cmap_epoch(m));
        free(b);
        cmap_unref(m);
    }
    free(rb);
    cr_expect_eq(cmap_node_count(ref), 4);
    cmap_unref(ref);
    kvt_load_free(&ld);
    stop();
}

/* Runs kvctl ARGS, expects a refusal mentioning needle, and no map change. */
static void refused(const char *args, const char *needle)
{
    cmap *before = map_of(cl.node_url[0]);
    char out[4096];
    int rc = kvt_kvctl(&cl, args, out, sizeof(out));
    cr_expect_neq(rc, 0, "kvctl %s should fail", args);
    cr_expect(strstr(out, needle) != NULL, "kvctl %s: want \"%s\" in: %s", args, needle, out);
    cmap *after = map_of(cl.node_url[0]);
    cr_expect_eq(cmap_epoch(after), cmap_epoch(before), "kvctl %s changed the map", args);
    cmap_unref(before);
    cmap_unref(after);
}

Test(elastic, bad_changes_are_refused, .timeout = 300)
{
    start(2, 2);
    char args[256];
    snprintf(args, sizeof(args), "node add n1=tcp://127.0.0.1:%d", kvt_free_port());
    refused(args, "already in the cluster map");
    snprintf(args, sizeof(args), "node add n9=%s", cl.node_url[1]);
    refused(args, "already belongs to a node");
    snprintf(args, sizeof(args), "node add n9=tcp://127.0.0.1:%d", kvt_free_port());
    refused(args, "does not answer");
    refused("node remove n2", "fewer nodes than rf");
    refused("node remove n7", "no node n7");
    refused("node weight n1 0", "out of range");
    refused("node weight n1 5000", "out of range");
    refused("node weight n1 1", "already has that weight");
    refused("node add bad", "want ID=");
    refused("node abort", "no membership change");
    refused("node replace n7 n8=tcp://127.0.0.1:1", "no node n7");
    /* a transition in progress blocks another change */
    cr_assert_eq(kvt_node_restart(&cl, 2), KV_OK, "start n3");
    const char *slow[] = {"--stream-mbps", "1", "--no-wait", "node", "weight", "n1", "3", NULL};
    char log[400];
    snprintf(log, sizeof(log), "%s/kvctl-weight.log", cl.dir);
    kvt_load_opts o = {.url = cl.router_url, .nkeys = 20000, .wcons = KV_CONSISTENCY_QUORUM};
    cr_assert_eq(kvt_load_init(&ld, &o), KV_OK, "%s", ld.first_error);
    pid_t p = kvt_kvctl_spawn(&cl, slow, log);
    cr_expect_eq(wait_pid(p), 0, "weight change started");
    snprintf(args, sizeof(args), "node add n3=%s", cl.node_url[2]);
    refused(args, "in progress");
    char out[4096];
    cr_expect_eq(kvt_kvctl(&cl, "node abort", out, sizeof(out)), 0, "abort: %s", out);
    cmap *m = map_of(cl.node_url[0]);
    cr_expect_null(cmap_transition(m), "rolled back");
    cr_expect_eq(cmap_node_at(m, 0)->weight, 1);
    cmap_unref(m);
    kvt_load_free(&ld);
    stop();
}

Test(elastic, reweight_then_automatic_cleanup, .timeout = 300)
{
    static const char *const fast_cleanup[] = {"--cleanup-delay", "1", NULL};
    kvt_node_extra = fast_cleanup;
    kv_err rv = kvt_cluster_start(&cl, 3, 2, NULL);
    cr_assert_eq(rv, KV_OK, "cluster start: %s (logs in %s)", kv_err_name(rv), cl.dir);
    load_init(KEYS / 10);
    char out[8192];
    int rc = kvt_kvctl(&cl, "node weight n1 3", out, sizeof(out));
    cr_assert_eq(rc, 0, "kvctl node weight: %d %s", rc, out);
    cmap *m = map_of(cl.node_url[0]);
    cr_expect_eq(cmap_node_at(m, (size_t)cmap_find(m, "n1"))->weight, 3);
    double want = replica_share(m, "n1") * (KEYS / 10);
    uint64_t sum = 0;
    for (int t = 0; t < 100; t++) { /* the nodes drop what they lost after 1 s */
        sum = live_on(0) + live_on(1) + live_on(2);
        if (sum == 2ull * (KEYS / 10))
            break;
        usleep(100000);
    }
    cr_expect_eq(sum, 2ull * (KEYS / 10), "records after the automatic cleanup: %llu",
                 (unsigned long long)sum);
    uint64_t got = live_on(0);
    cr_expect(got > want * 0.8 && got < want * 1.2, "n1 holds %llu keys, its share is %.0f",
              (unsigned long long)got, want);
    uint64_t stale = 0, errors = 0;
    kvt_load_verify(&ld, cl.router_url, KV_CONSISTENCY_QUORUM, &stale, &errors);
    cr_expect_eq(stale + errors, 0);
    cmap_unref(m);
    kvt_load_free(&ld);
    stop();
}
