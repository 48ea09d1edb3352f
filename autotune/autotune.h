/* autotune/: the tuner. Stage after gen/ and runtime/: candidate configs (space.c) → build,
 * check, time in a child process (measure.c) → one JSON Lines record per measurement
 * (records.c) → merged logs and best-config lookup (db.c); search.c drives a sweep.
 *
 *   space ──► search (exhaustive | adaptive) ──► measure (helper tilejit-measure)
 *                 ▲                                   │
 *                 └──── db (resume, best so far) ◄── records (append-only JSON Lines)
 *
 * Configs travel as canonical JSON text (compact, keys sorted), the same text the backends'
 * *_config_from_json read; a config's identity is that text. */
#ifndef TJ_AUTOTUNE_H
#define TJ_AUTOTUNE_H

#include <stdint.h>

#include "tuning/tuning.h"

/* The option, progress and summary types of measurement and search are public: tilejit/tune.h. */

/* ---- search space (space.c) -------------------------------------------------------------- */

/* One axis of a space: integer or string values. */
typedef struct tj_tune_axis {
    const char *name;
    int nvals;
    const int *ivals;           /* or NULL */
    const char *const *svals;   /* when ivals is NULL */
    int omit_first;             /* 1: the first value is the backend's default and is left out of
                                 * the config JSON (axes added later keep older records' texts) */
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
    int64_t kept;       /* CPU: kept weights, tj_layer_kept (0: unknown), for the serial axis */
    int64_t min_m;      /* CPU: the smallest batch size tuned (0: unknown), for the serial axis */
    int act_bf16;       /* CPU: the activations are bf16 (dtype bf16 configs join the space) */
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

/* Parent side: runs the measuring helper (exe, or tj_tune_helper_path()) as a fresh process (never fork() of a
 * multithreaded JIT) with a watchdog. A child that is killed by a signal gives launch_error,
 * one that outlives timeout_s is killed and gives timeout. r->target and r->wl must be set;
 * the rest is filled from the child's answer. */
typedef struct tj_tune_child {
    const char *exe;          /* the measuring helper; NULL: tj_tune_helper_path() */
    const char *pattern_path, *weights_path, *layer;
    const char *backend;
    int64_t m;
    const char *config;
    double timeout_s;
    tj_tune_measure_opts mo;
} tj_tune_child;

tj_status tj_tune_measure_child(const tj_tune_child *c, tj_tune_record *r, tj_error *err);

/* ---- search (search.c) ------------------------------------------------------------------- */




tj_tune_opts tj_tune_opts_default(void);


tj_status tj_tune_run(const tj_tune_opts *o, tj_tune_summary *out, tj_error *err);

/* Which shard owns item `index` of a canonical order (round-robin). */
static inline int tj_tune_shard_owns(int64_t index, int shard, int nshards)
{
    return nshards <= 1 || index % nshards == shard;
}

#endif
