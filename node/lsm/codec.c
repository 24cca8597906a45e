/* SPDX-License-Identifier: MIT */
/*
 * Byte-level helpers of the LSM: growable buffers, CRC32C (Castagnoli
 * polynomial 0x82F63B78, table-driven slice-by-8 with an SSE4.2 path chosen at
 * run time), the on-disk record codec shared by WAL frames and SST blocks,
 * and errno mapping. Everything here is pure and
 * thread-safe.
 */
#include <errno.h>
#include <pthread.h>
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

/* ---- CRC32C ---- */

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static bool crc_hw;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
#if defined(__x86_64__)
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

static uint32_t crc_sw(uint32_t c, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint64_t w = lsm_get64(p) ^ c;
        c = crc_tab[7][w & 0xff] ^ crc_tab[6][(w >> 8) & 0xff] ^ crc_tab[5][(w >> 16) & 0xff] ^
            crc_tab[4][(w >> 24) & 0xff] ^ crc_tab[3][(w >> 32) & 0xff] ^
            crc_tab[2][(w >> 40) & 0xff] ^ crc_tab[1][(w >> 48) & 0xff] ^ crc_tab[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc_tab[0][(c ^ *p++) & 0xff];
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw64(uint32_t c, const uint8_t *p, size_t n)
{
    uint64_t c64 = c;
    while (n >= 8) {
        c64 = __builtin_ia32_crc32di(c64, lsm_get64(p));
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--)
        c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
#endif

uint32_t lsm_crc32c(uint32_t crc, const void *p, size_t n)
{
    pthread_once(&crc_once, crc_init);
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (crc_hw)
        return ~crc_hw64(c, p, n);
#endif
    return ~crc_sw(c, p, n);
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
