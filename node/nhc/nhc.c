/* SPDX-License-Identifier: MIT */
/*
 * The NHC runtime wrapper the node uses (Orthus, FAST'21, §3.2): read-path
 * counters, the load_admit routing decision and the periodic tick that turns
 * a window of counters into an nhc_sample for the controller (nhc_ctl.c).
 *
 * Concurrency design. The read path (nhc_note_read, nhc_note_miss,
 * nhc_send_to_fd, nhc_data_admit) is lock-free and wait-free: it does relaxed
 * atomic fetch-adds on per-volume latency histograms and a miss counter, and
 * relaxed loads of the two published knobs; the routing PRNG is per thread
 * (xorshift64*, seeded once per thread from a global counter by splitmix64).
 * Relaxed ordering suffices: the knobs are independent hints (a read routed
 * with a knob value one window old is harmless) and counters only need
 * atomicity, not ordering. nhc_tick drains the counters with atomic exchanges
 * (an increment racing with the drain lands in this window or the next, never
 * lost), steps the controller and stores the knobs; it and the stats readers
 * serialise on a mutex that the read path never touches.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "node/nhc/nhc.h"

#define PPM 1000000u
#define SEC_NS 1000000000ull
/* Log-linear latency buckets: 8 sub-buckets per power of two (<= 12.5% wide). */
#define SUB_BITS 3
#define SUB (1u << SUB_BITS)
#define NBUCKETS ((64 - SUB_BITS + 1) * SUB)

typedef struct dev_ctr {
    _Alignas(64) _Atomic uint64_t lat_sum;
    _Atomic uint64_t hist[NBUCKETS];
} dev_ctr;

struct nhc {
    dev_ctr dev[2];
    _Alignas(64) _Atomic uint64_t misses;
    _Alignas(64) _Atomic uint32_t la_ppm;
    _Atomic bool data_admit;
    /* Below: guarded by mu (tick and stats readers only). */
    _Alignas(64) pthread_mutex_t mu;
    nhc_ctl *ctl;
    bool enabled, forced;
    bool resume;      /* unforced since the last tick: the window is not the controller's */
    nhc_decision dec; /* the knobs in force (the controller's, or forced) */
    uint64_t win_start, last_tick, next_point;
    nhc_stats st;
    nhc_point series[NHC_SERIES_LEN];
    size_t series_head, series_len;
};

static _Atomic uint64_t g_seed = 0x9e3779b97f4a7c15ull;
static _Thread_local uint64_t tl_rng;

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rng_next(void)
{
    uint64_t x = tl_rng;
    if (x == 0) {
        x = splitmix64(
            atomic_fetch_add_explicit(&g_seed, 0x632be59bd9b4e019ull, memory_order_relaxed));
        x |= 1; /* xorshift state must be non-zero */
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    tl_rng = x;
    return x * 0x2545f4914f6cdd1dull;
}

static unsigned bucket_of(uint64_t v)
{
    if (v < SUB)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* e >= SUB_BITS */
    unsigned sub = (unsigned)(v >> (e - SUB_BITS)) & (SUB - 1);
    return (e - SUB_BITS + 1) * SUB + sub;
}

/* Largest value that falls into bucket b. */
static uint64_t bucket_max(unsigned b)
{
    if (b < SUB)
        return b;
    unsigned e = b / SUB + SUB_BITS - 1, sub = b % SUB;
    uint64_t lo = (uint64_t)(SUB + sub) << (e - SUB_BITS);
    return lo + ((uint64_t)1 << (e - SUB_BITS)) - 1;
}

static void publish(nhc *n)
{
    atomic_store_explicit(&n->la_ppm, (uint32_t)(n->dec.load_admit * PPM + 0.5),
                          memory_order_relaxed);
    atomic_store_explicit(&n->data_admit, n->dec.data_admit, memory_order_relaxed);
}

kv_err nhc_create(const nhc_opts *opts, uint64_t now_ns, nhc **out)
{
    nhc_opts o;
    kv_err rv;
    nhc_ctl *ctl;

    if (opts)
        o = *opts;
    else
        nhc_opts_default(&o);
    if ((rv = nhc_ctl_create(&o, &ctl)) != KV_OK)
        return rv;
    nhc *n = aligned_alloc(64, (sizeof(*n) + 63) & ~(size_t)63);
    if (!n) {
        nhc_ctl_destroy(ctl);
        return KV_RESOURCE_EXHAUSTED;
    }
    memset(n, 0, sizeof(*n));
    if (pthread_mutex_init(&n->mu, NULL) != 0) {
        free(n);
        nhc_ctl_destroy(ctl);
        return KV_RESOURCE_EXHAUSTED;
    }
    n->ctl = ctl;
    n->enabled = o.enable;
    n->dec = nhc_ctl_decision(ctl);
    n->win_start = n->last_tick = now_ns;
    n->next_point = now_ns + SEC_NS;
    publish(n);
    *out = n;
    return KV_OK;
}

void nhc_destroy(nhc *n)
{
    if (!n)
        return;
    pthread_mutex_destroy(&n->mu);
    nhc_ctl_destroy(n->ctl);
    free(n);
}

void nhc_note_read(nhc *n, nhc_dev dev, uint64_t latency_ns)
{
    dev_ctr *d = &n->dev[dev == NHC_DEV_SD];
    atomic_fetch_add_explicit(&d->hist[bucket_of(latency_ns)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->lat_sum, latency_ns, memory_order_relaxed);
}

void nhc_note_miss(nhc *n)
{
    atomic_fetch_add_explicit(&n->misses, 1, memory_order_relaxed);
}

bool nhc_send_to_fd(nhc *n)
{
    uint32_t la = atomic_load_explicit(&n->la_ppm, memory_order_relaxed);
    if (la >= PPM)
        return true;
    if (la == 0)
        return false;
    return ((rng_next() >> 32) * PPM >> 32) < la;
}

bool nhc_data_admit(const nhc *n)
{
    return atomic_load_explicit(&((nhc *)n)->data_admit, memory_order_relaxed);
}

double nhc_load_admit(const nhc *n)
{
    return (double)atomic_load_explicit(&((nhc *)n)->la_ppm, memory_order_relaxed) / PPM;
}

/* p99 of a histogram holding `total` values (bucket upper bound). */
static uint64_t hist_p99(const uint64_t *h, uint64_t total)
{
    if (total == 0)
        return 0;
    uint64_t rank = total - total / 100, seen = 0; /* ceil(0.99 * total) */
    for (unsigned b = 0; b < NBUCKETS; b++) {
        seen += h[b];
        if (seen >= rank)
            return bucket_max(b);
    }
    return bucket_max(NBUCKETS - 1);
}

/* Drains one volume's counters into its stats and adds them to merged. */
static void drain_dev(dev_ctr *d, uint64_t win_ns, nhc_dev_stats *out, uint64_t *merged)
{
    static _Thread_local uint64_t h[NBUCKETS];
    uint64_t total = 0;
    for (unsigned b = 0; b < NBUCKETS; b++) {
        h[b] = atomic_exchange_explicit(&d->hist[b], 0, memory_order_relaxed);
        merged[b] += h[b];
        total += h[b];
    }
    uint64_t sum = atomic_exchange_explicit(&d->lat_sum, 0, memory_order_relaxed);
    out->reads = total;
    out->ops_per_sec = (double)total * 1e9 / (double)win_ns;
    out->mean_ns = total ? sum / total : 0;
    out->p99_ns = hist_p99(h, total);
}

/* Closes the window [win_start, now): builds the sample and, when `step`,
 * steps the controller with it and applies its decision. mu held. */
static kv_err close_window(nhc *n, uint64_t now_ns, bool step)
{
    static _Thread_local uint64_t merged[NBUCKETS];
    uint64_t win = now_ns - n->win_start;
    nhc_sample s = {.window_ns = win};
    kv_err rv;

    memset(merged, 0, sizeof(merged));
    drain_dev(&n->dev[0], win, &n->st.dev[0], merged);
    drain_dev(&n->dev[1], win, &n->st.dev[1], merged);
    uint64_t misses = atomic_exchange_explicit(&n->misses, 0, memory_order_relaxed);
    s.ops = n->st.dev[0].reads + n->st.dev[1].reads;
    s.p99_ns = hist_p99(merged, s.ops);
    s.miss_ratio = s.ops ? (double)(misses > s.ops ? s.ops : misses) / (double)s.ops : 0.0;
    if (!n->dec.data_admit)
        n->st.data_admit_off_ns += win;
    if (n->dec.load_admit < 1.0)
        n->st.load_admit_below_one_ns += win;
    if (step) {
        nhc_decision d;
        if ((rv = nhc_step(n->ctl, &s, &d)) != KV_OK)
            return rv;
        n->st.tuning_entries += n->dec.state == NHC_STATE_CLASSIC && d.state == NHC_STATE_TUNING;
        n->dec = d;
        publish(n);
    }
    n->st.miss_ratio = s.miss_ratio;
    n->st.ops_per_sec = (double)s.ops * 1e9 / (double)win;
    n->st.p99_ns = s.p99_ns;
    n->st.window_ns = win;
    n->st.windows++;
    n->win_start = now_ns;
    return KV_OK;
}

static void add_point(nhc *n, uint64_t now_ns)
{
    size_t at = (n->series_head + n->series_len) % NHC_SERIES_LEN;
    n->series[at] = (nhc_point){.t_ns = now_ns,
                                .state = n->dec.state,
                                .load_admit = n->dec.load_admit,
                                .miss_ratio = n->st.miss_ratio,
                                .ops_per_sec = n->st.ops_per_sec};
    if (n->series_len < NHC_SERIES_LEN)
        n->series_len++;
    else
        n->series_head = (n->series_head + 1) % NHC_SERIES_LEN;
    n->next_point += SEC_NS;
    if (n->next_point <= now_ns) /* ticks stalled: resume one second from now */
        n->next_point = now_ns + SEC_NS;
}

kv_err nhc_tick(nhc *n, uint64_t now_ns)
{
    kv_err rv = KV_OK;

    pthread_mutex_lock(&n->mu);
    if (now_ns < n->last_tick) {
        pthread_mutex_unlock(&n->mu);
        return KV_INVALID_ARGUMENT;
    }
    n->last_tick = now_ns;
    if (n->resume && now_ns > n->win_start) /* it ran (partly) under forced knobs */
        rv = close_window(n, now_ns, false);
    else if (now_ns - n->win_start >= n->dec.next_window_ns)
        rv = close_window(n, now_ns, !n->forced);
    n->resume = false;
    if (rv == KV_OK && now_ns >= n->next_point)
        add_point(n, now_ns);
    pthread_mutex_unlock(&n->mu);
    return rv;
}

void nhc_force(nhc *n, double load_admit, bool data_admit)
{
    pthread_mutex_lock(&n->mu);
    n->forced = true;
    n->dec.load_admit = load_admit < 0 ? 0 : load_admit > 1 ? 1 : load_admit;
    n->dec.data_admit = data_admit;
    publish(n);
    pthread_mutex_unlock(&n->mu);
}

void nhc_unforce(nhc *n)
{
    pthread_mutex_lock(&n->mu);
    n->resume = n->forced;
    n->forced = false;
    n->dec = nhc_ctl_decision(n->ctl);
    publish(n);
    pthread_mutex_unlock(&n->mu);
}

void nhc_get_stats(nhc *n, nhc_stats *out)
{
    pthread_mutex_lock(&n->mu);
    *out = n->st;
    out->enabled = n->enabled;
    out->forced = n->forced;
    out->state = n->dec.state;
    out->data_admit = n->dec.data_admit;
    out->load_admit = n->dec.load_admit;
    pthread_mutex_unlock(&n->mu);
}

size_t nhc_get_series(nhc *n, nhc_point *out, size_t cap)
{
    pthread_mutex_lock(&n->mu);
    size_t k = n->series_len < cap ? n->series_len : cap;
    size_t skip = n->series_len - k; /* keep the newest k */
    for (size_t i = 0; i < k; i++)
        out[i] = n->series[(n->series_head + skip + i) % NHC_SERIES_LEN];
    pthread_mutex_unlock(&n->mu);
    return k;
}
