/* SPDX-License-Identifier: MIT */
/* Unsigned LEB128 varints (protobuf's encoding) for the codecs that write
 * their own bytes: the SST records (node/lsm/codec.c) and the RPC envelope
 * (proto/rpc_wire.c). */
#ifndef HOTKV_COMMON_VARINT_H
#define HOTKV_COMMON_VARINT_H

#include <stddef.h>
#include <stdint.h>

/* Bytes v takes: 1 to 10. */
static inline size_t kv_varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v at d; returns the byte after it. */
static inline uint8_t *kv_varint_put(uint8_t *d, uint64_t v)
{
    while (v >= 0x80) {
        *d++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *d++ = (uint8_t)v;
    return d;
}

#endif
