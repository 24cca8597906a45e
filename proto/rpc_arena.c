/* SPDX-License-Identifier: MIT */
/*
 * Unpack arenas (rpc.h, "unpack arenas"): a bump allocator that protobuf-c's
 * unpack functions allocate from, for messages whose parts all go at once.
 *
 * protobuf-c allocates once per message struct, bytes or string field,
 * repeated field and, for messages of more than 16 fields, per slab of the
 * fields it scanned; an rpc.Calls message of 25 GETs took some 80 mallocs
 * and as many frees, and a routed GET about 20 (issue 15: malloc and free
 * were 18 % of kvrouter's samples). From an arena they are pointer bumps,
 * and the arena goes back in one call.
 *
 * Memory: the caller's buffer first (if any), then blocks from the heap.
 * Blocks of the standard size (ARENA_BLK) are kept, a few per thread, for
 * the next arena that thread fills: an arena is often filled on one thread
 * (nng's receive callback) and reset on another (the one that sends the
 * reply), so each thread keeps what it frees. The cache is per thread and
 * never shared, so it needs no lock; a thread's blocks are freed when it
 * exits (the key's destructor).
 *
 * The budget: rpc_arena_pb(ar, budget) hands out the allocator with budget
 * bytes to spend, as rpc_budget_init does for malloc, so a hostile message
 * is refused by the same bound whichever allocator unpacks it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/rpc.h"

/* Under ASan a cached block's room is poisoned until an arena takes it
 * again, so a use after rpc_arena_reset is reported as one. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define ARENA_ALIGN 16u
#define ARENA_BLK (16u * 1024u) /* a block's bytes, its header included */
#define ARENA_CACHE 4u          /* standard blocks a thread keeps */

struct rpc_arena_blk {
    rpc_arena_blk *next;
    size_t size; /* bytes of the whole block; ARENA_BLK for a cached one */
    _Alignas(ARENA_ALIGN) uint8_t room[];
};

/* ---- the per-thread cache of standard blocks ------------------------------ */

static pthread_key_t cache_key;
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static __thread rpc_arena_blk *cache_head;
static __thread unsigned cache_n;

static void cache_drop(void *head)
{
    for (rpc_arena_blk *b = head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
}

static void cache_init(void)
{
    if (pthread_key_create(&cache_key, cache_drop) != 0)
        cache_key = (pthread_key_t)-1;
}

static rpc_arena_blk *blk_get(size_t need)
{
    if (need <= ARENA_BLK - sizeof(rpc_arena_blk) && cache_head) {
        rpc_arena_blk *b = cache_head;
        cache_head = b->next;
        cache_n--;
        if (cache_key != (pthread_key_t)-1)
            (void)pthread_setspecific(cache_key, cache_head);
        ARENA_UNPOISON(b->room, ARENA_BLK - sizeof(*b));
        return b;
    }
    size_t size = ARENA_BLK;
    if (need > ARENA_BLK - sizeof(rpc_arena_blk)) {
        size = sizeof(rpc_arena_blk) + need;
        if (size < need)
            return NULL;
    }
    rpc_arena_blk *b = malloc(size);
    if (b)
        b->size = size;
    return b;
}

static void blk_put(rpc_arena_blk *b)
{
    if (b->size != ARENA_BLK || cache_n >= ARENA_CACHE) {
        free(b);
        return;
    }
    pthread_once(&cache_once, cache_init);
    if (cache_key == (pthread_key_t)-1) {
        free(b);
        return;
    }
    ARENA_POISON(b->room, ARENA_BLK - sizeof(*b));
    b->next = cache_head;
    cache_head = b;
    cache_n++;
    /* the destructor sees the list through the key: set on every change */
    (void)pthread_setspecific(cache_key, cache_head);
}

/* ---- the arena --------------------------------------------------------------- */

static size_t round_up(size_t n)
{
    return (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

void *rpc_arena_alloc(rpc_arena *ar, size_t n)
{
    size_t need = round_up(n ? n : 1);
    if (need < n)
        return NULL;
    if ((size_t)(ar->end - ar->cur) < need) {
        rpc_arena_blk *b = blk_get(need);
        if (!b)
            return NULL;
        b->next = ar->blks;
        ar->blks = b;
        ar->cur = b->room;
        ar->end = (uint8_t *)b + b->size;
    }
    void *p = ar->cur;
    ar->cur += need;
    return p;
}

void *rpc_arena_calloc(rpc_arena *ar, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = rpc_arena_alloc(ar, n * size);
    if (p)
        memset(p, 0, n * size);
    return p;
}

static void *pb_alloc(void *data, size_t size)
{
    rpc_arena *ar = data;
    size_t cost = round_up(size ? size : 1);
    if (cost < size || cost > ar->left)
        return NULL;
    ar->left -= cost;
    return rpc_arena_alloc(ar, size);
}

static void pb_free(void *data, void *p)
{
    (void)data; /* the arena's reset frees it */
    (void)p;
}

void rpc_arena_init(rpc_arena *ar, void *buf, size_t cap)
{
    uintptr_t at = (uintptr_t)buf, aligned = (at + ARENA_ALIGN - 1) & ~(uintptr_t)(ARENA_ALIGN - 1);
    *ar = (rpc_arena){.a = {pb_alloc, pb_free, ar}};
    if (buf && cap > aligned - at) {
        ar->buf = (uint8_t *)aligned;
        ar->cap = cap - (aligned - at);
    }
    ar->cur = ar->buf;
    ar->end = ar->buf ? ar->buf + ar->cap : NULL;
}

ProtobufCAllocator *rpc_arena_pb(rpc_arena *ar, size_t budget)
{
    ar->a = (ProtobufCAllocator){pb_alloc, pb_free, ar};
    ar->left = budget;
    return &ar->a;
}

void rpc_arena_reset(rpc_arena *ar)
{
    for (rpc_arena_blk *b = ar->blks, *next; b; b = next) {
        next = b->next;
        blk_put(b);
    }
    ar->blks = NULL;
    ar->cur = ar->buf;
    ar->end = ar->buf ? ar->buf + ar->cap : NULL;
}

ProtobufCMessage *rpc_arena_request(rpc_arena *ar, rpc_ctx *c, const ProtobufCMessageDescriptor *d,
                                    const uint8_t *body, size_t len, size_t budget)
{
    ProtobufCMessage *m = protobuf_c_message_unpack(d, rpc_arena_pb(ar, budget), len, body);
    if (!m)
        rpc_fail(c, KV_INVALID_ARGUMENT, "malformed %s body", d->c_name);
    return m;
}
