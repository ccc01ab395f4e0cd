/* SPDX-License-Identifier: MIT */
/* The NCCL API driver: calls every function of nccl.h and checks what reached the fake. */
#ifndef SHIM_DRIVER_H
#define SHIM_DRIVER_H
#include <stddef.h>
#include <stdint.h>
#include <nccl.h>
#include "rec_gen.h"

#define DRV_REC_MAX 2048

struct drv {
    int fn;             /* index of the call being made */
    unsigned char *mem; /* scratch for pointer arguments */
};

struct drv_call {
    const char *name;
    void (*call)(struct drv *d);
};
extern const struct drv_call drv_calls[];
extern const int drv_ncalls;

void *drv_mem(struct drv *d, int k);
void *drv_opaque(struct drv *d, int k);
long drv_int(struct drv *d, int k);
void drv_fill(struct drv *d, void *p, size_t n, int k);
void drv_before(struct drv *d);
void drv_after_result(struct drv *d, const char *name, const char *want, ncclResult_t got);
void drv_after_text(struct drv *d, const char *name, const char *want, const char *got,
                    const char *fake_text);
void drv_after_void(struct drv *d, const char *name, const char *want);
#endif
