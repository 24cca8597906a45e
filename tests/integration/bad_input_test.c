/* SPDX-License-Identifier: MIT */
/*
 * Bad input against a live cluster: every limit is enforced by the client,
 * the router and the node with INVALID_ARGUMENT and a message naming it;
 * garbage and truncated protobuf, unknown methods and wrong tokens get their
 * status; and after each, the next valid request succeeds.
 */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kv/kv.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"

static kvt_cluster cl;

/* Sends a Put through a raw channel (no client-side checks). */
static kv_err raw_put(const char *url, const char *auth, size_t klen, size_t vlen, char *msg,
                      size_t msglen)
{
    rpc_chan *ch;
    rpc_chan_opts o = {.auth = auth};
    cr_assert_eq(rpc_chan_open(&ch, url, &o), KV_OK);
    uint8_t *k = calloc(1, klen + 1), *v = calloc(1, vlen + 1);
    memset(k, 'k', klen);
    Kv__PutRequest req = KV__PUT_REQUEST__INIT;
    req.key = (ProtobufCBinaryData){klen, k};
    req.value = (ProtobufCBinaryData){vlen, v};
    rpc_reply r;
    kv_err rv = rpc_call(ch, "kv.Put", 0, &req.base, 10000, &r);
    snprintf(msg, msglen, "%s", r.message ? r.message : "");
    rpc_reply_free(&r);
    rpc_chan_close(ch);
    free(k);
    free(v);
    return rv;
}

static void assert_still_serves(const char *url)
{
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, url, NULL), KV_OK);
    /* against a node directly, a key it does not own is refused: try a few */
    kv_err rv = KV_UNKNOWN;
    for (int i = 0; i < 50 && rv != KV_OK; i++) {
        char key[16];
        snprintf(key, sizeof(key), "ok%d", i);
        rv = kv_put(c, key, strlen(key), "v", 1, NULL, NULL);
    }
    cr_assert_eq(rv, KV_OK, "valid request after bad input: %s", kv_last_error());
    kv_client_close(c);
}

Test(bad_input, limits_in_client_router_and_node, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 1, NULL), KV_OK, "logs in %s", cl.dir);
    kv_client *c;
    cr_assert_eq(kv_client_open(&c, cl.router_url, NULL), KV_OK);
    char big_key[4097];
    memset(big_key, 'a', sizeof(big_key));
    cr_assert_eq(kv_put(c, "", 0, "v", 1, NULL, NULL), KV_INVALID_ARGUMENT);
    cr_assert(strstr(kv_last_error(), "empty"), "%s", kv_last_error());
    cr_assert_eq(kv_put(c, big_key, 4097, "v", 1, NULL, NULL), KV_INVALID_ARGUMENT);
    cr_assert(strstr(kv_last_error(), "max-key-bytes"), "%s", kv_last_error());
    size_t over = (16u << 20) + 1;
    char *big = calloc(1, over);
    cr_assert_eq(kv_put(c, "k", 1, big, over, NULL, NULL), KV_INVALID_ARGUMENT);
    cr_assert(strstr(kv_last_error(), "max-value-bytes"), "%s", kv_last_error());
    kv_op *ops = calloc(10001, sizeof(*ops));
    for (int i = 0; i < 10001; i++)
        ops[i] = (kv_op){.type = KV_OP_GET, .key = "k", .klen = 1};
    cr_assert_eq(kv_batch(c, ops, 10001, KV_CONSISTENCY_DEFAULT), KV_INVALID_ARGUMENT);
    cr_assert(strstr(kv_last_error(), "max-batch-ops"), "%s", kv_last_error());
    free(ops);
    kv_client_close(c);

    /* The same limits at the router and at a node, bypassing the client. */
    const char *targets[] = {cl.router_url, cl.node_url[0]};
    for (int t = 0; t < 2; t++) {
        char msg[300];
        cr_assert_eq(raw_put(targets[t], NULL, 0, 1, msg, sizeof(msg)), KV_INVALID_ARGUMENT);
        cr_assert(strstr(msg, "empty"), "%s", msg);
        cr_assert_eq(raw_put(targets[t], NULL, 4097, 1, msg, sizeof(msg)), KV_INVALID_ARGUMENT);
        cr_assert(strstr(msg, "max-key-bytes"), "%s", msg);
        cr_assert_eq(raw_put(targets[t], NULL, 1, over, msg, sizeof(msg)), KV_INVALID_ARGUMENT);
        cr_assert(strstr(msg, "max-value-bytes"), "%s", msg);
        assert_still_serves(targets[t]);
    }
    free(big);
    kvt_cluster_stop(&cl);
}

static int raw_exchange(const char *url, const void *buf, size_t len, int *code)
{
    nng_socket s;
    nng_req0_open(&s);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 3000);
    if (nng_dial(s, url, NULL, 0) != 0 || nng_send(s, (void *)buf, len, 0) != 0) {
        nng_close(s);
        return -1;
    }
    char *rep = NULL;
    size_t rlen = 0;
    int rv = nng_recv(s, &rep, &rlen, NNG_FLAG_ALLOC);
    if (rv == 0) {
        Kv__Envelope *env = kv__envelope__unpack(NULL, rlen, (uint8_t *)rep);
        *code = env && env->status ? env->status->code : -1;
        if (env)
            kv__envelope__free_unpacked(env, NULL);
        nng_free(rep, rlen);
    }
    nng_close(s);
    return rv;
}

Test(bad_input, garbage_truncated_unknown_method, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 1, NULL), KV_OK, "logs in %s", cl.dir);
    /* A valid envelope, then truncated at every length. */
    Kv__PutRequest put = KV__PUT_REQUEST__INIT;
    put.key = (ProtobufCBinaryData){3, (uint8_t *)"key"};
    put.value = (ProtobufCBinaryData){5, (uint8_t *)"value"};
    uint8_t body[64];
    size_t blen = kv__put_request__pack(&put, body);
    const char *targets[] = {cl.router_url, cl.node_url[1]};
    for (int t = 0; t < 2; t++) {
        Kv__Envelope env = KV__ENVELOPE__INIT;
        env.id = 1;
        env.method = "kv.Put";
        env.body = (ProtobufCBinaryData){blen - 3, body}; /* truncated body */
        uint8_t pk[256];
        size_t n = kv__envelope__pack(&env, pk);
        int code = -1;
        cr_assert_eq(raw_exchange(targets[t], pk, n, &code), 0);
        cr_assert_eq(code, KV_INVALID_ARGUMENT, "truncated body -> %d", code);
        for (size_t cut = 1; cut < n; cut += 3) { /* truncated envelopes */
            code = -1;
            cr_assert_eq(raw_exchange(targets[t], pk, cut, &code), 0, "cut %zu", cut);
            cr_assert(code == KV_INVALID_ARGUMENT || code == KV_UNIMPLEMENTED || code == KV_OK ||
                          code == KV_FAILED_PRECONDITION,
                      "cut %zu -> %d", cut, code);
        }
        const char garbage[] = "\xff\x13\x37garbage\x00\x01\xfe";
        cr_assert_eq(raw_exchange(targets[t], garbage, sizeof(garbage), &code), 0);
        cr_assert_eq(code, KV_INVALID_ARGUMENT);
        env.method = "kv.Frobnicate";
        env.body = (ProtobufCBinaryData){blen, body};
        n = kv__envelope__pack(&env, pk);
        cr_assert_eq(raw_exchange(targets[t], pk, n, &code), 0);
        cr_assert_eq(code, KV_UNIMPLEMENTED);
        assert_still_serves(targets[t]);
    }
    kvt_cluster_stop(&cl);
}

Test(bad_input, wrong_auth_token, .timeout = 120)
{
    cr_assert_eq(kvt_cluster_start(&cl, 3, 3, "s3cret"), KV_OK, "logs in %s", cl.dir);
    char msg[200];
    cr_assert_eq(raw_put(cl.router_url, "wrong", 1, 1, msg, sizeof(msg)), KV_UNAUTHENTICATED);
    cr_assert_eq(raw_put(cl.node_url[0], NULL, 1, 1, msg, sizeof(msg)), KV_UNAUTHENTICATED);
    kv_client *c;
    kv_client_opts o = {.auth = "s3cret"};
    cr_assert_eq(kv_client_open(&c, cl.router_url, &o), KV_OK);
    cr_assert_eq(kv_put(c, "a", 1, "1", 1, NULL, NULL), KV_OK, "%s", kv_last_error());
    kv_value v;
    cr_assert_eq(kv_get(c, "a", 1, &v), KV_OK);
    kv_value_free(&v);
    kv_client_close(c);
    kvt_cluster_stop(&cl);
}
