/* SPDX-License-Identifier: MIT */
/*
 * Hot-key detection for routers (issue 7): a Space-Saving top-K sketch
 * (Metwally, Agrawal, El Abbadi, "Efficient Computation of Frequent and Top-k
 * Elements in Data Streams", ICDT 2005) and a windowed wrapper holding one
 * sketch per forwarding thread.
 *
 * Sketch invariant, kept by every update and every merge: for each monitored
 * key, count - error <= true weight <= count; every key not monitored has a
 * true weight <= floor (hk_sketch_floor), and floor <= the smallest count
 * when the sketch is full. Rankings and reports use the guaranteed count
 * (count - error): a key that churned in from the long tail inherits the
 * evicted minimum as its error, so its guaranteed count stays tiny and it
 * never ranks above a key that is really hot.
 *
 * Merge (hk_sketch_merge) follows the mergeable-summaries rule of Agarwal et
 * al. (PODS 2012) in Space-Saving form: a key missing from one side is
 * credited that side's floor in both count and error, counts and errors are
 * summed, the K largest counts are kept, and the new floor is the larger of
 * the two floors' sum and the largest dropped count. The per-key interval
 * above therefore still holds for the union of both streams; the interval
 * width (error) grows by at most the floors of the merged sketches.
 */
#ifndef KV_SHARD_HOTKEYS_H
#define KV_SHARD_HOTKEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

#define HK_DEFAULT_K 1024u
#define HK_MAX_K (1u << 20)
#define HK_MAX_KEY 4096u /* longer keys are rejected, like on the wire */
/* What one admin.HotKeys report may hold (a node refuses more, node/hot.h):
 * a router sends each node at most its HK_REPORT_MAX_KEYS hottest keys,
 * with a window of at most HK_MAX_WINDOW_MS (--hot-window-ms). */
#define HK_REPORT_MAX_KEYS 8192u
#define HK_MAX_WINDOW_MS 60000u

typedef struct hk_sketch hk_sketch;

/* One monitored key. `key` points into the sketch and stays valid until the
 * next add, merge, reset or destroy of that sketch. */
typedef struct hk_entry {
    const uint8_t *key;
    size_t klen;
    uint64_t count;      /* upper bound of the key's weight */
    uint64_t error;      /* count - error is a lower bound */
    uint64_t guaranteed; /* count - error */
} hk_entry;

/* Creates an empty sketch monitoring at most k keys (0 → HK_DEFAULT_K).
 * Returns INVALID_ARGUMENT for k > HK_MAX_K, RESOURCE_EXHAUSTED when out of
 * memory. *out is owned by the caller (hk_sketch_destroy).
 *
 * Thread-safety of every hk_sketch_* function: none; a sketch belongs to one
 * thread at a time (hk_window gives each thread its own). */
kv_err hk_sketch_create(hk_sketch **out, size_t k);

/* Frees the sketch and its key copies; NULL is a no-op. */
void hk_sketch_destroy(hk_sketch *s);

/* Counts `weight` occurrences of key (copied; O(log K)). Returns
 * INVALID_ARGUMENT for len 0 or > HK_MAX_KEY or weight 0, and
 * RESOURCE_EXHAUSTED when a key copy cannot be allocated; the sketch is
 * unchanged on failure. */
kv_err hk_sketch_add(hk_sketch *s, const void *key, size_t len, uint64_t weight);

/* Writes up to max entries, best first: by guaranteed count descending, then
 * count descending, then key bytes. Returns the number written. Allocates
 * nothing. */
size_t hk_sketch_topk(const hk_sketch *s, hk_entry *out, size_t max);

/* Bounds for any key: monitored → its count and error; not monitored →
 * count = error = floor. Returns whether the key is monitored. */
bool hk_sketch_estimate(const hk_sketch *s, const void *key, size_t len, uint64_t *count,
                        uint64_t *error);

/* Merges src into dst (see the file comment for the bound kept); src is
 * unchanged. Returns INVALID_ARGUMENT if dst == src, RESOURCE_EXHAUSTED when
 * out of memory (dst unchanged). */
kv_err hk_sketch_merge(hk_sketch *dst, const hk_sketch *src);

/* Forgets every key (keeps the memory for reuse). */
void hk_sketch_reset(hk_sketch *s);

size_t hk_sketch_capacity(const hk_sketch *s); /* K */
size_t hk_sketch_size(const hk_sketch *s);     /* keys monitored */
uint64_t hk_sketch_total(const hk_sketch *s);  /* sum of all weights added */
uint64_t hk_sketch_floor(const hk_sketch *s);  /* bound for unmonitored keys */

/* ---- hk_window: per-thread sampling, merged at the end of each window ---- */

typedef struct hk_window hk_window;

/* One hot key of a finished window; counts are scaled by the sampling rate
 * so they estimate real accesses. */
typedef struct hk_item {
    uint8_t *key; /* owned by the report */
    size_t klen;
    uint64_t est_count;
    uint64_t error;
    uint64_t guaranteed;    /* est_count - error; the ranking key */
    double rate;            /* est_count / seconds */
    double guaranteed_rate; /* guaranteed / seconds */
} hk_item;

typedef struct hk_report {
    hk_item *items; /* sorted by guaranteed descending */
    size_t n;
    double seconds;     /* window length */
    uint64_t sampled;   /* keys sampled in the window, all threads */
    uint64_t total_est; /* estimated accesses in the window (sampled × rate) */
} hk_report;

/* Creates a window for nthreads forwarding threads (thread_idx 0..nthreads-1),
 * each with a sketch of k keys (0 → HK_DEFAULT_K), sampling on average one
 * key in sample_every (0 or 1 → every key) with a per-thread randomized
 * countdown, so periodic traffic is not aliased. now_ns starts the first
 * window (kv_now_ns()). Returns INVALID_ARGUMENT for nthreads 0 or a bad k,
 * RESOURCE_EXHAUSTED when out of memory. */
kv_err hk_window_create(hk_window **out, size_t nthreads, size_t k, uint32_t sample_every,
                        uint64_t now_ns);

/* Frees the window; NULL is a no-op. No thread may be sampling. */
void hk_window_destroy(hk_window *w);

/* Offers one accessed key. Only thread thread_idx may call it with that
 * index. The common path (not sampled) is a decrement of a thread-owned
 * counter, with no lock and no shared write; a sampled key takes the
 * thread's own mutex, contended only while hk_window_rotate swaps that
 * thread's sketch (O(1)). Keys of length 0 or > HK_MAX_KEY are ignored. */
void hk_window_sample(hk_window *w, size_t thread_idx, const void *key, size_t len);

/* Ends the current window at now_ns and starts the next: swaps every
 * thread's sketch for an empty one, merges them, and writes the best max
 * keys (0 → all monitored) to *out, which the caller releases with
 * hk_report_free. Thread-safe against samplers and other rotate calls.
 * Returns RESOURCE_EXHAUSTED when out of memory (that window is lost;
 * *out untouched). */
kv_err hk_window_rotate(hk_window *w, uint64_t now_ns, size_t max, hk_report *out);

/* Frees the items of a report and zeroes it; NULL is a no-op. */
void hk_report_free(hk_report *r);

#endif
