/* base/: the host CPU's name, asked of LLVM once per process (see host.h). */
#include <pthread.h>
#include <stdio.h>

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
