/* Stage 4 for the host CPU: one layer + one config → an LLVM IR module (LLVM 19 C API).
 * The runtime (runtime/backend_cpu.c) JIT-compiles it with ORC; `tilejit gen --target cpu`
 * prints it. Kernel contract in emit_llvm.c's header comment. */
#ifndef TJ_EMIT_LLVM_H
#define TJ_EMIT_LLVM_H

#include <stdint.h>

#include "pattern/pattern.h"
#include "gen/plan.h"
#include "gen/cpu_serial.h"

/* How kept-row offsets reach the inner loop. */
typedef enum tj_cpu_offsets {
    TJ_CPU_OFFSETS_TABLE = 0,   /* a constant global i32 table, rolled loop unrolled `unroll`× */
    TJ_CPU_OFFSETS_UNROLLED = 1 /* immediates in straight-line code, one function per tile */
} tj_cpu_offsets;

/* One point of the CPU search space. JSON form (every key optional, defaults below):
 *   {"mr": 6, "nr": 64, "offsets": "table", "unroll": 4, "mb": 0, "kc": -1, "pack": -1, "order": -1, "vec": 0}
 * mr: tokens per register block (1..16; dot amx: 16 or 32); nr: features per register block, a
 * multiple of the vector width (mr · nr/vec accumulators must fit the register file, ≤ 28
 * vectors with AVX-512; dot amx: 16..64 within its 8 tiles);
 * unroll: table-loop unroll factor (1..16), or rows per chunk in unrolled mode;
 * mb: tokens per work item (0: auto, rounded to a multiple of mr) — the work split;
 * kc: kept rows per k-block (0: none; -1: auto, from the blocking table by vector width and the
 *   layer's longest tile, see tj_cpu_config_resolve; table mode with pack 0 and fp32 x only;
 *   dot amx: per staged chunk, rounded up to 32, 0 or auto: 256);
 * pack: 1 gathers each work item's X rows of the tile into a contiguous stack buffer first
 *   (mb × kept rows floats), 2 packs them into mr-token panels (xp[p][r][i], the register
 *   block's broadcasts then read one sequential stream), 0 broadcasts straight from X (table
 *   mode only); the staged X is shared by all the tile's column blocks; -1: auto, 0 unless the
 *   blocking table's rule for large calls applies (tj_cpu_config_resolve_m: X of more than
 *   pack_x_mb MB, on AVX2 hosts, takes pack 1 with mb 32);
 * order: work items tile-major (0: a tile's weights stay in cache across token chunks) or
 *   token-chunk-major (1: a chunk of X stays in L2 across tiles); -1: auto, 1 when tiles keep
 *   under 20 % of k (little work per byte of gathered X), else 0. mb auto is 48 with order 1;
 * vec: vector width in floats (0: the host's widest, 16 AVX-512, 8 AVX2, 1 scalar);
 * serial: below this much work per call (kFLOP: 2 · (M + 4) · kept weights / 1000, the 4 for
 *   streaming the weights) the layer
 *   runs on the calling thread alone, so waking workers never costs more than it gains
 *   (0: the host's built-in threshold; -1: always parallel; the rule: gen/cpu_serial.h);
 * weights: how the packed weights are stored and loaded: "f32", or "bf16" (half the bytes per
 *   kept weight; each vector load widened to fp32 in registers, fp32 accumulation: exact for
 *   bf16 checkpoints, bf16 rounding for fp32 ones); "auto" (the default): bf16 when the layer's
 *   weights are BF16, else f32;
 * dtype: the activations x: "f32", or "bf16" (x is [M × K] raw bf16; weights become bf16 too,
 *   accumulation stays fp32; each work item first stages its gathered X as with pack 1);
 * out: y as "f32" or "bf16" (rounded to nearest even once, in the epilogue and post pass);
 * dot: the bf16 inner product: "fma" (x and w widened to fp32 in registers, fp32 FMA: AVX2
 *   and up), "dpbf16" (avx512_bf16 vdpbf16ps on pairs of kept rows, vec 16: the weights are
 *   packed as row pairs, the staged X as bf16 pairs), "amx" (AMX tiles, TDPBF16PS: the weights
 *   packed as row pairs with each tile's rows padded to 32, the staged X in k-chunks of kc kept
 *   rows; mr 16 or 32 tokens and nr 16..64 features per block, at most 8 tiles: (mr/16)·(nr/16)
 *   accumulators, mr/16 for X and at least one for weights), "amx_x" (AMX tiles with x as the
 *   A operand: each block's tokens are the rows of one X tile, 1 to mr ≤ 16 of them, so a
 *   decode-sized call does a decode-sized tile product; the staged X as token rows of kept
 *   features, the weights as VNNI B tiles; nr 16..64; no k-chunks), "auto" (amx where the target CPU
 *   has AMX-BF16 and Linux granted its state, dpbf16 where it has avx512bf16, with vec 16; else
 *   fma). Only with dtype bf16. */
typedef struct tj_cpu_config {
    int mr;
    int nr;
    tj_cpu_offsets offsets;
    int unroll;
    int mb;
    int vec;
    int kc;
    int pack;
    int order;
    int serial;
    int weights; /* TJ_CPU_WEIGHTS_* */
    int dtype;   /* TJ_CPU_ACT_*: activations x */
    int out;     /* TJ_CPU_ACT_*: output y */
    int dot;     /* TJ_CPU_DOT_* */
    int prefetch; /* bytes ahead in a column block's weight stream; -1 auto (the host's rule), 0 none */
} tj_cpu_config;

enum { TJ_CPU_WEIGHTS_AUTO = 0, TJ_CPU_WEIGHTS_F32 = 1, TJ_CPU_WEIGHTS_BF16 = 2 };
enum { TJ_CPU_ACT_F32 = 0, TJ_CPU_ACT_BF16 = 1 };
enum { TJ_CPU_DOT_AUTO = 0, TJ_CPU_DOT_FMA = 1, TJ_CPU_DOT_DPBF16 = 2, TJ_CPU_DOT_AMX = 3, TJ_CPU_DOT_AMX_X = 4 };
/* 1 for the dots that run on AMX tiles (amx, amx_x) */
int tj_cpu_dot_amx(int dot);
/* The config name of a TJ_CPU_DOT_* ("auto", "fma", "dpbf16", "amx", "amx_x"). Static. */
const char *tj_cpu_dot_name(int dot);

/* Identifies this emitter build for object-cache keys: the generator's version and the build
 * time of emit_llvm.c, so a rebuilt emitter never reuses objects of an older one. Borrowed. */
const char *tj_cpu_gen_id(void);

/* The built-in default for a layer (before any tuning record). */
tj_cpu_config tj_cpu_config_default(void);
/* The same for a host of `vec` floats per vector (16, 8, 4, 1). */
tj_cpu_config tj_cpu_config_default_vec(int vec);
/* Parses JSON (NULL or "" gives the default); checks ranges. `vec` 0 is resolved later. */
tj_status tj_cpu_config_from_json(const char *json, tj_cpu_config *out, tj_error *err);
/* Canonical JSON (keys in a fixed order), malloc'ed; NULL if out of memory. */
char *tj_cpu_config_to_json(const tj_cpu_config *c);
/* Checks a config (vec resolved) for a given layer: register budget, nr multiple of vec. */
tj_status tj_cpu_config_check(const tj_cpu_config *c, tj_error *err);
/* Resolves the automatic choices (vec 0, order -1, dot auto, kc -1, pack -1: 0) of c for layer l on the host.
 * A dot amx config takes the AMX block (mr 32, nr 32) unless c's block is one; amx_x 16 × 32. */
void tj_cpu_config_resolve(tj_cpu_config *c, const tj_layer *l);
/* The same for calls of m tokens (0: unknown, so no size rule applies). The built-in choice of a bf16 config's
 * automatic dot on an AMX host: m ≤ 16 amx_x 16 × 32 (an X tile of m rows: the tile unit does
 * only the call's work), above it amx 32 × 32. An fp32 config's automatic pack (with mb auto)
 * is the blocking table's large-call rule: pack 1, mb pack_mb where m · k floats exceed its
 * pack_x_mb. (The runtime resolves its open class above TJ_M_TOP tokens as TJ_M_TOP, so that it
 * takes the kernel of the class below and no layer compiles a variant for it alone.) */
void tj_cpu_config_resolve_m(tj_cpu_config *c, const tj_layer *l, int64_t m);
/* The weight prefetch distance in bytes (0: none) for layer l, weights of weight_bytes each, on
 * LLVM CPU `cpu` with vec floats per vector, for calls of m tokens (0: any): the blocking
 * table's, unless the host's rule (Zen 3 and Zen 4, by the kept weights' size against the L3)
 * drops it. A config's "prefetch" -1 (auto) is this with m 0; tj_cpu_config_resolve_m pins it
 * where the call's size changes it. */
int tj_cpu_prefetch_for(const char *cpu, int vec, const tj_layer *l, int weight_bytes, int64_t m);
/* The host's own choice of work order (config "order") for layer l, x of x_bytes per value,
 * calls of m tokens (0: any), on LLVM CPU `cpu`: 1 or 0 where the host's rule (Zen 5, by the
 * size of X against its L2 and L3) decides, -1 where the blocking table's rule stands. */
int tj_cpu_order_for(const char *cpu, const tj_layer *l, int x_bytes, int64_t m);
/* 1 when the JSON object text names `key` (a config's explicit choice), else 0. */
int tj_cpu_config_json_has(const char *json, const char *key);
/* Tokens per work item and kept rows per k-block after resolving 0 (auto). */
int64_t tj_cpu_config_mb(const tj_cpu_config *c);
int64_t tj_cpu_config_kc(const tj_cpu_config *c);
/* The host's widest useful vector width in floats (16, 8 or 1), from LLVM's host features. */
int tj_cpu_host_vec(void);
/* Every config the tuner may pick on this host (static table); *count set. Borrowed. */
const tj_cpu_config *tj_cpu_config_space(int *count);

/* A work item's share of a tile: features [b0, b0 + width) of tile plan->order[tslot], all its
 * kept rows; cost: kept rows × width (+ width: empty tiles still run the epilogue). */
typedef struct tj_cpu_piece {
    int64_t tslot, b0, width, cost;
} tj_cpu_piece;

/* Features per piece: one column block (nr) where the kernel reads X straight (table offsets,
 * pack 0, fp32 x), so that a decode-sized call has enough equal pieces to share between threads;
 * the whole tile (INT32_MAX) where each item first stages its tile's X (pack, bf16 x) or runs a
 * tile's own function (unrolled offsets), which a piece would repeat. */
int64_t tj_cpu_config_piece(const tj_cpu_config *c);
/* The pieces of layer plan p under config c (resolved), in item order (plan->order, then
 * features): written to out (NULL: count only); returns the count. The item entry's `slot`
 * indexes this list. */
int64_t tj_cpu_pieces(const tj_plan *p, const tj_cpu_config *c, tj_cpu_piece *out);

/* Symbols and tables of an emitted layer. `prefix` makes names unique inside one JIT. */
typedef struct tj_cpu_emit_info {
    char item_name[96];  /* void item(const void *x, void *y, const void *wp,
                          *           const float *bk, int64_t slot, int64_t m0, int64_t m1):
                          * slot indexes tj_cpu_pieces */
    char post_name[96];  /* void post(const void *x, void *y, const float *ewv,
                          *           const float *bias, int64_t m0, int64_t m1), or "" */
    char prep_name[96];  /* void prep(const void *x, void *xt, int64_t m0, int64_t m1), or "":
                          * dot amx transposes x into xt (tj_cpu_xt_elems) first, tokens
                          * [m0, m1) of one 32-token block per call, and item reads xt, not x */
    char prepf_name[96]; /* the same prep reading fp32 x (rounded to bf16 on the way), or "" */
    int64_t bk_elems;    /* bias in kept-column order, padded: floats the caller allocates */
    int64_t ewv_elems;   /* ew weights in CSR order (ew_nnz) */
    int fused_act;       /* 1: item applies the activation itself (no ew) */
    int64_t rows_emitted; /* kept-row steps emitted as code (unrolled mode), for reports */
    int64_t nslots;      /* work pieces (tj_cpu_pieces): item slots are [0, nslots) */
} tj_cpu_emit_info;

struct LLVMOpaqueContext;
struct LLVMOpaqueModule;

/* Builds the module for layer l under config c (vec resolved) in LLVM context llctx.
 * plan: tj_cpu_plan_build(l, c) (the weight layout the kernel reads). The host CPU name and
 * features are attached to each function. Deterministic for the same inputs. */
tj_status tj_cpu_emit_module(struct LLVMOpaqueContext *llctx, const tj_layer *l, const tj_plan *plan,
                             const tj_cpu_config *c, const char *prefix,
                             struct LLVMOpaqueModule **out, tj_cpu_emit_info *info, tj_error *err);

/* The same for another target CPU (LLVM name, e.g. "sapphirerapids", and its feature string,
 * "" for the CPU's own): object code for a machine this host may not be, for codegen tests. */
tj_status tj_cpu_emit_module_for(struct LLVMOpaqueContext *llctx, const tj_layer *l, const tj_plan *plan,
                                 const tj_cpu_config *c, const char *prefix, const char *cpu, const char *features,
                                 struct LLVMOpaqueModule **out, tj_cpu_emit_info *info, tj_error *err);
/* Packs weights w ([n, k] of dtype wdt) for config cfg (resolved) into dst (plan->packed_elems
 * floats, or bf16 values with cfg->weights bf16). Inside a tile's block (plan->off[t]) the
 * features are in column blocks of cfg->nr (the last one the padded rest, width bw), each
 * block's kept rows contiguous: block b0 at off + b0·nrows, element (r, c) at r·bw + c. With
 * dot dpbf16, rows 2p and 2p + 1 are interleaved (p·2·bw + 2c + (r & 1)) and an odd last row
 * stays plain. With dot amx every row is paired (the AMX VNNI layout: pair p of a 16-feature
 * slice is one 64-byte tile row), nrows is the padded tj_plan_rows and the padding is zeros. */
void tj_cpu_pack_weights(const tj_plan *p, const tj_cpu_config *cfg, const void *w, tj_dtype wdt, void *dst);
/* 1 when the host CPU has avx512bf16 (and avx512f). */
int tj_cpu_host_bf16(void);
/* 1 when the host CPU has AMX-TILE, AMX-BF16 and avx512bf16 and Linux granted this process the
 * AMX tile state (asked once, on the first call: base/host.h). */
int tj_cpu_host_amx(void);
/* The plan the kernels of config cfg (resolved) read: tiles padded to cfg->vec features, and
 * with dot amx each tile's kept rows padded to 32 (tj_plan_build_rows). */
tj_status tj_cpu_plan_build(const tj_layer *l, const tj_cpu_config *cfg, tj_plan *out, tj_error *err);

/* Elements (bf16) of the transpose a dot amx layer's prep writes for M tokens: 32-token blocks
 * of K rounded up to 32 rows of 32 tokens. */
int64_t tj_cpu_xt_elems(const tj_layer *l, int64_t m);

/* `tilejit gen --target cpu`: the emitted (unoptimised) IR of layer l as text, malloc'ed in
 * *out. config_json may be NULL for the default. */
tj_status tj_cpu_emit_ir_text(const tj_layer *l, const char *config_json, char **out, tj_error *err);

#endif
