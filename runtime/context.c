/* Contexts: options, the resolved backend, cache and tuning-log locations, per-thread errors. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/model.h"
#include "tj_config.h"
#include "tuning/tuning.h"
#include "jit/cache.h"
#include "base/clock.h"
#include "base/threadpool.h"
#if TJ_HAVE_LLVM
#include "runtime/backend_cpu.h"
#endif
#if TJ_HAVE_CUDA
#include "runtime/backend_cuda.h"
#endif

/* The last error of this thread, tagged with the context it belongs to. */
static _Thread_local struct {
    const tj_context *ctx;
    char msg[TJ_ERROR_MSG_MAX];
} last_error;

const char *tj_version(void) { return TJ_VERSION; }

const char *tj_status_string(tj_status s)
{
    switch (s) {
    case TJ_OK: return "ok";
    case TJ_ERR_INVALID_ARGUMENT: return "invalid argument";
    case TJ_ERR_IO: return "I/O error";
    case TJ_ERR_FORMAT: return "bad file format";
    case TJ_ERR_NOT_FOUND: return "not found";
    case TJ_ERR_OUT_OF_MEMORY: return "out of memory";
    case TJ_ERR_UNSUPPORTED: return "unsupported";
    case TJ_ERR_COMPILE: return "compile error";
    case TJ_ERR_DEVICE: return "device error";
    default: return "internal error";
    }
}

const char *tj_backend_name(tj_backend b)
{
    switch (b) {
    case TJ_BACKEND_REFERENCE: return "reference";
    case TJ_BACKEND_CPU: return "cpu";
    case TJ_BACKEND_CUDA: return "cuda";
    default: return "auto";
    }
}

tj_options tj_options_default(void)
{
    tj_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.backend = TJ_BACKEND_AUTO;
    return o;
}

tj_status tj_context_set_error(const tj_context *c, const tj_error *err)
{
    last_error.ctx = c;
    snprintf(last_error.msg, sizeof last_error.msg, "%s", err->msg);
    return err->status;
}

const char *tj_context_error(const tj_context *c)
{
    return c && last_error.ctx == c ? last_error.msg : "";
}

void tj_context_note(tj_context *c, const char *fmt, ...)
{
    if (!c->opt.verbose) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->lock);
    tj_sb_printf(&c->log, "%s\n", line);
    pthread_mutex_unlock(&c->lock);
}

tj_status tj_context_open_cache(tj_context *c, const char *backend, tj_cache **cache, int *opened, tj_error *err)
{
    tj_status s = TJ_OK;
    char *warning = NULL;
    pthread_mutex_lock(&c->lock);
    if (!*opened) {
        s = tj_cache_open(c->cache_dir, cache, err);
        if (s == TJ_OK) {
            *opened = 1;
            warning = tj_cache_take_warning(*cache);
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (warning) tj_context_note(c, "%s: kernel cache: %s", backend, warning);
    free(warning);
    return s;
}

const char *tj_context_log(const tj_context *c) { return c && c->log.data ? c->log.data : ""; }
tj_backend tj_context_backend(const tj_context *c) { return c ? c->backend : TJ_BACKEND_AUTO; }
tj_threading tj_context_threading(const tj_context *c) { return c ? c->threading : TJ_THREADING_AUTO; }

int tj_context_threads(const tj_context *c)
{
    if (!c) return 1;
    if (c->opt.threads > 0) return c->opt.threads;
    int n = c->threading == TJ_THREADING_OPENMP ? tj_openmp_max_threads() : 0;
    return n > 0 ? n : tj_cpu_count();
}

/* opt.threading (AUTO: $TILEJIT_THREADING, else whether the process runs an OpenMP runtime now) */
static tj_status resolve_threading(tj_context *c, tj_error *err)
{
    tj_threading t = c->opt.threading;
    const char *env = getenv("TILEJIT_THREADING");
    if (t == TJ_THREADING_AUTO && env && *env && strcmp(env, "auto") != 0) {
        if (strcmp(env, "pool") == 0) t = TJ_THREADING_POOL;
        else if (strcmp(env, "openmp") == 0) t = TJ_THREADING_OPENMP;
        else return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "TILEJIT_THREADING is '%s': auto, pool or openmp", env);
    }
    if (t < TJ_THREADING_AUTO || t > TJ_THREADING_OPENMP)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "threading must be AUTO, POOL or OPENMP (got %d)", (int)t);
    const char *omp = tj_openmp_loaded();
    if (t == TJ_THREADING_OPENMP && !omp)
        return tj_fail(err, TJ_ERR_UNSUPPORTED, "threading OPENMP: no OpenMP runtime is loaded in this process "
                                                "(libgomp.so.1, libomp.so.5 or libiomp5.so)");
    c->threading = t == TJ_THREADING_AUTO ? (omp ? TJ_THREADING_OPENMP : TJ_THREADING_POOL) : t;
    if (c->threading == TJ_THREADING_OPENMP)
        tj_context_note(c, "threads: parallel regions of the process's OpenMP runtime (%s), %s", omp,
                        c->opt.threads ? "a fixed count" : "as many as omp_get_max_threads() of the calling thread");
    else
        tj_context_note(c, "threads: tilejit's own worker threads%s", omp ? "" : " (no OpenMP runtime in the process)");
    return TJ_OK;
}

static const tj_backend_ops *ops_for(tj_backend b)
{
    switch (b) {
    case TJ_BACKEND_REFERENCE: return &tj_backend_reference_ops;
#if TJ_HAVE_LLVM
    case TJ_BACKEND_CPU: return &tj_backend_cpu_ops;
#endif
#if TJ_HAVE_CUDA
    case TJ_BACKEND_CUDA: return &tj_backend_cuda_ops;
#endif
    default: return NULL;
    }
}

static tj_status resolve_backend(tj_context *c, tj_error *err)
{
    if (c->opt.backend != TJ_BACKEND_AUTO) {
        const tj_backend_ops *ops = ops_for(c->opt.backend);
        if (!ops)
            return tj_fail(err, TJ_ERR_UNSUPPORTED, "backend '%s' is not built into this tilejit (%s)",
                           tj_backend_name(c->opt.backend),
                           c->opt.backend == TJ_BACKEND_CPU ? "configured without LLVM 19"
                                                            : "configured without the CUDA toolkit");
        TJ_TRY(ops->available(c, err));
        c->backend = c->opt.backend;
        c->ops = ops;
        return TJ_OK;
    }
    static const tj_backend order[] = {TJ_BACKEND_CUDA, TJ_BACKEND_CPU, TJ_BACKEND_REFERENCE};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        const tj_backend_ops *ops = ops_for(order[i]);
        if (!ops) {
            tj_context_note(c, "auto: backend %s not built in", tj_backend_name(order[i]));
            continue;
        }
        tj_error why;
        tj_error_clear(&why);
        if (ops->available(c, &why) != TJ_OK) {
            tj_context_note(c, "auto: backend %s unavailable: %s", tj_backend_name(order[i]), why.msg);
            continue;
        }
        c->backend = order[i];
        c->ops = ops;
        tj_context_note(c, "auto: using backend %s", tj_backend_name(order[i]));
        return TJ_OK;
    }
    return tj_fail(err, TJ_ERR_INTERNAL, "no backend available");
}

tj_status tj_context_create(const tj_options *opt, tj_context **out)
{
    if (!out) return TJ_ERR_INVALID_ARGUMENT;
    *out = NULL;
    tj_context *c = calloc(1, sizeof *c);
    if (!c) return TJ_ERR_OUT_OF_MEMORY;
    tj_error err;
    tj_error_clear(&err);
    c->opt = tj_options_default();
    pthread_mutex_init(&c->lock, NULL);
    tj_sb_init(&c->log);
    tj_status s = TJ_OK;
    if (opt && !tj_options_in(&c->opt, sizeof c->opt, opt)) {
        s = tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "tj_options.size is %zu: start from tj_options_default()", opt->size);
        goto fail;
    }
    if ((int)c->opt.precision < TJ_PRECISION_AUTO || (int)c->opt.precision > TJ_PRECISION_BF16) {
        s = tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "precision %d is not TJ_PRECISION_AUTO, _F32 or _BF16", (int)c->opt.precision);
        goto fail;
    }
    if (c->opt.threads < 0) {
        s = tj_fail(&err, TJ_ERR_INVALID_ARGUMENT, "threads must be >= 0 (got %d)", c->opt.threads);
        goto fail;
    }
    s = resolve_threading(c, &err);
    if (s != TJ_OK) goto fail;
    c->cache_dir = c->opt.cache_dir ? strdup(c->opt.cache_dir) : tj_cache_default_dir() /* jit/cache.c: the one policy */;
    const char *log = c->opt.tuning_log ? c->opt.tuning_log : getenv("TILEJIT_TUNING_LOG");
    if (log && *log && !(c->tuning_log = strdup(log))) {
        s = tj_fail(&err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto fail;
    }
    c->opt.cache_dir = c->cache_dir;
    c->opt.tuning_log = c->tuning_log;
    if (c->tuning_log) { /* merged once here; tj_context_config_for looks configs up in it */
        tj_tune_db *db = NULL;
        s = tj_tune_db_create(&db, &err);
        c->tuning = db;
        if (s == TJ_OK) s = tj_tune_db_load(db, c->tuning_log, 0, &err);
        if (s != TJ_OK) goto fail;
    }
    s = resolve_backend(c, &err);
    if (s != TJ_OK) goto fail;
    *out = c;
    return TJ_OK;
fail:
    /* No context to hang the message on: keep it for the thread with a NULL tag, readable
     * through tj_context_error(NULL)'s sibling tj_last_error(). */
    last_error.ctx = NULL;
    snprintf(last_error.msg, sizeof last_error.msg, "%s", err.msg);
    tj_context_destroy(c);
    return s;
}

const char *tj_last_error(void) { return last_error.msg; }

tj_status tj_context_set_config(tj_context *c, const char *json, tj_error *err)
{
    char *copy = NULL;
    if (json && !(copy = strdup(json))) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_lock(&c->lock);
    free(c->config_override);
    c->config_override = copy;
    pthread_mutex_unlock(&c->lock);
    return TJ_OK;
}

const char *tj_context_config_for(tj_context *c, const char *backend, const char *device,
                                  const char *arch, const tj_layer *l, int64_t m)
{
    return tj_context_config_at(c, backend, device, arch, l, m, 1, NULL);
}

const char *tj_context_config_at(tj_context *c, const char *backend, const char *device, const char *arch,
                                 const tj_layer *l, int64_t m, int note, int64_t *m_tuned)
{
    if (m_tuned) *m_tuned = 0;
    if (c->config_override || !c->tuning || !l) return c->config_override;
    /* CPU backends name the family by machine ("x86_64"); records qualify it with the ISA
     * ("x86_64-avx512") so an AVX2 record never lands on an AVX-512 host or back. */
    tj_tune_target host;
    char fam[64];
    snprintf(fam, sizeof fam, "%s", arch ? arch : "");
    if (backend && strcmp(backend, "cpu") == 0) {
        tj_tune_host_target(&host);
        if (!arch || !strchr(arch, '-')) snprintf(fam, sizeof fam, "%s", host.arch);
        if (!device) device = host.device;
    }
    tj_tune_choice ch;
    pthread_mutex_lock(&c->lock);
    tj_status s = tj_tune_db_best(c->tuning, backend, device, fam, l, m, &ch);
    pthread_mutex_unlock(&c->lock);
    if (s == TJ_OK && m_tuned) *m_tuned = ch.m_tuned;
    if (!note) return s == TJ_OK ? ch.config : NULL;
    if (s != TJ_OK) {
        tj_context_note(c, "tuning: layer '%s' (M %lld): no record in %s for %s on %s / %s; built-in default",
                        l->name, (long long)m, c->tuning_log, backend, device ? device : "?", fam);
        return NULL;
    }
    tj_context_note(c, "tuning: layer '%s' (M %lld): config %s from %s (match: %s; measured on %s at M %lld: %.4f ms)",
                    l->name, (long long)m, ch.config, c->tuning_log, tj_tune_match_name(ch.match), ch.device,
                    (long long)ch.m_tuned, 1e3 * ch.median);
    return ch.config;
}

void tj_context_destroy(tj_context *c)
{
    if (!c) return;
#if TJ_HAVE_LLVM
    tj_cpu_context_release(c);
#endif
#if TJ_HAVE_CUDA
    tj_cuda_context_release(c);
#endif
    tj_sb_free(&c->log);
    pthread_mutex_destroy(&c->lock);
    free(c->cache_dir);
    free(c->tuning_log);
    free(c->config_override);
    tj_tune_db_destroy(c->tuning);
    if (last_error.ctx == c) last_error.ctx = NULL;
    free(c);
}

int tj_backend_built(tj_backend b)
{
    switch (b) {
    case TJ_BACKEND_AUTO:
    case TJ_BACKEND_REFERENCE: return 1;
    case TJ_BACKEND_CPU: return TJ_HAVE_LLVM;
    case TJ_BACKEND_CUDA: return TJ_HAVE_CUDA;
    default: return 0;
    }
}
