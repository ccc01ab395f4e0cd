/* SPDX-License-Identifier: MIT */
/*
 * Finding the real NCCL, lazily on the first call, and the thread's last
 * error. Order: MSCX_NCCL_LIB, a copy already loaded in the process, then
 * dlopen("libnccl.so.2"). A library whose ncclGetVersion is ours is refused,
 * so the shim never forwards to itself. Nothing here ever exits.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "shim_int.h"

/*
 * RTLD_DEEPBIND keeps the real NCCL's calls to its own exported functions
 * inside it instead of landing in our exports (the shim is preloaded). The
 * sanitizer runtimes refuse RTLD_DEEPBIND, so sanitizer builds (tests only,
 * against the fake library) leave it out.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LOADER_DLOPEN_FLAGS (RTLD_LAZY | RTLD_LOCAL)
#else
#define LOADER_DLOPEN_FLAGS (RTLD_LAZY | RTLD_LOCAL | RTLD_DEEPBIND)
#endif

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static void *real_fns[SHIM_FN_COUNT];
static void *real_handle;
static char real_path[PATH_MAX];
static int real_version;
static const struct mscx_config *load_cfg;
static ncclResult_t load_result = ncclSuccess;
static char load_reason[768];

static __thread char err_text[1024];
static __thread int err_set;
static __thread ncclResult_t err_res;

ncclResult_t shim_err_set(ncclResult_t res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_text, sizeof(err_text), fmt, ap);
    va_end(ap);
    err_set = 1;
    err_res = res;
    return res;
}

void shim_err_clear(void)
{
    err_set = 0;
}

int shim_err_is_set(void)
{
    return err_set;
}

const char *shim_err_text(void)
{
    return err_set ? err_text : "";
}

ncclResult_t shim_err_result(void)
{
    return err_set ? err_res : ncclSystemError;
}

/* The warning of a bad environment value, captured to name the variable. */
static char env_warning[512];

static void capture_warn(enum mscx_log_level level, unsigned subsys, const char *file, int line, const char *msg,
                         void *ctx)
{
    (void)subsys;
    (void)file;
    (void)line;
    (void)ctx;
    if (level == MSCX_LOG_WARN && !env_warning[0])
        snprintf(env_warning, sizeof(env_warning), "%s", msg);
}

/* Our own load address, to recognise ourselves behind any file name. */
static int is_ours(void *fn)
{
    Dl_info mine, theirs;
    if (!fn)
        return 0;
    if (!dladdr((void *)shim_real_fn, &mine) || !dladdr(fn, &theirs))
        return 0;
    return mine.dli_fbase == theirs.dli_fbase;
}

static void load_fail(ncclResult_t res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void load_fail(ncclResult_t res, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(load_reason, sizeof(load_reason), fmt, ap);
    va_end(ap);
    load_result = res;
    MSCX_WARN("%s", load_reason);
}

/*
 * Accept @p h as the real NCCL when it has ncclGetVersion and that function
 * is not ours. @return 0 when accepted (h is then kept), -1 otherwise.
 */
static int try_handle(void *h, const char *what, char *why, size_t whylen)
{
    void *gv = dlsym(h, "ncclGetVersion");
    if (!gv) {
        snprintf(why, whylen, "%s has no ncclGetVersion", what);
        return -1;
    }
    if (is_ours(gv)) {
        snprintf(why, whylen, "%s resolves to libmscx_nccl itself; refusing to forward to ourselves", what);
        return -1;
    }
    real_handle = h;
    Dl_info info;
    if (dladdr(gv, &info) && info.dli_fname)
        snprintf(real_path, sizeof(real_path), "%s", info.dli_fname);
    else
        snprintf(real_path, sizeof(real_path), "%s", what);
    return 0;
}

static void resolve_all(void)
{
    for (int i = 0; i < SHIM_FN_COUNT; i++) {
        real_fns[i] = dlsym(real_handle, shim_fn_names[i]);
        if (real_fns[i] && is_ours(real_fns[i]))
            real_fns[i] = NULL;
    }
    /* A real NCCL without the pnccl* names: profiling names go to the plain ones. */
    for (int i = 0; i < SHIM_FN_COUNT; i++)
        if (!real_fns[i])
            real_fns[i] = real_fns[shim_fn_base[i]];
}

/* Asked lazily (banner only), so that loading makes no call into the real NCCL. */
static pthread_once_t version_once = PTHREAD_ONCE_INIT;
static void query_version(void)
{
    ncclResult_t (*gv)(int *) = (ncclResult_t(*)(int *))real_fns[SHIM_FN_ncclGetVersion];
    if (!real_handle || !gv || gv(&real_version) != ncclSuccess)
        real_version = 0;
}

static void load_real(void)
{
    const struct mscx_config *cfg = NULL;
    char why[600] = "";

    /* Capture the env module's warning so every call can say which variable is bad. */
    mscx_log_set_handler(capture_warn, NULL);
    mscx_status_t st = mscx_config_get(&cfg);
    mscx_log_set_handler(NULL, NULL);
    if (st != MSCX_OK) {
        load_fail(ncclInvalidUsage, "mscx: %s; no call is forwarded until it is fixed",
                  env_warning[0] ? env_warning : "bad MSCX_* environment value");
        return;
    }
    load_cfg = cfg;

    if (cfg->nccl_lib[0]) {
        void *h = dlopen(cfg->nccl_lib, LOADER_DLOPEN_FLAGS);
        if (!h) {
            const char *e = dlerror();
            load_fail(ncclSystemError, "mscx: cannot load the real NCCL from MSCX_NCCL_LIB %s: %s", cfg->nccl_lib,
                      e ? e : "unknown error");
            return;
        }
        if (try_handle(h, cfg->nccl_lib, why, sizeof(why)) != 0) {
            load_fail(ncclSystemError, "mscx: MSCX_NCCL_LIB: %s", why);
            return;
        }
        goto resolved;
    }
    static const char *const names[] = {"libnccl.so.2", "libnccl.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h && try_handle(h, names[i], why, sizeof(why)) == 0)
            goto resolved;
    }
    void *h = dlopen("libnccl.so.2", LOADER_DLOPEN_FLAGS);
    if (!h) {
        const char *e = dlerror();
        load_fail(ncclSystemError,
                  "mscx: no real NCCL found (MSCX_NCCL_LIB unset, none loaded, dlopen libnccl.so.2: %s)",
                  e ? e : "unknown error");
        return;
    }
    if (try_handle(h, "libnccl.so.2", why, sizeof(why)) != 0) {
        load_fail(ncclSystemError, "mscx: no real NCCL found: %s", why);
        return;
    }
resolved:
    resolve_all();
    MSCX_INFO(MSCX_SUB_SHIM, "real NCCL %s", real_path);
}

void *shim_real_fn(enum shim_fn id)
{
    pthread_once(&load_once, load_real);
    if (!real_handle) {
        shim_err_set(load_result, "%s", load_reason);
        return NULL;
    }
    if (!real_fns[id]) {
        shim_err_set(ncclSystemError, "mscx: the real NCCL %s has no %s", real_path, shim_fn_names[id]);
        return NULL;
    }
    return real_fns[id];
}

const struct mscx_config *shim_config(void)
{
    pthread_once(&load_once, load_real);
    return load_cfg;
}

const char *shim_real_path(void)
{
    return real_path;
}

int shim_real_version(void)
{
    pthread_once(&version_once, query_version);
    return real_version;
}
