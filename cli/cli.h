/* Shared pieces of the `tilejit` command: option parsing, error reporting, the command table.
 * The CLI uses the public API alone (tilejit.h and the headers under tilejit/; scripts/check-layers checks). */
#ifndef TJ_CLI_H
#define TJ_CLI_H

#include <stdint.h>

#include "tilejit.h"

/* A command's entry point; argv[0] is the command name. Returns the process exit code:
 * 0 success, 1 bad input or failure (one message on stderr). */
typedef int (*tj_cmd_fn)(int argc, char **argv);

typedef struct tj_cmd {
    const char *name;
    const char *summary;
    tj_cmd_fn run;
} tj_cmd;

/* Prints "tilejit <cmd>: message" on stderr and returns 1. */
int cli_fail(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Option parsing: a tiny getopt_long-like scanner over `--name value`, `--name=value` and flags.
 * Unknown options and missing values are errors with a message naming them. */
typedef struct cli_opt {
    const char *name;   /* without dashes, e.g. "weights"; single letter for short forms ("o") */
    int has_value;      /* 1: takes a value, 0: a flag */
    const char **value; /* where a value goes (has_value) */
    int *flag;          /* incremented for flags (may be NULL) */
} cli_opt;

/* Parses argv[1..]; positionals are collected into pos (at most max_pos). Returns 0 on success,
 * 1 after printing a message; 2 if --help was given (help printed by the caller). */
int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, const char **pos,
              int max_pos, int *npos);

int cli_parse_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
/* "PREFIX: message" in err (the library keeps its own tj_error_prefix internal). */
void cli_error_prefix(tj_error *err, const char *prefix);
int cli_parse_backend(const char *cmd, const char *s, tj_backend *out);
/* --precision auto|f32|bf16 */
int cli_parse_precision(const char *cmd, const char *s, tj_precision *out);

int cmd_inspect(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_compile(int argc, char **argv);
/* A --config value: JSON text as given, or the content of the file it names (malloc'ed); NULL
 * after printing a message (cmd_gen.c). */
char *cli_read_config(const char *cmd, const char *value);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_prune(int argc, char **argv);
/* `tilejit prune`'s option values as given (NULL when absent), parsed once by cmd_prune.c for
 * both of its paths: the plain one (cmd_prune.c) and the calibrated one (cmd_prune_calib.c). */
typedef struct cli_prune_args {
    const char *weights, *sparsity, *g, *mode, *ew, *tew_base, *layers, *scores, *out, *pruned;
    /* the calibrated path's own (unknown options on the plain path) */
    const char *calibration, *allocation, *profile, *budget_ms, *damp, *threads, *sweep_out, *sweep_steps,
        *sweep_weights;
    int quiet;
} cli_prune_args;
/* The layers to prune: --weights and --scores opened, the layers --layers selects. */
typedef struct cli_prune_input {
    tj_st_file *weights, *scores; /* scores NULL without --scores */
    tj_prune_layer_in *layers;
    int64_t nlayers;
} cli_prune_input;
/* Shared by both paths (prune_shared.c). --sparsity into *out, in [0, 1); 1 after a message. */
int cli_prune_sparsity(const char *s, double *out);
/* --g, --mode, --ew and --tew-base (checked in this order) into opt; 1 after a message. */
int cli_prune_shape(const cli_prune_args *a, tj_prune_options *opt);
/* Opens --weights and --scores (its errors prefixed "--scores") and selects the layers; in starts
 * zeroed. On failure err says why; cli_prune_input_close releases what was opened either way. */
tj_status cli_prune_input_open(const cli_prune_args *a, cli_prune_input *in, tj_error *err);
void cli_prune_input_close(cli_prune_input *in);
/* The plain pruner over the selected layers: writes -o (and --pruned-weights), prints the summary;
 * *prune_s (opening, selecting, pruning) and *write_s get the times when not NULL. Returns the exit
 * code, 1 after a message. */
int cli_prune_plain(const cli_prune_args *a, const tj_prune_options *opt, double *prune_s, double *write_s);
/* The calibrated path of prune (cmd_prune_calib.c): taken when argv has one of its options. */
int cli_prune_wants_calibrated(int argc, char **argv);
int cmd_prune_calibrated(const cli_prune_args *a);
int cmd_pattern(int argc, char **argv);
/* Per-layer density and FLOP reduction table plus totals (prune_shared.c; prune and pattern). */
void cli_print_pattern_summary(const tj_pattern *p);
int cmd_model(int argc, char **argv);
int cmd_tune(int argc, char **argv);

#endif
