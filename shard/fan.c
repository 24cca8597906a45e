/* SPDX-License-Identifier: MIT */
/*
 * Fan-out of one request to several nodes at once, for replicated writes,
 * quorum reads and split batches (the router's and a coordinating node's). The handler thread waits
 * until enough replies are OK (or all are in, or the deadline passes) and returns, or, armed
 * (fan_arm), no thread waits and the reply that satisfies the waiter runs its continuation; the
 * fanout is reference counted, so replies that arrive after the handler returned are released by
 * the last callback.
 */
#include "shard/fan.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"

static void fan_free(fanout *f)
{
    if (f->late_free)
        f->late_free(f->late_arg);
    for (int i = 0; i < f->sent; i++)
        if (f->have[i])
            rpc_reply_free(&f->rep[i]);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

fanout *fan_create(int max)
{
    fanout *f =
        calloc(1, sizeof(*f) + (size_t)max * (sizeof(fan_slot) + sizeof(rpc_reply) + sizeof(bool)));
    if (!f)
        return NULL;
    f->max = max;
    f->slots = (fan_slot *)(f + 1);
    f->rep = (rpc_reply *)(f->slots + max);
    f->have = (bool *)(f->rep + max);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->refs = 1; /* the handler's */
    f->first_ok = -1;
    return f;
}

static void fan_done(void *arg, rpc_reply *r)
{
    fan_slot *s = arg;
    fanout *f = s->f;
    if (s->ctr) {
        atomic_fetch_add_explicit(&s->ctr->calls, 1, memory_order_relaxed);
        if (r->status == KV_UNAVAILABLE || r->status == KV_DEADLINE_EXCEEDED ||
            r->status == KV_CANCELLED)
            atomic_fetch_add_explicit(&s->ctr->errors, 1, memory_order_relaxed);
        prom_hist_observe(&s->ctr->lat, rpc_since_ns(s->t0));
    }
    pthread_mutex_lock(&f->mu);
    if (f->taken && f->late)
        f->late(f->late_arg, s->i, r, f->first_ok);
    if (r->status == KV_OK && f->first_ok < 0)
        f->first_ok = s->i;
    f->rep[s->i] = *r;
    f->have[s->i] = true;
    f->done++;
    if (r->status == KV_OK)
        f->ok++;
    if (r->status != KV_UNAVAILABLE && r->status != KV_DEADLINE_EXCEEDED &&
        r->status != KV_CANCELLED && r->status != KV_RESOURCE_EXHAUSTED)
        f->answered++; /* a verdict (RESOURCE_EXHAUSTED: the node shed the call) */
    pthread_cond_broadcast(&f->cv);
    /* an armed waiter holds its reference until its fire ran: this one is not the last */
    bool fire = f->fire && !f->fired && f->ready(f->fire_arg, f);
    f->fired |= fire;
    bool last = --f->refs == 0;
    pthread_mutex_unlock(&f->mu);
    if (fire)
        f->fire(f->fire_arg, true); /* may release the waiter's reference: f may go */
    else if (last)
        fan_free(f);
}

int fan_reserve(fanout *f)
{
    pthread_mutex_lock(&f->mu);
    int i = f->sent++;
    f->refs++;
    f->slots[i].f = f;
    f->slots[i].i = i;
    f->slots[i].ctr = NULL;
    pthread_mutex_unlock(&f->mu);
    return i;
}

void fan_complete(fanout *f, int i, rpc_reply *r)
{
    fan_done(&f->slots[i], r);
}

void fan_send(fanout *f, rpc_chan *ch, const char *method, uint64_t epoch,
              const ProtobufCMessage *msg, uint32_t deadline_ms)
{
    fan_send_ctr(f, ch, method, epoch, msg, deadline_ms, NULL);
}

void fan_send_ctr(fanout *f, rpc_chan *ch, const char *method, uint64_t epoch,
                  const ProtobufCMessage *msg, uint32_t deadline_ms, fan_ctr *ctr)
{
    int i = fan_reserve(f);
    if (ctr) { /* before the send: the reply may come at once on another thread */
        f->slots[i].t0 = rpc_now_ns();
        f->slots[i].ctr = ctr;
    }
    if (!ch) {
        rpc_reply r = {.status = KV_UNAVAILABLE, .message = strdup("no channel to the node")};
        fan_done(&f->slots[i], &r);
        return;
    }
    rpc_call_async(ch, method, epoch, msg, deadline_ms, fan_done, &f->slots[i]);
}

void fan_skip(fanout *f, kv_err status, const char *message)
{
    int i = fan_reserve(f);
    rpc_reply r = {.status = status, .message = strdup(message), .local = true};
    fan_done(&f->slots[i], &r);
}

static struct timespec abs_after(uint64_t wait_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + wait_ns;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    return ts;
}

int fan_wait_answers(fanout *f, int need, uint32_t wait_ms)
{
    struct timespec ts = abs_after((uint64_t)wait_ms * 1000000ull);
    pthread_mutex_lock(&f->mu);
    while (f->answered < need && f->done < f->sent)
        if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) != 0)
            break;
    int n = f->answered;
    pthread_mutex_unlock(&f->mu);
    return n;
}

bool fan_wait_slot(fanout *f, int i, uint32_t wait_ms)
{
    struct timespec ts = abs_after((uint64_t)wait_ms * 1000000ull);
    pthread_mutex_lock(&f->mu);
    while (i < f->sent && !f->have[i])
        if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) != 0)
            break;
    bool in = i < f->sent && f->have[i];
    pthread_mutex_unlock(&f->mu);
    return in;
}

void fan_wait(fanout *f, int need_ok, uint32_t deadline_ms)
{
    struct timespec ts = abs_after((uint64_t)deadline_ms * 1000000ull + 50000000ull);
    pthread_mutex_lock(&f->mu);
    while (f->ok < need_ok && f->done < f->sent)
        if (pthread_cond_timedwait(&f->cv, &f->mu, &ts) != 0)
            break;
    pthread_mutex_unlock(&f->mu);
}

int fan_take(fanout *f, rpc_reply *out, bool *have)
{
    pthread_mutex_lock(&f->mu);
    f->taken = true;
    int n = f->sent;
    for (int i = 0; i < n; i++) {
        have[i] = f->have[i];
        if (f->have[i]) {
            out[i] = f->rep[i];
            f->have[i] = false; /* ownership moves to the caller */
        }
    }
    pthread_mutex_unlock(&f->mu);
    return n;
}

void fan_release(fanout *f)
{
    pthread_mutex_lock(&f->mu);
    bool last = --f->refs == 0;
    pthread_mutex_unlock(&f->mu);
    if (last)
        fan_free(f);
}

bool fan_arm(fanout *f, fan_ready_fn ready, fan_fire_fn fire, void *arg, bool *now_ready)
{
    pthread_mutex_lock(&f->mu);
    *now_ready = ready(arg, f);
    bool now = *now_ready || f->poked;
    if (!now) {
        f->ready = ready;
        f->fire = fire;
        f->fire_arg = arg;
    }
    f->fired = now;
    pthread_mutex_unlock(&f->mu);
    return now;
}

int fan_answers(fanout *f)
{
    pthread_mutex_lock(&f->mu);
    int n = f->answered;
    pthread_mutex_unlock(&f->mu);
    return n;
}

void fan_poke(fanout *f)
{
    pthread_mutex_lock(&f->mu);
    f->poked = true;
    bool fire = f->fire && !f->fired;
    bool ready = fire && f->ready(f->fire_arg, f);
    f->fired |= fire;
    pthread_mutex_unlock(&f->mu);
    if (fire)
        f->fire(f->fire_arg, ready);
}

void fan_on_late(fanout *f, fan_late_fn fn, void *arg, void (*free_arg)(void *arg))
{
    pthread_mutex_lock(&f->mu);
    f->late = fn;
    f->late_arg = arg;
    f->late_free = free_arg;
    pthread_mutex_unlock(&f->mu);
}
