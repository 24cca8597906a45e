/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for the stream wire format (proto/rpc_conn.c) as a
 * server reads it on hotkv's own loops (rpc_loop.c): a real rpc_server on an
 * ephemeral loopback port takes the input's bytes on a fresh TCP connection,
 * its reading side parses them (handshake, u64 lengths, request id words,
 * messages larger than the read buffer) and its calls answer with small
 * stubs. Input byte 0 bit 0 set: a valid REQ handshake goes first; bit 1
 * set: the bytes are written in pieces whose sizes come from the next byte,
 * so frames straddle reads.
 *
 * The harness parses the same bytes itself (the contract of rpc_conn.h, not
 * its code) and knows which complete request messages they hold and whether
 * they end in an error (a wrong handshake, a length over the bound, a
 * header with no request id within 8 words). Then:
 *  - the server's handshake comes first and names REP;
 *  - every reply echoes the header of a request that was sent, at most once
 *    per such request, and its body is an Envelope with a known status;
 *  - bytes that end in an error make the server close the connection;
 *  - otherwise every complete request is answered and the connection stays
 *    open;
 *  - all of it within 5 s (a wedged connection is a finding).
 * The server lives for the process; the loopback listener is the only
 * socket the harness opens, on 127.0.0.1 and an ephemeral port.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "fuzz_util.h"
#include "proto/kv.pb-c.h"
#include "proto/rpc.h"
#include "proto/rpc_conn.h"

#define RECV_MAX (256u * 1024u) /* past the 64 KiB read buffer: both paths */
#define MAX_REQS 1024
#define WAIT_NS (5ull * 1000000000ull)

static rpc_server *srv;
static int port;

/* kv.Get: found when the body is not empty (the wire format is what is
 * fuzzed here; fuzz_envelope and fuzz_node take the bodies apart). */
static kv_err stub_get(rpc_ctx *c, const uint8_t *body, size_t len)
{
    (void)body;
    Kv__GetReply rep = KV__GET_REPLY__INIT;
    rep.found = len > 0;
    return rpc_reply_msg(c, &rep.base);
}

static const rpc_method methods[] = {{"kv.Get", stub_get}};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_quiet();
    rpc_runtime_init(0);
    rpc_server_opts o = {.url = "tcp://127.0.0.1:0",
                         .methods = methods,
                         .nmethods = sizeof(methods) / sizeof(methods[0]),
                         .workers = 2,
                         .recv_max = RECV_MAX};
    char err[256];
    FZ_CHECK(rpc_server_open(&srv, &o, err, sizeof(err)) == KV_OK, "rpc_server_open: %s", err);
    port = rpc_server_port(srv);
    FZ_CHECK(port > 0, "the server's port");
    return 0;
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

typedef struct sent {
    const uint8_t *hdr; /* into the input */
    size_t hlen;
    bool answered;
} sent;

/* What the server must make of bytes p[0..n): the complete requests (their
 * headers in out, *nout of them) and whether the bytes end in an error. */
static bool expect(const uint8_t *p, size_t n, sent *out, size_t *nout)
{
    *nout = 0;
    if (n < 8)
        return false; /* the handshake is not all here: it waits */
    const uint8_t hs[8] = {0, 'S', 'P', 0, 0, RPC_SP_REQ, 0, 0};
    if (memcmp(p, hs, 8) != 0)
        return true;
    size_t off = 8;
    while (n - off >= 8) {
        uint64_t len = be64(p + off);
        if (len > RECV_MAX)
            return true;
        size_t avail = n - off - 8, hlen = 0;
        for (size_t w = 0; w < RPC_SP_MAX_HOPS && !hlen; w++) {
            size_t end = 4 * (w + 1);
            if (end > len)
                return true; /* the message ends before its request id */
            if (end > avail)
                return false; /* waits for the rest of the header */
            if (p[off + 8 + 4 * w] & 0x80)
                hlen = end;
        }
        if (!hlen)
            return true; /* no request id within the hop limit */
        if (len > avail)
            return false; /* waits for the rest of the message */
        if (*nout < MAX_REQS)
            out[(*nout)++] = (sent){p + off + 8, hlen, false};
        off += 8 + (size_t)len;
    }
    return false;
}

/* Writes p[0..n) to fd, in pieces of `piece` bytes (0: at once). False when
 * the server closed first (allowed: it may refuse early). */
static bool write_all(int fd, const uint8_t *p, size_t n, size_t piece)
{
    while (n) {
        size_t k = piece && piece < n ? piece : n;
        ssize_t w = send(fd, p, k, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Matches one reply (header and body) against the requests sent. */
static void check_reply(sent *reqs, size_t nreq, const uint8_t *m, size_t len)
{
    size_t hlen = 0;
    for (size_t w = 0; w < RPC_SP_MAX_HOPS && !hlen && 4 * (w + 1) <= len; w++)
        if (m[4 * w] & 0x80)
            hlen = 4 * (w + 1);
    FZ_CHECK(hlen, "a %zu-byte reply without a request id", len);
    size_t i = 0;
    while (i < nreq && (reqs[i].answered || reqs[i].hlen != hlen || memcmp(reqs[i].hdr, m, hlen)))
        i++;
    FZ_CHECK(i < nreq, "a reply whose header (%zu bytes) matches no unanswered request", hlen);
    reqs[i].answered = true;
    Kv__Envelope *env = kv__envelope__unpack(NULL, len - hlen, m + hlen);
    FZ_CHECK(env, "a reply body that is no Envelope");
    int code = env->status ? env->status->code : 0;
    FZ_CHECK(code >= 0 && code < KV_ERR_COUNT_, "reply status %d", code);
    kv__envelope__free_unpacked(env, NULL);
}

/* connect(2) on a blocking socket, finished when a signal interrupts it
 * (libFuzzer's timers do): the connection goes on in the background, so
 * wait for it and take its outcome from SO_ERROR. 0 or -1 with errno. */
static int dial(int fd, const struct sockaddr_in *a)
{
    if (connect(fd, (const struct sockaddr *)a, sizeof(*a)) == 0)
        return 0;
    if (errno != EINTR)
        return -1;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int rv;
    while ((rv = poll(&p, 1, 5000)) < 0 && errno == EINTR)
        ;
    if (rv <= 0) {
        errno = rv == 0 ? ETIMEDOUT : errno;
        return -1;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return -1;
    errno = err;
    return err ? -1 : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t flags = fz_u8(&in);
    size_t piece = flags & 2 ? 1 + fz_u8(&in) : 0;
    uint8_t *bytes = malloc(8 + in.n);
    FZ_CHECK(bytes, "out of memory");
    size_t n = 0;
    if (flags & 1) {
        const uint8_t hs[8] = {0, 'S', 'P', 0, 0, RPC_SP_REQ, 0, 0};
        memcpy(bytes, hs, 8);
        n = 8;
    }
    memcpy(bytes + n, in.p, in.n);
    n += in.n;
    static sent reqs[MAX_REQS];
    size_t nreq = 0;
    bool fatal = expect(bytes, n, reqs, &nreq);

    int fd = socket(AF_INET, SOCK_STREAM, 0);
    FZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    FZ_CHECK(dial(fd, &a) == 0, "connect: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    bool wrote = write_all(fd, bytes, n, piece);
    FZ_CHECK(wrote || fatal, "the server closed a connection whose bytes are valid");

    /* read the handshake and the replies until what must happen has */
    size_t cap = 64 * 1024, have = 0, off = 0, answered = 0;
    uint8_t *buf = malloc(cap);
    FZ_CHECK(buf, "out of memory");
    bool shaken = false, eof = false;
    uint64_t until = kv_now_ns() + WAIT_NS;
    while (!eof && !(!fatal && answered == nreq)) {
        for (;;) { /* every complete message in the buffer */
            if (!shaken && have - off >= 8) {
                const uint8_t hs[8] = {0, 'S', 'P', 0, 0, RPC_SP_REP, 0, 0};
                FZ_CHECK(memcmp(buf + off, hs, 8) == 0, "the server's handshake");
                shaken = true;
                off += 8;
                continue;
            }
            if (!shaken || have - off < 8)
                break;
            uint64_t len = be64(buf + off);
            FZ_CHECK(len <= 16u * 1024 * 1024, "a reply of %llu bytes", (unsigned long long)len);
            if (have - off - 8 < len)
                break;
            check_reply(reqs, nreq, buf + off + 8, (size_t)len);
            answered++;
            off += 8 + (size_t)len;
        }
        if (!fatal && answered == nreq)
            break;
        if (off == have)
            off = have = 0;
        if (cap - have < 64 * 1024) {
            cap *= 2;
            buf = realloc(buf, cap);
            FZ_CHECK(buf, "out of memory");
        }
        uint64_t now = kv_now_ns();
        FZ_CHECK(now < until, "%s after 5 s: %zu of %zu requests answered",
                 fatal ? "the server kept a connection whose bytes end in an error open"
                       : "the server did not answer",
                 answered, nreq);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, (int)((until - now) / 1000000) + 1);
        if (pr <= 0)
            continue;
        ssize_t r = recv(fd, buf + have, cap - have, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) /* the server ended it (a reset counts) */
            eof = true;
        else
            have += (size_t)r;
    }
    FZ_CHECK(fatal || !eof, "the server closed a connection whose bytes are valid (%zu of %zu)",
             answered, nreq);
    close(fd);
    free(buf);
    free(bytes);
    return 0;
}
