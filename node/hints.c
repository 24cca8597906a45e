/* SPDX-License-Identifier: MIT */
/*
 * Durable hinted-handoff store (see hints.h): the target table, the
 * directories and meta files, recovery at open, add and administration;
 * hints_seg.c reads the segments and drains them (replay, expiry). Layout
 * under opts.dir: one directory per target holding its segment files and a
 * file `meta` ("hotkv-hints 1 / lost L / dropped D", replaced atomically:
 * tmp + fdatasync + rename + fsync of the directory), and ~lock (flock: one
 * handle per directory). CRC32C and the file I/O helpers are the LSM's.
 *
 * Adds use the WAL's group commit (leader/follower, node/lsm/wal.c): a
 * caller reserves its bytes against max_bytes (one CAS on the store's
 * total, so concurrent adds never overshoot), encodes its frames outside
 * the lock and queues them on its target; whoever finds no write in flight
 * leads, writing the whole queue with one pwrite + fdatasync to the
 * target's active segment (a new one past seg_bytes, and after every open)
 * and completing every waiter of the group. A failed write is truncated
 * away and fails the whole group. An add that fails for any reason but a
 * bad argument marks its target lost and counts its hints as dropped.
 */
#include "node/hints_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

#define SEG_DEFAULT (4u << 20)
#define SEG_NAME_LEN 21 /* 16 hex digits + ".hint" */
#define META "meta"
#define META_TMP "meta.tmp"
#define LOCK_NAME "~lock" /* '~' is not allowed in a target name */

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

static bool known(const hint_target *t)
{
    return t->nsegs || t->lost || t->dropped || t->replayed || t->corrupt;
}

static kv_err seg_reserve(hint_target *t)
{
    if (t->nsegs < t->cap)
        return KV_OK;
    size_t cap = t->cap ? t->cap * 2 : 4;
    hint_seg *s = realloc(t->segs, cap * sizeof(*s));
    if (!s)
        return KV_RESOURCE_EXHAUSTED;
    t->segs = s;
    t->cap = cap;
    return KV_OK;
}

/* With t->mu held: hints of t were lost (n of them counted as dropped). */
void hint_note_lost(hint_target *t, uint64_t n)
{
    if (!t->lost)
        KV_WARN(HINT_LOG, "target %s marked lost: hints dropped, a repair is needed", t->name);
    t->dropped += n;
    t->lost = true;
    t->meta_seq++;
}

/* With t->mu held: keeps new leaders out and waits for the running write. */
void hint_quiesce(hint_target *t)
{
    t->hold++;
    while (t->writing)
        pthread_cond_wait(&t->cv, &t->mu);
}

void hint_unquiesce(hint_target *t)
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

static hint_target *target_new(const char *name)
{
    hint_target *t = calloc(1, sizeof(*t));
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

static void target_free(hint_target *t)
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
static kv_err table_insert(hint_store *h, size_t i, hint_target *t)
{
    if (h->ntargets == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 8;
        hint_target **p = realloc(h->targets, cap * sizeof(*p));
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
kv_err hint_target_get(hint_store *h, const char *name, bool create, hint_target **out)
{
    if (!h || !name_ok(name))
        return KV_INVALID_ARGUMENT;
    pthread_mutex_lock(&h->mu);
    bool found;
    size_t i = find_slot(h, name, &found);
    kv_err rv = found ? KV_OK : create ? KV_RESOURCE_EXHAUSTED : KV_NOT_FOUND;
    if (!found && create) {
        hint_target *t = target_new(name);
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
void hint_target_put(hint_store *h, hint_target *t)
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
static kv_err target_known(hint_store *h, const char *name, hint_target **out)
{
    hint_target *t;
    kv_err rv = hint_target_get(h, name, false, &t);
    if (rv != KV_OK)
        return rv;
    pthread_mutex_lock(&t->mu);
    bool k = known(t);
    pthread_mutex_unlock(&t->mu);
    if (!k) {
        hint_target_put(h, t);
        return KV_NOT_FOUND;
    }
    *out = t;
    return KV_OK;
}

/* ---- directories and the meta file ---- */

/* With t->meta_mu held: creates t's directory (durably) if it is not open. */
static kv_err ensure_dir_locked(hint_store *h, hint_target *t)
{
    if (t->has_vol)
        return KV_OK;
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", h->root.dir, t->name);
    kv_err rv = lsm_vol_init(&t->vol, path, LSM_TIER_FD, false);
    if (rv == KV_OK)
        rv = lsm_vol_syncdir(&h->root);
    if (rv != KV_OK) {
        KV_ERROR(HINT_LOG, "create %s: %s", path, kv_strerror(rv));
        lsm_vol_fini(&t->vol);
        return rv;
    }
    t->has_vol = true;
    return KV_OK;
}

static kv_err ensure_dir(hint_store *h, hint_target *t)
{
    pthread_mutex_lock(&t->meta_mu);
    kv_err rv = ensure_dir_locked(h, t);
    pthread_mutex_unlock(&t->meta_mu);
    return rv;
}

static kv_err meta_write(hint_target *t, bool lost, uint64_t dropped)
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
kv_err hint_meta_save(hint_store *h, hint_target *t)
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
        KV_ERROR(HINT_LOG, "target %s: cannot persist the lost mark and dropped counter: %s",
                 t->name, kv_strerror(rv));
    }
    pthread_mutex_unlock(&t->meta_mu);
    return rv;
}

/* Reads t's meta file; an unreadable one marks t lost (hints may be gone). */
static void meta_load(hint_target *t)
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
        KV_ERROR(HINT_LOG, "%s/%s is unreadable: target %s marked lost", t->vol.dir, META, t->name);
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
    if (strlen(name) != SEG_NAME_LEN || strcmp(name + 16, HINT_SEG_SUFFIX) != 0)
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

/* ---- recovery ---- */

/* Recovers segment file name of target arg (called in number order). */
static kv_err recover_seg(void *arg, const char *name)
{
    hint_target *t = arg;
    uint64_t number = strtoull(name, NULL, 16);
    hint_seg s;
    kv_err rv = hint_scan_seg(t, number, &s);
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
static kv_err remove_dir(hint_store *h, hint_target *t)
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
        KV_WARN(HINT_LOG, "remove %s/%s: %s", h->root.dir, t->name, strerror(errno));
        rv = KV_INTERNAL;
    }
    return rv;
}

static kv_err recover_target(void *arg, const char *name)
{
    hint_store *h = arg;
    hint_target *t = target_new(name);
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
    hint_meta_save(h, t); /* a mark found by recovery; failure is logged */
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
    KV_INFO(HINT_LOG, "hint store %s: %zu targets, %" PRIu64 " bytes", o->dir, h->ntargets,
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
        total += HINT_FRAME_HDR + lens[i];
    kv_err rv = lsm_buf_reserve(b, total);
    if (rv != KV_OK)
        return rv;
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = b->p + b->len;
        lsm_set32(p + 4, (uint32_t)lens[i]);
        lsm_set64(p + 8, ms);
        memcpy(p + HINT_FRAME_HDR, hints[i], lens[i]);
        lsm_set32(p, kv_crc32c(0, p + 4, HINT_FRAME_HDR - 4 + lens[i]));
        b->len += HINT_FRAME_HDR + lens[i];
    }
    return KV_OK;
}

static kv_err seg_create(hint_store *h, hint_target *t, uint64_t number, int *fd)
{
    kv_err rv = ensure_dir(h, t);
    if (rv != KV_OK)
        return rv;
    char name[32];
    hint_seg_name(name, sizeof(name), number);
    int f = lsm_vol_open(&t->vol, name, O_WRONLY | O_CREAT | O_EXCL);
    if (f < 0) {
        KV_ERROR(HINT_LOG, "create %s/%s: %s", t->vol.dir, name, strerror(-f));
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
static kv_err seg_append(hint_target *t, int fd, const lsm_buf *b, uint64_t off)
{
    kv_err rv = lsm_vol_write(&t->vol, fd, b->p, b->len, off, true);
    if (rv != KV_OK) {
        KV_ERROR(HINT_LOG, "target %s: write of %zu bytes failed: %s", t->name, b->len,
                 kv_strerror(rv));
        if (ftruncate(fd, (off_t)off) < 0)
            KV_ERROR(HINT_LOG, "target %s: truncate after a failed write: %s", t->name,
                     strerror(errno));
    }
    return rv;
}

/* With t->mu held: makes the new segment number (open as fd) the active one. */
static void seg_install(hint_target *t, uint64_t number, int fd)
{
    if (t->fd >= 0)
        close(t->fd); /* the previous segment is sealed */
    t->segs[t->nsegs++] = (hint_seg){.number = number};
    t->fd = fd;
    t->next_number = number + 1;
}

/* Called with t->mu held, !writing and !hold: writes the queued group. */
static void lead(hint_store *h, hint_target *t)
{
    t->writing = true;
    lsm_buf buf = t->pending;
    hint_waiter *group = t->waiters;
    uint64_t n = t->pend_n, first = t->pend_first_ms, max = t->pend_max_ms;
    t->pending = (lsm_buf){0};
    t->waiters = NULL;
    t->pend_n = 0;
    hint_seg *last = t->nsegs ? &t->segs[t->nsegs - 1] : NULL;
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
    for (hint_waiter *w = group; w; w = w->next) {
        w->rv = rv;
        w->done = true;
    }
    lsm_buf_free(&buf);
    t->writing = false;
    pthread_cond_broadcast(&t->cv);
}

/* Queues n encoded frames added at ms and waits until their group is written. */
static kv_err commit(hint_store *h, hint_target *t, const lsm_buf *frames, size_t n, uint64_t ms)
{
    hint_waiter me = {.rv = KV_OK};
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
    hint_target *t;
    kv_err rv = hint_target_get(h, name, true, &t);
    if (rv != KV_OK)
        return rv;
    lsm_buf frames = {0};
    uint64_t ms = hint_now_ms(h);
    if ((rv = encode(&frames, hints, lens, n, ms)) == KV_OK &&
        (rv = reserve(h, frames.len)) == KV_OK) {
        rv = commit(h, t, &frames, n, ms);
        if (rv != KV_OK)
            release(h, frames.len);
    }
    lsm_buf_free(&frames);
    if (rv != KV_OK) {
        KV_DEBUG(HINT_LOG, "target %s: %zu hints not stored: %s", name, n, kv_strerror(rv));
        pthread_mutex_lock(&t->mu);
        hint_note_lost(t, n);
        pthread_mutex_unlock(&t->mu);
        hint_meta_save(h, t);
    }
    hint_target_put(h, t);
    return rv;
}

/* ---- status and administration ---- */

/* With t->mu held. */
static void fill_info(const hint_target *t, hint_target_info *o)
{
    memset(o, 0, sizeof(*o));
    snprintf(o->target, sizeof(o->target), "%s", t->name);
    for (size_t i = 0; i < t->nsegs; i++) {
        const hint_seg *s = &t->segs[i];
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
        hint_target *t = h->targets[i];
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
    hint_target *t;
    kv_err rv = target_known(h, name, &t);
    if (rv != KV_OK)
        return rv;
    pthread_mutex_lock(&t->mu);
    fill_info(t, out);
    pthread_mutex_unlock(&t->mu);
    hint_target_put(h, t);
    return KV_OK;
}

kv_err hint_store_clear_lost(hint_store *h, const char *name)
{
    hint_target *t;
    kv_err rv = target_known(h, name, &t);
    if (rv != KV_OK)
        return rv;
    pthread_mutex_lock(&t->mu);
    if (t->lost) {
        t->lost = false;
        t->meta_seq++;
        KV_INFO(HINT_LOG, "target %s: lost mark cleared", name);
    }
    pthread_mutex_unlock(&t->mu);
    rv = hint_meta_save(h, t);
    hint_target_put(h, t);
    return rv;
}

void hint_seg_unlink(hint_store *h, hint_target *t, const hint_seg *s)
{
    char name[32];
    hint_seg_name(name, sizeof(name), s->number);
    int e = lsm_vol_unlink(&t->vol, name);
    if (e < 0 && e != -ENOENT)
        KV_WARN(HINT_LOG, "delete %s/%s: %s", t->vol.dir, name, strerror(-e));
    release(h, s->file);
}

/* With t->meta_mu held: deletes the n segments taken from t, then its
 * directory. */
static kv_err forget_files(hint_store *h, hint_target *t, hint_seg *segs, size_t n)
{
    if (!t->has_vol)
        return KV_OK;
    kv_err rv = KV_OK;
    for (size_t i = 0; i < n; i++)
        hint_seg_unlink(h, t, &segs[i]);
    if (remove_dir(h, t) != KV_OK)
        rv = KV_INTERNAL;
    return rv;
}

kv_err hint_store_forget(hint_store *h, const char *name)
{
    hint_target *t;
    kv_err rv = target_known(h, name, &t);
    if (rv != KV_OK)
        return rv;
    pthread_mutex_lock(&t->mu);
    t->cancel = true;
    while (t->busy != IDLE)
        pthread_cond_wait(&t->cv, &t->mu);
    t->busy = FORGET;
    t->cancel = false;
    hint_quiesce(t);
    hint_seg *segs = t->segs;
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
    hint_unquiesce(t);
    t->busy = IDLE;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&t->meta_mu);
    free(segs);
    KV_INFO(HINT_LOG, "target %s forgotten: %zu segments deleted", name, n);
    hint_target_put(h, t);
    return rv;
}

uint64_t hint_store_total_bytes(hint_store *h)
{
    return h ? atomic_load(&h->total) : 0;
}
