/* SPDX-License-Identifier: MIT */
/*
 * kallax reads and the small calls around them: point lookups (the home
 * block read without a lock; the spill blocks, when the home block's hint
 * says records of that home spilled, under move_lock with the home block
 * read again, so that no record moved by a concurrent flush is missed),
 * batched lookups whose home-block reads go to the volume together, the WAL
 * append and sync, counters, statistics and the size estimate.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "node/kallax/kallax_int.h"

#define EXT_TRIES 3

/* Copies key's record out of img: *found, KV_ABORTED when its extent failed
 * its crc (a flush may have replaced it meanwhile: the caller retries). */
static kv_err find_in(kallax *kx, const uint8_t *img, const void *key, size_t klen, lsm_rec *out,
                      bool *found)
{
    kx_slot s;
    *found = false;
    if (!kx_block_find(img, key, klen, &s))
        return KV_OK;
    kv_err rv = kx_slot_copy(&s, out);
    if (rv == KV_OK && (s.flags & KX_F_EXTENT)) {
        rv = kx_ext_read(kx, &s, out);
        if (rv != KV_OK)
            lsm_rec_free(out);
        if (rv == KV_DATA_LOSS)
            rv = KV_ABORTED;
    }
    *found = rv == KV_OK;
    return rv;
}

/* The spill blocks of home h, under move_lock (the home block read again). */
static kv_err find_spilled(kallax *kx, uint64_t h, uint8_t *img, const void *key, size_t klen,
                           lsm_rec *out)
{
    bool found = false;
    pthread_rwlock_rdlock(&kx->move_lock);
    kv_err rv = kx_read_block(kx, h, img);
    if (rv == KV_OK)
        rv = find_in(kx, img, key, klen, out, &found);
    unsigned spill = rv == KV_OK ? kx_block_spill(img) : 0;
    for (unsigned d = 1; rv == KV_OK && !found && d <= spill; d++) {
        atomic_fetch_add_explicit(&kx->spill_reads, 1, memory_order_relaxed);
        rv = kx_read_block(kx, h + d, img);
        if (rv == KV_OK)
            rv = find_in(kx, img, key, klen, out, &found);
    }
    pthread_rwlock_unlock(&kx->move_lock);
    return rv != KV_OK ? rv : found ? KV_OK : KV_NOT_FOUND;
}

static kv_err lookup_once(kallax *kx, const void *key, size_t klen, const uint8_t *home_img,
                          lsm_rec *out)
{
    uint64_t h = kallax_home(kx, key, klen);
    uint8_t *img = malloc(KALLAX_BLOCK);
    if (!img)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = KV_OK;
    if (home_img)
        memcpy(img, home_img, KALLAX_BLOCK);
    else
        rv = kx_read_block(kx, h, img);
    bool found = false;
    if (rv == KV_OK)
        rv = find_in(kx, img, key, klen, out, &found);
    if (rv == KV_OK && !found)
        rv = kx_block_spill(img) ? find_spilled(kx, h, img, key, klen, out) : KV_NOT_FOUND;
    free(img);
    return rv;
}

kv_err kx_lookup(kallax *kx, const void *key, size_t klen, const uint8_t *home_img, lsm_rec *out)
{
    kv_err rv = KV_ABORTED;
    for (int i = 0; i < EXT_TRIES && rv == KV_ABORTED; i++) {
        rv = lookup_once(kx, key, klen, i ? NULL : home_img, out);
        if (rv == KV_ABORTED)
            atomic_fetch_add_explicit(&kx->retries, 1, memory_order_relaxed);
    }
    if (rv == KV_ABORTED) {
        KV_ERROR(KX_LOG, "%s/EXTENTS: the value of a key of block %llu fails its checksum",
                 kx->vol.dir, (unsigned long long)kallax_home(kx, key, klen));
        rv = KV_DATA_LOSS;
    }
    return rv;
}

kv_err kallax_get(kallax *kx, const void *key, size_t klen, lsm_rec *out)
{
    if (!key || klen == 0 || klen > KALLAX_MAX_KEY)
        return KV_INVALID_ARGUMENT;
    lsm_rec r;
    kv_err rv = kx_lookup(kx, key, klen, NULL, &r);
    if (rv == KV_OK)
        *out = r;
    return rv;
}

/* Reads the home blocks of keys [0, n) together into imgs (checked). */
static kv_err read_homes(kallax *kx, size_t n, const void *const *keys, const size_t *klens,
                         uint8_t *imgs, kv_err *errs)
{
    lsm_io *ios = calloc(n, sizeof(*ios));
    if (!ios)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        uint64_t h =
            klens[i] && klens[i] <= KALLAX_MAX_KEY ? kallax_home(kx, keys[i], klens[i]) : 0;
        ios[i] = (lsm_io){.vol = &kx->vol,
                          .fd = kx->blocks_fd,
                          .buf = imgs + i * KALLAX_BLOCK,
                          .len = KALLAX_BLOCK,
                          .off = h * KALLAX_BLOCK};
    }
    lsm_vol_read(ios, n);
    atomic_fetch_add_explicit(&kx->block_reads, n, memory_order_relaxed);
    for (size_t i = 0; i < n; i++) {
        uint8_t *img = imgs + i * KALLAX_BLOCK;
        if (!keys[i] || klens[i] == 0 || klens[i] > KALLAX_MAX_KEY) {
            errs[i] = KV_INVALID_ARGUMENT;
            continue;
        }
        if (ios[i].res != KALLAX_BLOCK)
            memset(img, 0, KALLAX_BLOCK); /* failed or short: the check reads it again */
        errs[i] = kx_check_read(kx, ios[i].off / KALLAX_BLOCK, img);
    }
    free(ios);
    return KV_OK;
}

kv_err kallax_multiget(kallax *kx, size_t n, const void *const *keys, const size_t *klens,
                       lsm_rec *outs, kv_err *errs)
{
    if (n == 0)
        return KV_OK;
    uint8_t *imgs = malloc(n * KALLAX_BLOCK);
    if (!imgs)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = read_homes(kx, n, keys, klens, imgs, errs);
    for (size_t i = 0; rv == KV_OK && i < n; i++) {
        lsm_rec r;
        if (errs[i] == KV_OK)
            errs[i] = kx_lookup(kx, keys[i], klens[i], imgs + i * KALLAX_BLOCK, &r);
        if (errs[i] == KV_OK)
            outs[i] = r;
    }
    free(imgs);
    return rv;
}

/* ---- WAL ---- */

kv_err kallax_wal_append(kallax *kx, const lsm_rec *recs, size_t n)
{
    uint64_t max = 0, bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (recs[i].klen > KALLAX_MAX_KEY)
            return KV_INVALID_ARGUMENT;
        max = recs[i].seqno > max ? recs[i].seqno : max;
        bytes += recs[i].klen + recs[i].vlen;
    }
    kv_err rv = lsm_wal_write(kx->wal, recs, n);
    if (rv != KV_OK)
        return rv;
    atomic_fetch_add_explicit(&kx->user_bytes, bytes, memory_order_relaxed);
    uint64_t cur = atomic_load(&kx->last_seq);
    while (cur < max && !atomic_compare_exchange_weak(&kx->last_seq, &cur, max))
        ; /* CAS: last_seq only grows */
    return KV_OK;
}

kv_err kallax_wal_sync(kallax *kx)
{
    return lsm_wal_sync_all(kx->wal);
}

uint64_t kallax_last_seqno(kallax *kx)
{
    return atomic_load(&kx->last_seq);
}

uint64_t kallax_flush_generation(kallax *kx)
{
    return atomic_load(&kx->flush_gen);
}

/* ---- statistics ---- */

void kallax_estimate(kallax *kx, uint64_t *records, uint64_t *bytes)
{
    uint64_t pages, used, mem;
    kx_ext_counts(&kx->ext, &pages, &used, &mem);
    *records = atomic_load(&kx->records);
    *bytes = atomic_load(&kx->used_bytes) + used * KALLAX_BLOCK;
}

kv_err kallax_stats_get(kallax *kx, kallax_stats *out)
{
    kallax_stats s;
    memset(&s, 0, sizeof(s));
    s.blocks = kx->o.blocks;
    s.probe = kx->o.probe;
    s.records = atomic_load(&kx->records);
    s.tombstones = atomic_load(&kx->tombstones);
    s.used_bytes = atomic_load(&kx->used_bytes);
    s.spilled = atomic_load(&kx->spilled);
    kx_ext_counts(&kx->ext, &s.extent_pages, &s.extent_pages_used, &s.index_mem_bytes);
    s.extent_bytes = s.extent_pages_used * KALLAX_BLOCK;
    s.block_reads = atomic_load(&kx->block_reads);
    s.spill_reads = atomic_load(&kx->spill_reads);
    s.block_writes = atomic_load(&kx->block_writes);
    s.journal_bytes = atomic_load(&kx->journal_bytes);
    s.flushes = atomic_load(&kx->flushes);
    s.moves = atomic_load(&kx->moves);
    s.corrupt_blocks = atomic_load(&kx->corrupt);
    s.repaired = atomic_load(&kx->repaired);
    s.retries = atomic_load(&kx->retries);
    s.flushed_seqno = atomic_load(&kx->flushed_pub);
    s.last_seqno = atomic_load(&kx->last_seq);
    s.flush_generation = atomic_load(&kx->flush_gen);
    s.user_bytes = atomic_load(&kx->user_bytes);
    lsm_wal_counters(kx->wal, &s.wal_bytes, &s.wal_fsyncs, &s.wal_segments);
    s.load = (double)s.used_bytes / ((double)s.blocks * KX_PAYLOAD);
    lsm_vol_counters(&kx->vol, &s.vol);
    s.io_uring = kx->vol.uring;
    *out = s;
    return KV_OK;
}
