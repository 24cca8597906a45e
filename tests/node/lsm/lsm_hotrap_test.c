/* SPDX-License-Identifier: MIT */
/*
 * Tests of HotRAP in the LSM: RALT (score decay, the stable bit, eviction
 * at the hot-set limit, hot-byte estimates and range iteration), retention
 * of hot records on FD when compacting into SD, promotion of records read
 * from SD and of hot records met by compactions inside SD, promotion never shadowing a newer write
 * (in memory, flushed to L0, or flushed and compacted down to SD), and hotrap off.
 */
#include "lsm_test_util.h"

#include "tests/kv_testfw.h"
#include <math.h>
#include <signal.h>
#include <sys/resource.h>

#include "common/hash.h"
#include "node/lsm/lsm_int.h"
#include "lsm_test_db.h"

/* ---- RALT ---- */

static void acc(ralt *r, const char *k, size_t vlen)
{
    ralt_access(r, k, strlen(k), vlen);
}

/* RALT runs live in a directory: one scratch directory per table. */
static char *ralt_dirs[8];

static kv_err ralt_open_tmp(ralt **r, ralt_opts *o)
{
    size_t i = 0;
    while (ralt_dirs[i])
        i++;
    ralt_dirs[i] = lt_mkdtemp("ralt");
    o->dir = ralt_dirs[i];
    return ralt_open(r, o);
}

static void ralt_close_tmp(ralt *r)
{
    ralt_close(r);
    for (size_t i = 0; ralt_dirs[i]; i++) {
        lt_rmrf(ralt_dirs[i]);
        free(ralt_dirs[i]);
        ralt_dirs[i] = NULL;
    }
}

Test(ralt, score_decays_per_tick)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 1 << 20, .tick_bytes = 100, .buf_entries = 1};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    acc(r, "a", 99); /* at tick 0; the clock moves to tick 1 */
    cr_assert_eq(ralt_flush(r), KV_OK);
    double s1 = ralt_score(r, "a", 1);
    cr_assert(fabs(s1 - exp2(-1.0 / 16)) < 1e-9, "score %f", s1);
    acc(r, "b", 1599); /* 16 more ticks */
    cr_assert_eq(ralt_flush(r), KV_OK);
    double s2 = ralt_score(r, "a", 1);
    cr_assert(fabs(s2 - exp2(-17.0 / 16)) < 1e-9, "score %f", s2);
    cr_assert(fabs(s2 / s1 - 0.5) < 1e-9, "a half-life is 16 ticks");
    acc(r, "a", 99);
    cr_assert_eq(ralt_flush(r), KV_OK);
    double s3 = ralt_score(r, "a", 1);
    cr_assert(fabs(s3 - (exp2(-18.0 / 16) + exp2(-1.0 / 16))) < 1e-9, "score %f", s3);
    ralt_close_tmp(r);
}

Test(ralt, stable_needs_a_second_access_while_the_counter_is_positive)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 1 << 20, .tick_bytes = 100};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    acc(r, "twice", 10);
    acc(r, "twice", 10);
    acc(r, "once", 10);
    acc(r, "late", 99);
    cr_assert_eq(ralt_flush(r), KV_OK);
    cr_assert(ralt_is_hot(r, "twice", 5));
    cr_assert(!ralt_is_hot(r, "once", 4));
    cr_assert(!ralt_is_hot(r, "late", 4));
    cr_assert(!ralt_is_hot(r, "never", 5));
    acc(r, "filler", 4 * 5 * 100); /* 5 periods of 4 ticks: late's counter is 0 */
    acc(r, "late", 10);
    acc(r, "soon", 10);
    cr_assert_eq(ralt_flush(r), KV_OK);
    acc(r, "soon", 10); /* in a later run: folded across runs */
    cr_assert_eq(ralt_flush(r), KV_OK);
    cr_assert(!ralt_is_hot(r, "late", 4), "seen again only after its counter ran out");
    cr_assert(ralt_is_hot(r, "soon", 4));
    ralt_close_tmp(r);
}

/* period_bytes sets the counter period (the engine passes the FD size):
 * a second access 20 ticks after the first is too late with the default
 * period of 4 ticks and in time with a period of 10. */
Test(ralt, the_counter_period_follows_period_bytes)
{
    for (int longer = 0; longer < 2; longer++) {
        ralt *r;
        ralt_opts o = {.hot_limit = 1 << 20, .tick_bytes = 100, .period_bytes = longer ? 1000 : 0};
        cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
        acc(r, "key", 95);          /* tick 0 */
        acc(r, "filler", 20 * 100); /* 20 ticks */
        acc(r, "key", 95);          /* 5 default periods later; 2 long ones */
        cr_assert_eq(ralt_flush(r), KV_OK);
        cr_assert_eq(ralt_is_hot(r, "key", 3), longer == 1, "period %s",
                     longer ? "10 ticks" : "4 ticks");
        ralt_close_tmp(r);
    }
}

Test(ralt, evicts_lowest_scores_at_the_hot_set_limit)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 10000, .tick_bytes = 1 << 20};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    char k[16];
    for (int round = 0; round < 2; round++) /* 200 stable keys x 100 bytes */
        for (int i = 0; i < 200; i++) {
            snprintf(k, sizeof(k), "key%05d", i); /* 8 bytes */
            ralt_access(r, k, 8, 92);
        }
    for (int i = 0; i < 20; i++) /* the first 20 are hotter */
        for (int t = 0; t < 5; t++) {
            snprintf(k, sizeof(k), "key%05d", i);
            ralt_access(r, k, 8, 92);
        }
    cr_assert_eq(ralt_flush(r), KV_OK);
    ralt_stats st;
    ralt_stats_get(r, &st);
    cr_assert_leq(st.hot_bytes, 10000, "hot bytes %llu", (unsigned long long)st.hot_bytes);
    cr_assert_gt(st.hot_bytes, 5000, "evicts about 10%% below the limit, not everything");
    cr_assert_gt(st.evicted, 0);
    for (int i = 0; i < 20; i++) {
        snprintf(k, sizeof(k), "key%05d", i);
        cr_assert(ralt_is_hot(r, k, 8), "hottest key %d evicted", i);
    }
    ralt_close_tmp(r);
}

static void count_key(void *arg, const void *key, size_t klen, uint32_t vlen)
{
    (void)key;
    (void)klen;
    (void)vlen;
    (*(int *)arg)++;
}

Test(ralt, hot_bytes_in_a_range)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 1 << 20};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    char k[16];
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof(k), "k%03d", i);
        ralt_access(r, k, 4, 50);
        if (i % 2 == 0)
            ralt_access(r, k, 4, 50); /* even keys are stable */
    }
    cr_assert_eq(ralt_hot_bytes(r, "k010", 4, "k019", 4), 5 * 54);
    cr_assert_eq(ralt_hot_bytes(r, "k", 1, "l", 1), 50 * 54);
    cr_assert_eq(ralt_hot_bytes(r, "x", 1, "z", 1), 0);
    int n = 0;
    cr_assert_eq(ralt_hot_range(r, "k020", 4, "k039", 4, count_key, &n), KV_OK);
    cr_assert_eq(n, 10);
    ralt_close_tmp(r);
}

/* The merge rule, modelled: a key's accesses folded one by one, oldest
 * first (score decayed and summed, last and first tick, counter restarted
 * at each access, stable once an access comes while the counter of the
 * previous ones is positive). */
#define NMK 200 /* keys of the model test */

typedef struct mkey {
    bool seen, stable;
    double score;
    uint64_t tick, first;
} mkey;

static void model_access(mkey *m, uint64_t t)
{
    if (!m->seen) {
        *m = (mkey){.seen = true, .score = 1.0, .tick = t, .first = t};
        return;
    }
    uint64_t periods = (t - m->tick) / 4; /* RALT_PERIOD_TICKS */
    m->stable = m->stable || periods < 5; /* the counter starts at 5 */
    m->score = m->score * exp2(-(double)(t - m->tick) / 16.0) + 1.0;
    m->tick = t;
}

static void model_check(ralt *r, const mkey *m, int nkeys, uint64_t now, const char *when)
{
    char k[16];
    for (int i = 0; i < nkeys; i++) {
        snprintf(k, sizeof(k), "m%03d", i);
        bool hot = ralt_is_hot(r, k, 4);
        cr_assert_eq(hot, m[i].seen && m[i].stable, "%s: %s hot=%d model=%d", when, k, hot,
                     m[i].stable);
        double want = m[i].seen ? m[i].score * exp2(-(double)(now - m[i].tick) / 16.0) : 0;
        double got = ralt_score(r, k, 4);
        cr_assert(fabs(got - want) <= 1e-9 * (1 + want), "%s: %s score %.12f model %.12f", when, k,
                  got, want);
    }
}

Test(ralt, merge_rule_matches_a_sequential_fold_however_runs_split)
{
    for (int trial = 0; trial < 4; trial++) {
        ralt *r;
        size_t cap = 4 + (size_t)trial * 9; /* buffer sizes: runs split accesses differently */
        ralt_opts o = {.hot_limit = 1u << 30, .tick_bytes = 16, .buf_entries = cap};
        cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
        mkey m[NMK] = {0};
        uint64_t seed = 7 + (uint64_t)trial, accessed = 0;
        size_t inbuf = 0;
        for (int i = 0; i < 1500; i++) {
            uint64_t x = lt_rand(&seed) % NMK;
            int id = (int)(x * x / NMK); /* skewed: low ids are hotter */
            size_t vlen = 1 + lt_rand(&seed) % 60;
            char k[16];
            snprintf(k, sizeof(k), "m%03d", id);
            model_access(&m[id], accessed / 16);
            accessed += 4 + vlen;
            ralt_access(r, k, 4, vlen);
            if (++inbuf == cap) { /* the buffer just became a run: several runs now */
                inbuf = 0;
                if ((size_t)(i % 97) < cap)
                    model_check(r, m, NMK, accessed / 16, "across runs");
            }
            if (lt_rand(&seed) % 400 == 0) {
                cr_assert_eq(ralt_flush(r), KV_OK);
                inbuf = 0;
                model_check(r, m, NMK, accessed / 16, "merged");
            }
        }
        cr_assert_eq(ralt_flush(r), KV_OK);
        model_check(r, m, NMK, accessed / 16, "final");
        ralt_stats st;
        ralt_stats_get(r, &st);
        cr_assert_eq(st.runs, 1);
        cr_assert_eq(st.evicted, 0);
        cr_assert_gt(st.stable, 0);
        cr_assert_lt(st.stable, st.entries, "some keys stable, some not");
        cr_assert_gt(st.file_bytes, 0, "the run is a file on FD");
        ralt_close_tmp(r);
    }
}

Test(ralt, a_restart_deletes_stale_runs_and_relearns)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 1 << 20};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    char dir[256];
    snprintf(dir, sizeof(dir), "%s", o.dir);
    acc(r, "hot", 10);
    acc(r, "hot", 10);
    acc(r, "cold", 10);
    cr_assert_eq(ralt_flush(r), KV_OK);
    cr_assert(ralt_is_hot(r, "hot", 3));
    cr_assert_eq(lt_count(dir, ".sst"), 1, "one run file");
    char *run = lt_find(dir, ".sst", 1), keep[300];
    cr_assert_not_null(run);
    snprintf(keep, sizeof(keep), "%s.keep", run);
    cr_assert_eq(link(run, keep), 0);
    ralt_close(r);
    cr_assert_eq(lt_count(dir, ".sst"), 0, "a clean close deletes the runs");
    cr_assert_eq(rename(keep, run), 0); /* as a crash would leave it */
    free(run);
    cr_assert_eq(ralt_open(&r, &o), KV_OK);
    cr_assert_eq(lt_count(dir, ".sst"), 0, "open deletes stale runs");
    cr_assert(!ralt_is_hot(r, "hot", 3), "hotness is re-learned, not read back");
    ralt_stats st;
    ralt_stats_get(r, &st);
    cr_assert_eq(st.entries, 0);
    acc(r, "hot", 10);
    acc(r, "hot", 10);
    cr_assert_eq(ralt_flush(r), KV_OK);
    cr_assert(ralt_is_hot(r, "hot", 3));
    ralt_close_tmp(r);
}

Test(ralt, a_corrupt_run_is_reported_and_the_table_relearns)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 1 << 20};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    char dir[256], k[16];
    snprintf(dir, sizeof(dir), "%s", o.dir);
    for (int i = 0; i < 300; i++) { /* several blocks of stable keys */
        snprintf(k, sizeof(k), "c%03d", i);
        acc(r, k, 10);
        acc(r, k, 10);
    }
    cr_assert_eq(ralt_flush(r), KV_OK);
    cr_assert(ralt_is_hot(r, "c299", 4)); /* block 0 not read (nor kept by this thread) */
    char *run = lt_find(dir, ".sst", 1);
    cr_assert_not_null(run);
    cr_assert_eq(lt_flip(run, 100), 0); /* inside the first data block */
    free(run);
    cr_assert(!ralt_is_hot(r, "c000", 4), "an unreadable block answers not hot");
    cr_assert(ralt_is_hot(r, "c299", 4), "other blocks still answer");
    ralt_stats st;
    ralt_stats_get(r, &st);
    cr_assert_gt(st.errors, 0, "the error is counted (and logged)");
    acc(r, "new", 10);
    cr_assert_eq(ralt_flush(r), KV_DATA_LOSS, "the merge meets the corrupt run");
    ralt_stats_get(r, &st);
    cr_assert_eq(st.runs, 0, "the table is dropped");
    cr_assert_eq(lt_count(dir, ".sst"), 0, "and its files deleted");
    acc(r, "again", 10);
    acc(r, "again", 10);
    cr_assert_eq(ralt_flush(r), KV_OK);
    cr_assert(ralt_is_hot(r, "again", 5), "it learns again");
    ralt_close_tmp(r);
}

/* ralt_access_nb (an nng callback's access, engine_get_mem): it records
 * accesses while the buffer has room and refuses, recording nothing, the
 * one that would fill it, since ralt_access would write a run there. */
Test(ralt, a_non_blocking_access_refuses_only_what_would_write_a_run)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 1 << 20, .tick_bytes = 100, .buf_entries = 4};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    ralt_stats st;
    for (int round = 0; round < 3; round++) {
        ralt_stats_get(r, &st);
        uint64_t runs = st.runs;
        /* three fit (the buffer is made if a flush took it), the fourth
         * would fill the buffer */
        for (int i = 0; i < 3; i++)
            cr_assert(ralt_access_nb(r, "nb", 2, 10), "round %d access %d", round, i);
        cr_assert_not(ralt_access_nb(r, "nb", 2, 10), "round %d: the run write is refused", round);
        ralt_stats_get(r, &st);
        cr_assert_eq(st.runs, runs, "nothing written by the refusal");
        acc(r, "nb", 10); /* the blocking access takes it and writes the run */
        ralt_stats_get(r, &st);
        cr_assert_eq(st.runs, runs + 1, "round %d: the blocking access wrote the run", round);
    }
    cr_assert(ralt_is_hot(r, "nb", 2), "the non-blocking accesses counted");
    cr_assert(ralt_access_nb(r, "", 0, 10), "an empty key is dropped, as ralt_access drops it");
    ralt_close_tmp(r);
}

/* Found by tests/fuzz/fuzz_ralt: a full merge that fails for another reason
 * than a corrupt run (here the file size limit, as when FD is full) keeps
 * the runs, RALT_MAX_RUNS + 1 of them, and the next buffer's run was then
 * written past the end of the run array. */
Test(ralt, a_failed_full_merge_does_not_overflow_the_runs)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 1 << 20, .buf_entries = 4, .disable_io_uring = true};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    char k[16];
    int n = 0;
    ralt_stats st;
    for (int run = 0; run < 8; run++) /* a full buffer is written as a run of its own */
        for (int i = 0; i < 4; i++, n++)
            snprintf(k, sizeof(k), "k%03d", n), acc(r, k, 10);
    ralt_stats_get(r, &st);
    cr_assert_eq(st.runs, 8);
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 1024; /* a run of 4 keys fits, the merge of 36 does not */
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 4; i++, n++)
            snprintf(k, sizeof(k), "k%03d", n), acc(r, k, 10);
        ralt_stats_get(r, &st);
        cr_assert_eq(st.runs, 9, "round %d: %llu runs", round, (unsigned long long)st.runs);
    }
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert_eq(ralt_flush(r), KV_OK, "the full merge succeeds once there is room");
    ralt_stats_get(r, &st);
    cr_assert_eq(st.runs, 1);
    cr_assert(ralt_is_hot(r, "k000", 4) == false); /* read once: tracked, not stable */
    ralt_close_tmp(r);
}

/* The table's compaction is tiered: 90 buffers of new keys are merged
 * mostly among the newest runs, and the whole table is rewritten far less
 * often than at every ninth run (10 times here, before). A key read in
 * runs far apart still folds to one score of all its reads. */
Test(ralt, merges_gather_the_newest_runs_before_rewriting_the_table)
{
    ralt *r;
    ralt_opts o = {.hot_limit = 1u << 30, .tick_bytes = 1u << 20, .buf_entries = 16};
    cr_assert_eq(ralt_open_tmp(&r, &o), KV_OK);
    char k[16];
    for (int run = 0; run < 90; run++) {
        for (int i = 0; i < (run % 30 == 0 ? 15 : 16); i++)
            snprintf(k, sizeof(k), "k%02d-%02d", run, i), acc(r, k, 10);
        if (run % 30 == 0)
            acc(r, "again", 10); /* in runs 0, 30 and 60 */
    }
    ralt_stats st;
    ralt_stats_get(r, &st);
    cr_log_info("90 runs: %llu merges, %llu full, %llu bytes merged, %llu runs",
                (unsigned long long)st.merges, (unsigned long long)st.full_merges,
                (unsigned long long)st.merge_bytes, (unsigned long long)st.runs);
    cr_assert_leq(st.runs, 8);
    cr_assert_gt(st.merges, 10);
    cr_assert_lt(st.full_merges, 5, "%llu full merges", (unsigned long long)st.full_merges);
    cr_assert(fabs(ralt_score(r, "again", 5) - 3.0) < 1e-9, "score %f", ralt_score(r, "again", 5));
    cr_assert(ralt_is_hot(r, "again", 5));
    cr_assert_eq(ralt_flush(r), KV_OK);
    ralt_stats_get(r, &st);
    cr_assert_eq(st.runs, 1);
    cr_assert_eq(st.entries, 90 * 16 - 3 + 1, "every key once: %llu",
                 (unsigned long long)st.entries);
    cr_assert(fabs(ralt_score(r, "again", 5) - 3.0) < 1e-9);
    ralt_close_tmp(r);
}

/* ---- the db ---- */

static const char *newer_key; /* the memory-tier callback's answer */

static bool newer_cb(void *arg, const void *key, size_t klen, uint64_t seqno)
{
    (void)arg;
    (void)seqno;
    return newer_key && klen == strlen(newer_key) && memcmp(key, newer_key, klen) == 0;
}

static tdb *t_open(const char *tag, bool hotrap)
{
    tdb *t = calloc(1, sizeof(*t));
    lt_db_init(t, tag);
    t->o.hotrap = hotrap;
    t->o.newer = newer_cb;
    newer_key = NULL;
    lt_db_start(t);
    return t;
}

static void t_close(tdb *t)
{
    lt_db_close(t);
    free(t);
}

/* Appends one PUT of id to the WAL (the memory tier's copy); returns seqno. */
static uint64_t write_one(tdb *t, int id)
{
    char k[KLEN + 1];
    key_of(k, id);
    lsm_rec r = {.key = k, .klen = KLEN, .value = "new", .vlen = 3, .seqno = ++t->seq};
    r.type = LSM_PUT;
    cr_assert_eq(lsm_wal_append(t->db, &r, 1), KV_OK);
    return r.seqno;
}

static void flush_one(tdb *t, int id, uint64_t seq)
{
    char k[KLEN + 1];
    key_of(k, id);
    lsm_rec r = {.key = k, .klen = KLEN, .value = "new", .vlen = 3, .seqno = seq};
    r.type = LSM_PUT;
    cr_assert_eq(lsm_flush(t->db, &r, 1, t->seq), KV_OK);
}

/* Keys 0..n-1 written and compacted into SD. */
static void fill_sd(tdb *t, int n)
{
    put_range(t, 0, n);
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 1), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 2), KV_OK);
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.levels[0].files + s.levels[1].files + s.levels[2].files, 0, "all on SD");
    cr_assert_eq(s.levels[2].volume, LSM_TIER_FD);
    cr_assert_eq(s.levels[3].volume, LSM_TIER_SD);
}

Test(hotrap, retention_keeps_hot_records_on_fd)
{
    tdb *t = t_open("retain", true);
    put_range(t, 0, 2000);                  /* L0, on FD */
    for (int round = 0; round < 2; round++) /* keys 0..49 become hot while on FD */
        for (int i = 0; i < 50; i++)
            cr_assert_eq(get_id(t, i, NULL, NULL), LSM_TIER_FD);
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 1), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 2), KV_OK); /* L2 (last FD) -> L3 (SD) */
    lsm_stats s = stats_of(t);
    cr_assert_gt(s.retained_recs, 0);
    cr_assert_gt(s.levels[2].files, 0, "hot records stay on the last FD level");
    for (int i = 0; i < 50; i++)
        cr_assert_eq(get_id(t, i, NULL, NULL), LSM_TIER_FD, "hot key %d moved to SD", i);
    for (int i = 100; i < 2000; i += 97)
        cr_assert_eq(get_id(t, i, NULL, NULL), LSM_TIER_SD, "cold key %d stayed on FD", i);
    t_close(t);
}

Test(hotrap, a_hot_sd_record_read_repeatedly_is_promoted)
{
    tdb *t = t_open("promote", true);
    fill_sd(t, 2000);
    uint64_t seq0, seq;
    uint8_t flags;
    cr_assert_eq(get_id(t, 7, &seq0, &flags), LSM_TIER_SD);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(get_id(t, 7, NULL, NULL), LSM_TIER_SD);
    get_id(t, 8, NULL, NULL); /* read once: not hot */
    lsm_promo_sync(t->db);
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.promoted_recs, 1, "promoted %llu", (unsigned long long)s.promoted_recs);
    cr_assert_eq(s.promo_drop_dup, 3, "older reads of key 7");
    cr_assert_eq(s.promo_drop_cold, 1, "key 8");
    cr_assert_eq(s.promo_drop_newer + s.promo_drop_on_fd + s.promo_drop_full, 0);
    cr_assert_eq(s.promo_dropped, 4);
    cr_assert_eq(s.levels[0].files, 1);
    cr_assert_eq(get_id(t, 7, &seq, &flags), LSM_TIER_FD);
    cr_assert_eq(seq, seq0, "promotion keeps the seqno");
    cr_assert(flags & LSM_F_PROMOTED);
    cr_assert_eq(get_id(t, 8, NULL, NULL), LSM_TIER_SD);
    cr_assert_gt(s.reads_sd, 0);
    cr_assert_gt(s.ralt_entries, 0);
    cr_assert_gt(s.hot_set_limit, 0);
    t_close(t);
}

/* Reads id from SD until it is hot and returns the seqno read. */
static uint64_t read_hot(tdb *t, int id)
{
    uint64_t seq;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(get_id(t, id, &seq, NULL), LSM_TIER_SD);
    return seq;
}

Test(hotrap, promotion_never_shadows_a_write_in_memory)
{
    tdb *t = t_open("shadowmem", true);
    fill_sd(t, 500);
    read_hot(t, 5);
    uint64_t w = write_one(t, 5); /* lands after the read, not flushed */
    lsm_promo_sync(t->db);        /* the memory tier (newer_cb) does not answer */
    flush_one(t, 5, w);           /* the write reaches L0 after the promotion */
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK);
    uint64_t seq;
    get_id(t, 5, &seq, NULL);
    cr_assert_eq(seq, w, "the promoted copy shadows the write");
    t_close(t);
}

/* Writes that are not flushed yet do not block promotions: a key whose
 * mark slot is shared with an unflushed write (the memtable's last writes
 * never flush in a read-only phase) is promoted. (Flushed writes drop
 * candidates read before them: the shadowing tests above.) */
Test(hotrap, unflushed_writes_do_not_block_promotion)
{
    tdb *t = t_open("unflushed", true);
    fill_sd(t, 500);
    char k5[KLEN + 1], k[16];
    key_of(k5, 5);
    uint64_t slot = kv_hash64(k5, KLEN, 0x4d41524bu) >> 48; /* promote.c's mark slot */
    int x = 0;
    do
        snprintf(k, sizeof(k), "x%07d", ++x);
    while ((kv_hash64(k, KLEN, 0x4d41524bu) >> 48) != slot);
    read_hot(t, 5);
    lsm_rec r = {.key = k, .klen = KLEN, .value = "v", .vlen = 1, .seqno = ++t->seq};
    r.type = LSM_PUT;
    cr_assert_eq(lsm_wal_append(t->db, &r, 1), KV_OK); /* same slot, stays unflushed */
    lsm_promo_sync(t->db);
    cr_assert_eq(stats_of(t).promoted_recs, 1);
    cr_assert_eq(get_id(t, 5, NULL, NULL), LSM_TIER_FD);
    t_close(t);
}

Test(hotrap, promotion_asks_the_memory_tier)
{
    tdb *t = t_open("shadowcb", true);
    fill_sd(t, 500);
    read_hot(t, 6);
    read_hot(t, 9);
    newer_key = "k0000006"; /* the engine holds a newer version of 6 */
    lsm_promo_sync(t->db);
    cr_assert_eq(stats_of(t).promoted_recs, 1);
    cr_assert_eq(get_id(t, 6, NULL, NULL), LSM_TIER_SD);
    cr_assert_eq(get_id(t, 9, NULL, NULL), LSM_TIER_FD);
    t_close(t);
}

Test(hotrap, promotion_never_shadows_a_write_flushed_to_l0)
{
    tdb *t = t_open("shadowl0", true);
    fill_sd(t, 500);
    uint64_t old = read_hot(t, 5);
    uint64_t w = write_one(t, 5);
    flush_one(t, 5, w);
    lsm_promo_sync(t->db);
    uint64_t seq;
    cr_assert_eq(get_id(t, 5, &seq, NULL), LSM_TIER_FD);
    cr_assert_eq(seq, w, "got seqno %llu (old %llu)", (unsigned long long)seq,
                 (unsigned long long)old);
    t_close(t);
}

static int never_retain(void *arg, const lsm_rec *rec, int from_level)
{
    (void)arg;
    (void)rec;
    return from_level + 1;
}

Test(hotrap, promotion_never_shadows_a_write_flushed_and_compacted)
{
    tdb *t = t_open("shadowsd", true);
    lsm_close(t->db); /* reopen without retention: the new version must reach SD */
    t->o.route = never_retain;
    cr_assert_eq(lsm_open(&t->db, &t->o, NULL, NULL), KV_OK);
    fill_sd(t, 500);
    uint64_t old = read_hot(t, 5);
    read_hot(t, 6);
    uint64_t w = write_one(t, 5);
    flush_one(t, 5, w);
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK); /* the new version of 5 goes down */
    cr_assert_eq(lsm_compact_level(t->db, 1), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 2), KV_OK);
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.levels[0].files + s.levels[1].files + s.levels[2].files, 0);
    lsm_promo_sync(t->db);
    uint64_t seq;
    get_id(t, 5, &seq, NULL);
    cr_assert_eq(seq, w, "got seqno %llu (old %llu)", (unsigned long long)seq,
                 (unsigned long long)old);
    cr_assert_eq(get_id(t, 6, NULL, NULL), LSM_TIER_FD, "6 still promoted");
    t_close(t);
}

Test(hotrap, compaction_inside_sd_promotes_hot_records)
{
    tdb *t = calloc(1, sizeof(*t));
    lt_db_init(t, "sdcompact");
    t->o.newer = newer_cb;
    newer_key = NULL;
    /* uncompressed, so that L3 holds several files and L3 -> L4 merges (one
     * lz4 file would be moved, and a move promotes nothing) */
    t->o.compression.slow = LSM_COMPRESS_NONE;
    lt_db_start(t);
    fill_sd(t, 500); /* L3, on SD */
    char k[KLEN + 1];
    for (int id = 12; id <= 20; id += 8) {
        key_of(k, id); /* hot through memory-tier reads only: nothing in the buffer */
        lsm_note_access(t->db, k, KLEN, VLEN);
        lsm_note_access(t->db, k, KLEN, VLEN);
    }
    uint64_t w = write_one(t, 20); /* 20 has a newer version, on L0 */
    flush_one(t, 20, w);
    cr_assert_eq(lsm_compact_level(t->db, 3), KV_OK); /* L3 -> L4, both on SD */
    lsm_promo_sync(t->db);
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.levels[4].volume, LSM_TIER_SD);
    cr_assert_gt(s.levels[4].files, 0);
    cr_assert_eq(s.promoted_recs, 1,
                 "promoted %llu dropped %llu cold %llu newer %llu onfd %llu dup %llu",
                 (unsigned long long)s.promoted_recs, (unsigned long long)s.promo_dropped,
                 (unsigned long long)s.promo_drop_cold, (unsigned long long)s.promo_drop_newer,
                 (unsigned long long)s.promo_drop_on_fd, (unsigned long long)s.promo_drop_dup);
    uint8_t flags;
    uint64_t seq;
    cr_assert_eq(get_id(t, 12, NULL, &flags), LSM_TIER_FD);
    cr_assert(flags & LSM_F_PROMOTED);
    cr_assert_eq(get_id(t, 20, &seq, NULL), LSM_TIER_FD);
    cr_assert_eq(seq, w, "the newer write of 20 wins");
    cr_assert_eq(get_id(t, 13, NULL, NULL), LSM_TIER_SD);
    t_close(t);
}

Test(hotrap, ralt_runs_live_on_fd_and_close_leaves_none)
{
    tdb *t = t_open("raltfiles", true);
    fill_sd(t, 500);
    read_hot(t, 5);
    lsm_promo_sync(t->db); /* flushes RALT */
    char dir[400];
    snprintf(dir, sizeof(dir), "%s/ralt", t->fd);
    cr_assert_geq(lt_count(dir, ".sst"), 1, "RALT's run is a file in %s", dir);
    lsm_close(t->db);
    cr_assert_eq(lt_count(dir, ".sst"), 0);
    cr_assert_eq(lsm_open(&t->db, &t->o, NULL, NULL), KV_OK);
    cr_assert_eq(get_id(t, 5, NULL, NULL), LSM_TIER_FD, "promoted copy survives");
    t_close(t);
}

Test(hotrap, off_is_plain_tiering)
{
    tdb *t = t_open("off", false);
    put_range(t, 0, 2000);
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < 50; i++)
            get_id(t, i, NULL, NULL);
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 1), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 2), KV_OK);
    for (int round = 0; round < 3; round++)
        cr_assert_eq(get_id(t, 3, NULL, NULL), LSM_TIER_SD);
    lsm_note_access(t->db, "k0000003", KLEN, VLEN);
    lsm_promo_sync(t->db);
    lsm_stats s = stats_of(t);
    cr_assert(!s.hotrap);
    cr_assert_eq(s.promoted_recs + s.retained_recs + s.ralt_entries, 0);
    cr_assert_eq(s.levels[0].files + s.levels[1].files + s.levels[2].files, 0);
    cr_assert_eq(get_id(t, 3, NULL, NULL), LSM_TIER_SD);
    t_close(t);
}

Test(hotrap, memory_tier_accesses_count)
{
    tdb *t = t_open("note", true);
    fill_sd(t, 500);
    get_id(t, 11, NULL, NULL); /* one SD read, into the promotion buffer */
    char k[KLEN + 1];
    key_of(k, 11);
    lsm_note_access(t->db, k, KLEN, VLEN); /* a read the memory tier served */
    lsm_promo_sync(t->db);
    cr_assert_eq(stats_of(t).promoted_recs, 1);
    cr_assert_eq(get_id(t, 11, NULL, NULL), LSM_TIER_FD);
    t_close(t);
}

/* RALT must be able to track a hot set of 1 KiB records that fills a good
 * part of the hot-set limit: with its table capped at 1/64 of FD (1 MiB
 * here, ~21k entries) it evicted a third of a 30k-key hot set, so those
 * keys were never promoted or retained. */
Test(hotrap, ralt_tracks_a_hot_set_of_kib_records_up_to_the_limit)
{
    tdb *t = calloc(1, sizeof(*t));
    lt_db_init(t, "ralt_cap");
    t->o.fast_mb = 64; /* hot-set limit 45 MiB: ~45k records of 1 KiB */
    lt_db_start(t);
    enum { HOT = 30000 };
    char k[KLEN + 1];
    for (int pass = 0; pass < 2; pass++) /* each key twice: stably hot */
        for (int i = 0; i < HOT; i++) {
            key_of(k, i);
            lsm_note_access(t->db, k, KLEN, 1000);
        }
    lsm_promo_sync(t->db); /* flushes RALT */
    lsm_stats s = stats_of(t);
    cr_assert_gt(s.hot_set_limit, (uint64_t)HOT * 1008);
    cr_assert_geq(s.ralt_stable, HOT * 95 / 100, "stable %llu of %d hot keys",
                  (unsigned long long)s.ralt_stable, HOT);
    cr_assert_gt(s.ralt_mem_bytes, 0);
    cr_assert_lt(s.ralt_mem_bytes, s.ralt_file_bytes, "RALT's memory is a fraction of its table");
    lt_db_close(t);
    free(t);
}

/* A few hot keys left on SD (far under half an SST of survivors per check)
 * are promoted after a bounded number of checks, not returned to the
 * mutable buffer forever. Cold reads fill the buffers, the hot keys are
 * read now and then; nothing forces a promotion (no lsm_promo_sync). */
Test(hotrap, a_few_hot_keys_are_promoted_without_a_forced_check)
{
    tdb *t = calloc(1, sizeof(*t));
    lt_db_init(t, "fewhot");
    t->o.promo_buf_kb = 8; /* a check every ~35 reads of 200-byte values */
    lt_db_start(t);
    fill_sd(t, 3000);
    for (int round = 0; round < 3; round++) /* keys 1 and 2: hot */
        for (int id = 1; id <= 2; id++)
            cr_assert_eq(get_id(t, id, NULL, NULL), LSM_TIER_SD);
    uint64_t promoted = 0;
    for (int id = 100; id < 3000 && promoted < 2; id++) { /* cold reads: RALT flushes, checks */
        get_id(t, id, NULL, NULL);
        if (id % 20 == 0) /* the hot keys are read on (until promoted, from SD) */
            for (int hot = 1; hot <= 2; hot++)
                get_id(t, hot, NULL, NULL);
        if (id % 100 == 0) {
            for (int i = 0; i < 50 && (promoted = stats_of(t).promoted_recs) < 2; i++)
                usleep(1000); /* the checker thread catches up */
        }
    }
    /* checks already asked for may still be queued behind a slow checker
     * thread (TSan, a loaded host): up to 20 s for them */
    for (int i = 0; i < 2000 && (promoted = stats_of(t).promoted_recs) < 2; i++)
        usleep(10000);
    lsm_stats s = stats_of(t);
    cr_assert_eq(promoted, 2, "hot keys promoted: %llu (dropped %llu: cold %llu dup %llu)",
                 (unsigned long long)promoted, (unsigned long long)s.promo_dropped,
                 (unsigned long long)s.promo_drop_cold, (unsigned long long)s.promo_drop_dup);
    cr_assert_eq(get_id(t, 1, NULL, NULL), LSM_TIER_FD);
    cr_assert_eq(get_id(t, 2, NULL, NULL), LSM_TIER_FD);
    lt_db_close(t);
    free(t);
}

/* A hot key on SD whose FD bloom filters answer "maybe" is still promoted:
 * "already on FD" is decided by reading the block, not by the filter alone.
 * With the filter alone, such a key (about 1% per FD file) stayed on SD for
 * as long as the file lived. Even keys are rewritten into an L0 file on FD
 * that covers the odd ones; an odd key the file's filter reports is read
 * until hot. */
Test(hotrap, a_bloom_false_positive_on_fd_does_not_block_promotion)
{
    tdb *t = t_open("bloomfp", true);
    enum { N = 3000 };
    fill_sd(t, N);
    lsm_rec *r = calloc(N / 2, sizeof(*r));
    char *keys = calloc(N / 2, KLEN + 1);
    for (int i = 0; i < N / 2; i++) {
        key_of(keys + i * (KLEN + 1), 2 * i);
        r[i] = (lsm_rec){.key = keys + i * (KLEN + 1),
                         .klen = KLEN,
                         .value = "even",
                         .vlen = 4,
                         .seqno = ++t->seq,
                         .type = LSM_PUT};
        cr_assert_eq(lsm_wal_append(t->db, &r[i], 1), KV_OK);
    }
    cr_assert_eq(lsm_flush(t->db, r, N / 2, t->seq), KV_OK);
    free(r);
    free(keys);
    lsm_version *v = lsm_db_current(t->db);
    cr_assert_eq(v->nfiles[0], 1);
    const lsm_file *fd = v->files[0][0];
    int fp = -1;
    char k[KLEN + 1];
    for (int id = 1; id < N && fp < 0; id += 2) {
        key_of(k, id);
        if (lsm_file_covers(fd, k, KLEN) && lsm_sst_may_contain(fd->sst, k, KLEN))
            fp = id;
    }
    lsm_version_unref(v);
    cr_assert_geq(fp, 0, "no false positive among %d odd keys", N / 2);
    read_hot(t, fp);
    lsm_promo_sync(t->db);
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.promo_drop_on_fd, 0, "key %d dropped as already on FD", fp);
    cr_assert_eq(s.promoted_recs, 1);
    cr_assert_eq(get_id(t, fp, NULL, NULL), LSM_TIER_FD);
    cr_assert_eq(get_id(t, fp - 1, NULL, NULL), LSM_TIER_FD, "its even neighbour, rewritten");
    t_close(t);
}

/* ---- clean copies (LSM_F_TWIN) ---- */

/* Reopens the db: RALT starts empty, so nothing is hot any more. */
static void t_reopen(tdb *t)
{
    lsm_close(t->db);
    lt_db_start(t);
}

/* id reads back with seqno seq and put_range's value: every record of one
 * put_range(t, a, b) holds VLEN bytes of its last seqno's low byte. */
static lsm_tier expect_id(tdb *t, int id, uint64_t seq, uint64_t range_last)
{
    lsm_rec r;
    lsm_tier tier = get_rec(t, id, &r);
    cr_assert_eq(r.seqno, seq, "key %d: seqno %llu, not %llu", id, (unsigned long long)r.seqno,
                 (unsigned long long)seq);
    cr_assert_eq(r.vlen, VLEN);
    for (size_t i = 0; i < VLEN; i++)
        cr_assert_eq(((const uint8_t *)r.value)[i], (uint8_t)range_last, "key %d: value byte %zu",
                     id, i);
    lsm_rec_free(&r);
    return tier;
}

/* Promotes keys 0, step, 2 x step, ... (n of them) from SD. */
static void promote_every(tdb *t, int n, int step)
{
    for (int i = 0; i < n; i++)
        read_hot(t, i * step);
    lsm_promo_sync(t->db);
    cr_assert_eq(stats_of(t).promoted_recs, (uint64_t)n);
}

/* Every key of [a, b), written by one put_range whose first seqno is first,
 * reads back unchanged from SD. */
static void expect_range_on_sd(tdb *t, int a, int b, uint64_t first)
{
    for (int id = a; id < b; id++)
        cr_assert_eq(expect_id(t, id, first + (uint64_t)(id - a), first + (uint64_t)(b - a) - 1),
                     LSM_TIER_SD, "key %d", id);
}

/* The numbers of level l's files, sorted (at most cap). */
static size_t level_numbers(tdb *t, int l, uint64_t *out, size_t cap)
{
    lsm_version *v = lsm_db_current(t->db);
    size_t n = 0;
    for (size_t i = 0; i < v->nfiles[l] && n < cap; i++)
        out[n++] = v->files[l][i]->number;
    lsm_version_unref(v);
    return n;
}

Test(hotrap, promoted_copies_that_cooled_are_dropped_without_touching_sd)
{
    tdb *t = t_open("twindrop", true);
    enum { N = 2000, HOT = 20 };
    uint64_t first = t->seq + 1;
    fill_sd(t, N);
    promote_every(t, HOT, 50);
    lsm_stats s;
    uint8_t flags;
    cr_assert_eq(get_id(t, 50, NULL, &flags), LSM_TIER_FD);
    cr_assert_eq(flags & (LSM_F_PROMOTED | LSM_F_TWIN), LSM_F_PROMOTED | LSM_F_TWIN);
    uint64_t sd0[64], sd1[64];
    size_t nsd0 = level_numbers(t, 3, sd0, 64);
    cr_assert_gt(nsd0, 0);
    t_reopen(t); /* the manifest keeps the count of copies; RALT forgets them */
    lsm_version *v = lsm_db_current(t->db);
    cr_assert_eq(v->nfiles[0], 1);
    cr_assert_eq(v->files[0][0]->ntwins, HOT, "the count of copies survives a restart");
    cr_assert_eq(v->files[0][0]->nentries, HOT);
    lsm_version_unref(v);
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK); /* inside FD: the flag stays */
    cr_assert_eq(lsm_compact_level(t->db, 1), KV_OK);
    cr_assert_eq(get_id(t, 50, NULL, &flags), LSM_TIER_FD);
    cr_assert(flags & LSM_F_TWIN);
    s = stats_of(t);
    uint64_t read0 = s.compact_read_bytes, write0 = s.compact_write_bytes;
    cr_assert_eq(s.twins_dropped, 0);
    v = lsm_db_current(t->db);
    cr_assert_eq(v->nfiles[2], 1);
    uint64_t l2 = v->files[2][0]->size;
    lsm_version_unref(v);
    cr_assert_eq(lsm_compact_level(t->db, 2), KV_OK); /* L2 (last FD) -> L3 (SD) */
    s = stats_of(t);
    cr_assert_eq(s.twin_jobs, 1);
    cr_assert_eq(s.twins_dropped, HOT);
    cr_assert_eq(s.twins_dropped_bytes, (uint64_t)HOT * (KLEN + VLEN));
    cr_assert_eq(s.levels[2].files, 0, "nothing hot to retain");
    cr_assert(s.compact_read_bytes > read0 && s.compact_read_bytes - read0 <= l2,
              "only the FD file was read");
    cr_assert_eq(s.compact_write_bytes, write0, "nothing was written");
    size_t nsd1 = level_numbers(t, 3, sd1, 64);
    cr_assert_eq(nsd1, nsd0);
    cr_assert_eq(memcmp(sd0, sd1, nsd0 * sizeof(*sd0)), 0, "the SD files are the same files");
    expect_range_on_sd(t, 0, N, first); /* the copies' originals included */
    t_close(t);
}

/* The case that would lose data if the flag outlived its original: a hot
 * copy kept on FD by a compaction that merged the SD file holding its
 * original. It is the only copy then, and once it cools it must be written
 * down, not dropped. */
Test(hotrap, a_retained_copy_whose_original_was_merged_is_written_down_later)
{
    tdb *t = t_open("twinkeep", true);
    enum { N = 2000, HOT = 20 };
    uint64_t first = t->seq + 1;
    fill_sd(t, N);
    promote_every(t, HOT, 50);
    uint64_t nfirst = put_range(t, N, N + 500); /* new keys beside the copies */
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 1), KV_OK);
    for (int i = 0; i < HOT; i++) /* still hot: read from the FD copy */
        cr_assert_eq(get_id(t, i * 50, NULL, NULL), LSM_TIER_FD);
    cr_assert_eq(lsm_compact_level(t->db, 2), KV_OK); /* merges L3, originals included */
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.twin_jobs, 0, "the new keys must go down");
    cr_assert_eq(s.twins_dropped, 0, "every copy met its original");
    cr_assert_geq(s.retained_recs, HOT);
    uint8_t flags;
    for (int i = 0; i < HOT; i++) {
        cr_assert_eq(get_id(t, i * 50, NULL, &flags), LSM_TIER_FD, "copy %d retained", i * 50);
        cr_assert_eq(flags & LSM_F_TWIN, 0, "key %d: its original is gone", i * 50);
    }
    t_reopen(t); /* cold now */
    cr_assert_eq(lsm_compact_level(t->db, 2), KV_OK);
    s = stats_of(t);
    cr_assert_eq(s.twins_dropped, 0);
    cr_assert_eq(s.levels[2].files, 0);
    expect_range_on_sd(t, 0, N, first);
    expect_range_on_sd(t, N, N + 500, nfirst);
    t_close(t);
}

/* A copy whose file also holds other records is dropped from a mixed
 * compaction into SD when its original lies deeper than the level merged. */
Test(hotrap, a_copy_is_dropped_from_a_mixed_job_when_its_original_lies_deeper)
{
    tdb *t = t_open("twinmix", true);
    enum { N = 2000, HOT = 10 };
    uint64_t first = t->seq + 1;
    fill_sd(t, N);
    cr_assert_eq(lsm_compact_level(t->db, 3), KV_OK); /* the originals move to L4 */
    lsm_stats s = stats_of(t);
    cr_assert_eq(s.levels[3].files, 0);
    cr_assert_gt(s.levels[4].files, 0);
    promote_every(t, HOT, 100);
    uint64_t nfirst = put_range(t, N, N + 300);
    cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK);
    cr_assert_eq(lsm_compact_level(t->db, 1), KV_OK);
    t_reopen(t);
    cr_assert_eq(lsm_compact_level(t->db, 2), KV_OK);
    s = stats_of(t);
    cr_assert_eq(s.twin_jobs, 0);
    cr_assert_eq(s.twins_dropped, HOT);
    expect_range_on_sd(t, 0, N, first);
    expect_range_on_sd(t, N, N + 300, nfirst);
    t_close(t);
}

/* ---- the promotion gate (promote.c) ---- */

/* Reads keys of [0, n) `reads` times: hot_pm per mille of them go to ids
 * [0, nhot) in turn, the rest to ids drawn uniformly (the sequence goes on
 * from *x). L0 is compacted every 4000 reads, as automatic compaction
 * would. */
static void read_mix(tdb *t, uint64_t *x, int n, int nhot, int hot_pm, int reads)
{
    for (int i = 0; i < reads; i++) {
        *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
        int id = (int)(*x % 1000) < hot_pm ? i % nhot : (int)((*x >> 10) % (uint64_t)n);
        get_id(t, id, NULL, NULL);
        if (i % 4000 == 3999)
            cr_assert_eq(lsm_compact_level(t->db, 0), KV_OK);
    }
}

typedef struct gate_result {
    lsm_stats s;
    uint64_t late_promoted; /* promoted in the second half of the reads */
    int hot_on_fd;          /* of ids [0, nhot) */
} gate_result;

/* 50000 keys on SD (ten times FD, as in the reference benchmark), 2 x 32000
 * reads: each key is read about once, and RALT calls some 7 % of them hot
 * (read twice within its window) by chance. The first half lets the gate
 * measure the lift (until then it lets everything through); the second
 * shows what it does once it knows. */
static gate_result gate_run(bool gate, int nhot, int hot_pm)
{
    tdb *t = calloc(1, sizeof(*t));
    lt_db_init(t, "gate");
    t->o.no_promo_gate = !gate;
    lt_db_start(t);
    fill_sd(t, 50000);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    read_mix(t, &x, 50000, nhot, hot_pm, 32000);
    lsm_promo_sync(t->db);
    uint64_t early = stats_of(t).promoted_recs;
    read_mix(t, &x, 50000, nhot, hot_pm, 32000);
    lsm_promo_sync(t->db);
    gate_result g = {.s = stats_of(t)};
    g.late_promoted = g.s.promoted_recs - early;
    for (int id = 0; id < nhot; id++)
        g.hot_on_fd += get_id(t, id, NULL, NULL) == LSM_TIER_FD;
    lt_db_close(t);
    free(t);
    cr_log_info("%s, %d hot keys at %d per mille: lift %.2f, promoted %llu (%llu late), "
                "gated %llu, stable %llu, hot keys on FD %d",
                gate ? "gate" : "no gate", nhot, hot_pm, g.s.promo_lift,
                (unsigned long long)g.s.promoted_recs, (unsigned long long)g.late_promoted,
                (unsigned long long)g.s.promo_drop_gated, (unsigned long long)g.s.ralt_stable,
                g.hot_on_fd);
    return g;
}

/* Uniform reads: the keys RALT calls hot are read no more often than the
 * rest, the lift is about 1, and the gate holds back the chance keys that
 * the same reads promote without it. */
Test(hotrap, uniform_reads_close_the_gate, .timeout = 120)
{
    gate_result off = gate_run(false, 0, 0), on = gate_run(true, 0, 0);
    cr_assert_gt(on.s.promo_lift, 0, "the lift was measured");
    cr_assert_lt(on.s.promo_lift, 1.25, "lift %.2f: hot keys read about as often as chance",
                 on.s.promo_lift);
    cr_assert_gt(off.s.promoted_recs, 1000, "without the gate chance keys are promoted: %llu",
                 (unsigned long long)off.s.promoted_recs);
    cr_assert_eq(off.s.promo_drop_gated, 0);
    cr_assert_lt(on.late_promoted * 10, off.late_promoted,
                 "once the lift is known the gate promotes a tenth of it at most: %llu "
                 "against %llu",
                 (unsigned long long)on.late_promoted, (unsigned long long)off.late_promoted);
    cr_assert_gt(on.s.promo_drop_gated, off.late_promoted / 2);
}

/* The same load with 2 keys read far more often than chance (3 per mille
 * of the reads, some 100 reads each): the gate is still closed to the
 * chance keys, but these clear the score bar and are promoted. */
Test(hotrap, truly_hot_keys_pass_a_closed_gate, .timeout = 120)
{
    gate_result on = gate_run(true, 2, 3);
    cr_assert_lt(on.s.promo_lift, 1.75, "lift %.2f: the gate is not wide open", on.s.promo_lift);
    cr_assert_gt(on.s.promo_drop_gated, 1000, "chance keys are gated: %llu",
                 (unsigned long long)on.s.promo_drop_gated);
    cr_assert_eq(on.hot_on_fd, 2, "the truly hot keys are promoted: %d of 2", on.hot_on_fd);
}

/* 90 % of the reads on 200 keys: the hot keys are read far more often than
 * their share of the records, the lift is high (over GATE_HI: no bar),
 * nothing is gated and every hot key is promoted. */
Test(hotrap, skewed_reads_leave_the_gate_open, .timeout = 120)
{
    gate_result on = gate_run(true, 200, 900);
    cr_assert_gt(on.s.promo_lift, 5.0, "lift %.2f", on.s.promo_lift);
    cr_assert_eq(on.s.promo_drop_gated, 0);
    cr_assert_eq(on.hot_on_fd, 200, "hot keys on FD: %d of 200", on.hot_on_fd);
}
