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
 */
#include <string.h>
#include "launch_abi.h"
#include "op_math.h"
#include "plan_model.h"

struct kp_build {
    const struct mscx_gpu_args *a;
    struct mscx_program *kp;
    const struct mscx_compile_rbuf *rbuf;
    uint32_t nrbuf;
    uint32_t nentry, nopnd;
    uint32_t pl; /* packet payload bytes per line */
};

/* A resolved operand of the interpreter (mscx_dresolve), host side. */
struct kp_res {
    uint32_t base;
    int raw;
    uint64_t slot, chunk, size;
};

static int kp_resolve(const struct kp_build *k, const struct mscx_dev_operand *o, struct kp_res *r)
{
    const struct mscx_gpu_args *a = k->a;
    memset(r, 0, sizeof(*r));
    if (o->flags & MSCX_OPND_REMOTE) {
        if (o->rbuf >= k->nrbuf || o->rbuf >= MSCX_KP_MAX_RBUF || !k->rbuf[o->rbuf].ptr)
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
static int64_t kp_flat(const struct kp_res *r, uint64_t off, uint64_t len, uint32_t align)
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

static void kp_range(const struct mscx_dev_op *op, const struct mscx_dev_operand *o, uint64_t slot,
                     uint64_t *off, uint64_t *len)
{
    mscx_operand_range(op, o, slot, 16u, off, len);
}

static int kp_opnd(struct kp_build *k, uint32_t base, uint64_t off)
{
    if (k->nopnd >= MSCX_KP_MAX_OPND || off > UINT32_MAX)
        return -1;
    k->kp->opnd[k->nopnd].base = base;
    k->kp->opnd[k->nopnd].off = (uint32_t)off;
    k->nopnd++;
    return 0;
}

static struct mscx_entry *kp_entry_add(struct kp_build *k, uint8_t kind, const struct mscx_dev_op *op,
                                       uint32_t blk_op, uint64_t units)
{
    if (k->nentry >= MSCX_KP_MAX_OPS || units >= 0x80000000ull)
        return NULL;
    struct mscx_entry *p = &k->kp->entry[k->nentry++];
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    p->opcode = op->opcode;
    p->op = (uint16_t)blk_op;
    p->opnd = (uint16_t)k->nopnd;
    p->units = (uint32_t)units;
    return p;
}

/* put, get, copy, pws, pwsf: one COPY per pair of flat operands. @return as kp_op. */
static int kp_op_copy(struct kp_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    struct kp_res rs, rd;
    uint64_t soff, slen, doff, dlen;
    struct mscx_entry *p;
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npair; i++) {
        if (kp_resolve(k, &op->src[i], &rs) || kp_resolve(k, &op->dst[i], &rd))
            return 0;
        kp_range(op, &op->src[i], rs.slot, &soff, &slen);
        kp_range(op, &op->dst[i], rd.slot, &doff, &dlen);
        uint64_t units = (slen < dlen ? slen : dlen) / 16u;
        if (units == 0)
            continue;
        int64_t fs = kp_flat(&rs, soff, units * 16u, 16u), fd = kp_flat(&rd, doff, units * 16u, 16u);
        if (fs < 0 || fd < 0)
            return 0;
        if (!(p = kp_entry_add(k, MSCX_ENTRY_COPY, op, blk_op, units)))
            return -1;
        p->nsrc = p->ndst = 1;
        if (kp_opnd(k, rs.base, (uint64_t)fs) || kp_opnd(k, rd.base, (uint64_t)fd))
            return -1;
    }
    return 1;
}

/* re, res, rre, rres: one REDUCE of flat operands. @return as kp_op. */
static int kp_op_reduce(struct kp_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    struct kp_res rs;
    uint64_t soff, slen;
    struct mscx_entry *p;
    if (kp_resolve(k, &op->src[0], &rs))
        return 0;
    kp_range(op, &op->src[0], rs.slot, &soff, &slen);
    uint64_t units = slen / 16u;
    if (units == 0)
        return 1;
    if (!(p = kp_entry_add(k, MSCX_ENTRY_REDUCE, op, blk_op, units)))
        return -1;
    p->nsrc = op->nsrc;
    p->ndst = op->ndst;
    for (uint32_t j = 0; j < (uint32_t)op->nsrc + op->ndst; j++) {
        const struct mscx_dev_operand *o = j < op->nsrc ? &op->src[j] : &op->dst[j - op->nsrc];
        struct kp_res r;
        uint64_t off, len;
        if (kp_resolve(k, o, &r))
            return 0;
        kp_range(op, o, r.slot, &off, &len);
        int64_t f = kp_flat(&r, off, units * 16u, 16u);
        if (f < 0)
            return 0;
        if (kp_opnd(k, r.base, (uint64_t)f))
            return -1;
    }
    return 1;
}

/* cpkt and memory ppkt: one PACK per pair (flat source, lines). @return as kp_op. */
static int kp_op_pack(struct kp_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    const uint32_t pl = k->pl;
    struct kp_res rs, rd;
    uint64_t soff, slen, doff, dlen;
    struct mscx_entry *p;
    uint32_t npair = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npair; i++) {
        if (kp_resolve(k, &op->src[i], &rs) || kp_resolve(k, &op->dst[i], &rd))
            return 0;
        kp_range(op, &op->src[i], rs.slot, &soff, &slen);
        kp_range(op, &op->dst[i], rd.slot, &doff, &dlen);
        uint64_t units = (slen < dlen ? slen : dlen) / pl;
        if (units == 0)
            continue;
        int64_t fs = kp_flat(&rs, soff, units * pl, pl);
        if (fs < 0)
            return 0;
        if (!(p = kp_entry_add(k, MSCX_ENTRY_PACK, op, blk_op, units)))
            return -1;
        p->nsrc = p->ndst = 1;
        if (kp_opnd(k, rs.base, (uint64_t)fs) || kp_opnd(k, rd.base, 2u * doff))
            return -1;
    }
    return 1;
}

/*
 * Port ppkt (lines forwarded as lines: FWD) and upkt (lines stored flat:
 * UNPACK, @p unpack): one entry per pair. @return as kp_op.
 */
static int kp_op_forward(struct kp_build *k, const struct mscx_dev_op *op, uint32_t blk_op, int unpack)
{
    const uint32_t pl = k->pl;
    struct kp_res rs, rd;
    uint64_t soff, slen, doff, dlen;
    struct mscx_entry *p;
    uint32_t npass = op->nsrc < op->ndst ? op->nsrc : op->ndst;
    for (uint32_t i = 0; i < npass; i++) {
        if (kp_resolve(k, &op->src[i], &rs) || kp_resolve(k, &op->dst[i], &rd))
            return 0;
        kp_range(op, &op->src[i], rs.slot, &soff, &slen);
        kp_range(op, &op->dst[i], rd.slot, &doff, &dlen);
        uint64_t units = slen / pl;
        if (units == 0)
            continue;
        int64_t fd = unpack ? kp_flat(&rd, doff, units * pl, pl) : (int64_t)(2u * doff);
        if (fd < 0)
            return 0;
        if (!(p = kp_entry_add(k, unpack ? MSCX_ENTRY_UNPACK : MSCX_ENTRY_FWD, op, blk_op, units)))
            return -1;
        p->nsrc = p->ndst = 1;
        if (kp_opnd(k, rs.base, 2u * soff) || kp_opnd(k, rd.base, (uint64_t)fd))
            return -1;
    }
    return 1;
}

/* rppkt: one FWD of src[0]'s lines to every destination. @return as kp_op. */
static int kp_op_read_put(struct kp_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    struct kp_res rs, rd;
    uint64_t soff, slen, doff, dlen;
    struct mscx_entry *p;
    if (kp_resolve(k, &op->src[0], &rs))
        return 0;
    kp_range(op, &op->src[0], rs.slot, &soff, &slen);
    uint64_t units = slen / k->pl;
    if (units == 0)
        return 1;
    if (!(p = kp_entry_add(k, MSCX_ENTRY_FWD, op, blk_op, units)))
        return -1;
    p->nsrc = 1;
    p->ndst = op->ndst;
    if (kp_opnd(k, rs.base, 2u * soff))
        return -1;
    for (uint32_t j = 0; j < op->ndst; j++) {
        if (kp_resolve(k, &op->dst[j], &rd))
            return 0;
        kp_range(op, &op->dst[j], rd.slot, &doff, &dlen);
        if (kp_opnd(k, rd.base, 2u * doff))
            return -1;
    }
    return 1;
}

/*
 * repkt, respkt, recpkt, recspkt: one REDPKT (src[0] flat, src[1..] lines,
 * dst[0] flat, dst[1..] lines). @return as kp_op.
 */
static int kp_op_reduce_pkt(struct kp_build *k, const struct mscx_dev_op *op, uint32_t blk_op)
{
    const uint32_t pl = k->pl;
    struct kp_res rs;
    uint64_t soff, slen;
    struct mscx_entry *p;
    if (kp_resolve(k, &op->src[0], &rs))
        return 0;
    kp_range(op, &op->src[0], rs.slot, &soff, &slen);
    uint64_t units = slen / pl;
    if (units == 0)
        return 1;
    int64_t f0 = kp_flat(&rs, soff, units * pl, pl);
    if (f0 < 0)
        return 0;
    if (!(p = kp_entry_add(k, MSCX_ENTRY_REDPKT, op, blk_op, units)))
        return -1;
    p->nsrc = op->nsrc;
    p->ndst = op->ndst;
    if (kp_opnd(k, rs.base, (uint64_t)f0))
        return -1;
    for (uint32_t j = 1; j < (uint32_t)op->nsrc + op->ndst; j++) {
        const struct mscx_dev_operand *o = j < op->nsrc ? &op->src[j] : &op->dst[j - op->nsrc];
        struct kp_res r;
        uint64_t off, len;
        if (kp_resolve(k, o, &r))
            return 0;
        kp_range(op, o, r.slot, &off, &len);
        int64_t f;
        if (j == op->nsrc) /* dst[0]: raw result, flat */
            f = kp_flat(&r, off, units * pl, pl);
        else
            f = (int64_t)(2u * off);
        if (f < 0)
            return 0;
        if (kp_opnd(k, r.base, (uint64_t)f))
            return -1;
    }
    return 1;
}

/*
 * Compile one op into entries (a pair-wise op may give several). @return 1
 * when compiled, 0 when the op must stay GENERIC, -1 when the program is
 * full. On 0 the caller rolls back whatever this call appended.
 */
static int kp_op(struct kp_build *k, const struct mscx_dev_op *op, uint32_t blk_op, int port)
{
    if (port && k->a->port)
        return 0; /* some port channel of this rank goes through the proxy: the interpreter decides per
                     channel */
    switch (op->opcode) {
    case MSCX_OP_PUT:
    case MSCX_OP_GET:
    case MSCX_OP_COPY:
        return kp_op_copy(k, op, blk_op);
    case MSCX_OP_PUT_WITH_SIGNAL:
    case MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH:
        if (port)
            return 0; /* the port signal after the copy: interpreter */
        return kp_op_copy(k, op, blk_op);
    case MSCX_OP_REDUCE:
    case MSCX_OP_REDUCE_SEND:
    case MSCX_OP_READ_REDUCE:
    case MSCX_OP_READ_REDUCE_SEND:
        return k->a->reduce ? kp_op_reduce(k, op, blk_op) : 0;
    case MSCX_OP_COPY_PACKETS:
        return kp_op_pack(k, op, blk_op);
    case MSCX_OP_PUT_PACKETS:
        return port ? kp_op_forward(k, op, blk_op, 0) : kp_op_pack(k, op, blk_op);
    case MSCX_OP_UNPACK_PACKETS:
        return kp_op_forward(k, op, blk_op, 1);
    case MSCX_OP_READ_PUT_PACKETS:
        return kp_op_read_put(k, op, blk_op);
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
        return k->a->reduce ? kp_op_reduce_pkt(k, op, blk_op) : 0;
    default:
        return 0;
    }
}

static int kp_same(const struct mscx_entry_opnd *x, const struct mscx_entry_opnd *y)
{
    return x->base == y->base && x->off == y->off;
}

/*
 * Operand j of entry k: 1 when it is flat data (a user buffer may hold it),
 * 0 when it is packet lines; *ext_p its extent in bytes. The one place that
 * says so: the peepholes below and the user-buffer checks use it.
 */
static int kp_opnd_flat(const struct mscx_entry *k, uint32_t j, uint32_t pl, uint64_t *ext_p)
{
    uint64_t flat = (uint64_t)k->units * pl, lines = 2u * flat;
    int flat_op;
    switch (k->kind) {
    case MSCX_ENTRY_PACK:
        flat_op = j == 0;
        break;
    case MSCX_ENTRY_UNPACK:
        flat_op = j == 1;
        break;
    case MSCX_ENTRY_REDPKT:
        flat_op = (j == 0 && !k->lsrc0) || (k->fsrc && j == k->fsrc) || j == k->nsrc;
        break;
    case MSCX_ENTRY_COPY:
    case MSCX_ENTRY_REDUCE:
        *ext_p = (uint64_t)k->units * 16u;
        return 1;
    default: /* FWD */
        flat_op = 0;
        break;
    }
    *ext_p = flat_op ? flat : lines;
    return flat_op;
}

/*
 * Entries [kb, ke) of one block: an UNPACK of lines A into flat X directly
 * followed by a REDPKT whose flat source and first destination are that X,
 * over the same units, becomes one REDPKT that starts from A's lines (the
 * generated one-shot AllReduce unpacks rank 0's packets and then folds in
 * the other ranks', so that every rank sums in rank order). Each thread
 * keeps the units it had in both, so X gets the same values, with one pass
 * fewer; the UNPACK's place stays as a SKIP that keeps its barrier.
 */
static uint32_t kp_fuse_unpack(struct mscx_program *kp, uint32_t kb, uint32_t ke)
{
    uint32_t fused = 0;
    for (uint32_t i = kb; i + 1 < ke; i++) {
        struct mscx_entry *u = &kp->entry[i], *r = &kp->entry[i + 1];
        if (u->kind != MSCX_ENTRY_UNPACK || r->kind != MSCX_ENTRY_REDPKT || r->lsrc0 || r->ndst == 0 ||
            u->units != r->units)
            continue;
        const struct mscx_entry_opnd *ua = &kp->opnd[u->opnd], *ux = &kp->opnd[u->opnd + 1];
        struct mscx_entry_opnd *r0 = &kp->opnd[r->opnd];
        if (!kp_same(ux, r0) || !kp_same(ux, &kp->opnd[r->opnd + r->nsrc]))
            continue;
        /* no other source or destination of the reduction may be X (it would see X before the unpack) */
        int clash = 0;
        for (uint32_t j = 1; j < (uint32_t)r->nsrc + r->ndst; j++)
            if (j != r->nsrc && kp_same(ux, &kp->opnd[r->opnd + j]))
                clash = 1;
        if (clash)
            continue;
        *r0 = *ua;
        r->lsrc0 = 1;
        u->kind = MSCX_ENTRY_SKIP;
        u->units = 0;
        fused++;
    }
    return fused;
}

/*
 * Entries [kb, ke) of one block: PACK entries in a row that read the same
 * flat source over the same units (a put-packets op with several
 * destinations compiles to one PACK per pair) become one PACK with all
 * their destinations, so each thread loads a unit once and stores it to
 * every destination. Each thread keeps its units and, per destination, the
 * order of its stores. Only entries laid out as kp_op makes them (operands
 * in a row: source, destination) and without a barrier between them are
 * merged; the merged-away entries become SKIPs.
 */
static uint32_t kp_fuse_pack(struct mscx_program *kp, uint32_t kb, uint32_t ke)
{
    uint32_t fused = 0;
    for (uint32_t i = kb; i < ke; i++) {
        struct mscx_entry *p = &kp->entry[i];
        if (p->kind != MSCX_ENTRY_PACK || p->nsrc != 1 || p->ndst != 1)
            continue;
        const struct mscx_entry_opnd *src = &kp->opnd[p->opnd];
        uint32_t j = i + 1;
        while (j < ke && j - i < UINT8_MAX) {
            const struct mscx_entry *q = &kp->entry[j];
            if (q->kind != MSCX_ENTRY_PACK || q->sync || q->nsrc != 1 || q->ndst != 1 ||
                q->units != p->units || q->opnd != p->opnd + 2u * (j - i) ||
                !kp_same(src, &kp->opnd[q->opnd]))
                break;
            j++;
        }
        if (j == i + 1)
            continue;
        /* [src, d0, src, d1, ...] -> [src, d0, d1, ...]: each destination moves to an earlier slot */
        for (uint32_t m = i + 1; m < j; m++) {
            struct mscx_entry *q = &kp->entry[m];
            kp->opnd[p->opnd + 1u + (m - i)] = kp->opnd[q->opnd + 1u];
            q->kind = MSCX_ENTRY_SKIP;
            q->units = 0;
            q->nsrc = q->ndst = 0;
        }
        p->ndst = (uint8_t)(j - i);
        fused += j - i - 1;
        i = j - 1;
    }
    return fused;
}

/*
 * Drop the SKIP entries that fusion left (a SKIP's barrier moves to the
 * entry after it; a SKIP that ends its block stays, with its barrier), so
 * that the kernel does not pay a loop step for them.
 */
static void kp_compact(struct mscx_program *kp, uint32_t ntb)
{
    uint32_t out = 0;
    for (uint32_t b = 0; b < ntb; b++) {
        uint32_t kb = kp->kbegin[b], ke = kp->kbegin[b + 1], pending = 0;
        kp->kbegin[b] = (uint16_t)out;
        for (uint32_t i = kb; i < ke; i++) {
            struct mscx_entry k = kp->entry[i];
            if (k.kind == MSCX_ENTRY_SKIP && i + 1 < ke) {
                pending |= k.sync;
                continue;
            }
            k.sync |= (uint8_t)pending;
            pending = 0;
            kp->entry[out++] = k;
        }
    }
    kp->kbegin[ntb] = (uint16_t)out;
}

/* ---- a pack into the rank's own scratch read flat by a later reduction ---- */

/* Bytes [lo, hi) of one memory of the rank; input and output count as one (an in-place call aliases them). */
struct kp_span {
    uint32_t space; /* MSCX_KB_IN (input or output), MSCX_KB_SCRATCH, MSCX_KB_RBUF + k */
    uint64_t lo, hi;
};

static struct kp_span kp_span_of(const struct mscx_program *kp, const struct mscx_entry *k, uint32_t j,
                                 uint32_t pl)
{
    const struct mscx_entry_opnd *d = &kp->opnd[k->opnd + j];
    uint64_t ext;
    kp_opnd_flat(k, j, pl, &ext);
    return (struct kp_span){d->base == MSCX_KB_OUT ? MSCX_KB_IN : d->base, d->off, d->off + ext};
}

static int kp_meet(const struct kp_span *a, const struct kp_span *b)
{
    return a->space == b->space && a->lo < b->hi && b->lo < a->hi;
}

/*
 * Whether some op of the plan reads a peer's memory (get, read-reduce, a
 * multicast load: any remote or switch source). Such a peer could read the
 * lines of a pack this pass removes; the pass judges only this rank's
 * program, so it gives up on such plans altogether.
 */
static int kp_plan_reads_peers(const struct mscx_plan *plan)
{
    if (plan->has_multicast)
        return 1;
    for (uint32_t q = 0; q < plan->nranks; q++)
        for (uint32_t i = 0; i < plan->gpus[q].nops; i++) {
            const struct mscx_dev_op *op = &plan->gpus[q].ops[i];
            if (op->opcode == MSCX_OP_GET || op->opcode == MSCX_OP_READ_REDUCE ||
                op->opcode == MSCX_OP_READ_REDUCE_SEND || op->opcode == MSCX_OP_MULTI_LOAD_REDUCE_STORE)
                return 1;
            for (uint32_t s = 0; s < op->nsrc; s++)
                if (op->src[s].flags & (MSCX_OPND_REMOTE | MSCX_OPND_SWITCH))
                    return 1;
        }
    return 0;
}

/*
 * Whether some op of any rank (this one through its remote-buffer table
 * included) may write @p sp, bytes of rank @p rank's own memory: a write
 * into its user buffers at all, or into its scratch across @p sp (lines of
 * packet ops at twice the logical offset, whole operands, slices ignored).
 * @p slot: the rank's chunk slot at this launch (its scratch's geometry).
 */
static int kp_peer_writes(const struct mscx_plan *plan, uint32_t rank, uint64_t slot,
                          const struct kp_span *sp)
{
    for (uint32_t q = 0; q < plan->nranks; q++) {
        const struct mscx_gpu *g = &plan->gpus[q];
        for (uint32_t i = 0; i < g->nops; i++) {
            const struct mscx_dev_op *op = &g->ops[i];
            for (uint32_t d = 0; d < op->ndst; d++) {
                const struct mscx_dev_operand *o = &op->dst[d];
                if (o->flags & MSCX_OPND_SWITCH)
                    return 1;
                if (!(o->flags & MSCX_OPND_REMOTE))
                    continue;
                if (o->rbuf >= g->nrbuf)
                    return 1;
                if (g->rbuf[o->rbuf].rank != rank)
                    continue;
                if (g->rbuf[o->rbuf].type != MSCX_BUF_SCRATCH || (op->flags & MSCX_OPF_IN_PIPELINE))
                    return 1; /* user-buffer chunk mapping, pipeline strides: not judged here */
                if (sp->space != MSCX_KB_SCRATCH)
                    continue;
                uint64_t lo = (uint64_t)o->index * slot, hi = lo + (uint64_t)o->size * slot;
                if (mscx_opcode_is_packet(op->opcode)) { /* a peer's scratch in a packet op: lines */
                    lo *= 2u;
                    hi *= 2u;
                }
                if (lo < sp->hi && sp->lo < hi)
                    return 1;
            }
        }
    }
    return 0;
}

/*
 * Whether REDPKT entry @p ri (block @p b) may read source @p j, the lines L
 * that PACK entry @p pi of the same block wrote from flat X, as X itself:
 * the same bits whenever X holds at ri what it held at pi and nothing else
 * ever looks at L.
 */
static int kp_fold_ok(const struct mscx_program *kp, uint32_t ntb, uint32_t b, uint32_t pi, uint32_t ri,
                      uint32_t j, uint32_t pl)
{
    const struct mscx_entry *p = &kp->entry[pi], *r = &kp->entry[ri];
    const struct kp_span X = kp_span_of(kp, p, 0, pl), L = kp_span_of(kp, p, 1, pl);
    if (X.space >= MSCX_KB_RBUF)
        return 0; /* a peer's memory: it may change between the two */
    if (kp_meet(&X, &L))
        return 0;
    for (uint32_t bb = 0; bb < ntb; bb++)
        for (uint32_t e = kp->kbegin[bb]; e < kp->kbegin[bb + 1]; e++) {
            const struct mscx_entry *k = &kp->entry[e];
            /* a SKIP moves nothing (a fused unpack keeps its operands) */
            if (e == pi || k->kind == MSCX_ENTRY_SKIP)
                continue;
            for (uint32_t jj = 0; jj < (uint32_t)k->nsrc + k->ndst; jj++) {
                if (e == ri && jj == j)
                    continue;
                const struct kp_span s = kp_span_of(kp, k, jj, pl);
                if (kp_meet(&s, &L))
                    return 0; /* L is read or written elsewhere: it must keep the pack's lines */
                if (!kp_meet(&s, &X))
                    continue;
                if (e == ri) {
                    /* the flat destination may be X exactly: thread u reads unit u before it writes it */
                    if (jj == r->nsrc && s.lo == X.lo && s.hi == X.hi)
                        continue;
                    return 0; /* another source is X, or a destination overlaps it elsewhere */
                }
                if (jj < k->nsrc)
                    continue; /* another read of X changes nothing */
                if (bb != b || (pi < e && e < ri))
                    return 0; /* X may change between the pack and the reduction */
            }
        }
    return 1;
}

/*
 * A PACK of flat X into lines L of the rank's own scratch, read back by a
 * later REDPKT of the same block over the same units as one of its line
 * sources (src[1..]): the REDPKT reads X flat there instead (fsrc) and the
 * PACK becomes a SKIP that keeps its barrier. The one-shot AllReduce has
 * this shape on every rank after 0: it packs its own input into its own
 * slot only to fold that slot back in rank order. The payload of a line is
 * the flat unit it was packed from, bit for bit, and each thread handles
 * the same units in both entries, so X gives the same values when nothing
 * writes X between the two and nothing else reads or writes L (kp_fold_ok),
 * and no peer can read or write them. At most one such source per REDPKT
 * (the kernel tests one index). Runs on the whole rank's program after
 * kp_fuse_unpack; @p slot is the rank's chunk slot at this launch.
 * @return the packs folded
 */
static uint32_t kp_fold_pack(struct mscx_program *kp, uint32_t ntb, const struct mscx_plan *plan,
                             uint32_t rank, const struct mscx_dev_op *ops, uint64_t slot, uint32_t pl)
{
    uint32_t folded = 0;
    int judged = 0;
    if (kp->interp_mask)
        return 0; /* an interpreter block's accesses are not in the program */
    for (uint32_t b = 0; b < ntb; b++)
        for (uint32_t ri = kp->kbegin[b]; ri < kp->kbegin[b + 1]; ri++) {
            struct mscx_entry *r = &kp->entry[ri];
            if (r->kind != MSCX_ENTRY_REDPKT)
                continue;
            for (uint32_t j = 1; j < r->nsrc && !r->fsrc; j++) {
                struct mscx_entry_opnd *s = &kp->opnd[r->opnd + j];
                if (s->base != MSCX_KB_SCRATCH)
                    continue;
                /* the block's last PACK before r into these lines (an earlier one fails kp_fold_ok) */
                uint32_t pi = UINT32_MAX;
                for (uint32_t e = kp->kbegin[b]; e < ri; e++)
                    if (kp->entry[e].kind == MSCX_ENTRY_PACK && kp_same(&kp->opnd[kp->entry[e].opnd + 1], s))
                        pi = e;
                if (pi == UINT32_MAX)
                    continue;
                struct mscx_entry *p = &kp->entry[pi];
                if (p->units != r->units)
                    continue;
                if (!judged) { /* once per program, and only where there is a candidate */
                    judged = 1;
                    if (kp_plan_reads_peers(plan))
                        return folded;
                    for (uint32_t bb = 0; bb < ntb; bb++)
                        for (uint32_t e = kp->kbegin[bb]; e < kp->kbegin[bb + 1]; e++) {
                            /* a data op left to the interpreter: its bytes are not known here */
                            const struct mscx_dev_op *op = &ops[kp->obase[bb] + kp->entry[e].op];
                            if (kp->entry[e].kind == MSCX_ENTRY_GENERIC && op->nsrc + op->ndst > 0)
                                return folded;
                        }
                }
                const struct mscx_entry_opnd *x = &kp->opnd[p->opnd];
                const struct kp_span X = kp_span_of(kp, p, 0, pl), L = kp_span_of(kp, p, 1, pl);
                if (!kp_fold_ok(kp, ntb, b, pi, ri, j, pl) || kp_peer_writes(plan, rank, slot, &L) ||
                    kp_peer_writes(plan, rank, slot, &X))
                    continue;
                *s = *x;
                r->fsrc = (uint8_t)j;
                p->kind = MSCX_ENTRY_SKIP;
                p->units = 0;
                folded++;
            }
        }
    return folded;
}

/*
 * Op @p i of a block, @p op: its entries, a GENERIC entry when it is left to
 * the interpreter, a SKIP for a barrier that moves nothing. @return 0, or -1
 * when the program is full.
 */
static int kp_compile_op(struct kp_build *k, const struct mscx_dev_op *op, uint32_t i)
{
    uint32_t nk = k->nentry, no = k->nopnd;
    int rc = op->opcode == MSCX_OP_NOP && !(op->flags & MSCX_GPU_OPF_SYNC)
                 ? 1
                 : kp_op(k, op, i, op->chan_type == MSCX_CHAN_PORT);
    if (rc < 0)
        return -1;
    if (rc == 0) { /* roll back and leave it to the interpreter */
        k->nentry = nk;
        k->nopnd = no;
        if (!kp_entry_add(k, MSCX_ENTRY_GENERIC, op, i, 0))
            return -1;
    } else if (k->nentry == nk) { /* compiled to nothing (no units): a barrier it carries stays */
        if (!(op->flags & MSCX_GPU_OPF_SYNC))
            return 0;
        struct mscx_entry *skip = kp_entry_add(k, MSCX_ENTRY_SKIP, op, i, 0);
        if (!skip)
            return -1;
        skip->sync = 1;
        return 0;
    }
    if (op->flags & MSCX_GPU_OPF_SYNC)
        k->kp->entry[nk].sync = 1;
    return 0;
}

/* Block @p b (@p tb) into k's program: its entries, or an interpreter block. @return 0, or -1: does not fit.
 */
static int kp_compile_block(struct kp_build *k, const struct mscx_dev_op *ops, const struct mscx_tb *tb,
                            uint32_t b)
{
    struct mscx_program *kp = k->kp;
    kp->kbegin[b] = (uint16_t)k->nentry;
    kp->pbegin[b] = (uint16_t)k->nopnd;
    if (tb->op_begin > UINT16_MAX)
        return -1;
    kp->obase[b] = (uint16_t)tb->op_begin;
    for (uint32_t i = 0; i < tb->nops; i++)
        if (ops[tb->op_begin + i].opcode == MSCX_OP_PIPELINE) {
            kp->interp_mask |= 1u << b;
            return 0;
        }
    for (uint32_t i = 0; i < tb->nops; i++)
        if (kp_compile_op(k, &ops[tb->op_begin + i], i))
            return -1;
    return 0;
}

int mscx_gpu_compile(const struct mscx_plan *plan, uint32_t rank, const struct mscx_dev_op *ops,
                     const struct mscx_compile_rbuf *rbuf, const struct mscx_gpu_args *a,
                     struct mscx_program *kp)
{
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    struct kp_build k = {a, kp, rbuf, gpu->nrbuf, 0, 0, a->pkt == MSCX_PKT_LL8 ? 4u : 8u};
    memset(kp, 0, sizeof(*kp));
    if (gpu->ntb > MSCX_KP_MAX_BLOCKS || gpu->nrbuf > MSCX_KP_MAX_RBUF)
        return 0;
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        kp->rsc[i] = rbuf[i].ptr;
        kp->rhalf[i] = rbuf[i].half;
    }
    for (uint32_t b = 0; b < gpu->ntb; b++)
        if (kp_compile_block(&k, ops, &gpu->tb[b], b))
            return 0;
    kp->kbegin[gpu->ntb] = (uint16_t)k.nentry;
    kp->pbegin[gpu->ntb] = (uint16_t)k.nopnd;
    for (uint32_t b = 0; b < gpu->ntb; b++)
        if (!(kp->interp_mask & (1u << b)))
            kp_fuse_unpack(kp, kp->kbegin[b], kp->kbegin[b + 1]);
    /* the pack folded into a reduction first: merging packs would hide it among a peer-bound PACK's
     * destinations */
    kp_fold_pack(kp, gpu->ntb, plan, rank, ops, a->geom[0].slot, k.pl);
    for (uint32_t b = 0; b < gpu->ntb; b++)
        if (!(kp->interp_mask & (1u << b)))
            kp_fuse_pack(kp, kp->kbegin[b], kp->kbegin[b + 1]);
    kp_compact(kp, gpu->ntb);
    return 1;
}

/* ---- user-buffer accesses: mscx_gpu_kp_split and mscx_gpu_kp_alias_ok ---- */

/* One operand of a compiled entry that names the input or the output. */
struct kp_acc {
    uint64_t lo, hi;   /* bytes of the one buffer both name (in place, or aliased by the caller) */
    uint32_t blk, ent; /* the block, and the entry (index in kp->entry) */
    uint16_t opnd;     /* index in kp->opnd */
    uint8_t in;        /* names the input (else the output) */
    uint8_t wr;        /* a destination */
    uint8_t self;      /* a write: a COPY of exactly these bytes onto themselves */
};

static int kp_user(uint32_t base)
{
    return base == MSCX_KB_IN || base == MSCX_KB_OUT;
}

/*
 * Every operand of @p kp that names the input (at byte @p in_at of the one
 * buffer) or the output (at @p out_at), into @p acc (MSCX_KP_MAX_OPND).
 * @return the count, or -1 when the program cannot be judged: not compiled
 *         whole (an interpreter block, a GENERIC entry) or packet lines in a
 *         user buffer
 */
static int kp_accesses(const struct mscx_program *kp, uint32_t ntb, uint32_t pl, uint64_t in_at,
                       uint64_t out_at, struct kp_acc *acc)
{
    uint32_t n = 0;
    if (ntb == 0 || ntb > MSCX_KP_MAX_BLOCKS || kp->interp_mask)
        return -1;
    for (uint32_t b = 0; b < ntb; b++)
        for (uint32_t e = kp->kbegin[b]; e < kp->kbegin[b + 1]; e++) {
            const struct mscx_entry *k = &kp->entry[e];
            if (k->kind == MSCX_ENTRY_GENERIC)
                return -1;
            if (k->kind == MSCX_ENTRY_SKIP) /* moves nothing (an unpack fused away keeps its operands) */
                continue;
            for (uint32_t j = 0; j < (uint32_t)k->nsrc + k->ndst; j++) {
                const struct mscx_entry_opnd *d = &kp->opnd[k->opnd + j];
                uint64_t ext;
                if (!kp_user(d->base))
                    continue;
                if (!kp_opnd_flat(k, j, pl, &ext) || n == MSCX_KP_MAX_OPND)
                    return -1;
                const int is_in = d->base == MSCX_KB_IN, wr = j >= k->nsrc;
                const uint64_t lo = (is_in ? in_at : out_at) + d->off;
                const struct mscx_entry_opnd *s0 = &kp->opnd[k->opnd];
                acc[n++] = (struct kp_acc){lo,
                                           lo + ext,
                                           b,
                                           e,
                                           (uint16_t)(k->opnd + j),
                                           (uint8_t)is_in,
                                           (uint8_t)wr,
                                           (uint8_t)(wr && k->kind == MSCX_ENTRY_COPY &&
                                                     s0->base == MSCX_KB_IN && in_at + s0->off == lo)};
            }
        }
    return (int)n;
}

/*
 * How far from @p lo the writes among @p acc cover without a gap, counting
 * only writes of block @p blk by entries before @p ent (UINT32_MAX for
 * either: any).
 */
static uint64_t kp_cover_end(const struct kp_acc *acc, uint32_t n, uint32_t blk, uint32_t ent, uint64_t lo,
                             uint64_t hi)
{
    uint64_t at = lo;
    for (int moved = 1; at < hi && moved;) {
        moved = 0;
        for (uint32_t i = 0; i < n; i++)
            if (acc[i].wr && (blk == UINT32_MAX || acc[i].blk == blk) &&
                (ent == UINT32_MAX || acc[i].ent < ent) && acc[i].lo <= at && at < acc[i].hi) {
                at = acc[i].hi;
                moved = 1;
            }
    }
    return at;
}

/* ---- out-of-place calls on an in-place AllReduce plan ---- */

int mscx_gpu_kp_split(struct mscx_program *kp, uint32_t ntb, uint32_t pl, uint64_t out_bytes)
{
    static __thread struct kp_acc acc[MSCX_KP_MAX_OPND];
    static __thread uint8_t nbase[MSCX_KP_MAX_OPND];
    const int na = kp_accesses(kp, ntb, pl, 0, 0, acc);
    if (na < 0)
        return 0;
    const uint32_t n = (uint32_t)na;
    /* writes go to the output; reads to the input where nothing wrote before, to the output where this block
     * did */
    for (uint32_t i = 0; i < n; i++) {
        const struct kp_acc *r = &acc[i];
        if (r->wr) {
            nbase[r->opnd] = MSCX_KB_OUT;
            continue;
        }
        int before = 0;
        for (uint32_t q = 0; q < n; q++) {
            if (!acc[q].wr || acc[q].hi <= r->lo || r->hi <= acc[q].lo)
                continue;
            if (acc[q].blk != r->blk)
                return 0; /* another block writes these bytes: the order is not known here */
            before |= acc[q].ent < r->ent;
        }
        if (!before)
            nbase[r->opnd] = MSCX_KB_IN;
        else if (kp_cover_end(acc, n, r->blk, r->ent, r->lo, r->hi) >= r->hi)
            nbase[r->opnd] = MSCX_KB_OUT;
        else
            return 0; /* partly written before */
    }
    /* the result must be whole: bytes no entry writes would keep the output's old contents */
    if (kp_cover_end(acc, n, UINT32_MAX, UINT32_MAX, 0, out_bytes) < out_bytes)
        return 0;
    for (uint32_t i = 0; i < n; i++)
        kp->opnd[acc[i].opnd].base = nbase[acc[i].opnd];
    return 1;
}

/* ---- in-place calls on an out-of-place plan ---- */

/* A barrier (a synced entry) after entry @p a and up to entry @p b, both of one block. */
static int kp_barrier_between(const struct mscx_program *kp, uint32_t a, uint32_t b)
{
    for (uint32_t e = a + 1; e <= b; e++)
        if (kp->entry[e].sync)
            return 1;
    return 0;
}

int mscx_gpu_kp_packet_only(const struct mscx_program *kp, uint32_t ntb)
{
    for (uint32_t i = 0; i < kp->kbegin[ntb]; i++)
        if (!mscx_entry_is_packet(kp->entry[i].kind))
            return 0;
    return 1;
}

int mscx_gpu_kp_alias_ok(const struct mscx_program *kp, uint32_t ntb, uint32_t pl, uint64_t in_at,
                         uint64_t out_at, uint64_t in_bytes)
{
    static __thread struct kp_acc acc[MSCX_KP_MAX_OPND];
    const int na = kp_accesses(kp, ntb, pl, in_at, out_at, acc);
    if (na < 0)
        return 0;
    const uint32_t n = (uint32_t)na;
    for (uint32_t i = 0; i < n; i++)
        if (acc[i].wr && acc[i].in)
            return 0; /* the plan writes its input: only staging keeps the caller's send buffer */
    const uint64_t ilo = in_at, ihi = in_at + in_bytes;
    for (uint32_t i = 0; i < n; i++) {
        const struct kp_acc *r = &acc[i];
        if (r->wr)
            continue;
        for (uint32_t q = 0; q < n; q++) {
            const struct kp_acc *w = &acc[q];
            if (!w->wr || w->self || w->hi <= r->lo || r->hi <= w->lo)
                continue;
            if (w->blk != r->blk)
                return 0; /* another block writes what this read needs: no order known */
            if (w->ent < r->ent) {
                if (r->in)
                    return 0; /* the input read would see what the write put there */
            } else if (w->ent == r->ent) {
                const uint8_t kind = kp->entry[r->ent].kind;
                if (!r->in || w->lo != r->lo || w->hi != r->hi ||
                    !(kind == MSCX_ENTRY_COPY || kind == MSCX_ENTRY_REDUCE || kind == MSCX_ENTRY_REDPKT))
                    return 0;
            } else if (r->in && !kp_barrier_between(kp, r->ent, w->ent)) {
                return 0; /* a later entry overwrites bytes an earlier one reads, with no barrier between */
            }
        }
        /* an output read where the input lies, not written here first: it would read the input */
        if (!r->in && r->lo < ihi && ilo < r->hi &&
            kp_cover_end(acc, n, r->blk, r->ent, r->lo, r->hi) < r->hi)
            return 0;
    }
    return 1;
}

static uint64_t kp_ptr_at(const struct mscx_program *kp, const struct mscx_entry_opnd *d, char *scratch,
                          uint64_t half, uint32_t parity)
{
    uint32_t flag = parity ? 1u : 2u; /* any flag of that parity */
    if (d->base >= MSCX_KB_RBUF) {
        uint32_t r = d->base - MSCX_KB_RBUF;
        return (uint64_t)(uintptr_t)(kp->rsc[r] + mscx_scratch_offset(flag, kp->rhalf[r]) + d->off);
    }
    return (uint64_t)(uintptr_t)(scratch + mscx_scratch_offset(flag, half) + d->off);
}

size_t mscx_gpu_kp_encode(const struct mscx_program *kp, uint32_t ntb, char *scratch, uint64_t scratch_half,
                          void *dst, size_t cap, uint32_t *stride_p, uint32_t *kmax_p, uint32_t *pmax_p)
{
    uint32_t kmax = 0, pmax = 0;
    if (ntb > MSCX_KP_MAX_BLOCKS)
        return 0;
    for (uint32_t b = 0; b < ntb; b++) {
        uint32_t nk = kp->kbegin[b + 1] - kp->kbegin[b], np = kp->pbegin[b + 1] - kp->pbegin[b];
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
        uint32_t kb = kp->kbegin[b], pb = kp->pbegin[b];
        h->nk = kp->kbegin[b + 1] - kb;
        h->np = kp->pbegin[b + 1] - pb;
        h->obase = kp->obase[b];
        for (uint32_t i = 0; i < h->nk; i++) {
            ko[i] = kp->entry[kb + i];
            ko[i].opnd = (uint16_t)(kp->entry[kb + i].opnd - pb);
        }
        for (uint32_t i = 0; i < h->np; i++) {
            const struct mscx_entry_opnd *d = &kp->opnd[pb + i];
            if (d->base == MSCX_KB_IN || d->base == MSCX_KB_OUT) {
                po[i].v[0] = (d->base == MSCX_KB_IN ? MSCX_TAGGED_IN : MSCX_TAGGED_OUT) | d->off;
                po[i].v[1] = po[i].v[0];
            } else {
                po[i].v[0] = kp_ptr_at(kp, d, scratch, scratch_half, 0);
                po[i].v[1] = kp_ptr_at(kp, d, scratch, scratch_half, 1);
            }
        }
    }
    *stride_p = (uint32_t)stride;
    *kmax_p = kmax;
    *pmax_p = pmax;
    return bytes;
}
