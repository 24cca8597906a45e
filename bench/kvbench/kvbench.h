/* SPDX-License-Identifier: MIT */
/*
 * kvbench internals shared by its three files: the options (kvbench.c), the
 * worker threads that keep --concurrency async requests in flight through
 * libkvclient (kvb_run.c), and the per-thread statistics merged at the end
 * (kvb_stats.c): a log-bucket latency histogram and an exact key-count map.
 * Every statistic is written by one worker thread only; the completion
 * callbacks (library threads) only hand finished requests back to their
 * worker through a lock-free stack.
 */
#ifndef KV_BENCH_KVBENCH_H
#define KV_BENCH_KVBENCH_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "proto/rpc_sec.h"
#include "bench/workload.h"
#include "kv/kv.h"

#define KVB_MAX_ROUTERS 16
#define KVB_NCODES 17  /* kv_err codes 0..16 */
#define KVB_NOPTYPES 4 /* wl_optype: read, update, insert, rmw */

/* ---- options ------------------------------------------------------------- */

typedef struct kvb_opts {
    char *routers; /* --router A[,B] as given */
    int workload_idx;
    char *dist; /* uniform | zipf | hotspotX */
    long keys, value_size, threads, concurrency, report_top, timeout_ms, trace_ops, seed, max_ops;
    long rpc_threads; /* nng callback threads (0 = rpc_runtime_default_threads) */
    double theta, seconds, shift_at, load_seconds;
    bool load;
    bool direct;    /* smart client: straight to each key's replica (kv_client_opts.direct) */
    rpc_sec sec;    /* --auth*, --admin-auth*, --tls-* (parsed, then copied below) */
    char *timeline; /* --timeline FILE (NULL = off) */
    long timeline_ms;
    /* derived by check_opts() */
    wl_config wl;
    char router[KVB_MAX_ROUTERS][256];
    int nrouters;
    char auth_buf[256];    /* data token, "" = none */
    char map_buf[256];     /* --direct: the map key (--map-key-file), "" = none */
    char admin_buf[256];   /* admin token, "" = none */
    char tls_buf[3][1024]; /* --tls-cert, --tls-key, --tls-ca ("" = none) */
    char dist_buf[32];
    char timeline_buf[1024];
} kvb_opts;

/* ---- statistics (kvb_stats.c) --------------------------------------------- */

/* HDR-style histogram of nanoseconds: values below 64 exactly, above that 64
 * sub-buckets per power of two (relative error under 1.6 %). */
#define KVB_HIST_SUB 64
#define KVB_HIST_BUCKETS (59 * KVB_HIST_SUB)

typedef struct kvb_hist {
    uint64_t n, sum, max;
    uint64_t b[KVB_HIST_BUCKETS];
} kvb_hist;

void kvb_hist_add(kvb_hist *h, uint64_t ns);
void kvb_hist_merge(kvb_hist *into, const kvb_hist *h);
/* The q-quantile (0 < q <= 1) in microseconds; 0 for an empty histogram. */
double kvb_hist_quantile_us(const kvb_hist *h, double q);
/* The value bucket i stands for (the middle of its range), in microseconds. */
double kvb_hist_bucket_us(unsigned i);

/* Exact access counts per key id: open addressing, grown at half load. */
typedef struct kvb_counts {
    uint64_t *ids; /* id + 1; 0 = empty */
    uint64_t *cnt;
    size_t cap, n;
    bool oom; /* an insert failed for lack of memory: counts are incomplete */
} kvb_counts;

void kvb_counts_add(kvb_counts *m, uint64_t id, uint64_t by);
void kvb_counts_merge(kvb_counts *into, const kvb_counts *m);
void kvb_counts_free(kvb_counts *m);
/* Prints `"name":[{"key":..,"count":..},...]` with the k largest counts,
 * by count descending then key ascending. */
void kvb_print_top(FILE *f, const char *name, const kvb_counts *m, long k);

/* ---- workers (kvb_run.c) ----------------------------------------------------- */

typedef struct kvb_worker kvb_worker;
typedef struct kvb_tl_bin kvb_tl_bin;

/* One request slot of a worker: at most one request in flight per slot. */
typedef struct kvb_slot {
    kvb_worker *w;
    struct kvb_slot *next; /* completion stack link */
    uint64_t start_ns, end_ns, key;
    uint32_t type;  /* wl_optype */
    uint32_t stage; /* RMW: 0 = the read, 1 = the write */
    kv_err err;
    char msg[120]; /* error message copied by the callback */
    /* RESOURCE_EXHAUSTED (a server refused the request under overload): the
     * slot waits before its next op, backoff_ns doubling on each refusal in
     * a row; ready_ns is when it may send again (worker's deferred list) */
    uint64_t backoff_ns, ready_ns;
} kvb_slot;

/* What all workers share; times are set by main before the start barrier. */
typedef struct kvb_shared {
    const kvb_opts *o;
    const uint64_t *load_order; /* permutation of [0, keys) (NULL without --load) */
    uint64_t load_start_ns, load_end_ns, t0_ns, shift_ns, end_ns;
    pthread_barrier_t start;
    _Atomic int loaded, finished;
    _Atomic bool stop; /* SIGINT */
    /* --timeline (kvb_timeline.c): interval length and count, run start wall clock */
    uint64_t tl_ns, t0_wall_ms;
    size_t tl_n;
} kvb_shared;

struct kvb_worker {
    kvb_shared *sh;
    unsigned idx;
    kv_client *c;
    pthread_t tid;
    sem_t sem;                /* posted once per completion */
    _Atomic(kvb_slot *) done; /* completions not yet reaped (Treiber stack) */
    kvb_slot *slots;
    kvb_slot **deferred; /* slots backing off (RESOURCE_EXHAUSTED), ndeferred of them */
    size_t ndeferred;
    const wl_op *trace[2]; /* before / after the shift */
    size_t pos;
    int phase, inflight;
    bool loading;
    uint64_t load_pos, budget; /* budget: ops left under --ops (UINT64_MAX = none) */
    const uint8_t *value;
    /* statistics, written by this worker only */
    kvb_hist hist[KVB_NOPTYPES];
    kvb_counts counts[2];
    uint64_t codes[KVB_NCODES], not_found, load_errors, abandoned;
    uint64_t load_finish_ns, finish_ns;
    char first_error[200];
    kvb_tl_bin **tl; /* --timeline: per interval, allocated on first use */
    bool tl_oom;
    /* progress, read by main */
    _Atomic uint64_t ok_ops, err_ops, load_done;
};

/* Thread body: --load stripe (if set), start barrier, timed run. */
void *kvb_worker_main(void *arg);

/* ---- --timeline (kvb_timeline.c) ----------------------------------------------- */

/* Sets the interval length and count from the options and gives each worker
 * its interval table; called by main before the workers start. */
kv_err kvb_tl_init(kvb_shared *sh, kvb_worker *w, long nthreads);
/* Worker w's op that completed at end_ns (ok: its latency, else an error);
 * a no-op without --timeline. Called by w's thread only. */
void kvb_tl_add(kvb_worker *w, uint64_t end_ns, uint64_t latency_ns, bool ok);
/* Writes one JSON line per interval to f; after the workers were joined. */
kv_err kvb_tl_write(const kvb_shared *sh, kvb_worker *w, long nthreads, FILE *f);
/* Frees w's interval table (NULL table: no-op). */
void kvb_tl_free(kvb_worker *w);

#endif
