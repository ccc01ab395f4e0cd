/* SPDX-License-Identifier: MIT */
/* Node placement from host identities, as every rank sees the same table. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mscx/log.h"
#include "shim_int.h"

uint32_t shim_topo_ranks_per_node(const char *ids, uint32_t nranks)
{
    if (nranks == 0)
        return 0;
    /* Ranks of a node must be contiguous and every node equally large. */
    uint32_t rpn = 1;
    while (rpn < nranks && !strncmp(ids, ids + (size_t)rpn * SHIM_HOSTID_LEN, SHIM_HOSTID_LEN))
        rpn++;
    if (nranks % rpn)
        return 0;
    for (uint32_t r = 0; r < nranks; r++) {
        const char *node_first = ids + (size_t)(r / rpn) * rpn * SHIM_HOSTID_LEN;
        if (strncmp(ids + (size_t)r * SHIM_HOSTID_LEN, node_first, SHIM_HOSTID_LEN))
            return 0;
        /* a node's identity must not reappear in another block */
        if (r % rpn == 0 && r > 0) {
            for (uint32_t q = 0; q < r; q += rpn)
                if (!strncmp(ids + (size_t)q * SHIM_HOSTID_LEN, node_first, SHIM_HOSTID_LEN))
                    return 0;
        }
    }
    return rpn;
}

void shim_topo_host_id(uint32_t rank, uint32_t nranks, uint64_t virtual_nodes, char out[SHIM_HOSTID_LEN])
{
    char host[64] = "unknown";
    char boot[40] = "";
    gethostname(host, sizeof(host) - 1);
    host[sizeof(host) - 1] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    memset(out, 0, SHIM_HOSTID_LEN);
    if (virtual_nodes > 1 && nranks % virtual_nodes != 0) {
        static atomic_int warned;
        if (atomic_exchange(&warned, 1) == 0)
            MSCX_WARN("MSCX_VIRTUAL_NODES=%llu does not divide the %u ranks of a communicator: ignored there "
                      "(one node per host)",
                      (unsigned long long)virtual_nodes, nranks);
    }
    if (virtual_nodes > 1 && nranks % virtual_nodes == 0)
        snprintf(out, SHIM_HOSTID_LEN, "%s/%s/v%u", host, boot, (unsigned)(rank / (nranks / virtual_nodes)));
    else
        snprintf(out, SHIM_HOSTID_LEN, "%s/%s", host, boot);
}
