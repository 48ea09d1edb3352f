/* bench/: the CPU benchmark's entry point in a build without LLVM: it says so. */
#include <stdio.h>

#include "tilejit/bench.h"

int tj_bench_cpu_main(int argc, char **argv, FILE *out, FILE *errs)
{
    (void)argc;
    (void)argv;
    (void)out;
    fprintf(errs, "tilejit bench: the cpu backend is not built into this tilejit (configured without LLVM 19)\n");
    return 1;
}
