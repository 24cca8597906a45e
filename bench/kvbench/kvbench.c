/* SPDX-License-Identifier: MIT */
/*
 * kvbench: a YCSB-style load generator for a hotkv cluster through
 * libkvclient (issue 7). --threads workers each open their own kv_client to
 * router i % n of --router and keep --concurrency async requests in flight
 * for --seconds, drawing ops from per-thread traces pre-drawn by the shared
 * generator (bench/workload.h: workloads A-F, uniform, YCSB-scrambled zipf,
 * hotspot-x%); keys are "key%012d" of the drawn id. With --load every key is
 * written first; with --shift-at S the hot set moves at second S (the ids
 * are rotated by keys / 2). A progress line goes to stderr each second; stdout
 * gets one JSON object per op type, then a summary line with throughput,
 * latency quantiles from the merged per-thread histograms, errors, and the
 * --report-top most accessed keys counted exactly (per phase with a shift),
 * the ground truth for the routers' hot-key detector.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/kvbench/kvbench.h"
#include "common/clock.h"
#include "common/opts.h"
#include "proto/rpc.h"

#define PROG "kvbench"

static const char *const workload_choices[] = {"A", "B", "C", "D", "F", NULL};
static const wl_workload workload_map[] = {WL_A, WL_B, WL_C, WL_D, WL_F};

static kvb_shared *g_shared; /* for the SIGINT handler */

/* ---- options --------------------------------------------------------------------- */

static void default_opts(kvb_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->routers = "tcp://127.0.0.1:7000";
    o->workload_idx = 2; /* C */
    o->dist = "zipf";
    o->theta = 0.99;
    o->keys = 100000;
    o->value_size = 100;
    o->threads = 2;
    o->concurrency = 16;
    o->seconds = 10.0;
    o->report_top = 10;
    o->timeout_ms = 5000;
    o->trace_ops = 1L << 18;
    o->seed = 1;
    o->load_seconds = 120.0;
    o->timeline_ms = 1000;
}

static kv_err fail(char *err, size_t errlen, const char *msg)
{
    snprintf(err, errlen, "%s", msg);
    return KV_INVALID_ARGUMENT;
}

/* "uniform", "zipf" (YCSB's scrambled zipfian) or "hotspotX" (X% hot, default 20). */
static kv_err parse_dist(kvb_opts *o, char *err, size_t errlen)
{
    const char *d = o->dist;
    if (strcmp(d, "uniform") == 0) {
        o->wl.dist = WL_UNIFORM;
    } else if (strcmp(d, "zipf") == 0) {
        o->wl.dist = WL_SCRAMBLED_ZIPF;
    } else if (strncmp(d, "hotspot", 7) == 0) {
        char *end;
        double x = d[7] ? strtod(d + 7, &end) : 20.0;
        if ((d[7] && *end) || !(x > 0.0 && x < 100.0))
            return fail(err, errlen, "--dist hotspotX: X must be a percent in (0, 100)");
        o->wl.dist = WL_HOTSPOT;
        o->wl.hot_pct = x;
    } else {
        return fail(err, errlen, "--dist must be uniform, zipf or hotspotX (e.g. hotspot5)");
    }
    return KV_OK;
}

static kv_err parse_routers(kvb_opts *o, char *err, size_t errlen)
{
    const char *p = o->routers;
    o->nrouters = 0;
    while (*p) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n >= sizeof(o->router[0]) || o->nrouters == KVB_MAX_ROUTERS)
            return fail(err, errlen, "--router: a comma list of up to 16 tcp://HOST:PORT");
        memcpy(o->router[o->nrouters], p, n);
        o->router[o->nrouters++][n] = '\0';
        p += n + (p[n] == ',');
    }
    if (o->nrouters == 0)
        return fail(err, errlen, "--router: no address given");
    return KV_OK;
}

static kv_err check_opts(kvb_opts *o, char *err, size_t errlen)
{
    if (!(o->seconds > 0.0 && o->seconds <= 3600.0))
        return fail(err, errlen, "--seconds must be in (0, 3600]");
    if (o->shift_at < 0.0 || (o->shift_at > 0.0 && o->shift_at >= o->seconds))
        return fail(err, errlen, "--shift-at must be 0 (off) or below --seconds");
    if (!(o->load_seconds > 0.0 && o->load_seconds <= 3600.0))
        return fail(err, errlen, "--load-seconds must be in (0, 3600]");
    kv_err rv = parse_routers(o, err, errlen);
    if (rv == KV_OK)
        rv = parse_dist(o, err, errlen);
    o->wl.workload = workload_map[o->workload_idx];
    o->wl.keys = (uint64_t)o->keys;
    o->wl.theta = o->theta;
    o->wl.seed = (uint64_t)o->seed;
    o->wl.scramble = (uint64_t)o->seed * 31 + 7;
    return rv;
}

/* Keeps what outlives the option set (kv_opts_free releases its strings). */
static kv_err keep_strings(kvb_opts *o, char *err, size_t errlen)
{
    kv_err rv = rpc_sec_load(&o->sec, err, errlen);
    const char *tok[3] = {o->sec.data_token, o->sec.admin_token, o->sec.map_key};
    char *buf[3] = {o->auth_buf, o->admin_buf, o->map_buf};
    for (int i = 0; rv == KV_OK && i < 3; i++)
        if (tok[i] && strlen(tok[i]) >= sizeof(o->auth_buf))
            rv = fail(err, errlen, "--auth/--admin-auth/--map-key-file: token or key too long");
        else
            snprintf(buf[i], sizeof(o->auth_buf), "%s", tok[i] ? tok[i] : "");
    const char *tls[3] = {o->sec.tls.cert, o->sec.tls.key, o->sec.tls.ca};
    for (int i = 0; rv == KV_OK && i < 3; i++)
        if (tls[i] && strlen(tls[i]) >= sizeof(o->tls_buf[i]))
            rv = fail(err, errlen, "--tls-*: file name too long");
        else
            snprintf(o->tls_buf[i], sizeof(o->tls_buf[i]), "%s", tls[i] ? tls[i] : "");
    rpc_sec_free(&o->sec);
    if (rv != KV_OK)
        return rv;
    if (strlen(o->dist) >= sizeof(o->dist_buf))
        return fail(err, errlen, "--dist: unknown distribution");
    snprintf(o->dist_buf, sizeof(o->dist_buf), "%s", o->dist);
    if (o->timeline && (!o->timeline[0] || strlen(o->timeline) >= sizeof(o->timeline_buf)))
        return fail(err, errlen, "--timeline: a file name (under 1024 bytes)");
    snprintf(o->timeline_buf, sizeof(o->timeline_buf), "%s", o->timeline ? o->timeline : "");
    return KV_OK;
}

/* Parses argv into o; returns CANCELLED after --help. */
static kv_err parse_opts(kvb_opts *o, int argc, char **argv)
{
    const kv_opt table[] = {
        {"router", KV_OPT_STR, &o->routers, "router addresses A[,B]: thread i uses router i % n"},
        {"workload", KV_OPT_ENUM, &o->workload_idx, "YCSB workload A|B|C|D|F", workload_choices},
        {"dist", KV_OPT_STR, &o->dist, "uniform | zipf (YCSB scrambled) | hotspotX (X% hot)"},
        {"theta", KV_OPT_DOUBLE, &o->theta, "zipfian skew"},
        {"keys", KV_OPT_INT, &o->keys, "records (ids 0..keys-1)", NULL, 1, 1L << 30},
        {"value-size", KV_OPT_INT, &o->value_size, "value bytes of writes", NULL, 0, 1L << 20},
        {"threads", KV_OPT_INT, &o->threads, "worker threads, one kv_client each", NULL, 1, 64},
        {"rpc-threads", KV_OPT_INT, &o->rpc_threads,
         "nng callback threads (0 = one per CPU, at least 2, as kvnode and kvrouter)", NULL, 0,
         256},
        {"concurrency", KV_OPT_INT, &o->concurrency, "async requests in flight per thread", NULL, 1,
         4096},
        {"seconds", KV_OPT_DOUBLE, &o->seconds, "timed run"},
        {"shift-at", KV_OPT_DOUBLE, &o->shift_at, "second at which the hot set moves (0 = off)"},
        {"report-top", KV_OPT_INT, &o->report_top, "report the K most accessed keys", NULL, 0,
         10000},
        {"load", KV_OPT_BOOL, &o->load, "write every key before the run"},
        {"load-seconds", KV_OPT_DOUBLE, &o->load_seconds, "time bound of --load"},
        RPC_SEC_OPTS(&o->sec),
        {"direct", KV_OPT_BOOL, &o->direct,
         "smart client: learn the map from --router and send to each key's replica"},
        {"timeout-ms", KV_OPT_INT, &o->timeout_ms, "per-request deadline", NULL, 10, 600000},
        {"ops", KV_OPT_INT, &o->max_ops, "stop after this many ops in all (0 = time only)", NULL, 0,
         1L << 40},
        {"trace-ops", KV_OPT_INT, &o->trace_ops, "pre-drawn ops per thread and phase", NULL, 1024,
         1L << 26},
        {"seed", KV_OPT_INT, &o->seed, "PRNG seed", NULL, 0, 1L << 62},
        {"timeline", KV_OPT_STR, &o->timeline,
         "write one JSON line per --timeline-ms of the run to this file"},
        {"timeline-ms", KV_OPT_INT, &o->timeline_ms, "--timeline interval", NULL, 10, 600000},
    };
    kv_optset set = {table, sizeof(table) / sizeof(table[0]), NULL, PROG, NULL};
    char err[512] = "";
    kv_err rv = kv_opts_parse(&set, argc, argv, NULL, err, sizeof(err));
    if (rv == KV_OK)
        rv = check_opts(o, err, sizeof(err));
    if (rv == KV_OK)
        rv = keep_strings(o, err, sizeof(err));
    if (rv != KV_OK && rv != KV_CANCELLED)
        fprintf(stderr, PROG ": %s\n", err);
    kv_opts_free(&set);
    /* copied into router[], dist_buf, auth_buf, timeline_buf */
    o->routers = o->dist = o->timeline = NULL;
    o->sec = (rpc_sec){0};
    return rv;
}

/* ---- setup ------------------------------------------------------------------------ */

/* Pre-draws worker t's trace of each phase: phase 1 rotates the ids by keys / 2. */
static kv_err make_traces(const kvb_opts *o, kvb_worker *w, long n)
{
    char err[256] = "";
    for (int p = 0; p < (o->shift_at > 0.0 ? 2 : 1); p++) {
        wl_config c = o->wl;
        c.offset = p ? c.keys / 2 : 0;
        wl_model m;
        kv_err rv = wl_model_init(&m, &c, err, sizeof(err));
        if (rv != KV_OK) {
            fprintf(stderr, PROG ": %s\n", err);
            return rv;
        }
        for (long t = 0; t < n; t++) {
            wl_op *tr;
            rv = wl_trace_make(&m, (unsigned)t, (unsigned)n, (size_t)o->trace_ops, &tr);
            if (rv != KV_OK)
                return rv;
            w[t].trace[p] = tr;
        }
    }
    return KV_OK;
}

static kv_err open_worker(const kvb_opts *o, kvb_shared *sh, kvb_worker *w, long i)
{
    w->sh = sh;
    w->idx = (unsigned)i;
    if (sem_init(&w->sem, 0, 0) != 0)
        return KV_INTERNAL;
    w->slots = calloc((size_t)o->concurrency, sizeof(*w->slots));
    w->deferred = calloc((size_t)o->concurrency, sizeof(*w->deferred));
    if (!w->slots || !w->deferred)
        return KV_RESOURCE_EXHAUSTED;
    for (long j = 0; j < o->concurrency; j++)
        w->slots[j].w = w;
    uint64_t share = (uint64_t)o->max_ops / (uint64_t)o->threads;
    w->budget = o->max_ops ? share + ((uint64_t)i < (uint64_t)o->max_ops % (uint64_t)o->threads)
                           : UINT64_MAX;
    kv_client_opts co = {.timeout_ms = (uint32_t)o->timeout_ms,
                         .auth = o->auth_buf[0] ? o->auth_buf : NULL,
                         .admin_auth = o->admin_buf[0] ? o->admin_buf : NULL,
                         .tls_cert = o->tls_buf[0][0] ? o->tls_buf[0] : NULL,
                         .tls_key = o->tls_buf[1][0] ? o->tls_buf[1] : NULL,
                         .tls_ca = o->tls_buf[2][0] ? o->tls_buf[2] : NULL,
                         .direct = o->direct,
                         .map_key = o->map_buf[0] ? o->map_buf : NULL};
    kv_err rv = kv_client_open(&w->c, o->router[i % o->nrouters], &co);
    if (rv != KV_OK)
        fprintf(stderr, PROG ": %s: %s\n", o->router[i % o->nrouters], kv_last_error());
    return rv;
}

/* Opens every worker's client and draws the traces. On failure the workers
 * opened so far stay in *out for close_workers(). */
static kv_err setup(const kvb_opts *o, kvb_shared *sh, uint8_t *value, kvb_worker **out)
{
    kvb_worker *w = calloc((size_t)o->threads, sizeof(*w));
    if (!(*out = w))
        return KV_RESOURCE_EXHAUSTED;
    for (long i = 0; i < o->value_size; i++)
        value[i] = (uint8_t)('a' + i % 26);
    kv_err rv = KV_OK;
    for (long i = 0; i < o->threads && rv == KV_OK; i++) {
        w[i].value = value;
        rv = open_worker(o, sh, &w[i], i);
    }
    if (rv == KV_OK)
        rv = make_traces(o, w, o->threads);
    if (rv == KV_OK && o->timeline_buf[0])
        rv = kvb_tl_init(sh, w, o->threads);
    uint64_t *order;
    if (rv == KV_OK && o->load && (rv = wl_load_order(o->wl.keys, o->wl.seed, &order)) == KV_OK)
        sh->load_order = order;
    return rv;
}

/* Closes the clients: anything still in flight completes with CANCELLED
 * first, so no callback touches a slot or semaphore afterwards. */
static void close_clients(const kvb_opts *o, kvb_worker *w)
{
    for (long i = 0; w && i < o->threads; i++) {
        kv_client_close(w[i].c);
        w[i].c = NULL;
    }
}

/* Frees the workers (after close_clients()). */
static void free_workers(const kvb_opts *o, kvb_worker *w)
{
    for (long i = 0; w && i < o->threads; i++) {
        if (w[i].sh)
            sem_destroy(&w[i].sem);
        free(w[i].slots);
        free(w[i].deferred);
        free((void *)w[i].trace[0]);
        free((void *)w[i].trace[1]);
        kvb_counts_free(&w[i].counts[0]);
        kvb_counts_free(&w[i].counts[1]);
        kvb_tl_free(&w[i]);
    }
    free(w);
}

/* ---- progress ------------------------------------------------------------------------ */

static void on_sigint(int sig)
{
    (void)sig;
    if (g_shared)
        atomic_store(&g_shared->stop, true); /* lock-free: async-signal-safe */
}

static void totals(const kvb_worker *w, long n, uint64_t t[3])
{
    t[0] = t[1] = t[2] = 0;
    for (long i = 0; i < n; i++) {
        t[0] += atomic_load_explicit(&w[i].ok_ops, memory_order_relaxed);
        t[1] += atomic_load_explicit(&w[i].err_ops, memory_order_relaxed);
        t[2] += atomic_load_explicit(&w[i].load_done, memory_order_relaxed);
    }
}

/* Prints a progress line each second until every worker has finished the
 * load (load) or the run. */
static void watch(const kvb_opts *o, kvb_shared *sh, const kvb_worker *w, bool load)
{
    uint64_t start = kv_now_ns(), last_t = start, next = start + 1000000000u, last[3] = {0};
    _Atomic int *count = load ? &sh->loaded : &sh->finished;
    while (atomic_load(count) < o->threads) {
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
        uint64_t now = kv_now_ns(), cur[3];
        if (now < next)
            continue;
        totals(w, o->threads, cur);
        double dt = (double)(now - last_t) / 1e9;
        if (load)
            fprintf(stderr, PROG ": load %" PRIu64 "/%ld keys, %.0f keys/s\n", cur[2], o->keys,
                    (double)(cur[2] - last[2]) / dt);
        else
            fprintf(stderr, PROG ": %3.0f s %10.0f ops/s  errors %" PRIu64 "\n",
                    (double)(now - sh->t0_ns) / 1e9, (double)(cur[0] - last[0]) / dt, cur[1]);
        memcpy(last, cur, sizeof(last));
        last_t = now;
        next += 1000000000u;
    }
}

/* ---- report --------------------------------------------------------------------------- */

/* What the workers measured, merged. */
typedef struct kvb_total {
    kvb_hist all, type[KVB_NOPTYPES];
    kvb_counts counts[3]; /* before the shift (or all), after it, both */
    uint64_t codes[KVB_NCODES], errors, not_found, load_errors, loaded, abandoned;
    double seconds, load_seconds;
} kvb_total;

static void merge(const kvb_opts *o, const kvb_shared *sh, kvb_worker *w, kvb_total *t)
{
    uint64_t end = sh->t0_ns + 1, load_end = sh->t0_ns;
    for (long i = 0; i < o->threads; i++) {
        for (int k = 0; k < KVB_NOPTYPES; k++) {
            kvb_hist_merge(&t->type[k], &w[i].hist[k]);
            kvb_hist_merge(&t->all, &w[i].hist[k]);
        }
        for (int p = 0; p < 2; p++) {
            kvb_counts_merge(&t->counts[p], &w[i].counts[p]);
            kvb_counts_merge(&t->counts[2], &w[i].counts[p]);
        }
        for (int c = 1; c < KVB_NCODES; c++) {
            t->codes[c] += w[i].codes[c];
            t->errors += w[i].codes[c];
        }
        t->not_found += w[i].not_found;
        t->load_errors += w[i].load_errors;
        t->loaded += atomic_load(&w[i].load_done) - w[i].load_errors;
        t->abandoned += w[i].abandoned;
        if (w[i].finish_ns > end)
            end = w[i].finish_ns;
        if (w[i].load_finish_ns > load_end)
            load_end = w[i].load_finish_ns;
        if (w[i].first_error[0])
            fprintf(stderr, PROG ": thread %ld: first error: %s\n", i, w[i].first_error);
    }
    t->seconds = (double)(end - sh->t0_ns) / 1e9;
    t->load_seconds = o->load ? (double)(load_end - sh->load_start_ns) / 1e9 : 0.0;
}

static void print_latency(const kvb_hist *h)
{
    printf("\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,\"mean_us\":%.1f",
           kvb_hist_quantile_us(h, 0.50), kvb_hist_quantile_us(h, 0.99),
           kvb_hist_quantile_us(h, 0.999), (double)h->max / 1000.0,
           h->n ? (double)h->sum / (double)h->n / 1000.0 : 0.0);
}

/* One JSON line per op type that ran. */
static void print_types(const kvb_total *t)
{
    for (int k = 0; k < KVB_NOPTYPES; k++) {
        if (t->type[k].n == 0)
            continue;
        printf("{\"result\":\"%s\",\"ops\":%" PRIu64 ",\"ops_per_s\":%.1f,",
               wl_op_name((wl_optype)k), t->type[k].n, (double)t->type[k].n / t->seconds);
        print_latency(&t->type[k]);
        printf("}\n");
    }
}

static void print_summary(const kvb_opts *o, const kvb_total *t)
{
    printf("{\"summary\":true,\"bench\":\"kvbench\",\"workload\":\"%s\",\"dist\":\"%s\","
           "\"theta\":%g,\"keys\":%ld,\"value_size\":%ld,\"threads\":%ld,\"concurrency\":%ld,"
           "\"routers\":%d,\"seconds\":%.3f,\"ops\":%" PRIu64 ",\"ops_per_s\":%.1f,",
           wl_workload_name(o->wl.workload), o->dist_buf, o->theta, o->keys, o->value_size,
           o->threads, o->concurrency, o->nrouters, t->seconds, t->all.n,
           (double)t->all.n / t->seconds);
    print_latency(&t->all);
    printf(",\"errors\":%" PRIu64 ",\"error_codes\":{", t->errors);
    for (int c = 1, first = 1; c < KVB_NCODES; c++)
        if (t->codes[c]) {
            printf("%s\"%s\":%" PRIu64, first ? "" : ",", kv_err_name((kv_err)c), t->codes[c]);
            first = 0;
        }
    printf("},\"not_found\":%" PRIu64 ",\"abandoned\":%" PRIu64 ",", t->not_found, t->abandoned);
    if (o->load)
        printf("\"loaded\":%" PRIu64 ",\"load_errors\":%" PRIu64 ",\"load_s\":%.3f,", t->loaded,
               t->load_errors, t->load_seconds);
    printf("\"top_exact\":%s,", t->counts[2].oom ? "false" : "true");
    kvb_print_top(stdout, "top", &t->counts[2], o->report_top);
    if (o->shift_at > 0.0) {
        printf(",\"shift_at\":%g,", o->shift_at);
        kvb_print_top(stdout, "top_before", &t->counts[0], o->report_top);
        putchar(',');
        kvb_print_top(stdout, "top_after", &t->counts[1], o->report_top);
    }
    printf("}\n");
    fflush(stdout);
}

/* ---- main ------------------------------------------------------------------------------ */

/* Starts the workers, waits for the load (if any), starts the timed run and
 * waits for it; returns how many threads were started. */
static long run(const kvb_opts *o, kvb_shared *sh, kvb_worker *w)
{
    long started = 0;
    sh->load_start_ns = kv_now_ns();
    sh->load_end_ns = sh->load_start_ns + (uint64_t)(o->load_seconds * 1e9);
    for (; started < o->threads; started++)
        if (pthread_create(&w[started].tid, NULL, kvb_worker_main, &w[started]) != 0)
            break;
    if (started < o->threads) {
        fprintf(stderr, PROG ": cannot start thread %ld\n", started);
        atomic_store(&sh->stop, true);
        return started; /* the started ones block on the barrier: exit without joining */
    }
    if (o->load)
        watch(o, sh, w, true);
    while (atomic_load(&sh->loaded) < o->threads)
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    sh->t0_ns = kv_now_ns();
    sh->t0_wall_ms = kv_wall_ms();
    sh->shift_ns = sh->t0_ns + (uint64_t)(o->shift_at * 1e9);
    sh->end_ns = sh->t0_ns + (uint64_t)(o->seconds * 1e9);
    pthread_barrier_wait(&sh->start);
    watch(o, sh, w, false);
    for (long i = 0; i < o->threads; i++)
        pthread_join(w[i].tid, NULL);
    return started;
}

static int report(const kvb_opts *o, const kvb_shared *sh, kvb_worker *w, FILE *tl)
{
    if (tl && kvb_tl_write(sh, w, o->threads, tl) != KV_OK)
        fprintf(stderr, PROG ": --timeline %s: write failed\n", o->timeline_buf);
    kvb_total *t = calloc(1, sizeof(*t));
    if (!t)
        return 1;
    merge(o, sh, w, t);
    if (o->load && (t->loaded < (uint64_t)o->keys || t->load_errors))
        fprintf(stderr, PROG ": load incomplete: %" PRIu64 " of %ld keys, %" PRIu64 " errors\n",
                t->loaded, o->keys, t->load_errors);
    print_types(t);
    print_summary(o, t);
    for (int p = 0; p < 3; p++)
        kvb_counts_free(&t->counts[p]);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    kvb_opts o;
    default_opts(&o);
    kv_err rv = parse_opts(&o, argc, argv);
    if (rv == KV_CANCELLED)
        return 0;
    if (rv != KV_OK)
        return 2;
    if (rpc_runtime_init((unsigned)o.rpc_threads) != KV_OK) {
        fprintf(stderr, PROG ": cannot initialise nng\n");
        return 1;
    }
    kvb_shared sh = {.o = &o};
    FILE *tl = o.timeline_buf[0] ? fopen(o.timeline_buf, "w") : NULL;
    if (o.timeline_buf[0] && !tl) {
        perror(PROG ": --timeline");
        return 1;
    }
    uint8_t *value = malloc((size_t)o.value_size + 1);
    kvb_worker *w = NULL;
    if (!value)
        rv = KV_RESOURCE_EXHAUSTED;
    else
        rv = setup(&o, &sh, value, &w);
    if (rv != KV_OK) {
        fprintf(stderr, PROG ": setup: %s\n", kv_strerror(rv));
        if (tl)
            fclose(tl);
        close_clients(&o, w);
        free_workers(&o, w);
        free((void *)sh.load_order);
        free(value);
        return 1;
    }
    g_shared = &sh;
    struct sigaction sa = {.sa_handler = on_sigint, .sa_flags = SA_RESETHAND}; /* 2nd ^C kills */
    sigaction(SIGINT, &sa, NULL);
    pthread_barrier_init(&sh.start, NULL, (unsigned)o.threads + 1);
    if (run(&o, &sh, w) != o.threads)
        return 1; /* started threads wait on the barrier; exit ends them */
    close_clients(&o, w);
    int rc = report(&o, &sh, w, tl);
    if (tl && fclose(tl) != 0)
        perror(PROG ": --timeline");
    pthread_barrier_destroy(&sh.start);
    free_workers(&o, w);
    free((void *)sh.load_order);
    free(value);
    return rc;
}
