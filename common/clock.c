/* SPDX-License-Identifier: MIT */
/* Monotonic and wall clocks, and the lock-free hybrid logical clock. */
#include "common/clock.h"

#include <errno.h>
#include <time.h>

uint64_t kv_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t kv_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000ull + (uint64_t)ts.tv_nsec / 1000000ull;
}

uint64_t kv_hlc_now(kv_hlc *c)
{
    uint64_t phys = (kv_wall_ms() & 0xffffffffffffull) << 16;
    uint64_t old = atomic_load_explicit(&c->last, memory_order_relaxed);
    for (;;) {
        /* Physical time moved past the last version: restart the counter.
         * Otherwise tick the logical part; on counter overflow this borrows
         * from the millisecond field, which keeps versions monotonic. */
        uint64_t next = phys > old ? phys : old + 1;
        /* CAS: publishes `next` only if no other thread handed out a version
         * since we read `old`, so no two callers get the same version. */
        if (atomic_compare_exchange_weak_explicit(&c->last, &old, next, memory_order_relaxed,
                                                  memory_order_relaxed))
            return next;
    }
}

void kv_hlc_observe(kv_hlc *c, uint64_t remote)
{
    uint64_t old = atomic_load_explicit(&c->last, memory_order_relaxed);
    /* CAS: raise `last` to `remote` unless another thread raised it further. */
    while (remote > old && !atomic_compare_exchange_weak_explicit(
                               &c->last, &old, remote, memory_order_relaxed, memory_order_relaxed))
        ;
}

void kv_sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}
