/* SPDX-License-Identifier: MIT */
/*
 * kvbench --timeline FILE: the timed run cut into --timeline-ms intervals by
 * completion time, so a script can take the figures of any window of the run
 * (for instance while a membership change streams data). Each worker keeps
 * one latency histogram and an error count per interval, allocated when the
 * first op completes in it (about 30 KiB each) and written by that worker
 * only; after the workers are joined, main merges them interval by interval
 * and writes one JSON line per interval: its start (seconds into the run and
 * wall-clock milliseconds), length, ops, errors, quantiles and the sparse
 * histogram ([bucket µs, count] pairs), from which the quantiles of several
 * intervals together can be computed exactly (to the histogram's 1.6 %).
 * The last interval also takes the ops that complete after --seconds (the
 * requests still in flight at the end).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "bench/kvbench/kvbench.h"

struct kvb_tl_bin {
    kvb_hist h;
    uint64_t errors;
};

kv_err kvb_tl_init(kvb_shared *sh, kvb_worker *w, long nthreads)
{
    const kvb_opts *o = sh->o;
    sh->tl_ns = (uint64_t)o->timeline_ms * 1000000u;
    /* whole intervals of the run, plus one for the requests that finish after it */
    sh->tl_n = (size_t)((o->seconds * 1e9 + (double)sh->tl_ns - 1.0) / (double)sh->tl_ns) + 1;
    for (long i = 0; i < nthreads; i++)
        if (!(w[i].tl = calloc(sh->tl_n, sizeof(*w[i].tl))))
            return KV_RESOURCE_EXHAUSTED;
    return KV_OK;
}

void kvb_tl_add(kvb_worker *w, uint64_t end_ns, uint64_t latency_ns, bool ok)
{
    const kvb_shared *sh = w->sh;
    if (!w->tl)
        return;
    uint64_t k = end_ns > sh->t0_ns ? (end_ns - sh->t0_ns) / sh->tl_ns : 0;
    if (k >= sh->tl_n)
        k = sh->tl_n - 1;
    kvb_tl_bin *b = w->tl[k];
    if (!b && !(b = w->tl[k] = calloc(1, sizeof(*b)))) {
        w->tl_oom = true;
        return;
    }
    if (ok)
        kvb_hist_add(&b->h, latency_ns);
    else
        b->errors++;
}

/* Interval k of every worker merged into *out. */
static void merge_bin(kvb_worker *w, long nthreads, size_t k, kvb_tl_bin *out)
{
    memset(out, 0, sizeof(*out));
    for (long i = 0; i < nthreads; i++) {
        const kvb_tl_bin *b = w[i].tl ? w[i].tl[k] : NULL;
        if (!b)
            continue;
        kvb_hist_merge(&out->h, &b->h);
        out->errors += b->errors;
    }
}

static void write_line(FILE *f, const kvb_shared *sh, size_t k, uint64_t end_ns,
                       const kvb_tl_bin *b)
{
    uint64_t start = (uint64_t)k * sh->tl_ns, len = sh->tl_ns;
    if (k == sh->tl_n - 1 || start + len > end_ns)
        len = end_ns > start ? end_ns - start : 1; /* cut at the run's end */
    double secs = (double)len / 1e9;
    fprintf(f,
            "{\"t_s\":%.3f,\"unix_ms\":%" PRIu64 ",\"ms\":%.1f,\"ops\":%" PRIu64
            ",\"ops_per_s\":%.1f,\"errors\":%" PRIu64
            ",\"p50_us\":%.1f,\"p99_us\":%.1f,\"max_us\":%.1f,\"hist\":[",
            (double)start / 1e9, sh->t0_wall_ms + start / 1000000u, (double)len / 1e6, b->h.n,
            (double)b->h.n / secs, b->errors, kvb_hist_quantile_us(&b->h, 0.50),
            kvb_hist_quantile_us(&b->h, 0.99), (double)b->h.max / 1000.0);
    for (unsigned i = 0, first = 1; i < KVB_HIST_BUCKETS; i++)
        if (b->h.b[i]) {
            fprintf(f, "%s[%.3f,%" PRIu64 "]", first ? "" : ",", kvb_hist_bucket_us(i), b->h.b[i]);
            first = 0;
        }
    fputs("]}\n", f);
}

kv_err kvb_tl_write(const kvb_shared *sh, kvb_worker *w, long nthreads, FILE *f)
{
    uint64_t end = 1;
    bool oom = false;
    size_t last = 0;
    kvb_tl_bin *b = malloc(sizeof(*b));
    if (!b)
        return KV_RESOURCE_EXHAUSTED;
    for (long i = 0; i < nthreads; i++) {
        if (w[i].finish_ns > sh->t0_ns && w[i].finish_ns - sh->t0_ns > end)
            end = w[i].finish_ns - sh->t0_ns;
        oom |= w[i].tl_oom;
        for (size_t k = 0; w[i].tl && k < sh->tl_n; k++)
            if (w[i].tl[k] && k + 1 > last)
                last = k + 1;
    }
    for (size_t k = 0; k < last; k++) { /* empty intervals inside the run too */
        merge_bin(w, nthreads, k, b);
        write_line(f, sh, k, end, b);
    }
    free(b);
    if (oom)
        fprintf(stderr, "kvbench: --timeline: out of memory, some intervals are incomplete\n");
    return fflush(f) == 0 && !ferror(f) ? KV_OK : KV_INTERNAL;
}

void kvb_tl_free(kvb_worker *w)
{
    const kvb_shared *sh = w->sh;
    for (size_t k = 0; w->tl && sh && k < sh->tl_n; k++)
        free(w->tl[k]);
    free(w->tl);
    w->tl = NULL;
}
