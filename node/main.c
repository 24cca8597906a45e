/* SPDX-License-Identifier: MIT */
/*
 * kvnode: the storage node process. Parses flags (or an INI file), starts
 * the node and waits for SIGTERM/SIGINT, then shuts down gracefully: stop
 * accepting, let in-flight requests finish, close the tiers.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/opts.h"
#include "node/kallax/kallax.h"
#include "node/node.h"
#include "node/lsm/lsm.h"

/* The NHC flags (node/nhc/nhc.h; defaults from nhc_opts_default, whose
 * comment says where each number comes from). */
typedef struct nhc_flags {
    int on; /* index into {"off", "on"} */
    int target;
    double step, stable_delta, miss_max, miss_rise, min_gain;
    long poll_ms, probe_ms, min_ops, stuck_rounds, backoff_max;
} nhc_flags;

static void nhc_flags_init(nhc_flags *f)
{
    nhc_opts d;
    nhc_opts_default(&d);
    *f = (nhc_flags){.on = d.enable ? 1 : 0,
                     .target = (int)d.target,
                     .step = d.step,
                     .stable_delta = d.stable_delta,
                     .miss_max = d.miss_max,
                     .miss_rise = d.miss_rise,
                     .min_gain = d.min_gain,
                     .poll_ms = (long)(d.poll_ns / 1000000),
                     .probe_ms = (long)(d.probe_ns / 1000000),
                     .min_ops = (long)d.min_ops,
                     .stuck_rounds = (long)d.stuck_rounds,
                     .backoff_max = (long)d.backoff_max};
}

/* Checks the ranges KV_OPT_DOUBLE does not and fills o. */
static kv_err nhc_flags_apply(const nhc_flags *f, nhc_opts *o, char *err, size_t errlen)
{
    const struct {
        const char *name;
        double v, lo, hi;
        bool open_lo;
    } r[] = {{"nhc-step", f->step, 0, 1, true},
             {"nhc-stable-delta", f->stable_delta, 0, 1, false},
             {"nhc-miss-max", f->miss_max, 0, 1, false},
             {"nhc-miss-rise", f->miss_rise, 0, 1, false},
             {"nhc-min-gain", f->min_gain, 0, 10, false}};
    for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++) {
        if (!(r[i].v >= r[i].lo && r[i].v <= r[i].hi) || (r[i].open_lo && r[i].v <= r[i].lo)) {
            snprintf(err, errlen, "--%s: %g is out of range, expected %s%g, %g]", r[i].name, r[i].v,
                     r[i].open_lo ? "(" : "[", r[i].lo, r[i].hi);
            return KV_INVALID_ARGUMENT;
        }
    }
    nhc_opts_default(o);
    o->enable = f->on == 1;
    o->target = (nhc_target)f->target;
    o->step = f->step;
    o->stable_delta = f->stable_delta;
    o->miss_max = f->miss_max;
    o->miss_rise = f->miss_rise;
    o->min_gain = f->min_gain;
    o->poll_ns = (uint64_t)f->poll_ms * 1000000ull;
    o->probe_ns = (uint64_t)f->probe_ms * 1000000ull;
    o->min_ops = (uint64_t)f->min_ops;
    o->stuck_rounds = (unsigned)f->stuck_rounds;
    o->backoff_max = (unsigned)f->backoff_max;
    return KV_OK;
}

/* Checks --engine and its kallax flags (kallax: one volume, a size from
 * --kallax-blocks or --kallax-gb, not both; keys up to KALLAX_MAX_KEY). */
static kv_err engine_flags_apply(node_config *c, long kallax_gb, long *max_key, char *err,
                                 size_t errlen)
{
    if (c->engine != ENGINE_KALLAX) {
        if (c->kallax_blocks || kallax_gb)
            snprintf(err, errlen, "--kallax-blocks and --kallax-gb need --engine kallax");
        return c->kallax_blocks || kallax_gb ? KV_INVALID_ARGUMENT : KV_OK;
    }
    if (c->kallax_blocks && kallax_gb) {
        snprintf(err, errlen, "give --kallax-blocks or --kallax-gb, not both");
        return KV_INVALID_ARGUMENT;
    }
    if (c->slow_dir) {
        snprintf(err, errlen, "--engine kallax uses one volume: --slow-dir does not apply");
        return KV_INVALID_ARGUMENT;
    }
    if (*max_key > (long)KALLAX_MAX_KEY && *max_key != (long)KV_DEFAULT_MAX_KEY) {
        snprintf(err, errlen, "--max-key-bytes: engine kallax takes keys of at most %u bytes",
                 KALLAX_MAX_KEY);
        return KV_INVALID_ARGUMENT;
    }
    if (*max_key > (long)KALLAX_MAX_KEY)
        *max_key = KALLAX_MAX_KEY; /* the default, lowered to kallax's limit */
    if (kallax_gb)
        c->kallax_blocks = kallax_gb * (long)((1u << 30) / KALLAX_BLOCK);
    return KV_OK;
}

int main(int argc, char **argv)
{
    /* SIGINT and SIGTERM are taken by sigwait once the process serves. They
     * are blocked before any thread starts (nng starts its threads at its
     * first use), as every thread inherits the mask: a signal that came
     * during start-up would otherwise kill the process in a thread that had
     * it unblocked, without a clean shutdown. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    node n = {0};
    n.cfg.listen = "tcp://127.0.0.1:7001";
    n.cfg.mem_mb = 256;
    n.cfg.workers = 8;
    n.cfg.coord_workers = 8;
    n.cfg.max_inflight = RPC_DEFAULT_MAX_INFLIGHT;
    n.cfg.fast_mb = 1024;
    n.cfg.fast_stop_pct = 100;
    n.cfg.sync = ENGINE_SYNC_BATCH;
    n.cfg.sync_ms = 5;
    n.cfg.write_buffer_mb = 64;
    n.cfg.hot_threshold = 1000;
    n.cfg.hotrap = true;
    n.cfg.stream_mbps = 16;
    n.cfg.cleanup_delay_s = 300;
    n.cfg.map_refresh_ms = 2000;
    n.cfg.hints_max_mb = 1024;
    n.cfg.hint_window_s = 3 * 3600;
    n.cfg.tombstone_grace_s = 10 * 86400;
    n.cfg.catchup_timeout_ms = 10000;
    static const char *const sync_modes[] = {"always", "batch", "none", NULL};
    static const char *const nhc_targets[] = {"throughput", "p99", NULL};
    static const char *const off_on[] = {"off", "on", NULL}; /* a value is required */
    static const char *const wal_modes[] = {"absolute", "point-in-time", NULL};
    static const char *const engines[] = {"lsm", "kallax", NULL}; /* engine_kind */
    long kallax_gb = 0;
    nhc_flags nf;
    nhc_flags_init(&nf);
    long rpc_threads = 0, loops = 0;
    long max_key = KV_DEFAULT_MAX_KEY, max_value = KV_DEFAULT_MAX_VALUE;
    long max_ops = KV_DEFAULT_MAX_BATCH_OPS, max_batch = KV_DEFAULT_MAX_BATCH_BYTES;
    char *log_level = "info";
    kv_opt table[] = {
        {"id", KV_OPT_STR, &n.cfg.id, "node id (required), unique in the cluster", NULL, 0, 0},
        {"listen", KV_OPT_STR, &n.cfg.listen, "RPC address", NULL, 0, 0},
        {"data-dir", KV_OPT_STR, &n.cfg.data_dir, "data directory (default ./data/ID)", NULL, 0, 0},
        {"mem-mb", KV_OPT_INT, &n.cfg.mem_mb, "memory-tier budget in MiB", NULL, 1, 1 << 20},
        {"fast-dir", KV_OPT_STR, &n.cfg.fast_dir,
         "fast volume: WAL, MANIFEST, upper levels "
         "(default DATA_DIR/fast)",
         NULL, 0, 0},
        {"slow-dir", KV_OPT_STR, &n.cfg.slow_dir,
         "slow volume for the lower levels (default: none, "
         "all levels on the fast volume)",
         NULL, 0, 0},
        {"fast-mb", KV_OPT_INT, &n.cfg.fast_mb, "fast-volume capacity for LSM levels in MiB", NULL,
         1, 1L << 30},
        {"fast-stop-pct", KV_OPT_INT, &n.cfg.fast_stop_pct,
         "with --slow-dir: flushes wait while the fast volume's SSTs exceed this % of --fast-mb "
         "and compaction has work there",
         NULL, 50, 100000},
        {"sync", KV_OPT_ENUM, &n.cfg.sync, "WAL sync: always|batch|none", sync_modes, 0, 0},
        {"sync-ms", KV_OPT_INT, &n.cfg.sync_ms, "batch sync period in ms", NULL, 1, 10000},
        {"write-buffer-mb", KV_OPT_INT, &n.cfg.write_buffer_mb,
         "dirty memory-tier bytes that trigger a flush, MiB", NULL, 1, 1 << 20},
        {"write-buffer-kb", KV_OPT_INT, &n.cfg.write_buffer_kb,
         "the same in KiB (tests); wins when set", NULL, 0, 1 << 30},
        {"wal-max-mb", KV_OPT_INT, &n.cfg.wal_max_mb,
         "most bytes the WAL may hold on the fast volume, MiB (writers wait there; 0 = 4 x "
         "--write-buffer-mb)",
         NULL, 0, 1 << 20},
        {"hot-threshold", KV_OPT_DOUBLE, &n.cfg.hot_threshold,
         "cluster hot-key rate (ops/s) that pins a key in memory (0 = never: hints off)", NULL, 0,
         0},
        {"hotrap", KV_OPT_BOOL, &n.cfg.hotrap,
         "keep read-hot records on the fast volume (HotRAP; needs --slow-dir)", NULL, 0, 0},
        {"compression", KV_OPT_STR, &n.cfg.compression,
         "SST block compression: auto (lz4 on the slow volume's levels, none on the fast "
         "one's), a codec for every level (none|lz4|zstd), codecs by level from L0 "
         "(none,none,none,zstd: the last repeats) or by volume (fast=none,slow=zstd)",
         NULL, 0, 0},
        {"nhc", KV_OPT_ENUM, &nf.on,
         "NHC scheduler (Orthus): offload reads of records held on both volumes to the "
         "slow one when the fast one saturates, on|off (needs --slow-dir and HotRAP)",
         off_on, 0, 0},
        {"nhc-target", KV_OPT_ENUM, &nf.target, "NHC hill-climb target: throughput|p99",
         nhc_targets, 0, 0},
        {"nhc-step", KV_OPT_DOUBLE, &nf.step, "NHC load_admit step per probe, (0, 1]", NULL, 0, 0},
        {"nhc-poll-ms", KV_OPT_INT, &nf.poll_ms, "NHC miss-ratio poll interval (classic state)",
         NULL, 1, 600000},
        {"nhc-probe-ms", KV_OPT_INT, &nf.probe_ms, "NHC probe window while tuning", NULL, 1,
         600000},
        {"nhc-stable-delta", KV_OPT_DOUBLE, &nf.stable_delta,
         "NHC miss-ratio change between polls that counts as stable, [0, 1]", NULL, 0, 0},
        {"nhc-miss-max", KV_OPT_DOUBLE, &nf.miss_max,
         "NHC never tunes above this miss ratio, [0, 1]", NULL, 0, 0},
        {"nhc-miss-rise", KV_OPT_DOUBLE, &nf.miss_rise,
         "NHC miss-ratio rise over its value at tuning start that returns to classic, [0, 1]", NULL,
         0, 0},
        {"nhc-min-gain", KV_OPT_DOUBLE, &nf.min_gain,
         "NHC relative gain a probe needs to win, [0, 10]", NULL, 0, 0},
        {"nhc-min-ops", KV_OPT_INT, &nf.min_ops, "NHC reads a window needs to count", NULL, 1,
         1L << 40},
        {"nhc-stuck-rounds", KV_OPT_INT, &nf.stuck_rounds,
         "NHC tuning rounds ending at load_admit 1 that return to classic", NULL, 1, 1000},
        {"nhc-backoff-max", KV_OPT_INT, &nf.backoff_max,
         "NHC: after tuning ended stuck at load_admit 1, wait up to this many extra stable polls "
         "before tuning again (doubling from 1; 0 = never wait)",
         NULL, 0, 100000},
        {"nhc-twin-entries", KV_OPT_INT, &n.cfg.twin_entries,
         "NHC twin-map bound in entries (0 = 256 per MiB of --fast-mb)", NULL, 0, 1L << 30},
        {"no-io-uring", KV_OPT_BOOL, &n.cfg.no_io_uring,
         "read blocks with pread instead of io_uring (writes always use pwrite)", NULL, 0, 0},
        {"workers", KV_OPT_INT, &n.cfg.workers, "RPC worker threads", NULL, 1, 1024},
        {"rpc-threads", KV_OPT_INT, &rpc_threads,
         "nng callback threads (0 = one per CPU, at least 2; nng 1.5 rounds up to even)", NULL, 0,
         256},
        {"loops", KV_OPT_INT, &loops,
         "event-loop threads serving tcp:// connections (0 = one per CPU, at most 8)", NULL, 0, 8},
        {"coord-workers", KV_OPT_INT, &n.cfg.coord_workers,
         "RPC worker threads for requests the node coordinates for smart clients", NULL, 1, 1024},
        RPC_SEC_SERVER_OPTS(&n.cfg.sec),
        {"max-inflight", KV_OPT_INT, &n.cfg.max_inflight,
         "calls admitted and not answered yet, at most; more are refused at once with "
         "RESOURCE_EXHAUSTED (so are calls arriving while the queue waits more than half of "
         "their deadline)",
         NULL, 1, 1 << 20},
        {"max-key-bytes", KV_OPT_INT, &max_key, "key size limit", NULL, 1, 1 << 20},
        {"max-value-bytes", KV_OPT_INT, &max_value, "value size limit", NULL, 0, 1L << 30},
        {"max-batch-ops", KV_OPT_INT, &max_ops, "ops per batch limit", NULL, 1, 1 << 24},
        {"max-batch-bytes", KV_OPT_INT, &max_batch, "batch size limit", NULL, 1, 1L << 30},
        {"stream-mbps", KV_OPT_INT, &n.cfg.stream_mbps,
         "default throttle of the streams this node pulls (membership changes, repair), MiB/s",
         NULL, 1, 100000},
        {"cleanup-delay", KV_OPT_INT, &n.cfg.cleanup_delay_s,
         "seconds after a membership change completes before the node drops the ranges it no "
         "longer replicates (-1 = only on kvctl node cleanup)",
         NULL, -1, 365L * 86400},
        {"map-refresh-ms", KV_OPT_INT, &n.cfg.map_refresh_ms,
         "how often a peer is asked for a newer cluster map", NULL, 50, 3600000},
        {"hints-max-mb", KV_OPT_INT, &n.cfg.hints_max_mb,
         "bound on the hints this node keeps for unreachable replicas, MiB", NULL, 1, 1L << 30},
        {"hint-window", KV_OPT_INT, &n.cfg.hint_window_s,
         "seconds a hint is kept; older hints are dropped and their target needs kvctl repair",
         NULL, 1, 365L * 86400},
        {"tombstone-grace", KV_OPT_INT, &n.cfg.tombstone_grace_s,
         "seconds a delete's tombstone is kept before compaction may drop it (a node down "
         "longer must be wiped and replaced, not restarted)",
         NULL, 0, 3650L * 86400},
        {"catchup-timeout-ms", KV_OPT_INT, &n.cfg.catchup_timeout_ms,
         "after a restart, a peer that does not answer within this time is skipped when "
         "waiting for the hints held for this node",
         NULL, 100, 3600000},
        {"force-stale-start", KV_OPT_BOOL, &n.cfg.force_stale_start,
         "start although the node was down longer than --tombstone-grace (it may resurrect "
         "deleted keys; it starts marked NEEDS_REPAIR)",
         NULL, 0, 0},
        {"wal-recovery", KV_OPT_ENUM, &n.cfg.wal_recovery,
         "a WAL corrupted before its tail (acknowledged writes after the damage): absolute = "
         "refuse to start, naming the file and offset; point-in-time = start with the writes "
         "before the damage (the later ones are lost; repair the node)",
         wal_modes, 0, 0},
        {"engine", KV_OPT_ENUM, &n.cfg.engine,
         "store below the memory tier: lsm (tiered, HotRAP, NHC) or kallax (table-less hash "
         "store on one volume, for drives with transparent compression); fixed at creation",
         engines, 0, 0},
        {"kallax-blocks", KV_OPT_INT, &n.cfg.kallax_blocks,
         "kallax: home blocks of 4 KiB (required to create a store; aim at 25-60% load)", NULL, 1,
         1L << 40},
        {"kallax-gb", KV_OPT_INT, &kallax_gb, "kallax: the store's size in GiB instead", NULL, 1,
         1L << 20},
        {"http-listen", KV_OPT_STR, &n.cfg.http_listen,
         "serve /metrics (Prometheus) and /health on http://HOST:PORT or https://HOST:PORT "
         "(--tls-cert/--tls-key; default: off)",
         NULL, 0, 0},
        {"log-level", KV_OPT_STR, &log_level, "debug|info|warn|error", NULL, 0, 0},
    };
    kv_optset set = {table, sizeof(table) / sizeof(table[0]), NULL, "kvnode", NULL};
    char err[512];
    kv_err rv = kv_opts_parse(&set, argc, argv, NULL, err, sizeof(err));
    if (rv == KV_CANCELLED) {
        rpc_sec_free(&n.cfg.sec);
        kv_opts_free(&set);
        return 0;
    }
    if (rv == KV_OK && !n.cfg.id) {
        snprintf(err, sizeof(err), "--id is required");
        rv = KV_INVALID_ARGUMENT;
    }
    if (rv == KV_OK)
        rv = nhc_flags_apply(&nf, &n.cfg.nhc, err, sizeof(err));
    if (rv == KV_OK)
        rv = engine_flags_apply(&n.cfg, kallax_gb, &max_key, err, sizeof(err));
    if (rv == KV_OK)
        rv = rpc_sec_load(&n.cfg.sec, err, sizeof(err));
    lsm_compression_spec cs;
    char cerr[256];
    if (rv == KV_OK && lsm_compression_parse(n.cfg.compression, &cs, cerr, sizeof(cerr)) != KV_OK) {
        snprintf(err, sizeof(err), "--compression: %s", cerr);
        rv = KV_INVALID_ARGUMENT;
    }
    if (rv == KV_OK && kv_log_parse_level(log_level) < 0) {
        snprintf(err, sizeof(err), "--log-level: '%s' is not debug|info|warn|error", log_level);
        rv = KV_INVALID_ARGUMENT;
    }
    if (rv != KV_OK) {
        fprintf(stderr, "kvnode: %s\n", err);
        rpc_sec_free(&n.cfg.sec);
        kv_opts_free(&set);
        return 2;
    }
    kv_log_set_level((kv_log_level)kv_log_parse_level(log_level));
    rpc_sec_warn(&n.cfg.sec, "kvnode", n.cfg.listen, n.cfg.http_listen);
    n.cfg.limits =
        (kv_limits){(size_t)max_key, (size_t)max_value, (size_t)max_ops, (size_t)max_batch};
    char dflt_dir[1024];
    if (!n.cfg.data_dir) {
        snprintf(dflt_dir, sizeof(dflt_dir), "./data/%s", n.cfg.id);
        n.cfg.data_dir = dflt_dir;
    }
    rpc_runtime_init((unsigned)rpc_threads);
    rpc_runtime_set_loops((unsigned)loops);
    signal(SIGPIPE, SIG_IGN);
    if ((rv = node_start(&n, err, sizeof(err))) != KV_OK) {
        KV_ERROR("node", "cannot start: %s (%s)", err, kv_err_name(rv));
        node_stop(&n);
        rpc_sec_free(&n.cfg.sec);
        kv_opts_free(&set);
        return 1;
    }
    KV_INFO("node",
            "%s serving on %s (data %s, engine %s, durability %s, %u event loops, %u nng task "
            "threads)",
            n.cfg.id, n.cfg.listen, n.cfg.data_dir, engine_name(n.eng), engine_durability(n.eng),
            rpc_runtime_loops(), rpc_runtime_task_threads());
    int sig = 0;
    sigwait(&sigs, &sig);
    KV_INFO("node", "%s: shutting down", strsignal(sig));
    node_stop(&n);
    rpc_sec_free(&n.cfg.sec);
    kv_opts_free(&set);
    return 0;
}
