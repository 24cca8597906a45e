/* SPDX-License-Identifier: MIT */
/*
 * YCSB-style workload generator: PRNG seeding, the zipfian generator of YCSB
 * (Gray et al.'s rejection-free approximation with an incrementally grown
 * zeta), the key distributions, the op mixes of workloads A-F, pre-drawn
 * traces and key formatting. See workload.h for the model.
 */
#include "bench/workload.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/hash.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

void wl_rng_seed(wl_rng *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * UINT64_C(0xd1b54a32d192ed03));
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

/* ---- zipfian ----------------------------------------------------------------- */

/* Adds the terms (from, to] of zeta to sum. Summing from the small terms up
 * would be more exact; the error of this order is far below what the
 * generator's approximation already costs. */
static double zeta_range(uint64_t from, uint64_t to, double theta, double sum)
{
    for (uint64_t i = from + 1; i <= to; i++)
        sum += pow((double)i, -theta);
    return sum;
}

double wl_zeta(uint64_t n, double theta)
{
    return zeta_range(0, n, theta, 0.0);
}

static void zipf_eta(wl_zipf *z)
{
    if (z->n < 2) {
        z->eta = 0.0;
        return;
    }
    z->eta = (1.0 - pow(2.0 / (double)z->n, 1.0 - z->theta)) / (1.0 - z->zeta2 / z->zetan);
}

kv_err wl_zipf_init(wl_zipf *z, uint64_t n, double theta)
{
    if (n == 0 || !(theta > 0.0) || theta > 10.0 || fabs(theta - 1.0) < 1e-9)
        return KV_INVALID_ARGUMENT;
    z->n = n;
    z->theta = theta;
    z->alpha = 1.0 / (1.0 - theta);
    z->zeta2 = 1.0 + pow(0.5, theta);
    z->zetan = wl_zeta(n, theta);
    zipf_eta(z);
    return KV_OK;
}

void wl_zipf_grow(wl_zipf *z, uint64_t n)
{
    if (n <= z->n)
        return;
    z->zetan = zeta_range(z->n, n, z->theta, z->zetan);
    z->n = n;
    zipf_eta(z);
}

uint64_t wl_zipf_next(const wl_zipf *z, wl_rng *r)
{
    double u = wl_rng_double(r);
    double uz = u * z->zetan;
    if (uz < 1.0)
        return 0;
    if (uz < z->zeta2)
        return z->n > 1 ? 1 : 0;
    uint64_t k = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1.0, z->alpha));
    return k < z->n ? k : z->n - 1;
}

double wl_zipf_prob(const wl_zipf *z, uint64_t k)
{
    return k < z->n ? pow((double)(k + 1), -z->theta) / z->zetan : 0.0;
}

/* ---- model ------------------------------------------------------------------- */

void wl_config_default(wl_config *c)
{
    memset(c, 0, sizeof(*c));
    c->workload = WL_C;
    c->dist = WL_ZIPF;
    c->keys = 1000;
    c->theta = 0.99;
    c->hot_pct = 20.0;
    c->seed = 1;
}

/* Op mixes of the YCSB core workloads: read, update, insert, read-modify-write. */
static const double op_mix[WL_NWORKLOADS][4] = {
    [WL_A] = {0.50, 0.50, 0.00, 0.00}, [WL_B] = {0.95, 0.05, 0.00, 0.00},
    [WL_C] = {1.00, 0.00, 0.00, 0.00}, [WL_D] = {0.95, 0.00, 0.05, 0.00},
    [WL_F] = {0.50, 0.00, 0.00, 0.50},
};

static kv_err model_check(const wl_config *c, char *err, size_t errlen)
{
    if ((unsigned)c->workload >= WL_NWORKLOADS || (unsigned)c->dist >= WL_NDISTS) {
        snprintf(err, errlen, "unknown workload or distribution");
        return KV_INVALID_ARGUMENT;
    }
    if (c->keys == 0 || c->keys >= WL_MISS_BIT / 2) {
        snprintf(err, errlen, "keys must be in [1, 2^61)");
        return KV_INVALID_ARGUMENT;
    }
    if (c->dist == WL_HOTSPOT && !(c->hot_pct > 0.0 && c->hot_pct < 100.0)) {
        snprintf(err, errlen, "hot-pct must be in (0, 100)");
        return KV_INVALID_ARGUMENT;
    }
    if (!(c->miss_ratio >= 0.0 && c->miss_ratio <= 1.0)) {
        snprintf(err, errlen, "miss-ratio must be in [0, 1]");
        return KV_INVALID_ARGUMENT;
    }
    return KV_OK;
}

kv_err wl_model_init(wl_model *m, const wl_config *c, char *err, size_t errlen)
{
    kv_err rv;
    if ((rv = model_check(c, err, errlen)) != KV_OK)
        return rv;
    memset(m, 0, sizeof(*m));
    m->cfg = *c;
    if (c->workload == WL_D)
        m->cfg.dist = WL_LATEST;
    wl_dist d = m->cfg.dist;
    if (d == WL_ZIPF || d == WL_SCRAMBLED_ZIPF || d == WL_LATEST) {
        if ((rv = wl_zipf_init(&m->zipf, c->keys, c->theta)) != KV_OK) {
            snprintf(err, errlen, "theta must be in (0, 1) or (1, 10]");
            return rv;
        }
    }
    m->read = op_mix[c->workload][0];
    m->update = op_mix[c->workload][1];
    m->insert = op_mix[c->workload][2];
    m->rmw = op_mix[c->workload][3];
    return KV_OK;
}

/* ---- per-thread generator ------------------------------------------------------ */

void wl_gen_init(wl_gen *g, const wl_model *m, unsigned thread, unsigned nthreads)
{
    memset(g, 0, sizeof(*g));
    g->m = m;
    g->thread = thread;
    g->nthreads = nthreads ? nthreads : 1;
    g->latest = m->zipf;
    wl_rng_seed(&g->rng, m->cfg.seed, thread);
}

static uint64_t hotspot_id(wl_gen *g, uint64_t keys)
{
    uint64_t hot = (uint64_t)((double)keys * g->m->cfg.hot_pct / 100.0);
    if (hot == 0)
        hot = 1;
    if (hot >= keys)
        return wl_rng_below(&g->rng, keys);
    if (wl_rng_double(&g->rng) < 1.0 - g->m->cfg.hot_pct / 100.0)
        return wl_rng_below(&g->rng, hot);
    return hot + wl_rng_below(&g->rng, keys - hot);
}

uint64_t wl_gen_key(wl_gen *g)
{
    const wl_config *c = &g->m->cfg;
    uint64_t id;
    switch (c->dist) {
    case WL_ZIPF:
        id = wl_zipf_next(&g->m->zipf, &g->rng);
        break;
    case WL_SCRAMBLED_ZIPF: {
        uint64_t rank = wl_zipf_next(&g->m->zipf, &g->rng);
        id = kv_hash64(&rank, sizeof(rank), c->scramble) % c->keys;
        break;
    }
    case WL_HOTSPOT:
        id = hotspot_id(g, c->keys);
        break;
    case WL_LATEST: /* newest first; no offset (the hot set moves by itself) */
        return g->latest.n - 1 - wl_zipf_next(&g->latest, &g->rng);
    default:
        id = wl_rng_below(&g->rng, c->keys);
        break;
    }
    return c->offset ? (id + c->offset % c->keys) % c->keys : id;
}

static wl_op gen_insert(wl_gen *g)
{
    const wl_config *c = &g->m->cfg;
    wl_op op = {c->keys + g->thread + g->inserted * g->nthreads, WL_OP_INSERT};
    g->inserted++;
    if (c->dist == WL_LATEST)
        wl_zipf_grow(&g->latest, c->keys + g->inserted * g->nthreads);
    return op;
}

wl_op wl_gen_next(wl_gen *g)
{
    const wl_model *m = g->m;
    double u = wl_rng_double(&g->rng);
    wl_op op = {0, WL_OP_READ};
    if (u >= m->read + m->update + m->insert)
        op.type = WL_OP_RMW;
    else if (u >= m->read + m->update)
        return gen_insert(g);
    else if (u >= m->read)
        op.type = WL_OP_UPDATE;
    if (op.type == WL_OP_READ && m->cfg.miss_ratio > 0.0 &&
        wl_rng_double(&g->rng) < m->cfg.miss_ratio) {
        op.key = wl_rng_below(&g->rng, m->cfg.keys) | WL_MISS_BIT;
        return op;
    }
    op.key = wl_gen_key(g);
    return op;
}

kv_err wl_trace_make(const wl_model *m, unsigned thread, unsigned nthreads, size_t n, wl_op **out)
{
    wl_op *t = malloc((n ? n : 1) * sizeof(*t));
    if (!t)
        return KV_RESOURCE_EXHAUSTED;
    wl_gen g;
    wl_gen_init(&g, m, thread, nthreads);
    for (size_t i = 0; i < n; i++)
        t[i] = wl_gen_next(&g);
    *out = t;
    return KV_OK;
}

kv_err wl_load_order(uint64_t keys, uint64_t seed, uint64_t **out)
{
    uint64_t *a = malloc((keys ? keys : 1) * sizeof(*a));
    if (!a)
        return KV_RESOURCE_EXHAUSTED;
    for (uint64_t i = 0; i < keys; i++)
        a[i] = i;
    wl_rng r;
    wl_rng_seed(&r, seed, UINT64_C(0x10ad));
    for (uint64_t i = keys; i > 1; i--) { /* Fisher-Yates */
        uint64_t j = wl_rng_below(&r, i);
        uint64_t tmp = a[i - 1];
        a[i - 1] = a[j];
        a[j] = tmp;
    }
    *out = a;
    return KV_OK;
}

/* ---- names and keys -------------------------------------------------------------- */

static const char *const workload_names[WL_NWORKLOADS] = {"A", "B", "C", "D", "F"};
static const char *const dist_names[WL_NDISTS] = {"uniform", "zipf", "scrambled", "hotspot",
                                                  "latest"};
static const char *const op_names[] = {"read", "update", "insert", "rmw"};

const char *wl_workload_name(wl_workload w)
{
    return (unsigned)w < WL_NWORKLOADS ? workload_names[w] : "?";
}

const char *wl_dist_name(wl_dist d)
{
    return (unsigned)d < WL_NDISTS ? dist_names[d] : "?";
}

const char *wl_op_name(wl_optype t)
{
    return (unsigned)t < 4 ? op_names[t] : "?";
}

int wl_workload_parse(const char *s)
{
    for (int i = 0; i < WL_NWORKLOADS; i++)
        if (strcasecmp(s, workload_names[i]) == 0)
            return i;
    return -1;
}

int wl_dist_parse(const char *s)
{
    for (int i = 0; i < WL_NDISTS; i++)
        if (strcasecmp(s, dist_names[i]) == 0)
            return i;
    return -1;
}

size_t wl_key_str(uint64_t id, char *buf, size_t len)
{
    int n = snprintf(buf, len, "key%012" PRIu64, id);
    return n > 0 && (size_t)n < len ? (size_t)n : 0;
}
