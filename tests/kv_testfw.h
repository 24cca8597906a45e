/* SPDX-License-Identifier: MIT */
/*
 * Criterion shim for the tests that run under ThreadSanitizer (ctest label
 * "tsan"; .ci/run runs them in the TSan build). Normally this is just
 * Criterion. Under TSan Criterion cannot start (BoxFort's inheritable arena
 * probes random addresses that all fall inside TSan's shadow mappings:
 * "Could not initialize inheritable arena", Snaipe/Criterion#274), so a
 * test file that includes this header first gets its own main(): Test()
 * registers plain functions that run one after another in the main process
 * (suite .init before and .fini after each), and the cr_assert* macros abort
 * with the failing expression and message. Only the macros below exist in
 * that mode; a test using another fails to build under TSan.
 */
#ifndef KV_TESTS_KV_TESTFW_H
#define KV_TESTS_KV_TESTFW_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_THREAD__)
#define KV_TF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KV_TF_TSAN 1
#endif
#endif

#ifdef KV_TF_TSAN
typedef struct kv_tf_suite {
    void (*init)(void);
    void (*fini)(void);
    double timeout; /* accepted for Criterion's syntax; ctest's timeout applies */
} kv_tf_suite;
typedef struct kv_tf_case {
    const char *suite, *name;
    void (*fn)(void);
} kv_tf_case;
static kv_tf_case kv_tf_cases[256];
static int kv_tf_ncases;
static struct {
    const char *name;
    kv_tf_suite s;
} kv_tf_suites[8];
static int kv_tf_nsuites;

static inline void kv_tf_add(const char *suite, const char *name, void (*fn)(void))
{
    if (kv_tf_ncases < 256)
        kv_tf_cases[kv_tf_ncases++] = (kv_tf_case){suite, name, fn};
}

static inline void kv_tf_add_suite(const char *name, kv_tf_suite s)
{
    if (kv_tf_nsuites < 8) {
        kv_tf_suites[kv_tf_nsuites].name = name;
        kv_tf_suites[kv_tf_nsuites++].s = s;
    }
}

static inline kv_tf_suite kv_tf_find_suite(const char *name)
{
    for (int i = 0; i < kv_tf_nsuites; i++)
        if (strcmp(kv_tf_suites[i].name, name) == 0)
            return kv_tf_suites[i].s;
    return (kv_tf_suite){NULL, NULL, 0};
}

static inline void kv_tf_fail(const char *file, int line, const char *expr, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s:%d: assertion failed: %s\n  ", file, line, expr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

/* liburcu is not built with TSan: its call_rcu/rcu_barrier hand memory
 * between threads through its own queues and futexes, which TSan cannot see.
 * Only allocator calls made from inside liburcu are exempted; our callbacks
 * (free of retired items) stay checked, with HR_TSAN_RELEASE/ACQUIRE
 * annotations modelling the grace period. */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void)
{
    return "called_from_lib:liburcu-memb.so\n"
           "called_from_lib:liburcu-common.so\n"
           "called_from_lib:liburcu-cds.so\n";
}

int main(void)
{
    for (int i = 0; i < kv_tf_ncases; i++) {
        kv_tf_suite s = kv_tf_find_suite(kv_tf_cases[i].suite);
        fprintf(stderr, "[RUN ] %s::%s\n", kv_tf_cases[i].suite, kv_tf_cases[i].name);
        if (s.init)
            s.init();
        kv_tf_cases[i].fn();
        if (s.fini)
            s.fini();
        fprintf(stderr, "[PASS] %s::%s\n", kv_tf_cases[i].suite, kv_tf_cases[i].name);
    }
    fprintf(stderr, "Synthesis: Tested: %d | Passing: %d\n", kv_tf_ncases, kv_tf_ncases);
    return 0;
}

#undef Test
#undef TestSuite
#define TestSuite(suite, ...)                                                                      \
    __attribute__((constructor)) static void suite##_suite_reg(void)                               \
    {                                                                                              \
        kv_tf_add_suite(#suite, (kv_tf_suite){__VA_ARGS__});                                       \
    }                                                                                              \
    extern int kv_tf_suite_##suite##_declared
#define Test(suite, name, ...) /* extra Criterion options (.timeout) are ignored */                \
    static void suite##_##name(void);                                                              \
    __attribute__((constructor)) static void suite##_##name##_reg(void)                            \
    {                                                                                              \
        kv_tf_add(#suite, #name, suite##_##name);                                                  \
    }                                                                                              \
    static void suite##_##name(void)

#define KV_TF_CHECK(c, expr, ...)                                                                  \
    do {                                                                                           \
        if (!(c))                                                                                  \
            kv_tf_fail(__FILE__, __LINE__, expr, __VA_ARGS__);                                     \
    } while (0)
#undef cr_assert
#undef cr_assert_eq
#undef cr_assert_neq
#undef cr_assert_lt
#undef cr_assert_gt
#undef cr_assert_leq
#undef cr_assert_geq
#undef cr_assert_null
#undef cr_assert_not_null
#undef cr_assert_str_eq
#undef cr_assert_not
#undef cr_assert_float_eq
#undef cr_log_info
#undef cr_expect
#undef cr_expect_eq
#undef cr_expect_lt
#undef cr_expect_gt
#undef cr_expect_leq
#undef cr_expect_geq
#define cr_assert(c, ...) KV_TF_CHECK(c, #c, "" __VA_ARGS__)
#define cr_assert_eq(a, b, ...) KV_TF_CHECK((a) == (b), #a " == " #b, "" __VA_ARGS__)
#define cr_assert_neq(a, b, ...) KV_TF_CHECK((a) != (b), #a " != " #b, "" __VA_ARGS__)
#define cr_assert_lt(a, b, ...) KV_TF_CHECK((a) < (b), #a " < " #b, "" __VA_ARGS__)
#define cr_assert_gt(a, b, ...) KV_TF_CHECK((a) > (b), #a " > " #b, "" __VA_ARGS__)
#define cr_assert_leq(a, b, ...) KV_TF_CHECK((a) <= (b), #a " <= " #b, "" __VA_ARGS__)
#define cr_assert_geq(a, b, ...) KV_TF_CHECK((a) >= (b), #a " >= " #b, "" __VA_ARGS__)
#define cr_assert_null(a, ...) KV_TF_CHECK((a) == NULL, #a " == NULL", "" __VA_ARGS__)
#define cr_assert_not_null(a, ...) KV_TF_CHECK((a) != NULL, #a " != NULL", "" __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) KV_TF_CHECK(strcmp((a), (b)) == 0, #a " eq " #b, "" __VA_ARGS__)
#define cr_assert_not(c, ...) KV_TF_CHECK(!(c), "!(" #c ")", "" __VA_ARGS__)
#define cr_assert_float_eq(a, b, eps, ...)                                                         \
    KV_TF_CHECK(fabs((double)(a) - (double)(b)) <= (eps), #a " ~= " #b, "" __VA_ARGS__)
/* cr_expect* stop the test too here (Criterion carries on to the end). */
#define cr_expect(c, ...) cr_assert(c, __VA_ARGS__)
#define cr_expect_eq(a, b, ...) cr_assert_eq(a, b, __VA_ARGS__)
#define cr_expect_lt(a, b, ...) cr_assert_lt(a, b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...) cr_assert_gt(a, b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) cr_assert_leq(a, b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) cr_assert_geq(a, b, __VA_ARGS__)
#define cr_log_info(...) (fprintf(stderr, __VA_ARGS__), fprintf(stderr, "\n"))
#endif

#endif
