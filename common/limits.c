/* SPDX-License-Identifier: MIT */
/* The request limit checks shared by client, router and node. */
#include "common/limits.h"

#include <stdio.h>

const kv_limits kv_default_limits = {KV_DEFAULT_MAX_KEY, KV_DEFAULT_MAX_VALUE,
                                     KV_DEFAULT_MAX_BATCH_OPS, KV_DEFAULT_MAX_BATCH_BYTES};

kv_err kv_check_key(const kv_limits *l, size_t klen, char *err, size_t errlen)
{
    if (klen == 0) {
        snprintf(err, errlen, "key is empty (keys are 1..%zu bytes)", l->max_key);
        return KV_INVALID_ARGUMENT;
    }
    if (klen > l->max_key) {
        snprintf(err, errlen, "key is %zu bytes, over the max-key-bytes limit of %zu", klen,
                 l->max_key);
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

kv_err kv_check_value(const kv_limits *l, size_t vlen, char *err, size_t errlen)
{
    if (vlen > l->max_value) {
        snprintf(err, errlen, "value is %zu bytes, over the max-value-bytes limit of %zu", vlen,
                 l->max_value);
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

kv_err kv_check_batch(const kv_limits *l, size_t nops, size_t bytes, char *err, size_t errlen)
{
    if (nops == 0) {
        snprintf(err, errlen, "batch is empty");
        return KV_INVALID_ARGUMENT;
    }
    if (nops > l->max_batch_ops) {
        snprintf(err, errlen, "batch has %zu ops, over the max-batch-ops limit of %zu", nops,
                 l->max_batch_ops);
        return KV_INVALID_ARGUMENT;
    }
    if (bytes > l->max_batch_bytes) {
        snprintf(err, errlen, "batch is %zu bytes, over the max-batch-bytes limit of %zu", bytes,
                 l->max_batch_bytes);
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

kv_err kv_check_ttl(uint64_t ttl_ms, char *err, size_t errlen)
{
    if (ttl_ms > KV_MAX_TTL_MS) {
        snprintf(err, errlen, "ttl_ms %llu is over the limit of %llu ms (100 years)",
                 (unsigned long long)ttl_ms, (unsigned long long)KV_MAX_TTL_MS);
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

size_t kv_limits_recv_max(const kv_limits *l)
{
    size_t m = l->max_batch_bytes > l->max_value ? l->max_batch_bytes : l->max_value;
    return m + KV_RPC_OVERHEAD;
}
