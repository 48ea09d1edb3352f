/* Contexts, the part backends and models use: per-thread errors, verbose notes, the kernel
 * cache directory, configs from the tuning records. Creating and destroying a context (and
 * choosing its backend) is context_create.c's, above the backends. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/context.h"
#include "tj_config.h"
#include "tuning/tuning.h"
#include "jit/cache.h"
#include "base/threadpool.h"

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

void tj_context_forget_error(const tj_context *c)
{
    if (last_error.ctx == c) last_error.ctx = NULL;
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


const char *tj_last_error(void) { return last_error.msg; }

tj_status tj_context_set_config(tj_context *c, const char *json, tj_error *err)
{
    char *copy = NULL;
    if (json && !(copy = strdup(json))) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    pthread_mutex_lock(&c->lock);
    free(c->config_override);
    c->config_override = copy;
    c->override_dense = tj_tune_config_is_dense(copy);
    pthread_mutex_unlock(&c->lock);
    return TJ_OK;
}

const char *tj_context_config_for(tj_context *c, const char *backend, const char *device,
                                  const char *arch, const tj_layer *l, int64_t m)
{
    return tj_context_config_at(c, backend, device, arch, l, m, 1, NULL);
}

/* The device and arch family records are keyed by, for backend: CPU backends name the family by
 * machine ("x86_64"); records qualify it with the ISA ("x86_64-avx512") so an AVX2 record never
 * lands on an AVX-512 host or back. */
static void record_target(const char *backend, const char **device, const char *arch, char fam[64])
{
    snprintf(fam, 64, "%s", arch ? arch : "");
    if (backend && strcmp(backend, "cpu") == 0) {
        tj_tune_target host;
        tj_tune_host_target(&host);
        if (!arch || !strchr(arch, '-')) snprintf(fam, 64, "%s", host.arch);
        static _Thread_local char dev[sizeof host.device];
        if (!*device) {
            snprintf(dev, sizeof dev, "%s", host.device);
            *device = dev;
        }
    }
}

const char *tj_context_config_at(tj_context *c, const char *backend, const char *device, const char *arch,
                                 const tj_layer *l, int64_t m, int note, int64_t *m_tuned)
{
    if (m_tuned) *m_tuned = 0;
    /* a forced dense path is no kernel config: the backend builds its default (never run) */
    if (c->config_override && c->override_dense) return NULL;
    if (c->config_override || !c->tuning || !l) return c->config_override;
    char fam[64];
    record_target(backend, &device, arch, fam);
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

int tj_context_path_at(tj_context *c, const char *backend, const char *device, const char *arch, const tj_layer *l,
                       int64_t m, char *why, size_t cap)
{
    if (cap) why[0] = '\0';
    if (c->config_override) {
        snprintf(why, cap, "forced: config %s", c->config_override);
        return c->override_dense;
    }
    if (!c->tuning || !l) return -1;
    char fam[64], line[900];
    record_target(backend, &device, arch, fam);
    pthread_mutex_lock(&c->lock);
    int r = tj_tune_db_path(c->tuning, backend, device, fam, l, m, line, sizeof line);
    pthread_mutex_unlock(&c->lock);
    if (r >= 0) snprintf(why, cap, "%s (%s)", line, c->tuning_log);
    return r;
}
