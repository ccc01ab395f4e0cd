/* SPDX-License-Identifier: MIT */
/*
 * ncclAvg and PreMulSum through the shim built with the fake executor
 * (fake_exec.c), on a one-rank communicator with the shipped plans, against
 * the fake libnccl. Run with LD_PRELOAD=libmscx_nccl_fake_exec.so,
 * FAKE_NCCL_LOG and MSCX_DEBUG_FILE set. Checks which calls reach the
 * executor, with which scale, and which go to NCCL (counted under the
 * reason op in the communicator's summary).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h>

#define SHIM_CHECK_FILE_MAX (1 << 16)
#include "shim_check.h"

/* A call that must run on the executor: plain (@p scaled NULL) or with the scale line @p scaled. */
static void expect_routed(const char *what, ncclResult_t r, const char *scaled)
{
    if (r != ncclSuccess)
        FAIL("%s: returned %d", what, (int)r);
    if (!fake_got("mscx_exec_launch") || fake_got("ncclAllReduce") || fake_got("ncclReduceScatter"))
        FAIL("%s: not run on the executor:\n%s", what, read_file(getenv("FAKE_NCCL_LOG")));
    if (scaled && !fake_got(scaled))
        FAIL("%s: no '%s' in the executor's record:\n%s", what, scaled, read_file(getenv("FAKE_NCCL_LOG")));
    if (!scaled && fake_got("mscx_exec_launch_scaled"))
        FAIL("%s: scaled, expected a plain sum:\n%s", what, read_file(getenv("FAKE_NCCL_LOG")));
}

/* A call that must go to NCCL (whose answer, for a bad op, is NCCL's own). */
static void expect_nccl(const char *what, const char *fn)
{
    if (!fake_got(fn) || fake_got("mscx_exec_launch"))
        FAIL("%s: not sent to NCCL's %s:\n%s", what, fn, read_file(getenv("FAKE_NCCL_LOG")));
}

static ncclRedOp_t make_op(void *scalar, ncclDataType_t dt, ncclScalarResidence_t where, ncclComm_t comm)
{
    ncclRedOp_t op = ncclSum;
    fake_log_clear();
    if (ncclRedOpCreatePreMulSum(&op, scalar, dt, where, comm) != ncclSuccess ||
        !fake_got("ncclRedOpCreatePreMulSum") || (int)op < (int)ncclNumOps)
        FAIL("ncclRedOpCreatePreMulSum did not reach NCCL or made op %d", (int)op);
    return op;
}

int main(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    static float buf[1 << 16];
    char line[128];
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess) {
        fprintf(stderr, "FAIL: ncclCommInitRank\n");
        return 1;
    }
    /* ncclAvg of floating types routes; at one rank it is the plain sum */
    fake_log_clear();
    expect_routed("AllReduce avg fp32", ncclAllReduce(buf, buf, 256, ncclFloat32, ncclAvg, comm, NULL), NULL);
    fake_log_clear();
    expect_routed("ReduceScatter avg bf16",
                  ncclReduceScatter(buf, buf + 4096, 512, ncclBfloat16, ncclAvg, comm, NULL), NULL);
    /* of integers it is NCCL's (sum, then divide) */
    fake_log_clear();
    ncclAllReduce(buf, buf, 256, ncclInt32, ncclAvg, comm, NULL);
    expect_nccl("AllReduce avg int32", "ncclAllReduce");

    /* PreMulSum with a host scalar: its value when the op was made */
    float s = 0.3f;
    uint32_t s_bits;
    memcpy(&s_bits, &s, 4);
    ncclRedOp_t host_op = make_op(&s, ncclFloat32, ncclScalarHostImmediate, comm);
    s = 5.0f;
    fake_log_clear();
    snprintf(line, sizeof(line), "mscx_exec_launch_scaled 0 0 host 0x%x", s_bits);
    expect_routed("AllReduce premulsum host fp32",
                  ncclAllReduce(buf, buf + 1024, 256, ncclFloat32, host_op, comm, NULL), line);

    /* PreMulSum with a device scalar: its pointer, read by each launch */
    static float dev_scalar;
    ncclRedOp_t dev_op = make_op(&dev_scalar, ncclFloat32, ncclScalarDevice, comm);
    fake_log_clear();
    snprintf(line, sizeof(line), "mscx_exec_launch_scaled 0 0 device %p", (void *)&dev_scalar);
    expect_routed("ReduceScatter premulsum device fp32",
                  ncclReduceScatter(buf, buf + 2048, 256, ncclFloat32, dev_op, comm, NULL), line);

    /* an op made for fp16: with fp16 it routes, with fp32 NCCL answers */
    uint16_t third = 0x3555;
    ncclRedOp_t half_op = make_op(&third, ncclFloat16, ncclScalarHostImmediate, comm);
    fake_log_clear();
    expect_routed("AllReduce premulsum fp16", ncclAllReduce(buf, buf, 512, ncclFloat16, half_op, comm, NULL),
                  "mscx_exec_launch_scaled 0 1 host 0x3555");
    fake_log_clear();
    ncclAllReduce(buf, buf, 256, ncclFloat32, half_op, comm, NULL);
    expect_nccl("AllReduce fp32 with an fp16 premulsum op", "ncclAllReduce");

    /* a destroyed op is NCCL's to refuse */
    fake_log_clear();
    if (ncclRedOpDestroy(host_op, comm) != ncclSuccess || !fake_got("ncclRedOpDestroy"))
        FAIL("ncclRedOpDestroy did not reach NCCL");
    fake_log_clear();
    ncclAllReduce(buf, buf, 256, ncclFloat32, host_op, comm, NULL);
    expect_nccl("AllReduce with a destroyed op", "ncclAllReduce");
    fake_log_clear();
    expect_routed("the other op still", ncclAllReduce(buf, buf, 256, ncclFloat32, dev_op, comm, NULL),
                  "mscx_exec_launch_scaled");
    ncclRedOpDestroy(dev_op, comm);
    ncclRedOpDestroy(half_op, comm);

    ncclCommAbort(comm); /* the fake's kernels run until an abort; the summary is written */
    const char *log = read_file(getenv("MSCX_DEBUG_FILE"));
    if (!strstr(log, "reasons: op 3"))
        FAIL("the summary does not count 3 calls under the reason op:\n%s", log);
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    else
        printf("ncclAvg and PreMulSum: 6 calls routed with their scales, 3 sent to NCCL\n");
    return failures ? 1 : 0;
}
