/* SPDX-License-Identifier: MIT */
/*
 * The node's streaming, digest and apply methods against one real kvnode
 * (no cluster map: it holds every key): admin.StreamRead in small chunks
 * resumes without losing or repeating a key and keeps to its ranges,
 * returns tombstones and given keys; admin.Digest's counts and leaves agree
 * with a model; and every method refuses bad input with INVALID_ARGUMENT or
 * FAILED_PRECONDITION, the connection serving on.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"
#include "kv/kv.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "shard/ring.h"

#define KEYS 5000

static char dir[64] = "/tmp/hotkv-stream-XXXXXX", url[64];
static pid_t pid;
static rpc_chan *ch;

static void setup(void)
{
    cr_assert_not_null(mkdtemp(dir));
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", kvt_free_port());
    pid = kvt_node_start(dir, "s1", url, NULL);
    cr_assert_gt(pid, 0, "node start (logs in %s)", dir);
    rpc_chan_opts o = {0};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    kv_client *c = NULL;
    kv_client_opts co = {.timeout_ms = 5000};
    cr_assert_eq(kv_client_open(&c, url, &co), KV_OK);
    char key[16], val[32];
    for (int i = 0; i < KEYS; i++) {
        int kl = snprintf(key, sizeof(key), "k%05d", i), vl = snprintf(val, sizeof(val), "v%d", i);
        cr_assert_eq(kv_put(c, key, (size_t)kl, val, (size_t)vl, NULL, NULL), KV_OK);
    }
    for (int i = 0; i < KEYS; i += 10) {
        int kl = snprintf(key, sizeof(key), "k%05d", i);
        cr_assert_eq(kv_delete(c, key, (size_t)kl, NULL, NULL), KV_OK);
    }
    kv_client_close(c);
}

static void teardown(void)
{
    rpc_chan_close(ch);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    kvt_forget(pid);
    char cmd[128], out[16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    kvt_run(cmd, out, sizeof(out));
}

static bool in_ranges(uint64_t h, const Kv__Range *const *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t lo = r[i]->lo, hi = r[i]->hi;
        bool in = lo < hi ? h > lo && h <= hi : lo > hi ? h > lo || h <= hi : true;
        if (in)
            return true;
    }
    return false;
}

/* Reads ranges in chunks of max bytes; checks that no key comes twice, the
 * order (key order over the lsm engine; kallax streams in its own order,
 * (home block, key), which the test does not compute) and the ranges;
 * returns the records seen and counts tombstones. */
static int read_all(Kv__Range **r, size_t n, uint32_t max, int *tombs, int *calls)
{
    uint8_t last[64] = {0};
    size_t last_len = 0;
    int seen = 0;
    static bool got[KEYS];
    memset(got, 0, sizeof(got));
    const char *eng = getenv("KV_TEST_ENGINE");
    bool key_order = !eng || strcmp(eng, "kallax") != 0;
    *tombs = 0;
    *calls = 0;
    for (bool done = false; !done; (*calls)++) {
        cr_assert_lt(*calls, 100000, "the stream ends");
        Kv__StreamReadRequest req = KV__STREAM_READ_REQUEST__INIT;
        req.n_ranges = n;
        req.ranges = r;
        req.after_key = (ProtobufCBinaryData){last_len, last};
        req.max_bytes = max;
        rpc_reply rep;
        cr_assert_eq(rpc_call(ch, "admin.StreamRead", 0, &req.base, 10000, &rep), KV_OK, "%s",
                     rep.message);
        Kv__StreamReadReply *sr = kv__stream_read_reply__unpack(NULL, rep.len, rep.body);
        cr_assert_not_null(sr);
        for (size_t i = 0; i < sr->n_records; i++) {
            const Kv__Record *rec = sr->records[i];
            size_t cl = rec->key.len < last_len ? rec->key.len : last_len;
            int c = memcmp(rec->key.data, last, cl);
            cr_assert(!key_order || last_len == 0 || c > 0 || (c == 0 && rec->key.len > last_len),
                      "keys strictly ascending across chunks");
            char kb[16] = {0};
            memcpy(kb, rec->key.data, rec->key.len < 15 ? rec->key.len : 15);
            int id = atoi(kb + 1);
            cr_assert(kb[0] == 'k' && id >= 0 && id < KEYS && !got[id], "key %s again", kb);
            got[id] = true;
            cr_assert(
                in_ranges(ring_key_hash(rec->key.data, rec->key.len), (const Kv__Range **)r, n));
            cr_assert_gt(rec->version, 0);
            *tombs += rec->tombstone;
            memcpy(last, rec->key.data, rec->key.len);
            last_len = rec->key.len;
            seen++;
        }
        if (sr->n_records)
            cr_assert(sr->next_key.len == last_len &&
                      memcmp(sr->next_key.data, last, last_len) == 0);
        done = sr->done;
        kv__stream_read_reply__free_unpacked(sr, NULL);
        rpc_reply_free(&rep);
    }
    return seen;
}

Test(stream, chunks_resume_without_loss_and_keep_to_ranges, .init = setup, .fini = teardown,
     .timeout = 120)
{
    Kv__Range whole = KV__RANGE__INIT, *w = &whole;
    int tombs, calls;
    cr_expect_eq(read_all(&w, 1, 4096, &tombs, &calls), KEYS);
    cr_expect_eq(tombs, KEYS / 10, "deletes stream as tombstones");
    cr_expect_gt(calls, 10, "4 KiB chunks: many calls (%d)", calls);
    static const char *const names[2] = {"stream.chunks_continued", "stream.iterators_opened"};
    char v[2][KVT_STAT_LEN];
    cr_assert_eq(kvt_stats(url, NULL, NULL, 2, names, v), KV_OK);
    long cont = v[0][0] ? atol(v[0]) : -1, opened = v[1][0] ? atol(v[1]) : -1;
    cr_expect_eq(opened, 1, "one iterator for the whole stream (%ld)", opened);
    cr_expect_eq(cont, calls - 1, "every later chunk continued it (%ld of %d)", cont, calls);
    Kv__Range a = KV__RANGE__INIT, b = KV__RANGE__INIT, *two[2] = {&a, &b};
    a.lo = 0x1000000000000000ull, a.hi = 0x5000000000000000ull;
    b.lo = 0xe000000000000000ull, b.hi = 0x0800000000000000ull; /* wraps */
    int want = 0;
    char key[16];
    for (int i = 0; i < KEYS; i++) {
        int kl = snprintf(key, sizeof(key), "k%05d", i);
        want += in_ranges(ring_key_hash(key, (size_t)kl), (const Kv__Range **)two, 2);
    }
    cr_expect_eq(read_all(two, 2, 2048, &tombs, &calls), want);
}

Test(stream, digests_agree_with_a_model, .init = setup, .fini = teardown, .timeout = 120)
{
    Kv__Range a = KV__RANGE__INIT, b = KV__RANGE__INIT, *two[2] = {&a, &b};
    a.lo = 0x2000000000000000ull, a.hi = 0x9000000000000000ull;
    b.lo = 0xf000000000000000ull, b.hi = 0x1000000000000000ull;
    Kv__DigestRequest req = KV__DIGEST_REQUEST__INIT;
    req.n_ranges = 2;
    req.ranges = two;
    req.leaves = 8;
    rpc_reply rep;
    cr_assert_eq(rpc_call(ch, "admin.Digest", 0, &req.base, 10000, &rep), KV_OK, "%s", rep.message);
    Kv__DigestReply *d = kv__digest_reply__unpack(NULL, rep.len, rep.body);
    cr_assert(d && d->n_ranges == 2);
    for (int r = 0; r < 2; r++) {
        uint32_t counts[8] = {0};
        uint64_t live = 0, dead = 0;
        char key[16];
        for (int i = 0; i < KEYS; i++) {
            int kl = snprintf(key, sizeof(key), "k%05d", i);
            uint64_t h = ring_key_hash(key, (size_t)kl);
            if (!in_ranges(h, (const Kv__Range **)&two[r], 1))
                continue;
            uint64_t off = h - two[r]->lo - 1, span = two[r]->hi - two[r]->lo;
            counts[(unsigned)(((unsigned __int128)off * 8) / span)]++;
            if (i % 10 == 0)
                dead++;
            else
                live++;
        }
        cr_expect_eq(d->ranges[r]->live, live, "range %d live", r);
        cr_expect_eq(d->ranges[r]->tombstones, dead, "range %d tombstones", r);
        cr_assert_eq(d->ranges[r]->n_leaf_count, 8);
        for (int l = 0; l < 8; l++)
            cr_expect_eq(d->ranges[r]->leaf_count[l], counts[l], "range %d leaf %d", r, l);
    }
    kv__digest_reply__free_unpacked(d, NULL);
    rpc_reply_free(&rep);
}

Test(stream, given_keys_and_apply, .init = setup, .fini = teardown, .timeout = 120)
{
    ProtobufCBinaryData keys[3] = {
        {6, (uint8_t *)"k00001"}, {6, (uint8_t *)"k00010"}, {7, (uint8_t *)"missing"}};
    Kv__StreamReadRequest req = KV__STREAM_READ_REQUEST__INIT;
    req.n_keys = 3;
    req.keys = keys;
    rpc_reply rep;
    cr_assert_eq(rpc_call(ch, "admin.StreamRead", 0, &req.base, 5000, &rep), KV_OK);
    Kv__StreamReadReply *sr = kv__stream_read_reply__unpack(NULL, rep.len, rep.body);
    cr_assert(sr && sr->n_records == 2, "a missing key is left out");
    cr_expect(!sr->records[0]->tombstone && sr->records[0]->value.len == 2);
    cr_expect(sr->records[1]->tombstone, "k00010 was deleted");
    uint64_t v = sr->records[0]->version;
    kv__stream_read_reply__free_unpacked(sr, NULL);
    rpc_reply_free(&rep);
    /* an older version is not applied, a newer one is */
    Kv__Record rec = KV__RECORD__INIT, *rp = &rec;
    rec.key = keys[0];
    rec.value = (ProtobufCBinaryData){3, (uint8_t *)"old"};
    rec.version = v - 1;
    Kv__ApplyRequest ar = KV__APPLY_REQUEST__INIT;
    ar.n_records = 1;
    ar.records = &rp;
    cr_assert_eq(rpc_call(ch, "admin.Apply", 0, &ar.base, 5000, &rep), KV_OK);
    Kv__ApplyReply *a = kv__apply_reply__unpack(NULL, rep.len, rep.body);
    cr_expect_eq(a->applied, 0);
    kv__apply_reply__free_unpacked(a, NULL);
    rpc_reply_free(&rep);
    rec.version = v + 1;
    cr_assert_eq(rpc_call(ch, "admin.Apply", 0, &ar.base, 5000, &rep), KV_OK);
    a = kv__apply_reply__unpack(NULL, rep.len, rep.body);
    cr_expect_eq(a->applied, 1);
    kv__apply_reply__free_unpacked(a, NULL);
    rpc_reply_free(&rep);
}

/* Calls method with msg and expects status code, with a message. */
static void refused(const char *method, const ProtobufCMessage *msg, kv_err code,
                    const char *needle)
{
    rpc_reply rep;
    kv_err rv = rpc_call(ch, method, 0, msg, 5000, &rep);
    cr_expect_eq(rv, code, "%s: want %s, got %s (%s)", method, kv_err_name(code), kv_err_name(rv),
                 rep.message ? rep.message : "");
    cr_expect(rep.message && strstr(rep.message, needle) != NULL, "%s: message \"%s\" lacks \"%s\"",
              method, rep.message ? rep.message : "", needle);
    rpc_reply_free(&rep);
}

Test(stream, bad_input_is_refused, .init = setup, .fini = teardown, .timeout = 120)
{
    Kv__StreamReadRequest sr = KV__STREAM_READ_REQUEST__INIT;
    refused("admin.StreamRead", &sr.base, KV_INVALID_ARGUMENT, "ranges");
    Kv__Range a = KV__RANGE__INIT, b = KV__RANGE__INIT, *two[2] = {&a, &b};
    a.lo = 10, a.hi = 100, b.lo = 50, b.hi = 200;
    sr.n_ranges = 2;
    sr.ranges = two;
    refused("admin.StreamRead", &sr.base, KV_INVALID_ARGUMENT, "overlap");
    Kv__DigestRequest dr = KV__DIGEST_REQUEST__INIT;
    dr.n_ranges = 1;
    dr.ranges = two;
    dr.leaves = 3;
    refused("admin.Digest", &dr.base, KV_INVALID_ARGUMENT, "power of two");
    Kv__StreamJob job = KV__STREAM_JOB__INIT, *jp = &job;
    job.id = "j1";
    Kv__StreamStartRequest st = KV__STREAM_START_REQUEST__INIT;
    st.n_jobs = 1;
    st.jobs = &jp;
    refused("admin.StreamStart", &st.base, KV_INVALID_ARGUMENT, "source address");
    job.source_id = "s1";
    job.source_addr = "tcp://127.0.0.1:1";
    job.n_ranges = 1;
    job.ranges = two;
    refused("admin.StreamStart", &st.base, KV_INVALID_ARGUMENT, "from itself");
    Kv__Record rec = KV__RECORD__INIT, *rp = &rec;
    rec.key = (ProtobufCBinaryData){1, (uint8_t *)"x"};
    Kv__ApplyRequest ar = KV__APPLY_REQUEST__INIT;
    ar.n_records = 1;
    ar.records = &rp;
    refused("admin.Apply", &ar.base, KV_INVALID_ARGUMENT, "version");
    Kv__HintRequest hr = KV__HINT_REQUEST__INIT;
    hr.target = "s1";
    hr.n_records = 1;
    hr.records = &rp;
    refused("admin.Hint", &hr.base, KV_INVALID_ARGUMENT, "another node");
    rpc_reply rep;
    Kv__PingRequest ping = KV__PING_REQUEST__INIT;
    cr_assert_eq(rpc_call(ch, "admin.Ping", 0, &ping.base, 5000, &rep), KV_OK, "still serving");
    rpc_reply_free(&rep);
}
