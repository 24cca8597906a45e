/* SPDX-License-Identifier: MIT */
/*
 * kv_ticker: a thread of its own that calls fn(arg) once per period until it
 * is stopped, for periodic upkeep (the node's NHC scheduler, hot-key ageing).
 * fn runs on the ticker's thread only, never concurrently with itself; it
 * must guard what it shares with other threads. Stopping wakes the thread
 * at once and waits for a running fn to return.
 */
#ifndef KV_COMMON_TICKER_H
#define KV_COMMON_TICKER_H

#include <stdint.h>

#include "kv/kv_err.h"

typedef struct kv_ticker kv_ticker;

typedef struct kv_ticker_opts {
    uint64_t period_ns;
    void (*fn)(void *arg); /* called after each period */
    void *arg;
    void (*thread_start)(void); /* optional: first thing on the thread */
    void (*thread_stop)(void);  /* optional: last thing on the thread */
} kv_ticker_opts;

/* Starts the thread; RESOURCE_EXHAUSTED when it cannot. */
kv_err kv_ticker_start(kv_ticker **out, const kv_ticker_opts *o);
/* Stops and joins the thread, then frees t; NULL is a no-op. Not from fn. */
void kv_ticker_stop(kv_ticker *t);

#endif
