/* Suite 'cpu': the LLVM backend against the reference on fresh random data, for every config the
 * tuner may pick, weight dtypes, empty/full tiles, cols, ew, bias, activations, M from 1 to 1000,
 * odd n and k, g of 32..256; threaded runs bit-identical to single-threaded; many threads calling
 * tj_linear on one model at once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/backend_cpu.h"
#include "base/safetensors.h"
#include "pattern/random.h"
#include "tj_model.h"
#include "tuning/tuning.h"

#define TOL 1e-5

typedef tj_test_case wcase;

typedef struct layer_data {
    tj_layer l;
    void *w;
    void *b;
    tj_layer_weights lw;
} layer_data;

static int make_layer(const wcase *c, uint64_t seed, layer_data *d)
{
    memset(d, 0, sizeof *d);
    if (!tj_test_case_make(c, seed, &d->l, &d->w, &d->b)) return 0;
    d->lw = (tj_layer_weights){d->w, c->wdt, d->b, c->wdt};
    return 1;
}

static void free_layer(layer_data *d)
{
    tj_layer_free(&d->l);
    free(d->w);
    free(d->b);
}

/* Runs compiled layer cl on M tokens on `threads` threads of pool; returns the relative error
 * against the reference, or 1e9 when something was not written (NaN poison survives). */
static double run_one(const tj_cpu_layer *cl, tj_pool *pool, const layer_data *d, int64_t m, int threads, uint64_t seed,
                      float **keep)
{
    const tj_layer *l = &d->l;
    float *x = malloc((size_t)(m * l->k) * sizeof *x), *y = malloc((size_t)(m * l->n) * sizeof *y);
    float *ref = malloc((size_t)(m * l->n) * sizeof *ref);
    tj_rng r = {seed};
    tj_test_fill(&r, x, m * l->k);
    for (int64_t i = 0; i < m * l->n; i++) y[i] = NAN; /* poison: unwritten elements show */
    tj_cpu_layer_run(cl, pool, threads, x, m, y);
    tj_reference_linear(l, &d->lw, x, m, ref);
    double e = tj_test_all_finite(y, m * l->n) ? tj_test_relerr(y, ref, m * l->n) : 1e9;
    if (keep) *keep = y;
    else free(y);
    free(x);
    free(ref);
    return e;
}

static tj_cpu_layer *build(tj_cpu_jit *jit, const layer_data *d, const tj_cpu_config *cfg, const char *prefix)
{
    tj_error err;
    tj_cpu_layer *cl = NULL;
    CHECK_OK(tj_cpu_layer_build(jit, &d->l, &d->lw, cfg, prefix, &cl, &err), &err);
    return cl;
}

static double check_one(tj_cpu_jit *jit, tj_pool *pool, const layer_data *d, const tj_cpu_config *cfg, int64_t m,
                        int threads, uint64_t seed, const char *prefix, float **keep)
{
    tj_cpu_layer *cl = build(jit, d, cfg, prefix);
    if (!cl) return 1e9;
    double e = run_one(cl, pool, d, m, threads, seed, keep);
    tj_cpu_layer_free(cl);
    return e;
}

static const char *cfg_str(const tj_cpu_config *c, char *buf, size_t n)
{
    char *j = tj_cpu_config_to_json(c);
    snprintf(buf, n, "%s", j ? j : "?");
    free(j);
    return buf;
}

/* ---- 1. every tuner config on a set of shapes */
static void test_configs(tj_cpu_jit *jit, tj_pool *pool)
{
    static const wcase shapes[] = {
        {"bert", 256, 192, 128, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},
        {"odd", 203, 131, 64, 0.5, 1, 0, 0, TJ_ACT_RELU, TJ_F32, 1},
        {"tw2", 300, 97, 32, 0.6, 2, 0, 0, TJ_ACT_GELU, TJ_F32, 0},
    };
    static const int64_t ms[] = {1, 5, 13, 29, 100};
    int nc;
    const tj_cpu_config *space = tj_cpu_config_space(&nc);
    int host = tj_cpu_host_vec(), id = 0;
    for (int ci = 0; ci < nc; ci++) {
        tj_cpu_config c = space[ci];
        if (c.vec == 0) c.vec = host;
        if (c.vec > host || tj_cpu_config_check(&c, NULL) != TJ_OK) continue; /* not for this host */
        if (c.dtype == TJ_CPU_ACT_BF16) continue; /* bf16 x: test cpu_bf16 */
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            layer_data d;
            wcase sh = shapes[si];
            if (c.weights == TJ_CPU_WEIGHTS_BF16) sh.wdt = TJ_BF16; /* bf16 kernels on bf16 weights: exact */
            if (!make_layer(&sh, 100 + si, &d)) { CHECK(0); continue; }
            char pre[32], buf[200];
            snprintf(pre, sizeof pre, "c%d", id++);
            tj_cpu_layer *cl = build(jit, &d, &c, pre);
            for (size_t mi = 0; cl && mi < sizeof ms / sizeof *ms; mi++) {
                double e = run_one(cl, pool, &d, ms[mi], 0, 1000 + mi, NULL);
                CHECKF(e <= TOL, "config %s shape %s M=%lld: relerr %g", cfg_str(&c, buf, sizeof buf), shapes[si].what,
                       (long long)ms[mi], e);
            }
            tj_cpu_layer_free(cl);
            free_layer(&d);
        }
    }
}

/* ---- 2. pattern features, dtypes, g, M */
static void test_cases(tj_cpu_jit *jit, tj_pool *pool)
{
    static const wcase cases[] = {
        {"f16", 256, 256, 128, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_F16, 1},
        {"bf16", 256, 256, 128, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_BF16, 1},
        {"empty tiles", 512, 200, 64, 0.5, 1, 0, 0.4, TJ_ACT_RELU, TJ_F32, 1},
        {"full tiles", 256, 77, 128, 0.0, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},
        {"ew", 256, 160, 64, 0.75, 1, 0.02, 0, TJ_ACT_NONE, TJ_F32, 1},
        {"ew gelu", 256, 160, 64, 0.75, 1, 0.03, 0, TJ_ACT_GELU, TJ_F32, 1},
        {"ew relu cols", 333, 150, 32, 0.75, 2, 0.02, 0.1, TJ_ACT_RELU, TJ_BF16, 1},
        {"cols no bias", 400, 129, 128, 0.8, 2, 0, 0, TJ_ACT_NONE, TJ_F32, 0},
        {"gelu", 384, 100, 128, 0.5, 1, 0, 0, TJ_ACT_GELU, TJ_F32, 1},
        {"relu", 384, 100, 128, 0.5, 1, 0, 0, TJ_ACT_RELU, TJ_F16, 0},
        {"g32", 96, 64, 32, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},
        {"g64 odd", 131, 67, 64, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},
        {"g256", 512, 300, 256, 0.9, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},
        {"g256 short tail", 300, 129, 256, 0.75, 1, 0, 0, TJ_ACT_RELU, TJ_F32, 1},
        {"odd g", 101, 33, 20, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},
        {"all pruned rows", 128, 50, 64, 0.99, 1, 0, 0, TJ_ACT_GELU, TJ_F32, 1},
        {"single", 1, 1, 1, 0.0, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},
    };
    static const int64_t ms[] = {1, 2, 7, 12, 16, 37, 128, 1000};
    int id = 0;
    tj_cpu_config table = tj_cpu_config_default(), unr = table, kblk = table;
    unr.offsets = TJ_CPU_OFFSETS_UNROLLED;
    kblk.kc = 7; /* k-blocking with odd chunks, small work items, another register block */
    kblk.mb = 12;
    kblk.mr = tj_cpu_host_vec() >= 16 ? 12 : 4; /* a block that fits the host's registers */
    kblk.nr = tj_cpu_host_vec() >= 16 ? 32 : 16;
    const tj_cpu_config *modes[3] = {&table, &unr, &kblk};
    static const char *mode_names[3] = {"table", "unrolled", "table kc=7"};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        layer_data d;
        if (!make_layer(&cases[ci], 7 + ci, &d)) { CHECK(0); continue; }
        for (int mode = 0; mode < 3; mode++) {
            const tj_cpu_config *c = modes[mode];
            char pre[32];
            snprintf(pre, sizeof pre, "k%d", id++);
            tj_cpu_layer *cl = build(jit, &d, c, pre);
            for (size_t mi = 0; cl && mi < sizeof ms / sizeof *ms; mi++) {
                double e = run_one(cl, pool, &d, ms[mi], 0, 77 + mi, NULL);
                CHECKF(e <= TOL, "case %s M=%lld %s: relerr %g", cases[ci].what, (long long)ms[mi], mode_names[mode], e);
            }
            tj_cpu_layer_free(cl);
        }
        free_layer(&d);
    }
}

/* ---- 2b. decode- and mid-sized calls: the per-thread shares of work pieces (one token chunk,
 * M ≤ mb; and up to 512 tokens, each piece over its token chunks), exact token blocks for M ≤ 8,
 * the k-blocking "auto" resolves to on long tiles, pieces narrower than a column block; every M
 * from 1 to 9, around the chunk size and around 512 (where work items take over), on 1, 2 and 4
 * threads, each against the reference and bit for bit the single-thread result */
static void test_decode_splits(tj_cpu_jit *jit, tj_pool *pool)
{
    static const wcase cases[] = {
        {"long k", 150, 5800, 64, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},   /* 2900 kept rows a tile */
        {"k < kc", 333, 100, 128, 0.5, 1, 0, 0, TJ_ACT_GELU, TJ_F32, 1},
        {"g 100", 300, 257, 100, 0.75, 1, 0, 0, TJ_ACT_RELU, TJ_F32, 0},   /* pieces 64 + 36 wide */
        {"cols empty", 203, 190, 32, 0.6, 2, 0, 0.4, TJ_ACT_NONE, TJ_F32, 1}, /* scatter, empty tiles */
        {"ew", 130, 300, 64, 0.75, 1, 0.02, 0, TJ_ACT_GELU, TJ_BF16, 1},
        {"one tile", 20, 40, 20, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},   /* one piece, 2 threads */
    };
    static const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 95, 96, 97, 200, 512, 513};
    static const int threads[] = {2, 0}; /* 0: the pool's 4 */
    int vec = tj_cpu_host_vec(), id = 0;
    tj_cpu_config def = tj_cpu_config_default(), wide = def, kc5 = def, avx2 = tj_cpu_config_default_vec(8);
    wide.mr = vec >= 16 ? 12 : 4; /* token tails 9..11 run 8 + the rest */
    wide.nr = vec >= 16 ? 32 : 2 * vec;
    kc5.kc = 5;
    avx2.vec = 8; /* the AVX2 defaults (blocking table row 8) also on an AVX-512 host */
    const tj_cpu_config *cfgs[4] = {&def, &wide, &kc5, &avx2};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        layer_data d;
        if (!make_layer(&cases[ci], 300 + ci, &d)) { CHECK(0); continue; }
        for (int k = 0; k < (vec >= 8 ? 4 : 3); k++) {
            char pre[32], buf[300];
            snprintf(pre, sizeof pre, "ds%d", id++);
            tj_cpu_layer *cl = build(jit, &d, cfgs[k], pre);
            if (!cl) continue;
            /* the pieces cover every kept column once, and the kernel has as many slots */
            int64_t np = tj_cpu_pieces(&cl->pk->plan, &cl->cfg, NULL), cols = 0;
            tj_cpu_piece *pc = malloc((size_t)np * sizeof *pc);
            tj_cpu_pieces(&cl->pk->plan, &cl->cfg, pc);
            for (int64_t i = 0; i < np; i++) cols += pc[i].width;
            CHECKF(np == cl->info.nslots && cols == d.l.ncols && cl->cum[np] > 0, "%s: %lld pieces, %lld slots, %lld columns",
                   cases[ci].what, (long long)np, (long long)cl->info.nslots, (long long)cols);
            free(pc);
            if (k == 0 || k == 3) /* kc auto: the blocking table's chunks on long tiles only */
                CHECKF((cl->cfg.kc > 0) == (ci == 0 && vec >= 8), "%s: kc resolved to %d", cases[ci].what, cl->cfg.kc);
            for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
                float *y1 = NULL;
                double e1 = run_one(cl, pool, &d, ms[mi], 1, 900 + mi, &y1);
                CHECKF(e1 <= TOL, "%s %s M=%lld 1 thread: relerr %g", cases[ci].what, cfg_str(&cl->cfg, buf, sizeof buf),
                       (long long)ms[mi], e1);
                for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
                    float *yt = NULL;
                    double et = run_one(cl, pool, &d, ms[mi], threads[ti], 900 + mi, &yt);
                    CHECKF(et <= TOL && y1 && yt && memcmp(y1, yt, (size_t)(ms[mi] * d.l.n) * sizeof *y1) == 0,
                           "%s %s M=%lld threads %d: relerr %g, or not bit for bit the 1-thread result", cases[ci].what,
                           cfg_str(&cl->cfg, buf, sizeof buf), (long long)ms[mi], threads[ti], et);
                    free(yt);
                }
                free(y1);
            }
            tj_cpu_layer_free(cl);
        }
        free_layer(&d);
    }
}

/* Config cfg on m tokens: within TOL of the reference on 1 thread and on `threads` (0: the
 * pool's), and the two results bit for bit the same. */
static void check_threads_same(tj_cpu_jit *jit, tj_pool *pool, const layer_data *d, const tj_cpu_config *cfg, int64_t m,
                               int threads, uint64_t seed, const char *what)
{
    static int calls; /* JIT symbol prefixes are unique per build */
    char p1[32], p2[32];
    snprintf(p1, sizeof p1, "ts%d", 2 * calls);
    snprintf(p2, sizeof p2, "ts%d", 2 * calls++ + 1);
    float *y1 = NULL, *y2 = NULL;
    double e1 = check_one(jit, pool, d, cfg, m, 1, seed, p1, &y1);
    double e2 = check_one(jit, pool, d, cfg, m, threads, seed, p2, &y2);
    CHECKF(e1 <= TOL && e2 <= TOL, "%s: relerr %g (1 thread) / %g (%d threads)", what, e1, e2, threads);
    CHECKF(y1 && y2 && memcmp(y1, y2, (size_t)(m * d->l.n) * sizeof *y1) == 0, "%s: threads differ", what);
    free(y1);
    free(y2);
}

/* ---- 3. threads give bit-identical results */
static void test_threads_identical(tj_cpu_jit *jit, tj_pool *pool)
{
    wcase c = {"threads", 768, 384, 128, 0.75, 1, 0.01, 0, TJ_ACT_GELU, TJ_F32, 1};
    layer_data d;
    if (!make_layer(&c, 42, &d)) { CHECK(0); return; }
    tj_cpu_config cfg = tj_cpu_config_default();
    check_threads_same(jit, pool, &d, &cfg, 333, 0, 5, "threads");
    free_layer(&d);
}

/* ---- 3b. the large-call rule: pack auto (-1) resolves per call size. On the AVX2 row of the
 * blocking table a call whose X is over 16 MB gathers each tile's X once per item (pack 1, mb
 * 32); smaller calls, an explicit pack or mb, and the AVX-512 row keep pack 0. The large-call
 * variant is checked against the reference on such a call, on 1 and 2 threads. */
static void test_large_call_pack(tj_cpu_jit *jit, tj_pool *pool)
{
    wcase c = {"large call", 100, 8192, 64, 0.5, 1, 0, 0, TJ_ACT_RELU, TJ_F32, 1};
    layer_data d;
    if (!make_layer(&c, 77, &d)) { CHECK(0); return; }
    int64_t big = 520, small = 256; /* X: 520 · 8192 floats = 16.3 MB; 256: 8 MB */
    tj_cpu_config avx2 = tj_cpu_config_default_vec(8);
    avx2.vec = 8;
    CHECKF(avx2.pack == -1, "the default's pack is %d, not auto", avx2.pack);
    tj_cpu_config r = avx2;
    tj_cpu_config_resolve_m(&r, &d.l, big);
    CHECKF(r.pack == 1 && r.mb == 32 && r.kc == 0, "M=%lld: pack %d mb %d kc %d", (long long)big, r.pack, r.mb, r.kc);
    r = avx2;
    tj_cpu_config_resolve_m(&r, &d.l, small);
    CHECKF(r.pack == 0 && r.mb == 0, "M=%lld: pack %d mb %d", (long long)small, r.pack, r.mb);
    r = avx2;
    tj_cpu_config_resolve_m(&r, &d.l, TJ_M_TOP); /* the runtime's top classes: X 128 MB */
    CHECKF(r.pack == 1 && r.mb == 32, "M %lld: pack %d mb %d", (long long)TJ_M_TOP, r.pack, r.mb);
    r = avx2;
    tj_cpu_config_resolve_m(&r, &d.l, 0); /* no call size: no size rule */
    CHECKF(r.pack == 0 && r.mb == 0, "M unknown: pack %d mb %d", r.pack, r.mb);
    wcase cs = c;
    cs.k = 512; /* X at M = 4096: 8 MB */
    layer_data ds;
    if (!make_layer(&cs, 78, &ds)) { CHECK(0); free_layer(&d); return; }
    r = avx2;
    tj_cpu_config_resolve_m(&r, &ds.l, TJ_M_TOP);
    CHECKF(r.pack == 0, "M %lld, k 512: pack %d", (long long)TJ_M_TOP, r.pack);
    free_layer(&ds);
    r = avx2;
    r.pack = 0;
    tj_cpu_config_resolve_m(&r, &d.l, big);
    CHECKF(r.pack == 0 && r.mb == 0, "explicit pack 0: pack %d mb %d", r.pack, r.mb);
    r = avx2;
    r.mb = 48;
    tj_cpu_config_resolve_m(&r, &d.l, big);
    CHECKF(r.pack == 0 && r.mb == 48, "explicit mb 48: pack %d mb %d", r.pack, r.mb);
    r = tj_cpu_config_default_vec(16);
    r.vec = 16;
    tj_cpu_config_resolve_m(&r, &d.l, big);
    CHECKF(r.pack == 0, "AVX-512 row: pack %d", r.pack);
    tj_error err;
    char *j = tj_cpu_config_to_json(&avx2);
    tj_cpu_config back;
    CHECKF(j && tj_cpu_config_from_json(j, &back, &err) == TJ_OK && back.pack == -1, "pack -1 round trip: %s", j ? j : "?");
    free(j);
    CHECKF(tj_cpu_config_from_json("{\"pack\": -2}", &back, &err) != TJ_OK, "pack -2 accepted");
    if (tj_cpu_host_vec() >= 8) {
        r = avx2;
        tj_cpu_config_resolve_m(&r, &d.l, big);
        check_threads_same(jit, pool, &d, &r, big, 2, 11, "large call");
    }
    free_layer(&d);
}

/* The host order rule (Zen 5): long k goes tile-major, calls whose X outgrows the L3
 * chunk-major, other hosts keep the blocking table's rule; on this host the default config
 * resolves to it, and a chunk-major long-k kernel matches the reference. */
static void test_order_rule(tj_cpu_jit *jit, tj_pool *pool)
{
    wcase lk = {"order, k 11008", 128, 11008, 128, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 0};
    wcase mk = {"order, k 4096", 128, 4096, 128, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 0};
    wcase sk = {"order, k 768", 128, 768, 128, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 0};
    layer_data dl, dm, ds;
    if (!make_layer(&lk, 91, &dl)) { CHECK(0); return; }
    if (!make_layer(&mk, 92, &dm)) { CHECK(0); free_layer(&dl); return; }
    if (!make_layer(&sk, 93, &ds)) { CHECK(0); free_layer(&dl); free_layer(&dm); return; }
    const struct { const char *cpu; const layer_data *d; int xb; int64_t m; int want; } cases[] = {
        {"znver5", &dl, 4, 512, 1},  /* X 22.5 MB */
        {"znver5", &dl, 4, 128, 0},  /* X 5.6 MB; 48 tokens of k 11008: 2.1 MB */
        {"znver5", &dl, 4, 0, 0},    {"znver5", &dm, 4, 512, 0}, {"znver5", &dm, 4, 0, 0},
        {"znver5", &dm, 2, 0, -1},   /* bf16 x: 48 tokens of k 4096 take 384 KB */
        {"znver5", &ds, 4, 0, -1},   {"znver5", &ds, 4, 8192, 1}, /* X 24 MB */
        {"znver4", &dl, 4, 512, -1}, {"sapphirerapids", &dm, 4, 0, -1}, {"znver3", &dl, 4, 512, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int got = tj_cpu_order_for(cases[i].cpu, &cases[i].d->l, cases[i].xb, cases[i].m);
        CHECKF(got == cases[i].want, "%s, %s, %d-byte x, M=%lld: order %d, want %d", cases[i].cpu, cases[i].d->l.name,
               cases[i].xb, (long long)cases[i].m, got, cases[i].want);
    }
    int host = tj_cpu_order_for(tj_host_cpu_name(), &dm.l, 4, 0);
    tj_cpu_config r = tj_cpu_config_default();
    tj_cpu_config_resolve(&r, &dm.l);
    CHECKF(host < 0 || r.order == host, "host %s, k 4096: order %d, the host's rule %d", tj_host_cpu_name(), r.order, host);
    r = tj_cpu_config_default();
    r.order = 0; /* an explicit order wins over the host's rule */
    tj_cpu_config_resolve_m(&r, &dl.l, 512);
    CHECKF(r.order == 0, "explicit order 0 became %d", r.order);
    r = tj_cpu_config_default();
    tj_cpu_config_resolve_m(&r, &dl.l, 512);
    int want = tj_cpu_order_for(tj_host_cpu_name(), &dl.l, 4, 512);
    CHECKF(want < 0 || r.order == want, "host %s, k 11008, M=512: order %d, the host's rule %d", tj_host_cpu_name(), r.order, want);
    r = tj_cpu_config_default();
    r.order = 1;
    tj_cpu_config_resolve(&r, &dl.l);
    check_threads_same(jit, pool, &dl, &r, 61, 2, 19, "order 1, k 11008");
    free_layer(&dl);
    free_layer(&dm);
    free_layer(&ds);
}

/* The prefetch rules by host and call size, and kernels with the prefetch pinned (none and a
 * longer distance) against the reference. */
static void test_prefetch(tj_cpu_jit *jit, tj_pool *pool)
{
    wcase big = {"prefetch, 40 MB kept", 2560, 8192, 128, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 0};
    wcase small = {"prefetch, 2 MB kept", 512, 2048, 128, 0.5, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 0};
    layer_data db, ds;
    if (!make_layer(&big, 81, &db)) { CHECK(0); return; }
    if (!make_layer(&small, 82, &ds)) { CHECK(0); free_layer(&db); return; }
    const struct { const char *cpu; int vec; const layer_data *d; int64_t m; int want; } cases[] = {
        {"znver3", 8, &db, 1, 0},     {"znver3", 8, &db, 2, 0},      {"znver3", 8, &db, 4, 1024},
        {"znver3", 8, &db, 0, 1024},  {"znver3", 8, &ds, 1, 1024},   {"znver4", 16, &db, 1, 1024},
        {"znver4", 16, &ds, 1, 0},    {"znver4", 16, &ds, 0, 0},     {"znver5", 16, &db, 512, 1024},
        {"sapphirerapids", 16, &db, 1, 1024}, {"znver3", 8, &db, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int wb = i == sizeof cases / sizeof *cases - 1 ? 2 : 4; /* bf16: 20 MB kept, inside */
        int want = wb == 2 ? 1024 : cases[i].want;
        int got = tj_cpu_prefetch_for(cases[i].cpu, cases[i].vec, &cases[i].d->l, wb, cases[i].m);
        CHECKF(got == want, "%s, %s, M=%lld, %d-byte weights: prefetch %d, want %d", cases[i].cpu, cases[i].d->l.name,
               (long long)cases[i].m, wb, got, want);
    }
    /* resolve_m pins the prefetch only where the call's size changes the host's choice */
    tj_cpu_config r = tj_cpu_config_default();
    CHECKF(r.prefetch == -1, "the default's prefetch is %d, not auto", r.prefetch);
    int host_any = tj_cpu_prefetch_for(tj_host_cpu_name(), tj_cpu_host_vec(), &db.l, 4, 0);
    for (int64_t m = 1; m <= 8; m *= 2) {
        r = tj_cpu_config_default();
        tj_cpu_config_resolve_m(&r, &db.l, m);
        int host_m = tj_cpu_prefetch_for(tj_host_cpu_name(), tj_cpu_host_vec(), &db.l, 4, m);
        CHECKF(r.prefetch == (host_m == host_any ? -1 : host_m), "host %s, M=%lld: prefetch %d", tj_host_cpu_name(),
               (long long)m, r.prefetch);
    }
    tj_error err;
    tj_cpu_config back;
    CHECKF(tj_cpu_config_from_json("{\"prefetch\": 96}", &back, &err) == TJ_OK, "prefetch 96: %s", err.msg);
    tj_cpu_config_resolve(&back, &ds.l);
    CHECKF(tj_cpu_config_check(&back, &err) != TJ_OK, "prefetch 96 (not a whole number of lines) passed the check");
    CHECKF(tj_cpu_config_from_json("{\"prefetch\": -2}", &back, &err) != TJ_OK, "prefetch -2 accepted");
    for (int pf = 0; pf <= 2048; pf += 2048) {
        tj_cpu_config c = tj_cpu_config_default();
        c.prefetch = pf;
        char *j = tj_cpu_config_to_json(&c);
        CHECKF(j && tj_cpu_config_from_json(j, &back, &err) == TJ_OK && back.prefetch == pf, "prefetch %d round trip: %s", pf,
               j ? j : "?");
        free(j);
        tj_cpu_config_resolve(&c, &ds.l);
        check_threads_same(jit, pool, &ds, &c, 1, 2, 13 + pf, pf ? "prefetch 2048" : "prefetch none");
        check_threads_same(jit, pool, &ds, &c, 37, 2, 17 + pf, pf ? "prefetch 2048" : "prefetch none");
    }
    free_layer(&db);
    free_layer(&ds);
}

/* ---- 4. many threads on one compiled layer (pool contention: losers run alone) */
typedef struct shared_run {
    const tj_cpu_layer *cl;
    const layer_data *d;
    tj_pool *pool;
    int id;
    double err;
} shared_run;

static void *hammer(void *vp)
{
    shared_run *s = vp;
    int64_t m = 17 + 31 * s->id;
    const tj_layer *l = &s->d->l;
    float *x = malloc((size_t)(m * l->k) * sizeof *x), *y = malloc((size_t)(m * l->n) * sizeof *y);
    float *ref = malloc((size_t)(m * l->n) * sizeof *ref);
    tj_rng r = {(uint64_t)s->id + 99};
    tj_test_fill(&r, x, m * l->k);
    tj_reference_linear(l, &s->d->lw, x, m, ref);
    s->err = 0;
    for (int it = 0; it < 30; it++) {
        for (int64_t i = 0; i < m * l->n; i++) y[i] = NAN;
        tj_cpu_layer_run(s->cl, s->pool, 0, x, m, y);
        double e = tj_test_all_finite(y, m * l->n) ? tj_test_relerr(y, ref, m * l->n) : 1e9;
        if (e > s->err) s->err = e;
    }
    free(x);
    free(y);
    free(ref);
    return NULL;
}

static void test_concurrent(tj_cpu_jit *jit, tj_pool *pool)
{
    wcase c = {"concurrent", 512, 256, 64, 0.75, 1, 0, 0, TJ_ACT_RELU, TJ_F32, 1};
    layer_data d;
    if (!make_layer(&c, 9, &d)) { CHECK(0); return; }
    tj_error err;
    tj_cpu_layer *cl = NULL;
    CHECK_OK(tj_cpu_layer_build(jit, &d.l, &d.lw, NULL, "conc", &cl, &err), &err);
    if (cl) {
        enum { NT = 8 };
        pthread_t th[NT];
        shared_run sr[NT];
        for (int i = 0; i < NT; i++) {
            sr[i] = (shared_run){cl, &d, pool, i, 0};
            pthread_create(&th[i], NULL, hammer, &sr[i]);
        }
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            CHECKF(sr[i].err <= TOL, "thread %d: relerr %g", i, sr[i].err);
        }
    }
    tj_cpu_layer_free(cl);
    free_layer(&d);
}

/* ---- 5. the public API: a two-layer model on the cpu backend, many threads calling tj_linear
 * on it at once (the pool is shared: callers that find it busy run alone) */
typedef struct api_run {
    tj_model *m;
    const layer_data *d;
    int id;
    double err;
    int fails;
} api_run;

static void *api_hammer(void *vp)
{
    api_run *a = vp;
    a->err = 0;
    for (int it = 0; it < 20; it++) {
        const layer_data *d = &a->d[(a->id + it) % 2];
        int64_t m = 1 + (a->id * 37 + it * 11) % 90;
        const tj_layer *l = &d->l;
        float *x = malloc((size_t)(m * l->k) * sizeof *x), *y = malloc((size_t)(m * l->n) * sizeof *y);
        float *ref = malloc((size_t)(m * l->n) * sizeof *ref);
        tj_rng r = {(uint64_t)(a->id * 1000 + it)};
        tj_test_fill(&r, x, m * l->k);
        for (int64_t i = 0; i < m * l->n; i++) y[i] = NAN;
        int64_t xs[2] = {m, l->k}, ys[2] = {m, l->n};
        DLTensor xt = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
        DLTensor yt = {y, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, ys, NULL, 0};
        if (tj_linear(a->m, l->name, &xt, &yt, NULL) != TJ_OK) a->fails++;
        tj_reference_linear(l, &d->lw, x, m, ref);
        double e = tj_test_all_finite(y, m * l->n) ? tj_test_relerr(y, ref, m * l->n) : 1e9;
        /* bf16 weights compute in bf16 by default where the CPU has bf16 instructions: its bound */
        tj_precision pr = TJ_PRECISION_F32;
        int64_t li = 0;
        tj_model_find_layer(a->m, l->name, &li);
        tj_model_layer_precision(a->m, li, m, &pr);
        if (pr == TJ_PRECISION_BF16) e *= TOL / tj_check_bound(TJ_BF16);
        if (e > a->err) a->err = e;
        free(x);
        free(y);
        free(ref);
    }
    return NULL;
}

static void test_public_api(void)
{
    char dir[] = "/tmp/tj_cpu_api_XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    char pat[300], wts[300];
    snprintf(pat, sizeof pat, "%s/p.json", dir);
    snprintf(wts, sizeof wts, "%s/w.safetensors", dir);
    static const wcase cs[2] = {
        {"enc.fc1", 320, 96, 64, 0.75, 2, 0.02, 0, TJ_ACT_GELU, TJ_F32, 1},
        {"enc.fc2", 96, 320, 32, 0.5, 1, 0, 0.2, TJ_ACT_NONE, TJ_BF16, 0},
    };
    layer_data d[2];
    tj_error err;
    if (!make_layer(&cs[0], 21, &d[0]) || !make_layer(&cs[1], 22, &d[1])) { CHECK(0); return; }
    tj_layer ls[2] = {d[0].l, d[1].l};
    tj_pattern p = {.nlayers = 2, .layers = ls};
    CHECK_OK(tj_pattern_save(&p, pat, &err), &err);
    int64_t s0[2] = {cs[0].n, cs[0].k}, b0[1] = {cs[0].n}, s1[2] = {cs[1].n, cs[1].k};
    tj_st_out_tensor t[3] = {
        {"enc.fc1.weight", "F32", 2, s0, d[0].w, (uint64_t)(cs[0].n * cs[0].k) * 4},
        {"enc.fc1.bias", "F32", 1, b0, d[0].b, (uint64_t)cs[0].n * 4},
        {"enc.fc2.weight", "BF16", 2, s1, d[1].w, (uint64_t)(cs[1].n * cs[1].k) * 2},
    };
    CHECK_OK(tj_st_write(wts, t, 3, NULL, &err), &err);
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CPU;
    o.threads = 2;
    tj_context *c = NULL;
    tj_model *m = NULL;
    CHECK(tj_context_create(&o, &c) == TJ_OK);
    if (c && tj_model_load(c, pat, wts, &m) != TJ_OK) fprintf(stderr, "load: %s\n", tj_context_error(c));
    CHECK(m != NULL);
    if (m) {
        CHECK(tj_context_backend(c) == TJ_BACKEND_CPU);
        enum { NT = 8 };
        pthread_t th[NT];
        api_run ar[NT];
        for (int i = 0; i < NT; i++) {
            ar[i] = (api_run){m, d, i, 0, 0};
            pthread_create(&th[i], NULL, api_hammer, &ar[i]);
        }
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            CHECKF(ar[i].fails == 0 && ar[i].err <= TOL, "thread %d: %d failed calls, relerr %g", i, ar[i].fails, ar[i].err);
        }
    }
    tj_model_destroy(m);
    tj_context_destroy(c);
    remove(pat);
    remove(wts);
    rmdir(dir);
    free_layer(&d[0]);
    free_layer(&d[1]);
}

/* ---- 7. per-M variants share one packing when their layouts agree: configs that differ only in
 * code (mr, unroll, mb, kc, serial, order, pack, offsets) take the first peer's packed weights;
 * another nr, vec or stored type packs its own. Every variant matches the reference, a sharer
 * gives the same bits as the same config packed alone, and outlives the peer it shares with. */
static void test_shared_packing(tj_cpu_jit *jit, tj_pool *pool)
{
    wcase c = {"shared", 320, 200, 64, 0.75, 2, 0.02, 0, TJ_ACT_GELU, TJ_F32, 1};
    layer_data d;
    if (!make_layer(&c, 61, &d)) { CHECK(0); return; }
    int host = tj_cpu_host_vec();
    tj_cpu_config base = tj_cpu_config_default();
    base.vec = host;
    tj_cpu_config same[6], other[3];
    for (int i = 0; i < 6; i++) same[i] = base;
    same[0].mr = base.mr > 2 ? base.mr - 2 : base.mr + 1;
    same[0].unroll = 1;
    same[1].mb = 24;
    same[1].kc = 5;
    same[2].serial = -1;
    same[2].order = 1;
    same[3].pack = 2;
    same[4].offsets = TJ_CPU_OFFSETS_UNROLLED;
    same[4].unroll = 8;
    same[5].weights = TJ_CPU_WEIGHTS_F32; /* what auto resolves to for fp32 weights */
    other[0] = base;
    other[0].nr = base.nr == 2 * host ? 3 * host : 2 * host;
    other[0].mr = 2;
    other[1] = base;
    other[1].weights = TJ_CPU_WEIGHTS_BF16;
    int nother = 2;
    if (host >= 8) { /* a narrower vector: another plan padding */
        other[2] = base;
        other[2].vec = 4;
        other[2].mr = 4;
        other[2].nr = 8;
        nother = 3;
    }
    tj_error err;
    tj_cpu_layer *peers[1 + 6 + 3] = {NULL};
    int np = 0;
    CHECK_OK(tj_cpu_layer_build_shared(jit, &d.l, &d.lw, &base, "sh0", peers, 0, &peers[np], &err), &err);
    if (!peers[0]) { free_layer(&d); return; }
    CHECK(peers[0]->packed_here == 1);
    np++;
    char pre[32], buf[200];
    for (int i = 0; i < 6; i++, np++) {
        snprintf(pre, sizeof pre, "sh%d", np);
        CHECK_OK(tj_cpu_layer_build_shared(jit, &d.l, &d.lw, &same[i], pre, peers, np, &peers[np], &err), &err);
        CHECKF(peers[np] && peers[np]->pk == peers[0]->pk && !peers[np]->packed_here, "config %s packed its own copy",
               cfg_str(&same[i], buf, sizeof buf));
    }
    for (int i = 0; i < nother; i++, np++) {
        snprintf(pre, sizeof pre, "sh%d", np);
        CHECK_OK(tj_cpu_layer_build_shared(jit, &d.l, &d.lw, &other[i], pre, peers, np, &peers[np], &err), &err);
        CHECKF(peers[np] && peers[np]->pk != peers[0]->pk && peers[np]->packed_here, "config %s shared another layout",
               cfg_str(&other[i], buf, sizeof buf));
    }
    CHECK(atomic_load(&peers[0]->pk->refs) == 7);
    for (int i = 0; i < np; i++) {
        if (!peers[i]) continue;
        double tol = peers[i]->cfg.weights == TJ_CPU_WEIGHTS_BF16 ? 1e-2 : TOL; /* fp32 weights rounded to bf16 */
        for (int64_t m = 1; m <= 100; m += 33) {
            double e = run_one(peers[i], pool, &d, m, 0, 300 + (uint64_t)m, NULL);
            CHECKF(e <= tol, "variant %d %s M=%lld: relerr %g", i, cfg_str(&peers[i]->cfg, buf, sizeof buf), (long long)m, e);
        }
    }
    /* the same config packed alone gives the same bits */
    tj_cpu_layer *alone = build(jit, &d, &same[1], "shalone");
    float *y1 = NULL, *y2 = NULL;
    if (alone && peers[2]) {
        CHECK(alone->pk != peers[2]->pk && alone->packed_here);
        run_one(alone, pool, &d, 57, 0, 9, &y1);
        run_one(peers[2], pool, &d, 57, 0, 9, &y2);
        CHECK(y1 && y2 && memcmp(y1, y2, (size_t)(57 * c.n) * sizeof *y1) == 0);
    }
    free(y1);
    free(y2);
    tj_cpu_layer_free(alone);
    /* the first owner goes first: the sharers keep the packing */
    tj_cpu_layer_free(peers[0]);
    peers[0] = NULL;
    if (peers[3]) {
        CHECK(atomic_load(&peers[3]->pk->refs) == 6);
        double e = run_one(peers[3], pool, &d, 29, 0, 41, NULL);
        CHECKF(e <= TOL, "sharer after its owner was freed: relerr %g", e);
    }
    for (int i = 0; i < np; i++) tj_cpu_layer_free(peers[i]);
    free_layer(&d);
}

/* ---- 8. a bf16 layer behind tj_linear's fp32 tensors (x rounded, y widened in the calling
 * thread's scratch): many threads at once, each with M changing every call, against the
 * reference; each thread's scratch starts empty, holds at least the call's bytes, never shrinks
 * and is not reallocated for a call no larger than one before; tj_context_destroy frees the
 * destroying thread's. */
#define BF16_BOUND 1e-2 /* tj_check_bound(TJ_BF16) */

typedef struct bf_run {
    tj_model *m;
    const layer_data *d;
    int id;
    double err;
    int fails;   /* failed calls or scratch rule broken */
} bf_run;

static double bf_call(tj_model *mdl, const layer_data *d, int64_t m, uint64_t seed, int *fails)
{
    const tj_layer *l = &d->l;
    float *x = malloc((size_t)(m * l->k) * sizeof *x), *y = malloc((size_t)(m * l->n) * sizeof *y);
    float *ref = malloc((size_t)(m * l->n) * sizeof *ref);
    tj_rng r = {seed};
    tj_test_fill(&r, x, m * l->k);
    for (int64_t i = 0; i < m * l->n; i++) y[i] = NAN;
    int64_t xs[2] = {m, l->k}, ys[2] = {m, l->n};
    DLTensor xt = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
    DLTensor yt = {y, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, ys, NULL, 0};
    if (tj_linear(mdl, l->name, &xt, &yt, NULL) != TJ_OK) (*fails)++;
    tj_reference_linear(l, &d->lw, x, m, ref);
    double e = tj_test_all_finite(y, m * l->n) ? tj_test_relerr(y, ref, m * l->n) : 1e9;
    free(x);
    free(y);
    free(ref);
    return e;
}

static void *bf_hammer(void *vp)
{
    bf_run *a = vp;
    const tj_layer *l = &a->d->l;
    size_t cap = tj_cpu_thread_scratch_bytes();
    if (cap != 0) a->fails++;
    int64_t mmax = 0;
    for (int it = 0; it < 24; it++) {
        int64_t m = it == 23 ? mmax : 1 + (a->id * 29 + it * 13) % 120; /* the last: no larger than before */
        double e = bf_call(a->m, a->d, m, (uint64_t)(a->id * 100 + it), &a->fails);
        if (e > a->err) a->err = e;
        size_t now = tj_cpu_thread_scratch_bytes();
        if (now < (size_t)(2 * m * (l->k + l->n)) || now < cap || (m <= mmax && now != cap)) a->fails++;
        cap = now;
        if (m > mmax) mmax = m;
    }
    return NULL;
}

static void test_bf16_scratch(void)
{
    char dir[] = "/tmp/tj_cpu_bf16s_XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0); return; }
    char pat[300], wts[300];
    snprintf(pat, sizeof pat, "%s/p.json", dir);
    snprintf(wts, sizeof wts, "%s/w.safetensors", dir);
    wcase cs = {"enc.fc1", 320, 96, 64, 0.75, 2, 0.02, 0, TJ_ACT_GELU, TJ_F32, 1};
    layer_data d;
    tj_error err;
    if (!make_layer(&cs, 31, &d)) { CHECK(0); return; }
    tj_pattern p = {.nlayers = 1, .layers = &d.l};
    CHECK_OK(tj_pattern_save(&p, pat, &err), &err);
    int64_t s0[2] = {cs.n, cs.k}, b0[1] = {cs.n};
    tj_st_out_tensor t[2] = {
        {"enc.fc1.weight", "F32", 2, s0, d.w, (uint64_t)(cs.n * cs.k) * 4},
        {"enc.fc1.bias", "F32", 1, b0, d.b, (uint64_t)cs.n * 4},
    };
    CHECK_OK(tj_st_write(wts, t, 2, NULL, &err), &err);
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CPU;
    o.threads = 2;
    tj_context *c = NULL;
    tj_model *m = NULL;
    CHECK(tj_context_create(&o, &c) == TJ_OK);
    if (c) CHECK_OK(tj_context_set_config(c, "{\"dtype\": \"bf16\", \"out\": \"bf16\"}", &err), &err);
    if (c && tj_model_load(c, pat, wts, &m) != TJ_OK) fprintf(stderr, "load: %s\n", tj_context_error(c));
    CHECK(m != NULL);
    if (m) {
        const char *cfg = NULL;
        CHECK(tj_model_layer_config(m, 0, 7, &cfg) == TJ_OK && cfg && strstr(cfg, "\"dtype\": \"bf16\"") &&
              strstr(cfg, "\"out\": \"bf16\""));
        enum { NT = 8 };
        pthread_t th[NT];
        bf_run br[NT];
        for (int i = 0; i < NT; i++) {
            br[i] = (bf_run){m, &d, i, 0, 0};
            pthread_create(&th[i], NULL, bf_hammer, &br[i]);
        }
        for (int i = 0; i < NT; i++) {
            pthread_join(th[i], NULL);
            CHECKF(br[i].fails == 0 && br[i].err <= BF16_BOUND, "thread %d: %d failures, relerr %g", i, br[i].fails,
                   br[i].err);
        }
        int fails = 0;
        double e = bf_call(m, &d, 64, 5, &fails);
        CHECKF(fails == 0 && e <= BF16_BOUND && tj_cpu_thread_scratch_bytes() >= (size_t)(2 * 64 * (cs.n + cs.k)),
               "calling thread: %d failures, relerr %g, scratch %zu", fails, e, tj_cpu_thread_scratch_bytes());
    }
    tj_model_destroy(m);
    tj_context_destroy(c);
    CHECK(tj_cpu_thread_scratch_bytes() == 0);
    remove(pat);
    remove(wts);
    rmdir(dir);
    free_layer(&d);
}

/* ---- 6. config JSON round trip, determinism of the IR text, errors */
static void test_config_and_ir(void)
{
    tj_error err;
    tj_cpu_config c;
    CHECK_OK(tj_cpu_config_from_json("{\"mr\": 8, \"nr\": 48, \"offsets\": \"unrolled\", \"unroll\": 2, \"mb\": 64}", &c, &err), &err);
    CHECK(c.mr == 8 && c.nr == 48 && c.offsets == TJ_CPU_OFFSETS_UNROLLED && c.unroll == 2 && c.mb == 64);
    char *j = tj_cpu_config_to_json(&c);
    tj_cpu_config c2;
    CHECK_OK(tj_cpu_config_from_json(j, &c2, &err), &err);
    CHECK(memcmp(&c, &c2, sizeof c) == 0);
    free(j);
    CHECK(tj_cpu_config_from_json("{\"mr\": 0}", &c, &err) == TJ_ERR_INVALID_ARGUMENT);
    CHECK(tj_cpu_config_from_json("{\"offsets\": \"magic\"}", &c, &err) == TJ_ERR_INVALID_ARGUMENT);
    CHECK(tj_cpu_config_from_json("{\"bogus\": 1}", &c, &err) == TJ_ERR_INVALID_ARGUMENT);
    CHECK(tj_cpu_config_from_json("[1", &c, &err) == TJ_ERR_INVALID_ARGUMENT);
    c = tj_cpu_config_default();
    c.vec = 16;
    c.mr = 16;
    c.nr = 64; /* 64 accumulators: more than the register file */
    CHECK(tj_cpu_config_check(&c, &err) == TJ_ERR_INVALID_ARGUMENT);

    wcase wc = {"ir", 256, 128, 64, 0.5, 2, 0.01, 0, TJ_ACT_GELU, TJ_F32, 1};
    layer_data d;
    if (!make_layer(&wc, 3, &d)) { CHECK(0); return; }
    char *a = NULL, *b = NULL;
    CHECK_OK(tj_cpu_emit_ir_text(&d.l, NULL, &a, &err), &err);
    CHECK_OK(tj_cpu_emit_ir_text(&d.l, NULL, &b, &err), &err);
    CHECK(a && b && strcmp(a, b) == 0);
    CHECK(a && strstr(a, "llvm.fmuladd") && strstr(a, "tilejit.banner"));
    free(a);
    free(b);
    a = NULL;
    CHECK_OK(tj_cpu_emit_ir_text(&d.l, "{\"offsets\": \"unrolled\"}", &a, &err), &err);
    CHECK(a && strstr(a, "tile_0"));
    free(a);
    /* unrolled offsets on a large layer: a clean error naming the limit, not minutes of LLVM */
    wcase big = {"big", 3072, 768, 128, 0.75, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 0};
    layer_data bd;
    if (make_layer(&big, 4, &bd)) {
        a = NULL;
        CHECK(tj_cpu_emit_ir_text(&bd.l, "{\"offsets\": \"unrolled\"}", &a, &err) == TJ_ERR_UNSUPPORTED);
        CHECK(strstr(err.msg, "table") != NULL);
        free(a);
        free_layer(&bd);
    }
    free_layer(&d);
}

int main(void)
{
    tj_error err;
    tj_cpu_jit *jit = NULL;
    tj_pool *pool = NULL;
    if (tj_cpu_jit_create(&jit, &err) != TJ_OK) {
        fprintf(stderr, "no LLVM JIT here: %s\n", err.msg);
        return 77;
    }
    CHECK_OK(tj_pool_create(4, &pool, &err), &err);
    test_config_and_ir();
    test_configs(jit, pool);
    test_cases(jit, pool);
    test_decode_splits(jit, pool);
    test_threads_identical(jit, pool);
    test_large_call_pack(jit, pool);
    test_prefetch(jit, pool);
    test_order_rule(jit, pool);
    test_concurrent(jit, pool);
    test_public_api();
    test_shared_packing(jit, pool);
    test_bf16_scratch();
    tj_pool_destroy(pool);
    tj_cpu_jit_destroy(jit);
    return tj_test_end();
}
