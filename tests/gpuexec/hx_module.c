/* Host executor modules: the exact source NVRTC compiles, built as host C++ against
 * templates/host/cuda_host.h into a shared library (cached by a hash of everything that goes into
 * it), loaded, and symbolized when a report needs a source line. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jit/cache.h"
#include "hx_internal.h"

extern char **environ;

/* Flags of every module build; part of the cache key. -fsanitize=thread without its run-time
 * library instruments each load and store with a call to the hooks of cuda_host.h. No
 * vectorizers: the host compiler must not merge accesses into wider ones the GPU would not make
 * (alignment is checked per access). -O0: a third of -O1's compile time (0.13 s against 0.39 s
 * user for a 500-line layer) for kernels that run as fast here (the executor's switches dominate). */
static const char *const hx_flags[] = {
    "-x", "c++", "-std=c++17", "-O0", "-gline-tables-only", "-fPIC", "-shared", "-fno-exceptions", "-fno-rtti",
    "-fsanitize=thread", "-mllvm", "-tsan-instrument-func-entry-exit=0", "-fno-vectorize", "-fno-slp-vectorize",
    "-Wno-pass-failed", "-Werror=ignored-attributes", "-Wl,-z,defs",
};
#define HX_NFLAGS ((int)(sizeof hx_flags / sizeof *hx_flags))

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = nb;
        }
        size_t r = fread(buf + n, 1, 4096, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

static int write_file(const char *path, const char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(data, 1, n, f) == n;
    ok &= fclose(f) == 0;
    return ok ? 0 : -1;
}

/* The names of `extern __shared__ ... name[]` declarations, each linked to tj_hx_dynamic_smem. */
static int extern_shared_names(const char *src, char names[][64], int max)
{
    int n = 0;
    for (const char *p = src; (p = strstr(p, "extern __shared__")) != NULL; p++) {
        const char *semi = strchr(p, ';');
        if (!semi) break;
        const char *br = NULL;
        for (const char *q = p; q < semi; q++)
            if (*q == '[') br = q;
        if (!br) continue;
        const char *e = br;
        while (e > p && e[-1] == ' ') e--;
        const char *s = e;
        while (s > p && (s[-1] == '_' || (s[-1] >= 'a' && s[-1] <= 'z') || (s[-1] >= 'A' && s[-1] <= 'Z') ||
                         (s[-1] >= '0' && s[-1] <= '9')))
            s--;
        if (e > s && e - s < 64 && n < max) {
            int dup = 0;
            for (int i = 0; i < n; i++) dup |= strncmp(names[i], s, (size_t)(e - s)) == 0 && names[i][e - s] == '\0';
            if (!dup) {
                memcpy(names[n], s, (size_t)(e - s));
                names[n][e - s] = '\0';
                n++;
            }
        }
    }
    return n;
}

static int run_compiler(char *const argv[], const char *log_path)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -1000 - rc;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -2;
}

typedef struct image_query {
    uintptr_t base, lo, hi;
} image_query;

static int image_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    image_query *q = data;
    if (info->dlpi_addr != q->base) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t lo = q->base + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (!q->lo || lo < q->lo) q->lo = lo;
        if (hi > q->hi) q->hi = hi;
    }
    return 1;
}

static tj_status load(tj_hx_module *m, tj_error *err)
{
    m->dl = dlopen(m->so_path, RTLD_NOW | RTLD_LOCAL);
    if (!m->dl) return tj_fail(err, TJ_ERR_COMPILE, "host executor: dlopen %s: %s", m->so_path, dlerror());
    m->bind = (int (*)(const tj_hx_api *))dlsym(m->dl, "tj_hx_module_bind");
    m->bi = dlsym(m->dl, "tj_hx_bi");
    m->smem = dlsym(m->dl, "tj_hx_dynamic_smem");
    if (!m->bind || !m->bi || !m->smem)
        return tj_fail(err, TJ_ERR_COMPILE, "host executor: %s lacks the cuda_host.h entry points", m->so_path);
    struct link_map *lm = NULL;
    if (dlinfo(m->dl, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
        return tj_fail(err, TJ_ERR_INTERNAL, "host executor: dlinfo %s: %s", m->so_path, dlerror());
    image_query q = {lm->l_addr, 0, 0};
    dl_iterate_phdr(image_cb, &q);
    if (!q.hi) return tj_fail(err, TJ_ERR_INTERNAL, "host executor: no segments found for %s", m->so_path);
    m->base = q.base;
    m->image_lo = q.lo;
    m->image_hi = q.hi;
    return TJ_OK;
}

tj_status tj_hx_module_build(const tj_hx_build_options *o, const char *source, tj_hx_module **out, int *compiled,
                             tj_error *err)
{
    *out = NULL;
    if (compiled) *compiled = 0;
    tj_hx_build_options d = {0};
    if (o) d = *o;
    if (!d.cxx) d.cxx = getenv("TJ_HX_CXX");
    if (!d.cxx || !*d.cxx) d.cxx = "clang++-19";
    if (!d.host_dir) d.host_dir = getenv("TJ_HX_HOST_DIR");
    if (!d.cache_dir) d.cache_dir = getenv("TJ_HX_CACHE_DIR");
    if (!d.cache_dir || !*d.cache_dir) d.cache_dir = "/tmp";
    if (!d.host_dir || !*d.host_dir)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "host executor: templates/host not given (TJ_HX_HOST_DIR)");

    tj_status st = TJ_OK;
    char header[4096], api[4096], log_path[4200], tmp_so[4200];
    char *htext = NULL, *atext = NULL, *log = NULL;
    char **argv = NULL;
    tj_hx_module *m = calloc(1, sizeof *m);
    if (!m) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: out of memory");
    snprintf(header, sizeof header, "%s/cuda_host.h", d.host_dir);
    snprintf(api, sizeof api, "%s/hx_api.h", d.host_dir);
    size_t hlen = 0, alen = 0;
    htext = read_file(header, &hlen);
    atext = read_file(api, &alen);
    if (!htext || !atext) {
        st = tj_fail(err, TJ_ERR_IO, "host executor: cannot read %s or %s", header, api);
        goto fail;
    }
    mkdir(d.cache_dir, 0755);

    /* The key: everything that goes into the library. */
    tj_sha256 sh;
    tj_sha256_init(&sh);
    tj_sha256_update(&sh, "tilejit-hx-1", 13);
    tj_sha256_update(&sh, d.cxx, strlen(d.cxx) + 1);
    for (int i = 0; i < HX_NFLAGS; i++) tj_sha256_update(&sh, hx_flags[i], strlen(hx_flags[i]) + 1);
    tj_sha256_update(&sh, htext, hlen + 1);
    tj_sha256_update(&sh, atext, alen + 1);
    tj_sha256_update(&sh, source, strlen(source));
    uint8_t digest[32];
    tj_sha256_final(&sh, digest);
    char hex[33];
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    size_t plen = strlen(d.cache_dir) + 64;
    m->so_path = malloc(plen);
    m->cu_path = malloc(plen);
    m->source = strdup(source);
    if (!m->so_path || !m->cu_path || !m->source) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: out of memory");
        goto fail;
    }
    snprintf(m->so_path, plen, "%s/hx-%s.so", d.cache_dir, hex);
    snprintf(m->cu_path, plen, "%s/hx-%s.cu", d.cache_dir, hex);

    struct stat sb;
    if (stat(m->so_path, &sb) != 0 || stat(m->cu_path, &sb) != 0) {
        /* Compile into a private name, then rename: concurrent tests may build the same module. */
        if (write_file(m->cu_path, source, strlen(source)) != 0) {
            st = tj_fail(err, TJ_ERR_IO, "host executor: cannot write %s: %s", m->cu_path, strerror(errno));
            goto fail;
        }
        snprintf(tmp_so, sizeof tmp_so, "%s/hx-%s.%ld.so.tmp", d.cache_dir, hex, (long)getpid());
        snprintf(log_path, sizeof log_path, "%s/hx-%s.%ld.log", d.cache_dir, hex, (long)getpid());
        char names[8][64], defsym[8][640];
        int nn = extern_shared_names(source, names, 8);
        char inc[4200], incdir[4200];
        snprintf(inc, sizeof inc, "%s", header);
        snprintf(incdir, sizeof incdir, "-I%s", d.host_dir);
        argv = calloc((size_t)(HX_NFLAGS + nn + 16), sizeof *argv);
        if (!argv) {
            st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "host executor: out of memory");
            goto fail;
        }
        int a = 0;
        argv[a++] = (char *)d.cxx;
        for (int i = 0; i < HX_NFLAGS; i++) argv[a++] = (char *)hx_flags[i];
        argv[a++] = "-include";
        argv[a++] = inc;
        argv[a++] = incdir;
        for (int i = 0; i < nn; i++) {
            snprintf(defsym[i], sizeof defsym[i], "-Wl,--defsym=%s=tj_hx_dynamic_smem", names[i]);
            argv[a++] = defsym[i];
        }
        argv[a++] = "-o";
        argv[a++] = tmp_so;
        argv[a++] = m->cu_path;
        argv[a++] = "-lm";
        argv[a] = NULL;
        int rc = run_compiler(argv, log_path);
        if (rc != 0) {
            log = read_file(log_path, NULL);
            st = tj_fail(err, TJ_ERR_COMPILE, "host executor: %s failed (%d) on %s:\n%.3000s", d.cxx, rc, m->cu_path,
                         log ? log : "(no log)");
            unlink(tmp_so);
            unlink(log_path);
            goto fail;
        }
        unlink(log_path);
        if (rename(tmp_so, m->so_path) != 0) {
            st = tj_fail(err, TJ_ERR_IO, "host executor: rename to %s: %s", m->so_path, strerror(errno));
            unlink(tmp_so);
            goto fail;
        }
        if (compiled) *compiled = 1;
    }
    if ((st = load(m, err))) goto fail;
    *out = m;
    m = NULL;
fail:
    free(argv);
    free(log);
    free(htext);
    free(atext);
    tj_hx_module_destroy(m);
    return st;
}

void tj_hx_module_destroy(tj_hx_module *m)
{
    if (!m) return;
    if (m->dl) dlclose(m->dl);
    free(m->so_path);
    free(m->cu_path);
    free(m->source);
    free(m);
}

void (*tj_hx_module_kernel(const tj_hx_module *m, const char *name))(void)
{
    void *p = dlsym(m->dl, name);
    void (*fn)(void);
    memcpy(&fn, &p, sizeof fn);
    return p ? fn : NULL;
}

/* ---- symbolization (reports only) ---- */

void hx_module_symbolize(const tj_hx_module *m, const uintptr_t *pcs, int n, char **out)
{
    for (int i = 0; i < n; i++) out[i] = NULL;
    const char *sym = getenv("TJ_HX_SYMBOLIZER");
    if (!sym || !*sym) sym = "llvm-symbolizer-19";
    size_t cap = 256 + strlen(sym) + strlen(m->so_path) + (size_t)n * 24;
    char *cmd = malloc(cap);
    if (!cmd) return;
    int k = snprintf(cmd, cap, "'%s' --inlining --functions=short --obj='%s'", sym, m->so_path);
    for (int i = 0; i < n; i++) k += snprintf(cmd + k, cap - (size_t)k, " 0x%lx", (unsigned long)(pcs[i] - m->base - 1));
    snprintf(cmd + k, cap - (size_t)k, " 2>/dev/null");
    FILE *p = popen(cmd, "r");
    free(cmd);
    char line[1024], acc[2048];
    int idx = 0, nframe = 0;
    acc[0] = '\0';
    char func[1024] = "";
    while (p && idx < n && fgets(line, sizeof line, p)) {
        line[strcspn(line, "\n")] = '\0';
        if (!line[0]) { /* end of one address */
            out[idx++] = strdup(acc);
            acc[0] = '\0';
            nframe = 0;
            func[0] = '\0';
            continue;
        }
        if (!func[0] && !strchr(line, ':')) {
            snprintf(func, sizeof func, "%s", line);
            continue;
        }
        /* file:line:col; keep the file's base name */
        const char *file = strrchr(line, '/');
        file = file ? file + 1 : line;
        size_t used = strlen(acc);
        snprintf(acc + used, sizeof acc - used, "%s%s %s", nframe ? " <- " : "", func[0] ? func : "?", file);
        nframe++;
        func[0] = '\0';
    }
    if (p) pclose(p);
    for (int i = 0; i < n; i++)
        if (!out[i]) {
            char buf[32];
            snprintf(buf, sizeof buf, "+0x%lx", (unsigned long)(pcs[i] - m->base));
            out[i] = strdup(buf);
        }
}
