/* base/: the one whole-file reader. Reads to EOF in growing chunks (works for pipes and files
 * whose size changes), NUL-terminates, and refuses files above a caller's limit. */
#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tj_status tj_file_read(const char *path, size_t max_bytes, char **out, size_t *len, tj_error *err)
{
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return tj_fail(err, TJ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t n = 0, cap = 0;
    char *buf = NULL;
    tj_status s = TJ_OK;
    for (;;) {
        if (cap - n < 4096 + 1) {
            size_t ncap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (max_bytes && n > max_bytes) {
            s = tj_fail(err, TJ_ERR_FORMAT, "%s: larger than %zu bytes", path, max_bytes);
            goto fail;
        }
        if (got == 0) break;
    }
    if (ferror(f)) {
        s = tj_fail(err, TJ_ERR_IO, "%s: read error", path);
        goto fail;
    }
    fclose(f);
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return TJ_OK;
fail:
    fclose(f);
    free(buf);
    return s;
}
