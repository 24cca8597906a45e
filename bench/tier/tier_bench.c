/* SPDX-License-Identifier: MIT */
/*
 * tier_bench's driver: flags, the mapping of the HotRAP paper's workloads
 * onto the shared YCSB generator, and the JSON result line.
 *
 * Keys are 8-byte big-endian ids (wl_key8, DESIGN.md §6), so key order is id
 * order; values are value-size deterministic bytes of (id, version).
 * Workloads (HotRAP, ATC'25, §5, plus YCSB): RO = 100% reads; RW = 50% reads,
 * 50% inserts; WH = 10% reads, 90% inserts; UH = 50% reads, 50% updates (YCSB
 * A's mix); C and A = YCSB C and A. Reads and updates draw ids of the loaded
 * records from --dist; inserts write new ids past them (YCSB insert order;
 * once a thread's trace wraps its inserts become updates of its own ids).
 * Distributions: hotspotX (X% of the ids, a contiguous range, get 100-X% of
 * the accesses, YCSB's hotspot), zipfT (YCSB's scrambled zipfian with theta
 * T, hot ids spread over the key space), uniform. With --shift-at S the hot
 * set moves at second S of the timed phase (ids rotated by records / 2).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/tier/tier_bench.h"
#include "common/opts.h"
#include "node/lsm/lsm.h"

static const tb_engine *const engines[] = {
    &tb_hotkv_engine,           &tb_hotkv_nohotrap_engine, &tb_kallax_engine,
    &tb_hotkv_kallax_engine,    &tb_hotkv_nogate_engine,
#ifdef KV_TIER_HAVE_ROCKSDB
    &tb_rocksdb_tiering_engine, &tb_rocksdb_capped_engine, &tb_rocksdb_fd_engine,
    &tb_rocksdb_sd_engine,
#endif
};
#define NENGINES (sizeof(engines) / sizeof(engines[0]))

static const char *const workload_choices[] = {"RO", "RW", "WH", "UH", "C",
                                               "A",  "B",  "D",  "F",  NULL};
static const char *const sync_choices[] = {"always", "batch", "none", NULL};
static const char *const onoff_choices[] = {"on", "off", NULL};
static const char *const insert_ids_choices[] = {"thread", "shared", NULL};
/* read, update, insert shares per tb_workload */
static const double mixes[TB_NWORKLOADS][3] = {
    [TB_RO] = {1.0, 0.0, 0.0}, [TB_RW] = {0.5, 0.0, 0.5}, [TB_WH] = {0.1, 0.0, 0.9},
    [TB_UH] = {0.5, 0.5, 0.0}, [TB_C] = {1.0, 0.0, 0.0},  [TB_A] = {0.5, 0.5, 0.0},
};
/* the YCSB workloads whose mix and distribution come from bench/workload.c */
static const wl_workload ycsb_own[TB_NWORKLOADS] = {[TB_B] = WL_B, [TB_D] = WL_D, [TB_F] = WL_F};

kv_err tb_model(const tb_opts *o, uint64_t offset, wl_model *m, char *err, size_t errlen)
{
    wl_config c = o->wl;
    c.workload = o->workload_idx == TB_A || o->workload_idx == TB_UH ? WL_A : WL_C;
    c.workload = ycsb_own[o->workload_idx] ? ycsb_own[o->workload_idx] : c.workload;
    c.offset = offset;
    kv_err rv = wl_model_init(m, &c, err, errlen);
    if (rv != KV_OK || ycsb_own[o->workload_idx])
        return rv;
    m->read = mixes[o->workload_idx][0];
    m->update = mixes[o->workload_idx][1];
    m->insert = mixes[o->workload_idx][2];
    m->rmw = 0.0;
    return KV_OK;
}

/* "hotspot5", "zipf0.99", "uniform" -> o->wl.dist and its parameter. */
static kv_err parse_dist(tb_opts *o, char *err, size_t errlen)
{
    const char *d = o->dist_name;
    char *end = NULL;
    if (!strcmp(d, "uniform")) {
        o->wl.dist = WL_UNIFORM;
        return KV_OK;
    }
    if (!strncmp(d, "hotspot", 7)) {
        o->wl.dist = WL_HOTSPOT;
        o->wl.hot_pct = d[7] ? strtod(d + 7, &end) : 5.0;
    } else if (!strncmp(d, "zipf", 4)) {
        o->wl.dist = WL_SCRAMBLED_ZIPF;
        o->wl.theta = d[4] ? strtod(d + 4, &end) : 0.99;
    } else {
        end = (char *)d;
    }
    if (end && *end) {
        snprintf(err, errlen, "--dist: '%s' is not hotspotX, zipfT or uniform", d);
        return KV_INVALID_ARGUMENT;
    }
    lsm_compression_spec cs;
    char cerr[256];
    if (lsm_compression_parse(o->compression, &cs, cerr, sizeof(cerr)) != KV_OK) {
        snprintf(err, errlen, "--compression: %s", cerr);
        return KV_INVALID_ARGUMENT;
    }
    if (!(o->value_ratio > 0 && o->value_ratio <= 1)) {
        snprintf(err, errlen, "--value-ratio: %g is not in (0, 1]", o->value_ratio);
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

static kv_err check_opts(tb_opts *o, const tb_engine **eng, char *err, size_t errlen)
{
    *eng = NULL;
    for (size_t i = 0; i < NENGINES; i++)
        if (!strcmp(engines[i]->name, o->engine_name))
            *eng = engines[i];
    if (!*eng) {
        snprintf(err, errlen,
                 "--engine: '%s' is not hotkv, hotkv-nohotrap, hotkv-nogate, hotkv-kallax, kallax, "
                 "rocksdb-tiering, "
                 "rocksdb-capped, rocksdb-fd or rocksdb-sd (or this build has no RocksDB)",
                 o->engine_name);
        return KV_INVALID_ARGUMENT;
    }
    bool one_volume = !strcmp(o->engine_name, "rocksdb-fd") || !strcmp(o->engine_name, "kallax") ||
                      !strncmp(o->engine_name, "hotkv", 5); /* hotkv: every level on FD */
    if (!o->fast_dir || (!o->slow_dir && !one_volume)) {
        snprintf(err, errlen, "--fast-dir is required, and --slow-dir for %s", o->engine_name);
        return KV_INVALID_ARGUMENT;
    }
    if (!(o->seconds > 0) || o->warmup < 0 || o->shift_at < 0 || o->shift_at >= o->seconds) {
        snprintf(err, errlen, "need --seconds > 0, --warmup >= 0, 0 <= --shift-at < --seconds");
        return KV_INVALID_ARGUMENT;
    }
    if (o->insert_ids_idx == TB_IDS_SHARED && o->workload_idx == TB_D) {
        snprintf(err, errlen, "--insert-ids shared: workload D reads the ids each thread inserted");
        return KV_INVALID_ARGUMENT;
    }
    if (o->load_only && o->no_load) {
        snprintf(err, errlen, "--load-only and --no-load exclude each other");
        return KV_INVALID_ARGUMENT;
    }
    o->workload_name = workload_choices[o->workload_idx];
    o->wl.keys = (uint64_t)o->records;
    o->wl.seed = (uint64_t)o->seed;
    o->wl.scramble = (uint64_t)o->seed * 31 + 7;
    kv_err rv = parse_dist(o, err, errlen);
    if (rv != KV_OK)
        return rv;
    wl_model m; /* validates the distribution's parameters */
    return tb_model(o, 0, &m, err, errlen);
}

static void default_opts(tb_opts *o)
{
    memset(o, 0, sizeof(*o));
    wl_config_default(&o->wl);
    o->engine_name = "hotkv";
    o->fast_mb = 200;
    o->mem_mb = 256;
    o->write_buffer_mb = 64;
    o->records = 200000;
    o->value_size = 1024;
    o->workload_idx = TB_RO;
    o->dist_name = "hotspot5";
    o->threads = 4;
    o->seconds = 10;
    o->warmup = 5;
    o->trace_ops = 1L << 20;
    o->seed = 1;
    o->sync_idx = TB_SYNC_BATCH;
    o->sync_ms = 5;
    o->progress_s = 2;
    o->settle_s = 600;
    o->value_ratio = 1.0;
}

/* Parses argv into o; returns KV_CANCELLED after --help. */
/* The parsed option set: it owns the strings it set, until main frees it. */
static kv_optset opt_set;

static void free_opts(void)
{
    kv_opts_free(&opt_set);
    free((void *)opt_set.opts);
    opt_set.opts = NULL;
}

static kv_err parse_opts(tb_opts *o, int argc, char **argv, const tb_engine **eng)
{
    const kv_opt table[] = {
        {"engine", KV_OPT_STR, &o->engine_name,
         "hotkv|hotkv-nohotrap|hotkv-nogate|hotkv-kallax|kallax|rocksdb-tiering|rocksdb-capped|"
         "rocksdb-fd|rocksdb-sd"},
        {"kallax-blocks", KV_OPT_INT, &o->kallax_blocks,
         "kallax: home blocks of the store (0 = four times the loaded bytes)", NULL, 0, 1L << 40},
        {"fast-dir", KV_OPT_STR, &o->fast_dir, "fast volume directory (FD)"},
        {"slow-dir", KV_OPT_STR, &o->slow_dir, "slow volume directory (SD)"},
        {"fast-mb", KV_OPT_INT, &o->fast_mb, "FD capacity for LSM levels, MiB", NULL, 1, 1L << 24},
        {"mem-mb", KV_OPT_INT, &o->mem_mb,
         "memory budget (hotkv memory tier = RocksDB block cache)", NULL, 1, 1L << 20},
        {"tracker-mb", KV_OPT_INT, &o->tracker_mb,
         "RocksDB's block cache gets --mem-mb + this: hotkv's HotRAP tracker (RALT) memory", NULL,
         0, 1L << 20},
        {"write-buffer-mb", KV_OPT_INT, &o->write_buffer_mb, "memtable / dirty bytes per flush",
         NULL, 1, 4096},
        {"records", KV_OPT_INT, &o->records, "records loaded", NULL, 1, 1L << 34},
        {"value-size", KV_OPT_INT, &o->value_size, "value bytes", NULL, 1, 1L << 20},
        {"workload", KV_OPT_ENUM, &o->workload_idx, "RO|RW|WH|UH|C|A|B|D|F", workload_choices},
        {"dist", KV_OPT_STR, &o->dist_name, "hotspotX|zipfT|uniform (e.g. hotspot5, zipf0.99)"},
        {"threads", KV_OPT_INT, &o->threads, "worker threads (load and run)", NULL, 1, 256},
        {"seconds", KV_OPT_DOUBLE, &o->seconds, "timed phase"},
        {"ops", KV_OPT_INT, &o->run_ops,
         "end the timed phase after this many ops (all threads), or at --seconds if sooner; 0 = "
         "time only (equal work: compare write amplification at equal bytes inserted)",
         NULL, 0, 1L << 40},
        {"insert-ids", KV_OPT_ENUM, &o->insert_ids_idx,
         "thread: each thread inserts its own stride of new ids (records + thread + k x threads); "
         "shared: one counter for every thread, as YCSB's insert sequence (not with D)",
         insert_ids_choices},
        {"warmup", KV_OPT_DOUBLE, &o->warmup, "warm-up before the timed phase"},
        {"shift-at", KV_OPT_DOUBLE, &o->shift_at, "second of the timed phase the hot set moves"},
        {"load-only", KV_OPT_BOOL, &o->load_only, "load, report, exit"},
        {"no-load", KV_OPT_BOOL, &o->no_load, "reuse the records already in the directories"},
        {"sync", KV_OPT_ENUM, &o->sync_idx, "WAL sync: always|batch|none (both engines)",
         sync_choices},
        {"nhc", KV_OPT_ENUM, &o->nhc_idx,
         "hotkv: NHC scheduler (node/nhc) on|off; off = classic caching, every SD read offered "
         "to HotRAP's promotion",
         onoff_choices},
        {"sync-ms", KV_OPT_INT, &o->sync_ms, "batch sync period", NULL, 1, 10000},
        {"trace-ops", KV_OPT_INT, &o->trace_ops, "pre-drawn ops per thread", NULL, 1024, 1L << 28},
        {"seed", KV_OPT_INT, &o->seed, "PRNG seed", NULL, 0, 1L << 62},
        {"settle", KV_OPT_DOUBLE, &o->settle_s,
         "after the load and after the timed phase, wait up to this long for pending "
         "compactions (0 = no wait)"},
        {"progress", KV_OPT_DOUBLE, &o->progress_s, "seconds between progress lines"},
        {"compression", KV_OPT_STR, &o->compression,
         "hotkv and RocksDB: SST block codecs, auto (lz4 on SD levels, none on FD levels) | "
         "none|lz4|zstd | per level from L0 (none,none,none,lz4) | fast=X,slow=Y"},
        {"fast-stop-pct", KV_OPT_INT, &o->fast_stop_pct,
         "hotkv: flushes wait while FD's SSTs exceed this % of --fast-mb and an FD level is due "
         "(kvnode --fast-stop-pct; default 100); rocksdb-capped: puts wait by the same rule",
         NULL, 0, 100000},
        {"value-ratio", KV_OPT_DOUBLE, &o->value_ratio,
         "share of each value's bytes that are random, the rest repeats them (1 = "
         "incompressible; db_bench's compression_ratio 0.5)"},
    };
    kv_opt *copy = malloc(sizeof(table)); /* the set outlives this frame */
    if (!copy)
        return KV_RESOURCE_EXHAUSTED;
    memcpy(copy, table, sizeof(table));
    opt_set = (kv_optset){copy, sizeof(table) / sizeof(table[0]), NULL, "tier_bench", NULL};
    char err[512] = "";
    kv_err rv = kv_opts_parse(&opt_set, argc, argv, NULL, err, sizeof(err));
    if (rv == KV_OK)
        rv = check_opts(o, eng, err, sizeof(err));
    if (rv != KV_OK && rv != KV_CANCELLED)
        fprintf(stderr, "tier_bench: %s\n", err);
    return rv;
}

/* A JSON number, or null for an unknown (negative or NaN) value. */
static void jnum(char *buf, size_t len, double v)
{
    if (isnan(v) || v < 0)
        snprintf(buf, len, "null");
    else
        snprintf(buf, len, "%.6g", v);
}

static void print_result(const tb_opts *o, const tb_engine *eng, void *h, const tb_result *r)
{
    const tb_stats *a = &r->after, *b = &r->before;
    uint64_t mem = a->reads_mem - b->reads_mem, fd = a->reads_fd - b->reads_fd;
    uint64_t sd = a->reads_sd - b->reads_sd, miss = a->reads_miss - b->reads_miss;
    uint64_t tot = mem + fd + sd + miss;
    bool ran = !o->load_only;
    char load[32], ops[32], hit[32], sdb[32], wa[32], prom[32], ret[32], extra[2048] = "";
    jnum(load, sizeof(load), o->no_load ? -1 : r->load_ops_per_s);
    jnum(ops, sizeof(ops), ran ? r->ops_per_s : -1);
    jnum(hit, sizeof(hit), ran && tot ? (double)(mem + fd) / (double)tot : -1);
    jnum(sdb, sizeof(sdb),
         ran && r->gets ? (double)(a->sd_read_bytes - b->sd_read_bytes) / (double)r->gets : -1);
    jnum(wa, sizeof(wa), a->write_amp);
    char lwa[32], swa[32], rwa[32];
    jnum(lwa, sizeof(lwa), r->load_wa);
    jnum(swa, sizeof(swa), r->settled_wa);
    jnum(rwa, sizeof(rwa), ran ? r->run_wa : -1);
    jnum(prom, sizeof(prom), a->have_hotrap ? (double)(a->promoted - b->promoted) : -1);
    jnum(ret, sizeof(ret), a->have_hotrap ? (double)(a->retained - b->retained) : -1);
    size_t off = 0;
    if (r->have_shift) { /* the target: the end rate >= 90% of the steady one */
        char steady[32], end[32], ratio[32], rec[32];
        jnum(steady, sizeof(steady), r->shift_steady);
        jnum(end, sizeof(end), r->shift_end);
        jnum(ratio, sizeof(ratio),
             r->shift_steady > 0 && r->shift_end >= 0 ? r->shift_end / r->shift_steady : -1);
        jnum(rec, sizeof(rec), r->shift_recovery_s);
        off = (size_t)snprintf(extra, sizeof(extra),
                               ",\"shift_at\":%.6g,\"fd_hit_before_shift\":%s,\"fd_hit_end\":%s,"
                               "\"shift_recovery\":%s,\"recovery_s\":%s",
                               o->shift_at, steady, end, ratio, rec);
    }
    if (r->insert_id_max)
        off += (size_t)snprintf(
            extra + off, sizeof(extra) - off, ",\"insert_id_max\":%llu,\"inserted\":%llu",
            (unsigned long long)r->insert_id_max, (unsigned long long)r->inserted);
    if (r->fd_dir_peak_bytes)
        off += (size_t)snprintf(extra + off, sizeof(extra) - off, ",\"fd_dir_peak_bytes\":%llu",
                                (unsigned long long)r->fd_dir_peak_bytes);
    if (a->have_vol_bytes)
        off += (size_t)snprintf(
            extra + off, sizeof(extra) - off, ",\"fd_sst_bytes\":%llu,\"sd_sst_bytes\":%llu",
            (unsigned long long)a->fd_sst_bytes, (unsigned long long)a->sd_sst_bytes);
    char imem[32], imem_key[32], avg[32], cpu[32];
    jnum(imem, sizeof(imem), a->have_index_mem ? (double)a->index_mem : -1);
    jnum(imem_key, sizeof(imem_key),
         a->have_index_mem ? (double)a->index_mem / (double)o->records : -1);
    jnum(avg, sizeof(avg), ran ? r->avg_get_us : -1);
    jnum(cpu, sizeof(cpu), ran ? r->cpu_us_per_op : -1);
    off += (size_t)snprintf(extra + off, sizeof(extra) - off,
                            ",\"avg_get_us\":%s,\"cpu_us_per_op\":%s,\"index_mem_bytes\":%s,"
                            "\"index_mem_per_key\":%s",
                            avg, cpu, imem, imem_key);
    eng->json_extra(h, extra + off, sizeof(extra) - off);
    printf(
        "{\"engine\":\"%s\",\"workload\":\"%s\",\"dist\":\"%s\",\"records\":%ld,"
        "\"value_size\":%ld,\"threads\":%ld,\"fast_mb\":%ld,\"mem_mb\":%ld,\"write_buffer_mb\":%ld,"
        "\"tracker_mb\":%ld,\"sync\":\"%s\",\"compression\":\"%s\",\"value_ratio\":%.3g,"
        "\"load_s\":%.3f,\"load_ops_per_s\":%s,\"settle_s\":%.1f,\"settled\":%s,\"seconds\":%."
        "3f,\"ops\":%llu,\"ops_per_s\":%s,"
        "\"gets\":%llu,\"found_ratio\":%.6g,\"p50_get_us\":%.2f,\"p99_get_us\":%.2f,"
        "\"p999_get_us\":%.2f,\"p50_put_us\":%.2f,\"p99_put_us\":%.2f,"
        "\"reads_mem\":%llu,\"reads_fd\":%llu,\"reads_sd\":%llu,\"reads_miss\":%llu,"
        "\"fd_hit_rate\":%s,\"sd_read_bytes_per_get\":%s,\"write_amp\":%s,\"load_write_amp\":%s,"
        "\"settled_write_amp\":%s,\"run_write_amp\":%s,\"run_settle_s\":%.1f,\"run_settled\":%s,"
        "\"insert_ids\":\"%s\",\"promoted\":%s,"
        "\"retained\":%s%s}\n",
        o->engine_name, o->workload_name, o->dist_name, o->records, o->value_size, o->threads,
        o->fast_mb, o->mem_mb, o->write_buffer_mb, o->tracker_mb, sync_choices[o->sync_idx],
        o->compression ? o->compression : "auto", o->value_ratio, r->load_s, load, r->settle_s,
        r->settled ? "true" : "false", r->run_s, (unsigned long long)r->ops, ops,
        (unsigned long long)r->gets, r->gets ? (double)r->gets_found / (double)r->gets : 0.0,
        r->p50_get_us, r->p99_get_us, r->p999_get_us, r->p50_put_us, r->p99_put_us,
        (unsigned long long)mem, (unsigned long long)fd, (unsigned long long)sd,
        (unsigned long long)miss, hit, sdb, wa, lwa, swa, rwa, r->run_settle_s,
        r->run_settled ? "true" : "false", insert_ids_choices[o->insert_ids_idx], prom, ret, extra);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    tb_opts o;
    const tb_engine *eng = NULL;
    default_opts(&o);
    kv_err rv = parse_opts(&o, argc, argv, &eng);
    if (rv != KV_OK) {
        free_opts(); /* the option strings point into o: free them before main returns */
        return rv == KV_CANCELLED ? 0 : 2;
    }
    char err[512] = "";
    void *h = NULL;
    if ((rv = eng->open(&o, &h, err, sizeof(err))) != KV_OK) {
        fprintf(stderr, "tier_bench: %s: open: %s: %s\n", o.engine_name, kv_strerror(rv), err);
        free_opts();
        return 1;
    }
    tb_result res;
    eng->thread_begin(h); /* the main thread reads stats and closes */
    rv = tb_run(&o, eng, h, &res);
    if (rv == KV_OK)
        print_result(&o, eng, h, &res);
    eng->close(h);
    eng->thread_end(h);
    free_opts();
    return rv == KV_OK ? 0 : 1;
}
