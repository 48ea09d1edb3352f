/* Resources of the tile kernels as ptxas reports them (NVRTC, no GPU needed): the mma kernel for
 * sm_80, sm_86, sm_89, sm_90 and sm_90a and the wgmma kernel for sm_90a (the only arch that has
 * it), on a BERT-base FFN layer at 75 % tile-wise sparsity, several layouts, dtypes and tilings:
 * no local memory (a 0-byte stack frame, no spills), at most 128 registers for mma (two
 * 256-thread blocks per SM) and 255 for wgmma (one 128-thread block). Prints each kernel's
 * registers and compile time. Suite 'cuda'. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/emit_cuda.h"
#include "jit/nvrtc.h"
#include "pattern/random.h"
#include "tj_test.h"

static const char *const configs[] = {
    "{}", /* the default: bm 128, bn 128, bk 32, 8 warps, 3 stages, fp16 -> fp32, fm */
    "{\"dtype\":\"bf16\",\"out\":\"bf16\"}",
    "{\"out\":\"f16\",\"layout\":\"rm\"}",
    "{\"layout\":\"rm_fm\"}",
    "{\"layout\":\"fm_rm\",\"dtype\":\"bf16\"}",
    "{\"bk\":64,\"stages\":4}",
    "{\"bm\":256,\"bn\":64}",
    "{\"bm\":64,\"bn\":64,\"bk\":16,\"warps\":4,\"stages\":2}",
    "{\"bm\":32,\"bn\":32,\"warps\":2,\"stages\":4}",
    /* sm_90a only (the last arch) */
    "{\"template\":\"wgmma\",\"bm\":128,\"bn\":64,\"bk\":64,\"warps\":4,\"stages\":4}",
    "{\"template\":\"wgmma\",\"bm\":128,\"bn\":64,\"bk\":64,\"warps\":4,\"stages\":3,\"dtype\":\"bf16\",\"out\":\"bf16\"}",
    "{\"template\":\"wgmma\",\"bm\":64,\"bn\":64,\"bk\":32,\"warps\":4,\"stages\":2,\"out\":\"f16\",\"layout\":\"fm_rm\"}",
};
#define NWG 3 /* the wgmma configs at the end of the table */
#define NCFG (int)(sizeof configs / sizeof *configs)
static const int archs[] = {80, 86, 89, 90, 90 | TJ_CUDA_SM_ARCH_SPECIFIC};
#define NARCH 5

int main(void)
{
    tj_error err = {0};
    tj_layer l;
    tj_random_spec sp = {.n = 3072, .k = 768, .g = 128, .sparsity = 0.75, .mode = 2, .seed = 15, .act = TJ_ACT_GELU};
    if (tj_random_layer(&sp, "bert.fc1", &l, &err) != TJ_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    /* Every mma config on sm_80; the default and bf16 ones on the other archs; wgmma on sm_90a. */
    enum { MAXJ = NCFG * NARCH };
    tj_nvrtc_job jobs[MAXJ];
    char *srcs[MAXJ];
    int jc[MAXJ], nj = 0;
    memset(jobs, 0, sizeof jobs);
    for (int a = 0; a < NARCH; a++)
        for (int i = 0; i < NCFG; i++) {
            int wg = i >= NCFG - NWG;
            if (wg != (a == NARCH - 1 && i >= 2)) continue; /* wgmma: sm_90a only; sm_90a: mma default/bf16 + wgmma */
            if (!wg && a > 0 && i > 1) continue;
            tj_cuda_config c = tj_cuda_config_default(&l);
            CHECK_OK(tj_cuda_config_from_json(configs[i], &c, &err), &err);
            srcs[nj] = NULL;
            CHECK_OK(tj_cuda_emit(&l, &c, &srcs[nj], &err), &err);
            if (!srcs[nj]) continue;
            jobs[nj].source = srcs[nj];
            jobs[nj].label = configs[i];
            jobs[nj].sm = archs[a];
            jc[nj++] = i;
        }
    tj_status st = tj_nvrtc_compile_all(NULL, jobs, nj, 0, &err);
    CHECKF(st == TJ_OK, "%s", err.msg);
    for (int j = 0; j < nj; j++) {
        const tj_cubin *b = &jobs[j].result;
        if (jobs[j].status != TJ_OK) continue;
        const tj_kernel_resources *t = NULL;
        for (int k = 0; k < b->nkernels; k++) {
            const tj_kernel_resources *r = &b->kernels[k];
            if (strcmp(r->name, "tj_tiles") == 0) t = r;
            CHECKF(r->stack == 0 && r->spill_stores == 0 && r->spill_loads == 0,
                   "sm_%d %s: %s has a %lld-byte stack frame, %lld/%lld spill bytes", jobs[j].sm, configs[jc[j]], r->name,
                   (long long)r->stack, (long long)r->spill_stores, (long long)r->spill_loads);
        }
        CHECKF(t != NULL, "sm_%d %s: no tj_tiles in the ptxas report", jobs[j].sm, configs[jc[j]]);
        if (!t) continue;
        /* mma: two 256-thread blocks per SM; wgmma: one 128-thread block, any of the 255 */
        const int regs_max = strstr(configs[jc[j]], "wgmma") ? 255 : 128;
        CHECKF(t->registers > 0 && t->registers <= regs_max, "sm_%d %s: tj_tiles uses %d registers", jobs[j].sm,
               configs[jc[j]], t->registers);
        char an[16];
        tj_cuda_arch_name(jobs[j].sm, an);
        printf("%-6s %-56s tj_tiles %3d registers, stack %lld B, spills %lld B, compiled in %.2f s\n", an,
               configs[jc[j]], t->registers, (long long)t->stack, (long long)(t->spill_stores + t->spill_loads),
               b->seconds);
    }
    for (int j = 0; j < nj; j++) {
        tj_cubin_free(&jobs[j].result);
        free(srcs[j]);
    }
    tj_layer_free(&l);
    return tj_test_end();
}
