/* SPDX-License-Identifier: MIT */
/* placeholder, filled in by its owner */
typedef int mscx_placeholder_sim_t;
