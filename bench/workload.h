/* SPDX-License-Identifier: MIT */
/*
 * YCSB-style workload generator shared by every hotkv benchmark (index_bench
 * now, tier_bench and kvbench later). A workload is an op mix (YCSB A, B, C,
 * D, F) over a key distribution (uniform, zipfian with theta, YCSB's scrambled
 * zipfian, hotspot-x%, latest). Key ids are integers: ids [0, keys) are the
 * records loaded before the run, ids from `keys` up are inserted by workload
 * D, and ids with WL_MISS_BIT set are never inserted (reads of absent keys).
 * The key helpers turn an id into an 8-byte binary key (DESIGN.md §6) or the
 * YCSB-like string "key%012d".
 *
 * A wl_model holds what all threads share (the zipfian constants, computed
 * once) and is read-only after wl_model_init(); each thread owns a wl_gen with
 * its own PRNG (xoshiro256**, seeded by splitmix64 from the seed and the
 * thread index), so a run is deterministic for a given seed and thread count.
 * Benchmarks pre-draw a trace of ops per thread with wl_trace_make() so that
 * generation costs nothing in the timed phase.
 */
#ifndef KV_BENCH_WORKLOAD_H
#define KV_BENCH_WORKLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

/* ---- PRNG ---------------------------------------------------------------- */

typedef struct wl_rng {
    uint64_t s[4];
} wl_rng;

/* Seeds r from (seed, stream): different streams give independent sequences. */
void wl_rng_seed(wl_rng *r, uint64_t seed, uint64_t stream);

static inline uint64_t wl_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman & Vigna): the next 64 random bits. */
static inline uint64_t wl_rng_next(wl_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = wl_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = wl_rotl(s[3], 45);
    return out;
}

/* Uniform double in [0, 1). */
static inline double wl_rng_double(wl_rng *r)
{
    return (double)(wl_rng_next(r) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [0, n) by Lemire's multiply-shift (n > 0). */
static inline uint64_t wl_rng_below(wl_rng *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)wl_rng_next(r) * n) >> 64);
}

/* ---- zipfian (YCSB ZipfianGenerator, after Gray et al., SIGMOD'94) ------- */

typedef struct wl_zipf {
    uint64_t n;   /* items: ranks are [0, n) */
    double theta; /* skew, > 0 and != 1 */
    double alpha, zeta2, zetan, eta;
} wl_zipf;

/* zeta(n, theta) = sum_{i=1..n} 1 / i^theta. */
double wl_zeta(uint64_t n, double theta);
/* Computes the constants for n items (O(n) for zeta). INVALID_ARGUMENT when
 * n == 0 or theta is not in (0, 1) U (1, 10]. */
kv_err wl_zipf_init(wl_zipf *z, uint64_t n, double theta);
/* Extends z to n' >= z->n items, adding only the new zeta terms (YCSB does
 * the same when the item count grows). */
void wl_zipf_grow(wl_zipf *z, uint64_t n);
/* A rank in [0, n): rank 0 is the most popular. */
uint64_t wl_zipf_next(const wl_zipf *z, wl_rng *r);
/* Exact probability of rank k (for tests and reports). */
double wl_zipf_prob(const wl_zipf *z, uint64_t k);

/* ---- workloads ------------------------------------------------------------ */

typedef enum wl_workload { WL_A, WL_B, WL_C, WL_D, WL_F, WL_NWORKLOADS } wl_workload;

typedef enum wl_dist {
    WL_UNIFORM,
    WL_ZIPF,           /* plain zipfian: rank r is id r */
    WL_SCRAMBLED_ZIPF, /* YCSB: id = hash(rank) mod keys, hot ids spread out */
    WL_HOTSPOT,        /* hot_pct% of ids get (100 - hot_pct)% of accesses */
    WL_LATEST,         /* zipfian over recency: the newest id is the hottest */
    WL_NDISTS
} wl_dist;

typedef enum wl_optype { WL_OP_READ, WL_OP_UPDATE, WL_OP_INSERT, WL_OP_RMW } wl_optype;

/* Bit set in ids of keys that are never inserted (see miss_ratio). */
#define WL_MISS_BIT (UINT64_C(1) << 62)

typedef struct wl_op {
    uint64_t key;  /* key id */
    uint32_t type; /* wl_optype */
} wl_op;

typedef struct wl_config {
    wl_workload workload;
    wl_dist dist;      /* WL_D always reads with WL_LATEST */
    uint64_t keys;     /* records loaded before the run: ids [0, keys) */
    double theta;      /* zipfian and latest skew (YCSB default 0.99) */
    double hot_pct;    /* hotspot: percent of ids in the hot set, (0, 100) */
    uint64_t scramble; /* scrambled zipfian: hash seed */
    uint64_t offset;   /* rotates drawn ids: id = (id + offset) mod keys (hot-set shift) */
    double miss_ratio; /* share of reads that ask for a never-inserted id */
    uint64_t seed;     /* PRNG seed */
} wl_config;

/* Fills c with YCSB's defaults: workload C, zipfian 0.99, hotspot 20%. */
void wl_config_default(wl_config *c);

/* The read-only part shared by all threads. */
typedef struct wl_model {
    wl_config cfg;
    wl_zipf zipf;                     /* over keys (zipf, scrambled zipf, latest) */
    double read, update, insert, rmw; /* op mix, sums to 1 */
} wl_model;

/* Validates c and precomputes the distribution (O(keys) for zipfian).
 * Returns INVALID_ARGUMENT with a message in err for bad parameters. */
kv_err wl_model_init(wl_model *m, const wl_config *c, char *err, size_t errlen);

/* One thread's generator. Inserts of thread t of T use ids keys + t + k*T,
 * so threads never insert the same id; the latest distribution of a thread
 * sees the record count as keys + (its inserts) * T. */
typedef struct wl_gen {
    const wl_model *m;
    wl_rng rng;
    wl_zipf latest; /* grows with the inserts (WL_LATEST only) */
    uint64_t inserted;
    unsigned thread, nthreads;
} wl_gen;

void wl_gen_init(wl_gen *g, const wl_model *m, unsigned thread, unsigned nthreads);
wl_op wl_gen_next(wl_gen *g);
/* Draws only a key id of the model's distribution (no op mix, no misses). */
uint64_t wl_gen_key(wl_gen *g);

/* Pre-draws n ops of thread `thread` of `nthreads` into a new array (free()
 * it). RESOURCE_EXHAUSTED when memory is short; *out untouched then. */
kv_err wl_trace_make(const wl_model *m, unsigned thread, unsigned nthreads, size_t n, wl_op **out);

/* A random permutation of [0, keys), the order in which to load records so
 * that allocation order says nothing about popularity. free() it. */
kv_err wl_load_order(uint64_t keys, uint64_t seed, uint64_t **out);

/* ---- names and keys --------------------------------------------------------- */

const char *wl_workload_name(wl_workload w); /* "A".."F" */
const char *wl_dist_name(wl_dist d);         /* "uniform", "zipf", ... */
const char *wl_op_name(wl_optype t);         /* "read", "update", ... */
/* Parses "A".."F" (any case) / a distribution name; -1 when unknown. */
int wl_workload_parse(const char *s);
int wl_dist_parse(const char *s);

#define WL_KEY8_LEN 8
/* The 8-byte binary key of id: big-endian, so byte order sorts like ids. */
static inline void wl_key8(uint64_t id, unsigned char out[WL_KEY8_LEN])
{
    for (int i = 7; i >= 0; i--) {
        out[i] = (unsigned char)id;
        id >>= 8;
    }
}
static inline uint64_t wl_key8_id(const unsigned char in[WL_KEY8_LEN])
{
    uint64_t id = 0;
    for (int i = 0; i < 8; i++)
        id = (id << 8) | in[i];
    return id;
}

#define WL_KEYSTR_MAX 32
/* Writes "key%012d" of id (NUL-terminated) into buf of len bytes; returns the
 * key length without the NUL, or 0 when buf is too small. */
size_t wl_key_str(uint64_t id, char *buf, size_t len);

#endif
