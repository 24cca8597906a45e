/* SPDX-License-Identifier: MIT */
/*
 * Lock-free chaining hash (the index_bench baseline, see chain.h).
 *
 * Design. The index is an array of 2^k bucket heads; bucket = xxh64(key) & mask.
 * Each bucket holds an unordered singly linked chain, newest insert first, as
 * in Memcached's assoc table (but without its item locks). Every link word
 * (bucket head or item->next) holds an item pointer whose low bit, MARK, says
 * "the item owning this word is being replaced" — the same idea as the
 * Occupied bit of HotRing (FAST'20, §3.3) and the marked pointers of Harris
 * (DISC'01), used here only for replacement because the index never deletes.
 *
 *  - get: inside an RCU read-side section, walk from the head, comparing keys;
 *    strip MARK from every next word. Wait-free: bounded by the chain length
 *    (chains only grow by inserts that happen after the read began).
 *  - insert (key absent): new->next = head; CAS(bucket, head, new). A failed
 *    CAS means another insert (or a replacement of the first item) won; walk
 *    again, since the winner may have inserted the same key. Lock-free.
 *  - update, value <= 8 bytes: a relaxed atomic store of the value word,
 *    readers load it atomically (what HotRing does for small values).
 *  - update, larger value (read-copy-update): to replace item X found through
 *    link L (bucket head or predecessor's next):
 *      1. CAS(X->next, n, n|MARK) claims X; nobody may change X->next now, so
 *         a concurrent replacement of X's successor fails its step 2 and
 *         retries instead of being lost.
 *      2. X'->next = n; CAS(L, X, X'). L changed (an insert at the head, or
 *         the predecessor is itself marked) => store X->next = n (unmark) and
 *         retry from the bucket head.
 *      3. call_rcu frees X after a grace period; readers that were on X still
 *         follow X->next (marked, stripped) to n, so they see every item once.
 *    Items are never freed inside a read-side section that can reach them, so
 *    there is no ABA on the link words. Replacement is obstruction-free: a
 *    writer stalled between steps 1 and 2 delays writers of X and of X's
 *    successor, never readers or inserts.
 *
 * Ordering: CAS and unmark stores are release (publish the new item's
 * contents), link loads are acquire. The in-place value word is relaxed: it is
 * the datum itself and carries no other data.
 *
 * Like HotRing, this file calls liburcu through its library entry points
 * (no _LGPL_SOURCE inlining), so both pay the same read-side cost, and
 * hashes keys with the same function (kv_hash64, another seed).
 */
#include "bench/chain.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <urcu/urcu-memb.h>

#include "bench/index_impl.h"
#include "common/hash.h"

#define MARK ((uintptr_t)1)
#define CHAIN_SEED UINT64_C(0x636861696e)

typedef struct chain_item {
    _Atomic uintptr_t next; /* chain_item * | MARK */
    uint32_t klen, vlen;
    _Atomic uint64_t val8; /* the value when vlen <= 8 */
    struct rcu_head rcu;
    unsigned char data[]; /* key, then the value when vlen > 8 */
} chain_item;

/* The record metadata sits right after the key (so a walk that compares keys
 * touches the same bytes as without it), then comes a value over 8 bytes. */
static inline size_t meta_off(size_t klen)
{
    return (klen + 7) & ~(size_t)7;
}

struct ib_chain {
    uint64_t mask;
    _Atomic uintptr_t *heads;
};

static inline chain_item *item_of(uintptr_t w)
{
    return (chain_item *)(w & ~MARK);
}

static inline bool key_eq(const chain_item *it, const void *key, size_t klen)
{
    if (it->klen != klen)
        return false;
    if (klen == 8) { /* the benchmark's keys: one word compare */
        uint64_t a, b;
        memcpy(&a, it->data, 8);
        memcpy(&b, key, 8);
        return a == b;
    }
    return memcmp(it->data, key, klen) == 0;
}

static inline _Atomic uintptr_t *bucket_of(ib_chain *c, const void *key, size_t klen)
{
    return &c->heads[kv_hash64(key, klen, CHAIN_SEED) & c->mask];
}

kv_err ib_chain_open(ib_chain **out, uint64_t buckets)
{
    if (buckets == 0 || buckets > (UINT64_C(1) << 40))
        return KV_INVALID_ARGUMENT;
    uint64_t n = 1;
    while (n < buckets)
        n <<= 1;
    ib_chain *c = calloc(1, sizeof(*c));
    if (!c || !(c->heads = calloc(n, sizeof(*c->heads)))) {
        free(c);
        return KV_RESOURCE_EXHAUSTED;
    }
    c->mask = n - 1;
    *out = c;
    return KV_OK;
}

void ib_chain_close(ib_chain *c)
{
    if (!c)
        return;
    urcu_memb_barrier(); /* pending call_rcu frees of replaced items */
    for (uint64_t b = 0; b <= c->mask; b++) {
        chain_item *it = item_of(atomic_load_explicit(&c->heads[b], memory_order_relaxed));
        while (it) {
            chain_item *next = item_of(atomic_load_explicit(&it->next, memory_order_relaxed));
            free(it);
            it = next;
        }
    }
    free(c->heads);
    free(c);
}

uint64_t ib_chain_buckets(const ib_chain *c)
{
    return c->mask + 1;
}

uint64_t ib_chain_count(ib_chain *c)
{
    uint64_t n = 0;
    urcu_memb_read_lock();
    for (uint64_t b = 0; b <= c->mask; b++)
        for (chain_item *it = item_of(atomic_load_explicit(&c->heads[b], memory_order_acquire)); it;
             it = item_of(atomic_load_explicit(&it->next, memory_order_acquire)))
            n++;
    urcu_memb_read_unlock();
    return n;
}

static void copy_value(const chain_item *it, void *val, size_t cap)
{
    size_t n = it->vlen < cap ? it->vlen : cap;
    if (it->vlen <= 8) {
        uint64_t v = atomic_load_explicit(&it->val8, memory_order_relaxed);
        memcpy(val, &v, n);
    } else {
        memcpy(val, it->data + meta_off(it->klen) + sizeof(ib_meta), n);
    }
}

bool ib_chain_get(ib_chain *c, const void *key, size_t klen, void *val, size_t cap, size_t *vlen,
                  uint32_t *visited, ib_meta *meta)
{
    _Atomic uintptr_t *head = bucket_of(c, key, klen);
    uint32_t seen = 0;
    bool found = false;
    urcu_memb_read_lock();
    chain_item *it = item_of(atomic_load_explicit(head, memory_order_acquire));
    for (; it; it = item_of(atomic_load_explicit(&it->next, memory_order_acquire))) {
        seen++;
        if (key_eq(it, key, klen)) {
            copy_value(it, val, cap);
            if (meta)
                memcpy(meta, it->data + meta_off(it->klen), sizeof(*meta));
            if (vlen)
                *vlen = it->vlen;
            found = true;
            break;
        }
    }
    urcu_memb_read_unlock();
    if (visited)
        *visited = seen;
    return found;
}

static chain_item *item_new(const void *key, size_t klen, const void *val, size_t vlen)
{
    chain_item *it = malloc(sizeof(*it) + meta_off(klen) + sizeof(ib_meta) + (vlen > 8 ? vlen : 0));
    if (!it)
        return NULL;
    atomic_init(&it->next, 0);
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

static void item_free_rcu(struct rcu_head *h)
{
    free(caa_container_of(h, chain_item, rcu));
}

/* Finds key in the chain of head. Returns the item and the link word that
 * pointed at it (unmarked when read), or NULL; *h0 receives the head word the
 * walk started from. Read-side only. */
static chain_item *find_link(_Atomic uintptr_t *head, const void *key, size_t klen,
                             _Atomic uintptr_t **link, uintptr_t *h0)
{
    _Atomic uintptr_t *l = head;
    *h0 = atomic_load_explicit(head, memory_order_acquire);
    chain_item *it = item_of(*h0);
    while (it && !key_eq(it, key, klen)) {
        l = &it->next;
        it = item_of(atomic_load_explicit(l, memory_order_acquire));
    }
    *link = l;
    return it;
}

/* Steps 1-2 of a replacement (see the design comment). True when cur was
 * replaced by nu; false when the caller must walk again. Read-side only. */
static bool replace(_Atomic uintptr_t *link, chain_item *cur, chain_item *nu)
{
    uintptr_t n = atomic_load_explicit(&cur->next, memory_order_acquire);
    if (n & MARK)
        return false; /* another writer is replacing cur */
    /* CAS: claim cur by marking its next word; fails if cur->next changed
     * (its successor was replaced) or another writer claimed cur first. */
    if (!atomic_compare_exchange_strong_explicit(&cur->next, &n, n | MARK, memory_order_acq_rel,
                                                 memory_order_relaxed))
        return false;
    atomic_store_explicit(&nu->next, n, memory_order_relaxed);
    uintptr_t expect = (uintptr_t)cur;
    /* CAS: swing the link from cur to nu (release publishes nu's contents);
     * fails when an insert changed the bucket head or the predecessor is
     * itself being replaced (its next word is marked). */
    if (atomic_compare_exchange_strong_explicit(link, &expect, (uintptr_t)nu, memory_order_acq_rel,
                                                memory_order_relaxed))
        return true;
    atomic_store_explicit(&cur->next, n, memory_order_release); /* unmark: we own the word */
    return false;
}

/* One attempt at writing key inside a read-side section; *done says whether
 * it took effect, *linked whether *nu (allocated on first need) is now in the
 * chain. */
static kv_err put_once(_Atomic uintptr_t *head, const void *key, size_t klen, const void *val,
                       size_t vlen, chain_item **nu, bool *done, bool *linked)
{
    _Atomic uintptr_t *link;
    uintptr_t h0;
    chain_item *cur = find_link(head, key, klen, &link, &h0);
    if (cur && cur->vlen <= 8 && cur->vlen == vlen) {
        uint64_t v = 0;
        memcpy(&v, val, vlen);
        atomic_store_explicit(&cur->val8, v, memory_order_relaxed);
        *done = true;
        return KV_OK;
    }
    if (!*nu && !(*nu = item_new(key, klen, val, vlen)))
        return KV_RESOURCE_EXHAUSTED;
    if (!cur) {
        atomic_store_explicit(&(*nu)->next, h0, memory_order_relaxed);
        /* CAS: push at the chain head; fails if any writer changed the head
         * since the walk began (it may have inserted this very key): walk
         * again. Inserts only ever happen at the head, so an unchanged head
         * means the walked chain holds every item of this key. */
        *done = *linked = atomic_compare_exchange_strong_explicit(
            head, &h0, (uintptr_t)*nu, memory_order_acq_rel, memory_order_relaxed);
        return KV_OK;
    }
    if ((*done = *linked = replace(link, cur, *nu)))
        urcu_memb_call_rcu(&cur->rcu, item_free_rcu);
    return KV_OK;
}

kv_err ib_chain_put(ib_chain *c, const void *key, size_t klen, const void *val, size_t vlen)
{
    if (klen == 0 || klen > UINT32_MAX || vlen > UINT32_MAX)
        return KV_INVALID_ARGUMENT;
    _Atomic uintptr_t *head = bucket_of(c, key, klen);
    chain_item *nu = NULL;
    bool done = false, linked = false;
    kv_err rv = KV_OK;
    while (!done && rv == KV_OK) {
        urcu_memb_read_lock();
        rv = put_once(head, key, klen, val, vlen, &nu, &done, &linked);
        urcu_memb_read_unlock();
    }
    if (!linked)
        free(nu);
    return rv;
}

/* ---- index_bench glue ---------------------------------------------------------- */

static kv_err chain_open(void **h, const ib_params *p)
{
    return ib_chain_open((ib_chain **)h, p->buckets);
}

static void chain_close(void *h)
{
    ib_chain_close(h);
}

static bool chain_get(void *h, const void *key, size_t klen, void *val, size_t cap, ib_probe *pr)
{
    uint32_t visited;
    bool hit = ib_chain_get(h, key, klen, val, cap, NULL, &visited, &pr->meta);
    pr->visited = visited;
    pr->head = hit && visited == 1;
    return hit;
}

/* Batched reads, the same shape as HotRing's hr_get_batch (index_bench
 * --batch): in chunks of 16 keys inside one read-side section, prefetch every
 * bucket head word, then every first item, then advance every chain that
 * has not reached its key one item per pass (up to 8 items), prefetching
 * each, and only then walk each chain as ib_chain_get does. The look-ahead
 * passes only read and prefetch (items are not freed inside the section). */
#define CHAIN_BATCH 16u
#define CHAIN_AHEAD 8u

static void chain_ahead(chain_item **x, const unsigned char *keys, size_t klen, size_t n)
{
    for (unsigned step = 0; step < CHAIN_AHEAD; step++) {
        bool any = false;
        for (size_t i = 0; i < n; i++) {
            if (!x[i] || key_eq(x[i], keys + i * klen, klen)) {
                x[i] = NULL; /* its walk ends here */
                continue;
            }
            x[i] = item_of(atomic_load_explicit(&x[i]->next, memory_order_acquire));
            if (x[i]) {
                __builtin_prefetch(x[i]);
                any = true;
            }
        }
        if (!any)
            break;
    }
}

static size_t chain_get_chunk(ib_chain *c, const unsigned char *keys, size_t klen, size_t n,
                              unsigned char *vals, size_t cap, ib_meta *metas)
{
    _Atomic uintptr_t *head[CHAIN_BATCH];
    chain_item *x[CHAIN_BATCH];
    size_t hits = 0;
    for (size_t i = 0; i < n; i++) {
        head[i] = bucket_of(c, keys + i * klen, klen);
        __builtin_prefetch(head[i]);
    }
    urcu_memb_read_lock();
    for (size_t i = 0; i < n; i++) {
        x[i] = item_of(atomic_load_explicit(head[i], memory_order_acquire));
        if (x[i])
            __builtin_prefetch(x[i]);
    }
    chain_ahead(x, keys, klen, n);
    for (size_t i = 0; i < n; i++) {
        chain_item *it = item_of(atomic_load_explicit(head[i], memory_order_acquire));
        while (it && !key_eq(it, keys + i * klen, klen))
            it = item_of(atomic_load_explicit(&it->next, memory_order_acquire));
        if (!it)
            continue;
        copy_value(it, vals + i * cap, cap);
        memcpy(&metas[i], it->data + meta_off(it->klen), sizeof(metas[i]));
        hits++;
    }
    urcu_memb_read_unlock();
    return hits;
}

static size_t chain_get_batch(void *h, const unsigned char *keys, size_t klen, size_t n,
                              unsigned char *vals, size_t cap, ib_meta *metas)
{
    size_t hits = 0;
    for (size_t i = 0; i < n; i += CHAIN_BATCH) {
        size_t m = n - i < CHAIN_BATCH ? n - i : CHAIN_BATCH;
        hits += chain_get_chunk(h, keys + i * klen, klen, m, vals + i * cap, cap, metas + i);
    }
    return hits;
}

static kv_err chain_put(void *h, const void *key, size_t klen, const void *val, size_t vlen)
{
    return ib_chain_put(h, key, klen, val, vlen);
}

static uint64_t chain_bucket_bytes(void *h)
{
    return ib_chain_buckets(h) * sizeof(uintptr_t);
}

static uint64_t chain_buckets(void *h)
{
    return ib_chain_buckets(h);
}

static uint64_t chain_item_bytes(void *h, size_t klen, size_t vlen)
{
    (void)h;
    return sizeof(chain_item) + meta_off(klen) + sizeof(ib_meta) + (vlen > 8 ? vlen : 0);
}

const ib_impl ib_chain_impl = {
    .name = "chain",
    .open = chain_open,
    .close = chain_close,
    .thread_enter = urcu_memb_register_thread,
    .thread_exit = urcu_memb_unregister_thread,
    .get = chain_get,
    .get_batch = chain_get_batch,
    .put = chain_put,
    .bucket_bytes = chain_bucket_bytes,
    .buckets = chain_buckets,
    .item_bytes = chain_item_bytes,
    .probes = true,
};
