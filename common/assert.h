/* SPDX-License-Identifier: MIT */
/*
 * Run-time invariant checks. KV_ASSERT(cond, fmt, ...) aborts the process
 * with a log line naming the file, the line, the condition and the message
 * when cond is false. It is on when KV_ASSERTS is defined (CMake defines it
 * for Debug and sanitizer builds, or with -DKV_ASSERTS=ON) and compiled out
 * otherwise: the condition is then not evaluated, so it must have no side
 * effects. Use it for invariants whose failure means a bug in hotkv (lock
 * discipline, CAS preconditions), never for input or I/O errors, which
 * return kv_err.
 *
 * KV_ASSERT_LOCKED(mu) checks that the mutex is held. pthread mutexes keep
 * no portable owner, so it checks that the mutex is locked by some thread
 * (pthread_mutex_trylock fails with EBUSY): cheap, never a false alarm, and
 * it catches the bug that matters, a path that forgot to lock. The same
 * holds for KV_ASSERT_RDLOCKED on a rwlock (a write trylock fails while any
 * reader or writer holds it). Neither may be used on recursive mutexes.
 */
#ifndef KV_COMMON_ASSERT_H
#define KV_COMMON_ASSERT_H

#include <pthread.h>
#include <stdbool.h>

/* Logs "assertion failed at file:line: cond: message" and aborts. */
_Noreturn void kv_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* True when some thread holds mu (a successful trylock is undone). */
bool kv_mutex_is_locked(pthread_mutex_t *mu);
/* True when some thread holds rw, shared or exclusive. */
bool kv_rwlock_is_locked(pthread_rwlock_t *rw);

#ifdef KV_ASSERTS
#define KV_ASSERTS_ON 1
#define KV_ASSERT(cond, ...)                                                                       \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0))                                                          \
            kv_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                                \
    } while (0)
#else
#define KV_ASSERTS_ON 0
/* sizeof keeps the names used (no unused warnings) without evaluating cond */
#define KV_ASSERT(cond, ...)                                                                       \
    do {                                                                                           \
        (void)sizeof(!(cond));                                                                     \
    } while (0)
#endif

#define KV_ASSERT_LOCKED(mu) KV_ASSERT(kv_mutex_is_locked(mu), "%s is not locked", #mu)
#define KV_ASSERT_RDLOCKED(rw) KV_ASSERT(kv_rwlock_is_locked(rw), "%s is not locked", #rw)

#endif
