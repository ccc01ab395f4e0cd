/* SPDX-License-Identifier: MIT */
/**
 * @file env.h
 * All configuration of mscx. Every MSCX_* environment variable is declared in
 * one table in executor/common/env.c, parsed once into an immutable struct.
 * No other file calls getenv().
 */
#ifndef MSCX_ENV_H
#define MSCX_ENV_H

#include <stdint.h>
#include <stdio.h>
#include "mscx/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mscx_config {
    /* logging */
    int debug_level;        /* enum mscx_log_level; MSCX_DEBUG */
    unsigned debug_subsys;  /* mask of enum mscx_log_subsys; MSCX_DEBUG_SUBSYS */
    const char *debug_file; /* MSCX_DEBUG_FILE, "" for stderr */
    /* shim */
    const char *plan_dir;       /* MSCX_PLAN_DIR, "" for the installed plans */
    int disable;                /* MSCX_DISABLE */
    const char *force_fallback; /* MSCX_FORCE_FALLBACK, comma list of collectives */
    int strict;                 /* MSCX_STRICT */
    const char *nccl_lib;       /* MSCX_NCCL_LIB */
    const char *summary_file;   /* MSCX_SUMMARY_FILE: shim routing summary (JSON), "" for none */
    /* executor */
    uint64_t timeout_ms;     /* MSCX_TIMEOUT_MS: kernel, proxy, exchange wait limit; 0 (default): none */
    uint64_t sim_timeout_ms; /* MSCX_SIM_TIMEOUT_MS: host executor wait limit */
    int packet;              /* MSCX_PACKET: enum mscx_pkt_format, or -1 for auto */
    int exec_compile;        /* MSCX_EXEC_COMPILE: compile launches for the kernel (default 1) */
    int pdl;                 /* MSCX_PDL: programmatic dependent launch where supported (default 1) */
    const char *trace;       /* MSCX_TRACE: trace output path, "" for off */
    uint64_t scratch_max;    /* MSCX_SCRATCH_MAX: bytes of scratch per plan context */
    /* transports */
    const char *ibv_so;        /* MSCX_IBV_SO */
    const char *ib_hca;        /* MSCX_IB_HCA */
    const char *transport;     /* MSCX_TRANSPORT: auto, ib, tcp */
    const char *socket_ifname; /* MSCX_SOCKET_IFNAME: TCP interface, "" for the default choice */
    uint64_t virtual_nodes;    /* MSCX_VIRTUAL_NODES (test only): split one host into N nodes */
};

/**
 * Get the configuration, parsing the environment on first use.
 * @param cfg_p set to the immutable configuration on success
 * @return MSCX_OK, or MSCX_ERR_INVALID_ARG when a variable holds a bad value
 *         (logged once, naming the variable); cfg_p is then untouched.
 */
mscx_status_t mscx_config_get(const struct mscx_config **cfg_p);

/**
 * As mscx_config_get(), but *cfg_p is always set on MSCX_OK and on
 * MSCX_ERR_INVALID_ARG: a bad value is then at its default. For the logger and
 * the shim, which keep working (on NCCL alone) under a bad setting.
 * @return MSCX_OK, MSCX_ERR_INVALID_ARG (a bad value, warned once) or MSCX_ERR_NO_MEMORY (cfg_p untouched)
 */
mscx_status_t mscx_config_get_lenient(const struct mscx_config **cfg_p);

/**
 * Non-zero when the configuration is degraded: some MSCX_* variable holds a
 * bad value (one WARN names the variable and the value) or a component
 * called mscx_config_mark_degraded() about a value only it can parse
 * (MSCX_FORCE_FALLBACK). A degraded process routes nothing: every call goes
 * to NCCL, and in a communicator's setup exchange this rank must vote "fall
 * back" so that every rank of the communicator falls back with it instead of
 * waiting for a rank that never joins. Under MSCX_STRICT=1 the shim fails
 * communicator init instead (ncclInvalidUsage, the reason in ncclGetLastError).
 * Cheap after the first call; thread-safe.
 */
int mscx_config_degraded(void);

/** Why the configuration is degraded (the WARN's text); "" when it is not. */
const char *mscx_config_degraded_reason(void);

/** Mark the configuration degraded with @p why; the first mark is kept and warned once. */
void mscx_config_mark_degraded(const char *why);

/**
 * Tests only: set a variable's value as if it came from the environment
 * (NULL to unset) and re-parse everything.
 * @return as mscx_config_get()
 */
mscx_status_t mscx_config_override(const char *name, const char *value);

/** Tests only: drop every override and re-read the real environment. */
void mscx_config_reset(void);

/** Print every variable with its default, current value and help text. */
void mscx_config_dump(FILE *out);

/**
 * The value of a variable that is not ours but says where Python packages
 * live (VIRTUAL_ENV, CONDA_PREFIX, PYTHONPATH, PYTHONHOME, HOME), for the
 * shim's search of NCCL's pip wheel. NULL when unset, empty, or not one of those.
 */
const char *mscx_env_python(const char *name);

/**
 * 1 when @p path names a file through the working directory: it has a
 * directory part that does not start at the root ("lib/x.so", "./x.so").
 * A library or search directory of such a path is never used: where it
 * points depends on where the process happens to run. A bare file name
 * ("libnccl.so.2", found by the loader's search) and an absolute path are 0.
 */
int mscx_path_relative(const char *path);

#ifdef __cplusplus
}
#endif
#endif /* MSCX_ENV_H */
