/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the libFuzzer harnesses of tests/fuzz: a reader that
 * carves typed fields out of the fuzzer's input (always succeeding: past the
 * end it yields zeros and empty spans, so every input is a valid program),
 * a per-process scratch directory that harnesses empty before each input,
 * file helpers, the property check that turns a broken invariant into a
 * crash libFuzzer records, and a UTF-8 validator (proto3 string fields must
 * hold valid UTF-8, issue 16 item 9).
 */
#ifndef KV_TESTS_FUZZ_UTIL_H
#define KV_TESTS_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A cursor over the input. */
typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

uint8_t fz_u8(fz_in *in);
uint16_t fz_u16(fz_in *in);
uint32_t fz_u32(fz_in *in);
uint64_t fz_u64(fz_in *in);
/* Takes up to want bytes (fewer at the end); returns where they start. */
const uint8_t *fz_take(fz_in *in, size_t want, size_t *got);
/* A length-prefixed chunk: u16 length, then that many bytes (or the rest). */
const uint8_t *fz_chunk(fz_in *in, size_t *len);

/* Silences the project's logging (corrupt inputs log on every run) unless
 * FUZZ_LOG is set. fuzz_util.c's weak LLVMFuzzerInitialize calls it; a
 * harness with its own LLVMFuzzerInitialize calls it there. */
void fz_quiet(void);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* The process's scratch directory (created on first use under $TMPDIR or
 * /tmp, removed at exit). */
const char *fz_workdir(void);
/* Writes dir/sub into buf and makes it an empty directory (removing what a
 * previous input left there). Returns buf, or aborts when it cannot. */
const char *fz_fresh_dir(char *buf, size_t cap, const char *sub);
/* rm -rf path (a missing path is fine). */
void fz_rmtree(const char *path);
/* Creates dir/name holding exactly n bytes of p; aborts on failure. */
void fz_write_file(const char *dir, const char *name, const void *p, size_t n);

/* A broken invariant: prints what and aborts (libFuzzer saves the input). */
#define FZ_CHECK(cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                       \
    } while (0)
void fz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));

/* True when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or code
 * points past U+10FFFF), as protobuf's strict parsers require. */
bool fz_utf8_ok(const char *s, size_t n);
/* The same for a NUL-terminated string; NULL counts as valid. */
bool fz_utf8_str_ok(const char *s);

/* True when the harness checks the strict invariants (valid UTF-8 in every
 * status message and reply string, issue 16 item 9, fixed): on unless
 * FUZZ_STRICT=0 (see tests/fuzz/README.md). */
bool fz_strict(void);

#endif
