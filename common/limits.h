/* SPDX-License-Identifier: MIT */
/*
 * Request limits (DESIGN.md §3), enforced identically by the client, the
 * router and the node. Defaults are the design's; binaries may override
 * them by flag. Each check writes a message that names the limit.
 */
#ifndef KV_COMMON_LIMITS_H
#define KV_COMMON_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

#define KV_DEFAULT_MAX_KEY 4096u
#define KV_DEFAULT_MAX_VALUE (16u << 20)
#define KV_DEFAULT_MAX_BATCH_OPS 10000u
#define KV_DEFAULT_MAX_BATCH_BYTES (64u << 20)
/* The longest ttl_ms a write may carry: 100 years. Longer TTLs are refused
 * (INVALID_ARGUMENT naming the limit) rather than saturated, so that a
 * client computing a TTL wrongly (2^64 - 1, a negative number cast) learns
 * it; now + ttl_ms cannot wrap below this bound. Not configurable. */
#define KV_MAX_TTL_MS (100ull * 365 * 24 * 3600 * 1000)
/* Room for the envelope and per-op framing above the batch byte limit; nng's
 * NNG_OPT_RECVMAXSZ is set to max_batch_bytes + this on every socket. */
#define KV_RPC_OVERHEAD (1u << 20)

typedef struct kv_limits {
    size_t max_key;
    size_t max_value;
    size_t max_batch_ops;
    size_t max_batch_bytes;
} kv_limits;

extern const kv_limits kv_default_limits;

/* Each returns KV_OK or INVALID_ARGUMENT with a message in err. */
kv_err kv_check_key(const kv_limits *l, size_t klen, char *err, size_t errlen);
kv_err kv_check_value(const kv_limits *l, size_t vlen, char *err, size_t errlen);
kv_err kv_check_batch(const kv_limits *l, size_t nops, size_t bytes, char *err, size_t errlen);
/* ttl_ms 0 (no expiry) up to KV_MAX_TTL_MS. */
kv_err kv_check_ttl(uint64_t ttl_ms, char *err, size_t errlen);
/* Largest message a socket must accept under these limits. */
size_t kv_limits_recv_max(const kv_limits *l);

#endif
