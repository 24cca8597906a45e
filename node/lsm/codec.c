/* SPDX-License-Identifier: MIT */
/*
 * Byte-level helpers of the LSM: growable buffers, the on-disk record codec
 * shared by WAL frames and SST blocks (their checksums: common/crc32c.h),
 * and errno mapping. Everything here is pure and
 * thread-safe.
 */
#include <errno.h>
#include <stdlib.h>

#include "common/varint.h"
#include "node/lsm/lsm_int.h"

/* ---- buffers ---- */

kv_err lsm_buf_reserve(lsm_buf *b, size_t extra)
{
    if (b->len + extra <= b->cap)
        return KV_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra)
        cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return KV_RESOURCE_EXHAUSTED;
    b->p = p;
    b->cap = cap;
    return KV_OK;
}

kv_err lsm_buf_put(lsm_buf *b, const void *p, size_t n)
{
    kv_err rv = lsm_buf_reserve(b, n);
    if (rv != KV_OK)
        return rv;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    return KV_OK;
}

kv_err lsm_buf_put32(lsm_buf *b, uint32_t v)
{
    return lsm_buf_put(b, &v, 4);
}

kv_err lsm_buf_put64(lsm_buf *b, uint64_t v)
{
    return lsm_buf_put(b, &v, 8);
}

void lsm_buf_free(lsm_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- records ---- */

size_t lsm_rec_size(const lsm_rec *r)
{
    return LSM_REC_HDR + r->klen + (r->type == LSM_PUT ? r->vlen : 0);
}

bool lsm_rec_valid(const lsm_rec *r)
{
    if (r->klen == 0 || r->klen > LSM_MAX_KEY || !r->key)
        return false;
    if (r->type != LSM_PUT && r->type != LSM_DELETE)
        return false;
    if (r->type == LSM_PUT && (r->vlen > LSM_MAX_VALUE || (r->vlen && !r->value)))
        return false;
    return (r->flags & ~LSM_RECC_FLAGS) == 0;
}

void lsm_rec_encode(uint8_t *d, const lsm_rec *r)
{
    size_t vlen = r->type == LSM_PUT ? r->vlen : 0;
    lsm_set32(d, (uint32_t)r->klen);
    lsm_set32(d + 4, (uint32_t)vlen);
    lsm_set64(d + 8, r->version);
    lsm_set64(d + 16, r->seqno);
    lsm_set64(d + 24, r->expire_at);
    d[32] = r->type;
    d[33] = r->flags;
    memcpy(d + LSM_REC_HDR, r->key, r->klen);
    if (vlen)
        memcpy(d + LSM_REC_HDR + r->klen, r->value, vlen);
}

kv_err lsm_rec_decode(const uint8_t *p, size_t avail, lsm_rec *r, size_t *used)
{
    if (avail < LSM_REC_HDR)
        return KV_DATA_LOSS;
    uint32_t klen = lsm_get32(p), vlen = lsm_get32(p + 4);
    if (klen == 0 || klen > LSM_MAX_KEY || vlen > LSM_MAX_VALUE ||
        (uint64_t)LSM_REC_HDR + klen + vlen > avail)
        return KV_DATA_LOSS;
    uint8_t type = p[32];
    if ((type != LSM_PUT && type != LSM_DELETE) || (p[33] & ~LSM_RECC_FLAGS))
        return KV_DATA_LOSS;
    r->klen = klen;
    r->vlen = vlen;
    r->version = lsm_get64(p + 8);
    r->seqno = lsm_get64(p + 16);
    r->expire_at = lsm_get64(p + 24);
    r->type = type;
    r->flags = p[33];
    r->key = p + LSM_REC_HDR;
    r->value = vlen ? p + LSM_REC_HDR + klen : NULL;
    *used = LSM_REC_HDR + klen + vlen;
    return KV_OK;
}

/* ---- compact records (SST format 3) ---- */

/* Reads a varint of at most max_bits bits from [*p, end); false when it runs
 * past end, is longer than 10 bytes or does not fit max_bits. */
static bool varint_get(const uint8_t **p, const uint8_t *end, unsigned max_bits, uint64_t *v)
{
    uint64_t x = 0;
    const uint8_t *q = *p;
    for (unsigned shift = 0; q < end && shift < 64; shift += 7) {
        uint64_t b = *q++;
        if (shift == 63 && b > 1)
            return false; /* bits past 64 */
        x |= (b & 0x7f) << shift;
        if (!(b & 0x80)) {
            if (max_bits < 64 && x >> max_bits)
                return false;
            *v = x;
            *p = q;
            return true;
        }
    }
    return false;
}

size_t lsm_recc_size(const lsm_rec *r)
{
    size_t n = 1 + kv_varint_len(r->klen) + kv_varint_len(r->seqno) + r->klen;
    if (r->type == LSM_PUT)
        n += kv_varint_len(r->vlen) + r->vlen;
    if (r->version)
        n += 8;
    if (r->expire_at)
        n += kv_varint_len(r->expire_at);
    return n;
}

size_t lsm_recc_encode(uint8_t *dst, const lsm_rec *r)
{
    uint8_t *d = dst;
    *d++ = (uint8_t)((r->type & 3u) | (r->version ? LSM_RECC_VER : 0) |
                     (r->expire_at ? LSM_RECC_EXP : 0) | (r->flags & LSM_RECC_FLAGS) << 4);
    d = kv_varint_put(d, r->klen);
    if (r->type == LSM_PUT)
        d = kv_varint_put(d, r->vlen);
    d = kv_varint_put(d, r->seqno);
    if (r->version) {
        lsm_set64(d, r->version);
        d += 8;
    }
    if (r->expire_at)
        d = kv_varint_put(d, r->expire_at);
    memcpy(d, r->key, r->klen);
    d += r->klen;
    if (r->type == LSM_PUT && r->vlen) {
        memcpy(d, r->value, r->vlen);
        d += r->vlen;
    }
    return (size_t)(d - dst);
}

kv_err lsm_recc_decode(const uint8_t *p, size_t avail, lsm_rec *r, size_t *used)
{
    const uint8_t *q = p, *end = p + avail;
    if (avail < 1)
        return KV_DATA_LOSS;
    uint8_t head = *q++, type = head & 3u;
    if (type != LSM_PUT && type != LSM_DELETE)
        return KV_DATA_LOSS;
    uint64_t klen, vlen = 0, seqno, expire = 0, version = 0;
    if (!varint_get(&q, end, 32, &klen) || klen == 0 || klen > LSM_MAX_KEY)
        return KV_DATA_LOSS;
    if (type == LSM_PUT && (!varint_get(&q, end, 32, &vlen) || vlen > LSM_MAX_VALUE))
        return KV_DATA_LOSS;
    if (!varint_get(&q, end, 64, &seqno))
        return KV_DATA_LOSS;
    if (head & LSM_RECC_VER) {
        if ((size_t)(end - q) < 8)
            return KV_DATA_LOSS;
        version = lsm_get64(q);
        q += 8;
    }
    if ((head & LSM_RECC_EXP) && !varint_get(&q, end, 64, &expire))
        return KV_DATA_LOSS;
    if ((uint64_t)(end - q) < klen + vlen)
        return KV_DATA_LOSS;
    r->klen = (size_t)klen;
    r->vlen = (size_t)vlen;
    r->version = version;
    r->seqno = seqno;
    r->expire_at = expire;
    r->type = type;
    r->flags = head >> 4;
    r->key = q;
    r->value = vlen ? q + klen : NULL;
    *used = (size_t)(q - p) + (size_t)klen + (size_t)vlen;
    return KV_OK;
}

/* ---- block entries (SST format 4) ---- */

size_t lsm_blkrec_size(const lsm_rec *r, size_t shared)
{
    lsm_rec s = *r;
    s.klen -= shared;
    return kv_varint_len(shared) + lsm_recc_size(&s);
}

size_t lsm_blkrec_encode(uint8_t *dst, const lsm_rec *r, size_t shared)
{
    lsm_rec s = *r;
    s.key = (const uint8_t *)r->key + shared;
    s.klen -= shared;
    uint8_t *d = kv_varint_put(dst, shared);
    return (size_t)(d - dst) + lsm_recc_encode(d, &s);
}

kv_err lsm_blkrec_decode(const uint8_t *p, size_t avail, size_t *shared, lsm_rec *r, size_t *used)
{
    const uint8_t *q = p;
    uint64_t sh;
    size_t n;
    if (!varint_get(&q, p + avail, 32, &sh) || sh > LSM_MAX_KEY)
        return KV_DATA_LOSS;
    size_t hl = (size_t)(q - p);
    if (lsm_recc_decode(q, avail - hl, r, &n) != KV_OK || sh + r->klen > LSM_MAX_KEY)
        return KV_DATA_LOSS;
    *shared = (size_t)sh;
    *used = hl + n;
    return KV_OK;
}

kv_err lsm_rec_decode_as(bool compact, const uint8_t *p, size_t avail, lsm_rec *r, size_t *used)
{
    return compact ? lsm_recc_decode(p, avail, r, used) : lsm_rec_decode(p, avail, r, used);
}

kv_err lsm_rec_copy(lsm_rec *out, const lsm_rec *r)
{
    void *k = malloc(r->klen);
    void *v = r->vlen ? malloc(r->vlen) : NULL;
    if (!k || (r->vlen && !v)) {
        free(k);
        free(v);
        return KV_RESOURCE_EXHAUSTED;
    }
    memcpy(k, r->key, r->klen);
    if (r->vlen)
        memcpy(v, r->value, r->vlen);
    *out = *r;
    out->key = k;
    out->value = v;
    return KV_OK;
}

int lsm_key_cmp(const void *a, size_t al, const void *b, size_t bl)
{
    size_t n = al < bl ? al : bl;
    int c = n ? memcmp(a, b, n) : 0;
    if (c)
        return c;
    return al < bl ? -1 : al > bl ? 1 : 0;
}

kv_err lsm_errno(int e)
{
    if (e < 0)
        e = -e;
    if (e == ENOSPC || e == EDQUOT)
        return KV_RESOURCE_EXHAUSTED;
    return KV_INTERNAL;
}

/* ---- public helpers ---- */

void lsm_rec_free(lsm_rec *rec)
{
    if (!rec)
        return;
    free((void *)rec->key);
    free((void *)rec->value);
    rec->key = rec->value = NULL;
    rec->klen = rec->vlen = 0;
}
