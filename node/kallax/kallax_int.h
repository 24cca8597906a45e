/* SPDX-License-Identifier: MIT */
/*
 * Internals of kallax shared by its files and tests: opening, block I/O and
 * the block image codec (store.c), lookups and the iterator (read.c), the
 * flush, extents and the cleanup (flush.c), the journal and the commit
 * through it (journal.c).
 */
#ifndef KV_NODE_KALLAX_KALLAX_INT_H
#define KV_NODE_KALLAX_KALLAX_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "node/kallax/kallax.h"
#include "node/lsm/lsm_int.h"

#define KX_LOG "kallax"
#define KX_MAGIC 0x3142584bu /* "KXB1" */
#define KX_HDR 16u
#define KX_PAYLOAD (KALLAX_BLOCK - KX_HDR)
#define KX_REC_HDR 31u
#define KX_EXT_REF 16u
#define KX_F_TOMB 0x1u
#define KX_F_EXTENT 0x2u
#define KX_STRIPES 4096u

/* ---- block images (store.c) ---- */

/* One record as stored in a block; key/value point into the image (value
 * is the extent reference when ext). */
typedef struct kx_slot {
    const uint8_t *key, *val;
    size_t klen, vlen; /* vlen: the value's length (also for an extent) */
    uint64_t version, seqno, expire_at;
    uint8_t flags;
    uint64_t ext_page;
    uint32_t ext_crc;
    size_t off, size; /* the record's place in the image */
} kx_slot;

/* Summary of an image, for the store's counters. */
typedef struct kx_sum {
    uint64_t records, tombstones, used, spilled, ext_pages;
    uint64_t max_version; /* of the block's records */
} kx_sum;

void kx_block_init(uint8_t *img);
/* Verifies img as block number blk: KV_OK or DATA_LOSS. */
kv_err kx_block_check(const uint8_t *img, uint64_t blk);
/* Sets the crc of img for block number blk. */
void kx_block_seal(uint8_t *img, uint64_t blk);
unsigned kx_block_count(const uint8_t *img);
unsigned kx_block_used(const uint8_t *img);
unsigned kx_block_spill(const uint8_t *img);
void kx_block_set_spill(uint8_t *img, unsigned spill);
/* Decodes record i at *off (start with *off = KX_HDR) of a checked image. */
void kx_block_next(const uint8_t *img, size_t *off, kx_slot *s);
/* Finds key in img: true and *s. */
bool kx_block_find(const uint8_t *img, const void *key, size_t klen, kx_slot *s);
/* Removes the record at s (found in img). */
void kx_block_remove(uint8_t *img, const kx_slot *s);
/* Bytes a record takes in a block (inline or with an extent reference). */
size_t kx_rec_size(size_t klen, size_t vlen, bool ext);
/* Appends a record if it fits: true when added. ext: the value lives in an
 * extent (page, crc). */
bool kx_block_add(uint8_t *img, const lsm_rec *r, bool ext, uint64_t page, uint32_t crc);
/* Copies slot s out as an lsm_rec (key, value malloc'ed; an extent's value
 * is left NULL with vlen set, for the caller to read). */
kv_err kx_slot_copy(const kx_slot *s, lsm_rec *out);
/* Counters of img as block blk of a store with home(key) = home_fn. */
void kx_block_sum(const kallax *kx, const uint8_t *img, uint64_t blk, kx_sum *out);
/* Pages an extent of len bytes takes. */
uint64_t kx_ext_pages(uint64_t len);

/* ---- the store (store.c, read.c) ---- */

typedef struct kx_extmap {
    pthread_mutex_t mu;
    uint64_t *bits; /* one bit per page, 1 = used */
    uint64_t npages, used, cursor;
    uint64_t *pending, npending, cappending;    /* freed, reusable after the next flush */
    uint64_t *deferred, ndeferred, capdeferred; /* freed by the flush before */
} kx_extmap;

struct kallax {
    kallax_opts o;
    uint64_t nblocks; /* N + P */
    lsm_vol vol;
    int blocks_fd, ext_fd, journal_fd, meta_fd, lock_fd;
    lsm_wal *wal;
    uint64_t wal_number; /* next segment number (flush_mu) */
    pthread_mutex_t flush_mu;
    pthread_rwlock_t move_lock;
    pthread_rwlock_t stripes[KX_STRIPES];
    uint64_t meta_seq, flushed_seq;                    /* flush_mu */
    _Atomic uint64_t last_seq, flush_gen, flushed_pub; /* flushed_pub: flushed_seq, for stats */
    kx_extmap ext;
    /* the last journal round, to repair a block found corrupt (flush_mu
     * for writers, jmu for readers) */
    pthread_mutex_t jmu;
    uint64_t *jblocks; /* block numbers in journal order */
    size_t njblocks;
    uint64_t jhdr; /* header pages before the images */
    /* counters */
    _Atomic uint64_t records, tombstones, used_bytes, spilled;
    /* At least the highest version of any stored record (kallax_max_version):
     * raised by kx_count for every block image counted in (the open scan,
     * flushed images), never lowered; UINT64_MAX after a corrupt block,
     * whose records' versions are unknown. */
    _Atomic uint64_t max_version;
    _Atomic uint64_t block_reads, spill_reads, block_writes, journal_bytes, flushes, moves;
    _Atomic uint64_t corrupt, repaired, retries, user_bytes;
};

/* flush_mu, with a thread-local mark so that a block read inside a flush
 * repairs a corrupt block without taking it again. */
void kx_flush_lock(kallax *kx);
void kx_flush_unlock(kallax *kx);
/* Reads block blk verified: a torn read (crc) is retried under the stripe
 * lock, then repaired from the journal if it holds the block; DATA_LOSS
 * (logged with file and block) otherwise. */
kv_err kx_read_block(kallax *kx, uint64_t blk, uint8_t *img);
/* move_lock shared for reading several blocks consistently. While it is
 * held, a block that needs a repair from the journal makes the read return
 * KV_UNAVAILABLE: release the lock, call kx_repair_deferred (KV_OK: the
 * block is repaired, read again; or the read's error) and start over. */
void kx_move_read_lock(kallax *kx);
void kx_move_read_unlock(kallax *kx);
kv_err kx_repair_deferred(kallax *kx);
/* Verifies an image read without the lock (kx_read_block's retry path). */
kv_err kx_check_read(kallax *kx, uint64_t blk, uint8_t *img);
/* Writes one block image in place under its stripe lock (no fsync). */
kv_err kx_write_block(kallax *kx, uint64_t blk, const uint8_t *img);
/* Finds key in its window (home block, then its spill blocks under
 * move_lock); home_img is the home block when the caller read it already
 * (NULL: read here). KV_OK + *out (deep copy, extent value read), NOT_FOUND,
 * or an error. */
kv_err kx_lookup(kallax *kx, const void *key, size_t klen, const uint8_t *home_img, lsm_rec *out);
/* Reads the value of an extent slot into out->value (malloc'ed): KV_OK or
 * DATA_LOSS (crc, logged). */
kv_err kx_ext_read(kallax *kx, const kx_slot *s, lsm_rec *out);
/* Adds/subtracts a block summary to the counters. */
void kx_count(kallax *kx, const kx_sum *s, int sign);
/* Writes META slot (seq % 2) with the flushed seqno and fdatasyncs it. */
kv_err kx_meta_write(kallax *kx, uint64_t flushed);

/* ---- extents (flush.c) ---- */

kv_err kx_ext_init(kx_extmap *m, uint64_t npages);
void kx_ext_fini(kx_extmap *m);
/* Marks [page, page + n) used (open's scan). */
kv_err kx_ext_mark(kx_extmap *m, uint64_t page, uint64_t n);
/* Allocates n contiguous pages: KV_OK + *page (the map grows as needed). */
kv_err kx_ext_alloc(kx_extmap *m, uint64_t n, uint64_t *page);
/* Queues [page, page + n) to be freed after the flush after next. */
kv_err kx_ext_free_later(kx_extmap *m, uint64_t page, uint64_t n);
/* A flush completed: the frees queued before the previous one become free. */
void kx_ext_flush_done(kx_extmap *m);
/* Frees [page, page + n) now (the flush that allocated it failed). */
void kx_ext_free_now(kx_extmap *m, uint64_t page, uint64_t n);
void kx_ext_counts(kx_extmap *m, uint64_t *pages, uint64_t *used, uint64_t *mem);
/* Writes value (len bytes) at page, zero-padded to whole pages. */
kv_err kx_ext_write(kallax *kx, uint64_t page, const void *val, size_t len);

/* ---- flush and journal (flush.c, journal.c) ---- */

/* A block loaded by a flush or cleanup: its image as read (orig) and as
 * changed (img, with records past the tombstone grace dropped). */
typedef struct kx_tblock {
    uint64_t blk;
    bool dirty;
    uint8_t orig[KALLAX_BLOCK], img[KALLAX_BLOCK];
} kx_tblock;

/* The blocks of one flush (open addressing blk -> index; entries are
 * allocated one by one, so pointers to them stay valid). */
typedef struct kx_tab {
    kallax *kx;
    uint64_t now;
    kx_tblock **b;
    size_t n, cap, *map, mapcap;
    uint64_t *newext; /* (page, pages) pairs allocated by this flush */
    size_t nnew, capnew;
    bool moved;      /* a record changed blocks */
    unsigned rounds; /* journal rounds committed */
    char msg[192];
} kx_tab;

/* Loads block blk into t (once): KV_OK + *out, or the read's error. */
kv_err kx_tab_get(kx_tab *t, uint64_t blk, kx_tblock **out);
void kx_tab_free(kx_tab *t);
/* Writes the changed blocks of t through the journal, updates the counters,
 * queues the extent pages no longer referenced, and records flushed in
 * META when it moved. flush_mu held. */
kv_err kx_commit(kx_tab *t, uint64_t flushed);

/* Open: copies a complete journal over its blocks (fsync), else ignores it.
 * *applied = images copied. */
kv_err kx_journal_recover(kallax *kx, uint64_t *applied);
/* Reads block blk's image from the last journal round into img: KV_OK,
 * NOT_FOUND (not there), or an error. */
kv_err kx_journal_lookup(kallax *kx, uint64_t blk, uint8_t *img);

#endif
