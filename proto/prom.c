/* SPDX-License-Identifier: MIT */
/* Prometheus text exposition and lock-free latency histograms (prom.h). */
#include "proto/prom.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double prom_bucket_le[PROM_BUCKETS] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                             0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                             0.5,     1.0,    2.5,     5.0};

void prom_hist_observe(prom_hist *h, uint64_t ns)
{
    double s = (double)ns / 1e9;
    size_t i = 0;
    while (i < PROM_BUCKETS && s > prom_bucket_le[i])
        i++;
    atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void prom_init(prom_buf *b)
{
    memset(b, 0, sizeof(*b));
}

void prom_free(prom_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

void prom_appendf(prom_buf *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
}

static void header(prom_buf *b, const char *name, const char *type, const char *help)
{
    if (strcmp(b->last, name) == 0)
        return;
    snprintf(b->last, sizeof(b->last), "%s", name);
    prom_appendf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void value(prom_buf *b, double v)
{
    if (isnan(v))
        prom_appendf(b, " NaN\n");
    else if (isinf(v))
        prom_appendf(b, v > 0 ? " +Inf\n" : " -Inf\n");
    else if (v == floor(v) && fabs(v) < 9e15)
        prom_appendf(b, " %.0f\n", v);
    else
        prom_appendf(b, " %.9g\n", v);
}

void prom_sample(prom_buf *b, const char *name, const char *type, const char *help,
                 const char *labels, double v)
{
    header(b, name, type, help);
    if (labels && *labels)
        prom_appendf(b, "%s{%s}", name, labels);
    else
        prom_appendf(b, "%s", name);
    value(b, v);
}

void prom_histogram(prom_buf *b, const char *name, const char *help, const char *labels,
                    const prom_hist *h)
{
    header(b, name, "histogram", help);
    const char *sep = labels && *labels ? "," : "";
    labels = labels ? labels : "";
    uint64_t cum = 0;
    for (size_t i = 0; i <= PROM_BUCKETS; i++) {
        cum += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
        if (i < PROM_BUCKETS)
            prom_appendf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, prom_bucket_le[i],
                         (unsigned long long)cum);
        else
            prom_appendf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                         (unsigned long long)cum);
    }
    double sum = (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9;
    if (*labels)
        prom_appendf(b, "%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, labels, sum, name, labels,
                     (unsigned long long)cum);
    else
        prom_appendf(b, "%s_sum %.9g\n%s_count %llu\n", name, sum, name, (unsigned long long)cum);
}

void prom_label_escape(const char *in, char *out, size_t outlen)
{
    size_t k = 0;
    for (; *in && k + 3 < outlen; in++) {
        if (*in == '\\' || *in == '"') {
            out[k++] = '\\';
            out[k++] = *in;
        } else if (*in == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
        } else {
            out[k++] = *in;
        }
    }
    if (outlen)
        out[k < outlen ? k : outlen - 1] = '\0';
}
