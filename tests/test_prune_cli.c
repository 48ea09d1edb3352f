/* `tilejit prune` and `tilejit pattern` end to end, on checkpoints from make-synthetic-model:
 * exit codes, the one-line messages on bad input, the summary, and prune → pruned weights →
 * pattern giving back the same file. With --bert (suite perf): the BERT-base-sized acceptance
 * run, ≤ 30 s and at most two copies of the weights in memory (peak RSS of the child). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "tj_test.h"

static char dir[256];
static const char *tilejit, *synth;
static char out_text[1 << 16], err_text[1 << 16];

/* A path in the test's directory; the strings live until the end (freed by main). */
static char *paths[64];
static int npaths;

static const char *tmp_path(const char *name)
{
    for (int i = 0; i < npaths; i++)
        if (strcmp(paths[i] + strlen(dir) + 1, name) == 0) return paths[i];
    if (npaths == 64) abort();
    char *b = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(b, "%s/%s", dir, name);
    return paths[npaths++] = b;
}

static void slurp(const char *path, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f) return;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
}

/* Runs `prog args`, captures stdout/stderr; returns the exit code, or -1 if killed by a signal. */
static int run(const char *prog, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s/out.txt' 2>'%s/err.txt'", prog, args, dir, dir);
    int st = system(cmd);
    slurp(tmp_path("out.txt"), out_text, sizeof out_text);
    slurp(tmp_path("err.txt"), err_text, sizeof err_text);
    if (st == -1 || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Exit 1, exactly one line on stderr naming the command and containing `want`. */
static void expect_fail(const char *prog, const char *args, const char *prefix, const char *want)
{
    int rc = run(prog, args);
    CHECKF(rc == 1, "%s: exit %d (stderr: %s)", args, rc, err_text);
    CHECKF(count_lines(err_text) == 1, "%s: %d lines on stderr: %s", args, count_lines(err_text), err_text);
    CHECKF(strncmp(err_text, prefix, strlen(prefix)) == 0, "%s: message '%s' does not start with '%s'", args, err_text, prefix);
    CHECKF(strstr(err_text, want) != NULL, "%s: message '%s' lacks '%s'", args, err_text, want);
}

/* The overall density (percent) of the summary's total line, or -1. */
static double summary_density(void)
{
    const char *t = strstr(out_text, "total:"), *d = t ? strstr(t, "density ") : NULL;
    double v;
    return d && sscanf(d, "density %lf%%", &v) == 1 ? v : -1;
}

static int same_file(const char *a, const char *b)
{
    static char x[1 << 20], y[1 << 20];
    slurp(a, x, sizeof x);
    slurp(b, y, sizeof y);
    return x[0] && strcmp(x, y) == 0;
}

/* Exit 1 and exactly `want` on stderr (the whole message, one line). */
static void expect_message(const char *args, const char *want)
{
    int rc = run(tilejit, args);
    CHECKF(rc == 1 && strcmp(err_text, want) == 0, "%s: exit %d, stderr '%s', expected '%s'", args, rc, err_text, want);
}

/* tmpl with {M} and {P} replaced by m and p (paths without spaces: unquoted, as in messages) and
 * {C} by a --calibration option naming a file that does not exist. */
static void expand(char *out, size_t cap, const char *tmpl, const char *m, const char *p)
{
    size_t at = 0;
    out[0] = '\0';
    for (const char *s = tmpl; *s && at + 1 < cap; s++) {
        const char *with = NULL;
        if (strncmp(s, "{M}", 3) == 0) with = m;
        else if (strncmp(s, "{P}", 3) == 0) with = p;
        else if (strncmp(s, "{C}", 3) == 0) with = "--calibration no-such-stats.safetensors";
        if (with) {
            int w = snprintf(out + at, cap - at, "%s", with);
            if (w < 0 || (size_t)w >= cap - at) abort();
            at += (size_t)w;
            s += 2;
        } else {
            out[at++] = *s;
            out[at] = '\0';
        }
    }
}

/* The calibrated path of `tilejit prune` (any of --calibration, --allocation, --profile,
 * --budget-ms, --sweep-out) shares the plain path's options, help and messages; its own options
 * are unknown without it. Runs that need statistics are test_calibrate.py's. */
static void test_calibrated_cli(const char *m, const char *p)
{
    static char help[1 << 14];
    char args[4096], want[2048];
    CHECK(run(tilejit, "prune --help") == 0 && strlen(out_text) < sizeof help);
    snprintf(help, sizeof help, "%s", out_text);
    CHECK(strstr(help, "--calibration STATS") && strstr(help, "--sweep-weights J,..."));
    CHECK(run(tilejit, "prune --calibration x --help") == 0 && strcmp(out_text, help) == 0);
    CHECK(run(tilejit, "prune --allocation measured -h") == 0 && strcmp(out_text, help) == 0);
    CHECK(run(tilejit, "prune -h") == 0 && strcmp(out_text, help) == 0 && err_text[0] == '\0');

    const char *calib_only[] = {"--quiet", "--damp 1", "--threads 1", "--sweep-steps 2", "--sweep-weights 1"};
    for (size_t i = 0; i < sizeof calib_only / sizeof *calib_only; i++) {
        snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 -o '%s' %s", m, p, calib_only[i]);
        snprintf(want, sizeof want, "tilejit prune: unknown option '%.*s' (see --help)\n",
                 (int)strcspn(calib_only[i], " "), calib_only[i]);
        expect_message(args, want);
    }
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 -o '%s' --quiet=1 --calibration x", m, p);
    expect_message(args, "tilejit prune: option '--quiet' takes no value\n");

    /* {M} and {P} stand for the model's and the pattern's paths, {C} for a --calibration option */
    struct { const char *args, *message; } cases[] = {
        {"{C} --sparsity 0.5 -o {P}", "--weights W.safetensors is required (see --help)"},
        {"--weights {M} {C} --sparsity 0.5", "-o PATTERN is required (see --help)"},
        {"--weights {M} {C} -o {P}", "--sparsity S (or --budget-ms) is required (see --help)"},
        {"--weights {M} {C} --sparsity 1 -o {P}", "--sparsity: '1' is outside [0, 1)"},
        {"--weights {M} {C} --sparsity abc -o {P}", "--sparsity: 'abc' is not a number in [0, 1]"},
        {"--weights {M} {C} --sparsity 0.5 --g 0 -o {P}", "--g: '0' is not an integer in [1, 16777216]"},
        {"--weights {M} {C} --sparsity 0.5 --mode tw3 -o {P}", "--mode: unknown mode 'tw3' (expected tw1, tw2 or tew)"},
        {"--weights {M} {C} --sparsity 0.5 --ew 0.01 -o {P}", "--ew applies only to --mode tew"},
        {"--weights {M} {C} --sparsity 0.5 --mode tew --ew 0 -o {P}", "--ew: '0' is outside (0, 1)"},
        {"--weights {M} {C} --sparsity 0.5 --tew-base tw2 -o {P}", "--tew-base applies only to --mode tew"},
        {"--weights {M} {C} --sparsity 0.5 --mode tew --tew-base tew -o {P}", "--tew-base: 'tew' is not tw1 or tw2"},
        {"--weights {M} {C} --sparsity 0.95 --mode tew --ew 0.05 -o {P}", "--sparsity 0.95 plus --ew 0.05 must stay below 1"},
        /* the first problem in the path's order of checks is the one reported */
        {"--weights {M} {C} --allocation bogus --g 0 --sparsity 0.5 -o {P}",
         "--allocation: unknown 'bogus' (expected uniform, global or measured)"},
        {"--weights {M} {C} --damp x --g 0 --sparsity 0.5 -o {P}", "--g: '0' is not an integer in [1, 16777216]"},
        {"--weights {M} {C} --sparsity 1 --g 0 -o {P}", "--g: '0' is not an integer in [1, 16777216]"},
        {"--weights {M} {C} --budget-ms 1 -o {P}", "--budget-ms needs --allocation measured (and --profile)"},
        {"--weights {M} --allocation uniform --sparsity 0.5 -o {P}",
         "--allocation uniform needs --calibration STATS (without it, only global)"},
        {"--weights {M} --sweep-out sweep.safetensors", "--sweep-out needs --calibration STATS"},
        {"--weights {M} {C} --sparsity 0.5 -o {P} extra", "unexpected argument 'extra' (see --help)"},
        {"--weights {M} {C} --sparsity 0.5 --layers nothing -o {P}",
         "{M}: no layer matches --layers 'nothing' (the file has 20 *.weight tensors)"},
        {"--weights {M} {C} --sparsity 0.5 --scores no-such-scores.safetensors -o {P}",
         "--scores: no-such-scores.safetensors: cannot open: No such file or directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char a[1024], msg[1024];
        expand(a, sizeof a, cases[i].args, m, p);
        expand(msg, sizeof msg, cases[i].message, m, p);
        snprintf(args, sizeof args, "prune %s", a);
        snprintf(want, sizeof want, "tilejit prune: %s\n", msg);
        expect_message(args, want);
    }

    /* --allocation global without statistics is the plain pruner: the same pattern, its summary
     * without the plain path's closing "mode ..." line */
    const char *q = tmp_path("global.json");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --g 64 -o '%s'", m, p);
    CHECKF(run(tilejit, args) == 0 && strstr(out_text, "mode tw1, sparsity 0.5, g 64; pruned in"), "%s: %s", args, err_text);
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --g 64 --allocation global -o '%s'", m, q);
    CHECKF(run(tilejit, args) == 0 && err_text[0] == '\0', "%s: %s", args, err_text);
    CHECKF(same_file(p, q), "%s: a different pattern than the plain pruner's", args);
    CHECKF(strstr(out_text, "total: 12 layers") && !strstr(out_text, "mode "), "%s: %s", args, out_text);
}

static void test_cli(void)
{
    char args[2048];
    const char *m = tmp_path("m.safetensors"), *m2 = tmp_path("m2.safetensors");
    snprintf(args, sizeof args, "--layers 2 --hidden 128 --intermediate 512 --vocab 50 --seed 3 -o '%s'", m);
    CHECKF(run(synth, args) == 0, "make-synthetic-model: %s", err_text);
    CHECK(strstr(out_text, "12 linear layers") != NULL);
    snprintf(args, sizeof args, "--layers 2 --hidden 128 --intermediate 512 --vocab 50 --seed 3 -o '%s'", m2);
    CHECK(run(synth, args) == 0);
    struct stat sa, sb;
    CHECK(stat(m, &sa) == 0 && stat(m2, &sb) == 0 && sa.st_size == sb.st_size);
    CHECK(run(synth, "--help") == 0 && strstr(out_text, "usage: make-synthetic-model"));
    CHECK(run(synth, "--dtype F64 -o x") == 1 && strstr(err_text, "F64"));

    CHECK(run(tilejit, "prune --help") == 0 && strstr(out_text, "usage: tilejit prune") && strstr(out_text, "--pruned-weights"));
    CHECK(run(tilejit, "pattern --help") == 0 && strstr(out_text, "usage: tilejit pattern"));
    CHECK(run(tilejit, "--help") == 0 && strstr(out_text, "prune") && strstr(out_text, "pattern"));

    const char *p = tmp_path("p.json"), *pw = tmp_path("pw.safetensors"), *q = tmp_path("q.json");
    static const char *modes[3] = {"tw1", "tw2", "tew"};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.75 --mode %s -o '%s' --pruned-weights '%s'", m,
                 modes[i], p, pw);
        CHECKF(run(tilejit, args) == 0, "%s: %s", args, err_text);
        CHECKF(strstr(out_text, "total: 12 layers") && fabs(summary_density() - 25) <= 0.5, "%s: %s", args, out_text);
        CHECK(strstr(out_text, "encoder.layer.1.intermediate.dense") != NULL);
        CHECK(err_text[0] == '\0');
        snprintf(args, sizeof args, "pattern --weights '%s' -o '%s'", pw, q);
        CHECKF(run(tilejit, args) == 0, "%s: %s", args, err_text);
        if (i < 2) CHECKF(same_file(p, q), "%s: pattern of the pruned weights differs from the pruned pattern", modes[i]);
        snprintf(args, sizeof args, "inspect '%s' --weights '%s'", q, pw);
        CHECKF(run(tilejit, args) == 0, "%s: %s", args, err_text);
    }
    /* tew over tw2: pruned columns and an ew residual. */
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.75 --mode tew --tew-base tw2 --ew 0.02 -o '%s'", m, p);
    CHECKF(run(tilejit, args) == 0, "%s: %s", args, err_text);
    CHECKF(strstr(out_text, "over tw2, ew 0.02") && fabs(summary_density() - 25) <= 0.5, "%s", out_text);
    CHECK(strstr(out_text, "(7864 ew)") != NULL); /* 0.02 · 393216 */
    /* --layers restricts pruning; the other layers are copied unchanged. */
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --layers 'intermediate' --g 64 -o '%s'", m, p);
    CHECKF(run(tilejit, args) == 0, "%s: %s", args, err_text);
    CHECKF(strstr(out_text, "total: 2 layers") && fabs(summary_density() - 50) <= 0.5, "%s", out_text);

    const char *P = "tilejit prune: ";
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 1 -o '%s'", m, p);
    expect_fail(tilejit, args, P, "outside [0, 1)");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity -0.25 -o '%s'", m, p);
    expect_fail(tilejit, args, P, "--sparsity");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity abc -o '%s'", m, p);
    expect_fail(tilejit, args, P, "'abc'");
    snprintf(args, sizeof args, "prune --weights '%s' -o '%s'", m, p);
    expect_fail(tilejit, args, P, "--sparsity S is required");
    snprintf(args, sizeof args, "prune --sparsity 0.5 -o '%s'", p);
    expect_fail(tilejit, args, P, "--weights");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5", m);
    expect_fail(tilejit, args, P, "-o PATTERN");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --mode tw3 -o '%s'", m, p);
    expect_fail(tilejit, args, P, "unknown mode 'tw3'");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --ew 0.01 -o '%s'", m, p);
    expect_fail(tilejit, args, P, "--ew applies only to --mode tew");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.95 --mode tew --ew 0.05 -o '%s'", m, p);
    expect_fail(tilejit, args, P, "must stay below 1");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --tew-base tw2 -o '%s'", m, p);
    expect_fail(tilejit, args, P, "--tew-base applies only to --mode tew");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --mode tew --tew-base tew -o '%s'", m, p);
    expect_fail(tilejit, args, P, "is not tw1 or tw2");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --g 0 -o '%s'", m, p);
    expect_fail(tilejit, args, P, "--g");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --layers 'attention\\.nothing' -o '%s'", m, p);
    expect_fail(tilejit, args, P, "no layer matches --layers");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --layers 'LayerNorm' -o '%s'", m, p);
    expect_fail(tilejit, args, P, "is 1-D");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --layers 'a(' -o '%s'", m, p);
    expect_fail(tilejit, args, P, "not a valid regular expression");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --scores '%s/none.safetensors' -o '%s'", m, dir, p);
    expect_fail(tilejit, args, P, "--scores");
    snprintf(args, sizeof args, "prune --weights '%s/none.safetensors' --sparsity 0.5 -o '%s'", dir, p);
    expect_fail(tilejit, args, P, "cannot open");
    FILE *f = fopen(tmp_path("garbage.safetensors"), "wb");
    fputs("this is not a safetensors file at all", f);
    fclose(f);
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 -o '%s'", tmp_path("garbage.safetensors"), p);
    expect_fail(tilejit, args, P, "header length");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --scores '%s' -o '%s'", m, tmp_path("garbage.safetensors"), p);
    expect_fail(tilejit, args, P, "--scores");
    /* Scores from a file with other layers' names. */
    const char *small = tmp_path("small.safetensors");
    snprintf(args, sizeof args, "--layers 1 --hidden 128 --intermediate 512 --vocab 50 -o '%s'", small);
    CHECK(run(synth, args) == 0);
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --scores '%s' -o '%s'", m, small, p);
    expect_fail(tilejit, args, P, "no tensor 'encoder.layer.1.");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 --scores '%s' -o '%s'", small, m, p);
    CHECKF(run(tilejit, args) == 0, "scores from a bigger file: %s", err_text);
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 -o '%s/no/such/dir/p.json'", m, dir);
    expect_fail(tilejit, args, P, "no/such/dir");
    snprintf(args, sizeof args, "prune --weights '%s' --sparsity 0.5 -o '%s' extra", m, p);
    expect_fail(tilejit, args, P, "unexpected argument 'extra'");
    test_calibrated_cli(m, p);

    const char *Q = "tilejit pattern: ";
    snprintf(args, sizeof args, "pattern -o '%s'", q);
    expect_fail(tilejit, args, Q, "--weights");
    snprintf(args, sizeof args, "pattern --weights '%s'", pw);
    expect_fail(tilejit, args, Q, "-o PATTERN");
    snprintf(args, sizeof args, "pattern --weights '%s' --layers zzz -o '%s'", pw, q);
    expect_fail(tilejit, args, Q, "no layer matches");
    snprintf(args, sizeof args, "pattern --weights '%s' --g -3 -o '%s'", pw, q);
    expect_fail(tilejit, args, Q, "--g");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The acceptance run: BERT-base (72 linear layers, ~109 M parameters, F32). */
static void test_bert(void)
{
    char args[2048];
    const char *m = tmp_path("bert.safetensors");
    snprintf(args, sizeof args, "-o '%s'", m);
    CHECKF(run(synth, args) == 0, "make-synthetic-model: %s", err_text);
    struct stat sb;
    CHECK(stat(m, &sb) == 0);
    static const char *modes[3] = {"tw1", "tw2", "tew"};
    static const char *sp[3] = {"0.5", "0.75", "0.9"};
    for (int i = 0; i < 3; i++)
        for (int s = 0; s < 3; s++) {
            snprintf(args, sizeof args, "prune --weights '%s' --sparsity %s --mode %s -o '%s' --pruned-weights '%s'", m, sp[s],
                     modes[i], tmp_path("bert.json"), tmp_path("bert-pruned.safetensors"));
            double t0 = now_s();
            int rc = run(tilejit, args);
            double t = now_s() - t0;
            struct rusage ru;
            getrusage(RUSAGE_CHILDREN, &ru); /* the largest child so far: every prune is the same size */
            double rss_mb = (double)ru.ru_maxrss / 1024.0, file_mb = (double)sb.st_size / 1048576.0;
            const char *tot = strstr(out_text, "total:");
            printf("bert %s S=%s: %.2f s, peak RSS %.0f MB (weights file %.0f MB): %.*s\n", modes[i], sp[s], t, rss_mb,
                   file_mb, tot ? (int)strcspn(tot, "\n") : 0, tot ? tot : "");
            CHECKF(rc == 0, "%s: %s", args, err_text);
            CHECKF(t <= 30.0, "%s took %.1f s", args, t);
            CHECKF(rss_mb <= 2.0 * file_mb, "peak RSS %.0f MB is over two copies of the weights (%.0f MB)", rss_mb, file_mb);
        }
}

int main(int argc, char **argv)
{
    tilejit = getenv("TJ_TILEJIT");
    synth = getenv("TJ_SYNTH");
    if (!tilejit || !synth) {
        fprintf(stderr, "TJ_TILEJIT and TJ_SYNTH must name the tilejit and make-synthetic-model programs\n");
        return 77;
    }
    snprintf(dir, sizeof dir, "/tmp/tj_test_prune_cli_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    if (argc > 1 && strcmp(argv[1], "--bert") == 0) test_bert();
    else test_cli();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    for (int i = 0; i < npaths; i++) free(paths[i]);
    return tj_test_end();
}
