/* SPDX-License-Identifier: MIT */
/*
 * One key's request at its coordinator (kvrouter, or a node for a smart
 * client): kv.Get/Put/Delete sent to the key's replicas and acknowledged by
 * consistency level (writes QUORUM and reads ONE by default). Writes carry
 * the coordinator's HLC version so every replica applies the same
 * last-writer-wins decision and a retry is idempotent. A replica answering
 * FAILED_PRECONDITION with its map makes the coordinator learn it and retry
 * once.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "proto/rpc_timer.h"
#include "proto/rpc_wire.h"
#include "shard/repl_int.h"

/* Index of the reply to return for a read: the OK reply with the newest
 * version, a tombstone (not found, version set) included, so a newer delete
 * beats an older value; on equal versions a found record. -1 when no OK
 * reply parses as a GetReply. */
static int newest_read(rpc_reply *reps, bool *have, int n)
{
    int best = -1;
    uint64_t best_v = 0;
    bool best_found = false;
    uint8_t buf[512];
    rpc_arena ar; /* the replies' copies, values included: gone at the end */
    rpc_arena_init(&ar, buf, sizeof(buf));
    for (int i = 0; i < n; i++) {
        if (!have[i] || reps[i].status != KV_OK)
            continue;
        bool found;
        uint64_t version;
        if (!rpc_wire_get_reply_peek(reps[i].len, reps[i].body, &found, &version)) {
            /* off the common shape: protobuf-c decides, as it always did */
            Kv__GetReply *g =
                kv__get_reply__unpack(rpc_arena_pb(&ar, SIZE_MAX), reps[i].len, reps[i].body);
            if (!g)
                continue;
            found = g->found;
            version = g->version;
        }
        if (best < 0 || version > best_v || (version == best_v && found && !best_found)) {
            best = i;
            best_v = version;
            best_found = found;
        }
    }
    rpc_arena_reset(&ar);
    return best;
}

/* Turns a failed fan-out into the reply status: a node's own verdict
 * (ALREADY_EXISTS, a CAS mismatch, a limit) wins over transport errors. */
static kv_err fan_error(rpc_ctx *c, rpc_reply *reps, bool *have, int n, int ok, int need)
{
    int pick = -1;
    for (int i = 0; i < n; i++) {
        if (!have[i] || reps[i].status == KV_OK)
            continue;
        bool transport = repl_transport_err(reps[i].status);
        if (pick < 0 || !transport)
            pick = i;
        if (!transport)
            break;
    }
    if (pick < 0)
        return rpc_fail(c, KV_UNAVAILABLE, "%d of %d replicas answered in time (need %d)", ok, n,
                        need);
    kv_err s = reps[pick].status;
    if (s == KV_DEADLINE_EXCEEDED || s == KV_CANCELLED)
        s = KV_UNAVAILABLE;
    return rpc_fail(c, s, "%d of %d replicas acknowledged (need %d): %s", ok, n, need,
                    reps[pick].message ? reps[pick].message : kv_strerror(reps[pick].status));
}

static void repair_done(void *arg, rpc_reply *r)
{
    rpc_reply_free(r);
}

/* A conditional write that won at the consistency level is re-sent without
 * its condition (same version, so last-writer-wins makes it idempotent) to
 * the replicas that refused it: they converge instead of keeping the value
 * the condition was checked against. Fire-and-forget. */
static void repair_refusals(const repl_env *env, cmap *m, const uint32_t *idx, rpc_reply *reps,
                            bool *have, int n, const char *method, const ProtobufCMessage *repair,
                            uint32_t dl)
{
    for (int i = 0; repair && i < n; i++) {
        bool refused = have[i] && ((reps[i].status == KV_FAILED_PRECONDITION && !reps[i].len) ||
                                   reps[i].status == KV_ALREADY_EXISTS);
        rpc_chan *ch = refused ? env->chan(env->user, cmap_node_at(m, idx[i])->addr) : NULL;
        if (ch)
            rpc_call_async(ch, method, cmap_epoch(m), repair, dl, repair_done, NULL);
    }
}

/* What is left of a deadline of dl ms that started at t0 (at least 1 ms). */
static uint32_t ms_left(uint64_t t0, uint32_t dl)
{
    uint64_t spent_ms = rpc_since_ns(t0) / 1000000u;
    return spent_ms < dl ? dl - (uint32_t)spent_ms : 1;
}

/* Hinted handoff for the sends of one write whose replies come after the
 * handler returned: a replica that then fails gets a hint on the first
 * replica that acknowledged. */
typedef struct late_hint {
    const repl_env *env;
    cmap *m;
    uint32_t target[2 * REPL_MAX_RF]; /* per send: map index */
    uint8_t *rec;                     /* packed Kv__Record */
    size_t rlen;
} late_hint;

static void late_free(void *arg)
{
    late_hint *h = arg;
    if (!h)
        return;
    cmap_unref(h->m);
    free(h->rec);
    free(h);
}

static void late_reply(void *arg, int i, const rpc_reply *rep, int first_ok)
{
    late_hint *h = arg;
    if (first_ok < 0 || !repl_transport_err(rep->status) || atomic_load(h->env->stopping))
        return;
    Kv__Record *rec = kv__record__unpack(NULL, h->rlen, h->rec);
    if (rec) {
        repl_send_hint(h->env, h->m, h->target[first_ok], h->target[i], &rec, 1);
        kv__record__free_unpacked(rec, NULL);
    }
}

static late_hint *late_new(const repl_env *env, cmap *m, const Kv__Record *rec)
{
    late_hint *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->rlen = kv__record__get_packed_size(rec);
    if (!(h->rec = malloc(h->rlen ? h->rlen : 1))) {
        free(h);
        return NULL;
    }
    kv__record__pack(rec, h->rec);
    h->env = env;
    h->m = cmap_ref(m);
    return h;
}

/* The targets of one forwarded call: for a read the current replicas in
 * read order, for a write the current replicas then the pending ones. */
typedef struct targets {
    uint32_t idx[2 * REPL_MAX_RF];
    int n, ncur, readable, need;
} targets;

static void plan_targets(cmap *m, const ProtobufCBinaryData *key, Kv__Consistency cons,
                         Kv__Consistency dflt, bool is_read, targets *t)
{
    uint32_t cur[REPL_MAX_RF];
    t->ncur = (int)cmap_replicas(m, key->data, key->len, cur);
    t->need = repl_acks_needed(cons, dflt, t->ncur);
    if (is_read) {
        t->readable = repl_read_order(m, cur, t->ncur, t->idx);
        t->n = t->ncur;
        return;
    }
    memcpy(t->idx, cur, (size_t)t->ncur * sizeof(cur[0]));
    t->n = t->ncur + (int)cmap_pending(m, key->data, key->len, t->idx + t->ncur);
}

/* Runs the own replica's reserved call lc after a fan-out's sends: now, or
 * for a start that must not block (held non-NULL) through env->local_try,
 * keeping the call in *held when that declines (repl_finish runs it). */
static void run_local(const repl_env *env, fanout *f, repl_local_call *lc, repl_local_call *held)
{
    if (!held || lc->slot < 0) {
        repl_run_local(env, f, lc);
        return;
    }
    rpc_reply r;
    if (repl_try_local(env, lc->method, lc->epoch, lc->msg, lc->deadline_ms, &r))
        fan_complete(f, lc->slot, &r);
    else
        *held = *lc;
    lc->slot = -1;
}

/* Sends a read to `need` replicas (healthy ones first, the primary first
 * among them, so each key's reads warm one node's memory tier); the rest
 * get it only when those give no verdict (read_rest). held: see run_local. */
static void read_first(const repl_env *env, cmap *m, fanout *f, const targets *t,
                       const char *method, const ProtobufCMessage *msg, uint32_t dl,
                       repl_local_call *held)
{
    repl_local_call lc = {.slot = -1};
    for (int i = 0; i < t->need; i++)
        repl_send(env, f, m, t->idx[i], method, msg, dl, &lc);
    run_local(env, f, &lc, held);
}

/* The rest of the replicas, when the first ones gave no verdict: a dead
 * node fails at once (no pipe), a stalled one after half the deadline
 * (counted from t0, when read_first sent). Returns the sends made in all;
 * *left is what remains of the deadline for the last wait. */
static int read_rest(const repl_env *env, cmap *m, fanout *f, const targets *t, const char *method,
                     const ProtobufCMessage *msg, uint32_t dl, uint64_t t0, uint32_t *left)
{
    repl_local_call lc = {.slot = -1};
    *left = ms_left(t0, dl);
    uint32_t half = ms_left(t0, dl / 2 ? dl / 2 : 1);
    if (t->need >= t->n ||
        fan_wait_answers(f, t->need, t->readable >= t->need ? half : 0) >= t->need)
        return t->need;
    *left = ms_left(t0, dl);
    for (int i = t->need; i < t->n; i++)
        repl_send(env, f, m, t->idx[i], method, msg, *left, &lc);
    repl_run_local(env, f, &lc);
    return t->n;
}

/* Sends a write to every current and pending replica but those the failure
 * detector holds down (they fail at once and get a hint); the
 * coordinator's own replica, if it is one, last, in-process. held: see
 * run_local. */
static void send_write(const repl_env *env, cmap *m, fanout *f, const targets *t,
                       const char *method, const ProtobufCMessage *msg, uint32_t dl,
                       repl_local_call *held)
{
    repl_local_call lc = {.slot = -1};
    for (int i = 0; i < t->n; i++) {
        const cmap_node *nd = cmap_node_at(m, t->idx[i]);
        if (cmap_get_health(m, t->idx[i]) == CMAP_HEALTH_DOWN) {
            char why[CMAP_MAX_ID + 64];
            snprintf(why, sizeof(why), "node %s is down (failure detector)", nd->id);
            atomic_fetch_add_explicit(&env->stats->skipped_down, 1, memory_order_relaxed);
            fan_skip(f, KV_UNAVAILABLE, why);
            continue;
        }
        repl_send(env, f, m, t->idx[i], method, msg, dl, &lc);
    }
    run_local(env, f, &lc, held);
}

/* Waits for a write's acks: the level's from the current replicas, every
 * pending replica (DESIGN.md §4), and the primary (so a read at ONE, which
 * asks the primary, sees every write acknowledged while it was up). */
static void wait_write(fanout *f, const targets *t, uint64_t t0, uint32_t dl)
{
    fan_wait(f, t->need + (t->n - t->ncur), dl);
    for (int i = t->ncur; i < t->n; i++)
        fan_wait_slot(f, i, ms_left(t0, dl));
    if (t->ncur > 1)
        fan_wait_slot(f, 0, ms_left(t0, dl));
}

/* Hints for the sends of a write that failed without a verdict. */
static int first_ok(const targets *t, const rpc_reply *reps, const bool *have)
{
    for (int i = 0; i < t->n; i++)
        if (have[i] && reps[i].status == KV_OK)
            return i;
    return -1;
}

/* A pending replica that failed without a verdict (down, behind on the
 * map, slow) counts as acknowledged once a live replica durably stores a
 * hint for it (repl_store_hint). Returns how many did; sets hinted[i]. */
static int hint_pending(const repl_env *env, cmap *m, const targets *t, const rpc_reply *reps,
                        const bool *have, const Kv__Record *rec, bool *hinted, uint32_t dl)
{
    int holder = first_ok(t, reps, have), n = 0;
    for (int i = t->ncur; holder >= 0 && i < t->n; i++) {
        if ((have[i] && !repl_transport_err(reps[i].status)) || holder >= t->ncur)
            continue;
        if (repl_store_hint(env, m, t->idx[holder], t->idx[i], (Kv__Record **)&rec, 1, dl) ==
            KV_OK) {
            hinted[i] = true;
            n++;
        }
    }
    return n;
}

/* Hints (asynchronous) for the other sends that failed without a verdict. */
static void hint_failed(const repl_env *env, cmap *m, const targets *t, const rpc_reply *reps,
                        const bool *have, const bool *hinted, const Kv__Record *rec)
{
    int holder = first_ok(t, reps, have);
    for (int i = 0; holder >= 0 && i < t->n; i++)
        if (have[i] && repl_transport_err(reps[i].status) && !hinted[i])
            repl_send_hint(env, m, t->idx[holder], t->idx[i], (Kv__Record **)&rec, 1);
}

/* One forwarded call: the request, what a refusal is re-sent as, and its
 * targets. */
typedef struct key_call {
    const char *method;
    const ProtobufCMessage *msg, *repair; /* repair: a conditional write, unconditional */
    const ProtobufCBinaryData *key;
    const Kv__Record *rec; /* writes: what hints carry; NULL for reads */
    targets t;
    uint32_t dl;
    uint64_t t0;
} key_call;

/* Turns the replies of k into the call's verdict: hints for the replicas
 * that gave none, read repair, the chosen reply body in c->reply. */
static kv_err key_verdict(const repl_env *env, rpc_ctx *c, cmap *m, const key_call *k,
                          rpc_reply *reps, bool *have, bool *stale)
{
    const targets *t = &k->t;
    bool is_read = k->rec == NULL;
    int ok = 0, pend_ok = 0, chosen = -1;
    for (int i = 0; i < t->n; i++) {
        bool good = have[i] && reps[i].status == KV_OK;
        if (good && chosen < 0 && i < t->ncur)
            chosen = i;
        ok += good && i < t->ncur;
        pend_ok += good && i >= t->ncur;
        if (have[i] && repl_carries_map(&reps[i])) {
            env->learn_map(env->user, &reps[i], cmap_node_at(m, t->idx[i])->addr);
            *stale = true;
        }
    }
    bool hinted[2 * REPL_MAX_RF] = {false};
    if (!is_read && ok >= t->need && pend_ok < t->n - t->ncur && !k->repair)
        pend_ok += hint_pending(env, m, t, reps, have, k->rec, hinted, ms_left(k->t0, k->dl));
    bool won = ok >= t->need && pend_ok == t->n - t->ncur;
    if (!is_read && (won || !k->repair))
        hint_failed(env, m, t, reps, have, hinted, k->rec);
    if (!won) {
        atomic_fetch_add_explicit(&env->stats->forward_errors, 1, memory_order_relaxed);
        return fan_error(c, reps, have, t->n, ok + pend_ok, t->need + t->n - t->ncur);
    }
    if (is_read && (chosen = newest_read(reps, have, t->n)) < 0) {
        /* replicas said OK with bodies that are not GetReplies (issue 16
         * item 10: this indexed reps[-1]) */
        atomic_fetch_add_explicit(&env->stats->forward_errors, 1, memory_order_relaxed);
        return rpc_fail(c, KV_INTERNAL, "%d replicas answered OK with a malformed kv.Get reply",
                        ok);
    }
    if (is_read)
        repl_read_repair(env, m, k->key, t->idx, reps, have, t->n);
    c->reply = reps[chosen].body; /* the node's reply body is ours to return */
    c->reply_len = reps[chosen].len;
    reps[chosen].body = NULL;
    repair_refusals(env, m, t->idx, reps, have, t->ncur, k->method, k->repair, k->dl);
    return KV_OK;
}

/* A fanout for k, with late hints registered for a write (NULL when out of
 * memory). */
static fanout *key_fanout(const repl_env *env, cmap *m, const key_call *k)
{
    fanout *f = fan_create(k->t.n);
    late_hint *lh = f && k->rec ? late_new(env, m, k->rec) : NULL;
    if (!f || (k->rec && !lh)) {
        late_free(lh);
        if (f)
            fan_release(f);
        return NULL;
    }
    if (lh && k->repair) { /* a conditional write may fail: no hint before its verdict */
        late_free(lh);
        lh = NULL;
    }
    if (lh) {
        memcpy(lh->target, k->t.idx, (size_t)k->t.n * sizeof(k->t.idx[0]));
        fan_on_late(f, late_reply, lh, late_free);
    }
    return f;
}

/* One key's call in flight: started (sent) by key_start, completed by
 * key_finish. */
struct repl_call {
    const repl_env *env;
    key_call k;
    Kv__Consistency cons, dflt;
    cmap *m;
    fanout *f;
    /* repl_await */
    void (*done)(void *arg, bool ready);
    void *done_arg;
    rpc_timer_ent timer; /* a read's half deadline: fan_poke */
    bool timer_armed;
    bool retry; /* repl_complete's verdict was refused on an old map: repl_finish retries */
    /* a start that must not block (repl_*_start_nb): the own replica's call
     * that env->local_try declined, run by repl_finish (slot < 0: none) */
    repl_local_call held;
    /* what a write's key_call points into */
    Kv__Record rec;
    union {
        Kv__PutRequest put;
        Kv__DeleteRequest del;
    } repair;
};

/* Plans rc's targets on the current map and sends: a read to its first
 * replicas, a write to all of them; nb: without blocking (run_local's
 * held is rc->held). */
static kv_err key_start(repl_call *rc, rpc_ctx *c, bool nb)
{
    const repl_env *env = rc->env;
    key_call *k = &rc->k;
    kv_err rv = KV_OK;
    if (!(rc->m = repl_map(env, c, &rv)))
        return rv;
    plan_targets(rc->m, k->key, rc->cons, rc->dflt, k->rec == NULL, &k->t);
    k->dl = repl_forward_deadline(c);
    if (!(rc->f = key_fanout(env, rc->m, k))) {
        cmap_unref(rc->m);
        rc->m = NULL;
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    }
    k->t0 = rpc_now_ns();
    repl_local_call *held = nb ? &rc->held : NULL;
    if (k->rec == NULL)
        read_first(env, rc->m, rc->f, &k->t, k->method, k->msg, k->dl, held);
    else
        send_write(env, rc->m, rc->f, &k->t, k->method, k->msg, k->dl, held);
    return KV_OK;
}

/* Turns the replies to rc's `sent` sends into the verdict; *stale when a
 * replica showed a newer map. */
static kv_err key_collect(repl_call *rc, rpc_ctx *c, bool *stale, int sent)
{
    const repl_env *env = rc->env;
    key_call *k = &rc->k;
    atomic_fetch_add_explicit(&env->stats->forwards, (uint64_t)sent, memory_order_relaxed);
    rpc_reply reps[2 * REPL_MAX_RF];
    bool have[2 * REPL_MAX_RF] = {false}; /* fan_take fills only the sends made */
    fan_take(rc->f, reps, have);
    fan_release(rc->f);
    rc->f = NULL;
    kv_err rv = key_verdict(env, c, rc->m, k, reps, have, stale);
    for (int i = 0; i < k->t.n; i++)
        if (have[i])
            rpc_reply_free(&reps[i]);
    cmap_unref(rc->m);
    rc->m = NULL;
    return rv;
}

/* Waits for enough replies to rc's sends and turns them into the verdict;
 * *stale when a replica showed a newer map. */
static kv_err key_wait(repl_call *rc, rpc_ctx *c, bool *stale)
{
    const repl_env *env = rc->env;
    key_call *k = &rc->k;
    int sent = k->t.n;
    if (k->rec == NULL) {
        uint32_t left;
        sent = read_rest(env, rc->m, rc->f, &k->t, k->method, k->msg, k->dl, k->t0, &left);
        fan_wait(rc->f, k->t.need, left);
    } else {
        wait_write(rc->f, &k->t, k->t0, k->dl);
    }
    return key_collect(rc, c, stale, sent);
}

/* Stops rc's half-deadline timer (repl_await), waiting for its function to
 * return if it runs: rc's fanout and rc itself may go after this. */
static void await_stop(repl_call *rc)
{
    if (rc->timer_armed) {
        rpc_timer_cancel(&rc->timer);
        rc->timer_armed = false;
    }
}

kv_err repl_finish(repl_call *rc, rpc_ctx *c)
{
    await_stop(rc);
    if (rc->held.slot >= 0 && !rc->retry)
        repl_run_local(rc->env, rc->f, &rc->held);
    /* rc->retry: repl_complete reached a verdict on an old map already */
    bool stale = rc->retry;
    kv_err rv = rc->retry ? KV_FAILED_PRECONDITION : key_wait(rc, c, &stale);
    if (rv != KV_OK && stale) { /* once more, on the newer map */
        free(c->reply);
        c->reply = NULL;
        c->reply_len = 0;
        stale = false;
        rv = key_start(rc, c, false);
        if (rv == KV_OK)
            rv = key_wait(rc, c, &stale);
    }
    free(rc);
    return rv;
}

/* Starts rc (heap) and hands it to the caller, or frees it on failure. */
static kv_err start_call(repl_call *rc, rpc_ctx *c, bool nb, repl_call **out)
{
    kv_err rv = key_start(rc, c, nb);
    if (rv != KV_OK) {
        free(rc);
        return rv;
    }
    *out = rc;
    return KV_OK;
}

static repl_call *call_new(const repl_env *env, Kv__Consistency cons, Kv__Consistency dflt)
{
    repl_call *rc = calloc(1, sizeof(*rc));
    if (rc) {
        rc->env = env;
        rc->cons = cons;
        rc->dflt = dflt;
        rc->held.slot = -1;
    }
    return rc;
}

/* A read that needs one answer and whose first replica is the
 * coordinator's own node: that replica's verdict is the read's (one answer,
 * nothing to repair), without a fan-out. Returns false, doing nothing, when
 * the read is not such a read or the node gave no verdict (it does not
 * serve reads, say): the fan-out then asks it and the others. try_only:
 * only when env->local_try serves it without blocking. */
bool repl_read_alone(const repl_env *env, cmap *m, const ProtobufCBinaryData *key,
                     Kv__Consistency cons, int *nrep)
{
    uint32_t cur[REPL_MAX_RF], order[REPL_MAX_RF];
    int n = (int)cmap_replicas(m, key->data, key->len, cur);
    if (nrep)
        *nrep = n;
    int need = repl_acks_needed(cons, KV__CONSISTENCY__ONE, n);
    return env->local && need == 1 && repl_read_order(m, cur, n, order) > 0 &&
           repl_is_self(env, m, order[0]);
}

static bool read_self(const repl_env *env, rpc_ctx *c, Kv__GetRequest *req, bool try_only,
                      kv_err *rv)
{
    cmap *m = env->local ? cmap_slot_get(env->maps) : NULL;
    if (!m)
        return false;
    int n;
    bool mine = repl_read_alone(env, m, &req->key, req->consistency, &n);
    rpc_reply r = {0};
    if (mine && try_only)
        mine =
            repl_try_local(env, "kv.Get", cmap_epoch(m), &req->base, repl_forward_deadline(c), &r);
    else if (mine)
        repl_call_local(env, "kv.Get", cmap_epoch(m), &req->base, repl_forward_deadline(c), &r);
    bool done = mine && !repl_transport_err(r.status) && !repl_carries_map(&r);
    if (done) {
        atomic_fetch_add_explicit(&env->stats->forwards, 1, memory_order_relaxed);
        c->reply_epoch = cmap_epoch(m);
        if (r.status == KV_OK) {
            c->reply = r.body; /* the replica's GetReply is the reply */
            c->reply_len = r.len;
            r.body = NULL;
            *rv = KV_OK;
        } else { /* as fan_error words a lone verdict */
            atomic_fetch_add_explicit(&env->stats->forward_errors, 1, memory_order_relaxed);
            *rv = rpc_fail(c, r.status, "0 of %d replicas acknowledged (need 1): %s", n,
                           r.message ? r.message : kv_strerror(r.status));
        }
    }
    rpc_reply_free(&r);
    cmap_unref(m);
    return done;
}

static kv_err get_start(const repl_env *env, rpc_ctx *c, Kv__GetRequest *req, bool nb,
                        repl_call **out)
{
    kv_err rv;
    if (read_self(env, c, req, nb, &rv)) {
        *out = NULL;
        return rv;
    }
    repl_call *rc = call_new(env, req->consistency, KV__CONSISTENCY__ONE);
    if (!rc)
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    rc->k = (key_call){.method = "kv.Get", .msg = &req->base, .key = &req->key};
    return start_call(rc, c, nb, out);
}

kv_err repl_get_start(const repl_env *env, rpc_ctx *c, Kv__GetRequest *req, repl_call **out)
{
    return get_start(env, c, req, false, out);
}

kv_err repl_get_start_nb(const repl_env *env, rpc_ctx *c, Kv__GetRequest *req, repl_call **out)
{
    return get_start(env, c, req, true, out);
}

static kv_err put_start(const repl_env *env, rpc_ctx *c, Kv__PutRequest *req, bool nb,
                        repl_call **out)
{
    repl_call *rc = call_new(env, req->consistency, KV__CONSISTENCY__QUORUM);
    if (!rc)
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    if (!req->version)
        req->version = kv_hlc_now(env->hlc);
    rc->repair.put = *req;
    rc->repair.put.if_version = 0;
    rc->repair.put.if_absent = false;
    bool conditional = req->if_version || req->if_absent;
    kv__record__init(&rc->rec);
    rc->rec.key = req->key;
    rc->rec.value = req->value;
    rc->rec.version = req->version;
    rc->rec.expire_at_ms = req->ttl_ms ? kv_wall_ms() + req->ttl_ms : 0;
    rc->k = (key_call){.method = "kv.Put",
                       .msg = &req->base,
                       .repair = conditional ? &rc->repair.put.base : NULL,
                       .key = &req->key,
                       .rec = &rc->rec};
    return start_call(rc, c, nb, out);
}

kv_err repl_put_start(const repl_env *env, rpc_ctx *c, Kv__PutRequest *req, repl_call **out)
{
    return put_start(env, c, req, false, out);
}

kv_err repl_put_start_nb(const repl_env *env, rpc_ctx *c, Kv__PutRequest *req, repl_call **out)
{
    return put_start(env, c, req, true, out);
}

static kv_err delete_start(const repl_env *env, rpc_ctx *c, Kv__DeleteRequest *req, bool nb,
                           repl_call **out)
{
    repl_call *rc = call_new(env, req->consistency, KV__CONSISTENCY__QUORUM);
    if (!rc)
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    if (!req->version)
        req->version = kv_hlc_now(env->hlc);
    rc->repair.del = *req;
    rc->repair.del.if_version = 0;
    kv__record__init(&rc->rec);
    rc->rec.key = req->key;
    rc->rec.version = req->version;
    rc->rec.tombstone = true;
    rc->k = (key_call){.method = "kv.Delete",
                       .msg = &req->base,
                       .repair = req->if_version ? &rc->repair.del.base : NULL,
                       .key = &req->key,
                       .rec = &rc->rec};
    return start_call(rc, c, nb, out);
}

kv_err repl_delete_start(const repl_env *env, rpc_ctx *c, Kv__DeleteRequest *req, repl_call **out)
{
    return delete_start(env, c, req, false, out);
}

kv_err repl_delete_start_nb(const repl_env *env, rpc_ctx *c, Kv__DeleteRequest *req,
                            repl_call **out)
{
    return delete_start(env, c, req, true, out);
}

kv_err repl_get(const repl_env *env, rpc_ctx *c, Kv__GetRequest *req)
{
    repl_call *rc = NULL;
    kv_err rv = repl_get_start(env, c, req, &rc);
    return rv == KV_OK && rc ? repl_finish(rc, c) : rv;
}

kv_err repl_put(const repl_env *env, rpc_ctx *c, Kv__PutRequest *req)
{
    repl_call *rc;
    kv_err rv = repl_put_start(env, c, req, &rc);
    return rv == KV_OK ? repl_finish(rc, c) : rv;
}

kv_err repl_delete(const repl_env *env, rpc_ctx *c, Kv__DeleteRequest *req)
{
    repl_call *rc;
    kv_err rv = repl_delete_start(env, c, req, &rc);
    return rv == KV_OK ? repl_finish(rc, c) : rv;
}

/* ---- completion-driven finish (repl_await) ------------------------------ */

/* Whether the replies in so far let rc reach its verdict without waiting,
 * as key_wait's waits would return: a read's first sends all answered (a
 * verdict each, or no more to wait for); a write's level of OK acks with
 * the primary's among them (wait_write), or every send answered. Under
 * f's lock. */
static bool await_ready(void *arg, const fanout *f)
{
    const repl_call *rc = arg;
    const targets *t = &rc->k.t;
    if (f->done == f->sent)
        return true;
    if (rc->k.rec == NULL)
        return f->answered >= t->need;
    return f->ok >= t->need && (t->ncur <= 1 || f->have[0]);
}

static void await_fire(void *arg, bool ready)
{
    repl_call *rc = arg;
    rc->done(rc->done_arg, ready);
}

/* The timer thread, at half a staged read's deadline: the first replicas
 * are slow; fan_poke hands the read to a thread that may ask the others. */
static void await_timer(void *arg)
{
    repl_call *rc = arg;
    fan_poke(rc->f);
}

void repl_await(repl_call *rc, void (*done)(void *arg, bool ready), void *arg)
{
    key_call *k = &rc->k;
    rc->done = done;
    rc->done_arg = arg;
    if (rc->held.slot >= 0) { /* the own replica's call must block: repl_finish runs it */
        done(arg, false);
        return;
    }
    if (k->rec && k->t.n > k->t.ncur) { /* pending replicas: hint_pending may block */
        done(arg, false);
        return;
    }
    /* a read with more replicas to ask if the first are slow (read_rest):
     * the timer is armed before the fanout, so whoever completes rc finds
     * it armed and stops it first */
    if (!k->rec && k->t.need < k->t.n && k->t.readable >= k->t.need) {
        rc->timer = (rpc_timer_ent){.fn = await_timer, .arg = rc};
        uint32_t half = k->dl / 2 ? k->dl / 2 : 1;
        rc->timer_armed = rpc_timer_arm(&rc->timer, k->t0 + (uint64_t)half * 1000000ull);
    }
    bool ready;
    if (fan_arm(rc->f, await_ready, await_fire, rc, &ready))
        done(arg, ready);
}

bool repl_complete(repl_call *rc, rpc_ctx *c, kv_err *out)
{
    await_stop(rc);
    key_call *k = &rc->k;
    /* a read needs `need` verdicts from its first sends, else the others */
    if (k->rec == NULL && fan_answers(rc->f) < k->t.need)
        return false;
    bool stale = false;
    kv_err rv = key_collect(rc, c, &stale, k->rec ? k->t.n : k->t.need);
    if (rv != KV_OK && stale) {
        rc->retry = true;
        return false;
    }
    free(rc);
    *out = rv;
    return true;
}
