/* SPDX-License-Identifier: MIT */
/*
 * kallax block images: the 16-byte header (magic, crc32c over the block
 * number and the rest of the block, record count, bytes used, spill hint)
 * and the packed records after it (kallax.h has the layout). Pure functions
 * over a 4 KiB buffer: finding, removing and appending records, checking and
 * sealing an image, and summing it up for the store's counters. Records are
 * kept packed from the header on; the bytes past `used` are zero, so equal
 * contents give equal images (and compress alike).
 */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "node/kallax/kallax_int.h"

static uint16_t get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static void set16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, 2);
}

void kx_block_init(uint8_t *img)
{
    memset(img, 0, KALLAX_BLOCK);
    lsm_set32(img, KX_MAGIC);
}

static uint32_t block_crc(const uint8_t *img, uint64_t blk)
{
    uint8_t b[8];
    lsm_set64(b, blk);
    return lsm_crc32c(lsm_crc32c(0, b, 8), img + 8, KALLAX_BLOCK - 8);
}

void kx_block_seal(uint8_t *img, uint64_t blk)
{
    lsm_set32(img + 4, block_crc(img, blk));
}

unsigned kx_block_count(const uint8_t *img)
{
    return get16(img + 8);
}

unsigned kx_block_used(const uint8_t *img)
{
    return get16(img + 10);
}

unsigned kx_block_spill(const uint8_t *img)
{
    return img[12];
}

void kx_block_set_spill(uint8_t *img, unsigned spill)
{
    img[12] = (uint8_t)spill;
}

size_t kx_rec_size(size_t klen, size_t vlen, bool ext)
{
    return KX_REC_HDR + klen + (ext ? KX_EXT_REF : vlen);
}

uint64_t kx_ext_pages(uint64_t len)
{
    return len ? (len + KALLAX_BLOCK - 1) / KALLAX_BLOCK : 1;
}

/* Decodes the record at off without trusting it: false when it overruns. */
static bool decode(const uint8_t *img, size_t off, size_t end, kx_slot *s)
{
    if (off + KX_REC_HDR > end)
        return false;
    const uint8_t *p = img + off;
    s->klen = get16(p);
    s->flags = p[2];
    s->vlen = lsm_get32(p + 3);
    s->version = lsm_get64(p + 7);
    s->seqno = lsm_get64(p + 15);
    s->expire_at = lsm_get64(p + 23);
    bool ext = s->flags & KX_F_EXTENT;
    s->size = kx_rec_size(s->klen, s->vlen, ext);
    if (s->klen == 0 || s->klen > KALLAX_MAX_KEY || (s->flags & ~(KX_F_TOMB | KX_F_EXTENT)) ||
        (!ext && s->vlen > KX_PAYLOAD) || off + s->size > end)
        return false;
    s->key = p + KX_REC_HDR;
    s->val = s->key + s->klen;
    s->off = off;
    s->ext_page = ext ? lsm_get64(s->val) : 0;
    s->ext_crc = ext ? lsm_get32(s->val + 12) : 0;
    return !ext || lsm_get32(s->val + 8) == s->vlen;
}

kv_err kx_block_check(const uint8_t *img, uint64_t blk)
{
    if (lsm_get32(img) != KX_MAGIC || lsm_get32(img + 4) != block_crc(img, blk))
        return KV_DATA_LOSS;
    size_t used = kx_block_used(img), off = KX_HDR;
    if (used > KX_PAYLOAD)
        return KV_DATA_LOSS;
    for (unsigned i = 0; i < kx_block_count(img); i++) { /* a crc match with a bad layout */
        kx_slot s;
        if (!decode(img, off, KX_HDR + used, &s))
            return KV_DATA_LOSS;
        off += s.size;
    }
    return off == KX_HDR + used ? KV_OK : KV_DATA_LOSS;
}

void kx_block_next(const uint8_t *img, size_t *off, kx_slot *s)
{
    decode(img, *off, KX_HDR + kx_block_used(img), s);
    *off += s->size;
}

bool kx_block_find(const uint8_t *img, const void *key, size_t klen, kx_slot *s)
{
    size_t off = KX_HDR;
    for (unsigned i = 0; i < kx_block_count(img); i++) {
        kx_block_next(img, &off, s);
        if (s->klen == klen && memcmp(s->key, key, klen) == 0)
            return true;
    }
    return false;
}

void kx_block_remove(uint8_t *img, const kx_slot *s)
{
    size_t end = KX_HDR + kx_block_used(img);
    memmove(img + s->off, img + s->off + s->size, end - s->off - s->size);
    memset(img + end - s->size, 0, s->size);
    set16(img + 8, (uint16_t)(kx_block_count(img) - 1));
    set16(img + 10, (uint16_t)(kx_block_used(img) - s->size));
}

bool kx_block_add(uint8_t *img, const lsm_rec *r, bool ext, uint64_t page, uint32_t crc)
{
    bool tomb = r->type == LSM_DELETE;
    size_t vlen = tomb ? 0 : r->vlen, size = kx_rec_size(r->klen, vlen, ext);
    size_t used = kx_block_used(img);
    if (used + size > KX_PAYLOAD)
        return false;
    uint8_t *p = img + KX_HDR + used;
    set16(p, (uint16_t)r->klen);
    p[2] = (uint8_t)((tomb ? KX_F_TOMB : 0) | (ext ? KX_F_EXTENT : 0));
    lsm_set32(p + 3, (uint32_t)vlen);
    lsm_set64(p + 7, r->version);
    lsm_set64(p + 15, r->seqno);
    lsm_set64(p + 23, r->expire_at);
    memcpy(p + KX_REC_HDR, r->key, r->klen);
    uint8_t *v = p + KX_REC_HDR + r->klen;
    if (ext) {
        lsm_set64(v, page);
        lsm_set32(v + 8, (uint32_t)vlen);
        lsm_set32(v + 12, crc);
    } else if (vlen) {
        memcpy(v, r->value, vlen);
    }
    set16(img + 8, (uint16_t)(kx_block_count(img) + 1));
    set16(img + 10, (uint16_t)(used + size));
    return true;
}

kv_err kx_slot_copy(const kx_slot *s, lsm_rec *out)
{
    bool ext = s->flags & KX_F_EXTENT, tomb = s->flags & KX_F_TOMB;
    uint8_t *k = malloc(s->klen);
    uint8_t *v = !tomb && !ext ? malloc(s->vlen ? s->vlen : 1) : NULL;
    if (!k || (!tomb && !ext && !v)) {
        free(k);
        free(v);
        return KV_RESOURCE_EXHAUSTED;
    }
    memcpy(k, s->key, s->klen);
    if (v && s->vlen)
        memcpy(v, s->val, s->vlen);
    *out = (lsm_rec){.key = k,
                     .klen = s->klen,
                     .value = v,
                     .vlen = tomb ? 0 : s->vlen,
                     .version = s->version,
                     .seqno = s->seqno,
                     .expire_at = s->expire_at,
                     .type = tomb ? LSM_DELETE : LSM_PUT};
    return KV_OK;
}

void kx_block_sum(const kallax *kx, const uint8_t *img, uint64_t blk, kx_sum *out)
{
    memset(out, 0, sizeof(*out));
    size_t off = KX_HDR;
    out->used = kx_block_used(img);
    for (unsigned i = 0; i < kx_block_count(img); i++) {
        kx_slot s;
        kx_block_next(img, &off, &s);
        out->records++;
        out->tombstones += (s.flags & KX_F_TOMB) != 0;
        out->spilled += kallax_home(kx, s.key, s.klen) != blk;
        out->ext_pages += s.flags & KX_F_EXTENT ? kx_ext_pages(s.vlen) : 0;
    }
}

uint64_t kallax_home(const kallax *kx, const void *key, size_t klen)
{
    return kv_hash64(key, klen, KALLAX_SEED) % kx->o.blocks;
}

int kallax_key_cmp(const kallax *kx, const void *a, size_t al, const void *b, size_t bl)
{
    uint64_t ha = kallax_home(kx, a, al), hb = kallax_home(kx, b, bl);
    if (ha != hb)
        return ha < hb ? -1 : 1;
    return lsm_key_cmp(a, al, b, bl);
}
