/* SPDX-License-Identifier: MIT */
/* Size sweep, per-rank counts and bandwidth factors, as nccl-tests defines them. */
#include "perf.h"

size_t mscx_perf_sweep(const struct perf_opts *o, uint64_t *sizes, size_t max)
{
    size_t n = 0;
    uint64_t s = o->min_bytes;
    for (;;) {
        uint64_t next;
        if (n < max)
            sizes[n] = s;
        n++;
        if (o->step_factor > 1) {
            if (s == 0 || s > o->max_bytes / o->step_factor)
                break;
            next = s * o->step_factor;
        } else {
            if (s > o->max_bytes - o->step_bytes)
                break;
            next = s + o->step_bytes;
        }
        if (next > o->max_bytes)
            break;
        s = next;
    }
    return n;
}

/*
 * allreduce: every rank sends and receives count elements.
 * allgather: each rank sends count/n, receives (count/n)*n.
 * reducescatter: each rank sends (count/n)*n, receives count/n.
 * alltoall: each rank sends and receives n blocks of count/n, a block rounded
 * down to whole 16 bytes, as nccl-tests' alltoall_perf does.
 * The printed count is the larger of the two, as in nccl-tests.
 */
void mscx_perf_counts(enum perf_coll c, uint64_t bytes, size_t esize, int nranks, uint64_t *send_p,
                      uint64_t *recv_p, uint64_t *total_p)
{
    uint64_t count = esize ? bytes / esize : 0;
    uint64_t part = count / (uint64_t)nranks;
    switch (c) {
    case PERF_ALLGATHER:
        *send_p = part;
        *recv_p = part * (uint64_t)nranks;
        *total_p = *recv_p;
        break;
    case PERF_REDUCESCATTER:
        *send_p = part * (uint64_t)nranks;
        *recv_p = part;
        *total_p = *send_p;
        break;
    case PERF_ALLTOALL:
        if (esize > 0 && esize < 16)
            part &= ~(uint64_t)(16 / esize - 1);
        *send_p = *recv_p = *total_p = part * (uint64_t)nranks;
        break;
    default:
        *send_p = *recv_p = *total_p = count;
        break;
    }
}

/* busbw factor: allreduce 2(n-1)/n; allgather, reducescatter and alltoall (n-1)/n. */
void mscx_perf_bw(enum perf_coll c, uint64_t total_bytes, double time_us, int nranks, double *algbw_p,
                  double *busbw_p)
{
    double alg = time_us > 0 ? (double)total_bytes / 1.0e3 / time_us : 0.0;
    double n = (double)nranks, factor;
    if (c == PERF_ALLREDUCE)
        factor = 2.0 * (n - 1.0) / n;
    else
        factor = (n - 1.0) / n;
    *algbw_p = alg;
    *busbw_p = alg * factor;
}
