/* Persistent worker threads for the CPU backend (see threadpool.h). Workers spin briefly after
 * a job before sleeping, so back-to-back small dispatches (decode, M = 1) do not pay a futex
 * wake-up each time. */
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <pthread.h>

#include "base/threadpool.h"

#define SPIN_ROUNDS 20000

struct tj_pool {
    int nworkers;
    pthread_t *tids;
    pthread_mutex_t run_lock; /* held by the caller whose job owns the workers */
    pthread_mutex_t lock;     /* guards the job's membership: closed, joined, inflight */
    pthread_cond_t wake, done;
    atomic_uint_fast64_t gen;  /* bumped for each job (and for shutdown) */
    int stop;
    /* current job */
    tj_pool_fn fn;
    void *arg;
    int64_t n;
    int want;                 /* workers that may join */
    int joined;               /* workers that joined this job */
    int inflight;             /* joined workers still draining */
    int closed;               /* the caller ran out of items: late workers stay out */
    atomic_int_fast64_t next;
};

static void drain(tj_pool *p)
{
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n) break;
        p->fn(p->arg, i);
    }
}

/* A worker joins a job only while it is open, so the caller never waits for a worker that was
 * asleep or descheduled (common on a loaded machine): it runs the items itself and waits only for
 * workers already inside. */
static void *worker(void *vp)
{
    tj_pool *p = vp;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int s = 0; g == seen && s < SPIN_ROUNDS; s++) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        pthread_mutex_lock(&p->lock);
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen && !p->stop)
            pthread_cond_wait(&p->wake, &p->lock);
        seen = g;
        if (p->stop) {
            pthread_mutex_unlock(&p->lock);
            return NULL;
        }
        int join = !p->closed && p->joined < p->want;
        if (join) {
            p->joined++;
            p->inflight++;
        }
        pthread_mutex_unlock(&p->lock);
        if (!join) continue;
        drain(p);
        pthread_mutex_lock(&p->lock);
        if (--p->inflight == 0 && p->closed) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->lock);
    }
}

tj_status tj_pool_create(int threads, tj_pool **out, tj_error *err)
{
    *out = NULL;
    if (threads < 1) threads = 1;
    tj_pool *p = calloc(1, sizeof *p);
    if (!p) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
    p->nworkers = threads - 1;
    p->tids = calloc((size_t)threads, sizeof *p->tids);
    if (!p->tids) { free(p); return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "thread pool: out of memory"); }
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->next, 0);
    p->closed = 1;
    for (int i = 0; i < p->nworkers; i++) {
        if (pthread_create(&p->tids[i], NULL, worker, p) != 0) {
            p->nworkers = i;
            tj_pool_destroy(p);
            return tj_fail(err, TJ_ERR_INTERNAL, "thread pool: cannot start worker thread %d of %d", i + 1, threads - 1);
        }
    }
    *out = p;
    return TJ_OK;
}

void tj_pool_destroy(tj_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    atomic_fetch_add(&p->gen, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nworkers; i++) pthread_join(p->tids[i], NULL);
    pthread_mutex_destroy(&p->run_lock);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    free(p->tids);
    free(p);
}

int tj_pool_threads(const tj_pool *p) { return p ? p->nworkers + 1 : 1; }

void tj_pool_run(tj_pool *p, int threads, int64_t n, tj_pool_fn fn, void *arg)
{
    if (n <= 0) return;
    if (!p || threads == 1 || p->nworkers == 0 || n == 1 || pthread_mutex_trylock(&p->run_lock) != 0) {
        for (int64_t i = 0; i < n; i++) fn(arg, i);
        return;
    }
    int want = threads <= 0 || threads - 1 > p->nworkers ? p->nworkers : threads - 1;
    if (want > n - 1) want = (int)(n - 1);
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    p->want = want;
    p->joined = 0;
    p->inflight = 0;
    p->closed = 0;
    atomic_store(&p->next, 0);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    drain(p);
    pthread_mutex_lock(&p->lock);
    p->closed = 1;
    while (p->inflight > 0) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->run_lock);
}
