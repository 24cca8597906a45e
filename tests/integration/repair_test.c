/* SPDX-License-Identifier: MIT */
/*
 * Self-healing replicas end to end (issue 14): real processes on loopback.
 * A node killed under QUORUM writes catches up from its peers' hints; one
 * down past the hint window, or whose hints overflowed, or whose data was
 * wiped, is rebuilt by kvctl repair; deletes stay deleted; a read that sees
 * a stale replica repairs it. Every check reads the node itself, at ONE,
 * and counts what is stale or missing: the answer must be zero.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "harness.h"
#include "load.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/clustermap.h"

static kvt_cluster cl;
static kvt_load ld;

static void start(int nodes, int rf, const char *const *extra)
{
    kvt_node_extra = extra;
    kv_err rv = kvt_cluster_start(&cl, nodes, rf, NULL);
    cr_assert_eq(rv, KV_OK, "cluster start: %s (logs in %s)", kv_err_name(rv), cl.dir);
}

static void load_init(int keys, int writers)
{
    kvt_load_opts o = {.url = cl.router_url,
                       .nkeys = keys,
                       .writers = writers,
                       .wcons = KV_CONSISTENCY_QUORUM,
                       .rcons = KV_CONSISTENCY_QUORUM};
    kv_err rv = kvt_load_init(&ld, &o);
    cr_assert_eq(rv, KV_OK, "initial load: %s", ld.first_error);
}

static void sleep_ms(int ms)
{
    usleep((useconds_t)ms * 1000u);
}

/* Writes for total_ms; node i is SIGKILLed at down_ms and restarted at
 * up_ms. No write may fail (QUORUM of 3 with one node down). */
static void writes_with_outage(int i, int down_ms, int up_ms, int total_ms)
{
    cr_assert_eq(kvt_load_start(&ld), KV_OK);
    sleep_ms(down_ms);
    kvt_kill_node(&cl, i, SIGKILL);
    sleep_ms(up_ms - down_ms);
    cr_assert_eq(kvt_node_restart(&cl, i), KV_OK, "restart n%d", i + 1);
    sleep_ms(total_ms - up_ms);
    kvt_load_stop(&ld);
    cr_expect_eq(ld.write_errors, 0, "%llu writes failed, first: %s",
                 (unsigned long long)ld.write_errors, ld.first_error);
    cr_expect_gt(ld.writes, 100, "the load ran");
}

typedef struct holder {
    cmap *m;
    int node;
} holder;

static bool held(void *arg, const char *key, size_t len)
{
    holder *h = arg;
    return cmap_holds(h->m, (size_t)h->node, key, len);
}

static cmap *map_of(const char *url)
{
    rpc_chan *ch;
    rpc_chan_opts o = {0};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply r;
    cr_assert_eq(rpc_call(ch, "admin.GetMap", 0, &req.base, 5000, &r), KV_OK);
    Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, r.len, r.body);
    cmap *m = NULL;
    cr_assert(g && g->has_map && cmap_from_pb(g->map, &m, NULL, 0) == KV_OK);
    kv__get_map_reply__free_unpacked(g, NULL);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    return m;
}

/* Every acknowledged key node i replicates, read straight from it: none
 * stale. */
static void expect_node_current(int i)
{
    uint64_t stale = 0, errors = 0;
    char id[16];
    snprintf(id, sizeof(id), "n%d", i + 1);
    holder h = {map_of(cl.node_url[i]), 0};
    h.node = cmap_find(h.m, id);
    cr_assert_geq(h.node, 0);
    kvt_load_verify_some(&ld, cl.node_url[i], KV_CONSISTENCY_ONE, held, &h, &stale, &errors);
    cmap_unref(h.m);
    cr_expect_eq(errors, 0, "%llu reads from n%d failed", (unsigned long long)errors, i + 1);
    cr_expect_eq(stale, 0, "%llu keys on n%d are stale or missing", (unsigned long long)stale,
                 i + 1);
}

/* Hints the other nodes hold for node id. */
static uint64_t hints_for(const char *id, bool *lost)
{
    uint64_t total = 0;
    for (int k = 0; k < cl.nnodes; k++) {
        if (kvt_node_index(&cl, id) == k || !cl.node_pid[k])
            continue;
        rpc_chan *ch;
        rpc_chan_opts o = {0};
        cr_assert_eq(rpc_chan_open(&ch, cl.node_url[k], &o), KV_OK);
        Kv__HintStatusRequest req = KV__HINT_STATUS_REQUEST__INIT;
        req.target = (char *)id;
        rpc_reply r;
        if (rpc_call(ch, "admin.HintStatus", 0, &req.base, 5000, &r) == KV_OK) {
            Kv__HintStatusReply *h = kv__hint_status_reply__unpack(NULL, r.len, r.body);
            for (size_t t = 0; h && t < h->n_targets; t++) {
                total += h->targets[t]->records;
                if (lost)
                    *lost |= h->targets[t]->lost;
            }
            if (h)
                kv__hint_status_reply__free_unpacked(h, NULL);
        }
        rpc_reply_free(&r);
        rpc_chan_close(ch);
    }
    return total;
}

static void repair(const char *args)
{
    char out[8192];
    int rc = kvt_kvctl(&cl, args, out, sizeof(out));
    cr_assert_eq(rc, 0, "kvctl %s: %d\n%s", args, rc, out);
    cr_expect(strstr(out, "repaired") != NULL, "%s", out);
}

Test(repair, hints_bring_a_restarted_node_up_to_date, .timeout = 600)
{
    start(3, 3, NULL);
    load_init(20000, 2);
    writes_with_outage(1, 5000, 20000, 30000);
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__SERVING, 60000),
              "n2 caught up and serves");
    uint64_t left = 1;
    for (int t = 0; t < 300 && (left = hints_for("n2", NULL)) > 0; t++)
        sleep_ms(100);
    cr_expect_eq(left, 0, "hints for n2 drained");
    expect_node_current(1);
    kvt_load_free(&ld);
    kvt_cluster_stop(&cl);
}

/* Reads through a smart client while n2 needs its repair. n2 is still the
 * primary of a third of the keys, and the client sends those reads to it.
 * It must not answer them from its own copy, also not on the receive
 * thread's fast path (node_coord_get_inline, which reuses the
 * coordinator's map for its own replica's read): they go to a replica that
 * has the writes. None stale, none failed. */
static void expect_direct_reads_current_while_n2_is_behind(void)
{
    /* the premise: n2's own copy is behind (a plain read of a node is
     * served by it as one replica, whatever its state) */
    uint64_t own_stale = 0, own_errors = 0, stale = 0, errors = 0;
    holder h = {map_of(cl.node_url[0]), 0};
    h.node = cmap_find(h.m, "n2");
    cr_assert_geq(h.node, 0);
    kvt_load_verify_some(&ld, cl.node_url[1], KV_CONSISTENCY_ONE, held, &h, &own_stale,
                         &own_errors);
    cmap_unref(h.m);
    cr_assert_gt(own_stale, 0, "n2 missed no write: the direct reads prove nothing");
    cr_log_info("n2's own copy: %llu of %d keys stale", (unsigned long long)own_stale, ld.o.nkeys);
    kv_err rv = kvt_load_verify_direct(&ld, cl.router_url, KV_CONSISTENCY_ONE, &stale, &errors);
    cr_expect_eq(errors, 0, "%llu direct reads failed (%s)", (unsigned long long)errors,
                 kv_err_name(rv));
    cr_expect_eq(stale, 0, "%llu direct reads were stale (n2 itself has %llu stale keys)",
                 (unsigned long long)stale, (unsigned long long)own_stale);
}

Test(repair, a_node_down_past_the_hint_window_is_repaired, .timeout = 600)
{
    static const char *const extra[] = {"--hint-window", "2", NULL};
    start(3, 3, extra);
    load_init(20000, 2);
    writes_with_outage(1, 2000, 12000, 15000);
    cr_assert(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__NEEDS_REPAIR, 30000),
              "n2 knows it missed writes (peers dropped hints for it)");
    expect_direct_reads_current_while_n2_is_behind();
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__NEEDS_REPAIR, 10000),
              "n2 still needs its repair"); /* (nothing changes it before the repair) */
    repair("repair n2");
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__SERVING, 10000),
              "n2 serves after the repair");
    expect_node_current(1);
    kvt_load_free(&ld);
    kvt_cluster_stop(&cl);
}

Test(repair, a_wiped_node_is_rebuilt, .timeout = 600)
{
    start(3, 2, NULL);
    load_init(30000, 1);
    kvt_kill_node(&cl, 1, SIGKILL);
    kvt_node_wipe(&cl, 1);
    cr_assert_eq(kvt_node_restart(&cl, 1), KV_OK);
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__NO_MAP, 5000),
              "a wiped node has no map and does not serve");
    repair("repair n2");
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__SERVING, 10000));
    /* n2 holds exactly the keys it replicates */
    cmap *m = map_of(cl.node_url[0]);
    uint64_t want = 0, live = 0;
    char key[16];
    for (int k = 0; k < 30000; k++) {
        size_t len = (size_t)snprintf(key, sizeof(key), "k%08d", k);
        want += cmap_holds(m, (size_t)cmap_find(m, "n2"), key, len);
    }
    cr_assert_eq(kvt_node_count(cl.node_url[1], NULL, &live, NULL), KV_OK);
    cr_expect_eq(live, want, "n2 holds %llu keys, replicates %llu", (unsigned long long)live,
                 (unsigned long long)want);
    uint64_t sum = live;
    for (int k = 0; k < 3; k += 2) {
        cr_assert_eq(kvt_node_count(cl.node_url[k], NULL, &live, NULL), KV_OK);
        sum += live;
    }
    cr_expect_eq(sum, 2u * 30000u, "every key has rf copies");
    cmap_unref(m);
    expect_node_current(1);
    kvt_load_free(&ld);
    kvt_cluster_stop(&cl);
}

/* Deletes keys [from, to) through the router at QUORUM. */
static void delete_range(int from, int to)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = 10000};
    cr_assert_eq(kv_client_open(&c, cl.router_url, &o), KV_OK);
    char key[16];
    for (int k = from; k < to; k++) {
        size_t len = (size_t)snprintf(key, sizeof(key), "k%08d", k);
        kv_delete_opts d = {.consistency = KV_CONSISTENCY_QUORUM};
        kv_err rv = kv_delete(c, key, len, &d, NULL);
        cr_assert_eq(rv, KV_OK, "delete %s: %s", key, kv_err_name(rv));
        atomic_store(&ld.acked[k], 0);
    }
    kv_client_close(c);
}

/* Keys [from, to) read straight from node i: none may be found. */
static void expect_deleted(int i, int from, int to)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = 10000};
    cr_assert_eq(kv_client_open(&c, cl.node_url[i], &o), KV_OK);
    char key[16];
    int found = 0;
    for (int k = from; k < to; k++) {
        size_t len = (size_t)snprintf(key, sizeof(key), "k%08d", k);
        kv_value v;
        if (kv_get(c, key, len, &v) == KV_OK) {
            found++;
            kv_value_free(&v);
        }
    }
    cr_expect_eq(found, 0, "%d deleted keys came back on n%d", found, i + 1);
    kv_client_close(c);
}

Test(repair, deleted_keys_stay_deleted, .timeout = 600)
{
    static const char *const extra[] = {"--hint-window", "1", NULL};
    start(3, 3, extra);
    load_init(5000, 1);
    delete_range(4000, 4100); /* every replica up */
    kvt_kill_node(&cl, 2, SIGKILL);
    sleep_ms(1500);        /* the routers see n3 down */
    delete_range(0, 2500); /* n3 misses these; their hints expire */
    sleep_ms(2500);
    cr_assert_eq(kvt_node_restart(&cl, 2), KV_OK);
    cr_expect(kvt_wait_serving(cl.node_url[2], NULL, KV__SERVING__NEEDS_REPAIR, 30000));
    repair("repair");
    for (int i = 0; i < 3; i++) {
        expect_deleted(i, 0, 2500);
        expect_deleted(i, 4000, 4100);
        expect_node_current(i);
    }
    kvt_load_free(&ld);
    kvt_cluster_stop(&cl);
}

/* admin.Apply of one versioned record to node url. */
static void apply(const char *url, const char *key, const char *val, uint64_t version)
{
    rpc_chan *ch;
    rpc_chan_opts o = {0};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    Kv__Record rec = KV__RECORD__INIT, *rp = &rec;
    rec.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
    rec.value = (ProtobufCBinaryData){strlen(val), (uint8_t *)val};
    rec.version = version;
    Kv__ApplyRequest req = KV__APPLY_REQUEST__INIT;
    req.n_records = 1;
    req.records = &rp;
    rpc_reply r;
    cr_assert_eq(rpc_call(ch, "admin.Apply", 0, &req.base, 5000, &r), KV_OK, "%s", r.message);
    rpc_reply_free(&r);
    rpc_chan_close(ch);
}

static uint64_t version_on(const char *url, const char *key)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = 5000};
    cr_assert_eq(kv_client_open(&c, url, &o), KV_OK);
    kv_value v;
    uint64_t ver = 0;
    if (kv_get(c, key, strlen(key), &v) == KV_OK) {
        ver = v.version;
        kv_value_free(&v);
    }
    kv_client_close(c);
    return ver;
}

Test(repair, a_read_repairs_a_stale_replica, .timeout = 300)
{
    start(3, 3, NULL);
    cmap *m = map_of(cl.node_url[0]);
    uint32_t idx[3];
    cr_assert_eq(cmap_replicas(m, "rr-key", 6, idx), 3);
    const char *p = cl.node_url[kvt_node_index(&cl, cmap_node_at(m, idx[0])->id)];
    const char *s = cl.node_url[kvt_node_index(&cl, cmap_node_at(m, idx[1])->id)];
    const char *t = cl.node_url[kvt_node_index(&cl, cmap_node_at(m, idx[2])->id)];
    uint64_t v1 = kv_wall_ms() << 16, v2 = v1 + 5;
    apply(p, "rr-key", "old", v1);
    apply(s, "rr-key", "old", v1);
    apply(t, "rr-key", "old", v1);
    apply(p, "rr-key", "new", v2); /* the second replica stays stale */
    apply(t, "rr-key", "new", v2);
    cr_assert_eq(version_on(s, "rr-key"), v1);
    kv_client *c = NULL;
    kv_client_opts co = {.timeout_ms = 5000};
    cr_assert_eq(kv_client_open(&c, cl.router_url, &co), KV_OK);
    kv_value v;
    cr_assert_eq(kv_get_ex(c, "rr-key", 6, KV_CONSISTENCY_QUORUM, &v), KV_OK);
    cr_expect_eq(v.version, v2, "a QUORUM read returns the newest version");
    cr_expect(v.len == 3 && memcmp(v.data, "new", 3) == 0);
    kv_value_free(&v);
    uint64_t now = 0;
    for (int i = 0; i < 300 && (now = version_on(s, "rr-key")) != v2; i++) /* up to 30 s */
        sleep_ms(100);
    cr_expect_eq(now, v2, "the stale replica converged");
    char rr[KVT_STAT_LEN];
    cr_assert_eq(kvt_stat(cl.router_url, NULL, NULL, "read_repairs", rr), KV_OK);
    long repairs = atol(rr);
    cr_expect_geq(repairs, 1, "the router counts its read repairs (%ld)", repairs);
    kv_client_close(c);
    cmap_unref(m);
    kvt_cluster_stop(&cl);
}

Test(repair, full_hint_storage_is_reported_and_repaired, .timeout = 600)
{
    static const char *const extra[] = {"--hints-max-mb", "1", NULL};
    start(3, 3, extra);
    load_init(30000, 1);
    kvt_kill_node(&cl, 1, SIGKILL);
    sleep_ms(1500);
    ld.o.writers = 2;
    cr_assert_eq(kvt_load_start(&ld), KV_OK);
    bool lost = false; /* write until the peers' hint storage overflows (at most 90 s) */
    for (int s = 0; s < 90 && !lost; s++) {
        sleep_ms(1000);
        hints_for("n2", &lost);
    }
    sleep_ms(2000); /* and a little beyond */
    kvt_load_stop(&ld);
    cr_expect_eq(ld.write_errors, 0, "writes succeed at QUORUM: %s", ld.first_error);
    hints_for("n2", &lost);
    cr_expect(lost, "the overflow is reported (hints for n2 marked lost)");
    char out[16384];
    /* n2 is down: status exits 3 (a node did not answer) and still prints */
    cr_assert_eq(kvt_kvctl(&cl, "status --verbose", out, sizeof(out)), 3, "%s", out);
    cr_expect(strstr(out, "hints.n2.needs_repair        1") != NULL, "status shows it: %s", out);
    cr_assert_eq(kvt_node_restart(&cl, 1), KV_OK);
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__NEEDS_REPAIR, 30000));
    repair("repair n2");
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__SERVING, 10000));
    expect_node_current(1);
    lost = false;
    hints_for("n2", &lost);
    cr_expect(!lost, "the repair cleared the marks");
    kvt_load_free(&ld);
    kvt_cluster_stop(&cl);
}

Test(repair, a_node_down_longer_than_the_grace_refuses_to_start, .timeout = 120)
{
    static const char *const extra[] = {"--tombstone-grace", "86400", NULL};
    start(2, 2, extra);
    kvt_kill_node(&cl, 1, SIGTERM);
    char cmd[600], out[4096];
    snprintf(cmd, sizeof(cmd), "echo %llu > %s/n2/ALIVE",
             (unsigned long long)(kv_wall_ms() - 3ull * 86400000ull), cl.dir);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0);
    cr_expect_neq(kvt_node_restart(&cl, 1), KV_OK, "n2 must not start after 3 days down");
    snprintf(cmd, sizeof(cmd), "cat %s/n2.log", cl.dir);
    kvt_run(cmd, out, sizeof(out));
    cr_expect(strstr(out, "longer than --tombstone-grace") != NULL, "%s", out);
    static const char *const force[] = {"--force-stale-start", NULL};
    cl.node_extra[1] = force;
    cr_assert_eq(kvt_node_restart(&cl, 1), KV_OK, "--force-stale-start starts it");
    cr_expect(kvt_wait_serving(cl.node_url[1], NULL, KV__SERVING__NEEDS_REPAIR, 10000),
              "and it needs a repair");
    kvt_cluster_stop(&cl);
}
