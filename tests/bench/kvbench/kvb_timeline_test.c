/* SPDX-License-Identifier: MIT */
/*
 * Tests of kvbench --timeline (bench/kvbench/kvb_timeline.c): in-process,
 * ops land in the interval of their completion time (late ones in the last
 * interval), every interval up to the last used one gets a line, and the
 * sparse histogram of a line adds up to its ops; against a real cluster
 * (3 kvnode + kvrouter on free loopback ports), the lines of a run add up to
 * the summary's ops, follow each other by --timeline-ms on the wall clock,
 * and bad --timeline flags are refused. Throughput is never checked.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/kvbench/kvbench.h"
#include "integration/harness.h"

#define MS 1000000ull
#define MAXLINES 64

static double num(const char *json, const char *name)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *p = strstr(json, pat);
    cr_assert_not_null(p, "field %s in %.200s", name, json);
    return strtod(p + strlen(pat), NULL);
}

/* Sum of the counts of a line's "hist":[[us,count],...]. */
static double hist_total(const char *line)
{
    const char *p = strstr(line, "\"hist\":[");
    cr_assert_not_null(p, "%.200s", line);
    p += strlen("\"hist\":[");
    double total = 0, us, count;
    int used;
    while (sscanf(p, "[%lf,%lf]%n", &us, &count, &used) == 2) {
        cr_assert_gt(us, 0.0);
        total += count;
        p += used;
        if (*p == ',')
            p++;
    }
    cr_assert_eq(*p, ']', "hist ends: %.60s", p);
    return total;
}

/* Reads f's lines into v (each malloc'ed); returns their number. */
static int read_lines(FILE *f, char **v, int max)
{
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    rewind(f);
    while (n < max && getline(&line, &cap, f) > 0) {
        v[n++] = line;
        line = NULL;
        cap = 0;
    }
    free(line);
    return n;
}

static void free_lines(char **v, int n)
{
    for (int i = 0; i < n; i++)
        free(v[i]);
}

/* ---- in-process ------------------------------------------------------------------ */

Test(kvb_timeline, ops_land_in_their_interval)
{
    kvb_opts o = {.seconds = 1.0, .timeline_ms = 250};
    kvb_shared sh = {.o = &o, .t0_ns = 1000 * MS, .t0_wall_ms = 5000};
    kvb_worker w[2] = {{.sh = &sh}, {.sh = &sh}};
    cr_assert_eq(kvb_tl_init(&sh, w, 2), KV_OK);
    cr_assert_eq(sh.tl_n, 5, "4 intervals of the run and one for late completions");
    kvb_tl_add(&w[0], sh.t0_ns + 10 * MS, 2000, true);   /* interval 0 */
    kvb_tl_add(&w[1], sh.t0_ns + 20 * MS, 4000, true);   /* interval 0 */
    kvb_tl_add(&w[1], sh.t0_ns + 260 * MS, 1000, false); /* interval 1: an error */
    kvb_tl_add(&w[0], sh.t0_ns + 700 * MS, 9000, true);  /* interval 2; 3 stays empty */
    kvb_tl_add(&w[0], sh.t0_ns + 5000 * MS, 7000, true); /* long after the end: the last */
    w[0].finish_ns = w[1].finish_ns = sh.t0_ns + 1100 * MS;
    FILE *f = tmpfile();
    cr_assert_eq(kvb_tl_write(&sh, w, 2, f), KV_OK);
    char *l[MAXLINES];
    int n = read_lines(f, l, MAXLINES);
    fclose(f);
    cr_assert_eq(n, 5);
    double want_ops[] = {2, 0, 1, 0, 1}, want_err[] = {0, 1, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        cr_assert_float_eq(num(l[i], "t_s"), i * 0.25, 1e-9, "%s", l[i]);
        cr_assert_float_eq(num(l[i], "unix_ms"), 5000 + i * 250, 1e-9, "%s", l[i]);
        cr_assert_float_eq(num(l[i], "ops"), want_ops[i], 1e-9, "%s", l[i]);
        cr_assert_float_eq(num(l[i], "errors"), want_err[i], 1e-9, "%s", l[i]);
        cr_assert_float_eq(hist_total(l[i]), want_ops[i], 1e-9, "%s", l[i]);
    }
    cr_assert_float_eq(num(l[0], "ms"), 250.0, 1e-9);
    cr_assert_float_eq(num(l[0], "ops_per_s"), 8.0, 1e-9, "2 ops in 0.25 s");
    cr_assert_float_eq(num(l[0], "max_us"), 4.0, 1e-9);
    cr_assert_float_eq(num(l[2], "p99_us"), 9.0, 1e-9, "%s", l[2]);
    cr_assert_float_eq(num(l[4], "ms"), 100.0, 1e-9, "the last interval ends with the run");
    free_lines(l, n);
    kvb_tl_free(&w[0]);
    kvb_tl_free(&w[1]);
}

/* ---- the binary against a cluster --------------------------------------------------- */

static kvt_cluster cl;

static void start(void)
{
    kv_err rv = kvt_cluster_start(&cl, 3, 2, NULL);
    cr_assert_eq(rv, KV_OK, "cluster start: %s (logs in %s)", kv_err_name(rv), cl.dir);
}

static void stop(void)
{
    kvt_cluster_stop(&cl);
}

/* Runs kvbench with args, stdout to out; returns its exit status. */
static int kvbench(const char *args, char *out, size_t outlen)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s %s 2>/dev/null", kvt_bin("bench/kvbench/kvbench"), args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    return pclose(p);
}

Test(kvb_timeline, lines_add_up_to_the_summary, .init = start, .fini = stop, .timeout = 90)
{
    char path[] = "/tmp/kvb_timeline_test.XXXXXX", args[1024];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    snprintf(args, sizeof(args),
             "--router %s --workload A --dist uniform --keys 1000 --load --seconds 2 "
             "--threads 2 --concurrency 4 --report-top 0 --timeout-ms 10000 "
             "--timeline %s --timeline-ms 500",
             cl.router_url, path);
    static char out[1 << 16];
    cr_assert_eq(kvbench(args, out, sizeof(out)), 0, "kvbench %s", args);
    const char *sum = strstr(out, "{\"summary\":true");
    cr_assert_not_null(sum, "%s", out);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char *l[MAXLINES];
    int n = read_lines(f, l, MAXLINES);
    fclose(f);
    unlink(path);
    cr_assert(n >= 4 && n <= 5, "2 s in 500 ms intervals (+ the requests in flight): %d", n);
    double ops = 0, errors = 0;
    for (int i = 0; i < n; i++) {
        ops += num(l[i], "ops");
        errors += num(l[i], "errors");
        cr_assert_float_eq(hist_total(l[i]), num(l[i], "ops"), 1e-9, "%s", l[i]);
        if (i > 0)
            cr_assert_float_eq(num(l[i], "unix_ms") - num(l[i - 1], "unix_ms"), 500.0, 1e-9);
        if (num(l[i], "ops") > 0)
            cr_assert_leq(num(l[i], "p50_us"), num(l[i], "p99_us"), "%s", l[i]);
    }
    cr_assert_float_eq(ops, num(sum, "ops"), 1e-9, "every measured op is in one interval");
    cr_assert_float_eq(errors, num(sum, "errors"), 1e-9);
    cr_assert_gt(ops, 0.0);
    free_lines(l, n);
}

Test(kvb_timeline, bad_flags)
{
    static char out[4096];
    const char *usage[] = {"--timeline-ms 5", "--timeline ''"};
    for (size_t i = 0; i < 2; i++) {
        int st = kvbench(usage[i], out, sizeof(out));
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "'%s' is a usage error", usage[i]);
    }
    int st = kvbench("--timeline /nonexistent-dir/x --seconds 0.1", out, sizeof(out));
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "an unwritable --timeline file: %d", st);
}
