/* SPDX-License-Identifier: MIT */
/*
 * The RPC envelope (Kv__Envelope) and rpc.Calls (Kv__Calls) to and from the
 * wire without protobuf-c's descriptor-driven walk, which was about an
 * eighth of kvrouter's CPU per routed GET (bench/README.md, "The envelope
 * codec"). Every message on the RPC path is one of these two, so they are
 * worth code of their own; every other message still goes through
 * protobuf-c.
 *
 * Same bytes, same structs:
 * - the pack functions write exactly what protobuf_c_message_pack writes
 *   (fields in number order, proto3 zero values left out); an envelope or
 *   status that carries unknown fields is packed by protobuf-c itself;
 * - the unpack functions return what protobuf_c_message_unpack returns for
 *   the same allocator, bytes and budget: the fast path takes only the
 *   common shape (known fields, each at most once, with their wire types,
 *   one-byte tags) and hands anything else (a repeated scalar, an unknown
 *   field, a malformed or truncated message) to protobuf-c, which decides
 *   it as it always did. A quick first pass checks the shape before
 *   anything is allocated, so a hand-over costs the allocator nothing.
 *
 * Ownership is protobuf-c's: everything is allocated through the allocator
 * passed in (one allocation per struct, string, non-empty bytes field and
 * repeated array), so protobuf_c_message_free_unpacked, or resetting the
 * arena the allocator draws from, frees it. The allocator must not be NULL
 * (the fast path is taken only with one; NULL goes to protobuf-c).
 */
#ifndef HOTKV_PROTO_RPC_WIRE_H
#define HOTKV_PROTO_RPC_WIRE_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/kv.pb-c.h"

Kv__Envelope *rpc_wire_env_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data);
Kv__Calls *rpc_wire_calls_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data);

size_t rpc_wire_env_size(const Kv__Envelope *e);
size_t rpc_wire_env_pack(const Kv__Envelope *e, uint8_t *out); /* returns bytes written */
size_t rpc_wire_calls_size(const Kv__Calls *c);
size_t rpc_wire_calls_pack(const Kv__Calls *c, uint8_t *out);

/* An envelope whose body is the packed c, written in one pass with no
 * buffer of its own for the body (e->body is ignored): the same bytes as
 * packing c into a buffer, pointing e->body at it and packing e.
 * rpc_wire_env_calls_size gives the whole size and, in *clen, c's, which
 * rpc_wire_env_calls_pack takes back. e is the sender's own envelope: one
 * with unknown fields (only an unpacked one has them) is a bug, asserted. */
size_t rpc_wire_env_calls_size(const Kv__Envelope *e, const Kv__Calls *c, size_t *clen);
size_t rpc_wire_env_calls_pack(const Kv__Envelope *e, const Kv__Calls *c, size_t clen,
                               uint8_t *out);

/* A GetReply's found and version without unpacking it: true when the
 * bytes are of the common shape (fields 1-4, each at most once, with their
 * wire types), *found and *version then being what kv__get_reply__unpack
 * would give; false for anything else, which only protobuf-c can decide
 * (it may still take it, or refuse it as malformed). */
bool rpc_wire_get_reply_peek(size_t len, const uint8_t *data, bool *found, uint64_t *version);

/* e packed into a new nng message, and e around c (as above): NULL when
 * out of memory. */
nng_msg *rpc_wire_env_msg(const Kv__Envelope *e);
nng_msg *rpc_wire_env_calls_msg(const Kv__Envelope *e, const Kv__Calls *c);

#endif
