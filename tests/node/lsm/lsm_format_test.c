/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the LSM's on-disk pieces: the compact record codec, the
 * bloom filter's false-positive rate, SST write/read round trips (many
 * blocks, big values, both I/O paths), SSTs whose checksummed metadata
 * lies, WAL round trip and torn-tail truncation, and MANIFEST round trip and
 * duplicate files. (CRC32C's vectors: tests/common/common_test.c.)
 */
#include "lsm_test_util.h"

#include <criterion/criterion.h>

#include "node/lsm/lsm_int.h"

/* ---- the compact record codec (SST format 3) ---- */

static void recc_expect(const lsm_rec *got, const lsm_rec *want)
{
    cr_assert_eq(got->klen, want->klen);
    cr_assert(memcmp(got->key, want->key, want->klen) == 0);
    size_t vl = want->type == LSM_PUT ? want->vlen : 0;
    cr_assert_eq(got->vlen, vl);
    cr_assert(vl == 0 || memcmp(got->value, want->value, vl) == 0);
    cr_assert_eq(got->version, want->version);
    cr_assert_eq(got->seqno, want->seqno);
    cr_assert_eq(got->expire_at, want->expire_at);
    cr_assert_eq(got->type, want->type);
    cr_assert_eq(got->flags, want->flags);
}

Test(recc, roundtrip_at_every_field_boundary)
{
    static uint8_t key[LSM_MAX_KEY], val[20000], buf[LSM_MAX_KEY + 20000 + LSM_RECC_MAX_HDR];
    for (size_t i = 0; i < sizeof(key); i++)
        key[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof(val); i++)
        val[i] = (uint8_t)(i * 13 + 5);
    const size_t klens[] = {1, 8, 127, 128, 16383, 16384, LSM_MAX_KEY};
    const size_t vlens[] = {0, 1, 127, 128, 1024, 16383, 16384, 20000};
    const uint64_t nums[] = {0, 1, 127, 128, (1ull << 35) - 1, 1ull << 56, UINT64_MAX};
    int n = 0;
    for (size_t a = 0; a < sizeof(klens) / sizeof(*klens); a++)
        for (size_t b = 0; b < sizeof(vlens) / sizeof(*vlens); b++)
            for (size_t c = 0; c < sizeof(nums) / sizeof(*nums); c++)
                for (int t = LSM_PUT; t <= LSM_DELETE; t++) {
                    lsm_rec r = {.key = key,
                                 .klen = klens[a],
                                 .value = vlens[b] ? val : NULL,
                                 .vlen = t == LSM_PUT ? vlens[b] : 0,
                                 .version = nums[(c + 2) % 7],
                                 .seqno = nums[c],
                                 .expire_at = nums[(c + 4) % 7],
                                 .type = (uint8_t)t,
                                 .flags = (uint8_t)((a + b + c) & 3)};
                    size_t sz = lsm_recc_size(&r), used = 0;
                    cr_assert_leq(sz, LSM_RECC_MAX_HDR + r.klen + r.vlen);
                    lsm_recc_encode(buf, &r);
                    lsm_rec got;
                    cr_assert_eq(lsm_recc_decode(buf, sz, &got, &used), KV_OK);
                    cr_assert_eq(used, sz);
                    recc_expect(&got, &r);
                    /* the same bytes with more after them: the same record */
                    cr_assert_eq(lsm_recc_decode(buf, sz + 9, &got, &used), KV_OK);
                    cr_assert_eq(used, sz);
                    n++;
                }
    cr_assert_eq(n, 7 * 8 * 7 * 2);
}

Test(recc, a_put_of_1KiB_costs_16_header_bytes)
{
    static uint8_t val[1024];
    uint64_t id = 123456;
    lsm_rec r = {.key = &id,
                 .klen = 8,
                 .value = val,
                 .vlen = 1024,
                 .version = 0x18000000000000ull,
                 .seqno = 2000000,
                 .type = LSM_PUT};
    /* head 1, klen 1, vlen 2, seqno 3, version 8 */
    cr_assert_eq(lsm_recc_size(&r), 8 + 1024 + 15);
    cr_assert_eq(lsm_rec_size(&r), 8 + 1024 + LSM_REC_HDR);
    r.type = LSM_DELETE;
    r.version = 0;
    r.seqno = 5;
    cr_assert_eq(lsm_recc_size(&r), 8 + 3, "a delete without version: head, klen, seqno");
    cr_assert(lsm_rec_valid(&r));
    r.flags = 0x10; /* a flag the head byte cannot hold is refused, not dropped */
    cr_assert_not(lsm_rec_valid(&r));
    /* and a fixed-header record (SST v1/v2, old WAL frames) carrying one
     * does not decode: every decoded record is valid */
    uint8_t buf[64];
    r.flags = 0;
    lsm_rec_encode(buf, &r);
    lsm_rec got;
    size_t used;
    cr_assert_eq(lsm_rec_decode(buf, lsm_rec_size(&r), &got, &used), KV_OK);
    buf[33] = 0x12;
    cr_assert_eq(lsm_rec_decode(buf, lsm_rec_size(&r), &got, &used), KV_DATA_LOSS);
}

Test(recc, malformed_records_are_data_loss)
{
    uint8_t key[40], buf[128], bad[128];
    memset(key, 'k', sizeof(key));
    lsm_rec r = {.key = key,
                 .klen = sizeof(key),
                 .value = key,
                 .vlen = 30,
                 .version = 77,
                 .seqno = 1ull << 40,
                 .expire_at = 99,
                 .type = LSM_PUT};
    size_t sz = lsm_recc_size(&r), used;
    lsm_recc_encode(buf, &r);
    lsm_rec got;
    for (size_t cut = 0; cut < sz; cut++) /* every truncation */
        cr_assert_eq(lsm_recc_decode(buf, cut, &got, &used), KV_DATA_LOSS, "cut at %zu", cut);
    memcpy(bad, buf, sz);
    bad[0] = (uint8_t)(bad[0] & ~3u); /* type 0 */
    cr_assert_eq(lsm_recc_decode(bad, sz, &got, &used), KV_DATA_LOSS);
    bad[0] |= 3; /* type 3 */
    cr_assert_eq(lsm_recc_decode(bad, sz, &got, &used), KV_DATA_LOSS);
    memcpy(bad, buf, sz);
    bad[1] = 0; /* klen 0 */
    cr_assert_eq(lsm_recc_decode(bad, sz, &got, &used), KV_DATA_LOSS);
    /* klen past LSM_MAX_KEY: 65537 = 0x81 0x80 0x04 */
    const uint8_t big_klen[] = {LSM_PUT, 0x81, 0x80, 0x04, 0x00, 0x00};
    cr_assert_eq(lsm_recc_decode(big_klen, sizeof(big_klen), &got, &used), KV_DATA_LOSS);
    /* vlen past LSM_MAX_VALUE (2^28 + 1) */
    const uint8_t big_vlen[] = {LSM_PUT, 0x01, 0x81, 0x80, 0x80, 0x80, 0x01, 0x00, 'k'};
    cr_assert_eq(lsm_recc_decode(big_vlen, sizeof(big_vlen), &got, &used), KV_DATA_LOSS);
    /* a seqno varint of 11 bytes, and one of 10 whose last byte carries bits
     * past 64 */
    uint8_t longv[32] = {LSM_DELETE, 0x01};
    memset(longv + 2, 0x80, 10);
    longv[12] = 0x00;
    longv[13] = 'k';
    cr_assert_eq(lsm_recc_decode(longv, 14, &got, &used), KV_DATA_LOSS);
    memset(longv + 2, 0xff, 9);
    longv[11] = 0x02;
    longv[12] = 'k';
    cr_assert_eq(lsm_recc_decode(longv, 13, &got, &used), KV_DATA_LOSS);
    longv[11] = 0x01; /* UINT64_MAX: fits */
    cr_assert_eq(lsm_recc_decode(longv, 13, &got, &used), KV_OK);
    cr_assert_eq(got.seqno, UINT64_MAX);
    cr_assert_eq(used, 13);
}

static lsm_rec mkrec(char *kbuf, int i, uint8_t *val, size_t vlen, uint64_t seq)
{
    int n = sprintf(kbuf, "key%08d", i);
    for (size_t j = 0; j < vlen; j++)
        val[j] = (uint8_t)(i * 31 + j);
    return (lsm_rec){.key = kbuf,
                     .klen = (size_t)n,
                     .value = val,
                     .vlen = vlen,
                     .version = seq * 3,
                     .seqno = seq,
                     .expire_at = (uint64_t)i % 5,
                     .type = (i % 7 == 0) ? LSM_DELETE : LSM_PUT,
                     .flags = (uint8_t)(i & 1)};
}

static size_t vlen_of(int i)
{
    return i == 777 ? 100000 : (size_t)(i % 300);
}

static void sst_roundtrip(bool uring, lsm_compression codec)
{
    char *dir = lt_mkdtemp("sst");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, uring), KV_OK);
    lsm_sst_builder *b;
    cr_assert_eq(lsm_sst_builder_open(&b, &v, 7, 4096), KV_OK);
    _Atomic uint64_t cin = 0, cout = 0;
    lsm_sst_builder_compress(b, codec, &cin, &cout);
    static uint8_t val[100000];
    char k[32];
    const int n = 20000;
    for (int i = 0; i < n; i++) {
        lsm_rec r = mkrec(k, i, val, vlen_of(i), (uint64_t)i + 1);
        cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    }
    lsm_rec dup = mkrec(k, 5, val, 1, 1);
    cr_assert_eq(lsm_sst_builder_add(b, &dup), KV_INVALID_ARGUMENT, "out of order key accepted");
    lsm_file *f;
    cr_assert_eq(lsm_sst_builder_finish(b, 0, &f), KV_OK);
    cr_assert_eq(f->nentries, (uint64_t)n);
    cr_assert_eq(f->min_seq, 1);
    cr_assert_eq(f->max_seq, (uint64_t)n);
    cr_assert_gt(lsm_sst_nblocks(f->sst), 100);
    if (codec == LSM_COMPRESS_NONE) {
        cr_assert_eq(cin, 0);
    } else { /* the values are byte ramps: they compress */
        cr_assert_gt(cin, f->size);
        cr_assert_lt(cout, cin / 2, "%llu of %llu bytes", (unsigned long long)cout,
                     (unsigned long long)cin);
        cr_assert_lt(f->size, cin / 2);
    }

    lsm_sst_iter it;
    int i = 0;
    for (lsm_sst_iter_init(&it, f->sst); it.valid; lsm_sst_iter_next(&it), i++) {
        lsm_rec want = mkrec(k, i, val, vlen_of(i), (uint64_t)i + 1);
        cr_assert_eq(it.cur.klen, want.klen);
        cr_assert(memcmp(it.cur.key, want.key, want.klen) == 0);
        cr_assert_eq(it.cur.seqno, want.seqno);
        cr_assert_eq(it.cur.version, want.version);
        cr_assert_eq(it.cur.expire_at, want.expire_at);
        cr_assert_eq(it.cur.type, want.type);
        cr_assert_eq(it.cur.flags, want.flags);
        size_t vl = want.type == LSM_PUT ? want.vlen : 0;
        cr_assert_eq(it.cur.vlen, vl);
        cr_assert(vl == 0 || memcmp(it.cur.value, val, vl) == 0);
    }
    cr_assert_eq(it.err, KV_OK);
    cr_assert_eq(i, n);
    lsm_sst_iter_fini(&it);

    for (int j = 0; j < n; j += 97) { /* point lookups through block reads */
        lsm_rec want = mkrec(k, j, val, vlen_of(j), (uint64_t)j + 1);
        cr_assert(lsm_sst_may_contain(f->sst, want.key, want.klen));
        int blk = lsm_sst_find_block(f->sst, want.key, want.klen);
        cr_assert_geq(blk, 0);
        lsm_io io;
        cr_assert_eq(lsm_sst_block_io(f->sst, blk, &io), KV_OK);
        cr_assert_eq(lsm_vol_read(&io, 1), KV_OK);
        cr_assert_eq(lsm_sst_block_check(f->sst, blk, &io), KV_OK);
        lsm_rec got;
        cr_assert_eq(lsm_block_search(f->sst, io.buf, io.len, want.key, want.klen, &got), KV_OK);
        cr_assert_eq(got.seqno, want.seqno);
        free(io.buf);
    }
    cr_assert_eq(lsm_sst_find_block(f->sst, "zzz", 3), -1);
    lsm_file_unref(f);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

Test(sst, roundtrip_many_blocks_io_uring)
{
    sst_roundtrip(true, LSM_COMPRESS_NONE);
}

Test(sst, roundtrip_many_blocks_pread)
{
    sst_roundtrip(false, LSM_COMPRESS_NONE);
}

Test(sst, roundtrip_lz4)
{
    sst_roundtrip(true, LSM_COMPRESS_LZ4);
}

Test(sst, roundtrip_zstd)
{
    sst_roundtrip(false, LSM_COMPRESS_ZSTD);
}

/* Writes SST 3 in dir: n records "r%06d" with vlen-byte values, random
 * (incompressible) or a repeated letter. */
/* ---- format 4: shared key prefixes ---- */

#define PK_MAX 600
typedef struct pkey {
    uint8_t b[40];
    size_t n;
} pkey;

static int pkey_cmp(const void *a, const void *b)
{
    const pkey *x = a, *y = b;
    return lsm_key_cmp(x->b, x->n, y->b, y->n);
}

/* Keys made to stress prefix sharing: families with long common prefixes,
 * keys that are prefixes of others, 0x00 and 0xff bytes, lengths 1..33;
 * sorted, without duplicates. Returns the count. */
static size_t prefix_keys(pkey *k)
{
    static const char *stems[] = {"", "a", "user:", "user:0000", "\xff\xff", "z"};
    uint64_t seed = 7;
    size_t n = 0;
    for (size_t s = 0; s < sizeof(stems) / sizeof(stems[0]); s++)
        for (int i = 0; i < 90 && n < PK_MAX; i++) {
            pkey *x = &k[n];
            x->n = strlen(stems[s]);
            memcpy(x->b, stems[s], x->n);
            size_t extra = (size_t)(lt_rand(&seed) % 24);
            if (x->n + extra == 0)
                extra = 1;
            for (size_t j = 0; j < extra; j++) {
                uint64_t r = lt_rand(&seed) % 8;
                x->b[x->n++] = r == 0 ? 0x00 : r == 1 ? 0xff : (uint8_t)('0' + r);
            }
            n++;
        }
    for (size_t i = 0; i < 33 && n < PK_MAX; i++) { /* "q", "qq", ..., 33 of them */
        k[n].n = i + 1;
        memset(k[n].b, 'q', i + 1);
        n++;
    }
    qsort(k, n, sizeof(*k), pkey_cmp);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || pkey_cmp(&k[u - 1], &k[i]) != 0)
            k[u++] = k[i];
    return u;
}

static bool pkey_has(const pkey *k, size_t n, const uint8_t *key, size_t klen)
{
    pkey probe = {.n = klen};
    memcpy(probe.b, key, klen);
    return bsearch(&probe, k, n, sizeof(*k), pkey_cmp) != NULL;
}

/* Point lookup of key in f through its block: the status, *seq when found;
 * with check, the key and the 3-byte value the prefix tests write. */
static kv_err block_lookup(lsm_file *f, const void *key, size_t klen, uint64_t *seq, bool check)
{
    int blk = lsm_sst_find_block(f->sst, key, klen);
    if (blk < 0)
        return KV_NOT_FOUND;
    lsm_io io;
    cr_assert_eq(lsm_sst_read_block(f->sst, blk, &io), KV_OK);
    lsm_rec got;
    kv_err rv = lsm_block_search(f->sst, io.buf, io.len, key, klen, &got);
    if (rv == KV_OK)
        *seq = got.seqno;
    if (rv == KV_OK && check) {
        cr_assert_eq(got.klen, klen);
        cr_assert(memcmp(got.key, key, klen) == 0);
        cr_assert_eq(got.vlen, 3);
        cr_assert(memcmp(got.value, "v", 1) == 0);
    }
    free(io.buf);
    return rv;
}

/* A builder of SST `number` with blocks of bs bytes in a new directory on
 * FD (*dir, *v: release with tmp_done). */
static lsm_sst_builder *tmp_builder(char **dir, lsm_vol *v, uint64_t number, unsigned bs)
{
    *dir = lt_mkdtemp("sst");
    cr_assert_eq(lsm_vol_init(v, *dir, LSM_TIER_FD, false), KV_OK);
    lsm_sst_builder *b;
    cr_assert_eq(lsm_sst_builder_open(&b, v, number, bs), KV_OK);
    return b;
}

static void tmp_done(lsm_file *f, lsm_vol *v, char *dir)
{
    lsm_file_unref(f);
    lsm_vol_fini(v);
    lt_rmrf(dir);
    free(dir);
}

/* Every key of a prefix-heavy set is found, every near miss (the key plus a
 * 0x00 byte, its proper prefixes, its last byte moved by one) is not, seeks
 * land on the first key not below the probe, and a scan rebuilds every key:
 * with 256-byte blocks, so that restart intervals and blocks end in every
 * possible place of a family. */
Test(sst, prefix_shared_keys_serve_every_lookup_and_scan)
{
    static pkey k[PK_MAX];
    size_t n = prefix_keys(k);
    cr_assert_gt(n, 400);
    char *dir;
    lsm_vol v;
    lsm_sst_builder *b = tmp_builder(&dir, &v, 9, 256);
    for (size_t i = 0; i < n; i++) {
        lsm_rec r = {.key = k[i].b,
                     .klen = k[i].n,
                     .value = "v\x01\x02",
                     .vlen = 3,
                     .seqno = i + 1,
                     .type = LSM_PUT};
        cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    }
    lsm_file *f;
    cr_assert_eq(lsm_sst_builder_finish(b, 0, &f), KV_OK);
    cr_assert_gt(lsm_sst_nblocks(f->sst), 20);

    lsm_sst_iter it;
    size_t i = 0;
    for (lsm_sst_iter_init(&it, f->sst); it.valid; lsm_sst_iter_next(&it), i++) {
        cr_assert_lt(i, n);
        cr_assert_eq(it.cur.klen, k[i].n, "key %zu", i);
        cr_assert(memcmp(it.cur.key, k[i].b, k[i].n) == 0, "key %zu", i);
        cr_assert_eq(it.cur.seqno, i + 1);
    }
    cr_assert_eq(it.err, KV_OK);
    cr_assert_eq(i, n);
    lsm_sst_iter_fini(&it);

    for (i = 0; i < n; i++) {
        uint64_t seq = 0;
        cr_assert_eq(block_lookup(f, k[i].b, k[i].n, &seq, true), KV_OK, "key %zu", i);
        cr_assert_eq(seq, i + 1);
        uint8_t p[41];
        memcpy(p, k[i].b, k[i].n);
        pkey probes[3 + 40];
        size_t np = 0;
        p[k[i].n] = 0x00; /* the key and one more byte */
        probes[np].n = k[i].n + 1;
        memcpy(probes[np++].b, p, k[i].n + 1);
        for (int d = -1; d <= 1; d += 2) { /* last byte moved by one */
            uint8_t last = k[i].b[k[i].n - 1];
            if ((d < 0 && last == 0) || (d > 0 && last == 0xff))
                continue;
            probes[np] = k[i];
            probes[np++].b[k[i].n - 1] = (uint8_t)(last + d);
        }
        for (size_t l = 1; l < k[i].n; l++) { /* proper prefixes */
            probes[np].n = l;
            memcpy(probes[np++].b, k[i].b, l);
        }
        for (size_t q = 0; q < np; q++) {
            bool has = pkey_has(k, n, probes[q].b, probes[q].n);
            kv_err rv = block_lookup(f, probes[q].b, probes[q].n, &seq, true);
            cr_assert_eq(rv, has ? KV_OK : KV_NOT_FOUND, "probe %zu of key %zu", q, i);
            /* a seek lands on the first key not below the probe */
            pkey *lb = k;
            while (lb < k + n && pkey_cmp(lb, &probes[q]) < 0)
                lb++;
            lsm_sst_iter_seek(&it, f->sst, probes[q].b, probes[q].n);
            cr_assert_eq(it.valid, lb < k + n);
            if (it.valid)
                cr_assert(it.cur.klen == lb->n && memcmp(it.cur.key, lb->b, lb->n) == 0);
            lsm_sst_iter_fini(&it);
        }
    }
    tmp_done(f, &v, dir);
}

/* Keys that share leading bytes store only the rest: 2000 keys
 * "user:00000NNNNN:profile" (23 bytes, of which the 12-14 before the digits
 * that change are shared with the previous key; ":profile" is not, being
 * no prefix) with 20-byte values and a version take about 46 bytes a record
 * with the bloom filter and the index, against 59-60 for format 3's compact
 * records and offsets alone. */
Test(sst, shared_prefixes_shrink_the_file)
{
    char *dir;
    lsm_vol v;
    lsm_sst_builder *b = tmp_builder(&dir, &v, 4, 4096);
    uint64_t v3 = 0;
    char key[32], val[20];
    memset(val, 'x', sizeof(val));
    for (int i = 0; i < 2000; i++) {
        lsm_rec r = {.key = key,
                     .klen = (size_t)sprintf(key, "user:%010d:profile", i * 7),
                     .value = val,
                     .vlen = sizeof(val),
                     .version = 1000000 + (uint64_t)i,
                     .seqno = (uint64_t)i + 1,
                     .type = LSM_PUT};
        v3 += lsm_recc_size(&r) + 4;
        cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    }
    lsm_file *f;
    cr_assert_eq(lsm_sst_builder_finish(b, 0, &f), KV_OK);
    cr_assert_lt(f->size, v3 * 8 / 10, "%llu bytes against %llu of format 3's data blocks",
                 (unsigned long long)f->size, (unsigned long long)v3);
    tmp_done(f, &v, dir);
}

/* An open reader keeps the index, the bloom filter and 4 bytes a block to
 * find each block's entry in the index: 2000 records of 1 KiB make 500
 * blocks, whose index entries (u32 key length, an 8-byte key, u64 offset,
 * u32 length) are 24 bytes each. The reader used to copy every entry into
 * four arrays besides (24 bytes a block more: 48 where RocksDB's index
 * spends about 14). */
Test(sst, an_open_reader_keeps_4_bytes_a_block_beyond_its_index)
{
    char *dir;
    lsm_vol v;
    lsm_sst_builder *b = tmp_builder(&dir, &v, 6, 4096);
    static uint8_t val[1024];
    char key[16];
    for (int i = 0; i < 2000; i++) {
        lsm_rec r = {.key = key,
                     .klen = (size_t)sprintf(key, "k%07d", i),
                     .value = val,
                     .vlen = sizeof(val),
                     .seqno = (uint64_t)i + 1,
                     .type = LSM_PUT};
        cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    }
    lsm_file *f;
    cr_assert_eq(lsm_sst_builder_finish(b, 0, &f), KV_OK);
    uint64_t nb = lsm_sst_nblocks(f->sst), bloom = 2000 * 10 / 8 + 1;
    cr_assert(nb >= 450 && nb <= 550, "%llu blocks", (unsigned long long)nb);
    uint64_t bound = nb * (24 + 4) + bloom + 1024; /* the last: the reader's own struct */
    cr_assert_leq(lsm_sst_mem(f->sst), bound, "%llu bytes in memory for %llu blocks",
                  (unsigned long long)lsm_sst_mem(f->sst), (unsigned long long)nb);
    uint64_t seq = 0;
    cr_assert_eq(block_lookup(f, "k0001234", 8, &seq, false), KV_OK);
    cr_assert_eq(seq, 1235);
    tmp_done(f, &v, dir);
}

/* Malformed format-4 entries are DATA_LOSS: a restart entry that claims a
 * shared prefix, an entry sharing more than its predecessor has, a first
 * restart not at offset 0, a key over LSM_MAX_KEY in all, and a shared
 * count past 32 bits. */
Test(sst, malformed_prefix_entries_are_data_loss)
{
    char *dir;
    lsm_vol v;
    lsm_sst_builder *b = tmp_builder(&dir, &v, 5, 4096);
    lsm_rec r = {.key = "abc", .klen = 3, .value = "v", .vlen = 1, .seqno = 1, .type = LSM_PUT};
    cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    lsm_file *f;
    cr_assert_eq(lsm_sst_builder_finish(b, 0, &f), KV_OK);
    lsm_rec got;
    uint8_t blk[256];
    size_t len;
    /* [entry "abc"][entry shared s, "d"][restart 0][count 1] */
    for (int c = 0; c < 3; c++) {
        len = lsm_blkrec_encode(blk, &r, 0);
        if (c == 0) /* the restart claims a shared byte */
            blk[0] = 1;
        lsm_rec r2 = r;
        r2.key = "abcd";
        r2.klen = 4;
        r2.seqno = 2;
        size_t e2 = lsm_blkrec_encode(blk + len, &r2, 3);
        if (c == 1) /* shares 4 bytes of a 3-byte key */
            blk[len] = 4;
        len += e2;
        lsm_set32(blk + len, c == 2 ? 1 : 0); /* c == 2: the first restart at 1 */
        lsm_set32(blk + len + 4, 1);
        len += 8;
        kv_err rv = lsm_block_search(f->sst, blk, len, "abcd", 4, &got);
        cr_assert_eq(rv, KV_DATA_LOSS, "case %d: %s", c, kv_strerror(rv));
    }
    /* well formed, the same bytes read */
    len = lsm_blkrec_encode(blk, &r, 0);
    lsm_rec r2 = r;
    r2.key = "abcd";
    r2.klen = 4;
    len += lsm_blkrec_encode(blk + len, &r2, 3);
    lsm_set32(blk + len, 0);
    lsm_set32(blk + len + 4, 1);
    len += 8;
    cr_assert_eq(lsm_block_search(f->sst, blk, len, "abcd", 4, &got), KV_OK);
    cr_assert_eq(lsm_block_search(f->sst, blk, len, "abce", 4, &got), KV_NOT_FOUND);

    size_t sh, used;
    uint8_t e[32];
    size_t el = lsm_blkrec_encode(e, &r, 0);
    e[0] = 0x80; /* shared varint runs into the record: 0x80 0x.. */
    cr_assert_eq(lsm_blkrec_decode(e, el, &sh, &got, &used), KV_DATA_LOSS);
    uint8_t big[] = {0x80, 0x80, 0x80, 0x80, 0x10}; /* 2^32: past 32 bits */
    cr_assert_eq(lsm_blkrec_decode(big, sizeof(big), &sh, &got, &used), KV_DATA_LOSS);
    uint8_t over[16] = {0xff, 0xff, 0x03}; /* shared 65535 + a 2-byte suffix */
    lsm_rec s2 = {.key = "zz", .klen = 2, .seqno = 1, .type = LSM_DELETE};
    size_t ol = 3 + lsm_recc_encode(over + 3, &s2);
    cr_assert_eq(lsm_blkrec_decode(over, ol, &sh, &got, &used), KV_DATA_LOSS);
    over[0] = 0xfe; /* 65534 + 2 = LSM_MAX_KEY: fits */
    cr_assert_eq(lsm_blkrec_decode(over, ol, &sh, &got, &used), KV_OK);
    cr_assert_eq(sh, 65534);
    cr_assert_eq(used, ol);
    tmp_done(f, &v, dir);
}

static lsm_file *build_values(lsm_vol *v, lsm_compression codec, int n, size_t vlen, bool random,
                              _Atomic uint64_t *cin, _Atomic uint64_t *cout)
{
    lsm_sst_builder *b;
    cr_assert_eq(lsm_sst_builder_open(&b, v, 3, 4096), KV_OK);
    lsm_sst_builder_compress(b, codec, cin, cout);
    uint64_t seed = 42;
    uint8_t val[2048];
    for (int i = 0; i < n; i++) {
        char k[16];
        for (size_t j = 0; j < vlen; j++)
            val[j] = random ? (uint8_t)lt_rand(&seed) : (uint8_t)('a' + i % 26);
        lsm_rec r = {.key = k,
                     .klen = (size_t)sprintf(k, "r%06d", i),
                     .value = val,
                     .vlen = vlen,
                     .seqno = (uint64_t)i + 1,
                     .type = LSM_PUT};
        cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    }
    lsm_file *f;
    cr_assert_eq(lsm_sst_builder_finish(b, 0, &f), KV_OK);
    return f;
}

/* Blocks that do not shrink by 1/8 are stored raw, and read back. */
Test(sst, incompressible_blocks_are_stored_raw)
{
    char *dir = lt_mkdtemp("sst");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_SD, false), KV_OK);
    _Atomic uint64_t cin = 0, cout = 0;
    lsm_file *f = build_values(&v, LSM_COMPRESS_ZSTD, 500, 1000, true, &cin, &cout);
    cr_assert_gt(cin, 500 * 1000);
    cr_assert_eq(cin, cout, "random blocks stay raw");
    lsm_sst_iter it;
    int n = 0;
    for (lsm_sst_iter_init(&it, f->sst); it.valid; lsm_sst_iter_next(&it))
        n++;
    cr_assert_eq(it.err, KV_OK);
    cr_assert_eq(n, 500);
    lsm_sst_iter_fini(&it);
    lsm_file_unref(f);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

/* A compressed block whose CRC matches but whose codec data is damaged (a
 * bug, or bytes rewritten with their CRC) is DATA_LOSS, for point reads and
 * scans, never a crash or garbage; so is an unknown codec byte. */
static void corrupt_compressed(lsm_compression codec, bool bad_codec)
{
    char *dir = lt_mkdtemp("sst");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    _Atomic uint64_t cin = 0, cout = 0;
    lsm_file *f = build_values(&v, codec, 200, 300, false, &cin, &cout);
    cr_assert_lt(cout, cin / 4);
    lsm_io io;
    cr_assert_eq(lsm_sst_block_io(f->sst, 0, &io), KV_OK);
    cr_assert_eq(lsm_vol_read(&io, 1), KV_OK);
    uint8_t *p = io.buf;
    size_t len = io.len - 4; /* stored bytes + codec byte */
    if (bad_codec)
        p[len - 1] = 9;
    else
        for (size_t i = 4; i < len - 1; i += 7) /* past the raw length */
            p[i] ^= 0x5a;
    lsm_set32(p + len, kv_crc32c(0, p, len));
    char path[512];
    snprintf(path, sizeof(path), "%s/000003.sst", dir);
    int fd = open(path, O_WRONLY);
    cr_assert_eq(pwrite(fd, p, io.len, (off_t)io.off), (ssize_t)io.len);
    close(fd);
    free(io.buf);
    lsm_sst *s;
    cr_assert_eq(lsm_sst_open(&v, 3, &s), KV_OK);
    cr_assert_eq(lsm_sst_read_block(s, 0, &io), KV_DATA_LOSS);
    cr_assert_eq(lsm_sst_read_block(s, 1, &io), KV_OK, "the other blocks read");
    free(io.buf);
    lsm_sst_iter it;
    lsm_sst_iter_init(&it, s);
    cr_assert_not(it.valid);
    cr_assert_eq(it.err, KV_DATA_LOSS);
    lsm_sst_iter_fini(&it);
    lsm_sst_close(s);
    lsm_file_unref(f);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

Test(sst, corrupt_lz4_block_is_data_loss)
{
    corrupt_compressed(LSM_COMPRESS_LZ4, false);
}

Test(sst, corrupt_zstd_block_is_data_loss)
{
    corrupt_compressed(LSM_COMPRESS_ZSTD, false);
}

Test(sst, unknown_codec_is_data_loss)
{
    corrupt_compressed(LSM_COMPRESS_LZ4, true);
}

Test(compression, parse)
{
    lsm_compression_spec c;
    char err[256];
    cr_assert_eq(lsm_compression_parse("auto", &c, err, sizeof(err)), KV_OK);
    cr_assert_eq(lsm_compression_for(&c, 0, LSM_TIER_FD), LSM_COMPRESS_NONE);
    cr_assert_eq(lsm_compression_for(&c, 3, LSM_TIER_SD), LSM_COMPRESS_LZ4);
    cr_assert_eq(lsm_compression_parse("zstd", &c, err, sizeof(err)), KV_OK);
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        cr_assert_eq(lsm_compression_for(&c, l, l < 3 ? LSM_TIER_FD : LSM_TIER_SD),
                     LSM_COMPRESS_ZSTD);
    cr_assert_eq(lsm_compression_parse("none,none,LZ4,zstd", &c, err, sizeof(err)), KV_OK);
    cr_assert_eq(lsm_compression_for(&c, 1, LSM_TIER_FD), LSM_COMPRESS_NONE);
    cr_assert_eq(lsm_compression_for(&c, 2, LSM_TIER_FD), LSM_COMPRESS_LZ4);
    cr_assert_eq(lsm_compression_for(&c, 3, LSM_TIER_SD), LSM_COMPRESS_ZSTD);
    cr_assert_eq(lsm_compression_for(&c, 6, LSM_TIER_SD), LSM_COMPRESS_ZSTD, "the last repeats");
    cr_assert_eq(lsm_compression_parse("slow=zstd", &c, err, sizeof(err)), KV_OK);
    cr_assert_eq(lsm_compression_for(&c, 2, LSM_TIER_FD), LSM_COMPRESS_NONE);
    cr_assert_eq(lsm_compression_for(&c, 3, LSM_TIER_SD), LSM_COMPRESS_ZSTD);
    cr_assert_eq(lsm_compression_parse("fast=lz4,slow=none", &c, err, sizeof(err)), KV_OK);
    cr_assert_eq(lsm_compression_for(&c, 2, LSM_TIER_FD), LSM_COMPRESS_LZ4);
    cr_assert_eq(lsm_compression_for(&c, 3, LSM_TIER_SD), LSM_COMPRESS_NONE);
    const char *bad[] = {"snappy",  "lz4,",      "fast=lz4,zstd",
                         "mid=lz4", "lz4,,zstd", "none,none,none,none,none,none,none,none"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        cr_assert_eq(lsm_compression_parse(bad[i], &c, err, sizeof(err)), KV_INVALID_ARGUMENT, "%s",
                     bad[i]);
        cr_assert_neq(err[0], 0, "%s: a message", bad[i]);
    }
}

Test(sst, bloom_false_positive_rate)
{
    char *dir = lt_mkdtemp("bloom");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, true), KV_OK);
    lsm_sst_builder *b;
    cr_assert_eq(lsm_sst_builder_open(&b, &v, 1, 4096), KV_OK);
    char k[32];
    for (int i = 0; i < 20000; i++) {
        int n = sprintf(k, "in%08d", i);
        lsm_rec r = {.key = k, .klen = (size_t)n, .type = LSM_PUT, .seqno = 1};
        cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    }
    lsm_file *f;
    cr_assert_eq(lsm_sst_builder_finish(b, 0, &f), KV_OK);
    int fp = 0;
    for (int i = 0; i < 20000; i++) {
        int n = sprintf(k, "in%08d", i);
        cr_assert(lsm_sst_may_contain(f->sst, k, (size_t)n), "false negative");
        n = sprintf(k, "out%08d", i);
        fp += lsm_sst_may_contain(f->sst, k, (size_t)n);
    }
    double rate = fp / 20000.0;
    cr_log_info("bloom false-positive rate %.4f", rate);
    cr_assert_lt(rate, 0.03, "false-positive rate %.4f", rate);
    lsm_file_unref(f);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

/* ---- SSTs whose checksums are right but whose metadata lies (found by
 * tests/fuzz/fuzz_sst: a footer or index naming ranges that wrap 64 or 32
 * bits, or blocks past the end of the file) ---- */

#define FOOTER 48

/* A small valid SST 000009.sst in dir; returns its size. */
static long small_sst(const char *dir)
{
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    lsm_sst_builder *b;
    cr_assert_eq(lsm_sst_builder_open(&b, &v, 9, 256), KV_OK);
    char k[32];
    for (int i = 0; i < 50; i++) {
        int n = sprintf(k, "key%04d", i);
        lsm_rec r = {.key = k, .klen = (size_t)n, .value = "v", .vlen = 1, .type = LSM_PUT};
        cr_assert_eq(lsm_sst_builder_add(b, &r), KV_OK);
    }
    lsm_file *f;
    cr_assert_eq(lsm_sst_builder_finish(b, 0, &f), KV_OK);
    lsm_file_unref(f);
    lsm_vol_fini(&v);
    char path[300];
    snprintf(path, sizeof(path), "%s/000009.sst", dir);
    return lt_size(path);
}

/* Writes index (its CRC after it) at offset 0 of 000009.sst and points the
 * footer at it as [ioff, ilen], with a valid footer CRC. */
static void lie_in_index(const char *dir, uint64_t ioff, uint32_t ilen, const void *index, size_t n)
{
    char path[300];
    snprintf(path, sizeof(path), "%s/000009.sst", dir);
    long size = lt_size(path);
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t crc[4], f[FOOTER];
    if (index) {
        lsm_set32(crc, kv_crc32c(0, index, n));
        cr_assert_eq(pwrite(fd, index, n, 0), (ssize_t)n);
        cr_assert_eq(pwrite(fd, crc, 4, (off_t)n), 4);
    }
    cr_assert_eq(pread(fd, f, FOOTER, size - FOOTER), FOOTER);
    lsm_set64(f, ioff);
    lsm_set32(f + 8, ilen);
    lsm_set32(f + 44, kv_crc32c(0, f, 44));
    cr_assert_eq(pwrite(fd, f, FOOTER, size - FOOTER), FOOTER);
    close(fd);
}

static kv_err open_lying_sst(const char *dir)
{
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    lsm_sst *s = NULL;
    kv_err rv = lsm_sst_open(&v, 9, &s);
    lsm_sst_close(s);
    lsm_vol_fini(&v);
    return rv;
}

Test(sst, footer_range_that_wraps_is_corrupt)
{
    char *dir = lt_mkdtemp("sstwrap");
    cr_assert_gt(small_sst(dir), FOOTER);
    /* off + len + 4 wraps to 0: the old check let a 4 GiB read through */
    lie_in_index(dir, 0ull - 0xFFFFFFFFull - 4, 0xFFFFFFFFu, NULL, 0);
    cr_assert_eq(open_lying_sst(dir), KV_DATA_LOSS);
    lt_rmrf(dir);
    free(dir);
}

Test(sst, index_key_length_that_wraps_is_corrupt)
{
    char *dir = lt_mkdtemp("sstidx");
    cr_assert_gt(small_sst(dir), FOOTER);
    /* one entry whose key length + 16 wraps 32 bits back to the index end */
    uint8_t index[8] = {0xf8, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    lie_in_index(dir, 0, sizeof(index), index, sizeof(index));
    cr_assert_eq(open_lying_sst(dir), KV_DATA_LOSS);
    lt_rmrf(dir);
    free(dir);
}

Test(sst, index_block_past_the_end_is_corrupt)
{
    char *dir = lt_mkdtemp("sstblk");
    cr_assert_gt(small_sst(dir), FOOTER);
    /* key "a", block at 0 of 0xFFFFFFF0 bytes: readers would allocate 4 GiB */
    uint8_t index[17] = {1, 0, 0, 0, 'a'};
    lsm_set64(index + 5, 0);
    lsm_set32(index + 13, 0xFFFFFFF0u);
    lie_in_index(dir, 0, sizeof(index), index, sizeof(index));
    cr_assert_eq(open_lying_sst(dir), KV_DATA_LOSS);
    lt_rmrf(dir);
    free(dir);
}

/* ---- WAL ---- */

static const lsm_opts wo; /* recovery options: the defaults (absolute) */

typedef struct collected {
    int n;
    uint64_t seqs[4096];
    uint64_t sum;
} collected;

static kv_err collect(void *arg, const lsm_rec *r)
{
    collected *c = arg;
    if (c->n < 4096)
        c->seqs[c->n] = r->seqno;
    c->n++;
    for (size_t i = 0; i < r->vlen; i++)
        c->sum += ((const uint8_t *)r->value)[i];
    return KV_OK;
}

/* Opens segment number of a WAL on v in sync mode (segs: its older ones,
 * handed over as lsm_wal_open takes them). */
static lsm_wal *wal_open(lsm_vol *v, lsm_sync mode, uint64_t number, lsm_wal_seg *segs, size_t n)
{
    lsm_opts o;
    lsm_opts_default(&o);
    o.sync = mode;
    lsm_wal *w;
    cr_assert_eq(lsm_wal_open(&w, v, &o, number, segs, n), KV_OK);
    return w;
}

static void wal_fill(lsm_vol *v, int frames, lsm_sync mode)
{
    lsm_wal *w = wal_open(v, mode, 1, NULL, 0);
    uint8_t val[64];
    char k[32];
    uint64_t seq = 1;
    for (int f = 0; f < frames; f++) {
        lsm_rec recs[3];
        char keys[3][32];
        for (int j = 0; j < 3; j++) {
            recs[j] = mkrec(keys[j], f * 3 + j, val, 64, seq++);
            recs[j].type = LSM_PUT;
        }
        cr_assert_eq(lsm_wal_write(w, recs, 3), KV_OK);
    }
    (void)k;
    lsm_rec bad = {.key = "", .klen = 0, .type = LSM_PUT};
    cr_assert_eq(lsm_wal_write(w, &bad, 1), KV_INVALID_ARGUMENT);
    lsm_wal_close(w);
}

/* Offset of frame number k (from 0) of the segment at path, walking the
 * frame headers [u32 crc][u32 len | 0x80000000 for compact records]. */
static long frame_offset(const char *path, int k)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    long off = 0;
    for (int i = 0; i < k; i++) {
        uint8_t h[8];
        cr_assert_eq(fseek(f, off, SEEK_SET), 0);
        cr_assert_eq(fread(h, 1, 8, f), 8, "frame %d", i);
        off += 8 + (long)(lsm_get32(h + 4) & 0x7fffffffu);
    }
    fclose(f);
    return off;
}

/* Appends a frame of recs in the codec before compact records (fixed
 * 34-byte headers, no flag in len), as a WAL written by that code. */
static void append_fixed_frame(const char *path, const lsm_rec *recs, size_t n)
{
    uint8_t buf[4096];
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_leq(len + lsm_rec_size(&recs[i]), sizeof(buf) - 8);
        lsm_rec_encode(buf + 8 + len, &recs[i]);
        len += lsm_rec_size(&recs[i]);
    }
    lsm_set32(buf + 4, (uint32_t)len);
    lsm_set32(buf, kv_crc32c(0, buf + 4, len + 4));
    FILE *f = fopen(path, "ab");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(buf, 1, len + 8, f), len + 8);
    fclose(f);
}

Test(wal, frames_are_compact_and_fixed_frames_still_replay)
{
    char *dir = lt_mkdtemp("walmix");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    wal_fill(&v, 10, LSM_SYNC_NONE); /* seqnos 1..30, compact */
    char *path = lt_find(dir, ".wal", 1);
    cr_assert_not_null(path);
    long compact_size = lt_size(path);
    /* the same 30 records in fixed frames: 18 header bytes a record more */
    uint8_t val[64];
    memset(val, 0, sizeof(val));
    long fixed = 0, recc = 0;
    for (int f = 0; f < 10; f++)
        for (int j = 0; j < 3; j++) {
            char key[32];
            lsm_rec r = mkrec(key, f * 3 + j, val, 64, (uint64_t)(f * 3 + j) + 1);
            r.type = LSM_PUT;
            fixed += (long)lsm_rec_size(&r);
            recc += (long)lsm_recc_size(&r);
        }
    cr_assert_eq(compact_size, 10 * 8 + recc);
    cr_assert_lt(recc + 18 * 30, fixed + 1, "compact records: at least 18 bytes a record less");
    /* then frames as the code before wrote them, seqnos 31..36, then
     * compact ones again */
    for (int f = 0; f < 3; f++) {
        lsm_rec recs[2];
        char keys[2][32];
        for (int j = 0; j < 2; j++) {
            recs[j] = mkrec(keys[j], 100 + f * 2 + j, val, 64, 31 + (uint64_t)(f * 2 + j));
            recs[j].type = j ? LSM_DELETE : LSM_PUT;
        }
        append_fixed_frame(path, recs, 2);
    }
    collected c = {0};
    lsm_wal_seg *segs;
    size_t nsegs;
    uint64_t max_seq, max_num;
    cr_assert_eq(lsm_wal_recover(&v, &wo, 0, collect, &c, &segs, &nsegs, &max_seq, &max_num),
                 KV_OK);
    cr_assert_eq(c.n, 36);
    for (int i = 0; i < 36; i++)
        cr_assert_eq(c.seqs[i], (uint64_t)i + 1);
    lsm_wal *w = wal_open(&v, LSM_SYNC_NONE, max_num + 1, segs, nsegs);
    char key[32];
    lsm_rec r = mkrec(key, 500, val, 64, 37);
    cr_assert_eq(lsm_wal_write(w, &r, 1), KV_OK);
    lsm_wal_close(w); /* segs was the WAL's */
    collected c2 = {0};
    cr_assert_eq(lsm_wal_recover(&v, &wo, 0, collect, &c2, &segs, &nsegs, &max_seq, &max_num),
                 KV_OK);
    cr_assert_eq(c2.n, 37);
    cr_assert_eq(c2.seqs[36], 37);
    free(segs);
    free(path);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

/* A corrupt frame followed by a valid one is corruption, not a torn tail,
 * however small the valid frame: a delete of a 1-byte key without version
 * is a 4-byte record, a 12-byte frame, shorter than a fixed record header
 * (recovery once looked for frames only where one of those fitted, and
 * would have truncated this acknowledged delete as a torn tail). */
Test(wal, corruption_before_a_tiny_last_frame_is_data_loss)
{
    char *dir = lt_mkdtemp("waltiny");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    lsm_wal *w = wal_open(&v, LSM_SYNC_NONE, 1, NULL, 0);
    uint8_t val[64];
    memset(val, 7, sizeof(val));
    char key[32];
    lsm_rec big = mkrec(key, 1, val, 64, 1);
    big.type = LSM_PUT;
    cr_assert_eq(lsm_wal_write(w, &big, 1), KV_OK);
    lsm_rec tiny = {.key = "a", .klen = 1, .seqno = 2, .type = LSM_DELETE};
    cr_assert_eq(lsm_recc_size(&tiny), 4);
    cr_assert_eq(lsm_wal_write(w, &tiny, 1), KV_OK);
    lsm_wal_close(w);
    char *path = lt_find(dir, ".wal", 1);
    cr_assert_not_null(path);
    long size = lt_size(path);
    cr_assert_eq(size, frame_offset(path, 1) + 12);
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(fseek(f, 20, SEEK_SET), 0); /* inside the first frame's record */
    int ch = fgetc(f);
    cr_assert_eq(fseek(f, 20, SEEK_SET), 0);
    fputc(ch ^ 0x55, f);
    fclose(f);
    collected c = {0};
    lsm_wal_seg *segs = NULL;
    size_t nsegs;
    uint64_t max_seq, max_num;
    cr_assert_eq(lsm_wal_recover(&v, &wo, 0, collect, &c, &segs, &nsegs, &max_seq, &max_num),
                 KV_DATA_LOSS, "the valid frame after the bad one must be found");
    free(segs);
    cr_assert_eq(lt_size(path), size, "nothing truncated");
    /* point-in-time recovery cuts there, as asked */
    lsm_opts pit = {.wal_recovery = LSM_WAL_POINT_IN_TIME};
    collected c2 = {0};
    cr_assert_eq(lsm_wal_recover(&v, &pit, 0, collect, &c2, &segs, &nsegs, &max_seq, &max_num),
                 KV_OK);
    cr_assert_eq(c2.n, 0);
    cr_assert_eq(lt_size(path), 0);
    free(segs);
    free(path);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

Test(wal, roundtrip_and_flushed_skip)
{
    char *dir = lt_mkdtemp("wal");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, true), KV_OK);
    wal_fill(&v, 100, LSM_SYNC_BATCH);
    collected c = {0};
    lsm_wal_seg *segs;
    size_t nsegs;
    uint64_t max_seq, max_num;
    cr_assert_eq(lsm_wal_recover(&v, &wo, 0, collect, &c, &segs, &nsegs, &max_seq, &max_num),
                 KV_OK);
    cr_assert_eq(c.n, 300);
    cr_assert_eq(max_seq, 300);
    cr_assert_eq(nsegs, 1);
    cr_assert_eq(segs[0].max_seq, 300);
    for (int i = 0; i < 300; i++)
        cr_assert_eq(c.seqs[i], (uint64_t)i + 1);
    free(segs);
    collected c2 = {0};
    cr_assert_eq(lsm_wal_recover(&v, &wo, 150, collect, &c2, &segs, &nsegs, &max_seq, &max_num),
                 KV_OK);
    cr_assert_eq(c2.n, 150);
    cr_assert_eq(c2.seqs[0], 151);
    free(segs);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

Test(wal, torn_tail_is_truncated)
{
    char *dir = lt_mkdtemp("waltorn");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    wal_fill(&v, 50, LSM_SYNC_NONE);
    char *path = lt_find(dir, ".wal", 1);
    cr_assert_not_null(path);
    long size = lt_size(path);
    cr_assert_eq(truncate(path, size - 5), 0); /* cut the last frame */
    collected c = {0};
    lsm_wal_seg *segs;
    size_t nsegs;
    uint64_t max_seq, max_num;
    cr_assert_eq(lsm_wal_recover(&v, &wo, 0, collect, &c, &segs, &nsegs, &max_seq, &max_num),
                 KV_OK);
    cr_assert_eq(c.n, 147, "replayed %d", c.n);
    cr_assert_eq(max_seq, 147);
    cr_assert_eq(lt_size(path), frame_offset(path, 49), "torn frame not truncated");
    free(segs);
    free(path);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

/* ---- MANIFEST ---- */

static lsm_file *mkfile(uint64_t number, int level, const char *lo, const char *hi)
{
    lsm_file *f = lsm_file_new();
    f->number = number;
    f->level = level;
    f->tier = level > 2 ? LSM_TIER_SD : LSM_TIER_FD;
    f->size = number * 1000;
    f->nentries = number * 10;
    f->min_seq = number;
    f->max_seq = number * 2;
    f->slen = strlen(lo);
    f->llen = strlen(hi);
    f->smallest = (uint8_t *)strdup(lo);
    f->largest = (uint8_t *)strdup(hi);
    return f;
}

Test(manifest, roundtrip)
{
    char *dir = lt_mkdtemp("man");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, true), KV_OK);
    lsm_recovered st;
    cr_assert_eq(lsm_manifest_recover(&v, &st), KV_NOT_FOUND);
    lsm_edit snap = {.has_next = true, .next_file = 10, .has_flushed = true, .flushed_seq = 5};
    lsm_file *a = mkfile(3, 0, "a", "m"), *b = mkfile(4, 1, "b", "c");
    lsm_edit_add(&snap, a);
    lsm_edit_add(&snap, b);
    lsm_manifest *m;
    cr_assert_eq(lsm_manifest_create(&m, &v, 9, &snap, 0), KV_OK);
    lsm_edit e = {.has_next = true,
                  .next_file = 20,
                  .has_flushed = true,
                  .flushed_seq = 42,
                  .has_log = true,
                  .log_number = 17};
    lsm_file *c = mkfile(12, 3, "x", "zz");
    lsm_edit_add(&e, c);
    lsm_edit_del(&e, 0, 3);
    cr_assert_eq(lsm_manifest_append(m, &e), KV_OK);
    lsm_manifest_close(m);
    cr_assert_eq(lsm_manifest_recover(&v, &st), KV_OK);
    cr_assert_eq(st.manifest, 9);
    cr_assert_eq(st.state.next_file, 20);
    cr_assert_eq(st.state.flushed_seq, 42);
    cr_assert_eq(st.state.log_number, 17);
    cr_assert_eq(st.state.nadd, 2);
    for (size_t i = 0; i < st.state.nadd; i++) {
        lsm_file *f = st.state.adds[i];
        lsm_file *want = f->number == 4 ? b : c;
        cr_assert_eq(f->number, want->number);
        cr_assert_eq(f->level, want->level);
        cr_assert_eq(f->tier, want->tier);
        cr_assert_eq(f->size, want->size);
        cr_assert_eq(f->nentries, want->nentries);
        cr_assert_eq(f->min_seq, want->min_seq);
        cr_assert_eq(f->max_seq, want->max_seq);
        cr_assert_eq(f->slen, want->slen);
        cr_assert(memcmp(f->smallest, want->smallest, f->slen) == 0);
        cr_assert(memcmp(f->largest, want->largest, f->llen) == 0);
    }
    lsm_edit_free(&st.state);

    /* a torn last append (cut payload) is ignored, the earlier edits stay */
    char path[300];
    snprintf(path, sizeof(path), "%s/MANIFEST-000009", dir);
    long size = lt_size(path);
    cr_assert_eq(truncate(path, size - 5), 0);
    cr_assert_eq(lsm_manifest_recover(&v, &st), KV_OK);
    cr_assert_eq(st.state.next_file, 10, "torn edit applied");
    cr_assert_eq(st.state.nadd, 2);
    lsm_edit_free(&st.state);
    lsm_edit_free(&snap);
    lsm_edit_free(&e);
    lsm_file_unref(a);
    lsm_file_unref(b);
    lsm_file_unref(c);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

/* Found by tests/fuzz/fuzz_manifest: a MANIFEST naming one file number at two
 * levels was accepted; compacting one copy away deleted the file the other
 * still named, and the db that had opened and closed cleanly could not open
 * again. It is corrupt at the first open now. */
Test(manifest, a_number_listed_twice_is_corrupt)
{
    char *dir = lt_mkdtemp("mandup");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    lsm_edit snap = {.has_next = true, .next_file = 10};
    lsm_file *a = mkfile(5, 0, "a", "m"), *b = mkfile(5, 2, "n", "z");
    lsm_edit_add(&snap, a);
    lsm_edit_add(&snap, b);
    lsm_manifest *m;
    cr_assert_eq(lsm_manifest_create(&m, &v, 9, &snap, 0), KV_OK);
    lsm_recovered st;
    cr_assert_eq(lsm_manifest_recover(&v, &st), KV_DATA_LOSS);
    /* once an edit deletes one of them, the state is valid again */
    lsm_edit mv = {0};
    lsm_edit_del(&mv, 0, 5);
    cr_assert_eq(lsm_manifest_append(m, &mv), KV_OK);
    lsm_manifest_close(m);
    cr_assert_eq(lsm_manifest_recover(&v, &st), KV_OK);
    cr_assert_eq(st.state.nadd, 1);
    lsm_edit_free(&st.state);
    lsm_edit_free(&snap);
    lsm_edit_free(&mv);
    lsm_file_unref(a);
    lsm_file_unref(b);
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}

/* Found by tests/fuzz/fuzz_manifest twice: a store near the last file number
 * wrote a MANIFEST its next open refused (DATA_LOSS). Whatever a store
 * writes, it reads; once it has no numbers left, flushes and opens fail with
 * RESOURCE_EXHAUSTED and the MANIFEST still reads. */
Test(manifest, the_last_file_numbers_run_out_cleanly)
{
    char *dir = lt_mkdtemp("mannum");
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    lsm_edit snap = {.has_next = true, .next_file = LSM_FILE_NUMBER_MAX - 5};
    lsm_manifest *m;
    cr_assert_eq(lsm_manifest_create(&m, &v, 9, &snap, 0), KV_OK);
    lsm_manifest_close(m);
    lsm_opts o;
    lsm_opts_default(&o);
    o.fast_dir = dir;
    o.sync = LSM_SYNC_NONE;
    o.hotrap = false;
    lsm_db *db = NULL;
    /* the open takes MAX-5 and MAX-4 (WAL, MANIFEST); the flush MAX-3 and
     * MAX-2 (a new WAL segment, the SST) */
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    lsm_rec r = {.key = "k", .klen = 1, .value = "v", .vlen = 1, .seqno = 1, .type = LSM_PUT};
    cr_assert_eq(lsm_wal_append(db, &r, 1), KV_OK);
    cr_assert_eq(lsm_flush(db, &r, 1, 1), KV_OK);
    lsm_close(db);
    /* next is MAX-1: handing it out would write a next of MAX, which no
     * reader accepts, so the reopen finds no number for its WAL */
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_RESOURCE_EXHAUSTED);
    lsm_recovered st;
    cr_assert_eq(lsm_manifest_recover(&v, &st), KV_OK, "the last MANIFEST written does not read");
    cr_assert_eq(st.state.next_file, LSM_FILE_NUMBER_MAX - 1);
    cr_assert_eq(st.state.nadd, 1, "the flushed file is not in the MANIFEST");
    lsm_edit_free(&st.state);
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_RESOURCE_EXHAUSTED,
                 "a failed open used a number");
    lsm_vol_fini(&v);
    lt_rmrf(dir);
    free(dir);
}
