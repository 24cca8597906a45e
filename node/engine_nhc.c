/* SPDX-License-Identifier: MIT */
/*
 * The engine's NHC scheduler (Orthus non-hierarchical caching, DESIGN.md §5,
 * node/nhc/nhc.h): created before the LSM (which routes twin reads and gates
 * promotion with it and reports every read below the memory tier to it),
 * ticked every 10 ms by a small thread of its own (the monitor interval of
 * Orthus-KV's code, see nhc_ctl.c; the flush thread sleeps up to a second),
 * and reported by node/stats.c (admin.Stats nhc.* names, including the
 * last minute as nhc.series.N chunks, and /metrics). There is one only when the node has a slow
 * volume and HotRAP (twins come from HotRAP promotion); --nhc off keeps it in classic state
 * (data_admit on, load_admit 1) so that its per-volume figures stay visible.
 */
#include <stdio.h>

#include "common/log.h"
#include "node/engine_int.h"

#define NHC_TICK_NS 10000000ull

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
