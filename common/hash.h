/* SPDX-License-Identifier: MIT */
/* Hashing used across hotkv: xxh64 (libxxhash) for the ring, the HotRing
 * index and bloom filters, so every component agrees on a key's hash. */
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

#endif
