/* SPDX-License-Identifier: MIT */
/*
 * HotRing internals shared by the ring core (hotring.c), the hotspot logic
 * (hr_hot.c) and the rehash (hr_rehash.c): the packed head/next words, the
 * item and table layouts, the (tag, key) ring order, per-item seqlock
 * snapshots and sharded statistics. Nothing here is part of the node's API.
 */
#ifndef KV_NODE_INDEX_HR_INTERNAL_H
#define KV_NODE_INDEX_HR_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <urcu/urcu-memb.h>

#include "common/assert.h"
#include "common/hash.h"
#include "node/index/hotring.h"

/* Packed words (paper Fig. 4). Bits 0..47 hold an item address. Head words:
 * bit 63 Active, bits 48..62 the 15-bit total counter. Item next words:
 * bit 63 Rehash (set in the next word of a rehash item), bit 62 Occupied,
 * bits 48..61 the 14-bit access counter of the item owning the word. */
#define HR_ADDR_MASK ((UINT64_C(1) << 48) - 1)
#define HR_H_ACTIVE (UINT64_C(1) << 63)
#define HR_H_TOTAL_SHIFT 48
#define HR_H_TOTAL_MAX UINT64_C(0x7fff)
#define HR_H_TOTAL_MASK (HR_H_TOTAL_MAX << HR_H_TOTAL_SHIFT)
#define HR_H_SEEN (UINT64_C(1) << HR_H_TOTAL_SHIFT) /* idle total 1: sampled before */
#define HR_H_CALM                                                                                  \
    (UINT64_C(2) << HR_H_TOTAL_SHIFT) /* idle total 2: last round found no hotspot                 \
                                       */
#define HR_CALM_SHIFT 5               /* a calm ring starts 1 in 2^5 of its sampling rounds */
#define HR_CALM_GAIN 4                /* a round that saves < 1/4 of the walk calms the ring */
#define HR_N_REHASH (UINT64_C(1) << 63)
#define HR_N_OCC (UINT64_C(1) << 62)
#define HR_N_CNT_SHIFT 48
#define HR_N_CNT_MAX UINT64_C(0x3fff)
#define HR_N_CNT_MASK (HR_N_CNT_MAX << HR_N_CNT_SHIFT)

/* Thread-locals of the index use the initial-exec TLS model: kv_index is
 * compiled as PIC but linked into executables only, and the default model
 * for PIC code calls __tls_get_addr on every access (the read path touches
 * two thread-locals per operation). */
#define HR_TLS _Thread_local __attribute__((tls_model("initial-exec")))

#define HR_MAX_KLEN HR_MAX_KEY_BYTES
#define HR_INLINE_MAX 8u  /* values up to this size are updated in place */
#define HR_RING_SCAN 256u /* longest ring a sampling decision looks at */
#define HR_SAMPLE_MIN 8u  /* fewest samples per sampling round */
#define HR_PIN_BIAS 2u    /* a pinned item competes for an unpinned head at W_t / 2 */
#define HR_DEFAULT_REHASH_COST 8.0
#define HR_COST_WINDOW 4096u                      /* ops per thread between access-cost checks */
#define HR_HASH_SEED UINT64_C(0x6a09e667f3bcc909) /* differs from the router's ring seed */
#define HR_MAX_BITS 32u /* the tag holds the top 32 hash bits: at most 2^32 buckets */

/* Item layout: one 64-byte cache line (64-byte aligned, hr_mem.c) for a key of
 * up to 8 bytes with an inline value, no expiry and a seqno below 2^48:
 *
 *    0 next     packed next word (address, Occupied, Rehash, counter)
 *    8 tag      top 32 bits of the key's hash: order key part 1 (bucket = top bits)
 *   12 seq      seqlock / ownership word, plus the immutable kind bits
 *   16 val      inline value bytes; a rehash item's sibling
 *   24 version  HLC version
 *   32 mw       meta word: seqno (bits 0..47, compact items) | inline vlen (48..51)
 *               | flags (52..54) | key length (55..63, HR_KLEN_*)
 *   40 rcu      liburcu rcu_head: retirement needs no other allocation
 *   56 key      key bytes (a key of HR_KLEN_LONG bytes or more: its length in
 *               an 8-byte word, then the bytes)
 *
 * An EXT item (expire_at set, seqno >= 2^48 or a big value) carries an hr_ext
 * block after the key (8-byte aligned) with the full seqno and expire_at, and
 * a BIG item's value bytes follow that block. Which form an item has never
 * changes; a write whose record does not fit the item's form is an RCU
 * replacement. Everything a hit reads (next, tag, key, seq, val, version, mw)
 * sits in the first 64 bytes of a compact item; only the retirement writes
 * rcu, after the item left every ring. Fields a reader may see change (next,
 * seq, val, version, mw, ext seqno/expire_at) are atomics; tag, key and the
 * kind bits are written before the item is published and never change. */
typedef struct hr_item {
    _Atomic uint64_t next;    /* packed next word */
    uint32_t tag;             /* order key part 1 */
    _Atomic uint32_t seq;     /* HR_SEQ_* bits + rewrite count, see hotring.c */
    _Atomic uint64_t val;     /* inline value; a rehash item's sibling */
    _Atomic uint64_t version; /* record version */
    _Atomic uint64_t mw;      /* meta word (HR_MW_*) */
    struct rcu_head rcu;      /* call_rcu at retirement */
    unsigned char key[];      /* order key part 2 */
} hr_item;
_Static_assert(offsetof(hr_item, key) == 56, "hr_item header must be 56 bytes");

typedef struct hr_ext {
    _Atomic uint64_t seqno, expire_at;
    uint64_t bvlen; /* a BIG item's value length (immutable) */
} hr_ext;

#define HR_MW_SEQNO_MAX ((UINT64_C(1) << 48) - 1)
#define HR_MW_VLEN_SHIFT 48
#define HR_MW_FLAGS_SHIFT 52
#define HR_MW_KLEN_SHIFT 55
#define HR_MW_VLEN_MASK (UINT64_C(0xf) << HR_MW_VLEN_SHIFT)
#define HR_MW_FLAGS_MASK ((uint64_t)HR_F_ALL << HR_MW_FLAGS_SHIFT)
#define HR_MW_KLEN_MASK (UINT64_C(0x1ff) << HR_MW_KLEN_SHIFT)
#define HR_KLEN_REHASH 0u /* key length field of a rehash (split) item */
#define HR_KLEN_LONG 511u /* key length field of keys of 511 bytes or more */
#define HR_ITEM_HDR 56u   /* offsetof(hr_item, key) */
#define HR_LINE 64u
#define HR_MEM_SMALL_MAX 256u /* largest item served from hr_mem.c's size classes */

typedef struct hr_table {
    uint64_t nb;   /* bucket count, a power of two */
    unsigned bits; /* log2(nb), 1..HR_MAX_BITS */
    _Atomic uint64_t heads[];
} hr_table;

enum {
    HR_C_READS,
    HR_C_WRITES,
    HR_C_VISITED,
    HR_C_HEADHITS,
    HR_C_MOVES,
    HR_C_ROUNDS,
    HR_C_ITEMS,
    HR_C_BYTES,
    HR_C_WVISITED, /* items visited by writes */
    HR_C_WIN_OPS,  /* reads + writes at the end of the thread's last cost window */
    HR_C_WIN_VIS,  /* visited + wvisited at the same point */
    HR_C_PINNED,   /* reads that found a pinned item */
    HR_C_PINHEAD,  /* ... that was the ring head */
    HR_C_COUNT
};
#define HR_SHARDS 32
typedef struct hr_shard {
    _Atomic uint64_t c[HR_C_COUNT];
} __attribute__((aligned(64))) hr_shard;

struct hr_index {
    _Atomic(hr_table *) cur; /* the table lookups start from */
    _Atomic(hr_table *) aux; /* the other table while a rehash runs, else NULL */
    _Atomic uint64_t nb;     /* cur's bucket count, readable outside read sections */
    hr_mode mode;
    unsigned r;
    bool rehash;
    double rehash_cost;
    _Atomic uint64_t rehashes;
    _Atomic int rehash_want; /* a worker thread asked for a rehash */
    _Atomic int stop;
    pthread_mutex_t rh_lock; /* serialises whole rehashes (not ops) */
    pthread_mutex_t wk_lock;
    pthread_cond_t wk_cond;
    pthread_t worker;
    bool has_worker;
    _Atomic unsigned avg_ring;                 /* items per bucket, refreshed per cost window */
    _Atomic int after_pending;                 /* log the access cost after a rehash */
    _Atomic uint64_t base_reads, base_visited; /* stats at the last rehash */
    hr_shard shards[HR_SHARDS];
};

#define HR_SEQ_WRITING 1u /* the record is being rewritten: readers wait */
#define HR_SEQ_OWNED 2u   /* a writer owns the item */
#define HR_SEQ_LATE 4u    /* a head mover installed the dead item: 2 grace periods (hr_ring.c) */
#define HR_SEQ_BIG 8u     /* immutable: the value follows the hr_ext block */
#define HR_SEQ_EXT 16u    /* immutable: an hr_ext block follows the key */
#define HR_SEQ_STEP 32u   /* bits 5..30 count completed rewrites */
#define HR_SEQ_RETIRED (1u << 31) /* handed to call_rcu (dead items only) */
/* Bits that change without changing the record (a snapshot ignores them). */
#define HR_SEQ_NOREC (HR_SEQ_OWNED | HR_SEQ_LATE | HR_SEQ_RETIRED)

/* ---- packing ---- */
static inline hr_item *hr_addr(uint64_t w)
{
    return (hr_item *)(uintptr_t)(w & HR_ADDR_MASK);
}
static inline uint64_t hr_with_addr(uint64_t w, const hr_item *x)
{
    return (w & ~HR_ADDR_MASK) | (uint64_t)(uintptr_t)x;
}

/* ---- layout ---- */
static inline size_t hr_align8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}
static inline uint64_t hr_mw(const hr_item *x)
{
    return atomic_load_explicit(&((hr_item *)(uintptr_t)x)->mw, memory_order_relaxed);
}
static inline uint32_t hr_kind(const hr_item *x) /* HR_SEQ_BIG | HR_SEQ_EXT (immutable) */
{
    return atomic_load_explicit(&((hr_item *)(uintptr_t)x)->seq, memory_order_relaxed) &
           (HR_SEQ_BIG | HR_SEQ_EXT);
}
static inline unsigned hr_klen_field(uint64_t mw)
{
    return (unsigned)(mw >> HR_MW_KLEN_SHIFT);
}
static inline bool hr_is_rehash(const hr_item *x)
{
    return hr_klen_field(hr_mw(x)) == HR_KLEN_REHASH;
}
/* Bytes the key takes after the header (a long key's length word included). */
static inline size_t hr_key_area(size_t klen)
{
    return klen >= HR_KLEN_LONG ? 8 + hr_align8(klen) : hr_align8(klen);
}
static inline uint32_t hr_item_klen(const hr_item *x)
{
    unsigned f = hr_klen_field(hr_mw(x));
    if (__builtin_expect(f != HR_KLEN_LONG, 1))
        return f;
    uint64_t n;
    memcpy(&n, x->key, sizeof(n));
    return (uint32_t)n;
}
static inline const unsigned char *hr_item_key(const hr_item *x)
{
    return hr_klen_field(hr_mw(x)) == HR_KLEN_LONG ? x->key + 8 : x->key;
}
static inline hr_ext *hr_ext_of(const hr_item *x)
{
    return (hr_ext *)(uintptr_t)(x->key + hr_key_area(hr_item_klen(x)));
}
static inline const unsigned char *hr_bigval(const hr_item *x)
{
    return (const unsigned char *)(hr_ext_of(x) + 1);
}
/* Bytes an item of this shape needs (before size-class rounding). */
static inline size_t hr_item_need(size_t klen, uint32_t kind, size_t bvlen)
{
    return HR_ITEM_HDR + hr_key_area(klen) + (kind & HR_SEQ_EXT ? sizeof(hr_ext) : 0) +
           (kind & HR_SEQ_BIG ? bvlen : 0);
}
static inline size_t hr_item_need_of(const hr_item *x)
{
    uint32_t kind = hr_kind(x);
    return hr_item_need(hr_item_klen(x), kind, kind & HR_SEQ_BIG ? hr_ext_of(x)->bvlen : 0);
}

/* ---- memory (hr_mem.c): 64-byte aligned items from per-thread size classes ---- */
/* Returns n bytes (64-byte aligned up to HR_MEM_SMALL_MAX, else malloc's
 * alignment) or NULL. Any thread. */
void *hr_mem_alloc(size_t n);
/* Frees p, which hr_mem_alloc(n) returned (same n). Any thread. */
void hr_mem_free(void *p, size_t n);
/* Bytes hr_mem_alloc(n) really sets aside (the size class). */
size_t hr_mem_class_bytes(size_t n);
/* Hands the calling thread's cached free blocks back to the shared pool. */
void hr_mem_thread_flush(void);
static inline void hr_item_free(hr_item *x)
{
    hr_mem_free(x, hr_item_need_of(x));
}

/* ---- order: (tag, rehash items first, key bytes, key length) ---- */
typedef struct hr_okey {
    uint32_t tag;
    uint32_t klen;
    const void *key;
    uint32_t rehash;
} hr_okey;

static inline int hr_cmp_bytes(const void *a, uint32_t al, const void *b, uint32_t bl)
{
    if (al == 8 && bl == 8) { /* the common 8-byte key: one big-endian word compare */
        uint64_t x, y;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        x = __builtin_bswap64(x);
        y = __builtin_bswap64(y);
        return x == y ? 0 : x < y ? -1 : 1;
    }
    int c = memcmp(a, b, al < bl ? al : bl);
    if (c != 0)
        return c;
    return al < bl ? -1 : al > bl;
}
static inline int hr_cmp_key(const hr_okey *k, const hr_item *x)
{
    if (k->tag != x->tag)
        return k->tag < x->tag ? -1 : 1;
    unsigned f = hr_klen_field(hr_mw(x));
    uint32_t xr = f == HR_KLEN_REHASH;
    if (k->rehash != xr)
        return k->rehash ? -1 : 1;
    if (k->rehash)
        return 0;
    if (__builtin_expect(f != HR_KLEN_LONG, 1))
        return hr_cmp_bytes(k->key, k->klen, x->key, f);
    return hr_cmp_bytes(k->key, k->klen, hr_item_key(x), hr_item_klen(x));
}
static inline hr_okey hr_okey_of(const hr_item *x)
{
    hr_okey k = {x->tag, hr_item_klen(x), hr_item_key(x), hr_is_rehash(x)};
    return k;
}
static inline int hr_cmp_items(const hr_item *a, const hr_item *b)
{
    hr_okey k = hr_okey_of(a);
    return hr_cmp_key(&k, b);
}
static inline uint32_t hr_tag_of_hash(uint64_t hash)
{
    return (uint32_t)(hash >> 32);
}
/* A key's tag: the only place HotRing hashes a key. */
static inline uint32_t hr_key_tag(const void *key, size_t klen)
{
    return hr_tag_of_hash(kv_hash64(key, klen, HR_HASH_SEED));
}

/* ---- tables ---- */
static inline uint64_t hr_bucket(const hr_table *t, uint32_t tag)
{
    return tag >> (32 - t->bits);
}
static inline _Atomic uint64_t *hr_head_of(hr_table *t, uint32_t tag)
{
    return &t->heads[hr_bucket(t, tag)];
}

/* ---- rehash split points ----
 * A rehash item keeps a pointer to its sibling (the split point of the other
 * half of the same old ring) in its unused value word. Until a ring is split,
 * a walk in one half can step onto the other half's split point through the
 * old wrap link; it then continues at its own split point (the sibling), which
 * is exactly where the half's closed ring would continue. */
static inline hr_item *hr_sibling(const hr_item *r)
{
    return (hr_item *)(uintptr_t)atomic_load_explicit(&((hr_item *)(uintptr_t)r)->val,
                                                      memory_order_relaxed);
}
static inline hr_item *hr_hop(const hr_table *t, uint64_t b, hr_item *n)
{
    /* The Rehash bit sits in n's next word, which shares n's first 16 bytes
     * (one cache line) with the tag the walk reads anyway. */
    if (__builtin_expect(atomic_load_explicit(&n->next, memory_order_relaxed) & HR_N_REHASH, 0) &&
        hr_bucket(t, n->tag) != b)
        return hr_sibling(n);
    return n;
}

/* ---- search (hr_ring.c has the design notes) ---- */
/* Brent's cycle detection for walks that may start off the ring (a head that
 * points at an item just unlinked) or run round a frozen ring of deleted
 * items, where neither the order nor the start item ends the walk. */
typedef struct hr_cyc {
    hr_item *save;
    unsigned lam, power;
} hr_cyc;
static inline void hr_cyc_init(hr_cyc *c, hr_item *x)
{
    c->save = x;
    c->lam = 0;
    c->power = 1;
}
/* True when n closes a cycle of the walk. */
static inline bool hr_cyc_step(hr_cyc *c, hr_item *n)
{
    if (n == c->save)
        return true;
    if (++c->lam == c->power) {
        c->save = n;
        c->power <<= 1;
        c->lam = 0;
    }
    return false;
}

/* Is k in the cyclic interval (p, n]? c = cmp(k, p), cn = cmp(k, n). */
static inline bool hr_in_window(const hr_item *p, const hr_item *n, int c, int cn)
{
    int cpn = hr_cmp_items(p, n);
    if (cpn < 0)
        return c > 0 && cn <= 0;
    if (cpn > 0) /* p is the ring's maximum, n its minimum */
        return c > 0 || cn <= 0;
    return false; /* p is an occupied old version of n */
}

/* Reader walk from x in bucket b of t; returns the live item with key k or
 * NULL (miss early-stop). */
static inline hr_item *hr_walk(const hr_table *t, uint64_t b, const hr_okey *k, hr_item *x,
                               unsigned *visited)
{
    hr_cyc cy;
    unsigned vis = 1;
    int c = hr_cmp_key(k, x);
    hr_cyc_init(&cy, x);
    for (;;) {
        uint64_t w = atomic_load_explicit(&x->next, memory_order_acquire);
        hr_item *n = hr_addr(w);
        if (c == 0) {
            *visited = vis;
            if (!(w & HR_N_OCC))
                return x;
            /* Occupied: the replacement (same key) follows, else deleted. */
            if (n == x || hr_cmp_items(x, n) != 0 || hr_cyc_step(&cy, n))
                return NULL;
            x = n;
            vis++;
            continue;
        }
        if (n == x)
            break;
        n = hr_hop(t, b, n);
        int cn = hr_cmp_key(k, n);
        if (hr_in_window(x, n, c, cn) && cn != 0)
            break;
        if (cn != 0 && hr_cyc_step(&cy, n)) /* went round without a window */
            break;
        x = n;
        c = cn;
        vis++;
    }
    *visited = vis;
    return NULL;
}

/* ---- statistics: per-thread shards, plain load+store on the read path ---- */
extern HR_TLS unsigned hr_tls_shard;
unsigned hr_shard_assign(void);
static inline hr_shard *hr_my_shard(hr_index *idx)
{
    unsigned s = hr_tls_shard;
    if (s == 0)
        s = hr_shard_assign();
    return &idx->shards[(s - 1) % HR_SHARDS];
}
static inline void hr_cnt_bump(hr_shard *s, int i, uint64_t v)
{
    uint64_t o = atomic_load_explicit(&s->c[i], memory_order_relaxed);
    atomic_store_explicit(&s->c[i], o + v, memory_order_relaxed);
}
static inline void hr_cnt_add(hr_shard *s, int i, uint64_t v)
{
    atomic_fetch_add_explicit(&s->c[i], v, memory_order_relaxed);
}

/* ---- ThreadSanitizer: liburcu's grace periods are invisible to TSan ---- */
#if defined(__SANITIZE_THREAD__)
#define HR_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HR_TSAN 1
#endif
#endif
#ifdef HR_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
extern char hr_tsan_gp;
#define HR_TSAN_RELEASE() __tsan_release(&hr_tsan_gp)
#define HR_TSAN_ACQUIRE() __tsan_acquire(&hr_tsan_gp)
#else
#define HR_TSAN_RELEASE() ((void)0)
#define HR_TSAN_ACQUIRE() ((void)0)
#endif
/* The read path's helpers that every lookup runs (hotring.c): inlined by
 * force, except under ThreadSanitizer, where GCC then warns about the
 * fences they carry into their callers (-Wtsan). */
#ifdef HR_TSAN
#define HR_READ_PATH static inline
#else
#define HR_READ_PATH static inline __attribute__((always_inline))
#endif

static inline void hr_rcu_lock(void)
{
    urcu_memb_read_lock();
}
static inline void hr_rcu_unlock(void)
{
    HR_TSAN_RELEASE();
    urcu_memb_read_unlock();
}

/* Waits for a grace period (never inside a read-side section). */
static inline void hr_sync_rcu(void)
{
    urcu_memb_synchronize_rcu();
    HR_TSAN_ACQUIRE(); /* every read-side section that ended has released */
}

/* ---- shared between the .c files ---- */
hr_table *hr_table_new(unsigned bits);
/* Unlinks prev's occupied successor n (n's word nw); false if prev is
 * occupied itself (restart from the head). */
bool hr_help_unlink(hr_index *idx, hr_item *prev, uint64_t *pw, hr_item *n, uint64_t nw);
/* Writer search window: pred is live and pred->next was pw when read. */
typedef struct hr_win {
    hr_item *pred;
    uint64_t pw;
    hr_item *cur;
    bool found;
    unsigned visited;
} hr_win;
enum { HR_FIND_EMPTY = 0, HR_FIND_OK = 1 };
enum { HR_MODE_LOOKUP = 0, HR_MODE_CLEANUP = 1 };
int hr_wfind(hr_index *idx, hr_table *t, uint64_t b, const hr_okey *k, int cleanup, hr_win *w);
/* x was just removed from every ring link: move heads off it and retire it. */
void hr_unlinked(hr_index *idx, hr_item *x);
/* Called by a head mover right after its CAS installed x (which it saw live in
 * the same read section), before hr_head_fix: marks x for a second grace
 * period when it is already deleted (hr_ring.c, "Heads"). */
void hr_installed(hr_item *x);
/* Moves head b of t off x while it points at x and x is logically deleted:
 * to the next live item of the bucket, or to empty when none is left (then
 * the frozen ring is retired). */
void hr_head_fix(hr_index *idx, hr_table *t, uint64_t b, hr_item *x);
/* Inserts a rehash/split item into the ring under head (rehash thread). */
hr_item *hr_item_new_rehash(uint32_t tag);
int hr_insert_item(hr_index *idx, hr_table *t, uint64_t b, hr_item *n);
/* Marks x deleted (rehash items only) and unlinks it. */
void hr_delete_item(hr_index *idx, hr_table *t, uint64_t b, hr_item *x);
uint32_t hr_cur_flags(const hr_item *x);

/* hr_hot.c: access hook after every keyed operation. */
void hr_hot_slow(hr_index *idx, hr_table *t, uint64_t b, uint64_t hw, hr_item *hit, hr_item *cnt);
extern HR_TLS unsigned hr_tls_tick;
static inline void hr_hot_access(hr_index *idx, hr_table *t, uint64_t b, uint64_t hw, hr_item *hit,
                                 hr_item *cnt)
{
    if (idx->mode == HR_MODE_NONE)
        return;
    if (!(hw & HR_H_ACTIVE)) {
        if (++hr_tls_tick < idx->r) {
            /* Not this thread's R-th access: only a fresh ring (idle total
             * 0, sampling never evaluated it) reached past its head goes on,
             * for its first guess (hr_hot.c, "First guess"). hw is in a
             * register already: one test on the common path. */
            if (__builtin_expect((hw & HR_H_TOTAL_MASK) != 0, 1) || !hit || hit == hr_addr(hw) ||
                idx->mode != HR_MODE_SAMPLE)
                return;
        } else if (hit && hit == hr_addr(hw)) { /* the R-th access hit the head: nothing to move */
            hr_tls_tick = 0;
            return;
        }
    }
    hr_hot_slow(idx, t, b, hw, hit, cnt);
}
/* One ring as seen by a sampling decision (item i is i hops from the head). */
typedef struct hr_ring_view {
    hr_item *it[HR_RING_SCAN];
    uint32_t cnt[HR_RING_SCAN];
    uint8_t cand[HR_RING_SCAN], pin[HR_RING_SCAN];
    unsigned len;
    uint64_t total;
} hr_ring_view;
/* Index of the W_t-minimal candidate head (a pinned head stays unless a
 * pinned item is cheaper; a pinned item competes for an unpinned head with
 * HR_PIN_BIAS). Item 0 is the current head. */
unsigned hr_best_head(const hr_ring_view *rv);
/* W_t of candidate head t (sum of counts times hops from t). */
uint64_t hr_ring_cost(const hr_ring_view *rv, unsigned t);
/* Moves head of bucket b to x with a CAS from hw (also setting `bits` in the
 * head word); true on success. */
bool hr_head_move(hr_index *idx, hr_table *t, uint64_t b, uint64_t hw, hr_item *x, uint64_t bits);

/* hr_rehash.c */
/* The access-cost window: every HR_COST_WINDOW-th read or write of a thread
 * (counted on its own shard) ends a window. The window's ops and visits are
 * the shard's read and write totals minus what they were at the last window
 * end, so the hot path counts each access once (its total and its visits)
 * and keeps no counters of its own for the window: every instruction a read
 * runs after its walk delays the next read's first miss (bench/README.md,
 * "What a read does after its walk"). */
void hr_cost_window_end(hr_index *idx, hr_shard *s);
/* Counts one access that visited `visited` items: a read into
 * (HR_C_READS, HR_C_VISITED), a write into (HR_C_WRITES, HR_C_WVISITED).
 * Plain load and store on the thread's own shard, like hr_cnt_bump. Inline:
 * every access runs it. */
static inline void hr_count_access(hr_index *idx, hr_shard *s, int ops, int vis, unsigned visited)
{
    uint64_t n = atomic_load_explicit(&s->c[ops], memory_order_relaxed) + 1;
    uint64_t v = atomic_load_explicit(&s->c[vis], memory_order_relaxed) + visited;
    atomic_store_explicit(&s->c[ops], n, memory_order_relaxed);
    atomic_store_explicit(&s->c[vis], v, memory_order_relaxed);
    if (__builtin_expect((n & (HR_COST_WINDOW - 1)) == 0, 0))
        hr_cost_window_end(idx, s);
}
int hr_worker_start(hr_index *idx);
void hr_worker_stop(hr_index *idx);

#endif
