/* pattern/: random tile-wise layers (tj_random_spec, tj_random_layer: public, tilejit/pattern.h)
 * for `bench`, tests and tuning. */
#ifndef TJ_RANDOM_PATTERN_H
#define TJ_RANDOM_PATTERN_H

#include "pattern/pattern.h"

#endif
