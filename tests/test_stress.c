/* Runtime under load (issue 8): TJ_STRESS_THREADS threads (16) call tj_linear on one model for
 * TJ_STRESS_SECONDS (2 in the default run, 30 in suite 'stress'), each call on a random layer and
 * batch size, and every result must equal, bit for bit, what one thread computed before the
 * threads started (TJ_STRESS_TOL > 0 allows a relative error instead, for backends that may
 * reorder sums). Some calls ask for a missing layer: each thread must read its own message. The
 * resident memory at the end must be within 16 MiB of that after warm-up (no leak per call).
 * The backend comes from $TJ_TEST_BACKEND (reference by default); exit 77 when unavailable. */
#include <pthread.h>
#include <stdatomic.h>

#include "rel_common.h"

static const int64_t ms[] = {1, 3, 16, 37, 64};
#define NM (int)(sizeof ms / sizeof *ms)

static tj_model *model;
static tj_context *ctx;
static float *xs[REL_LAYERS][NM], *want[REL_LAYERS][NM];
static int64_t kk[REL_LAYERS], nn[REL_LAYERS];
static double stop_at, tol;
static atomic_long calls, mismatches, failures, bad_errors;

static int run_one(int64_t layer, int mi, float *y)
{
    int64_t xsh[2] = {ms[mi], kk[layer]}, ysh[2] = {ms[mi], nn[layer]};
    DLTensor xt = {.data = xs[layer][mi], .device = {kDLCPU, 0}, .ndim = 2, .shape = xsh, .dtype = {kDLFloat, 32, 1}};
    DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ysh, .dtype = {kDLFloat, 32, 1}};
    char name[32];
    snprintf(name, sizeof name, "blk.%d.fc", (int)layer);
    return tj_linear(model, name, &xt, &yt, NULL) == TJ_OK;
}

static void *worker(void *arg)
{
    tj_rng r = {(uint64_t)(uintptr_t)arg * 7919 + 1};
    float *y = malloc((size_t)(64 * 400) * sizeof *y);
    while (tj_now() < stop_at) {
        uint64_t pick = tj_rng_below(&r, 100);
        if (pick < 3) { /* an error path: this thread's message must be about its own call */
            char bad[48];
            snprintf(bad, sizeof bad, "missing.%llu", (unsigned long long)tj_rng_next(&r) % 100000);
            float x[4] = {0}, yy[4];
            int64_t sh[2] = {1, 4};
            DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = sh, .dtype = {kDLFloat, 32, 1}};
            DLTensor yt = {.data = yy, .device = {kDLCPU, 0}, .ndim = 2, .shape = sh, .dtype = {kDLFloat, 32, 1}};
            if (tj_linear(model, bad, &xt, &yt, NULL) != TJ_ERR_NOT_FOUND || !strstr(tj_context_error(ctx), bad))
                atomic_fetch_add(&bad_errors, 1);
            continue;
        }
        int64_t layer = (int64_t)tj_rng_below(&r, REL_LAYERS);
        int mi = (int)tj_rng_below(&r, NM);
        int64_t len = ms[mi] * nn[layer];
        for (int64_t i = 0; i < len; i++) y[i] = NAN; /* poison: unwritten elements show */
        if (!run_one(layer, mi, y)) {
            atomic_fetch_add(&failures, 1);
            continue;
        }
        int same = tol > 0 ? tj_test_relerr(y, want[layer][mi], len) <= tol
                           : memcmp(y, want[layer][mi], (size_t)len * sizeof *y) == 0;
        if (!same) atomic_fetch_add(&mismatches, 1);
        atomic_fetch_add(&calls, 1);
    }
    free(y);
    return NULL;
}

int main(void)
{
    const char *e;
    double seconds = (e = getenv("TJ_STRESS_SECONDS")) ? atof(e) : 2.0;
    int nthreads = (e = getenv("TJ_STRESS_THREADS")) ? atoi(e) : 16;
    tol = (e = getenv("TJ_STRESS_TOL")) ? atof(e) : 0.0;
    if (nthreads < 1 || nthreads > 256) nthreads = 16;
    char dir[] = "/tmp/tj_stress_XXXXXX", pat[256], wts[256];
    if (!mkdtemp(dir) || !rel_write_model(dir, pat, wts, sizeof pat)) return 1;
    tj_options opt = tj_options_default();
    opt.backend = rel_backend();
    if (tj_context_create(&opt, &ctx) != TJ_OK) {
        fprintf(stderr, "skip: backend %s: %s\n", tj_backend_name(opt.backend), tj_last_error());
        return 77;
    }
    if (tj_model_load(ctx, pat, wts, &model) != TJ_OK) {
        fprintf(stderr, "model load: %s\n", tj_context_error(ctx));
        return 1;
    }
    /* Single-threaded results first. */
    tj_rng r = {42};
    for (int l = 0; l < REL_LAYERS; l++) {
        tj_layer_info info;
        tj_model_layer_info(model, l, &info);
        kk[l] = info.k;
        nn[l] = info.n;
        for (int mi = 0; mi < NM; mi++) {
            xs[l][mi] = malloc((size_t)(ms[mi] * kk[l]) * sizeof(float));
            want[l][mi] = malloc((size_t)(ms[mi] * nn[l]) * sizeof(float));
            tj_test_fill(&r, xs[l][mi], ms[mi] * kk[l]);
            for (int64_t i = 0; i < ms[mi] * nn[l]; i++) want[l][mi][i] = NAN;
            CHECKF(run_one(l, mi, want[l][mi]), "single-thread call: %s", tj_context_error(ctx));
            CHECK(tj_test_all_finite(want[l][mi], ms[mi] * nn[l]));
        }
    }
    /* Warm-up: a short burst so per-thread state and allocator arenas exist before measuring. */
    pthread_t th[256];
    stop_at = tj_now() + (seconds > 2 ? 1.0 : 0.3);
    for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)(t + 1000));
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
    long rss0 = rel_rss_bytes();
    atomic_store(&calls, 0);
    stop_at = tj_now() + seconds;
    for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, worker, (void *)(uintptr_t)t);
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
    long rss1 = rel_rss_bytes();
    long n = atomic_load(&calls);
    printf("backend %s, %d threads, %.1f s: %ld calls (%.0f/s), %ld mismatches, %ld failures, %ld wrong error messages; "
           "RSS %.1f → %.1f MiB\n", tj_backend_name(tj_context_backend(ctx)), nthreads, seconds, n, (double)n / seconds,
           (long)atomic_load(&mismatches), (long)atomic_load(&failures), (long)atomic_load(&bad_errors),
           (double)rss0 / 1048576, (double)rss1 / 1048576);
    CHECK(n > 0);
    CHECK(atomic_load(&mismatches) == 0);
    CHECK(atomic_load(&failures) == 0);
    CHECK(atomic_load(&bad_errors) == 0);
    if (!rel_sanitized()) CHECKF(rss1 - rss0 < 16L << 20, "RSS grew by %.1f MiB", (double)(rss1 - rss0) / 1048576);
    tj_model_destroy(model);
    tj_context_destroy(ctx);
    for (int l = 0; l < REL_LAYERS; l++)
        for (int mi = 0; mi < NM; mi++) {
            free(xs[l][mi]);
            free(want[l][mi]);
        }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
