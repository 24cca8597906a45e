/* SPDX-License-Identifier: MIT */
/*
 * nhc_bench: the NHC scheduler (issue 6, Orthus FAST'21) against classic
 * caching on a fast (FD) and a slow (SD) volume, in one process over
 * hotkv's storage engine (node/engine.h). It loads --records records,
 * compacts them all down to SD, then reads the hot set of a hotspot
 * distribution (the hottest --hot-pct percent of the keys) until HotRAP has
 * promoted it, so that every hot record has identical copies on FD and SD
 * (twins). It then runs YCSB C (read only) with the hotspot distribution for
 * each mode in --modes, --repeat times, and prints one JSON line a run:
 *
 *   on       the NHC controller decides (nhc_unforce)
 *   off      classic caching: load_admit 1, data_admit on (nhc_force)
 *   fd-only  every twin read on FD, no promotion (load_admit 1, data_admit off)
 *   sd-only  every twin read on SD (load_admit 0, data_admit off), reference
 *
 * --shift-at S adds a run with NHC on (timed for --shift-seconds, default
 * --seconds) in which, S seconds into the timed
 * phase, the hot set moves to keys that have no FD copy (a workload
 * change); its JSON line carries a 100 ms timeline of state, load_admit,
 * miss ratio and throughput, and the seconds until the node was back in
 * classic state and until it tuned again.
 *
 * Modes share one store (loaded once) so they see the same layout; the
 * memory tier is small (--mem-mb) so that reads reach the volumes.
 * Internal headers are used on purpose: the benchmark compacts, promotes
 * and reads the LSM directly while populating.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/workload.h"
#include "common/clock.h"
#include "common/opts.h"
#include "node/engine.h"
#include "node/engine_int.h"
#include "node/lsm/lsm_int.h"
#include "node/nhc/nhc.h"

#define LAT_BUCKETS 200000 /* 1 us buckets up to 200 ms, then a last bucket */
#define KEY_LEN 16

typedef struct bopts {
    const char *fast_dir, *slow_dir, *modes;
    long records, value_bytes, fast_mb, mem_mb, threads, repeat, seed;
    double seconds, warmup, hot_pct, shift_at;
    double shift_seconds; /* length of the shift run (0 = --seconds) */
    long promote_rounds;
    long nhc_probe_ms, nhc_poll_ms; /* 0 = nhc_opts_default */
    bool trace;                     /* promotion trace in every run, not only the shift run */
    double nhc_step;                /* 0 = nhc_opts_default */
} bopts;

typedef struct run {
    engine *e;
    const bopts *o;
    wl_model model;
    _Atomic bool stop;
    _Atomic uint64_t shift; /* added to every key id (the workload change) */
    _Atomic uint64_t ops;
    _Atomic bool measuring;
    uint64_t lat[LAT_BUCKETS]; /* merged after the run, under mu */
    uint64_t measured;
    pthread_mutex_t mu;
    pthread_barrier_t start;
    kv_err err;
    uint64_t twins0, hot; /* twins after populating, hot records */
} run;

static void key_of(uint64_t id, char *k)
{
    snprintf(k, KEY_LEN + 1, "user%012" PRIu64, (uint64_t)(id % 1000000000000ull));
}

/* ---- load and populate ---- */

typedef struct ljob {
    run *r;
    unsigned t;
    uint64_t from, to, step; /* ids from + t, step apart, below to */
    int what;                /* 0 = write, 1 = lsm_get (promotion reads) */
} ljob;

static void *load_main(void *arg)
{
    ljob *j = arg;
    engine_thread_register();
    char k[KEY_LEN + 1], err[256];
    char *val = malloc((size_t)j->r->o->value_bytes);
    memset(val, 'v', (size_t)j->r->o->value_bytes);
    for (uint64_t id = j->from + j->t; id < j->to && j->r->err == KV_OK; id += j->step) {
        key_of(id, k);
        if (j->what == 0) {
            engine_write w = {
                .key = k, .klen = KEY_LEN, .val = val, .vlen = (size_t)j->r->o->value_bytes};
            engine_result res;
            kv_err rv;
            while ((rv = engine_write_one(j->r->e, &w, &res, err, sizeof(err))) ==
                   KV_RESOURCE_EXHAUSTED)
                usleep(1000); /* flush behind: back-pressure */
            if (rv != KV_OK)
                j->r->err = rv;
        } else {
            lsm_rec rec;
            if (lsm_get(j->r->e->db, k, KEY_LEN, &rec, NULL) == KV_OK)
                lsm_rec_free(&rec);
        }
    }
    free(val);
    engine_thread_unregister();
    return NULL;
}

static kv_err parallel(run *r, uint64_t from, uint64_t to, int what)
{
    unsigned n = (unsigned)r->o->threads;
    pthread_t th[64];
    ljob jobs[64];
    n = n > 64 ? 64 : n;
    for (unsigned t = 0; t < n; t++) {
        jobs[t] = (ljob){r, t, from, to, n, what};
        pthread_create(&th[t], NULL, load_main, &jobs[t]);
    }
    for (unsigned t = 0; t < n; t++)
        pthread_join(th[t], NULL);
    return r->err;
}

static uint64_t hot_count(const bopts *o)
{
    return (uint64_t)((double)o->records * o->hot_pct / 100.0);
}

static kv_err populate(run *r)
{
    const bopts *o = r->o;
    uint64_t t0 = kv_now_ns();
    nhc *sched = engine_nhc(r->e);
    nhc_force(sched, 1.0, true); /* classic while populating */
    kv_err rv = parallel(r, 0, (uint64_t)o->records, 0);
    if (rv == KV_OK)
        rv = engine_flush(r->e);
    /* every record down to SD: each FD level into the next (nothing is hot
     * yet, so HotRAP retains nothing) */
    lsm_db *db = engine_lsm(r->e);
    for (int l = 0; rv == KV_OK && l <= db->last_fd; l++)
        rv = lsm_compact_level(db, l);
    if (rv != KV_OK)
        return rv;
    double load_s = (double)(kv_now_ns() - t0) / 1e9;
    /* the hot set: hotspot ids [0, hot) of the key space */
    uint64_t t1 = kv_now_ns();
    for (long round = 0; round < o->promote_rounds; round++) {
        if ((rv = parallel(r, 0, hot_count(o), 1)) != KV_OK)
            return rv;
        lsm_promo_sync(r->e->db);
    }
    rv = lsm_compact_wait_idle(r->e->db);
    lsm_stats s;
    lsm_stats_get(r->e->db, &s);
    r->twins0 = s.twin_entries;
    fprintf(stderr,
            "nhc_bench: after populating: promotion drops %" PRIu64 ", RALT %" PRIu64
            " entries (%" PRIu64 " stable), LSM reads fd %" PRIu64 " sd %" PRIu64 "\n",
            s.promo_dropped, s.ralt_entries, s.ralt_stable, s.reads_fd, s.reads_sd);
    r->hot = hot_count(o);
    if (rv == KV_OK && s.twin_entries < hot_count(o) / 2) {
        fprintf(stderr,
                "nhc_bench: fewer than half of the hot records have twins (%" PRIu64
                "): records must exceed --fast-mb so that they load onto SD\n",
                s.twin_entries);
        rv = KV_FAILED_PRECONDITION;
    }
    fprintf(stderr,
            "nhc_bench: loaded %ld records in %.1f s, promoted in %.1f s: %" PRIu64
            " promoted, %" PRIu64 " twins of %" PRIu64 " hot records\n",
            o->records, load_s, (double)(kv_now_ns() - t1) / 1e9, s.promoted_recs, s.twin_entries,
            hot_count(o));
    return rv;
}

/* ---- the timed runs ---- */

typedef struct wjob {
    run *r;
    unsigned t;
} wjob;

static void *work_main(void *arg)
{
    wjob *j = arg;
    run *r = j->r;
    engine_thread_register();
    wl_gen g;
    wl_gen_init(&g, &r->model, j->t, (unsigned)r->o->threads);
    uint64_t *lat = calloc(LAT_BUCKETS, sizeof(*lat)), n = 0;
    char k[KEY_LEN + 1];
    pthread_barrier_wait(&r->start);
    while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
        wl_op op = wl_gen_next(&g);
        uint64_t id = (op.key + atomic_load_explicit(&r->shift, memory_order_relaxed)) %
                      (uint64_t)r->o->records;
        key_of(id, k);
        uint64_t t0 = kv_now_ns();
        engine_result res;
        kv_err rv = engine_get(r->e, k, KEY_LEN, &res);
        uint64_t us = (kv_now_ns() - t0) / 1000;
        if (rv == KV_OK)
            free(res.val);
        else
            r->err = rv;
        atomic_fetch_add_explicit(&r->ops, 1, memory_order_relaxed);
        if (atomic_load_explicit(&r->measuring, memory_order_relaxed)) {
            lat[us < LAT_BUCKETS ? us : LAT_BUCKETS - 1]++;
            n++;
        }
    }
    pthread_mutex_lock(&r->mu);
    for (int b = 0; b < LAT_BUCKETS; b++)
        r->lat[b] += lat[b];
    r->measured += n;
    pthread_mutex_unlock(&r->mu);
    free(lat);
    engine_thread_unregister();
    return NULL;
}

static double pct(const run *r, double p)
{
    uint64_t rank = (uint64_t)ceil(p * (double)r->measured), seen = 0;
    for (int b = 0; b < LAT_BUCKETS; b++) {
        seen += r->lat[b];
        if (seen >= rank && rank)
            return b;
    }
    return LAT_BUCKETS;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void apply_mode(nhc *sched, const char *mode)
{
    if (strcmp(mode, "on") == 0)
        nhc_unforce(sched);
    else if (strcmp(mode, "off") == 0)
        nhc_force(sched, 1.0, true);
    else if (strcmp(mode, "fd-only") == 0)
        nhc_force(sched, 1.0, false);
    else
        nhc_force(sched, 0.0, false);
}

typedef struct tl_point {
    double t;
    int state;
    double la, miss, ops;
} tl_point;

/*
 * One line of the workload-change run's promotion trace (stderr, every
 * 0.5 s): the NHC state, and what promotion into FD is doing: records
 * installed, checked and dropped, bytes waiting in the mutable and sealed
 * buffers, RALT's stably hot keys and bytes against its limit, twins.
 */
static void trace_promotion(run *r, double t, const nhc_stats *s)
{
    lsm_stats ls;
    lsm_stats_get(r->e->db, &ls);
    fprintf(stderr,
            "nhc_bench: t %.1f state %d da %d la %.2f miss %.3f | promoted %" PRIu64
            " dropped %" PRIu64 " buf %" PRIu64 " backlog %" PRIu64 " | ralt %" PRIu64
            " stable %" PRIu64 " hot %" PRIu64 "/%" PRIu64 " | twins %" PRIu64 " l0 %d\n",
            t, (int)s->state, (int)s->data_admit, s->load_admit, s->miss_ratio, ls.promoted_recs,
            ls.promo_dropped, ls.promo_buf_bytes, ls.promo_backlog, ls.ralt_entries, ls.ralt_stable,
            ls.ralt_hot_bytes, ls.hot_set_limit, ls.twin_entries, (int)ls.levels[0].files);
}

/* One run of mode; shift_at > 0 moves the hot set at that second. */
static kv_err one_run(run *r, const char *mode, int rep, double shift_at)
{
    const bopts *o = r->o;
    nhc *sched = engine_nhc(r->e);
    apply_mode(sched, mode);
    atomic_store(&r->stop, false);
    atomic_store(&r->shift, 0);
    atomic_store(&r->measuring, false);
    atomic_store(&r->ops, 0);
    memset(r->lat, 0, sizeof(r->lat));
    r->measured = 0;
    unsigned n = (unsigned)o->threads;
    pthread_t th[256];
    wjob jobs[256];
    pthread_barrier_init(&r->start, NULL, n + 1);
    for (unsigned t = 0; t < n; t++) {
        jobs[t] = (wjob){r, t};
        pthread_create(&th[t], NULL, work_main, &jobs[t]);
    }
    pthread_barrier_wait(&r->start);
    sleep_s(o->warmup);
    engine_stats es0, es1;
    engine_get_stats(r->e, &es0);
    lsm_stats ls0;
    lsm_stats_get(r->e->db, &ls0);
    nhc_stats ns0, ns1;
    nhc_get_stats(sched, &ns0);
    uint64_t ops0 = atomic_load(&r->ops), t0 = kv_now_ns();
    atomic_store(&r->measuring, true);
    double secs_run = shift_at > 0 && o->shift_seconds > 0 ? o->shift_seconds : o->seconds;
    size_t npts = (size_t)(secs_run * 10) + 2, k = 0, tuning = 0;
    tl_point *tl = calloc(npts, sizeof(*tl));
    double la_sum = 0, back_classic = -1, retune = -1;
    int state_at_shift = 0;
    uint64_t last_ops = ops0;
    for (size_t i = 0; i + 1 < npts; i++) {
        sleep_s(0.1);
        double t = (double)(kv_now_ns() - t0) / 1e9;
        if (shift_at > 0 && t >= shift_at && atomic_load(&r->shift) == 0)
            atomic_store(&r->shift, (uint64_t)o->records / 2); /* cold half: no twins */
        nhc_stats s;
        nhc_get_stats(sched, &s);
        uint64_t ops = atomic_load(&r->ops);
        tl[k++] = (tl_point){t, (int)s.state, s.load_admit, s.miss_ratio,
                             (double)(ops - last_ops) * 10.0};
        last_ops = ops;
        la_sum += s.load_admit;
        tuning += s.state == NHC_STATE_TUNING;
        if ((shift_at > 0 || o->trace) && i % 5 == 4)
            trace_promotion(r, t, &s);
        if (shift_at > 0 && t >= shift_at) {
            if (!state_at_shift)
                state_at_shift = (int)s.state;
            if (back_classic < 0 && s.state == NHC_STATE_CLASSIC)
                back_classic = t - shift_at;
            else if (back_classic >= 0 && retune < 0 && s.state == NHC_STATE_TUNING)
                retune = t - shift_at;
        }
        if (t >= secs_run)
            break;
    }
    atomic_store(&r->measuring, false);
    double secs = (double)(kv_now_ns() - t0) / 1e9;
    uint64_t ops = atomic_load(&r->ops) - ops0;
    engine_get_stats(r->e, &es1);
    nhc_get_stats(sched, &ns1);
    atomic_store(&r->stop, true);
    for (unsigned t = 0; t < n; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&r->start);
    uint64_t rfd = es1.reads_fd - es0.reads_fd, rsd = es1.reads_sd - es0.reads_sd;
    uint64_t rmem = es1.reads_mem - es0.reads_mem;
    lsm_stats ls;
    lsm_stats_get(r->e->db, &ls);
    bool forced = strcmp(mode, "on") != 0;
    printf("{\"mode\":\"%s\",\"rep\":%d,\"threads\":%ld,\"seconds\":%.2f,\"ops_per_s\":%.1f,"
           "\"p50_us\":%.0f,\"p99_us\":%.0f,\"p999_us\":%.0f,\"mem_reads_per_s\":%.1f,"
           "\"fd_reads_per_s\":%.1f,\"sd_reads_per_s\":%.1f,\"load_admit_mean\":%.3f,"
           "\"tuning_share\":%.3f,\"hot_records\":%" PRIu64 ",\"twins_at_load\":%" PRIu64
           ",\"twins_now\":%" PRIu64 ",\"promoted_in_run\":%" PRIu64 ",\"tuning_entries\":%" PRIu64
           ",\"data_admit_off_s\":%.3f,\"la_below_1_s\":%.3f",
           shift_at > 0 ? "on-shift" : mode, rep, o->threads, secs, (double)ops / secs, pct(r, 0.5),
           pct(r, 0.99), pct(r, 0.999), (double)rmem / secs, (double)rfd / secs, (double)rsd / secs,
           k ? la_sum / (double)k : 0, forced || !k ? 0.0 : (double)tuning / (double)k, r->hot,
           r->twins0, ls.twin_entries, ls.promoted_recs - ls0.promoted_recs,
           ns1.tuning_entries - ns0.tuning_entries,
           (double)(ns1.data_admit_off_ns - ns0.data_admit_off_ns) / 1e9,
           (double)(ns1.load_admit_below_one_ns - ns0.load_admit_below_one_ns) / 1e9);
    if (shift_at > 0) {
        printf(",\"shift_at\":%.1f,\"state_at_shift\":\"%s\",\"back_to_classic_s\":%.1f,"
               "\"tuning_again_s\":%.1f,\"timeline\":[",
               shift_at, state_at_shift == NHC_STATE_TUNING ? "tuning" : "classic", back_classic,
               retune);
        for (size_t i = 0; i < k; i++)
            printf("%s[%.1f,%d,%.3f,%.4f,%.0f]", i ? "," : "", tl[i].t, tl[i].state, tl[i].la,
                   tl[i].miss, tl[i].ops);
        printf("]");
    }
    printf("}\n");
    fflush(stdout);
    free(tl);
    return r->err;
}

static kv_err run_all(run *r)
{
    const bopts *o = r->o;
    kv_err rv = populate(r);
    char *modes = strdup(o->modes), *save = NULL;
    const char *list[8];
    int nm = 0;
    for (char *m = strtok_r(modes, ",", &save); m && nm < 8; m = strtok_r(NULL, ",", &save))
        list[nm++] = m;
    for (int rep = 0; rv == KV_OK && rep < o->repeat; rep++)
        for (int i = 0; rv == KV_OK && i < nm; i++)
            rv = one_run(r, list[(i + rep) % nm], rep, 0); /* rotate the order */
    if (rv == KV_OK && o->shift_at > 0)
        rv = one_run(r, "on", 0, o->shift_at);
    free(modes);
    return rv;
}

static int check_opts(const bopts *o, char *err, size_t errlen)
{
    if (!o->fast_dir || !o->slow_dir) {
        snprintf(err, errlen, "--fast-dir and --slow-dir are required");
        return -1;
    }
    if (!(o->hot_pct > 0 && o->hot_pct < 50)) {
        snprintf(err, errlen, "--hot-pct must be in (0, 50)");
        return -1;
    }
    double shift_run = o->shift_seconds > 0 ? o->shift_seconds : o->seconds;
    if (!(o->seconds > 0) || !(o->warmup >= 0) || !(o->shift_seconds >= 0) ||
        o->shift_at >= shift_run) {
        snprintf(err, errlen,
                 "--seconds > 0, --warmup >= 0, --shift-seconds >= 0, --shift-at < the shift "
                 "run's length");
        return -1;
    }
    char *m = strdup(o->modes), *save = NULL;
    int bad = 0;
    for (char *t = strtok_r(m, ",", &save); t; t = strtok_r(NULL, ",", &save))
        bad |= strcmp(t, "on") && strcmp(t, "off") && strcmp(t, "fd-only") && strcmp(t, "sd-only");
    free(m);
    if (bad) {
        snprintf(err, errlen, "--modes: a comma list of on, off, fd-only, sd-only");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bopts o = {.modes = "on,off,fd-only",
               .records = 200000,
               .value_bytes = 1024,
               .fast_mb = 64,
               .mem_mb = 1,
               .threads = 16,
               .repeat = 1,
               .seed = 1,
               .seconds = 20,
               .warmup = 8,
               .hot_pct = 5,
               .promote_rounds = 4};
    kv_opt table[] = {
        {"fast-dir", KV_OPT_STR, &o.fast_dir, "FD directory (a slowfs mount)", NULL, 0, 0},
        {"slow-dir", KV_OPT_STR, &o.slow_dir, "SD directory (a slowfs mount)", NULL, 0, 0},
        {"modes", KV_OPT_STR, &o.modes, "comma list of on, off, fd-only, sd-only", NULL, 0, 0},
        {"records", KV_OPT_INT, &o.records, "records loaded", NULL, 1000, 1L << 32},
        {"value-bytes", KV_OPT_INT, &o.value_bytes, "value size", NULL, 1, 1 << 20},
        {"fast-mb", KV_OPT_INT, &o.fast_mb, "FD capacity for the LSM levels", NULL, 1, 1 << 20},
        {"mem-mb", KV_OPT_INT, &o.mem_mb, "memory-tier budget", NULL, 1, 1 << 20},
        {"threads", KV_OPT_INT, &o.threads, "client threads (closed loop)", NULL, 1, 256},
        {"seconds", KV_OPT_DOUBLE, &o.seconds, "timed phase per run", NULL, 0, 0},
        {"warmup", KV_OPT_DOUBLE, &o.warmup, "warm-up per run (not measured)", NULL, 0, 0},
        {"repeat", KV_OPT_INT, &o.repeat, "runs of each mode (order rotated)", NULL, 1, 100},
        {"hot-pct", KV_OPT_DOUBLE, &o.hot_pct, "hotspot: percent of keys in the hot set", NULL, 0,
         0},
        {"promote-rounds", KV_OPT_INT, &o.promote_rounds, "reads of the hot set to promote it",
         NULL, 1, 100},
        {"shift-at", KV_OPT_DOUBLE, &o.shift_at,
         "extra NHC-on run whose hot set moves at this second (0 = none)", NULL, 0, 0},
        {"shift-seconds", KV_OPT_DOUBLE, &o.shift_seconds,
         "timed phase of the shift run (0 = --seconds)", NULL, 0, 0},
        {"seed", KV_OPT_INT, &o.seed, "workload seed", NULL, 0, 1L << 40},
        {"nhc-probe-ms", KV_OPT_INT, &o.nhc_probe_ms, "NHC probe window (0 = default)", NULL, 0,
         600000},
        {"nhc-poll-ms", KV_OPT_INT, &o.nhc_poll_ms, "NHC poll window (0 = default)", NULL, 0,
         600000},
        {"nhc-step", KV_OPT_DOUBLE, &o.nhc_step, "NHC load_admit step (0 = default)", NULL, 0, 0},
        {"trace", KV_OPT_BOOL, &o.trace,
         "promotion trace (stderr, every 0.5 s) in every run, not only the shift run", NULL, 0, 0},
    };
    kv_optset set = {table, sizeof(table) / sizeof(table[0]), NULL, "nhc_bench", NULL};
    char err[512];
    kv_err rv = kv_opts_parse(&set, argc, argv, NULL, err, sizeof(err));
    if (rv == KV_CANCELLED)
        return 0;
    if (rv == KV_OK && check_opts(&o, err, sizeof(err)) != 0)
        rv = KV_INVALID_ARGUMENT;
    if (rv != KV_OK) {
        fprintf(stderr, "nhc_bench: %s\n", err);
        kv_opts_free(&set);
        return 2;
    }
    run *r = calloc(1, sizeof(*r));
    r->o = &o;
    pthread_mutex_init(&r->mu, NULL);
    wl_config wc;
    wl_config_default(&wc);
    wc.workload = WL_C;
    wc.dist = WL_HOTSPOT;
    wc.hot_pct = o.hot_pct;
    wc.keys = (uint64_t)o.records;
    wc.seed = (uint64_t)o.seed;
    if ((rv = wl_model_init(&r->model, &wc, err, sizeof(err))) != KV_OK) {
        fprintf(stderr, "nhc_bench: workload: %s\n", err);
        return 2;
    }
    nhc_opts no;
    nhc_opts_default(&no);
    if (o.nhc_probe_ms)
        no.probe_ns = (uint64_t)o.nhc_probe_ms * 1000000ull;
    if (o.nhc_poll_ms)
        no.poll_ns = (uint64_t)o.nhc_poll_ms * 1000000ull;
    if (o.nhc_step > 0)
        no.step = o.nhc_step;
    fprintf(stderr, "nhc_bench: NHC probe %.0f ms, poll %.0f ms, step %.3f\n",
            (double)no.probe_ns / 1e6, (double)no.poll_ns / 1e6, no.step);
    engine_opts eo = {.fast_dir = o.fast_dir,
                      .nhc = &no,
                      .slow_dir = o.slow_dir,
                      .fast_mb = (uint64_t)o.fast_mb,
                      .mem_mb = (size_t)o.mem_mb,
                      .write_buffer_mb = 16,
                      .sync = ENGINE_SYNC_NONE};
    engine_thread_register();
    if ((rv = engine_open(&r->e, &eo, err, sizeof(err))) != KV_OK) {
        fprintf(stderr, "nhc_bench: engine_open: %s\n", err);
        return 1;
    }
    if (!engine_nhc(r->e)) {
        fprintf(stderr, "nhc_bench: the engine has no NHC scheduler\n");
        return 1;
    }
    rv = run_all(r);
    if (rv != KV_OK)
        fprintf(stderr, "nhc_bench: %s\n", kv_strerror(rv));
    engine_close(r->e);
    engine_thread_unregister();
    pthread_mutex_destroy(&r->mu);
    free(r);
    kv_opts_free(&set);
    return rv == KV_OK ? 0 : 1;
}
