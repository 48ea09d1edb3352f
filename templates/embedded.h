/* The CUDA C templates of templates/, embedded into the library at build time
 * (scripts/embed_templates.py); gen/emit_cuda.c reads them, or $TILEJIT_TEMPLATE_DIR's copies. */
#ifndef TJ_EMBEDDED_H
#define TJ_EMBEDDED_H

#include <stddef.h>

typedef struct tj_embedded_template {
    const char *name; /* file name, e.g. "tiles_mma.cu" */
    const char *text;
    size_t len;
} tj_embedded_template;

extern const tj_embedded_template tj_embedded_templates[];
extern const size_t tj_embedded_template_count;

#endif
