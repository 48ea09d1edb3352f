/* Stage 3: a layer's execution plan. Tiles ordered heaviest first (load balance) and each tile's
 * kept weights packed dense, k-major: packed[off[t] + r·ld + c] = W[col(t·g + c)][rows_t[r]],
 * with the tile width padded to a multiple of `pad` (zeros) so kernels need no edge masks. */
#ifndef TJ_PLAN_H
#define TJ_PLAN_H

#include "base/dtype.h"
#include "pattern/pattern.h"

typedef struct tj_plan {
    const tj_layer *layer;
    int64_t *order;       /* tile indices, heaviest (rows × width) first, ties by index */
    int64_t *off;         /* per tile: element offset of its block in the packed buffer */
    int64_t *ld;          /* per tile: padded width (row stride of its block) */
    int64_t packed_elems; /* total elements of the packed buffer */
    int64_t pad;
    int64_t rpad;         /* each tile's kept rows padded to a multiple of rpad (zero rows) */
} tj_plan;

tj_status tj_plan_build(const tj_layer *l, int64_t pad, tj_plan *out, tj_error *err);
/* The same with each tile's block holding tj_plan_rows(p, t) rows, its kept rows rounded up to a
 * multiple of rpad (the AMX kernel reads whole k-steps of 32): the block is ld[t] ·
 * tj_plan_rows(p, t) elements. rpad 1 is tj_plan_build. */
tj_status tj_plan_build_rows(const tj_layer *l, int64_t pad, int64_t rpad, tj_plan *out, tj_error *err);
int64_t tj_plan_rows(const tj_plan *p, int64_t t);
void tj_plan_free(tj_plan *p);
/* Packs weights w ([n, k] of dtype wdt) into dst (packed_elems floats or halves). */
void tj_plan_pack_f32(const tj_plan *p, const void *w, tj_dtype wdt, float *dst);
/* dst as raw 16-bit values of dtype out (TJ_F16 or TJ_BF16), converting from wdt. */
void tj_plan_pack_16(const tj_plan *p, const void *w, tj_dtype wdt, tj_dtype out, uint16_t *dst);

#endif
