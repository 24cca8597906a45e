/* SPDX-License-Identifier: MIT */
/*
 * The receiving side of streaming and repair: pull jobs (DESIGN.md §4).
 *
 * A job pulls the records of some ring ranges from a source node with
 * admin.StreamRead, chunk by chunk in the source's order, applies them by
 * last-writer-wins (node_apply_record, so a chunk applied twice or late never
 * overwrites newer data), makes them durable (engine_sync), and only then
 * records the chunk's last key as the job's resume point in DATA_DIR/streams
 * (tmp + fsync + rename). A restart of the node resumes every unfinished job
 * from its last applied chunk; a source that restarts is retried with
 * backoff from the same point. A repair job (diff) reads digests first and
 * fetches only the records newer than the local ones.
 *
 * One thread runs the jobs, one chunk at a time, round robin, paced to the
 * job's MiB/s. Jobs of a membership transition carry its map epoch and are
 * dropped when the map no longer has that transition (completed or
 * aborted); finished repair jobs are kept for status until 1000 newer ones
 * finish.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "node/node.h"

#define JOBS_FILE "streams"
#define MAX_JOBS 4096
#define KEEP_DONE 1000
#define READ_DEADLINE_MS 60000
#define BACKOFF_MAX_NS (10ull * 1000000000ull)

typedef enum job_state { JOB_QUEUED, JOB_RUNNING, JOB_DONE } job_state;

typedef struct job {
    Kv__StreamJobState st; /* persisted part; st.job owned (unpacked copy) */
    uint8_t *resume;       /* st.resume_key points here */
    job_state state;
    char error[200];
    uint64_t retry_at_ns, backoff_ns;
    uint64_t rate_t0_ns, rate_b0; /* rate window */
    double rate_bps;
    uint64_t run_ns; /* time spent running since this process loaded it */
    bool cancelled;  /* dropped while its chunk ran: the job thread frees it */
} job;

struct node_streams {
    node *n;
    pthread_mutex_t mu; /* protects jobs, njobs and every job's fields */
    pthread_cond_t cv;
    job **jobs;
    size_t njobs;
    pthread_t thread;
    bool started, stop;
};

/* ---- persistence ------------------------------------------------------- */

static void job_free(job *j)
{
    if (!j)
        return;
    if (j->st.job)
        kv__stream_job__free_unpacked(j->st.job, NULL);
    free(j->resume);
    free(j);
}

/* A deep copy of a StreamJob (through its wire form). */
static Kv__StreamJob *job_copy(const Kv__StreamJob *src)
{
    size_t len = kv__stream_job__get_packed_size(src);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return NULL;
    kv__stream_job__pack(src, buf);
    Kv__StreamJob *j = kv__stream_job__unpack(NULL, len, buf);
    free(buf);
    return j;
}

static kv_err set_resume(job *j, const uint8_t *key, size_t len)
{
    uint8_t *r = malloc(len ? len : 1);
    if (!r)
        return KV_RESOURCE_EXHAUSTED;
    if (len)
        memcpy(r, key, len);
    free(j->resume);
    j->resume = r;
    j->st.resume_key = (ProtobufCBinaryData){len, r};
    return KV_OK;
}

/* Rewrites DATA_DIR/streams (s->mu held). */
static kv_err save(node_streams *s)
{
    Kv__StreamJobFile f = KV__STREAM_JOB_FILE__INIT;
    Kv__StreamJobState **ptrs = malloc((s->njobs ? s->njobs : 1) * sizeof(*ptrs));
    if (!ptrs)
        return KV_RESOURCE_EXHAUSTED;
    for (size_t i = 0; i < s->njobs; i++)
        ptrs[i] = &s->jobs[i]->st;
    f.n_jobs = s->njobs;
    f.jobs = ptrs;
    size_t len = kv__stream_job_file__get_packed_size(&f);
    uint8_t *buf = malloc(len ? len : 1);
    kv_err rv = buf ? KV_OK : KV_RESOURCE_EXHAUSTED;
    char path[4200], tmp[4300];
    snprintf(path, sizeof(path), "%s/%s", s->n->cfg.data_dir, JOBS_FILE);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (rv == KV_OK) {
        kv__stream_job_file__pack(&f, buf);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        bool ok = fd >= 0 && write(fd, buf, len) == (ssize_t)len && fsync(fd) == 0;
        if (fd >= 0)
            close(fd);
        if (!ok || rename(tmp, path) != 0) {
            KV_ERROR("stream", "cannot write %s: %s", path, strerror(errno));
            rv = KV_INTERNAL;
        }
    }
    free(buf);
    free(ptrs);
    return rv;
}

static kv_err add_job(node_streams *s, job *j)
{
    job **nj = realloc(s->jobs, (s->njobs + 1) * sizeof(*nj));
    if (!nj)
        return KV_RESOURCE_EXHAUSTED;
    s->jobs = nj;
    s->jobs[s->njobs++] = j;
    return KV_OK;
}

/* Loads the jobs of a previous run (unfinished ones resume). */
static kv_err load(node_streams *s, char *err, size_t errlen)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/%s", s->n->cfg.data_dir, JOBS_FILE);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return errno == ENOENT ? KV_OK : KV_INTERNAL;
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *buf = size > 0 ? malloc((size_t)size) : NULL;
    bool ok = buf && fread(buf, 1, (size_t)size, fp) == (size_t)size;
    fclose(fp);
    Kv__StreamJobFile *f = ok ? kv__stream_job_file__unpack(NULL, (size_t)size, buf) : NULL;
    free(buf);
    if (size > 0 && !f) {
        snprintf(err, errlen, "%.200s is damaged (delete it to forget the stream jobs)", path);
        return KV_DATA_LOSS;
    }
    kv_err rv = KV_OK;
    for (size_t i = 0; f && rv == KV_OK && i < f->n_jobs; i++) {
        const Kv__StreamJobState *js = f->jobs[i];
        job *j = js->job ? calloc(1, sizeof(*j)) : NULL;
        if (!j) {
            rv = KV_RESOURCE_EXHAUSTED;
            break;
        }
        kv__stream_job_state__init(&j->st);
        j->st.job = job_copy(js->job);
        j->st.done = js->done;
        j->st.keys = js->keys;
        j->st.bytes = js->bytes;
        j->st.applied = js->applied;
        j->st.est_keys = js->est_keys;
        j->st.est_bytes = js->est_bytes;
        j->st.compared = js->compared;
        j->st.elapsed_ms = js->elapsed_ms;
        j->st.done_ms = js->done_ms;
        j->state = js->done ? JOB_DONE : JOB_QUEUED;
        if (!j->st.job)
            rv = KV_RESOURCE_EXHAUSTED;
        else if ((rv = set_resume(j, js->resume_key.data, js->resume_key.len)) == KV_OK)
            rv = add_job(s, j);
        if (rv != KV_OK)
            job_free(j);
    }
    if (f) {
        KV_INFO("stream", "loaded %zu stream jobs from %s", f->n_jobs, path);
        kv__stream_job_file__free_unpacked(f, NULL);
    }
    return rv;
}

/* ---- running a chunk --------------------------------------------------- */

/* What one chunk brought. */
typedef struct chunk_res {
    uint64_t keys, bytes, applied, compared;
    uint64_t paced; /* bytes read from the source (digests too): what the throttle counts */
    bool done;
    Kv__StreamReadReply *rep; /* holds next_key until the job records it */
} chunk_res;

/* One admin.StreamRead to the job's source; *paced (may be NULL) grows by
 * the reply's size. */
static kv_err read_call(node *n, const Kv__StreamJob *jb, const Kv__StreamReadRequest *req,
                        Kv__StreamReadReply **out, uint64_t *paced, char *err, size_t errlen)
{
    rpc_chan *ch = node_chan(n, jb->source_addr);
    if (!ch) {
        snprintf(err, errlen, "bad source address %s", jb->source_addr);
        return KV_INVALID_ARGUMENT;
    }
    rpc_reply rep = {0};
    kv_err rv = rpc_call(ch, "admin.StreamRead", 0, &req->base, READ_DEADLINE_MS, &rep);
    if (rv == KV_OK && !(*out = kv__stream_read_reply__unpack(NULL, rep.len, rep.body)))
        rv = KV_INTERNAL;
    if (rv == KV_OK && paced)
        *paced += rep.len;
    if (rv != KV_OK)
        snprintf(err, errlen, "%s from %s: %s", rv == KV_INTERNAL ? "bad StreamRead reply" : "read",
                 jb->source_id, rep.message ? rep.message : kv_strerror(rv));
    rpc_reply_free(&rep);
    return rv;
}

static kv_err apply_all(node *n, const Kv__StreamReadReply *rep, chunk_res *cr, char *err,
                        size_t errlen)
{
    for (size_t i = 0; i < rep->n_records; i++) {
        const Kv__Record *r = rep->records[i];
        bool applied = false;
        kv_err rv = node_apply_record(n, r, &applied, err, errlen);
        if (rv != KV_OK)
            return rv;
        cr->keys++;
        cr->bytes += r->key.len + r->value.len;
        cr->applied += applied;
    }
    return KV_OK;
}

/* The local version of key (0 = no record). */
static uint64_t local_version(node *n, const ProtobufCBinaryData *key)
{
    engine_result r = {0};
    if (engine_get(n->eng, key->data, key->len, &r) != KV_OK)
        return 0;
    free(r.val);
    return r.version;
}

/* Repair: compares the source's digests with the local versions and
 * fetches the records that are newer there. */
static kv_err diff_fetch(node *n, const Kv__StreamJob *jb, const Kv__StreamReadReply *dig,
                         chunk_res *cr, char *err, size_t errlen)
{
    ProtobufCBinaryData *want = malloc((dig->n_records ? dig->n_records : 1) * sizeof(*want));
    if (!want)
        return KV_RESOURCE_EXHAUSTED;
    size_t nw = 0;
    for (size_t i = 0; i < dig->n_records; i++) {
        cr->compared++;
        if (dig->records[i]->version > local_version(n, &dig->records[i]->key))
            want[nw++] = dig->records[i]->key;
    }
    kv_err rv = KV_OK;
    if (nw) {
        Kv__StreamReadRequest req = KV__STREAM_READ_REQUEST__INIT;
        req.n_keys = nw;
        req.keys = want;
        Kv__StreamReadReply *rep = NULL;
        rv = read_call(n, jb, &req, &rep, &cr->paced, err, errlen);
        if (rv == KV_OK)
            rv = apply_all(n, rep, cr, err, errlen);
        if (rep)
            kv__stream_read_reply__free_unpacked(rep, NULL);
    }
    free(want);
    return rv;
}

static kv_err run_chunk(node *n, const Kv__StreamJob *jb, const ProtobufCBinaryData *resume,
                        size_t max_bytes, bool first, chunk_res *cr, char *err, size_t errlen)
{
    Kv__StreamReadRequest req = KV__STREAM_READ_REQUEST__INIT;
    req.n_ranges = jb->n_ranges;
    req.ranges = jb->ranges;
    req.after_key = *resume;
    req.max_bytes = (uint32_t)max_bytes;
    req.digest = jb->diff;
    kv_err rv = read_call(n, jb, &req, &cr->rep, &cr->paced, err, errlen);
    if (rv == KV_OK)
        rv = jb->diff ? diff_fetch(n, jb, cr->rep, cr, err, errlen)
                      : apply_all(n, cr->rep, cr, err, errlen);
    if (rv == KV_OK && (cr->keys || jb->diff) && (rv = engine_wal_sync(n->eng)) != KV_OK)
        snprintf(err, errlen, "cannot sync the applied records: %s", kv_strerror(rv));
    if (rv == KV_OK)
        cr->done = cr->rep->done;
    (void)first;
    return rv;
}

/* ---- the job thread ---------------------------------------------------- */

static job *find_job(node_streams *s, const char *id, size_t *at)
{
    for (size_t i = 0; i < s->njobs; i++)
        if (strcmp(s->jobs[i]->st.job->id, id) == 0) {
            if (at)
                *at = i;
            return s->jobs[i];
        }
    return NULL;
}

/* Removes job i (s->mu held). */
static void drop_job(node_streams *s, size_t i)
{
    job_free(s->jobs[i]);
    memmove(&s->jobs[i], &s->jobs[i + 1], (s->njobs - i - 1) * sizeof(*s->jobs));
    s->njobs--;
}

/* Keeps at most KEEP_DONE finished jobs, dropping the oldest (s->mu held). */
static void prune(node_streams *s)
{
    size_t done = 0;
    for (size_t i = 0; i < s->njobs; i++)
        done += s->jobs[i]->state == JOB_DONE;
    for (size_t i = 0; i < s->njobs && done > KEEP_DONE;) {
        if (s->jobs[i]->state == JOB_DONE) {
            drop_job(s, i);
            done--;
        } else {
            i++;
        }
    }
}

static job *pick(node_streams *s, uint64_t now, size_t *cursor, uint64_t *wake)
{
    for (size_t k = 0; k < s->njobs; k++) {
        job *j = s->jobs[(*cursor + k) % s->njobs];
        if (j->state == JOB_DONE)
            continue;
        if (j->retry_at_ns > now) {
            *wake = *wake < j->retry_at_ns ? *wake : j->retry_at_ns;
            continue;
        }
        *cursor = (*cursor + k + 1) % s->njobs;
        return j;
    }
    return NULL;
}

static void wait_until(node_streams *s, uint64_t until_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = kv_now_ns();
    uint64_t d = until_ns > now ? until_ns - now : 0;
    uint64_t ns = (uint64_t)ts.tv_nsec + d;
    ts.tv_sec += (time_t)(ns / 1000000000ull);
    ts.tv_nsec = (long)(ns % 1000000000ull);
    if (!s->stop)
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
}

/* Records a chunk's outcome in its job (s->mu held). */
static void account_chunk(node_streams *s, job *j, kv_err rv, const chunk_res *cr, const char *err,
                          uint64_t t0)
{
    uint64_t now = kv_now_ns();
    j->run_ns += now - t0;
    j->st.elapsed_ms += (now - t0) / 1000000u;
    if (rv != KV_OK) {
        if (strcmp(j->error, err) != 0)
            KV_WARN("stream", "job %s: %s (retrying)", j->st.job->id, err);
        snprintf(j->error, sizeof(j->error), "%s", err);
        j->backoff_ns = j->backoff_ns ? j->backoff_ns * 2 : 500000000ull;
        j->backoff_ns = j->backoff_ns > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : j->backoff_ns;
        j->retry_at_ns = now + j->backoff_ns;
        j->state = JOB_QUEUED;
        return;
    }
    j->error[0] = '\0';
    j->backoff_ns = 0;
    j->st.keys += cr->keys;
    j->st.bytes += cr->bytes;
    j->st.applied += cr->applied;
    j->st.compared += cr->compared;
    if (!j->resume || !j->resume[0] || j->st.resume_key.len == 0) {
        if (!j->st.est_keys && cr->rep->est_keys)
            j->st.est_keys = cr->rep->est_keys;
        if (!j->st.est_bytes && cr->rep->est_bytes)
            j->st.est_bytes = cr->rep->est_bytes;
    }
    set_resume(j, cr->rep->next_key.data, cr->rep->next_key.len);
    if (now - j->rate_t0_ns > 2000000000ull || !j->rate_t0_ns) {
        if (j->rate_t0_ns)
            j->rate_bps = (double)(j->st.bytes - j->rate_b0) * 1e9 / (double)(now - j->rate_t0_ns);
        j->rate_t0_ns = now;
        j->rate_b0 = j->st.bytes;
    }
    if (cr->done) {
        j->state = JOB_DONE;
        j->st.done = true;
        j->st.done_ms = kv_wall_ms();
        KV_INFO("stream", "job %s from %s done: %llu records, %llu bytes, %llu applied",
                j->st.job->id, j->st.job->source_id, (unsigned long long)j->st.keys,
                (unsigned long long)j->st.bytes, (unsigned long long)j->st.applied);
        prune(s);
    } else {
        j->state = JOB_QUEUED;
    }
    save(s);
}

/* One chunk of job j, run without s->mu; returns the pacing delay. */
static uint64_t step(node_streams *s, job *j)
{
    Kv__StreamJob *jb = job_copy(j->st.job);
    ProtobufCBinaryData resume = {j->st.resume_key.len, NULL};
    uint8_t *rbuf = malloc(resume.len ? resume.len : 1);
    uint64_t mbps = j->st.job->mbps ? j->st.job->mbps : (uint64_t)s->n->cfg.stream_mbps;
    j->state = JOB_RUNNING;
    if (rbuf && resume.len)
        memcpy(rbuf, j->st.resume_key.data, resume.len);
    resume.data = rbuf;
    pthread_mutex_unlock(&s->mu);
    size_t max = (size_t)(mbps << 20) / 4;
    max = max < (64u << 10) ? (64u << 10) : max > (4u << 20) ? (4u << 20) : max;
    chunk_res cr = {0};
    char err[200] = "out of memory";
    uint64_t t0 = kv_now_ns();
    kv_err rv = jb && rbuf
                    ? run_chunk(s->n, jb, &resume, max, resume.len == 0, &cr, err, sizeof(err))
                    : KV_RESOURCE_EXHAUSTED;
    pthread_mutex_lock(&s->mu);
    account_chunk(s, j, rv, &cr, err, t0);
    if (cr.rep)
        kv__stream_read_reply__free_unpacked(cr.rep, NULL);
    if (jb)
        kv__stream_job__free_unpacked(jb, NULL);
    free(rbuf);
    uint64_t spent = kv_now_ns() - t0, want = cr.paced * 1000000000ull / (mbps << 20);
    return want > spent ? want - spent : 0;
}

static void *streams_main(void *arg)
{
    node_streams *s = arg;
    engine_thread_register();
    size_t cursor = 0;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        uint64_t now = kv_now_ns(), wake = now + 200000000ull;
        job *j = pick(s, now, &cursor, &wake);
        if (!j) {
            wait_until(s, wake);
            continue;
        }
        uint64_t pause = step(s, j);
        size_t at;
        if (j->cancelled && find_job(s, j->st.job->id, &at) == j) {
            drop_job(s, at);
            save(s);
            continue;
        }
        if (pause)
            wait_until(s, kv_now_ns() + pause);
    }
    pthread_mutex_unlock(&s->mu);
    engine_thread_unregister();
    return NULL;
}

kv_err node_streams_open(node *n, node_streams **out, char *err, size_t errlen)
{
    node_streams *s = calloc(1, sizeof(*s));
    if (!s)
        return KV_RESOURCE_EXHAUSTED;
    s->n = n;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    kv_err rv = load(s, err, errlen);
    if (rv == KV_OK && pthread_create(&s->thread, NULL, streams_main, s) != 0) {
        snprintf(err, errlen, "cannot start the stream thread");
        rv = KV_RESOURCE_EXHAUSTED;
    }
    s->started = rv == KV_OK;
    if (rv != KV_OK) {
        node_streams_close(s);
        return rv;
    }
    *out = s;
    return KV_OK;
}

void node_streams_close(node_streams *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started)
        pthread_join(s->thread, NULL);
    for (size_t i = 0; i < s->njobs; i++)
        job_free(s->jobs[i]);
    free(s->jobs);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ---- handlers ---------------------------------------------------------- */

static kv_err check_job(node *n, const Kv__StreamJob *jb, char *err, size_t errlen)
{
    if (!jb || !jb->id || !jb->id[0] || strlen(jb->id) > 200) {
        snprintf(err, errlen, "a stream job needs an id of 1..200 bytes");
        return KV_INVALID_ARGUMENT;
    }
    if (!jb->source_addr || !jb->source_id ||
        (strncmp(jb->source_addr, "tcp://", 6) != 0 && !rpc_url_tls(jb->source_addr))) {
        snprintf(err, errlen, "job %.100s: source address must be tcp:// or tls+tcp://host:port",
                 jb->id);
        return KV_INVALID_ARGUMENT;
    }
    if (strcmp(jb->source_id, n->cfg.id) == 0) {
        snprintf(err, errlen, "job %.100s: a node cannot stream from itself", jb->id);
        return KV_INVALID_ARGUMENT;
    }
    if (jb->n_ranges == 0 || jb->n_ranges > 65536) {
        snprintf(err, errlen, "job %.100s: %zu ranges (want 1..65536)", jb->id, jb->n_ranges);
        return KV_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < jb->n_ranges; i++)
        if (!jb->ranges[i]) {
            snprintf(err, errlen, "job %.100s: empty range", jb->id);
            return KV_INVALID_ARGUMENT;
        }
    return KV_OK;
}

kv_err node_h_stream_start(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    node_streams *s = n->streams;
    Kv__StreamStartRequest *req = kv__stream_start_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__StreamStartRequest body");
    kv_err rv = KV_OK;
    for (size_t i = 0; rv == KV_OK && i < req->n_jobs; i++)
        rv = check_job(n, req->jobs[i], c->message, sizeof(c->message));
    Kv__StreamStartReply rep = KV__STREAM_START_REPLY__INIT;
    pthread_mutex_lock(&s->mu);
    if (rv == KV_OK && s->njobs + req->n_jobs > MAX_JOBS)
        rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "too many stream jobs (%zu, at most %d)",
                      s->njobs + req->n_jobs, MAX_JOBS);
    for (size_t i = 0; rv == KV_OK && i < req->n_jobs; i++) {
        if (find_job(s, req->jobs[i]->id, NULL)) {
            rep.existing++;
            continue;
        }
        job *j = calloc(1, sizeof(*j));
        if (j) {
            kv__stream_job_state__init(&j->st);
            j->st.job = job_copy(req->jobs[i]);
        }
        if (!j || !j->st.job || set_resume(j, NULL, 0) != KV_OK || add_job(s, j) != KV_OK) {
            job_free(j);
            rv = rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory for stream jobs");
            break;
        }
        rep.started++;
    }
    if (rv == KV_OK && rep.started && save(s) != KV_OK)
        rv = rpc_fail(c, KV_INTERNAL, "cannot persist the stream jobs");
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    kv__stream_start_request__free_unpacked(req, NULL);
    return rv == KV_OK ? rpc_reply_msg(c, &rep.base) : rv;
}

static const char *state_name(const job *j)
{
    if (j->state == JOB_DONE)
        return "DONE";
    if (j->error[0])
        return "RETRYING";
    return j->state == JOB_RUNNING ? "RUNNING" : j->st.keys ? "RUNNING" : "QUEUED";
}

static void fill_progress(const job *j, Kv__StreamProgress *p)
{
    kv__stream_progress__init(p);
    p->id = j->st.job->id;
    p->source_id = j->st.job->source_id;
    p->state = (char *)state_name(j);
    p->keys = j->st.keys;
    p->bytes = j->st.bytes;
    p->applied = j->st.applied;
    p->rate_bps = j->state == JOB_DONE ? 0 : j->rate_bps;
    p->est_keys = j->st.est_keys;
    p->est_bytes = j->st.est_bytes;
    p->error = (char *)j->error;
    p->elapsed_ms = j->st.elapsed_ms;
    p->compared = j->st.compared;
    p->epoch = j->st.job->epoch;
}

static bool wanted(const Kv__StreamStatusRequest *req, const char *id)
{
    for (size_t i = 0; i < req->n_ids; i++)
        if (strcmp(req->ids[i], id) == 0)
            return true;
    return req->n_ids == 0;
}

kv_err node_h_stream_status(rpc_ctx *c, const uint8_t *body, size_t len)
{
    node *n = c->user;
    node_streams *s = n->streams;
    Kv__StreamStatusRequest *req = kv__stream_status_request__unpack(NULL, len, body);
    if (!req)
        return rpc_fail(c, KV_INVALID_ARGUMENT, "malformed Kv__StreamStatusRequest body");
    pthread_mutex_lock(&s->mu);
    Kv__StreamProgress *ps = calloc(s->njobs ? s->njobs : 1, sizeof(*ps));
    Kv__StreamProgress **ptrs = calloc(s->njobs ? s->njobs : 1, sizeof(*ptrs));
    Kv__StreamStatusReply rep = KV__STREAM_STATUS_REPLY__INIT;
    kv_err rv = ps && ptrs ? KV_OK : rpc_fail(c, KV_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; rv == KV_OK && i < s->njobs;) {
        if (!wanted(req, s->jobs[i]->st.job->id)) {
            i++;
        } else if (req->cancel && s->jobs[i]->state != JOB_RUNNING) {
            KV_INFO("stream", "job %s cancelled", s->jobs[i]->st.job->id);
            drop_job(s, i);
        } else if (req->cancel) { /* running: the job thread drops it after the chunk */
            KV_INFO("stream", "job %s cancelled", s->jobs[i]->st.job->id);
            s->jobs[i]->cancelled = true;
            i++;
        } else {
            fill_progress(s->jobs[i], &ps[rep.n_streams]);
            ptrs[rep.n_streams] = &ps[rep.n_streams];
            rep.n_streams++;
            i++;
        }
    }
    if (rv == KV_OK && req->cancel)
        save(s);
    rep.streams = ptrs;
    if (rv == KV_OK)
        rv = rpc_reply_msg(c, &rep.base);
    pthread_mutex_unlock(&s->mu);
    free(ps);
    free(ptrs);
    kv__stream_status_request__free_unpacked(req, NULL);
    return rv;
}

void node_streams_map_changed(node *n)
{
    node_streams *s = n->streams;
    cmap *m = cmap_slot_get(n->maps);
    uint64_t e = m ? cmap_epoch(m) : 0;
    bool tr = m && cmap_transition(m);
    pthread_mutex_lock(&s->mu);
    bool changed = false;
    for (size_t i = 0; i < s->njobs;) {
        uint64_t je = s->jobs[i]->st.job->epoch;
        bool keep = je == 0 || je > e || (tr && je == e);
        if (!keep && s->jobs[i]->state == JOB_RUNNING)
            s->jobs[i]->cancelled = true;
        if (keep || s->jobs[i]->state == JOB_RUNNING) {
            i++;
            continue;
        }
        if (s->jobs[i]->state != JOB_DONE)
            KV_INFO("stream", "job %s dropped: its transition (epoch %llu) is over",
                    s->jobs[i]->st.job->id, (unsigned long long)je);
        drop_job(s, i);
        changed = true;
    }
    if (changed)
        save(s);
    pthread_mutex_unlock(&s->mu);
    cmap_unref(m);
}
