/* Running the `tilejit` command from a test: one process with stdout discarded and stderr kept,
 * optionally under valgrind (leaks and memory errors exit 99); a shell helper; and a line counter
 * for the files such runs write. */
#ifndef TJ_CLI_RUN_H
#define TJ_CLI_RUN_H

#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs `tilejit args...` (args NULL-terminated); stderr goes to errpath and then into
 * err_text (cap bytes). Returns the exit code, or 128 + signal. */
static inline int tj_test_run_cli(const char *tilejit, const char *const *args, int valgrind,
                                  const char *errpath, char *err_text, size_t cap)
{
    const char *argv[64];
    int n = 0;
    if (valgrind) {
        argv[n++] = "valgrind";
        argv[n++] = "-q";
        argv[n++] = "--error-exitcode=99";
        argv[n++] = "--leak-check=full";
        argv[n++] = "--errors-for-leak-kinds=definite,indirect";
    }
    argv[n++] = tilejit;
    for (int i = 0; args[i] && n < 63; i++) argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY), e = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(devnull, 1);
        dup2(e, 2);
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    FILE *f = fopen(errpath, "rb");
    size_t got = f ? fread(err_text, 1, cap - 1, f) : 0;
    err_text[got] = '\0';
    if (f) fclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* system() on a formatted command; its exit code, or -1 if it did not exit. */
static inline int tj_test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline int tj_test_sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Lines of a file containing needle (every line when needle is NULL); -1 if unreadable. */
static inline int64_t tj_test_count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[65536];
    int64_t n = 0;
    while (fgets(line, sizeof line, f))
        if (!needle || strstr(line, needle)) n++;
    fclose(f);
    return n;
}

#endif
