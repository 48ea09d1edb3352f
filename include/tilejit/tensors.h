/* tilejit/tensors.h — models and layers from in-memory tensors, for frameworks that already hold
 * their weights (PyTorch, JAX, an inference server): no file round trip.
 *
 *     // weights named as in a safetensors checkpoint: "NAME.weight" [n × k], "NAME.bias" [n]
 *     tj_named_tensor t[] = {{"encoder.layer.0.intermediate.dense.weight", &w},
 *                            {"encoder.layer.0.intermediate.dense.bias", &b}};
 *     tj_model *m = NULL;
 *     if (tj_model_load_tensors(ctx, pattern_json, strlen(pattern_json), t, 2, &m) != TJ_OK)
 *         fprintf(stderr, "%s\n", tj_context_error(ctx));
 *
 * Weights and biases: DLTensors in host memory (kDLCPU or kDLCUDAHost), float32, float16 or
 * bfloat16, weight [n × k], bias [n]. A compact row-major tensor (strides NULL or {k, 1}) is
 * used in place: no copy; tilejit borrows it, so it must stay alive and unchanged until
 * tj_model_destroy. Any other strides are copied once into a compact buffer the model owns
 * (tj_model_copied_bytes says how many bytes). Device tensors (kDLCUDA) are refused: copy them
 * to the host first (the CUDA backend uploads packed weights at load). The checks, backend
 * preparation and kernel cache are those of tj_model_load.
 */
#include "tilejit.h"
#ifndef TILEJIT_TENSORS_H
#define TILEJIT_TENSORS_H

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor and its checkpoint name. Both borrowed for the duration of the call (and the tensor's
 * data for the model's life, see above). */
typedef struct tj_named_tensor {
    const char *name;
    const DLTensor *tensor;
} tj_named_tensor;

/* Loads a model from pattern JSON text (the tilejit-pattern document, `len` bytes, no NUL
 * needed) and named tensors: for every layer NAME of the pattern, "NAME.weight" must be among
 * them ("NAME.bias" is optional); other tensors are ignored. Errors: TJ_ERR_FORMAT for a bad
 * pattern or a tensor of the wrong shape or dtype, TJ_ERR_NOT_FOUND for a missing weight,
 * TJ_ERR_INVALID_ARGUMENT for a device tensor or NULL arguments. */
TJ_API tj_status tj_model_load_tensors(tj_context *c, const char *pattern_json, size_t len,
                                       const tj_named_tensor *tensors, int64_t ntensors,
                                       tj_model **out);

/* One layer: layer_json is a pattern document with exactly one layer, or that layer's object
 * alone ({"name": ..., "n": ..., "k": ..., "g": ..., "tiles": [...]}); bias may be NULL. */
TJ_API tj_status tj_model_load_layer(tj_context *c, const char *layer_json, const DLTensor *weight,
                                     const DLTensor *bias, tj_model **out);

/* Bytes of weights and biases a model loaded from tensors copied (0 when all were used in
 * place, and for models loaded from files). */
TJ_API int64_t tj_model_copied_bytes(const tj_model *m);

/* Tile-wise pruning of in-memory weights (the `tilejit prune` algorithm: one global threshold
 * across all given layers). Start from tj_prune_params_default(). */
typedef struct tj_prune_params {
    size_t size;         /* sizeof(tj_prune_params), for later fields */
    double sparsity;     /* overall fraction of weights removed, [0, 1) */
    int64_t g;           /* tile width; layers with n < g use g = n */
    const char *mode;    /* "tw1", "tw2" or "tew" */
    double ew_fraction;  /* tew: residual as a fraction of all weights */
} tj_prune_params;

TJ_API tj_prune_params tj_prune_params_default(void); /* 0.75, 128, "tw1", 0.01 */

/* tensors: "NAME.weight" [n × k] for each layer to prune (host, float32/float16/bfloat16, any
 * strides); others are ignored. *out_json: the pattern document (layers in the order given,
 * activation none), malloc'ed: free it with tj_free. */
TJ_API tj_status tj_prune_tensors(tj_context *c, const tj_named_tensor *tensors, int64_t ntensors,
                                  const tj_prune_params *params, char **out_json);

/* Frees memory tilejit returned (tj_prune_tensors' JSON); NULL is fine. */
TJ_API void tj_free(void *p);

#ifdef __cplusplus
}
#endif
#endif
