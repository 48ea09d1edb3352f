/* A context's state and what backends and models ask of it (context.c): per-thread errors,
 * verbose notes, the kernel cache directory, configs from tuning records. Created and destroyed
 * by context_create.c, which picks the backend from the registry (registry.c). */
#ifndef TJ_CONTEXT_H
#define TJ_CONTEXT_H

#include <pthread.h>

#include "pattern/pattern.h"
#include "base/strbuf.h"
#include "base/error.h"
#include "jit/cache.h"
#include "runtime/backend.h"

struct tj_context {
    tj_options opt;
    char *cache_dir;
    char *tuning_log;
    tj_backend backend;         /* resolved from opt.backend */
    tj_threading threading;     /* resolved from opt.threading: POOL or OPENMP */
    const tj_backend_ops *ops;
    pthread_mutex_t lock;       /* guards log and lazily created backend state */
    tj_strbuf log;
    char *config_override;      /* a config JSON every layer uses (tuner, --config), or NULL */
    int override_dense;         /* config_override is the dense path's (TJ_TUNE_DENSE_CONFIG) */
    void *tuning;               /* autotune/'s loaded tuning records, or NULL */
    void *cpu;                  /* backend_cpu.c's per-context state (thread pool, JIT) */
    void *cuda;                 /* backend_cuda.c's per-context state (driver, device) */
};

/* Thread-local last error for the public tj_context_error; c NULL: the message of a failed
 * tj_context_create (tj_last_error). */
tj_status tj_context_set_error(const tj_context *c, const tj_error *err);
/* Drops the calling thread's last error if it belongs to c (c is being destroyed). */
void tj_context_forget_error(const tj_context *c);
/* Appends a verbose note (when opt.verbose) to the context log. */
void tj_context_note(tj_context *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A backend's handle on the context's kernel cache directory (c->cache_dir), opened at its first
 * model load: under c->lock, when *opened is 0, opens it into *cache and sets *opened; its warning
 * (an unusable directory) becomes the note "BACKEND: kernel cache: ...". Fails only when out of
 * memory; the backend closes *cache when it releases its context state. */
tj_status tj_context_open_cache(tj_context *c, const char *backend, tj_cache **cache, int *opened, tj_error *err);

/* The config a backend should use for layer l at batch size m: the override if set, else the
 * best tuning record (exact device, then arch family), else NULL for the backend's built-in
 * default. `device`/`arch` name the target as the tuning records do. Borrowed from c. */
const char *tj_context_config_for(tj_context *c, const char *backend, const char *device,
                                  const char *arch, const tj_layer *l, int64_t m);
/* The same without a note, for probing many M (per-M dispatch); *m_tuned (optional): the M the
 * chosen record was measured at (0: no record). The dense path's records never answer, and a
 * forced dense path (the override) gives NULL: a backend only ever sees kernel configs. */
const char *tj_context_config_at(tj_context *c, const char *backend, const char *device, const char *arch,
                                 const tj_layer *l, int64_t m, int note, int64_t *m_tuned);
/* What the records say of layer l at batch m: 1 the dense path is faster than the best kernel
 * config, 0 it is not (or a kernel config is forced), 1 also when the dense path is forced; -1
 * no say (no log, or not both a dense and a kernel record apply). `why` gets one line. */
int tj_context_path_at(tj_context *c, const char *backend, const char *device, const char *arch, const tj_layer *l,
                       int64_t m, char *why, size_t cap);

#endif
