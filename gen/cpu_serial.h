/* The CPU backend's small-call rule, in one place for the runtime that applies it
 * (runtime/backend_cpu.c) and the tuner that decides when the config axis `serial` can matter
 * (autotune/space.c). Needs no LLVM: builds without the CPU backend still tune for it. */
#ifndef TJ_CPU_SERIAL_H
#define TJ_CPU_SERIAL_H

#include <stdint.h>

/* Waking a pool worker and joining it costs a few µs; work under about 2 µs of one core's
 * FMA rate is cheaper on one thread. */
#define TJ_CPU_SERIAL_KFLOP 128

/* 1 when a call of m tokens runs on the calling thread alone: its kept work, 2 · m · kept / 1000
 * kFLOP, is under the threshold `serial` (a tj_cpu_config's serial: kFLOP, 0 the built-in
 * TJ_CPU_SERIAL_KFLOP, -1 never). kept: the layer's kept weights, tj_layer_kept (tile-wise
 * kept weights plus ew entries: the post pass runs on the pool too). */
static inline int tj_cpu_serial_call(int serial, int64_t m, int64_t kept)
{
    int64_t kflop = serial == 0 ? TJ_CPU_SERIAL_KFLOP : serial;
    return kflop > 0 && 2.0 * (double)m * (double)kept < 1000.0 * (double)kflop;
}

#endif
