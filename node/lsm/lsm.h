/* SPDX-License-Identifier: MIT */
/*
 * lsm: the node's persistent tier (DESIGN.md §5), a leveled LSM-tree whose
 * upper levels live on the fast volume (FD) and lower levels on the slow
 * volume (SD). The memory tier (HotRing) is the memtable: callers append
 * records to the WAL with lsm_wal_append(), keep them in memory, and hand a
 * sorted run of them to lsm_flush(), which writes an L0 SST on FD. Background
 * threads compact levels (leveled, size ratio 10). All SST and WAL I/O goes
 * through io_uring (one ring per calling thread), or pread/pwrite when
 * io_uring is unavailable or disabled.
 *
 * HotRAP (opts.hotrap, with a slow_dir): point lookups and lsm_note_access
 * feed RALT, an access tracker kept as a small LSM in fast_dir/ralt (its
 * runs are not recovered: a restart deletes them and re-learns); compactions from the last FD level
 * into SD keep hot records on FD (retention, and promotion of the SD input's hot records) and pick
 * the file with the fewest hot bytes; compactions inside SD and lookups served by SD offer hot
 * records to a promotion buffer that a checker thread flushes as L0 SSTs on FD. A promoted record
 * is never newer than what it copies and never shadows a newer write (see promote.c).
 *
 * Ordering: records are ordered by key ascending, then seqno descending. The
 * newest record of a key is the one with the highest seqno (promoted records
 * of a later issue keep their old seqno, so L0 lookups compare seqnos).
 *
 * Write path contract (the node's engine):
 *   1. seq = next seqno; lsm_wal_append(rec with seq); on KV_OK insert the
 *      record into the memory tier as dirty (on error: fail the write).
 *   2. To flush: pick s such that every seqno <= s has returned from
 *      lsm_wal_append; collect the newest dirty record of each key with
 *      seqno <= s, sorted by key; lsm_flush(run, n, s); on KV_OK mark those
 *      items clean (a newer dirty version of a key stays dirty). WAL segments
 *      holding only seqnos <= s are deleted by lsm_flush itself.
 *   3. On restart: lsm_open replays every WAL record with seqno > the last
 *      flushed s; re-insert them as dirty; continue at lsm_last_seqno() + 1.
 * lsm_get returns tombstones and expired records as stored; filtering them
 * (and last-writer-wins on version) is the caller's job.
 *
 * Threads: every function may be called from any thread unless its comment
 * says otherwise; lsm_close() must not race with any other call on the same
 * handle. Each thread that does I/O gets its own io_uring (created on first
 * use, freed at thread exit). Errors are kv_err (gRPC numbers);
 * out-parameters are written only on KV_OK.
 */
#ifndef KV_NODE_LSM_LSM_H
#define KV_NODE_LSM_LSM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "kv/kv_err.h"

typedef struct lsm_db lsm_db;

#define LSM_MAX_LEVELS 7 /* L0..L6 */

typedef enum lsm_type { LSM_PUT = 1, LSM_DELETE = 2 } lsm_type;

#define LSM_F_PROMOTED 0x1u /* copied up to FD by HotRAP promotion (keeps its seqno) */
/* A clean copy: a record with the same key and seqno (the original) lies in
 * a deeper level. Set on the records HotRAP promotes; a merge that meets the
 * original clears it (compact.c), so a compaction into SD may drop a copy it
 * does not keep on FD instead of writing it down again. */
#define LSM_F_TWIN 0x2u

/* One record. key/value are borrowed by the functions that take an lsm_rec;
 * lsm_get() fills one whose key and value are malloc'ed (see lsm_rec_free). */
typedef struct lsm_rec {
    const void *key;
    size_t klen;
    const void *value; /* NULL/0 for a DELETE */
    size_t vlen;
    uint64_t version;   /* HLC version of the write */
    uint64_t seqno;     /* node-local sequence number, assigned by the caller */
    uint64_t expire_at; /* wall-clock ms; 0 = never */
    uint8_t type;       /* lsm_type */
    uint8_t flags;      /* LSM_F_* */
} lsm_rec;

typedef enum lsm_tier { LSM_TIER_NONE = 0, LSM_TIER_FD = 1, LSM_TIER_SD = 2 } lsm_tier;

/* What lsm_open does with a WAL frame that fails its checksum or does not
 * decode. A torn tail (the bad bytes run to the end of the last segment,
 * with no valid frame after them: a crash during a write) is truncated in
 * both modes, logged. Corruption anywhere else (a valid frame after it in
 * the same segment, or a later segment) means acknowledged writes may be
 * lost: */
typedef enum lsm_wal_recovery {
    LSM_WAL_ABSOLUTE = 0,      /* refuse to open: DATA_LOSS naming the file and offset (default) */
    LSM_WAL_POINT_IN_TIME = 1, /* recover up to the corruption: truncate there, delete later
                                  segments, log what was dropped (etcd, RocksDB's
                                  kPointInTimeRecovery) */
} lsm_wal_recovery;

typedef enum lsm_sync {
    LSM_SYNC_ALWAYS = 0, /* lsm_wal_append returns after write + fsync (linked) */
    LSM_SYNC_BATCH = 1,  /* returns after the write reached the kernel; a WAL thread
                            fsyncs at most every sync_ms while bytes are unsynced */
    LSM_SYNC_NONE = 2,   /* never fsync the WAL (the OS writes it back) */
} lsm_sync;

/* Compaction routing hook, an override of the built-in HotRAP rule. Called
 * for every record a compaction from from_level (>= 1) into from_level + 1
 * keeps; returns the level the record is written to: from_level + 1 (default)
 * or from_level (retain it on the upper level). Any other value means
 * from_level + 1. Retention is honoured only for PUTs inside the key range
 * of the compacted from_level files and while the from level stays under 3/4
 * of its target size (so compaction always makes progress); tombstones and
 * expired records always go down. Runs on a compaction thread; must not call
 * into the db. When route is NULL and hotrap is on, the built-in rule
 * retains on the last FD level the records RALT calls hot in compactions
 * from FD into SD (which also promotes the hot records of the SD input). */
typedef int (*lsm_route_fn)(void *arg, const lsm_rec *rec, int from_level);

/* HotRAP promotion check supplied by the engine: returns true when the
 * memory tier holds a version of key (dirty or clean, tombstones included)
 * whose seqno is greater than seqno. Called on the promotion checker thread
 * for each record about to be promoted; must be cheap, must not block on
 * I/O and must not call into the db. NULL = assume the memory tier holds
 * nothing newer (a promoted copy still never shadows a later write: it is
 * dropped once the write was flushed, and lands in L0 below its seqno
 * otherwise; see promote.c). */
typedef bool (*lsm_newer_fn)(void *arg, const void *key, size_t klen, uint64_t seqno);

/* Called with newer_arg on the promotion checker thread: begin = true once
 * when it starts, before any newer call, and begin = false once before it
 * exits, after the last one. The engine registers the thread with liburcu
 * there (its newer callback reads HotRing). May be NULL. */
typedef void (*lsm_thread_fn)(void *arg, bool begin);

/* Block compression of SST data blocks. DEFAULT in a level's slot means "by
 * the level's volume" (lsm_compression_spec). The codec is recorded per
 * block (a block that does not shrink by 1/8 is stored raw), so a level's
 * setting may change at any time: files keep what they were written with. */
typedef enum lsm_compression {
    LSM_COMPRESS_DEFAULT = 0,
    LSM_COMPRESS_NONE = 1,
    LSM_COMPRESS_LZ4 = 2,  /* LZ4 (fast) */
    LSM_COMPRESS_ZSTD = 3, /* zstd level 3 (the library's default, as RocksDB's) */
} lsm_compression;

/* Per level (L0 first), else by volume: a level whose slot is DEFAULT takes
 * fast (levels on FD) or slow (levels on SD); DEFAULT there means none on FD
 * and lz4 on SD, RocksDB's common setting. All-zero = that default. */
typedef struct lsm_compression_spec {
    lsm_compression level[LSM_MAX_LEVELS];
    lsm_compression fast, slow;
} lsm_compression_spec;

/* Parses the --compression flag: "auto" (the default above), or a comma
 * list of either codecs by level ("none,none,none,lz4": L0..L3, the last
 * entry repeating for the deeper levels; "zstd" alone: every level) or codecs
 * by volume ("fast=none,slow=zstd"), each of none|lz4|zstd. Returns KV_OK
 * and *out, or INVALID_ARGUMENT with a message in err. */
kv_err lsm_compression_parse(const char *spec, lsm_compression_spec *out, char *err, size_t errlen);
/* The codec of level `level` (0..LSM_MAX_LEVELS-1) on volume tier under s:
 * NONE, LZ4 or ZSTD. */
lsm_compression lsm_compression_for(const lsm_compression_spec *s, int level, lsm_tier tier);
/* "none", "lz4", "zstd" (DEFAULT: "auto"). */
const char *lsm_compression_name(lsm_compression c);

typedef struct lsm_opts {
    const char *fast_dir;             /* FD directory (created if missing); required */
    const char *slow_dir;             /* SD directory, NULL = every level on FD */
    uint64_t fast_mb;                 /* FD capacity used to size levels; default 1024 */
    lsm_sync sync;                    /* default LSM_SYNC_ALWAYS (0) */
    unsigned sync_ms;                 /* LSM_SYNC_BATCH period, default 5 */
    unsigned block_size;              /* SST data block bytes, default 4096 */
    lsm_compression_spec compression; /* block codec per level (zero: lz4 on SD levels) */
    unsigned l0_trigger;              /* L0 file count that triggers compaction, default 4 */
    unsigned l0_stop;                 /* lsm_flush waits while L0 has this many files, default 20 */
    /* With a slow_dir: lsm_flush also waits while the FD levels' SSTs
     * exceed this percentage of fast_mb and one of them is due for
     * compaction, so that writes faster than compaction into SD cannot fill
     * the fast volume past its capacity. (HotRAP's promotions, bounded by
     * the hot-set limit and by SD reads, are not held back: compaction
     * pushes cold bytes out for them.) Default (and 0) 100. */
    unsigned fd_stop_pct;
    /* The most bytes the caller lets the WAL hold (it flushes and holds
     * writers by lsm_wal_live_bytes; the engine's wal_max_mb). With a
     * slow_dir, compaction and flushes keep what the WAL may still grow
     * free on the fast device besides their own room. 0 = not counted. */
    uint64_t wal_max_bytes;
    uint64_t file_mb;            /* target SST size for L1+, 0 = derived from fast_mb */
    bool disable_io_uring;       /* force the pread/pwrite path (tests, old kernels) */
    unsigned compaction_threads; /* background compaction threads, default (and 0) = 1, max 16 */
    bool no_auto_compaction;     /* only lsm_compact_all compacts (tests) */
    lsm_route_fn route;          /* NULL = plain leveled compaction, or HotRAP's rule */
    void *route_arg;
    /* HotRAP (effective only with a slow_dir): RALT access tracking,
     * retention/promotion in compaction, the promotion buffer. Default on;
     * off = plain tiering. */
    bool hotrap;
    bool no_promo_gate;    /* HotRAP promotes every hot key whatever the read lift (promote.c) */
    uint64_t hot_set_mb;   /* hot-set size limit, 0 = 0.85 x last FD level target */
    uint64_t promo_buf_kb; /* promotion buffer, 0 = 64 MiB x fast_mb / 1024 (>= 1 MiB) */
    lsm_newer_fn newer;    /* memory-tier check for promotion, may be NULL */
    lsm_thread_fn newer_thread; /* checker thread start/exit hook, may be NULL */
    void *newer_arg;
    /* NHC (Orthus non-hierarchical caching, node/nhc/nhc.h), effective with
     * HotRAP and a slow_dir. nhc: the node's scheduler, borrowed (must outlive
     * the db), NULL = classic caching (every read FD-first, promotion always
     * on). With it, a lookup of a key in the twin map (records with identical
     * copies on FD and SD) reads SD only when nhc_send_to_fd says so, SD reads
     * enter the promotion buffer only while nhc_data_admit, and every record
     * served is reported with nhc_note_read / nhc_note_miss. twin_entries
     * bounds the twin map, 0 = fast_mb x 256 (one 16-byte entry per 4 KiB of
     * FD), at least 4096. */
    struct nhc *nhc;
    uint64_t twin_entries;
    /* A tombstone is dropped by compaction only when no level below may hold
     * its key and it is older than this (DESIGN.md §4: deletes keep their
     * tombstones for a grace period so no repair resurrects the key). Its
     * age is measured from its time: the milliseconds of its HLC version
     * (version >> 16), or its expire_at when later (an expired PUT turned
     * into a tombstone keeps its expire_at). 0 = dropped as soon as nothing
     * below may hold the key. */
    uint64_t tombstone_grace_ms;
    /* WAL corruption before its tail: refuse (default) or point-in-time. */
    lsm_wal_recovery wal_recovery;
    /* Wall clock for expiry (compaction drops expired records, promotion
     * skips them) and the tombstone grace; NULL = kv_wall_ms. Called from
     * compaction and promotion threads. */
    kv_clock_fn clock;
    void *clock_arg;
} lsm_opts;

/* Called by lsm_open for each WAL record not covered by an installed SST, in
 * WAL order. rec and its key/value are valid only during the call (copy what
 * you keep). A non-OK return aborts lsm_open with that error. */
typedef kv_err (*lsm_replay_fn)(void *arg, const lsm_rec *rec);

/* Fills o with the defaults above (fast_dir NULL). */
void lsm_opts_default(lsm_opts *o);

/* Opens (creating if needed) the LSM in o->fast_dir / o->slow_dir: reads
 * CURRENT and the MANIFEST, truncates a torn WAL tail (logged), replays the
 * unflushed WAL records through fn (may be NULL), starts the WAL and
 * compaction threads. Returns KV_OK and *out; INVALID_ARGUMENT on bad
 * options; DATA_LOSS (logged, naming the file) on a corrupt MANIFEST or SST
 * footer, when CURRENT is missing next to existing data, or on a corrupt WAL
 * frame that is not a torn tail (logged with the segment and the offset;
 * unless o->wal_recovery is LSM_WAL_POINT_IN_TIME);
 * RESOURCE_EXHAUSTED when FD is full (open writes a new MANIFEST and WAL
 * segment); FAILED_PRECONDITION when another handle or process holds the
 * directory (flock on FD/LOCK); INTERNAL on other I/O errors; or the error
 * fn returned (DATA_LOSS from fn is reported as INTERNAL). On failure
 * nothing is left open and records already passed to fn must be discarded. */
kv_err lsm_open(lsm_db **out, const lsm_opts *o, lsm_replay_fn fn, void *arg);

/* Stops background threads, fsyncs the WAL, closes files and frees db. Does
 * not flush anything (the caller's memtable is recovered from the WAL on the
 * next open). NULL is a no-op. No other call may run concurrently. */
void lsm_close(lsm_db *db);

/* Highest seqno seen: max over installed SSTs, replayed WAL records and
 * records appended since. Seqnos are assigned by the caller; this tells it
 * where to continue after lsm_open. */
uint64_t lsm_last_seqno(lsm_db *db);

/* The highest version (HLC) of any record in the installed SSTs, 0 when
 * there are none, or UINT64_MAX when a file's is unknown (recorded by a
 * manifest older than the field; compaction rewrites such files with it).
 * The WAL's records are not included: the caller replays them. A writer
 * holding a version above every version its store and memory hold knows
 * that last-writer-wins lets it apply without looking the key up. Any
 * thread. */
uint64_t lsm_max_version(lsm_db *db);

/* Appends n records to the WAL as one atomic group (all or none survive a
 * crash) and returns when they are durable per the sync mode; concurrent
 * callers are group-committed (one write [+ fsync] for many callers).
 * Returns RESOURCE_EXHAUSTED when the FD is full (nothing of this call is
 * acknowledged; later calls may succeed once space is freed), INVALID_ARGUMENT
 * for n == 0 or a bad record, INTERNAL on other I/O errors (logged with the
 * segment). After an fsync of acknowledged records failed (sync batch, or
 * lsm_wal_sync), or a failed write could not be truncated away, every call
 * fails with that error (logged once) until an lsm_flush covers the records
 * written before it: the caller's memory tier still holds them, and the
 * flush persists them in an SST. recs are borrowed.
 * Every record with seqno <= s must have returned from lsm_wal_append before
 * lsm_flush(.., max_seqno = s) is called. */
kv_err lsm_wal_append(lsm_db *db, const lsm_rec *recs, size_t n);

/* Writes a sorted run (key ascending; for equal keys only the first, i.e.
 * highest-seqno, record is kept) as an L0 SST on FD and installs it with a
 * manifest edit that records max_seqno as flushed; then deletes WAL segments
 * whose records all have seqno <= the flushed seqno. sorted must hold the
 * newest record of every key written with a seqno in (previous flushed
 * seqno, max_seqno] (tombstones included), and may hold nothing newer than
 * max_seqno. n == 0 only advances the flushed seqno (no-op, no generation
 * bump, when max_seqno equals it). Rotates the WAL to a new
 * segment first, so lsm_wal_append may run concurrently. Blocks while L0 has
 * l0_stop files (until compaction catches up). Returns INVALID_ARGUMENT if
 * the run is not sorted or max_seqno is below the flushed seqno,
 * RESOURCE_EXHAUSTED on ENOSPC (nothing installed, the WAL still holds the
 * records), INTERNAL on I/O errors. recs are borrowed. Calls to lsm_flush are
 * serialised internally. */
kv_err lsm_flush(lsm_db *db, const lsm_rec *sorted, size_t n, uint64_t max_seqno);

/* Number of flushes installed since lsm_open, plus one per
 * lsm_compact_all_filter (the node compares it before and after a read to
 * avoid stale fills of the memory tier). */
uint64_t lsm_flush_generation(lsm_db *db);

/* Looks key up across all levels and fills *out with its newest record,
 * which may be a DELETE tombstone or an expired PUT (the caller checks
 * type and expire_at against its clock; lsm_get does not filter them).
 * out->key and out->value are malloc'ed copies the caller releases with
 * lsm_rec_free (value is NULL for a tombstone). *served says which volume
 * the record came from. Returns KV_OK, NOT_FOUND (no record in any SST;
 * *out untouched), DATA_LOSS when a block that may hold the key is corrupt
 * (logged with the file name), INVALID_ARGUMENT for klen == 0. served may be
 * NULL. */
kv_err lsm_get(lsm_db *db, const void *key, size_t klen, lsm_rec *out, lsm_tier *served);

/* The writer's check before a write (last-writer-wins, if_version,
 * if_absent): as lsm_get, but *out gets only the newest record's metadata
 * (version, seqno, expire_at, type, flags; key and value NULL, vlen its
 * value length; nothing to free), and the lookup is not a read: it feeds
 * neither RALT nor the promotion buffer nor NHC, and counts in
 * lsm_stats.check_* instead of reads_fd / reads_sd. (Counting it as a read
 * made every written key look read-hot to HotRAP and offered the old
 * record of a key being overwritten for promotion.) */
kv_err lsm_get_meta(lsm_db *db, const void *key, size_t klen, lsm_rec *out);

/* Batch lookup: the block reads of all n keys are submitted together, level
 * by level. For each i, errs[i] is what lsm_get would have returned and, on
 * KV_OK, outs[i]/served[i] are filled as by lsm_get (served may be NULL).
 * Returns KV_OK when the batch ran (see errs), INVALID_ARGUMENT, or
 * RESOURCE_EXHAUSTED when its state cannot be allocated (outs and errs are
 * then untouched). */
kv_err lsm_multiget(lsm_db *db, size_t n, const void *const *keys, const size_t *klens,
                    lsm_rec *outs, lsm_tier *served, kv_err *errs);

/* Records a read of key (value of vlen bytes) served by the memory tier, so
 * that RALT sees the key's hotness although the LSM did not serve it. Cheap
 * (one buffer append under a mutex, a sort every 1024 calls): call it at a
 * sampled rate, e.g. for one read in 16, and scale nothing (the sampling
 * only slows the key's score growth). No-op when HotRAP is off. key is
 * borrowed. Any thread. */
void lsm_note_access(lsm_db *db, const void *key, size_t klen, size_t vlen);
/* lsm_note_access on a thread that must not block (an nng callback): false,
 * with nothing recorded, when it would write a run of the tracker. */
bool lsm_note_access_nb(lsm_db *db, const void *key, size_t klen, size_t vlen);

/* ---- iteration ----
 *
 * An iterator over a snapshot of the SSTs: it pins the version current at
 * lsm_iter_open (refcounted), so flushes and compactions that run meanwhile
 * neither change what it returns nor delete the files it reads; records
 * flushed after the open are not seen. It returns the newest record (highest
 * seqno) of each key in key order (lsm_key_cmp: memcmp, a shorter key first
 * on a common prefix), tombstones and expired records included as stored.
 * Blocks are read sequentially with read-ahead (one open file per level,
 * one per L0 file) and verified. An iterator belongs to one thread at a time
 * (any thread); close every iterator before lsm_close. */
typedef struct lsm_iter lsm_iter;

/* Opens an iterator over the current version, not positioned yet (call
 * lsm_iter_seek). Returns KV_OK and *out (caller owns it, lsm_iter_close)
 * or RESOURCE_EXHAUSTED. Does no I/O. */
kv_err lsm_iter_open(lsm_db *db, lsm_iter **out);
/* Positions it on the first key strictly greater than after (after NULL:
 * the first key). Returns KV_OK (lsm_iter_rec is NULL when no key is
 * left), DATA_LOSS when a block is corrupt (logged with the file; see
 * lsm_iter_failed_file), INTERNAL on a read error, RESOURCE_EXHAUSTED. An
 * iterator that failed keeps returning its error. after is borrowed. */
kv_err lsm_iter_seek(lsm_iter *it, const void *after, size_t after_len);
/* Moves to the next key. Returns as lsm_iter_seek (KV_OK at the end). */
kv_err lsm_iter_next(lsm_iter *it);
/* The current record, or NULL at the end, before the first seek or after an
 * error. It points into the iterator's buffers (key, value) and stays valid
 * until the next seek, next or close. */
const lsm_rec *lsm_iter_rec(const lsm_iter *it);
/* The path of the SST whose read failed, or NULL; valid until close. */
const char *lsm_iter_failed_file(const lsm_iter *it);
/* Unpins the version and frees it. NULL is a no-op. */
void lsm_iter_close(lsm_iter *it);

/* The LSM's key order: memcmp over the common prefix, then the shorter key
 * first. Returns <0, 0 or >0. Any thread. */
int lsm_key_cmp(const void *a, size_t al, const void *b, size_t bl);

/* Frees the key and value of a record filled by lsm_get / lsm_multiget and
 * zeroes them. NULL is a no-op. */
void lsm_rec_free(lsm_rec *rec);

typedef struct lsm_vol_stats {
    uint64_t reads, read_bytes, writes, write_bytes, fsyncs;
    uint64_t read_lat_ewma_ns, write_lat_ewma_ns;
} lsm_vol_stats;

typedef struct lsm_level_stats {
    uint64_t files, bytes;
    uint64_t
        target_bytes; /* L0: the bytes that make it due (lsm_l0_room), besides l0_trigger files */
    lsm_tier volume;
    lsm_compression codec; /* what new files of the level are written with */
    /* Compactions into this level since open, filed under their output
     * level as in RocksDB's compaction stats: bytes read from the level
     * above (its Rn) and from this level (Rnp1), bytes written (retained
     * records included), jobs, and bytes moved here by trivial moves. */
    uint64_t comp_read_above, comp_read_level, comp_written, comp_jobs, comp_moved;
    uint64_t comp_ns; /* the merging jobs' summed wall time (RocksDB's Comp(sec)) */
} lsm_level_stats;

typedef struct lsm_stats {
    lsm_level_stats levels[LSM_MAX_LEVELS];
    lsm_vol_stats fd, sd;        /* sd is zero when there is no slow_dir */
    uint64_t reads_fd, reads_sd; /* records served per volume by get/multiget */
    /* lsm_get_meta: calls, and the data blocks they read per volume (a key
     * found there, or a bloom filter's false positive) */
    uint64_t check_calls, check_blocks_fd, check_blocks_sd;
    uint64_t user_bytes; /* key+value bytes given to lsm_wal_append */
    uint64_t wal_bytes, wal_fsyncs, wal_segments;
    uint64_t wal_live_bytes; /* the live segments' bytes on FD (lsm_wal_live_bytes) */
    uint64_t flush_bytes, flushes;
    /* Flushes that waited for compaction since open: at l0_stop L0 files, or
     * with the FD levels over fd_stop_pct of fast_mb; their summed wait. */
    uint64_t stalls_l0, stalls_fd, stall_ns;
    /* Room on the fast device (with a slow volume): flushes that waited for
     * it (counted apart from stalls_l0/_fd; their wait is in stall_ns),
     * compaction picks that deferred or shrank a job for lack of it, and the
     * free bytes last seen (statvfs; 0 before the first look). */
    uint64_t stalls_space, space_waits, fd_free_bytes;
    uint64_t fd_bytes, fd_peak_bytes; /* SST bytes on FD now, and the most since open */
    uint64_t compact_read_bytes, compact_write_bytes, compactions;
    /* Data blocks written since open by flushes, compactions and promotion
     * into levels with a codec: their bytes before and after compression
     * (raw-stored blocks count in both). */
    uint64_t compress_in_bytes, compress_out_bytes;
    double write_amp; /* (WAL + flush + compaction bytes written) / user_bytes */
    uint64_t flushed_seqno, last_seqno, flush_generation;
    uint64_t index_mem_bytes; /* memory of the open SSTs' readers: index, bloom, block table */
    /* Live SSTs in a format older than the one written now (a directory
     * upgraded in place: compaction rewrites them as it reaches them). */
    uint64_t old_format_files;
    bool io_uring; /* true when I/O goes through io_uring */
    /* HotRAP (zero when off). FD hit rate = reads_fd / (reads_fd + reads_sd). */
    bool hotrap;
    uint64_t promoted_recs, promoted_bytes; /* installed by the promotion buffer */
    uint64_t promo_dropped;                 /* checked and not promoted, of which: */
    uint64_t promo_drop_dup;                /* an older read of a key in the same buffer */
    uint64_t promo_drop_cold;               /* not stably hot per RALT */
    uint64_t promo_drop_newer;              /* written since the read, or expired */
    uint64_t promo_drop_on_fd;              /* an FD level may hold the key (bloom) */
    uint64_t promo_drop_full;               /* buffer sealed while the checker was behind */
    uint64_t promo_drop_gated;              /* hot, but held back by the gate (promote.c) */
    /* How many times more often than chance a lookup reads a key RALT calls
     * hot (promote.c's gate); 0 until measured. */
    double promo_lift;
    uint64_t retained_recs, retained_bytes; /* kept on FD by compaction into SD */
    /* clean copies (LSM_F_TWIN) compaction into SD dropped instead of
     * writing them down, and its jobs that merged no SD file */
    uint64_t twins_dropped, twins_dropped_bytes, twin_jobs;
    /* L0 -> L1 moves that left an older L0 file (by number) behind, one
     * of promoted copies or one over an older file's keys (l0_movable) */
    uint64_t l0_moves_past;
    uint64_t ralt_entries, ralt_stable;      /* tracked keys, stably hot keys */
    uint64_t ralt_bytes, ralt_phys_limit;    /* RALT size and its adaptive limit */
    uint64_t ralt_hot_bytes, hot_set_limit;  /* key+value bytes of hot keys, limit */
    uint64_t ralt_evicted;                   /* entries evicted since open */
    uint64_t ralt_file_bytes, ralt_errors;   /* RALT's run files on FD; corrupt runs met */
    uint64_t ralt_mem_bytes;                 /* RALT's memory: run readers, blooms, buffer */
    uint64_t ralt_merges, ralt_full_merges;  /* RALT's merges of its runs, full ones */
    uint64_t ralt_merge_bytes;               /* bytes those merges wrote */
    uint64_t promo_buf_bytes, promo_backlog; /* mutable buffer, sealed buffers waiting */
    /* NHC routing (zero without HotRAP): twin map entries, capacity and
     * evictions; lookups sent to SD by load_admit, and how many of those
     * found an older or no SD copy and fell back to FD first. */
    uint64_t twin_entries, twin_capacity, twin_evicted;
    uint64_t nhc_routed_sd, nhc_fallbacks;
} lsm_stats;

/* Fills *out with a consistent-enough snapshot (counters are read one by
 * one). Returns KV_OK. */
kv_err lsm_stats_get(lsm_db *db, lsm_stats *out);

/* Blocks until no compaction is running and no level needs one (scores < 1),
 * or a background error stops compaction. Returns KV_OK, or the background
 * error (e.g. RESOURCE_EXHAUSTED, DATA_LOSS). For tests and shutdown. */
kv_err lsm_compact_wait_idle(lsm_db *db);

/* Synchronously compacts every level into the next until all files sit in
 * the deepest non-empty level (tombstones and expired records dropped there
 * once older than tombstone_grace_ms;
 * with HotRAP, hot records retained on the last FD level stay there).
 * Waits for background compactions first and blocks them meanwhile. Returns
 * KV_OK or the first compaction error. For tests and admin. */
kv_err lsm_compact_all(lsm_db *db);

/* Cleanup filter: returns true to keep key. Called on the thread running
 * the compaction (today the caller of lsm_compact_all_filter; callers must
 * not rely on it), with a key valid during the call only; must not call
 * into the db. */
typedef bool (*lsm_keep_fn)(void *arg, const void *key, size_t klen);

/* lsm_compact_all that also drops every record (every version, tombstones
 * included) whose key keep rejects, and rewrites every file of every level
 * to do so (the deepest level too, into itself, when no level above holds
 * a file), so that once it returns no version of a rejected key is left in
 * any SST of the version it installed: neither retention nor promotion by
 * compaction keeps a rejected record. Flushes the promotion buffer first
 * (its records are then compacted away too); a promotion of a rejected key
 * read from SD during the call may still land in L0 afterwards. Bumps the
 * flush generation at the end, so that a memory-tier fill racing it fails.
 * *dropped (may be NULL) = the records the filter removed (each stored
 * version counted once). Returns KV_OK or the first compaction error (the
 * steps done before it stay installed). Any thread; blocks background
 * compaction meanwhile. */
kv_err lsm_compact_all_filter(lsm_db *db, lsm_keep_fn keep, void *arg, uint64_t *dropped);

/* Returns once every record lsm_wal_append acknowledged before the call is
 * durable in the WAL (fsync of the current segment, and of the sealed
 * segments not synced when they were sealed), whatever the sync mode;
 * records already flushed are durable in their SST. Returns KV_OK or
 * INTERNAL (the fsync failed, logged). Any thread; concurrent appends wait
 * during the fsync. */
kv_err lsm_wal_sync(lsm_db *db);

/* Bytes the WAL's live segments take on the fast volume: appended records
 * that no flush has covered yet, and the sealed segments that hold them.
 * A flush deletes the segments it covers. Any thread; no I/O. */
uint64_t lsm_wal_live_bytes(lsm_db *db);

/* A cheap estimate (no I/O, one version pin) of what the SSTs hold: *records
 * = the sum of their entry counts (a key with versions in several levels
 * counts once per version), *bytes = the sum of their file sizes (keys,
 * values and record headers, plus index and bloom filter). Any thread. */
void lsm_estimate(lsm_db *db, uint64_t *records, uint64_t *bytes);

#endif
