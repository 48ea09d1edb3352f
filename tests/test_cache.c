/* The persistent kernel cache (jit/cache.c) alone and under the NVRTC compile path: miss,
 * hit, corrupted and truncated entries (discarded, rebuilt to the same CUBIN), a read-only and an
 * uncreatable directory (compiles still work, one warning), and two processes compiling the
 * same model into one directory at once. Suite 'cuda'. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jit/cache.h"
#include "gen/emit_cuda.h"
#include "jit/nvrtc.h"
#include "pattern/random.h"
#include "tj_test.h"

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[4200];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* Number of entries (*.tjc) and of leftover temporary files; the last entry's path. */
static int list_entries(const char *dir, int *tmp, char *last, size_t n)
{
    DIR *d = opendir(dir);
    int count = 0;
    if (tmp) *tmp = 0;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if (l > 4 && strcmp(e->d_name + l - 4, ".tjc") == 0) {
            count++;
            if (last) snprintf(last, n, "%s/%s", dir, e->d_name);
        } else if (tmp && strncmp(e->d_name, ".tmp-", 5) == 0) {
            (*tmp)++;
        }
    }
    closedir(d);
    return count;
}

static long file_size(const char *p)
{
    struct stat s;
    return stat(p, &s) == 0 ? (long)s.st_size : -1;
}

static void flip_byte(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    if (!f) return;
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

static void make_key(tj_cache_key *k, const char *a, const char *b)
{
    tj_cache_key_begin(k);
    tj_cache_key_add_str(k, a);
    tj_cache_key_add_str(k, b);
    tj_cache_key_end(k);
}

static void test_sha256(void)
{
    /* FIPS 180-2 example: SHA-256("abc"). */
    tj_sha256 s;
    uint8_t out[32];
    tj_sha256_init(&s);
    tj_sha256_update(&s, "abc", 3);
    tj_sha256_final(&s, out);
    static const uint8_t want[4] = {0xba, 0x78, 0x16, 0xbf};
    CHECK(memcmp(out, want, 4) == 0 && out[31] == 0xad);
    /* Keys are length-prefixed: ("ab", "c") and ("a", "bc") differ. */
    tj_cache_key k1, k2;
    make_key(&k1, "ab", "c");
    make_key(&k2, "a", "bc");
    CHECK(memcmp(k1.hash, k2.hash, 32) != 0);
}

static void test_generic(const char *dir)
{
    tj_cache *c = NULL;
    tj_error err = {0};
    CHECK_OK(tj_cache_open(dir, &c, &err), &err);
    CHECK(tj_cache_mode(c) == 2);
    char *w = tj_cache_take_warning(c);
    CHECK(w == NULL);
    free(w);
    tj_cache_key k;
    make_key(&k, "blob", "one");
    void *blob = NULL;
    size_t len = 0;
    tj_cache_result res;
    CHECK_OK(tj_cache_lookup(c, &k, &blob, &len, &res, &err), &err);
    CHECK(res == TJ_CACHE_MISS && !blob);
    char payload[1000];
    for (int i = 0; i < 1000; i++) payload[i] = (char)(i * 7);
    CHECK_OK(tj_cache_store(c, &k, payload, sizeof payload, &err), &err);
    CHECK_OK(tj_cache_lookup(c, &k, &blob, &len, &res, &err), &err);
    CHECK(res == TJ_CACHE_HIT && len == sizeof payload && blob && memcmp(blob, payload, len) == 0);
    free(blob);

    char path[4300];
    int tmp;
    CHECK(list_entries(dir, &tmp, path, sizeof path) == 1 && tmp == 0);
    /* A dead writer's temporary file: removed at the next open once it is old, kept while fresh. */
    char stale[4300], fresh[4300];
    snprintf(stale, sizeof stale, "%s/.tmp-0123456789abcdef-1-1", dir);
    snprintf(fresh, sizeof fresh, "%s/.tmp-0123456789abcdef-2-1", dir);
    FILE *sf = fopen(stale, "w"), *ff = fopen(fresh, "w");
    if (sf) fclose(sf);
    if (ff) fclose(ff);
    struct timeval old_times[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    CHECK(utimes(stale, old_times) == 0);
    tj_cache *c2 = NULL;
    CHECK_OK(tj_cache_open(dir, &c2, &err), &err);
    CHECK(file_size(stale) < 0 && file_size(fresh) == 0);
    unlink(fresh);
    tj_cache_close(c2);
    long size = file_size(path);
    /* Corrupted payload byte, header byte, truncations: each discarded (file removed), then rebuilt. */
    long offsets[] = {size - 1, 500, 20, 30};
    for (int i = 0; i < 4; i++) {
        flip_byte(path, offsets[i]);
        CHECK_OK(tj_cache_lookup(c, &k, &blob, &len, &res, &err), &err);
        CHECKF(res == TJ_CACHE_DISCARDED && !blob, "flip at %ld: result %d", offsets[i], (int)res);
        CHECK(file_size(path) < 0);
        CHECK_OK(tj_cache_store(c, &k, payload, sizeof payload, &err), &err);
    }
    long cuts[] = {size - 1, 64, 10, 0};
    for (int i = 0; i < 4; i++) {
        CHECK(truncate(path, cuts[i]) == 0);
        CHECK_OK(tj_cache_lookup(c, &k, &blob, &len, &res, &err), &err);
        CHECKF(res == TJ_CACHE_DISCARDED && !blob, "truncated to %ld: result %d", cuts[i], (int)res);
        CHECK_OK(tj_cache_store(c, &k, payload, sizeof payload, &err), &err);
    }
    /* An entry renamed to another key's name does not answer for that key. */
    tj_cache_key k2;
    make_key(&k2, "blob", "two");
    char hex[65], path2[4300];
    tj_cache_key_hex(&k2, hex);
    snprintf(path2, sizeof path2, "%s/%s.tjc", dir, hex);
    CHECK(link(path, path2) == 0);
    CHECK_OK(tj_cache_lookup(c, &k2, &blob, &len, &res, &err), &err);
    CHECK(res == TJ_CACHE_DISCARDED && !blob);
    CHECK_OK(tj_cache_lookup(c, &k, &blob, &len, &res, &err), &err);
    CHECK(res == TJ_CACHE_HIT);
    free(blob);
    tj_cache_stats st = tj_cache_get_stats(c);
    CHECK(st.discarded == 9 && st.hits == 2 && st.misses == 1 && st.stores == 9 && st.store_failures == 0);
    tj_cache_close(c);
}

static char *tiny_source(uint64_t seed)
{
    tj_random_spec spec = {.n = 256, .k = 128, .g = 64, .sparsity = 0.5, .mode = 1, .seed = seed};
    tj_layer l;
    tj_error err = {0};
    if (tj_random_layer(&spec, "tiny", &l, &err)) return NULL;
    tj_cuda_config c = tj_cuda_config_default(&l);
    c.bm = 64;
    c.warps = 4;
    char *src = NULL;
    tj_cuda_emit(&l, &c, &src, &err);
    tj_layer_free(&l);
    return src;
}

static int same_cubin(const tj_cubin *a, const tj_cubin *b)
{
    return a->size == b->size && a->size > 0 && memcmp(a->data, b->data, a->size) == 0;
}

static void test_nvrtc_cache(const char *dir)
{
    char *src = tiny_source(1);
    CHECK(src != NULL);
    if (!src) return;
    tj_cache *c = NULL;
    tj_error err = {0};
    CHECK_OK(tj_cache_open(dir, &c, &err), &err);
    tj_cubin first, b;
    CHECK_OK(tj_nvrtc_compile(c, src, "tiny", 86, &first, &err), &err);
    CHECK(first.cache == TJ_CACHE_MISS);
    CHECK_OK(tj_nvrtc_compile(c, src, "tiny", 86, &b, &err), &err);
    CHECK(b.cache == TJ_CACHE_HIT && same_cubin(&first, &b));
    CHECK(b.nkernels >= 2 && b.kernels[0].registers > 0); /* the resource report survives the cache */
    tj_cubin_free(&b);
    /* Another arch is another entry. */
    CHECK_OK(tj_nvrtc_compile(c, src, "tiny", 80, &b, &err), &err);
    CHECK(b.cache == TJ_CACHE_MISS);
    tj_cubin_free(&b);
    CHECK(list_entries(dir, NULL, NULL, 0) == 2);

    /* Find sm_86's entry: corrupt it, then truncate it; each time the same CUBIN comes back. */
    char path[4600];
    for (int round = 0; round < 2; round++) {
        DIR *d = opendir(dir);
        struct dirent *e;
        path[0] = '\0';
        while (d && (e = readdir(d)) != NULL) {
            if (!strstr(e->d_name, ".tjc")) continue;
            char p2[4600];
            snprintf(p2, sizeof p2, "%.4000s/%.255s", dir, e->d_name);
            /* The sm_86 entry is the one whose damage makes the sm_86 compile rebuild; try both. */
            memcpy(path, p2, sizeof path);
            if (round == 0) flip_byte(p2, file_size(p2) / 2);
            else CHECK(truncate(p2, file_size(p2) / 3) == 0);
        }
        if (d) closedir(d);
        CHECK_OK(tj_nvrtc_compile(c, src, "tiny", 86, &b, &err), &err);
        CHECKF(b.cache == TJ_CACHE_DISCARDED && same_cubin(&first, &b), "round %d: cache %d", round, (int)b.cache);
        tj_cubin_free(&b);
        CHECK_OK(tj_nvrtc_compile(c, src, "tiny", 86, &b, &err), &err);
        CHECK(b.cache == TJ_CACHE_HIT && same_cubin(&first, &b));
        tj_cubin_free(&b);
        CHECK_OK(tj_nvrtc_compile(c, src, "tiny", 80, &b, &err), &err); /* rebuild sm_80's damaged entry too */
        tj_cubin_free(&b);
    }
    tj_cubin_free(&first);
    tj_cache_close(c);
    free(src);
}

static void test_unusable_dirs(const char *base)
{
    char *src = tiny_source(2);
    if (!src) { CHECK(0); return; }
    tj_error err = {0};
    /* A directory that cannot be created (its parent is a regular file). */
    char file[4200], sub[4300];
    snprintf(file, sizeof file, "%s/not-a-dir", base);
    FILE *f = fopen(file, "w");
    if (f) fclose(f);
    snprintf(sub, sizeof sub, "%s/cache", file);
    tj_cache *c = NULL;
    CHECK_OK(tj_cache_open(sub, &c, &err), &err);
    CHECK(tj_cache_mode(c) == 0);
    char *w = tj_cache_take_warning(c);
    CHECKF(w && strstr(w, "cannot create") && strstr(w, sub), "warning: %s", w ? w : "(none)");
    free(w);
    w = tj_cache_take_warning(c);
    CHECK(w == NULL); /* once */
    tj_cubin b;
    CHECK_OK(tj_nvrtc_compile(c, src, "tiny", 90, &b, &err), &err);
    CHECK(b.cache == TJ_CACHE_DISABLED && b.size > 0);
    tj_cubin_free(&b);
    tj_cache_close(c);
    unlink(file);

    /* A read-only directory: root ignores permission bits, so use a read-only filesystem's. */
    char ro[4200];
    if (geteuid() == 0) {
        snprintf(ro, sizeof ro, "/proc/self");
    } else {
        snprintf(ro, sizeof ro, "%s/readonly", base);
        mkdir(ro, 0755);
        chmod(ro, 0555);
    }
    CHECK_OK(tj_cache_open(ro, &c, &err), &err);
    CHECK(tj_cache_mode(c) == 1);
    w = tj_cache_take_warning(c);
    CHECKF(w && strstr(w, "not writable"), "warning: %s", w ? w : "(none)");
    free(w);
    CHECK_OK(tj_nvrtc_compile(c, src, "tiny", 90, &b, &err), &err);
    CHECK(b.cache == TJ_CACHE_MISS && b.size > 0);
    tj_cubin_free(&b);
    w = tj_cache_take_warning(c);
    CHECK(w == NULL); /* no second warning for the entry it could not store */
    free(w);
    tj_cache_close(c);
    if (geteuid() != 0) {
        chmod(ro, 0755);
        rmdir(ro);
    }
    free(src);
}

/* ---- two processes ---- */

#define MODEL_LAYERS 4

static int child_compile(const char *dir)
{
    tj_cache *c = NULL;
    tj_error err = {0};
    if (tj_cache_open(dir, &c, &err)) return 1;
    char *srcs[MODEL_LAYERS];
    tj_nvrtc_job jobs[MODEL_LAYERS];
    memset(jobs, 0, sizeof jobs);
    for (int i = 0; i < MODEL_LAYERS; i++) {
        srcs[i] = tiny_source(100 + (uint64_t)i);
        if (!srcs[i]) return 1;
        jobs[i].source = srcs[i];
        jobs[i].label = "model";
        jobs[i].sm = 89;
    }
    tj_status st = tj_nvrtc_compile_all(c, jobs, MODEL_LAYERS, 1, &err);
    int bad = st != TJ_OK;
    if (bad) fprintf(stderr, "child: %s\n", err.msg);
    for (int i = 0; i < MODEL_LAYERS; i++) {
        bad |= jobs[i].result.size == 0;
        tj_cubin_free(&jobs[i].result);
        free(srcs[i]);
    }
    tj_cache_close(c);
    return bad;
}

static void test_two_processes(const char *self, const char *dir)
{
    pid_t pids[2];
    for (int i = 0; i < 2; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            execl(self, self, "--child", dir, (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < 2; i++) {
        int status = 0;
        CHECK(pids[i] > 0 && waitpid(pids[i], &status, 0) == pids[i]);
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %d", i, status);
    }
    int tmp = 0;
    CHECK(list_entries(dir, &tmp, NULL, 0) == MODEL_LAYERS);
    CHECK(tmp == 0);
    /* Every entry is whole: a third run hits on all of them. */
    tj_cache *c = NULL;
    tj_error err = {0};
    CHECK_OK(tj_cache_open(dir, &c, &err), &err);
    for (int i = 0; i < MODEL_LAYERS; i++) {
        char *src = tiny_source(100 + (uint64_t)i);
        tj_cubin b;
        CHECK_OK(tj_nvrtc_compile(c, src, "model", 89, &b, &err), &err);
        CHECK(b.cache == TJ_CACHE_HIT);
        tj_cubin_free(&b);
        free(src);
    }
    tj_cache_close(c);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0) return child_compile(argv[2]);
    char base[] = "/tmp/tj-cache-test-XXXXXX";
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    char d1[4200], d2[4200], d3[4200];
    snprintf(d1, sizeof d1, "%s/generic", base);
    snprintf(d2, sizeof d2, "%s/nvrtc/nested", base); /* created with its parents */
    snprintf(d3, sizeof d3, "%s/shared", base);
    test_sha256();
    test_generic(d1);
    test_nvrtc_cache(d2);
    test_unusable_dirs(base);
    test_two_processes(argv[0], d3);
    rm_tree(d1);
    rm_tree(d2);
    char d2p[4200];
    snprintf(d2p, sizeof d2p, "%s/nvrtc", base);
    rmdir(d2p);
    rm_tree(d3);
    rmdir(base);
    return tj_test_end();
}
