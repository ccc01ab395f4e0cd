/* SPDX-License-Identifier: MIT */
/*
 * Errors, bad settings and fork under the shim, against the fake libnccl.
 * Run with LD_PRELOAD=libmscx_nccl.so and FAKE_NCCL_LOG set; one mode per run:
 *
 *   --bad-env=VAR=VALUE  VAR holds a bad value: exactly one WARN names VAR and
 *                        VALUE (MSCX_DEBUG_FILE), and every call reaches the fake
 *                        and returns its result
 *   --strict-env=VAR     MSCX_STRICT=1 and VAR bad: communicator init fails with
 *                        ncclInvalidUsage naming VAR, other calls still reach the fake
 *   --debug-file=PATH    MSCX_DEBUG_FILE PATH cannot be opened: one WARN on stderr
 *                        names the variable and the path, the log goes to stderr
 *   --error-string       ncclGetErrorString() keeps the thread's last error, which
 *                        is per thread; a forwarded call brings back NCCL's own text
 *   --fork=SUMMARY_DIR   fork children while another thread makes and destroys
 *                        communicators: each child's NCCL calls finish, and no
 *                        child writes a summary (MSCX_SUMMARY_FILE SUMMARY_DIR/sum-%p.json;
 *                        the directory is the test's own, emptied first)
 *   --sticky             (the shim built with the fake executor, fake_exec.c) after
 *                        a kernel error, ncclCommGetAsyncError reports it and every
 *                        later collective on that communicator fails, routed or not
 *   --fork-log=FIFO      MSCX_DEBUG_FILE is the FIFO FIFO: the first log line blocks
 *                        in open() with the log lock held until a reader comes;
 *                        a fork() at that moment must give a child that can log
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#define SHIM_CHECK_FILE_MAX (1 << 16)
#include "shim_check.h"

static int count_lines_with(const char *text, const char *a, const char *b, const char *c)
{
    int n = 0;
    const char *line = text;
    while (*line) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char one[2048];
        snprintf(one, sizeof(one), "%.*s", (int)(len < sizeof(one) - 1 ? len : sizeof(one) - 1), line);
        if (strstr(one, a) && (!b || strstr(one, b)) && (!c || strstr(one, c)))
            n++;
        line += len + (end ? 1 : 0);
    }
    return n;
}

/* A communicator, an AllReduce and a destroy: each must reach the fake and return its success. */
static void calls_reach_fake(const char *why)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    float buf[64] = {0};
    int v = 0;
    memset(&id, 7, sizeof(id));
    fake_log_clear();
    if (ncclGetVersion(&v) != ncclSuccess || !fake_got("ncclGetVersion"))
        FAIL("%s: ncclGetVersion did not reach the fake", why);
    if (ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess || !comm || !fake_got("ncclCommInitRank"))
        FAIL("%s: ncclCommInitRank did not reach the fake", why);
    for (int i = 0; i < 3; i++)
        if (ncclAllReduce(buf, buf, 64, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess)
            FAIL("%s: ncclAllReduce failed", why);
    if (!fake_got("ncclAllReduce"))
        FAIL("%s: ncclAllReduce did not reach the fake", why);
    if (ncclCommDestroy(comm) != ncclSuccess || !fake_got("ncclCommDestroy"))
        FAIL("%s: ncclCommDestroy did not reach the fake", why);
}

static void run_bad_env(const char *var_value)
{
    char var[128];
    const char *eq = strchr(var_value, '=');
    if (!eq) {
        FAIL("--bad-env wants VAR=VALUE");
        return;
    }
    snprintf(var, sizeof(var), "%.*s", (int)(eq - var_value), var_value);
    calls_reach_fake(var_value);
    calls_reach_fake(var_value); /* a second round: still no more warnings */
    char *log = read_file(getenv("MSCX_DEBUG_FILE"));
    char quoted[256];
    snprintf(quoted, sizeof(quoted), "'%s'", eq + 1);
    int named = count_lines_with(log, "WARN", var, quoted), all = count_lines_with(log, "WARN", NULL, NULL);
    if (named != 1 || all != 1)
        FAIL("%s: %d WARN lines naming it, %d in all (expected one):\n%s", var_value, named, all, log);
    if (!strstr(log, "goes to NCCL"))
        FAIL("%s: the warning does not say that calls go to NCCL:\n%s", var_value, log);
}

static void run_strict_env(const char *var)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    int v = 0;
    memset(&id, 7, sizeof(id));
    fake_log_clear();
    ncclResult_t r = ncclCommInitRank(&comm, 1, id, 0);
    if (r != ncclInvalidUsage)
        FAIL("strict, bad %s: ncclCommInitRank returned %d, expected ncclInvalidUsage", var, (int)r);
    if (fake_got("ncclCommInitRank"))
        FAIL("strict, bad %s: the refused init reached the fake", var);
    const char *e = ncclGetLastError(NULL);
    if (!e || !strstr(e, var) || !strstr(e, "MSCX_STRICT"))
        FAIL("strict, bad %s: ncclGetLastError '%s' names neither it nor MSCX_STRICT", var, e ? e : "(null)");
    if (ncclGetVersion(&v) != ncclSuccess || !fake_got("ncclGetVersion"))
        FAIL("strict, bad %s: ncclGetVersion did not reach the fake", var);
    fake_log_clear();
    r = ncclCommInitRankConfig(&comm, 1, id, 0, NULL);
    if (r != ncclInvalidUsage || fake_got("ncclCommInitRankConfig"))
        FAIL("strict, bad %s: ncclCommInitRankConfig returned %d (reached the fake: %d)", var, (int)r,
             fake_got("ncclCommInitRankConfig"));
}

static void run_debug_file(const char *path)
{
    char tmpl[] = "/tmp/mscx-stderr-XXXXXX";
    int fd = mkstemp(tmpl);
    int saved = dup(STDERR_FILENO);
    if (fd < 0 || saved < 0 || dup2(fd, STDERR_FILENO) < 0) {
        FAIL("cannot redirect stderr");
        return;
    }
    calls_reach_fake("unopenable MSCX_DEBUG_FILE");
    calls_reach_fake("unopenable MSCX_DEBUG_FILE");
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(fd);
    char *err = read_file(tmpl);
    unlink(tmpl);
    int warned = count_lines_with(err, "WARN", "MSCX_DEBUG_FILE", path);
    if (warned != 1)
        FAIL("%d WARN lines on stderr name MSCX_DEBUG_FILE %s (expected one):\n%s", warned, path, err);
    if (!count_lines_with(err, "INFO", NULL, NULL)) /* the test runs with MSCX_DEBUG=INFO */
        FAIL("the log did not go to stderr:\n%s", err);
}

static ncclComm_t err_comm;
static char other_text[1024];

static void *other_thread_error(void *arg)
{
    (void)arg;
    float buf[4] = {0};
    ncclResult_t r = ncclAllReduce(buf, buf, 4, ncclFloat32, (ncclRedOp_t)-7, err_comm, NULL);
    const char *e = ncclGetLastError(err_comm);
    snprintf(other_text, sizeof(other_text), "%d %s", (int)r, e ? e : "(null)");
    return NULL;
}

static void run_error_string(void)
{
    ncclUniqueId id;
    float buf[4];
    memset(&id, 7, sizeof(id));
    memset(buf, 0, sizeof(buf));
    if (ncclCommInitRank(&err_comm, 1, id, 0) != ncclSuccess) {
        FAIL("ncclCommInitRank failed");
        return;
    }
    ncclResult_t r = ncclAllGather(buf, buf, 4, (ncclDataType_t)99, err_comm, NULL);
    if (r != ncclInvalidArgument)
        FAIL("a bad datatype on our comm returned %d, expected ncclInvalidArgument", (int)r);
    /* PyTorch: ncclGetErrorString(r) and ncclGetLastError(comm) in one expression, in either order */
    const char *s = ncclGetErrorString(r);
    const char *e = ncclGetLastError(err_comm);
    if (!s || !e || !strstr(e, "datatype"))
        FAIL("after ncclGetErrorString: ncclGetLastError '%s' lost the reason", e ? e : "(null)");
    e = ncclGetLastError(err_comm);
    s = ncclGetErrorString(r);
    if (!s || !e || !strstr(e, "datatype"))
        FAIL("ncclGetLastError before ncclGetErrorString: '%s'", e ? e : "(null)");
    /* another thread's error is its own */
    pthread_t t;
    pthread_create(&t, NULL, other_thread_error, NULL);
    pthread_join(t, NULL);
    if (!strstr(other_text, "operation"))
        FAIL("the other thread's own error: '%s'", other_text);
    e = ncclGetLastError(err_comm);
    if (!e || !strstr(e, "datatype"))
        FAIL("another thread's error replaced this thread's: '%s'", e ? e : "(null)");
    /* type 10 is fp8 from NCCL 2.24 on: the library decides, whatever header the shim was built on */
    float out[4];
    r = ncclAllReduce(buf, out, 4, (ncclDataType_t)10, ncclSum, err_comm, NULL);
    if (r != ncclSuccess)
        FAIL("type 10 (fp8) on our comm returned %d: it should reach NCCL, which takes it", (int)r);
    /* a call forwarded to NCCL that succeeds: NCCL's own text again, no stale error of ours */
    if (ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, err_comm, NULL) != ncclSuccess)
        FAIL("a good AllReduce failed");
    e = ncclGetLastError(err_comm);
    if (!e || strcmp(e, "fake:ncclGetLastError") != 0)
        FAIL("after a forwarded call ncclGetLastError is '%s', expected the fake's own", e ? e : "(null)");
    ncclCommDestroy(err_comm);
}

/* ---- fork ---- */

static atomic_int churn_stop;
static pid_t parent_pid;

/*
 * LeakSanitizer's hook: no leak check in a forked child, whose copy of the
 * heap holds what the parent's other threads (absent in the child) own.
 */
__attribute__((visibility("default"))) int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void)
{
    return parent_pid != 0 && getpid() != parent_pid;
}

/* Communicators made, used and destroyed as fast as possible: every shim lock is taken all the time. */
static void *churn(void *arg)
{
    (void)arg;
    ncclUniqueId id;
    float buf[4];
    memset(&id, 9, sizeof(id));
    while (!atomic_load(&churn_stop)) {
        ncclComm_t c = NULL;
        if (ncclCommInitRank(&c, 1, id, 0) != ncclSuccess)
            continue;
        ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, NULL);
        ncclAllGather(buf, buf, 4, (ncclDataType_t)99, c, NULL); /* refused by the shim */
        ncclCommDestroy(c);
    }
    return NULL;
}

static int child_calls(void)
{
    ncclUniqueId id;
    ncclComm_t c = NULL;
    float buf[4];
    memset(&id, 5, sizeof(id));
    if (ncclCommInitRank(&c, 1, id, 0) != ncclSuccess)
        return 2;
    if (ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, NULL) != ncclSuccess)
        return 3;
    if (ncclAllGather(buf, buf, 4, (ncclDataType_t)99, c, NULL) != ncclInvalidArgument)
        return 4;
    if (ncclCommDestroy(c) != ncclSuccess)
        return 5;
    return 0;
}

/* Wait for @p pid at most @p ms. @return its exit status, or -1 (then killed) */
static int wait_child(pid_t pid, int ms)
{
    for (int waited = 0; waited < ms; waited++) {
        int status;
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        struct timespec one = {0, 1000000};
        nanosleep(&one, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/*
 * An empty @p dir of this test's own: a summary left there by an earlier
 * run (or another program) under a pid a child now has would read as the
 * child's.
 */
static int fresh_dir(const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return -1;
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    struct dirent *e;
    char path[4096];
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, "sum-", 4)) {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    return 0;
}

static void run_fork(const char *dir)
{
    enum { NFORK = 100 };
    ncclUniqueId id;
    ncclComm_t mine = NULL;
    memset(&id, 3, sizeof(id));
    parent_pid = getpid();
    if (fresh_dir(dir) != 0) {
        FAIL("cannot empty %s: %s", dir, strerror(errno));
        return;
    }
    if (ncclCommInitRank(&mine, 1, id, 0) != ncclSuccess) {
        FAIL("ncclCommInitRank failed");
        return;
    }
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, churn, NULL);
    int hung = 0, failed = 0, wrote = 0;
    for (int i = 0; i < NFORK; i++) {
        pid_t pid = fork();
        if (pid == 0)
            exit(child_calls()); /* exit(): the inherited exit hooks run */
        if (pid < 0) {
            FAIL("fork: %s", strerror(errno));
            break;
        }
        int st = wait_child(pid, 10000);
        char path[4096];
        snprintf(path, sizeof(path), "%s/sum-%ld.json", dir, (long)pid);
        hung += st < 0;
        failed += st > 0;
        wrote += exists(path);
        if (st != 0 && hung + failed == 1)
            FAIL("child %d: %s %d", i, st < 0 ? "hung: killed after 10 s" : "exit status", st);
    }
    atomic_store(&churn_stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    if (hung || failed)
        FAIL("%d of %d children hung, %d failed", hung, NFORK, failed);
    if (wrote)
        FAIL("%d of %d children wrote a summary file", wrote, NFORK);
    /* the parent's own summary is written: the check above can see one */
    ncclCommDestroy(mine);
    char path[4096];
    snprintf(path, sizeof(path), "%s/sum-%ld.json", dir, (long)getpid());
    if (!exists(path))
        FAIL("the parent wrote no summary %s", path);
    printf(
        "%d children forked beside 2 threads making communicators: %d hung, %d failed, %d wrote a summary\n",
        NFORK, hung, failed, wrote);
}

/* ---- the sticky error of a communicator ---- */

static int injected_error; /* mscx_status_t the fake executor reports, 0: none */

/* Read by fake_exec.c's mscx_exec_async_error() through dlsym. */
__attribute__((visibility("default"))) int mscxFakeExecError(void);
int mscxFakeExecError(void)
{
    return injected_error;
}

static void run_sticky(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL, other = NULL;
    static float buf[1 << 16];
    ncclResult_t async = ncclInternalError;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess ||
        ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&other, 1, id, 0) != ncclSuccess) {
        FAIL("ncclCommInitRank failed");
        return;
    }
    fake_log_clear();
    if (ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess ||
        !fake_got("mscx_exec_launch"))
        FAIL("the first AllReduce was not routed to the (fake) executor");
    if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async != ncclSuccess)
        FAIL("before the error: ncclCommGetAsyncError says %d", (int)async);
    injected_error = -7; /* MSCX_ERR_TIMEOUT, as a kernel past MSCX_TIMEOUT_MS records it */
    if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async != ncclSystemError)
        FAIL("after a kernel timeout ncclCommGetAsyncError says %d, expected ncclSystemError", (int)async);
    injected_error = 0; /* the error word may even be cleared: the communicator's error stays */
    fake_log_clear();
    ncclResult_t r = ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, comm, NULL);
    if (r != ncclSystemError)
        FAIL("an AllReduce after the error returned %d, expected ncclSystemError", (int)r);
    const char *e = ncclGetLastError(comm);
    if (!e || !strstr(e, "failed"))
        FAIL("ncclGetLastError after the sticky error: '%s'", e ? e : "(null)");
    const char *s = ncclGetErrorString(r);
    e = ncclGetLastError(comm);
    if (!s || !e || !strstr(e, "failed"))
        FAIL("ncclGetErrorString cleared the reason: '%s'", e ? e : "(null)");
    r = ncclAllGather(buf, buf, 1 << 14, ncclFloat32, comm, NULL); /* a size that would go to NCCL */
    if (r != ncclSystemError)
        FAIL("an AllGather after the error returned %d, expected ncclSystemError", (int)r);
    r = ncclBroadcast(buf, buf, 16, ncclFloat32, 0, comm, NULL);
    if (r != ncclSystemError)
        FAIL("a Broadcast after the error returned %d, expected ncclSystemError", (int)r);
    if (fake_got("mscx_exec_launch") || fake_got("ncclAllReduce") || fake_got("ncclAllGather"))
        FAIL("a call after the error still ran:\n%s", read_file(getenv("FAKE_NCCL_LOG")));
    if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async != ncclSystemError)
        FAIL("later, ncclCommGetAsyncError says %d, expected ncclSystemError still", (int)async);
    /* another communicator is untouched */
    if (ncclAllReduce(buf, buf, 256, ncclFloat32, ncclSum, other, NULL) != ncclSuccess)
        FAIL("an AllReduce on another communicator failed");
    if (ncclCommGetAsyncError(other, &async) != ncclSuccess || async != ncclSuccess)
        FAIL("the other communicator reports %d", (int)async);
    ncclCommAbort(comm);
    ncclCommAbort(other); /* the fake's kernels run until an abort */
}

static const char *fifo_path;

/* The FIFO's reader, late: until it opens, the writer's open() waits with the log lock held. */
static void *fifo_reader(void *arg)
{
    (void)arg;
    struct timespec t = {0, 400 * 1000 * 1000};
    nanosleep(&t, NULL);
    int fd = open(fifo_path, O_RDONLY);
    char buf[4096];
    while (fd >= 0 && read(fd, buf, sizeof(buf)) > 0)
        ;
    return NULL;
}

static void *first_call(void *arg)
{
    (void)arg;
    int v;
    ncclGetVersion(&v); /* its INFO line opens the log */
    return NULL;
}

static void run_fork_log(const char *fifo)
{
    fifo_path = fifo;
    parent_pid = getpid();
    pthread_t r, t;
    pthread_create(&r, NULL, fifo_reader, NULL);
    pthread_detach(r);
    pthread_create(&t, NULL, first_call, NULL);
    struct timespec wait = {0, 150 * 1000 * 1000};
    nanosleep(&wait, NULL); /* the thread is in open() now, the log lock held */
    pid_t pid = fork();
    if (pid == 0)
        exit(child_calls());
    if (pid < 0) {
        FAIL("fork: %s", strerror(errno));
        return;
    }
    int st = wait_child(pid, 10000);
    if (st != 0)
        FAIL("the child forked while the log lock was held: %s %d",
             st < 0 ? "hung, killed after 10 s" : "exit status", st);
    pthread_join(t, NULL);
    printf("a child forked while the log was being opened logged and returned %d\n", st);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODE (see the source)\n", argv[0]);
        return 2;
    }
    const char *a = argv[1];
    if (!strncmp(a, "--bad-env=", 10))
        run_bad_env(a + 10);
    else if (!strncmp(a, "--strict-env=", 13))
        run_strict_env(a + 13);
    else if (!strncmp(a, "--debug-file=", 13))
        run_debug_file(a + 13);
    else if (!strcmp(a, "--error-string"))
        run_error_string();
    else if (!strncmp(a, "--fork=", 7))
        run_fork(a + 7);
    else if (!strcmp(a, "--sticky"))
        run_sticky();
    else if (!strncmp(a, "--fork-log=", 11))
        run_fork_log(a + 11);
    else {
        fprintf(stderr, "unknown mode %s\n", a);
        return 2;
    }
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures ? 1 : 0;
}
