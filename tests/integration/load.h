/* SPDX-License-Identifier: MIT */
/*
 * A checking load for the integration tests: writer threads put keys
 * "k%08d" (each key owned by one writer, so its values only grow: "c%010u"
 * with a per-key counter, padded to 100 bytes) and remember the last
 * acknowledged counter; reader threads read random keys and count a read
 * that returns an older counter than the one acknowledged before it began
 * (stale) or an error. Every loop is bounded by the stop flag.
 */
#ifndef KV_TESTS_LOAD_H
#define KV_TESTS_LOAD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "kv/kv.h"

#define KVT_LOAD_MAX_THREADS 16

typedef struct kvt_load_opts {
    const char *url; /* a router */
    const char *auth;
    int nkeys;
    int writers, readers;
    kv_consistency wcons, rcons;
    uint32_t timeout_ms; /* per call, default 5000 */
} kvt_load_opts;

typedef struct kvt_load {
    kvt_load_opts o;
    pthread_t th[KVT_LOAD_MAX_THREADS];
    int nth;
    atomic_bool stop;
    _Atomic uint32_t *acked; /* per key: last acknowledged counter, 0 = never written */
    _Atomic uint64_t writes, reads, write_errors, read_errors, stale;
    pthread_mutex_t mu; /* protects first_error */
    char first_error[300];
} kvt_load;

/* Allocates the key table and writes every key once (counter 1) in
 * batches. Returns KV_OK or the first error (message in first_error). */
kv_err kvt_load_init(kvt_load *l, const kvt_load_opts *o);
/* Starts the writer and reader threads. */
kv_err kvt_load_start(kvt_load *l);
/* Stops and joins them. */
void kvt_load_stop(kvt_load *l);
/* Reads every key from url at cons in batches; counts keys missing or
 * older than acknowledged (*stale) and failed reads (*errors). */
kv_err kvt_load_verify(kvt_load *l, const char *url, kv_consistency cons, uint64_t *stale,
                       uint64_t *errors);
/* The same for the keys want() accepts (a node read directly holds only
 * the keys it replicates). */
kv_err kvt_load_verify_some(kvt_load *l, const char *url, kv_consistency cons,
                            bool (*want)(void *arg, const char *key, size_t len), void *arg,
                            uint64_t *stale, uint64_t *errors);
/* Reads every key one by one through a smart client (kv_client_opts.direct)
 * opened at url, each request coordinated by the key's primary; counts as
 * kvt_load_verify does. */
kv_err kvt_load_verify_direct(kvt_load *l, const char *url, kv_consistency cons, uint64_t *stale,
                              uint64_t *errors);
void kvt_load_free(kvt_load *l);

#endif
