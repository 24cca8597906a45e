/* SPDX-License-Identifier: MIT */
/*
 * Clocks: monotonic nanoseconds for deadlines and timing, wall milliseconds
 * for TTLs, and a hybrid logical clock (HLC) for write versions: 48 bits of
 * wall milliseconds, 16 bits of logical counter (DESIGN.md §3). The HLC is
 * lock-free (one CAS loop) and may be called from any thread.
 */
#ifndef KV_COMMON_CLOCK_H
#define KV_COMMON_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>

uint64_t kv_now_ns(void);  /* CLOCK_MONOTONIC */
uint64_t kv_wall_ms(void); /* CLOCK_REALTIME, milliseconds since the epoch */
/* Sleeps ns nanoseconds (resumed after signals). */
void kv_sleep_ns(uint64_t ns);

/* An injectable wall clock: returns milliseconds since the epoch. Engines
 * and LSMs take one (fn + arg, fn NULL = kv_wall_ms) for expiry and the
 * tombstone grace, so that tests move time instead of sleeping. It may be
 * called from any thread, concurrently. */
typedef uint64_t (*kv_clock_fn)(void *arg);

/* fn(arg), or kv_wall_ms() when fn is NULL. */
static inline uint64_t kv_clock_ms(kv_clock_fn fn, void *arg)
{
    return fn ? fn(arg) : kv_wall_ms();
}

typedef struct kv_hlc {
    _Atomic uint64_t last;
} kv_hlc;

#define KV_HLC_MS(v) ((v) >> 16)
#define KV_HLC_COUNTER(v) ((v)&0xffffu)

/* Returns a version strictly greater than every version this clock returned
 * or observed before. */
uint64_t kv_hlc_now(kv_hlc *c);
/* Folds a version seen from a peer into the clock so later kv_hlc_now() calls
 * order after it. */
void kv_hlc_observe(kv_hlc *c, uint64_t remote);

#endif
