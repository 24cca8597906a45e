/* SPDX-License-Identifier: MIT */
/*
 * index_bench runner: loads one index from the worker threads, runs timed
 * phases (each thread loops over its pre-drawn trace and publishes its
 * counters every batch; with --rounds the phases of the indexes are
 * interleaved and their counts summed), samples the counters every
 * --series-ms for the hot-set shift series, and prints the JSON result and
 * summary lines.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/index_bench.h"
#include "common/clock.h"
#include "common/log.h"

#define MOD "index_bench"
#define BATCH 256 /* ops between looks at the stop flag and counter updates */

typedef struct ib_counters {
    _Atomic uint64_t ops, reads, hits, visited, head_hits, cpu_ns;
} __attribute__((aligned(64))) ib_counters;

typedef struct ib_shared {
    const ib_opts *o;
    const ib_traces *tr;
    const ib_impl *impl;
    void *h;
    pthread_barrier_t start;
    _Atomic int phase;
    _Atomic bool stop;
    _Atomic int load_err; /* first kv_err of the load */
    bool loading;         /* workers load their share instead of running */
} ib_shared;

typedef struct ib_worker {
    ib_counters c; /* first: keeps the counters on their own line */
    ib_shared *s;
    unsigned id;
    pthread_t th;
} ib_worker;

/* Loads this thread's share of the load order: ids t, t + T, t + 2T, ... */
static void load_share(ib_worker *w, unsigned char *val)
{
    ib_shared *s = w->s;
    unsigned char key[WL_KEY8_LEN];
    size_t vs = (size_t)s->o->value_size;
    for (uint64_t i = w->id; i < s->o->wl.keys; i += (uint64_t)s->o->threads) {
        uint64_t id = s->tr->order[i];
        wl_key8(id, key);
        memcpy(val, &id, vs < 8 ? vs : 8);
        kv_err rv = s->impl->put(s->h, key, sizeof(key), val, vs);
        if (rv != KV_OK) {
            int none = KV_OK;
            atomic_compare_exchange_strong(&s->load_err, &none, (int)rv);
            return;
        }
    }
}

static void exec_op(const ib_impl *impl, void *h, wl_op op, unsigned char *val, size_t vs,
                    unsigned char *out, ib_local *l)
{
    unsigned char key[WL_KEY8_LEN];
    ib_probe pr = {0};
    wl_key8(op.key, key);
    if (op.type == WL_OP_READ || op.type == WL_OP_RMW) {
        l->hits += impl->get(h, key, sizeof(key), out, vs, &pr);
        l->reads++;
        l->visited += pr.visited;
        l->head_hits += pr.head;
        l->meta_xor ^= pr.meta.version ^ pr.meta.seqno ^ pr.meta.expire_at ^ pr.meta.flags;
    }
    if (op.type != WL_OP_READ) { /* update, insert, the write half of RMW */
        memcpy(val, &l->ops, vs < 8 ? vs : 8);
        impl->put(h, key, sizeof(key), val, vs);
    }
}

/* Hands the run of consecutive reads starting at t[*i] (at most `batch`,
 * wrapping round the trace of n ops) to impl->get_batch; advances *i past
 * them and returns how many it read. out has room for IB_MAX_BATCH values of
 * cap bytes; t[*i] must be a read. */
static int exec_reads(const ib_impl *impl, void *h, const wl_op *t, size_t n, size_t *i, long batch,
                      unsigned char *out, size_t cap, ib_local *l)
{
    unsigned char keys[IB_MAX_BATCH][WL_KEY8_LEN];
    ib_meta metas[IB_MAX_BATCH];
    int m = 0;
    do { /* t[*i] is a read */
        wl_key8(t[*i].key, keys[m]);
        memset(&metas[m], 0, sizeof(metas[m]));
        m++;
        if (++*i == n)
            *i = 0;
    } while (m < batch && t[*i].type == WL_OP_READ);
    l->hits += impl->get_batch(h, keys[0], WL_KEY8_LEN, (size_t)m, out, cap, metas);
    l->reads += (uint64_t)m;
    for (int k = 0; k < m; k++)
        l->meta_xor ^= metas[k].version ^ metas[k].seqno ^ metas[k].expire_at ^ metas[k].flags;
    return m;
}

static void publish(ib_counters *c, const ib_local *l)
{
    atomic_store_explicit(&c->ops, l->ops, memory_order_relaxed);
    atomic_store_explicit(&c->reads, l->reads, memory_order_relaxed);
    atomic_store_explicit(&c->hits, l->hits, memory_order_relaxed);
    atomic_store_explicit(&c->visited, l->visited, memory_order_relaxed);
    atomic_store_explicit(&c->head_hits, l->head_hits, memory_order_relaxed);
    atomic_store_explicit(&c->cpu_ns, l->cpu_ns, memory_order_relaxed);
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void run_trace(ib_worker *w, unsigned char *val, unsigned char *out)
{
    ib_shared *s = w->s;
    const ib_impl *impl = s->impl;
    size_t vs = (size_t)s->o->value_size, n = s->tr->n, i = 0;
    long batch = impl->get_batch ? s->o->batch : 1;
    int phase = 0;
    const wl_op *t = s->tr->ops[0][w->id];
    ib_local l = {0};
    uint64_t cpu0 = thread_cpu_ns();
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
        int p = atomic_load_explicit(&s->phase, memory_order_relaxed);
        if (p != phase) {
            phase = p;
            t = s->tr->ops[p][w->id];
            i = 0;
        }
        for (int k = 0; k < BATCH;) {
            int m = 1;
            if (batch > 1 && t[i].type == WL_OP_READ) {
                m = exec_reads(impl, s->h, t, n, &i, batch, out, vs + 8, &l);
            } else {
                exec_op(impl, s->h, t[i], val, vs, out, &l);
                if (++i == n)
                    i = 0;
            }
            l.ops += (uint64_t)m;
            k += m;
        }
        l.cpu_ns = thread_cpu_ns() - cpu0;
        publish(&w->c, &l);
    }
}

static void *worker_main(void *arg)
{
    ib_worker *w = arg;
    ib_shared *s = w->s;
    size_t vs = (size_t)s->o->value_size;
    unsigned char *val = calloc(1, vs + 8), *out = calloc(IB_MAX_BATCH, vs + 8);
    s->impl->thread_enter();
    if (!val || !out)
        atomic_store(&s->load_err, (int)KV_RESOURCE_EXHAUSTED);
    else if (s->loading)
        load_share(w, val);
    if (!s->loading) {
        pthread_barrier_wait(&s->start);
        if (atomic_load(&s->load_err) == KV_OK)
            run_trace(w, val, out);
    }
    s->impl->thread_exit();
    free(val);
    free(out);
    return NULL;
}

/* Sums the workers' counters; adds the index's own read statistics when it
 * keeps them (they replace the probe-based visited / head hits). */
static void snapshot(ib_shared *s, ib_worker *w, ib_local *sum, ib_rstats *rs)
{
    memset(sum, 0, sizeof(*sum));
    for (long t = 0; t < s->o->threads; t++) {
        sum->ops += atomic_load_explicit(&w[t].c.ops, memory_order_relaxed);
        sum->reads += atomic_load_explicit(&w[t].c.reads, memory_order_relaxed);
        sum->hits += atomic_load_explicit(&w[t].c.hits, memory_order_relaxed);
        sum->visited += atomic_load_explicit(&w[t].c.visited, memory_order_relaxed);
        sum->head_hits += atomic_load_explicit(&w[t].c.head_hits, memory_order_relaxed);
        sum->cpu_ns += atomic_load_explicit(&w[t].c.cpu_ns, memory_order_relaxed);
    }
    memset(rs, 0, sizeof(*rs));
    if (s->impl->rstats)
        s->impl->rstats(s->h, rs);
}

/* Head-hit share between two snapshots, or -1 when unknown. */
static double head_share(const ib_shared *s, const ib_local *a, const ib_local *b,
                         const ib_rstats *ra, const ib_rstats *rb)
{
    if (s->impl->rstats)
        return rb->reads > ra->reads
                   ? (double)(rb->head_hits - ra->head_hits) / (double)(rb->reads - ra->reads)
                   : -1.0;
    if (!s->impl->probes || b->reads <= a->reads)
        return -1.0;
    return (double)(b->head_hits - a->head_hits) / (double)(b->reads - a->reads);
}

static void sleep_until(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* The timed phase seen from the main thread: one sample per series tick. */
static double timed_phase(ib_shared *s, ib_worker *w, ib_result *r, double seconds, ib_local *first,
                          ib_rstats *rfirst, ib_local *last, ib_rstats *rlast)
{
    const ib_opts *o = s->o;
    uint64_t tick = (uint64_t)o->series_ms * 1000000u;
    uint64_t t0 = kv_now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
    size_t cap = (size_t)(seconds * 1000 / (double)o->series_ms) + 2;
    r->series = o->shift_at > 0 ? calloc(cap, sizeof(*r->series)) : NULL;
    ib_local prev = *first;
    ib_rstats rprev = *rfirst;
    uint64_t shift = o->shift_at > 0 ? t0 + (uint64_t)(o->shift_at * 1e9) : UINT64_MAX;
    for (uint64_t prev_t = t0, next = t0 + tick;; prev_t = next, next += tick) {
        if (next > end)
            next = end;
        sleep_until(next);
        snapshot(s, w, last, rlast);
        if (r->series && r->nseries < cap && next > prev_t) {
            ib_sample *x = &r->series[r->nseries++];
            x->t_ms = (double)(next - t0) / 1e6; /* scheduled end of the interval */
            x->mops = (double)(last->ops - prev.ops) / ((double)(next - prev_t) / 1e3);
            x->head_hit = head_share(s, &prev, last, &rprev, rlast);
        }
        prev = *last;
        rprev = *rlast;
        if (next + tick / 2 >= shift && atomic_load(&s->phase) == 0)
            atomic_store(&s->phase, 1);
        if (next >= end)
            break;
    }
    atomic_store(&s->stop, true);
    for (long t = 0; t < o->threads; t++)
        pthread_join(w[t].th, NULL);
    double elapsed = (double)(kv_now_ns() - t0) / 1e9;
    snapshot(s, w, last, rlast);
    return elapsed;
}

/* Steady head-hit share over the second before the shift, the lowest share
 * after it, and how long after the shift it is back to 90% of steady. */
static void shift_metrics(const ib_opts *o, ib_result *r)
{
    double s_ms = o->shift_at * 1000, sum = 0;
    int n = 0;
    r->dip_head_hit = 2.0;
    r->recover_ms = -1;
    for (size_t i = 0; i < r->nseries; i++) {
        const ib_sample *x = &r->series[i];
        if (x->t_ms <= s_ms + 1 && x->t_ms > s_ms - 999 && x->head_hit >= 0) {
            sum += x->head_hit;
            n++;
        }
    }
    r->steady_head_hit = n ? sum / n : -1;
    for (size_t i = 0; i < r->nseries && n; i++) {
        const ib_sample *x = &r->series[i];
        if (x->t_ms <= s_ms + 1 || x->head_hit < 0)
            continue;
        if (x->head_hit < r->dip_head_hit)
            r->dip_head_hit = x->head_hit;
        if (r->recover_ms < 0 && x->head_hit >= 0.9 * r->steady_head_hit)
            r->recover_ms = x->t_ms - s_ms;
    }
    if (r->dip_head_hit > 1.0)
        r->dip_head_hit = -1;
}

static void start_workers(ib_shared *s, ib_worker *w)
{
    for (long t = 0; t < s->o->threads; t++) {
        w[t].s = s;
        w[t].id = (unsigned)t;
        if (pthread_create(&w[t].th, NULL, worker_main, &w[t]) != 0) {
            KV_ERROR(MOD, "pthread_create failed");
            exit(1); /* the barrier would wait forever */
        }
    }
}

static ib_worker *workers_new(long n)
{
    ib_worker *w = aligned_alloc(64, sizeof(*w) * (size_t)n);
    if (w)
        memset(w, 0, sizeof(*w) * (size_t)n);
    return w;
}

kv_err ib_load(const ib_opts *o, const ib_traces *tr, const ib_impl *impl, ib_state *st)
{
    ib_params p = {.keys = o->wl.keys,
                   .buckets = o->buckets,
                   .value_size = (size_t)o->value_size,
                   .rehash = o->rehash,
                   .hr_r = (unsigned)o->hr_r,
                   .rehash_cost = o->rehash_cost};
    /* lfht-auto starts at 1/8 of the fixed bucket count unless told: liburcu
     * grows an accounting table once it holds 8 items per bucket, so this is
     * the largest start that still grows during the load (lfht.c). */
    p.lfht_init = 1;
    while (p.lfht_init < (o->lfht_init > 0 ? (uint64_t)o->lfht_init : o->buckets / 8))
        p.lfht_init <<= 1;
    memset(st, 0, sizeof(*st));
    st->impl = impl;
    st->r.impl = impl->name;
    kv_err rv = impl->open(&st->h, &p);
    if (rv != KV_OK)
        return rv;
    ib_shared s = {.o = o, .tr = tr, .impl = impl, .h = st->h, .loading = true};
    ib_worker *w = workers_new(o->threads);
    if (!w) {
        impl->close(st->h);
        return KV_RESOURCE_EXHAUSTED;
    }
    KV_INFO(MOD, "%s: loading %" PRIu64 " keys into %" PRIu64 " buckets", impl->name, o->wl.keys,
            o->buckets);
    uint64_t t0 = kv_now_ns();
    start_workers(&s, w);
    for (long t = 0; t < o->threads; t++)
        pthread_join(w[t].th, NULL);
    free(w);
    if ((rv = (kv_err)atomic_load(&s.load_err)) != KV_OK) {
        impl->close(st->h);
        return rv;
    }
    if (impl->settle)
        impl->settle(st->h);
    st->r.load_s = (double)(kv_now_ns() - t0) / 1e9;
    KV_INFO(MOD, "%s: loaded in %.2f s", impl->name, st->r.load_s);
    return KV_OK;
}

static void accumulate(ib_state *st, const ib_local *a, const ib_local *b, const ib_rstats *ra,
                       const ib_rstats *rb, double seconds)
{
    st->acc.ops += b->ops - a->ops;
    st->acc.reads += b->reads - a->reads;
    st->acc.hits += b->hits - a->hits;
    st->acc.visited += b->visited - a->visited;
    st->acc.head_hits += b->head_hits - a->head_hits;
    st->acc.cpu_ns += b->cpu_ns - a->cpu_ns;
    st->racc.reads += rb->reads - ra->reads;
    st->racc.visited += rb->visited - ra->visited;
    st->racc.head_hits += rb->head_hits - ra->head_hits;
    st->r.seconds += seconds;
    if (st->r.nrounds < IB_MAX_ROUNDS)
        st->r.round_mops[st->r.nrounds++] = (double)(b->ops - a->ops) / seconds / 1e6;
}

kv_err ib_measure(const ib_opts *o, const ib_traces *tr, ib_state *st, double seconds)
{
    ib_shared s = {.o = o, .tr = tr, .impl = st->impl, .h = st->h};
    ib_worker *w = workers_new(o->threads);
    if (!w)
        return KV_RESOURCE_EXHAUSTED;
    pthread_barrier_init(&s.start, NULL, (unsigned)o->threads + 1);
    ib_local a, b;
    ib_rstats ra, rb;
    start_workers(&s, w);
    snapshot(&s, w, &a, &ra); /* before the start: workers count from zero */
    pthread_barrier_wait(&s.start);
    double elapsed = timed_phase(&s, w, &st->r, seconds, &a, &ra, &b, &rb);
    accumulate(st, &a, &b, &ra, &rb, elapsed);
    pthread_barrier_destroy(&s.start);
    free(w);
    KV_INFO(MOD, "%s: %.3f Mops/s over %.1f s", st->impl->name,
            (double)(b.ops - a.ops) / elapsed / 1e6, elapsed);
    return KV_OK;
}

kv_err ib_warmup(const ib_opts *o, const ib_traces *tr, ib_state *st, double seconds)
{
    ib_result r = st->r;
    ib_local acc = st->acc;
    ib_rstats racc = st->racc;
    KV_INFO(MOD, "%s: warm-up, %.1f s not counted", st->impl->name, seconds);
    kv_err rv = ib_measure(o, tr, st, seconds);
    st->r = r;
    st->acc = acc;
    st->racc = racc;
    return rv;
}

void ib_finish(const ib_opts *o, ib_state *st, ib_result *out)
{
    ib_result *r = &st->r;
    const ib_local *acc = &st->acc;
    r->ops = acc->ops;
    r->reads = acc->reads;
    r->hits = acc->hits;
    r->mops = r->seconds > 0 ? (double)r->ops / r->seconds / 1e6 : 0;
    r->cpu_mops =
        acc->cpu_ns ? (double)r->ops / ((double)acc->cpu_ns / 1e9) / 1e6 * (double)o->threads : 0;
    r->visited_per_read = r->head_hit = -1;
    if (st->impl->rstats && st->racc.reads) {
        r->visited_per_read = (double)st->racc.visited / (double)st->racc.reads;
        r->head_hit = (double)st->racc.head_hits / (double)st->racc.reads;
    } else if (st->impl->probes && acc->reads && !(st->impl->get_batch && o->batch > 1)) {
        /* batched reads fill no probes: unknown */
        r->visited_per_read = (double)acc->visited / (double)acc->reads;
        r->head_hit = (double)acc->head_hits / (double)acc->reads;
    }
    r->bucket_bytes = st->impl->bucket_bytes(st->h);
    r->final_buckets = st->impl->buckets ? st->impl->buckets(st->h) : 0;
    r->batch = st->impl->get_batch ? o->batch : 1;
    r->item_bytes = st->impl->item_bytes(st->h, WL_KEY8_LEN, (size_t)o->value_size);
    if (o->shift_at > 0)
        shift_metrics(o, r);
    st->impl->close(st->h);
    st->h = NULL;
    *out = *r;
}

/* ---- output -------------------------------------------------------------------- */

static void json_num(const char *name, double v)
{
    if (v < 0)
        printf(",\"%s\":null", name);
    else
        printf(",\"%s\":%.6g", name, v);
}

void ib_print_result(const ib_opts *o, const ib_result *r)
{
    bool scrambled = o->wl.dist == WL_SCRAMBLED_ZIPF;
    printf("{\"impl\":\"%s\",\"workload\":\"%s\",\"dist\":\"%s\",\"scrambled\":%s", r->impl,
           wl_workload_name(o->wl.workload), scrambled ? "zipf" : wl_dist_name(o->wl.dist),
           scrambled ? "true" : "false");
    printf(",\"theta\":%g,\"hot_pct\":%g,\"ratio\":%ld,\"threads\":%ld,\"value_size\":%ld",
           o->wl.theta, o->wl.hot_pct, o->ratio, o->threads, o->value_size);
    printf(",\"keys\":%" PRIu64 ",\"buckets\":%" PRIu64 ",\"miss_ratio\":%g,\"rehash\":%s",
           o->wl.keys, o->buckets, o->wl.miss_ratio, o->rehash ? "true" : "false");
    printf(",\"seconds\":%.3f,\"load_s\":%.3f,\"ops\":%" PRIu64 ",\"mops\":%.4f", r->seconds,
           r->load_s, r->ops, r->mops);
    printf(",\"cpu_mops\":%.4f,\"warmup\":%.3f", r->cpu_mops, o->warmup);
    json_num("visited_per_read", r->visited_per_read);
    json_num("head_hit", r->head_hit);
    json_num("hit_ratio", r->reads ? (double)r->hits / (double)r->reads : -1);
    printf(",\"bucket_bytes\":%" PRIu64 ",\"item_bytes\":%" PRIu64, r->bucket_bytes, r->item_bytes);
    printf(",\"final_buckets\":%" PRIu64 ",\"batch\":%ld", r->final_buckets, r->batch);
    if (r->nrounds > 1) {
        printf(",\"round_mops\":[");
        for (int i = 0; i < r->nrounds; i++)
            printf("%s%.4f", i ? "," : "", r->round_mops[i]);
        printf("]");
    }
    if (o->shift_at > 0) {
        printf(",\"shift_at\":%g", o->shift_at);
        json_num("steady_head_hit", r->steady_head_hit);
        json_num("dip_head_hit", r->dip_head_hit);
        json_num("recover_ms", r->recover_ms);
    }
    printf("}\n");
    if (o->shift_at > 0) {
        printf("{\"impl\":\"%s\",\"series\":[", r->impl);
        for (size_t i = 0; i < r->nseries; i++) {
            const ib_sample *x = &r->series[i];
            printf("%s{\"t_ms\":%.0f,\"mops\":%.4f", i ? "," : "", x->t_ms, x->mops);
            json_num("head_hit", x->head_hit);
            printf("}");
        }
        printf("]}\n");
    }
    fflush(stdout);
}

static bool is_hotring(const char *name)
{
    return strncmp(name, "hotring", 7) == 0;
}

/* "a/b" throughput ratios of every hotring variant against every other index
 * (of the first index against the rest when no hotring ran), and the bucket
 * memory of every other index relative to each hotring variant. */
void ib_print_summary(const ib_opts *o, const ib_result *res)
{
    bool any_hr = false;
    for (int i = 0; i < o->nimpls; i++)
        any_hr |= is_hotring(res[i].impl);
    printf("{\"summary\":true,\"ratios\":{");
    const char *sep = "";
    for (int i = 0; i < o->nimpls; i++) {
        if (any_hr ? !is_hotring(res[i].impl) : i != 0)
            continue;
        for (int j = 0; j < o->nimpls; j++) {
            if (j == i || (any_hr && is_hotring(res[j].impl)) || res[j].mops <= 0)
                continue;
            printf("%s\"%s/%s\":%.4f", sep, res[i].impl, res[j].impl, res[i].mops / res[j].mops);
            sep = ",";
        }
    }
    printf("},\"cpu_ratios\":{");
    sep = "";
    for (int i = 0; i < o->nimpls; i++) {
        if (any_hr ? !is_hotring(res[i].impl) : i != 0)
            continue;
        for (int j = 0; j < o->nimpls; j++) {
            if (j == i || (any_hr && is_hotring(res[j].impl)) || res[j].cpu_mops <= 0)
                continue;
            printf("%s\"%s/%s\":%.4f", sep, res[i].impl, res[j].impl,
                   res[i].cpu_mops / res[j].cpu_mops);
            sep = ",";
        }
    }
    printf("},\"mem_ratios\":{");
    sep = "";
    for (int i = 0; i < o->nimpls; i++) {
        if (!is_hotring(res[i].impl) || res[i].bucket_bytes == 0)
            continue;
        for (int j = 0; j < o->nimpls; j++) {
            if (is_hotring(res[j].impl))
                continue;
            printf("%s\"%s/%s\":%.4f", sep, res[j].impl, res[i].impl,
                   (double)res[j].bucket_bytes / (double)res[i].bucket_bytes);
            sep = ",";
        }
    }
    printf("}}\n");
    fflush(stdout);
}
