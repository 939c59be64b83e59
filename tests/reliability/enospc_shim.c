/* A full disk on demand, at the lowest level every writer shares: libc's write calls.
 *
 * Loaded with LD_PRELOAD into a test's subprocess, it makes every write(2)-family call into a
 * file whose path contains $ENOSPC_PATH fail with ENOSPC while the file $ENOSPC_TRIGGER exists
 * (the test creates it to fill the disk and deletes it to free space). Python's file objects,
 * DuckDB, polars (Rust) and safetensors all write through these calls, so each library meets
 * the error where a real full disk would give it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static int disk_full_for(int fd) {
    const char *pattern = getenv("ENOSPC_PATH");
    const char *trigger = getenv("ENOSPC_TRIGGER");
    if (!pattern || !trigger || access(trigger, F_OK) != 0) return 0;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = '\0';
    return strstr(path, pattern) != NULL;
}

#define FAIL_IF_FULL(fd) do { if (disk_full_for(fd)) { errno = ENOSPC; return -1; } } while (0)
#define NEXT(name) static __typeof__(&name) next; if (!next) next = (__typeof__(&name))dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t count) {
    NEXT(write);
    FAIL_IF_FULL(fd);
    return next(fd, buf, count);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    NEXT(pwrite);
    FAIL_IF_FULL(fd);
    return next(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    NEXT(pwrite64);
    FAIL_IF_FULL(fd);
    return next(fd, buf, count, offset);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    NEXT(writev);
    FAIL_IF_FULL(fd);
    return next(fd, iov, iovcnt);
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    NEXT(pwritev);
    FAIL_IF_FULL(fd);
    return next(fd, iov, iovcnt, offset);
}

int posix_fallocate(int fd, off_t offset, off_t len) {
    NEXT(posix_fallocate);
    if (disk_full_for(fd)) return ENOSPC;
    return next(fd, offset, len);
}

int fallocate(int fd, int mode, off_t offset, off_t len) {
    NEXT(fallocate);
    FAIL_IF_FULL(fd);
    return next(fd, mode, offset, len);
}
