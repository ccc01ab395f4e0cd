/* SPDX-License-Identifier: MIT */
/*
 * What the gpu suite's C programs share: the failure report, the check of
 * a CUDA call that the rest of a test cannot do without, and whether there
 * is a GPU at all, asked in a child so that this process has not started
 * CUDA before it forks ranks of its own.
 */
#ifndef MSCX_GPU_TEST_H
#define MSCX_GPU_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

#include "../common/fail.h"

/* A CUDA call the test cannot go on without: its failure ends the program. */
#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "cuda: %s: %s\n", #call, cudaGetErrorString(e_));                                \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* 1 when a CUDA device is there. */
static inline int gpu_present(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
    }
    int status = 1;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#endif /* MSCX_GPU_TEST_H */
