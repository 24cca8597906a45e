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
#include "proto/statlist.h"

typedef struct engine engine;

typedef enum engine_sync { ENGINE_SYNC_ALWAYS, ENGINE_SYNC_BATCH, ENGINE_SYNC_NONE } engine_sync;

typedef struct engine_opts {
    const char *fast_dir;   /* FD: WAL, MANIFEST and the upper levels (required) */
    const char *slow_dir;   /* SD: the lower levels; NULL = every level on FD */
    uint64_t fast_mb;       /* FD capacity for the levels */
    size_t mem_mb;          /* memory-tier budget */
    size_t write_buffer_mb; /* dirty bytes that trigger a flush (may be 0 for KiB below) */
    size_t write_buffer_kb; /* finer setting for tests; wins when non-zero */
    engine_sync sync;
    unsigned sync_ms;
    uint64_t index_buckets;   /* initial HotRing buckets (0 = from mem_mb) */
    double index_rehash_cost; /* HotRing rehash trigger: items visited per access (0 = 8) */
    bool disable_io_uring;
    bool no_hotrap; /* plain tiering: no read-hot retention/promotion (HotRAP) */
    /* NHC scheduler options (borrowed during engine_open), NULL = defaults
     * (nhc_opts_default: enabled). Used only with a slow_dir and HotRAP;
     * enable false keeps it in classic state. twin_entries: twin-map bound,
     * 0 = derived from fast_mb (lsm_opts.twin_entries). */
    const nhc_opts *nhc;
    uint64_t twin_entries;
} engine_opts;

/* A write. version 0 = the engine assigns one from its HLC (direct writes);
 * otherwise the coordinator's version is applied last-writer-wins. */
typedef struct engine_write {
    const void *key;
    size_t klen;
    const void *val;
    size_t vlen;
    uint64_t version;
    uint64_t ttl_ms;     /* 0 = no expiry */
    uint64_t if_version; /* 0 = unconditional */
    bool if_absent;
    bool is_delete;
} engine_write;

typedef struct engine_result {
    uint64_t version; /* version written (or of the record read) */
    bool found;       /* get: a live record; delete: a live record existed */
    uint8_t *val;     /* get: malloc'ed copy, owned by the caller (free()) */
    size_t vlen;
} engine_result;

typedef struct engine_stats {
    uint64_t items, mem_bytes, mem_limit, dirty_bytes;
    uint64_t gets, puts, deletes;
    uint64_t reads_mem, reads_fd, reads_sd, reads_miss, fills, evictions, flushes;
    uint64_t index_reads, index_visited, index_head_hits, index_head_moves;
    uint64_t index_sample_rounds, index_rehashes, index_buckets;
    uint64_t index_pinned_reads, index_pinned_head_hits; /* reads of pinned keys */
} engine_stats;

void engine_thread_register(void);
void engine_thread_unregister(void);

/* Opens the engine: the memory tier, then the LSM (recovering the WAL into
 * the memory tier), then the flush/evict thread. On failure writes a message
 * naming the problem (and the damaged file) to err. */
kv_err engine_open(engine **out, const engine_opts *opts, char *err, size_t errlen);
/* Stops the background thread and closes the tiers without an extra flush
 * (the WAL holds what is dirty). No other thread may use the engine. NULL is
 * a no-op. */
void engine_close(engine *e);

/* Reads key. Returns KV_OK with out->found false for a missing, deleted or
 * expired key; DATA_LOSS when the block holding it is corrupt. On success
 * with found, out->val is owned by the caller. */
kv_err engine_get(engine *e, const void *key, size_t klen, engine_result *out);

/* Reads n keys at once: memory first, then one lsm_multiget for the misses
 * (their block reads are submitted together). errs[i] and out[i] are as
 * engine_get's for key i. Returns KV_OK when the batch ran. */
kv_err engine_get_many(engine *e, size_t n, const void *const *keys, const size_t *klens,
                       engine_result *out, kv_err *errs);

/* Applies a put or delete. Returns KV_OK (out->version = the version now
 * governing the key: the write's own, or a newer one that superseded it),
 * ALREADY_EXISTS (if_absent), FAILED_PRECONDITION (if_version mismatch),
 * RESOURCE_EXHAUSTED (volume full or flush far behind), DATA_LOSS; err gets
 * a message for every failure. Nothing is acknowledged before the WAL holds
 * it per the sync mode. */
kv_err engine_write_one(engine *e, const engine_write *w, engine_result *out, char *err,
                        size_t errlen);

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

void engine_get_stats(engine *e, engine_stats *out);
/* Appends the LSM/tier statistics (levels, volumes, WAL) to l. */
void engine_lsm_stats(engine *e, rpc_statlist *l);
/* Appends the NHC scheduler's state to l: nhc.state, nhc.data_admit,
 * nhc.load_admit, nhc.miss_ratio, per-volume reads/s and latency, twin-map
 * size and the last minute (nhc.series.N). Only nhc.state ("off") without a
 * scheduler. Any registered thread. */
void engine_nhc_stats(engine *e, rpc_statlist *l);
/* The engine's scheduler, NULL without one (no slow_dir or no HotRAP);
 * owned by the engine, valid until engine_close. */
nhc *engine_nhc(engine *e);
/* The WAL sync mode: "always", "batch" or "none". */
const char *engine_durability(const engine *e);
/* The node's hybrid logical clock (versions for direct writes). */
kv_hlc *engine_hlc(engine *e);

#endif
