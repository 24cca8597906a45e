/* SPDX-License-Identifier: MIT */
/*
 * A TCP port for a test's listener: the kernel picks one that is free on
 * 127.0.0.1 at the moment of the call (bind to port 0, read it back, close).
 * Another process may take it before the test binds it, but unlike a port
 * derived from the pid it never collides with a listener already open.
 * Returns -1 when no socket can be bound. Any thread.
 */
#ifndef KV_TESTS_KV_TESTPORT_H
#define KV_TESTS_KV_TESTPORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

static inline int kv_test_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

#endif
