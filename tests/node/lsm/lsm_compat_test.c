/* SPDX-License-Identifier: MIT */
/*
 * Backward compatibility of the on-disk format: fixtures/sst_v1 was written
 * by the LSM before SST format version 2 (block compression), fixtures/sst_v2
 * by the LSM before version 3 (compact records), fixtures/sst_v3 before
 * version 4 (shared key prefixes); see lsm_fixture_model.h and
 * fixtures/gen_sst_v1.c. The current code opens each (its files on FD and
 * SD, the WAL replayed), serves every key from it, and compacts it into
 * compressed version 4 files that serve the same records; then a reopen with
 * another codec reads those and writes its own.
 */
#include "lsm_test_util.h"

#include "lsm_fixture_model.h"

#include <criterion/criterion.h>

#include "node/lsm/lsm_int.h"

#define MAGIC_V1 0x31545353534d534cull
#define MAGIC_V2 0x32545353534d534cull
#define MAGIC_V3 0x33545353534d534cull
#define MAGIC_V4 0x34545353534d534cull

/* The footer magic of the SST at path. */
static uint64_t magic_of(const char *path)
{
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0, "%s", path);
    uint8_t f[48];
    off_t end = lseek(fd, 0, SEEK_END);
    cr_assert_eq(pread(fd, f, sizeof(f), end - 48), 48);
    close(fd);
    return lsm_get64(f + 32);
}

/* Counts the SSTs of dir whose magic is `magic`, and all of them. */
static int count_magic(const char *dir, uint64_t magic, int *all)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    int n = 0;
    *all = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 4 || strcmp(e->d_name + l - 4, ".sst") != 0)
            continue;
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        n += magic_of(p) == magic;
        (*all)++;
    }
    closedir(d);
    return n;
}

/* The newest generation of key i among gens <= max, 0 = none. */
static int newest_upto(int i, int max, bool *del)
{
    for (int gen = max; gen >= 1; gen--)
        if (fx_writes(i, gen, del))
            return gen;
    return 0;
}

static void expect_rec(const lsm_rec *r, int i, int gen, bool del)
{
    char k[16];
    uint8_t v[512];
    int kl = fx_key(k, i);
    cr_assert_eq(r->klen, (size_t)kl);
    cr_assert(memcmp(r->key, k, (size_t)kl) == 0);
    cr_assert_eq(r->version, fx_version(i, gen), "key %d: version %llu, want gen %d", i,
                 (unsigned long long)r->version, gen);
    cr_assert_eq(r->type, del ? LSM_DELETE : LSM_PUT, "key %d", i);
    if (!del) {
        size_t vl = fx_value(v, i, gen);
        cr_assert_eq(r->vlen, vl, "key %d", i);
        cr_assert(memcmp(r->value, v, vl) == 0, "key %d: value differs", i);
    }
}

/* Every key by lsm_get, one lsm_multiget and an iterator: the newest record
 * of gens <= max; with gone, the tombstones were compacted away (the keys
 * are not found). */
static void check_all(lsm_db *db, int max, bool gone)
{
    static char keys[FX_KEYS][16];
    static const void *kp[FX_KEYS];
    static size_t kl[FX_KEYS];
    static lsm_rec outs[FX_KEYS];
    static kv_err errs[FX_KEYS];
    for (int i = 0; i < FX_KEYS; i++) {
        kl[i] = (size_t)fx_key(keys[i], i);
        kp[i] = keys[i];
        bool del;
        int gen = newest_upto(i, max, &del);
        lsm_rec r;
        kv_err rv = lsm_get(db, keys[i], kl[i], &r, NULL);
        if (del && gone) {
            cr_assert_eq(rv, KV_NOT_FOUND, "key %d", i);
            continue;
        }
        cr_assert_eq(rv, KV_OK, "key %d: %s", i, kv_strerror(rv));
        expect_rec(&r, i, gen, del);
        lsm_rec_free(&r);
    }
    cr_assert_eq(lsm_multiget(db, FX_KEYS, kp, kl, outs, NULL, errs), KV_OK);
    for (int i = 0; i < FX_KEYS; i++) {
        bool del;
        int gen = newest_upto(i, max, &del);
        if (del && gone) {
            cr_assert_eq(errs[i], KV_NOT_FOUND, "key %d", i);
            continue;
        }
        cr_assert_eq(errs[i], KV_OK, "key %d", i);
        expect_rec(&outs[i], i, gen, del);
        lsm_rec_free(&outs[i]);
    }
    lsm_iter *it;
    cr_assert_eq(lsm_iter_open(db, &it), KV_OK);
    cr_assert_eq(lsm_iter_seek(it, NULL, 0), KV_OK);
    int i = -1;
    for (const lsm_rec *r; (r = lsm_iter_rec(it)) != NULL;) {
        bool del;
        int gen;
        do {
            cr_assert_lt(++i, FX_KEYS, "the scan returns a key past the last");
            gen = newest_upto(i, max, &del);
        } while (del && gone);
        expect_rec(r, i, gen, del);
        cr_assert_eq(lsm_iter_next(it), KV_OK);
    }
    for (i++; i < FX_KEYS; i++) {
        bool del;
        newest_upto(i, max, &del);
        cr_assert(del && gone, "key %d missing from the scan", i);
    }
    lsm_iter_close(it);
    char absent[] = "fx99999"; /* past every key */
    lsm_rec r;
    cr_assert_eq(lsm_get(db, absent, strlen(absent), &r, NULL), KV_NOT_FOUND);
}

/* The highest version among the newest records of gens <= max, the keys
 * deleted at their newest left out when gone. */
static uint64_t newest_version(int max, bool gone)
{
    uint64_t v = 0;
    for (int i = 0; i < FX_KEYS; i++) {
        bool del;
        int gen = newest_upto(i, max, &del);
        if (gen && !(del && gone) && fx_version(i, gen) > v)
            v = fx_version(i, gen);
    }
    return v;
}

typedef struct replayed {
    lsm_rec recs[FX_KEYS];
    char keys[FX_KEYS][16];
    uint8_t vals[FX_KEYS][512];
    size_t n;
    uint64_t max_seq;
} replayed;

/* Keeps the WAL records lsm_open replays: gen 5, in key order. */
static kv_err keep(void *arg, const lsm_rec *r)
{
    replayed *w = arg;
    cr_assert_lt(w->n, FX_KEYS);
    lsm_rec *c = &w->recs[w->n];
    *c = *r;
    memcpy(w->keys[w->n], r->key, r->klen);
    memcpy(w->vals[w->n], r->value, r->vlen);
    c->key = w->keys[w->n];
    c->value = w->vals[w->n];
    w->max_seq = r->seqno > w->max_seq ? r->seqno : w->max_seq;
    w->n++;
    return KV_OK;
}

static void open_db(lsm_db **db, const char *fast, const char *slow, const char *codec, replayed *w)
{
    lsm_opts o;
    lt_opts(&o, fast, LSM_SYNC_NONE);
    o.slow_dir = slow;
    o.fast_mb = FX_FAST_MB;
    o.hotrap = false;
    char err[256];
    cr_assert_eq(lsm_compression_parse(codec, &o.compression, err, sizeof(err)), KV_OK, "%s", err);
    if (w)
        memset(w, 0, sizeof(*w));
    cr_assert_eq(lsm_open(db, &o, w ? keep : NULL, w), KV_OK);
}

/* The cleanup filter that keeps every key, counting the keys it is asked. */
static bool keep_all(void *arg, const void *key, size_t klen)
{
    (void)key;
    (void)klen;
    (*(uint64_t *)arg)++;
    return true;
}

/* Opens a copy of fixtures/<name> (every SST of format magic), checks it,
 * compacts it into version 4 files and checks again; then with zstd. With
 * via_cleanup the rewrite is the cleanup's (lsm_compact_all_filter keeping
 * every key, what `kvctl node cleanup` runs), which operators can use to
 * rewrite a directory's older files at once (docs/operations.md). */
static void fixture_reads_and_compacts(const char *name, uint64_t magic, bool old_manifest,
                                       bool via_cleanup)
{
    const char *src = getenv("KV_SOURCE_DIR");
    cr_assert_not_null(src, "KV_SOURCE_DIR is set by ctest");
    char *dir = lt_mkdtemp("compat");
    char cmd[1024], fast[512], slow[512];
    snprintf(cmd, sizeof(cmd),
             "cp -r '%s/tests/node/lsm/fixtures/%s/fast' "
             "'%s/tests/node/lsm/fixtures/%s/slow' '%s/'",
             src, name, src, name, dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(fast, sizeof(fast), "%s/fast", dir);
    snprintf(slow, sizeof(slow), "%s/slow", dir);
    int all;
    cr_assert_eq(count_magic(fast, magic, &all), all);
    cr_assert_gt(all, 0);
    cr_assert_eq(count_magic(slow, magic, &all), all);
    cr_assert_gt(all, 0);

    static replayed w;
    lsm_db *db;
    open_db(&db, fast, slow, "auto", &w); /* lz4 on SD */
    lsm_stats st;
    lsm_stats_get(db, &st);
    cr_assert_gt(st.levels[0].files, 0);
    cr_assert_gt(st.levels[3].files, 0);
    cr_assert_eq(st.levels[3].volume, LSM_TIER_SD);
    cr_assert_eq(st.levels[3].codec, LSM_COMPRESS_LZ4);
    cr_assert_eq(st.levels[1].codec, LSM_COMPRESS_NONE);
    uint64_t files = 0;
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        files += st.levels[l].files;
    cr_assert_eq(st.old_format_files, files, "every fixture file is of an older format");
    size_t want = 0;
    for (int i = 0; i < FX_KEYS; i++) {
        bool del;
        want += fx_writes(i, 5, &del);
    }
    cr_assert_eq(w.n, want, "the WAL replays gen 5");
    for (size_t k = 0; k < w.n; k++) {
        int i = atoi((const char *)w.keys[k] + 2);
        expect_rec(&w.recs[k], i, 5, false);
    }
    check_all(db, 4, false);
    if (old_manifest)
        cr_assert_eq(lsm_max_version(db), UINT64_MAX,
                     "the old manifest does not record its files' versions: unknown");
    else
        cr_assert_eq(lsm_max_version(db), newest_version(4, false));

    /* Everything into L3 on SD: old inputs, v4 lz4 outputs. */
    if (via_cleanup) {
        uint64_t asked = 0, dropped = 1;
        cr_assert_eq(lsm_compact_all_filter(db, keep_all, &asked, &dropped), KV_OK);
        cr_assert_gt(asked, 0);
        cr_assert_eq(dropped, 0);
    } else {
        cr_assert_eq(lsm_compact_all(db), KV_OK);
    }
    cr_assert_eq(lsm_max_version(db), newest_version(4, true),
                 "rewritten files carry their highest version");
    lsm_stats_get(db, &st);
    cr_assert_eq(st.levels[0].files + st.levels[1].files + st.levels[2].files, 0);
    cr_assert_eq(st.old_format_files, 0, "compaction rewrote every old file");
    cr_assert_gt(st.compress_in_bytes, 0);
    cr_assert_lt(st.compress_out_bytes, st.compress_in_bytes / 2, "fixture text compresses");
    check_all(db, 4, true);
    cr_assert_eq(count_magic(slow, MAGIC_V4, &all), all);
    cr_assert_eq(lsm_flush(db, w.recs, w.n, w.max_seq), KV_OK); /* gen 5 into L0 */
    check_all(db, 5, true);
    uint64_t maxv = lsm_max_version(db);
    cr_assert_eq(maxv, newest_version(5, true));
    lsm_close(db);

    /* Reopen with zstd everywhere: the lz4 files read, new files zstd. */
    open_db(&db, fast, slow, "zstd", NULL);
    lsm_stats_get(db, &st);
    cr_assert_eq(st.levels[0].codec, LSM_COMPRESS_ZSTD);
    check_all(db, 5, true);
    cr_assert_eq(lsm_max_version(db), maxv, "the manifest keeps the files' versions");
    cr_assert_eq(lsm_compact_all(db), KV_OK);
    check_all(db, 5, true);
    lsm_close(db);
    cr_assert_eq(count_magic(fast, MAGIC_V4, &all), all);
    cr_assert_eq(count_magic(slow, MAGIC_V4, &all), all);
    cr_assert_gt(all, 0);
    lt_rmrf(dir);
    free(dir);
}

Test(compat, sst_v1_fixture_reads_and_compacts_into_v4)
{
    fixture_reads_and_compacts("sst_v1", MAGIC_V1, true, false);
}

Test(compat, sst_v2_fixture_reads_and_compacts_into_v4)
{
    fixture_reads_and_compacts("sst_v2", MAGIC_V2, false, false);
}

Test(compat, sst_v3_fixture_reads_and_a_cleanup_rewrites_it_into_v4)
{
    fixture_reads_and_compacts("sst_v3", MAGIC_V3, false, true);
}
