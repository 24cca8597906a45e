/* SPDX-License-Identifier: MIT */
/*
 * kallax flush: applies a run of records to their blocks. The blocks a run
 * touches are loaded into a per-flush table (each with its image as read,
 * to diff counters and extent references against), the records are placed
 * by the probing rule of kallax.h, big values are written to new extents,
 * and then the changed images are committed in rounds of journal_blocks:
 * journal (write + fsync), in place in descending block order (each under
 * its stripe lock; move_lock held exclusively when a record moved between
 * blocks), fsync. Only after the last round does META record the flushed
 * seqno; then the extent pages no block references any more are queued for
 * freeing, and the WAL segments the flush covers are deleted. The journal
 * itself (format, recovery at open, and the lookup that repairs a corrupt
 * block) is in journal.c. kallax_cleanup reuses the table and the commit.
 *
 * Extents (the second half of this file): values too big to keep inline
 * live in EXTENTS, in runs of 4 KiB pages. The free map is a bitmap
 * (1 = used), rebuilt at open from the references in the blocks and never
 * stored. Allocation is first fit from a rotating cursor; when no run fits,
 * the map (and the file, by writing past its end) grows. A freed run goes
 * through two queues: `pending` (dropped by the flush running now) and
 * `deferred` (dropped by the previous flush); each completed flush frees
 * `deferred` and moves `pending` there. So pages are reused only after the
 * blocks that dropped them are synced and a whole flush later, which gives
 * a reader that read an old block time to read its extent (and a reader
 * that loses the race sees a crc mismatch and retries). Every extent
 * function takes the map's mutex; the flush is the only allocator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/kallax/kallax_int.h"

/* ---- the table of loaded blocks ---- */

static kv_err tab_grow(kx_tab *t)
{
    size_t cap = t->mapcap ? t->mapcap * 2 : 1024;
    size_t *map = malloc(cap * sizeof(*map));
    kx_tblock **b = realloc(t->b, (cap / 2) * sizeof(*b));
    if (b)
        t->b = b;
    if (!map || !b) {
        free(map);
        return KV_RESOURCE_EXHAUSTED;
    }
    memset(map, 0xff, cap * sizeof(*map));
    for (size_t i = 0; i < t->n; i++) {
        size_t j = (size_t)(t->b[i]->blk * 0x9e3779b97f4a7c15ull) & (cap - 1);
        while (map[j] != SIZE_MAX)
            j = (j + 1) & (cap - 1);
        map[j] = i;
    }
    free(t->map);
    t->map = map;
    t->mapcap = cap;
    return KV_OK;
}

/* Drops, in a loaded image, records that outlived the tombstone grace;
 * true when it dropped one (the block is then rewritten). */
static bool gc_image(kallax *kx, uint8_t *img, uint64_t now)
{
    size_t off = KX_HDR;
    bool dropped = false;
    for (unsigned i = 0; i < kx_block_count(img);) {
        kx_slot s;
        size_t at = off;
        kx_block_next(img, &off, &s);
        uint64_t t = s.flags & KX_F_TOMB ? s.version >> 16 : 0;
        t = s.expire_at > t ? s.expire_at : t;
        bool dead = (s.flags & KX_F_TOMB) || (s.expire_at && s.expire_at <= now);
        if (dead && t + kx->o.tombstone_grace_ms < now) {
            kx_block_remove(img, &s);
            off = at;
            dropped = true;
            continue;
        }
        i++;
    }
    return dropped;
}

kv_err kx_tab_get(kx_tab *t, uint64_t blk, kx_tblock **out)
{
    if (blk >= t->kx->nblocks)
        return KV_INTERNAL;
    if ((t->n + 1) * 2 > t->mapcap) {
        kv_err rv = tab_grow(t);
        if (rv != KV_OK)
            return rv;
    }
    size_t j = (size_t)(blk * 0x9e3779b97f4a7c15ull) & (t->mapcap - 1);
    for (; t->map[j] != SIZE_MAX; j = (j + 1) & (t->mapcap - 1))
        if (t->b[t->map[j]]->blk == blk) {
            *out = t->b[t->map[j]];
            return KV_OK;
        }
    kx_tblock *b = calloc(1, sizeof(*b));
    if (!b)
        return KV_RESOURCE_EXHAUSTED;
    b->blk = blk;
    kv_err rv = kx_read_block(t->kx, blk, b->orig);
    if (rv != KV_OK) {
        free(b);
        return rv;
    }
    memcpy(b->img, b->orig, KALLAX_BLOCK);
    b->dirty = gc_image(t->kx, b->img, t->now);
    t->b[t->n] = b;
    t->map[j] = t->n++;
    *out = b;
    return KV_OK;
}

void kx_tab_free(kx_tab *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->b[i]);
    free(t->b);
    free(t->map);
    free(t->newext);
    memset(t, 0, sizeof(*t));
}

/* ---- placing records ---- */

/* Finds key in its window: *where (NULL = nowhere) and its slot. */
static kv_err locate(kx_tab *t, uint64_t h, const lsm_rec *r, kx_tblock **where, kx_slot *s)
{
    kx_tblock *home;
    kv_err rv = kx_tab_get(t, h, &home);
    *where = NULL;
    unsigned spill = rv == KV_OK ? kx_block_spill(home->img) : 0;
    for (unsigned d = 0; rv == KV_OK && d <= spill; d++) {
        kx_tblock *b;
        if ((rv = kx_tab_get(t, h + d, &b)) == KV_OK && kx_block_find(b->img, r->key, r->klen, s)) {
            *where = b;
            break;
        }
    }
    return rv;
}

/* Writes r's value to a new extent when it is too big to keep inline. */
static kv_err make_extent(kx_tab *t, const lsm_rec *r, bool *ext, uint64_t *page, uint32_t *crc)
{
    kallax *kx = t->kx;
    *ext = r->type == LSM_PUT && kx_rec_size(r->klen, r->vlen, false) > kx->o.inline_max;
    if (!*ext)
        return KV_OK;
    uint64_t n = kx_ext_pages(r->vlen);
    if (t->nnew + 2 > t->capnew) {
        size_t cap = t->capnew ? t->capnew * 2 : 64;
        uint64_t *a = realloc(t->newext, cap * sizeof(*a));
        if (!a)
            return KV_RESOURCE_EXHAUSTED;
        t->newext = a;
        t->capnew = cap;
    }
    kv_err rv = kx_ext_alloc(&kx->ext, n, page);
    if (rv != KV_OK)
        return rv;
    t->newext[t->nnew++] = *page;
    t->newext[t->nnew++] = n;
    *crc = kv_crc32c(0, r->value, r->vlen);
    return kx_ext_write(kx, *page, r->value, r->vlen);
}

static bool gc_now(const kallax *kx, const lsm_rec *r, uint64_t now)
{
    uint64_t tm = r->type == LSM_DELETE ? r->version >> 16 : 0;
    tm = r->expire_at > tm ? r->expire_at : tm;
    bool dead = r->type == LSM_DELETE || (r->expire_at && r->expire_at <= now);
    return dead && tm + kx->o.tombstone_grace_ms < now;
}

/* Adds r to the first block of [from, h + probe] with room. */
static kv_err place(kx_tab *t, uint64_t h, uint64_t from, const lsm_rec *r, bool ext, uint64_t page,
                    uint32_t crc, uint64_t *placed)
{
    kallax *kx = t->kx;
    for (uint64_t b = from; b <= h + kx->o.probe; b++) {
        kx_tblock *tb;
        kv_err rv = kx_tab_get(t, b, &tb);
        if (rv != KV_OK)
            return rv;
        if (!kx_block_add(tb->img, r, ext, page, crc))
            continue;
        tb->dirty = true;
        *placed = b;
        kx_tblock *home;
        if ((rv = kx_tab_get(t, h, &home)) != KV_OK)
            return rv;
        if (b - h > kx_block_spill(home->img)) {
            kx_block_set_spill(home->img, (unsigned)(b - h));
            home->dirty = true;
        }
        return KV_OK;
    }
    snprintf(t->msg, sizeof(t->msg),
             "block %llu and its %u probe blocks are full: the store needs more blocks "
             "(--kallax-blocks / --kallax-gb)",
             (unsigned long long)h, kx->o.probe);
    return KV_RESOURCE_EXHAUSTED;
}

/* Applies one record (the newest of its key in the run). */
static kv_err apply_rec(kx_tab *t, const lsm_rec *r)
{
    kallax *kx = t->kx;
    uint64_t h = kallax_home(kx, r->key, r->klen);
    kx_tblock *at;
    kx_slot s;
    kv_err rv = locate(t, h, r, &at, &s);
    if (rv != KV_OK || (at && s.seqno > r->seqno))
        return rv; /* error, or the stored record is newer */
    uint64_t from = h, placed;
    if (at) {
        from = at->blk;
        kx_block_remove(at->img, &s);
        at->dirty = true;
    }
    if (gc_now(kx, r, t->now))
        return KV_OK;
    bool ext;
    uint64_t page = 0;
    uint32_t crc = 0;
    if ((rv = make_extent(t, r, &ext, &page, &crc)) != KV_OK)
        return rv;
    if ((rv = place(t, h, from, r, ext, page, crc, &placed)) != KV_OK)
        return rv;
    if (at && placed != from) {
        t->moved = true;
        atomic_fetch_add_explicit(&kx->moves, 1, memory_order_relaxed);
    }
    return KV_OK;
}

/* Shrinks the spill hint of home h to what its loaded window holds. */
static void exact_spill(kx_tab *t, uint64_t h)
{
    kx_tblock *home, *b;
    if (kx_tab_get(t, h, &home) != KV_OK)
        return;
    unsigned spill = kx_block_spill(home->img), far = 0;
    for (unsigned d = 1; d <= spill; d++) {
        if (kx_tab_get(t, h + d, &b) != KV_OK)
            return;
        size_t off = KX_HDR;
        for (unsigned i = 0; i < kx_block_count(b->img); i++) {
            kx_slot s;
            kx_block_next(b->img, &off, &s);
            if (kallax_home(t->kx, s.key, s.klen) == h)
                far = d;
        }
    }
    if (far != spill) {
        kx_block_set_spill(home->img, far);
        home->dirty = true;
    }
}

/* ---- the flush ---- */

typedef struct ord {
    const lsm_rec *r;
    uint64_t home;
} ord;

static int ord_cmp(const void *a, const void *b)
{
    const ord *x = a, *y = b;
    if (x->home != y->home)
        return x->home < y->home ? -1 : 1;
    int c = lsm_key_cmp(x->r->key, x->r->klen, y->r->key, y->r->klen);
    if (c)
        return c;
    return x->r->seqno > y->r->seqno ? -1 : x->r->seqno < y->r->seqno;
}

/* The run in (home, key, seqno descending) order, checked. */
static kv_err order_run(kallax *kx, const lsm_rec *recs, size_t n, uint64_t max_seqno, ord **out)
{
    ord *o = malloc((n ? n : 1) * sizeof(*o));
    if (!o)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        if (!lsm_rec_valid(&recs[i]) || recs[i].klen > KALLAX_MAX_KEY ||
            recs[i].seqno > max_seqno) {
            free(o);
            return KV_INVALID_ARGUMENT;
        }
        o[i] = (ord){&recs[i], kallax_home(kx, recs[i].key, recs[i].klen)};
    }
    if (n)
        qsort(o, n, sizeof(*o), ord_cmp);
    *out = o;
    return KV_OK;
}

static kv_err apply_run(kx_tab *t, const ord *o, size_t n)
{
    kv_err rv = KV_OK;
    for (size_t i = 0; i < n && rv == KV_OK; i++) {
        if (i && o[i].home == o[i - 1].home &&
            lsm_key_cmp(o[i].r->key, o[i].r->klen, o[i - 1].r->key, o[i - 1].r->klen) == 0)
            continue; /* an older record of the same key */
        rv = apply_rec(t, o[i].r);
        if (rv == KV_OK && (i + 1 == n || o[i + 1].home != o[i].home))
            exact_spill(t, o[i].home);
    }
    return rv;
}

static void fail_flush(kx_tab *t, kv_err rv)
{
    for (size_t i = 0; t->rounds == 0 && i + 1 < t->nnew; i += 2) /* no block refers to them */
        kx_ext_free_now(&t->kx->ext, t->newext[i], t->newext[i + 1]);
    KV_ERROR(KX_LOG, "%s: flush failed: %s%s%s", t->kx->vol.dir, kv_strerror(rv),
             t->msg[0] ? ": " : "", t->msg);
}

kv_err kallax_flush(kallax *kx, const lsm_rec *recs, size_t n, uint64_t max_seqno)
{
    ord *o = NULL;
    kv_err rv = order_run(kx, recs, n, max_seqno, &o);
    if (rv != KV_OK)
        return rv;
    kx_flush_lock(kx);
    if (max_seqno < kx->flushed_seq || (n == 0 && max_seqno == kx->flushed_seq)) {
        kx_flush_unlock(kx);
        free(o);
        return max_seqno < kx->flushed_seq ? KV_INVALID_ARGUMENT : KV_OK;
    }
    rv = lsm_wal_rotate(kx->wal, kx->wal_number++);
    kx_tab t = {.kx = kx, .now = kv_clock_ms(kx->o.clock, kx->o.clock_arg)};
    if (rv == KV_OK)
        rv = apply_run(&t, o, n);
    if (rv == KV_OK)
        rv = kx_commit(&t, max_seqno);
    if (rv != KV_OK)
        fail_flush(&t, rv);
    kx_tab_free(&t);
    kx_flush_unlock(kx);
    free(o);
    if (rv == KV_OK) {
        lsm_wal_release(kx->wal, max_seqno);
        atomic_fetch_add(&kx->flushes, 1);
    }
    return rv;
}

/* ---- cleanup ---- */

/* Removes the rejected records of block blk (read in img) into the table. */
static kv_err clean_block(kx_tab *t, uint64_t blk, const uint8_t *img, lsm_keep_fn keep, void *arg,
                          uint64_t *dropped)
{
    size_t off = KX_HDR;
    bool any = false;
    for (unsigned i = 0; i < kx_block_count(img) && !any; i++) {
        kx_slot s;
        kx_block_next(img, &off, &s);
        any = !keep(arg, s.key, s.klen);
    }
    if (!any)
        return KV_OK;
    kx_tblock *b;
    kv_err rv = kx_tab_get(t, blk, &b);
    off = KX_HDR;
    for (unsigned i = 0; rv == KV_OK && i < kx_block_count(b->img);) {
        kx_slot s;
        size_t at = off;
        kx_block_next(b->img, &off, &s);
        if (keep(arg, s.key, s.klen)) {
            i++;
            continue;
        }
        kx_block_remove(b->img, &s);
        b->dirty = true;
        off = at;
        (*dropped)++;
    }
    return rv;
}

kv_err kallax_cleanup(kallax *kx, lsm_keep_fn keep, void *arg, uint64_t *dropped)
{
    if (!keep)
        return KV_INVALID_ARGUMENT;
    uint8_t *img = malloc(KALLAX_BLOCK);
    if (!img)
        return KV_RESOURCE_EXHAUSTED;
    uint64_t d = 0;
    kv_err rv = KV_OK;
    kx_flush_lock(kx);
    kx_tab t = {.kx = kx, .now = kv_clock_ms(kx->o.clock, kx->o.clock_arg)};
    for (uint64_t b = 0; b < kx->nblocks && rv == KV_OK; b++) {
        rv = kx_read_block(kx, b, img);
        if (rv == KV_OK)
            rv = clean_block(&t, b, img, keep, arg, &d);
        if (rv == KV_OK && (t.n >= kx->o.journal_blocks || b + 1 == kx->nblocks)) {
            rv = kx_commit(&t, kx->flushed_seq);
            kx_tab_free(&t);
            t = (kx_tab){.kx = kx, .now = kv_clock_ms(kx->o.clock, kx->o.clock_arg)};
        }
    }
    kx_tab_free(&t);
    atomic_fetch_add(&kx->flush_gen, 1);
    kx_flush_unlock(kx);
    free(img);
    KV_INFO(KX_LOG, "%s: cleanup dropped %llu records%s%s", kx->vol.dir, (unsigned long long)d,
            rv == KV_OK ? "" : ", then failed: ", rv == KV_OK ? "" : kv_strerror(rv));
    if (rv == KV_OK && dropped)
        *dropped = d;
    return rv;
}

/* ==== extents ==== */

/*
 * kallax extents: values too big to keep inline live in EXTENTS, in runs of
 * 4 KiB pages. The free map is a bitmap (1 = used), rebuilt at open from the
 * references in the blocks and never stored. Allocation is first fit from a
 * rotating cursor; when no run fits, the map (and the file, by writing past
 * its end) grows. A freed run goes through two queues: `pending` (dropped by
 * the flush running now) and `deferred` (dropped by the previous flush);
 * each completed flush frees `deferred` and moves `pending` there. So pages
 * are reused only after the blocks that dropped them are synced and a whole
 * flush later, which gives a reader that read an old block time to read its
 * extent (and a reader that loses the race sees a crc mismatch and retries).
 * Every function takes the map's mutex; the flush is the only allocator.
 */

static bool bit(const kx_extmap *m, uint64_t p)
{
    return (m->bits[p / 64] >> (p % 64)) & 1u;
}

static void set_bits(kx_extmap *m, uint64_t p, uint64_t n, bool on)
{
    for (uint64_t i = p; i < p + n; i++) {
        if (on)
            m->bits[i / 64] |= 1ull << (i % 64);
        else
            m->bits[i / 64] &= ~(1ull << (i % 64));
    }
}

/* Grows the map to hold at least npages (mu held). */
static kv_err grow(kx_extmap *m, uint64_t npages)
{
    if (npages <= m->npages)
        return KV_OK;
    uint64_t n = m->npages ? m->npages : 256;
    while (n < npages)
        n *= 2;
    uint64_t *b = realloc(m->bits, (size_t)(n / 64) * sizeof(*b));
    if (!b)
        return KV_RESOURCE_EXHAUSTED;
    memset(b + m->npages / 64, 0, (size_t)((n - m->npages) / 64) * sizeof(*b));
    m->bits = b;
    m->npages = n;
    return KV_OK;
}

kv_err kx_ext_init(kx_extmap *m, uint64_t npages)
{
    memset(m, 0, sizeof(*m));
    pthread_mutex_init(&m->mu, NULL);
    kv_err rv = grow(m, npages ? npages : 256);
    if (rv != KV_OK)
        kx_ext_fini(m);
    return rv;
}

void kx_ext_fini(kx_extmap *m)
{
    free(m->bits);
    free(m->pending);
    free(m->deferred);
    pthread_mutex_destroy(&m->mu);
    memset(m, 0, sizeof(*m));
}

kv_err kx_ext_mark(kx_extmap *m, uint64_t page, uint64_t n)
{
    pthread_mutex_lock(&m->mu);
    kv_err rv = grow(m, page + n);
    if (rv == KV_OK) {
        for (uint64_t i = page; i < page + n; i++)
            m->used += !bit(m, i);
        set_bits(m, page, n, true);
    }
    pthread_mutex_unlock(&m->mu);
    return rv;
}

/* First run of n free pages at or after from, below to; UINT64_MAX if none. */
static uint64_t find_run(const kx_extmap *m, uint64_t from, uint64_t to, uint64_t n)
{
    uint64_t run = 0;
    for (uint64_t p = from; p < to; p++) {
        if (p % 64 == 0 && run == 0 && m->bits[p / 64] == ~0ull && p + 64 <= to) {
            p += 63; /* a full word: skip it */
            continue;
        }
        run = bit(m, p) ? 0 : run + 1;
        if (run == n)
            return p + 1 - n;
    }
    return UINT64_MAX;
}

kv_err kx_ext_alloc(kx_extmap *m, uint64_t n, uint64_t *page)
{
    pthread_mutex_lock(&m->mu);
    uint64_t p = find_run(m, m->cursor, m->npages, n);
    if (p == UINT64_MAX)
        p = find_run(m, 0, m->cursor + n < m->npages ? m->cursor + n : m->npages, n);
    kv_err rv = KV_OK;
    if (p == UINT64_MAX) { /* no room: grow past the end of the last used page */
        uint64_t end = m->npages;
        while (end > 0 && !bit(m, end - 1))
            end--;
        p = end;
        rv = grow(m, end + n);
    }
    if (rv == KV_OK) {
        set_bits(m, p, n, true);
        m->used += n;
        m->cursor = p + n;
        *page = p;
    }
    pthread_mutex_unlock(&m->mu);
    return rv;
}

static kv_err push(uint64_t **arr, uint64_t *n, uint64_t *cap, uint64_t page, uint64_t len)
{
    if (*n + 2 > *cap) {
        uint64_t c = *cap ? *cap * 2 : 64;
        uint64_t *a = realloc(*arr, (size_t)c * sizeof(*a));
        if (!a)
            return KV_RESOURCE_EXHAUSTED;
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = page;
    (*arr)[(*n)++] = len;
    return KV_OK;
}

kv_err kx_ext_free_later(kx_extmap *m, uint64_t page, uint64_t n)
{
    pthread_mutex_lock(&m->mu);
    kv_err rv = push(&m->pending, &m->npending, &m->cappending, page, n);
    pthread_mutex_unlock(&m->mu);
    return rv;
}

void kx_ext_free_now(kx_extmap *m, uint64_t page, uint64_t n)
{
    pthread_mutex_lock(&m->mu);
    if (page + n <= m->npages) {
        set_bits(m, page, n, false);
        m->used -= n;
    }
    pthread_mutex_unlock(&m->mu);
}

void kx_ext_flush_done(kx_extmap *m)
{
    pthread_mutex_lock(&m->mu);
    for (uint64_t i = 0; i + 1 < m->ndeferred; i += 2) {
        uint64_t p = m->deferred[i], n = m->deferred[i + 1];
        if (p + n <= m->npages) {
            set_bits(m, p, n, false);
            m->used -= n;
        }
    }
    uint64_t *d = m->deferred, cap = m->capdeferred;
    m->deferred = m->pending;
    m->ndeferred = m->npending;
    m->capdeferred = m->cappending;
    m->pending = d;
    m->npending = 0;
    m->cappending = cap;
    pthread_mutex_unlock(&m->mu);
}

void kx_ext_counts(kx_extmap *m, uint64_t *pages, uint64_t *used, uint64_t *mem)
{
    pthread_mutex_lock(&m->mu);
    *pages = m->npages;
    *used = m->used;
    *mem = m->npages / 8 + (m->cappending + m->capdeferred) * sizeof(uint64_t);
    pthread_mutex_unlock(&m->mu);
}

kv_err kx_ext_write(kallax *kx, uint64_t page, const void *val, size_t len)
{
    size_t padded = (size_t)kx_ext_pages(len) * KALLAX_BLOCK;
    uint8_t *buf = calloc(1, padded);
    if (!buf)
        return KV_RESOURCE_EXHAUSTED;
    if (len)
        memcpy(buf, val, len);
    kv_err rv = lsm_vol_write(&kx->vol, kx->ext_fd, buf, padded, page * KALLAX_BLOCK, false);
    free(buf);
    if (rv != KV_OK)
        KV_ERROR(KX_LOG, "%s/EXTENTS: write of %zu bytes at page %llu: %s", kx->vol.dir, padded,
                 (unsigned long long)page, kv_strerror(rv));
    return rv;
}
