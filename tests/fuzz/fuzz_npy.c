/* libFuzzer target: the .npy reader (base/npy.c). Any file must load cleanly or fail with a
 * message; a loaded array's size must match its shape exactly. */
#include <string.h>

#include "fuzz_common.h"
#include "base/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    tj_npy a;
    tj_error err;
    tj_error_clear(&err);
    tj_status s = tj_npy_read(path, &a, &err);
    if (s != TJ_OK) {
        FUZZ_ASSERT(a.data == NULL && err.msg[0] != '\0');
    } else {
        int64_t bytes = a.rows * a.cols * (int64_t)tj_dtype_size(a.dtype);
        FUZZ_ASSERT(a.rows >= 0 && a.cols >= 0 && bytes <= (int64_t)size);
        volatile float sink = 0;
        for (int64_t i = 0; i < a.rows * a.cols; i++) sink += tj_load_f32(a.data, a.dtype, i);
        (void)sink;
        tj_npy_free(&a);
    }
    close(fd);
    return 0;
}
