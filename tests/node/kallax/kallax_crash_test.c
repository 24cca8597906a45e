/* SPDX-License-Identifier: MIT */
/*
 * kallax under SIGKILL: a child process writes records (WAL append, then a
 * flush of its memtable every few hundred writes, so kills land inside
 * flushes and journal rounds too) and publishes each acknowledged seqno in
 * shared memory; the parent kills it at a random moment, reopens the store
 * (replaying the WAL into its own memtable) and checks that every key holds
 * at least its last acknowledged write and that every value read matches
 * its seqno (nothing wrong), then lets the next child continue. A process
 * crash keeps what reached the kernel, so the child runs without fsync;
 * the journal and WAL logic is the same in every sync mode.
 */
#define _GNU_SOURCE
#include "tests/kv_testfw.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#include "kx_test.h"

#define NKEYS 2000
#define ROUNDS 6

typedef struct shared {
    _Atomic uint64_t acked[NKEYS]; /* highest acknowledged seqno per key */
} shared;

typedef struct mem {
    uint64_t seq[NKEYS];
    size_t vlen[NKEYS];
} mem;

static size_t vlen_of(uint64_t seq)
{
    return seq % 23 == 0 ? 2500 + seq % 5000 : seq % 400;
}

static kv_err replay(void *arg, const lsm_rec *r)
{
    mem *m = arg;
    unsigned id = kx_id(r->key);
    cr_assert(id < NKEYS && kx_value_ok(r), "replayed record of key %u is wrong", id);
    if (r->seqno > m->seq[id]) {
        m->seq[id] = r->seqno;
        m->vlen[id] = r->vlen;
    }
    return KV_OK;
}

static void flush_mem(kallax *kx, mem *m, uint64_t max)
{
    lsm_rec *run = calloc(NKEYS, sizeof(*run));
    char(*keys)[KX_KLEN + 1] = calloc(NKEYS, sizeof(*keys));
    uint8_t **vals = calloc(NKEYS, sizeof(*vals));
    size_t n = 0;
    for (unsigned id = 0; id < NKEYS; id++) {
        if (!m->seq[id])
            continue;
        vals[n] = malloc(m->vlen[id] + 1);
        run[n] = kx_rec(keys[id], vals[n], id, m->seq[id], m->vlen[id], false, 0);
        n++;
    }
    if (kallax_flush(kx, run, n, max) != KV_OK)
        _exit(3);
    for (size_t i = 0; i < n; i++)
        free(vals[i]);
    free(run);
    free(keys);
    free(vals);
    memset(m, 0, sizeof(*m));
}

/* The child: writes until killed. */
static void child(kx_world *w, shared *sh, uint64_t seed)
{
    mem *m = calloc(1, sizeof(*m));
    kallax *kx;
    if (kallax_open(&kx, &w->o, replay, m) != KV_OK)
        _exit(2);
    uint64_t seq = kallax_last_seqno(kx), rng = seed;
    uint8_t *v = malloc(8000);
    for (unsigned op = 1;; op++) {
        unsigned id = (unsigned)(lt_rand(&rng) % NKEYS);
        char k[KX_KLEN + 1];
        seq++;
        lsm_rec r = kx_rec(k, v, id, seq, vlen_of(seq), false, 0);
        if (kallax_wal_append(kx, &r, 1) != KV_OK)
            _exit(4);
        m->seq[id] = seq;
        m->vlen[id] = r.vlen;
        atomic_store(&sh->acked[id], seq); /* acknowledged */
        if (op % 300 == 0)
            flush_mem(kx, m, seq);
    }
}

/* After a kill: every key has its acknowledged write or a later one. */
static void verify(kx_world *w, shared *sh)
{
    mem *m = calloc(1, sizeof(*m));
    kx_world_open(w, replay, m);
    unsigned checked = 0;
    for (unsigned id = 0; id < NKEYS; id++) {
        uint64_t want = atomic_load(&sh->acked[id]), got = m->seq[id];
        if (!got) {
            size_t vl;
            bool tomb;
            kv_err rv = kx_get_id(w->kx, id, &got, &vl, &tomb);
            cr_assert(rv == KV_OK || (rv == KV_NOT_FOUND && !want), "key %u: %s", id,
                      kv_strerror(rv));
            got = rv == KV_OK ? got : 0;
        }
        cr_assert_geq(got, want, "key %u: acknowledged seqno %llu lost (have %llu)", id,
                      (unsigned long long)want, (unsigned long long)got);
        checked += want > 0;
    }
    flush_mem(w->kx, m, kallax_last_seqno(w->kx)); /* the next child starts clean */
    kallax_close(w->kx);
    w->kx = NULL;
    free(m);
    cr_log_info("crash: %u keys acknowledged and intact", checked);
}

Test(kallax_crash, sigkill_under_writes, .timeout = 240)
{
    kx_world w;
    kx_world_init(&w, "kx-crash", 600);
    w.o.journal_blocks = 32;
    shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(sh != MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    uint64_t rng = 7;
    for (int round = 0; round < ROUNDS; round++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0)
            child(&w, sh, 1000 + (uint64_t)round);
        struct timespec ts = {0, (long)(100 + lt_rand(&rng) % 400) * 1000000L};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        cr_assert(WIFSIGNALED(st), "the child exited by itself (status %d)", WEXITSTATUS(st));
        verify(&w, sh);
    }
    munmap(sh, sizeof(*sh));
    kx_world_fini(&w);
}
