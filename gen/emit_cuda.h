/* Stage 4 (GPU): CUDA C for one layer, from its pattern, its plan and a config; and the kernel ABI
 * that the CUDA runtime (runtime/backend_cuda.c) follows to pack data and launch what is emitted.
 *
 * THE KERNEL ABI (a contract: change it only together with templates/ and TJ_CUDA_ABI_VERSION)
 *
 * Module. One CUBIN per (layer pattern, config, arch), from the source of tj_cuda_emit(). It holds
 * up to three extern "C" kernels, all taking ONE parameter: a tj_cuda_args passed by value
 * (cuLaunchKernel(f, grid, block, smem, stream, (void *[]){&args}, NULL)).
 *   tj_tiles  every kept output feature: Y[n][m] = act(bias[n] + Σ_r Wp[r][c] · X[rows_t[r]][m])
 *   tj_fill   every pruned output feature (n ∉ cols): act(bias[n]) or act(0)
 *   tj_ew     (only when the layer has ew entries) adds the ew residual into y
 * Launch them in that order on one stream; tj_cuda_geometry() gives each launch's grid, block and
 * dynamic shared memory, and says which to skip (count 0). The kernels use no atomics: each output
 * element is written by exactly one thread of tj_tiles or tj_fill and then, at most, updated by one
 * thread of tj_ew. With an activation and ew, tj_tiles/tj_fill store the pre-activation value of
 * features that have ew entries and tj_ew applies the activation (so y must not be read between).
 * Dynamic shared memory above 48 KiB needs cuFuncSetAttribute(f,
 * CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem) before the launch.
 *
 * Device data (all device pointers; built on the host by tj_cuda_pack()):
 *   x       activations, dtype cfg.dtype (fp16/bf16 bits). Feature-major (cfg.x_fm): Xᵀ [K × ldx],
 *           element (k, m) at x[k·ldx + m]; row-major: X [M × ldx], element at x[m·ldx + k].
 *           2-byte aligned. The mma template with feature-major x needs x 16-byte aligned and
 *           ldx % 8 == 0 (the runtime runs the SIMT kernel for other views).
 *   y       output, dtype cfg.out, aligned to its element size (a slice view at any element offset
 *           is fine). Feature-major (cfg.y_fm): [N × ldy], (n, m) at y[n·ldy + m] (an even ldy and
 *           y aligned to two elements let the mma epilogue store token pairs at once); row-major:
 *           [M × ldy], at y[m·ldy + n]. Every element of the N × M output is written.
 *   w       packed tile weights, dtype cfg.dtype: exactly tj_plan_build(layer, TJ_CUDA_PACK_PAD)
 *           + tj_plan_pack_16: tile t's block at w + plan.off[t], k-major [rows_t][plan.ld[t]],
 *           Wp[r][c] = W[col(t·g + c)][rows_t[r]], columns padded with zeros to a multiple of 8.
 *           16-byte aligned.
 *   bias    fp32 [n], or NULL (no bias).
 *   cols    int32 [ncols]: kept column j → output feature; NULL when the layer keeps all n.
 *   fill_rows int32 [n_fill]: the pruned output features (those not in cols), increasing.
 *   ew_ptr  int32 [n + 1], ew_idx int32 [ew_nnz], ew_val fp32 [ew_nnz]: the ew CSR over output
 *           features (W's values at the ew positions); ew_rows int32 [n_ew_rows]: features with at
 *           least one ew entry, increasing. All NULL / 0 when the layer has no ew.
 *   m       tokens (M ≥ 1); ldx, ldy in elements. x and y must not overlap (no in-place layers).
 * tj_cuda_args_check() verifies a filled argument block against these rules before a launch.
 * Baked into the module (not arguments): tile order (heaviest first), per-item metadata
 * (tj_items: packed-block offset, ld, rows, first feature, width) and every tile's kept-row
 * indices (cfg.offsets: a __constant__ table, or immediates in code) — see templates/README.md.
 *
 * Grid. tj_tiles: 1-D, any number of blocks from 1 to its work (templates for which
 * tj_cuda_template_persistent says so; others exactly the work), nitems × ceil(M / bm) work items
 * (tj_cuda_tiles_work): work item w is item w / mblocks (items heaviest first: most kept rows,
 * each = bn features of one tile) and tokens (w % mblocks)·bm … +bm; block b takes w = b,
 * b + gridDim.x, … (a static schedule, no atomics). tj_cuda_geometry gives the full grid, one
 * item per block; the runtime launches tj_cuda_tiles_grid_limit blocks (SMs × resident blocks per
 * SM) unless TILEJIT_CUDA_GRID=full. tj_fill / tj_ew: 1-D, n_fill (n_ew_rows) × ceil(M / 256)
 * blocks of 256.
 */
#ifndef TJ_EMIT_CUDA_H
#define TJ_EMIT_CUDA_H

#include <stdint.h>
#include <stdio.h>

#include "base/dtype.h"
#include "pattern/pattern.h"
#include "gen/plan.h"
#include "base/strbuf.h"

#define TJ_CUDA_ABI_VERSION 1
/* Bumped whenever emitted source may change for the same inputs (part of the cache key). */
#define TJ_CUDA_GEN_VERSION "tilejit-cuda-gen-4"
#define TJ_CUDA_PACK_PAD 8      /* tj_plan pad of the packed weights (16 bytes of halves) */
#define TJ_CUDA_AUX_THREADS 256 /* block size of tj_fill and tj_ew */
#define TJ_CUDA_MAX_LAUNCHES 3

typedef enum tj_cuda_template {
    TJ_CUDA_TEMPLATE_SIMT = 0, /* plainly correct fp32 SIMT math: the GPU yardstick */
    TJ_CUDA_TEMPLATE_MMA,      /* mma.sync m16n8k16 + ldmatrix + cp.async multi-stage pipeline */
    TJ_CUDA_TEMPLATE_WGMMA     /* sm_90a only: wgmma m64nNk16 + mbarrier/cp.async.bulk pipeline; bn 64,
                                * 4 warps (one warpgroup), bm 64 or 128, feature-major x */
} tj_cuda_template;

typedef enum tj_cuda_offsets {
    TJ_CUDA_OFFSETS_TABLE = 0, /* kept-row indices in a __constant__ table (default) */
    TJ_CUDA_OFFSETS_UNROLLED   /* immediates in straight-line code, 4 (or 2) per 64-bit word */
} tj_cuda_offsets;

/* One point of the search space. JSON (tj_cuda_config_to_json / _from_json), e.g.
 * {"template":"mma","bm":128,"bn":128,"bk":32,"warps":8,"stages":3,"offsets":"table",
 *  "dtype":"f16","out":"f32","layout":"fm"}
 * layout: "fm" (x [K × M], y [N × M]), "rm" (x [M × K], y [M × N]), "rm_fm" (row-major x,
 * feature-major y: the first layer), "fm_rm" (feature-major x, row-major y: the last). */
typedef struct tj_cuda_config {
    tj_cuda_template tmpl;
    int bm;      /* tokens per block: power of 2 in [16, 256] (simt: [1, threads]) */
    int bn;      /* features per block: power of 2 in [16, 256]; a tile is cut in ceil(g / bn) items */
    int bk;      /* kept rows per chunk: 16, 32 or 64 */
    int warps;   /* warps per block: 1, 2, 4, 8 or 16 */
    int stages;  /* mma: shared-memory pipeline depth, 2..6 (simt: ignored, 1) */
    tj_cuda_offsets offsets;
    tj_dtype dtype; /* x and w: TJ_F16 or TJ_BF16 */
    tj_dtype out;   /* y: TJ_F32, TJ_F16 or TJ_BF16 */
    int x_fm, y_fm; /* 1: feature-major */
} tj_cuda_config;

/* An arch-specific compile target (sm_90a: the wgmma template) is written sm | this flag, e.g.
 * 90 | TJ_CUDA_SM_ARCH_SPECIFIC; tj_cuda_arch_name() spells it ("sm_90a"). */
#define TJ_CUDA_SM_ARCH_SPECIFIC TJ_ARCH_SPECIFIC /* tilejit/compile.h: the same flag in the public API */
static inline const char *tj_cuda_arch_name(int sm, char buf[16])
{
    snprintf(buf, 16, "sm_%d%s", sm & 0xffff, (sm & TJ_CUDA_SM_ARCH_SPECIFIC) ? "a" : "");
    return buf;
}
/* The target a config is compiled for on a device of compute capability `device_sm` (e.g. 90;
 * an arch-specific one, 90 | TJ_CUDA_SM_ARCH_SPECIFIC, stays so): the wgmma template needs
 * sm_90a; the others the device's own sm_XX. */
static inline int tj_cuda_target_sm(const tj_cuda_config *c, int device_sm)
{
    return c->tmpl == TJ_CUDA_TEMPLATE_WGMMA ? device_sm | TJ_CUDA_SM_ARCH_SPECIFIC : device_sm;
}

/* The default config for a layer (mma, table offsets, fp16 in, fp32 out, feature-major). */
tj_cuda_config tj_cuda_config_default(const tj_layer *l);
/* Checks a config against the template's constraints (and the layer's g); clear message. */
tj_status tj_cuda_config_check(const tj_cuda_config *c, tj_error *err);
/* Appends the config as one-line JSON with keys in a fixed order (deterministic). */
void tj_cuda_config_to_json(const tj_cuda_config *c, tj_strbuf *sb);
/* Parses JSON text; missing keys keep the values already in *c (start from the default). */
tj_status tj_cuda_config_from_json(const char *text, tj_cuda_config *c, tj_error *err);
/* The split of warps into warps along features × warps along tokens (mma). */
void tj_cuda_warp_split(const tj_cuda_config *c, int *warps_n, int *warps_m);
/* Dynamic shared memory of tj_tiles in bytes (0 for simt). */
int64_t tj_cuda_smem_bytes(const tj_cuda_config *c);
/* Largest dynamic shared memory per block of a real arch (80, 86, 89, 90, ...), opt-in. */
int64_t tj_cuda_arch_smem_limit(int sm);
/* Whether a config can run on compute capability `sm` (e.g. 86) with at most `smem_limit` bytes of
 * dynamic shared memory per block (a device's opt-in limit, or tj_cuda_arch_smem_limit ahead of
 * time): the wgmma template needs 9.0 (sm_90a), and tj_cuda_smem_bytes must fit. `target` names
 * the device in the messages (NULL: "sm_XX"). The one check of the runtime and of tj_compile_pattern. */
tj_status tj_cuda_config_fits_arch(const tj_cuda_config *c, int sm, int64_t smem_limit, const char *target,
                                   tj_error *err);

/* One kernel launch. */
typedef struct tj_cuda_launch {
    const char *kernel; /* "tj_tiles", "tj_fill" or "tj_ew" (static string) */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t smem;      /* dynamic shared memory, bytes */
} tj_cuda_launch;

/* The launches, in order, for M tokens: kernels with nothing to do are left out (*count may be
 * 0 when M == 0). Errors when the grid would exceed 2^31 − 1 blocks. */
tj_status tj_cuda_geometry(const tj_layer *l, const tj_cuda_config *c, int64_t m,
                           tj_cuda_launch out[TJ_CUDA_MAX_LAUNCHES], int *count, tj_error *err);

/* tj_tiles' work items for M tokens: nitems × ceil(M / bm); 0 when M ≤ 0. */
int64_t tj_cuda_tiles_work(const tj_layer *l, const tj_cuda_config *c, int64_t m);
/* 1 when the template's tj_tiles loops over work items (any grid from 1 block is valid): mma and
 * simt. A template without the loop must be launched on the full grid (tj_cuda_geometry's). */
int tj_cuda_template_persistent(tj_cuda_template t);
/* The persistent grid of tj_tiles: min(work, sm_count × blocks_per_sm) (a count ≤ 0 counts as 1),
 * so every block is resident at once and loops over its share of the work. */
uint32_t tj_cuda_persistent_grid(uint32_t work, int sm_count, int blocks_per_sm);

/* The persistent-grid rule, one definition for the runtime (runtime/backend_cuda.c) and the host
 * executor (tests/gpuexec/hx_layer.c); docs/cuda-runtime.md. TILEJIT_CUDA_GRID: "full" launches
 * one tj_tiles block per work item, a positive N at most N blocks, anything else (or unset) the
 * persistent grid. */
typedef struct tj_cuda_grid_mode {
    int full; /* "full": no persistent grid */
    int cap;  /* N > 0: at most N blocks; 0: no cap */
} tj_cuda_grid_mode;
tj_cuda_grid_mode tj_cuda_grid_mode_parse(const char *env);
/* The most blocks a tj_tiles launch of template t uses, 0 for no limit (the full grid): for a
 * persistent template, tj_cuda_persistent_grid's sm_count × blocks_per_sm (resident blocks per SM
 * from the occupancy calculator; skipped under "full" or when blocks_per_sm ≤ 0, the calculator's
 * "cannot fit"), then at most mode.cap. */
uint32_t tj_cuda_tiles_grid_limit(tj_cuda_template t, tj_cuda_grid_mode mode, int sm_count, int blocks_per_sm);
/* The blocks a tj_tiles launch runs: tj_cuda_geometry's grid of `work` blocks under `limit`. */
static inline uint32_t tj_cuda_tiles_grid(uint32_t work, uint32_t limit)
{
    return limit && work > limit ? limit : work;
}

/* The one kernel parameter. Mirrors struct tj_args in templates/prelude.cu byte for byte. */
typedef struct tj_cuda_args {
    const void *x;
    void *y;
    const void *w;
    const float *bias;
    const int32_t *cols;
    const int32_t *fill_rows;
    const int32_t *ew_ptr;
    const int32_t *ew_idx;
    const float *ew_val;
    const int32_t *ew_rows;
    int64_t ldx, ldy;
    int32_t m;
    int32_t n_fill;
    int32_t n_ew_rows;
    int32_t reserved; /* 0 */
} tj_cuda_args;
_Static_assert(sizeof(void *) == 8, "the kernel ABI assumes 64-bit pointers");
_Static_assert(sizeof(tj_cuda_args) == 112, "tj_cuda_args must match struct tj_args in prelude.cu");

/* Checks a filled tj_cuda_args against the contract above before a launch (pointers present,
 * leading dimensions, alignment, counts), so a mistake is a message instead of a fault. */
tj_status tj_cuda_args_check(const tj_layer *l, const tj_cuda_config *c, const tj_cuda_args *a, tj_error *err);

/* Host copies of the device data above (all malloc'ed; tj_cuda_host_data_free). */
typedef struct tj_cuda_host_data {
    uint16_t *w;             /* packed weights, w_elems halves of cfg.dtype */
    int64_t w_elems;
    float *bias;             /* [n] or NULL */
    int32_t *cols;           /* [ncols] or NULL */
    int64_t ncols;
    int32_t *fill_rows;      /* [n_fill] or NULL */
    int64_t n_fill;
    int32_t *ew_ptr, *ew_idx, *ew_rows; /* NULL when no ew */
    float *ew_val;
    int64_t ew_nnz, n_ew_rows;
} tj_cuda_host_data;

/* Packs one layer's weights ([n, k] of wdt) and bias ([n] of bdt, or NULL) for the kernels. */
tj_status tj_cuda_pack(const tj_layer *l, const tj_cuda_config *c, const void *w, tj_dtype wdt,
                       const void *bias, tj_dtype bdt, tj_cuda_host_data *out, tj_error *err);
void tj_cuda_host_data_free(tj_cuda_host_data *d);

/* What the emitter baked: the work items (in launch order) and the packed kept-row words.
 * Exposed for tests. */
typedef struct tj_cuda_item {
    int64_t wofs;  /* element offset of the tile's packed block */
    int32_t ld, nrows, fbase, width, wcol, cbase;
    int32_t tile;  /* not baked; for tests */
} tj_cuda_item;

typedef struct tj_cuda_layout {
    tj_cuda_item *items;
    int64_t nitems;
    uint64_t *words;   /* nchunks × words_per_chunk packed kept-row indices */
    uint32_t *bases;   /* per chunk: TJ_CUDA_OFS_WIDE, or the base of a narrow chunk (unrolled) */
    int64_t nchunks;
    int ofs_bits;      /* 16 (k ≤ 65536) or 32 */
    int words_per_chunk;
} tj_cuda_layout;
#define TJ_CUDA_OFS_WIDE 0xffffffffu

tj_status tj_cuda_layout_build(const tj_layer *l, const tj_plan *p, const tj_cuda_config *c,
                               tj_cuda_layout *out, tj_error *err);
void tj_cuda_layout_free(tj_cuda_layout *lay);
/* Kept-row index r (0 ≤ r < bk) of chunk `chunk`: the decoding the kernels do (tj_ofs_get).
 * In unrolled mode a chunk whose rows span less than 256 is narrow: a 32-bit base and one byte
 * per row, half the immediates of the 16-bit form. */
static inline int64_t tj_cuda_layout_row(const tj_cuda_layout *lay, int64_t chunk, int r)
{
    if (lay->bases[chunk] != TJ_CUDA_OFS_WIDE) /* narrow: base + 8-bit offsets, 8 per word */
        return (int64_t)lay->bases[chunk] + (int64_t)((lay->words[chunk * lay->words_per_chunk + r / 8] >> (8 * (r % 8))) & 0xff);
    int per = 64 / lay->ofs_bits;
    uint64_t w = lay->words[chunk * lay->words_per_chunk + r / per];
    return (int64_t)((w >> ((r % per) * lay->ofs_bits)) & ((1ull << lay->ofs_bits) - 1ull));
}

/* Emits the CUDA C source of one layer (malloc'ed, NUL-terminated, into *out). Deterministic:
 * the same pattern (not name) and config give byte-identical text. Templates come from the
 * library, or from $TILEJIT_TEMPLATE_DIR when set (development). */
tj_status tj_cuda_emit(const tj_layer *l, const tj_cuda_config *c, char **out, tj_error *err);

/* Template text by file name: $TILEJIT_TEMPLATE_DIR/name if that variable is set, else the
 * embedded copy. *out is malloc'ed. */
tj_status tj_cuda_template_text(const char *name, char **out, tj_error *err);

#endif
