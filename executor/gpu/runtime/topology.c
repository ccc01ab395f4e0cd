/* SPDX-License-Identifier: MIT */
/*
 * Node topology (gpu_port.h): every rank placed on a node, and the checks
 * of every rank's ops that depend on it: memory channels stay within a
 * node, port ops either stay in the process or all go through the proxy,
 * and only proxied puts reach the buffers of another node.
 */
#include "mscx/log.h"
#include "gpu_port.h"

static const char *buf_name(unsigned t)
{
    return t == MSCX_BUF_INPUT     ? "input"
           : t == MSCX_BUF_OUTPUT  ? "output"
           : t == MSCX_BUF_SCRATCH ? "scratch"
                                   : "?";
}

static int data_port_op(unsigned opc)
{
    return opc == MSCX_OP_PUT || opc == MSCX_OP_PUT_WITH_SIGNAL || opc == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH ||
           opc == MSCX_OP_PUT_PACKETS || opc == MSCX_OP_READ_PUT_PACKETS;
}

static int sync_port_op(unsigned opc)
{
    return opc == MSCX_OP_SIGNAL || opc == MSCX_OP_RELAXED_SIGNAL || opc == MSCX_OP_WAIT ||
           opc == MSCX_OP_RELAXED_WAIT || opc == MSCX_OP_FLUSH;
}

/* Check one op of rank @p r (thread block @p b, index @p j in the block). */
static mscx_status_t check_op(const struct mscx_plan *plan, const struct gpu_peer *peers,
                              const uint32_t *node, uint32_t r, uint32_t b, uint32_t j,
                              const struct mscx_dev_op *op)
{
    const struct mscx_gpu *g = &plan->gpus[r];
    const char *name = mscx_opcode_name((enum mscx_opcode)op->opcode);
    int proxied = 0;
    if (op->chan_type == MSCX_CHAN_PORT && op->nchan > 0) {
        uint32_t np = 0;
        for (uint32_t i = 0; i < op->nchan; i++) {
            uint32_t c = op->chan[i];
            if (c < g->nchan[MSCX_CHAN_PORT] &&
                !mscx_gpu_same_proc(&peers[r], &peers[g->chan[MSCX_CHAN_PORT][c].peer]))
                np++;
        }
        if (np != 0 && np != op->nchan &&
            !(op->opcode == MSCX_OP_SIGNAL || op->opcode == MSCX_OP_RELAXED_SIGNAL ||
              op->opcode == MSCX_OP_WAIT || op->opcode == MSCX_OP_RELAXED_WAIT)) {
            MSCX_WARN(
                "plan %s: rank %u thread block %u op %u (%s): its port channels mix peers in this process "
                "and peers in other processes; refusing",
                plan->name, r, b, j, name);
            return MSCX_ERR_UNSUPPORTED;
        }
        proxied = np == op->nchan;
        if (proxied && !data_port_op(op->opcode) && !sync_port_op(op->opcode)) {
            MSCX_WARN(
                "plan %s: rank %u thread block %u op %u (%s): this operation is not supported on a port "
                "channel to another process (only put, pws, pwsf, ppkt, rppkt, signal, wait, flush); "
                "refusing",
                plan->name, r, b, j, name);
            return MSCX_ERR_UNSUPPORTED;
        }
    }
    for (uint32_t k = 0; k < op->nsrc + op->ndst; k++) {
        int is_dst = k >= op->nsrc;
        const struct mscx_dev_operand *o = is_dst ? &op->dst[k - op->nsrc] : &op->src[k];
        if (!(o->flags & MSCX_OPND_REMOTE))
            continue;
        if (o->rbuf >= g->nrbuf)
            continue; /* the validator reports this */
        const struct mscx_rbuf *rb = &g->rbuf[o->rbuf];
        int other_node = node[rb->rank] != node[r];
        int via_proxy = proxied && data_port_op(op->opcode);
        /* raw puts may write the peer's input or output buffer (resolved per launch), packet puts scratch */
        int raw_put = op->opcode == MSCX_OP_PUT || op->opcode == MSCX_OP_PUT_WITH_SIGNAL ||
                      op->opcode == MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH;
        if (via_proxy && (!is_dst || (rb->type != MSCX_BUF_SCRATCH && !raw_put))) {
            MSCX_WARN("plan %s: rank %u thread block %u op %u (%s): a port operation to another process must "
                      "write the peer's scratch buffer, or its input or output buffer with put, pws or pwsf "
                      "(%s operand %u names rank %u's %s buffer); refusing",
                      plan->name, r, b, j, name, is_dst ? "destination" : "source", is_dst ? k - op->nsrc : k,
                      rb->rank, buf_name(rb->type));
            return MSCX_ERR_UNSUPPORTED;
        }
        if (other_node && !via_proxy) {
            MSCX_WARN(
                "plan %s: rank %u thread block %u op %u (%s) reaches rank %u's buffer directly, but rank %u "
                "is on node %u and rank %u on node %u: only port put, pws, pwsf, ppkt and rppkt cross "
                "nodes; refusing",
                plan->name, r, b, j, name, rb->rank, r, node[r], rb->rank, node[rb->rank]);
            return MSCX_ERR_UNSUPPORTED;
        }
    }
    return MSCX_OK;
}

mscx_status_t mscx_gpu_topology(const struct mscx_plan *plan, const struct gpu_peer *peers, uint32_t *node)
{
    uint32_t n = plan->nranks;
    int32_t v = peers[0].vnodes;
    for (uint32_t r = 1; r < n; r++) {
        if (peers[r].vnodes != v) {
            MSCX_WARN("plan %s: MSCX_VIRTUAL_NODES differs between ranks (rank 0: %d, rank %u: %d); refusing",
                      plan->name, v, r, peers[r].vnodes);
            return MSCX_ERR_INVALID_ARG;
        }
    }
    if (v > 1 && (uint32_t)v > n) {
        MSCX_WARN("plan %s: MSCX_VIRTUAL_NODES %d is more than the plan's %u ranks; refusing", plan->name, v,
                  n);
        return MSCX_ERR_INVALID_ARG;
    }
    if (v > 1 && n % (uint32_t)v != 0) {
        MSCX_WARN("plan %s: MSCX_VIRTUAL_NODES %d does not divide the plan's %u ranks; refusing", plan->name,
                  v, n);
        return MSCX_ERR_INVALID_ARG;
    }
    uint32_t per = v > 1 ? n / (uint32_t)v : n, nodes = 0;
    for (uint32_t r = 0; r < n; r++) {
        node[r] = UINT32_MAX;
        for (uint32_t q = 0; q < r; q++)
            if (peers[q].host == peers[r].host && q / per == r / per) {
                node[r] = node[q];
                break;
            }
        if (node[r] == UINT32_MAX)
            node[r] = nodes++;
    }
    for (uint32_t r = 0; r < n; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t k = 0; k < g->nchan[MSCX_CHAN_MEMORY]; k++) {
            uint32_t p = g->chan[MSCX_CHAN_MEMORY][k].peer;
            if (node[p] != node[r]) {
                MSCX_WARN(
                    "plan %s: rank %u's memory channel %u to rank %u crosses nodes (node %u and node %u%s): "
                    "memory channels must stay within a node; refusing",
                    plan->name, r, k, p, node[r], node[p], v > 1 ? ", MSCX_VIRTUAL_NODES split" : "");
                return MSCX_ERR_UNSUPPORTED;
            }
        }
        for (uint32_t b = 0; b < g->ntb; b++)
            for (uint32_t j = 0; j < g->tb[b].nops; j++)
                MSCX_CHECK(check_op(plan, peers, node, r, b, j, &g->ops[g->tb[b].op_begin + j]));
    }
    return MSCX_OK;
}
