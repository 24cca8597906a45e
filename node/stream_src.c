/* SPDX-License-Identifier: MIT */
/*
 * The source side of streaming and repair (DESIGN.md §4), all over the
 * engine iterator (memory tier merged over the LSM, newest version per key,
 * tombstones included):
 *   admin.StreamRead  the records of some ring ranges, in the engine's order
 *                     (engine_key_cmp: key order, or kallax's) after a
 *                     resume key, in chunks of at most 4 MiB (or their
 *                     digests: key, version, flags; or given keys);
 *   admin.Digest      Merkle leaves of the records of ranges, for repair;
 *   admin.Apply       versioned records applied by last-writer-wins (hint
 *                     replay, read repair).
 * A key's position is ring_key_hash(key); a range (lo, hi] may wrap.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/log.h"
#include "node/node.h"
#include "shard/ring.h"

#define CHUNK_MAX (4u << 20)
#define REC_OVERHEAD 24u /* protobuf framing of a Record, roughly */
#define MAX_RANGES 65536u
#define MAX_KEYS 65536u

/* ---- range sets -------------------------------------------------------- */

/* Ranges as sorted, non-wrapping pieces [lo, hi] (inclusive) with the index
 * of the range each came from, for a binary search per key. */
typedef struct piece {
    uint64_t lo, hi;
    uint32_t range;
} piece;

typedef struct rangeset {
    piece *p;
    size_t n;
} rangeset;

static int piece_cmp(const void *a, const void *b)
{
    const piece *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

static kv_err rangeset_build(rangeset *s, Kv__Range *const *r, size_t n, char *err, size_t errlen)
{
    if (n == 0 || n > MAX_RANGES) {
        snprintf(err, errlen, "%zu ranges (want 1..%u)", n, MAX_RANGES);
        return KV_INVALID_ARGUMENT;
    }
    s->p = malloc(2 * n * sizeof(*s->p));
    s->n = 0;
    if (!s->p)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        uint64_t lo = r[i] ? r[i]->lo : 0, hi = r[i] ? r[i]->hi : 0;
        if (lo == hi) { /* the whole ring */
            s->p[s->n++] = (piece){0, UINT64_MAX, (uint32_t)i};
        } else if (lo < hi) {
            s->p[s->n++] = (piece){lo + 1, hi, (uint32_t)i};
        } else { /* wraps: (lo, max] and [0, hi] */
            if (lo != UINT64_MAX)
                s->p[s->n++] = (piece){lo + 1, UINT64_MAX, (uint32_t)i};
            s->p[s->n++] = (piece){0, hi, (uint32_t)i};
        }
    }
    qsort(s->p, s->n, sizeof(*s->p), piece_cmp);
    for (size_t i = 1; i < s->n; i++) {
        if (s->p[i].lo <= s->p[i - 1].hi) {
            snprintf(err, errlen, "ranges %u and %u overlap", s->p[i - 1].range, s->p[i].range);
            free(s->p);
            s->p = NULL;
            return KV_INVALID_ARGUMENT;
        }
    }
    return KV_OK;
}

/* Index of the range holding h, or -1 (pieces are disjoint: only the last
 * piece starting at or before h can hold it). */
static long rangeset_find(const rangeset *s, uint64_t h)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->p[mid].lo <= h)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo > 0 && s->p[lo - 1].hi >= h ? (long)s->p[lo - 1].range : -1;
}

static bool in_ranges(void *arg, const void *key, size_t klen)
{
    return rangeset_find(arg, ring_key_hash(key, klen)) >= 0;
}

/* ---- admin.Apply ------------------------------------------------------- */

kv_err node_apply_record(node *n, const Kv__Record *r, bool *applied, char *err, size_t errlen)
{
    kv_err rv = kv_check_key(&n->cfg.limits, r->key.len, err, errlen);
    if (rv == KV_OK && !r->tombstone)
        rv = kv_check_value(&n->cfg.limits, r->value.len, err, errlen);
    if (rv == KV_OK && r->version == 0) {
        snprintf(err, errlen, "a record needs a version");
        rv = KV_INVALID_ARGUMENT;
    }
    if (rv == KV_OK)
        rv = node_check_version(r->version, err, errlen);
    if (rv != KV_OK)
        return rv;
    engine_write w = {.key = r->key.data,
                      .klen = r->key.len,
                      .val = r->tombstone ? NULL : r->value.data,
                      .vlen = r->tombstone ? 0 : r->value.len,
                      .version = r->version,
                      .expire_at = r->tombstone ? 0 : r->expire_at_ms,
                      .is_delete = r->tombstone};
    engine_result res = {0};
    rv = engine_write_one(n->eng, &w, &res, err, errlen);
    if (rv == KV_OK && applied)
        *applied = res.applied;
    return rv;
}

kv_err node_h_apply(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__ApplyRequest *req = kv__apply_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__ApplyRequest body");
    kv_err rv = kv_check_batch(&n->cfg.limits, req->n_records, len, c->message, sizeof(c->message));
    Kv__ApplyReply rep = KV__APPLY_REPLY__INIT;
    for (size_t i = 0; rv == KV_OK && i < req->n_records; i++) {
        bool applied = false;
        char why[200];
        rv = node_apply_record(n, req->records[i], &applied, why, sizeof(why));
        if (rv != KV_OK)
            rpc_fail(c, rv, "record %zu: %s", i, why);
        rep.applied += applied;
    }
    kv__apply_request__free_unpacked(req, NULL);
    return rv == KV_OK ? rpc_reply_msg(c, &rep.base) : rv;
}

/* ---- admin.StreamRead -------------------------------------------------- */

typedef struct chunk {
    Kv__Record *recs;
    Kv__Record **ptrs;
    uint8_t **owned; /* copies of keys and values */
    size_t n, cap, bytes;
} chunk;

static void chunk_free(chunk *ck)
{
    for (size_t i = 0; i < ck->n; i++)
        free(ck->owned[i]);
    free(ck->recs);
    free(ck->ptrs);
    free(ck->owned);
}

/* Appends a copy of rec (its key and, unless digest, its value). */
static kv_err chunk_add(chunk *ck, const engine_rec *rec, bool digest)
{
    if (ck->n == ck->cap) {
        size_t nc = ck->cap ? ck->cap * 2 : 256;
        Kv__Record *nr = realloc(ck->recs, nc * sizeof(*nr));
        if (nr)
            ck->recs = nr;
        uint8_t **no = realloc(ck->owned, nc * sizeof(*no));
        if (no)
            ck->owned = no;
        if (!nr || !no)
            return KV_RESOURCE_EXHAUSTED;
        ck->cap = nc;
    }
    size_t vlen = digest || rec->tombstone ? 0 : rec->vlen;
    uint8_t *buf = malloc(rec->klen + vlen + 1);
    if (!buf)
        return KV_RESOURCE_EXHAUSTED;
    memcpy(buf, rec->key, rec->klen);
    if (vlen)
        memcpy(buf + rec->klen, rec->val, vlen);
    Kv__Record *r = &ck->recs[ck->n];
    kv__record__init(r);
    r->key = (ProtobufCBinaryData){rec->klen, buf};
    r->value = (ProtobufCBinaryData){vlen, vlen ? buf + rec->klen : NULL};
    r->version = rec->version;
    r->expire_at_ms = rec->expire_at;
    r->tombstone = rec->tombstone;
    r->value_len = rec->tombstone ? 0 : (uint32_t)rec->vlen;
    ck->owned[ck->n++] = buf;
    ck->bytes += rec->klen + vlen + REC_OVERHEAD;
    return KV_OK;
}

/* ---- cursors: an iterator kept between the chunks of one stream ---------
 *
 * Opening an engine iterator walks the whole memory tier (its unflushed
 * records are snapshotted and sorted), so a stream that opened one per 4 MiB
 * chunk paid that walk again for every chunk. A chunk that ends before the
 * ranges do leaves its iterator here, keyed by the node, the ranges and the
 * key it ended at; the next StreamRead with the same ranges after that key
 * continues it. The iterator's snapshot is the one of the stream's first
 * chunk (writes made since reach a membership change's new replicas
 * directly; a repair is a point-in-time comparison anyway), and it pins an
 * LSM version, so idle cursors close after CURSOR_IDLE_NS. */
#define CURSORS 8
#define CURSOR_IDLE_NS (30ull * 1000000000ull)

typedef struct cursor {
    node *n; /* NULL = free slot */
    rangeset *rs;
    Kv__Range *ranges; /* copies, to match the next request */
    size_t nranges;
    uint8_t *next; /* the last key returned */
    size_t next_len;
    bool digest;
    engine_iter *it;
    uint64_t used_ns;
} cursor;

static pthread_mutex_t cursors_mu = PTHREAD_MUTEX_INITIALIZER; /* protects cursors */
static cursor cursors[CURSORS];
static _Atomic uint64_t cursor_hits, cursor_opens;

void node_stream_src_stats(kv_stats *l)
{
    kv_stat_counter(l, "stream.chunks_continued", "hotkv_node_stream_chunks_continued_total", NULL,
                    "Stream chunks served from an iterator kept since the previous chunk.",
                    atomic_load(&cursor_hits));
    kv_stat_counter(l, "stream.iterators_opened", "hotkv_node_stream_iterators_opened_total", NULL,
                    "Engine iterators opened for streams.", atomic_load(&cursor_opens));
}

static void cursor_free(cursor *c)
{
    engine_iter_close(c->it);
    if (c->rs)
        free(c->rs->p);
    free(c->rs);
    free(c->ranges);
    free(c->next);
    memset(c, 0, sizeof(*c));
}

static bool same_ranges(const cursor *c, const Kv__StreamReadRequest *req)
{
    if (c->nranges != req->n_ranges || c->digest != req->digest)
        return false;
    for (size_t i = 0; i < c->nranges; i++)
        if (!req->ranges[i] || c->ranges[i].lo != req->ranges[i]->lo ||
            c->ranges[i].hi != req->ranges[i]->hi)
            return false;
    return true;
}

/* Takes the cursor that continues req, or NULL (the caller owns it). */
static bool cursor_take(node *n, const Kv__StreamReadRequest *req, cursor *out)
{
    bool found = false;
    pthread_mutex_lock(&cursors_mu);
    for (size_t i = 0; i < CURSORS && !found; i++) {
        cursor *c = &cursors[i];
        if (c->n == n && same_ranges(c, req) && c->next_len == req->after_key.len && c->next_len &&
            memcmp(c->next, req->after_key.data, c->next_len) == 0) {
            *out = *c;
            memset(c, 0, sizeof(*c));
            found = true;
        }
    }
    pthread_mutex_unlock(&cursors_mu);
    return found;
}

/* Leaves c for the next chunk (evicting idle or the least recently used
 * cursors); c is consumed either way. */
static void cursor_put(cursor *c)
{
    uint64_t now = kv_now_ns();
    cursor evicted[CURSORS];
    size_t ne = 0, lru = 0;
    c->used_ns = now;
    pthread_mutex_lock(&cursors_mu);
    for (size_t i = 0; i < CURSORS; i++) {
        if (cursors[i].n && now - cursors[i].used_ns > CURSOR_IDLE_NS) {
            evicted[ne++] = cursors[i];
            memset(&cursors[i], 0, sizeof(cursors[i]));
        }
        if (!cursors[i].n || (cursors[lru].n && cursors[i].used_ns < cursors[lru].used_ns))
            lru = i;
    }
    if (cursors[lru].n)
        evicted[ne++] = cursors[lru];
    cursors[lru] = *c;
    pthread_mutex_unlock(&cursors_mu);
    for (size_t i = 0; i < ne; i++) /* closes outside the lock */
        cursor_free(&evicted[i]);
}

void node_stream_src_close(node *n)
{
    cursor mine[CURSORS];
    size_t k = 0;
    pthread_mutex_lock(&cursors_mu);
    for (size_t i = 0; i < CURSORS; i++)
        if (cursors[i].n == n) {
            mine[k++] = cursors[i];
            memset(&cursors[i], 0, sizeof(cursors[i]));
        }
    pthread_mutex_unlock(&cursors_mu);
    for (size_t i = 0; i < k; i++)
        cursor_free(&mine[i]);
}

/* A new cursor for req: its ranges and an iterator after req->after_key. */
static kv_err cursor_open(node *n, const Kv__StreamReadRequest *req, cursor *c, char *err,
                          size_t errlen)
{
    memset(c, 0, sizeof(*c));
    c->n = n;
    c->digest = req->digest;
    c->rs = calloc(1, sizeof(*c->rs));
    c->ranges = calloc(req->n_ranges ? req->n_ranges : 1, sizeof(*c->ranges));
    kv_err rv = c->rs && c->ranges ? rangeset_build(c->rs, req->ranges, req->n_ranges, err, errlen)
                                   : KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; rv == KV_OK && i < req->n_ranges; i++)
        c->ranges[c->nranges++] = (Kv__Range){.lo = req->ranges[i]->lo, .hi = req->ranges[i]->hi};
    engine_iter_opts o = {.after = req->after_key.len ? req->after_key.data : NULL,
                          .after_len = req->after_key.len,
                          .filter = in_ranges,
                          .filter_arg = c->rs};
    if (rv == KV_OK)
        rv = engine_iter_open(n->eng, &o, &c->it);
    if (rv != KV_OK)
        cursor_free(c);
    return rv;
}

/* Reads the records after req->after_key in the ranges until max bytes. */
static kv_err read_ranges(node *n, const Kv__StreamReadRequest *req, chunk *ck, size_t max,
                          Kv__StreamReadReply *rep, char *err, size_t errlen)
{
    cursor c;
    bool cont = cursor_take(n, req, &c);
    kv_err rv = cont ? KV_OK : cursor_open(n, req, &c, err, errlen);
    if (rv != KV_OK)
        return rv;
    atomic_fetch_add(cont ? &cursor_hits : &cursor_opens, 1);
    uint64_t scanned0 = engine_iter_scanned(c.it);
    engine_rec rec;
    while (rv == KV_OK && ck->bytes < max && (rv = engine_iter_next(c.it, &rec)) == KV_OK)
        rv = chunk_add(ck, &rec, req->digest);
    rep->done = rv == KV_NOT_FOUND;
    rep->scanned = engine_iter_scanned(c.it) - scanned0;
    if (rv == KV_OK && ck->n) { /* more to come: keep the iterator for the next chunk */
        const Kv__Record *last = &ck->recs[ck->n - 1];
        uint8_t *next = malloc(last->key.len);
        if (next) {
            memcpy(next, last->key.data, last->key.len);
            c.next = next;
            c.next_len = last->key.len;
            cursor_put(&c);
            return KV_OK;
        }
    }
    if (rv == KV_NOT_FOUND)
        rv = KV_OK;
    else if (rv != KV_OK)
        snprintf(err, errlen, "reading the records failed: %s", kv_strerror(rv));
    cursor_free(&c);
    return rv;
}

/* Reads exactly the given keys (repair fetching the records it lacks). */
static kv_err read_keys(node *n, const Kv__StreamReadRequest *req, chunk *ck, char *err,
                        size_t errlen)
{
    if (req->n_keys > MAX_KEYS) {
        snprintf(err, errlen, "%zu keys (at most %u per read)", req->n_keys, MAX_KEYS);
        return KV_INVALID_ARGUMENT;
    }
    kv_err rv = KV_OK;
    for (size_t i = 0; rv == KV_OK && i < req->n_keys; i++) {
        const ProtobufCBinaryData *k = &req->keys[i];
        if ((rv = kv_check_key(&n->cfg.limits, k->len, err, errlen)) != KV_OK)
            break;
        engine_result r = {0};
        rv = engine_get(n->eng, k->data, k->len, &r);
        if (rv == KV_OK && r.version) {
            engine_rec rec = {.key = k->data,
                              .klen = k->len,
                              .val = r.val,
                              .vlen = r.vlen,
                              .version = r.version,
                              .expire_at = r.expire_at,
                              .tombstone = !r.found};
            rv = chunk_add(ck, &rec, req->digest);
        }
        free(r.val);
    }
    return rv;
}

kv_err node_h_stream_read(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__StreamReadRequest *req = kv__stream_read_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__StreamReadRequest body");
    size_t max = req->max_bytes && req->max_bytes < CHUNK_MAX ? req->max_bytes : CHUNK_MAX;
    chunk ck = {0};
    Kv__StreamReadReply rep = KV__STREAM_READ_REPLY__INIT;
    kv_err rv;
    if (req->n_keys) {
        rv = read_keys(n, req, &ck, c->message, sizeof(c->message));
        rep.done = true;
    } else {
        rv = read_ranges(n, req, &ck, max, &rep, c->message, sizeof(c->message));
    }
    if (rv == KV_OK && !req->after_key.len && !req->n_keys) {
        double share = 0;
        for (size_t i = 0; i < req->n_ranges; i++) {
            uint64_t span = req->ranges[i]->hi - req->ranges[i]->lo;
            share += span ? (double)span / 18446744073709551616.0 : 1.0;
        }
        uint64_t keys = 0, bytes = 0;
        engine_estimate(n->eng, &keys, &bytes);
        rep.est_keys = (uint64_t)((double)keys * (share < 1 ? share : 1));
        rep.est_bytes = (uint64_t)((double)bytes * (share < 1 ? share : 1));
    }
    if (rv == KV_OK) {
        ck.ptrs = malloc((ck.n ? ck.n : 1) * sizeof(*ck.ptrs));
        if (!ck.ptrs)
            rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
        for (size_t i = 0; ck.ptrs && i < ck.n; i++)
            ck.ptrs[i] = &ck.recs[i];
        rep.n_records = ck.n;
        rep.records = ck.ptrs;
        if (ck.n)
            rep.next_key = ck.recs[ck.n - 1].key;
        else
            rep.next_key = req->after_key;
    }
    if (rv == KV_OK)
        rv = rpc_reply_msg(c, &rep.base);
    chunk_free(&ck);
    kv__stream_read_request__free_unpacked(req, NULL);
    return rv;
}

/* ---- admin.Digest ------------------------------------------------------ */

typedef struct digest {
    rangeset rs;
    Kv__RangeDigest *rd;
    Kv__Range *const *ranges;
    uint32_t leaves;
} digest;

/* Leaf of h within range r: its offset in the arc scaled to leaves parts. */
static uint32_t leaf_of(const Kv__Range *r, uint64_t h, uint32_t leaves)
{
    uint64_t off = h - r->lo - 1, span = r->hi - r->lo;
    unsigned __int128 s = span ? span : ((unsigned __int128)1 << 64);
    uint64_t leaf = (uint64_t)(((unsigned __int128)off * leaves) / s);
    return leaf < leaves ? (uint32_t)leaf : leaves - 1;
}

static void digest_add(digest *d, const engine_rec *rec, uint64_t now_ms)
{
    long ri = rangeset_find(&d->rs, ring_key_hash(rec->key, rec->klen));
    if (ri < 0)
        return;
    bool dead = rec->tombstone || (rec->expire_at && rec->expire_at <= now_ms);
    Kv__RangeDigest *rd = &d->rd[ri];
    uint32_t leaf = leaf_of(d->ranges[ri], ring_key_hash(rec->key, rec->klen), d->leaves);
    rd->leaf_hash[leaf] += kv_hash64(rec->key, rec->klen, rec->version * 2 + (dead ? 1 : 0));
    rd->leaf_count[leaf]++;
    if (dead)
        rd->tombstones++;
    else
        rd->live++;
}

static kv_err digest_alloc(digest *d, size_t n)
{
    d->rd = calloc(n, sizeof(*d->rd));
    if (!d->rd)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < n; i++) {
        kv__range_digest__init(&d->rd[i]);
        d->rd[i].leaf_hash = calloc(d->leaves, sizeof(uint64_t));
        d->rd[i].leaf_count = calloc(d->leaves, sizeof(uint32_t));
        if (!d->rd[i].leaf_hash || !d->rd[i].leaf_count)
            return KV_RESOURCE_EXHAUSTED;
        d->rd[i].n_leaf_hash = d->rd[i].n_leaf_count = d->leaves;
    }
    return KV_OK;
}

/* Hashes the records of the ranges, paced to mbps MiB/s of keys and values
 * read (a sleep after each MiB that came too fast). */
static kv_err digest_scan(node *n, digest *d, uint32_t mbps, uint64_t *scanned)
{
    engine_iter_opts o = {.filter = in_ranges, .filter_arg = &d->rs};
    engine_iter *it = NULL;
    kv_err rv = engine_iter_open(n->eng, &o, &it);
    engine_rec rec;
    uint64_t now = kv_wall_ms(), t0 = kv_now_ns(), bytes = 0, paced = 0;
    uint64_t rate = (uint64_t)(mbps ? mbps : (uint32_t)n->cfg.stream_mbps) << 20;
    while (rv == KV_OK && (rv = engine_iter_next(it, &rec)) == KV_OK) {
        digest_add(d, &rec, now);
        bytes += rec.klen + rec.vlen + REC_OVERHEAD;
        if (bytes - paced >= (1u << 20)) {
            paced = bytes;
            uint64_t want = bytes * 1000000000ull / rate, spent = kv_now_ns() - t0;
            if (want > spent)
                kv_sleep_ns(want - spent);
        }
    }
    *scanned = it ? engine_iter_scanned(it) : 0;
    engine_iter_close(it);
    return rv == KV_NOT_FOUND ? KV_OK : rv;
}

kv_err node_h_digest(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    Kv__DigestRequest *req = kv__digest_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__DigestRequest body");
    digest d = {.ranges = req->ranges, .leaves = req->leaves ? req->leaves : 1};
    kv_err rv = KV_OK;
    if (d.leaves > 4096 || (d.leaves & (d.leaves - 1)))
        rv = rpc_fail(c, KV_INVALID_ARGUMENT, "leaves %u: want a power of two 1..4096", d.leaves);
    if (rv == KV_OK && (uint64_t)d.leaves * req->n_ranges > (1u << 22))
        rv = rpc_fail(c, KV_INVALID_ARGUMENT, "%zu ranges x %u leaves is over 4M leaves",
                      req->n_ranges, d.leaves);
    if (rv == KV_OK)
        rv = rangeset_build(&d.rs, req->ranges, req->n_ranges, c->message, sizeof(c->message));
    if (rv == KV_OK && (rv = digest_alloc(&d, req->n_ranges)) != KV_OK)
        rpc_fail(c, rv, "out of memory for the digest");
    Kv__DigestReply rep = KV__DIGEST_REPLY__INIT;
    if (rv == KV_OK && (rv = digest_scan(n, &d, req->mbps, &rep.scanned)) != KV_OK)
        rpc_fail(c, rv, "reading the records failed: %s", kv_strerror(rv));
    Kv__RangeDigest **ptrs = rv == KV_OK ? malloc(req->n_ranges * sizeof(*ptrs)) : NULL;
    if (rv == KV_OK && !ptrs)
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    if (rv == KV_OK) {
        for (size_t i = 0; i < req->n_ranges; i++)
            ptrs[i] = &d.rd[i];
        rep.n_ranges = req->n_ranges;
        rep.ranges = ptrs;
        rv = rpc_reply_msg(c, &rep.base);
    }
    for (size_t i = 0; d.rd && i < req->n_ranges; i++) {
        free(d.rd[i].leaf_hash);
        free(d.rd[i].leaf_count);
    }
    free(d.rd);
    free(ptrs);
    free(d.rs.p);
    kv__digest_request__free_unpacked(req, NULL);
    return rv;
}
