/* SPDX-License-Identifier: MIT */
/*
 * The engine's NHC scheduler (Orthus non-hierarchical caching, DESIGN.md §5,
 * node/nhc/nhc.h): created before the LSM (which routes twin reads and gates
 * promotion with it and reports every read below the memory tier to it),
 * ticked every 10 ms by a small thread of its own (the monitor interval of
 * Orthus-KV's code, see nhc_ctl.c; the flush thread sleeps up to a second),
 * and reported in admin.Stats as the nhc.* names, including the last minute
 * as nhc.series.N chunks. There is one only when the node has a slow volume
 * and HotRAP (twins come from HotRAP promotion); --nhc off keeps it in
 * classic state (data_admit on, load_admit 1) so that its per-volume
 * figures stay visible.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "node/engine_int.h"

#define NHC_TICK_NS 10000000ull
#define SERIES_PER_STAT 10 /* points per nhc.series.N value (< 512 bytes) */

kv_err engine_nhc_create(engine *e, lsm_opts *lo, char *err, size_t errlen)
{
    if (!e->o.slow_dir || e->o.no_hotrap)
        return KV_OK;
    nhc_opts o;
    if (e->o.nhc)
        o = *e->o.nhc;
    else
        nhc_opts_default(&o);
    kv_err rv = nhc_create(&o, kv_now_ns(), &e->nhc);
    if (rv != KV_OK) {
        snprintf(err, errlen, "invalid NHC options: %s", kv_strerror(rv));
        return rv;
    }
    lo->nhc = e->nhc;
    lo->twin_entries = e->o.twin_entries;
    return KV_OK;
}

static void nhc_on_tick(void *arg)
{
    engine *e = arg;
    kv_err rv = nhc_tick(e->nhc, kv_now_ns());
    if (rv != KV_OK)
        KV_WARN("engine", "nhc tick: %s", kv_strerror(rv));
}

kv_err engine_nhc_start(engine *e)
{
    if (!e->nhc)
        return KV_OK;
    kv_ticker_opts to = {.period_ns = NHC_TICK_NS, .fn = nhc_on_tick, .arg = e};
    return kv_ticker_start(&e->nhc_ticker, &to);
}

void engine_nhc_stop(engine *e)
{
    kv_ticker_stop(e->nhc_ticker);
    e->nhc_ticker = NULL;
}

void engine_nhc_destroy(engine *e)
{
    nhc_destroy(e->nhc);
    e->nhc = NULL;
}

bool engine_nhc_admit_sd(engine *e)
{
    return !e->nhc || nhc_data_admit(e->nhc);
}

nhc *engine_nhc(engine *e)
{
    return e->nhc;
}

static void series_stats(engine *e, rpc_statlist *l)
{
    nhc_point pts[NHC_SERIES_LEN];
    size_t n = nhc_get_series(e->nhc, pts, NHC_SERIES_LEN);
    uint64_t now = kv_now_ns();
    rpc_stats_add(l, "nhc.series_points", "%zu", n);
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
        rpc_stats_add(l, name, "%s", buf);
    }
}

void engine_nhc_stats(engine *e, rpc_statlist *l)
{
    if (!e->nhc) {
        rpc_stats_add(l, "nhc.state", "%s", "off");
        return;
    }
    nhc_stats s;
    nhc_get_stats(e->nhc, &s);
    rpc_stats_add(l, "nhc.enabled", "%s", s.enabled ? "on" : "off");
    rpc_stats_add(l, "nhc.state", "%s", s.state == NHC_STATE_TUNING ? "tuning" : "classic");
    rpc_stats_add(l, "nhc.data_admit", "%s", s.data_admit ? "on" : "off");
    rpc_stats_add(l, "nhc.load_admit", "%.3f", s.load_admit);
    rpc_stats_add(l, "nhc.miss_ratio", "%.4f", s.miss_ratio);
    rpc_stats_add(l, "nhc.reads_per_s", "%.1f", s.ops_per_sec);
    rpc_stats_add(l, "nhc.p99_us", "%.1f", (double)s.p99_ns / 1e3);
    rpc_stats_add(l, "nhc.window_ms", "%.1f", (double)s.window_ns / 1e6);
    rpc_stats_add(l, "nhc.windows", "%" PRIu64, s.windows);
    rpc_stats_add(l, "nhc.tuning_entries", "%" PRIu64, s.tuning_entries);
    rpc_stats_add(l, "nhc.data_admit_off_s", "%.3f", (double)s.data_admit_off_ns / 1e9);
    rpc_stats_add(l, "nhc.load_admit_below_1_s", "%.3f", (double)s.load_admit_below_one_ns / 1e9);
    static const char *const dev[2] = {"fd", "sd"};
    for (int d = 0; d < 2; d++) {
        char name[48];
        snprintf(name, sizeof(name), "nhc.%s_reads_per_s", dev[d]);
        rpc_stats_add(l, name, "%.1f", s.dev[d].ops_per_sec);
        snprintf(name, sizeof(name), "nhc.%s_lat_us", dev[d]);
        rpc_stats_add(l, name, "%.1f", (double)s.dev[d].mean_ns / 1e3);
        snprintf(name, sizeof(name), "nhc.%s_p99_us", dev[d]);
        rpc_stats_add(l, name, "%.1f", (double)s.dev[d].p99_ns / 1e3);
    }
    lsm_stats ls;
    if (lsm_stats_get(e->db, &ls) == KV_OK) {
        rpc_stats_add(l, "nhc.twin_entries", "%" PRIu64, ls.twin_entries);
        rpc_stats_add(l, "nhc.twin_capacity", "%" PRIu64, ls.twin_capacity);
        rpc_stats_add(l, "nhc.twin_evicted", "%" PRIu64, ls.twin_evicted);
        rpc_stats_add(l, "nhc.routed_sd", "%" PRIu64, ls.nhc_routed_sd);
        rpc_stats_add(l, "nhc.fallbacks", "%" PRIu64, ls.nhc_fallbacks);
    }
    series_stats(e, l);
}
