/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for WAL replay (node/lsm/wal.c, lsm_wal_recover). The
 * input is [u8 flags][u8 flushed seqno] and one to three segments, each a
 * u16-length chunk. Flags bit 0 frames each segment's contents as
 * [u16 length][payload] frames with correct checksums (so the record decoder
 * sees arbitrary payloads), a trailing partial frame staying raw (a torn
 * tail); bits 1-2 give the segment count; bit 3 reads through io_uring; bit 4 recovers
 * point-in-time instead of absolute (where corruption before the tail is DATA_LOSS); bit 5 marks
 * the frames bit 0 makes as compact-record frames, bit 6 every other one of them. Properties:
 * every replayed record is valid and newer than the flushed seqno; a successful recovery leaves a
 * log that a second recovery replays identically and to which an append lands after the recovered
 * records, whatever the first recovery had to cut. A fresh directory per input.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common/hash.h"
#include "fuzz_lsm.h"
#include "fuzz_util.h"

typedef struct replay {
    uint64_t flushed, count, hash;
} replay;

static kv_err on_rec(void *arg, const lsm_rec *r)
{
    replay *p = arg;
    FZ_CHECK(lsm_rec_valid(r), "replayed an invalid record");
    FZ_CHECK(r->seqno > p->flushed, "replayed seqno %llu <= flushed %llu",
             (unsigned long long)r->seqno, (unsigned long long)p->flushed);
    uint64_t h = kv_hash64(r->key, r->klen, r->seqno ^ r->type);
    if (r->vlen)
        h ^= kv_hash64(r->value, r->vlen, r->version);
    p->hash = p->hash * 31 + h;
    p->count++;
    return KV_OK;
}

/* Writes segment number num from one chunk of the input. */
static void write_segment(const char *dir, fz_in *in, uint8_t flags, uint64_t num)
{
    bool framed = flags & 1, compact = flags & 32, mix = flags & 64;
    size_t len;
    const uint8_t *p = fz_chunk(in, &len);
    lsm_buf b = {0};
    fz_in seg = {p, len};
    while (framed && seg.n >= 2) {
        size_t want = (size_t)seg.p[0] | (size_t)seg.p[1] << 8;
        if (want > seg.n - 2)
            break; /* the rest stays raw: a torn tail */
        size_t flen;
        const uint8_t *f = fz_chunk(&seg, &flen);
        fz_wal_frame(&b, f, flen, compact);
        compact ^= mix;
    }
    FZ_CHECK(lsm_buf_put(&b, seg.p, seg.n) == KV_OK, "out of memory");
    char name[32];
    snprintf(name, sizeof(name), "%06llu.wal", (unsigned long long)num);
    fz_write_file(dir, name, b.p, b.len);
    lsm_buf_free(&b);
}

typedef struct recovered {
    replay rp;
    lsm_wal_seg *segs;
    size_t nsegs;
    uint64_t max_seq, max_num;
} recovered;

/* Recovers in the mode the input chose: absolute (the default: corruption
 * before the tail is DATA_LOSS) or point-in-time (truncate there). */
static lsm_wal_recovery mode;

static kv_err recover(lsm_vol *v, uint64_t flushed, recovered *out)
{
    *out = (recovered){.rp = {.flushed = flushed}};
    lsm_opts o;
    lsm_opts_default(&o);
    o.wal_recovery = mode;
    return lsm_wal_recover(v, &o, flushed, on_rec, &out->rp, &out->segs, &out->nsegs, &out->max_seq,
                           &out->max_num);
}

/* Appends one record after recovery a, recovers again: the same records,
 * then the new one. */
static void check_append(lsm_vol *v, uint64_t flushed, recovered *a)
{
    lsm_opts o = {.fast_dir = v->dir, .sync = LSM_SYNC_NONE};
    lsm_wal *w = NULL;
    kv_err rv = lsm_wal_open(&w, v, &o, a->max_num + 1, a->segs, a->nsegs);
    FZ_CHECK(rv == KV_OK, "lsm_wal_open after recovery: %s", kv_err_name(rv));
    uint64_t seq = (a->max_seq > flushed ? a->max_seq : flushed) + 1;
    lsm_rec r = {.key = "k", .klen = 1, .value = "v", .vlen = 1, .seqno = seq, .type = LSM_PUT};
    FZ_CHECK(lsm_wal_write(w, &r, 1) == KV_OK, "append after recovery failed");
    lsm_wal_close(w);
    recovered b;
    rv = recover(v, flushed, &b);
    FZ_CHECK(rv == KV_OK, "second recovery failed: %s", kv_err_name(rv));
    replay want = a->rp;
    on_rec(&want, &r);
    FZ_CHECK(b.rp.count == want.count && b.rp.hash == want.hash,
             "second recovery replayed %llu records, want %llu (the same plus the append)",
             (unsigned long long)b.rp.count, (unsigned long long)want.count);
    free(b.segs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    uint64_t flushed = fz_u8(&in);
    char dir[512];
    fz_fresh_dir(dir, sizeof(dir), "wal");
    mode = flags & 16 ? LSM_WAL_POINT_IN_TIME : LSM_WAL_ABSOLUTE;
    int nseg = 1 + (flags >> 1) % 3;
    for (int i = 0; i < nseg; i++)
        write_segment(dir, &in, flags, (uint64_t)i + 1);
    lsm_vol v;
    FZ_CHECK(lsm_vol_init(&v, dir, LSM_TIER_FD, flags & 8) == KV_OK, "lsm_vol_init");
    recovered a;
    kv_err rv = recover(&v, flushed, &a);
    if (rv == KV_OK && a.max_seq == UINT64_MAX)
        free(a.segs); /* no newer seqno to append (a checksummed record claims the last) */
    else if (rv == KV_OK)
        check_append(&v, flushed, &a);
    lsm_vol_fini(&v);
    return 0;
}
