/* SPDX-License-Identifier: MIT */
/*
 * Fault tests of the LSM: a flipped byte in the WAL (lsm_open refuses with
 * DATA_LOSS naming the file and offset when valid frames or segments follow
 * it; point-in-time recovery keeps the records before it; a torn tail is
 * truncated), in an SST data block (DATA_LOSS for the
 * keys of that block only, a log line naming the file, no crash) and in the
 * MANIFEST (lsm_open fails with DATA_LOSS naming the file); and a full fast
 * volume (a 2 MiB tmpfs): writes fail with RESOURCE_EXHAUSTED, reads keep
 * working and nothing acknowledged is lost.
 */
#include "lsm_test_util.h"
#include "tests/kv_testlog.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <sys/mount.h>

#include "node/lsm/lsm_int.h"

static void base_opts(lsm_opts *o, const char *dir)
{
    lt_opts(o, dir, LSM_SYNC_NONE);
}

/* ---- WAL ---- */

typedef struct seqs {
    int n;
    uint64_t s[1024];
} seqs;

static kv_err collect(void *arg, const lsm_rec *r)
{
    seqs *c = arg;
    char v[64];
    lt_value(v, sizeof(v), r->seqno);
    cr_assert_eq(r->vlen, sizeof(v));
    cr_assert(memcmp(r->value, v, sizeof(v)) == 0, "replayed value of seqno %llu differs",
              (unsigned long long)r->seqno);
    if (c->n < 1024)
        c->s[c->n++] = r->seqno;
    return KV_OK;
}

static void append_range(lsm_db *db, uint64_t from, uint64_t to)
{
    for (uint64_t s = from; s <= to; s++) {
        char k[16], v[64];
        int kn = snprintf(k, sizeof(k), "w%05llu", (unsigned long long)s);
        lt_value(v, sizeof(v), s);
        lsm_rec r = {.key = k,
                     .klen = (size_t)kn,
                     .value = v,
                     .vlen = sizeof(v),
                     .seqno = s,
                     .type = LSM_PUT};
        cr_assert_eq(lsm_wal_append(db, &r, 1), KV_OK);
    }
}

/* Opens dir with o, capturing the log lines; returns the error and *log. */
static kv_err open_logged(const lsm_opts *o, const char *dir, lsm_db **db, seqs *c, char **log)
{
    char logp[300];
    snprintf(logp, sizeof(logp), "%s.log", dir);
    int saved = cap_begin(logp);
    kv_err rv = lsm_open(db, o, collect, c);
    *log = cap_end(saved, logp);
    return rv;
}

/* Writes records 1..n to one segment (n / 2 + 1.. to a second when two). */
static char *wal_with(const lsm_opts *o, const char *dir, int n, bool two)
{
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, o, NULL, NULL), KV_OK);
    append_range(db, 1, two ? (uint64_t)n / 2 : (uint64_t)n);
    lsm_close(db);
    char *first = lt_find(dir, ".wal", 0);
    if (two) { /* every open starts a new segment; unflushed ones stay */
        cr_assert_eq(lsm_open(&db, o, NULL, NULL), KV_OK);
        append_range(db, (uint64_t)n / 2 + 1, (uint64_t)n);
        lsm_close(db);
        cr_assert_eq(lt_count(dir, ".wal"), 2);
    }
    return first;
}

/* A flipped byte with valid frames after it: acknowledged writes would be
 * lost, so the default refuses to open (naming the file and the offset)
 * and leaves the log as it was; point-in-time recovery keeps the records
 * before the flip, truncates there and the log goes on. */
Test(corrupt, wal_flip_mid_log_refuses_then_point_in_time_recovers)
{
    char *dir = lt_mkdtemp("cwal");
    lsm_opts o;
    base_opts(&o, dir);
    char *wal = wal_with(&o, dir, 200, false);
    long size = lt_size(wal), frame = size / 200, off = size * 6 / 10;
    cr_assert_eq(lt_flip(wal, off), 0);

    seqs c = {0};
    char *log;
    lsm_db *db = (lsm_db *)0x1;
    kv_err rv = open_logged(&o, dir, &db, &c, &log);
    cr_assert_eq(rv, KV_DATA_LOSS, "open over a corrupt WAL: %s", kv_strerror(rv));
    cr_assert_eq(db, (lsm_db *)0x1, "out written on failure");
    const char *base = strrchr(wal, '/') + 1;
    char at[64];
    snprintf(at, sizeof(at), "offset %ld", off / frame * frame);
    cr_assert(strstr(log, base) && strstr(log, at), "log names neither %s nor %s", base, at);
    cr_assert_eq(lt_size(wal), size, "the refused log was changed");
    free(log);

    o.wal_recovery = LSM_WAL_POINT_IN_TIME;
    memset(&c, 0, sizeof(c));
    rv = open_logged(&o, dir, &db, &c, &log);
    cr_assert_eq(rv, KV_OK, "%s", kv_strerror(rv));
    cr_assert(strstr(log, "point-in-time") != NULL, "no log line about the cut");
    cr_assert_eq(c.n, off / frame, "replayed %d records", c.n);
    for (int i = 0; i < c.n; i++)
        cr_assert_eq(c.s[i], (uint64_t)i + 1);
    cr_assert_eq(lsm_last_seqno(db), (uint64_t)c.n);
    cr_assert_eq(lt_size(wal), frame * c.n, "segment not truncated at the bad frame");
    int kept = c.n;
    append_range(db, (uint64_t)kept + 1, (uint64_t)kept + 10); /* the log goes on */
    lsm_close(db);
    o.wal_recovery = LSM_WAL_ABSOLUTE; /* the log is clean again */
    seqs c2 = {0};
    cr_assert_eq(lsm_open(&db, &o, collect, &c2), KV_OK);
    cr_assert_eq(c2.n, kept + 10);
    lsm_close(db);
    free(log);
    free(wal);
    lt_rmrf(dir);
    free(dir);
}

/* The last frame of a segment that later segments follow is not a tail:
 * cutting it used to delete the later segments and their records. */
Test(corrupt, wal_flip_before_a_later_segment_refuses)
{
    char *dir = lt_mkdtemp("cwal2");
    lsm_opts o;
    base_opts(&o, dir);
    char *wal = wal_with(&o, dir, 200, true);
    long size = lt_size(wal);
    cr_assert_eq(lt_flip(wal, size - 3), 0);
    seqs c = {0};
    char *log;
    lsm_db *db;
    kv_err rv = open_logged(&o, dir, &db, &c, &log);
    cr_assert_eq(rv, KV_DATA_LOSS, "%s", kv_strerror(rv));
    cr_assert(strstr(log, strrchr(wal, '/') + 1) && strstr(log, "later WAL segments"),
              "log does not say why");
    cr_assert_eq(lt_count(dir, ".wal"), 2, "a segment was deleted");
    free(log);
    o.wal_recovery = LSM_WAL_POINT_IN_TIME;
    memset(&c, 0, sizeof(c));
    cr_assert_eq(open_logged(&o, dir, &db, &c, &log), KV_OK);
    cr_assert_eq(c.n, 99);
    lsm_close(db);
    free(log);
    free(wal);
    lt_rmrf(dir);
    free(dir);
}

/* A torn tail (last frame of the last segment cut, damaged or followed by
 * zeroes: a crash during a write) is truncated in the default mode too. */
Test(corrupt, wal_torn_tail_is_truncated_by_default)
{
    for (int how = 0; how < 3; how++) {
        char *dir = lt_mkdtemp("ctorn");
        lsm_opts o;
        base_opts(&o, dir);
        char *wal = wal_with(&o, dir, 100, false);
        long size = lt_size(wal), frame = size / 100;
        if (how == 0)
            cr_assert_eq(truncate(wal, size - 7), 0);
        else if (how == 1)
            cr_assert_eq(lt_flip(wal, size - frame + 5), 0); /* the last frame's length */
        else
            cr_assert_eq(truncate(wal, size + 4096), 0); /* a zero-filled extension */
        seqs c = {0};
        char *log;
        lsm_db *db;
        kv_err rv = open_logged(&o, dir, &db, &c, &log);
        cr_assert_eq(rv, KV_OK, "case %d: %s", how, kv_strerror(rv));
        cr_assert(strstr(log, "torn tail") != NULL, "case %d: no log line", how);
        cr_assert_eq(c.n, how == 2 ? 100 : 99, "case %d: replayed %d", how, c.n);
        cr_assert_eq(lt_size(wal), frame * c.n, "case %d: not truncated", how);
        lsm_close(db);
        free(log);
        free(wal);
        lt_rmrf(dir);
        free(dir);
    }
}

/* ---- SST ---- */

#define NK 2000

static void flush_keys(lsm_db *db, int n, uint64_t seq0, size_t vlen)
{
    lsm_rec *run = calloc((size_t)n, sizeof(*run));
    char(*keys)[16] = calloc((size_t)n, 16);
    char *vals = malloc((size_t)n * vlen);
    for (int i = 0; i < n; i++) {
        int kn = snprintf(keys[i], 16, "c%05d", i);
        lt_value(vals + (size_t)i * vlen, vlen, seq0 + (uint64_t)i);
        run[i] = (lsm_rec){.key = keys[i],
                           .klen = (size_t)kn,
                           .value = vals + (size_t)i * vlen,
                           .vlen = vlen,
                           .seqno = seq0 + (uint64_t)i,
                           .type = LSM_PUT};
    }
    kv_err rv = lsm_flush(db, run, (size_t)n, seq0 + (uint64_t)n - 1);
    cr_assert_eq(rv, KV_OK, "flush: %s", kv_strerror(rv));
    free(run);
    free(keys);
    free(vals);
}

/* Flips a byte inside the data block holding key in SST path; returns the
 * block's offset. */
static long flip_block_of(const char *dir, const char *path, const char *key)
{
    const char *base = strrchr(path, '/') + 1;
    uint64_t number = strtoull(base, NULL, 10);
    lsm_vol v;
    cr_assert_eq(lsm_vol_init(&v, dir, LSM_TIER_FD, false), KV_OK);
    lsm_sst *s;
    cr_assert_eq(lsm_sst_open(&v, number, &s), KV_OK);
    int blk = lsm_sst_find_block(s, key, strlen(key));
    cr_assert_geq(blk, 0);
    lsm_io io;
    cr_assert_eq(lsm_sst_block_io(s, blk, &io), KV_OK);
    free(io.buf);
    lsm_sst_close(s);
    lsm_vol_fini(&v);
    cr_assert_eq(lt_flip(path, (long)io.off + 20), 0);
    return (long)io.off;
}

/* Every key is either intact or DATA_LOSS; returns the DATA_LOSS count. */
/* Looks up keys [i, i + n) with lsm_get (n == 1) or one lsm_multiget. */
static void lookup_keys(lsm_db *db, int i, int n, bool multiget, lsm_rec *r, kv_err *rv)
{
    char k[64][16];
    const void *kp[64];
    size_t kl[64];
    for (int j = 0; j < n; j++) {
        kl[j] = (size_t)snprintf(k[j], 16, "c%05d", i + j);
        kp[j] = k[j];
    }
    if (multiget)
        cr_assert_eq(lsm_multiget(db, (size_t)n, kp, kl, r, NULL, rv), KV_OK);
    else
        rv[0] = lsm_get(db, kp[0], kl[0], &r[0], NULL);
}

/* Every key is either intact or DATA_LOSS; returns the DATA_LOSS count. */
static int scan_keys(lsm_db *db, uint64_t seq0, size_t vlen, bool multiget)
{
    int lost = 0, first = -1, last = -1, step = multiget ? 64 : 1;
    char *want = malloc(vlen);
    for (int base = 0; base < NK; base += step) {
        int n = NK - base < step ? NK - base : step;
        lsm_rec r[64];
        kv_err rv[64];
        lookup_keys(db, base, n, multiget, r, rv);
        for (int j = 0; j < n; j++) {
            int i = base + j;
            if (rv[j] == KV_DATA_LOSS) {
                lost++;
                first = first < 0 ? i : first;
                last = i;
                continue;
            }
            cr_assert_eq(rv[j], KV_OK, "key %d: %s", i, kv_strerror(rv[j]));
            lt_value(want, vlen, seq0 + (uint64_t)i);
            cr_assert_eq(r[j].seqno, seq0 + (uint64_t)i);
            cr_assert(r[j].vlen == vlen && memcmp(r[j].value, want, vlen) == 0,
                      "key %d wrong value", i);
            lsm_rec_free(&r[j]);
        }
    }
    free(want);
    cr_assert(lost == 0 || last - first + 1 == lost, "lost keys are not one block");
    return lost;
}

Test(corrupt, sst_block_flip_gives_data_loss_for_that_block_only)
{
    char *dir = lt_mkdtemp("csst");
    lsm_opts o;
    base_opts(&o, dir);
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    flush_keys(db, NK, 1, 100);
    cr_assert_eq(scan_keys(db, 1, 100, false), 0);
    char *sst = lt_find(dir, ".sst", 1);
    cr_assert_not_null(sst);
    flip_block_of(dir, sst, "c01000");

    char logp[300];
    snprintf(logp, sizeof(logp), "%s.log", dir);
    int saved = cap_begin(logp);
    int lost = scan_keys(db, 1, 100, false);
    int lost_mg = scan_keys(db, 1, 100, true);
    kv_err crv = lsm_compact_all(db); /* cannot read the block either */
    char *log = cap_end(saved, logp);
    cr_assert(lost > 0 && lost < 100, "lost %d keys", lost);
    cr_assert_eq(lost_mg, lost);
    cr_assert_eq(crv, KV_DATA_LOSS, "compaction over a corrupt block: %s", kv_strerror(crv));
    const char *base = strrchr(sst, '/') + 1;
    cr_assert(strstr(log, base) != NULL, "log does not name %s", base);
    lsm_rec r;
    cr_assert_eq(lsm_get(db, "c01000", 6, &r, NULL), KV_DATA_LOSS);
    lsm_close(db);

    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK); /* footer and index are fine */
    cr_assert_eq(scan_keys(db, 1, 100, false), lost);
    lsm_close(db);
    free(log);
    free(sst);
    unlink(logp);
    lt_rmrf(dir);
    free(dir);
}

/* ---- MANIFEST ---- */

static void manifest_flip(long where)
{
    char *dir = lt_mkdtemp("cman");
    lsm_opts o;
    base_opts(&o, dir);
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    flush_keys(db, 100, 1, 20);
    lsm_close(db);
    char path[400];
    snprintf(path, sizeof(path), "%s/CURRENT", dir);
    FILE *f = fopen(path, "r");
    char name[64] = {0};
    cr_assert(f && fgets(name, sizeof(name), f));
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    long size = lt_size(path);
    cr_assert_gt(size, 16);
    cr_assert_eq(lt_flip(path, where >= 0 ? where : size + where), 0);

    char logp[300];
    snprintf(logp, sizeof(logp), "%s.log", dir);
    lsm_db *sentinel = (lsm_db *)0x1;
    db = sentinel;
    int saved = cap_begin(logp);
    kv_err rv = lsm_open(&db, &o, NULL, NULL);
    char *log = cap_end(saved, logp);
    cr_assert_eq(rv, KV_DATA_LOSS, "open over a corrupt MANIFEST: %s", kv_strerror(rv));
    cr_assert_eq(db, sentinel, "out written on failure");
    cr_assert(strstr(log, name) != NULL, "log does not name %s", name);
    free(log);
    unlink(logp);
    lt_rmrf(dir);
    free(dir);
}

Test(corrupt, manifest_flip_first_edit)
{
    manifest_flip(12);
}

Test(corrupt, manifest_flip_last_edit)
{
    manifest_flip(-3);
}

Test(corrupt, manifest_flip_length_field)
{
    manifest_flip(7); /* high byte of the first frame's length */
}

Test(corrupt, current_names_missing_manifest)
{
    char *dir = lt_mkdtemp("ccur");
    lsm_opts o;
    base_opts(&o, dir);
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    lsm_close(db);
    char path[400];
    snprintf(path, sizeof(path), "%s/CURRENT", dir);
    FILE *f = fopen(path, "w");
    fputs("MANIFEST-999999\n", f);
    fclose(f);
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_DATA_LOSS);
    unlink(path); /* no CURRENT but a MANIFEST: refuse to start empty */
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_DATA_LOSS);
    lt_rmrf(dir);
    free(dir);
}

/* ---- ENOSPC ---- */

static int acked;

static kv_err count_big(void *arg, const lsm_rec *r)
{
    (void)arg;
    static char want[8192];
    lt_value(want, sizeof(want), r->seqno);
    cr_assert_eq(r->vlen, sizeof(want));
    cr_assert(memcmp(r->value, want, sizeof(want)) == 0);
    acked--;
    return KV_OK;
}

/* The tmpfs mounted by the running ENOSPC test, unmounted by the fixture
 * even when an assertion ends the test early. */
static char mounted[300];

static int mount_tmpfs(const char *dir, const char *opts)
{
    if (mount("tmpfs", dir, "tmpfs", 0, opts) != 0)
        return -1;
    snprintf(mounted, sizeof(mounted), "%s", dir);
    return 0;
}

static void unmount_tmpfs(void)
{
    if (mounted[0]) {
        umount2(mounted, MNT_DETACH); /* lazy: a failed test may hold files open */
        mounted[0] = '\0';
    }
}

static void enospc(bool uring)
{
    char *dir = lt_mkdtemp("nospc");
    cr_assert_not_null(dir);
    char fd[300];
    snprintf(fd, sizeof(fd), "%s/fd", dir);
    mkdir(fd, 0755);
    if (mount_tmpfs(fd, "size=2m") != 0) {
        int e = errno;
        lt_rmrf(dir);
        free(dir);
        cr_skip_test("cannot mount a 2 MiB tmpfs (%s): ENOSPC test needs root", strerror(e));
    }
    lsm_opts o;
    base_opts(&o, fd);
    o.sync = LSM_SYNC_ALWAYS;
    o.disable_io_uring = !uring;
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    flush_keys(db, NK, 1, 100); /* ~250 KiB SST */
    uint64_t seq = NK;
    static char v[8192];
    kv_err rv = KV_OK;
    acked = 0;
    for (int i = 0; i < 1000 && rv == KV_OK; i++) {
        seq++;
        char k[16];
        int kn = snprintf(k, sizeof(k), "big%05d", i);
        lt_value(v, sizeof(v), seq);
        lsm_rec r = {.key = k,
                     .klen = (size_t)kn,
                     .value = v,
                     .vlen = sizeof(v),
                     .seqno = seq,
                     .type = LSM_PUT};
        rv = lsm_wal_append(db, &r, 1);
        acked += rv == KV_OK;
    }
    cr_assert_eq(rv, KV_RESOURCE_EXHAUSTED, "append on a full volume: %s", kv_strerror(rv));
    cr_assert_gt(acked, 10);
    cr_assert_eq(scan_keys(db, 1, 100, false), 0, "reads failed on a full volume");
    lsm_rec *run = calloc((size_t)acked, sizeof(*run));
    char(*keys)[16] = calloc((size_t)acked, 16);
    for (int i = 0; i < acked; i++) { /* the acknowledged records cannot be flushed */
        int kn = snprintf(keys[i], 16, "big%05d", i);
        run[i] = (lsm_rec){.key = keys[i],
                           .klen = (size_t)kn,
                           .value = v,
                           .vlen = sizeof(v),
                           .seqno = NK + 1 + (uint64_t)i,
                           .type = LSM_PUT};
    }
    rv = lsm_flush(db, run, (size_t)acked, seq - 1);
    cr_assert_eq(rv, KV_RESOURCE_EXHAUSTED, "flush on a full volume: %s", kv_strerror(rv));
    free(run);
    free(keys);
    cr_assert_eq(scan_keys(db, 1, 100, false), 0, "reads failed after a failed flush");
    lsm_rec r = {
        .key = "x", .klen = 1, .value = v, .vlen = sizeof(v), .seqno = seq + 1, .type = LSM_PUT};
    rv = lsm_wal_append(db, &r, 1);
    cr_assert_eq(rv, KV_RESOURCE_EXHAUSTED);
    lsm_close(db);

    cr_assert_eq(mount("tmpfs", fd, "tmpfs", MS_REMOUNT, "size=16m"), 0, "%s", strerror(errno));
    cr_assert_eq(lsm_open(&db, &o, count_big, NULL), KV_OK);
    cr_assert_eq(acked, 0, "%d acknowledged records were not replayed", acked);
    cr_assert_eq(scan_keys(db, 1, 100, false), 0);
    lsm_close(db);
    unmount_tmpfs();
    lt_rmrf(dir);
    free(dir);
}

Test(enospc, full_fast_volume_io_uring, .fini = unmount_tmpfs)
{
    enospc(true);
}

Test(enospc, full_fast_volume_pread, .fini = unmount_tmpfs)
{
    enospc(false);
}

Test(enospc, full_slow_volume_stops_compaction_not_reads, .fini = unmount_tmpfs)
{
    char *dir = lt_mkdtemp("sdfull");
    cr_assert_not_null(dir);
    char fd[300], sd[300];
    snprintf(fd, sizeof(fd), "%s/fd", dir);
    snprintf(sd, sizeof(sd), "%s/sd", dir);
    mkdir(sd, 0755);
    if (mount_tmpfs(sd, "size=256k") != 0) {
        int e = errno;
        lt_rmrf(dir);
        free(dir);
        cr_skip_test("cannot mount a tmpfs (%s): ENOSPC test needs root", strerror(e));
    }
    lsm_opts o;
    base_opts(&o, fd);
    o.slow_dir = sd;
    o.fast_mb = 1;
    o.no_auto_compaction = false;
    /* uncompressed: lt_value's repeating alphabet shrinks to a few bytes a
     * record under lz4, and the 3 MB written must overflow the 256 KiB */
    char err[128];
    cr_assert_eq(lsm_compression_parse("none", &o.compression, err, sizeof(err)), KV_OK, "%s", err);
    lsm_db *db;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    static char keys[1000][16], vals[1000][200];
    static lsm_rec run[1000];
    uint64_t seq = 0;
    for (int round = 0; round < 15; round++) {
        for (int i = 0; i < 1000; i++) {
            int kn = snprintf(keys[i], 16, "s%02d%05d", round, i);
            lt_value(vals[i], 200, ++seq);
            run[i] = (lsm_rec){.key = keys[i],
                               .klen = (size_t)kn,
                               .value = vals[i],
                               .vlen = 200,
                               .seqno = seq,
                               .type = LSM_PUT};
        }
        cr_assert_eq(lsm_flush(db, run, 1000, seq), KV_OK);
    }
    kv_err rv = lsm_compact_wait_idle(db);
    cr_assert_eq(rv, KV_RESOURCE_EXHAUSTED, "compaction into a full SD: %s", kv_strerror(rv));
    for (int round = 0; round < 15; round++) { /* every record still readable */
        for (int i = 0; i < 1000; i += 7) {
            char k[16], want[200];
            int kn = snprintf(k, sizeof(k), "s%02d%05d", round, i);
            lsm_rec r;
            rv = lsm_get(db, k, (size_t)kn, &r, NULL);
            cr_assert_eq(rv, KV_OK, "%s: %s", k, kv_strerror(rv));
            lt_value(want, 200, (uint64_t)round * 1000 + (uint64_t)i + 1);
            cr_assert(r.vlen == 200 && memcmp(r.value, want, 200) == 0, "%s wrong value", k);
            lsm_rec_free(&r);
        }
    }
    lsm_close(db);
    int on_sd = lt_count(sd, ".sst"); /* failed jobs must leave no orphans */
    o.no_auto_compaction = true;
    cr_assert_eq(lsm_open(&db, &o, NULL, NULL), KV_OK);
    lsm_stats st;
    cr_assert_eq(lsm_stats_get(db, &st), KV_OK);
    uint64_t live = 0;
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        live += st.levels[l].volume == LSM_TIER_SD ? st.levels[l].files : 0;
    cr_assert_eq((uint64_t)on_sd, live, "%d SSTs on SD, %llu live", on_sd,
                 (unsigned long long)live);
    lsm_close(db);
    unmount_tmpfs();
    lt_rmrf(dir);
    free(dir);
}
