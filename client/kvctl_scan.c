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

int kvctl_scan_page(kvctl_env *env, rpc_chan *ch, const kvctl_scan_q *q, uint8_t **cursor,
                    size_t *clen, Kv__ScanReply **out)
{
    Kv__ScanRequest req = KV__SCAN_REQUEST__INIT;
    req.prefix = (ProtobufCBinaryData){q->plen, (uint8_t *)q->prefix};
    req.start = (ProtobufCBinaryData){q->slen, (uint8_t *)q->start};
    req.cursor = (ProtobufCBinaryData){*clen, *cursor};
    req.keys_only = q->keys_only;
    req.limit = q->limit;
    rpc_reply rep;
    int code = kvctl_call(env, ch, "kv.Scan", &req.base, 0, &rep, false);
    if (code != KVCTL_OK)
        return code;
    Kv__ScanReply *page = kv__scan_reply__unpack(NULL, rep.len, rep.body);
    rpc_reply_free(&rep);
    if (!page)
        return kvctl_fail(KV_INTERNAL, "malformed ScanReply");
    if (!page->done) { /* the next page (or the printed cursor) goes on after it */
        uint8_t *c = page->cursor.len ? malloc(page->cursor.len) : NULL;
        if (!c) {
            kv__scan_reply__free_unpacked(page, NULL);
            return kvctl_fail(page->cursor.len ? KV_RESOURCE_EXHAUSTED : KV_INTERNAL,
                              page->cursor.len ? "out of memory" : "a scan page without a cursor");
        }
        memcpy(c, page->cursor.data, page->cursor.len);
        free(*cursor);
        *cursor = c;
        *clen = page->cursor.len;
    }
    *out = page;
    return KVCTL_OK;
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
        uint32_t n = (uint32_t)(want - got < PAGE_MAX ? want - got : PAGE_MAX);
        Kv__ScanReply *page;
        code =
            kvctl_scan_page(env, ch, &(kvctl_scan_q){prefix, plen, start, slen, n, env->keys_only},
                            &cursor, &clen, &page);
        if (code != KVCTL_OK)
            break;
        for (size_t i = 0; i < page->n_items && got < want; i++)
            print_item(env, page->items[i], got++ == 0);
        done = page->done;
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
