/* Fibers for the host executor: each CUDA thread of a block runs on its own stack, and the
 * executor switches between them at every barrier and warp collective (hx_exec.c). The switch
 * is a few instructions on x86-64 (swapcontext costs a system call per switch); other machines
 * fall back to ucontext. AddressSanitizer is told about every stack switch. */
#ifndef TJ_HX_FIBER_H
#define TJ_HX_FIBER_H

#include <stddef.h>

#if defined(__x86_64__)
#define TJ_HX_FIBER_ASM 1
#else
#include <ucontext.h>
#endif

typedef struct tj_hx_fiber {
    void *sp;                /* saved stack pointer (asm switch) */
#ifndef TJ_HX_FIBER_ASM
    ucontext_t uc;
#endif
    char *stack;             /* lowest usable address; NULL for the thread's own stack */
    size_t size;
    void (*fn)(void *);
    void *arg;
    void *asan_fake;         /* AddressSanitizer's fake-stack handle while switched away */
    const void *asan_bottom; /* the stack's bounds as AddressSanitizer knows them */
    size_t asan_size;
} tj_hx_fiber;

/* The calling thread's own context, to switch back to (no stack of its own to allocate). */
void tj_hx_fiber_init_main(tj_hx_fiber *f);
/* Sets up f to run fn(arg) on [stack, stack + size) when first switched to. fn must never
 * return: it ends by switching away with tj_hx_fiber_switch(f, other, 1). */
void tj_hx_fiber_init(tj_hx_fiber *f, char *stack, size_t size, void (*fn)(void *), void *arg);
/* Forgets whatever a fiber abandoned in the middle (never resumed) left on [stack, stack + size),
 * before the stack is used again. */
void tj_hx_fiber_forget(char *stack, size_t size);
/* Saves the running context into `from` and resumes `to`. `from_exits`: from is never resumed. */
void tj_hx_fiber_switch(tj_hx_fiber *from, tj_hx_fiber *to, int from_exits);

#endif
