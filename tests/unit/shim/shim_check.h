/* SPDX-License-Identifier: MIT */
/*
 * The checks that the shim's test programs share: a failure count with
 * FAIL(), the call log of the fake libnccl (FAKE_NCCL_LOG) and the shim's
 * log (MSCX_DEBUG_FILE). A program may define SHIM_CHECK_FILE_MAX before
 * including this header: read_file() reads at most that many bytes, less one.
 */
#ifndef SHIM_CHECK_H
#define SHIM_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <nccl.h>

#ifndef SHIM_CHECK_FILE_MAX
#define SHIM_CHECK_FILE_MAX (1 << 18)
#endif

#include "../../common/fail.h"

/* The text of the file @p path, empty when there is none; each call reuses one buffer. */
static inline char *read_file(const char *path)
{
    static char buf[SHIM_CHECK_FILE_MAX];
    FILE *f = path ? fopen(path, "r") : NULL;
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
    return buf;
}

static inline void fake_log_clear(void)
{
    const char *p = getenv("FAKE_NCCL_LOG");
    FILE *f = p ? fopen(p, "w") : NULL;
    if (f)
        fclose(f);
}

/* Non-zero when a line of the fake's log since fake_log_clear() starts with @p text, then a space or \n. */
static inline int fake_got(const char *text)
{
    char *log = read_file(getenv("FAKE_NCCL_LOG"));
    size_t n = strlen(text);
    for (char *p = log; (p = strstr(p, text)) != NULL; p += n)
        if ((p == log || p[-1] == '\n') && (p[n] == ' ' || p[n] == '\n'))
            return 1;
    return 0;
}

/*
 * The fake's log since fake_log_clear() must be exactly the @p n lines of
 * @p want, strings @p stride bytes apart (the rows of a char array).
 */
static inline void check_log_lines(const char *what, const char *want, size_t stride, int n)
{
    char *log = read_file(getenv("FAKE_NCCL_LOG"));
    char *save = NULL;
    int i = 0, bad = 0;
    for (char *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save), i++)
        if (i >= n || strcmp(line, want + (size_t)i * stride) != 0)
            bad = 1;
    if (!bad && i == n)
        return;
    FAIL("%s: the log differs from what was expected", what);
    fprintf(stderr, "expected:\n");
    for (int k = 0; k < n; k++)
        fprintf(stderr, "  %s\n", want + (size_t)k * stride);
    fprintf(stderr, "got:\n%s\n", read_file(getenv("FAKE_NCCL_LOG")));
}

/* The summary line of @p comm at its destroy in MSCX_DEBUG_FILE; NULL, and a FAIL, when there is none. */
static inline char *summary_line(ncclComm_t comm)
{
    char *log = read_file(getenv("MSCX_DEBUG_FILE"));
    char key[64];
    snprintf(key, sizeof(key), "comm %p rank", (void *)comm);
    char *save = NULL;
    for (char *line = strtok_r(log, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        if (strstr(line, key) && strstr(line, "destroy"))
            return line;
    FAIL("no summary of comm %p at its destroy in %s", (void *)comm, getenv("MSCX_DEBUG_FILE"));
    return NULL;
}

/* A communicator of a world of one rank; the program exits when there is none. */
static inline ncclComm_t new_comm(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess || !comm) {
        FAIL("ncclCommInitRank failed");
        exit(1);
    }
    return comm;
}

/* A mode of a test program: one check that runs on its own. */
struct shim_mode {
    const char *name;
    void (*run)(void);
};

/*
 * Runs the mode of the @p n @p modes named @p name and says "NAME: ok" when it
 * passed. @return the exit status: 0 passed, 1 failed, 2 no such mode.
 */
static inline int run_mode(const char *name, const struct shim_mode *modes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(name, modes[i].name) != 0)
            continue;
        modes[i].run();
        if (failures)
            return 1;
        printf("%s: ok\n", name);
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", name);
    return 2;
}

#endif
