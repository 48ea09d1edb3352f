/* The measuring protocol. Child side: load one layer under one config (build), check sampled
 * rows against tj_reference_linear on fresh random data, warm up, time until a minimum duration,
 * take the median. Parent side: run the child as a fresh `tilejit __tune-measure` process with
 * a watchdog, so a crash or a hang costs one record, never the sweep. */
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

extern char **environ;

tj_tune_measure_opts tj_tune_measure_defaults(void)
{
    tj_tune_measure_opts o = {.min_time_s = 0.2, .min_reps = 5, .max_reps = 10000, .warmup_s = 0.05,
                              .threads = 0, .seed = 1, .perturb = 0};
    return o;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
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

/* Rows checked against the reference: all for small M, else the first and last 8 (edge blocks)
 * and 16 random ones. */
static int64_t pick_rows(int64_t m, tj_rng *rng, int64_t *rows)
{
    if (m <= 64) {
        for (int64_t i = 0; i < m; i++) rows[i] = i;
        return m;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < 8; i++) rows[n++] = i;
    for (int64_t i = 0; i < 16; i++) rows[n++] = 8 + (int64_t)tj_rng_below(rng, (uint64_t)(m - 16));
    for (int64_t i = m - 8; i < m; i++) rows[n++] = i;
    return n;
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
    tj_tune_measure_opts mo = o ? *o : tj_tune_measure_defaults();
    tj_pattern *pat = NULL;
    tj_st_file *st = NULL;
    tj_context *ctx = NULL;
    float *x = NULL, *y = NULL, *xs = NULL, *yref = NULL, *ysub = NULL;
    double *times = NULL;
    int64_t *rows = NULL;
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
    tj_status bs = mdl.ops->load(&mdl, &berr);
    r->build_s = tj_now() - t0;
    loaded = 1;
    if (bs != TJ_OK) {
        record_failure(r, TJ_TUNE_COMPILE_ERROR, berr.msg);
        goto done;
    }

    int64_t xn = m * l->k, yn = m * l->n;
    x = malloc((size_t)xn * sizeof *x);
    y = malloc((size_t)yn * sizeof *y);
    rows = malloc(64 * sizeof *rows);
    xs = malloc((size_t)(64 * l->k) * sizeof *xs);
    yref = malloc((size_t)(64 * l->n) * sizeof *yref);
    ysub = malloc((size_t)(64 * l->n) * sizeof *ysub);
    times = malloc((size_t)(mo.max_reps > 0 ? mo.max_reps : 1) * sizeof *times);
    if (!x || !y || !rows || !xs || !yref || !ysub || !times) {
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
    int64_t nr = pick_rows(m, &rng, rows);
    for (int64_t i = 0; i < nr; i++) {
        memcpy(xs + i * l->k, x + rows[i] * l->k, (size_t)l->k * sizeof *x);
        memcpy(ysub + i * l->n, y + rows[i] * l->n, (size_t)l->n * sizeof *y);
    }
    tj_reference_linear(l, &lw, xs, nr, yref);
    double num = 0, den = 0;
    int finite = 1;
    for (int64_t i = 0; i < nr * l->n; i++) {
        double d = (double)ysub[i] - yref[i];
        finite &= isfinite(ysub[i]);
        num += d * d;
        den += (double)yref[i] * yref[i];
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    if (!finite || !(rel <= 1e-4)) {
        char msg[256];
        snprintf(msg, sizeof msg, "output differs from the reference: relative error %.3g over %lld sampled rows%s", rel,
                 (long long)nr, finite ? "" : " (non-finite values)");
        record_failure(r, TJ_TUNE_WRONG_RESULT, msg);
        goto done;
    }

    double tw = tj_now();
    do {
        if (run_layer(&mdl, x, y, m, l, &rerr) != TJ_OK) {
            record_failure(r, TJ_TUNE_LAUNCH_ERROR, rerr.msg);
            goto done;
        }
    } while (tj_now() - tw < mo.warmup_s);
    int64_t reps = 0;
    double total = 0;
    while (reps < mo.max_reps && (reps < mo.min_reps || total < mo.min_time_s)) {
        double a = tj_now();
        if (run_layer(&mdl, x, y, m, l, &rerr) != TJ_OK) {
            record_failure(r, TJ_TUNE_LAUNCH_ERROR, rerr.msg);
            goto done;
        }
        times[reps] = tj_now() - a;
        total += times[reps++];
    }
    /* the record keeps the last TJ_TUNE_MAX_TIMES calls in order; the median uses them all */
    int keep = reps < TJ_TUNE_MAX_TIMES ? (int)reps : TJ_TUNE_MAX_TIMES;
    free(r->times);
    r->times = malloc((size_t)(keep ? keep : 1) * sizeof *r->times);
    if (!r->times) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    memcpy(r->times, times + reps - keep, (size_t)keep * sizeof *times);
    r->ntimes = keep;
    r->reps = reps;
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    r->median = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
    r->status = TJ_TUNE_OK;
done:
    if (loaded) mdl.ops->unload(&mdl);
    free(x);
    free(y);
    free(xs);
    free(yref);
    free(ysub);
    free(rows);
    free(times);
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

tj_status tj_tune_measure_child(const tj_tune_child *c, tj_tune_record *r, tj_error *err)
{
    char mbuf[32], tbuf[32], rbuf[32], xbuf[32], wbuf[32], thbuf[32], sbuf[32];
    snprintf(mbuf, sizeof mbuf, "%lld", (long long)c->m);
    snprintf(tbuf, sizeof tbuf, "%.9g", c->mo.min_time_s);
    snprintf(rbuf, sizeof rbuf, "%d", c->mo.min_reps);
    snprintf(xbuf, sizeof xbuf, "%d", c->mo.max_reps);
    snprintf(wbuf, sizeof wbuf, "%.9g", c->mo.warmup_s);
    snprintf(thbuf, sizeof thbuf, "%d", c->mo.threads);
    snprintf(sbuf, sizeof sbuf, "%llu", (unsigned long long)c->mo.seed);
    char *argv[] = {(char *)c->exe, "__tune-measure", "--pattern", (char *)c->pattern_path, "--weights",
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
    int e = posix_spawn(&pid, c->exe, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    if (e != 0) {
        close(fds[0]);
        return tj_fail(err, TJ_ERR_IO, "cannot start the measuring process '%s': %s", c->exe, strerror(e));
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
