/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for the envelope codec (proto/rpc_wire.c), differential
 * against protobuf-c: input [mode] + bytes. Mode bit 0 clear: the bytes are
 * an Envelope, set: an rpc.Calls. rpc_wire must take exactly what
 * protobuf-c takes and give the same fields (tests/proto/wire_cmp.h),
 * through an unpack arena as the RPC layer uses it (bit 1 clear) or a
 * malloc allocator with a budget, freed with protobuf_c_message_free_unpacked
 * (bit 1 set; LeakSanitizer checks the frees). What decodes is packed again
 * by both, which must write the same bytes; a decoded Calls is also packed
 * as the body of an envelope in one pass (rpc_wire_env_calls_pack), which
 * must equal packing it into a body first. Mode bit 2 set instead: the bytes
 * are a GetReply, and what rpc_wire_get_reply_peek takes protobuf-c must
 * take with the same found and version.
 */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "proto/rpc_wire.h"
#include "tests/proto/wire_cmp.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fz_quiet();
    return 0;
}

/* m packed by protobuf-c and by rpc_wire's pack (and size): the same bytes. */
static void same_packing(const ProtobufCMessage *m, bool calls)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *want = malloc(n + 1), *got = malloc(n + 1);
    FZ_CHECK(want && got, "oom");
    protobuf_c_message_pack(m, want);
    size_t gn = calls ? rpc_wire_calls_size((const Kv__Calls *)m)
                      : rpc_wire_env_size((const Kv__Envelope *)m);
    FZ_CHECK(gn == n, "rpc_wire sizes the %s at %zu bytes, protobuf-c at %zu",
             calls ? "calls" : "envelope", gn, n);
    gn = calls ? rpc_wire_calls_pack((const Kv__Calls *)m, got)
               : rpc_wire_env_pack((const Kv__Envelope *)m, got);
    FZ_CHECK(gn == n && memcmp(got, want, n) == 0, "rpc_wire packs other bytes than protobuf-c");
    if (calls) { /* as an envelope's body, in one pass */
        Kv__Envelope e = KV__ENVELOPE__INIT;
        e.id = n;
        e.method = "rpc.Calls";
        e.coordinate = n & 1;
        e.body = (ProtobufCBinaryData){n, want};
        size_t en = protobuf_c_message_get_packed_size(&e.base), clen;
        uint8_t *ewant = malloc(en), *egot = malloc(en);
        FZ_CHECK(ewant && egot, "oom");
        protobuf_c_message_pack(&e.base, ewant);
        FZ_CHECK(rpc_wire_env_calls_size(&e, (const Kv__Calls *)m, &clen) == en && clen == n,
                 "envelope with calls: size");
        FZ_CHECK(rpc_wire_env_calls_pack(&e, (const Kv__Calls *)m, clen, egot) == en &&
                     memcmp(egot, ewant, en) == 0,
                 "envelope with calls: other bytes than the two-step packing");
        free(ewant);
        free(egot);
    }
    free(want);
    free(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t mode = data[0];
    size_t n = size - 1;
    const uint8_t *p = n ? data + 1 : NULL; /* an empty body is NULL in the RPC layer */
    if (mode & 4) { /* a GetReply: what the peek takes, protobuf-c takes alike */
        bool found;
        uint64_t version;
        Kv__GetReply *g = kv__get_reply__unpack(NULL, n, p);
        if (rpc_wire_get_reply_peek(n, p, &found, &version))
            FZ_CHECK(g && g->found == found && g->version == version,
                     "the peek took a GetReply protobuf-c %s", g ? "reads otherwise" : "refuses");
        kv__get_reply__free_unpacked(g, NULL);
        return 0;
    }
    bool calls = mode & 1;
    const ProtobufCMessageDescriptor *d =
        calls ? &kv__calls__descriptor : &kv__envelope__descriptor;
    ProtobufCMessage *want = protobuf_c_message_unpack(d, NULL, n, p);

    uint8_t buf[256];
    rpc_arena ar;
    rpc_budget b;
    ProtobufCAllocator *a;
    if (mode & 2) {
        a = rpc_budget_init(&b, rpc_unpack_budget(n, 1024));
    } else {
        rpc_arena_init(&ar, buf, sizeof(buf));
        a = rpc_arena_pb(&ar, SIZE_MAX);
    }
    ProtobufCMessage *got = calls ? (ProtobufCMessage *)rpc_wire_calls_unpack(a, n, p)
                                  : (ProtobufCMessage *)rpc_wire_env_unpack(a, n, p);
    FZ_CHECK((want == NULL) == (got == NULL), "protobuf-c %s the %zu bytes, rpc_wire %s them",
             want ? "took" : "refused", n, got ? "took" : "refused");
    if (want) {
        const char *diff = calls ? wc_calls_diff((Kv__Calls *)want, (Kv__Calls *)got)
                                 : wc_env_diff((Kv__Envelope *)want, (Kv__Envelope *)got);
        FZ_CHECK(diff == NULL, "the decoded messages differ in %s", diff);
        same_packing(want, calls);
        protobuf_c_message_free_unpacked(want, NULL);
    }
    if (mode & 2)
        protobuf_c_message_free_unpacked(got, a);
    else
        rpc_arena_reset(&ar);
    return 0;
}
