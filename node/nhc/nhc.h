/* SPDX-License-Identifier: MIT */
/*
 * NHC scheduler (non-hierarchical caching, Orthus, Wu et al., FAST'21): decides
 * whether records read from the slow volume (SD) are promoted to the fast
 * volume (FD) (`data_admit`) and which share of reads of records held on both
 * volumes is served by FD (`load_admit`). Two layers: a pure, deterministic
 * controller (nhc_ctl, nhc_step) fed with one measurement per window, and a
 * runtime wrapper (nhc) with lock-free counters for the read path, a per-thread
 * PRNG routing decision, a periodic nhc_tick that closes windows and steps the
 * controller, and a copy-out of the state and of a 60 s time series.
 */
#ifndef KV_NODE_NHC_H
#define KV_NODE_NHC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

/* What the hill climb optimises. */
typedef enum nhc_target {
    NHC_TARGET_THROUGHPUT = 0, /* completed reads per second, higher is better */
    NHC_TARGET_P99 = 1,        /* 99th-percentile read latency, lower is better */
} nhc_target;

/* Controller state (paper §3.2: warm-up with classic caching, then tuning). */
typedef enum nhc_state {
    NHC_STATE_CLASSIC = 1, /* data_admit on, load_admit = 1.0 */
    NHC_STATE_TUNING = 2,  /* data_admit off, load_admit hill-climbed in [0, 1] */
} nhc_state;

/* Volumes a read can be served from. */
typedef enum nhc_dev {
    NHC_DEV_FD = 0, /* performance device (fast volume) */
    NHC_DEV_SD = 1, /* capacity device (slow volume) */
} nhc_dev;

/*
 * Options. nhc_opts_default() fills the defaults; each field's comment gives
 * its default and where the number comes from.
 */
typedef struct nhc_opts {
    bool enable;           /* false = classic caching forever. Default true. */
    nhc_target target;     /* default NHC_TARGET_THROUGHPUT */
    double step;           /* load_admit change per probe, (0, 1]. Default 0.05 */
    double stable_delta;   /* |miss ratio change| between polls that counts as stable. 0.01 */
    double miss_max;       /* never tune while the miss ratio is above this. 0.20 */
    double miss_rise;      /* leave tuning when the miss ratio exceeds its value at entry
                              by more than this. 0.05 */
    double min_gain;       /* relative improvement a probe needs to win. 0.01 */
    uint64_t poll_ns;      /* window length in state 1 (miss-ratio polls). 1 s */
    uint64_t probe_ns;     /* window length of one probe in state 2. 100 ms */
    uint64_t min_ops;      /* a window with fewer reads carries no information. 64 */
    unsigned stuck_rounds; /* rounds ending at load_admit 1.0 that end tuning. 2 */
    unsigned backoff_max;  /* after tuning ended stuck at 1.0, the next entry waits 1, 2, 4 ..
                              up to this many extra stable polls (0 = never wait). 16 */
} nhc_opts;

/* Fills *o with the defaults. Any thread. */
void nhc_opts_default(nhc_opts *o);

/* ---- (a) pure controller ---------------------------------------------------- */

/* One window's measurement, taken under the decision nhc_step last returned. */
typedef struct nhc_sample {
    double miss_ratio;  /* misses / reads in the window, [0, 1] */
    uint64_t ops;       /* reads completed in the window */
    uint64_t p99_ns;    /* p99 read latency in the window (used by NHC_TARGET_P99) */
    uint64_t window_ns; /* window length, > 0 */
} nhc_sample;

/* What to apply for the next window. */
typedef struct nhc_decision {
    nhc_state state;
    bool data_admit;
    double load_admit;       /* in [0, 1] */
    uint64_t next_window_ns; /* how long the next window should last */
} nhc_decision;

typedef struct nhc_ctl nhc_ctl;

/*
 * Creates a controller in state 1. Returns KV_OK and *out (owned by the caller,
 * free with nhc_ctl_destroy), INVALID_ARGUMENT for out-of-range options (opts
 * NULL = defaults), RESOURCE_EXHAUSTED without memory; *out untouched on error.
 */
kv_err nhc_ctl_create(const nhc_opts *opts, nhc_ctl **out);

/* Frees ctl; NULL is a no-op. */
void nhc_ctl_destroy(nhc_ctl *ctl);

/*
 * Feeds one window's measurement and writes the decision for the next window
 * to *out. Deterministic: the same sample sequence gives the same decisions.
 * Returns INVALID_ARGUMENT (ctl unchanged, *out untouched) for a sample with
 * window_ns 0 or a miss ratio outside [0, 1]. Not thread-safe: one caller.
 */
kv_err nhc_step(nhc_ctl *ctl, const nhc_sample *s, nhc_decision *out);

/* The decision in force (the last nhc_step result, or the initial one). */
nhc_decision nhc_ctl_decision(const nhc_ctl *ctl);

/* ---- (b) runtime wrapper ------------------------------------------------------ */

/* Per-volume figures of the last closed window. */
typedef struct nhc_dev_stats {
    uint64_t reads;     /* reads served in the window */
    double ops_per_sec; /* reads / window length */
    uint64_t mean_ns;   /* mean latency */
    uint64_t p99_ns;    /* p99 latency (bucket upper bound, within 1/8 of the value) */
} nhc_dev_stats;

typedef struct nhc_stats {
    bool enabled;
    nhc_state state;
    bool data_admit;
    double load_admit;
    double miss_ratio;    /* last closed window */
    double ops_per_sec;   /* both volumes, last closed window */
    uint64_t p99_ns;      /* both volumes, last closed window */
    uint64_t window_ns;   /* length of the last closed window (0 before the first) */
    uint64_t windows;     /* windows closed so far */
    bool forced;          /* knobs fixed by nhc_force */
    nhc_dev_stats dev[2]; /* indexed by nhc_dev */
    /* Since creation, over closed windows, by the knobs in force during each
     * window: how long data_admit was off and load_admit below 1 (0 and 0 mean
     * the node behaved as classic caching throughout), and how often the
     * controller entered state 2. */
    uint64_t data_admit_off_ns;
    uint64_t load_admit_below_one_ns;
    uint64_t tuning_entries;
} nhc_stats;

/* One point of the time series (one a second, the last NHC_SERIES_LEN kept). */
typedef struct nhc_point {
    uint64_t t_ns; /* nhc_tick time the point was taken at */
    nhc_state state;
    double load_admit;
    double miss_ratio;
    double ops_per_sec;
} nhc_point;

#define NHC_SERIES_LEN 60

typedef struct nhc nhc;

/*
 * Creates the node's scheduler; now_ns (CLOCK_MONOTONIC, kv_now_ns) opens the
 * first window. Returns KV_OK and *out (caller owns, nhc_destroy), or
 * INVALID_ARGUMENT / RESOURCE_EXHAUSTED with *out untouched. opts NULL =
 * defaults.
 */
kv_err nhc_create(const nhc_opts *opts, uint64_t now_ns, nhc **out);

/* Frees n; NULL is a no-op. No other call on n may be running or follow. */
void nhc_destroy(nhc *n);

/*
 * Read path. Any thread, concurrently with everything else; lock-free
 * (relaxed atomic adds and loads, no allocation).
 *
 * nhc_note_read: a read below the memory tier completed on `dev` after
 * latency_ns. nhc_note_miss: that read wanted FD but the record was not there
 * (it went to SD); call it in addition to nhc_note_read(n, NHC_DEV_SD, ..).
 * The miss ratio of a window is misses / reads.
 * nhc_send_to_fd: for a record with identical copies on FD and SD, true with
 * probability load_admit (per-thread PRNG). nhc_data_admit: whether a record
 * read from SD may be promoted to FD.
 */
void nhc_note_read(nhc *n, nhc_dev dev, uint64_t latency_ns);
void nhc_note_miss(nhc *n);
bool nhc_send_to_fd(nhc *n);
bool nhc_data_admit(const nhc *n);
double nhc_load_admit(const nhc *n);

/*
 * Closes the current window when it has lasted the controller's window length
 * (classic poll or tuning probe), steps the controller, publishes the new
 * knobs and records a time-series point once a second. Call it often (every
 * ~10 ms, from one background thread; calls are serialised by an internal
 * mutex). Returns KV_OK, or INVALID_ARGUMENT when now_ns goes backwards.
 */
kv_err nhc_tick(nhc *n, uint64_t now_ns);

/*
 * Fixes the knobs at load_admit (clamped to [0, 1]) and data_admit, for
 * tests and for benchmarks that compare fixed policies (load_admit 1 with
 * data_admit on is classic caching). Windows still close (stats and the
 * series update) but the controller is paused: a window measured under
 * knobs it did not choose says nothing about its probes, so it is not
 * stepped. nhc_unforce resumes the controller where it stopped, with its
 * decision, and the window then in progress (which ran under the forced
 * knobs) is closed at the next tick without stepping. Any thread; takes
 * the internal mutex.
 */
void nhc_force(nhc *n, double load_admit, bool data_admit);
void nhc_unforce(nhc *n);

/* Copies the current state to *out. Any thread; takes the internal mutex. */
void nhc_get_stats(nhc *n, nhc_stats *out);

/*
 * Copies up to cap points of the time series, oldest first, to out (caller's
 * memory) and returns how many were written. Any thread; takes the mutex.
 */
size_t nhc_get_series(nhc *n, nhc_point *out, size_t cap);

#endif /* KV_NODE_NHC_H */
