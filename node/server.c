/* SPDX-License-Identifier: MIT */
/*
 * kvnode RPC handlers: kv.Get/Put/Delete/Batch over the engine, and the
 * admin.* methods (Ping, Stats, GetMap, SetMap). Every request is validated
 * against the limits and the node's cluster map before it touches the
 * engine: a key the node holds no replica of, or a caller with a stale map
 * epoch, gets FAILED_PRECONDITION with the node's map in the reply body.
 */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/node.h"
#include "proto/statlist.h"
#include "proto/kv.pb-c.h"

/* ---- cluster map ------------------------------------------------------- */

/* Fails the call with FAILED_PRECONDITION and the node's map as the body. */
static kv_err fail_with_map(rpc_ctx *c, cmap *m, const char *why)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    if (cmap_encode(m, &buf, &len) == KV_OK) {
        free(c->reply);
        c->reply = buf;
        c->reply_len = len;
    }
    return rpc_fail(c, KV_FAILED_PRECONDITION, "%s", why);
}

/* The node's map for this call (NULL = no map: serve every key, as a
 * one-node cluster, but only to callers that know no map either). Fails the
 * call when the caller's epoch is stale. On KV_OK the caller unrefs *out. */
static kv_err call_map(node *n, rpc_ctx *c, cmap **out)
{
    cmap *m = cmap_slot_get(n->maps);
    *out = m;
    if (c->map_epoch && (!m || c->map_epoch > cmap_epoch(m)))
        node_map_saw_epoch(n, c->map_epoch);
    if (!m && c->map_epoch) {
        char why[200];
        node_serving(n, why, sizeof(why));
        return rpc_fail(c, KV_UNAVAILABLE, "node %s: %s", n->cfg.id, why);
    }
    if (!m)
        return KV_OK;
    c->reply_epoch = cmap_epoch(m);
    if (c->map_epoch && c->map_epoch < cmap_epoch(m)) {
        char why[128];
        snprintf(why, sizeof(why), "stale map epoch %llu (node has %llu)",
                 (unsigned long long)c->map_epoch, (unsigned long long)cmap_epoch(m));
        kv_err rv = fail_with_map(c, m, why);
        cmap_unref(m);
        *out = NULL;
        return rv;
    }
    return KV_OK;
}

static bool holds_replica(node *n, cmap *m, const void *key, size_t klen)
{
    return node_holds(n, m, key, klen);
}

/* Reads from a cluster (map_epoch > 0) are refused while the node is not
 * SERVING (catching up, needs repair): the router reads another replica.
 * m: the call's map (call_map), which the caller holds. */
static kv_err check_readable(node *n, rpc_ctx *c, const cmap *m)
{
    const char *why;
    if (!c->map_epoch || node_serving_in(n, m, &why) == KV__SERVING__SERVING)
        return KV_OK;
    return rpc_fail(c, KV_UNAVAILABLE, "node %s does not serve reads: %s", n->cfg.id, why);
}

static kv_err check_key(node *n, rpc_ctx *c, cmap *m, const ProtobufCBinaryData *key)
{
    kv_err rv = kv_check_key(&n->cfg.limits, key->len, c->message, sizeof(c->message));
    if (rv != KV_OK)
        return rv;
    if (!holds_replica(n, m, key->data, key->len) && c->map_epoch > cmap_epoch(m))
        return rpc_fail(c, KV_UNAVAILABLE,
                        "node %s has map epoch %llu, older than the caller's %llu: fetching it",
                        n->cfg.id, (unsigned long long)cmap_epoch(m),
                        (unsigned long long)c->map_epoch);
    if (!holds_replica(n, m, key->data, key->len)) {
        char why[160];
        snprintf(why, sizeof(why), "node %s holds no replica of this key (map epoch %llu)",
                 n->cfg.id, (unsigned long long)cmap_epoch(m));
        return fail_with_map(c, m, why);
    }
    return KV_OK;
}

/* A write without a version comes from a client: routers and coordinating
 * nodes version every write they send. Applied here it would reach this
 * one replica and no other, acknowledged but not replicated (a smart
 * client's fallback once sent its writes so). So it is refused unless this
 * node is the key's only replica (rf 1 and no replica pending), where
 * applying it is what a coordinator would do. Into err (a batch op's). */
static kv_err check_client_write(node *n, cmap *m, const ProtobufCBinaryData *key, uint64_t version,
                                 char *err, size_t errlen)
{
    if (version || !m) /* no map: the node is in no cluster, every key is its alone */
        return KV_OK;
    uint32_t idx[2 * CMAP_MAX_RF];
    size_t cur = cmap_replicas(m, key->data, key->len, idx);
    size_t all = cur + cmap_pending(m, key->data, key->len, idx + cur);
    if (all <= 1)
        return KV_OK;
    snprintf(err, errlen,
             "a write without a version reached node %s, one of the key's %zu replicas, where it "
             "would be stored on this replica only: send writes through a router, or ask the "
             "node to coordinate them (Envelope.coordinate: libkvclient's direct option)",
             n->cfg.id, all);
    return KV_FAILED_PRECONDITION;
}

/* ---- kv.* -------------------------------------------------------------- */

kv_err node_check_version(uint64_t version, char *err, size_t errlen)
{
    uint64_t now = kv_wall_ms();
    if (KV_HLC_MS(version) <= now + NODE_VERSION_MAX_AHEAD_MS)
        return KV_OK;
    snprintf(err, errlen,
             "version %llu is %llu s ahead of this node's clock (at most %u s allowed): a "
             "version that far ahead would hide every later write of the key",
             (unsigned long long)version, (unsigned long long)((KV_HLC_MS(version) - now) / 1000),
             NODE_VERSION_MAX_AHEAD_MS / 1000);
    return KV_INVALID_ARGUMENT;
}

/* A replica write's version (0 = the node gives one): only a coordinator
 * (admin credentials: a router, a coordinating node) may set it, never a
 * client, and never far ahead of the clock (docs/protocol.md "Versions"). */
static kv_err check_write_version(rpc_ctx *c, uint64_t version, char *err, size_t errlen)
{
    if (!version)
        return KV_OK;
    if (!c->admin) {
        snprintf(err, errlen,
                 "a write's version is set by coordinators (routers, nodes), not "
                 "clients: leave it 0, or call with the admin token");
        return KV_INVALID_ARGUMENT;
    }
    return node_check_version(version, err, errlen);
}

/* Unpacks body as type into var, with an allocation budget (issue 16 item
 * 4: a request may not make the node allocate much more than its size and
 * its limits allow); INVALID_ARGUMENT when it does not parse or would. */
#define NODE_BUDGET(c, len) rpc_unpack_budget(len, ((node *)(c)->user)->cfg.limits.max_batch_ops)
#define UNPACK_OR_FAIL(var, type, fn, c, body, len)                                                \
    rpc_budget var##_budget;                                                                       \
    type *var = fn(rpc_budget_init(&var##_budget, NODE_BUDGET(c, len)), len, body);                \
    if (!var)                                                                                      \
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed " #type " body");

/* kv.Get; mem_only (the receive callback, rpc_method.try_inline): false,
 * with nothing done but checks that have no effect, when the read needs a
 * thread that may block (engine_get_mem declined); else true with the
 * status in *out. mine: the map a coordinator on this node holds and
 * found this node to be the key's replica in (c's epoch is its epoch), so
 * neither is looked up again; NULL for a call from outside. */
static bool get_req(rpc_ctx *c, const Kv__GetRequest *req, bool mem_only, cmap *mine, kv_err *out)
{
    node *n = c->user;
    cmap *m = mine, *own = NULL; /* own: the reference call_map took, dropped here */
    kv_err rv = KV_OK;
    if (mine) {
        c->reply_epoch = cmap_epoch(mine);
        rv = kv_check_key(&n->cfg.limits, req->key.len, c->message, sizeof(c->message));
    } else {
        rv = call_map(n, c, &own);
        m = own;
        if (rv == KV_OK)
            rv = check_key(n, c, m, &req->key);
    }
    if (rv == KV_OK)
        rv = check_readable(n, c, m);
    engine_result r = {0};
    if (rv == KV_OK && mem_only &&
        engine_get_mem(n->eng, req->key.data, req->key.len, &r) == KV_NOT_FOUND) {
        cmap_unref(own);
        return false;
    }
    if (rv == KV_OK && !mem_only)
        rv = engine_get(n->eng, req->key.data, req->key.len, &r);
    if (rv == KV_OK) {
        Kv__GetReply rep = KV__GET_REPLY__INIT;
        rep.found = r.found;
        rep.value.data = r.val;
        rep.value.len = r.vlen;
        rep.version = r.version;
        rep.expire_at_ms = r.found ? r.expire_at : 0;
        rv = rpc_reply_msg(c, &rep.base);
        free(r.val);
    }
    cmap_unref(own);
    *out = rv;
    return true;
}

static bool get_run(rpc_ctx *c, const uint8_t *body, size_t len, bool mem_only, kv_err *out)
{
    uint8_t buf[256];
    rpc_arena ar; /* the request, gone at the return */
    rpc_arena_init(&ar, buf, sizeof(buf));
    Kv__GetRequest *req = (Kv__GetRequest *)rpc_arena_request(&ar, c, &kv__get_request__descriptor,
                                                              body, len, NODE_BUDGET(c, len));
    if (!req) {
        rpc_arena_reset(&ar);
        *out = KV_INVALID_ARGUMENT;
        return true;
    }
    bool served = get_req(c, req, mem_only, NULL, out);
    rpc_arena_reset(&ar);
    return served;
}

bool node_get_mem(rpc_ctx *c, const Kv__GetRequest *req, cmap *mine, kv_err *out)
{
    return get_req(c, req, true, mine, out);
}

static kv_err h_get(rpc_ctx *c, const uint8_t *body, size_t len)
{
    kv_err rv;
    get_run(c, body, len, false, &rv);
    return rv;
}

/* The nng threads that serve reads inline read the memory index, so they
 * register with it on first use, once, and unregister when they exit. */
static pthread_key_t inline_key;
static pthread_once_t inline_once = PTHREAD_ONCE_INIT;

static void inline_thread_exit(void *arg)
{
    (void)arg;
    engine_thread_unregister();
}

static void inline_key_create(void)
{
    pthread_key_create(&inline_key, inline_thread_exit);
}

static void inline_thread_ready(void)
{
    static _Thread_local bool ready;
    if (ready)
        return;
    pthread_once(&inline_once, inline_key_create);
    engine_thread_register();
    pthread_setspecific(inline_key, &ready); /* non-NULL: the destructor runs */
    ready = true;
}

/* kv.Get from the receive callback: memory hits only (rpc_method.try_inline). */
static bool h_get_inline(rpc_ctx *c, const uint8_t *body, size_t len, kv_err *rv)
{
    inline_thread_ready();
    if (c->coordinate) /* rpc_method.inline_coordinate */
        return node_coord_get_inline(c, body, len, rv);
    return get_run(c, body, len, true, rv);
}

/* Applies w for c: engine_write_one, or with mem_only engine_write_mem
 * (*declined when that declines). */
static kv_err write_engine(node *n, rpc_ctx *c, const engine_write *w, bool mem_only,
                           engine_result *r, bool *declined)
{
    return mem_only ? engine_write_mem(n->eng, w, r, declined, c->message, sizeof(c->message))
                    : engine_write_one(n->eng, w, r, c->message, sizeof(c->message));
}

/* kv.Put; mem_only as get_run's: false, with nothing done but checks that
 * have no effect, when the write needs a thread that may block
 * (engine_write_mem declined); else true with the status in *out. */
static bool put_run(rpc_ctx *c, const uint8_t *body, size_t len, bool mem_only, kv_err *out)
{
    node *n = c->user;
    uint8_t buf[512];
    rpc_arena ar; /* the request, gone at the return */
    rpc_arena_init(&ar, buf, sizeof(buf));
    Kv__PutRequest *req = (Kv__PutRequest *)rpc_arena_request(&ar, c, &kv__put_request__descriptor,
                                                              body, len, NODE_BUDGET(c, len));
    if (!req) {
        rpc_arena_reset(&ar);
        *out = KV_INVALID_ARGUMENT;
        return true;
    }
    kv_err rv = check_write_version(c, req->version, c->message, sizeof(c->message));
    cmap *m = NULL;
    if (rv == KV_OK)
        rv = call_map(n, c, &m);
    if (rv == KV_OK)
        rv = check_key(n, c, m, &req->key);
    if (rv == KV_OK)
        rv = check_client_write(n, m, &req->key, req->version, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = kv_check_value(&n->cfg.limits, req->value.len, c->message, sizeof(c->message));
    engine_result r = {0};
    bool declined = false;
    if (rv == KV_OK) {
        engine_write w = {.key = req->key.data,
                          .klen = req->key.len,
                          .val = req->value.data,
                          .vlen = req->value.len,
                          .version = req->version,
                          .ttl_ms = req->ttl_ms,
                          .if_version = req->if_version,
                          .if_absent = req->if_absent};
        rv = write_engine(n, c, &w, mem_only, &r, &declined);
    }
    if (rv == KV_OK && !declined) {
        Kv__PutReply rep = KV__PUT_REPLY__INIT;
        rep.version = r.version;
        rv = rpc_reply_msg(c, &rep.base);
    }
    cmap_unref(m);
    rpc_arena_reset(&ar);
    *out = rv;
    return !declined;
}

/* kv.Delete, as put_run. */
static bool delete_run(rpc_ctx *c, const uint8_t *body, size_t len, bool mem_only, kv_err *out)
{
    node *n = c->user;
    uint8_t buf[256];
    rpc_arena ar; /* the request, gone at the return */
    rpc_arena_init(&ar, buf, sizeof(buf));
    Kv__DeleteRequest *req = (Kv__DeleteRequest *)rpc_arena_request(
        &ar, c, &kv__delete_request__descriptor, body, len, NODE_BUDGET(c, len));
    if (!req) {
        rpc_arena_reset(&ar);
        *out = KV_INVALID_ARGUMENT;
        return true;
    }
    kv_err rv = check_write_version(c, req->version, c->message, sizeof(c->message));
    cmap *m = NULL;
    if (rv == KV_OK)
        rv = call_map(n, c, &m);
    if (rv == KV_OK)
        rv = check_key(n, c, m, &req->key);
    if (rv == KV_OK)
        rv = check_client_write(n, m, &req->key, req->version, c->message, sizeof(c->message));
    engine_result r = {0};
    bool declined = false;
    if (rv == KV_OK) {
        engine_write w = {.key = req->key.data,
                          .klen = req->key.len,
                          .version = req->version,
                          .if_version = req->if_version,
                          .is_delete = true};
        rv = write_engine(n, c, &w, mem_only, &r, &declined);
    }
    if (rv == KV_OK && !declined) {
        Kv__DeleteReply rep = KV__DELETE_REPLY__INIT;
        rep.existed = r.found;
        rv = rpc_reply_msg(c, &rep.base);
    }
    cmap_unref(m);
    rpc_arena_reset(&ar);
    *out = rv;
    return !declined;
}

static kv_err h_put(rpc_ctx *c, const uint8_t *body, size_t len)
{
    kv_err rv;
    put_run(c, body, len, false, &rv);
    return rv;
}

static kv_err h_delete(rpc_ctx *c, const uint8_t *body, size_t len)
{
    kv_err rv;
    delete_run(c, body, len, false, &rv);
    return rv;
}

/* kv.Put and kv.Delete from the receive callback (rpc_method.try_inline):
 * writes whose record is in memory, in sync modes that do not fsync them. */
static bool h_put_inline(rpc_ctx *c, const uint8_t *body, size_t len, kv_err *rv)
{
    inline_thread_ready();
    return put_run(c, body, len, true, rv);
}

static bool h_delete_inline(rpc_ctx *c, const uint8_t *body, size_t len, kv_err *rv)
{
    inline_thread_ready();
    return delete_run(c, body, len, true, rv);
}

/* The status message of a batch op that succeeded (not malloc'ed). */
static char *const op_ok = "";

/* Runs one batch op into res (its status, found, value, version). The
 * batch-level map check already happened; per-op errors stay per op. */
static void batch_op(node *n, rpc_ctx *c, cmap *m, const Kv__Op *op, Kv__OpResult *res,
                     Kv__Status *st, const engine_result *pre, kv_err pre_err)
{
    rpc_ctx tmp = {.admin = c->admin};
    engine_result r = {0};
    kv_err rv = check_key(n, &tmp, m, &op->key);
    if (rv == KV_OK && op->type != KV__OP_TYPE__GET)
        rv = check_write_version(&tmp, op->version, tmp.message, sizeof(tmp.message));
    if (rv == KV_OK && op->type != KV__OP_TYPE__GET)
        rv = check_client_write(n, m, &op->key, op->version, tmp.message, sizeof(tmp.message));
    free(tmp.reply);
    if (rv == KV_OK && op->type == KV__OP_TYPE__GET) {
        rv = pre_err; /* read together with its neighbours (read_run) */
        r = *pre;
    } else if (rv == KV_OK) {
        bool del = op->type == KV__OP_TYPE__DELETE;
        if (!del)
            rv = kv_check_value(&n->cfg.limits, op->value.len, tmp.message, sizeof(tmp.message));
        engine_write w = {.key = op->key.data,
                          .klen = op->key.len,
                          .val = op->value.data,
                          .vlen = op->value.len,
                          /* each write its own version: a put then a delete of one
                           * key in one batch must be ordered */
                          .version = op->version ? op->version : kv_hlc_now(engine_hlc(n->eng)),
                          .ttl_ms = op->ttl_ms,
                          .is_delete = del};
        if (rv == KV_OK)
            rv = engine_write_one(n->eng, &w, &r, tmp.message, sizeof(tmp.message));
    }
    st->code = (int32_t)rv;
    if (rv != KV_OK && !tmp.message[0]) /* a failed read says nothing more */
        snprintf(tmp.message, sizeof(tmp.message), "%s", kv_strerror(rv));
    st->message = rv == KV_OK ? op_ok : rpc_utf8_dup(tmp.message);
    if (!st->message)
        st->message = op_ok;
    res->status = st;
    res->found = r.found;
    res->value.data = r.val;
    res->value.len = r.vlen;
    res->version = r.version;
}

/* Reads the run of consecutive GETs starting at ops[i] with one
 * engine_get_many (writes stay ordered around runs); returns the run end. */
static size_t read_run(node *n, const Kv__BatchRequest *req, size_t i, engine_result *pre,
                       kv_err *errs)
{
    size_t end = i;
    while (end < req->n_ops && req->ops[end]->type == KV__OP_TYPE__GET)
        end++;
    const void **keys = calloc(end - i + 1, sizeof(*keys));
    size_t *lens = calloc(end - i + 1, sizeof(*lens));
    for (size_t k = i; keys && lens && k < end; k++) {
        /* empty or oversize keys are rejected per op by check_key; give the
         * engine a harmless key for their slot */
        bool ok = req->ops[k]->key.len && req->ops[k]->key.len <= n->cfg.limits.max_key;
        keys[k - i] = ok ? req->ops[k]->key.data : (const uint8_t *)"?";
        lens[k - i] = ok ? req->ops[k]->key.len : 1;
    }
    kv_err rv = keys && lens ? engine_get_many(n->eng, end - i, keys, lens, pre + i, errs + i)
                             : KV_RESOURCE_EXHAUSTED;
    for (size_t k = i; rv != KV_OK && k < end; k++)
        errs[k] = rv;
    free(keys);
    free(lens);
    return end;
}

static kv_err batch_reply(rpc_ctx *c, node *n, cmap *m, const Kv__BatchRequest *req)
{
    size_t k = req->n_ops;
    Kv__OpResult *res = calloc(k, sizeof(*res));
    Kv__OpResult **ptrs = calloc(k, sizeof(*ptrs));
    Kv__Status *sts = calloc(k, sizeof(*sts));
    kv_err rv = KV_OK;
    if (!res || !ptrs || !sts)
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory for %zu batch results", k);
    engine_result *pre = calloc(k, sizeof(*pre));
    kv_err *pre_err = calloc(k, sizeof(*pre_err));
    if (rv == KV_OK && (!pre || !pre_err))
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory for %zu batch results", k);
    for (size_t i = 0, run_end = 0; rv == KV_OK && i < k; i++) {
        kv__op_result__init(&res[i]);
        kv__status__init(&sts[i]);
        ptrs[i] = &res[i];
        if (i >= run_end && req->ops[i]->type == KV__OP_TYPE__GET)
            run_end = read_run(n, req, i, pre, pre_err);
        batch_op(n, c, m, req->ops[i], &res[i], &sts[i], &pre[i], pre_err[i]);
        if (res[i].value.data != pre[i].val) /* the op did not take the pre-read value */
            free(pre[i].val);
    }
    free(pre);
    free(pre_err);
    if (rv == KV_OK) {
        Kv__BatchReply rep = KV__BATCH_REPLY__INIT;
        rep.n_results = k;
        rep.results = ptrs;
        rv = rpc_reply_msg(c, &rep.base);
    }
    for (size_t i = 0; res && sts && i < k; i++) {
        free(res[i].value.data);
        if (sts[i].message != op_ok) /* malloc'ed, an empty one included */
            free(sts[i].message);
    }
    free(res);
    free(ptrs);
    free(sts);
    return rv;
}

static kv_err h_batch(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    if (c->coordinate && cmap_slot_epoch(n->maps)) /* without a map: see node_plain_call */
        return node_coord_batch(c, body, len);
    kv_err rv = repl_check_batch_wire(&n->cfg.limits, c, body, len); /* before unpacking */
    if (rv != KV_OK)
        return rv;
    UNPACK_OR_FAIL(req, Kv__BatchRequest, kv__batch_request__unpack, c, body, len);
    rv = kv_check_batch(&n->cfg.limits, req->n_ops, len, c->message, sizeof(c->message));
    if (rv == KV_OK)
        rv = repl_check_op_types(c, req);
    cmap *m = NULL;
    if (rv == KV_OK)
        rv = call_map(n, c, &m);
    if (rv == KV_OK)
        rv = batch_reply(c, n, m, req);
    cmap_unref(m);
    kv__batch_request__free_unpacked(req, NULL);
    return rv;
}

/* ---- admin.* ----------------------------------------------------------- */

static kv_err h_ping(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__PingReply rep = KV__PING_REPLY__INIT;
    rep.id = n->cfg.id;
    rep.role = "node";
    rep.map_epoch = cmap_slot_epoch(n->maps);
    rep.uptime_ms = (kv_now_ns() - n->started_ns) / 1000000ull;
    char detail[200];
    rep.serving = (Kv__Serving)node_serving(n, detail, sizeof(detail));
    rep.detail = detail;
    c->reply_epoch = rep.map_epoch;
    return rpc_reply_msg(c, &rep.base);
}

static kv_err h_stats(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    UNPACK_OR_FAIL(req, Kv__StatsRequest, kv__stats_request__unpack, c, body, len);
    if (req->node_id && *req->node_id && strcmp(req->node_id, n->cfg.id) != 0) {
        kv__stats_request__free_unpacked(req, NULL);
        return rpc_fail(c, KV_FAILED_PRECONDITION,
                        "this is node %s; ask a router for another node's stats", n->cfg.id);
    }
    kv_stats ks;
    kv_stats_init(&ks);
    node_collect_stats(n, c->server, &ks, req->verbose);
    uint64_t live = 0;
    if (req->count_keys && node_live_keys(n, &live) == KV_OK)
        kv_stat_gauge(&ks, "live_keys", NULL, NULL, NULL, live);
    rpc_statlist sl;
    rpc_stats_init(&sl);
    kv_stats_to_statlist(&ks, &sl);
    kv_stats_free(&ks);
    Kv__StatsReply rep = KV__STATS_REPLY__INIT;
    rep.id = n->cfg.id;
    rep.role = "node";
    rep.n_stats = sl.n;
    rep.stats = sl.ptrs;
    kv_err rv = sl.oom ? rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory for stats")
                       : rpc_reply_msg(c, &rep.base);
    rpc_stats_free(&sl);
    kv__stats_request__free_unpacked(req, NULL);
    return rv;
}

/* admin.HotKeys: a router's report (keys set) and/or a read of the view. */
static kv_err h_hot_keys(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    UNPACK_OR_FAIL(req, Kv__HotKeysRequest, kv__hot_keys_request__unpack, c, body, len);
    /* a report is refused whole when it breaks a bound (hot.h), so nothing
     * of it is kept; only admin credentials get here (a router) */
    kv_err rv = node_hot_check(req, n->cfg.limits.max_key, c->message, sizeof(c->message));
    if (rv != KV_OK) {
        kv__hot_keys_request__free_unpacked(req, NULL);
        return rv;
    }
    uint64_t now = kv_now_ns();
    if (req->n_keys || (req->router_id && req->router_id[0])) /* a router's report, maybe empty */
        node_hot_report(n->hot, req, now);
    node_hot_item *items = NULL;
    size_t total = node_hot_view(n->hot, now, &items);
    size_t top = req->top ? req->top : 20;
    size_t k = total < top ? total : top;
    Kv__HotKeyInfo *info = calloc(k ? k : 1, sizeof(*info));
    Kv__HotKeyInfo **ptrs = calloc(k ? k : 1, sizeof(*ptrs));
    char *self[1] = {n->cfg.id};
    rv = info && ptrs ? KV_OK : rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; rv == KV_OK && i < k; i++) {
        kv__hot_key_info__init(&info[i]);
        info[i].key = (ProtobufCBinaryData){items[i].klen, items[i].key};
        info[i].ops_per_s = items[i].ops_per_s;
        info[i].pinned = items[i].pinned;
        info[i].n_nodes = 1;
        info[i].nodes = self;
        ptrs[i] = &info[i];
    }
    if (rv == KV_OK) {
        Kv__HotKeysReply rep = KV__HOT_KEYS_REPLY__INIT;
        rep.n_keys = k;
        rep.keys = ptrs;
        rv = rpc_reply_msg(c, &rep.base);
    }
    free(info);
    free(ptrs);
    node_hot_view_free(items, total);
    kv__hot_keys_request__free_unpacked(req, NULL);
    return rv;
}

static const rpc_method node_methods[] = {
    /* coordinate calls (smart clients) take the two-phase form */
    {"kv.Get", h_get, node_coord_get_start, node_coord_finish, RPC_DATA, h_get_inline,
     node_coord_get_async, .inline_coordinate = true},
    {"kv.Put", h_put, node_coord_put_start, node_coord_finish, RPC_DATA, h_put_inline,
     node_coord_put_async},
    {"kv.Delete", h_delete, node_coord_delete_start, node_coord_finish, RPC_DATA, h_delete_inline,
     node_coord_delete_async},
    {"kv.Batch", h_batch, .access = RPC_DATA},
    {"kv.Scan", node_h_scan, .access = RPC_DATA},
    {"admin.Ping", h_ping, .access = RPC_DATA},
    {"admin.GetMap", node_h_get_map, .access = RPC_DATA},
    /* the rest need admin credentials (rpc.h): internal and operator calls */
    {"admin.Stats", h_stats},
    {"admin.HotKeys", h_hot_keys},
    {"admin.SetMap", node_h_set_map},
    {"admin.StreamRead", node_h_stream_read},
    {"admin.StreamStart", node_h_stream_start},
    {"admin.StreamStatus", node_h_stream_status},
    {"admin.Digest", node_h_digest},
    {"admin.Apply", node_h_apply},
    {"admin.Hint", node_h_hint},
    {"admin.HintStatus", node_h_hint_status},
    {"admin.Cleanup", node_h_cleanup},
    {"admin.Repaired", node_h_repaired},
};

static const rpc_method *local_method(const char *method)
{
    for (size_t i = 0; i < sizeof(node_methods) / sizeof(node_methods[0]); i++)
        if (strcmp(node_methods[i].name, method) == 0)
            return &node_methods[i];
    return NULL;
}

/* The context of a call the node makes to itself. */
static rpc_ctx local_ctx(void *user, const char *method, uint64_t epoch, uint32_t deadline_ms)
{
    return (rpc_ctx){.method = method,
                     .admin = true, /* the node calling itself */
                     .map_epoch = epoch,
                     .deadline_ns = kv_now_ns() + (uint64_t)deadline_ms * 1000000ull,
                     .worker = -1,
                     .user = user};
}

static void local_reply(rpc_ctx *c, kv_err st, rpc_reply *out)
{
    *out = (rpc_reply){.status = st, .map_epoch = c->reply_epoch};
    if (st != KV_OK && c->message[0])
        out->message = strdup(c->message);
    out->body = c->reply; /* moves to the reply (also for FAILED_PRECONDITION's map) */
    out->len = c->reply_len;
}

bool node_local_try(void *user, const char *method, uint64_t epoch, const uint8_t *body, size_t len,
                    uint32_t deadline_ms, rpc_reply *out)
{
    const rpc_method *m = local_method(method);
    rpc_ctx c = local_ctx(user, method, epoch, deadline_ms);
    kv_err st;
    if (!m || !m->try_inline || !m->try_inline(&c, body, len, &st))
        return false;
    local_reply(&c, st, out);
    return true;
}

kv_err node_plain_call(rpc_ctx *c, const uint8_t *body, size_t len)
{
    const rpc_method *m = local_method(c->method);
    return m && m->fn ? m->fn(c, body, len)
                      : rpc_fail(c, KV_UNIMPLEMENTED, "node has no plain %s", c->method);
}

void node_local_call(void *user, const char *method, uint64_t epoch, const uint8_t *body,
                     size_t len, uint32_t deadline_ms, rpc_reply *out)
{
    const rpc_method *m = local_method(method);
    rpc_ctx c = local_ctx(user, method, epoch, deadline_ms);
    kv_err st = m ? m->fn(&c, body, len) : rpc_fail(&c, KV_UNIMPLEMENTED, "no local %s", method);
    local_reply(&c, st, out);
}

/* ---- lifecycle --------------------------------------------------------- */

/* mkdir -p: creates path and its missing parents. */
static int mkdir_p(const char *path)
{
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static void worker_start(int worker, void *user)
{
    engine_thread_register();
}

static void worker_stop(int worker, void *user)
{
    engine_thread_unregister();
}

kv_err node_start(node *n, char *err, size_t errlen)
{
    kv_err rv;
    n->started_ns = kv_now_ns();
    if (mkdir_p(n->cfg.data_dir) != 0) {
        snprintf(err, errlen, "cannot create --data-dir %s: %s", n->cfg.data_dir, strerror(errno));
        return KV_INVALID_ARGUMENT;
    }
    pthread_mutex_init(&n->map_mu, NULL);
    rpc_chan_opts co = {.auth = rpc_sec_token(&n->cfg.sec),
                        .tls = rpc_sec_tls(&n->cfg.sec),
                        .recv_max = kv_limits_recv_max(&n->cfg.limits)};
    if ((rv = rpc_pool_create(&n->peers, &co)) != KV_OK ||
        (rv = cmap_slot_create(&n->maps)) != KV_OK ||
        (rv = node_map_load(n, err, errlen)) != KV_OK ||
        (rv = node_check_downtime(n, err, errlen)) != KV_OK)
        return rv;
    char fast[4200];
    if (!n->cfg.fast_dir) {
        snprintf(fast, sizeof(fast), "%s/fast", n->cfg.data_dir);
        n->cfg.fast_dir = fast; /* only used during open */
    }
    engine_opts eo = {.fast_dir = n->cfg.fast_dir,
                      .slow_dir = n->cfg.slow_dir,
                      .fast_mb = (uint64_t)n->cfg.fast_mb,
                      .fast_stop_pct = (unsigned)n->cfg.fast_stop_pct,
                      .mem_mb = (size_t)n->cfg.mem_mb,
                      .write_buffer_mb = (size_t)n->cfg.write_buffer_mb,
                      .write_buffer_kb = (size_t)n->cfg.write_buffer_kb,
                      .wal_max_mb = (uint64_t)n->cfg.wal_max_mb,
                      .sync = (engine_sync)n->cfg.sync,
                      .sync_ms = (unsigned)n->cfg.sync_ms,
                      .disable_io_uring = n->cfg.no_io_uring,
                      .no_hotrap = !n->cfg.hotrap,
                      .compression = n->cfg.compression,
                      .nhc = &n->cfg.nhc,
                      .twin_entries = (uint64_t)n->cfg.twin_entries,
                      .tombstone_grace_ms = (uint64_t)n->cfg.tombstone_grace_s * 1000u,
                      .wal_recovery = (engine_wal_recovery)n->cfg.wal_recovery,
                      .kind = (engine_kind)n->cfg.engine,
                      .kallax_blocks = (uint64_t)n->cfg.kallax_blocks};
    rv = engine_open(&n->eng, &eo, err, errlen);
    if (n->cfg.fast_dir == fast)
        n->cfg.fast_dir = NULL;
    if (rv == KV_OK)
        rv = node_hot_create(&n->hot, n->eng, n->cfg.hot_threshold);
    if (rv == KV_OK)
        rv = node_streams_open(n, &n->streams, err, errlen);
    if (rv == KV_OK)
        rv = node_handoff_open(n, &n->handoff, err, errlen);
    if (rv == KV_OK)
        node_coord_init(n);
    if (rv == KV_OK && (rv = node_map_start(n)) != KV_OK)
        snprintf(err, errlen, "cannot start the map refresher thread");
    if (rv != KV_OK)
        return rv;
    rpc_server_opts ro = {.url = n->cfg.listen,
                          .methods = node_methods,
                          .nmethods = sizeof(node_methods) / sizeof(node_methods[0]),
                          .workers = (unsigned)n->cfg.workers,
                          .coord_workers = (unsigned)n->cfg.coord_workers,
                          /* the calls of an rpc.Calls message that reach a worker are the
                           * ones the memory tier could not serve inline: reads of blocks
                           * (on a slow volume, a millisecond each), writes that wait for
                           * the group commit with --sync always. Run them in parallel, as
                           * if they had come in messages of their own, not one after
                           * another behind the slowest (channels keep one message in
                           * flight, so a message carries most of a client's calls) */
                          .handlers_wait = true,
                          .auth = n->cfg.sec.data_token,
                          .admin_auth = n->cfg.sec.admin_token,
                          .tls = rpc_sec_tls(&n->cfg.sec),
                          .max_inflight = (unsigned)n->cfg.max_inflight,
                          .recv_max = kv_limits_recv_max(&n->cfg.limits),
                          .user = n,
                          .thread_start = worker_start,
                          .thread_stop = worker_stop};
    if ((rv = rpc_metrics_create(&n->metrics, ro.methods, ro.nmethods)) != KV_OK)
        return rv;
    ro.observe = rpc_metrics_observe;
    ro.observe_arg = n->metrics;
    if ((rv = rpc_server_open(&n->rpc, &ro, err, errlen)) != KV_OK)
        return rv;
    return node_http_start(n, err, errlen);
}

void node_stop(node *n)
{
    atomic_store(&n->stopping, true);
    node_http_stop(n);
    if (!rpc_server_close(n->rpc)) {
        /* a handler still runs and uses all of it: leave it to the exit
         * (what was acknowledged is in the WAL, as after a crash) */
        KV_ERROR("node", "a request handler did not finish; exiting without closing the engine");
        n->rpc = NULL;
        return;
    }
    n->rpc = NULL;
    rpc_metrics_destroy(n->metrics);
    n->metrics = NULL;
    node_map_stop(n);
    node_handoff_close(n->handoff);
    n->handoff = NULL;
    node_streams_close(n->streams);
    n->streams = NULL;
    node_stream_src_close(n);
    rpc_pool_destroy(n->peers);
    n->peers = NULL;
    node_hot_destroy(n->hot);
    n->hot = NULL;
    engine_close(n->eng);
    n->eng = NULL;
    cmap_slot_destroy(n->maps);
    n->maps = NULL;
}
