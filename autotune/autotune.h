/* autotune/: the tuner. Stage after gen/ and runtime/: candidate configs (space.c) → build,
 * check, time in a child process (measure.c) → one JSON Lines record per measurement
 * (records.c) → merged logs and best-config lookup (db.c); search.c drives a sweep.
 *
 *   space ──► search (exhaustive | adaptive) ──► measure (child `tilejit __tune-measure`)
 *                 ▲                                   │
 *                 └──── db (resume, best so far) ◄── records (append-only JSON Lines)
 *
 * Configs travel as canonical JSON text (compact, keys sorted), the same text the backends'
 * *_config_from_json read; a config's identity is that text. */
#ifndef TJ_AUTOTUNE_H
#define TJ_AUTOTUNE_H

#include <stdint.h>

#include "../runtime/error.h"
#include "../gen/pattern.h"

#define TJ_TUNE_FORMAT "tilejit-tune"
#define TJ_TUNE_VERSION 1

/* ---- records (records.c) ----------------------------------------------------------------- */

typedef enum tj_tune_status {
    TJ_TUNE_OK = 0,
    TJ_TUNE_COMPILE_ERROR, /* code generation or JIT/NVRTC compilation failed, or config rejected */
    TJ_TUNE_LAUNCH_ERROR,  /* the kernel failed at run time, or the measuring child crashed */
    TJ_TUNE_WRONG_RESULT,  /* ran, but disagreed with tj_reference_linear: never chosen */
    TJ_TUNE_TIMEOUT        /* the watchdog killed the measuring child */
} tj_tune_status;

const char *tj_tune_status_name(tj_tune_status s);
int tj_tune_status_parse(const char *s, tj_tune_status *out); /* 1 on success */

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

void tj_tune_record_free(tj_tune_record *r);
/* Canonical JSON of a config text: compact with sorted keys; malloc'ed in *out. */
tj_status tj_tune_config_canonical(const char *json, char **out, tj_error *err);
/* One record as one JSON line (no newline), malloc'ed in *out. */
tj_status tj_tune_record_to_json(const tj_tune_record *r, char **out, tj_error *err);
/* Parses one line; `what` names it in messages ("log.jsonl:12"). */
tj_status tj_tune_record_parse(const char *line, const char *what, tj_tune_record *out, tj_error *err);
/* Appends one record as one write(2) on an O_APPEND descriptor (whole lines even when several
 * processes append to one file on a local disk), then fsyncs. Fills tool and timestamp if empty. */
tj_status tj_tune_log_append(const char *path, tj_tune_record *r, tj_error *err);
/* Calls fn for every record of a log in file order. Blank lines are skipped; a malformed line
 * (e.g. the torn last line of a killed run) is counted in *bad_lines (may be NULL) and
 * skipped, never fatal. A missing file is TJ_ERR_IO unless missing_ok. */
typedef tj_status (*tj_tune_record_fn)(void *user, const tj_tune_record *r, tj_error *err);
tj_status tj_tune_log_read(const char *path, int missing_ok, tj_tune_record_fn fn, void *user,
                           int64_t *bad_lines, tj_error *err);

/* The workload of a layer at batch m. */
void tj_tune_workload_of(const tj_layer *l, int64_t m, tj_tune_workload *out);

/* This host as a CPU target: device = /proc/cpuinfo model name, arch = machine + widest ISA. */
void tj_tune_host_target(tj_tune_target *out);

/* ---- database (db.c) --------------------------------------------------------------------- */

/* Merged records with best-config lookup. A (target device, workload, M, config) measured more
 * than once counts with the median of its ok records' medians (confirmation rounds, reruns);
 * any wrong_result excludes the config for good.
 * The best config of a group is the one with the lowest cost per token (median / M), ties
 * broken by the config text, then by M, so the choice never depends on file order. */
typedef struct tj_tune_db tj_tune_db;

tj_status tj_tune_db_create(tj_tune_db **out, tj_error *err);
void tj_tune_db_destroy(tj_tune_db *db);
tj_status tj_tune_db_add(tj_tune_db *db, const tj_tune_record *r, tj_error *err);
/* Merges a log file (missing_ok: a missing file is an empty log). */
tj_status tj_tune_db_load(tj_tune_db *db, const char *path, int missing_ok, tj_error *err);
int64_t tj_tune_db_size(const tj_tune_db *db);      /* distinct (target, workload, config) */
int64_t tj_tune_db_bad_lines(const tj_tune_db *db); /* malformed lines skipped while loading */

/* Resume: whether (target device, workload, config) is already in the db; when it is, *status
 * and *median (the first ok record's: what a search decided on, else INFINITY) say how it went. */
int tj_tune_db_find(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                    const char *config, tj_tune_status *status, double *median);
/* The cost the best-config choice uses: the median of the ok records' medians; INFINITY when
 * none is ok, the config ever gave a wrong result, or it is not in the db. */
double tj_tune_db_cost(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                       const char *config);
/* How many records (any status) the db holds for (target device, workload, config). */
int64_t tj_tune_db_records(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                           const char *config);

/* M buckets: bucket(m) = ceil(log2 m), so 1, 2, 3–4, 5–8, …, 2049–4096 … A lookup takes the
 * tuned bucket nearest to bucket(m) (ties: the larger). */
int tj_tune_m_bucket(int64_t m);

/* How a lookup matched, most specific first. */
typedef enum tj_tune_match {
    TJ_TUNE_MATCH_DEVICE_PATTERN = 0, /* same device name, same pattern hash */
    TJ_TUNE_MATCH_DEVICE_SHAPE,       /* same device, same n, k, g and density within 5 % */
    TJ_TUNE_MATCH_ARCH_PATTERN,       /* same arch family, same pattern hash */
    TJ_TUNE_MATCH_ARCH_SHAPE,
    TJ_TUNE_MATCH_NONE
} tj_tune_match;

typedef struct tj_tune_choice {
    const char *config;     /* borrowed from the db */
    double median;          /* seconds at m_tuned */
    int64_t m_tuned;
    tj_tune_match match;
    const char *device;     /* borrowed: where it was measured */
} tj_tune_choice;

const char *tj_tune_match_name(tj_tune_match m);
/* Best config for layer l at batch m (m <= 0: the largest tuned M) on backend/device/arch.
 * TJ_ERR_NOT_FOUND (err untouched) when no record applies. O(log groups). */
tj_status tj_tune_db_best(tj_tune_db *db, const char *backend, const char *device, const char *arch,
                          const tj_layer *l, int64_t m, tj_tune_choice *out);

/* For tools that build kernels without a context (tilejit bench): the best config of layer l at
 * batch m on this host's backend from the log at path (NULL or "": $TILEJIT_TUNING_LOG; neither:
 * no lookup). *config is malloc'ed, or NULL when no record applies (use the built-in default);
 * note (may be NULL) gets one line saying what was chosen and why. */
tj_status tj_tune_config_from_log(const char *path, const char *backend, const tj_layer *l, int64_t m,
                                  char **config, char *note, size_t note_cap, tj_error *err);

/* Every (backend, device, workload, M bucket) group's best, in a stable order, for
 * `tilejit tune --best`. Calls fn until it returns nonzero. */
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
tj_status tj_tune_db_each_best(tj_tune_db *db, tj_tune_best_fn fn, void *user, tj_error *err);

/* ---- search space (space.c) -------------------------------------------------------------- */

/* One axis of a space: integer or string values. */
typedef struct tj_tune_axis {
    const char *name;
    int nvals;
    const int *ivals;           /* or NULL */
    const char *const *svals;   /* when ivals is NULL */
} tj_tune_axis;

/* Facts about the target that validity rules need. */
typedef struct tj_tune_host {
    int vec;            /* CPU: floats per vector (16 AVX-512, 8 AVX2, 4 SSE/NEON, 1 scalar) */
    int vregs;          /* CPU: vector registers (32 AVX-512, 16 AVX2) */
    int sm;             /* CUDA: compute capability ×10 (80, 86, 89, 90) */
    int64_t smem_max;   /* CUDA: shared memory per block, bytes (opt-in maximum) */
    int regs_max;       /* CUDA: registers per thread */
    int64_t g;          /* the layer's tile width (CUDA: BN ≤ g, g % BN == 0) */
    int64_t kept_rows;  /* Σ over tiles of kept rows: the code size of unrolled offsets (0: unknown) */
} tj_tune_host;

/* CPU unrolled offsets emit (nv loads + mr broadcasts + mr·nv FMAs) per kept row of every tile
 * as straight-line code; LLVM needs ~1 ms per thousand such instructions and much more beyond,
 * (a 3072×768 layer at s = 0.75 took 70–140 s), so the space keeps unrolled configs only under
 * this many instructions (a few seconds of compilation). */
#define TJ_TUNE_UNROLLED_MAX_INSTR 16384

/* A space: the valid configs in canonical order, each as axis value indices and JSON. */
typedef struct tj_tune_space {
    char backend[16];
    int naxes;
    const tj_tune_axis *axes;
    int64_t count;
    int *points;        /* count × naxes value indices; NULL when the space came from a list */
    char **json;        /* count canonical config texts */
    int64_t dropped;    /* configs removed by validity rules */
    int64_t default_index; /* the built-in default's index, or -1 when not in the space */
} tj_tune_space;

/* Host facts for backend ("cpu": detected; "cuda": from an arch string like "sm_90") and layer
 * l (NULL: g = 128 and no code-size rule). */
void tj_tune_host_for(const char *backend, const char *arch, const tj_layer *l, tj_tune_host *out);
/* The valid configs of backend on host. "reference" has one config, "{}". */
tj_status tj_tune_space_build(const char *backend, const tj_tune_host *h, tj_tune_space *out,
                              tj_error *err);
/* A space from an explicit list of configs (a JSON array of objects, e.g. `tune --configs`). */
tj_status tj_tune_space_from_list(const char *backend, const char *json_array, tj_tune_space *out,
                                  tj_error *err);
void tj_tune_space_free(tj_tune_space *s);
/* Why a CUDA/CPU config is invalid on h ("" when valid): the rules as data, for tests. */
const char *tj_tune_space_why_invalid(const char *backend, const tj_tune_host *h,
                                      const tj_tune_axis *axes, const int *point);
/* Indices of configs differing from config i in exactly one axis (a space with points). */
int64_t tj_tune_space_neighbours(const tj_tune_space *s, int64_t i, int64_t *out, int64_t max);
/* Analytic cost estimate (arbitrary units, lower is better) of config i for workload w:
 * used to order candidates in the adaptive search, never to choose without measuring. */
double tj_tune_model_cost(const tj_tune_space *s, const tj_tune_host *h, int64_t i,
                          const tj_tune_workload *w, int threads);

/* ---- measurement (measure.c) ------------------------------------------------------------- */

typedef struct tj_tune_measure_opts {
    double min_time_s;   /* keep timing until this much time is spent (default 0.2 s) */
    int min_reps;        /* and at least this many calls (default 5) */
    int max_reps;        /* at most (default 10000) */
    double warmup_s;     /* warm-up time (default 0.05 s, at least one call) */
    int threads;         /* backend threads (0: all cores) */
    uint64_t seed;       /* fresh random data per measurement */
    int perturb;         /* test hook: corrupt one output element before the check */
} tj_tune_measure_opts;

tj_tune_measure_opts tj_tune_measure_defaults(void);

/* In-process measurement of one layer (the child side). Loads only that layer of the pattern
 * with its weights on backend under config, checks sampled rows against
 * tj_reference_linear on fresh random X, then times. Fills r's status, median, times, build_s
 * and error; returns TJ_OK whenever a record was produced (even for a failed config), another
 * status only when the inputs themselves are unusable. */
tj_status tj_tune_measure_layer(const char *pattern_path, const char *weights_path,
                                const char *layer, tj_backend backend, const char *config,
                                int64_t m, const tj_tune_measure_opts *o, tj_tune_record *r,
                                tj_error *err);

/* Parent side: runs `exe __tune-measure ...` as a fresh process (never fork() of a
 * multithreaded JIT) with a watchdog. A child that is killed by a signal gives launch_error,
 * one that outlives timeout_s is killed and gives timeout. r->target and r->wl must be set;
 * the rest is filled from the child's answer. */
typedef struct tj_tune_child {
    const char *exe;          /* the tilejit executable */
    const char *pattern_path, *weights_path, *layer;
    const char *backend;
    int64_t m;
    const char *config;
    double timeout_s;
    tj_tune_measure_opts mo;
} tj_tune_child;

tj_status tj_tune_measure_child(const tj_tune_child *c, tj_tune_record *r, tj_error *err);

/* The child's one line on stdout, and its parsing (shared by measure.c and cli/cmd_tune.c). */
char *tj_tune_result_to_json(const tj_tune_record *r);
tj_status tj_tune_result_parse(const char *text, tj_tune_record *r, tj_error *err);

/* ---- search (search.c) ------------------------------------------------------------------- */

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
    const char *exe;          /* the tilejit executable, for child measurements */
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
} tj_tune_opts;

tj_tune_opts tj_tune_opts_default(void);

typedef struct tj_tune_summary {
    int64_t workloads;        /* (layer, M) pairs of this shard */
    int64_t space;            /* valid configs of the largest workload space */
    int64_t measured;         /* new measurements made */
    int64_t resumed;          /* skipped because the log had them */
    int64_t failed;           /* new measurements with status != ok */
    int budget_hit;           /* stopped by budget_s */
    double seconds;
} tj_tune_summary;

tj_status tj_tune_run(const tj_tune_opts *o, tj_tune_summary *out, tj_error *err);

/* Which shard owns item `index` of a canonical order (round-robin). */
static inline int tj_tune_shard_owns(int64_t index, int shard, int nshards)
{
    return nshards <= 1 || index % nshards == shard;
}

#endif
