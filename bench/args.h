/* bench/: option parsing and messages of the benchmark drivers (`tilejit bench`'s backends),
 * written to the streams the caller of the driver gives: the same `--name value`,
 * `--name=value` and flag forms, and the same messages, as the tilejit command's own parser. */
#ifndef TJ_BENCH_ARGS_H
#define TJ_BENCH_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "tilejit.h"

typedef struct bench_opt {
    const char *name;   /* without dashes; single letter for short forms */
    int has_value;      /* 1: takes a value, 0: a flag */
    const char **value; /* where a value goes (has_value) */
    int *flag;          /* incremented for flags (may be NULL) */
} bench_opt;

/* Prints "tilejit <cmd>: message" on errs and returns 1. */
int bench_fail(FILE *errs, const char *cmd, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Parses argv[1..]: 0 on success, 1 after a message, 2 for --help. */
int bench_parse(FILE *errs, const char *cmd, int argc, char **argv, const bench_opt *opts, const char **pos,
                int max_pos, int *npos);
int bench_parse_int(FILE *errs, const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int bench_parse_double(FILE *errs, const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* A --config value: JSON text as given, or the content of the file it names (malloc'ed); NULL
 * after a message. */
char *bench_read_config(FILE *errs, const char *cmd, const char *value);

#endif
