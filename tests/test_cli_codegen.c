/* `tilejit gen` and `tilejit compile` end to end: deterministic output files, the golden source,
 * a cold then warm compile through a fresh cache directory (miss, then hit), and exit code 1 with
 * one clear message on bad input. Suite 'cuda'. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tj_test.h"
#include "tilejit.h"

static const char *tilejit;
static char tmp[256], out_text[1 << 16], err_text[1 << 16];

/* Runs tilejit with args (NULL-terminated), capturing stdout and stderr; extra env "K=V" or NULL.
 * Returns the exit code, or 128 + signal. */
static int run_env(const char *env, const char *const *args)
{
    char outpath[512], errpath[512];
    snprintf(outpath, sizeof outpath, "%s/stdout.txt", tmp);
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmp);
    const char *argv[32];
    int n = 0;
    argv[n++] = tilejit;
    for (int i = 0; args[i]; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644), e = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        if (env) putenv((char *)env);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    char *bufs[2] = {out_text, err_text};
    const char *paths[2] = {outpath, errpath};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(paths[i], "rb");
        size_t got = f ? fread(bufs[i], 1, sizeof out_text - 1, f) : 0;
        bufs[i][got] = '\0';
        if (f) fclose(f);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) { free(s); s = NULL; }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

#define EXPECT_FAIL(fragment, ...)                                                                       \
    do {                                                                                                 \
        const char *a_[] = {__VA_ARGS__, NULL};                                                          \
        int rc_ = run_env(NULL, a_);                                                                     \
        CHECKF(rc_ == 1 && strstr(err_text, fragment) && strchr(err_text, '\n') == strrchr(err_text, '\n'), \
               "%s: exit %d, stderr: %s (want one line with '%s')", a_[0], rc_, err_text, fragment);     \
    } while (0)

int main(void)
{
    tilejit = getenv("TJ_TILEJIT");
    const char *fx = getenv("TJ_FIXTURES");
    if (!tilejit || !fx) {
        fprintf(stderr, "TJ_TILEJIT and TJ_FIXTURES must be set (meson test sets them)\n");
        return 77;
    }
    snprintf(tmp, sizeof tmp, "/tmp/tj-cli-codegen-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    char pattern[1024], cfg[1024], golden[1024], out1[512], out2[512], cache_env[600];
    snprintf(pattern, sizeof pattern, "%s/cuda_emit_tiny/pattern.json", fx);
    snprintf(cfg, sizeof cfg, "%s/cuda_emit_tiny/config_table.json", fx);
    snprintf(golden, sizeof golden, "%s/cuda_emit_tiny/expected_table.cu", fx);
    snprintf(out1, sizeof out1, "%s/a.cu", tmp);
    snprintf(out2, sizeof out2, "%s/b.cu", tmp);
    snprintf(cache_env, sizeof cache_env, "TILEJIT_CACHE_DIR=%s/cache", tmp);

    /* gen: a config file and the same config inline give the golden text, byte for byte. */
    const char *g1[] = {"gen", pattern, "--layer", "tiny", "--target", "cuda", "--config", cfg, "-o", out1, NULL};
    CHECKF(run_env(NULL, g1) == 0, "gen: %s", err_text);
    char *cfg_text = read_text(cfg);
    const char *g2[] = {"gen", pattern, "--layer", "tiny", "--target", "cuda", "--config", cfg_text ? cfg_text : "{}", "-o", out2, NULL};
    CHECKF(run_env(NULL, g2) == 0, "gen: %s", err_text);
    char *a = read_text(out1), *b = read_text(out2), *want = read_text(golden);
    CHECK(a && b && want && strcmp(a, b) == 0 && strcmp(a, want) == 0);
    free(a);
    free(b);
    free(want);
    free(cfg_text);
    /* gen to stdout with the default config. */
    const char *g3[] = {"gen", pattern, "--layer", "tiny", "--target", "cuda", NULL};
    CHECK(run_env(NULL, g3) == 0 && strstr(out_text, "tj_tiles") && strstr(out_text, "\"template\":\"mma\""));

    /* compile: cold (miss) then warm (hit), per-layer line and total. */
    const char *c1[] = {"compile", pattern, "--arch", "sm_80,sm_90", NULL};
    CHECKF(run_env(cache_env, c1) == 0, "compile: %s", err_text);
    CHECKF(strstr(out_text, "tiny") && strstr(out_text, "sm_80") && strstr(out_text, "miss") &&
               strstr(out_text, "total: 2 kernels") && strstr(out_text, "0 cache hits"),
           "cold output:\n%s", out_text);
    CHECKF(run_env(cache_env, c1) == 0, "compile: %s", err_text);
    CHECKF(strstr(out_text, " hit ") && strstr(out_text, "2 cache hits, 0 compiled, 0 spill bytes, 0 failed"),
           "warm output:\n%s", out_text);

    /* the arch-specific target of the wgmma kernels is accepted and named so */
    const char *c2[] = {"compile", pattern, "--arch", "sm_90a", NULL};
    CHECKF(run_env(cache_env, c2) == 0 && strstr(out_text, " sm_90a ") && strstr(out_text, "0 failed"), "sm_90a: %s%s",
           out_text, err_text);

    /* Bad input: exit 1, one line. */
    EXPECT_FAIL("--target cuda|cpu is required", "gen", pattern, "--layer", "tiny");
    EXPECT_FAIL("no layer named 'nope'", "gen", pattern, "--layer", "nope", "--target", "cuda");
    EXPECT_FAIL("'bm' must be", "gen", pattern, "--layer", "tiny", "--target", "cuda", "--config", "{\"bm\":\"x\"}");
    EXPECT_FAIL("unknown key 'tile'", "gen", pattern, "--layer", "tiny", "--target", "cuda", "--config", "{\"tile\":1}");
    EXPECT_FAIL("neither JSON text nor a readable file", "gen", pattern, "--layer", "tiny", "--target", "cuda",
                "--config", "/nonexistent.json");
    EXPECT_FAIL("is not cuda or cpu", "gen", pattern, "--layer", "tiny", "--target", "tpu");
    EXPECT_FAIL("--arch", "compile", pattern, "--arch", "volta");
    EXPECT_FAIL("--arch", "compile", pattern, "--arch", "sm_86a");
    EXPECT_FAIL("no layer named", "compile", pattern, "--layer", "nope");
    EXPECT_FAIL("No such file", "compile", "/nonexistent.pattern.json");
    const char *h[] = {"compile", "--help", NULL};
    CHECK(run_env(NULL, h) == 0 && strstr(out_text, "usage: tilejit compile"));
    const char *h2[] = {"gen", "--help", NULL};
    CHECK(run_env(NULL, h2) == 0 && strstr(out_text, "usage: tilejit gen"));
    /* every template of the emitter's table, wgmma included, with its line */
    const char *tname, *twhat;
    int ntemplates = 0;
    for (int i = 0; (tname = tj_gen_cuda_template(i, &twhat)) != NULL; i++, ntemplates++) {
        char want[64];
        snprintf(want, sizeof want, "\n  %-8s ", tname);
        CHECKF(strstr(out_text, want) && strstr(out_text, twhat), "gen --help lacks template %s:\n%s", tname, out_text);
    }
    CHECK(ntemplates == 3 && strcmp(tj_gen_cuda_template(2, NULL), "wgmma") == 0);

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return tj_test_end();
}
