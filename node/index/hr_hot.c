/* SPDX-License-Identifier: MIT */
/*
 * HotRing hotspot shifting (paper §3.2): random movement and statistical
 * sampling with the W_t head choice, plus the pin prior. Called from the
 * keyed operations inside their RCU read-side sections.
 *
 * Random movement: every R-th access of a thread (thread-local tick) that is
 * not a head hit CASes the head to the accessed item.
 *
 * Sampling: an R-th cold access sets the head word's Active bit and
 * pre-charges the 15-bit total so that it saturates after
 * max(average ring length, HR_SAMPLE_MIN) samples. While Active, each hit bumps the
 * total (CAS on the head word) and the item's 14-bit counter (one CAS on its
 * next word, skipped when it would overflow or the item is Occupied, so the
 * counters never carry into the flag or address bits). The thread whose
 * increment saturates the total decides: it walks the ring once, computes
 *   W_t = sum_k n_k * dist(t, k)   (dist = hops from candidate head t to k)
 * for every candidate t in O(L) (moving the head one step forward subtracts
 * N - n_t and adds n_t * (L - 1)), resets the counters, clears Active and
 * CASes the head to the minimum. Dividing by N does not change the argmin.
 *
 * First guess: a head that sampling never evaluated (total field 0 while
 * idle: a new ring, every ring after a load or a rehash) is moved to the
 * item of its first cold access, whichever thread's tick that is (one CAS a
 * ring, once), and the total field is left at 1 (HR_H_SEEN) from then on,
 * also after every decision. The item a read reaches is drawn by the
 * workload, so the guess is the hottest item as often as that item takes
 * the ring's reads, and a fresh ring is placed by its first cold read
 * instead of the first one that falls on a thread's R-th tick (~R reads of
 * the ring later, plus a sampling round's ring-length more with no first
 * guess); this matters for the many lukewarm rings of a skewed key space
 * after a load or a restart. Later hotspot shifts go through sampling.
 *
 * Calm rings: sampling is not free (two CASes per sampled access, which
 * dirty the head word and the item's next word), and a ring without a
 * hotspot gains nothing from it; under a uniform load every ring would
 * sample all the time. So a decision whose best head saves less than
 * 1/HR_CALM_GAIN of the current head's W_t marks the ring calm (idle total
 * 2, HR_H_CALM) and a calm ring starts a round on only one in
 * 2^HR_CALM_SHIFT of its R-th cold accesses (a thread-local PRNG decides,
 * so the fast path stays free of shared writes). The head still moves to
 * the W_t minimum as in the paper. A decision with a larger gain leaves the
 * ring eager (HR_H_SEEN) only when one item took at least half of the
 * round's samples: a round has about a ring's length of samples, and under
 * a uniform load their chance counts showed a gain of 1/4 in about 70 % of
 * the rounds of an 8-item ring, which kept most uniform rings eager and
 * sampling, while one item with half of 8 uniform samples happens in about
 * 7 % of them (an item taking half of the ring's reads still reaches it in
 * about 3 rounds of 4). A hotspot appearing in a calm ring is thus found
 * after ~R * 2^HR_CALM_SHIFT accesses to the ring instead of ~R, i.e. a
 * few hundred accesses of a hot key.
 *
 * Pins: an item carrying HR_F_PINNED (set by hr_pin from cluster hot-key
 * hints) holds its ring's head against every unpinned item. A decision on
 * a ring whose head is pinned considers only pinned candidates (W_t decides
 * between two pinned keys of one ring), and random movement never leaves a
 * pinned head for an unpinned item. Local evidence cannot outweigh the hint:
 * a router reads at ONE from the key's primary, so the other replicas of a
 * hot key see few or none of its reads, and a round of a few samples on such
 * a replica is drawn from the ring's cold keys (a 2x-cost prior let those
 * rounds move pinned heads: bench/README.md, "Pinned heads on replicas").
 * On a ring whose head is not pinned, a pinned item competes with W_t and
 * every other candidate with HR_PIN_BIAS * W_t. Clearing the flag
 * (hr_set_flags) hands the ring back to plain sampling.
 */
#include "node/index/hr_internal.h"

HR_TLS unsigned hr_tls_tick;
static HR_TLS unsigned hr_tls_rng;

static uint64_t hr_ld(_Atomic uint64_t *w)
{
    return atomic_load_explicit(w, memory_order_acquire);
}

static void hr_activate(hr_index *idx, hr_table *t, uint64_t b, uint64_t hw)
{
    if (atomic_load_explicit(&idx->aux, memory_order_relaxed))
        return; /* no sampling while a rehash reshapes the rings */
    /* About one sample per item of an average ring (no walk to measure this
     * ring: activation happens on every R-th cold access). */
    unsigned target = atomic_load_explicit(&idx->avg_ring, memory_order_relaxed);
    if (target < HR_SAMPLE_MIN)
        target = HR_SAMPLE_MIN;
    if (target > HR_N_CNT_MAX)
        target = HR_N_CNT_MAX;
    uint64_t nh =
        (hw & HR_ADDR_MASK) | HR_H_ACTIVE | ((HR_H_TOTAL_MAX - target) << HR_H_TOTAL_SHIFT);
    /* CAS site: the bucket head. Protects: same head, not sampling yet;
     * starts a sampling round (Active + pre-charged total). */
    (void)atomic_compare_exchange_strong(&t->heads[b], &hw, nh);
}

static void hr_count_item(hr_item *x)
{
    uint64_t w = hr_ld(&x->next);
    if ((w & HR_N_OCC) || ((w & HR_N_CNT_MASK) >> HR_N_CNT_SHIFT) == HR_N_CNT_MAX)
        return;
    KV_ASSERT(((w & HR_N_CNT_MASK) >> HR_N_CNT_SHIFT) < HR_N_CNT_MAX, "counter would carry");
    /* CAS site: x's next word. Protects: x live and its counter below the
     * 14-bit maximum (no carry into Occupied); one attempt, samples are lossy. */
    (void)atomic_compare_exchange_strong(&x->next, &w, w + (UINT64_C(1) << HR_N_CNT_SHIFT));
}

/* Collects the ring from h; false when the walk did not come back to h. */
static bool hr_collect(hr_table *t, uint64_t b, hr_item *h, hr_ring_view *rv)
{
    hr_item *x = h;
    rv->len = 0;
    rv->total = 0;
    do {
        if (rv->len == HR_RING_SCAN)
            return false;
        uint64_t w = hr_ld(&x->next);
        unsigned i = rv->len++;
        rv->it[i] = x;
        rv->cnt[i] = (uint32_t)((w & HR_N_CNT_MASK) >> HR_N_CNT_SHIFT);
        rv->cand[i] = !(w & HR_N_OCC) && !hr_is_rehash(x) && hr_bucket(t, x->tag) == b;
        rv->pin[i] = rv->cand[i] && (hr_cur_flags(x) & HR_F_PINNED);
        rv->total += rv->cnt[i];
        x = hr_addr(w);
    } while (x != h);
    return true;
}

unsigned hr_best_head(const hr_ring_view *rv)
{
    uint64_t L = rv->len, N = rv->total, W = 0, best_eff = UINT64_MAX;
    unsigned best = 0;
    bool pinned_head = L && rv->pin[0]; /* only pinned items may take it over */
    for (unsigned k = 0; k < L; k++)
        W += (uint64_t)rv->cnt[k] * k;
    for (unsigned t = 0; t < L; t++) {
        uint64_t eff = rv->pin[t] ? W : W * HR_PIN_BIAS;
        if (rv->cand[t] && (rv->pin[t] || !pinned_head) && eff < best_eff) {
            best_eff = eff;
            best = t;
        }
        W = W - (N - rv->cnt[t]) + (uint64_t)rv->cnt[t] * (L - 1);
    }
    return best;
}

uint64_t hr_ring_cost(const hr_ring_view *rv, unsigned t)
{
    uint64_t w = 0;
    for (unsigned k = 0; k < rv->len; k++)
        w += (uint64_t)rv->cnt[k] * ((k + rv->len - t) % rv->len);
    return w;
}

static void hr_reset_counts(const hr_ring_view *rv)
{
    for (unsigned i = 0; i < rv->len; i++) {
        uint64_t w = hr_ld(&rv->it[i]->next);
        /* CAS site: item next word. Protects: live item; zeroes only the
         * counter bits, retrying while inserts/unlinks change the address. */
        while ((w & HR_N_CNT_MASK) && !(w & HR_N_OCC) &&
               !atomic_compare_exchange_strong(&rv->it[i]->next, &w, w & ~HR_N_CNT_MASK))
            ;
    }
}

/* Ends a round on head word hw: W_t choice, counter reset, head CAS. */
static void hr_decide(hr_index *idx, hr_table *t, uint64_t b, uint64_t hw)
{
    hr_ring_view rv;
    hr_item *h0 = hr_addr(hw), *to = h0;
    uint64_t idle = HR_H_CALM;
    if (h0 && hr_collect(t, b, h0, &rv)) {
        if (rv.total && !atomic_load(&idx->aux)) {
            unsigned best = hr_best_head(&rv);
            uint64_t w0 = hr_ring_cost(&rv, 0), wb = hr_ring_cost(&rv, best);
            uint32_t top = 0;
            for (unsigned i = 0; i < rv.len; i++)
                top = rv.cnt[i] > top ? rv.cnt[i] : top;
            to = rv.it[best];
            if ((w0 - (wb < w0 ? wb : w0)) * HR_CALM_GAIN >= w0 && w0 > 0 &&
                2 * (uint64_t)top >= rv.total)
                idle = HR_H_SEEN; /* a real hotspot: stay eager */
        }
        hr_reset_counts(&rv);
    }
    _Atomic uint64_t *head = &t->heads[b];
    uint64_t cur = hr_ld(head);
    while ((cur & HR_H_ACTIVE) && ((cur & HR_H_TOTAL_MASK) == HR_H_TOTAL_MASK)) {
        hr_item *dst = hr_addr(cur) == h0 ? to : hr_addr(cur);
        /* CAS site: the bucket head. Protects: the saturated round we own;
         * clears Active/total and installs the chosen head (if the head was
         * inherited meanwhile, only ends the round). */
        if (atomic_compare_exchange_strong(head, &cur, (uint64_t)(uintptr_t)dst | idle)) {
            if (dst != hr_addr(cur)) {
                hr_cnt_add(hr_my_shard(idx), HR_C_MOVES, 1);
                hr_installed(dst);
                hr_head_fix(idx, t, b, dst);
            }
            break;
        }
    }
    hr_cnt_add(hr_my_shard(idx), HR_C_ROUNDS, 1);
}

static void hr_sample(hr_index *idx, hr_table *t, uint64_t b, hr_item *cnt)
{
    if (!cnt)
        return; /* misses are not item accesses */
    hr_count_item(cnt);
    _Atomic uint64_t *head = &t->heads[b];
    uint64_t hw = hr_ld(head);
    for (int i = 0; i < 8 && (hw & HR_H_ACTIVE); i++) {
        uint64_t tot = (hw & HR_H_TOTAL_MASK) >> HR_H_TOTAL_SHIFT;
        if (tot == HR_H_TOTAL_MAX)
            return; /* a decision is in progress */
        uint64_t nh = hw + (UINT64_C(1) << HR_H_TOTAL_SHIFT);
        KV_ASSERT(tot < HR_H_TOTAL_MAX, "sampling total would carry into the address");
        /* CAS site: the bucket head. Protects: the round is still active and
         * the total below its 15-bit maximum; whoever saturates it decides. */
        if (atomic_compare_exchange_strong(head, &hw, nh)) {
            if (tot + 1 == HR_H_TOTAL_MAX)
                hr_decide(idx, t, b, nh);
            return;
        }
    }
}

void hr_hot_slow(hr_index *idx, hr_table *t, uint64_t b, uint64_t hw, hr_item *hit, hr_item *cnt)
{
    if (hw & HR_H_ACTIVE) {
        hr_sample(idx, t, b, cnt);
        return;
    }
    /* The thread's R-th access starts its count again; a fresh ring's cold
     * access below its R-th (hr_hot_access) leaves the count alone, so a
     * fresh ring whose pinned head does not move (below) does not hold back
     * the thread's ticks for every other ring. */
    if (hr_tls_tick >= idx->r)
        hr_tls_tick = 0;
    hr_item *h = hr_addr(hw);
    if (!hit || !h || hit == h)
        return;
    if ((hw & HR_H_TOTAL_MASK) == HR_H_CALM && idx->mode == HR_MODE_SAMPLE) {
        /* xorshift32: a calm ring samples on 1 in 2^HR_CALM_SHIFT turns */
        unsigned x = hr_tls_rng ? hr_tls_rng : 0x9e3779b9u ^ (unsigned)(uintptr_t)&hr_tls_rng;
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        hr_tls_rng = x;
        if (x & ((1u << HR_CALM_SHIFT) - 1))
            return;
    }
    bool first_guess = !(hw & HR_H_TOTAL_MASK); /* sampling never ran on this head */
    if (idx->mode == HR_MODE_RANDOM || first_guess) {
        if ((hr_cur_flags(h) & HR_F_PINNED) && !(hr_cur_flags(hit) & HR_F_PINNED))
            return;
        (void)hr_head_move(idx, t, b, hw, hit, idx->mode == HR_MODE_RANDOM ? 0 : HR_H_SEEN);
        return;
    }
    hr_activate(idx, t, b, hw);
}
