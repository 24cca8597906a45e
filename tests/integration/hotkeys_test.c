/* SPDX-License-Identifier: MIT */
/*
 * Cluster hot-key detection, end to end (issue 7): two routers split a
 * zipf 0.99 load over 1M keys (routers at --hot-sample 1, 2 s windows); the
 * ground truth is counted exactly here. Within 2 windows the true 10 hottest keys must
 * all appear in `kvctl hotkeys --top 20`, and at least 9 of the reported
 * top 10 must be among the true top 20; after the hot set shifts, the same
 * must hold again within 3 windows. The hottest key must also be pinned.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/hash.h"
#include "harness.h"
#include "kv/kv.h"
#include "node/index/hr_internal.h" /* hr_key_tag: which ring a key is in */
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

#define NKEYS 1000000u
/* The detection window. Accuracy needs enough samples per window, and an
 * ASan build serves a few times fewer requests: it gets longer windows
 * (the checks, in windows, stay the same). */
#if defined(__SANITIZE_ADDRESS__)
#define WINDOW_MS 5000
#define WINDOW_ARG "5000"
#else
#define WINDOW_MS 2000
#define WINDOW_ARG "2000"
#endif
#define INFLIGHT 64

static double *cdf; /* zipf 0.99 cumulative distribution over ranks */
static kvt_cluster cl;

static void build_cdf(void)
{
    cdf = malloc(NKEYS * sizeof(double));
    double sum = 0;
    for (uint32_t i = 0; i < NKEYS; i++)
        cdf[i] = (sum += 1.0 / pow((double)i + 1, 0.99));
    for (uint32_t i = 0; i < NKEYS; i++)
        cdf[i] /= sum;
}

static uint32_t draw(unsigned *seed)
{
    double u = (double)rand_r(seed) / ((double)RAND_MAX + 1);
    uint32_t lo = 0, hi = NKEYS - 1;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A bounded window of asynchronous reads: at most INFLIGHT outstanding. */
typedef struct window {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inflight;
} window;

static void win_init(window *w)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->inflight = 0;
}

/* Waits for a free place in the window and takes it. */
static void win_take(window *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->inflight >= INFLIGHT)
        pthread_cond_wait(&w->cv, &w->mu);
    w->inflight++;
    pthread_mutex_unlock(&w->mu);
}

/* The reads' completion callback (arg: the window). */
static void win_done(void *arg, kv_err err, const kv_result *res)
{
    window *w = arg;
    pthread_mutex_lock(&w->mu);
    w->inflight--;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Waits until every read in the window has completed. */
static void win_drain(window *w)
{
    pthread_mutex_lock(&w->mu);
    while (w->inflight > 0)
        pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

typedef struct loader {
    const char *url;
    uint32_t offset; /* rank r is key (r + offset) % NKEYS: the shift moves it */
    uint64_t until_ns;
    uint32_t *counts; /* ground truth: requests sent per key */
    unsigned seed;
    window win;
} loader;

static void *load(void *arg)
{
    loader *l = arg;
    kv_client *c;
    if (kv_client_open(&c, l->url, NULL) != KV_OK)
        return NULL;
    char key[24];
    while (kv_now_ns() < l->until_ns) {
        win_take(&l->win);
        uint32_t k = (draw(&l->seed) + l->offset) % NKEYS;
        l->counts[k]++;
        snprintf(key, sizeof(key), "key%012u", k);
        kv_get_async(c, key, strlen(key), win_done, &l->win);
    }
    win_drain(&l->win);
    kv_client_close(c);
    return NULL;
}

/* Runs both loaders for ms milliseconds; counts accumulate into truth. */
static void run_load(uint32_t offset, int ms, uint32_t *truth)
{
    loader l[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        l[i] = (loader){.url = i ? cl.router2_url : cl.router_url,
                        .offset = offset,
                        .until_ns = kv_now_ns() + (uint64_t)ms * 1000000ull,
                        .counts = calloc(NKEYS, sizeof(uint32_t)),
                        .seed = 17u + (unsigned)i};
        win_init(&l[i].win);
        pthread_create(&t[i], NULL, load, &l[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        for (uint32_t k = 0; k < NKEYS; k++)
            truth[k] += l[i].counts[k];
        free(l[i].counts);
    }
}

/* The n keys with the highest counts, best first. */
static void true_top(const uint32_t *truth, uint32_t *out, int n)
{
    for (int i = 0; i < n; i++)
        out[i] = UINT32_MAX;
    for (uint32_t k = 0; k < NKEYS; k++) {
        for (int i = 0; i < n; i++) {
            if (out[i] == UINT32_MAX || truth[k] > truth[out[i]]) {
                memmove(&out[i + 1], &out[i], (size_t)(n - i - 1) * sizeof(*out));
                out[i] = k;
                break;
            }
        }
    }
}

/* Parses `kvctl hotkeys --json` output into key numbers (best first). */
static char last_report[16384];

static int reported_top(uint32_t *out, int max, bool *top_pinned)
{
    char cmd[512], *buf = last_report;
    snprintf(cmd, sizeof(cmd), "%s --router %s hotkeys --top 20 --json", kvt_bin("client/kvctl"),
             cl.router_url);
    cr_assert_eq(kvt_run(cmd, buf, sizeof(last_report)), 0, "%s", buf);
    int n = 0;
    for (char *p = buf; n < max && (p = strstr(p, "\"key\":\"key")); p += 10)
        out[n++] = (uint32_t)strtoul(p + 10, NULL, 10);
    char *first = strstr(buf, "\"pinned\":");
    *top_pinned = first && strncmp(first + 9, "true", 4) == 0;
    return n;
}

static bool contains(const uint32_t *a, int n, uint32_t k)
{
    for (int i = 0; i < n; i++)
        if (a[i] == k)
            return true;
    return false;
}

static void check_accuracy(const uint32_t *truth, const char *phase)
{
    uint32_t t20[20], rep[20];
    true_top(truth, t20, 20);
    bool pinned = false;
    int n = reported_top(rep, 20, &pinned);
    cr_assert_geq(n, 10, "%s: only %d keys reported", phase, n);
    for (int i = 0; i < 10; i++)
        cr_assert(contains(rep, n, t20[i]), "%s: true #%d key%012u (count %u) not reported", phase,
                  i + 1, t20[i], truth[t20[i]]);
    int good = 0;
    for (int i = 0; i < 10; i++)
        good += contains(t20, 20, rep[i]);
    cr_assert_geq(good, 9, "%s: only %d of the reported top 10 are in the true top 20", phase,
                  good);
    cr_assert(pinned, "%s: the hottest key is pinned on its node: %s", phase, last_report);
}

Test(hotkeys, two_routers_zipf_top_keys_and_shift, .timeout = 180)
{
    static const char *const rflags[] = {"--hot-sample", "1", "--hot-window-ms", WINDOW_ARG, NULL};
    static const char *const nflags[] = {"--hot-threshold", "20", NULL};
    kvt_router_extra = rflags;
    kvt_node_extra = nflags;
    cr_assert_eq(kvt_cluster_start(&cl, 3, 1, NULL), KV_OK, "logs in %s", cl.dir);
    cr_assert_eq(kvt_add_router(&cl), KV_OK);
    build_cdf();
    uint32_t *truth = calloc(NKEYS, sizeof(uint32_t));
    run_load(0, WINDOW_MS * 9 / 4, truth); /* two windows and a quarter */
    check_accuracy(truth, "steady");
    memset(truth, 0, NKEYS * sizeof(uint32_t));
    run_load(NKEYS / 2, WINDOW_MS * 13 / 4, truth); /* the hot set moves; 3 windows and a 1/4 */
    check_accuracy(truth, "after the shift");
    free(truth);
    free(cdf);
    kvt_cluster_stop(&cl);
}

/* n statistics of one admin.Stats (verbose) reply from url, or from node
 * node_id through the router at url (kvt_stats), as numbers. */
static void stats_get(const char *url, const char *node_id, const char *const *names, double *v,
                      int n)
{
    char vals[8][KVT_STAT_LEN];
    cr_assert(n <= 8);
    kv_err rv = kvt_stats(url, NULL, node_id, n, names, vals);
    cr_assert_eq(rv, KV_OK, "admin.Stats on %s: %s", url, kv_err_name(rv));
    for (int k = 0; k < n; k++) {
        cr_assert(vals[k][0], "no stat %s from %s", names[k], node_id ? node_id : url);
        v[k] = strtod(vals[k], NULL);
    }
}

static double stat_num(const char *url, const char *node_id, const char *name)
{
    double v;
    stats_get(url, node_id, &name, &v, 1);
    return v;
}

static long stat_of(const char *url, const char *node_id, const char *name)
{
    return (long)stat_num(url, node_id, name);
}

static void hammer(kv_client *c, const char *key, int ms)
{
    uint64_t until = kv_now_ns() + (uint64_t)ms * 1000000ull;
    while (kv_now_ns() < until) {
        kv_value v;
        if (kv_get(c, key, strlen(key), &v) == KV_OK)
            kv_value_free(&v);
    }
}

/* Reads key through c until router url's stat `name` reaches min, for up
 * to 20 s: a router flags a key at the end of a detection window, and on a
 * loaded machine (CI runs the suites side by side) that window can end late.
 * Returns the stat's last value. */
static long hammer_until(kv_client *c, const char *key, const char *url, const char *name, long min)
{
    long v = 0;
    for (int i = 0; i < 80 && (v = stat_of(url, NULL, name)) < min; i++)
        hammer(c, key, 250);
    return v;
}

/* --hot-replica-reads spreads a hot key's reads over its 3 replicas;
 * --hot-cache-ms serves it from the router, invalidated by writes through
 * the same router, stale for at most T ms for writes that bypass it. */
Test(hotkeys, router_mitigations, .timeout = 120)
{
    static const char *const rflags[] = {"--hot-sample",
                                         "1",
                                         "--hot-window-ms",
                                         "500",
                                         "--hot-flag-rate",
                                         "10",
                                         "--hot-replica-reads",
                                         "--hot-cache-ms",
                                         "300",
                                         NULL};
    kvt_router_extra = rflags;
    kvt_node_extra = NULL;
    cr_assert_eq(kvt_cluster_start(&cl, 3, 3, NULL), KV_OK, "logs in %s", cl.dir);
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, cl.router_url, NULL), KV_OK);
    cr_assert_eq(kv_put(c, "hot", 3, "v1", 2, NULL, NULL), KV_OK);
    hammer(c, "hot", 1500); /* flagged after the first window */
    long hits = hammer_until(c, "hot", cl.router_url, "hot.cache_hits", 101);
    cr_assert_gt(hits, 100, "reads served by the router cache: %ld", hits);
    /* Spreading, seen without the cache in front: a second router with
     * only --hot-replica-reads. Plain reads at ONE go to the primary
     * replica alone, so every replica serving many reads is the spread. */
    static const char *const rflags2[] = {"--hot-sample",    "1",  "--hot-window-ms",     "500",
                                          "--hot-flag-rate", "10", "--hot-replica-reads", NULL};
    kvt_router_extra = rflags2;
    cr_assert_eq(kvt_add_router(&cl), KV_OK, "second router, logs in %s", cl.dir);
    kv_client *c2;
    cr_assert_eq(kv_client_open(&c2, cl.router2_url, NULL), KV_OK);
    hammer(c2, "hot", 1000); /* flagged after the first window */
    cr_assert_geq(hammer_until(c2, "hot", cl.router2_url, "hot.tracked", 1), 1,
                  "the second router never reported the key");
    long before[3];
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof(id), "n%d", i + 1);
        before[i] = stat_of(cl.router_url, id, "gets");
    }
    /* in 250 ms slices, up to 20 s: the flag lapses and comes back with
     * the 500 ms windows when the reads stall (a loaded host); without the
     * spreading the other replicas would serve none of them, ever */
    long d[3] = {0};
    for (int round = 0; round < 80; round++) {
        hammer(c2, "hot", 250);
        bool all = true;
        for (int i = 0; i < 3; i++) {
            char id[8];
            snprintf(id, sizeof(id), "n%d", i + 1);
            d[i] = stat_of(cl.router_url, id, "gets") - before[i];
            all &= d[i] > 20;
        }
        if (all)
            break;
    }
    for (int i = 0; i < 3; i++)
        cr_assert_gt(d[i], 20, "replica n%d served %ld reads of the flagged key", i + 1, d[i]);
    kv_client_close(c2);
    /* written at ALL so that every replica has v2: what is left to check is
     * that the router's cache does not serve v1 any more */
    kv_put_opts all = {.consistency = KV_CONSISTENCY_ALL};
    cr_assert_eq(kv_put(c, "hot", 3, "v2", 2, &all, NULL), KV_OK);
    kv_value v;
    cr_assert_eq(kv_get(c, "hot", 3, &v), KV_OK);
    cr_assert(v.len == 2 && memcmp(v.data, "v2", 2) == 0, "a write through the router "
                                                          "invalidates its cache");
    kv_value_free(&v);
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}

/* ---- effect: pinned keys are answered by their ring's head ---------------- */

#define EFFECT_KEYS 8000u /* with 1024 rings (--mem-mb 1): about 8 items a ring */
#define EFFECT_HOT 8      /* hot keys, each in a ring of its own */
#define EFFECT_READS 25   /* direct reads of each hot key on each node */

typedef struct effect_load {
    kv_client *c;
    const uint32_t *hot;
    atomic_bool stop;
    window win;
} effect_load;

/* Until stopped: 3 reads in 4 go to the hot keys in turn, the rest to a key
 * drawn uniformly from all of them. */
static void *effect_main(void *arg)
{
    effect_load *l = arg;
    unsigned seed = 7;
    char key[24];
    for (unsigned long i = 0; !atomic_load(&l->stop); i++) {
        win_take(&l->win);
        uint32_t k =
            i % 4 ? l->hot[(i - i / 4 - 1) % EFFECT_HOT] : (uint32_t)rand_r(&seed) % EFFECT_KEYS;
        snprintf(key, sizeof(key), "key%012u", k);
        kv_get_async(l->c, key, strlen(key), win_done, &l->win);
    }
    win_drain(&l->win);
    return NULL;
}

/* Writes every key (16-byte values) to all replicas. */
static void effect_fill(kv_client *c)
{
    static char keys[EFFECT_KEYS][24];
    kv_op ops[500];
    for (uint32_t base = 0; base < EFFECT_KEYS; base += 500) {
        for (uint32_t i = 0; i < 500; i++) {
            snprintf(keys[base + i], sizeof(keys[0]), "key%012u", base + i);
            ops[i] = (kv_op){.type = KV_OP_PUT,
                             .key = keys[base + i],
                             .klen = strlen(keys[base + i]),
                             .val = "value-of-16bytes",
                             .vlen = 16};
        }
        kv_err rv = kv_batch(c, ops, 500, KV_CONSISTENCY_ALL);
        cr_assert_eq(rv, KV_OK, "load: %s", kv_strerror(rv));
        for (uint32_t i = 0; i < 500; i++)
            cr_assert_eq(ops[i].status, KV_OK, "load %s: %s", keys[base + i],
                         kv_strerror(ops[i].status));
        kv_batch_free(ops, 500);
    }
}

/* EFFECT_HOT key ids whose HotRing buckets (the top `bits` bits of the index
 * hash) differ: a ring has one head, so two pinned keys sharing a ring could
 * not both be answered by it whatever the pinning does. They are among the
 * last keys effect_fill writes, so not the first item of their ring (which
 * holds the head until something moves it). */
static void effect_pick_hot(uint32_t *hot, unsigned bits)
{
    uint64_t bucket[EFFECT_HOT];
    int n = 0;
    for (uint32_t id = EFFECT_KEYS - 1; n < EFFECT_HOT && id >= 97; id -= 97) {
        char key[24];
        snprintf(key, sizeof(key), "key%012u", id);
        uint64_t b = hr_key_tag(key, strlen(key)) >> (32 - bits);
        bool taken = false;
        for (int i = 0; i < n; i++)
            taken |= bucket[i] == b;
        if (!taken) {
            bucket[n] = b;
            hot[n++] = id;
        }
    }
    cr_assert_eq(n, EFFECT_HOT);
}

/* Starts the router load (*t) and waits until every node pinned every hot
 * key (up to a minute: no timing goal). The load keeps running: a router
 * that stops seeing a key withdraws its report a window later. */
static void effect_pin(effect_load *l, pthread_t *t)
{
    pthread_create(t, NULL, effect_main, l);
    long pinned = 0;
    for (int i = 0; i < 600 && pinned < 2 * EFFECT_HOT; i++) {
        usleep(100000);
        pinned =
            stat_of(cl.router_url, "n1", "hot.pinned") + stat_of(cl.router_url, "n2", "hot.pinned");
    }
    if (pinned < 2 * EFFECT_HOT) {
        atomic_store(&l->stop, true);
        pthread_join(*t, NULL);
        char cmd[512], out[8192];
        snprintf(cmd, sizeof(cmd), "%s --router %s hotkeys --top 20", kvt_bin("client/kvctl"),
                 cl.router_url);
        kvt_run(cmd, out, sizeof(out));
        cr_assert_fail("hot keys pinned on n1 + n2: %ld of %d\n%s", pinned, 2 * EFFECT_HOT, out);
    }
}

/* Reads every hot key EFFECT_READS times straight from node i. */
static void effect_read_node(int i, const uint32_t *hot)
{
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, cl.node_url[i], NULL), KV_OK);
    for (int h = 0; h < EFFECT_HOT; h++) {
        char key[24];
        snprintf(key, sizeof(key), "key%012u", hot[h]);
        for (int r = 0; r < EFFECT_READS; r++) {
            kv_value v;
            kv_err rv = kv_get(c, key, strlen(key), &v);
            cr_assert_eq(rv, KV_OK, "get %s from n%d: %s", key, i + 1, kv_strerror(rv));
            kv_value_free(&v);
        }
    }
    kv_client_close(c);
}

/* Head-hit share on pinned keys >= 99% (issue 7, "Effect"), end to end:
 * skewed reads through a router pin the hot keys on both replicas (rf 2,
 * rings of about 8 items), then, while that load goes on, each hot key is
 * also read straight from both nodes; the share is over every read of a
 * pinned key in that interval. A read at ONE goes to the key's primary, so
 * each hot key's primary also saw the skew (its own sampling would move the
 * head there), while the other replica saw only the ring's cold reads and
 * the direct ones: there the pin alone holds the head against sampling
 * rounds drawn from its cold neighbours (a 2x-cost prior did not: shares of
 * 0.96-0.97 on one node). hinted_key_at_head_without_reads isolates the
 * head move of the hint itself. */
Test(hotkeys, pinned_keys_answered_by_ring_head, .timeout = 180)
{
    static const char *const rflags[] = {"--hot-sample", "1", "--hot-window-ms", "500", NULL};
    static const char *const nflags[] = {"--mem-mb", "1", "--hot-threshold", "20", NULL};
    static const char *const ids[] = {"n1", "n2"};
    static const char *const pinned_stats[] = {"index.pinned_reads", "index.pinned_head_hits"};
    kvt_router_extra = rflags;
    kvt_node_extra = nflags;
    cr_assert_eq(kvt_cluster_start(&cl, 2, 2, NULL), KV_OK, "logs in %s", cl.dir);
    effect_load l = {0};
    win_init(&l.win);
    cr_assert_eq(kv_client_open(&l.c, cl.router_url, NULL), KV_OK);
    effect_fill(l.c);
    long buckets = 0;
    for (int i = 0; i < 2; i++) {
        buckets = stat_of(cl.router_url, ids[i], "index.buckets");
        long keys = stat_of(cl.router_url, ids[i], "keys");
        cr_assert(buckets == 1024 && keys >= 6 * buckets,
                  "%s: dense rings wanted: %ld keys in %ld buckets", ids[i], keys, buckets);
    }
    uint32_t hot[EFFECT_HOT];
    effect_pick_hot(hot, 10);
    l.hot = hot;
    pthread_t t;
    effect_pin(&l, &t);
    double reads = 0, hits = 0;
    long pinned = 0;
    for (int i = 0; i < 2; i++) {
        double v0[2], v1[2];
        stats_get(cl.router_url, ids[i], pinned_stats, v0, 2);
        effect_read_node(i, hot);
        stats_get(cl.router_url, ids[i], pinned_stats, v1, 2);
        double r = v1[0] - v0[0], h = v1[1] - v0[1];
        pinned += stat_of(cl.router_url, ids[i], "hot.pinned");
        cr_log_info("%s: pinned head-hit share %.4f over %.0f reads", ids[i], r ? h / r : 0, r);
        reads += r;
        hits += h;
    }
    atomic_store(&l.stop, true);
    pthread_join(t, NULL);
    kv_client_close(l.c);
    cr_assert_eq(pinned, 2 * EFFECT_HOT, "still pinned after the reads");
    cr_assert_geq(reads, 2 * EFFECT_HOT * EFFECT_READS, "our reads all found a pinned item");
    cr_assert_geq(hits / reads, 0.99, "pinned head-hit share %.4f over %.0f reads", hits / reads,
                  reads);
    kvt_cluster_stop(&cl);
}

/* Sends node_url a report of the keys ids as a router would (10,000 ops/s). */
static void effect_report(const char *node_url, const uint32_t *ids, int n)
{
    char keys[EFFECT_HOT][24];
    Kv__HotKey hk[EFFECT_HOT], *ptrs[EFFECT_HOT];
    for (int i = 0; i < n; i++) {
        snprintf(keys[i], sizeof(keys[i]), "key%012u", ids[i]);
        kv__hot_key__init(&hk[i]);
        hk[i].key = (ProtobufCBinaryData){strlen(keys[i]), (uint8_t *)keys[i]};
        hk[i].ops_per_s = 10000;
        hk[i].count = 10000;
        ptrs[i] = &hk[i];
    }
    Kv__HotKeysRequest req = KV__HOT_KEYS_REQUEST__INIT;
    req.router_id = "test-router";
    /* the longest window: the pins must outlive the test's checks (a 1 s
     * window ages them out 3 s after the report, too soon on a loaded host) */
    req.window_ms = 60000;
    req.n_keys = (size_t)n;
    req.keys = ptrs;
    rpc_chan *ch;
    rpc_chan_opts o = kvt_chan_opts(NULL);
    cr_assert_eq(rpc_chan_open(&ch, node_url, &o), KV_OK);
    rpc_reply r;
    kv_err rv = rpc_call(ch, "admin.HotKeys", 0, &req.base, 5000, &r);
    cr_assert_eq(rv, KV_OK, "admin.HotKeys: %s", kv_strerror(rv));
    rpc_reply_free(&r);
    rpc_chan_close(ch);
}

/* What the hint itself does: keys that nobody has read since they were
 * written get a hot-key report (as a router sends it) and must then be
 * answered by their ring's head from the first read on. HotRing's sampling
 * has no reads to go on, so a pin that only flags the item without moving
 * the head fails here (measured with the head move taken out of hr_pin:
 * share 0.755). */
Test(hotkeys, hinted_key_at_head_without_reads, .timeout = 120)
{
    static const char *const rflags[] = {"--hot-sample", "0", NULL}; /* only our report */
    static const char *const nflags[] = {"--mem-mb", "1", "--hot-threshold", "20", NULL};
    kvt_router_extra = rflags;
    kvt_node_extra = nflags;
    cr_assert_eq(kvt_cluster_start(&cl, 1, 1, NULL), KV_OK, "logs in %s", cl.dir);
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, cl.router_url, NULL), KV_OK);
    effect_fill(c);
    kv_client_close(c);
    long buckets = stat_of(cl.node_url[0], NULL, "index.buckets");
    long keys = stat_of(cl.node_url[0], NULL, "keys");
    cr_assert(buckets == 1024 && keys >= 6 * buckets, "dense rings wanted: %ld keys in %ld buckets",
              keys, buckets);
    uint32_t hot[EFFECT_HOT];
    effect_pick_hot(hot, 10);
    effect_report(cl.node_url[0], hot, EFFECT_HOT);
    cr_assert_eq(stat_of(cl.node_url[0], NULL, "hot.pinned"), EFFECT_HOT);
    double r0 = stat_num(cl.node_url[0], NULL, "index.pinned_reads");
    double h0 = stat_num(cl.node_url[0], NULL, "index.pinned_head_hits");
    effect_read_node(0, hot);
    double reads = stat_num(cl.node_url[0], NULL, "index.pinned_reads") - r0;
    double hits = stat_num(cl.node_url[0], NULL, "index.pinned_head_hits") - h0;
    cr_log_info("pinned head-hit share %.4f over %.0f reads", reads ? hits / reads : 0, reads);
    cr_assert_eq(reads, EFFECT_HOT * EFFECT_READS, "every read found a pinned item");
    cr_assert_geq(hits / reads, 0.99, "pinned head-hit share %.4f over %.0f reads", hits / reads,
                  reads);
    kvt_cluster_stop(&cl);
}

/* Polls node n1's hot.pinned through the router until it equals want (up to
 * ms); returns the last value. */
static long wait_pinned(long want, int ms)
{
    long v = -1;
    for (int i = 0; i <= ms / 50; i++) {
        if ((v = stat_of(cl.router_url, "n1", "hot.pinned")) == want)
            break;
        usleep(50000);
    }
    return v;
}

/* A router whose traffic stops withdraws its reports with its next (empty)
 * one, so a key nobody reads any more is unpinned even when no other router
 * reports to that node. */
Test(hotkeys, idle_router_unpins, .timeout = 120)
{
    static const char *const rflags[] = {"--hot-sample", "1", "--hot-window-ms", "300", NULL};
    static const char *const nflags[] = {"--hot-threshold", "20", NULL};
    kvt_router_extra = rflags;
    kvt_node_extra = nflags;
    cr_assert_eq(kvt_cluster_start(&cl, 1, 1, NULL), KV_OK, "logs in %s", cl.dir);
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, cl.router_url, NULL), KV_OK);
    cr_assert_eq(kv_put(c, "hot", 3, "v", 1, NULL, NULL), KV_OK);
    long pinned = 0;
    for (int i = 0; i < 30 && pinned < 1; i++) { /* up to 30 s of reads, no timing goal */
        hammer(c, "hot", 1000);
        pinned = stat_of(cl.router_url, "n1", "hot.pinned");
    }
    cr_assert_eq(pinned, 1, "the hammered key is pinned");
    kv_client_close(c);
    /* no more reads: the next window's report is empty (allow 30 windows) */
    pinned = wait_pinned(0, 30 * 300);
    cr_assert_eq(pinned, 0, "pins left after the router went idle: %ld", pinned);
    kvt_cluster_stop(&cl);
}

/* --hot-threshold 0 switches hints off: the node keeps the routers' view
 * (kvctl hotkeys shows the key) but pins nothing. */
Test(hotkeys, threshold_zero_pins_nothing, .timeout = 120)
{
    static const char *const rflags[] = {"--hot-sample", "1", "--hot-window-ms", "300", NULL};
    static const char *const nflags[] = {"--hot-threshold", "0", NULL};
    kvt_router_extra = rflags;
    kvt_node_extra = nflags;
    cr_assert_eq(kvt_cluster_start(&cl, 1, 1, NULL), KV_OK, "logs in %s", cl.dir);
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, cl.router_url, NULL), KV_OK);
    cr_assert_eq(kv_put(c, "hot", 3, "v", 1, NULL, NULL), KV_OK);
    bool seen = false;
    char cmd[512], out[4096];
    snprintf(cmd, sizeof(cmd), "%s --router %s hotkeys --top 5 --json", kvt_bin("client/kvctl"),
             cl.router_url);
    for (int i = 0; i < 30 && !seen; i++) { /* until a report reached the node */
        hammer(c, "hot", 1000);
        cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
        seen = strstr(out, "\"key\":\"hot\"") != NULL;
    }
    cr_assert(seen, "the node's view lists the hammered key: %s", out);
    hammer(c, "hot", 1000); /* more reports (about 3 windows) while reads go on */
    cr_assert_eq(stat_of(cl.router_url, "n1", "hot.pinned"), 0);
    cr_assert_eq(kvt_run(cmd, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "\"pinned\":true") == NULL, "nothing pinned: %s", out);
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}
