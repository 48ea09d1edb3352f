/* The persistent kernel cache: files named by the key's SHA-256, written to a temporary file and
 * renamed, checked (magic, version, length, key, payload SHA-256) on every read. Used by the
 * compile paths (jit/nvrtc.c for CUBINs) between code generation and loading. */
#include "jit/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* ---- SHA-256 (FIPS 180-4) ---- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror32(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha256_block(tj_sha256 *s, const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror32(w[i - 15], 7) ^ ror32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror32(w[i - 2], 17) ^ ror32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (ror32(e, 6) ^ ror32(e, 11) ^ ror32(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
        uint32_t t2 = (ror32(a, 2) ^ ror32(a, 13) ^ ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d;
    s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

void tj_sha256_init(tj_sha256 *s)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->len = 0;
    s->nbuf = 0;
}

void tj_sha256_update(tj_sha256 *s, const void *data, size_t n)
{
    if (n == 0) return; /* data may be NULL (an empty array): memcpy must not see it */
    const uint8_t *p = data;
    s->len += n;
    if (s->nbuf) {
        size_t take = 64 - s->nbuf < n ? 64 - s->nbuf : n;
        memcpy(s->buf + s->nbuf, p, take);
        s->nbuf += take;
        p += take;
        n -= take;
        if (s->nbuf < 64) return;
        sha256_block(s, s->buf);
        s->nbuf = 0;
    }
    for (; n >= 64; n -= 64, p += 64) sha256_block(s, p);
    memcpy(s->buf, p, n);
    s->nbuf = n;
}

void tj_sha256_final(tj_sha256 *s, uint8_t out[32])
{
    uint64_t bits = s->len * 8;
    uint8_t pad = 0x80, zero = 0;
    tj_sha256_update(s, &pad, 1);
    while (s->nbuf != 56) tj_sha256_update(s, &zero, 1);
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)(bits >> (56 - 8 * i));
    tj_sha256_update(s, lenb, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

/* ---- keys ---- */

void tj_cache_key_begin(tj_cache_key *k)
{
    memset(k, 0, sizeof *k);
    tj_sha256_init(&k->st);
    tj_sha256_update(&k->st, "tilejit-cache-key-1", 19);
}

void tj_cache_key_add(tj_cache_key *k, const void *data, size_t n)
{
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    tj_sha256_update(&k->st, len, 8);
    tj_sha256_update(&k->st, data, n);
}

void tj_cache_key_add_str(tj_cache_key *k, const char *s) { tj_cache_key_add(k, s ? s : "", s ? strlen(s) : 0); }

void tj_cache_key_end(tj_cache_key *k) { tj_sha256_final(&k->st, k->hash); }

void tj_cache_key_hex(const tj_cache_key *k, char out[65])
{
    static const char hx[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = hx[k->hash[i] >> 4];
        out[2 * i + 1] = hx[k->hash[i] & 15];
    }
    out[64] = '\0';
}

/* ---- payload checksum ----
 * Integrity, not authentication (the key is the SHA-256): four independent multiply-xor lanes
 * over 8-byte words, several GB/s, so a warm load of a whole model stays in milliseconds. */

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    return h ^ (h >> 33);
}

static uint64_t checksum64(const void *data, size_t n)
{
    const uint8_t *p = data;
    uint64_t l[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int j = 0; j < 4; j++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * j, 8);
            l[j] = (l[j] ^ w) * 0x9e3779b97f4a7c15ull;
            l[j] ^= l[j] >> 29;
        }
    uint64_t h = (uint64_t)n;
    for (; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    for (int j = 0; j < 4; j++) h = mix64(h ^ mix64(l[j] + (uint64_t)j));
    return h;
}

/* ---- the cache ---- */

#define ENTRY_MAGIC "TJCACHE\001"
#define ENTRY_VERSION 2u
#define HEADER_SIZE 64 /* magic 8, version 4, reserved 4, length 8, key 32, payload checksum 8 */
#define MAX_PAYLOAD ((uint64_t)1 << 34)

#define DEFAULT_MAX_MB 2048
/* A handle lists the directory at its first store, when its size estimate crosses the cap, and
 * at least every EVICT_SCAN_EVERY stores, so what other processes add is counted too. */
#define EVICT_SCAN_EVERY 64

struct tj_cache {
    char *dir;
    uint64_t max_bytes; /* 0: no cap */
    int mode; /* 0 off, 1 lookups, 2 lookups and stores */
    pthread_mutex_t lock;
    char *warning;
    int warned; /* a warning was already produced (only the first is kept) */
    tj_cache_stats stats;
    unsigned long seq;
    /* The size cap without a listing per store: the entries' bytes as of the last scan plus what
     * this handle stored since (guarded by lock). */
    int scanned;        /* est holds a scan's total (reset when the cap changes) */
    uint64_t est;
    uint64_t est_new;   /* bytes stored since the running scan began (threads of this handle) */
    int stores_since;   /* stores since the last scan */
};

static void warn(tj_cache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn(tj_cache *c, const char *fmt, ...)
{
    pthread_mutex_lock(&c->lock);
    if (!c->warned) {
        char buf[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        c->warning = strdup(buf);
        c->warned = 1;
    }
    pthread_mutex_unlock(&c->lock);
}

char *tj_cache_default_dir(void)
{
    const char *e = getenv("TILEJIT_CACHE_DIR");
    char buf[4096];
    if (e && *e) return strdup(e);
    e = getenv("XDG_CACHE_HOME");
    if (e && *e) {
        snprintf(buf, sizeof buf, "%s/tilejit", e);
        return strdup(buf);
    }
    e = getenv("HOME");
    if (e && *e) {
        snprintf(buf, sizeof buf, "%s/.cache/tilejit", e);
        return strdup(buf);
    }
    return NULL;
}

/* mkdir -p; 0 on success, else errno. */
static int make_dirs(const char *path)
{
    char *p = strdup(path);
    if (!p) return ENOMEM;
    int rc = 0;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0') continue;
        char saved = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) { rc = errno; *s = saved; break; }
        *s = saved;
        if (!saved) break;
    }
    free(p);
    if (rc) return rc;
    struct stat st;
    if (stat(path, &st) != 0) return errno;
    return S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
}

/* Temporary files of writers that died before their rename: anything older than an hour (a
 * live writer renames within seconds). */
static void remove_stale_temps(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    time_t now = time(NULL);
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, ".tmp-", 5) != 0 && strncmp(e->d_name, ".probe-", 7) != 0) continue;
        snprintf(path, sizeof path, "%.4000s/%.255s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime > 3600) unlink(path);
    }
    closedir(d);
}

tj_status tj_cache_open(const char *dir, tj_cache **out, tj_error *err)
{
    *out = NULL;
    tj_cache *c = calloc(1, sizeof *c);
    if (!c) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory opening the kernel cache");
    pthread_mutex_init(&c->lock, NULL);
    c->dir = dir && *dir ? strdup(dir) : tj_cache_default_dir();
    const char *cap = getenv("TILEJIT_CACHE_MAX_MB");
    char *end = NULL;
    double mb = cap && *cap ? strtod(cap, &end) : DEFAULT_MAX_MB;
    if (cap && *cap && (end == cap || *end || !(mb >= 0))) mb = DEFAULT_MAX_MB; /* unparsable: the default */
    c->max_bytes = (uint64_t)(mb * 1048576.0);
    if (!c->dir) {
        warn(c, "kernel cache disabled: no cache directory (set TILEJIT_CACHE_DIR, XDG_CACHE_HOME or HOME)");
        *out = c;
        return TJ_OK;
    }
    int rc = make_dirs(c->dir);
    if (rc) {
        warn(c, "kernel cache disabled: cannot create directory '%s': %s", c->dir, strerror(rc));
        *out = c;
        return TJ_OK;
    }
    c->mode = 1;
    /* Probe for writing with a real file: access() says yes to root on read-only filesystems' dirs. */
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.probe-%ld", c->dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        close(fd);
        unlink(probe);
        c->mode = 2;
        remove_stale_temps(c->dir);
    } else {
        warn(c, "kernel cache '%s' is not writable (%s): compiled kernels will not be saved", c->dir, strerror(errno));
    }
    *out = c;
    return TJ_OK;
}

void tj_cache_close(tj_cache *c)
{
    if (!c) return;
    pthread_mutex_destroy(&c->lock);
    free(c->dir);
    free(c->warning);
    free(c);
}

const char *tj_cache_dir(const tj_cache *c) { return c ? c->dir : NULL; }
int tj_cache_mode(const tj_cache *c) { return c ? c->mode : 0; }

char *tj_cache_take_warning(tj_cache *c)
{
    if (!c) return NULL;
    pthread_mutex_lock(&c->lock);
    char *w = c->warning;
    c->warning = NULL;
    pthread_mutex_unlock(&c->lock);
    return w;
}

tj_cache_stats tj_cache_get_stats(tj_cache *c)
{
    tj_cache_stats s;
    memset(&s, 0, sizeof s);
    if (!c) return s;
    pthread_mutex_lock(&c->lock);
    s = c->stats;
    pthread_mutex_unlock(&c->lock);
    return s;
}

static void count(tj_cache *c, int64_t *field)
{
    pthread_mutex_lock(&c->lock);
    (*field)++;
    pthread_mutex_unlock(&c->lock);
}

static void entry_path(const tj_cache *c, const tj_cache_key *k, char *out, size_t n)
{
    char hex[65];
    tj_cache_key_hex(k, hex);
    snprintf(out, n, "%s/%s.tjc", c->dir, hex);
}

static void put_u32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put_u64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get_u32(const uint8_t *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

static int read_full(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        p += r;
        n -= (size_t)r;
    }
    return 1;
}

static int write_full(int fd, const void *buf, size_t n)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        p += r;
        n -= (size_t)r;
    }
    return 1;
}

typedef struct entry_age {
    struct timespec mtime;
    uint64_t size;
    char name[80];
} entry_age;

static int older(const void *a, const void *b)
{
    const entry_age *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec) return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Size cap: when the entries (*.tjc) take more than max_bytes, delete the least recently used
 * (oldest mtime) until they take at most 90 % of it; `keep` (the entry just stored) goes last.
 * Other processes may evict at the same time: a vanished file is simply skipped, and a reader
 * that loses an entry rebuilds it. Returns the entries' bytes after eviction. */
static uint64_t evict(tj_cache *c, const char *keep)
{
    DIR *d = opendir(c->dir);
    if (!d) return 0;
    count(c, &c->stats.scans);
    entry_age *v = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (nl < 5 || nl >= sizeof v->name || strcmp(e->d_name + nl - 4, ".tjc") != 0) continue;
        snprintf(path, sizeof path, "%.4000s/%.255s", c->dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            entry_age *nv = realloc(v, nc * sizeof *nv);
            if (!nv) break; /* out of memory: evict what was seen */
            v = nv;
            cap = nc;
        }
        v[n].mtime = st.st_mtim;
        v[n].size = (uint64_t)st.st_size;
        memcpy(v[n].name, e->d_name, nl + 1);
        total += v[n].size;
        n++;
    }
    closedir(d);
    if (total > c->max_bytes) {
        qsort(v, n, sizeof *v, older);
        uint64_t target = c->max_bytes / 10 * 9;
        const char *kb = strrchr(keep, '/');
        kb = kb ? kb + 1 : keep;
        for (int pass = 0; pass < 2 && total > target; pass++)
            for (size_t i = 0; i < n && total > target; i++) {
                if ((strcmp(v[i].name, kb) == 0) != pass) continue; /* the new entry only if nothing else helps */
                snprintf(path, sizeof path, "%.4000s/%.255s", c->dir, v[i].name);
                if (unlink(path) == 0) {
                    total -= v[i].size;
                    count(c, &c->stats.evicted);
                }
            }
    }
    free(v);
    return total;
}

/* After a store of `bytes`: whether to list the directory (evict) now. The estimate only grows
 * between scans (entries this handle overwrites, or others delete, still count), so what this
 * handle stores is counted before it can take the directory over the cap; what other processes
 * store is seen at the next scan. */
static int scan_due(tj_cache *c, uint64_t bytes)
{
    pthread_mutex_lock(&c->lock);
    c->est += bytes;
    c->est_new += bytes;
    int due = !c->scanned || c->est > c->max_bytes || ++c->stores_since >= EVICT_SCAN_EVERY;
    if (due) {
        c->stores_since = 0;
        c->est_new = 0;
    }
    pthread_mutex_unlock(&c->lock);
    return due;
}

tj_status tj_cache_lookup(tj_cache *c, const tj_cache_key *k, void **blob, size_t *len, tj_cache_result *res,
                          tj_error *err)
{
    *blob = NULL;
    *len = 0;
    *res = TJ_CACHE_DISABLED;
    if (!c || c->mode == 0) return TJ_OK;
    char path[4200];
    entry_path(c, k, path, sizeof path);
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        *res = TJ_CACHE_MISS;
        count(c, &c->stats.misses);
        return TJ_OK;
    }
    uint8_t hdr[HEADER_SIZE];
    struct stat st;
    int ok = fstat(fd, &st) == 0 && st.st_size >= HEADER_SIZE && read_full(fd, hdr, sizeof hdr) &&
             memcmp(hdr, ENTRY_MAGIC, 8) == 0 && get_u32(hdr + 8) == ENTRY_VERSION &&
             get_u64(hdr + 16) <= MAX_PAYLOAD && (uint64_t)st.st_size == HEADER_SIZE + get_u64(hdr + 16) &&
             memcmp(hdr + 24, k->hash, 32) == 0;
    uint8_t *data = NULL;
    uint64_t n = ok ? get_u64(hdr + 16) : 0;
    if (ok) {
        data = malloc(n ? (size_t)n : 1);
        if (!data) {
            close(fd);
            return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory reading kernel cache entry '%s'", path);
        }
        ok = read_full(fd, data, (size_t)n);
        if (ok) ok = checksum64(data, (size_t)n) == get_u64(hdr + 56);
    }
    close(fd);
    if (!ok) {
        free(data);
        if (c->mode == 2) unlink(path); /* a concurrent writer's fresh entry may go too: it is rebuilt */
        *res = TJ_CACHE_DISCARDED;
        count(c, &c->stats.discarded);
        return TJ_OK;
    }
    /* least recently used = oldest modification time: a hit makes the entry young again */
    if (c->mode == 2) utimensat(AT_FDCWD, path, NULL, 0);
    *blob = data;
    *len = (size_t)n;
    *res = TJ_CACHE_HIT;
    count(c, &c->stats.hits);
    return TJ_OK;
}

tj_status tj_cache_store(tj_cache *c, const tj_cache_key *k, const void *blob, size_t len, tj_error *err)
{
    (void)err;
    if (!c || c->mode != 2) return TJ_OK;
    char path[4200], tmp[4300], hex[65];
    entry_path(c, k, path, sizeof path);
    tj_cache_key_hex(k, hex);
    pthread_mutex_lock(&c->lock);
    unsigned long seq = ++c->seq;
    pthread_mutex_unlock(&c->lock);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%.16s-%ld-%lu", c->dir, hex, (long)getpid(), seq);
    uint8_t hdr[HEADER_SIZE];
    memset(hdr, 0, sizeof hdr);
    memcpy(hdr, ENTRY_MAGIC, 8);
    put_u32(hdr + 8, ENTRY_VERSION);
    put_u64(hdr + 16, (uint64_t)len);
    memcpy(hdr + 24, k->hash, 32);
    put_u64(hdr + 56, checksum64(blob, len));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    int ok = fd >= 0;
    int saved = ok ? 0 : errno;
    if (ok) {
        ok = write_full(fd, hdr, sizeof hdr) && write_full(fd, blob, len);
        if (!ok) saved = errno;
        if (close(fd) != 0 && ok) { ok = 0; saved = errno; }
    }
    if (ok && rename(tmp, path) != 0) { ok = 0; saved = errno; }
    if (!ok) {
        if (fd >= 0) unlink(tmp);
        count(c, &c->stats.store_failures);
        warn(c, "kernel cache '%s': could not save an entry (%s); continuing without it", c->dir, strerror(saved));
        return TJ_OK;
    }
    count(c, &c->stats.stores);
    if (c->max_bytes && scan_due(c, HEADER_SIZE + (uint64_t)len)) {
        uint64_t total = evict(c, path);
        pthread_mutex_lock(&c->lock);
        c->est = total + c->est_new; /* stores of other threads during the scan: maybe counted twice */
        c->scanned = 1;
        pthread_mutex_unlock(&c->lock);
    }
    return TJ_OK;
}

void tj_cache_remove(tj_cache *c, const tj_cache_key *k)
{
    if (!c || c->mode != 2) return;
    char path[4200];
    entry_path(c, k, path, sizeof path);
    unlink(path);
}

void tj_cache_set_max_bytes(tj_cache *c, uint64_t max_bytes)
{
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    c->max_bytes = max_bytes;
    c->scanned = 0; /* the next store lists the directory against the new cap */
    pthread_mutex_unlock(&c->lock);
}
