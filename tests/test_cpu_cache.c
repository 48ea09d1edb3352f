/* The CPU backend's on-disk object cache (jit/cpu_jit.c through jit/cache.c), against the
 * reference on fresh random data every time:
 * - a second build of the same layers loads every object from the cache (no LLVM) and gives
 *   bit-identical results; a change of config or pattern misses;
 * - entries torn afterwards (a flipped payload byte, truncation) are discarded and rebuilt, and
 *   an entry that passes the checksum but holds an object the JIT rejects is removed and rebuilt
 *   under fresh symbol names;
 * - writers SIGKILLed while compiling through the cache leave nothing a later run trusts;
 * - 4 processes building the same layers through one cache at once are all right and leave one
 *   entry per layer and no temporary files;
 * - the size cap evicts the least recently used entries, a hit counting as a use, and lists the
 *   directory only at a handle's first store, when its estimate crosses the cap and every 64th
 *   store;
 * - an unusable cache directory is noted once per context, and the CPU backend runs without it. */
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/dtype.h"
#include "runtime/backend_cpu.h"
#include "tj_model.h"
#include "tj_test.h"

#define NL 3

typedef struct layer_data {
    tj_layer l;
    void *w, *bias;
    tj_layer_weights lw;
} layer_data;

/* The same layers (patterns and weights from fixed seeds) in every process. */
static int make_layers(layer_data *d)
{
    static const tj_test_case cases[NL] = {
        {"l0", 256, 192, 64, 0.75, 1, 0, 0, TJ_ACT_RELU, TJ_F32, 1},
        {"l1", 200, 96, 32, 0.5, 2, 0.02, 0, TJ_ACT_GELU, TJ_F32, 1},
        {"l2", 128, 128, 128, 0.9, 1, 0, 0, TJ_ACT_NONE, TJ_F32, 1},
    };
    for (int i = 0; i < NL; i++) {
        if (!tj_test_case_make(&cases[i], 40 + (uint64_t)i, &d[i].l, &d[i].w, &d[i].bias)) return 0;
        if (!d[i].w || !d[i].bias) return 0;
        d[i].lw = (tj_layer_weights){d[i].w, TJ_F32, d[i].bias, TJ_F32};
    }
    return 1;
}

static void free_layers(layer_data *d)
{
    for (int i = 0; i < NL; i++) {
        tj_layer_free(&d[i].l);
        free(d[i].w);
        free(d[i].bias);
    }
}

/* Builds the NL layers through a cache in dir (fresh JIT), runs each on fresh random X against
 * the reference. Returns the number of layers that came from the cache, -1 on any failure;
 * y_out (optional): layer 0's output for M = 37 with X from seed 5. */
static int build_and_check(const char *dir, layer_data *d, const tj_cpu_config *cfg, float *y_out, int verbose)
{
    tj_error err;
    tj_cache *cache = NULL;
    tj_cpu_jit *jit = NULL;
    int hits = 0, ok = 1;
    if (tj_cache_open(dir, &cache, &err) != TJ_OK || tj_cpu_jit_create(&jit, &err) != TJ_OK) {
        if (verbose) fprintf(stderr, "setup: %s\n", err.msg);
        tj_cache_close(cache);
        return -1;
    }
    tj_cpu_jit_set_cache(jit, cache);
    for (int i = 0; i < NL && ok; i++) {
        tj_cpu_layer *cl = NULL;
        char prefix[16];
        snprintf(prefix, sizeof prefix, "cc%d", i);
        if (tj_cpu_layer_build(jit, &d[i].l, &d[i].lw, cfg, prefix, &cl, &err) != TJ_OK) {
            if (verbose) fprintf(stderr, "layer %d: %s\n", i, err.msg);
            ok = 0;
            break;
        }
        hits += cl->from_cache;
        int64_t m = 37, n = d[i].l.n, k = d[i].l.k;
        float *x = malloc((size_t)(m * k) * sizeof *x), *y = malloc((size_t)(m * n) * sizeof *y),
              *ref = malloc((size_t)(m * n) * sizeof *ref);
        tj_rng r = {i == 0 && y_out ? 5 : (uint64_t)time(NULL) * 7 + (uint64_t)i};
        tj_test_fill(&r, x, m * k);
        for (int64_t j = 0; j < m * n; j++) y[j] = NAN;
        tj_cpu_layer_run(cl, NULL, 1, x, m, y);
        tj_reference_linear(&d[i].l, &d[i].lw, x, m, ref);
        double e = tj_test_relerr(y, ref, m * n);
        if (!(e <= 1e-5)) {
            if (verbose) fprintf(stderr, "layer %d: relative error %g\n", i, e);
            ok = 0;
        }
        if (i == 0 && y_out) memcpy(y_out, y, (size_t)(m * n) * sizeof *y);
        free(x);
        free(y);
        free(ref);
        tj_cpu_layer_free(cl);
    }
    tj_cpu_jit_destroy(jit);
    tj_cache_close(cache);
    return ok ? hits : -1;
}

static int count_files(const char *dir, const char *prefix, const char *suffix)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && l >= sl && strcmp(e->d_name + l - sl, suffix) == 0) n++;
    }
    closedir(d);
    return n;
}

/* Applies fn to every entry file of dir. */
static void each_entry(const char *dir, void (*fn)(const char *path, const char *name))
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4200];
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".tjc") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        fn(path, e->d_name);
    }
    closedir(d);
}

static void flip_byte(const char *path, const char *name)
{
    (void)name;
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, -100, SEEK_END); /* inside the object */
    int c = fgetc(f);
    fseek(f, -100, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

static void truncate_entry(const char *path, const char *name)
{
    (void)name;
    struct stat st;
    if (stat(path, &st) == 0) truncate(path, st.st_size / 2);
}

/* Rewrites an entry, under its own key and with a valid header and checksum, as a payload
 * whose object is garbage: only the JIT can tell. */
static void poison_object(const char *path, const char *name)
{
    FILE *f = fopen(path, "rb");
    if (!f) return;
    static unsigned char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t hdr = 64, info = 12 + sizeof(tj_cpu_emit_info);
    if (n <= hdr + info) return;
    for (size_t i = hdr + info; i < n; i++) buf[i] = (unsigned char)(i * 131 + 7);
    memcpy(buf + hdr + info, "\x7f" "ELF", 4); /* looks like an object, is not one */
    tj_cache_key k;
    memset(&k, 0, sizeof k);
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(name + 2 * i, "%2x", &v);
        k.hash[i] = (uint8_t)v;
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(path, '/') - path), path);
    tj_cache *c = NULL;
    tj_error err;
    if (tj_cache_open(dir, &c, &err) != TJ_OK) return;
    tj_cache_store(c, &k, buf + hdr, n - hdr, &err);
    tj_cache_close(c);
}

static void test_hits_and_faults(const char *base, layer_data *d)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/faults", base);
    tj_cpu_config cfg = tj_cpu_config_default();
    float y1[37 * 256], y2[37 * 256];
    CHECK(build_and_check(dir, d, &cfg, y1, 1) == 0);
    CHECK(count_files(dir, "", ".tjc") == NL);
    CHECK(build_and_check(dir, d, &cfg, y2, 1) == NL); /* all from the cache */
    CHECK(memcmp(y1, y2, sizeof y1) == 0);
    tj_cpu_config other = cfg;
    other.unroll = 2;
    CHECK(build_and_check(dir, d, &other, NULL, 1) == 0); /* another config: another key */
    CHECK(count_files(dir, "", ".tjc") == 2 * NL);

    void (*faults[3])(const char *, const char *) = {flip_byte, truncate_entry, poison_object};
    static const char *names[3] = {"flipped byte", "truncated", "object the JIT rejects"};
    for (int f = 0; f < 3; f++) {
        each_entry(dir, faults[f]);
        int h = build_and_check(dir, d, &cfg, y2, 1);
        CHECKF(h == 0, "%s: %d layers from the cache (want 0, all rebuilt)", names[f], h);
        CHECKF(memcmp(y1, y2, sizeof y1) == 0, "%s: rebuilt layer differs", names[f]);
        if (f < 2) { /* rebuilt entries are stored again and hit */
            CHECKF(build_and_check(dir, d, &cfg, NULL, 1) == NL, "%s: rebuilt entries not stored", names[f]);
        } else { /* rejected objects are removed; the rebuild stored under fresh names */
            int h2 = build_and_check(dir, d, &cfg, NULL, 1);
            CHECKF(h2 == 0 || h2 == NL, "after a rejected object: %d hits", h2);
        }
    }
}

static void test_killed_writers(const char *base, layer_data *d)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/killed", base);
    tj_cpu_config cfg = tj_cpu_config_default();
    srand((unsigned)time(NULL));
    for (int round = 0; round < 6; round++) {
        pid_t p = fork();
        if (p == 0) {
            for (;;) { /* build again and again, each time into a fresh key */
                tj_cpu_config c = cfg;
                c.unroll = 1 + rand() % 8;
                build_and_check(dir, d, &c, NULL, 0);
            }
        }
        struct timespec ts = {0, 20000000L + (long)(rand() % 200) * 1000000L};
        nanosleep(&ts, NULL);
        kill(p, SIGKILL);
        waitpid(p, NULL, 0);
    }
    /* whatever they left: every build is right (hits or rebuilds) */
    for (int u = 1; u <= 8; u++) {
        tj_cpu_config c = cfg;
        c.unroll = u;
        CHECKF(build_and_check(dir, d, &c, NULL, 1) >= 0, "unroll %d after killed writers", u);
    }
}

static void test_processes(const char *base, layer_data *d)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/procs", base);
    tj_cpu_config cfg = tj_cpu_config_default();
    pid_t pids[4];
    for (int i = 0; i < 4; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(build_and_check(dir, d, &cfg, NULL, 1) >= 0 ? 0 : 1);
    }
    for (int i = 0; i < 4; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "process %d failed", i);
    }
    CHECK(count_files(dir, "", ".tjc") == NL);
    CHECK(count_files(dir, ".tmp-", "") == 0);
    CHECK(build_and_check(dir, d, &cfg, NULL, 1) == NL);
}

static void test_lru(const char *base)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/lru", base);
    tj_cache *c = NULL;
    tj_error err;
    CHECK_OK(tj_cache_open(dir, &c, &err), &err);
    if (!c) return;
    enum { N = 10, SZ = 10000 };
    static unsigned char blob[SZ];
    tj_cache_key k[N + 1];
    for (int i = 0; i <= N; i++) {
        tj_cache_key_begin(&k[i]);
        tj_cache_key_add(&k[i], &i, sizeof i);
        tj_cache_key_end(&k[i]);
    }
    tj_cache_set_max_bytes(c, 0);
    for (int i = 0; i < N; i++) {
        memset(blob, i, sizeof blob);
        CHECK_OK(tj_cache_store(c, &k[i], blob, sizeof blob, &err), &err);
        struct timespec ts = {0, 20000000L}; /* distinct modification times */
        nanosleep(&ts, NULL);
    }
    /* entry 0, the oldest, is used again: entry 1 becomes the least recently used */
    void *got = NULL;
    size_t len = 0;
    tj_cache_result res;
    CHECK_OK(tj_cache_lookup(c, &k[0], &got, &len, &res, &err), &err);
    CHECK(res == TJ_CACHE_HIT);
    free(got);
    nanosleep(&(struct timespec){0, 20000000L}, NULL);
    /* a cap of 8 entries (with headers): storing one more evicts down to 90 % of it */
    tj_cache_set_max_bytes(c, 8 * (SZ + 64));
    memset(blob, N, sizeof blob);
    CHECK_OK(tj_cache_store(c, &k[N], blob, sizeof blob, &err), &err);
    int present[N + 1];
    for (int i = 0; i <= N; i++) {
        got = NULL;
        CHECK_OK(tj_cache_lookup(c, &k[i], &got, &len, &res, &err), &err);
        present[i] = res == TJ_CACHE_HIT;
        free(got);
    }
    int total = 0;
    for (int i = 0; i <= N; i++) total += present[i];
    CHECKF(total == 7, "%d entries left under a cap of 8 (want 7: 90 %%)", total);
    CHECK(present[0] && present[N]);         /* recently used and just stored */
    CHECK(!present[1] && !present[2] && !present[3] && !present[4]); /* the least recently used */
    CHECK(tj_cache_get_stats(c).evicted == 4);
    tj_cache_close(c);
}

/* The size cap lists the directory only when needed (tj_cache_stats.scans): at a handle's first
 * store, when its estimate (last listing + its own stores) crosses the cap, and every 64th store;
 * what another handle adds is evicted at the next listing. */
static void test_evict_scans(const char *base)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/scans", base);
    enum { SZ = 1000, ENTRY = SZ + 64 };
    static unsigned char blob[SZ];
    tj_cache *a = NULL, *b = NULL, *c = NULL;
    tj_error err;
    CHECK_OK(tj_cache_open(dir, &a, &err), &err);
    CHECK_OK(tj_cache_open(dir, &b, &err), &err);
    if (!a || !b) goto done;
    tj_cache_set_max_bytes(a, 20 * ENTRY);
    tj_cache_set_max_bytes(b, 0);
    int key = 0;
    tj_cache_key k;
#define STORE(h)                                                                \
    do {                                                                        \
        tj_cache_key_begin(&k);                                                 \
        tj_cache_key_add_str(&k, "scans");                                      \
        tj_cache_key_add(&k, &key, sizeof key);                                 \
        tj_cache_key_end(&k);                                                   \
        memset(blob, key++, sizeof blob);                                       \
        CHECK_OK(tj_cache_store(h, &k, blob, sizeof blob, &err), &err);         \
    } while (0)
    for (int i = 0; i < 20; i++) STORE(a); /* up to the cap exactly: only the first store lists */
    CHECKF(tj_cache_get_stats(a).scans == 1 && count_files(dir, "", ".tjc") == 20, "%lld scans, %d entries",
           (long long)tj_cache_get_stats(a).scans, count_files(dir, "", ".tjc"));
    STORE(a); /* over the cap: listed and evicted to 90 % (18 entries) */
    CHECKF(tj_cache_get_stats(a).scans == 2 && tj_cache_get_stats(a).evicted == 3 && count_files(dir, "", ".tjc") == 18,
           "%lld scans, %lld evicted, %d entries", (long long)tj_cache_get_stats(a).scans,
           (long long)tj_cache_get_stats(a).evicted, count_files(dir, "", ".tjc"));
    for (int i = 0; i < 10; i++) STORE(b); /* another handle, no cap: 28 entries */
    STORE(a); /* a's estimate: 19 entries, not listed yet */
    CHECK(tj_cache_get_stats(a).scans == 2 && count_files(dir, "", ".tjc") == 29);
    STORE(a);
    STORE(a); /* its estimate crosses the cap: the listing sees b's entries too */
    CHECKF(tj_cache_get_stats(a).scans == 3 && count_files(dir, "", ".tjc") == 18, "%lld scans, %d entries",
           (long long)tj_cache_get_stats(a).scans, count_files(dir, "", ".tjc"));
    CHECK(tj_cache_get_stats(b).scans == 0);

    /* far under the cap: listed at the 1st, 65th and 129th store */
    CHECK_OK(tj_cache_open(dir, &c, &err), &err);
    if (!c) goto done;
    tj_cache_set_max_bytes(c, 1000 * ENTRY);
    for (int i = 0; i < 130; i++) STORE(c);
    CHECKF(tj_cache_get_stats(c).scans == 3 && tj_cache_get_stats(c).evicted == 0, "%lld scans",
           (long long)tj_cache_get_stats(c).scans);
    tj_cache_set_max_bytes(c, 10 * ENTRY); /* a new cap: the next store lists */
    STORE(c);
    CHECK(tj_cache_get_stats(c).scans == 4 && count_files(dir, "", ".tjc") == 9);
#undef STORE
done:
    tj_cache_close(a);
    tj_cache_close(b);
    tj_cache_close(c);
}

static int count_in(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* A context whose cache directory cannot be made (it would lie under a regular file): models
 * load and run without the cache, and the verbose log says so once, at the first load. */
static void test_unusable_dir(const char *base)
{
    char dir[400], bad[700];
    snprintf(dir, sizeof dir, "%.300s/unusable", base);
    tj_test_model tm;
    if (mkdir(dir, 0755) != 0 || tj_test_model_make(&tm, dir, 7, 8, TJ_ACT_RELU) != 0) {
        CHECK(0);
        return;
    }
    snprintf(bad, sizeof bad, "%s/cache", tm.pat);
    tj_options o = tj_options_default();
    o.backend = TJ_BACKEND_CPU;
    o.verbose = 1;
    o.cache_dir = bad;
    tj_context *ctx = NULL;
    CHECK(tj_context_create(&o, &ctx) == TJ_OK);
    for (int i = 0; ctx && i < 2; i++) {
        tj_model *m = NULL;
        CHECKF(tj_model_load(ctx, tm.pat, tm.wts, &m) == TJ_OK, "load %d: %s", i, tj_context_error(ctx));
        if (m) {
            enum { M = 9 };
            static float x[M * TJ_TEST_MODEL_K], y[M * TJ_TEST_MODEL_N], ref[M * TJ_TEST_MODEL_N];
            tj_rng r = {(uint64_t)time(NULL) + (uint64_t)i};
            tj_test_fill(&r, x, M * TJ_TEST_MODEL_K);
            for (int j = 0; j < M * TJ_TEST_MODEL_N; j++) y[j] = NAN;
            int64_t xs[2] = {M, TJ_TEST_MODEL_K}, ys[2] = {M, TJ_TEST_MODEL_N};
            DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
            DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
            CHECKF(tj_linear(m, "fc", &xt, &yt, NULL) == TJ_OK, "%s", tj_context_error(ctx));
            tj_layer_weights lw = {tm.w, TJ_F32, tm.bias, TJ_F32};
            tj_reference_linear(&tm.layer, &lw, x, M, ref);
            double e = tj_test_relerr(y, ref, M * TJ_TEST_MODEL_N);
            CHECKF(e <= 1e-5, "load %d: relative error %g", i, e);
        }
        tj_model_destroy(m);
    }
    if (ctx) {
        const char *log = tj_context_log(ctx);
        CHECKF(count_in(log, "cpu: kernel cache: kernel cache disabled: cannot create directory") == 1, "%s", log);
    }
    tj_context_destroy(ctx);
    tj_test_model_free(&tm);
}

/* ---- the key: one definition of a layer's content (tj_layer_fields) behind tj_layer_hash and
 * the object-cache key. Every field that changes generated code changes both; the name does
 * not; a change of any config field or of the symbol prefix changes the key. */

/* A deep copy of l whose arrays have spare zeroed entries, so a mutated count stays readable. */
static int copy_layer(const tj_layer *l, tj_layer *c)
{
    enum { SPARE = 4 };
    *c = *l;
    c->cols = l->cols ? calloc((size_t)l->ncols + SPARE, sizeof *c->cols) : NULL;
    c->tile_ptr = calloc((size_t)l->ntiles + 1 + SPARE, sizeof *c->tile_ptr);
    c->tile_rows = calloc((size_t)l->tile_ptr[l->ntiles] + SPARE, sizeof *c->tile_rows);
    c->ew_indptr = l->ew_indptr ? calloc((size_t)l->n + 1 + SPARE, sizeof *c->ew_indptr) : NULL;
    c->ew_indices = l->ew_indptr ? calloc((size_t)l->ew_nnz + SPARE, sizeof *c->ew_indices) : NULL;
    if ((l->cols && !c->cols) || !c->tile_ptr || !c->tile_rows || (l->ew_indptr && (!c->ew_indptr || !c->ew_indices)))
        return 0;
    if (l->cols) memcpy(c->cols, l->cols, (size_t)l->ncols * sizeof *c->cols);
    memcpy(c->tile_ptr, l->tile_ptr, (size_t)(l->ntiles + 1) * sizeof *c->tile_ptr);
    memcpy(c->tile_rows, l->tile_rows, (size_t)l->tile_ptr[l->ntiles] * sizeof *c->tile_rows);
    if (l->ew_indptr) {
        memcpy(c->ew_indptr, l->ew_indptr, (size_t)(l->n + 1) * sizeof *c->ew_indptr);
        memcpy(c->ew_indices, l->ew_indices, (size_t)l->ew_nnz * sizeof *c->ew_indices);
    }
    return 1;
}

static void free_copy(tj_layer *c)
{
    free(c->cols);
    free(c->tile_ptr);
    free(c->tile_rows);
    free(c->ew_indptr);
    free(c->ew_indices);
}

static void test_key_fields(const layer_data *d)
{
    const tj_layer *l = &d[1].l; /* tw2 (cols) with ew: every field present */
    CHECK(l->cols && l->ew_indptr && l->ew_nnz > 1 && l->ntiles > 1 && tj_tile_nrows(l, 0) > 0);
    tj_cpu_config cfg = tj_cpu_config_default();
    tj_cpu_config_resolve(&cfg, l);
    tj_cache_key k0, k, k_absent;
    memset(&k_absent, 0, sizeof k_absent);
    tj_cpu_layer_key(&k0, l, &cfg, "p");
    uint64_t h0 = tj_layer_hash(l);
    CHECK(h0 == l->hash);
    enum { NMUT = 17 };
    static const char *what[NMUT] = {"copy", "name", "n", "k", "g", "ncols", "cols entry", "cols absent", "ntiles",
                                     "tile boundary", "tile row", "act", "ew absent", "ew index", "ew indptr",
                                     "ew nnz", "ew empty"};
    for (int i = 0; i < NMUT; i++) {
        tj_layer c;
        if (!copy_layer(l, &c)) { CHECK(0); free_copy(&c); continue; }
        switch (i) {
        case 0: break;
        case 1: c.name = "another"; break;
        case 2: c.n++; break;
        case 3: c.k++; break;
        case 4: c.g++; break;
        case 5: c.ncols--; break;
        case 6: c.cols[c.ncols - 1]++; break;
        case 7: free(c.cols); c.cols = NULL; break;
        case 8: c.ntiles++; c.tile_ptr[c.ntiles] = c.tile_ptr[c.ntiles - 1]; break;
        case 9: c.tile_ptr[1]--; break;
        case 10: c.tile_rows[0] ^= 1; break;
        case 11: c.act = c.act == TJ_ACT_RELU ? TJ_ACT_NONE : TJ_ACT_RELU; break;
        case 12: free(c.ew_indptr); free(c.ew_indices); c.ew_indptr = NULL; c.ew_indices = NULL; c.ew_nnz = 0; break;
        case 13: c.ew_indices[c.ew_nnz - 1] ^= 1; break;
        case 14: for (int64_t r = 0; r < c.n; r++) if (c.ew_indptr[r + 1] > c.ew_indptr[r]) { c.ew_indptr[r + 1]--; break; } break;
        case 15: c.ew_nnz--; break;
        case 16: /* ew present but empty, against absent: the marker tells them apart */
            memset(c.ew_indptr, 0, (size_t)(c.n + 1) * sizeof *c.ew_indptr);
            c.ew_nnz = 0;
            break;
        }
        tj_cpu_layer_key(&k, &c, &cfg, "p");
        int same_key = memcmp(k.hash, k0.hash, sizeof k.hash) == 0, same_hash = tj_layer_hash(&c) == h0;
        if (i <= 1) CHECKF(same_key && same_hash, "%s: key or hash changed", what[i]);
        else CHECKF(!same_key && !same_hash, "%s: key %s, hash %s", what[i], same_key ? "unchanged" : "changed",
                    same_hash ? "unchanged" : "changed");
        if (i == 12) k_absent = k;
        if (i == 16) CHECK(memcmp(k.hash, k_absent.hash, sizeof k.hash) != 0); /* ew empty is not ew absent */
        free_copy(&c);
    }
    for (int i = 0; i < 15; i++) { /* every config field */
        tj_cpu_config c = cfg;
        switch (i) {
        case 0: c.mr++; break;
        case 1: c.nr += c.vec; break;
        case 2: c.offsets = c.offsets == TJ_CPU_OFFSETS_TABLE ? TJ_CPU_OFFSETS_UNROLLED : TJ_CPU_OFFSETS_TABLE; break;
        case 3: c.unroll++; break;
        case 4: c.mb += 8; break;
        case 5: c.vec = c.vec == 8 ? 16 : 8; break;
        case 6: c.kc += 7; break;
        case 7: c.pack = c.pack == 1 ? 2 : 1; break;
        case 8: c.order = !c.order; break;
        case 9: c.serial = c.serial == 0 ? -1 : 0; break;
        case 10: c.weights = c.weights == TJ_CPU_WEIGHTS_BF16 ? TJ_CPU_WEIGHTS_F32 : TJ_CPU_WEIGHTS_BF16; break;
        case 11: c.dtype = !c.dtype; break;
        case 12: c.out = !c.out; break;
        case 13: c.dot = c.dot == TJ_CPU_DOT_FMA ? TJ_CPU_DOT_DPBF16 : TJ_CPU_DOT_FMA; break;
        case 14: c.prefetch = c.prefetch == 0 ? 2048 : 0; break;
        }
        CHECKF(memcmp(&c, &cfg, sizeof c) != 0, "config field %d not changed", i);
        tj_cpu_layer_key(&k, l, &c, "p");
        CHECKF(memcmp(k.hash, k0.hash, sizeof k.hash) != 0, "config field %d: key unchanged", i);
    }
    tj_cpu_layer_key(&k, l, &cfg, "p_r");
    CHECK(memcmp(k.hash, k0.hash, sizeof k.hash) != 0);
    _Static_assert(sizeof(tj_cpu_config) == 15 * sizeof(int), "a new tj_cpu_config field: add it to the loop above");
}

int main(void)
{
    char base[] = "/tmp/tj_cpu_cache_XXXXXX";
    if (!mkdtemp(base)) return 1;
    layer_data d[NL];
    memset(d, 0, sizeof d);
    if (!make_layers(d)) {
        CHECK(0);
        return tj_test_end();
    }
    test_key_fields(d);
    test_hits_and_faults(base, d);
    test_killed_writers(base, d);
    test_processes(base, d);
    test_lru(base);
    test_evict_scans(base);
    test_unusable_dir(base);
    free_layers(d);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base);
    return tj_test_end();
}
