/* Small deterministic RNG (splitmix64) for random patterns, test data and benchmarks. */
#ifndef TJ_RNG_H
#define TJ_RNG_H

#include <stdint.h>

typedef struct tj_rng { uint64_t s; } tj_rng;

static inline uint64_t tj_rng_next(tj_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0, n). */
static inline uint64_t tj_rng_below(tj_rng *r, uint64_t n) { return n ? tj_rng_next(r) % n : 0; }
/* Uniform in [-1, 1). */
static inline float tj_rng_uniform(tj_rng *r) { return (float)((tj_rng_next(r) >> 40) * (2.0 / 16777216.0) - 1.0); }

#endif
