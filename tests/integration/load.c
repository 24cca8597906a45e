/* SPDX-License-Identifier: MIT */
/* The checking load of the integration tests (see load.h). */
#include "load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VLEN 100
#define BATCH 500

static void note_error(kvt_load *l, const char *what, kv_err rv)
{
    pthread_mutex_lock(&l->mu);
    if (!l->first_error[0])
        snprintf(l->first_error, sizeof(l->first_error), "%s: %s %s", what, kv_err_name(rv),
                 kv_last_error());
    pthread_mutex_unlock(&l->mu);
}

static size_t key_of(int k, char *buf)
{
    return (size_t)snprintf(buf, 16, "k%08d", k);
}

static void value_of(uint32_t counter, char *buf)
{
    memset(buf, 'x', VLEN);
    char head[16];
    int n = snprintf(head, sizeof(head), "c%010u", counter);
    memcpy(buf, head, (size_t)n);
}

static uint32_t counter_of(const uint8_t *v, size_t len)
{
    if (len < 11 || v[0] != 'c')
        return 0;
    char head[12];
    memcpy(head, v + 1, 10);
    head[10] = '\0';
    return (uint32_t)strtoul(head, NULL, 10);
}

static kv_client *open_client(kvt_load *l)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = l->o.timeout_ms ? l->o.timeout_ms : 5000, .auth = l->o.auth};
    if (kv_client_open(&c, l->o.url, &o) != KV_OK)
        return NULL;
    return c;
}

kv_err kvt_load_init(kvt_load *l, const kvt_load_opts *o)
{
    memset(l, 0, sizeof(*l));
    l->o = *o;
    pthread_mutex_init(&l->mu, NULL);
    l->acked = calloc((size_t)o->nkeys, sizeof(*l->acked));
    kv_client *c = l->acked ? open_client(l) : NULL;
    if (!c)
        return KV_RESOURCE_EXHAUSTED;
    static char keys[BATCH][16], val[VLEN];
    value_of(1, val);
    kv_err rv = KV_OK;
    for (int base = 0; rv == KV_OK && base < o->nkeys; base += BATCH) {
        kv_op ops[BATCH];
        int n = o->nkeys - base < BATCH ? o->nkeys - base : BATCH;
        for (int i = 0; i < n; i++)
            ops[i] = (kv_op){.type = KV_OP_PUT,
                             .key = keys[i],
                             .klen = key_of(base + i, keys[i]),
                             .val = val,
                             .vlen = VLEN};
        /* Setup, not the property under test: a batch that timed out or
         * was shed on an overloaded host is sent again (the same values,
         * so a second apply changes nothing). */
        for (int tries = 0;; tries++) {
            rv = kv_batch(c, ops, (size_t)n, o->wcons);
            bool transient =
                rv == KV_DEADLINE_EXCEEDED || rv == KV_UNAVAILABLE || rv == KV_RESOURCE_EXHAUSTED;
            if (!transient || tries == 4)
                break;
            kv_batch_free(ops, (size_t)n);
            struct timespec ts = {0, 500 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        for (int i = 0; rv == KV_OK && i < n; i++)
            if ((rv = ops[i].status) == KV_OK)
                atomic_store(&l->acked[base + i], 1);
        kv_batch_free(ops, (size_t)n);
        if (rv != KV_OK)
            note_error(l, "initial load", rv);
    }
    kv_client_close(c);
    return rv;
}

typedef struct worker {
    kvt_load *l;
    int index;
} worker;

static uint64_t next_rand(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void *writer_main(void *arg)
{
    worker *w = arg;
    kvt_load *l = w->l;
    kv_client *c = open_client(l);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(w->index + 1);
    char key[16], val[VLEN];
    while (c && !atomic_load(&l->stop)) {
        int k = (int)(next_rand(&x) % (uint64_t)l->o.nkeys);
        k -= k % l->o.writers;
        k += w->index;
        if (k >= l->o.nkeys)
            continue;
        uint32_t next = atomic_load(&l->acked[k]) + 1;
        value_of(next, val);
        kv_put_opts po = {.consistency = l->o.wcons};
        kv_err rv = kv_put(c, key, key_of(k, key), val, VLEN, &po, NULL);
        atomic_fetch_add(&l->writes, 1);
        if (rv == KV_OK) {
            atomic_store(&l->acked[k], next);
        } else {
            atomic_fetch_add(&l->write_errors, 1);
            note_error(l, "put", rv);
        }
    }
    kv_client_close(c);
    free(w);
    return NULL;
}

static void *reader_main(void *arg)
{
    worker *w = arg;
    kvt_load *l = w->l;
    kv_client *c = open_client(l);
    uint64_t x = 0x2545f4914f6cdd1dull * (uint64_t)(w->index + 7);
    char key[16];
    while (c && !atomic_load(&l->stop)) {
        int k = (int)(next_rand(&x) % (uint64_t)l->o.nkeys);
        uint32_t before = atomic_load(&l->acked[k]);
        kv_value v;
        kv_err rv = kv_get_ex(c, key, key_of(k, key), l->o.rcons, &v);
        atomic_fetch_add(&l->reads, 1);
        if (rv == KV_OK) {
            if (counter_of(v.data, v.len) < before)
                atomic_fetch_add(&l->stale, 1);
            kv_value_free(&v);
        } else if (rv == KV_NOT_FOUND) {
            if (before)
                atomic_fetch_add(&l->stale, 1);
        } else {
            atomic_fetch_add(&l->read_errors, 1);
            note_error(l, "get", rv);
        }
    }
    kv_client_close(c);
    free(w);
    return NULL;
}

kv_err kvt_load_start(kvt_load *l)
{
    atomic_store(&l->stop, false);
    for (int i = 0; i < l->o.writers + l->o.readers && l->nth < KVT_LOAD_MAX_THREADS; i++) {
        worker *w = malloc(sizeof(*w));
        if (!w)
            return KV_RESOURCE_EXHAUSTED;
        *w = (worker){l, i < l->o.writers ? i : i - l->o.writers};
        if (pthread_create(&l->th[l->nth], NULL, i < l->o.writers ? writer_main : reader_main, w) !=
            0) {
            free(w);
            return KV_RESOURCE_EXHAUSTED;
        }
        l->nth++;
    }
    return KV_OK;
}

void kvt_load_stop(kvt_load *l)
{
    atomic_store(&l->stop, true);
    for (int i = 0; i < l->nth; i++)
        pthread_join(l->th[i], NULL);
    l->nth = 0;
}

kv_err kvt_load_verify(kvt_load *l, const char *url, kv_consistency cons, uint64_t *stale,
                       uint64_t *errors)
{
    return kvt_load_verify_some(l, url, cons, NULL, NULL, stale, errors);
}

/* Whether key k, read as found with value v, is missing or older than
 * its last acknowledged write. */
static bool is_stale(kvt_load *l, int k, bool found, const uint8_t *v, size_t len)
{
    uint32_t want_ctr = atomic_load(&l->acked[k]);
    return want_ctr && (!found || counter_of(v, len) < want_ctr);
}

kv_err kvt_load_verify_some(kvt_load *l, const char *url, kv_consistency cons,
                            bool (*want)(void *arg, const char *key, size_t len), void *arg,
                            uint64_t *stale, uint64_t *errors)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = 20000, .auth = l->o.auth};
    if (kv_client_open(&c, url, &o) != KV_OK)
        return KV_UNAVAILABLE;
    static char keys[BATCH][16];
    *stale = *errors = 0;
    kv_err rv = KV_OK;
    for (int base = 0; base < l->o.nkeys; base += BATCH) {
        kv_op ops[BATCH];
        int idx[BATCH], n = 0;
        for (int k = base; k < l->o.nkeys && k < base + BATCH; k++) {
            size_t len = key_of(k, keys[n]);
            if (want && !want(arg, keys[n], len))
                continue;
            ops[n] = (kv_op){.type = KV_OP_GET, .key = keys[n], .klen = len};
            idx[n++] = k;
        }
        if (!n)
            continue;
        kv_err b = kv_batch(c, ops, (size_t)n, cons);
        for (int i = 0; i < n; i++) {
            if (b != KV_OK || ops[i].status != KV_OK)
                (*errors)++;
            else if (is_stale(l, idx[i], ops[i].found, ops[i].value, ops[i].value_len))
                (*stale)++;
        }
        if (b != KV_OK && rv == KV_OK)
            rv = b;
        kv_batch_free(ops, (size_t)n);
    }
    kv_client_close(c);
    return rv;
}

kv_err kvt_load_verify_direct(kvt_load *l, const char *url, kv_consistency cons, uint64_t *stale,
                              uint64_t *errors)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = 20000, .auth = l->o.auth, .direct = true};
    if (kv_client_open(&c, url, &o) != KV_OK)
        return KV_UNAVAILABLE;
    *stale = *errors = 0;
    kv_err rv = KV_OK;
    for (int k = 0; k < l->o.nkeys; k++) {
        char key[16];
        size_t len = key_of(k, key);
        kv_value v = {0};
        kv_err g = kv_get_ex(c, key, len, cons, &v);
        if (g != KV_OK && g != KV_NOT_FOUND) {
            (*errors)++;
            if (rv == KV_OK)
                rv = g;
        } else if (is_stale(l, k, g == KV_OK, v.data, v.len)) {
            (*stale)++;
        }
        if (g == KV_OK)
            kv_value_free(&v);
    }
    kv_client_close(c);
    return rv;
}

void kvt_load_free(kvt_load *l)
{
    free((void *)l->acked);
    l->acked = NULL;
    pthread_mutex_destroy(&l->mu);
}
