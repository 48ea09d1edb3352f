/* base/: the host CPU's name, asked of LLVM once per process (see host.h). */
#include <pthread.h>
#include <stdio.h>
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "base/host.h"
#include "tj_config.h"

#if TJ_HAVE_LLVM
#include <llvm-c/Core.h>
#include <llvm-c/TargetMachine.h>
#endif

static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static char host_name[160] = "unknown";

static void host_detect(void)
{
#if TJ_HAVE_LLVM
    char *cpu = LLVMGetHostCPUName();
    if (cpu && *cpu) snprintf(host_name, sizeof host_name, "%s", cpu);
    LLVMDisposeMessage(cpu);
#endif
}

const char *tj_host_cpu_name(void)
{
    pthread_once(&host_once, host_detect);
    return host_name;
}

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok;

static void amx_request(void)
{
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    /* confirm: the granted set must hold the tile data */
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mask) != 0) return;
    amx_ok = (mask >> XFEATURE_XTILEDATA) & 1;
#endif
}

int tj_host_amx_permit(void)
{
    pthread_once(&amx_once, amx_request);
    return amx_ok;
}
