/* One layer through the host executor, as the CUDA runtime would run it: emit the source
 * (tj_cuda_emit), build the module, pack the weights (tj_cuda_pack), lay out x and y per the
 * config with exact-size buffers, launch tj_tiles / tj_fill / tj_ew per tj_cuda_geometry, and
 * compare y with the reference on the same random data. */
#ifndef TJ_HX_LAYER_H
#define TJ_HX_LAYER_H

#include "gen/emit_cuda.h"
#include "hx.h"

typedef struct tj_hx_layer_case {
    int m;          /* tokens */
    uint64_t seed;  /* data */
    int bias;       /* with a bias vector */
    int ldx_pad;    /* extra elements per x row (feature-major: rounded up to keep ldx % 8 == 0) */
    int ldy_pad;    /* extra elements per y row */
    int grid;       /* tj_tiles blocks: 0 the full grid (one work item each), else a persistent grid of
                       min(grid, work items) blocks, each looping over several items (only for
                       templates with the loop): the runtime's rule under TILEJIT_CUDA_GRID=grid
                       (tj_cuda_tiles_grid_limit) */
} tj_hx_layer_case;

typedef struct tj_hx_layer_result {
    double rel_err;     /* ‖y − ref‖ / ‖ref‖ */
    double max_err;     /* max |y − ref| / (|ref| + rms(ref)) */
    int64_t nonfinite;  /* outputs left NaN (unwritten) or infinite */
    int64_t pad_writes; /* elements of y's row padding (past M or N) that a kernel overwrote */
    int compiled;       /* the module was compiled (not found in the cache) */
    double compile_s, run_s;
    tj_hx_launch_stats stats;
} tj_hx_layer_result;

/* Runs the case. TJ_OK when every launch ran clean (the comparison is the caller's: see
 * tj_hx_layer_tolerance); otherwise the executor's reports or a build error in err. */
tj_status tj_hx_layer_run(tj_hx_exec *e, const tj_hx_build_options *bo, const tj_layer *l, const tj_cuda_config *c,
                          const tj_hx_layer_case *k, tj_hx_layer_result *res, tj_error *err);

/* Bounds of rel_err and max_err for the config's output dtype. */
void tj_hx_layer_tolerance(const tj_cuda_config *c, double *rel, double *max);

/* Points the executor's reports at the template files (as tj_cuda_template_text reads them). */
tj_status tj_hx_layer_origins(tj_hx_exec *e, tj_error *err);

#endif
