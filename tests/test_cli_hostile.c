/* The command line on hostile files (issue 8): every fuzz seed and saved crasher in
 * tests/fuzz/corpus/, and deterministic mutations of them (truncations, byte flips, spliced
 * huge numbers), go through `tilejit inspect` and `tilejit run`. No file may make tilejit die
 * by a signal: each run exits 0, or 1 with one line on stderr. TJ_VALGRIND=1 (the valgrind
 * setup) runs each command under valgrind, on every fourth seed, unmutated.
 * TJ_HOSTILE_MUTATIONS sets the mutations per seed (default 2: each run starts tilejit). */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/npy.h"
#include "pattern/pattern.h"
#include "cli_run.h"
#include "tj_test.h"

static const char *tilejit, *corpus;
static char tmp[256], err_text[1 << 16];
static int valgrind, runs, ok_runs;

static int run(const char *const *args)
{
    char errpath[512];
    snprintf(errpath, sizeof errpath, "%s/stderr.txt", tmp);
    return tj_test_run_cli(tilejit, args, valgrind, errpath, err_text, sizeof err_text);
}

/* Exit 0, or 1 with exactly one line on stderr. */
static void check_run(const char *what, const char *const *args)
{
    int rc = run(args);
    runs++;
    if (rc == 0) {
        ok_runs++;
        return;
    }
    size_t len = strlen(err_text);
    CHECKF(rc == 1, "%s: %s exit %d (want 0 or 1; >128 is a signal): %.2000s", what, args[0], rc, err_text);
    CHECKF(len > 0 && err_text[len - 1] == '\n' && strchr(err_text, '\n') == err_text + len - 1,
           "%s: %s: not one line on stderr: %.2000s", what, args[0], err_text);
}

static void put(const char *p, const void *data, size_t n)
{
    FILE *f = fopen(p, "wb");
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static unsigned char *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    struct stat sb;
    fstat(fileno(f), &sb);
    unsigned char *buf = malloc((size_t)sb.st_size + 1);
    *n = fread(buf, 1, (size_t)sb.st_size, f);
    fclose(f);
    return buf;
}

/* Mutation j of data (deterministic): truncation, byte flips, or a digit run turned huge. */
static size_t mutate(const unsigned char *data, size_t n, int j, unsigned char *out, size_t cap)
{
    tj_rng r = {(uint64_t)j * 2654435761u + n};
    size_t len = n < cap ? n : cap;
    memcpy(out, data, len);
    if (len == 0) return 0;
    switch (j % 4) {
    case 0: /* truncate */
        return (size_t)tj_rng_below(&r, len);
    case 1: /* flip a few bytes */
        for (int i = 0; i < 1 + j % 5; i++) out[tj_rng_below(&r, len)] ^= (unsigned char)(1u << tj_rng_below(&r, 8));
        return len;
    case 2: { /* make a number huge or negative */
        size_t at = (size_t)tj_rng_below(&r, len);
        while (at < len && (out[at] < '0' || out[at] > '9')) at++;
        if (at >= len) return len;
        static const char *repl[] = {"99999999999999999999", "9223372036854775807", "-1", "4294967296", "16777216", "0"};
        const char *s = repl[tj_rng_below(&r, 6)];
        size_t sl = strlen(s);
        if (len + sl > cap) return len;
        memmove(out + at + sl, out + at, len - at);
        memcpy(out + at, s, sl);
        return len + sl;
    }
    default: /* overwrite a binary length field (first 12 bytes) with large values */
        out[tj_rng_below(&r, len < 12 ? len : 12)] = 0xff;
        return len;
    }
}

/* The first layer's name of a pattern, or "fc". */
static void first_layer(const unsigned char *data, size_t n, char *name, size_t cap)
{
    tj_pattern *p = NULL;
    tj_error err;
    snprintf(name, cap, "fc");
    if (tj_pattern_parse((const char *)data, n, "p", &p, &err) == TJ_OK && p->nlayers > 0)
        snprintf(name, cap, "%s", p->layers[0].name);
    tj_pattern_destroy(p);
}

static char *path(const char *name)
{
    static char bufs[8][512];
    static int i;
    char *b = bufs[i++ % 8];
    snprintf(b, 512, "%s/%s", tmp, name);
    return b;
}

/* Runs fn on every file of corpus/<target> and on `mutations` mutations of each. */
static void each_input(const char *target, int mutations, void (*fn)(const char *what, const unsigned char *d, size_t n))
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", corpus, target);
    struct dirent **list = NULL;
    int nfiles = scandir(dir, &list, NULL, alphasort);
    CHECKF(nfiles > 2, "no seeds in %s", dir);
    size_t cap = 1 << 20;
    unsigned char *buf = malloc(cap);
    for (int i = 0; i < nfiles; i++) {
        /* Under valgrind a run of tilejit takes seconds (it maps LLVM and CUDA's libraries): a
         * sample of every fourth seed there. */
        if (list[i]->d_name[0] != '.' && (!valgrind || i % 4 == 0)) {
            char p[2048], what[1400];
            snprintf(p, sizeof p, "%s/%s", dir, list[i]->d_name);
            size_t n = 0;
            unsigned char *data = slurp(p, &n);
            if (data) {
                snprintf(what, sizeof what, "%s/%s", target, list[i]->d_name);
                fn(what, data, n);
                for (int j = 0; j < mutations; j++) {
                    size_t m = mutate(data, n, j, buf, cap);
                    snprintf(what, sizeof what, "%s/%s (mutation %d)", target, list[i]->d_name, j);
                    fn(what, buf, m);
                }
                free(data);
            }
        }
        free(list[i]);
    }
    free(list);
    free(buf);
}

static void on_pattern(const char *what, const unsigned char *d, size_t n)
{
    put(path("p.json"), d, n);
    const char *a[] = {"inspect", path("p.json"), NULL};
    check_run(what, a);
}

/* A fixed small model for the safetensors and .npy inputs: layer "fc", n = 2, k = 3. */
static const char *model_json = "{\"format\":\"tilejit-pattern\",\"version\":1,\"layers\":[{\"name\":\"fc\",\"n\":2,\"k\":3,"
                                "\"g\":2,\"tiles\":[[0,2]]}]}";

static void on_safetensors(const char *what, const unsigned char *d, size_t n)
{
    put(path("w.st"), d, n);
    const char *a[] = {"inspect", path("fixed.json"), "--weights", path("w.st"), NULL};
    check_run(what, a);
    const char *b[] = {"run", path("fixed.json"), "--weights", path("w.st"), "--layer", "fc", "--input", path("fixed.npy"),
                       "--output", path("y.npy"), "--backend", "reference", NULL};
    check_run(what, b);
}

static void on_npy(const char *what, const unsigned char *d, size_t n)
{
    put(path("x.npy"), d, n);
    const char *a[] = {"run", path("fixed.json"), "--weights", path("fixed.st"), "--layer", "fc", "--input", path("x.npy"),
                       "--output", path("y.npy"), "--backend", "reference", NULL};
    check_run(what, a);
}

static void on_model(const char *what, const unsigned char *d, size_t n)
{
    if (n < 4) return;
    uint32_t pl = (uint32_t)d[0] | (uint32_t)d[1] << 8 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 24;
    if (pl > n - 4) pl = (uint32_t)(n - 4);
    put(path("m.json"), d + 4, pl);
    put(path("m.st"), d + 4 + pl, n - 4 - pl);
    char layer[1100];
    first_layer(d + 4, pl, layer, sizeof layer);
    const char *a[] = {"inspect", path("m.json"), "--weights", path("m.st"), NULL};
    check_run(what, a);
    const char *b[] = {"run", path("m.json"), "--weights", path("m.st"), "--layer", layer, "--input", path("x8.npy"),
                       "--output", path("y.npy"), "--backend", "reference", NULL};
    check_run(what, b);
}

int main(void)
{
    tilejit = getenv("TJ_TILEJIT");
    corpus = getenv("TJ_FUZZ_CORPUS");
    if (!tilejit || !corpus) {
        fprintf(stderr, "TJ_TILEJIT and TJ_FUZZ_CORPUS must be set (meson test sets them)\n");
        return 1;
    }
    const char *vg = getenv("TJ_VALGRIND");
    valgrind = vg && *vg == '1';
    const char *e = getenv("TJ_HOSTILE_MUTATIONS");
    int mutations = e ? atoi(e) : valgrind ? 0 : 2;
    snprintf(tmp, sizeof tmp, "/tmp/tj_cli_hostile_XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    /* Fixed companions: the small model and inputs of every width a seed model may have. */
    tj_error err;
    put(path("fixed.json"), model_json, strlen(model_json));
    float w[6] = {1, 2, 3, 4, 5, 6}, x[2 * 8] = {1, -1, 2, 0.5f, 3, -2, 1, 1, 0, 2, 1, 1, 3, 2, 1, 0};
    unsigned char st[8 + 72 + 24];
    const char *h = "{\"fc.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    size_t hl = strlen(h);
    memset(st, ' ', sizeof st);
    for (int i = 0; i < 8; i++) st[i] = (unsigned char)((uint64_t)72 >> (8 * i));
    memcpy(st + 8, h, hl);
    memcpy(st + 80, w, 24);
    put(path("fixed.st"), st, sizeof st);
    CHECK_OK(tj_npy_write(path("fixed.npy"), TJ_F32, 2, 3, x, &err), &err);
    CHECK_OK(tj_npy_write(path("x8.npy"), TJ_F32, 2, 5, x, &err), &err); /* k of the ok_ fixtures */
    each_input("pattern", mutations, on_pattern);
    each_input("safetensors", mutations, on_safetensors);
    each_input("npy", mutations, on_npy);
    each_input("model", mutations, on_model);
    printf("%d runs of tilejit, %d exited 0, the rest 1 with a message\n", runs, ok_runs);
    CHECK(ok_runs > 0 && ok_runs < runs);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return tj_test_end();
}
