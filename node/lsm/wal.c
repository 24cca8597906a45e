/* SPDX-License-Identifier: MIT */
/*
 * Write-ahead log on the fast volume. A segment file <number>.wal is a
 * sequence of frames [u32 crc32c(len || payload)][u32 len][payload], one per
 * lsm_wal_append call, the payload being the call's encoded records; a frame
 * is the unit of atomicity. len's top bit (FRAME_COMPACT) says the payload's
 * records use the compact codec (codec.c, as SST format 3); frames without
 * it, written before, hold fixed 34-byte record headers and replay as
 * before, so a log written by either version, or by both, is read.
 *
 * Group commit (leader/follower, as in LevelDB's writer queue): a caller
 * encodes its frame outside the lock, appends it to the pending buffer and
 * waits; whoever finds no write in flight becomes the leader, takes the
 * whole pending buffer and writes it with one write (linked to an fdatasync
 * in sync mode "always"), then completes every waiter of that group. Sync
 * mode "batch" acknowledges after the write and a WAL thread fsyncs at most
 * every sync_ms while bytes are unsynced; "none" never fsyncs. A failed
 * write (e.g. ENOSPC) truncates the segment back to its last good offset and
 * fails the whole group, so nothing unacknowledged can be replayed.
 *
 * The `writing` flag serialises the group writes and the operations that
 * replace or sync the segment fd (rotation, sync_all, which also set
 * `exclusive`); the batch fsync (`syncing`) runs beside group writes, so
 * writers never wait for it: fsync covers what was written before it
 * began, and a group written meanwhile sets `dirty` again for the next
 * round. Rotation and sync_all wait for both. The mutex is never held
 * across I/O.
 *
 * Recovery replays segments in number order up to the first bad frame (a
 * checksum that fails, or records that do not decode). When no valid frame
 * follows it anywhere in the log it is a torn tail, a write cut by a crash
 * and never acknowledged: the segment is truncated there (logged). Anything
 * else is corruption of acknowledged writes (a flipped byte, a lost block),
 * and recovery stops with DATA_LOSS naming the file and the offset, unless
 * the options ask for point-in-time recovery: then the segment is truncated
 * there and later segments are deleted, both logged (etcd's and RocksDB's
 * modes). A read error is never taken for a bad frame.
 */
#include <sys/prctl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/assert.h"
#include "common/log.h"
#include "node/lsm/lsm_int.h"

#define MAX_FRAME (1u << 30)
#define FRAME_COMPACT 0x80000000u /* in len: compact records */
#define MIN_RECC 4u               /* head, klen, seqno and a 1-byte key */
#define READ_CHUNK (1u << 20)

typedef struct waiter {
    kv_err rv;
    bool done;
    struct waiter *next;
} waiter;

struct lsm_wal {
    lsm_vol *v;
    lsm_sync mode;
    unsigned sync_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv, sync_cv;
    bool writing, dirty, stop;
    bool syncing;         /* the batch syncer's fsync is running */
    bool exclusive;       /* rotation or sync_all owns the fd (with writing) */
    bool sealed_unsynced; /* a sealed segment may hold unsynced bytes (sync none, recovered) */
    int fd;
    uint64_t number, off, seg_max;
    lsm_wal_seg *sealed;
    size_t nsealed, capsealed;
    lsm_buf pending, spare;
    uint64_t pending_max;
    waiter *waiters;
    pthread_t syncer;
    bool has_syncer;
    _Atomic uint64_t bytes, fsyncs;
    /* bytes of the live segments, sealed and current: what the WAL holds on
     * its volume (the engine flushes and holds writers by it) */
    _Atomic uint64_t live;
    uint64_t written_max; /* highest seqno written to any segment */
    /* Set when acknowledged records may not be durable (an fsync failed
     * after the write was acknowledged) or a failed write could not be cut
     * off: appends fail with it until a flush covers broken_seq. */
    kv_err broken;
    uint64_t broken_seq;
};

static void seg_name(char *buf, size_t cap, uint64_t number)
{
    snprintf(buf, cap, "%06" PRIu64 ".wal", number);
}

/* ---- append path ---- */

static kv_err encode_frame(lsm_buf *b, const lsm_rec *recs, size_t n, uint64_t *max_seq)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!lsm_rec_valid(&recs[i]))
            return KV_INVALID_ARGUMENT;
        total += lsm_recc_size(&recs[i]);
    }
    if (total > MAX_FRAME)
        return KV_INVALID_ARGUMENT;
    kv_err rv = lsm_buf_reserve(b, LSM_FRAME_HDR + total);
    if (rv != KV_OK)
        return rv;
    uint8_t *h = b->p, *p = h + LSM_FRAME_HDR;
    *max_seq = 0;
    for (size_t i = 0; i < n; i++) {
        p += lsm_recc_encode(p, &recs[i]);
        *max_seq = recs[i].seqno > *max_seq ? recs[i].seqno : *max_seq;
    }
    lsm_set32(h + 4, (uint32_t)total | FRAME_COMPACT);
    lsm_set32(h, kv_crc32c(0, h + 4, total + 4));
    b->len = LSM_FRAME_HDR + total;
    return KV_OK;
}

/* mu held: refuses appends until lsm_wal_release(>= upto), logged once. A
 * WAL whose page cache lost writes (fsync failed) or that holds a torn
 * frame before its end cannot take more records; a flush, which persists
 * the memory tier's records in an SST, makes it whole again. */
static void wal_break(lsm_wal *w, kv_err rv, uint64_t upto, const char *what)
{
    KV_ASSERT_LOCKED(&w->mu);
    if (w->broken == KV_OK)
        KV_ERROR(LSM_LOG,
                 "WAL %s/%06" PRIu64 ".wal: %s (%s): refusing writes until a flush covers "
                 "seqno %" PRIu64,
                 w->v->dir, w->number, what, kv_strerror(rv), upto);
    w->broken = w->broken != KV_OK ? w->broken : rv;
    w->broken_seq = upto > w->broken_seq ? upto : w->broken_seq;
}

/* Called with mu held and !writing: writes the pending group. */
static void lead(lsm_wal *w)
{
    KV_ASSERT_LOCKED(&w->mu);
    KV_ASSERT(!w->writing, "a second writer on WAL %06" PRIu64, w->number);
    w->writing = true;
    lsm_buf buf = w->pending;
    w->pending = w->spare;
    w->pending.len = 0;
    waiter *group = w->waiters;
    w->waiters = NULL;
    uint64_t max = w->pending_max, off = w->off;
    w->pending_max = 0;
    int fd = w->fd;
    pthread_mutex_unlock(&w->mu);

    kv_err rv = lsm_vol_write(w->v, fd, buf.p, buf.len, off, w->mode == LSM_SYNC_ALWAYS);
    kv_err cut = KV_OK;
    if (rv != KV_OK) {
        KV_ERROR(LSM_LOG, "WAL %s/%06" PRIu64 ".wal write of %zu bytes failed: %s", w->v->dir,
                 w->number, buf.len, kv_strerror(rv));
        cut = lsm_vol_truncate(w->v, fd, off);
    }

    pthread_mutex_lock(&w->mu);
    if (cut != KV_OK)
        wal_break(w, cut, max > w->written_max ? max : w->written_max,
                  "cannot truncate a failed write");
    if (rv == KV_OK) {
        w->off += buf.len;
        w->seg_max = max > w->seg_max ? max : w->seg_max;
        w->written_max = max > w->written_max ? max : w->written_max;
        w->dirty = w->mode == LSM_SYNC_BATCH;
        atomic_fetch_add(&w->bytes, buf.len);
        atomic_fetch_add(&w->live, buf.len);
        if (w->mode == LSM_SYNC_ALWAYS)
            atomic_fetch_add(&w->fsyncs, 1);
    }
    for (waiter *x = group; x; x = x->next) {
        x->rv = rv;
        x->done = true;
    }
    w->spare = buf;
    w->writing = false;
    pthread_cond_broadcast(&w->cv);
}

kv_err lsm_wal_write(lsm_wal *w, const lsm_rec *recs, size_t n)
{
    if (n == 0 || !recs)
        return KV_INVALID_ARGUMENT;
    lsm_buf frame = {0};
    uint64_t max;
    kv_err rv = encode_frame(&frame, recs, n, &max);
    if (rv != KV_OK) {
        lsm_buf_free(&frame);
        return rv;
    }
    waiter me = {.rv = KV_OK};
    pthread_mutex_lock(&w->mu);
    rv = w->broken != KV_OK ? w->broken : lsm_buf_put(&w->pending, frame.p, frame.len);
    if (rv == KV_OK) {
        me.next = w->waiters;
        w->waiters = &me;
        w->pending_max = max > w->pending_max ? max : w->pending_max;
        while (!me.done) {
            if (!w->writing)
                lead(w);
            else
                pthread_cond_wait(&w->cv, &w->mu);
        }
        rv = me.rv;
    }
    pthread_mutex_unlock(&w->mu);
    lsm_buf_free(&frame);
    return rv;
}

/* ---- batch-mode syncer ---- */

static void *syncer_main(void *arg)
{
    lsm_wal *w = arg;
    prctl(PR_SET_NAME, "lsm:walsync"); /* shown by top -H, perf, gdb */
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)w->sync_ms * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&w->sync_cv, &w->mu, &ts);
        if (!w->dirty || w->exclusive || w->stop)
            continue;
        w->syncing = true; /* group writes go on; rotation waits */
        w->dirty = false;
        int fd = w->fd;
        pthread_mutex_unlock(&w->mu);
        kv_err rv = lsm_vol_fsync(w->v, fd);
        atomic_fetch_add(&w->fsyncs, 1);
        pthread_mutex_lock(&w->mu);
        if (rv != KV_OK) /* acknowledged records may be lost */
            wal_break(w, rv, w->written_max, "fsync failed");
        w->syncing = false;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- segments ---- */

static kv_err seg_create(lsm_wal *w, uint64_t number, int *fd)
{
    char name[64];
    seg_name(name, sizeof(name), number);
    int f = lsm_vol_open(w->v, name, O_WRONLY | O_CREAT | O_TRUNC);
    if (f < 0) {
        KV_ERROR(LSM_LOG, "create WAL %s/%s: %s", w->v->dir, name, strerror(-f));
        return lsm_errno(f);
    }
    kv_err rv = lsm_vol_syncdir(w->v);
    if (rv != KV_OK) {
        close(f);
        lsm_vol_unlink(w->v, name);
        return rv;
    }
    *fd = f;
    return KV_OK;
}

kv_err lsm_wal_open(lsm_wal **out, lsm_vol *v, const lsm_opts *o, uint64_t number,
                    lsm_wal_seg *segs, size_t nsegs)
{
    lsm_wal *w = calloc(1, sizeof(*w));
    if (!w)
        return KV_RESOURCE_EXHAUSTED;
    w->v = v;
    w->mode = o->sync;
    w->sync_ms = o->sync_ms ? o->sync_ms : 5;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_cond_init(&w->sync_cv, NULL);
    kv_err rv = seg_create(w, number, &w->fd);
    if (rv == KV_OK && w->mode == LSM_SYNC_BATCH) {
        w->has_syncer = pthread_create(&w->syncer, NULL, syncer_main, w) == 0;
        rv = w->has_syncer ? KV_OK : KV_INTERNAL;
    }
    if (rv != KV_OK) {
        if (w->fd > 0)
            close(w->fd);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        pthread_cond_destroy(&w->sync_cv);
        free(w);
        return rv;
    }
    w->number = number;
    w->sealed = segs;
    w->nsealed = w->capsealed = nsegs;
    for (size_t i = 0; i < nsegs; i++)
        atomic_fetch_add(&w->live, segs[i].bytes);
    w->sealed_unsynced = nsegs > 0; /* replayed: maybe written by a process that never synced */
    *out = w;
    return KV_OK;
}

static kv_err seal_push(lsm_wal *w, uint64_t number, uint64_t max, uint64_t bytes)
{
    if (w->nsealed == w->capsealed) {
        size_t cap = w->capsealed ? w->capsealed * 2 : 8;
        lsm_wal_seg *s = realloc(w->sealed, cap * sizeof(*s));
        if (!s)
            return KV_RESOURCE_EXHAUSTED;
        w->sealed = s;
        w->capsealed = cap;
    }
    w->sealed[w->nsealed++] = (lsm_wal_seg){number, max, bytes};
    return KV_OK;
}

kv_err lsm_wal_rotate(lsm_wal *w, uint64_t number)
{
    pthread_mutex_lock(&w->mu);
    while (w->writing || w->syncing)
        pthread_cond_wait(&w->cv, &w->mu);
    w->writing = w->exclusive = true;
    int old = w->fd;
    pthread_mutex_unlock(&w->mu);

    kv_err synced = w->mode == LSM_SYNC_NONE ? KV_OK : lsm_vol_fsync(w->v, old), rv = synced;
    int fd = -1;
    if (rv == KV_OK)
        rv = seg_create(w, number, &fd);

    pthread_mutex_lock(&w->mu);
    if (synced != KV_OK && w->mode == LSM_SYNC_BATCH) /* always: every group was synced */
        wal_break(w, synced, w->written_max, "fsync of the segment being sealed failed");
    if (rv == KV_OK)
        rv = seal_push(w, w->number, w->seg_max, w->off);
    if (rv == KV_OK) {
        w->fd = fd;
        w->number = number;
        w->off = 0;
        w->seg_max = 0;
        w->dirty = false;
        w->sealed_unsynced |= w->mode == LSM_SYNC_NONE;
    } else if (fd >= 0) {
        close(fd);
    }
    w->writing = w->exclusive = false;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (rv == KV_OK)
        close(old);
    return rv;
}

/* fsyncs the sealed segments named in nums (a segment deleted meanwhile was
 * flushed: nothing to do). */
static kv_err sync_sealed(lsm_wal *w, const uint64_t *nums, size_t n)
{
    kv_err rv = KV_OK;
    for (size_t i = 0; i < n && rv == KV_OK; i++) {
        char name[64];
        seg_name(name, sizeof(name), nums[i]);
        int fd = lsm_vol_open(w->v, name, O_RDONLY);
        if (fd == -ENOENT)
            continue;
        rv = fd < 0 ? lsm_errno(fd) : lsm_vol_fsync(w->v, fd);
        if (fd >= 0)
            close(fd);
    }
    return rv;
}

kv_err lsm_wal_sync_all(lsm_wal *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->writing || w->syncing) /* every acknowledged group is written once this ends */
        pthread_cond_wait(&w->cv, &w->mu);
    if (w->broken != KV_OK) { /* an fsync after a failed one proves nothing */
        kv_err rv = w->broken;
        pthread_mutex_unlock(&w->mu);
        return rv;
    }
    bool cur = w->mode != LSM_SYNC_ALWAYS, sealed = w->sealed_unsynced;
    size_t n = sealed ? w->nsealed : 0;
    uint64_t *nums = n ? malloc(n * sizeof(*nums)) : NULL;
    if ((!cur && !sealed) || (n && !nums)) {
        pthread_mutex_unlock(&w->mu);
        return n && !nums ? KV_RESOURCE_EXHAUSTED : KV_OK; /* always: synced on each write */
    }
    for (size_t i = 0; i < n; i++)
        nums[i] = w->sealed[i].number;
    w->writing = w->exclusive = true; /* no group write, rotation or batch fsync meanwhile */
    int fd = w->fd;
    pthread_mutex_unlock(&w->mu);
    kv_err rv = cur ? lsm_vol_fsync(w->v, fd) : KV_OK;
    if (rv == KV_OK)
        rv = sync_sealed(w, nums, n);
    free(nums);
    if (rv != KV_OK)
        KV_ERROR(LSM_LOG, "WAL sync in %s: %s", w->v->dir, kv_strerror(rv));
    pthread_mutex_lock(&w->mu);
    if (rv == KV_OK) {
        w->dirty = false;
        w->sealed_unsynced = false;
        atomic_fetch_add(&w->fsyncs, 1);
    } else {
        wal_break(w, rv, w->written_max, "sync failed");
    }
    w->writing = w->exclusive = false;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return rv;
}

void lsm_wal_release(lsm_wal *w, uint64_t flushed_seq)
{
    pthread_mutex_lock(&w->mu);
    if (w->broken != KV_OK && flushed_seq >= w->broken_seq) {
        KV_INFO(LSM_LOG, "WAL %s: writes resume (the records up to seqno %" PRIu64 " are in SSTs)",
                w->v->dir, w->broken_seq);
        w->broken = KV_OK;
    }
    size_t keep = 0;
    for (size_t i = 0; i < w->nsealed; i++) {
        if (w->sealed[i].max_seq <= flushed_seq) {
            char name[64];
            seg_name(name, sizeof(name), w->sealed[i].number);
            int e = lsm_vol_unlink(w->v, name);
            if (e < 0 && e != -ENOENT)
                KV_WARN(LSM_LOG, "delete WAL %s/%s: %s", w->v->dir, name, strerror(-e));
            atomic_fetch_sub(&w->live, w->sealed[i].bytes);
            continue;
        }
        w->sealed[keep++] = w->sealed[i];
    }
    w->nsealed = keep;
    pthread_mutex_unlock(&w->mu);
}

uint64_t lsm_wal_live(lsm_wal *w)
{
    return atomic_load_explicit(&w->live, memory_order_relaxed);
}

void lsm_wal_counters(lsm_wal *w, uint64_t *bytes, uint64_t *fsyncs, uint64_t *segments)
{
    *bytes = atomic_load(&w->bytes);
    *fsyncs = atomic_load(&w->fsyncs);
    pthread_mutex_lock(&w->mu);
    *segments = w->nsealed + 1;
    pthread_mutex_unlock(&w->mu);
}

void lsm_wal_close(lsm_wal *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_broadcast(&w->sync_cv);
    pthread_mutex_unlock(&w->mu);
    if (w->has_syncer)
        pthread_join(w->syncer, NULL);
    if (w->mode != LSM_SYNC_NONE && lsm_vol_fsync(w->v, w->fd) == KV_OK)
        atomic_fetch_add(&w->fsyncs, 1);
    close(w->fd);
    lsm_buf_free(&w->pending);
    lsm_buf_free(&w->spare);
    free(w->sealed);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_cond_destroy(&w->sync_cv);
    free(w);
}

/* ---- recovery ---- */

typedef struct reader {
    lsm_vol *v;
    int fd;
    uint64_t size, boff;
    lsm_buf b;
    kv_err err; /* a read or allocation failed: not a verdict on the data */
} reader;

/* Makes [off, off + n) available; NULL past EOF, or on an error (r->err). */
static const uint8_t *rd_get(reader *r, uint64_t off, size_t n)
{
    if (r->err != KV_OK || off + n > r->size)
        return NULL;
    if (off >= r->boff && off + n <= r->boff + r->b.len)
        return r->b.p + (off - r->boff);
    size_t want = n > READ_CHUNK ? n : READ_CHUNK;
    if (want > r->size - off)
        want = (size_t)(r->size - off);
    r->b.len = 0;
    kv_err rv = lsm_buf_reserve(&r->b, want);
    if (rv == KV_OK)
        rv = lsm_vol_pread(r->v, r->fd, r->b.p, want, off);
    if (rv != KV_OK) {
        r->err = rv == KV_DATA_LOSS ? KV_INTERNAL : rv; /* short: the file shrank under us */
        return NULL;
    }
    r->b.len = want;
    r->boff = off;
    return r->b.p;
}

typedef struct replay_ctx {
    uint64_t flushed, max_seq;
    lsm_replay_fn fn;
    void *arg;
    lsm_wal_recovery mode;
} replay_ctx;

/* Replays one verified frame payload; DATA_LOSS if its records are bad. */
static kv_err replay_payload(replay_ctx *c, const uint8_t *p, size_t len, bool compact,
                             uint64_t *seg_max)
{
    for (size_t at = 0; at < len;) {
        lsm_rec r;
        size_t used;
        if (lsm_rec_decode_as(compact, p + at, len - at, &r, &used) != KV_OK)
            return KV_DATA_LOSS;
        at += used;
    }
    for (size_t at = 0; at < len;) {
        lsm_rec r;
        size_t used;
        lsm_rec_decode_as(compact, p + at, len - at, &r, &used);
        at += used;
        *seg_max = r.seqno > *seg_max ? r.seqno : *seg_max;
        c->max_seq = r.seqno > c->max_seq ? r.seqno : c->max_seq;
        if (r.seqno > c->flushed && c->fn) {
            kv_err rv = c->fn(c->arg, &r);
            if (rv != KV_OK)
                return rv == KV_DATA_LOSS ? KV_INTERNAL : rv;
        }
    }
    return KV_OK;
}

/* The smallest payload of a frame: one record of the frame's codec. */
static uint32_t min_payload(bool compact)
{
    return compact ? MIN_RECC : LSM_REC_HDR + 1;
}

/* The frame at off, when its checksum holds; NULL otherwise (*len set, the
 * payload's length, and *compact, its codec). */
static const uint8_t *frame_at(reader *r, uint64_t off, uint32_t *len, bool *compact)
{
    const uint8_t *h = rd_get(r, off, LSM_FRAME_HDR);
    if (!h)
        return NULL;
    uint32_t word = lsm_get32(h + 4);
    *compact = (word & FRAME_COMPACT) != 0;
    *len = word & ~FRAME_COMPACT;
    uint32_t crc = lsm_get32(h);
    if (*len < min_payload(*compact) || *len > MAX_FRAME) /* one record or more */
        return NULL;
    const uint8_t *f = rd_get(r, off, LSM_FRAME_HDR + *len);
    return f && kv_crc32c(0, f + 4, (size_t)*len + 4) == crc ? f : NULL;
}

/* Whether h (a frame header and n >= LSM_FRAME_HDR + MIN_RECC bytes after
 * it) may start a frame of a log of size bytes at p: a length that fits and
 * a first record that does (for a compact frame: a valid type and a key
 * length whose first byte is not zero). */
static bool plausible(const uint8_t *h, size_t n, uint64_t p, uint64_t size)
{
    uint32_t word = lsm_get32(h + 4), len = word & ~FRAME_COMPACT;
    const uint8_t *rec = h + LSM_FRAME_HDR;
    bool compact = (word & FRAME_COMPACT) != 0;
    if (len < min_payload(compact) || len > size - p - LSM_FRAME_HDR)
        return false;
    if (compact)
        return ((rec[0] & 3u) == LSM_PUT || (rec[0] & 3u) == LSM_DELETE) && rec[1] != 0;
    if (n < LSM_FRAME_HDR + LSM_REC_HDR)
        return false;
    uint64_t klen = lsm_get32(rec), vlen = lsm_get32(rec + 4);
    return klen > 0 && klen <= LSM_MAX_KEY && vlen <= LSM_MAX_VALUE &&
           LSM_REC_HDR + klen + vlen <= len && (rec[32] == LSM_PUT || rec[32] == LSM_DELETE);
}

/* Offset of the first frame after a bad one at bad that passes its
 * checksum, or 0 when there is none (or a read failed: r->err). Every
 * offset is tried (the bad frame's length may be what is damaged), down to
 * the smallest compact frame at the very end; a candidate must first look
 * plausible, so random bytes and zeroes cost no checksum. */
static uint64_t valid_after(reader *r, uint64_t bad)
{
    for (uint64_t p = bad + 1; p + LSM_FRAME_HDR + MIN_RECC <= r->size; p++) {
        size_t n = LSM_FRAME_HDR + LSM_REC_HDR;
        if (n > r->size - p)
            n = (size_t)(r->size - p);
        const uint8_t *h = rd_get(r, p, n);
        uint32_t len;
        bool compact;
        if (!h)
            return 0;
        if (plausible(h, n, p, r->size) && frame_at(r, p, &len, &compact))
            return p;
    }
    return 0;
}

/* One segment of the log being recovered. */
typedef struct seg_scan {
    uint64_t number;
    bool later_data; /* a later segment holds bytes */
    uint64_t seg_max;
    uint64_t bytes; /* the segment's size once scanned (cut included) */
    bool cut;       /* truncated at a bad frame: later segments are dropped */
} seg_scan;

/* A bad frame at off of a segment of size bytes: a torn tail is cut in
 * every mode; corruption before the tail refuses to open (DATA_LOSS) or,
 * in point-in-time mode, is cut with what follows. */
static kv_err bad_frame(replay_ctx *c, reader *r, seg_scan *sc, const char *name, uint64_t off)
{
    uint64_t next = valid_after(r, off);
    if (r->err != KV_OK)
        return r->err;
    bool tail = !next && !sc->later_data;
    if (!tail && c->mode != LSM_WAL_POINT_IN_TIME) {
        KV_ERROR(LSM_LOG,
                 "WAL %s/%s: corrupt frame at offset %" PRIu64 " of %" PRIu64 " bytes, %s: "
                 "refusing to open (the writes logged after it would be lost); restore the "
                 "file, or recover up to the corruption with point-in-time WAL recovery",
                 r->v->dir, name, off, r->size,
                 next ? "a valid frame follows it" : "later WAL segments follow it");
        return KV_DATA_LOSS;
    }
    if (tail)
        KV_WARN(LSM_LOG,
                "WAL %s/%s: torn tail at offset %" PRIu64 ", truncating %" PRIu64
                " bytes (a write cut short by a crash)",
                r->v->dir, name, off, r->size - off);
    else
        KV_WARN(LSM_LOG,
                "WAL %s/%s: corrupt frame at offset %" PRIu64
                ", point-in-time recovery: truncating %" PRIu64
                " bytes and deleting later segments (acknowledged writes from there on are lost)",
                r->v->dir, name, off, r->size - off);
    sc->cut = true;
    kv_err rv = lsm_vol_truncate(r->v, r->fd, off);
    if (rv == KV_OK)
        rv = lsm_vol_fsync(r->v, r->fd);
    if (rv != KV_OK)
        KV_ERROR(LSM_LOG, "WAL %s/%s: truncate at %" PRIu64 ": %s", r->v->dir, name, off,
                 kv_strerror(rv));
    return rv;
}

/* Replays one segment; sc->cut is set when it ended in a bad frame. */
static kv_err replay_seg(replay_ctx *c, lsm_vol *v, seg_scan *sc)
{
    char name[64];
    seg_name(name, sizeof(name), sc->number);
    reader r = {.v = v, .fd = lsm_vol_open(v, name, O_RDWR)};
    if (r.fd < 0) {
        KV_ERROR(LSM_LOG, "open WAL %s/%s: %s", v->dir, name, strerror(-r.fd));
        return lsm_errno(r.fd);
    }
    struct stat st;
    fstat(r.fd, &st);
    r.size = (uint64_t)st.st_size;
    uint64_t off = 0;
    kv_err rv = KV_OK;
    sc->seg_max = 0;
    sc->cut = false;
    while (off < r.size && rv == KV_OK) {
        uint32_t len;
        bool compact;
        const uint8_t *f = frame_at(&r, off, &len, &compact);
        rv = f ? replay_payload(c, f + LSM_FRAME_HDR, len, compact, &sc->seg_max) : KV_DATA_LOSS;
        if (rv == KV_DATA_LOSS && r.err == KV_OK)
            rv = bad_frame(c, &r, sc, name, off);
        if (rv != KV_OK || sc->cut)
            break;
        off += LSM_FRAME_HDR + len;
    }
    sc->bytes = off;      /* the whole file, or where it was cut */
    if (r.err != KV_OK) { /* an I/O error is no reason to cut the log */
        KV_ERROR(LSM_LOG, "WAL %s/%s: read at offset %" PRIu64 " failed: %s", v->dir, name, off,
                 kv_strerror(r.err));
        rv = r.err;
    }
    close(r.fd);
    lsm_buf_free(&r.b);
    return rv;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Numbers of the *.wal files of v, sorted (malloc'ed). */
static kv_err list_segments(lsm_vol *v, uint64_t **out, size_t *n)
{
    DIR *d = opendir(v->dir);
    if (!d)
        return KV_INTERNAL;
    uint64_t *nums = NULL;
    size_t cnt = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        uint64_t num = strtoull(e->d_name, &end, 10);
        if (end == e->d_name || strcmp(end, ".wal") != 0)
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            uint64_t *p = realloc(nums, cap * sizeof(*p));
            if (!p) {
                free(nums);
                closedir(d);
                return KV_RESOURCE_EXHAUSTED;
            }
            nums = p;
        }
        nums[cnt++] = num;
    }
    closedir(d);
    if (cnt)
        qsort(nums, cnt, sizeof(*nums), cmp_u64);
    *out = nums;
    *n = cnt;
    return KV_OK;
}

/* later[i]: a segment after nums[i] holds bytes. */
static kv_err later_data(lsm_vol *v, const uint64_t *nums, size_t n, bool *later)
{
    bool any = false;
    for (size_t i = n; i-- > 0;) {
        later[i] = any;
        char name[64];
        struct stat st;
        seg_name(name, sizeof(name), nums[i]);
        if (fstatat(v->dirfd, name, &st, 0) < 0) {
            KV_ERROR(LSM_LOG, "stat WAL %s/%s: %s", v->dir, name, strerror(errno));
            return lsm_errno(errno);
        }
        any |= st.st_size > 0;
    }
    return KV_OK;
}

kv_err lsm_wal_recover(lsm_vol *v, const lsm_opts *o, uint64_t flushed_seq, lsm_replay_fn fn,
                       void *arg, lsm_wal_seg **segs, size_t *nsegs, uint64_t *max_seq,
                       uint64_t *max_number)
{
    uint64_t *nums;
    size_t n;
    kv_err rv = list_segments(v, &nums, &n);
    if (rv != KV_OK)
        return rv;
    lsm_wal_seg *out = calloc(n ? n : 1, sizeof(*out));
    bool *later = calloc(n ? n : 1, sizeof(*later));
    rv = out && later ? later_data(v, nums, n, later) : KV_RESOURCE_EXHAUSTED;
    replay_ctx c = {.flushed = flushed_seq, .fn = fn, .arg = arg, .mode = o->wal_recovery};
    size_t kept = 0;
    bool cut = false;
    for (size_t i = 0; i < n && rv == KV_OK; i++) {
        char name[64];
        seg_name(name, sizeof(name), nums[i]);
        if (cut) {
            KV_WARN(LSM_LOG, "deleting WAL %s/%s: it follows a corrupt frame", v->dir, name);
            lsm_vol_unlink(v, name);
            continue;
        }
        seg_scan sc = {.number = nums[i], .later_data = later[i]};
        rv = replay_seg(&c, v, &sc);
        cut = sc.cut;
        if (rv == KV_OK)
            out[kept++] = (lsm_wal_seg){nums[i], sc.seg_max, sc.bytes};
    }
    free(later);
    if (rv != KV_OK) {
        free(out);
        free(nums);
        return rv;
    }
    *max_number = n ? nums[n - 1] : 0;
    free(nums);
    *segs = out;
    *nsegs = kept;
    *max_seq = c.max_seq;
    return KV_OK;
}
