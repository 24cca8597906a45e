/* SPDX-License-Identifier: MIT */
/*
 * index_bench: compares in-memory hash indexes (HotRing in sampling and
 * random-movement modes, a lock-free chaining hash, liburcu's cds_lfht fixed
 * and auto-resizing) under YCSB workloads with the same bucket count
 * (keys / ratio), the same pre-drawn request traces and the same load order.
 *
 * For every implementation in --impl: open the index, load every key from
 * the worker threads in one random order (so items are allocated in that
 * order), then let each thread loop over its trace for --seconds and count
 * ops. One JSON object per implementation goes to stdout (DESIGN.md §6), with
 * Mops/s, items visited per read and the share of reads answered by the
 * bucket's first item; with --shift-at S the hot set moves at second S (the
 * key space is rotated by keys / 2) and a 100 ms time series follows. The last
 * line is a summary with the throughput and bucket-memory ratios.
 */
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <urcu/urcu-memb.h>

#include "bench/index_bench.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/opts.h"

#define MOD "index_bench"
#ifdef KV_BENCH_HAVE_HOTRING
#define IMPL_HELP "comma list of hotring-s,hotring-r,chain,lfht,lfht-auto"
#else
#define IMPL_HELP "comma list of chain,lfht,lfht-auto (built without HotRing)"
#endif

static const ib_impl *const all_impls[] = {
#ifdef KV_BENCH_HAVE_HOTRING
    &ib_hotring_s_impl, &ib_hotring_r_impl,
#endif
    &ib_chain_impl,     &ib_lfht_impl,      &ib_lfht_auto_impl,
};
#define NALL (sizeof(all_impls) / sizeof(all_impls[0]))

static const char *const workload_choices[] = {"A", "B", "C", "D", "F", NULL};
static const char *const dist_choices[] = {"uniform", "zipf", "hotspot", "latest", NULL};
static const wl_dist dist_map[] = {WL_UNIFORM, WL_ZIPF, WL_HOTSPOT, WL_LATEST};

static kv_err parse_impls(ib_opts *o, char *err, size_t errlen)
{
    char *list = strdup(o->impl_list), *save = NULL;
    if (!list)
        return KV_RESOURCE_EXHAUSTED;
    o->nimpls = 0;
    for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        const ib_impl *found = NULL;
        for (size_t i = 0; i < NALL; i++)
            if (strcmp(all_impls[i]->name, t) == 0)
                found = all_impls[i];
        if (!found || o->nimpls == IB_MAX_IMPLS) {
            char names[256] = "";
            for (size_t i = 0; i < NALL; i++)
                snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", i ? "," : "",
                         all_impls[i]->name);
            snprintf(err, errlen, "--impl: '%s' is not available (built: %s)", t, names);
            free(list);
            return KV_INVALID_ARGUMENT;
        }
        o->impls[o->nimpls++] = found;
    }
    free(list);
    if (o->nimpls == 0) {
        snprintf(err, errlen, "--impl: empty list");
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

static kv_err check_opts(ib_opts *o, char *err, size_t errlen)
{
    if (o->seconds <= 0 || o->seconds > 3600) {
        snprintf(err, errlen, "--seconds must be in (0, 3600]");
        return KV_INVALID_ARGUMENT;
    }
    if (o->shift_at < 0 || (o->shift_at > 0 && o->shift_at >= o->seconds)) {
        snprintf(err, errlen, "--shift-at must be 0 (off) or below --seconds");
        return KV_INVALID_ARGUMENT;
    }
    if (o->warmup < 0 || o->warmup > 3600 || (o->warmup > 0 && o->shift_at > 0)) {
        snprintf(err, errlen, "--warmup must be in [0, 3600] and cannot go with --shift-at");
        return KV_INVALID_ARGUMENT;
    }
    if (o->shift_at > 0 && o->rounds > 1) {
        snprintf(err, errlen, "--shift-at needs --rounds 1");
        return KV_INVALID_ARGUMENT;
    }
    o->wl.workload = (wl_workload)o->workload_idx;
    o->wl.dist = dist_map[o->dist_idx];
    if (o->wl.dist == WL_ZIPF && o->scramble)
        o->wl.dist = WL_SCRAMBLED_ZIPF;
    o->wl.keys = (uint64_t)o->keys;
    o->wl.seed = (uint64_t)o->seed;
    o->wl.scramble = (uint64_t)o->seed * 31 + 7;
    uint64_t b = 1, want = (uint64_t)(o->keys / o->ratio);
    while (b < want)
        b <<= 1;
    o->buckets = b;
    return parse_impls(o, err, errlen);
}

/* Parses argv into o; returns KV_CANCELLED after --help. */
static kv_err parse_opts(ib_opts *o, int argc, char **argv)
{
    const kv_opt table[] = {
        {"impl", KV_OPT_STR, &o->impl_list, IMPL_HELP},
        {"workload", KV_OPT_ENUM, &o->workload_idx, "YCSB workload", workload_choices},
        {"dist", KV_OPT_ENUM, &o->dist_idx, "key distribution", dist_choices},
        {"theta", KV_OPT_DOUBLE, &o->wl.theta, "zipfian skew"},
        {"hot-pct", KV_OPT_DOUBLE, &o->wl.hot_pct, "hotspot: percent of keys in the hot set"},
        {"scramble", KV_OPT_BOOL, &o->scramble, "zipf: spread hot ranks over the keys (YCSB)"},
        {"keys", KV_OPT_INT, &o->keys, "records loaded", NULL, 1, 1L << 32},
        {"ratio", KV_OPT_INT, &o->ratio, "keys per bucket (buckets = keys / ratio)", NULL, 1,
         1L << 20},
        {"threads", KV_OPT_INT, &o->threads, "worker threads", NULL, 1, 256},
        {"seconds", KV_OPT_DOUBLE, &o->seconds, "timed phase per index"},
        {"warmup", KV_OPT_DOUBLE, &o->warmup,
         "untimed run of the workload per index after the loads, before the timed phases"},
        {"value-size", KV_OPT_INT, &o->value_size, "value bytes", NULL, 1, 65536},
        {"rehash", KV_OPT_BOOL, &o->rehash, "hotring: lock-free rehash"},
        {"rehash-cost", KV_OPT_DOUBLE, &o->rehash_cost, "hotring: rehash trigger (0 = default)"},
        {"hr-r", KV_OPT_INT, &o->hr_r, "hotring: access period R", NULL, 1, 1 << 20},
        {"shift-at", KV_OPT_DOUBLE, &o->shift_at, "second at which the hot set moves (0 = off)"},
        {"miss-ratio", KV_OPT_DOUBLE, &o->wl.miss_ratio, "share of reads for absent keys"},
        {"seed", KV_OPT_INT, &o->seed, "PRNG seed", NULL, 0, 1L << 62},
        {"trace-ops", KV_OPT_INT, &o->trace_ops, "pre-drawn ops per thread", NULL, 1024, 1L << 28},
        {"lfht-init", KV_OPT_INT, &o->lfht_init,
         "lfht-auto: initial buckets, grown by liburcu during the load (0 = keys / ratio / 8)",
         NULL, 0, 1L << 40},
        {"rounds", KV_OPT_INT, &o->rounds,
         "interleave the indexes' timed phases in this many rounds (all loaded at once)", NULL, 1,
         IB_MAX_ROUNDS},
        {"batch", KV_OPT_INT, &o->batch,
         "hand up to this many consecutive reads to an index's batched get (indexes without "
         "one read key by key)",
         NULL, 1, IB_MAX_BATCH},
        {"series-ms", KV_OPT_INT, &o->series_ms, "series interval with --shift-at", NULL, 10,
         10000},
    };
    kv_optset set = {table, sizeof(table) / sizeof(table[0]), NULL, "index_bench", NULL};
    char err[512] = "";
    kv_err rv = kv_opts_parse(&set, argc, argv, NULL, err, sizeof(err));
    if (rv == KV_OK)
        rv = check_opts(o, err, sizeof(err));
    if (rv != KV_OK && rv != KV_CANCELLED)
        fprintf(stderr, "index_bench: %s\n", err);
    kv_opts_free(&set); /* --impl was resolved to the static tables above */
    o->impl_list = NULL;
    return rv;
}

static void default_opts(ib_opts *o)
{
    memset(o, 0, sizeof(*o));
    wl_config_default(&o->wl);
#ifdef KV_BENCH_HAVE_HOTRING
    o->impl_list = "hotring-s,chain,lfht";
#else
    o->impl_list = "chain,lfht";
#endif
    o->workload_idx = WL_C;
    o->dist_idx = 1; /* zipf */
    o->wl.theta = 0.99;
    o->wl.hot_pct = 5.0;
    o->scramble = true;
    o->keys = 4000000;
    o->ratio = 8;
    o->threads = 2;
    o->seconds = 5.0;
    o->value_size = 8;
    o->hr_r = 5;
    o->seed = 1;
    o->trace_ops = 1L << 21;
    o->series_ms = 100;
    o->lfht_init = 0;
    o->rounds = 1;
    o->batch = 1;
}

/* Pre-draws every thread's trace: phase 0, and with a shift phase 1 over the
 * key space rotated by keys / 2. */
static kv_err make_traces(ib_opts *o, ib_traces *tr)
{
    char err[256] = "";
    kv_err rv;
    wl_model m;
    memset(tr, 0, sizeof(*tr));
    for (int phase = 0; phase < (o->shift_at > 0 ? 2 : 1); phase++) {
        wl_config c = o->wl;
        c.offset = phase ? c.keys / 2 : 0;
        if ((rv = wl_model_init(&m, &c, err, sizeof(err))) != KV_OK) {
            fprintf(stderr, "index_bench: %s\n", err);
            return rv;
        }
        if (phase == 0)
            o->wl.dist = m.cfg.dist; /* D reads with "latest" */
        tr->ops[phase] = calloc((size_t)o->threads, sizeof(wl_op *));
        if (!tr->ops[phase])
            return KV_RESOURCE_EXHAUSTED;
        for (long t = 0; t < o->threads; t++)
            if ((rv = wl_trace_make(&m, (unsigned)t, (unsigned)o->threads, (size_t)o->trace_ops,
                                    &tr->ops[phase][t])) != KV_OK)
                return rv;
    }
    tr->phases = o->shift_at > 0 ? 2 : 1;
    tr->n = (size_t)o->trace_ops;
    return wl_load_order(o->wl.keys, o->wl.seed, &tr->order);
}

static void free_traces(const ib_opts *o, ib_traces *tr)
{
    for (int p = 0; p < tr->phases; p++) {
        for (long t = 0; tr->ops[p] && t < o->threads; t++)
            free(tr->ops[p][t]);
        free(tr->ops[p]);
    }
    free(tr->order);
}

/* One index at a time (load, measure, close), or with --rounds R every index
 * loaded first and the timed phases interleaved: round r runs each index for
 * seconds / R, so a change in the machine's load hits all of them alike. */
static int run_all(const ib_opts *o, const ib_traces *tr, ib_result *res)
{
    static ib_state st[IB_MAX_IMPLS];
    int loaded = o->rounds > 1 ? o->nimpls : 1;
    kv_err rv = KV_OK;
    for (int i = 0; i < o->nimpls && rv == KV_OK; i += loaded) {
        int n = i + loaded < o->nimpls ? loaded : o->nimpls - i, k = 0;
        for (; k < n && rv == KV_OK; k++)
            if ((rv = ib_load(o, tr, o->impls[i + k], &st[i + k])) != KV_OK)
                fprintf(stderr, "index_bench: %s: %s\n", o->impls[i + k]->name, kv_strerror(rv));
        if (rv != KV_OK) {
            for (int j = 0; j < k - 1; j++)
                o->impls[i + j]->close(st[i + j].h);
            return 1;
        }
        for (int j = 0; o->warmup > 0 && j < n; j++) /* measured, then forgotten */
            ib_warmup(o, tr, &st[i + j], o->warmup);
        for (long r = 0; r < o->rounds; r++)
            for (int j = 0; j < n; j++)
                ib_measure(o, tr, &st[i + j], o->seconds / (double)o->rounds);
        for (int j = 0; j < n; j++) {
            ib_finish(o, &st[i + j], &res[i + j]);
            ib_print_result(o, &res[i + j]);
            free(res[i + j].series);
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    ib_opts o;
    default_opts(&o);
    kv_err rv = parse_opts(&o, argc, argv);
    if (rv == KV_CANCELLED)
        return 0;
    if (rv != KV_OK)
        return 2;
    /* Fixed mmap threshold: big arrays always come from mmap, which lets the
     * lfht-auto adaptor measure its bucket arrays (see lfht.c). */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    /* The main thread opens, settles and closes the indexes; closing an lfht
     * walks it under an RCU read lock, which needs a registered reader. */
    urcu_memb_register_thread();
    ib_traces tr;
    uint64_t t0 = kv_now_ns();
    if ((rv = make_traces(&o, &tr)) != KV_OK) {
        fprintf(stderr, "index_bench: traces: %s\n", kv_strerror(rv));
        return 1;
    }
    KV_INFO(MOD, "traces: %ld threads x %ld ops x %d phase(s) in %.2f s", o.threads, o.trace_ops,
            tr.phases, (double)(kv_now_ns() - t0) / 1e9);
    ib_result res[IB_MAX_IMPLS];
    int rc = run_all(&o, &tr, res);
    if (rc == 0)
        ib_print_summary(&o, res);
    free_traces(&o, &tr);
    urcu_memb_unregister_thread();
    return rc;
}
