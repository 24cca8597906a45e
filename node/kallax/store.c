/* SPDX-License-Identifier: MIT */
/*
 * kallax store: opening (META, formatting a new block file, the journal's
 * recovery, the scan that verifies every block and rebuilds the extent map
 * and the counters, WAL replay), closing, and block reads with their retry
 * and repair path. Lookups and the iterator are in read.c, the flush and
 * extents in flush.c, the journal in journal.c; kallax.h has the design.
 *
 * Block images (the second half of this file): the 16-byte header (magic,
 * crc32c over the block number and the rest of the block, record count,
 * bytes used, spill hint) and the packed records after it (kallax.h has the
 * layout). Pure functions over a 4 KiB buffer: finding, removing and
 * appending records, checking and sealing an image, and summing it up for
 * the store's counters. Records are kept packed from the header on; the
 * bytes past `used` are zero, so equal contents give equal images (and
 * compress alike).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic.h"
#include "common/hash.h"
#include "common/log.h"
#include "node/kallax/kallax_int.h"

#define META_MAGIC 0x314d584bu /* "KXM1" */
#define META_SLOT 512u
#define META_LEN 48u
#define SCAN_BLOCKS 256u

void kallax_opts_default(kallax_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->probe = 16;
    o->inline_max = 2048;
    o->sync = LSM_SYNC_ALWAYS;
    o->sync_ms = 5;
    o->journal_blocks = 1024;
}

/* ---- META ---- */

static void meta_encode(const kallax *kx, uint64_t seq, uint64_t flushed, uint8_t *p)
{
    memset(p, 0, META_LEN);
    lsm_set32(p, META_MAGIC);
    lsm_set64(p + 8, seq);
    lsm_set64(p + 16, kx->o.blocks);
    lsm_set32(p + 24, kx->o.probe);
    lsm_set32(p + 28, kx->o.inline_max);
    lsm_set64(p + 32, flushed);
    lsm_set32(p + 4, kv_crc32c(0, p + 8, META_LEN - 8));
}

kv_err kx_meta_write(kallax *kx, uint64_t flushed)
{
    uint8_t p[META_LEN];
    uint64_t seq = kx->meta_seq + 1;
    meta_encode(kx, seq, flushed, p);
    kv_err rv = lsm_vol_write(&kx->vol, kx->meta_fd, p, META_LEN, (seq % 2) * META_SLOT, true);
    if (rv != KV_OK) {
        KV_ERROR(KX_LOG, "%s/META: write: %s", kx->vol.dir, kv_strerror(rv));
        return rv;
    }
    kx->meta_seq = seq;
    kx->flushed_seq = flushed;
    atomic_store(&kx->flushed_pub, flushed);
    return KV_OK;
}

/* Reads the newer valid META slot into kx (geometry checked against o). */
static kv_err meta_read(kallax *kx)
{
    uint8_t buf[2 * META_SLOT] = {0};
    ssize_t n = pread(kx->meta_fd, buf, sizeof(buf), 0);
    const uint8_t *best = NULL;
    for (int i = 0; i < 2 && n > 0; i++) {
        const uint8_t *p = buf + i * META_SLOT;
        if (lsm_get32(p) == META_MAGIC && lsm_get32(p + 4) == kv_crc32c(0, p + 8, META_LEN - 8) &&
            (!best || lsm_get64(p + 8) > lsm_get64(best + 8)))
            best = p;
    }
    if (!best) {
        KV_ERROR(KX_LOG, "%s/META: no valid slot (corrupt)", kx->vol.dir);
        return KV_DATA_LOSS;
    }
    uint64_t blocks = lsm_get64(best + 16);
    unsigned probe = lsm_get32(best + 24), inl = lsm_get32(best + 28);
    if ((kx->o.blocks && kx->o.blocks != blocks) || (kx->o.probe && kx->o.probe != probe) ||
        (kx->o.inline_max && kx->o.inline_max != inl)) {
        KV_ERROR(KX_LOG,
                 "%s: the store has %llu blocks, probe %u, inline_max %u; the options ask for "
                 "%llu blocks (--kallax-blocks), probe %u, inline_max %u",
                 kx->vol.dir, (unsigned long long)blocks, probe, inl,
                 (unsigned long long)kx->o.blocks, kx->o.probe, kx->o.inline_max);
        return KV_INVALID_ARGUMENT;
    }
    kx->o.blocks = blocks;
    kx->o.probe = probe;
    kx->o.inline_max = inl;
    kx->meta_seq = lsm_get64(best + 8);
    kx->flushed_seq = lsm_get64(best + 32);
    atomic_store(&kx->flushed_pub, kx->flushed_seq);
    return KV_OK;
}

static int open_file(kallax *kx, const char *name, int flags)
{
    int fd = lsm_vol_open(&kx->vol, name, flags);
    if (fd < 0)
        KV_ERROR(KX_LOG, "open %s/%s: %s", kx->vol.dir, name, strerror(-fd));
    return fd;
}

/* A new store: BLOCKS written as empty blocks, EXTENTS and JOURNAL empty,
 * META last (its presence says the store exists): written as META.new and
 * renamed, so a creation cut by a crash leaves no META and the next open
 * creates the store again instead of finding an empty META corrupt. */
static kv_err create_store(kallax *kx)
{
    uint8_t *chunk = malloc((size_t)SCAN_BLOCKS * KALLAX_BLOCK);
    if (!chunk)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = KV_OK;
    for (uint64_t b = 0; b < kx->nblocks && rv == KV_OK; b += SCAN_BLOCKS) {
        uint64_t n = kx->nblocks - b < SCAN_BLOCKS ? kx->nblocks - b : SCAN_BLOCKS;
        for (uint64_t i = 0; i < n; i++) {
            kx_block_init(chunk + i * KALLAX_BLOCK);
            kx_block_seal(chunk + i * KALLAX_BLOCK, b + i);
        }
        rv = lsm_vol_write(&kx->vol, kx->blocks_fd, chunk, (size_t)n * KALLAX_BLOCK,
                           b * KALLAX_BLOCK, false);
    }
    free(chunk);
    if (rv == KV_OK)
        rv = lsm_vol_fsync(&kx->vol, kx->blocks_fd);
    if (rv == KV_OK)
        rv = kx_meta_write(kx, 0); /* into META.new, synced */
    if (rv == KV_OK && renameat(kx->vol.dirfd, "META.new", kx->vol.dirfd, "META") < 0) {
        KV_ERROR(KX_LOG, "%s: rename META.new to META: %s", kx->vol.dir, strerror(errno));
        rv = lsm_errno(errno);
    }
    if (rv == KV_OK)
        rv = lsm_vol_syncdir(&kx->vol);
    if (rv != KV_OK)
        KV_ERROR(KX_LOG, "%s: cannot create the store: %s", kx->vol.dir, kv_strerror(rv));
    else
        KV_INFO(KX_LOG, "%s: created a store of %llu blocks (+%u probe blocks)", kx->vol.dir,
                (unsigned long long)kx->o.blocks, kx->o.probe);
    return rv;
}

static kv_err open_files(kallax *kx)
{
    kx->lock_fd = open_file(kx, "LOCK", O_RDWR | O_CREAT);
    if (kx->lock_fd < 0)
        return lsm_errno(-kx->lock_fd);
    if (flock(kx->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        KV_ERROR(KX_LOG, "%s/LOCK is held by another handle or process", kx->vol.dir);
        return errno == EWOULDBLOCK ? KV_FAILED_PRECONDITION : KV_INTERNAL;
    }
    kx->meta_fd = lsm_vol_open(&kx->vol, "META", O_RDWR);
    bool fresh = kx->meta_fd == -ENOENT;
    if (fresh && !kx->o.blocks) {
        KV_ERROR(KX_LOG, "%s: a new store needs its size (blocks, --kallax-blocks)", kx->vol.dir);
        return KV_INVALID_ARGUMENT;
    }
    if (fresh)
        kx->meta_fd = open_file(kx, "META.new", O_RDWR | O_CREAT | O_TRUNC);
    if (kx->meta_fd < 0)
        return lsm_errno(-kx->meta_fd);
    kv_err rv = fresh ? KV_OK : meta_read(kx);
    if (rv != KV_OK)
        return rv;
    kx->nblocks = kx->o.blocks + kx->o.probe;
    int flags = O_RDWR | (fresh ? O_CREAT | O_TRUNC : 0);
    if ((kx->blocks_fd = open_file(kx, "BLOCKS", flags)) < 0 ||
        (kx->ext_fd = open_file(kx, "EXTENTS", flags | O_CREAT)) < 0 ||
        (kx->journal_fd = open_file(kx, "JOURNAL", flags | O_CREAT)) < 0)
        return KV_INTERNAL;
    return fresh ? create_store(kx) : KV_OK;
}

/* ---- the open scan ---- */

/* Verifies a chunk of blocks and adds them to the counters and extents. */
static kv_err scan_chunk(kallax *kx, uint64_t b, uint64_t n, uint8_t *buf)
{
    for (uint64_t i = 0; i < n; i++) {
        uint8_t *img = buf + i * KALLAX_BLOCK;
        kv_err rv = kx_check_read(kx, b + i, img); /* repaired from the journal if there */
        if (rv == KV_DATA_LOSS) { /* logged and counted: its keys read as DATA_LOSS */
            atomic_store(&kx->max_version, UINT64_MAX); /* their versions are unknown */
            continue;
        }
        if (rv != KV_OK)
            return rv;
        kx_sum s;
        kx_block_sum(kx, img, b + i, &s);
        kx_count(kx, &s, 1);
        size_t off = KX_HDR;
        for (unsigned r = 0; r < kx_block_count(img); r++) {
            kx_slot sl;
            kx_block_next(img, &off, &sl);
            if (sl.seqno > atomic_load(&kx->last_seq))
                atomic_store(&kx->last_seq, sl.seqno);
            rv = sl.flags & KX_F_EXTENT ? kx_ext_mark(&kx->ext, sl.ext_page, kx_ext_pages(sl.vlen))
                                        : KV_OK;
            if (rv != KV_OK)
                return rv;
        }
    }
    return KV_OK;
}

static kv_err scan(kallax *kx)
{
    uint8_t *buf = malloc((size_t)SCAN_BLOCKS * KALLAX_BLOCK);
    if (!buf)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = KV_OK;
    for (uint64_t b = 0; b < kx->nblocks && rv == KV_OK; b += SCAN_BLOCKS) {
        uint64_t n = kx->nblocks - b < SCAN_BLOCKS ? kx->nblocks - b : SCAN_BLOCKS;
        rv =
            lsm_vol_pread(&kx->vol, kx->blocks_fd, buf, (size_t)n * KALLAX_BLOCK, b * KALLAX_BLOCK);
        if (rv == KV_DATA_LOSS)
            KV_ERROR(KX_LOG, "%s/BLOCKS is shorter than its %llu blocks", kx->vol.dir,
                     (unsigned long long)kx->nblocks);
        if (rv == KV_OK)
            rv = scan_chunk(kx, b, n, buf);
    }
    free(buf);
    return rv;
}

void kx_count(kallax *kx, const kx_sum *s, int sign)
{
    uint64_t m = sign > 0 ? 1 : (uint64_t)-1;
    atomic_fetch_add(&kx->records, s->records * m);
    atomic_fetch_add(&kx->tombstones, s->tombstones * m);
    atomic_fetch_add(&kx->used_bytes, s->used * m);
    atomic_fetch_add(&kx->spilled, s->spilled * m);
    if (sign > 0) /* raised only: a block counted out keeps it */
        kv_atomic_max(&kx->max_version, s->max_version);
}

/* ---- open / close ---- */

typedef struct replay_arg {
    kallax *kx;
    lsm_replay_fn fn;
    void *arg;
} replay_arg;

static kv_err check_opts(const kallax_opts *o)
{
    const char *bad = !o->dir                       ? "dir"
                      : o->blocks > (1ull << 40)    ? "blocks (--kallax-blocks)"
                      : o->probe > KALLAX_MAX_PROBE ? "probe (0..64)"
                      : o->inline_max && (o->inline_max < 64 || o->inline_max > KX_PAYLOAD)
                          ? "inline_max (64..4080)"
                      : !o->journal_blocks ? "journal_blocks"
                                           : NULL;
    if (bad)
        KV_ERROR(KX_LOG, "bad option: %s", bad);
    return bad ? KV_INVALID_ARGUMENT : KV_OK;
}

static kv_err open_wal(kallax *kx, lsm_replay_fn fn, void *arg)
{
    lsm_wal_seg *segs = NULL;
    size_t nsegs = 0;
    uint64_t max_seq = 0, max_number = 0;
    lsm_opts lo;
    lsm_opts_default(&lo);
    lo.sync = kx->o.sync;
    lo.sync_ms = kx->o.sync_ms;
    lo.wal_recovery = kx->o.wal_recovery;
    kv_err rv = lsm_wal_recover(&kx->vol, &lo, kx->flushed_seq, fn, arg, &segs, &nsegs, &max_seq,
                                &max_number);
    if (rv != KV_OK)
        return rv;
    if (max_seq > atomic_load(&kx->last_seq))
        atomic_store(&kx->last_seq, max_seq);
    if (kx->flushed_seq > atomic_load(&kx->last_seq))
        atomic_store(&kx->last_seq, kx->flushed_seq);
    kx->wal_number = max_number + 2;
    rv = lsm_wal_open(&kx->wal, &kx->vol, &lo, max_number + 1, segs, nsegs);
    if (rv != KV_OK)
        free(segs);
    return rv;
}

static kallax *kx_new(const kallax_opts *o)
{
    kallax *kx = calloc(1, sizeof(*kx));
    if (!kx)
        return NULL;
    kx->o = *o;
    kx->o.sync_ms = o->sync_ms ? o->sync_ms : 5;
    kx->blocks_fd = kx->ext_fd = kx->journal_fd = kx->meta_fd = kx->lock_fd = -1;
    pthread_mutex_init(&kx->flush_mu, NULL);
    pthread_mutex_init(&kx->jmu, NULL);
    pthread_rwlock_init(&kx->move_lock, NULL);
    for (unsigned i = 0; i < KX_STRIPES; i++)
        pthread_rwlock_init(&kx->stripes[i], NULL);
    return kx;
}

kv_err kallax_open(kallax **out, const kallax_opts *o, lsm_replay_fn fn, void *arg)
{
    kv_err rv = check_opts(o);
    kallax *kx = rv == KV_OK ? kx_new(o) : NULL;
    if (rv != KV_OK || !kx)
        return rv != KV_OK ? rv : KV_RESOURCE_EXHAUSTED;
    uint64_t applied = 0;
    rv = lsm_vol_init(&kx->vol, o->dir, LSM_TIER_FD, !o->disable_io_uring);
    if (rv == KV_OK)
        rv = open_files(kx);
    if (rv == KV_OK)
        rv = kx_ext_init(&kx->ext, 0);
    if (rv == KV_OK)
        rv = kx_journal_recover(kx, &applied);
    if (rv == KV_OK)
        rv = scan(kx);
    if (rv == KV_OK)
        rv = open_wal(kx, fn, arg);
    if (rv != KV_OK) {
        kallax_close(kx);
        return rv;
    }
    KV_INFO(KX_LOG,
            "%s: %llu records in %llu blocks (%llu spilled, %llu corrupt), %llu journal "
            "images applied, flushed seqno %llu",
            o->dir, (unsigned long long)atomic_load(&kx->records), (unsigned long long)kx->o.blocks,
            (unsigned long long)atomic_load(&kx->spilled),
            (unsigned long long)atomic_load(&kx->corrupt), (unsigned long long)applied,
            (unsigned long long)kx->flushed_seq);
    *out = kx;
    return KV_OK;
}

void kallax_close(kallax *kx)
{
    if (!kx)
        return;
    lsm_wal_close(kx->wal);
    int fds[] = {kx->blocks_fd, kx->ext_fd, kx->journal_fd, kx->meta_fd, kx->lock_fd};
    for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (kx->ext.bits)
        kx_ext_fini(&kx->ext);
    lsm_vol_fini(&kx->vol);
    free(kx->jblocks);
    pthread_mutex_destroy(&kx->flush_mu);
    pthread_mutex_destroy(&kx->jmu);
    pthread_rwlock_destroy(&kx->move_lock);
    for (unsigned i = 0; i < KX_STRIPES; i++)
        pthread_rwlock_destroy(&kx->stripes[i]);
    free(kx);
}

/* ---- block I/O ---- */

static _Thread_local bool tl_in_flush;
/* Set while this thread holds move_lock shared: a repair (which takes
 * flush_mu, held by a flush that may wait for move_lock) is left to the
 * caller once it released the lock (kx_repair_deferred). */
static _Thread_local bool tl_defer;
static _Thread_local uint64_t tl_defer_blk;

void kx_move_read_lock(kallax *kx)
{
    pthread_rwlock_rdlock(&kx->move_lock);
    tl_defer = true;
}

void kx_move_read_unlock(kallax *kx)
{
    tl_defer = false;
    pthread_rwlock_unlock(&kx->move_lock);
}

kv_err kx_repair_deferred(kallax *kx)
{
    uint8_t *img = malloc(KALLAX_BLOCK);
    kv_err rv = img ? kx_read_block(kx, tl_defer_blk, img) : KV_RESOURCE_EXHAUSTED;
    free(img);
    return rv;
}

void kx_flush_lock(kallax *kx)
{
    pthread_mutex_lock(&kx->flush_mu);
    tl_in_flush = true;
}

void kx_flush_unlock(kallax *kx)
{
    tl_in_flush = false;
    pthread_mutex_unlock(&kx->flush_mu);
}

kv_err kx_write_block(kallax *kx, uint64_t blk, const uint8_t *img)
{
    pthread_rwlock_t *s = &kx->stripes[blk % KX_STRIPES];
    pthread_rwlock_wrlock(s);
    kv_err rv =
        lsm_vol_write(&kx->vol, kx->blocks_fd, img, KALLAX_BLOCK, blk * KALLAX_BLOCK, false);
    pthread_rwlock_unlock(s);
    atomic_fetch_add_explicit(&kx->block_writes, 1, memory_order_relaxed);
    if (rv != KV_OK)
        KV_ERROR(KX_LOG, "%s/BLOCKS: write of block %llu: %s", kx->vol.dir, (unsigned long long)blk,
                 kv_strerror(rv));
    return rv;
}

/* The block failed its check twice: the last journal round may hold it. */
static kv_err repair(kallax *kx, uint64_t blk, uint8_t *img)
{
    kv_err rv = kx_journal_lookup(kx, blk, img);
    if (rv == KV_OK && (rv = kx_write_block(kx, blk, img)) == KV_OK &&
        (rv = lsm_vol_fsync(&kx->vol, kx->blocks_fd)) == KV_OK) {
        KV_WARN(KX_LOG, "%s/BLOCKS: block %llu was corrupt; rewritten from the journal",
                kx->vol.dir, (unsigned long long)blk);
        atomic_fetch_add(&kx->repaired, 1);
        return KV_OK;
    }
    KV_ERROR(KX_LOG,
             "%s/BLOCKS: block %llu is corrupt (checksum) and no journal holds it: "
             "DATA_LOSS for its records",
             kx->vol.dir, (unsigned long long)blk);
    atomic_fetch_add(&kx->corrupt, 1);
    return KV_DATA_LOSS;
}

kv_err kx_check_read(kallax *kx, uint64_t blk, uint8_t *img)
{
    if (kx_block_check(img, blk) == KV_OK)
        return KV_OK;
    atomic_fetch_add_explicit(&kx->retries, 1, memory_order_relaxed);
    pthread_rwlock_t *s = &kx->stripes[blk % KX_STRIPES];
    pthread_rwlock_rdlock(s); /* no write of this block runs now */
    kv_err rv = lsm_vol_pread(&kx->vol, kx->blocks_fd, img, KALLAX_BLOCK, blk * KALLAX_BLOCK);
    pthread_rwlock_unlock(s);
    if (rv == KV_OK && kx_block_check(img, blk) == KV_OK)
        return KV_OK;
    if (rv != KV_OK && rv != KV_DATA_LOSS)
        return rv;
    if (tl_defer) {
        tl_defer_blk = blk;
        return KV_UNAVAILABLE;
    }
    bool mine = !tl_in_flush;
    if (mine)
        kx_flush_lock(kx); /* no journal round or flush meanwhile */
    rv = repair(kx, blk, img);
    if (mine)
        kx_flush_unlock(kx);
    return rv;
}

kv_err kx_read_block(kallax *kx, uint64_t blk, uint8_t *img)
{
    atomic_fetch_add_explicit(&kx->block_reads, 1, memory_order_relaxed);
    kv_err rv = lsm_vol_pread(&kx->vol, kx->blocks_fd, img, KALLAX_BLOCK, blk * KALLAX_BLOCK);
    if (rv != KV_OK && rv != KV_DATA_LOSS) {
        KV_ERROR(KX_LOG, "%s/BLOCKS: read of block %llu: %s", kx->vol.dir, (unsigned long long)blk,
                 kv_strerror(rv));
        return rv;
    }
    if (rv == KV_DATA_LOSS)
        memset(img, 0, KALLAX_BLOCK); /* short read: fails the check */
    return kx_check_read(kx, blk, img);
}

kv_err kx_ext_read(kallax *kx, const kx_slot *s, lsm_rec *out)
{
    uint8_t *v = malloc(s->vlen ? s->vlen : 1);
    if (!v)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv =
        lsm_vol_pread(&kx->vol, kx->ext_fd, v, s->vlen, s->ext_page * (uint64_t)KALLAX_BLOCK);
    if (rv == KV_OK && kv_crc32c(0, v, s->vlen) != s->ext_crc)
        rv = KV_DATA_LOSS;
    if (rv != KV_OK) {
        free(v);
        return rv;
    }
    out->value = v;
    return KV_OK;
}

/* ==== block images ==== */

/*
 * kallax block images: the 16-byte header (magic, crc32c over the block
 * number and the rest of the block, record count, bytes used, spill hint)
 * and the packed records after it (kallax.h has the layout). Pure functions
 * over a 4 KiB buffer: finding, removing and appending records, checking and
 * sealing an image, and summing it up for the store's counters. Records are
 * kept packed from the header on; the bytes past `used` are zero, so equal
 * contents give equal images (and compress alike).
 */

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
    return kv_crc32c(kv_crc32c(0, b, 8), img + 8, KALLAX_BLOCK - 8);
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
        out->max_version = s.version > out->max_version ? s.version : out->max_version;
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
