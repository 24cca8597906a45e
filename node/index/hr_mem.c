/* SPDX-License-Identifier: MIT */
/*
 * HotRing item memory: 64-byte aligned blocks in four size classes (64, 128,
 * 192 and 256 bytes), so that a compact item (hr_internal.h) is exactly one
 * cache line, and plain malloc for larger items. A hit on a compact item then
 * touches one line, where an 80-byte malloc chunk straddles two most of the
 * time.
 *
 * Every thread keeps a cache of free blocks per class (a singly linked list
 * through the blocks' first word); allocation and free are a few loads and
 * stores on thread-local data. Blocks move between the thread caches and a
 * shared pool in batches of HR_MEM_BATCH under one mutex: a cache that runs
 * dry takes a batch, or else carves blocks one by one from a new 2 MiB chunk
 * (so a load touches each block once, when the item is written); a cache
 * that grows past two batches hands one back. Items are freed by liburcu's call_rcu thread
 * after a grace period, so frees and allocations of one block happen in
 * different threads; the batch hand-over orders them (mutex), and a block is
 * in at most one list at a time, so there is no ABA: the only shared structure
 * is the mutex-protected pool.
 *
 * Chunks are never returned to the system: freed blocks serve later items of
 * any index in the process (the node keeps one index; tests and benchmarks
 * open several in turn). Every chunk stays linked from the pool, so leak
 * checkers see it as reachable. hr_thread_unregister() hands the thread's
 * cached blocks back to the pool.
 *
 * Sanitizer builds (ASan, TSan) allocate every item with aligned_alloc and
 * free it with free(), so that use-after-free and races on reclaimed items
 * stay visible to the sanitizers instead of hiding in recycled blocks.
 */
#include <pthread.h>
#include <stdlib.h>

#include "node/index/hr_internal.h"

#if defined(HR_TSAN) || defined(__SANITIZE_ADDRESS__)
#define HR_MEM_PLAIN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HR_MEM_PLAIN 1
#endif
#endif

#define HR_MEM_CLASSES (HR_MEM_SMALL_MAX / HR_LINE)
/* Bytes carved per refill: large enough that even a huge index maps few
 * chunks (16 GiB of items = 8192 mappings, well under vm.max_map_count) */
#define HR_MEM_CHUNK (2u * 1024u * 1024u)
#define HR_MEM_BATCH 128u /* blocks per hand-over between a cache and the pool */

static size_t hr_round_line(size_t n)
{
    return (n + HR_LINE - 1) & ~(size_t)(HR_LINE - 1);
}

size_t hr_mem_class_bytes(size_t n)
{
#ifdef HR_MEM_PLAIN
    return hr_round_line(n);
#else
    return n <= HR_MEM_SMALL_MAX ? hr_round_line(n) : n;
#endif
}

#ifdef HR_MEM_PLAIN

void *hr_mem_alloc(size_t n)
{
    return aligned_alloc(HR_LINE, hr_round_line(n));
}

void hr_mem_free(void *p, size_t n)
{
    (void)n;
    free(p);
}

void hr_mem_thread_flush(void) {}

#else

typedef struct hr_block {
    struct hr_block *next;       /* next free block (thread cache or batch) */
    struct hr_block *next_batch; /* pool only: the next batch (first block of a batch) */
    size_t n;                    /* pool only: blocks in this batch (first block) */
} hr_block;

typedef struct hr_cache {
    hr_block *head;              /* free blocks */
    size_t n;                    /* blocks in head */
    unsigned char *bump, *limit; /* the rest of this thread's newest chunk */
} hr_cache;

static HR_TLS hr_cache hr_tcache[HR_MEM_CLASSES];

static struct {
    pthread_mutex_t mu;
    hr_block *batches[HR_MEM_CLASSES];
    void *chunks; /* every chunk carved so far, linked through its first word */
} hr_pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Fills the empty cache tc of class c with a batch from the pool, else
 * gives it a new chunk to carve blocks from (tc->bump is used up). */
static bool hr_refill(unsigned c, hr_cache *tc)
{
    pthread_mutex_lock(&hr_pool.mu);
    hr_block *bt = hr_pool.batches[c];
    if (bt)
        hr_pool.batches[c] = bt->next_batch;
    pthread_mutex_unlock(&hr_pool.mu);
    if (bt) {
        tc->head = bt;
        tc->n = bt->n;
        return true;
    }
    unsigned char *ch = aligned_alloc(HR_LINE, HR_MEM_CHUNK);
    if (!ch)
        return false;
    pthread_mutex_lock(&hr_pool.mu);
    memcpy(ch, &hr_pool.chunks, sizeof(void *)); /* the chunk's first line links the chunks */
    hr_pool.chunks = ch;
    pthread_mutex_unlock(&hr_pool.mu);
    tc->bump = ch + HR_LINE;
    tc->limit = ch + HR_MEM_CHUNK;
    return true;
}

/* Hands the list bt of n blocks of class c to the pool. */
static void hr_give(unsigned c, hr_block *bt, size_t n)
{
    bt->n = n;
    pthread_mutex_lock(&hr_pool.mu);
    bt->next_batch = hr_pool.batches[c];
    hr_pool.batches[c] = bt;
    pthread_mutex_unlock(&hr_pool.mu);
}

void *hr_mem_alloc(size_t n)
{
    if (n > HR_MEM_SMALL_MAX)
        return malloc(n);
    unsigned c = n ? (unsigned)((n - 1) / HR_LINE) : 0;
    size_t sz = (size_t)(c + 1) * HR_LINE;
    hr_cache *tc = &hr_tcache[c];
    if (!tc->head) {
        if (tc->bump && (size_t)(tc->limit - tc->bump) >= sz) {
            void *p = tc->bump; /* carve lazily: a block is touched when first used */
            tc->bump += sz;
            return p;
        }
        tc->bump = tc->limit = NULL; /* a tail smaller than a block stays unused */
        if (!hr_refill(c, tc))
            return NULL;
        if (!tc->head)
            return hr_mem_alloc(n); /* a new chunk: carve from it */
    }
    hr_block *b = tc->head;
    tc->head = b->next;
    tc->n--;
    return b;
}

void hr_mem_free(void *p, size_t n)
{
    if (!p)
        return;
    if (n > HR_MEM_SMALL_MAX) {
        free(p);
        return;
    }
    unsigned c = n ? (unsigned)((n - 1) / HR_LINE) : 0;
    hr_cache *tc = &hr_tcache[c];
    hr_block *b = p;
    b->next = tc->head;
    tc->head = b;
    if (++tc->n < 2 * HR_MEM_BATCH)
        return;
    hr_block *last = tc->head; /* detach the first HR_MEM_BATCH blocks */
    for (unsigned i = 1; i < HR_MEM_BATCH; i++)
        last = last->next;
    hr_block *bt = tc->head;
    tc->head = last->next;
    last->next = NULL;
    tc->n -= HR_MEM_BATCH;
    hr_give(c, bt, HR_MEM_BATCH);
}

void hr_mem_thread_flush(void)
{
    for (unsigned c = 0; c < HR_MEM_CLASSES; c++) {
        hr_cache *tc = &hr_tcache[c];
        size_t sz = (size_t)(c + 1) * HR_LINE;
        for (; tc->bump && (size_t)(tc->limit - tc->bump) >= sz; tc->bump += sz) {
            hr_block *b = (hr_block *)(void *)tc->bump; /* the uncarved rest too */
            b->next = tc->head;
            tc->head = b;
            tc->n++;
        }
        tc->bump = tc->limit = NULL;
        if (tc->head)
            hr_give(c, tc->head, tc->n);
        tc->head = NULL;
        tc->n = 0;
    }
}

#endif
