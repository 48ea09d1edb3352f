/* tuning/: the tuning-record format and the best-config database. Stage below runtime/ (which
 * asks it for a layer's config) and autotune/ (which writes it): one JSON Lines record per
 * measurement (records.c) → merged logs and best-config lookup (db.c).
 *
 * Configs travel as canonical JSON text (compact, keys sorted), the same text the backends'
 * *_config_from_json read; a config's identity is that text. */
#ifndef TJ_TUNING_H
#define TJ_TUNING_H

#include <stdint.h>

#include "base/error.h"
#include "pattern/pattern.h"

/* The record, target, workload and best-row types are public: tilejit/tune.h. */

#define TJ_TUNE_FORMAT "tilejit-tune"
#define TJ_TUNE_VERSION 1

/* ---- records (records.c) ----------------------------------------------------------------- */


const char *tj_tune_status_name(tj_tune_status s);
int tj_tune_status_parse(const char *s, tj_tune_status *out); /* 1 on success */



void tj_tune_record_free(tj_tune_record *r);
/* The dense path's config: a record with it measured the layer on a dense library over its masked
 * weights (runtime/dense_path.c) instead of a generated kernel. Canonical text. A backend never
 * builds it: the runtime compares its records with the best kernel config's (docs/dense-path.md). */
#define TJ_TUNE_DENSE_CONFIG "{\"path\":\"dense\"}"
/* 1 when config (any JSON text) is the dense path's. */
int tj_tune_config_is_dense(const char *config);
/* Canonical JSON of a config text: compact with sorted keys; malloc'ed in *out. */
tj_status tj_tune_config_canonical(const char *json, char **out, tj_error *err);
/* One record as one JSON line (no newline), malloc'ed in *out. */
tj_status tj_tune_record_to_json(const tj_tune_record *r, char **out, tj_error *err);
/* Parses one line; `what` names it in messages ("log.jsonl:12"). */
tj_status tj_tune_record_parse(const char *line, const char *what, tj_tune_record *out, tj_error *err);
/* Appends one record as one write(2) on an O_APPEND descriptor (whole lines even when several
 * processes append to one file on a local disk), then fsyncs. Fills tool and timestamp if empty. */
tj_status tj_tune_log_append(const char *path, tj_tune_record *r, tj_error *err);
/* Begins a log for a sweep that is shard I of N (0 of 1 unsharded): a missing or empty file gets
 * one header line, {"format":"tilejit-tune","version":1,"kind":"header","shard":"I/N",
 * "backend":...,"tool":...,"timestamp":...}, so every sweep leaves a log even when its share is
 * empty. A non-empty file is resumed: a torn last line (no newline) is ended so the next record
 * stays whole, and a sharded sweep (N > 1) refuses a log whose header names another I/N
 * (TJ_ERR_INVALID_ARGUMENT). */
tj_status tj_tune_log_begin(const char *path, const char *backend, int shard, int nshards, tj_error *err);
/* Calls fn for every measurement of a log in file order. Blank lines and lines of another kind
 * ("kind" other than "measurement": headers) are skipped; a malformed line (e.g. the torn last
 * line of a killed run) is counted in *bad_lines (may be NULL) and skipped, never fatal. A
 * missing file is TJ_ERR_IO unless missing_ok. */
typedef tj_status (*tj_tune_record_fn)(void *user, const tj_tune_record *r, tj_error *err);
tj_status tj_tune_log_read(const char *path, int missing_ok, tj_tune_record_fn fn, void *user,
                           int64_t *bad_lines, tj_error *err);

/* The workload of a layer at batch m. */
void tj_tune_workload_of(const tj_layer *l, int64_t m, tj_tune_workload *out);

/* This host as a CPU target: device = /proc/cpuinfo model name, arch = machine + widest ISA. */
void tj_tune_host_target(tj_tune_target *out);

/* ---- database (db.c) --------------------------------------------------------------------- */

/* Merged records with best-config lookup. A (target device, workload, M, config) measured more
 * than once counts with the median of its ok records' medians (confirmation rounds, reruns);
 * any wrong_result excludes the config for good.
 * The best config of a group is the one with the lowest cost per token (median / M), ties
 * broken by the config text, then by M, so the choice never depends on file order. */
typedef struct tj_tune_db tj_tune_db;

tj_status tj_tune_db_create(tj_tune_db **out, tj_error *err);
void tj_tune_db_destroy(tj_tune_db *db);
tj_status tj_tune_db_add(tj_tune_db *db, const tj_tune_record *r, tj_error *err);
/* Merges a log file (missing_ok: a missing file is an empty log). */
tj_status tj_tune_db_load(tj_tune_db *db, const char *path, int missing_ok, tj_error *err);
int64_t tj_tune_db_size(const tj_tune_db *db);      /* distinct (target, workload, config) */
int64_t tj_tune_db_bad_lines(const tj_tune_db *db); /* malformed lines skipped while loading */

/* Resume: whether (target device, workload, config) is already in the db; when it is, *status
 * and *median (the first ok record's: what a search decided on, else INFINITY) say how it went. */
int tj_tune_db_find(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                    const char *config, tj_tune_status *status, double *median);
/* The cost the best-config choice uses: the median of the ok records' medians; INFINITY when
 * none is ok, the config ever gave a wrong result, or it is not in the db. */
double tj_tune_db_cost(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                       const char *config);
/* How many records (any status) the db holds for (target device, workload, config). */
int64_t tj_tune_db_records(const tj_tune_db *db, const tj_tune_target *t, const tj_tune_workload *w,
                           const char *config);

/* M buckets: bucket(m) = ceil(log2 m), so 1, 2, 3–4, 5–8, …, 2049–4096 … A lookup takes the
 * tuned bucket nearest to bucket(m) (ties: the larger). */
int tj_tune_m_bucket(int64_t m);
/* The runtime's M classes (the CPU backend's per-M variants, the dense-path choice): the first
 * TJ_M_CLASSES - 1 buckets, M ≤ 1, 2, 4, …, TJ_M_TOP, and one open class above TJ_M_TOP, which
 * takes the choice of the class below it where a rule needs a size. */
#define TJ_M_CLASSES 14
#define TJ_M_TOP ((int64_t)1 << (TJ_M_CLASSES - 2))

/* How a lookup matched, most specific first. */
typedef enum tj_tune_match {
    TJ_TUNE_MATCH_DEVICE_PATTERN = 0, /* same device name, same pattern hash */
    TJ_TUNE_MATCH_DEVICE_SHAPE,       /* same device, same n, k, g and density within 5 % */
    TJ_TUNE_MATCH_ARCH_PATTERN,       /* same arch family, same pattern hash */
    TJ_TUNE_MATCH_ARCH_SHAPE,
    TJ_TUNE_MATCH_NONE
} tj_tune_match;

typedef struct tj_tune_choice {
    const char *config;     /* borrowed from the db */
    double median;          /* seconds at m_tuned */
    int64_t m_tuned;
    tj_tune_match match;
    const char *device;     /* borrowed: where it was measured */
} tj_tune_choice;

const char *tj_tune_match_name(tj_tune_match m);
/* Best kernel config for layer l at batch m (m <= 0: the largest tuned M) on backend/device/arch:
 * the dense path's records never answer it. TJ_ERR_NOT_FOUND (err untouched) when no record
 * applies. O(log groups). */
tj_status tj_tune_db_best(tj_tune_db *db, const char *backend, const char *device, const char *arch,
                          const tj_layer *l, int64_t m, tj_tune_choice *out);
/* The same lookup among the dense path's records (config TJ_TUNE_DENSE_CONFIG). */
tj_status tj_tune_db_best_dense(tj_tune_db *db, const char *backend, const char *device, const char *arch,
                                const tj_layer *l, int64_t m, tj_tune_choice *out);
/* Whether layer l runs faster at batch m on the dense path than with its best kernel config, as
 * the records say: 1 yes, 0 no, -1 no say (not both a dense and a kernel record apply). Each
 * side's cost per token at its nearest tuned M, as the best-config choice compares configs.
 * `why` (may be NULL) gets one line naming both records. */
int tj_tune_db_path(tj_tune_db *db, const char *backend, const char *device, const char *arch, const tj_layer *l,
                    int64_t m, char *why, size_t cap);

/* For tools that build kernels without a context (tilejit bench): the best config of layer l at
 * batch m on this host's backend from the log at path (NULL or "": $TILEJIT_TUNING_LOG; neither:
 * no lookup). *config is malloc'ed, or NULL when no record applies (use the built-in default);
 * note (may be NULL) gets one line saying what was chosen and why. */
tj_status tj_tune_config_from_log(const char *path, const char *backend, const tj_layer *l, int64_t m,
                                  char **config, char *note, size_t note_cap, tj_error *err);

/* The same question for tools without a context (tilejit bench), into *dense (1, 0 or -1), from
 * the log at path (NULL or "": $TILEJIT_TUNING_LOG; neither: *dense = -1) on this host. Fails
 * only when the log cannot be read. */
tj_status tj_tune_path_from_log(const char *path, const char *backend, const tj_layer *l, int64_t m, int *dense,
                                char *why, size_t cap, tj_error *err);

/* Every (backend, device, workload, M bucket) group's best, in a stable order, for
 * `tilejit tune --best`. Calls fn until it returns nonzero. */
tj_status tj_tune_db_each_best(tj_tune_db *db, tj_tune_best_fn fn, void *user, tj_error *err);

/* ---- a measurement's result object (records.c) ----------------------------------------- */

/* The measuring child's one line on stdout (status, times, error), and its parsing. */
char *tj_tune_result_to_json(const tj_tune_record *r);
tj_status tj_tune_result_parse(const char *text, tj_tune_record *r, tj_error *err);

#endif
