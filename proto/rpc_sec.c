/* SPDX-License-Identifier: MIT */
/* Token and TLS flags shared by the binaries (rpc_sec.h). */
#include "proto/rpc_sec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"

#define TOKEN_FILE_MAX 4096
#define MAP_KEY_MIN 16 /* bytes: a shorter HMAC key is guessable */

const char *const rpc_sec_client_auth_choices[] = {"required", "optional", NULL};

/* The token in path: its bytes up to the first newline (a trailing \r too). */
static kv_err read_token(const char *flag, const char *path, char **out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "--%s %s: %s", flag, path, strerror(errno));
        return KV_INVALID_ARGUMENT;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 0077))
        KV_WARN("auth", "--%s %s is readable by other users (chmod 600 it)", flag, path);
    char buf[TOKEN_FILE_MAX + 1];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    if (n > TOKEN_FILE_MAX) {
        snprintf(err, errlen, "--%s %s: over %d bytes", flag, path, TOKEN_FILE_MAX);
        return KV_INVALID_ARGUMENT;
    }
    buf[n] = '\0';
    size_t len = strcspn(buf, "\n");
    if (len && buf[len - 1] == '\r')
        len--;
    if (len == 0 || memchr(buf, '\0', len)) {
        snprintf(err, errlen, "--%s %s: %s", flag, path,
                 len ? "the token holds a NUL byte" : "no token on its first line");
        return KV_INVALID_ARGUMENT;
    }
    *out = strndup(buf, len);
    memset(buf, 0, sizeof(buf));
    return *out ? KV_OK : KV_RESOURCE_EXHAUSTED;
}

/* One token: the flag's value, else the file's, else $env (NULL = none). */
static kv_err load_token(const char *flag, const char *val, const char *file, const char *env,
                         char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (val && file) {
        snprintf(err, errlen, "--%s and --%s-file: give one of them", flag, flag);
        return KV_INVALID_ARGUMENT;
    }
    if (file)
        return read_token(flag, file, out, err, errlen);
    if (!val)
        val = getenv(env);
    if (val && *val && !(*out = strdup(val)))
        return KV_RESOURCE_EXHAUSTED;
    return KV_OK;
}

kv_err rpc_sec_load(rpc_sec *s, char *err, size_t errlen)
{
    kv_err rv = load_token("auth", s->auth, s->auth_file, "KV_AUTH", &s->data_token, err, errlen);
    if (rv == KV_OK)
        rv = load_token("admin-auth", s->admin_auth, s->admin_auth_file, "KV_ADMIN_AUTH",
                        &s->admin_token, err, errlen);
    if (rv == KV_OK)
        rv = load_token("http-token", s->http_auth, s->http_auth_file, "KV_HTTP_TOKEN",
                        &s->http_token, err, errlen);
    if (rv == KV_OK && s->map_key_file)
        rv = read_token("map-key-file", s->map_key_file, &s->map_key, err, errlen);
    else if (rv == KV_OK && getenv("KV_MAP_KEY") && *getenv("KV_MAP_KEY") &&
             !(s->map_key = strdup(getenv("KV_MAP_KEY"))))
        rv = KV_RESOURCE_EXHAUSTED;
    if (rv == KV_OK && s->map_key && strlen(s->map_key) < MAP_KEY_MIN) {
        snprintf(err, errlen,
                 "the map key (--map-key-file or $KV_MAP_KEY) has %zu bytes; use at least %d "
                 "(e.g. head -c 32 /dev/urandom | base64 > FILE)",
                 strlen(s->map_key), MAP_KEY_MIN);
        rv = KV_INVALID_ARGUMENT;
    }
    s->tls = (rpc_tls){.cert = s->tls_cert && *s->tls_cert ? s->tls_cert : NULL,
                       .key = s->tls_key && *s->tls_key ? s->tls_key : NULL,
                       .ca = s->tls_ca && *s->tls_ca ? s->tls_ca : NULL,
                       .client_optional = s->tls_client_auth == 1};
    if (rv == KV_OK && !s->tls.cert != !s->tls.key) {
        snprintf(err, errlen, "--tls-cert and --tls-key go together");
        rv = KV_INVALID_ARGUMENT;
    }
    return rv;
}

void rpc_sec_warn(const rpc_sec *s, const char *prog, const char *listen, const char *http_listen)
{
    if (http_listen && *http_listen && !s->http_token)
        KV_WARN("auth",
                "%s: no --http-token: anyone who reaches %s may read its metrics, the "
                "dashboard and the hot keys' names",
                prog, http_listen);
    else if (http_listen && strncmp(http_listen, "http://", 7) == 0 && s->http_token)
        KV_WARN("auth", "%s: %s is plaintext: the HTTP token travels in the clear (use https://)",
                prog, http_listen);
    if (!s->data_token && !s->admin_token && !s->tls.ca)
        KV_WARN("auth",
                "%s: no --auth, --admin-auth or --tls-ca: anyone who reaches %s may "
                "read, write and administer the cluster (admin.SetMap included)",
                prog, listen);
    else if (s->data_token && !s->admin_token && !s->tls.ca)
        KV_WARN("auth",
                "%s: --auth without --admin-auth: the data token also grants admin "
                "rights (admin.*, versioned writes); give the cluster an --admin-auth",
                prog);
    if (!rpc_url_tls(listen) && (s->data_token || s->admin_token))
        KV_WARN("auth",
                "%s: %s is plaintext: tokens and data travel in the clear, and maps "
                "from peers are only checked for plausibility (use tls+tcp:// with --tls-ca)",
                prog, listen);
}

void rpc_sec_free(rpc_sec *s)
{
    if (s->data_token)
        memset(s->data_token, 0, strlen(s->data_token));
    if (s->admin_token)
        memset(s->admin_token, 0, strlen(s->admin_token));
    if (s->http_token)
        memset(s->http_token, 0, strlen(s->http_token));
    if (s->map_key)
        memset(s->map_key, 0, strlen(s->map_key));
    free(s->data_token);
    free(s->admin_token);
    free(s->http_token);
    free(s->map_key);
    s->data_token = s->admin_token = s->http_token = s->map_key = NULL;
}

const char *rpc_sec_token(const rpc_sec *s)
{
    return s->admin_token ? s->admin_token : s->data_token;
}

const rpc_tls *rpc_sec_tls(const rpc_sec *s)
{
    return s->tls.cert || s->tls.ca ? &s->tls : NULL;
}
