/* SPDX-License-Identifier: MIT */
/*
 * Per-method request counters (by status) and latency histograms of an RPC
 * server, fed by rpc_server_opts.observe (rpc_metrics_observe) and listed
 * in a typed statistics list (proto/stats.h) for admin.Stats and /metrics:
 *   PREFIX_requests_total{method,code}      counter
 *   PREFIX_request_duration_seconds{method} histogram
 * and, in admin.Stats, rpc.METHOD = "count=.. mean_ms=.. p50_ms=.. p99_ms=.."
 * for each method called at least once. Lock-free after creation.
 */
#ifndef KV_PROTO_RPC_METRICS_H
#define KV_PROTO_RPC_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "proto/rpc.h"
#include "proto/stats.h"

typedef struct rpc_metrics rpc_metrics;

/* For a server with these methods (borrowed: they must outlive it).
 * RESOURCE_EXHAUSTED when out of memory. */
kv_err rpc_metrics_create(rpc_metrics **out, const rpc_method *methods, size_t n);
void rpc_metrics_destroy(rpc_metrics *m);
/* The rpc_server_opts.observe function (arg = the rpc_metrics). */
void rpc_metrics_observe(void *arg, size_t method, kv_err status, uint64_t ns);
/* Appends the figures to l; prefix e.g. "hotkv_node". NULL m: nothing. */
void rpc_metrics_stats(const rpc_metrics *m, kv_stats *l, const char *prefix);
/* Appends the admission counters of server s (nothing for NULL) as
 * admin.Stats rpc.calls, rpc.expired, rpc.shed, rpc.inflight and
 * rpc.max_inflight, and /metrics PREFIX_rpc_calls_received_total,
 * PREFIX_rpc_expired_total, PREFIX_rpc_shed_total, PREFIX_rpc_inflight_calls
 * and PREFIX_rpc_max_inflight_calls. */
void rpc_server_stats(const rpc_server *s, kv_stats *l, const char *prefix);
/* Calls of method name so far, all statuses (0 for an unknown name). */
uint64_t rpc_metrics_calls(const rpc_metrics *m, const char *name);

#endif
