/* SPDX-License-Identifier: MIT */
/*
 * HotRing: the hotspot-aware, lock-free hash index of the node's memory tier
 * (Chen et al., "HotRing: A Hotspot-Aware In-Memory Key-Value Store",
 * FAST'20). Each bucket holds one ordered ring of items (ordered by tag, then
 * key); the bucket's head pointer may point at any item of the ring and is
 * moved to hot items, so a hot key is found in ~1 step.
 *
 * Items carry a record: key, value and the node's metadata (version, seqno,
 * expire_at, flags). An item with a key of up to 8 bytes, a value of up to 8
 * bytes, no expiry and a seqno below 2^48 is one 64-byte cache line. Values
 * up to 8 bytes are updated in place (under a per-item seqlock) when the new
 * record fits the item; others by read-copy-update (the old item's next word
 * is pointed at its replacement with the Occupied bit set, in one CAS).
 * Memory is reclaimed through liburcu (memb flavour, call_rcu).
 *
 * Threads: every thread that calls into an index must be registered with
 * liburcu's memb flavour (hr_thread_register()); the functions take their own
 * RCU read-side sections (they may be called inside an outer one). No call
 * blocks on another thread, except hr_close(), hr_barrier() and hr_rehash(),
 * and accesses to one key, which wait for an in-flight in-place rewrite of
 * that key (a few stores). The implementation notes are in hr_ring.c
 * (lock-free rings), hotring.c (records), hr_hot.c (hotspots) and
 * hr_rehash.c (rehash).
 */
#ifndef KV_NODE_INDEX_HOTRING_H
#define KV_NODE_INDEX_HOTRING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

typedef struct hr_index hr_index;

#define HR_MAX_KEY_BYTES 4096u /* longer keys are INVALID_ARGUMENT */

/* Hotspot-shift strategies of the paper (§3.2). */
typedef enum hr_mode {
    HR_MODE_NONE = 0,   /* head never moves on its own (baseline; hr_pin still works) */
    HR_MODE_RANDOM = 1, /* random movement: every R-th access may move the head */
    HR_MODE_SAMPLE = 2, /* statistical sampling with W_t head selection */
} hr_mode;

/* hr_open(out, NULL) uses {1024 buckets, HR_MODE_SAMPLE, R = 5, rehash on,
 * cost 8}. With explicit options, mode is taken as given (0 = HR_MODE_NONE)
 * and a zero buckets / r / rehash_cost field means its default. */
typedef struct hr_opts {
    uint64_t buckets;   /* initial bucket count, rounded up to a power of two (2..2^32) */
    hr_mode mode;       /* hotspot strategy */
    unsigned r;         /* access period R (default 5) */
    bool rehash;        /* lock-free rehash driven by access cost (runs a worker thread) */
    double rehash_cost; /* average items visited per access that triggers a rehash (8) */
} hr_opts;

/* Record metadata stored beside each item's value. */
#define HR_F_TOMBSTONE 0x1u /* a delete marker (kept for last-writer-wins and flush) */
#define HR_F_DIRTY 0x2u     /* not yet flushed to the LSM */
#define HR_F_PINNED 0x4u    /* cluster hot-key hint: keep in memory */
#define HR_F_ALL 0x7u       /* every flag an item can carry (others are INVALID_ARGUMENT) */

typedef struct hr_meta {
    uint64_t version;   /* HLC version (last-writer-wins) */
    uint64_t seqno;     /* node-local sequence number */
    uint64_t expire_at; /* wall ms; 0 = never */
    uint32_t flags;     /* HR_F_* */
} hr_meta;

/* A consistent snapshot of one record, valid only during the callback. */
typedef struct hr_view {
    const void *key;
    size_t klen;
    const void *val;
    size_t vlen;
    hr_meta meta;
} hr_view;

typedef void (*hr_visit_fn)(void *arg, const hr_view *v);
/* Write condition: called with the current record (NULL when absent) and
 * returns KV_OK to apply the write or the kv_err to fail it with. It may run
 * more than once per call when a concurrent writer forces a retry, so it must
 * not have side effects beyond recording the latest decision. */
typedef kv_err (*hr_cond_fn)(void *arg, const hr_view *cur);

/* Registers / unregisters the calling thread with liburcu (memb flavour).
 * Call outside any read-side section; a thread registers once for all
 * indexes (urcu_memb_register_thread() done elsewhere counts too). */
void hr_thread_register(void);
void hr_thread_unregister(void);

/* Creates an index. On success *out owns it; close with hr_close(). Fails with
 * INVALID_ARGUMENT for bad options, RESOURCE_EXHAUSTED when out of memory and
 * FAILED_PRECONDITION when heap pointers do not fit the 48-bit packing of the
 * head/next words (logged). *out is written only on success. Any thread; no
 * read-side section needed. With opts->rehash it starts one worker thread. */
kv_err hr_open(hr_index **out, const hr_opts *opts);
/* Frees the index and every item (stops the rehash worker, waits for pending
 * reclamation). No other thread may use it any more; must not be called
 * inside an RCU read-side section. Closing NULL is a no-op. */
void hr_close(hr_index *idx);

/* Looks key up; on a hit calls fn(arg, view) once with a consistent snapshot
 * and returns KV_OK, else returns KV_NOT_FOUND (fn not called). fn may be NULL
 * (existence check). The view's key and (for values over 8 bytes) value point
 * into the item and stay valid only during the callback; fn runs inside the
 * index's read-side section and must not block for long or call hr_close,
 * hr_barrier or hr_rehash. Any registered thread; takes its own read-side
 * section. INVALID_ARGUMENT for a NULL index/key or a key of 0 or >4096 B. */
kv_err hr_get(hr_index *idx, const void *key, size_t klen, hr_visit_fn fn, void *arg);

/* One key of a batched lookup. */
typedef struct hr_key {
    const void *key;
    size_t klen;
} hr_key;
/* Called by hr_get_batch for the key keys[i] that was found. */
typedef void (*hr_visit_at_fn)(void *arg, size_t i, const hr_view *v);

/* Looks up keys[0..n-1] as n hr_get calls would, but overlaps their memory
 * accesses (the bucket words and head items of up to 16 keys are fetched
 * together), which is faster when most keys are found at their ring's head.
 * Calls fn(arg, i, view) once for each key found, in increasing i, with a
 * consistent snapshot valid only during the call (fn may be NULL); a key
 * given twice is looked up twice. Each lookup is atomic on its own, not the
 * batch. On KV_OK writes the number of keys found to *hits (hits may be
 * NULL). INVALID_ARGUMENT for a NULL index, NULL keys with n > 0 or any
 * invalid key (as hr_get; then no key is looked up). fn runs inside the
 * index's read-side section, as for hr_get. Any registered thread; takes
 * its own read-side sections (one per 16 keys). */
kv_err hr_get_batch(hr_index *idx, const hr_key *keys, size_t n, hr_visit_at_fn fn, void *arg,
                    size_t *hits);

/* Inserts or replaces key's record when cond (may be NULL = always) allows.
 * Returns KV_OK, cond's error, RESOURCE_EXHAUSTED on allocation failure, or
 * INVALID_ARGUMENT (bad key, NULL value with vlen > 0, flags outside
 * HR_F_ALL). meta NULL = zeros. The index copies key and value; the caller
 * keeps ownership of its buffers. Values of up to 8 bytes replacing an inline
 * value are written in place (unless the new expire_at/seqno need the
 * extended record an item without expiry lacks), others by RCU replacement. cond runs inside the
 * index's read-side section while this writer holds the key (other writers of the key wait). Any
 * registered thread; takes its own read-side section. */
kv_err hr_upsert(hr_index *idx, const void *key, size_t klen, const void *val, size_t vlen,
                 const hr_meta *meta, hr_cond_fn cond, void *arg);

/* An item built ahead of a write by hr_prepare, for hr_upsert_prepared.
 * Zero-initialise it; the item is private to the caller until then. */
typedef struct hr_prep {
    void *item;
} hr_prep;

/* Builds the item that an hr_upsert of this record may need, so that the
 * write itself cannot fail for lack of memory (the engine prepares before
 * its WAL append: a record in the WAL must reach the memory tier). Returns
 * KV_OK (p->item set), INVALID_ARGUMENT as hr_upsert, RESOURCE_EXHAUSTED.
 * Any registered thread; no read-side section needed. */
kv_err hr_prepare(hr_index *idx, const void *key, size_t klen, const void *val, size_t vlen,
                  const hr_meta *meta, hr_prep *p);
/* hr_upsert with the item prepared in p (p may be NULL or empty: then as
 * hr_upsert). key, value and meta must be the ones p was built with. With
 * a prepared item it allocates nothing: it returns KV_OK or cond's error
 * (or INVALID_ARGUMENT when the arguments differ from hr_prepare's checks).
 * Consumes p in every case (an item left unused, by an in-place update or a
 * refusing cond, is freed). */
kv_err hr_upsert_prepared(hr_index *idx, const void *key, size_t klen, const void *val, size_t vlen,
                          const hr_meta *meta, hr_cond_fn cond, void *arg, hr_prep *p);
/* Frees an item prepared and not used; NULL or empty p is a no-op. */
void hr_prep_release(hr_prep *p);

/* Removes key's item when cond allows. Returns KV_OK, NOT_FOUND or cond's
 * error. The item is freed after RCU grace periods (hr_barrier waits). Any
 * registered thread; takes its own read-side section. */
kv_err hr_remove(hr_index *idx, const void *key, size_t klen, hr_cond_fn cond, void *arg);

/* Atomically sets `set` and clears `clear` flag bits of key's item if its
 * seqno equals `seqno` (used to clear HR_F_DIRTY after a flush). Returns
 * KV_OK, NOT_FOUND, FAILED_PRECONDITION when the seqno differs, or
 * INVALID_ARGUMENT when `set` has bits outside HR_F_ALL. Any
 * registered thread; takes its own read-side section. */
kv_err hr_set_flags(hr_index *idx, const void *key, size_t klen, uint64_t seqno, uint32_t set,
                    uint32_t clear);

/* Calls fn for every item, one consistent snapshot each, bucket by bucket in
 * tag order; concurrent writes may or may not be seen, no item is visited
 * twice. Takes one read-side section per bucket (fn runs inside it). Any
 * registered thread. */
void hr_iterate(hr_index *idx, hr_visit_fn fn, void *arg);

/* Cluster hot-key hint: sets HR_F_PINNED on key's item and makes it the head
 * of its ring. Neither sampling nor random movement moves a pinned head to
 * an unpinned item (between pinned items of one ring sampling decides), so
 * a replica that sees few of the key's reads keeps it at the head too. Clear
 * the flag with hr_set_flags to unpin. Returns KV_OK or
 * NOT_FOUND. Any registered thread; takes its own read-side section. */
kv_err hr_pin(hr_index *idx, const void *key, size_t klen);

/* Doubles the bucket count now with the lock-free rehash (the worker does the
 * same when the access cost exceeds opts.rehash_cost). Blocks the caller
 * (grace periods), never other threads. Must not be called inside an RCU
 * read-side section. Returns KV_OK or RESOURCE_EXHAUSTED (out of memory, or
 * the table already has 2^32 buckets, the most the 32-bit item tags split). */
kv_err hr_rehash(hr_index *idx);

/* Counters are per-thread shards summed on demand (approximate while
 * threads run). read_visited/reads = average items visited per read;
 * head_hits/reads = share of reads answered by the head item;
 * pinned_head_hits/pinned_reads = the same share among reads of pinned keys
 * (counted only when the item found is pinned, so unpinned reads pay one
 * flag test). */
typedef struct hr_stats {
    uint64_t items, bytes, buckets;
    uint64_t reads, writes, read_visited; /* visited/reads = avg items per read */
    uint64_t head_hits;                   /* reads answered by the head item */
    uint64_t head_moves, sample_rounds, rehashes;
    uint64_t pinned_reads;     /* reads that found an item carrying HR_F_PINNED */
    uint64_t pinned_head_hits; /* of those, reads answered by the ring head */
} hr_stats;
/* Fills *out. Any thread, no read-side section needed. */
void hr_get_stats(hr_index *idx, hr_stats *out);

/* Fault injection for tests: the calling thread's next n item allocations
 * (hr_upsert, hr_prepare) fail with RESOURCE_EXHAUSTED. 0 ends it. */
void hr_test_fail_allocs(unsigned n);

/* Waits until every item retired so far has been freed (tests, shutdown).
 * Must not be called inside an RCU read-side section. */
void hr_barrier(void);

#endif
