/* SPDX-License-Identifier: MIT */
/*
 * HotRing lock-free rehash (paper §3.4), driven by access cost: each thread
 * keeps a window of items visited per operation in its stats shard; when a
 * window's average exceeds hr_opts.rehash_cost (and the table holds more
 * items than buckets) the index's rehash worker doubles the table. Tables
 * never shrink.
 *
 * Buckets use the top bits of the tag (the top 32 bits of the key's hash) and
 * rings are ordered by (tag, key), so doubling splits every ring into its
 * lower and upper halves (up to 2^32 buckets, where every tag bit is used):
 *  1. Initialisation: allocate the new table (twice the buckets) and publish
 *     it as idx->aux (only head fixes look at it).
 *  2. Split: insert two rehash items (Rehash bit set, empty key, sorting
 *     before every real item of their tag) into each old ring i: R0 at the
 *     ring's lowest tag and R1 at the midpoint; they become the heads of new
 *     buckets 2i and 2i+1. A search from R0 for a lower key stops at R1 at
 *     the latest; from R1 an upper key stops at the wrap to R0. Then swap
 *     idx->cur to the new table and wait for a grace period, after which no
 *     thread uses the old table.
 *  3. Deletion: close each half into its own ring (the last lower item's next
 *     CASes from R1 to R0, the last upper item's from R0 to R1; concurrent
 *     inserts make the CAS fail and the step is retried), then delete R0 and
 *     R1 like ordinary items (Occupied bit, head inheritance, helping unlink).
 *     After a last grace period the old bucket array is freed.
 * Readers and writers never wait for the rehash: they run throughout, on
 * whichever table they loaded, in their own read-side sections. Only the
 * worker (or a hr_rehash() caller) blocks, in synchronize_rcu(). This is a
 * hard rule, not an optimisation: the worker's synchronize_rcu() waits for
 * every read-side section, so an operation that waited (spun) inside its
 * section for the next rehash phase would deadlock with it. Each
 * intermediate state is therefore a complete index on its own (hr_ring.c,
 * "No waiting for the rehash"): after step 2 a bucket of the new table may
 * hold nothing but its split item, whose link still leads into the other
 * half; walks treat that as a one-item ring (hr_wfind) or end by cycle
 * detection (hr_walk) instead of waiting for step 3 to close the half.
 */
#include <stdlib.h>

#include "common/log.h"
#include "node/index/hr_internal.h"

static void hr_totals(hr_index *idx, uint64_t *reads, uint64_t *visited)
{
    *reads = *visited = 0;
    for (int i = 0; i < HR_SHARDS; i++) {
        *reads += atomic_load_explicit(&idx->shards[i].c[HR_C_READS], memory_order_relaxed);
        *visited += atomic_load_explicit(&idx->shards[i].c[HR_C_VISITED], memory_order_relaxed);
    }
}

static uint64_t hr_items(hr_index *idx)
{
    uint64_t n = 0;
    for (int i = 0; i < HR_SHARDS; i++)
        n += atomic_load_explicit(&idx->shards[i].c[HR_C_ITEMS], memory_order_relaxed);
    return n;
}

/* Average items visited per read since the last rehash (or since open). */
static double hr_cost_since(hr_index *idx)
{
    uint64_t r, v;
    hr_totals(idx, &r, &v);
    r -= atomic_load(&idx->base_reads);
    v -= atomic_load(&idx->base_visited);
    return r ? (double)v / (double)r : 0.0;
}

static void hr_after_log(hr_index *idx)
{
    uint64_t r, v;
    hr_totals(idx, &r, &v);
    if (r - atomic_load(&idx->base_reads) < HR_COST_WINDOW)
        return;
    int one = 1;
    if (atomic_compare_exchange_strong(&idx->after_pending, &one, 0))
        KV_INFO("hotring", "rehash %llu settled: access cost after %.2f items/read",
                (unsigned long long)atomic_load(&idx->rehashes), hr_cost_since(idx));
}

void hr_cost_window_end(hr_index *idx, hr_shard *s)
{
    uint64_t ops = atomic_load_explicit(&s->c[HR_C_READS], memory_order_relaxed) +
                   atomic_load_explicit(&s->c[HR_C_WRITES], memory_order_relaxed);
    uint64_t vis = atomic_load_explicit(&s->c[HR_C_VISITED], memory_order_relaxed) +
                   atomic_load_explicit(&s->c[HR_C_WVISITED], memory_order_relaxed);
    uint64_t ops0 = atomic_load_explicit(&s->c[HR_C_WIN_OPS], memory_order_relaxed);
    uint64_t vis0 = atomic_load_explicit(&s->c[HR_C_WIN_VIS], memory_order_relaxed);
    /* Reads and writes each end a window at their own multiples: a window
     * shorter than half the nominal one goes on into the next. */
    if (ops - ops0 < HR_COST_WINDOW / 2)
        return;
    atomic_store_explicit(&s->c[HR_C_WIN_OPS], ops, memory_order_relaxed);
    atomic_store_explicit(&s->c[HR_C_WIN_VIS], vis, memory_order_relaxed);
    ops -= ops0;
    vis -= vis0;
    if (atomic_load_explicit(&idx->after_pending, memory_order_relaxed))
        hr_after_log(idx);
    uint64_t items = hr_items(idx), nb = atomic_load(&idx->nb);
    atomic_store_explicit(&idx->avg_ring, (unsigned)((items + nb - 1) / nb), memory_order_relaxed);
    if (!idx->rehash || (double)vis / (double)ops <= idx->rehash_cost ||
        atomic_load_explicit(&idx->rehash_want, memory_order_relaxed) || items <= nb)
        return;
    int zero = 0;
    if (atomic_compare_exchange_strong(&idx->rehash_want, &zero, 1)) {
        pthread_mutex_lock(&idx->wk_lock);
        pthread_cond_signal(&idx->wk_cond);
        pthread_mutex_unlock(&idx->wk_lock);
    }
}

/* Points the last item before `to` (walking from `from`) back at `from`. */
static void hr_close_half(hr_index *idx, hr_item *from, hr_item *to)
{
    for (;;) {
        hr_item *p = from;
        uint64_t pw = atomic_load_explicit(&p->next, memory_order_acquire);
        bool ok = true;
        while (ok && hr_addr(pw) != to) {
            hr_item *n = hr_addr(pw);
            uint64_t nw = atomic_load_explicit(&n->next, memory_order_acquire);
            if (nw & HR_N_OCC) {
                ok = hr_help_unlink(idx, p, &pw, n, nw);
            } else {
                p = n;
                pw = nw;
            }
        }
        /* CAS site: the last item of one half. Protects: it is live and still
         * points at the other half's rehash item; closes the half's ring. */
        if (ok && !(pw & HR_N_OCC) &&
            atomic_compare_exchange_strong(&p->next, &pw, hr_with_addr(pw, from)))
            return;
    }
}

static void hr_set_sibling(hr_item *r, hr_item *sib)
{
    atomic_store_explicit(&r->val, (uint64_t)(uintptr_t)sib, memory_order_relaxed);
}

static void hr_split_phase(hr_index *idx, hr_table *old, hr_table *nt, hr_item **ri)
{
    for (uint64_t i = 0; i < old->nb; i++) {
        uint32_t lo = (uint32_t)(i << (32 - old->bits));
        ri[2 * i]->tag = lo;
        ri[2 * i + 1]->tag = lo | (UINT32_C(1) << (31 - old->bits));
        hr_set_sibling(ri[2 * i], ri[2 * i + 1]);
        hr_set_sibling(ri[2 * i + 1], ri[2 * i]);
        hr_rcu_lock();
        (void)hr_insert_item(idx, old, i, ri[2 * i]);
        (void)hr_insert_item(idx, old, i, ri[2 * i + 1]);
        atomic_store(&nt->heads[2 * i], (uint64_t)(uintptr_t)ri[2 * i]);
        atomic_store(&nt->heads[2 * i + 1], (uint64_t)(uintptr_t)ri[2 * i + 1]);
        hr_rcu_unlock();
    }
}

static void hr_delete_phase(hr_index *idx, hr_table *nt, hr_item **ri)
{
    for (uint64_t j = 0; j < nt->nb; j += 2) {
        hr_rcu_lock();
        hr_close_half(idx, ri[j], ri[j + 1]);
        hr_close_half(idx, ri[j + 1], ri[j]);
        hr_delete_item(idx, nt, j, ri[j]);
        hr_delete_item(idx, nt, j + 1, ri[j + 1]);
        hr_rcu_unlock();
    }
}

static hr_item **hr_rehash_items(uint64_t n)
{
    hr_item **ri = calloc(n, sizeof(*ri));
    for (uint64_t i = 0; ri && i < n; i++) {
        if (!(ri[i] = hr_item_new_rehash(0))) {
            while (i--)
                hr_item_free(ri[i]);
            free(ri);
            return NULL;
        }
    }
    return ri;
}

kv_err hr_rehash(hr_index *idx)
{
    if (!idx)
        return KV_INVALID_ARGUMENT;
    pthread_mutex_lock(&idx->rh_lock);
    hr_table *old = atomic_load(&idx->cur), *nt = NULL;
    hr_item **ri = NULL;
    if (old->bits >= HR_MAX_BITS || !(nt = hr_table_new(old->bits + 1)) ||
        !(ri = hr_rehash_items(nt->nb))) {
        free(nt);
        pthread_mutex_unlock(&idx->rh_lock);
        return KV_RESOURCE_EXHAUSTED;
    }
    double before = hr_cost_since(idx);
    uint64_t old_nb = old->nb;
    atomic_store(&idx->aux, nt);
    hr_split_phase(idx, old, nt, ri);
    atomic_store(&idx->cur, nt);
    atomic_store(&idx->nb, nt->nb);
    atomic_store(&idx->aux, old);
    hr_sync_rcu();
    hr_delete_phase(idx, nt, ri);
    atomic_store(&idx->aux, NULL);
    hr_sync_rcu();
    free(old);
    free(ri);
    uint64_t r, v;
    hr_totals(idx, &r, &v);
    atomic_store(&idx->base_reads, r);
    atomic_store(&idx->base_visited, v);
    uint64_t n = atomic_fetch_add(&idx->rehashes, 1) + 1;
    atomic_store(&idx->after_pending, 1);
    KV_INFO("hotring", "rehash %llu: %llu -> %llu buckets, access cost before %.2f items/read",
            (unsigned long long)n, (unsigned long long)old_nb, (unsigned long long)nt->nb, before);
    pthread_mutex_unlock(&idx->rh_lock);
    return KV_OK;
}

static void *hr_worker_main(void *arg)
{
    hr_index *idx = arg;
    urcu_memb_register_thread();
    pthread_mutex_lock(&idx->wk_lock);
    while (!atomic_load(&idx->stop)) {
        if (!atomic_load(&idx->rehash_want)) {
            pthread_cond_wait(&idx->wk_cond, &idx->wk_lock);
            continue;
        }
        pthread_mutex_unlock(&idx->wk_lock);
        kv_err rv = hr_rehash(idx);
        if (rv != KV_OK)
            KV_WARN("hotring", "rehash failed: %s", kv_strerror(rv));
        atomic_store(&idx->rehash_want, 0);
        pthread_mutex_lock(&idx->wk_lock);
    }
    pthread_mutex_unlock(&idx->wk_lock);
    urcu_memb_unregister_thread();
    return NULL;
}

int hr_worker_start(hr_index *idx)
{
    pthread_mutex_init(&idx->wk_lock, NULL);
    pthread_cond_init(&idx->wk_cond, NULL);
    if (pthread_create(&idx->worker, NULL, hr_worker_main, idx) != 0) {
        pthread_cond_destroy(&idx->wk_cond);
        pthread_mutex_destroy(&idx->wk_lock);
        return -1;
    }
    idx->has_worker = true;
    return 0;
}

void hr_worker_stop(hr_index *idx)
{
    if (!idx->has_worker)
        return;
    pthread_mutex_lock(&idx->wk_lock);
    atomic_store(&idx->stop, 1);
    pthread_cond_signal(&idx->wk_cond);
    pthread_mutex_unlock(&idx->wk_lock);
    pthread_join(idx->worker, NULL);
    pthread_cond_destroy(&idx->wk_cond);
    pthread_mutex_destroy(&idx->wk_lock);
    idx->has_worker = false;
}
