/* SPDX-License-Identifier: MIT */
/*
 * The router's live dashboard, on the --http-listen listener:
 *   /               the page (shard/dashboard.html, embedded at build time:
 *                   plain JavaScript and SVG, no external asset)
 *   /api/cluster    the map: nodes, states, ring shares, the transition and
 *                   its streams' progress
 *   /api/series     per node, one point a second over the last 5 minutes:
 *                   throughput, memory/fast/slow hit ratios, NHC load_admit
 *   /api/hotkeys    the cluster's hot keys (the nodes' merged views)
 * (docs/operations.md documents the JSON).
 *
 * A sampler thread polls every node's admin.Stats once a second (in
 * parallel, one fan-out) into a ring buffer per node, and refreshes the hot
 * keys and the migration progress; the handlers only read what it stored,
 * under dash->mu, so a page load never waits for the nodes.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/log.h"
#include "shard/dashboard_html.h"
#include "shard/fan.h"
#include "shard/router.h"

#define DASH_POINTS 300 /* 5 minutes at one a second */
#define DASH_MAX_NODES 64
#define DASH_PERIOD_MS 1000
#define DASH_HOT_TOP 20

typedef struct dash_sample {
    uint64_t t_ms; /* wall clock */
    bool ok;
    uint64_t ops, reads_mem, reads_fd, reads_sd, reads_miss;
    double load_admit; /* -1 = no NHC scheduler */
    uint64_t mem_bytes, items;
} dash_sample;

typedef struct dash_node {
    char id[CMAP_MAX_ID + 1];
    dash_sample s[DASH_POINTS];
    size_t head, n; /* ring: the newest at (head + n - 1) % DASH_POINTS */
    char serving[24];
    char nhc_state[16];
} dash_node;

struct router_dash {
    router *r;
    pthread_mutex_t mu; /* protects nodes, nnodes, hot_json, mig_json */
    dash_node *nodes;
    size_t nnodes;
    char *hot_json; /* the hot keys as a JSON array (malloc'ed) */
    char *mig_json; /* the transition's streams as a JSON array, NULL = none */
    pthread_t thread;
    bool started;
    _Atomic bool stop;
};

/* ---- a growable JSON text ---- */

typedef struct jbuf {
    char *p;
    size_t len, cap;
    bool oom;
} jbuf;

static void jput(jbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void jput(jbuf *b, const char *fmt, ...)
{
    for (int tries = 0; !b->oom && tries < 2; tries++) {
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
        size_t cap = b->cap ? b->cap : 1024;
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

/* A JSON string of s (len bytes): escaped; bytes outside printable ASCII
 * as \u00XX (the page shows them; binary keys stay distinguishable). */
static void jstr(jbuf *b, const void *s, size_t len)
{
    const unsigned char *p = s;
    jput(b, "\"");
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '"' || p[i] == '\\')
            jput(b, "\\%c", p[i]);
        else if (p[i] < 0x20 || p[i] >= 0x7f)
            jput(b, "\\u%04x", p[i]);
        else
            jput(b, "%c", p[i]);
    }
    jput(b, "\"");
}

static void jcstr(jbuf *b, const char *s)
{
    jstr(b, s ? s : "", s ? strlen(s) : 0);
}

/* ---- sampling ---- */

static const char *stat_of(const Kv__StatsReply *s, const char *name)
{
    for (size_t i = 0; i < s->n_stats; i++)
        if (strcmp(s->stats[i]->name, name) == 0)
            return s->stats[i]->value;
    return NULL;
}

static uint64_t stat_u64(const Kv__StatsReply *s, const char *name)
{
    const char *v = stat_of(s, name);
    return v ? strtoull(v, NULL, 10) : 0;
}

static dash_node *node_slot(router_dash *d, const char *id)
{
    for (size_t i = 0; i < d->nnodes; i++)
        if (strcmp(d->nodes[i].id, id) == 0)
            return &d->nodes[i];
    if (d->nnodes == DASH_MAX_NODES)
        return NULL;
    dash_node *n = &d->nodes[d->nnodes++];
    memset(n, 0, sizeof(*n));
    snprintf(n->id, sizeof(n->id), "%s", id);
    return n;
}

static void record(router_dash *d, const char *id, const Kv__StatsReply *s, uint64_t now)
{
    pthread_mutex_lock(&d->mu);
    dash_node *n = node_slot(d, id);
    if (n) {
        dash_sample x = {.t_ms = now, .ok = s != NULL, .load_admit = -1};
        if (s) {
            x.ops = stat_u64(s, "gets") + stat_u64(s, "puts") + stat_u64(s, "deletes");
            x.reads_mem = stat_u64(s, "reads.memory");
            x.reads_fd = stat_u64(s, "reads.fast");
            x.reads_sd = stat_u64(s, "reads.slow");
            x.reads_miss = stat_u64(s, "reads.miss");
            x.mem_bytes = stat_u64(s, "mem_bytes");
            x.items = stat_u64(s, "keys");
            const char *la = stat_of(s, "nhc.load_admit");
            x.load_admit = la ? strtod(la, NULL) : -1;
            const char *sv = stat_of(s, "serving"), *ns = stat_of(s, "nhc.state");
            snprintf(n->serving, sizeof(n->serving), "%s", sv ? sv : "?");
            snprintf(n->nhc_state, sizeof(n->nhc_state), "%s", ns ? ns : "off");
        } else {
            snprintf(n->serving, sizeof(n->serving), "unreachable");
        }
        if (n->n < DASH_POINTS) {
            n->s[(n->head + n->n++) % DASH_POINTS] = x;
        } else {
            n->s[n->head] = x;
            n->head = (n->head + 1) % DASH_POINTS;
        }
    }
    pthread_mutex_unlock(&d->mu);
}

/* One admin.Stats (verbose: the per-tier reads) to every node at once. */
static void sample_nodes(router_dash *d, cmap *m)
{
    router *r = d->r;
    size_t nn = cmap_node_count(m);
    fanout *f = fan_create((int)nn);
    rpc_reply *reps = calloc(nn ? nn : 1, sizeof(*reps));
    bool *have = calloc(nn ? nn : 1, sizeof(*have));
    if (f && reps && have) {
        Kv__StatsRequest req = KV__STATS_REQUEST__INIT;
        req.verbose = true;
        for (size_t i = 0; i < nn; i++)
            fan_send(f, router_chan(r, cmap_node_at(m, i)->addr), "admin.Stats", 0, &req.base,
                     DASH_PERIOD_MS - 100);
        fan_wait(f, (int)nn, DASH_PERIOD_MS - 100);
        fan_take(f, reps, have);
        uint64_t now = kv_wall_ms();
        for (size_t i = 0; i < nn; i++) {
            Kv__StatsReply *s = have[i] && reps[i].status == KV_OK
                                    ? kv__stats_reply__unpack(NULL, reps[i].len, reps[i].body)
                                    : NULL;
            record(d, cmap_node_at(m, i)->id, s, now);
            if (s)
                kv__stats_reply__free_unpacked(s, NULL);
            if (have[i])
                rpc_reply_free(&reps[i]);
        }
    }
    if (f)
        fan_release(f);
    free(reps);
    free(have);
}

/* The cluster's hot keys: router_h_hot_keys run in-process (it asks every
 * node for its merged view), kept as JSON. */
static void sample_hot(router_dash *d)
{
    Kv__HotKeysRequest req = KV__HOT_KEYS_REQUEST__INIT;
    req.top = DASH_HOT_TOP;
    uint8_t body[16];
    size_t len = kv__hot_keys_request__pack(&req, body);
    rpc_ctx c = {.method = "admin.HotKeys",
                 .deadline_ns = kv_now_ns() + 900000000ull,
                 .worker = -1,
                 .user = d->r};
    jbuf b = {0};
    jput(&b, "[");
    if (router_h_hot_keys(&c, body, len) == KV_OK) {
        Kv__HotKeysReply *rep = kv__hot_keys_reply__unpack(NULL, c.reply_len, c.reply);
        for (size_t i = 0; rep && i < rep->n_keys; i++) {
            const Kv__HotKeyInfo *k = rep->keys[i];
            jput(&b, "%s{\"key\":", i ? "," : "");
            jstr(&b, k->key.data, k->key.len);
            jput(&b, ",\"ops_per_s\":%.1f,\"pinned\":%s,\"nodes\":[", k->ops_per_s,
                 k->pinned ? "true" : "false");
            for (size_t j = 0; j < k->n_nodes; j++) {
                jput(&b, "%s", j ? "," : "");
                jcstr(&b, k->nodes[j]);
            }
            jput(&b, "]}");
        }
        if (rep)
            kv__hot_keys_reply__free_unpacked(rep, NULL);
    }
    free(c.reply);
    jput(&b, "]");
    pthread_mutex_lock(&d->mu);
    free(d->hot_json);
    d->hot_json = b.oom ? NULL : b.p;
    pthread_mutex_unlock(&d->mu);
    if (b.oom)
        free(b.p);
}

/* The transition's streams and their progress (admin.StreamStatus to each
 * stream's target), as kvctl status shows them; NULL without a transition. */
static void sample_migration(router_dash *d, cmap *m)
{
    const Kv__Transition *t = cmap_transition(m);
    char *json = NULL;
    if (t) {
        jbuf b = {0};
        jput(&b, "[");
        for (size_t i = 0; i < t->n_streams; i++) {
            const Kv__StreamPlan *p = t->streams[i];
            int dst = cmap_find(m, p->target);
            const Kv__StreamProgress *pr = NULL;
            Kv__StreamStatusReply *st = NULL;
            rpc_reply rep = {0};
            rpc_chan *ch = dst >= 0 ? router_chan(d->r, cmap_node_at(m, (size_t)dst)->addr) : NULL;
            Kv__StreamStatusRequest req = KV__STREAM_STATUS_REQUEST__INIT;
            char *ids[1] = {p->id};
            req.n_ids = 1;
            req.ids = ids;
            if (ch && rpc_call(ch, "admin.StreamStatus", 0, &req.base, 500, &rep) == KV_OK)
                st = kv__stream_status_reply__unpack(NULL, rep.len, rep.body);
            for (size_t k = 0; st && k < st->n_streams && !pr; k++)
                if (strcmp(st->streams[k]->id, p->id) == 0)
                    pr = st->streams[k];
            jput(&b, "%s{\"id\":", i ? "," : "");
            jcstr(&b, p->id);
            jput(&b, ",\"source\":");
            jcstr(&b, p->source);
            jput(&b, ",\"target\":");
            jcstr(&b, p->target);
            jput(&b, ",\"state\":");
            jcstr(&b, pr ? pr->state : "unknown");
            jput(&b,
                 ",\"keys\":%llu,\"bytes\":%llu,\"est_bytes\":%llu,\"rate_bps\":%.0f,"
                 "\"error\":",
                 (unsigned long long)(pr ? pr->keys : 0), (unsigned long long)(pr ? pr->bytes : 0),
                 (unsigned long long)(pr ? pr->est_bytes : 0), pr ? pr->rate_bps : 0.0);
            jcstr(&b, pr && pr->error ? pr->error : "");
            jput(&b, "}");
            if (st)
                kv__stream_status_reply__free_unpacked(st, NULL);
            rpc_reply_free(&rep);
        }
        jput(&b, "]");
        if (b.oom)
            free(b.p);
        else
            json = b.p;
    }
    pthread_mutex_lock(&d->mu);
    free(d->mig_json);
    d->mig_json = json;
    pthread_mutex_unlock(&d->mu);
}

static void *dash_main(void *arg)
{
    router_dash *d = arg;
    while (!atomic_load(&d->stop)) {
        uint64_t t0 = kv_now_ns();
        cmap *m = cmap_slot_get(d->r->maps);
        if (m) {
            sample_nodes(d, m);
            sample_hot(d);
            sample_migration(d, m);
        }
        cmap_unref(m);
        while (!atomic_load(&d->stop) && kv_now_ns() - t0 < DASH_PERIOD_MS * 1000000ull) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

kv_err router_dash_start(router *r)
{
    router_dash *d = calloc(1, sizeof(*d));
    if (!d || !(d->nodes = calloc(DASH_MAX_NODES, sizeof(*d->nodes)))) {
        free(d);
        return KV_RESOURCE_EXHAUSTED;
    }
    d->r = r;
    pthread_mutex_init(&d->mu, NULL);
    if (pthread_create(&d->thread, NULL, dash_main, d) != 0) {
        free(d->nodes);
        free(d);
        return KV_RESOURCE_EXHAUSTED;
    }
    d->started = true;
    r->dash = d;
    return KV_OK;
}

void router_dash_stop(router *r)
{
    router_dash *d = r->dash;
    if (!d)
        return;
    atomic_store(&d->stop, true);
    if (d->started)
        pthread_join(d->thread, NULL);
    pthread_mutex_destroy(&d->mu);
    free(d->nodes);
    free(d->hot_json);
    free(d->mig_json);
    free(d);
    r->dash = NULL;
}

/* ---- handlers ---- */

static void reply_json(kv_http_res *res, jbuf *b)
{
    if (b->oom) {
        free(b->p);
        res->status = 500;
        return;
    }
    res->content_type = "application/json";
    res->body = b->p;
    res->len = b->len;
}

static void h_page(void *arg, const char *path, const char *query, kv_http_res *res)
{
    if (strcmp(path, "/") != 0 && strcmp(path, "/index.html") != 0) {
        res->status = 404;
        return;
    }
    res->body = malloc(sizeof(dashboard_html));
    if (!res->body) {
        res->status = 500;
        return;
    }
    memcpy(res->body, dashboard_html, sizeof(dashboard_html));
    res->len = sizeof(dashboard_html);
    res->content_type = "text/html; charset=utf-8";
}

static void api_cluster(router_dash *d, jbuf *b)
{
    router *r = d->r;
    cmap *m = cmap_slot_get(r->maps);
    char why[256];
    bool ok = router_healthy(r, why, sizeof(why));
    jput(b, "{\"router\":{\"listen\":");
    jcstr(b, r->cfg.listen);
    jput(b, ",\"uptime_s\":%.0f,\"healthy\":%s,\"detail\":",
         (double)(kv_now_ns() - r->started_ns) / 1e9, ok ? "true" : "false");
    jcstr(b, why);
    jput(b, "},\"epoch\":%llu,\"rf\":%u,\"nodes\":[", (unsigned long long)(m ? cmap_epoch(m) : 0),
         m ? cmap_rf(m) : 0);
    size_t nn = m ? cmap_node_count(m) : 0;
    double *share = calloc(nn ? nn : 1, sizeof(double)),
           *next = calloc(nn ? nn : 1, sizeof(double));
    if (m && share && next) {
        cmap_shares(m, false, share);
        cmap_shares(m, true, next);
    }
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < nn; i++) {
        const cmap_node *n = cmap_node_at(m, i);
        uint64_t since;
        double rtt;
        const char *view = router_probe_view(r, n->id, &since, &rtt);
        const dash_node *dn = NULL;
        for (size_t k = 0; k < d->nnodes && !dn; k++)
            if (strcmp(d->nodes[k].id, n->id) == 0)
                dn = &d->nodes[k];
        const dash_sample *last = dn && dn->n ? &dn->s[(dn->head + dn->n - 1) % DASH_POINTS] : NULL;
        jput(b, "%s{\"id\":", i ? "," : "");
        jcstr(b, n->id);
        jput(b, ",\"addr\":");
        jcstr(b, n->addr);
        jput(b, ",\"state\":\"%s\",\"view\":\"%s\",\"serving\":", cmap_state_name(n->state), view);
        jcstr(b, dn ? dn->serving : "?");
        jput(b, ",\"nhc\":");
        jcstr(b, dn ? dn->nhc_state : "off");
        jput(b,
             ",\"weight\":%u,\"share\":%.6f,\"next_share\":%.6f,\"ping_ms\":%.2f,"
             "\"mem_bytes\":%llu,\"items\":%llu}",
             n->weight, share ? share[i] : 0, next ? next[i] : 0, rtt,
             (unsigned long long)(last ? last->mem_bytes : 0),
             (unsigned long long)(last ? last->items : 0));
    }
    jput(b, "],\"transition\":");
    const Kv__Transition *t = m ? cmap_transition(m) : NULL;
    if (t) {
        jput(b, "{\"kind\":");
        jcstr(b, t->kind);
        jput(b, ",\"nodes\":[");
        for (size_t i = 0; i < t->n_nodes; i++) {
            jput(b, "%s", i ? "," : "");
            jcstr(b, t->nodes[i]);
        }
        jput(b, "],\"from_epoch\":%llu,\"age_s\":%.0f,\"streams\":%s}",
             (unsigned long long)t->from_epoch, (double)(kv_wall_ms() - t->started_ms) / 1000.0,
             d->mig_json ? d->mig_json : "[]");
    } else {
        jput(b, "null");
    }
    pthread_mutex_unlock(&d->mu);
    jput(b, "}");
    free(share);
    free(next);
    cmap_unref(m);
}

/* Rates between consecutive samples: a point per second and node (hit
 * ratios -1 when the node served no read in the interval, load_admit -1
 * without an NHC scheduler). */
static void api_series(router_dash *d, jbuf *b)
{
    jput(b, "{\"interval_ms\":%d,\"nodes\":{", DASH_PERIOD_MS);
    pthread_mutex_lock(&d->mu);
    for (size_t i = 0; i < d->nnodes; i++) {
        const dash_node *n = &d->nodes[i];
        jput(b, "%s", i ? "," : "");
        jcstr(b, n->id);
        jput(b, ":[");
        bool first = true;
        for (size_t k = 1; k < n->n; k++) {
            const dash_sample *p = &n->s[(n->head + k - 1) % DASH_POINTS];
            const dash_sample *x = &n->s[(n->head + k) % DASH_POINTS];
            if (!x->ok || !p->ok || x->t_ms <= p->t_ms || x->ops < p->ops)
                continue; /* a gap or a restart (counters went back) */
            double dt = (double)(x->t_ms - p->t_ms) / 1000.0;
            uint64_t rm = x->reads_mem - p->reads_mem, rf = x->reads_fd - p->reads_fd;
            uint64_t rs = x->reads_sd - p->reads_sd, miss = x->reads_miss - p->reads_miss;
            double reads = (double)(rm + rf + rs + miss);
            jput(b,
                 "%s{\"t\":%llu,\"ops\":%.1f,\"hit_mem\":%.4f,\"hit_fast\":%.4f,"
                 "\"hit_slow\":%.4f,\"load_admit\":%s%.3f}",
                 first ? "" : ",", (unsigned long long)x->t_ms, (double)(x->ops - p->ops) / dt,
                 reads ? (double)rm / reads : -1, reads ? (double)rf / reads : -1,
                 reads ? (double)rs / reads : -1, "", x->load_admit);
            first = false;
        }
        jput(b, "]");
    }
    pthread_mutex_unlock(&d->mu);
    jput(b, "}}");
}

static void h_api(void *arg, const char *path, const char *query, kv_http_res *res)
{
    router_dash *d = ((router *)arg)->dash;
    jbuf b = {0};
    if (strcmp(path, "/api/cluster") == 0) {
        api_cluster(d, &b);
    } else if (strcmp(path, "/api/series") == 0) {
        api_series(d, &b);
    } else if (strcmp(path, "/api/hotkeys") == 0) {
        pthread_mutex_lock(&d->mu);
        jput(&b, "{\"keys\":%s}", d->hot_json ? d->hot_json : "[]");
        pthread_mutex_unlock(&d->mu);
    } else {
        res->status = 404;
        jput(&b, "{\"error\":\"no such API: /api/cluster, /api/series, /api/hotkeys\"}");
    }
    reply_json(res, &b);
}

size_t router_dash_routes(router *r, kv_http_route *routes, size_t cap)
{
    if (cap < 3)
        return 0;
    routes[0] = (kv_http_route){"/", h_page, r};
    routes[1] = (kv_http_route){"/index.html", h_page, r};
    routes[2] = (kv_http_route){"/api/", h_api, r};
    return 3;
}
