/* make-synthetic-model: writes a BERT-base-shaped safetensors checkpoint with synthetic weights
 * (Hugging Face tensor names), for tests, benchmarks and the README demo of `tilejit prune`.
 * Deterministic: the same options give a byte-identical file. Not part of the `tilejit` contract. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/safetensors.h"

static const char *usage_text =
    "usage: make-synthetic-model -o OUT.safetensors [--layers 12] [--hidden 768] [--intermediate 3072]\n"
    "                            [--vocab 30522] [--dtype F32|F16|BF16] [--seed 1]\n"
    "\n"
    "Writes a BERT-base-shaped checkpoint with synthetic weights: embeddings (word, position,\n"
    "token type, LayerNorm, an I64 position_ids buffer) and per encoder layer N the six linear\n"
    "layers encoder.layer.N.attention.self.{query,key,value}, .attention.output.dense,\n"
    ".intermediate.dense [intermediate × hidden] and .output.dense [hidden × intermediate], each\n"
    "with .weight and .bias, plus two LayerNorms. Weights are 0.02·N(0,1) scaled by log-normal\n"
    "per-output and per-input factors, so magnitudes vary by row and column as in trained models.\n"
    "Defaults give 12 layers, 72 linear layers, ~109 M parameters (~436 MB in F32).\n";

typedef struct spec {
    int64_t layers, hidden, inter, vocab;
    tj_dtype dtype;
    uint64_t seed;
} spec;

enum kind { K_LINEAR, K_BIAS, K_NORM_W, K_NORM_B, K_EMBED, K_IDS };

typedef struct tensor {
    char name[96];
    enum kind kind;
    int ndim;
    int64_t shape[2];
    uint64_t seed;
} tensor;

/* Box–Muller, both halves used; the spare lives with the stream so tensors stay independent. */
typedef struct normal_rng {
    tj_rng r;
    int has_spare;
    double spare;
} normal_rng;

static double normal(normal_rng *g)
{
    if (g->has_spare) {
        g->has_spare = 0;
        return g->spare;
    }
    double u1 = ((double)(tj_rng_next(&g->r) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = (double)(tj_rng_next(&g->r) >> 11) / 9007199254740992.0;
    double rad = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
    g->spare = rad * sin(a);
    g->has_spare = 1;
    return rad * cos(a);
}

typedef struct fill_ctx {
    const spec *sp;
    const tensor *ts;
    float *row;   /* scratch: one row in fp32 */
    float *cscale;
} fill_ctx;

static void store(const spec *sp, const float *src, int64_t n, void *dst)
{
    tj_convert_from_f32(src, n, sp->dtype, dst);
}

static tj_status fill(void *user, int64_t index, void *buf, tj_error *err)
{
    (void)err;
    fill_ctx *c = user;
    const tensor *t = &c->ts[index];
    normal_rng r = {{t->seed}, 0, 0};
    size_t es = tj_dtype_size(c->sp->dtype);
    if (t->kind == K_IDS) {
        int64_t *ids = buf;
        for (int64_t i = 0; i < t->shape[1]; i++) ids[i] = i;
        return TJ_OK;
    }
    int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
    if (t->kind == K_LINEAR)
        for (int64_t i = 0; i < cols; i++) c->cscale[i] = (float)exp(0.5 * normal(&r));
    for (int64_t row = 0; row < rows; row++) {
        float rs = t->kind == K_LINEAR ? (float)exp(0.5 * normal(&r)) : 1.0f;
        for (int64_t i = 0; i < cols; i++) {
            double v = normal(&r);
            switch (t->kind) {
            case K_LINEAR: v = 0.02 * v * rs * c->cscale[i]; break;
            case K_NORM_W: v = 1.0 + 0.05 * v; break;
            case K_NORM_B: case K_BIAS: v = 0.01 * v; break;
            default: v = 0.02 * v; break;
            }
            c->row[i] = (float)v;
        }
        store(c->sp, c->row, cols, (char *)buf + (size_t)(row * cols) * es);
    }
    return TJ_OK;
}

static int parse_i64(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "make-synthetic-model: %s: '%s' is not an integer in [%lld, %lld]\n", opt, s, (long long)lo,
                (long long)hi);
        return 0;
    }
    *out = v;
    return 1;
}

int main(int argc, char **argv)
{
    spec sp = {12, 768, 3072, 30522, TJ_F32, 1};
    const char *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "make-synthetic-model: '%s' needs a value or is unknown (see --help)\n", a);
            return 1;
        }
        const char *v = argv[++i];
        int64_t x;
        if (strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) out = v;
        else if (strcmp(a, "--layers") == 0) { if (!parse_i64(a, v, 0, 1000, &sp.layers)) return 1; }
        else if (strcmp(a, "--hidden") == 0) { if (!parse_i64(a, v, 1, 65536, &sp.hidden)) return 1; }
        else if (strcmp(a, "--intermediate") == 0) { if (!parse_i64(a, v, 1, 262144, &sp.inter)) return 1; }
        else if (strcmp(a, "--vocab") == 0) { if (!parse_i64(a, v, 1, 10000000, &sp.vocab)) return 1; }
        else if (strcmp(a, "--seed") == 0) { if (!parse_i64(a, v, 0, INT64_MAX, &x)) return 1; sp.seed = (uint64_t)x; }
        else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(v, "F32") == 0) sp.dtype = TJ_F32;
            else if (strcmp(v, "F16") == 0) sp.dtype = TJ_F16;
            else if (strcmp(v, "BF16") == 0) sp.dtype = TJ_BF16;
            else {
                fprintf(stderr, "make-synthetic-model: --dtype: '%s' is not F32, F16 or BF16\n", v);
                return 1;
            }
        } else {
            fprintf(stderr, "make-synthetic-model: unknown option '%s' (see --help)\n", a);
            return 1;
        }
    }
    if (!out) {
        fprintf(stderr, "make-synthetic-model: -o OUT.safetensors is required (see --help)\n");
        return 1;
    }

    int64_t nt = 6 + sp.layers * 16, cnt = 0;
    tensor *ts = calloc((size_t)nt, sizeof *ts);
    tj_st_out_tensor *outs = calloc((size_t)nt, sizeof *outs);
    if (!ts || !outs) {
        fprintf(stderr, "make-synthetic-model: out of memory\n");
        return 1;
    }
#define ADD(kind_, nd, d0, d1, ...)                                                   \
    do {                                                                              \
        tensor *t_ = &ts[cnt];                                                        \
        snprintf(t_->name, sizeof t_->name, __VA_ARGS__);                             \
        t_->kind = kind_;                                                             \
        t_->ndim = nd;                                                                \
        t_->shape[0] = d0;                                                            \
        t_->shape[1] = d1;                                                            \
        t_->seed = sp.seed * 0x9e3779b97f4a7c15ull + (uint64_t)cnt * 0xd1b54a32d192ed03ull; \
        cnt++;                                                                        \
    } while (0)
    const int64_t H = sp.hidden, I = sp.inter;
    ADD(K_EMBED, 2, sp.vocab, H, "embeddings.word_embeddings.weight");
    ADD(K_EMBED, 2, 512, H, "embeddings.position_embeddings.weight");
    ADD(K_EMBED, 2, 2, H, "embeddings.token_type_embeddings.weight");
    ADD(K_NORM_W, 1, H, 0, "embeddings.LayerNorm.weight");
    ADD(K_NORM_B, 1, H, 0, "embeddings.LayerNorm.bias");
    ADD(K_IDS, 2, 1, 512, "embeddings.position_ids");
    static const char *attn[] = {"attention.self.query", "attention.self.key", "attention.self.value",
                                 "attention.output.dense"};
    for (int64_t l = 0; l < sp.layers; l++) {
        for (int j = 0; j < 4; j++) {
            ADD(K_LINEAR, 2, H, H, "encoder.layer.%lld.%s.weight", (long long)l, attn[j]);
            ADD(K_BIAS, 1, H, 0, "encoder.layer.%lld.%s.bias", (long long)l, attn[j]);
        }
        ADD(K_NORM_W, 1, H, 0, "encoder.layer.%lld.attention.output.LayerNorm.weight", (long long)l);
        ADD(K_NORM_B, 1, H, 0, "encoder.layer.%lld.attention.output.LayerNorm.bias", (long long)l);
        ADD(K_LINEAR, 2, I, H, "encoder.layer.%lld.intermediate.dense.weight", (long long)l);
        ADD(K_BIAS, 1, I, 0, "encoder.layer.%lld.intermediate.dense.bias", (long long)l);
        ADD(K_LINEAR, 2, H, I, "encoder.layer.%lld.output.dense.weight", (long long)l);
        ADD(K_BIAS, 1, H, 0, "encoder.layer.%lld.output.dense.bias", (long long)l);
        ADD(K_NORM_W, 1, H, 0, "encoder.layer.%lld.output.LayerNorm.weight", (long long)l);
        ADD(K_NORM_B, 1, H, 0, "encoder.layer.%lld.output.LayerNorm.bias", (long long)l);
    }
#undef ADD
    int64_t maxcols = 1, params = 0;
    for (int64_t i = 0; i < cnt; i++) {
        tensor *t = &ts[i];
        int64_t numel = t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
        int64_t cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
        if (cols > maxcols) maxcols = cols;
        int ids = t->kind == K_IDS;
        if (!ids) params += numel;
        outs[i] = (tj_st_out_tensor){t->name, ids ? "I64" : tj_dtype_name(sp.dtype), t->ndim, t->shape, NULL,
                                     (uint64_t)numel * (ids ? 8 : tj_dtype_size(sp.dtype))};
    }
    fill_ctx c = {&sp, ts, malloc((size_t)maxcols * sizeof(float)), malloc((size_t)maxcols * sizeof(float))};
    if (!c.row || !c.cscale) {
        fprintf(stderr, "make-synthetic-model: out of memory\n");
        return 1;
    }
    char meta[256];
    snprintf(meta, sizeof meta,
             "{\"format\": \"pt\", \"generator\": \"tilejit make-synthetic-model\", \"seed\": \"%llu\", \"layers\": \"%lld\"}",
             (unsigned long long)sp.seed, (long long)sp.layers);
    tj_error err = {0};
    tj_status s = tj_st_write_stream(out, outs, cnt, meta, fill, &c, &err);
    free(c.row);
    free(c.cscale);
    free(ts);
    free(outs);
    if (s != TJ_OK) {
        fprintf(stderr, "make-synthetic-model: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: %lld tensors, %lld parameters, %lld linear layers, %s\n", out, (long long)cnt,
           (long long)params, (long long)(6 * sp.layers), tj_dtype_name(sp.dtype));
    return 0;
}
