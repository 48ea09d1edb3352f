/* tilejit-measure: the tuner's measuring helper, started by the library (autotune/measure.c)
 * once per config in a fresh process with a watchdog, so a crash or hang costs one record.
 * Measures one layer under one config (tj_tune_measure_layer) and prints one JSON line: the
 * result. Installed in libexec/tilejit; not a user command (exit 1 with a message on bad input;
 * --help). Options are parsed by base/args.c, the parser bench/'s drivers use too.
 *
 *   tilejit-measure --pattern P --weights W --layer NAME --m M [--backend cpu] [--config JSON]
 *                   [--min-time S] [--min-reps N] [--max-reps N] [--warmup S] [--threads T]
 *                   [--seed N]
 *
 * Test hooks, honoured only here: a config key "_inject" with "compile", "wrong", "crash" or
 * "hang" makes this config fail that way; TILEJIT_TUNE_FAKE_TIME=1 measures on the reference
 * backend and reports a deterministic time derived from the config (for tests of the search and
 * of sharding that must not depend on timing noise). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "autotune/autotune.h"
#include "base/args.h"

#define WHO "tilejit-measure"

static const char *help =
    "usage: tilejit-measure --pattern P --weights W --layer NAME --m M [--backend cpu|cuda|reference]\n"
    "                       [--config JSON] [--min-time S] [--min-reps N] [--max-reps N] [--warmup S]\n"
    "                       [--threads T] [--seed N]\n"
    "The tuner's measuring helper, started by the library once per config: measures one layer under\n"
    "one config and prints the result as one JSON line. Not a user command.\n";

static char *strip_inject(const char *config, char *inject, size_t n)
{
    inject[0] = '\0';
    json_t *o = json_loads(config, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return strdup(config);
    }
    json_t *v = json_object_get(o, "_inject");
    if (json_is_string(v)) snprintf(inject, n, "%s", json_string_value(v));
    json_object_del(o, "_inject");
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(o);
    return s;
}

int main(int argc, char **argv)
{
    const char *pattern = NULL, *weights = NULL, *layer = NULL, *backend = "cpu", *mstr = NULL, *config = "{}";
    const char *min_time = NULL, *min_reps = NULL, *max_reps = NULL, *warmup = NULL, *threads = NULL, *seed = NULL;
    const tj_arg_opt opts[] = {
        {"pattern", 1, &pattern, NULL}, {"weights", 1, &weights, NULL}, {"layer", 1, &layer, NULL},
        {"backend", 1, &backend, NULL}, {"m", 1, &mstr, NULL}, {"config", 1, &config, NULL},
        {"min-time", 1, &min_time, NULL}, {"min-reps", 1, &min_reps, NULL}, {"max-reps", 1, &max_reps, NULL},
        {"warmup", 1, &warmup, NULL}, {"threads", 1, &threads, NULL}, {"seed", 1, &seed, NULL}, {NULL, 0, NULL, NULL}};
    int npos = 0;
    int pr = tj_args_parse(stderr, WHO, argc, argv, opts, NULL, 0, &npos);
    if (pr == 2) {
        fputs(help, stdout);
        return fflush(stdout) == 0 ? 0 : 1;
    }
    if (pr) return 1;
    if (!pattern || !weights || !layer || !mstr)
        return tj_args_fail(stderr, WHO, "--pattern, --weights, --layer and --m are required");
    tj_tune_measure_opts mo = tj_tune_measure_defaults();
    double m, v;
    if (tj_args_parse_double(stderr, WHO, "m", mstr, 1, 1 << 24, &m)) return 1;
    if (m != floor(m)) return tj_args_fail(stderr, WHO, "--m: '%s' is not a whole number", mstr);
    if (min_time) { if (tj_args_parse_double(stderr, WHO, "min-time", min_time, 0, 60, &v)) return 1; mo.min_time_s = v; }
    if (warmup) { if (tj_args_parse_double(stderr, WHO, "warmup", warmup, 0, 60, &v)) return 1; mo.warmup_s = v; }
    if (min_reps) { if (tj_args_parse_double(stderr, WHO, "min-reps", min_reps, 1, 1 << 20, &v)) return 1; mo.min_reps = (int)v; }
    if (max_reps) { if (tj_args_parse_double(stderr, WHO, "max-reps", max_reps, 1, 1 << 20, &v)) return 1; mo.max_reps = (int)v; }
    if (threads) { if (tj_args_parse_double(stderr, WHO, "threads", threads, 0, 1024, &v)) return 1; mo.threads = (int)v; }
    if (seed) {
        char *end;
        errno = 0;
        unsigned long long sv = strtoull(seed, &end, 10);
        if (errno || end == seed || *end) return tj_args_fail(stderr, WHO, "--seed: '%s' is not an unsigned integer", seed);
        mo.seed = (uint64_t)sv;
    }
    tj_backend b;
    if (strcmp(backend, "cpu") == 0) b = TJ_BACKEND_CPU;
    else if (strcmp(backend, "cuda") == 0) b = TJ_BACKEND_CUDA;
    else if (strcmp(backend, "reference") == 0) b = TJ_BACKEND_REFERENCE;
    else return tj_args_fail(stderr, WHO, "--backend: '%s' is not cpu, cuda or reference", backend);
    const char *fake = getenv("TILEJIT_TUNE_FAKE_TIME");
    int faking = fake && *fake && strcmp(fake, "0") != 0;
    if (faking) b = TJ_BACKEND_REFERENCE;

    char inject[32];
    char *cfg = strip_inject(config, inject, sizeof inject);
    if (!cfg) return tj_args_fail(stderr, WHO, "out of memory");
    tj_tune_record r;
    memset(&r, 0, sizeof r);
    tj_error err;
    tj_status s = TJ_OK;
    if (strcmp(inject, "crash") == 0) {
        signal(SIGSEGV, SIG_DFL);
        raise(SIGSEGV);
    } else if (strcmp(inject, "hang") == 0) {
        for (;;) pause();
    }
    if (strcmp(inject, "compile") == 0) {
        r.status = TJ_TUNE_COMPILE_ERROR;
        r.median = INFINITY;
        r.error = strdup("injected compile failure (_inject)");
    } else {
        mo.perturb = strcmp(inject, "wrong") == 0;
        s = tj_tune_measure_layer(pattern, weights, layer, b, cfg, (int64_t)m, &mo, &r, &err);
    }
    if (s == TJ_OK && faking && r.status == TJ_TUNE_OK) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (const char *p = cfg; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
        h = (h ^ (uint64_t)m) * 0x100000001b3ull;
        r.median = 1e-3 * (1.0 + (double)(h % 1000003) / 1000003.0);
        for (int i = 0; i < r.ntimes; i++) r.times[i] = r.median;
    }
    free(cfg);
    if (s != TJ_OK) {
        tj_tune_record_free(&r);
        return tj_args_fail(stderr, WHO, "%s", err.msg);
    }
    char *out = tj_tune_result_to_json(&r);
    tj_tune_record_free(&r);
    if (!out) return tj_args_fail(stderr, WHO, "out of memory");
    printf("%s\n", out);
    free(out);
    return fflush(stdout) == 0 ? 0 : 1;
}
