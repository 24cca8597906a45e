/* SPDX-License-Identifier: MIT */
/*
 * Tests for common/assert.h: KV_ASSERT aborts with a log line naming the
 * place and the message when on (this file forces it on), evaluates nothing
 * when off (assert_off.c is compiled without KV_ASSERTS), and the lock
 * probes tell a held lock from a free one.
 */
#ifndef KV_ASSERTS
#define KV_ASSERTS
#endif
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>

#include "common/assert.h"

int assert_off_evaluations(void); /* assert_off.c */

Test(kv_assert, true_condition_passes)
{
    int x = 1;
    KV_ASSERT(x == 1, "x is %d", x);
    cr_assert_eq(KV_ASSERTS_ON, 1);
}

Test(kv_assert, false_condition_aborts, .signal = SIGABRT)
{
    int x = 2;
    KV_ASSERT(x == 1, "x is %d", x);
}

Test(kv_assert, compiled_out_without_kv_asserts)
{
    cr_assert_eq(assert_off_evaluations(), 0, "the condition ran with asserts off");
}

Test(kv_assert, mutex_probe)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    cr_assert_not(kv_mutex_is_locked(&mu));
    pthread_mutex_lock(&mu);
    cr_assert(kv_mutex_is_locked(&mu));
    KV_ASSERT_LOCKED(&mu);
    pthread_mutex_unlock(&mu);
    cr_assert_not(kv_mutex_is_locked(&mu), "the probe left the mutex locked");
    pthread_mutex_lock(&mu); /* and it can be taken again */
    pthread_mutex_unlock(&mu);
}

Test(kv_assert, unlocked_mutex_aborts, .signal = SIGABRT)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    KV_ASSERT_LOCKED(&mu);
}

Test(kv_assert, rwlock_probe)
{
    pthread_rwlock_t rw = PTHREAD_RWLOCK_INITIALIZER;
    cr_assert_not(kv_rwlock_is_locked(&rw));
    pthread_rwlock_rdlock(&rw);
    cr_assert(kv_rwlock_is_locked(&rw));
    KV_ASSERT_RDLOCKED(&rw);
    pthread_rwlock_unlock(&rw);
    cr_assert_not(kv_rwlock_is_locked(&rw));
    pthread_rwlock_wrlock(&rw);
    cr_assert(kv_rwlock_is_locked(&rw));
    pthread_rwlock_unlock(&rw);
}
