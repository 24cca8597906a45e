/* SPDX-License-Identifier: MIT */
/* Hashing used across hotkv: xxh64 (libxxhash) for the ring, the hot-key
 * sketch and bloom filters, so every component agrees on a key's hash; XXH3
 * for in-memory index tags, which no other component sees. */
#ifndef KV_COMMON_HASH_H
#define KV_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>
/* xxhash's implementation, inlined (its symbols renamed XXH_INLINE_*): a
 * short key's hash is a few dozen instructions, and the call through the
 * shared library's PLT was a sizeable part of it. */
#define XXH_INLINE_ALL
#include <xxhash.h>

static inline uint64_t kv_hash64(const void *key, size_t len, uint64_t seed)
{
    return XXH64(key, len, seed);
}

/* For hashes that never leave the process's memory (the HotRing index's
 * tags and buckets, index_bench's chain): XXH3's 64-bit hash, about half of
 * XXH64's instructions for keys of 16 bytes or less. Not interchangeable
 * with kv_hash64, which the ring, the hot-key sketch and the bloom filters
 * share across processes and files. */
static inline uint64_t kv_hash64_local(const void *key, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(key, len, seed);
}

#endif
