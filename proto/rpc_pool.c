/* SPDX-License-Identifier: MIT */
/*
 * A pool of client channels, one per peer address, created on first use and
 * kept until the pool is destroyed, so a process that follows a changing
 * cluster map (a router, a node, a smart client) never drops a connection
 * on a refresh. Lookups take one mutex; the table only grows.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "proto/rpc.h"
#include "proto/rpc_int.h"

typedef struct pool_ent {
    char *addr;
    rpc_chan *chan;
} pool_ent;

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

/* The channel to addr, opened if missing (p->mu held). */
static rpc_chan *get_locked(rpc_pool *p, const char *addr)
{
    for (size_t i = 0; i < p->n; i++)
        if (strcmp(p->ents[i].addr, addr) == 0)
            return p->ents[i].chan;
    if (p->n == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 8;
        pool_ent *ne = realloc(p->ents, nc * sizeof(*ne));
        if (!ne)
            return NULL;
        p->ents = ne;
        p->cap = nc;
    }
    rpc_chan *ch = NULL;
    char *copy = strdup(addr);
    if (!copy || rpc_chan_open(&ch, addr, &p->opts) != KV_OK) {
        free(copy);
        return NULL;
    }
    p->ents[p->n++] = (pool_ent){copy, ch};
    return ch;
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
        rpc_chan_shutdown(p->ents[i].chan);
    for (size_t i = 0; i < p->n; i++) {
        rpc_chan_close(p->ents[i].chan);
        free(p->ents[i].addr);
    }
    free(p->ents);
    free(p->auth);
    for (int i = 0; i < 3; i++)
        free(p->tls_str[i]);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
