/* SPDX-License-Identifier: MIT */
/*
 * kallax under damage: a corrupt or zeroed block is detected by its checksum
 * (DATA_LOSS for its keys, from get, multiget, the iterator and a flush that
 * would rewrite it; never wrong data; the other blocks serve on); a block
 * torn while its journal round is the last one is restored from the journal,
 * at open and while open; an incomplete journal is ignored; a corrupt extent
 * and a corrupt META are detected.
 */
#define _GNU_SOURCE
#include "tests/kv_testfw.h"

#include <signal.h>
#include <sys/resource.h>

#include "common/hash.h"
#include "kx_test.h"

#define NB 64

static uint64_t home_of(unsigned id)
{
    char k[KX_KLEN + 1];
    kx_key(k, id);
    return kv_hash64(k, KX_KLEN, KALLAX_SEED) % NB;
}

static char *path_of(const kx_world *w, const char *name)
{
    char *p = malloc(512);
    snprintf(p, 512, "%s/%s", w->dir, name);
    return p;
}

/* 200 keys, one flush each; returns a key whose block is not in the last
 * journal round (the block of key 199). */
static unsigned setup(kx_world *w, uint8_t *v)
{
    kx_world_init(w, "kx-fault", NB);
    kx_world_open(w, NULL, NULL);
    for (unsigned id = 0; id < 200; id++)
        kx_put_now(w, id, id + 1, 100, v);
    unsigned victim = 0;
    while (home_of(victim) == home_of(199) || home_of(victim) + 1 == home_of(199))
        victim++;
    return victim;
}

static void flip_block(const kx_world *w, uint64_t blk, long at)
{
    char *p = path_of(w, "BLOCKS");
    cr_assert_eq(lt_flip(p, (long)blk * KALLAX_BLOCK + at), 0);
    free(p);
}

Test(kallax_fault, corrupt_block_is_data_loss, .timeout = 60)
{
    kx_world w;
    uint8_t v[256];
    unsigned victim = setup(&w, v);
    cr_assert_eq(kallax_max_version(w.kx), (uint64_t)200 << 16, "the newest record's version");
    kallax_close(w.kx);
    flip_block(&w, home_of(victim), 40);
    kx_world_open(&w, NULL, NULL);
    kallax_stats s;
    kallax_stats_get(w.kx, &s);
    cr_assert_geq(s.corrupt_blocks, 1);
    cr_assert_eq(kallax_max_version(w.kx), UINT64_MAX,
                 "a corrupt block hides versions: the highest is unknown");
    uint64_t sq;
    size_t vl;
    bool tomb;
    cr_assert_eq(kx_get_id(w.kx, victim, &sq, &vl, &tomb), KV_DATA_LOSS);
    unsigned ok = 0;
    for (unsigned id = 0; id < 200; id++)
        if (home_of(id) != home_of(victim))
            ok += kx_get_id(w.kx, id, &sq, &vl, &tomb) == KV_OK;
    cr_assert_gt(ok, 150u);
    char k[KX_KLEN + 1];
    kx_key(k, victim);
    const void *kp[1] = {k};
    size_t kl[1] = {KX_KLEN};
    lsm_rec out[1];
    kv_err errs[1];
    cr_assert_eq(kallax_multiget(w.kx, 1, kp, kl, out, errs), KV_OK);
    cr_assert_eq(errs[0], KV_DATA_LOSS);
    kallax_iter *it;
    cr_assert_eq(kallax_iter_open(w.kx, &it), KV_OK);
    kv_err rv = kallax_iter_seek(it, NULL, 0);
    while (rv == KV_OK && kallax_iter_rec(it))
        rv = kallax_iter_next(it);
    cr_assert_eq(rv, KV_DATA_LOSS);
    kallax_iter_close(it);
    lsm_rec r = kx_rec(k, v, victim, 500, 10, false, 0);
    cr_assert_eq(kallax_wal_append(w.kx, &r, 1), KV_OK);
    cr_assert_eq(kallax_flush(w.kx, &r, 1, 500), KV_DATA_LOSS);
    kx_world_fini(&w);
}

Test(kallax_fault, zeroed_block_is_data_loss, .timeout = 60)
{
    kx_world w;
    uint8_t v[256];
    unsigned victim = setup(&w, v);
    kallax_close(w.kx);
    char *p = path_of(&w, "BLOCKS");
    int fd = open(p, O_RDWR);
    static const uint8_t zero[KALLAX_BLOCK];
    cr_assert_eq(pwrite(fd, zero, sizeof(zero), (off_t)home_of(victim) * KALLAX_BLOCK),
                 (ssize_t)sizeof(zero));
    close(fd);
    free(p);
    kx_world_open(&w, NULL, NULL);
    uint64_t sq;
    size_t vl;
    bool tomb;
    cr_assert_eq(kx_get_id(w.kx, victim, &sq, &vl, &tomb), KV_DATA_LOSS);
    kx_world_fini(&w);
}

/* Sets the journal's round back to "not known to be in place", as if the
 * process died before it marked it. */
static void unmark_journal(const kx_world *w)
{
    char *p = path_of(w, "JOURNAL");
    int fd = open(p, O_RDWR);
    uint32_t magic = 0x314a584bu; /* "KXJ1" */
    cr_assert_eq(pwrite(fd, &magic, 4, 0), 4);
    close(fd);
    free(p);
}

static void all_keys_ok(kx_world *w)
{
    uint64_t sq;
    size_t vl;
    bool tomb;
    for (unsigned id = 0; id < 200; id++) {
        cr_assert_eq(kx_get_id(w->kx, id, &sq, &vl, &tomb), KV_OK, "key %u", id);
        cr_assert_eq(sq, id + 1u);
    }
}

Test(kallax_fault, torn_block_restored_from_journal, .timeout = 60)
{
    kx_world w;
    uint8_t v[256];
    kallax_stats s;
    setup(&w, v);
    kallax_close(w.kx);
    flip_block(&w, home_of(199), 100); /* the in-place write tore, the mark never came */
    unmark_journal(&w);
    kx_world_open(&w, NULL, NULL); /* open copies the round over its blocks */
    all_keys_ok(&w);
    kallax_stats_get(w.kx, &s);
    cr_assert_eq(s.corrupt_blocks + s.repaired, 0u);
    flip_block(&w, home_of(199), 200); /* while open: rewritten from the journal on a read */
    all_keys_ok(&w);
    kallax_stats_get(w.kx, &s);
    cr_assert_eq(s.repaired, 1u);
    kallax_close(w.kx);
    flip_block(&w, home_of(199), 300); /* closed, round applied: the open scan repairs it */
    kx_world_open(&w, NULL, NULL);
    kallax_stats_get(w.kx, &s);
    cr_assert_eq(s.repaired, 1u);
    cr_assert_eq(s.corrupt_blocks, 0u);
    all_keys_ok(&w);
    cr_assert_eq(kallax_max_version(w.kx), (uint64_t)200 << 16,
                 "the open scan (repair included) finds the newest version");
    kx_world_fini(&w);
}

Test(kallax_fault, incomplete_journal_ignored, .timeout = 60)
{
    kx_world w;
    uint8_t v[256];
    setup(&w, v);
    kallax_close(w.kx);
    char *p = path_of(&w, "JOURNAL");
    cr_assert_eq(lt_flip(p, KALLAX_BLOCK + 300), 0); /* an image of the round */
    free(p);
    kx_world_open(&w, NULL, NULL);
    uint64_t sq;
    size_t vl;
    bool tomb;
    for (unsigned id = 0; id < 200; id++)
        cr_assert_eq(kx_get_id(w.kx, id, &sq, &vl, &tomb), KV_OK, "key %u", id);
    kx_world_fini(&w);
}

Test(kallax_fault, corrupt_extent_and_meta, .timeout = 60)
{
    kx_world w;
    uint8_t *v = malloc(10000);
    kx_world_init(&w, "kx-fault-ext", NB);
    kx_world_open(&w, NULL, NULL);
    kx_put_now(&w, 1, 1, 9000, v);
    kallax_close(w.kx);
    char *p = path_of(&w, "EXTENTS");
    cr_assert_eq(lt_flip(p, 10), 0);
    free(p);
    kx_world_open(&w, NULL, NULL);
    uint64_t sq;
    size_t vl;
    bool tomb;
    cr_assert_eq(kx_get_id(w.kx, 1, &sq, &vl, &tomb), KV_DATA_LOSS);
    kallax_close(w.kx);
    p = path_of(&w, "META");
    cr_assert_eq(lt_flip(p, 20), 0);
    cr_assert_eq(lt_flip(p, 512 + 20), 0);
    free(p);
    cr_assert_eq(kallax_open(&w.kx, &w.o, NULL, NULL), KV_DATA_LOSS);
    w.kx = NULL;
    kx_world_fini(&w);
    free(v);
}

/* A creation that fails part-way (here: BLOCKS outgrows a file size limit,
 * as a crash or a full disk would cut it) leaves no store: the next open
 * creates it. META used to be created empty before the blocks were
 * written, and the next open found it corrupt (DATA_LOSS). */
Test(kallax_fault, creation_cut_short_is_redone, .timeout = 60)
{
    kx_world w;
    kx_world_init(&w, "kx-create-cut", 1024); /* 4 MiB of blocks */
    struct rlimit old, small;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    small = old;
    small.rlim_cur = 256 * 1024;
    signal(SIGXFSZ, SIG_IGN); /* EFBIG instead of the signal */
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    kallax *kx = NULL;
    kv_err rv = kallax_open(&kx, &w.o, NULL, NULL);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert_neq(rv, KV_OK, "the creation was cut short");
    kx_world_open(&w, NULL, NULL);
    kallax_close(w.kx);
    w.kx = NULL;
    char *p = path_of(&w, "META");
    cr_assert_eq(access(p, F_OK), 0, "META exists once the store is created");
    free(p);
    kx_world_open(&w, NULL, NULL); /* and opens as a store */
    kx_world_fini(&w);
}
