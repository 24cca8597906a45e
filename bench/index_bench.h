/* SPDX-License-Identifier: MIT */
/*
 * Internals of index_bench shared by its option handling (index_bench.c) and
 * its runner (index_run.c): the parsed options, the pre-drawn traces and one
 * implementation's result. Not a library interface.
 */
#ifndef KV_BENCH_INDEX_BENCH_H
#define KV_BENCH_INDEX_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/index_impl.h"
#include "bench/workload.h"

#define IB_MAX_IMPLS 8
#define IB_MAX_ROUNDS 64

typedef struct ib_opts {
    char *impl_list;
    const ib_impl *impls[IB_MAX_IMPLS];
    int nimpls;
    int workload_idx, dist_idx;
    bool scramble, rehash;
    long keys, ratio, threads, value_size, hr_r, seed, trace_ops, series_ms, lfht_init, rounds,
        batch; /* consecutive reads handed to get_batch at once (1 = off) */
    double seconds, shift_at, rehash_cost;
    double warmup;    /* untimed seconds per index after its load (0 = none) */
    wl_config wl;     /* the generator's view of the above */
    uint64_t buckets; /* keys / ratio rounded up to a power of two */
} ib_opts;

typedef struct ib_traces {
    wl_op **ops[2]; /* [phase][thread] -> n ops */
    int phases;     /* 2 with --shift-at */
    size_t n;
    uint64_t *order; /* load order: a permutation of [0, keys) */
} ib_traces;

typedef struct ib_sample {
    double t_ms, mops, head_hit; /* head_hit < 0: unknown */
} ib_sample;

typedef struct ib_result {
    const char *impl;
    double mops, seconds, load_s;
    double cpu_mops; /* ops per CPU-second of the workers x threads (load-independent) */
    uint64_t ops, reads, hits, bucket_bytes, item_bytes;
    uint64_t final_buckets;            /* the index's bucket count after the run (0: unknown) */
    long batch;                        /* reads per get_batch call (1: one get per read) */
    double visited_per_read, head_hit; /* < 0: the index cannot tell */
    ib_sample *series;                 /* with --shift-at; free() it */
    size_t nseries;
    double steady_head_hit, dip_head_hit, recover_ms; /* shift only; recover < 0: never */
    double round_mops[IB_MAX_ROUNDS];
    int nrounds;
} ib_result;

/* Counters summed over the workers of one timed phase. */
typedef struct ib_local {
    uint64_t ops, reads, hits, visited, head_hits;
    uint64_t cpu_ns;   /* the workers' thread CPU time */
    uint64_t meta_xor; /* consumes the metadata reads return (not reported) */
} ib_local;

/* One loaded index and what its timed phases measured so far. */
typedef struct ib_state {
    const ib_impl *impl;
    void *h;
    ib_result r;
    ib_local acc;
    ib_rstats racc;
} ib_state;

/* Opens impl and loads every key from the worker threads (then lets it
 * settle). On failure the index is closed. */
kv_err ib_load(const ib_opts *o, const ib_traces *tr, const ib_impl *impl, ib_state *st);
/* One timed phase of `seconds`, added to st. */
kv_err ib_measure(const ib_opts *o, const ib_traces *tr, ib_state *st, double seconds);
/* A phase of `seconds` that st does not count (a warm-up). */
kv_err ib_warmup(const ib_opts *o, const ib_traces *tr, ib_state *st, double seconds);
/* Computes the result, closes the index and copies the result to out. */
void ib_finish(const ib_opts *o, ib_state *st, ib_result *out);
/* One JSON line per result (and its series line), then the summary line. */
void ib_print_result(const ib_opts *o, const ib_result *r);
void ib_print_summary(const ib_opts *o, const ib_result *res);

#endif
