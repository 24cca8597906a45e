/* SPDX-License-Identifier: MIT */
/*
 * Tests of compaction picking (compact.c): a level above its target pushes
 * down the file whose overlap in the next level is the smallest against its
 * own size (RocksDB's kMinOverlappingRatio), not the next file of a
 * round-robin pointer, HotRAP's pick on the last FD level weighs that
 * overlap against the cold bytes a file pushes down, and output files are
 * cut at the next level's file boundaries, and L0's oldest files move to L1
 * without a rewrite when nothing there overlaps them. The levels are laid out by manual
 * compactions with automatic compaction off, then the store is reopened
 * with it on so that the background picker makes its choices.
 */
#include "lsm_test_util.h"

#include "tests/kv_testfw.h"

#include "node/lsm/lsm_int.h"
#include "lsm_test_db.h"

/* The id of a file's smallest key ("k%07u"). */
static int first_id(const lsm_file *f)
{
    char k[KLEN + 1];
    cr_assert_eq(f->slen, KLEN);
    memcpy(k, f->smallest, KLEN);
    k[KLEN] = '\0';
    return atoi(k + 1);
}

/* Writes keys [a, b) and compacts them down to level `to` (2 or 3), one
 * file of that level when they fit file_size. */
static void put_down(tdb *t, int a, int b, int to)
{
    put_range(t, a, b);
    for (int l = 0; l < to; l++)
        cr_assert_eq(lsm_compact_level(t->db, l), KV_OK);
}

/* A HotRAP store whose L3 (SD) holds keys [0, dense) densely and [4500,
 * 4510) sparsely; L2 (the last FD level) and above are empty. */
static void hotrap_over_l3(tdb *t, const char *tag, int dense)
{
    lt_db_init(t, tag);
    t->o.hotrap = true;
    lt_db_start(t);
    put_down(t, 0, dense, 3);
    put_down(t, 4500, 4510, 3);
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.levels[2].volume, LSM_TIER_FD);
    cr_assert_eq(s.levels[3].volume, LSM_TIER_SD);
}

/* Reopens the store with automatic compaction on and waits until the
 * background picker is done; returns the stats. */
static lsm_stats settle(tdb *t)
{
    lsm_close(t->db);
    t->o.no_auto_compaction = false;
    lt_db_start(t);
    cr_assert_eq(lsm_compact_wait_idle(t->db), KV_OK);
    return stats_of(t);
}

/* L2: dense [0, 200), sparse [550, 560), dense [1000, 1200), one file each.
 * L1: [0, 150), [500, 650), [1000, 1150), ~35 KiB each, together just over
 * L1's 87 KiB target, two of them under it: one job is due. The middle file
 * overlaps 10 keys below, the others 200: a round-robin pointer (none yet
 * after a reopen) would take the first file and rewrite a dense L2 file. */
Test(pick, least_overlap_below_goes_first)
{
    tdb t;
    lt_db_init(&t, "pick");
    lt_db_start(&t);
    static const int l2[3][2] = {{0, 200}, {550, 560}, {1000, 1200}};
    for (int i = 0; i < 3; i++) {
        put_range(&t, l2[i][0], l2[i][1]);
        cr_assert_eq(lsm_compact_level(t.db, 0), KV_OK);
        cr_assert_eq(lsm_compact_level(t.db, 1), KV_OK);
    }
    for (int a = 0; a <= 1000; a += 500) {
        put_range(&t, a, a + 150);
        cr_assert_eq(lsm_compact_level(t.db, 0), KV_OK);
    }
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[1].files, 3);
    cr_assert_eq(s.levels[2].files, 3);
    cr_assert_gt(s.levels[1].bytes, s.levels[1].target_bytes, "L1 must need a job");
    cr_assert_lt(s.levels[1].bytes / 3 * 2, s.levels[1].target_bytes, "and only one");

    s = settle(&t);
    lsm_version *v = lsm_db_current(t.db);
    cr_assert_eq(v->nfiles[0], 0);
    cr_assert_eq(v->nfiles[1], 2, "L1 holds %zu files", v->nfiles[1]);
    cr_assert_eq(first_id(v->files[1][0]), 0, "L1's first file was pushed down");
    cr_assert_eq(first_id(v->files[1][1]), 1000);
    lsm_version_unref(v);
    cr_assert_eq(s.compactions, 1, "%llu jobs", (unsigned long long)s.compactions);
    for (int id = 500; id < 650; id++)
        get_id(&t, id, NULL, NULL);
    lt_db_close(&t);
}

/* HotRAP's pick on the last FD level (cost per cold byte, compact.c's
 * benefit_pick) takes the least overlap below when no key is hot: taking
 * the first of the full L2 files rewrote the dense part of L3 again and
 * again. L3 (SD): dense [0, 3000), sparse [4500, 4510).
 * L2: [0, 6000) rewritten, over its target: the jobs must push down files
 * of the sparse half and leave L2's first file (over dense L3) on FD. */
Test(pick, last_fd_level_takes_the_least_overlap_without_hot_keys)
{
    tdb t;
    hotrap_over_l3(&t, "pickfd", 3000);
    put_down(&t, 0, 6000, 2);
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[0].files + s.levels[1].files, 0);
    cr_assert_gt(s.levels[2].bytes, s.levels[2].target_bytes, "L2 must need jobs");
    cr_assert_lt(s.levels[2].bytes / 3, s.levels[2].target_bytes, "fewer than the sparse half");
    uint64_t jobs0 = s.compactions;
    s = settle(&t);
    cr_assert_gt(s.compactions, 0, "no job ran (%llu before the reopen)",
                 (unsigned long long)jobs0);
    cr_assert_leq(s.levels[2].bytes, s.levels[2].target_bytes);
    lsm_version *v = lsm_db_current(t.db);
    cr_assert_eq(first_id(v->files[2][0]), 0, "L2's first file (over dense L3) was pushed down");
    lsm_version_unref(v);
    for (int id = 0; id < 6000; id += 7)
        get_id(&t, id, NULL, NULL);
    lt_db_close(&t);
}

/* HotRAP's pick on the last FD level weighs a file's overlap below against
 * its cold bytes, so a small file goes before a full one when it costs less
 * per byte pushed down. L3 (SD): dense [0, COLD_DENSE), sparse [4500, 4510).
 * L2: [0, COLD_DENSE) in full files over the dense part, and [4500, 4650), a
 * file of about half the size over the sparse part; together just over L2's
 * target (COLD_DENSE is sized for 218-byte records in SST format 3: 3860 x
 * 218 + 150 x 218 + the blocks' trailers).
 * The small file's job rewrites almost nothing on SD; a full file's job
 * rewrites its size again. (The rule before took the largest files first
 * and pushed a full one, which left L2 under its target with the small file
 * still on FD.) */
#define COLD_DENSE 3860
Test(pick, last_fd_level_weighs_overlap_against_cold_bytes)
{
    tdb t;
    hotrap_over_l3(&t, "pickcold", COLD_DENSE);
    put_down(&t, 0, COLD_DENSE, 2);
    put_down(&t, 4500, 4650, 2);
    lsm_stats s = stats_of(&t);
    lsm_version *v = lsm_db_current(t.db);
    size_t n = v->nfiles[2];
    cr_assert_geq(n, 3);
    const lsm_file *small = v->files[2][n - 1], *full = v->files[2][0];
    cr_assert_eq(first_id(small), 4500);
    cr_assert_lt(small->size * 3, full->size * 2, "the sparse file is the smaller one");
    cr_assert_gt(s.levels[2].bytes, s.levels[2].target_bytes, "L2 must need a job");
    cr_assert_lt(s.levels[2].bytes - full->size, s.levels[2].target_bytes,
                 "one full file's job would be enough (L2 %llu bytes in %zu files, target %llu, "
                 "full file %llu, small %llu)",
                 (unsigned long long)s.levels[2].bytes, n,
                 (unsigned long long)s.levels[2].target_bytes, (unsigned long long)full->size,
                 (unsigned long long)small->size);
    lsm_version_unref(v);

    s = settle(&t);
    cr_assert_leq(s.levels[2].bytes, s.levels[2].target_bytes);
    cr_assert_eq(get_id(&t, 4500, NULL, NULL), LSM_TIER_SD, "the sparse file was pushed down");
    for (int id = 0; id < 4650; id += 7)
        if (id < COLD_DENSE || id >= 4500)
            get_id(&t, id, NULL, NULL);
    lt_db_close(&t);
}

/* Output files are cut at the next level's file boundaries (compact.c's
 * gp_walk). L3: [0, 100), [200, 300), [400, 500), [600, 700), a file each.
 * Then keys [0, 800) go down to L2 in one job: about 170 KiB of records,
 * whose files a cut at file_size alone (64 KiB here) would start near keys
 * 300 and 600, inside L3's files. Cut at the boundaries, each L2 file after
 * the first starts where an L3 file starts, so that a later job of one L2
 * file reads the L3 files it covers and no part of a neighbour. */
Test(output, files_are_cut_at_the_next_levels_boundaries)
{
    tdb t;
    lt_db_init(&t, "gpcut");
    lt_db_start(&t);
    static const int l3[4] = {0, 200, 400, 600};
    for (int i = 0; i < 4; i++)
        put_down(&t, l3[i], l3[i] + 100, 3);
    put_down(&t, 0, 800, 2);
    lsm_version *v = lsm_db_current(t.db);
    cr_assert_eq(v->nfiles[0] + v->nfiles[1], 0);
    cr_assert_eq(v->nfiles[3], 4, "L3 holds %zu files", v->nfiles[3]);
    for (size_t i = 0; i < 4; i++)
        cr_assert_eq(first_id(v->files[3][i]), l3[i]);
    cr_assert_geq(v->nfiles[2], 3, "L2 holds %zu files", v->nfiles[2]);
    for (size_t i = 1; i < v->nfiles[2]; i++) {
        int id = first_id(v->files[2][i]);
        cr_assert(id == 200 || id == 400 || id == 600,
                  "L2's file %zu starts at key %d, not at an L3 file's first key", i, id);
    }
    lsm_version_unref(v);
    for (int id = 0; id < 800; id += 3)
        get_id(&t, id, NULL, NULL);
    lt_db_close(&t);
}

/* ---- L0's files moved to L1 without a rewrite ---- */

/* Reads ids [a, b): each must return the record written at seqno
 * first + (id - a). */
static void expect_seqs(tdb *t, int a, int b, uint64_t first, const char *when)
{
    for (int id = a; id < b; id++) {
        uint64_t seq;
        get_id(t, id, &seq, NULL);
        cr_assert_eq(seq, first + (uint64_t)(id - a), "key %d %s: seqno %llu", id, when,
                     (unsigned long long)seq);
    }
}

/* Four flushes of appended, disjoint key ranges: at l0_trigger files L0
 * moves them to L1 as they are (RocksDB's trivial move), writing nothing;
 * a flush that overlaps L1 is merged. */
Test(l0_move, appended_flushes_reach_l1_without_a_rewrite)
{
    tdb t;
    lt_db_init(&t, "l0move");
    t.o.no_auto_compaction = false;
    lt_db_start(&t);
    for (int f = 0; f < 4; f++)
        put_range(&t, f * 100, f * 100 + 100);
    cr_assert_eq(lsm_compact_wait_idle(t.db), KV_OK);
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[0].files, 0, "L0 holds %llu files",
                 (unsigned long long)s.levels[0].files);
    cr_assert_eq(s.levels[1].comp_jobs, 0, "L0 was merged into L1");
    cr_assert_eq(s.levels[1].comp_written, 0);
    cr_assert_gt(s.levels[1].comp_moved, 0, "nothing moved to L1");
    for (int id = 0; id < 400; id++)
        get_id(&t, id, NULL, NULL);

    /* [350, 750) x 4: the first overlaps L1's last file, the rest each other */
    for (int f = 0; f < 4; f++)
        put_range(&t, 350 + f * 100, 350 + f * 100 + 100 + 50);
    cr_assert_eq(lsm_compact_wait_idle(t.db), KV_OK);
    s = stats_of(&t);
    cr_assert_gt(s.levels[1].comp_jobs, 0, "overlapping flushes must be merged");
    cr_assert_gt(s.levels[1].comp_written, 0);
    for (int id = 0; id < 800; id++)
        get_id(&t, id, NULL, NULL);
    lt_db_close(&t);
}

/* A flush of appended keys with a few stragglers below the keys flushed
 * before it is written as two L0 files: the stragglers, and the appended
 * body, which overlaps nothing and moves down without a rewrite. F1 is
 * [0, 160); F2 is id 150 (a straggler) and [160, 320). Moved: F1 and F2's
 * body; the straggler stays in L0 (it overlaps F1) and its newer record
 * wins. A flush with more than a sixteenth below stays one file. */
Test(l0_move, stragglers_are_flushed_apart_and_the_body_moves)
{
    tdb t;
    lt_db_init(&t, "l0strag");
    t.o.l0_trigger = 2;
    lt_db_start(&t);
    put_range(&t, 0, 160);
    int ids[161];
    ids[0] = 150;
    for (int i = 0; i < 160; i++)
        ids[i + 1] = 160 + i;
    uint64_t f2 = put_ids(&t, ids, 161);
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[0].files, 3, "L0 holds %llu files, not F1 and F2's two",
                 (unsigned long long)s.levels[0].files);
    s = settle(&t);
    cr_assert_eq(s.levels[0].files, 1, "L0 holds %llu files",
                 (unsigned long long)s.levels[0].files);
    cr_assert_eq(s.levels[1].files, 2, "L1 holds %llu files",
                 (unsigned long long)s.levels[1].files);
    cr_assert_eq(s.levels[1].comp_written, 0, "something was merged into L1");
    expect_seqs(&t, 150, 151, f2, "the straggler's");
    expect_seqs(&t, 160, 320, f2 + 1, "the body's");
    for (int id = 0; id < 150; id++)
        get_id(&t, id, NULL, NULL);

    for (int i = 0; i < 40; i++) /* 40 below of 120: one file */
        ids[i] = 100 + i;
    for (int i = 0; i < 80; i++)
        ids[40 + i] = 320 + i;
    lsm_close(t.db);
    t.o.no_auto_compaction = true;
    lt_db_start(&t);
    uint64_t f3 = put_ids(&t, ids, 120);
    s = stats_of(&t);
    cr_assert_eq(s.levels[0].files, 2, "L0 holds %llu files",
                 (unsigned long long)s.levels[0].files);
    expect_seqs(&t, 100, 140, f3, "F3's");
    lt_db_close(&t);
}

/* A file that overlaps an older one stays in L0, the others move: the
 * newer file left in L0 holds newer records of its keys, which reads must
 * still return. L0: A [0, 100), then B [50, 150), C [200, 300), D [400,
 * 500) (each newer); A, C and D overlap nothing in the empty L1 and no
 * other file that moves, B overlaps A: A, C and D move and L0 keeps B.
 * Keys 50..99 must read B's records, not A's. */
Test(l0_move, a_file_over_an_older_one_stays_and_newer_records_win)
{
    tdb t;
    lt_db_init(&t, "l0oldest");
    t.o.no_auto_compaction = false;
    t.o.fast_mb = 8; /* L0's byte trigger far above four small files */
    lt_db_start(&t);
    put_range(&t, 0, 100);
    uint64_t b0 = put_range(&t, 50, 150);
    put_range(&t, 200, 300);
    put_range(&t, 400, 500);
    cr_assert_eq(lsm_compact_wait_idle(t.db), KV_OK);
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[1].files, 3, "L1 holds %llu files",
                 (unsigned long long)s.levels[1].files);
    cr_assert_eq(s.levels[0].files, 1, "L0 holds %llu files",
                 (unsigned long long)s.levels[0].files);
    cr_assert_eq(s.levels[1].comp_written, 0);
    expect_seqs(&t, 50, 150, b0, "with A in L1 and B in L0");
    for (int id = 200; id < 500; id += id == 299 ? 101 : 1) /* C and D */
        get_id(&t, id, NULL, NULL);
    for (int id = 0; id < 50; id++)
        get_id(&t, id, NULL, NULL);
    lsm_close(t.db); /* and after recovery from the MANIFEST */
    lt_db_start(&t);
    expect_seqs(&t, 50, 150, b0, "after reopen");
    lt_db_close(&t);
}

/* Installs in L0, numbered above every file so far, the clean copies a
 * promotion of keys [a, b) makes of their versions at seqnos first,
 * first + 1, ... (LSM_F_PROMOTED | LSM_F_TWIN). */
static void install_promoted(tdb *t, int a, int b, uint64_t first)
{
    lsm_db *db = t->db;
    pthread_mutex_lock(&db->mu);
    uint64_t number = lsm_db_new_number(db);
    pthread_mutex_unlock(&db->mu);
    lsm_sst_builder *sb = NULL;
    cr_assert_eq(lsm_db_builder(db, 0, number, &sb), KV_OK);
    static uint8_t val[VLEN];
    for (int id = a; id < b; id++) {
        char key[KLEN + 1];
        key_of(key, id);
        memset(val, id + 1, VLEN);
        lsm_rec r = {.key = key,
                     .klen = KLEN,
                     .value = val,
                     .vlen = VLEN,
                     .seqno = first + (uint64_t)(id - a),
                     .type = LSM_PUT,
                     .flags = LSM_F_PROMOTED | LSM_F_TWIN};
        cr_assert_eq(lsm_sst_builder_add(sb, &r), KV_OK);
    }
    lsm_file *p = NULL;
    cr_assert_eq(lsm_sst_builder_finish(sb, 0, &p), KV_OK);
    lsm_edit e = {0};
    cr_assert_eq(lsm_edit_add(&e, p), KV_OK);
    pthread_mutex_lock(&db->mu);
    cr_assert_eq(lsm_db_install(db, &e), KV_OK);
    pthread_mutex_unlock(&db->mu);
    lsm_edit_free(&e);
    lsm_file_unref(p);
}

/* L0 files are not in seqno order by number: a promotion takes its file
 * number when it builds its file, and a flush that took a smaller number
 * before may install after it, holding newer versions of keys the promoted
 * file has copies of (promote.c's marks only see flushes installed before
 * the promotion). Here L0 holds the flush F ([0, 100) at seqnos 101..200)
 * and, numbered above it, promoted copies P of the same keys' older
 * versions (1..100, whose originals are in L3). L1 is empty and F overlaps
 * no older L0 file, so a move by file number alone would take F to L1 and
 * leave P in L0, above it: every read would return the older version. */
Test(l0_move, a_flush_numbered_below_older_promoted_copies_is_not_moved_alone)
{
    tdb t;
    lt_db_init(&t, "l0seq");
    t.o.l0_trigger = 2;
    lt_db_start(&t);
    put_down(&t, 0, 100, 3);             /* the originals, seqnos 1..100, on SD */
    uint64_t f0 = put_range(&t, 0, 100); /* F: 101..200 */
    install_promoted(&t, 0, 100, 1);
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[0].files, 2);
    cr_assert_eq(s.levels[1].files, 0);
    expect_seqs(&t, 0, 100, f0, "in L0, where the highest seqno wins");

    s = settle(&t); /* L0 is due at two files */
    expect_seqs(&t, 0, 100, f0, "after L0's compaction");
    cr_assert_eq(s.levels[0].files, 0, "L0 holds %llu files",
                 (unsigned long long)s.levels[0].files);
    lt_db_close(&t);
}

/* Promoted copies in L0 do not hold back the flushes after them. L0 holds
 * P, copies of keys [0, 100) whose originals are on SD, then two flushes
 * of appended keys, [1000, 1100) and [1100, 1200). Neither overlaps P or
 * L1, so both move to L1 while P stays in L0 (promoted files are merged,
 * never moved). When only a prefix of L0 by file number could move, P,
 * first, held both back and all three were merged into L1. */
Test(l0_move, flushes_move_past_promoted_copies_before_them)
{
    tdb t;
    lt_db_init(&t, "l0promo");
    t.o.l0_trigger = 3;
    lt_db_start(&t);
    put_down(&t, 0, 100, 3);
    install_promoted(&t, 0, 100, 1);
    uint64_t f1 = put_range(&t, 1000, 1100);
    uint64_t f2 = put_range(&t, 1100, 1200);
    lsm_stats s = settle(&t); /* L0 is due at three files */
    cr_assert_eq(s.levels[0].files, 1, "L0 holds %llu files",
                 (unsigned long long)s.levels[0].files);
    cr_assert_eq(s.levels[1].files, 2, "L1 holds %llu files",
                 (unsigned long long)s.levels[1].files);
    cr_assert_eq(s.levels[1].comp_jobs, 0, "L0 was merged into L1");
    cr_assert_eq(s.levels[1].comp_written, 0);
    expect_seqs(&t, 1000, 1100, f1, "moved");
    expect_seqs(&t, 1100, 1200, f2, "moved");
    expect_seqs(&t, 0, 100, 1, "the promoted copies'");
    lt_db_close(&t);
}

/* ---- the fast volume's stop (lsm_opts.fd_stop_pct) ---- */

/* Writes `rounds` flushes of 100 new keys each (about 21 KiB of records per
 * L0 file, uncompressed) while every write to the slow volume takes delay_us, so that
 * compaction into SD falls far behind; returns the store's stats after the
 * last flush. Two compaction threads: one keeps compacting FD levels while
 * the other waits on SD, as a busy node's would. */
static lsm_stats overfill(tdb *t, unsigned stop_pct, int rounds, unsigned delay_us)
{
    t->o.no_auto_compaction = false;
    t->o.hotrap = false; /* plain tiering: no retention or promotion adds FD bytes */
    t->o.compaction_threads = 2;
    t->o.fd_stop_pct = stop_pct;
    char err[128];
    cr_assert_eq(lsm_compression_parse("none", &t->o.compression, err, sizeof(err)), KV_OK);
    lt_db_start(t);
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_WRITE, .path_has = t->sd, .delay_us = delay_us});
    for (int r = 0; r < rounds; r++)
        put_range(t, r * 100, r * 100 + 100);
    lsm_stats s = stats_of(t);
    lsm_fault_set(NULL);
    return s;
}

/* Flushes wait while the FD levels hold more than fast_mb (1 MiB here) and
 * an FD level is due, so FD never holds more than its capacity plus the
 * flush that found it under; every key written stays readable, and once
 * compaction catches up FD is back within its levels' targets. */
Test(fd_stop, flushes_wait_while_the_fast_volume_is_full)
{
    tdb t;
    lt_db_init(&t, "fdstop");
    lsm_stats s = overfill(&t, 100, 160, 15000);
    uint64_t cap = t.o.fast_mb << 20, flush_max = 64u << 10;
    cr_assert_gt(s.stalls_fd, 0, "no flush waited for the fast volume (peak %llu of %llu)",
                 (unsigned long long)s.fd_peak_bytes, (unsigned long long)cap);
    cr_assert_leq(s.fd_peak_bytes, cap + flush_max, "FD held %llu bytes, capacity %llu",
                  (unsigned long long)s.fd_peak_bytes, (unsigned long long)cap);
    cr_assert_gt(s.stall_ns, 0);
    cr_assert_eq(lsm_compact_wait_idle(t.db), KV_OK);
    s = stats_of(&t);
    cr_assert_leq(s.fd_bytes, cap, "after the catch-up FD holds %llu",
                  (unsigned long long)s.fd_bytes);
    cr_assert_gt(s.levels[3].bytes, 2u << 20, "the data moved to SD (L3 %llu bytes)",
                 (unsigned long long)s.levels[3].bytes);
    for (int id = 0; id < 160 * 100; id += 37)
        get_id(&t, id, NULL, NULL);
    lt_db_close(&t);
}

/* The same writes with the stop set far above the capacity: FD fills past
 * it, which is what the stop prevents (and shows that the slowed SD makes
 * compaction fall behind at all in this test). SD writes are slower here
 * (40 ms) so that a busy host, which slows the writer and the FD
 * compactions too, still cannot let compaction into SD keep up: 15 ms gave
 * 3.5 MB quiet but 1.97 MB beside a parallel ctest. */
Test(fd_stop, without_the_stop_the_same_writes_overfill_the_fast_volume)
{
    tdb t;
    lt_db_init(&t, "fdnostop");
    lsm_stats s = overfill(&t, 100000, 160, 40000);
    uint64_t cap = t.o.fast_mb << 20;
    cr_assert_eq(s.stalls_fd, 0);
    cr_assert_gt(s.fd_peak_bytes, 2 * cap, "FD peaked at %llu bytes only",
                 (unsigned long long)s.fd_peak_bytes);
    cr_assert_eq(lsm_compact_wait_idle(t.db), KV_OK);
    for (int id = 0; id < 160 * 100; id += 37)
        get_id(&t, id, NULL, NULL);
    lt_db_close(&t);
}

/* ---- room on the fast device (compact.c, lsm_fd_room) ---- */

/* Bytes the regular files of dir take on the emulated device (their sizes
 * and the room set aside past their ends). */
static uint64_t dir_usage(const char *dir)
{
    return lsm_fault_dir_bytes(dir);
}

/* Plain tiering, no compression, 40 flushes of 100 keys compacted by hand
 * into L2 (about 840 KiB, near its target), L0 and L1 empty. */
static void fill_l2(tdb *t)
{
    t->o.hotrap = false;
    char err[128];
    cr_assert_eq(lsm_compression_parse("none", &t->o.compression, err, sizeof(err)), KV_OK);
    lt_db_start(t);
    for (int r = 0; r < 40; r++)
        put_range(t, r * 100, r * 100 + 100);
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 1), KV_OK);
}

/* The FD levels full (L2 near its target) and 30 overlapping flushes in L0
 * (950 KiB) behind them, as after a fast load, on a fast device with only 320 KiB
 * free (emulated: a write that would grow the directory past its capacity
 * fails with ENOSPC). The L0 -> L1 job of every L0 file needs twice that
 * while it writes; it used to fail, then fail again every second, and the
 * flushes after it failed too: the store never recovered. Now compaction
 * takes the oldest L0 files that fit and pushes the last FD level down to
 * SD for room, and flushes wait for it: every later write is acknowledged,
 * no write ever hits the device's limit, every key stays readable. */
Test(fd_space, a_fast_device_without_room_for_the_l0_job_does_not_wedge, .timeout = 120)
{
    tdb t;
    lt_db_init(&t, "fdspace");
    fill_l2(&t);
    for (int r = 40; r < 70; r++) /* each flush overlaps the next: no L0 file but the
                                   * oldest can move to L1 without a merge */
        put_range(&t, r * 100, r * 100 + 150);
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[0].files, 30);
    cr_assert_gt(s.levels[2].bytes, 700u << 10, "L2 holds %llu bytes",
                 (unsigned long long)s.levels[2].bytes);
    lsm_close(t.db);

    uint64_t cap = dir_usage(t.fd) + (320u << 10);
    lsm_fault_space(t.fd, cap);
    t.o.no_auto_compaction = false;
    lt_db_start(&t);
    for (int r = 70; r < 100; r++) /* put_range asserts that every flush succeeds */
        put_range(&t, r * 100, r * 100 + 100);
    cr_assert_eq(lsm_compact_wait_idle(t.db), KV_OK);
    s = stats_of(&t);
    cr_assert_eq(lsm_fault_space_hits(), 0, "%llu writes hit the device's limit",
                 (unsigned long long)lsm_fault_space_hits());
    cr_assert_leq(dir_usage(t.fd), cap);
    cr_assert_gt(s.space_waits, 0, "no job waited or shrank for room");
    cr_assert_lt(s.levels[0].files, t.o.l0_trigger, "L0 holds %llu files",
                 (unsigned long long)s.levels[0].files);
    cr_assert_gt(s.levels[3].bytes, 0, "nothing was pushed down to SD");
    for (int id = 0; id < 100 * 100; id += 7)
        get_id(&t, id, NULL, NULL);
    lsm_fault_space(NULL, 0);
    lt_db_close(&t);
}

/* A fast device too small for fast_mb beside the WAL: the fast levels are
 * sized to half of what the device leaves after the WAL (db.c, fit_fast),
 * not to fast_mb; a device with room changes nothing. */
Test(fd_space, the_fast_levels_fit_a_device_smaller_than_fast_mb)
{
    tdb t;
    lt_db_init(&t, "fdfit");
    t.o.fast_mb = 64;
    t.o.wal_max_bytes = 2u << 20;
    lsm_fault_space(t.fd, 10u << 20); /* 10 MiB: 4 MiB for the levels */
    lt_db_start(&t);
    lsm_stats s = stats_of(&t);
    cr_assert_eq(s.levels[1].target_bytes, (4u << 20) / 12, "L1's target: %llu",
                 (unsigned long long)s.levels[1].target_bytes);
    cr_assert_eq(s.levels[2].volume, LSM_TIER_FD);
    cr_assert_eq(s.levels[3].volume, LSM_TIER_SD);
    lsm_close(t.db);
    lsm_fault_space(t.fd, 1ull << 40); /* room: fast_mb stands */
    lt_db_start(&t);
    s = stats_of(&t);
    cr_assert_eq(s.levels[1].target_bytes, (64u << 20) / 12);
    lsm_fault_space(NULL, 0);
    lt_db_close(&t);
}

/* A fast device filled to its last byte (here by a file of another owner;
 * in the 2M load of bench/tier/README.md by the WAL) while L2 sits on it: a
 * compaction of L2 into SD writes nothing to FD, but it must record its
 * edit in the MANIFEST, on FD. That append used to fail with ENOSPC, so
 * the push-down that would have freed the room never installed and the
 * store stayed full. The MANIFEST now keeps room allocated past its end
 * (taken while the device had some) for its edits. */
Test(fd_space, a_full_fast_device_still_records_a_push_down, .timeout = 60)
{
    tdb t;
    lt_db_init(&t, "fdfull");
    fill_l2(&t);
    lsm_stats s = stats_of(&t);
    cr_assert_gt(s.levels[2].bytes, 700u << 10);
    uint64_t cap = dir_usage(t.fd) + (64u << 10);
    lsm_fault_space(t.fd, cap);
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/filler", t.fd);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    static char filler[64u << 10];
    cr_assert_eq(fwrite(filler, 1, sizeof(filler), f), sizeof(filler));
    cr_assert_eq(fclose(f), 0);
    cr_assert_geq(dir_usage(t.fd), cap, "the device is full");

    kv_err rv = lsm_compact_level(t.db, 2);
    cr_assert_eq(rv, KV_OK, "push-down of L2 on a full device: %s", kv_strerror(rv));
    cr_assert_eq(lsm_fault_space_hits(), 0, "%llu writes hit the device's limit",
                 (unsigned long long)lsm_fault_space_hits());
    s = stats_of(&t);
    cr_assert_eq(s.levels[2].files, 0, "L2 still holds %llu files",
                 (unsigned long long)s.levels[2].files);
    cr_assert_gt(s.levels[3].bytes, 700u << 10, "L3 (SD) holds %llu bytes",
                 (unsigned long long)s.levels[3].bytes);
    cr_assert_lt(dir_usage(t.fd), cap - (600u << 10), "the push-down freed no room");
    lsm_fault_space(NULL, 0);
    lsm_close(t.db); /* the MANIFEST holds the edit: every key is found after a reopen */
    lt_db_start(&t);
    cr_assert_eq(stats_of(&t).levels[2].files, 0);
    for (int id = 0; id < 40 * 100; id += 3)
        cr_assert_eq(get_id(&t, id, NULL, NULL), LSM_TIER_SD, "key %d", id);
    lt_db_close(&t);
}

/* L2 near its target, L0 empty, and less room on the fast device than one
 * flush needs: a flush waits while compaction pushes the last FD level down
 * to SD for room (lsm.flush_stalls_space), instead of failing with ENOSPC
 * once the device is full, as it did (every flush after that failed too). */
Test(fd_space, a_flush_waits_for_room_on_the_fast_device, .timeout = 120)
{
    tdb t;
    lt_db_init(&t, "fdroom");
    fill_l2(&t);
    lsm_close(t.db);

    uint64_t cap = dir_usage(t.fd) + (24u << 10); /* about one flush's L0 file */
    lsm_fault_space(t.fd, cap);
    /* a slow SD, so that the first flush comes while the room is still short */
    lsm_fault_set(&(lsm_fault){.ops = LSM_FOP_WRITE, .path_has = t.sd, .delay_us = 20000});
    t.o.no_auto_compaction = false;
    lt_db_start(&t);
    for (int r = 40; r < 60; r++)
        put_range(&t, r * 100, r * 100 + 100);
    lsm_fault_set(NULL);
    lsm_stats s = stats_of(&t);
    cr_assert_gt(s.stalls_space, 0, "no flush waited for room");
    cr_assert_eq(lsm_compact_wait_idle(t.db), KV_OK);
    cr_assert_eq(lsm_fault_space_hits(), 0, "%llu writes hit the device's limit",
                 (unsigned long long)lsm_fault_space_hits());
    cr_assert_leq(dir_usage(t.fd), cap);
    cr_assert_gt(stats_of(&t).levels[3].bytes, 0, "nothing was pushed down to SD");
    for (int id = 0; id < 60 * 100; id += 7)
        get_id(&t, id, NULL, NULL);
    lsm_fault_space(NULL, 0);
    lt_db_close(&t);
}
