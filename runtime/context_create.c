/* Creating and destroying contexts: options checked, tuning records merged, the backend chosen
 * from the registry (registry.c; TJ_BACKEND_AUTO: a usable GPU, else the CPU JIT, else the
 * reference), and every backend's per-context state released at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dense.h"
#include "runtime/context.h"
#include "runtime/registry.h"
#include "tuning/tuning.h"
#include "jit/cache.h"
#include "base/threadpool.h"

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

static tj_status resolve_backend(tj_context *c, tj_error *err)
{
    if (c->opt.backend != TJ_BACKEND_AUTO) {
        const tj_backend_ops *ops = tj_registry_find(c->opt.backend);
        if (!ops)
            return tj_fail(err, TJ_ERR_UNSUPPORTED, "backend '%s' is not built into this tilejit (%s)",
                           tj_backend_name(c->opt.backend), tj_registry_missing_reason(c->opt.backend));
        TJ_TRY(ops->available(c, err));
        c->backend = c->opt.backend;
        c->ops = ops;
        return TJ_OK;
    }
    static const tj_backend order[] = {TJ_BACKEND_CUDA, TJ_BACKEND_CPU, TJ_BACKEND_REFERENCE};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        const tj_backend_ops *ops = tj_registry_find(order[i]);
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
    tj_context_set_error(NULL, &err);
    tj_context_destroy(c);
    return s;
}

void tj_context_destroy(tj_context *c)
{
    if (!c) return;
    size_t nb;
    const tj_backend_ops *const *all = tj_registry_all(&nb);
    for (size_t i = 0; i < nb; i++)
        if (all[i]->release) all[i]->release(c);
    tj_onednn_thread_release(); /* the dense path's per-thread objects (runtime/dense_path.c) */
    tj_sb_free(&c->log);
    pthread_mutex_destroy(&c->lock);
    free(c->cache_dir);
    free(c->tuning_log);
    free(c->config_override);
    tj_tune_db_destroy(c->tuning);
    tj_context_forget_error(c);
    free(c);
}

int tj_backend_built(tj_backend b)
{
    switch (b) {
    case TJ_BACKEND_AUTO:
    case TJ_BACKEND_REFERENCE: return 1;
    default: return tj_registry_find(b) != NULL;
    }
}
