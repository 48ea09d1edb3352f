/* bench/: the benchmark drivers' --config reader (see args.h). */
#include "bench/args.h"

#include <stdlib.h>
#include <string.h>

char *bench_read_config(FILE *errs, const char *who, const char *value)
{
    if (!value) return NULL;
    const char *p = value;
    while (*p == ' ' || *p == '\t' || *p == '\n') p++;
    if (*p == '{') {
        char *s = strdup(value);
        if (!s) tj_args_fail(errs, who, "out of memory");
        return s;
    }
    char *buf = NULL;
    tj_error err;
    tj_status s = tj_file_read(value, 0, &buf, NULL, &err);
    if (s == TJ_ERR_OUT_OF_MEMORY) tj_args_fail(errs, who, "out of memory");
    else if (s != TJ_OK) tj_args_fail(errs, who, "--config: '%s' is neither JSON text nor a readable file", value);
    return buf;
}
