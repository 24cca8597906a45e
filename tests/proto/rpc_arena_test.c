/* SPDX-License-Identifier: MIT */
/* Unpack arenas (proto/rpc_arena.c): what protobuf-c unpacks into one is
 * whole and aligned, the budget bounds it as it bounds malloc'ed unpacks,
 * and blocks move between threads without leaking (ASan and TSan builds
 * run this file too). */
#include "tests/kv_testfw.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

/* A packed BatchRequest of n puts, key "k<i>" and a vlen-byte value. */
static uint8_t *batch_bytes(size_t n, size_t vlen, size_t *len)
{
    Kv__Op *ops = calloc(n, sizeof(*ops));
    Kv__Op **ptrs = calloc(n, sizeof(*ptrs));
    char(*keys)[16] = calloc(n, sizeof(*keys));
    uint8_t *val = malloc(vlen ? vlen : 1);
    cr_assert(ops && ptrs && keys && val);
    memset(val, 'v', vlen);
    for (size_t i = 0; i < n; i++) {
        kv__op__init(&ops[i]);
        ops[i].type = KV__OP_TYPE__PUT;
        int kl = snprintf(keys[i], sizeof(keys[i]), "k%zu", i);
        ops[i].key = (ProtobufCBinaryData){(size_t)kl, (uint8_t *)keys[i]};
        ops[i].value = (ProtobufCBinaryData){vlen, val};
        ptrs[i] = &ops[i];
    }
    Kv__BatchRequest req = KV__BATCH_REQUEST__INIT;
    req.n_ops = n;
    req.ops = ptrs;
    *len = kv__batch_request__get_packed_size(&req);
    uint8_t *out = malloc(*len ? *len : 1);
    cr_assert_not_null(out);
    kv__batch_request__pack(&req, out);
    free(ops);
    free(ptrs);
    free(keys);
    free(val);
    return out;
}

static void check_batch(const Kv__BatchRequest *req, size_t n, size_t vlen)
{
    cr_assert_not_null(req);
    cr_assert_eq(req->n_ops, n);
    for (size_t i = 0; i < n; i++) {
        char key[16];
        int kl = snprintf(key, sizeof(key), "k%zu", i);
        cr_assert_eq(req->ops[i]->key.len, (size_t)kl);
        cr_assert(memcmp(req->ops[i]->key.data, key, (size_t)kl) == 0, "op %zu's key", i);
        cr_assert_eq(req->ops[i]->value.len, vlen);
        for (size_t j = 0; j < vlen; j++)
            cr_assert_eq(req->ops[i]->value.data[j], 'v');
    }
}

Test(rpc_arena, unpacks_into_the_buffer_then_the_heap_and_resets)
{
    uint8_t buf[512];
    rpc_arena ar;
    rpc_arena_init(&ar, buf, sizeof(buf));
    size_t len;
    uint8_t *small = batch_bytes(1, 8, &len);
    Kv__BatchRequest *req = kv__batch_request__unpack(rpc_arena_pb(&ar, SIZE_MAX), len, small);
    check_batch(req, 1, 8);
    /* a one-op batch fits the caller's buffer: nothing came from the heap */
    cr_assert((uint8_t *)req >= buf && (uint8_t *)req < buf + sizeof(buf));
    cr_assert_null(ar.blks);
    free(small);

    /* 300 ops of 100 bytes, and one value over a block: both spill over */
    uint8_t *big = batch_bytes(300, 100, &len);
    req = kv__batch_request__unpack(rpc_arena_pb(&ar, SIZE_MAX), len, big);
    check_batch(req, 300, 100);
    cr_assert_not_null(ar.blks);
    free(big);
    uint8_t *huge = batch_bytes(2, 100000, &len);
    req = kv__batch_request__unpack(rpc_arena_pb(&ar, SIZE_MAX), len, huge);
    check_batch(req, 2, 100000);
    free(huge);

    rpc_arena_reset(&ar);
    cr_assert_null(ar.blks);
    cr_assert_eq(rpc_arena_alloc(&ar, 1), ar.buf, "after a reset the buffer comes first again");
    rpc_arena_reset(&ar);
}

Test(rpc_arena, allocations_are_aligned_zeroed_and_bounded)
{
    rpc_arena ar;
    rpc_arena_init(&ar, NULL, 0); /* no buffer: every byte from blocks */
    for (size_t n = 0; n < 200; n += 7) {
        uint8_t *p = rpc_arena_alloc(&ar, n);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 16, 0, "%zu bytes at %p", n, (void *)p);
        memset(p, 0xab, n); /* ASan: the whole size is ours */
    }
    uint64_t *z = rpc_arena_calloc(&ar, 1000, sizeof(*z)); /* 8000 bytes, then 40000 */
    cr_assert_not_null(z);
    for (size_t i = 0; i < 1000; i++)
        cr_assert_eq(z[i], 0);
    uint8_t *large = rpc_arena_calloc(&ar, 40000, 1);
    cr_assert_not_null(large);
    cr_assert_eq(large[39999], 0);
    cr_assert_null(rpc_arena_calloc(&ar, SIZE_MAX / 2, 4), "n x size overflows");
    cr_assert_null(rpc_arena_alloc(&ar, SIZE_MAX - 4), "size rounds past SIZE_MAX");
    /* a misaligned buffer is aligned, not overrun */
    uint8_t raw[100];
    rpc_arena odd;
    rpc_arena_init(&odd, raw + 3, 64);
    uint8_t *p = rpc_arena_alloc(&odd, 16);
    cr_assert_eq((uintptr_t)p % 16, 0);
    cr_assert(p >= raw + 3 && p + 16 <= raw + 3 + 64);
    rpc_arena_reset(&odd);
    rpc_arena_reset(&ar);
}

Test(rpc_arena, the_budget_refuses_what_malloc_would_refuse)
{
    size_t len;
    uint8_t *b = batch_bytes(1000, 0, &len);
    rpc_arena ar;
    rpc_arena_init(&ar, NULL, 0);
    /* the budget a request limited to 10 ops gets is not enough for 1000
     * ops' structs: the unpack fails, as with rpc_unpack */
    size_t tight = 1000 * 16;
    cr_assert_null(kv__batch_request__unpack(rpc_arena_pb(&ar, tight), len, b));
    cr_assert_null(rpc_unpack(&kv__batch_request__descriptor, len, b, tight));
    /* the same bytes with room, after the failure, in the same arena */
    Kv__BatchRequest *req =
        kv__batch_request__unpack(rpc_arena_pb(&ar, rpc_unpack_budget(len, 1000)), len, b);
    check_batch(req, 1000, 0);
    /* the budget counts unpacks only: the arena's own allocations go on */
    rpc_arena_pb(&ar, 0);
    cr_assert_not_null(rpc_arena_alloc(&ar, 4096));
    rpc_arena_reset(&ar);
    free(b);
}

/* Arenas filled on one thread and reset on another (as a server's context
 * is: filled by the receive callback, reset by the thread that sends the
 * reply): blocks go to the resetting thread's cache and are freed when it
 * exits. */
#define XT_THREADS 4
#define XT_ROUNDS 400
typedef struct xt_slot {
    rpc_arena ar;
    _Atomic int full; /* 1: filled, for the next thread to check and reset */
} xt_slot;
static xt_slot xt_slots[XT_THREADS];
static uint8_t *xt_bytes;
static size_t xt_len;

static void *xt_run(void *arg)
{
    size_t me = (size_t)(uintptr_t)arg, next = (me + 1) % XT_THREADS;
    for (int r = 0; r < XT_ROUNDS; r++) {
        /* fill mine once the neighbour took the last one */
        while (atomic_load_explicit(&xt_slots[me].full, memory_order_acquire))
            sched_yield();
        Kv__BatchRequest *req =
            kv__batch_request__unpack(rpc_arena_pb(&xt_slots[me].ar, SIZE_MAX), xt_len, xt_bytes);
        cr_assert_not_null(req);
        cr_assert_eq(req->n_ops, 50);
        atomic_store_explicit(&xt_slots[me].full, 1, memory_order_release);
        /* check and reset the neighbour's */
        while (!atomic_load_explicit(&xt_slots[next].full, memory_order_acquire))
            sched_yield();
        cr_assert_not_null(xt_slots[next].ar.blks);
        rpc_arena_reset(&xt_slots[next].ar);
        atomic_store_explicit(&xt_slots[next].full, 0, memory_order_release);
    }
    return NULL;
}

Test(rpc_arena, blocks_cross_threads_without_leaks)
{
    xt_bytes = batch_bytes(50, 400, &xt_len); /* over one 16 KiB block */
    for (int i = 0; i < XT_THREADS; i++) {
        rpc_arena_init(&xt_slots[i].ar, NULL, 0);
        atomic_store(&xt_slots[i].full, 0);
    }
    pthread_t t[XT_THREADS];
    for (int i = 0; i < XT_THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, xt_run, (void *)(uintptr_t)i), 0);
    for (int i = 0; i < XT_THREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < XT_THREADS; i++)
        rpc_arena_reset(&xt_slots[i].ar);
    free(xt_bytes);
}
