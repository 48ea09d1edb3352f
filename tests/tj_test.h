/* Minimal test harness: CHECK macros that count failures, random data, relative error.
 * A test program returns tj_test_end() (0 pass, 1 fail) or 77 to skip (meson's convention). */
#ifndef TJ_TEST_H
#define TJ_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

static int tj_test_failures = 0, tj_test_checks = 0;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        tj_test_checks++;                                                            \
        if (!(cond)) {                                                               \
            tj_test_failures++;                                                      \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define CHECKF(cond, ...)                                                          \
    do {                                                                           \
        tj_test_checks++;                                                          \
        if (!(cond)) {                                                             \
            tj_test_failures++;                                                    \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
        }                                                                          \
    } while (0)

/* The status is TJ_OK; otherwise print the error message. */
#define CHECK_OK(expr, errp)                                                             \
    do {                                                                                 \
        tj_status s_ = (expr);                                                           \
        tj_test_checks++;                                                                \
        if (s_ != TJ_OK) {                                                               \
            tj_test_failures++;                                                          \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, (errp)->msg); \
        }                                                                                \
    } while (0)

static inline int tj_test_end(void)
{
    printf("%d checks, %d failed\n", tj_test_checks, tj_test_failures);
    return tj_test_failures ? 1 : 0;
}

static inline void tj_test_fill(tj_rng *r, float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++) p[i] = tj_rng_uniform(r);
}

/* ‖a − b‖ / ‖b‖ in double (b all zero: returns ‖a‖). */
static inline double tj_test_relerr(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline int tj_test_all_finite(const float *a, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}

#endif
