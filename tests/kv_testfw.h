/* SPDX-License-Identifier: MIT */
/*
 * Criterion shim for the HotRing tests. Normally this is just Criterion.
 * Under ThreadSanitizer Criterion cannot start (its inheritable arena
 * collides with TSan's address-space layout, Snaipe/Criterion#274), so the
 * tests provide their own main(): Test() registers plain functions that run
 * one after another in the main process, each with the calling thread
 * registered with liburcu, and the cr_assert* macros used here abort with the
 * failing expression and message.
 */
#ifndef KV_TESTS_HR_TESTFW_H
#define KV_TESTS_HR_TESTFW_H

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_THREAD__)
#define HR_TF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HR_TF_TSAN 1
#endif
#endif

#ifdef HR_TF_TSAN
typedef struct hr_tf_suite {
    void (*init)(void);
    void (*fini)(void);
} hr_tf_suite;
typedef struct hr_tf_case {
    const char *suite, *name;
    void (*fn)(void);
} hr_tf_case;
static hr_tf_case hr_tf_cases[64];
static int hr_tf_ncases;
static struct {
    const char *name;
    hr_tf_suite s;
} hr_tf_suites[8];
static int hr_tf_nsuites;

static inline void hr_tf_add(const char *suite, const char *name, void (*fn)(void))
{
    if (hr_tf_ncases < 64)
        hr_tf_cases[hr_tf_ncases++] = (hr_tf_case){suite, name, fn};
}

static inline void hr_tf_add_suite(const char *name, hr_tf_suite s)
{
    if (hr_tf_nsuites < 8) {
        hr_tf_suites[hr_tf_nsuites].name = name;
        hr_tf_suites[hr_tf_nsuites++].s = s;
    }
}

static inline hr_tf_suite hr_tf_find_suite(const char *name)
{
    for (int i = 0; i < hr_tf_nsuites; i++)
        if (strcmp(hr_tf_suites[i].name, name) == 0)
            return hr_tf_suites[i].s;
    return (hr_tf_suite){NULL, NULL};
}

static inline void hr_tf_fail(const char *file, int line, const char *expr, const char *fmt, ...)
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
    for (int i = 0; i < hr_tf_ncases; i++) {
        hr_tf_suite s = hr_tf_find_suite(hr_tf_cases[i].suite);
        fprintf(stderr, "[RUN ] %s::%s\n", hr_tf_cases[i].suite, hr_tf_cases[i].name);
        if (s.init)
            s.init();
        hr_tf_cases[i].fn();
        if (s.fini)
            s.fini();
        fprintf(stderr, "[PASS] %s::%s\n", hr_tf_cases[i].suite, hr_tf_cases[i].name);
    }
    fprintf(stderr, "Synthesis: Tested: %d | Passing: %d\n", hr_tf_ncases, hr_tf_ncases);
    return 0;
}

#undef Test
#undef TestSuite
#define TestSuite(suite, ...)                                                                      \
    __attribute__((constructor)) static void suite##_suite_reg(void)                               \
    {                                                                                              \
        hr_tf_add_suite(#suite, (hr_tf_suite){__VA_ARGS__});                                       \
    }                                                                                              \
    extern int hr_tf_suite_##suite##_declared
#define Test(suite, name, ...)                                                                     \
    static void suite##_##name(void);                                                              \
    __attribute__((constructor)) static void suite##_##name##_reg(void)                            \
    {                                                                                              \
        hr_tf_add(#suite, #name, suite##_##name);                                                  \
    }                                                                                              \
    static void suite##_##name(void)

#define HR_TF_CHECK(c, expr, ...)                                                                  \
    do {                                                                                           \
        if (!(c))                                                                                  \
            hr_tf_fail(__FILE__, __LINE__, expr, __VA_ARGS__);                                     \
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
#undef cr_log_info
#define cr_assert(c, ...) HR_TF_CHECK(c, #c, "" __VA_ARGS__)
#define cr_assert_eq(a, b, ...) HR_TF_CHECK((a) == (b), #a " == " #b, "" __VA_ARGS__)
#define cr_assert_neq(a, b, ...) HR_TF_CHECK((a) != (b), #a " != " #b, "" __VA_ARGS__)
#define cr_assert_lt(a, b, ...) HR_TF_CHECK((a) < (b), #a " < " #b, "" __VA_ARGS__)
#define cr_assert_gt(a, b, ...) HR_TF_CHECK((a) > (b), #a " > " #b, "" __VA_ARGS__)
#define cr_assert_leq(a, b, ...) HR_TF_CHECK((a) <= (b), #a " <= " #b, "" __VA_ARGS__)
#define cr_assert_geq(a, b, ...) HR_TF_CHECK((a) >= (b), #a " >= " #b, "" __VA_ARGS__)
#define cr_assert_null(a, ...) HR_TF_CHECK((a) == NULL, #a " == NULL", "" __VA_ARGS__)
#define cr_assert_not_null(a, ...) HR_TF_CHECK((a) != NULL, #a " != NULL", "" __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...) HR_TF_CHECK(strcmp((a), (b)) == 0, #a " eq " #b, "" __VA_ARGS__)
#define cr_log_info(...) (fprintf(stderr, __VA_ARGS__), fprintf(stderr, "\n"))
#endif

#endif
