/* SPDX-License-Identifier: MIT */
/* dlopen wrapper for libibverbs (see ibv_wrap.h). */
#define _GNU_SOURCE /* dlvsym */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ibv_wrap.h"
#include "mscx/env.h"
#include "mscx/log.h"

#define MAX_LOADED 4

struct loaded {
    char path[512];
    void *handle;
    struct mscx_ibv tab;
};

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static struct loaded loaded[MAX_LOADED];
static int nloaded;

static void *sym(void *h, const char *name, const char *version)
{
    void *p = dlvsym(h, name, version);
    if (!p)
        p = dlvsym(h, name, "IBVERBS_1.0");
    if (!p)
        p = dlsym(h, name);
    return p;
}

#define LOAD(field, name, version)                                                                           \
    do {                                                                                                     \
        *(void **)&t->field = sym(h, name, version);                                                         \
        if (!t->field) {                                                                                     \
            MSCX_WARN("ib: %s lacks %s@%s", path, name, version);                                            \
            return MSCX_ERR_IBV;                                                                             \
        }                                                                                                    \
    } while (0)

static mscx_status_t resolve(void *h, const char *path, struct mscx_ibv *t)
{
    LOAD(get_device_list, "ibv_get_device_list", "IBVERBS_1.1");
    LOAD(free_device_list, "ibv_free_device_list", "IBVERBS_1.1");
    LOAD(get_device_name, "ibv_get_device_name", "IBVERBS_1.1");
    LOAD(open_device, "ibv_open_device", "IBVERBS_1.1");
    LOAD(close_device, "ibv_close_device", "IBVERBS_1.1");
    LOAD(query_port, "ibv_query_port", "IBVERBS_1.1");
    LOAD(query_gid, "ibv_query_gid", "IBVERBS_1.1");
    LOAD(alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1");
    LOAD(dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1");
    LOAD(reg_mr, "ibv_reg_mr", "IBVERBS_1.1");
    LOAD(dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1");
    LOAD(create_cq, "ibv_create_cq", "IBVERBS_1.1");
    LOAD(destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1");
    LOAD(create_qp, "ibv_create_qp", "IBVERBS_1.1");
    LOAD(modify_qp, "ibv_modify_qp", "IBVERBS_1.1");
    LOAD(query_qp, "ibv_query_qp", "IBVERBS_1.1");
    LOAD(destroy_qp, "ibv_destroy_qp", "IBVERBS_1.1");
    /* Optional: only versioned lookup, an old library has no dmabuf support. */
    *(void **)&t->reg_dmabuf_mr = dlvsym(h, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
    return MSCX_OK;
}

mscx_status_t mscx_ibv_load(const struct mscx_ibv **ibv_p)
{
    const struct mscx_config *cfg;
    mscx_status_t st;

    MSCX_CHECK(mscx_config_get(&cfg));
    const char *path = cfg->ibv_so && cfg->ibv_so[0] ? cfg->ibv_so : "libibverbs.so.1";
    if (mscx_path_relative(path)) {
        MSCX_WARN(
            "ib: MSCX_IBV_SO %s is a relative path; not loaded (give an absolute path or a library name); "
            "RDMA disabled",
            path);
        return MSCX_ERR_UNSUPPORTED;
    }
    pthread_mutex_lock(&load_lock);
    for (int i = 0; i < nloaded; i++) {
        if (strcmp(loaded[i].path, path) == 0) {
            *ibv_p = &loaded[i].tab;
            pthread_mutex_unlock(&load_lock);
            return MSCX_OK;
        }
    }
    if (nloaded == MAX_LOADED || strlen(path) >= sizeof(loaded[0].path)) {
        MSCX_WARN("ib: cannot load another libibverbs (%s)", path);
        st = MSCX_ERR_IBV;
        goto out;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        MSCX_INFO(MSCX_SUB_IB, "ib: cannot open %s: %s; RDMA disabled", path, dlerror());
        st = MSCX_ERR_UNSUPPORTED;
        goto out;
    }
    struct loaded *l = &loaded[nloaded];
    memset(l, 0, sizeof(*l));
    st = resolve(h, path, &l->tab);
    if (st != MSCX_OK) {
        dlclose(h);
        goto out;
    }
    strcpy(l->path, path);
    l->handle = h;
    nloaded++;
    MSCX_INFO(MSCX_SUB_IB, "ib: loaded %s%s", path, l->tab.reg_dmabuf_mr ? " (dmabuf capable)" : "");
    *ibv_p = &l->tab;
out:
    pthread_mutex_unlock(&load_lock);
    return st;
}

const char *mscx_ibv_wc_status_str(enum ibv_wc_status st)
{
    switch (st) {
    case IBV_WC_SUCCESS:
        return "success";
    case IBV_WC_LOC_LEN_ERR:
        return "local length error";
    case IBV_WC_LOC_QP_OP_ERR:
        return "local qp operation error";
    case IBV_WC_LOC_PROT_ERR:
        return "local protection error (bad lkey)";
    case IBV_WC_WR_FLUSH_ERR:
        return "flushed (qp in error state)";
    case IBV_WC_REM_INV_REQ_ERR:
        return "remote invalid request";
    case IBV_WC_REM_ACCESS_ERR:
        return "remote access error (bad rkey or bounds)";
    case IBV_WC_REM_OP_ERR:
        return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR:
        return "transport retry exceeded (peer unreachable)";
    case IBV_WC_RNR_RETRY_EXC_ERR:
        return "rnr retry exceeded";
    default:
        return "other completion error";
    }
}
