/* SPDX-License-Identifier: MIT */
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
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "node/kallax/kallax_int.h"

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
