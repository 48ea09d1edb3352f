/* tilejit/tune.h — tuning through the library: sweep a pattern's layers over configs at batch
 * sizes M into a JSON Lines tuning log (each config built, checked against the reference and
 * timed, in a helper process the library starts, so a crash or hang costs one record), or
 * measure one config in this process; merge logs and read best configs. The log format is in
 * docs/formats.md, the method in docs/tuning.md. To force a config instead: tj_context_set_config. */
#include "tilejit.h"
#ifndef TILEJIT_TUNE_H
#define TILEJIT_TUNE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TJ_TUNE_FORMAT "tilejit-tune"
#define TJ_TUNE_VERSION 1

/* ---- records ------------------------------------------------------------------------------ */

typedef enum tj_tune_status {
    TJ_TUNE_OK = 0,
    TJ_TUNE_COMPILE_ERROR, /* code generation or JIT/NVRTC compilation failed, or config rejected */
    TJ_TUNE_LAUNCH_ERROR,  /* the kernel failed at run time, or the measuring child crashed */
    TJ_TUNE_WRONG_RESULT,  /* ran, but disagreed with tj_reference_linear: never chosen */
    TJ_TUNE_TIMEOUT        /* the watchdog killed the measuring child */
} tj_tune_status;

TJ_API const char *tj_tune_status_name(tj_tune_status s);
TJ_API int tj_tune_status_parse(const char *s, tj_tune_status *out); /* 1 on success */

/* Where a measurement was taken. */
typedef struct tj_tune_target {
    char backend[16];   /* "cpu", "cuda", "reference" */
    char device[128];   /* exact device: CPU model name, GPU name */
    char arch[64];      /* family: "x86_64-avx512", "x86_64-avx2", "sm_90" */
    char driver[64];    /* GPU driver version ("" on CPU) */
    char compiler[64];  /* "LLVM 19.1.7", "NVRTC 13.0" */
} tj_tune_target;

/* What was measured: one layer's pattern at one batch size M. */
typedef struct tj_tune_workload {
    char layer[256];
    uint64_t pattern_hash; /* tj_layer_hash: the identity of a pattern */
    int64_t n, k, g;
    int64_t kept;          /* kept weights (density = kept / (n·k)): the shape fallback key */
    char dtype[8];         /* "f32", "f16" */
    int64_t m;
} tj_tune_workload;

/* One line of a tuning log. Failures have infinite cost: `median` is INFINITY in memory and is
 * written as the JSON string "inf" (JSON has no infinity); `status` says why. */
typedef struct tj_tune_record {
    tj_tune_target target;
    tj_tune_workload wl;
    char *config;          /* canonical JSON, malloc'ed */
    tj_tune_status status;
    double median;         /* seconds per call; INFINITY unless ok */
    double *times;         /* seconds of each timed call (at most TJ_TUNE_MAX_TIMES kept) */
    int ntimes;
    int64_t reps;          /* timed calls made (may exceed ntimes) */
    double build_s;        /* code generation + compilation seconds */
    char *error;           /* failure message, or NULL */
    char tool[32];         /* "tilejit 0.1.0" */
    char timestamp[32];    /* UTC, ISO 8601 */
} tj_tune_record;

#define TJ_TUNE_MAX_TIMES 64

TJ_API void tj_tune_record_free(tj_tune_record *r);

/* ---- logs and best configs ---------------------------------------------------------------- */

/* Merged records of one or more logs, with best-config lookup. */
typedef struct tj_tune_db tj_tune_db;

TJ_API tj_status tj_tune_db_create(tj_tune_db **out, tj_error *err);
TJ_API void tj_tune_db_destroy(tj_tune_db *db);
/* Merges a log file (missing_ok: a missing file is an empty log). */
TJ_API tj_status tj_tune_db_load(tj_tune_db *db, const char *path, int missing_ok, tj_error *err);
TJ_API int64_t tj_tune_db_size(const tj_tune_db *db);      /* distinct (target, workload, config) */
TJ_API int64_t tj_tune_db_bad_lines(const tj_tune_db *db); /* malformed lines skipped while loading */

/* Every (backend, device, workload, M bucket) group's best, in a stable order. fn returns
 * nonzero to stop. */
typedef struct tj_tune_best_row {
    const char *backend, *device, *arch, *layer;
    uint64_t pattern_hash;
    int64_t n, k, g, kept, m;
    int bucket;
    const char *config;
    double median;
    int64_t measured, failed; /* configs measured in the group, and how many failed */
} tj_tune_best_row;
typedef int (*tj_tune_best_fn)(void *user, const tj_tune_best_row *row);
TJ_API tj_status tj_tune_db_each_best(tj_tune_db *db, tj_tune_best_fn fn, void *user, tj_error *err);

/* For tools that build kernels without a context: the best config of layer l at batch m on this
 * host's backend ("cpu", "cuda") from the log at path, malloc'ed in *config (NULL when the log
 * has none); note (note_cap bytes) says how it matched. */
TJ_API tj_status tj_tune_config_from_log(const char *path, const char *backend, const tj_layer *l, int64_t m,
                                         char **config, char *note, size_t note_cap, tj_error *err);

/* ---- measuring one config ----------------------------------------------------------------- */

typedef struct tj_tune_measure_opts {
    size_t size;         /* sizeof(tj_tune_measure_opts); set by tj_tune_measure_defaults */
    double min_time_s;   /* keep timing until this much time is spent (default 0.2 s) */
    int min_reps;        /* and at least this many calls (default 5) */
    int max_reps;        /* at most (default 10000) */
    double warmup_s;     /* warm-up time (default 0.05 s, at least one call) */
    int threads;         /* backend threads (0: all cores) */
    uint64_t seed;       /* fresh random data per measurement */
    int perturb;         /* test hook: corrupt one output element before the check */
} tj_tune_measure_opts;

TJ_API tj_tune_measure_opts tj_tune_measure_defaults(void);

/* In-process measurement of one layer: loads only that layer of the pattern with its weights on
 * backend under config (JSON), checks sampled rows against the reference on fresh random X
 * (bound: tj_check_bound), then times. Fills r's status, median, times, build_s and error;
 * returns TJ_OK whenever a record was produced (even for a failed config), another status only
 * when the inputs themselves are unusable. Free r with tj_tune_record_free. */
TJ_API tj_status tj_tune_measure_layer(const char *pattern_path, const char *weights_path,
                                       const char *layer, tj_backend backend, const char *config,
                                       int64_t m, const tj_tune_measure_opts *o, tj_tune_record *r,
                                       tj_error *err);

/* The measuring helper a sweep starts per config (when tj_tune_opts.exe is NULL):
 * $TILEJIT_MEASURE_HELPER; else, for a library still in its build tree, the helper built beside
 * it; else the installed libexec/tilejit/tilejit-measure. Borrowed, static. */
TJ_API const char *tj_tune_helper_path(void);

/* ---- sweeps -------------------------------------------------------------------------------- */

typedef enum tj_tune_strategy {
    TJ_TUNE_AUTO = 0,     /* exhaustive up to 32 valid configs, else adaptive */
    TJ_TUNE_EXHAUSTIVE,
    TJ_TUNE_ADAPTIVE      /* model-ordered seeds + local search, at most max_fraction measured */
} tj_tune_strategy;

typedef struct tj_tune_progress {
    int64_t done, total;      /* measurements (this shard), including resumed ones */
    int64_t skipped;          /* of done: already in the log */
    const char *layer;
    int64_t m;
    const char *config;       /* just measured */
    tj_tune_status status;
    double median;
    int resumed;              /* this one came from the log */
    const char *best_config;  /* best so far for this workload, or NULL */
    double best_median;
    double elapsed_s, eta_s;  /* eta_s < 0: unknown */
} tj_tune_progress;

typedef struct tj_tune_opts {
    size_t size;              /* sizeof(tj_tune_opts); set by tj_tune_opts_default */
    const char *exe;          /* the measuring helper; NULL: tilejit-measure, found as tj_tune_helper_path says */
    const char *pattern_path, *weights_path;
    const char *backend;      /* "cpu", "cuda", "reference" */
    const char *arch;         /* CUDA target arch ("sm_90"); NULL: cpu host */
    const int64_t *ms;
    int nms;
    const char *log_path;
    int shard, nshards;       /* 0 ≤ shard < nshards */
    double budget_s;          /* whole sweep; 0: unlimited. Stops between measurements */
    double timeout_s;         /* watchdog per config */
    tj_tune_strategy strategy;
    double max_fraction;      /* adaptive: at most this fraction of a workload's space (0.3) */
    const char *configs_json; /* NULL: the built-in space; else a JSON array of configs */
    const char *layer_filter; /* NULL, or only the layer with this name */
    int confirm_top;          /* after a workload's search, its best few configs (3) ...     */
    int confirm_rounds;       /* ... are measured again this many interleaved rounds (3; 0: off) */
    tj_tune_measure_opts mo;
    void (*progress)(void *user, const tj_tune_progress *p);
    /* After each workload this shard searched: its best config (NULL if none ok) and how many
     * configs the search looked at (measured now or found in the log). */
    void (*workload_done)(void *user, const tj_tune_workload *w, const char *best_config, double best_median,
                          int64_t looked_at, int64_t space);
    void *progress_user;
    int dry_run;              /* plan only: count what would be measured */
    int act_bf16;             /* cpu: also search bf16-activation kernels ("dtype": "bf16") */
} tj_tune_opts;

TJ_API tj_tune_opts tj_tune_opts_default(void);

typedef struct tj_tune_summary {
    int64_t workloads;        /* (layer, M) pairs of this shard */
    int64_t space;            /* valid configs of the largest workload space */
    int64_t measured;         /* new measurements made */
    int64_t resumed;          /* skipped because the log had them */
    int64_t failed;           /* new measurements with status != ok */
    int budget_hit;           /* stopped by budget_s */
    double seconds;
} tj_tune_summary;

/* Runs a sweep: for each layer (and M of o->ms) owned by this shard, measures configs of the
 * space (each in the helper process, with o->timeout_s as watchdog) and appends one record per
 * measurement to o->log_path; resumes from what the log already holds. */
TJ_API tj_status tj_tune_run(const tj_tune_opts *o, tj_tune_summary *out, tj_error *err);

#ifdef __cplusplus
}
#endif
#endif
