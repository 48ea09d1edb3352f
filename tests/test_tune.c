/* Autotuner (suite unit): records round trip and resume, db choice and tie-breaking, spaces and
 * their validity rules, and sweeps through `tilejit tune` in child processes: injected compile
 * errors, wrong results, crashes and hangs are recorded and the sweep goes on; 4 shards merged
 * choose what one unsharded run chooses (deterministic fake timings). No LLVM needed. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "autotune/autotune.h"
#include "gen/cpu_serial.h"
#include "runtime/model.h"
#include "pattern/random.h"
#include "cli_run.h"
#include "tj_config.h"
#include "tj_test.h"

static char dir[512];
static const char *exe;

static tj_tune_record mk(const char *device, const char *arch, uint64_t hash, int64_t m, const char *cfg,
                         tj_tune_status st, double med)
{
    tj_tune_record r;
    memset(&r, 0, sizeof r);
    snprintf(r.target.backend, sizeof r.target.backend, "cpu");
    snprintf(r.target.device, sizeof r.target.device, "%s", device);
    snprintf(r.target.arch, sizeof r.target.arch, "%s", arch);
    snprintf(r.wl.layer, sizeof r.wl.layer, "l%llx", (unsigned long long)hash);
    r.wl.pattern_hash = hash;
    r.wl.n = 768;
    r.wl.k = 768;
    r.wl.g = 128;
    r.wl.kept = 768 * 768 / 4;
    snprintf(r.wl.dtype, sizeof r.wl.dtype, "f32");
    r.wl.m = m;
    r.config = strdup(cfg);
    r.status = st;
    r.median = st == TJ_TUNE_OK ? med : INFINITY;
    return r;
}

static void test_records(void)
{
    tj_error err;
    tj_tune_record r = mk("skylake-avx512", "x86_64-avx512", 0xabcdef0123456789ull, 128, "{\"nr\": 32, \"mr\": 12}",
                          TJ_TUNE_OK, 1.25e-4);
    double t[3] = {1.3e-4, 1.25e-4, 1.2e-4};
    r.times = malloc(sizeof t);
    memcpy(r.times, t, sizeof t);
    r.ntimes = 3;
    r.reps = 3;
    char *line = NULL, *canon = NULL;
    CHECK_OK(tj_tune_config_canonical(r.config, &canon, &err), &err);
    CHECK(canon && strcmp(canon, "{\"mr\":12,\"nr\":32}") == 0);
    free(r.config);
    r.config = canon;
    CHECK_OK(tj_tune_record_to_json(&r, &line, &err), &err);
    CHECK(line && !strchr(line, '\n'));
    tj_tune_record b;
    CHECK_OK(tj_tune_record_parse(line, "t", &b, &err), &err);
    CHECK(strcmp(b.config, r.config) == 0 && b.status == TJ_TUNE_OK && b.median == 1.25e-4);
    CHECK(b.wl.pattern_hash == r.wl.pattern_hash && b.wl.m == 128 && b.ntimes == 3 && b.times[2] == 1.2e-4);
    CHECK(strcmp(b.target.device, "skylake-avx512") == 0 && strcmp(b.target.arch, "x86_64-avx512") == 0);
    tj_tune_record_free(&b);
    free(line);

    /* failures: infinite cost written as "inf" */
    tj_tune_record f = mk("d", "a", 1, 1, "{}", TJ_TUNE_TIMEOUT, 0);
    f.error = strdup("killed by the watchdog");
    CHECK_OK(tj_tune_record_to_json(&f, &line, &err), &err);
    CHECK(strstr(line, "\"median\":\"inf\"") && strstr(line, "\"status\":\"timeout\""));
    CHECK_OK(tj_tune_record_parse(line, "t", &b, &err), &err);
    CHECK(b.status == TJ_TUNE_TIMEOUT && isinf(b.median) && b.error && strstr(b.error, "watchdog"));
    tj_tune_record_free(&b);
    free(line);
    tj_tune_record_free(&f);

    /* malformed records are errors with a message, never crashes */
    CHECK(tj_tune_record_parse("{\"format\":\"tilejit-tune\",\"version\":2}", "x:1", &b, &err) == TJ_ERR_FORMAT);
    CHECK(strstr(err.msg, "x:1") && strstr(err.msg, "version"));
    CHECK(tj_tune_record_parse("{\"format\":\"tilejit-tune\",\"version\":1,\"target\":{},\"workload\":{},\"config\":{}}",
                               "x:2", &b, &err) == TJ_ERR_FORMAT);
    CHECK(tj_tune_record_parse("[1,2", "x:3", &b, &err) == TJ_ERR_FORMAT);

    /* append, read back, a torn last line is skipped */
    char path[600];
    snprintf(path, sizeof path, "%s/records.jsonl", dir);
    unlink(path);
    CHECK_OK(tj_tune_log_append(path, &r, &err), &err);
    CHECK(r.timestamp[0] && strstr(r.tool, "tilejit"));
    tj_tune_record r2 = mk("skylake-avx512", "x86_64-avx512", 0xabcdef0123456789ull, 128, "{\"mr\":8}",
                           TJ_TUNE_WRONG_RESULT, 0);
    CHECK_OK(tj_tune_log_append(path, &r2, &err), &err);
    FILE *fp = fopen(path, "a");
    fputs("{\"format\":\"tilejit-tune\",\"version\":1,\"target\":{\"back", fp);
    fclose(fp);
    tj_tune_db *db = NULL;
    CHECK_OK(tj_tune_db_create(&db, &err), &err);
    CHECK_OK(tj_tune_db_load(db, path, 0, &err), &err);
    CHECK(tj_tune_db_size(db) == 2 && tj_tune_db_bad_lines(db) == 1);
    tj_tune_status st;
    double med;
    CHECK(tj_tune_db_find(db, &r.target, &r.wl, r.config, &st, &med) && st == TJ_TUNE_OK && med == 1.25e-4);
    CHECK(tj_tune_db_find(db, &r2.target, &r2.wl, "{\"mr\":8}", &st, &med) && st == TJ_TUNE_WRONG_RESULT && isinf(med));
    CHECK(!tj_tune_db_find(db, &r.target, &r.wl, "{\"mr\":6}", NULL, NULL));
    tj_tune_db_destroy(db);
    snprintf(path, sizeof path, "%s/missing.jsonl", dir);
    CHECK_OK(tj_tune_db_create(&db, &err), &err);
    CHECK(tj_tune_db_load(db, path, 0, &err) == TJ_ERR_IO && strstr(err.msg, "missing.jsonl"));
    CHECK_OK(tj_tune_db_load(db, path, 1, &err), &err);
    tj_tune_db_destroy(db);
    tj_tune_record_free(&r);
    tj_tune_record_free(&r2);
}

static tj_layer fake_layer(uint64_t hash)
{
    static int64_t ptr[2] = {0, 0};
    tj_layer l;
    memset(&l, 0, sizeof l);
    l.name = "x";
    l.n = 768;
    l.k = 768;
    l.g = 128;
    l.ncols = 768;
    l.ntiles = 0; /* kept = 0 TW + ew: the shape key needs the density, given below via ew_nnz */
    l.tile_ptr = ptr;
    l.ew_nnz = 768 * 768 / 4;
    l.hash = hash;
    return l;
}

static void add(tj_tune_db *db, tj_tune_record r)
{
    tj_error err;
    CHECK_OK(tj_tune_db_add(db, &r, &err), &err);
    tj_tune_record_free(&r);
}

static void test_db(void)
{
    tj_error err;
    tj_tune_db *db[2];
    for (int pass = 0; pass < 2; pass++) {
        CHECK_OK(tj_tune_db_create(&db[pass], &err), &err);
        tj_tune_record rs[] = {
            mk("dev", "x86", 7, 128, "{\"c\":1}", TJ_TUNE_OK, 2e-4),
            mk("dev", "x86", 7, 128, "{\"c\":2}", TJ_TUNE_OK, 1e-4), /* tie with c:3 */
            mk("dev", "x86", 7, 128, "{\"c\":3}", TJ_TUNE_OK, 1e-4),
            mk("dev", "x86", 7, 128, "{\"c\":0}", TJ_TUNE_OK, 0.5e-4), /* fastest, but also wrong once */
            mk("dev", "x86", 7, 128, "{\"c\":0}", TJ_TUNE_WRONG_RESULT, 0),
            mk("dev", "x86", 7, 128, "{\"c\":1}", TJ_TUNE_OK, 0.9e-4), /* a second, faster record */
            mk("dev", "x86", 7, 128, "{\"c\":4}", TJ_TUNE_TIMEOUT, 0),
            mk("dev", "x86", 7, 1, "{\"c\":5}", TJ_TUNE_OK, 1e-5),
            mk("other", "x86", 7, 4096, "{\"c\":6}", TJ_TUNE_OK, 1e-3),
            mk("other", "x86", 9, 128, "{\"c\":7}", TJ_TUNE_OK, 1e-4),
        };
        int n = (int)(sizeof rs / sizeof *rs);
        for (int i = 0; i < n; i++) add(db[pass], rs[pass ? n - 1 - i : i]); /* order must not matter */
    }
    for (int pass = 0; pass < 2; pass++) {
        tj_tune_choice ch;
        tj_layer l = fake_layer(7);
        CHECK(tj_tune_db_best(db[pass], "cpu", "dev", "x86", &l, 128, &ch) == TJ_OK);
        CHECK_OK(TJ_OK, &err);
        /* c:1's two records (2e-4, 0.9e-4) count with their median 1.45e-4: c:2 and c:3 tie at
         * 1e-4 and the config text breaks the tie; c:0 was fastest once but wrong once */
        CHECKF(ch.config && strcmp(ch.config, "{\"c\":2}") == 0, "got %s", ch.config);
        CHECK(ch.match == TJ_TUNE_MATCH_DEVICE_PATTERN && ch.m_tuned == 128 && ch.median == 1e-4);
        tj_tune_record probe = mk("dev", "x86", 7, 128, "{\"c\":1}", TJ_TUNE_OK, 0);
        CHECK(fabs(tj_tune_db_cost(db[pass], &probe.target, &probe.wl, "{\"c\":1}") - 1.45e-4) < 1e-12);
        CHECK(isinf(tj_tune_db_cost(db[pass], &probe.target, &probe.wl, "{\"c\":0}")));
        CHECK(tj_tune_db_records(db[pass], &probe.target, &probe.wl, "{\"c\":1}") == 2);
        CHECK(tj_tune_db_records(db[pass], &probe.target, &probe.wl, "{\"c\":0}") == 2);
        tj_tune_record_free(&probe);
        /* M buckets: 100 → bucket of 128; 1 → its own; 3000 → nearest tuned (128 at distance 5 vs 1 at 12) */
        CHECK(tj_tune_db_best(db[pass], "cpu", "dev", "x86", &l, 100, &ch) == TJ_OK && ch.m_tuned == 128);
        CHECK(tj_tune_db_best(db[pass], "cpu", "dev", "x86", &l, 1, &ch) == TJ_OK && strcmp(ch.config, "{\"c\":5}") == 0);
        CHECK(tj_tune_db_best(db[pass], "cpu", "dev", "x86", &l, 3000, &ch) == TJ_OK && ch.m_tuned == 128);
        CHECK(tj_tune_db_best(db[pass], "cpu", "dev", "x86", &l, 0, &ch) == TJ_OK && ch.m_tuned == 128);
        /* another device of the family: the arch-level best over both devices */
        CHECK(tj_tune_db_best(db[pass], "cpu", "new", "x86", &l, 4096, &ch) == TJ_OK);
        CHECK(ch.match == TJ_TUNE_MATCH_ARCH_PATTERN && strcmp(ch.config, "{\"c\":6}") == 0);
        /* same shape and density, other pattern: shape match */
        tj_layer l2 = fake_layer(1234);
        CHECK(tj_tune_db_best(db[pass], "cpu", "dev", "x86", &l2, 128, &ch) == TJ_OK);
        CHECK(ch.match == TJ_TUNE_MATCH_DEVICE_SHAPE && strcmp(ch.config, "{\"c\":2}") == 0);
        /* other backend, other family: nothing */
        CHECK(tj_tune_db_best(db[pass], "cuda", "dev", "x86", &l, 128, &ch) == TJ_ERR_NOT_FOUND);
        CHECK(tj_tune_db_best(db[pass], "cpu", "zzz", "arm", &l, 128, &ch) == TJ_ERR_NOT_FOUND);
    }
    CHECK(tj_tune_m_bucket(1) == 0 && tj_tune_m_bucket(2) == 1 && tj_tune_m_bucket(3) == 2 && tj_tune_m_bucket(128) == 7 &&
          tj_tune_m_bucket(129) == 8);
    tj_tune_db_destroy(db[0]);
    tj_tune_db_destroy(db[1]);
}

static int64_t count_in(const tj_tune_space *s, const char *needle)
{
    int64_t n = 0;
    for (int64_t i = 0; i < s->count; i++) n += strstr(s->json[i], needle) != NULL;
    return n;
}

static void test_space(void)
{
    tj_error err;
    tj_tune_host h = {.vec = 16, .vregs = 32, .g = 128};
    tj_tune_space s;
    CHECK_OK(tj_tune_space_build("cpu", &h, &s, &err), &err);
    CHECK(s.count > 100 && s.dropped > 0 && s.default_index >= 0);
    CHECK(s.default_index >= 0 && strstr(s.json[s.default_index], "\"offsets\":\"table\"") &&
          !strstr(s.json[s.default_index], "\"kc\"")); /* kc auto, left out of the JSON */
    for (int64_t i = 0; i < s.count; i++) {
        int mr = 0, nr = 0;
        const char *p = strstr(s.json[i], "\"mr\":"), *q = strstr(s.json[i], "\"nr\":");
        CHECK(p && q);
        if (p) mr = atoi(p + 5);
        if (q) nr = atoi(q + 5);
        CHECKF(nr % 16 == 0 && mr * (nr / 16) + nr / 16 + 1 <= 32, "%s", s.json[i]);
        for (int64_t j = 0; j < i; j++) CHECK(strcmp(s.json[i], s.json[j]) != 0);
    }
    int64_t nb[64];
    int64_t k = tj_tune_space_neighbours(&s, s.default_index, nb, 64);
    CHECK(k > 4);
    for (int64_t j = 0; j < k; j++) {
        int diff = 0;
        for (int a = 0; a < s.naxes; a++) diff += s.points[nb[j] * s.naxes + a] != s.points[s.default_index * s.naxes + a];
        CHECK(diff == 1);
    }
    tj_tune_workload w = {.n = 768, .k = 768, .g = 128, .kept = 768 * 768 / 4, .m = 128};
    for (int64_t i = 0; i < s.count; i++) CHECK(isfinite(tj_tune_model_cost(&s, &h, i, &w, 2)) && tj_tune_model_cost(&s, &h, i, &w, 2) > 0);
    int64_t n16 = s.count;
    CHECK(count_in(&s, "unrolled") > 0);
    /* bf16 activations, "always parallel" and a pinned prefetch join only when they can matter */
    CHECK(count_in(&s, "\"dtype\":\"bf16\"") == 0 && count_in(&s, "\"serial\":-1") == 0 && count_in(&s, "\"prefetch\"") == 0);
    tj_tune_space_free(&s);
    tj_tune_host hb = h;
    hb.act_bf16 = 1;
    hb.min_m = 1;
    hb.kept_rows = 100;
    CHECK_OK(tj_tune_space_build("cpu", &hb, &s, &err), &err);
    CHECK(count_in(&s, "\"dtype\":\"bf16\"") > 0 && count_in(&s, "\"serial\":-1") > 0 && s.default_index >= 0);
    CHECK(count_in(&s, "\"prefetch\":0") > 0 && count_in(&s, "\"prefetch\":2048") > 0); /* decode-sized M */
    for (int64_t i = 0; i < s.count; i++)
        CHECKF(!strstr(s.json[i], "bf16") || (!strstr(s.json[i], "unrolled") && !strstr(s.json[i], "\"kc\"")), "%s", s.json[i]);
    tj_tune_space_free(&s);
    /* "always parallel" joins exactly when the runtime's small-call rule (gen/cpu_serial.h) would
     * run the smallest tuned M serially, on the same count of kept weights (tj_layer_kept) */
    int64_t edge = tj_cpu_serial_default(tj_host_cpu_name()) * 100; /* 2 · (1 + 4) · kept = 1000 · kFLOP */
    CHECK(tj_cpu_serial_default("sapphirerapids") == 540 && tj_cpu_serial_default("znver4") == 320 &&
          tj_cpu_serial_default(NULL) == 540);
    CHECK(tj_cpu_serial_call(0, 1, edge - 1) && !tj_cpu_serial_call(0, 1, edge) && !tj_cpu_serial_call(-1, 1, 1) &&
          tj_cpu_serial_call(500, 2, 41666) && !tj_cpu_serial_call(500, 2, 41667));
    const int64_t kepts[] = {edge - 1, edge};
    for (int i = 0; i < 2; i++) {
        tj_tune_host hk = h;
        hk.min_m = 1;
        hk.kept_rows = 100;
        hk.kept = kepts[i];
        CHECK_OK(tj_tune_space_build("cpu", &hk, &s, &err), &err);
        CHECKF((count_in(&s, "\"serial\":-1") > 0) == (i == 0), "kept %lld", (long long)kepts[i]);
        tj_tune_space_free(&s);
    }
    tj_random_spec rs = {.n = 200, .k = 96, .g = 64, .sparsity = 0.5, .mode = 2, .seed = 3, .ew_fraction = 0.02};
    tj_layer rl;
    CHECK_OK(tj_random_layer(&rs, "kept", &rl, &err), &err);
    tj_tune_host hl;
    tj_tune_host_for("cpu", NULL, &rl, &hl);
    CHECK(hl.kept == tj_layer_kept(&rl) && rl.ew_nnz > 0 && hl.kept != hl.kept_rows * hl.g);
    tj_layer_free(&rl);
    /* code size: a 3072×768 layer at s = 0.75 keeps 24 × 192 rows: no unrolled config survives */
    tj_tune_host hbig = h;
    hbig.kept_rows = 24 * 192;
    CHECK_OK(tj_tune_space_build("cpu", &hbig, &s, &err), &err);
    CHECK(s.count > 0 && count_in(&s, "unrolled") == 0 && count_in(&s, "table") == s.count);
    tj_tune_space_free(&s);
    /* AVX2: 16 registers, 8-float vectors */
    tj_tune_host h8 = {.vec = 8, .vregs = 16, .g = 128};
    CHECK_OK(tj_tune_space_build("cpu", &h8, &s, &err), &err);
    CHECK(s.count > 0 && s.count < n16);
    for (int64_t i = 0; i < s.count; i++) {
        const char *p = strstr(s.json[i], "\"mr\":"), *q = strstr(s.json[i], "\"nr\":");
        int mr = p ? atoi(p + 5) : 0, nr = q ? atoi(q + 5) : 0;
        CHECKF(mr * (nr / 8) + nr / 8 + 1 <= 16, "%s", s.json[i]);
    }
    tj_tune_space_free(&s);

    /* CUDA: shared memory per arch, BN ≤ g and dividing it, register estimate */
    tj_tune_host h90, h86;
    tj_tune_host_for("cuda", "sm_90", NULL, &h90);
    tj_tune_host_for("cuda", "sm_86", NULL, &h86);
    h86.g = 64;
    CHECK(h90.smem_max == 227 * 1024 && h86.smem_max == 99 * 1024);
    tj_tune_space s90, s86;
    CHECK_OK(tj_tune_space_build("cuda", &h90, &s90, &err), &err);
    CHECK_OK(tj_tune_space_build("cuda", &h86, &s86, &err), &err);
    CHECK(s90.count > s86.count && s86.count > 0);
    for (int64_t i = 0; i < s86.count; i++) CHECKF(!strstr(s86.json[i], "\"bn\":128"), "%s", s86.json[i]);
    /* the smem rule as data: 4 stages of bk 64 with 128 + 128 is 139264 bytes: fits sm_90 only */
    const tj_tune_axis *ax = s90.axes;
    int p[7] = {0, 2, 2, 2, 2, 2, 0}; /* mma, bm 128, bn 128, bk 64, warps 8, stages 4, table */
    CHECK(strcmp(ax[0].name, "template") == 0 && strcmp(ax[5].name, "stages") == 0);
    CHECK(*tj_tune_space_why_invalid("cuda", &h90, ax, p) == '\0');
    tj_tune_host h86b = h86;
    h86b.g = 128;
    CHECK(strstr(tj_tune_space_why_invalid("cuda", &h86b, ax, p), "shared memory"));
    h86b.g = 64;
    CHECK(strstr(tj_tune_space_why_invalid("cuda", &h86b, ax, p), "tile width"));
    tj_tune_space_free(&s90);
    tj_tune_space_free(&s86);

    /* an explicit list */
    CHECK_OK(tj_tune_space_from_list("cpu", "[{\"mr\":4},{},{\"nr\":16,\"mr\":2}]", &s, &err), &err);
    CHECK(s.count == 3 && s.default_index == 1 && strcmp(s.json[2], "{\"mr\":2,\"nr\":16}") == 0);
    tj_tune_space_free(&s);
    CHECK(tj_tune_space_from_list("cpu", "[{\"mr\":4},{\"mr\":4}]", &s, &err) == TJ_ERR_FORMAT && strstr(err.msg, "duplicate"));
    tj_tune_space_free(&s);
    CHECK(tj_tune_space_from_list("cpu", "{}", &s, &err) == TJ_ERR_FORMAT);
    tj_tune_space_free(&s);
}

/* ---- sweeps through the command line ---------------------------------------------------- */

static char pattern_path[600], weights_path[600];

static void write_model(void)
{
    tj_error err;
    tj_layer ls[2];
    tj_random_spec a = {.n = 64, .k = 48, .g = 32, .sparsity = 0.5, .mode = 1, .seed = 3};
    tj_random_spec b = {.n = 96, .k = 64, .g = 32, .sparsity = 0.75, .mode = 1, .seed = 4};
    CHECK_OK(tj_random_layer(&a, "a", &ls[0], &err), &err);
    CHECK_OK(tj_random_layer(&b, "b", &ls[1], &err), &err);
    tj_pattern p = {2, ls};
    snprintf(pattern_path, sizeof pattern_path, "%s/p.json", dir);
    snprintf(weights_path, sizeof weights_path, "%s/w.safetensors", dir);
    CHECK_OK(tj_pattern_save(&p, pattern_path, &err), &err);
    tj_rng rng = {5};
    float *wa = malloc(64 * 48 * sizeof *wa), *wb = malloc(96 * 64 * sizeof *wb), bias[96];
    tj_test_fill(&rng, wa, 64 * 48);
    tj_test_fill(&rng, wb, 96 * 64);
    tj_test_fill(&rng, bias, 96);
    int64_t sa[2] = {64, 48}, sb[2] = {96, 64}, sbias[1] = {96};
    tj_st_out_tensor t[3] = {{"a.weight", "F32", 2, sa, wa, sizeof(float) * 64 * 48},
                             {"b.weight", "F32", 2, sb, wb, sizeof(float) * 96 * 64},
                             {"b.bias", "F32", 1, sbias, bias, sizeof bias}};
    CHECK_OK(tj_st_write(weights_path, t, 3, NULL, &err), &err);
    free(wa);
    free(wb);
    tj_layer_free(&ls[0]);
    tj_layer_free(&ls[1]);
}


static void test_failures(void)
{
    char cfgs[600], logp[600], out[600];
    snprintf(cfgs, sizeof cfgs, "%s/inject.json", dir);
    snprintf(logp, sizeof logp, "%s/inject.jsonl", dir);
    snprintf(out, sizeof out, "%s/inject.out", dir);
    FILE *f = fopen(cfgs, "w");
    fputs("[{\"_inject\":\"compile\"},{\"_inject\":\"crash\"},{},{\"_inject\":\"hang\"},{\"_inject\":\"wrong\"},{\"x\":1}]",
          f);
    fclose(f);
    unlink(logp);
    int rc = tj_test_sh("'%s' tune '%s' --weights '%s' --backend reference --configs '%s' --m 5 --layer b --timeout 5 "
                "--min-time 0.01 --log '%s' > '%s' 2>&1",
                exe, pattern_path, weights_path, cfgs, logp, out);
    CHECKF(rc == 0, "tune exited %d (see %s)", rc, out);
    /* 6 configs, then the 2 that ran correctly confirmed in 3 more rounds each */
    CHECK(tj_test_count_lines(logp, "\"workload\"") == 12);
    CHECK(tj_test_count_lines(logp, "\"kind\":\"header\",\"shard\":\"0/1\"") == 1);
    CHECK(tj_test_count_lines(logp, "\"status\":\"compile_error\"") == 1);
    CHECK(tj_test_count_lines(logp, "\"status\":\"launch_error\"") == 1);
    CHECK(tj_test_count_lines(logp, "\"status\":\"timeout\"") == 1);
    CHECK(tj_test_count_lines(logp, "\"status\":\"wrong_result\"") == 1);
    CHECK(tj_test_count_lines(logp, "\"status\":\"ok\"") == 8);
    CHECK(tj_test_count_lines(logp, "SIGSEGV") == 1);
    CHECKF(tj_test_count_lines(out, "measured 12 (4 failed)") == 1, "see %s", out);
    /* resume: a torn line at the end, then the same command measures nothing new */
    f = fopen(logp, "a");
    fputs("{\"format\":\"tilejit-tune\",\"ver", f);
    fclose(f);
    rc = tj_test_sh("'%s' tune '%s' --weights '%s' --backend reference --configs '%s' --m 5 --layer b --timeout 5 "
            "--min-time 0.01 --log '%s' > '%s' 2>&1",
            exe, pattern_path, weights_path, cfgs, logp, out);
    CHECK(rc == 0);
    CHECKF(tj_test_count_lines(out, "measured 0 (0 failed), 12 already") == 1, "see %s", out);
    /* --best: never a failed config */
    rc = tj_test_sh("'%s' tune --best '%s' > '%s' 2>&1", exe, logp, out);
    CHECK(rc == 0 && tj_test_count_lines(out, "_inject") == 0 && tj_test_count_lines(out, "malformed") == 1);
    CHECK(tj_test_count_lines(out, "2/6") == 1);
    /* a run that cannot measure at all stops with one clear message */
    rc = tj_test_sh("'%s' tune '%s' --weights '%s/nope.safetensors' --backend reference --m 5 --log '%s/x.jsonl' > '%s' 2>&1",
            exe, pattern_path, dir, dir, out);
    CHECK(rc == 1 && tj_test_count_lines(out, "nope.safetensors") >= 1);
}

/* (layer, M, config) chosen per group of the merged logs */
typedef struct picks { int n; char rows[64][512]; int64_t measured[64], distinct; } picks;

static int collect(void *user, const tj_tune_best_row *r)
{
    picks *p = user;
    p->distinct += r->measured;
    if (p->n < 64) {
        p->measured[p->n] = r->measured;
        snprintf(p->rows[p->n++], 512, "%s %lld %s", r->layer, (long long)r->m, r->config ? r->config : "-");
    }
    return 0;
}

static void best_of(const char *const *logs, int n, picks *out)
{
    tj_error err;
    tj_tune_db *db;
    memset(out, 0, sizeof *out);
    CHECK_OK(tj_tune_db_create(&db, &err), &err);
    for (int i = 0; i < n; i++) CHECK_OK(tj_tune_db_load(db, logs[i], 0, &err), &err);
    CHECK_OK(tj_tune_db_each_best(db, collect, out, &err), &err);
    tj_tune_db_destroy(db);
}

static void test_shards(const char *search, const char *extra)
{
    char one[600], shard[4][600];
    snprintf(one, sizeof one, "%s/%s-all.jsonl", dir, search);
    unlink(one);
    /* every measurement is a fresh process (~0.4 s to start where tilejit links cuBLAS): keep
     * the sweeps small: one confirmation round */
    const char *common = "--backend cpu --m 3,20 --min-time 0 --timeout 60 --confirm 1";
    int rc = tj_test_sh("TILEJIT_TUNE_FAKE_TIME=1 '%s' tune '%s' --weights '%s' %s --search %s %s --log '%s' > /dev/null",
                exe, pattern_path, weights_path, common, search, extra, one);
    CHECK(rc == 0);
    /* four shards as separate processes at once */
    char cmd[8192];
    int off = snprintf(cmd, sizeof cmd, "(");
    for (int i = 0; i < 4; i++) {
        snprintf(shard[i], sizeof shard[i], "%s/%s-shard%d.jsonl", dir, search, i);
        unlink(shard[i]);
        off += snprintf(cmd + off, sizeof cmd - (size_t)off,
                        "TILEJIT_TUNE_FAKE_TIME=1 '%s' tune '%s' --weights '%s' %s --search %s %s --shard %d/4 "
                        "--log '%s' > /dev/null & ",
                        exe, pattern_path, weights_path, common, search, extra, i, shard[i]);
    }
    snprintf(cmd + off, sizeof cmd - (size_t)off, "wait)");
    CHECK(tj_test_sh("%s", cmd) == 0);
    for (int i = 0; i < 4; i++) CHECKF(tj_test_count_lines(shard[i], "\"workload\"") > 0, "shard %d measured nothing", i);
    picks a, b;
    const char *l1[1] = {one}, *l4[4] = {shard[0], shard[1], shard[2], shard[3]};
    best_of(l1, 1, &a);
    best_of(l4, 4, &b);
    CHECKF(a.distinct == b.distinct && a.distinct > 0, "%s: shards measured %lld configs, unsharded %lld", search,
           (long long)b.distinct, (long long)a.distinct);
    CHECK(a.n == 4 && a.n == b.n);
    for (int i = 0; i < a.n && i < b.n; i++) CHECKF(strcmp(a.rows[i], b.rows[i]) == 0, "%s vs %s", a.rows[i], b.rows[i]);
    if (strcmp(search, "exhaustive") == 0) {
        /* exhaustive shards leave the confirmation rounds to a final unsharded pass over the
         * merged logs: it measures exactly those (3 configs × 1 round × 4 workloads) */
        char merged[700], out[700];
        snprintf(merged, sizeof merged, "%s/merged.jsonl", dir);
        snprintf(out, sizeof out, "%s/merged.out", dir);
        CHECK(tj_test_sh("cat '%s' '%s' '%s' '%s' > '%s'", shard[0], shard[1], shard[2], shard[3], merged) == 0);
        CHECK(tj_test_sh("TILEJIT_TUNE_FAKE_TIME=1 '%s' tune '%s' --weights '%s' %s --search %s %s --log '%s' > '%s'", exe,
                 pattern_path, weights_path, common, search, extra, merged, out) == 0);
        CHECKF(tj_test_count_lines(out, "measured 12 (0 failed)") == 1, "see %s", out);
        CHECK(tj_test_count_lines(merged, "\"workload\"") == tj_test_count_lines(one, "\"workload\""));
        best_of((const char *const[]){merged}, 1, &b);
        for (int i = 0; i < a.n && i < b.n; i++) CHECK(strcmp(a.rows[i], b.rows[i]) == 0);
    }
}

/* Log headers and shares (docs/tuning-slurm.md): one workload over two shards. Adaptive: one
 * shard has nothing to do, still writes its log (a header), and --best takes it; exhaustive: the
 * (workload, config) pairs spread over both. A shard resumed with another N is refused; a torn
 * last line is ended before the resumed run appends; other kinds of lines are skipped. */
static void test_headers(const char *cfgs)
{
    char s0[600], s1[600], out[600], cmd[8192];
    snprintf(s0, sizeof s0, "%s/one-0.jsonl", dir);
    snprintf(s1, sizeof s1, "%s/one-1.jsonl", dir);
    snprintf(out, sizeof out, "%s/one.out", dir);
    const char *common = "--backend cpu --m 5 --layer b --min-time 0 --confirm 0";
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "TILEJIT_TUNE_FAKE_TIME=1 '%s' tune '%s' --weights '%s' %s --fraction 0.03 --shard %d/2 "
                 "--log '%s' > '%s' 2>&1", exe, pattern_path, weights_path, common, i, i ? s1 : s0, out);
        unlink(i ? s1 : s0);
        CHECKF(tj_test_sh("%s", cmd) == 0, "see %s", out);
    }
    CHECKF(tj_test_count_lines(out, "shard 1/2 has no work") == 1, "see %s", out);
    CHECK(tj_test_count_lines(s1, NULL) == 1 && tj_test_count_lines(s1, "\"kind\":\"header\",\"shard\":\"1/2\"") == 1);
    CHECK(tj_test_count_lines(s0, "\"kind\":\"header\",\"shard\":\"0/2\"") == 1 && tj_test_count_lines(s0, "\"workload\"") > 0);
    CHECK(tj_test_sh("'%s' tune --best '%s' '%s' > '%s' 2>&1", exe, s0, s1, out) == 0);
    CHECK(tj_test_count_lines(out, "malformed") == 0 && tj_test_count_lines(out, "M=") == 0 &&
          tj_test_count_lines(out, "{") == 1);
    CHECK(tj_test_sh("'%s' tune --best '%s' > '%s' 2>&1", exe, s1, out) == 0);
    CHECKF(tj_test_count_lines(out, "no measurements") == 1, "see %s", out);
    /* the same log resumed as shard 1/3: refused */
    CHECK(tj_test_sh("TILEJIT_TUNE_FAKE_TIME=1 '%s' tune '%s' --weights '%s' %s --shard 1/3 --log '%s' > '%s' 2>&1", exe,
                     pattern_path, weights_path, common, s1, out) == 1);
    CHECKF(tj_test_count_lines(out, "begun by shard 1/2, not 1/3") == 1, "see %s", out);

    /* exhaustive over 8 configs: 4 pairs each */
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "TILEJIT_TUNE_FAKE_TIME=1 '%s' tune '%s' --weights '%s' %s --search exhaustive "
                 "--configs '%s' --shard %d/2 --log '%s' > '%s' 2>&1", exe, pattern_path, weights_path, common, cfgs, i,
                 i ? s1 : s0, out);
        unlink(i ? s1 : s0);
        CHECKF(tj_test_sh("%s", cmd) == 0, "see %s", out);
        CHECK(tj_test_count_lines(i ? s1 : s0, "\"workload\"") == 4);
    }
    /* kill-like damage: the last record cut in half (no newline); the rerun ends that line and
     * measures the config again, and the log reads as 4 records + 1 malformed line */
    CHECK(tj_test_sh("head -n 4 '%s' > '%s.t' && tail -n 1 '%s' | head -c 60 >> '%s.t' && mv '%s.t' '%s'", s1, s1, s1, s1, s1,
                     s1) == 0);
    CHECK(tj_test_sh("%s", cmd) == 0);
    CHECKF(tj_test_count_lines(out, "measured 1 (0 failed), 3 already") == 1, "see %s", out);
    tj_error err;
    tj_tune_db *db;
    CHECK_OK(tj_tune_db_create(&db, &err), &err);
    CHECK_OK(tj_tune_db_load(db, s1, 0, &err), &err);
    CHECK(tj_tune_db_size(db) == 4 && tj_tune_db_bad_lines(db) == 1);
    tj_tune_db_destroy(db);
    /* a later kind of line is skipped, not counted as malformed; no kind is a measurement */
    CHECK(tj_test_sh("(echo '{\"format\":\"tilejit-tune\",\"version\":1,\"kind\":\"note\",\"text\":\"x\"}'; "
                     "grep -v header '%s') > '%s'", s0, s1) == 0);
    CHECK_OK(tj_tune_db_create(&db, &err), &err);
    CHECK_OK(tj_tune_db_load(db, s1, 0, &err), &err);
    CHECK(tj_tune_db_size(db) == 4 && tj_tune_db_bad_lines(db) == 0);
    tj_tune_db_destroy(db);
}

/* The adaptive search stays within its fraction, seeds the default, and finds the fake optimum's
 * neighbourhood (its fake costs are random, so only the bound and determinism are checked). */
static void test_adaptive_bound(void)
{
    char logp[600];
    snprintf(logp, sizeof logp, "%s/adaptive-all.jsonl", dir);
    picks pk;
    best_of((const char *const[]){logp}, 1, &pk);
    tj_tune_host h;
    tj_tune_host_for("cpu", NULL, NULL, &h);
    h.min_m = 1; /* the sweep's small layer at M = 3 is under the serial threshold: serial -1 is in its space */
    tj_tune_space s;
    tj_error err;
    CHECK_OK(tj_tune_space_build("cpu", &h, &s, &err), &err);
    CHECK(pk.n == 4);
    /* the fraction of the space, plus the dense path (a candidate outside the space and its budget) */
    for (int i = 0; i < pk.n; i++)
        CHECKF(pk.measured[i] > 1 && pk.measured[i] <= (int64_t)floor(0.03 * (double)s.count) + 1, "%s: measured %lld of %lld",
               pk.rows[i], (long long)pk.measured[i], (long long)s.count);
    /* the default and the dense path, in every workload */
    CHECK(s.default_index >= 0 && tj_test_count_lines(logp, s.json[s.default_index]) >= 4);
    CHECK(tj_test_count_lines(logp, "\"config\":" TJ_TUNE_DENSE_CONFIG) >= 4);
    tj_tune_space_free(&s);
}

/* tilejit-measure's command line (base/args.c, shared with bench/'s drivers): --help and -h
 * print the usage and exit 0; bad input exits 1 with one message; a good one prints one JSON
 * result line. */
static void test_measure_cli(void)
{
    char out[600], errs[600];
    snprintf(out, sizeof out, "%s/measure.out", dir);
    snprintf(errs, sizeof errs, "%s/measure.err", dir);
    static const struct {
        const char *args;
        int rc;
        const char *frag; /* in stdout (rc 0) or the one stderr line (rc 1) */
    } cases[] = {
        {"--help", 0, "usage: tilejit-measure --pattern P --weights W --layer NAME --m M"},
        {"-h", 0, "usage: tilejit-measure"},
        {"--pattern", 1, "tilejit-measure: option '--pattern' needs a value"},
        {"--bogus 1", 1, "tilejit-measure: unknown option '--bogus' (see --help)"},
        {"stray", 1, "tilejit-measure: unexpected argument 'stray'"},
        {"--pattern p --weights w --layer b", 1, "tilejit-measure: --pattern, --weights, --layer and --m are required"},
        {"--pattern p --weights w --layer b --m 0", 1, "tilejit-measure: --m: '0' is not a number in [1, "},
        {"--pattern p --weights w --layer b --m 2.5", 1, "tilejit-measure: --m: '2.5' is not a whole number"},
        {"--pattern p --weights w --layer b --m 3 --min-time 99", 1, "--min-time: '99' is not a number in [0, 60]"},
        {"--pattern p --weights w --layer b --m 3 --seed -1x", 1, "--seed: '-1x' is not an unsigned integer"},
        {"--pattern p --weights w --layer b --m 3 --backend tpu", 1, "--backend: 'tpu' is not cpu, cuda or reference"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int rc = tj_test_sh("'%s' %s > '%s' 2> '%s'", TJ_MEASURE_HELPER_BUILD, cases[i].args, out, errs);
        CHECKF(rc == cases[i].rc, "'%s': exit %d", cases[i].args, rc);
        if (cases[i].rc == 0) CHECKF(tj_test_count_lines(out, cases[i].frag) == 1, "'%s': see %s", cases[i].args, out);
        else
            CHECKF(tj_test_count_lines(errs, NULL) == 1 && tj_test_count_lines(errs, cases[i].frag) == 1,
                   "'%s': see %s", cases[i].args, errs);
    }
    int rc = tj_test_sh("'%s' --pattern '%s' --weights '%s' --layer b --m 5 --backend reference --min-time 0.001 "
                        "--seed 7 > '%s' 2> '%s'", TJ_MEASURE_HELPER_BUILD, pattern_path, weights_path, out, errs);
    CHECKF(rc == 0 && tj_test_count_lines(out, NULL) == 1 && tj_test_count_lines(out, "\"status\":\"ok\"") == 1,
           "measure exited %d: see %s and %s", rc, out, errs);
}

int main(void)
{
    exe = getenv("TJ_TILEJIT");
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tj_tune_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_records();
    test_db();
    test_space();
    if (!exe) {
        fprintf(stderr, "TJ_TILEJIT not set: skipping the sweeps\n");
    } else {
        write_model();
        test_measure_cli();
        test_failures();
        char cfgs[700], extra[800];
        snprintf(cfgs, sizeof cfgs, "%s/list.json", dir);
        FILE *f = fopen(cfgs, "w");
        fputs("[", f);
        for (int i = 0; i < 8; i++) fprintf(f, "%s{\"mr\":%d,\"unroll\":%d}", i ? "," : "", 1 + i % 4, 1 + i / 4);
        fputs("]", f);
        fclose(f);
        snprintf(extra, sizeof extra, "--configs '%s'", cfgs);
        test_shards("exhaustive", extra);
        test_shards("adaptive", "--fraction 0.03"); /* 3 %: the test's children stay few */
        test_headers(cfgs);
        test_adaptive_bound();
    }
    if (!tj_test_failures) tj_test_sh("rm -rf '%s'", dir);
    return tj_test_end();
}
