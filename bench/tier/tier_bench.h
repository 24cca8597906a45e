/* SPDX-License-Identifier: MIT */
/*
 * tier_bench: the tiered-storage benchmark (issues 4 and 5). One run loads
 * N records into one engine (hotkv's storage engine or RocksDB through its C
 * API, laid out over a fast and a slow directory), then replays pre-drawn
 * per-thread YCSB traces (bench/workload.h) for a warm-up and a timed phase
 * and prints one JSON line (DESIGN.md §6). This header is shared by the
 * driver (tier_bench.c), the runner (tier_run.c) and the engine adapters
 * (eng_hotkv.c, eng_rocksdb.c): an engine is a table of functions over an
 * opaque handle, the same shape for every engine.
 */
#ifndef KV_BENCH_TIER_BENCH_H
#define KV_BENCH_TIER_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/workload.h"
#include "kv/kv_err.h"

/* The workloads of the HotRAP paper plus YCSB C and A (see tier_bench.c). */
/* B, D and F are YCSB's own mixes (D reads the latest inserts, F reads
 * then writes the same key). */
typedef enum tb_workload {
    TB_RO,
    TB_RW,
    TB_WH,
    TB_UH,
    TB_C,
    TB_A,
    TB_B,
    TB_D,
    TB_F,
    TB_NWORKLOADS
} tb_workload;
typedef enum tb_sync { TB_SYNC_ALWAYS, TB_SYNC_BATCH, TB_SYNC_NONE } tb_sync;
typedef enum tb_insert_ids { TB_IDS_THREAD, TB_IDS_SHARED } tb_insert_ids;

typedef struct tb_opts {
    const char *engine_name;
    const char *fast_dir, *slow_dir;
    long fast_mb, mem_mb, write_buffer_mb;
    long tracker_mb; /* RocksDB: block cache += this (hotkv's RALT memory, equal budgets) */
    long records, value_size, threads, trace_ops, seed;
    long kallax_blocks; /* kallax: the store's home blocks, 0 = from records and value size */
    double seconds, warmup, shift_at, progress_s, settle_s;
    int workload_idx, dist_idx, sync_idx;
    long sync_ms;
    /* hotkv and RocksDB: SST block compression (lsm_compression_parse: auto
     * = lz4 on SD levels, none on FD levels); value_ratio: the share of each
     * value's bytes that are random, the rest repeats them (db_bench's
     * --compression_ratio; 1 = incompressible, the default). */
    const char *compression;
    double value_ratio;
    long fast_stop_pct; /* hotkv: lsm_opts.fd_stop_pct (kvnode --fast-stop-pct), 0 = default */
    long run_ops;       /* the timed phase ends after this many ops (or --seconds), 0 = time only */
    /* --insert-ids: TB_IDS_THREAD = each thread its own stride (records +
     * thread + k x threads, pre-drawn), TB_IDS_SHARED = one counter the
     * threads share (YCSB's insert sequence: the ids inserted so far are
     * always a dense range). */
    int insert_ids_idx;
    bool load_only, no_load;
    int nhc_idx;                           /* hotkv: the NHC scheduler (node/nhc) on or off */
    const char *workload_name, *dist_name; /* as given: "RO", "hotspot5", ... */
    wl_config wl;                          /* distribution, keys, seed */
} tb_opts;

/* What an engine reports; counters are cumulative since open, the runner
 * takes differences over the timed phase. A field an engine cannot measure
 * is left at its "unknown" value (a negative double, or have_* false). */
typedef struct tb_stats {
    uint64_t reads_mem, reads_fd, reads_sd, reads_miss; /* point reads by serving tier */
    uint64_t sd_read_bytes;                             /* bytes read from the slow volume */
    double write_amp; /* bytes written / user bytes, < 0 unknown */
    /* The two sides of write_amp, cumulative (0 user bytes: unknown); the
     * runner divides their differences over the warm-up and timed phase
     * (tb_result.run_wa). */
    uint64_t written_bytes, user_bytes;
    bool have_hotrap; /* promoted/retained are meaningful */
    uint64_t promoted, retained;
    bool have_index_mem; /* index_mem is meaningful */
    uint64_t index_mem;  /* memory that grows with the keys: index blocks, filters */
    bool have_vol_bytes; /* fd_sst_bytes / sd_sst_bytes are meaningful */
    uint64_t fd_sst_bytes, sd_sst_bytes; /* SST file bytes on each volume (levels) */
} tb_stats;

/* kallax's home blocks for a run: --kallax-blocks, or four times the
 * loaded records' bytes (eng_kallax.c). */
uint64_t tb_kallax_blocks(const tb_opts *o);

typedef struct tb_engine {
    const char *name;
    /* Opens (creating when absent) the engine's store under the options'
     * directories; writes a message to err on failure. */
    kv_err (*open)(const tb_opts *o, void **h, char *err, size_t errlen);
    void (*close)(void *h);
    /* Per worker thread, around all its calls into the engine. */
    void (*thread_begin)(void *h);
    void (*thread_end)(void *h);
    /* Per worker thread: the timed phase starts / ends (per-thread counters). */
    void (*measure_begin)(void *h);
    void (*measure_end)(void *h);
    kv_err (*put)(void *h, const void *key, size_t klen, const void *val, size_t vlen);
    /* A point read; *found tells whether a live record was there. */
    kv_err (*get)(void *h, const void *key, size_t klen, bool *found);
    void (*stats)(void *h, tb_stats *out);
    /* True when no flush or compaction is pending (the LSM's shape is what
     * its sizing asks for); the runner waits for it after the load. */
    bool (*settled)(void *h);
    /* Extra JSON members for the result line (",\"k\":v..."), may be empty. */
    void (*json_extra)(void *h, char *buf, size_t len);
} tb_engine;

extern const tb_engine tb_hotkv_engine, tb_hotkv_nohotrap_engine, tb_hotkv_nogate_engine;
extern const tb_engine tb_rocksdb_tiering_engine, tb_rocksdb_capped_engine, tb_rocksdb_fd_engine,
    tb_rocksdb_sd_engine;
extern const tb_engine tb_kallax_engine, tb_hotkv_kallax_engine;

/* Reads at one moment of a phase (seconds since its start). */
typedef struct tb_hit_sample {
    double t;
    uint64_t hit, tot;           /* memory + FD reads, all reads (cumulative) */
    uint64_t promoted, retained; /* HotRAP's records (cumulative) */
} tb_hit_sample;

/* The result of one run (tier_run.c fills it, tier_bench.c prints it). */
typedef struct tb_result {
    double load_s, load_ops_per_s;
    double settle_s; /* waited after the load for compactions to finish */
    bool settled;
    double load_wa;    /* write amplification when the last load write returned (< 0 unknown) */
    double settled_wa; /* ... after the settle (the compaction debt paid; < 0 unknown) */
    /* Bytes written / user bytes from the start of the warm-up to the end
     * of the settle after the timed phase (< 0: unknown, or nothing
     * inserted); the run's inserts with the compaction debt they left. */
    double run_wa;
    double run_settle_s; /* the settle after the timed phase (0 with --settle 0) */
    bool run_settled;
    double run_s, ops_per_s;
    uint64_t ops, gets, gets_found, puts;
    double p50_get_us, p99_get_us, p999_get_us, p50_put_us, p99_put_us;
    double avg_get_us;      /* mean read latency of the timed phase */
    double cpu_us_per_op;   /* process CPU (user + system, getrusage) per op, timed phase */
    tb_stats before, after; /* engine stats at the start and end of the timed phase; after
                             * the load (and settling) under --load-only */
    /* --shift-at: FD hit rate from the start of the timed phase to the
     * move, over the run's last window, and seconds after the move until
     * a 2 s window reached 90% of the former (-1 = never) */
    bool have_shift;
    double shift_steady, shift_end, shift_recovery_s;
    /* The most bytes (allocated blocks of every file: SSTs, WAL, logs)
     * --fast-dir held, sampled every 100 ms from the load to the end of the
     * run: what the fast volume must have room for, whatever the engine. */
    uint64_t fd_dir_peak_bytes;
    uint64_t insert_id_max; /* the highest id the run's inserts wrote (0: none) */
    uint64_t inserted;      /* inserts in the warm-up and the timed phase */
} tb_result;

/* The value of record id (vlen bytes, deterministic): the runner writes it
 * and may check it. */
/* The value of id at version: vlen deterministic bytes, of which the first
 * ratio x vlen are pseudo-random and the rest repeats them. */
void tb_fill_value(uint64_t id, uint64_t version, unsigned char *buf, size_t vlen, double ratio);

/* Loads o->records records (unless --no-load), then warms up and measures
 * (unless --load-only). Returns KV_OK or the first engine error (printed). */
kv_err tb_run(const tb_opts *o, const tb_engine *eng, void *h, tb_result *res);

/* Builds the workload model of o (HotRAP mixes mapped onto wl_model). */
kv_err tb_model(const tb_opts *o, uint64_t offset, wl_model *m, char *err, size_t errlen);

#endif
