/* SPDX-License-Identifier: MIT */
/*
 * Upload-time analysis of where the executor kernel needs __syncthreads():
 * every op gets MSCX_GPU_OPF_SYNC when a thread of its block may touch memory
 * that another thread of the block touched in an earlier op since the last
 * sync (write after write or read, raw read after write), before signals,
 * flushes, semaphore releases, nops, port-channel ops and pipelines, and
 * after waits, semaphore acquires and barriers. Packet reads of lines the
 * block wrote are flag-validated and need none; two accesses that map every
 * byte to the same thread (same operand shape and unit) need none either.
 */
#include <string.h>
#include "plan_model.h"
#include "launch_abi.h"

#define SYNC_MAX_ACC 64

struct acc {
    uint32_t owner;
    uint8_t space; /* 0: user (input and output alias: in-place), 1: scratch raw, 2: scratch packets */
    uint8_t type;
    uint8_t write;
    uint8_t unit;    /* 0: 16-byte raw op units, 1: packet payload units */
    uint64_t lo, hi; /* in slots (packets: doubled) */
    uint32_t index, size;
    uint16_t tbg_id, tbg_size;
};

struct accs {
    uint32_t n;
    int overflow;
    struct acc a[SYNC_MAX_ACC];
};

static void acc_make(const struct mscx_plan *plan, uint32_t rank, const struct mscx_dev_op *op,
                     const struct mscx_dev_operand *o, int write, int pkt, int unit, struct acc *a)
{
    uint32_t owner = rank;
    uint8_t type = o->type;
    if (o->flags & MSCX_OPND_REMOTE) {
        owner = plan->gpus[rank].rbuf[o->rbuf].rank;
        type = plan->gpus[rank].rbuf[o->rbuf].type;
    }
    memset(a, 0, sizeof(*a));
    a->owner = owner;
    a->type = type;
    a->space = type == MSCX_BUF_SCRATCH ? (pkt ? 2 : 1) : 0;
    a->write = (uint8_t)write;
    a->unit = (uint8_t)unit;
    a->lo = (uint64_t)o->index * (pkt ? 2u : 1u);
    a->hi = ((uint64_t)o->index + o->size) * (pkt ? 2u : 1u);
    a->index = o->index;
    a->size = o->size;
    a->tbg_id = op->tbg_id;
    a->tbg_size = op->tbg_size;
}

/* Does access @p b (new op) conflict with @p a (earlier op since the last sync)? */
static int acc_conflict(const struct acc *a, const struct acc *b)
{
    if (a->owner != b->owner)
        return 0;
    if (!a->write && !b->write)
        return 0;
    if ((a->space == 0) != (b->space == 0))
        return 0;
    if (a->space != 0 && (a->hi <= b->lo || b->hi <= a->lo))
        return 0; /* scratch: disjoint slot ranges (raw and packet spaces compared in one scale) */
    if (a->space == 0 && a->type == b->type && (a->hi <= b->lo || b->hi <= a->lo))
        return 0;
    if (a->write && !b->write && b->space == 2 && a->space == 2)
        return 0; /* packet read after packet write: flag-validated */
    if (a->space == b->space && a->type == b->type && a->unit == b->unit && a->index == b->index &&
        a->size == b->size && a->tbg_id == b->tbg_id && a->tbg_size == b->tbg_size)
        return 0; /* every byte stays with the same thread */
    return 1;
}

/* Accesses of a data op; @return 0 for ops that are not plain data ops. */
static int op_accs(const struct mscx_plan *plan, uint32_t rank, const struct mscx_dev_op *op, struct acc *out,
                   uint32_t *n_p)
{
    uint32_t n = 0;
    int port = op->chan_type == MSCX_CHAN_PORT;
    switch (op->opcode) {
    case MSCX_OP_PUT:
    case MSCX_OP_GET:
    case MSCX_OP_COPY:
    case MSCX_OP_REDUCE:
    case MSCX_OP_REDUCE_SEND:
    case MSCX_OP_READ_REDUCE:
    case MSCX_OP_READ_REDUCE_SEND:
    case MSCX_OP_PUT_WITH_SIGNAL:
    case MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH:
        for (uint32_t k = 0; k < op->nsrc; k++)
            acc_make(plan, rank, op, &op->src[k], 0, 0, 0, &out[n++]);
        for (uint32_t k = 0; k < op->ndst; k++)
            acc_make(plan, rank, op, &op->dst[k], 1, 0, 0, &out[n++]);
        break;
    case MSCX_OP_COPY_PACKETS:
    case MSCX_OP_PUT_PACKETS:
        for (uint32_t k = 0; k < op->nsrc; k++)
            acc_make(plan, rank, op, &op->src[k], 0, port, 1, &out[n++]);
        for (uint32_t k = 0; k < op->ndst; k++)
            acc_make(plan, rank, op, &op->dst[k], 1, 1, 1, &out[n++]);
        break;
    case MSCX_OP_READ_PUT_PACKETS:
    case MSCX_OP_UNPACK_PACKETS:
        for (uint32_t k = 0; k < op->nsrc; k++)
            acc_make(plan, rank, op, &op->src[k], 0, 1, 1, &out[n++]);
        for (uint32_t k = 0; k < op->ndst; k++)
            acc_make(plan, rank, op, &op->dst[k], 1, op->opcode == MSCX_OP_READ_PUT_PACKETS, 1, &out[n++]);
        break;
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
        for (uint32_t k = 0; k < op->nsrc; k++)
            acc_make(plan, rank, op, &op->src[k], 0, k > 0, 1, &out[n++]);
        for (uint32_t k = 0; k < op->ndst; k++)
            acc_make(plan, rank, op, &op->dst[k], 1, k > 0, 1, &out[n++]);
        break;
    default:
        return 0;
    }
    *n_p = n;
    return 1;
}

/*
 * Whether data op @p op, of accesses @p cur, must synchronise the block
 * first: a port op, or an access that conflicts with one of @p live.
 */
static int data_needs_sync(const struct mscx_dev_op *op, const struct accs *live, const struct acc *cur,
                           uint32_t nc)
{
    if (op->chan_type == MSCX_CHAN_PORT || live->overflow)
        return 1;
    for (uint32_t k = 0; k < nc; k++)
        for (uint32_t j = 0; j < live->n; j++)
            if (acc_conflict(&live->a[j], &cur[k]))
                return 1;
    return 0;
}

/* Mark the ops [beg, end) of one block; @p live is the accesses since its last barrier. */
static void mark_block(const struct mscx_plan *plan, uint32_t rank, struct mscx_dev_op *ops, uint32_t beg,
                       uint32_t end, struct accs *live)
{
    struct acc cur[2 * MSCX_MAX_OPERANDS];
    int pending = 0;
    live->n = 0;
    live->overflow = 0;
    for (uint32_t i = beg; i < end; i++) {
        struct mscx_dev_op *op = &ops[i];
        uint32_t nc = 0;
        int sync = pending, after = 0;
        pending = 0;
        op->flags &= (uint8_t)~MSCX_GPU_OPF_SYNC;
        if (op->opcode == MSCX_OP_PIPELINE) {
            /* the kernel synchronises around every body op */
            op->flags |= MSCX_GPU_OPF_SYNC;
            live->n = 0;
            live->overflow = 0;
            i += op->pipe_nops;
            pending = 1;
            continue;
        }
        int data = op_accs(plan, rank, op, cur, &nc);
        if (!data) {
            switch (op->opcode) {
            case MSCX_OP_WAIT:
            case MSCX_OP_RELAXED_WAIT:
            case MSCX_OP_SEM_ACQUIRE:
                after = 1;
                break;
            case MSCX_OP_BARRIER:
                after = 1;
                sync = 1;
                break;
            default: /* nop, signal, flush, sem release */
                sync = 1;
                break;
            }
        } else if (!sync) {
            sync = data_needs_sync(op, live, cur, nc);
        }
        if (sync) {
            op->flags |= MSCX_GPU_OPF_SYNC;
            live->n = 0;
            live->overflow = 0;
        }
        for (uint32_t k = 0; k < nc; k++) {
            if (live->n < SYNC_MAX_ACC)
                live->a[live->n++] = cur[k];
            else
                live->overflow = 1;
        }
        pending = after;
    }
}

void mscx_gpu_mark_syncs(const struct mscx_plan *plan, uint32_t rank, struct mscx_dev_op *ops)
{
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    static __thread struct accs live;
    for (uint32_t b = 0; b < gpu->ntb; b++)
        mark_block(plan, rank, ops, gpu->tb[b].op_begin, gpu->tb[b].op_begin + gpu->tb[b].nops, &live);
}
