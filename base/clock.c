/* base/: the one clock: CLOCK_MONOTONIC in seconds. */
#include "base/clock.h"

#include <time.h>

double tj_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
