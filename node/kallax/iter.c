/* SPDX-License-Identifier: MIT */
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
#include <stdlib.h>
#include <string.h>

#include "node/kallax/kallax_int.h"

#define CHUNK 64u

typedef struct irec {
    lsm_rec r;
    uint64_t home;
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

/* Copies slot s (home h) into the chunk's records. */
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
    if (rv == KV_OK && (s->flags & KX_F_EXTENT)) {
        kv_err e = kx_ext_read(it->kx, s, &x->r);
        if (e != KV_OK) { /* replaced meanwhile, or corrupt: look the key up afresh */
            lsm_rec fresh;
            e = kx_lookup(it->kx, s->key, s->klen, NULL, &fresh);
            lsm_rec_free(&x->r);
            if (e == KV_OK)
                x->r = fresh;
            rv = e;
        }
    }
    if (rv == KV_OK) {
        x->home = h;
        it->n++;
    }
    return rv == KV_NOT_FOUND ? KV_OK : rv;
}

/* Reads the chunk of homes [h0, h0 + CHUNK) and keeps their records. */
static kv_err load_chunk(kallax_iter *it, uint64_t h0)
{
    kallax *kx = it->kx;
    uint64_t hend = h0 + CHUNK < kx->o.blocks ? h0 + CHUNK : kx->o.blocks;
    uint64_t nb = hend - h0 + kx->o.probe;
    drop_recs(it);
    pthread_rwlock_rdlock(&kx->move_lock);
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
    pthread_rwlock_unlock(&kx->move_lock);
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
