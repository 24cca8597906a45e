/* SPDX-License-Identifier: MIT */
/* Field-by-field comparison of two Envelopes or Calls, for the envelope
 * codec's test (rpc_wire_test.c) and fuzzer (tests/fuzz/fuzz_wire.c): the
 * name of the first field that differs, or NULL when they are the same
 * (a NULL bytes pointer on one side only counts as a difference). */
#ifndef KV_TESTS_PROTO_WIRE_CMP_H
#define KV_TESTS_PROTO_WIRE_CMP_H

#include <stdbool.h>
#include <string.h>

#include "proto/kv.pb-c.h"

static inline bool wc_bytes_differ(const ProtobufCBinaryData *a, const ProtobufCBinaryData *b)
{
    return a->len != b->len || (a->data == NULL) != (b->data == NULL) ||
           (a->len && memcmp(a->data, b->data, a->len) != 0);
}

static inline bool wc_str_differ(const char *a, const char *b)
{
    return (a == NULL) != (b == NULL) || (a && strcmp(a, b) != 0);
}

static inline const char *wc_env_diff(const Kv__Envelope *a, const Kv__Envelope *b)
{
    if (a->id != b->id)
        return "id";
    if (wc_str_differ(a->method, b->method))
        return "method";
    if (a->deadline_ms != b->deadline_ms)
        return "deadline_ms";
    if (wc_bytes_differ(&a->auth, &b->auth))
        return "auth";
    if (a->map_epoch != b->map_epoch)
        return "map_epoch";
    if ((a->status == NULL) != (b->status == NULL))
        return "status present";
    if (a->status && a->status->code != b->status->code)
        return "status.code";
    if (a->status && wc_str_differ(a->status->message, b->status->message))
        return "status.message";
    if (a->status && a->status->base.n_unknown_fields != b->status->base.n_unknown_fields)
        return "status's unknown fields";
    if (wc_bytes_differ(&a->body, &b->body))
        return "body";
    if (a->coordinate != b->coordinate)
        return "coordinate";
    if (a->base.n_unknown_fields != b->base.n_unknown_fields)
        return "unknown fields";
    return NULL;
}

static inline const char *wc_calls_diff(const Kv__Calls *a, const Kv__Calls *b)
{
    if (a->n_calls != b->n_calls)
        return "n_calls";
    if (a->base.n_unknown_fields != b->base.n_unknown_fields)
        return "unknown fields";
    for (size_t i = 0; i < a->n_calls; i++) {
        const char *d = wc_env_diff(a->calls[i], b->calls[i]);
        if (d)
            return d;
    }
    return NULL;
}

#endif
