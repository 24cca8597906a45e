/* SPDX-License-Identifier: MIT */
/*
 * Leveled compaction (LevelDB/RocksDB style). Scores: L0 = the larger of
 * files / l0_trigger and bytes / lsm_l0_room (the FD room the levels below
 * leave, within [target(1), l0_trigger x target(1)]), Ln = bytes / target(n) with target(1) from
 * the FD capacity and a size ratio of 10 (db.c); the highest score >= 1 whose two levels are not
 * busy is compacted. L0 moves files to L1 by a manifest edit when nothing in L1 or among the files
 * moved overlaps them and the files left in L0 are newer for their keys (l0_movable: RocksDB's
 * trivial move, so appended key ranges reach L1 without a rewrite), else compacts all its files
 * into L1; Ln picks the file with the least overlap in Ln+1 against its size (RocksDB's
 * kMinOverlappingRatio) plus the overlapping files of Ln+1, except the last FD level under HotRAP,
 * which picks the file with the least cost per cold byte pushed down: (overlap below + hot bytes
 * retained) / (file bytes - hot bytes, per RALT). A single Ln file with no overlap below on the
 * same volume is moved by a manifest edit only. Output files are cut at file_size, or earlier at a
 * file boundary of the level below the output (gp_walk).
 *
 * The inputs are merged by iter.c's heap merger (one source per L0 file, one
 * level-concatenating source per sorted level). The merge keeps the
 * highest-seqno record per key (no snapshots). An expired PUT becomes a
 * tombstone (keeping its expire_at); a tombstone is dropped when no level
 * below the output can hold the key and it is older than
 * opts.tombstone_grace_ms. lsm_compact_all_filter's jobs also drop every
 * record of a key its filter rejects. Each kept record may be routed by
 * opts.route or, under HotRAP, by the built-in rule: in a compaction from
 * the last FD level into SD, a record RALT calls hot is kept on the FD level
 * (retention for FD inputs, promotion for SD inputs) when it lies inside the
 * input level's compacted key range, within a budget bounded by the level's
 * target and the hot-set limit. In compactions inside SD, hot records that
 * no upper level may shadow are offered to the promotion buffer.
 *
 * Clean copies (LSM_F_TWIN): a record HotRAP promoted keeps its original,
 * same key and seqno, in a deeper level on SD. A merge that meets the
 * original (the next record of the key, same seqno) writes the copy without
 * the flag, since the original goes. A compaction from the last FD level
 * into SD drops a clean copy it does not retain: the original below already
 * holds it, and writing it down again would rewrite SD files for nothing
 * (HotRAP's promotions of reads that are not hot again, under uniform
 * reads, were all written back that way). A job whose from-level files hold
 * only clean copies (lsm_file.ntwins) merges no SD file at all: it drops or
 * retains every record, and SD is not read or written. Why the original is
 * still there: it leaves its level only by a merge with a newer version of
 * the key or by a merge with the copy; a newer version lies above the copy
 * (promote.c never shadows one) and removes it when they merge, and the copy
 * loses its flag when it meets the original. Outputs go to the volume of their
 * level. Errors (ENOSPC, a corrupt input block) abort the job, delete its
 * outputs, set bg_err and back off for a second.
 *
 * Threads: compaction_threads background threads plus callers of
 * lsm_compact_all; all coordination is under db->mu / db->cv.
 */
#include <sys/prctl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "common/assert.h"
#include "common/log.h"
#include "node/lsm/iter.h"

/* lsm_compact_all_filter's drop filter, shared by its jobs. */
typedef struct cfilter {
    lsm_keep_fn keep;
    void *arg;
    uint64_t dropped;
} cfilter;

typedef struct cjob {
    int from, to;
    lsm_version *base;
    lsm_file **in[2]; /* [0] from-level files, [1] to-level files */
    size_t nin[2];
    const uint8_t *lo, *hi; /* key range of in[0] */
    size_t lolen, hilen;
    bool trivial;
    bool twins_only;        /* from-level files of clean copies only: no to-level input */
    bool l0_past;           /* an L0 move that leaves an older file (by number) behind */
    uint64_t retain_budget; /* bytes the route hook may keep on the from level */
    uint64_t fread;         /* flushed seqno published before base was pinned */
    /* Cleanup (lsm_compact_all_filter): records of keys the filter rejects
     * are dropped; every to-level file is an input, so no older version of
     * such a key is left below; from == to rewrites a level into itself. */
    cfilter *filter;
} cjob;

/* ---- picking ---- */

static uint64_t files_bytes(lsm_file *const *f, size_t n)
{
    uint64_t b = 0;
    for (size_t i = 0; i < n; i++)
        b += f[i]->size;
    return b;
}

uint64_t lsm_l0_room(const lsm_db *db, const lsm_version *v)
{
    uint64_t used = 0, fast = db->o.fast_mb << 20;
    for (int l = 1; l <= db->last_fd; l++)
        used += lsm_level_bytes(v, l);
    uint64_t room = fast > used ? fast - used : 0, lo = db->target[1];
    uint64_t hi = lo * db->o.l0_trigger;
    return room < lo ? lo : room > hi ? hi : room;
}

static double score(const lsm_db *db, const lsm_version *v, int l)
{
    if (l == 0) { /* files, or bytes against the room FD has for L0 */
        double files = (double)v->nfiles[0] / db->o.l0_trigger;
        double bytes = (double)lsm_level_bytes(v, 0) / (double)lsm_l0_room(db, v);
        return files > bytes ? files : bytes;
    }
    return (double)lsm_level_bytes(v, l) / (double)db->target[l];
}

uint64_t lsm_fd_bytes(const lsm_db *db, const lsm_version *v)
{
    uint64_t b = 0;
    for (int l = 0; l <= db->last_fd; l++)
        b += lsm_level_bytes(v, l);
    return b;
}

bool lsm_fd_full(const lsm_db *db, const lsm_version *v)
{
    if (!db->has_sd || lsm_fd_bytes(db, v) <= (db->o.fast_mb << 20) / 100 * db->o.fd_stop_pct)
        return false;
    for (int l = 0; l <= db->last_fd && l < LSM_MAX_LEVELS - 1; l++)
        if (v->nfiles[l] && score(db, v, l) >= 1.0)
            return true;
    return false;
}

static bool overlaps(const lsm_file *f, const uint8_t *lo, size_t ll, const uint8_t *hi, size_t hl)
{
    return lsm_key_cmp(f->largest, f->llen, lo, ll) >= 0 &&
           lsm_key_cmp(f->smallest, f->slen, hi, hl) <= 0;
}

static bool hotrap_level(const lsm_db *db, int l);

static bool all_twins(lsm_file *const *f, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (f[i]->ntwins != f[i]->nentries)
            return false;
    return n > 0;
}

/* Fills in[0] with files [a, b) of level from; then the range and in[1]. */
static kv_err job_inputs(lsm_db *db, cjob *j, size_t a, size_t b, const bool *only)
{
    const lsm_version *v = j->base;
    j->in[0] = malloc((b - a) * sizeof(lsm_file *));
    j->in[1] = malloc((v->nfiles[j->to] + 1) * sizeof(lsm_file *));
    if (!j->in[0] || !j->in[1])
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = a; i < b; i++) {
        if (only && !only[i])
            continue;
        lsm_file *f = v->files[j->from][i];
        j->in[0][j->nin[0]++] = f;
        if (!j->lo || lsm_key_cmp(f->smallest, f->slen, j->lo, j->lolen) < 0)
            j->lo = f->smallest, j->lolen = f->slen;
        if (!j->hi || lsm_key_cmp(f->largest, f->llen, j->hi, j->hilen) > 0)
            j->hi = f->largest, j->hilen = f->llen;
    }
    uint64_t in_bytes = 0, lvl = lsm_level_bytes(v, j->from);
    for (size_t i = 0; i < j->nin[0]; i++)
        in_bytes += j->in[0][i]->size;
    /* retention may refill the from level only up to 3/4 of its target (the
     * rest covers SST overhead), so its score drops below 1 and compaction
     * always makes progress */
    if (j->from > 0 && db->target[j->from] > lvl - in_bytes)
        j->retain_budget = (db->target[j->from] - (lvl - in_bytes)) / 4 * 3;
    if (!db->o.route && j->retain_budget > db->hot_limit)
        j->retain_budget = db->hot_limit; /* HotRAP retention: at most the hot set */
    j->twins_only = !j->filter && hotrap_level(db, j->from) && all_twins(j->in[0], j->nin[0]);
    for (size_t i = 0; !j->twins_only && j->to != j->from && i < v->nfiles[j->to]; i++)
        if (j->filter || overlaps(v->files[j->to][i], j->lo, j->lolen, j->hi, j->hilen))
            j->in[1][j->nin[1]++] = v->files[j->to][i];
    j->trivial = j->from > 0 && j->nin[0] == 1 && j->nin[1] == 0 && !db->o.route &&
                 db->level_tier[j->from] == db->level_tier[j->to] && !j->filter;
    return KV_OK;
}

/* Bytes of level l + 1 that file i of level l overlaps (overlap_ratio: over
 * its size). Both levels are sorted and disjoint, so callers sweep:
 * ascending i, with *k (first 0) kept between calls, the first file of
 * l + 1 not wholly left of the previous file. */
static uint64_t overlap_bytes(const lsm_version *v, int l, size_t i, size_t *k)
{
    lsm_file *const *below = v->files[l + 1];
    size_t nb = v->nfiles[l + 1];
    const lsm_file *f = v->files[l][i];
    while (*k < nb && lsm_key_cmp(below[*k]->largest, below[*k]->llen, f->smallest, f->slen) < 0)
        (*k)++;
    uint64_t over = 0;
    for (size_t m = *k; m < nb && overlaps(below[m], f->smallest, f->slen, f->largest, f->llen);
         m++)
        over += below[m]->size;
    return over;
}

static double overlap_ratio(const lsm_version *v, int l, size_t i, size_t *k)
{
    const lsm_file *f = v->files[l][i];
    return (double)overlap_bytes(v, l, i, k) / (double)(f->size ? f->size : 1);
}

/* RocksDB's kMinOverlappingRatio: the file of level l >= 1 whose overlapping
 * bytes in level l + 1 are the smallest against its own size, i.e. the job
 * that rewrites the fewest bytes below per byte it pushes down (a file with
 * no overlap is a free trivial move); ties go to the smallest key. A
 * round-robin pointer (LevelDB) takes files in key order whatever lies below
 * them; this choice lets the sparse stretches of l + 1 absorb l's data first
 * and leaves the dense ones until l holds more there (with random writes at
 * 1 GiB it rewrote 3.6-3.8 bytes of L2 per L1 byte merged instead of 5.8-6.7). */
static size_t min_overlap_pick(const lsm_version *v, int l)
{
    size_t k = 0, best = 0;
    double best_ratio = 0;
    for (size_t i = 0; i < v->nfiles[l]; i++) {
        double ratio = overlap_ratio(v, l, i, &k);
        if (i == 0 || ratio < best_ratio)
            best = i, best_ratio = ratio;
    }
    return best;
}

uint64_t lsm_hot_bytes_in(lsm_db *db, const lsm_file *f)
{
    if (!db->ralt)
        return 0;
    return ralt_hot_bytes_est(db->ralt, f->smallest, f->slen, f->largest, f->llen);
}

/* HotRAP's choice on the last FD level: the file that moves its cold bytes
 * (file bytes - hot bytes, per RALT) into SD at the least cost per cold
 * byte, the cost being the SD bytes it merges with (its overlap below) plus
 * the hot bytes it rewrites on FD (retained). Without hot keys (a load, or
 * the cold part of the key space) this is min_overlap_pick's ratio. An
 * earlier rule took the highest benefit (cold bytes) and broke near-ties by
 * the least overlap: once output files are cut at their grandparents'
 * boundaries (gp_walk) their sizes differ, only the largest files tied, and
 * the L2 -> L3 merges of a load read 3.3 bytes of L3 per L2 byte instead of
 * 3.1 (before the rule had taken the first full file: 6-8 bytes, at 1M
 * records and FD 100 MiB). A file of clean copies only costs nothing: its
 * job reads and writes no SD file (twins_only). */
static size_t benefit_pick(lsm_db *db, const lsm_version *v, int l)
{
    size_t best = 0, k = 0;
    double br = 0;
    for (size_t i = 0; i < v->nfiles[l]; i++) {
        const lsm_file *f = v->files[l][i];
        uint64_t over = overlap_bytes(v, l, i, &k); /* every i, in order: the sweep */
        uint64_t hot = lsm_hot_bytes_in(db, f);
        hot = hot < f->size ? hot : f->size;
        uint64_t cold = f->size - hot;
        double r =
            all_twins(&v->files[l][i], 1) ? 0.0 : (double)(over + hot) / (double)(cold ? cold : 1);
        if (i == 0 || r < br)
            best = i, br = r;
    }
    return best;
}

static bool hotrap_level(const lsm_db *db, int l)
{
    return db->ralt && !db->o.route && l == db->last_fd && l > 0 && l + 1 < LSM_MAX_LEVELS &&
           db->level_tier[l + 1] == LSM_TIER_SD;
}

/* ---- room on the fast volume ----
 *
 * A merge writes its outputs before its inputs go, so a job into an FD level
 * needs free room on the fast device for every byte it reads (the outputs
 * are at most that), and an L0 -> L1 job of every L0 file behind a fast
 * load can need as much again as the FD levels hold: on a device sized a
 * little over fast_mb it failed with ENOSPC, then again every second with
 * the same inputs, while flushes failed too, and the store never recovered.
 * So a job starts only when its FD bytes fit the device's free room less a
 * reserve for the next flushes (lsm_fd_room); L0 jobs shrink to the oldest
 * files that fit (the files left in L0 are newer by number, hence by seqno
 * for every key: promote.c installs a copy only when no flushed write of its
 * key is newer); and while a job had to wait for room, or the room is under
 * the reserve, the last FD level is pushed down into SD whatever its score
 * (its outputs go to SD and its inputs free FD), without retention, or,
 * while that level is empty, the deepest FD level's file (L0's oldest) is
 * moved down a level when it overlaps nothing there (a move takes no
 * room). Flushes wait for room meanwhile (db.c). RocksDB defers
 * compactions the same way (SstFileManager's room check). */

/* What compaction keeps free on FD for flushes: twice the largest of the
 * biggest flushed file, the SST size and what a waiting flush needs (so a
 * flush that waits for room always sets off a push-down), and what the WAL
 * may still grow. mu held. */
static uint64_t fd_reserve(lsm_db *db)
{
    uint64_t f = atomic_load_explicit(&db->flush_max, memory_order_relaxed);
    f = f > db->file_size ? f : db->file_size;
    return 2 * (f > db->space_wanted ? f : db->space_wanted) + lsm_wal_headroom(db);
}

uint64_t lsm_fd_room(lsm_db *db)
{
    if (!db->has_sd)
        return UINT64_MAX;
    uint64_t free = lsm_vol_free_bytes(&db->vols[0]), r = fd_reserve(db);
    atomic_store_explicit(&db->fd_free, free, memory_order_relaxed);
    return free == UINT64_MAX ? free : free > r ? free - r : 0;
}

/* Bytes job j may write to FD: every input byte for a merge into an FD level,
 * the retention budget for one into SD, nothing for a move. */
static uint64_t job_fd_bytes(const lsm_db *db, const cjob *j)
{
    if (j->trivial)
        return 0;
    if (db->level_tier[j->to] != LSM_TIER_FD)
        return j->retain_budget;
    return files_bytes(j->in[0], j->nin[0]) + files_bytes(j->in[1], j->nin[1]);
}

static void job_release(cjob *j)
{
    free(j->in[0]);
    free(j->in[1]);
    j->in[0] = j->in[1] = NULL;
    j->nin[0] = j->nin[1] = 0;
    j->lo = j->hi = NULL;
    j->lolen = j->hilen = 0;
}

/* Builds the job of level l into l + 1 on v: files [0, n0) of L0 (n0 = 0:
 * all) or, with only, the L0 files it marks; or the chosen file of a
 * sorted level. False when out of memory. */
static bool job_make(lsm_db *db, lsm_version *v, int l, size_t n0, const bool *only, uint64_t fread,
                     cjob *j)
{
    *j = (cjob){.from = l, .to = l + 1, .base = v, .fread = fread};
    size_t a = 0, b = n0 ? n0 : v->nfiles[l];
    if (l > 0) {
        a = hotrap_level(db, l) ? benefit_pick(db, v, l) : min_overlap_pick(v, l);
        b = a + 1;
    }
    if (job_inputs(db, j, a, b, l == 0 ? only : NULL) == KV_OK)
        return true;
    job_release(j);
    return false;
}

/* Whether j fits the room; a job into SD is made to fit by cutting its
 * retention budget (retention is an optimisation, the push-down is not). */
static bool job_fits(const lsm_db *db, cjob *j, uint64_t room)
{
    if (db->level_tier[j->to] != LSM_TIER_FD && j->retain_budget > room)
        j->retain_budget = room;
    return job_fd_bytes(db, j) <= room;
}

/* Whether L0 file x may leave L0 without the files left behind (those
 * chosen does not mark, or with chosen NULL those from index m on): every
 * one of them that overlaps x holds only newer records (its smallest seqno
 * above x's largest). L0 lookups take the highest seqno among L0's files,
 * but once a file is below L0 any L0 record of its keys wins. File numbers
 * are not seqno order: a promoted file holds copies of old records, and a
 * flush takes its number before it builds its file while a promotion may
 * take and install a later number meanwhile (promote.c's marks only keep a
 * promoted copy from shadowing a write already flushed). So a flush can sit
 * in L0 below, by number, a promoted copy of an older version of one of its
 * keys; moving (or merging) the flush alone would let that copy shadow it. */
static bool l0_left_newer(const lsm_version *v, const lsm_file *x, const bool *chosen, size_t m)
{
    for (size_t r = 0; r < v->nfiles[0]; r++) {
        const lsm_file *y = v->files[0][r];
        bool stays = chosen ? !chosen[r] : r >= m;
        if (stays && y->min_seq <= x->max_seq &&
            overlaps(y, x->smallest, x->slen, x->largest, x->llen))
            return false;
    }
    return true;
}

/* Whether L0's first m files (by number) may leave L0 without the rest. */
static bool l0_prefix_may_leave(const lsm_version *v, size_t m)
{
    for (size_t i = 0; i < m; i++)
        if (!l0_left_newer(v, v->files[0][i], NULL, m))
            return false;
    return true;
}

/* The L0 files that can move to L1 as they are (a trivial move), marked in
 * chosen[0, nfiles[0]); returns how many. A file can when it holds no
 * promoted copies, overlaps no L1 file and no other file chosen, and every
 * file left in L0 that overlaps it holds only newer records (l0_left_newer,
 * see l0_prefix_may_leave). They are then disjoint in L1, which held none
 * of their keys, and every L0 record of their keys is newer, so reads find
 * the same newest record. Keys appended above the rest (a sequential insert
 * stream) thus reach L1 without a rewrite, and the levels below by the
 * single-file moves of min_overlap_pick, also while promoted files (which
 * span the hot keys of the whole key space) wait in L0 before them.
 * Promoted files are always merged: moved whole, all of a promotion's
 * copies would go down together as one file and be pushed back to SD by
 * the next push from the last FD level. */
static size_t l0_movable(const lsm_version *v, bool *chosen)
{
    size_t n0 = v->nfiles[0], m = 0;
    for (size_t i = 0; i < n0; i++) {
        const lsm_file *f = v->files[0][i];
        chosen[i] = false;
        if (f->ntwins)
            continue;
        size_t k = lsm_level_find(v->files[1], v->nfiles[1], f->smallest, f->slen);
        if (k < v->nfiles[1] && overlaps(v->files[1][k], f->smallest, f->slen, f->largest, f->llen))
            continue;
        bool clash = false;
        for (size_t p = 0; p < i && !clash; p++)
            clash =
                chosen[p] && overlaps(v->files[0][p], f->smallest, f->slen, f->largest, f->llen);
        if (!clash)
            chosen[i] = true, m++;
    }
    /* a file that stays may hold back one chosen: until none does */
    for (bool again = true; again && m > 0;) {
        again = false;
        for (size_t i = 0; i < n0; i++)
            if (chosen[i] && !l0_left_newer(v, v->files[0][i], chosen, 0))
                chosen[i] = false, m--, again = true;
    }
    return m;
}

/* With mu held: chooses the most urgent job that fits the fast volume's room
 * (see above), marks its levels busy. */
static bool pick(lsm_db *db, cjob *j)
{
    KV_ASSERT_LOCKED(&db->mu);
    uint64_t fread = atomic_load(&db->flushed_pub);
    lsm_version *v = lsm_db_current(db);
    int cand[LSM_MAX_LEVELS], n = 0;
    double sc[LSM_MAX_LEVELS];
    for (int l = 0; l < LSM_MAX_LEVELS - 1; l++) {
        double s = score(db, v, l);
        if (db->busy[l] || db->busy[l + 1] || !v->nfiles[l] || s < 1.0)
            continue;
        int k = n++; /* insertion sort, highest score first */
        for (; k > 0 && sc[k - 1] < s; k--)
            cand[k] = cand[k - 1], sc[k] = sc[k - 1];
        cand[k] = l, sc[k] = s;
    }
    uint64_t room = n ? lsm_fd_room(db) : UINT64_MAX;
    bool refused = false;
    for (int c = 0; c < n; c++) {
        int l = cand[c];
        if (l == 0 && !db->o.route && db->level_tier[0] == db->level_tier[1]) {
            bool *chosen = malloc(v->nfiles[0] * sizeof(*chosen));
            bool made =
                chosen && l0_movable(v, chosen) > 0 && job_make(db, v, 0, 0, chosen, fread, j);
            for (size_t q = 0; made && j->in[0][j->nin[0] - 1] != v->files[0][q]; q++)
                j->l0_past |= !chosen[q]; /* a file before the last one moved stays */
            free(chosen);
            if (made) {
                j->nin[1] = 0; /* L1 files in the gaps between the moved ones stay */
                j->trivial = true;
                j->retain_budget = 0;
                goto take;
            }
        }
        if (!job_make(db, v, l, 0, NULL, fread, j))
            break;
        if (job_fits(db, j, room))
            goto take;
        for (size_t n0 = l == 0 ? j->nin[0] : 1; n0 > 1;) { /* the oldest L0 files that fit */
            job_release(j);
            if (!l0_prefix_may_leave(v, --n0))
                continue;
            if (!job_make(db, v, 0, n0, NULL, fread, j))
                break;
            if (job_fits(db, j, room))
                goto take;
        }
        job_release(j);
        refused = true;
    }
    if (db->has_sd) {
        /* No room: push the last FD level down to SD, or, while it is empty,
         * move the deepest FD level's file down a level when that costs no
         * room (no overlap below), so that the next pick can push it on. */
        if (!n)
            room = lsm_fd_room(db);
        for (int l = db->last_fd; (refused || room == 0) && l >= 0; l--) {
            if (!v->nfiles[l])
                continue;
            if (db->busy[l] || db->busy[l + 1] || (l == 0 && !l0_prefix_may_leave(v, 1)) ||
                !job_make(db, v, l, l == 0, NULL, fread, j))
                break;
            j->retain_budget = 0;
            /* the oldest L0 file may move too when the files left in L0
             * are newer for each key it holds (l0_prefix_may_leave, above) */
            if (l == 0 && !j->nin[1] && !db->o.route && db->level_tier[0] == db->level_tier[1])
                j->trivial = true;
            if (db->level_tier[l + 1] == LSM_TIER_SD || j->trivial)
                goto take;
            job_release(j);
            break;
        }
    }
    if (refused) {
        atomic_fetch_add(&db->space_waits, 1);
        if (!db->space_blocked) { /* wakes lsm_compact_wait_idle once */
            db->space_blocked = true;
            pthread_cond_broadcast(&db->cv);
        }
    }
    lsm_version_unref(v);
    return false;
take:
    db->space_blocked = false;
    if (refused || (n && j->from == 0 && !j->trivial && j->nin[0] < v->nfiles[0]))
        atomic_fetch_add(&db->space_waits, 1);
    db->busy[j->from] = db->busy[j->to] = true;
    db->running++;
    return true;
}

/* ---- merging ---- */

static bool may_exist_below(const lsm_version *v, int level, const lsm_rec *r)
{
    for (int l = level + 1; l < LSM_MAX_LEVELS; l++) {
        for (size_t i = 0; i < v->nfiles[l]; i++) {
            const lsm_file *f = v->files[l][i];
            if (lsm_file_covers(f, r->key, r->klen) && lsm_sst_may_contain(f->sst, r->key, r->klen))
                return true;
        }
    }
    return false;
}

/* True when a level above `level` (or `level` itself when r lies outside
 * the job's from-level range, i.e. in files the job does not merge) may
 * hold r's key. */
static bool may_exist_above(const cjob *j, const lsm_rec *r)
{
    const lsm_version *v = j->base;
    bool outside = lsm_key_cmp(r->key, r->klen, j->lo, j->lolen) < 0 ||
                   lsm_key_cmp(r->key, r->klen, j->hi, j->hilen) > 0;
    for (int l = 0; l < j->from + (outside ? 1 : 0); l++) {
        for (size_t i = 0; i < v->nfiles[l]; i++) {
            const lsm_file *f = v->files[l][i];
            if (lsm_file_covers(f, r->key, r->klen) && lsm_sst_may_contain(f->sst, r->key, r->klen))
                return true;
        }
    }
    return false;
}

/* HotRAP promotion by compaction inside SD: a hot record that no upper
 * level may shadow and that passes the gate (promote.c) is offered to the
 * promotion buffer, whose checker drops
 * it if a newer write appeared since the job's version (promote.c). */
static void promote_from_sd(lsm_db *db, const cjob *j, const lsm_rec *r)
{
    if (!db->promo || db->o.route || j->from <= db->last_fd || r->type != LSM_PUT)
        return;
    if (ralt_is_hot(db->ralt, r->key, r->klen) && !may_exist_above(j, r) &&
        lsm_promo_gate(db, r->key, r->klen))
        lsm_promo_add(db, r, j->fread);
}

/* Output files into level n are cut at the file boundaries of level n + 1
 * (the grandparents) once they are big enough, so that a later compaction of
 * one of them reads the level n + 1 files it covers and not a part of one
 * more at each end (RocksDB's level_compaction_dynamic_file_size). The keys
 * of a job's output are walked along the grandparents' zones: zone 2i is the
 * gap before file i, zone 2i + 1 file i itself (level >= 1: files sorted,
 * disjoint, a key in at most one). Going from zone a to zone b > a crosses
 * b - a boundaries. At a crossing the output file is cut when it holds at
 * least 50% of file_size, plus 5% per boundary it has crossed since it
 * opened (at most 90%: one that has crossed many is likely to find another
 * before it is full), or when the step jumps over whole grandparent files
 * of more than file_size / 8 (an output spanning them would drag them into
 * its next compaction although it holds none of their keys). On the
 * measured 500k x 1 KiB load (bench/tier/README.md, "Output files cut at
 * the next level's boundaries") a merge into L2 read 3.5 bytes of L2 per
 * L1 byte without it and RocksDB's 2.4. */
typedef struct gp_walk {
    lsm_file *const *f; /* the grandparent level's files, NULL: none */
    size_t n;
    size_t idx;      /* first file whose largest key is >= the last key */
    size_t zone;     /* the last key's zone */
    bool started;    /* a key was walked */
    unsigned passed; /* boundaries crossed since the output file opened */
} gp_walk;

typedef struct output {
    lsm_db *db;
    cjob *j;
    lsm_edit *e;
    lsm_sst_builder *b[2]; /* [0] to-level, [1] from-level (retained) */
    uint64_t written;
    gp_walk gp; /* the to level's grandparents (slot 0 only) */
} output;

/* Moves g to key's zone; true when the output file before key should be cut
 * (see gp_walk). size: the open output file's bytes (0: none open). */
static bool gp_cut_before(gp_walk *g, const uint8_t *key, size_t klen, uint64_t size,
                          uint64_t file_size)
{
    if (!g->f)
        return false;
    size_t from = g->zone;
    while (g->idx < g->n && lsm_key_cmp(key, klen, g->f[g->idx]->largest, g->f[g->idx]->llen) > 0)
        g->idx++;
    bool inside =
        g->idx < g->n && lsm_key_cmp(key, klen, g->f[g->idx]->smallest, g->f[g->idx]->slen) >= 0;
    g->zone = 2 * g->idx + (inside ? 1 : 0);
    bool first = !g->started;
    g->started = true;
    if (first || g->zone == from)
        return false;
    g->passed += (unsigned)(g->zone - from);
    if (size == 0)
        return false;
    /* files wholly between the last key and this one: zone(last) <= 2i and 2i + 2 <= zone */
    uint64_t skipped = 0;
    for (size_t i = (from + 1) / 2; 2 * i + 2 <= g->zone; i++)
        skipped += g->f[i]->size;
    unsigned pct = 50 + (g->passed * 5 < 40 ? g->passed * 5 : 40);
    return skipped > file_size / 8 || size >= file_size / 100 * pct;
}

static kv_err out_close(output *o, int slot)
{
    if (!o->b[slot])
        return KV_OK;
    lsm_file *f;
    int level = slot ? o->j->from : o->j->to;
    kv_err rv = lsm_sst_builder_finish(o->b[slot], level, &f);
    o->b[slot] = NULL;
    if (rv != KV_OK)
        return rv;
    o->written += f->size;
    rv = lsm_edit_add(o->e, f);
    if (rv != KV_OK)
        atomic_store(&f->obsolete, true);
    lsm_file_unref(f);
    return rv;
}

static kv_err out_add(output *o, int slot, const lsm_rec *r)
{
    lsm_db *db = o->db;
    if (slot == 0) {
        uint64_t size = o->b[0] ? lsm_sst_builder_size(o->b[0]) : 0;
        if (gp_cut_before(&o->gp, r->key, r->klen, size, db->file_size)) {
            kv_err rv = out_close(o, 0);
            if (rv != KV_OK)
                return rv;
        }
        if (!o->b[0])
            o->gp.passed = 0; /* a new file counts its own crossings */
    }
    if (!o->b[slot]) {
        int level = slot ? o->j->from : o->j->to;
        pthread_mutex_lock(&db->mu);
        uint64_t number = lsm_db_new_number(db);
        pthread_mutex_unlock(&db->mu);
        kv_err rv = lsm_db_builder(db, level, number, &o->b[slot]);
        if (rv != KV_OK)
            return rv;
    }
    kv_err rv = lsm_sst_builder_add(o->b[slot], r);
    if (rv == KV_OK && slot == 0 && db->level_tier[o->j->to] != db->level_tier[o->j->from])
        lsm_twin_drop(db->twin, r->key, r->klen, r->seqno); /* NHC: FD copy moved to SD */
    if (rv == KV_OK && lsm_sst_builder_size(o->b[slot]) >= db->file_size)
        rv = out_close(o, slot);
    return rv;
}

/* Output slot for r: 1 to retain it on the from level (within the job's
 * key range and retention budget), else 0. */
static int route(lsm_db *db, cjob *j, const lsm_rec *r)
{
    bool builtin = hotrap_level(db, j->from);
    if ((!db->o.route && !builtin) || j->from == 0 || j->from == j->to || r->type != LSM_PUT)
        return 0;
    if (lsm_key_cmp(r->key, r->klen, j->lo, j->lolen) < 0 ||
        lsm_key_cmp(r->key, r->klen, j->hi, j->hilen) > 0)
        return 0;
    if (builtin ? !ralt_is_hot(db->ralt, r->key, r->klen)
                : db->o.route(db->o.route_arg, r, j->from) != j->from)
        return 0;
    uint64_t sz = lsm_recc_size(r) + 4; /* as an SST holds it */
    if (sz > j->retain_budget)
        return 0;
    j->retain_budget -= sz;
    atomic_fetch_add(&db->retained_recs, 1);
    atomic_fetch_add(&db->retained_bytes, r->klen + r->vlen);
    return 1;
}

/* True when tombstone r is older than the grace period (lsm_opts): its
 * time is its version's milliseconds, or its expire_at when later. */
static bool grace_over(const lsm_db *db, const lsm_rec *r, uint64_t now)
{
    uint64_t grace = db->o.tombstone_grace_ms, t = KV_HLC_MS(r->version);
    t = r->expire_at > t ? r->expire_at : t;
    return grace == 0 || (now > t && now - t > grace);
}

/* A clean copy leaving the last FD level for SD: retained on FD (flag
 * kept: the original is still below, this job did not merge it) or dropped
 * (the original holds it; an expired copy's original expired too). */
static kv_err emit_twin(output *o, const lsm_rec *r, uint64_t now)
{
    lsm_db *db = o->db;
    if (!(r->expire_at && r->expire_at <= now) && route(db, o->j, r) == 1)
        return out_add(o, 1, r);
    lsm_twin_drop(db->twin, r->key, r->klen, r->seqno); /* NHC: the FD copy is gone */
    atomic_fetch_add(&db->twins_dropped, 1);
    atomic_fetch_add(&db->twins_dropped_bytes, r->klen + r->vlen);
    return KV_OK;
}

/* Decides the fate of the newest record of a key and writes it. */
static kv_err emit(output *o, lsm_rec r, uint64_t now)
{
    if ((r.flags & LSM_F_TWIN) && r.type == LSM_PUT && hotrap_level(o->db, o->j->from) &&
        !o->j->filter)
        return emit_twin(o, &r, now);
    if (o->j->twins_only) {
        /* all_twins() counted every record as a clean copy: none may be
         * written down, there is no SD input to merge it with */
        KV_ERROR(LSM_LOG,
                 "compaction L%d -> L%d: a record that is not a clean copy in a file "
                 "counted as clean copies only",
                 o->j->from, o->j->to);
        return KV_INTERNAL;
    }
    if (r.type == LSM_PUT && r.expire_at && r.expire_at <= now) {
        r.type = LSM_DELETE; /* expired: it must still shadow older versions */
        r.value = NULL;      /* (expire_at stays: the grace period counts from it) */
        r.vlen = 0;
    }
    if (r.type == LSM_DELETE && grace_over(o->db, &r, now) &&
        !may_exist_below(o->j->base, o->j->to, &r))
        return KV_OK;
    promote_from_sd(o->db, o->j, &r);
    int slot = route(o->db, o->j, &r);
    /* A clean copy stays one only on FD (the FD levels' merges keep it
     * apart from its original until the last one); a tombstone is none. */
    if (r.type == LSM_DELETE || (slot == 0 && o->db->level_tier[o->j->to] == LSM_TIER_SD))
        r.flags &= (uint8_t)~LSM_F_TWIN;
    return out_add(o, slot, &r);
}

/* The job's inputs as merge sources: one per file when from == 0, else one
 * concatenating source for the from level; one for the to level. Ranks
 * follow the input order (from-level files, then the to level), so that a
 * seqno tie (a promoted copy and its original) keeps the same copy as ever. */
typedef struct job_srcs {
    lsm_sst_src *l0;
    lsm_level_src lv[2]; /* [0] from level (from > 0), [1] to level */
    lsm_src **ps;
    size_t n;
} job_srcs;

static kv_err job_srcs_init(job_srcs *s, const cjob *j)
{
    memset(s, 0, sizeof(*s));
    size_t n0 = j->from == 0 ? j->nin[0] : 1;
    s->ps = calloc(n0 + 1, sizeof(*s->ps));
    if (j->from == 0)
        s->l0 = calloc(n0 ? n0 : 1, sizeof(*s->l0));
    if (!s->ps || (j->from == 0 && !s->l0))
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; j->from == 0 && i < n0; i++) {
        lsm_sst_src_init(&s->l0[i], j->in[0][i]->sst, (int)i);
        s->ps[s->n++] = &s->l0[i].base;
    }
    if (j->from > 0) {
        lsm_level_src_init(&s->lv[0], j->in[0], j->nin[0], 0);
        s->ps[s->n++] = &s->lv[0].base;
    }
    lsm_level_src_init(&s->lv[1], j->in[1], j->nin[1], (int)s->n);
    s->ps[s->n++] = &s->lv[1].base;
    return KV_OK;
}

/* For a clean copy r (its key already in key): copies its value into val,
 * points r at both buffers and steps the merge to the next record; when
 * that is r's original (the same key and seqno: ties come from-level
 * first), this merge consumes it and r is a clean copy no more. */
static kv_err twin_check(lsm_merge *mg, lsm_rec *r, const lsm_buf *key, lsm_buf *val)
{
    val->len = 0;
    kv_err rv = lsm_buf_put(val, r->value, r->vlen);
    if (rv != KV_OK)
        return rv;
    r->key = key->p;
    r->value = val->p;
    lsm_merge_next(mg);
    if (lsm_merge_valid(mg)) {
        const lsm_rec *d = lsm_merge_cur(mg);
        if (d->seqno == r->seqno && lsm_key_cmp(d->key, d->klen, key->p, key->len) == 0)
            r->flags &= (uint8_t)~LSM_F_TWIN;
    }
    return KV_OK;
}

/* Emits the newest record of each key (unless the cleanup filter rejects
 * the key) and skips its older versions. */
static kv_err merge_run(output *o, lsm_merge *mg)
{
    lsm_db *db = o->db;
    cfilter *f = o->j->filter;
    uint64_t now = lsm_now_ms(db);
    lsm_buf key = {0}, val = {0};
    kv_err rv = KV_OK;
    lsm_merge_first(mg);
    while (rv == KV_OK && lsm_merge_valid(mg)) {
        lsm_rec r = *lsm_merge_cur(mg);
        bool keep = !f || f->keep(f->arg, r.key, r.klen), stepped = false;
        key.len = 0;
        rv = lsm_buf_put(&key, r.key, r.klen);
        if (rv == KV_OK && keep && (r.flags & LSM_F_TWIN) && r.type == LSM_PUT) {
            rv = twin_check(mg, &r, &key, &val);
            stepped = rv == KV_OK;
        }
        if (rv == KV_OK && keep)
            rv = emit(o, r, now);
        if (rv == KV_OK && !keep) {
            f->dropped++;
            lsm_twin_drop(db->twin, r.key, r.klen, r.seqno);
        }
        if (rv != KV_OK)
            break;
        if (!stepped)
            lsm_merge_next(mg);
        for (; lsm_merge_valid(mg); lsm_merge_next(mg)) { /* older versions */
            const lsm_rec *d = lsm_merge_cur(mg);
            if (lsm_key_cmp(d->key, d->klen, key.p, key.len) != 0)
                break;
            /* NHC: a dropped copy (superseded, or a twin merged) ends the twin */
            lsm_twin_drop(db->twin, key.p, key.len, d->seqno);
            if (!keep)
                f->dropped++;
        }
    }
    lsm_buf_free(&key);
    lsm_buf_free(&val);
    return rv == KV_OK ? lsm_merge_error(mg, NULL, NULL) : rv;
}

static kv_err merge(lsm_db *db, cjob *j, lsm_edit *e)
{
    job_srcs js;
    lsm_merge mg = {0};
    kv_err rv = job_srcs_init(&js, j);
    if (rv == KV_OK)
        rv = lsm_merge_init(&mg, js.ps, js.n);
    output o = {.db = db, .j = j, .e = e};
    if (j->to >= 1 && j->to + 1 < LSM_MAX_LEVELS && j->base->nfiles[j->to + 1])
        o.gp = (gp_walk){.f = j->base->files[j->to + 1], .n = j->base->nfiles[j->to + 1]};
    if (rv == KV_OK && db->ralt && !db->o.route && j->from > 0 && j->from >= db->last_fd)
        ralt_flush(db->ralt); /* so that recent accesses count */
    if (rv == KV_OK)
        rv = merge_run(&o, &mg);
    uint64_t read = lsm_merge_bytes(&mg);
    if (mg.heap)
        lsm_merge_fini(&mg);
    free(js.l0);
    free(js.ps);
    for (int s = 0; s < 2 && rv == KV_OK; s++)
        rv = out_close(&o, s);
    if (rv != KV_OK) {
        for (int s = 0; s < 2; s++)
            lsm_sst_builder_abort(o.b[s]);
        for (size_t i = 0; i < e->nadd; i++)
            atomic_store(&e->adds[i]->obsolete, true);
        return rv;
    }
    atomic_fetch_add(&db->c_read, read);
    atomic_fetch_add(&db->c_write, o.written);
    return KV_OK;
}

/* Moves file src to level `to` by a manifest edit (e gets its new entry). */
static kv_err move_file(const lsm_file *src, int to, lsm_edit *e)
{
    lsm_file *f = lsm_file_new();
    if (!f)
        return KV_RESOURCE_EXHAUSTED;
    *f = (lsm_file){.number = src->number,
                    .size = src->size,
                    .nentries = src->nentries,
                    .min_seq = src->min_seq,
                    .max_seq = src->max_seq,
                    .max_version = src->max_version,
                    .ntwins = src->ntwins,
                    .level = to,
                    .tier = src->tier,
                    .vol = src->vol,
                    .slen = src->slen,
                    .llen = src->llen};
    atomic_init(&f->refs, 1);
    f->smallest = malloc(f->slen);
    f->largest = malloc(f->llen);
    kv_err rv = f->smallest && f->largest ? KV_OK : KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK) {
        memcpy(f->smallest, src->smallest, f->slen);
        memcpy(f->largest, src->largest, f->llen);
        rv = lsm_sst_open(f->vol, f->number, &f->sst);
    }
    if (rv == KV_OK)
        rv = lsm_edit_add(e, f);
    lsm_file_unref(f);
    return rv;
}

/* A trivial move: every input file of the from level, unchanged, to j->to
 * (one file of a sorted level, or the L0 files l0_movable chose). */
static kv_err trivial_move(cjob *j, lsm_edit *e)
{
    kv_err rv = KV_OK;
    for (size_t i = 0; i < j->nin[0] && rv == KV_OK; i++)
        rv = move_file(j->in[0][i], j->to, e);
    return rv;
}

/* Runs a picked job without mu and installs it with mu held on return. */
static kv_err run_job(lsm_db *db, cjob *j)
{
    lsm_edit e = {0};
    uint64_t t0 = kv_now_ns();
    kv_err rv = j->trivial ? trivial_move(j, &e) : merge(db, j, &e);
    uint64_t took = kv_now_ns() - t0;
    for (int s = 0; s < 2 && rv == KV_OK; s++)
        for (size_t i = 0; i < j->nin[s] && rv == KV_OK; i++)
            rv = lsm_edit_del(&e, s ? j->to : j->from, j->in[s][i]->number);
    pthread_mutex_lock(&db->mu);
    if (rv == KV_OK)
        rv = lsm_db_install(db, &e);
    if (rv != KV_OK) {
        for (size_t i = 0; !j->trivial && i < e.nadd; i++)
            atomic_store(&e.adds[i]->obsolete, true);
        KV_ERROR(LSM_LOG, "compaction L%d -> L%d failed: %s", j->from, j->to, kv_strerror(rv));
    } else {
        atomic_fetch_add(&db->compactions, 1);
        if (j->twins_only)
            atomic_fetch_add(&db->twin_jobs, 1);
        int to = j->to;
        if (j->trivial) {
            atomic_fetch_add(&db->lc_moved[to], files_bytes(j->in[0], j->nin[0]));
            if (j->l0_past)
                atomic_fetch_add(&db->l0_moves_past, 1);
        } else {
            atomic_fetch_add(&db->lc_jobs[to], 1);
            atomic_fetch_add(&db->lc_above[to], files_bytes(j->in[0], j->nin[0]));
            atomic_fetch_add(&db->lc_level[to], files_bytes(j->in[1], j->nin[1]));
            atomic_fetch_add(&db->lc_written[to], files_bytes(e.adds, e.nadd));
            atomic_fetch_add(&db->lc_ns[to], took);
        }
        KV_DEBUG(LSM_LOG,
                 "compaction L%d -> L%d%s: %zu + %zu inputs (%" PRIu64 " + %" PRIu64
                 " bytes), %zu outputs (%" PRIu64 " bytes)",
                 j->from, j->to,
                 j->trivial      ? " (move)"
                 : j->twins_only ? " (copies)"
                                 : "",
                 j->nin[0], j->nin[1], files_bytes(j->in[0], j->nin[0]),
                 files_bytes(j->in[1], j->nin[1]), e.nadd, files_bytes(e.adds, e.nadd));
    }
    lsm_edit_free(&e);
    db->busy[j->from] = db->busy[j->to] = false;
    db->running--;
    db->bg_err = rv;
    pthread_cond_broadcast(&db->cv);
    lsm_version_unref(j->base);
    free(j->in[0]);
    free(j->in[1]);
    return rv;
}

/* ---- threads ---- */

#define BACKOFF_NS 1000000000ull

void lsm_db_wait_until(lsm_db *db, uint64_t until)
{
    uint64_t now = kv_now_ns();
    if (until <= now)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (until - now);
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&db->cv, &db->mu, &ts);
}

static void *cthread_main(void *arg)
{
    lsm_db *db = arg;
    prctl(PR_SET_NAME, "lsm:compact"); /* shown by top -H, perf, gdb */
    pthread_mutex_lock(&db->mu);
    while (!db->stop) {
        cjob j;
        if (kv_now_ns() < db->retry_at) { /* back off after a failed job */
            lsm_db_wait_until(db, db->retry_at);
            continue;
        }
        if (db->manual || db->o.no_auto_compaction || !pick(db, &j)) {
            if (db->space_blocked) /* room may come back without a signal */
                lsm_db_wait_until(db, kv_now_ns() + BACKOFF_NS);
            else
                pthread_cond_wait(&db->cv, &db->mu);
            continue;
        }
        pthread_mutex_unlock(&db->mu);
        kv_err rv = run_job(db, &j); /* returns with mu held */
        if (rv != KV_OK)
            db->retry_at = kv_now_ns() + BACKOFF_NS;
    }
    pthread_mutex_unlock(&db->mu);
    return NULL;
}

kv_err lsm_compact_start(lsm_db *db)
{
    unsigned n = db->o.compaction_threads;
    db->threads = calloc(n ? n : 1, sizeof(pthread_t));
    if (!db->threads)
        return KV_RESOURCE_EXHAUSTED;
    for (unsigned i = 0; i < n; i++) {
        if (pthread_create(&db->threads[i], NULL, cthread_main, db) != 0) {
            lsm_compact_stop(db);
            return KV_INTERNAL;
        }
        db->nthreads++;
    }
    return KV_OK;
}

void lsm_compact_stop(lsm_db *db)
{
    pthread_mutex_lock(&db->mu);
    db->stop = true;
    pthread_cond_broadcast(&db->cv);
    pthread_mutex_unlock(&db->mu);
    for (unsigned i = 0; i < db->nthreads; i++)
        pthread_join(db->threads[i], NULL);
    db->nthreads = 0;
    free(db->threads);
    db->threads = NULL;
}

static bool needs_work(lsm_db *db)
{
    lsm_version *v = lsm_db_current(db);
    bool need = false;
    for (int l = 0; l < LSM_MAX_LEVELS - 1 && !need; l++)
        need = v->nfiles[l] && score(db, v, l) >= 1.0;
    lsm_version_unref(v);
    return need && !db->space_blocked; /* a job that cannot get room is not pending work */
}

kv_err lsm_compact_wait_idle(lsm_db *db)
{
    pthread_mutex_lock(&db->mu);
    while (db->bg_err == KV_OK && !db->stop &&
           (db->running || (db->nthreads && !db->o.no_auto_compaction && needs_work(db))))
        pthread_cond_wait(&db->cv, &db->mu);
    kv_err rv = db->bg_err;
    if (rv == KV_OK && db->space_blocked && !db->running && !db->stop)
        rv = KV_RESOURCE_EXHAUSTED; /* due work waits for room on the fast volume */
    pthread_mutex_unlock(&db->mu);
    return rv;
}

/* One manual job: all files of level from into to (from + 1, or from itself
 * for a cleanup of the deepest level), with the cleanup filter f (may be
 * NULL). mu held on entry and on return. */
static kv_err manual_level(lsm_db *db, int from, int to, cfilter *f)
{
    KV_ASSERT_LOCKED(&db->mu);
    uint64_t fread = atomic_load(&db->flushed_pub);
    cjob j = {.from = from, .to = to, .fread = fread, .base = lsm_db_current(db), .filter = f};
    kv_err rv = job_inputs(db, &j, 0, j.base->nfiles[from], NULL);
    if (rv != KV_OK) {
        free(j.in[0]);
        free(j.in[1]);
        lsm_version_unref(j.base);
        return rv;
    }
    db->busy[from] = db->busy[to] = true;
    db->running++;
    pthread_mutex_unlock(&db->mu);
    return run_job(db, &j);
}

/* Waits for background jobs and blocks them (mu held on entry and exit). */
static void manual_begin(lsm_db *db)
{
    KV_ASSERT_LOCKED(&db->mu);
    while (db->manual)
        pthread_cond_wait(&db->cv, &db->mu);
    db->manual = true;
    while (db->running)
        pthread_cond_wait(&db->cv, &db->mu);
}

kv_err lsm_compact_level(lsm_db *db, int level)
{
    if (level < 0 || level >= LSM_MAX_LEVELS - 1)
        return KV_INVALID_ARGUMENT;
    pthread_mutex_lock(&db->mu);
    manual_begin(db);
    kv_err rv = db->cur->nfiles[level] ? manual_level(db, level, level + 1, NULL) : KV_OK;
    db->manual = false;
    pthread_cond_broadcast(&db->cv);
    pthread_mutex_unlock(&db->mu);
    return rv;
}

/* lsm_compact_all, with the cleanup filter f when not NULL: then every file
 * is an input of some step (see cjob.filter), and when no step runs (only
 * the deepest level holds files) that level is rewritten into itself. */
static kv_err compact_all(lsm_db *db, cfilter *f)
{
    pthread_mutex_lock(&db->mu);
    manual_begin(db);
    kv_err rv = KV_OK;
    int deepest = 0;
    bool ran = false;
    for (int l = 0; l < LSM_MAX_LEVELS; l++)
        if (db->cur->nfiles[l])
            deepest = l;
    for (int l = 0; l < (deepest ? deepest : 1) && rv == KV_OK; l++) {
        if (db->cur->nfiles[l]) {
            rv = manual_level(db, l, l + 1, f);
            ran = true;
        }
    }
    if (rv == KV_OK && f && !ran && db->cur->nfiles[deepest])
        rv = manual_level(db, deepest, deepest, f);
    if (f) /* a memory-tier fill that looked a rejected key up before this fails */
        atomic_fetch_add(&db->flush_gen, 1);
    db->manual = false;
    pthread_cond_broadcast(&db->cv);
    pthread_mutex_unlock(&db->mu);
    return rv;
}

kv_err lsm_compact_all(lsm_db *db)
{
    return compact_all(db, NULL);
}

kv_err lsm_compact_all_filter(lsm_db *db, lsm_keep_fn keep, void *arg, uint64_t *dropped)
{
    if (!keep)
        return KV_INVALID_ARGUMENT;
    if (db->promo)
        lsm_promo_sync(db); /* buffered promotions land in L0 first, to be filtered */
    cfilter f = {keep, arg, 0};
    kv_err rv = compact_all(db, &f);
    if (rv == KV_OK && dropped)
        *dropped = f.dropped;
    return rv;
}
