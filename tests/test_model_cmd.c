/* `tilejit model` end to end without Python: a random three-layer model (tw1 with bias, tw2
 * columns with GELU, ew residual in fp16 weights) runs on the reference and default backends with
 * every layer within bounds; a NaN weight must be caught by the reference check (exit 1, the
 * layer marked); bad arguments exit 1 with one message. */
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pattern/pattern.h"
#include "pattern/random.h"
#include "base/safetensors.h"
#include "tj_config.h"
#include "tj_test.h"

static const char *tilejit;
static char tmp[256];
static char out_text[1 << 17], err_text[1 << 14];

static void slurp(const char *p, char *buf, size_t cap)
{
    FILE *f = fopen(p, "rb");
    size_t got = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[got] = '\0';
    if (f) fclose(f);
}

/* Runs tilejit with args (NULL-terminated), capturing stdout and stderr. Returns the exit code,
 * or 128 + signal. */
static int run(const char *const *args)
{
    char op[512], ep[512];
    snprintf(op, sizeof op, "%s/stdout.txt", tmp);
    snprintf(ep, sizeof ep, "%s/stderr.txt", tmp);
    const char *argv[32];
    int n = 0;
    argv[n++] = tilejit;
    for (int i = 0; args[i] && n < 31; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(op, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    slurp(op, out_text, sizeof out_text);
    slurp(ep, err_text, sizeof err_text);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *path(const char *name)
{
    static char bufs[4][512];
    static int i;
    char *b = bufs[i++ % 4];
    snprintf(b, 512, "%s/%s", tmp, name);
    return b;
}

/* Writes the model; poison: put a NaN into one kept weight of layer 1. */
static int make_model(const char *pat, const char *wts, int poison)
{
    static const tj_random_spec specs[3] = {
        {.n = 96, .k = 64, .g = 32, .sparsity = 0.5, .mode = 1, .seed = 1},
        {.n = 160, .k = 64, .g = 32, .sparsity = 0.75, .mode = 2, .seed = 2, .act = TJ_ACT_GELU},
        {.n = 64, .k = 160, .g = 16, .sparsity = 0.6, .mode = 1, .seed = 3, .ew_fraction = 0.02},
    };
    static const char *names[3] = {"enc.q", "enc.ffn_in", "enc.ffn_out"};
    tj_layer layers[3];
    memset(layers, 0, sizeof layers);
    tj_error err;
    int ok = 1;
    float *w[3] = {0}, *b[3] = {0};
    uint16_t *h = NULL;
    for (int i = 0; i < 3 && ok; i++) ok = tj_random_layer(&specs[i], names[i], &layers[i], &err) == TJ_OK;
    tj_pattern p = {.nlayers = 3, .layers = layers};
    if (ok) ok = tj_pattern_save(&p, pat, &err) == TJ_OK;
    tj_st_out_tensor t[6];
    int64_t shapes[3][2], bshape[3][1];
    char wn[3][64], bn[3][64];
    tj_rng r = {42};
    for (int i = 0; i < 3 && ok; i++) {
        int64_t nk = layers[i].n * layers[i].k;
        w[i] = malloc((size_t)nk * 4);
        b[i] = malloc((size_t)layers[i].n * 4);
        if (!w[i] || !b[i]) { ok = 0; break; }
        tj_test_fill(&r, w[i], nk);
        tj_test_fill(&r, b[i], layers[i].n);
        if (poison && i == 1) {
            int64_t n = tj_layer_col(&layers[1], 0);
            w[1][n * layers[1].k + layers[1].tile_rows[layers[1].tile_ptr[0]]] = NAN;
        }
        shapes[i][0] = layers[i].n;
        shapes[i][1] = layers[i].k;
        bshape[i][0] = layers[i].n;
        snprintf(wn[i], sizeof wn[i], "%s.weight", names[i]);
        snprintf(bn[i], sizeof bn[i], "%s.bias", names[i]);
        t[2 * i] = (tj_st_out_tensor){wn[i], "F32", 2, shapes[i], w[i], (uint64_t)nk * 4};
        t[2 * i + 1] = (tj_st_out_tensor){bn[i], "F32", 1, bshape[i], b[i], (uint64_t)layers[i].n * 4};
    }
    if (ok) { /* the third layer's weights in fp16 */
        int64_t nk = layers[2].n * layers[2].k;
        h = malloc((size_t)nk * 2);
        if (!h) ok = 0;
        for (int64_t j = 0; ok && j < nk; j++) h[j] = tj_f32_to_f16(w[2][j]);
        t[4] = (tj_st_out_tensor){wn[2], "F16", 2, shapes[2], h, (uint64_t)nk * 2};
    }
    if (ok) ok = tj_st_write(wts, t, 6, NULL, &err) == TJ_OK;
    if (!ok) fprintf(stderr, "make_model: %s\n", err.msg);
    for (int i = 0; i < 3; i++) {
        free(w[i]);
        free(b[i]);
        tj_layer_free(&layers[i]);
    }
    free(h);
    return ok;
}

static void expect_table(const char *backend)
{
    const char *a[] = {"model", path("m.json"), "--weights", path("m.st"), "--backend", backend, "--m", "7",
                       "--min-time", "0.001", "--threads", "1", NULL};
    int rc = run(a);
    CHECKF(rc == 0, "backend %s: exit %d: %s", backend, rc, err_text);
    static const char *names[3] = {"enc.q ", "enc.ffn_in ", "enc.ffn_out "};
    for (int i = 0; i < 3; i++) {
        const char *row = strstr(out_text, names[i]);
        CHECKF(row != NULL, "no row for %s: %s", names[i], out_text);
        if (!row) continue;
        char name[64], pathw[16];
        long long n, k;
        double dens, err;
        CHECKF(sscanf(row, "%63s %lld %lld %lf %lf %15s", name, &n, &k, &dens, &err, pathw) == 6, "row: %.120s", row);
        CHECKF(err <= 2e-3 && dens > 0 && dens < 1, "%s: err %g density %g", name, err, dens);
        /* the path column: the reference backend has no dense path */
        CHECKF(strcmp(pathw, "kernel") == 0 || (strcmp(backend, "reference") != 0 &&
                                                (strcmp(pathw, "onednn") == 0 || strcmp(pathw, "openblas") == 0)),
               "backend %s: %s: path '%s'", backend, name, pathw);
    }
    CHECKF(strstr(out_text, "\npaths at M = 7: ") != NULL, "%s", out_text);
    CHECK(strstr(out_text, "\ntotal ") != NULL);
#if TJ_HAVE_LLVM
    /* the dense baselines were timed on every layer: the faster library wins each of the 3, and
     * every row and the total have a speedup */
    const char *db = strstr(out_text, "dense baseline: the whole layer (bias, activation), fastest fp32 of ");
    int wins = 0;
    for (const char *p = db; p && *p && *p != '\n'; p++) {
        int w;
        char close;
        if (*p == '(' && sscanf(p, "(%d layers%c", &w, &close) == 2 && close == ')') wins += w;
    }
    CHECKF(db && wins == 3, "backend %s: %d layers with a dense baseline: %s", backend, wins, out_text);
    for (const char *row = strstr(out_text, "\nenc."); row; row = strstr(row + 1, "\nenc.")) {
        const char *eol = strchr(row + 1, '\n');
        CHECKF(eol && eol[-1] == 'x', "backend %s: no speedup in %.*s", backend, eol ? (int)(eol - row) : 80, row);
    }
#endif
    CHECK(strstr(out_text, "load: cold ") != NULL);
    CHECKF(strstr(out_text, "all 3 layers within") != NULL, "%s", out_text);
}

int main(void)
{
    tilejit = getenv("TJ_TILEJIT");
    if (!tilejit) {
        fprintf(stderr, "TJ_TILEJIT not set\n");
        return 77;
    }
    snprintf(tmp, sizeof tmp, "/tmp/tj_model_cmd_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    CHECK(make_model(path("m.json"), path("m.st"), 0));
    CHECK(make_model(path("bad.json"), path("bad.st"), 1));

    expect_table("reference");
    expect_table("auto");

    /* A NaN kept weight: the reference check must catch it, not print a clean table. */
    const char *nan_args[] = {"model", path("bad.json"), "--weights", path("bad.st"), "--m", "3", "--min-time",
                              "0.001", NULL};
    CHECKF(run(nan_args) == 1, "NaN weight not caught: %s", out_text);
    CHECKF(strstr(err_text, "exceed the reference bound") != NULL, "%s", err_text);
    CHECKF(strstr(out_text, "!") != NULL, "no layer marked: %s", out_text);

    struct { const char *frag; const char *args[8]; } bad[] = {
        {"--weights is required", {"model", path("m.json"), NULL}},
        {"unknown backend", {"model", path("m.json"), "--weights", path("m.st"), "--backend", "tpu", NULL}},
        {"--m", {"model", path("m.json"), "--weights", path("m.st"), "--m", "0", NULL}},
        {"--min-time", {"model", path("m.json"), "--weights", path("m.st"), "--min-time", "x", NULL}},
        {"cannot open", {"model", path("none.json"), "--weights", path("m.st"), NULL}},
        {"expected one PATTERN", {"model", NULL}},
        {"unknown option", {"model", path("m.json"), "--frob", NULL}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = run(bad[i].args);
        CHECKF(rc == 1, "case %zu: exit %d", i, rc);
        CHECKF(strstr(err_text, bad[i].frag) != NULL, "case %zu: stderr lacks '%s': %s", i, bad[i].frag, err_text);
    }
    const char *help[] = {"model", "--help", NULL};
    CHECK(run(help) == 0 && strstr(out_text, "usage: tilejit model") != NULL);

    const char *files[] = {"m.json", "m.st", "bad.json", "bad.st", "stdout.txt", "stderr.txt"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) unlink(path(files[i]));
    rmdir(tmp);
    return tj_test_end();
}
