/* SPDX-License-Identifier: MIT */
/*
 * hint_store: add/replay round trips, order, batching by bytes, a send
 * failure and the resume, crash recovery (reopen, torn tail, corrupt frame
 * in the middle), the max_bytes bound and the lost mark across restarts,
 * expiry under a fake clock, clear_lost, forget, target names, and adders
 * racing a replay (every hint delivered exactly once, in order per adder).
 */
#include "tests/kv_testfw.h"
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "node/hints.h"

static char dir[64];
static _Atomic uint64_t fake_now;

static uint64_t fake_clock(void *arg)
{
    (void)arg;
    return atomic_load(&fake_now);
}

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kv-hints-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    atomic_store(&fake_now, 5000000);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(hints, .init = setup, .fini = teardown, .timeout = 120);

static hint_store *open_store(uint64_t max_bytes, uint64_t window_ms, uint64_t seg_bytes)
{
    hint_opts o = {.dir = dir,
                   .max_bytes = max_bytes,
                   .window_ms = window_ms,
                   .seg_bytes = seg_bytes,
                   .now_ms = fake_clock};
    hint_store *h = NULL;
    char err[256] = "";
    kv_err rv = hint_store_open(&h, &o, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "hint_store_open: %s (%s)", kv_strerror(rv), err);
    return h;
}

/* ---- hints with a recognisable content: "<tag>:<seq>:" then filler ---- */

static size_t make_hint(uint8_t *buf, size_t size, int tag, int seq)
{
    int n = snprintf((char *)buf, size, "%d:%d:", tag, seq);
    for (size_t i = (size_t)n; i < size; i++)
        buf[i] = (uint8_t)('a' + (seq + (int)i) % 26);
    return size;
}

static void parse_hint(const uint8_t *p, size_t len, int *tag, int *seq)
{
    char tmp[32];
    size_t n = len < sizeof(tmp) - 1 ? len : sizeof(tmp) - 1;
    memcpy(tmp, p, n);
    tmp[n] = '\0';
    cr_assert_eq(sscanf(tmp, "%d:%d:", tag, seq), 2, "malformed hint delivered");
}

/* Adds hints seq first..first+n-1 of tag, size bytes each, in one call. */
static kv_err add_hints(hint_store *h, const char *target, int tag, int first, int n, size_t size)
{
    uint8_t **bufs = calloc((size_t)n, sizeof(*bufs));
    size_t *lens = calloc((size_t)n, sizeof(*lens));
    cr_assert(bufs && lens);
    for (int i = 0; i < n; i++) {
        bufs[i] = malloc(size);
        cr_assert_not_null(bufs[i]);
        lens[i] = make_hint(bufs[i], size, tag, first + i);
    }
    kv_err rv = hint_store_add(h, target, (const uint8_t *const *)bufs, lens, (size_t)n);
    for (int i = 0; i < n; i++)
        free(bufs[i]);
    free(bufs);
    free(lens);
    return rv;
}

static void add_ok(hint_store *h, const char *target, int tag, int first, int n, size_t size)
{
    kv_err rv = add_hints(h, target, tag, first, n, size);
    cr_assert_eq(rv, KV_OK, "hint_store_add: %s", kv_strerror(rv));
}

/* ---- a receiver recording what it gets ---- */

typedef struct sink {
    pthread_mutex_t mu;
    int *tags, *seqs;
    size_t *sizes;
    size_t n, cap;
    size_t calls, fail_call; /* fail_call: the call (1-based) answered UNAVAILABLE */
    size_t max_batch;        /* the bound the batches must respect */
    void (*hook)(struct sink *s);
    hint_store *h;
} sink;

static void sink_init(sink *s, size_t max_batch)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    s->max_batch = max_batch;
}

static void sink_free(sink *s)
{
    free(s->tags);
    free(s->seqs);
    free(s->sizes);
    pthread_mutex_destroy(&s->mu);
}

static void sink_push(sink *s, int tag, int seq, size_t size)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->tags = realloc(s->tags, s->cap * sizeof(int));
        s->seqs = realloc(s->seqs, s->cap * sizeof(int));
        s->sizes = realloc(s->sizes, s->cap * sizeof(size_t));
        cr_assert(s->tags && s->seqs && s->sizes);
    }
    s->tags[s->n] = tag;
    s->seqs[s->n] = seq;
    s->sizes[s->n++] = size;
}

static kv_err sink_send(void *arg, const uint8_t *const *hints, const size_t *lens, size_t n)
{
    sink *s = arg;
    cr_assert_gt(n, 0);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += lens[i];
    cr_assert(n == 1 || bytes <= s->max_batch, "batch of %zu hints, %zu bytes > %zu", n, bytes,
              s->max_batch);
    pthread_mutex_lock(&s->mu);
    size_t call = ++s->calls;
    pthread_mutex_unlock(&s->mu);
    if (call == s->fail_call)
        return KV_UNAVAILABLE;
    if (s->hook)
        s->hook(s);
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n; i++) {
        int tag, seq;
        parse_hint(hints[i], lens[i], &tag, &seq);
        uint8_t want[256];
        cr_assert_leq(lens[i], sizeof(want));
        make_hint(want, lens[i], tag, seq);
        cr_assert(memcmp(want, hints[i], lens[i]) == 0, "hint %d:%d corrupted", tag, seq);
        sink_push(s, tag, seq, lens[i]);
    }
    pthread_mutex_unlock(&s->mu);
    return KV_OK;
}

static uint64_t replay_ok(hint_store *h, const char *target, sink *s)
{
    uint64_t sent = 0;
    kv_err rv = hint_store_replay(h, target, sink_send, s, s->max_batch, &sent);
    cr_assert_eq(rv, KV_OK, "hint_store_replay: %s", kv_strerror(rv));
    return sent;
}

static hint_target_info info_ok(hint_store *h, const char *target)
{
    hint_target_info i;
    kv_err rv = hint_store_info(h, target, &i);
    cr_assert_eq(rv, KV_OK, "hint_store_info(%s): %s", target, kv_strerror(rv));
    cr_assert_str_eq(i.target, target);
    return i;
}

/* ---- files ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Segment files of target, sorted; returns how many (names in out, cap). */
static size_t seg_files(const char *target, char out[][300], size_t cap)
{
    char path[200];
    snprintf(path, sizeof(path), "%s/%s", dir, target);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    char *names[256];
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 256;) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".hint") == 0)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n; i++) {
        if (i < cap)
            snprintf(out[i], 300, "%s/%s", path, names[i]);
        free(names[i]);
    }
    return n;
}

static uint64_t file_size(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "stat %s", path);
    return (uint64_t)st.st_size;
}

static void flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x5a;
    cr_assert_eq(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

/* ---- tests ---- */

Test(hints, round_trip)
{
    hint_store *h = open_store(0, 0, 0);
    int n = 0;
    for (int size = 20; size <= 200; size += 30, n++)
        add_ok(h, "n2", 1, n, 1, (size_t)size);
    hint_target_info i = info_ok(h, "n2");
    cr_assert_eq(i.records, (uint64_t)n);
    cr_assert_gt(i.bytes, 0);
    cr_assert_eq(i.bytes, hint_store_total_bytes(h));
    cr_assert_eq(i.oldest_ms, atomic_load(&fake_now));
    cr_assert_not(i.lost);

    sink s;
    sink_init(&s, 1 << 20);
    cr_assert_eq(replay_ok(h, "n2", &s), (uint64_t)n);
    cr_assert_eq(s.n, (size_t)n);
    for (int k = 0; k < n; k++) {
        cr_assert_eq(s.seqs[k], k);
        cr_assert_eq(s.sizes[k], (size_t)(20 + 30 * k));
    }
    i = info_ok(h, "n2");
    cr_assert_eq(i.records, 0);
    cr_assert_eq(i.replayed, (uint64_t)n);
    cr_assert_eq(i.bytes, 0);
    cr_assert_eq(hint_store_total_bytes(h), 0);
    char files[4][300];
    cr_assert_eq(seg_files("n2", files, 4), 0, "acknowledged segments are removed");
    /* nothing left: a second replay delivers nothing */
    cr_assert_eq(replay_ok(h, "n2", &s), 0);
    cr_assert_eq(replay_ok(h, "never-seen", &s), 0);
    sink_free(&s);
    hint_store_close(h);
}

Test(hints, order_across_calls_and_segments)
{
    size_t size = 100;
    hint_store *h = open_store(0, 0, 4 * size); /* a few hints per segment */
    int seq = 0;
    for (int call = 1; call <= 12; call++) {
        add_ok(h, "n3", 7, seq, call % 4 + 1, size);
        seq += call % 4 + 1;
    }
    char files[64][300];
    cr_assert_gt(seg_files("n3", files, 64), 1, "rotation produced several segments");
    sink s;
    sink_init(&s, 3 * size);
    cr_assert_eq(replay_ok(h, "n3", &s), (uint64_t)seq);
    for (int k = 0; k < seq; k++)
        cr_assert_eq(s.seqs[k], k, "hint %d delivered at position %d", s.seqs[k], k);
    cr_assert_eq(seg_files("n3", files, 64), 0);
    sink_free(&s);
    hint_store_close(h);
}

Test(hints, batches_by_bytes)
{
    size_t size = 64, per = 3;
    size_t max_batch = per * size + size / 2;
    hint_store *h = open_store(0, 0, 0);
    int n = 10;
    add_ok(h, "n4", 1, 0, n, size);
    add_ok(h, "n4", 1, n, 1, max_batch + 10); /* larger than a batch: goes alone */
    add_ok(h, "n4", 1, n + 1, 2, size);
    sink s;
    sink_init(&s, max_batch); /* sink_send asserts the bound per batch */
    cr_assert_eq(replay_ok(h, "n4", &s), (uint64_t)n + 3);
    size_t expect = ((size_t)n + per - 1) / per + 1 + 1;
    cr_assert_eq(s.calls, expect, "%zu batches, expected %zu", s.calls, expect);
    for (int k = 0; k < n + 3; k++)
        cr_assert_eq(s.seqs[k], k);
    sink_free(&s);
    hint_store_close(h);
}

Test(hints, send_failure_then_resume)
{
    size_t size = 50;
    hint_store *h = open_store(0, 0, 6 * size);
    int n = 40;
    for (int k = 0; k < n; k += 5)
        add_ok(h, "n5", 2, k, 5, size);
    sink s;
    sink_init(&s, 4 * size);
    s.fail_call = 4;
    uint64_t sent = 12345;
    kv_err rv = hint_store_replay(h, "n5", sink_send, &s, s.max_batch, &sent);
    cr_assert_eq(rv, KV_UNAVAILABLE, "the send error is returned: %s", kv_strerror(rv));
    cr_assert_eq(sent, 12345, "out-parameter untouched on error");
    size_t first = s.n;
    cr_assert_gt(first, 0);
    cr_assert_lt(first, (size_t)n);
    hint_target_info i = info_ok(h, "n5");
    cr_assert_eq(i.replayed, first);
    cr_assert_eq(i.records, (uint64_t)n - first);
    cr_assert_not(i.lost);

    s.fail_call = 0;
    cr_assert_eq(replay_ok(h, "n5", &s), (uint64_t)n - first);
    cr_assert_eq(s.n, (size_t)n, "nothing lost, nothing delivered twice");
    for (int k = 0; k < n; k++)
        cr_assert_eq(s.seqs[k], k, "nothing skipped");
    cr_assert_eq(hint_store_total_bytes(h), 0);
    sink_free(&s);
    hint_store_close(h);
}

Test(hints, recovery_after_close)
{
    size_t size = 80;
    int first = 7, second = 6, other = 3, later = 2, all = first + second;
    hint_store *h = open_store(0, 0, 5 * size);
    add_ok(h, "n6", 1, 0, first, size);
    add_ok(h, "n6", 1, first, second, size);
    add_ok(h, "n7", 2, 0, other, size);
    uint64_t bytes = hint_store_total_bytes(h);
    hint_store_close(h);

    h = open_store(0, 0, 5 * size);
    cr_assert_eq(hint_store_total_bytes(h), bytes);
    cr_assert_eq(info_ok(h, "n6").records, (uint64_t)all);
    cr_assert_eq(info_ok(h, "n7").records, (uint64_t)other);
    hint_target_info *list;
    size_t n;
    cr_assert_eq(hint_store_list(h, &list, &n), KV_OK);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(list[0].target, "n6");
    cr_assert_str_eq(list[1].target, "n7");
    free(list);
    add_ok(h, "n6", 1, all, later, size); /* appends after a restart go after the old ones */
    sink s;
    sink_init(&s, 1 << 20);
    cr_assert_eq(replay_ok(h, "n6", &s), (uint64_t)(all + later));
    for (int k = 0; k < all + later; k++)
        cr_assert_eq(s.seqs[k], k);
    sink_free(&s);
    hint_store_close(h);

    hint_opts o = {.dir = dir};
    hint_store *a = open_store(0, 0, 0), *b = NULL;
    char err[256];
    cr_assert_eq(hint_store_open(&b, &o, err, sizeof(err)), KV_FAILED_PRECONDITION,
                 "one handle per directory");
    hint_store_close(a);
}

Test(hints, torn_tail_truncated)
{
    size_t size = 90;
    int n = 6;
    hint_store *h = open_store(0, 0, 0);
    add_ok(h, "n8", 1, 0, n, size);
    hint_store_close(h);
    char files[4][300];
    cr_assert_eq(seg_files("n8", files, 4), 1);
    uint64_t full = file_size(files[0]), frame = full / (uint64_t)n;
    cr_assert_eq(truncate(files[0], (off_t)(full - frame / 2)), 0); /* half the last frame */

    h = open_store(0, 0, 0);
    hint_target_info i = info_ok(h, "n8");
    cr_assert_eq(i.records, (uint64_t)n - 1);
    cr_assert_not(i.lost, "a torn tail was never acknowledged: nothing is lost");
    cr_assert_eq(file_size(files[0]), full - frame, "the torn frame is cut off");
    hint_store_close(h);

    /* zeros after the last frame (a crash after the size grew) */
    FILE *f = fopen(files[0], "ab");
    cr_assert_not_null(f);
    for (int k = 0; k < 100; k++)
        fputc(0, f);
    fclose(f);
    h = open_store(0, 0, 0);
    cr_assert_eq(info_ok(h, "n8").records, (uint64_t)n - 1);
    cr_assert_eq(file_size(files[0]), full - frame);
    sink s;
    sink_init(&s, 1 << 20);
    cr_assert_eq(replay_ok(h, "n8", &s), (uint64_t)n - 1);
    for (int k = 0; k < n - 1; k++)
        cr_assert_eq(s.seqs[k], k);
    sink_free(&s);
    hint_store_close(h);
}

Test(hints, corrupt_frame_in_the_middle)
{
    size_t size = 70;
    int n = 5, more = 3, bad = 2;
    hint_store *h = open_store(0, 0, 0);
    add_ok(h, "n9", 1, 0, n, size);
    hint_store_close(h);
    h = open_store(0, 0, 0); /* a new segment after the restart */
    add_ok(h, "n9", 1, n, more, size);
    hint_store_close(h);
    char files[4][300];
    cr_assert_eq(seg_files("n9", files, 4), 2);
    uint64_t frame = file_size(files[0]) / (uint64_t)n;
    flip_byte(files[0], frame * (uint64_t)(bad + 1) - 1); /* last payload byte of frame bad */

    h = open_store(0, 0, 0);
    hint_target_info i = info_ok(h, "n9");
    cr_assert_eq(i.corrupt, 1);
    cr_assert(i.lost, "hints behind a corrupt frame are lost: repair needed");
    cr_assert_eq(i.records, (uint64_t)(bad + more));
    cr_assert_eq(file_size(files[0]), frame * (uint64_t)n, "the rest is kept");
    sink s;
    sink_init(&s, 2 * size);
    cr_assert_eq(replay_ok(h, "n9", &s), (uint64_t)(bad + more));
    for (int k = 0; k < bad; k++)
        cr_assert_eq(s.seqs[k], k);
    for (int k = 0; k < more; k++)
        cr_assert_eq(s.seqs[bad + k], n + k, "the next segment is replayed");
    cr_assert_eq(seg_files("n9", files, 4), 0);
    cr_assert_eq(hint_store_total_bytes(h), 0);
    sink_free(&s);
    hint_store_close(h);

    h = open_store(0, 0, 0);
    cr_assert(info_ok(h, "n9").lost, "the lost mark survives a restart");
    hint_store_close(h);
}

Test(hints, max_bytes_overflow)
{
    size_t size = 100;
    hint_store *h = open_store(0, 0, 0);
    add_ok(h, "probe", 0, 0, 1, size);
    uint64_t frame = hint_store_total_bytes(h); /* bytes one hint takes on disk */
    hint_store_close(h);
    teardown();
    setup();

    int per_call = 3;
    uint64_t max = frame * 10 + frame / 2;
    h = open_store(max, 0, 0);
    int stored = 0;
    kv_err rv;
    while ((rv = add_hints(h, "n10", 1, stored, per_call, size)) == KV_OK)
        stored += per_call;
    cr_assert_eq(rv, KV_RESOURCE_EXHAUSTED, "%s", kv_strerror(rv));
    cr_assert_leq(hint_store_total_bytes(h), max);
    hint_target_info i = info_ok(h, "n10");
    cr_assert_eq(i.records, (uint64_t)stored, "nothing of the failed call is stored");
    cr_assert(i.lost);
    cr_assert_eq(i.dropped, (uint64_t)per_call);
    cr_assert_eq(add_hints(h, "n11", 1, 0, per_call, size), KV_RESOURCE_EXHAUSTED,
                 "bound is global");
    hint_store_close(h);

    h = open_store(max, 0, 0);
    i = info_ok(h, "n10");
    cr_assert(i.lost);
    cr_assert_eq(i.dropped, (uint64_t)per_call, "dropped survives a restart");
    cr_assert_eq(info_ok(h, "n11").dropped, (uint64_t)per_call);
    sink s;
    sink_init(&s, 1 << 20);
    cr_assert_eq(replay_ok(h, "n10", &s), (uint64_t)stored);
    cr_assert_eq(hint_store_total_bytes(h), 0, "acknowledged segments free their bytes");
    add_ok(h, "n10", 1, stored, per_call, size);
    cr_assert_eq(hint_store_clear_lost(h, "n10"), KV_OK);
    cr_assert_not(info_ok(h, "n10").lost);
    hint_store_close(h);

    h = open_store(max, 0, 0);
    i = info_ok(h, "n10");
    cr_assert_not(i.lost, "clear_lost is durable");
    cr_assert_eq(i.dropped, (uint64_t)per_call);
    cr_assert_eq(i.records, (uint64_t)per_call);
    cr_assert(info_ok(h, "n11").lost);
    cr_assert_eq(hint_store_clear_lost(h, "unknown"), KV_NOT_FOUND);
    sink_free(&s);
    hint_store_close(h);
}

/* A segment file deleted behind the store's back: its hints are lost, the
 * other segments are still replayed. */
Test(hints, missing_segment_file)
{
    size_t size = 50;
    hint_store *h = open_store(0, 0, 2 * size); /* one hint a segment */
    int n = 5, gone = 2;
    for (int k = 0; k < n; k++)
        add_ok(h, "n16", 1, k, 1, size);
    char files[8][300];
    cr_assert_eq(seg_files("n16", files, 8), (size_t)n);
    cr_assert_eq(unlink(files[gone]), 0);
    sink s;
    sink_init(&s, 1 << 20);
    cr_assert_eq(replay_ok(h, "n16", &s), (uint64_t)n - 1);
    for (int k = 0; k < n - 1; k++)
        cr_assert_eq(s.seqs[k], k < gone ? k : k + 1);
    hint_target_info i = info_ok(h, "n16");
    cr_assert_eq(i.corrupt, 1);
    cr_assert(i.lost);
    cr_assert_eq(i.records, 0);
    cr_assert_eq(hint_store_total_bytes(h), 0);
    sink_free(&s);
    hint_store_close(h);
}

/* A write that fails half-way (the file size limit stands in for a full
 * disk) is cut off again: the hints before it stay readable, later adds go
 * after them, and the target is marked lost. */
Test(hints, failed_write_is_cut_off)
{
    size_t size = 100;
    hint_store *h = open_store(0, 0, 0);
    add_ok(h, "n15", 1, 0, 1, size);
    uint64_t frame = hint_store_total_bytes(h);
    char files[4][300];
    cr_assert_eq(seg_files("n15", files, 4), 1);

    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = (rlim_t)(frame * 5 + frame / 2);
    signal(SIGXFSZ, SIG_IGN);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int stored = 1;
    kv_err rv;
    while ((rv = add_hints(h, "n15", 1, stored, 1, size)) == KV_OK && stored < 100)
        stored++;
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_assert_neq(rv, KV_OK, "the write past the limit fails");
    cr_assert_eq(file_size(files[0]), frame * (uint64_t)stored, "the partial write is cut off");
    hint_target_info i = info_ok(h, "n15");
    cr_assert_eq(i.records, (uint64_t)stored);
    cr_assert(i.lost);
    cr_assert_eq(i.dropped, 1);
    cr_assert_eq(hint_store_total_bytes(h), frame * (uint64_t)stored);

    add_ok(h, "n15", 1, stored + 1, 2, size); /* seq stored was dropped */
    hint_store_close(h);
    h = open_store(0, 0, 0);
    sink s;
    sink_init(&s, 1 << 20);
    cr_assert_eq(replay_ok(h, "n15", &s), (uint64_t)stored + 2);
    for (int k = 0; k < stored; k++)
        cr_assert_eq(s.seqs[k], k);
    cr_assert_eq(s.seqs[stored], stored + 1);
    cr_assert_eq(s.seqs[stored + 1], stored + 2);
    sink_free(&s);
    hint_store_close(h);
}

Test(hints, window_expiry)
{
    size_t size = 60;
    uint64_t window = 1000;
    int old = 7, young = 4, aged = 2, fresh = 2;
    hint_store *h = open_store(0, window, 3 * size); /* 2 hints a segment */
    for (int k = 0; k < old; k++)
        add_ok(h, "n12", 1, k, 1, size); /* whole segments and part of one */
    atomic_fetch_add(&fake_now, window / 2 + 100);
    uint64_t young_at = atomic_load(&fake_now);
    for (int k = old; k < old + young; k++)
        add_ok(h, "n12", 1, k, 1, size);
    atomic_fetch_add(&fake_now, window / 2 + 100); /* the old ones are now past the window */
    uint64_t dropped = 99;
    cr_assert_eq(hint_store_expire(h, &dropped), KV_OK);
    cr_assert_eq(dropped, (uint64_t)old);
    hint_target_info i = info_ok(h, "n12");
    cr_assert_eq(i.records, (uint64_t)young);
    cr_assert_eq(i.dropped, (uint64_t)old);
    cr_assert(i.lost);
    cr_assert_eq(i.oldest_ms, young_at);
    cr_assert_eq(hint_store_expire(h, &dropped), KV_OK);
    cr_assert_eq(dropped, 0, "nothing else is old");

    sink s;
    sink_init(&s, 1 << 20);
    cr_assert_eq(replay_ok(h, "n12", &s), (uint64_t)young);
    for (int k = 0; k < young; k++)
        cr_assert_eq(s.seqs[k], old + k);

    /* a replay drops what has grown old instead of sending it */
    int next = old + young;
    add_ok(h, "n12", 1, next, aged, size);
    atomic_fetch_add(&fake_now, window + 1);
    add_ok(h, "n12", 1, next + aged, fresh, size);
    cr_assert_eq(replay_ok(h, "n12", &s), (uint64_t)fresh);
    for (int k = 0; k < fresh; k++)
        cr_assert_eq(s.seqs[young + k], next + aged + k);
    i = info_ok(h, "n12");
    cr_assert_eq(i.dropped, (uint64_t)(old + aged));
    cr_assert_eq(i.records, 0);
    cr_assert_eq(hint_store_total_bytes(h), 0);
    sink_free(&s);
    hint_store_close(h);

    h = open_store(0, window, 3 * size);
    cr_assert_eq(info_ok(h, "n12").dropped, (uint64_t)(old + aged));
    hint_store_close(h);
}

Test(hints, forget)
{
    size_t size = 40;
    int gone = 9, kept_n = 4;
    hint_store *h = open_store(0, 0, 2 * size);
    add_ok(h, "gone", 1, 0, gone, size);
    add_ok(h, "kept", 2, 0, kept_n, size);
    uint8_t small[8] = {0};
    const uint8_t *sp = small;
    size_t huge = (size_t)HINT_MAX_LEN + 1; /* rejected before it is read */
    cr_assert_eq(hint_store_add(h, "gone", &sp, &huge, 1), KV_INVALID_ARGUMENT);
    uint64_t kept = info_ok(h, "kept").bytes;
    cr_assert_eq(hint_store_forget(h, "gone"), KV_OK);
    hint_target_info i;
    cr_assert_eq(hint_store_info(h, "gone", &i), KV_NOT_FOUND);
    cr_assert_eq(hint_store_forget(h, "gone"), KV_NOT_FOUND);
    cr_assert_eq(hint_store_total_bytes(h), kept);
    char path[200];
    snprintf(path, sizeof(path), "%s/gone", dir);
    struct stat st;
    cr_assert_neq(stat(path, &st), 0, "the target's directory is removed");
    /* the target can come back */
    add_ok(h, "gone", 3, 0, 1, size);
    cr_assert_eq(info_ok(h, "gone").records, 1);
    cr_assert_eq(hint_store_forget(h, "gone"), KV_OK);
    hint_store_close(h);

    h = open_store(0, 0, 2 * size);
    cr_assert_eq(hint_store_info(h, "gone", &i), KV_NOT_FOUND);
    cr_assert_eq(info_ok(h, "kept").records, (uint64_t)kept_n);
    hint_store_close(h);
}

Test(hints, target_names_and_arguments)
{
    hint_store *h = open_store(0, 0, 0);
    char longest[HINT_TARGET_MAX + 2];
    memset(longest, 'x', sizeof(longest));
    longest[HINT_TARGET_MAX + 1] = '\0';
    const char *bad[] = {"", ".", "..", "a/b", "a b", "n\xc3\xa9", "n:1", longest, NULL};
    uint8_t hint[] = "h";
    const uint8_t *hp = hint;
    size_t len = 1;
    sink s;
    sink_init(&s, 100);
    hint_target_info i;
    for (int k = 0; k < 9; k++) {
        cr_assert_eq(hint_store_add(h, bad[k], &hp, &len, 1), KV_INVALID_ARGUMENT, "%s", bad[k]);
        cr_assert_eq(hint_store_replay(h, bad[k], sink_send, &s, 100, NULL), KV_INVALID_ARGUMENT);
        cr_assert_eq(hint_store_info(h, bad[k], &i), KV_INVALID_ARGUMENT);
        cr_assert_eq(hint_store_clear_lost(h, bad[k]), KV_INVALID_ARGUMENT);
        cr_assert_eq(hint_store_forget(h, bad[k]), KV_INVALID_ARGUMENT);
    }
    longest[HINT_TARGET_MAX] = '\0';
    cr_assert_eq(hint_store_add(h, longest, &hp, &len, 1), KV_OK);
    cr_assert_eq(hint_store_add(h, "Node-1.a_b", &hp, &len, 1), KV_OK);
    size_t zero = 0;
    cr_assert_eq(hint_store_add(h, "n1", &hp, &zero, 1), KV_INVALID_ARGUMENT);
    cr_assert_eq(hint_store_add(h, "n1", &hp, &len, 0), KV_INVALID_ARGUMENT);
    cr_assert_eq(hint_store_replay(h, "n1", NULL, NULL, 100, NULL), KV_INVALID_ARGUMENT);
    cr_assert_eq(hint_store_info(h, "n1", &i), KV_NOT_FOUND, "invalid adds leave no trace");
    hint_target_info *list;
    size_t n;
    cr_assert_eq(hint_store_list(h, &list, &n), KV_OK);
    cr_assert_eq(n, 2);
    free(list);
    sink_free(&s);
    hint_store_close(h);
}

/* Calls made from inside send: a second replay, and an add kept for later. */
static void reenter(sink *s)
{
    if (s->calls != 1)
        return;
    uint64_t sent;
    sink other;
    sink_init(&other, 100);
    cr_assert_eq(hint_store_replay(s->h, "n13", sink_send, &other, 100, &sent),
                 KV_FAILED_PRECONDITION, "one replay per target");
    sink_free(&other);
    cr_assert_eq(add_hints(s->h, "n13", 1, 1000, 1, 30), KV_OK);
    hint_target_info i = info_ok(s->h, "n13");
    cr_assert(i.replaying);
}

Test(hints, replay_is_exclusive_and_bounded)
{
    int n = 4;
    hint_store *h = open_store(0, 0, 0);
    add_ok(h, "n13", 1, 0, n, 30);
    sink s;
    sink_init(&s, 30);
    s.hook = reenter;
    s.h = h;
    cr_assert_eq(replay_ok(h, "n13", &s), (uint64_t)n, "the hint added meanwhile waits");
    hint_target_info i = info_ok(h, "n13");
    cr_assert_eq(i.records, 1);
    cr_assert_not(i.replaying);
    s.hook = NULL;
    cr_assert_eq(replay_ok(h, "n13", &s), 1);
    cr_assert_eq(s.seqs[n], 1000, "added from inside the first replay");
    sink_free(&s);
    hint_store_close(h);
}

/* ---- concurrency ---- */

#define ADDERS 4
#define ADDS 300

typedef struct adder {
    hint_store *h;
    int tag;
} adder;

static _Atomic int adders_done;

static void *adder_main(void *arg)
{
    adder *a = arg;
    for (int seq = 0; seq < ADDS;) {
        int n = seq % 3 + 1 < ADDS - seq ? seq % 3 + 1 : ADDS - seq;
        kv_err rv = add_hints(a->h, "busy", a->tag, seq, n, 40 + (size_t)a->tag * 8);
        cr_assert_eq(rv, KV_OK, "%s", kv_strerror(rv));
        seq += n;
        if (seq % 50 == 0) {
            hint_target_info *list;
            size_t cnt;
            cr_assert_eq(hint_store_list(a->h, &list, &cnt), KV_OK);
            free(list);
        }
    }
    atomic_fetch_add(&adders_done, 1);
    return NULL;
}

static void *replayer_main(void *arg)
{
    sink *s = arg;
    while (atomic_load(&adders_done) < ADDERS) {
        uint64_t sent, dropped;
        kv_err rv = hint_store_replay(s->h, "busy", sink_send, s, s->max_batch, &sent);
        cr_assert_eq(rv, KV_OK, "%s", kv_strerror(rv));
        cr_assert_eq(hint_store_expire(s->h, &dropped), KV_OK);
        cr_assert_eq(dropped, 0);
        usleep(200); /* let the adders in */
    }
    return NULL;
}

Test(hints, adders_race_a_replay)
{
    /* a window that expires nothing but makes expire() read the segments */
    hint_store *h = open_store(0, 1000000, 2048);
    atomic_store(&adders_done, 0);
    sink s;
    sink_init(&s, 500);
    s.h = h;
    pthread_t th[ADDERS], rp;
    adder ad[ADDERS];
    cr_assert_eq(pthread_create(&rp, NULL, replayer_main, &s), 0);
    for (int k = 0; k < ADDERS; k++) {
        ad[k] = (adder){h, k + 1};
        cr_assert_eq(pthread_create(&th[k], NULL, adder_main, &ad[k]), 0);
    }
    for (int k = 0; k < ADDERS; k++)
        pthread_join(th[k], NULL);
    pthread_join(rp, NULL);
    replay_ok(h, "busy", &s);

    cr_assert_eq(s.n, (size_t)ADDERS * ADDS, "every hint delivered exactly once");
    int next[ADDERS + 1] = {0};
    for (size_t k = 0; k < s.n; k++) {
        int tag = s.tags[k];
        cr_assert(tag >= 1 && tag <= ADDERS);
        cr_assert_eq(s.seqs[k], next[tag], "adder %d: got %d, expected %d", tag, s.seqs[k],
                     next[tag]);
        next[tag]++;
    }
    hint_target_info i = info_ok(h, "busy");
    cr_assert_eq(i.records, 0);
    cr_assert_eq(i.replayed, (uint64_t)ADDERS * ADDS);
    cr_assert_eq(i.dropped, 0);
    cr_assert_not(i.lost);
    cr_assert_eq(hint_store_total_bytes(h), 0);
    sink_free(&s);
    hint_store_close(h);
}

/* forget racing adds and replays of the same target (a replay it interrupts
 * returns ABORTED): no hint is delivered twice or out of order, and the
 * byte count returns to 0. */
typedef struct churn {
    hint_store *h;
    sink *s;
    _Atomic int stop;
} churn;

static void *churn_add(void *arg)
{
    churn *c = arg;
    for (int seq = 0; !atomic_load(&c->stop); seq += 2) {
        kv_err rv = add_hints(c->h, "churn", 1, seq, 2, 40);
        cr_assert_eq(rv, KV_OK, "%s", kv_strerror(rv));
    }
    return NULL;
}

static void *churn_replay(void *arg)
{
    churn *c = arg;
    while (!atomic_load(&c->stop)) {
        kv_err rv = hint_store_replay(c->h, "churn", sink_send, c->s, 200, NULL);
        cr_assert(rv == KV_OK || rv == KV_ABORTED, "%s", kv_strerror(rv));
    }
    return NULL;
}

Test(hints, forget_races_adds_and_replays)
{
    hint_store *h = open_store(0, 0, 512);
    sink s;
    sink_init(&s, 200);
    churn c = {.h = h, .s = &s};
    pthread_t a, r;
    cr_assert_eq(pthread_create(&a, NULL, churn_add, &c), 0);
    cr_assert_eq(pthread_create(&r, NULL, churn_replay, &c), 0);
    for (int k = 0; k < 40; k++) {
        kv_err rv = hint_store_forget(h, "churn");
        cr_assert(rv == KV_OK || rv == KV_NOT_FOUND, "%s", kv_strerror(rv));
        usleep(500);
    }
    atomic_store(&c.stop, 1);
    pthread_join(a, NULL);
    pthread_join(r, NULL);
    for (size_t k = 1; k < s.n; k++)
        cr_assert_gt(s.seqs[k], s.seqs[k - 1], "delivered once, in order");
    sink_free(&s);
    hint_target_info i;
    if (hint_store_info(h, "churn", &i) == KV_OK)
        cr_assert_eq(i.bytes, hint_store_total_bytes(h));
    kv_err rv = hint_store_forget(h, "churn");
    cr_assert(rv == KV_OK || rv == KV_NOT_FOUND);
    cr_assert_eq(hint_store_total_bytes(h), 0);
    hint_store_close(h);
    h = open_store(0, 0, 512);
    cr_assert_eq(hint_store_total_bytes(h), 0, "nothing left on disk");
    hint_store_close(h);
}
