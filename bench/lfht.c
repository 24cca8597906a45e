/* SPDX-License-Identifier: MIT */
/*
 * index_bench adaptors for liburcu's lock-free resizable hash table cds_lfht
 * (split-ordered lists, Shalev & Shavit, JACM 2006), memb flavour:
 *  - "lfht": a fixed bucket count (the run's keys / ratio), auto-resize off;
 *  - "lfht-auto": a small initial size (--lfht-init) with CDS_LFHT_AUTO_RESIZE
 *    and CDS_LFHT_ACCOUNTING, grown by liburcu's resize worker during the load.
 * Items mirror the chaining baseline: 8-byte values are updated in place,
 * larger ones replaced with cds_lfht_replace and freed by call_rcu.
 *
 * cds_lfht keeps its bucket count private. The fixed table's bucket memory is
 * size x sizeof(struct cds_lfht_node); the auto-resizing table's is measured:
 * its bucket arrays come from calloc, one array per power-of-two "order" (the
 * allocator liburcu picks for an unbounded table), and index_bench pins
 * M_MMAP_THRESHOLD at 64 KiB, so every order of 4096 nodes or more is an
 * mmapped chunk counted by mallinfo2().hblkhd. The orders double, so the
 * table's size in bytes is the growth of hblkhd (creation to settled table)
 * rounded up to a power of two; tables under 8192 buckets read as their
 * initial size.
 *
 * liburcu 0.13's auto-resize with accounting grows the table, from a resize
 * worker thread, when the global item count (committed in steps of 1024)
 * reaches a power of two with >= 8 items per bucket, to one bucket per item.
 * Started at the run's bucket count (keys / ratio) it would never grow for
 * 4M keys, so lfht-auto starts at 1/8 of it (--lfht-init to choose), the
 * largest start that still grows during the load. Smaller starts are not the
 * default because on the shared 2-core machine the resize worker sometimes
 * never caught up with two loaders: from 1024 buckets a 4M-key load was
 * still running after 7 minutes (one run; another from 1024 grew in seconds,
 * and from 1 bucket it never finished in 400 s). The settled size depends on
 * the start and on how far the resize lags behind the load (a late resize
 * sees a larger count), so the JSON reports it ("final_buckets",
 * "bucket_bytes").
 *
 * Like HotRing, this file calls liburcu through its library entry points
 * (no _LGPL_SOURCE inlining), so both pay the same read-side cost.
 */
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <urcu/urcu-memb.h>
#include <urcu/rculfhash.h>

#include "bench/index_impl.h"
#include "common/hash.h"
#include "common/log.h"

#define LF_SEED UINT64_C(0x6c666874)

typedef struct lf_item {
    struct cds_lfht_node node;
    uint32_t klen, vlen;
    _Atomic uint64_t val8; /* the value when vlen <= 8 */
    struct rcu_head rcu;
    unsigned char data[]; /* key, then the value when vlen > 8 */
} lf_item;

/* The record metadata sits right after the key (so a walk that compares keys
 * touches the same bytes as without it), then comes a value over 8 bytes. */
static inline size_t meta_off(size_t klen)
{
    return (klen + 7) & ~(size_t)7;
}

typedef struct lf_index {
    struct cds_lfht *ht;
    bool autosize;
    uint64_t buckets;     /* initial (and, fixed, final) bucket count */
    size_t mmapped_start; /* mallinfo2().hblkhd before creation */
    uint64_t measured;    /* settled bucket bytes (auto) */
} lf_index;

typedef struct lf_key {
    const void *key;
    size_t klen;
} lf_key;

static int lf_match(struct cds_lfht_node *node, const void *arg)
{
    const lf_item *it = caa_container_of(node, lf_item, node);
    const lf_key *k = arg;
    if (it->klen != k->klen)
        return 0;
    if (k->klen == 8) {
        uint64_t a, b;
        memcpy(&a, it->data, 8);
        memcpy(&b, k->key, 8);
        return a == b;
    }
    return memcmp(it->data, k->key, k->klen) == 0;
}

static kv_err lf_open_common(void **h, const ib_params *p, bool autosize)
{
    lf_index *x = calloc(1, sizeof(*x));
    if (!x)
        return KV_RESOURCE_EXHAUSTED;
    x->autosize = autosize;
    x->buckets = autosize ? p->lfht_init : p->buckets;
    x->mmapped_start = mallinfo2().hblkhd;
    if (autosize)
        x->ht = cds_lfht_new_flavor(p->lfht_init, 1, 0, CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING,
                                    &urcu_memb_flavor, NULL);
    else
        x->ht = cds_lfht_new_flavor(p->buckets, p->buckets, p->buckets, 0, &urcu_memb_flavor, NULL);
    if (!x->ht) {
        free(x);
        return KV_RESOURCE_EXHAUSTED;
    }
    *h = x;
    return KV_OK;
}

static kv_err lf_open(void **h, const ib_params *p)
{
    return lf_open_common(h, p, false);
}

static kv_err lf_open_auto(void **h, const ib_params *p)
{
    return lf_open_common(h, p, true);
}

static void lf_free_rcu(struct rcu_head *h)
{
    free(caa_container_of(h, lf_item, rcu));
}

/* Empties the table (it must be empty to be destroyed), then frees it. The
 * caller is a registered RCU thread and no other thread uses the table. */
static void lf_close(void *h)
{
    lf_index *x = h;
    if (!x)
        return;
    struct cds_lfht_iter iter;
    lf_item *it;
    size_t n = 0, cap = 1024;
    lf_item **all = malloc(cap * sizeof(*all));
    urcu_memb_read_lock();
    cds_lfht_for_each_entry(x->ht, &iter, it, node)
    {
        if (cds_lfht_del(x->ht, &it->node) != 0)
            continue;
        if (n == cap) {
            lf_item **bigger = realloc(all, 2 * cap * sizeof(*all));
            if (!bigger) { /* out of memory at shutdown: let RCU free it */
                urcu_memb_call_rcu(&it->rcu, lf_free_rcu);
                continue;
            }
            all = bigger;
            cap *= 2;
        }
        all[n++] = it;
    }
    urcu_memb_read_unlock();
    urcu_memb_synchronize_rcu();
    for (size_t i = 0; i < n; i++)
        free(all[i]);
    free(all);
    urcu_memb_barrier();
    if (cds_lfht_destroy(x->ht, NULL) != 0)
        KV_WARN("index_bench", "cds_lfht_destroy failed");
    free(x);
}

static void lf_copy(const lf_item *it, void *val, size_t cap)
{
    size_t n = it->vlen < cap ? it->vlen : cap;
    if (it->vlen <= 8) {
        uint64_t v = atomic_load_explicit(&it->val8, memory_order_relaxed);
        memcpy(val, &v, n);
    } else {
        memcpy(val, it->data + meta_off(it->klen) + sizeof(ib_meta), n);
    }
}

static bool lf_get(void *h, const void *key, size_t klen, void *val, size_t cap, ib_probe *pr)
{
    lf_index *x = h;
    lf_key k = {key, klen};
    struct cds_lfht_iter iter;
    bool hit = false;
    /* cds_lfht does not tell how many nodes a lookup visited */
    urcu_memb_read_lock();
    cds_lfht_lookup(x->ht, kv_hash64(key, klen, LF_SEED), lf_match, &k, &iter);
    struct cds_lfht_node *node = cds_lfht_iter_get_node(&iter);
    if (node) {
        const lf_item *it = caa_container_of(node, lf_item, node);
        lf_copy(it, val, cap);
        memcpy(&pr->meta, it->data + meta_off(it->klen), sizeof(pr->meta));
        hit = true;
    }
    urcu_memb_read_unlock();
    return hit;
}

static lf_item *lf_item_new(const void *key, size_t klen, const void *val, size_t vlen)
{
    lf_item *it = malloc(sizeof(*it) + meta_off(klen) + sizeof(ib_meta) + (vlen > 8 ? vlen : 0));
    if (!it)
        return NULL;
    cds_lfht_node_init(&it->node);
    it->klen = (uint32_t)klen;
    it->vlen = (uint32_t)vlen;
    memcpy(it->data, key, klen);
    memset(it->data + meta_off(klen), 0, sizeof(ib_meta));
    uint64_t v = 0;
    if (vlen <= 8)
        memcpy(&v, val, vlen);
    else
        memcpy(it->data + meta_off(klen) + sizeof(ib_meta), val, vlen);
    atomic_init(&it->val8, v);
    return it;
}

/* One attempt inside a read-side section: in-place store, replace or unique
 * add. *nu is allocated on first need; *linked says whether it went in. */
static kv_err lf_put_once(lf_index *x, const lf_key *k, unsigned long hash, const void *val,
                          size_t vlen, lf_item **nu, bool *linked)
{
    struct cds_lfht_iter iter;
    cds_lfht_lookup(x->ht, hash, lf_match, k, &iter);
    struct cds_lfht_node *node = cds_lfht_iter_get_node(&iter);
    lf_item *cur = node ? caa_container_of(node, lf_item, node) : NULL;
    if (cur && cur->vlen <= 8 && cur->vlen == vlen) {
        uint64_t v = 0;
        memcpy(&v, val, vlen);
        atomic_store_explicit(&cur->val8, v, memory_order_relaxed);
        return KV_OK;
    }
    if (!*nu && !(*nu = lf_item_new(k->key, k->klen, val, vlen)))
        return KV_RESOURCE_EXHAUSTED;
    if (cur) {
        if (cds_lfht_replace(x->ht, &iter, hash, lf_match, k, &(*nu)->node) != 0)
            return KV_ABORTED; /* removed or replaced meanwhile: retry */
        urcu_memb_call_rcu(&cur->rcu, lf_free_rcu);
        *linked = true;
        return KV_OK;
    }
    if (cds_lfht_add_unique(x->ht, hash, lf_match, k, &(*nu)->node) != &(*nu)->node)
        return KV_ABORTED; /* another thread added the key first: retry */
    *linked = true;
    return KV_OK;
}

static kv_err lf_put(void *h, const void *key, size_t klen, const void *val, size_t vlen)
{
    lf_index *x = h;
    lf_key k = {key, klen};
    unsigned long hash = kv_hash64(key, klen, LF_SEED);
    lf_item *nu = NULL;
    bool linked = false;
    kv_err rv;
    do {
        urcu_memb_read_lock();
        rv = lf_put_once(x, &k, hash, val, vlen, &nu, &linked);
        urcu_memb_read_unlock();
    } while (rv == KV_ABORTED);
    if (!linked)
        free(nu);
    return rv;
}

/* Waits until liburcu's resize worker has stopped growing the table: the
 * mmapped bucket arrays stay unchanged for 300 ms. */
static void lf_settle(void *h)
{
    lf_index *x = h;
    if (!x->autosize)
        return;
    size_t last = 0;
    int stable = 0;
    for (int i = 0; i < 600 && stable < 3; i++) {
        urcu_memb_barrier();
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
        size_t now = mallinfo2().hblkhd;
        stable = now == last ? stable + 1 : 0;
        last = now;
    }
    uint64_t grown = last > x->mmapped_start ? last - x->mmapped_start : 0, pow2 = 1;
    while (pow2 < grown)
        pow2 <<= 1;
    uint64_t initial = x->buckets * sizeof(struct cds_lfht_node);
    x->measured = pow2 > initial ? pow2 : initial;
}

static uint64_t lf_bucket_bytes(void *h)
{
    lf_index *x = h;
    if (x->autosize)
        return x->measured;
    return x->buckets * sizeof(struct cds_lfht_node);
}

static uint64_t lf_buckets(void *h)
{
    return lf_bucket_bytes(h) / sizeof(struct cds_lfht_node);
}

static uint64_t lf_item_bytes(void *h, size_t klen, size_t vlen)
{
    (void)h;
    return sizeof(lf_item) + meta_off(klen) + sizeof(ib_meta) + (vlen > 8 ? vlen : 0);
}

const ib_impl ib_lfht_impl = {
    .name = "lfht",
    .open = lf_open,
    .close = lf_close,
    .thread_enter = urcu_memb_register_thread,
    .thread_exit = urcu_memb_unregister_thread,
    .get = lf_get,
    .put = lf_put,
    .bucket_bytes = lf_bucket_bytes,
    .buckets = lf_buckets,
    .item_bytes = lf_item_bytes,
};

const ib_impl ib_lfht_auto_impl = {
    .name = "lfht-auto",
    .open = lf_open_auto,
    .close = lf_close,
    .thread_enter = urcu_memb_register_thread,
    .thread_exit = urcu_memb_unregister_thread,
    .get = lf_get,
    .put = lf_put,
    .settle = lf_settle,
    .bucket_bytes = lf_bucket_bytes,
    .buckets = lf_buckets,
    .item_bytes = lf_item_bytes,
};
