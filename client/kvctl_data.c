/* SPDX-License-Identifier: MIT */
/* kvctl get / put / del, through libkvclient. */
#include <stdio.h>
#include <string.h>

#include "client/kvctl.h"
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
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

static kv_client *open_client(kvctl_env *env, int *code)
{
    kv_client *c = NULL;
    kv_client_opts o = {.timeout_ms = (uint32_t)env->timeout_ms, .auth = env->auth};
    kv_err rv = kv_client_open(&c, env->router, &o);
    if (rv != KV_OK) {
        *code = kvctl_fail(rv, kv_last_error());
        return NULL;
    }
    return c;
}

int kvctl_get(kvctl_env *env, int argc, char **argv)
{
    int code = KVCTL_OK;
    kv_client *c = open_client(env, &code);
    if (!c)
        return code;
    kv_value v;
    kv_err rv = kv_get(c, argv[0], strlen(argv[0]), &v);
    if (rv == KV_NOT_FOUND) {
        if (env->json)
            printf("{\"found\":false}\n");
        else
            fprintf(stderr, "(not found)\n");
        code = KVCTL_NOT_FOUND;
    } else if (rv != KV_OK) {
        code = kvctl_fail(rv, kv_last_error());
    } else if (env->json) {
        printf("{\"found\":true,\"value\":");
        kvctl_json_str((const char *)v.data, v.len);
        printf(",\"version\":%llu}\n", (unsigned long long)v.version);
        kv_value_free(&v);
    } else {
        fwrite(v.data, 1, v.len, stdout);
        putchar('\n');
        kv_value_free(&v);
    }
    kv_client_close(c);
    return code;
}

int kvctl_put(kvctl_env *env, int argc, char **argv)
{
    int code = KVCTL_OK;
    kv_client *c = open_client(env, &code);
    if (!c)
        return code;
    kv_put_opts o = {.ttl_ms = (uint64_t)env->ttl_ms};
    uint64_t version = 0;
    kv_err rv = kv_put(c, argv[0], strlen(argv[0]), argv[1], strlen(argv[1]), &o, &version);
    if (rv != KV_OK)
        code = kvctl_fail(rv, kv_last_error());
    else if (env->json)
        printf("{\"version\":%llu}\n", (unsigned long long)version);
    else
        printf("OK\n");
    kv_client_close(c);
    return code;
}

int kvctl_del(kvctl_env *env, int argc, char **argv)
{
    int code = KVCTL_OK;
    kv_client *c = open_client(env, &code);
    if (!c)
        return code;
    bool existed = false;
    kv_err rv = kv_delete(c, argv[0], strlen(argv[0]), NULL, &existed);
    if (rv != KV_OK)
        code = kvctl_fail(rv, kv_last_error());
    else if (env->json)
        printf("{\"existed\":%s}\n", existed ? "true" : "false");
    else
        printf("%d\n", existed ? 1 : 0);
    kv_client_close(c);
    return code;
}
