/* The CPU backend's parallel loops (see threadpool.h): tilejit's own persistent worker threads,
 * or parallel regions of the process's OpenMP runtime, found with dlopen(RTLD_NOLOAD) and called
 * through its GCC entry point GOMP_parallel (which libgomp, LLVM's libomp and Intel's libiomp5
 * all export). Own workers spin briefly after a job before sleeping, so back-to-back small
 * dispatches (decode, M = 1) do not pay a futex wake-up each time. */
#include <dlfcn.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <pthread.h>
#include <unistd.h>

#include "base/threadpool.h"

#define SPIN_ROUNDS 20000

/* The process's OpenMP runtime: the entry points a pool calls, resolved once per pool. */
typedef struct omp_rt {
    void *lib;        /* a reference from dlopen(RTLD_NOLOAD): keeps it loaded while the pool lives */
    const char *name;
    void (*parallel)(void (*fn)(void *), void *data, unsigned nthreads, unsigned flags);
    int (*max_threads)(void);
    int (*in_parallel)(void);
} omp_rt;

struct tj_pool {
    omp_rt omp;       /* omp.lib set: an OpenMP pool, the fields below unused but the locks */
    int omp_threads;  /* an OpenMP pool's fixed thread count; 0: omp_get_max_threads() per run */
    int nworkers;
    pthread_t *tids;
    pthread_mutex_t run_lock; /* held by the caller whose job owns the workers */
    pthread_mutex_t lock;     /* only for sleeping: workers on wake, the caller on done */
    pthread_cond_t wake, done;
    atomic_uint_fast64_t gen; /* bumped for each job (and for shutdown) */
    atomic_uint_fast64_t state; /* the job's membership: OPEN | permits << 32 | workers inside */
    atomic_int sleepers;      /* workers asleep on wake (the caller broadcasts only then) */
    atomic_int stop;
    /* current job: written by the caller before it opens `state`, read by workers that joined */
    tj_pool_fn fn;
    void *arg;
    int64_t n;
    atomic_int_fast64_t next;
};

#define OPEN ((uint64_t)1 << 63)
#define PERMIT ((uint64_t)1 << 32)
#define INSIDE(s) ((s) & 0xffffffffu)

/* The locks and atomics of a zeroed pool, either kind. */
static void pool_init(tj_pool *p)
{
    pthread_mutex_init(&p->run_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->state, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->next, 0);
}

static void pause_once(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void drain(tj_pool *p)
{
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n) break;
        p->fn(p->arg, i);
    }
}

/* A worker joins a job only while it is open and has a permit left, so the caller never waits
 * for a worker that was asleep or descheduled (common on a loaded machine): it runs the items
 * itself and waits only for workers already inside. Joining and leaving are one atomic update of
 * `state` each (no lock on the way), and the caller spins before it sleeps: a decode-sized call
 * (M = 1, microseconds) must not pay a futex round trip. */
static int join(tj_pool *p)
{
    uint64_t s = atomic_load_explicit(&p->state, memory_order_relaxed);
    do {
        if (!(s & OPEN) || s < OPEN + PERMIT) return 0;
    } while (!atomic_compare_exchange_weak_explicit(&p->state, &s, s - PERMIT + 1, memory_order_acq_rel,
                                                    memory_order_relaxed));
    return 1;
}

static void *worker(void *vp)
{
    tj_pool *p = vp;
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int s = 0; g == seen && s < SPIN_ROUNDS; s++) {
            pause_once();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->wake, &p->lock);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->lock);
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        if (!join(p)) continue;
        drain(p);
        uint64_t s = atomic_fetch_sub_explicit(&p->state, 1, memory_order_release) - 1;
        if (INSIDE(s) == 0 && !(s & OPEN)) { /* the last one out of a closed job: the caller may sleep */
            pthread_mutex_lock(&p->lock);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

/* ---------------------------------------------------------------- the host's OpenMP runtime */

static const char *const omp_libs[] = {"libgomp.so.1", "libomp.so.5", "libomp.so", "libiomp5.so"};

static int omp_open(omp_rt *rt)
{
    for (size_t i = 0; i < sizeof omp_libs / sizeof *omp_libs; i++) {
        void *h = dlopen(omp_libs[i], RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
        if (!h) continue;
        omp_rt r = {.lib = h, .name = omp_libs[i]};
        *(void **)&r.parallel = dlsym(h, "GOMP_parallel");
        *(void **)&r.max_threads = dlsym(h, "omp_get_max_threads");
        *(void **)&r.in_parallel = dlsym(h, "omp_in_parallel");
        if (r.parallel && r.max_threads && r.in_parallel) {
            *rt = r;
            return 1;
        }
        dlclose(h);
    }
    return 0;
}

const char *tj_openmp_loaded(void)
{
    omp_rt rt;
    if (!omp_open(&rt)) return NULL;
    dlclose(rt.lib);
    return rt.name;
}

int tj_openmp_max_threads(void)
{
    omp_rt rt;
    if (!omp_open(&rt)) return 0;
    int n = rt.max_threads();
    dlclose(rt.lib);
    return n;
}

int tj_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* One run on the OpenMP team: the same dynamic claiming as the own workers. The atomics give the
 * happens-before edges (caller's inputs → team, team's outputs → caller) in tilejit's own code,
 * so a ThreadSanitizer build sees them without an instrumented OpenMP runtime. */
typedef struct omp_job {
    tj_pool_fn fn;
    void *arg;
    int64_t n;
    atomic_int ready, done;
    atomic_int_fast64_t next;
} omp_job;

static void omp_body(void *vp)
{
    omp_job *j = vp;
    (void)atomic_load_explicit(&j->ready, memory_order_acquire);
    for (;;) {
        int64_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n) break;
        j->fn(j->arg, i);
    }
    atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
}

static void omp_run(tj_pool *p, int threads, int64_t n, tj_pool_fn fn, void *arg)
{
    int t = threads > 0 ? threads : p->omp_threads > 0 ? p->omp_threads : p->omp.max_threads();
    if (t > n) t = (int)n;
    if (t <= 1 || p->omp.in_parallel() || pthread_mutex_trylock(&p->run_lock) != 0) {
        for (int64_t i = 0; i < n; i++) fn(arg, i);
        return;
    }
    omp_job j = {.fn = fn, .arg = arg, .n = n};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    atomic_store_explicit(&j.ready, 1, memory_order_release);
    p->omp.parallel(omp_body, &j, (unsigned)t, 0);
    (void)atomic_load_explicit(&j.done, memory_order_acquire);
    pthread_mutex_unlock(&p->run_lock);
}

tj_status tj_pool_create_openmp(int threads, tj_pool **out, tj_error *err)
{
    *out = NULL;
    omp_rt rt;
    if (!omp_open(&rt))
        return tj_fail(err, TJ_ERR_UNSUPPORTED, "no OpenMP runtime is loaded in this process (looked for libgomp.so.1, "
                                                "libomp.so.5, libomp.so, libiomp5.so)");
    tj_pool *p = calloc(1, sizeof *p);
    if (!p) {
        dlclose(rt.lib);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
    }
    pool_init(p);
    p->omp = rt;
    p->omp_threads = threads > 0 ? threads : 0;
    *out = p;
    return TJ_OK;
}

int tj_pool_is_openmp(const tj_pool *p) { return p && p->omp.lib; }

/* ---------------------------------------------------------------- own worker threads */

tj_status tj_pool_create(int threads, tj_pool **out, tj_error *err)
{
    *out = NULL;
    if (threads < 1) threads = 1;
    tj_pool *p = calloc(1, sizeof *p);
    if (!p) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "thread pool: out of memory");
    p->nworkers = threads - 1;
    p->tids = calloc((size_t)threads, sizeof *p->tids);
    if (!p->tids) { free(p); return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "thread pool: out of memory"); }
    pool_init(p);
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
    if (p->omp.lib) dlclose(p->omp.lib);
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
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

int tj_pool_threads(const tj_pool *p)
{
    if (!p) return 1;
    if (p->omp.lib) return p->omp_threads > 0 ? p->omp_threads : p->omp.max_threads();
    return p->nworkers + 1;
}

void tj_pool_run(tj_pool *p, int threads, int64_t n, tj_pool_fn fn, void *arg)
{
    if (n <= 0) return;
    if (p && p->omp.lib && threads != 1 && n > 1) {
        omp_run(p, threads, n, fn, arg);
        return;
    }
    if (!p || threads == 1 || p->nworkers == 0 || n == 1 || pthread_mutex_trylock(&p->run_lock) != 0) {
        for (int64_t i = 0; i < n; i++) fn(arg, i);
        return;
    }
    int want = threads <= 0 || threads - 1 > p->nworkers ? p->nworkers : threads - 1;
    if (want > n - 1) want = (int)(n - 1);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->state, OPEN | (uint64_t)want * PERMIT, memory_order_release);
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    drain(p);
    /* close: late workers stay out; wait for those inside (their results happen before) */
    uint64_t s = atomic_fetch_and_explicit(&p->state, ~OPEN, memory_order_acq_rel) & ~OPEN;
    for (int spin = 0; INSIDE(s) != 0 && spin < SPIN_ROUNDS; spin++) {
        pause_once();
        s = atomic_load_explicit(&p->state, memory_order_acquire);
    }
    if (INSIDE(s) != 0) {
        pthread_mutex_lock(&p->lock);
        while (INSIDE(atomic_load_explicit(&p->state, memory_order_acquire)) != 0) pthread_cond_wait(&p->done, &p->lock);
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&p->run_lock);
}
