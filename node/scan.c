/* SPDX-License-Identifier: MIT */
/*
 * kv.Scan on a node, and its exact live-key count (admin.Stats live_keys).
 *
 * Both walk the engine iterator (engine_iter.c): every key's newest record,
 * the memory tier's dirty records merged over the LSM, in key order
 * (lsm_key_cmp: memcmp, a shorter key first on a common prefix), tombstones
 * and expired records included. A scan page opens an iterator after the
 * cursor (or just below start), returns up to limit records (tombstones
 * and expired ones too, flagged: the router needs them to let a newer
 * delete on one replica win over an older value on another) and the last
 * key it returned as the cursor. Over kallax, whose iterator runs in home
 * block order, a page is the limit smallest keys past the cursor, from a
 * pass over the whole store (scan_unordered).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/lsm/lsm.h"
#include "node/node.h"
#include "proto/kv.pb-c.h"

#define SCAN_DEFAULT_LIMIT 100u
#define SCAN_MAX_LIMIT 10000u
#define SCAN_MAX_BYTES (4u << 20) /* values per page: the reply stays well under recv_max */
#define LIVE_KEYS_REUSE_NS (5ull * 1000000000ull)

/* Where a scan that wants keys >= start begins: the iterator starts
 * strictly after a key. For start = P + b with b > 0, every key < start
 * sorts at or below P + (b-1) + 0xff..., so "after P + (b-1)" then dropping
 * the keys below start (only keys beginning with P + (b-1)) is exact; for a
 * last byte 0, P itself is start's immediate predecessor. Writes into buf
 * (start's length) and returns its length; *exact when no key < start can
 * follow. */
static size_t before_start(const uint8_t *start, size_t len, uint8_t *buf, bool *exact)
{
    memcpy(buf, start, len);
    if (buf[len - 1] == 0) {
        *exact = true;
        return len - 1;
    }
    buf[len - 1]--;
    *exact = false;
    return len;
}

static bool has_prefix(const void *key, size_t klen, const ProtobufCBinaryData *p)
{
    return klen >= p->len && memcmp(key, p->data, p->len) == 0;
}

static void item_free(Kv__ScanItem *it);

static void items_free(Kv__ScanItem **items, size_t n)
{
    for (size_t i = 0; i < n; i++)
        item_free(items[i]);
    free(items);
}

/* A copy of r as a scan item (NULL when out of memory). */
static Kv__ScanItem *item_of(const engine_rec *r, bool keys_only)
{
    Kv__ScanItem *it = malloc(sizeof(*it));
    uint8_t *key = malloc(r->klen ? r->klen : 1);
    size_t vlen = keys_only || r->tombstone ? 0 : r->vlen;
    uint8_t *val = vlen ? malloc(vlen) : NULL;
    if (!it || !key || (vlen && !val)) {
        free(it);
        free(key);
        free(val);
        return NULL;
    }
    kv__scan_item__init(it);
    memcpy(key, r->key, r->klen);
    if (vlen)
        memcpy(val, r->val, vlen);
    it->key = (ProtobufCBinaryData){r->klen, key};
    it->value = (ProtobufCBinaryData){vlen, val};
    it->version = r->version;
    it->expire_at_ms = r->expire_at;
    it->tombstone = r->tombstone;
    return it;
}

static void item_free(Kv__ScanItem *it)
{
    free(it->key.data);
    free(it->value.data);
    free(it);
}

/* A page over a store whose iterator is not in key order (kallax: home
 * block order): one pass over every record keeps the `limit` smallest keys
 * past the cursor (a sorted array: binary search, shift), so a page costs a
 * scan of the whole store. */
static kv_err scan_unordered(node *n, const Kv__ScanRequest *req, size_t limit,
                             const ProtobufCBinaryData *from, Kv__ScanItem **items, size_t *k,
                             bool *done)
{
    engine_iter *it = NULL;
    kv_err rv = engine_iter_open(n->eng, NULL, &it);
    size_t more = 0; /* qualifying records beyond the page */
    while (rv == KV_OK) {
        engine_rec r;
        kv_err e = engine_iter_next(it, &r);
        if (e == KV_NOT_FOUND)
            break;
        if (e != KV_OK) {
            rv = e;
            break;
        }
        if (req->cursor.len ? lsm_key_cmp(r.key, r.klen, req->cursor.data, req->cursor.len) <= 0
                            : from->len && lsm_key_cmp(r.key, r.klen, from->data, from->len) < 0)
            continue;
        if (req->prefix.len && !has_prefix(r.key, r.klen, &req->prefix))
            continue;
        size_t lo = 0, hi = *k; /* first item with a larger key */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (lsm_key_cmp(items[mid]->key.data, items[mid]->key.len, r.key, r.klen) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo == limit) {
            more++;
            continue;
        }
        Kv__ScanItem *x = item_of(&r, req->keys_only);
        if (!x) {
            rv = KV_RESOURCE_EXHAUSTED;
            break;
        }
        if (*k == limit) { /* the largest leaves the page */
            item_free(items[limit - 1]);
            (*k)--;
            more++;
        }
        memmove(&items[lo + 1], &items[lo], (*k - lo) * sizeof(*items));
        items[lo] = x;
        (*k)++;
    }
    engine_iter_close(it);
    *done = more == 0;
    return rv;
}

/* One page of this node's engine per req (limits applied); fills rep. */
static kv_err scan_page(node *n, rpc_ctx *c, const Kv__ScanRequest *req, Kv__ScanReply *rep)
{
    size_t limit = req->limit ? req->limit : SCAN_DEFAULT_LIMIT;
    if (limit > SCAN_MAX_LIMIT)
        limit = SCAN_MAX_LIMIT;
    /* where to start: after the cursor, or below max(start, prefix) */
    const ProtobufCBinaryData *from = &req->start;
    if (req->prefix.len &&
        lsm_key_cmp(req->prefix.data, req->prefix.len, from->data, from->len) > 0)
        from = &req->prefix;
    uint8_t *after = NULL;
    size_t after_len = 0;
    bool exact = true;
    if (req->cursor.len) {
        after = malloc(req->cursor.len);
        if (after)
            memcpy(after, req->cursor.data, after_len = req->cursor.len);
    } else if (from->len) {
        after = malloc(from->len);
        if (after)
            after_len = before_start(from->data, from->len, after, &exact);
    }
    if ((req->cursor.len || from->len) && !after)
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    if (strcmp(engine_name(n->eng), "lsm") != 0) { /* iterator not in key order */
        free(after);
        Kv__ScanItem **items = calloc(limit, sizeof(*items));
        size_t k = 0;
        bool done = false;
        kv_err rv =
            items ? scan_unordered(n, req, limit, from, items, &k, &done) : KV_RESOURCE_EXHAUSTED;
        if (rv == KV_OK && k && !(rep->cursor.data = malloc(items[k - 1]->key.len)))
            rv = KV_RESOURCE_EXHAUSTED;
        if (rv != KV_OK) {
            if (items)
                items_free(items, k);
            return rpc_fail(c, rv, "node %s: scan: %s", n->cfg.id, kv_strerror(rv));
        }
        if (k) {
            memcpy(rep->cursor.data, items[k - 1]->key.data, items[k - 1]->key.len);
            rep->cursor.len = items[k - 1]->key.len;
        }
        rep->items = items;
        rep->n_items = k;
        rep->done = done;
        return KV_OK;
    }
    engine_iter_opts o = {.after = after_len ? after : NULL, .after_len = after_len};
    engine_iter *it = NULL;
    kv_err rv = engine_iter_open(n->eng, &o, &it);
    free(after);
    if (rv != KV_OK)
        return rpc_fail(c, rv, "node %s: cannot open an iterator: %s", n->cfg.id, kv_strerror(rv));
    Kv__ScanItem **items = calloc(limit, sizeof(*items));
    size_t k = 0, bytes = 0;
    uint8_t *last = NULL;
    size_t last_len = 0;
    bool done = false;
    if (!items)
        rv = KV_RESOURCE_EXHAUSTED;
    while (rv == KV_OK && k < limit && bytes < SCAN_MAX_BYTES) {
        engine_rec r;
        kv_err e = engine_iter_next(it, &r);
        if (e == KV_NOT_FOUND) {
            done = true;
            break;
        }
        if (e != KV_OK) {
            rv = e;
            break;
        }
        if (!exact && !req->cursor.len && lsm_key_cmp(r.key, r.klen, from->data, from->len) < 0)
            continue; /* below start (see before_start) */
        if (req->prefix.len && !has_prefix(r.key, r.klen, &req->prefix)) {
            if (lsm_key_cmp(r.key, r.klen, req->prefix.data, req->prefix.len) > 0) {
                done = true; /* past every key with the prefix */
                break;
            }
            continue;
        }
        Kv__ScanItem *x = item_of(&r, req->keys_only);
        if (!x) {
            rv = KV_RESOURCE_EXHAUSTED;
            break;
        }
        items[k++] = x;
        bytes += x->key.len + x->value.len;
        last = x->key.data;
        last_len = x->key.len;
    }
    engine_iter_close(it);
    if (rv != KV_OK) {
        items_free(items, k);
        return rpc_fail(c, rv, "node %s: scan: %s", n->cfg.id, kv_strerror(rv));
    }
    rep->n_items = k;
    rep->items = items;
    rep->done = done;
    if (last) { /* the cursor: a copy, the items own their keys */
        rep->cursor.data = malloc(last_len);
        if (!rep->cursor.data) {
            items_free(items, k);
            rep->items = NULL;
            return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
        }
        memcpy(rep->cursor.data, last, last_len);
        rep->cursor.len = last_len;
    } else if (!done) {
        rep->cursor = req->cursor; /* nothing examined: cannot happen with limit >= 1 */
    }
    return KV_OK;
}

kv_err node_h_scan(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__ScanRequest *req = kv__scan_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__ScanRequest body");
    kv_err rv = KV_OK;
    char why[200];
    if (req->start.len > n->cfg.limits.max_key || req->prefix.len > n->cfg.limits.max_key ||
        req->cursor.len > n->cfg.limits.max_key)
        rv = rpc_fail(c, KV_INVALID_ARGUMENT, "start, prefix or cursor longer than %zu bytes",
                      n->cfg.limits.max_key);
    else if (c->map_epoch && node_serving(n, why, sizeof(why)) != KV__SERVING__SERVING)
        rv = rpc_fail(c, KV_UNAVAILABLE, "node %s does not serve reads: %s", n->cfg.id, why);
    c->reply_epoch = cmap_slot_epoch(n->maps);
    Kv__ScanReply rep = KV__SCAN_REPLY__INIT;
    if (rv == KV_OK)
        rv = scan_page(n, c, req, &rep);
    if (rv == KV_OK) {
        rv = rpc_reply_msg(c, &rep.base);
        items_free(rep.items, rep.n_items);
        if (rep.cursor.data != req->cursor.data)
            free(rep.cursor.data);
    }
    kv__scan_request__free_unpacked(req, NULL);
    return rv;
}

/* ---- live keys ---------------------------------------------------------- */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER; /* one count at a time, and the cache */
static struct {
    const node *n;
    uint64_t at_ns, keys;
    bool valid;
} live_cache;

kv_err node_live_keys(node *n, uint64_t *out)
{
    pthread_mutex_lock(&live_mu);
    uint64_t now = kv_now_ns();
    if (live_cache.valid && live_cache.n == n && now - live_cache.at_ns < LIVE_KEYS_REUSE_NS) {
        *out = live_cache.keys;
        pthread_mutex_unlock(&live_mu);
        return KV_OK;
    }
    engine_iter *it = NULL;
    kv_err rv = engine_iter_open(n->eng, NULL, &it);
    cmap *m = cmap_slot_get(n->maps); /* count only the ranges the node replicates */
    uint64_t live = 0, wall = kv_wall_ms();
    while (rv == KV_OK) {
        engine_rec r;
        kv_err e = engine_iter_next(it, &r);
        if (e == KV_NOT_FOUND)
            break;
        if (e != KV_OK)
            rv = e;
        else
            live += !r.tombstone && (!r.expire_at || r.expire_at > wall) &&
                    (!m || node_holds(n, m, r.key, r.klen));
    }
    engine_iter_close(it);
    cmap_unref(m);
    if (rv == KV_OK) {
        live_cache.n = n;
        live_cache.at_ns = kv_now_ns();
        live_cache.keys = live;
        live_cache.valid = true;
        *out = live;
    }
    pthread_mutex_unlock(&live_mu);
    return rv;
}
