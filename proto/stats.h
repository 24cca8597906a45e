/* SPDX-License-Identifier: MIT */
/*
 * The typed statistics list: one list, built once per request by a process
 * (node/stats.c, shard/router_admin.c), rendered two ways:
 *   - admin.Stats name/value pairs (kv_stats_to_statlist): each entry with
 *     a key, in list order, its value formatted as the entry says (an
 *     integer, a decimal with prec digits, text, or a histogram summary);
 *   - the Prometheus text exposition of /metrics (kv_stats_to_prom): each
 *     entry with a metric name, grouped by name (HELP and TYPE once per
 *     name), the value multiplied by scale (admin.Stats keeps its historic
 *     units, e.g. microseconds, /metrics uses base units, seconds).
 * An entry may have only a key (text, or a figure with no metric), only a
 * metric (a per-state gauge of an enum, a label split), or both.
 *
 * Metric names follow Prometheus conventions: the hotkv_ prefix, base units
 * (seconds, bytes), _total for counters; labels are `name="value"` pairs
 * (kv_stat_label escapes a value). Single-threaded; the list owns the
 * strings it holds (help strings and histograms are borrowed: literals,
 * and histograms that outlive the rendering).
 */
#ifndef KV_PROTO_STATS_H
#define KV_PROTO_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/prom.h"

typedef enum kv_stat_kind {
    KV_STAT_COUNTER,
    KV_STAT_GAUGE,
    KV_STAT_TEXT,      /* admin.Stats only */
    KV_STAT_HISTOGRAM, /* a prom_hist */
} kv_stat_kind;

typedef struct kv_stat {
    kv_stat_kind kind;
    char *key;        /* admin.Stats name ("reads.memory"); NULL = /metrics only */
    char *metric;     /* Prometheus name ("hotkv_node_reads_total"); NULL = admin.Stats only */
    char *labels;     /* `tier="memory"`, NULL = none */
    const char *help; /* a literal */
    bool is_float;    /* value in d (printed with prec decimals), else in u */
    int prec;
    uint64_t u;
    double d;
    double scale; /* /metrics value = value * scale */
    char *text;   /* KV_STAT_TEXT */
    const prom_hist *hist;
} kv_stat;

typedef struct kv_stats {
    kv_stat *v;
    size_t n, cap;
    bool oom; /* an add failed: the list is incomplete */
} kv_stats;

void kv_stats_init(kv_stats *l);
void kv_stats_free(kv_stats *l);

/* Appends a copy of *s (its strings copied, help and hist borrowed). */
void kv_stats_add(kv_stats *l, const kv_stat *s);

/* An integer counter or gauge. key or metric may be NULL (not rendered
 * there); labels may be NULL. */
void kv_stat_counter(kv_stats *l, const char *key, const char *metric, const char *labels,
                     const char *help, uint64_t v);
void kv_stat_gauge(kv_stats *l, const char *key, const char *metric, const char *labels,
                   const char *help, uint64_t v);
/* A decimal gauge: admin.Stats shows v with prec decimals, /metrics
 * v * scale (scale 1e-6 for a figure kept in microseconds, say). */
void kv_stat_gaugef(kv_stats *l, const char *key, int prec, const char *metric, const char *labels,
                    const char *help, double v, double scale);
/* A text value for admin.Stats only. */
void kv_stat_text(kv_stats *l, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An enum: admin.Stats key = value; /metrics one gauge per state of
 * states (NULL-terminated), metric{labels,state="s"} = 1 for value, else
 * 0. metric may be NULL. */
void kv_stat_enum(kv_stats *l, const char *key, const char *metric, const char *labels,
                  const char *help, const char *value, const char *const *states);
/* A latency histogram (borrowed: it must outlive the rendering). admin.Stats
 * shows "count=N mean_ms=M p50_ms=A p99_ms=B" (quantiles as bucket bounds). */
void kv_stat_hist(kv_stats *l, const char *key, const char *metric, const char *labels,
                  const char *help, const prom_hist *h);

/* Writes name="value" (value escaped) into out; returns out. */
char *kv_stat_label(char *out, size_t outlen, const char *name, const char *value);

/* The first entry with this admin.Stats key, NULL when none. */
const kv_stat *kv_stats_find(const kv_stats *l, const char *key);
/* The entry's admin.Stats value formatted into out; returns out. */
char *kv_stat_format(const kv_stat *s, char *out, size_t outlen);

/* Appends every metric of l to b (grouped by name, stable order within a
 * name). */
void kv_stats_to_prom(const kv_stats *l, prom_buf *b);

/* The upper bound (seconds) of the bucket holding quantile q of h, 0 for an
 * empty histogram, +Inf past the last bound. */
double prom_hist_quantile(const prom_hist *h, double q);

#endif
