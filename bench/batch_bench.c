/* SPDX-License-Identifier: MIT */
/*
 * batch_bench: kv.Batch throughput of a node or a router (issue 15, the
 * "batched" target of bench/e2e_compare.sh, compared with redis-benchmark
 * -P 16). One thread keeps --concurrency kv.Batch requests of --batch GETs
 * of uniformly drawn keys ("key%012d", kvbench's keys) in flight for
 * --seconds: each completion (an nng thread) sends the next batch, so
 * nothing but the RPC runtime runs between two requests. Prints one JSON
 * summary line: batches/s, keys read/s (ops_per_s), p50 of a batch.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/workload.h"
#include "common/clock.h"
#include "common/opts.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

#define PROG "batch_bench"
#define MAX_BATCH 1024
#define LAT_BUCKETS 4096 /* 10 us each: up to ~41 ms, the last bucket above */

typedef struct bb_opts {
    char *target, *auth;
    long keys, batch, concurrency, timeout_ms;
    double seconds;
} bb_opts;

typedef struct bb_run {
    const bb_opts *o;
    rpc_chan *ch;
    uint64_t end_ns;
    _Atomic uint64_t batches, errors, keys_found, seed;
    _Atomic int inflight;
    _Atomic uint64_t lat[LAT_BUCKETS];
} bb_run;

typedef struct bb_slot {
    bb_run *r;
    uint64_t start_ns;
    char keys[MAX_BATCH][WL_KEYSTR_MAX];
    Kv__Op ops[MAX_BATCH];
    Kv__Op *ptrs[MAX_BATCH];
} bb_slot;

static uint64_t next_rand(bb_run *r)
{
    /* splitmix64 over a shared counter: uniform ids, no lock */
    uint64_t z = atomic_fetch_add_explicit(&r->seed, 0x9e3779b97f4a7c15ull, memory_order_relaxed);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void batch_done(void *arg, rpc_reply *rep);

/* Sends slot s's next batch, or retires it once the run is over. */
static void send_next(bb_slot *s)
{
    bb_run *r = s->r;
    uint64_t now = kv_now_ns();
    if (now >= r->end_ns) {
        atomic_fetch_sub(&r->inflight, 1);
        return;
    }
    Kv__BatchRequest req = KV__BATCH_REQUEST__INIT;
    for (long i = 0; i < r->o->batch; i++) {
        kv__op__init(&s->ops[i]);
        s->ops[i].type = KV__OP_TYPE__GET;
        size_t n = wl_key_str(next_rand(r) % (uint64_t)r->o->keys, s->keys[i], WL_KEYSTR_MAX);
        s->ops[i].key = (ProtobufCBinaryData){n, (uint8_t *)s->keys[i]};
        s->ptrs[i] = &s->ops[i];
    }
    req.n_ops = (size_t)r->o->batch;
    req.ops = s->ptrs;
    s->start_ns = now;
    rpc_call_async(r->ch, "kv.Batch", 0, &req.base, (uint32_t)r->o->timeout_ms, batch_done, s);
}

static void batch_done(void *arg, rpc_reply *rep)
{
    bb_slot *s = arg;
    bb_run *r = s->r;
    Kv__BatchReply *br =
        rep->status == KV_OK ? kv__batch_reply__unpack(NULL, rep->len, rep->body) : NULL;
    if (br && br->n_results == (size_t)r->o->batch) {
        uint64_t found = 0;
        for (size_t i = 0; i < br->n_results; i++)
            found += br->results[i]->found;
        atomic_fetch_add_explicit(&r->keys_found, found, memory_order_relaxed);
        atomic_fetch_add_explicit(&r->batches, 1, memory_order_relaxed);
        uint64_t b = (kv_now_ns() - s->start_ns) / 10000u;
        atomic_fetch_add_explicit(&r->lat[b < LAT_BUCKETS ? b : LAT_BUCKETS - 1], 1,
                                  memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&r->errors, 1, memory_order_relaxed);
    }
    if (br)
        kv__batch_reply__free_unpacked(br, NULL);
    bool failed = rep->status != KV_OK;
    rpc_reply_free(rep);
    if (failed) /* retire the slot: a dead target fails at once, and a resend from a */
        atomic_fetch_sub(&r->inflight, 1); /* synchronous failure would recurse */
    else
        send_next(s);
}

static double p50_us(bb_run *r)
{
    uint64_t total = atomic_load(&r->batches), seen = 0;
    for (int b = 0; b < LAT_BUCKETS; b++) {
        seen += atomic_load(&r->lat[b]);
        if (total && seen * 2 >= total)
            return (b + 0.5) * 10.0;
    }
    return 0.0;
}

static int run(const bb_opts *o)
{
    bb_run *r = calloc(1, sizeof(*r));
    bb_slot *slots = calloc((size_t)o->concurrency, sizeof(*slots));
    rpc_chan_opts co = {.auth = o->auth};
    if (!r || !slots || rpc_chan_open(&r->ch, o->target, &co) != KV_OK) {
        fprintf(stderr, PROG ": cannot open %s\n", o->target);
        free(r);
        free(slots);
        return 1;
    }
    r->o = o;
    nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL); /* let the dial complete */
    uint64_t t0 = kv_now_ns();
    r->end_ns = t0 + (uint64_t)(o->seconds * 1e9);
    atomic_store(&r->inflight, (int)o->concurrency);
    for (long i = 0; i < o->concurrency; i++) {
        slots[i].r = r;
        send_next(&slots[i]);
    }
    uint64_t give_up = r->end_ns + (uint64_t)o->timeout_ms * 1000000u + 2000000000u;
    while (atomic_load(&r->inflight) > 0 && kv_now_ns() < give_up)
        nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
    double secs = (double)(kv_now_ns() - t0) / 1e9;
    if (atomic_load(&r->inflight) > 0)
        secs = o->seconds;
    uint64_t b = atomic_load(&r->batches);
    printf("{\"summary\":true,\"bench\":\"batch_bench\",\"target\":\"%s\",\"batch\":%ld,"
           "\"concurrency\":%ld,\"keys\":%ld,\"seconds\":%.3f,\"batches\":%" PRIu64
           ",\"batches_per_s\":%.1f,\"ops\":%" PRIu64 ",\"ops_per_s\":%.1f,\"found\":%" PRIu64
           ",\"p50_us\":%.1f,\"errors\":%" PRIu64 "}\n",
           o->target, o->batch, o->concurrency, o->keys, secs, b, (double)b / secs,
           b * (uint64_t)o->batch, (double)b * (double)o->batch / secs, atomic_load(&r->keys_found),
           p50_us(r), atomic_load(&r->errors));
    rpc_chan_close(r->ch); /* anything still in flight completes with CANCELLED first */
    free(slots);
    free(r);
    return 0;
}

int main(int argc, char **argv)
{
    bb_opts o = {.target = "tcp://127.0.0.1:7000",
                 .keys = 100000,
                 .batch = 16,
                 .concurrency = 50,
                 .timeout_ms = 5000,
                 .seconds = 5.0};
    const kv_opt table[] = {
        {"target", KV_OPT_STR, &o.target, "node or router address"},
        {"keys", KV_OPT_INT, &o.keys, "key ids drawn uniformly from [0, keys)", NULL, 1, 1L << 30},
        {"batch", KV_OPT_INT, &o.batch, "GETs per kv.Batch", NULL, 1, MAX_BATCH},
        {"concurrency", KV_OPT_INT, &o.concurrency, "batches in flight", NULL, 1, 4096},
        {"seconds", KV_OPT_DOUBLE, &o.seconds, "timed run"},
        {"timeout-ms", KV_OPT_INT, &o.timeout_ms, "per-batch deadline", NULL, 10, 600000},
        {"auth", KV_OPT_STR, &o.auth, "cluster token"},
    };
    kv_optset set = {table, sizeof(table) / sizeof(table[0]), NULL, PROG, NULL};
    char err[512] = "";
    kv_err rv = kv_opts_parse(&set, argc, argv, NULL, err, sizeof(err));
    if (rv == KV_OK && !(o.seconds > 0.0 && o.seconds <= 3600.0 && isfinite(o.seconds))) {
        snprintf(err, sizeof(err), "--seconds must be in (0, 3600]");
        rv = KV_INVALID_ARGUMENT;
    }
    if (rv == KV_OK && rpc_runtime_init(0) != KV_OK) { /* nng's pool as kvbench sizes it */
        snprintf(err, sizeof(err), "cannot initialise nng");
        rv = KV_INTERNAL;
    }
    int rc = rv == KV_CANCELLED ? 0 : rv != KV_OK ? 2 : run(&o);
    if (rv != KV_OK && rv != KV_CANCELLED)
        fprintf(stderr, PROG ": %s\n", err);
    kv_opts_free(&set);
    return rc;
}
