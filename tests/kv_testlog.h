/* SPDX-License-Identifier: MIT */
/*
 * Capturing the log lines (stderr) a piece of a test writes, to check that a
 * fault is reported and names its file: cap_begin redirects stderr to a
 * file, cap_end restores it and returns what was written (malloc'ed, also
 * copied back to stderr so the lines stay visible).
 */
#ifndef KV_TESTS_KV_TESTLOG_H
#define KV_TESTS_KV_TESTLOG_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline int cap_begin(const char *path)
{
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    dup2(fd, 2);
    close(fd);
    return saved;
}

static inline char *cap_end(int saved, const char *path)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    char *buf = calloc(1, 65536);
    size_t n = f ? fread(buf, 1, 65535, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    unlink(path);
    fputs(buf, stderr);
    return buf;
}

#endif
