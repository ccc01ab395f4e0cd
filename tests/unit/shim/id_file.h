/* SPDX-License-Identifier: MIT */
/*
 * A unique id handed between the processes of a test world through a file:
 * the maker writes it at once (a rename), the others wait for it.
 */
#ifndef MSCX_TEST_ID_FILE_H
#define MSCX_TEST_ID_FILE_H

#include <stdio.h>
#include <time.h>

#include <nccl.h>

#include "../../common/fail.h"

/* Write @p id to @p path so that a reader sees all of it or nothing. @return 0, or -1 (a FAIL) */
static inline int id_file_write(const char *path, const ncclUniqueId *id)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof(*id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
        FAIL("cannot write an id to %s", path);
        return -1;
    }
    return 0;
}

/* Read the id at @p path into @p id, waiting for it at most @p wait_s seconds. @return 0, or -1 (a FAIL) */
static inline int id_file_read(const char *path, ncclUniqueId *id, int wait_s)
{
    for (int waited = 0; waited < wait_s * 1000; waited += 10) {
        FILE *f = fopen(path, "rb");
        size_t got = f ? fread(id, sizeof(*id), 1, f) : 0;
        if (f)
            fclose(f);
        if (got == 1)
            return 0;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    FAIL("no id in %s after %d s", path, wait_s);
    return -1;
}

#endif /* MSCX_TEST_ID_FILE_H */
