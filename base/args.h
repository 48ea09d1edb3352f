/* base/: the option parser of the library's own programs: bench/'s drivers (`tilejit bench`'s
 * backends) and the tuner's helper `tilejit-measure` (autotune/measure_main.c). The `--name value`,
 * `--name=value` and flag forms, positionals, `--`, and --help / -h; messages "WHO: message" on
 * the stream the caller gives. The `tilejit` command keeps its own parser of the same forms and
 * messages (cli/cli.c), since cli/ uses the public API alone. */
#ifndef TJ_ARGS_H
#define TJ_ARGS_H

#include <stdint.h>
#include <stdio.h>

typedef struct tj_arg_opt {
    const char *name;   /* without dashes; single letter for short forms */
    int has_value;      /* 1: takes a value, 0: a flag */
    const char **value; /* where a value goes (has_value) */
    int *flag;          /* incremented for flags (may be NULL) */
} tj_arg_opt;

/* Prints "WHO: message" on errs and returns 1. */
int tj_args_fail(FILE *errs, const char *who, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Parses argv[1..] against opts (ended by a NULL name); positionals go to pos (at most max_pos).
 * Returns 0 on success, 1 after a message, 2 for --help or -h (the caller prints its help). */
int tj_args_parse(FILE *errs, const char *who, int argc, char **argv, const tj_arg_opt *opts, const char **pos,
                  int max_pos, int *npos);
/* A whole-string integer / number in [lo, hi] for option `opt`; 0, or 1 after a message. */
int tj_args_parse_int(FILE *errs, const char *who, const char *opt, const char *s, int64_t lo, int64_t hi,
                      int64_t *out);
int tj_args_parse_double(FILE *errs, const char *who, const char *opt, const char *s, double lo, double hi,
                         double *out);

#endif
