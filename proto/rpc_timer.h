/* SPDX-License-Identifier: MIT */
/*
 * rpc_timer: one thread per process that calls an entry's function at (or
 * just after) its due time, for the channels' coalescing flush and deadline
 * sweep (rpc_chan.c). nng's own timers are not used for these: nng 1.5's
 * expiry thread spins on clock_gettime through the millisecond in which an
 * aio expires (it waits only while now < the earliest expiry, and expires
 * only once now > it), which cost a router a quarter of its CPU when a
 * 1 ms flush timer was armed all the time. Internal to proto/.
 */
#ifndef KV_PROTO_RPC_TIMER_H
#define KV_PROTO_RPC_TIMER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct rpc_timer_ent rpc_timer_ent;
struct rpc_timer_ent {
    void (*fn)(void *arg); /* runs on the timer thread; may arm its entry again */
    void *arg;
    /* owned by the timer (its mutex) */
    uint64_t due_ns; /* kv_now_ns clock; 0 = not armed */
    int running;     /* fn is running */
    rpc_timer_ent *next;
};

/* Arms e for due_ns, or for the earlier of due_ns and its current due time
 * when it is armed already. Starts the thread on first use (false when it
 * cannot: e is not armed). Any thread, fn included. */
bool rpc_timer_arm(rpc_timer_ent *e, uint64_t due_ns);
/* Disarms e and waits for a running fn to return; e may then be freed.
 * Not from e's own fn. */
void rpc_timer_cancel(rpc_timer_ent *e);

#endif
