/* SPDX-License-Identifier: MIT */
/*
 * What the executor can use on a device, chosen from the device's compute
 * capability and the machine code the build holds. Plain C: the unit suite
 * checks the choice without a GPU.
 *
 * A build holds machine code (SASS) for some architectures and PTX for at
 * most one. SASS built for compute capability M.m runs on M.n with n >= m;
 * PTX built for P runs, compiled by the driver at load, on any device of
 * capability P or newer. Programmatic dependent launch needs a 9.0 device
 * and code built for 9.0 or newer: code built for older architectures has
 * no wait for the kernel ahead, so an early start would race with it.
 */
#ifndef MSCX_DEVICE_CAPS_H
#define MSCX_DEVICE_CAPS_H

#include <stdbool.h>
#include <stddef.h>

#define MSCX_GPU_IMAGE_MAX 8

/* The code a build holds, as capabilities times ten (80 for 8.0). */
struct mscx_gpu_image {
    unsigned sass[MSCX_GPU_IMAGE_MAX];
    unsigned nsass;
    unsigned ptx; /* 0: none */
};

struct mscx_gpu_features {
    bool runs;     /* the build has code for the device */
    bool jit;      /* ... only as PTX, compiled by the driver at load */
    unsigned sass; /* the SASS chosen (capability times ten), 0 with jit or when it cannot run */
    bool pdl;      /* programmatic dependent launch */
};

/**
 * The features for a device of compute capability @p major.@p minor.
 * @param pdl_wanted MSCX_PDL: use programmatic dependent launch where the device has it
 */
void mscx_gpu_features_choose(int major, int minor, const struct mscx_gpu_image *img, bool pdl_wanted,
                              struct mscx_gpu_features *f);

/** Parse a list of capabilities ("80,90,100") into @p out; @return how many, -1 on a bad list. */
int mscx_gpu_arch_list(const char *list, unsigned *out, unsigned max);

/** The code this build holds (from the build's architecture list). */
void mscx_gpu_image_built(struct mscx_gpu_image *img);

/** One line naming the capability and the features, e.g. "compute 9.0: SASS sm_90, PDL on". */
void mscx_gpu_features_describe(int major, int minor, const struct mscx_gpu_features *f, char *buf,
                                size_t len);

#endif /* MSCX_DEVICE_CAPS_H */
