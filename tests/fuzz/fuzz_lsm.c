/* SPDX-License-Identifier: MIT */
/*
 * The framing helpers of fuzz_lsm.h, written from the format comments of
 * node/lsm: WAL frames (wal.c), MANIFEST frames (manifest.c) and the SST
 * layout [blocks + crc][bloom + crc][index + crc][footer 48 B] (sst.c).
 */
#include "fuzz_lsm.h"

#include <stdlib.h>

#include "fuzz_util.h"

/* "LSMSSST" and the format version's digit */
#define SST_MAGIC_BASE 0x30545353534d534cull
#define FOOTER_LEN 48u

static uint8_t *grow(lsm_buf *b, size_t n)
{
    FZ_CHECK(lsm_buf_reserve(b, n) == KV_OK, "out of memory");
    uint8_t *p = b->p + b->len;
    b->len += n;
    return p;
}

void fz_wal_frame(lsm_buf *b, const void *payload, size_t len, bool compact)
{
    uint8_t *h = grow(b, LSM_FRAME_HDR + len);
    lsm_set32(h + 4, (uint32_t)len | (compact ? 0x80000000u : 0)); /* wal.c's FRAME_COMPACT */
    if (len)
        memcpy(h + LSM_FRAME_HDR, payload, len);
    lsm_set32(h, kv_crc32c(0, h + 4, len + 4));
}

void fz_man_frame(lsm_buf *b, const void *payload, size_t len)
{
    uint8_t *h = grow(b, 12 + len);
    lsm_set32(h + 4, (uint32_t)len);
    lsm_set32(h + 8, kv_crc32c(0, h + 4, 4));
    if (len)
        memcpy(h + 12, payload, len);
    lsm_set32(h, kv_crc32c(kv_crc32c(0, h + 4, 4), h + 12, len));
}

/* Sets the CRC after [off, off + n) when it lies inside the image. */
static void fix_span(uint8_t *img, size_t len, uint64_t off, uint64_t n)
{
    if (off > len || n > len - off || len - off - n < 4)
        return;
    lsm_set32(img + off + n, kv_crc32c(0, img + off, n));
}

/* Walks the index entries [u32 klen][key][u64 off][u32 len] and fixes the
 * CRC of each data block they name. */
static void fix_blocks(uint8_t *img, size_t len, uint64_t ioff, uint32_t ilen)
{
    if (ioff > len || ilen > len - ioff)
        return;
    const uint8_t *p = img + ioff, *end = p + ilen;
    while (end - p >= 4) {
        uint32_t klen = lsm_get32(p);
        if ((uint64_t)(end - p) < 16ull + klen)
            return;
        uint64_t boff = lsm_get64(p + 4 + klen);
        uint32_t blen = lsm_get32(p + 12 + klen);
        if (boff + blen + 4 <= ioff) /* never write over the index itself */
            fix_span(img, len, boff, blen);
        p += 16 + klen;
    }
}

void fz_sst_fix(uint8_t *img, size_t len)
{
    if (len < FOOTER_LEN)
        return;
    uint8_t *f = img + len - FOOTER_LEN;
    uint32_t version = lsm_get32(f + 40); /* the magic of the version the image names */
    lsm_set64(f + 32,
              SST_MAGIC_BASE +
                  ((uint64_t)(version >= 1 && version <= LSM_SST_FORMAT ? version : 1) << 56));
    lsm_set32(f + 44, kv_crc32c(0, f, 44));
    uint64_t ioff = lsm_get64(f), boff = lsm_get64(f + 16);
    uint32_t ilen = lsm_get32(f + 8), blen = lsm_get32(f + 12);
    fix_blocks(img, len - FOOTER_LEN, ioff, ilen);
    fix_span(img, len - FOOTER_LEN, boff, blen);
    fix_span(img, len - FOOTER_LEN, ioff, ilen);
    lsm_set32(f + 44, kv_crc32c(0, f, 44));
}
