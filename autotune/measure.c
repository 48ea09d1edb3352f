/* The measuring protocol. Child side: load one layer under one config (build), check sampled
 * rows against the reference on fresh random data, then time, both through the one harness
 * (runtime/check.c). Parent side: run the child as a fresh process of the measuring helper
 * (tilejit-measure, autotune/measure_main.c) with a watchdog, so a crash or a hang costs one
 * record, never the sweep. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "autotune/autotune.h"
#include "runtime/model.h"
#include "base/rng.h"
#include "gen/emit_cuda.h"
#include "tj_config.h"
#if TJ_HAVE_LLVM
#include "gen/emit_llvm.h"
#endif

extern char **environ;

tj_tune_measure_opts tj_tune_measure_defaults(void)
{
    tj_tune_measure_opts o = {.size = sizeof o, .min_time_s = 0.2, .min_reps = 5, .max_reps = 10000, .warmup_s = 0.05,
                              .threads = 0, .seed = 1, .perturb = 0};
    return o;
}

/* Binds one layer's tensors like model.c does for a whole pattern. */
static tj_status bind_layer(const tj_st_file *f, const char *wpath, const tj_layer *l, tj_layer_weights *lw,
                            tj_error *err)
{
    char name[1024];
    memset(lw, 0, sizeof *lw);
    snprintf(name, sizeof name, "%s.weight", l->name);
    const tj_st_tensor *t = tj_st_find(f, name);
    if (!t) return tj_fail(err, TJ_ERR_NOT_FOUND, "%s: tensor '%s' not found", wpath, name);
    if (!t->dtype_ok || t->ndim != 2 || t->shape[0] != l->n || t->shape[1] != l->k)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s' is not an F32/F16/BF16 [%lld, %lld] tensor", wpath, name,
                       (long long)l->n, (long long)l->k);
    lw->w = t->data;
    lw->wdt = t->dtype;
    snprintf(name, sizeof name, "%s.bias", l->name);
    t = tj_st_find(f, name);
    if (t && t->dtype_ok && t->ndim == 1 && t->shape[0] == l->n) {
        lw->bias = t->data;
        lw->bdt = t->dtype;
    }
    return TJ_OK;
}

static tj_tune_status record_failure(tj_tune_record *r, tj_tune_status st, const char *msg)
{
    r->status = st;
    r->median = INFINITY;
    free(r->error);
    r->error = strdup(msg);
    return st;
}

/* One timed call of the harness's loop (tj_time_calls). */
typedef struct timed_call {
    tj_model *mdl;
    const float *x;
    float *y;
    int64_t m;
    const tj_layer *l;
    tj_error err;
} timed_call;

static tj_status run_layer(tj_model *mdl, const float *x, float *y, int64_t m, const tj_layer *l, tj_error *err);

static int timed_run(void *user)
{
    timed_call *t = user;
    return run_layer(t->mdl, t->x, t->y, t->m, t->l, &t->err) != TJ_OK;
}

/* The dtype the backend computes products in, which sets the check's bound. */
static tj_dtype compute_dtype(tj_backend backend, const tj_layer *l, const char *config)
{
#if TJ_HAVE_LLVM
    if (backend == TJ_BACKEND_CPU) { /* bf16 activations or bf16-stored weights: the bf16 bound */
        tj_cpu_config c;
        tj_error e;
        if (config && tj_cpu_config_from_json(config, &c, &e) == TJ_OK &&
            (c.dtype == TJ_CPU_ACT_BF16 || c.out == TJ_CPU_ACT_BF16 || c.weights == TJ_CPU_WEIGHTS_BF16))
            return TJ_BF16;
        return TJ_F32;
    }
#endif
    if (backend != TJ_BACKEND_CUDA) return TJ_F32;
    tj_cuda_config c = tj_cuda_config_default(l);
    tj_error e;
    if (config && tj_cuda_config_from_json(config, &c, &e) != TJ_OK) return TJ_F16;
    return c.dtype;
}

static tj_status run_layer(tj_model *mdl, const float *x, float *y, int64_t m, const tj_layer *l, tj_error *err)
{
    int64_t xs[2] = {m, l->k}, ys[2] = {m, l->n};
    DLTensor xt = {.data = (void *)x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
    DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
    if (tj_linear_ex(mdl, 0, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) != TJ_OK)
        return tj_fail(err, TJ_ERR_DEVICE, "%s", tj_context_error(mdl->ctx));
    return TJ_OK;
}

tj_status tj_tune_measure_layer(const char *pattern_path, const char *weights_path, const char *layer,
                                tj_backend backend, const char *config, int64_t m,
                                const tj_tune_measure_opts *o, tj_tune_record *r, tj_error *err)
{
    tj_tune_measure_opts mo = tj_tune_measure_defaults();
    if (o && !tj_options_in(&mo, sizeof mo, o))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tj_tune_measure_opts: start from tj_tune_measure_defaults()");
    tj_pattern *pat = NULL;
    tj_st_file *st = NULL;
    tj_context *ctx = NULL;
    float *x = NULL, *y = NULL;
    int loaded = 0;
    tj_model mdl;
    memset(&mdl, 0, sizeof mdl);
    r->status = TJ_TUNE_OK;
    r->median = INFINITY;
    if (m < 1) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "M must be >= 1");
    tj_status s = tj_pattern_load(pattern_path, &pat, err);
    if (s != TJ_OK) goto done;
    const tj_layer *l = NULL;
    for (int64_t i = 0; i < pat->nlayers && !l; i++)
        if (strcmp(pat->layers[i].name, layer) == 0) l = &pat->layers[i];
    if (!l) {
        s = tj_fail(err, TJ_ERR_NOT_FOUND, "%s: no layer named '%s'", pattern_path, layer);
        goto done;
    }
    tj_layer_weights lw;
    if ((s = tj_st_open(weights_path, &st, err)) != TJ_OK) goto done;
    if ((s = bind_layer(st, weights_path, l, &lw, err)) != TJ_OK) goto done;

    tj_options opt = tj_options_default();
    opt.backend = backend;
    opt.threads = mo.threads;
    opt.tuning_log = ""; /* the config is forced below; never read a log in the child */
    if (tj_context_create(&opt, &ctx) != TJ_OK) {
        s = tj_fail(err, TJ_ERR_UNSUPPORTED, "%s", tj_last_error());
        goto done;
    }
    if ((s = tj_context_set_config(ctx, config, err)) != TJ_OK) goto done;

    /* A one-layer model over the loaded pattern: only the layer being tuned is compiled. */
    tj_pattern one = {1, (tj_layer *)l};
    mdl.ctx = ctx;
    mdl.pattern = &one;
    mdl.weights = st;
    mdl.lw = &lw;
    mdl.ops = ctx->ops;
    tj_error berr;
    tj_error_clear(&berr);
    double t0 = tj_now();
    tj_status bs = tj_model_prepare(&mdl, &berr); /* the kernel, and the dense path where it is forced */
    r->build_s = tj_now() - t0;
    loaded = 1;
    if (bs != TJ_OK) {
        record_failure(r, TJ_TUNE_COMPILE_ERROR, berr.msg);
        goto done;
    }

    int64_t xn = m * l->k, yn = m * l->n;
    x = malloc((size_t)xn * sizeof *x);
    y = malloc((size_t)yn * sizeof *y);
    if (!x || !y) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory for M = %lld", (long long)m);
        goto done;
    }
    tj_rng rng = {mo.seed * 0x9e3779b97f4a7c15ull + (uint64_t)m};
    for (int64_t i = 0; i < xn; i++) x[i] = tj_rng_uniform(&rng);
    for (int64_t i = 0; i < yn; i++) y[i] = NAN; /* poison: unwritten outputs show */
    tj_error rerr;
    if (run_layer(&mdl, x, y, m, l, &rerr) != TJ_OK) {
        record_failure(r, TJ_TUNE_LAUNCH_ERROR, rerr.msg);
        goto done;
    }
    if (mo.perturb) y[yn / 2] += 1.0f + fabsf(y[yn / 2]);
    double rel = INFINITY;
    if ((s = tj_model_check(&mdl, 0, x, y, m, tj_rng_next(&rng), &rel)) != TJ_OK) {
        s = tj_fail(err, s, "out of memory checking M = %lld", (long long)m);
        goto done;
    }
    double bound = tj_check_bound(compute_dtype(backend, l, config));
    if (!(rel <= bound)) {
        char msg[256];
        snprintf(msg, sizeof msg, "output differs from the reference: relative error %.3g over %lld sampled rows%s", rel,
                 (long long)(m <= 64 ? m : 32), isfinite(rel) ? "" : " (non-finite values)");
        record_failure(r, TJ_TUNE_WRONG_RESULT, msg);
        goto done;
    }

    /* the record keeps the last TJ_TUNE_MAX_TIMES calls in order; the median uses them all */
    tj_time_options to = tj_time_options_default();
    to.warmup_s = mo.warmup_s;
    to.min_time_s = mo.min_time_s;
    to.min_reps = mo.min_reps;
    to.max_reps = mo.max_reps > 0 ? mo.max_reps : 1;
    to.batch = 1;
    timed_call tc = {.mdl = &mdl, .x = x, .y = y, .m = m, .l = l};
    tj_timing tm;
    free(r->times);
    r->times = malloc(TJ_TUNE_MAX_TIMES * sizeof *r->times);
    if (!r->times) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    tj_status ts = tj_time_calls(timed_run, &tc, &to, &tm, r->times, TJ_TUNE_MAX_TIMES, &r->ntimes);
    if (ts == TJ_ERR_INTERNAL) {
        record_failure(r, TJ_TUNE_LAUNCH_ERROR, tc.err.msg);
        goto done;
    }
    if (ts != TJ_OK) {
        s = tj_fail(err, ts, "out of memory timing M = %lld", (long long)m);
        goto done;
    }
    r->reps = tm.calls;
    r->median = tm.median_s;
    r->status = TJ_TUNE_OK;
done:
    if (loaded) tj_model_unprepare(&mdl);
    free(x);
    free(y);
    tj_context_destroy(ctx);
    tj_st_close(st);
    tj_pattern_destroy(pat);
    return s;
}

/* ---- parent side ------------------------------------------------------------------------- */

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    default: return "a signal";
    }
}

const char *tj_tune_helper_path(void)
{
    const char *e = getenv("TILEJIT_MEASURE_HELPER");
    if (e && *e) return e;
    /* A library (or a test linking it statically) that lives in its build tree uses the helper
     * built beside it, so an older installed one is never mixed with a newer build. */
    Dl_info info;
    size_t n = strlen(TJ_BUILD_ROOT);
    if (dladdr((void *)tj_tune_helper_path, &info) && info.dli_fname && strncmp(info.dli_fname, TJ_BUILD_ROOT, n) == 0 &&
        info.dli_fname[n] == '/')
        return TJ_MEASURE_HELPER_BUILD;
    if (access(TJ_MEASURE_HELPER_INSTALLED, X_OK) == 0) return TJ_MEASURE_HELPER_INSTALLED;
    return TJ_MEASURE_HELPER_BUILD;
}

tj_status tj_tune_measure_child(const tj_tune_child *c, tj_tune_record *r, tj_error *err)
{
    const char *exe = c->exe ? c->exe : tj_tune_helper_path();
    char mbuf[32], tbuf[32], rbuf[32], xbuf[32], wbuf[32], thbuf[32], sbuf[32];
    snprintf(mbuf, sizeof mbuf, "%lld", (long long)c->m);
    snprintf(tbuf, sizeof tbuf, "%.9g", c->mo.min_time_s);
    snprintf(rbuf, sizeof rbuf, "%d", c->mo.min_reps);
    snprintf(xbuf, sizeof xbuf, "%d", c->mo.max_reps);
    snprintf(wbuf, sizeof wbuf, "%.9g", c->mo.warmup_s);
    snprintf(thbuf, sizeof thbuf, "%d", c->mo.threads);
    snprintf(sbuf, sizeof sbuf, "%llu", (unsigned long long)c->mo.seed);
    char *argv[] = {(char *)exe, "--pattern", (char *)c->pattern_path, "--weights",
                    (char *)c->weights_path, "--layer", (char *)c->layer, "--backend", (char *)c->backend,
                    "--m", mbuf, "--config", (char *)c->config, "--min-time", tbuf, "--min-reps", rbuf,
                    "--max-reps", xbuf, "--warmup", wbuf, "--threads", thbuf, "--seed", sbuf, NULL};
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return tj_fail(err, TJ_ERR_IO, "pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setpgroup(&attr, 0); /* its own group: the watchdog kills all of it */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    pid_t pid;
    int e = posix_spawn(&pid, exe, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    if (e != 0) {
        close(fds[0]);
        return tj_fail(err, TJ_ERR_IO, "cannot start the measuring process '%s': %s", exe, strerror(e));
    }
    /* Read everything the child says until EOF or the deadline. */
    size_t cap = 4096, len = 0;
    char *out = malloc(cap);
    double deadline = tj_now() + (c->timeout_s > 0 ? c->timeout_s : 1e9);
    int timed_out = 0;
    for (;;) {
        double left = deadline - tj_now();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd pfd = {fds[0], POLLIN, 0};
        int pr = poll(&pfd, 1, left > 1e6 ? -1 : (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) continue;
        char buf[4096];
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (out && len + (size_t)n + 1 > cap) {
            while (len + (size_t)n + 1 > cap) cap *= 2;
            char *no = realloc(out, cap);
            if (!no) {
                free(out);
                out = NULL;
            } else {
                out = no;
            }
        }
        if (out) {
            memcpy(out + len, buf, (size_t)n);
            len += (size_t)n;
        }
    }
    close(fds[0]);
    if (timed_out) kill(-pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (!out) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory reading the measuring process");
    out[len] = '\0';
    tj_status s = TJ_OK;
    char msg[512];
    /* the answer is the last line that starts with '{' */
    char *ans = NULL;
    for (char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (*p == '{') ans = p;
    if (ans) ans[strcspn(ans, "\n")] = '\0';
    if (timed_out) {
        snprintf(msg, sizeof msg, "killed by the watchdog after %.1f s", c->timeout_s);
        record_failure(r, TJ_TUNE_TIMEOUT, msg);
    } else if (WIFSIGNALED(status)) {
        snprintf(msg, sizeof msg, "measuring process died from %s (signal %d)", signal_name(WTERMSIG(status)),
                 WTERMSIG(status));
        record_failure(r, TJ_TUNE_LAUNCH_ERROR, msg);
    } else if (!ans || (WIFEXITED(status) && WEXITSTATUS(status) != 0)) {
        /* the child could not measure at all (bad inputs): the sweep stops with its message */
        size_t n = strlen(out);
        while (n && (out[n - 1] == '\n' || out[n - 1] == ' ')) out[--n] = '\0';
        s = tj_fail(err, TJ_ERR_INTERNAL, "measuring process exited with status %d: %s",
                    WIFEXITED(status) ? WEXITSTATUS(status) : -1, n ? out : "(no output)");
    } else {
        s = tj_tune_result_parse(ans, r, err);
    }
    free(out);
    return s;
}
