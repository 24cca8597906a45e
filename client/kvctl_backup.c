/* SPDX-License-Identifier: MIT */
/*
 * kvctl backup FILE|- [--prefix P] and kvctl restore FILE: a logical copy of
 * the cluster's live keys, taken through a router with kv.Scan and written
 * back with kv.Batch, so it works for every engine and any cluster shape (a
 * backup of three nodes restores into five).
 *
 * A backup is not a point-in-time snapshot of the whole cluster: each page of
 * 1000 keys is read when kvctl reaches it, so a write made during the backup
 * may or may not be in it (each key holds a value it had). A restore writes
 * every key again with a new version (the newest write wins, as for any
 * put), keeps the remaining time to live of keys that expire and skips those
 * that expired since. Deleted keys are not in a backup, so a restore does not
 * delete keys written after it was taken.
 *
 * File format, little-endian (docs/operations.md "Backup and restore"):
 *   header   "HKVBACK1" [u32 format = 1][u32 flags = 0][u64 created_ms]
 *   record   [u32 crc][u32 klen >= 1][u32 vlen][u64 version][u64 expire_at_ms]
 *            [key][value]    crc: CRC32C of the record's bytes after it
 *   end      [u32 crc][u32 0][u32 0][u64 records][u64 bytes]
 *            crc over the 24 bytes after it; bytes = the records' keys and
 *            values; nothing may follow it.
 * The file is written under FILE.tmp.PID, synced and renamed over FILE, so
 * FILE is always a whole backup (an older one until the new one is done).
 * restore reads the whole file and checks every checksum and the end's
 * counts before it writes anything: a damaged or truncated backup is
 * refused with DATA_LOSS naming the record and its offset.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/kvctl.h"
#include "common/clock.h"
#include "common/crc32c.h"

#define BK_MAGIC "HKVBACK1"
#define BK_FORMAT 1u
#define BK_HDR 24u /* magic, format, flags, created_ms */
#define BK_REC 28u /* crc, klen, vlen, version, expire_at_ms */
#define SCAN_PAGE 1000u
/* A restore batch: at most this many keys or bytes (one larger value goes
 * alone), well inside the cluster's batch limits (common/limits.h). */
#define CHUNK_OPS 1000u
#define CHUNK_BYTES (8u << 20)
/* Sanity bounds of a record read back: above them the length is damage,
 * not data (the cluster's own limits are checked by the cluster). */
#define BK_MAX_KEY (1u << 20)
#define BK_MAX_VALUE (1u << 30)

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- backup ---- */

typedef struct bk_out {
    FILE *f;
    const char *path; /* as named: "-" is stdout */
    char *tmp;        /* FILE.tmp.PID while it is written; NULL for stdout */
    uint64_t records, bytes;
} bk_out;

static int out_write(bk_out *o, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, o->f) != n) {
        fprintf(stderr, "kvctl: INTERNAL: cannot write %s: %s\n", o->tmp ? o->tmp : "stdout",
                strerror(errno));
        return KVCTL_SERVER;
    }
    return KVCTL_OK;
}

static int out_open(bk_out *o, const char *path)
{
    memset(o, 0, sizeof(*o));
    o->path = path;
    if (strcmp(path, "-") == 0) {
        o->f = stdout;
    } else {
        size_t n = strlen(path) + 32;
        if (!(o->tmp = malloc(n)))
            return kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
        snprintf(o->tmp, n, "%s.tmp.%ld", path, (long)getpid());
        /* 0600: a backup holds every value of the cluster */
        int fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || !(o->f = fdopen(fd, "wb"))) {
            fprintf(stderr, "kvctl: INVALID_ARGUMENT: cannot create %s: %s\n", o->tmp,
                    strerror(errno));
            if (fd >= 0)
                close(fd);
            free(o->tmp);
            o->tmp = NULL;
            return KVCTL_USAGE;
        }
    }
    uint8_t h[BK_HDR];
    memcpy(h, BK_MAGIC, 8);
    put32(h + 8, BK_FORMAT);
    put32(h + 12, 0);
    put64(h + 16, kv_wall_ms());
    return out_write(o, h, sizeof(h));
}

static int out_record(bk_out *o, const Kv__ScanItem *it)
{
    uint8_t h[BK_REC];
    put32(h + 4, (uint32_t)it->key.len);
    put32(h + 8, (uint32_t)it->value.len);
    put64(h + 12, it->version);
    put64(h + 20, it->expire_at_ms);
    uint32_t crc = kv_crc32c(0, h + 4, BK_REC - 4);
    crc = kv_crc32c(crc, it->key.data, it->key.len);
    put32(h, kv_crc32c(crc, it->value.data, it->value.len));
    int code = out_write(o, h, sizeof(h));
    if (code == KVCTL_OK)
        code = out_write(o, it->key.data, it->key.len);
    if (code == KVCTL_OK)
        code = out_write(o, it->value.data, it->value.len);
    o->records++;
    o->bytes += it->key.len + it->value.len;
    return code;
}

/* Writes the end, syncs and renames the file into place. On failure (or
 * code != OK on entry) removes the temporary file. */
static int out_close(bk_out *o, int code)
{
    if (code == KVCTL_OK) {
        uint8_t e[BK_REC] = {0};
        put64(e + 12, o->records);
        put64(e + 20, o->bytes);
        put32(e, kv_crc32c(0, e + 4, BK_REC - 4));
        code = out_write(o, e, sizeof(e));
    }
    if (code == KVCTL_OK && fflush(o->f) != 0) {
        fprintf(stderr, "kvctl: INTERNAL: cannot write %s: %s\n", o->tmp ? o->tmp : "stdout",
                strerror(errno));
        code = KVCTL_SERVER;
    }
    if (!o->tmp)
        return code;
    if (code == KVCTL_OK && fsync(fileno(o->f)) != 0) {
        fprintf(stderr, "kvctl: INTERNAL: cannot sync %s: %s\n", o->tmp, strerror(errno));
        code = KVCTL_SERVER;
    }
    if (fclose(o->f) != 0 && code == KVCTL_OK) {
        fprintf(stderr, "kvctl: INTERNAL: cannot write %s: %s\n", o->tmp, strerror(errno));
        code = KVCTL_SERVER;
    }
    if (code == KVCTL_OK && rename(o->tmp, o->path) != 0) {
        fprintf(stderr, "kvctl: INTERNAL: cannot rename %s to %s: %s\n", o->tmp, o->path,
                strerror(errno));
        code = KVCTL_SERVER;
    }
    if (code == KVCTL_OK) { /* the rename itself survives a crash */
        char *d = strdup(o->path);
        int fd = d ? open(dirname(d), O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        if (fd >= 0) {
            (void)fsync(fd);
            close(fd);
        }
        free(d);
    } else {
        unlink(o->tmp);
    }
    free(o->tmp);
    return code;
}

int kvctl_backup(kvctl_env *env, int argc, char **argv)
{
    (void)argc;
    if (!kvctl_addr_ok(env->router))
        return KVCTL_USAGE;
    if (env->start || env->cursor || env->limit || env->keys_only) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: backup takes --prefix only of the scan flags "
                        "(it copies every key, with its value)\n");
        return KVCTL_USAGE;
    }
    uint8_t *prefix = NULL, *cursor = NULL;
    size_t plen = 0, clen = 0;
    int code = env->prefix ? kvctl_key_arg(env, env->prefix, &prefix, &plen) : KVCTL_OK;
    rpc_chan *ch = code == KVCTL_OK ? kvctl_open_chan(env, env->router) : NULL;
    if (code == KVCTL_OK && !ch)
        code = KVCTL_USAGE;
    bk_out o = {0}; /* o.f is set once the output is open: out_close then */
    if (code == KVCTL_OK)
        code = out_open(&o, argv[0]);
    for (bool done = false; code == KVCTL_OK && !done;) {
        Kv__ScanReply *page;
        code = kvctl_scan_page(env, ch,
                               &(kvctl_scan_q){.prefix = prefix, .plen = plen, .limit = SCAN_PAGE},
                               &cursor, &clen, &page);
        if (code != KVCTL_OK)
            break;
        for (size_t i = 0; code == KVCTL_OK && i < page->n_items; i++)
            code = out_record(&o, page->items[i]);
        done = page->done;
        kv__scan_reply__free_unpacked(page, NULL);
    }
    if (o.f)
        code = out_close(&o, code);
    if (code == KVCTL_OK) {
        bool to_stdout = strcmp(argv[0], "-") == 0; /* then the summary goes to stderr */
        FILE *msg = to_stdout ? stderr : stdout;
        if (env->json) {
            fprintf(msg, "{\"file\":");
            if (to_stdout)
                fprintf(msg, "\"-\"");
            else
                kvctl_json_str(argv[0], strlen(argv[0]));
            fprintf(msg, ",\"keys\":%llu,\"bytes\":%llu}\n", (unsigned long long)o.records,
                    (unsigned long long)o.bytes);
        } else {
            fprintf(msg, "backed up %llu keys (%llu bytes of keys and values) to %s\n",
                    (unsigned long long)o.records, (unsigned long long)o.bytes,
                    to_stdout ? "stdout" : argv[0]);
        }
    }
    rpc_chan_close(ch);
    free(prefix);
    free(cursor);
    return code;
}

/* ---- restore ---- */

typedef struct bk_in {
    FILE *f;
    const char *path;
    uint64_t off; /* of the next record */
    uint64_t n;   /* records read */
    uint64_t bytes;
    uint8_t *buf; /* the last record's key and value */
    size_t cap;
    uint32_t klen, vlen;
    uint64_t expire_at_ms; /* (a restore gives keys new versions) */
} bk_in;

static int damaged(const bk_in *in, const char *what)
{
    fprintf(stderr, "kvctl: DATA_LOSS: %s: %s at byte %llu (record %llu)\n", in->path, what,
            (unsigned long long)in->off, (unsigned long long)in->n + 1);
    return KVCTL_SERVER;
}

/* Reads n bytes; 1 on success, 0 at a clean end of file before any, -1 on
 * a short read or an error. */
static int in_read(bk_in *in, void *p, size_t n)
{
    size_t got = n ? fread(p, 1, n, in->f) : 0;
    if (got == n)
        return 1;
    return got == 0 && feof(in->f) ? 0 : -1;
}

static int in_open(bk_in *in, const char *path)
{
    memset(in, 0, sizeof(*in));
    in->path = path;
    if (!(in->f = fopen(path, "rb"))) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: cannot open %s: %s\n", path, strerror(errno));
        return KVCTL_USAGE;
    }
    uint8_t h[BK_HDR];
    if (in_read(in, h, sizeof(h)) != 1 || memcmp(h, BK_MAGIC, 8) != 0) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: %s is not a hotkv backup (no %s header)\n", path,
                BK_MAGIC);
        return KVCTL_USAGE;
    }
    if (get32(h + 8) != BK_FORMAT) {
        fprintf(stderr,
                "kvctl: INVALID_ARGUMENT: %s is a backup of format %u; this kvctl reads "
                "format %u\n",
                path, get32(h + 8), BK_FORMAT);
        return KVCTL_USAGE;
    }
    in->off = BK_HDR;
    return KVCTL_OK;
}

/* The next record into in (1), the end checked against what was read (0),
 * or damage reported (-1). */
static int in_next(bk_in *in)
{
    uint8_t h[BK_REC];
    int r = in_read(in, h, sizeof(h));
    const char *bad = NULL;
    if (r != 1) {
        bad = r == 0 ? "the file ends without its end marker (an unfinished backup?)"
                     : "the file ends inside a record header";
        goto damage;
    }
    in->klen = get32(h + 4);
    in->vlen = get32(h + 8);
    uint32_t crc = kv_crc32c(0, h + 4, BK_REC - 4);
    if (in->klen == 0) { /* the end */
        uint8_t extra;
        if (in->vlen != 0 || crc != get32(h))
            bad = "bad end marker (checksum mismatch)";
        else if (get64(h + 12) != in->n || get64(h + 20) != in->bytes)
            bad = "the end marker's record count or size does not match the records before it";
        else if (in_read(in, &extra, 1) != 0)
            bad = "data after the end marker";
        if (bad)
            goto damage;
        return 0;
    }
    if (in->klen > BK_MAX_KEY || in->vlen > BK_MAX_VALUE) {
        bad = "implausible key or value length (checksum not reached)";
        goto damage;
    }
    size_t need = (size_t)in->klen + in->vlen;
    if (need > in->cap) {
        uint8_t *b = realloc(in->buf, need);
        if (!b) {
            kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
            return -1;
        }
        in->buf = b;
        in->cap = need;
    }
    if (in_read(in, in->buf, need) != 1)
        bad = "the file ends inside a record";
    else if (kv_crc32c(crc, in->buf, need) != get32(h))
        bad = "checksum mismatch";
    if (bad)
        goto damage;
    in->expire_at_ms = get64(h + 20);
    in->off += BK_REC + need;
    in->n++;
    in->bytes += need;
    return 1;
damage:
    damaged(in, bad);
    return -1;
}

typedef struct chunk {
    kv_op ops[CHUNK_OPS];
    uint8_t *mem[CHUNK_OPS];
    size_t n, bytes;
} chunk;

static void chunk_clear(chunk *c)
{
    for (size_t i = 0; i < c->n; i++)
        free(c->mem[i]);
    c->n = c->bytes = 0;
}

/* Writes the chunk's keys; on a failure prints which and why. */
static int chunk_run(kvctl_env *env, kv_client *cl, chunk *c, uint64_t *written)
{
    if (!c->n)
        return KVCTL_OK;
    kv_err rv = kv_batch(cl, c->ops, c->n, kvctl_consistency(env));
    int code = KVCTL_OK;
    if (rv != KV_OK) {
        code = kvctl_fail(rv, kv_last_error());
    } else {
        for (size_t i = 0; i < c->n; i++) {
            if (c->ops[i].status == KV_OK) {
                (*written)++;
            } else if (code == KVCTL_OK) {
                const uint8_t *k = c->ops[i].key;
                size_t n = c->ops[i].klen < 200 ? c->ops[i].klen : 200; /* a long one cut */
                bool hex = env->hex || !kvctl_utf8_text(k, n);
                fprintf(stderr, "kvctl: %s: writing key%s ", kv_err_name(c->ops[i].status),
                        hex && !env->hex ? " (hex)" : "");
                for (size_t j = 0; j < n; j++)
                    fprintf(stderr, hex ? "%02x" : "%c", k[j]);
                fprintf(stderr, "%s\n", n < c->ops[i].klen ? "..." : "");
                code = KVCTL_SERVER;
            }
        }
        kv_batch_free(c->ops, c->n);
    }
    chunk_clear(c);
    return code;
}

int kvctl_restore(kvctl_env *env, int argc, char **argv)
{
    (void)argc;
    if (!kvctl_addr_ok(env->router))
        return KVCTL_USAGE;
    if (strcmp(argv[0], "-") == 0) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: restore reads a file (it checks the whole "
                        "backup before writing), not stdin\n");
        return KVCTL_USAGE;
    }
    bk_in in;
    int code = in_open(&in, argv[0]);
    int r = 0;
    bool writing = false;
    while (code == KVCTL_OK && (r = in_next(&in)) > 0) /* pass 1: check everything */
        ;
    if (code == KVCTL_OK && r < 0) {
        fprintf(stderr, "kvctl: the backup was not restored (nothing was written)\n");
        code = KVCTL_SERVER;
    }
    uint64_t total = in.n, written = 0, expired = 0;
    kv_client *cl = NULL;
    kv_client_opts o = kvctl_client_opts(env);
    if (code == KVCTL_OK && kv_client_open(&cl, env->router, &o) != KV_OK)
        code = kvctl_fail(KV_UNAVAILABLE, kv_last_error());
    chunk *c = code == KVCTL_OK ? calloc(1, sizeof(*c)) : NULL;
    if (code == KVCTL_OK && !c)
        code = kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    if (code == KVCTL_OK) { /* pass 2: the same records, now known good */
        writing = true;
        in.off = BK_HDR;
        in.n = in.bytes = 0;
        if (fseek(in.f, BK_HDR, SEEK_SET) != 0)
            code = kvctl_fail(KV_INTERNAL, strerror(errno));
    }
    while (code == KVCTL_OK && (r = in_next(&in)) > 0) {
        uint64_t ttl = 0;
        if (in.expire_at_ms) {
            uint64_t now = kv_wall_ms();
            if (in.expire_at_ms <= now) {
                expired++;
                continue;
            }
            ttl = in.expire_at_ms - now;
        }
        size_t need = (size_t)in.klen + in.vlen;
        if (c->n == CHUNK_OPS || (c->n && c->bytes + need > CHUNK_BYTES))
            code = chunk_run(env, cl, c, &written);
        uint8_t *m = code == KVCTL_OK ? malloc(need) : NULL;
        if (code == KVCTL_OK && !m)
            code = kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
        if (code != KVCTL_OK) {
            free(m);
            break;
        }
        memcpy(m, in.buf, need);
        c->mem[c->n] = m;
        c->ops[c->n] = (kv_op){.type = KV_OP_PUT,
                               .key = m,
                               .klen = in.klen,
                               .val = m + in.klen,
                               .vlen = in.vlen,
                               .ttl_ms = ttl};
        c->n++;
        c->bytes += need;
    }
    if (code == KVCTL_OK && r < 0) /* the file changed under us since pass 1 */
        code = KVCTL_SERVER;
    if (c && code == KVCTL_OK)
        code = chunk_run(env, cl, c, &written);
    if (c)
        chunk_clear(c);
    if (code == KVCTL_OK && env->json) {
        printf("{\"file\":");
        kvctl_json_str(argv[0], strlen(argv[0]));
        printf(",\"keys\":%llu,\"expired\":%llu}\n", (unsigned long long)written,
               (unsigned long long)expired);
    } else if (code == KVCTL_OK) {
        printf("restored %llu keys from %s (%llu had expired since the backup)\n",
               (unsigned long long)written, argv[0], (unsigned long long)expired);
    } else if (writing) {
        fprintf(stderr,
                "kvctl: restore stopped after %llu of %llu keys; running it again writes them "
                "all again\n",
                (unsigned long long)written, (unsigned long long)total);
    }
    free(c);
    kv_client_close(cl);
    free(in.buf);
    if (in.f)
        fclose(in.f);
    return code;
}
