/* SPDX-License-Identifier: MIT */
/*
 * Stream jobs as kvctl drives them (node add/remove/replace/weight, repair):
 * start them on their target nodes (admin.StreamStart, idempotent by job
 * id), then poll admin.StreamStatus once a second and show the progress: a
 * bar on a terminal, one line a second otherwise, one JSON object a second
 * with --json. Ctrl-C stops kvctl, not the jobs: they run on the nodes and a
 * rerun of the command picks them up.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvctl_stream.h"
#include "common/clock.h"

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

void kvctl_catch_sigint(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

bool kvctl_interrupted(void)
{
    return interrupted != 0;
}

/* The stream jobs of m's transition, as kvctl watches them. */
kvctl_stream *kvctl_transition_streams(const cmap *m, size_t *n)
{
    const Kv__Transition *t = cmap_transition(m);
    kvctl_stream *s = calloc(t->n_streams ? t->n_streams : 1, sizeof(*s));
    for (size_t i = 0; s && i < t->n_streams; i++) {
        const Kv__StreamPlan *p = t->streams[i];
        int src = cmap_find(m, p->source), dst = cmap_find(m, p->target);
        kv__stream_job__init(&s[i].job);
        s[i].job.id = p->id;
        s[i].job.source_id = p->source;
        s[i].job.source_addr = (char *)cmap_node_at(m, (size_t)src)->addr;
        s[i].job.n_ranges = p->n_ranges;
        s[i].job.ranges = p->ranges;
        s[i].job.mbps = t->stream_mbps;
        s[i].job.epoch = cmap_epoch(m);
        s[i].source = p->source;
        s[i].target = p->target;
        s[i].target_addr = cmap_node_at(m, (size_t)dst)->addr;
    }
    *n = t->n_streams;
    return s;
}

/* Starts the jobs of target t (all streams s[i] with that target). */
static int start_target(kvctl_env *env, kvctl_stream *s, size_t n, const char *target)
{
    Kv__StreamJob **jobs = calloc(n, sizeof(*jobs));
    size_t k = 0;
    const char *addr = NULL;
    for (size_t i = 0; jobs && i < n; i++)
        if (strcmp(s[i].target, target) == 0) {
            jobs[k++] = &s[i].job;
            addr = s[i].target_addr;
        }
    if (!jobs || !k) {
        free(jobs);
        return jobs ? KVCTL_OK : kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    }
    Kv__StreamStartRequest req = KV__STREAM_START_REQUEST__INIT;
    req.n_jobs = k;
    req.jobs = jobs;
    rpc_chan *ch = kvctl_open_chan(env, addr);
    rpc_reply rep;
    int code =
        ch ? kvctl_call(env, ch, "admin.StreamStart", &req.base, 0, &rep, false) : KVCTL_USAGE;
    if (code == KVCTL_OK)
        rpc_reply_free(&rep);
    rpc_chan_close(ch);
    free(jobs);
    return code;
}

int kvctl_streams_start(kvctl_env *env, kvctl_stream *s, size_t n)
{
    int code = KVCTL_OK;
    for (size_t i = 0; code == KVCTL_OK && i < n; i++) {
        bool first = true;
        for (size_t k = 0; k < i; k++)
            first &= strcmp(s[k].target, s[i].target) != 0;
        if (first)
            code = start_target(env, s, n, s[i].target);
    }
    return code;
}

/* Polls target's jobs into s; jobs the target does not know are restarted. */
static void poll_target(kvctl_env *env, kvctl_stream *s, size_t n, const char *target)
{
    const char *addr = NULL;
    for (size_t i = 0; i < n && !addr; i++)
        if (strcmp(s[i].target, target) == 0)
            addr = s[i].target_addr;
    Kv__StreamStatusRequest req = KV__STREAM_STATUS_REQUEST__INIT;
    rpc_chan *ch = kvctl_open_chan(env, addr);
    rpc_reply rep;
    if (!ch || kvctl_call(env, ch, "admin.StreamStatus", &req.base, 0, &rep, true) != KVCTL_OK) {
        for (size_t i = 0; i < n; i++)
            if (strcmp(s[i].target, target) == 0 && !s[i].done)
                snprintf(s[i].error, sizeof(s[i].error), "target %s does not answer", target);
        rpc_chan_close(ch);
        return;
    }
    Kv__StreamStatusReply *st = kv__stream_status_reply__unpack(NULL, rep.len, rep.body);
    bool restart = false;
    for (size_t i = 0; st && i < n; i++) {
        if (strcmp(s[i].target, target) != 0)
            continue;
        const Kv__StreamProgress *p = NULL;
        for (size_t k = 0; k < st->n_streams && !p; k++)
            if (strcmp(st->streams[k]->id, s[i].job.id) == 0)
                p = st->streams[k];
        if (!p) { /* unknown there (a wiped target): start it again */
            restart = !s[i].done;
            continue;
        }
        s[i].keys = p->keys;
        s[i].bytes = p->bytes;
        s[i].applied = p->applied;
        s[i].compared = p->compared;
        s[i].rate = p->rate_bps;
        s[i].est_bytes = p->est_bytes;
        s[i].est_keys = p->est_keys;
        s[i].done = strcmp(p->state, "DONE") == 0;
        snprintf(s[i].state, sizeof(s[i].state), "%s", p->state);
        snprintf(s[i].error, sizeof(s[i].error), "%s", p->error ? p->error : "");
    }
    if (st)
        kv__stream_status_reply__free_unpacked(st, NULL);
    rpc_reply_free(&rep);
    rpc_chan_close(ch);
    if (restart)
        start_target(env, s, n, target);
}

void kvctl_streams_poll(kvctl_env *env, kvctl_stream *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        bool first = true;
        for (size_t k = 0; k < i; k++)
            first &= strcmp(s[k].target, s[i].target) != 0;
        if (first)
            poll_target(env, s, n, s[i].target);
    }
}

void kvctl_streams_total(const kvctl_stream *s, size_t n, kvctl_totals *t)
{
    memset(t, 0, sizeof(*t));
    for (size_t i = 0; i < n; i++) {
        t->done += s[i].done;
        t->keys += s[i].keys;
        t->bytes += s[i].bytes;
        t->applied += s[i].applied;
        t->compared += s[i].compared;
        t->rate += s[i].done ? 0 : s[i].rate;
        t->est_bytes += s[i].est_bytes > s[i].bytes ? s[i].est_bytes : s[i].bytes;
    }
    t->n = n;
}

static void json_stream(const kvctl_stream *s, bool comma)
{
    double eta =
        s->rate > 0 && s->est_bytes > s->bytes ? (double)(s->est_bytes - s->bytes) / s->rate : 0;
    printf("%s{\"id\":\"%s\",\"source\":\"%s\",\"target\":\"%s\",\"state\":\"%s\","
           "\"keys\":%llu,\"bytes\":%llu,\"applied\":%llu,\"compared\":%llu,\"rate_bps\":%.0f,"
           "\"est_bytes\":%llu,\"eta_s\":%.1f,\"error\":",
           comma ? "," : "", s->job.id, s->source, s->target, s->state, (unsigned long long)s->keys,
           (unsigned long long)s->bytes, (unsigned long long)s->applied,
           (unsigned long long)s->compared, s->rate, (unsigned long long)s->est_bytes, eta);
    kvctl_json_str(s->error, strlen(s->error));
    printf("}");
}

void kvctl_streams_print_json(const kvctl_stream *s, size_t n)
{
    printf("[");
    for (size_t i = 0; i < n; i++)
        json_stream(&s[i], i > 0);
    printf("]");
}

void kvctl_human(double b, char *out, size_t len)
{
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(out, len, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
}

/* One progress report: a bar on a terminal, a line otherwise, JSON. */
static void report(kvctl_env *env, const char *what, const kvctl_stream *s, size_t n, bool tty,
                   double elapsed)
{
    kvctl_totals t;
    kvctl_streams_total(s, n, &t);
    double frac = t.est_bytes ? (double)t.bytes / (double)t.est_bytes : 0;
    frac = t.done == n ? 1 : frac > 0.99 ? 0.99 : frac;
    double eta = t.rate > 0 && t.est_bytes > t.bytes ? (double)(t.est_bytes - t.bytes) / t.rate : 0;
    if (env->json) {
        printf("{\"event\":\"progress\",\"what\":\"%s\",\"elapsed_s\":%.1f,\"streams_done\":%zu,"
               "\"streams\":%zu,\"keys\":%llu,\"bytes\":%llu,\"rate_bps\":%.0f,\"eta_s\":%.1f,"
               "\"detail\":",
               what, elapsed, t.done, n, (unsigned long long)t.keys, (unsigned long long)t.bytes,
               t.rate, eta);
        kvctl_streams_print_json(s, n);
        printf("}\n");
        fflush(stdout);
        return;
    }
    char b[32], r[32], err[260] = "";
    kvctl_human((double)t.bytes, b, sizeof(b));
    kvctl_human(t.rate, r, sizeof(r));
    for (size_t i = 0; i < n && !err[0]; i++)
        if (s[i].error[0] && !s[i].done)
            snprintf(err, sizeof(err), "  [%s: %s]", s[i].job.id, s[i].error);
    if (tty) {
        int w = 30, fill = (int)(frac * w);
        printf("\r\033[K%s [", what);
        for (int i = 0; i < w; i++)
            putchar(i < fill ? '#' : '-');
        printf("] %3.0f%%  %zu/%zu streams  %llu keys  %s  %s/s  ETA %.0f s%.60s", frac * 100,
               t.done, n, (unsigned long long)t.keys, b, r, eta, err);
    } else {
        printf("%s: %.0f%%, %zu/%zu streams done, %llu keys, %s, %s/s, ETA %.0f s%s\n", what,
               frac * 100, t.done, n, (unsigned long long)t.keys, b, r, eta, err);
    }
    fflush(stdout);
}

int kvctl_streams_wait(kvctl_env *env, kvctl_stream *s, size_t n, const char *what)
{
    bool tty = !env->json && isatty(STDOUT_FILENO);
    uint64_t t0 = kv_now_ns();
    for (;;) {
        kvctl_streams_poll(env, s, n);
        double elapsed = (double)(kv_now_ns() - t0) / 1e9;
        report(env, what, s, n, tty, elapsed);
        size_t done = 0;
        for (size_t i = 0; i < n; i++)
            done += s[i].done;
        if (done == n || kvctl_interrupted())
            break;
        for (int k = 0; k < 20 && !kvctl_interrupted(); k++)
            kv_sleep_ns(50000000ull);
    }
    if (tty)
        printf("\n");
    return kvctl_interrupted() ? KVCTL_INTERRUPTED : KVCTL_OK;
}
