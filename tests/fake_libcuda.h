/* What the fake driver (tests/fake_libcuda.c) records, for tests that dlopen it. */
#ifndef TJ_FAKE_LIBCUDA_H
#define TJ_FAKE_LIBCUDA_H

#define TJ_FAKE_MAX_LAUNCHES 4096

typedef struct tj_fake_launch {
    char kernel[16];
    unsigned grid[3], block[3], smem;
    void *stream;
    unsigned char args[112]; /* the tj_cuda_args passed by value */
    unsigned char x_head[16]; /* the first bytes of x at launch time */
} tj_fake_launch;

int tj_fake_cuda_launch_count(void);
const tj_fake_launch *tj_fake_cuda_launch(int i);
void tj_fake_cuda_reset(void);
int tj_fake_cuda_live_allocations(void);

#endif
