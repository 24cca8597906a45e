/* SPDX-License-Identifier: MIT */
/*
 * index_bench adaptors for the node's HotRing index (node/index/hotring.h):
 * "hotring-s" (statistical sampling) and "hotring-r" (random movement), with
 * the run's bucket count and rehash off unless --rehash. Reads go through
 * hr_get with a callback that copies the value and the metadata out; writes are hr_upsert with
 * no condition. Read statistics come from hr_get_stats.
 */
#include <string.h>

#include "bench/index_impl.h"
#include "node/index/hotring.h"

typedef struct hr_copy {
    void *val;
    size_t cap;
    ib_meta *meta;
} hr_copy;

static void hr_copy_value(void *arg, const hr_view *v)
{
    hr_copy *c = arg;
    memcpy(c->val, v->val, v->vlen < c->cap ? v->vlen : c->cap);
    c->meta->version = v->meta.version;
    c->meta->seqno = v->meta.seqno;
    c->meta->expire_at = v->meta.expire_at;
    c->meta->flags = v->meta.flags;
}

static kv_err hr_open_mode(void **h, const ib_params *p, hr_mode mode)
{
    hr_opts o = {
        .buckets = p->buckets,
        .mode = mode,
        .r = p->hr_r,
        .rehash = p->rehash,
        .rehash_cost = p->rehash_cost,
    };
    return hr_open((hr_index **)h, &o);
}

static kv_err hr_open_s(void **h, const ib_params *p)
{
    return hr_open_mode(h, p, HR_MODE_SAMPLE);
}

static kv_err hr_open_r(void **h, const ib_params *p)
{
    return hr_open_mode(h, p, HR_MODE_RANDOM);
}

static void hr_close_impl(void *h)
{
    hr_close(h);
}

static bool hr_get_impl(void *h, const void *key, size_t klen, void *val, size_t cap, ib_probe *pr)
{
    hr_copy c = {val, cap, &pr->meta}; /* visits and head hits: hr_get_stats */
    return hr_get(h, key, klen, hr_copy_value, &c) == KV_OK;
}

typedef struct hr_copy_many {
    unsigned char *vals;
    size_t cap;
    ib_meta *metas;
} hr_copy_many;

static void hr_copy_at(void *arg, size_t i, const hr_view *v)
{
    hr_copy_many *c = arg;
    hr_copy one = {c->vals + i * c->cap, c->cap, &c->metas[i]};
    hr_copy_value(&one, v);
}

/* hr_get_batch: overlaps the bucket and head-item misses of the batch. */
static size_t hr_get_batch_impl(void *h, const unsigned char *keys, size_t klen, size_t n,
                                unsigned char *vals, size_t cap, ib_meta *metas)
{
    hr_key ks[IB_MAX_BATCH];
    for (size_t i = 0; i < n; i++)
        ks[i] = (hr_key){keys + i * klen, klen};
    hr_copy_many c = {vals, cap, metas};
    size_t hits = 0;
    return hr_get_batch(h, ks, n, hr_copy_at, &c, &hits) == KV_OK ? hits : 0;
}

static kv_err hr_put_impl(void *h, const void *key, size_t klen, const void *val, size_t vlen)
{
    static const hr_meta meta = {0};
    return hr_upsert(h, key, klen, val, vlen, &meta, NULL, NULL);
}

static void hr_rstats(void *h, ib_rstats *out)
{
    hr_stats st;
    hr_get_stats(h, &st);
    out->reads = st.reads;
    out->visited = st.read_visited;
    out->head_hits = st.head_hits;
}

static uint64_t hr_buckets_now(void *h)
{
    hr_stats st;
    hr_get_stats(h, &st);
    return st.buckets;
}

/* One head word per bucket (HotRing packs the pointer, the 15-bit sampling
 * total and the Active bit into 64 bits). */
static uint64_t hr_bucket_bytes(void *h)
{
    return hr_buckets_now(h) * sizeof(uint64_t);
}

/* HotRing's own count of item bytes, averaged over its items. */
static uint64_t hr_item_bytes_avg(void *h, size_t klen, size_t vlen)
{
    hr_stats st;
    (void)klen;
    (void)vlen;
    hr_get_stats(h, &st);
    return st.items ? (st.bytes + st.items / 2) / st.items : 0;
}

const ib_impl ib_hotring_s_impl = {
    .name = "hotring-s",
    .open = hr_open_s,
    .close = hr_close_impl,
    .thread_enter = hr_thread_register,
    .thread_exit = hr_thread_unregister,
    .get = hr_get_impl,
    .get_batch = hr_get_batch_impl,
    .put = hr_put_impl,
    .rstats = hr_rstats,
    .bucket_bytes = hr_bucket_bytes,
    .buckets = hr_buckets_now,
    .item_bytes = hr_item_bytes_avg,
};

const ib_impl ib_hotring_r_impl = {
    .name = "hotring-r",
    .open = hr_open_r,
    .close = hr_close_impl,
    .thread_enter = hr_thread_register,
    .thread_exit = hr_thread_unregister,
    .get = hr_get_impl,
    .get_batch = hr_get_batch_impl,
    .put = hr_put_impl,
    .rstats = hr_rstats,
    .bucket_bytes = hr_bucket_bytes,
    .buckets = hr_buckets_now,
    .item_bytes = hr_item_bytes_avg,
};
