/* SPDX-License-Identifier: MIT */
/*
 * HotRing keyed API: get / get_batch / upsert / remove / set_flags / pin /
 * iterate on top of the lock-free rings of hr_ring.c, plus open/close and
 * statistics.
 *
 * Record consistency (value + hr_meta). An item's record is its val,
 * version and meta word (seqno, inline value length, flags; see the layout in
 * hr_internal.h), plus seqno/expire_at in the hr_ext block of an EXT item,
 * guarded by the 32-bit seq word: bit 0 = the record is being rewritten (a
 * seqlock's odd state), bit 1 = a writer owns the item, bit 2 = LATE (two
 * grace periods, hr_ring.c), bits 3-4 the item's immutable kind (BIG, EXT),
 * bits 5-30 count completed rewrites, bit 31 = retired. A writer takes
 * ownership with CAS(seq: s -> s|2) from a state with bits 0, 1 and 31
 * clear. To rewrite in place it stores s|3, issues a release fence, rewrites
 * the record with relaxed atomic stores and releases with a store of
 * s + HR_SEQ_STEP (release). A reader loads seq (acquire), waits while bit 0
 * is set, copies the record with relaxed atomic loads, issues an acquire
 * fence and retries if seq changed in any bit but OWNED, LATE and RETIRED.
 * So readers wait only for the handful of stores of an in-place rewrite of
 * that same item (never for a write condition, an allocation or an RCU
 * update), and yield after a short spin. A second, double-buffered record
 * would remove even that wait but would not fit the item's one cache line,
 * and item size is what bounds a memory-bound index.
 *
 * Writers of one key serialise on the ownership bit (a loser backs off and
 * redoes its search). A replacing or deleting writer owns the item, evaluates
 * the write condition on the stable record, sets Occupied (linearisation)
 * and only then releases ownership; a later owner that finds Occupied set
 * drops ownership and retries, so no in-place write can be lost behind an
 * RCU update or a delete. Values of up to 8 bytes (in an item whose value is
 * inline, when the new record fits the item's form: a compact item holds no
 * expire_at and a 48-bit seqno) are updated in place; others by RCU
 * replacement, which costs one new item and one call_rcu. Metadata-only
 * changes (set_flags, pin) are always in place.
 *
 * Every function here takes its own RCU read-side section (memb flavour);
 * callers may already be inside one. hr_close/hr_barrier/hr_rehash must not.
 */
#include <sched.h>
#include <stdlib.h>

#include "common/hash.h"
#include "common/log.h"
#include "node/index/hr_internal.h"

/* ------------------------------------------------------------- records */

/* Does record m (with an inline value) fit an item of this kind? */
static bool hr_rec_fits(uint32_t kind, const hr_meta *m)
{
    return (kind & HR_SEQ_EXT) || (m->seqno <= HR_MW_SEQNO_MAX && m->expire_at == 0);
}

/* Writes the record into x (inline value up to 8 bytes, or a big value's
 * length only: its bytes are immutable). Owner or not-yet-published item. */
static void hr_rec_put(hr_item *x, const void *val, size_t vlen, const hr_meta *m)
{
    uint32_t kind = hr_kind(x);
    uint64_t v = 0, mw = hr_mw(x) & HR_MW_KLEN_MASK;
    if (!(kind & HR_SEQ_BIG)) {
        if (vlen > 0)
            memcpy(&v, val, vlen);
        mw |= (uint64_t)vlen << HR_MW_VLEN_SHIFT;
    }
    mw |= (uint64_t)(m->flags & HR_F_ALL) << HR_MW_FLAGS_SHIFT;
    if (kind & HR_SEQ_EXT) {
        hr_ext *e = hr_ext_of(x);
        atomic_store_explicit(&e->seqno, m->seqno, memory_order_relaxed);
        atomic_store_explicit(&e->expire_at, m->expire_at, memory_order_relaxed);
    } else {
        mw |= m->seqno;
    }
    atomic_store_explicit(&x->val, v, memory_order_relaxed);
    atomic_store_explicit(&x->version, m->version, memory_order_relaxed);
    atomic_store_explicit(&x->mw, mw, memory_order_relaxed);
}

/* What a meta word holds of a record: flags, the inline value's length and
 * (a compact item's) seqno; a compact item has no expiry. */
static inline void hr_mw_decode(uint64_t mw, uint32_t *vlen, hr_meta *m)
{
    m->flags = (uint32_t)((mw & HR_MW_FLAGS_MASK) >> HR_MW_FLAGS_SHIFT);
    *vlen = (uint32_t)((mw & HR_MW_VLEN_MASK) >> HR_MW_VLEN_SHIFT);
    m->seqno = mw & HR_MW_SEQNO_MAX;
    m->expire_at = 0;
}

/* Reads x's record: inline value bytes, value length and metadata. */
static void hr_rec_get(const hr_item *xc, uint32_t kind, uint64_t *val, uint32_t *vlen, hr_meta *m)
{
    hr_item *x = (hr_item *)(uintptr_t)xc;
    uint64_t mw = atomic_load_explicit(&x->mw, memory_order_relaxed);
    *val = atomic_load_explicit(&x->val, memory_order_relaxed);
    m->version = atomic_load_explicit(&x->version, memory_order_relaxed);
    hr_mw_decode(mw, vlen, m);
    if (__builtin_expect(kind & HR_SEQ_EXT, 0)) {
        hr_ext *e = hr_ext_of(x);
        m->seqno = atomic_load_explicit(&e->seqno, memory_order_relaxed);
        m->expire_at = atomic_load_explicit(&e->expire_at, memory_order_relaxed);
        if (kind & HR_SEQ_BIG)
            *vlen = (uint32_t)e->bvlen;
    }
}

static void hr_view_fill(hr_item *x, uint32_t kind, uint32_t vlen, hr_view *v, uint64_t *vbuf)
{
    v->key = hr_item_key(x);
    v->klen = hr_item_klen(x);
    v->val = kind & HR_SEQ_BIG ? (const void *)hr_bigval(x) : (const void *)vbuf;
    v->vlen = vlen;
}

/* hr_snapshot for every form of item, and while a rewrite is in flight. */
static __attribute__((noinline)) void hr_snapshot_slow(hr_item *x, hr_view *v, uint64_t *vbuf)
{
    uint32_t vlen, s;
    for (unsigned spins = 0;; spins++) {
        s = atomic_load_explicit(&x->seq, memory_order_acquire);
        if (s & HR_SEQ_WRITING) { /* an in-place rewrite of this item is in flight */
            if (spins % 128 == 127)
                sched_yield();
            else
                caa_cpu_relax();
            continue;
        }
        hr_rec_get(x, s, vbuf, &vlen, &v->meta);
        atomic_thread_fence(memory_order_acquire);
        uint32_t s2 = atomic_load_explicit(&x->seq, memory_order_relaxed);
        if ((s2 & ~HR_SEQ_NOREC) == (s & ~HR_SEQ_NOREC))
            break;
    }
    hr_view_fill(x, s, vlen, v, vbuf);
}

/* Consistent snapshot of x into v; an inline value is copied to *vbuf.
 * The compact item (hr_internal.h: inline value, no hr_ext block, a key
 * under HR_KLEN_LONG bytes) that no writer is rewriting is read in one
 * pass: the seqlock's two loads around the three record words, with one
 * branch for everything else. Every instruction a read runs after its
 * walk counts (bench/README.md, "What a read does after its walk"). */
HR_READ_PATH void hr_snapshot(hr_item *x, hr_view *v, uint64_t *vbuf)
{
    uint32_t s = atomic_load_explicit(&x->seq, memory_order_acquire);
    uint64_t mw = atomic_load_explicit(&x->mw, memory_order_relaxed);
    uint64_t val = atomic_load_explicit(&x->val, memory_order_relaxed);
    uint64_t ver = atomic_load_explicit(&x->version, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire); /* the record loads before the second seq load */
    uint32_t s2 = atomic_load_explicit(&x->seq, memory_order_relaxed);
    unsigned kf = hr_klen_field(mw);
    if (__builtin_expect(
            ((s & (HR_SEQ_WRITING | HR_SEQ_EXT | HR_SEQ_BIG)) | ((s ^ s2) & ~HR_SEQ_NOREC)) != 0 ||
                kf == HR_KLEN_LONG,
            0)) {
        hr_snapshot_slow(x, v, vbuf);
        return;
    }
    uint32_t vlen;
    *vbuf = val;
    v->key = x->key;
    v->klen = kf;
    v->val = vbuf;
    v->meta.version = ver;
    hr_mw_decode(mw, &vlen, &v->meta);
    v->vlen = vlen;
}

/* Snapshot by x's owner: the record cannot change under it. */
static void hr_snapshot_owned(hr_item *x, hr_view *v, uint64_t *vbuf)
{
    uint32_t vlen, kind = hr_kind(x);
    hr_rec_get(x, kind, vbuf, &vlen, &v->meta);
    hr_view_fill(x, kind, vlen, v, vbuf);
}

/* Takes writer ownership of x; false if another writer owns it or x is
 * already logically deleted. */
static bool hr_own(hr_item *x, uint32_t *s)
{
    uint32_t v = atomic_load_explicit(&x->seq, memory_order_relaxed);
    if (v & (HR_SEQ_OWNED | HR_SEQ_WRITING | HR_SEQ_RETIRED))
        return false;
    /* CAS site: x's seq word. Protects: writer exclusion for x's record. */
    if (!atomic_compare_exchange_strong_explicit(&x->seq, &v, v | HR_SEQ_OWNED,
                                                 memory_order_acq_rel, memory_order_relaxed))
        return false;
    if (atomic_load_explicit(&x->next, memory_order_acquire) & HR_N_OCC) {
        /* dead: follow next. A head mover may set HR_SEQ_LATE on a dead item
         * at any time, so drop only our bit (no plain store of v). */
        atomic_fetch_and_explicit(&x->seq, ~HR_SEQ_OWNED, memory_order_release);
        return false;
    }
    *s = v;
    return true;
}

/* Owner only: marks the record as being rewritten (readers wait). */
static void hr_rewrite_begin(hr_item *x, uint32_t s)
{
    atomic_store_explicit(&x->seq, s | HR_SEQ_OWNED | HR_SEQ_WRITING, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* odd seq before the record stores */
}

/* Releases ownership; after a rewrite, publishes it. */
static void hr_disown(hr_item *x, uint32_t s, bool rewritten)
{
    if (rewritten) /* live and owned: nobody else writes seq (LATE marks dead items only) */
        atomic_store_explicit(&x->seq, (s + HR_SEQ_STEP) & ~HR_SEQ_RETIRED, memory_order_release);
    else /* keeps HR_SEQ_RETIRED/LATE, which helpers may set once x is Occupied */
        atomic_fetch_and_explicit(&x->seq, ~HR_SEQ_OWNED, memory_order_release);
}

static HR_TLS unsigned hr_tls_fail_allocs; /* hr_test_fail_allocs */

void hr_test_fail_allocs(unsigned n)
{
    hr_tls_fail_allocs = n;
}

static kv_err hr_item_alloc(const hr_okey *k, const void *val, size_t vlen, const hr_meta *m,
                            hr_item **out)
{
    if (hr_tls_fail_allocs) {
        hr_tls_fail_allocs--;
        return KV_RESOURCE_EXHAUSTED;
    }
    uint32_t kind = vlen > HR_INLINE_MAX ? HR_SEQ_BIG | HR_SEQ_EXT : 0;
    if (!hr_rec_fits(kind, m))
        kind |= HR_SEQ_EXT;
    size_t sz = hr_item_need(k->klen, kind, vlen);
    hr_item *x = hr_mem_alloc(sz);
    if (!x)
        return KV_RESOURCE_EXHAUSTED;
    if ((uintptr_t)x >> 48) {
        KV_ERROR("hotring", "heap address %p does not fit the 48-bit packed words", (void *)x);
        hr_mem_free(x, sz);
        return KV_FAILED_PRECONDITION;
    }
    atomic_init(&x->next, 0);
    x->tag = k->tag;
    atomic_init(&x->seq, kind);
    unsigned kf = k->klen >= HR_KLEN_LONG ? HR_KLEN_LONG : k->klen;
    atomic_init(&x->mw, (uint64_t)kf << HR_MW_KLEN_SHIFT);
    memset(&x->rcu, 0, sizeof(x->rcu));
    unsigned char *kp = x->key;
    if (kf == HR_KLEN_LONG) {
        uint64_t n = k->klen;
        memcpy(kp, &n, sizeof(n));
        kp += sizeof(n);
    }
    memcpy(kp, k->key, k->klen);
    if (kind & HR_SEQ_EXT) {
        hr_ext *e = hr_ext_of(x);
        e->bvlen = kind & HR_SEQ_BIG ? vlen : 0;
        if (kind & HR_SEQ_BIG)
            memcpy((unsigned char *)hr_bigval(x), val, vlen);
    }
    hr_rec_put(x, val, vlen, m);
    *out = x;
    return KV_OK;
}

/* Bytes x takes from the allocator (for the memory statistics). */
static size_t hr_item_bytes(const hr_item *x)
{
    return hr_mem_class_bytes(hr_item_need_of(x));
}

static kv_err hr_check_key(const hr_index *idx, const void *key, size_t klen)
{
    if (!idx || !key || klen == 0 || klen > HR_MAX_KLEN)
        return KV_INVALID_ARGUMENT;
    return KV_OK;
}

static hr_okey hr_okey_make(const void *key, size_t klen)
{
    hr_okey k = {hr_key_tag(key, klen), (uint32_t)klen, key, 0};
    return k;
}

/* Backoff after losing the ownership race for a key: spin, then yield. */
static void hr_backoff(unsigned *spins)
{
    if (++*spins % 64 == 0)
        sched_yield();
    else
        caa_cpu_relax();
}

/* ------------------------------------------------------------------ get */

/* Finishes one read whose head word hw of bucket b of t was loaded in the
 * caller's read-side section (which must still be held): walks the ring,
 * counts the read, calls fn on a hit and feeds the hotspot logic. True on a
 * hit. Inlined into its callers, with hr_snapshot and the cost window: as
 * calls, their prologues, epilogues and arguments were about a quarter of
 * a head hit's instructions in HotRing (callgrind, bench/README.md). */
HR_READ_PATH bool hr_read_at(hr_index *idx, hr_shard *s, hr_table *t, uint64_t b, uint64_t hw,
                             const hr_okey *k, hr_visit_fn fn, void *arg)
{
    hr_item *x = hr_addr(hw), *hit = NULL;
    unsigned visited = 0;
    if (x)
        hit = hr_walk(t, b, k, x, &visited);
    hr_count_access(idx, s, HR_C_READS, HR_C_VISITED, visited);
    if (hit && hit == x)
        hr_cnt_bump(s, HR_C_HEADHITS, 1);
    if (hit) {
        hr_view v;
        uint64_t vbuf;
        uint32_t flags;
        if (fn) {
            hr_snapshot(hit, &v, &vbuf);
            flags = v.meta.flags;
        } else {
            flags = hr_cur_flags(hit);
        }
        if (__builtin_expect(flags & HR_F_PINNED, 0)) {
            hr_cnt_bump(s, HR_C_PINNED, 1);
            if (hit == x)
                hr_cnt_bump(s, HR_C_PINHEAD, 1);
        }
        if (fn)
            fn(arg, &v);
    }
    hr_hot_access(idx, t, b, hw, hit, hit);
    return hit != NULL;
}

kv_err hr_get(hr_index *idx, const void *key, size_t klen, hr_visit_fn fn, void *arg)
{
    kv_err rv = hr_check_key(idx, key, klen);
    if (rv != KV_OK)
        return rv;
    hr_okey k = hr_okey_make(key, klen);
    hr_rcu_lock();
    hr_table *t = atomic_load_explicit(&idx->cur, memory_order_acquire);
    uint64_t b = hr_bucket(t, k.tag);
    uint64_t hw = atomic_load_explicit(&t->heads[b], memory_order_acquire);
    bool hit = hr_read_at(idx, hr_my_shard(idx), t, b, hw, &k, fn, arg);
    hr_rcu_unlock();
    return hit ? KV_OK : KV_NOT_FOUND;
}

/* Batched reads (hr_get_batch). A head hit costs two dependent cache misses,
 * the bucket word and then the head item (whose first line holds everything
 * a hit reads, hr_internal.h), and a lone hr_get cannot overlap them with
 * anything. A batch is processed in software-pipelined passes over chunks
 * of HR_BATCH keys inside one read-side section: hash every key and
 * prefetch its bucket word; load every head word and prefetch its item;
 * then finish each read as hr_get does. The misses of a chunk are thus in
 * flight together, so a chunk of head hits costs about two miss latencies
 * instead of two per key. Walks past the head (cold keys) stay dependent
 * chains. Every head word is loaded with acquire inside the section that
 * walks from it, exactly as in hr_get; the table pointer is loaded once per
 * chunk, which is what a slow hr_get does (the rehash keeps an old table a
 * complete index until a grace period after the swap, hr_rehash.c). */
#define HR_BATCH 16u

typedef struct hr_batch_arg {
    hr_visit_at_fn fn;
    void *arg;
    size_t i;
} hr_batch_arg;

static void hr_batch_visit(void *arg, const hr_view *v)
{
    hr_batch_arg *a = arg;
    a->fn(a->arg, a->i, v);
}

/* Does a key of tag kt fall strictly between ring neighbours of tags pt and
 * xt (the ring ends there for it)? pt > xt: xt is the ring's minimum. */
static bool hr_tag_gap(uint32_t pt, uint32_t xt, uint32_t kt)
{
    return pt < xt ? pt < kt && kt < xt : pt > xt && (kt > pt || kt < xt);
}

/* Prefetches the walks that do not end at the head: one ring step per pass
 * for every key of the chunk, so that the walks' misses are in flight
 * together too (up to HR_BATCH_AHEAD items per key). A key stops at the
 * first item of its tag or where the order says its walk ends. This pass
 * only reads and prefetches: the walks themselves (hr_walk) follow, and a
 * stale or odd path here (a head move, an insert, a rehash split item)
 * costs at most a useless prefetch. Items are read as a walk reads them
 * (next with acquire, then the immutable tag), inside the chunk's read-side
 * section, so none of them can be freed meanwhile. */
#define HR_BATCH_AHEAD 8u
static void hr_batch_ahead(const hr_okey *k, const uint64_t *hw, size_t n)
{
    hr_item *x[HR_BATCH];
    uint32_t pt[HR_BATCH];
    size_t live = 0;
    for (size_t i = 0; i < n; i++) {
        x[i] = hr_addr(hw[i]);
        live += x[i] != NULL;
    }
    for (unsigned step = 0; step < HR_BATCH_AHEAD && live > 0; step++) {
        for (size_t i = 0; i < n; i++) {
            if (!x[i])
                continue;
            uint32_t xt = x[i]->tag;
            if (xt == k[i].tag || (step > 0 && hr_tag_gap(pt[i], xt, k[i].tag))) {
                x[i] = NULL; /* its walk ends here */
                live--;
                continue;
            }
            pt[i] = xt;
            x[i] = hr_addr(atomic_load_explicit(&x[i]->next, memory_order_acquire));
            if (x[i])
                __builtin_prefetch(x[i]);
            else
                live--;
        }
    }
}

/* One chunk of at most HR_BATCH keys starting at keys[0] (index base). */
static size_t hr_get_chunk(hr_index *idx, const hr_key *keys, size_t n, size_t base,
                           hr_visit_at_fn fn, void *arg)
{
    hr_okey k[HR_BATCH];
    uint64_t b[HR_BATCH], hw[HR_BATCH];
    size_t hits = 0;
    for (size_t i = 0; i < n; i++)
        k[i] = hr_okey_make(keys[i].key, keys[i].klen);
    hr_rcu_lock();
    hr_table *t = atomic_load_explicit(&idx->cur, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        b[i] = hr_bucket(t, k[i].tag);
        __builtin_prefetch(&t->heads[b[i]]);
    }
    for (size_t i = 0; i < n; i++) {
        hw[i] = atomic_load_explicit(&t->heads[b[i]], memory_order_acquire);
        if (hw[i] & HR_ADDR_MASK)
            __builtin_prefetch(hr_addr(hw[i])); /* the head item's first line */
    }
    hr_batch_ahead(k, hw, n);
    hr_shard *s = hr_my_shard(idx);
    hr_batch_arg a = {fn, arg, 0};
    for (size_t i = 0; i < n; i++) {
        a.i = base + i;
        hits += hr_read_at(idx, s, t, b[i], hw[i], &k[i], fn ? hr_batch_visit : NULL, &a);
    }
    hr_rcu_unlock();
    return hits;
}

kv_err hr_get_batch(hr_index *idx, const hr_key *keys, size_t n, hr_visit_at_fn fn, void *arg,
                    size_t *hits)
{
    if (!idx || (n > 0 && !keys))
        return KV_INVALID_ARGUMENT;
    for (size_t i = 0; i < n; i++) {
        kv_err rv = hr_check_key(idx, keys[i].key, keys[i].klen);
        if (rv != KV_OK)
            return rv;
    }
    size_t found = 0;
    for (size_t i = 0; i < n; i += HR_BATCH)
        found += hr_get_chunk(idx, keys + i, n - i < HR_BATCH ? n - i : HR_BATCH, i, fn, arg);
    if (hits)
        *hits = found;
    return KV_OK;
}

/* ---------------------------------------------------------------- upsert */

typedef struct hr_wr {
    hr_index *idx;
    const hr_okey *k;
    const void *val;
    size_t vlen;
    const hr_meta *meta;
    hr_cond_fn cond;
    void *arg;
    hr_item *nx; /* the new item, built once and reused across retries */
    bool retry;  /* set by hr_wr_insert/hr_wr_update: redo the search */
} hr_wr;

static kv_err hr_wr_item(hr_wr *wr)
{
    if (wr->nx)
        return KV_OK;
    return hr_item_alloc(wr->k, wr->val, wr->vlen, wr->meta, &wr->nx);
}

/* Key absent: insert wr->nx into the window (or the empty bucket). Returns
 * KV_OK or an error (cond's or an allocation failure); sets wr->retry (and
 * returns KV_OK) when a concurrent change asks for a new search. The retry
 * travels out of band, so cond may return any kv_err. */
static kv_err hr_wr_insert(hr_wr *wr, hr_table *t, uint64_t b, hr_win *w, int found)
{
    kv_err rv = wr->cond ? wr->cond(wr->arg, NULL) : KV_OK;
    if (rv == KV_OK)
        rv = hr_wr_item(wr);
    if (rv != KV_OK)
        return rv;
    hr_item *n = wr->nx;
    bool ok;
    if (found == HR_FIND_EMPTY) {
        uint64_t zero = 0;
        atomic_store_explicit(&n->next, (uint64_t)(uintptr_t)n, memory_order_relaxed);
        /* CAS site: an empty bucket head. Protects: the bucket is still empty;
         * publishes n as a one-item ring. */
        ok = atomic_compare_exchange_strong(&t->heads[b], &zero, (uint64_t)(uintptr_t)n);
    } else {
        KV_ASSERT(!(w->pw & HR_N_OCC) && hr_addr(w->pw) == w->cur,
                  "insert window: pred deleted or not pointing at cur (word %#llx)",
                  (unsigned long long)w->pw);
        atomic_store_explicit(&n->next, (uint64_t)(uintptr_t)w->cur, memory_order_relaxed);
        /* CAS site: the predecessor's next word. Protects: pred is live and
         * still points at cur, so n lands in order; publishes n (release).
         * During a rehash pred may be a split item (or a half's last item)
         * and cur the other half's split item (hr_wfind's one-item half):
         * n lands in order in the old ring and in its half alike, so the
         * insert never waits for the rehash to close the half. */
        ok = atomic_compare_exchange_strong(&w->pred->next, &w->pw, hr_with_addr(w->pw, n));
    }
    if (!ok) {
        wr->retry = true;
        return KV_OK;
    }
    hr_shard *s = hr_my_shard(wr->idx);
    hr_cnt_add(s, HR_C_ITEMS, 1);
    hr_cnt_add(s, HR_C_BYTES, hr_item_bytes(n));
    wr->nx = NULL;
    return KV_OK;
}

static HR_TLS unsigned hr_tls_lazy;

/* Marks the owned item x Occupied; with repl, x's next points at repl, whose
 * next becomes x's successor. Then moves heads off x and unlinks it: at once
 * through the predecessor the search found, else (x was the head, so its
 * predecessor is a whole ring away) on every 4th such kill only. A replaced
 * or deleted head left linked is harmless: it sits behind the new head,
 * readers step over it and the next writer walking by unlinks it. */
static void hr_kill(hr_index *idx, hr_item *x, uint32_t s, hr_item *repl, const hr_okey *k,
                    const hr_win *fw)
{
    uint64_t xw = atomic_load_explicit(&x->next, memory_order_acquire), nv;
    KV_ASSERT(atomic_load_explicit(&x->seq, memory_order_relaxed) & HR_SEQ_OWNED,
              "killing an item this writer does not own");
    for (;;) {
        KV_ASSERT(!(xw & HR_N_OCC), "an owned item was deleted by someone else");
        nv = xw | HR_N_OCC;
        if (repl) {
            atomic_store_explicit(&repl->next, (uint64_t)(uintptr_t)hr_addr(xw),
                                  memory_order_relaxed);
            nv = hr_with_addr(xw, repl) | HR_N_OCC;
        }
        /* CAS site: x's own next word (x owned by us, so no other marker).
         * Protects: the successor we copied into repl is still x's successor;
         * sets Occupied = the delete/update's linearisation point. Fails only
         * on an insert after x or a counter bump, then retries. */
        if (atomic_compare_exchange_strong(&x->next, &xw, nv))
            break;
    }
    hr_disown(x, s, false); /* readers may still snapshot the dead item */
    hr_table *t = atomic_load(&idx->cur);
    uint64_t b = hr_bucket(t, k->tag);
    hr_head_fix(idx, t, b, x);
    if (fw->pred && fw->pred != x && hr_addr(fw->pw) == x) {
        uint64_t pw = fw->pw;
        KV_ASSERT(!(pw & HR_N_OCC), "unlink through a deleted predecessor");
        /* CAS site: the predecessor's next word. Protects: pred is still live
         * and points at x exactly as when the search found it; swings it past
         * x (to repl or x's successor), keeping pred's counter/Rehash bits. */
        if (atomic_compare_exchange_strong(&fw->pred->next, &pw, hr_with_addr(pw, hr_addr(nv)))) {
            hr_unlinked(idx, x);
            return;
        }
    } else if (fw->pred != x && (++hr_tls_lazy & 3) != 0) {
        return;
    }
    hr_win w;
    (void)hr_wfind(idx, t, b, k, HR_MODE_CLEANUP, &w);
}

/* Key present at w->cur: update in place or by RCU. Returns like
 * hr_wr_insert (wr->retry: another writer owns the item, search again). */
static kv_err hr_wr_update(hr_wr *wr, hr_table *t, uint64_t b, uint64_t hw, hr_win *w)
{
    hr_item *x = w->cur;
    uint32_t s;
    bool in_place = wr->vlen <= HR_INLINE_MAX && !(hr_kind(x) & HR_SEQ_BIG) &&
                    hr_rec_fits(hr_kind(x), wr->meta);
    kv_err rv = in_place ? KV_OK : hr_wr_item(wr); /* allocate before owning */
    if (rv != KV_OK)
        return rv;
    if (!hr_own(x, &s)) {
        wr->retry = true;
        return KV_OK;
    }
    if (wr->cond) {
        hr_view v;
        uint64_t vbuf;
        hr_snapshot_owned(x, &v, &vbuf);
        if ((rv = wr->cond(wr->arg, &v)) != KV_OK) {
            hr_disown(x, s, false);
            return rv;
        }
    }
    if (in_place) {
        hr_rewrite_begin(x, s);
        hr_rec_put(x, wr->val, wr->vlen, wr->meta);
        hr_disown(x, s, true);
        hr_hot_access(wr->idx, t, b, hw, x, x);
        return KV_OK;
    }
    hr_item *n = wr->nx;
    wr->nx = NULL;
    hr_cnt_add(hr_my_shard(wr->idx), HR_C_BYTES, hr_item_bytes(n) - hr_item_bytes(x));
    hr_kill(wr->idx, x, s, n, wr->k, w);
    /* The paper counts an RCU update on the predecessor (its next word is
     * what the update rewrites); with x at the head, on the new version. */
    hr_hot_access(wr->idx, t, b, hw, n, w->pred ? w->pred : n);
    return KV_OK;
}

static kv_err hr_check_rec(hr_index *idx, const void *key, size_t klen, const void *val,
                           size_t vlen, const hr_meta *meta)
{
    kv_err rv = hr_check_key(idx, key, klen);
    if (rv != KV_OK)
        return rv;
    if ((!val && vlen) || vlen > UINT32_MAX || (meta && (meta->flags & ~HR_F_ALL)))
        return KV_INVALID_ARGUMENT;
    return KV_OK;
}

static const hr_meta hr_zero_meta;

kv_err hr_prepare(hr_index *idx, const void *key, size_t klen, const void *val, size_t vlen,
                  const hr_meta *meta, hr_prep *p)
{
    kv_err rv = hr_check_rec(idx, key, klen, val, vlen, meta);
    if (rv != KV_OK)
        return rv;
    hr_okey k = hr_okey_make(key, klen);
    hr_item *x;
    rv = hr_item_alloc(&k, val, vlen, meta ? meta : &hr_zero_meta, &x);
    if (rv == KV_OK)
        p->item = x;
    return rv;
}

void hr_prep_release(hr_prep *p)
{
    if (p && p->item) {
        hr_item_free(p->item); /* never published: no grace period */
        p->item = NULL;
    }
}

kv_err hr_upsert(hr_index *idx, const void *key, size_t klen, const void *val, size_t vlen,
                 const hr_meta *meta, hr_cond_fn cond, void *arg)
{
    return hr_upsert_prepared(idx, key, klen, val, vlen, meta, cond, arg, NULL);
}

kv_err hr_upsert_prepared(hr_index *idx, const void *key, size_t klen, const void *val, size_t vlen,
                          const hr_meta *meta, hr_cond_fn cond, void *arg, hr_prep *p)
{
    hr_item *built = p ? p->item : NULL;
    if (p)
        p->item = NULL;
    kv_err rv = hr_check_rec(idx, key, klen, val, vlen, meta);
    if (rv != KV_OK) {
        if (built)
            hr_item_free(built);
        return rv;
    }
    hr_okey k = hr_okey_make(key, klen);
    /* the prepared item must be this record's (same key; the caller passes
     * the value and meta it was built with) */
    KV_ASSERT(!built || (built->tag == k.tag && hr_cmp_key(&k, built) == 0),
              "prepared item of another key (%zu bytes)", klen);
    hr_wr wr = {idx, &k, val, vlen, meta ? meta : &hr_zero_meta, cond, arg, built, false};
    unsigned spins = 0, visited = 0;
    hr_rcu_lock();
    do {
        hr_table *t = atomic_load_explicit(&idx->cur, memory_order_acquire);
        uint64_t b = hr_bucket(t, k.tag);
        uint64_t hw = atomic_load_explicit(&t->heads[b], memory_order_acquire);
        hr_win w;
        int r = hr_wfind(idx, t, b, &k, HR_MODE_LOOKUP, &w);
        visited = w.visited;
        wr.retry = false;
        if (r == HR_FIND_EMPTY || !w.found)
            rv = hr_wr_insert(&wr, t, b, &w, r);
        else
            rv = hr_wr_update(&wr, t, b, hw, &w);
        if (wr.retry)
            hr_backoff(&spins);
    } while (wr.retry);
    hr_count_access(idx, hr_my_shard(idx), HR_C_WRITES, HR_C_WVISITED, visited);
    hr_rcu_unlock();
    if (wr.nx) /* built but never published (cond failed or in-place) */
        hr_item_free(wr.nx);
    return rv;
}

/* ---------------------------------------------------------------- remove */

kv_err hr_remove(hr_index *idx, const void *key, size_t klen, hr_cond_fn cond, void *arg)
{
    kv_err rv = hr_check_key(idx, key, klen);
    if (rv != KV_OK)
        return rv;
    hr_okey k = hr_okey_make(key, klen);
    unsigned spins = 0;
    hr_win w = {0};
    hr_rcu_lock();
    for (;;) {
        hr_table *t = atomic_load_explicit(&idx->cur, memory_order_acquire);
        uint64_t b = hr_bucket(t, k.tag);
        uint32_t s;
        if (hr_wfind(idx, t, b, &k, HR_MODE_LOOKUP, &w) == HR_FIND_EMPTY || !w.found) {
            rv = KV_NOT_FOUND;
            break;
        }
        if (!hr_own(w.cur, &s)) {
            hr_backoff(&spins);
            continue;
        }
        if (cond) {
            hr_view v;
            uint64_t vbuf;
            hr_snapshot_owned(w.cur, &v, &vbuf);
            if ((rv = cond(arg, &v)) != KV_OK) {
                hr_disown(w.cur, s, false);
                break;
            }
        }
        hr_shard *sh = hr_my_shard(idx);
        hr_cnt_add(sh, HR_C_ITEMS, (uint64_t)-1);
        hr_cnt_add(sh, HR_C_BYTES, (uint64_t)0 - hr_item_bytes(w.cur));
        hr_kill(idx, w.cur, s, NULL, &k, &w);
        rv = KV_OK;
        break;
    }
    hr_count_access(idx, hr_my_shard(idx), HR_C_WRITES, HR_C_WVISITED, w.visited);
    hr_rcu_unlock();
    return rv;
}

/* ------------------------------------------------------ flags and pinning */

/* Finds key's item and owns it (in a read-side section). */
static kv_err hr_find_owned(hr_index *idx, const hr_okey *k, hr_table **t, uint64_t *b, hr_item **x,
                            uint32_t *s)
{
    unsigned spins = 0;
    for (;;) {
        hr_win w;
        *t = atomic_load_explicit(&idx->cur, memory_order_acquire);
        *b = hr_bucket(*t, k->tag);
        if (hr_wfind(idx, *t, *b, k, HR_MODE_LOOKUP, &w) == HR_FIND_EMPTY || !w.found)
            return KV_NOT_FOUND;
        if (hr_own(w.cur, s)) {
            *x = w.cur;
            return KV_OK;
        }
        hr_backoff(&spins);
    }
}

/* Rewrites x's metadata flags in place (x owned with seq s). */
static void hr_flags_put(hr_item *x, uint32_t s, uint32_t set, uint32_t clear)
{
    hr_rewrite_begin(x, s);
    uint64_t mw = atomic_load_explicit(&x->mw, memory_order_relaxed);
    uint64_t f = (((mw & HR_MW_FLAGS_MASK) >> HR_MW_FLAGS_SHIFT) | set) & ~clear & HR_F_ALL;
    atomic_store_explicit(&x->mw, (mw & ~HR_MW_FLAGS_MASK) | f << HR_MW_FLAGS_SHIFT,
                          memory_order_relaxed);
    hr_disown(x, s, true);
}

kv_err hr_set_flags(hr_index *idx, const void *key, size_t klen, uint64_t seqno, uint32_t set,
                    uint32_t clear)
{
    kv_err rv = hr_check_key(idx, key, klen);
    if (rv != KV_OK)
        return rv;
    if (set & ~HR_F_ALL)
        return KV_INVALID_ARGUMENT;
    hr_okey k = hr_okey_make(key, klen);
    hr_table *t;
    uint64_t b;
    uint32_t s;
    hr_item *x;
    hr_rcu_lock();
    rv = hr_find_owned(idx, &k, &t, &b, &x, &s);
    if (rv == KV_OK) {
        hr_view v;
        uint64_t vbuf;
        hr_snapshot_owned(x, &v, &vbuf);
        uint64_t cur = v.meta.seqno;
        if (cur != seqno) {
            hr_disown(x, s, false);
            rv = KV_FAILED_PRECONDITION;
        } else {
            hr_flags_put(x, s, set, clear);
        }
    }
    hr_rcu_unlock();
    return rv;
}

kv_err hr_pin(hr_index *idx, const void *key, size_t klen)
{
    kv_err rv = hr_check_key(idx, key, klen);
    if (rv != KV_OK)
        return rv;
    hr_okey k = hr_okey_make(key, klen);
    hr_table *t;
    uint64_t b;
    uint32_t s;
    hr_item *x;
    hr_rcu_lock();
    rv = hr_find_owned(idx, &k, &t, &b, &x, &s);
    if (rv == KV_OK) {
        hr_flags_put(x, s, HR_F_PINNED, 0);
        for (;;) {
            uint64_t hw = atomic_load_explicit(&t->heads[b], memory_order_acquire);
            uint64_t xw = atomic_load_explicit(&x->next, memory_order_acquire);
            if (hr_addr(hw) == x || (xw & HR_N_OCC) || hr_head_move(idx, t, b, hw, x, 0))
                break;
        }
    }
    hr_rcu_unlock();
    return rv;
}

/* --------------------------------------------------------------- iterate */

/* First item x of bucket b's ring (walking from h) with x >= k in ring order. */
static hr_item *hr_lower_bound(hr_table *t, uint64_t b, const hr_okey *k, hr_item *h)
{
    hr_item *x = h;
    hr_cyc cy;
    int c = hr_cmp_key(k, x);
    hr_cyc_init(&cy, h);
    for (;;) {
        hr_item *n = hr_addr(atomic_load_explicit(&x->next, memory_order_acquire));
        if (n == x)
            return x;
        n = hr_hop(t, b, n);
        int cn = hr_cmp_key(k, n);
        if (hr_in_window(x, n, c, cn) || hr_cyc_step(&cy, n))
            return n;
        x = n;
        c = cn;
    }
}

/* Iteration cursor: the last record handed out. Buckets are walked in hash
 * order and every ring in (hash, key) order, so records come out strictly
 * ascending; anything not above the cursor was already visited (this keeps
 * the no-duplicates promise whatever concurrent rehashes and head moves do). */
typedef struct hr_iter {
    hr_visit_fn fn;
    void *arg;
    bool any;
    uint32_t tag;
    uint32_t klen;
    unsigned char key[HR_MAX_KLEN];
} hr_iter;

static void hr_iter_visit(hr_iter *it, hr_item *x)
{
    if (it->any) {
        hr_okey last = {it->tag, it->klen, it->key, 0};
        if (hr_cmp_key(&last, x) >= 0)
            return;
    }
    hr_view v;
    uint64_t vbuf;
    hr_snapshot(x, &v, &vbuf);
    it->any = true;
    it->tag = x->tag;
    it->klen = (uint32_t)v.klen;
    memcpy(it->key, v.key, v.klen);
    it->fn(it->arg, &v);
}

/* Visits the live items of bucket b in ascending order. */
static void hr_iter_bucket(hr_table *t, uint64_t b, hr_iter *it)
{
    hr_item *h = hr_addr(atomic_load_explicit(&t->heads[b], memory_order_acquire));
    if (!h)
        return;
    hr_okey lo = {(uint32_t)(b << (32 - t->bits)), 0, NULL, 1};
    hr_item *x = hr_lower_bound(t, b, &lo, h), *last = NULL;
    bool last_dead = false;
    hr_cyc cy;
    hr_cyc_init(&cy, x);
    while (hr_bucket(t, x->tag) == b) {
        if (last) {
            int c = hr_cmp_items(last, x);
            if (c > 0 || (c == 0 && !last_dead))
                break;
        }
        uint64_t w = atomic_load_explicit(&x->next, memory_order_acquire);
        bool dead = (w & HR_N_OCC) != 0;
        if (!dead && !hr_is_rehash(x))
            hr_iter_visit(it, x);
        last = x;
        last_dead = dead;
        x = hr_hop(t, b, hr_addr(w));
        if (x == last || hr_cyc_step(&cy, x)) /* a frozen run of replaced items */
            break;
    }
}

void hr_iterate(hr_index *idx, hr_visit_fn fn, void *arg)
{
    if (!idx || !fn)
        return;
    hr_iter *it = malloc(sizeof(*it));
    if (!it) {
        KV_ERROR("hotring", "hr_iterate: out of memory");
        return;
    }
    it->fn = fn;
    it->arg = arg;
    it->any = false;
    uint32_t pos = 0; /* lowest tag of the next bucket to visit */
    for (;;) {
        hr_rcu_lock();
        hr_table *t = atomic_load_explicit(&idx->cur, memory_order_acquire);
        uint64_t b = hr_bucket(t, pos);
        hr_iter_bucket(t, b, it);
        /* t may be freed once we leave the read section: read it first. */
        bool last = b + 1 == t->nb;
        pos = last ? 0 : (uint32_t)((b + 1) << (32 - t->bits));
        hr_rcu_unlock();
        if (last)
            break;
    }
    free(it);
}

/* ------------------------------------------------------------ lifecycle */

void hr_thread_register(void)
{
    urcu_memb_register_thread();
}

void hr_thread_unregister(void)
{
    hr_mem_thread_flush(); /* cached free item blocks go back to the shared pool */
    urcu_memb_unregister_thread();
}

void hr_barrier(void)
{
    /* A retirement may take two grace periods (chained call_rcu callbacks). */
    urcu_memb_barrier();
    urcu_memb_barrier();
}

static kv_err hr_opts_fix(const hr_opts *in, hr_opts *o)
{
    hr_opts d = {1024, HR_MODE_SAMPLE, 5, true, 0};
    *o = in ? *in : d;
    if (o->mode != HR_MODE_NONE && o->mode != HR_MODE_RANDOM && o->mode != HR_MODE_SAMPLE)
        return KV_INVALID_ARGUMENT;
    if (o->buckets > (UINT64_C(1) << HR_MAX_BITS) || o->r > (1u << 20) || !(o->rehash_cost >= 0))
        return KV_INVALID_ARGUMENT;
    if (o->buckets == 0)
        o->buckets = 1024;
    if (o->r == 0)
        o->r = 5;
    if (o->rehash_cost == 0)
        o->rehash_cost = HR_DEFAULT_REHASH_COST;
    return KV_OK;
}

/* The packed words hold 48-bit addresses: check what the allocator returns. */
static kv_err hr_check_heap(void)
{
    void *small = malloc(64), *large = malloc(1 << 20);
    bool ok = small && large && !((uintptr_t)small >> 48) && !((uintptr_t)large >> 48);
    if (small && large && !ok)
        KV_ERROR("hotring",
                 "heap addresses %p/%p do not fit 48 bits (5-level paging?); "
                 "HotRing's packed head/next words cannot hold them",
                 small, large);
    free(small);
    free(large);
    if (!small || !large)
        return KV_RESOURCE_EXHAUSTED;
    return ok ? KV_OK : KV_FAILED_PRECONDITION;
}

hr_table *hr_table_new(unsigned bits)
{
    uint64_t nb = UINT64_C(1) << bits;
    hr_table *t = calloc(1, sizeof(hr_table) + nb * sizeof(_Atomic uint64_t));
    if (!t)
        return NULL;
    t->nb = nb;
    t->bits = bits;
    return t;
}

kv_err hr_open(hr_index **out, const hr_opts *opts)
{
    hr_opts o;
    kv_err rv;
    if (!out)
        return KV_INVALID_ARGUMENT;
    if ((rv = hr_opts_fix(opts, &o)) != KV_OK || (rv = hr_check_heap()) != KV_OK)
        return rv;
    unsigned bits = 1;
    while ((UINT64_C(1) << bits) < o.buckets)
        bits++;
    hr_index *idx = aligned_alloc(64, sizeof(*idx));
    hr_table *t = hr_table_new(bits);
    if (!idx || !t) {
        free(idx);
        free(t);
        return KV_RESOURCE_EXHAUSTED;
    }
    memset(idx, 0, sizeof(*idx));
    pthread_mutex_init(&idx->rh_lock, NULL);
    atomic_init(&idx->cur, t);
    atomic_init(&idx->nb, t->nb);
    idx->mode = o.mode;
    idx->r = o.r;
    idx->rehash = o.rehash;
    idx->rehash_cost = o.rehash_cost;
    if (o.rehash && hr_worker_start(idx) != 0) {
        pthread_mutex_destroy(&idx->rh_lock);
        free(t);
        free(idx);
        return KV_RESOURCE_EXHAUSTED;
    }
    *out = idx;
    return KV_OK;
}

/* Frees the ring under t->heads[b] (no concurrent users). */
static void hr_free_ring(hr_table *t, uint64_t b)
{
    hr_item *h = hr_addr(atomic_load_explicit(&t->heads[b], memory_order_relaxed)), *x = h;
    if (!h)
        return;
    do {
        hr_item *n = hr_addr(atomic_load_explicit(&x->next, memory_order_relaxed));
        hr_item_free(x);
        x = n;
    } while (x != h);
}

void hr_close(hr_index *idx)
{
    if (!idx)
        return;
    hr_worker_stop(idx);
    hr_table *t = atomic_load(&idx->cur);
    for (uint64_t b = 0; b < t->nb; b++)
        hr_free_ring(t, b);
    free(t);
    hr_barrier();
    pthread_mutex_destroy(&idx->rh_lock);
    free(idx);
}

void hr_get_stats(hr_index *idx, hr_stats *out)
{
    uint64_t c[HR_C_COUNT] = {0};
    if (!idx || !out)
        return;
    for (int i = 0; i < HR_SHARDS; i++)
        for (int j = 0; j < HR_C_COUNT; j++)
            c[j] += atomic_load_explicit(&idx->shards[i].c[j], memory_order_relaxed);
    memset(out, 0, sizeof(*out));
    out->items = c[HR_C_ITEMS];
    out->bytes = c[HR_C_BYTES];
    out->buckets = atomic_load(&idx->nb); /* idx->cur may be freed under us */
    out->reads = c[HR_C_READS];
    out->writes = c[HR_C_WRITES];
    out->read_visited = c[HR_C_VISITED];
    out->head_hits = c[HR_C_HEADHITS];
    out->head_moves = c[HR_C_MOVES];
    out->sample_rounds = c[HR_C_ROUNDS];
    out->pinned_reads = c[HR_C_PINNED];
    out->pinned_head_hits = c[HR_C_PINHEAD];
    out->rehashes = atomic_load(&idx->rehashes);
}
