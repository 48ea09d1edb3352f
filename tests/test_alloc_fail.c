/* Allocation-failure injection (issue 8): model load (pattern parse + validation, safetensors,
 * weight binding, the backend's load) with the i-th allocation failing, for every i up to the
 * number a successful load makes; then with every allocation from the i-th on failing. Each run
 * must end in TJ_OK or a clean error with a message, and leave no allocation behind (counted by
 * the wrappers below; ASan and valgrind see the same runs).
 *
 * Linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=strdup,--wrap=strndup
 * so the static library's calls come here; Jansson (a shared library) is routed here through
 * json_set_alloc_funcs. Allocations inside libc (fopen's buffer) are not injected. */
#include <dlfcn.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "rel_common.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t a, size_t b);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);

static atomic_long seq;      /* allocations attempted since arm() */
static atomic_long live;     /* our allocations not yet freed */
static long fail_at = -1;    /* the seq number that fails; -1: none */
static int fail_rest;        /* 1: every allocation from fail_at on fails */
static atomic_int injected;  /* whether a failure was injected in this run */
static atomic_long foreign_frees; /* frees of pointers another allocator made (LLVM, libc) */

/* The live pointers this wrapper handed out (open addressing, tombstones), so that freeing a
 * pointer some other allocator made (a string from LLVM or libc) does not count as ours. */
#define SLOTS (1u << 20)
#define TOMB ((uintptr_t)1)
static uintptr_t slots[SLOTS];
static void *callers[SLOTS]; /* who made each live allocation (for the leak report) */
static atomic_flag slots_lock = ATOMIC_FLAG_INIT;

static size_t slot_hash(uintptr_t p) { return (size_t)((p >> 4) * 0x9e3779b97f4a7c15ull >> 44) & (SLOTS - 1); }

static void track(void *ptr, void *caller)
{
    uintptr_t p = (uintptr_t)ptr;
    while (atomic_flag_test_and_set(&slots_lock)) {}
    for (size_t i = slot_hash(p);; i = (i + 1) & (SLOTS - 1))
        if (slots[i] == 0 || slots[i] == TOMB) {
            slots[i] = p;
            callers[i] = caller;
            break;
        }
    atomic_flag_clear(&slots_lock);
    atomic_fetch_add(&live, 1);
}

static int untrack(void *ptr)
{
    uintptr_t p = (uintptr_t)ptr;
    int found = 0;
    while (atomic_flag_test_and_set(&slots_lock)) {}
    for (size_t i = slot_hash(p); slots[i] != 0; i = (i + 1) & (SLOTS - 1))
        if (slots[i] == p) {
            slots[i] = TOMB;
            found = 1;
            break;
        }
    atomic_flag_clear(&slots_lock);
    if (found) atomic_fetch_sub(&live, 1);
    else atomic_fetch_add(&foreign_frees, 1);
    return found;
}

/* Prints where the allocations that are live now but were not in `before` came from, as
 * offsets for addr2line -e <binary>. */
static uintptr_t *snapshot(void)
{
    uintptr_t *copy = __real_malloc(sizeof slots);
    while (atomic_flag_test_and_set(&slots_lock)) {}
    memcpy(copy, slots, sizeof slots);
    atomic_flag_clear(&slots_lock);
    return copy;
}

static void report_new(const uintptr_t *before)
{
    int shown = 0;
    for (size_t i = 0; i < SLOTS && shown < 8; i++)
        if (slots[i] > TOMB && slots[i] != before[i]) {
            Dl_info info;
            uintptr_t a = (uintptr_t)callers[i], base = 0;
            if (dladdr(callers[i], &info) && info.dli_fbase) base = (uintptr_t)info.dli_fbase;
            fprintf(stderr, "  leaked: allocated from %s+0x%lx\n", base ? info.dli_fname : "?", (unsigned long)(a - base));
            shown++;
        }
}

static int should_fail(void)
{
    long s = atomic_fetch_add(&seq, 1);
    if (fail_at >= 0 && (s == fail_at || (fail_rest && s > fail_at))) {
        atomic_store(&injected, 1);
        return 1;
    }
    return 0;
}

void *__wrap_malloc(size_t n)
{
    if (should_fail()) return NULL;
    void *p = __real_malloc(n);
    if (p) track(p, __builtin_return_address(0));
    return p;
}

void *__wrap_calloc(size_t a, size_t b)
{
    if (should_fail()) return NULL;
    void *p = __real_calloc(a, b);
    if (p) track(p, __builtin_return_address(0));
    return p;
}

void *__wrap_realloc(void *p, size_t n)
{
    if (should_fail()) return NULL;
    void *q = __real_realloc(p, n);
    if (q) {
        if (p) untrack(p);
        track(q, __builtin_return_address(0));
    }
    return q;
}

void __wrap_free(void *p)
{
    if (p) untrack(p);
    __real_free(p);
}

char *__wrap_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    if (should_fail()) return NULL;
    char *p = __real_malloc(n);
    if (p) track(p, __builtin_return_address(0));
    if (p) memcpy(p, s, n);
    return p;
}

char *__wrap_strndup(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    if (should_fail()) return NULL;
    char *p = __real_malloc(len + 1);
    if (p) track(p, __builtin_return_address(0));
    if (p) {
        memcpy(p, s, len);
        p[len] = '\0';
    }
    return p;
}

static void arm(long at, int rest)
{
    atomic_store(&seq, 0);
    atomic_store(&injected, 0);
    fail_rest = rest;
    fail_at = at;
}

static void disarm(void) { fail_at = -1; }

/* One load (and destroy) under the current injection. Returns the number of allocations made. */
static int balance_checked = 1; /* 0 for the first load: it creates per-context state (thread pool) */

static long one_load(tj_context *ctx, const char *pat, const char *wts, long at, int rest, int *ok_out)
{
    long before = atomic_load(&live);
    uintptr_t *snap = snapshot();
    tj_model *m = NULL;
    arm(at, rest);
    tj_status s = tj_model_load(ctx, pat, wts, &m);
    long used = atomic_load(&seq);
    int inj = atomic_load(&injected);
    if (s == TJ_OK) {
        /* A load that survived an injected failure (a fallback) must still compute. */
        tj_layer_info info;
        CHECK(tj_model_layer_info(m, 0, &info) == TJ_OK);
        float x[2 * 64], y[2 * 96];
        int64_t xs[2] = {2, info.k}, ys[2] = {2, info.n};
        for (int i = 0; i < 2 * 64; i++) x[i] = (float)(i % 5) - 2;
        DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
        DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
        disarm();
        CHECKF(info.k <= 64 && info.n <= 96 && tj_linear_ex(m, 0, &xt, &yt, TJ_LAYOUT_ROW_MAJOR, NULL) == TJ_OK,
               "allocation %ld failed but the loaded model does not run: %s", at, tj_context_error(ctx));
        tj_model_destroy(m);
    } else {
        disarm();
        CHECKF(m == NULL, "failed load left a model");
        CHECKF(inj, "allocation %ld: load failed without an injected failure: %s", at, tj_context_error(ctx));
        const char *msg = tj_context_error(ctx);
        CHECKF(msg && msg[0], "allocation %ld: status %s without a message", at, tj_status_string(s));
    }
    long after = atomic_load(&live);
    CHECKF(after == before || !balance_checked, "allocation %ld%s: %ld allocations leaked (status %s: %s)", at, rest ? "+" : "",
           after - before, tj_status_string(s), s == TJ_OK ? "" : tj_context_error(ctx));
    if (after != before && balance_checked) report_new(snap);
    __real_free(snap);
    *ok_out = s == TJ_OK;
    return used;
}

static void *json_malloc(size_t n) { return __wrap_malloc(n); }
static void json_free(void *p) { __wrap_free(p); }

int main(void)
{
    json_set_alloc_funcs(json_malloc, json_free);
    char dir[] = "/tmp/tj_allocfail_XXXXXX", pat[256], wts[256];
    if (!mkdtemp(dir) || !rel_write_model(dir, pat, wts, sizeof pat)) return 1;
    tj_options opt = tj_options_default();
    opt.backend = rel_backend();
    char cache[300];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    opt.cache_dir = cache;
    tj_context *ctx = NULL;
    long base = atomic_load(&live);
    if (tj_context_create(&opt, &ctx) != TJ_OK) {
        fprintf(stderr, "skip: backend %s: %s\n", tj_backend_name(opt.backend), tj_last_error());
        return 77;
    }
    int ok;
    balance_checked = 0;
    long total = one_load(ctx, pat, wts, -1, 0, &ok);
    balance_checked = 1;
    CHECKF(ok, "the load without injection failed: %s", tj_context_error(ctx));
    /* State a backend keeps per context (created at the first load) now exists; count again. */
    total = one_load(ctx, pat, wts, -1, 0, &ok);
    printf("a load makes %ld allocations\n", total);
    long failed_loads = 0, survived = 0;
    for (long i = 0; i < total + 2; i++) {
        one_load(ctx, pat, wts, i, 0, &ok);
        ok ? survived++ : failed_loads++;
        one_load(ctx, pat, wts, i, 1, &ok);
        ok ? survived++ : failed_loads++;
    }
    printf("%ld injected runs: %ld clean errors, %ld loads that tolerated the failure (%ld frees of memory from other "
           "allocators)\n", 2 * (total + 2), failed_loads, survived, (long)atomic_load(&foreign_frees));
    CHECK(failed_loads > 0);
    tj_context_destroy(ctx);
    CHECKF(atomic_load(&live) == base, "%ld allocations outlive the context", atomic_load(&live) - base);
    json_set_alloc_funcs(malloc, free);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
