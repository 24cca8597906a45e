/* SPDX-License-Identifier: MIT */
/* kvctl's view of stream jobs on the nodes (kvctl_progress.c): start them,
 * poll them, show their progress. */
#ifndef KV_CLIENT_KVCTL_STREAM_H
#define KV_CLIENT_KVCTL_STREAM_H

#include "client/kvctl.h"

typedef struct kvctl_stream {
    Kv__StreamJob job; /* borrowed strings and ranges; job.id is the stream id */
    const char *source, *target, *target_addr;
    uint64_t keys, bytes, applied, compared, est_keys, est_bytes;
    double rate;
    bool done;
    char state[16];
    char error[200];
} kvctl_stream;

typedef struct kvctl_totals {
    size_t n, done;
    uint64_t keys, bytes, applied, compared, est_bytes;
    double rate;
} kvctl_totals;

/* The stream jobs of m's open transition (pointing into m); free() the
 * array. */
kvctl_stream *kvctl_transition_streams(const cmap *m, size_t *n);
/* SIGINT/SIGTERM set a flag instead of killing kvctl (the jobs go on). */
void kvctl_catch_sigint(void);
bool kvctl_interrupted(void);
/* admin.StreamStart of every job on its target; KVCTL_OK or the failure. */
int kvctl_streams_start(kvctl_env *env, kvctl_stream *s, size_t n);
/* One admin.StreamStatus round (jobs a target does not know are started
 * again). */
void kvctl_streams_poll(kvctl_env *env, kvctl_stream *s, size_t n);
/* Polls every second until every job is DONE, printing progress. Returns
 * KVCTL_OK, or KVCTL_INTERRUPTED after Ctrl-C. */
int kvctl_streams_wait(kvctl_env *env, kvctl_stream *s, size_t n, const char *what);
void kvctl_streams_total(const kvctl_stream *s, size_t n, kvctl_totals *t);
/* Prints the jobs as a JSON array. */
void kvctl_streams_print_json(const kvctl_stream *s, size_t n);
/* 1536 -> "1.5 KiB". */
void kvctl_human(double bytes, char *out, size_t len);

#endif
