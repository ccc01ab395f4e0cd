/* SPDX-License-Identifier: MIT */
/*
 * The launch compiler of the GPU executor (see struct mscx_program in
 * launch_abi.h): for one message size, dtype and packet format, resolve every
 * data op of a rank into byte offsets and unit counts, so that the kernel
 * does no operand arithmetic at run time.
 *
 * Every decision here mirrors the interpreter's fast paths in
 * kernels/exec_ops.cuh exactly: an op is compiled only where the
 * interpreter would take its flat (pointer-arithmetic) path, with the same
 * offsets, lengths and unit counts; everything else stays GENERIC and the
 * interpreter runs it. Alignment of the user buffers is the one thing not
 * known here (it is a property of each call): compiled raw offsets are
 * checked against the alignment the op needs, and the launch enables the
 * program only when both user pointers are 16-byte aligned.
 *
 * This file resolves the ops into entries and encodes the program as the
 * kernel's block records; launch_compile_fuse.c merges the compiled entries
 * (the peepholes), and launch_compile_user.c judges the program's accesses
 * to the user buffers for calls whose placement differs from the plan's.
 */
#include <string.h>
#include "launch_abi.h"
#include "launch_compile_int.h"
#include "op_math.h"
#include "plan_model.h"

struct prog_build {
    const struct mscx_gpu_args *a;
    struct mscx_program *prog;
    const struct mscx_compile_rbuf *rbuf;
    uint32_t nrbuf;
    uint32_t nentry, nopnd;
    uint32_t pl; /* packet payload bytes per line */
};

/* A resolved operand of the interpreter (mscx_dresolve), host side. */
struct prog_res {
    uint32_t base;
    int raw;
    uint64_t slot, chunk, size;
};

static int prog_resolve(const struct prog_build *k, const struct mscx_dev_operand *o, struct prog_res *r)
{
    const struct mscx_gpu_args *a = k->a;
    memset(r, 0, sizeof(*r));
    if (o->flags & MSCX_OPND_REMOTE) {
        if (o->rbuf >= k->nrbuf || o->rbuf >= MSCX_PROGRAM_MAX_RBUF || !k->rbuf[o->rbuf].ptr)
            return -1; /* a peer's user buffer (published per launch): interpreter */
        r->base = MSCX_KB_RBUF + o->rbuf;
        r->slot = a->geom[k->rbuf[o->rbuf].geom].slot;
        return 0;
    }
    r->slot = a->geom[0].slot;
    switch (o->type) {
    case MSCX_BUF_INPUT:
        r->base = MSCX_KB_IN;
        r->raw = 1;
        r->chunk = a->geom[0].in_chunk;
        r->size = a->in_bytes;
        break;
    case MSCX_BUF_OUTPUT:
        r->base = MSCX_KB_OUT;
        r->raw = 1;
        r->chunk = a->geom[0].out_chunk;
        r->size = a->out_bytes;
        break;
    default:
        r->base = MSCX_KB_SCRATCH;
        break;
    }
    return 0;
}

/* mscx_dflat on the host: the real offset of logical [off, off + len), or -1 when not flat. */
static int64_t prog_flat(const struct prog_res *r, uint64_t off, uint64_t len, uint32_t align)
{
    uint64_t real;
    if (!r->raw)
        return (int64_t)off;
    if (r->chunk == r->slot) {
        real = off;
    } else {
        uint64_t c0 = off / r->slot, w0 = off - c0 * r->slot;
        if (w0 + len > r->chunk)
            return -1;
        real = c0 * r->chunk + w0;
    }
    if (real + len > r->size)
        return -1;
    if (real & (align - 1u)) /* the base is 16-byte aligned (checked per launch) */
        return -1;
    return (int64_t)real;
}

static void prog_range(const struct mscx_dev_op *op, const struct mscx_dev_operand *o, uint64_t slot,
                       uint64_t *off, uint64_t *len)
{
    mscx_operand_range(op, o, slot, 16u, off, len);
}

static int prog_opnd(struct prog_build *k, uint32_t base, uint64_t off)
{
    if (k->nopnd >= MSCX_PROGRAM_MAX_OPND || off > UINT32_MAX)
        return -1;
    k->prog->opnd[k->nopnd].base = base;
    k->prog->opnd[k->nopnd].off = (uint32_t)off;
    k->nopnd++;
    return 0;
}

static struct mscx_entry *prog_entry_add(struct prog_build *k, uint8_t kind, const struct mscx_dev_op *op,
                                         uint32_t blk_op, uint64_t units)
{
    if (k->nentry >= MSCX_PROGRAM_MAX_OPS || units >= 0x80000000ull)
        return NULL;
    struct mscx_entry *p = &k->prog->entry[k->nentry++];
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    p->opcode = op->opcode;
    p->op = (uint16_t)blk_op;
    p->opnd = (uint16_t)k->nopnd;
    p->units = (uint32_t)units;
    return p;
}

/* put, get, copy, pws, pwsf: one COPY per pair of flat operands. @return as prog_op. */
static int prog_op_copy(struct prog_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    struct prog_res rs, rd;
    uint64_t soff, slen, doff, dlen;
    struct mscx_entry *p;
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npair; i++) {
        if (prog_resolve(k, &op->src[i], &rs) || prog_resolve(k, &op->dst[i], &rd))
            return 0;
        prog_range(op, &op->src[i], rs.slot, &soff, &slen);
        prog_range(op, &op->dst[i], rd.slot, &doff, &dlen);
        uint64_t units = (slen < dlen ? slen : dlen) / 16u;
        if (units == 0)
            continue;
        int64_t fs = prog_flat(&rs, soff, units * 16u, 16u), fd = prog_flat(&rd, doff, units * 16u, 16u);
        if (fs < 0 || fd < 0)
            return 0;
        if (!(p = prog_entry_add(k, MSCX_ENTRY_COPY, op, blk_op, units)))
            return -1;
        p->nsrc = p->ndst = 1;
        if (prog_opnd(k, rs.base, (uint64_t)fs) || prog_opnd(k, rd.base, (uint64_t)fd))
            return -1;
    }
    return 1;
}

/* re, res, rre, rres: one REDUCE of flat operands. @return as prog_op. */
static int prog_op_reduce(struct prog_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    struct prog_res rs;
    uint64_t soff, slen;
    struct mscx_entry *p;
    if (prog_resolve(k, &op->src[0], &rs))
        return 0;
    prog_range(op, &op->src[0], rs.slot, &soff, &slen);
    uint64_t units = slen / 16u;
    if (units == 0)
        return 1;
    if (!(p = prog_entry_add(k, MSCX_ENTRY_REDUCE, op, blk_op, units)))
        return -1;
    p->nsrc = op->nsrc;
    p->ndst = op->ndst;
    for (uint32_t j = 0; j < (uint32_t)op->nsrc + op->ndst; j++) {
        const struct mscx_dev_operand *o = j < op->nsrc ? &op->src[j] : &op->dst[j - op->nsrc];
        struct prog_res r;
        uint64_t off, len;
        if (prog_resolve(k, o, &r))
            return 0;
        prog_range(op, o, r.slot, &off, &len);
        int64_t f = prog_flat(&r, off, units * 16u, 16u);
        if (f < 0)
            return 0;
        if (prog_opnd(k, r.base, (uint64_t)f))
            return -1;
    }
    return 1;
}

/* cpkt and memory ppkt: one PACK per pair (flat source, lines). @return as prog_op. */
static int prog_op_pack(struct prog_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    const uint32_t pl = k->pl;
    struct prog_res rs, rd;
    uint64_t soff, slen, doff, dlen;
    struct mscx_entry *p;
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npair; i++) {
        if (prog_resolve(k, &op->src[i], &rs) || prog_resolve(k, &op->dst[i], &rd))
            return 0;
        prog_range(op, &op->src[i], rs.slot, &soff, &slen);
        prog_range(op, &op->dst[i], rd.slot, &doff, &dlen);
        uint64_t units = (slen < dlen ? slen : dlen) / pl;
        if (units == 0)
            continue;
        int64_t fs = prog_flat(&rs, soff, units * pl, pl);
        if (fs < 0)
            return 0;
        if (!(p = prog_entry_add(k, MSCX_ENTRY_PACK, op, blk_op, units)))
            return -1;
        p->nsrc = p->ndst = 1;
        if (prog_opnd(k, rs.base, (uint64_t)fs) || prog_opnd(k, rd.base, 2u * doff))
            return -1;
    }
    return 1;
}

/*
 * Port ppkt (lines forwarded as lines: FWD) and upkt (lines stored flat:
 * UNPACK, @p unpack): one entry per pair. @return as prog_op.
 */
static int prog_op_forward(struct prog_build *k, const struct mscx_dev_op *op, uint32_t blk_op, int unpack)
{
    const uint32_t pl = k->pl;
    struct prog_res rs, rd;
    uint64_t soff, slen, doff, dlen;
    struct mscx_entry *p;
    uint32_t npass = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npass; i++) {
        if (prog_resolve(k, &op->src[i], &rs) || prog_resolve(k, &op->dst[i], &rd))
            return 0;
        prog_range(op, &op->src[i], rs.slot, &soff, &slen);
        prog_range(op, &op->dst[i], rd.slot, &doff, &dlen);
        uint64_t units = slen / pl;
        if (units == 0)
            continue;
        int64_t fd = unpack ? prog_flat(&rd, doff, units * pl, pl) : (int64_t)(2u * doff);
        if (fd < 0)
            return 0;
        if (!(p = prog_entry_add(k, unpack ? MSCX_ENTRY_UNPACK : MSCX_ENTRY_FWD, op, blk_op, units)))
            return -1;
        p->nsrc = p->ndst = 1;
        if (prog_opnd(k, rs.base, 2u * soff) || prog_opnd(k, rd.base, (uint64_t)fd))
            return -1;
    }
    return 1;
}

/* rppkt: one FWD of src[0]'s lines to every destination. @return as prog_op. */
static int prog_op_read_put(struct prog_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    struct prog_res rs, rd;
    uint64_t soff, slen, doff, dlen;
    struct mscx_entry *p;
    if (prog_resolve(k, &op->src[0], &rs))
        return 0;
    prog_range(op, &op->src[0], rs.slot, &soff, &slen);
    uint64_t units = slen / k->pl;
    if (units == 0)
        return 1;
    if (!(p = prog_entry_add(k, MSCX_ENTRY_FWD, op, blk_op, units)))
        return -1;
    p->nsrc = 1;
    p->ndst = op->ndst;
    if (prog_opnd(k, rs.base, 2u * soff))
        return -1;
    for (uint32_t j = 0; j < op->ndst; j++) {
        if (prog_resolve(k, &op->dst[j], &rd))
            return 0;
        prog_range(op, &op->dst[j], rd.slot, &doff, &dlen);
        if (prog_opnd(k, rd.base, 2u * doff))
            return -1;
    }
    return 1;
}

/*
 * repkt, respkt, recpkt, recspkt: one REDPKT (src[0] flat, src[1..] lines,
 * dst[0] flat, dst[1..] lines). @return as prog_op.
 */
static int prog_op_reduce_pkt(struct prog_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    const uint32_t pl = k->pl;
    struct prog_res rs;
    uint64_t soff, slen;
    struct mscx_entry *p;
    if (prog_resolve(k, &op->src[0], &rs))
        return 0;
    prog_range(op, &op->src[0], rs.slot, &soff, &slen);
    uint64_t units = slen / pl;
    if (units == 0)
        return 1;
    int64_t f0 = prog_flat(&rs, soff, units * pl, pl);
    if (f0 < 0)
        return 0;
    if (!(p = prog_entry_add(k, MSCX_ENTRY_REDPKT, op, blk_op, units)))
        return -1;
    p->nsrc = op->nsrc;
    p->ndst = op->ndst;
    if (prog_opnd(k, rs.base, (uint64_t)f0))
        return -1;
    for (uint32_t j = 1; j < (uint32_t)op->nsrc + op->ndst; j++) {
        const struct mscx_dev_operand *o = j < op->nsrc ? &op->src[j] : &op->dst[j - op->nsrc];
        struct prog_res r;
        uint64_t off, len;
        if (prog_resolve(k, o, &r))
            return 0;
        prog_range(op, o, r.slot, &off, &len);
        int64_t f;
        if (j == op->nsrc) /* dst[0]: raw result, flat */
            f = prog_flat(&r, off, units * pl, pl);
        else
            f = (int64_t)(2u * off);
        if (f < 0)
            return 0;
        if (prog_opnd(k, r.base, (uint64_t)f))
            return -1;
    }
    return 1;
}

/*
 * Compile one op into entries (a pair-wise op may give several). @return 1
 * when compiled, 0 when the op must stay GENERIC, -1 when the program is
 * full. On 0 the caller rolls back whatever this call appended.
 */
static int prog_op(struct prog_build *k, const struct mscx_dev_op *op, uint32_t blk_op, int port)
{
    if (port && k->a->port)
        return 0; /* some port channel of this rank goes through the proxy: the interpreter decides per
                     channel */
    switch (op->opcode) {
    case MSCX_OP_PUT:
    case MSCX_OP_GET:
    case MSCX_OP_COPY:
        return prog_op_copy(k, op, blk_op);
    case MSCX_OP_PUT_WITH_SIGNAL:
    case MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH:
        if (port)
            return 0; /* the port signal after the copy: interpreter */
        return prog_op_copy(k, op, blk_op);
    case MSCX_OP_REDUCE:
    case MSCX_OP_REDUCE_SEND:
    case MSCX_OP_READ_REDUCE:
    case MSCX_OP_READ_REDUCE_SEND:
        return k->a->reduce ? prog_op_reduce(k, op, blk_op) : 0;
    case MSCX_OP_COPY_PACKETS:
        return prog_op_pack(k, op, blk_op);
    case MSCX_OP_PUT_PACKETS:
        return port ? prog_op_forward(k, op, blk_op, 0) : prog_op_pack(k, op, blk_op);
    case MSCX_OP_UNPACK_PACKETS:
        return prog_op_forward(k, op, blk_op, 1);
    case MSCX_OP_READ_PUT_PACKETS:
        return prog_op_read_put(k, op, blk_op);
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
        return k->a->reduce ? prog_op_reduce_pkt(k, op, blk_op) : 0;
    default:
        return 0;
    }
}

/*
 * Op @p i of a block, @p op: its entries, a GENERIC entry when it is left to
 * the interpreter, a SKIP for a barrier that moves nothing. @return 0, or -1
 * when the program is full.
 */
static int prog_compile_op(struct prog_build *k, const struct mscx_dev_op *op, uint32_t i)
{
    uint32_t nk = k->nentry, no = k->nopnd;
    int rc = op->opcode == MSCX_OP_NOP && !(op->flags & MSCX_GPU_OPF_SYNC)
                 ? 1
                 : prog_op(k, op, i, op->chan_type == MSCX_CHAN_PORT);
    if (rc < 0)
        return -1;
    if (rc == 0) { /* roll back and leave it to the interpreter */
        k->nentry = nk;
        k->nopnd = no;
        if (!prog_entry_add(k, MSCX_ENTRY_GENERIC, op, i, 0))
            return -1;
    } else if (k->nentry == nk) { /* compiled to nothing (no units): a barrier it carries stays */
        if (!(op->flags & MSCX_GPU_OPF_SYNC))
            return 0;
        struct mscx_entry *skip = prog_entry_add(k, MSCX_ENTRY_SKIP, op, i, 0);
        if (!skip)
            return -1;
        skip->sync = 1;
        return 0;
    }
    if (op->flags & MSCX_GPU_OPF_SYNC)
        k->prog->entry[nk].sync = 1;
    return 0;
}

/* Block @p b (@p tb) into k's program: its entries, or an interpreter block. @return 0, or -1: does not fit.
 */
static int prog_compile_block(struct prog_build *k, const struct mscx_dev_op *ops, const struct mscx_tb *tb,
                              uint32_t b)
{
    struct mscx_program *prog = k->prog;
    prog->kbegin[b] = (uint16_t)k->nentry;
    prog->pbegin[b] = (uint16_t)k->nopnd;
    if (tb->op_begin > UINT16_MAX)
        return -1;
    prog->obase[b] = (uint16_t)tb->op_begin;
    for (uint32_t i = 0; i < tb->nops; i++)
        if (ops[tb->op_begin + i].opcode == MSCX_OP_PIPELINE) {
            prog->interp_mask |= 1u << b;
            return 0;
        }
    for (uint32_t i = 0; i < tb->nops; i++)
        if (prog_compile_op(k, &ops[tb->op_begin + i], i))
            return -1;
    return 0;
}

int mscx_gpu_compile(const struct mscx_plan *plan, uint32_t rank, const struct mscx_dev_op *ops,
                     const struct mscx_compile_rbuf *rbuf, const struct mscx_gpu_args *a,
                     struct mscx_program *prog)
{
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    struct prog_build k = {a, prog, rbuf, gpu->nrbuf, 0, 0, a->pkt == MSCX_PKT_LL8 ? 4u : 8u};
    memset(prog, 0, sizeof(*prog));
    if (gpu->ntb > MSCX_PROGRAM_MAX_BLOCKS || gpu->nrbuf > MSCX_PROGRAM_MAX_RBUF)
        return 0;
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        prog->rsc[i] = rbuf[i].ptr;
        prog->rhalf[i] = rbuf[i].half;
    }
    for (uint32_t b = 0; b < gpu->ntb; b++)
        if (prog_compile_block(&k, ops, &gpu->tb[b], b))
            return 0;
    prog->kbegin[gpu->ntb] = (uint16_t)k.nentry;
    prog->pbegin[gpu->ntb] = (uint16_t)k.nopnd;
    mscx_program_fuse(prog, gpu->ntb, plan, rank, ops, a->geom[0].slot, k.pl);
    return 1;
}

int mscx_gpu_program_is_packet(const struct mscx_program *prog, uint32_t ntb)
{
    for (uint32_t i = 0; i < prog->kbegin[ntb]; i++)
        if (!mscx_entry_is_packet(prog->entry[i].kind))
            return 0;
    return 1;
}

static uint64_t prog_ptr_at(const struct mscx_program *prog, const struct mscx_entry_opnd *d, char *scratch,
                            uint64_t half, uint32_t parity)
{
    uint32_t flag = parity ? 1u : 2u; /* any flag of that parity */
    if (d->base >= MSCX_KB_RBUF) {
        uint32_t r = d->base - MSCX_KB_RBUF;
        return (uint64_t)(uintptr_t)(prog->rsc[r] + mscx_scratch_offset(flag, prog->rhalf[r]) + d->off);
    }
    return (uint64_t)(uintptr_t)(scratch + mscx_scratch_offset(flag, half) + d->off);
}

size_t mscx_gpu_program_encode(const struct mscx_program *prog, uint32_t ntb, char *scratch,
                               uint64_t scratch_half, void *dst, size_t cap, uint32_t *stride_p,
                               uint32_t *kmax_p, uint32_t *pmax_p)
{
    uint32_t kmax = 0, pmax = 0;
    if (ntb > MSCX_PROGRAM_MAX_BLOCKS)
        return 0;
    for (uint32_t b = 0; b < ntb; b++) {
        uint32_t nk = prog->kbegin[b + 1] - prog->kbegin[b], np = prog->pbegin[b + 1] - prog->pbegin[b];
        kmax = nk > kmax ? nk : kmax;
        pmax = np > pmax ? np : pmax;
    }
    size_t stride = 16u * (1u + (size_t)kmax + pmax), bytes = stride * ntb;
    if (bytes == 0 || bytes > cap)
        return 0;
    memset(dst, 0, bytes);
    for (uint32_t b = 0; b < ntb; b++) {
        char *rec = (char *)dst + stride * b;
        struct mscx_record_head *h = (struct mscx_record_head *)rec;
        struct mscx_entry *ko = (struct mscx_entry *)(rec + 16);
        struct mscx_tagged_ptr *po = (struct mscx_tagged_ptr *)(rec + 16u * (1u + kmax));
        uint32_t kb = prog->kbegin[b], pb = prog->pbegin[b];
        h->nk = prog->kbegin[b + 1] - kb;
        h->np = prog->pbegin[b + 1] - pb;
        h->obase = prog->obase[b];
        for (uint32_t i = 0; i < h->nk; i++) {
            ko[i] = prog->entry[kb + i];
            ko[i].opnd = (uint16_t)(prog->entry[kb + i].opnd - pb);
        }
        for (uint32_t i = 0; i < h->np; i++) {
            const struct mscx_entry_opnd *d = &prog->opnd[pb + i];
            if (d->base == MSCX_KB_IN || d->base == MSCX_KB_OUT) {
                po[i].v[0] = (d->base == MSCX_KB_IN ? MSCX_TAGGED_IN : MSCX_TAGGED_OUT) | d->off;
                po[i].v[1] = po[i].v[0];
            } else {
                po[i].v[0] = prog_ptr_at(prog, d, scratch, scratch_half, 0);
                po[i].v[1] = prog_ptr_at(prog, d, scratch, scratch_half, 1);
            }
        }
    }
    *stride_p = (uint32_t)stride;
    *kmax_p = kmax;
    *pmax_p = pmax;
    return bytes;
}
