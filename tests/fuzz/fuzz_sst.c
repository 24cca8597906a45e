/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for SST reading (node/lsm/sst.c): the input is
 * [u8 flags][the file image]; flags bit 0 re-checksums the image
 * (fz_sst_fix) so the footer, index, bloom and block parsers see arbitrary
 * contents behind valid CRCs, bit 1 reads through io_uring. An image that
 * opens is then used as compaction and lookups use it: a full sequential
 * scan, point lookups (bloom, block search) of keys the scan returned and of
 * made-up ones, direct block reads and seeks. Every failure must be an error
 * code, never a crash, a leak or an out-of-bounds read. A fresh directory
 * per input.
 */
#include <stdlib.h>

#include "fuzz_lsm.h"
#include "fuzz_util.h"

#define MAX_KEYS 32
#define MAX_SCAN 20000

typedef struct keyset {
    uint8_t *k[MAX_KEYS];
    size_t len[MAX_KEYS], n;
} keyset;

static void lookup(lsm_sst *s, const void *key, size_t klen)
{
    (void)lsm_sst_may_contain(s, key, klen);
    int b = lsm_sst_find_block(s, key, klen);
    FZ_CHECK(b < (int)lsm_sst_nblocks(s), "block %d of %u", b, lsm_sst_nblocks(s));
    lsm_io io;
    if (b < 0 || lsm_sst_read_block(s, b, &io) != KV_OK)
        return;
    lsm_rec r;
    if (lsm_block_search(s, io.buf, io.len, key, klen, &r) == KV_OK)
        FZ_CHECK(lsm_key_cmp(r.key, r.klen, key, klen) == 0, "block search found another key");
    free(io.buf);
}

/* Scans the whole file; keeps copies of the first keys. */
static void scan(lsm_sst *s, keyset *ks)
{
    lsm_sst_iter it;
    lsm_sst_iter_init(&it, s);
    for (int i = 0; it.valid && i < MAX_SCAN; i++, lsm_sst_iter_next(&it)) {
        FZ_CHECK(lsm_rec_valid(&it.cur), "the scan returned an invalid record");
        if (ks->n < MAX_KEYS) {
            ks->k[ks->n] = malloc(it.cur.klen);
            FZ_CHECK(ks->k[ks->n], "out of memory");
            memcpy(ks->k[ks->n], it.cur.key, it.cur.klen);
            ks->len[ks->n++] = it.cur.klen;
        }
    }
    lsm_sst_iter_fini(&it);
}

static void use(lsm_sst *s, const uint8_t *data, size_t size)
{
    keyset ks = {0};
    scan(s, &ks);
    for (size_t i = 0; i < ks.n; i++)
        lookup(s, ks.k[i], ks.len[i]);
    static const char *const made_up[] = {"", "a", "m", "zzzz", "\xff\xff"};
    for (size_t i = 0; i < sizeof(made_up) / sizeof(made_up[0]); i++)
        lookup(s, made_up[i], strlen(made_up[i]));
    lookup(s, data, size < 16 ? size : 16);
    for (uint32_t b = 0; b < lsm_sst_nblocks(s) && b < 8; b++) {
        lsm_sst_iter it;
        lsm_sst_iter_at_block(&it, s, b);
        lsm_sst_iter_next(&it);
        lsm_sst_iter_fini(&it);
    }
    for (size_t i = 0; i < ks.n && i < 4; i++) {
        lsm_sst_iter it;
        lsm_sst_iter_seek(&it, s, ks.k[i], ks.len[i]);
        FZ_CHECK(!it.valid || lsm_key_cmp(it.cur.key, it.cur.klen, ks.k[i], ks.len[i]) >= 0,
                 "seek stopped before its key");
        lsm_sst_iter_fini(&it);
    }
    (void)lsm_sst_mem(s);
    for (size_t i = 0; i < ks.n; i++)
        free(ks.k[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    uint8_t *img = malloc(in.n + 1);
    FZ_CHECK(img, "out of memory");
    memcpy(img, in.p, in.n);
    if (flags & 1)
        fz_sst_fix(img, in.n);
    char dir[512], name[64];
    fz_fresh_dir(dir, sizeof(dir), "sst");
    lsm_sst_name(name, sizeof(name), 1);
    fz_write_file(dir, name, img, in.n);
    free(img);
    lsm_vol v;
    FZ_CHECK(lsm_vol_init(&v, dir, LSM_TIER_FD, flags & 2) == KV_OK, "lsm_vol_init");
    lsm_sst *s = NULL;
    if (lsm_sst_open(&v, 1, &s) == KV_OK) {
        use(s, data, size);
        lsm_sst_close(s);
    }
    lsm_vol_fini(&v);
    return 0;
}
