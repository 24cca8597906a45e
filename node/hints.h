/* SPDX-License-Identifier: MIT */
/*
 * hint_store: the node-side storage of hinted handoff (DESIGN.md §4, Dynamo
 * and Cassandra hinted handoff). When a write cannot reach one replica, a
 * live replica keeps the record (a "hint") addressed to the missing node and
 * replays it when that node answers again. Hints are opaque byte strings
 * here (the RPC glue packs a kv.Record into each), stored with the wall-clock
 * ms at which they were added, durably (write + fdatasync, group commit) in
 * one directory of segment files per target. The store is bounded in bytes
 * (max_bytes) and in age (window_ms); a target that missed hints for any
 * reason (full, too old, corrupt, failed write) is marked *lost*: only a
 * repair can bring it back in sync, and hint_store_clear_lost() says one did.
 * The lost mark and the dropped counter survive restarts.
 *
 * Threads: every function may be called from any thread, concurrently,
 * except hint_store_open/close (no other call on the handle may run or
 * follow). add, replay and forget block on disk I/O (and replay on its send
 * callback): call them from worker threads, never from nng callbacks.
 */
#ifndef KV_NODE_HINTS_H
#define KV_NODE_HINTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_err.h"

/* Longest target name (a node id: 1..64 of [A-Za-z0-9._-], not "." or ".."). */
#define HINT_TARGET_MAX 64
/* Longest hint accepted by hint_store_add (the largest batch a node accepts). */
#define HINT_MAX_LEN (64u << 20)

typedef struct hint_store hint_store;

typedef struct hint_opts {
    const char *dir;    /* e.g. DATA_DIR/hints; created if missing (not its parents) */
    uint64_t max_bytes; /* bound on the bytes of all segment files (--hints-max-mb); 0 = none */
    uint64_t window_ms; /* hints older than this are dropped, not replayed; 0 = no age limit */
    uint64_t seg_bytes; /* a segment is rotated once it holds this much; 0 = 4 MiB */
    /* Wall clock in ms for add times and expiry; NULL = kv_wall_ms (tests
     * pass a fake one). Called from any thread. */
    uint64_t (*now_ms)(void *arg);
    void *now_arg;
} hint_opts;

typedef struct hint_target_info {
    char target[HINT_TARGET_MAX + 1];
    uint64_t records;   /* hints stored, not yet replayed nor dropped */
    uint64_t bytes;     /* bytes of the target's segment files (what max_bytes counts) */
    uint64_t dropped;   /* hints dropped: full, past the window, failed add (persisted) */
    uint64_t replayed;  /* hints delivered by replays since open */
    uint64_t corrupt;   /* corrupt frames met since open (the rest of their segment is lost) */
    uint64_t oldest_ms; /* add time of the first stored hint; 0 when records == 0 */
    bool lost;          /* hints were lost: a repair is needed (persisted) */
    bool replaying;     /* a replay of this target is running */
} hint_target_info;

/* Opens (creating o->dir if missing) and recovers what is on disk: a torn
 * or corrupt tail of a segment (a bad frame with no valid one after it) is
 * truncated (logged; it was never acknowledged, nothing is marked); a
 * corrupt frame with valid frames after it ends what can be read of that
 * segment (logged, counted in `corrupt`, target marked lost): the rest
 * stays on disk, unread, until the hints before it are replayed, then goes
 * with the segment. One handle per directory (flock on o->dir/~lock).
 * Returns KV_OK and *out (close it with hint_store_close); or
 * INVALID_ARGUMENT (no dir), FAILED_PRECONDITION (directory in use),
 * INTERNAL or RESOURCE_EXHAUSTED, with a message in err (errlen bytes). */
kv_err hint_store_open(hint_store **out, const hint_opts *o, char *err, size_t errlen);
/* Closes the files and frees the handle; what was added stays on disk.
 * NULL is a no-op. No other call may be running. */
void hint_store_close(hint_store *h);

/* Stores n >= 1 hints for target, copying them (the caller keeps its
 * buffers). Each hint is 1..HINT_MAX_LEN bytes. Returns KV_OK once they are
 * durable (write + fdatasync; concurrent callers for one target share one
 * write and fdatasync); INVALID_ARGUMENT for a bad target name or hint
 * (nothing stored, nothing marked). RESOURCE_EXHAUSTED when they would take
 * the store past max_bytes (or the disk is full), INTERNAL on an I/O error:
 * then nothing of this call is stored, the target is marked lost and its
 * dropped counter grows by n (both durable before the return). */
kv_err hint_store_add(hint_store *h, const char *target, const uint8_t *const *hints,
                      const size_t *lens, size_t n);

/* Delivers n hints (n >= 1, in the order they were added); returns KV_OK
 * once the receiver has them. The pointers are valid only during the call.
 * It runs with no lock of the store held; it may call hint_store_add, _info
 * or _list, not hint_store_forget or _close. */
typedef kv_err (*hint_send_fn)(void *arg, const uint8_t *const *hints, const size_t *lens,
                               size_t n);

/* Replays target's hints oldest first, in batches whose payload bytes stay
 * within max_batch_bytes (a larger hint goes alone). A batch sent with
 * KV_OK is acknowledged: it is not replayed again by this handle (after a
 * crash a few may be, the receiver is idempotent), and a segment file is
 * removed once all its hints are acknowledged or dropped. Hints older than
 * window_ms are dropped instead of sent (target marked lost, dropped
 * counted). Only the hints durable when the replay starts are replayed;
 * hints added meanwhile wait for the next replay. A replay waits for a
 * running hint_store_expire or _forget of target (short, local I/O).
 * Returns KV_OK and *sent (the number delivered, 0 when target has
 * nothing; sent may be NULL) when all of those were delivered or dropped;
 * the send error when send failed (that batch and everything after it are
 * kept; hint_store_info's `replayed` shows what was delivered);
 * FAILED_PRECONDITION when another replay of target is running (it does
 * not wait); ABORTED when hint_store_forget interrupted it;
 * INVALID_ARGUMENT for a bad name or NULL send; INTERNAL when a segment
 * cannot be read (the rest is kept). A corrupt frame or a missing segment
 * file ends that segment's replay (logged, counted in `corrupt`, lost mark)
 * and the replay goes on with the next segment. */
kv_err hint_store_replay(hint_store *h, const char *target, hint_send_fn send, void *arg,
                         size_t max_batch_bytes, uint64_t *sent);

/* Every target with hints, a lost mark or counters, sorted by name; *out is
 * a malloc'ed array of *n entries (free() it; NULL when *n is 0). Returns
 * KV_OK or RESOURCE_EXHAUSTED. */
kv_err hint_store_list(hint_store *h, hint_target_info **out, size_t *n);
/* Fills *out for target; NOT_FOUND when nothing is known of it,
 * INVALID_ARGUMENT for a bad name. */
kv_err hint_store_info(hint_store *h, const char *target, hint_target_info *out);
/* Clears target's lost mark (a repair rebuilt it), durably. KV_OK (also
 * when it was not marked), NOT_FOUND, INVALID_ARGUMENT, or INTERNAL when
 * the mark could not be persisted (it stays cleared in memory). */
kv_err hint_store_clear_lost(hint_store *h, const char *target);
/* Drops every stored hint older than window_ms, target by target, oldest
 * first up to the first younger one (a target being replayed is skipped:
 * its replay drops them), and deletes the segments left empty. Called
 * periodically by the node. Dropped hints count in `dropped` and mark the
 * target lost; a crash before their segment is deleted may count them
 * again after the restart. Returns KV_OK and *dropped (how many; 0 when
 * window_ms is 0), or the first error met (the other targets are still
 * expired). */
kv_err hint_store_expire(hint_store *h, uint64_t *dropped);
/* Deletes everything stored for target, its lost mark and counters (it was
 * removed from the cluster or replaced); a running replay of it stops with
 * ABORTED first. Hints added concurrently may be kept. Returns KV_OK,
 * NOT_FOUND, INVALID_ARGUMENT or INTERNAL (some files could not be
 * removed; logged). */
kv_err hint_store_forget(hint_store *h, const char *target);
/* Bytes of all segment files, the figure max_bytes bounds. */
uint64_t hint_store_total_bytes(hint_store *h);

#endif
