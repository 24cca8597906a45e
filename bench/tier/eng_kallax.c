/* SPDX-License-Identifier: MIT */
/*
 * tier_bench adapter for the kallax store (node/kallax) on one volume
 * (--fast-dir), bare: the node's engine over kallax is "hotkv-kallax"
 * (eng_hotkv.c). This adapter keeps the records not yet flushed in a small
 * write buffer of its own (the role HotRing's dirty items play in the
 * engine), as KallaxDB has no cache: a write goes to kallax's WAL,
 * then into the active buffer; when the buffer passes --write-buffer-mb a
 * flush thread swaps in an empty one and applies the full one to the blocks
 * with kallax_flush. There is no read cache (a read of a flushed record is
 * one block read, as KallaxDB's), so compare it with the other engines at a
 * small --mem-mb. The seqno bound of a flush is picked under the apply lock
 * that writers hold shared from seqno to buffer insert (as engine_bg.c).
 * --kallax-blocks sets the store's size; 0 = four times the loaded records'
 * bytes (a load of ~25%, where few records spill with KiB values: kallax.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/tier/tier_bench.h"
#include "common/hash.h"
#include "node/kallax/kallax.h"

#define NB (1u << 16)

typedef struct kent {
    struct kent *next;
    uint64_t seq;
    size_t klen, vlen;
    uint8_t data[]; /* key, value */
} kent;

typedef struct ktab {
    kent *b[NB];
    size_t n;
    uint64_t bytes;
} ktab;

typedef struct kb {
    kallax *kx;
    pthread_rwlock_t apply;
    pthread_mutex_t mu; /* active, imm, stop; pairs with cv */
    pthread_cond_t cv;
    ktab *active, *imm;
    bool stop;
    pthread_t flusher;
    uint64_t buffer;
    _Atomic uint64_t next_seq, reads_mem, reads_fd, reads_miss, stalls;
    kv_err flush_err;
} kb;

static kent *tab_find(ktab *t, const void *key, size_t klen)
{
    kent *e = t ? t->b[kv_hash64(key, klen, 1) % NB] : NULL;
    while (e && (e->klen != klen || memcmp(e->data, key, klen) != 0))
        e = e->next;
    return e;
}

/* Inserts a copy of the record (mu held); the previous one of the key goes. */
static kv_err tab_put(ktab *t, const void *key, size_t klen, const void *val, size_t vlen,
                      uint64_t seq)
{
    kent *e = malloc(sizeof(*e) + klen + vlen);
    if (!e)
        return KV_RESOURCE_EXHAUSTED;
    *e = (kent){.seq = seq, .klen = klen, .vlen = vlen};
    memcpy(e->data, key, klen);
    memcpy(e->data + klen, val, vlen);
    kent **p = &t->b[kv_hash64(key, klen, 1) % NB];
    for (; *p; p = &(*p)->next)
        if ((*p)->klen == klen && memcmp((*p)->data, key, klen) == 0) {
            kent *old = *p;
            e->next = old->next;
            t->bytes -= old->klen + old->vlen;
            free(old);
            *p = e;
            t->bytes += klen + vlen;
            return KV_OK;
        }
    e->next = NULL;
    *p = e;
    t->n++;
    t->bytes += klen + vlen;
    return KV_OK;
}

static void tab_free(ktab *t)
{
    for (size_t i = 0; t && i < NB; i++)
        for (kent *e = t->b[i], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    free(t);
}

/* Applies the immutable buffer to the store. */
static kv_err flush_imm(kb *k, ktab *t, uint64_t max_seq)
{
    lsm_rec *run = malloc((t->n ? t->n : 1) * sizeof(*run));
    if (!run)
        return KV_RESOURCE_EXHAUSTED;
    size_t n = 0;
    for (size_t i = 0; i < NB; i++)
        for (kent *e = t->b[i]; e; e = e->next)
            run[n++] = (lsm_rec){.key = e->data,
                                 .klen = e->klen,
                                 .value = e->data + e->klen,
                                 .vlen = e->vlen,
                                 .version = e->seq,
                                 .seqno = e->seq,
                                 .type = LSM_PUT};
    kv_err rv = kallax_flush(k->kx, run, n, max_seq);
    free(run);
    return rv;
}

static void *flusher_main(void *arg)
{
    kb *k = arg;
    pthread_mutex_lock(&k->mu);
    while (!k->stop) {
        if (k->active->bytes < k->buffer) {
            pthread_cond_wait(&k->cv, &k->mu);
            continue;
        }
        pthread_mutex_unlock(&k->mu);
        pthread_rwlock_wrlock(&k->apply); /* every seqno handed out is in a buffer */
        uint64_t s = atomic_load(&k->next_seq) - 1;
        ktab *fresh = calloc(1, sizeof(*fresh));
        pthread_mutex_lock(&k->mu);
        if (fresh) {
            k->imm = k->active;
            k->active = fresh;
        }
        pthread_mutex_unlock(&k->mu);
        pthread_rwlock_unlock(&k->apply);
        kv_err rv = fresh ? flush_imm(k, k->imm, s) : KV_RESOURCE_EXHAUSTED;
        pthread_mutex_lock(&k->mu);
        if (rv == KV_OK) {
            tab_free(k->imm);
            k->imm = NULL;
        } else {
            fprintf(stderr, "tier_bench: kallax: flush: %s\n", kv_strerror(rv));
            k->flush_err = rv;
            k->stop = true;
        }
        pthread_cond_broadcast(&k->cv);
    }
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* Records the store's WAL still holds (a run that ended unflushed) go back
 * into the buffer. */
static kv_err kb_replay(void *arg, const lsm_rec *r)
{
    kb *k = arg;
    return r->type == LSM_PUT ? tab_put(k->active, r->key, r->klen, r->value, r->vlen, r->seqno)
                              : KV_OK;
}

uint64_t tb_kallax_blocks(const tb_opts *o)
{
    if (o->kallax_blocks)
        return (uint64_t)o->kallax_blocks;
    uint64_t rec = 31 + 8 + (uint64_t)(o->value_size < 2018 ? o->value_size : 16);
    uint64_t b = (uint64_t)o->records * rec * 4 / 4080 + 64; /* ~25% load: kallax.h */
    return b;
}

static kv_err kb_open(const tb_opts *o, void **h, char *err, size_t errlen)
{
    kb *k = calloc(1, sizeof(*k));
    if (!k || !(k->active = calloc(1, sizeof(*k->active)))) {
        free(k);
        return KV_RESOURCE_EXHAUSTED;
    }
    kallax_opts ko;
    kallax_opts_default(&ko);
    ko.dir = o->fast_dir;
    ko.blocks = tb_kallax_blocks(o);
    ko.sync = o->sync_idx == TB_SYNC_ALWAYS  ? LSM_SYNC_ALWAYS
              : o->sync_idx == TB_SYNC_BATCH ? LSM_SYNC_BATCH
                                             : LSM_SYNC_NONE;
    ko.sync_ms = (unsigned)o->sync_ms;
    kv_err rv = kallax_open(&k->kx, &ko, kb_replay, k);
    if (rv != KV_OK) {
        snprintf(err, errlen, "cannot open the kallax store in %s (see the log)", o->fast_dir);
        free(k->active);
        free(k);
        return rv;
    }
    k->buffer = (uint64_t)o->write_buffer_mb << 20;
    atomic_store(&k->next_seq, kallax_last_seqno(k->kx) + 1);
    pthread_rwlock_init(&k->apply, NULL);
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cv, NULL);
    pthread_create(&k->flusher, NULL, flusher_main, k);
    *h = k;
    return KV_OK;
}

static void kb_close(void *h)
{
    kb *k = h;
    pthread_mutex_lock(&k->mu);
    k->stop = true;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_join(k->flusher, NULL);
    uint64_t s = atomic_load(&k->next_seq) - 1; /* no writer runs: flush what is left */
    if (k->imm && flush_imm(k, k->imm, s) != KV_OK)
        fprintf(stderr, "tier_bench: kallax: final flush failed (the WAL keeps it)\n");
    else if (k->active->n && flush_imm(k, k->active, s) != KV_OK)
        fprintf(stderr, "tier_bench: kallax: final flush failed (the WAL keeps it)\n");
    kallax_close(k->kx);
    tab_free(k->active);
    tab_free(k->imm);
    pthread_rwlock_destroy(&k->apply);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cv);
    free(k);
}

static void kb_noop(void *h)
{
    (void)h;
}

static kv_err kb_put(void *h, const void *key, size_t klen, const void *val, size_t vlen)
{
    kb *k = h;
    pthread_mutex_lock(&k->mu);
    while (!k->stop && k->active->bytes >= 2 * k->buffer) { /* back-pressure */
        atomic_fetch_add_explicit(&k->stalls, 1, memory_order_relaxed);
        pthread_cond_wait(&k->cv, &k->mu);
    }
    kv_err rv = k->flush_err;
    pthread_mutex_unlock(&k->mu);
    if (rv != KV_OK)
        return rv;
    pthread_rwlock_rdlock(&k->apply);
    uint64_t seq = atomic_fetch_add(&k->next_seq, 1);
    lsm_rec r = {.key = key,
                 .klen = klen,
                 .value = val,
                 .vlen = vlen,
                 .version = seq,
                 .seqno = seq,
                 .type = LSM_PUT};
    rv = kallax_wal_append(k->kx, &r, 1);
    pthread_mutex_lock(&k->mu);
    if (rv == KV_OK)
        rv = tab_put(k->active, key, klen, val, vlen, seq);
    if (k->active->bytes >= k->buffer)
        pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    pthread_rwlock_unlock(&k->apply);
    return rv;
}

static kv_err kb_get(void *h, const void *key, size_t klen, bool *found)
{
    kb *k = h;
    pthread_mutex_lock(&k->mu);
    kent *e = tab_find(k->active, key, klen);
    e = e ? e : tab_find(k->imm, key, klen);
    pthread_mutex_unlock(&k->mu);
    if (e) { /* the benchmark only needs found; nothing of e is read after the unlock */
        atomic_fetch_add_explicit(&k->reads_mem, 1, memory_order_relaxed);
        *found = true;
        return KV_OK;
    }
    lsm_rec r;
    kv_err rv = kallax_get(k->kx, key, klen, &r);
    if (rv == KV_NOT_FOUND) {
        atomic_fetch_add_explicit(&k->reads_miss, 1, memory_order_relaxed);
        *found = false;
        return KV_OK;
    }
    if (rv != KV_OK)
        return rv;
    atomic_fetch_add_explicit(&k->reads_fd, 1, memory_order_relaxed);
    *found = r.type == LSM_PUT;
    lsm_rec_free(&r);
    return KV_OK;
}

static void kb_stats(void *h, tb_stats *out)
{
    kb *k = h;
    kallax_stats s;
    memset(out, 0, sizeof(*out));
    kallax_stats_get(k->kx, &s);
    out->reads_mem = atomic_load(&k->reads_mem);
    out->reads_fd = atomic_load(&k->reads_fd);
    out->reads_miss = atomic_load(&k->reads_miss);
    uint64_t written = s.wal_bytes + s.journal_bytes + s.block_writes * KALLAX_BLOCK;
    out->write_amp = s.user_bytes ? (double)written / (double)s.user_bytes : -1.0;
    out->written_bytes = written;
    out->user_bytes = s.user_bytes;
    out->have_index_mem = true;
    out->index_mem = s.index_mem_bytes;
}

static bool kb_settled(void *h)
{
    kb *k = h;
    pthread_mutex_lock(&k->mu);
    bool idle = !k->imm && k->active->bytes < k->buffer;
    pthread_mutex_unlock(&k->mu);
    return idle;
}

static void kb_json_extra(void *h, char *buf, size_t len)
{
    kb *k = h;
    kallax_stats s;
    kallax_stats_get(k->kx, &s);
    snprintf(buf, len,
             ",\"kallax\":{\"blocks\":%llu,\"records\":%llu,\"load\":%.3f,\"spilled\":%llu,"
             "\"block_reads\":%llu,\"spill_reads\":%llu,\"block_writes\":%llu,"
             "\"journal_bytes\":%llu,\"flushes\":%llu,\"write_stalls\":%llu}",
             (unsigned long long)s.blocks, (unsigned long long)s.records, s.load,
             (unsigned long long)s.spilled, (unsigned long long)s.block_reads,
             (unsigned long long)s.spill_reads, (unsigned long long)s.block_writes,
             (unsigned long long)s.journal_bytes, (unsigned long long)s.flushes,
             (unsigned long long)atomic_load(&k->stalls));
}

const tb_engine tb_kallax_engine = {
    "kallax", kb_open, kb_close, kb_noop,  kb_noop,    kb_noop,
    kb_noop,  kb_put,  kb_get,   kb_stats, kb_settled, kb_json_extra,
};
