// SPDX-License-Identifier: MIT
// Foreign kernels of the abort test (test_gpu_abort.c): one spins until a
// mapped host flag is set, one for a fixed time. Kernels and launch wrappers only.
#include <stdint.h>
#include <cuda_runtime.h>

__global__ void spin_until_flag(volatile int *flag)
{
    while (*flag == 0)
        __nanosleep(1000);
}

__global__ void spin_for_ns(uint64_t ns)
{
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

extern "C" int abort_test_spin_until(volatile int *flag_dev, cudaStream_t s)
{
    spin_until_flag<<<1, 1, 0, s>>>(flag_dev);
    return (int)cudaGetLastError();
}

extern "C" int abort_test_spin_for(uint64_t ns, cudaStream_t s)
{
    spin_for_ns<<<1, 1, 0, s>>>(ns);
    return (int)cudaGetLastError();
}
