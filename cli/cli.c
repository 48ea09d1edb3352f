/* Option parsing and error reporting shared by every command. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cli_fail(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "tilejit %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

int cli_parse(const char *cmd, int argc, char **argv, const cli_opt *opts, const char **pos,
              int max_pos, int *npos)
{
    *npos = 0;
    int only_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (only_pos || a[0] != '-' || a[1] == '\0') {
            if (*npos >= max_pos) return cli_fail(cmd, "unexpected argument '%s' (see --help)", a);
            pos[(*npos)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) { only_pos = 1; continue; }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 2;
        const char *name = a[1] == '-' ? a + 2 : a + 1;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const cli_opt *o = NULL;
        for (const cli_opt *p = opts; p && p->name; p++)
            if (strlen(p->name) == nlen && strncmp(p->name, name, nlen) == 0) { o = p; break; }
        if (!o) return cli_fail(cmd, "unknown option '%.*s' (see --help)", (int)(nlen + (size_t)(name - a)), a);
        if (!o->has_value) {
            if (eq) return cli_fail(cmd, "option '--%s' takes no value", o->name);
            if (o->flag) (*o->flag)++;
            continue;
        }
        if (eq) *o->value = eq + 1;
        else if (i + 1 < argc) *o->value = argv[++i];
        else return cli_fail(cmd, "option '--%s' needs a value", o->name);
    }
    return 0;
}

int cli_parse_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return cli_fail(cmd, "--%s: '%s' is not an integer in [%lld, %lld]", opt, s, (long long)lo, (long long)hi);
    *out = v;
    return 0;
}

int cli_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return cli_fail(cmd, "--%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
    *out = v;
    return 0;
}

int cli_parse_backend(const char *cmd, const char *s, tj_backend *out)
{
    if (strcmp(s, "auto") == 0) *out = TJ_BACKEND_AUTO;
    else if (strcmp(s, "reference") == 0) *out = TJ_BACKEND_REFERENCE;
    else if (strcmp(s, "cpu") == 0) *out = TJ_BACKEND_CPU;
    else if (strcmp(s, "cuda") == 0) *out = TJ_BACKEND_CUDA;
    else return cli_fail(cmd, "--backend: unknown backend '%s' (expected auto, cpu, cuda or reference)", s);
    return 0;
}

int cli_parse_precision(const char *cmd, const char *s, tj_precision *out)
{
    if (strcmp(s, "auto") == 0) *out = TJ_PRECISION_AUTO;
    else if (strcmp(s, "f32") == 0) *out = TJ_PRECISION_F32;
    else if (strcmp(s, "bf16") == 0) *out = TJ_PRECISION_BF16;
    else return cli_fail(cmd, "--precision: '%s' is not auto, f32 or bf16", s);
    return 0;
}

void cli_error_prefix(tj_error *err, const char *prefix)
{
    char old[sizeof err->msg];
    memcpy(old, err->msg, sizeof old);
    size_t pl = strlen(prefix), ol = strnlen(old, sizeof old - 1), cap = sizeof err->msg - 1;
    size_t at = pl < cap ? pl : cap;
    memcpy(err->msg, prefix, at);
    if (at + 2 <= cap) {
        memcpy(err->msg + at, ": ", 2);
        at += 2;
    }
    size_t take = ol < cap - at ? ol : cap - at;
    memcpy(err->msg + at, old, take);
    err->msg[at + take] = 0;
}
