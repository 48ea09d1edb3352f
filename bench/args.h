/* bench/: what the benchmark drivers (`tilejit bench`'s backends) add to the option parser they
 * share with tilejit-measure (base/args.h): reading a --config value. Messages go to the stream
 * the caller of the driver gives, prefixed as its parser's ("tilejit bench"). */
#ifndef TJ_BENCH_ARGS_H
#define TJ_BENCH_ARGS_H

#include <stdio.h>

#include "base/args.h"
#include "tilejit.h"

/* A --config value: JSON text as given, or the content of the file it names (malloc'ed); NULL
 * after a message "WHO: ...". */
char *bench_read_config(FILE *errs, const char *who, const char *value);

#endif
