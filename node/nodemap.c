/* SPDX-License-Identifier: MIT */
/*
 * The node's cluster map and serving state (DESIGN.md §4).
 *
 * Installing a map is one step under map_mu: check (admin.SetMap's
 * compare-and-set on the epoch, or "newer" for a node catching up), persist
 * (DATA_DIR/cluster.map: tmp + fsync + rename + fsync of the directory), then
 * swap the slot. So two admins racing for epoch e+1 on a node cannot both
 * win, and a node never answers with a map it would lose in a crash.
 *
 * A node learns maps it missed (it was down during a change) from its peers:
 * a refresher asks one peer per period, and every peer at once when a
 * request showed a newer epoch. It accepts only maps that list itself, or the
 * map that completes its own removal (it was LEAVING).
 *
 * Serving state: NO_MAP (no map; requests from a cluster, map_epoch > 0, are
 * refused), REMOVED, NEEDS_REPAIR (persisted mark: the node joined back with
 * no data, or peers dropped hints for it; cleared by kvctl repair),
 * CATCHING_UP (after a restart, until the peers' hints for it are replayed,
 * handoff.c), SERVING. A node that is not SERVING takes writes but refuses
 * reads from routers, which read other replicas.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/node.h"

#define MAP_FILE "cluster.map"
#define REPAIR_FILE "NEEDS_REPAIR"
#define ALIVE_FILE "ALIVE"
#define ALIVE_PERIOD_MS 60000u
#define MAP_TICK_NS (250ull * 1000000ull)

rpc_chan *node_chan(node *n, const char *addr)
{
    return rpc_pool_get(n->peers, addr);
}

/* ---- persistence ------------------------------------------------------- */

/* Writes buf to DATA_DIR/name atomically: tmp + fsync + rename + fsync of
 * the directory. */
static kv_err write_file(node *n, const char *name, const void *buf, size_t len, char *err,
                         size_t errlen)
{
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/%s", n->cfg.data_dir, name);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    bool ok = fd >= 0 && write(fd, buf, len) == (ssize_t)len && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    ok = ok && rename(tmp, path) == 0;
    int dfd = ok ? open(n->cfg.data_dir, O_RDONLY | O_DIRECTORY) : -1;
    ok = ok && dfd >= 0 && fsync(dfd) == 0;
    if (dfd >= 0)
        close(dfd);
    if (!ok) {
        snprintf(err, errlen, "cannot write %.200s: %s", path, strerror(errno));
        return KV_INTERNAL;
    }
    return KV_OK;
}

static kv_err persist_map(node *n, const cmap *m, char *err, size_t errlen)
{
    uint8_t *buf;
    size_t len;
    if (cmap_encode(m, &buf, &len) != KV_OK)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = write_file(n, MAP_FILE, buf, len, err, errlen);
    free(buf);
    return rv;
}

/* Reads a whole file into a malloc'ed buffer; NOT_FOUND when absent. */
static kv_err read_file(const char *path, uint8_t **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? KV_NOT_FOUND : KV_INTERNAL;
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap);
    size_t got;
    while (b && (got = fread(b + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *nb = cap < (64u << 20) ? realloc(b, cap * 2) : NULL;
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
    }
    bool bad = ferror(f);
    fclose(f);
    if (!b || bad) {
        free(b);
        return b ? KV_INTERNAL : KV_RESOURCE_EXHAUSTED;
    }
    *buf = b;
    *len = n;
    return KV_OK;
}

kv_err node_map_load(node *n, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", n->cfg.data_dir, REPAIR_FILE);
    atomic_store(&n->needs_repair, access(path, F_OK) == 0);
    snprintf(path, sizeof(path), "%s/%s", n->cfg.data_dir, MAP_FILE);
    uint8_t *buf;
    size_t len;
    kv_err rv = read_file(path, &buf, &len);
    if (rv == KV_NOT_FOUND)
        return KV_OK;
    if (rv != KV_OK) {
        snprintf(err, errlen, "cannot read %.200s: %s", path, kv_strerror(rv));
        return rv;
    }
    cmap *m = NULL;
    char why[256];
    rv = cmap_decode(buf, len, &m, why, sizeof(why));
    free(buf);
    if (rv != KV_OK) {
        snprintf(err, errlen, "%.200s is damaged: %s", path, why);
        return KV_DATA_LOSS;
    }
    rv = cmap_slot_install(n->maps, m);
    KV_INFO("node", "loaded cluster map epoch %llu from %s%s", (unsigned long long)cmap_epoch(m),
            path, atomic_load(&n->needs_repair) ? " (marked NEEDS_REPAIR)" : "");
    cmap_unref(m);
    return rv;
}

static kv_err write_alive(node *n)
{
    char buf[32], err[300];
    int len = snprintf(buf, sizeof(buf), "%llu\n", (unsigned long long)kv_wall_ms());
    kv_err rv = write_file(n, ALIVE_FILE, buf, (size_t)len, err, sizeof(err));
    if (rv != KV_OK)
        KV_WARN("node", "%s", err);
    n->alive_next_ms = kv_wall_ms() + ALIVE_PERIOD_MS;
    return rv;
}

kv_err node_check_downtime(node *n, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", n->cfg.data_dir, ALIVE_FILE);
    FILE *f = fopen(path, "r");
    unsigned long long last = 0;
    if (f) {
        if (fscanf(f, "%llu", &last) != 1)
            last = 0;
        fclose(f);
    }
    uint64_t grace = (uint64_t)n->cfg.tombstone_grace_s * 1000u, now = kv_wall_ms();
    bool member = cmap_slot_epoch(n->maps) != 0;
    if (member && grace && last && now > last + grace + ALIVE_PERIOD_MS) {
        if (!n->cfg.force_stale_start) {
            snprintf(err, errlen,
                     "this node was down for %.1f h, longer than --tombstone-grace (%.1f h): its "
                     "peers may have purged the tombstones of deletes it missed, so its data could "
                     "bring deleted keys back. Wipe %s and run kvctl node replace (or start it "
                     "with --force-stale-start, then kvctl repair, accepting that risk)",
                     (double)(now - last) / 3.6e6, (double)grace / 3.6e6, n->cfg.data_dir);
            return KV_FAILED_PRECONDITION;
        }
        KV_WARN("node",
                "down %.1f h, longer than --tombstone-grace: started anyway "
                "(--force-stale-start); marked NEEDS_REPAIR",
                (double)(now - last) / 3.6e6);
        node_set_needs_repair(n, true, "started after a downtime longer than the grace period");
    }
    return write_alive(n);
}

kv_err node_set_needs_repair(node *n, bool on, const char *why)
{
    char path[4200], err[300];
    snprintf(path, sizeof(path), "%s/%s", n->cfg.data_dir, REPAIR_FILE);
    kv_err rv = KV_OK;
    if (on && !atomic_load(&n->needs_repair))
        rv = write_file(n, REPAIR_FILE, why, strlen(why), err, sizeof(err));
    else if (!on && atomic_load(&n->needs_repair) && unlink(path) != 0 && errno != ENOENT)
        rv = KV_INTERNAL;
    if (rv != KV_OK) {
        KV_ERROR("node", "cannot %s the NEEDS_REPAIR mark: %s", on ? "set" : "clear", err);
        return rv;
    }
    if (atomic_exchange(&n->needs_repair, on) != on)
        KV_WARN("node", "%s: %s", on ? "needs repair" : "repaired", why);
    return KV_OK;
}

/* ---- serving state ----------------------------------------------------- */

bool node_holds(node *n, cmap *m, const void *key, size_t klen)
{
    if (!m)
        return true;
    int self = cmap_find(m, n->cfg.id);
    return self >= 0 && cmap_holds(m, (size_t)self, key, klen);
}

int node_serving_in(node *n, const cmap *m, const char **why)
{
    if (!m) {
        *why = "no cluster map: a new node (kvctl cluster init / node add) or a member that lost "
               "its data (kvctl node replace / kvctl repair)";
        return KV__SERVING__NO_MAP;
    }
    if (cmap_find(m, n->cfg.id) < 0) {
        *why = "removed from the cluster";
        return KV__SERVING__REMOVED;
    }
    if (atomic_load(&n->needs_repair)) {
        *why = "needs repair (kvctl repair): it may lack acknowledged writes";
        return KV__SERVING__NEEDS_REPAIR;
    }
    if (atomic_load(&n->catching_up)) {
        *why = "catching up: replaying the hints its peers hold for it";
        return KV__SERVING__CATCHING_UP;
    }
    *why = "serving";
    return KV__SERVING__SERVING;
}

int node_serving(node *n, char *detail, size_t len)
{
    cmap *m = cmap_slot_get(n->maps);
    const char *why;
    int s = node_serving_in(n, m, &why);
    if (detail && len)
        snprintf(detail, len, "%s", why);
    cmap_unref(m);
    return s;
}

/* ---- installing maps --------------------------------------------------- */

/* Whether the node may install m over cur: m lists the node, or ends a
 * transition that was taking it out (cur has it LEAVING) or bringing it in
 * (JOINING, and the change was aborted). */
static bool acceptable(node *n, cmap *cur, cmap *m)
{
    if (cmap_find(m, n->cfg.id) >= 0)
        return true;
    int i = cur ? cmap_find(cur, n->cfg.id) : -1;
    cmap_state st = i >= 0 ? cmap_node_at(cur, (size_t)i)->state : CMAP_UP;
    return i >= 0 && (st == CMAP_LEAVING || st == CMAP_JOINING);
}

/* What a new map means for the node once installed (map_mu held). init:
 * cluster init (only_if_empty), the first map of a new cluster. */
static void installed(node *n, cmap *old, cmap *m, const char *how, bool init)
{
    bool had_tr = old && cmap_transition(old), has_tr = cmap_transition(m) != NULL;
    KV_INFO("node", "installed cluster map epoch %llu (rf %u, %zu nodes%s%s) %s",
            (unsigned long long)cmap_epoch(m), cmap_rf(m), cmap_node_count(m),
            has_tr ? ", transition: " : "", has_tr ? cmap_transition(m)->kind : "", how);
    if (cmap_find(m, n->cfg.id) < 0) {
        KV_WARN("node", "%s is no longer in the cluster map: removed", n->cfg.id);
    } else if (had_tr && !has_tr && n->cfg.cleanup_delay_s >= 0) {
        atomic_store(&n->cleanup_at_ms, kv_wall_ms() + (uint64_t)n->cfg.cleanup_delay_s * 1000u);
    }
    if (!old && !init && cmap_find(m, n->cfg.id) >= 0) {
        /* writes sent while it had no map became hints on its peers; and a
         * member (not a joining node) that had no map lost its data */
        atomic_store(&n->catching_up, cmap_node_count(m) > 1);
        const cmap_node *me = cmap_node_at(m, (size_t)cmap_find(m, n->cfg.id));
        if (me->state == CMAP_UP)
            node_set_needs_repair(n, true, "joined a cluster as an existing member without a map");
    }
    if (n->streams)
        node_streams_map_changed(n);
}

/* Installs m if expected (> 0) equals the node's epoch, or (expected 0) if m
 * is newer. FAILED_PRECONDITION with a message otherwise. */
static kv_err install_map(node *n, cmap *m, uint64_t expected, bool only_if_empty, const char *how,
                          char *err, size_t errlen)
{
    pthread_mutex_lock(&n->map_mu);
    cmap *cur = cmap_slot_get(n->maps);
    uint64_t e = cur ? cmap_epoch(cur) : 0;
    kv_err rv = KV_OK;
    if (only_if_empty && cur) {
        snprintf(err, errlen, "node %s already has a cluster map (epoch %llu)", n->cfg.id,
                 (unsigned long long)e);
        rv = KV_ALREADY_EXISTS;
    } else if (!acceptable(n, cur, m)) {
        snprintf(err, errlen, "node id '%s' is not in the map", n->cfg.id);
        rv = KV_FAILED_PRECONDITION;
    } else if (expected && e != expected) {
        snprintf(err, errlen, "map epoch is %llu, not the expected %llu (another change won)",
                 (unsigned long long)e, (unsigned long long)expected);
        rv = KV_FAILED_PRECONDITION;
    } else if (cmap_epoch(m) <= e) {
        snprintf(err, errlen, "map epoch %llu is not newer than %llu",
                 (unsigned long long)cmap_epoch(m), (unsigned long long)e);
        rv = KV_FAILED_PRECONDITION;
    }
    if (rv == KV_OK)
        rv = persist_map(n, m, err, errlen);
    if (rv == KV_OK && (rv = cmap_slot_install(n->maps, m)) == KV_OK)
        installed(n, cur, m, how, only_if_empty);
    pthread_mutex_unlock(&n->map_mu);
    cmap_unref(cur);
    return rv;
}

kv_err node_h_get_map(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__GetMapReply rep = KV__GET_MAP_REPLY__INIT;
    cmap *m = cmap_slot_get(n->maps);
    Kv__ClusterMap *pb = NULL;
    if (m && cmap_to_pb(m, &pb) != KV_OK) {
        cmap_unref(m);
        return rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory encoding the map");
    }
    rep.has_map = m != NULL;
    rep.map = pb;
    c->reply_epoch = m ? cmap_epoch(m) : 0;
    kv_err rv = rpc_reply_msg(c, &rep.base);
    if (pb)
        kv__cluster_map__free_unpacked(pb, NULL);
    cmap_unref(m);
    return rv;
}

/* Puts the node's current map in the reply body (for a lost compare-and-set). */
static void reply_current_map(node *n, rpc_ctx *c)
{
    cmap *m = cmap_slot_get(n->maps);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (m && cmap_encode(m, &buf, &len) == KV_OK) {
        free(c->reply);
        c->reply = buf;
        c->reply_len = len;
        c->reply_epoch = cmap_epoch(m);
    }
    cmap_unref(m);
}

kv_err node_h_set_map(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__SetMapRequest *req = kv__set_map_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__SetMapRequest body");
    cmap *m = NULL;
    kv_err rv = req->map ? cmap_from_pb(req->map, &m, c->message, sizeof(c->message))
                         : rpc_fail(c, KV_INVALID_ARGUMENT, "SetMap without a map");
    if (rv == KV_OK && (n->cfg.sec.map_key || c->anonymous)) {
        /* cmap_vet's rules, as for a map from a peer of unknown address:
         * with a map key, whatever the caller's credentials, only a map an
         * admin holding the key signed; with authentication off (anyone may
         * call this), at least no absurd epoch jump, which would hold the
         * node (and through it the cluster) on a map no later change could
         * replace */
        cmap *cur = cmap_slot_get(n->maps);
        rv = cmap_vet(cur, m, NULL, false, n->cfg.sec.map_key, c->message, sizeof(c->message));
        cmap_unref(cur);
    }
    if (rv == KV_OK)
        rv = install_map(n, m, req->expected_epoch, req->only_if_empty, "from admin.SetMap",
                         c->message, sizeof(c->message));
    if (rv == KV_OK) {
        Kv__SetMapReply rep = KV__SET_MAP_REPLY__INIT;
        rep.epoch = cmap_epoch(m);
        c->reply_epoch = rep.epoch;
        rv = rpc_reply_msg(c, &rep.base);
    } else if (rv == KV_FAILED_PRECONDITION) {
        reply_current_map(n, c);
    }
    cmap_unref(m);
    kv__set_map_request__free_unpacked(req, NULL);
    return rv;
}

/* ---- refresher --------------------------------------------------------- */

void node_map_saw_epoch(node *n, uint64_t e)
{
    uint64_t cur = atomic_load_explicit(&n->seen_epoch, memory_order_relaxed);
    while (e > cur && !atomic_compare_exchange_weak(&n->seen_epoch, &cur, e))
        ;
}

/* Installs m, from the peer at from, when newer and trustworthy
 * (cmap_vet: a verified peer, or a plausible map). */
static void install_from_peer(node *n, cmap *m, const char *from, bool verified, const char *how)
{
    cmap *cur = cmap_slot_get(n->maps);
    char why[256];
    kv_err rv = !cur || cmap_epoch(m) > cmap_epoch(cur)
                    ? cmap_vet(cur, m, from, verified, n->cfg.sec.map_key, why, sizeof(why))
                    : KV_FAILED_PRECONDITION;
    cmap_unref(cur);
    if (rv == KV_PERMISSION_DENIED)
        KV_WARN("node", "refused cluster map epoch %llu %s %s: %s%s",
                (unsigned long long)cmap_epoch(m), how, from, why,
                n->cfg.sec.map_key ? ""
                                   : " (--map-key-file, or TLS with --tls-ca, makes maps "
                                     "from peers verifiable)");
    if (rv == KV_OK)
        install_map(n, m, 0, false, how, why, sizeof(why));
}

void node_map_learn(node *n, const rpc_reply *rep, const char *from)
{
    cmap *m = NULL;
    char err[256];
    if (cmap_decode(rep->body, rep->len, &m, err, sizeof(err)) != KV_OK) {
        KV_WARN("node", "replica %s sent an undecodable map: %s", from, err);
        return;
    }
    install_from_peer(n, m, from, rep->verified, "from the reply of");
    cmap_unref(m);
}

/* Asks addr for its map; installs it when newer and acceptable. Returns
 * true when the peer answered with a map. */
static bool fetch_from(node *n, const char *addr)
{
    rpc_chan *ch = node_chan(n, addr);
    Kv__GetMapRequest req = KV__GET_MAP_REQUEST__INIT;
    rpc_reply rep = {0};
    bool got = false;
    if (ch && rpc_call(ch, "admin.GetMap", 0, &req.base, 1000, &rep) == KV_OK) {
        Kv__GetMapReply *g = kv__get_map_reply__unpack(NULL, rep.len, rep.body);
        cmap *m = NULL;
        char err[256];
        if (g && g->has_map && g->map && cmap_from_pb(g->map, &m, err, sizeof(err)) == KV_OK) {
            got = true;
            install_from_peer(n, m, addr, rep.verified, "from peer");
            cmap_unref(m);
        }
        if (g)
            kv__get_map_reply__free_unpacked(g, NULL);
    }
    rpc_reply_free(&rep);
    return got;
}

static void refresh(node *n, bool all)
{
    cmap *m = cmap_slot_get(n->maps);
    size_t cnt = m ? cmap_node_count(m) : 0;
    for (size_t k = 0; k < cnt; k++) {
        size_t i = (n->refresh_next++) % cnt;
        if (strcmp(cmap_node_at(m, i)->id, n->cfg.id) == 0)
            continue;
        bool got = fetch_from(n, cmap_node_at(m, i)->addr);
        if (!all ? got : cmap_slot_epoch(n->maps) >= atomic_load(&n->seen_epoch))
            break;
    }
    cmap_unref(m);
}

static void map_tick(void *arg)
{
    node *n = arg;
    static _Thread_local uint64_t next_refresh;
    uint64_t now = kv_now_ns();
    uint64_t due = atomic_load(&n->cleanup_at_ms);
    if (due && kv_wall_ms() >= due && atomic_compare_exchange_strong(&n->cleanup_at_ms, &due, 0)) {
        uint64_t dropped = 0, kept = 0;
        kv_err rv = node_cleanup(n, &dropped, &kept);
        KV_INFO("node", "automatic cleanup after the transition: %s, %llu records dropped",
                kv_err_name(rv), (unsigned long long)dropped);
    }
    if (kv_wall_ms() >= n->alive_next_ms)
        write_alive(n);
    bool behind = atomic_load(&n->seen_epoch) > cmap_slot_epoch(n->maps);
    if (behind || now >= next_refresh) {
        refresh(n, behind);
        next_refresh = now + (uint64_t)n->cfg.map_refresh_ms * 1000000ull;
    }
}

kv_err node_map_start(node *n)
{
    kv_ticker_opts o = {.period_ns = MAP_TICK_NS,
                        .fn = map_tick,
                        .arg = n,
                        .thread_start = engine_thread_register,
                        .thread_stop = engine_thread_unregister};
    return kv_ticker_start(&n->map_ticker, &o);
}

void node_map_stop(node *n)
{
    kv_ticker_stop(n->map_ticker);
    n->map_ticker = NULL;
}

/* ---- cleanup and repair marks ------------------------------------------ */

typedef struct keep_ctx {
    node *n;
    cmap *m; /* the map when the cleanup began */
} keep_ctx;

/* Keeps a key the node held a replica of when the cleanup began, or holds
 * now (a newer map may have given a range back). */
static bool keep_key(void *arg, const void *key, size_t klen)
{
    keep_ctx *k = arg;
    if (node_holds(k->n, k->m, key, klen))
        return true;
    cmap *now = cmap_slot_get(k->n->maps);
    bool keep = now != k->m && node_holds(k->n, now, key, klen);
    cmap_unref(now);
    return keep;
}

kv_err node_cleanup(node *n, uint64_t *dropped, uint64_t *kept)
{
    keep_ctx k = {n, cmap_slot_get(n->maps)};
    if (!k.m || cmap_find(k.m, n->cfg.id) < 0) {
        cmap_unref(k.m);
        return KV_FAILED_PRECONDITION;
    }
    kv_err rv = engine_cleanup(n->eng, keep_key, &k, dropped, kept);
    cmap_unref(k.m);
    return rv;
}

kv_err node_h_cleanup(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__CleanupRequest *req = kv__cleanup_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__CleanupRequest body");
    kv__cleanup_request__free_unpacked(req, NULL);
    Kv__CleanupReply rep = KV__CLEANUP_REPLY__INIT;
    kv_err rv = node_cleanup(n, &rep.dropped, &rep.kept);
    if (rv == KV_FAILED_PRECONDITION)
        return rpc_fail(c, rv, "node %s has no cluster map listing it: nothing to clean up",
                        n->cfg.id);
    if (rv != KV_OK)
        return rpc_fail(c, rv, "cleanup failed: %s", kv_strerror(rv));
    KV_INFO("node", "cleanup: %llu records dropped, %llu kept", (unsigned long long)rep.dropped,
            (unsigned long long)rep.kept);
    return rpc_reply_msg(c, &rep.base);
}

kv_err node_h_repaired(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__RepairedRequest *req = kv__repaired_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__RepairedRequest body");
    kv_err rv = KV_OK;
    if (req->node_id && strcmp(req->node_id, n->cfg.id) == 0)
        rv = node_set_needs_repair(n, false, "kvctl repair rebuilt its ranges");
    else if (req->node_id && *req->node_id)
        rv = node_handoff_repaired(n, req->node_id);
    else
        rv = rpc_fail(c, KV_INVALID_ARGUMENT, "RepairedRequest without a node id");
    kv__repaired_request__free_unpacked(req, NULL);
    if (rv != KV_OK && !c->message[0])
        rpc_fail(c, rv, "cannot record the repair: %s", kv_strerror(rv));
    Kv__RepairedReply rep = KV__REPAIRED_REPLY__INIT;
    return rv == KV_OK ? rpc_reply_msg(c, &rep.base) : rv;
}
