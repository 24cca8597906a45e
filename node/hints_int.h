/* SPDX-License-Identifier: MIT */
/*
 * Internals of the hint store (node/hints.h), shared by hints.c (targets,
 * meta files, recovery of the directories, add with group commit,
 * administration) and hints_seg.c (reading and checking segment files,
 * and the drain behind replay and expiry). Only those two files include it.
 *
 * Segment file <016x number>.hint: frames
 *   [u32 crc32c(len || add_ms || payload)][u32 len][u64 add_ms][payload]
 * (the WAL's framing, node/lsm/wal.c, plus the add time).
 *
 * Locks: h->mu (the target table and refs), then t->meta_mu (meta file,
 * directory creation and forget's deletions, held across that I/O), then
 * t->mu (everything else of a target, never held across I/O). `busy` makes
 * replay, expiry and forget exclusive per target; `writing` marks the one
 * leader of a group write; `hold` keeps new leaders out while the active
 * segment is changed under them.
 */
#ifndef KV_NODE_HINTS_INT_H
#define KV_NODE_HINTS_INT_H

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/clock.h"
#include "node/hints.h"
#include "node/lsm/lsm_int.h"

#define HINT_LOG "hints"
#define HINT_FRAME_HDR 16u
#define HINT_SEG_SUFFIX ".hint"

typedef struct hint_seg {
    uint64_t number;
    uint64_t end;  /* bytes of readable frames; appends go here */
    uint64_t file; /* bytes of the file (> end when a corrupt rest is kept) */
    uint64_t head; /* offset of the first hint neither acknowledged nor dropped */
    uint64_t live; /* hints in [head, end) */
    uint64_t head_ms, max_ms;
} hint_seg;

typedef struct hint_waiter {
    kv_err rv;
    bool done;
    struct hint_waiter *next;
} hint_waiter;

typedef enum busy_kind { IDLE, REPLAY, EXPIRE, FORGET } busy_kind;

typedef struct hint_target {
    char name[HINT_TARGET_MAX + 1];
    unsigned refs;           /* under h->mu */
    pthread_mutex_t meta_mu; /* meta file, directory creation, forget's deletions */
    lsm_vol vol;             /* the directory; under meta_mu, fixed while it has segments */
    bool has_vol;
    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;
    hint_seg *segs; /* by number; the last one is active when fd >= 0 */
    size_t nsegs, cap;
    int fd;
    uint64_t next_number;
    lsm_buf pending; /* frames queued for the next group write */
    hint_waiter *waiters;
    uint64_t pend_n, pend_first_ms, pend_max_ms;
    bool writing;  /* a leader is writing */
    unsigned hold; /* > 0: no new leader (the active segment is being changed) */
    busy_kind busy;
    bool cancel; /* forget asks the running drain to stop */
    uint64_t dropped, replayed, corrupt;
    bool lost;
    uint64_t meta_seq, meta_saved; /* changes of lost/dropped, and the last persisted */
} hint_target;

struct hint_store {
    lsm_vol root;
    int lock_fd;
    uint64_t max_bytes, window_ms, seg_bytes;
    uint64_t (*now_ms)(void *arg);
    void *now_arg;
    pthread_mutex_t mu; /* targets (sorted by name) and their refs */
    hint_target **targets;
    size_t ntargets, cap;
    _Atomic uint64_t total; /* bytes of segment files plus reservations in flight */
};

static inline void hint_seg_name(char *buf, size_t cap, uint64_t number)
{
    snprintf(buf, cap, "%016" PRIx64 HINT_SEG_SUFFIX, number);
}

static inline uint64_t hint_now_ms(hint_store *h)
{
    return h->now_ms ? h->now_ms(h->now_arg) : kv_wall_ms();
}

/* ---- hints.c ---- */

/* Takes a reference on target name, creating an empty one when asked;
 * NOT_FOUND otherwise, INVALID_ARGUMENT for a bad name. */
kv_err hint_target_get(hint_store *h, const char *name, bool create, hint_target **out);
/* Drops a reference; a target nothing is known of goes with its last one. */
void hint_target_put(hint_store *h, hint_target *t);
/* With t->mu held: hints of t were lost (n of them counted as dropped). */
void hint_note_lost(hint_target *t, uint64_t n);
/* With t->mu held: keeps new leaders out and waits for the running write;
 * hint_unquiesce lets them in again. */
void hint_quiesce(hint_target *t);
void hint_unquiesce(hint_target *t);
/* Persists t's lost mark and dropped counter if they changed (logged on
 * failure). */
kv_err hint_meta_save(hint_store *h, hint_target *t);
/* Deletes segment s (taken out of t) and frees its bytes. */
void hint_seg_unlink(hint_store *h, hint_target *t, const hint_seg *s);

/* ---- hints_seg.c ---- */

/* Reads segment number of t (found on disk by recovery) into *s: a torn or
 * corrupt tail is truncated, a corrupt frame followed by valid ones ends
 * what is read (t marked lost, counted). */
kv_err hint_scan_seg(hint_target *t, uint64_t number, hint_seg *s);

#endif
