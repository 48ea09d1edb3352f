/* base/: the one whole-file reader (tj_file_read, declared in tilejit/io.h): pattern files,
 * config and tuning files, and the command line's --config/--configs arguments all read
 * through it. */
#ifndef TJ_FILE_H
#define TJ_FILE_H

#include "base/error.h"

#endif
