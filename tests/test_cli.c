/* The `tilejit` command end to end: exit codes and messages on malformed patterns, weights and
 * inputs (never a signal), and `run --backend reference` against an independent float64 dense
 * computation on random data. With TJ_VALGRIND=1 every command runs under valgrind, and a
 * leak or memory error fails the test. */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/npy.h"
#include "pattern/pattern.h"
#include "pattern/random.h"
#include "base/safetensors.h"
#include "cli_run.h"
#include "tj_config.h"
#include "tj_test.h"

static const char *tilejit, *fixtures;
static char tmp[256];
static char err_text[1 << 16];

/* Runs tilejit with args (NULL-terminated), under valgrind when TJ_VALGRIND=1; stderr kept in
 * err_text. Returns the exit code, or 128 + signal. */
static int run(const char *const *args)
{
    char errpath[512];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmp);
    const char *vg = getenv("TJ_VALGRIND");
    return tj_test_run_cli(tilejit, args, vg && *vg == '1', errpath, err_text, sizeof err_text);
}

#define EXPECT_FAIL(fragment, ...)                                                                 \
    do {                                                                                           \
        const char *a_[] = {__VA_ARGS__, NULL};                                                    \
        int rc_ = run(a_);                                                                         \
        CHECKF(rc_ == 1, "%s: exit %d (want 1), stderr: %s", a_[0], rc_, err_text);               \
        CHECKF(strstr(err_text, fragment) != NULL, "%s: stderr lacks '%s': %s", a_[0], fragment, err_text); \
        CHECKF(strchr(err_text, '\n') == err_text + strlen(err_text) - 1, "not one line: %s", err_text); \
    } while (0)

static char *path(const char *name)
{
    static char bufs[8][512];
    static int i;
    char *b = bufs[i++ % 8];
    snprintf(b, 512, "%s/%s", tmp, name);
    return b;
}

static void write_bytes(const char *p, const void *data, size_t n)
{
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static void test_basics(void)
{
    const char *help[] = {"--help", NULL}, *ver[] = {"--version", NULL};
    CHECK(run(help) == 0);
    CHECK(run(ver) == 0);
    const char *cmds[] = {"inspect", "run"};
    for (int i = 0; i < 2; i++) {
        const char *a[] = {cmds[i], "--help", NULL};
        CHECKF(run(a) == 0, "%s --help", cmds[i]);
    }
    EXPECT_FAIL("unknown command 'frobnicate'", "frobnicate");
    EXPECT_FAIL("unknown option '--frob'", "inspect", "x.json", "--frob");
    EXPECT_FAIL("expected one PATTERN", "inspect");
    EXPECT_FAIL("cannot open", "inspect", "/nonexistent.json");
#if TJ_HAVE_LLVM
    /* bench's CPU driver parses with base/args.c (as tilejit-measure does): its forms and messages */
    const char *bh[] = {"bench", "--backend", "cpu", "--help", NULL};
    CHECK(run(bh) == 0);
    EXPECT_FAIL("tilejit bench: unknown option '--bogus' (see --help)", "bench", "--backend", "cpu", "--bogus");
    EXPECT_FAIL("tilejit bench: option '--verbose' takes no value", "bench", "--backend", "cpu", "--verbose=1");
    EXPECT_FAIL("tilejit bench: option '--m' needs a value", "bench", "--backend", "cpu", "--m");
    EXPECT_FAIL("tilejit bench: unexpected argument 'stray' (see --help)", "bench", "--backend", "cpu", "stray");
    EXPECT_FAIL("tilejit bench: --m: 'x' is not an integer in [1, ", "bench", "--backend", "cpu", "--m", "x", "--n", "64",
                "--k", "64", "--sparsity", "0.5");
    EXPECT_FAIL("tilejit bench: --config: '/nonexistent.json' is neither JSON text nor a readable file", "bench",
                "--backend=cpu", "--m=4", "--n", "64", "--k", "64", "--g", "32", "--sparsity=0.5", "--config",
                "/nonexistent.json");
#endif
}

static void test_pattern_fixtures(void)
{
    static const char *cases[] = {"bad_json", "tiles_wrong_count", "ew_repeats_tw", "cols_not_increasing",
                                  "duplicate_names", "bad_activation", "n_huge", "empty_file"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char p[1024], e[1024], expected[256] = "";
        snprintf(p, sizeof p, "%s/pattern/%s/pattern.json", fixtures, cases[i]);
        snprintf(e, sizeof e, "%s/pattern/%s/expected.txt", fixtures, cases[i]);
        FILE *f = fopen(e, "r");
        if (f) {
            if (!fgets(expected, sizeof expected, f)) expected[0] = '\0';
            fclose(f);
        }
        expected[strcspn(expected, "\n")] = '\0';
        EXPECT_FAIL(expected, "inspect", p);
    }
}

/* A model with one random layer: pattern, weights (dtype d, optional bias), returns W as fp32
 * (after the dtype's rounding) for the float64 check. */
typedef struct fixture {
    tj_layer l;
    float *w, *bias;
} fixture;

static int make_model(const tj_random_spec *spec, tj_dtype d, int with_bias, const char *pat, const char *wts, fixture *fx)
{
    tj_error err;
    if (tj_random_layer(spec, "blk.0.fc", &fx->l, &err) != TJ_OK) return 0;
    tj_pattern p = {.nlayers = 1, .layers = &fx->l};
    if (tj_pattern_save(&p, pat, &err) != TJ_OK) return 0;
    int64_t nk = fx->l.n * fx->l.k;
    tj_rng r = {spec->seed + 99};
    fx->w = malloc((size_t)nk * 4);
    fx->bias = malloc((size_t)fx->l.n * 4);
    void *raw = malloc((size_t)nk * 4);
    tj_test_fill(&r, fx->w, nk);
    tj_test_fill(&r, fx->bias, fx->l.n);
    tj_convert_from_f32(fx->w, nk, d, raw);
    tj_convert_to_f32(raw, d, nk, fx->w);
    int64_t ws[2] = {fx->l.n, fx->l.k}, bs[1] = {fx->l.n};
    tj_st_out_tensor t[3] = {
        {"blk.0.fc.weight", tj_dtype_name(d), 2, ws, raw, (uint64_t)nk * tj_dtype_size(d)},
        {"blk.0.fc.bias", "F32", 1, bs, fx->bias, (uint64_t)fx->l.n * 4},
        {"other.embedding", "F32", 1, bs, fx->bias, (uint64_t)fx->l.n * 4},
    };
    tj_st_out_tensor list[2] = {t[0], with_bias ? t[1] : t[2]};
    int ok = tj_st_write(wts, list, 2, NULL, &err) == TJ_OK;
    if (!with_bias) {
        free(fx->bias);
        fx->bias = NULL;
    }
    free(raw);
    return ok;
}

static void free_fixture(fixture *fx)
{
    tj_layer_free(&fx->l);
    free(fx->w);
    free(fx->bias);
}

static double act64(tj_activation a, double v)
{
    if (a == TJ_ACT_RELU) return v > 0 ? v : 0;
    if (a == TJ_ACT_GELU) return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    return v;
}

static void dense64(const fixture *fx, const float *x, int64_t m, float *y)
{
    const tj_layer *l = &fx->l;
    char *mask = calloc((size_t)(l->n * l->k), 1);
    for (int64_t j = 0; j < l->ncols; j++)
        for (int64_t r = l->tile_ptr[j / l->g]; r < l->tile_ptr[j / l->g + 1]; r++)
            mask[tj_layer_col(l, j) * l->k + l->tile_rows[r]] = 1;
    for (int64_t n = 0; l->ew_indptr && n < l->n; n++)
        for (int64_t e = l->ew_indptr[n]; e < l->ew_indptr[n + 1]; e++) mask[n * l->k + l->ew_indices[e]] = 1;
    for (int64_t i = 0; i < m; i++)
        for (int64_t n = 0; n < l->n; n++) {
            double acc = fx->bias ? fx->bias[n] : 0;
            for (int64_t k = 0; k < l->k; k++)
                if (mask[n * l->k + k]) acc += (double)x[i * l->k + k] * fx->w[n * l->k + k];
            y[i * l->n + n] = (float)act64(l->act, acc);
        }
    free(mask);
}

static void test_run_matches_float64(void)
{
    static const int64_t ms[] = {1, 7, 64, 1000};
    int cases = 0;
    for (int v = 0; v < 12; v++) {
        tj_random_spec spec = {.n = 300, .k = 200, .g = 128, .sparsity = v % 4 == 3 ? 0.0 : 0.6,
                               .mode = 1 + v % 2, .seed = 500 + (uint64_t)v, .ew_fraction = v % 3 == 1 ? 0.02 : 0,
                               .empty_tile_fraction = v % 5 == 2 ? 0.5 : 0, .act = (tj_activation)(v % 3)};
        if (v >= 9) { spec.n = 37 + v; spec.k = 5 + 3 * v; spec.g = 8; }
        tj_dtype d = (tj_dtype)(v % 3);
        fixture fx = {0};
        int ok = make_model(&spec, d, v % 2 == 0, path("m.json"), path("m.safetensors"), &fx);
        CHECKF(ok, "variant %d: cannot write the model", v);
        if (!ok) { free_fixture(&fx); continue; }
        int64_t m = ms[v % 4];
        float *x = malloc((size_t)(m * fx.l.k) * 4), *yref = malloc((size_t)(m * fx.l.n) * 4);
        tj_rng r = {(uint64_t)v * 7 + 1};
        tj_test_fill(&r, x, m * fx.l.k);
        tj_error err;
        tj_dtype xd = v % 4 == 1 ? TJ_F16 : TJ_F32;
        if (xd == TJ_F16) { /* the float64 side sees the rounded input too */
            uint16_t *h = malloc((size_t)(m * fx.l.k) * 2);
            tj_convert_from_f32(x, m * fx.l.k, TJ_F16, h);
            tj_convert_to_f32(h, TJ_F16, m * fx.l.k, x);
            CHECK_OK(tj_npy_write(path("x.npy"), TJ_F16, m, fx.l.k, h, &err), &err);
            free(h);
        } else {
            CHECK_OK(tj_npy_write(path("x.npy"), TJ_F32, m, fx.l.k, x, &err), &err);
        }
        const char *a[] = {"run", path("m.json"), "--weights", path("m.safetensors"), "--layer", "blk.0.fc",
                           "--input", path("x.npy"), "--output", path("y.npy"), "--backend", "reference", NULL};
        int rc = run(a);
        CHECKF(rc == 0, "variant %d: exit %d: %s", v, rc, err_text);
        if (v == 0) { /* -v names the path the layer took at this M (docs/dense-path.md) */
            const char *av[] = {"run", path("m.json"), "--weights", path("m.safetensors"), "--layer", "blk.0.fc",
                                "--input", path("x.npy"), "--output", path("y.npy"), "-v", NULL};
            CHECKF(run(av) == 0 && strstr(err_text, "tilejit run: path ") &&
                       (strstr(err_text, "path kernel") || strstr(err_text, "path dense (")),
                   "run -v: %s", err_text);
        }
        tj_npy y = {0};
        if (rc == 0 && tj_npy_read(path("y.npy"), &y, &err) == TJ_OK) {
            CHECK(y.dtype == TJ_F32 && y.rows == m && y.cols == fx.l.n);
            dense64(&fx, x, m, yref);
            double rel = tj_test_relerr(y.data, yref, m * fx.l.n);
            CHECKF(rel <= 1e-5, "variant %d (dtype %s, M %lld): relative error %g", v, tj_dtype_name(d), (long long)m, rel);
            cases++;
        }
        tj_npy_free(&y);
        free(x);
        free(yref);
        free_fixture(&fx);
    }
    CHECKF(cases == 12, "%d of 12 run cases checked", cases);
}

static void test_bad_inputs(void)
{
    tj_random_spec spec = {.n = 64, .k = 48, .g = 32, .sparsity = 0.5, .mode = 1, .seed = 3};
    fixture fx = {0};
    CHECK(make_model(&spec, TJ_F32, 1, path("ok.json"), path("ok.safetensors"), &fx));
    tj_error err;
    float x[4 * 48] = {0};
    CHECK_OK(tj_npy_write(path("x.npy"), TJ_F32, 4, 48, x, &err), &err);
    CHECK_OK(tj_npy_write(path("x_wrongk.npy"), TJ_F32, 4, 47, x, &err), &err);
#define RUN_ARGS(pat, w, layer, in) "run", pat, "--weights", w, "--layer", layer, "--input", in, "--output", path("y.npy"), "--backend", "reference"
    EXPECT_FAIL("--weights is required", "run", path("ok.json"), "--layer", "blk.0.fc", "--input", path("x.npy"), "--output", path("y.npy"));
    EXPECT_FAIL("no layer named 'nope'", RUN_ARGS(path("ok.json"), path("ok.safetensors"), "nope", path("x.npy")));
    EXPECT_FAIL("X has 47 columns", RUN_ARGS(path("ok.json"), path("ok.safetensors"), "blk.0.fc", path("x_wrongk.npy")));
    EXPECT_FAIL("unknown backend 'gpu'", "run", path("ok.json"), "--weights", path("ok.safetensors"), "--layer", "blk.0.fc",
                "--input", path("x.npy"), "--output", path("y.npy"), "--backend", "gpu");
    EXPECT_FAIL("cannot", RUN_ARGS(path("ok.json"), path("ok.safetensors"), "blk.0.fc", path("missing.npy")));
    EXPECT_FAIL("cannot", RUN_ARGS(path("ok.json"), path("missing.safetensors"), "blk.0.fc", path("x.npy")));

    /* Weights that do not fit the pattern. */
    int64_t ws[2] = {64, 48}, wrong[2] = {48, 64};
    float *w = calloc(64 * 48, 4);
    int32_t *wi = calloc(64 * 48, 4);
    tj_st_out_tensor missing[1] = {{"other.weight", "F32", 2, ws, w, 64 * 48 * 4}};
    tj_st_out_tensor shape[1] = {{"blk.0.fc.weight", "F32", 2, wrong, w, 64 * 48 * 4}};
    tj_st_out_tensor dtype[1] = {{"blk.0.fc.weight", "I32", 2, ws, wi, 64 * 48 * 4}};
    tj_st_out_tensor bias1d[2] = {{"blk.0.fc.bias", "F32", 2, ws, w, 64 * 48 * 4}, {"blk.0.fc.weight", "F32", 2, ws, w, 64 * 48 * 4}};
    CHECK_OK(tj_st_write(path("missing.st"), missing, 1, NULL, &err), &err);
    CHECK_OK(tj_st_write(path("shape.st"), shape, 1, NULL, &err), &err);
    CHECK_OK(tj_st_write(path("dtype.st"), dtype, 1, NULL, &err), &err);
    CHECK_OK(tj_st_write(path("bias.st"), bias1d, 2, NULL, &err), &err);
    EXPECT_FAIL("tensor 'blk.0.fc.weight' not found", RUN_ARGS(path("ok.json"), path("missing.st"), "blk.0.fc", path("x.npy")));
    EXPECT_FAIL("does not match the pattern's [n = 64, k = 48]", RUN_ARGS(path("ok.json"), path("shape.st"), "blk.0.fc", path("x.npy")));
    EXPECT_FAIL("dtype I32 is not supported", RUN_ARGS(path("ok.json"), path("dtype.st"), "blk.0.fc", path("x.npy")));
    EXPECT_FAIL("'blk.0.fc.bias': expected shape [64]", RUN_ARGS(path("ok.json"), path("bias.st"), "blk.0.fc", path("x.npy")));
    EXPECT_FAIL("wrong shape", "inspect", path("ok.json"), "--weights", path("shape.st"));

    /* Broken safetensors files: truncated, header longer than the file, garbage header. */
    struct stat sb;
    stat(path("ok.safetensors"), &sb);
    FILE *src = fopen(path("ok.safetensors"), "rb");
    char *bytes = malloc((size_t)sb.st_size);
    size_t got = src ? fread(bytes, 1, (size_t)sb.st_size, src) : 0;
    if (src) fclose(src);
    CHECK(got == (size_t)sb.st_size);
    write_bytes(path("trunc.st"), bytes, (size_t)sb.st_size - 100);
    write_bytes(path("trunc4.st"), bytes, 4);
    unsigned char longhdr[16] = {0x00, 0x00, 0x10, 0x00, 0, 0, 0, 0, '{', '}'};
    write_bytes(path("longhdr.st"), longhdr, sizeof longhdr);
    unsigned char garbage[18] = {10, 0, 0, 0, 0, 0, 0, 0, 'n', 'o', 't', ' ', 'j', 's', 'o', 'n', '!', '!'};
    write_bytes(path("garbage.st"), garbage, sizeof garbage);
    const char *broken[] = {"trunc.st", "trunc4.st", "longhdr.st", "garbage.st"};
    for (int i = 0; i < 4; i++) {
        const char *a[] = {RUN_ARGS(path("ok.json"), path(broken[i]), "blk.0.fc", path("x.npy")), NULL};
        int rc = run(a);
        CHECKF(rc == 1, "%s: exit %d: %s", broken[i], rc, err_text);
        CHECKF(strstr(err_text, broken[i]) != NULL, "%s: message does not name the file: %s", broken[i], err_text);
        const char *b[] = {"inspect", path("ok.json"), "--weights", path(broken[i]), NULL};
        rc = run(b);
        CHECKF(rc == 1, "inspect %s: exit %d: %s", broken[i], rc, err_text);
    }
    /* Broken .npy inputs. */
    stat(path("x.npy"), &sb);
    src = fopen(path("x.npy"), "rb");
    char *nb = malloc((size_t)sb.st_size);
    got = src ? fread(nb, 1, (size_t)sb.st_size, src) : 0;
    if (src) fclose(src);
    write_bytes(path("trunc.npy"), nb, (size_t)sb.st_size - 16);
    write_bytes(path("magic.npy"), "not an npy file at all", 22);
    const char *npys[] = {"trunc.npy", "magic.npy"};
    for (int i = 0; i < 2; i++) {
        const char *a[] = {RUN_ARGS(path("ok.json"), path("ok.safetensors"), "blk.0.fc", path(npys[i])), NULL};
        int rc = run(a);
        CHECKF(rc == 1, "%s: exit %d: %s", npys[i], rc, err_text);
        CHECKF(strstr(err_text, npys[i]) != NULL, "%s: message does not name the file: %s", npys[i], err_text);
    }
    free(nb);
    free(bytes);
    free(w);
    free(wi);
    free_fixture(&fx);
}

static void test_inspect_counts(void)
{
    /* n=4, k=5, g=2, tiles [[0,2],[1,3,4]]: W all ones keeps 2·2 + 2·3 = 10 of 20 → 10 dropped. */
    int64_t tile_ptr[3] = {0, 2, 5};
    int32_t rows[5] = {0, 2, 1, 3, 4};
    tj_layer l = {.name = "fc", .n = 4, .k = 5, .g = 2, .ncols = 4, .ntiles = 2, .tile_ptr = tile_ptr, .tile_rows = rows};
    tj_pattern p = {.nlayers = 1, .layers = &l};
    tj_error err;
    CHECK_OK(tj_pattern_save(&p, path("small.json"), &err), &err);
    float w[20];
    for (int i = 0; i < 20; i++) w[i] = 1;
    int64_t ws[2] = {4, 5};
    tj_st_out_tensor t[1] = {{"fc.weight", "F32", 2, ws, w, sizeof w}};
    CHECK_OK(tj_st_write(path("small.st"), t, 1, NULL, &err), &err);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --weights '%s' > '%s'", tilejit, path("small.json"), path("small.st"), path("inspect.txt"));
    CHECK(system(cmd) == 0);
    FILE *f = fopen(path("inspect.txt"), "r");
    char text[4096] = "";
    size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
    text[got] = '\0';
    if (f) fclose(f);
    CHECKF(strstr(text, "50.00%") != NULL, "density missing: %s", text);
    CHECKF(strstr(text, "2.00x") != NULL, "FLOP reduction missing: %s", text);
    char *line = strstr(text, "\nfc ");
    long dropped = -1;
    if (line) {
        char *last = strrchr(strtok(line + 1, "\n"), ' ');
        dropped = last ? strtol(last, NULL, 10) : -1;
    }
    CHECKF(dropped == 10, "dropped nonzeros %ld, want 10: %s", dropped, text);
}

int main(void)
{
    tilejit = getenv("TJ_TILEJIT");
    fixtures = getenv("TJ_FIXTURES");
    if (!tilejit || !fixtures) {
        fprintf(stderr, "TJ_TILEJIT and TJ_FIXTURES must be set (meson test sets them)\n");
        return 1;
    }
    snprintf(tmp, sizeof tmp, "/tmp/tj_cli_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    test_basics();
    test_pattern_fixtures();
    test_run_matches_float64();
    test_bad_inputs();
    test_inspect_counts();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return tj_test_end();
}
