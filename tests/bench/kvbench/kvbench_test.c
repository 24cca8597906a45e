/* SPDX-License-Identifier: MIT */
/*
 * Tests of kvbench: its statistics (histogram quantiles, exact key counts
 * and their top-K order) in-process, and the binary against a real cluster
 * (3 kvnode + kvrouter on free loopback ports, with auth): a zipf run with
 * --load and --report-top 10 must load every key, serve without errors and
 * print a consistent summary as its last line; a hotspot run with --shift-at
 * must report the hot keys of each phase separately (the ground truth the
 * hot-key detector is compared with). Throughput is never checked (DESIGN.md
 * §7: timing goals live in benchmarks).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/kvbench/kvbench.h"
#include "integration/harness.h"

#define MAXOUT (1 << 20)
#define TOKEN "kvbench-test-token"

/* ---- statistics ------------------------------------------------------------------ */

Test(kvbench_stats, histogram_quantiles_within_two_percent)
{
    static kvb_hist h, m;
    for (uint64_t v = 1; v <= 100000; v++)
        kvb_hist_add(&h, v * 1000); /* 1 us .. 100 ms */
    double p50 = kvb_hist_quantile_us(&h, 0.50), p99 = kvb_hist_quantile_us(&h, 0.99);
    cr_assert(p50 > 50000 * 0.98 && p50 < 50000 * 1.02, "p50 %.1f", p50);
    cr_assert(p99 > 99000 * 0.98 && p99 < 99000 * 1.02, "p99 %.1f", p99);
    cr_assert_float_eq(kvb_hist_quantile_us(&h, 1.0), 100000.0, 1e-9, "max is exact");
    kvb_hist_merge(&m, &h);
    kvb_hist_merge(&m, &h);
    cr_assert_eq(m.n, 200000);
    cr_assert_float_eq(kvb_hist_quantile_us(&m, 0.5), p50, 1e-9);
    static kvb_hist small;
    kvb_hist_add(&small, 7);
    cr_assert_float_eq(kvb_hist_quantile_us(&small, 0.5), 0.007, 1e-12, "exact below 64 ns");
}

Test(kvbench_stats, top_keys_are_exact_and_ordered)
{
    kvb_counts a = {0}, b = {0}, all = {0};
    for (uint64_t id = 0; id < 50000; id++) { /* forces several grows */
        kvb_counts_add(&a, id, id % 7 + 1);
        kvb_counts_add(&b, id, 1);
    }
    kvb_counts_add(&b, 123, 1000);
    kvb_counts_merge(&all, &a);
    kvb_counts_merge(&all, &b);
    cr_assert_eq(all.n, 50000);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    kvb_print_top(f, "top", &all, 3);
    fclose(f);
    /* 123: 123 % 7 + 1 + 1 + 1000 = 1006; then count 8 (id % 7 == 6) from id 6 up */
    cr_assert_str_eq(buf, "\"top\":[{\"key\":\"key000000000123\",\"count\":1006},"
                          "{\"key\":\"key000000000006\",\"count\":8},"
                          "{\"key\":\"key000000000013\",\"count\":8}]");
    free(buf);
    kvb_counts_free(&a);
    kvb_counts_free(&b);
    kvb_counts_free(&all);
}

/* ---- the binary against a cluster ------------------------------------------------- */

typedef struct top_item {
    char key[32];
    long count;
} top_item;

/* Runs kvbench with args; returns its stdout. stderr goes to the test's
 * stderr only when the run fails. */
static char *run(const char *args, int *status)
{
    char errf[] = "/tmp/kvbench_test.XXXXXX";
    int fd = mkstemp(errf);
    cr_assert_geq(fd, 0);
    close(fd);
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s %s 2>%s", kvt_bin("bench/kvbench/kvbench"), args, errf);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char *out = calloc(1, MAXOUT);
    size_t n = fread(out, 1, MAXOUT - 1, p);
    out[n] = '\0';
    *status = pclose(p);
    if (*status != 0) {
        snprintf(cmd, sizeof(cmd), "tail -5 %s >&2", errf);
        if (system(cmd) != 0)
            fprintf(stderr, "(no stderr)\n");
    }
    unlink(errf);
    return out;
}

/* The last line of out (the summary), checked to be a JSON object. */
static const char *summary(const char *out)
{
    size_t n = strlen(out);
    cr_assert(n > 2 && out[n - 1] == '\n', "output ends with a line:\n%s", out);
    const char *s = out + n - 1;
    while (s > out && s[-1] != '\n')
        s--;
    cr_assert(s[0] == '{' && out[n - 2] == '}', "last line is an object:\n%s", s);
    cr_assert(strstr(s, "\"summary\":true"), "%s", s);
    return s;
}

static double num(const char *json, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *p = strstr(json, pat);
    cr_assert_not_null(p, "field %s in %s", name, json);
    return strtod(p + strlen(pat), NULL);
}

/* Parses the array `"name":[{"key":"..","count":N},...]`; returns its length. */
static int top(const char *json, const char *name, top_item *out, int max)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":[", name);
    const char *p = strstr(json, pat);
    cr_assert_not_null(p, "array %s in %s", name, json);
    p += strlen(pat);
    int n = 0;
    while (*p == '{' && n < max) {
        cr_assert_eq(sscanf(p, "{\"key\":\"%31[^\"]\",\"count\":%ld}", out[n].key, &out[n].count),
                     2, "entry of %s: %.60s", name, p);
        n++;
        p = strchr(p, '}') + 1;
        if (*p == ',')
            p++;
    }
    cr_assert_eq(*p, ']', "array %s ends after %d entries", name, n);
    return n;
}

static void check_top(const char *s, const char *name, int want, long lo, long hi)
{
    top_item t[16];
    int n = top(s, name, t, 16);
    cr_assert_eq(n, want, "%s has %d entries: %s", name, n, s);
    for (int i = 0; i < n; i++) {
        long id = strtol(t[i].key + 3, NULL, 10);
        cr_assert(strncmp(t[i].key, "key", 3) == 0 && strlen(t[i].key) == 15, "%s", t[i].key);
        cr_assert(id >= lo && id < hi, "%s: %s outside [%ld, %ld)", name, t[i].key, lo, hi);
        cr_assert_gt(t[i].count, 0);
        cr_assert(i == 0 || t[i].count <= t[i - 1].count, "%s counts non-increasing: %s", name, s);
    }
}

static kvt_cluster cl;

static void start(void)
{
    kv_err rv = kvt_cluster_start(&cl, 3, 2, TOKEN);
    cr_assert_eq(rv, KV_OK, "cluster start: %s (logs in %s)", kv_err_name(rv), cl.dir);
}

static void stop(void)
{
    kvt_cluster_stop(&cl);
}

Test(kvbench, zipf_load_and_shift_against_a_cluster, .init = start, .fini = stop, .timeout = 90)
{
    char args[1024];
    snprintf(args, sizeof(args),
             "--router %s --auth " TOKEN " --workload B --dist zipf --keys 2000 --load "
             "--seconds 2 --threads 2 --concurrency 8 --report-top 10 --timeout-ms 10000",
             cl.router_url);
    int st;
    char *out = run(args, &st);
    cr_assert_eq(st, 0, "kvbench %s exited with %d", args, st);
    const char *s = summary(out);
    cr_assert_gt(num(s, "ops_per_s"), 0.0, "%s", s);
    cr_assert_eq(num(s, "errors"), 0.0, "%s", s);
    cr_assert_eq(num(s, "loaded"), 2000.0, "%s", s);
    cr_assert_eq(num(s, "not_found"), 0.0, "every key was loaded: %s", s);
    cr_assert_leq(num(s, "p50_us"), num(s, "p99_us"), "%s", s);
    cr_assert_gt(num(s, "p50_us"), 0.0, "%s", s);
    check_top(s, "top", 10, 0, 2000);
    cr_assert(strstr(out, "{\"result\":\"read\""), "a line per op type:\n%s", out);
    free(out);

    /* hotspot1: ids [0, 20) get 99 % of the accesses, then [1000, 1020) (a
     * hot set this small keeps cold keys out of the top 5 even in a slow run); two
     * router entries (the same router: a node would refuse keys it does not
     * own with rf 2) so the threads use both list entries */
    snprintf(args, sizeof(args),
             "--router %s,%s --auth " TOKEN " --workload C --dist hotspot1 --keys 2000 "
             "--seconds 2 --shift-at 1 --threads 2 --concurrency 4 --report-top 5 "
             "--timeout-ms 10000",
             cl.router_url, cl.router_url);
    out = run(args, &st);
    cr_assert_eq(st, 0, "kvbench %s exited with %d", args, st);
    s = summary(out);
    cr_assert_eq(num(s, "errors"), 0.0, "%s", s);
    check_top(s, "top_before", 5, 0, 20);
    check_top(s, "top_after", 5, 1000, 1020);
    free(out);
}

Test(kvbench, bad_flags_and_dead_router)
{
    int st;
    const char *bad[] = {"--dist nope",  "--dist hotspot100", "--seconds 1 --shift-at 1",
                         "--workload E", "--router ,",        "--threads 0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        free(run(bad[i], &st));
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "'%s' is a usage error", bad[i]);
    }
    /* nothing listens there: every op fails, the run still ends and reports */
    char args[256];
    snprintf(args, sizeof(args),
             "--router tcp://127.0.0.1:%d --seconds 0.3 --keys 100 --timeout-ms 200",
             kvt_free_port());
    char *out = run(args, &st);
    cr_assert_eq(st, 0);
    cr_assert_gt(num(summary(out), "errors"), 0.0);
    free(out);
}
