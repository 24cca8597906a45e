/* SPDX-License-Identifier: MIT */
/*
 * SST files: immutable sorted runs with one record per key.
 *
 *   [data block][codec][crc32c] ... [bloom][crc32c] [index][crc32c] [footer 48 B]
 *
 * A data block's records are a run of encoded records (codec.c) followed by
 * a u32 offset per record and a u32 record count, so lookups binary-search
 * it. Format version 2 (magic LSMSSST2) stores each data block as written by
 * its codec (compress.c: none, lz4 or zstd, chosen per block: a block that
 * does not shrink by 1/8 is stored raw) followed by one codec byte; the CRC
 * covers both, and the index's block length counts the codec byte. Version 1
 * (magic LSMSSST1, written before block compression) has no codec byte: its
 * blocks are raw. Version 3 (magic LSMSSST3) is version 2 with records in the
 * compact codec (codec.c: varint lengths and seqno, the version and the
 * expiry only when set; 15-17 header bytes for a 1 KiB put instead of 34).
 * Version 4 (magic LSMSSST4) shares key prefixes, as LevelDB's blocks do:
 * each entry is [varint shared][compact record holding the key's suffix],
 * shared counting the leading bytes in common with the previous key of the
 * block, and every SST_RESTART-th entry is a restart point (shared 0, the
 * whole key) whose offset is listed at the block's end with the count of
 * restarts, in place of version 3's offset per record. A lookup
 * binary-searches the restart points, then scans one interval comparing
 * suffixes against the key without rebuilding it; the sequential iterator
 * rebuilds each key. Readers open all four, builders write version 4. The index
 * holds, per block, its last key, offset and length; the bloom filter
 * uses 10 bits per key and 7 probes derived from one xxh64 by double hashing
 * (Kirsch & Mitzenmacher). The footer (index/bloom position, entry count,
 * magic, version, its own crc) is read at open together with the index and
 * the bloom, which stay in memory (uncompressed); data blocks are read on
 * demand through the volume layer, verified and decompressed before use. A
 * corrupt block yields DATA_LOSS and a log line naming the file, never a
 * crash or wrong data. Readers are immutable after open and safe to share
 * between threads; a builder belongs to one thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/log.h"
#include "node/lsm/lsm_int.h"

/* The footer's magic of format version v (1..LSM_SST_FORMAT): "LSMSSST"
 * and v's digit, little-endian ("LSMSSST1" raw blocks, "LSMSSST2" a codec
 * byte per block, "LSMSSST3" compact records, "LSMSSST4" shared prefixes). */
#define SST_MAGIC(v) (0x30545353534d534cull + ((uint64_t)(v) << 56))
#define SST_RESTART 16u /* entries per restart interval (version 4) */
#define FOOTER_LEN 48u
#define BLOOM_BITS_PER_KEY 10u
#define BLOOM_K 7u
#define BLOOM_SEED 0x6c736d626c6f6f6dull
#define WRITE_CHUNK (256u << 10)

struct lsm_sst {
    lsm_vol *v;
    int fd;
    uint64_t number, size, nentries;
    uint32_t version; /* 1 to 4 (format, see the top) */
    char path[512];
    uint8_t *index;
    uint32_t nblocks;
    uint32_t *bent; /* where each block's entry starts in index (4 bytes a block) */
    uint8_t *bloom;
    uint64_t bloom_bits;
    unsigned k;
    uint64_t mem; /* bytes kept in memory while open (index, bloom, block table) */
};

struct lsm_sst_builder {
    lsm_vol *v;
    uint64_t number;
    int fd;
    unsigned block_size;
    lsm_buf out, blk, offs, index, last, first; /* offs: the block's restart offsets */
    uint64_t off;                               /* file offset of out.p[0] */
    uint32_t nblk;
    uint64_t *hashes;
    size_t nh, hcap;
    uint64_t count, min_seq, max_seq, max_version, ntwins;
    bool nosync;                  /* lsm_sst_builder_nosync */
    uint8_t codec;                /* LSM_CODEC_* for data blocks */
    lsm_buf cbuf;                 /* compressed block */
    void *zctx;                   /* zstd context (compress.c) */
    _Atomic uint64_t *cin, *cout; /* lsm_sst_builder_compress counters, may be NULL */
};

void lsm_sst_name(char *buf, size_t cap, uint64_t number)
{
    snprintf(buf, cap, "%06" PRIu64 ".sst", number);
}

/* ---- bloom ---- */

static void bloom_set(uint8_t *bits, uint64_t nbits, uint64_t h)
{
    uint64_t h1 = (uint32_t)h, h2 = (h >> 32) | 1;
    for (unsigned i = 0; i < BLOOM_K; i++) {
        uint64_t b = (h1 + i * h2) % nbits;
        bits[b / 8] |= (uint8_t)(1u << (b % 8));
    }
}

bool lsm_sst_may_contain(const lsm_sst *s, const void *key, size_t klen)
{
    if (!s->bloom_bits)
        return true;
    uint64_t h = kv_hash64(key, klen, BLOOM_SEED);
    uint64_t h1 = (uint32_t)h, h2 = (h >> 32) | 1;
    for (unsigned i = 0; i < s->k; i++) {
        uint64_t b = (h1 + i * h2) % s->bloom_bits;
        if (!(s->bloom[b / 8] & (1u << (b % 8))))
            return false;
    }
    return true;
}

/* ---- builder ---- */

kv_err lsm_sst_builder_open(lsm_sst_builder **out, lsm_vol *v, uint64_t number, unsigned block_size)
{
    lsm_sst_builder *b = calloc(1, sizeof(*b));
    if (!b)
        return KV_RESOURCE_EXHAUSTED;
    char name[64];
    lsm_sst_name(name, sizeof(name), number);
    b->fd = lsm_vol_open(v, name, O_WRONLY | O_CREAT | O_TRUNC);
    if (b->fd < 0) {
        kv_err rv = lsm_errno(b->fd);
        KV_ERROR(LSM_LOG, "create %s/%s: %s", v->dir, name, strerror(-b->fd));
        free(b);
        return rv;
    }
    b->v = v;
    b->number = number;
    b->block_size = block_size;
    b->min_seq = UINT64_MAX;
    *out = b;
    return KV_OK;
}

static kv_err write_out(lsm_sst_builder *b, bool sync)
{
    kv_err rv = lsm_vol_write(b->v, b->fd, b->out.p, b->out.len, b->off, sync);
    if (rv != KV_OK)
        return rv;
    b->off += b->out.len;
    b->out.len = 0;
    return KV_OK;
}

/* Appends payload + crc to the output; *at = its file offset. */
static kv_err put_checked(lsm_sst_builder *b, const lsm_buf *payload, uint64_t *at)
{
    *at = b->off + b->out.len;
    kv_err rv = lsm_buf_put(&b->out, payload->p, payload->len);
    if (rv == KV_OK)
        rv = lsm_buf_put32(&b->out, kv_crc32c(0, payload->p, payload->len));
    return rv;
}

/* Appends a data block (stored bytes + codec byte + crc over both); *at =
 * its file offset, *len = its length without the crc. */
static kv_err put_block(lsm_sst_builder *b, const uint8_t *p, size_t n, uint8_t codec, uint64_t *at,
                        uint32_t *len)
{
    *at = b->off + b->out.len;
    *len = (uint32_t)(n + 1);
    kv_err rv = lsm_buf_reserve(&b->out, n + 5);
    if (rv != KV_OK)
        return rv;
    lsm_buf_put(&b->out, p, n);
    lsm_buf_put(&b->out, &codec, 1);
    return lsm_buf_put32(&b->out, kv_crc32c(0, b->out.p + b->out.len - n - 1, n + 1));
}

static kv_err flush_block(lsm_sst_builder *b)
{
    kv_err rv = lsm_buf_put(&b->blk, b->offs.p, b->offs.len);
    if (rv == KV_OK)
        rv = lsm_buf_put32(&b->blk, (uint32_t)(b->offs.len / 4));
    bool packed = false;
    if (rv == KV_OK)
        rv = lsm_block_compress(b->codec, b->blk.p, b->blk.len, &b->cbuf, &b->zctx, &packed);
    uint64_t at;
    uint32_t len = 0;
    if (rv == KV_OK)
        rv = packed ? put_block(b, b->cbuf.p, b->cbuf.len, b->codec, &at, &len)
                    : put_block(b, b->blk.p, b->blk.len, LSM_CODEC_NONE, &at, &len);
    if (rv == KV_OK && b->cin && b->codec != LSM_CODEC_NONE) {
        atomic_fetch_add_explicit(b->cin, b->blk.len, memory_order_relaxed);
        atomic_fetch_add_explicit(b->cout, len - 1, memory_order_relaxed);
    }
    if (rv == KV_OK)
        rv = lsm_buf_put32(&b->index, (uint32_t)b->last.len);
    if (rv == KV_OK)
        rv = lsm_buf_put(&b->index, b->last.p, b->last.len);
    if (rv == KV_OK)
        rv = lsm_buf_put64(&b->index, at);
    if (rv == KV_OK)
        rv = lsm_buf_put32(&b->index, len);
    b->blk.len = b->offs.len = 0;
    b->nblk = 0;
    if (rv == KV_OK && b->out.len >= WRITE_CHUNK)
        rv = write_out(b, false);
    return rv;
}

void lsm_sst_builder_compress(lsm_sst_builder *b, lsm_compression c, _Atomic uint64_t *in,
                              _Atomic uint64_t *out)
{
    b->codec = c == LSM_COMPRESS_LZ4    ? LSM_CODEC_LZ4
               : c == LSM_COMPRESS_ZSTD ? LSM_CODEC_ZSTD
                                        : LSM_CODEC_NONE;
    b->cin = in;
    b->cout = out;
}

static size_t common_prefix(const uint8_t *a, size_t alen, const void *key, size_t klen)
{
    const uint8_t *k = key;
    size_t n = alen < klen ? alen : klen, i = 0;
    while (i < n && a[i] == k[i])
        i++;
    return i;
}

kv_err lsm_sst_builder_add(lsm_sst_builder *b, const lsm_rec *r)
{
    if (b->count && lsm_key_cmp(b->last.p, b->last.len, r->key, r->klen) >= 0)
        return KV_INVALID_ARGUMENT;
    size_t shared = 0;
    kv_err rv = KV_OK;
    if (b->nblk % SST_RESTART == 0)
        rv = lsm_buf_put32(&b->offs, (uint32_t)b->blk.len);
    else
        shared = common_prefix(b->last.p, b->last.len, r->key, r->klen);
    size_t sz = lsm_blkrec_size(r, shared);
    if (rv == KV_OK)
        rv = lsm_buf_reserve(&b->blk, sz);
    if (rv != KV_OK)
        return rv;
    b->blk.len += lsm_blkrec_encode(b->blk.p + b->blk.len, r, shared);
    b->nblk++;
    b->last.len = 0;
    if ((rv = lsm_buf_put(&b->last, r->key, r->klen)) != KV_OK)
        return rv;
    if (!b->count && (rv = lsm_buf_put(&b->first, r->key, r->klen)) != KV_OK)
        return rv;
    if (b->nh == b->hcap) {
        size_t cap = b->hcap ? b->hcap * 2 : 1024;
        uint64_t *h = realloc(b->hashes, cap * sizeof(*h));
        if (!h)
            return KV_RESOURCE_EXHAUSTED;
        b->hashes = h;
        b->hcap = cap;
    }
    b->hashes[b->nh++] = kv_hash64(r->key, r->klen, BLOOM_SEED);
    b->count++;
    b->min_seq = r->seqno < b->min_seq ? r->seqno : b->min_seq;
    b->max_seq = r->seqno > b->max_seq ? r->seqno : b->max_seq;
    b->max_version = r->version > b->max_version ? r->version : b->max_version;
    b->ntwins += (r->flags & LSM_F_TWIN) != 0;
    if (b->blk.len + b->offs.len + 4 >= b->block_size)
        return flush_block(b);
    return KV_OK;
}

uint64_t lsm_sst_builder_size(const lsm_sst_builder *b)
{
    return b->off + b->out.len + b->blk.len;
}

static void builder_free(lsm_sst_builder *b)
{
    if (b->fd >= 0)
        close(b->fd);
    lsm_buf_free(&b->out);
    lsm_buf_free(&b->blk);
    lsm_buf_free(&b->offs);
    lsm_buf_free(&b->index);
    lsm_buf_free(&b->last);
    lsm_buf_free(&b->first);
    lsm_buf_free(&b->cbuf);
    lsm_zctx_free(b->zctx);
    free(b->hashes);
    free(b);
}

void lsm_sst_builder_abort(lsm_sst_builder *b)
{
    if (!b)
        return;
    char name[64];
    lsm_sst_name(name, sizeof(name), b->number);
    lsm_vol *v = b->v;
    builder_free(b);
    lsm_vol_unlink(v, name);
}

/* Bloom, index and footer, then everything left is written and synced. */
static kv_err finish_tail(lsm_sst_builder *b)
{
    kv_err rv = KV_OK;
    if (b->nblk)
        rv = flush_block(b);
    lsm_buf bloom = {0};
    uint64_t nbits = b->nh * BLOOM_BITS_PER_KEY;
    nbits = nbits < 64 ? 64 : nbits;
    if (rv == KV_OK)
        rv = lsm_buf_reserve(&bloom, nbits / 8 + 2);
    if (rv == KV_OK) {
        bloom.len = (nbits + 7) / 8 + 1;
        memset(bloom.p, 0, bloom.len);
        for (size_t i = 0; i < b->nh; i++)
            bloom_set(bloom.p, (bloom.len - 1) * 8, b->hashes[i]);
        bloom.p[bloom.len - 1] = BLOOM_K;
    }
    uint64_t bloom_off = 0, index_off = 0;
    if (rv == KV_OK)
        rv = put_checked(b, &bloom, &bloom_off);
    if (rv == KV_OK)
        rv = put_checked(b, &b->index, &index_off);
    uint8_t f[FOOTER_LEN] = {0};
    lsm_set64(f, index_off);
    lsm_set32(f + 8, (uint32_t)b->index.len);
    lsm_set32(f + 12, (uint32_t)bloom.len);
    lsm_set64(f + 16, bloom_off);
    lsm_set64(f + 24, b->count);
    lsm_set64(f + 32, SST_MAGIC(LSM_SST_FORMAT));
    lsm_set32(f + 40, LSM_SST_FORMAT);
    lsm_set32(f + 44, kv_crc32c(0, f, 44));
    lsm_buf_free(&bloom);
    if (rv == KV_OK)
        rv = lsm_buf_put(&b->out, f, sizeof(f));
    if (rv == KV_OK)
        rv = write_out(b, !b->nosync);
    return rv;
}

void lsm_sst_builder_nosync(lsm_sst_builder *b)
{
    b->nosync = true;
}

kv_err lsm_sst_builder_finish(lsm_sst_builder *b, int level, lsm_file **out)
{
    lsm_file *f = lsm_file_new();
    kv_err rv = f ? KV_OK : KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK && b->count == 0)
        rv = KV_INVALID_ARGUMENT;
    if (rv == KV_OK)
        rv = finish_tail(b);
    if (rv == KV_OK && !b->nosync)
        rv = lsm_vol_syncdir(b->v);
    if (rv == KV_OK) {
        f->smallest = malloc(b->first.len);
        f->largest = malloc(b->last.len);
        if (!f->smallest || !f->largest)
            rv = KV_RESOURCE_EXHAUSTED;
    }
    if (rv == KV_OK)
        rv = lsm_sst_open(b->v, b->number, &f->sst);
    if (rv != KV_OK) {
        if (f)
            lsm_file_unref(f);
        lsm_sst_builder_abort(b);
        return rv;
    }
    memcpy(f->smallest, b->first.p, b->first.len);
    memcpy(f->largest, b->last.p, b->last.len);
    f->slen = b->first.len;
    f->llen = b->last.len;
    f->number = b->number;
    f->size = b->off;
    f->nentries = b->count;
    f->min_seq = b->min_seq;
    f->max_seq = b->max_seq;
    f->max_version = b->max_version;
    f->ntwins = b->ntwins;
    f->level = level;
    f->tier = b->v->tier;
    f->vol = b->v;
    builder_free(b);
    *out = f;
    return KV_OK;
}

/* ---- reader ---- */

static kv_err sst_corrupt(const lsm_sst *s, const char *what)
{
    KV_ERROR(LSM_LOG, "corrupt SST %s: %s", s->path, what);
    return KV_DATA_LOSS;
}

/* Reads [off, off+len) + crc into a new buffer and verifies it. */
static kv_err read_checked(lsm_sst *s, uint64_t off, uint32_t len, uint8_t **out)
{
    if (off > s->size || (uint64_t)len + 4 > s->size - off) /* no overflow with huge off */
        return sst_corrupt(s, "block past end of file");
    uint8_t *p = malloc((size_t)len + 4);
    if (!p)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = lsm_vol_pread(s->v, s->fd, p, (size_t)len + 4, off);
    if (rv == KV_OK && kv_crc32c(0, p, len) != lsm_get32(p + len))
        rv = sst_corrupt(s, "meta block checksum mismatch");
    if (rv != KV_OK) {
        free(p);
        return rv;
    }
    *out = p;
    return KV_OK;
}

/* Block i's entry in the index: [u32 klen][last key][u64 offset][u32 length]. */
static uint32_t blk_klen(const lsm_sst *s, uint32_t i)
{
    return lsm_get32(s->index + s->bent[i]);
}
static const uint8_t *blk_key(const lsm_sst *s, uint32_t i)
{
    return s->index + s->bent[i] + 4;
}
static uint64_t blk_off(const lsm_sst *s, uint32_t i)
{
    return lsm_get64(blk_key(s, i) + blk_klen(s, i));
}
/* The block's stored bytes without its crc (the codec byte included). */
static uint32_t blk_len(const lsm_sst *s, uint32_t i)
{
    return lsm_get32(blk_key(s, i) + blk_klen(s, i) + 8);
}

static kv_err parse_index(lsm_sst *s, uint32_t len)
{
    uint32_t n = 0;
    for (uint32_t at = 0; at < len; n++) {
        /* 64-bit sums: a key length near 2^32 must not wrap past the check */
        if (len - at < 4 || (uint64_t)len - at - 4 < (uint64_t)lsm_get32(s->index + at) + 12)
            return sst_corrupt(s, "malformed index");
        at += 4 + lsm_get32(s->index + at) + 12;
    }
    if (!(s->bent = malloc(sizeof(*s->bent) * (n + 1))))
        return KV_RESOURCE_EXHAUSTED;
    uint32_t at = 0;
    for (uint32_t i = 0; i < n; i++) {
        s->bent[i] = at;
        at += 16 + lsm_get32(s->index + at);
        /* a block must lie inside the file: readers allocate blen + 4 bytes */
        if (blk_off(s, i) > s->size || (uint64_t)blk_len(s, i) + 4 > s->size - blk_off(s, i))
            return sst_corrupt(s, "index names a block past the end of the file");
    }
    s->nblocks = n;
    return KV_OK;
}

static kv_err load_meta(lsm_sst *s)
{
    off_t end = lseek(s->fd, 0, SEEK_END);
    if (end < (off_t)FOOTER_LEN)
        return sst_corrupt(s, "file too short");
    s->size = (uint64_t)end;
    uint8_t f[FOOTER_LEN];
    kv_err rv = lsm_vol_pread(s->v, s->fd, f, FOOTER_LEN, s->size - FOOTER_LEN);
    if (rv != KV_OK)
        return rv;
    if (kv_crc32c(0, f, 44) != lsm_get32(f + 44))
        return sst_corrupt(s, "bad footer");
    uint64_t magic = lsm_get64(f + 32);
    s->version = lsm_get32(f + 40);
    if (s->version < 1 || s->version > LSM_SST_FORMAT || magic != SST_MAGIC(s->version))
        return sst_corrupt(s, "bad footer (unknown magic or format version)");
    uint32_t ilen = lsm_get32(f + 8), blen = lsm_get32(f + 12);
    s->nentries = lsm_get64(f + 24);
    if ((rv = read_checked(s, lsm_get64(f), ilen, &s->index)) != KV_OK)
        return rv;
    if ((rv = read_checked(s, lsm_get64(f + 16), blen, &s->bloom)) != KV_OK)
        return rv;
    if (blen < 2 || s->bloom[blen - 1] == 0 || s->bloom[blen - 1] > 30)
        return sst_corrupt(s, "malformed bloom filter");
    s->k = s->bloom[blen - 1];
    s->bloom_bits = (uint64_t)(blen - 1) * 8;
    rv = parse_index(s, ilen);
    s->mem = sizeof(*s) + ilen + blen + (uint64_t)s->nblocks * sizeof(*s->bent);
    return rv;
}

uint64_t lsm_sst_mem(const lsm_sst *s)
{
    return s->mem;
}

kv_err lsm_sst_open(lsm_vol *v, uint64_t number, lsm_sst **out)
{
    lsm_sst *s = calloc(1, sizeof(*s));
    if (!s)
        return KV_RESOURCE_EXHAUSTED;
    char name[64];
    lsm_sst_name(name, sizeof(name), number);
    snprintf(s->path, sizeof(s->path), "%s/%s", v->dir, name);
    s->v = v;
    s->number = number;
    s->fd = lsm_vol_open(v, name, O_RDONLY);
    if (s->fd < 0) {
        KV_ERROR(LSM_LOG, "open SST %s: %s", s->path, strerror(-s->fd));
        kv_err rv = s->fd == -ENOENT ? KV_DATA_LOSS : lsm_errno(s->fd);
        free(s);
        return rv;
    }
    kv_err rv = load_meta(s);
    if (rv != KV_OK) {
        lsm_sst_close(s);
        return rv;
    }
    *out = s;
    return KV_OK;
}

void lsm_sst_close(lsm_sst *s)
{
    if (!s)
        return;
    if (s->fd >= 0)
        close(s->fd);
    free(s->index);
    free(s->bloom);
    free(s->bent);
    free(s);
}

const char *lsm_sst_path(const lsm_sst *s)
{
    return s->path;
}

uint32_t lsm_sst_format(const lsm_sst *s)
{
    return s->version;
}

uint32_t lsm_sst_nblocks(const lsm_sst *s)
{
    return s->nblocks;
}

int lsm_sst_find_block(const lsm_sst *s, const void *key, size_t klen)
{
    uint32_t lo = 0, hi = s->nblocks;
    while (lo < hi) { /* first block whose last key >= key */
        uint32_t mid = lo + (hi - lo) / 2;
        if (lsm_key_cmp(blk_key(s, mid), blk_klen(s, mid), key, klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->nblocks ? (int)lo : -1;
}

kv_err lsm_sst_block_io(const lsm_sst *s, int blk, lsm_io *io)
{
    size_t len = (size_t)blk_len(s, (uint32_t)blk) + 4;
    void *buf = malloc(len);
    if (!buf)
        return KV_RESOURCE_EXHAUSTED;
    *io = (lsm_io){
        .vol = s->v, .fd = s->fd, .buf = buf, .len = len, .off = blk_off(s, (uint32_t)blk)};
    return KV_OK;
}

/* Verifies the bytes of block blk read into p (res: bytes read or -errno,
 * want: the bytes asked for). */
static kv_err block_verify(const lsm_sst *s, int blk, const uint8_t *p, long res, size_t want)
{
    char what[96];
    if (res < 0) {
        KV_ERROR(LSM_LOG, "read SST %s block %d: %s", s->path, blk, strerror((int)-res));
        return lsm_errno((int)res);
    }
    uint32_t len = blk_len(s, (uint32_t)blk);
    if ((size_t)res != want || len < (s->version >= 2 ? 5u : 4u)) {
        snprintf(what, sizeof(what), "block %d truncated", blk);
        return sst_corrupt(s, what);
    }
    if (kv_crc32c(0, p, len) != lsm_get32(p + len)) {
        snprintf(what, sizeof(what), "block %d at offset %" PRIu64 " checksum mismatch", blk,
                 blk_off(s, (uint32_t)blk));
        return sst_corrupt(s, what);
    }
    return KV_OK;
}

/* The records of verified block blk at p: *out and *len, pointing into p (raw
 * block) or into scratch (decompressed). */
static kv_err block_decode(const lsm_sst *s, int blk, const uint8_t *p, lsm_buf *scratch,
                           const uint8_t **out, size_t *len)
{
    char what[96];
    size_t n = blk_len(s, (uint32_t)blk);
    const uint8_t *d = p;
    if (s->version >= 2) {
        uint8_t codec = p[--n];
        if (codec != LSM_CODEC_NONE) {
            kv_err rv = lsm_block_decompress(codec, p, n, scratch);
            if (rv == KV_RESOURCE_EXHAUSTED)
                return rv;
            if (rv != KV_OK) {
                snprintf(what, sizeof(what), "block %d: bad compressed data (codec %u)", blk,
                         codec);
                return sst_corrupt(s, what);
            }
            d = scratch->p;
            n = scratch->len;
        }
    }
    if (n < 4 || (uint64_t)lsm_get32(d + n - 4) * 4 + 4 > n) {
        snprintf(what, sizeof(what), "block %d malformed", blk);
        return sst_corrupt(s, what);
    }
    *out = d;
    *len = n;
    return KV_OK;
}

kv_err lsm_sst_block_check(const lsm_sst *s, int blk, lsm_io *io)
{
    kv_err rv = block_verify(s, blk, io->buf, io->res, io->len);
    lsm_buf scratch = {0};
    const uint8_t *p = NULL;
    size_t len = 0;
    if (rv == KV_OK)
        rv = block_decode(s, blk, io->buf, &scratch, &p, &len);
    if (rv != KV_OK) {
        lsm_buf_free(&scratch);
        return rv;
    }
    if (p == scratch.p) { /* decompressed: the payload replaces the read buffer */
        free(io->buf);
        io->buf = scratch.p;
    }
    io->len = len;
    return KV_OK;
}

kv_err lsm_sst_read_block(const lsm_sst *s, int blk, lsm_io *io)
{
    kv_err rv = lsm_sst_block_io(s, blk, io);
    if (rv != KV_OK)
        return rv;
    lsm_vol_read(io, 1);
    rv = lsm_sst_block_check(s, blk, io);
    if (rv != KV_OK) {
        free(io->buf);
        io->buf = NULL;
    }
    return rv;
}

/* Compares the key whose first `shared` bytes equal key's and whose rest is
 * suf[0..slen) with key (klen bytes): the sign, and *lcp = their common
 * prefix length. */
static int cmp_suffix(size_t shared, const uint8_t *suf, size_t slen, const uint8_t *key,
                      size_t klen, size_t *lcp)
{
    size_t n = klen - shared < slen ? klen - shared : slen, i = 0;
    while (i < n && suf[i] == key[shared + i])
        i++;
    *lcp = shared + i;
    if (i < n)
        return suf[i] < key[shared + i] ? -1 : 1;
    return shared + slen < klen ? -1 : shared + slen > klen;
}

/* lsm_block_search for format 4. The restart entries hold whole keys: the
 * binary search finds the last one not above key, then the scan of its
 * interval tracks the entry's common prefix with key (lcp) instead of
 * rebuilding keys. An entry that shares more than lcp bytes with its
 * predecessor differs from key where that one did, so it still sorts below
 * key; otherwise its suffix is compared from byte `shared` on. */
static kv_err search_v4(const uint8_t *buf, size_t len, const uint8_t *key, size_t klen,
                        lsm_rec *out)
{
    uint32_t nr = lsm_get32(buf + len - 4);
    size_t payload = len - 4 - (size_t)nr * 4, shared, used, lcp = 0;
    const uint8_t *rst = buf + payload;
    lsm_rec r;
    int c;
    if (nr == 0 || lsm_get32(rst) != 0) /* a block holds records, the first a restart */
        return KV_DATA_LOSS;
    uint32_t lo = 0, hi = nr;
    while (lo < hi) { /* the first restart whose key is above key */
        uint32_t mid = lo + (hi - lo) / 2, at = lsm_get32(rst + (size_t)mid * 4);
        if (at >= payload ||
            lsm_blkrec_decode(buf + at, payload - at, &shared, &r, &used) != KV_OK || shared != 0)
            return KV_DATA_LOSS;
        if ((c = cmp_suffix(0, r.key, r.klen, key, klen, &lcp)) == 0)
            goto found;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return KV_NOT_FOUND; /* below the block's first key */
    size_t at = lsm_get32(rst + (size_t)(lo - 1) * 4);
    size_t end = lo < nr ? lsm_get32(rst + (size_t)lo * 4) : payload;
    if (at >= end || end > payload)
        return KV_DATA_LOSS;
    size_t plen = 0; /* the previous key's length */
    for (bool first = true; at < end; first = false) {
        if (lsm_blkrec_decode(buf + at, end - at, &shared, &r, &used) != KV_OK ||
            (first ? shared != 0 : shared > plen))
            return KV_DATA_LOSS;
        at += used;
        plen = shared + r.klen;
        if (!first && shared > lcp)
            continue; /* differs from key where its predecessor did: below key */
        c = cmp_suffix(shared, r.key, r.klen, key, klen, &lcp);
        if (c == 0)
            goto found;
        if (c > 0)
            return KV_NOT_FOUND;
    }
    return KV_NOT_FOUND;
found:
    *out = r;
    out->key = key;
    out->klen = klen;
    return KV_OK;
}

kv_err lsm_block_search(const lsm_sst *s, const uint8_t *buf, size_t len, const void *key,
                        size_t klen, lsm_rec *out)
{
    if (s->version >= 4)
        return search_v4(buf, len, key, klen, out);
    uint32_t n = lsm_get32(buf + len - 4);
    size_t payload = len - 4 - (size_t)n * 4;
    const uint8_t *offs = buf + payload;
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2, at = lsm_get32(offs + (size_t)mid * 4);
        lsm_rec r;
        size_t used;
        if (at >= payload ||
            lsm_rec_decode_as(s->version >= 3, buf + at, payload - at, &r, &used) != KV_OK)
            return KV_DATA_LOSS;
        int c = lsm_key_cmp(r.key, r.klen, key, klen);
        if (c == 0) {
            *out = r;
            return KV_OK;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return KV_NOT_FOUND;
}

/* ---- sequential iterator (compaction) ---- */

#define READ_AHEAD (512u << 10)

/* Reads blocks blk.. (contiguous, up to READ_AHEAD bytes) into it->ra. */
static kv_err iter_fill(lsm_sst_iter *it)
{
    const lsm_sst *s = it->s;
    uint32_t e = (uint32_t)it->blk;
    uint64_t total = (uint64_t)blk_len(s, e) + 4;
    while (e + 1 < s->nblocks && blk_off(s, e + 1) == blk_off(s, e) + blk_len(s, e) + 4 &&
           total + blk_len(s, e + 1) + 4 <= READ_AHEAD)
        total += (uint64_t)blk_len(s, ++e) + 4;
    it->ra.len = 0;
    kv_err rv = lsm_buf_reserve(&it->ra, total);
    if (rv != KV_OK)
        return rv;
    lsm_io io = {.vol = s->v,
                 .fd = s->fd,
                 .buf = it->ra.p,
                 .len = total,
                 .off = blk_off(s, (uint32_t)it->blk)};
    lsm_vol_read(&io, 1);
    if (io.res < 0 || (uint64_t)io.res != total) /* let block_verify name the failure */
        return block_verify(s, it->blk, io.buf, io.res, total);
    it->ra.len = total;
    it->ra_off = blk_off(s, (uint32_t)it->blk);
    it->bytes_read += total;
    return KV_OK;
}

static void iter_load(lsm_sst_iter *it)
{
    const lsm_sst *s = it->s;
    uint64_t off = blk_off(s, (uint32_t)it->blk), len = (uint64_t)blk_len(s, (uint32_t)it->blk) + 4;
    kv_err rv = KV_OK;
    if (off < it->ra_off || off + len > it->ra_off + it->ra.len)
        rv = iter_fill(it);
    const uint8_t *raw = rv == KV_OK ? it->ra.p + (off - it->ra_off) : NULL;
    if (rv == KV_OK)
        rv = block_verify(s, it->blk, raw, (long)len, len);
    size_t plen = 0;
    if (rv == KV_OK)
        rv = block_decode(s, it->blk, raw, &it->dec, &it->bp, &plen);
    if (rv != KV_OK) {
        it->err = rv;
        it->bp = NULL;
        return;
    }
    it->n = lsm_get32(it->bp + plen - 4);
    it->payload = plen - 4 - (size_t)it->n * 4;
    it->i = 0;
    it->at = 0;
}

/* Decodes the format-4 entry at it->at into it->cur, its key rebuilt in
 * it->key from the previous one (false: it->err is set). */
static bool iter_decode_v4(lsm_sst_iter *it)
{
    size_t shared, used;
    kv_err rv = KV_OK;
    if (lsm_blkrec_decode(it->bp + it->at, it->payload - it->at, &shared, &it->cur, &used) !=
            KV_OK ||
        shared > (it->at == 0 ? 0 : it->key.len))
        rv = sst_corrupt(it->s, "malformed record");
    if (rv == KV_OK) {
        it->key.len = shared;
        rv = lsm_buf_put(&it->key, it->cur.key, it->cur.klen);
    }
    if (rv != KV_OK) {
        it->err = rv;
        return false;
    }
    it->cur.key = it->key.p;
    it->cur.klen = it->key.len;
    it->at += used;
    return true;
}

static void iter_decode(lsm_sst_iter *it)
{
    while (!it->err && (uint32_t)it->blk < it->s->nblocks) {
        if (!it->bp)
            iter_load(it);
        if (it->err)
            return;
        if (it->s->version >= 4) {
            if (it->at < it->payload) {
                it->valid = iter_decode_v4(it);
                return;
            }
        } else if (it->i < it->n) {
            uint32_t at = lsm_get32(it->bp + it->payload + (size_t)it->i * 4);
            size_t used;
            if (at >= it->payload ||
                lsm_rec_decode_as(it->s->version >= 3, it->bp + at, it->payload - at, &it->cur,
                                  &used) != KV_OK) {
                it->err = sst_corrupt(it->s, "malformed record");
                return;
            }
            it->valid = true;
            return;
        }
        it->blk++;
        it->bp = NULL;
    }
    it->valid = false;
}

void lsm_sst_iter_init(lsm_sst_iter *it, lsm_sst *s)
{
    memset(it, 0, sizeof(*it));
    it->s = s;
    iter_decode(it);
}

void lsm_sst_iter_at_block(lsm_sst_iter *it, lsm_sst *s, uint32_t blk)
{
    memset(it, 0, sizeof(*it));
    it->s = s;
    it->blk = blk < s->nblocks ? (int)blk : (int)s->nblocks;
    iter_decode(it);
}

void lsm_sst_iter_seek(lsm_sst_iter *it, lsm_sst *s, const void *key, size_t klen)
{
    int b = lsm_sst_find_block(s, key, klen);
    lsm_sst_iter_at_block(it, s, b < 0 ? s->nblocks : (uint32_t)b);
    while (it->valid && lsm_key_cmp(it->cur.key, it->cur.klen, key, klen) < 0)
        lsm_sst_iter_next(it);
}

void lsm_sst_iter_next(lsm_sst_iter *it)
{
    it->valid = false;
    it->i++;
    iter_decode(it);
}

void lsm_sst_iter_fini(lsm_sst_iter *it)
{
    lsm_buf_free(&it->ra);
    lsm_buf_free(&it->dec);
    lsm_buf_free(&it->key);
    it->bp = NULL;
    it->valid = false;
}
