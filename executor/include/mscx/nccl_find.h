/* SPDX-License-Identifier: MIT */
/*
 * Where the real NCCL may be, after MSCX_NCCL_LIB and a copy already
 * loaded: the libnccl.so.2 of NCCL's pip wheel (nvidia-nccl-cu12,
 * nvidia-nccl-cu13) in a site-packages directory, then the system's. Shared
 * by the shim's loader (shim/loader.c) and mscx-info; it loads nothing itself.
 */
#ifndef MSCX_NCCL_FIND_H
#define MSCX_NCCL_FIND_H

/** The wheel's library below a site-packages directory. */
#define MSCX_NCCL_WHEEL_LIB "nvidia/nccl/lib/libnccl.so.2"
/** The system's library, as dlopen searches it. */
#define MSCX_NCCL_SYSTEM_LIB "libnccl.so.2"

/**
 * One candidate: @p path (a file, or MSCX_NCCL_SYSTEM_LIB for the dynamic
 * linker's search) and @p how it was found ("pip wheel (VIRTUAL_ENV)",
 * "system"). @return 0 to accept it and stop, non-zero to go on
 */
typedef int (*mscx_nccl_try_fn)(const char *path, const char *how, void *ctx);

/**
 * Offer every candidate to @p try, in order: site-packages directories from
 * VIRTUAL_ENV, CONDA_PREFIX, each PYTHONPATH entry, PYTHONHOME,
 * ~/.local/lib/python3.N/site-packages, /usr/local/lib/python3.N/{dist,site}-packages,
 * /usr/lib/python3.N/{dist,site}-packages (only files that exist), then
 * the system's libnccl.so.2. @return 0 when one was accepted, -1 otherwise
 */
int mscx_nccl_find(mscx_nccl_try_fn try, void *ctx);

#endif /* MSCX_NCCL_FIND_H */
