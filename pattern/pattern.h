/* pattern/: the tile-wise pattern in memory: what parse.c reads from JSON, validate.c checks,
 * plan and the emitters consume, and write.c writes back. The types and calls are public
 * (tilejit/pattern.h); the format is docs/formats.md. */
#ifndef TJ_PATTERN_H
#define TJ_PATTERN_H

#include <stdint.h>

#include "base/error.h"

#endif
