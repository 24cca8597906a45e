/* SPDX-License-Identifier: MIT */
/*
 * kvctl hotkeys [--top N] [--watch] [--json]: the cluster-wide hot keys
 * (admin.HotKeys through a router), with estimated ops/s, owning nodes and
 * whether the nodes pinned them. --json prints one array of
 * {"key":..,"ops_per_s":..,"nodes":[..],"pinned":..}; a key that is not
 * printable UTF-8 is given as "key_b64" instead.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/kvctl.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

/* True when s is valid UTF-8 without control characters. */
static bool printable_utf8(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n || (len == 1 && (c < 0x20 || c == 0x7f)))
            return false;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
        i += len;
    }
    return true;
}

static void print_b64(const uint8_t *s, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    putchar('"');
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) |
                     (i + 2 < n ? s[i + 2] : 0);
        putchar(tab[v >> 18]);
        putchar(tab[(v >> 12) & 63]);
        putchar(i + 1 < n ? tab[(v >> 6) & 63] : '=');
        putchar(i + 2 < n ? tab[v & 63] : '=');
    }
    putchar('"');
}

static void print_json(const Kv__HotKeysReply *r)
{
    putchar('[');
    for (size_t i = 0; i < r->n_keys; i++) {
        const Kv__HotKeyInfo *k = r->keys[i];
        printf("%s{", i ? "," : "");
        if (printable_utf8(k->key.data, k->key.len)) {
            printf("\"key\":");
            kvctl_json_str((const char *)k->key.data, k->key.len);
        } else {
            printf("\"key_b64\":");
            print_b64(k->key.data, k->key.len);
        }
        printf(",\"ops_per_s\":%.1f,\"nodes\":[", k->ops_per_s);
        for (size_t j = 0; j < k->n_nodes; j++) {
            printf("%s", j ? "," : "");
            kvctl_json_str(k->nodes[j], strlen(k->nodes[j]));
        }
        printf("],\"pinned\":%s}", k->pinned ? "true" : "false");
    }
    printf("]\n");
}

static void print_table(const Kv__HotKeysReply *r)
{
    printf("%-4s %-32s %12s  %-6s %s\n", "#", "KEY", "OPS/S", "PINNED", "NODES");
    for (size_t i = 0; i < r->n_keys; i++) {
        const Kv__HotKeyInfo *k = r->keys[i];
        char key[40];
        if (printable_utf8(k->key.data, k->key.len))
            snprintf(key, sizeof(key), "%.*s", (int)(k->key.len > 32 ? 32 : k->key.len),
                     (const char *)k->key.data);
        else
            snprintf(key, sizeof(key), "(%zu binary bytes)", k->key.len);
        printf("%-4zu %-32s %12.1f  %-6s ", i + 1, key, k->ops_per_s, k->pinned ? "yes" : "no");
        for (size_t j = 0; j < k->n_nodes; j++)
            printf("%s%s", j ? "," : "", k->nodes[j]);
        putchar('\n');
    }
    if (!r->n_keys)
        printf("(no hot keys reported in the last windows)\n");
}

int kvctl_hotkeys(kvctl_env *env, int argc, char **argv)
{
    rpc_chan *ch = NULL;
    rpc_chan_opts o = {.auth = env->auth, .tls = env->tls, .connect_wait_ms = 1000};
    if (rpc_chan_open(&ch, env->router, &o) != KV_OK)
        return kvctl_fail(KV_INVALID_ARGUMENT, "bad --router address");
    int code = KVCTL_OK;
    do {
        Kv__HotKeysRequest req = KV__HOT_KEYS_REQUEST__INIT;
        req.top = (uint32_t)(env->top > 0 ? env->top : 20);
        rpc_reply rep;
        kv_err rv = rpc_call(ch, "admin.HotKeys", 0, &req.base, (uint32_t)env->timeout_ms, &rep);
        Kv__HotKeysReply *r =
            rv == KV_OK ? kv__hot_keys_reply__unpack(NULL, rep.len, rep.body) : NULL;
        if (!r) {
            code = kvctl_fail(rv == KV_OK ? KV_INTERNAL : rv,
                              rep.message ? rep.message : kv_strerror(rv));
        } else {
            if (env->watch && !env->json)
                printf("\033[H\033[2J");
            env->json ? print_json(r) : print_table(r);
            fflush(stdout);
            kv__hot_keys_reply__free_unpacked(r, NULL);
        }
        rpc_reply_free(&rep);
        if (env->watch && code == KVCTL_OK)
            sleep(1);
    } while (env->watch && code == KVCTL_OK);
    rpc_chan_close(ch);
    return code;
}
