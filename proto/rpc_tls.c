/* SPDX-License-Identifier: MIT */
/*
 * TLS for the RPC runtime: nng's tls+tcp transport (mbedTLS in Debian's
 * libnng). A listener presents its certificate; given a CA it requires a
 * client certificate that chains to it (mutual TLS), or verifies one when
 * presented (client_optional). A dialer always verifies the server's chain
 * against its CA (the CA is the trust boundary: nng 1.5 does not match the
 * host name, so any certificate of the cluster's CA is a cluster member),
 * and presents its own certificate when it has one.
 */
#include "proto/rpc_tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEM_MAX (1u << 20)

bool rpc_url_tls(const char *url)
{
    return url && strncmp(url, "tls+tcp://", 10) == 0;
}

bool rpc_token_eq(const void *got, size_t len, const char *want)
{
    const unsigned char *g = got;
    size_t wl = strlen(want);
    volatile unsigned char diff = (unsigned char)(len != wl);
    for (size_t i = 0; i < wl; i++)
        diff |= (unsigned char)((i < len ? g[i] : 0) ^ (unsigned char)want[i]);
    return diff == 0;
}

/* The whole file, NUL-terminated (PEM is text); NULL with err set. */
static char *read_pem(const char *what, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(PEM_MAX + 1);
    size_t n = buf ? fread(buf, 1, PEM_MAX + 1, f) : 0;
    bool bad = ferror(f) || n > PEM_MAX;
    fclose(f);
    if (!buf || bad || n == 0) {
        snprintf(err, errlen, "%s %s: %s", what, path,
                 !buf                 ? "out of memory"
                 : n == 0             ? "empty"
                 : bad && n > PEM_MAX ? "over 1 MiB"
                                      : "read error");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* Frees a buffer that held key material, wiping it first. */
static void free_secret(char *p)
{
    if (!p)
        return;
    volatile char *v = p;
    for (size_t i = 0; v[i]; i++)
        v[i] = 0;
    free(p);
}

int rpc_tls_config(const rpc_tls *t, bool server, nng_tls_config **out, char *err, size_t errlen)
{
    *out = NULL;
    if (server && (!t || !t->cert || !*t->cert || !t->key || !*t->key)) {
        snprintf(err, errlen, "a tls+tcp:// listener needs --tls-cert and --tls-key");
        return NNG_EINVAL;
    }
    if (!server && (!t || !t->ca || !*t->ca)) {
        snprintf(err, errlen,
                 "dialing tls+tcp:// needs --tls-ca (the CA the server's "
                 "certificate must chain to)");
        return NNG_EINVAL;
    }
    if ((t->cert && *t->cert) != (t->key && *t->key)) {
        snprintf(err, errlen, "--tls-cert and --tls-key go together");
        return NNG_EINVAL;
    }
    nng_tls_config *cfg;
    int rv = nng_tls_config_alloc(&cfg, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT);
    if (rv != 0) {
        snprintf(err, errlen, "TLS is not available: %s", nng_strerror(rv));
        return rv;
    }
    char *cert = NULL, *key = NULL, *ca = NULL;
    if (t->cert && *t->cert) {
        if (!(cert = read_pem("--tls-cert", t->cert, err, errlen)) ||
            !(key = read_pem("--tls-key", t->key, err, errlen)))
            rv = NNG_EINVAL;
        else if ((rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0)
            snprintf(err, errlen,
                     "--tls-cert %s / --tls-key %s: %s (not a PEM certificate and "
                     "its unencrypted key?)",
                     t->cert, t->key, nng_strerror(rv));
    }
    if (rv == 0 && t->ca && *t->ca) {
        if (!(ca = read_pem("--tls-ca", t->ca, err, errlen)))
            rv = NNG_EINVAL;
        else if ((rv = nng_tls_config_ca_chain(cfg, ca, NULL)) != 0)
            snprintf(err, errlen, "--tls-ca %s: %s (not a PEM certificate?)", t->ca,
                     nng_strerror(rv));
    }
    if (rv == 0) {
        nng_tls_auth_mode mode = NNG_TLS_AUTH_MODE_NONE;
        if (!server || (t->ca && *t->ca))
            mode = server && t->client_optional ? NNG_TLS_AUTH_MODE_OPTIONAL
                                                : NNG_TLS_AUTH_MODE_REQUIRED;
        if ((rv = nng_tls_config_auth_mode(cfg, mode)) != 0)
            snprintf(err, errlen, "TLS auth mode: %s", nng_strerror(rv));
    }
    free(cert);
    free_secret(key);
    free(ca);
    if (rv != 0) {
        nng_tls_config_free(cfg);
        return rv;
    }
    *out = cfg;
    return 0;
}
