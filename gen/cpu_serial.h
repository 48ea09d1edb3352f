/* The CPU backend's small-call rule, in one place for the runtime that applies it
 * (runtime/backend_cpu.c) and the tuner that decides when the config axis `serial` can matter
 * (autotune/space.c). Needs no LLVM: builds without the CPU backend still tune for it. */
#ifndef TJ_CPU_SERIAL_H
#define TJ_CPU_SERIAL_H

#include <stdint.h>
#include <string.h>

#include "base/host.h"

/* A call runs on two threads only when its one-thread time is above about 2 µs: the pool's
 * hand-off costs about 0.5-1 µs, and a share of a smaller call is not worth it. The time is
 * estimated as work = 2 · (m + TJ_CPU_STREAM_TOKENS) · kept / 1000 "kFLOP": the FMAs of m tokens,
 * plus the weights' stream, which costs about as much as 4 tokens' FMAs (decode-sized calls
 * are bound by it). Measured on Sapphire Rapids at 2 threads with M = 1, 4 and 16 (serial and
 * parallel break even at about 50 K, 32 K and 14 K kept weights: bench/RESULTS.md, issue 25). */
#define TJ_CPU_STREAM_TOKENS 4
#define TJ_CPU_SERIAL_KFLOP 540
/* AMD Zen 4 hands a call over faster: at 2 threads parallel won from about 330 kFLOP (M = 1 with
 * 37 K kept weights: 1.0 against 1.5 µs; M = 16 with 8 K: 1.5 against 2.4 µs) and lost below
 * 300 (M = 4 with 16-18 K: 1.6-1.9 against 1.2-1.4 µs): bench/RESULTS.md, issue 25, round 6.
 * Zen 5 is taken to behave the same (not measured). */
#define TJ_CPU_SERIAL_KFLOP_ZEN4 320

/* The built-in threshold (serial 0) on host `cpu` (an LLVM CPU name: tj_host_cpu_name). */
static inline int64_t tj_cpu_serial_default(const char *cpu)
{
    return cpu && (!strncmp(cpu, "znver4", 6) || !strncmp(cpu, "znver5", 6)) ? TJ_CPU_SERIAL_KFLOP_ZEN4
                                                                             : TJ_CPU_SERIAL_KFLOP;
}

/* 1 when a call of m tokens runs on the calling thread alone: its work (above) is under the
 * threshold `serial` (a tj_cpu_config's serial, in those kFLOP; 0: the built-in
 * tj_cpu_serial_default of this host, -1 never). kept: the layer's kept weights, tj_layer_kept (tile-wise
 * kept weights plus ew entries: the post pass runs on the pool too). */
static inline int tj_cpu_serial_call(int serial, int64_t m, int64_t kept)
{
    int64_t kflop = serial == 0 ? tj_cpu_serial_default(tj_host_cpu_name()) : serial;
    return kflop > 0 && 2.0 * (double)(m + TJ_CPU_STREAM_TOKENS) * (double)kept < 1000.0 * (double)kflop;
}

#endif
