/* `tilejit bench`: dispatches on --backend to the CPU bench (tj_bench_cpu_main, bench/cpu.c in the library, needs LLVM) or the GPU
 * bench (tj_bench_cuda_main, bench/cuda.c in the library, needs the CUDA toolkit); each parses
 * the rest of the options itself. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "tilejit/bench.h"
#include "tj_config.h"

static const char *help =
    "usage: tilejit bench --backend cpu|cuda --m M --n N --k K --sparsity S [--g 128] [--mode tw1|tw2] ...\n\n"
    "Times one random tile-wise sparse layer against the dense library on the same data (OpenBLAS on\n"
    "the CPU, cuBLAS on the GPU). `tilejit bench --backend cpu --help` and `--backend cuda --help`\n"
    "list each backend's options. Ends with one line `speedup <ratio> ...`.\n";

int cmd_bench(int argc, char **argv)
{
    const char *backend = NULL;
    int want_help = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) backend = argv[i + 1];
        else if (strncmp(argv[i], "--backend=", 10) == 0) backend = argv[i] + 10;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) want_help = 1;
    }
    if (!backend) {
        if (want_help) {
            fputs(help, stdout);
            return 0;
        }
        return cli_fail("bench", "--backend cpu|cuda is required (see --help)");
    }
    if (strcmp(backend, "cpu") == 0) {
#if TJ_HAVE_LLVM
        return tj_bench_cpu_main(argc, argv, stdout, stderr);
#else
        return cli_fail("bench", "the cpu backend is not built into this tilejit (configured without LLVM 19)");
#endif
    }
    if (strcmp(backend, "cuda") == 0) {
        if (tj_backend_built(TJ_BACKEND_CUDA)) return tj_bench_cuda_main(argc, argv, stdout, stderr);
        return cli_fail("bench", "the cuda backend is not built into this tilejit (configured without the CUDA toolkit)");
    }
    return cli_fail("bench", "--backend: '%s' is not cpu or cuda", backend);
}
