/* The kernel cache under faults (issue 8), through jit/cache.h:
 * - writers SIGKILLed at random moments while storing leave nothing a later run trusts: every
 *   lookup afterwards is a miss or a hit with exactly the stored bytes; entries torn afterwards
 *   (truncated, a flipped byte: what a power loss can leave) are discarded and rebuilt;
 * - 8 processes storing and looking up the same keys at once all succeed with identical bytes,
 *   and (with NVRTC) 8 processes compiling the same model's CUDA sources through one cache get
 *   identical CUBINs, one entry per layer and no temporary files;
 * - a full disk (RLIMIT_FSIZE; also a 64 KiB tmpfs when mounting is allowed) degrades to no
 *   caching with exactly one warning. (A read-only directory: tests/test_cache.c.) */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <utime.h>

#include "jit/cache.h"
#include "rel_common.h"
#include "tj_config.h"
#if TJ_HAVE_CUDA
#include "gen/emit_cuda.h"
#include "jit/nvrtc.h"
#endif

#define NKEYS 8
#define BLOB (4u << 20)

static void key_of(int i, tj_cache_key *k)
{
    tj_cache_key_begin(k);
    tj_cache_key_add_str(k, "test_cache_faults");
    tj_cache_key_add(k, &i, sizeof i);
    tj_cache_key_end(k);
}

/* Payload of key i: BLOB bytes (smaller for some keys), deterministic. */
static size_t blob_of(int i, unsigned char *buf)
{
    size_t n = BLOB - (size_t)i * 4099;
    tj_rng r = {(uint64_t)i + 1};
    for (size_t j = 0; j < n; j += 8) {
        uint64_t v = tj_rng_next(&r);
        memcpy(buf + j, &v, n - j < 8 ? n - j : 8);
    }
    return n;
}

static int count_files(const char *dir, const char *prefix, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), sl = suffix ? strlen(suffix) : 0;
        if (prefix && strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
        else if (suffix && l > sl && strcmp(e->d_name + l - sl, suffix) == 0) n++;
    }
    if (d) closedir(d);
    return n;
}

/* Every key is a miss or a hit with exactly its bytes. Returns the number of hits. */
static int verify_all(const char *dir, unsigned char *want, const char *when)
{
    tj_cache *c = NULL;
    tj_error err;
    if (tj_cache_open(dir, &c, &err) != TJ_OK) return -1;
    int hits = 0;
    for (int i = 0; i < NKEYS; i++) {
        tj_cache_key k;
        key_of(i, &k);
        void *got = NULL;
        size_t len = 0;
        tj_cache_result res;
        CHECK(tj_cache_lookup(c, &k, &got, &len, &res, &err) == TJ_OK);
        if (res == TJ_CACHE_HIT) {
            size_t n = blob_of(i, want);
            CHECKF(len == n && memcmp(got, want, n) == 0, "%s: key %d: a hit with wrong bytes (%zu vs %zu)", when, i, len, n);
            hits++;
        } else {
            CHECKF(res == TJ_CACHE_MISS || res == TJ_CACHE_DISCARDED, "%s: key %d: result %d", when, i, (int)res);
        }
        free(got);
    }
    tj_cache_close(c);
    return hits;
}

static void writer_forever(const char *dir)
{
    tj_cache *c = NULL;
    tj_error err;
    unsigned char *buf = malloc(BLOB);
    if (!buf || tj_cache_open(dir, &c, &err) != TJ_OK) _exit(2);
    for (int round = 0;; round++)
        for (int i = 0; i < NKEYS; i++) {
            tj_cache_key k;
            key_of((i + round) % NKEYS, &k);
            size_t n = blob_of((i + round) % NKEYS, buf);
            tj_cache_store(c, &k, buf, n, &err);
        }
}

static void test_killed_writers(const char *base)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/killed", base);
    unsigned char *want = malloc(BLOB);
    tj_rng r = {12345};
    int kills = 0;
    for (int it = 0; it < 40; it++) {
        pid_t pid = fork();
        if (pid == 0) writer_forever(dir);
        struct timespec ts = {0, (long)(tj_rng_below(&r, 30000) + 200) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        int status = 0;
        waitpid(pid, &status, 0);
        kills += WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
        if (it % 8 == 7) verify_all(dir, want, "after kills");
    }
    int leftovers = count_files(dir, ".tmp-", NULL);
    int hits = verify_all(dir, want, "after kills");
    printf("killed writers: %d SIGKILLs, then %d of %d keys hit (all with the right bytes), %d dead writers' temporary files\n",
           kills, hits, NKEYS, leftovers);
    CHECK(kills == 40);
    /* Dead writers' temporary files are never read, and are swept once old. */
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1024];
    time_t old = time(NULL) - 7200;
    while (d && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, ".tmp-", 5) == 0) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            struct utimbuf ut = {old, old};
            utime(p, &ut);
        }
    if (d) closedir(d);
    tj_cache *c = NULL;
    tj_error err;
    CHECK(tj_cache_open(dir, &c, &err) == TJ_OK);
    tj_cache_close(c);
    CHECKF(count_files(dir, ".tmp-", NULL) == 0, "old temporary files were not swept");

    /* Entries torn after the rename (what a power loss can leave without fsync): a truncated
     * entry and one with a flipped byte are discarded, deleted, and stored again. */
    CHECK(tj_cache_open(dir, &c, &err) == TJ_OK);
    for (int i = 0; i < 2; i++) {
        tj_cache_key k;
        key_of(i, &k);
        size_t n = blob_of(i, want);
        CHECK(tj_cache_store(c, &k, want, n, &err) == TJ_OK);
    }
    d = opendir(dir);
    int torn = 0;
    while (d && (e = readdir(d)) != NULL && torn < 2) {
        size_t l = strlen(e->d_name);
        if (l < 5 || e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (torn == 0) {
            CHECK(truncate(p, 1000) == 0);
        } else {
            FILE *f = fopen(p, "r+b");
            if (f) {
                fseek(f, 100000, SEEK_SET);
                int ch = fgetc(f);
                fseek(f, 100000, SEEK_SET);
                fputc(ch ^ 0x40, f);
                fclose(f);
            }
        }
        torn++;
    }
    if (d) closedir(d);
    CHECK(torn == 2);
    tj_cache_close(c);
    int discarded = 0;
    CHECK(tj_cache_open(dir, &c, &err) == TJ_OK);
    for (int i = 0; i < NKEYS; i++) {
        tj_cache_key k;
        key_of(i, &k);
        void *got = NULL;
        size_t len = 0;
        tj_cache_result res;
        CHECK(tj_cache_lookup(c, &k, &got, &len, &res, &err) == TJ_OK);
        size_t n = blob_of(i, want);
        if (res == TJ_CACHE_HIT) CHECKF(len == n && memcmp(got, want, n) == 0, "torn entries: key %d hit with wrong bytes", i);
        discarded += res == TJ_CACHE_DISCARDED;
        free(got);
        if (res != TJ_CACHE_HIT) CHECK(tj_cache_store(c, &k, want, n, &err) == TJ_OK);
    }
    tj_cache_close(c);
    CHECKF(discarded == 2, "%d torn entries discarded (want 2)", discarded);
    CHECK(verify_all(dir, want, "after rebuild") == NKEYS);
    free(want);
}

/* ---- 8 processes at once ---- */

static int child_generic(const char *dir, int id)
{
    tj_cache *c = NULL;
    tj_error err;
    unsigned char *buf = malloc(BLOB);
    if (!buf || tj_cache_open(dir, &c, &err) != TJ_OK) return 2;
    int bad = 0;
    tj_rng r = {(uint64_t)id * 31 + 7};
    for (int round = 0; round < 6; round++)
        for (int j = 0; j < NKEYS; j++) {
            int i = (int)tj_rng_below(&r, NKEYS);
            tj_cache_key k;
            key_of(i, &k);
            void *got = NULL;
            size_t len = 0;
            tj_cache_result res;
            if (tj_cache_lookup(c, &k, &got, &len, &res, &err) != TJ_OK) bad = 1;
            size_t n = blob_of(i, buf);
            if (res == TJ_CACHE_HIT && (len != n || memcmp(got, buf, n) != 0)) bad = 1;
            if (res == TJ_CACHE_DISCARDED) bad = 1; /* only complete entries are ever visible */
            if (res != TJ_CACHE_HIT && tj_cache_store(c, &k, buf, n, &err) != TJ_OK) bad = 1;
            free(got);
        }
    char *w = tj_cache_take_warning(c);
    if (w) {
        fprintf(stderr, "child %d: unexpected warning: %s\n", id, w);
        bad = 1;
        free(w);
    }
    tj_cache_close(c);
    free(buf);
    return bad;
}

#if TJ_HAVE_CUDA
/* Compiles every layer of the model for sm_90 through the cache; writes each CUBIN's SHA-256
 * (hex, one per line) to out. */
static int child_model(const char *dir, const char *pattern, const char *out)
{
    tj_error err;
    tj_pattern *p = NULL;
    tj_cache *c = NULL;
    if (tj_pattern_load(pattern, &p, &err) != TJ_OK || tj_cache_open(dir, &c, &err) != TJ_OK) return 2;
    tj_nvrtc_job jobs[REL_LAYERS];
    char *srcs[REL_LAYERS] = {0};
    memset(jobs, 0, sizeof jobs);
    int bad = 0;
    for (int64_t i = 0; i < p->nlayers && i < REL_LAYERS; i++) {
        tj_cuda_config cfg = tj_cuda_config_default(&p->layers[i]);
        if (tj_cuda_emit(&p->layers[i], &cfg, &srcs[i], &err) != TJ_OK) return 3;
        jobs[i].source = srcs[i];
        jobs[i].label = p->layers[i].name;
        jobs[i].sm = 90;
    }
    if (tj_nvrtc_compile_all(c, jobs, p->nlayers, 1, &err) != TJ_OK) {
        fprintf(stderr, "compile: %s\n", err.msg);
        bad = 1;
    }
    FILE *f = fopen(out, "w");
    for (int64_t i = 0; i < p->nlayers && f; i++) {
        tj_sha256 s;
        uint8_t h[32];
        tj_sha256_init(&s);
        tj_sha256_update(&s, jobs[i].result.data, jobs[i].result.size);
        tj_sha256_final(&s, h);
        for (int j = 0; j < 32; j++) fprintf(f, "%02x", h[j]);
        fprintf(f, " %zu\n", jobs[i].result.size);
        bad |= jobs[i].result.size == 0;
        tj_cubin_free(&jobs[i].result);
        free(srcs[i]);
    }
    if (f) fclose(f);
    tj_cache_close(c);
    tj_pattern_destroy(p);
    return bad;
}
#endif

static void run_children(const char *self, const char *mode, const char *dir, const char *extra, int n)
{
    pid_t pids[8];
    char ids[8][8];
    for (int i = 0; i < n; i++) {
        snprintf(ids[i], sizeof ids[i], "%d", i);
        pids[i] = fork();
        if (pids[i] == 0) {
            execl(self, self, mode, dir, ids[i], extra, (char *)NULL);
            _exit(127);
        }
    }
    for (int i = 0; i < n; i++) {
        int status = 0;
        CHECK(pids[i] > 0 && waitpid(pids[i], &status, 0) == pids[i]);
        CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s child %d: status %d", mode, i, status);
    }
}

static void test_eight_processes(const char *self, const char *base)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/eight", base);
    run_children(self, "--generic", dir, "", 8);
    unsigned char *want = malloc(BLOB);
    CHECK(verify_all(dir, want, "eight processes") == NKEYS);
    CHECK(count_files(dir, ".tmp-", NULL) == 0);
    free(want);
#if TJ_HAVE_CUDA
    char mdir[512], cdir[600], pat[600], wts[600];
    snprintf(mdir, sizeof mdir, "%s/model", base);
    mkdir(mdir, 0755);
    CHECK(rel_write_model(mdir, pat, wts, sizeof pat));
    snprintf(cdir, sizeof cdir, "%s/cache", mdir);
    double t0 = tj_now();
    run_children(self, "--model", cdir, pat, 8);
    char first[1024] = "", text[1024];
    for (int i = 0; i < 8; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s.%d.sha", pat, i);
        FILE *f = fopen(p, "r");
        size_t got = f ? fread(text, 1, sizeof text - 1, f) : 0;
        text[got] = '\0';
        if (f) fclose(f);
        if (i == 0) snprintf(first, sizeof first, "%s", text);
        CHECKF(got > 0 && strcmp(text, first) == 0, "process %d compiled other CUBINs:\n%s\nvs\n%s", i, text, first);
    }
    int entries = count_files(cdir, NULL, ".tjc"), tmps = count_files(cdir, ".tmp-", NULL);
    printf("8 processes compiled the %d-layer model through one cache in %.1f s: identical CUBINs, %d entries, %d temporary files\n",
           REL_LAYERS, tj_now() - t0, entries, tmps);
    CHECK(entries == REL_LAYERS && tmps == 0);
#else
    printf("8-process model compile: skipped (built without NVRTC)\n");
#endif
}

/* ---- full disk ---- */

static int full_disk_checks(tj_cache *c, const char *dir, const char *what)
{
    tj_error err;
    unsigned char *buf = malloc(BLOB);
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        tj_cache_key k;
        key_of(i, &k);
        size_t n = blob_of(i, buf);
        if (tj_cache_store(c, &k, buf, n, &err) != TJ_OK) bad |= 1;
        char *w = tj_cache_take_warning(c);
        if (i == 0 && (!w || !strstr(w, "could not save"))) {
            fprintf(stderr, "%s: no warning after the first failed store (%s)\n", what, w ? w : "none");
            bad |= 2;
        }
        if (i > 0 && w) {
            fprintf(stderr, "%s: a second warning: %s\n", what, w);
            bad |= 4;
        }
        free(w);
        void *got = NULL;
        size_t len;
        tj_cache_result res;
        if (tj_cache_lookup(c, &k, &got, &len, &res, &err) != TJ_OK || res == TJ_CACHE_HIT) bad |= 8;
        free(got);
    }
    if (count_files(dir, ".tmp-", NULL) != 0 || count_files(dir, NULL, ".tjc") != 0) {
        fprintf(stderr, "%s: partial files left behind\n", what);
        bad |= 16;
    }
    tj_cache_stats st = tj_cache_get_stats(c);
    if (st.store_failures != 3) bad |= 32;
    free(buf);
    return bad;
}

static int child_full_run(const char *dir)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) return 64;
    tj_cache *c = NULL;
    tj_error err;
    if (tj_cache_open(dir, &c, &err) != TJ_OK || tj_cache_mode(c) != 2) return 65;
    int bad = full_disk_checks(c, dir, "RLIMIT_FSIZE");
    tj_cache_close(c);
    return bad;
}

static void test_full_disk(const char *self, const char *base)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/full", base);
    mkdir(dir, 0755);
    pid_t pid = fork();
    if (pid == 0) {
        execl(self, self, "--full", dir, "0", "", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "full disk (RLIMIT_FSIZE): status %d (bits: %d)", status,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    /* A real ENOSPC: a 64 KiB tmpfs, when this process may mount one. */
    char mnt[512];
    snprintf(mnt, sizeof mnt, "%s/tmpfs", base);
    mkdir(mnt, 0755);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=64k") == 0) {
        tj_cache *c = NULL;
        tj_error err;
        CHECK(tj_cache_open(mnt, &c, &err) == TJ_OK && tj_cache_mode(c) == 2);
        int bad = full_disk_checks(c, mnt, "64 KiB tmpfs");
        CHECKF(bad == 0, "full tmpfs: bits %d", bad);
        tj_cache_close(c);
        umount(mnt);
        printf("full disk: RLIMIT_FSIZE and a full 64 KiB tmpfs both degrade to no caching with one warning\n");
    } else {
        printf("full disk: RLIMIT_FSIZE degrades to no caching with one warning (tmpfs not mountable here: %s)\n",
               strerror(errno));
    }
    rmdir(mnt);
}

int main(int argc, char **argv)
{
    if (argc >= 4 && strcmp(argv[1], "--generic") == 0) return child_generic(argv[2], atoi(argv[3]));
    if (argc >= 4 && strcmp(argv[1], "--full") == 0) return child_full_run(argv[2]);
#if TJ_HAVE_CUDA
    if (argc >= 5 && strcmp(argv[1], "--model") == 0) {
        char out[700];
        snprintf(out, sizeof out, "%s.%s.sha", argv[4], argv[3]);
        return child_model(argv[2], argv[4], out);
    }
#endif
    char base[] = "/tmp/tj_cache_faults_XXXXXX";
    if (!mkdtemp(base)) return 1;
    test_killed_writers(base);
    test_eight_processes(argv[0], base);
    test_full_disk(argv[0], base);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", base);
    return tj_test_end();
}
