/* SPDX-License-Identifier: MIT */
/*
 * kallax's double-write journal (InnoDB's doublewrite buffer) and the commit
 * of a flush through it. JOURNAL holds one round: a header of whole pages
 * [u32 magic "KXJ1"][u32 crc32c][u64 count][u64 header pages][u64 0]
 * [u64 block number] x count, then the count block images. A round is
 * written and fsynced before any of its images is written in place, so:
 * a crash while writing the journal leaves every block as it was (the
 * journal fails its checks: its header crc, or an image that does not
 * verify as its block, and is ignored at open; the WAL replays); a crash
 * while writing in place leaves a complete journal that open copies over
 * the blocks. The header crc covers the block numbers, and each image's own
 * crc covers its block number, so a stale image from an earlier round never
 * passes as part of a new one (or, if it does, it is the block as it is).
 * The last round's block numbers stay in memory: a block found corrupt
 * later is rewritten from the journal when it is there (kx_journal_lookup).
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "node/kallax/kallax_int.h"

#define J_MAGIC 0x314a584bu   /* "KXJ1": a round not known to be in place yet */
#define J_APPLIED 0x414a584bu /* "KXJA": its images are in place (kept for repairs) */
#define J_FIXED 32u

static uint64_t hdr_pages(uint64_t count)
{
    return (J_FIXED + 8 * count + KALLAX_BLOCK - 1) / KALLAX_BLOCK;
}

/* Keeps the round's block numbers for kx_journal_lookup. */
static kv_err remember(kallax *kx, const uint64_t *blks, size_t n, uint64_t hdr)
{
    uint64_t *copy = malloc((n ? n : 1) * sizeof(*copy));
    if (!copy)
        return KV_RESOURCE_EXHAUSTED;
    if (n)
        memcpy(copy, blks, n * sizeof(*copy));
    pthread_mutex_lock(&kx->jmu);
    free(kx->jblocks);
    kx->jblocks = copy;
    kx->njblocks = n;
    kx->jhdr = hdr;
    pthread_mutex_unlock(&kx->jmu);
    return KV_OK;
}

/* Writes one round (images in the order of bs) and fsyncs it. */
static kv_err journal_write(kallax *kx, kx_tblock **bs, size_t n)
{
    uint64_t hdr = hdr_pages(n);
    size_t len = (size_t)(hdr + n) * KALLAX_BLOCK;
    uint8_t *buf = calloc(1, len);
    uint64_t *blks = malloc((n ? n : 1) * sizeof(*blks));
    kv_err rv = buf && blks ? KV_OK : KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; rv == KV_OK && i < n; i++) {
        blks[i] = bs[i]->blk;
        lsm_set64(buf + J_FIXED + 8 * i, bs[i]->blk);
        memcpy(buf + (hdr + i) * KALLAX_BLOCK, bs[i]->img, KALLAX_BLOCK);
    }
    if (rv == KV_OK) {
        lsm_set32(buf, J_MAGIC);
        lsm_set64(buf + 8, n);
        lsm_set64(buf + 16, hdr);
        lsm_set32(buf + 4, kv_crc32c(0, buf + 8, J_FIXED - 8 + 8 * n));
        rv = remember(kx, NULL, 0, 0); /* the old round is being overwritten */
    }
    if (rv == KV_OK)
        rv = lsm_vol_write(&kx->vol, kx->journal_fd, buf, len, 0, true);
    if (rv == KV_OK) {
        atomic_fetch_add_explicit(&kx->journal_bytes, len, memory_order_relaxed);
        rv = remember(kx, blks, n, hdr);
    } else {
        KV_ERROR(KX_LOG, "%s/JOURNAL: write of %zu bytes: %s", kx->vol.dir, len, kv_strerror(rv));
    }
    free(buf);
    free(blks);
    return rv;
}

/* The round's images are synced in place: open need not copy them again
 * (not synced: a crash before the mark reaches the disk only makes open
 * copy them once more, which changes nothing). */
static void mark_applied(kallax *kx)
{
    uint8_t m[4];
    lsm_set32(m, J_APPLIED);
    if (lsm_vol_write(&kx->vol, kx->journal_fd, m, sizeof(m), 0, false) != KV_OK)
        KV_WARN(KX_LOG, "%s/JOURNAL: cannot mark the round applied (open copies it again)",
                kx->vol.dir);
}

/* One round: journal, then in place in descending block order, fsync. */
static kv_err round_commit(kx_tab *t, kx_tblock **bs, size_t n)
{
    kallax *kx = t->kx;
    for (size_t i = 0; i < n; i++)
        kx_block_seal(bs[i]->img, bs[i]->blk);
    kv_err rv = journal_write(kx, bs, n);
    if (rv != KV_OK)
        return rv;
    if (t->moved)
        pthread_rwlock_wrlock(&kx->move_lock);
    for (size_t i = 0; i < n && rv == KV_OK; i++)
        rv = kx_write_block(kx, bs[i]->blk, bs[i]->img);
    if (t->moved)
        pthread_rwlock_unlock(&kx->move_lock);
    if (rv == KV_OK)
        rv = lsm_vol_fsync(&kx->vol, kx->blocks_fd);
    if (rv == KV_OK)
        mark_applied(kx);
    for (size_t i = 0; rv == KV_OK && i < n; i++) {
        kx_sum s;
        kx_block_sum(kx, bs[i]->orig, bs[i]->blk, &s);
        kx_count(kx, &s, -1);
        kx_block_sum(kx, bs[i]->img, bs[i]->blk, &s);
        kx_count(kx, &s, 1);
    }
    t->rounds += rv == KV_OK;
    return rv;
}

static int desc_blk(const void *a, const void *b)
{
    const kx_tblock *x = *(kx_tblock *const *)a, *y = *(kx_tblock *const *)b;
    return x->blk > y->blk ? -1 : x->blk < y->blk;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Extent pages referenced by the images (orig or img) of the dirty blocks,
 * sorted, as (page, pages) pairs flattened to pages only. */
static kv_err ext_refs(kx_tblock **bs, size_t n, bool orig, uint64_t **out, size_t *cnt)
{
    size_t cap = 64, k = 0;
    uint64_t *a = malloc(cap * sizeof(*a));
    for (size_t i = 0; a && i < n; i++) {
        const uint8_t *img = orig ? bs[i]->orig : bs[i]->img;
        size_t off = KX_HDR;
        for (unsigned r = 0; a && r < kx_block_count(img); r++) {
            kx_slot s;
            kx_block_next(img, &off, &s);
            if (!(s.flags & KX_F_EXTENT))
                continue;
            if (k + 2 > cap) {
                uint64_t *b = realloc(a, (cap *= 2) * sizeof(*a));
                if (!b)
                    free(a);
                a = b;
            }
            if (a) {
                a[k++] = s.ext_page;
                a[k++] = kx_ext_pages(s.vlen);
            }
        }
    }
    *out = a;
    *cnt = k;
    return a ? KV_OK : KV_RESOURCE_EXHAUSTED;
}

/* Queues the extents the old images referenced and the new ones do not. */
static kv_err free_dropped(kallax *kx, kx_tblock **bs, size_t n)
{
    uint64_t *old = NULL, *cur = NULL;
    size_t nold = 0, ncur = 0;
    kv_err rv = ext_refs(bs, n, true, &old, &nold);
    if (rv == KV_OK)
        rv = ext_refs(bs, n, false, &cur, &ncur);
    for (size_t i = 0; i < ncur; i += 2)
        cur[i / 2] = cur[i]; /* pages only, sorted for the search */
    if (rv == KV_OK && ncur)
        qsort(cur, ncur / 2, sizeof(*cur), cmp_u64);
    for (size_t i = 0; rv == KV_OK && i < nold; i += 2)
        if (!bsearch(&old[i], cur, ncur / 2, sizeof(*cur), cmp_u64))
            rv = kx_ext_free_later(&kx->ext, old[i], old[i + 1]);
    free(old);
    free(cur);
    return rv;
}

kv_err kx_commit(kx_tab *t, uint64_t flushed)
{
    kallax *kx = t->kx;
    kx_tblock **d = malloc((t->n ? t->n : 1) * sizeof(*d));
    if (!d)
        return KV_RESOURCE_EXHAUSTED;
    size_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->b[i]->dirty)
            d[n++] = t->b[i];
    qsort(d, n, sizeof(*d), desc_blk);
    kv_err rv = t->nnew ? lsm_vol_fsync(&kx->vol, kx->ext_fd) : KV_OK;
    for (size_t i = 0; rv == KV_OK && i < n; i += kx->o.journal_blocks) {
        size_t m = n - i < kx->o.journal_blocks ? n - i : kx->o.journal_blocks;
        rv = round_commit(t, d + i, m);
    }
    if (rv == KV_OK && flushed != kx->flushed_seq)
        rv = kx_meta_write(kx, flushed);
    if (rv == KV_OK)
        rv = free_dropped(kx, d, n);
    if (rv == KV_OK) {
        kx_ext_flush_done(&kx->ext);
        atomic_fetch_add(&kx->flush_gen, n > 0);
    }
    free(d);
    return rv;
}

/* ---- recovery and repair ---- */

/* Reads and checks the journal: KV_OK with *buf (header + images) and *n,
 * NOT_FOUND when there is no complete round. */
static kv_err journal_read(kallax *kx, uint8_t **buf, uint64_t *n, uint64_t *hdr, bool *applied)
{
    uint8_t first[KALLAX_BLOCK];
    if (lsm_vol_pread(&kx->vol, kx->journal_fd, first, sizeof(first), 0) != KV_OK ||
        (lsm_get32(first) != J_MAGIC && lsm_get32(first) != J_APPLIED))
        return KV_NOT_FOUND;
    *applied = lsm_get32(first) == J_APPLIED;
    uint64_t cnt = lsm_get64(first + 8), h = lsm_get64(first + 16);
    if (cnt > kx->nblocks || h != hdr_pages(cnt))
        return KV_NOT_FOUND;
    uint8_t *b = malloc((size_t)(h + cnt) * KALLAX_BLOCK);
    if (!b)
        return KV_RESOURCE_EXHAUSTED;
    bool ok =
        lsm_vol_pread(&kx->vol, kx->journal_fd, b, (size_t)(h + cnt) * KALLAX_BLOCK, 0) == KV_OK &&
        lsm_get32(b + 4) == kv_crc32c(0, b + 8, J_FIXED - 8 + 8 * cnt);
    for (uint64_t i = 0; ok && i < cnt; i++) {
        uint64_t blk = lsm_get64(b + J_FIXED + 8 * i);
        ok = blk < kx->nblocks && kx_block_check(b + (h + i) * KALLAX_BLOCK, blk) == KV_OK;
    }
    if (!ok) {
        KV_WARN(KX_LOG,
                "%s/JOURNAL: incomplete round (a crash while it was written): "
                "ignored, its blocks were not touched",
                kx->vol.dir);
        free(b);
        return KV_NOT_FOUND;
    }
    *buf = b;
    *n = cnt;
    *hdr = h;
    return KV_OK;
}

kv_err kx_journal_recover(kallax *kx, uint64_t *applied)
{
    uint8_t *b = NULL;
    uint64_t n = 0, h = 0;
    bool done = false;
    kv_err rv = journal_read(kx, &b, &n, &h, &done);
    *applied = 0;
    if (rv == KV_NOT_FOUND)
        return KV_OK;
    uint64_t *blks = rv == KV_OK ? malloc((n ? n : 1) * sizeof(*blks)) : NULL;
    if (rv == KV_OK && !blks)
        rv = KV_RESOURCE_EXHAUSTED;
    for (uint64_t i = 0; rv == KV_OK && i < n; i++) {
        blks[i] = lsm_get64(b + J_FIXED + 8 * i);
        if (!done)
            rv = kx_write_block(kx, blks[i], b + (h + i) * KALLAX_BLOCK);
    }
    if (rv == KV_OK && !done)
        rv = lsm_vol_fsync(&kx->vol, kx->blocks_fd);
    if (rv == KV_OK && !done)
        mark_applied(kx);
    if (rv == KV_OK)
        rv = remember(kx, blks, (size_t)n, h);
    if (rv == KV_OK)
        *applied = done ? 0 : n;
    free(blks);
    free(b);
    return rv;
}

kv_err kx_journal_lookup(kallax *kx, uint64_t blk, uint8_t *img)
{
    pthread_mutex_lock(&kx->jmu);
    uint64_t at = UINT64_MAX, hdr = kx->jhdr;
    for (size_t i = 0; i < kx->njblocks; i++)
        if (kx->jblocks[i] == blk)
            at = i;
    pthread_mutex_unlock(&kx->jmu);
    if (at == UINT64_MAX)
        return KV_NOT_FOUND;
    kv_err rv =
        lsm_vol_pread(&kx->vol, kx->journal_fd, img, KALLAX_BLOCK, (hdr + at) * KALLAX_BLOCK);
    if (rv == KV_OK && kx_block_check(img, blk) != KV_OK)
        rv = KV_DATA_LOSS;
    return rv;
}
