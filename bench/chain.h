/* SPDX-License-Identifier: MIT */
/*
 * A lock-free chaining hash index, the Memcached-style baseline of
 * index_bench: a fixed array of bucket heads, each a singly linked chain of
 * items; inserts push at the chain head with one CAS, reads walk the chain,
 * values of up to 8 bytes are updated in place and larger ones by
 * read-copy-update (liburcu memb flavour), as HotRing does. No deletes, no
 * resize: the bucket count is fixed at open.
 *
 * Threads: every calling thread must be registered with liburcu's memb
 * flavour (urcu_memb_register_thread()). ib_chain_get/put take their own RCU
 * read-side sections and may be called from any number of threads at once;
 * ib_chain_open/close are single-threaded.
 */
#ifndef KV_BENCH_CHAIN_H
#define KV_BENCH_CHAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bench/index_impl.h"
#include "kv/kv_err.h"

typedef struct ib_chain ib_chain;

/* Creates an index with `buckets` heads (rounded up to a power of two).
 * Returns INVALID_ARGUMENT for 0 buckets, RESOURCE_EXHAUSTED without memory;
 * on success *out owns it (free with ib_chain_close). */
kv_err ib_chain_open(ib_chain **out, uint64_t buckets);
/* Waits for pending RCU frees, then frees every item and the index. NULL ok. */
void ib_chain_close(ib_chain *c);

/* Looks key up. On a hit copies min(cap, value length) bytes to val, stores
 * the value length in *vlen (when non-NULL) and returns true. *visited (when
 * non-NULL) receives the number of items compared, hit or miss, and *meta
 * (when non-NULL) the record metadata stored with the item. */
bool ib_chain_get(ib_chain *c, const void *key, size_t klen, void *val, size_t cap, size_t *vlen,
                  uint32_t *visited, ib_meta *meta);

/* Inserts key or replaces its value (in place when both the old and the new
 * value are 8 bytes or less and of equal length). Copies key and value.
 * Returns KV_OK, INVALID_ARGUMENT for an empty key or RESOURCE_EXHAUSTED. */
kv_err ib_chain_put(ib_chain *c, const void *key, size_t klen, const void *val, size_t vlen);

uint64_t ib_chain_buckets(const ib_chain *c);
uint64_t ib_chain_count(ib_chain *c); /* items; walks every chain (quiescent use) */

#endif
