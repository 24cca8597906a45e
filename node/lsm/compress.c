/* SPDX-License-Identifier: MIT */
/*
 * Block compression for SST data blocks (sst.c) and the --compression flag.
 * A compressed block's payload is [u32 raw length][codec output]; LZ4 uses
 * the one-shot API (its state on the stack), zstd a context per builder for
 * compression (level 3, the library default, as RocksDB) and one per thread
 * for decompression (freed at thread exit), so neither allocates per block.
 * Decompression is bounds-checked: a corrupt block yields DATA_LOSS, never a
 * write past the buffer (the caller has already verified the block's CRC,
 * so this guards against bugs and deliberate corruption of both).
 */
#include <lz4.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <zstd.h>

#include "node/lsm/lsm_int.h"

#define ZSTD_LEVEL 3

const char *lsm_compression_name(lsm_compression c)
{
    switch (c) {
    case LSM_COMPRESS_NONE:
        return "none";
    case LSM_COMPRESS_LZ4:
        return "lz4";
    case LSM_COMPRESS_ZSTD:
        return "zstd";
    default:
        return "auto";
    }
}

static bool codec_of(const char *s, size_t n, lsm_compression *out)
{
    static const lsm_compression all[] = {LSM_COMPRESS_NONE, LSM_COMPRESS_LZ4, LSM_COMPRESS_ZSTD};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        const char *name = lsm_compression_name(all[i]);
        if (strlen(name) == n && strncasecmp(s, name, n) == 0) {
            *out = all[i];
            return true;
        }
    }
    return false;
}

kv_err lsm_compression_parse(const char *spec, lsm_compression_spec *out, char *err, size_t errlen)
{
    lsm_compression_spec r = {0};
    if (!spec || !*spec || strcasecmp(spec, "auto") == 0) {
        *out = r;
        return KV_OK;
    }
    int nlevel = 0, nvol = 0;
    lsm_compression last = LSM_COMPRESS_DEFAULT;
    for (const char *p = spec; *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        lsm_compression c;
        const char *cs = eq ? eq + 1 : p;
        size_t cn = eq ? n - (size_t)(eq + 1 - p) : n;
        if (!codec_of(cs, cn, &c)) {
            snprintf(err, errlen, "compression '%.*s' in '%s': expected none, lz4 or zstd", (int)cn,
                     cs, spec);
            return KV_INVALID_ARGUMENT;
        }
        if (eq) {
            size_t kn = (size_t)(eq - p);
            if (kn == 4 && strncasecmp(p, "fast", 4) == 0)
                r.fast = c;
            else if (kn == 4 && strncasecmp(p, "slow", 4) == 0)
                r.slow = c;
            else {
                snprintf(err, errlen, "compression '%s': '%.*s=' must be fast= or slow=", spec,
                         (int)kn, p);
                return KV_INVALID_ARGUMENT;
            }
            nvol++;
        } else {
            if (nlevel == LSM_MAX_LEVELS) {
                snprintf(err, errlen, "compression '%s': more than %d levels", spec,
                         LSM_MAX_LEVELS);
                return KV_INVALID_ARGUMENT;
            }
            r.level[nlevel++] = last = c;
        }
        p = end ? end + 1 : p + n;
        if (end && !*p) {
            snprintf(err, errlen, "compression '%s': empty entry", spec);
            return KV_INVALID_ARGUMENT;
        }
    }
    if (nlevel && nvol) {
        snprintf(err, errlen, "compression '%s': give codecs by level or by volume, not both",
                 spec);
        return KV_INVALID_ARGUMENT;
    }
    for (int l = nlevel; nlevel && l < LSM_MAX_LEVELS; l++)
        r.level[l] = last;
    *out = r;
    return KV_OK;
}

lsm_compression lsm_compression_for(const lsm_compression_spec *s, int level, lsm_tier tier)
{
    if (level >= 0 && level < LSM_MAX_LEVELS && s->level[level] != LSM_COMPRESS_DEFAULT)
        return s->level[level];
    lsm_compression c = tier == LSM_TIER_SD ? s->slow : s->fast;
    if (c != LSM_COMPRESS_DEFAULT)
        return c;
    return tier == LSM_TIER_SD ? LSM_COMPRESS_LZ4 : LSM_COMPRESS_NONE;
}

/* ---- codecs ---- */

static pthread_key_t dctx_key;
static pthread_once_t dctx_once = PTHREAD_ONCE_INIT;

static void dctx_free(void *p)
{
    ZSTD_freeDCtx(p);
}

static void dctx_init(void)
{
    pthread_key_create(&dctx_key, dctx_free);
}

/* This thread's zstd decompression context (created on first use). */
static ZSTD_DCtx *thread_dctx(void)
{
    pthread_once(&dctx_once, dctx_init);
    ZSTD_DCtx *d = pthread_getspecific(dctx_key);
    if (!d && (d = ZSTD_createDCtx()) != NULL)
        pthread_setspecific(dctx_key, d);
    return d;
}

void lsm_zctx_free(void *zctx)
{
    ZSTD_freeCCtx(zctx);
}

kv_err lsm_block_compress(uint8_t codec, const uint8_t *src, size_t n, lsm_buf *dst, void **zctx,
                          bool *stored)
{
    *stored = false;
    if (codec == LSM_CODEC_NONE || n < 64 || n > (size_t)LZ4_MAX_INPUT_SIZE)
        return KV_OK;
    size_t bound =
        codec == LSM_CODEC_LZ4 ? (size_t)LZ4_compressBound((int)n) : ZSTD_compressBound(n);
    dst->len = 0;
    kv_err rv = lsm_buf_reserve(dst, 4 + bound);
    if (rv != KV_OK)
        return rv;
    size_t out;
    if (codec == LSM_CODEC_LZ4) {
        int m = LZ4_compress_default((const char *)src, (char *)dst->p + 4, (int)n, (int)bound);
        if (m <= 0)
            return KV_OK; /* store raw */
        out = (size_t)m;
    } else {
        if (!*zctx && !(*zctx = ZSTD_createCCtx()))
            return KV_RESOURCE_EXHAUSTED;
        out = ZSTD_compressCCtx(*zctx, dst->p + 4, bound, src, n, ZSTD_LEVEL);
        if (ZSTD_isError(out))
            return KV_OK;
    }
    if (4 + out > n - n / 8) /* RocksDB's rule: keep it only if it saves 12.5% */
        return KV_OK;
    lsm_set32(dst->p, (uint32_t)n);
    dst->len = 4 + out;
    *stored = true;
    return KV_OK;
}

kv_err lsm_block_decompress(uint8_t codec, const uint8_t *src, size_t n, lsm_buf *dst)
{
    if (n < 4 || (codec != LSM_CODEC_LZ4 && codec != LSM_CODEC_ZSTD))
        return KV_DATA_LOSS;
    uint32_t raw = lsm_get32(src);
    if (raw == 0 || raw > LSM_MAX_BLOCK_RAW)
        return KV_DATA_LOSS;
    dst->len = 0;
    kv_err rv = lsm_buf_reserve(dst, raw);
    if (rv != KV_OK)
        return rv;
    if (codec == LSM_CODEC_LZ4) {
        int m = LZ4_decompress_safe((const char *)src + 4, (char *)dst->p, (int)(n - 4), (int)raw);
        if (m < 0 || (uint32_t)m != raw)
            return KV_DATA_LOSS;
    } else {
        ZSTD_DCtx *d = thread_dctx();
        if (!d)
            return KV_RESOURCE_EXHAUSTED;
        size_t m = ZSTD_decompressDCtx(d, dst->p, raw, src + 4, n - 4);
        if (ZSTD_isError(m) || m != raw)
            return KV_DATA_LOSS;
    }
    dst->len = raw;
    return KV_OK;
}
