/* base/: the host's identity, computed once per process and shared by every stage that keys on
 * it (the CPU backend's config lookup, tuning records, kernel-cache keys, benchmarks). */
#ifndef TJ_HOST_H
#define TJ_HOST_H

/* The host CPU's microarchitecture name as LLVM names it ("znver5", "sapphirerapids"), or
 * "unknown" without LLVM. Borrowed, static; thread-safe. */
const char *tj_host_cpu_name(void);

/* Asks Linux, once per process, for permission to use the AMX tile data state (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XTILEDATA; without it the first tile instruction raises SIGILL). The
 * permission covers every thread of the process. Returns 1 when granted (or already held), 0
 * otherwise (not Linux on x86-64, a kernel before 5.16, or refused). Call it only on a CPU that
 * has AMX. Thread-safe. */
int tj_host_amx_permit(void);

#endif
