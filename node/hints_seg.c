/* SPDX-License-Identifier: MIT */
/*
 * The hint store's segment files (see hints_int.h for the frame format):
 * reading and checking them at recovery, and the drain behind
 * hint_store_replay and hint_store_expire.
 *
 * Recovery reads every frame: a bad frame with no valid frame anywhere
 * after it is a torn or corrupt tail and is truncated (it was never
 * acknowledged); one followed by a valid frame is corruption in the
 * middle: what follows stays on disk unread until the segment's readable
 * part is done, the target is marked lost and the frame counted.
 *
 * A drain runs alone on its target (`busy`) and reads with no lock held,
 * only bytes committed before it began (a replay does not chase hints added
 * meanwhile). It gathers runs of consecutive frames that are all sent (up
 * to max_batch_bytes of payload) or all dropped (older than the window),
 * acknowledges each run in memory by moving the segment's head, and
 * unlinks a segment once nothing is left in it: after a crash the hints of
 * a partly acknowledged segment are replayed again, which the receiver
 * tolerates. Removing or sealing the active segment first stops new
 * leaders (hint_quiesce) and waits for the running write.
 */
#include "node/hints_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

#define READ_CHUNK (1u << 20)

/* ---- reading segments ---- */

typedef struct reader {
    lsm_vol *v;
    int fd;
    uint64_t size, boff;
    lsm_buf b;
} reader;

typedef struct frame {
    uint64_t next, ms;
    uint32_t len;
    const uint8_t *p;
} frame;

static bool is_active(const hint_target *t, const hint_seg *s)
{
    return t->fd >= 0 && s == &t->segs[t->nsegs - 1];
}

static hint_seg *seg_find(hint_target *t, uint64_t number)
{
    for (size_t i = 0; i < t->nsegs; i++)
        if (t->segs[i].number == number)
            return &t->segs[i];
    return NULL;
}

/* Hints added before the returned time are expired; 0 = none are. */
static uint64_t cutoff_ms(hint_store *h)
{
    uint64_t now = hint_now_ms(h);
    return h->window_ms && now > h->window_ms ? now - h->window_ms : 0;
}

static kv_err rd_open(reader *r, hint_target *t, uint64_t number, int flags)
{
    char name[32];
    hint_seg_name(name, sizeof(name), number);
    *r = (reader){.v = &t->vol, .fd = lsm_vol_open(&t->vol, name, flags)};
    struct stat st;
    if (r->fd < 0 || fstat(r->fd, &st) < 0) {
        int e = r->fd < 0 ? -r->fd : errno;
        KV_ERROR(HINT_LOG, "open %s/%s: %s", t->vol.dir, name, strerror(e));
        if (r->fd >= 0)
            close(r->fd);
        return e == ENOENT ? KV_NOT_FOUND : lsm_errno(e);
    }
    r->size = (uint64_t)st.st_size;
    return KV_OK;
}

static void rd_close(reader *r)
{
    close(r->fd);
    lsm_buf_free(&r->b);
}

/* Makes [off, off + n) available at *out; DATA_LOSS past the end. */
static kv_err rd_get(reader *r, uint64_t off, size_t n, const uint8_t **out)
{
    if (off + n > r->size)
        return KV_DATA_LOSS;
    if (off >= r->boff && off + n <= r->boff + r->b.len) {
        *out = r->b.p + (off - r->boff);
        return KV_OK;
    }
    size_t want = n > READ_CHUNK ? n : READ_CHUNK;
    if (want > r->size - off)
        want = (size_t)(r->size - off);
    r->b.len = 0;
    kv_err rv = lsm_buf_reserve(&r->b, want);
    if (rv == KV_OK)
        rv = lsm_vol_pread(r->v, r->fd, r->b.p, want, off);
    if (rv != KV_OK)
        return rv;
    r->b.len = want;
    r->boff = off;
    *out = r->b.p;
    return KV_OK;
}

/* Reads and verifies the frame at off: DATA_LOSS when it is bad or incomplete. */
static kv_err rd_frame(reader *r, uint64_t off, frame *f)
{
    const uint8_t *p;
    kv_err rv = rd_get(r, off, HINT_FRAME_HDR, &p);
    if (rv != KV_OK)
        return rv;
    uint32_t len = lsm_get32(p + 4);
    if (len == 0 || len > HINT_MAX_LEN)
        return KV_DATA_LOSS;
    if ((rv = rd_get(r, off, HINT_FRAME_HDR + len, &p)) != KV_OK)
        return rv;
    if (kv_crc32c(0, p + 4, HINT_FRAME_HDR - 4 + (size_t)len) != lsm_get32(p))
        return KV_DATA_LOSS;
    *f = (frame){.next = off + HINT_FRAME_HDR + len,
                 .ms = lsm_get64(p + 8),
                 .len = len,
                 .p = p + HINT_FRAME_HDR};
    return KV_OK;
}

/* The add time of the frame at off (read again: it may have been appended
 * since the reader opened), 0 when there is none. */
static uint64_t peek_ms(reader *r, uint64_t off)
{
    struct stat st;
    if (fstat(r->fd, &st) == 0)
        r->size = (uint64_t)st.st_size;
    frame f;
    return rd_frame(r, off, &f) == KV_OK ? f.ms : 0;
}

/* ---- recovery ---- */

static bool valid_frame_after(reader *r, uint64_t off)
{
    frame f;
    for (uint64_t at = off + 1; at + HINT_FRAME_HDR < r->size; at++)
        if (rd_frame(r, at, &f) == KV_OK)
            return true;
    return false;
}

/* The frame at s->end is bad: a tail is truncated, corruption in the middle
 * leaves the rest unread. */
static kv_err bad_frame(hint_target *t, reader *r, hint_seg *s)
{
    char name[32];
    hint_seg_name(name, sizeof(name), s->number);
    if (valid_frame_after(r, s->end)) {
        KV_ERROR(HINT_LOG,
                 "%s/%s: corrupt frame at offset %" PRIu64 "; the %" PRIu64
                 " bytes from there are kept but not replayed",
                 t->vol.dir, name, s->end, s->file - s->end);
        t->corrupt++;
        hint_note_lost(t, 0);
        return KV_OK;
    }
    KV_WARN(HINT_LOG,
            "%s/%s: torn or corrupt tail at offset %" PRIu64 ", truncating %" PRIu64 " bytes",
            t->vol.dir, name, s->end, s->file - s->end);
    if (ftruncate(r->fd, (off_t)s->end) < 0 || fsync(r->fd) < 0) {
        KV_ERROR(HINT_LOG, "truncate %s/%s: %s", t->vol.dir, name, strerror(errno));
        return lsm_errno(errno);
    }
    s->file = s->end;
    return KV_OK;
}

/* Reads a segment found on disk into *s. */
kv_err hint_scan_seg(hint_target *t, uint64_t number, hint_seg *s)
{
    reader r;
    kv_err rv = rd_open(&r, t, number, O_RDWR);
    if (rv != KV_OK)
        return rv;
    *s = (hint_seg){.number = number, .file = r.size};
    frame f;
    while (s->end < r.size && (rv = rd_frame(&r, s->end, &f)) == KV_OK) {
        if (s->live++ == 0)
            s->head_ms = f.ms;
        s->max_ms = f.ms > s->max_ms ? f.ms : s->max_ms;
        s->end = f.next;
    }
    if (rv == KV_DATA_LOSS)
        rv = bad_frame(t, &r, s);
    rd_close(&r);
    return rv;
}

/* ---- drain: replay and expiry ---- */

typedef struct drain {
    hint_send_fn send; /* NULL: expire only, stop at the first hint not expired */
    void *arg;
    size_t max_batch;
    uint64_t cutoff;              /* hints added before it are dropped; 0 = none */
    uint64_t end_number, end_off; /* what was durable when the drain began */
    bool dropping;                /* the current run: n frames ending at to */
    uint64_t to, n, payload;      /* payload: bytes of the run's hints */
    lsm_buf data;                 /* their copies (sent runs) */
    size_t *offs, *lens, cap;
    const uint8_t **ptrs;
    uint64_t sent, dropped;
} drain;

typedef struct cursor {
    uint64_t number, head, limit;
} cursor;

enum { STEP_READ, STEP_AGAIN, STEP_END };

static void drain_free(drain *d)
{
    lsm_buf_free(&d->data);
    free(d->offs);
    free(d->lens);
    free(d->ptrs);
}

static kv_err run_add(drain *d, const frame *f)
{
    if (!d->dropping && d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        size_t *o = realloc(d->offs, cap * sizeof(*o));
        d->offs = o ? o : d->offs;
        size_t *l = o ? realloc(d->lens, cap * sizeof(*l)) : NULL;
        d->lens = l ? l : d->lens;
        const uint8_t **p = l ? realloc(d->ptrs, cap * sizeof(*p)) : NULL;
        d->ptrs = p ? p : d->ptrs;
        if (!p)
            return KV_RESOURCE_EXHAUSTED;
        d->cap = cap;
    }
    if (!d->dropping) {
        d->offs[d->n] = d->data.len;
        d->lens[d->n] = f->len;
        kv_err rv = lsm_buf_put(&d->data, f->p, f->len);
        if (rv != KV_OK)
            return rv;
        d->payload += f->len;
    }
    d->n++;
    d->to = f->next;
    return KV_OK;
}

/* Acknowledges the run in segment number; ABORTED when forget is waiting. */
static kv_err advance(hint_target *t, drain *d, uint64_t number, uint64_t next_ms)
{
    pthread_mutex_lock(&t->mu);
    hint_seg *s = seg_find(t, number);
    if (s) {
        s->head = d->to;
        s->live = s->live > d->n ? s->live - d->n : 0;
        s->head_ms = !s->live ? 0 : next_ms ? next_ms : s->max_ms;
    }
    if (d->dropping) {
        hint_note_lost(t, d->n);
        d->dropped += d->n;
    } else {
        t->replayed += d->n;
        d->sent += d->n;
    }
    kv_err rv = t->cancel ? KV_ABORTED : KV_OK;
    pthread_mutex_unlock(&t->mu);
    return rv;
}

/* Sends (or drops) the current run and acknowledges it. */
static kv_err run_flush(hint_target *t, drain *d, reader *r, uint64_t number)
{
    if (d->n == 0)
        return KV_OK;
    if (!d->dropping) {
        for (size_t i = 0; i < d->n; i++)
            d->ptrs[i] = d->data.p + d->offs[i];
        kv_err rv = d->send(d->arg, d->ptrs, d->lens, d->n);
        if (rv != KV_OK)
            return rv;
    }
    kv_err rv = advance(t, d, number, peek_ms(r, d->to));
    d->n = d->payload = 0;
    d->data.len = 0;
    return rv;
}

/* The frame at off of segment number is bad (found while draining): the
 * segment ends there; it is sealed if it was active. */
static void seg_corrupt(hint_target *t, uint64_t number, uint64_t off)
{
    pthread_mutex_lock(&t->mu);
    hint_seg *s = seg_find(t, number);
    if (!s) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    if (is_active(t, s)) {
        hint_quiesce(t);
        s = seg_find(t, number);
        if (is_active(t, s)) {
            close(t->fd);
            t->fd = -1;
        }
        hint_unquiesce(t);
    }
    KV_ERROR(HINT_LOG,
             "%s/%016" PRIx64 HINT_SEG_SUFFIX ": corrupt frame at offset %" PRIu64
             ", the rest of the segment is not replayed",
             t->vol.dir, number, off);
    s->end = off;
    s->live = 0;
    t->corrupt++;
    hint_note_lost(t, 0);
    pthread_mutex_unlock(&t->mu);
}

/* Adds the frame f to the run, sending or dropping the run first when f
 * does not belong to it. *took: f was added. */
static kv_err run_take(hint_target *t, drain *d, reader *r, uint64_t number, const frame *f,
                       bool *took)
{
    bool old = d->cutoff && f->ms < d->cutoff;
    *took = false;
    if (d->n && (old != d->dropping || (!old && d->payload + f->len > d->max_batch)))
        return run_flush(t, d, r, number);
    d->dropping = old;
    *took = true;
    return run_add(d, f);
}

/* Drains segment c->number from c->head up to c->limit. *stop: expiry met a
 * hint that is not expired. A missing segment or a corrupt frame ends the
 * segment there. */
static kv_err drain_seg(hint_target *t, drain *d, const cursor *c, bool *stop)
{
    reader r;
    kv_err rv = rd_open(&r, t, c->number, O_RDONLY);
    if (rv == KV_NOT_FOUND)
        seg_corrupt(t, c->number, c->head);
    if (rv != KV_OK)
        return rv == KV_NOT_FOUND ? KV_OK : rv;
    d->to = c->head;
    d->n = d->payload = 0;
    for (uint64_t off = c->head; rv == KV_OK && off < c->limit;) {
        frame f;
        if ((rv = rd_frame(&r, off, &f)) == KV_DATA_LOSS) {
            if ((rv = run_flush(t, d, &r, c->number)) == KV_OK)
                seg_corrupt(t, c->number, off);
            break;
        }
        if (rv == KV_OK && !d->send && !(d->cutoff && f.ms < d->cutoff)) {
            *stop = true;
            break;
        }
        bool took = false;
        if (rv == KV_OK && (rv = run_take(t, d, &r, c->number, &f, &took)) == KV_OK && took)
            off = f.next;
    }
    if (rv == KV_OK)
        rv = run_flush(t, d, &r, c->number);
    rd_close(&r);
    return rv;
}

static bool seg_gone(const drain *d, const hint_seg *s)
{
    return s->head >= s->end || (d->cutoff && s->max_ms < d->cutoff);
}

/* With t->mu held: removes the oldest segment, dropping its hints, if it
 * still has nothing to replay once the active segment is settled. */
static int seg_retire(hint_store *h, hint_target *t, drain *d)
{
    bool held = is_active(t, &t->segs[0]);
    if (held)
        hint_quiesce(t); /* a running write may still land in it */
    hint_seg s = t->segs[0];
    bool gone = seg_gone(d, &s);
    if (gone) {
        if (s.live) {
            hint_note_lost(t, s.live);
            d->dropped += s.live;
        }
        if (is_active(t, &t->segs[0])) {
            close(t->fd);
            t->fd = -1;
        }
        memmove(t->segs, t->segs + 1, (t->nsegs - 1) * sizeof(*t->segs));
        t->nsegs--;
    }
    if (held)
        hint_unquiesce(t);
    if (gone) {
        pthread_mutex_unlock(&t->mu);
        hint_seg_unlink(h, t, &s);
        pthread_mutex_lock(&t->mu);
    }
    return STEP_AGAIN;
}

/* With t->mu held: where the drain goes next. */
static int drain_next(hint_store *h, hint_target *t, drain *d, cursor *c, kv_err *rv)
{
    if (t->cancel) {
        *rv = KV_ABORTED;
        return STEP_END;
    }
    if (!t->nsegs || t->segs[0].number > d->end_number)
        return STEP_END;
    hint_seg *s = &t->segs[0];
    if (seg_gone(d, s))
        return seg_retire(h, t, d);
    c->number = s->number;
    c->head = s->head;
    c->limit = s->number == d->end_number && d->end_off < s->end ? d->end_off : s->end;
    return s->head < c->limit ? STEP_READ : STEP_END;
}

static kv_err drain_target(hint_store *h, hint_target *t, drain *d)
{
    kv_err rv = KV_OK;
    bool stop = false;
    while (rv == KV_OK && !stop) {
        cursor c;
        pthread_mutex_lock(&t->mu);
        int step = drain_next(h, t, d, &c, &rv);
        pthread_mutex_unlock(&t->mu);
        if (step == STEP_END)
            break;
        if (step == STEP_READ)
            rv = drain_seg(t, d, &c, &stop);
    }
    return rv;
}

/* Claims t for a drain of kind k (a replay waits for an expiry or a forget;
 * FAILED_PRECONDITION when it cannot) and notes where the drain ends. */
static kv_err drain_begin(hint_target *t, drain *d, busy_kind k)
{
    pthread_mutex_lock(&t->mu);
    while (k == REPLAY && (t->busy == EXPIRE || t->busy == FORGET))
        pthread_cond_wait(&t->cv, &t->mu);
    kv_err rv = t->busy == IDLE ? KV_OK : KV_FAILED_PRECONDITION;
    if (rv == KV_OK) {
        t->busy = k;
        hint_seg *last = t->nsegs ? &t->segs[t->nsegs - 1] : NULL;
        d->end_number = last ? last->number : 0;
        d->end_off = last ? last->end : 0;
    }
    pthread_mutex_unlock(&t->mu);
    return rv;
}

static void drain_end(hint_target *t)
{
    pthread_mutex_lock(&t->mu);
    t->busy = IDLE;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

kv_err hint_store_replay(hint_store *h, const char *name, hint_send_fn send, void *arg,
                         size_t max_batch_bytes, uint64_t *sent)
{
    if (!send)
        return KV_INVALID_ARGUMENT;
    hint_target *t;
    kv_err rv = hint_target_get(h, name, false, &t);
    if (rv != KV_OK) {
        if (rv == KV_NOT_FOUND && sent)
            *sent = 0;
        return rv == KV_NOT_FOUND ? KV_OK : rv;
    }
    drain d = {.send = send, .arg = arg, .max_batch = max_batch_bytes, .cutoff = cutoff_ms(h)};
    if ((rv = drain_begin(t, &d, REPLAY)) == KV_OK) {
        rv = drain_target(h, t, &d);
        drain_end(t);
    }
    drain_free(&d);
    hint_meta_save(h, t);
    hint_target_put(h, t);
    /* *sent is not written on an error: what was delivered is said here */
    if (d.sent || d.dropped)
        kv_log(rv == KV_OK && !d.dropped ? KV_LOG_DEBUG : KV_LOG_INFO, HINT_LOG,
               "target %s: replayed %" PRIu64 " hints, dropped %" PRIu64 " expired (%s)", name,
               d.sent, d.dropped, kv_strerror(rv));
    if (rv == KV_OK && sent)
        *sent = d.sent;
    return rv;
}

static kv_err expire_target(hint_store *h, hint_target *t, uint64_t cutoff, uint64_t *count)
{
    drain d = {.cutoff = cutoff};
    if (drain_begin(t, &d, EXPIRE) != KV_OK)
        return KV_OK; /* being replayed (which drops them) or forgotten */
    kv_err rv = drain_target(h, t, &d);
    drain_end(t);
    drain_free(&d);
    if (rv == KV_ABORTED)
        rv = KV_OK;
    if (d.dropped) {
        KV_INFO(HINT_LOG, "target %s: dropped %" PRIu64 " expired hints", t->name, d.dropped);
        hint_meta_save(h, t);
    }
    *count += d.dropped;
    return rv;
}

kv_err hint_store_expire(hint_store *h, uint64_t *dropped)
{
    if (!h || !dropped)
        return KV_INVALID_ARGUMENT;
    uint64_t cutoff = cutoff_ms(h), count = 0;
    pthread_mutex_lock(&h->mu);
    size_t n = cutoff ? h->ntargets : 0;
    hint_target **ts = n ? malloc(n * sizeof(*ts)) : NULL;
    for (size_t i = 0; ts && i < n; i++) {
        ts[i] = h->targets[i];
        ts[i]->refs++;
    }
    pthread_mutex_unlock(&h->mu);
    if (n && !ts)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = KV_OK;
    for (size_t i = 0; i < n; i++) {
        kv_err e = expire_target(h, ts[i], cutoff, &count);
        rv = rv == KV_OK ? e : rv;
        hint_target_put(h, ts[i]);
    }
    free(ts);
    if (rv == KV_OK)
        *dropped = count;
    return rv;
}
