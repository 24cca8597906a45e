/* SPDX-License-Identifier: MIT */
/*
 * Kv__Envelope and Kv__Calls on the wire (rpc_wire.h): the proto3 encoding
 * of kv.proto's Envelope (fields 1-8), Status (1-2) and Calls (1), written
 * and read by hand, with protobuf-c deciding every message that is not of
 * the common shape.
 *
 * Why the fast path's results are protobuf-c's (proto/kv.proto, protobuf-c
 * 1.4's protobuf-c.c): a field header whose first byte has its high bit
 * clear is a tag under 16 and a wire type, as parse_tag_and_wiretype reads
 * it; a varint is read over at most 10 bytes and truncated to the field's
 * width (parse_uint32 and parse_uint64 keep the low bits); a bool is true
 * when any of its varint's 7-bit groups is not zero (parse_boolean); a
 * length prefix is at most 5 bytes, at most INT_MAX and must fit what
 * remains (scan_length_prefixed_data); a string present on the wire is
 * always allocated (len + 1, NUL-terminated) and a bytes field only when
 * not empty (data NULL otherwise). Fields that appear twice (where
 * protobuf-c keeps the last or merges), unknown fields (which it keeps),
 * other wire types (which it refuses, or reads as bools) and every error
 * go to protobuf-c, whose answer is then the answer.
 */
#include "proto/rpc_wire.h"

#include <limits.h>
#include <stdbool.h>
#include <string.h>

#include "common/assert.h"
#include "common/varint.h"

enum { WT_VARINT = 0, WT_LEN = 2 };

/* ---- reading --------------------------------------------------------------- */

typedef struct span {
    const uint8_t *p;
    size_t n;
} span;

typedef struct rd {
    const uint8_t *p, *end;
} rd;

/* A reader of the n bytes at p (p may be NULL when n is 0: an empty body
 * is a NULL pointer, and NULL + 0 is undefined in C). */
static rd rd_of(const uint8_t *p, size_t n)
{
    rd r = {p, p};
    if (n)
        r.end = p + n;
    return r;
}

/* A varint of at most 10 bytes into *v (bits past 64 dropped); *nz: any of
 * its 7-bit groups is not zero. False when it does not end in time. */
static bool rd_varint(rd *r, uint64_t *v, bool *nz)
{
    size_t rem = (size_t)(r->end - r->p);
    size_t max = rem < 10 ? rem : 10;
    uint64_t x = 0;
    bool any = false;
    for (size_t i = 0; i < max; i++) {
        uint8_t b = r->p[i];
        x |= (uint64_t)(b & 0x7f) << (7 * i);
        any |= (b & 0x7f) != 0;
        if (!(b & 0x80)) {
            r->p += i + 1;
            *v = x;
            *nz = any;
            return true;
        }
    }
    return false;
}

/* A length-prefixed field's contents into *s. */
static bool rd_len(rd *r, span *s)
{
    size_t rem = (size_t)(r->end - r->p);
    size_t max = rem < 5 ? rem : 5, val = 0, i;
    for (i = 0; i < max; i++) {
        val |= ((size_t)r->p[i] & 0x7f) << (7 * i);
        if (!(r->p[i] & 0x80))
            break;
    }
    if (i == max || val > INT_MAX || i + 1 + val > rem)
        return false;
    s->p = r->p + i + 1;
    s->n = val;
    r->p += i + 1 + val;
    return true;
}

/* A field as rd_field read it: a varint's value (v, and nz: any of its
 * 7-bit groups not zero) or a length-delimited field's bytes (s). */
typedef struct field {
    unsigned tag;
    uint64_t v;
    bool nz;
    span s;
} field;

/* One field of the common shape into *f: its tag (1..maxtag, not seen
 * before, now marked in *seen) and its value; false for anything
 * protobuf-c must decide. want[tag] is the tag's wire type. */
static bool rd_field(rd *r, const uint8_t *want, unsigned maxtag, unsigned *seen, field *f)
{
    uint8_t h = *r->p;
    unsigned t = (h >> 3) & 0x0f, wt = h & 7;
    if ((h & 0x80) || t < 1 || t > maxtag || (*seen & (1u << t)) || wt != want[t])
        return false;
    *seen |= 1u << t;
    *f = (field){.tag = t};
    r->p++;
    return wt == WT_VARINT ? rd_varint(r, &f->v, &f->nz) : rd_len(r, &f->s);
}

/* An envelope as read by the first pass. */
typedef struct env_scan {
    unsigned seen, sseen; /* fields present (bit = tag), of the envelope and its status */
    uint64_t id, epoch;
    uint32_t deadline;
    bool coordinate;
    int32_t code;
    span method, auth, body, smsg;
} env_scan;

static const uint8_t env_wt[9] = {0,         WT_VARINT, WT_LEN, WT_VARINT, WT_LEN,
                                  WT_VARINT, WT_LEN,    WT_LEN, WT_VARINT};
static const uint8_t status_wt[3] = {0, WT_VARINT, WT_LEN};

static bool scan_status(span in, env_scan *e)
{
    rd r = rd_of(in.p, in.n);
    field f;
    while (r.p < r.end) {
        if (!rd_field(&r, status_wt, 2, &e->sseen, &f))
            return false;
        if (f.tag == 1)
            e->code = (int32_t)(uint32_t)f.v;
        else
            e->smsg = f.s;
    }
    return true;
}

static bool scan_env(span in, env_scan *e)
{
    memset(e, 0, sizeof(*e));
    rd r = rd_of(in.p, in.n);
    field f;
    while (r.p < r.end) {
        if (!rd_field(&r, env_wt, 8, &e->seen, &f))
            return false;
        switch (f.tag) {
        case 1:
            e->id = f.v;
            break;
        case 2:
            e->method = f.s;
            break;
        case 3:
            e->deadline = (uint32_t)f.v;
            break;
        case 4:
            e->auth = f.s;
            break;
        case 5:
            e->epoch = f.v;
            break;
        case 6:
            if (!scan_status(f.s, e))
                return false;
            break;
        case 7:
            e->body = f.s;
            break;
        default:
            e->coordinate = f.nz;
            break;
        }
    }
    return true;
}

static const uint8_t get_reply_wt[5] = {0, WT_VARINT, WT_LEN, WT_VARINT, WT_VARINT};

bool rpc_wire_get_reply_peek(size_t len, const uint8_t *data, bool *found, uint64_t *version)
{
    rd r = rd_of(data, len);
    unsigned seen = 0;
    *found = false;
    *version = 0;
    field f;
    while (r.p < r.end) {
        if (!rd_field(&r, get_reply_wt, 4, &seen, &f))
            return false;
        if (f.tag == 1)
            *found = f.nz;
        else if (f.tag == 3)
            *version = f.v;
    }
    return true;
}

static void *pb_alloc(ProtobufCAllocator *a, size_t n)
{
    return a->alloc(a->allocator_data, n);
}

static char *dup_str(ProtobufCAllocator *a, span s)
{
    char *p = pb_alloc(a, s.n + 1);
    if (p) {
        memcpy(p, s.p, s.n);
        p[s.n] = 0;
    }
    return p;
}

/* A bytes field present on the wire: NULL data when empty, as protobuf-c. */
static bool dup_bytes(ProtobufCAllocator *a, span s, ProtobufCBinaryData *out)
{
    out->len = s.n;
    out->data = NULL;
    if (s.n && !(out->data = pb_alloc(a, s.n)))
        return false;
    if (s.n)
        memcpy(out->data, s.p, s.n);
    return true;
}

/* The second pass: e's fields into a new envelope (NULL when out of memory,
 * with what was allocated given back). */
static Kv__Envelope *fill_env(ProtobufCAllocator *a, const env_scan *s)
{
    Kv__Envelope *e = pb_alloc(a, sizeof(*e));
    if (!e)
        return NULL;
    kv__envelope__init(e);
    e->id = s->id;
    e->deadline_ms = s->deadline;
    e->map_epoch = s->epoch;
    e->coordinate = s->coordinate;
    char *str;
    if (s->seen & 1u << 2) { /* else the default init set */
        if (!(str = dup_str(a, s->method)))
            goto fail;
        e->method = str;
    }
    if (!dup_bytes(a, s->auth, &e->auth) || !dup_bytes(a, s->body, &e->body))
        goto fail;
    if (s->seen & 1u << 6) {
        Kv__Status *st = pb_alloc(a, sizeof(*st));
        if (!st)
            goto fail;
        kv__status__init(st);
        e->status = st;
        st->code = s->code;
        if (s->sseen & 1u << 2) {
            if (!(str = dup_str(a, s->smsg)))
                goto fail;
            st->message = str;
        }
    }
    return e;
fail:
    protobuf_c_message_free_unpacked(&e->base, a);
    return NULL;
}

Kv__Envelope *rpc_wire_env_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data)
{
    env_scan s;
    if (!a || !scan_env((span){data, len}, &s))
        return kv__envelope__unpack(a, len, data);
    return fill_env(a, &s);
}

/* Calls' envelopes, one by one; false at anything but field 1. */
static bool calls_next(rd *r, span *env)
{
    if (*r->p != (1u << 3 | WT_LEN))
        return false;
    r->p++;
    return rd_len(r, env);
}

/* The first pass's scans of a Calls' first envelopes, kept for the second
 * (the rest are scanned again). */
#define SCAN_KEEP 32

Kv__Calls *rpc_wire_calls_unpack(ProtobufCAllocator *a, size_t len, const uint8_t *data)
{
    if (!a)
        return kv__calls__unpack(a, len, data);
    rd r = rd_of(data, len);
    const uint8_t *rest = NULL; /* where the envelopes not kept begin */
    size_t n = 0;
    span sp;
    env_scan keep[SCAN_KEEP], s;
    while (r.p < r.end) { /* the first pass: the shape, and the count */
        if (n == SCAN_KEEP)
            rest = r.p;
        env_scan *e = n < SCAN_KEEP ? &keep[n] : &s;
        if (!calls_next(&r, &sp) || !scan_env(sp, e))
            return kv__calls__unpack(a, len, data);
        n++;
    }
    Kv__Calls *c = pb_alloc(a, sizeof(*c));
    if (!c)
        return NULL;
    kv__calls__init(c);
    if (n && !(c->calls = pb_alloc(a, n * sizeof(*c->calls))))
        goto fail;
    if (rest) /* the envelopes past the kept scans */
        r = (rd){rest, data + len};
    for (size_t i = 0; i < n; i++) {
        const env_scan *e = i < SCAN_KEEP ? &keep[i] : &s;
        if (i >= SCAN_KEEP) { /* checked by the first pass */
            calls_next(&r, &sp);
            scan_env(sp, &s);
        }
        if (!(c->calls[i] = fill_env(a, e)))
            goto fail;
        c->n_calls++;
    }
    return c;
fail:
    protobuf_c_message_free_unpacked(&c->base, a);
    return NULL;
}

/* ---- writing ---------------------------------------------------------------- */

/* A length-delimited field's size: its one-byte tag, prefix and n bytes. */
static size_t ld_size(size_t n)
{
    return 1 + kv_varint_len(n) + n;
}

static uint8_t *ld_put(uint8_t *p, unsigned tag, const void *b, size_t n)
{
    *p++ = (uint8_t)(tag << 3 | WT_LEN);
    p = kv_varint_put(p, n);
    memcpy(p, b, n);
    return p + n;
}

static uint8_t *var_put(uint8_t *p, unsigned tag, uint64_t v)
{
    *p++ = (uint8_t)(tag << 3 | WT_VARINT);
    return kv_varint_put(p, v);
}

static size_t str_len(const char *s)
{
    return s && s[0] ? strlen(s) : 0;
}

/* A negative int32 goes on the wire sign-extended to 64 bits (10 bytes). */
static uint64_t i32_wire(int32_t v)
{
    return (uint64_t)(int64_t)v;
}

static bool plain(const Kv__Envelope *e)
{
    return e->base.n_unknown_fields == 0 && (!e->status || e->status->base.n_unknown_fields == 0);
}

static size_t status_size(const Kv__Status *s)
{
    size_t n = 0;
    if (s->code)
        n += 1 + kv_varint_len(i32_wire(s->code));
    size_t m = str_len(s->message);
    if (m)
        n += ld_size(m);
    return n;
}

/* e's fields with a body of blen bytes (the body itself not counted when
 * it is e's own: see env_size). */
static size_t env_size_with(const Kv__Envelope *e, size_t blen)
{
    size_t n = 0, m;
    if (e->id)
        n += 1 + kv_varint_len(e->id);
    if ((m = str_len(e->method)))
        n += ld_size(m);
    if (e->deadline_ms)
        n += 1 + kv_varint_len(e->deadline_ms);
    if (e->auth.len)
        n += ld_size(e->auth.len);
    if (e->map_epoch)
        n += 1 + kv_varint_len(e->map_epoch);
    if (e->status)
        n += ld_size(status_size(e->status));
    if (blen)
        n += ld_size(blen);
    if (e->coordinate)
        n += 2;
    return n;
}

/* Fields 1-6 of e. */
static uint8_t *env_put_head(const Kv__Envelope *e, uint8_t *p)
{
    size_t m;
    if (e->id)
        p = var_put(p, 1, e->id);
    if ((m = str_len(e->method)))
        p = ld_put(p, 2, e->method, m);
    if (e->deadline_ms)
        p = var_put(p, 3, e->deadline_ms);
    if (e->auth.len)
        p = ld_put(p, 4, e->auth.data, e->auth.len);
    if (e->map_epoch)
        p = var_put(p, 5, e->map_epoch);
    if (e->status) {
        const Kv__Status *s = e->status;
        *p++ = 6u << 3 | WT_LEN;
        p = kv_varint_put(p, status_size(s));
        if (s->code)
            p = var_put(p, 1, i32_wire(s->code));
        if ((m = str_len(s->message)))
            p = ld_put(p, 2, s->message, m);
    }
    return p;
}

/* Field 8 of e. */
static uint8_t *env_put_tail(const Kv__Envelope *e, uint8_t *p)
{
    if (e->coordinate) {
        *p++ = 8u << 3 | WT_VARINT;
        *p++ = 1;
    }
    return p;
}

size_t rpc_wire_env_size(const Kv__Envelope *e)
{
    if (!plain(e))
        return protobuf_c_message_get_packed_size(&e->base);
    return env_size_with(e, e->body.len);
}

size_t rpc_wire_env_pack(const Kv__Envelope *e, uint8_t *out)
{
    if (!plain(e))
        return protobuf_c_message_pack(&e->base, out);
    uint8_t *p = env_put_head(e, out);
    if (e->body.len)
        p = ld_put(p, 7, e->body.data, e->body.len);
    return (size_t)(env_put_tail(e, p) - out);
}

size_t rpc_wire_calls_size(const Kv__Calls *c)
{
    if (c->base.n_unknown_fields)
        return protobuf_c_message_get_packed_size(&c->base);
    size_t n = 0;
    for (size_t i = 0; i < c->n_calls; i++)
        n += ld_size(rpc_wire_env_size(c->calls[i]));
    return n;
}

size_t rpc_wire_calls_pack(const Kv__Calls *c, uint8_t *out)
{
    if (c->base.n_unknown_fields)
        return protobuf_c_message_pack(&c->base, out);
    uint8_t *p = out;
    for (size_t i = 0; i < c->n_calls; i++) {
        *p++ = 1u << 3 | WT_LEN;
        p = kv_varint_put(p, rpc_wire_env_size(c->calls[i]));
        p += rpc_wire_env_pack(c->calls[i], p);
    }
    return (size_t)(p - out);
}

size_t rpc_wire_env_calls_size(const Kv__Envelope *e, const Kv__Calls *c, size_t *clen)
{
    KV_ASSERT(plain(e), "an outgoing envelope carries unknown fields");
    *clen = rpc_wire_calls_size(c);
    return env_size_with(e, *clen);
}

size_t rpc_wire_env_calls_pack(const Kv__Envelope *e, const Kv__Calls *c, size_t clen, uint8_t *out)
{
    KV_ASSERT(plain(e), "an outgoing envelope carries unknown fields");
    uint8_t *p = env_put_head(e, out);
    if (clen) {
        *p++ = 7u << 3 | WT_LEN;
        p = kv_varint_put(p, clen);
        p += rpc_wire_calls_pack(c, p);
    }
    return (size_t)(env_put_tail(e, p) - out);
}

nng_msg *rpc_wire_env_msg(const Kv__Envelope *e)
{
    nng_msg *m;
    if (nng_msg_alloc(&m, rpc_wire_env_size(e)) != 0)
        return NULL;
    rpc_wire_env_pack(e, nng_msg_body(m));
    return m;
}

nng_msg *rpc_wire_env_calls_msg(const Kv__Envelope *e, const Kv__Calls *c)
{
    size_t clen, n = rpc_wire_env_calls_size(e, c, &clen);
    nng_msg *m;
    if (nng_msg_alloc(&m, n) != 0)
        return NULL;
    rpc_wire_env_calls_pack(e, c, clen, nng_msg_body(m));
    return m;
}
