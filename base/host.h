/* base/: the host's identity, computed once per process and shared by every stage that keys on
 * it (the CPU backend's config lookup, tuning records, kernel-cache keys, benchmarks). */
#ifndef TJ_HOST_H
#define TJ_HOST_H

/* The host CPU's microarchitecture name as LLVM names it ("znver5", "sapphirerapids"), or
 * "unknown" without LLVM. Borrowed, static; thread-safe. */
const char *tj_host_cpu_name(void);


#endif
