/* SPDX-License-Identifier: MIT */
/*
 * The process's RPC timer thread (see rpc_timer.h). Armed entries form one
 * unsorted list under one mutex: there is one entry per channel, a handful
 * per process, and the thread scans them on each wake-up. It sleeps on a
 * CLOCK_MONOTONIC condition variable until the earliest due time (or until
 * an entry is armed), then runs every entry that is due with the mutex
 * released, marking it running so that rpc_timer_cancel can wait for it.
 * The thread lives as long as the process. rpc_timer_cancel unlinks an
 * entry again after each run of its fn (which may have armed it), until it
 * is neither armed nor running.
 */
#include "proto/rpc_timer.h"

#include <pthread.h>
#include <time.h>

#include "common/clock.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* protects every field of the entries */
static pthread_cond_t cv;      /* an entry was armed earlier than the thread's sleep */
static pthread_cond_t done_cv; /* an entry's fn returned */
static rpc_timer_ent *armed;
static bool started;

/* The next due entry (unlinked, marked running) or NULL, with *wait_ns the
 * time to sleep (mu held). */
static rpc_timer_ent *next_due(uint64_t now, uint64_t *wait_ns)
{
    *wait_ns = UINT64_MAX;
    for (rpc_timer_ent **p = &armed; *p; p = &(*p)->next) {
        rpc_timer_ent *e = *p;
        if (e->due_ns <= now) {
            *p = e->next;
            e->next = NULL;
            e->due_ns = 0;
            e->running++;
            return e;
        }
        if (e->due_ns - now < *wait_ns)
            *wait_ns = e->due_ns - now;
    }
    return NULL;
}

static void *timer_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        uint64_t wait;
        rpc_timer_ent *e = next_due(kv_now_ns(), &wait);
        if (e) {
            pthread_mutex_unlock(&mu);
            e->fn(e->arg);
            pthread_mutex_lock(&mu);
            e->running--;
            pthread_cond_broadcast(&done_cv);
            continue;
        }
        if (wait == UINT64_MAX) {
            pthread_cond_wait(&cv, &mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + wait;
        ts.tv_sec += (time_t)(ns / 1000000000ull);
        ts.tv_nsec = (long)(ns % 1000000000ull);
        pthread_cond_timedwait(&cv, &mu, &ts);
    }
    return NULL;
}

static void start(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &a);
    pthread_condattr_destroy(&a);
    pthread_cond_init(&done_cv, NULL);
    pthread_t t;
    pthread_attr_t ta;
    pthread_attr_init(&ta);
    pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&t, &ta, timer_main, NULL) == 0;
    pthread_attr_destroy(&ta);
}

bool rpc_timer_arm(rpc_timer_ent *e, uint64_t due_ns)
{
    pthread_once(&once, start);
    if (!started)
        return false;
    pthread_mutex_lock(&mu);
    if (!e->due_ns) {
        e->next = armed;
        armed = e;
    }
    if (!e->due_ns || due_ns < e->due_ns) {
        e->due_ns = due_ns ? due_ns : 1;
        pthread_cond_signal(&cv);
    }
    pthread_mutex_unlock(&mu);
    return true;
}

void rpc_timer_cancel(rpc_timer_ent *e)
{
    pthread_mutex_lock(&mu);
    /* a running fn may arm e again before it returns: unlink after it did
     * (its owner stops it from arming once it is being cancelled) */
    for (;;) {
        for (rpc_timer_ent **p = &armed; *p; p = &(*p)->next)
            if (*p == e) {
                *p = e->next;
                break;
            }
        e->due_ns = 0;
        e->next = NULL;
        if (!e->running)
            break;
        pthread_cond_wait(&done_cv, &mu);
    }
    pthread_mutex_unlock(&mu);
}
