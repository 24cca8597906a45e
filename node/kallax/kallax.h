/* SPDX-License-Identifier: MIT */
/*
 * kallax: a table-less persistent hash store (KallaxDB, DaMoN'21), the
 * node's alternative to the LSM on storage with transparent compression.
 * No hash table is kept in memory: a key's hash names the 4 KiB block of a
 * block file that holds it, so a lookup is one block read and the memory
 * that grows with the number of keys is zero. Almost every block is partly
 * empty; a device that compresses each block it stores turns that logical
 * waste into almost no physical space. The API has the LSM's shape (lsm.h)
 * and its record type (lsm_rec), so the engine runs over either store.
 *
 * Files in opts.dir: BLOCKS (the block file), EXTENTS (big values), JOURNAL
 * (the double-write journal), META (two checksummed slots), *.wal (the WAL,
 * node/lsm/wal.c reused unchanged), LOCK (flock: one handle per directory).
 *
 * Decisions:
 *
 *  Placement. BLOCKS holds N + P blocks of 4 KiB: N home blocks (opts.blocks,
 *  kvnode --kallax-blocks N or --kallax-gb G = G GiB / 4 KiB) and P = probe
 *  tail blocks that only take spilled records (so a probe window never wraps).
 *  home(key) = xxh64(key, seed KALLAX_SEED) mod N. The seed is not the ring's
 *  (xxh64 seed 0): a node owns the keys of some ring ranges, and hashing them
 *  with the ring's function would crowd them into a few regions of the file.
 *  N is fixed when the store is created (the file is formatted then: every
 *  block written as a valid empty block, so an all-zero block is corruption,
 *  not emptiness); reopening with another N is INVALID_ARGUMENT.
 *
 *  Block format: a 16-byte header [u32 magic "KXB1"][u32 crc32c][u16 count]
 *  [u16 used][u8 spill][u8 0][u16 0] followed by `count` packed records:
 *  [u16 klen][u8 flags][u32 vlen][u64 version][u64 seqno][u64 expire_at]
 *  [key][value, or a 16-byte extent reference when flags has EXTENT]. flags:
 *  TOMBSTONE, EXTENT. The crc covers the block number and bytes 8..4095, so
 *  a block written to the wrong place fails it too. Keys are at most
 *  KALLAX_MAX_KEY (1024) bytes: kallax's key limit (INVALID_ARGUMENT beyond).
 *
 *  Spill: linear probing. A record goes to the first block of its window
 *  home, home+1, ..., home+P (P = opts.probe, default 16) with room; an update
 *  that still fits stays where it is, one that no longer fits moves to a
 *  later block of the window (never an earlier one). The home block's spill
 *  byte is an upper bound of the distance at which a record of that home
 *  lives (made exact when a flush has the whole window loaded), so a lookup
 *  reads the home block, and the next `spill` blocks only when the key is
 *  not in it. How often the common case (one read) holds depends on the
 *  load by bytes and on how many records a block holds (measured, P = 16,
 *  keys of 8 bytes, 4000 blocks): 100-byte values (~30 per block): no record
 *  spilled at 60% load, 0.3% at 71%, a window full first at 89%; 1 KiB
 *  values (3 per block): 2.8% spilled at 25% load, 6.9% at 38%, 10% at 45%,
 *  a window full first at 57% (51% with P = 8). So size N for a load of
 *  about 25% with KiB records and 60% with small ones: on a compressing
 *  drive the empty space costs almost no physical space, which is the
 *  design's premise. When a record finds no room in its whole window, the
 *  flush fails with RESOURCE_EXHAUSTED and a message naming the block and
 *  --kallax-blocks (nothing of it is written; the engine keeps the records
 *  dirty and the WAL keeps them).
 *
 *  Extents: a record whose header + key + value exceeds opts.inline_max
 *  (default 2048, at most a block's payload) keeps its value in EXTENTS,
 *  referenced from the block by [u64 page][u32 length][u32 crc32c of the
 *  value]. Extent space is allocated in 4 KiB pages, first fit from a
 *  rotating cursor in a free bitmap (one bit per page: memory grows with big
 *  values' space, not with keys), the file grows when no run fits. The bitmap
 *  is not stored: open rebuilds it from the references in the blocks (open
 *  reads every block once, which also verifies them and counts records).
 *  Pages of a replaced or deleted value are freed only once the blocks that
 *  dropped the reference are synced, and one flush later still (a reader
 *  that read the old block just before may still read them); a reader whose
 *  extent fails its crc re-reads the block and retries.
 *
 *  Crash safety: a write is durable when kallax_wal_append returns (per the
 *  sync mode). A flush builds the new images of the blocks it changes in
 *  memory, writes and fsyncs the new extents, writes the images with their
 *  block numbers to JOURNAL and fsyncs it (InnoDB's doublewrite buffer),
 *  then writes the images in place and fsyncs BLOCKS, then records the
 *  flushed seqno in META and deletes the WAL segments it covers. A crash
 *  before the journal is complete leaves every block as it was (the WAL
 *  replays); after, open copies the journal's images over their blocks. So
 *  a torn in-place write never loses the records of that block flushed
 *  earlier. Every block read is checked: a bad block is reported DATA_LOSS
 *  naming the file and block, never returned as data; a block that the last
 *  journal holds is rewritten from it (counted in kallax.repaired).
 *
 *  Concurrency: one flush at a time (flush_mu). In-place writes go in
 *  descending block order, each under its block's stripe write lock, so a
 *  moved record is in its new block before it leaves its old one, and a
 *  home block's spill byte grows only after the record that needs it is
 *  there. A lookup reads its home block without a lock (a read torn by a
 *  concurrent write fails its crc and is read again under the stripe lock);
 *  reading spill blocks, and iterating, hold move_lock shared, which a flush
 *  that moves records between blocks holds exclusively while it writes.
 *
 *  Iteration order: (home block, key by lsm_key_cmp), kallax_key_cmp. It is
 *  a total order and resumable after a key, since the home block of the
 *  resume key is computed from it. The iterator pins nothing: blocks change
 *  in place. Its equivalent of the LSM's pinned version: a record stored
 *  when the iterator opens is returned (the newest stored version of its
 *  key when its home block is read), because records only move forward
 *  inside their window and the iterator reads a home's window under
 *  move_lock; records flushed later may or may not be seen.
 *
 *  Tombstones and expired records are stored as written (the engine filters
 *  them) and dropped from a block the flush rewrites once older than
 *  opts.tombstone_grace_ms (measured as in lsm_opts).
 *
 * Threads: every function may be called from any thread unless its comment
 * says otherwise; kallax_close must not race another call. Errors are
 * kv_err; out-parameters are written only on KV_OK.
 */
#ifndef KV_NODE_KALLAX_KALLAX_H
#define KV_NODE_KALLAX_KALLAX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"
#include "node/lsm/lsm.h"

#define KALLAX_BLOCK 4096u
#define KALLAX_SEED 0x4b414c4c415844ull /* "KALLAXD": not the ring's seed 0 */
#define KALLAX_MAX_KEY 1024u
#define KALLAX_MAX_PROBE 64u

typedef struct kallax kallax;

typedef struct kallax_opts {
    const char *dir;     /* directory (created if missing); required */
    uint64_t blocks;     /* N home blocks; 0 = the existing store's (required for a new one) */
    unsigned probe;      /* P: probe window after the home block, default 8, 1..64 */
    unsigned inline_max; /* largest record kept inline, default 2048, 64..4080 */
    lsm_sync sync;       /* WAL sync mode, as lsm_opts */
    unsigned sync_ms;    /* LSM_SYNC_BATCH period, default 5 */
    bool disable_io_uring;
    uint64_t tombstone_grace_ms;   /* as lsm_opts */
    unsigned journal_blocks;       /* block images per journal round (its size), default 1024 */
    lsm_wal_recovery wal_recovery; /* WAL corruption before its tail, as lsm_opts */
    /* The wall clock for expiry and the tombstone grace, as lsm_opts.clock;
     * NULL = kv_wall_ms. */
    kv_clock_fn clock;
    void *clock_arg;
} kallax_opts;

/* Fills o with the defaults above (dir NULL, blocks 0). */
void kallax_opts_default(kallax_opts *o);

/* Opens (creating and formatting if needed) the store in o->dir: reads META,
 * copies a complete journal over its blocks, reads every block (verifying
 * it, rebuilding the extent map and the counters), replays the WAL records
 * newer than the flushed seqno through fn (may be NULL; as lsm_replay_fn)
 * and opens a new WAL segment. Returns KV_OK and *out; INVALID_ARGUMENT on
 * bad options (the message, logged, names the option: blocks, probe,
 * inline_max, or a block count that differs from the store's);
 * FAILED_PRECONDITION when another handle holds the directory; DATA_LOSS
 * when META is corrupt; RESOURCE_EXHAUSTED when the volume is full;
 * INTERNAL on other I/O errors; or fn's error. A corrupt block found by the
 * scan is logged and counted (kallax.corrupt_blocks), not fatal: reads of
 * its keys return DATA_LOSS. On failure nothing is left open. */
kv_err kallax_open(kallax **out, const kallax_opts *o, lsm_replay_fn fn, void *arg);

/* Stops the WAL thread, fsyncs the WAL, frees kx. Flushes nothing (the WAL
 * holds what the caller did not flush). NULL is a no-op. No concurrent call. */
void kallax_close(kallax *kx);

/* Highest seqno seen (stored records, replayed WAL records, appends). */
uint64_t kallax_last_seqno(kallax *kx);

/* As lsm_max_version: at least the highest version of any stored record
 * (the WAL's not included), 0 for an empty store, UINT64_MAX when a block
 * found corrupt at open hid some. Any thread. */
uint64_t kallax_max_version(kallax *kx);

/* As lsm_wal_append (group commit, atomic per call, durable per the sync
 * mode). INVALID_ARGUMENT also for a key over KALLAX_MAX_KEY. recs borrowed. */
kv_err kallax_wal_append(kallax *kx, const lsm_rec *recs, size_t n);

/* Applies a run of records (any order; per key the highest seqno wins) to
 * their blocks as described above and records max_seqno as flushed; then
 * deletes the WAL segments it covers. The run must hold the newest record
 * of every key written with a seqno in (previous flushed, max_seqno].
 * n == 0 only advances the flushed seqno. Returns KV_OK, INVALID_ARGUMENT
 * (a bad record, max_seqno below the flushed seqno), RESOURCE_EXHAUSTED (a
 * probe window full: nothing applied; or the volume full), DATA_LOSS (a
 * block to update is corrupt and not in the journal: nothing applied),
 * INTERNAL (I/O). recs borrowed. Serialised internally. */
kv_err kallax_flush(kallax *kx, const lsm_rec *recs, size_t n, uint64_t max_seqno);

/* Flushes installed since open, plus one per kallax_cleanup. */
uint64_t kallax_flush_generation(kallax *kx);

/* Fills *out with key's stored record (tombstones and expired records
 * included; key and value malloc'ed: lsm_rec_free). Returns KV_OK,
 * NOT_FOUND, DATA_LOSS (a block of the key's window is corrupt, or its
 * extent; logged with file and block), INVALID_ARGUMENT (klen 0 or over
 * KALLAX_MAX_KEY), RESOURCE_EXHAUSTED, INTERNAL. */
kv_err kallax_get(kallax *kx, const void *key, size_t klen, lsm_rec *out);

/* n lookups whose home blocks are read in one batch (io_uring). errs[i] and
 * outs[i] as kallax_get's. Returns KV_OK when the batch ran, or
 * RESOURCE_EXHAUSTED. */
kv_err kallax_multiget(kallax *kx, size_t n, const void *const *keys, const size_t *klens,
                       lsm_rec *outs, kv_err *errs);

/* The iteration order: home block, then lsm_key_cmp. <0, 0, >0. Any thread. */
int kallax_key_cmp(const kallax *kx, const void *a, size_t al, const void *b, size_t bl);
/* The home block of key (tests, statistics). */
uint64_t kallax_home(const kallax *kx, const void *key, size_t klen);

/* ---- iteration: every stored record (newest per key), in kallax_key_cmp
 * order, tombstones and expired records included. See the top of the file
 * for what it sees of concurrent flushes. One thread at a time; close every
 * iterator before kallax_close. */
typedef struct kallax_iter kallax_iter;

/* Returns KV_OK and *out (caller owns: kallax_iter_close), not positioned
 * (kallax_iter_seek), or RESOURCE_EXHAUSTED. No I/O. */
kv_err kallax_iter_open(kallax *kx, kallax_iter **out);
/* Positions it on the first record after `after` in kallax_key_cmp order
 * (NULL: the first). Returns KV_OK (kallax_iter_rec NULL at the end),
 * DATA_LOSS (a corrupt block, logged with file and block), INTERNAL; a
 * failed iterator keeps its error. after borrowed. */
kv_err kallax_iter_seek(kallax_iter *it, const void *after, size_t after_len);
/* Moves to the next record; returns as kallax_iter_seek. */
kv_err kallax_iter_next(kallax_iter *it);
/* The current record or NULL; valid until the next seek, next or close. */
const lsm_rec *kallax_iter_rec(const kallax_iter *it);
/* NULL is a no-op. */
void kallax_iter_close(kallax_iter *it);

/* Removes every record whose key keep rejects (lsm_keep_fn), rewriting the
 * blocks that held one through the journal; *dropped (may be NULL) = the
 * records removed. Bumps the flush generation. Returns KV_OK or the first
 * error (blocks rewritten before it stay). keep runs on the caller's thread.
 * Serialised with flushes. */
kv_err kallax_cleanup(kallax *kx, lsm_keep_fn keep, void *arg, uint64_t *dropped);

/* As lsm_wal_sync. */
kv_err kallax_wal_sync(kallax *kx);

/* As lsm_wal_live_bytes. */
uint64_t kallax_wal_live_bytes(kallax *kx);

/* No I/O: *records = stored records, *bytes = bytes they use in blocks
 * plus their extents. Any thread. */
void kallax_estimate(kallax *kx, uint64_t *records, uint64_t *bytes);

typedef struct kallax_stats {
    uint64_t blocks, probe, records, tombstones, used_bytes, spilled;
    uint64_t extent_pages, extent_pages_used, extent_bytes;
    uint64_t block_reads, spill_reads, block_writes, journal_bytes, flushes, moves;
    /* corrupt_blocks: corrupt blocks met (by the open scan, then by each
     * read that found one); repaired: rewritten from the journal; retries:
     * reads repeated after a torn read or a replaced extent */
    uint64_t corrupt_blocks, repaired, retries, flushed_seqno, last_seqno, flush_generation;
    uint64_t wal_bytes, wal_fsyncs, wal_segments, user_bytes;
    uint64_t wal_live_bytes;  /* kallax_wal_live_bytes */
    uint64_t index_mem_bytes; /* memory that grows with the store: the extent bitmap */
    double load;              /* used_bytes / (blocks x block payload) */
    lsm_vol_stats vol;
    bool io_uring;
} kallax_stats;

/* Counters read one by one. Returns KV_OK. Any thread. */
kv_err kallax_stats_get(kallax *kx, kallax_stats *out);

#endif
