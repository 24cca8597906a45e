/* SPDX-License-Identifier: MIT */
/*
 * Merging iteration over sorted sources (iter.h): the SST source, the
 * level-concatenating source (LevelDB's two-level iterator: a sorted level
 * is one source that opens each file's read-ahead iterator only when it
 * reaches it), the heap merger (LevelDB's MergingIterator, with a binary
 * heap: O(log n) per step) and, on top of them, the public lsm_iter over a
 * pinned version, which returns the newest record of each key. Compaction
 * (compact.c) and RALT's run merges (ralt.c) use the same merger.
 */
#include <stdlib.h>

#include "common/log.h"
#include "node/lsm/iter.h"

/* ---- one SST ---- */

static void sst_close_it(lsm_sst_src *s)
{
    if (!s->open)
        return;
    s->bytes += s->it.bytes_read;
    lsm_sst_iter_fini(&s->it);
    s->open = false;
}

static void sst_first(lsm_src *b)
{
    lsm_sst_src *s = (lsm_sst_src *)b;
    sst_close_it(s);
    lsm_sst_iter_init(&s->it, s->sst);
    s->open = true;
}

static void sst_seek(lsm_src *b, const void *key, size_t klen)
{
    lsm_sst_src *s = (lsm_sst_src *)b;
    sst_close_it(s);
    lsm_sst_iter_seek(&s->it, s->sst, key, klen);
    s->open = true;
}

static void sst_next(lsm_src *b)
{
    lsm_sst_iter_next(&((lsm_sst_src *)b)->it);
}

static const lsm_rec *sst_cur(const lsm_src *b)
{
    return &((const lsm_sst_src *)b)->it.cur;
}

static bool sst_valid(const lsm_src *b)
{
    const lsm_sst_src *s = (const lsm_sst_src *)b;
    return s->open && s->it.valid;
}

static kv_err sst_error(const lsm_src *b, const char **file)
{
    const lsm_sst_src *s = (const lsm_sst_src *)b;
    kv_err rv = s->open ? s->it.err : KV_OK;
    if (file)
        *file = rv != KV_OK ? lsm_sst_path(s->sst) : NULL;
    return rv;
}

static uint64_t sst_bytes(const lsm_src *b)
{
    const lsm_sst_src *s = (const lsm_sst_src *)b;
    return s->bytes + (s->open ? s->it.bytes_read : 0);
}

static void sst_fini(lsm_src *b)
{
    sst_close_it((lsm_sst_src *)b);
}

static const lsm_src_ops sst_ops = {sst_first, sst_seek,  sst_next,  sst_cur,
                                    sst_valid, sst_error, sst_bytes, sst_fini};

void lsm_sst_src_init(lsm_sst_src *s, lsm_sst *sst, int rank)
{
    memset(s, 0, sizeof(*s));
    s->base = (lsm_src){&sst_ops, rank};
    s->sst = sst;
}

/* ---- a sorted level, file after file ---- */

size_t lsm_level_find(lsm_file *const *files, size_t n, const void *key, size_t klen)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (lsm_key_cmp(files[mid]->largest, files[mid]->llen, key, klen) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Past the end of the open file (and no error): on to the next files. */
static void level_skip_ended(lsm_level_src *s)
{
    while (!sst_valid(&s->cur.base) && sst_error(&s->cur.base, NULL) == KV_OK && s->i + 1 < s->n) {
        s->cur.sst = s->files[++s->i]->sst;
        sst_first(&s->cur.base);
    }
}

/* Opens files[i] at its first record, or at key when key is not NULL. */
static void level_open(lsm_level_src *s, size_t i, const void *key, size_t klen)
{
    s->i = i;
    s->cur.sst = s->files[i]->sst;
    if (key)
        sst_seek(&s->cur.base, key, klen);
    else
        sst_first(&s->cur.base);
    level_skip_ended(s);
}

static void level_first(lsm_src *b)
{
    lsm_level_src *s = (lsm_level_src *)b;
    sst_close_it(&s->cur);
    if (s->n)
        level_open(s, 0, NULL, 0);
}

static void level_seek(lsm_src *b, const void *key, size_t klen)
{
    lsm_level_src *s = (lsm_level_src *)b;
    sst_close_it(&s->cur);
    size_t i = lsm_level_find(s->files, s->n, key, klen);
    if (i < s->n)
        level_open(s, i, key, klen);
}

static void level_next(lsm_src *b)
{
    lsm_level_src *s = (lsm_level_src *)b;
    sst_next(&s->cur.base);
    level_skip_ended(s);
}

static const lsm_rec *level_cur(const lsm_src *b)
{
    return sst_cur(&((const lsm_level_src *)b)->cur.base);
}

static bool level_valid(const lsm_src *b)
{
    return sst_valid(&((const lsm_level_src *)b)->cur.base);
}

static kv_err level_error(const lsm_src *b, const char **file)
{
    return sst_error(&((const lsm_level_src *)b)->cur.base, file);
}

static uint64_t level_bytes(const lsm_src *b)
{
    return sst_bytes(&((const lsm_level_src *)b)->cur.base);
}

static void level_fini(lsm_src *b)
{
    sst_close_it(&((lsm_level_src *)b)->cur);
}

static const lsm_src_ops level_ops = {level_first, level_seek,  level_next,  level_cur,
                                      level_valid, level_error, level_bytes, level_fini};

void lsm_level_src_init(lsm_level_src *s, lsm_file *const *files, size_t n, int rank)
{
    memset(s, 0, sizeof(*s));
    s->base = (lsm_src){&level_ops, rank};
    s->files = files;
    s->n = n;
}

/* ---- the heap merger ---- */

/* Key ascending, seqno descending, rank ascending, index ascending. */
static int merge_cmp(const lsm_merge *m, size_t a, size_t b)
{
    const lsm_src *x = m->src[a], *y = m->src[b];
    const lsm_rec *p = x->ops->cur(x), *q = y->ops->cur(y);
    int c = lsm_key_cmp(p->key, p->klen, q->key, q->klen);
    if (c)
        return c;
    if (p->seqno != q->seqno)
        return p->seqno > q->seqno ? -1 : 1;
    if (x->rank != y->rank)
        return x->rank < y->rank ? -1 : 1;
    return a < b ? -1 : a > b;
}

static void sift_down(lsm_merge *m, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < m->nheap && merge_cmp(m, m->heap[l], m->heap[s]) < 0)
            s = l;
        if (r < m->nheap && merge_cmp(m, m->heap[r], m->heap[s]) < 0)
            s = r;
        if (s == i)
            return;
        size_t t = m->heap[i];
        m->heap[i] = m->heap[s];
        m->heap[s] = t;
        i = s;
    }
}

/* After source i moved: false (and the merger stopped) when it failed. */
static bool merge_check(lsm_merge *m, size_t i)
{
    const lsm_src *s = m->src[i];
    kv_err rv = s->ops->error(s, NULL);
    if (rv == KV_OK)
        return true;
    m->err = rv;
    m->bad = i;
    m->nheap = 0;
    return false;
}

/* Heapifies the positioned sources. */
static void merge_build(lsm_merge *m)
{
    m->nheap = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (!merge_check(m, i))
            return;
        if (m->src[i]->ops->valid(m->src[i]))
            m->heap[m->nheap++] = i;
    }
    for (size_t i = m->nheap / 2; i-- > 0;)
        sift_down(m, i);
}

kv_err lsm_merge_init(lsm_merge *m, lsm_src **src, size_t n)
{
    *m = (lsm_merge){.src = src, .n = n};
    m->heap = malloc((n ? n : 1) * sizeof(*m->heap));
    return m->heap ? KV_OK : KV_RESOURCE_EXHAUSTED;
}

void lsm_merge_first(lsm_merge *m)
{
    m->err = KV_OK;
    for (size_t i = 0; i < m->n; i++)
        m->src[i]->ops->first(m->src[i]);
    merge_build(m);
}

void lsm_merge_seek(lsm_merge *m, const void *key, size_t klen)
{
    m->err = KV_OK;
    for (size_t i = 0; i < m->n; i++)
        m->src[i]->ops->seek(m->src[i], key, klen);
    merge_build(m);
}

void lsm_merge_next(lsm_merge *m)
{
    size_t t = m->heap[0];
    lsm_src *s = m->src[t];
    s->ops->next(s);
    if (!merge_check(m, t))
        return;
    if (!s->ops->valid(s))
        m->heap[0] = m->heap[--m->nheap];
    if (m->nheap)
        sift_down(m, 0);
}

bool lsm_merge_valid(const lsm_merge *m)
{
    return m->err == KV_OK && m->nheap > 0;
}

const lsm_rec *lsm_merge_cur(const lsm_merge *m)
{
    const lsm_src *s = m->src[m->heap[0]];
    return s->ops->cur(s);
}

size_t lsm_merge_top(const lsm_merge *m)
{
    return m->heap[0];
}

kv_err lsm_merge_error(const lsm_merge *m, size_t *src, const char **file)
{
    if (m->err != KV_OK) {
        if (src)
            *src = m->bad;
        if (file)
            m->src[m->bad]->ops->error(m->src[m->bad], file);
    }
    return m->err;
}

uint64_t lsm_merge_bytes(const lsm_merge *m)
{
    uint64_t b = 0;
    for (size_t i = 0; i < m->n; i++)
        b += m->src[i]->ops->bytes_read(m->src[i]);
    return b;
}

void lsm_merge_fini(lsm_merge *m)
{
    for (size_t i = 0; i < m->n; i++)
        m->src[i]->ops->fini(m->src[i]);
    free(m->heap);
    m->heap = NULL;
    m->nheap = 0;
}

/* ---- the public iterator ---- */

struct lsm_iter {
    lsm_version *v;  /* pinned: its files stay open and on disk */
    lsm_sst_src *l0; /* one source per L0 file */
    lsm_level_src lv[LSM_MAX_LEVELS];
    lsm_src **ps;
    lsm_merge m;
    lsm_buf key;      /* the current key, to skip its older versions */
    kv_err err;       /* sticky */
    const char *file; /* the file that failed, NULL when none */
};

kv_err lsm_iter_open(lsm_db *db, lsm_iter **out)
{
    lsm_iter *it = calloc(1, sizeof(*it));
    if (!it)
        return KV_RESOURCE_EXHAUSTED;
    it->v = lsm_db_current(db);
    size_t n0 = it->v->nfiles[0], n = 0;
    it->l0 = calloc(n0 ? n0 : 1, sizeof(*it->l0));
    it->ps = calloc(n0 + LSM_MAX_LEVELS, sizeof(*it->ps));
    kv_err rv = it->l0 && it->ps ? KV_OK : KV_RESOURCE_EXHAUSTED;
    /* L0 newest file first: a promoted copy and its original share a seqno
     * (and a value), and the rank decides which one is returned */
    for (size_t i = 0; rv == KV_OK && i < n0; i++, n++) {
        lsm_sst_src_init(&it->l0[i], it->v->files[0][n0 - 1 - i]->sst, (int)n);
        it->ps[n] = &it->l0[i].base;
    }
    for (int l = 1; rv == KV_OK && l < LSM_MAX_LEVELS; l++) {
        if (!it->v->nfiles[l])
            continue;
        lsm_level_src_init(&it->lv[l], it->v->files[l], it->v->nfiles[l], (int)n);
        it->ps[n++] = &it->lv[l].base;
    }
    if (rv == KV_OK)
        rv = lsm_merge_init(&it->m, it->ps, n);
    if (rv != KV_OK) {
        lsm_iter_close(it);
        return rv;
    }
    *out = it;
    return KV_OK;
}

void lsm_iter_close(lsm_iter *it)
{
    if (!it)
        return;
    if (it->m.src)
        lsm_merge_fini(&it->m);
    lsm_buf_free(&it->key);
    free(it->l0);
    free(it->ps);
    lsm_version_unref(it->v);
    free(it);
}

/* The iterator's error, if any (sticky: a failed iterator stays failed). */
static kv_err iter_status(lsm_iter *it)
{
    if (it->err != KV_OK)
        return it->err;
    kv_err rv = lsm_merge_error(&it->m, NULL, &it->file);
    if (rv != KV_OK) {
        KV_ERROR(LSM_LOG, "iterator stopped: %s in %s", kv_err_name(rv),
                 it->file ? it->file : "(unknown file)");
        it->err = rv;
    }
    return rv;
}

static bool at_key(const lsm_iter *it, const void *key, size_t klen)
{
    if (!lsm_merge_valid(&it->m))
        return false;
    const lsm_rec *r = lsm_merge_cur(&it->m);
    return lsm_key_cmp(r->key, r->klen, key, klen) == 0;
}

kv_err lsm_iter_seek(lsm_iter *it, const void *after, size_t after_len)
{
    if (it->err != KV_OK)
        return it->err;
    if (!after) {
        lsm_merge_first(&it->m);
        return iter_status(it);
    }
    lsm_merge_seek(&it->m, after, after_len);
    while (at_key(it, after, after_len))
        lsm_merge_next(&it->m);
    return iter_status(it);
}

kv_err lsm_iter_next(lsm_iter *it)
{
    if (it->err != KV_OK || !lsm_merge_valid(&it->m))
        return iter_status(it);
    const lsm_rec *r = lsm_merge_cur(&it->m);
    it->key.len = 0;
    kv_err rv = lsm_buf_put(&it->key, r->key, r->klen);
    if (rv != KV_OK)
        return it->err = rv;
    do
        lsm_merge_next(&it->m);
    while (at_key(it, it->key.p, it->key.len));
    return iter_status(it);
}

const lsm_rec *lsm_iter_rec(const lsm_iter *it)
{
    return it->err == KV_OK && lsm_merge_valid(&it->m) ? lsm_merge_cur(&it->m) : NULL;
}

const char *lsm_iter_failed_file(const lsm_iter *it)
{
    return it->file;
}
