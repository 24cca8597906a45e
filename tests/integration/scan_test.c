/* SPDX-License-Identifier: MIT */
/*
 * kv.Scan end to end: a node's own scan (every record in key order,
 * tombstones flagged), the router's merge over 3 nodes with rf 2 (live keys
 * only: deletes and expired TTLs skipped, each key once), pagination with
 * the cursor covering every key exactly once, kvctl scan, and kvctl status
 * counting live keys only.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "kv/kv.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

static kvt_cluster cl;

#define NKEYS 300

/* Key i: "k%04d"; deleted when i % 7 == 3, given a 1 s TTL when i % 11 == 5
 * (and not deleted): live otherwise. */
static bool deleted(int i)
{
    return i % 7 == 3;
}
static bool expiring(int i)
{
    return !deleted(i) && i % 11 == 5;
}

static void load(void)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = 5000};
    cr_assert_eq(kv_client_open(&c, cl.router_url, &o), KV_OK);
    for (int i = 0; i < NKEYS; i++) {
        char k[16], v[32];
        snprintf(k, sizeof(k), "k%04d", i);
        snprintf(v, sizeof(v), "v%d", i);
        kv_put_opts po = {.ttl_ms = expiring(i) ? 1000 : 0};
        cr_assert_eq(kv_put(c, k, strlen(k), v, strlen(v), &po, NULL), KV_OK, "put %s", k);
    }
    for (int i = 0; i < NKEYS; i++) {
        char k[16];
        snprintf(k, sizeof(k), "k%04d", i);
        if (deleted(i))
            cr_assert_eq(kv_delete(c, k, strlen(k), NULL, NULL), KV_OK, "del %s", k);
    }
    /* a few keys outside the prefix used below */
    cr_assert_eq(kv_put(c, "a", 1, "x", 1, NULL, NULL), KV_OK);
    cr_assert_eq(kv_put(c, "z", 1, "x", 1, NULL, NULL), KV_OK);
    kv_client_close(c);
    usleep(1500 * 1000); /* the TTLs pass */
}

static Kv__ScanReply *scan_call(const char *url, const char *start, const char *prefix,
                                const ProtobufCBinaryData *cursor, uint32_t limit)
{
    rpc_chan *ch = NULL;
    cr_assert_eq(rpc_chan_open(&ch, url, NULL), KV_OK);
    Kv__ScanRequest req = KV__SCAN_REQUEST__INIT;
    if (start)
        req.start = (ProtobufCBinaryData){strlen(start), (uint8_t *)start};
    if (prefix)
        req.prefix = (ProtobufCBinaryData){strlen(prefix), (uint8_t *)prefix};
    if (cursor)
        req.cursor = *cursor;
    req.limit = limit;
    rpc_reply rep;
    kv_err rv = rpc_call(ch, "kv.Scan", 0, &req.base, 30000, &rep);
    cr_assert_eq(rv, KV_OK, "kv.Scan on %s: %s", url, rep.message ? rep.message : "");
    Kv__ScanReply *r = kv__scan_reply__unpack(NULL, rep.len, rep.body);
    cr_assert(r);
    rpc_reply_free(&rep);
    rpc_chan_close(ch);
    return r;
}

static int key_index(const ProtobufCBinaryData *k)
{
    if (k->len != 5 || k->data[0] != 'k')
        return -1;
    char digits[5];
    memcpy(digits, k->data + 1, 4); /* the key is not NUL-terminated */
    digits[4] = '\0';
    return atoi(digits);
}

Test(scan, node_router_pages_and_live_keys, .timeout = 240)
{
    /* a small write buffer: the nodes flush as the keys come in, so scans
     * merge the memory tier's dirty records with SSTs */
    static const char *const small_buffer[] = {"--write-buffer-kb", "4", NULL};
    kvt_node_extra = small_buffer;
    cr_assert_eq(kvt_cluster_start(&cl, 3, 2, NULL), KV_OK, "logs in %s", cl.dir);
    load();
    int live = 0;
    for (int i = 0; i < NKEYS; i++)
        live += !deleted(i) && !expiring(i);

    /* a node's own scan: key order, every record it holds, tombstones flagged */
    size_t node_total = 0, node_tombs = 0;
    for (int n = 0; n < 3; n++) {
        Kv__ScanReply *r = scan_call(cl.node_url[n], NULL, "k", NULL, 10000);
        cr_expect(r->done, "node %d: one page holds it all", n);
        for (size_t i = 0; i < r->n_items; i++) {
            const Kv__ScanItem *it = r->items[i];
            if (i) {
                const Kv__ScanItem *p = r->items[i - 1];
                cr_assert(memcmp(p->key.data, it->key.data, 5) < 0, "node %d: key order", n);
            }
            int k = key_index(&it->key);
            cr_assert(k >= 0, "node %d: prefix honoured", n);
            /* an expired record may have become a tombstone in a compaction */
            if (expiring(k))
                cr_expect(it->tombstone || it->expire_at_ms != 0, "node %d key %d: expiry", n, k);
            else
                cr_expect_eq(it->tombstone, deleted(k), "node %d key %d: tombstone flag", n, k);
            node_tombs += it->tombstone;
        }
        node_total += r->n_items;
        kv__scan_reply__free_unpacked(r, NULL);
    }
    cr_expect_eq(node_total, (size_t)NKEYS * 2, "rf 2: every record twice over the nodes");
    cr_expect(node_tombs > 0);
    char out[65536];

    /* the router: live keys only, each once, in order */
    Kv__ScanReply *r = scan_call(cl.router_url, NULL, "k", NULL, 10000);
    cr_expect(r->done);
    cr_assert_eq(r->n_items, (size_t)live, "live keys %zu, want %d", r->n_items, live);
    for (size_t i = 0; i < r->n_items; i++) {
        int k = key_index(&r->items[i]->key);
        cr_assert(k >= 0 && !deleted(k) && !expiring(k), "key %d is not live", k);
        char v[32];
        snprintf(v, sizeof(v), "v%d", k);
        cr_expect(r->items[i]->value.len == strlen(v) &&
                      memcmp(r->items[i]->value.data, v, strlen(v)) == 0,
                  "value of k%04d", k);
        if (i)
            cr_assert_lt(key_index(&r->items[i - 1]->key), k, "order");
    }
    kv__scan_reply__free_unpacked(r, NULL);

    /* start is inclusive; with a prefix too */
    r = scan_call(cl.router_url, "k0100", "k", NULL, 1);
    cr_assert_eq(r->n_items, 1u);
    cr_expect_eq(key_index(&r->items[0]->key), 100);
    cr_expect(!r->done);
    kv__scan_reply__free_unpacked(r, NULL);

    /* pages of 7: every live key exactly once, the whole key space too */
    for (int pass = 0; pass < 2; pass++) {
        bool seen[NKEYS] = {false};
        int got = 0, pages = 0, others = 0;
        uint8_t cur[64];
        ProtobufCBinaryData cursor = {0, cur};
        bool done = false;
        while (!done && pages < 1000) {
            r = scan_call(cl.router_url, NULL, pass ? NULL : "k", pages ? &cursor : NULL, 7);
            pages++;
            cr_assert_leq(r->n_items, 7u);
            for (size_t i = 0; i < r->n_items; i++) {
                int k = key_index(&r->items[i]->key);
                if (k < 0) {
                    others++;
                    continue;
                }
                cr_assert(!seen[k], "k%04d returned twice", k);
                seen[k] = true;
                got++;
            }
            done = r->done;
            if (!done) {
                cr_assert(r->cursor.len > 0 && r->cursor.len <= sizeof(cur));
                memcpy(cur, r->cursor.data, r->cursor.len);
                cursor.len = r->cursor.len;
            }
            kv__scan_reply__free_unpacked(r, NULL);
        }
        cr_assert(done, "the scan ends");
        cr_expect_eq(got, live, "pass %d: %d of %d live keys", pass, got, live);
        cr_expect_eq(others, pass ? 2 : 0, "keys outside the prefix: only without it");
    }

    /* mostly tombstones: a page takes many rounds of node pages to fill */
    kv_client *kc = NULL;
    kv_client_opts ko = {.timeout_ms = 5000};
    cr_assert_eq(kv_client_open(&kc, cl.router_url, &ko), KV_OK);
    for (int i = 0; i < 200; i++) {
        char k[16];
        snprintf(k, sizeof(k), "d%04d", i);
        cr_assert_eq(kv_put(kc, k, strlen(k), "x", 1, NULL, NULL), KV_OK);
        if (i % 20 != 7)
            cr_assert_eq(kv_delete(kc, k, strlen(k), NULL, NULL), KV_OK);
    }
    kv_client_close(kc);
    int dseen = 0, dpages = 0;
    uint8_t dcur[64];
    ProtobufCBinaryData dcursor = {0, dcur};
    for (bool done = false; !done && dpages < 100; dpages++) {
        r = scan_call(cl.router_url, NULL, "d", dpages ? &dcursor : NULL, 3);
        cr_assert_leq(r->n_items, 3u);
        for (size_t i = 0; i < r->n_items; i++) {
            char want[16];
            snprintf(want, sizeof(want), "d%04d", dseen * 20 + 7);
            cr_assert(r->items[i]->key.len == 5 && memcmp(r->items[i]->key.data, want, 5) == 0,
                      "live key %d in order", dseen);
            dseen++;
        }
        done = r->done;
        if (!done) {
            memcpy(dcur, r->cursor.data, r->cursor.len);
            dcursor.len = r->cursor.len;
        }
        kv__scan_reply__free_unpacked(r, NULL);
    }
    cr_expect_eq(dseen, 10, "10 live keys among 190 tombstones (%d pages)", dpages);

    /* kvctl scan: text, JSON, cursor continuation */
    cr_assert_eq(kvt_kvctl(&cl, "scan --prefix k --limit 3", out, sizeof(out)), 0, "%s", out);
    cr_expect(strncmp(out, "k0000\tv0\nk0001\tv1\nk0002\tv2\ncursor: ", 35) == 0, "%s", out);
    cr_assert_eq(kvt_kvctl(&cl, "scan --prefix k --limit 2 --cursor 6b30303032 --keys-only", out,
                           sizeof(out)),
                 0, "%s", out);
    cr_expect(strncmp(out, "k0004\nk0006\n", 12) == 0, "k0003 is deleted, k0005 expired: %s", out);
    cr_assert_eq(kvt_kvctl(&cl, "--json scan --start y", out, sizeof(out)), 0, "%s", out);
    cr_expect(strstr(out, "{\"items\":[{\"key\":\"z\",\"value\":\"x\",\"version\":\"") == out, "%s",
              out);
    cr_expect(strstr(out, "\"cursor\":null,\"done\":true}") != NULL, "%s", out);

    /* kvctl status: live keys only, per node, summing to live x rf */
    cr_assert_eq(kvt_kvctl(&cl, "--json status", out, sizeof(out)), 0, "%s", out);
    long sum = 0;
    for (const char *p = out; (p = strstr(p, "\"live_keys\":")) != NULL; p++)
        sum += strtol(p + strlen("\"live_keys\":"), NULL, 10);
    cr_expect_eq(sum, (long)(live + 2 + 10) * 2, "live keys over the nodes %ld, want %d", sum,
                 (live + 2 + 10) * 2);
    cr_assert_eq(kvt_kvctl(&cl, "status", out, sizeof(out)), 0, "%s", out);
    cr_expect(strstr(out, "LIVE KEYS") != NULL, "%s", out);
    /* (a count is reused for 5 s: the verbose status comes after the one above) */
    cr_assert_eq(kvt_kvctl(&cl, "--json status --verbose", out, sizeof(out)), 0, "%s", out);
    long flushes = 0;
    for (const char *p = out; (p = strstr(p, "\"lsm.flushes\":")) != NULL; p++)
        flushes += strtol(p + strlen("\"lsm.flushes\":"), NULL, 10);
    cr_expect_gt(flushes, 0, "the nodes flushed to SSTs: %s", out);
    kvt_cluster_stop(&cl);
}

/* Pages of `page` keys through the router: every live "k" key once, in
 * order; returns how many came. */
static int page_through(uint32_t page)
{
    bool seen[NKEYS] = {false};
    int got = 0, pages = 0, last = -1;
    uint8_t cur[64];
    ProtobufCBinaryData cursor = {0, cur};
    for (bool done = false; !done && pages < 1000; pages++) {
        Kv__ScanReply *r = scan_call(cl.router_url, NULL, "k", pages ? &cursor : NULL, page);
        cr_assert_leq(r->n_items, page);
        for (size_t i = 0; i < r->n_items; i++) {
            int k = key_index(&r->items[i]->key);
            cr_assert(k > last && k < NKEYS, "key %d in order", k);
            cr_assert(!seen[k] && !deleted(k) && !expiring(k), "key %d once, live", k);
            seen[k] = true;
            last = k;
            got++;
        }
        done = r->done;
        if (!done) {
            memcpy(cur, r->cursor.data, r->cursor.len);
            cursor.len = r->cursor.len;
        }
        kv__scan_reply__free_unpacked(r, NULL);
    }
    return got;
}

/* Nodes over kallax (its iterator runs in hash order): a node's page is
 * its smallest keys past the cursor, so the router's merge holds. */
Test(scan, kallax_nodes, .timeout = 240)
{
    static const char *const kallax[] = {"--engine", "kallax", "--kallax-blocks", "512", NULL};
    kvt_node_extra = kallax;
    cr_assert_eq(kvt_cluster_start(&cl, 3, 2, NULL), KV_OK, "logs in %s", cl.dir);
    load();
    int live = 0;
    for (int i = 0; i < NKEYS; i++)
        live += !deleted(i) && !expiring(i);
    Kv__ScanReply *r = scan_call(cl.node_url[0], NULL, "k", NULL, 10);
    for (size_t i = 1; i < r->n_items; i++)
        cr_assert_lt(key_index(&r->items[i - 1]->key), key_index(&r->items[i]->key),
                     "a kallax node's page is in key order");
    kv__scan_reply__free_unpacked(r, NULL);
    cr_expect_eq(page_through(10000), live);
    cr_expect_eq(page_through(7), live);
    char out[65536];
    cr_assert_eq(kvt_kvctl(&cl, "--json status", out, sizeof(out)), 0, "%s", out);
    long sum = 0;
    for (const char *p = out; (p = strstr(p, "\"live_keys\":")) != NULL; p++)
        sum += strtol(p + strlen("\"live_keys\":"), NULL, 10);
    cr_expect_eq(sum, (long)(live + 2) * 2, "live keys over the kallax nodes");
    kvt_cluster_stop(&cl);
}

/* A scan through a router still answers with one node of three down (rf 2:
 * every key has a live replica), and fails UNAVAILABLE with two down. */
Test(scan, survives_a_node_down, .timeout = 180)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 2, NULL), KV_OK, "logs in %s", cl.dir);
    load();
    int live = 0;
    for (int i = 0; i < NKEYS; i++)
        live += !deleted(i) && !expiring(i);
    kvt_kill_node(&cl, 2, SIGKILL);
    Kv__ScanReply *r = scan_call(cl.router_url, NULL, "k", NULL, 10000);
    cr_expect_eq(r->n_items, (size_t)live, "one node down: still every live key");
    kv__scan_reply__free_unpacked(r, NULL);
    kvt_kill_node(&cl, 1, SIGKILL);
    char out[4096];
    cr_expect_eq(kvt_kvctl(&cl, "scan --prefix k", out, sizeof(out)), 3, "%s", out);
    cr_expect(strstr(out, "UNAVAILABLE") != NULL, "%s", out);
    kvt_cluster_stop(&cl);
}
