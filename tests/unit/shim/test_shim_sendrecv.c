/* SPDX-License-Identifier: MIT */
/*
 * ncclSend and ncclRecv under the shim built with the fake executor
 * (fake_exec.c), against the fake libnccl and the shipped plans. A group of
 * one send and one recv to and from every rank, self included, in one
 * buffer per side, runs as one AlltoAll launch; everything else goes to
 * NCCL in issue order, still inside NCCL's group. Each mode checks the
 * fake's log (FAKE_NCCL_LOG) and the summary at destroy (MSCX_DEBUG_FILE):
 *
 *   one      a world of one rank: the AlltoAll group launches, eagerly too,
 *            and in place (one buffer for both); unequal counts, a missing or doubled call, overlapping
 * buffers, and a call outside a group go to NCCL in issue order; a collective before or after sends the pair
 * to NCCL and routes as it would alone ranks2   the
 * two communicators of ncclCommInitAll as ranks on two threads (FAKE_NCCL_LOCAL=1): captured on both
 * (FAKE_CUDA_CAPTURING) it launches on both, also after earlier sends and recvs; eager on both, or captured
 * on one only, it goes to NCCL on both at once; a rank whose group is not an AlltoAll's leaves the other
 *            waiting for its vote until the bound, after which that rank
 *            votes no for good
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mscx/status.h"
#include "rec_gen.h"
#include "shim_check.h"

#define STREAM ((cudaStream_t)(uintptr_t)0x5100)
#define STREAM_EAGER ((cudaStream_t)(uintptr_t)0x5200)
#define LINE_LEN 2048
#define COUNT 256 /* floats per peer: 1 KB at one rank, 2 KB at two */

static float sendb[4 * COUNT], recvb[4 * COUNT];

__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes);
__attribute__((visibility("default"))) mscx_status_t mscxFakeExecLaunchResult(uint64_t bytes)
{
    (void)bytes;
    return MSCX_OK;
}

static void call_ok(const char *what, ncclResult_t r)
{
    if (r != ncclSuccess)
        FAIL("%s returned %d (%s)", what, (int)r, ncclGetLastError(NULL));
}

static void send_to(const float *buf, size_t count, int peer, ncclComm_t comm, cudaStream_t s)
{
    call_ok("ncclSend", ncclSend(buf, count, ncclFloat32, peer, comm, s));
}

static void recv_from(float *buf, size_t count, int peer, ncclComm_t comm, cudaStream_t s)
{
    call_ok("ncclRecv", ncclRecv(buf, count, ncclFloat32, peer, comm, s));
}

/* One send and one recv per rank of @p nranks, block j of each buffer with rank j. */
static void alltoall_group(int nranks, ncclComm_t comm, cudaStream_t s)
{
    call_ok("ncclGroupStart", ncclGroupStart());
    for (int j = 0; j < nranks; j++) {
        send_to(sendb + (size_t)j * COUNT, COUNT, j, comm, s);
        recv_from(recvb + (size_t)j * COUNT, COUNT, j, comm, s);
    }
    call_ok("ncclGroupEnd", ncclGroupEnd());
}

/* How many lines of the fake's log since fake_log_clear() start with @p prefix. */
static int count_lines(const char *prefix)
{
    char *log = read_file(getenv("FAKE_NCCL_LOG"));
    char *save = NULL;
    int k = 0;
    for (char *l = strtok_r(log, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        k += strncmp(l, prefix, strlen(prefix)) == 0;
    return k;
}

static void want_launch(char *line, uint64_t bytes, cudaStream_t s)
{
    snprintf(line, LINE_LEN, "mscx_exec_launch %llu %p", (unsigned long long)bytes, (void *)s);
}

static void check_summary(ncclComm_t comm, const char *const *has)
{
    char *line = summary_line(comm);
    for (int k = 0; line && has[k]; k++)
        if (!strstr(line, has[k]))
            FAIL("summary of comm %p: no '%s' in: %s", (void *)comm, has[k], line);
}

/* ---- one rank ---- */

/* A pair of this rank alone, in place: its AlltoAll, which leaves the buffer as it is. */
static void one_in_place(ncclComm_t comm)
{
    static char want[3][LINE_LEN];
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    send_to(sendb, COUNT, 0, comm, STREAM);
    recv_from(sendb, COUNT, 0, comm, STREAM);
    call_ok("ncclGroupEnd", ncclGroupEnd());
    snprintf(want[0], LINE_LEN, "ncclGroupStart");
    snprintf(want[1], LINE_LEN, "ncclGroupEnd");
    want_launch(want[2], COUNT * sizeof(float), STREAM);
    check_log_lines("one rank, in place", want[0], LINE_LEN, 3);
}

static void one_routed(ncclComm_t comm)
{
    static char want[3][LINE_LEN];
    fake_log_clear();
    alltoall_group(1, comm, STREAM);
    snprintf(want[0], LINE_LEN, "ncclGroupStart");
    snprintf(want[1], LINE_LEN, "ncclGroupEnd");
    want_launch(want[2], COUNT * sizeof(float), STREAM);
    check_log_lines("one rank, an AlltoAll group", want[0], LINE_LEN, 3);
}

/* A group of @p n sends (is_send[i]) and recvs, which must reach NCCL as they were issued. */
static void one_forwarded(const char *what, ncclComm_t comm, int n, const int *is_send, const size_t *count,
                          float *const *buf)
{
    static char want[8][LINE_LEN];
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    for (int i = 0; i < n; i++)
        if (is_send[i])
            send_to(buf[i], count[i], 0, comm, STREAM);
        else
            recv_from(buf[i], count[i], 0, comm, STREAM);
    call_ok("ncclGroupEnd", ncclGroupEnd());
    snprintf(want[0], LINE_LEN, "ncclGroupStart");
    for (int i = 0; i < n; i++)
        if (is_send[i])
            rec_fmt_ncclSend(want[1 + i], LINE_LEN, buf[i], count[i], ncclFloat32, 0, comm, STREAM);
        else
            rec_fmt_ncclRecv(want[1 + i], LINE_LEN, buf[i], count[i], ncclFloat32, 0, comm, STREAM);
    snprintf(want[1 + n], LINE_LEN, "ncclGroupEnd");
    check_log_lines(what, want[0], LINE_LEN, n + 2);
}

/*
 * A collective beside the pair, before (@p first) or after it: the pair goes
 * to NCCL inside its group, and the collective routes as it would alone,
 * launched before NCCL's group end when issued first, else after it.
 */
static void one_with_collective(ncclComm_t comm, int first)
{
    static char want[5][LINE_LEN];
    int at = first ? 3 : 4;
    fake_log_clear();
    call_ok("ncclGroupStart", ncclGroupStart());
    if (first)
        call_ok("ncclAllReduce", ncclAllReduce(sendb, recvb, COUNT, ncclFloat32, ncclSum, comm, STREAM));
    send_to(sendb, COUNT, 0, comm, STREAM);
    recv_from(recvb, COUNT, 0, comm, STREAM);
    if (!first)
        call_ok("ncclAllReduce", ncclAllReduce(sendb, recvb, COUNT, ncclFloat32, ncclSum, comm, STREAM));
    call_ok("ncclGroupEnd", ncclGroupEnd());
    snprintf(want[0], LINE_LEN, "ncclGroupStart");
    rec_fmt_ncclSend(want[1], LINE_LEN, sendb, COUNT, ncclFloat32, 0, comm, STREAM);
    rec_fmt_ncclRecv(want[2], LINE_LEN, recvb, COUNT, ncclFloat32, 0, comm, STREAM);
    want_launch(want[at], COUNT * sizeof(float), STREAM);
    snprintf(want[first ? 4 : 3], LINE_LEN, "ncclGroupEnd");
    check_log_lines(first ? "a collective, then the pair" : "the pair, then a collective", want[0], LINE_LEN,
                    5);
}

static void mode_one(void)
{
    ncclComm_t comm = new_comm();
    one_routed(comm);
    static const int pair[] = {1, 0}, sends2[] = {1, 1, 0}, send1[] = {1};
    static const size_t uneven[] = {COUNT, COUNT + 1}, even[] = {COUNT, COUNT, COUNT};
    float *apart[] = {sendb, recvb, recvb}, *overlap[] = {sendb, sendb + COUNT / 2};
    one_forwarded("unequal counts", comm, 2, pair, uneven, apart);
    one_forwarded("a send without its recv", comm, 1, send1, even, apart);
    float *twice[] = {sendb, sendb, recvb};
    one_forwarded("two sends to one peer", comm, 3, sends2, even, twice);
    one_forwarded("overlapping buffers", comm, 2, pair, even, overlap);
    one_with_collective(comm, 1);
    one_with_collective(comm, 0);
    /* outside a group: NCCL's at once */
    char line[LINE_LEN];
    fake_log_clear();
    send_to(sendb, COUNT, 0, comm, STREAM);
    rec_fmt_ncclSend(line, LINE_LEN, sendb, COUNT, ncclFloat32, 0, comm, STREAM);
    check_log_lines("a send outside a group", line, LINE_LEN, 1);
    one_in_place(comm);
    one_routed(comm); /* still routes after all that */
    call_ok("ncclCommDestroy", ncclCommDestroy(comm));
    /* the three AlltoAlls; the overlapping pair is an AlltoAll's shape that this rank cannot run */
    static const char *const has[] = {
        "alltoall<=1K routed 3 fallback 1", "sendrecv 1", "allreduce<=1K routed 2",
        "plans: allreduce_n1_rpn1_copy_1K_4M 2 alltoall_n1_rpn1_copy_1K_4M 3", NULL};
    check_summary(comm, has);
    /* the summary file names the plan, its range and its calls */
    char path[4096];
    snprintf(path, sizeof(path), "%s.0", getenv("MSCX_SUMMARY_FILE"));
    const char *want =
        "{\"plan\": \"alltoall_n1_rpn1_copy_1K_4M\", \"coll\": \"alltoall\", \"min_bytes\": 1024, "
        "\"max_bytes\": 4194304, \"calls\": 3}";
    if (!strstr(read_file(path), want))
        FAIL("no '%s' in %s: %s", want, path, read_file(path));
}

/* ---- two ranks on two threads ---- */

struct rank_ctx {
    ncclComm_t comm;
    int rank;
    int step; /* which case to run */
    cudaStream_t stream;
    double ms; /* how long its group end took */
};

static pthread_barrier_t barrier;

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

enum step {
    STEP_ALLTOALL,     /* the AlltoAll group */
    STEP_PAIR_FIRST,   /* one send and recv with the other rank outside a group, then the AlltoAll group */
    STEP_NOT_ALLTOALL, /* rank 0: the AlltoAll group; rank 1: its pair with rank 0, and its own of twice the
                          count */
};

static void *rank_main(void *arg)
{
    struct rank_ctx *r = arg;
    int other = 1 - r->rank;
    pthread_barrier_wait(&barrier);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (r->step == STEP_PAIR_FIRST) {
        send_to(sendb, COUNT, other, r->comm, r->stream);
        recv_from(recvb, COUNT, other, r->comm, r->stream);
    }
    if (r->step == STEP_NOT_ALLTOALL && r->rank == 1) {
        call_ok("ncclGroupStart", ncclGroupStart());
        send_to(sendb, COUNT, other, r->comm, r->stream);
        recv_from(recvb, COUNT, other, r->comm, r->stream);
        send_to(sendb + COUNT, 2 * COUNT, r->rank, r->comm, r->stream);
        recv_from(recvb + COUNT, 2 * COUNT, r->rank, r->comm, r->stream);
        call_ok("ncclGroupEnd", ncclGroupEnd());
    } else {
        alltoall_group(2, r->comm, r->stream);
    }
    r->ms = ms_since(&t0);
    return NULL;
}

/* Both ranks run @p step at once, on their streams. */
static void both(struct rank_ctx *ranks, int step, cudaStream_t s0, cudaStream_t s1)
{
    pthread_t tid[2];
    fake_log_clear();
    ranks[0].stream = s0;
    ranks[1].stream = s1;
    for (int i = 0; i < 2; i++) {
        ranks[i].step = step;
        if (pthread_create(&tid[i], NULL, rank_main, &ranks[i]) != 0) {
            FAIL("cannot start a rank thread");
            exit(1);
        }
    }
    for (int i = 0; i < 2; i++)
        pthread_join(tid[i], NULL);
}

/* The launches and the NCCL sends and recvs of the last both(). */
static void expect(const char *what, int launches, int sends, int recvs)
{
    char line[LINE_LEN];
    want_launch(line, 2 * COUNT * sizeof(float), STREAM);
    int l = count_lines(line), s = count_lines("ncclSend "), r = count_lines("ncclRecv ");
    if (l != launches || s != sends || r != recvs)
        FAIL("%s: %d launches, %d sends, %d recvs to NCCL; expected %d, %d, %d", what, l, s, r, launches,
             sends, recvs);
}

static void quick(const char *what, const struct rank_ctx *ranks, double bound_ms)
{
    for (int i = 0; i < 2; i++)
        if (ranks[i].ms > bound_ms)
            FAIL("%s: rank %d took %.0f ms, more than %.0f", what, i, ranks[i].ms, bound_ms);
}

static void mode_ranks2(void)
{
    ncclComm_t comms[2] = {NULL, NULL};
    int devs[2] = {0, 1};
    if (ncclCommInitAll(comms, 2, devs) != ncclSuccess) {
        FAIL("ncclCommInitAll failed");
        return;
    }
    struct rank_ctx ranks[2] = {{comms[0], 0, 0, STREAM, 0}, {comms[1], 1, 0, STREAM, 0}};
    pthread_barrier_init(&barrier, NULL, 2);
    char capturing[32];
    snprintf(capturing, sizeof(capturing), "%p", (void *)STREAM);
    setenv("FAKE_CUDA_CAPTURING", capturing, 1);

    both(ranks, STEP_ALLTOALL, STREAM, STREAM);
    expect("captured on both", 2, 0, 0);
    both(ranks, STEP_ALLTOALL, STREAM_EAGER, STREAM_EAGER);
    expect("eager on both", 0, 4, 4);
    quick("eager on both", ranks, 500);
    both(ranks, STEP_ALLTOALL, STREAM, STREAM_EAGER);
    expect("captured on rank 0 only", 0, 4, 4);
    quick("captured on rank 0 only", ranks, 500);
    both(ranks, STEP_PAIR_FIRST, STREAM, STREAM);
    expect("after a pair outside a group", 2, 2, 2);
    /* rank 1 never votes: rank 0 waits for it until the bound, then votes no for good */
    both(ranks, STEP_NOT_ALLTOALL, STREAM, STREAM);
    expect("rank 1 not an AlltoAll", 0, 4, 4);
    if (ranks[0].ms < 1500)
        FAIL("rank 0 gave up after %.0f ms, before the bound", ranks[0].ms);
    quick("rank 1 not an AlltoAll", ranks, 10000);
    both(ranks, STEP_ALLTOALL, STREAM, STREAM);
    expect("after rank 0 gave up", 0, 4, 4);
    quick("after rank 0 gave up", ranks, 500);

    for (int i = 0; i < 2; i++)
        call_ok("ncclCommDestroy", ncclCommDestroy(comms[i]));
    static const char *const has0[] = {"alltoall<=8K routed 2 fallback 4", "sendrecv 4",
                                       "plans: alltoall_n2_rpn2_oneshot_1K_64K 2", NULL};
    static const char *const has1[] = {"alltoall<=8K routed 2 fallback 3", "sendrecv 3",
                                       "plans: alltoall_n2_rpn2_oneshot_1K_64K 2", NULL};
    check_summary(comms[0], has0);
    check_summary(comms[1], has1);
    if (!strstr(read_file(getenv("MSCX_DEBUG_FILE")), "such groups of this communicator go to NCCL"))
        FAIL("no warning that rank 0 stopped waiting for votes");
}

static const struct shim_mode modes[] = {{"one", mode_one}, {"ranks2", mode_ranks2}};

int main(int argc, char **argv)
{
    if (argc != 2 || !getenv("FAKE_NCCL_LOG") || !getenv("MSCX_DEBUG_FILE") || !getenv("MSCX_SUMMARY_FILE")) {
        fprintf(stderr, "usage: FAKE_NCCL_LOG=... MSCX_DEBUG_FILE=... MSCX_SUMMARY_FILE=... %s MODE\n",
                argv[0]);
        return 2;
    }
#ifndef REC_HAVE_ncclAlltoAll
    printf("skip: the shim runs such groups as an AlltoAll, which this nccl.h lacks\n");
    return 77;
#endif
    return run_mode(argv[1], modes, sizeof(modes) / sizeof(modes[0]));
}
