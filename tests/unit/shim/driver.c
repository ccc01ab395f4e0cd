/* SPDX-License-Identifier: MIT */
/*
 * A program written against nccl.h and linked with the fake libnccl. Run it
 * with LD_PRELOAD=libmscx_nccl.so: every call must reach the fake with the
 * same arguments and return the fake's result.
 *
 * Modes (arguments):
 *   --fidelity           call every function; the fake must log exactly that call
 *   --unavailable=CODE   every call returns CODE without reaching the fake
 *   --msg=TEXT           ncclGetLastError must contain TEXT (with --unavailable)
 *   --checks             bad arguments on a comm of ours are refused by the shim as NCCL would;
 *                        on any other handle they reach the fake untouched
 *   --disabled           MSCX_DISABLE=1: bad arguments pass through; the CUDA driver is never loaded
 *   --expect-shim        the nccl* symbols must come from libmscx_nccl.so
 *   --version=N          ncclGetVersion must report N (the real library's)
 *   --lifecycle          init a comm, run collectives, destroy; all reach the fake
 *   --strict             with --lifecycle: init must fail with ncclInvalidUsage and the comm be destroyed
 *   --log-has=TEXT       afterwards the shim's MSCX_DEBUG_FILE must contain TEXT (repeatable)
 *   --no-destroy         with --lifecycle: leave the comm alive (the summary is written at exit)
 *   --split              with --lifecycle: also split the comm, run a collective on the child, destroy it
 *
 * With DRV_ID_FILE set, --lifecycle's id is shared by the processes of a
 * world (FAKE_NCCL_RANK): rank 0 takes it from ncclGetUniqueId and writes
 * it there, the others read it; otherwise it is a constant.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"
#include "id_file.h"
#include "shim_check.h"

static const char *log_path;
static int mode_unavailable = -1;
static const char *want_msg;
static ncclResult_t want_result;

void *drv_mem(struct drv *d, int k)
{
    return d->mem + (size_t)k * 512;
}

void *drv_opaque(struct drv *d, int k)
{
    return (void *)(uintptr_t)(0x7f0000100000ull + (uintptr_t)d->fn * 0x1000 + (uintptr_t)k * 0x40 + 0x10);
}

long drv_int(struct drv *d, int k)
{
    return 3 + k + 7L * d->fn;
}

void drv_fill(struct drv *d, void *p, size_t n, int k)
{
    for (size_t i = 0; i < n; i++)
        ((unsigned char *)p)[i] = (unsigned char)(i * 31 + (size_t)k + (size_t)d->fn);
}

static char *read_log(void)
{
    FILE *f = fopen(log_path, "r");
    if (!f)
        return strdup("");
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strdup(buf);
}

void drv_before(struct drv *d)
{
    (void)d;
    FILE *f = fopen(log_path, "w");
    if (f)
        fclose(f);
}

/*
 * 1 when @p rest holds only the shim's queries of a communicator it sets up
 * (its rank count, rank and device: every new blocking communicator's, for
 * the agreement of its ranks), one record a line.
 */
static int only_setup_queries(const char *rest)
{
    static const char *const names[] = {"ncclCommCount ",  "ncclCommUserRank ",  "ncclCommCuDevice ",
                                        "pncclCommCount ", "pncclCommUserRank ", "pncclCommCuDevice "};
    while (*rest) {
        int known = 0;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
            known |= !strncmp(rest, names[i], strlen(names[i]));
        const char *nl = strchr(rest, '\n');
        if (!known || !nl)
            return 0;
        rest = nl + 1;
    }
    return 1;
}

static void check_log(const char *name, const char *want)
{
    char *got = read_log();
    if (mode_unavailable >= 0) {
        if (got[0])
            FAIL("%s: the fake was reached although the real NCCL is unavailable: %s", name, got);
    } else {
        size_t n = strlen(want);
        if (strncmp(got, want, n) != 0 || got[n] != '\n' || !only_setup_queries(got + n + 1))
            FAIL("%s: the fake logged\n  '%s'\nexpected exactly\n  '%s'", name, got, want);
    }
    free(got);
}

void drv_after_result(struct drv *d, const char *name, const char *want, ncclResult_t got)
{
    (void)d;
    check_log(name, want);
    if (got != want_result)
        FAIL("%s returned %d, expected %d", name, (int)got, (int)want_result);
    if (mode_unavailable >= 0 && want_msg) {
        const char *e = ncclGetLastError(NULL);
        if (!e || !strstr(e, want_msg))
            FAIL("%s: ncclGetLastError '%s' does not contain '%s'", name, e ? e : "(null)", want_msg);
    }
}

void drv_after_text(struct drv *d, const char *name, const char *want, const char *got, const char *fake_text)
{
    (void)d;
    check_log(name, want);
    if (mode_unavailable < 0 && (!got || strcmp(got, fake_text) != 0))
        FAIL("%s returned '%s', expected the fake's '%s'", name, got ? got : "(null)", fake_text);
}

void drv_after_void(struct drv *d, const char *name, const char *want)
{
    (void)d;
    check_log(name, want);
}

static void run_all(void)
{
    struct drv d;
    d.mem = calloc(16, 512);
    for (int i = 0; i < drv_ncalls; i++) {
        d.fn = i;
        drv_calls[i].call(&d);
    }
    free(d.mem);
    printf("%d functions called\n", drv_ncalls);
}

static int log_is_empty(void)
{
    char *got = read_log();
    int empty = got[0] == '\0';
    free(got);
    return empty;
}

/*
 * Bad arguments on a communicator the shim set up are refused by the shim, as
 * NCCL would, and the fake sees nothing. On a handle the shim did not create
 * (NULL included) every call reaches the fake untouched, bad or not.
 */
static void run_checks(int disabled)
{
    ncclComm_t foreign = (ncclComm_t)(uintptr_t)0x7f00deadb000ull, ours = NULL;
    ncclUniqueId id;
    float buf[4];
    char want[DRV_REC_MAX];
    memset(&id, 3, sizeof(id));
    if (ncclCommInitRank(&ours, 1, id, 0) != want_result || (want_result == ncclSuccess && !ours)) {
        FAIL("ncclCommInitRank for the checks failed");
        return;
    }
    enum { ALLREDUCE, ALLGATHER_BAD_TYPE, REDUCESCATTER_BAD_OP };
    struct {
        const char *what, *msg; /* msg NULL: the call must reach the fake */
        int call;
        ncclComm_t comm;
    } cases[] = {
        {"bad datatype", "datatype", ALLGATHER_BAD_TYPE, ours},
        {"bad op", "operation", REDUCESCATTER_BAD_OP, ours},
        {"null comm", NULL, ALLREDUCE, NULL},
        {"bad datatype, foreign comm", NULL, ALLGATHER_BAD_TYPE, foreign},
        {"bad op, foreign comm", NULL, REDUCESCATTER_BAD_OP, foreign},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        ncclComm_t comm = cases[k].comm;
        ncclResult_t res;
        drv_before(NULL);
        if (cases[k].call == ALLGATHER_BAD_TYPE) {
            rec_fmt_ncclAllGather(want, sizeof(want), buf, buf, 4, (ncclDataType_t)99, comm, NULL);
            res = ncclAllGather(buf, buf, 4, (ncclDataType_t)99, comm, NULL);
        } else if (cases[k].call == REDUCESCATTER_BAD_OP) {
            rec_fmt_ncclReduceScatter(want, sizeof(want), buf, buf, 4, ncclFloat32, (ncclRedOp_t)-3, comm,
                                      NULL);
            res = ncclReduceScatter(buf, buf, 4, ncclFloat32, (ncclRedOp_t)-3, comm, NULL);
        } else {
            rec_fmt_ncclAllReduce(want, sizeof(want), buf, buf, 4, ncclFloat32, ncclSum, comm, NULL);
            res = ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, comm, NULL);
        }
        if (disabled || !cases[k].msg) {
            /* pure pass-through: the fake decides */
            check_log(cases[k].what, want);
            if (res != want_result)
                FAIL("%s: returned %d, expected the fake's %d", cases[k].what, (int)res, (int)want_result);
            continue;
        }
        if (res != ncclInvalidArgument)
            FAIL("%s: returned %d, expected ncclInvalidArgument", cases[k].what, (int)res);
        if (!log_is_empty())
            FAIL("%s: an invalid call reached the fake", cases[k].what);
        const char *e = ncclGetLastError(comm);
        if (!e || !strstr(e, cases[k].msg))
            FAIL("%s: ncclGetLastError '%s' does not mention '%s'", cases[k].what, e ? e : "(null)",
                 cases[k].msg);
    }
    /* after a good call the real library's last error applies again */
    drv_before(NULL);
    ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, ours, NULL);
    const char *e = ncclGetLastError(ours);
    if (!e || strcmp(e, "fake:ncclGetLastError") != 0)
        FAIL("ncclGetLastError after a forwarded call: '%s', expected the fake's", e ? e : "(null)");
    ncclCommDestroy(ours);
}

static int log_has(const char *text)
{
    char *got = read_log();
    int has = strstr(got, text) != NULL;
    free(got);
    return has;
}

/* The id of --lifecycle's comm: shared through DRV_ID_FILE by a world's processes, else a constant. */
static int lifecycle_id(ncclUniqueId *id)
{
    const char *path = getenv("DRV_ID_FILE"), *rank = getenv("FAKE_NCCL_RANK");
    memset(id, 7, sizeof(*id));
    if (!path)
        return 0;
    if (!rank || atoi(rank) == 0) {
        if (ncclGetUniqueId(id) != ncclSuccess) {
            FAIL("ncclGetUniqueId failed");
            return -1;
        }
        return id_file_write(path, id);
    }
    return id_file_read(path, id, 20);
}

/* A child of @p comm by ncclCommSplit: a collective on it and its destroy reach the fake. */
static void run_split(ncclComm_t comm)
{
    ncclComm_t child = NULL;
    float buf[256];
    memset(buf, 0, sizeof(buf));
    drv_before(NULL);
    if (ncclCommSplit(comm, 0, 0, &child, NULL) != ncclSuccess || !child || !log_has("ncclCommSplit ")) {
        FAIL("ncclCommSplit did not reach the fake");
        return;
    }
    drv_before(NULL);
    if (ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, child, NULL) != ncclSuccess ||
        !log_has("ncclAllReduce "))
        FAIL("ncclAllReduce on the child did not reach the fake");
    drv_before(NULL);
    if (ncclCommDestroy(child) != ncclSuccess || !log_has("ncclCommDestroy "))
        FAIL("ncclCommDestroy of the child did not reach the fake");
}

/* A comm's life under the shim: every call still reaches the fake. */
static void run_lifecycle(int strict, int destroy, int split)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    float buf[256];
    if (lifecycle_id(&id) != 0)
        return;
    drv_before(NULL);
    ncclResult_t r = ncclCommInitRank(&comm, 2, id, 0);
    if (strict) {
        if (r != ncclInvalidUsage)
            FAIL("strict init with a bad plan returned %d, expected ncclInvalidUsage", (int)r);
        if (!log_has("ncclCommDestroy"))
            FAIL("strict init failure did not destroy the real comm");
        const char *e = ncclGetLastError(NULL);
        if (!e || !strstr(e, "MSCX_STRICT"))
            FAIL("strict init: ncclGetLastError '%s' does not name MSCX_STRICT", e ? e : "(null)");
        return;
    }
    if (r != ncclSuccess || !comm)
        FAIL("ncclCommInitRank returned %d", (int)r);
    for (int i = 0; i < 3; i++) {
        drv_before(NULL);
        r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL);
        if (r != ncclSuccess || !log_has("ncclAllReduce "))
            FAIL("ncclAllReduce %d did not reach the fake (result %d)", i, (int)r);
    }
    drv_before(NULL);
    if (ncclAllGather(buf, buf, 8, ncclFloat32, comm, NULL) != ncclSuccess || !log_has("ncclAllGather "))
        FAIL("ncclAllGather did not reach the fake");
    drv_before(NULL);
    if (ncclBroadcast(buf, buf, 4000, ncclFloat32, 1, comm, NULL) != ncclSuccess ||
        !log_has("ncclBroadcast "))
        FAIL("ncclBroadcast did not reach the fake");
    if (split)
        run_split(comm);
    if (!destroy)
        return;
    drv_before(NULL);
    if (ncclCommDestroy(comm) != ncclSuccess || !log_has("ncclCommDestroy "))
        FAIL("ncclCommDestroy did not reach the fake");
}

static void check_debug_file(const char *const *texts, int n)
{
    const char *path = getenv("MSCX_DEBUG_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    static char buf[1 << 16];
    size_t len = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[len] = '\0';
    if (f)
        fclose(f);
    for (int i = 0; i < n; i++)
        if (!strstr(buf, texts[i]))
            FAIL("the shim's log %s lacks '%s'; it holds:\n%s", path ? path : "(MSCX_DEBUG_FILE unset)",
                 texts[i], buf);
}

static void check_no_cuda_mapped(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    while (f && fgets(line, sizeof(line), f))
        if (strstr(line, "libcuda.so"))
            FAIL("a CUDA library is mapped under MSCX_DISABLE: %s", line);
    if (f)
        fclose(f);
}

int main(int argc, char **argv)
{
    int fidelity = 0, checks = 0, disabled = 0, expect_shim = 0, version = -1, lifecycle = 0, strict = 0;
    int destroy = 1, split = 0;
    const char *texts[8];
    int ntexts = 0;
    log_path = getenv("FAKE_NCCL_LOG");
    want_result = (ncclResult_t)(getenv("FAKE_NCCL_RESULT") ? atoi(getenv("FAKE_NCCL_RESULT")) : 0);
    if (!log_path) {
        fprintf(stderr, "FAKE_NCCL_LOG must be set\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fidelity"))
            fidelity = 1;
        else if (!strcmp(argv[i], "--checks"))
            checks = 1;
        else if (!strcmp(argv[i], "--disabled"))
            disabled = 1;
        else if (!strcmp(argv[i], "--expect-shim"))
            expect_shim = 1;
        else if (!strncmp(argv[i], "--unavailable=", 14))
            mode_unavailable = atoi(argv[i] + 14);
        else if (!strncmp(argv[i], "--msg=", 6))
            want_msg = argv[i] + 6;
        else if (!strcmp(argv[i], "--lifecycle"))
            lifecycle = 1;
        else if (!strcmp(argv[i], "--no-destroy"))
            destroy = 0;
        else if (!strcmp(argv[i], "--split"))
            split = 1;
        else if (!strcmp(argv[i], "--strict"))
            strict = 1;
        else if (!strncmp(argv[i], "--log-has=", 10) && ntexts < 8)
            texts[ntexts++] = argv[i] + 10;
        else if (!strncmp(argv[i], "--version=", 10))
            version = atoi(argv[i] + 10);
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (mode_unavailable >= 0)
        want_result = (ncclResult_t)mode_unavailable;
    if (expect_shim) {
        Dl_info info;
        void *sym = dlsym(RTLD_DEFAULT, "ncclAllReduce");
        if (!sym || !dladdr(sym, &info) || !info.dli_fname || !strstr(info.dli_fname, "libmscx_nccl"))
            FAIL("ncclAllReduce does not come from libmscx_nccl.so (LD_PRELOAD missing?): %s",
                 sym && dladdr(sym, &info) ? info.dli_fname : "?");
    }
    if (version >= 0) {
        int v = -1;
        drv_before(NULL);
        if (ncclGetVersion(&v) != ncclSuccess || v != version)
            FAIL("ncclGetVersion reported %d, expected the real library's %d", v, version);
    }
    /* before run_all(), which leaves a group open (it calls ncclGroupEnd before ncclGroupStart) */
    if (checks || disabled)
        run_checks(disabled);
    if (fidelity || mode_unavailable >= 0)
        run_all();
    if (disabled)
        check_no_cuda_mapped();
    if (lifecycle)
        run_lifecycle(strict, destroy, split);
    if (ntexts)
        check_debug_file(texts, ntexts);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
