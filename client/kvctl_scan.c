/* SPDX-License-Identifier: MIT */
/*
 * kvctl scan: live keys in key order through kv.Scan (a router merges the
 * nodes' ordered streams; see shard/router_scan.c). Prints at most --limit
 * keys (default 100), one per line as KEY TAB VALUE (--keys-only: KEY;
 * --hex: both in hex), fetching pages of up to 1000 keys. When keys remain,
 * prints "cursor: HEX" on stderr: `--cursor HEX` continues after it. With
 * --json one object: {"items":[{"key","value","version","expire_at_ms"}],
 * "cursor":HEX|null,"done":bool} (binary keys and values as key_b64 /
 * value_b64, versions as strings).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/kvctl.h"

#define PAGE_MAX 1000u

static void print_item(const kvctl_env *env, const Kv__ScanItem *it, bool first)
{
    if (env->json) {
        printf("%s{", first ? "" : ",");
        kvctl_json_bytes("key", it->key.data, it->key.len);
        if (!env->keys_only) {
            putchar(',');
            kvctl_json_bytes("value", it->value.data, it->value.len);
        }
        printf(",\"version\":\"%llu\",\"expire_at_ms\":%llu}", (unsigned long long)it->version,
               (unsigned long long)it->expire_at_ms);
        return;
    }
    kvctl_print_bytes(env, it->key.data, it->key.len);
    if (!env->keys_only) {
        putchar('\t');
        kvctl_print_bytes(env, it->value.data, it->value.len);
    }
    putchar('\n');
}

int kvctl_scan(kvctl_env *env, int argc, char **argv)
{
    if (!kvctl_addr_ok(env->router))
        return KVCTL_USAGE;
    uint8_t *prefix = NULL, *start = NULL, *cursor = NULL;
    size_t plen = 0, slen = 0, clen = 0;
    int code = KVCTL_OK;
    if (env->prefix)
        code = kvctl_key_arg(env, env->prefix, &prefix, &plen);
    if (code == KVCTL_OK && env->start)
        code = kvctl_key_arg(env, env->start, &start, &slen);
    if (code == KVCTL_OK && env->cursor)
        code = kvctl_unhex("cursor", env->cursor, &cursor, &clen);
    rpc_chan *ch = code == KVCTL_OK ? kvctl_open_chan(env, env->router) : NULL;
    if (code == KVCTL_OK && !ch)
        code = KVCTL_USAGE;
    uint64_t want = env->limit > 0 ? (uint64_t)env->limit : 100, got = 0;
    bool done = false;
    if (code == KVCTL_OK && env->json)
        printf("{\"items\":[");
    while (code == KVCTL_OK && !done && got < want) {
        Kv__ScanRequest req = KV__SCAN_REQUEST__INIT;
        req.prefix = (ProtobufCBinaryData){plen, prefix};
        req.start = (ProtobufCBinaryData){slen, start};
        req.cursor = (ProtobufCBinaryData){clen, cursor};
        req.keys_only = env->keys_only;
        req.limit = (uint32_t)(want - got < PAGE_MAX ? want - got : PAGE_MAX);
        rpc_reply rep;
        if ((code = kvctl_call(env, ch, "kv.Scan", &req.base, 0, &rep, false)) != KVCTL_OK)
            break;
        Kv__ScanReply *page = kv__scan_reply__unpack(NULL, rep.len, rep.body);
        rpc_reply_free(&rep);
        if (!page) {
            code = kvctl_fail(KV_INTERNAL, "malformed ScanReply");
            break;
        }
        for (size_t i = 0; i < page->n_items && got < want; i++)
            print_item(env, page->items[i], got++ == 0);
        done = page->done;
        if (!done) { /* the next page (or the printed cursor) goes on after it */
            uint8_t *c = malloc(page->cursor.len ? page->cursor.len : 1);
            if (c) {
                memcpy(c, page->cursor.data, page->cursor.len);
                free(cursor);
                cursor = c;
                clen = page->cursor.len;
            } else {
                code = kvctl_fail(KV_RESOURCE_EXHAUSTED, "out of memory");
            }
        }
        kv__scan_reply__free_unpacked(page, NULL);
    }
    if (code == KVCTL_OK && env->json) {
        printf("],\"cursor\":");
        if (done) {
            printf("null");
        } else {
            putchar('"');
            kvctl_print_hex(cursor, clen);
            putchar('"');
        }
        printf(",\"done\":%s}\n", done ? "true" : "false");
    } else if (code == KVCTL_OK && !done) {
        fflush(stdout); /* the keys first, then the cursor */
        fprintf(stderr, "cursor: ");
        for (size_t i = 0; i < clen; i++)
            fprintf(stderr, "%02x", cursor[i]);
        fprintf(stderr, "   (--cursor to continue)\n");
    }
    rpc_chan_close(ch);
    free(prefix);
    free(start);
    free(cursor);
    return code;
}
