/* SPDX-License-Identifier: MIT */
/* The typed statistics list (proto/stats.c) and the RPC metrics
 * (proto/rpc_metrics.c): one list rendered as admin.Stats pairs and as
 * Prometheus text, grouped by metric name, with scales, enums and
 * histograms. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/rpc_metrics.h"
#include "proto/statlist.h"
#include "proto/stats.h"

static const char *admin(const rpc_statlist *l, const char *name)
{
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->items[i].name, name) == 0)
            return l->items[i].value;
    return NULL;
}

Test(stats, one_list_two_renderings)
{
    kv_stats l;
    kv_stats_init(&l);
    kv_stat_counter(&l, "reads.memory", "hotkv_x_reads_total", "tier=\"memory\"", "Reads.", 7);
    kv_stat_gauge(&l, "mem_bytes", "hotkv_x_memory_bytes", NULL, "Memory.", 4096);
    kv_stat_counter(&l, "reads.fast", "hotkv_x_reads_total", "tier=\"fast\"", NULL, 3);
    kv_stat_gaugef(&l, "p99_us", 1, "hotkv_x_p99_seconds", NULL, "p99.", 250.0, 1e-6);
    kv_stat_text(&l, "durability", "%s", "batch");
    static const char *const states[] = {"classic", "tuning", NULL};
    kv_stat_enum(&l, "nhc.state", "hotkv_x_state", NULL, "State.", "tuning", states);
    kv_stat_gauge(&l, NULL, "hotkv_x_metrics_only", NULL, "Only in /metrics.", 1);

    rpc_statlist sl;
    rpc_stats_init(&sl);
    kv_stats_to_statlist(&l, &sl);
    cr_expect_str_eq(admin(&sl, "reads.memory"), "7");
    cr_expect_str_eq(admin(&sl, "mem_bytes"), "4096");
    cr_expect_str_eq(admin(&sl, "p99_us"), "250.0", "admin keeps its unit and precision");
    cr_expect_str_eq(admin(&sl, "durability"), "batch");
    cr_expect_str_eq(admin(&sl, "nhc.state"), "tuning");
    cr_expect_eq(sl.n, 6u, "the metrics-only entries stay out of admin.Stats");
    rpc_stats_free(&sl);

    prom_buf b;
    prom_init(&b);
    kv_stats_to_prom(&l, &b);
    cr_assert(!b.oom);
    prom_appendf(&b, "%c", '\0');
    const char *t = b.p;
    /* the two reads samples are grouped under one HELP/TYPE */
    const char *h = strstr(t, "# TYPE hotkv_x_reads_total counter\n");
    cr_assert(h, "%s", t);
    cr_expect(
        strstr(h,
               "hotkv_x_reads_total{tier=\"memory\"} 7\nhotkv_x_reads_total{tier=\"fast\"} 3\n") ==
            strchr(h, '\n') + 1,
        "samples of a name follow its header: %s", t);
    cr_expect(strstr(strchr(h, '\n') + 1, "# TYPE hotkv_x_reads_total") == NULL, "one header");
    cr_expect(strstr(t, "hotkv_x_p99_seconds 0.00025\n"), "scaled to seconds: %s", t);
    cr_expect(strstr(t, "hotkv_x_state{state=\"tuning\"} 1\n"), "%s", t);
    cr_expect(strstr(t, "hotkv_x_state{state=\"classic\"} 0\n"), "%s", t);
    cr_expect(strstr(t, "hotkv_x_metrics_only 1\n"), "%s", t);
    cr_expect(strstr(t, "durability") == NULL, "text stays out of /metrics");
    prom_free(&b);
    kv_stats_free(&l);
}

Test(stats, label_escaping)
{
    char lab[64];
    kv_stat_label(lab, sizeof(lab), "node", "a\"b\\c\nd");
    cr_expect_str_eq(lab, "node=\"a\\\"b\\\\c\\nd\"");
}

static kv_err nop(rpc_ctx *c, const uint8_t *body, size_t len)
{
    return KV_OK;
}

Test(stats, rpc_metrics_count_by_method_and_code)
{
    static const rpc_method methods[] = {{"kv.Get", nop}, {"kv.Put", nop}};
    rpc_metrics *m = NULL;
    cr_assert_eq(rpc_metrics_create(&m, methods, 2), KV_OK);
    rpc_metrics_observe(m, 0, KV_OK, 40000);                  /* 40 us: the first bucket */
    rpc_metrics_observe(m, 0, KV_OK, 2000000);                /* 2 ms */
    rpc_metrics_observe(m, 0, KV_NOT_FOUND, 900);             /* under the first bound */
    rpc_metrics_observe(m, 1, KV_UNAVAILABLE, 9000000000ull); /* 9 s: above 5 s */
    rpc_metrics_observe(m, 7, KV_OK, 1);                      /* no such method: ignored */
    cr_expect_eq(rpc_metrics_calls(m, "kv.Get"), 3u);
    cr_expect_eq(rpc_metrics_calls(m, "kv.Put"), 1u);
    kv_stats l;
    kv_stats_init(&l);
    rpc_metrics_stats(m, &l, "hotkv_t");
    prom_buf b;
    prom_init(&b);
    kv_stats_to_prom(&l, &b);
    prom_appendf(&b, "%c", '\0');
    const char *t = b.p;
    cr_expect(strstr(t, "hotkv_t_requests_total{method=\"kv.Get\",code=\"OK\"} 2\n"), "%s", t);
    cr_expect(strstr(t, "hotkv_t_requests_total{method=\"kv.Get\",code=\"NOT_FOUND\"} 1\n"), "%s",
              t);
    cr_expect(strstr(t, "hotkv_t_requests_total{method=\"kv.Put\",code=\"UNAVAILABLE\"} 1\n"), "%s",
              t);
    cr_expect(
        strstr(t, "hotkv_t_request_duration_seconds_bucket{method=\"kv.Get\",le=\"5e-05\"} 2\n"),
        "%s", t);
    cr_expect(
        strstr(t, "hotkv_t_request_duration_seconds_bucket{method=\"kv.Get\",le=\"+Inf\"} 3\n"),
        "%s", t);
    cr_expect(strstr(t, "hotkv_t_request_duration_seconds_count{method=\"kv.Get\"} 3\n"), "%s", t);
    cr_expect(strstr(t, "hotkv_t_request_duration_seconds_bucket{method=\"kv.Put\",le=\"5\"} 0\n"),
              "%s", t);
    cr_expect(
        strstr(t, "hotkv_t_request_duration_seconds_bucket{method=\"kv.Put\",le=\"+Inf\"} 1\n"),
        "%s", t);
    /* admin.Stats: a summary per method called */
    rpc_statlist sl;
    rpc_stats_init(&sl);
    kv_stats_to_statlist(&l, &sl);
    const char *get = admin(&sl, "rpc.kv.Get");
    cr_assert(get);
    cr_expect(strncmp(get, "count=3 ", 8) == 0, "%s", get);
    cr_expect(strstr(get, "p50_ms=0.05") && strstr(get, "p99_ms=2.5"), "%s", get);
    rpc_stats_free(&sl);
    cr_expect(isinf(prom_hist_quantile(&((prom_hist){.bucket[PROM_BUCKETS] = 1}), 0.5)));
    prom_free(&b);
    kv_stats_free(&l);
    rpc_metrics_destroy(m);
}
