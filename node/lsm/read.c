/* SPDX-License-Identifier: MIT */
/*
 * Point and batch lookups. A lookup pins the current version and walks the
 * levels top-down. Per level it gathers one probe (file, block) per pending
 * key: in L0 every file whose key range and bloom filter admit the key (the
 * highest seqno among them wins, since promoted records keep old seqnos), in
 * L1+ the one file whose range holds the key (the first level with a hit
 * wins). All probes of a level, for every key of a multiget, are submitted
 * to the volume layer as one batch (one io_uring submission). A probe whose
 * block is corrupt fails its key with DATA_LOSS (logged by sst.c) so a
 * lookup never returns data it cannot vouch for. Thread-safe: any thread
 * may call these; each uses its own ring.
 */
#include <stdlib.h>

#include "common/log.h"
#include "node/lsm/lsm_int.h"

typedef struct probe {
    size_t key;
    lsm_file *f;
    int blk;
} probe;

typedef struct lookup {
    size_t n;
    const void *const *keys;
    const size_t *klens;
    lsm_rec *tmp; /* best record so far (deep copies) */
    lsm_tier *tier;
    kv_err *err; /* KV_NOT_FOUND until found or failed */
    bool *done;
    probe *pr;
    lsm_io *io;
    size_t np, cap;
} lookup;

static kv_err add_probe(lookup *lk, size_t key, lsm_file *f)
{
    const void *k = lk->keys[key];
    size_t kl = lk->klens[key];
    if (!lsm_file_covers(f, k, kl) || !lsm_sst_may_contain(f->sst, k, kl))
        return KV_OK;
    int blk = lsm_sst_find_block(f->sst, k, kl);
    if (blk < 0)
        return KV_OK;
    if (lk->np == lk->cap) {
        size_t cap = lk->cap ? lk->cap * 2 : 16;
        probe *p = realloc(lk->pr, cap * sizeof(*p));
        if (p)
            lk->pr = p;
        lsm_io *io = realloc(lk->io, cap * sizeof(*io));
        if (io)
            lk->io = io;
        if (!p || !io)
            return KV_RESOURCE_EXHAUSTED;
        lk->cap = cap;
    }
    kv_err rv = lsm_sst_block_io(f->sst, blk, &lk->io[lk->np]);
    if (rv != KV_OK)
        return rv;
    lk->pr[lk->np++] = (probe){key, f, blk};
    return KV_OK;
}

/* Result of one probe folded into its key's state. */
static void take_probe(lookup *lk, size_t i)
{
    probe *p = &lk->pr[i];
    size_t k = p->key;
    if (lk->err[k] != KV_OK && lk->err[k] != KV_NOT_FOUND)
        return; /* already failed */
    kv_err rv = lsm_sst_block_check(p->f->sst, p->blk, &lk->io[i]);
    lsm_rec r;
    if (rv == KV_OK)
        rv = lsm_block_search(lk->io[i].buf, lk->io[i].len - 4, lk->keys[k], lk->klens[k], &r);
    if (rv == KV_NOT_FOUND)
        return;
    if (rv == KV_DATA_LOSS)
        KV_ERROR(LSM_LOG, "lookup: unreadable record in SST %06llu block %d",
                 (unsigned long long)p->f->number, p->blk);
    if (rv == KV_OK && lk->err[k] == KV_OK && r.seqno <= lk->tmp[k].seqno)
        return; /* an L0 file already gave a newer record */
    lsm_rec copy;
    if (rv == KV_OK)
        rv = lsm_rec_copy(&copy, &r);
    if (lk->err[k] == KV_OK)
        lsm_rec_free(&lk->tmp[k]);
    lk->err[k] = rv;
    if (rv == KV_OK) {
        lk->tmp[k] = copy;
        lk->tier[k] = p->f->tier;
    }
}

static void run_probes(lookup *lk)
{
    lsm_vol_read(lk->io, lk->np);
    for (size_t i = 0; i < lk->np; i++) {
        take_probe(lk, i);
        free(lk->io[i].buf);
    }
    lk->np = 0;
}

/* Index of the file of a sorted L1+ level whose largest key >= key. */
static size_t level_find(lsm_file *const *files, size_t n, const void *key, size_t klen)
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

static kv_err probe_level(lookup *lk, const lsm_version *v, int l)
{
    kv_err rv = KV_OK;
    for (size_t k = 0; k < lk->n && rv == KV_OK; k++) {
        if (lk->done[k])
            continue;
        if (l == 0) {
            for (size_t i = 0; i < v->nfiles[0] && rv == KV_OK; i++)
                rv = add_probe(lk, k, v->files[0][i]);
            continue;
        }
        size_t i = level_find(v->files[l], v->nfiles[l], lk->keys[k], lk->klens[k]);
        if (i < v->nfiles[l])
            rv = add_probe(lk, k, v->files[l][i]);
    }
    if (rv != KV_OK) {
        for (size_t i = 0; i < lk->np; i++)
            free(lk->io[i].buf);
        lk->np = 0;
        return rv;
    }
    run_probes(lk);
    for (size_t k = 0; k < lk->n; k++)
        lk->done[k] = lk->done[k] || lk->err[k] != KV_NOT_FOUND;
    return KV_OK;
}

static kv_err lookup_init(lookup *lk, size_t n)
{
    lk->n = n;
    lk->tmp = calloc(n, sizeof(*lk->tmp));
    lk->tier = calloc(n, sizeof(*lk->tier));
    lk->err = calloc(n, sizeof(*lk->err));
    lk->done = calloc(n, sizeof(*lk->done));
    if (!lk->tmp || !lk->tier || !lk->err || !lk->done)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++)
        lk->err[i] = KV_NOT_FOUND;
    return KV_OK;
}

static void lookup_fini(lookup *lk)
{
    free(lk->tmp);
    free(lk->tier);
    free(lk->err);
    free(lk->done);
    free(lk->pr);
    free(lk->io);
}

static void publish(lsm_db *db, lookup *lk, lsm_rec *outs, lsm_tier *served, kv_err *errs)
{
    for (size_t k = 0; k < lk->n; k++) {
        errs[k] = lk->err[k];
        if (lk->err[k] != KV_OK)
            continue;
        outs[k] = lk->tmp[k];
        if (served)
            served[k] = lk->tier[k];
        atomic_fetch_add(lk->tier[k] == LSM_TIER_SD ? &db->reads_sd : &db->reads_fd, 1);
    }
}

kv_err lsm_multiget(lsm_db *db, size_t n, const void *const *keys, const size_t *klens,
                    lsm_rec *outs, lsm_tier *served, kv_err *errs)
{
    if (n && (!keys || !klens || !outs || !errs))
        return KV_INVALID_ARGUMENT;
    lookup lk = {.keys = keys, .klens = klens};
    kv_err rv = lookup_init(&lk, n);
    for (size_t k = 0; rv == KV_OK && k < n; k++) {
        if (!keys[k] || klens[k] == 0 || klens[k] > LSM_MAX_KEY) {
            lk.err[k] = KV_INVALID_ARGUMENT;
            lk.done[k] = true;
        }
    }
    lsm_version *v = rv == KV_OK ? lsm_db_current(db) : NULL;
    for (int l = 0; rv == KV_OK && l < LSM_MAX_LEVELS; l++)
        if (v->nfiles[l])
            rv = probe_level(&lk, v, l);
    lsm_version_unref(v);
    if (rv == KV_OK) {
        publish(db, &lk, outs, served, errs);
    } else {
        for (size_t k = 0; k < n && lk.err; k++)
            if (lk.err[k] == KV_OK)
                lsm_rec_free(&lk.tmp[k]);
    }
    lookup_fini(&lk);
    return rv;
}

kv_err lsm_get(lsm_db *db, const void *key, size_t klen, lsm_rec *out, lsm_tier *served)
{
    if (!key || klen == 0 || !out)
        return KV_INVALID_ARGUMENT;
    const void *keys[1] = {key};
    size_t klens[1] = {klen};
    lsm_rec rec;
    lsm_tier tier;
    kv_err err;
    kv_err rv = lsm_multiget(db, 1, keys, klens, &rec, &tier, &err);
    if (rv != KV_OK)
        return rv;
    if (err == KV_OK) {
        *out = rec;
        if (served)
            *served = tier;
    }
    return err;
}
