/* libFuzzer target: the safetensors reader (base/safetensors.c). Any file must open cleanly or
 * fail with a message; an opened file's tensors must lie inside the mapping and every byte of
 * every usable tensor must be readable through the same loads the backends use. */
#include <string.h>

#include "fuzz_common.h"
#include "base/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    tj_st_file *f = NULL;
    tj_error err;
    tj_error_clear(&err);
    tj_status s = tj_st_open(path, &f, &err);
    if (s != TJ_OK) {
        FUZZ_ASSERT(f == NULL && err.msg[0] != '\0');
        close(fd);
        return 0;
    }
    const char *base = f->map, *end = base + f->map_size;
    volatile float sink = 0;
    for (int64_t i = 0; i < f->ntensors; i++) {
        const tj_st_tensor *t = &f->tensors[i];
        FUZZ_ASSERT(t->begin <= t->end);
        FUZZ_ASSERT((const char *)t->data >= base && (const char *)t->data + (t->end - t->begin) <= end);
        FUZZ_ASSERT(tj_st_find(f, t->name) != NULL);
        if (i > 0) FUZZ_ASSERT(strcmp(f->tensors[i - 1].name, t->name) < 0);
        if (!t->dtype_ok) continue;
        int64_t n = (int64_t)((t->end - t->begin) / tj_dtype_size(t->dtype));
        for (int64_t e = 0; e < n; e++) sink += tj_load_f32(t->data, t->dtype, e);
    }
    (void)sink;
    tj_st_close(f);
    close(fd);
    return 0;
}
