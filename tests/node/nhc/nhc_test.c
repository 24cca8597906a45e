/* SPDX-License-Identifier: MIT */
/*
 * NHC scheduler tests. The controller is driven window by window with a
 * simulated two-device model whose optimum load_admit is known analytically:
 * closed-loop throughput X(la) = min(demand, fd_cap / la, sd_cap / (1 - la))
 * peaks at la = fd_cap / (fd_cap + sd_cap) when both devices saturate; an
 * open-loop M/M/1 pair gives a p99 optimum. The runtime wrapper is driven with
 * explicit clock values (no sleeping): routing probability, time series,
 * stats, and a multi-threaded smoke test that checks no read is lost.
 */
#include "tests/kv_testfw.h"
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "node/nhc/nhc.h"

#define SEC 1000000000ull
#define EPS 1e-9

typedef struct sim {
    double fd_cap, sd_cap; /* ops/s each device can serve */
    double demand;         /* closed loop: max ops/s clients issue; open loop: offered */
    double miss;           /* miss ratio the workload shows */
    double sd_slow;        /* > 0: closed loop, no device saturated, an SD read takes this
                              many times an FD read: X = demand / (la + (1 - la) sd_slow) */
    bool p99;              /* open-loop latency model instead of throughput */
} sim;

static double sim_tput(const sim *m, double la)
{
    if (m->sd_slow > 0)
        return m->demand / (la + (1 - la) * m->sd_slow);
    double x = m->demand;
    if (la > 0 && m->fd_cap / la < x)
        x = m->fd_cap / la;
    if (la < 1 && m->sd_cap / (1 - la) < x)
        x = m->sd_cap / (1 - la);
    return x;
}

/*
 * p99 of an M/M/1 queue: ln(100) / (mu - lambda). Overloaded, the queue grows
 * without bound over the window; model that as 1 s times the overload factor
 * (monotone, so less overload is measurably better).
 */
static double mm1_p99_ns(double cap, double load)
{
    if (load <= 0)
        return 0;
    if (load >= cap)
        return 1e9 * load / cap;
    return log(100.0) / (cap - load) * 1e9;
}

static nhc_sample sim_sample(const sim *m, const nhc_decision *d)
{
    double la = d->load_admit, secs = (double)d->next_window_ns / SEC;
    nhc_sample s = {.miss_ratio = m->miss, .window_ns = d->next_window_ns};
    if (m->p99) {
        s.ops = (uint64_t)(m->demand * secs);
        double a = mm1_p99_ns(m->fd_cap, m->demand * la);
        double b = mm1_p99_ns(m->sd_cap, m->demand * (1 - la));
        s.p99_ns = (uint64_t)(a > b ? a : b);
    } else {
        s.ops = (uint64_t)(sim_tput(m, la) * secs);
    }
    return s;
}

/* Runs n windows; returns the last decision. Records load_admit range seen. */
static nhc_decision drive(nhc_ctl *c, const sim *m, int n, double *lo, double *hi)
{
    nhc_decision d = nhc_ctl_decision(c);
    for (int i = 0; i < n; i++) {
        nhc_sample s = sim_sample(m, &d);
        cr_assert_eq(nhc_step(c, &s, &d), KV_OK);
        cr_assert(d.load_admit >= 0.0 && d.load_admit <= 1.0);
        cr_assert_eq(d.data_admit, d.state == NHC_STATE_CLASSIC);
        if (lo && d.load_admit < *lo)
            *lo = d.load_admit;
        if (hi && d.load_admit > *hi)
            *hi = d.load_admit;
    }
    return d;
}

static nhc_ctl *mk(const nhc_opts *o)
{
    nhc_ctl *c = NULL;
    cr_assert_eq(nhc_ctl_create(o, &c), KV_OK);
    return c;
}

/* Saturated FD (700k IOPS) + SD with spare capacity (300k): optimum la = 0.7. */
static const sim SAT = {.fd_cap = 700e3, .sd_cap = 300e3, .demand = 2e6, .miss = 0.05};

Test(nhc_ctl, starts_classic)
{
    nhc_ctl *c = mk(NULL);
    nhc_decision d = nhc_ctl_decision(c);
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    cr_assert(d.data_admit);
    cr_assert_float_eq(d.load_admit, 1.0, EPS);
    cr_assert_eq(d.next_window_ns, SEC);
    nhc_ctl_destroy(c);
    nhc_ctl_destroy(NULL);
}

Test(nhc_ctl, converges_to_analytic_optimum)
{
    nhc_ctl *c = mk(NULL);
    /* Two polls make the miss ratio stable; then tuning starts at 1.0. */
    nhc_decision d = drive(c, &SAT, 2, NULL, NULL);
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    cr_assert_not(d.data_admit);
    cr_assert_eq(d.next_window_ns, 100000000ull);
    /* 1.0 -> 0.7 is 6 moves; a round is <= 3 probes: 8 rounds is plenty. */
    drive(c, &SAT, 8 * 3, NULL, NULL);
    double lo = 1, hi = 0;
    d = drive(c, &SAT, 60, &lo, &hi);
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    cr_assert(lo >= 0.65 - EPS && hi <= 0.75 + EPS, "la wandered in [%g, %g]", lo, hi);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, other_optimum_and_step)
{
    nhc_opts o;
    nhc_opts_default(&o);
    o.step = 0.1;
    sim m = {.fd_cap = 400e3, .sd_cap = 600e3, .demand = 5e6, .miss = 0.02}; /* la* = 0.4 */
    nhc_ctl *c = mk(&o);
    drive(c, &m, 2 + 8 * 3, NULL, NULL);
    double lo = 1, hi = 0;
    drive(c, &m, 30, &lo, &hi);
    cr_assert(lo >= 0.3 - EPS && hi <= 0.5 + EPS, "la in [%g, %g]", lo, hi);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, clamps_at_zero)
{
    /* SD far stronger than FD: the best share for FD is ~1%, i.e. la = 0. */
    sim m = {.fd_cap = 10e3, .sd_cap = 1e6, .demand = 2e6, .miss = 0.01};
    nhc_ctl *c = mk(NULL);
    double lo = 1, hi = 0;
    drive(c, &m, 2 + 25 * 4, &lo, &hi); /* 20 moves, rounds of <= 4 probes */
    cr_assert(lo >= 0.0);
    lo = 1, hi = 0;
    nhc_decision d = drive(c, &m, 30, &lo, &hi);
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    cr_assert_float_eq(lo, 0.0, EPS);
    cr_assert(hi <= 0.05 + EPS, "hi %g", hi);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, never_above_one)
{
    /* FD-only optimum (SD useless): la sits at 1.0 and up-probes are skipped. */
    sim m = {.fd_cap = 1e6, .sd_cap = 1e3, .demand = 5e6, .miss = 0.01};
    nhc_ctl *c = mk(NULL);
    double lo = 1, hi = 0;
    drive(c, &m, 100, &lo, &hi);
    cr_assert(hi <= 1.0 + EPS);
    cr_assert(lo >= 0.95 - EPS);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, miss_ratio_jump_falls_back)
{
    nhc_ctl *c = mk(NULL);
    nhc_decision d = drive(c, &SAT, 2 + 8 * 3, NULL, NULL);
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    cr_assert(d.load_admit < 0.8);
    sim m = SAT;
    m.miss = SAT.miss + 0.06; /* above entry + miss_rise (0.05), below miss_max */
    d = drive(c, &m, 1, NULL, NULL);
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    cr_assert(d.data_admit);
    cr_assert_float_eq(d.load_admit, 1.0, EPS);
    cr_assert_eq(d.next_window_ns, SEC);
    /* Re-enters tuning once the new miss ratio is stable again. */
    d = drive(c, &m, 1, NULL, NULL);
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    d = drive(c, &m, 1, NULL, NULL);
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, miss_ratio_above_max_falls_back)
{
    nhc_ctl *c = mk(NULL);
    drive(c, &SAT, 2 + 3, NULL, NULL);
    sim m = SAT;
    m.miss = 0.21; /* > miss_max 0.20 */
    nhc_decision d = drive(c, &m, 1, NULL, NULL);
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, no_tuning_while_miss_ratio_high)
{
    sim m = SAT;
    m.miss = 0.30;
    nhc_ctl *c = mk(NULL);
    double lo = 1, hi = 0;
    nhc_decision d = drive(c, &m, 50, &lo, &hi);
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    cr_assert_float_eq(lo, 1.0, EPS);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, unstable_miss_ratio_stays_classic)
{
    nhc_ctl *c = mk(NULL);
    nhc_decision d = nhc_ctl_decision(c);
    for (int i = 0; i < 40; i++) { /* warming up: miss ratio falls 2 points a poll */
        sim m = SAT;
        m.miss = 0.19 - 0.02 * (i % 8);
        nhc_sample s = sim_sample(&m, &d);
        cr_assert_eq(nhc_step(c, &s, &d), KV_OK);
        cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    }
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, unsaturated_stays_at_one_and_returns_to_classic)
{
    /* FD serves all demand: X is flat for la in [0.4, 1]; no probe wins. */
    sim m = {.fd_cap = 1e6, .sd_cap = 300e3, .demand = 500e3, .miss = 0.05};
    nhc_ctl *c = mk(NULL);
    nhc_decision d = drive(c, &m, 2, NULL, NULL);
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    /* Round 1: la 1.0, probe 0.95 (up is clamped and skipped), la 1.0 again. */
    d = drive(c, &m, 1, NULL, NULL);
    cr_assert_float_eq(d.load_admit, 0.95, EPS);
    d = drive(c, &m, 1, NULL, NULL);
    cr_assert_float_eq(d.load_admit, 1.0, EPS);
    d = drive(c, &m, 1, NULL, NULL); /* round 1 ends at 1.0 (stuck 1) */
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    cr_assert_float_eq(d.load_admit, 1.0, EPS);
    d = drive(c, &m, 3, NULL, NULL); /* round 2 ends at 1.0 (stuck 2) */
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    cr_assert(d.data_admit);
    cr_assert_float_eq(d.load_admit, 1.0, EPS);
    /*
     * Over a long run la never settles below 1: each cycle is two 1 s polls and
     * two rounds of three 100 ms probes of which two dip to 0.95 (0.2 s of 2.6 s).
     */
    uint64_t below = 0, total = 0;
    for (int i = 0; i < 200; i++) {
        d = drive(c, &m, 1, NULL, NULL);
        total += d.next_window_ns;
        below += d.load_admit < 1.0 - EPS ? d.next_window_ns : 0;
        cr_assert(d.load_admit >= 0.95 - EPS);
    }
    cr_assert(below * 10 < total, "%g of the time below 1.0", (double)below / total);
    nhc_ctl_destroy(c);
}

/*
 * Host noise: each window's throughput is multiplied by a factor uniform in
 * [1 - noise, 1 + noise] (a fixed xorshift sequence, so the test is
 * deterministic). Returns the share of time load_admit spent below 1.0
 * and the mean load_admit over the last `tail` windows.
 */
static double drive_noisy(nhc_ctl *c, const sim *m, double noise, int n, int tail, double *mean)
{
    uint64_t x = 0x9e3779b97f4a7c15ull, below = 0, total = 0;
    double sum = 0;
    nhc_decision d = nhc_ctl_decision(c);
    for (int i = 0; i < n; i++) {
        nhc_sample s = sim_sample(m, &d);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double f = 1.0 - noise + 2.0 * noise * (double)(x >> 11) / (double)(1ull << 53);
        s.ops = (uint64_t)((double)s.ops * f);
        total += d.next_window_ns;
        below += d.load_admit < 1.0 - EPS ? d.next_window_ns : 0;
        cr_assert_eq(nhc_step(c, &s, &d), KV_OK);
        if (i >= n - tail)
            sum += d.load_admit;
    }
    *mean = sum / tail;
    return (double)below / (double)total;
}

/* With noise far above min_gain (+/-30% a window), an unsaturated node whose
 * SD reads take 1.5x an FD read stays mostly classic: a neighbour must beat
 * la by more than la's own two measurements differ. (A plain best-of-three
 * spent 38% of the time below 1.0 here, mean la 0.87; this: 18%, 0.93.) */
Test(nhc_ctl, noise_does_not_move_an_unsaturated_node)
{
    sim m = {.demand = 500e3, .miss = 0.05, .sd_slow = 1.5};
    nhc_ctl *c = mk(NULL);
    double mean;
    double below = drive_noisy(c, &m, 0.3, 20000, 20000, &mean);
    cr_assert(below < 0.25, "%g of the time below 1.0", below);
    cr_assert(mean > 0.9, "mean la %g", mean);
    nhc_ctl_destroy(c);
}

/* ... while a saturated one still finds its optimum (0.7) through the noise. */
Test(nhc_ctl, noise_still_converges_when_saturated)
{
    nhc_ctl *c = mk(NULL);
    double mean;
    drive_noisy(c, &SAT, 0.1, 3000, 1000, &mean);
    cr_assert(mean > 0.6 && mean < 0.8, "mean la %g", mean);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, disabled_is_classic_forever)
{
    nhc_opts o;
    nhc_opts_default(&o);
    o.enable = false;
    nhc_ctl *c = mk(&o);
    double lo = 1, hi = 0;
    nhc_decision d = drive(c, &SAT, 100, &lo, &hi);
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    cr_assert(d.data_admit);
    cr_assert_float_eq(lo, 1.0, EPS);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, p99_target_converges)
{
    /* Open loop 800k ops/s over FD 700k + SD 300k: the p99s equalise at la = 0.75. */
    nhc_opts o;
    nhc_opts_default(&o);
    o.target = NHC_TARGET_P99;
    sim m = {.fd_cap = 700e3, .sd_cap = 300e3, .demand = 800e3, .miss = 0.03, .p99 = true};
    nhc_ctl *c = mk(&o);
    drive(c, &m, 2 + 8 * 3, NULL, NULL);
    double lo = 1, hi = 0;
    nhc_decision d = drive(c, &m, 60, &lo, &hi);
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    cr_assert(lo >= 0.70 - EPS && hi <= 0.80 + EPS, "la in [%g, %g]", lo, hi);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, idle_window_ends_tuning)
{
    nhc_ctl *c = mk(NULL);
    nhc_decision d = drive(c, &SAT, 2 + 3, NULL, NULL);
    cr_assert_eq(d.state, NHC_STATE_TUNING);
    nhc_sample s = {.miss_ratio = 0.05, .ops = 3, .window_ns = d.next_window_ns};
    cr_assert_eq(nhc_step(c, &s, &d), KV_OK);
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    nhc_ctl_destroy(c);
}

Test(nhc_ctl, deterministic)
{
    nhc_ctl *a = mk(NULL), *b = mk(NULL);
    for (int i = 0; i < 80; i++) {
        nhc_decision da = drive(a, &SAT, 1, NULL, NULL);
        nhc_decision db = drive(b, &SAT, 1, NULL, NULL);
        cr_assert_eq(da.state, db.state);
        cr_assert_float_eq(da.load_admit, db.load_admit, 0.0);
    }
    nhc_ctl_destroy(a);
    nhc_ctl_destroy(b);
}

Test(nhc_ctl, invalid_arguments)
{
    nhc_opts o;
    nhc_ctl *c = (nhc_ctl *)0x1;
    nhc_opts_default(&o);
    o.step = 0;
    cr_assert_eq(nhc_ctl_create(&o, &c), KV_INVALID_ARGUMENT);
    cr_assert_eq(c, (nhc_ctl *)0x1, "out-parameter written on failure");
    nhc_opts_default(&o);
    o.probe_ns = 0;
    cr_assert_eq(nhc_ctl_create(&o, &c), KV_INVALID_ARGUMENT);
    nhc_opts_default(&o);
    o.miss_max = 1.5;
    cr_assert_eq(nhc_ctl_create(&o, &c), KV_INVALID_ARGUMENT);

    c = mk(NULL);
    nhc_decision d = {.load_admit = -7};
    nhc_sample s = {.miss_ratio = 0.1, .ops = 100, .window_ns = 0};
    cr_assert_eq(nhc_step(c, &s, &d), KV_INVALID_ARGUMENT);
    s.window_ns = SEC;
    s.miss_ratio = 1.5;
    cr_assert_eq(nhc_step(c, &s, &d), KV_INVALID_ARGUMENT);
    cr_assert_float_eq(d.load_admit, -7, 0.0);
    nhc_ctl_destroy(c);
}

/* ---- runtime wrapper -------------------------------------------------------- */

/*
 * Drives the runtime for `secs` of simulated time in 10 ms ticks: each tick
 * issues the reads the device model completes at the published load_admit,
 * routed to FD with that share, a `miss` share of them noted as misses.
 */
static uint64_t run_rt(nhc *n, const sim *m, uint64_t t, double secs)
{
    const uint64_t tick = 10000000ull;
    for (uint64_t end = t + (uint64_t)(secs * SEC); t < end;) {
        double la = nhc_load_admit(n);
        long reads = lround(sim_tput(m, la) * tick / SEC);
        long fd = lround(reads * la), misses = lround(reads * m->miss);
        for (long i = 0; i < reads; i++)
            nhc_note_read(n, i < fd ? NHC_DEV_FD : NHC_DEV_SD, i < fd ? 20000 : 90000);
        for (long i = 0; i < misses; i++)
            nhc_note_miss(n);
        t += tick;
        cr_assert_eq(nhc_tick(n, t), KV_OK);
    }
    return t;
}

/* Device model scaled to 7k + 3k ops/s so a simulated minute is cheap. */
static const sim SAT_RT = {.fd_cap = 7000, .sd_cap = 3000, .demand = 20000, .miss = 0.05};

Test(nhc_rt, converges_and_reports)
{
    nhc *n = NULL;
    cr_assert_eq(nhc_create(NULL, 5 * SEC, &n), KV_OK);
    cr_assert(nhc_data_admit(n));
    cr_assert_float_eq(nhc_load_admit(n), 1.0, EPS);
    for (int i = 0; i < 1000; i++)
        cr_assert(nhc_send_to_fd(n));
    uint64_t t = run_rt(n, &SAT_RT, 5 * SEC, 70.0);
    nhc_stats st;
    nhc_get_stats(n, &st);
    cr_assert(st.enabled);
    cr_assert_eq(st.state, NHC_STATE_TUNING);
    cr_assert_not(st.data_admit);
    cr_assert_not(nhc_data_admit(n));
    cr_assert(st.load_admit >= 0.65 - EPS && st.load_admit <= 0.75 + EPS, "la %g", st.load_admit);
    cr_assert_float_eq(st.miss_ratio, 0.05, 0.01);
    cr_assert(st.ops_per_sec > 8000, "ops/s %g", st.ops_per_sec);
    cr_assert(st.dev[NHC_DEV_FD].reads > 0 && st.dev[NHC_DEV_SD].reads > 0);
    cr_assert(st.dev[NHC_DEV_FD].p99_ns >= 20000 && st.dev[NHC_DEV_FD].p99_ns <= 20000 * 9 / 8);
    cr_assert(st.dev[NHC_DEV_SD].p99_ns >= 90000 && st.dev[NHC_DEV_SD].p99_ns <= 90000 * 9 / 8);
    cr_assert_eq(st.dev[NHC_DEV_FD].mean_ns, 20000);
    cr_assert_eq(st.window_ns, 100000000ull);

    nhc_point pts[NHC_SERIES_LEN + 5];
    size_t k = nhc_get_series(n, pts, NHC_SERIES_LEN + 5);
    cr_assert_eq(k, NHC_SERIES_LEN);
    cr_assert_eq(pts[k - 1].t_ns, t);
    for (size_t i = 1; i < k; i++)
        cr_assert_eq(pts[i].t_ns - pts[i - 1].t_ns, SEC);
    cr_assert_eq(pts[0].state, NHC_STATE_TUNING); /* tuning after ~2 s, oldest point 11 s */
    cr_assert(pts[k - 1].load_admit < 0.8);
    cr_assert_eq(nhc_get_series(n, pts, 3), 3);
    cr_assert_eq(pts[2].t_ns, t, "the newest points are kept");
    cr_assert_eq(nhc_tick(n, t - 1), KV_INVALID_ARGUMENT);
    nhc_destroy(n);
    nhc_destroy(NULL);
}

Test(nhc_rt, routing_probability_matches_load_admit)
{
    nhc *n = NULL;
    cr_assert_eq(nhc_create(NULL, 0, &n), KV_OK);
    run_rt(n, &SAT_RT, 0, 30.0);
    double la = nhc_load_admit(n);
    cr_assert(la > 0.5 && la < 0.9, "la %g", la);
    const int N = 100000;
    int fd = 0;
    for (int i = 0; i < N; i++)
        fd += nhc_send_to_fd(n);
    double sd = sqrt(N * la * (1 - la)); /* binomial standard deviation */
    cr_assert(fabs(fd - N * la) < 5 * sd, "%d of %d at la %g", fd, N, la);
    nhc_destroy(n);
}

Test(nhc_rt, disabled_never_changes)
{
    nhc_opts o;
    nhc_opts_default(&o);
    o.enable = false;
    nhc *n = NULL;
    cr_assert_eq(nhc_create(&o, 0, &n), KV_OK);
    run_rt(n, &SAT_RT, 0, 20.0);
    nhc_stats st;
    nhc_get_stats(n, &st);
    cr_assert_not(st.enabled);
    cr_assert_eq(st.state, NHC_STATE_CLASSIC);
    cr_assert(nhc_data_admit(n));
    cr_assert_float_eq(nhc_load_admit(n), 1.0, EPS);
    cr_assert_gt(st.windows, 15);
    cr_assert_eq(st.data_admit_off_ns, 0);
    cr_assert_eq(st.load_admit_below_one_ns, 0);
    cr_assert_eq(st.tuning_entries, 0);
    nhc_destroy(n);
}

/* The time-in-knob counters (disabled: see disabled_never_changes): zero
 * while the knobs are forced classic, and the windows of tuning are counted
 * once it tunes. */
Test(nhc_rt, counts_time_away_from_classic)
{
    nhc *n = NULL;
    nhc_stats st;
    cr_assert_eq(nhc_create(NULL, 0, &n), KV_OK);
    nhc_force(n, 1.0, true);
    run_rt(n, &SAT_RT, 0, 10.0);
    nhc_get_stats(n, &st);
    cr_assert_eq(st.data_admit_off_ns, 0, "forced classic: data_admit stayed on");
    cr_assert_eq(st.load_admit_below_one_ns, 0);
    cr_assert_eq(st.tuning_entries, 0, "the controller is paused while forced");
    nhc_destroy(n);

    /* saturated: tuning from ~2 s on (two 1 s polls), la below 1 for all
     * but the first probes */
    cr_assert_eq(nhc_create(NULL, 0, &n), KV_OK);
    run_rt(n, &SAT_RT, 0, 10.0);
    nhc_get_stats(n, &st);
    cr_assert_eq(st.state, NHC_STATE_TUNING);
    cr_assert_eq(st.tuning_entries, 1);
    cr_assert(st.data_admit_off_ns >= 7 * SEC && st.data_admit_off_ns <= 8 * SEC, "%" PRIu64,
              st.data_admit_off_ns);
    cr_assert(st.load_admit_below_one_ns >= 6 * SEC &&
                  st.load_admit_below_one_ns < st.data_admit_off_ns,
              "%" PRIu64, st.load_admit_below_one_ns);
    nhc_destroy(n);
}

/* Forcing pauses the controller: windows under forced knobs do not step it
 * (all probes would measure the same forced load_admit and it would end
 * tuning as "stuck at 1"), and unforcing resumes it where it stopped. */
Test(nhc_rt, force_pauses_and_unforce_resumes)
{
    nhc *n = NULL;
    cr_assert_eq(nhc_create(NULL, 0, &n), KV_OK);
    uint64_t t = run_rt(n, &SAT_RT, 0, 20.0);
    nhc_stats before, st;
    nhc_get_stats(n, &before);
    cr_assert_eq(before.state, NHC_STATE_TUNING);
    cr_assert(before.load_admit < 0.8, "la %g", before.load_admit);
    nhc_force(n, 1.0, true);
    t = run_rt(n, &SAT_RT, t, 30.0);
    nhc_get_stats(n, &st);
    cr_assert(st.forced && st.data_admit);
    cr_assert_float_eq(st.load_admit, 1.0, EPS);
    cr_assert_gt(st.windows, before.windows + 100, "windows still close while forced");
    nhc_unforce(n);
    nhc_get_stats(n, &st);
    cr_assert_not(st.forced);
    cr_assert_eq(st.state, NHC_STATE_TUNING);
    cr_assert_float_eq(st.load_admit, before.load_admit, EPS);
    cr_assert_not(nhc_data_admit(n));
    /* the first window after unforcing is not stepped, the next ones are */
    uint64_t w = st.windows;
    cr_assert_eq(nhc_tick(n, t + 10000000ull), KV_OK);
    nhc_get_stats(n, &st);
    cr_assert_eq(st.windows, w + 1);
    cr_assert_float_eq(st.load_admit, before.load_admit, EPS);
    run_rt(n, &SAT_RT, t + 10000000ull, 10.0);
    nhc_get_stats(n, &st);
    cr_assert_eq(st.state, NHC_STATE_TUNING);
    cr_assert(st.load_admit >= 0.6 - EPS && st.load_admit <= 0.8 + EPS, "la %g", st.load_admit);
    cr_assert_eq(st.tuning_entries, 1, "no return to classic in between");
    nhc_destroy(n);
}

Test(nhc_rt, invalid_options)
{
    nhc_opts o;
    nhc_opts_default(&o);
    o.target = (nhc_target)9;
    nhc *n = (nhc *)0x1;
    cr_assert_eq(nhc_create(&o, 0, &n), KV_INVALID_ARGUMENT);
    cr_assert_eq(n, (nhc *)0x1);
}

/* ---- multi-threaded smoke ---------------------------------------------------- */

#define MT_READERS 4
#define MT_READS 100000

typedef struct mt {
    nhc *n;
    atomic_int running;
    uint64_t seen_reads; /* ticker: reads accounted over all closed windows */
} mt;

static void *mt_reader(void *arg)
{
    mt *x = arg;
    unsigned fd = 0;
    for (int i = 0; i < MT_READS; i++) {
        bool to_fd = nhc_send_to_fd(x->n);
        fd += to_fd;
        nhc_note_read(x->n, to_fd ? NHC_DEV_FD : NHC_DEV_SD, 1000 + (uint64_t)i % 5000);
        if (i % 20 == 0)
            nhc_note_miss(x->n);
        (void)nhc_data_admit(x->n);
    }
    atomic_fetch_sub(&x->running, 1);
    return (void *)(uintptr_t)fd;
}

static uint64_t mt_tick(mt *x, uint64_t t, uint64_t *windows)
{
    nhc_stats st;
    cr_assert_eq(nhc_tick(x->n, t), KV_OK);
    nhc_get_stats(x->n, &st);
    if (st.windows != *windows) {
        cr_assert_eq(st.windows, *windows + 1);
        x->seen_reads += st.dev[0].reads + st.dev[1].reads;
        *windows = st.windows;
    }
    return t;
}

static void *mt_ticker(void *arg)
{
    mt *x = arg;
    uint64_t t = 0, windows = 0;
    nhc_point pts[NHC_SERIES_LEN];
    while (atomic_load(&x->running) > 0) {
        t = mt_tick(x, t + 50000000ull, &windows); /* 50 ms of simulated time */
        (void)nhc_get_series(x->n, pts, NHC_SERIES_LEN);
    }
    mt_tick(x, t + 2 * SEC, &windows); /* closes the last window */
    return NULL;
}

Test(nhc_rt, threads_smoke)
{
    mt x = {.running = MT_READERS};
    pthread_t r[MT_READERS], tk;
    cr_assert_eq(nhc_create(NULL, 0, &x.n), KV_OK);
    for (int i = 0; i < MT_READERS; i++)
        cr_assert_eq(pthread_create(&r[i], NULL, mt_reader, &x), 0);
    cr_assert_eq(pthread_create(&tk, NULL, mt_ticker, &x), 0);
    for (int i = 0; i < MT_READERS; i++)
        pthread_join(r[i], NULL);
    pthread_join(tk, NULL);
    cr_assert_eq(x.seen_reads, (uint64_t)MT_READERS * MT_READS, "no read lost: %lu",
                 (unsigned long)x.seen_reads);
    nhc_destroy(x.n);
}

/* Classic windows between two tuning periods of an unsaturated node: the
 * entry waits 1, 2, 4 .. backoff_max extra stable polls after each stuck
 * end, and a miss-ratio rise (a workload change) resets the wait. */
static int classic_polls_until_tuning(nhc_ctl *c, const sim *m, nhc_decision *d)
{
    int n = 0;
    while (d->state == NHC_STATE_CLASSIC && n < 1000) {
        nhc_sample s = sim_sample(m, d);
        cr_assert_eq(nhc_step(c, &s, d), KV_OK);
        n++;
    }
    return n;
}

static void tune_until_classic(nhc_ctl *c, const sim *m, nhc_decision *d)
{
    for (int i = 0; d->state == NHC_STATE_TUNING && i < 1000; i++) {
        nhc_sample s = sim_sample(m, d);
        cr_assert_eq(nhc_step(c, &s, d), KV_OK);
    }
    cr_assert_eq(d->state, NHC_STATE_CLASSIC);
}

Test(nhc_ctl, unsaturated_reentry_backs_off_and_a_miss_rise_resets_it)
{
    sim m = {.fd_cap = 1e6, .sd_cap = 300e3, .demand = 500e3, .miss = 0.05};
    nhc_opts o;
    nhc_opts_default(&o);
    o.backoff_max = 8;
    nhc_ctl *c = mk(&o);
    nhc_decision d = nhc_ctl_decision(c);
    const int want[] = {2, 3, 4, 6, 10, 10, 10};
    for (int i = 0; i < 7; i++) {
        int n = classic_polls_until_tuning(c, &m, &d);
        cr_assert_eq(n, want[i], "entry %d after %d polls, want %d", i, n, want[i]);
        tune_until_classic(c, &m, &d);
    }
    /* a workload change while tuning: back to classic, next entry at once */
    cr_assert_eq(classic_polls_until_tuning(c, &m, &d), 10);
    sim w = m;
    w.miss = m.miss + 0.10;
    nhc_sample s = sim_sample(&w, &d);
    cr_assert_eq(nhc_step(c, &s, &d), KV_OK);
    cr_assert_eq(d.state, NHC_STATE_CLASSIC);
    cr_assert_eq(classic_polls_until_tuning(c, &w, &d), 2, "no backoff after a miss rise");
    nhc_ctl_destroy(c);
}
