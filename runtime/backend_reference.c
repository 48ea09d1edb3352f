/* Backend `reference`: runs tj_reference_linear. Always available, never fast. */
#include "runtime/model.h"

static tj_status ref_available(tj_context *c, tj_error *err)
{
    (void)c;
    (void)err;
    return TJ_OK;
}

static tj_status ref_load(tj_model *m, tj_error *err)
{
    (void)m;
    (void)err;
    return TJ_OK;
}

static tj_status ref_linear(tj_model *m, int64_t layer, const tj_linear_args *a, tj_error *err)
{
    (void)err;
    tj_reference_linear(&m->pattern->layers[layer], &m->lw[layer], a->x32, a->m, a->y32);
    return TJ_OK;
}

static void ref_unload(tj_model *m) { (void)m; }

const tj_backend_ops tj_backend_reference_ops = {
    .name = "reference",
    .kind = TJ_BACKEND_REFERENCE,
    .host_f32 = 1,
    .available = ref_available,
    .load = ref_load,
    .linear = ref_linear,
    .unload = ref_unload,
};
