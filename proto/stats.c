/* SPDX-License-Identifier: MIT */
/* The typed statistics list and its two renderings (stats.h). */
#include "proto/stats.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/statlist.h"

void kv_stats_init(kv_stats *l)
{
    memset(l, 0, sizeof(*l));
}

static void stat_free(kv_stat *s)
{
    free(s->key);
    free(s->metric);
    free(s->labels);
    free(s->text);
}

void kv_stats_free(kv_stats *l)
{
    for (size_t i = 0; i < l->n; i++)
        stat_free(&l->v[i]);
    free(l->v);
    memset(l, 0, sizeof(*l));
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (!s)
        return NULL;
    char *d = strdup(s);
    if (!d)
        *oom = true;
    return d;
}

void kv_stats_add(kv_stats *l, const kv_stat *s)
{
    if (l->oom)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        kv_stat *v = realloc(l->v, cap * sizeof(*v));
        if (!v) {
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    kv_stat *d = &l->v[l->n];
    *d = *s;
    bool oom = false;
    d->key = dup_or_null(s->key, &oom);
    d->metric = dup_or_null(s->metric, &oom);
    d->labels = s->labels && *s->labels ? dup_or_null(s->labels, &oom) : NULL;
    d->text = dup_or_null(s->text, &oom);
    if (d->scale == 0)
        d->scale = 1;
    if (oom) {
        stat_free(d);
        l->oom = true;
        return;
    }
    l->n++;
}

void kv_stat_counter(kv_stats *l, const char *key, const char *metric, const char *labels,
                     const char *help, uint64_t v)
{
    kv_stats_add(l, &(kv_stat){.kind = KV_STAT_COUNTER,
                               .key = (char *)key,
                               .metric = (char *)metric,
                               .labels = (char *)labels,
                               .help = help,
                               .u = v});
}

void kv_stat_gauge(kv_stats *l, const char *key, const char *metric, const char *labels,
                   const char *help, uint64_t v)
{
    kv_stats_add(l, &(kv_stat){.kind = KV_STAT_GAUGE,
                               .key = (char *)key,
                               .metric = (char *)metric,
                               .labels = (char *)labels,
                               .help = help,
                               .u = v});
}

void kv_stat_gaugef(kv_stats *l, const char *key, int prec, const char *metric, const char *labels,
                    const char *help, double v, double scale)
{
    kv_stats_add(l, &(kv_stat){.kind = KV_STAT_GAUGE,
                               .key = (char *)key,
                               .metric = (char *)metric,
                               .labels = (char *)labels,
                               .help = help,
                               .is_float = true,
                               .prec = prec,
                               .d = v,
                               .scale = scale});
}

void kv_stat_text(kv_stats *l, const char *key, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    kv_stats_add(l, &(kv_stat){.kind = KV_STAT_TEXT, .key = (char *)key, .text = buf});
}

void kv_stat_enum(kv_stats *l, const char *key, const char *metric, const char *labels,
                  const char *help, const char *value, const char *const *states)
{
    if (key)
        kv_stat_text(l, key, "%s", value);
    if (!metric)
        return;
    for (size_t i = 0; states[i]; i++) {
        char lab[512], st[128];
        kv_stat_label(st, sizeof(st), "state", states[i]);
        if (labels && *labels)
            snprintf(lab, sizeof(lab), "%s,%s", labels, st);
        else
            snprintf(lab, sizeof(lab), "%s", st);
        kv_stat_gauge(l, NULL, metric, lab, help, strcmp(states[i], value) == 0);
    }
}

void kv_stat_hist(kv_stats *l, const char *key, const char *metric, const char *labels,
                  const char *help, const prom_hist *h)
{
    kv_stats_add(l, &(kv_stat){.kind = KV_STAT_HISTOGRAM,
                               .key = (char *)key,
                               .metric = (char *)metric,
                               .labels = (char *)labels,
                               .help = help,
                               .hist = h});
}

char *kv_stat_label(char *out, size_t outlen, const char *name, const char *value)
{
    char esc[256];
    prom_label_escape(value, esc, sizeof(esc));
    snprintf(out, outlen, "%s=\"%s\"", name, esc);
    return out;
}

const kv_stat *kv_stats_find(const kv_stats *l, const char *key)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].key && strcmp(l->v[i].key, key) == 0)
            return &l->v[i];
    return NULL;
}

double prom_hist_quantile(const prom_hist *h, double q)
{
    uint64_t b[PROM_BUCKETS + 1], total = 0;
    for (size_t i = 0; i <= PROM_BUCKETS; i++)
        total += b[i] = atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
    if (!total)
        return 0;
    uint64_t want = (uint64_t)ceil(q * (double)total), cum = 0;
    if (want == 0)
        want = 1;
    for (size_t i = 0; i < PROM_BUCKETS; i++) {
        cum += b[i];
        if (cum >= want)
            return prom_bucket_le[i];
    }
    return INFINITY;
}

char *kv_stat_format(const kv_stat *s, char *out, size_t outlen)
{
    switch (s->kind) {
    case KV_STAT_TEXT:
        snprintf(out, outlen, "%s", s->text ? s->text : "");
        break;
    case KV_STAT_HISTOGRAM: {
        uint64_t n = 0;
        for (size_t i = 0; i <= PROM_BUCKETS; i++)
            n += atomic_load_explicit(&s->hist->bucket[i], memory_order_relaxed);
        double sum = (double)atomic_load_explicit(&s->hist->sum_ns, memory_order_relaxed) / 1e6;
        snprintf(out, outlen, "count=%llu mean_ms=%.3f p50_ms=%g p99_ms=%g", (unsigned long long)n,
                 n ? sum / (double)n : 0.0, prom_hist_quantile(s->hist, 0.5) * 1e3,
                 prom_hist_quantile(s->hist, 0.99) * 1e3);
        break;
    }
    default:
        if (s->is_float)
            snprintf(out, outlen, "%.*f", s->prec, s->d);
        else
            snprintf(out, outlen, "%llu", (unsigned long long)s->u);
    }
    return out;
}

void kv_stats_to_statlist(const kv_stats *s, rpc_statlist *l)
{
    if (s->oom)
        l->oom = true;
    for (size_t i = 0; i < s->n; i++) {
        if (!s->v[i].key)
            continue;
        char buf[512];
        rpc_stats_add(l, s->v[i].key, "%s", kv_stat_format(&s->v[i], buf, sizeof(buf)));
    }
}

void kv_stats_to_prom(const kv_stats *l, prom_buf *b)
{
    size_t *idx = malloc((l->n ? l->n : 1) * sizeof(*idx));
    if (!idx) {
        b->oom = true;
        return;
    }
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].metric && l->v[i].kind != KV_STAT_TEXT)
            idx[n++] = i;
    /* group by name: a stable insertion sort (a few hundred entries; qsort's
     * comparator could not see the list without shared state) */
    for (size_t i = 1; i < n; i++) {
        size_t x = idx[i], j = i;
        while (j > 0 && strcmp(l->v[idx[j - 1]].metric, l->v[x].metric) > 0) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = x;
    }
    for (size_t k = 0; k < n; k++) {
        const kv_stat *s = &l->v[idx[k]];
        const char *help = s->help ? s->help : s->metric;
        if (s->kind == KV_STAT_HISTOGRAM) {
            prom_histogram(b, s->metric, help, s->labels, s->hist);
            continue;
        }
        double v = s->is_float ? s->d : (double)s->u;
        prom_sample(b, s->metric, s->kind == KV_STAT_COUNTER ? "counter" : "gauge", help, s->labels,
                    v * s->scale);
    }
    free(idx);
}
