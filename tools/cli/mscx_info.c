/* SPDX-License-Identifier: MIT */
/* mscx-info: print every MSCX_* variable with its default, current value and help. */
#include <stdio.h>
#include <string.h>

#include "mscx/env.h"

int main(int argc, char **argv)
{
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: mscx-info\nPrint every MSCX_* environment variable: default, current value, help.\n");
        return 0;
    }
    const struct mscx_config *cfg;
    mscx_status_t st = mscx_config_get(&cfg);
    mscx_config_dump(stdout);
    return st == MSCX_OK ? 0 : 1;
}
