/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness for the INI/flag parser (common/opts.c). The input is
 * [u8 mode][u16 ini length][ini text][argv words separated by NUL]: mode bit
 * 0 lets non-flag words through as positionals (kvctl), bit 1 writes the INI
 * text to a file and adds `--config FILE` (bit 2: as `--config=FILE`, at the
 * end). The option table has every option type, bounded and unbounded
 * integers, an enum and one-letter aliases, like kvnode's. An accepted parse must leave integers
 * inside their bounds, enum indices inside their choices and positionals in
 * order; every message must name something; kv_opts_free must release every
 * string (LeakSanitizer). The targets are reset to their defaults before
 * each input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "fuzz_util.h"

#define MAX_ARGS 48

static const char *const modes[] = {"always", "batch", "none", NULL};

static struct {
    char *id, *listen, *auth;
    long workers, port, any;
    double rate;
    bool flag, other;
    int mode;
} v;

static const kv_opt table[] = {
    {"id", KV_OPT_STR, &v.id, "node id", NULL, 0, 0, 'i'},
    {"listen", KV_OPT_STR, &v.listen, "address", NULL, 0, 0, 'l'},
    {"auth", KV_OPT_STR, &v.auth, "token", NULL, 0, 0},
    {"workers", KV_OPT_INT, &v.workers, "threads", NULL, 1, 1024, 'w'},
    {"port", KV_OPT_INT, &v.port, "port", NULL, 1, 65535},
    {"any-int", KV_OPT_INT, &v.any, "unbounded", NULL, 0, 0},
    {"rate", KV_OPT_DOUBLE, &v.rate, "rate", NULL, 0, 0},
    {"flag", KV_OPT_BOOL, &v.flag, "a switch", NULL, 0, 0, 'f'},
    {"other-flag", KV_OPT_BOOL, &v.other, "another", NULL, 0, 0},
    {"sync", KV_OPT_ENUM, &v.mode, "mode", modes, 0, 0},
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fz_quiet();
    /* --help prints the usage to stdout: keep libFuzzer's output readable */
    if (!freopen("/dev/null", "w", stdout))
        perror("freopen");
    return 0;
}

/* Splits in's rest into NUL-separated words after argv[0] and the --config
 * words; returns argc. Words point into buf (NUL-terminated copy). */
static int split_args(fz_in *in, char *buf, char **argv, const char *ini, bool eq_form)
{
    static char cfg[600];
    int argc = 0;
    argv[argc++] = "fuzz";
    if (ini && !eq_form) {
        argv[argc++] = "--config";
        argv[argc++] = (char *)ini;
    }
    memcpy(buf, in->p, in->n);
    buf[in->n] = '\0';
    for (size_t at = 0; at <= in->n && argc < MAX_ARGS - 1; at += strlen(buf + at) + 1)
        argv[argc++] = buf + at;
    if (ini && eq_form) {
        snprintf(cfg, sizeof(cfg), "--config=%s", ini);
        argv[argc++] = cfg;
    }
    argv[argc] = NULL;
    return argc;
}

static void check_parsed(int npos, char **argv, int argc, bool positionals, bool dashdash)
{
    FZ_CHECK(v.workers >= 1 && v.workers <= 1024, "--workers %ld out of bounds", v.workers);
    FZ_CHECK(v.port >= 1 && v.port <= 65535, "--port %ld out of bounds", v.port);
    FZ_CHECK(v.mode >= 0 && v.mode < 3, "--sync index %d", v.mode);
    if (!positionals)
        return;
    FZ_CHECK(npos >= 0 && npos < argc, "%d positionals of %d words", npos, argc);
    for (int i = 1; i <= npos && !dashdash; i++) /* after "--" words may look like flags */
        FZ_CHECK(strncmp(argv[i], "--", 2) != 0 || argv[i][2] == '\0', "flag %s as positional",
                 argv[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    v = (typeof(v)){.listen = "tcp://127.0.0.1:7001", .workers = 8, .port = 7001, .rate = 1.5};
    fz_in in = {data, size};
    uint8_t mode = fz_u8(&in);
    size_t ilen;
    const uint8_t *ini = fz_chunk(&in, &ilen);
    char dir[512], path[600];
    if (mode & 2) {
        fz_fresh_dir(dir, sizeof(dir), "opts");
        fz_write_file(dir, "node.ini", ini, ilen);
        snprintf(path, sizeof(path), "%s/node.ini", dir);
    }
    char *buf = malloc(in.n + 1), *argv[MAX_ARGS + 1];
    FZ_CHECK(buf, "out of memory");
    int argc = split_args(&in, buf, argv, mode & 2 ? path : NULL, mode & 4);
    kv_optset set = {.opts = table, .n = sizeof(table) / sizeof(table[0]), .prog = "fuzz"};
    char err[512] = "";
    int npos = -1;
    bool positionals = mode & 1;
    bool dashdash = false;
    for (int i = 1; i < argc; i++)
        dashdash |= strcmp(argv[i], "--") == 0;
    kv_err rv = kv_opts_parse(&set, argc, argv, positionals ? &npos : NULL, err, sizeof(err));
    if (rv == KV_OK)
        check_parsed(npos, argv, argc, positionals, dashdash);
    else
        FZ_CHECK(rv == KV_CANCELLED || err[0], "error %d without a message", (int)rv);
    kv_opts_free(&set);
    free(buf);
    return 0;
}
