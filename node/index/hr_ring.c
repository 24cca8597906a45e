/* SPDX-License-Identifier: MIT */
/*
 * HotRing lock-free ordered rings: search, insert, logical deletion with the
 * Occupied bit, helping unlink, head inheritance and RCU reclamation. The
 * keyed API (hotring.c) and the rehash (hr_rehash.c) are built on these.
 *
 * Design (Chen et al., "HotRing: A Hotspot-Aware In-Memory Key-Value Store",
 * FAST'20, §3.1 and §3.3):
 *
 * - Each bucket holds one circular singly linked list ordered by
 *   (tag, key), the tag being the top 32 bits of the key's hash; the bucket
 *   head may point at any item. A search walks from the head and stops at
 *   the first pair (x, next) whose cyclic open interval contains the key (the
 *   paper's miss early-stop: x < k < next, or at the wrap point k > x or
 *   k < next). The bucket is the tag's top bits (at most 2^32 buckets), so
 *   the items of a bucket share them and a doubling splits each ring into
 *   two ranges of its order (hr_rehash.c).
 * - Occupied bit (paper §3.3) = logical deletion, as in Harris' lock-free
 *   list: a delete sets Occupied in the victim's next word; an RCU update
 *   sets Occupied and, in the same CAS, points the victim's next word at the
 *   replacement (whose next is the victim's old successor). That CAS is the
 *   linearisation point of both. Inserts after, or unlinks through, an
 *   occupied item fail their CAS (they expect the bit clear) and retry.
 *   Readers treat an occupied item with the wanted key as "follow next": the
 *   replacement has the same key, anything else means deleted.
 * - Physical unlink is done by whichever writer walks past an occupied item
 *   (helping); the one whose CAS on the predecessor succeeds is the unlinker.
 *   It first moves every head that still points at the item to the item's
 *   successor in the same bucket (hotspot inheritance for deletes; for RCU
 *   updates the successor is the new version), then retires it.
 * - Reclamation: the unlinker retires the item with one call_rcu on the
 *   rcu_head inside the item (no allocation); it is freed after one grace
 *   period, unless a head mover raced with its deletion (next point).
 * - Heads are moved by CAS (random movement, sampling, pin, inheritance). A
 *   mover only installs an item it saw live in its read section, and
 *   re-checks it after the CAS, moving the head on if it is occupied. If the
 *   re-check finds the item live, its deletion comes later and the unlinker's
 *   head sweep (before retirement) moves the head itself, so one grace period
 *   covers every reader that loaded the item from a head. If the re-check
 *   finds it occupied, the unlinker may already have swept the heads and
 *   retired it, and a reader may load it from this head before the mover
 *   moves on: the mover sets HR_SEQ_LATE in the item (hr_installed) and the
 *   first callback, which runs after the mover's read section, queues a
 *   second grace period; after it no reader that loaded the item from that
 *   head remains. Only such races pay two grace periods (the old scheme paid
 *   two, plus a separate allocation, for every retirement).
 * - Ordering: every load of a next/head word is acquire, every CAS is
 *   seq_cst, so a published item's contents are visible to whoever loads the
 *   word that points at it, and head fixes observe any table swap.
 * - Progress: ring traversal is lock-free for readers and writers (a failed
 *   CAS means another operation made progress; helpers finish deletions).
 * - No waiting for the rehash. Every operation runs inside an RCU read-side
 *   section and the rehash waits for grace periods between its phases
 *   (hr_rehash.c), so a walk must never wait for a rehash step: that step may
 *   itself be waiting for the walker's read section to end (deadlock; this
 *   happened when a writer retried forever on a half-split ring whose half
 *   held only its split item). Therefore every state the rehash leaves
 *   between two grace periods (split items linked, halves joined through the
 *   old wrap links, halves closed, split items deleted) is a valid ring to
 *   readers and writers: hr_hop() turns a link into the other half into its
 *   closing link, a half reduced to its split item is a one-item ring, and
 *   every retry in hr_wfind() follows a CAS another thread completed. A
 *   writer never leaves its read section to wait, because callers may hold
 *   an outer one.
 *   The one place where a preempted thread can delay another is the per-item
 *   seqlock of hotring.c: accesses to *the same key* wait for an in-flight
 *   in-place write of it (a dozen stores, no allocation or call-outs).
 */
#include <sched.h>
#include <stdlib.h>

#include "common/log.h"
#include "node/index/hr_internal.h"

HR_TLS unsigned hr_tls_shard;
#ifdef HR_TSAN
char hr_tsan_gp;
#endif

unsigned hr_shard_assign(void)
{
    static _Atomic unsigned next_shard;
    hr_tls_shard = atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) + 1;
    if (hr_tls_shard == 0)
        hr_tls_shard = 1;
    return hr_tls_shard;
}

static uint64_t hr_load(_Atomic uint64_t *w)
{
    return atomic_load_explicit(w, memory_order_acquire);
}

/* ---------------------------------------------------------------- reclaim */

static void hr_free_cb2(struct rcu_head *h)
{
    HR_TSAN_ACQUIRE();
    hr_item_free(caa_container_of(h, hr_item, rcu));
}

/* After the first grace period: free x, unless a head mover installed it
 * while it was being deleted (HR_SEQ_LATE; that mover's read section, which
 * set the bit, has ended by now), in which case readers may have loaded it
 * from that head after the retirement: wait for a second grace period. */
static void hr_free_cb1(struct rcu_head *h)
{
    hr_item *x = caa_container_of(h, hr_item, rcu);
    HR_TSAN_ACQUIRE();
    if (atomic_load_explicit(&x->seq, memory_order_acquire) & HR_SEQ_LATE)
        urcu_memb_call_rcu(h, hr_free_cb2); /* the callback owns h again */
    else
        hr_item_free(x);
}

/* Idempotent: a frozen ring can be found by several threads at once. The
 * rcu_head lives in the item, so retiring needs no allocation. */
static void hr_retire(hr_item *x)
{
    if (atomic_fetch_or(&x->seq, HR_SEQ_RETIRED) & HR_SEQ_RETIRED)
        return;
    HR_TSAN_RELEASE();
    urcu_memb_call_rcu(&x->rcu, hr_free_cb1);
}

/* A head mover's CAS just installed x in a head (it saw x live in this read
 * section). If x is already Occupied,
 * its unlinker may have swept the heads before that CAS and retired x, and
 * readers can load x from this head until the mover moves the head on (it
 * does so next, in hr_head_fix): mark x for a second grace period. The load
 * is seq_cst so that, when it finds x live, x's Occupied CAS and the
 * unlinker's later head sweep both come after our head CAS (the sweep then
 * moves the head itself, before x is retired). Inside the mover's read
 * section, which began while x was live, so x is not freed yet. */
void hr_installed(hr_item *x)
{
    if (atomic_load(&x->next) & HR_N_OCC)
        atomic_fetch_or(&x->seq, HR_SEQ_LATE);
}

/* ------------------------------------------------------------------ heads */

/* First live (not Occupied) item of bucket b after x. Returns NULL with
 * *dead set to an item of a cycle when the walk from x ran into a cycle of
 * Occupied items only: the ring is logically empty and, since Occupied words
 * never change, frozen (x itself may be off it, already unlinked). */
static hr_item *hr_live_after(hr_table *t, uint64_t b, hr_item *x, hr_item **dead)
{
    bool all_dead = true;
    hr_cyc cy;
    hr_item *n = hr_hop(t, b, hr_addr(hr_load(&x->next)));
    *dead = NULL;
    hr_cyc_init(&cy, x);
    for (unsigned i = 0; !hr_cyc_step(&cy, n); i++) {
        if (i > (1u << 26))
            return NULL; /* not a ring any more: refuse to guess */
        uint64_t w = hr_load(&n->next);
        if (!(w & HR_N_OCC)) {
            if (hr_bucket(t, n->tag) == b)
                return n;
            all_dead = false;
        }
        n = hr_hop(t, b, hr_addr(w));
    }
    *dead = all_dead ? n : NULL;
    return NULL;
}

/* Retires every item of a frozen ring (its head was just cleared). */
static void hr_retire_ring(hr_index *idx, hr_item *x)
{
    hr_item *n = x;
    unsigned i = 0;
    do {
        hr_item *next = hr_addr(hr_load(&n->next));
        hr_unlinked(idx, n); /* other heads may still point into the ring */
        n = next;
    } while (n != x && ++i < (1u << 24));
}

void hr_head_fix(hr_index *idx, hr_table *t, uint64_t b, hr_item *x)
{
    _Atomic uint64_t *head = &t->heads[b];
    uint64_t hw = hr_load(head);
    while (hr_addr(hw) == x && (hr_load(&x->next) & HR_N_OCC)) {
        hr_item *dead;
        hr_item *nx = hr_live_after(t, b, x, &dead);
        if (!nx && !dead) {
            KV_ERROR("hotring", "bucket %llu: no live successor for a deleted head",
                     (unsigned long long)b);
            return;
        }
        uint64_t nh = nx ? hr_with_addr(hw, nx) : 0;
        /* CAS site: the bucket head. Protects: the head still points at the
         * deleted x; moves it to the next live item of the bucket (hotspot
         * inheritance) or, when no live item is left, empties the bucket. */
        if (atomic_compare_exchange_strong(head, &hw, nh)) {
            if (!nx) {
                hr_retire_ring(idx, dead);
                return;
            }
            hr_installed(nx);
            x = nx;
            hw = nh;
        }
    }
}

bool hr_head_move(hr_index *idx, hr_table *t, uint64_t b, uint64_t hw, hr_item *x, uint64_t bits)
{
    _Atomic uint64_t *head = &t->heads[b];
    KV_ASSERT(x != NULL, "moving a head to no item");
    /* CAS site: the bucket head. Protects: nobody moved the head or changed
     * its sampling bits since hw was read; installs x as the new head. */
    if (!atomic_compare_exchange_strong(head, &hw, hr_with_addr(hw | bits, x)))
        return false;
    hr_cnt_add(hr_my_shard(idx), HR_C_MOVES, 1);
    /* x may have been deleted after we chose it: move on (see design note). */
    hr_installed(x);
    hr_head_fix(idx, t, b, x);
    return true;
}

void hr_unlinked(hr_index *idx, hr_item *x)
{
    hr_table *ts[2] = {atomic_load(&idx->cur), atomic_load(&idx->aux)};
    for (int i = 0; i < 2; i++)
        if (ts[i])
            hr_head_fix(idx, ts[i], hr_bucket(ts[i], x->tag), x);
    hr_retire(x);
}

/* ----------------------------------------------------------------- search */

/* Unlinks the occupied successor n of prev (prev's word was *pw). Returns
 * false when prev itself turned out to be occupied (restart from the head). */
bool hr_help_unlink(hr_index *idx, hr_item *prev, uint64_t *pw, hr_item *n, uint64_t nw)
{
    uint64_t nv = hr_with_addr(*pw, hr_addr(nw));
    KV_ASSERT(!(*pw & HR_N_OCC) && hr_addr(*pw) == n && (nw & HR_N_OCC),
              "helping unlink: prev deleted, not pointing at n, or n live");
    /* CAS site: prev's next word. Protects: prev is live (Occupied clear, the
     * expected value has it clear) and still points at the deleted n; swings
     * it past n, keeping prev's own counter and Rehash bits. */
    if (atomic_compare_exchange_strong(&prev->next, pw, nv)) {
        hr_unlinked(idx, n);
        *pw = nv;
        return true;
    }
    return !(*pw & HR_N_OCC);
}

int hr_wfind(hr_index *idx, hr_table *t, uint64_t b, const hr_okey *k, int cleanup, hr_win *w)
{
    _Atomic uint64_t *head = &t->heads[b];
    unsigned vis = 0;
retry:;
    hr_item *x = hr_addr(hr_load(head));
    if (!x) {
        w->visited = vis;
        return HR_FIND_EMPTY;
    }
    uint64_t pw = hr_load(&x->next);
    if (pw & HR_N_OCC) { /* start from a live item: inherit the head first */
        hr_head_fix(idx, t, b, x);
        goto retry;
    }
    vis++;
    int c = hr_cmp_key(k, x);
    if (c == 0 && cleanup == HR_MODE_LOOKUP) {
        *w = (hr_win){NULL, pw, x, true, vis};
        return HR_FIND_OK;
    }
    hr_item *start = x, *prev = x;
    for (;;) {
        hr_item *n = hr_addr(pw);
        if (n == prev) { /* one-item ring */
            *w = (hr_win){prev, pw, prev, c == 0, vis};
            return HR_FIND_OK;
        }
        uint64_t nw = hr_load(&n->next);
        if (nw & HR_N_OCC) {
            if (!hr_help_unlink(idx, prev, &pw, n, nw))
                goto retry;
            continue;
        }
        vis++;
        hr_item *v = hr_hop(t, b, n); /* v != n: not-yet-split link, see hr_hop */
        if (v == prev) {
            /* prev is this half's split item and the half holds nothing else:
             * its old wrap link leads straight to the other half's split
             * item, whose sibling is prev. That is a one-item ring, the same
             * window as above, only reached through a link that the rehash
             * closes after a grace period. Treating it as a broken view and
             * retrying (as this function once did) waited inside the read
             * section for the rehash, which waited for the read section: a
             * deadlock. An insert lands between prev and n, which keeps both
             * the old ring and this half ordered. */
            *w = (hr_win){prev, pw, c == 0 ? prev : n, c == 0, vis};
            return HR_FIND_OK;
        }
        int cn = hr_cmp_key(k, v);
        if (hr_in_window(prev, v, c, cn)) {
            *w = (hr_win){prev, pw, n, cn == 0, vis};
            return HR_FIND_OK;
        }
        /* Back at the start without a window: only a concurrent CAS (an
         * unlink of an item we passed, a head move) can cause that, so the
         * retry follows another thread's progress, never a pending rehash
         * step (see "No waiting for the rehash" above). */
        if (v == start)
            goto retry;
        /* The sibling split item was deleted: the rehash closed the halves
         * meanwhile (it does so without a grace period), so the retry
         * finds plain rings. */
        if (v != n && ((nw = hr_load(&v->next)) & HR_N_OCC))
            goto retry;
        prev = v;
        pw = nw;
        c = cn;
    }
}

/* --------------------------------------------------------- item plumbing */

uint32_t hr_cur_flags(const hr_item *x)
{
    return (uint32_t)((hr_mw(x) & HR_MW_FLAGS_MASK) >> HR_MW_FLAGS_SHIFT);
}

hr_item *hr_item_new_rehash(uint32_t tag)
{
    hr_item *x = hr_mem_alloc(HR_ITEM_HDR);
    if (!x)
        return NULL;
    if ((uintptr_t)x >> 48) {
        hr_mem_free(x, HR_ITEM_HDR);
        return NULL;
    }
    memset(x, 0, HR_ITEM_HDR); /* key length field 0 = HR_KLEN_REHASH */
    x->tag = tag;
    atomic_init(&x->next, HR_N_REHASH);
    return x;
}

int hr_insert_item(hr_index *idx, hr_table *t, uint64_t b, hr_item *n)
{
    hr_okey k = hr_okey_of(n);
    uint64_t own = hr_is_rehash(n) ? HR_N_REHASH : 0;
    for (;;) {
        hr_win w;
        if (hr_wfind(idx, t, b, &k, HR_MODE_LOOKUP, &w) == HR_FIND_EMPTY) {
            uint64_t zero = 0;
            atomic_store_explicit(&n->next, own | (uint64_t)(uintptr_t)n, memory_order_relaxed);
            /* CAS site: an empty bucket head. Protects: the bucket is still
             * empty; publishes n as a one-item ring. */
            if (atomic_compare_exchange_strong(&t->heads[b], &zero, (uint64_t)(uintptr_t)n))
                return 0;
            continue;
        }
        if (w.found)
            return -1;
        KV_ASSERT(!(w.pw & HR_N_OCC) && hr_addr(w.pw) == w.cur,
                  "insert window: pred deleted or not pointing at cur");
        atomic_store_explicit(&n->next, own | (uint64_t)(uintptr_t)w.cur, memory_order_relaxed);
        /* CAS site: the predecessor's next word. Protects: pred is live and
         * still points at cur (so n lands in order between them); publishes n
         * with release semantics. Split items go into old-table rings, which
         * hold no split links, so pred and cur are adjacent in one ring. */
        if (atomic_compare_exchange_strong(&w.pred->next, &w.pw, hr_with_addr(w.pw, n)))
            return 0;
    }
}

void hr_delete_item(hr_index *idx, hr_table *t, uint64_t b, hr_item *x)
{
    uint64_t xw = hr_load(&x->next);
    KV_ASSERT(!(xw & HR_N_OCC), "deleting a rehash item twice (it has a single deleter)");
    /* CAS site: x's own next word. Protects: x is live; sets Occupied, which
     * freezes the word (logical deletion). Retries only on counter or
     * insert-after-x changes; rehash items have a single deleter. */
    while (!atomic_compare_exchange_strong(&x->next, &xw, xw | HR_N_OCC))
        ;
    hr_head_fix(idx, t, b, x);
    hr_okey k = hr_okey_of(x);
    hr_win w;
    (void)hr_wfind(idx, t, b, &k, HR_MODE_CLEANUP, &w);
}
