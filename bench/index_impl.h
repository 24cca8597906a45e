/* SPDX-License-Identifier: MIT */
/*
 * The interface index_bench drives: one table of functions per in-memory hash
 * index under comparison (HotRing in two modes, a lock-free chaining hash,
 * liburcu's cds_lfht fixed and auto-resizing). Every implementation copies
 * keys and values, copies the value out on a hit, and reclaims memory through
 * liburcu's memb flavour, so the comparison measures the index and not the
 * harness. All entry points except open/close/settle/bucket_bytes may be
 * called concurrently from threads that called thread_enter(); those four are
 * called from one thread registered with liburcu's memb flavour while no
 * other thread uses the index.
 */
#ifndef KV_BENCH_INDEX_IMPL_H
#define KV_BENCH_INDEX_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

#define IB_MAX_BATCH 64 /* longest --batch */

typedef struct ib_params {
    uint64_t keys;    /* records to be loaded */
    uint64_t buckets; /* bucket count: keys / ratio rounded up to a power of two */
    size_t value_size;
    bool rehash;        /* hotring: lock-free rehash on */
    unsigned hr_r;      /* hotring: access period R */
    double rehash_cost; /* hotring: 0 = library default */
    uint64_t lfht_init; /* lfht-auto: initial bucket count (power of two) */
} ib_params;

/* The record metadata every index stores beside a value and returns on a hit
 * (what the node's memory tier keeps per record: HotRing's hr_meta), so all
 * indexes carry and read the same item payload. index_bench writes zeros. */
typedef struct ib_meta {
    uint64_t version, seqno, expire_at;
    uint32_t flags, pad;
} ib_meta;

/* What one read saw, for chains whose index keeps no statistics itself. */
typedef struct ib_probe {
    uint32_t visited; /* items compared */
    bool head;        /* answered by the first item of the chain */
    ib_meta meta;     /* the record's metadata on a hit (every index fills it) */
} ib_probe;

/* Cumulative read statistics kept by the index itself (hotring). */
typedef struct ib_rstats {
    uint64_t reads, visited, head_hits;
} ib_rstats;

typedef struct ib_impl {
    const char *name;
    /* Creates an empty index. */
    kv_err (*open)(void **h, const ib_params *p);
    /* Frees the index and its items; no other thread may use it. NULL is ok. */
    void (*close)(void *h);
    /* Registers / unregisters the calling thread with RCU. */
    void (*thread_enter)(void);
    void (*thread_exit)(void);
    /* On a hit copies up to cap bytes of the value to val and the record's
     * metadata to pr->meta and returns true. Fills pr's visited/head when the
     * implementation can (visited == 0 otherwise). */
    bool (*get)(void *h, const void *key, size_t klen, void *val, size_t cap, ib_probe *pr);
    /* Optional (NULL: the runner calls get once per key). Reads the n keys of
     * klen bytes at keys, keys + klen, ... as one batch: on a hit copies up
     * to cap bytes of key i's value to vals + i * cap and its metadata to
     * metas[i] (left alone on a miss). Returns the number of keys found.
     * n <= IB_MAX_BATCH. Fills no probes (visited / head hits come from
     * rstats, or are unknown). */
    size_t (*get_batch)(void *h, const unsigned char *keys, size_t klen, size_t n,
                        unsigned char *vals, size_t cap, ib_meta *metas);
    /* Inserts or replaces key's value. */
    kv_err (*put)(void *h, const void *key, size_t klen, const void *val, size_t vlen);
    /* Native read statistics; NULL when the index keeps none. */
    void (*rstats)(void *h, ib_rstats *out);
    /* Waits for background work after the load (lfht resizes); may be NULL. */
    void (*settle)(void *h);
    /* Bytes of bucket memory (head array / bucket nodes), excluding items. */
    uint64_t (*bucket_bytes)(void *h);
    /* The index's current bucket count (after a rehash or resize). */
    uint64_t (*buckets)(void *h);
    /* Bytes requested from malloc for one item of this key and value size. */
    uint64_t (*item_bytes)(void *h, size_t klen, size_t vlen);
    bool probes; /* get() fills ib_probe */
} ib_impl;

extern const ib_impl ib_chain_impl;
extern const ib_impl ib_lfht_impl;
extern const ib_impl ib_lfht_auto_impl;
#ifdef KV_BENCH_HAVE_HOTRING
extern const ib_impl ib_hotring_s_impl;
extern const ib_impl ib_hotring_r_impl;
#endif

#endif
