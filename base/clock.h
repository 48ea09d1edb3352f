/* base/: the one clock. tj_now (declared in tilejit/bench.h) is monotonic seconds; every stage
 * that times something (compiles, loads, measurements, benchmarks, the CLI) reads it. */
#ifndef TJ_CLOCK_H
#define TJ_CLOCK_H

#include "tilejit.h"

#endif
