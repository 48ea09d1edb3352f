/* The CPU backend's parallel loops: one parallel-for at a time over work items claimed
 * dynamically; the calling thread takes part. Callers that find the pool busy run their items
 * alone, so concurrent dispatch never blocks on another caller's job. Two kinds behind one call:
 * tilejit's own persistent pthreads, or the OpenMP runtime the process already runs (PyTorch's,
 * a program built with -fopenmp), whose threads then do tilejit's work and the host's in turn
 * instead of competing for the cores (docs/threads.md). */
#ifndef TJ_THREADPOOL_H
#define TJ_THREADPOOL_H

#include <stdint.h>

#include "base/error.h"

typedef struct tj_pool tj_pool;
typedef void (*tj_pool_fn)(void *arg, int64_t item);

/* threads: total threads including callers (≥ 1); threads − 1 workers are started. */
tj_status tj_pool_create(int threads, tj_pool **out, tj_error *err);
/* A pool over the OpenMP runtime already loaded in the process (no threads of its own): each run
 * is one parallel region of the calling thread. threads 0: the calling thread's
 * omp_get_max_threads() at each run (what the host set: torch.set_num_threads, OMP_NUM_THREADS).
 * TJ_ERR_UNSUPPORTED when no OpenMP runtime is loaded (tj_openmp_loaded). */
tj_status tj_pool_create_openmp(int threads, tj_pool **out, tj_error *err);
/* Online cores. */
int tj_cpu_count(void);
/* omp_get_max_threads() of the calling thread in the process's OpenMP runtime; 0 when none is
 * loaded. */
int tj_openmp_max_threads(void);
/* The file name of the OpenMP runtime loaded in this process (libgomp.so.1, libomp.so.5,
 * libiomp5.so; only looked up, never loaded), or NULL when there is none. */
const char *tj_openmp_loaded(void);
void tj_pool_destroy(tj_pool *p);
int tj_pool_is_openmp(const tj_pool *p);
/* Threads a run with threads = 0 uses now (for an OpenMP pool of 0 threads: the calling
 * thread's omp_get_max_threads()). */
int tj_pool_threads(const tj_pool *p);
/* fn(arg, i) for every i in [0, n), on at most `threads` threads (0: the pool's). Returns when
 * all items are done. Items must be independent; the split never changes any item's result.
 * Called from inside an OpenMP parallel region, an OpenMP pool runs the items on the caller. */
void tj_pool_run(tj_pool *p, int threads, int64_t n, tj_pool_fn fn, void *arg);

#endif
