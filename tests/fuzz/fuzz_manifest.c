/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for MANIFEST reading (node/lsm/manifest.c) and, behind
 * it, opening a db from what it names (node/lsm/db.c). The input is
 * [u8 flags] then u16-length chunks: with flags bit 0 each chunk is one edit
 * payload framed with correct checksums (a trailing partial chunk stays raw:
 * a torn append), otherwise the rest is the MANIFEST's raw bytes; bit 1
 * takes the contents of CURRENT from a first chunk instead of the right
 * name. The recovered state is turned into a version. With bit 2 the db is
 * then opened for real: every SST the MANIFEST names is written from one of
 * three valid template files (their metadata is the MANIFEST's, true or
 * not), and the db is read, iterated, compacted and closed (bit 3: io_uring),
 * then opened again, which must succeed. Failures must be error codes, never
 * crashes or leaks. A fresh directory per input.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_lsm.h"
#include "fuzz_util.h"

#define NTEMPLATES 3
#define MAX_FILES 24

static lsm_buf templates[NTEMPLATES];

/* Builds template SST t (keys "k<t><i>") and keeps its bytes. */
static void make_template(const char *dir, int t)
{
    lsm_vol v;
    FZ_CHECK(lsm_vol_init(&v, dir, LSM_TIER_FD, false) == KV_OK, "lsm_vol_init");
    lsm_sst_builder *b = NULL;
    FZ_CHECK(lsm_sst_builder_open(&b, &v, 100 + t, 256) == KV_OK, "builder");
    for (int i = 0; i < 40 * (t + 1); i++) {
        char key[16];
        int n = snprintf(key, sizeof(key), "k%d%04d", t, i);
        lsm_rec r = {.key = key,
                     .klen = (size_t)n,
                     .value = "value",
                     .vlen = 5,
                     .version = (uint64_t)i + 1,
                     .seqno = (uint64_t)(t * 1000 + i + 1),
                     .type = i % 7 == 3 ? LSM_DELETE : LSM_PUT};
        if (r.type == LSM_DELETE)
            r.value = NULL, r.vlen = 0;
        FZ_CHECK(lsm_sst_builder_add(b, &r) == KV_OK, "builder add");
    }
    lsm_file *f = NULL;
    FZ_CHECK(lsm_sst_builder_finish(b, 0, &f) == KV_OK, "builder finish");
    lsm_file_unref(f);
    char path[600];
    lsm_sst_name(path, sizeof(path), 100 + t);
    int fd = lsm_vol_open(&v, path, O_RDONLY);
    struct stat st;
    FZ_CHECK(fd >= 0 && fstat(fd, &st) == 0, "template file");
    FZ_CHECK(lsm_buf_reserve(&templates[t], (size_t)st.st_size) == KV_OK, "out of memory");
    FZ_CHECK(pread(fd, templates[t].p, (size_t)st.st_size, 0) == st.st_size, "template read");
    templates[t].len = (size_t)st.st_size;
    close(fd);
    lsm_vol_fini(&v);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fz_quiet();
    char dir[512];
    fz_fresh_dir(dir, sizeof(dir), "templates");
    for (int t = 0; t < NTEMPLATES; t++)
        make_template(dir, t);
    fz_rmtree(dir);
    return 0;
}

static void write_manifest(const char *dir, fz_in *in, uint8_t flags)
{
    if (flags & 2) {
        size_t len;
        const uint8_t *cur = fz_chunk(in, &len);
        fz_write_file(dir, "CURRENT", cur, len);
    } else {
        fz_write_file(dir, "CURRENT", "MANIFEST-000007\n", 16);
    }
    lsm_buf b = {0};
    while ((flags & 1) && in->n >= 2) {
        size_t want = (size_t)in->p[0] | (size_t)in->p[1] << 8;
        if (want > in->n - 2)
            break;
        size_t len;
        const uint8_t *p = fz_chunk(in, &len);
        fz_man_frame(&b, p, len);
    }
    FZ_CHECK(lsm_buf_put(&b, in->p, in->n) == KV_OK, "out of memory");
    fz_write_file(dir, "MANIFEST-000007", b.p, b.len);
    lsm_buf_free(&b);
}

/* Reads, iterates and compacts an opened db. */
static void use_db(lsm_db *db)
{
    static const char *const keys[] = {"k00000", "k10039", "k20119", "zz"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        lsm_rec r;
        if (lsm_get(db, keys[i], strlen(keys[i]), &r, NULL) == KV_OK)
            lsm_rec_free(&r);
    }
    lsm_iter *it = NULL;
    if (lsm_iter_open(db, &it) == KV_OK) {
        kv_err rv = lsm_iter_seek(it, NULL, 0);
        for (int i = 0; rv == KV_OK && lsm_iter_rec(it) && i < 2000; i++)
            rv = lsm_iter_next(it);
        lsm_iter_close(it);
    }
    (void)lsm_compact_all(db);
}

/* Writes a template SST under every number st names, then opens the db. */
static void open_db(const char *dir, const lsm_recovered *st, bool uring)
{
    for (size_t i = 0; i < st->state.nadd && i < MAX_FILES; i++) {
        char name[64];
        lsm_sst_name(name, sizeof(name), st->state.adds[i]->number);
        const lsm_buf *t = &templates[i % NTEMPLATES];
        fz_write_file(dir, name, t->p, t->len);
    }
    if (st->state.nadd > MAX_FILES)
        return;
    lsm_opts o;
    lsm_opts_default(&o);
    o.fast_dir = dir;
    o.sync = LSM_SYNC_NONE;
    o.disable_io_uring = !uring;
    o.no_auto_compaction = true;
    o.hotrap = false;
    lsm_db *db = NULL;
    if (lsm_open(&db, &o, NULL, NULL) != KV_OK)
        return;
    use_db(db);
    lsm_close(db);
    /* what opened, compacted and closed cleanly must open again, unless it
     * has used up its file numbers: an open makes two (WAL and MANIFEST), and
     * without them it fails with RESOURCE_EXHAUSTED, never DATA_LOSS */
    kv_err rv = lsm_open(&db, &o, NULL, NULL);
    if (rv == KV_RESOURCE_EXHAUSTED) {
        lsm_vol v;
        FZ_CHECK(lsm_vol_init(&v, dir, LSM_TIER_FD, false) == KV_OK, "lsm_vol_init");
        lsm_recovered after = {0};
        kv_err mr = lsm_manifest_recover(&v, &after);
        lsm_vol_fini(&v);
        FZ_CHECK(mr == KV_OK, "the closed db's MANIFEST does not read: %s", kv_err_name(mr));
        uint64_t next = after.state.next_file;
        lsm_edit_free(&after.state);
        FZ_CHECK(next >= LSM_FILE_NUMBER_MAX - 2,
                 "reopen: RESOURCE_EXHAUSTED with file numbers left (next %" PRIu64 ")", next);
        return;
    }
    FZ_CHECK(rv == KV_OK, "reopening a db that closed cleanly: %s", kv_err_name(rv));
    use_db(db);
    lsm_close(db);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    char dir[512];
    fz_fresh_dir(dir, sizeof(dir), "manifest");
    write_manifest(dir, &in, flags);
    lsm_vol v;
    FZ_CHECK(lsm_vol_init(&v, dir, LSM_TIER_FD, false) == KV_OK, "lsm_vol_init");
    lsm_recovered st = {0};
    kv_err rv = lsm_manifest_recover(&v, &st);
    lsm_vol_fini(&v);
    if (rv != KV_OK)
        return 0;
    lsm_version *ver = lsm_version_apply(NULL, &st.state);
    FZ_CHECK(ver, "lsm_version_apply failed");
    size_t total = 0;
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        total += ver->nfiles[l];
    FZ_CHECK(total == st.state.nadd, "version holds %zu files, the MANIFEST %zu", total,
             st.state.nadd);
    lsm_version_unref(ver);
    if (flags & 4)
        open_db(dir, &st, flags & 8);
    lsm_edit_free(&st.state);
    return 0;
}
