/* SPDX-License-Identifier: MIT */
/*
 * The cluster map: validation of kv.ClusterMap messages and `ID=ADDR[@W]`
 * specs, the immutable reference-counted map with its ring, its wire
 * encoding, and cmap_slot, the mutex-guarded pointer a process swaps when it
 * learns a newer epoch. Validation happens once, when a map is built; every
 * lookup afterwards is lock-free and allocation-free.
 */
#include "shard/clustermap.h"

#include <ctype.h>
#include <mbedtls/md.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cmap {
    _Atomic size_t refs;
    uint64_t epoch;
    unsigned rf;
    unsigned vnodes;
    size_t n;
    cmap_node *nodes;
    char *strings;      /* one arena holding every id, address and ring name */
    ring *ring;         /* the current ring */
    uint32_t *cur_idx;  /* current ring index -> map index */
    ring *pring;        /* the pending ring, NULL without a transition */
    uint32_t *pend_idx; /* pending ring index -> map index */
    Kv__Transition *tr; /* own copy, NULL without a transition */
    _Atomic uint8_t *health;
    uint8_t mac[CMAP_MAC_LEN]; /* ClusterMap.mac when it had CMAP_MAC_LEN bytes */
    bool has_mac;
};

struct cmap_slot {
    pthread_mutex_t mu;
    cmap *map;
    /* map's epoch (0: none), written under mu with map and read without it:
     * cmap_slot_epoch runs on every coordinated request, and a mutex shared
     * by the event loops would move its line between their cores each time */
    _Atomic uint64_t epoch;
};

static kv_err fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kv_err fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return KV_INVALID_ARGUMENT;
}

/* Copies s into buf (≥ 72 bytes) for an error message: at most 64 bytes,
 * non-printable bytes as '?', "..." when cut. */
static const char *shown(const char *s, char *buf)
{
    size_t i = 0;
    for (; s[i] != '\0' && i < 64; i++)
        buf[i] = isprint((unsigned char)s[i]) ? s[i] : '?';
    strcpy(buf + i, s[i] != '\0' ? "..." : "");
    return buf;
}

static bool id_ok(const char *id)
{
    size_t len = strlen(id);
    if (len == 0 || len > CMAP_MAX_ID)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)id[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != '-')
            return false;
    }
    return true;
}

static bool span_ok(const char *p, const char *end, const char *extra)
{
    for (; p < end; p++)
        if (!isalnum((unsigned char)*p) && strchr(extra, *p) == NULL)
            return false;
    return true;
}

/* tcp://host:port or tls+tcp://host:port with host a DNS name, IPv4
 * address or [IPv6] address. */
static bool addr_ok(const char *a)
{
    size_t skip = strncmp(a, "tcp://", 6) == 0 ? 6 : strncmp(a, "tls+tcp://", 10) == 0 ? 10 : 0;
    if (strlen(a) > CMAP_MAX_ADDR || !skip)
        return false;
    const char *h = a + skip, *colon;
    if (*h == '[') {
        const char *rb = strchr(h, ']');
        if (rb == NULL || rb == h + 1 || rb[1] != ':' || !span_ok(h + 1, rb, ":."))
            return false;
        colon = rb + 1;
    } else {
        colon = strrchr(h, ':');
        if (colon == NULL || colon == h || !span_ok(h, colon, ".-_"))
            return false;
    }
    const char *port = colon + 1;
    size_t plen = strlen(port);
    if (plen == 0 || plen > 5)
        return false;
    for (size_t i = 0; i < plen; i++)
        if (!isdigit((unsigned char)port[i]))
            return false;
    long v = strtol(port, NULL, 10);
    return v >= 1 && v <= 65535;
}

static kv_err check_node(const Kv__NodeInfo *ni, size_t i, char *err, size_t errlen)
{
    char b1[72], b2[72];
    if (ni == NULL || ni->id == NULL || ni->addr == NULL)
        return fail(err, errlen, "node %zu: missing", i);
    if (!id_ok(ni->id))
        return fail(err, errlen,
                    "node %zu: invalid id \"%s\" (want 1..%d characters of [A-Za-z0-9._-])", i,
                    shown(ni->id, b1), CMAP_MAX_ID);
    if (!addr_ok(ni->addr))
        return fail(err, errlen,
                    "node \"%s\": invalid address \"%s\" (want tcp:// or tls+tcp://host:port, "
                    "port 1..65535)",
                    ni->id, shown(ni->addr, b2));
    if (ni->weight > RING_MAX_WEIGHT)
        return fail(err, errlen, "node \"%s\": weight %u out of range 1..%u", ni->id, ni->weight,
                    RING_MAX_WEIGHT);
    if ((unsigned)ni->state > (unsigned)CMAP_LEAVING)
        return fail(err, errlen, "node \"%s\": unknown state %d", ni->id, (int)ni->state);
    if (ni->next_weight > RING_MAX_WEIGHT)
        return fail(err, errlen, "node \"%s\": next weight %u out of range 1..%u", ni->id,
                    ni->next_weight, RING_MAX_WEIGHT);
    if (ni->ring_name && ni->ring_name[0] && !id_ok(ni->ring_name))
        return fail(err, errlen, "node \"%s\": invalid ring name \"%s\"", ni->id,
                    shown(ni->ring_name, b1));
    return KV_OK;
}

static const char *ring_name_of(const Kv__NodeInfo *ni)
{
    return ni->ring_name && ni->ring_name[0] ? ni->ring_name : ni->id;
}

/* Whether node ni is a member of the current (next = false) or pending ring. */
static bool in_ring(const Kv__NodeInfo *ni, bool next)
{
    return next ? ni->state != KV__NODE_STATE__LEAVING : ni->state != KV__NODE_STATE__JOINING;
}

static uint32_t ring_weight(const Kv__NodeInfo *ni, bool next)
{
    uint32_t w = next && ni->next_weight ? ni->next_weight : ni->weight;
    return w ? w : 1;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Checks one ring of the map: at least rf members, unique ring names, and
 * its point count. */
static kv_err check_ring(const Kv__ClusterMap *pb, bool next, char *err, size_t errlen)
{
    uint64_t points = 0, vn = pb->vnodes ? pb->vnodes : RING_DEFAULT_VNODES;
    const char **names = malloc(pb->n_nodes * sizeof *names);
    if (names == NULL)
        return KV_RESOURCE_EXHAUSTED;
    size_t members = 0;
    for (size_t i = 0; i < pb->n_nodes; i++) {
        if (!in_ring(pb->nodes[i], next))
            continue;
        names[members++] = ring_name_of(pb->nodes[i]);
        points += vn * ring_weight(pb->nodes[i], next);
    }
    qsort(names, members, sizeof *names, name_cmp);
    const char *dup = NULL;
    for (size_t i = 1; i < members && !dup; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            dup = names[i];
    kv_err rv = KV_OK;
    if (dup)
        rv = fail(err, errlen, "two nodes of the %s ring share the ring name \"%s\"",
                  next ? "pending" : "current", dup);
    else if (members < pb->rf)
        rv = fail(err, errlen, "the %s ring has %zu nodes, fewer than rf %u",
                  next ? "pending" : "current", members, pb->rf);
    else if (points > RING_MAX_POINTS)
        rv = fail(err, errlen, "ring too large: %llu points (vnodes x total weight, max %u)",
                  (unsigned long long)points, RING_MAX_POINTS);
    free(names);
    return rv;
}

/* JOINING, LEAVING and next_weight belong to a transition; a transition
 * needs something to change and its streams well-formed. */
static kv_err check_transition(const Kv__ClusterMap *pb, char *err, size_t errlen)
{
    bool moving = false;
    for (size_t i = 0; i < pb->n_nodes; i++) {
        const Kv__NodeInfo *ni = pb->nodes[i];
        if (ni->state == KV__NODE_STATE__JOINING || ni->state == KV__NODE_STATE__LEAVING ||
            ni->next_weight) {
            if (!pb->transition)
                return fail(err, errlen, "node \"%s\" is %s without a transition", ni->id,
                            ni->next_weight ? "reweighted"
                                            : cmap_state_name((cmap_state)ni->state));
            moving = true;
        }
    }
    if (!pb->transition)
        return KV_OK;
    if (!moving)
        return fail(err, errlen, "transition without a joining, leaving or reweighted node");
    const Kv__Transition *t = pb->transition;
    char b[72]; /* stream ids are not validated: shown() keeps the message printable */
    for (size_t i = 0; i < t->n_streams; i++) {
        const Kv__StreamPlan *sp = t->streams[i];
        if (!sp || !sp->id || !sp->id[0] || !sp->source || !sp->target)
            return fail(err, errlen, "transition stream %zu: missing id, source or target", i);
        bool src = false, dst = false;
        for (size_t k = 0; k < pb->n_nodes; k++) {
            src = src || strcmp(pb->nodes[k]->id, sp->source) == 0;
            dst = dst || strcmp(pb->nodes[k]->id, sp->target) == 0;
        }
        if (!src || !dst)
            return fail(err, errlen, "transition stream \"%s\": unknown source or target",
                        shown(sp->id, b));
        for (size_t r = 0; r < sp->n_ranges; r++)
            if (!sp->ranges[r])
                return fail(err, errlen, "transition stream \"%s\": missing range",
                            shown(sp->id, b));
    }
    return KV_OK;
}

static int str_ptr_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Finds a duplicate among the id (or addr) strings of the nodes. Returns
 * KV_OK when all are distinct, INVALID_ARGUMENT with *dup set otherwise. */
static kv_err find_dup(Kv__NodeInfo *const *nodes, size_t n, bool addr, const char **dup)
{
    const char **s = malloc(n * sizeof *s);
    if (s == NULL)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++)
        s[i] = addr ? nodes[i]->addr : nodes[i]->id;
    qsort(s, n, sizeof *s, str_ptr_cmp);
    kv_err rv = KV_OK;
    for (size_t i = 1; i < n && rv == KV_OK; i++) {
        if (strcmp(s[i - 1], s[i]) == 0) {
            *dup = s[i];
            rv = KV_INVALID_ARGUMENT;
        }
    }
    free(s);
    return rv;
}

static kv_err check_map(const Kv__ClusterMap *pb, char *err, size_t errlen)
{
    if (pb == NULL)
        return fail(err, errlen, "cluster map missing");
    if (pb->epoch < 1)
        return fail(err, errlen, "cluster map epoch must be >= 1");
    if (pb->n_nodes < 1 || pb->nodes == NULL)
        return fail(err, errlen, "cluster map has no nodes");
    if (pb->n_nodes > CMAP_MAX_NODES)
        return fail(err, errlen, "cluster map has %zu nodes (max %d)", pb->n_nodes, CMAP_MAX_NODES);
    if (pb->rf < 1 || pb->rf > pb->n_nodes || pb->rf > CMAP_MAX_RF)
        return fail(err, errlen, "rf %u out of range 1..%zu (number of nodes, at most %d)", pb->rf,
                    pb->n_nodes, CMAP_MAX_RF);
    if (pb->vnodes > RING_MAX_VNODES)
        return fail(err, errlen, "vnodes %u out of range 0..%u", pb->vnodes, RING_MAX_VNODES);
    for (size_t i = 0; i < pb->n_nodes; i++) {
        kv_err rv = check_node(pb->nodes[i], i, err, errlen);
        if (rv != KV_OK)
            return rv;
    }
    const char *dup = NULL;
    for (int a = 0; a < 2; a++) {
        kv_err rv = find_dup(pb->nodes, pb->n_nodes, a == 1, &dup);
        if (rv == KV_RESOURCE_EXHAUSTED)
            return rv;
        if (rv != KV_OK)
            return fail(err, errlen, "duplicate node %s \"%s\"", a ? "address" : "id", dup);
    }
    kv_err trv = check_transition(pb, err, errlen);
    for (int next = 0; trv == KV_OK && next < (pb->transition ? 2 : 1); next++)
        trv = check_ring(pb, next == 1, err, errlen);
    if (trv != KV_OK)
        return trv;
    return KV_OK;
}

static void map_free(cmap *m)
{
    ring_destroy(m->ring);
    ring_destroy(m->pring);
    free(m->cur_idx);
    free(m->pend_idx);
    if (m->tr)
        kv__transition__free_unpacked(m->tr, NULL);
    free((void *)m->health);
    free(m->nodes);
    free(m->strings);
    free(m);
}

/* Builds the current (next = false) or pending ring over the member nodes,
 * with *idx mapping ring indices back to map indices. */
static kv_err build_ring(cmap *m, const Kv__ClusterMap *pb, bool next, ring **out, uint32_t **idx)
{
    ring_node *rn = malloc(m->n * sizeof *rn);
    *idx = malloc(m->n * sizeof **idx);
    if (rn == NULL || *idx == NULL) {
        free(rn);
        return KV_RESOURCE_EXHAUSTED;
    }
    size_t k = 0;
    for (size_t i = 0; i < m->n; i++) {
        if (!in_ring(pb->nodes[i], next))
            continue;
        rn[k] = (ring_node){m->nodes[i].ring_name, ring_weight(pb->nodes[i], next)};
        (*idx)[k++] = (uint32_t)i;
    }
    kv_err rv = ring_create(out, rn, k, m->vnodes);
    free(rn);
    return rv;
}

/* Keeps a copy of the transition (pack + unpack: a deep copy). */
static kv_err copy_transition(cmap *m, const Kv__Transition *t)
{
    size_t len = kv__transition__get_packed_size(t);
    uint8_t *buf = malloc(len ? len : 1);
    if (buf == NULL)
        return KV_RESOURCE_EXHAUSTED;
    kv__transition__pack(t, buf);
    m->tr = kv__transition__unpack(NULL, len, buf);
    free(buf);
    return m->tr ? KV_OK : KV_RESOURCE_EXHAUSTED;
}

/* Copies the (validated) nodes of pb into m and builds the ring(s). */
static kv_err map_fill(cmap *m, const Kv__ClusterMap *pb)
{
    size_t bytes = 0;
    for (size_t i = 0; i < m->n; i++)
        bytes += strlen(pb->nodes[i]->id) + strlen(pb->nodes[i]->addr) +
                 strlen(ring_name_of(pb->nodes[i])) + 3;
    m->nodes = calloc(m->n, sizeof *m->nodes);
    m->strings = malloc(bytes);
    m->health = calloc(m->n, 1);
    if (m->nodes == NULL || m->strings == NULL || m->health == NULL)
        return KV_RESOURCE_EXHAUSTED;
    char *p = m->strings;
    for (size_t i = 0; i < m->n; i++) {
        const Kv__NodeInfo *ni = pb->nodes[i];
        const char *rname = ring_name_of(ni);
        size_t il = strlen(ni->id) + 1, al = strlen(ni->addr) + 1, rl = strlen(rname) + 1;
        m->nodes[i].id = memcpy(p, ni->id, il);
        m->nodes[i].addr = memcpy(p + il, ni->addr, al);
        m->nodes[i].ring_name = memcpy(p + il + al, rname, rl);
        p += il + al + rl;
        m->nodes[i].weight = ni->weight ? ni->weight : 1;
        m->nodes[i].next_weight = ni->next_weight;
        m->nodes[i].state = (cmap_state)ni->state;
    }
    kv_err rv = build_ring(m, pb, false, &m->ring, &m->cur_idx);
    if (rv == KV_OK && pb->transition)
        rv = build_ring(m, pb, true, &m->pring, &m->pend_idx);
    if (rv == KV_OK && pb->transition)
        rv = copy_transition(m, pb->transition);
    return rv;
}

kv_err cmap_from_pb(const Kv__ClusterMap *pb, cmap **out, char *err, size_t errlen)
{
    kv_err rv = check_map(pb, err, errlen);
    if (rv != KV_OK)
        return rv;
    cmap *m = calloc(1, sizeof *m);
    if (m == NULL)
        return KV_RESOURCE_EXHAUSTED;
    atomic_init(&m->refs, 1);
    m->epoch = pb->epoch;
    m->rf = pb->rf;
    m->vnodes = pb->vnodes ? pb->vnodes : RING_DEFAULT_VNODES;
    m->n = pb->n_nodes;
    if (pb->mac.len == CMAP_MAC_LEN) { /* any other length cannot verify: as if unsigned */
        memcpy(m->mac, pb->mac.data, CMAP_MAC_LEN);
        m->has_mac = true;
    }
    if ((rv = map_fill(m, pb)) != KV_OK) {
        map_free(m);
        if (rv == KV_INVALID_ARGUMENT) /* not expected after check_map */
            fail(err, errlen, "cluster map rejected by the ring");
        return rv;
    }
    *out = m;
    return KV_OK;
}

kv_err cmap_decode(const uint8_t *buf, size_t len, cmap **out, char *err, size_t errlen)
{
    if (buf == NULL && len > 0)
        return fail(err, errlen, "cluster map buffer missing");
    Kv__ClusterMap *pb = kv__cluster_map__unpack(NULL, len, buf);
    if (pb == NULL)
        return fail(err, errlen, "malformed ClusterMap message (%zu bytes)", len);
    kv_err rv = cmap_from_pb(pb, out, err, errlen);
    kv__cluster_map__free_unpacked(pb, NULL);
    return rv;
}

/* Fills pb (with nodes/ptrs arrays of m->n entries) from m; strings are
 * borrowed from m, so pb must not be freed with free_unpacked. */
static void pb_view(const cmap *m, Kv__ClusterMap *pb, Kv__NodeInfo *nodes, Kv__NodeInfo **ptrs)
{
    kv__cluster_map__init(pb);
    pb->epoch = m->epoch;
    pb->rf = m->rf;
    pb->vnodes = m->vnodes;
    pb->n_nodes = m->n;
    pb->nodes = ptrs;
    for (size_t i = 0; i < m->n; i++) {
        kv__node_info__init(&nodes[i]);
        nodes[i].id = (char *)m->nodes[i].id;
        nodes[i].addr = (char *)m->nodes[i].addr;
        nodes[i].weight = m->nodes[i].weight;
        nodes[i].state = (Kv__NodeState)m->nodes[i].state;
        nodes[i].next_weight = m->nodes[i].next_weight;
        if (strcmp(m->nodes[i].ring_name, m->nodes[i].id) != 0)
            nodes[i].ring_name = (char *)m->nodes[i].ring_name;
        ptrs[i] = &nodes[i];
    }
    pb->transition = m->tr;
}

/* m as a kv.ClusterMap, with its mac or without it (the bytes it signs). */
static kv_err encode(const cmap *m, bool with_mac, uint8_t **buf, size_t *len)
{
    Kv__ClusterMap pb;
    Kv__NodeInfo *nodes = malloc(m->n * sizeof *nodes);
    Kv__NodeInfo **ptrs = malloc(m->n * sizeof *ptrs);
    uint8_t *b = NULL;
    if (nodes != NULL && ptrs != NULL) {
        pb_view(m, &pb, nodes, ptrs);
        if (with_mac && m->has_mac)
            pb.mac = (ProtobufCBinaryData){CMAP_MAC_LEN, (uint8_t *)m->mac};
        size_t n = kv__cluster_map__get_packed_size(&pb);
        if ((b = malloc(n ? n : 1)) != NULL) {
            *len = kv__cluster_map__pack(&pb, b);
            *buf = b;
        }
    }
    free(nodes);
    free(ptrs);
    return b != NULL ? KV_OK : KV_RESOURCE_EXHAUSTED;
}

kv_err cmap_encode(const cmap *m, uint8_t **buf, size_t *len)
{
    return encode(m, true, buf, len);
}

/* HMAC-SHA256 of m's canonical encoding (without its mac) under key. */
static kv_err map_mac(const cmap *m, const char *key, uint8_t out[CMAP_MAC_LEN])
{
    uint8_t *buf = NULL;
    size_t len = 0;
    kv_err rv = encode(m, false, &buf, &len);
    if (rv != KV_OK)
        return rv;
    const mbedtls_md_info_t *md = mbedtls_md_info_from_type(MBEDTLS_MD_SHA256);
    int r = md ? mbedtls_md_hmac(md, (const unsigned char *)key, strlen(key), buf, len, out) : -1;
    free(buf);
    return r == 0 ? KV_OK : KV_INTERNAL;
}

kv_err cmap_sign_pb(const cmap *m, const char *key, Kv__ClusterMap *pb)
{
    uint8_t mac[CMAP_MAC_LEN];
    kv_err rv = map_mac(m, key, mac);
    uint8_t *copy = rv == KV_OK ? malloc(CMAP_MAC_LEN) : NULL;
    if (rv == KV_OK && !copy)
        rv = KV_RESOURCE_EXHAUSTED;
    if (rv != KV_OK)
        return rv;
    memcpy(copy, mac, CMAP_MAC_LEN);
    free(pb->mac.data);
    pb->mac = (ProtobufCBinaryData){CMAP_MAC_LEN, copy};
    return KV_OK;
}

bool cmap_same(const cmap *a, const cmap *b)
{
    uint8_t *x = NULL, *y = NULL;
    size_t lx = 0, ly = 0;
    bool same = encode(a, false, &x, &lx) == KV_OK && encode(b, false, &y, &ly) == KV_OK &&
                lx == ly && memcmp(x, y, lx) == 0;
    free(x);
    free(y);
    return same;
}

bool cmap_signed(const cmap *m)
{
    return m->has_mac;
}

kv_err cmap_check_sig(const cmap *m, const char *key, char *why, size_t len)
{
    if (!m->has_mac) {
        snprintf(why, len, "map epoch %llu is not signed, and this process has a map key",
                 (unsigned long long)m->epoch);
        return KV_PERMISSION_DENIED;
    }
    uint8_t want[CMAP_MAC_LEN];
    kv_err rv = map_mac(m, key, want);
    if (rv != KV_OK) {
        snprintf(why, len, "cannot compute the map's HMAC");
        return rv;
    }
    uint8_t diff = 0; /* every byte compared: the time does not tell where they differ */
    for (size_t i = 0; i < CMAP_MAC_LEN; i++)
        diff |= (uint8_t)(want[i] ^ m->mac[i]);
    if (diff) {
        snprintf(why, len, "map epoch %llu is signed with another map key",
                 (unsigned long long)m->epoch);
        return KV_PERMISSION_DENIED;
    }
    return KV_OK;
}

kv_err cmap_to_pb(const cmap *m, Kv__ClusterMap **out)
{
    Kv__ClusterMap *pb = malloc(sizeof *pb);
    if (pb == NULL)
        return KV_RESOURCE_EXHAUSTED;
    kv__cluster_map__init(pb);
    pb->epoch = m->epoch;
    pb->rf = m->rf;
    pb->vnodes = m->vnodes;
    pb->nodes = calloc(m->n, sizeof *pb->nodes);
    bool ok = pb->nodes != NULL;
    for (size_t i = 0; ok && i < m->n; i++) {
        Kv__NodeInfo *ni = malloc(sizeof *ni);
        if ((ok = ni != NULL)) {
            kv__node_info__init(ni);
            pb->nodes[pb->n_nodes++] = ni;
            /* A NULL string is skipped by free_unpacked, so a failed strdup is
             * safe to leave in place. */
            ni->id = strdup(m->nodes[i].id);
            ni->addr = strdup(m->nodes[i].addr);
            ni->weight = m->nodes[i].weight;
            ni->state = (Kv__NodeState)m->nodes[i].state;
            ni->next_weight = m->nodes[i].next_weight;
            ok = ni->id != NULL && ni->addr != NULL;
            if (ok && strcmp(m->nodes[i].ring_name, m->nodes[i].id) != 0)
                ok = (ni->ring_name = strdup(m->nodes[i].ring_name)) != NULL;
        }
    }
    if (ok && m->tr) { /* deep copy through the wire form */
        size_t len = kv__transition__get_packed_size(m->tr);
        uint8_t *buf = malloc(len ? len : 1);
        if ((ok = buf != NULL)) {
            kv__transition__pack(m->tr, buf);
            ok = (pb->transition = kv__transition__unpack(NULL, len, buf)) != NULL;
            free(buf);
        }
    }
    if (ok && m->has_mac && (ok = (pb->mac.data = malloc(CMAP_MAC_LEN)) != NULL)) {
        memcpy(pb->mac.data, m->mac, CMAP_MAC_LEN);
        pb->mac.len = CMAP_MAC_LEN;
    }
    if (!ok) {
        kv__cluster_map__free_unpacked(pb, NULL);
        return KV_RESOURCE_EXHAUSTED;
    }
    *out = pb;
    return KV_OK;
}

/* Splits one `ID=ADDR[@WEIGHT]` word (modified in place) into ni. */
static kv_err parse_word(char *w, const char *orig, Kv__NodeInfo *ni, char *err, size_t errlen)
{
    char b[72];
    char *eq = strchr(w, '=');
    if (eq == NULL || eq == w || eq[1] == '\0')
        return fail(err, errlen,
                    "node spec \"%s\": want ID=tcp://host:port[@WEIGHT] (or tls+tcp://)",
                    shown(orig, b));
    *eq = '\0';
    ni->id = w;
    ni->addr = eq + 1;
    char *at = strrchr(ni->addr, '@');
    if (at != NULL) {
        *at = '\0';
        char *end;
        unsigned long v = strtoul(at + 1, &end, 10);
        if (at[1] == '\0' || *end != '\0' || !isdigit((unsigned char)at[1]) || v < 1 ||
            v > RING_MAX_WEIGHT)
            return fail(err, errlen, "node spec \"%s\": weight must be 1..%u", shown(orig, b),
                        RING_MAX_WEIGHT);
        ni->weight = (uint32_t)v;
    }
    return KV_OK;
}

kv_err cmap_parse_spec(uint64_t epoch, unsigned rf, char *const *specs, int n, cmap **out,
                       char *err, size_t errlen)
{
    if (n < 1 || specs == NULL)
        return fail(err, errlen, "no nodes given (want ID=tcp://host:port[@WEIGHT] ...)");
    if (n > CMAP_MAX_NODES)
        return fail(err, errlen, "%d nodes given (max %d)", n, CMAP_MAX_NODES);
    Kv__NodeInfo *nodes = calloc((size_t)n, sizeof *nodes);
    Kv__NodeInfo **ptrs = calloc((size_t)n, sizeof *ptrs);
    char **words = calloc((size_t)n, sizeof *words);
    kv_err rv = nodes && ptrs && words ? KV_OK : KV_RESOURCE_EXHAUSTED;
    for (int i = 0; rv == KV_OK && i < n; i++) {
        kv__node_info__init(&nodes[i]);
        ptrs[i] = &nodes[i];
        if ((words[i] = strdup(specs[i] ? specs[i] : "")) == NULL)
            rv = KV_RESOURCE_EXHAUSTED;
        else
            rv = parse_word(words[i], specs[i] ? specs[i] : "", &nodes[i], err, errlen);
    }
    if (rv == KV_OK) {
        Kv__ClusterMap pb;
        kv__cluster_map__init(&pb);
        pb.epoch = epoch;
        pb.rf = rf;
        pb.n_nodes = (size_t)n;
        pb.nodes = ptrs;
        rv = cmap_from_pb(&pb, out, err, errlen);
    }
    for (int i = 0; words != NULL && i < n; i++)
        free(words[i]);
    free(words);
    free(ptrs);
    free(nodes);
    return rv;
}

cmap *cmap_ref(cmap *m)
{
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
    return m;
}

void cmap_unref(cmap *m)
{
    /* acq_rel: the last holder sees every other holder's reads finished. */
    if (m != NULL && atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1)
        map_free(m);
}

void cmap_destroy(cmap *m)
{
    cmap_unref(m);
}

uint64_t cmap_epoch(const cmap *m)
{
    return m->epoch;
}

unsigned cmap_rf(const cmap *m)
{
    return m->rf;
}

unsigned cmap_vnodes(const cmap *m)
{
    return m->vnodes;
}

size_t cmap_node_count(const cmap *m)
{
    return m->n;
}

const cmap_node *cmap_node_at(const cmap *m, size_t i)
{
    return &m->nodes[i];
}

const ring *cmap_ring(const cmap *m)
{
    return m->ring;
}

static size_t translate(const uint32_t *map, uint32_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++)
        idx[i] = map[idx[i]];
    return n;
}

size_t cmap_replicas_hash(const cmap *m, uint64_t h, uint32_t *idx_out)
{
    return translate(m->cur_idx, idx_out, ring_replicas_hash(m->ring, h, m->rf, idx_out));
}

size_t cmap_replicas(const cmap *m, const void *key, size_t klen, uint32_t *idx_out)
{
    return cmap_replicas_hash(m, ring_key_hash(key, klen), idx_out);
}

size_t cmap_next_replicas_hash(const cmap *m, uint64_t h, uint32_t *idx_out)
{
    if (m->pring == NULL)
        return cmap_replicas_hash(m, h, idx_out);
    return translate(m->pend_idx, idx_out, ring_replicas_hash(m->pring, h, m->rf, idx_out));
}

size_t cmap_pending_hash(const cmap *m, uint64_t h, uint32_t *idx_out)
{
    if (m->pring == NULL)
        return 0;
    uint32_t cur[CMAP_MAX_RF], next[CMAP_MAX_RF];
    size_t nc = cmap_replicas_hash(m, h, cur), nn = cmap_next_replicas_hash(m, h, next), k = 0;
    for (size_t i = 0; i < nn; i++) {
        size_t j = 0;
        while (j < nc && cur[j] != next[i])
            j++;
        if (j == nc)
            idx_out[k++] = next[i];
    }
    return k;
}

size_t cmap_pending(const cmap *m, const void *key, size_t klen, uint32_t *idx_out)
{
    return cmap_pending_hash(m, ring_key_hash(key, klen), idx_out);
}

bool cmap_holds(const cmap *m, size_t i, const void *key, size_t klen)
{
    uint32_t idx[CMAP_MAX_RF];
    uint64_t h = ring_key_hash(key, klen);
    size_t n = cmap_replicas_hash(m, h, idx);
    for (size_t k = 0; k < n; k++)
        if (idx[k] == i)
            return true;
    n = cmap_pending_hash(m, h, idx);
    for (size_t k = 0; k < n; k++)
        if (idx[k] == i)
            return true;
    return false;
}

uint32_t cmap_owner(const cmap *m, const void *key, size_t klen)
{
    return m->cur_idx[ring_owner(m->ring, key, klen)];
}

void cmap_shares(const cmap *m, bool next, double *share_out)
{
    const ring *r = next && m->pring ? m->pring : m->ring;
    const uint32_t *map = next && m->pring ? m->pend_idx : m->cur_idx;
    size_t k = ring_node_count(r);
    double *tmp = calloc(k, sizeof *tmp);
    for (size_t i = 0; i < m->n; i++)
        share_out[i] = 0.0;
    if (tmp == NULL)
        return;
    ring_shares(r, tmp);
    for (size_t i = 0; i < k; i++)
        share_out[map[i]] = tmp[i];
    free(tmp);
}

const ring *cmap_ring_next(const cmap *m)
{
    return m->pring ? m->pring : m->ring;
}

const Kv__Transition *cmap_transition(const cmap *m)
{
    return m->tr;
}

void cmap_set_health(const cmap *m, size_t i, cmap_health h)
{
    if (i < m->n)
        atomic_store_explicit(&m->health[i], (uint8_t)h, memory_order_relaxed);
}

cmap_health cmap_get_health(const cmap *m, size_t i)
{
    return i < m->n ? (cmap_health)atomic_load_explicit(&m->health[i], memory_order_relaxed)
                    : CMAP_HEALTH_UNKNOWN;
}

bool cmap_readable(const cmap *m, size_t i)
{
    cmap_health h = cmap_get_health(m, i);
    return h == CMAP_HEALTH_UNKNOWN || h == CMAP_HEALTH_UP;
}

int cmap_find(const cmap *m, const char *id)
{
    for (size_t i = 0; id != NULL && i < m->n; i++)
        if (strcmp(m->nodes[i].id, id) == 0)
            return (int)i;
    return -1;
}

int cmap_find_addr(const cmap *m, const char *addr)
{
    for (size_t i = 0; addr != NULL && i < m->n; i++)
        if (strcmp(m->nodes[i].addr, addr) == 0)
            return (int)i;
    return -1;
}

const char *cmap_state_name(cmap_state s)
{
    static const char *const names[] = {"UP", "DOWN", "JOINING", "LEAVING"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "?";
}

kv_err cmap_slot_create(cmap_slot **out)
{
    cmap_slot *s = calloc(1, sizeof *s);
    if (s == NULL)
        return KV_RESOURCE_EXHAUSTED;
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return KV_OK;
}

void cmap_slot_destroy(cmap_slot *s)
{
    if (s == NULL)
        return;
    cmap_unref(s->map);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

cmap *cmap_slot_get(cmap_slot *s)
{
    pthread_mutex_lock(&s->mu);
    cmap *m = s->map ? cmap_ref(s->map) : NULL;
    pthread_mutex_unlock(&s->mu);
    return m;
}

kv_err cmap_vet(const cmap *cur, const cmap *m, const char *addr, bool verified, const char *key,
                char *why, size_t len)
{
    if (key && *key)
        return cmap_check_sig(m, key, why, len);
    if (verified || !cur)
        return KV_OK;
    if (m->epoch > cur->epoch && m->epoch - cur->epoch > CMAP_MAX_EPOCH_JUMP) {
        snprintf(why, len, "epoch %llu is over %u past the current %llu",
                 (unsigned long long)m->epoch, CMAP_MAX_EPOCH_JUMP, (unsigned long long)cur->epoch);
        return KV_PERMISSION_DENIED;
    }
    bool listed = !addr;
    for (size_t i = 0; !listed && i < m->n; i++)
        listed = strcmp(m->nodes[i].addr, addr) == 0;
    if (!listed) {
        snprintf(why, len, "it does not list its sender %s", addr);
        return KV_PERMISSION_DENIED;
    }
    return KV_OK;
}

uint64_t cmap_slot_epoch(cmap_slot *s)
{
    return atomic_load_explicit(&s->epoch, memory_order_acquire);
}

kv_err cmap_slot_install(cmap_slot *s, cmap *m)
{
    cmap *old = NULL;
    kv_err rv = KV_FAILED_PRECONDITION;
    pthread_mutex_lock(&s->mu);
    if (s->map == NULL || m->epoch > s->map->epoch) {
        old = s->map;
        s->map = cmap_ref(m);
        atomic_store_explicit(&s->epoch, m->epoch, memory_order_release);
        rv = KV_OK;
    }
    pthread_mutex_unlock(&s->mu);
    cmap_unref(old); /* outside the lock: may free */
    return rv;
}
