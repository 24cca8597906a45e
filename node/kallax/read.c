/* SPDX-License-Identifier: MIT */
/*
 * kallax reads and the small calls around them: point lookups (the home
 * block read without a lock; the spill blocks, when the home block's hint
 * says records of that home spilled, under move_lock with the home block
 * read again, so that no record moved by a concurrent flush is missed),
 * batched lookups whose home-block reads go to the volume together, the WAL
 * append and sync, counters, statistics and the size estimate.
 *
 * The iterator (the second half of this file) returns every stored record
 * in (home block, key) order. It reads the block file in chunks of CHUNK
 * home blocks (plus the probe window after them, where their spilled
 * records may live) with one read, under move_lock shared, so that no flush
 * moves a record between blocks while the chunk is read (why that is
 * enough: kallax.h). The records whose home lies in the chunk are copied
 * out (values of extents read), sorted by home and key, and returned one by
 * one; a key found twice keeps its highest seqno.
 */
#include <stdlib.h>
#include <string.h>

#include "common/atomic.h"
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
    kx_move_read_lock(kx);
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
    kx_move_read_unlock(kx);
    if (rv == KV_UNAVAILABLE && (rv = kx_repair_deferred(kx)) == KV_OK)
        rv = KV_ABORTED; /* repaired: look again */
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
    kv_atomic_max(&kx->last_seq, max);
    return KV_OK;
}

kv_err kallax_wal_sync(kallax *kx)
{
    return lsm_wal_sync_all(kx->wal);
}

uint64_t kallax_wal_live_bytes(kallax *kx)
{
    return lsm_wal_live(kx->wal);
}

uint64_t kallax_last_seqno(kallax *kx)
{
    return atomic_load(&kx->last_seq);
}

uint64_t kallax_max_version(kallax *kx)
{
    return atomic_load(&kx->max_version);
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
    s.wal_live_bytes = lsm_wal_live(kx->wal);
    s.load = (double)s.used_bytes / ((double)s.blocks * KX_PAYLOAD);
    lsm_vol_counters(&kx->vol, &s.vol);
    s.io_uring = kx->vol.uring;
    *out = s;
    return KV_OK;
}

/* ==== the iterator ==== */

/*
 * kallax iterator: every stored record in (home block, key) order. It reads
 * the block file in chunks of CHUNK home blocks (plus the probe window after
 * them, where their spilled records may live) with one read, under
 * move_lock shared, so that no flush moves a record between blocks while the
 * chunk is read (why that is enough: kallax.h). The records whose home lies
 * in the chunk are copied out (values of extents read), sorted by home and
 * key, and returned one by one; a key found twice (never, but for a move
 * racing a chunk read without the lock) keeps its highest seqno.
 */

#define CHUNK 64u

typedef struct irec {
    lsm_rec r;
    uint64_t home;
    bool refetch; /* its extent failed its crc: look it up again */
} irec;

struct kallax_iter {
    kallax *kx;
    uint64_t next_home; /* first home block of the next chunk */
    irec *recs;
    size_t n, cap, i;
    uint8_t *buf; /* (CHUNK + probe) blocks */
    kv_err err;   /* sticky */
    bool positioned;
};

kv_err kallax_iter_open(kallax *kx, kallax_iter **out)
{
    kallax_iter *it = calloc(1, sizeof(*it));
    if (it)
        it->buf = malloc((size_t)(CHUNK + kx->o.probe) * KALLAX_BLOCK);
    if (!it || !it->buf) {
        free(it);
        return KV_RESOURCE_EXHAUSTED;
    }
    it->kx = kx;
    *out = it;
    return KV_OK;
}

static void drop_recs(kallax_iter *it)
{
    for (size_t i = 0; i < it->n; i++)
        lsm_rec_free(&it->recs[i].r);
    it->n = it->i = 0;
}

void kallax_iter_close(kallax_iter *it)
{
    if (!it)
        return;
    drop_recs(it);
    free(it->recs);
    free(it->buf);
    free(it);
}

const lsm_rec *kallax_iter_rec(const kallax_iter *it)
{
    return it->err == KV_OK && it->positioned && it->i < it->n ? &it->recs[it->i].r : NULL;
}

static int irec_cmp(const void *a, const void *b)
{
    const irec *x = a, *y = b;
    if (x->home != y->home)
        return x->home < y->home ? -1 : 1;
    int c = lsm_key_cmp(x->r.key, x->r.klen, y->r.key, y->r.klen);
    if (c)
        return c;
    return x->r.seqno > y->r.seqno ? -1 : x->r.seqno < y->r.seqno;
}

/* Copies slot s (home h) into the chunk's records; an extent that fails its
 * crc (replaced meanwhile, or corrupt) is left for refetch(). */
static kv_err take(kallax_iter *it, const kx_slot *s, uint64_t h)
{
    if (it->n == it->cap) {
        size_t cap = it->cap ? it->cap * 2 : 256;
        irec *r = realloc(it->recs, cap * sizeof(*r));
        if (!r)
            return KV_RESOURCE_EXHAUSTED;
        it->recs = r;
        it->cap = cap;
    }
    irec *x = &it->recs[it->n];
    kv_err rv = kx_slot_copy(s, &x->r);
    x->refetch = false;
    if (rv == KV_OK && (s->flags & KX_F_EXTENT) && kx_ext_read(it->kx, s, &x->r) != KV_OK)
        x->refetch = true;
    if (rv == KV_OK) {
        x->home = h;
        it->n++;
    }
    return rv;
}

/* Looks the records up again whose extent failed (outside move_lock). */
static kv_err refetch(kallax_iter *it)
{
    kv_err rv = KV_OK;
    size_t m = 0;
    for (size_t i = 0; i < it->n; i++) {
        irec *x = &it->recs[i];
        if (rv == KV_OK && x->refetch) {
            lsm_rec fresh;
            rv = kx_lookup(it->kx, x->r.key, x->r.klen, NULL, &fresh);
            lsm_rec_free(&x->r);
            if (rv == KV_NOT_FOUND) { /* removed meanwhile */
                rv = KV_OK;
                continue;
            }
            if (rv != KV_OK)
                continue;
            x->r = fresh;
        } else if (rv != KV_OK) {
            lsm_rec_free(&x->r);
            continue;
        }
        it->recs[m++] = *x;
    }
    it->n = m;
    return rv;
}

/* Reads the blocks of homes [h0, hend) and their probe window under
 * move_lock and copies out the records of those homes. */
static kv_err read_chunk(kallax_iter *it, uint64_t h0, uint64_t hend)
{
    kallax *kx = it->kx;
    uint64_t nb = hend - h0 + kx->o.probe;
    drop_recs(it);
    kx_move_read_lock(kx);
    kv_err rv = lsm_vol_pread(&kx->vol, kx->blocks_fd, it->buf, (size_t)nb * KALLAX_BLOCK,
                              h0 * KALLAX_BLOCK);
    if (rv == KV_DATA_LOSS)
        memset(it->buf, 0, (size_t)nb * KALLAX_BLOCK); /* short: every block read again */
    rv = rv == KV_DATA_LOSS ? KV_OK : rv;
    atomic_fetch_add_explicit(&kx->block_reads, nb, memory_order_relaxed);
    for (uint64_t b = 0; rv == KV_OK && b < nb; b++) {
        uint8_t *img = it->buf + b * KALLAX_BLOCK;
        rv = kx_check_read(kx, h0 + b, img);
        size_t off = KX_HDR;
        for (unsigned r = 0; rv == KV_OK && r < kx_block_count(img); r++) {
            kx_slot s;
            kx_block_next(img, &off, &s);
            uint64_t h = kallax_home(kx, s.key, s.klen);
            if (h >= h0 && h < hend)
                rv = take(it, &s, h);
        }
    }
    kx_move_read_unlock(kx);
    return rv;
}

/* Reads the chunk of homes [h0, h0 + CHUNK) and keeps their records, sorted,
 * one per key. */
static kv_err load_chunk(kallax_iter *it, uint64_t h0)
{
    kallax *kx = it->kx;
    uint64_t hend = h0 + CHUNK < kx->o.blocks ? h0 + CHUNK : kx->o.blocks;
    kv_err rv = KV_UNAVAILABLE;
    for (int tries = 0; rv == KV_UNAVAILABLE && tries < 3; tries++)
        if ((rv = read_chunk(it, h0, hend)) == KV_UNAVAILABLE &&
            (rv = kx_repair_deferred(kx)) == KV_OK)
            rv = KV_UNAVAILABLE; /* repaired: read the chunk again */
    rv = rv == KV_UNAVAILABLE ? KV_DATA_LOSS : rv;
    if (rv == KV_OK)
        rv = refetch(it);
    it->next_home = hend;
    if (rv == KV_OK && it->n)
        qsort(it->recs, it->n, sizeof(*it->recs), irec_cmp);
    size_t m = 0;
    for (size_t i = 0; rv == KV_OK && i < it->n; i++) {
        if (m && it->recs[m - 1].home == it->recs[i].home &&
            lsm_key_cmp(it->recs[m - 1].r.key, it->recs[m - 1].r.klen, it->recs[i].r.key,
                        it->recs[i].r.klen) == 0)
            lsm_rec_free(&it->recs[i].r); /* an older copy of the same key */
        else
            it->recs[m++] = it->recs[i];
    }
    it->n = rv == KV_OK ? m : it->n;
    return rv;
}

/* Loads chunks from `from` on until one has a record at index >= i. */
static kv_err fill(kallax_iter *it)
{
    kv_err rv = KV_OK;
    while (rv == KV_OK && it->i >= it->n && it->next_home < it->kx->o.blocks)
        rv = load_chunk(it, it->next_home);
    return rv;
}

kv_err kallax_iter_seek(kallax_iter *it, const void *after, size_t after_len)
{
    if (it->err != KV_OK)
        return it->err;
    kallax *kx = it->kx;
    uint64_t h = after ? kallax_home(kx, after, after_len) : 0;
    kv_err rv = load_chunk(it, h - h % CHUNK);
    while (rv == KV_OK && after && it->i < it->n &&
           kallax_key_cmp(kx, it->recs[it->i].r.key, it->recs[it->i].r.klen, after, after_len) <= 0)
        it->i++;
    if (rv == KV_OK)
        rv = fill(it);
    it->positioned = true;
    it->err = rv;
    return rv;
}

kv_err kallax_iter_next(kallax_iter *it)
{
    if (it->err != KV_OK)
        return it->err;
    if (it->i < it->n)
        it->i++;
    it->err = fill(it);
    return it->err;
}
