/* SPDX-License-Identifier: MIT */
/*
 * The node's storage engine: the tiers glued together behind point
 * operations with the semantics of the wire contract (DESIGN.md §3, §5):
 * last-writer-wins on the HLC version, TTLs, tombstones, and the conditional
 * writes of kv.Put / kv.Delete (if_version, if_absent).
 *
 *   write: WAL (lsm_wal_append) -> HotRing item marked dirty
 *   read:  HotRing -> LSM levels on FD -> LSM levels on SD
 *   flush: dirty items up to a seqno, sorted -> L0 SST on FD -> items clean
 *
 * The persistent store below the memory tier is the LSM (ENGINE_LSM) or
 * kallax (ENGINE_KALLAX, node/kallax/kallax.h: a key's hash names the 4 KiB
 * block that holds it, for drives with transparent compression). With
 * kallax the same memory tier holds the dirty and the hot records, the WAL
 * is kallax's, a flush rewrites the blocks of the dirty records, and there
 * is one volume (fast_dir): HotRAP and NHC do not apply. The store kind is
 * fixed when fast_dir is created; opening it as the other kind fails.
 *
 * The memory tier holds every unflushed record (the memtable) plus hot clean
 * records (a cache) within mem_mb; only clean items are evicted. A record
 * read from an SST is admitted to memory only when it is read again within
 * a window (a small frequency sketch), and never when a flush was installed
 * since the lookup began (no stale fills).
 *
 * Threads: every function may be called from any thread registered with
 * engine_thread_register() (the RPC workers do it in their start hook).
 */
#ifndef KV_NODE_ENGINE_H
#define KV_NODE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/clock.h"
#include "kv/kv_err.h"
#include "node/nhc/nhc.h"

typedef struct engine engine;

typedef enum engine_sync { ENGINE_SYNC_ALWAYS, ENGINE_SYNC_BATCH, ENGINE_SYNC_NONE } engine_sync;

/* WAL corruption that is not a torn tail (lsm_wal_recovery): refuse to open
 * with DATA_LOSS (default) or recover up to it (kvnode --wal-recovery). */
typedef enum engine_wal_recovery {
    ENGINE_WAL_ABSOLUTE = 0,
    ENGINE_WAL_POINT_IN_TIME = 1,
} engine_wal_recovery;

/* The persistent store below the memory tier. */
typedef enum engine_kind { ENGINE_LSM = 0, ENGINE_KALLAX = 1 } engine_kind;

typedef struct engine_opts {
    engine_kind kind;       /* ENGINE_LSM (default) or ENGINE_KALLAX */
    const char *fast_dir;   /* FD: WAL, MANIFEST and the upper levels (required) */
    const char *slow_dir;   /* SD: the lower levels; NULL = every level on FD */
    uint64_t fast_mb;       /* FD capacity for the levels */
    unsigned fast_stop_pct; /* lsm_opts.fd_stop_pct (flushes wait above it); 0 = 100 */
    size_t mem_mb;          /* memory-tier budget */
    size_t write_buffer_mb; /* dirty bytes that trigger a flush (may be 0 for KiB below) */
    size_t write_buffer_kb; /* finer setting for tests; wins when non-zero */
    /* The most bytes the WAL may hold on FD (kvnode --wal-max-mb; 0 = 4 x the
     * write buffer). Overwrites of the same keys grow the WAL while the dirty
     * bytes stay small: past half of it, and two write buffers past the
     * dirty bytes, every dirty record is flushed (so every sealed segment
     * can go); at all of it writers wait for that flush
     * as they do at twice the write buffer. The LSM keeps what the WAL may
     * still grow free on FD (lsm_opts.wal_max_bytes). */
    uint64_t wal_max_mb;
    uint64_t wal_max_kb; /* finer setting for tests; wins when non-zero */
    engine_sync sync;
    unsigned sync_ms;
    uint64_t index_buckets;   /* initial HotRing buckets (0 = from mem_mb) */
    double index_rehash_cost; /* HotRing rehash trigger: items visited per access (0 = 8) */
    bool disable_io_uring;
    bool no_hotrap;     /* plain tiering: no read-hot retention/promotion (HotRAP) */
    bool no_promo_gate; /* HotRAP without its promotion gate (benchmarks) */
    /* SST block compression per level or volume (lsm_compression_parse:
     * "auto" = lz4 on the slow volume's levels, none on the fast one's; kvnode
     * --compression). NULL = auto. */
    const char *compression;
    /* NHC scheduler options (borrowed during engine_open), NULL = defaults
     * (nhc_opts_default: enabled). Used only with a slow_dir and HotRAP;
     * enable false keeps it in classic state. twin_entries: twin-map bound,
     * 0 = derived from fast_mb (lsm_opts.twin_entries). */
    const nhc_opts *nhc;
    uint64_t twin_entries;
    /* Compaction keeps a tombstone at least this long after its write (or
     * after its expiry, for an expired record), so that no repair or stream
     * resurrects the key (lsm_opts.tombstone_grace_ms); 0 = dropped as soon
     * as no lower level may hold the key. */
    uint64_t tombstone_grace_ms;
    engine_wal_recovery wal_recovery;
    /* The wall clock for TTLs (expiry, ttl_ms) and, through the LSM,
     * compaction's expiry and tombstone grace; NULL = kv_wall_ms. Tests move
     * it instead of sleeping. Versions still come from the HLC on the real
     * wall clock (they must keep growing across restarts, whatever a test
     * clock does). Any thread. */
    kv_clock_fn clock;
    void *clock_arg;
    /* kallax only (slow_dir, fast_mb, no_hotrap, nhc and twin_entries do not
     * apply): the store's home blocks of 4 KiB, fixed when it is created
     * (required then; 0 = the existing store's, another count is refused). */
    uint64_t kallax_blocks;
} engine_opts;

/* A write. version 0 = the engine assigns one from its HLC (direct writes);
 * otherwise the coordinator's version is applied last-writer-wins. */
typedef struct engine_write {
    const void *key;
    size_t klen;
    const void *val;
    size_t vlen;
    uint64_t version;
    uint64_t ttl_ms;     /* 0 = no expiry; at most KV_MAX_TTL_MS (100 years) */
    uint64_t if_version; /* 0 = unconditional */
    bool if_absent;
    bool is_delete;
    /* Absolute expiry, wall-clock ms; non-zero wins over ttl_ms (a streamed
     * record keeps its expiry unchanged; on a delete it is stored with the
     * tombstone, whose grace period then counts from it). 0 = ttl_ms. */
    uint64_t expire_at;
} engine_write;

typedef struct engine_result {
    uint64_t version; /* version written (or of the record read) */
    bool found;       /* get: a live record; delete: a live record existed */
    uint8_t *val;     /* get: malloc'ed copy, owned by the caller (free()) */
    size_t vlen;
    bool applied;       /* write: stored; false when an equal or newer version governs the key */
    uint64_t expire_at; /* get: the record's expiry (wall ms, 0 = never) */
} engine_result;

typedef struct engine_stats {
    uint64_t items, mem_bytes, mem_limit, dirty_bytes;
    uint64_t gets, puts, deletes;
    /* puts applied without looking the key up: their version was above
     * every version in memory and in the store, so last-writer-wins could
     * not reject them (no condition, not a delete) */
    uint64_t blind_puts;
    uint64_t reads_mem, reads_fd, reads_sd, reads_miss, fills, evictions, flushes;
    uint64_t index_reads, index_visited, index_head_hits, index_head_moves;
    uint64_t index_sample_rounds, index_rehashes, index_buckets;
    uint64_t index_pinned_reads, index_pinned_head_hits; /* reads of pinned keys */
    uint64_t write_waits, write_wait_ns; /* writes that waited for a flush (engine_full) */
    /* the WAL's live bytes on FD and its limit (engine_opts.wal_max_mb), and
     * the flushes its size set off (overwrites: the dirty bytes stayed low) */
    uint64_t wal_bytes, wal_limit, wal_flushes;
} engine_stats;

void engine_thread_register(void);
void engine_thread_unregister(void);

/* Opens the engine: the memory tier, then the store of opts->kind
 * (recovering the WAL into the memory tier), then the flush/evict thread.
 * FAILED_PRECONDITION when fast_dir holds a store of the other kind, and
 * INVALID_ARGUMENT for kallax with a slow_dir or, creating the store,
 * without kallax_blocks (both before anything is written). On failure
 * writes a message naming the problem (and the damaged file) to err. */
kv_err engine_open(engine **out, const engine_opts *opts, char *err, size_t errlen);
/* Stops the background thread and closes the tiers without an extra flush
 * (the WAL holds what is dirty). No other thread may use the engine. NULL is
 * a no-op. */
void engine_close(engine *e);

/* Reads key. Returns KV_OK with out->found false for a missing, deleted or
 * expired key; DATA_LOSS when the block holding it is corrupt. On success
 * with found, out->val is owned by the caller. */
kv_err engine_get(engine *e, const void *key, size_t klen, engine_result *out);
/* engine_get for a caller that must not block (an RPC receive callback):
 * KV_OK with *out as engine_get's when the memory index answers the read
 * (its sampled hits feed the access trackers here, 1 in 16, as engine_get's
 * do); KV_NOT_FOUND, with nothing counted or copied, when the read needs
 * the LSM tiers, or when it is a sampled hit whose bookkeeping would write
 * to disk (HotRAP's tracker writing a run). Then call engine_get from a
 * thread that may block; it takes the tracker sample this call drew.
 * Registered threads only. */
kv_err engine_get_mem(engine *e, const void *key, size_t klen, engine_result *out);

/* Reads n keys at once: memory first, then one lsm_multiget for the misses
 * (their block reads are submitted together). errs[i] and out[i] are as
 * engine_get's for key i. Returns KV_OK when the batch ran. */
kv_err engine_get_many(engine *e, size_t n, const void *const *keys, const size_t *klens,
                       engine_result *out, kv_err *errs);

/* Applies a put or delete. Returns KV_OK (out->version = the version now
 * governing the key: the write's own, or a newer one that superseded it;
 * out->applied = whether this write was stored, false when a record with an
 * equal or newer version governs the key (last-writer-wins no-op)). A
 * delete is stored as a tombstone even when the key has no record at all,
 * so that an older copy applied later (a stream, a hint) cannot resurrect
 * the key. Returns
 * ALREADY_EXISTS (if_absent), FAILED_PRECONDITION (if_version mismatch),
 * INVALID_ARGUMENT (a key of 0 or over 4096 bytes, the memory tier's limit,
 * or over 1024 over kallax: engine_max_key;
 * a ttl_ms over KV_MAX_TTL_MS), RESOURCE_EXHAUSTED (volume or memory full,
 * or flush far behind), INTERNAL (an I/O error: the WAL file is logged),
 * DATA_LOSS; err gets a message for every failure. Nothing is acknowledged
 * before the WAL holds it per the sync mode, and a write that fails left
 * nothing in the WAL (a restart does not bring it back), except when the
 * WAL write itself failed half-way and its truncation failed too (logged). */
kv_err engine_write_one(engine *e, const engine_write *w, engine_result *out, char *err,
                        size_t errlen);
/* engine_write_one for a caller that should not block (an RPC receive
 * callback): declines (*declined = true; nothing stored, counted or
 * versioned) where engine_write_one would wait on the disk or for room:
 * sync mode "always" (the fsync), a write buffer at its cap, the key's
 * record not in memory when the write needs it (a condition, a delete, or a
 * version not above every stored one: the lookup may read blocks; a plain
 * put with a newer version than any stored is applied blind, see
 * engine_stats.blind_puts), or another writer of
 * the key's stripe. Else the same result as engine_write_one. It still
 * waits as any writer does for the WAL's group write (one write(2) of a
 * batch of records, the page cache in sync mode "batch") and, rarely, for
 * a WAL segment rotation. Registered threads only. */
kv_err engine_write_mem(engine *e, const engine_write *w, engine_result *out, bool *declined,
                        char *err, size_t errlen);

/* Cluster hot-key hint. on: the key's record is loaded into the memory
 * tier if absent (straight from the LSM, no admission check), kept there
 * (never evicted) and made the head of its HotRing ring; later writes keep
 * the pin. off: the key becomes an ordinary item again. Returns KV_OK,
 * NOT_FOUND (on: no record anywhere; the pin is still remembered and
 * applies to the key's next write), RESOURCE_EXHAUSTED (pin table full). */
kv_err engine_pin(engine *e, const void *key, size_t klen, bool on);
/* Whether key is pinned right now. */
bool engine_is_pinned(engine *e, const void *key, size_t klen);

/* Flushes every dirty item now and waits for it (tests, admin). */
kv_err engine_flush(engine *e);

/* Returns once every write acknowledged (engine_write_one returned) before
 * the call is durable in the WAL on FD (fsync), whatever the sync mode: a
 * stream persists its resume point only after this. (Not engine_sync: that
 * name is the sync-mode type above.) Returns KV_OK or INTERNAL (the fsync
 * failed, logged). Any thread. */
kv_err engine_wal_sync(engine *e);

/* ---- iteration (engine_iter.c) ----
 *
 * Every key's newest record, the memory tier merged over the LSM, in key
 * order (memcmp, a shorter key first on a common prefix; with kallax in
 * engine_key_cmp's order), tombstones and
 * expired records included (the caller checks tombstone and expire_at).
 * What it returns is a snapshot taken at engine_iter_open, give or take the
 * writes that race the open: a record written before the open and not
 * overwritten since comes out with that value; a later write may or may not
 * be seen. Safe while writers, flushes, compactions and HotRAP promotion
 * run. Close every iterator before engine_close. */
typedef struct engine_rec {
    const void *key;
    size_t klen;
    const void *val; /* NULL/0 for a tombstone */
    size_t vlen;
    uint64_t version;   /* HLC version */
    uint64_t expire_at; /* wall-clock ms, 0 = never */
    bool tombstone;
} engine_rec;

/* Returns true to keep key (key valid during the call only). */
typedef bool (*engine_key_filter)(void *arg, const void *key, size_t klen);

typedef struct engine_iter_opts {
    const void *after; /* start strictly after this key (borrowed for the open); NULL = first */
    size_t after_len;
    /* NULL = every key. Called once per key (> after) before its value is
     * copied, on the threads calling engine_iter_open (the memory tier's
     * dirty keys, inside its RCU read-side section: it must not block) and
     * engine_iter_next. */
    engine_key_filter filter;
    void *filter_arg;
} engine_iter_opts;

typedef struct engine_iter engine_iter;

/* Snapshots the dirty records of the memory tier (those > after that pass
 * the filter), then pins the LSM's current version. o may be NULL (every
 * key). Returns KV_OK and *out (caller owns it: engine_iter_close),
 * RESOURCE_EXHAUSTED, or the LSM's error (DATA_LOSS: a corrupt block).
 * Call from a thread registered with engine_thread_register. */
kv_err engine_iter_open(engine *e, const engine_iter_opts *o, engine_iter **out);
/* Returns KV_OK and the next record in *out (its pointers valid until the
 * next call or close), NOT_FOUND at the end, DATA_LOSS (a corrupt block,
 * logged with the file) or another error; an iterator that failed keeps
 * failing. One thread at a time (any thread). */
kv_err engine_iter_next(engine_iter *it, engine_rec *out);
/* Keys examined so far, filtered out or not. */
uint64_t engine_iter_scanned(const engine_iter *it);
/* Frees it and unpins the LSM version. NULL is a no-op. */
void engine_iter_close(engine_iter *it);

/* Removes every record whose key keep rejects: flushes the memory tier,
 * removes the clean memory items of rejected keys (dirty ones are writes
 * made since the flush and stay), runs lsm_compact_all_filter (every SST
 * rewritten, no version of a rejected key left; kallax: kallax_cleanup,
 * every block read, those holding a rejected key rewritten), then removes the clean
 * items again (a read that filled one meanwhile). *dropped = the record
 * versions removed from the SSTs (memory copies not counted), *kept = the
 * records left (SST entries, plus the dirty items); both may be NULL.
 * keep may be called from threads other than the caller's (the LSM's
 * compaction threads; today its manual steps run on the caller's) and
 * inside the memory tier's RCU read-side section: it must be thread-safe
 * and must not block. Returns KV_OK, or the flush's or compaction's error.
 * Any registered thread; blocks background compaction while it runs. */
kv_err engine_cleanup(engine *e, engine_key_filter keep, void *arg, uint64_t *dropped,
                      uint64_t *kept);

/* A cheap estimate (no I/O) of what the node holds: *keys = SST entries
 * (a key stored at several levels counts once per version; kallax: its
 * stored records) + dirty items, *bytes = SST file sizes (kallax: the
 * bytes its records use in blocks and extents) + the dirty items' key and
 * value bytes. For a
 * stream's ETA. Any thread. */
void engine_estimate(engine *e, uint64_t *keys, uint64_t *bytes);

void engine_get_stats(engine *e, engine_stats *out);
/* The store's statistics, for node/stats.c, which formats them (admin.Stats,
 * /metrics): the LSM's (levels, volumes, WAL, HotRAP, NHC routing) or
 * kallax's. Each returns KV_OK, or FAILED_PRECONDITION over the other kind
 * of store. Any thread. */
struct lsm_stats;
struct kallax_stats;
kv_err engine_lsm_get_stats(engine *e, struct lsm_stats *out);
kv_err engine_kallax_get_stats(engine *e, struct kallax_stats *out);
/* Whether the engine has a slow volume. */
bool engine_has_slow(const engine *e);
/* The engine's scheduler, NULL without one (no slow_dir or no HotRAP);
 * owned by the engine, valid until engine_close. */
nhc *engine_nhc(engine *e);
/* The store kind's name: "lsm" or "kallax". */
const char *engine_name(const engine *e);
/* The largest key the engine takes (the memory tier's limit, or kallax's). */
size_t engine_max_key(const engine *e);
/* The iteration order of engine_iter (<0, 0, >0): key order (lsm_key_cmp)
 * over the LSM; over kallax (home block, key) (kallax_key_cmp), a total
 * order too, so a stream resumes after its last key either way. Any thread. */
int engine_key_cmp(const engine *e, const void *a, size_t al, const void *b, size_t bl);
/* The WAL sync mode: "always", "batch" or "none". */
const char *engine_durability(const engine *e);
/* The node's hybrid logical clock (versions for direct writes). */
kv_hlc *engine_hlc(engine *e);

#endif
