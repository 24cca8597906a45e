/* SPDX-License-Identifier: MIT */
/* Tests for common/: error strings, HLC ordering, option parsing, CRC32C. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/opts.h"
#include "kv/kv_err.h"

Test(err, names_and_numbers_match_grpc)
{
    cr_assert_eq(KV_NOT_FOUND, 5);
    cr_assert_eq(KV_UNAUTHENTICATED, 16);
    cr_assert_str_eq(kv_err_name(KV_FAILED_PRECONDITION), "FAILED_PRECONDITION");
    cr_assert_str_eq(kv_err_name((kv_err)99), "UNKNOWN_CODE");
    cr_assert_str_eq(kv_strerror(KV_OK), "success");
}

Test(hlc, strictly_increasing_and_observes_remote)
{
    kv_hlc c = {0};
    uint64_t prev = 0;
    for (int i = 0; i < 100000; i++) {
        uint64_t v = kv_hlc_now(&c);
        cr_assert_gt(v, prev);
        prev = v;
    }
    uint64_t future = prev + (1000ull << 16);
    kv_hlc_observe(&c, future);
    cr_assert_gt(kv_hlc_now(&c), future);
    cr_assert_lt(KV_HLC_MS(prev), KV_HLC_MS(future) + 1);
}

Test(opts, flags_override_ini_and_errors_name_the_flag)
{
    char *dir = "default";
    long port = 1;
    bool on = false;
    int mode = 0;
    static const char *const modes[] = {"always", "batch", "none", NULL};
    kv_opt table[] = {
        {"data-dir", KV_OPT_STR, &dir, "dir", NULL, 0, 0},
        {"port", KV_OPT_INT, &port, "port", NULL, 1, 65535},
        {"hotrap", KV_OPT_BOOL, &on, "on/off", NULL, 0, 0},
        {"sync", KV_OPT_ENUM, &mode, "mode", modes, 0, 0},
    };
    char path[] = "/tmp/kvoptsXXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "[node]\ndata_dir = /ini\nport = 7\nsync = batch\n");
    fclose(f);
    char *argv[] = {"prog", "--config", path, "--port=9", "get", "--hotrap", "on", "k", NULL};
    kv_optset set = {table, 4, NULL, "prog", NULL};
    char err[256];
    int npos = 0;
    cr_assert_eq(kv_opts_parse(&set, 8, argv, &npos, err, sizeof(err)), KV_OK, "%s", err);
    cr_assert_str_eq(dir, "/ini");
    cr_assert_eq(port, 9);
    cr_assert(on);
    cr_assert_eq(mode, 1);
    cr_assert_eq(npos, 2);
    cr_assert_str_eq(argv[1], "get");
    cr_assert_str_eq(argv[2], "k");
    kv_opts_free(&set);

    char *bad[] = {"prog", "--port", "70000", NULL};
    kv_optset set2 = {table, 4, NULL, "prog", NULL};
    cr_assert_eq(kv_opts_parse(&set2, 3, bad, NULL, err, sizeof(err)), KV_INVALID_ARGUMENT);
    cr_assert(strstr(err, "--port") != NULL, "%s", err);
    kv_opts_free(&set2);
    char *unk[] = {"prog", "--nope", NULL};
    kv_optset set3 = {table, 4, NULL, "prog", NULL};
    cr_assert_eq(kv_opts_parse(&set3, 2, unk, NULL, err, sizeof(err)), KV_INVALID_ARGUMENT);
    cr_assert(strstr(err, "--nope") != NULL, "%s", err);
    kv_opts_free(&set3);
    /* a flags-only program (npos NULL) refuses a stray word, naming it */
    char *stray[] = {"prog", "--port", "9", "foo", NULL};
    kv_optset set4 = {table, 4, NULL, "prog", NULL};
    cr_assert_eq(kv_opts_parse(&set4, 4, stray, NULL, err, sizeof(err)), KV_INVALID_ARGUMENT);
    cr_assert(strstr(err, "'foo'") != NULL, "%s", err);
    kv_opts_free(&set4);
    unlink(path);
}

/* Level names are read in any case (KV_LOG_LEVEL=DEBUG used to be ignored
 * without a word); unknown names are refused. */
Test(log, level_names_in_any_case)
{
    cr_assert_eq(kv_log_parse_level("debug"), KV_LOG_DEBUG);
    cr_assert_eq(kv_log_parse_level("DEBUG"), KV_LOG_DEBUG);
    cr_assert_eq(kv_log_parse_level("Warn"), KV_LOG_WARN);
    cr_assert_eq(kv_log_parse_level("error"), KV_LOG_ERROR);
    cr_assert_eq(kv_log_parse_level("loud"), -1);
    cr_assert_eq(kv_log_parse_level(""), -1);
    cr_assert_eq(kv_log_parse_level(NULL), -1);
}

/* An unknown KV_LOG_LEVEL is reported on stderr (once) and info is used.
 * Criterion runs each test in its own process, so the level is unread. */
Test(log, unknown_env_level_is_reported)
{
    cr_assert_eq(setenv("KV_LOG_LEVEL", "loud", 1), 0);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    int saved = dup(2);
    cr_assert_eq(dup2(p[1], 2), 2);
    bool debug = kv_log_enabled(KV_LOG_DEBUG), info = kv_log_enabled(KV_LOG_INFO);
    kv_log_enabled(KV_LOG_INFO); /* a second read reports nothing */
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(p[1]);
    char buf[512] = {0};
    ssize_t n = read(p[0], buf, sizeof(buf) - 1);
    close(p[0]);
    cr_assert(!debug && info, "info is the level used");
    cr_assert_gt(n, 0, "nothing on stderr");
    cr_assert_not_null(strstr(buf, "KV_LOG_LEVEL=loud"), "stderr: %s", buf);
    cr_assert_null(strstr(strstr(buf, "KV_LOG_LEVEL=loud") + 1, "KV_LOG_LEVEL"), "reported twice");
}

/* Known vectors (RFC 3720 B.4 among them); a running CRC continues one. */
Test(crc32c, known_vectors)
{
    cr_assert_eq(kv_crc32c(0, "123456789", 9), 0xE3069283u);
    uint8_t buf[32];
    memset(buf, 0, sizeof(buf));
    cr_assert_eq(kv_crc32c(0, buf, 32), 0x8A9136AAu);
    memset(buf, 0xff, sizeof(buf));
    cr_assert_eq(kv_crc32c(0, buf, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    cr_assert_eq(kv_crc32c(0, buf, 32), 0x46DD794Eu);
    /* incremental == one shot */
    uint32_t c = kv_crc32c(0, buf, 13);
    cr_assert_eq(kv_crc32c(c, buf + 13, 19), 0x46DD794Eu);
    cr_assert_eq(kv_crc32c(0, "", 0), 0u);
}
