/* SPDX-License-Identifier: MIT */
/*
 * A manual wall clock for tests (kv_clock_fn): it starts at the real wall
 * clock and moves only when the test advances it, so TTL and tombstone-grace
 * tests step over time instead of sleeping. Give &clock as the arg of
 * tclock_now in engine_opts / lsm_opts. Any thread.
 */
#ifndef KV_TESTS_KV_TESTCLOCK_H
#define KV_TESTS_KV_TESTCLOCK_H

#include <stdatomic.h>
#include <stdint.h>

#include "common/clock.h"

typedef struct tclock {
    _Atomic uint64_t now_ms;
} tclock;

static inline void tclock_init(tclock *c)
{
    atomic_init(&c->now_ms, kv_wall_ms());
}

static inline uint64_t tclock_now(void *arg)
{
    return atomic_load(&((tclock *)arg)->now_ms);
}

static inline void tclock_advance(tclock *c, uint64_t ms)
{
    atomic_fetch_add(&c->now_ms, ms);
}

#endif
