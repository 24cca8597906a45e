/* SPDX-License-Identifier: MIT */
/*
 * Smoke tests of the index_bench binary: every built index loads, serves a
 * tiny run of each workload without losing keys (hit_ratio 1 without
 * misses), prints one JSON line per index, the shift series and a summary
 * last, and rejects bad flags. Throughput is never checked here (DESIGN.md
 * §7: timing goals live in benchmarks).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXOUT (1 << 20)

/* Runs index_bench with args; returns its stdout. A failing run's last
 * stderr lines go to the test's stderr (progress lines are dropped). */
static char *run(const char *args, int *status)
{
    const char *dir = getenv("KV_BUILD_DIR");
    cr_assert_not_null(dir, "KV_BUILD_DIR is set by ctest");
    char errf[] = "/tmp/index_bench_test.XXXXXX";
    int fd = mkstemp(errf);
    cr_assert_geq(fd, 0);
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s/bench/index_bench %s 2>%s", dir, args, errf);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char *out = calloc(1, MAXOUT);
    size_t n = fread(out, 1, MAXOUT - 1, p);
    out[n] = '\0';
    *status = pclose(p);
    if (*status != 0) {
        snprintf(cmd, sizeof(cmd), "grep -v ' INFO ' %s | tail -5 >&2", errf);
        if (system(cmd) != 0)
            fprintf(stderr, "(no stderr)\n");
    }
    unlink(errf);
    return out;
}

static const char *impls(void)
{
    int st;
    char *help = run("--help", &st);
    bool hr = strstr(help, "hotring") != NULL;
    free(help);
    /* --help lists the defaults only; ask for every index the binary has. */
    return hr ? "hotring-s,hotring-r,chain,lfht,lfht-auto" : "chain,lfht,lfht-auto";
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

static void check_run(const char *flags, bool misses)
{
    char args[512];
    const char *list = impls();
    int nimpl = count(list, ",") + 1;
    snprintf(args, sizeof(args),
             "--impl %s --keys 20000 --seconds 0.3 --trace-ops 4096 --threads 2 %s", list, flags);
    int st;
    char *out = run(args, &st);
    cr_assert_eq(st, 0, "index_bench %s exited with %d", args, st);
    cr_assert_eq(count(out, "\"mops\":"), nimpl, "one result per index:\n%s", out);
    if (!misses)
        cr_assert_eq(count(out, "\"hit_ratio\":1,"), nimpl, "no lost keys:\n%s", out);
    const char *last = strstr(out, "{\"summary\":true");
    cr_assert_not_null(last, "summary line:\n%s", out);
    cr_assert_eq(strchr(last, '\n'), out + strlen(out) - 1, "summary is the last line");
    free(out);
}

Test(index_bench, read_only_zipf, .timeout = 120)
{
    check_run("--workload C --dist zipf --theta 1.22", false);
}

Test(index_bench, updates_with_large_values, .timeout = 120)
{
    check_run("--workload A --dist zipf --value-size 100", false);
}

Test(index_bench, interleaved_rounds, .timeout = 120)
{
    check_run("--workload B --dist zipf --rounds 3", false);
}

Test(index_bench, rmw_and_inserts, .timeout = 120)
{
    check_run("--workload F --dist hotspot --hot-pct 5", false);
    check_run("--workload D", true); /* latest may read another thread's next insert */
}

Test(index_bench, batched_reads, .timeout = 120)
{
    /* hotring and chain hand runs of reads to their batched gets, lfht reads
     * key by key: every index still finds every key (B mixes in updates, so
     * batches end at writes) */
    check_run("--workload C --dist zipf --theta 0.99 --batch 16", false);
    check_run("--workload B --dist zipf --batch 7 --value-size 100", false);
    check_run("--workload C --dist uniform --ratio 16 --miss-ratio 0.5 --batch 64", true);
    int st;
    char *out = run("--impl lfht --keys 2000 --seconds 0.1 --trace-ops 4096 --batch 8", &st);
    cr_assert(strstr(out, "\"batch\":1"), "lfht has no batched get:\n%s", out);
    free(out);
    out = run("--impl chain --keys 2000 --seconds 0.1 --trace-ops 4096 --batch 8", &st);
    cr_assert(strstr(out, "\"batch\":8"), "chain reads in batches:\n%s", out);
    free(out);
    if (strstr(impls(), "hotring-s")) {
        out = run("--impl hotring-s --keys 2000 --seconds 0.1 --trace-ops 4096 --batch 8", &st);
        cr_assert_eq(st, 0);
        cr_assert(strstr(out, "\"batch\":8"), "hotring reads in batches:\n%s", out);
        free(out);
    }
    out = run("--batch 65", &st);
    cr_assert_neq(st, 0, "a batch over the maximum is rejected");
    free(out);
}

/* A warm-up runs the workload without counting it: the result covers the
 * timed phases alone (ops and seconds) and says how long the warm-up was. */
Test(index_bench, warmup_is_not_counted, .timeout = 120)
{
    check_run("--workload C --dist zipf --rounds 2 --warmup 0.6", false);
    int st;
    char *out = run("--impl chain --keys 20000 --seconds 0.2 --warmup 0.6 --trace-ops 4096", &st);
    cr_assert_eq(st, 0);
    cr_assert(strstr(out, "\"warmup\":0.600"), "%s", out);
    const char *sec = strstr(out, "\"seconds\":");
    cr_assert_not_null(sec, "%s", out);
    double s = strtod(sec + strlen("\"seconds\":"), NULL);
    cr_assert(s > 0.15 && s < 0.5, "seconds %.3f counts the timed phase only:\n%s", s, out);
    free(out);
}

Test(index_bench, misses_and_shift_series, .timeout = 120)
{
    check_run("--workload C --dist uniform --ratio 16 --miss-ratio 0.5", true);
    int st;
    char *out =
        run("--impl chain --keys 20000 --seconds 0.5 --shift-at 0.25 --trace-ops 4096", &st);
    cr_assert_eq(st, 0);
    cr_assert_eq(count(out, "\"series\":["), 1, "%s", out);
    cr_assert_eq(count(out, "\"t_ms\":"), 5, "five 100 ms samples:\n%s", out);
    cr_assert(strstr(out, "\"recover_ms\":"), "%s", out);
    free(out);
}

Test(index_bench, bad_flags_are_rejected)
{
    int st;
    char *out = run("--impl nope", &st);
    cr_assert_neq(st, 0);
    free(out);
    out = run("--seconds 1 --shift-at 2", &st);
    cr_assert_neq(st, 0);
    free(out);
    out = run("--workload E", &st);
    cr_assert_neq(st, 0);
    free(out);
    out = run("--seconds 1 --shift-at 0.5 --rounds 2", &st);
    cr_assert_neq(st, 0);
    free(out);
    out = run("--seconds 1 --shift-at 0.5 --warmup 1", &st);
    cr_assert_neq(st, 0, "a warm-up would hide the shift's placement");
    free(out);
    out = run("--warmup -1", &st);
    cr_assert_neq(st, 0);
    free(out);
}
