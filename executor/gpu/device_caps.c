/* SPDX-License-Identifier: MIT */
/* The choice of code and features for a device (see device_caps.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device_caps.h"

/* The build's architecture lists, from meson (gpu_arch): "80,90,100" and "100". */
#ifndef MSCX_GPU_SASS_LIST
#define MSCX_GPU_SASS_LIST ""
#endif
#ifndef MSCX_GPU_PTX_ARCH
#define MSCX_GPU_PTX_ARCH 0
#endif

void mscx_gpu_features_choose(int major, int minor, const struct mscx_gpu_image *img, bool pdl_wanted,
                              struct mscx_gpu_features *f)
{
    unsigned cc = (unsigned)(major * 10 + minor);
    memset(f, 0, sizeof(*f));
    for (unsigned i = 0; i < img->nsass; i++) {
        unsigned s = img->sass[i];
        if (s / 10 == (unsigned)major && s <= cc && s > f->sass)
            f->sass = s;
    }
    f->runs = f->sass != 0;
    if (!f->runs && img->ptx != 0 && img->ptx <= cc) {
        f->runs = true;
        f->jit = true;
    }
    unsigned built_for = f->jit ? img->ptx : f->sass;
    f->pdl = f->runs && pdl_wanted && major >= 9 && built_for >= 90;
}

int mscx_gpu_arch_list(const char *list, unsigned *out, unsigned max)
{
    unsigned n = 0;
    const char *p = list;
    while (p && *p) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v < 10 || v > 999 || (*end != ',' && *end != '\0') || n == max)
            return -1;
        out[n++] = (unsigned)v;
        p = *end == ',' ? end + 1 : end;
    }
    return (int)n;
}

void mscx_gpu_image_built(struct mscx_gpu_image *img)
{
    memset(img, 0, sizeof(*img));
    int n = mscx_gpu_arch_list(MSCX_GPU_SASS_LIST, img->sass, MSCX_GPU_IMAGE_MAX);
    img->nsass = n > 0 ? (unsigned)n : 0;
    img->ptx = MSCX_GPU_PTX_ARCH;
}

void mscx_gpu_features_describe(int major, int minor, const struct mscx_gpu_features *f, char *buf,
                                size_t len)
{
    if (!f->runs)
        snprintf(buf, len, "compute %d.%d: no code for it in this build", major, minor);
    else if (f->jit)
        snprintf(buf, len, "compute %d.%d: PTX compiled by the driver, PDL %s", major, minor,
                 f->pdl ? "on" : "off");
    else
        snprintf(buf, len, "compute %d.%d: SASS sm_%u, PDL %s", major, minor, f->sass, f->pdl ? "on" : "off");
}
