/* SPDX-License-Identifier: MIT */
/*
 * Durable hinted-handoff store (see hints.h). Layout under opts.dir: one
 * directory per target holding segment files <016x number>.hint and a file
 * `meta` ("hotkv-hints 1 / lost L / dropped D", replaced atomically: tmp +
 * fdatasync + rename + fsync of the directory). A segment is a sequence of
 * frames [u32 crc32c(len || add_ms || payload)][u32 len][u64 add_ms][payload],
 * the WAL's framing (node/lsm/wal.c) with the add time; the CRC and the
 * volume I/O helpers are the LSM's.
 *
 * Appends use the WAL's group commit (leader/follower): a caller encodes its
 * frames outside the lock and queues them on its target; whoever finds no
 * write in flight leads, writing the whole queue with one pwrite +
 * fdatasync to the target's active segment (rotated past seg_bytes) and
 * completing every waiter of the group. A failed write truncates the segment
 * back. Bytes are reserved against max_bytes (one CAS on the store's total)
 * before queueing, so concurrent adds never overshoot.
 *
 * Replay and expiry share one drain loop. They run one at a time per target
 * (`busy`), read segments with no lock held (only bytes committed before the
 * drain began), and acknowledge in memory by moving a segment's head; a
 * segment whose hints are all acknowledged or dropped is unlinked (a crash
 * before that replays its hints again, which the receiver tolerates).
 * Removing or sealing the active segment first stops new leaders (`hold`)
 * and waits for the running write. Lock order: h->mu, then t->meta_mu, then
 * t->mu; no lock is held across I/O except meta_mu (meta files, directory
 * creation and forget's deletions, all per target).
 *
 * Recovery reads every segment: a bad frame with no valid frame after it is
 * a torn or corrupt tail and is truncated; one followed by a valid frame is
 * corruption in the middle: what follows stays on disk unread until the
 * segment's readable part is done (logged, counted, target marked lost).
 */
#include "node/hints.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/lsm/lsm_int.h"

#define LOG "hints"
#define FRAME_HDR 16u
#define SEG_DEFAULT (4u << 20)
#define READ_CHUNK (1u << 20)
#define SEG_SUFFIX ".hint"
#define SEG_NAME_LEN 21 /* 16 hex digits + ".hint" */
#define META "meta"
#define META_TMP "meta.tmp"
#define LOCK_NAME "~lock" /* '~' is not allowed in a target name */

typedef struct seg {
    uint64_t number;
    uint64_t end;  /* bytes of readable frames; appends go here */
    uint64_t file; /* bytes of the file (> end when a corrupt rest is kept) */
    uint64_t head; /* offset of the first hint neither acknowledged nor dropped */
    uint64_t live; /* hints in [head, end) */
    uint64_t head_ms, max_ms;
} seg;

typedef struct waiter {
    kv_err rv;
    bool done;
    struct waiter *next;
} waiter;

typedef enum busy_kind { IDLE, REPLAY, EXPIRE, FORGET } busy_kind;

typedef struct target {
    char name[HINT_TARGET_MAX + 1];
    unsigned refs;           /* under h->mu */
    pthread_mutex_t meta_mu; /* meta file, directory creation, forget's deletions */
    lsm_vol vol;             /* the directory; under meta_mu, fixed while it has segments */
    bool has_vol;
    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;
    seg *segs; /* by number; the last one is active when fd >= 0 */
    size_t nsegs, cap;
    int fd;
    uint64_t next_number;
    lsm_buf pending; /* frames queued for the next group write */
    waiter *waiters;
    uint64_t pend_n, pend_first_ms, pend_max_ms;
    bool writing;  /* a leader is writing */
    unsigned hold; /* > 0: no new leader (the active segment is being changed) */
    busy_kind busy;
    bool cancel; /* forget asks the running drain to stop */
    uint64_t dropped, replayed, corrupt;
    bool lost;
    uint64_t meta_seq, meta_saved; /* changes of lost/dropped, and the last persisted */
} target;

struct hint_store {
    lsm_vol root;
    int lock_fd;
    uint64_t max_bytes, window_ms, seg_bytes;
    uint64_t (*now_ms)(void *arg);
    void *now_arg;
    pthread_mutex_t mu; /* targets (sorted by name) and their refs */
    target **targets;
    size_t ntargets, cap;
    _Atomic uint64_t total; /* bytes of segment files plus reservations in flight */
};

/* ---- small helpers ---- */

static bool name_ok(const char *s)
{
    if (!s)
        return false;
    size_t n = strnlen(s, HINT_TARGET_MAX + 1);
    if (n == 0 || n > HINT_TARGET_MAX || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

static void seg_name(char *buf, size_t cap, uint64_t number)
{
    snprintf(buf, cap, "%016" PRIx64 SEG_SUFFIX, number);
}

static uint64_t now_ms(hint_store *h)
{
    return h->now_ms ? h->now_ms(h->now_arg) : kv_wall_ms();
}

/* Hints added before the returned time are expired; 0 = none are. */
static uint64_t cutoff_ms(hint_store *h)
{
    uint64_t now = now_ms(h);
    return h->window_ms && now > h->window_ms ? now - h->window_ms : 0;
}

static bool known(const target *t)
{
    return t->nsegs || t->lost || t->dropped || t->replayed || t->corrupt;
}

static bool is_active(const target *t, const seg *s)
{
    return t->fd >= 0 && s == &t->segs[t->nsegs - 1];
}

static seg *seg_find(target *t, uint64_t number)
{
    for (size_t i = 0; i < t->nsegs; i++)
        if (t->segs[i].number == number)
            return &t->segs[i];
    return NULL;
}

static kv_err seg_reserve(target *t)
{
    if (t->nsegs < t->cap)
        return KV_OK;
    size_t cap = t->cap ? t->cap * 2 : 4;
    seg *s = realloc(t->segs, cap * sizeof(*s));
    if (!s)
        return KV_RESOURCE_EXHAUSTED;
    t->segs = s;
    t->cap = cap;
    return KV_OK;
}

/* With t->mu held: hints of t were lost (n of them counted as dropped). */
static void note_lost(target *t, uint64_t n)
{
    if (!t->lost)
        KV_WARN(LOG, "target %s marked lost: hints dropped, a repair is needed", t->name);
    t->dropped += n;
    t->lost = true;
    t->meta_seq++;
}

/* With t->mu held: keeps new leaders out and waits for the running write. */
static void quiesce(target *t)
{
    t->hold++;
    while (t->writing)
        pthread_cond_wait(&t->cv, &t->mu);
}

static void unquiesce(target *t)
{
    if (--t->hold == 0)
        pthread_cond_broadcast(&t->cv);
}

/* Reserves bytes against max_bytes; RESOURCE_EXHAUSTED when they do not fit. */
static kv_err reserve(hint_store *h, uint64_t bytes)
{
    uint64_t cur = atomic_load(&h->total);
    do {
        if (h->max_bytes && (bytes > h->max_bytes || cur > h->max_bytes - bytes))
            return KV_RESOURCE_EXHAUSTED;
        /* CAS: on failure cur is reloaded and the bound checked again, so the
         * sum of successful reservations never passes max_bytes. */
    } while (!atomic_compare_exchange_weak(&h->total, &cur, cur + bytes));
    return KV_OK;
}

static void release(hint_store *h, uint64_t bytes)
{
    atomic_fetch_sub(&h->total, bytes);
}

/* ---- targets ---- */

static target *target_new(const char *name)
{
    target *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->fd = -1;
    t->vol.dirfd = -1;
    t->next_number = 1;
    pthread_mutex_init(&t->meta_mu, NULL);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    return t;
}

static void target_free(target *t)
{
    if (t->fd >= 0)
        close(t->fd);
    lsm_vol_fini(&t->vol);
    free(t->segs);
    lsm_buf_free(&t->pending);
    pthread_mutex_destroy(&t->meta_mu);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

/* With h->mu held: index of name in h->targets, or where it would go. */
static size_t find_slot(hint_store *h, const char *name, bool *found)
{
    size_t lo = 0, hi = h->ntargets;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(h->targets[mid]->name, name);
        if (c == 0) {
            *found = true;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *found = false;
    return lo;
}

/* With h->mu held: inserts t at slot i. */
static kv_err table_insert(hint_store *h, size_t i, target *t)
{
    if (h->ntargets == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 8;
        target **p = realloc(h->targets, cap * sizeof(*p));
        if (!p)
            return KV_RESOURCE_EXHAUSTED;
        h->targets = p;
        h->cap = cap;
    }
    memmove(h->targets + i + 1, h->targets + i, (h->ntargets - i) * sizeof(*h->targets));
    h->targets[i] = t;
    h->ntargets++;
    return KV_OK;
}

/* Takes a reference on target name, creating an empty one when asked;
 * NOT_FOUND otherwise, INVALID_ARGUMENT for a bad name. */
static kv_err target_get(hint_store *h, const char *name, bool create, target **out)
{
    if (!h || !name_ok(name))
        return KV_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->mu);
    bool found;
    size_t i = find_slot(h, name, &found);
    kv_err rv = found ? KV_OK : create ? KV_RESOURCE_EXHAUSTED : KV_NOT_FOUND;
    if (!found && create) {
        target *t = target_new(name);
        rv = t ? table_insert(h, i, t) : KV_RESOURCE_EXHAUSTED;
        if (t && rv != KV_OK)
            target_free(t);
    }
    if (rv == KV_OK) {
        h->targets[i]->refs++;
        *out = h->targets[i];
    }
    pthread_mutex_unlock(&h->mu);
    return rv;
}

/* Drops a reference; a target nothing is known of goes with its last one. */
static void target_put(hint_store *h, target *t)
{
    pthread_mutex_lock(&h->mu);
    bool drop = --t->refs == 0;
    if (drop) {
        pthread_mutex_lock(&t->mu);
        drop = !known(t) && !t->waiters && !t->writing;
        pthread_mutex_unlock(&t->mu);
    }
    if (drop) {
        bool found;
        size_t i = find_slot(h, t->name, &found);
        memmove(h->targets + i, h->targets + i + 1, (h->ntargets - i - 1) * sizeof(*h->targets));
        h->ntargets--;
    }
    pthread_mutex_unlock(&h->mu);
    if (drop)
        target_free(t);
}

/* target_get for a target something is known of (NOT_FOUND otherwise). */
static kv_err target_known(hint_store *h, const char *name, target **out)
{
    target *t;
    kv_err rv = target_get(h, name, false, &t);
    if (rv != KV_OK)
        return rv;
    pthread_mutex_lock(&t->mu);
    bool k = known(t);
    pthread_mutex_unlock(&t->mu);
    if (!k) {
        target_put(h, t);
        return KV_NOT_FOUND;
    }
    *out = t;
    return KV_OK;
}

/* ---- directories and the meta file ---- */

/* With t->meta_mu held: creates t's directory (durably) if it is not open. */
static kv_err ensure_dir_locked(hint_store *h, target *t)
{
    if (t->has_vol)
        return KV_OK;
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", h->root.dir, t->name);
    kv_err rv = lsm_vol_init(&t->vol, path, LSM_TIER_FD, false);
    if (rv == KV_OK)
        rv = lsm_vol_syncdir(&h->root);
    if (rv != KV_OK) {
        KV_ERROR(LOG, "create %s: %s", path, kv_strerror(rv));
        lsm_vol_fini(&t->vol);
        return rv;
    }
    t->has_vol = true;
    return KV_OK;
}

static kv_err ensure_dir(hint_store *h, target *t)
{
    pthread_mutex_lock(&t->meta_mu);
    kv_err rv = ensure_dir_locked(h, t);
    pthread_mutex_unlock(&t->meta_mu);
    return rv;
}

static kv_err meta_write(target *t, bool lost, uint64_t dropped)
{
    char buf[128];
    int len =
        snprintf(buf, sizeof(buf), "hotkv-hints 1\nlost %d\ndropped %" PRIu64 "\n", lost, dropped);
    int fd = lsm_vol_open(&t->vol, META_TMP, O_WRONLY | O_CREAT | O_TRUNC);
    if (fd < 0)
        return lsm_errno(fd);
    kv_err rv = lsm_vol_write(&t->vol, fd, buf, (size_t)len, 0, true);
    close(fd);
    if (rv == KV_OK && renameat(t->vol.dirfd, META_TMP, t->vol.dirfd, META) < 0)
        rv = lsm_errno(errno);
    if (rv == KV_OK)
        rv = lsm_vol_syncdir(&t->vol);
    return rv;
}

/* Persists t's lost mark and dropped counter if they changed since the last
 * save (concurrent saves coalesce). */
static kv_err meta_save(hint_store *h, target *t)
{
    pthread_mutex_lock(&t->meta_mu);
    pthread_mutex_lock(&t->mu);
    uint64_t seq = t->meta_seq, dropped = t->dropped;
    bool lost = t->lost, todo = seq != t->meta_saved;
    pthread_mutex_unlock(&t->mu);
    kv_err rv = todo ? ensure_dir_locked(h, t) : KV_OK;
    if (todo && rv == KV_OK)
        rv = meta_write(t, lost, dropped);
    if (todo && rv == KV_OK) {
        pthread_mutex_lock(&t->mu);
        t->meta_saved = seq > t->meta_saved ? seq : t->meta_saved;
        pthread_mutex_unlock(&t->mu);
    } else if (rv != KV_OK) {
        KV_ERROR(LOG, "target %s: cannot persist the lost mark and dropped counter: %s", t->name,
                 kv_strerror(rv));
    }
    pthread_mutex_unlock(&t->meta_mu);
    return rv;
}

/* Reads t's meta file; an unreadable one marks t lost (hints may be gone). */
static void meta_load(target *t)
{
    int fd = lsm_vol_open(&t->vol, META, O_RDONLY);
    if (fd == -ENOENT)
        return;
    char buf[256];
    ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf) - 1, 0) : -1;
    if (fd >= 0)
        close(fd);
    int lost = 0;
    uint64_t dropped = 0;
    if (n > 0)
        buf[n] = '\0';
    if (n <= 0 || sscanf(buf, "hotkv-hints 1 lost %d dropped %" SCNu64, &lost, &dropped) != 2) {
        KV_ERROR(LOG, "%s/%s is unreadable: target %s marked lost", t->vol.dir, META, t->name);
        t->lost = true;
        t->meta_seq++;
        return;
    }
    t->lost = lost != 0;
    t->dropped = dropped;
}

typedef bool (*name_filter)(int dirfd, const char *name);

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* The names in v's directory that keep accepts, sorted; *out malloc'ed. */
static kv_err list_dir(lsm_vol *v, name_filter keep, char ***out, size_t *n)
{
    int fd = dup(v->dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return lsm_errno(errno);
    }
    rewinddir(d);
    char **names = NULL;
    size_t cnt = 0, cap = 0;
    kv_err rv = KV_OK;
    for (struct dirent *e; rv == KV_OK && (e = readdir(d));) {
        if (!keep(v->dirfd, e->d_name))
            continue;
        if (cnt == cap) {
            char **p = realloc(names, (cap ? cap * 2 : 16) * sizeof(*p));
            if (!p) {
                rv = KV_RESOURCE_EXHAUSTED;
                break;
            }
            names = p;
            cap = cap ? cap * 2 : 16;
        }
        if (!(names[cnt] = strdup(e->d_name)))
            rv = KV_RESOURCE_EXHAUSTED;
        else
            cnt++;
    }
    closedir(d);
    if (rv != KV_OK) {
        free_names(names, cnt);
        return rv;
    }
    if (cnt)
        qsort(names, cnt, sizeof(*names), cmp_name);
    *out = names;
    *n = cnt;
    return KV_OK;
}

/* Calls fn on each name of v's directory that keep accepts, in sorted
 * order, up to the first error. */
static kv_err each_name(lsm_vol *v, name_filter keep, kv_err (*fn)(void *arg, const char *name),
                        void *arg)
{
    char **names = NULL;
    size_t n = 0;
    kv_err rv = list_dir(v, keep, &names, &n);
    for (size_t i = 0; rv == KV_OK && i < n; i++)
        rv = fn(arg, names[i]);
    free_names(names, n);
    return rv;
}

static bool is_seg_file(int dirfd, const char *name)
{
    (void)dirfd;
    if (strlen(name) != SEG_NAME_LEN || strcmp(name + 16, SEG_SUFFIX) != 0)
        return false;
    for (int i = 0; i < 16; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return false;
    return true;
}

static bool is_target_dir(int dirfd, const char *name)
{
    struct stat st;
    return name_ok(name) && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
           S_ISDIR(st.st_mode);
}

/* ---- reading segments ---- */

typedef struct reader {
    lsm_vol *v;
    int fd;
    uint64_t size, boff;
    lsm_buf b;
} reader;

typedef struct frame {
    uint64_t next, ms;
    uint32_t len;
    const uint8_t *p;
} frame;

static kv_err rd_open(reader *r, target *t, uint64_t number, int flags)
{
    char name[32];
    seg_name(name, sizeof(name), number);
    *r = (reader){.v = &t->vol, .fd = lsm_vol_open(&t->vol, name, flags)};
    struct stat st;
    if (r->fd < 0 || fstat(r->fd, &st) < 0) {
        int e = r->fd < 0 ? -r->fd : errno;
        KV_ERROR(LOG, "open %s/%s: %s", t->vol.dir, name, strerror(e));
        if (r->fd >= 0)
            close(r->fd);
        return e == ENOENT ? KV_NOT_FOUND : lsm_errno(e);
    }
    r->size = (uint64_t)st.st_size;
    return KV_OK;
}

static void rd_close(reader *r)
{
    close(r->fd);
    lsm_buf_free(&r->b);
}

/* Makes [off, off + n) available at *out; DATA_LOSS past the end. */
static kv_err rd_get(reader *r, uint64_t off, size_t n, const uint8_t **out)
{
    if (off + n > r->size)
        return KV_DATA_LOSS;
    if (off >= r->boff && off + n <= r->boff + r->b.len) {
        *out = r->b.p + (off - r->boff);
        return KV_OK;
    }
    size_t want = n > READ_CHUNK ? n : READ_CHUNK;
    if (want > r->size - off)
        want = (size_t)(r->size - off);
    r->b.len = 0;
    kv_err rv = lsm_buf_reserve(&r->b, want);
    if (rv == KV_OK)
        rv = lsm_vol_pread(r->v, r->fd, r->b.p, want, off);
    if (rv != KV_OK)
        return rv;
    r->b.len = want;
    r->boff = off;
    *out = r->b.p;
    return KV_OK;
}

/* Reads and verifies the frame at off: DATA_LOSS when it is bad or incomplete. */
static kv_err rd_frame(reader *r, uint64_t off, frame *f)
{
    const uint8_t *p;
    kv_err rv = rd_get(r, off, FRAME_HDR, &p);
    if (rv != KV_OK)
        return rv;
    uint32_t len = lsm_get32(p + 4);
    if (len == 0 || len > HINT_MAX_LEN)
        return KV_DATA_LOSS;
    if ((rv = rd_get(r, off, FRAME_HDR + len, &p)) != KV_OK)
        return rv;
    if (lsm_crc32c(0, p + 4, FRAME_HDR - 4 + (size_t)len) != lsm_get32(p))
        return KV_DATA_LOSS;
    *f = (frame){
        .next = off + FRAME_HDR + len, .ms = lsm_get64(p + 8), .len = len, .p = p + FRAME_HDR};
    return KV_OK;
}

/* The add time of the frame at off (read again: it may have been appended
 * since the reader opened), 0 when there is none. */
static uint64_t peek_ms(reader *r, uint64_t off)
{
    struct stat st;
    if (fstat(r->fd, &st) == 0)
        r->size = (uint64_t)st.st_size;
    frame f;
    return rd_frame(r, off, &f) == KV_OK ? f.ms : 0;
}

/* ---- recovery ---- */

static bool valid_frame_after(reader *r, uint64_t off)
{
    frame f;
    for (uint64_t at = off + 1; at + FRAME_HDR < r->size; at++)
        if (rd_frame(r, at, &f) == KV_OK)
            return true;
    return false;
}

/* The frame at s->end is bad: a tail is truncated, corruption in the middle
 * leaves the rest unread. */
static kv_err bad_frame(target *t, reader *r, seg *s)
{
    char name[32];
    seg_name(name, sizeof(name), s->number);
    if (valid_frame_after(r, s->end)) {
        KV_ERROR(LOG,
                 "%s/%s: corrupt frame at offset %" PRIu64 "; the %" PRIu64
                 " bytes from there are kept but not replayed",
                 t->vol.dir, name, s->end, s->file - s->end);
        t->corrupt++;
        note_lost(t, 0);
        return KV_OK;
    }
    KV_WARN(LOG, "%s/%s: torn or corrupt tail at offset %" PRIu64 ", truncating %" PRIu64 " bytes",
            t->vol.dir, name, s->end, s->file - s->end);
    if (ftruncate(r->fd, (off_t)s->end) < 0 || fsync(r->fd) < 0) {
        KV_ERROR(LOG, "truncate %s/%s: %s", t->vol.dir, name, strerror(errno));
        return lsm_errno(errno);
    }
    s->file = s->end;
    return KV_OK;
}

/* Reads a segment found on disk into *s. */
static kv_err scan_seg(target *t, uint64_t number, seg *s)
{
    reader r;
    kv_err rv = rd_open(&r, t, number, O_RDWR);
    if (rv != KV_OK)
        return rv;
    *s = (seg){.number = number, .file = r.size};
    frame f;
    while (s->end < r.size && (rv = rd_frame(&r, s->end, &f)) == KV_OK) {
        if (s->live++ == 0)
            s->head_ms = f.ms;
        s->max_ms = f.ms > s->max_ms ? f.ms : s->max_ms;
        s->end = f.next;
    }
    if (rv == KV_DATA_LOSS)
        rv = bad_frame(t, &r, s);
    rd_close(&r);
    return rv;
}

/* Recovers segment file name of target arg (called in number order). */
static kv_err recover_seg(void *arg, const char *name)
{
    target *t = arg;
    uint64_t number = strtoull(name, NULL, 16);
    seg s;
    kv_err rv = scan_seg(t, number, &s);
    if (rv != KV_OK)
        return rv;
    t->next_number = number + 1;
    if (s.file == 0) {
        lsm_vol_unlink(&t->vol, name);
        return KV_OK;
    }
    if ((rv = seg_reserve(t)) == KV_OK)
        t->segs[t->nsegs++] = s;
    return rv;
}

/* Removes t's directory (its segments are gone); INTERNAL if it cannot. */
static kv_err remove_dir(hint_store *h, target *t)
{
    kv_err rv = KV_OK;
    const char *files[] = {META, META_TMP};
    for (size_t i = 0; i < 2; i++) {
        int e = lsm_vol_unlink(&t->vol, files[i]);
        if (e < 0 && e != -ENOENT)
            rv = lsm_errno(e);
    }
    lsm_vol_fini(&t->vol);
    t->has_vol = false;
    if (unlinkat(h->root.dirfd, t->name, AT_REMOVEDIR) < 0 && errno != ENOENT) {
        KV_WARN(LOG, "remove %s/%s: %s", h->root.dir, t->name, strerror(errno));
        rv = KV_INTERNAL;
    }
    return rv;
}

static kv_err recover_target(void *arg, const char *name)
{
    hint_store *h = arg;
    target *t = target_new(name);
    if (!t)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = ensure_dir_locked(h, t); /* not shared yet */
    if (rv == KV_OK) {
        meta_load(t);
        lsm_vol_unlink(&t->vol, META_TMP);
        rv = each_name(&t->vol, is_seg_file, recover_seg, t);
    }
    if (rv == KV_OK && !known(t)) {
        remove_dir(h, t);
        target_free(t);
        return KV_OK;
    }
    bool found;
    if (rv == KV_OK)
        rv = table_insert(h, find_slot(h, name, &found), t);
    if (rv != KV_OK) {
        target_free(t);
        return rv;
    }
    for (size_t i = 0; i < t->nsegs; i++)
        atomic_fetch_add(&h->total, t->segs[i].file);
    meta_save(h, t); /* a mark found by recovery; failure is logged */
    return KV_OK;
}

/* One handle per directory: an exclusive flock on LOCK_NAME. */
static kv_err lock_root(hint_store *h)
{
    h->lock_fd = lsm_vol_open(&h->root, LOCK_NAME, O_RDWR | O_CREAT);
    if (h->lock_fd < 0)
        return lsm_errno(h->lock_fd);
    if (flock(h->lock_fd, LOCK_EX | LOCK_NB) < 0)
        return errno == EWOULDBLOCK ? KV_FAILED_PRECONDITION : lsm_errno(errno);
    return KV_OK;
}

kv_err hint_store_open(hint_store **out, const hint_opts *o, char *err, size_t errlen)
{
    if (!out || !o || !o->dir || !*o->dir) {
        snprintf(err, errlen, "hint store: no directory given");
        return KV_INVALID_ARGUMENT;
    }
    hint_store *h = calloc(1, sizeof(*h));
    if (!h) {
        snprintf(err, errlen, "hint store: out of memory");
        return KV_RESOURCE_EXHAUSTED;
    }
    h->lock_fd = -1;
    h->max_bytes = o->max_bytes;
    h->window_ms = o->window_ms;
    h->seg_bytes = o->seg_bytes ? o->seg_bytes : SEG_DEFAULT;
    h->now_ms = o->now_ms;
    h->now_arg = o->now_arg;
    pthread_mutex_init(&h->mu, NULL);
    kv_err rv = lsm_vol_init(&h->root, o->dir, LSM_TIER_FD, false);
    if (rv != KV_OK)
        snprintf(err, errlen, "hint store: cannot create or open %s (%s)", o->dir, kv_strerror(rv));
    else if ((rv = lock_root(h)) != KV_OK)
        snprintf(err, errlen, "hint store %s: %s", o->dir,
                 rv == KV_FAILED_PRECONDITION ? "in use by another handle or process"
                                              : "cannot lock it");
    else if ((rv = each_name(&h->root, is_target_dir, recover_target, h)) != KV_OK)
        snprintf(err, errlen, "hint store %s: recovery failed (%s), see the log", o->dir,
                 kv_strerror(rv));
    if (rv != KV_OK) {
        hint_store_close(h);
        return rv;
    }
    KV_INFO(LOG, "hint store %s: %zu targets, %" PRIu64 " bytes", o->dir, h->ntargets,
            atomic_load(&h->total));
    *out = h;
    return KV_OK;
}

void hint_store_close(hint_store *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->ntargets; i++)
        target_free(h->targets[i]);
    free(h->targets);
    if (h->lock_fd >= 0)
        close(h->lock_fd); /* releases the flock */
    lsm_vol_fini(&h->root);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

/* ---- add: group commit ---- */

static bool hints_ok(const uint8_t *const *hints, const size_t *lens, size_t n)
{
    if (n == 0 || !hints || !lens)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!hints[i] || lens[i] == 0 || lens[i] > HINT_MAX_LEN)
            return false;
    return true;
}

static kv_err encode(lsm_buf *b, const uint8_t *const *hints, const size_t *lens, size_t n,
                     uint64_t ms)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += FRAME_HDR + lens[i];
    kv_err rv = lsm_buf_reserve(b, total);
    if (rv != KV_OK)
        return rv;
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = b->p + b->len;
        lsm_set32(p + 4, (uint32_t)lens[i]);
        lsm_set64(p + 8, ms);
        memcpy(p + FRAME_HDR, hints[i], lens[i]);
        lsm_set32(p, lsm_crc32c(0, p + 4, FRAME_HDR - 4 + lens[i]));
        b->len += FRAME_HDR + lens[i];
    }
    return KV_OK;
}

static kv_err seg_create(hint_store *h, target *t, uint64_t number, int *fd)
{
    kv_err rv = ensure_dir(h, t);
    if (rv != KV_OK)
        return rv;
    char name[32];
    seg_name(name, sizeof(name), number);
    int f = lsm_vol_open(&t->vol, name, O_WRONLY | O_CREAT | O_EXCL);
    if (f < 0) {
        KV_ERROR(LOG, "create %s/%s: %s", t->vol.dir, name, strerror(-f));
        return lsm_errno(f);
    }
    if ((rv = lsm_vol_syncdir(&t->vol)) != KV_OK) {
        close(f);
        lsm_vol_unlink(&t->vol, name);
        return rv;
    }
    *fd = f;
    return KV_OK;
}

/* Writes the group at off and syncs it; a failed write is cut off again. */
static kv_err seg_append(target *t, int fd, const lsm_buf *b, uint64_t off)
{
    kv_err rv = lsm_vol_write(&t->vol, fd, b->p, b->len, off, true);
    if (rv != KV_OK) {
        KV_ERROR(LOG, "target %s: write of %zu bytes failed: %s", t->name, b->len, kv_strerror(rv));
        if (ftruncate(fd, (off_t)off) < 0)
            KV_ERROR(LOG, "target %s: truncate after a failed write: %s", t->name, strerror(errno));
    }
    return rv;
}

/* With t->mu held: makes the new segment number (open as fd) the active one. */
static void seg_install(target *t, uint64_t number, int fd)
{
    if (t->fd >= 0)
        close(t->fd); /* the previous segment is sealed */
    t->segs[t->nsegs++] = (seg){.number = number};
    t->fd = fd;
    t->next_number = number + 1;
}

/* Called with t->mu held, !writing and !hold: writes the queued group. */
static void lead(hint_store *h, target *t)
{
    t->writing = true;
    lsm_buf buf = t->pending;
    waiter *group = t->waiters;
    uint64_t n = t->pend_n, first = t->pend_first_ms, max = t->pend_max_ms;
    t->pending = (lsm_buf){0};
    t->waiters = NULL;
    t->pend_n = 0;
    seg *last = t->nsegs ? &t->segs[t->nsegs - 1] : NULL;
    bool fresh = t->fd < 0 || (last->end > 0 && last->end + buf.len > h->seg_bytes);
    uint64_t off = fresh ? 0 : last->end, number = t->next_number;
    int fd = t->fd;
    kv_err rv = fresh ? seg_reserve(t) : KV_OK;
    pthread_mutex_unlock(&t->mu);

    if (rv == KV_OK && fresh)
        rv = seg_create(h, t, number, &fd);
    bool created = fresh && rv == KV_OK;
    if (rv == KV_OK)
        rv = seg_append(t, fd, &buf, off);

    pthread_mutex_lock(&t->mu);
    if (created)
        seg_install(t, number, fd);
    if (rv == KV_OK) {
        last = &t->segs[t->nsegs - 1];
        if (last->live == 0)
            last->head_ms = first;
        last->live += n;
        last->end += buf.len;
        last->file += buf.len;
        last->max_ms = max > last->max_ms ? max : last->max_ms;
    }
    for (waiter *w = group; w; w = w->next) {
        w->rv = rv;
        w->done = true;
    }
    lsm_buf_free(&buf);
    t->writing = false;
    pthread_cond_broadcast(&t->cv);
}

/* Queues n encoded frames added at ms and waits until their group is written. */
static kv_err commit(hint_store *h, target *t, const lsm_buf *frames, size_t n, uint64_t ms)
{
    waiter me = {.rv = KV_OK};
    pthread_mutex_lock(&t->mu);
    if (t->pending.len == 0) {
        t->pend_first_ms = ms;
        t->pend_max_ms = ms;
    }
    kv_err rv = lsm_buf_put(&t->pending, frames->p, frames->len);
    if (rv == KV_OK) {
        t->pend_max_ms = ms > t->pend_max_ms ? ms : t->pend_max_ms;
        t->pend_n += n;
        me.next = t->waiters;
        t->waiters = &me;
        while (!me.done) {
            if (!t->writing && !t->hold)
                lead(h, t);
            else
                pthread_cond_wait(&t->cv, &t->mu);
        }
        rv = me.rv;
    }
    pthread_mutex_unlock(&t->mu);
    return rv;
}

kv_err hint_store_add(hint_store *h, const char *name, const uint8_t *const *hints,
                      const size_t *lens, size_t n)
{
    if (!hints_ok(hints, lens, n))
        return KV_INVALID_ARGUMENT;
    target *t;
    kv_err rv = target_get(h, name, true, &t);
    if (rv != KV_OK)
        return rv;
    lsm_buf frames = {0};
    uint64_t ms = now_ms(h);
    if ((rv = encode(&frames, hints, lens, n, ms)) == KV_OK &&
        (rv = reserve(h, frames.len)) == KV_OK) {
        rv = commit(h, t, &frames, n, ms);
        if (rv != KV_OK)
            release(h, frames.len);
    }
    lsm_buf_free(&frames);
    if (rv != KV_OK) {
        KV_DEBUG(LOG, "target %s: %zu hints not stored: %s", name, n, kv_strerror(rv));
        pthread_mutex_lock(&t->mu);
        note_lost(t, n);
        pthread_mutex_unlock(&t->mu);
        meta_save(h, t);
    }
    target_put(h, t);
    return rv;
}

/* ---- drain: replay and expiry ---- */

typedef struct drain {
    hint_send_fn send; /* NULL: expire only, stop at the first hint not expired */
    void *arg;
    size_t max_batch;
    uint64_t cutoff;              /* hints added before it are dropped; 0 = none */
    uint64_t end_number, end_off; /* what was durable when the drain began */
    bool dropping;                /* the current run: n frames ending at to */
    uint64_t to, n, payload;      /* payload: bytes of the run's hints */
    lsm_buf data;                 /* their copies (sent runs) */
    size_t *offs, *lens, cap;
    const uint8_t **ptrs;
    uint64_t sent, dropped;
} drain;

typedef struct cursor {
    uint64_t number, head, limit;
} cursor;

enum { STEP_READ, STEP_AGAIN, STEP_END };

static void drain_free(drain *d)
{
    lsm_buf_free(&d->data);
    free(d->offs);
    free(d->lens);
    free(d->ptrs);
}

static kv_err run_add(drain *d, const frame *f)
{
    if (!d->dropping && d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        size_t *o = realloc(d->offs, cap * sizeof(*o));
        d->offs = o ? o : d->offs;
        size_t *l = o ? realloc(d->lens, cap * sizeof(*l)) : NULL;
        d->lens = l ? l : d->lens;
        const uint8_t **p = l ? realloc(d->ptrs, cap * sizeof(*p)) : NULL;
        d->ptrs = p ? p : d->ptrs;
        if (!p)
            return KV_RESOURCE_EXHAUSTED;
        d->cap = cap;
    }
    if (!d->dropping) {
        d->offs[d->n] = d->data.len;
        d->lens[d->n] = f->len;
        kv_err rv = lsm_buf_put(&d->data, f->p, f->len);
        if (rv != KV_OK)
            return rv;
        d->payload += f->len;
    }
    d->n++;
    d->to = f->next;
    return KV_OK;
}

/* Acknowledges the run in segment number; ABORTED when forget is waiting. */
static kv_err advance(target *t, drain *d, uint64_t number, uint64_t next_ms)
{
    pthread_mutex_lock(&t->mu);
    seg *s = seg_find(t, number);
    if (s) {
        s->head = d->to;
        s->live = s->live > d->n ? s->live - d->n : 0;
        s->head_ms = !s->live ? 0 : next_ms ? next_ms : s->max_ms;
    }
    if (d->dropping) {
        note_lost(t, d->n);
        d->dropped += d->n;
    } else {
        t->replayed += d->n;
        d->sent += d->n;
    }
    kv_err rv = t->cancel ? KV_ABORTED : KV_OK;
    pthread_mutex_unlock(&t->mu);
    return rv;
}

/* Sends (or drops) the current run and acknowledges it. */
static kv_err run_flush(target *t, drain *d, reader *r, uint64_t number)
{
    if (d->n == 0)
        return KV_OK;
    if (!d->dropping) {
        for (size_t i = 0; i < d->n; i++)
            d->ptrs[i] = d->data.p + d->offs[i];
        kv_err rv = d->send(d->arg, d->ptrs, d->lens, d->n);
        if (rv != KV_OK)
            return rv;
    }
    kv_err rv = advance(t, d, number, peek_ms(r, d->to));
    d->n = d->payload = 0;
    d->data.len = 0;
    return rv;
}

/* The frame at off of segment number is bad (found while draining): the
 * segment ends there; it is sealed if it was active. */
static void seg_corrupt(target *t, uint64_t number, uint64_t off)
{
    pthread_mutex_lock(&t->mu);
    seg *s = seg_find(t, number);
    if (!s) {
        pthread_mutex_unlock(&t->mu);
        return;
    }
    if (is_active(t, s)) {
        quiesce(t);
        s = seg_find(t, number);
        if (is_active(t, s)) {
            close(t->fd);
            t->fd = -1;
        }
        unquiesce(t);
    }
    KV_ERROR(LOG,
             "%s/%016" PRIx64 SEG_SUFFIX ": corrupt frame at offset %" PRIu64
             ", the rest of the segment is not replayed",
             t->vol.dir, number, off);
    s->end = off;
    s->live = 0;
    t->corrupt++;
    note_lost(t, 0);
    pthread_mutex_unlock(&t->mu);
}

/* Adds the frame f to the run, sending or dropping the run first when f
 * does not belong to it. *took: f was added. */
static kv_err run_take(target *t, drain *d, reader *r, uint64_t number, const frame *f, bool *took)
{
    bool old = d->cutoff && f->ms < d->cutoff;
    *took = false;
    if (d->n && (old != d->dropping || (!old && d->payload + f->len > d->max_batch)))
        return run_flush(t, d, r, number);
    d->dropping = old;
    *took = true;
    return run_add(d, f);
}

/* Drains segment c->number from c->head up to c->limit. *stop: expiry met a
 * hint that is not expired. A missing segment or a corrupt frame ends the
 * segment there. */
static kv_err drain_seg(target *t, drain *d, const cursor *c, bool *stop)
{
    reader r;
    kv_err rv = rd_open(&r, t, c->number, O_RDONLY);
    if (rv == KV_NOT_FOUND)
        seg_corrupt(t, c->number, c->head);
    if (rv != KV_OK)
        return rv == KV_NOT_FOUND ? KV_OK : rv;
    d->to = c->head;
    d->n = d->payload = 0;
    for (uint64_t off = c->head; rv == KV_OK && off < c->limit;) {
        frame f;
        if ((rv = rd_frame(&r, off, &f)) == KV_DATA_LOSS) {
            if ((rv = run_flush(t, d, &r, c->number)) == KV_OK)
                seg_corrupt(t, c->number, off);
            break;
        }
        if (rv == KV_OK && !d->send && !(d->cutoff && f.ms < d->cutoff)) {
            *stop = true;
            break;
        }
        bool took = false;
        if (rv == KV_OK && (rv = run_take(t, d, &r, c->number, &f, &took)) == KV_OK && took)
            off = f.next;
    }
    if (rv == KV_OK)
        rv = run_flush(t, d, &r, c->number);
    rd_close(&r);
    return rv;
}

static void seg_unlink(hint_store *h, target *t, const seg *s)
{
    char name[32];
    seg_name(name, sizeof(name), s->number);
    int e = lsm_vol_unlink(&t->vol, name);
    if (e < 0 && e != -ENOENT)
        KV_WARN(LOG, "delete %s/%s: %s", t->vol.dir, name, strerror(-e));
    release(h, s->file);
}

static bool seg_gone(const drain *d, const seg *s)
{
    return s->head >= s->end || (d->cutoff && s->max_ms < d->cutoff);
}

/* With t->mu held: removes the oldest segment, dropping its hints, if it
 * still has nothing to replay once the active segment is settled. */
static int seg_retire(hint_store *h, target *t, drain *d)
{
    bool held = is_active(t, &t->segs[0]);
    if (held)
        quiesce(t); /* a running write may still land in it */
    seg s = t->segs[0];
    bool gone = seg_gone(d, &s);
    if (gone) {
        if (s.live) {
            note_lost(t, s.live);
            d->dropped += s.live;
        }
        if (is_active(t, &t->segs[0])) {
            close(t->fd);
            t->fd = -1;
        }
        memmove(t->segs, t->segs + 1, (t->nsegs - 1) * sizeof(*t->segs));
        t->nsegs--;
    }
    if (held)
        unquiesce(t);
    if (gone) {
        pthread_mutex_unlock(&t->mu);
        seg_unlink(h, t, &s);
        pthread_mutex_lock(&t->mu);
    }
    return STEP_AGAIN;
}

/* With t->mu held: where the drain goes next. */
static int drain_next(hint_store *h, target *t, drain *d, cursor *c, kv_err *rv)
{
    if (t->cancel) {
        *rv = KV_ABORTED;
        return STEP_END;
    }
    if (!t->nsegs || t->segs[0].number > d->end_number)
        return STEP_END;
    seg *s = &t->segs[0];
    if (seg_gone(d, s))
        return seg_retire(h, t, d);
    c->number = s->number;
    c->head = s->head;
    c->limit = s->number == d->end_number && d->end_off < s->end ? d->end_off : s->end;
    return s->head < c->limit ? STEP_READ : STEP_END;
}

static kv_err drain_target(hint_store *h, target *t, drain *d)
{
    kv_err rv = KV_OK;
    bool stop = false;
    while (rv == KV_OK && !stop) {
        cursor c;
        pthread_mutex_lock(&t->mu);
        int step = drain_next(h, t, d, &c, &rv);
        pthread_mutex_unlock(&t->mu);
        if (step == STEP_END)
            break;
        if (step == STEP_READ)
            rv = drain_seg(t, d, &c, &stop);
    }
    return rv;
}

/* Claims t for a drain of kind k (a replay waits for an expiry or a forget;
 * FAILED_PRECONDITION when it cannot) and notes where the drain ends. */
static kv_err drain_begin(target *t, drain *d, busy_kind k)
{
    pthread_mutex_lock(&t->mu);
    while (k == REPLAY && (t->busy == EXPIRE || t->busy == FORGET))
        pthread_cond_wait(&t->cv, &t->mu);
    kv_err rv = t->busy == IDLE ? KV_OK : KV_FAILED_PRECONDITION;
    if (rv == KV_OK) {
        t->busy = k;
        seg *last = t->nsegs ? &t->segs[t->nsegs - 1] : NULL;
        d->end_number = last ? last->number : 0;
        d->end_off = last ? last->end : 0;
    }
    pthread_mutex_unlock(&t->mu);
    return rv;
}

static void drain_end(target *t)
{
    pthread_mutex_lock(&t->mu);
    t->busy = IDLE;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

kv_err hint_store_replay(hint_store *h, const char *name, hint_send_fn send, void *arg,
                         size_t max_batch_bytes, uint64_t *sent)
{
    if (!send)
        return KV_INVALID_ARGUMENT;
    target *t;
    kv_err rv = target_get(h, name, false, &t);
    if (rv != KV_OK) {
        if (rv == KV_NOT_FOUND && sent)
            *sent = 0;
        return rv == KV_NOT_FOUND ? KV_OK : rv;
    }
    drain d = {.send = send, .arg = arg, .max_batch = max_batch_bytes, .cutoff = cutoff_ms(h)};
    if ((rv = drain_begin(t, &d, REPLAY)) == KV_OK) {
        rv = drain_target(h, t, &d);
        drain_end(t);
    }
    drain_free(&d);
    meta_save(h, t);
    target_put(h, t);
    if (d.sent || d.dropped)
        KV_INFO(LOG, "target %s: replayed %" PRIu64 " hints, dropped %" PRIu64 " expired (%s)",
                name, d.sent, d.dropped, kv_strerror(rv));
    if (rv == KV_OK && sent)
        *sent = d.sent;
    return rv;
}

static kv_err expire_target(hint_store *h, target *t, uint64_t cutoff, uint64_t *count)
{
    drain d = {.cutoff = cutoff};
    if (drain_begin(t, &d, EXPIRE) != KV_OK)
        return KV_OK; /* being replayed (which drops them) or forgotten */
    kv_err rv = drain_target(h, t, &d);
    drain_end(t);
    drain_free(&d);
    if (rv == KV_ABORTED)
        rv = KV_OK;
    if (d.dropped) {
        KV_INFO(LOG, "target %s: dropped %" PRIu64 " expired hints", t->name, d.dropped);
        meta_save(h, t);
    }
    *count += d.dropped;
    return rv;
}

kv_err hint_store_expire(hint_store *h, uint64_t *dropped)
{
    if (!h || !dropped)
        return KV_INVALID_ARGUMENT;
    uint64_t cutoff = cutoff_ms(h), count = 0;
    pthread_mutex_lock(&h->mu);
    size_t n = cutoff ? h->ntargets : 0;
    target **ts = n ? malloc(n * sizeof(*ts)) : NULL;
    for (size_t i = 0; ts && i < n; i++) {
        ts[i] = h->targets[i];
        ts[i]->refs++;
    }
    pthread_mutex_unlock(&h->mu);
    if (n && !ts)
        return KV_RESOURCE_EXHAUSTED;
    kv_err rv = KV_OK;
    for (size_t i = 0; i < n; i++) {
        kv_err e = expire_target(h, ts[i], cutoff, &count);
        rv = rv == KV_OK ? e : rv;
        target_put(h, ts[i]);
    }
    free(ts);
    if (rv == KV_OK)
        *dropped = count;
    return rv;
}

/* ---- status and administration ---- */

/* With t->mu held. */
static void fill_info(const target *t, hint_target_info *o)
{
    memset(o, 0, sizeof(*o));
    snprintf(o->target, sizeof(o->target), "%s", t->name);
    for (size_t i = 0; i < t->nsegs; i++) {
        const seg *s = &t->segs[i];
        if (s->live && !o->records)
            o->oldest_ms = s->head_ms;
        o->records += s->live;
        o->bytes += s->file;
    }
    o->dropped = t->dropped;
    o->replayed = t->replayed;
    o->corrupt = t->corrupt;
    o->lost = t->lost;
    o->replaying = t->busy == REPLAY;
}

kv_err hint_store_list(hint_store *h, hint_target_info **out, size_t *n)
{
    if (!h || !out || !n)
        return KV_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->mu);
    hint_target_info *a = h->ntargets ? calloc(h->ntargets, sizeof(*a)) : NULL;
    if (h->ntargets && !a) {
        pthread_mutex_unlock(&h->mu);
        return KV_RESOURCE_EXHAUSTED;
    }
    size_t k = 0;
    for (size_t i = 0; i < h->ntargets; i++) {
        target *t = h->targets[i];
        pthread_mutex_lock(&t->mu);
        if (known(t))
            fill_info(t, &a[k++]);
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&h->mu);
    if (!k) {
        free(a);
        a = NULL;
    }
    *out = a;
    *n = k;
    return KV_OK;
}

kv_err hint_store_info(hint_store *h, const char *name, hint_target_info *out)
{
    if (!out)
        return KV_INVALID_ARGUMENT;
    target *t;
    kv_err rv = target_known(h, name, &t);
    if (rv != KV_OK)
        return rv;
    pthread_mutex_lock(&t->mu);
    fill_info(t, out);
    pthread_mutex_unlock(&t->mu);
    target_put(h, t);
    return KV_OK;
}

kv_err hint_store_clear_lost(hint_store *h, const char *name)
{
    target *t;
    kv_err rv = target_known(h, name, &t);
    if (rv != KV_OK)
        return rv;
    pthread_mutex_lock(&t->mu);
    if (t->lost) {
        t->lost = false;
        t->meta_seq++;
        KV_INFO(LOG, "target %s: lost mark cleared", name);
    }
    pthread_mutex_unlock(&t->mu);
    rv = meta_save(h, t);
    target_put(h, t);
    return rv;
}

/* With t->meta_mu held: deletes the n segments taken from t, then its
 * directory. */
static kv_err forget_files(hint_store *h, target *t, seg *segs, size_t n)
{
    if (!t->has_vol)
        return KV_OK;
    kv_err rv = KV_OK;
    for (size_t i = 0; i < n; i++)
        seg_unlink(h, t, &segs[i]);
    if (remove_dir(h, t) != KV_OK)
        rv = KV_INTERNAL;
    return rv;
}

kv_err hint_store_forget(hint_store *h, const char *name)
{
    target *t;
    kv_err rv = target_known(h, name, &t);
    if (rv != KV_OK)
        return rv;
    pthread_mutex_lock(&t->mu);
    t->cancel = true;
    while (t->busy != IDLE)
        pthread_cond_wait(&t->cv, &t->mu);
    t->busy = FORGET;
    t->cancel = false;
    quiesce(t);
    seg *segs = t->segs;
    size_t n = t->nsegs;
    t->segs = NULL;
    t->nsegs = t->cap = 0;
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    pthread_mutex_unlock(&t->mu);

    pthread_mutex_lock(&t->meta_mu);
    rv = forget_files(h, t, segs, n);
    pthread_mutex_lock(&t->mu);
    t->dropped = t->replayed = t->corrupt = 0;
    t->lost = false;
    t->meta_seq = t->meta_saved = 0;
    unquiesce(t);
    t->busy = IDLE;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&t->meta_mu);
    free(segs);
    KV_INFO(LOG, "target %s forgotten: %zu segments deleted", name, n);
    target_put(h, t);
    return rv;
}

uint64_t hint_store_total_bytes(hint_store *h)
{
    return h ? atomic_load(&h->total) : 0;
}
