/* base/: the option parser of bench/'s drivers and tilejit-measure (see args.h). */
#include "base/args.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int tj_args_fail(FILE *errs, const char *who, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(errs, "%s: ", who);
    vfprintf(errs, fmt, ap);
    fputc('\n', errs);
    va_end(ap);
    return 1;
}

int tj_args_parse(FILE *errs, const char *who, int argc, char **argv, const tj_arg_opt *opts, const char **pos,
                  int max_pos, int *npos)
{
    *npos = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (*npos >= max_pos) return tj_args_fail(errs, who, "unexpected argument '%s' (see --help)", a);
            pos[(*npos)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) { only_pos = 1; continue; }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 2;
        const char *name = a[1] == '-' ? a + 2 : a + 1;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const tj_arg_opt *o = NULL;
        for (const tj_arg_opt *p = opts; p && p->name; p++)
            if (strlen(p->name) == nlen && strncmp(p->name, name, nlen) == 0) { o = p; break; }
        if (!o) return tj_args_fail(errs, who, "unknown option '%.*s' (see --help)", (int)(nlen + (size_t)(name - a)), a);
        if (!o->has_value) {
            if (eq) return tj_args_fail(errs, who, "option '--%s' takes no value", o->name);
            if (o->flag) (*o->flag)++;
            continue;
        }
        if (eq) *o->value = eq + 1;
        else if (i + 1 < argc) *o->value = argv[++i];
        else return tj_args_fail(errs, who, "option '--%s' needs a value", o->name);
    }
    return 0;
}

int tj_args_parse_int(FILE *errs, const char *who, const char *opt, const char *s, int64_t lo, int64_t hi,
                      int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return tj_args_fail(errs, who, "--%s: '%s' is not an integer in [%lld, %lld]", opt, s, (long long)lo,
                            (long long)hi);
    *out = v;
    return 0;
}

int tj_args_parse_double(FILE *errs, const char *who, const char *opt, const char *s, double lo, double hi,
                         double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return tj_args_fail(errs, who, "--%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
    *out = v;
    return 0;
}
