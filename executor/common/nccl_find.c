/* SPDX-License-Identifier: MIT */
/* Candidates for the real NCCL: NCCL's pip wheel, then the system's library (mscx/nccl_find.h). */
#define _GNU_SOURCE
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "mscx/env.h"
#include "mscx/nccl_find.h"

/* Each file matching @p dir_glob/MSCX_NCCL_WHEEL_LIB, in glob order. @return 0 when one was accepted. */
static int try_glob(const char *dir_glob, const char *how, mscx_nccl_try_fn try, void *ctx)
{
    char pattern[PATH_MAX + 64];
    if ((size_t)snprintf(pattern, sizeof(pattern), "%s/%s", dir_glob, MSCX_NCCL_WHEEL_LIB) >= sizeof(pattern))
        return -1;
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0)
        return -1; /* no match (or no memory): nothing to offer */
    int rc = -1;
    for (size_t i = 0; rc != 0 && i < g.gl_pathc; i++)
        rc = try(g.gl_pathv[i], how, ctx) == 0 ? 0 : -1;
    globfree(&g);
    return rc;
}

/* The site-packages of the prefix in variable @p var (a virtual environment, conda, PYTHONHOME). */
static int try_prefix_var(const char *var, const char *how, mscx_nccl_try_fn try, void *ctx)
{
    const char *prefix = mscx_env_python(var);
    char dir[PATH_MAX];
    if (!prefix || prefix[0] != '/' ||
        (size_t)snprintf(dir, sizeof(dir), "%s/lib/python3*/site-packages", prefix) >= sizeof(dir))
        return -1;
    return try_glob(dir, how, try, ctx);
}

/* Each entry of PYTHONPATH is a directory on Python's path itself. */
static int try_pythonpath(mscx_nccl_try_fn try, void *ctx)
{
    const char *path = mscx_env_python("PYTHONPATH");
    while (path && *path) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        char dir[PATH_MAX];
        if (n > 0 && n < sizeof(dir) && path[0] == '/') { /* a relative entry is the working directory's */
            memcpy(dir, path, n);
            dir[n] = '\0';
            if (try_glob(dir, "pip wheel (PYTHONPATH)", try, ctx) == 0)
                return 0;
        }
        path = end ? end + 1 : NULL;
    }
    return -1;
}

int mscx_nccl_find(mscx_nccl_try_fn try, void *ctx)
{
    static const char *const system_dirs[] = {
        "/usr/local/lib/python3*/dist-packages",
        "/usr/local/lib/python3*/site-packages",
        "/usr/lib/python3*/dist-packages",
        "/usr/lib/python3*/site-packages",
    };
    if (try_prefix_var("VIRTUAL_ENV", "pip wheel (VIRTUAL_ENV)", try, ctx) == 0 ||
        try_prefix_var("CONDA_PREFIX", "pip wheel (CONDA_PREFIX)", try, ctx) == 0 ||
        try_pythonpath(try, ctx) == 0 ||
        try_prefix_var("PYTHONHOME", "pip wheel (PYTHONHOME)", try, ctx) == 0)
        return 0;
    const char *home = mscx_env_python("HOME");
    char dir[PATH_MAX];
    if (home && home[0] == '/' &&
        (size_t)snprintf(dir, sizeof(dir), "%s/.local/lib/python3*/site-packages", home) < sizeof(dir) &&
        try_glob(dir, "pip wheel (user site-packages)", try, ctx) == 0)
        return 0;
    for (size_t i = 0; i < sizeof(system_dirs) / sizeof(system_dirs[0]); i++)
        if (try_glob(system_dirs[i], "pip wheel (system site-packages)", try, ctx) == 0)
            return 0;
    return try(MSCX_NCCL_SYSTEM_LIB, "system", ctx) == 0 ? 0 : -1;
}
