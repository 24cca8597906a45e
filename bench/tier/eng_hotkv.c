/* SPDX-License-Identifier: MIT */
/*
 * tier_bench adapter for hotkv's storage engine (node/engine.h): the memory
 * tier (HotRing) over the LSM whose upper levels live on --fast-dir and lower
 * levels on --slow-dir. Point reads per serving tier come from
 * engine_get_stats(); write amplification and the slow volume's read bytes
 * from the engine's LSM statistics (node_engine_statlist: lsm.write_amp,
 * slow.read_bytes), parsed by name so the engine exposes nothing new.
 *
 * "hotkv" and "hotkv-nohotrap" map to the engine's HotRAP switch
 * (engine_opts.no_hotrap: retention and promotion on / off). promoted and
 * retained are the LSM's records installed on FD by the promotion buffer
 * and kept on FD by compactions into SD (hotrap.promoted_records,
 * hotrap.retained_records; both stay 0 with HotRAP off). "hotkv-nogate" is
 * HotRAP without its promotion gate (engine_opts.no_promo_gate; promote.c).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/tier/tier_bench.h"
#include "node/engine.h"
#include "node/node.h" /* node_engine_statlist */
#include "proto/statlist.h"

typedef struct hk {
    engine *e;
    bool kallax;             /* engine_opts.kind = ENGINE_KALLAX ("hotkv-kallax") */
    bool hotrap;             /* engine_opts.no_hotrap = !hotrap */
    _Atomic uint64_t stalls; /* writes retried on back-pressure (1 ms each) */
    char levels[512];
    char wa_parts[96];       /* write amplification by source, at the last stats call */
    char hotrap_state[1536]; /* JSON members: HotRAP counters at the last stats call */
    char fd_state[256];      /* JSON members: FD bytes and flush stalls, likewise */
} hk;

static kv_err hk_open_mode(const tb_opts *o, void **h, bool hotrap, bool gate, bool kallax,
                           char *err, size_t errlen)
{
    hk *k = calloc(1, sizeof(*k));
    if (!k)
        return KV_RESOURCE_EXHAUSTED;
    engine_opts eo;
    memset(&eo, 0, sizeof(eo));
    eo.fast_dir = o->fast_dir;
    eo.slow_dir = o->slow_dir;
    eo.fast_mb = (uint64_t)o->fast_mb;
    eo.fast_stop_pct = (unsigned)o->fast_stop_pct;
    /* Equal memory: RocksDB gets a block cache of --mem-mb plus its memtable
     * (--write-buffer-mb, more while one is flushed) beside it; hotkv's
     * memory tier holds both its cache and its dirty records (the
     * memtable), so its budget is the sum. */
    eo.mem_mb = (size_t)(o->mem_mb + o->write_buffer_mb);
    eo.write_buffer_mb = (size_t)o->write_buffer_mb;
    eo.sync = o->sync_idx == TB_SYNC_ALWAYS  ? ENGINE_SYNC_ALWAYS
              : o->sync_idx == TB_SYNC_BATCH ? ENGINE_SYNC_BATCH
                                             : ENGINE_SYNC_NONE;
    eo.sync_ms = (unsigned)o->sync_ms;
    k->hotrap = hotrap;
    eo.no_hotrap = !hotrap;
    eo.no_promo_gate = !gate;
    eo.compression = o->compression;
    nhc_opts no;
    nhc_opts_default(&no);
    no.enable = o->nhc_idx == 0;
    eo.nhc = &no;
    if ((k->kallax = kallax)) {
        eo.kind = ENGINE_KALLAX;
        eo.kallax_blocks = tb_kallax_blocks(o);
    }
    kv_err rv = engine_open(&k->e, &eo, err, errlen);
    if (rv != KV_OK) {
        free(k);
        return rv;
    }
    *h = k;
    return KV_OK;
}

static kv_err hk_open(const tb_opts *o, void **h, char *err, size_t errlen)
{
    return hk_open_mode(o, h, true, true, false, err, errlen);
}

static kv_err hk_open_nogate(const tb_opts *o, void **h, char *err, size_t errlen)
{
    return hk_open_mode(o, h, true, false, false, err, errlen);
}

static kv_err hk_open_nohotrap(const tb_opts *o, void **h, char *err, size_t errlen)
{
    return hk_open_mode(o, h, false, true, false, err, errlen);
}

static kv_err hk_open_kallax(const tb_opts *o, void **h, char *err, size_t errlen)
{
    return hk_open_mode(o, h, false, true, true, err, errlen);
}

/* The per-level layout and compaction stats (lsm.L*) to stderr, to set
 * beside RocksDB's (eng_rocksdb.c prints its cfstats at close). */
static void hk_dump_levels(hk *k)
{
    rpc_statlist l;
    node_engine_statlist(k->e, &l);
    for (size_t i = 0; i < l.n; i++)
        if (strncmp(l.items[i].name, "lsm.", 4) == 0)
            fprintf(stderr, "tier_bench: hotkv: %s %s\n", l.items[i].name, l.items[i].value);
    rpc_stats_free(&l);
}

static void hk_close(void *h)
{
    hk *k = h;
    if (!k)
        return;
    hk_dump_levels(k);
    engine_close(k->e); /* the caller's thread is registered */
    free(k);
}

static void hk_thread_begin(void *h)
{
    engine_thread_register();
}

static void hk_thread_end(void *h)
{
    engine_thread_unregister();
}

static void hk_noop(void *h) {}

/* RESOURCE_EXHAUSTED is the engine's back-pressure when flushing is behind:
 * a client waits and retries (1 ms steps, up to 60 s, after which a full
 * volume is the likelier cause and the error stands). */
static kv_err hk_put(void *h, const void *key, size_t klen, const void *val, size_t vlen)
{
    hk *k = h;
    engine_write w = {.key = key, .klen = klen, .val = val, .vlen = vlen};
    engine_result r;
    char err[256];
    kv_err rv;
    for (int tries = 0;; tries++) {
        rv = engine_write_one(k->e, &w, &r, err, sizeof(err));
        if (rv != KV_RESOURCE_EXHAUSTED || tries == 60000)
            break;
        atomic_fetch_add_explicit(&k->stalls, 1, memory_order_relaxed);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (rv != KV_OK)
        fprintf(stderr, "tier_bench: hotkv: write: %s\n", err);
    return rv;
}

static kv_err hk_get(void *h, const void *key, size_t klen, bool *found)
{
    hk *k = h;
    engine_result r;
    kv_err rv = engine_get(k->e, key, klen, &r);
    if (rv != KV_OK)
        return rv;
    *found = r.found;
    if (r.found)
        free(r.val);
    return KV_OK;
}

static const char *stat_value(const rpc_statlist *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (!strcmp(l->items[i].name, name))
            return l->items[i].value;
    return NULL;
}

/* Keeps "L<n>=<files>/<MiB>/<fast|slow>" of every non-empty level and sums
 * the levels' bytes per volume. */
static void hk_levels(hk *k, const rpc_statlist *l, tb_stats *out)
{
    size_t off = 0;
    k->levels[0] = '\0';
    for (size_t i = 0; i < l->n; i++) {
        unsigned long long files, bytes, target;
        char vol[8];
        const char *n = l->items[i].name;
        if (strncmp(n, "lsm.L", 5) != 0 ||
            sscanf(l->items[i].value, "files=%llu bytes=%llu target=%llu volume=%7s", &files,
                   &bytes, &target, vol) != 4 ||
            files == 0 || off >= sizeof(k->levels))
            continue;
        out->have_vol_bytes = true;
        *(strcmp(vol, "slow") == 0 ? &out->sd_sst_bytes : &out->fd_sst_bytes) += bytes;
        off += (size_t)snprintf(k->levels + off, sizeof(k->levels) - off, "%s%s=%llu/%.0f/%s",
                                off ? " " : "", n + 4, files, (double)bytes / 1048576.0, vol);
    }
}

/* Keeps HotRAP's own state at the last stats call, for the result line. */
static void hk_hotrap(hk *k, const rpc_statlist *l)
{
    static const char *const names[] = {"promo_dropped",    "promo_drop_dup",   "promo_drop_cold",
                                        "promo_drop_newer", "promo_drop_on_fd", "promo_drop_full",
                                        "promo_drop_gated", "read_lift",        "checker_backlog",
                                        "ralt_entries",     "ralt_stable",      "ralt_hot_bytes",
                                        "hot_set_limit",    "ralt_file_bytes",  "ralt_mem_bytes",
                                        "ralt_errors",      "twins_dropped",    "twin_jobs",
                                        "ralt_merges",      "ralt_full_merges", "ralt_merge_bytes"};
    size_t off = 0;
    k->hotrap_state[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char full[64];
        snprintf(full, sizeof(full), "hotrap.%s", names[i]);
        const char *v = stat_value(l, full);
        if (v && off < sizeof(k->hotrap_state))
            off += (size_t)snprintf(k->hotrap_state + off, sizeof(k->hotrap_state) - off,
                                    "%s\"%s\":%s", off ? "," : "", names[i], v);
    }
}

static void hk_stats(void *h, tb_stats *out)
{
    hk *k = h;
    engine_stats s;
    rpc_statlist l;
    memset(out, 0, sizeof(*out));
    engine_get_stats(k->e, &s);
    out->reads_mem = s.reads_mem;
    out->reads_fd = s.reads_fd;
    out->reads_sd = s.reads_sd;
    out->reads_miss = s.reads_miss;
    node_engine_statlist(k->e, &l);
    const char *sdb = stat_value(&l, "slow.read_bytes"), *user = stat_value(&l, "lsm.user_bytes");
    out->sd_read_bytes = sdb ? strtoull(sdb, NULL, 10) : 0;
    const char *prom = stat_value(&l, "hotrap.promoted_records");
    const char *ret = stat_value(&l, "hotrap.retained_records");
    out->have_hotrap = prom && ret;
    out->promoted = prom ? strtoull(prom, NULL, 10) : 0;
    const char *imem = stat_value(&l, k->kallax ? "kallax.index_mem_bytes" : "lsm.index_mem_bytes");
    out->have_index_mem = imem != NULL;
    out->index_mem = imem ? strtoull(imem, NULL, 10) : 0;
    out->retained = ret ? strtoull(ret, NULL, 10) : 0;
    if (k->kallax) { /* kallax.*: the WAL, the journal and the blocks rewritten in place */
        const char *kw = stat_value(&l, "kallax.wal_bytes"),
                   *kj = stat_value(&l, "kallax.journal_bytes");
        const char *kb = stat_value(&l, "kallax.block_writes"),
                   *ku = stat_value(&l, "kallax.user_bytes");
        if (ku && kw && kj && kb) {
            out->written_bytes =
                strtoull(kw, NULL, 10) + strtoull(kj, NULL, 10) + strtoull(kb, NULL, 10) * 4096u;
            out->user_bytes = strtoull(ku, NULL, 10);
        }
    } else { /* lsm.write_amp's two sides: WAL + flush + compaction bytes, user bytes */
        const char *wb = stat_value(&l, "lsm.wal_bytes"), *fl = stat_value(&l, "lsm.flush_bytes");
        const char *cw = stat_value(&l, "lsm.compact_write_bytes");
        if (wb && fl && cw && user) {
            out->written_bytes =
                strtoull(wb, NULL, 10) + strtoull(fl, NULL, 10) + strtoull(cw, NULL, 10);
            out->user_bytes = strtoull(user, NULL, 10);
        }
    }
    /* unknown (null) when nothing was written since open (--no-load reads) */
    out->write_amp = out->user_bytes ? (double)out->written_bytes / (double)out->user_bytes : -1.0;
    hk_hotrap(k, &l);
    hk_levels(k, &l, out);
    const char *fb = stat_value(&l, "lsm.fast_bytes"), *fp = stat_value(&l, "lsm.fast_peak_bytes");
    const char *sl0 = stat_value(&l, "lsm.flush_stalls_l0");
    const char *sfd = stat_value(&l, "lsm.flush_stalls_fast");
    const char *ss = stat_value(&l, "lsm.flush_stall_s");
    if (fb && fp && sl0 && sfd && ss)
        snprintf(k->fd_state, sizeof(k->fd_state),
                 ",\"fd_bytes\":%s,\"fd_peak_bytes\":%s,\"flush_stalls_l0\":%s,"
                 "\"flush_stalls_fd\":%s,\"flush_stall_s\":%s",
                 fb, fp, sl0, sfd, ss);
    const char *wal = stat_value(&l, "lsm.wal_bytes"), *fl = stat_value(&l, "lsm.flush_bytes");
    const char *co = stat_value(&l, "lsm.compact_write_bytes");
    const char *pb = stat_value(&l, "hotrap.promoted_bytes");
    double ub = user ? strtod(user, NULL) : 0;
    if (ub > 0 && wal && fl && co)
        snprintf(k->wa_parts, sizeof(k->wa_parts), "wal=%.2f flush=%.2f compact=%.2f promote=%.2f",
                 strtod(wal, NULL) / ub, strtod(fl, NULL) / ub, strtod(co, NULL) / ub,
                 pb ? strtod(pb, NULL) / ub : 0.0);
    rpc_stats_free(&l);
}

/* lsm's compaction triggers: L0 at 4 files (its default l0_trigger) or at
 * its byte trigger (the L0 "target", the room FD has for it: L1's target
 * to 4 times it), a deeper level above its target. */
static bool hk_settled(void *h)
{
    hk *k = h;
    if (k->kallax) { /* no compactions: settled once the write buffer is flushed */
        engine_stats s;
        engine_get_stats(k->e, &s);
        return s.dirty_bytes == 0 || engine_flush(k->e) == KV_OK;
    }
    rpc_statlist l;
    bool ok = true;
    node_engine_statlist(k->e, &l);
    for (size_t i = 0; i < l.n; i++) {
        unsigned long long files, bytes, target;
        int level;
        if (sscanf(l.items[i].name, "lsm.L%d", &level) != 1 ||
            sscanf(l.items[i].value, "files=%llu bytes=%llu target=%llu", &files, &bytes,
                   &target) != 3)
            continue;
        if ((level == 0 && (files >= 4 || (target && bytes >= target))) ||
            (level > 0 && target && bytes > target))
            ok = false;
    }
    rpc_stats_free(&l);
    return ok;
}

static void hk_json_extra(void *h, char *buf, size_t len)
{
    hk *k = h;
    engine_stats es;
    engine_get_stats(k->e, &es);
    snprintf(buf, len,
             ",\"hotrap_available\":%s,\"hotrap_requested\":%s,\"write_stall_ms\":%llu,"
             "\"write_waits\":%llu,\"write_wait_s\":%.3f,"
             "\"levels\":\"%s\",\"wa_parts\":\"%s\",\"hotrap_state\":{%s}%s,"
             "\"note\":\"sd_read_bytes counts every slow-volume read (gets and compactions)\"",
             k->kallax ? "false" : "true", k->hotrap ? "true" : "false",
             (unsigned long long)atomic_load(&k->stalls), (unsigned long long)es.write_waits,
             (double)es.write_wait_ns / 1e9, k->levels, k->wa_parts, k->hotrap_state, k->fd_state);
}

const tb_engine tb_hotkv_engine = {
    "hotkv", hk_open, hk_close, hk_thread_begin, hk_thread_end, hk_noop,
    hk_noop, hk_put,  hk_get,   hk_stats,        hk_settled,    hk_json_extra,
};

/* The node's engine over kallax (kvnode --engine kallax): HotRing over the
 * table-less hash store on --fast-dir, HotRAP and NHC off. */
const tb_engine tb_hotkv_kallax_engine = {
    "hotkv-kallax", hk_open_kallax, hk_close, hk_thread_begin, hk_thread_end, hk_noop,
    hk_noop,        hk_put,         hk_get,   hk_stats,        hk_settled,    hk_json_extra,
};

const tb_engine tb_hotkv_nohotrap_engine = {
    "hotkv-nohotrap", hk_open_nohotrap, hk_close, hk_thread_begin, hk_thread_end, hk_noop,
    hk_noop,          hk_put,           hk_get,   hk_stats,        hk_settled,    hk_json_extra,
};

const tb_engine tb_hotkv_nogate_engine = {
    "hotkv-nogate", hk_open_nogate, hk_close, hk_thread_begin, hk_thread_end, hk_noop,
    hk_noop,        hk_put,         hk_get,   hk_stats,        hk_settled,    hk_json_extra,
};
