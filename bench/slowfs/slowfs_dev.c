/* SPDX-License-Identifier: MIT */
/*
 * slowfs's device model. A request first takes its share of two budgets
 * shared by all FUSE threads: IOPS (one I/O per started 256 KiB, the unit in
 * which AWS EBS counts SSD-volume IOPS) and bandwidth (its bytes). Each
 * budget is a GCRA (generic cell rate algorithm, ITU-T I.371): a token
 * bucket kept as a theoretical arrival time that advances by the request's
 * cost and may lag behind now by at most burst_ms, so an idle device can
 * absorb a burst of burst_ms worth of budget. The request sleeps until both
 * budgets admit it, then for the read or write latency (fsync pays the
 * write latency), then runs. Sleeping threads queue like requests queued at
 * a device, so latency under load grows with the queue.
 */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "bench/slowfs/slowfs.h"

#define IO_UNIT (256u << 10)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000u), (long)(t % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0)
        ; /* EINTR: keep waiting */
}

void sfs_dev_init(sfs_dev *d)
{
    pthread_mutex_init(&d->mu, NULL);
    d->iops_tat = d->bw_tat = 0;
}

/* Advances one GCRA by cost_ns; returns when the request may start. */
static uint64_t gcra(uint64_t *tat, uint64_t now, uint64_t cost_ns, uint64_t burst_ns)
{
    uint64_t floor = now > burst_ns ? now - burst_ns : 0;
    if (*tat < floor)
        *tat = floor;
    uint64_t start = *tat > now ? *tat : now;
    *tat += cost_ns;
    return start;
}

void sfs_dev_delay(sfs_dev *d, sfs_kind kind, size_t bytes)
{
    uint64_t now = now_ns(), start = now;
    uint64_t burst = (uint64_t)d->burst_ms * 1000000u;
    if (d->iops > 0 || d->mbps > 0) {
        uint64_t ios = kind == SFS_SYNC ? 1 : (bytes + IO_UNIT - 1) / IO_UNIT;
        ios = ios ? ios : 1;
        pthread_mutex_lock(&d->mu);
        if (d->iops > 0) {
            uint64_t s = gcra(&d->iops_tat, now, ios * 1000000000u / (uint64_t)d->iops, burst);
            start = s > start ? s : start;
        }
        if (d->mbps > 0 && bytes > 0) {
            uint64_t cost = (uint64_t)((double)bytes * 1e9 / ((double)d->mbps * 1048576.0));
            uint64_t s = gcra(&d->bw_tat, now, cost, burst);
            start = s > start ? s : start;
        }
        pthread_mutex_unlock(&d->mu);
    }
    long lat = kind == SFS_READ ? d->read_lat_us : d->write_lat_us;
    uint64_t until = start + (uint64_t)(lat > 0 ? lat : 0) * 1000u;
    if (until > now) {
        sleep_until(until);
        atomic_fetch_add_explicit(&d->wait_ns, until - now, memory_order_relaxed);
    }
}

void sfs_dev_report(sfs_dev *d, const char *prefix)
{
    fprintf(stderr,
            "%s: reads=%llu read_bytes=%llu writes=%llu write_bytes=%llu syncs=%llu "
            "delay_s=%.3f\n",
            prefix, (unsigned long long)atomic_load(&d->reads),
            (unsigned long long)atomic_load(&d->read_bytes),
            (unsigned long long)atomic_load(&d->writes),
            (unsigned long long)atomic_load(&d->write_bytes),
            (unsigned long long)atomic_load(&d->syncs), (double)atomic_load(&d->wait_ns) / 1e9);
}
