/* SPDX-License-Identifier: MIT */
/*
 * kvbench worker threads. Each worker owns a kv_client and --concurrency
 * request slots, and keeps every slot busy with the async API: a slot's
 * request is sent from the worker thread, its completion callback (a
 * library thread, which must not block) stamps the end time, pushes the slot
 * on the worker's lock-free completion stack and posts the worker's
 * semaphore; the worker pops the whole stack, records the result and reuses
 * the slot for the next op of its pre-drawn trace, restarting the slots it
 * took in one burst (kv_burst_begin/end: their calls leave as one message
 * per connection, as a pipelining client's would). So the callbacks never
 * touch a statistic and never send (a call that fails before it is sent
 * completes on the calling thread, which must not recurse).
 *
 * The stack is a Treiber stack with many producers (callbacks) and one
 * consumer that only ever takes the whole list with an exchange, so there is
 * no ABA: a node is pushed again only after the consumer has taken it.
 *
 * Loading (--load) uses the same machinery: worker t of T writes ids
 * order[t], order[t + T], ... of a random permutation, bounded by the key
 * count and by --load-seconds.
 *
 * A request refused with RESOURCE_EXHAUSTED (a server shedding load,
 * issue 16) counts as an error and its slot backs off before its next op:
 * 5 ms, doubling for each refusal in a row up to 1 s, with jitter, as a
 * gRPC client's retry backoff would; other outcomes reset it. Without that
 * the refused slots would resend at once and the refusals themselves would
 * take the servers' CPU.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench/kvbench/kvbench.h"
#include "common/clock.h"

/* ---- completion ------------------------------------------------------------- */

static void on_done(void *arg, kv_err err, const kv_result *res)
{
    kvb_slot *s = arg;
    kvb_worker *w = s->w; /* read before the push: the worker may reuse s at once */
    s->err = err;
    s->end_ns = kv_now_ns();
    s->msg[0] = '\0';
    if (err != KV_OK && err != KV_NOT_FOUND && res && res->message)
        snprintf(s->msg, sizeof(s->msg), "%s", res->message); /* valid only in here */
    kvb_slot *head = atomic_load_explicit(&w->done, memory_order_relaxed);
    do {
        s->next = head;
        /* CAS: publish s (and its err/end_ns, release) on top of the stack; on
         * failure head is reloaded and s->next rewritten. */
    } while (!atomic_compare_exchange_weak_explicit(&w->done, &head, s, memory_order_release,
                                                    memory_order_relaxed));
    /* Only the push onto an empty stack wakes the worker: the slots pushed
     * on top of it are taken by the same pop (take_done drains the
     * semaphore before it pops, so that pop comes after this post's count
     * or takes this slot). One futex wake per reply instead of one per
     * completion, which cost the generator more CPU than a GET costs
     * the node. */
    if (!head)
        sem_post(&w->sem);
}

/* Takes every completed slot (acquire pairs with the pushes' release). */
static kvb_slot *pop_all(kvb_worker *w)
{
    return atomic_exchange_explicit(&w->done, NULL, memory_order_acquire);
}

/* Takes the completed slots: every one pushed so far, and once more after a
 * yield when some are still out. The completions of one reply run back to
 * back on a library thread and the first one wakes this thread, so without
 * the second look the worker would restart the first few at once and the
 * rest a moment later: two messages where one would do (issue 15: 12 calls
 * per message instead of 19-20 at 2 x 25 in flight through a router). */
static kvb_slot *take_done(kvb_worker *w)
{
    /* Every completion posted the semaphore once and this takes them all:
     * drop their counts first, so the next wait sleeps instead of running
     * one empty pass (a pop and a yield) per completion taken here. A post
     * that comes after the drain belongs to a slot that this pop takes or
     * that is pushed later; either way the next wait wakes for it, at worst
     * once for nothing. */
    while (sem_trywait(&w->sem) == 0)
        ;
    kvb_slot *got = pop_all(w);
    size_t n = 0;
    for (const kvb_slot *s = got; s; s = s->next)
        n++;
    if (n >= (size_t)w->inflight)
        return got;
    sched_yield();
    kvb_slot *more = pop_all(w);
    if (!more)
        return got;
    kvb_slot *t = more;
    while (t->next)
        t = t->next;
    t->next = got;
    return more;
}

/* Waits up to 100 ms for a completion. */
static void wait_done(kvb_worker *w)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (sem_timedwait(&w->sem, &ts) != 0 && errno == EINTR)
        ;
}

/* ---- sending ------------------------------------------------------------------ */

static bool is_read(const kvb_slot *s)
{
    return s->type == WL_OP_READ || (s->type == WL_OP_RMW && s->stage == 0);
}

/* Sends s's current request; counts its key when measuring. */
static void send_slot(kvb_worker *w, kvb_slot *s)
{
    char key[WL_KEYSTR_MAX];
    size_t klen = wl_key_str(s->key, key, sizeof(key));
    if (!w->loading && w->sh->o->report_top > 0)
        kvb_counts_add(&w->counts[w->phase], s->key, 1);
    w->inflight++;
    if (is_read(s))
        kv_get_async(w->c, key, klen, on_done, s);
    else
        kv_put_async(w->c, key, klen, w->value, (size_t)w->sh->o->value_size, NULL, on_done, s);
}

/* The next op of this worker, or false when its phase is over. */
static bool next_op(kvb_worker *w, uint64_t now, wl_op *op)
{
    const kvb_shared *sh = w->sh;
    if (atomic_load_explicit(&sh->stop, memory_order_relaxed))
        return false;
    if (w->loading) {
        uint64_t i = w->idx + w->load_pos * (uint64_t)sh->o->threads;
        if (i >= (uint64_t)sh->o->keys || now >= sh->load_end_ns)
            return false;
        w->load_pos++;
        *op = (wl_op){sh->load_order[i], WL_OP_INSERT};
        return true;
    }
    if (now >= sh->end_ns || w->budget == 0)
        return false;
    if (w->phase == 0 && w->trace[1] && now >= sh->shift_ns) {
        w->phase = 1;
        w->pos = 0;
    }
    *op = w->trace[w->phase][w->pos];
    w->pos = (w->pos + 1) % (size_t)sh->o->trace_ops;
    w->budget--;
    return true;
}

/* Starts the next op in s; false when there is none. */
static bool start_op(kvb_worker *w, kvb_slot *s)
{
    uint64_t now = kv_now_ns();
    wl_op op;
    if (!next_op(w, now, &op))
        return false;
    s->key = op.key;
    s->type = op.type;
    s->stage = 0;
    s->start_ns = now;
    send_slot(w, s);
    return true;
}

/* ---- results -------------------------------------------------------------------- */

static void note_first_error(kvb_worker *w, const kvb_slot *s)
{
    if (w->first_error[0])
        return;
    char key[WL_KEYSTR_MAX];
    wl_key_str(s->key, key, sizeof(key));
    snprintf(w->first_error, sizeof(w->first_error), "%s %s: %s: %s",
             w->loading ? "load" : wl_op_name(s->type), key, kv_err_name(s->err), s->msg);
}

static void bump(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* The slot backs off after a RESOURCE_EXHAUSTED refusal (false: it did
 * not, and takes its next op at once). */
static bool defer(kvb_worker *w, kvb_slot *s)
{
    if (s->err != KV_RESOURCE_EXHAUSTED) {
        s->backoff_ns = 0;
        return false;
    }
    uint64_t b = s->backoff_ns ? s->backoff_ns * 2 : 5000000u;
    s->backoff_ns = b > 1000000000u ? 1000000000u : b;
    uint64_t x = s->end_ns ^ (uint64_t)(uintptr_t)s; /* jitter: a mix of time and slot */
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    uint64_t jitter = x % (s->backoff_ns / 2 + 1);
    s->ready_ns = s->end_ns + s->backoff_ns / 2 + jitter;
    w->deferred[w->ndeferred++] = s;
    return true;
}

/* Starts the next op of every deferred slot whose backoff is over. */
static void restart_deferred(kvb_worker *w)
{
    uint64_t now = kv_now_ns();
    for (size_t i = 0; i < w->ndeferred;) {
        kvb_slot *s = w->deferred[i];
        if (s->ready_ns > now) {
            i++;
            continue;
        }
        w->deferred[i] = w->deferred[--w->ndeferred];
        start_op(w, s);
    }
}

/* Records a finished op; returns false when it failed. */
static bool record(kvb_worker *w, const kvb_slot *s)
{
    bool ok = s->err == KV_OK || s->err == KV_NOT_FOUND;
    if (!ok)
        note_first_error(w, s);
    if (w->loading) {
        w->load_errors += !ok;
        bump(&w->load_done);
        return ok;
    }
    kvb_tl_add(w, s->end_ns, s->end_ns - s->start_ns, ok);
    if (!ok) {
        w->codes[(unsigned)s->err < KVB_NCODES ? s->err : KV_UNKNOWN]++;
        bump(&w->err_ops);
        return false;
    }
    w->not_found += s->err == KV_NOT_FOUND && s->type == WL_OP_READ;
    kvb_hist_add(&w->hist[s->type], s->end_ns - s->start_ns);
    bump(&w->ok_ops);
    return true;
}

/* A finished request: the write of a read-modify-write follows its read
 * (a missing record is written anyway); anything else is recorded and the
 * slot takes the next op. Returns false when the op failed. */
static bool complete(kvb_worker *w, kvb_slot *s)
{
    w->inflight--;
    if (s->type == WL_OP_RMW && s->stage == 0 && !w->loading &&
        (s->err == KV_OK || s->err == KV_NOT_FOUND)) {
        s->stage = 1;
        send_slot(w, s);
        return true;
    }
    bool ok = record(w, s);
    if (!defer(w, s))
        start_op(w, s);
    return ok;
}

/* Runs one phase (load or measure) until every slot is idle. A request the
 * library never completes (it should, within --timeout-ms) is abandoned after
 * the deadline plus a grace period; kv_client_close() cancels it later.
 * Failures pause the worker for 1 ms per batch of completions, so a dead
 * cluster costs little CPU. */
static void run_slots(kvb_worker *w, uint64_t phase_end_ns)
{
    const kvb_opts *o = w->sh->o;
    kv_burst_begin(); /* the slots' first calls leave together */
    for (long i = 0; i < o->concurrency; i++)
        if (!start_op(w, &w->slots[i]))
            break;
    kv_burst_end();
    uint64_t give_up = phase_end_ns + (uint64_t)o->timeout_ms * 1000000u + 2000000000u;
    while (w->inflight > 0 || w->ndeferred > 0) {
        if (w->inflight > 0)
            wait_done(w);
        else /* only slots backing off */
            nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
        restart_deferred(w);
        bool failed = false;
        kv_burst_begin(); /* the next calls of the slots that completed: one message */
        for (kvb_slot *s = take_done(w), *next; s; s = next) {
            next = s->next;
            failed |= !complete(w, s);
        }
        kv_burst_end();
        if (failed) /* an unreachable cluster fails at once: do not spin on it */
            nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
        if (w->inflight > 0 && kv_now_ns() > give_up) {
            w->abandoned += (uint64_t)w->inflight;
            break;
        }
    }
}

void *kvb_worker_main(void *arg)
{
    kvb_worker *w = arg;
    kvb_shared *sh = w->sh;
    if (sh->o->load) {
        w->loading = true;
        run_slots(w, sh->load_end_ns);
        w->loading = false;
        w->load_finish_ns = kv_now_ns();
    }
    atomic_fetch_add(&sh->loaded, 1);
    pthread_barrier_wait(&sh->start);
    if (w->abandoned == 0)
        run_slots(w, sh->end_ns);
    w->finish_ns = kv_now_ns();
    atomic_fetch_add(&sh->finished, 1);
    return NULL;
}
