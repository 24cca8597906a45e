/* SPDX-License-Identifier: MIT */
/*
 * kvctl node add | remove | replace | weight | abort | cleanup: membership
 * changes (DESIGN.md §4). A change is two map epochs: e+1 opens a transition
 * (a JOINING or LEAVING node, or a new weight, and the streams that move the
 * data: shard/cmap_plan.c), e+2 completes it once every stream is done. Each
 * map is installed node by node, in id order, with a compare-and-set on the
 * epoch (admin.SetMap expected_epoch), so of two admins racing, the one that
 * loses at the first node stops before it wrote anything. The transition
 * lives in the map and the streams run on the nodes, persisted: a kvctl that
 * died (or was interrupted) is rerun with the same command and continues.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvctl_stream.h"
#include "common/clock.h"
#include "shard/cmap_plan.h"

#define LONG_CALL_MS 600000u

/* ---- installing a map everywhere --------------------------------------- */

/* The order a map is installed in: the first member of from by id (the
 * node where racing admins meet: whoever loses there has written nothing),
 * then the nodes new in m (a joining node must hold the map before routers
 * send it writes), then the other members by id. */
static size_t *install_order(const cmap *from, const cmap *m)
{
    size_t n = cmap_node_count(m), k = 0;
    size_t *ix = malloc((n ? n : 1) * sizeof(*ix));
    for (size_t i = 0; ix && i < n; i++) { /* by id */
        size_t j = i;
        for (; j > 0 && strcmp(cmap_node_at(m, ix[j - 1])->id, cmap_node_at(m, i)->id) > 0; j--)
            ix[j] = ix[j - 1];
        ix[j] = i;
    }
    size_t *out = ix ? malloc((n ? n : 1) * sizeof(*out)) : NULL;
    for (int pass = 0; out && pass < 3; pass++)
        for (size_t i = 0, members = 0; i < n; i++) {
            bool member = cmap_find(from, cmap_node_at(m, ix[i])->id) >= 0;
            bool lock = member && members++ == 0;
            if ((pass == 0 && lock) || (pass == 1 && !member) || (pass == 2 && member && !lock))
                out[k++] = ix[i];
        }
    free(ix);
    return out;
}

/* One admin.SetMap; *body_map gets the node's map from a refusal. */
static kv_err set_map(kvctl_env *env, const char *addr, const cmap *m, uint64_t expected,
                      cmap **body_map, char *msg, size_t len)
{
    Kv__ClusterMap *pb = NULL;
    if (kvctl_map_pb(env, m, &pb) != KV_OK)
        return KV_RESOURCE_EXHAUSTED;
    Kv__SetMapRequest req = KV__SET_MAP_REQUEST__INIT;
    req.map = pb;
    req.expected_epoch = expected;
    rpc_chan *ch = kvctl_open_chan(env, addr);
    rpc_reply rep = {0};
    kv_err rv = ch ? rpc_call(ch, "admin.SetMap", 0, &req.base, (uint32_t)env->timeout_ms, &rep)
                   : KV_INVALID_ARGUMENT;
    snprintf(msg, len, "%s", rep.message ? rep.message : kv_strerror(rv));
    if (body_map && rv == KV_FAILED_PRECONDITION && rep.len)
        cmap_decode(rep.body, rep.len, body_map, NULL, 0);
    rpc_reply_free(&rep);
    rpc_chan_close(ch);
    kv__cluster_map__free_unpacked(pb, NULL);
    return rv;
}

/* Installs next on node i of next: compare-and-set from `from` (a node that
 * is behind is brought to `from` first), or install-if-newer for a node not
 * in `from`. Returns KV_OK, UNAVAILABLE (unreachable) or the refusal. */
static kv_err install_one(kvctl_env *env, const cmap *from, const cmap *next, size_t i, char *msg,
                          size_t len)
{
    const cmap_node *nd = cmap_node_at(next, i);
    bool member = cmap_find(from, nd->id) >= 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        cmap *theirs = NULL;
        kv_err rv = set_map(env, nd->addr, next, member ? cmap_epoch(from) : 0, &theirs, msg, len);
        if (rv == KV_FAILED_PRECONDITION && theirs && cmap_same(theirs, next))
            rv = KV_OK; /* installed by an earlier run */
        bool behind =
            rv == KV_FAILED_PRECONDITION && theirs && cmap_epoch(theirs) < cmap_epoch(from);
        cmap_unref(theirs);
        if (!behind || attempt)
            return rv == KV_DEADLINE_EXCEEDED ? KV_UNAVAILABLE : rv;
        char m2[300];
        set_map(env, nd->addr, from, 0, NULL, m2, sizeof(m2)); /* catch it up, then retry */
    }
    return KV_INTERNAL;
}

/* Installs next (epoch e+1) over from (epoch e) on every node of next but
 * skip (a dead node), in id order. A refusal at the first node means
 * another change won: nothing was written. must[] (NULL-terminated) are
 * nodes that have to take it (sources and targets of streams). */
static int install_all(kvctl_env *env, const cmap *from, const cmap *next, const char *skip,
                       const char *const *must)
{
    size_t *ix = install_order(from, next);
    if (!ix)
        return kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    int code = KVCTL_OK;
    bool wrote = false;
    for (size_t k = 0; code == KVCTL_OK && k < cmap_node_count(next); k++) {
        const cmap_node *nd = cmap_node_at(next, ix[k]);
        if (skip && strcmp(nd->id, skip) == 0)
            continue;
        char msg[300];
        kv_err rv = install_one(env, from, next, ix[k], msg, sizeof(msg));
        bool needed = false;
        for (size_t q = 0; must && must[q]; q++)
            needed |= strcmp(must[q], nd->id) == 0;
        char line[512];
        if (rv == KV_UNAVAILABLE && !needed) {
            fprintf(stderr,
                    "kvctl: warning: node %s (%s) is unreachable; it will fetch map "
                    "epoch %llu from its peers when it is back\n",
                    nd->id, nd->addr, (unsigned long long)cmap_epoch(next));
        } else if (rv != KV_OK) {
            snprintf(line, sizeof(line), "node %s (%s): %s%s", nd->id, nd->addr, msg,
                     wrote ? " -- the new map is on some nodes only: run kvctl status, then rerun "
                             "the command or kvctl node abort"
                           : "");
            code = kvctl_fail(rv, line);
        } else {
            wrote = true;
        }
    }
    free(ix);
    return code;
}

/* ---- building a transition --------------------------------------------- */

typedef struct change {
    const char *kind;
    const char *node; /* the node added, removed, reweighted, or the new one */
    const char *old;  /* replace: the dead node */
    const char *addr; /* add, replace: the new node's address */
    uint32_t weight;  /* add: weight; weight: the new weight */
} change;

static Kv__NodeInfo *pb_node(Kv__ClusterMap *pb, const char *id)
{
    for (size_t i = 0; i < pb->n_nodes; i++)
        if (strcmp(pb->nodes[i]->id, id) == 0)
            return pb->nodes[i];
    return NULL;
}

static kv_err pb_append(Kv__ClusterMap *pb, const change *c, const Kv__NodeInfo *old)
{
    Kv__NodeInfo **nn = realloc(pb->nodes, (pb->n_nodes + 1) * sizeof(*nn));
    Kv__NodeInfo *ni = malloc(sizeof(*ni));
    if (nn)
        pb->nodes = nn;
    if (!nn || !ni) {
        free(ni);
        return KV_RESOURCE_EXHAUSTED;
    }
    kv__node_info__init(ni);
    pb->nodes[pb->n_nodes++] = ni;
    ni->id = strdup(c->node);
    ni->addr = strdup(c->addr);
    ni->state = KV__NODE_STATE__JOINING;
    ni->weight = old ? old->weight : c->weight;
    if (old)
        ni->ring_name = strdup(old->ring_name && *old->ring_name ? old->ring_name : old->id);
    return ni->id && ni->addr ? KV_OK : KV_RESOURCE_EXHAUSTED;
}

/* Applies the change to a copy of m's nodes and opens the transition. */
static kv_err edit_pb(const cmap *m, const change *c, uint32_t mbps, Kv__ClusterMap **out)
{
    Kv__ClusterMap *pb;
    kv_err rv = cmap_to_pb(m, &pb);
    if (rv != KV_OK)
        return rv;
    Kv__Transition *t = malloc(sizeof(*t));
    char **nodes = calloc(2, sizeof(*nodes));
    if (!t || !nodes) {
        free(t);
        free(nodes);
        kv__cluster_map__free_unpacked(pb, NULL);
        return KV_RESOURCE_EXHAUSTED;
    }
    kv__transition__init(t);
    t->kind = strdup(c->kind);
    t->nodes = nodes;
    t->nodes[t->n_nodes++] = strdup(c->node);
    if (c->old)
        t->nodes[t->n_nodes++] = strdup(c->old);
    t->started_ms = kv_wall_ms();
    t->stream_mbps = mbps;
    t->from_epoch = cmap_epoch(m);
    pb->transition = t;
    pb->epoch = cmap_epoch(m) + 1;
    if (strcmp(c->kind, "add") == 0)
        rv = pb_append(pb, c, NULL);
    else if (strcmp(c->kind, "remove") == 0)
        pb_node(pb, c->node)->state = KV__NODE_STATE__LEAVING;
    else if (strcmp(c->kind, "weight") == 0)
        pb_node(pb, c->node)->next_weight = c->weight;
    else { /* replace */
        Kv__NodeInfo *old = pb_node(pb, c->old);
        old->state = KV__NODE_STATE__LEAVING;
        rv = pb_append(pb, c, old);
    }
    if (rv != KV_OK) {
        kv__cluster_map__free_unpacked(pb, NULL);
        return rv;
    }
    *out = pb;
    return KV_OK;
}

/* Builds map e+1 of the change with its stream plan; errors printed. */
static int build_next(kvctl_env *env, const cmap *m, const change *c, cmap **out)
{
    Kv__ClusterMap *pb = NULL;
    char err[400] = "";
    kv_err rv = edit_pb(m, c, (uint32_t)env->stream_mbps, &pb);
    cmap *draft = NULL;
    if (rv == KV_OK)
        rv = cmap_from_pb(pb, &draft, err, sizeof(err));
    Kv__StreamPlan **plans = NULL;
    size_t np = 0;
    const char *dead[1] = {c->old};
    if (rv == KV_OK)
        rv = cmap_plan_streams(draft, dead, c->old ? 1 : 0, &plans, &np, err, sizeof(err));
    if (rv == KV_OK) {
        pb->transition->streams = plans;
        pb->transition->n_streams = np;
        plans = NULL;
        rv = cmap_from_pb(pb, out, err, sizeof(err));
    }
    cmap_plan_free(plans, np);
    cmap_unref(draft);
    if (pb)
        kv__cluster_map__free_unpacked(pb, NULL);
    if (rv != KV_OK)
        return kvctl_fail(rv, err[0] ? err : kv_strerror(rv));
    return KVCTL_OK;
}

/* ---- running a transition ---------------------------------------------- */

/* The nodes a transition cannot do without: stream sources and targets. */
static const char **needed_nodes(const cmap *m)
{
    const Kv__Transition *t = cmap_transition(m);
    const char **v = calloc(2 * t->n_streams + 2, sizeof(*v));
    size_t k = 0;
    for (size_t i = 0; v && i < t->n_streams; i++) {
        v[k++] = t->streams[i]->source;
        v[k++] = t->streams[i]->target;
    }
    return v;
}

static const char *dead_of(const cmap *m)
{
    const Kv__Transition *t = cmap_transition(m);
    return strcmp(t->kind, "replace") == 0 && t->n_nodes > 1 ? t->nodes[1] : NULL;
}

static void print_done(kvctl_env *env, const cmap *m, const kvctl_stream *s, size_t n,
                       uint64_t epoch, double secs)
{
    const Kv__Transition *t = cmap_transition(m);
    kvctl_totals tt;
    kvctl_streams_total(s, n, &tt);
    if (env->json) {
        printf("{\"event\":\"done\",\"kind\":\"%s\",\"node\":\"%s\",\"epoch\":%llu,"
               "\"streams\":%zu,\"keys\":%llu,\"bytes\":%llu,\"seconds\":%.1f,\"detail\":",
               t->kind, t->nodes[0], (unsigned long long)epoch, n, (unsigned long long)tt.keys,
               (unsigned long long)tt.bytes, secs);
        kvctl_streams_print_json(s, n);
        printf("}\n");
        return;
    }
    char b[32];
    kvctl_human((double)tt.bytes, b, sizeof(b));
    printf("%s %s done: map epoch %llu, %zu streams moved %llu records (%s) in %.1f s\n", t->kind,
           t->nodes[0], (unsigned long long)epoch, n, (unsigned long long)tt.keys, b, secs);
}

/* Hints held anywhere for the nodes that gain ranges: writes they missed
 * while the change ran (they count as acknowledged once hinted). */
static uint64_t hints_for_targets(kvctl_env *env, const cmap *m, const kvctl_stream *s, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < cmap_node_count(m); i++) {
        Kv__HintStatusRequest req = KV__HINT_STATUS_REQUEST__INIT;
        rpc_chan *ch = kvctl_open_chan(env, cmap_node_at(m, i)->addr);
        rpc_reply rep;
        if (!ch || kvctl_call(env, ch, "admin.HintStatus", &req.base, 0, &rep, true) != KVCTL_OK) {
            rpc_chan_close(ch);
            continue;
        }
        Kv__HintStatusReply *h = kv__hint_status_reply__unpack(NULL, rep.len, rep.body);
        for (size_t t = 0; h && t < h->n_targets; t++)
            for (size_t k = 0; k < n; k++)
                if (strcmp(h->targets[t]->target, s[k].target) == 0) {
                    total += h->targets[t]->records;
                    break;
                }
        if (h)
            kv__hint_status_reply__free_unpacked(h, NULL);
        rpc_reply_free(&rep);
        rpc_chan_close(ch);
    }
    return total;
}

/* Waits until no hint for the gaining nodes is left (Ctrl-C stops). */
static int drain_hints(kvctl_env *env, const cmap *m, const kvctl_stream *s, size_t n)
{
    uint64_t left, last = 0;
    while ((left = hints_for_targets(env, m, s, n)) > 0 && !kvctl_interrupted()) {
        if (left != last && !env->json)
            printf("waiting for %llu hints to reach the new replicas\n", (unsigned long long)left);
        last = left;
        kv_sleep_ns(200000000ull);
    }
    return kvctl_interrupted() ? KVCTL_INTERRUPTED : KVCTL_OK;
}

/* Streams m's transition (epoch e+1) to the end and installs e+2. */
static int run_transition(kvctl_env *env, cmap *m)
{
    size_t n = 0;
    kvctl_stream *s = kvctl_transition_streams(m, &n);
    if (!s)
        return kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    uint64_t t0 = kv_now_ns();
    kvctl_catch_sigint();
    int code = kvctl_streams_start(env, s, n);
    if (code == KVCTL_OK && env->no_wait) {
        printf("transition at map epoch %llu: %zu streams started; rerun the command to "
               "complete it\n",
               (unsigned long long)cmap_epoch(m), n);
        free(s);
        return KVCTL_OK;
    }
    if (code == KVCTL_OK)
        code = kvctl_streams_wait(env, s, n, cmap_transition(m)->kind);
    if (code == KVCTL_OK)
        code = drain_hints(env, m, s, n);
    if (code == KVCTL_INTERRUPTED)
        fprintf(stderr, "kvctl: interrupted; the streams go on on the nodes: rerun the same "
                        "command to finish the change, or run kvctl node abort\n");
    Kv__ClusterMap *done_pb = NULL;
    cmap *done = NULL;
    char err[300];
    if (code == KVCTL_OK && (cmap_completed_pb(m, &done_pb) != KV_OK ||
                             cmap_from_pb(done_pb, &done, err, sizeof(err)) != KV_OK))
        code = kvctl_fail(KV_INTERNAL, "cannot build the completed map");
    if (code == KVCTL_OK)
        code = install_all(env, m, done, dead_of(m), NULL);
    if (code == KVCTL_OK)
        print_done(env, m, s, n, cmap_epoch(done), (double)(kv_now_ns() - t0) / 1e9);
    if (done_pb)
        kv__cluster_map__free_unpacked(done_pb, NULL);
    cmap_unref(done);
    free(s);
    return code;
}

/* Opens a new transition over m (no transition open) and runs it. */
static int start_change(kvctl_env *env, cmap *m, const change *c)
{
    cmap *next = NULL;
    int code = build_next(env, m, c, &next);
    const char **must = code == KVCTL_OK ? needed_nodes(next) : NULL;
    if (code == KVCTL_OK && !must)
        code = kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    if (code == KVCTL_OK)
        code = install_all(env, m, next, c->old, must);
    if (code == KVCTL_OK && !env->json)
        printf("map epoch %llu: %s %s, %zu streams\n", (unsigned long long)cmap_epoch(next),
               c->kind, c->node, cmap_transition(next)->n_streams);
    if (code == KVCTL_OK)
        code = run_transition(env, next);
    free(must);
    cmap_unref(next);
    return code;
}

/* Whether m's open transition is the one this command asks for. */
static bool same_change(const cmap *m, const change *c)
{
    const Kv__Transition *t = cmap_transition(m);
    if (strcmp(t->kind, c->kind) != 0 || t->n_nodes < 1 || strcmp(t->nodes[0], c->node) != 0)
        return false;
    if (c->old && (t->n_nodes < 2 || strcmp(t->nodes[1], c->old) != 0))
        return false;
    int i = cmap_find(m, c->node);
    return !c->addr || (i >= 0 && strcmp(cmap_node_at(m, (size_t)i)->addr, c->addr) == 0);
}

/* Resumes m's transition: makes sure every node has the map, then runs it. */
static int resume_change(kvctl_env *env, cmap *m)
{
    if (!env->json)
        printf("resuming the transition at map epoch %llu (%s %s)\n",
               (unsigned long long)cmap_epoch(m), cmap_transition(m)->kind,
               cmap_transition(m)->nodes[0]);
    const char *dead = dead_of(m);
    for (size_t i = 0; i < cmap_node_count(m); i++) {
        char msg[300];
        if (!dead || strcmp(cmap_node_at(m, i)->id, dead) != 0)
            set_map(env, cmap_node_at(m, i)->addr, m, 0, NULL, msg, sizeof(msg));
    }
    return run_transition(env, m);
}

static int in_progress(const cmap *m)
{
    const Kv__Transition *t = cmap_transition(m);
    char msg[400];
    snprintf(msg, sizeof(msg),
             "a membership change is in progress at map epoch %llu: %s %s%s%s; rerun that "
             "command to finish it, or run kvctl node abort",
             (unsigned long long)cmap_epoch(m), t->kind, t->nodes[0], t->n_nodes > 1 ? " for " : "",
             t->n_nodes > 1 ? t->nodes[1] : "");
    return kvctl_fail(KV_FAILED_PRECONDITION, msg);
}

/* Runs a change: resumes it when it is the open transition, refuses when
 * another one is open, else checks it with check() and starts it. */
static int do_change(kvctl_env *env, const change *c,
                     int (*check)(kvctl_env *env, const cmap *m, const change *c))
{
    cmap *m = NULL;
    int code = kvctl_fetch_latest_map(env, &m);
    if (code == KVCTL_OK && cmap_transition(m))
        code = same_change(m, c) ? resume_change(env, m) : in_progress(m);
    else if (code == KVCTL_OK && (code = check(env, m, c)) == KVCTL_OK)
        code = start_change(env, m, c);
    cmap_unref(m);
    return code;
}

/* ---- checks ------------------------------------------------------------ */

static int refuse(const char *fmt, const char *a, const char *b)
{
    char msg[400];
    snprintf(msg, sizeof(msg), fmt, a, b ? b : "");
    return kvctl_fail(KV_FAILED_PRECONDITION, msg);
}

/* A node that is to join: reachable, and not a member of a cluster. */
static int check_newcomer(kvctl_env *env, const change *c)
{
    rpc_chan *ch = kvctl_open_named(env, c->addr); /* the new node, named by the user */
    if (!ch)
        return KVCTL_USAGE;
    cmap *theirs = NULL;
    Kv__PingReply *p = kvctl_ping_rpc(env, ch, NULL, true);
    int code = p ? kvctl_fetch_map(env, ch, &theirs, true) : KVCTL_SERVER;
    rpc_chan_close(ch);
    if (!p)
        code = refuse("new node %s at %s does not answer: start it first", c->node, c->addr);
    else if (strcmp(p->id, c->node) != 0)
        code = refuse("the node at that address calls itself %s, not %s", p->id, c->node);
    else if (code == KVCTL_OK && theirs && cmap_find(theirs, c->node) >= 0)
        code = refuse("node %s already belongs to a cluster map (it must be new or wiped)", c->node,
                      NULL);
    if (p)
        kv__ping_reply__free_unpacked(p, NULL);
    cmap_unref(theirs);
    return code;
}

static int check_add(kvctl_env *env, const cmap *m, const change *c)
{
    if (cmap_find(m, c->node) >= 0)
        return refuse("node id %s is already in the cluster map", c->node, NULL);
    if (cmap_find_addr(m, c->addr) >= 0)
        return refuse("address %s already belongs to a node of the cluster map", c->addr, NULL);
    return check_newcomer(env, c);
}

static int check_remove(kvctl_env *env, const cmap *m, const change *c)
{
    int i = cmap_find(m, c->node);
    if (i < 0)
        return refuse("no node %s in the cluster map", c->node, NULL);
    if (cmap_node_count(m) == 1)
        return refuse("node %s is the last node of the cluster", c->node, NULL);
    if (cmap_node_count(m) - 1 < cmap_rf(m)) {
        char rf[16];
        snprintf(rf, sizeof(rf), "%u", cmap_rf(m));
        return refuse("removing %s would leave fewer nodes than rf %s", c->node, rf);
    }
    rpc_chan *ch = kvctl_open_chan(env, cmap_node_at(m, (size_t)i)->addr);
    Kv__PingReply *p = ch ? kvctl_ping_rpc(env, ch, NULL, true) : NULL;
    rpc_chan_close(ch);
    if (!p)
        return refuse("node %s does not answer: a dead node is replaced (kvctl node replace), "
                      "not removed",
                      c->node, NULL);
    kv__ping_reply__free_unpacked(p, NULL);
    return KVCTL_OK;
}

static int check_replace(kvctl_env *env, const cmap *m, const change *c)
{
    if (cmap_find(m, c->old) < 0)
        return refuse("no node %s in the cluster map", c->old, NULL);
    return check_add(env, m, c);
}

static int check_weight(kvctl_env *env, const cmap *m, const change *c)
{
    int i = cmap_find(m, c->node);
    if (i < 0)
        return refuse("no node %s in the cluster map", c->node, NULL);
    if (cmap_node_at(m, (size_t)i)->weight == c->weight)
        return refuse("node %s already has that weight", c->node, NULL);
    return KVCTL_OK;
}

/* ---- abort and cleanup ------------------------------------------------- */

static int node_abort(kvctl_env *env)
{
    cmap *m = NULL;
    int code = kvctl_fetch_latest_map(env, &m);
    if (code == KVCTL_OK && (!m || !cmap_transition(m)))
        code = kvctl_fail(KV_FAILED_PRECONDITION, "no membership change is in progress");
    size_t n = 0;
    kvctl_stream *s = code == KVCTL_OK ? kvctl_transition_streams(m, &n) : NULL;
    for (size_t i = 0; s && i < n; i++) { /* stop the streams (best effort) */
        Kv__StreamStatusRequest req = KV__STREAM_STATUS_REQUEST__INIT;
        char *id = s[i].job.id;
        req.n_ids = 1;
        req.ids = &id;
        req.cancel = true;
        rpc_chan *t = kvctl_open_chan(env, s[i].target_addr);
        rpc_reply rep;
        if (t && kvctl_call(env, t, "admin.StreamStatus", &req.base, 0, &rep, true) == KVCTL_OK)
            rpc_reply_free(&rep);
        rpc_chan_close(t);
    }
    Kv__ClusterMap *pb = NULL;
    cmap *back = NULL;
    char err[300];
    if (code == KVCTL_OK &&
        (cmap_aborted_pb(m, &pb) != KV_OK || cmap_from_pb(pb, &back, err, sizeof(err)) != KV_OK))
        code = kvctl_fail(KV_INTERNAL, "cannot build the rolled-back map");
    if (code == KVCTL_OK)
        code = install_all(env, m, back, dead_of(m), NULL);
    if (code == KVCTL_OK && env->json)
        printf("{\"event\":\"aborted\",\"kind\":\"%s\",\"node\":\"%s\",\"epoch\":%llu}\n",
               cmap_transition(m)->kind, cmap_transition(m)->nodes[0],
               (unsigned long long)cmap_epoch(back));
    else if (code == KVCTL_OK)
        printf("%s %s aborted: map epoch %llu\n", cmap_transition(m)->kind,
               cmap_transition(m)->nodes[0], (unsigned long long)cmap_epoch(back));
    if (pb)
        kv__cluster_map__free_unpacked(pb, NULL);
    cmap_unref(back);
    cmap_unref(m);
    free(s);
    return code;
}

static int node_cleanup(kvctl_env *env, const char *id)
{
    cmap *m = NULL;
    int code = kvctl_fetch_latest_map(env, &m);
    int i = code == KVCTL_OK && m ? cmap_find(m, id) : -1;
    if (code == KVCTL_OK && i < 0)
        code = refuse("no node %s in the cluster map", id, NULL);
    rpc_chan *t = code == KVCTL_OK ? kvctl_open_chan(env, cmap_node_at(m, (size_t)i)->addr) : NULL;
    Kv__CleanupRequest req = KV__CLEANUP_REQUEST__INIT;
    rpc_reply rep;
    if (code == KVCTL_OK && t)
        code = kvctl_call(env, t, "admin.Cleanup", &req.base, LONG_CALL_MS, &rep, false);
    Kv__CleanupReply *r =
        code == KVCTL_OK ? kv__cleanup_reply__unpack(NULL, rep.len, rep.body) : NULL;
    if (code == KVCTL_OK && r && env->json)
        printf("{\"node\":\"%s\",\"dropped\":%llu,\"kept\":%llu}\n", id,
               (unsigned long long)r->dropped, (unsigned long long)r->kept);
    else if (code == KVCTL_OK && r)
        printf("node %s: %llu records of ranges it no longer replicates dropped, %llu kept\n", id,
               (unsigned long long)r->dropped, (unsigned long long)r->kept);
    if (r)
        kv__cleanup_reply__free_unpacked(r, NULL);
    if (code == KVCTL_OK)
        rpc_reply_free(&rep);
    rpc_chan_close(t);
    cmap_unref(m);
    return code;
}

/* ---- the command ------------------------------------------------------- */

/* Parses ID=ADDR[@WEIGHT] into c (validated like a map entry). */
static int parse_newcomer(kvctl_env *env, char *spec, change *c, cmap **tmp)
{
    char err[300];
    kv_err rv = cmap_parse_spec(1, 1, &spec, 1, tmp, err, sizeof(err));
    if (rv != KV_OK) {
        fprintf(stderr, "kvctl: %s: %s\n", kv_err_name(rv), err);
        return KVCTL_USAGE;
    }
    const cmap_node *nd = cmap_node_at(*tmp, 0);
    c->node = nd->id;
    c->addr = nd->addr;
    c->weight = env->weight ? (uint32_t)env->weight : nd->weight;
    return KVCTL_OK;
}

static int usage(void)
{
    fprintf(stderr, "usage: kvctl node add ID=ADDR [--weight W] | remove ID | replace OLD_ID "
                    "NEW_ID=ADDR | weight ID W | abort | cleanup ID\n"
                    "       [--stream-mbps N] [--no-wait] [--json]\n");
    return KVCTL_USAGE;
}

int kvctl_node(kvctl_env *env, int argc, char **argv)
{
    const char *sub = argv[0];
    change c = {.kind = sub};
    cmap *tmp = NULL;
    int code;
    if (strcmp(sub, "add") == 0 && argc == 2) {
        code = parse_newcomer(env, argv[1], &c, &tmp);
        if (code == KVCTL_OK)
            code = do_change(env, &c, check_add);
    } else if (strcmp(sub, "remove") == 0 && argc == 2) {
        c.node = argv[1];
        code = do_change(env, &c, check_remove);
    } else if (strcmp(sub, "replace") == 0 && argc == 3) {
        c.old = argv[1];
        code = parse_newcomer(env, argv[2], &c, &tmp);
        if (code == KVCTL_OK)
            code = do_change(env, &c, check_replace);
    } else if (strcmp(sub, "weight") == 0 && argc == 3) {
        char *end;
        long w = strtol(argv[2], &end, 10);
        if (*end || w < 1 || w > RING_MAX_WEIGHT) {
            fprintf(stderr, "kvctl: INVALID_ARGUMENT: weight '%s' out of range 1..%u\n", argv[2],
                    RING_MAX_WEIGHT);
            return KVCTL_USAGE;
        }
        c.node = argv[1];
        c.weight = (uint32_t)w;
        code = do_change(env, &c, check_weight);
    } else if (strcmp(sub, "abort") == 0 && argc == 1) {
        code = node_abort(env);
    } else if (strcmp(sub, "cleanup") == 0 && argc == 2) {
        code = node_cleanup(env, argv[1]);
    } else {
        code = usage();
    }
    cmap_unref(tmp);
    return code;
}

int kvctl_cluster_sign(kvctl_env *env)
{
    if (!env->sec.map_key) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: cluster sign needs the map key "
                        "(--map-key-file FILE or $KV_MAP_KEY)\n");
        return KVCTL_USAGE;
    }
    env->sign_unsigned = true; /* the point: the current map may be unsigned */
    cmap *m = NULL, *next = NULL;
    int code = kvctl_fetch_latest_map(env, &m);
    char why[300];
    if (code == KVCTL_OK && cmap_check_sig(m, env->sec.map_key, why, sizeof(why)) == KV_OK) {
        printf("map epoch %llu is already signed with this key\n",
               (unsigned long long)cmap_epoch(m));
        cmap_unref(m);
        return KVCTL_OK;
    }
    Kv__ClusterMap *pb = NULL;
    if (code == KVCTL_OK && cmap_to_pb(m, &pb) != KV_OK)
        code = kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    if (code == KVCTL_OK) {
        pb->epoch++;
        free(pb->mac.data); /* a mac of another key, if any */
        pb->mac = (ProtobufCBinaryData){0, NULL};
        if (cmap_from_pb(pb, &next, why, sizeof(why)) != KV_OK)
            code = kvctl_fail(KV_INTERNAL, why);
    }
    if (code == KVCTL_OK)
        code = install_all(env, m, next, cmap_transition(m) ? dead_of(m) : NULL, NULL);
    if (code == KVCTL_OK && env->json)
        printf("{\"event\":\"signed\",\"epoch\":%llu}\n", (unsigned long long)cmap_epoch(next));
    else if (code == KVCTL_OK)
        printf("cluster map signed: epoch %llu\n", (unsigned long long)cmap_epoch(next));
    if (pb)
        kv__cluster_map__free_unpacked(pb, NULL);
    cmap_unref(next);
    cmap_unref(m);
    return code;
}
