/* SPDX-License-Identifier: MIT */
/*
 * Internal interfaces of the LSM module, shared by its source files and
 * tests only: byte buffers and the record codec (codec.c), CRC32C, the volume
 * layer over io_uring / pread (volume.c), SST files with bloom filters
 * (sst.c), the WAL (wal.c), the MANIFEST and immutable versions
 * (manifest.c), compaction (compact.c) and the db object (db.c).
 */
#ifndef KV_NODE_LSM_LSM_INT_H
#define KV_NODE_LSM_LSM_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/crc32c.h"
#include "node/lsm/lsm.h"

#define LSM_LOG "lsm"

/* ---- byte buffers and little-endian helpers (codec.c) ---- */

typedef struct lsm_buf {
    uint8_t *p;
    size_t len, cap;
} lsm_buf;

kv_err lsm_buf_reserve(lsm_buf *b, size_t extra);
kv_err lsm_buf_put(lsm_buf *b, const void *p, size_t n);
kv_err lsm_buf_put32(lsm_buf *b, uint32_t v);
kv_err lsm_buf_put64(lsm_buf *b, uint64_t v);
void lsm_buf_free(lsm_buf *b);

static inline uint32_t lsm_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t lsm_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
static inline void lsm_set32(uint8_t *p, uint32_t v)
{
    memcpy(p, &v, 4);
}
static inline void lsm_set64(uint8_t *p, uint64_t v)
{
    memcpy(p, &v, 8);
}

/* Record codec: [u32 klen][u32 vlen][u64 version][u64 seqno][u64 expire_at]
 * [u8 type][u8 flags][key][value]. */
#define LSM_REC_HDR 34u
#define LSM_MAX_KEY (64u << 10)
#define LSM_MAX_VALUE (256u << 20)

size_t lsm_rec_size(const lsm_rec *r);
void lsm_rec_encode(uint8_t *dst, const lsm_rec *r);
/* Decodes one record at p (avail bytes); r's key/value point into p. Returns
 * KV_OK and *used, or DATA_LOSS when malformed. */
kv_err lsm_rec_decode(const uint8_t *p, size_t avail, lsm_rec *r, size_t *used);

/* Compact record codec (SST format version 3's data blocks):
 *   [u8 head][varint klen][varint vlen, PUT only][varint seqno]
 *   [u64 version, when head & VER][varint expire_at, when head & EXP][key][value]
 * head = type (bits 0-1) | LSM_RECC_VER | LSM_RECC_EXP | flags << 4; varints
 * are LEB128 (7 bits a byte, low first). A 1 KiB put with an 8-byte key
 * and a version costs 15-17 header bytes instead of LSM_REC_HDR's 34; a delete
 * without version or TTL, 3 or so. lsm_recc_decode rejects what
 * lsm_rec_decode rejects, plus overlong varints. */
#define LSM_RECC_VER 0x04u
#define LSM_RECC_EXP 0x08u
#define LSM_RECC_FLAGS 0xFu /* the flag bits a record may carry (head >> 4) */
#define LSM_RECC_MAX_HDR (1u + 3u + 5u + 10u + 8u + 10u)
_Static_assert((LSM_F_PROMOTED | LSM_F_TWIN) <= LSM_RECC_FLAGS, "record flags fit the head");
size_t lsm_recc_size(const lsm_rec *r);
/* Writes r at dst; returns the bytes written (lsm_recc_size(r)). */
size_t lsm_recc_encode(uint8_t *dst, const lsm_rec *r);
kv_err lsm_recc_decode(const uint8_t *p, size_t avail, lsm_rec *r, size_t *used);
/* A data block entry of SST format 4: [varint shared][compact record whose
 * key is the suffix], where shared is how many leading bytes the key has in
 * common with the block's previous key (0 at a restart point). The suffix is
 * never empty: keys in a block ascend strictly. lsm_blkrec_decode points
 * r->key/klen at the suffix (the caller rebuilds the key), rejects what
 * lsm_recc_decode rejects and a key longer than LSM_MAX_KEY in all. */
size_t lsm_blkrec_size(const lsm_rec *r, size_t shared);
size_t lsm_blkrec_encode(uint8_t *dst, const lsm_rec *r, size_t shared);
kv_err lsm_blkrec_decode(const uint8_t *p, size_t avail, size_t *shared, lsm_rec *r, size_t *used);
/* lsm_recc_decode when compact, else lsm_rec_decode (SST v1/v2, old WAL
 * frames). */
kv_err lsm_rec_decode_as(bool compact, const uint8_t *p, size_t avail, lsm_rec *r, size_t *used);
/* A key of 1..LSM_MAX_KEY bytes, a known type, a value within LSM_MAX_VALUE
 * and flags within the 4 bits the compact codec stores. */
bool lsm_rec_valid(const lsm_rec *r);
/* Deep copy of r (key and value malloc'ed) into *out. */
kv_err lsm_rec_copy(lsm_rec *out, const lsm_rec *r);
/* Maps an errno to kv_err: ENOSPC/EDQUOT -> RESOURCE_EXHAUSTED, else INTERNAL. */
kv_err lsm_errno(int e);

/* ---- block compression (compress.c) ---- */

/* Codec ids as stored in an SST v2 block trailer. */
#define LSM_CODEC_NONE 0u
#define LSM_CODEC_LZ4 1u
#define LSM_CODEC_ZSTD 2u
/* Largest decompressed block: the block size bound plus one record. */
#define LSM_MAX_BLOCK_RAW ((uint64_t)LSM_MAX_VALUE + LSM_MAX_KEY + (32u << 20))

/* Compresses src (n bytes) into dst as [u32 n][codec output]. *stored is
 * true when dst holds it, false when the block is to be stored raw (codec
 * NONE, tiny, or it would not save 1/8). *zctx: the caller's zstd context,
 * created on first use, freed with lsm_zctx_free. RESOURCE_EXHAUSTED on OOM. */
kv_err lsm_block_compress(uint8_t codec, const uint8_t *src, size_t n, lsm_buf *dst, void **zctx,
                          bool *stored);
void lsm_zctx_free(void *zctx);
/* Decompresses a payload written by lsm_block_compress into dst (its len =
 * the raw size). DATA_LOSS when malformed, RESOURCE_EXHAUSTED on OOM. */
kv_err lsm_block_decompress(uint8_t codec, const uint8_t *src, size_t n, lsm_buf *dst);

/* ---- volumes (volume.c) ---- */

typedef struct lsm_vol {
    char *dir;
    int dirfd;
    lsm_tier tier;
    bool uring; /* use io_uring for this volume */
    _Atomic uint64_t reads, read_bytes, writes, write_bytes, fsyncs;
    _Atomic uint64_t rlat_ns, wlat_ns; /* EWMA, alpha 1/8 */
} lsm_vol;

/* One read request of a batch. res: bytes read or -errno. */
typedef struct lsm_io {
    lsm_vol *vol;
    int fd;
    void *buf;
    size_t len;
    uint64_t off;
    long res;
} lsm_io;

kv_err lsm_vol_init(lsm_vol *v, const char *dir, lsm_tier tier, bool use_uring);
void lsm_vol_fini(lsm_vol *v);
/* openat(v->dirfd, name, flags, 0644); returns fd or -errno. */
int lsm_vol_open(lsm_vol *v, const char *name, int flags);
int lsm_vol_unlink(lsm_vol *v, const char *name);
kv_err lsm_vol_syncdir(lsm_vol *v);
/* Submits the n reads together (io_uring) and waits for all; each io's res
 * is set. Returns KV_OK (check each res). */
kv_err lsm_vol_read(lsm_io *ios, size_t n);
/* Reads exactly len bytes; DATA_LOSS on a short read, INTERNAL on error. */
kv_err lsm_vol_pread(lsm_vol *v, int fd, void *buf, size_t len, uint64_t off);
/* Writes len bytes at off; with sync, a linked write + fdatasync. */
kv_err lsm_vol_write(lsm_vol *v, int fd, const void *buf, size_t len, uint64_t off, bool sync);
kv_err lsm_vol_fsync(lsm_vol *v, int fd);
/* Bytes free for this process on the volume's filesystem (statvfs's
 * f_bavail; the emulated device of lsm_fault_space in tests); UINT64_MAX
 * when unknown. Any thread. */
uint64_t lsm_vol_free_bytes(const lsm_vol *v);
/* The size of the filesystem v lives on (statvfs; the emulated device of
 * lsm_fault_space in tests); UINT64_MAX when unknown. */
uint64_t lsm_vol_total_bytes(const lsm_vol *v);
void lsm_vol_counters(const lsm_vol *v, lsm_vol_stats *out);
/* True when io_uring works in this process (probed once, logged). */
bool lsm_uring_available(void);

/* Sets the length of a file (ftruncate); KV_OK or the errno's kv_err. */
kv_err lsm_vol_truncate(lsm_vol *v, int fd, uint64_t len);
/* Allocates [off, off + len) of fd without changing its size (fallocate
 * KEEP_SIZE), so later writes there need no free blocks: room held back
 * for writes that must not fail on a full device. RESOURCE_EXHAUSTED on
 * ENOSPC, UNIMPLEMENTED where the filesystem cannot. */
kv_err lsm_vol_reserve(lsm_vol *v, int fd, uint64_t off, uint64_t len);

/* ---- fault injection (fault.c, for tests) ----
 *
 * One process-wide rule makes chosen volume calls fail: calls of the kinds
 * in ops on files whose path contains path_has (NULL = every file) pass
 * `after` times, then fail `times` times (0 = until the rule is cleared)
 * with errno err (0 = EIO; ENOSPC gives RESOURCE_EXHAUSTED). A failing
 * write writes nothing, or half its bytes with short_write; a failing
 * fsync of a durable write (lsm_vol_write with sync) comes after the write.
 * A failing read returns -err in its lsm_io. With delay_us the matching
 * calls are slowed down instead of failed. Any thread. */
enum {
    LSM_FOP_READ = 1u,
    LSM_FOP_WRITE = 2u,
    LSM_FOP_FSYNC = 4u,  /* lsm_vol_fsync, lsm_vol_syncdir and durable writes */
    LSM_FOP_CREATE = 8u, /* lsm_vol_open with O_CREAT */
    LSM_FOP_TRUNCATE = 16u,
    LSM_FOP_ALLOC = 32u, /* not I/O: allocations at sites that ask (name = the site) */
};

typedef struct lsm_fault {
    unsigned ops;         /* LSM_FOP_* */
    const char *path_has; /* copied */
    uint64_t after, times;
    int err;
    bool short_write;
    /* > 0: the matching calls do not fail but wait this long first (a slow
     * device; err and short_write are then ignored) */
    unsigned delay_us;
} lsm_fault;

/* Installs f (replacing the rule and its counts); NULL disarms. */
void lsm_fault_set(const lsm_fault *f);
/* Calls failed (or, with delay_us, delayed) since the rule was set. */
uint64_t lsm_fault_hits(void);
/* An emulated device size (tests), independent of the rule above: the
 * volume whose directory path contains path_has holds at most cap bytes of
 * files. A write that would grow its files past that fails with ENOSPC
 * (RESOURCE_EXHAUSTED) and writes nothing, and lsm_vol_free_bytes reports
 * cap minus the bytes its files hold. Concurrent writers are checked one at
 * a time but write after the check, so they may overshoot cap by what they
 * write at once. NULL path_has disarms. Any thread. */
void lsm_fault_space(const char *path_has, uint64_t cap);
/* Writes the emulated device refused since lsm_fault_space (lsm_vol_reserve's
 * refusals are not counted). */
uint64_t lsm_fault_space_hits(void);
/* The bytes dir's regular files take on the emulated device: their sizes
 * and what lsm_vol_reserve set aside past their ends. */
uint64_t lsm_fault_dir_bytes(const char *dir);
/* For volume.c: whether dir is the emulated device; then *cap is its size
 * and *free its room (either may be NULL). */
bool lsm_fault_space_of(const char *dir, uint64_t *cap, uint64_t *free);
/* For volume.c: 0, or -ENOSPC when a write of len bytes at off to fd, a file of
 * dir, would grow the emulated device past its capacity; count: a write
 * (lsm_fault_space_hits), not an attempt to set room aside. */
int lsm_fault_space_hit(const char *dir, int fd, uint64_t off, size_t len, bool count);

/* volume.c: 0, or -errno when this call must fail; *keep (may be NULL) =
 * the bytes a failing write writes first. name: the file name when the
 * call has no descriptor yet (fd is then ignored). */
int lsm_fault_hit(unsigned op, int fd, const char *name, size_t len, size_t *keep);

/* ---- SST files (sst.c) ---- */

typedef struct lsm_sst lsm_sst;

/* Metadata of one SST, shared by versions (refcounted). */
typedef struct lsm_file {
    uint64_t number, size, nentries, min_seq, max_seq;
    /* Records flagged LSM_F_TWIN (clean copies); 0 for a file recorded
     * before manifests carried it. */
    uint64_t ntwins;
    /* The highest version (HLC) of the file's records; LSM_VERSION_UNKNOWN
     * for a file recorded before manifests carried it (lsm_max_version). */
    uint64_t max_version;
    int level;
    lsm_tier tier;
    uint8_t *smallest, *largest;
    size_t slen, llen;
    lsm_sst *sst; /* open reader; NULL only inside the manifest decoder */
    lsm_vol *vol;
    _Atomic int refs;
    _Atomic bool obsolete; /* unlink when the last reference goes */
} lsm_file;

#define LSM_VERSION_UNKNOWN UINT64_MAX

void lsm_file_ref(lsm_file *f);
void lsm_file_unref(lsm_file *f);
lsm_file *lsm_file_new(void);
bool lsm_file_covers(const lsm_file *f, const void *key, size_t klen);

void lsm_sst_name(char *buf, size_t cap, uint64_t number);
kv_err lsm_sst_open(lsm_vol *v, uint64_t number, lsm_sst **out);
void lsm_sst_close(lsm_sst *s);
bool lsm_sst_may_contain(const lsm_sst *s, const void *key, size_t klen);
/* Index of the block that may hold key, or -1 when key is past the last. */
int lsm_sst_find_block(const lsm_sst *s, const void *key, size_t klen);
uint32_t lsm_sst_nblocks(const lsm_sst *s);
/* The format version of s, and the one builders write (see sst.c). */
uint32_t lsm_sst_format(const lsm_sst *s);
#define LSM_SST_FORMAT 4u
/* The file's path (for messages), valid while s is open. */
const char *lsm_sst_path(const lsm_sst *s);
/* Bytes the open reader keeps in memory (index, bloom filter, block table). */
uint64_t lsm_sst_mem(const lsm_sst *s);
/* Fills io to read block blk (payload + crc) into a new malloc'ed buffer. */
kv_err lsm_sst_block_io(const lsm_sst *s, int blk, lsm_io *io);
/* Verifies a read block (io->res, crc) and decodes it: on KV_OK io->buf
 * holds the block's records (offsets and count at the end), io->len bytes,
 * decompressed when the block was (io->buf then is a new buffer and the read
 * one was freed). The caller frees io->buf whatever the result. DATA_LOSS is
 * logged with the file. */
kv_err lsm_sst_block_check(const lsm_sst *s, int blk, lsm_io *io);
/* Reads block blk now and verifies it: KV_OK with io->buf (the records,
 * io->len bytes, as lsm_sst_block_check; the caller frees it), or the error
 * of lsm_sst_block_io (RESOURCE_EXHAUSTED) or of lsm_sst_block_check, with
 * nothing to free. */
kv_err lsm_sst_read_block(const lsm_sst *s, int blk, lsm_io *io);
/* Binary search in a verified block of s: KV_OK + *out (its value pointing
 * into buf; its key into buf, or at key itself for format 4, whose keys are
 * stored as suffixes), NOT_FOUND, or DATA_LOSS. */
kv_err lsm_block_search(const lsm_sst *s, const uint8_t *buf, size_t len, const void *key,
                        size_t klen, lsm_rec *out);

typedef struct lsm_sst_iter {
    lsm_sst *s;
    int blk;
    lsm_buf ra;        /* read-ahead window: consecutive blocks read at once */
    uint64_t ra_off;   /* file offset of ra.p[0] */
    lsm_buf dec;       /* the current block decompressed, when it is compressed */
    const uint8_t *bp; /* current block's records (in ra or dec), NULL before it is loaded */
    uint32_t n, i;     /* version <= 3: records in the block, the current one */
    size_t payload;    /* bytes of the block's records (before its offsets) */
    size_t at;         /* version 4: offset of the next entry */
    lsm_buf key;       /* version 4: the current key, rebuilt from its prefix */
    lsm_rec cur;       /* its key points into the block, or into key (version 4) */
    bool valid;
    kv_err err;
    uint64_t bytes_read;
} lsm_sst_iter;

/* Sequential scan (compaction): blocks are read ahead up to 512 KiB per
 * read and each is verified. Positions it on the first record; it->valid is
 * false at the end or on error (it->err). */
void lsm_sst_iter_init(lsm_sst_iter *it, lsm_sst *s);
void lsm_sst_iter_next(lsm_sst_iter *it);
/* Positions it on the first record of block blk (invalid past the last
 * block), or on the first record with a key >= key; blocks before are not
 * read. Release with lsm_sst_iter_fini. */
void lsm_sst_iter_at_block(lsm_sst_iter *it, lsm_sst *s, uint32_t blk);
void lsm_sst_iter_seek(lsm_sst_iter *it, lsm_sst *s, const void *key, size_t klen);
void lsm_sst_iter_fini(lsm_sst_iter *it);

typedef struct lsm_sst_builder lsm_sst_builder;
kv_err lsm_sst_builder_open(lsm_sst_builder **out, lsm_vol *v, uint64_t number,
                            unsigned block_size);
/* Records must come in strictly ascending key order. */
kv_err lsm_sst_builder_add(lsm_sst_builder *b, const lsm_rec *r);
uint64_t lsm_sst_builder_size(const lsm_sst_builder *b);
/* Data blocks are compressed with c (default none; NONE/DEFAULT = raw);
 * in/out (may be NULL) count their bytes before and after. Call before the
 * first add. */
void lsm_sst_builder_compress(lsm_sst_builder *b, lsm_compression c, _Atomic uint64_t *in,
                              _Atomic uint64_t *out);
/* The file needs no durability (RALT's runs, never recovered): finish skips
 * the fsync of the file and of its directory. */
void lsm_sst_builder_nosync(lsm_sst_builder *b);
/* Writes bloom, index and footer, fsyncs, opens the reader and returns a new
 * lsm_file (refs 1) for level/tier. Frees b in every case; on failure the
 * file is unlinked. */
kv_err lsm_sst_builder_finish(lsm_sst_builder *b, int level, lsm_file **out);
void lsm_sst_builder_abort(lsm_sst_builder *b);

/* ---- WAL (wal.c) ---- */

typedef struct lsm_wal lsm_wal;
typedef struct lsm_wal_seg {
    uint64_t number, max_seq;
    uint64_t bytes; /* the segment's size (lsm_wal_recover: as replayed) */
} lsm_wal_seg;

/* Replays every *.wal segment of v in number order, calling fn for records
 * with seqno > flushed_seq. A bad frame with no valid frame after it in the
 * log is a torn tail: truncated (logged). Any other bad frame fails with
 * DATA_LOSS (logged with the file and offset) unless o->wal_recovery is
 * point-in-time: then it is truncated too and later segments are deleted
 * (logged). Returns the segments left (*segs malloc'ed), the max seqno and
 * max segment number seen. */
kv_err lsm_wal_recover(lsm_vol *v, const lsm_opts *o, uint64_t flushed_seq, lsm_replay_fn fn,
                       void *arg, lsm_wal_seg **segs, size_t *nsegs, uint64_t *max_seq,
                       uint64_t *max_number);
/* Opens a new segment `number`; takes ownership of segs (old segments). */
kv_err lsm_wal_open(lsm_wal **out, lsm_vol *v, const lsm_opts *o, uint64_t number,
                    lsm_wal_seg *segs, size_t nsegs);
kv_err lsm_wal_write(lsm_wal *w, const lsm_rec *recs, size_t n);
/* Seals the current segment (fsync unless sync none) and starts `number`. */
kv_err lsm_wal_rotate(lsm_wal *w, uint64_t number);
/* lsm_wal_sync: fsyncs what the sync mode left unsynced (see lsm.h); fails
 * with the WAL's error while appends are refused after a failed fsync. */
kv_err lsm_wal_sync_all(lsm_wal *w);
/* Deletes sealed segments whose records all have seqno <= flushed_seq. */
void lsm_wal_release(lsm_wal *w, uint64_t flushed_seq);
void lsm_wal_close(lsm_wal *w);
/* Bytes of the live segments (sealed and current). Any thread. */
uint64_t lsm_wal_live(lsm_wal *w);
void lsm_wal_counters(lsm_wal *w, uint64_t *bytes, uint64_t *fsyncs, uint64_t *segments);

/* WAL frame: [u32 crc32c(len || payload)][u32 len][payload]. */
#define LSM_FRAME_HDR 8u

/* ---- versions and MANIFEST (manifest.c) ---- */

typedef struct lsm_version {
    _Atomic int refs;
    lsm_file **files[LSM_MAX_LEVELS];
    size_t nfiles[LSM_MAX_LEVELS];
} lsm_version;

typedef struct lsm_edit {
    bool has_flushed, has_next, has_log;
    uint64_t flushed_seq, next_file, log_number;
    uint64_t *del_numbers;
    int *del_levels;
    size_t ndel;
    lsm_file **adds; /* referenced by the edit */
    size_t nadd;
} lsm_edit;

kv_err lsm_edit_add(lsm_edit *e, lsm_file *f);
kv_err lsm_edit_del(lsm_edit *e, int level, uint64_t number);
void lsm_edit_free(lsm_edit *e);

lsm_version *lsm_version_new(void);
void lsm_version_unref(lsm_version *v);
/* New version = base + e (files referenced). NULL on ENOMEM. */
lsm_version *lsm_version_apply(const lsm_version *base, const lsm_edit *e);
uint64_t lsm_level_bytes(const lsm_version *v, int level);

typedef struct lsm_manifest lsm_manifest;

typedef struct lsm_recovered {
    lsm_edit state;    /* adds = live files (sst not open), flushed/next/log */
    uint64_t manifest; /* number of the manifest read */
} lsm_recovered;

/* Reads CURRENT and the manifest it names on v. NOT_FOUND when there is no
 * CURRENT (a new db); DATA_LOSS (logged, naming the file) when corrupt. */
kv_err lsm_manifest_recover(lsm_vol *v, lsm_recovered *out);
/* Writes MANIFEST-<number> holding the snapshot edit, fsyncs it and points
 * CURRENT at it (atomic rename); deletes the previous manifest `old` (0 =
 * none). */
kv_err lsm_manifest_create(lsm_manifest **out, lsm_vol *v, uint64_t number,
                           const lsm_edit *snapshot, uint64_t old);
/* Appends e (fsynced). A failed append is cut off; when that fails too the
 * manifest is broken: every later append fails (write a new one). */
kv_err lsm_manifest_append(lsm_manifest *m, const lsm_edit *e);
bool lsm_manifest_broken(const lsm_manifest *m);
uint64_t lsm_manifest_size(const lsm_manifest *m);
uint64_t lsm_manifest_number(const lsm_manifest *m);
void lsm_manifest_close(lsm_manifest *m);

/* ---- RALT (ralt.c) ---- */

typedef struct ralt ralt;

typedef struct ralt_opts {
    const char *dir;       /* directory of the run files (created; stale runs deleted) */
    bool disable_io_uring; /* as lsm_opts */
    uint64_t hot_limit;    /* hot-set limit in key+value bytes, 0 = 64 MiB */
    uint64_t tick_bytes;   /* accessed bytes per tick, 0 = hot_limit / 16 (>= 4 KiB) */
    uint64_t period_bytes; /* accessed bytes per counter decrement (rounded to whole ticks),
                            * 0 = 4 ticks; the engine passes the FD size, as HotRAP does */
    size_t buf_entries;    /* unsorted buffer entries, 0 = 1024 */
    uint64_t phys_cap;     /* bound of the adaptive table size, 0 = the hot-set limit */
} ralt_opts;

typedef struct ralt_stats {
    uint64_t entries, stable, runs, phys_bytes, hot_bytes, hot_limit, phys_limit, tick, evicted;
    uint64_t file_bytes; /* bytes of the run files on FD */
    uint64_t mem_bytes;  /* memory of the runs: readers, hot/stable blooms, block hot bytes */
    uint64_t errors;     /* corrupt or unreadable run files met (each logged) */
    uint64_t merges, full_merges, merge_bytes; /* merges of runs since open, bytes written */
} ralt_stats;

/* Callback of ralt_hot_range; key is valid during the call only. */
typedef void (*ralt_key_fn)(void *arg, const void *key, size_t klen, uint32_t vlen);

/* Opens an empty table whose runs live in o->dir (required): deletes the
 * run files a previous process left there (hotness is re-learned after a
 * restart, see ralt.c). Returns KV_OK, INVALID_ARGUMENT without a dir, or
 * the volume's error. */
kv_err ralt_open(ralt **out, const ralt_opts *o);
void ralt_close(ralt *r); /* NULL is a no-op; deletes the run files */
/* Records one access (any thread; copies key). May write a run (I/O) when
 * the buffer fills. */
void ralt_access(ralt *r, const void *key, size_t klen, size_t vlen);
/* ralt_access on a thread that must not block: false, with nothing
 * recorded, when this access would fill the buffer (ralt_access's run
 * write); the caller then leaves the access to a thread that may block. */
bool ralt_access_nb(ralt *r, const void *key, size_t klen, size_t vlen);
/* Turns the buffer into a run and merges all runs into one (with eviction).
 * DATA_LOSS (logged, naming the file) when a run file is corrupt: the table
 * is then dropped and re-learned. */
kv_err ralt_flush(ralt *r);
/* True when key is stably hot (blooms first, then one block read per run
 * that may hold it; the buffer is not consulted; false on a read error). */
bool ralt_is_hot(ralt *r, const void *key, size_t klen);
/* Calls fn for every hot key in [lo, hi] in key order (flushes first). */
kv_err ralt_hot_range(ralt *r, const void *lo, size_t lolen, const void *hi, size_t hilen,
                      ralt_key_fn fn, void *arg);
/* Key + value bytes of the hot keys in [lo, hi] (flushes first; 0 on error). */
uint64_t ralt_hot_bytes(ralt *r, const void *lo, size_t lolen, const void *hi, size_t hilen);
/* Estimate of the same from memory only (no flush, no I/O; compaction
 * picking holds db->mu): per run, the stable bytes of the SST blocks inside
 * the range, plus half of each of the two boundary blocks; a key hot in
 * several runs counts in each, the buffer not at all. */
uint64_t ralt_hot_bytes_est(ralt *r, const void *lo, size_t lolen, const void *hi, size_t hilen);
void ralt_set_hot_limit(ralt *r, uint64_t bytes);
/* Decayed score of key as of now (sum over runs; a block read per run). */
double ralt_score(ralt *r, const void *key, size_t klen);
/* True when one run holds key as stable, without folding the key's
 * entries of several runs (a key stable only once folded is not). With
 * ralt_stable_count it measures the same set: the keys stable in a run. */
bool ralt_stable_in_run(ralt *r, const void *key, size_t klen);
/* Entries stable in their run, summed over the runs (a key stable in two
 * runs counts twice; the buffer is not counted). Cheap: no I/O. */
uint64_t ralt_stable_count(ralt *r);
void ralt_stats_get(ralt *r, ralt_stats *out);

/* ---- twin map (twin.c) ---- */

/* Keys whose newest record has identical copies (same seqno) on FD and SD;
 * see twin.c for the layout and the locking. Every function is safe from
 * any thread; none allocates after create. NULL t is a no-op / empty map. */
typedef struct lsm_twin lsm_twin;

/* Creates a map holding at most max_entries (rounded up to a power of two
 * times 8). Returns KV_OK and *out (caller owns, lsm_twin_destroy),
 * INVALID_ARGUMENT for 0 or more than 2^30, RESOURCE_EXHAUSTED. */
kv_err lsm_twin_create(size_t max_entries, lsm_twin **out);
void lsm_twin_destroy(lsm_twin *t); /* NULL is a no-op; no concurrent call */
/* Records key -> seqno (replacing key's entry; evicting the set's oldest
 * entry when the set is full). key is borrowed (only its hash is kept). */
void lsm_twin_put(lsm_twin *t, const void *key, size_t klen, uint64_t seqno);
/* True and *seqno when key has an entry. */
bool lsm_twin_get(lsm_twin *t, const void *key, size_t klen, uint64_t *seqno);
/* Removes key's entry whatever its seqno (a write of key: a newer version
 * exists). Always takes the key's stripe lock. */
void lsm_twin_del(lsm_twin *t, const void *key, size_t klen);
/* Removes key's entry only when it holds exactly seqno (compaction dropped
 * one of the two copies); true when removed. */
bool lsm_twin_drop(lsm_twin *t, const void *key, size_t klen, uint64_t seqno);
size_t lsm_twin_size(lsm_twin *t);
size_t lsm_twin_capacity(const lsm_twin *t);
uint64_t lsm_twin_evicted(lsm_twin *t);

/* ---- promotion buffer (promote.c) ---- */

typedef struct lsm_promo lsm_promo;

/* ---- the db (db.c, compact.c) ---- */

struct lsm_db {
    lsm_opts o;
    char *fast_dir, *slow_dir;
    lsm_vol vols[2]; /* [0] FD, [1] SD */
    bool has_sd;
    lsm_wal *wal;
    lsm_manifest *man;
    int lock_fd; /* flock'ed FD/LOCK */

    pthread_mutex_t vmu; /* protects cur only */
    lsm_version *cur;

    pthread_mutex_t mu; /* next_file, flushed_seq, manifest, compaction state */
    pthread_cond_t cv;
    pthread_mutex_t flush_mu;
    uint64_t next_file, flushed_seq, log_number;
    _Atomic uint64_t last_seq, flush_gen;

    uint64_t target[LSM_MAX_LEVELS];
    lsm_tier level_tier[LSM_MAX_LEVELS];
    lsm_compression codec[LSM_MAX_LEVELS]; /* resolved o.compression (NONE, LZ4 or ZSTD) */
    uint64_t file_size;

    pthread_t *threads;
    unsigned nthreads;
    bool stop, manual;
    bool busy[LSM_MAX_LEVELS];
    int running;
    kv_err bg_err;
    uint64_t retry_at; /* kv_now_ns() before which threads do not compact */

    _Atomic uint64_t reads_fd, reads_sd, user_bytes, flush_bytes, flushes;
    _Atomic uint64_t stalls_l0, stalls_fd, stall_ns, fd_peak; /* lsm_stats */
    /* room on the fast device (compact.c, lsm_fd_room): the biggest flushed
     * file, the last free bytes seen, flushes that waited for room and picks
     * that deferred or shrank a job for it */
    _Atomic uint64_t flush_max, fd_free, stalls_space, space_waits;
    uint64_t space_wanted; /* mu: the room a flush waits for (0 = none) */
    bool space_blocked;    /* mu: the last pick found no job that fits, none to push down */
    _Atomic uint64_t check_calls, check_blocks_fd, check_blocks_sd; /* lsm_get_meta */
    _Atomic uint64_t c_read, c_write, compactions;
    _Atomic uint64_t comp_in, comp_out; /* data block bytes before / after compression */
    /* per output level (lsm_level_stats) */
    _Atomic uint64_t lc_above[LSM_MAX_LEVELS], lc_level[LSM_MAX_LEVELS], lc_written[LSM_MAX_LEVELS];
    _Atomic uint64_t lc_jobs[LSM_MAX_LEVELS], lc_moved[LSM_MAX_LEVELS], lc_ns[LSM_MAX_LEVELS];

    /* HotRAP: both NULL when off or without SD */
    ralt *ralt;
    lsm_promo *promo;
    int last_fd;                  /* deepest level on FD */
    uint64_t hot_limit;           /* hot-set limit (bytes) */
    _Atomic uint64_t flushed_pub; /* flushed_seq, stored after its version is installed */
    _Atomic uint64_t retained_recs, retained_bytes;
    _Atomic uint64_t twins_dropped, twins_dropped_bytes, twin_jobs; /* compact.c */
    _Atomic uint64_t l0_moves_past;                                 /* compact.c */

    /* NHC (node/nhc): the twin map (NULL without HotRAP) and the routing
     * counters; o.nhc may be NULL (every read FD-first). */
    lsm_twin *twin;
    _Atomic uint64_t nhc_routed, nhc_fallbacks;
};

/* The db's wall clock (lsm_opts.clock), milliseconds. */
static inline uint64_t lsm_now_ms(const lsm_db *db)
{
    return kv_clock_ms(db->o.clock, db->o.clock_arg);
}

lsm_version *lsm_db_current(lsm_db *db);
/* With db->mu held: appends e to the manifest, installs cur + e. */
kv_err lsm_db_install(lsm_db *db, lsm_edit *e);
/* File numbers a MANIFEST may hold: far past any store's (one file a
 * microsecond for 8 years), far below where next_file++ would wrap (a
 * fuzzed MANIFEST with a number near 2^64 made new files reuse 0). A store
 * never makes a number whose successor would reach it: its next open could
 * not read the MANIFEST (fuzz_manifest: a next number of 2^48 - 1 opened,
 * the open's own WAL and MANIFEST took 2^48 - 1 and 2^48, and the cleanly
 * closed store did not reopen). */
#define LSM_FILE_NUMBER_MAX ((uint64_t)1 << 48)
/* The next file number (db->mu held), or 0 once the numbers are used up
 * (LSM_FILE_NUMBER_MAX): the caller fails with RESOURCE_EXHAUSTED. The
 * reader and the writer share the one bound, so whatever a store writes its
 * next open reads. Each open makes two numbers (its WAL and MANIFEST), so a
 * store with fewer than two left fails to open with RESOURCE_EXHAUSTED, never
 * DATA_LOSS. (A reader bound 2^32 below the writer's, tried once, let a
 * store opened just under it write a next number its reopen refused.) */
uint64_t lsm_db_new_number(lsm_db *db);
/* Opens a builder for SST `number` of level: on the level's volume, with its
 * block size and codec (counted in the db's compression stats). */
kv_err lsm_db_builder(lsm_db *db, int level, uint64_t number, lsm_sst_builder **out);

/* Waits on db->cv (db->mu held) until woken or until the monotonic time
 * `until` (kv_now_ns). */
void lsm_db_wait_until(lsm_db *db, uint64_t until);

kv_err lsm_compact_start(lsm_db *db);
/* Compacts every file of level into level + 1 like lsm_compact_all does
 * (waits for and blocks background jobs). For tests. */
kv_err lsm_compact_level(lsm_db *db, int level);
/* Hot bytes (per RALT) in the key range of f; 0 without RALT. */
uint64_t lsm_hot_bytes_in(lsm_db *db, const lsm_file *f);

/* The L0 bytes that make L0 due for compaction on their own (besides
 * l0_trigger files): the room the FD levels L1..last_fd leave on the fast
 * volume (fast_mb minus their bytes), at least L1's target and at most
 * l0_trigger times it. Any thread holding a reference to v. */
uint64_t lsm_l0_room(const lsm_db *db, const lsm_version *v);

/* With a slow volume: the fast device's free bytes less the room kept for
 * flushes (0 when under it); UINT64_MAX without a slow volume or when the
 * free bytes are unknown. Records the free bytes for lsm_stats. Any thread. */
uint64_t lsm_fd_room(lsm_db *db);
/* What the WAL may still grow on FD before its owner holds writers:
 * o.wal_max_bytes less its live bytes (0 when not counted). Any thread. */
uint64_t lsm_wal_headroom(lsm_db *db);

/* SST bytes of the FD levels (L0..last_fd) of v. */
uint64_t lsm_fd_bytes(const lsm_db *db, const lsm_version *v);
/* With a slow volume: true when v's FD levels hold more than fd_stop_pct of
 * fast_mb and one of them is due for compaction (a score >= 1), i.e. when a
 * flush should wait: the due job will run, and while an FD
 * level is over its target the jobs go on until the bytes move to SD. False
 * when no FD level is due, so a waiter never waits for a job that will not
 * come. db->mu held (or v pinned). */
bool lsm_fd_full(const lsm_db *db, const lsm_version *v);

/* Promotion buffer: create before WAL replay (marks), start after. */
kv_err lsm_promo_create(lsm_db *db);
kv_err lsm_promo_start(lsm_db *db);
void lsm_promo_close(lsm_db *db); /* stops the checker, frees; NULL promo ok */
/* Marks the keys of recs as updated (lsm_wal_append, replay). */
void lsm_promo_mark(lsm_db *db, const lsm_rec *recs, size_t n);
/* Marks the keys of recs as flushed (lsm_flush, before the install). */
void lsm_promo_mark_flushed(lsm_db *db, const lsm_rec *recs, size_t n);
/* Offers a record read from SD by a lookup that saw flushed seqno fread. */
void lsm_promo_add(lsm_db *db, const lsm_rec *r, uint64_t fread);
/* The promotion gate (promote.c). lsm_promo_note_read is called for every
 * record a lookup reads from the levels, before RALT hears of the access: a
 * sample of those reads measures how much more often than chance RALT's hot
 * keys are read (the lift). lsm_promo_gate decides whether a key RALT calls
 * hot may be promoted (by the promotion buffer or by a compaction inside
 * SD); false counts the key as gated. Any thread. */
void lsm_promo_note_read(lsm_db *db, const void *key, size_t klen);
bool lsm_promo_gate(lsm_db *db, const void *key, size_t klen);
/* Seals the mutable buffer, has the checker promote it whatever its size,
 * and waits until every sealed buffer is handled (tests). */
void lsm_promo_sync(lsm_db *db);
void lsm_promo_stats(lsm_db *db, lsm_stats *out);
void lsm_compact_stop(lsm_db *db);

#endif
