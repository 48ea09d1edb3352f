/* bert_block: one BERT encoder block through tilejit's public API, its six GEMMs chained without
 * copies on the CPU: Q, K, V read the block input in place, attention (plain C here) feeds the
 * attention-output GEMM, its result feeds FFN-in (GELU) and FFN-out. Every tj_linear call gets
 * contiguous fp32 row-major host buffers, which the runtime hands to the kernels as they are
 * (no staging, conversion or transpose); outputs are written straight into the next layer's
 * input buffer. The same block is run on the reference backend and compared.
 *
 * usage: bert_block PATTERN WEIGHTS [--prefix encoder.layer.0.] [--m 128] [--heads 12]
 *                   [--backend auto|cpu|cuda|reference] [--threads T] [--repeat 20]
 *
 * LayerNorms run without their affine parameters: the public API serves the linear layers; a
 * real server keeps norms, softmax and residuals in its own code, as here. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tilejit.h>

enum { Q, K, V, O, FFN_IN, FFN_OUT, NGEMM };
static const char *suffix[NGEMM] = {"attention.self.query", "attention.self.key", "attention.self.value",
                                    "attention.output.dense", "intermediate.dense", "output.dense"};

typedef struct block {
    tj_model *model;
    int64_t idx[NGEMM];
    tj_activation ffn_act; /* GELU in the pattern: the kernel applies it; else we do */
    double gemm_s[NGEMM];
} block;

static DLTensor host2d(float *p, int64_t *shape)
{
    DLTensor t = {.data = p, .device = {kDLCPU, 0}, .ndim = 2, .dtype = {kDLFloat, 32, 1}, .shape = shape};
    return t;
}

/* y [m × n] = layer(x [m × k]): both buffers are used in place. */
static int gemm(block *b, int which, float *x, int64_t m, int64_t k, float *y, int64_t n)
{
    int64_t xs[2] = {m, k}, ys[2] = {m, n};
    DLTensor xt = host2d(x, xs), yt = host2d(y, ys);
    double t0 = tj_now();
    int s = tj_linear_ex(b->model, b->idx[which], &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL);
    b->gemm_s[which] += tj_now() - t0;
    return s;
}

static void layer_norm(float *x, int64_t m, int64_t h)
{
    for (int64_t i = 0; i < m; i++) {
        float *r = x + i * h;
        double mu = 0, var = 0;
        for (int64_t j = 0; j < h; j++) mu += r[j];
        mu /= (double)h;
        for (int64_t j = 0; j < h; j++) var += (r[j] - mu) * (r[j] - mu);
        float inv = (float)(1.0 / sqrt(var / (double)h + 1e-12));
        for (int64_t j = 0; j < h; j++) r[j] = (float)(r[j] - mu) * inv;
    }
}

/* Multi-head self-attention on q, k, v [m × h] (one sequence of m tokens) into out [m × h]. */
static void attention(const float *q, const float *k, const float *v, float *out, int64_t m, int64_t h,
                      int64_t heads, float *scores)
{
    int64_t d = h / heads;
    float scale = 1.0f / sqrtf((float)d);
    for (int64_t hd = 0; hd < heads; hd++)
        for (int64_t i = 0; i < m; i++) {
            float mx = -INFINITY;
            for (int64_t j = 0; j < m; j++) {
                float s = 0;
                for (int64_t c = 0; c < d; c++) s += q[i * h + hd * d + c] * k[j * h + hd * d + c];
                scores[j] = s * scale;
                if (scores[j] > mx) mx = scores[j];
            }
            float sum = 0;
            for (int64_t j = 0; j < m; j++) sum += scores[j] = expf(scores[j] - mx);
            for (int64_t c = 0; c < d; c++) {
                float acc = 0;
                for (int64_t j = 0; j < m; j++) acc += scores[j] * v[j * h + hd * d + c];
                out[i * h + hd * d + c] = acc / sum;
            }
        }
}

typedef struct bufs {
    float *x, *q, *k, *v, *ctx, *h1, *f, *y, *scores;
} bufs;

/* The block: y = LN(h1 + FFN(h1)), h1 = LN(x + O(attention(Q x, K x, V x))). */
static int run_block(block *b, bufs *u, int64_t m, int64_t h, int64_t inter, int64_t heads)
{
    if (gemm(b, Q, u->x, m, h, u->q, h) || gemm(b, K, u->x, m, h, u->k, h) || gemm(b, V, u->x, m, h, u->v, h))
        return 1;
    attention(u->q, u->k, u->v, u->ctx, m, h, heads, u->scores);
    if (gemm(b, O, u->ctx, m, h, u->h1, h)) return 1;
    for (int64_t i = 0; i < m * h; i++) u->h1[i] += u->x[i];
    layer_norm(u->h1, m, h);
    if (gemm(b, FFN_IN, u->h1, m, h, u->f, inter)) return 1;
    if (b->ffn_act != TJ_ACT_GELU)
        for (int64_t i = 0; i < m * inter; i++) u->f[i] = 0.5f * u->f[i] * (1.0f + erff(u->f[i] * 0.70710678f));
    if (gemm(b, FFN_OUT, u->f, m, inter, u->y, h)) return 1;
    for (int64_t i = 0; i < m * h; i++) u->y[i] += u->h1[i];
    layer_norm(u->y, m, h);
    return 0;
}

static int open_block(const char *pattern, const char *weights, tj_options *opt, const char *prefix,
                      tj_context **ctx, block *b, int64_t *h, int64_t *inter)
{
    if (tj_context_create(opt, ctx) != TJ_OK) {
        fprintf(stderr, "bert_block: %s\n", tj_last_error());
        return 1;
    }
    if (tj_model_load(*ctx, pattern, weights, &b->model) != TJ_OK) {
        fprintf(stderr, "bert_block: %s\n", tj_context_error(*ctx));
        return 1;
    }
    tj_layer_info li[NGEMM];
    for (int i = 0; i < NGEMM; i++) {
        char name[512];
        snprintf(name, sizeof name, "%s%s", prefix, suffix[i]);
        if (tj_model_find_layer(b->model, name, &b->idx[i]) != TJ_OK) {
            fprintf(stderr, "bert_block: %s\n", tj_context_error(*ctx));
            return 1;
        }
        tj_model_layer_info(b->model, b->idx[i], &li[i]);
    }
    *h = li[Q].k;
    *inter = li[FFN_IN].n;
    for (int i = 0; i < NGEMM; i++) {
        int64_t want_n = i == FFN_IN ? *inter : *h, want_k = i == FFN_OUT ? *inter : *h;
        if (li[i].n != want_n || li[i].k != want_k) {
            fprintf(stderr, "bert_block: layer '%s' is [%lld × %lld], expected [%lld × %lld] for a BERT block\n",
                    li[i].name, (long long)li[i].n, (long long)li[i].k, (long long)want_n, (long long)want_k);
            return 1;
        }
    }
    b->ffn_act = li[FFN_IN].activation;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *prefix = "encoder.layer.0.", *backend = "auto";
    long m = 128, heads = 12, threads = 0, repeat = 20;
    if (argc < 3 || !strcmp(argv[1], "--help")) {
        fprintf(argc < 3 ? stderr : stdout,
                "usage: bert_block PATTERN WEIGHTS [--prefix encoder.layer.0.] [--m 128] [--heads 12]\n"
                "                  [--backend auto|cpu|cuda|reference] [--threads T] [--repeat 20]\n");
        return argc < 3;
    }
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prefix")) prefix = argv[i + 1];
        else if (!strcmp(argv[i], "--m")) m = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--heads")) heads = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = strtol(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--repeat")) repeat = strtol(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "bert_block: unknown option '%s'\n", argv[i]);
            return 1;
        }
    }
    if ((argc - 3) % 2 || m < 1 || heads < 1 || repeat < 1 || threads < 0) {
        fprintf(stderr, "bert_block: bad arguments (see --help)\n");
        return 1;
    }
    tj_options opt = tj_options_default(), ref_opt = tj_options_default();
    opt.threads = (int)threads;
    if (!strcmp(backend, "cpu")) opt.backend = TJ_BACKEND_CPU;
    else if (!strcmp(backend, "cuda")) opt.backend = TJ_BACKEND_CUDA;
    else if (!strcmp(backend, "reference")) opt.backend = TJ_BACKEND_REFERENCE;
    else if (strcmp(backend, "auto")) {
        fprintf(stderr, "bert_block: unknown backend '%s'\n", backend);
        return 1;
    }
    ref_opt.backend = TJ_BACKEND_REFERENCE;

    tj_context *ctx = NULL, *ref_ctx = NULL;
    block b = {0}, rb = {0};
    bufs u = {0}, r = {0};
    int64_t h = 0, inter = 0, h2, inter2;
    int rc = 1;
    if (open_block(argv[1], argv[2], &opt, prefix, &ctx, &b, &h, &inter)) goto done;
    if (open_block(argv[1], argv[2], &ref_opt, prefix, &ref_ctx, &rb, &h2, &inter2)) goto done;
    if (h % heads) {
        fprintf(stderr, "bert_block: hidden size %lld is not a multiple of %ld heads\n", (long long)h, heads);
        goto done;
    }
    bufs *all[2] = {&u, &r};
    for (int i = 0; i < 2; i++) {
        bufs *p = all[i];
        p->x = malloc((size_t)(m * h) * sizeof(float));
        p->q = malloc((size_t)(m * h) * sizeof(float));
        p->k = malloc((size_t)(m * h) * sizeof(float));
        p->v = malloc((size_t)(m * h) * sizeof(float));
        p->ctx = malloc((size_t)(m * h) * sizeof(float));
        p->h1 = malloc((size_t)(m * h) * sizeof(float));
        p->f = malloc((size_t)(m * inter) * sizeof(float));
        p->y = malloc((size_t)(m * h) * sizeof(float));
        p->scores = malloc((size_t)m * sizeof(float));
        if (!p->x || !p->q || !p->k || !p->v || !p->ctx || !p->h1 || !p->f || !p->y || !p->scores) {
            fprintf(stderr, "bert_block: out of memory\n");
            goto done;
        }
    }
    uint64_t seed = 12345;
    for (int64_t i = 0; i < m * h; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        u.x[i] = r.x[i] = (float)((double)(seed >> 40) / 16777216.0 * 2.0 - 1.0);
    }
    layer_norm(u.x, m, h);
    layer_norm(r.x, m, h);

    if (run_block(&b, &u, m, h, inter, heads) || run_block(&rb, &r, m, h, inter, heads)) {
        fprintf(stderr, "bert_block: %s%s\n", tj_context_error(ctx), tj_context_error(ref_ctx));
        goto done;
    }
    double num = 0, den = 0;
    for (int64_t i = 0; i < m * h; i++) {
        num += ((double)u.y[i] - r.y[i]) * ((double)u.y[i] - r.y[i]);
        den += (double)r.y[i] * r.y[i];
    }
    double err = sqrt(num / (den > 0 ? den : 1));

    memset(b.gemm_s, 0, sizeof b.gemm_s);
    double *times = malloc((size_t)repeat * sizeof *times);
    if (!times) goto done;
    for (long i = 0; i < repeat; i++) {
        double t0 = tj_now();
        if (run_block(&b, &u, m, h, inter, heads)) {
            fprintf(stderr, "bert_block: %s\n", tj_context_error(ctx));
            free(times);
            goto done;
        }
        times[i] = tj_now() - t0;
    }
    qsort(times, (size_t)repeat, sizeof *times, cmp_double);
    double gemms = 0;
    for (int i = 0; i < NGEMM; i++) gemms += b.gemm_s[i];
    printf("bert_block: %s* on backend %s, M = %ld tokens, hidden %lld, FFN %lld, %ld heads\n", prefix,
           tj_backend_name(tj_context_backend(ctx)), m, (long long)h, (long long)inter, heads);
    printf("block median %.3f ms over %ld runs; the six GEMMs %.3f ms of it (", 1e3 * times[repeat / 2], repeat,
           1e3 * gemms / (double)repeat);
    for (int i = 0; i < NGEMM; i++)
        printf("%s%s %.3f", i ? ", " : "", suffix[i], 1e3 * b.gemm_s[i] / (double)repeat);
    printf(" ms)\nblock output vs the reference backend: relative error %.2e\n", err);
    free(times);
    /* a whole block: six GEMMs chained through attention compound the per-layer error that
     * tj_check_bound bounds (fp16 on the GPU) */
    double bound = tj_context_backend(ctx) == TJ_BACKEND_CUDA ? 5e-2 : 1e-4;
    rc = err <= bound ? 0 : 1;
    if (rc) fprintf(stderr, "bert_block: relative error %.2e exceeds %.0e\n", err, bound);
done:
    for (int i = 0; i < 2; i++) {
        bufs *p = i ? &r : &u;
        free(p->x), free(p->q), free(p->k), free(p->v), free(p->ctx), free(p->h1), free(p->f), free(p->y);
        free(p->scores);
    }
    tj_model_destroy(b.model);
    tj_model_destroy(rb.model);
    tj_context_destroy(ctx);
    tj_context_destroy(ref_ctx);
    return rc;
}
