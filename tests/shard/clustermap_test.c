/* SPDX-License-Identifier: MIT */
/* Tests for shard/clustermap.c: encode/decode round trip, every validation
 * error, garbage input, agreement with the ring, spec parsing, references and
 * the map slot. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_err.h"
#include "shard/clustermap.h"
#include "shard/ring.h"

typedef struct test_map {
    Kv__ClusterMap pb;
    Kv__NodeInfo nodes[4];
    Kv__NodeInfo *ptrs[4];
} test_map;

/* A valid 3-node map, rf 2; tests break one field at a time. */
static void good_map(test_map *t)
{
    static const char *ids[] = {"n1", "n2", "n3", "n4"};
    static const char *addrs[] = {"tcp://node1:7001", "tcp://10.0.0.2:7001", "tcp://[::1]:7003",
                                  "tcp://node4:7001"};
    kv__cluster_map__init(&t->pb);
    t->pb.epoch = 7;
    t->pb.rf = 2;
    t->pb.n_nodes = 3;
    t->pb.nodes = t->ptrs;
    for (int i = 0; i < 4; i++) {
        kv__node_info__init(&t->nodes[i]);
        t->nodes[i].id = (char *)ids[i];
        t->nodes[i].addr = (char *)addrs[i];
        t->nodes[i].weight = 1;
        t->ptrs[i] = &t->nodes[i];
    }
}

static void expect_invalid(const test_map *t, const char *needle)
{
    char err[256] = "";
    cmap *m = NULL;
    kv_err rv = cmap_from_pb(&t->pb, &m, err, sizeof err);
    cr_expect_eq(rv, KV_INVALID_ARGUMENT, "want INVALID_ARGUMENT for %s, got %s", needle,
                 kv_err_name(rv));
    cr_expect_null(m);
    cr_expect(strstr(err, needle) != NULL, "error \"%s\" should mention \"%s\"", err, needle);
    if (m != NULL)
        cmap_destroy(m);
}

Test(cmap, encode_decode_round_trip)
{
    test_map t;
    good_map(&t);
    t.nodes[1].weight = 3;
    t.nodes[2].state = KV__NODE_STATE__DOWN;
    cmap *m = NULL, *m2 = NULL;
    char err[256];
    kv_err rv = cmap_from_pb(&t.pb, &m, err, sizeof err);
    cr_assert_eq(rv, KV_OK, "%s: %s", kv_strerror(rv), err);
    uint8_t *buf = NULL;
    size_t len = 0;
    cr_assert_eq(cmap_encode(m, &buf, &len), KV_OK);
    rv = cmap_decode(buf, len, &m2, err, sizeof err);
    cr_assert_eq(rv, KV_OK, "%s: %s", kv_strerror(rv), err);
    cr_expect_eq(cmap_epoch(m2), 7);
    cr_expect_eq(cmap_rf(m2), 2);
    cr_expect_eq(cmap_vnodes(m2), 128);
    cr_assert_eq(cmap_node_count(m2), 3);
    for (size_t i = 0; i < 3; i++) {
        const cmap_node *a = cmap_node_at(m, i), *b = cmap_node_at(m2, i);
        cr_expect_str_eq(a->id, b->id);
        cr_expect_str_eq(a->addr, b->addr);
        cr_expect_eq(a->weight, b->weight);
        cr_expect_eq(a->state, b->state);
    }
    cr_expect_eq(cmap_node_at(m2, 1)->weight, 3);
    cr_expect_eq(cmap_node_at(m2, 2)->state, CMAP_DOWN);
    cr_expect_str_eq(cmap_state_name(CMAP_DOWN), "DOWN");
    free(buf);
    cmap_destroy(m);
    cmap_destroy(m2);
}

Test(cmap, to_pb_frees_with_free_unpacked)
{
    test_map t;
    good_map(&t);
    cmap *m = NULL, *m2 = NULL;
    cr_assert_eq(cmap_from_pb(&t.pb, &m, NULL, 0), KV_OK);
    Kv__ClusterMap *pb = NULL;
    cr_assert_eq(cmap_to_pb(m, &pb), KV_OK);
    cr_expect_eq(pb->vnodes, 128);
    cr_assert_eq(cmap_from_pb(pb, &m2, NULL, 0), KV_OK);
    cr_expect_str_eq(cmap_node_at(m2, 2)->addr, "tcp://[::1]:7003");
    kv__cluster_map__free_unpacked(pb, NULL);
    cmap_destroy(m);
    cmap_destroy(m2);
}

Test(cmap, validation_errors_name_the_problem)
{
    test_map t;
    good_map(&t);
    t.pb.epoch = 0;
    expect_invalid(&t, "epoch");
    good_map(&t);
    t.pb.n_nodes = 0;
    expect_invalid(&t, "no nodes");
    good_map(&t);
    t.pb.rf = 0;
    expect_invalid(&t, "rf 0");
    good_map(&t);
    t.pb.rf = 4;
    expect_invalid(&t, "rf 4");
    good_map(&t);
    t.nodes[1].id = "";
    expect_invalid(&t, "invalid id");
    good_map(&t);
    t.nodes[1].id = "n 2";
    expect_invalid(&t, "invalid id \"n 2\"");
    good_map(&t);
    t.nodes[1].id = "n123456789012345678901234567890123456789012345678901234567890abcd";
    expect_invalid(&t, "invalid id");
    good_map(&t);
    t.nodes[2].id = "n1";
    expect_invalid(&t, "duplicate node id \"n1\"");
    good_map(&t);
    t.nodes[2].addr = "tcp://node1:7001";
    expect_invalid(&t, "duplicate node address");
    good_map(&t);
    const char *bad_addrs[] = {"node1:7001",     "http://node1:7001", "tcp://node1",
                               "tcp://:7001",    "tcp://node1:0",     "tcp://node1:65536",
                               "tcp://node1:7x", "tcp://no de:7001",  "tcp://[]:7001",
                               "tcp://node1:",   "tcp://[::1]7001",   "tcp://a/b:7001"};
    for (size_t i = 0; i < sizeof bad_addrs / sizeof bad_addrs[0]; i++) {
        good_map(&t);
        t.nodes[0].addr = (char *)bad_addrs[i];
        expect_invalid(&t, "node \"n1\": invalid address");
    }
    good_map(&t);
    t.nodes[0].weight = 1001;
    expect_invalid(&t, "weight 1001");
    good_map(&t);
    t.nodes[0].state = (Kv__NodeState)9;
    expect_invalid(&t, "unknown state 9");
    good_map(&t);
    t.pb.vnodes = 5000;
    expect_invalid(&t, "vnodes 5000");
    good_map(&t);
    t.pb.vnodes = 1024;
    t.nodes[0].weight = t.nodes[1].weight = t.nodes[2].weight = 1000;
    expect_invalid(&t, "ring too large");
    char err[64];
    cmap *m = NULL;
    cr_expect_eq(cmap_from_pb(NULL, &m, err, sizeof err), KV_INVALID_ARGUMENT);
}

/* Found by tests/fuzz/fuzz_cmap: a stream id is not validated, and the
 * message naming it went raw into RPC statuses (proto3 strings). */
Test(cmap, stream_ids_in_errors_are_printable)
{
    test_map t;
    good_map(&t);
    t.pb.n_nodes = 4;
    t.nodes[3].state = KV__NODE_STATE__JOINING;
    Kv__StreamPlan sp = KV__STREAM_PLAN__INIT, *spp = &sp;
    Kv__Range *no_range = NULL;
    sp.id = "s\xd1\xfe\x01";
    sp.source = "n1";
    sp.target = "nobody";
    Kv__Transition tr = KV__TRANSITION__INIT;
    tr.n_streams = 1;
    tr.streams = &spp;
    t.pb.transition = &tr;
    for (int pass = 0; pass < 2; pass++) {
        char err[256] = "";
        cmap *m = NULL;
        cr_assert_eq(cmap_from_pb(&t.pb, &m, err, sizeof err), KV_INVALID_ARGUMENT);
        cr_expect(strstr(err, pass ? "missing range" : "unknown source") != NULL, "%s", err);
        for (const char *c = err; *c; c++)
            cr_assert(*c >= 0x20 && *c < 0x7f, "byte 0x%02x in \"%s\"", (unsigned char)*c, err);
        sp.target = "n4"; /* then a range that is missing */
        sp.n_ranges = 1;
        sp.ranges = &no_range;
    }
}

Test(cmap, weight_zero_and_vnodes_zero_default)
{
    test_map t;
    good_map(&t);
    t.nodes[0].weight = 0;
    t.pb.n_nodes = 4;
    t.pb.rf = 4;
    cmap *m = NULL;
    cr_assert_eq(cmap_from_pb(&t.pb, &m, NULL, 0), KV_OK);
    cr_expect_eq(cmap_node_at(m, 0)->weight, 1);
    cr_expect_eq(cmap_vnodes(m), RING_DEFAULT_VNODES);
    cr_expect_eq(ring_point_count(cmap_ring(m)), 4 * RING_DEFAULT_VNODES);
    cmap_destroy(m);
}

Test(cmap, garbage_bytes_are_invalid_argument)
{
    char err[128];
    cmap *m = NULL;
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x22, 0x99, 0x01};
    cr_expect_eq(cmap_decode(junk, sizeof junk, &m, err, sizeof err), KV_INVALID_ARGUMENT);
    cr_expect_eq(cmap_decode(NULL, 0, &m, err, sizeof err), KV_INVALID_ARGUMENT,
                 "empty message has epoch 0");
    cr_expect_null(m);
    /* Random buffers: decode must never crash; whatever it accepts is valid. */
    uint32_t x = 12345;
    uint8_t buf[96];
    for (int round = 0; round < 20000; round++) {
        size_t len = 1 + round % sizeof buf;
        for (size_t i = 0; i < len; i++) {
            x = x * 1103515245u + 12345u;
            buf[i] = (uint8_t)(x >> 16);
        }
        kv_err rv = cmap_decode(buf, len, &m, err, sizeof err);
        cr_assert(rv == KV_OK || rv == KV_INVALID_ARGUMENT, "%s", kv_err_name(rv));
        if (rv == KV_OK) {
            cr_assert_geq(cmap_epoch(m), 1);
            cmap_destroy(m);
            m = NULL;
        }
    }
}

Test(cmap, replicas_agree_with_ring)
{
    test_map t;
    good_map(&t);
    t.pb.n_nodes = 4;
    t.pb.rf = 3;
    t.nodes[3].weight = 2;
    cmap *m = NULL;
    cr_assert_eq(cmap_from_pb(&t.pb, &m, NULL, 0), KV_OK);
    ring_node rn[] = {{"n1", 1}, {"n2", 1}, {"n3", 1}, {"n4", 2}};
    ring *r = NULL;
    cr_assert_eq(ring_create(&r, rn, 4, 0), KV_OK);
    char key[32];
    uint32_t a[3], b[3];
    for (int i = 0; i < 5000; i++) {
        size_t len = (size_t)snprintf(key, sizeof key, "k%d", i);
        cr_assert_eq(cmap_replicas(m, key, len, a), 3);
        cr_assert_eq(ring_replicas(r, key, len, 3, b), 3);
        cr_assert(memcmp(a, b, sizeof a) == 0, "key %s", key);
        cr_assert_eq(cmap_owner(m, key, len), a[0]);
    }
    ring_destroy(r);
    cmap_destroy(m);
}

Test(cmap, find_by_id_and_address)
{
    test_map t;
    good_map(&t);
    cmap *m = NULL;
    cr_assert_eq(cmap_from_pb(&t.pb, &m, NULL, 0), KV_OK);
    cr_expect_eq(cmap_find(m, "n2"), 1);
    cr_expect_eq(cmap_find(m, "n9"), -1);
    cr_expect_eq(cmap_find_addr(m, "tcp://[::1]:7003"), 2);
    cr_expect_eq(cmap_find_addr(m, "tcp://node1:7002"), -1);
    cmap_destroy(m);
}

Test(cmap, parse_spec)
{
    char *specs[] = {"n1=tcp://node1:7001", "n2=tcp://node2:7001@3", "n3=tcp://node3:7001"};
    cmap *m = NULL;
    char err[256] = "";
    kv_err rv = cmap_parse_spec(1, 3, specs, 3, &m, err, sizeof err);
    cr_assert_eq(rv, KV_OK, "%s", err);
    cr_expect_eq(cmap_epoch(m), 1);
    cr_expect_eq(cmap_rf(m), 3);
    cr_expect_str_eq(cmap_node_at(m, 1)->id, "n2");
    cr_expect_str_eq(cmap_node_at(m, 1)->addr, "tcp://node2:7001");
    cr_expect_eq(cmap_node_at(m, 1)->weight, 3);
    cr_expect_eq(cmap_node_at(m, 0)->weight, 1);
    cr_expect_eq(cmap_node_at(m, 2)->state, CMAP_UP);
    cmap_destroy(m);

    struct {
        char *spec;
        unsigned rf;
        const char *needle;
    } bad[] = {
        {"n1", 1, "node spec \"n1\""},
        {"=tcp://a:1", 1, "node spec"},
        {"n1=", 1, "node spec"},
        {"n1=tcp://a:1@", 1, "weight must be"},
        {"n1=tcp://a:1@x", 1, "weight must be"},
        {"n1=tcp://a:1@0", 1, "weight must be"},
        {"n1=tcp://a:1@1001", 1, "weight must be"},
        {"n1=tcp://a:99999", 1, "invalid address"},
        {"n1=tcp://a:1", 2, "rf 2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        m = NULL;
        err[0] = '\0';
        rv = cmap_parse_spec(1, bad[i].rf, &bad[i].spec, 1, &m, err, sizeof err);
        cr_expect_eq(rv, KV_INVALID_ARGUMENT, "%s", bad[i].spec);
        cr_expect(strstr(err, bad[i].needle) != NULL, "\"%s\" → \"%s\"", bad[i].spec, err);
        cr_expect_null(m);
    }
    rv = cmap_parse_spec(1, 1, specs, 0, &m, err, sizeof err);
    cr_expect_eq(rv, KV_INVALID_ARGUMENT);
    cr_expect(strstr(err, "no nodes") != NULL, "%s", err);
}

Test(cmap, references_and_slot)
{
    char *s1[] = {"a=tcp://h:1"};
    cmap *m1 = NULL, *m2 = NULL, *old = NULL;
    cr_assert_eq(cmap_parse_spec(1, 1, s1, 1, &m1, NULL, 0), KV_OK);
    cr_assert_eq(cmap_parse_spec(2, 1, s1, 1, &m2, NULL, 0), KV_OK);
    cmap_slot *slot = NULL;
    cr_assert_eq(cmap_slot_create(&slot), KV_OK);
    cr_expect_null(cmap_slot_get(slot));
    cr_expect_eq(cmap_slot_epoch(slot), 0);
    cr_expect_eq(cmap_slot_install(slot, m1), KV_OK);
    old = cmap_slot_get(slot); /* a reader keeps epoch 1 alive */
    cr_expect_eq(cmap_slot_install(slot, m2), KV_OK);
    cr_expect_eq(cmap_slot_install(slot, m1), KV_FAILED_PRECONDITION);
    cr_expect_eq(cmap_slot_epoch(slot), 2);
    cmap_destroy(m1);
    cmap_destroy(m2);
    cr_expect_eq(cmap_epoch(old), 1); /* still valid: the reader's reference */
    cr_expect_str_eq(cmap_node_at(old, 0)->id, "a");
    cmap_unref(old);
    cmap *cur = cmap_slot_get(slot);
    cr_expect_eq(cmap_epoch(cmap_ref(cur)), 2);
    cmap_unref(cur);
    cmap_unref(cur);
    cmap_slot_destroy(slot);
    cmap_slot_destroy(NULL);
    cmap_destroy(NULL);
}

/* tls+tcp:// addresses are accepted; cmap_vet takes verified maps and only
 * plausible unverified ones (issue 16: an impostor's map). */
Test(cmap, tls_addresses_and_vetting_maps_from_peers)
{
    char *specs[2] = {"n1=tls+tcp://10.0.0.1:7001", "n2=tls+tcp://[::1]:7002"};
    char *bad[1] = {"n1=tls+udp://10.0.0.1:7001"};
    cmap *cur, *m, *jump, *elsewhere;
    char err[256];
    cr_assert_eq(cmap_parse_spec(5, 2, specs, 2, &cur, err, sizeof err), KV_OK, "%s", err);
    cr_assert_eq(cmap_parse_spec(1, 1, bad, 1, &m, err, sizeof err), KV_INVALID_ARGUMENT);
    cr_assert_eq(cmap_parse_spec(6, 2, specs, 2, &m, err, sizeof err), KV_OK, "%s", err);
    cr_assert_eq(cmap_parse_spec(5 + CMAP_MAX_EPOCH_JUMP + 1, 2, specs, 2, &jump, err, sizeof err),
                 KV_OK);
    cr_assert_eq(cmap_parse_spec(6, 1, specs + 1, 1, &elsewhere, err, sizeof err), KV_OK);
    const char *from = "tls+tcp://10.0.0.1:7001";
    cr_assert_eq(cmap_vet(NULL, jump, from, false, NULL, err, sizeof err), KV_OK,
                 "first map: seeds");
    cr_assert_eq(cmap_vet(cur, m, from, false, NULL, err, sizeof err), KV_OK, "%s", err);
    cr_assert_eq(cmap_vet(cur, jump, from, false, NULL, err, sizeof err), KV_PERMISSION_DENIED);
    cr_assert(strstr(err, "over 64"), "%s", err);
    cr_assert_eq(cmap_vet(cur, jump, from, true, NULL, err, sizeof err), KV_OK, "verified");
    cr_assert_eq(cmap_vet(cur, elsewhere, from, false, NULL, err, sizeof err),
                 KV_PERMISSION_DENIED);
    cr_assert(strstr(err, "does not list its sender"), "%s", err);
    cr_assert_eq(cmap_vet(cur, elsewhere, NULL, false, NULL, err, sizeof err), KV_OK,
                 "sender unknown");
    cmap_unref(cur);
    cmap_unref(m);
    cmap_unref(jump);
    cmap_unref(elsewhere);
}

/* A map key: a signed map keeps its signature through every encoding a
 * map goes through (pb, bytes, decode, re-encode, a transition's copy);
 * with a key only maps signed with it pass cmap_vet, whatever else holds. */
Test(cmap, signed_maps_verify_through_every_encoding)
{
    char *specs[3] = {"n1=tcp://10.0.0.1:7001@3", "n2=tcp://10.0.0.2:7002",
                      "n3=tcp://10.0.0.3:7003"};
    const char *key = "0123456789abcdef-cluster-key", *other = "0123456789abcdef-other-key";
    cmap *m, *back, *again, *cur;
    char err[256];
    cr_assert_eq(cmap_parse_spec(7, 2, specs, 3, &m, err, sizeof err), KV_OK, "%s", err);
    cr_assert_eq(cmap_parse_spec(6, 2, specs, 3, &cur, err, sizeof err), KV_OK, "%s", err);
    cr_expect(!cmap_signed(m));
    cr_expect_eq(cmap_check_sig(m, key, err, sizeof err), KV_PERMISSION_DENIED);
    cr_expect(strstr(err, "not signed"), "%s", err);
    Kv__ClusterMap *pb = NULL;
    cr_assert_eq(cmap_to_pb(m, &pb), KV_OK);
    cr_assert_eq(cmap_sign_pb(m, key, pb), KV_OK);
    cr_assert_eq(pb->mac.len, CMAP_MAC_LEN);
    cr_assert_eq(cmap_sign_pb(m, key, pb), KV_OK, "re-signing replaces the mac");
    /* pb -> bytes -> decode -> encode -> decode */
    size_t len = kv__cluster_map__get_packed_size(pb);
    uint8_t *buf = malloc(len);
    kv__cluster_map__pack(pb, buf);
    cr_assert_eq(cmap_decode(buf, len, &back, err, sizeof err), KV_OK, "%s", err);
    free(buf);
    cr_expect(cmap_signed(back));
    cr_expect_eq(cmap_check_sig(back, key, err, sizeof err), KV_OK, "%s", err);
    cr_expect_eq(cmap_check_sig(back, other, err, sizeof err), KV_PERMISSION_DENIED);
    cr_expect(strstr(err, "another map key"), "%s", err);
    cr_assert_eq(cmap_encode(back, &buf, &len), KV_OK);
    cr_assert_eq(cmap_decode(buf, len, &again, err, sizeof err), KV_OK, "%s", err);
    free(buf);
    cr_expect_eq(cmap_check_sig(again, key, err, sizeof err), KV_OK, "%s", err);
    cr_expect(cmap_same(m, again), "the same map, signed or not");
    /* cmap_vet with a key: the signature decides, not TLS or plausibility */
    cr_expect_eq(cmap_vet(cur, again, "tcp://10.0.0.1:7001", false, key, err, sizeof err), KV_OK,
                 "%s", err);
    cr_expect_eq(cmap_vet(cur, m, "tcp://10.0.0.1:7001", true, key, err, sizeof err),
                 KV_PERMISSION_DENIED, "an unsigned map from a verified peer");
    cr_expect_eq(cmap_vet(NULL, m, NULL, false, key, err, sizeof err), KV_PERMISSION_DENIED,
                 "an unsigned first map");
    /* one changed field breaks the signature: epoch, a weight, an address */
    pb->epoch = 8;
    cmap *forged;
    cr_assert_eq(cmap_from_pb(pb, &forged, err, sizeof err), KV_OK, "%s", err);
    cr_expect_eq(cmap_check_sig(forged, key, err, sizeof err), KV_PERMISSION_DENIED, "epoch moved");
    cmap_unref(forged);
    pb->epoch = 7;
    pb->nodes[1]->weight = 5;
    cr_assert_eq(cmap_from_pb(pb, &forged, err, sizeof err), KV_OK, "%s", err);
    cr_expect_eq(cmap_check_sig(forged, key, err, sizeof err), KV_PERMISSION_DENIED, "weight");
    cmap_unref(forged);
    pb->nodes[1]->weight = 1;
    free(pb->nodes[2]->addr);
    pb->nodes[2]->addr = strdup("tcp://10.6.6.6:7003");
    cr_assert_eq(cmap_from_pb(pb, &forged, err, sizeof err), KV_OK, "%s", err);
    cr_expect_eq(cmap_check_sig(forged, key, err, sizeof err), KV_PERMISSION_DENIED, "address");
    cmap_unref(forged);
    /* a mac of the wrong length is no mac */
    pb->mac.len = 16;
    free(pb->nodes[2]->addr);
    pb->nodes[2]->addr = strdup("tcp://10.0.0.3:7003");
    cr_assert_eq(cmap_from_pb(pb, &forged, err, sizeof err), KV_OK, "%s", err);
    cr_expect(!cmap_signed(forged));
    cmap_unref(forged);
    pb->mac.len = CMAP_MAC_LEN;
    kv__cluster_map__free_unpacked(pb, NULL);
    cmap_unref(m);
    cmap_unref(back);
    cmap_unref(again);
    cmap_unref(cur);
}

/* Issue 16 item 7: every replica array of the node and the router has
 * CMAP_MAX_RF entries, so a map with more replicas than that is refused,
 * even with enough nodes (the check used to be rf <= number of nodes). At
 * the limit, a key gets exactly CMAP_MAX_RF replicas. */
Test(cmap, rf_over_the_replica_arrays_is_refused)
{
    enum { N = CMAP_MAX_RF + 4 };
    Kv__ClusterMap pb;
    Kv__NodeInfo nodes[N], *ptrs[N];
    char ids[N][8], addrs[N][32];
    kv__cluster_map__init(&pb);
    pb.epoch = 1;
    pb.n_nodes = N;
    pb.nodes = ptrs;
    for (int i = 0; i < N; i++) {
        kv__node_info__init(&nodes[i]);
        snprintf(ids[i], sizeof(ids[i]), "n%d", i);
        snprintf(addrs[i], sizeof(addrs[i]), "tcp://127.0.0.1:%d", 7001 + i);
        nodes[i].id = ids[i];
        nodes[i].addr = addrs[i];
        nodes[i].weight = 1;
        ptrs[i] = &nodes[i];
    }
    char err[256] = "";
    cmap *m = NULL;
    pb.rf = CMAP_MAX_RF + 1;
    cr_assert_eq(cmap_from_pb(&pb, &m, err, sizeof(err)), KV_INVALID_ARGUMENT);
    cr_assert_null(m);
    cr_assert(strstr(err, "at most 16") != NULL, "the limit is named: %s", err);
    pb.rf = N; /* rf = number of nodes, the old bound */
    cr_assert_eq(cmap_from_pb(&pb, &m, err, sizeof(err)), KV_INVALID_ARGUMENT);
    pb.rf = CMAP_MAX_RF;
    cr_assert_eq(cmap_from_pb(&pb, &m, err, sizeof(err)), KV_OK, "%s", err);
    uint32_t idx[CMAP_MAX_RF];
    cr_assert_eq(cmap_replicas(m, "key", 3, idx), CMAP_MAX_RF);
    for (int i = 0; i < CMAP_MAX_RF; i++)
        for (int j = 0; j < i; j++)
            cr_assert_neq(idx[i], idx[j], "distinct replicas");
    cmap_unref(m);
}
