/* SPDX-License-Identifier: MIT */
/* Per-method RPC counters and latency histograms (rpc_metrics.h). */
#include "proto/rpc_metrics.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct method_metrics {
    _Atomic uint64_t by_code[KV_ERR_COUNT_ + 1]; /* last: codes outside the list */
    prom_hist lat;
} method_metrics;

struct rpc_metrics {
    const rpc_method *methods;
    size_t n;
    method_metrics m[];
};

kv_err rpc_metrics_create(rpc_metrics **out, const rpc_method *methods, size_t n)
{
    rpc_metrics *m = calloc(1, sizeof(*m) + n * sizeof(method_metrics));
    if (!m)
        return KV_RESOURCE_EXHAUSTED;
    m->methods = methods;
    m->n = n;
    *out = m;
    return KV_OK;
}

void rpc_metrics_destroy(rpc_metrics *m)
{
    free(m);
}

void rpc_metrics_observe(void *arg, size_t method, kv_err status, uint64_t ns)
{
    rpc_metrics *m = arg;
    if (method >= m->n)
        return;
    unsigned code = (unsigned)status < KV_ERR_COUNT_ ? (unsigned)status : KV_ERR_COUNT_;
    atomic_fetch_add_explicit(&m->m[method].by_code[code], 1, memory_order_relaxed);
    prom_hist_observe(&m->m[method].lat, ns);
}

static uint64_t calls_of(const method_metrics *mm)
{
    uint64_t t = 0;
    for (unsigned c = 0; c <= KV_ERR_COUNT_; c++)
        t += atomic_load_explicit(&mm->by_code[c], memory_order_relaxed);
    return t;
}

uint64_t rpc_metrics_calls(const rpc_metrics *m, const char *name)
{
    for (size_t i = 0; m && i < m->n; i++)
        if (strcmp(m->methods[i].name, name) == 0)
            return calls_of(&m->m[i]);
    return 0;
}

void rpc_metrics_stats(const rpc_metrics *m, kv_stats *l, const char *prefix)
{
    if (!m)
        return;
    char metric[128], key[128], lab[256], ml[160];
    snprintf(metric, sizeof(metric), "%s_requests_total", prefix);
    for (size_t i = 0; i < m->n; i++) {
        kv_stat_label(ml, sizeof(ml), "method", m->methods[i].name);
        for (unsigned c = 0; c <= KV_ERR_COUNT_; c++) {
            uint64_t v = atomic_load_explicit(&m->m[i].by_code[c], memory_order_relaxed);
            if (!v && c != KV_OK) /* OK always, so every method has a series */
                continue;
            snprintf(lab, sizeof(lab), "%s,code=\"%s\"", ml,
                     c < KV_ERR_COUNT_ ? kv_err_name((kv_err)c) : "OTHER");
            kv_stat_counter(l, NULL, metric, lab, "Requests served, by method and status code.", v);
        }
    }
    snprintf(metric, sizeof(metric), "%s_request_duration_seconds", prefix);
    for (size_t i = 0; i < m->n; i++) {
        kv_stat_label(ml, sizeof(ml), "method", m->methods[i].name);
        snprintf(key, sizeof(key), "rpc.%s", m->methods[i].name);
        kv_stat_hist(l, calls_of(&m->m[i]) ? key : NULL, metric, ml,
                     "Time from a request's start on a worker to its reply, by method.",
                     &m->m[i].lat);
    }
}

void rpc_server_stats(const rpc_server *s, kv_stats *l, const char *prefix)
{
    if (!s)
        return;
    rpc_server_counters k;
    rpc_server_counters_get(s, &k);
    char metric[128];
    snprintf(metric, sizeof(metric), "%s_rpc_messages_received_total", prefix);
    kv_stat_counter(l, "rpc.messages", metric, NULL,
                    "Requests received, admitted or not; an rpc.Calls message of coalesced calls "
                    "counts once (calls over messages: how many calls a message carries).",
                    k.messages);
    snprintf(metric, sizeof(metric), "%s_rpc_calls_received_total", prefix);
    kv_stat_counter(l, "rpc.calls", metric, NULL,
                    "Calls received (each call of an rpc.Calls message counts), admitted or not.",
                    k.calls);
    snprintf(metric, sizeof(metric), "%s_rpc_expired_total", prefix);
    kv_stat_counter(l, "rpc.expired", metric, NULL,
                    "Calls dropped unrun because their deadline passed while they waited "
                    "(answered DEADLINE_EXCEEDED).",
                    k.expired);
    snprintf(metric, sizeof(metric), "%s_rpc_shed_total", prefix);
    kv_stat_counter(l, "rpc.shed", metric, NULL,
                    "Calls refused on arrival with RESOURCE_EXHAUSTED because the server was at "
                    "its in-flight limit (overload).",
                    k.shed);
    snprintf(metric, sizeof(metric), "%s_rpc_inline_calls_total", prefix);
    kv_stat_counter(l, "rpc.inline", metric, NULL,
                    "Calls served on the thread that received them, without a worker (reads "
                    "and writes of records in memory).",
                    k.inline_served);
    snprintf(metric, sizeof(metric), "%s_rpc_async_calls_total", prefix);
    kv_stat_counter(l, "rpc.async", metric, NULL,
                    "Calls started on the thread that received them and completed by the "
                    "replies they waited for, without a waiting worker (forwards).",
                    k.async_started);
    snprintf(metric, sizeof(metric), "%s_rpc_async_handoffs_total", prefix);
    kv_stat_counter(l, "rpc.async_handoffs", metric, NULL,
                    "Asynchronous calls whose rest had to block and ran on a worker.",
                    k.async_handoffs);
    snprintf(metric, sizeof(metric), "%s_rpc_accepts_refused_total", prefix);
    kv_stat_counter(l, "rpc.accepts_refused", metric, NULL,
                    "Connections closed as soon as they were accepted because the process was "
                    "out of file descriptors (raise the open-files limit).",
                    k.accepts_refused);
    snprintf(metric, sizeof(metric), "%s_rpc_inflight_calls", prefix);
    kv_stat_gauge(l, "rpc.inflight", metric, NULL, "Calls admitted and not answered yet.",
                  k.inflight);
    snprintf(metric, sizeof(metric), "%s_rpc_max_inflight_calls", prefix);
    kv_stat_gauge(l, "rpc.max_inflight", metric, NULL,
                  "The in-flight limit beyond which calls are shed (--max-inflight).",
                  k.max_inflight);
}
