/* SPDX-License-Identifier: MIT */
/*
 * Smoke tests of the tier_bench binary: a tiny load and a one-second run
 * for the hotkv engine and for rocksdb-tiering (when built with RocksDB)
 * print one JSON line with sane fields (every read finds its record, rates
 * positive, hit rate within [0, 1], the fields the issues ask for present);
 * bad flags are refused. Throughput values are never checked (DESIGN.md §7).
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXOUT (1 << 16)

static char dir[] = "/tmp/tier_bench_test.XXXXXX";

static void setup(void)
{
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
}

/* Runs tier_bench with args; returns stdout, *status the exit status. */
static char *run(const char *args, int *status)
{
    const char *b = getenv("KV_BUILD_DIR");
    cr_assert_not_null(b, "KV_BUILD_DIR is set by ctest");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s/bench/tier/tier_bench %s 2>%s/stderr", b, args, dir);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char *out = calloc(1, MAXOUT);
    size_t n = fread(out, 1, MAXOUT - 1, p);
    out[n] = '\0';
    *status = pclose(p);
    if (*status != 0) {
        snprintf(cmd, sizeof(cmd), "grep -v ' INFO ' %s/stderr | tail -5 >&2", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "(no stderr)\n");
    }
    return out;
}

/* The number after "name": in the JSON line; -1 for null. */
static double field(const char *json, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *p = strstr(json, pat);
    cr_assert_not_null(p, "field %s in %s", name, json);
    p += strlen(pat);
    return strncmp(p, "null", 4) == 0 ? -1.0 : strtod(p, NULL);
}

static char *smoke_with(const char *engine, const char *workload, const char *dist,
                        const char *more)
{
    char args[1024];
    snprintf(args, sizeof(args),
             "--engine %s --fast-dir %s/fd --slow-dir %s/sd --fast-mb 2 --mem-mb 2 "
             "--write-buffer-mb 1 --records 5000 --value-size 256 --threads 2 --seconds 1 "
             "--warmup 0.2 --settle 20 --trace-ops 4096 --workload %s --dist %s %s",
             engine, dir, dir, workload, dist, more);
    char mk[512];
    snprintf(mk, sizeof(mk), "mkdir -p %s/fd %s/sd", dir, dir);
    cr_assert_eq(system(mk), 0);
    int st;
    char *out = run(args, &st);
    cr_assert_eq(st, 0, "tier_bench %s exited with %d", args, st);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one JSON line:\n%s", out);
    char want[64];
    snprintf(want, sizeof(want), "{\"engine\":\"%s\"", engine);
    cr_assert_eq(strncmp(out, want, strlen(want)), 0, "%s", out);
    cr_assert_gt(field(out, "records"), 4999);
    cr_assert_gt(field(out, "load_ops_per_s"), 0);
    cr_assert_gt(field(out, "ops_per_s"), 0);
    cr_assert_gt(field(out, "gets"), 0);
    cr_assert_eq(field(out, "found_ratio"), 1.0, "every loaded record is found:\n%s", out);
    cr_assert_geq(field(out, "p99_get_us"), field(out, "p50_get_us"));
    double hit = field(out, "fd_hit_rate");
    cr_assert(hit >= 0.0 && hit <= 1.0, "fd_hit_rate %g", hit);
    cr_assert_geq(field(out, "sd_read_bytes_per_get"), 0);
    cr_assert_geq(field(out, "write_amp"), 1.0, "the load wrote at least its bytes:\n%s", out);
    /* WA when the load ended and after the settle: the settle adds bytes
     * written and no user bytes; a read-only run adds no user bytes either */
    double lwa = field(out, "load_write_amp"), swa = field(out, "settled_write_amp");
    cr_assert_geq(lwa, 1.0, "the load's WA when it ended:\n%s", out);
    cr_assert_geq(swa, lwa, "the settle only adds bytes:\n%s", out);
    if (strcmp(workload, "RO") == 0)
        cr_assert_geq(field(out, "write_amp"), swa, "%s", out);
    /* hotkv reports HotRAP's counters (0 with HotRAP off); RocksDB has no
     * promotion or retention: null */
    bool hk = strncmp(engine, "hotkv", 5) == 0, off = strstr(engine, "nohotrap") != NULL;
    double prom = field(out, "promoted"), ret = field(out, "retained");
    if (!hk) {
        cr_assert(prom < 0 && ret < 0, "promoted/retained null for %s:\n%s", engine, out);
    } else if (off) {
        cr_assert(prom == 0 && ret == 0, "HotRAP off promotes nothing:\n%s", out);
    } else {
        cr_assert(prom >= 0 && ret >= 0, "promoted/retained reported:\n%s", out);
        cr_assert_not_null(strstr(out, "\"hotrap_state\":{\"promo_dropped\":"), "%s", out);
        cr_assert_geq(field(out, "write_waits"), 0, "%s", out);
        cr_assert_geq(field(out, "write_wait_s"), 0, "%s", out);
    }
    cr_assert_not_null(strstr(out, "\"hotrap_available\":"));
    return out;
}

static char *smoke(const char *engine, const char *workload, const char *dist)
{
    return smoke_with(engine, workload, dist, "");
}

static bool have_rocksdb(void)
{
    int st; /* an engine the build lacks is a flag error (exit 2) */
    char *probe = run("--engine rocksdb-tiering --fast-dir /nonexistent --slow-dir /nonexistent "
                      "--seconds 1 --records 1 --load-only",
                      &st);
    free(probe);
    return WEXITSTATUS(st) != 2;
}

TestSuite(tier_bench, .init = setup, .fini = teardown, .timeout = 120);

Test(tier_bench, hotkv_ro_hotspot)
{
    free(smoke("hotkv", "RO", "hotspot5"));
}

/* --shift-at: the steady and end FD hit rates, their ratio, the recovery. */
Test(tier_bench, hotkv_shift_reports_recovery)
{
    char *out = smoke_with("hotkv", "RO", "hotspot5", "--shift-at 0.5 --progress 0.25");
    cr_assert_eq(field(out, "shift_at"), 0.5, "%s", out);
    double steady = field(out, "fd_hit_before_shift"), end = field(out, "fd_hit_end");
    cr_assert(steady > 0 && steady <= 1 && end >= 0 && end <= 1, "%s", out);
    cr_assert_not_null(strstr(out, "\"shift_recovery\":"));
    cr_assert_not_null(strstr(out, "\"recovery_s\":"));
    free(out);
}

/* RocksDB with every level on SD and a block cache of 1/20 of the data:
 * uniform reads are served by SD, not memory+FD. (The per-level cache
 * counters the bench used before filed most misses under level -1 and
 * reported ~0.9 here.) */
Test(tier_bench, rocksdb_sd_uniform_reads_come_from_sd)
{
    if (!have_rocksdb())
        cr_skip_test("tier_bench was built without RocksDB (librocksdb-dev missing)");
    char args[1024], mk[512];
    snprintf(mk, sizeof(mk), "mkdir -p %s/fd %s/sd", dir, dir);
    cr_assert_eq(system(mk), 0);
    snprintf(args, sizeof(args),
             "--engine rocksdb-sd --fast-dir %s/fd --slow-dir %s/sd --fast-mb 2 --mem-mb 1 "
             "--write-buffer-mb 1 --records 20000 --value-size 1024 --threads 2 --seconds 1 "
             "--warmup 0.5 --settle 30 --trace-ops 16384 --workload RO --dist uniform",
             dir, dir);
    int st;
    char *out = run(args, &st);
    cr_assert_eq(st, 0, "%s", out);
    cr_assert_lt(field(out, "fd_hit_rate"), 0.3, "%s", out);
    cr_assert_gt(field(out, "reads_sd"), 0, "%s", out);
    free(out);
}

Test(tier_bench, hotkv_nohotrap_says_so)
{
    char *out = smoke("hotkv-nohotrap", "UH", "zipf0.99");
    cr_assert_not_null(strstr(out, "\"hotrap_requested\":false"), "%s", out);
    cr_assert_gt(field(out, "p50_put_us"), 0);
    free(out);
}

Test(tier_bench, rocksdb_tiering_rw)
{
    if (!have_rocksdb())
        cr_skip_test("tier_bench was built without RocksDB (librocksdb-dev missing)");
    free(smoke("rocksdb-tiering", "RW", "uniform"));
}

Test(tier_bench, bad_flags)
{
    int st;
    free(run("--engine nosuch --fast-dir /tmp --slow-dir /tmp", &st));
    cr_assert_eq(WEXITSTATUS(st), 2);
    free(run("--engine hotkv --fast-dir /tmp --slow-dir /tmp --dist pareto", &st));
    cr_assert_eq(WEXITSTATUS(st), 2);
    free(run("--engine hotkv --fast-dir /tmp --slow-dir /tmp --load-only --no-load", &st));
    cr_assert_eq(WEXITSTATUS(st), 2);
}

/* Inserts stay new keys when a thread goes round its trace again: with
 * 1024 ops per thread the run replays its traces many times, and the
 * highest id inserted must be at least one per insert past the loaded
 * ids (replayed as they were drawn, the inserts stopped at records + 2 x
 * 1024 and became overwrites). */
Test(tier_bench, rw_inserts_stay_new_keys_past_the_trace)
{
    char *out = smoke_with("hotkv", "RW", "uniform", "--trace-ops 1024");
    double puts = field(out, "ops") - field(out, "gets"), max = field(out, "insert_id_max");
    cr_assert_gt(puts, 4 * 1024, "the run went round its traces (%g inserts):\n%s", puts, out);
    cr_assert_geq(max, 5000 + puts - 1, "the inserts reused ids:\n%s", out);
    free(out);
}

/* --insert-ids shared: the threads draw new ids from one counter, so the
 * ids inserted (warm-up and timed phase) are exactly the range right above
 * the loaded ones; by thread, two threads at their own pace leave gaps or
 * at least never end below that range. */
Test(tier_bench, shared_insert_ids_are_one_dense_range)
{
    char *out = smoke_with("hotkv", "RW", "uniform", "--insert-ids shared");
    double n = field(out, "inserted"), max = field(out, "insert_id_max");
    cr_assert_gt(n, 0, "%s", out);
    cr_assert_eq(max, 5000 + n - 1, "ids past the range of %g inserts:\n%s", n, out);
    cr_assert_not_null(strstr(out, "\"insert_ids\":\"shared\""), "%s", out);
    free(out);
    out = smoke_with("hotkv", "RW", "uniform", "");
    cr_assert_geq(field(out, "insert_id_max"), 5000 + field(out, "inserted") - 1, "%s", out);
    cr_assert_not_null(strstr(out, "\"insert_ids\":\"thread\""), "%s", out);
    free(out);
    int st; /* D reads back each thread's own inserts */
    free(run("--engine hotkv --fast-dir /tmp --workload D --insert-ids shared", &st));
    cr_assert_eq(WEXITSTATUS(st), 2);
}

/* --ops ends the timed phase after that many ops, long before --seconds;
 * run_write_amp covers the warm-up and the timed phase: an RW run writes
 * each user byte at least once (the WAL), a read-only run writes none
 * (null). */
Test(tier_bench, ops_bound_the_run_and_run_write_amp_is_the_phases_own)
{
    char *out = smoke_with("hotkv", "RW", "uniform", "--ops 4000 --seconds 60");
    cr_assert_geq(field(out, "ops"), 4000, "%s", out);
    cr_assert_lt(field(out, "seconds"), 60, "the run ended at --ops, not at --seconds:\n%s", out);
    double rwa = field(out, "run_write_amp");
    cr_assert_geq(rwa, 1.0, "the RW phase wrote its bytes at least once:\n%s", out);
    free(out);
    out = smoke("hotkv", "RO", "uniform");
    cr_assert_lt(field(out, "run_write_amp"), 0, "a read-only run inserts nothing:\n%s", out);
    free(out);
    if (!have_rocksdb())
        return;
    out = smoke_with("rocksdb-tiering", "RW", "uniform", "--ops 4000 --seconds 60");
    cr_assert_geq(field(out, "run_write_amp"), 1.0, "%s", out);
    free(out);
}
