/* SPDX-License-Identifier: MIT */
/*
 * Prometheus text exposition (format 0.0.4) and latency histograms.
 *
 * prom_buf builds one /metrics page: each metric name gets its # HELP and
 * # TYPE lines once, before its first sample, and samples of one name must
 * be written together (the format wants a metric's samples in one group).
 * Names follow Prometheus conventions: hotkv_ prefix, base units (seconds,
 * bytes), _total for counters.
 *
 * prom_hist is a fixed-bucket latency histogram that any number of threads
 * update without locks (relaxed atomic adds: each bucket, the count and the
 * sum are independent counters, so a scrape may see an observation in one
 * and not yet in another; Prometheus tolerates that, and _count is written
 * as the +Inf bucket's value so the two always agree).
 */
#ifndef KV_PROTO_PROM_H
#define KV_PROTO_PROM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROM_BUCKETS 16

/* Upper bounds of the buckets in seconds: 50 us .. 5 s (+Inf implied). */
extern const double prom_bucket_le[PROM_BUCKETS];

typedef struct prom_hist {
    _Atomic uint64_t bucket[PROM_BUCKETS + 1]; /* non-cumulative; last = above 5 s */
    _Atomic uint64_t sum_ns;
} prom_hist;

/* Records one observation of ns nanoseconds. Any thread, lock-free. */
void prom_hist_observe(prom_hist *h, uint64_t ns);

typedef struct prom_buf {
    char *p;
    size_t len, cap;
    bool oom;
    char last[128]; /* the metric name whose HELP/TYPE was written last */
} prom_buf;

void prom_init(prom_buf *b);
/* Appends printf(fmt, ...) to b (any text: the dashboard's JSON uses it
 * too); on allocation failure sets b->oom. */
void prom_appendf(prom_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void prom_free(prom_buf *b);
/* One sample: name{labels} value. type is "counter" or "gauge"; labels is
 * NULL or `key="value",...` (values escaped by the caller with
 * prom_label_escape). HELP/TYPE lines are written when name differs from
 * the previous sample's. */
void prom_sample(prom_buf *b, const char *name, const char *type, const char *help,
                 const char *labels, double value);
/* A histogram: name_bucket{labels,le="..."} cumulative, name_sum, name_count. */
void prom_histogram(prom_buf *b, const char *name, const char *help, const char *labels,
                    const prom_hist *h);
/* Escapes a label value (\\, ", newline) into out (NUL-terminated, cut to
 * outlen). */
void prom_label_escape(const char *in, char *out, size_t outlen);

#endif
