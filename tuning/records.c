/* Tuning records: one JSON line per measurement, append-only, after a header line naming who
 * began the log (format in docs/formats.md, autotune/README.md and docs/tuning-slurm.md).
 * Reading skips headers and tolerates a torn last line so a killed sweep can resume. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "tuning/tuning.h"
#include "tj_config.h"
#if TJ_HAVE_LLVM
#include <llvm-c/Core.h>

#include "base/host.h"
#endif

static const char *const status_names[] = {"ok", "compile_error", "launch_error", "wrong_result", "timeout"};

const char *tj_tune_status_name(tj_tune_status s)
{
    return (unsigned)s < sizeof status_names / sizeof *status_names ? status_names[s] : "launch_error";
}

int tj_tune_status_parse(const char *s, tj_tune_status *out)
{
    for (size_t i = 0; i < sizeof status_names / sizeof *status_names; i++)
        if (s && strcmp(s, status_names[i]) == 0) {
            *out = (tj_tune_status)i;
            return 1;
        }
    return 0;
}

void tj_tune_record_free(tj_tune_record *r)
{
    if (!r) return;
    free(r->config);
    free(r->times);
    free(r->error);
    r->config = NULL;
    r->times = NULL;
    r->error = NULL;
    r->ntimes = 0;
}

int tj_tune_config_is_dense(const char *config)
{
    if (!config) return 0;
    json_t *v = json_loads(config, 0, NULL);
    const json_t *p = json_is_object(v) && json_object_size(v) == 1 ? json_object_get(v, "path") : NULL;
    int dense = p && json_is_string(p) && strcmp(json_string_value(p), "dense") == 0;
    json_decref(v);
    return dense;
}

tj_status tj_tune_config_canonical(const char *json, char **out, tj_error *err)
{
    json_error_t je;
    *out = NULL;
    json_t *v = json_loads(json && *json ? json : "{}", 0, &je);
    if (!v) return tj_fail(err, TJ_ERR_FORMAT, "config '%s': %s (column %d)", json, je.text, je.column);
    if (!json_is_object(v)) {
        json_decref(v);
        return tj_fail(err, TJ_ERR_FORMAT, "config '%s': expected a JSON object", json);
    }
    *out = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(v);
    return *out ? TJ_OK : tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
}

static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1; /* fields are bounded; longer names are cut */
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

static void fill_stamp(tj_tune_record *r)
{
    if (!r->tool[0]) snprintf(r->tool, sizeof r->tool, "tilejit %s", TJ_VERSION);
    if (!r->timestamp[0]) {
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(r->timestamp, sizeof r->timestamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
}

/* "inf" for infinity (failures), a number otherwise. */
static json_t *cost_json(double v) { return isfinite(v) ? json_real(v) : json_string("inf"); }

static int cost_parse(const json_t *v, double *out)
{
    if (json_is_number(v)) *out = json_number_value(v);
    else if (json_is_null(v) || (json_is_string(v) && strcmp(json_string_value(v), "inf") == 0)) *out = INFINITY;
    else return 0;
    return 1;
}

static json_t *result_object(const tj_tune_record *r)
{
    json_t *times = json_array();
    for (int i = 0; times && i < r->ntimes; i++) json_array_append_new(times, json_real(r->times[i]));
    json_t *res = json_pack("{s:s, s:o, s:o, s:I, s:f}", "status", tj_tune_status_name(r->status),
                            "median", cost_json(r->status == TJ_TUNE_OK ? r->median : INFINITY),
                            "times", times ? times : json_array(), "reps", (json_int_t)r->reps,
                            "build_s", r->build_s);
    if (res && r->error) json_object_set_new(res, "error", json_string(r->error));
    return res;
}

tj_status tj_tune_record_to_json(const tj_tune_record *r, char **out, tj_error *err)
{
    *out = NULL;
    json_error_t je;
    json_t *cfg = json_loads(r->config ? r->config : "{}", 0, &je);
    if (!cfg) return tj_fail(err, TJ_ERR_FORMAT, "config '%s': %s", r->config, je.text);
    char hash[24];
    snprintf(hash, sizeof hash, "%016" PRIx64, r->wl.pattern_hash);
    json_t *o = json_pack(
        "{s:s, s:i, s:{s:s, s:s, s:s, s:s, s:s}, s:{s:s, s:s, s:I, s:I, s:I, s:I, s:s, s:I}, s:o, s:o, s:s, s:s}",
        "format", TJ_TUNE_FORMAT, "version", TJ_TUNE_VERSION,
        "target", "backend", r->target.backend, "device", r->target.device, "arch", r->target.arch,
        "driver", r->target.driver, "compiler", r->target.compiler,
        "workload", "layer", r->wl.layer, "pattern_hash", hash, "n", (json_int_t)r->wl.n,
        "k", (json_int_t)r->wl.k, "g", (json_int_t)r->wl.g, "kept", (json_int_t)r->wl.kept,
        "dtype", r->wl.dtype[0] ? r->wl.dtype : "f32", "m", (json_int_t)r->wl.m,
        "config", cfg, "result", result_object(r), "tool", r->tool, "timestamp", r->timestamp);
    if (!o) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory (or a non-UTF-8 string) writing a record");
    *out = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    return *out ? TJ_OK : tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
}

static const char *str_at(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static int int_at(const json_t *o, const char *key, int64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return 0;
    *out = json_integer_value(v);
    return 1;
}

/* Fills the result fields of r from a "result" object (also the child's answer). */
static tj_status parse_result(const json_t *res, const char *what, tj_tune_record *r, tj_error *err)
{
    if (!json_is_object(res)) return tj_fail(err, TJ_ERR_FORMAT, "%s: 'result' is not an object", what);
    if (!tj_tune_status_parse(str_at(res, "status"), &r->status))
        return tj_fail(err, TJ_ERR_FORMAT, "%s: result.status '%s' is not one of ok, compile_error, launch_error, "
                       "wrong_result, timeout", what, str_at(res, "status") ? str_at(res, "status") : "(missing)");
    if (!cost_parse(json_object_get(res, "median"), &r->median))
        return tj_fail(err, TJ_ERR_FORMAT, "%s: result.median must be a number, \"inf\" or null", what);
    if (r->status != TJ_TUNE_OK) r->median = INFINITY;
    else if (!(r->median >= 0 && isfinite(r->median)))
        return tj_fail(err, TJ_ERR_FORMAT, "%s: an ok result needs a finite median", what);
    const json_t *times = json_object_get(res, "times");
    size_t nt = json_is_array(times) ? json_array_size(times) : 0;
    if (nt > TJ_TUNE_MAX_TIMES) nt = TJ_TUNE_MAX_TIMES;
    free(r->times);
    r->times = NULL;
    r->ntimes = 0;
    if (nt) {
        r->times = malloc(nt * sizeof *r->times);
        if (!r->times) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < nt; i++) r->times[i] = json_number_value(json_array_get(times, i));
        r->ntimes = (int)nt;
    }
    int64_t reps = r->ntimes;
    int_at(res, "reps", &reps);
    r->reps = reps;
    const json_t *b = json_object_get(res, "build_s");
    r->build_s = json_is_number(b) ? json_number_value(b) : 0;
    free(r->error);
    r->error = NULL;
    const char *e = str_at(res, "error");
    if (e && !(r->error = strdup(e))) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    return TJ_OK;
}

tj_status tj_tune_record_parse(const char *line, const char *what, tj_tune_record *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    if (!o) return tj_fail(err, TJ_ERR_FORMAT, "%s: %s (column %d)", what, je.text, je.column);
    tj_status s = TJ_OK;
    int64_t ver = 0;
    const char *fmt = str_at(o, "format");
    const json_t *t = json_object_get(o, "target"), *w = json_object_get(o, "workload");
    const json_t *cfg = json_object_get(o, "config");
    if (!json_is_object(o) || !fmt || strcmp(fmt, TJ_TUNE_FORMAT) != 0) {
        s = tj_fail(err, TJ_ERR_FORMAT, "%s: not a tuning record (format must be \"%s\")", what, TJ_TUNE_FORMAT);
        goto done;
    }
    if (!int_at(o, "version", &ver) || ver != TJ_TUNE_VERSION) {
        s = tj_fail(err, TJ_ERR_FORMAT, "%s: record version %lld is not supported (this tilejit reads %d)", what,
                    (long long)ver, TJ_TUNE_VERSION);
        goto done;
    }
    const char *kind = str_at(o, "kind");
    if (kind && strcmp(kind, "measurement") != 0) {
        s = tj_fail(err, TJ_ERR_FORMAT, "%s: a '%s' line, not a measurement", what, kind);
        goto done;
    }
    if (!json_is_object(t) || !json_is_object(w) || !json_is_object(cfg)) {
        s = tj_fail(err, TJ_ERR_FORMAT, "%s: 'target', 'workload' and 'config' must be objects", what);
        goto done;
    }
    if (!str_at(t, "backend") || !str_at(t, "device")) {
        s = tj_fail(err, TJ_ERR_FORMAT, "%s: target.backend and target.device are required", what);
        goto done;
    }
    copy_str(out->target.backend, sizeof out->target.backend, str_at(t, "backend"));
    copy_str(out->target.device, sizeof out->target.device, str_at(t, "device"));
    copy_str(out->target.arch, sizeof out->target.arch, str_at(t, "arch"));
    copy_str(out->target.driver, sizeof out->target.driver, str_at(t, "driver"));
    copy_str(out->target.compiler, sizeof out->target.compiler, str_at(t, "compiler"));
    const char *hash = str_at(w, "pattern_hash");
    char *end = NULL;
    if (hash) out->wl.pattern_hash = strtoull(hash, &end, 16);
    if (!hash || !*hash || *end || !int_at(w, "n", &out->wl.n) || !int_at(w, "k", &out->wl.k) ||
        !int_at(w, "g", &out->wl.g) || !int_at(w, "m", &out->wl.m) || out->wl.m < 1) {
        s = tj_fail(err, TJ_ERR_FORMAT, "%s: workload needs pattern_hash (hex), n, k, g and m >= 1", what);
        goto done;
    }
    int_at(w, "kept", &out->wl.kept);
    copy_str(out->wl.layer, sizeof out->wl.layer, str_at(w, "layer"));
    copy_str(out->wl.dtype, sizeof out->wl.dtype, str_at(w, "dtype") ? str_at(w, "dtype") : "f32");
    copy_str(out->tool, sizeof out->tool, str_at(o, "tool"));
    copy_str(out->timestamp, sizeof out->timestamp, str_at(o, "timestamp"));
    out->config = json_dumps(cfg, JSON_COMPACT | JSON_SORT_KEYS);
    if (!out->config) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    s = parse_result(json_object_get(o, "result"), what, out, err);
done:
    json_decref(o);
    if (s != TJ_OK) tj_tune_record_free(out);
    return s;
}

/* Writes n bytes (whole lines) to an O_APPEND descriptor, then fsyncs: one write(2) in
 * practice, so concurrent appenders on a local disk never interleave within a line. */
static tj_status write_lines(int fd, const char *path, const char *buf, size_t n, tj_error *err)
{
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, buf + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return tj_fail(err, TJ_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        off += (size_t)w;
    }
    if (fsync(fd) != 0 && errno != EINVAL) return tj_fail(err, TJ_ERR_IO, "%s: fsync failed: %s", path, strerror(errno));
    return TJ_OK;
}

tj_status tj_tune_log_append(const char *path, tj_tune_record *r, tj_error *err)
{
    fill_stamp(r);
    char *line = NULL;
    TJ_TRY(tj_tune_record_to_json(r, &line, err));
    size_t len = strlen(line);
    line[len] = '\n'; /* json_dumps leaves room: we overwrite the NUL and write len + 1 bytes */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    tj_status s = fd < 0 ? tj_fail(err, TJ_ERR_IO, "%s: cannot open for appending: %s", path, strerror(errno))
                         : write_lines(fd, path, line, len + 1, err);
    if (fd >= 0) close(fd);
    free(line);
    return s;
}

/* Whether a line is a tuning-log line of a kind other than a measurement (a header, or a kind
 * of a later version): readers skip those without counting them as malformed. */
static int other_kind(const char *line)
{
    json_t *o = json_loads(line, 0, NULL);
    const char *fmt = str_at(o, "format"), *kind = str_at(o, "kind");
    int r = fmt && strcmp(fmt, TJ_TUNE_FORMAT) == 0 && kind && strcmp(kind, "measurement") != 0;
    json_decref(o);
    return r;
}

/* The shard "I/N" a log's header names, into out (cap bytes); 0 when the file's first line is
 * no header (a log written before headers existed, or a missing or empty file). */
static int header_shard(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *line = NULL;
    size_t n = 0;
    int found = 0;
    if (getline(&line, &n, f) > 0) {
        json_t *o = json_loads(line, JSON_DISABLE_EOF_CHECK, NULL);
        const char *kind = str_at(o, "kind"), *shard = str_at(o, "shard");
        if (kind && strcmp(kind, "header") == 0 && shard) {
            copy_str(out, cap, shard);
            found = 1;
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    return found;
}

tj_status tj_tune_log_begin(const char *path, const char *backend, int shard, int nshards, tj_error *err)
{
    char want[32], have[32];
    snprintf(want, sizeof want, "%d/%d", shard, nshards);
    if (nshards > 1 && header_shard(path, have, sizeof have) && strcmp(have, want) != 0)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "%s was begun by shard %s, not %s: a resumed shard needs the same I/N (the original array size)",
                       path, have, want);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return tj_fail(err, TJ_ERR_IO, "%s: cannot open for appending: %s", path, strerror(errno));
    struct stat st;
    tj_status s = TJ_OK;
    char *text = NULL;
    if (fstat(fd, &st) != 0) {
        s = tj_fail(err, TJ_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto done;
    }
    if (st.st_size > 0) {
        /* resuming: the header, if any, is already there. A killed run may have left a torn last
         * line without its newline: end it, so it stays one malformed line instead of swallowing
         * the next record. */
        char last = '\n';
        int rfd = open(path, O_RDONLY | O_CLOEXEC);
        if (rfd >= 0) {
            if (pread(rfd, &last, 1, st.st_size - 1) != 1) last = '\n';
            close(rfd);
        }
        if (last != '\n') s = write_lines(fd, path, "\n", 1, err);
        goto done;
    }
    tj_tune_record stamp;
    memset(&stamp, 0, sizeof stamp);
    fill_stamp(&stamp);
    json_t *o = json_pack("{s:s, s:i, s:s, s:s, s:s, s:s, s:s}", "format", TJ_TUNE_FORMAT, "version", TJ_TUNE_VERSION,
                          "kind", "header", "shard", want, "backend", backend ? backend : "", "tool", stamp.tool,
                          "timestamp", stamp.timestamp);
    text = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    if (!text) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    size_t len = strlen(text);
    char *line = realloc(text, len + 2);
    if (!line) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto done;
    }
    text = line;
    text[len] = '\n';
    text[len + 1] = '\0';
    s = write_lines(fd, path, text, len + 1, err);
done:
    free(text);
    close(fd);
    return s;
}

tj_status tj_tune_log_read(const char *path, int missing_ok, tj_tune_record_fn fn, void *user,
                           int64_t *bad_lines, tj_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        if (missing_ok && errno == ENOENT) return TJ_OK;
        return tj_fail(err, TJ_ERR_IO, "%s: cannot open tuning log: %s", path, strerror(errno));
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int64_t lineno = 0;
    tj_status s = TJ_OK;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        size_t lead = strspn(line, " \t");
        if (line[lead] == '\0') continue;
        char what[512];
        snprintf(what, sizeof what, "%s:%lld", path, (long long)lineno);
        tj_tune_record r;
        tj_error perr;
        if (tj_tune_record_parse(line, what, &r, &perr) != TJ_OK) {
            if (bad_lines && !other_kind(line)) (*bad_lines)++;
            continue;
        }
        s = fn(user, &r, err);
        tj_tune_record_free(&r);
        if (s != TJ_OK) break;
    }
    if (s == TJ_OK && ferror(f)) s = tj_fail(err, TJ_ERR_IO, "%s: read error", path);
    free(line);
    fclose(f);
    return s;
}

void tj_tune_workload_of(const tj_layer *l, int64_t m, tj_tune_workload *out)
{
    memset(out, 0, sizeof *out);
    copy_str(out->layer, sizeof out->layer, l->name);
    out->pattern_hash = l->hash;
    out->n = l->n;
    out->k = l->k;
    out->g = l->g;
    out->kept = tj_layer_kept(l);
    copy_str(out->dtype, sizeof out->dtype, "f32");
    out->m = m;
}

static tj_tune_target host_cache;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static void detect_host(tj_tune_target *out);
static void detect_host_once(void) { detect_host(&host_cache); }

/* Detected once per process: every layer load asks. */
void tj_tune_host_target(tj_tune_target *out)
{
    pthread_once(&host_once, detect_host_once);
    *out = host_cache;
}

static void detect_host(tj_tune_target *out)
{
    memset(out, 0, sizeof *out);
    copy_str(out->backend, sizeof out->backend, "cpu");
    copy_str(out->device, sizeof out->device, "unknown CPU");
    int avx512 = 0, avx2 = 0, neon = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[8192];
        int have_name = 0, have_flags = 0;
        while (fgets(line, sizeof line, f) && !(have_name && have_flags)) {
            char *colon = strchr(line, ':');
            if (!colon) continue;
            char *v = colon + 1 + strspn(colon + 1, " \t");
            v[strcspn(v, "\n")] = '\0';
            if (!have_name && strncmp(line, "model name", 10) == 0) {
                copy_str(out->device, sizeof out->device, v);
                have_name = 1;
            } else if (!have_flags && (strncmp(line, "flags", 5) == 0 || strncmp(line, "Features", 8) == 0)) {
                avx512 = strstr(v, "avx512f") != NULL;
                avx2 = strstr(v, "avx2") != NULL;
                neon = strstr(v, "asimd") != NULL;
                have_flags = 1;
            }
        }
        fclose(f);
    }
    struct utsname u;
    const char *mach = uname(&u) == 0 ? u.machine : "unknown";
    char arch[sizeof u.machine + 16];
    snprintf(arch, sizeof arch, "%.40s%s", mach, avx512 ? "-avx512" : avx2 ? "-avx2" : neon ? "-neon" : "");
    copy_str(out->arch, sizeof out->arch, arch);
#if TJ_HAVE_LLVM
    /* the name backend_cpu.c asks tj_context_config_for with: LLVM's host CPU (microarchitecture) */
    copy_str(out->device, sizeof out->device, tj_host_cpu_name());
    unsigned ma = 0, mi = 0, pa = 0;
    LLVMGetVersion(&ma, &mi, &pa);
    snprintf(out->compiler, sizeof out->compiler, "LLVM %u.%u.%u", ma, mi, pa);
#else
    copy_str(out->compiler, sizeof out->compiler, "none");
#endif
}

/* --- the measuring child's answer: just the result object ------------------------------ */

char *tj_tune_result_to_json(const tj_tune_record *r)
{
    json_t *o = result_object(r);
    if (!o) return NULL;
    char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    json_decref(o);
    return s;
}

tj_status tj_tune_result_parse(const char *text, tj_tune_record *r, tj_error *err)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je);
    if (!o) return tj_fail(err, TJ_ERR_FORMAT, "measuring child: unreadable answer (%s)", je.text);
    tj_status s = parse_result(o, "measuring child", r, err);
    json_decref(o);
    return s;
}
