/* SPDX-License-Identifier: MIT */
#include "common/ticker.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

struct kv_ticker {
    kv_ticker_opts o;
    pthread_t thread;
    pthread_mutex_t mu; /* guards stop; pairs with cv */
    pthread_cond_t cv;  /* on CLOCK_MONOTONIC */
    bool stop;
};

static void *ticker_main(void *arg)
{
    kv_ticker *t = arg;
    if (t->o.thread_start)
        t->o.thread_start();
    pthread_mutex_lock(&t->mu);
    while (!t->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + t->o.period_ns;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        int rc = 0;
        while (!t->stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&t->cv, &t->mu, &ts);
        if (t->stop)
            break;
        pthread_mutex_unlock(&t->mu);
        t->o.fn(t->o.arg);
        pthread_mutex_lock(&t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    if (t->o.thread_stop)
        t->o.thread_stop();
    return NULL;
}

kv_err kv_ticker_start(kv_ticker **out, const kv_ticker_opts *o)
{
    kv_ticker *t = calloc(1, sizeof(*t));
    if (!t)
        return KV_RESOURCE_EXHAUSTED;
    t->o = *o;
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&t->thread, NULL, ticker_main, t) != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return KV_RESOURCE_EXHAUSTED;
    }
    *out = t;
    return KV_OK;
}

void kv_ticker_stop(kv_ticker *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stop = true;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
