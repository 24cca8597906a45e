/* SPDX-License-Identifier: MIT */
/*
 * Input bounds and output hygiene of the RPC layer (issue 16 items 4, 6, 9):
 *
 * - rpc_unpack: protobuf-c unpacking with an allocation budget. protobuf-c
 *   allocates per field it scans and per element of a repeated field, so a
 *   small message can cost much more memory than its size (a 20 MB
 *   kv.Batch of 10M empty ops took 1.3 GB); with a budget the unpack fails
 *   (INVALID_ARGUMENT for the caller) once it has allocated that much, and
 *   frees what it took.
 * - rpc_pb_count: counts a top-level field's occurrences in wire-format
 *   bytes without allocating, so a request with too many elements is refused
 *   before any unpacking.
 * - rpc_utf8_escape: status messages (a proto3 string) must be valid UTF-8;
 *   invalid bytes become \xNN.
 * - rpc_socket_close: nng_close with a bound (see the function).
 */
#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "proto/rpc.h"
#include "proto/rpc_int.h"

/* ---- budgeted unpack ------------------------------------------------------ */

/* What malloc costs beyond the bytes asked for (its chunk header). */
#define MALLOC_OVERHEAD 16u

static void *budget_malloc(void *data, size_t size)
{
    rpc_budget *b = data;
    size_t cost = size + MALLOC_OVERHEAD;
    if (cost < size || cost > b->left)
        return NULL;
    b->left -= cost;
    return malloc(size ? size : 1);
}

static void budget_free(void *data, void *p)
{
    (void)data;
    free(p);
}

ProtobufCAllocator *rpc_budget_init(rpc_budget *b, size_t budget)
{
    *b = (rpc_budget){{budget_malloc, budget_free, b}, budget};
    return &b->a;
}

size_t rpc_unpack_budget(size_t len, size_t max_elems)
{
    /* bytes fields are copied (len), scanning takes a slab entry per field
     * and elements have their structs: what a message within the limits
     * needs, with room; nothing near what 10M empty elements would take */
    size_t per_elem = 512;
    size_t b = 4 * len + (1u << 20);
    if (b < len || max_elems > (SIZE_MAX - b) / per_elem)
        return SIZE_MAX;
    return b + max_elems * per_elem;
}

ProtobufCMessage *rpc_unpack(const ProtobufCMessageDescriptor *d, size_t len, const uint8_t *data,
                             size_t budget)
{
    rpc_budget b;
    /* the message is freed later with the default allocator (free()): the
     * same free as budget_free */
    return protobuf_c_message_unpack(d, rpc_budget_init(&b, budget), len, data);
}

/* ---- wire-format scan ----------------------------------------------------- */

static bool varint(const uint8_t *p, size_t len, size_t *i, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        if (*i >= len)
            return false;
        uint8_t b = p[(*i)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

bool rpc_pb_count(const uint8_t *p, size_t len, uint32_t field, size_t *count)
{
    size_t i = 0, n = 0;
    while (i < len) {
        uint64_t key, v;
        if (!varint(p, len, &i, &key) || (key >> 3) == 0 || (key >> 3) > 0x1fffffff)
            return false;
        switch (key & 7) {
        case 0: /* varint */
            if (!varint(p, len, &i, &v))
                return false;
            break;
        case 1: /* 64-bit */
            if (len - i < 8)
                return false;
            i += 8;
            break;
        case 2: /* length-delimited */
            if (!varint(p, len, &i, &v) || v > len - i)
                return false;
            i += (size_t)v;
            break;
        case 5: /* 32-bit */
            if (len - i < 4)
                return false;
            i += 4;
            break;
        default: /* groups: protobuf-c refuses them too */
            return false;
        }
        n += (key >> 3) == field;
    }
    *count = n;
    return true;
}

/* ---- UTF-8 ---------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid
 * (overlong forms, surrogates and code points past U+10FFFF included). */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    if (c < 0x80)
        return 1;
    size_t k = c >= 0xc2 && c <= 0xdf   ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
    if (!k || k > n)
        return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if (c == 0xe0 && s[1] < 0xa0) /* overlong */
        return 0;
    if (c == 0xed && s[1] > 0x9f) /* surrogates */
        return 0;
    if (c == 0xf0 && s[1] < 0x90) /* overlong */
        return 0;
    if (c == 0xf4 && s[1] > 0x8f) /* past U+10FFFF */
        return 0;
    return k;
}

bool rpc_utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(p + i, n - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

size_t rpc_utf8_escape(const char *in, char *out, size_t outlen)
{
    if (!outlen)
        return 0;
    const unsigned char *p = (const unsigned char *)in;
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(p + i, n - i);
        if (k) { /* whole characters only */
            if (o + k >= outlen)
                break;
            memcpy(out + o, p + i, k);
            o += k;
            i += k;
        } else {
            if (o + 4 >= outlen)
                break;
            snprintf(out + o, 5, "\\x%02x", p[i]);
            o += 4;
            i++;
        }
    }
    out[o] = '\0';
    return o;
}

void rpc_utf8_fix(char *s, size_t size)
{
    if (!size || rpc_utf8_valid(s))
        return;
    char *tmp = malloc(size);
    if (!tmp) { /* no memory: drop what is not ASCII */
        for (char *c = s; *c; c++)
            if ((unsigned char)*c >= 0x80)
                *c = '?';
        return;
    }
    rpc_utf8_escape(s, tmp, size);
    memcpy(s, tmp, strlen(tmp) + 1);
    free(tmp);
}

char *rpc_utf8_dup(const char *s)
{
    if (rpc_utf8_valid(s))
        return strdup(s);
    size_t cap = 4 * strlen(s) + 1;
    char *out = malloc(cap);
    if (out)
        rpc_utf8_escape(s, out, cap);
    return out;
}

/* ---- bounded close -------------------------------------------------------- */

typedef struct close_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    nng_socket sock;
    bool done, abandoned;
} close_job;

static void close_job_free(close_job *j)
{
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

static void *close_main(void *arg)
{
    close_job *j = arg;
    nng_close(j->sock);
    pthread_mutex_lock(&j->mu);
    j->done = true;
    bool abandoned = j->abandoned;
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (abandoned)
        close_job_free(j);
    return NULL;
}

/* nng_close waits until nng's single reaper thread has torn down every pipe
 * of the socket. In nng 1.5 the reaper can block forever: when a pipe is
 * closed while the TCP transport has just read a message header and its
 * callback is about to read the body, that read is submitted on an aio the
 * close already stopped, which nng drops without completing, and the pipe's
 * teardown then waits for it (nni_aio_stop -> nni_task_wait in
 * pipe_destroy). A peer that goes away with requests in flight under load
 * triggers it; kvnode and kvrouter then never exited on SIGTERM (issue 16
 * item 6). Nothing outside nng can complete that aio, so the close runs on
 * a thread of its own and is abandoned after wait_ms: the process goes on
 * (and exits), leaking the socket. */
/* Set once a close was abandoned: the reaper is stuck for good, so later
 * closes (a process closing its sockets one after another on its way out)
 * do not each wait the whole bound. */
static atomic_bool reaper_stuck;

bool rpc_socket_close(nng_socket sock, uint32_t wait_ms, const char *what)
{
    if (atomic_load(&reaper_stuck) && wait_ms > 100)
        wait_ms = 100;
    close_job *j = calloc(1, sizeof(*j));
    pthread_t t;
    if (!j) {
        nng_close(sock);
        return true;
    }
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->sock = sock;
    if (pthread_create(&t, NULL, close_main, j) != 0) {
        close_job_free(j);
        nng_close(sock);
        return true;
    }
    pthread_detach(t);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)wait_ms * 1000000ull;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&j->mu);
    while (!j->done)
        if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) != 0)
            break;
    bool done = j->done;
    j->abandoned = !done;
    pthread_mutex_unlock(&j->mu);
    if (done) {
        close_job_free(j);
        return true;
    }
    atomic_store(&reaper_stuck, true);
    KV_WARN("rpc",
            "closing the %s socket did not finish within %u ms (nng's pipe reaper is stuck: "
            "a known nng 1.5 defect); going on without it",
            what, wait_ms);
    return false;
}

typedef struct kept {
    void *p;
    struct kept *next;
} kept;

static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static kept *kept_head; /* the roots of what was abandoned (rpc_keep_abandoned) */

void rpc_keep_abandoned(void *p)
{
    kept *k = malloc(sizeof(*k));
    if (!k)
        return;
    pthread_mutex_lock(&kept_mu);
    *k = (kept){.p = p, .next = kept_head};
    kept_head = k;
    pthread_mutex_unlock(&kept_mu);
}
