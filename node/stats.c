/* SPDX-License-Identifier: MIT */
/*
 * kvnode's statistics: one typed list (proto/stats.h) feeds admin.Stats and
 * /metrics. The admin.Stats names are a stable interface (kvctl status and
 * the tests read them), so add names, never rename them. Prometheus names:
 * hotkv_node_*, base units, _total counters (docs/operations.md lists them).
 *
 * Also the node's HTTP listener (--http-listen): /metrics (text format
 * 0.0.4) and /health (200 when serving, 503 otherwise, a one-line JSON
 * reason).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/kallax/kallax.h"
#include "node/lsm/lsm.h"
#include "node/nhc/nhc.h"
#include "node/node.h"
#include "proto/prom.h"
#include "proto/statlist.h"

#define SERIES_PER_STAT 10 /* points per nhc.series.N value (< 512 bytes) */

/* An integer gauge whose admin.Stats value is in one unit and whose
 * /metrics value is that times scale (ms -> seconds: 1e-3). */
static void gauge_scaled(kv_stats *l, const char *key, const char *metric, const char *labels,
                         const char *help, uint64_t v, double scale)
{
    kv_stats_add(l, &(kv_stat){.kind = KV_STAT_GAUGE,
                               .key = (char *)key,
                               .metric = (char *)metric,
                               .labels = (char *)labels,
                               .help = help,
                               .u = v,
                               .scale = scale});
}

static void vol_stats(kv_stats *l, const char *vol, const lsm_vol_stats *v)
{
    char key[64], lab[64];
    kv_stat_label(lab, sizeof(lab), "volume", vol);
#define VOL_KEY(field) (snprintf(key, sizeof(key), "%s." #field, vol), key)
    kv_stat_counter(l, VOL_KEY(reads), "hotkv_node_volume_reads_total", lab,
                    "Read operations issued to a volume.", v->reads);
    kv_stat_counter(l, VOL_KEY(read_bytes), "hotkv_node_volume_read_bytes_total", lab,
                    "Bytes read from a volume.", v->read_bytes);
    kv_stat_counter(l, VOL_KEY(writes), "hotkv_node_volume_writes_total", lab,
                    "Write operations issued to a volume.", v->writes);
    kv_stat_counter(l, VOL_KEY(write_bytes), "hotkv_node_volume_write_bytes_total", lab,
                    "Bytes written to a volume.", v->write_bytes);
    kv_stat_counter(l, VOL_KEY(fsyncs), "hotkv_node_volume_fsyncs_total", lab,
                    "fsync calls on a volume.", v->fsyncs);
    gauge_scaled(l, VOL_KEY(read_lat_ewma_ns), "hotkv_node_volume_read_latency_seconds", lab,
                 "Moving average of a volume's read latency.", v->read_lat_ewma_ns, 1e-9);
    gauge_scaled(l, VOL_KEY(write_lat_ewma_ns), "hotkv_node_volume_write_latency_seconds", lab,
                 "Moving average of a volume's write latency.", v->write_lat_ewma_ns, 1e-9);
#undef VOL_KEY
}

/* kallax.* (and fast.* for its one volume, hotrap off). */
static void kallax_stats_add(engine *e, kv_stats *l)
{
    kallax_stats s;
    if (engine_kallax_get_stats(e, &s) != KV_OK)
        return;
    kv_stat_text(l, "hotrap", "%s", "off (kallax)");
    kv_stat_gauge(l, NULL, "hotkv_node_hotrap_enabled", NULL, "1 when HotRAP is on.", 0);
    kv_stat_gauge(l, "kallax.blocks", "hotkv_node_kallax_blocks", NULL,
                  "kallax home blocks (4 KiB).", s.blocks);
    kv_stat_gauge(l, "kallax.probe", NULL, NULL, NULL, s.probe);
    kv_stat_gauge(l, "kallax.records", "hotkv_node_kallax_records", NULL,
                  "Records in the kallax store.", s.records);
    kv_stat_gauge(l, "kallax.tombstones", "hotkv_node_kallax_tombstones", NULL,
                  "Tombstones in the kallax store.", s.tombstones);
    kv_stat_gauge(l, "kallax.used_bytes", "hotkv_node_kallax_used_bytes", NULL,
                  "Bytes used in kallax's blocks.", s.used_bytes);
    kv_stat_gauge(l, "kallax.spilled", NULL, NULL, NULL, s.spilled);
    kv_stat_gauge(l, "kallax.extent_pages", NULL, NULL, NULL, s.extent_pages);
    kv_stat_gauge(l, "kallax.extent_pages_used", NULL, NULL, NULL, s.extent_pages_used);
    kv_stat_counter(l, "kallax.block_reads", "hotkv_node_kallax_block_reads_total", NULL,
                    "kallax block reads.", s.block_reads);
    kv_stat_counter(l, "kallax.spill_reads", NULL, NULL, NULL, s.spill_reads);
    kv_stat_counter(l, "kallax.block_writes", "hotkv_node_kallax_block_writes_total", NULL,
                    "kallax block writes.", s.block_writes);
    kv_stat_counter(l, "kallax.journal_bytes", "hotkv_node_kallax_journal_bytes_total", NULL,
                    "Bytes written to kallax's journal.", s.journal_bytes);
    kv_stat_counter(l, "kallax.flushes", "hotkv_node_kallax_flushes_total", NULL, "kallax flushes.",
                    s.flushes);
    kv_stat_counter(l, "kallax.moves", NULL, NULL, NULL, s.moves);
    kv_stat_counter(l, "kallax.corrupt_blocks", "hotkv_node_kallax_corrupt_blocks_total", NULL,
                    "Corrupt kallax blocks met.", s.corrupt_blocks);
    kv_stat_counter(l, "kallax.repaired", NULL, NULL, NULL, s.repaired);
    kv_stat_counter(l, "kallax.retries", NULL, NULL, NULL, s.retries);
    kv_stat_gauge(l, "kallax.flushed_seqno", NULL, NULL, NULL, s.flushed_seqno);
    kv_stat_counter(l, "kallax.wal_bytes", "hotkv_node_wal_written_bytes_total", NULL,
                    "Bytes appended to the write-ahead log.", s.wal_bytes);
    kv_stat_counter(l, "kallax.wal_fsyncs", "hotkv_node_wal_fsyncs_total", NULL,
                    "fsync calls on the write-ahead log.", s.wal_fsyncs);
    kv_stat_counter(l, "kallax.user_bytes", "hotkv_node_user_written_bytes_total", NULL,
                    "Key and value bytes of the writes applied.", s.user_bytes);
    kv_stat_gauge(l, "kallax.index_mem_bytes", NULL, NULL, NULL, s.index_mem_bytes);
    vol_stats(l, "fast", &s.vol);
    kv_stat_gaugef(l, "kallax.load", 4, "hotkv_node_kallax_load", NULL,
                   "kallax's used bytes over its blocks' payload.", s.load, 1);
    kv_stat_text(l, "kallax.io_uring", "%s", s.io_uring ? "on" : "off (pread fallback)");
}

void node_engine_store_stats(engine *e, kv_stats *l)
{
    lsm_stats s;
    if (engine_lsm_get_stats(e, &s) != KV_OK) {
        kallax_stats_add(e, l);
        return;
    }
    for (int i = 0; i < LSM_MAX_LEVELS; i++) {
        char key[64], lab[64];
        const lsm_level_stats *v = &s.levels[i];
        if (!v->files && i > 1)
            continue;
        const char *vol = v->volume == LSM_TIER_SD ? "slow" : "fast";
        snprintf(key, sizeof(key), "lsm.L%d", i);
        kv_stat_text(l, key,
                     "files=%llu bytes=%llu target=%llu volume=%s codec=%s compact_read_above=%llu "
                     "compact_read_level=%llu compact_written=%llu compact_jobs=%llu moved=%llu "
                     "compact_s=%.3f",
                     (unsigned long long)v->files, (unsigned long long)v->bytes,
                     (unsigned long long)v->target_bytes, vol, lsm_compression_name(v->codec),
                     (unsigned long long)v->comp_read_above, (unsigned long long)v->comp_read_level,
                     (unsigned long long)v->comp_written, (unsigned long long)v->comp_jobs,
                     (unsigned long long)v->comp_moved, (double)v->comp_ns / 1e9);
        snprintf(lab, sizeof(lab), "level=\"%d\",volume=\"%s\"", i, vol);
        kv_stat_gauge(l, NULL, "hotkv_node_lsm_level_files", lab, "SST files in an LSM level.",
                      v->files);
        kv_stat_gauge(l, NULL, "hotkv_node_lsm_level_bytes", lab, "Bytes of an LSM level.",
                      v->bytes);
        kv_stat_gauge(l, NULL, "hotkv_node_lsm_level_target_bytes", lab,
                      "Target size of an LSM level.", v->target_bytes);
        kv_stat_counter(l, NULL, "hotkv_node_lsm_level_compaction_written_bytes_total", lab,
                        "Bytes compactions wrote into an LSM level.", v->comp_written);
    }
    kv_stat_gaugef(l, "lsm.write_amp", 3, "hotkv_node_write_amplification", NULL,
                   "(WAL + flush + compaction bytes written) / user bytes written.", s.write_amp,
                   1);
    kv_stat_counter(l, "lsm.user_bytes", "hotkv_node_user_written_bytes_total", NULL,
                    "Key and value bytes of the writes applied.", s.user_bytes);
    kv_stat_counter(l, "lsm.wal_bytes", "hotkv_node_wal_written_bytes_total", NULL,
                    "Bytes appended to the write-ahead log.", s.wal_bytes);
    kv_stat_counter(l, "lsm.wal_fsyncs", "hotkv_node_wal_fsyncs_total", NULL,
                    "fsync calls on the write-ahead log.", s.wal_fsyncs);
    kv_stat_counter(l, "lsm.flushes", "hotkv_node_lsm_flushes_total", NULL,
                    "Memory-tier flushes to L0.", s.flushes);
    kv_stat_counter(l, "lsm.flush_bytes", "hotkv_node_flush_written_bytes_total", NULL,
                    "Bytes written by flushes.", s.flush_bytes);
    kv_stat_counter(l, "lsm.flush_stalls_l0", "hotkv_node_flush_stalls_total", "reason=\"l0\"",
                    "Flushes that waited for compaction.", s.stalls_l0);
    kv_stat_counter(l, "lsm.flush_stalls_fast", "hotkv_node_flush_stalls_total",
                    "reason=\"fast_volume\"", "Flushes that waited for compaction.", s.stalls_fd);
    kv_stat_counter(l, "lsm.flush_stalls_space", "hotkv_node_flush_stalls_total",
                    "reason=\"fast_space\"", "Flushes that waited for compaction.", s.stalls_space);
    kv_stat_gaugef(l, "lsm.flush_stall_s", 3, "hotkv_node_flush_stall_seconds_total", NULL,
                   "Seconds flushes waited for compaction.", (double)s.stall_ns / 1e9, 1);
    kv_stat_gauge(l, "lsm.fast_bytes", "hotkv_node_fast_volume_sst_bytes", NULL,
                  "SST bytes on the fast volume.", s.fd_bytes);
    kv_stat_gauge(l, "lsm.fast_peak_bytes", "hotkv_node_fast_volume_sst_peak_bytes", NULL,
                  "The most SST bytes the fast volume held since the node started.",
                  s.fd_peak_bytes);
    kv_stat_gauge(l, "lsm.fast_free_bytes", "hotkv_node_fast_volume_free_bytes", NULL,
                  "Free bytes on the fast volume's filesystem, as compaction last saw them.",
                  s.fd_free_bytes);
    kv_stat_counter(l, "lsm.compaction_space_waits", "hotkv_node_compaction_space_waits_total",
                    NULL,
                    "Compaction picks that deferred or shrank a job for room on the fast volume.",
                    s.space_waits);
    kv_stat_counter(l, "lsm.compactions", "hotkv_node_compactions_total", NULL,
                    "Compactions completed.", s.compactions);
    kv_stat_counter(l, "lsm.l0_moves_past", "hotkv_node_l0_moves_past_total", NULL,
                    "L0 files moved to L1 past an older L0 file that stayed (promoted copies, or "
                    "keys a newer file overwrites).",
                    s.l0_moves_past);
    kv_stat_counter(l, "lsm.compact_read_bytes", "hotkv_node_compaction_read_bytes_total", NULL,
                    "Bytes read by compactions.", s.compact_read_bytes);
    kv_stat_counter(l, "lsm.compact_write_bytes", "hotkv_node_compaction_written_bytes_total", NULL,
                    "Bytes written by compactions.", s.compact_write_bytes);
    kv_stat_counter(l, "lsm.write_check_calls", "hotkv_node_write_lookups_total", NULL,
                    "Version lookups before writes (last-writer-wins, conditions).", s.check_calls);
    kv_stat_counter(l, "lsm.write_check_blocks_fast", "hotkv_node_write_lookup_blocks_total",
                    "volume=\"fast\"", "Blocks the write lookups read.", s.check_blocks_fd);
    kv_stat_counter(l, "lsm.write_check_blocks_slow", "hotkv_node_write_lookup_blocks_total",
                    "volume=\"slow\"", "Blocks the write lookups read.", s.check_blocks_sd);
    kv_stat_counter(l, "lsm.compress_in_bytes", "hotkv_node_compression_in_bytes_total", NULL,
                    "Block bytes given to the compressor.", s.compress_in_bytes);
    kv_stat_counter(l, "lsm.compress_out_bytes", "hotkv_node_compression_out_bytes_total", NULL,
                    "Block bytes the compressor wrote.", s.compress_out_bytes);
    kv_stat_text(l, "lsm.io_uring", "%s", s.io_uring ? "on" : "off (pread fallback)");
    kv_stat_gauge(l, NULL, "hotkv_node_io_uring", NULL, "1 when I/O goes through io_uring.",
                  s.io_uring);
    kv_stat_gauge(l, "lsm.index_mem_bytes", "hotkv_node_sst_index_memory_bytes", NULL,
                  "Memory of the open SSTs' indexes, blooms and block tables.", s.index_mem_bytes);
    kv_stat_gauge(l, "lsm.old_format_files", "hotkv_node_sst_old_format_files", NULL,
                  "Live SSTs in an older format than the one written now (compaction rewrites "
                  "them).",
                  s.old_format_files);
    uint64_t lsm_reads = s.reads_fd + s.reads_sd;
    kv_stat_text(l, "hotrap", "%s", s.hotrap ? "on" : "off");
    kv_stat_gauge(l, NULL, "hotkv_node_hotrap_enabled", NULL, "1 when HotRAP is on.", s.hotrap);
    kv_stat_gaugef(l, "hotrap.fd_hit_rate", 4, NULL, NULL, NULL,
                   lsm_reads ? (double)s.reads_fd / (double)lsm_reads : 0.0, 1);
    kv_stat_counter(l, "hotrap.promoted_records", "hotkv_node_hotrap_promoted_records_total", NULL,
                    "Records HotRAP promoted from the slow volume to the fast one.",
                    s.promoted_recs);
    kv_stat_counter(l, "hotrap.promoted_bytes", "hotkv_node_hotrap_promoted_bytes_total", NULL,
                    "Bytes HotRAP promoted.", s.promoted_bytes);
    kv_stat_counter(l, "hotrap.retained_records", "hotkv_node_hotrap_retained_records_total", NULL,
                    "Hot records compaction kept on the fast volume.", s.retained_recs);
    kv_stat_counter(l, "hotrap.retained_bytes", "hotkv_node_hotrap_retained_bytes_total", NULL,
                    "Bytes of hot records kept on the fast volume.", s.retained_bytes);
    kv_stat_counter(l, "hotrap.twins_dropped", "hotkv_node_hotrap_copies_dropped_total", NULL,
                    "Promoted copies compaction into the slow volume dropped (their "
                    "originals are there).",
                    s.twins_dropped);
    kv_stat_counter(l, "hotrap.twins_dropped_bytes", "hotkv_node_hotrap_copies_dropped_bytes_total",
                    NULL, "Bytes of promoted copies dropped instead of written down.",
                    s.twins_dropped_bytes);
    kv_stat_counter(l, "hotrap.twin_jobs", "hotkv_node_hotrap_copy_only_compactions_total", NULL,
                    "Compactions into the slow volume of promoted copies only (no slow-volume "
                    "file read or written).",
                    s.twin_jobs);
    kv_stat_gauge(l, "hotrap.ralt_entries", "hotkv_node_hotrap_ralt_entries", NULL,
                  "Keys tracked by HotRAP's access tracker (RALT).", s.ralt_entries);
    kv_stat_gauge(l, "hotrap.ralt_bytes", "hotkv_node_hotrap_ralt_bytes", NULL, "Size of RALT.",
                  s.ralt_bytes);
    kv_stat_gauge(l, "hotrap.hot_set_limit", "hotkv_node_hotrap_hot_set_limit_bytes", NULL,
                  "Limit on the hot set's key and value bytes.", s.hot_set_limit);
    kv_stat_gauge(l, "hotrap.checker_backlog", "hotkv_node_hotrap_checker_backlog", NULL,
                  "Sealed promotion buffers waiting for the checker.", s.promo_backlog);
    kv_stat_counter(l, "hotrap.promo_dropped", "hotkv_node_hotrap_promotions_dropped_total", NULL,
                    "Promotion candidates checked and not promoted.", s.promo_dropped);
    kv_stat_counter(l, "hotrap.promo_drop_dup", NULL, NULL, NULL, s.promo_drop_dup);
    kv_stat_counter(l, "hotrap.promo_drop_cold", NULL, NULL, NULL, s.promo_drop_cold);
    kv_stat_counter(l, "hotrap.promo_drop_newer", NULL, NULL, NULL, s.promo_drop_newer);
    kv_stat_counter(l, "hotrap.promo_drop_on_fd", NULL, NULL, NULL, s.promo_drop_on_fd);
    kv_stat_counter(l, "hotrap.promo_drop_full", NULL, NULL, NULL, s.promo_drop_full);
    kv_stat_counter(l, "hotrap.promo_drop_gated", "hotkv_node_hotrap_promotions_gated_total", NULL,
                    "Hot keys not promoted because hot keys are read little more often than "
                    "chance (the read lift) and theirs scored under the bar.",
                    s.promo_drop_gated);
    kv_stat_gaugef(l, "hotrap.read_lift", 2, "hotkv_node_hotrap_read_lift", NULL,
                   "How many times more often than chance reads find their key hot; 0 until "
                   "measured.",
                   s.promo_lift, 1);
    kv_stat_gauge(l, "hotrap.ralt_stable", "hotkv_node_hotrap_ralt_stable", NULL,
                  "Keys RALT considers stably hot.", s.ralt_stable);
    kv_stat_gauge(l, "hotrap.ralt_hot_bytes", "hotkv_node_hotrap_hot_bytes", NULL,
                  "Key and value bytes of the hot keys.", s.ralt_hot_bytes);
    kv_stat_gauge(l, "hotrap.ralt_file_bytes", NULL, NULL, NULL, s.ralt_file_bytes);
    kv_stat_counter(l, "hotrap.ralt_errors", NULL, NULL, NULL, s.ralt_errors);
    kv_stat_gauge(l, "hotrap.ralt_mem_bytes", NULL, NULL, NULL, s.ralt_mem_bytes);
    kv_stat_counter(l, "hotrap.ralt_merges", NULL, NULL, NULL, s.ralt_merges);
    kv_stat_counter(l, "hotrap.ralt_full_merges", NULL, NULL, NULL, s.ralt_full_merges);
    kv_stat_counter(l, "hotrap.ralt_merge_bytes", "hotkv_node_hotrap_ralt_merge_bytes_total", NULL,
                    "Bytes written by merges of RALT's runs (its compaction).", s.ralt_merge_bytes);
    vol_stats(l, "fast", &s.fd);
    if (engine_has_slow(e))
        vol_stats(l, "slow", &s.sd);
}

void node_engine_statlist(engine *e, rpc_statlist *l)
{
    kv_stats ks;
    kv_stats_init(&ks);
    node_engine_store_stats(e, &ks);
    rpc_stats_init(l);
    kv_stats_to_statlist(&ks, l);
    kv_stats_free(&ks);
}

static void series_stats(nhc *h, kv_stats *l)
{
    nhc_point pts[NHC_SERIES_LEN];
    size_t n = nhc_get_series(h, pts, NHC_SERIES_LEN);
    uint64_t now = kv_now_ns();
    kv_stat_gauge(l, "nhc.series_points", NULL, NULL, NULL, n);
    for (size_t c = 0; c * SERIES_PER_STAT < n; c++) {
        char buf[512], name[32];
        size_t at = 0;
        for (size_t i = c * SERIES_PER_STAT; i < n && i < (c + 1) * SERIES_PER_STAT; i++) {
            const nhc_point *p = &pts[i];
            double age = p->t_ns <= now ? (double)(now - p->t_ns) / 1e9 : 0.0;
            int w = snprintf(buf + at, sizeof(buf) - at, "%s-%.1f,%d,%.3f,%.4f,%.0f", at ? " " : "",
                             age, (int)p->state, p->load_admit, p->miss_ratio, p->ops_per_sec);
            if (w < 0 || (size_t)w >= sizeof(buf) - at)
                break;
            at += (size_t)w;
        }
        snprintf(name, sizeof(name), "nhc.series.%zu", c);
        kv_stat_text(l, name, "%s", buf);
    }
}

void node_engine_nhc_stats(engine *e, kv_stats *l)
{
    static const char *const states[] = {"off", "classic", "tuning", NULL};
    nhc *h = engine_nhc(e);
    if (!h) {
        kv_stat_enum(l, "nhc.state", "hotkv_node_nhc_state", NULL,
                     "The NHC scheduler's state (off: no slow volume or no HotRAP).", "off",
                     states);
        return;
    }
    nhc_stats s;
    nhc_get_stats(h, &s);
    kv_stat_text(l, "nhc.enabled", "%s", s.enabled ? "on" : "off");
    kv_stat_enum(l, "nhc.state", "hotkv_node_nhc_state", NULL,
                 "The NHC scheduler's state (off: no slow volume or no HotRAP).",
                 s.state == NHC_STATE_TUNING ? "tuning" : "classic", states);
    kv_stat_text(l, "nhc.data_admit", "%s", s.data_admit ? "on" : "off");
    kv_stat_gauge(l, NULL, "hotkv_node_nhc_data_admit", NULL,
                  "1 when reads may admit records to the fast volume (NHC data_admit).",
                  s.data_admit);
    kv_stat_gaugef(l, "nhc.load_admit", 3, "hotkv_node_nhc_load_admit", NULL,
                   "Share of twin reads NHC keeps on the fast volume (load_admit).", s.load_admit,
                   1);
    kv_stat_gaugef(l, "nhc.miss_ratio", 4, "hotkv_node_nhc_miss_ratio", NULL,
                   "Fast-volume miss ratio of the last closed window.", s.miss_ratio, 1);
    kv_stat_gaugef(l, "nhc.reads_per_s", 1, "hotkv_node_nhc_reads_per_second", NULL,
                   "Reads below the memory tier per second, last window.", s.ops_per_sec, 1);
    kv_stat_gaugef(l, "nhc.p99_us", 1, "hotkv_node_nhc_read_p99_seconds", NULL,
                   "p99 read latency below the memory tier, last window.", (double)s.p99_ns / 1e3,
                   1e-6);
    kv_stat_gaugef(l, "nhc.window_ms", 1, NULL, NULL, NULL, (double)s.window_ns / 1e6, 1);
    kv_stat_counter(l, "nhc.windows", "hotkv_node_nhc_windows_total", NULL,
                    "NHC measurement windows closed.", s.windows);
    kv_stat_counter(l, "nhc.tuning_entries", "hotkv_node_nhc_tuning_entries_total", NULL,
                    "Times NHC entered the tuning state.", s.tuning_entries);
    kv_stat_gaugef(l, "nhc.data_admit_off_s", 3, "hotkv_node_nhc_data_admit_off_seconds_total",
                   NULL, "Time data_admit was off.", (double)s.data_admit_off_ns / 1e9, 1);
    kv_stat_gaugef(l, "nhc.load_admit_below_1_s", 3,
                   "hotkv_node_nhc_load_admit_below_one_seconds_total", NULL,
                   "Time load_admit was below 1.", (double)s.load_admit_below_one_ns / 1e9, 1);
    static const char *const dev[2] = {"fd", "sd"}, *const vol[2] = {"fast", "slow"};
    for (int d = 0; d < 2; d++) {
        char key[48], lab[48];
        kv_stat_label(lab, sizeof(lab), "volume", vol[d]);
        snprintf(key, sizeof(key), "nhc.%s_reads_per_s", dev[d]);
        kv_stat_gaugef(l, key, 1, "hotkv_node_nhc_volume_reads_per_second", lab,
                       "Reads per second per volume, NHC's last window.", s.dev[d].ops_per_sec, 1);
        snprintf(key, sizeof(key), "nhc.%s_lat_us", dev[d]);
        kv_stat_gaugef(l, key, 1, "hotkv_node_nhc_volume_read_latency_seconds", lab,
                       "Mean read latency per volume, NHC's last window.",
                       (double)s.dev[d].mean_ns / 1e3, 1e-6);
        snprintf(key, sizeof(key), "nhc.%s_p99_us", dev[d]);
        kv_stat_gaugef(l, key, 1, "hotkv_node_nhc_volume_read_p99_seconds", lab,
                       "p99 read latency per volume, NHC's last window.",
                       (double)s.dev[d].p99_ns / 1e3, 1e-6);
    }
    lsm_stats ls;
    if (engine_lsm_get_stats(e, &ls) == KV_OK) {
        kv_stat_gauge(l, "nhc.twin_entries", "hotkv_node_nhc_twin_entries", NULL,
                      "Records held on both volumes (the twin map).", ls.twin_entries);
        kv_stat_gauge(l, "nhc.twin_capacity", NULL, NULL, NULL, ls.twin_capacity);
        kv_stat_counter(l, "nhc.twin_evicted", NULL, NULL, NULL, ls.twin_evicted);
        kv_stat_counter(l, "nhc.routed_sd", "hotkv_node_nhc_routed_slow_total", NULL,
                        "Twin reads NHC sent to the slow volume.", ls.nhc_routed_sd);
        kv_stat_counter(l, "nhc.fallbacks", NULL, NULL, NULL, ls.nhc_fallbacks);
    }
    series_stats(h, l);
}

static const char *const serving_names[] = {"serving", "catching_up", "needs_repair",
                                            "no_map",  "removed",     NULL};

void node_collect_stats(node *n, const rpc_server *srv, kv_stats *l, bool verbose)
{
    engine_stats es;
    engine_get_stats(n->eng, &es);
    kv_stats_add(l, &(kv_stat){.kind = KV_STAT_COUNTER,
                               .key = "uptime_ms",
                               .metric = "hotkv_node_uptime_seconds_total",
                               .help = "Time since the node started.",
                               .u = (kv_now_ns() - n->started_ns) / 1000000ull,
                               .scale = 1e-3});
    kv_stat_gauge(l, "map_epoch", "hotkv_node_map_epoch", NULL,
                  "Epoch of the node's cluster map (0 = none).", cmap_slot_epoch(n->maps));
    kv_stat_text(l, "durability", "%s", engine_durability(n->eng));
    static const char *const engines[] = {"lsm", "kallax", NULL};
    kv_stat_enum(l, "engine", "hotkv_node_engine", NULL,
                 "The store below the memory tier (--engine).", engine_name(n->eng), engines);
    kv_stat_gauge(l, "keys", "hotkv_node_memory_items", NULL,
                  "Records in the memory tier (live, deleted or expired; see live_keys).",
                  es.items);
    kv_stat_gauge(l, "mem_bytes", "hotkv_node_memory_bytes", NULL, "Bytes of the memory tier.",
                  es.mem_bytes);
    kv_stat_gauge(l, "mem_limit_bytes", "hotkv_node_memory_limit_bytes", NULL,
                  "Budget of the memory tier (--mem-mb).", es.mem_limit);
    kv_stat_counter(l, "gets", "hotkv_node_engine_ops_total", "op=\"get\"",
                    "Engine operations (replica reads and writes).", es.gets);
    kv_stat_counter(l, "puts", "hotkv_node_engine_ops_total", "op=\"put\"", NULL, es.puts);
    kv_stat_counter(l, "deletes", "hotkv_node_engine_ops_total", "op=\"delete\"", NULL, es.deletes);
    kv_stat_counter(l, "blind_puts", "hotkv_node_engine_blind_puts_total", NULL,
                    "Puts applied without looking the key up (version above every stored one).",
                    es.blind_puts);
    kv_stat_gauge(l, "dirty_bytes", "hotkv_node_memory_dirty_bytes", NULL,
                  "Unflushed bytes of the memory tier.", es.dirty_bytes);
    kv_stat_gauge(l, "wal_bytes", "hotkv_node_wal_bytes", NULL,
                  "Bytes of the write-ahead log's live segments on the fast volume.", es.wal_bytes);
    kv_stat_gauge(l, "wal_limit", "hotkv_node_wal_limit_bytes", NULL,
                  "The most the write-ahead log may hold (--wal-max-mb).", es.wal_limit);
    kv_stat_counter(l, "wal_flushes", "hotkv_node_wal_flushes_total", NULL,
                    "Flushes set off by the write-ahead log's size (overwrites).", es.wal_flushes);
    kv_stat_gauge(l, "hot.pinned", "hotkv_node_hot_keys_pinned", NULL,
                  "Keys pinned in memory by the cluster's hot-key hints.", node_hot_pinned(n->hot));
    kv_stat_gauge(l, "hot.tracked", "hotkv_node_hot_keys_tracked", NULL,
                  "Keys the routers report hot for this node.", node_hot_tracked(n->hot));
    char why[200];
    int serving = node_serving(n, why, sizeof(why));
    kv_stat_enum(l, "serving", "hotkv_node_serving_state", NULL,
                 "The node's serving state (1 for the current one).",
                 serving >= 0 && serving < 5 ? serving_names[serving] : "?", serving_names);
    uint64_t rec_est = 0, bytes_est = 0;
    engine_estimate(n->eng, &rec_est, &bytes_est);
    kv_stat_gauge(l, "records_estimate", "hotkv_node_records_estimate", NULL,
                  "SST entries plus dirty items (versions and tombstones included).", rec_est);
    kv_stat_gauge(l, "bytes_estimate", "hotkv_node_stored_bytes_estimate", NULL,
                  "SST bytes plus dirty items' bytes.", bytes_est);
    node_handoff_stats(n, l);
    node_stream_src_stats(l);
    node_coord_stats(n, l);
    node_engine_nhc_stats(n->eng, l); /* nhc.* */
    if (!verbose)
        return;
    kv_stat_counter(l, "reads.memory", "hotkv_node_reads_total", "tier=\"memory\"",
                    "Engine reads by the tier that served them (miss: no record).", es.reads_mem);
    kv_stat_counter(l, "reads.fast", "hotkv_node_reads_total", "tier=\"fast\"", NULL, es.reads_fd);
    kv_stat_counter(l, "reads.slow", "hotkv_node_reads_total", "tier=\"slow\"", NULL, es.reads_sd);
    kv_stat_counter(l, "reads.miss", "hotkv_node_reads_total", "tier=\"miss\"", NULL,
                    es.reads_miss);
    kv_stat_counter(l, "memory.fills", "hotkv_node_memory_fills_total", NULL,
                    "Records admitted to the memory tier by reads.", es.fills);
    kv_stat_counter(l, "memory.evictions", "hotkv_node_memory_evictions_total", NULL,
                    "Clean records evicted from the memory tier.", es.evictions);
    kv_stat_counter(l, "memory.flushes", "hotkv_node_memory_flushes_total", NULL,
                    "Memory-tier flushes.", es.flushes);
    double reads = es.index_reads ? (double)es.index_reads : 1.0;
    kv_stat_gauge(l, "index.buckets", "hotkv_node_hotring_buckets", NULL,
                  "Buckets of the HotRing index.", es.index_buckets);
    kv_stat_counter(l, "index.reads", "hotkv_node_hotring_reads_total", NULL, "HotRing lookups.",
                    es.index_reads);
    kv_stat_gaugef(l, "index.visited_per_read", 3, "hotkv_node_hotring_visited_per_read", NULL,
                   "Items visited per HotRing lookup, since start.",
                   (double)es.index_visited / reads, 1);
    kv_stat_gaugef(l, "index.head_hit", 4, "hotkv_node_hotring_head_hit_ratio", NULL,
                   "Share of HotRing lookups found at the ring's head, since start.",
                   (double)es.index_head_hits / reads, 1);
    kv_stat_counter(l, "index.pinned_reads", "hotkv_node_hotring_pinned_reads_total", NULL,
                    "HotRing lookups of pinned keys.", es.index_pinned_reads);
    kv_stat_gaugef(l, "index.pinned_head_hit", 4, NULL, NULL, NULL,
                   es.index_pinned_reads
                       ? (double)es.index_pinned_head_hits / (double)es.index_pinned_reads
                       : 0.0,
                   1);
    kv_stat_counter(l, "index.head_moves", "hotkv_node_hotring_head_moves_total", NULL,
                    "HotRing head moves (a hotter item became the head).", es.index_head_moves);
    kv_stat_counter(l, "index.sample_rounds", "hotkv_node_hotring_sample_rounds_total", NULL,
                    "HotRing statistical sampling rounds.", es.index_sample_rounds);
    kv_stat_counter(l, "index.rehashes", "hotkv_node_hotring_rehashes_total", NULL,
                    "HotRing rehashes.", es.index_rehashes);
    /* raw counters behind the ratios above, for deltas over a run */
    kv_stat_counter(l, "index.visited", "hotkv_node_hotring_visited_total", NULL,
                    "Items visited by HotRing lookups.", es.index_visited);
    kv_stat_counter(l, "index.head_hits", "hotkv_node_hotring_head_hits_total", NULL,
                    "HotRing lookups found at the ring's head.", es.index_head_hits);
    kv_stat_counter(l, "index.pinned_head_hits", "hotkv_node_hotring_pinned_head_hits_total", NULL,
                    "Lookups of pinned keys found at the head.", es.index_pinned_head_hits);
    node_engine_store_stats(n->eng, l);
    rpc_server_stats(srv, l, "hotkv_node");
    rpc_metrics_stats(n->metrics, l, "hotkv_node");
}

/* ---- HTTP: /metrics, /health ------------------------------------------- */

static void h_metrics(void *arg, const char *path, const char *query, kv_http_res *res)
{
    node *n = arg;
    kv_stats l;
    kv_stats_init(&l);
    engine_thread_register();                /* nng's thread: the engine wants registered readers */
    node_collect_stats(n, n->rpc, &l, true); /* the HTTP server starts after the RPC one */
    engine_thread_unregister();
    char id[128];
    kv_stat_label(id, sizeof(id), "id", n->cfg.id);
    kv_stat_gauge(&l, NULL, "hotkv_node_info", id, "The node's id (value 1).", 1);
    kv_http_metrics_res(res, &l);
    kv_stats_free(&l);
}

/* s JSON-escaped into out (quotes, backslashes, control characters). */
static void json_str(const char *s, char *out, size_t outlen)
{
    size_t k = 0;
    for (; *s && k + 7 < outlen; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[k++] = '\\';
            out[k++] = (char)ch;
        } else if (ch < 0x20) {
            k += (size_t)snprintf(out + k, outlen - k, "\\u%04x", ch);
        } else {
            out[k++] = (char)ch;
        }
    }
    out[k] = '\0';
}

static void h_health(void *arg, const char *path, const char *query, kv_http_res *res)
{
    node *n = arg;
    char why[256], esc[600], id[200];
    why[0] = '\0';
    int st = node_serving(n, why, sizeof(why));
    json_str(why, esc, sizeof(esc));
    json_str(n->cfg.id, id, sizeof(id));
    const char *state = st >= 0 && st < 5 ? serving_names[st] : "unknown";
    char *body = malloc(1024);
    if (!body) {
        res->status = 500;
        return;
    }
    int len = snprintf(body, 1024,
                       "{\"status\":\"%s\",\"role\":\"node\",\"id\":\"%s\",\"detail\":\"%s\"}\n",
                       state, id, esc);
    res->status = st == 0 ? 200 : 503;
    res->content_type = "application/json";
    res->body = body;
    res->len = (size_t)len;
}

kv_err node_http_start(node *n, char *err, size_t errlen)
{
    if (!n->cfg.http_listen || !*n->cfg.http_listen)
        return KV_OK;
    kv_http_route *routes = n->http_routes;
    routes[0] = (kv_http_route){"/metrics", h_metrics, n};
    routes[1] = (kv_http_route){"/health", h_health, n, .open = true};
    kv_http_opts ho = {.token = n->cfg.sec.http_token, .tls = rpc_sec_tls(&n->cfg.sec)};
    kv_err rv = kv_http_open(&n->http, n->cfg.http_listen, routes, 2, &ho, err, errlen);
    if (rv == KV_OK)
        KV_INFO("node", "HTTP on %s (port %d): /metrics, /health", n->cfg.http_listen,
                kv_http_port(n->http));
    return rv;
}

void node_http_stop(node *n)
{
    kv_http_close(n->http);
    n->http = NULL;
}
