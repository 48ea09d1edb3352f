/* `tilejit`: the command line over the library. Each command lives in cli/cmd_<name>.c;
 * this file only dispatches. Exit codes: 0 success, 1 bad input or failure. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "tj_config.h"

static const tj_cmd commands[] = {
    {"inspect", "per-layer shape, tiles, density and FLOP reduction of a pattern", cmd_inspect},
    {"run", "run one layer on a .npy input and write Y as .npy", cmd_run},
    {"bench", "time a random tile-wise layer against dense OpenBLAS (cpu) or cuBLAS (cuda)", cmd_bench},
    {"gen", "write the CUDA C or LLVM IR generated for one layer", cmd_gen},
    {"compile", "compile every layer's CUDA kernels with NVRTC (cache, registers, spills)", cmd_compile},
    {"prune", "prune a checkpoint to a tile-wise pattern (tw1, tw2, tew) and pruned weights", cmd_prune},
    {"pattern", "read the tile-wise pattern of pruned weights back from their zeros", cmd_pattern},
    {"model", "run every layer of a model: check against the reference, time against dense", cmd_model},
    {"tune", "search configs per layer and M into a JSON Lines log; --best merges logs", cmd_tune},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tilejit COMMAND [ARGS]   (tilejit COMMAND --help for details)\n\n"
               "tilejit %s: tile-wise sparse kernels, generated per layer and JIT-compiled.\n\n"
               "commands:\n", TJ_VERSION);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (commands[i].name[0] != '_') /* internal commands stay out of the list */
            fprintf(f, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\noptions: --help, --version\n");
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN); /* a closed pipe is an error message, not a death by signal */
    if (argc < 2) {
        usage(stderr);
        return 1;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("tilejit %s\n", TJ_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "tilejit: unknown command '%s' (see tilejit --help)\n", argv[1]);
    return 1;
}
