/* SPDX-License-Identifier: MIT */
/*
 * Finding the real NCCL, lazily on the first call, and the thread's last
 * error. Order: MSCX_NCCL_LIB, a copy already loaded in the process, the
 * libnccl.so.2 of NCCL's pip wheel, then dlopen("libnccl.so.2")
 * (mscx/nccl_find.h). A library whose ncclGetVersion is ours is refused,
 * so the shim never forwards to itself. Nothing here ever exits. A bad
 * MSCX_* setting keeps the process on NCCL alone (config_check()).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "mscx/nccl_find.h"
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
/* What every call reads, on one cache line: set once, by load_real() */
static struct {
    atomic_int done;               /* load_real() has run */
    int strict;                    /* MSCX_STRICT=1 in a degraded configuration: communicator init fails */
    int routing;                   /* the configuration is published and MSCX_DISABLE unset */
    void *handle;                  /* the real NCCL */
    const struct mscx_config *cfg; /* NULL while degraded */
} hot __attribute__((aligned(64)));
static void *real_fns[SHIM_FN_COUNT];
static char real_path[PATH_MAX];
static const char *real_how = ""; /* the rule that found it: "MSCX_NCCL_LIB", "already loaded", ... */
static int real_version;
static const struct mscx_config *lenient_cfg; /* even when degraded: bad values at their defaults */
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

SHIM_HOT void shim_err_clear(void)
{
    err_set = 0;
}

SHIM_HOT int shim_err_is_set(void)
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

/* The DT_SONAME of the object at @p lm, or NULL. */
static const char *soname_of(const struct link_map *lm)
{
    const char *strtab = NULL;
    ElfW(Xword) off = 0;
    int named = 0;
    for (const ElfW(Dyn) *d = lm ? lm->l_ld : NULL; d && d->d_tag != DT_NULL; d++) {
        if (d->d_tag == DT_STRTAB)
            strtab = (const char *)d->d_un.d_ptr;
        else if (d->d_tag == DT_SONAME)
            off = d->d_un.d_val, named = 1;
    }
    if (!strtab || !named)
        return NULL;
    if ((ElfW(Addr))strtab < lm->l_addr)
        strtab += lm->l_addr; /* an unrelocated entry (a read-only dynamic section) */
    return strtab + off;
}

/* A copy of our file loaded from another path: the same soname (is_ours() sees another load address). */
static int is_our_copy(void *h)
{
    Dl_info mine;
    struct link_map *my_lm = NULL, *their_lm = NULL;
    if (!dladdr1((void *)shim_real_fn, &mine, (void **)&my_lm, RTLD_DL_LINKMAP) ||
        dlinfo(h, RTLD_DI_LINKMAP, &their_lm) != 0)
        return 0;
    const char *ours = soname_of(my_lm), *theirs = soname_of(their_lm);
    return ours && theirs && strcmp(ours, theirs) == 0;
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
    if (is_our_copy(h)) {
        snprintf(why, whylen,
                 "%s is a copy of libmscx_nccl (the same soname); refusing to forward to ourselves", what);
        return -1;
    }
    hot.handle = h;
    Dl_info info;
    if (dladdr(gv, &info) && info.dli_fname)
        snprintf(real_path, sizeof(real_path), "%s", info.dli_fname);
    else
        snprintf(real_path, sizeof(real_path), "%s", what);
    return 0;
}

struct find_ctx {
    char *why; /* the last candidate's problem */
    size_t whylen;
};

/* mscx_nccl_find()'s callback: load @p path and accept it as try_handle() does. */
static int try_candidate(const char *path, const char *how, void *ctx)
{
    struct find_ctx *fc = ctx;
    void *h = dlopen(path, LOADER_DLOPEN_FLAGS);
    if (!h) {
        const char *e = dlerror();
        snprintf(fc->why, fc->whylen, "dlopen %s: %s", path, e ? e : "unknown error");
        return -1;
    }
    if (try_handle(h, path, fc->why, fc->whylen) != 0) {
        dlclose(h);
        return -1;
    }
    real_how = how;
    return 0;
}

static void resolve_all(void)
{
    for (int i = 0; i < SHIM_FN_COUNT; i++) {
        real_fns[i] = dlsym(hot.handle, shim_fn_names[i]);
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
    if (!hot.handle || !gv || gv(&real_version) != ncclSuccess)
        real_version = 0;
}

/*
 * The one rule for a bad setting: a bad MSCX_* value (warned once by the env
 * module, naming it) or a bad MSCX_FORCE_FALLBACK degrades the process:
 * shim_config() is then NULL, so nothing is routed and every call goes to
 * NCCL; under MSCX_STRICT=1 communicator init fails instead (shim_real_fn()).
 * Otherwise the configuration is published.
 */
static void config_check(const struct mscx_config *cfg)
{
    unsigned forced;
    lenient_cfg = cfg;
    if (shim_parse_forced(cfg->force_fallback, &forced) != 0) {
        char why[512];
        snprintf(why, sizeof(why),
                 "bad environment value: MSCX_FORCE_FALLBACK '%.200s': expected a comma list of allreduce, "
                 "allgather, reducescatter, alltoall, broadcast or all; mscx routes nothing in this process, "
                 "every "
                 "call goes to NCCL (with MSCX_STRICT=1 communicator init fails instead)",
                 cfg->force_fallback);
        mscx_config_mark_degraded(why);
    }
    if (mscx_config_degraded()) {
        hot.strict = cfg->strict;
        return;
    }
    hot.cfg = cfg;
    hot.routing = !cfg->disable;
}

static void load(void)
{
    const struct mscx_config *cfg = NULL;
    char why[600] = "";

    /* A bad value is at its default here; config_check() keeps such a process on NCCL alone. */
    mscx_status_t st = mscx_config_get_lenient(&cfg);
    if (st != MSCX_OK && st != MSCX_ERR_INVALID_ARG) {
        load_fail(ncclSystemError, "mscx: cannot parse the MSCX_* environment: %s", mscx_status_str(st));
        return;
    }
    config_check(cfg);

    if (cfg->nccl_lib[0]) {
        if (mscx_path_relative(cfg->nccl_lib)) {
            load_fail(ncclSystemError,
                      "mscx: MSCX_NCCL_LIB %s is a relative path; give an absolute path or a "
                      "library name",
                      cfg->nccl_lib);
            return;
        }
        void *h = dlopen(cfg->nccl_lib, LOADER_DLOPEN_FLAGS);
        if (!h) {
            const char *e = dlerror();
            load_fail(ncclSystemError, "mscx: cannot load the real NCCL from MSCX_NCCL_LIB %s: %s",
                      cfg->nccl_lib, e ? e : "unknown error");
            return;
        }
        if (try_handle(h, cfg->nccl_lib, why, sizeof(why)) != 0) {
            load_fail(ncclSystemError, "mscx: MSCX_NCCL_LIB: %s", why);
            return;
        }
        real_how = "MSCX_NCCL_LIB";
        goto resolved;
    }
    static const char *const names[] = {"libnccl.so.2", "libnccl.so"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        void *h = dlopen(names[i], RTLD_LAZY | RTLD_NOLOAD);
        if (h && try_handle(h, names[i], why, sizeof(why)) == 0) {
            real_how = "already loaded";
            goto resolved;
        }
    }
    struct find_ctx fc = {why, sizeof(why)};
    snprintf(why, sizeof(why), "no candidate");
    if (mscx_nccl_find(try_candidate, &fc) != 0) {
        load_fail(ncclSystemError,
                  "mscx: no real NCCL found (MSCX_NCCL_LIB unset, none loaded, no usable "
                  "pip wheel nvidia-nccl-cu12/13, then: %s)",
                  why);
        return;
    }
resolved:
    resolve_all();
    MSCX_INFO(MSCX_SUB_SHIM, "real NCCL %s (%s)", real_path, real_how);
}

static void load_real(void)
{
    load();
    atomic_store_explicit(&hot.done, 1, memory_order_release);
}

/* load_real() once: after it ran, one load of the line every call reads */
static inline void loaded(void)
{
    if (!atomic_load_explicit(&hot.done, memory_order_acquire))
        pthread_once(&load_once, load_real);
}

/* The functions that create a communicator. */
static int is_init_fn(enum shim_fn id)
{
    switch (shim_fn_base[id]) {
    case SHIM_FN_ncclCommInitRank:
    case SHIM_FN_ncclCommInitRankConfig:
    case SHIM_FN_ncclCommInitAll:
    case SHIM_FN_ncclCommSplit:
#ifdef SHIM_HAVE_ncclCommInitRankScalable
    case SHIM_FN_ncclCommInitRankScalable:
#endif
#ifdef SHIM_HAVE_ncclCommShrink
    case SHIM_FN_ncclCommShrink:
#endif
#ifdef SHIM_HAVE_ncclCommGrow
    case SHIM_FN_ncclCommGrow:
#endif
        return 1;
    default:
        return 0;
    }
}

SHIM_HOT void *shim_real_fn(enum shim_fn id)
{
    loaded();
    if (hot.strict && is_init_fn(id)) {
        shim_err_set(ncclInvalidUsage, "mscx: MSCX_STRICT: %s", mscx_config_degraded_reason());
        return NULL;
    }
    if (!hot.handle) {
        shim_err_set(load_result, "%s", load_reason);
        return NULL;
    }
    if (!real_fns[id]) {
        /* a shim built on a newer nccl.h over an older library: the call does not exist there */
        shim_err_set(ncclInvalidUsage,
                     "mscx: %s is not in the real NCCL %s (version %d); the application needs "
                     "a newer NCCL for it",
                     shim_fn_names[id], real_path, shim_real_version());
        return NULL;
    }
    return real_fns[id];
}

/* NULL while the configuration is degraded (config_check()): nothing routes, every call is forwarded. */
SHIM_HOT const struct mscx_config *shim_config(void)
{
    loaded();
    return hot.cfg;
}

SHIM_HOT int shim_routing_on(void)
{
    loaded();
    return hot.routing;
}

const struct mscx_config *shim_config_lenient(void)
{
    loaded();
    return lenient_cfg;
}

const char *shim_real_path(void)
{
    return real_path;
}

const char *shim_real_how(void)
{
    return real_how;
}

void *shim_real_sym(const char *name)
{
    loaded();
    return hot.handle ? dlsym(hot.handle, name) : NULL;
}

int shim_real_version(void)
{
    pthread_once(&version_once, query_version);
    return real_version;
}
