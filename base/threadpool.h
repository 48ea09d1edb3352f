/* A small persistent pthread pool for the CPU backend: one parallel-for at a time over work
 * items claimed dynamically; the calling thread takes part. Callers that find the pool busy
 * run their items alone, so concurrent dispatch never blocks on another caller's job. */
#ifndef TJ_THREADPOOL_H
#define TJ_THREADPOOL_H

#include <stdint.h>

#include "base/error.h"

typedef struct tj_pool tj_pool;
typedef void (*tj_pool_fn)(void *arg, int64_t item);

/* threads: total threads including callers (≥ 1); threads − 1 workers are started. */
tj_status tj_pool_create(int threads, tj_pool **out, tj_error *err);
void tj_pool_destroy(tj_pool *p);
int tj_pool_threads(const tj_pool *p);
/* fn(arg, i) for every i in [0, n), on at most `threads` threads (0: all). Returns when all
 * items are done. Items must be independent; the split never changes any item's result. */
void tj_pool_run(tj_pool *p, int threads, int64_t n, tj_pool_fn fn, void *arg);

#endif
