/* NVRTC → CUBIN: options for a real sm_XX, the CUDA include directory found at run time, the
 * cache lookup/store around each compile, ptxas -v parsing, dumps, and a parallel build. NVRTC is
 * thread-safe, so jobs run on plain pthreads. Called by the CUDA backend and `tilejit compile`. */
#include "jit/nvrtc.h"

#include <ctype.h>
#include <errno.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gen/emit_cuda.h"
#include "base/clock.h"
#include "tj_config.h"

/* Wraps every NVRTC call once: keeps the call, file, line and NVRTC's own message. */
#define TJ_TRY_NVRTC(call)                                                                      \
    do {                                                                                        \
        nvrtcResult r_ = (call);                                                                \
        if (r_ != NVRTC_SUCCESS) {                                                              \
            st = tj_fail(err, TJ_ERR_COMPILE, "%s:%d: %s: %s", __FILE__, __LINE__, #call,        \
                         nvrtcGetErrorString(r_));                                              \
            goto fail;                                                                          \
        }                                                                                       \
    } while (0)


void tj_cubin_free(tj_cubin *b)
{
    if (!b) return;
    free(b->data);
    free(b->log);
    memset(b, 0, sizeof *b);
}

tj_status tj_nvrtc_version(int *major, int *minor, tj_error *err)
{
    tj_status st = TJ_OK;
    TJ_TRY_NVRTC(nvrtcVersion(major, minor));
fail:
    return st;
}

static int is_dir(const char *p)
{
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

static pthread_once_t inc_once = PTHREAD_ONCE_INIT;
static char inc_dir[4096];

static void find_include(void)
{
    const char *home = getenv("CUDA_HOME");
    char buf[4096];
    if (home && *home) {
        snprintf(buf, sizeof buf, "%s/include", home);
        if (is_dir(buf)) { memcpy(inc_dir, buf, sizeof inc_dir); return; }
    }
    snprintf(buf, sizeof buf, "%s/include", TJ_CUDA_HOME);
    if (is_dir(buf)) memcpy(inc_dir, buf, sizeof inc_dir);
}

const char *tj_cuda_include_dir(void)
{
    pthread_once(&inc_once, find_include);
    return inc_dir[0] ? inc_dir : NULL;
}

int tj_nvrtc_options(int sm, char opts[TJ_NVRTC_MAX_OPTS][512])
{
    int n = 0;
    char arch[16];
    snprintf(opts[n++], 512, "--gpu-architecture=%s", tj_cuda_arch_name(sm, arch));
    snprintf(opts[n++], 512, "--std=c++17");
    snprintf(opts[n++], 512, "--ptxas-options=-v");
    /* The templates include no headers today; the directory is there for ones that will. */
    const char *inc = tj_cuda_include_dir();
    if (inc) snprintf(opts[n++], 512, "-I%.509s", inc); /* longer paths never fit the option */
    return n;
}

/* ---- ptxas -v report ---- */

static tj_kernel_resources *kernel_named(tj_cubin *b, const char *name, size_t len)
{
    for (int i = 0; i < b->nkernels; i++)
        if (strlen(b->kernels[i].name) == len && strncmp(b->kernels[i].name, name, len) == 0) return &b->kernels[i];
    return NULL;
}

void tj_ptxas_parse(const char *log, tj_cubin *b)
{
    b->nkernels = 0;
    b->spill_bytes = 0;
    tj_kernel_resources *cur = NULL; /* the entry whose "Used N registers" line comes next */
    tj_kernel_resources *props = NULL;
    int props_entry = 0;
    for (const char *line = log; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[1024];
        size_t n = len < sizeof buf - 1 ? len : sizeof buf - 1;
        memcpy(buf, line, n);
        buf[n] = '\0';
        const char *p;
        if ((p = strstr(buf, "Compiling entry function '")) != NULL) {
            p += strlen("Compiling entry function '");
            const char *q = strchr(p, '\'');
            size_t nl = q ? (size_t)(q - p) : strlen(p);
            cur = kernel_named(b, p, nl);
            if (!cur && b->nkernels < TJ_MAX_KERNELS) {
                cur = &b->kernels[b->nkernels++];
                memset(cur, 0, sizeof *cur);
                snprintf(cur->name, sizeof cur->name, "%.*s", (int)nl, p);
            }
        } else if ((p = strstr(buf, "Function properties for ")) != NULL) {
            p += strlen("Function properties for ");
            size_t nl = strcspn(p, " \r");
            props = kernel_named(b, p, nl);
            props_entry = props != NULL;
        } else if (strstr(buf, "bytes stack frame")) {
            long long stack = 0, sst = 0, sld = 0;
            if (sscanf(buf, " %lld bytes stack frame, %lld bytes spill stores, %lld bytes spill loads", &stack, &sst,
                       &sld) == 3) {
                b->spill_bytes += sst + sld;
                if (props_entry && props) {
                    props->stack = stack;
                    props->spill_stores = sst;
                    props->spill_loads = sld;
                }
            }
            props = NULL;
            props_entry = 0;
        } else if ((p = strstr(buf, "Used ")) != NULL && strstr(buf, "registers")) {
            int regs = 0;
            if (sscanf(p, "Used %d registers", &regs) == 1 && cur) {
                cur->registers = regs;
                const char *s = strstr(buf, "bytes smem");
                if (s) {
                    const char *q = s;
                    while (q > buf && (isdigit((unsigned char)q[-1]) || q[-1] == ' ')) q--;
                    cur->smem_static = atoll(q);
                }
                cur = NULL;
            }
        }
        line = end ? end + 1 : NULL;
    }
}

/* ---- dumps ---- */

static void dump_file(const char *dir, const char *base, const char *ext, const char *text, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s%s", dir, base, ext);
    FILE *f = fopen(path, "wb");
    if (!f) return; /* best effort: dumps are a debugging aid */
    fwrite(text, 1, len, f);
    fclose(f);
}

static void dump_unit(const char *label, int sm, const char *source, char opts[][512], int nopts, const char *log)
{
    const char *dir = getenv("TILEJIT_DUMP_DIR");
    if (!dir || !*dir) return;
    mkdir(dir, 0755);
    char base[300];
    size_t j = 0;
    for (const char *p = label ? label : "unit"; *p && j < 200; p++)
        base[j++] = isalnum((unsigned char)*p) || *p == '.' || *p == '-' || *p == '_' ? *p : '_';
    char arch[16];
    snprintf(base + j, sizeof base - j, ".%s", tj_cuda_arch_name(sm, arch));
    if (source) dump_file(dir, base, ".cu", source, strlen(source));
    char o[TJ_NVRTC_MAX_OPTS * 513];
    size_t ol = 0;
    for (int i = 0; i < nopts; i++) ol += (size_t)snprintf(o + ol, sizeof o - ol, "%s\n", opts[i]);
    dump_file(dir, base, ".options", o, ol);
    if (log) dump_file(dir, base, ".log", log, strlen(log));
}

/* ---- cache payload: "TJCB" | u64 cubin size | cubin | u64 log size | log ---- */

static void *payload_pack(const tj_cubin *b, size_t *len)
{
    size_t ll = b->log ? strlen(b->log) : 0;
    *len = 4 + 8 + b->size + 8 + ll;
    uint8_t *p = malloc(*len);
    if (!p) return NULL;
    memcpy(p, "TJCB", 4);
    uint64_t v = b->size;
    memcpy(p + 4, &v, 8);
    memcpy(p + 12, b->data, b->size);
    v = ll;
    memcpy(p + 12 + b->size, &v, 8);
    if (ll) memcpy(p + 20 + b->size, b->log, ll);
    return p;
}

static int payload_unpack(const uint8_t *p, size_t len, tj_cubin *b)
{
    uint64_t cs, ls;
    if (len < 20 || memcmp(p, "TJCB", 4) != 0) return 0;
    memcpy(&cs, p + 4, 8);
    if (cs > len - 20) return 0;
    memcpy(&ls, p + 12 + cs, 8);
    if (ls != len - 20 - cs) return 0;
    b->data = malloc(cs ? cs : 1);
    b->log = malloc(ls + 1);
    if (!b->data || !b->log) return -1;
    memcpy(b->data, p + 12, cs);
    b->size = cs;
    memcpy(b->log, p + 20 + cs, ls);
    b->log[ls] = '\0';
    return 1;
}

static void build_key(tj_cache_key *k, const char *source, int sm, char opts[][512], int nopts)
{
    int maj = 0, min = 0;
    nvrtcVersion(&maj, &min);
    char buf[64];
    tj_cache_key_begin(k);
    tj_cache_key_add_str(k, TJ_CUDA_GEN_VERSION);
    snprintf(buf, sizeof buf, "nvrtc %d.%d", maj, min);
    tj_cache_key_add_str(k, buf);
    tj_cache_key_add_str(k, tj_cuda_arch_name(sm, buf)); /* the exact arch string: sm_90 and sm_90a differ */
    for (int i = 0; i < nopts; i++) tj_cache_key_add_str(k, opts[i]);
    tj_cache_key_add_str(k, source);
    tj_cache_key_end(k);
}

static tj_status compile_now(const char *source, const char *label, int sm, char opts[][512], int nopts,
                             tj_cubin *out, tj_error *err)
{
    tj_status st = TJ_OK;
    nvrtcProgram prog = NULL;
    const char *optv[TJ_NVRTC_MAX_OPTS];
    for (int i = 0; i < nopts; i++) optv[i] = opts[i];
    TJ_TRY_NVRTC(nvrtcCreateProgram(&prog, source, label ? label : "tilejit.cu", 0, NULL, NULL));
    nvrtcResult cr = nvrtcCompileProgram(prog, nopts, optv);
    size_t loglen = 0;
    TJ_TRY_NVRTC(nvrtcGetProgramLogSize(prog, &loglen));
    out->log = malloc(loglen + 1);
    if (!out->log) { st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory reading the NVRTC log"); goto fail; }
    out->log[0] = '\0';
    if (loglen) TJ_TRY_NVRTC(nvrtcGetProgramLog(prog, out->log));
    out->log[loglen] = '\0';
    dump_unit(label, sm, source, opts, nopts, out->log);
    if (cr != NVRTC_SUCCESS) {
        /* The whole log when it fits the error message; otherwise its head and where to find all. */
        size_t room = TJ_ERROR_MSG_MAX - 400, len = strlen(out->log);
        char arch[16];
        tj_cuda_arch_name(sm, arch);
        if (len <= room)
            st = tj_fail(err, TJ_ERR_COMPILE, "%s:%d: nvrtcCompileProgram(%s, %s): %s\n%s", __FILE__, __LINE__,
                         label ? label : "unit", arch, nvrtcGetErrorString(cr), out->log);
        else
            st = tj_fail(err, TJ_ERR_COMPILE,
                         "%s:%d: nvrtcCompileProgram(%s, %s): %s\n%.*s\n[log truncated at %zu of %zu bytes; "
                         "TILEJIT_DUMP_DIR=DIR writes it whole with the source]",
                         __FILE__, __LINE__, label ? label : "unit", arch, nvrtcGetErrorString(cr), (int)room, out->log,
                         room, len);
        goto fail;
    }
    TJ_TRY_NVRTC(nvrtcGetCUBINSize(prog, &out->size));
    out->data = malloc(out->size ? out->size : 1);
    if (!out->data) { st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory reading the CUBIN"); goto fail; }
    TJ_TRY_NVRTC(nvrtcGetCUBIN(prog, out->data));
fail:
    if (prog) nvrtcDestroyProgram(&prog);
    return st;
}

tj_status tj_nvrtc_compile(tj_cache *cache, const char *source, const char *label, int sm, tj_cubin *out,
                           tj_error *err)
{
    memset(out, 0, sizeof *out);
    double t0 = tj_now();
    if ((sm & 0xffff) < 50 || (sm & 0xffff) > 200 || (sm & ~(0xffff | TJ_CUDA_SM_ARCH_SPECIFIC)))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "invalid CUDA arch %d", sm);
    char opts[TJ_NVRTC_MAX_OPTS][512];
    int nopts = tj_nvrtc_options(sm, opts);
    tj_cache_key key;
    build_key(&key, source, sm, opts, nopts);
    void *blob = NULL;
    size_t len = 0;
    tj_status st = tj_cache_lookup(cache, &key, &blob, &len, &out->cache, err);
    if (st) return st;
    if (out->cache == TJ_CACHE_HIT) {
        int u = payload_unpack(blob, len, out);
        free(blob);
        if (u > 0) {
            dump_unit(label, sm, source, opts, nopts, out->log); /* the log of the compile that made it */
            tj_ptxas_parse(out->log, out);
            out->seconds = tj_now() - t0;
            return TJ_OK;
        }
        tj_cubin_free(out);
        if (u < 0) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory reading a cached CUBIN");
        out->cache = TJ_CACHE_DISCARDED; /* checksummed but not ours: rebuild over it */
    }
    tj_cache_result res = out->cache;
    st = compile_now(source, label, sm, opts, nopts, out, err);
    if (st) {
        tj_cubin_free(out);
        return st;
    }
    out->cache = res;
    tj_ptxas_parse(out->log, out);
    size_t plen;
    void *payload = payload_pack(out, &plen);
    if (payload) {
        tj_cache_store(cache, &key, payload, plen, err);
        free(payload);
    }
    out->seconds = tj_now() - t0;
    return TJ_OK;
}

/* ---- parallel build ---- */

typedef struct pool {
    tj_cache *cache;
    tj_nvrtc_job *jobs;
    int64_t njobs;
    int64_t next; /* atomic */
} pool;

static void *worker(void *arg)
{
    pool *p = arg;
    for (;;) {
        int64_t i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (i >= p->njobs) break;
        tj_nvrtc_job *j = &p->jobs[i];
        tj_error_clear(&j->error);
        j->status = tj_nvrtc_compile(p->cache, j->source, j->label, j->sm, &j->result, &j->error);
    }
    return NULL;
}

tj_status tj_nvrtc_compile_all(tj_cache *cache, tj_nvrtc_job *jobs, int64_t njobs, int threads, tj_error *err)
{
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    if (threads > njobs) threads = (int)(njobs > 0 ? njobs : 1);
    if (threads > 64) threads = 64;
    pool p = {cache, jobs, njobs, 0};
    pthread_t tid[64];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&tid[started], NULL, worker, &p) != 0) break;
        started++;
    }
    worker(&p); /* the caller's thread works too; fewer threads started is only slower */
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    for (int64_t i = 0; i < njobs; i++)
        if (jobs[i].status != TJ_OK) {
            if (err) *err = jobs[i].error;
            return jobs[i].status;
        }
    return TJ_OK;
}
