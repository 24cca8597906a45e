/* SPDX-License-Identifier: MIT */
/* Small atomic helpers shared across hotkv. */
#ifndef KV_COMMON_ATOMIC_H
#define KV_COMMON_ATOMIC_H

#include <stdatomic.h>
#include <stdint.h>

/* Raises *a to at least v (a monotonic maximum: seqnos, versions). Each
 * failed CAS reloads the current value and retries only while v is still
 * above it, so concurrent raisers never lower it. seq_cst, like a plain
 * atomic store: the new maximum is visible before the caller goes on. */
static inline void kv_atomic_max(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);
    while (v > cur && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

#endif
