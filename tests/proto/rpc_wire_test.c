/* SPDX-License-Identifier: MIT */
/* The envelope codec (proto/rpc_wire.c) against protobuf-c itself: the same
 * bytes packed, the same messages unpacked from well-formed, odd and
 * damaged input, no more memory needed than protobuf-c needs, and nothing
 * leaked when an allocation fails halfway. */
#include "tests/kv_testfw.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "proto/rpc_wire.h"
#include "tests/proto/wire_cmp.h"

/* ---- a malloc allocator that counts, fails on request and has a budget ---- */

typedef struct tally {
    long live;     /* allocations not yet freed */
    long fail_at;  /* the fail_at-th allocation (1-based) fails; 0: none */
    long n;        /* allocations asked for */
    size_t budget; /* bytes it may still hand out */
} tally;

static void *t_alloc(void *d, size_t n)
{
    tally *t = d;
    t->n++;
    if ((t->fail_at && t->n == t->fail_at) || n > t->budget)
        return NULL;
    t->budget -= n;
    t->live++;
    return malloc(n);
}

static void t_free(void *d, void *p)
{
    tally *t = d;
    if (p)
        t->live--;
    free(p);
}

static ProtobufCAllocator tally_pb(tally *t, size_t budget)
{
    *t = (tally){.budget = budget};
    return (ProtobufCAllocator){t_alloc, t_free, t};
}

/* ---- comparing ------------------------------------------------------------ */

/* Both decoders on the same bytes, an Envelope or (calls) a Calls: both
 * refuse, or both give the same message. Returns whether they took it. */
static bool agree(bool calls, const uint8_t *p, size_t n)
{
    ProtobufCMessage *a = protobuf_c_message_unpack(
        calls ? &kv__calls__descriptor : &kv__envelope__descriptor, NULL, n, p);
    tally t;
    ProtobufCAllocator pb = tally_pb(&t, SIZE_MAX);
    ProtobufCMessage *b = calls ? (ProtobufCMessage *)rpc_wire_calls_unpack(&pb, n, p)
                                : (ProtobufCMessage *)rpc_wire_env_unpack(&pb, n, p);
    cr_assert_eq(a == NULL, b == NULL, "protobuf-c %s, rpc_wire %s (%zu bytes)",
                 a ? "took it" : "refused", b ? "took it" : "refused", n);
    if (a) {
        const char *d = calls ? wc_calls_diff((Kv__Calls *)a, (Kv__Calls *)b)
                              : wc_env_diff((Kv__Envelope *)a, (Kv__Envelope *)b);
        cr_assert_null(d, "the messages differ in %s", d);
        protobuf_c_message_free_unpacked(a, NULL);
        protobuf_c_message_free_unpacked(b, &pb);
    }
    cr_assert_eq(t.live, 0, "%ld allocations left", t.live);
    return a != NULL;
}

static bool agree_env(const uint8_t *p, size_t n)
{
    return agree(false, p, n);
}

static bool agree_calls(const uint8_t *p, size_t n)
{
    return agree(true, p, n);
}

/* ---- envelopes to pack ---------------------------------------------------- */

static char long_str[300];
static uint8_t long_bytes[200];

/* Envelope number i of a fixed set that covers every field absent, zero,
 * one byte and several bytes long, negative status codes included. */
static void make_env(unsigned i, Kv__Envelope *e, Kv__Status *st)
{
    kv__envelope__init(e);
    kv__status__init(st);
    memset(long_str, 'm', sizeof(long_str) - 1);
    for (size_t k = 0; k < sizeof(long_bytes); k++)
        long_bytes[k] = (uint8_t)(k * 7);
    static const uint64_t ids[] = {0, 1, 127, 128, 300, UINT64_MAX};
    static const char *methods[] = {"", "kv.Get", "rpc.Calls", long_str, NULL};
    static const uint32_t dls[] = {0, 1, 200, 30000, UINT32_MAX};
    static const int32_t codes[] = {0, 3, 14, -1, INT32_MIN, INT32_MAX};
    static const char *msgs[] = {"", "key too long", long_str, NULL};
    e->id = ids[i % 6];
    e->method = (char *)methods[i % 5];
    e->deadline_ms = dls[(i / 2) % 5];
    e->map_epoch = ids[(i / 3) % 6];
    if (i % 3 == 1)
        e->auth = (ProtobufCBinaryData){6, (uint8_t *)"s3cret"};
    if (i % 4 != 0)
        e->body = (ProtobufCBinaryData){(i % 4 == 3) ? sizeof(long_bytes) : 5, long_bytes};
    e->coordinate = i % 5 == 2;
    if (i % 2) {
        st->code = codes[(i / 2) % 6];
        st->message = (char *)msgs[(i / 3) % 4];
        e->status = st;
    }
}

static uint8_t *pbc_pack(const ProtobufCMessage *m, size_t *n)
{
    *n = protobuf_c_message_get_packed_size(m);
    uint8_t *p = malloc(*n ? *n : 1);
    cr_assert_not_null(p);
    cr_assert_eq(protobuf_c_message_pack(m, p), *n);
    return p;
}

Test(rpc_wire, envelopes_pack_to_protobuf_c_bytes_and_back)
{
    for (unsigned i = 0; i < 120; i++) {
        Kv__Envelope e;
        Kv__Status st;
        make_env(i, &e, &st);
        size_t n;
        uint8_t *want = pbc_pack(&e.base, &n);
        cr_assert_eq(rpc_wire_env_size(&e), n, "envelope %u: size", i);
        uint8_t *got = malloc(n + 1);
        cr_assert_eq(rpc_wire_env_pack(&e, got), n);
        cr_assert(memcmp(got, want, n) == 0, "envelope %u: other bytes than protobuf-c's", i);
        cr_assert(agree_env(got, n), "envelope %u refused", i);
        free(got);
        free(want);
    }
}

/* A Calls of n envelopes from make_env (ptrs and envs given). */
static Kv__Calls make_calls(size_t n, Kv__Envelope *envs, Kv__Status *sts, Kv__Envelope **ptrs)
{
    Kv__Calls c = KV__CALLS__INIT;
    for (size_t i = 0; i < n; i++) {
        make_env((unsigned)(i * 7 + 3), &envs[i], &sts[i]);
        ptrs[i] = &envs[i];
    }
    c.n_calls = n;
    c.calls = n ? ptrs : NULL;
    return c;
}

Test(rpc_wire, calls_and_the_envelope_around_them_pack_as_protobuf_c)
{
    static const size_t sizes[] = {0, 1, 2, 25, 200};
    Kv__Envelope envs[200], *ptrs[200];
    Kv__Status sts[200];
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        Kv__Calls c = make_calls(sizes[s], envs, sts, ptrs);
        size_t cn;
        uint8_t *cwant = pbc_pack(&c.base, &cn);
        cr_assert_eq(rpc_wire_calls_size(&c), cn);
        uint8_t *cgot = malloc(cn + 1);
        cr_assert_eq(rpc_wire_calls_pack(&c, cgot), cn);
        cr_assert(memcmp(cgot, cwant, cn) == 0, "%zu calls: other bytes", sizes[s]);
        cr_assert(agree_calls(cgot, cn));

        /* the outer envelope, the two-step way and in one pass */
        for (unsigned k = 0; k < 10; k++) {
            Kv__Envelope outer;
            Kv__Status ost;
            make_env(k, &outer, &ost);
            outer.body = (ProtobufCBinaryData){cn, cwant};
            size_t on;
            uint8_t *owant = pbc_pack(&outer.base, &on);
            size_t clen;
            outer.body = (ProtobufCBinaryData){0, NULL}; /* ignored */
            cr_assert_eq(rpc_wire_env_calls_size(&outer, &c, &clen), on);
            cr_assert_eq(clen, cn);
            uint8_t *ogot = malloc(on + 1);
            cr_assert_eq(rpc_wire_env_calls_pack(&outer, &c, clen, ogot), on);
            cr_assert(memcmp(ogot, owant, on) == 0, "%zu calls in envelope %u: other bytes",
                      sizes[s], k);
            free(ogot);
            free(owant);
        }
        free(cgot);
        free(cwant);
    }
}

Test(rpc_wire, messages_with_unknown_fields_pack_as_protobuf_c)
{
    /* unpacked by protobuf-c, which keeps the unknown field 15 */
    uint8_t in[] = {0x08, 0x07, 0x12, 0x02, 'k',  'v',  0x78,
                    0x05, 0x32, 0x04, 0x08, 0x02, 0x78, 0x01};
    Kv__Envelope *e = kv__envelope__unpack(NULL, sizeof(in), in);
    cr_assert_not_null(e);
    cr_assert_eq(e->base.n_unknown_fields, 1);
    size_t n;
    uint8_t *want = pbc_pack(&e->base, &n);
    cr_assert_eq(rpc_wire_env_size(e), n);
    uint8_t *got = malloc(n);
    cr_assert_eq(rpc_wire_env_pack(e, got), n);
    cr_assert(memcmp(got, want, n) == 0);
    Kv__Envelope *ptrs[1] = {e};
    Kv__Calls c = KV__CALLS__INIT;
    c.n_calls = 1;
    c.calls = ptrs;
    size_t cn;
    uint8_t *cwant = pbc_pack(&c.base, &cn);
    uint8_t *cgot = malloc(cn);
    cr_assert_eq(rpc_wire_calls_pack(&c, cgot), cn);
    cr_assert(memcmp(cgot, cwant, cn) == 0);
    free(got);
    free(want);
    free(cgot);
    free(cwant);
    kv__envelope__free_unpacked(e, NULL);
}

/* Bytes that protobuf-c decides (the fast path hands them over): each must
 * come out of rpc_wire as out of protobuf-c. */
Test(rpc_wire, odd_and_broken_envelopes_decode_as_protobuf_c_decodes_them)
{
    static const struct {
        const char *what;
        uint8_t b[24];
        size_t n;
        bool ok; /* what protobuf-c says, asserted too */
    } cases[] = {
        {"empty", {0}, 0, true},
        {"id twice: the last wins", {0x08, 0x01, 0x08, 0x02}, 4, true},
        {"method twice", {0x12, 0x01, 'a', 0x12, 0x01, 'b'}, 6, true},
        {"status twice: merged", {0x32, 0x02, 0x08, 0x05, 0x32, 0x03, 0x12, 0x01, 'x'}, 9, true},
        {"status code twice", {0x32, 0x04, 0x08, 0x05, 0x08, 0x06}, 6, true},
        {"unknown varint field", {0x08, 0x01, 0x48, 0x01}, 4, true},
        {"unknown field of two-byte tag", {0x80, 0x01, 0x01}, 3, true},
        {"a padded tag", {0x88, 0x00, 0x05}, 3, true},
        {"a padded varint", {0x08, 0x81, 0x80, 0x00}, 4, true},
        {"bool as 64-bit", {0x41, 1, 0, 0, 0, 0, 0, 0, 0}, 9, true},
        {"bool of ten bytes, its only bit past 64",
         {0x40, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02},
         11,
         true},
        {"id of ten bytes",
         {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
         11,
         true},
        {"deadline past 32 bits", {0x18, 0xff, 0xff, 0xff, 0xff, 0x7f}, 6, true},
        {"empty method and bytes present", {0x12, 0x00, 0x22, 0x00, 0x3a, 0x00}, 6, true},
        {"method with a NUL", {0x12, 0x03, 'k', 0, 'v'}, 5, true},
        {"status with an unknown field", {0x32, 0x02, 0x18, 0x01}, 4, true},
        {"tag 0", {0x00, 0x01}, 2, false},
        {"group start", {0x0b}, 1, false},
        {"wire type 7", {0x0f, 0x00}, 2, false},
        {"method as varint", {0x10, 0x01}, 2, false},
        {"id as length-prefixed", {0x0a, 0x01, 0x00}, 3, false},
        {"truncated varint", {0x08, 0x80}, 2, false},
        {"varint of eleven bytes",
         {0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00},
         12,
         false},
        {"length past the end", {0x12, 0x05, 'a'}, 3, false},
        {"length prefix of six bytes", {0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, 7, false},
        {"length over INT_MAX", {0x12, 0xff, 0xff, 0xff, 0xff, 0x0f}, 6, false},
        {"broken status", {0x32, 0x02, 0x08, 0x80}, 4, false},
        {"a tag alone", {0x08}, 1, false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        bool ok = agree_env(cases[i].b, cases[i].n);
        cr_assert_eq(ok, cases[i].ok, "%s: protobuf-c %s it", cases[i].what,
                     ok ? "took" : "refused");
        /* and as the only envelope of a Calls */
        uint8_t c[32] = {0x0a, (uint8_t)cases[i].n};
        memcpy(c + 2, cases[i].b, cases[i].n);
        cr_assert_eq(agree_calls(c, cases[i].n + 2), ok, "%s in a Calls", cases[i].what);
    }
    static const struct {
        const char *what;
        uint8_t b[8];
        size_t n;
    } calls[] = {
        {"an unknown field", {0x0a, 0x00, 0x10, 0x01}, 4},
        {"calls as varint", {0x08, 0x01}, 2},
        {"truncated", {0x0a, 0x03, 0x08}, 3},
    };
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++)
        agree_calls(calls[i].b, calls[i].n);
}

static uint64_t xorshift(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Valid messages, then damaged ones: flipped bytes, cuts, spliced runs. */
Test(rpc_wire, random_damage_is_decided_as_protobuf_c_decides_it)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull;
#define RNG() xorshift(&seed)
    Kv__Envelope envs[8], *ptrs[8];
    Kv__Status sts[8];
    uint8_t buf[4096];
    long took = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        size_t k = RNG() % 4;
        Kv__Calls c = make_calls(k, envs, sts, ptrs);
        for (size_t i = 0; i < k; i++)
            make_env((unsigned)(RNG() % 120), &envs[i], &sts[i]);
        size_t n = rpc_wire_calls_pack(&c, buf);
        int edits = 1 + (int)(RNG() % 3);
        for (int e = 0; e < edits && n; e++) {
            switch (RNG() % 4) {
            case 0: /* flip a byte */
                buf[RNG() % n] ^= (uint8_t)(1u << (RNG() % 8));
                break;
            case 1: /* set a byte */
                buf[RNG() % n] = (uint8_t)RNG();
                break;
            case 2: /* cut the end */
                n -= RNG() % (n < 8 ? n : 8);
                break;
            default: { /* repeat a run (duplicate fields) */
                size_t at = RNG() % n, len = 1 + RNG() % 12;
                if (at + len <= n && n + len <= sizeof(buf)) {
                    memmove(buf + at + len, buf + at, n - at);
                    n += len;
                }
            }
            }
        }
        bool ok = agree_calls(buf, n);
        took += ok;
        refused += !ok;
        if (n > 2 && buf[0] == 0x0a && buf[1] < 0x80 && (size_t)buf[1] + 2 <= n)
            agree_env(buf + 2, buf[1]);
    }
    cr_assert(took > 1000 && refused > 1000, "too one-sided to test much: %ld took, %ld refused",
              took, refused);
#undef RNG
}

/* Whatever budget protobuf-c unpacks a message in, rpc_wire does too (it
 * allocates a subset of what protobuf-c does). */
Test(rpc_wire, no_budget_protobuf_c_fits_is_too_small_for_rpc_wire)
{
    Kv__Envelope envs[40], *ptrs[40];
    Kv__Status sts[40];
    static const size_t sizes[] = {1, 3, 17, 40};
    uint8_t *buf = malloc(64 * 1024);
    cr_assert_not_null(buf);
    for (size_t s = 0; s < 4; s++) {
        Kv__Calls c = make_calls(sizes[s], envs, sts, ptrs);
        size_t n = rpc_wire_calls_pack(&c, buf);
        size_t lo = 0, hi = 1 << 20; /* the least budget protobuf-c needs */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            rpc_budget b;
            Kv__Calls *m = kv__calls__unpack(rpc_budget_init(&b, mid), n, buf);
            if (m)
                kv__calls__free_unpacked(m, rpc_budget_init(&b, SIZE_MAX));
            if (m)
                hi = mid;
            else
                lo = mid + 1;
        }
        tally t;
        ProtobufCAllocator pb = tally_pb(&t, lo);
        Kv__Calls *m = rpc_wire_calls_unpack(&pb, n, buf);
        cr_assert_not_null(m, "%zu calls: refused in the %zu bytes protobuf-c took", sizes[s], lo);
        kv__calls__free_unpacked(m, &pb);
        cr_assert_eq(t.live, 0);
    }
    free(buf);
}

Test(rpc_wire, a_failed_allocation_leaks_nothing)
{
    Kv__Envelope envs[5], *ptrs[5];
    Kv__Status sts[5];
    uint8_t buf[4096];
    Kv__Calls c = make_calls(5, envs, sts, ptrs);
    size_t n = rpc_wire_calls_pack(&c, buf);
    tally t;
    ProtobufCAllocator pb = tally_pb(&t, SIZE_MAX);
    Kv__Calls *m = rpc_wire_calls_unpack(&pb, n, buf);
    cr_assert_not_null(m);
    long total = t.n;
    kv__calls__free_unpacked(m, &pb);
    cr_assert(total > 10, "%ld allocations", total);
    for (long k = 1; k <= total; k++) {
        pb = tally_pb(&t, SIZE_MAX);
        t.fail_at = k;
        cr_assert_null(rpc_wire_calls_unpack(&pb, n, buf), "allocation %ld failed unnoticed", k);
        cr_assert_eq(t.live, 0, "allocation %ld failed: %ld left", k, t.live);
    }
}

/* rpc_wire_get_reply_peek against kv__get_reply__unpack: every reply a
 * node writes is of the common shape, and whatever the peek takes,
 * protobuf-c takes with the same found and version. */
Test(rpc_wire, a_get_reply_is_peeked_as_protobuf_c_reads_it)
{
    uint64_t seed = 0x2545f4914f6cdd1dull;
    uint8_t buf[512];
    long peeked = 0, handed = 0;
    for (int it = 0; it < 20000; it++) {
        Kv__GetReply g = KV__GET_REPLY__INIT;
        g.found = xorshift(&seed) & 1;
        static const uint64_t vs[] = {0, 1, 300, 1ull << 40, UINT64_MAX};
        g.version = vs[xorshift(&seed) % 5];
        g.expire_at_ms = vs[xorshift(&seed) % 5];
        if (g.found)
            g.value = (ProtobufCBinaryData){xorshift(&seed) % 200, long_bytes};
        size_t n = kv__get_reply__pack(&g, buf);
        bool found;
        uint64_t version;
        cr_assert(rpc_wire_get_reply_peek(n, buf, &found, &version), "a packed reply not peeked");
        cr_assert(found == g.found && version == g.version);
        if (it % 2) { /* damaged */
            buf[xorshift(&seed) % (n ? n : 1)] ^= (uint8_t)xorshift(&seed);
            n -= n ? xorshift(&seed) % 3 % (n + 1) : 0;
        }
        Kv__GetReply *u = kv__get_reply__unpack(NULL, n, buf);
        if (rpc_wire_get_reply_peek(n, buf, &found, &version)) {
            peeked++;
            cr_assert_not_null(u, "peeked a reply protobuf-c refuses (%zu bytes)", n);
            cr_assert(found == u->found && version == u->version,
                      "peek %d/%llu, protobuf-c %d/%llu", found, (unsigned long long)version,
                      u->found, (unsigned long long)u->version);
        } else {
            handed++;
        }
        kv__get_reply__free_unpacked(u, NULL);
    }
    cr_assert(handed > 500, "only %ld replies handed to protobuf-c (%ld peeked)", handed, peeked);
}

/* An empty body reaches the codec as a NULL pointer (an empty bytes field
 * unpacks to one): every entry point takes it (the fuzzer's UBSan build
 * found NULL + 0 in the first version). */
Test(rpc_wire, empty_bodies_as_null_pointers)
{
    cr_assert(agree_env(NULL, 0));
    cr_assert(agree_calls(NULL, 0));
    bool found = true;
    uint64_t version = 1;
    cr_assert(rpc_wire_get_reply_peek(0, NULL, &found, &version));
    cr_assert(!found && version == 0);
}

/* A hostile Calls (a megabyte of empty envelopes, 2 bytes each, which
 * would take some 60 MB as structs) is refused within its budget, as
 * protobuf-c refuses it, and leaves nothing allocated. */
Test(rpc_wire, a_calls_past_its_budget_is_refused_within_it)
{
    size_t n = 1 << 20;
    uint8_t *buf = malloc(n);
    cr_assert_not_null(buf);
    for (size_t i = 0; i < n; i += 2) {
        buf[i] = 0x0a;
        buf[i + 1] = 0x00;
    }
    size_t budget = rpc_unpack_budget(n / 64, 1024); /* what a smaller message may take */
    tally t;
    ProtobufCAllocator pb = tally_pb(&t, budget);
    cr_assert_null(rpc_wire_calls_unpack(&pb, n, buf));
    cr_assert_eq(t.live, 0, "%ld allocations left", t.live);
    rpc_budget b;
    cr_assert_null(kv__calls__unpack(rpc_budget_init(&b, budget), n, buf));
    pb = tally_pb(&t, SIZE_MAX); /* and within no budget it is a Calls of 512k */
    Kv__Calls *c = rpc_wire_calls_unpack(&pb, n, buf);
    cr_assert_not_null(c);
    cr_assert_eq(c->n_calls, n / 2);
    kv__calls__free_unpacked(c, &pb);
    cr_assert_eq(t.live, 0);
    free(buf);
}
