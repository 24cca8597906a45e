/* SPDX-License-Identifier: MIT */
/*
 * kv.Scan at the router: a merge of the nodes' ordered streams.
 *
 * Each round asks every node of the map for one page after the same key
 * (node pages hold every record, tombstones and expired ones included, in
 * key order). A key can be decided only up to the bound: the smallest last
 * key of the nodes that are not done (past it, a node that stopped early
 * may still hold a newer version). Up to the bound, each key's records are
 * those of the nodes that replicate it under the map (a node may still
 * hold copies of ranges it gave up, not yet cleaned up: those are ignored),
 * the newest version wins, and the key is returned when that version is
 * live (not a tombstone, not expired). Rounds go on from the bound until
 * the page is full, every node is done, or the deadline nears. The cursor
 * is the last key returned (or the bound), so the next page starts after
 * it and every key comes out exactly once over the pages.
 *
 * A node that fails is left out: its keys come from their other replicas;
 * with rf or more nodes failing some keys could be missed, so the call
 * fails UNAVAILABLE instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "shard/fan.h"
#include "shard/router.h"

#define SCAN_DEFAULT_LIMIT 100u
#define SCAN_MAX_LIMIT 10000u
#define SCAN_MAX_ROUNDS 64
#define SCAN_MAX_BYTES (4u << 20) /* keys and values per page, as a node's page */

/* memcmp order, a shorter key first on a common prefix (the engine's). */
static int key_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen;
    int c = n ? memcmp(a, b, n) : 0; /* an empty key's data may be NULL (protobuf-c) */
    return c ? c : (alen > blen) - (alen < blen);
}

typedef struct cand {
    const Kv__ScanItem *it;
    uint32_t node;
} cand;

static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    int c = key_cmp(x->it->key.data, x->it->key.len, y->it->key.data, y->it->key.len);
    if (c)
        return c;
    return x->it->version > y->it->version ? -1 : x->it->version < y->it->version;
}

/* Whether node i replicates key under m (current or pending replica). */
static bool replicates(cmap *m, uint32_t i, const ProtobufCBinaryData *key)
{
    uint32_t idx[2 * ROUTER_MAX_RF];
    size_t n = cmap_replicas(m, key->data, key->len, idx);
    n += cmap_pending(m, key->data, key->len, idx + n);
    for (size_t k = 0; k < n; k++)
        if (idx[k] == i)
            return true;
    return false;
}

typedef struct scan_out {
    Kv__ScanItem **items;
    size_t n, cap;
    uint8_t *cursor; /* malloc'ed copy */
    size_t cursor_len;
    size_t bytes; /* keys and values in items */
} scan_out;

static bool set_cursor(scan_out *o, const void *key, size_t len)
{
    uint8_t *c = malloc(len ? len : 1);
    if (!c)
        return false;
    if (len) /* an empty key's data may be NULL */
        memcpy(c, key, len);
    free(o->cursor);
    o->cursor = c;
    o->cursor_len = len;
    return true;
}

/* Copies the chosen record into o. */
static bool emit(scan_out *o, const Kv__ScanItem *src, bool keys_only)
{
    Kv__ScanItem *d = calloc(1, sizeof(*d));
    uint8_t *k = malloc(src->key.len ? src->key.len : 1);
    size_t vlen = keys_only ? 0 : src->value.len;
    uint8_t *v = vlen ? malloc(vlen) : NULL;
    if (!d || !k || (vlen && !v)) {
        free(d);
        free(k);
        free(v);
        return false;
    }
    kv__scan_item__init(d);
    if (src->key.len)
        memcpy(k, src->key.data, src->key.len);
    if (vlen)
        memcpy(v, src->value.data, vlen);
    d->key = (ProtobufCBinaryData){src->key.len, k};
    d->value = (ProtobufCBinaryData){vlen, v};
    d->version = src->version;
    d->expire_at_ms = src->expire_at_ms;
    o->items[o->n++] = d;
    o->bytes += src->key.len + vlen;
    return true;
}

static void out_free(scan_out *o)
{
    for (size_t i = 0; i < o->n; i++) {
        free(o->items[i]->key.data);
        free(o->items[i]->value.data);
        free(o->items[i]);
    }
    free(o->items);
    free(o->cursor);
}

/* One round: every node's page after `after` (NULL: from the request's
 * start). Merges what can be decided into o, up to limit items in all. Returns KV_OK with *done
 * when the scan reached the end, or the failure. */
static kv_err round_once(router *r, rpc_ctx *c, cmap *m, const Kv__ScanRequest *req, size_t limit,
                         const ProtobufCBinaryData *after, scan_out *o, bool *done)
{
    size_t nn = cmap_node_count(m);
    Kv__ScanRequest q = KV__SCAN_REQUEST__INIT;
    q.prefix = req->prefix;
    q.keys_only = req->keys_only;
    q.limit = (uint32_t)(limit - o->n); /* what the page still needs */
    if (after)
        q.cursor = *after;
    else
        q.start = req->start;
    fanout *f = fan_create((int)nn);
    rpc_reply *reps = calloc(nn, sizeof(*reps));
    bool *have = calloc(nn, sizeof(*have));
    Kv__ScanReply **pages = calloc(nn, sizeof(*pages));
    if (!f || !reps || !have || !pages) {
        if (f)
            fan_release(f);
        free(reps);
        free(have);
        free(pages);
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    }
    uint32_t dl = repl_forward_deadline(c);
    for (size_t i = 0; i < nn; i++)
        fan_send_ctr(f, router_chan(r, cmap_node_at(m, i)->addr), "kv.Scan", cmap_epoch(m), &q.base,
                     dl, router_target_ctr(r, cmap_node_at(m, i)->id));
    fan_wait(f, (int)nn, dl);
    fan_take(f, reps, have);
    fan_release(f);
    kv_err rv = KV_OK;
    size_t failed = 0, total = 0;
    const ProtobufCBinaryData *bound = NULL; /* NULL = every node is done */
    char why[RPC_MAX_MESSAGE] = "";
    for (size_t i = 0; i < nn; i++) {
        if (have[i] && reps[i].status == KV_OK)
            pages[i] = kv__scan_reply__unpack(NULL, reps[i].len, reps[i].body);
        if (!pages[i]) {
            failed++;
            snprintf(why, sizeof(why), "node %s: %s", cmap_node_at(m, i)->id,
                     have[i] && reps[i].message
                         ? reps[i].message
                         : kv_strerror(have[i] ? reps[i].status : KV_UNAVAILABLE));
            continue;
        }
        total += pages[i]->n_items;
        if (!pages[i]->done && (!bound || key_cmp(pages[i]->cursor.data, pages[i]->cursor.len,
                                                  bound->data, bound->len) < 0))
            bound = &pages[i]->cursor;
    }
    if (failed && failed >= cmap_rf(m))
        rv = rpc_fail(c, KV_UNAVAILABLE, "%zu of %zu nodes did not answer the scan (rf %u): %s",
                      failed, nn, cmap_rf(m), why);
    cand *cs = rv == KV_OK ? calloc(total ? total : 1, sizeof(*cs)) : NULL;
    if (rv == KV_OK && !cs)
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    size_t nc = 0;
    for (size_t i = 0; rv == KV_OK && i < nn; i++)
        for (size_t k = 0; pages[i] && k < pages[i]->n_items; k++) {
            const Kv__ScanItem *it = pages[i]->items[k];
            if (bound && key_cmp(it->key.data, it->key.len, bound->data, bound->len) > 0)
                break; /* undecided yet: the next round fetches it again */
            if (replicates(m, (uint32_t)i, &it->key))
                cs[nc++] = (cand){it, (uint32_t)i};
        }
    if (rv == KV_OK)
        qsort(cs, nc, sizeof(*cs), cand_cmp);
    uint64_t now = kv_wall_ms();
    bool full = false;
    for (size_t k = 0; rv == KV_OK && k < nc && !full; k++) {
        if (k && key_cmp(cs[k].it->key.data, cs[k].it->key.len, cs[k - 1].it->key.data,
                         cs[k - 1].it->key.len) == 0)
            continue; /* an older copy of the key just decided */
        const Kv__ScanItem *it = cs[k].it;
        bool live = !it->tombstone && (!it->expire_at_ms || it->expire_at_ms > now);
        if (live && (!emit(o, it, req->keys_only) || !set_cursor(o, it->key.data, it->key.len)))
            rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
        full = o->n == limit || o->bytes >= SCAN_MAX_BYTES;
    }
    *done = false;
    if (rv == KV_OK && !full) { /* every decided key is in: continue from the bound */
        if (!bound)
            *done = true;
        else if (!set_cursor(o, bound->data, bound->len))
            rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    }
    free(cs);
    for (size_t i = 0; i < nn; i++) {
        if (pages[i])
            kv__scan_reply__free_unpacked(pages[i], NULL);
        if (have[i])
            rpc_reply_free(&reps[i]);
    }
    free(reps);
    free(have);
    free(pages);
    return rv;
}

kv_err router_h_scan(rpc_ctx *c, const uint8_t *body, size_t len)
{
    router *r = c->user;
    atomic_fetch_add(&r->requests, 1);
    Kv__ScanRequest *req = kv__scan_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__ScanRequest body");
    size_t max_key = r->cfg.limits.max_key;
    kv_err rv = KV_OK;
    if (req->start.len > max_key || req->prefix.len > max_key || req->cursor.len > max_key)
        rv = rpc_fail(c, KV_INVALID_ARGUMENT, "start, prefix or cursor longer than %zu bytes",
                      max_key);
    size_t limit = req->limit ? req->limit : SCAN_DEFAULT_LIMIT;
    if (limit > SCAN_MAX_LIMIT)
        limit = SCAN_MAX_LIMIT;
    cmap *m = rv == KV_OK ? cmap_slot_get(r->maps) : NULL;
    if (rv == KV_OK && !m)
        rv = rpc_fail(c, KV_UNAVAILABLE, "router has no cluster map yet");
    scan_out o = {0};
    if (rv == KV_OK && !(o.items = calloc(limit, sizeof(*o.items))))
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    bool done = false;
    const ProtobufCBinaryData *after = req->cursor.len ? &req->cursor : NULL;
    ProtobufCBinaryData cur;
    for (int round = 0; rv == KV_OK && !done && o.n < limit && o.bytes < SCAN_MAX_BYTES; round++) {
        if (round > 0 && (round >= SCAN_MAX_ROUNDS || rpc_ctx_remaining_ms(c) < 200))
            break; /* return what is decided; the cursor goes on from there */
        rv = round_once(r, c, m, req, limit, after, &o, &done);
        cur = (ProtobufCBinaryData){o.cursor_len, o.cursor};
        after = o.cursor ? &cur : after;
    }
    if (rv == KV_OK) {
        Kv__ScanReply rep = KV__SCAN_REPLY__INIT;
        rep.n_items = o.n;
        rep.items = o.items;
        rep.done = done;
        if (!done && o.cursor)
            rep.cursor = (ProtobufCBinaryData){o.cursor_len, o.cursor};
        else if (!done) /* no progress at all (deadline): continue where asked */
            rep.cursor = req->cursor;
        c->reply_epoch = cmap_epoch(m);
        rv = rpc_reply_msg(c, &rep.base);
    }
    out_free(&o);
    cmap_unref(m);
    kv__scan_request__free_unpacked(req, NULL);
    return rv;
}
