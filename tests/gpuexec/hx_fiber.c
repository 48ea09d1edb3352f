/* Fibers for the host executor (hx_fiber.h): an 8-instruction stack switch on x86-64, ucontext
 * elsewhere, with AddressSanitizer's fiber annotations around every switch. */
#include "hx_fiber.h"

#include <stdint.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define HX_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HX_ASAN 1
#endif
#endif
#ifdef HX_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#ifdef TJ_HX_FIBER_ASM
/* void hx_ctx_switch(void **save_sp, void *new_sp): pushes the callee-saved registers, saves rsp,
 * loads the other stack and pops its registers; `ret` resumes it (or enters hx_ctx_start). */
void hx_ctx_switch(void **save_sp, void *new_sp);
void hx_ctx_start(void);
__asm__(".text\n"
        ".globl hx_ctx_switch\n"
        ".hidden hx_ctx_switch\n"
        ".type hx_ctx_switch,@function\n"
        "hx_ctx_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size hx_ctx_switch, .-hx_ctx_switch\n"
        /* first entry of a fiber: r12 = the fiber, r13 = hx_fiber_entry; rsp is 16-byte aligned */
        ".globl hx_ctx_start\n"
        ".hidden hx_ctx_start\n"
        ".type hx_ctx_start,@function\n"
        "hx_ctx_start:\n"
        "    movq %r12, %rdi\n"
        "    callq *%r13\n"
        "    ud2\n"
        ".size hx_ctx_start, .-hx_ctx_start\n");
#endif

#ifdef HX_ASAN
/* The bounds of the thread's own stack (the scheduler's), learnt on the first switch from it. */
static _Thread_local const void *hx_main_bottom;
static _Thread_local size_t hx_main_size;
#endif

static void hx_fiber_entry(tj_hx_fiber *f)
{
#ifdef HX_ASAN
    __sanitizer_finish_switch_fiber(NULL, &hx_main_bottom, &hx_main_size);
#endif
    f->fn(f->arg);
    __builtin_trap(); /* fn never returns */
}

#ifndef TJ_HX_FIBER_ASM
static void hx_uc_entry(unsigned lo, unsigned hi)
{
    hx_fiber_entry((tj_hx_fiber *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
#endif

void tj_hx_fiber_init_main(tj_hx_fiber *f)
{
    memset(f, 0, sizeof *f);
}

void tj_hx_fiber_init(tj_hx_fiber *f, char *stack, size_t size, void (*fn)(void *), void *arg)
{
    memset(f, 0, sizeof *f);
    f->stack = stack;
    f->size = size;
    f->fn = fn;
    f->arg = arg;
    f->asan_bottom = stack;
    f->asan_size = size;
#ifdef HX_ASAN
    /* A fiber that ended left its entry frame's redzones at the top of its stack (deeper frames
     * returned and cleaned up); an abandoned one (tj_hx_fiber_forget) left more. */
    size_t dirty = size < 65536 ? size : 65536;
    __asan_unpoison_memory_region(stack + size - dirty, dirty);
#endif
#ifdef TJ_HX_FIBER_ASM
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    void **sp = (void **)(top - 24); /* the return slot: rsp is 16-byte aligned after `ret` */
    sp[0] = (void *)hx_ctx_start;
    sp -= 6; /* r15 r14 r13 r12 rbx rbp, popped in that order */
    memset(sp, 0, 6 * sizeof *sp);
    sp[3] = f;                        /* r12 */
    sp[2] = (void *)hx_fiber_entry;   /* r13 */
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = stack;
    f->uc.uc_stack.ss_size = size;
    f->uc.uc_link = NULL;
    uintptr_t p = (uintptr_t)f;
    makecontext(&f->uc, (void (*)(void))hx_uc_entry, 2, (unsigned)(p & 0xffffffffu), (unsigned)(p >> 32));
#endif
}

void tj_hx_fiber_switch(tj_hx_fiber *from, tj_hx_fiber *to, int from_exits)
{
#ifdef HX_ASAN
    if (to->stack) __sanitizer_start_switch_fiber(from_exits ? NULL : &from->asan_fake, to->asan_bottom, to->asan_size);
    else __sanitizer_start_switch_fiber(from_exits ? NULL : &from->asan_fake, hx_main_bottom, hx_main_size);
#else
    (void)from_exits;
#endif
#ifdef TJ_HX_FIBER_ASM
    hx_ctx_switch(&from->sp, to->sp);
#else
    swapcontext(&from->uc, &to->uc);
#endif
#ifdef HX_ASAN
    __sanitizer_finish_switch_fiber(from->asan_fake, NULL, NULL); /* back in `from` */
#endif
}

void tj_hx_fiber_forget(char *stack, size_t size)
{
#ifdef HX_ASAN
    __asan_unpoison_memory_region(stack, size);
#else
    (void)stack;
    (void)size;
#endif
}
