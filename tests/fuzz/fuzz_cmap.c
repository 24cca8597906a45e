/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for the cluster map from bytes (shard/clustermap.c): the
 * first input byte picks cmap_decode of the rest (a kv.ClusterMap as a node
 * or router reads it from the wire or DATA_DIR/cluster.map) or
 * cmap_parse_spec of its lines (kvctl cluster init). Every accepted map must
 * survive an encode/decode round trip byte for byte and keep the lookup
 * invariants (replica sets distinct and in range, owner first, pending
 * replicas outside the current set, ring shares summing to one); every
 * rejection must come with a printable message (it is echoed into RPC
 * statuses, whose message is a proto3 string). A map signed with a key
 * verifies under it after the round trips and under no other key, and the
 * input's own mac (if any) verifies with the harness's key only when it is
 * the map's real signature. Nothing outlives an input.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "shard/clustermap.h"

static void check_key(const cmap *m, const void *key, size_t klen)
{
    uint32_t idx[CMAP_MAX_RF], pend[CMAP_MAX_RF];
    size_t n = cmap_node_count(m), k = cmap_replicas(m, key, klen, idx);
    FZ_CHECK(k >= 1 && k <= cmap_rf(m), "%zu replicas with rf %u", k, cmap_rf(m));
    FZ_CHECK(cmap_owner(m, key, klen) == idx[0], "owner is not the first replica");
    for (size_t i = 0; i < k; i++) {
        FZ_CHECK(idx[i] < n, "replica index %u of %zu nodes", idx[i], n);
        FZ_CHECK(cmap_holds(m, idx[i], key, klen), "replica %u does not hold the key", idx[i]);
        for (size_t j = 0; j < i; j++)
            FZ_CHECK(idx[i] != idx[j], "replica %u listed twice", idx[i]);
    }
    size_t p = cmap_pending(m, key, klen, pend);
    FZ_CHECK(p <= cmap_rf(m), "%zu pending replicas with rf %u", p, cmap_rf(m));
    FZ_CHECK(p == 0 || cmap_transition(m), "pending replicas without a transition");
    for (size_t i = 0; i < p; i++) {
        FZ_CHECK(pend[i] < n, "pending index %u of %zu nodes", pend[i], n);
        for (size_t j = 0; j < k; j++)
            FZ_CHECK(pend[i] != idx[j], "pending replica %u is also current", pend[i]);
    }
}

static void check_shares(const cmap *m, bool next)
{
    size_t n = cmap_node_count(m);
    double *share = calloc(n, sizeof(*share)), sum = 0;
    FZ_CHECK(share, "out of memory");
    cmap_shares(m, next, share);
    for (size_t i = 0; i < n; i++) {
        FZ_CHECK(share[i] >= 0 && share[i] <= 1.000001, "share %g of node %zu", share[i], i);
        sum += share[i];
    }
    FZ_CHECK(fabs(sum - 1) < 1e-6, "%s ring shares sum to %.9f", next ? "pending" : "current", sum);
    free(share);
}

/* Encodes m, decodes it again and encodes that: the same bytes. */
static void check_round_trip(const cmap *m)
{
    uint8_t *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    char err[256];
    cmap *m2 = NULL;
    FZ_CHECK(cmap_encode(m, &a, &alen) == KV_OK, "encode failed");
    kv_err rv = cmap_decode(a, alen, &m2, err, sizeof(err));
    FZ_CHECK(rv == KV_OK, "a map's own encoding is refused: %s", err);
    FZ_CHECK(cmap_encode(m2, &b, &blen) == KV_OK, "second encode failed");
    FZ_CHECK(alen == blen && memcmp(a, b, alen) == 0, "round trip changed the encoding");
    FZ_CHECK(cmap_epoch(m2) == cmap_epoch(m) && cmap_rf(m2) == cmap_rf(m) &&
                 cmap_node_count(m2) == cmap_node_count(m),
             "round trip changed the map");
    Kv__ClusterMap *pb = NULL;
    cmap *m3 = NULL;
    FZ_CHECK(cmap_to_pb(m, &pb) == KV_OK, "to_pb failed");
    FZ_CHECK(cmap_from_pb(pb, &m3, err, sizeof(err)) == KV_OK, "from_pb refused: %s", err);
    kv__cluster_map__free_unpacked(pb, NULL);
    cmap_unref(m3);
    cmap_unref(m2);
    free(a);
    free(b);
}

#define FZ_KEY "fuzz-map-key-0123456789"

/* Signs m, decodes the signed encoding: verifies under FZ_KEY only. */
static void check_signature(const cmap *m)
{
    char why[256];
    Kv__ClusterMap *pb = NULL;
    FZ_CHECK(cmap_to_pb(m, &pb) == KV_OK, "to_pb failed");
    FZ_CHECK(cmap_sign_pb(m, FZ_KEY, pb) == KV_OK, "sign failed");
    size_t len = kv__cluster_map__get_packed_size(pb);
    uint8_t *buf = malloc(len ? len : 1);
    FZ_CHECK(buf, "out of memory");
    kv__cluster_map__pack(pb, buf);
    kv__cluster_map__free_unpacked(pb, NULL);
    cmap *s = NULL;
    kv_err rv = cmap_decode(buf, len, &s, why, sizeof(why));
    free(buf);
    FZ_CHECK(rv == KV_OK, "a signed map's encoding is refused: %s", why);
    FZ_CHECK(cmap_signed(s) && cmap_same(s, m), "signing changed the map");
    FZ_CHECK(cmap_check_sig(s, FZ_KEY, why, sizeof(why)) == KV_OK, "own signature refused: %s",
             why);
    FZ_CHECK(cmap_check_sig(s, FZ_KEY "x", why, sizeof(why)) == KV_PERMISSION_DENIED,
             "verified under another key");
    FZ_CHECK(why[0] && fz_utf8_str_ok(why), "refusal message is empty or not UTF-8");
    cmap_unref(s);
}

static void check_map(const cmap *m, const uint8_t *data, size_t size)
{
    size_t n = cmap_node_count(m);
    FZ_CHECK(n >= 1 && cmap_rf(m) >= 1 && cmap_rf(m) <= CMAP_MAX_RF && cmap_rf(m) <= n,
             "rf %u with %zu nodes", cmap_rf(m), n);
    for (size_t i = 0; i < n; i++) {
        const cmap_node *nd = cmap_node_at(m, i);
        FZ_CHECK(cmap_find(m, nd->id) == (int)i, "cmap_find(%s) != %zu", nd->id, i);
        FZ_CHECK(cmap_find_addr(m, nd->addr) == (int)i, "cmap_find_addr(%s) != %zu", nd->addr, i);
    }
    check_round_trip(m);
    check_signature(m);
    char why[256];
    if (cmap_signed(m) && cmap_check_sig(m, FZ_KEY, why, sizeof(why)) != KV_OK)
        FZ_CHECK(why[0] && fz_utf8_str_ok(why), "refusal message is empty or not UTF-8");
    check_shares(m, false);
    check_shares(m, true);
    static const char *const keys[] = {"", "a", "user:1", "\xff\xff\xff\xff"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        check_key(m, keys[i], strlen(keys[i]));
    check_key(m, data, size < 64 ? size : 64);
}

/* Splits the text into lines (at most 64) and parses them as node specs. */
static kv_err from_spec(fz_in *in, cmap **out, char *err, size_t errlen)
{
    uint64_t epoch = fz_u8(in);
    unsigned rf = fz_u8(in);
    char *text = strndup((const char *)in->p, in->n);
    char *words[64], *save = NULL;
    int n = 0;
    for (char *w = strtok_r(text, "\n", &save); w && n < 64; w = strtok_r(NULL, "\n", &save))
        words[n++] = w;
    kv_err rv = cmap_parse_spec(epoch, rf, words, n, out, err, errlen);
    free(text);
    return rv;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    bool spec = fz_u8(&in) & 1;
    cmap *m = NULL;
    char err[512] = "";
    kv_err rv =
        spec ? from_spec(&in, &m, err, sizeof(err)) : cmap_decode(in.p, in.n, &m, err, sizeof(err));
    if (rv != KV_OK) {
        FZ_CHECK(m == NULL, "a refused map was returned");
        FZ_CHECK(err[0] && fz_utf8_str_ok(err), "refusal message is empty or not UTF-8: %s", err);
        return 0;
    }
    check_map(m, data, size);
    cmap_unref(m);
    return 0;
}
