/* SPDX-License-Identifier: MIT */
/*
 * tier_bench's runner: the load phase (every thread puts its slice of one
 * random load order), then the warm-up and the timed phase, in which each
 * worker loops over its own pre-drawn trace (bench/workload.h) and the main
 * thread flips a shared phase word (warm-up -> measure -> stop), moves the
 * hot set at --shift-at and prints a progress line on stderr. Latencies go
 * to per-thread log-linear histograms (16 sub-buckets per power of two, so
 * a percentile is within ~6%), merged after the run. Engine statistics are
 * taken right before and right after the timed phase.
 */
#define _GNU_SOURCE /* nftw */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/tier/tier_bench.h"
#include "common/clock.h"

#define NBUCKETS (64 * 16)
#define PH_WARMUP 0
#define PH_MEASURE 1
#define PH_STOP 2

typedef struct hist {
    uint64_t n[NBUCKETS];
} hist;

typedef struct worker {
    pthread_t tid;
    const tb_opts *o;
    const tb_engine *eng;
    void *h;
    unsigned idx;
    /* load: ids order[lo..hi); run: trace[shift][i % n] */
    const uint64_t *order;
    size_t lo, hi;
    wl_op *trace[2];
    size_t n;
    _Atomic uint64_t done; /* ops so far (progress), any phase */
    _Atomic bool finished; /* the thread returned */
    uint64_t ops, gets, found, puts, version, get_ns;
    uint64_t insert_max; /* highest id inserted (tb_result.insert_id_max), 0 = none */
    uint64_t inserted;   /* inserts in the warm-up and the timed phase */
    hist hget, hput;
    kv_err rv;
    unsigned char *val;
} worker;

typedef struct run_state {
    _Atomic int phase;
    _Atomic int shift;
    _Atomic uint64_t next_insert; /* --insert-ids shared: the next new id */
} run_state;

static run_state g_run;

static unsigned bucket_of(uint64_t v)
{
    if (v < 16)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned b = msb * 16 + (unsigned)((v >> (msb - 4)) & 15);
    return b < NBUCKETS ? b : NBUCKETS - 1;
}

static double bucket_mid(unsigned b)
{
    if (b < 16)
        return (double)b;
    unsigned msb = b / 16, sub = b % 16;
    double lo = (double)((16u + sub) * (1ull << (msb - 4)));
    return lo + (double)(1ull << (msb - 4)) / 2.0;
}

/* The q-quantile of h in microseconds (0 when empty). */
static double hist_quantile_us(const hist *h, double q)
{
    uint64_t total = 0, seen = 0;
    for (unsigned b = 0; b < NBUCKETS; b++)
        total += h->n[b];
    if (total == 0)
        return 0.0;
    uint64_t want = (uint64_t)(q * (double)total);
    for (unsigned b = 0; b < NBUCKETS; b++) {
        seen += h->n[b];
        if (seen > want)
            return bucket_mid(b) / 1000.0;
    }
    return bucket_mid(NBUCKETS - 1) / 1000.0;
}

void tb_fill_value(uint64_t id, uint64_t version, unsigned char *buf, size_t vlen, double ratio)
{
    uint64_t x = id * UINT64_C(0x9e3779b97f4a7c15) ^ version;
    size_t rnd = ratio >= 1.0 ? vlen : (size_t)((double)vlen * ratio);
    rnd = rnd ? rnd : 1;
    for (size_t i = 0; i < vlen; i++) {
        if (i >= rnd) {
            buf[i] = buf[i % rnd];
            continue;
        }
        if ((i & 7) == 0)
            x = x * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
        buf[i] = (unsigned char)(x >> (8 * (i & 7)));
    }
}

static kv_err put_id(worker *w, uint64_t id, uint64_t version)
{
    unsigned char key[WL_KEY8_LEN];
    wl_key8(id, key);
    tb_fill_value(id, version, w->val, (size_t)w->o->value_size, w->o->value_ratio);
    return w->eng->put(w->h, key, sizeof(key), w->val, (size_t)w->o->value_size);
}

static void *load_main(void *arg)
{
    worker *w = arg;
    w->eng->thread_begin(w->h);
    for (size_t i = w->lo; i < w->hi && w->rv == KV_OK; i++) {
        w->rv = put_id(w, w->order[i], 0);
        atomic_fetch_add_explicit(&w->done, 1, memory_order_relaxed);
    }
    w->eng->thread_end(w->h);
    atomic_store(&w->finished, true);
    return NULL;
}

/* One op of the trace; counts and times it when measuring. pass is how
 * many times the thread has gone round its trace: an insert of a later pass
 * writes its id shifted past every id a pass can insert (n x threads), so
 * that inserts stay new keys however long the run, as the workloads say
 * (replayed, they would overwrite the first pass's keys: a workload of
 * updates to keys that by then live on the slow volume). */
static kv_err do_op(worker *w, wl_op op, uint64_t pass, bool measuring)
{
    if (op.type == WL_OP_INSERT &&
        w->o->insert_ids_idx == TB_IDS_SHARED) /* YCSB's order: the pre-drawn id */
        op.key = atomic_fetch_add_explicit(&g_run.next_insert, 1, memory_order_relaxed);
    else if (op.type == WL_OP_INSERT)
        op.key += pass * (uint64_t)w->n * (uint64_t)w->o->threads;
    if (op.type == WL_OP_INSERT) {
        w->inserted++;
        w->insert_max = op.key > w->insert_max ? op.key : w->insert_max;
    }
    unsigned char key[WL_KEY8_LEN];
    bool found = false;
    kv_err rv = KV_OK;
    uint64_t t0 = kv_now_ns();
    if (op.type == WL_OP_READ || op.type == WL_OP_RMW) {
        wl_key8(op.key, key);
        rv = w->eng->get(w->h, key, sizeof(key), &found);
        uint64_t t1 = kv_now_ns();
        if (measuring) {
            w->hget.n[bucket_of(t1 - t0)]++;
            w->get_ns += t1 - t0;
            w->gets++;
            w->found += found;
        }
        t0 = t1;
    }
    if (rv == KV_OK && op.type != WL_OP_READ) {
        rv = put_id(w, op.key, ++w->version);
        if (measuring) {
            w->hput.n[bucket_of(kv_now_ns() - t0)]++;
            w->puts++;
        }
    }
    w->ops += measuring;
    return rv;
}

static void *run_main(void *arg)
{
    worker *w = arg;
    int seen = PH_WARMUP;
    w->eng->thread_begin(w->h);
    for (size_t i = w->idx * 7919u; w->rv == KV_OK; i++) {
        int ph = atomic_load_explicit(&g_run.phase, memory_order_acquire);
        if (ph != seen) {
            if (ph == PH_STOP)
                break;
            w->eng->measure_begin(w->h);
            seen = ph;
        }
        int sh = atomic_load_explicit(&g_run.shift, memory_order_relaxed);
        w->rv = do_op(w, w->trace[sh][i % w->n], i / w->n, seen == PH_MEASURE);
        atomic_fetch_add_explicit(&w->done, 1, memory_order_relaxed);
    }
    if (seen == PH_MEASURE)
        w->eng->measure_end(w->h);
    w->eng->thread_end(w->h);
    return NULL;
}

static uint64_t total_done(worker *ws, long n, bool *all_finished)
{
    uint64_t s = 0;
    bool fin = true;
    for (long i = 0; i < n; i++) {
        s += atomic_load_explicit(&ws[i].done, memory_order_relaxed);
        fin = fin && atomic_load(&ws[i].finished);
    }
    if (all_finished)
        *all_finished = fin;
    return s;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Memory + FD reads and all reads in an engine's cumulative stats. */
static void hits_of(const tb_stats *st, uint64_t *hit, uint64_t *tot)
{
    *hit = st->reads_mem + st->reads_fd;
    *tot = *hit + st->reads_sd + st->reads_miss;
}

/* The FD hit rate between two samples, -1 without reads. */
static double hit_between(const tb_hit_sample *a, const tb_hit_sample *b)
{
    uint64_t tot = b->tot - a->tot;
    return tot ? (double)(b->hit - a->hit) / (double)tot : -1.0;
}

/* Engine stats every second of a warm-up or timed phase (the FD hit rate
 * over time: progress lines and the --shift-at recovery). */
typedef struct hitlog {
    const tb_engine *eng;
    void *h;
    tb_hit_sample *s;
    size_t n, cap;
    tb_stats last; /* the latest sample's stats */
    size_t shift;  /* index of the sample taken right before the move, 0 = none */
} hitlog;

static void hitlog_take(hitlog *l, double t)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        tb_hit_sample *x = realloc(l->s, cap * sizeof(*x));
        if (!x)
            return;
        l->s = x;
        l->cap = cap;
    }
    l->eng->stats(l->h, &l->last);
    tb_hit_sample *x = &l->s[l->n++];
    x->t = t;
    x->promoted = l->last.promoted;
    x->retained = l->last.retained;
    hits_of(&l->last, &x->hit, &x->tot);
}

/* Waits until every worker has finished (load, secs <= 0) or `secs` pass
 * (or, for the timed phase, --ops ops are done), printing a progress line
 * every --progress seconds (with the FD hit rate since the last one when log
 * is given: warm-up and timed phase). */
static void watch(const tb_opts *o, worker *ws, const char *what, double secs, hitlog *log)
{
    uint64_t start = kv_now_ns(), last_t = start, last_n = total_done(ws, o->threads, NULL);
    uint64_t start_n = last_n, ops = !strcmp(what, "run") ? (uint64_t)o->run_ops : 0;
    double next = o->progress_s, next_sample = 1.0;
    size_t last_s = 0;
    if (log)
        hitlog_take(log, 0);
    for (;;) {
        bool fin;
        sleep_s(secs > 0 && secs < 0.05 ? secs : 0.05);
        double el = (double)(kv_now_ns() - start) / 1e9;
        uint64_t d = total_done(ws, o->threads, &fin);
        if ((secs > 0 && el >= secs) || (secs <= 0 && fin) || (ops && d - start_n >= ops)) {
            if (log)
                hitlog_take(log, el); /* the phase's last moment */
            return;
        }
        if (o->shift_at > 0 && !strcmp(what, "run") && el >= o->shift_at &&
            !atomic_load(&g_run.shift)) {
            if (log) {
                hitlog_take(log, el); /* the last sample before the move */
                log->shift = log->n - 1;
            }
            atomic_store(&g_run.shift, 1);
            fprintf(stderr, "tier_bench: %s: hot set shifted at %.1f s\n", o->engine_name, el);
        }
        if (log && el >= next_sample) {
            hitlog_take(log, el);
            next_sample += 1.0;
        }
        if (el >= next) {
            uint64_t now = kv_now_ns();
            char hit[128] = "";
            if (log && log->n > last_s + 1) {
                const tb_hit_sample *a = &log->s[last_s], *b = &log->s[log->n - 1];
                double r = hit_between(a, b);
                int k = r >= 0 ? snprintf(hit, sizeof(hit), ", fd_hit %.3f", r) : 0;
                if (log->last.have_hotrap)
                    snprintf(hit + k, sizeof(hit) - (size_t)k,
                             ", promoted %" PRIu64 ", retained %" PRIu64, b->promoted - a->promoted,
                             b->retained - a->retained);
                last_s = log->n - 1;
            }
            fprintf(stderr, "tier_bench: %s %s %.0f s: %" PRIu64 " ops, %.0f ops/s%s\n",
                    o->engine_name, what, el, d,
                    (double)(d - last_n) * 1e9 / (double)(now - last_t), hit);
            last_t = now;
            last_n = d;
            next += o->progress_s;
        }
    }
}

/* --shift-at: the FD hit rate from the start of the timed phase to the
 * move (steady), over the last window of the run (a third of the time
 * after the move, 2..10 s), and the seconds after the move until a 2 s
 * window reached 90% of the steady rate (-1: never). */
static void shift_result(const tb_opts *o, const hitlog *l, tb_result *res)
{
    size_t at = l->shift;
    if (o->shift_at <= 0 || at == 0 || at + 1 >= l->n)
        return;
    const tb_hit_sample *last = &l->s[l->n - 1];
    double win = (last->t - l->s[at].t) / 3;
    win = win < 2 ? 2 : win > 10 ? 10 : win;
    size_t w = l->n - 1;
    while (w > at && last->t - l->s[w - 1].t <= win + 1e-9)
        w--;
    res->have_shift = true;
    res->shift_steady = hit_between(&l->s[0], &l->s[at]);
    res->shift_end = hit_between(&l->s[w > at ? w - 1 : at], last);
    res->shift_recovery_s = -1;
    for (size_t i = at + 1, j = at; i < l->n; i++) {
        while (l->s[i].t - l->s[j + 1].t >= 2.0 - 1e-9)
            j++;
        if (l->s[i].t - l->s[j].t >= 2.0 - 1e-9 &&
            hit_between(&l->s[j], &l->s[i]) >= 0.9 * res->shift_steady) {
            res->shift_recovery_s = l->s[i].t - l->s[at].t;
            break;
        }
    }
}

static kv_err workers_init(const tb_opts *o, const tb_engine *eng, void *h, worker **out)
{
    worker *ws = calloc((size_t)o->threads, sizeof(*ws));
    if (!ws)
        return KV_RESOURCE_EXHAUSTED;
    for (long t = 0; t < o->threads; t++) {
        worker *w = &ws[t];
        w->o = o;
        w->eng = eng;
        w->h = h;
        w->idx = (unsigned)t;
        w->val = malloc((size_t)o->value_size);
        if (!w->val) {
            *out = ws;
            return KV_RESOURCE_EXHAUSTED;
        }
    }
    *out = ws;
    return KV_OK;
}

static void workers_free(const tb_opts *o, worker *ws)
{
    for (long t = 0; ws && t < o->threads; t++) {
        free(ws[t].val);
        free(ws[t].trace[0]);
        free(ws[t].trace[1]);
    }
    free(ws);
}

/* Starts fn on every worker, watches them, joins them; the first error. */
static kv_err run_threads(const tb_opts *o, worker *ws, void *(*fn)(void *), const char *what,
                          double secs, hitlog *log)
{
    long started = 0;
    kv_err rv = KV_OK;
    for (; started < o->threads; started++)
        if (pthread_create(&ws[started].tid, NULL, fn, &ws[started]) != 0) {
            rv = KV_RESOURCE_EXHAUSTED;
            atomic_store(&g_run.phase, PH_STOP);
            break;
        }
    if (rv == KV_OK)
        watch(o, ws, what, secs, log);
    return rv;
}

static kv_err join_threads(const tb_opts *o, worker *ws)
{
    kv_err rv = KV_OK;
    for (long t = 0; t < o->threads; t++) {
        pthread_join(ws[t].tid, NULL);
        if (rv == KV_OK && ws[t].rv != KV_OK)
            rv = ws[t].rv;
    }
    return rv;
}

static kv_err load(const tb_opts *o, worker *ws, tb_result *res)
{
    uint64_t *order;
    kv_err rv = wl_load_order((uint64_t)o->records, (uint64_t)o->seed, &order);
    if (rv != KV_OK)
        return rv;
    size_t n = (size_t)o->records, per = n / (size_t)o->threads;
    for (long t = 0; t < o->threads; t++) {
        ws[t].order = order;
        ws[t].lo = (size_t)t * per;
        ws[t].hi = t == o->threads - 1 ? n : (size_t)(t + 1) * per;
    }
    uint64_t t0 = kv_now_ns();
    rv = run_threads(o, ws, load_main, "load", 0, NULL);
    kv_err jrv = join_threads(o, ws);
    res->load_s = (double)(kv_now_ns() - t0) / 1e9;
    res->load_ops_per_s = (double)n / res->load_s;
    free(order);
    for (long t = 0; t < o->threads; t++)
        atomic_store(&ws[t].done, 0);
    return rv != KV_OK ? rv : jrv;
}

static kv_err make_traces(const tb_opts *o, worker *ws)
{
    char err[256] = "";
    for (int phase = 0; phase < 2; phase++) {
        wl_model m;
        kv_err rv = tb_model(o, phase ? (uint64_t)o->records / 2 : 0, &m, err, sizeof(err));
        if (rv != KV_OK) {
            fprintf(stderr, "tier_bench: %s\n", err);
            return rv;
        }
        for (long t = 0; t < o->threads; t++) {
            ws[t].n = (size_t)o->trace_ops;
            rv = wl_trace_make(&m, (unsigned)t, (unsigned)o->threads, ws[t].n, &ws[t].trace[phase]);
            if (rv != KV_OK)
                return rv;
        }
        if (o->shift_at <= 0) /* no shift: trace[1] is never used */
            break;
    }
    return KV_OK;
}

static void merge(const tb_opts *o, worker *ws, tb_result *res, double run_s)
{
    hist hg, hp;
    uint64_t get_ns = 0;
    memset(&hg, 0, sizeof(hg));
    memset(&hp, 0, sizeof(hp));
    for (long t = 0; t < o->threads; t++) {
        get_ns += ws[t].get_ns;
        res->ops += ws[t].ops;
        res->gets += ws[t].gets;
        res->gets_found += ws[t].found;
        res->puts += ws[t].puts;
        res->inserted += ws[t].inserted;
        res->insert_id_max =
            ws[t].insert_max > res->insert_id_max ? ws[t].insert_max : res->insert_id_max;
        for (unsigned b = 0; b < NBUCKETS; b++) {
            hg.n[b] += ws[t].hget.n[b];
            hp.n[b] += ws[t].hput.n[b];
        }
    }
    res->run_s = run_s;
    res->ops_per_s = (double)res->ops / run_s;
    res->avg_get_us = res->gets ? (double)get_ns / (double)res->gets / 1000.0 : 0.0;
    res->p50_get_us = hist_quantile_us(&hg, 0.50);
    res->p99_get_us = hist_quantile_us(&hg, 0.99);
    res->p999_get_us = hist_quantile_us(&hg, 0.999);
    res->p50_put_us = hist_quantile_us(&hp, 0.50);
    res->p99_put_us = hist_quantile_us(&hp, 0.99);
}

/* After the load, and after the timed phase: waits (no manual compaction)
 * until the engine has no flush or compaction pending, at most --settle
 * seconds, so that the timed phase sees the level layout the engine's sizing
 * asks for, and the run's write amplification includes the compaction debt
 * its inserts left. Returns whether it settled; *secs the wait. */
static bool settle(const tb_opts *o, const tb_engine *eng, void *h, const char *what, double *secs)
{
    uint64_t t0 = kv_now_ns();
    double next = o->progress_s, el = 0;
    bool done;
    while (!(done = eng->settled(h)) && el < o->settle_s) {
        sleep_s(0.25);
        el = (double)(kv_now_ns() - t0) / 1e9;
        if (el >= next) {
            fprintf(stderr, "tier_bench: %s settle after the %s %.0f s: compactions pending\n",
                    o->engine_name, what, el);
            next += o->progress_s;
        }
    }
    *secs = (double)(kv_now_ns() - t0) / 1e9;
    return done;
}

/* User + system CPU seconds of the process so far (every thread). */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

/* Warm-up, then the timed phase with engine stats around it. */
static kv_err measure(const tb_opts *o, const tb_engine *eng, void *h, worker *ws, tb_result *res)
{
    kv_err rv = make_traces(o, ws);
    if (rv != KV_OK)
        return rv;
    atomic_store(&g_run.phase, PH_WARMUP);
    atomic_store(&g_run.shift, 0);
    atomic_store(&g_run.next_insert, (uint64_t)o->records);
    tb_stats start;
    eng->stats(h, &start);
    hitlog wl = {.eng = eng, .h = h}, rl = {.eng = eng, .h = h};
    rv = run_threads(o, ws, run_main, "warmup", o->warmup > 0 ? o->warmup : 1e-3, &wl);
    free(wl.s);
    if (rv != KV_OK)
        return rv;
    eng->stats(h, &res->before);
    double cpu0 = cpu_s();
    uint64_t t0 = kv_now_ns();
    atomic_store(&g_run.phase, PH_MEASURE);
    watch(o, ws, "run", o->seconds, &rl);
    atomic_store(&g_run.phase, PH_STOP);
    double run_s = (double)(kv_now_ns() - t0) / 1e9;
    rv = join_threads(o, ws);
    double cpu = cpu_s() - cpu0;
    eng->stats(h, &res->after);
    merge(o, ws, res, run_s);
    tb_stats end = res->after;
    /* the debt the run's writes left (a read-only run leaves none to wait for) */
    if (rv == KV_OK && o->settle_s > 0 && end.user_bytes > start.user_bytes) {
        res->run_settled = settle(o, eng, h, "run", &res->run_settle_s);
        eng->stats(h, &end);
    }
    uint64_t user = end.user_bytes - start.user_bytes;
    res->run_wa = user ? (double)(end.written_bytes - start.written_bytes) / (double)user : -1.0;
    res->cpu_us_per_op = res->ops ? cpu * 1e6 / (double)res->ops : 0.0;
    shift_result(o, &rl, res);
    free(rl.s);
    return rv;
}

/* The engine's write amplification so far (< 0 unknown). */
static double engine_wa(const tb_engine *eng, void *h)
{
    tb_stats s;
    eng->stats(h, &s);
    return s.write_amp;
}

/* ---- fast-volume usage (tb_result.fd_dir_peak_bytes) ---- */

typedef struct dirwatch {
    pthread_t tid;
    const char *dir;
    _Atomic bool stop;
    uint64_t peak;
} dirwatch;

static _Thread_local uint64_t g_du; /* nftw has no argument: the walking thread's sum */

static int du_one(const char *path, const struct stat *st, int type, struct FTW *f)
{
    (void)path, (void)f;
    if (type == FTW_F)
        g_du += (uint64_t)st->st_blocks * 512u;
    return 0; /* files vanish under compaction: nftw skips them */
}

static void *dirwatch_main(void *arg)
{
    dirwatch *d = arg;
    while (!atomic_load(&d->stop)) {
        g_du = 0;
        if (nftw(d->dir, du_one, 16, FTW_PHYS) == 0 && g_du > d->peak)
            d->peak = g_du;
        usleep(100 * 1000);
    }
    return NULL;
}

kv_err tb_run(const tb_opts *o, const tb_engine *eng, void *h, tb_result *res)
{
    worker *ws = NULL;
    memset(res, 0, sizeof(*res));
    dirwatch dw = {.dir = o->fast_dir};
    bool watching = o->fast_dir && pthread_create(&dw.tid, NULL, dirwatch_main, &dw) == 0;
    kv_err rv = workers_init(o, eng, h, &ws);
    res->load_wa = res->settled_wa = res->run_wa = -1.0;
    if (rv == KV_OK && !o->no_load)
        rv = load(o, ws, res);
    if (rv == KV_OK && !o->no_load)
        res->load_wa = engine_wa(eng, h);
    if (rv == KV_OK && !o->no_load && o->settle_s > 0) {
        res->settled = settle(o, eng, h, "load", &res->settle_s);
        res->settled_wa = engine_wa(eng, h);
    }
    if (rv == KV_OK && !o->load_only)
        rv = measure(o, eng, h, ws, res);
    else if (rv == KV_OK) /* a load-only run reports the load's (and settling's) stats */
        eng->stats(h, &res->after);
    if (rv != KV_OK)
        fprintf(stderr, "tier_bench: %s: %s\n", o->engine_name, kv_strerror(rv));
    if (watching) {
        atomic_store(&dw.stop, true);
        pthread_join(dw.tid, NULL);
        res->fd_dir_peak_bytes = dw.peak;
    }
    workers_free(o, ws);
    return rv;
}
