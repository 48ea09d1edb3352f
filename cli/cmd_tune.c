/* `tilejit tune`: sweep configs per layer and M into a JSON Lines log (tj_tune_run, which starts
 * the library's measuring helper per config), and `tune --best` to merge logs and show the
 * choice. Public API only (tilejit/tune.h). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *help =
    "usage: tilejit tune PATTERN --weights W.safetensors --log FILE [--backend cpu|cuda|reference]\n"
    "                    [--m 1,128,512] [--budget SECONDS] [--shard I/N] [--search auto|exhaustive|adaptive]\n"
    "                    [--fraction F] [--timeout SECONDS] [--min-time SECONDS] [--threads T]\n"
    "                    [--layer NAME] [--configs FILE] [--arch sm_XX] [--seed S] [--confirm R] [--bf16] [-v]\n"
    "       tilejit tune --best LOG...\n\n"
    "Measures candidate configs of every layer (one per distinct pattern) at each M and appends one\n"
    "JSON line per measurement to --log. Each config is built, checked against the reference on\n"
    "fresh random data, warmed up and timed (median over at least --min-time, default 0.2 s) in a\n"
    "fresh process killed after --timeout (default 60 s): a config that fails to compile, gives a\n"
    "wrong result, crashes or hangs is recorded with its status and the sweep goes on. A rerun\n"
    "skips what the log already holds. --search auto is exhaustive up to 32 configs, else adaptive\n"
    "(model-ordered seeds, then hill-climbing, measuring at most --fraction, default 0.3, of the\n"
    "space). Then the 3 best configs are measured again in R interleaved rounds (--confirm, 3; 0:\n"
    "off) and a config's cost is the median of its records. --budget stops the sweep after SECONDS\n"
    "(rerun to continue). --shard I/N measures the I-th of N deterministic parts (0-based):\n"
    "(workload, config) pairs when exhaustive, whole workloads when adaptive; a log begins with a\n"
    "header line naming its I/N, written even when the share is empty, and a resumed shard must\n"
    "use the same I/N. --configs FILE replaces the built-in space with a JSON array of configs.\n"
    "--bf16 (cpu) adds bf16-activation kernels (\"dtype\": \"bf16\", checked with the bf16 bound).\n\n"
    "--best merges logs and prints the chosen config per layer and M bucket (powers of two);\n"
    "headers, empty logs and a torn last line (reported on stderr) are fine.\n"
    "tilejit run / bench / model use the best record with --tuning-log LOG or TILEJIT_TUNING_LOG.\n";

/* ---- progress -------------------------------------------------------------------------- */

typedef struct progress {
    int tty, verbose;
    int64_t last_len;
} progress;

static void fmt_eta(double s, char *buf, size_t n)
{
    if (s < 0) snprintf(buf, n, "?");
    else if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

static void on_progress(void *user, const tj_tune_progress *p)
{
    progress *pg = user;
    char eta[32], best[64];
    fmt_eta(p->eta_s, eta, sizeof eta);
    if (p->best_config && isfinite(p->best_median)) snprintf(best, sizeof best, "%.4f ms", 1e3 * p->best_median);
    else snprintf(best, sizeof best, "-");
    if (pg->tty) {
        int width = 24, fill = p->total ? (int)(width * p->done / p->total) : width;
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        int n = fprintf(stdout, "\r[%s] %" PRId64 "/%" PRId64 " configs  %.40s M=%" PRId64 "  best %s  ETA %s", bar,
                        p->done, p->total, p->layer, p->m, best, eta);
        for (int64_t i = n; i < pg->last_len; i++) fputc(' ', stdout);
        pg->last_len = n;
        if (pg->verbose && p->status != TJ_TUNE_OK)
            fprintf(stdout, "\n  %s: %s\n", p->config, tj_tune_status_name(p->status));
        fflush(stdout);
        return;
    }
    char med[32];
    if (p->status == TJ_TUNE_OK) snprintf(med, sizeof med, "%.4f ms", 1e3 * p->median);
    else snprintf(med, sizeof med, "%s", tj_tune_status_name(p->status));
    printf("tune: %" PRId64 "/%" PRId64 " %s M=%" PRId64 " %s: %s%s (best %s) ETA %s\n", p->done, p->total, p->layer,
           p->m, p->config, med, p->resumed ? " [from the log]" : "", best, eta);
    fflush(stdout);
}

static void on_workload(void *user, const tj_tune_workload *w, const char *best, double med, int64_t looked,
                        int64_t space)
{
    progress *pg = user;
    if (pg->tty && pg->last_len) {
        fputc('\n', stdout);
        pg->last_len = 0;
    }
    if (best)
        printf("tune: best for %s M=%lld: %s %.4f ms (%lld of %lld configs looked at)\n", w->layer, (long long)w->m, best,
               1e3 * med, (long long)looked, (long long)space);
    else
        printf("tune: no config of %s M=%lld ran correctly (%lld of %lld looked at)\n", w->layer, (long long)w->m,
               (long long)looked, (long long)space);
}

/* ---- --best ---------------------------------------------------------------------------- */

typedef struct best_print {
    const char *last_device;
} best_print;

static int print_row(void *user, const tj_tune_best_row *r)
{
    best_print *bp = user;
    if (!bp->last_device || strcmp(bp->last_device, r->device) != 0) {
        printf("# %s on %s (%s)\n", r->backend, r->device, r->arch);
        printf("%-40s %6s %-11s %10s %9s  %s\n", "layer", "M", "bucket", "median_ms", "measured", "config");
        bp->last_device = r->device;
    }
    char bucket[32];
    int64_t hi = (int64_t)1 << r->bucket, lo = r->bucket ? ((int64_t)1 << (r->bucket - 1)) + 1 : 1;
    snprintf(bucket, sizeof bucket, "%" PRId64 "-%" PRId64, lo, hi);
    char med[32];
    if (r->config) snprintf(med, sizeof med, "%.4f", 1e3 * r->median);
    else snprintf(med, sizeof med, "inf");
    char meas[32];
    snprintf(meas, sizeof meas, "%" PRId64 "/%" PRId64, r->measured - r->failed, r->measured);
    printf("%-40s %6" PRId64 " %-11s %10s %9s  %s\n", r->layer, r->m, bucket, med, meas,
           r->config ? r->config : "(every config failed)");
    return 0;
}

static int run_best(int npos, const char **pos)
{
    if (npos < 1) return cli_fail("tune", "--best needs at least one LOG file");
    tj_error err;
    tj_tune_db *db = NULL;
    int rc = 1;
    if (tj_tune_db_create(&db, &err) != TJ_OK) return cli_fail("tune", "%s", err.msg);
    for (int i = 0; i < npos; i++)
        if (tj_tune_db_load(db, pos[i], 0, &err) != TJ_OK) {
            cli_fail("tune", "%s", err.msg);
            goto done;
        }
    if (tj_tune_db_bad_lines(db))
        fprintf(stderr, "tilejit tune: skipped %lld malformed line(s) (e.g. the torn last line of a killed run)\n",
                (long long)tj_tune_db_bad_lines(db));
    if (tj_tune_db_size(db) == 0) { /* e.g. the logs of shards whose share was empty: nothing to choose */
        fprintf(stderr, "tilejit tune: no measurements in the given log(s); nothing to choose\n");
        rc = 0;
        goto done;
    }
    best_print bp = {NULL};
    if (tj_tune_db_each_best(db, print_row, &bp, &err) != TJ_OK) {
        cli_fail("tune", "%s", err.msg);
        goto done;
    }
    rc = 0;
done:
    tj_tune_db_destroy(db);
    return rc;
}

/* ---- the sweep ------------------------------------------------------------------------- */

static int parse_ms(const char *s, int64_t *ms, int max, int *n)
{
    *n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 24) || (*end && *end != ',') || *n >= max)
            return cli_fail("tune", "--m: '%s' is not a comma-separated list of at most %d values in [1, 2^24]", s, max);
        for (int i = 0; i < *n; i++)
            if (ms[i] == v) return cli_fail("tune", "--m: %lld is listed twice", v);
        ms[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    return *n ? 0 : cli_fail("tune", "--m: empty list");
}

int cmd_tune(int argc, char **argv)
{
    const char *weights = NULL, *backend = "cpu", *mlist = "1,128,512", *budget = NULL, *logp = NULL, *shard = NULL;
    const char *search = "auto", *fraction = NULL, *timeout = NULL, *min_time = NULL, *threads = NULL, *layer = NULL;
    const char *configs = NULL, *arch = NULL, *seed = NULL, *confirm = NULL, *pos[256];
    int best = 0, verbose = 0, bf16 = 0, npos;
    cli_opt opts[] = {{"weights", 1, &weights, NULL}, {"backend", 1, &backend, NULL}, {"m", 1, &mlist, NULL},
                      {"budget", 1, &budget, NULL}, {"log", 1, &logp, NULL}, {"shard", 1, &shard, NULL},
                      {"search", 1, &search, NULL}, {"fraction", 1, &fraction, NULL}, {"timeout", 1, &timeout, NULL},
                      {"min-time", 1, &min_time, NULL}, {"threads", 1, &threads, NULL}, {"layer", 1, &layer, NULL},
                      {"configs", 1, &configs, NULL}, {"arch", 1, &arch, NULL}, {"seed", 1, &seed, NULL},
                      {"confirm", 1, &confirm, NULL}, {"bf16", 0, NULL, &bf16},
                      {"best", 0, NULL, &best}, {"v", 0, NULL, &verbose}, {"verbose", 0, NULL, &verbose}, {0}};
    int r = cli_parse("tune", argc, argv, opts, pos, 256, &npos);
    if (r == 2) {
        fputs(help, stdout);
        return 0;
    }
    if (r) return 1;
    if (best) return run_best(npos, pos);
    if (npos != 1) return cli_fail("tune", "expected one PATTERN file (see --help)");
    if (!weights) return cli_fail("tune", "--weights is required");
    if (!logp) return cli_fail("tune", "--log is required");
    tj_tune_opts o = tj_tune_opts_default();
    if (strcmp(backend, "cpu") && strcmp(backend, "cuda") && strcmp(backend, "reference"))
        return cli_fail("tune", "--backend: '%s' cannot be tuned (cpu, cuda or reference)", backend);
    o.backend = backend;
    o.arch = arch;
    o.act_bf16 = bf16;
    int64_t ms[64];
    int nms;
    if (parse_ms(mlist, ms, 64, &nms)) return 1;
    o.ms = ms;
    o.nms = nms;
    double d;
    if (budget) {
        if (cli_parse_double("tune", "budget", budget, 0, 1e9, &d)) return 1;
        o.budget_s = d;
    }
    if (timeout) {
        if (cli_parse_double("tune", "timeout", timeout, 0.1, 1e6, &d)) return 1;
        o.timeout_s = d;
    }
    if (min_time) {
        if (cli_parse_double("tune", "min-time", min_time, 0, 60, &d)) return 1;
        o.mo.min_time_s = d;
    }
    if (fraction) {
        if (cli_parse_double("tune", "fraction", fraction, 0.01, 1, &d)) return 1;
        o.max_fraction = d;
    }
    int64_t v;
    if (threads) {
        if (cli_parse_int("tune", "threads", threads, 0, 1024, &v)) return 1;
        o.mo.threads = (int)v;
    }
    if (confirm) {
        if (cli_parse_int("tune", "confirm", confirm, 0, 100, &v)) return 1;
        o.confirm_rounds = (int)v;
    }
    if (seed) {
        if (cli_parse_int("tune", "seed", seed, 0, INT64_MAX, &v)) return 1;
        o.mo.seed = (uint64_t)v;
    }
    if (shard) {
        int i, n, used = 0;
        if (sscanf(shard, "%d/%d%n", &i, &n, &used) != 2 || shard[used] || n < 1 || i < 0 || i >= n)
            return cli_fail("tune", "--shard: '%s' is not I/N with 0 <= I < N", shard);
        o.shard = i;
        o.nshards = n;
    }
    if (strcmp(search, "auto") == 0) o.strategy = TJ_TUNE_AUTO;
    else if (strcmp(search, "exhaustive") == 0) o.strategy = TJ_TUNE_EXHAUSTIVE;
    else if (strcmp(search, "adaptive") == 0) o.strategy = TJ_TUNE_ADAPTIVE;
    else return cli_fail("tune", "--search: '%s' is not auto, exhaustive or adaptive", search);
    char *cfgtext = NULL;
    tj_error rerr;
    if (configs && tj_file_read(configs, 0, &cfgtext, NULL, &rerr) != TJ_OK)
        return cli_fail("tune", "%s: cannot read the configs file", configs);
    o.configs_json = cfgtext;
    o.layer_filter = layer;
    o.pattern_path = pos[0];
    o.weights_path = weights;
    o.log_path = logp;
    o.exe = NULL; /* the library's measuring helper (tj_tune_helper_path) */
    progress pg = {isatty(1), verbose, 0};
    o.progress = on_progress;
    o.workload_done = on_workload;
    o.progress_user = &pg;
    tj_error err;
    tj_tune_summary sum;
    tj_status s = tj_tune_run(&o, &sum, &err);
    if (pg.tty && pg.last_len) fputc('\n', stdout);
    free(cfgtext);
    if (s != TJ_OK) return cli_fail("tune", "%s", err.msg);
    if (o.nshards > 1 && sum.workloads == 0)
        printf("tune: shard %d/%d has no work (adaptive searches are split by whole workload, layer x M; exhaustive "
               "ones by (workload, config) pair): its log holds only its header\n", o.shard, o.nshards);
    printf("tune: %lld workload(s), up to %lld configs each; measured %lld (%lld failed), %lld already in %s; %.1f s%s\n",
           (long long)sum.workloads, (long long)sum.space, (long long)sum.measured, (long long)sum.failed,
           (long long)sum.resumed, logp, sum.seconds,
           sum.budget_hit ? "; budget reached: rerun the same command to continue" : "");
    return 0;
}
