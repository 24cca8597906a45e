/* SPDX-License-Identifier: MIT */
/*
 * Tests for bench/chain (the lock-free chaining hash of index_bench): hits,
 * misses and visit counts, in-place and read-copy-update updates, and
 * concurrent inserts and replacements of shared keys checked for lost
 * updates, duplicates and torn values.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <urcu/urcu-memb.h>

#include "bench/chain.h"

static void key_of(uint64_t id, unsigned char k[8])
{
    memcpy(k, &id, 8);
}

Test(chain, get_put_miss_and_visits)
{
    urcu_memb_register_thread();
    ib_chain *c;
    cr_assert_eq(ib_chain_open(&c, 3), KV_OK);
    cr_assert_eq(ib_chain_buckets(c), 4);
    unsigned char k[8], out[16];
    size_t vlen;
    uint32_t visited;
    for (uint64_t i = 0; i < 100; i++) {
        key_of(i, k);
        uint64_t v = i * 10;
        cr_assert_eq(ib_chain_put(c, k, 8, &v, 8), KV_OK);
    }
    cr_assert_eq(ib_chain_count(c), 100);
    for (uint64_t i = 0; i < 100; i++) {
        key_of(i, k);
        uint64_t v = 0;
        cr_assert(ib_chain_get(c, k, 8, &v, sizeof(v), &vlen, &visited, NULL));
        cr_assert_eq(v, i * 10);
        cr_assert_eq(vlen, 8);
        cr_assert_geq(visited, 1);
    }
    key_of(1000, k);
    cr_assert_not(ib_chain_get(c, k, 8, out, sizeof(out), NULL, &visited, NULL));
    cr_assert_gt(visited, 10, "a miss walks the whole chain (~25 items)");
    /* In place (8 bytes), then replaced by a larger value, then back. */
    key_of(7, k);
    uint64_t v = 77;
    cr_assert_eq(ib_chain_put(c, k, 8, &v, 8), KV_OK);
    char big[16] = "0123456789abcde";
    cr_assert_eq(ib_chain_put(c, k, 8, big, 16), KV_OK);
    cr_assert(ib_chain_get(c, k, 8, out, sizeof(out), &vlen, NULL, NULL));
    cr_assert_eq(vlen, 16);
    cr_assert_eq(memcmp(out, big, 16), 0);
    cr_assert_eq(ib_chain_put(c, k, 8, &v, 8), KV_OK);
    cr_assert(ib_chain_get(c, k, 8, out, sizeof(out), &vlen, NULL, NULL));
    cr_assert_eq(vlen, 8);
    cr_assert_eq(ib_chain_count(c), 100);
    cr_assert_eq(ib_chain_put(c, k, 0, &v, 8), KV_INVALID_ARGUMENT);
    ib_chain_close(c);
    ib_chain_close(NULL);
    cr_assert_eq(ib_chain_open(&c, 0), KV_INVALID_ARGUMENT);
    urcu_memb_unregister_thread();
}

#define NKEYS 64
#define ROUNDS 20000
#define VSIZE 40

typedef struct ctx {
    ib_chain *c;
    unsigned id;
    int bad;
} ctx;

/* Values are VSIZE bytes, every byte equal to (writer id + round) & 0xff, so
 * a torn read shows as mixed bytes. */
static void *writer(void *arg)
{
    ctx *x = arg;
    urcu_memb_register_thread();
    unsigned char k[8], v[VSIZE], out[VSIZE];
    for (unsigned r = 0; r < ROUNDS; r++) {
        uint64_t id = (r * 7 + x->id) % NKEYS;
        key_of(id, k);
        memset(v, (int)((x->id + r) & 0xff), sizeof(v));
        if (ib_chain_put(x->c, k, 8, v, sizeof(v)) != KV_OK)
            x->bad++;
        size_t vlen = 0;
        key_of((r * 13) % NKEYS, k);
        if (ib_chain_get(x->c, k, 8, out, sizeof(out), &vlen, NULL, NULL)) {
            for (int i = 1; i < VSIZE; i++)
                x->bad += out[i] != out[0];
            x->bad += vlen != VSIZE;
        }
    }
    urcu_memb_unregister_thread();
    return NULL;
}

Test(chain, concurrent_inserts_and_replacements, .timeout = 60)
{
    urcu_memb_register_thread();
    ib_chain *c;
    cr_assert_eq(ib_chain_open(&c, 8), KV_OK); /* long chains: many conflicts */
    enum { T = 4 };
    pthread_t th[T];
    ctx x[T];
    for (unsigned t = 0; t < T; t++) {
        x[t] = (ctx){c, t, 0};
        cr_assert_eq(pthread_create(&th[t], NULL, writer, &x[t]), 0);
    }
    for (unsigned t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        cr_assert_eq(x[t].bad, 0, "thread %u saw %d torn or failed ops", t, x[t].bad);
    }
    cr_assert_eq(ib_chain_count(c), NKEYS, "no duplicates, no lost keys");
    ib_chain_close(c);
    urcu_memb_unregister_thread();
}
