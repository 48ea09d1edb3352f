/* What hx_module.c (building and loading modules) and hx_exec.c (running them) share. */
#ifndef TJ_HX_INTERNAL_H
#define TJ_HX_INTERNAL_H

#include "hx.h"

#define HX_SMEM_CAPACITY TJ_HX_SMEM_CAPACITY /* tj_hx_dynamic_smem in cuda_host.h */

struct tj_hx_module {
    void *dl;
    char *so_path, *cu_path;
    char *source;                  /* the emitted text, for line lookups in reports */
    uintptr_t base;                /* load address (symbolizer offsets are relative to it) */
    uintptr_t image_lo, image_hi;  /* every loaded segment: code, constants, the builtins */
    unsigned char *smem;           /* tj_hx_dynamic_smem */
    tj_hx_builtins *bi;
    int (*bind)(const tj_hx_api *);
};

/* Source lines of code addresses inside m (return addresses: the call before them), one
 * malloc'ed string per pc such as "tj_cp16 kernel.cu:131 <- tj_tiles kernel.cu:158" (inlined
 * frames innermost first), or "0x1234" when no symbolizer runs. */
void hx_module_symbolize(const tj_hx_module *m, const uintptr_t *pcs, int n, char **out);

#endif
