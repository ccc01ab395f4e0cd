/* SPDX-License-Identifier: MIT */
/*
 * The shim as the NCCL library of a ctypes client (vLLM's pynccl with
 * VLLM_NCCL_SO_PATH pointing at libmscx_nccl.so): no LD_PRELOAD, the shim
 * opened by path with RTLD_NOW | RTLD_LOCAL, as ctypes does. The shim must
 * find the real NCCL by itself (here the fake libnccl laid out as NCCL's
 * pip wheel below VIRTUAL_ENV or PYTHONPATH), and route the client's
 * allreduce on its (fake) executor, whose one-rank result is the input
 * (FAKE_EXEC_COPY=1); the fake NCCL's allreduce writes nothing.
 *
 *   shim-dlopen-client SHIM_PATH --how=TEXT
 *     --how=TEXT  the shim's MSCX_DEBUG_FILE must name one real NCCL, found by TEXT
 *                 ("pip wheel (VIRTUAL_ENV)"): a second would be a copy of the shim
 * FAKE_NCCL_LOG names the fake's call log.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#define SHIM_CHECK_FILE_MAX (1 << 17)
#include "shim_check.h"

#define COUNT 256

struct api {
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*last_error)(ncclComm_t);
};

static int load(const char *path, struct api *a)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        FAIL("dlopen %s: %s", path, dlerror());
        return -1;
    }
    *(void **)&a->get_unique_id = dlsym(h, "ncclGetUniqueId");
    *(void **)&a->init_rank = dlsym(h, "ncclCommInitRank");
    *(void **)&a->all_reduce = dlsym(h, "ncclAllReduce");
    *(void **)&a->destroy = dlsym(h, "ncclCommDestroy");
    *(void **)&a->last_error = dlsym(h, "ncclGetLastError");
    if (!a->get_unique_id || !a->init_rank || !a->all_reduce || !a->destroy || !a->last_error) {
        FAIL("%s lacks an NCCL function", path);
        return -1;
    }
    return 0;
}

static void run(const struct api *a)
{
    static float in[COUNT], out[COUNT];
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclResult_t r = a->get_unique_id(&id);
    if (r == ncclSuccess)
        r = a->init_rank(&comm, 1, id, 0);
    if (r != ncclSuccess || !comm) {
        FAIL("init through the shim: %d (%s)", (int)r, a->last_error(NULL));
        return;
    }
    for (int i = 0; i < COUNT; i++)
        in[i] = (float)(i * 3 + 1);
    r = a->all_reduce(in, out, COUNT, ncclFloat, ncclSum, comm, NULL);
    if (r != ncclSuccess)
        FAIL("allreduce: %d (%s)", (int)r, a->last_error(comm));
    for (int i = 0; i < COUNT && r == ncclSuccess; i++)
        if (out[i] != in[i]) {
            FAIL("allreduce result [%d] = %g, expected %g", i, (double)out[i], (double)in[i]);
            break;
        }
    a->destroy(comm);
}

int main(int argc, char **argv)
{
    const char *how = NULL;
    for (int i = 2; i < argc; i++)
        if (!strncmp(argv[i], "--how=", 6))
            how = argv[i] + 6;
    if (argc < 3 || !how) {
        fprintf(stderr, "usage: %s SHIM_PATH --how=TEXT\n", argv[0]);
        return 2;
    }
    struct api a;
    if (load(argv[1], &a) == 0)
        run(&a);
    const char *log = read_file(getenv("FAKE_NCCL_LOG"));
    if (!strstr(log, "mscx_exec_launch"))
        FAIL("the allreduce never reached the executor; the fake's log:\n%s", log);
    if (strstr(log, "\nncclAllReduce ") || !strncmp(log, "ncclAllReduce ", 14))
        FAIL("the allreduce was forwarded to NCCL");
    char want[256];
    snprintf(want, sizeof(want), "(%s)", how);
    const char *shim_log = read_file(getenv("MSCX_DEBUG_FILE"));
    int loads = 0;
    for (const char *p = strstr(shim_log, "] INFO real NCCL "); p; p = strstr(p + 1, "] INFO real NCCL "))
        loads++;
    if (loads != 1 || !strstr(shim_log, want))
        FAIL("the shim's log names %d real NCCL loads, expected one found by %s:\n%s", loads, how, shim_log);
    return failures ? 1 : 0;
}
