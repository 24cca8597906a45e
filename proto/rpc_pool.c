/* SPDX-License-Identifier: MIT */
/*
 * A pool of client channels per peer address, created on first use and kept
 * until the pool is destroyed, so a process that follows a changing cluster
 * map (a router, a node, a smart client) never drops a connection on a
 * refresh. Lookups take one mutex; the table only grows.
 *
 * A peer served on hotkv's loops (rpc_chan_looped) gets one channel per
 * loop, each with its connection on that loop (rpc_chan_opts.loop), and a
 * call made on a loop's thread takes that loop's channel: a router's
 * forward, the node's reply and the answer to the client then run on the
 * thread that read the request, with no other thread taking the channel's
 * mutex, freeing its memory or waking it (with one channel for both loops,
 * a routed GET cost the router a futex call and a contended allocator lock,
 * bench/README.md). The threads off the loops (workers, an application's
 * threads in the smart client) share one channel per address. Other peers
 * (TLS, host names, inproc) get one channel.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "proto/rpc.h"
#include "proto/rpc_int.h"
#include "proto/rpc_loop.h"

#define POOL_MAX_LOOPS 8 /* rpc_loop's most */

typedef struct pool_ent {
    char *addr;
    size_t n; /* 1, or one per loop */
    rpc_chan *chan[POOL_MAX_LOOPS];
} pool_ent;

/* Which of the n channels of the pool's i-th address this thread uses:
 * its loop's, or off the loops the one of loop i mod n, shared by every
 * such thread (so their calls still coalesce into few messages, and the
 * addresses' replies spread over the loops as single channels did). */
static size_t slot_of(size_t n, size_t i)
{
    int l = rpc_loop_self();
    return l >= 0 ? (size_t)l % n : i % n;
}

struct rpc_pool {
    rpc_chan_opts opts;
    char *auth;  /* opts.auth's copy */
    rpc_tls tls; /* *opts.tls's copy (strings below) */
    char *tls_str[3];
    pthread_mutex_t mu; /* protects ents, n, cap, closed */
    bool closed;        /* rpc_pool_destroy began: no channel is opened */
    pool_ent *ents;
    size_t n, cap;
};

kv_err rpc_pool_create(rpc_pool **out, const rpc_chan_opts *opts)
{
    rpc_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return KV_RESOURCE_EXHAUSTED;
    p->opts = opts ? *opts : (rpc_chan_opts){0};
    if (p->opts.auth && !(p->auth = strdup(p->opts.auth))) {
        free(p);
        return KV_RESOURCE_EXHAUSTED;
    }
    p->opts.auth = p->auth;
    if (p->opts.tls) {
        const char *src[3] = {p->opts.tls->cert, p->opts.tls->key, p->opts.tls->ca};
        bool oom = false;
        for (int i = 0; i < 3; i++)
            oom |= src[i] && !(p->tls_str[i] = strdup(src[i]));
        if (oom) {
            for (int i = 0; i < 3; i++)
                free(p->tls_str[i]);
            free(p->auth);
            free(p);
            return KV_RESOURCE_EXHAUSTED;
        }
        p->tls =
            (rpc_tls){p->tls_str[0], p->tls_str[1], p->tls_str[2], p->opts.tls->client_optional};
        p->opts.tls = &p->tls;
    }
    pthread_mutex_init(&p->mu, NULL);
    *out = p;
    return KV_OK;
}

/* Opens an address's channels into e (one, or one per loop): false when not
 * even the first could be. */
static bool open_ent(rpc_pool *p, pool_ent *e, const char *addr)
{
    e->n = 0;
    rpc_chan_opts o = p->opts;
    o.loop = 1;
    if (rpc_chan_open(&e->chan[0], addr, &o) != KV_OK)
        return false;
    e->n = 1;
    size_t want = rpc_chan_looped(e->chan[0]) ? (size_t)rpc_loop_count() : 1;
    for (; e->n < want && e->n < POOL_MAX_LOOPS; e->n++) {
        o.loop = (int)e->n + 1;
        if (rpc_chan_open(&e->chan[e->n], addr, &o) != KV_OK)
            break; /* out of memory: the loops share the ones open */
    }
    return true;
}

/* This thread's channel to addr, opened if missing (p->mu held). */
static rpc_chan *get_locked(rpc_pool *p, const char *addr)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->ents[i].addr, addr) == 0)
            return p->ents[i].chan[slot_of(p->ents[i].n, i)];
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 8;
        pool_ent *ne = realloc(p->ents, nc * sizeof(*ne));
        if (!ne)
            return NULL;
        p->ents = ne;
        p->cap = nc;
    }
    pool_ent *e = &p->ents[p->n];
    if (!(e->addr = strdup(addr)) || !open_ent(p, e, addr)) {
        free(e->addr);
        return NULL;
    }
    p->n++;
    return e->chan[slot_of(e->n, p->n - 1)];
}

rpc_chan *rpc_pool_get(rpc_pool *p, const char *addr)
{
    pthread_mutex_lock(&p->mu);
    rpc_chan *ch = p->closed ? NULL : get_locked(p, addr);
    pthread_mutex_unlock(&p->mu);
    return ch;
}

void rpc_pool_destroy(rpc_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->closed = true;
    pthread_mutex_unlock(&p->mu);
    /* Every channel stops before any is freed: a completion of one (a
     * coordinator's late reply) may send a hint on another; on a channel
     * shut down that fails at once, on a freed one it would crash (nng
     * panicked in the fuzz harnesses, tests/fuzz/crashes). */
    for (size_t i = 0; i < p->n; i++)
        for (size_t k = 0; k < p->ents[i].n; k++)
            rpc_chan_shutdown(p->ents[i].chan[k]);
    for (size_t i = 0; i < p->n; i++) {
        for (size_t k = 0; k < p->ents[i].n; k++)
            rpc_chan_close(p->ents[i].chan[k]);
        free(p->ents[i].addr);
    }
    free(p->ents);
    free(p->auth);
    for (int i = 0; i < 3; i++)
        free(p->tls_str[i]);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
