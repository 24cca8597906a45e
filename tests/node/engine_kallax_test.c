/* SPDX-License-Identifier: MIT */
/*
 * The engine over kallax (engine_opts.kind = ENGINE_KALLAX) where it differs
 * from the LSM: a damaged block is reported DATA_LOSS through the engine's
 * reads, writes and iterator (never a miss or another value, the other
 * blocks unaffected); values kept in extents (larger than a block) and a
 * probe window that fills (the flush fails, nothing acknowledged is lost,
 * before or after a restart); a data directory created by one kind refused
 * by the other; kvnode's --engine flags (bad ones exit 2 with a message, a
 * directory of the other kind exits 1 naming both); and kvctl status naming
 * the engine (HotRAP and NHC off). The rest of
 * the engine's behaviour over kallax is the engine tests run with
 * KV_TEST_ENGINE=kallax.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "node/engine.h"
#include "node/engine_int.h" /* e->db, for the home block of a key */
#include "node/kallax/kallax.h"
#include "node/node.h" /* node_engine_statlist */
#include "tests/kv_testport.h"

static char dir[64], fast[128];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/kv-ekallax-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(fast, sizeof(fast), "%s/fast", dir);
    engine_thread_register();
}

static void teardown(void)
{
    engine_thread_unregister();
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ekallax, .init = setup, .fini = teardown, .timeout = 120);

static kv_err open_kind(engine **e, engine_kind kind, uint64_t blocks, size_t wb_kb, char *err,
                        size_t errlen)
{
    engine_opts o = {.kind = kind,
                     .fast_dir = fast,
                     .mem_mb = 8,
                     .write_buffer_kb = wb_kb,
                     .sync = ENGINE_SYNC_NONE,
                     .kallax_blocks = blocks};
    return engine_open(e, &o, err, errlen);
}

static engine *open_kx(uint64_t blocks, size_t wb_kb)
{
    engine *e = NULL;
    char err[256];
    kv_err rv = open_kind(&e, ENGINE_KALLAX, blocks, wb_kb, err, sizeof(err));
    cr_assert_eq(rv, KV_OK, "engine_open: %s", err);
    return e;
}

static void key_of(char *k, int id)
{
    snprintf(k, 8, "c%05d", id % 100000);
}

/* id's value: vlen bytes that follow from id. */
static void val_of(uint8_t *v, size_t vlen, int id)
{
    for (size_t i = 0; i < vlen; i++)
        v[i] = (uint8_t)(id * 31 + i * 7 + (i >> 9));
}

static kv_err put(engine *e, int id, size_t vlen, char *err, size_t errlen)
{
    char k[8];
    key_of(k, id);
    uint8_t *v = malloc(vlen ? vlen : 1);
    val_of(v, vlen, id);
    engine_write w = {.key = k, .klen = 6, .val = v, .vlen = vlen};
    engine_result r;
    kv_err rv = engine_write_one(e, &w, &r, err, errlen);
    free(v);
    return rv;
}

/* Reads id: KV_OK with its value (asserted), or the engine's error. */
static kv_err get_checked(engine *e, int id, size_t vlen)
{
    char k[8];
    key_of(k, id);
    engine_result r;
    kv_err rv = engine_get(e, k, 6, &r);
    if (rv != KV_OK)
        return rv;
    cr_assert(r.found, "%s: a false miss", k);
    uint8_t *v = malloc(vlen ? vlen : 1);
    val_of(v, vlen, id);
    cr_assert(r.vlen == vlen && memcmp(r.val, v, vlen) == 0, "%s: wrong value", k);
    free(v);
    free(r.val);
    return KV_OK;
}

#define NC 3000
#define VC 100

/* A block damaged on disk (not in the last journal round, so it cannot be
 * repaired) makes every read that needs it DATA_LOSS: engine_get,
 * engine_get_many, the current-record read of a write, the iterator. Keys
 * of other blocks read back intact. */
Test(ekallax, a_corrupt_block_is_data_loss_never_wrong_data)
{
    engine *e = open_kx(256, 4096); /* ~40% load */
    char err[256];
    for (int id = 0; id < NC; id++)
        cr_assert_eq(put(e, id, VC, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert_eq(engine_flush(e), KV_OK);
    cr_assert_eq(put(e, NC, VC, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert_eq(engine_flush(e), KV_OK); /* the last journal round: NC's block only */
    char k[8];
    key_of(k, NC);
    uint64_t spared = kallax_home(e->db, k, 6), victim = UINT64_MAX;
    int vid = -1, in_victim = 0;
    for (int id = 0; id < NC && vid < 0; id++) {
        key_of(k, id);
        if (kallax_home(e->db, k, 6) != spared)
            victim = kallax_home(e->db, k, 6), vid = id;
    }
    for (int id = 0; id < NC; id++) {
        key_of(k, id);
        in_victim += kallax_home(e->db, k, 6) == victim;
    }
    engine_close(e);
    char path[200];
    snprintf(path, sizeof(path), "%s/BLOCKS", fast);
    int fd = open(path, O_WRONLY);
    cr_assert_geq(fd, 0);
    uint8_t junk[64];
    memset(junk, 0x5a, sizeof(junk));
    cr_assert_eq(pwrite(fd, junk, sizeof(junk), (off_t)(victim * KALLAX_BLOCK + 200)), 64);
    close(fd);

    e = open_kx(0, 4096); /* the open scan finds it; reads of it fail */
    int lost = 0;
    for (int id = 0; id <= NC; id++) {
        kv_err rv = get_checked(e, id, VC);
        cr_assert(rv == KV_OK || rv == KV_DATA_LOSS, "id %d: %s", id, kv_err_name(rv));
        lost += rv == KV_DATA_LOSS;
    }
    cr_assert_eq(get_checked(e, vid, VC), KV_DATA_LOSS, "the victim's key");
    cr_assert_geq(lost, in_victim, "every key of the damaged home block");
    cr_assert_lt(lost, NC / 20, "%d keys lost to one block", lost);
    key_of(k, vid);
    const void *keys[1] = {k};
    size_t klens[1] = {6};
    engine_result rs[1];
    kv_err errs[1];
    cr_assert_eq(engine_get_many(e, 1, keys, klens, rs, errs), KV_OK);
    cr_assert_eq(errs[0], KV_DATA_LOSS, "get_many: %s", kv_err_name(errs[0]));
    cr_assert_eq(put(e, vid, 10, err, sizeof(err)), KV_DATA_LOSS, "a write over the damage");
    engine_iter *it;
    kv_err rv = engine_iter_open(e, NULL, &it);
    engine_rec r;
    int n = 0;
    while (rv == KV_OK && (rv = engine_iter_next(it, &r)) == KV_OK)
        n++;
    cr_assert_eq(rv, KV_DATA_LOSS, "the iterator after %d records: %s", n, kv_err_name(rv));
    engine_iter_close(it);
    rpc_statlist l;
    node_engine_statlist(e, &l); /* admin.Stats' kallax.* */
    bool counted = false;
    for (size_t i = 0; i < l.n; i++)
        counted |= !strcmp(l.items[i].name, "kallax.corrupt_blocks") && atoi(l.items[i].value) > 0;
    rpc_stats_free(&l);
    cr_assert(counted, "kallax.corrupt_blocks counts it");
    engine_close(e);
}

/* Values larger than a block live in extents; they survive flushes,
 * overwrites (the old extent freed), deletes and restarts. */
Test(ekallax, big_values_in_extents_across_flushes_and_restarts)
{
    static const size_t sizes[] = {0, 1, 2000, 4096, 70000, 1 << 20};
    const int n = (int)(sizeof(sizes) / sizeof(sizes[0]));
    engine *e = open_kx(64, 4096);
    char err[256];
    for (int round = 0; round < 3; round++) {
        for (int id = 0; id < n; id++) {
            size_t vlen = sizes[(id + round) % n];
            cr_assert_eq(put(e, id, vlen, err, sizeof(err)), KV_OK, "%s", err);
            cr_assert_eq(get_checked(e, id, vlen), KV_OK);
        }
        cr_assert_eq(engine_flush(e), KV_OK);
        engine_close(e);
        e = open_kx(0, 4096);
        for (int id = 0; id < n; id++)
            cr_assert_eq(get_checked(e, id, sizes[(id + round) % n]), KV_OK, "round %d", round);
    }
    char k[8];
    key_of(k, 4);
    engine_write del = {.key = k, .klen = 6, .is_delete = true};
    engine_result r;
    cr_assert_eq(engine_write_one(e, &del, &r, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert_eq(engine_flush(e), KV_OK);
    engine_close(e);
    e = open_kx(0, 4096);
    cr_assert_eq(engine_get(e, k, 6, &r), KV_OK);
    cr_assert_not(r.found, "deleted");
    engine_close(e);
}

/* A store too small for its records: the flush that finds a probe window
 * full fails (RESOURCE_EXHAUSTED) and keeps the records dirty, writes are
 * refused once the dirty bytes pass twice the write buffer, and every
 * acknowledged write reads back, before and after a restart (the WAL). */
Test(ekallax, a_full_probe_window_fails_the_flush_and_loses_nothing, .timeout = 200)
{
    engine *e = open_kx(2, 16); /* 2 home blocks + 16 probe blocks: ~70 KiB */
    char err[256] = "";
    int acked = 0;
    kv_err rv = KV_OK;
    for (; acked < 4000 && (rv = put(e, acked, 900, err, sizeof(err))) == KV_OK; acked++)
        ;
    cr_assert_eq(rv, KV_RESOURCE_EXHAUSTED, "writes into a full store: %s (%s)", kv_err_name(rv),
                 err);
    cr_assert_gt(acked, 60, "%d writes", acked);
    cr_assert_eq(engine_flush(e), KV_RESOURCE_EXHAUSTED);
    for (int id = 0; id < acked; id++)
        cr_assert_eq(get_checked(e, id, 900), KV_OK, "id %d", id);
    engine_close(e);
    e = open_kx(0, 1 << 20); /* a big write buffer: the replayed records stay dirty */
    for (int id = 0; id < acked; id++)
        cr_assert_eq(get_checked(e, id, 900), KV_OK, "id %d after the restart", id);
    engine_close(e);
}

/* The kind is fixed when the directory is created. */
Test(ekallax, a_directory_of_one_kind_refuses_the_other)
{
    engine *e = NULL;
    char err[512];
    cr_assert_eq(open_kind(&e, ENGINE_KALLAX, 0, 64, err, sizeof(err)), KV_INVALID_ARGUMENT);
    cr_assert(strstr(err, "--kallax-blocks"), "a new store needs its size: %s", err);
    cr_assert_eq(open_kind(&e, ENGINE_LSM, 0, 64, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert_eq(put(e, 1, 10, err, sizeof(err)), KV_OK);
    engine_close(e);
    cr_assert_eq(open_kind(&e, ENGINE_KALLAX, 64, 64, err, sizeof(err)), KV_FAILED_PRECONDITION);
    cr_assert(strstr(err, "engine lsm") && strstr(err, "engine kallax"), "%s", err);
    snprintf(fast, sizeof(fast), "%s/fast2", dir);
    cr_assert_eq(open_kind(&e, ENGINE_KALLAX, 64, 64, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert_str_eq(engine_name(e), "kallax");
    cr_assert_eq(engine_max_key(e), KALLAX_MAX_KEY);
    engine_close(e);
    cr_assert_eq(open_kind(&e, ENGINE_LSM, 0, 64, err, sizeof(err)), KV_FAILED_PRECONDITION);
    cr_assert(strstr(err, "engine lsm") && strstr(err, "engine kallax"), "%s", err);
    cr_assert_eq(open_kind(&e, ENGINE_KALLAX, 65, 64, err, sizeof(err)), KV_INVALID_ARGUMENT);
    cr_assert(strstr(err, "--kallax-blocks"), "another size: %s", err);
    cr_assert_eq(open_kind(&e, ENGINE_KALLAX, 64, 64, err, sizeof(err)), KV_OK, "%s", err);
    engine_close(e);
}

/* Runs kvnode with args (NULL-terminated) on dir/node; returns its exit
 * code, stderr (and its log) in out. Bad flags exit at once; a good start
 * is stopped with SIGTERM once it logs that it serves (exit 0). */
static int kvnode(const char *const *args, char *out, size_t cap)
{
    const char *bdir = getenv("KV_BUILD_DIR");
    cr_assert_not_null(bdir, "KV_BUILD_DIR is not set");
    char bin[512], listen[64], logp[128], data[128];
    snprintf(bin, sizeof(bin), "%s/node/kvnode", bdir);
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", kv_test_free_port());
    snprintf(logp, sizeof(logp), "%s/kvnode.log", dir);
    snprintf(data, sizeof(data), "%s/node", dir);
    const char *argv[32] = {bin, "--id", "n1", "--data-dir", data, "--listen", listen};
    int n = 7;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    unlink(logp); /* the previous start's log must not be read as this one's */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(logp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        dup2(fd, 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    /* Until it exits or logs that it serves (up to 30 s: an ASan start on a
     * loaded host); SIGTERM before it blocks the signal would kill it. */
    int st = 0;
    bool exited = false;
    for (int i = 0; i < 1500 && !(exited = waitpid(pid, &st, WNOHANG) == pid); i++) {
        char buf[8192] = "";
        FILE *lf = fopen(logp, "r");
        size_t got = lf ? fread(buf, 1, sizeof(buf) - 1, lf) : 0;
        buf[got] = '\0';
        if (lf)
            fclose(lf);
        if (strstr(buf, " serving on "))
            break;
        usleep(20000);
    }
    if (!exited && waitpid(pid, &st, WNOHANG) == 0) {
        kill(pid, SIGTERM);
        waitpid(pid, &st, 0);
    }
    FILE *f = fopen(logp, "r");
    size_t got = f ? fread(out, 1, cap - 1, f) : 0;
    out[got] = '\0';
    if (f)
        fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(ekallax, kvnode_engine_flags)
{
    char out[8192];
    static const struct {
        const char *args[8];
        const char *msg;
    } bad[] = {
        {{"--engine", "btree"}, "lsm|kallax"},
        {{"--engine", "kallax", "--kallax-blocks", "0"}, "--kallax-blocks"},
        {{"--engine", "kallax", "--kallax-blocks", "64", "--kallax-gb", "1"}, "not both"},
        {{"--kallax-blocks", "64"}, "need --engine kallax"},
        {{"--engine", "kallax", "--kallax-blocks", "64", "--slow-dir", "/tmp"}, "one volume"},
        {{"--engine", "kallax", "--kallax-blocks", "64", "--max-key-bytes", "2000"}, "1024"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(kvnode(bad[i].args, out, sizeof(out)), 2, "case %zu: %s", i, out);
        cr_assert(strstr(out, bad[i].msg), "case %zu: no '%s' in: %s", i, bad[i].msg, out);
    }
    const char *none[] = {"--engine", "kallax", NULL};
    cr_assert_eq(kvnode(none, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "--kallax-blocks N or --kallax-gb G"), "%s", out);
    const char *lsm[] = {"--engine", "lsm", NULL};
    cr_assert_eq(kvnode(lsm, out, sizeof(out)), 0, "%s", out);
    const char *kx[] = {"--engine", "kallax", "--kallax-blocks", "64", NULL};
    cr_assert_eq(kvnode(kx, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "engine lsm") && strstr(out, "engine kallax"), "%s", out);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s/node", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(kvnode(kx, out, sizeof(out)), 0, "%s", out);
    cr_assert(strstr(out, "engine kallax"), "the start line names the engine: %s", out);
    const char *reopen[] = {"--engine", "kallax", NULL}; /* the store's size is known */
    cr_assert_eq(kvnode(reopen, out, sizeof(out)), 0, "%s", out);
    cr_assert_eq(kvnode(lsm, out, sizeof(out)), 1, "%s", out);
    cr_assert(strstr(out, "engine lsm") && strstr(out, "engine kallax"), "%s", out);
}

/* Runs cmd through the shell; its output (stdout and stderr) in out. */
static int run(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t got = fread(out, 1, cap - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(ekallax, kvctl_status_names_the_engine)
{
    const char *bdir = getenv("KV_BUILD_DIR");
    cr_assert_not_null(bdir, "KV_BUILD_DIR is not set");
    char bin[512], listen[64], data[128], logp[128], cmd[1024], out[16384];
    snprintf(bin, sizeof(bin), "%s/node/kvnode", bdir);
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", kv_test_free_port());
    snprintf(data, sizeof(data), "%s/node", dir);
    snprintf(logp, sizeof(logp), "%s/kvnode.log", dir);
    unlink(logp); /* the previous start's log must not be read as this one's */
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(logp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        dup2(fd, 2);
        execl(bin, bin, "--id", "n1", "--data-dir", data, "--listen", listen, "--engine", "kallax",
              "--kallax-blocks", "256", (char *)NULL);
        _exit(127);
    }
    snprintf(cmd, sizeof(cmd), "%s/client/kvctl --router %s", bdir, listen);
    char ping[1100];
    snprintf(ping, sizeof(ping), "%s ping 2>&1", cmd);
    bool up = false;
    for (int i = 0; i < 200 && !up; i++) { /* up to ~20 s on a loaded machine */
        up = run(ping, out, sizeof(out)) == 0;
        if (!up)
            usleep(100000);
    }
    char st[1100];
    snprintf(st, sizeof(st), "%s status 2>&1", cmd);
    int rc = up ? run(st, out, sizeof(out)) : -1;
    bool row = strstr(out, "engine kallax (hotrap off, nhc off)") != NULL;
    snprintf(st, sizeof(st), "%s status --verbose 2>&1", cmd);
    char vout[16384] = "";
    int vrc = up ? run(st, vout, sizeof(vout)) : -1;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    cr_assert(up, "kvnode --engine kallax did not answer (log %s)", logp);
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(row, "the status row names the engine: %s", out);
    cr_assert_eq(vrc, 0, "%s", vout);
    cr_assert(strstr(vout, "engine") && strstr(vout, "off (kallax)") &&
                  strstr(vout, "kallax.blocks") && strstr(vout, "nhc.state"),
              "verbose: %s", vout);
}
