/* SPDX-License-Identifier: MIT */
/*
 * Writes the seed corpora of tests/fuzz (corpus/<harness>/seed-*) from valid
 * messages and files made by the project's own encoders: cluster maps, flag
 * and INI sets, WAL segments and SSTs and a MANIFEST written by node/lsm,
 * RALT programs, call programs for the node, router and envelope
 * harnesses in their input formats (fuzz_rpc.h), and wire bytes for
 * fuzz_conn. Run by hand after a format
 * changes: `build-fuzz/tests/fuzz/fuzz_seeds tests/fuzz/corpus`; the output
 * is committed. The method indices below follow the tables in node/server.c
 * and shard/router_admin.c; if those change, the seeds still parse, they
 * just call other methods until regenerated.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_lsm.h"
#include "fuzz_rpc.h"
#include "fuzz_util.h"
#include "proto/kv.pb-c.h"
#include "shard/clustermap.h"

static const char *root;

/* corpus/<dir>/seed-<name> = b. */
static void emit(const char *dir, const char *name, const lsm_buf *b)
{
    char d[512], f[600];
    snprintf(d, sizeof(d), "%s/%s", root, dir);
    mkdir(d, 0755);
    snprintf(f, sizeof(f), "seed-%s", name);
    fz_write_file(d, f, b->p, b->len);
}

static void put8(lsm_buf *b, uint8_t v)
{
    FZ_CHECK(lsm_buf_put(b, &v, 1) == KV_OK, "oom");
}

static void put_chunk(lsm_buf *b, const void *p, size_t n)
{
    FZ_CHECK(n <= 0xffff, "chunk of %zu bytes", n);
    put8(b, (uint8_t)n);
    put8(b, (uint8_t)(n >> 8));
    FZ_CHECK(lsm_buf_put(b, p, n) == KV_OK, "oom");
}

/* Packs msg into a new buffer. */
static lsm_buf pack(const ProtobufCMessage *msg)
{
    lsm_buf b = {0};
    size_t n = protobuf_c_message_get_packed_size(msg);
    FZ_CHECK(lsm_buf_reserve(&b, n + 1) == KV_OK, "oom");
    protobuf_c_message_pack(msg, b.p);
    b.len = n;
    return b;
}

/* ---- cluster maps ---- */

static lsm_buf map_bytes(cmap *m)
{
    uint8_t *p;
    size_t n;
    FZ_CHECK(cmap_encode(m, &p, &n) == KV_OK, "encode");
    lsm_buf b = {.p = p, .len = n, .cap = n};
    cmap_unref(m);
    return b;
}

static void seeds_cmap(void)
{
    lsm_buf maps[3] = {map_bytes(fz_test_map(FZ_MAP_ONE)), map_bytes(fz_test_map(FZ_MAP_THREE)),
                       map_bytes(fz_test_map(FZ_MAP_JOINING))};
    for (int i = 0; i < 3; i++) {
        lsm_buf b = {0};
        put8(&b, 0);
        lsm_buf_put(&b, maps[i].p, maps[i].len);
        char name[16];
        snprintf(name, sizeof(name), "map%d", i);
        emit("cmap", name, &b);
        lsm_buf_free(&b);
        lsm_buf_free(&maps[i]);
    }
    lsm_buf b = {0};
    put8(&b, 1);
    put8(&b, 1);
    put8(&b, 2);
    const char *text = "n1=tcp://127.0.0.1:7001\nn2=tcp://host-2:7002@5\nn3=tcp://[::1]:7003";
    lsm_buf_put(&b, text, strlen(text));
    emit("cmap", "spec", &b);
    lsm_buf_free(&b);
}

/* ---- flags and INI ---- */

static void opts_seed(const char *name, uint8_t mode, const char *ini, const char *const *args)
{
    lsm_buf b = {0};
    put8(&b, mode);
    put_chunk(&b, ini, strlen(ini));
    for (int i = 0; args[i]; i++) {
        if (i)
            put8(&b, 0);
        lsm_buf_put(&b, args[i], strlen(args[i]));
    }
    emit("opts", name, &b);
    lsm_buf_free(&b);
}

static void seeds_opts(void)
{
    opts_seed("flags", 0, "",
              (const char *const[]){"--id", "n1", "--workers", "4", "--flag", "--sync=batch",
                                    "--rate", "0.5", "--other-flag", "off", NULL});
    opts_seed("ini", 2, "[node]\nid = n1\nworkers = 16\nrate = 2.5\nflag = on\nany_int = -3\n",
              (const char *const[]){"--port", "7002", NULL});
    opts_seed("ini-eq", 6, "; comment\nlisten = tcp://h:1\nsync = none\n",
              (const char *const[]){"--auth=tok", NULL});
    opts_seed("positional", 1, "",
              (const char *const[]){"get", "--listen", "tcp://x:1", "key", "--", NULL});
}

/* ---- WAL, SST, MANIFEST ---- */

static lsm_rec rec(char *k, int i, uint64_t seq)
{
    int n = sprintf(k, "key%03d", i);
    return (lsm_rec){.key = k,
                     .klen = (size_t)n,
                     .value = i % 4 ? "value" : NULL,
                     .vlen = i % 4 ? 5 : 0,
                     .version = seq * 7,
                     .seqno = seq,
                     .type = i % 4 ? LSM_PUT : LSM_DELETE};
}

/* Reads dir/name whole. */
static lsm_buf slurp(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    int fd = open(p, O_RDONLY);
    struct stat st;
    FZ_CHECK(fd >= 0 && fstat(fd, &st) == 0, "open %s", p);
    lsm_buf b = {0};
    FZ_CHECK(lsm_buf_reserve(&b, (size_t)st.st_size + 1) == KV_OK, "oom");
    FZ_CHECK(read(fd, b.p, (size_t)st.st_size) == st.st_size, "read %s", p);
    b.len = (size_t)st.st_size;
    close(fd);
    return b;
}

/* Re-chunks a file of frames (header hdr bytes, u32 length at +4) as the
 * framed harness inputs take them: [u16 length][payload] per frame. */
static void rechunk(lsm_buf *out, const lsm_buf *file, size_t hdr)
{
    for (size_t off = 0; off + hdr <= file->len;) {
        uint32_t n = lsm_get32(file->p + off + 4) & 0x7fffffffu; /* less a WAL frame's codec bit */
        put_chunk(out, file->p + off + hdr, n);
        off += hdr + n;
    }
}

static void seeds_wal(const char *dir)
{
    lsm_vol v;
    FZ_CHECK(lsm_vol_init(&v, dir, LSM_TIER_FD, false) == KV_OK, "vol");
    lsm_opts o = {.fast_dir = dir, .sync = LSM_SYNC_NONE};
    lsm_wal *w = NULL;
    FZ_CHECK(lsm_wal_open(&w, &v, &o, 1, NULL, 0) == KV_OK, "wal open");
    char k[3][16];
    for (int f = 0; f < 4; f++) {
        lsm_rec r[3];
        for (int i = 0; i < 3; i++)
            r[i] = rec(k[i], f * 3 + i, (uint64_t)(f * 3 + i + 1));
        FZ_CHECK(lsm_wal_write(w, r, (size_t)(f % 3) + 1) == KV_OK, "wal write");
    }
    lsm_wal_close(w);
    lsm_vol_fini(&v);
    lsm_buf seg = slurp(dir, "000001.wal"), raw = {0}, framed = {0}, two = {0}, body = {0};
    put8(&raw, 0);
    put8(&raw, 0);
    put_chunk(&raw, seg.p, seg.len);
    emit("wal", "raw", &raw);
    rechunk(&body, &seg, LSM_FRAME_HDR);
    put8(&framed, 1 | 32);
    put8(&framed, 2);
    put_chunk(&framed, body.p, body.len);
    emit("wal", "framed", &framed);
    put8(&two, 1 | 2 | 32);
    put8(&two, 0);
    put_chunk(&two, body.p, body.len);
    put_chunk(&two, body.p, body.len / 2);
    emit("wal", "two-segments", &two);
    lsm_buf *all[] = {&seg, &raw, &framed, &two, &body};
    for (size_t i = 0; i < 5; i++)
        lsm_buf_free(all[i]);
}

static void seeds_sst(const char *dir)
{
    lsm_vol v;
    FZ_CHECK(lsm_vol_init(&v, dir, LSM_TIER_FD, false) == KV_OK, "vol");
    lsm_sst_builder *sb = NULL;
    FZ_CHECK(lsm_sst_builder_open(&sb, &v, 5, 256) == KV_OK, "builder");
    char k[16];
    for (int i = 0; i < 40; i++) {
        lsm_rec r = rec(k, i, (uint64_t)i + 1);
        FZ_CHECK(lsm_sst_builder_add(sb, &r) == KV_OK, "add");
    }
    lsm_file *f = NULL;
    FZ_CHECK(lsm_sst_builder_finish(sb, 0, &f) == KV_OK, "finish");
    lsm_file_unref(f);
    lsm_vol_fini(&v);
    lsm_buf img = slurp(dir, "000005.sst");
    for (uint8_t flags = 0; flags < 2; flags++) {
        lsm_buf b = {0};
        put8(&b, flags);
        lsm_buf_put(&b, img.p, img.len);
        emit("sst", flags ? "fixed" : "raw", &b);
        lsm_buf_free(&b);
    }
    lsm_buf_free(&img);
}

/* A db with two flushes and a compaction; its MANIFEST as seeds. */
static void seeds_manifest(const char *dir)
{
    lsm_opts o;
    lsm_opts_default(&o);
    o.fast_dir = dir;
    o.sync = LSM_SYNC_NONE;
    o.no_auto_compaction = true;
    o.hotrap = false;
    lsm_db *db = NULL;
    FZ_CHECK(lsm_open(&db, &o, NULL, NULL) == KV_OK, "lsm_open");
    char k[8][16];
    for (int round = 0; round < 2; round++) {
        lsm_rec r[8];
        for (int i = 0; i < 8; i++)
            r[i] = rec(k[i], i * 2 + round, (uint64_t)(round * 8 + i + 1));
        FZ_CHECK(lsm_wal_append(db, r, 8) == KV_OK, "append");
        FZ_CHECK(lsm_flush(db, r, 8, (uint64_t)(round * 8 + 8)) == KV_OK, "flush");
    }
    FZ_CHECK(lsm_compact_all(db) == KV_OK, "compact");
    lsm_close(db);
    lsm_buf cur = slurp(dir, "CURRENT");
    cur.p[cur.len - 1] = '\0';
    lsm_buf man = slurp(dir, (char *)cur.p), raw = {0}, framed = {0}, open = {0};
    put8(&raw, 0);
    lsm_buf_put(&raw, man.p, man.len);
    emit("manifest", "raw", &raw);
    put8(&framed, 1);
    rechunk(&framed, &man, 12);
    emit("manifest", "framed", &framed);
    put8(&open, 1 | 4);
    rechunk(&open, &man, 12);
    emit("manifest", "open-db", &open);
    lsm_buf *all[] = {&cur, &man, &raw, &framed, &open};
    for (size_t i = 0; i < 5; i++)
        lsm_buf_free(all[i]);
}

/* ---- RALT programs ---- */

static void access_op(lsm_buf *b, const char *key, uint16_t vlen)
{
    put8(b, 0);
    put8(b, (uint8_t)(strlen(key) - 1));
    lsm_buf_put(b, key, strlen(key));
    put8(b, (uint8_t)vlen);
    put8(b, (uint8_t)(vlen >> 8));
}

static void seeds_ralt(void)
{
    for (int damage = 0; damage < 2; damage++) {
        lsm_buf b = {0};
        put8(&b, (uint8_t)(damage ? 3 : 0));
        for (int i = 0; i < 40; i++) {
            char key[16];
            snprintf(key, sizeof(key), "k%02d", i % 13);
            access_op(&b, i % 3 ? key : "hot", 100);
            if (i % 9 == 8)
                put8(&b, 2); /* flush */
        }
        if (damage) { /* damage: pick 0, flip 0x10, fix, at 100 */
            uint8_t d[] = {7, 0, 0x10, 1, 100, 0, 0, 0};
            lsm_buf_put(&b, d, sizeof(d));
        }
        uint8_t tail[] = {3, 2, 'h', 'o', 't', 4, 0, 'a', 0, 'z', 6, 5, 1, 0};
        lsm_buf_put(&b, tail, sizeof(tail));
        emit("ralt", damage ? "damage" : "program", &b);
        lsm_buf_free(&b);
    }
}

/* ---- RPC programs ---- */

enum {
    N_GET,
    N_PUT,
    N_DELETE,
    N_BATCH,
    N_PING,
    N_STATS,
    N_HOTKEYS,
    N_GETMAP,
    N_SETMAP,
    N_STREAMREAD,
    N_STREAMSTART,
    N_STREAMSTATUS,
    N_DIGEST,
    N_APPLY,
    N_HINT,
    N_HINTSTATUS,
    N_CLEANUP,
    N_REPAIRED
};
enum { R_GET, R_PUT, R_DELETE, R_BATCH, R_PING, R_STATS, R_GETMAP, R_HOTKEYS };

/* One call: [u8 method][u8 epoch choice][u16 length][body]. */
static void call(lsm_buf *b, int method, uint8_t sel, const ProtobufCMessage *msg)
{
    lsm_buf body = pack(msg);
    put8(b, (uint8_t)method);
    put8(b, sel);
    put_chunk(b, body.p, body.len);
    lsm_buf_free(&body);
}

static ProtobufCBinaryData bin(const char *s)
{
    return (ProtobufCBinaryData){strlen(s), (uint8_t *)s};
}

/* kv.Put, kv.Get, kv.Delete and a kv.Batch of the three, with epoch sel. */
static void kv_calls(lsm_buf *b, uint8_t sel, int get, int put, int del, int batch)
{
    Kv__PutRequest p = KV__PUT_REQUEST__INIT;
    p.key = bin("user:1");
    p.value = bin("hello");
    p.ttl_ms = 60000;
    call(b, put, sel, &p.base);
    Kv__GetRequest g = KV__GET_REQUEST__INIT;
    g.key = bin("user:1");
    call(b, get, sel, &g.base);
    Kv__Op ops[3] = {KV__OP__INIT, KV__OP__INIT, KV__OP__INIT},
           *po[3] = {&ops[0], &ops[1], &ops[2]};
    ops[0].type = KV__OP_TYPE__PUT;
    ops[0].key = bin("a");
    ops[0].value = bin("1");
    ops[1].type = KV__OP_TYPE__GET;
    ops[1].key = bin("a");
    ops[2].type = KV__OP_TYPE__DELETE;
    ops[2].key = bin("user:1");
    Kv__BatchRequest bt = KV__BATCH_REQUEST__INIT;
    bt.n_ops = 3;
    bt.ops = po;
    call(b, batch, sel, &bt.base);
    Kv__DeleteRequest d = KV__DELETE_REQUEST__INIT;
    d.key = bin("a");
    call(b, del, sel, &d.base);
}

static void admin_calls(lsm_buf *b, int ping, int stats, int getmap, int hotkeys)
{
    Kv__PingRequest pg = KV__PING_REQUEST__INIT;
    call(b, ping, 0, &pg.base);
    Kv__StatsRequest st = KV__STATS_REQUEST__INIT;
    st.verbose = true;
    st.node_id = "n1";
    call(b, stats, 0, &st.base);
    Kv__GetMapRequest gm = KV__GET_MAP_REQUEST__INIT;
    call(b, getmap, 0, &gm.base);
    Kv__HotKey hk = KV__HOT_KEY__INIT, *hp = &hk;
    hk.key = bin("user:1");
    hk.ops_per_s = 5000;
    hk.count = 100;
    Kv__HotKeysRequest hr = KV__HOT_KEYS_REQUEST__INIT;
    hr.router_id = "r1";
    hr.window_ms = 1000;
    hr.n_keys = 1;
    hr.keys = &hp;
    call(b, hotkeys, 0, &hr.base);
}

static Kv__Record record(const char *key, uint64_t version, bool tombstone)
{
    Kv__Record r = KV__RECORD__INIT;
    r.key = bin(key);
    r.value = tombstone ? bin("") : bin("streamed");
    r.version = version;
    r.tombstone = tombstone;
    return r;
}

/* Streaming, digests, apply, hints, cleanup, repair: the internal methods. */
static void internal_calls(lsm_buf *b)
{
    Kv__Range all = KV__RANGE__INIT, *rp = &all;
    Kv__StreamReadRequest sr = KV__STREAM_READ_REQUEST__INIT;
    sr.n_ranges = 1;
    sr.ranges = &rp;
    sr.max_bytes = 4096;
    call(b, N_STREAMREAD, 1, &sr.base);
    Kv__DigestRequest dg = KV__DIGEST_REQUEST__INIT;
    dg.n_ranges = 1;
    dg.ranges = &rp;
    dg.leaves = 4;
    call(b, N_DIGEST, 1, &dg.base);
    Kv__Record recs[2] = {record("x", 1ull << 20, false), record("y", 1ull << 21, true)};
    Kv__Record *rps[2] = {&recs[0], &recs[1]};
    Kv__ApplyRequest ap = KV__APPLY_REQUEST__INIT;
    ap.n_records = 2;
    ap.records = rps;
    call(b, N_APPLY, 1, &ap.base);
    Kv__HintRequest hi = KV__HINT_REQUEST__INIT;
    hi.target = "n2";
    hi.n_records = 2;
    hi.records = rps;
    call(b, N_HINT, 1, &hi.base);
    Kv__HintStatusRequest hs = KV__HINT_STATUS_REQUEST__INIT;
    hs.target = "n2";
    hs.replay_now = true;
    call(b, N_HINTSTATUS, 1, &hs.base);
    Kv__StreamJob job = KV__STREAM_JOB__INIT, *jp = &job;
    job.id = "j1";
    job.source_id = "n2";
    job.source_addr = "tcp://127.0.0.1:2";
    job.n_ranges = 1;
    job.ranges = &rp;
    job.mbps = 8;
    job.epoch = 1;
    Kv__StreamStartRequest ss = KV__STREAM_START_REQUEST__INIT;
    ss.n_jobs = 1;
    ss.jobs = &jp;
    call(b, N_STREAMSTART, 1, &ss.base);
    char *ids[] = {"j1"};
    Kv__StreamStatusRequest st = KV__STREAM_STATUS_REQUEST__INIT;
    st.n_ids = 1;
    st.ids = ids;
    call(b, N_STREAMSTATUS, 1, &st.base);
    Kv__CleanupRequest cl = KV__CLEANUP_REQUEST__INIT;
    call(b, N_CLEANUP, 1, &cl.base);
    Kv__RepairedRequest rr = KV__REPAIRED_REQUEST__INIT;
    rr.node_id = "n2";
    call(b, N_REPAIRED, 1, &rr.base);
}

static void script(lsm_buf *b, int n, const uint8_t *status, const lsm_buf *bodies);

static void seeds_node(void)
{
    for (uint8_t flags = 0; flags < 3; flags++) {
        lsm_buf b = {0};
        put8(&b, flags);
        put8(&b, 0); /* no peer answers */
        kv_calls(&b, flags ? 1 : 0, N_GET, N_PUT, N_DELETE, N_BATCH);
        admin_calls(&b, N_PING, N_STATS, N_GETMAP, N_HOTKEYS);
        char name[16];
        snprintf(name, sizeof(name), "kv-admin%d", flags);
        emit("node", name, &b);
        lsm_buf_free(&b);
    }
    lsm_buf b = {0}, m = map_bytes(fz_test_map(FZ_MAP_JOINING));
    put8(&b, 1);
    /* the stream source answers a chunk of records, done */
    Kv__Record recs[2] = {record("s1", 1ull << 22, false), record("s2", 1ull << 22, true)};
    Kv__Record *rps[2] = {&recs[0], &recs[1]};
    Kv__StreamReadReply chunk = KV__STREAM_READ_REPLY__INIT;
    chunk.n_records = 2;
    chunk.records = rps;
    chunk.done = true;
    lsm_buf body = pack(&chunk.base);
    script(&b, 1, (const uint8_t[]){0}, &body);
    lsm_buf_free(&body);
    internal_calls(&b);
    Kv__ClusterMap *pb = kv__cluster_map__unpack(NULL, m.len, m.p);
    Kv__SetMapRequest sm = KV__SET_MAP_REQUEST__INIT;
    sm.map = pb;
    sm.expected_epoch = 1;
    call(&b, N_SETMAP, 1, &sm.base);
    emit("node", "internal", &b);
    kv__cluster_map__free_unpacked(pb, NULL);
    lsm_buf_free(&b);
    lsm_buf_free(&m);
}

/* A peer script: n replies of (status, flags, body). */
static void script(lsm_buf *b, int n, const uint8_t *status, const lsm_buf *bodies)
{
    put8(b, (uint8_t)n);
    for (int i = 0; i < n; i++) {
        put8(b, status[i]);
        put8(b, 0);
        put_chunk(b, bodies[i].p, bodies[i].len);
    }
}

static void seeds_router(void)
{
    Kv__GetReply gr = KV__GET_REPLY__INIT;
    gr.found = true;
    gr.value = bin("hello");
    gr.version = 1ull << 20;
    Kv__PutReply pr = KV__PUT_REPLY__INIT;
    pr.version = 1ull << 20;
    lsm_buf bodies[3] = {pack(&gr.base), pack(&pr.base), map_bytes(fz_test_map(FZ_MAP_JOINING))};
    uint8_t ok[3] = {0, 0, KV_FAILED_PRECONDITION};
    const uint8_t flags[3] = {2, 3 | 4, 1};
    const int nreplies[3] = {3, 3, 0};
    for (int i = 0; i < 3; i++) {
        lsm_buf b = {0};
        put8(&b, flags[i]);
        script(&b, nreplies[i], ok, bodies);
        kv_calls(&b, 1, R_GET, R_PUT, R_DELETE, R_BATCH);
        admin_calls(&b, R_PING, R_STATS, R_GETMAP, R_HOTKEYS);
        char name[16];
        snprintf(name, sizeof(name), "calls%d", i);
        emit("router", name, &b);
        lsm_buf_free(&b);
    }
    for (int i = 0; i < 3; i++)
        lsm_buf_free(&bodies[i]);
}

static void envelope_seed(const char *name, uint8_t flags, const char *method, const char *auth,
                          const ProtobufCMessage *body)
{
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 7;
    env.method = (char *)method;
    env.auth = (ProtobufCBinaryData){auth ? strlen(auth) : 0, (uint8_t *)auth};
    env.deadline_ms = 1000;
    env.map_epoch = 3;
    lsm_buf bb = pack(body);
    env.body = (ProtobufCBinaryData){bb.len, bb.p};
    lsm_buf e = pack(&env.base), b = {0};
    put8(&b, flags);
    lsm_buf_put(&b, e.p, e.len);
    emit("envelope", name, &b);
    lsm_buf_free(&bb);
    lsm_buf_free(&e);
    lsm_buf_free(&b);
}

static void seeds_envelope(void)
{
    Kv__GetRequest g = KV__GET_REQUEST__INIT;
    g.key = bin("user:1");
    Kv__PingRequest p = KV__PING_REQUEST__INIT;
    envelope_seed("get", 0, "kv.Get", NULL, &g.base);
    envelope_seed("unknown-method", 0, "kv.Nope", NULL, &p.base);
    envelope_seed("auth-ok", 2, "admin.Ping", "s3cret", &p.base);
    envelope_seed("auth-wrong", 2, "admin.Ping", "wrong", &p.base);
    Kv__PingReply pr = KV__PING_REPLY__INIT;
    pr.id = "n1";
    pr.role = "node";
    Kv__Status st = KV__STATUS__INIT;
    st.message = "";
    Kv__Envelope rep = KV__ENVELOPE__INIT;
    rep.id = 1;
    rep.status = &st;
    lsm_buf body = pack(&pr.base);
    rep.body = (ProtobufCBinaryData){body.len, body.p};
    lsm_buf r = pack(&rep.base), b = {0};
    put8(&b, 1);
    lsm_buf_put(&b, r.p, r.len);
    emit("envelope", "client-raw", &b);
    b.len = 0;
    put8(&b, 3);
    lsm_buf_put(&b, body.p, body.len);
    emit("envelope", "client-enveloped", &b);
    lsm_buf_free(&body);
    lsm_buf_free(&r);
    lsm_buf_free(&b);
}

/* fuzz_wire: [mode] + an Envelope (a request, a reply with a status, a
 * smart client's coordinated call) or a Calls of three of them. */
static void wire_seed(const char *name, uint8_t mode, const ProtobufCMessage *m)
{
    lsm_buf p = pack(m), b = {0};
    put8(&b, mode);
    FZ_CHECK(lsm_buf_put(&b, p.p, p.len) == KV_OK, "oom");
    emit("wire", name, &b);
    lsm_buf_free(&p);
    lsm_buf_free(&b);
}

static void seeds_wire(void)
{
    Kv__Envelope req = KV__ENVELOPE__INIT, rep = KV__ENVELOPE__INIT, co = KV__ENVELOPE__INIT;
    req.id = 7;
    req.method = "kv.Get";
    req.deadline_ms = 200;
    req.auth = bin("s3cret");
    req.map_epoch = 3;
    req.body = bin("\x0a\x06user:1");
    Kv__Status st = KV__STATUS__INIT;
    st.code = 9;
    st.message = "cluster map epoch 3 is older than 4";
    rep.id = 7;
    rep.status = &st;
    rep.map_epoch = 4;
    co = req;
    co.coordinate = true;
    wire_seed("request", 0, &req.base);
    wire_seed("reply", 2, &rep.base);
    wire_seed("coordinated", 0, &co.base);
    Kv__Envelope *three[] = {&req, &rep, &co};
    Kv__Calls c = KV__CALLS__INIT;
    c.n_calls = 3;
    c.calls = three;
    wire_seed("calls", 1, &c.base);
    wire_seed("calls-malloc", 3, &c.base);
    Kv__GetReply g = KV__GET_REPLY__INIT;
    g.found = true;
    g.value = bin("v1");
    g.version = 1764000000000ull << 16;
    wire_seed("get-reply", 4, &g.base);
}

/* fuzz_conn: [flags] then wire bytes after a valid handshake (flag 1):
 * one kv.Get message, two messages in one write and in 7-byte pieces (flag
 * 2), one that crossed a device (two header words), a length past the
 * read buffer with only its start, and a header without a request id. */
static void conn_frame(lsm_buf *b, const uint8_t *hdr, size_t hlen, const lsm_buf *body,
                       uint64_t claimed)
{
    uint64_t len = claimed ? claimed : hlen + body->len;
    for (int i = 7; i >= 0; i--)
        put8(b, (uint8_t)(len >> (8 * i)));
    lsm_buf_put(b, hdr, hlen);
    lsm_buf_put(b, body->p, body->len);
}

static void seeds_conn(void)
{
    Kv__GetRequest g = KV__GET_REQUEST__INIT;
    g.key = (ProtobufCBinaryData){3, (uint8_t *)"key"};
    lsm_buf gb = pack(&g.base);
    Kv__Envelope env = KV__ENVELOPE__INIT;
    env.id = 9;
    env.method = "kv.Get";
    env.deadline_ms = 1000;
    env.body = (ProtobufCBinaryData){gb.len, gb.p};
    lsm_buf e = pack(&env.base), b = {0};
    const uint8_t id1[4] = {0x80, 0, 0, 1}, id2[4] = {0x80, 0, 0, 2};
    const uint8_t hops[8] = {0, 0, 0, 5, 0x80, 0, 0, 3}, noid[8] = {0, 0, 0, 1, 0, 0, 0, 2};
    put8(&b, 1);
    conn_frame(&b, id1, 4, &e, 0);
    emit("conn", "one", &b);
    b.len = 0;
    put8(&b, 3);
    put8(&b, 6); /* pieces of 7 bytes */
    conn_frame(&b, id1, 4, &e, 0);
    conn_frame(&b, id2, 4, &e, 0);
    emit("conn", "two-in-pieces", &b);
    b.len = 0;
    put8(&b, 1);
    conn_frame(&b, hops, 8, &e, 0);
    emit("conn", "hops", &b);
    b.len = 0;
    put8(&b, 1);
    conn_frame(&b, id1, 4, &e, 0);
    conn_frame(&b, id2, 4, &e, 100000); /* past the 64 KiB read buffer */
    emit("conn", "large", &b);
    b.len = 0;
    put8(&b, 1);
    conn_frame(&b, id1, 4, &e, 0);
    conn_frame(&b, noid, 8, &e, 0);
    emit("conn", "no-id", &b);
    lsm_buf_free(&gb);
    lsm_buf_free(&e);
    lsm_buf_free(&b);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
        return 2;
    }
    root = argv[1];
    fz_quiet();
    char dir[512];
    seeds_cmap();
    seeds_opts();
    seeds_wal(fz_fresh_dir(dir, sizeof(dir), "wal"));
    seeds_sst(fz_fresh_dir(dir, sizeof(dir), "sst"));
    seeds_manifest(fz_fresh_dir(dir, sizeof(dir), "manifest"));
    seeds_ralt();
    seeds_node();
    seeds_router();
    seeds_envelope();
    seeds_wire();
    seeds_conn();
    return 0;
}
