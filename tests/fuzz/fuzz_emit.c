/* libFuzzer target: pattern → plan → generated source (gen/emit_cuda.c, gen/emit_llvm.c). Input:
 * one selector byte (which config), then pattern JSON. For every layer the validator accepts and
 * every config the emitter's own check accepts, emitting must succeed or fail cleanly, never
 * with an internal error: CUDA source must be complete and deterministic, LLVM IR must verify
 * (the emitter runs LLVMVerifyModule; TJ_ERR_INTERNAL means it failed). With TJ_FUZZ_NVRTC=1
 * every emitted CUDA source is also compiled with NVRTC for sm_90 (slow: for replaying a
 * corpus with -runs=0, not for fuzzing). Layers are capped in size to keep runs fast. */
#include <stdlib.h>
#include <string.h>

#include "gen/emit_cuda.h"
#include "fuzz_common.h"
#include "pattern/pattern.h"
#include "tj_config.h"
#if TJ_HAVE_LLVM
#include "gen/emit_llvm.h"
#endif
#if TJ_HAVE_CUDA
#include "jit/nvrtc.h"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void emit_cuda(const tj_layer *l, uint8_t sel)
{
    tj_cuda_config c = tj_cuda_config_default(l);
    static const int bms[] = {16, 32, 64, 128};
    static const int bns[] = {16, 32, 64, 128};
    c.tmpl = (sel & 1) ? TJ_CUDA_TEMPLATE_SIMT : TJ_CUDA_TEMPLATE_MMA;
    c.offsets = (sel & 2) ? TJ_CUDA_OFFSETS_UNROLLED : TJ_CUDA_OFFSETS_TABLE;
    c.dtype = (sel & 4) ? TJ_BF16 : TJ_F16;
    c.x_fm = (sel >> 3) & 1;
    c.y_fm = (sel >> 4) & 1;
    if (sel & 0x20) c.bm = bms[(sel >> 6) & 3];
    if (sel & 0x40) c.bn = bns[(sel >> 6) & 3];
    if (sel & 0x80) c.out = c.dtype;
    tj_error err;
    tj_error_clear(&err);
    if (tj_cuda_config_check(&c, &err) != TJ_OK) return; /* a config the tuner would not offer */
    char *src = NULL, *again = NULL;
    tj_status s = tj_cuda_emit(l, &c, &src, &err);
    if (s != TJ_OK) {
        if (s == TJ_ERR_INTERNAL) fprintf(stderr, "tj_cuda_emit: %s\n", err.msg);
        FUZZ_ASSERT(s != TJ_ERR_INTERNAL && src == NULL && err.msg[0]);
        return;
    }
    FUZZ_ASSERT(src && strstr(src, "tj_tiles"));
    FUZZ_ASSERT(tj_cuda_emit(l, &c, &again, &err) == TJ_OK && strcmp(src, again) == 0); /* deterministic */
    tj_cuda_launch launches[TJ_CUDA_MAX_LAUNCHES];
    int count = 0;
    for (int64_t m = 1; m <= 1000; m *= 37)
        if (tj_cuda_geometry(l, &c, m, launches, &count, &err) == TJ_OK) FUZZ_ASSERT(count >= 1 && count <= TJ_CUDA_MAX_LAUNCHES);
#if TJ_HAVE_CUDA
    const char *nv = getenv("TJ_FUZZ_NVRTC");
    if (nv && *nv == '1') {
        tj_cubin bin;
        memset(&bin, 0, sizeof bin);
        s = tj_nvrtc_compile(NULL, src, "fuzz", 90, &bin, &err);
        if (s != TJ_OK) fprintf(stderr, "NVRTC rejected the emitted source:\n%s\n", err.msg);
        FUZZ_ASSERT(s == TJ_OK);
        tj_cubin_free(&bin);
    }
#endif
    free(src);
    free(again);
}

#if TJ_HAVE_LLVM
static void emit_llvm(const tj_layer *l, uint8_t sel)
{
    int count = 0;
    const tj_cpu_config *space = tj_cpu_config_space(&count);
    if (count <= 0) return;
    char *cj = tj_cpu_config_to_json(&space[sel % count]);
    FUZZ_ASSERT(cj);
    char *ir = NULL;
    tj_error err;
    tj_error_clear(&err);
    tj_status s = tj_cpu_emit_ir_text(l, cj, &ir, &err);
    if (s == TJ_ERR_INTERNAL) fprintf(stderr, "tj_cpu_emit_ir_text (%s): %s\n", cj, err.msg);
    FUZZ_ASSERT(s != TJ_ERR_INTERNAL);
    FUZZ_ASSERT(s == TJ_OK ? ir && ir[0] : err.msg[0] != '\0');
    free(ir);
    free(cj);
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint8_t sel = data[0];
    tj_pattern *p = NULL;
    tj_error err;
    if (tj_pattern_parse((const char *)data + 1, size - 1, "fuzz.json", &p, &err) != TJ_OK) return 0;
    for (int64_t i = 0; i < p->nlayers && i < 4; i++) {
        const tj_layer *l = &p->layers[i];
        /* Emission is linear in these; the cap only keeps each run short. */
        if (l->ntiles > 1024 || l->tile_ptr[l->ntiles] > 20000 || l->n > 65536 || l->ew_nnz > 20000) continue;
        emit_cuda(l, (uint8_t)(sel + i));
#if TJ_HAVE_LLVM
        emit_llvm(l, (uint8_t)(sel + i));
#endif
    }
    tj_pattern_destroy(p);
    return 0;
}
