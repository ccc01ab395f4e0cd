/* SPDX-License-Identifier: MIT */
/*
 * Calls that come from inside an NCCL library go back to it, untouched.
 *
 * The shim is preloaded, so it comes first in the global scope. An NCCL copy
 * opened without RTLD_DEEPBIND (a second libnccl.so.2 that a ctypes client
 * opens by path, or the real NCCL when the process had loaded it before us)
 * has its calls to its own exported functions bound to ours: real NCCL calls
 * ncclCommGetAsyncError in every collective's enqueue check, ncclGetVersion
 * at init, ncclCommRegister, ncclMemAlloc and ncclMemFree for its windows,
 * ncclBroadcast from ncclBcast. Forwarding such a call to our real NCCL hands
 * one copy's communicator to another copy. Instead it goes to the caller's
 * own definition, where the dynamic linker binds it when we are absent.
 *
 * The caller is the object holding the return address: looked up once per
 * object (dl_iterate_phdr) and kept in a table that every call reads without
 * a lock. An object entered there is pinned (RTLD_NODELETE), so its address
 * range never gets another owner. An NCCL library is an object other than us
 * and the main program that defines ncclGetVersion and the called function
 * itself. Not sent back: a call from inside the caller's own definition of
 * the same function (an interposer in front of us forwarding to the next
 * definition), and a call that would re-enter a bounce of the same function
 * of the same library on this thread.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "mscx/fork.h"
#include "mscx/log.h"
#include "shim_int.h"

#define CALLER_MAX 64 /* objects that called us */
#define COPY_MAX 16   /* NCCL libraries among them */
#define BOUNCE_MAX 16 /* nested bounces checked for re-entry, per thread */
#define FN_NONE ((uintptr_t)1)

/* An NCCL library: its own definitions, resolved on first use. */
struct nccl_copy {
    void *handle;
    struct link_map *map;
    _Atomic uintptr_t fn[SHIM_FN_COUNT];  /* 0: not resolved yet, FN_NONE: not defined there */
    _Atomic uintptr_t end[SHIM_FN_COUNT]; /* end of that definition's code (0: size unknown) */
};

/* An object that called us: its executable segments [lo, hi). */
struct caller {
    uintptr_t lo, hi;
    struct nccl_copy *copy; /* NULL: not an NCCL library */
};

/* The count beside the first entries: a call from a known object reads one line */
static struct {
    _Atomic unsigned n;
    struct caller at[CALLER_MAX];
} callers __attribute__((aligned(64)));
static struct nccl_copy copies[COPY_MAX];
static unsigned ncopies;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void caller_fork_init(void)
{
    mscx_fork_protect(&table_lock, MSCX_FORK_SHIM_CALLER);
}

static __thread uintptr_t bounce_fn[BOUNCE_MAX];
static __thread unsigned bounce_depth;

static const struct caller *cached(uintptr_t ra)
{
    unsigned n = atomic_load_explicit(&callers.n, memory_order_acquire);
    for (unsigned i = 0; i < n; i++)
        if (ra - callers.at[i].lo < callers.at[i].hi - callers.at[i].lo)
            return &callers.at[i];
    return NULL;
}

/* ---- finding and classifying an object (once per object) ---- */

struct found {
    uintptr_t ra;
    uintptr_t lo, hi;
    ElfW(Addr) base;
    const char *name;
    int hit;
};

static int find_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    struct found *f = arg;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    int hit = 0;
    (void)size;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t s = info->dlpi_addr + ph->p_vaddr, e = s + ph->p_memsz;
        hit |= f->ra >= s && f->ra < e;
        lo = s < lo ? s : lo;
        hi = e > hi ? e : hi;
    }
    if (!hit)
        return 0;
    f->hit = 1;
    f->lo = lo;
    f->hi = hi;
    f->base = info->dlpi_addr;
    f->name = info->dlpi_name;
    return 1;
}

static struct link_map *map_of(const void *addr)
{
    Dl_info info;
    struct link_map *map = NULL;
    if (!dladdr1(addr, &info, (void **)&map, RTLD_DL_LINKMAP))
        return NULL;
    return map;
}

/* The definition of @p name in @p map itself (not in one of its dependencies), or 0. */
static uintptr_t own_definition(void *handle, struct link_map *map, const char *name, uintptr_t *end_p)
{
    void *p = dlsym(handle, name);
    Dl_info info;
    const ElfW(Sym) *sym = NULL;
    *end_p = 0;
    if (!p || map_of(p) != map)
        return 0;
    if (dladdr1(p, &info, (void **)&sym, RTLD_DL_SYMENT) && sym && info.dli_saddr == p && sym->st_size)
        *end_p = (uintptr_t)p + sym->st_size;
    return (uintptr_t)p;
}

/*
 * Pin the object found and say whether it is an NCCL library.
 * @return 0 when pinned (or never unloaded: the main program), -1 when it
 *         cannot be kept in the table
 */
static int pin_and_classify(const struct found *f, void **handle_p, struct link_map **map_p)
{
    *handle_p = NULL;
    *map_p = NULL;
    /* The main program is never unloaded, and its calls to its own functions bind inside it. */
    if (!f->name || !f->name[0])
        return 0;
    void *h = dlopen(f->name, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    struct link_map *map = NULL;
    if (!h || dlinfo(h, RTLD_DI_LINKMAP, &map) != 0 || !map || map->l_addr != f->base)
        return -1; /* not this object by that name (another namespace): not kept */
    uintptr_t end;
    if (map != map_of((const void *)shim_caller_begin) && own_definition(h, map, "ncclGetVersion", &end)) {
        *handle_p = h;
        *map_p = map;
    }
    return 0;
}

static struct nccl_copy *copy_for(void *handle, struct link_map *map)
{
    for (unsigned i = 0; i < ncopies; i++)
        if (copies[i].map == map)
            return &copies[i];
    if (ncopies == COPY_MAX)
        return NULL;
    copies[ncopies].handle = handle;
    copies[ncopies].map = map;
    return &copies[ncopies++];
}

/*
 * The caller entry of @p ra, entered in the table when it can be. Falls back
 * to *tmp (valid for this call only) when the table is full or the object
 * cannot be pinned. The dl* calls run outside our lock: an object's
 * constructor that calls NCCL runs with the loader's lock held.
 */
SHIM_COLD static const struct caller *classify(uintptr_t ra, struct caller *tmp)
{
    struct found f = {.ra = ra};
    void *handle;
    struct link_map *map;
    tmp->lo = tmp->hi = 0;
    tmp->copy = NULL;
    dl_iterate_phdr(find_object, &f);
    if (!f.hit)
        return tmp; /* code outside every object (generated at run time): an application caller */
    int pinned = pin_and_classify(&f, &handle, &map) == 0, entered = 0;
    pthread_mutex_lock(&table_lock);
    const struct caller *c = cached(ra);
    if (!c) {
        unsigned n = atomic_load_explicit(&callers.n, memory_order_relaxed);
        *tmp = (struct caller){.lo = f.lo, .hi = f.hi, .copy = map ? copy_for(handle, map) : NULL};
        c = tmp;
        if (pinned && n < CALLER_MAX) {
            callers.at[n] = *tmp;
            atomic_store_explicit(&callers.n, n + 1, memory_order_release);
            c = &callers.at[n];
            entered = 1;
        }
    }
    pthread_mutex_unlock(&table_lock);
    if (map && !c->copy) {
        shim_warn_once("nccl-copies",
                       "mscx: more than %d NCCL libraries call the shim; the calls of %s to its "
                       "own functions go to the real NCCL",
                       COPY_MAX, f.name);
    } else if (entered && c->copy) {
        shim_config(); /* the configuration (and its warnings) first, as on any other first call */
        MSCX_INFO(MSCX_SUB_SHIM, "calls from inside %s to its own functions go back to it", f.name);
    }
    return c;
}

/* ---- per call ---- */

static uintptr_t copy_fn(struct nccl_copy *copy, enum shim_fn id, uintptr_t *end_p)
{
    uintptr_t fn = atomic_load_explicit(&copy->fn[id], memory_order_acquire);
    if (!fn) {
        uintptr_t end;
        fn = own_definition(copy->handle, copy->map, shim_fn_names[id], &end);
        atomic_store_explicit(&copy->end[id], end, memory_order_relaxed);
        atomic_store_explicit(&copy->fn[id], fn ? fn : FN_NONE, memory_order_release);
        fn = fn ? fn : FN_NONE;
    }
    *end_p = atomic_load_explicit(&copy->end[id], memory_order_relaxed);
    return fn == FN_NONE ? 0 : fn;
}

static int bouncing(uintptr_t fn)
{
    unsigned n = bounce_depth < BOUNCE_MAX ? bounce_depth : BOUNCE_MAX;
    for (unsigned i = 0; i < n; i++)
        if (bounce_fn[i] == fn)
            return 1;
    return 0;
}

SHIM_HOT void *shim_caller_begin(enum shim_fn id, const void *ret)
{
    uintptr_t ra = (uintptr_t)ret, end;
    struct caller tmp;
    const struct caller *c = cached(ra);
    if (!c)
        c = classify(ra, &tmp);
    if (!c->copy)
        return NULL;
    uintptr_t fn = copy_fn(c->copy, id, &end);
    if (!fn || (ra >= fn && ra < end) || bouncing(fn))
        return NULL;
    if (bounce_depth < BOUNCE_MAX)
        bounce_fn[bounce_depth] = fn;
    bounce_depth++;
    return (void *)fn;
}

SHIM_HOT void shim_caller_end(void)
{
    if (bounce_depth > 0)
        bounce_depth--;
}
