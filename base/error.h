/* Caller-owned error objects: a status and one message (file, layer, field, value; or the
 * foreign library's own message and log). Every internal fallible function takes one. */
#ifndef TJ_ERROR_H
#define TJ_ERROR_H

#include <stdarg.h>
#include <string.h>
#include "tilejit.h"

/* tj_error itself (status and message) is public: tilejit.h. */

/* Sets err (if not NULL) and returns status, so callers can write `return tj_fail(...)`. */
tj_status tj_fail(tj_error *err, tj_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
tj_status tj_vfail(tj_error *err, tj_status status, const char *fmt, va_list ap);
/* Prepends "prefix: " to an error already set. */
void tj_error_prefix(tj_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tj_error_clear(tj_error *err);

#define TJ_TRY(expr)                       \
    do {                                   \
        tj_status tj_try_s_ = (expr);      \
        if (tj_try_s_ != TJ_OK) return tj_try_s_; \
    } while (0)

/* Public options structs start with `size_t size` (set by their _default()). Copies the first
 * `size` bytes of the caller's struct over dst, which holds the defaults, so fields added after
 * the caller was compiled keep their defaults. 0 when size is smaller than the field itself
 * (a struct not made by _default()). */
static inline int tj_options_in(void *dst, size_t dst_size, const void *src)
{
    size_t n;
    memcpy(&n, src, sizeof n);
    if (n < sizeof n) return 0;
    memcpy(dst, src, n < dst_size ? n : dst_size);
    memcpy(dst, &dst_size, sizeof dst_size);
    return 1;
}

/* Checked size arithmetic: return 0 on overflow. */
static inline int tj_mul_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out) && *out >= 0;
}
static inline int tj_add_ok(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out) && *out >= 0;
}

#endif
