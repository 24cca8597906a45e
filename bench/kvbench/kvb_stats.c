/* SPDX-License-Identifier: MIT */
/*
 * kvbench statistics: an HDR-style latency histogram (exact below 64 ns,
 * then 64 linear sub-buckets per power of two, as in HdrHistogram with two
 * significant digits) and an exact per-key access count map (open
 * addressing with linear probing, grown at half load). Each worker owns its
 * own; main merges them after the workers have been joined, so nothing here
 * is thread-safe and nothing needs to be.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "bench/kvbench/kvbench.h"

/* ---- histogram ---------------------------------------------------------------- */

static unsigned hist_index(uint64_t v)
{
    if (v < KVB_HIST_SUB)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 6 */
    return ((e - 5u) << 6) + (unsigned)((v >> (e - 6u)) & (KVB_HIST_SUB - 1));
}

/* The middle of bucket i's value range. */
static uint64_t hist_value(unsigned i)
{
    if (i < KVB_HIST_SUB)
        return i;
    unsigned e = (i >> 6) + 5u, sub = i & (KVB_HIST_SUB - 1);
    uint64_t low = (uint64_t)(KVB_HIST_SUB + sub) << (e - 6u);
    return low + ((UINT64_C(1) << (e - 6u)) >> 1);
}

double kvb_hist_bucket_us(unsigned i)
{
    return (double)hist_value(i) / 1000.0;
}

void kvb_hist_add(kvb_hist *h, uint64_t ns)
{
    h->b[hist_index(ns)]++;
    h->n++;
    h->sum += ns;
    if (ns > h->max)
        h->max = ns;
}

void kvb_hist_merge(kvb_hist *into, const kvb_hist *h)
{
    for (unsigned i = 0; i < KVB_HIST_BUCKETS; i++)
        into->b[i] += h->b[i];
    into->n += h->n;
    into->sum += h->sum;
    if (h->max > into->max)
        into->max = h->max;
}

double kvb_hist_quantile_us(const kvb_hist *h, double q)
{
    if (h->n == 0)
        return 0.0;
    uint64_t rank = (uint64_t)((double)h->n * q + 0.999999);
    if (rank >= h->n)
        return (double)h->max / 1000.0; /* the largest value is kept exactly */
    if (rank == 0)
        rank = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < KVB_HIST_BUCKETS; i++) {
        seen += h->b[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);
            return (double)(v < h->max ? v : h->max) / 1000.0;
        }
    }
    return (double)h->max / 1000.0;
}

/* ---- key counts ------------------------------------------------------------------ */

static size_t slot_of(uint64_t id1, size_t cap)
{
    return (size_t)((id1 * UINT64_C(0x9e3779b97f4a7c15)) >> 17) & (cap - 1);
}

static void put_raw(uint64_t *ids, uint64_t *cnt, size_t cap, uint64_t id1, uint64_t by)
{
    size_t i = slot_of(id1, cap);
    while (ids[i] != 0 && ids[i] != id1)
        i = (i + 1) & (cap - 1);
    ids[i] = id1;
    cnt[i] += by;
}

static bool grow(kvb_counts *m)
{
    size_t cap = m->cap ? m->cap * 2 : 4096;
    uint64_t *ids = calloc(cap, sizeof(*ids)), *cnt = calloc(cap, sizeof(*cnt));
    if (!ids || !cnt) {
        free(ids);
        free(cnt);
        m->oom = true;
        return false;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->ids[i])
            put_raw(ids, cnt, cap, m->ids[i], m->cnt[i]);
    free(m->ids);
    free(m->cnt);
    m->ids = ids;
    m->cnt = cnt;
    m->cap = cap;
    return true;
}

void kvb_counts_add(kvb_counts *m, uint64_t id, uint64_t by)
{
    if ((m->n + 1) * 2 > m->cap && !grow(m))
        return;
    uint64_t id1 = id + 1;
    size_t i = slot_of(id1, m->cap);
    while (m->ids[i] != 0 && m->ids[i] != id1)
        i = (i + 1) & (m->cap - 1);
    if (m->ids[i] == 0) {
        m->ids[i] = id1;
        m->n++;
    }
    m->cnt[i] += by;
}

void kvb_counts_merge(kvb_counts *into, const kvb_counts *m)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->ids[i])
            kvb_counts_add(into, m->ids[i] - 1, m->cnt[i]);
    into->oom |= m->oom;
}

void kvb_counts_free(kvb_counts *m)
{
    free(m->ids);
    free(m->cnt);
    memset(m, 0, sizeof(*m));
}

/* ---- top K ------------------------------------------------------------------------- */

typedef struct top_entry {
    uint64_t id, count;
} top_entry;

/* a ranks before b: more accesses, then the smaller key. */
static bool ranks_before(const top_entry *a, const top_entry *b)
{
    return a->count > b->count || (a->count == b->count && a->id < b->id);
}

static int cmp_rank(const void *a, const void *b)
{
    return ranks_before(a, b) ? -1 : ranks_before(b, a) ? 1 : 0;
}

/* Restores the heap below i: the root is the entry that ranks last. */
static void sift_down(top_entry *h, size_t n, size_t i)
{
    for (;;) {
        size_t worst = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(&h[worst], &h[l]))
            worst = l;
        if (r < n && ranks_before(&h[worst], &h[r]))
            worst = r;
        if (worst == i)
            return;
        top_entry t = h[i];
        h[i] = h[worst];
        h[worst] = t;
        i = worst;
    }
}

/* Keeps the k best entries seen in the heap h[0..*n): O(log k) per entry. */
static void offer(top_entry *h, size_t *n, size_t k, top_entry e)
{
    if (*n < k) {
        size_t i = (*n)++;
        h[i] = e;
        while (i > 0 && ranks_before(&h[(i - 1) / 2], &h[i])) { /* sift up */
            top_entry t = h[i];
            h[i] = h[(i - 1) / 2];
            h[(i - 1) / 2] = t;
            i = (i - 1) / 2;
        }
        return;
    }
    if (k > 0 && ranks_before(&e, &h[0])) {
        h[0] = e;
        sift_down(h, *n, 0);
    }
}

void kvb_print_top(FILE *f, const char *name, const kvb_counts *m, long k)
{
    size_t want = k > 0 ? (size_t)k : 0, n = 0;
    top_entry *best = calloc(want ? want : 1, sizeof(*best));
    for (size_t i = 0; best && i < m->cap; i++)
        if (m->ids[i])
            offer(best, &n, want, (top_entry){m->ids[i] - 1, m->cnt[i]});
    qsort(best, n, sizeof(*best), cmp_rank);
    fprintf(f, "\"%s\":[", name);
    for (size_t i = 0; i < n; i++) {
        char key[WL_KEYSTR_MAX];
        wl_key_str(best[i].id, key, sizeof(key));
        fprintf(f, "%s{\"key\":\"%s\",\"count\":%" PRIu64 "}", i ? "," : "", key, best[i].count);
    }
    fputc(']', f);
    free(best);
}
