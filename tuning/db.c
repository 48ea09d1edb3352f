/* Tuning database: merges logs into one entry per (target device, workload, M, config) and answers
 * "best config for this layer at this M" through a sorted index of groups (binary search). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tuning/tuning.h"

typedef struct entry {
    tj_tune_target target;
    tj_tune_workload wl;
    char *config;
    double best;            /* the median of the ok records' medians, INFINITY if none */
    double first;           /* the first ok record's median: what a search decided on */
    double *oks;            /* every ok record's median */
    int64_t n_ok, n_fail;
    int wrong;              /* any wrong_result: never chosen */
    int dense;              /* the dense path's config (TJ_TUNE_DENSE_CONFIG) */
    tj_tune_status fail_status;
} entry;

/* One candidate of the lookup index: an eligible entry seen under one match kind. */
typedef struct group {
    int kind;               /* tj_tune_match */
    int dense;              /* the dense path's records form their own groups */
    const char *backend;
    const char *scope;      /* device name or arch */
    uint64_t key;           /* pattern hash or shape key */
    int bucket;
    double cost;            /* seconds per token */
    const entry *e;
} group;

struct tj_tune_db {
    entry *e;
    int64_t n, cap;
    int64_t *slots;         /* open addressing over e, -1 empty */
    int64_t nslots;
    int64_t bad_lines;
    group *g;               /* first of each (kind, backend, scope, key, bucket) run */
    int64_t ng;
    int dirty;
};

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}
static uint64_t fnv_s(uint64_t h, const char *s) { return fnv(h, s, strlen(s) + 1); }

static uint64_t entry_hash(const tj_tune_target *t, const tj_tune_workload *w, const char *config)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv_s(h, t->backend);
    h = fnv_s(h, t->device);
    h = fnv(h, &w->pattern_hash, sizeof w->pattern_hash);
    h = fnv(h, &w->m, sizeof w->m);
    h = fnv_s(h, w->dtype);
    return fnv_s(h, config);
}

static int entry_is(const entry *e, const tj_tune_target *t, const tj_tune_workload *w, const char *config)
{
    return e->wl.pattern_hash == w->pattern_hash && e->wl.m == w->m && strcmp(e->config, config) == 0 &&
           strcmp(e->target.backend, t->backend) == 0 && strcmp(e->target.device, t->device) == 0 &&
           strcmp(e->wl.dtype, w->dtype) == 0;
}

tj_status tj_tune_db_create(tj_tune_db **out, tj_error *err)
{
    *out = calloc(1, sizeof **out);
    return *out ? TJ_OK : tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
}

void tj_tune_db_destroy(tj_tune_db *db)
{
    if (!db) return;
    for (int64_t i = 0; i < db->n; i++) {
        free(db->e[i].config);
        free(db->e[i].oks);
    }
    free(db->e);
    free(db->slots);
    free(db->g);
    free(db);
}

int64_t tj_tune_db_size(const tj_tune_db *db) { return db ? db->n : 0; }
int64_t tj_tune_db_bad_lines(const tj_tune_db *db) { return db ? db->bad_lines : 0; }

static int64_t *slot_for(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                         const char *config)
{
    if (!db->nslots) return NULL;
    uint64_t mask = (uint64_t)db->nslots - 1;
    for (uint64_t i = entry_hash(t, w, config) & mask;; i = (i + 1) & mask) {
        int64_t *s = &db->slots[i];
        if (*s < 0 || entry_is(&db->e[*s], t, w, config)) return s;
    }
}

static tj_status rehash(tj_tune_db *db, tj_error *err)
{
    int64_t ns = db->nslots ? db->nslots * 2 : 256;
    int64_t *slots = malloc((size_t)ns * sizeof *slots);
    if (!slots) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < ns; i++) slots[i] = -1;
    free(db->slots);
    db->slots = slots;
    db->nslots = ns;
    for (int64_t i = 0; i < db->n; i++) *slot_for(db, &db->e[i].target, &db->e[i].wl, db->e[i].config) = i;
    return TJ_OK;
}

tj_status tj_tune_db_add(tj_tune_db *db, const tj_tune_record *r, tj_error *err)
{
    if (!r->config) return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "tuning record without a config");
    if (2 * (db->n + 1) > db->nslots) TJ_TRY(rehash(db, err));
    int64_t *slot = slot_for(db, &r->target, &r->wl, r->config);
    entry *e;
    if (*slot >= 0) {
        e = &db->e[*slot];
    } else {
        if (db->n == db->cap) {
            int64_t cap = db->cap ? 2 * db->cap : 64;
            entry *ne = realloc(db->e, (size_t)cap * sizeof *ne);
            if (!ne) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
            db->e = ne;
            db->cap = cap;
        }
        e = &db->e[db->n];
        memset(e, 0, sizeof *e);
        if (!(e->config = strdup(r->config))) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        e->target = r->target;
        e->wl = r->wl;
        e->best = e->first = INFINITY;
        e->dense = strcmp(e->config, TJ_TUNE_DENSE_CONFIG) == 0; /* records hold canonical text */
        *slot = db->n++;
    }
    if (r->status == TJ_TUNE_OK) {
        double *oks = realloc(e->oks, (size_t)(e->n_ok + 1) * sizeof *oks);
        if (!oks) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
        e->oks = oks;
        if (!e->n_ok) e->first = r->median;
        /* insertion keeps oks sorted: the median of repeated measurements (confirmation rounds,
         * merged reruns) is robust to one lucky or unlucky run, and independent of order */
        int64_t i = e->n_ok++;
        while (i > 0 && oks[i - 1] > r->median) {
            oks[i] = oks[i - 1];
            i--;
        }
        oks[i] = r->median;
        int64_t n = e->n_ok;
        e->best = n % 2 ? oks[n / 2] : 0.5 * (oks[n / 2 - 1] + oks[n / 2]);
    } else {
        e->n_fail++;
        e->fail_status = r->status;
        if (r->status == TJ_TUNE_WRONG_RESULT) e->wrong = 1;
    }
    /* The arch of the newest record wins; a device keeps one arch in practice. */
    if (r->target.arch[0]) memcpy(e->target.arch, r->target.arch, sizeof e->target.arch);
    db->dirty = 1;
    return TJ_OK;
}

static tj_status add_cb(void *user, const tj_tune_record *r, tj_error *err) { return tj_tune_db_add(user, r, err); }

tj_status tj_tune_db_load(tj_tune_db *db, const char *path, int missing_ok, tj_error *err)
{
    return tj_tune_log_read(path, missing_ok, add_cb, db, &db->bad_lines, err);
}

int tj_tune_db_find(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                    const char *config, tj_tune_status *status, double *median)
{
    int64_t *s = slot_for(db, t, w, config);
    if (!s || *s < 0) return 0;
    const entry *e = &db->e[*s];
    if (status) *status = e->wrong ? TJ_TUNE_WRONG_RESULT : e->n_ok ? TJ_TUNE_OK : e->fail_status;
    if (median) *median = e->wrong ? INFINITY : e->first;
    return 1;
}

double tj_tune_db_cost(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                       const char *config)
{
    int64_t *s = slot_for(db, t, w, config);
    if (!s || *s < 0 || db->e[*s].wrong) return INFINITY;
    return db->e[*s].best;
}

int64_t tj_tune_db_records(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                           const char *config)
{
    int64_t *s = slot_for(db, t, w, config);
    return s && *s >= 0 ? db->e[*s].n_ok + db->e[*s].n_fail : 0;
}

int tj_tune_m_bucket(int64_t m)
{
    int b = 0;
    while (b < 62 && ((int64_t)1 << b) < m) b++;
    return b;
}

const char *tj_tune_match_name(tj_tune_match m)
{
    switch (m) {
    case TJ_TUNE_MATCH_DEVICE_PATTERN: return "device, pattern";
    case TJ_TUNE_MATCH_DEVICE_SHAPE: return "device, shape";
    case TJ_TUNE_MATCH_ARCH_PATTERN: return "arch family, pattern";
    case TJ_TUNE_MATCH_ARCH_SHAPE: return "arch family, shape";
    default: return "none (built-in default)";
    }
}

/* n, k, g and the density rounded to 5 %: layers of one model shape pruned alike share it. */
static uint64_t shape_key(int64_t n, int64_t k, int64_t g, int64_t kept)
{
    double d = n > 0 && k > 0 ? (double)kept / ((double)n * (double)k) : 0;
    int64_t v[4] = {n, k, g, (int64_t)llround(d * 20)};
    return fnv(0xcbf29ce484222325ull, v, sizeof v);
}

static int cmp_u64(uint64_t a, uint64_t b) { return a < b ? -1 : a > b; }
static int cmp_dbl(double a, double b) { return a < b ? -1 : a > b; }

/* Order of the index: the group key, then the choice within a group. */
static int group_key_cmp(const group *a, const group *b)
{
    int c;
    if (a->kind != b->kind) return a->kind < b->kind ? -1 : 1;
    if (a->dense != b->dense) return a->dense < b->dense ? -1 : 1;
    if ((c = strcmp(a->backend, b->backend))) return c;
    if ((c = strcmp(a->scope, b->scope))) return c;
    return cmp_u64(a->key, b->key);
}

static int group_cmp(const void *pa, const void *pb)
{
    const group *a = pa, *b = pb;
    int c = group_key_cmp(a, b);
    if (c) return c;
    if (a->bucket != b->bucket) return a->bucket < b->bucket ? -1 : 1;
    if ((c = cmp_dbl(a->cost, b->cost))) return c;
    if ((c = strcmp(a->e->config, b->e->config))) return c;
    return a->e->wl.m < b->e->wl.m ? -1 : a->e->wl.m > b->e->wl.m;
}

static tj_status build_index(tj_tune_db *db, tj_error *err)
{
    if (!db->dirty && (db->g || db->n == 0)) return TJ_OK;
    free(db->g);
    db->g = NULL;
    db->ng = 0;
    group *all = malloc((size_t)(4 * db->n + 1) * sizeof *all);
    if (!all) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    int64_t na = 0;
    for (int64_t i = 0; i < db->n; i++) {
        const entry *e = &db->e[i];
        if (e->wrong || !e->n_ok || !isfinite(e->best)) continue;
        for (int kind = 0; kind < 4; kind++) {
            group *g = &all[na++];
            g->kind = kind;
            g->dense = e->dense;
            g->backend = e->target.backend;
            g->scope = kind < 2 ? e->target.device : e->target.arch;
            g->key = kind % 2 == 0 ? e->wl.pattern_hash : shape_key(e->wl.n, e->wl.k, e->wl.g, e->wl.kept);
            g->bucket = tj_tune_m_bucket(e->wl.m);
            g->cost = e->best / (double)e->wl.m;
            g->e = e;
        }
    }
    qsort(all, (size_t)na, sizeof *all, group_cmp);
    int64_t ng = 0;
    for (int64_t i = 0; i < na; i++)
        if (ng == 0 || group_key_cmp(&all[ng - 1], &all[i]) != 0 || all[ng - 1].bucket != all[i].bucket)
            all[ng++] = all[i];
    db->g = all;
    db->ng = ng;
    db->dirty = 0;
    return TJ_OK;
}

static tj_status best_of(tj_tune_db *db, int dense, const char *backend, const char *device, const char *arch,
                         const tj_layer *l, int64_t m, tj_tune_choice *out)
{
    tj_error err;
    memset(out, 0, sizeof *out);
    out->match = TJ_TUNE_MATCH_NONE;
    if (!db || build_index(db, &err) != TJ_OK || db->ng == 0) return TJ_ERR_NOT_FOUND;
    int want = m > 0 ? tj_tune_m_bucket(m) : 1000;
    for (int kind = 0; kind < 4; kind++) {
        const char *scope = kind < 2 ? device : arch;
        if (!scope || !*scope) continue;
        group probe = {.kind = kind, .dense = dense, .backend = backend, .scope = scope,
                       .key = kind % 2 == 0 ? l->hash : shape_key(l->n, l->k, l->g, tj_layer_kept(l))};
        int64_t lo = 0, hi = db->ng; /* first group with key >= probe */
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (group_key_cmp(&db->g[mid], &probe) < 0) lo = mid + 1;
            else hi = mid;
        }
        const group *best = NULL;
        for (int64_t i = lo; i < db->ng && group_key_cmp(&db->g[i], &probe) == 0; i++) {
            int d = abs(db->g[i].bucket - want);
            /* nearest bucket; on a tie the later (larger) one, as buckets ascend */
            if (!best || d <= abs(best->bucket - want)) best = &db->g[i];
        }
        if (best) {
            out->config = best->e->config;
            out->median = best->e->best;
            out->m_tuned = best->e->wl.m;
            out->match = (tj_tune_match)kind;
            out->device = best->e->target.device;
            return TJ_OK;
        }
    }
    return TJ_ERR_NOT_FOUND;
}

tj_status tj_tune_db_best(tj_tune_db *db, const char *backend, const char *device, const char *arch,
                          const tj_layer *l, int64_t m, tj_tune_choice *out)
{
    return best_of(db, 0, backend, device, arch, l, m, out);
}

tj_status tj_tune_db_best_dense(tj_tune_db *db, const char *backend, const char *device, const char *arch,
                                const tj_layer *l, int64_t m, tj_tune_choice *out)
{
    return best_of(db, 1, backend, device, arch, l, m, out);
}

int tj_tune_db_path(tj_tune_db *db, const char *backend, const char *device, const char *arch, const tj_layer *l,
                    int64_t m, char *why, size_t cap)
{
    tj_tune_choice kern, dense;
    if (why && cap) why[0] = '\0';
    if (best_of(db, 1, backend, device, arch, l, m, &dense) != TJ_OK ||
        best_of(db, 0, backend, device, arch, l, m, &kern) != TJ_OK)
        return -1; /* the tuner measures both; one alone decides nothing */
    double cd = dense.median / (double)dense.m_tuned, ck = kern.median / (double)kern.m_tuned;
    if (why)
        snprintf(why, cap, "tuning records: dense path %.4f ms at M %lld, best kernel %s %.4f ms at M %lld",
                 1e3 * dense.median, (long long)dense.m_tuned, kern.config, 1e3 * kern.median, (long long)kern.m_tuned);
    return cd < ck;
}

/* --- per-group report ------------------------------------------------------------------ */

static int row_cmp(const void *pa, const void *pb)
{
    const entry *a = *(const entry *const *)pa, *b = *(const entry *const *)pb;
    int c;
    if ((c = strcmp(a->target.backend, b->target.backend))) return c;
    if ((c = strcmp(a->target.device, b->target.device))) return c;
    if ((c = strcmp(a->wl.layer, b->wl.layer))) return c;
    if ((c = cmp_u64(a->wl.pattern_hash, b->wl.pattern_hash))) return c;
    int ba = tj_tune_m_bucket(a->wl.m), bb = tj_tune_m_bucket(b->wl.m);
    if (ba != bb) return ba < bb ? -1 : 1;
    int ea = !a->wrong && a->n_ok > 0, eb = !b->wrong && b->n_ok > 0;
    if (ea != eb) return ea ? -1 : 1;
    if ((c = cmp_dbl(a->best / (double)a->wl.m, b->best / (double)b->wl.m))) return c;
    if ((c = strcmp(a->config, b->config))) return c;
    return a->wl.m < b->wl.m ? -1 : a->wl.m > b->wl.m;
}

static int same_row_group(const entry *a, const entry *b)
{
    return strcmp(a->target.backend, b->target.backend) == 0 && strcmp(a->target.device, b->target.device) == 0 &&
           strcmp(a->wl.layer, b->wl.layer) == 0 && a->wl.pattern_hash == b->wl.pattern_hash &&
           tj_tune_m_bucket(a->wl.m) == tj_tune_m_bucket(b->wl.m);
}

tj_status tj_tune_db_each_best(tj_tune_db *db, tj_tune_best_fn fn, void *user, tj_error *err)
{
    const entry **v = malloc((size_t)(db->n + 1) * sizeof *v);
    if (!v) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
    for (int64_t i = 0; i < db->n; i++) v[i] = &db->e[i];
    qsort(v, (size_t)db->n, sizeof *v, row_cmp);
    for (int64_t i = 0; i < db->n;) {
        int64_t j = i, failed = 0;
        while (j < db->n && same_row_group(v[i], v[j])) {
            if (v[j]->wrong || !v[j]->n_ok) failed++;
            j++;
        }
        const entry *e = v[i];
        int ok = !e->wrong && e->n_ok > 0;
        tj_tune_best_row row = {
            .backend = e->target.backend, .device = e->target.device, .arch = e->target.arch,
            .layer = e->wl.layer, .pattern_hash = e->wl.pattern_hash, .n = e->wl.n, .k = e->wl.k,
            .g = e->wl.g, .kept = e->wl.kept, .m = e->wl.m, .bucket = tj_tune_m_bucket(e->wl.m),
            .config = ok ? e->config : NULL, .median = ok ? e->best : INFINITY,
            .measured = j - i, .failed = failed};
        if (fn(user, &row)) break;
        i = j;
    }
    free(v);
    return TJ_OK;
}

/* The db of the log at *path (NULL or "": $TILEJIT_TUNING_LOG, then *path is it); *db NULL when
 * there is no log to read. */
static tj_status log_db(const char **path, tj_tune_db **db, tj_error *err)
{
    *db = NULL;
    if (!*path || !**path) *path = getenv("TILEJIT_TUNING_LOG");
    if (!*path || !**path) return TJ_OK;
    TJ_TRY(tj_tune_db_create(db, err));
    tj_status s = tj_tune_db_load(*db, *path, 0, err);
    if (s != TJ_OK) {
        tj_tune_db_destroy(*db);
        *db = NULL;
    }
    return s;
}

tj_status tj_tune_config_from_log(const char *path, const char *backend, const tj_layer *l, int64_t m,
                                  char **config, char *note, size_t note_cap, tj_error *err)
{
    *config = NULL;
    if (note && note_cap) note[0] = '\0';
    tj_tune_db *db = NULL;
    tj_status s = log_db(&path, &db, err);
    if (s == TJ_OK && db) {
        tj_tune_target host;
        tj_tune_host_target(&host);
        tj_tune_choice ch;
        if (tj_tune_db_best(db, backend, host.device, host.arch, l, m, &ch) == TJ_OK) {
            if (!(*config = strdup(ch.config))) s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory");
            else if (note)
                snprintf(note, note_cap, "tuning: layer '%s' (M %lld): config %s from %s (match: %s; measured on %s at M %lld: %.4f ms)",
                         l->name, (long long)m, ch.config, path, tj_tune_match_name(ch.match), ch.device,
                         (long long)ch.m_tuned, 1e3 * ch.median);
        } else if (note) {
            snprintf(note, note_cap, "tuning: layer '%s' (M %lld): no record in %s for %s on %s / %s; built-in default",
                     l->name, (long long)m, path, backend, host.device, host.arch);
        }
    }
    tj_tune_db_destroy(db);
    return s;
}

tj_status tj_tune_path_from_log(const char *path, const char *backend, const tj_layer *l, int64_t m, int *dense,
                                char *why, size_t cap, tj_error *err)
{
    *dense = -1;
    if (why && cap) why[0] = '\0';
    tj_tune_db *db = NULL;
    tj_status s = log_db(&path, &db, err);
    if (s == TJ_OK && db) {
        tj_tune_target host;
        tj_tune_host_target(&host);
        *dense = tj_tune_db_path(db, backend, host.device, host.arch, l, m, why, cap);
    }
    tj_tune_db_destroy(db);
    return s;
}
