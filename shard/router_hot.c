/* SPDX-License-Identifier: MIT */
/*
 * Cluster hot-key detection at the router (issue 7). Forwarding threads
 * offer the keys they route to a hk_window (per-thread Space-Saving
 * sketches, one key in --hot-sample sampled, no lock on the forwarding
 * path). Every --hot-window-ms a reporter thread rotates the window and
 * pushes each hot key to the nodes that hold a replica of it (admin.HotKeys,
 * batched per node, fire-and-forget with a deadline). admin.HotKeys sent to
 * the router reads the cluster-wide view: the router asks every node for
 * its merged view and merges those.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "shard/router.h"
#include "shard/fan.h"

/* The sketch of the calling nng thread (asynchronous calls run on nng's
 * threads, not on workers): one of ROUTER_HOT_NNG_SLOTS after the
 * workers', each thread its own, taken on its first sample; -1 once they
 * are all taken (that thread's keys then go unsampled). */
static int nng_slot(router *r)
{
    static _Thread_local const router *owner;
    static _Thread_local int slot;
    if (owner != r) {
        int i = atomic_fetch_add_explicit(&r->hot_nng_slots, 1, memory_order_relaxed);
        slot = i < ROUTER_HOT_NNG_SLOTS ? (int)r->cfg.workers + i : -1;
        owner = r;
    }
    return slot;
}

void router_hot_sample(router *r, int worker, const void *key, size_t klen)
{
    if (!r->hot)
        return;
    if (worker < 0)
        worker = nng_slot(r);
    if (worker >= 0)
        hk_window_sample(r->hot, (size_t)worker, key, klen);
}

static void push_done(void *arg, rpc_reply *rep)
{
    rpc_reply_free(rep);
}

/* Sends node j the items whose replicas include it; an empty list too, so a
 * router that stopped seeing a node's keys withdraws its earlier reports at
 * once (the node would otherwise keep them until another report came). */
static void push_node(router *r, cmap *m, size_t j, const hk_report *rep, Kv__HotKey *keys,
                      Kv__HotKey **ptrs)
{
    size_t n = 0;
    /* the hottest first (hk_report's order), at most what a node accepts */
    for (size_t i = 0; i < rep->n && n < HK_REPORT_MAX_KEYS; i++) {
        uint32_t idx[ROUTER_MAX_RF];
        size_t k = cmap_replicas(m, rep->items[i].key, rep->items[i].klen, idx);
        bool mine = false;
        for (size_t x = 0; x < k; x++)
            mine |= idx[x] == j;
        if (!mine)
            continue;
        kv__hot_key__init(&keys[n]);
        keys[n].key = (ProtobufCBinaryData){rep->items[i].klen, rep->items[i].key};
        keys[n].ops_per_s = rep->items[i].guaranteed_rate;
        keys[n].count = rep->items[i].est_count;
        keys[n].error = rep->items[i].error;
        ptrs[n] = &keys[n];
        n++;
    }
    Kv__HotKeysRequest req = KV__HOT_KEYS_REQUEST__INIT;
    req.router_id = r->cfg.listen;
    req.window_ms = (uint32_t)r->cfg.hot_window_ms;
    req.n_keys = n;
    req.keys = ptrs;
    rpc_chan *ch = router_chan(r, cmap_node_at(m, j)->addr);
    /* A report stays useful for as long as the node keeps it (3 windows):
     * a deadline of one window let a busy node's queue drop or shed every
     * report (its admission refuses a call once the queue has waited half
     * of its deadline), and the cluster then had no hot keys at all. */
    uint32_t dl = (uint32_t)r->cfg.hot_window_ms * 3;
    if (ch) /* the request is packed before this returns: stack memory is fine */
        rpc_call_async(ch, "admin.HotKeys", cmap_epoch(m), &req.base, dl < 1000 ? 1000 : dl,
                       push_done, NULL);
}

static void push_report(router *r, const hk_report *rep)
{
    cmap *m = cmap_slot_get(r->maps);
    Kv__HotKey *keys = m ? calloc(rep->n + 1, sizeof(*keys)) : NULL;
    Kv__HotKey **ptrs = m ? calloc(rep->n + 1, sizeof(*ptrs)) : NULL;
    for (size_t j = 0; keys && ptrs && j < cmap_node_count(m); j++)
        push_node(r, m, j, rep, keys, ptrs);
    free(keys);
    free(ptrs);
    cmap_unref(m);
}

static void *hot_main(void *arg)
{
    router *r = arg;
    while (!atomic_load(&r->stopping)) {
        for (long t = 0; t < r->cfg.hot_window_ms && !atomic_load(&r->stopping); t += 10) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        hk_report rep = {0};
        if (hk_window_rotate(r->hot, kv_now_ns(), (size_t)r->cfg.hot_k, &rep) != KV_OK)
            continue;
        atomic_store(&r->hot_reported, rep.n);
        push_report(r, &rep);
        if (r->mit)
            router_mit_update(r->mit, &rep);
        hk_report_free(&rep);
    }
    return NULL;
}

kv_err router_hot_start(router *r)
{
    if (r->cfg.hot_sample <= 0)
        return KV_OK; /* detection off (and with it the mitigations) */
    kv_err rv = KV_OK;
    if ((r->cfg.hot_replica_reads || r->cfg.hot_cache_ms > 0) &&
        (rv = router_mit_create(&r->mit, r->cfg.hot_replica_reads, r->cfg.hot_cache_ms,
                                r->cfg.hot_flag_rate)) != KV_OK)
        return rv;
    rv = hk_window_create(&r->hot, (size_t)r->cfg.workers + ROUTER_HOT_NNG_SLOTS,
                          (size_t)r->cfg.hot_k, (uint32_t)r->cfg.hot_sample, kv_now_ns());
    if (rv != KV_OK)
        return rv;
    if (pthread_create(&r->hot_thread, NULL, hot_main, r) != 0)
        return KV_RESOURCE_EXHAUSTED;
    r->hot_started = true;
    return KV_OK;
}

void router_hot_stop(router *r)
{
    if (r->hot_started)
        pthread_join(r->hot_thread, NULL);
    r->hot_started = false;
    hk_window_destroy(r->hot);
    r->hot = NULL;
    router_mit_destroy(r->mit);
    r->mit = NULL;
}

/* ---- read side --------------------------------------------------------- */

typedef struct merged {
    Kv__HotKeyInfo info;
    char **nodes;
} merged;

static merged *find_merged(merged *all, size_t n, const ProtobufCBinaryData *key)
{
    for (size_t i = 0; i < n; i++)
        if (all[i].info.key.len == key->len &&
            memcmp(all[i].info.key.data, key->data, key->len) == 0)
            return &all[i];
    return NULL;
}

/* Folds one node's view into all (max rate, union of nodes, any pinned). */
static size_t merge_view(merged *all, size_t n, size_t cap, const Kv__HotKeysReply *v,
                         const char *node_id)
{
    for (size_t i = 0; i < v->n_keys; i++) {
        const Kv__HotKeyInfo *k = v->keys[i];
        merged *m = find_merged(all, n, &k->key);
        if (!m && n < cap) {
            m = &all[n++];
            kv__hot_key_info__init(&m->info);
            m->info.key = k->key;
            m->nodes = calloc(ROUTER_MAX_RF * 4, sizeof(char *));
        }
        if (!m || !m->nodes)
            continue;
        m->info.ops_per_s = k->ops_per_s > m->info.ops_per_s ? k->ops_per_s : m->info.ops_per_s;
        m->info.pinned |= k->pinned;
        if (m->info.n_nodes < ROUTER_MAX_RF * 4)
            m->nodes[m->info.n_nodes++] = (char *)node_id;
        m->info.nodes = m->nodes;
    }
    return n;
}

static int merged_desc(const void *a, const void *b)
{
    const merged *x = a, *y = b;
    return x->info.ops_per_s < y->info.ops_per_s   ? 1
           : x->info.ops_per_s > y->info.ops_per_s ? -1
                                                   : 0;
}

static kv_err reply_merged(rpc_ctx *c, merged *all, size_t n, size_t top)
{
    qsort(all, n, sizeof(*all), merged_desc);
    size_t k = n < top ? n : top;
    Kv__HotKeyInfo **ptrs = calloc(k + 1, sizeof(*ptrs));
    if (!ptrs)
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < k; i++)
        ptrs[i] = &all[i].info;
    Kv__HotKeysReply rep = KV__HOT_KEYS_REPLY__INIT;
    rep.n_keys = k;
    rep.keys = ptrs;
    kv_err rv = rpc_reply_msg(c, &rep.base);
    free(ptrs);
    return rv;
}

kv_err router_h_hot_keys(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    Kv__HotKeysRequest *req = kv__hot_keys_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__HotKeysRequest body");
    size_t top = req->top ? req->top : 20;
    kv__hot_keys_request__free_unpacked(req, NULL);
    cmap *m = cmap_slot_get(r->maps);
    if (!m)
        return rpc_fail(c, KV_UNAVAILABLE, "router has no cluster map yet");
    size_t nn = cmap_node_count(m), cap = nn * (top * 4 + 64);
    Kv__HotKeysRequest q = KV__HOT_KEYS_REQUEST__INIT;
    q.top = (uint32_t)(top * 4 + 64); /* nodes see only their keys: ask for more */
    fanout *f = fan_create((int)nn);
    rpc_reply *reps = calloc(nn, sizeof(*reps));
    bool *have = calloc(nn, sizeof(*have));
    merged *all = calloc(cap, sizeof(*all));
    Kv__HotKeysReply **views = calloc(nn, sizeof(*views));
    kv_err rv =
        f && reps && have && all && views ? KV_OK : rpc_fail(c, KV_RESOURCE_EXHAUSTED, "oom");
    uint32_t dl = repl_forward_deadline(c);
    for (size_t j = 0; rv == KV_OK && j < nn; j++)
        fan_send(f, router_chan(r, cmap_node_at(m, j)->addr), "admin.HotKeys", cmap_epoch(m),
                 &q.base, dl);
    size_t n = 0;
    if (rv == KV_OK) {
        fan_wait(f, (int)nn, dl);
        fan_take(f, reps, have);
        for (size_t j = 0; j < nn; j++)
            if (have[j] && reps[j].status == KV_OK &&
                (views[j] = kv__hot_keys_reply__unpack(NULL, reps[j].len, reps[j].body)))
                n = merge_view(all, n, cap, views[j], cmap_node_at(m, j)->id);
        rv = reply_merged(c, all, n, top);
    }
    for (size_t i = 0; all && i < n; i++)
        free(all[i].nodes);
    for (size_t j = 0; j < nn; j++) {
        if (views && views[j])
            kv__hot_keys_reply__free_unpacked(views[j], NULL);
        if (have && have[j])
            rpc_reply_free(&reps[j]);
    }
    if (f)
        fan_release(f);
    free(reps);
    free(have);
    free(all);
    free(views);
    cmap_unref(m);
    return rv;
}
