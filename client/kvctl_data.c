/* SPDX-License-Identifier: MIT */
/*
 * kvctl get / put / del / ttl / batch, through libkvclient. Keys and values
 * are bytes: `put KEY -` reads the value from stdin, `--file F` from a file,
 * `--hex` takes and prints keys and values in hex, `--` ends the flags (a
 * value that starts with --); `get --raw` prints the value alone, `-o FILE`
 * writes it to a file. With --json, a value that is not printable UTF-8
 * comes as base64 in a `value_b64` field, and versions as strings (they
 * exceed the 2^53 that JSON numbers keep exactly).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvctl.h"
#include "common/clock.h"
#include "kv/kv.h"

int kvctl_fail(kv_err rv, const char *msg)
{
    fprintf(stderr, "kvctl: %s: %s\n", kv_err_name(rv), msg && *msg ? msg : kv_strerror(rv));
    return KVCTL_SERVER;
}

void kvctl_json_str(const char *s, size_t len)
{
    putchar('"');
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* Length of the UTF-8 sequence at s (strict: no overlongs, surrogates or
 * code points past U+10FFFF), 0 when invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80)
        return 1;
    size_t len = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (!len || len > n || (s[0] >= 0xe0 && len == 2))
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] > 0x9f) ||
        (s[0] == 0xf0 && s[1] < 0x90) || (s[0] == 0xf4 && s[1] > 0x8f))
        return 0;
    return len;
}

bool kvctl_utf8_text(const void *data, size_t len)
{
    const unsigned char *s = data;
    for (size_t i = 0; i < len;) {
        size_t k = utf8_seq(s + i, len - i);
        if (!k || (s[i] < 0x20 && s[i] != '\t' && s[i] != '\n') || s[i] == 0x7f)
            return false;
        i += k;
    }
    return true;
}

static void base64(const uint8_t *p, size_t n)
{
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        putchar(t[v >> 18]);
        putchar(t[(v >> 12) & 63]);
        putchar(i + 1 < n ? t[(v >> 6) & 63] : '=');
        putchar(i + 2 < n ? t[v & 63] : '=');
    }
}

void kvctl_json_bytes(const char *field, const void *data, size_t len)
{
    if (kvctl_utf8_text(data, len)) {
        printf("\"%s\":", field);
        kvctl_json_str(data, len);
    } else {
        printf("\"%s_b64\":\"", field);
        base64(data, len);
        putchar('"');
    }
}

/* ---- bytes in and out -------------------------------------------------- */

static int hexval(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Decodes hex text into a malloc'ed buffer; KVCTL_USAGE on bad input. */
static int unhex(const char *what, const char *s, size_t n, uint8_t **out, size_t *olen)
{
    uint8_t *b = malloc(n / 2 + 1);
    bool ok = b && n % 2 == 0;
    for (size_t i = 0; ok && i < n; i += 2) {
        int hi = hexval(s[i]), lo = hexval(s[i + 1]);
        ok = hi >= 0 && lo >= 0;
        b[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    if (!ok) {
        fprintf(stderr,
                "kvctl: INVALID_ARGUMENT: --hex: the %s is not an even number of hex "
                "digits\n",
                what);
        free(b);
        return KVCTL_USAGE;
    }
    *out = b;
    *olen = n / 2;
    return KVCTL_OK;
}

/* Reads all of f into a malloc'ed buffer. */
static int slurp(FILE *f, const char *name, uint8_t **out, size_t *len)
{
    size_t cap = 1 << 16, n = 0, got;
    uint8_t *b = malloc(cap);
    while (b && (got = fread(b + n, 1, cap - n, f)) > 0)
        if ((n += got) == cap) {
            uint8_t *nb = realloc(b, cap *= 2);
            if (!nb)
                free(b);
            b = nb;
        }
    if (!b || ferror(f)) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: cannot read %s: %s\n", name,
                b ? strerror(errno) : "out of memory");
        free(b);
        return KVCTL_USAGE;
    }
    *out = b;
    *len = n;
    return KVCTL_OK;
}

/* The key of argv word s (hex-decoded with --hex). */
static int key_arg(kvctl_env *env, const char *s, uint8_t **out, size_t *len)
{
    if (env->hex)
        return unhex("key", s, strlen(s), out, len);
    *out = (uint8_t *)strdup(s);
    *len = strlen(s);
    return *out ? KVCTL_OK : KVCTL_SERVER;
}

/* The value: the word (or "-" = stdin), or --file. */
static int value_arg(kvctl_env *env, const char *word, uint8_t **out, size_t *len)
{
    if (env->file && word) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: give the value or --file, not both\n");
        return KVCTL_USAGE;
    }
    if (env->file) {
        FILE *f = fopen(env->file, "rb");
        if (!f) {
            fprintf(stderr, "kvctl: INVALID_ARGUMENT: %s: %s\n", env->file, strerror(errno));
            return KVCTL_USAGE;
        }
        int code = slurp(f, env->file, out, len);
        fclose(f);
        return code;
    }
    if (!word) {
        fprintf(stderr, "usage: kvctl put KEY VALUE | put KEY - (stdin) | put KEY --file F\n");
        return KVCTL_USAGE;
    }
    if (strcmp(word, "-") == 0)
        return slurp(stdin, "stdin", out, len);
    if (env->hex)
        return unhex("value", word, strlen(word), out, len);
    *out = (uint8_t *)strdup(word);
    *len = strlen(word);
    return *out ? KVCTL_OK : KVCTL_SERVER;
}

static void print_hex(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        printf("%02x", p[i]);
}

int kvctl_key_arg(kvctl_env *env, const char *s, uint8_t **out, size_t *len)
{
    return key_arg(env, s, out, len);
}

int kvctl_unhex(const char *what, const char *s, uint8_t **out, size_t *len)
{
    return unhex(what, s, strlen(s), out, len);
}

void kvctl_print_bytes(const kvctl_env *env, const uint8_t *p, size_t n)
{
    if (env->hex)
        print_hex(p, n);
    else
        fwrite(p, 1, n, stdout);
}

void kvctl_print_hex(const uint8_t *p, size_t n)
{
    print_hex(p, n);
}

/* ---- commands ---------------------------------------------------------- */

bool kvctl_addr_ok(const char *addr)
{
    if (strstr(addr, "://"))
        return true;
    fprintf(stderr,
            "kvctl: INVALID_ARGUMENT: '%s' is not an address: want tcp://HOST:PORT "
            "(for example tcp://%s)\n",
            addr, addr);
    return false;
}

static kv_client *open_client(kvctl_env *env, int *code)
{
    if (!kvctl_addr_ok(env->router)) {
        *code = KVCTL_USAGE;
        return NULL;
    }
    kv_client *c = NULL;
    kv_client_opts o = kvctl_client_opts(env);
    kv_err rv = kv_client_open(&c, env->router, &o);
    if (rv != KV_OK) {
        *code = kvctl_fail(rv, kv_last_error());
        return NULL;
    }
    return c;
}

/* --if-version: a decimal version, 0 when not given. */
static int if_version(const kvctl_env *env, uint64_t *v)
{
    char *end = NULL;
    *v = env->if_version ? strtoull(env->if_version, &end, 10) : 0;
    if (env->if_version && (!*env->if_version || *end || *env->if_version == '-')) {
        fprintf(stderr, "kvctl: INVALID_ARGUMENT: --if-version '%s' is not a version number\n",
                env->if_version);
        return KVCTL_USAGE;
    }
    return KVCTL_OK;
}

kv_consistency kvctl_consistency(const kvctl_env *env)
{
    static const kv_consistency levels[] = {KV_CONSISTENCY_DEFAULT, KV_CONSISTENCY_ONE,
                                            KV_CONSISTENCY_QUORUM, KV_CONSISTENCY_ALL};
    return levels[env->consistency];
}

/* Writes a value as --raw / -o / --hex / plain ask. */
static int print_value(kvctl_env *env, const kv_value *v)
{
    if (env->output) {
        FILE *f = fopen(env->output, "wb");
        bool ok = f && fwrite(v->data, 1, v->len, f) == v->len;
        if (f && fclose(f) != 0)
            ok = false;
        if (!ok) {
            fprintf(stderr, "kvctl: INTERNAL: cannot write %s: %s\n", env->output, strerror(errno));
            return KVCTL_SERVER;
        }
        return KVCTL_OK;
    }
    if (env->hex)
        print_hex(v->data, v->len);
    else
        fwrite(v->data, 1, v->len, stdout);
    if (!env->raw)
        putchar('\n');
    return KVCTL_OK;
}

int kvctl_get(kvctl_env *env, int argc, char **argv)
{
    int code = KVCTL_OK;
    uint8_t *key = NULL;
    size_t klen = 0;
    kv_client *c = NULL;
    if ((code = key_arg(env, argv[0], &key, &klen)) == KVCTL_OK)
        c = open_client(env, &code);
    kv_value v;
    kv_err rv = c ? kv_get_ex(c, key, klen, kvctl_consistency(env), &v) : KV_INVALID_ARGUMENT;
    if (!c) {
    } else if (rv == KV_NOT_FOUND) {
        if (env->json)
            printf("{\"found\":false}\n");
        else
            fprintf(stderr, "(not found)\n");
        code = KVCTL_NOT_FOUND;
    } else if (rv != KV_OK) {
        code = kvctl_fail(rv, kv_last_error());
    } else if (env->json) {
        printf("{\"found\":true,");
        kvctl_json_bytes("value", v.data, v.len);
        printf(",\"version\":\"%llu\",\"expire_at_ms\":%llu}\n", (unsigned long long)v.version,
               (unsigned long long)v.expire_at_ms);
        kv_value_free(&v);
    } else {
        code = print_value(env, &v);
        kv_value_free(&v);
    }
    kv_client_close(c);
    free(key);
    return code;
}

int kvctl_put(kvctl_env *env, int argc, char **argv)
{
    uint8_t *key = NULL, *val = NULL;
    size_t klen = 0, vlen = 0;
    uint64_t ifv = 0;
    int code = if_version(env, &ifv);
    if (code == KVCTL_OK)
        code = key_arg(env, argv[0], &key, &klen);
    if (code == KVCTL_OK)
        code = value_arg(env, argc > 1 ? argv[1] : NULL, &val, &vlen);
    kv_client *c = code == KVCTL_OK ? open_client(env, &code) : NULL;
    if (c) {
        kv_put_opts o = {.ttl_ms = (uint64_t)env->ttl_ms,
                         .if_version = ifv,
                         .if_absent = env->if_absent,
                         .consistency = kvctl_consistency(env)};
        uint64_t version = 0;
        kv_err rv = kv_put(c, key, klen, val, vlen, &o, &version);
        if (rv != KV_OK)
            code = kvctl_fail(rv, kv_last_error());
        else if (env->json)
            printf("{\"version\":\"%llu\"}\n", (unsigned long long)version);
        else
            printf("OK\n");
    }
    kv_client_close(c);
    free(key);
    free(val);
    return code;
}

int kvctl_del(kvctl_env *env, int argc, char **argv)
{
    uint8_t *key = NULL;
    size_t klen = 0;
    uint64_t ifv = 0;
    int code = if_version(env, &ifv);
    if (code == KVCTL_OK)
        code = key_arg(env, argv[0], &key, &klen);
    kv_client *c = code == KVCTL_OK ? open_client(env, &code) : NULL;
    if (c) {
        kv_delete_opts o = {.if_version = ifv, .consistency = kvctl_consistency(env)};
        bool existed = false;
        kv_err rv = kv_delete(c, key, klen, &o, &existed);
        if (rv != KV_OK)
            code = kvctl_fail(rv, kv_last_error());
        else if (env->json)
            printf("{\"existed\":%s}\n", existed ? "true" : "false");
        else
            printf("%d\n", existed ? 1 : 0);
    }
    kv_client_close(c);
    free(key);
    return code;
}

/* ttl KEY: the remaining time to live in ms ("none" without expiry). */
int kvctl_ttl(kvctl_env *env, int argc, char **argv)
{
    uint8_t *key = NULL;
    size_t klen = 0;
    int code = key_arg(env, argv[0], &key, &klen);
    kv_client *c = code == KVCTL_OK ? open_client(env, &code) : NULL;
    kv_value v;
    kv_err rv = c ? kv_get_ex(c, key, klen, kvctl_consistency(env), &v) : KV_INVALID_ARGUMENT;
    if (c && rv == KV_NOT_FOUND) {
        fprintf(stderr, "(not found)\n");
        code = KVCTL_NOT_FOUND;
    } else if (c && rv != KV_OK) {
        code = kvctl_fail(rv, kv_last_error());
    } else if (c) {
        uint64_t now = kv_wall_ms();
        long long left =
            v.expire_at_ms ? (long long)(v.expire_at_ms > now ? v.expire_at_ms - now : 0) : -1;
        if (env->json && left < 0)
            printf("{\"ttl_ms\":null}\n");
        else if (env->json)
            printf("{\"ttl_ms\":%lld}\n", left);
        else if (left < 0)
            printf("none\n");
        else
            printf("%lld\n", left);
        kv_value_free(&v);
    }
    kv_client_close(c);
    free(key);
    return code;
}
