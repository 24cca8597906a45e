/* SPDX-License-Identifier: MIT */
/*
 * kvctl batch [FILE|-]: one operation per line, run in kv.Batch requests of
 * up to 1,000 operations, results printed in order, one line each.
 *   get KEY
 *   put KEY VALUE     (VALUE: the rest of the line after one space)
 *   del KEY
 * Blank lines and lines starting with # are skipped; with --hex, keys and
 * values are hex. Exit 0 when every operation succeeded (a get that finds
 * nothing succeeded), 3 when one failed, 2 for a malformed line.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvctl.h"
#include "kv/kv.h"

#define CHUNK 1000

typedef struct line_op {
    kv_op op;
    uint8_t *key, *val;
} line_op;

static int hexbytes(const char *s, size_t n, uint8_t **out, size_t *len)
{
    uint8_t *b = malloc(n / 2 + 1);
    if (!b || n % 2)
        goto bad;
    for (size_t i = 0; i < n; i += 2) {
        unsigned v;
        if (sscanf(s + i, "%2x", &v) != 1)
            goto bad;
        b[i / 2] = (uint8_t)v;
    }
    *out = b;
    *len = n / 2;
    return 0;
bad:
    free(b);
    return -1;
}

/* Copies n bytes of s (hex-decoded with --hex). */
static int field(kvctl_env *env, const char *s, size_t n, uint8_t **out, size_t *len)
{
    if (env->hex)
        return hexbytes(s, n, out, len);
    if (!(*out = malloc(n ? n : 1)))
        return -1;
    memcpy(*out, s, n);
    *len = n;
    return 0;
}

/* Parses one line into o; returns 0, 1 for a line to skip, -1 if bad. */
static int parse_line(kvctl_env *env, char *line, line_op *o)
{
    size_t n = strcspn(line, "\r\n");
    line[n] = '\0';
    if (n == 0 || line[0] == '#')
        return 1;
    char *sp = strchr(line, ' ');
    if (!sp)
        return -1;
    *sp = '\0';
    char *key = sp + 1, *val = NULL;
    memset(o, 0, sizeof(*o));
    if (strcmp(line, "get") == 0)
        o->op.type = KV_OP_GET;
    else if (strcmp(line, "del") == 0)
        o->op.type = KV_OP_DELETE;
    else if (strcmp(line, "put") == 0 && (val = strchr(key, ' ')) != NULL)
        o->op.type = KV_OP_PUT, *val++ = '\0';
    else
        return -1;
    if (!*key || strchr(key, ' ') || field(env, key, strlen(key), &o->key, &o->op.klen) != 0)
        return -1;
    o->op.key = o->key;
    if (val && field(env, val, strlen(val), &o->val, &o->op.vlen) != 0)
        return -1;
    o->op.val = o->val;
    o->op.ttl_ms = (uint64_t)env->ttl_ms;
    return 0;
}

static void print_result(kvctl_env *env, const kv_op *op)
{
    static const char *const names[] = {"get", "put", "del"};
    if (env->json) {
        printf("{\"op\":\"%s\",", names[op->type]);
        kvctl_json_bytes("key", op->key, op->klen);
        printf(",\"status\":\"%s\"", kv_err_name(op->status));
        if (op->status == KV_OK && op->type == KV_OP_GET) {
            printf(",\"found\":%s", op->found ? "true" : "false");
            if (op->found) {
                putchar(',');
                kvctl_json_bytes("value", op->value, op->value_len);
            }
        }
        if (op->status == KV_OK && op->version)
            printf(",\"version\":\"%llu\"", (unsigned long long)op->version);
        printf("}\n");
    } else if (op->status != KV_OK) {
        printf("ERROR %s\n", kv_err_name(op->status));
    } else if (op->type == KV_OP_GET && !op->found) {
        printf("(not found)\n");
    } else if (op->type == KV_OP_GET) {
        for (size_t i = 0; env->hex && i < op->value_len; i++)
            printf("%02x", op->value[i]);
        if (!env->hex)
            fwrite(op->value, 1, op->value_len, stdout);
        putchar('\n');
    } else {
        printf(op->type == KV_OP_DELETE ? "%d\n" : "OK\n", op->found ? 1 : 0);
    }
}

/* Runs and prints the n parsed operations; frees them. */
static int run_chunk(kvctl_env *env, kv_client *c, line_op *ops, size_t n)
{
    kv_op *v = calloc(n ? n : 1, sizeof(*v));
    int code = v ? KVCTL_OK : kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; v && i < n; i++)
        v[i] = ops[i].op;
    kv_err rv = v && n ? kv_batch(c, v, n, KV_CONSISTENCY_DEFAULT) : KV_OK;
    if (v && rv != KV_OK)
        code = kvctl_fail(rv, kv_last_error());
    for (size_t i = 0; v && rv == KV_OK && i < n; i++) {
        print_result(env, &v[i]);
        if (v[i].status != KV_OK)
            code = KVCTL_SERVER;
    }
    if (v && rv == KV_OK)
        kv_batch_free(v, n);
    for (size_t i = 0; i < n; i++) {
        free(ops[i].key);
        free(ops[i].val);
    }
    free(v);
    return code;
}

int kvctl_batch(kvctl_env *env, int argc, char **argv)
{
    const char *path = argc ? argv[0] : "-";
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: cannot open %s\n", path);
        return KVCTL_USAGE;
    }
    kv_client *c = NULL;
    kv_client_opts o = kvctl_client_opts(env);
    int code = kvctl_addr_ok(env->router) ? KVCTL_OK : KVCTL_USAGE;
    if (code == KVCTL_OK && kv_client_open(&c, env->router, &o) != KV_OK)
        code = kvctl_fail(KV_UNAVAILABLE, kv_last_error());
    line_op *ops = calloc(CHUNK, sizeof(*ops));
    size_t n = 0, lineno = 0, cap = 0;
    char *line = NULL;
    while (code != KVCTL_USAGE && c && ops && getline(&line, &cap, f) >= 0) {
        lineno++;
        int p = parse_line(env, line, &ops[n]);
        if (p < 0) {
            fprintf(stderr,
                    "kvctl: INVALID_ARGUMENT: line %zu: want get KEY, put KEY VALUE or "
                    "del KEY%s\n",
                    lineno, env->hex ? " (in hex)" : "");
            code = KVCTL_USAGE;
        } else if (p == 0 && ++n == CHUNK) {
            int rc = run_chunk(env, c, ops, n);
            code = code == KVCTL_OK ? rc : code;
            n = 0;
        }
    }
    int rc = c && ops && code != KVCTL_USAGE ? run_chunk(env, c, ops, n) : KVCTL_OK;
    code = code == KVCTL_OK ? rc : code;
    for (size_t i = 0; code == KVCTL_USAGE && ops && i < n; i++) {
        free(ops[i].key);
        free(ops[i].val);
    }
    free(line);
    free(ops);
    kv_client_close(c);
    if (f != stdin)
        fclose(f);
    return code;
}
