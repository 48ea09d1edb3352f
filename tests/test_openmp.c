/* A plain C caller that runs its own OpenMP code (built with -fopenmp): tilejit's CPU backend
 * must run its parallel loops on the caller's OpenMP runtime (threading AUTO resolves to OPENMP),
 * follow the caller's OpenMP thread count, and stay correct and thread-safe:
 * - the OpenMP pool itself: every item runs exactly once; the team is omp_get_max_threads() of
 *   the caller (omp_set_num_threads), or the fixed count; from inside a parallel region, or with
 *   one thread, the items run on the calling thread; two callers at once on one pool;
 * - tj_linear interleaved with the program's own `#pragma omp parallel` work, called from inside
 *   parallel regions (each team thread at once), and from several pthreads at once; every result
 *   equal, bit for bit, to the CPU backend on one thread and close to the reference backend; the
 *   program's own parallel work checked too.
 * Under ThreadSanitizer (TJ_SANITIZER=tsan) the program's own parallel regions are left out: the
 * OpenMP runtime is not instrumented, so TSan cannot see its hand-offs into the program's code
 * (tilejit's own regions publish their data through atomics it sees). Exit 77 without the CPU
 * backend (LLVM). */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>

#include "base/threadpool.h"
#include "rel_common.h"

/* ---------------------------------------------------------------- the pool */

#define NITEMS 997

typedef struct probe {
    atomic_int count[NITEMS];
    atomic_int team_max, team_min, off_caller; /* team sizes seen; items not on the calling thread */
    pthread_t caller;
} probe;

static void probe_item(void *vp, int64_t i)
{
    probe *p = vp;
    atomic_fetch_add(&p->count[i], 1);
    int t = omp_get_num_threads();
    int v = atomic_load(&p->team_max);
    while (t > v && !atomic_compare_exchange_weak(&p->team_max, &v, t)) {}
    v = atomic_load(&p->team_min);
    while (t < v && !atomic_compare_exchange_weak(&p->team_min, &v, t)) {}
    if (!pthread_equal(pthread_self(), p->caller)) atomic_fetch_add(&p->off_caller, 1);
    volatile double s = 0; /* a little work, so that every team thread gets items */
    for (int k = 0; k < 2000; k++) s += k * 0.5;
}

/* Runs the pool once; *team_max/min: the team sizes the items saw; returns 1 when every item ran
 * exactly once. */
static int probe_run(tj_pool *pool, int threads, int *team_max, int *team_min, int *off_caller)
{
    probe *p = calloc(1, sizeof *p);
    atomic_init(&p->team_max, 0);
    atomic_init(&p->team_min, 1 << 30);
    p->caller = pthread_self();
    tj_pool_run(pool, threads, NITEMS, probe_item, p);
    int once = 1;
    for (int i = 0; i < NITEMS; i++) once &= atomic_load(&p->count[i]) == 1;
    *team_max = atomic_load(&p->team_max);
    *team_min = atomic_load(&p->team_min);
    if (off_caller) *off_caller = atomic_load(&p->off_caller);
    free(p);
    return once;
}

static void *probe_thread(void *vp)
{
    int mx, mn;
    return (void *)(intptr_t)probe_run(vp, 0, &mx, &mn, NULL);
}

static int tsan; /* leave out the program's own parallel regions */

static void test_pool(void)
{
    tj_error err;
    CHECK(tj_openmp_loaded() != NULL);
    tj_pool *pool = NULL;
    CHECK_OK(tj_pool_create_openmp(0, &pool, &err), &err);
    if (!pool) return;
    CHECK(tj_pool_is_openmp(pool));
    int mx, mn, off;
    for (int t = 1; t <= 3; t++) { /* the team follows the caller's omp_set_num_threads */
        omp_set_num_threads(t);
        CHECK(tj_pool_threads(pool) == t);
        CHECKF(probe_run(pool, 0, &mx, &mn, &off), "omp_set_num_threads(%d): an item ran twice or never", t);
        CHECKF(mx == t && mn == t, "omp_set_num_threads(%d): team sizes %d..%d", t, mn, mx);
        if (t == 1) CHECK(off == 0);
    }
    omp_set_num_threads(3);
    CHECK(probe_run(pool, 2, &mx, &mn, NULL) && mx == 2 && mn == 2); /* a run's own limit */
    CHECK(probe_run(pool, 1, &mx, &mn, &off) && mx == 1 && off == 0);
    /* from inside a parallel region: each team thread runs its items itself */
    int bad = 0;
    if (!tsan) {
#pragma omp parallel num_threads(2) reduction(+ : bad)
        {
            int m1, m2, o;
            if (!probe_run(pool, 0, &m1, &m2, &o) || m1 != 2 || o != 0) bad++;
        }
    }
    CHECKF(bad == 0, "%d team threads' runs were not on their own thread", bad);
    /* two callers at once: each run complete (one of them may run alone) */
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, probe_thread, pool);
    for (int i = 0; i < 4; i++) {
        void *ok;
        pthread_join(th[i], &ok);
        CHECK(ok == (void *)1);
    }
    tj_pool_destroy(pool);
    /* a fixed count ignores the caller's setting */
    CHECK_OK(tj_pool_create_openmp(2, &pool, &err), &err);
    omp_set_num_threads(1);
    CHECK(pool && probe_run(pool, 0, &mx, &mn, NULL) && mx == 2 && mn == 2);
    omp_set_num_threads(2);
    tj_pool_destroy(pool);
}

/* ---------------------------------------------------------------- tj_linear with host OpenMP work */

static const int64_t ms[] = {1, 37, 200};
#define NM (int)(sizeof ms / sizeof *ms)

static int64_t kk[REL_LAYERS], nn[REL_LAYERS];
static float *xs[REL_LAYERS][NM], *want[REL_LAYERS][NM], *ref[REL_LAYERS][NM];

static int call(tj_model *m, int64_t layer, int mi, const float *x, float *y)
{
    int64_t xsh[2] = {ms[mi], kk[layer]}, ysh[2] = {ms[mi], nn[layer]};
    DLTensor xt = {.data = (void *)x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xsh, .dtype = {kDLFloat, 32, 1}};
    DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ysh, .dtype = {kDLFloat, 32, 1}};
    return tj_linear_ex(m, layer, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) == TJ_OK;
}

/* One call into a poisoned y, compared bit for bit with the one-thread result. */
static int call_same(tj_model *m, int64_t layer, int mi, float *y)
{
    int64_t len = ms[mi] * nn[layer];
    for (int64_t i = 0; i < len; i++) y[i] = NAN;
    return call(m, layer, mi, xs[layer][mi], y) && memcmp(y, want[layer][mi], (size_t)len * sizeof *y) == 0;
}

static tj_model *load(const char *pat, const char *wts, tj_backend b, int threads, tj_threading th, tj_context **ctx)
{
    tj_options opt = tj_options_default();
    opt.backend = b;
    opt.threads = threads;
    opt.threading = th;
    tj_model *m = NULL;
    if (tj_context_create(&opt, ctx) != TJ_OK) {
        fprintf(stderr, "context: %s\n", tj_last_error());
        return NULL;
    }
    if (tj_model_load(*ctx, pat, wts, &m) != TJ_OK) fprintf(stderr, "model load: %s\n", tj_context_error(*ctx));
    return m;
}

typedef struct caller {
    tj_model *m;
    int id;
    int bad;
} caller;

static void *pthread_caller(void *vp)
{
    caller *c = vp;
    float *y = malloc(200 * 400 * sizeof *y);
    for (int r = 0; r < 40; r++)
        for (int l = 0; l < REL_LAYERS; l++)
            c->bad += !call_same(c->m, l, (r + c->id + l) % NM, y);
    free(y);
    return NULL;
}

/* The program's own parallel work: v[i] = f(i) over a parallel for, checked in full. */
static int host_work(float *v, int64_t n, int round)
{
    if (tsan)
        for (int64_t i = 0; i < n; i++) v[i] = (float)((i * 7 + round) % 1000) * 0.5f;
    else {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) v[i] = (float)((i * 7 + round) % 1000) * 0.5f;
    }
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= v[i] == (float)((i * 7 + round) % 1000) * 0.5f;
    return ok;
}

static void test_linear(const char *pat, const char *wts)
{
    tj_context *c1 = NULL, *cr = NULL, *c = NULL;
    tj_model *one = load(pat, wts, TJ_BACKEND_CPU, 1, TJ_THREADING_POOL, &c1);
    tj_model *refm = load(pat, wts, TJ_BACKEND_REFERENCE, 0, TJ_THREADING_AUTO, &cr);
    tj_model *m = load(pat, wts, TJ_BACKEND_CPU, 0, TJ_THREADING_AUTO, &c);
    CHECK(one && refm && m);
    if (!one || !refm || !m) goto done;
    CHECKF(tj_context_threading(c) == TJ_THREADING_OPENMP, "threading AUTO in an OpenMP program resolved to %d",
           (int)tj_context_threading(c));
    CHECK(tj_context_threading(c1) == TJ_THREADING_POOL);
    tj_rng r = {4242};
    for (int l = 0; l < REL_LAYERS; l++) {
        tj_layer_info info;
        tj_model_layer_info(m, l, &info);
        kk[l] = info.k;
        nn[l] = info.n;
        for (int mi = 0; mi < NM; mi++) {
            int64_t len = ms[mi] * nn[l];
            xs[l][mi] = malloc((size_t)(ms[mi] * kk[l]) * sizeof(float));
            want[l][mi] = malloc((size_t)len * sizeof(float));
            ref[l][mi] = malloc((size_t)len * sizeof(float));
            tj_test_fill(&r, xs[l][mi], ms[mi] * kk[l]);
            for (int64_t i = 0; i < len; i++) want[l][mi][i] = ref[l][mi][i] = NAN;
            CHECK(call(one, l, mi, xs[l][mi], want[l][mi]) && call(refm, l, mi, xs[l][mi], ref[l][mi]));
            double e = tj_test_relerr(want[l][mi], ref[l][mi], len);
            /* bf16 weights compute in bf16 by default where the CPU has bf16 instructions */
            tj_precision pr = TJ_PRECISION_F32;
            tj_model_layer_precision(one, l, ms[mi], &pr);
            double bound = pr == TJ_PRECISION_BF16 ? tj_check_bound(TJ_BF16) : 1e-5;
            CHECKF(tj_test_all_finite(want[l][mi], len) && e < bound, "layer %d M %lld (%s): relative error %.2e to the reference",
                   l, (long long)ms[mi], tj_precision_name(pr), e);
        }
    }
    /* interleaved with the program's own parallel regions, at 1, 2 and 3 threads */
    int64_t hn = 1 << 16;
    float *hv = malloc((size_t)hn * sizeof *hv), *y = malloc(200 * 400 * sizeof *y);
    int bad_host = 0, bad_calls = 0;
    for (int round = 0; round < 60; round++) {
        omp_set_num_threads(1 + round % 3);
        bad_host += !host_work(hv, hn, round);
        for (int l = 0; l < REL_LAYERS; l++) bad_calls += !call_same(m, l, (round + l) % NM, y);
    }
    CHECKF(bad_host == 0, "%d rounds of the program's own parallel work wrong", bad_host);
    CHECKF(bad_calls == 0, "%d interleaved calls differ from the one-thread result", bad_calls);
    /* every thread of the program's team calls tj_linear at once */
    omp_set_num_threads(2);
    int bad_team = 0;
    if (!tsan) {
#pragma omp parallel num_threads(3) reduction(+ : bad_team)
        {
            float *yy = malloc(200 * 400 * sizeof *yy);
            for (int k = 0; k < 30; k++)
                for (int l = 0; l < REL_LAYERS; l++) bad_team += !call_same(m, l, (k + l + omp_get_thread_num()) % NM, yy);
            free(yy);
        }
    }
    CHECKF(bad_team == 0, "%d calls from inside a parallel region differ", bad_team);
    /* several pthreads at once (each its own OpenMP master) */
    pthread_t th[4];
    caller cs[4];
    for (int i = 0; i < 4; i++) {
        cs[i] = (caller){m, i, 0};
        pthread_create(&th[i], NULL, pthread_caller, &cs[i]);
    }
    int bad_pt = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        bad_pt += cs[i].bad;
    }
    CHECKF(bad_pt == 0, "%d calls from concurrent pthreads differ", bad_pt);
    free(hv);
    free(y);
done:
    tj_model_destroy(m);
    tj_model_destroy(refm);
    tj_model_destroy(one);
    tj_context_destroy(c);
    tj_context_destroy(cr);
    tj_context_destroy(c1);
    for (int l = 0; l < REL_LAYERS; l++)
        for (int mi = 0; mi < NM; mi++) {
            free(xs[l][mi]);
            free(want[l][mi]);
            free(ref[l][mi]);
        }
}

int main(void)
{
    unsetenv("TILEJIT_THREADING"); /* AUTO is under test */
    const char *san = getenv("TJ_SANITIZER");
    tsan = san && strcmp(san, "tsan") == 0;
    if (tsan) printf("ThreadSanitizer: the program's own parallel regions are left out\n");
    if (!tj_backend_built(TJ_BACKEND_CPU)) {
        fprintf(stderr, "skip: no CPU backend in this build\n");
        return 77;
    }
    omp_set_num_threads(2);
    test_pool();
    char dir[] = "/tmp/tj_openmp_XXXXXX", pat[256], wts[256];
    if (!mkdtemp(dir) || !rel_write_model(dir, pat, wts, sizeof pat)) return 1;
    test_linear(pat, wts);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
