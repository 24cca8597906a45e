/* SPDX-License-Identifier: MIT */
/*
 * tier_bench adapters for RocksDB (librocksdb C API) in three layouts:
 *   rocksdb-tiering: db_paths {FD, fast-mb MiB}, {SD, 1 TiB}: RocksDB puts a
 *                    level on the first path whose remaining target still
 *                    holds it (L0 counted as large as L1), WAL/MANIFEST on FD;
 *   rocksdb-capped:  rocksdb-tiering held to the fast volume by hotkv's rule
 *                    (lsm_fd_full): a put waits while the SSTs of the fast
 *                    levels exceed --fast-stop-pct percent of --fast-mb and
 *                    a compaction is pending or running. RocksDB places a
 *                    level's files by the levels' target sizes, not by what
 *                    they hold, so under a load its fast levels grow to many
 *                    times the fast volume (bench/tier/README.md, "The fast
 *                    volume's stop"); this layout is what a RocksDB on a
 *                    fast device of --fast-mb would have to do to not fill
 *                    it. A thread samples the fast levels' bytes every 5 ms
 *                    (rocksdb_livefiles); the time puts waited is
 *                    cap_wait_s in the JSON line;
 *   rocksdb-fd:      everything (WAL too) under --fast-dir;
 *   rocksdb-sd:      everything (WAL too) under --slow-dir.
 * Settings mirror hotkv's LSM so that only the design differs: leveled
 * compaction, L1 = fast-mb / 12 and x10 per level (hotkv's sizing, which
 * puts L0..L2 on FD), SST files of L1 / 4, 4 KiB blocks, compaction
 * read-ahead of 512 KiB, 10-bit bloom
 * filters, block compression per level as hotkv's (--compression, resolved
 * by the volume each level lives on: auto = lz4 on SD, none on FD; RocksDB's
 * zstd level is the library default, 3, as hotkv's), memtable = --write-buffer-mb, block cache =
 * --mem-mb + --tracker-mb (hotkv's memory tier gets --mem-mb +
 * --write-buffer-mb, as it holds its memtable too: eng_hotkv.c; and its
 * HotRAP tracker, RALT, keeps about --tracker-mb in memory), no manual compaction, two
 * background jobs. WAL sync follows --sync as hotkv's: always = sync on
 * every write; batch = writes reach the kernel and a thread calls
 * FlushWAL(sync) every --sync-ms (hotkv's WAL thread does the same);
 * none = never fsync.
 *
 * Reads per tier come from RocksDB's perf context, read around every timed
 * point read (rocks_perf.cc): a read answered by the memtable or by an FD
 * level counts as memory+FD; a read answered by an SD level counts as SD
 * when it read a data block from a file (block-cache miss; a bloom false
 * positive on an FD level above costs a block read too, rarely) and as
 * memory otherwise. SD read bytes = the block bytes those SD reads read.
 * Write amplification = (WAL + flush + compaction bytes written, from
 * RocksDB's statistics) / key+value bytes put.
 */
#include <inttypes.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/tier/rocks_perf.h"
#include "bench/tier/tier_bench.h"
#include "common/clock.h"
#include "node/lsm/lsm.h"

typedef enum rk_layout { RK_TIERING, RK_CAPPED, RK_FD, RK_SD } rk_layout;

typedef struct rk {
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_block_based_table_options_t *topts;
    rocksdb_cache_t *cache;
    rocksdb_filterpolicy_t *filter; /* owned by topts once set */
    rocksdb_writeoptions_t *wopts;
    rocksdb_readoptions_t *ropts;
    rk_layout layout;
    bool fd_level[TB_ROCKS_MAX_LEVELS]; /* level lives on the fast volume */
    int fd_levels;
    _Atomic uint64_t user_bytes;
    char wa_parts[96]; /* write amplification by source, at the last stats call */
    /* point reads by serving tier since open (every phase) */
    _Atomic uint64_t reads_mem, reads_fd, reads_sd, reads_miss, sd_read_bytes;
    pthread_t syncer;
    _Atomic bool stop;
    bool have_syncer;
    unsigned sync_ms;
    /* rocksdb-capped: the sampler thread's verdict, and what puts waited */
    pthread_t capper;
    bool have_capper;
    uint64_t cap_bytes; /* --fast-stop-pct percent of --fast-mb */
    _Atomic bool held;  /* the fast levels are over cap_bytes with work pending */
    _Atomic uint64_t cap_wait_ns, cap_waits;
} rk;

static _Thread_local bool t_counting; /* the perf context is on in this thread */

/* Levels on FD: RocksDB's LevelCompactionBuilder::GetPathId for our sizes. */
static void place_levels(rk *r, uint64_t fast, uint64_t base)
{
    uint64_t left = fast, size = base;
    r->fd_levels = 0;
    for (int l = 0; l < TB_ROCKS_MAX_LEVELS; l++) {
        bool tiered = r->layout == RK_TIERING || r->layout == RK_CAPPED;
        bool fd = r->layout == RK_FD || (tiered && size <= left && r->fd_levels == l);
        r->fd_level[l] = fd;
        if (fd) {
            r->fd_levels++;
            left -= size;
            if (l > 0)
                size *= 10;
        }
    }
}

static void set_table_options(rk *r, const tb_opts *o)
{
    r->topts = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_block_size(r->topts, 4096);
    r->cache = rocksdb_cache_create_lru((size_t)(o->mem_mb + o->tracker_mb) << 20);
    rocksdb_block_based_options_set_block_cache(r->topts, r->cache);
    r->filter = rocksdb_filterpolicy_create_bloom_full(10);
    rocksdb_block_based_options_set_filter_policy(r->topts, r->filter);
    rocksdb_options_set_block_based_table_factory(r->opts, r->topts);
}

/* hotkv's --compression for RocksDB: each level's codec by its index or the
 * volume place_levels put it on (tier_bench checked the spec). */
static void set_compression(rk *r, const tb_opts *o)
{
    lsm_compression_spec cs;
    char err[256];
    lsm_compression_parse(o->compression, &cs, err, sizeof(err));
    int per[TB_ROCKS_MAX_LEVELS];
    for (int l = 0; l < TB_ROCKS_MAX_LEVELS; l++) {
        lsm_compression c = lsm_compression_for(&cs, l < LSM_MAX_LEVELS ? l : LSM_MAX_LEVELS - 1,
                                                r->fd_level[l] ? LSM_TIER_FD : LSM_TIER_SD);
        per[l] = c == LSM_COMPRESS_LZ4    ? rocksdb_lz4_compression
                 : c == LSM_COMPRESS_ZSTD ? rocksdb_zstd_compression
                                          : rocksdb_no_compression;
    }
    rocksdb_options_set_compression_per_level(r->opts, per, TB_ROCKS_MAX_LEVELS);
}

static void set_options(rk *r, const tb_opts *o)
{
    uint64_t fast = (uint64_t)o->fast_mb << 20, base = fast / 12;
    if (base < (64u << 10))
        base = 64u << 10;
    r->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(r->opts, 1);
    rocksdb_options_set_compression(r->opts, rocksdb_no_compression); /* per level below */
    rocksdb_options_set_write_buffer_size(r->opts, (size_t)o->write_buffer_mb << 20);
    rocksdb_options_set_max_bytes_for_level_base(r->opts, base);
    rocksdb_options_set_max_bytes_for_level_multiplier(r->opts, 10.0);
    rocksdb_options_set_level_compaction_dynamic_level_bytes(r->opts, 0);
    rocksdb_options_set_target_file_size_base(r->opts, base / 4);
    rocksdb_options_set_max_background_jobs(r->opts, 2);
    /* compaction reads its inputs 512 KiB at a time, as hotkv's (sst.c's
     * READ_AHEAD); RocksDB 7.8's default of 0 reads them block by block,
     * 4 KiB per request on the slow volume */
    rocksdb_options_compaction_readahead_size(r->opts, 512u << 10);
    rocksdb_options_enable_statistics(r->opts);
    set_table_options(r, o);
    place_levels(r, fast, base);
    set_compression(r, o);
    r->wopts = rocksdb_writeoptions_create();
    rocksdb_writeoptions_set_sync(r->wopts, o->sync_idx == TB_SYNC_ALWAYS);
    r->ropts = rocksdb_readoptions_create();
}

static void *syncer_main(void *arg)
{
    rk *r = arg;
    struct timespec ts = {(time_t)(r->sync_ms / 1000), (long)(r->sync_ms % 1000) * 1000000L};
    while (!atomic_load(&r->stop)) {
        nanosleep(&ts, NULL);
        char *err = NULL;
        rocksdb_flush_wal(r->db, 1, &err);
        if (err) {
            fprintf(stderr, "tier_bench: rocksdb: FlushWAL: %s\n", err);
            rocksdb_free(err);
        }
    }
    return NULL;
}

/* The SST bytes of the levels on each volume (rocksdb_livefiles); false
 * when RocksDB listed no files. */
static bool vol_sst_bytes(rk *r, uint64_t *fd, uint64_t *sd)
{
    *fd = *sd = 0;
    const rocksdb_livefiles_t *lf = rocksdb_livefiles(r->db);
    if (!lf)
        return false;
    for (int i = 0; i < rocksdb_livefiles_count(lf); i++) {
        int l = rocksdb_livefiles_level(lf, i);
        bool on_fd = l >= 0 && l < TB_ROCKS_MAX_LEVELS && r->fd_level[l];
        *(on_fd ? fd : sd) += rocksdb_livefiles_size(lf, i);
    }
    bool any = rocksdb_livefiles_count(lf) > 0;
    rocksdb_livefiles_destroy(lf);
    return any;
}

/* Compaction is due or under way (what lets the fast levels shrink). */
static bool compaction_work(rk *r)
{
    uint64_t pending = 0, running = 0;
    rocksdb_property_int(r->db, "rocksdb.compaction-pending", &pending);
    rocksdb_property_int(r->db, "rocksdb.num-running-compactions", &running);
    return pending || running;
}

static void *capper_main(void *arg)
{
    rk *r = arg;
    const struct timespec ts = {0, 5 * 1000 * 1000};
    while (!atomic_load(&r->stop)) {
        uint64_t fd, sd;
        vol_sst_bytes(r, &fd, &sd);
        atomic_store(&r->held, fd > r->cap_bytes && compaction_work(r));
        nanosleep(&ts, NULL);
    }
    atomic_store(&r->held, false); /* never leave a writer waiting on a stopped sampler */
    return NULL;
}

/* rocksdb-capped: a put waits while the sampler holds writes. */
static void cap_wait(rk *r)
{
    if (!atomic_load_explicit(&r->held, memory_order_relaxed))
        return;
    uint64_t t0 = kv_now_ns();
    const struct timespec ts = {0, 200 * 1000};
    while (atomic_load_explicit(&r->held, memory_order_relaxed))
        nanosleep(&ts, NULL);
    atomic_fetch_add_explicit(&r->cap_wait_ns, kv_now_ns() - t0, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->cap_waits, 1, memory_order_relaxed);
}

static void rk_close(void *h)
{
    rk *r = h;
    if (!r)
        return;
    if (r->have_syncer || r->have_capper) {
        atomic_store(&r->stop, true);
        if (r->have_syncer)
            pthread_join(r->syncer, NULL);
        if (r->have_capper)
            pthread_join(r->capper, NULL);
    }
    char *cf = r->db ? rocksdb_property_value(r->db, "rocksdb.cfstats-no-file-histogram") : NULL;
    if (cf) /* per-level compaction stats, beside hotkv's (eng_hotkv.c) */
        fprintf(stderr, "tier_bench: rocksdb: cfstats at close:\n%s\n", cf);
    rocksdb_free(cf);
    if (r->db)
        rocksdb_close(r->db);
    if (r->wopts)
        rocksdb_writeoptions_destroy(r->wopts);
    if (r->ropts)
        rocksdb_readoptions_destroy(r->ropts);
    if (r->opts)
        rocksdb_options_destroy(r->opts);
    if (r->topts)
        rocksdb_block_based_options_destroy(r->topts);
    if (r->cache)
        rocksdb_cache_destroy(r->cache);
    free(r);
}

/* The database directory of the layout; the tiering layout's db_paths. */
static kv_err rk_paths(rk *r, const tb_opts *o, char *name, size_t len, char *err, size_t errlen)
{
    const char *root = r->layout == RK_SD ? o->slow_dir : o->fast_dir;
    if (!root) {
        snprintf(err, errlen, "rocksdb-sd needs --slow-dir");
        return KV_INVALID_ARGUMENT;
    }
    snprintf(name, len, "%s/rocksdb", root);
    if (r->layout == RK_TIERING || r->layout == RK_CAPPED) {
        char slow[4096];
        snprintf(slow, sizeof(slow), "%s/rocksdb", o->slow_dir);
        rocksdb_dbpath_t *p[2] = {rocksdb_dbpath_create(name, (uint64_t)o->fast_mb << 20),
                                  rocksdb_dbpath_create(slow, UINT64_C(1) << 40)};
        rocksdb_options_set_db_paths(r->opts, (const rocksdb_dbpath_t **)p, 2);
        rocksdb_dbpath_destroy(p[0]);
        rocksdb_dbpath_destroy(p[1]);
    }
    return KV_OK;
}

static kv_err rk_open_layout(const tb_opts *o, void **h, rk_layout layout, char *err, size_t errlen)
{
    rk *r = calloc(1, sizeof(*r));
    if (!r)
        return KV_RESOURCE_EXHAUSTED;
    r->layout = layout;
    set_options(r, o);
    char name[4096], *e = NULL;
    kv_err rv = rk_paths(r, o, name, sizeof(name), err, errlen);
    if (rv == KV_OK) {
        r->db = rocksdb_open(r->opts, name, &e);
        if (e) {
            snprintf(err, errlen, "%s", e);
            rocksdb_free(e);
            r->db = NULL;
            rv = KV_UNAVAILABLE;
        }
    }
    if (rv == KV_OK && o->sync_idx == TB_SYNC_BATCH) {
        r->sync_ms = (unsigned)o->sync_ms;
        r->have_syncer = pthread_create(&r->syncer, NULL, syncer_main, r) == 0;
        if (!r->have_syncer)
            rv = KV_RESOURCE_EXHAUSTED;
    }
    if (rv == KV_OK && layout == RK_CAPPED) {
        uint64_t pct =
            o->fast_stop_pct > 0 ? (uint64_t)o->fast_stop_pct : 100; /* hotkv's default */
        r->cap_bytes = ((uint64_t)o->fast_mb << 20) / 100 * pct;
        r->have_capper = pthread_create(&r->capper, NULL, capper_main, r) == 0;
        if (!r->have_capper)
            rv = KV_RESOURCE_EXHAUSTED;
    }
    if (rv != KV_OK) {
        rk_close(r);
        return rv;
    }
    *h = r;
    return KV_OK;
}

static kv_err rk_open_tiering(const tb_opts *o, void **h, char *err, size_t errlen)
{
    return rk_open_layout(o, h, RK_TIERING, err, errlen);
}

static kv_err rk_open_capped(const tb_opts *o, void **h, char *err, size_t errlen)
{
    return rk_open_layout(o, h, RK_CAPPED, err, errlen);
}

static kv_err rk_open_fd(const tb_opts *o, void **h, char *err, size_t errlen)
{
    return rk_open_layout(o, h, RK_FD, err, errlen);
}

static kv_err rk_open_sd(const tb_opts *o, void **h, char *err, size_t errlen)
{
    return rk_open_layout(o, h, RK_SD, err, errlen);
}

static void rk_noop(void *h) {}

static void rk_thread_begin(void *h)
{
    tb_rocks_perf_begin();
    t_counting = true;
}

static void rk_thread_end(void *h)
{
    tb_rocks_perf_end();
    t_counting = false;
}

static void count(_Atomic uint64_t *c, uint64_t n)
{
    atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* Files a read under the tier that served it (see the top). */
static void rk_classify(rk *r, bool found, const tb_rocks_get *g)
{
    if (!found) {
        count(&r->reads_miss, 1);
    } else if (g->level < 0 || r->fd_level[g->level]) {
        count(g->level < 0 ? &r->reads_mem : &r->reads_fd, 1);
    } else if (g->block_reads == 0) {
        count(&r->reads_mem, 1); /* block cache */
    } else {
        count(&r->reads_sd, 1);
        count(&r->sd_read_bytes, g->block_read_bytes);
    }
}

static kv_err rk_put(void *h, const void *key, size_t klen, const void *val, size_t vlen)
{
    rk *r = h;
    char *e = NULL;
    if (r->have_capper)
        cap_wait(r);
    rocksdb_put(r->db, r->wopts, key, klen, val, vlen, &e);
    if (e) {
        fprintf(stderr, "tier_bench: rocksdb: put: %s\n", e);
        rocksdb_free(e);
        return KV_UNAVAILABLE;
    }
    atomic_fetch_add_explicit(&r->user_bytes, klen + vlen, memory_order_relaxed);
    return KV_OK;
}

static kv_err rk_get(void *h, const void *key, size_t klen, bool *found)
{
    rk *r = h;
    char *e = NULL;
    if (t_counting)
        tb_rocks_perf_get_begin();
    rocksdb_pinnableslice_t *v = rocksdb_get_pinned(r->db, r->ropts, key, klen, &e);
    if (e) {
        fprintf(stderr, "tier_bench: rocksdb: get: %s\n", e);
        rocksdb_free(e);
        return KV_UNAVAILABLE;
    }
    *found = v != NULL;
    rocksdb_pinnableslice_destroy(v);
    if (t_counting) {
        tb_rocks_get g;
        tb_rocks_perf_get_end(&g);
        rk_classify(r, *found, &g);
    }
    return KV_OK;
}

/* The COUNT of ticker `name` in RocksDB's statistics dump (0 when absent). */
static uint64_t ticker(const char *dump, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = dump; p && (p = strstr(p, name)); p += n) {
        if ((p == dump || p[-1] == '\n') && p[n] == ' ') {
            unsigned long long v = 0;
            if (sscanf(p + n, " COUNT : %llu", &v) == 1)
                return v;
        }
    }
    return 0;
}

/* (WAL + flush + compaction bytes) / user bytes; *written, *user its sides
 * (left alone when the statistics are unavailable). */
static double rk_write_amp(rk *r, uint64_t *written, uint64_t *user_out)
{
    char *dump = rocksdb_options_statistics_get_string(r->opts);
    if (!dump)
        return -1.0;
    uint64_t wal = ticker(dump, "rocksdb.wal.bytes"),
             fl = ticker(dump, "rocksdb.flush.write.bytes");
    uint64_t co = ticker(dump, "rocksdb.compact.write.bytes");
    rocksdb_free(dump);
    uint64_t user = atomic_load(&r->user_bytes);
    *written = wal + fl + co;
    *user_out = user;
    if (user)
        snprintf(r->wa_parts, sizeof(r->wa_parts), "wal=%.2f flush=%.2f compact=%.2f",
                 (double)wal / (double)user, (double)fl / (double)user, (double)co / (double)user);
    return user ? (double)(wal + fl + co) / (double)user : -1.0;
}

static void rk_stats(void *h, tb_stats *out)
{
    rk *r = h;
    memset(out, 0, sizeof(*out));
    out->write_amp = rk_write_amp(r, &out->written_bytes, &out->user_bytes);
    out->reads_mem = atomic_load(&r->reads_mem);
    out->reads_fd = atomic_load(&r->reads_fd);
    out->reads_sd = atomic_load(&r->reads_sd);
    out->reads_miss = atomic_load(&r->reads_miss);
    out->sd_read_bytes = atomic_load(&r->sd_read_bytes);
    uint64_t imem = 0; /* index and filter blocks of the open files (no cache for them) */
    out->have_index_mem =
        rocksdb_property_int(r->db, "rocksdb.estimate-table-readers-mem", &imem) == 0;
    out->index_mem = imem;
    out->have_vol_bytes = vol_sst_bytes(r, &out->fd_sst_bytes, &out->sd_sst_bytes);
}

static bool rk_settled(void *h)
{
    rk *r = h;
    static const char *const props[] = {
        "rocksdb.compaction-pending", "rocksdb.num-running-compactions",
        "rocksdb.mem-table-flush-pending", "rocksdb.num-running-flushes"};
    for (size_t i = 0; i < sizeof(props) / sizeof(props[0]); i++) {
        uint64_t v = 0;
        if (rocksdb_property_int(r->db, props[i], &v) != 0 || v != 0)
            return false;
    }
    return true;
}

static void rk_json_extra(void *h, char *buf, size_t len)
{
    rk *r = h;
    char levels[256] = "", val[64];
    size_t off = 0;
    for (int l = 0; l < TB_ROCKS_MAX_LEVELS; l++) {
        snprintf(val, sizeof(val), "rocksdb.num-files-at-level%d", l);
        char *files = rocksdb_property_value(r->db, val);
        if (files && strcmp(files, "0") != 0 && off < sizeof(levels))
            off += (size_t)snprintf(levels + off, sizeof(levels) - off, "%sL%d=%s/%s",
                                    off ? " " : "", l, files, r->fd_level[l] ? "fast" : "slow");
        rocksdb_free(files);
    }
    char cap[160] = "";
    if (r->have_capper)
        snprintf(cap, sizeof(cap),
                 ",\"cap_bytes\":%" PRIu64 ",\"cap_waits\":%" PRIu64 ",\"cap_wait_s\":%.3f",
                 r->cap_bytes, atomic_load(&r->cap_waits),
                 (double)atomic_load(&r->cap_wait_ns) / 1e9);
    snprintf(buf, len,
             ",\"hotrap_available\":false,\"levels\":\"%s\",\"wa_parts\":\"%s\",\"fd_levels\":%d%s,"
             "\"note\":\"tiers from RocksDB's perf context per get (answering level, block reads); "
             "sd_read_bytes counts get block reads only\"",
             levels, r->wa_parts, r->fd_levels, cap);
}

const tb_engine tb_rocksdb_tiering_engine = {
    "rocksdb-tiering", rk_open_tiering, rk_close, rk_thread_begin, rk_thread_end, rk_noop,
    rk_noop,           rk_put,          rk_get,   rk_stats,        rk_settled,    rk_json_extra,
};

const tb_engine tb_rocksdb_capped_engine = {
    "rocksdb-capped", rk_open_capped, rk_close, rk_thread_begin, rk_thread_end, rk_noop,
    rk_noop,          rk_put,         rk_get,   rk_stats,        rk_settled,    rk_json_extra,
};

const tb_engine tb_rocksdb_fd_engine = {
    "rocksdb-fd", rk_open_fd, rk_close, rk_thread_begin, rk_thread_end, rk_noop,
    rk_noop,      rk_put,     rk_get,   rk_stats,        rk_settled,    rk_json_extra,
};

const tb_engine tb_rocksdb_sd_engine = {
    "rocksdb-sd", rk_open_sd, rk_close, rk_thread_begin, rk_thread_end, rk_noop,
    rk_noop,      rk_put,     rk_get,   rk_stats,        rk_settled,    rk_json_extra,
};
