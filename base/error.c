/* Error objects shared by every stage of the pipeline. */
#include "base/error.h"

#include <stdio.h>
#include <string.h>

tj_status tj_vfail(tj_error *err, tj_status status, const char *fmt, va_list ap)
{
    if (err) {
        err->status = status;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return status;
}

tj_status tj_fail(tj_error *err, tj_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tj_vfail(err, status, fmt, ap);
    va_end(ap);
    return status;
}

void tj_error_prefix(tj_error *err, const char *fmt, ...)
{
    if (!err) return;
    char prefix[512], old[TJ_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* Joined by hand: snprintf("%s: %s") into the same-sized buffer trips -Wformat-truncation. */
    size_t pl = strnlen(prefix, sizeof prefix), ol = strnlen(old, sizeof old - 1), cap = sizeof err->msg - 1;
    size_t at = pl < cap ? pl : cap;
    memcpy(err->msg, prefix, at);
    if (at + 2 <= cap) {
        memcpy(err->msg + at, ": ", 2);
        at += 2;
    }
    size_t rest = ol < cap - at ? ol : cap - at;
    memcpy(err->msg + at, old, rest);
    err->msg[at + rest] = '\0';
}

void tj_error_clear(tj_error *err)
{
    if (!err) return;
    err->status = TJ_OK;
    err->msg[0] = '\0';
}
