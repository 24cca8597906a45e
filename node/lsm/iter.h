/* SPDX-License-Identifier: MIT */
/*
 * Sorted record sources and the merging iterator over them (iter.c), shared
 * by compaction (compact.c), RALT's run merges (ralt.c) and the public
 * lsm_iter (lsm.h). A source is anything that yields lsm_recs in key order
 * behind a small vtable: an SST (lsm_sst_src), a sorted level of
 * non-overlapping SSTs walked file after file (lsm_level_src, LevelDB's
 * two-level iterator), or a caller's own (RALT's in-memory buffer). The
 * merger (LevelDB's MergingIterator, with a binary heap instead of its
 * linear scan) yields every record of every source, ordered by key
 * ascending, then seqno descending, then the sources' rank ascending (a
 * caller-given tie-breaker: compaction ranks the from level above the to
 * level, RALT its oldest run first), then source index. Every step costs
 * O(log n) comparisons for n sources.
 *
 * Errors: a source that fails (a corrupt or unreadable block) stops the
 * merger: lsm_merge_valid turns false and lsm_merge_error names the source
 * and the file. Records returned by cur() point into the source's buffers
 * and stay valid until that source moves (any seek/next of the merger).
 *
 * Threads: a source and a merger belong to one thread at a time; SST
 * readers are shared read-only, so any number of them may run at once.
 */
#ifndef KV_NODE_LSM_ITER_H
#define KV_NODE_LSM_ITER_H

#include "node/lsm/lsm_int.h"

typedef struct lsm_src lsm_src;

typedef struct lsm_src_ops {
    void (*first)(lsm_src *s);                              /* to the first record */
    void (*seek)(lsm_src *s, const void *key, size_t klen); /* first record with key >= key */
    void (*next)(lsm_src *s);                               /* only while valid */
    const lsm_rec *(*cur)(const lsm_src *s);                /* only while valid */
    bool (*valid)(const lsm_src *s);                        /* false at the end or on error */
    /* KV_OK, or the error that stopped it; *file (may be NULL) = the path of
     * the file that failed, or NULL when not a file. */
    kv_err (*error)(const lsm_src *s, const char **file);
    uint64_t (*bytes_read)(const lsm_src *s); /* file bytes read so far */
    void (*fini)(lsm_src *s);                 /* releases buffers; the source may be freed */
} lsm_src_ops;

/* The common head of every source; rank is the merger's tie-breaker. A
 * source is unpositioned (not valid) until first or seek. */
struct lsm_src {
    const lsm_src_ops *ops;
    int rank;
};

/* One SST; its iterator (read-ahead, verified blocks) starts at first/seek. */
typedef struct lsm_sst_src {
    lsm_src base;
    lsm_sst *sst; /* borrowed: the caller keeps the file referenced */
    lsm_sst_iter it;
    bool open;
    uint64_t bytes; /* read by iterators already closed */
} lsm_sst_src;

void lsm_sst_src_init(lsm_sst_src *s, lsm_sst *sst, int rank);

/* A sorted level: files (ascending, non-overlapping; borrowed) walked in
 * order, only one file's iterator open at a time, opened when reached. */
typedef struct lsm_level_src {
    lsm_src base;
    lsm_file *const *files;
    size_t n, i; /* files[i] is the open one */
    lsm_sst_src cur;
} lsm_level_src;

void lsm_level_src_init(lsm_level_src *s, lsm_file *const *files, size_t n, int rank);

/* Index of the first of n sorted, non-overlapping files whose largest key
 * >= key (n when none). */
size_t lsm_level_find(lsm_file *const *files, size_t n, const void *key, size_t klen);

typedef struct lsm_merge {
    lsm_src **src; /* borrowed array, n sources */
    size_t n;
    size_t *heap; /* indices of the valid sources, a binary min-heap */
    size_t nheap;
    kv_err err;
    size_t bad; /* the source that failed (when err) */
} lsm_merge;

/* Prepares a merger over src[0..n) (borrowed; n may be 0). Returns KV_OK or
 * RESOURCE_EXHAUSTED. Position it with lsm_merge_first or lsm_merge_seek. */
kv_err lsm_merge_init(lsm_merge *m, lsm_src **src, size_t n);
void lsm_merge_first(lsm_merge *m);
void lsm_merge_seek(lsm_merge *m, const void *key, size_t klen);
/* Moves past the current record (only while valid). */
void lsm_merge_next(lsm_merge *m);
bool lsm_merge_valid(const lsm_merge *m);
/* The current record and the index of its source (only while valid). */
const lsm_rec *lsm_merge_cur(const lsm_merge *m);
size_t lsm_merge_top(const lsm_merge *m);
/* KV_OK, or the error that stopped the merger; *src and *file (each may be
 * NULL) name the source index and the file. */
kv_err lsm_merge_error(const lsm_merge *m, size_t *src, const char **file);
uint64_t lsm_merge_bytes(const lsm_merge *m);
/* Calls every source's fini and frees the heap. */
void lsm_merge_fini(lsm_merge *m);

#endif
