/* Shared helpers of the libFuzzer targets: hand the fuzz input to readers that take a path
 * (through a memfd, no disk), and a trap that makes a broken invariant a reported crash. */
#ifndef TJ_FUZZ_COMMON_H
#define TJ_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* A broken invariant: libFuzzer reports the input that caused it. */
#define FUZZ_ASSERT(cond)                                                                \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            __builtin_trap();                                                            \
        }                                                                                \
    } while (0)

/* Writes data into an anonymous in-memory file; *path receives "/proc/self/fd/N".
 * Returns the descriptor (close it when done) or -1. */
static inline int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t cap)
{
    int fd = memfd_create("tj_fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
