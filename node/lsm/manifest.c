/* SPDX-License-Identifier: MIT */
/*
 * Versions and the MANIFEST. A version is an immutable, refcounted set of
 * SST files per level (L0 ordered by file number, L1+ by smallest key);
 * readers pin the current one, flushes and compactions install a new one
 * built from a version edit (files added / deleted, flushed seqno, WAL log
 * number, next file number). Files are refcounted too, and a file marked
 * obsolete is unlinked when its last reference goes, so readers never see a
 * file vanish under them.
 *
 * The MANIFEST on FD (MANIFEST-<number>) is a log of edits in the WAL's frame
 * format; CURRENT names the live one and is switched by writing CURRENT.tmp
 * and renaming it (atomic), like LevelDB/RocksDB. Every open writes a fresh
 * manifest holding a snapshot edit. A frame with a bad checksum or an edit
 * that does not parse makes recovery fail with DATA_LOSS and a log line
 * naming the file; a frame cut short by end of file (a writer that died
 * mid-append, never acknowledged) ends the log with a warning.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "node/lsm/lsm_int.h"

/* TAG_ADD2 is TAG_ADD followed by the file's max_version; manifests written
 * before it existed hold TAG_ADD only (their files' max_version is unknown
 * until compaction rewrites them). TAG_ADD3 is TAG_ADD2 followed by the
 * file's count of clean copies (lsm_file.ntwins); files added by TAG_ADD or
 * TAG_ADD2 count none, which only means a compaction treats their copies
 * as records to write down. */
enum {
    TAG_FLUSHED = 1,
    TAG_NEXT = 2,
    TAG_LOG = 3,
    TAG_DEL = 4,
    TAG_ADD = 5,
    TAG_ADD2 = 6,
    TAG_ADD3 = 7
};

/* MANIFEST frame: [u32 crc32c(len || payload)][u32 len][u32 crc32c(len)]
 * [payload]. The header's own checksum tells a torn last append (header
 * intact, payload cut by end of file: tolerated) from a corrupt length
 * (DATA_LOSS), so a flipped length can never silently hide later edits. */
#define MFRAME_HDR 12u

static kv_err man_frame(lsm_buf *out, const void *payload, size_t len)
{
    kv_err rv = lsm_buf_reserve(out, MFRAME_HDR + len);
    if (rv != KV_OK)
        return rv;
    uint8_t *h = out->p + out->len;
    lsm_set32(h + 4, (uint32_t)len);
    lsm_set32(h + 8, kv_crc32c(0, h + 4, 4));
    memcpy(h + MFRAME_HDR, payload, len);
    lsm_set32(h, kv_crc32c(kv_crc32c(0, h + 4, 4), payload, len));
    out->len += MFRAME_HDR + len;
    return KV_OK;
}

/* A MANIFEST keeps this much allocated past its end (RocksDB's
 * manifest_preallocation_size), topped up when half is used: a compaction
 * that pushes the fast levels down to make room must be able to record it
 * on a full fast device, or nothing ever frees room there. */
#define MAN_RESERVE (1u << 20)

struct lsm_manifest {
    lsm_vol *v;
    int fd;
    uint64_t number, off;
    uint64_t reserved; /* allocated up to here (lsm_vol_reserve) */
    bool broken;       /* a failed append could not be cut off: append no more */
    bool reserve_warned;
};

/* Tops the room allocated past the end up to MAN_RESERVE when half is used.
 * A failure is logged once and costs nothing else: appends then take their
 * blocks from the free room as any write does. */
static void man_reserve(lsm_manifest *m)
{
    if (m->reserved >= m->off + MAN_RESERVE / 2)
        return;
    kv_err rv = lsm_vol_reserve(m->v, m->fd, m->off, MAN_RESERVE);
    if (rv == KV_OK) {
        m->reserved = m->off + MAN_RESERVE;
        m->reserve_warned = false;
    } else if (!m->reserve_warned) {
        m->reserve_warned = true;
        KV_WARN(LSM_LOG, "%s/MANIFEST-%06" PRIu64 ": cannot set %u KiB aside for its edits: %s",
                m->v->dir, m->number, MAN_RESERVE >> 10, kv_strerror(rv));
    }
}

/* ---- files ---- */

lsm_file *lsm_file_new(void)
{
    lsm_file *f = calloc(1, sizeof(*f));
    if (f) {
        atomic_init(&f->refs, 1);
        f->max_version = LSM_VERSION_UNKNOWN; /* until a builder or the manifest says */
    }
    return f;
}

void lsm_file_ref(lsm_file *f)
{
    atomic_fetch_add(&f->refs, 1);
}

void lsm_file_unref(lsm_file *f)
{
    if (!f || atomic_fetch_sub(&f->refs, 1) != 1)
        return;
    lsm_sst_close(f->sst);
    if (atomic_load(&f->obsolete) && f->vol) {
        char name[64];
        lsm_sst_name(name, sizeof(name), f->number);
        int e = lsm_vol_unlink(f->vol, name);
        if (e < 0)
            KV_WARN(LSM_LOG, "delete %s/%s: %s", f->vol->dir, name, strerror(-e));
    }
    free(f->smallest);
    free(f->largest);
    free(f);
}

bool lsm_file_covers(const lsm_file *f, const void *key, size_t klen)
{
    return lsm_key_cmp(key, klen, f->smallest, f->slen) >= 0 &&
           lsm_key_cmp(key, klen, f->largest, f->llen) <= 0;
}

/* ---- edits ---- */

kv_err lsm_edit_add(lsm_edit *e, lsm_file *f)
{
    lsm_file **a = realloc(e->adds, (e->nadd + 1) * sizeof(*a));
    if (!a)
        return KV_RESOURCE_EXHAUSTED;
    e->adds = a;
    lsm_file_ref(f);
    e->adds[e->nadd++] = f;
    return KV_OK;
}

kv_err lsm_edit_del(lsm_edit *e, int level, uint64_t number)
{
    uint64_t *n = realloc(e->del_numbers, (e->ndel + 1) * sizeof(*n));
    if (n)
        e->del_numbers = n;
    int *l = realloc(e->del_levels, (e->ndel + 1) * sizeof(*l));
    if (l)
        e->del_levels = l;
    if (!n || !l)
        return KV_RESOURCE_EXHAUSTED;
    e->del_numbers[e->ndel] = number;
    e->del_levels[e->ndel++] = level;
    return KV_OK;
}

void lsm_edit_free(lsm_edit *e)
{
    for (size_t i = 0; i < e->nadd; i++)
        lsm_file_unref(e->adds[i]);
    free(e->adds);
    free(e->del_numbers);
    free(e->del_levels);
    memset(e, 0, sizeof(*e));
}

static kv_err put_key(lsm_buf *b, const uint8_t *k, size_t len)
{
    kv_err rv = lsm_buf_put32(b, (uint32_t)len);
    return rv == KV_OK ? lsm_buf_put(b, k, len) : rv;
}

static kv_err encode_add(lsm_buf *b, const lsm_file *f)
{
    uint8_t tier = (uint8_t)f->tier;
    kv_err rv = lsm_buf_put(b, (uint8_t[]){TAG_ADD3}, 1);
    if (rv == KV_OK)
        rv = lsm_buf_put32(b, (uint32_t)f->level);
    if (rv == KV_OK)
        rv = lsm_buf_put(b, &tier, 1);
    uint64_t nums[5] = {f->number, f->size, f->nentries, f->min_seq, f->max_seq};
    if (rv == KV_OK)
        rv = lsm_buf_put(b, nums, sizeof(nums));
    if (rv == KV_OK)
        rv = put_key(b, f->smallest, f->slen);
    if (rv == KV_OK)
        rv = put_key(b, f->largest, f->llen);
    if (rv == KV_OK)
        rv = lsm_buf_put64(b, f->max_version);
    if (rv == KV_OK)
        rv = lsm_buf_put64(b, f->ntwins);
    return rv;
}

static kv_err encode_u64(lsm_buf *b, uint8_t tag, uint64_t v)
{
    kv_err rv = lsm_buf_put(b, &tag, 1);
    return rv == KV_OK ? lsm_buf_put64(b, v) : rv;
}

static kv_err edit_encode(const lsm_edit *e, lsm_buf *b)
{
    kv_err rv = KV_OK;
    if (e->has_flushed)
        rv = encode_u64(b, TAG_FLUSHED, e->flushed_seq);
    if (rv == KV_OK && e->has_next)
        rv = encode_u64(b, TAG_NEXT, e->next_file);
    if (rv == KV_OK && e->has_log)
        rv = encode_u64(b, TAG_LOG, e->log_number);
    for (size_t i = 0; rv == KV_OK && i < e->ndel; i++) {
        rv = lsm_buf_put(b, (uint8_t[]){TAG_DEL}, 1);
        if (rv == KV_OK)
            rv = lsm_buf_put32(b, (uint32_t)e->del_levels[i]);
        if (rv == KV_OK)
            rv = lsm_buf_put64(b, e->del_numbers[i]);
    }
    for (size_t i = 0; rv == KV_OK && i < e->nadd; i++)
        rv = encode_add(b, e->adds[i]);
    return rv;
}

/* Takes a length-prefixed key at *p; false when it does not fit. */
static bool take_key(const uint8_t **p, const uint8_t *end, uint8_t **k, size_t *len)
{
    if (end - *p < 4)
        return false;
    uint32_t n = lsm_get32(*p);
    if ((size_t)(end - *p - 4) < n || n == 0)
        return false;
    *k = malloc(n);
    if (!*k)
        return false;
    memcpy(*k, *p + 4, n);
    *len = n;
    *p += 4 + n;
    return true;
}

/* tag: TAG_ADD, TAG_ADD2 or TAG_ADD3 */

static bool decode_add(const uint8_t **p, const uint8_t *end, lsm_recovered *st, uint8_t tag)
{
    if (end - *p < 4 + 1 + 40)
        return false;
    lsm_file *f = lsm_file_new();
    if (!f)
        return false;
    f->level = (int)lsm_get32(*p);
    f->tier = (lsm_tier)(*p)[4];
    const uint8_t *q = *p + 5;
    f->number = lsm_get64(q);
    f->size = lsm_get64(q + 8);
    f->nentries = lsm_get64(q + 16);
    f->min_seq = lsm_get64(q + 24);
    f->max_seq = lsm_get64(q + 32);
    *p = q + 40;
    bool ok = f->level >= 0 && f->level < LSM_MAX_LEVELS && f->number < LSM_FILE_NUMBER_MAX &&
              (f->tier == LSM_TIER_FD || f->tier == LSM_TIER_SD) &&
              take_key(p, end, &f->smallest, &f->slen) && take_key(p, end, &f->largest, &f->llen);
    if (ok && tag >= TAG_ADD2 && (ok = end - *p >= 8)) {
        f->max_version = lsm_get64(*p);
        *p += 8;
    }
    if (ok && tag >= TAG_ADD3 && (ok = end - *p >= 8)) {
        f->ntwins = lsm_get64(*p);
        *p += 8;
        ok = f->ntwins <= f->nentries;
    }
    ok = ok && lsm_edit_add(&st->state, f) == KV_OK;
    lsm_file_unref(f);
    return ok;
}

static void state_del(lsm_recovered *st, uint64_t number)
{
    lsm_edit *s = &st->state;
    for (size_t i = 0; i < s->nadd; i++) {
        if (s->adds[i]->number == number) {
            lsm_file_unref(s->adds[i]);
            s->adds[i] = s->adds[--s->nadd];
            return;
        }
    }
}

/* Applies one edit payload to the recovered state; false when malformed. */
static bool edit_apply_raw(const uint8_t *p, size_t len, lsm_recovered *st)
{
    const uint8_t *end = p + len;
    lsm_edit *s = &st->state;
    while (p < end) {
        uint8_t tag = *p++;
        if (tag >= TAG_FLUSHED && tag <= TAG_LOG) {
            if (end - p < 8)
                return false;
            uint64_t v = lsm_get64(p);
            p += 8;
            if (tag == TAG_FLUSHED)
                s->flushed_seq = v, s->has_flushed = true;
            else if (tag == TAG_NEXT && v >= LSM_FILE_NUMBER_MAX)
                return false; /* the numbers made from it would wrap */
            else if (tag == TAG_NEXT)
                s->next_file = v, s->has_next = true;
            else
                s->log_number = v, s->has_log = true;
        } else if (tag == TAG_DEL) {
            if (end - p < 12)
                return false;
            state_del(st, lsm_get64(p + 4));
            p += 12;
        } else if (tag >= TAG_ADD && tag <= TAG_ADD3) {
            if (!decode_add(&p, end, st, tag))
                return false;
        } else {
            return false;
        }
    }
    return true;
}

/* ---- versions ---- */

lsm_version *lsm_version_new(void)
{
    lsm_version *v = calloc(1, sizeof(*v));
    if (v)
        atomic_init(&v->refs, 1);
    return v;
}

void lsm_version_unref(lsm_version *v)
{
    if (!v || atomic_fetch_sub(&v->refs, 1) != 1)
        return;
    for (int l = 0; l < LSM_MAX_LEVELS; l++) {
        for (size_t i = 0; i < v->nfiles[l]; i++)
            lsm_file_unref(v->files[l][i]);
        free(v->files[l]);
    }
    free(v);
}

static int cmp_l0(const void *a, const void *b)
{
    const lsm_file *x = *(lsm_file *const *)a, *y = *(lsm_file *const *)b;
    return x->number < y->number ? -1 : x->number > y->number;
}

static int cmp_key(const void *a, const void *b)
{
    const lsm_file *x = *(lsm_file *const *)a, *y = *(lsm_file *const *)b;
    return lsm_key_cmp(x->smallest, x->slen, y->smallest, y->slen);
}

static bool deleted(const lsm_edit *e, int level, uint64_t number)
{
    for (size_t i = 0; i < e->ndel; i++)
        if (e->del_numbers[i] == number && e->del_levels[i] == level)
            return true;
    return false;
}

lsm_version *lsm_version_apply(const lsm_version *base, const lsm_edit *e)
{
    lsm_version *v = lsm_version_new();
    if (!v)
        return NULL;
    for (int l = 0; l < LSM_MAX_LEVELS; l++) {
        size_t cap = (base ? base->nfiles[l] : 0) + e->nadd;
        v->files[l] = malloc((cap ? cap : 1) * sizeof(lsm_file *));
        if (!v->files[l]) {
            lsm_version_unref(v);
            return NULL;
        }
        for (size_t i = 0; base && i < base->nfiles[l]; i++) {
            lsm_file *f = base->files[l][i];
            if (!deleted(e, l, f->number)) {
                lsm_file_ref(f);
                v->files[l][v->nfiles[l]++] = f;
            }
        }
        for (size_t i = 0; i < e->nadd; i++) {
            if (e->adds[i]->level == l) {
                lsm_file_ref(e->adds[i]);
                v->files[l][v->nfiles[l]++] = e->adds[i];
            }
        }
        qsort(v->files[l], v->nfiles[l], sizeof(lsm_file *), l == 0 ? cmp_l0 : cmp_key);
    }
    return v;
}

uint64_t lsm_level_bytes(const lsm_version *v, int level)
{
    uint64_t s = 0;
    for (size_t i = 0; i < v->nfiles[level]; i++)
        s += v->files[level][i]->size;
    return s;
}

/* ---- MANIFEST files ---- */

static kv_err man_corrupt(const char *dir, const char *name, const char *what, uint64_t off)
{
    KV_ERROR(LSM_LOG, "corrupt MANIFEST %s/%s: %s at offset %" PRIu64, dir, name, what, off);
    return KV_DATA_LOSS;
}

/* Reads a whole small file of v into a new buffer. */
static kv_err slurp(lsm_vol *v, const char *name, lsm_buf *out)
{
    int fd = lsm_vol_open(v, name, O_RDONLY);
    if (fd < 0)
        return fd == -ENOENT ? KV_NOT_FOUND : lsm_errno(fd);
    struct stat st;
    kv_err rv = fstat(fd, &st) < 0 ? KV_INTERNAL : KV_OK;
    if (rv == KV_OK)
        rv = lsm_buf_reserve(out, (size_t)st.st_size + 1);
    if (rv == KV_OK && st.st_size > 0)
        rv = lsm_vol_pread(v, fd, out->p, (size_t)st.st_size, 0);
    if (rv == KV_OK)
        out->len = (size_t)st.st_size;
    close(fd);
    return rv;
}

static int cmp_number(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* True when two live files share a number: one name on disk cannot be two
 * files, and compacting one copy away would delete the other's data. */
static bool numbers_repeat(const lsm_edit *st)
{
    uint64_t *n = malloc((st->nadd ? st->nadd : 1) * sizeof(*n));
    if (!n)
        return false; /* out of memory: let the open fail later, not here */
    for (size_t i = 0; i < st->nadd; i++)
        n[i] = st->adds[i]->number;
    qsort(n, st->nadd, sizeof(*n), cmp_number);
    bool dup = false;
    for (size_t i = 1; i < st->nadd && !dup; i++)
        dup = n[i] == n[i - 1];
    free(n);
    return dup;
}

static kv_err replay_manifest(lsm_vol *v, const char *name, const lsm_buf *b, lsm_recovered *out)
{
    uint64_t off = 0;
    while (off < b->len) {
        const uint8_t *h = b->p + off;
        size_t left = b->len - off;
        if (left < MFRAME_HDR) {
            KV_WARN(LSM_LOG,
                    "MANIFEST %s/%s: %zu stray bytes at offset %" PRIu64
                    " ignored (writer died mid-append)",
                    v->dir, name, left, off);
            break;
        }
        uint32_t len = lsm_get32(h + 4);
        if (kv_crc32c(0, h + 4, 4) != lsm_get32(h + 8))
            return man_corrupt(v->dir, name, "frame header checksum mismatch", off);
        if (left - MFRAME_HDR < len) {
            KV_WARN(LSM_LOG,
                    "MANIFEST %s/%s: incomplete last edit at offset %" PRIu64
                    " ignored (writer died mid-append)",
                    v->dir, name, off);
            break;
        }
        if (kv_crc32c(kv_crc32c(0, h + 4, 4), h + MFRAME_HDR, len) != lsm_get32(h))
            return man_corrupt(v->dir, name, "checksum mismatch", off);
        if (!edit_apply_raw(h + MFRAME_HDR, len, out))
            return man_corrupt(v->dir, name, "malformed edit", off);
        off += MFRAME_HDR + len;
    }
    if (!out->state.has_next)
        return man_corrupt(v->dir, name, "no next-file number", off);
    if (numbers_repeat(&out->state))
        return man_corrupt(v->dir, name, "a file number listed twice", off);
    return KV_OK;
}

kv_err lsm_manifest_recover(lsm_vol *v, lsm_recovered *out)
{
    lsm_buf cur = {0}, man = {0};
    kv_err rv = slurp(v, "CURRENT", &cur);
    if (rv != KV_OK) {
        lsm_buf_free(&cur);
        return rv;
    }
    char name[64] = {0};
    unsigned long long num = 0;
    char *end = NULL;
    if (cur.len > 9 && cur.len < sizeof(name) && memcmp(cur.p, "MANIFEST-", 9) == 0) {
        memcpy(name, cur.p, cur.len);
        num = strtoull(name + 9, &end, 10);
    }
    if (!end || *end != '\n') {
        KV_ERROR(LSM_LOG, "corrupt CURRENT in %s: does not name a MANIFEST", v->dir);
        lsm_buf_free(&cur);
        return KV_DATA_LOSS;
    }
    *end = '\0';
    lsm_buf_free(&cur);
    lsm_recovered st = {0};
    rv = slurp(v, name, &man);
    if (rv == KV_NOT_FOUND) {
        KV_ERROR(LSM_LOG, "MANIFEST %s/%s named by CURRENT is missing", v->dir, name);
        rv = KV_DATA_LOSS;
    }
    if (rv == KV_OK)
        rv = replay_manifest(v, name, &man, &st);
    lsm_buf_free(&man);
    if (rv != KV_OK) {
        lsm_edit_free(&st.state);
        return rv;
    }
    st.manifest = num;
    *out = st;
    return KV_OK;
}

static kv_err write_current(lsm_vol *v, uint64_t number)
{
    char buf[64];
    int n = snprintf(buf, sizeof(buf), "MANIFEST-%06" PRIu64 "\n", number);
    int fd = lsm_vol_open(v, "CURRENT.tmp", O_WRONLY | O_CREAT | O_TRUNC);
    if (fd < 0)
        return lsm_errno(fd);
    kv_err rv = lsm_vol_write(v, fd, buf, (size_t)n, 0, true);
    close(fd);
    if (rv == KV_OK && renameat(v->dirfd, "CURRENT.tmp", v->dirfd, "CURRENT") < 0)
        rv = lsm_errno(errno);
    if (rv == KV_OK)
        rv = lsm_vol_syncdir(v);
    return rv;
}

kv_err lsm_manifest_create(lsm_manifest **out, lsm_vol *v, uint64_t number,
                           const lsm_edit *snapshot, uint64_t old)
{
    char name[64];
    snprintf(name, sizeof(name), "MANIFEST-%06" PRIu64, number);
    lsm_manifest *m = calloc(1, sizeof(*m));
    lsm_buf payload = {0}, frame = {0};
    if (!m)
        return KV_RESOURCE_EXHAUSTED;
    m->v = v;
    m->number = number;
    m->fd = lsm_vol_open(v, name, O_WRONLY | O_CREAT | O_TRUNC);
    kv_err rv = m->fd < 0 ? lsm_errno(m->fd) : KV_OK;
    if (rv == KV_OK)
        rv = edit_encode(snapshot, &payload);
    if (rv == KV_OK)
        rv = man_frame(&frame, payload.p, payload.len);
    if (rv == KV_OK)
        rv = lsm_vol_write(v, m->fd, frame.p, frame.len, 0, true);
    if (rv == KV_OK)
        rv = write_current(v, number);
    m->off = frame.len;
    if (rv == KV_OK)
        man_reserve(m);
    lsm_buf_free(&payload);
    lsm_buf_free(&frame);
    if (rv != KV_OK) {
        KV_ERROR(LSM_LOG, "create MANIFEST %s/%s: %s", v->dir, name, kv_strerror(rv));
        if (m->fd >= 0) {
            close(m->fd);
            lsm_vol_unlink(v, name);
        }
        free(m);
        return rv;
    }
    if (old && old != number) {
        snprintf(name, sizeof(name), "MANIFEST-%06" PRIu64, old);
        lsm_vol_unlink(v, name);
    }
    *out = m;
    return KV_OK;
}

kv_err lsm_manifest_append(lsm_manifest *m, const lsm_edit *e)
{
    if (m->broken)
        return KV_INTERNAL;
    lsm_buf payload = {0}, frame = {0};
    kv_err rv = edit_encode(e, &payload);
    if (rv == KV_OK)
        rv = man_frame(&frame, payload.p, payload.len);
    if (rv == KV_OK)
        rv = lsm_vol_write(m->v, m->fd, frame.p, frame.len, m->off, true);
    if (rv == KV_OK) {
        m->off += frame.len;
        man_reserve(m);
    } else {
        m->reserved = m->off; /* the cut drops the room set aside past it */
        if (lsm_vol_truncate(m->v, m->fd, m->off) != KV_OK) {
            /* a torn edit would stay before the next one: never append again */
            KV_ERROR(LSM_LOG,
                     "%s/MANIFEST-%06" PRIu64 ": cannot cut a failed append off at %" PRIu64
                     "; a new MANIFEST is needed",
                     m->v->dir, m->number, m->off);
            m->broken = true;
        }
    }
    lsm_buf_free(&payload);
    lsm_buf_free(&frame);
    return rv;
}

bool lsm_manifest_broken(const lsm_manifest *m)
{
    return m->broken;
}

uint64_t lsm_manifest_size(const lsm_manifest *m)
{
    return m->off;
}

uint64_t lsm_manifest_number(const lsm_manifest *m)
{
    return m->number;
}

void lsm_manifest_close(lsm_manifest *m)
{
    if (!m)
        return;
    if (m->reserved > m->off && !m->broken) /* a closed store takes only its bytes */
        (void)lsm_vol_truncate(m->v, m->fd, m->off);
    close(m->fd);
    free(m);
}
