/* SPDX-License-Identifier: MIT */
/*
 * The GPU launch compiler (executor/gpu/launch_compile*.c) on the host: for
 * every shipped plan, every rank, sizes at and inside the plan's range
 * (aligned and odd), LL16 and LL8, fp32 and fp16, every compiled entry's operands must lie
 * inside their buffers (input, output, this launch's scratch half, the
 * owner's half of a peer's scratch), with the byte counts each kind touches.
 * Whether the compiled program computes what the interpreter computes is
 * checked on the GPU (gpu suite, bit for bit against the host executor)
 * and by test_launch_emulation.c on the host; this test guards memory safety, that
 * the one-shot plans compile whole, and where the peepholes apply.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test_common.h"
#include "mscx/plan.h"
#include "launch_abi.h"
#include "op_math.h"
#include "plan_model.h"

#define MAX_RB 64

struct ctx {
    const struct mscx_plan *plan;
    uint32_t rank;
    struct mscx_gpu_args a;
    struct mscx_program prog;
    uint64_t own_half; /* this rank's fixed scratch half (0: single buffered) */
    struct mscx_compile_rbuf rb[MAX_RB];
    uint64_t rb_bytes[MAX_RB]; /* usable bytes from the operand base: the owner's half */
    uint64_t own_bytes;
};

static uint64_t half_or_all(const struct mscx_geom *g)
{
    return g->scratch_half ? g->scratch_half : g->scratch_bytes;
}

/* Set up the arguments as runtime/launch.c does for one launch. @return 0, or -1 when the size is not valid
 * here. */
static int setup(struct ctx *c, uint64_t msg, enum mscx_dtype dt, enum mscx_pkt_format pkt)
{
    const struct mscx_plan *plan = c->plan;
    const struct mscx_gpu *gpu = &plan->gpus[c->rank];
    uint64_t in, out;
    struct mscx_geom g;
    char err[256];
    mscx_coll_sizes(plan->coll, plan->nranks, msg, &in, &out);
    if (mscx_plan_geom(plan, c->rank, in, out, dt, &g, err, sizeof(err)) != MSCX_OK)
        return -1;
    memset(&c->a, 0, sizeof(c->a));
    c->a.in_bytes = g.in_bytes;
    c->a.out_bytes = g.out_bytes;
    c->a.geom[0].slot = g.slot;
    c->a.geom[0].in_chunk = g.in_chunk;
    c->a.geom[0].out_chunk = g.out_chunk;
    c->a.pkt = pkt;
    c->own_bytes = half_or_all(&g);
    c->own_half = g.scratch_half;
    for (uint32_t i = 0; i < gpu->nops; i++)
        if (mscx_opcode_reduces(gpu->ops[i].opcode))
            c->a.reduce = 1;
    uint32_t ngeom = 1, owner_of[MSCX_GPU_MAX_GEOM] = {c->rank};
    ck_assert_uint_le(gpu->nrbuf, MAX_RB);
    for (uint32_t i = 0; i < gpu->nrbuf; i++) {
        uint32_t o = gpu->rbuf[i].rank;
        struct mscx_geom h;
        if (mscx_plan_geom(plan, o, in, out, dt, &h, err, sizeof(err)) != MSCX_OK)
            return -1;
        uint32_t cls = ngeom;
        for (uint32_t k = 0; k < ngeom; k++)
            if (mscx_gpu_same_chunks(&plan->gpus[owner_of[k]], &plan->gpus[o]))
                cls = k;
        if (cls == ngeom) {
            ck_assert_uint_lt(ngeom, MSCX_GPU_MAX_GEOM);
            owner_of[ngeom] = o;
            c->a.geom[ngeom].slot = h.slot;
            c->a.geom[ngeom].in_chunk = h.in_chunk;
            c->a.geom[ngeom].out_chunk = h.out_chunk;
            ngeom++;
        }
        c->rb[i].ptr =
            gpu->rbuf[i].type == MSCX_BUF_SCRATCH ? (char *)(uintptr_t)(0x100000u * (i + 1)) : NULL;
        c->rb[i].geom = cls;
        c->rb[i].half = h.scratch_half;
        c->rb_bytes[i] = half_or_all(&h);
    }
    return 0;
}

static uint64_t base_bytes(const struct ctx *c, uint32_t base)
{
    switch (base) {
    case MSCX_KB_IN:
        return c->a.in_bytes;
    case MSCX_KB_OUT:
        return c->a.out_bytes;
    case MSCX_KB_SCRATCH:
        return c->own_bytes;
    default:
        ck_assert_uint_lt(base - MSCX_KB_RBUF, c->plan->gpus[c->rank].nrbuf);
        return c->rb_bytes[base - MSCX_KB_RBUF];
    }
}

/* Operand j of entry k covers [off, off + bytes): inside its buffer. */
static void check_opnd(const struct ctx *c, const struct mscx_entry *k, uint32_t j, uint64_t bytes,
                       const char *what)
{
    const struct mscx_entry_opnd *o = &c->prog.opnd[k->opnd + j];
    uint64_t have = base_bytes(c, o->base);
    ck_assert_msg((uint64_t)o->off + bytes <= have,
                  "plan %s rank %u op %u (%s, kind %u): operand %u (%s, base %u) [%u, +%llu) past %llu bytes",
                  c->plan->name, c->rank, k->op, mscx_opcode_name((enum mscx_opcode)k->opcode), k->kind, j,
                  what, o->base, o->off, (unsigned long long)bytes, (unsigned long long)have);
}

/*
 * Check every entry; @return entries that stayed in the interpreter.
 * *nfused_p counts unpacks fused into a reduction, *nfolded_p packs read flat by one.
 */
static uint32_t check_program(const struct ctx *c, uint32_t *ncompiled_p, uint32_t *nfused_p,
                              uint32_t *nfolded_p)
{
    const struct mscx_gpu *gpu = &c->plan->gpus[c->rank];
    const struct mscx_program *prog = &c->prog;
    const uint64_t pl = c->a.pkt == MSCX_PKT_LL8 ? 4u : 8u;
    uint32_t generic = 0, compiled = 0;
    for (uint32_t b = 0; b < gpu->ntb; b++) {
        if (prog->interp_mask & (1u << b))
            continue;
        ck_assert_uint_le(prog->kbegin[b], prog->kbegin[b + 1]);
        for (uint32_t i = prog->kbegin[b]; i < prog->kbegin[b + 1]; i++) {
            const struct mscx_entry *k = &prog->entry[i];
            uint64_t n = k->units;
            ck_assert_uint_lt(k->op, gpu->tb[b].nops);
            ck_assert_uint_ge(k->opnd, prog->pbegin[b]);
            ck_assert_uint_le((uint32_t)k->opnd + k->nsrc + k->ndst, prog->pbegin[b + 1]);
            switch (k->kind) {
            case MSCX_ENTRY_PACK:
                check_opnd(c, k, 0, n * pl, "raw source");
                for (uint32_t j = 0; j < k->ndst; j++)
                    check_opnd(c, k, 1 + j, n * 2 * pl, "lines");
                break;
            case MSCX_ENTRY_UNPACK:
                check_opnd(c, k, 0, n * 2 * pl, "lines");
                check_opnd(c, k, 1, n * pl, "raw destination");
                break;
            case MSCX_ENTRY_FWD:
                check_opnd(c, k, 0, n * 2 * pl, "lines");
                for (uint32_t j = 0; j < k->ndst; j++)
                    check_opnd(c, k, 1 + j, n * 2 * pl, "lines");
                break;
            case MSCX_ENTRY_REDPKT:
                check_opnd(c, k, 0, k->lsrc0 ? n * 2 * pl : n * pl,
                           k->lsrc0 ? "fused source lines" : "raw source");
                ck_assert_uint_lt(k->fsrc, k->nsrc);
                for (uint32_t j = 1; j < k->nsrc; j++)
                    if (j == k->fsrc)
                        check_opnd(c, k, j, n * pl, "fused pack's raw source");
                    else
                        check_opnd(c, k, j, n * 2 * pl, "source lines");
                if (k->ndst > 0)
                    check_opnd(c, k, k->nsrc, n * pl, "raw destination");
                for (uint32_t j = 1; j < k->ndst; j++)
                    check_opnd(c, k, k->nsrc + j, n * 2 * pl, "destination lines");
                break;
            case MSCX_ENTRY_COPY:
                check_opnd(c, k, 0, n * 16u, "source");
                check_opnd(c, k, 1, n * 16u, "destination");
                break;
            case MSCX_ENTRY_REDUCE:
                for (uint32_t j = 0; j < (uint32_t)k->nsrc + k->ndst; j++)
                    check_opnd(c, k, j, n * 16u, "operand");
                break;
            case MSCX_ENTRY_GENERIC:
                generic++;
                continue;
            case MSCX_ENTRY_SKIP:
                /* fusion's SKIPs are dropped (prog_compact), except one that ends its block */
                ck_assert_msg(i + 1 == prog->kbegin[b + 1],
                              "%s rank %u block %u: a SKIP at entry %u of [%u, %u)", c->plan->name, c->rank,
                              b, i, prog->kbegin[b], prog->kbegin[b + 1]);
                continue;
            default:
                ck_abort_msg("unknown entry kind %u", k->kind);
            }
            ck_assert_uint_gt(n, 0);
            compiled++;
            *nfused_p += k->kind == MSCX_ENTRY_REDPKT && k->lsrc0;
            *nfolded_p += k->kind == MSCX_ENTRY_REDPKT && k->fsrc;
        }
    }
    *ncompiled_p += compiled;
    return generic;
}

/* The operand's pointer as the kernel resolved it before programs moved to device memory (launch flag @p f).
 */
static uint64_t old_kbase(const struct ctx *c, const struct mscx_entry_opnd *d, uint32_t f, uint64_t in,
                          uint64_t out, uint64_t scratch)
{
    if (d->base >= MSCX_KB_RBUF) {
        uint32_t k = d->base - MSCX_KB_RBUF;
        return (uint64_t)(uintptr_t)c->prog.rsc[k] + mscx_scratch_offset(f, c->prog.rhalf[k]) + d->off;
    }
    if (d->base == MSCX_KB_SCRATCH)
        return scratch + mscx_scratch_offset(f, c->own_half) + d->off;
    return (d->base == MSCX_KB_IN ? in : out) + d->off;
}

/*
 * The encoded block records (what the kernel stages) say what the program
 * says: same entries (operands counted from the block's first), and every
 * operand, resolved as the kernel does for an odd and an even flag, equal to
 * base + offset for that flag.
 */
static size_t g_max_encoded; /* largest encoded program (bytes), for the summary */

static void check_encoding(const struct ctx *c)
{
    const struct mscx_gpu *gpu = &c->plan->gpus[c->rank];
    static char buf[1 << 20];
    const uint64_t scratch = 0x7f0000000000ull, in = 0x7e0000000000ull, out = 0x7d0000000000ull;
    uint32_t stride, km, pm;
    size_t bytes = mscx_gpu_program_encode(&c->prog, gpu->ntb, (char *)(uintptr_t)scratch, c->own_half, buf,
                                           sizeof(buf), &stride, &km, &pm);
    ck_assert_uint_eq(bytes, (size_t)stride * gpu->ntb);
    ck_assert_uint_eq(stride, 16u * (1u + km + pm));
    /* one byte short: refused, and nothing written (buf, stride, km, pm keep the encoding above) */
    uint32_t stride2 = 0, km2 = 0, pm2 = 0;
    ck_assert_uint_eq(mscx_gpu_program_encode(&c->prog, gpu->ntb, (char *)(uintptr_t)scratch, c->own_half,
                                              buf, bytes - 1, &stride2, &km2, &pm2),
                      0);
    ck_assert_uint_eq(stride2 + km2 + pm2, 0);
    if (bytes > g_max_encoded)
        g_max_encoded = bytes;
    for (uint32_t b = 0; b < gpu->ntb; b++) {
        const char *rec = buf + (size_t)stride * b;
        const struct mscx_record_head *h = (const struct mscx_record_head *)rec;
        const struct mscx_entry *ko = (const struct mscx_entry *)(rec + 16);
        const struct mscx_tagged_ptr *po = (const struct mscx_tagged_ptr *)(rec + 16u * (1u + km));
        uint32_t kb = c->prog.kbegin[b], pb = c->prog.pbegin[b];
        ck_assert_uint_eq(h->nk, c->prog.kbegin[b + 1] - kb);
        ck_assert_uint_eq(h->np, c->prog.pbegin[b + 1] - pb);
        ck_assert_uint_le(h->nk, km);
        ck_assert_uint_le(h->np, pm);
        ck_assert_uint_eq(h->obase, c->prog.obase[b]);
        for (uint32_t i = 0; i < h->nk; i++) {
            struct mscx_entry want = c->prog.entry[kb + i];
            want.opnd = (uint16_t)(want.opnd - pb);
            ck_assert_int_eq(memcmp(&ko[i], &want, sizeof(want)), 0);
        }
        for (uint32_t i = 0; i < h->np; i++) {
            const struct mscx_entry_opnd *d = &c->prog.opnd[pb + i];
            for (uint32_t f = 1; f <= 2; f++) { /* odd, even */
                uint64_t v0 = po[i].v[0], tag = v0 >> MSCX_TAGGED_TAG_SHIFT, got;
                if (tag == 0)
                    got = po[i].v[f & 1u];
                else
                    got = (tag == 1 ? in : out) + (v0 & MSCX_TAGGED_OFF_MASK);
                ck_assert_msg(got == old_kbase(c, d, f, in, out, scratch),
                              "plan %s rank %u block %u operand %u flag parity %u: %#llx, want %#llx",
                              c->plan->name, c->rank, b, i, f & 1u, (unsigned long long)got,
                              (unsigned long long)old_kbase(c, d, f, in, out, scratch));
            }
        }
    }
}

START_TEST(test_compile_shipped_plans)
{
    struct mscx_test_plans it;
    mscx_test_plans_begin(&it);
    ck_assert_uint_gt(it.n, 30);
    uint64_t launches = 0, compiled_launches = 0;
    uint32_t entries = 0, fused_total = 0, packs_merged = 0, folded_total = 0, packet_programs = 0;
    for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL;) {
        uint64_t mn, mx;
        mscx_plan_size_range(plan, &mn, &mx);
        if (mx > (1u << 20))
            mx = 1u << 20;
        const uint64_t sizes[] = {mn, mn + 4, (mn + mx) / 2 + 12, mx - 4, mx};
        /* the one-shot AllReduce's shape; other collectives' one-shot plans copy their own block */
        int oneshot = strstr(plan->name, "oneshot") != NULL && plan->coll == MSCX_COLL_ALLREDUCE;
        for (uint32_t r = 0; r < plan->nranks; r++) {
            const struct mscx_gpu *gpu = &plan->gpus[r];
            struct mscx_dev_op *img = malloc((gpu->nops ? gpu->nops : 1) * sizeof(*img));
            ck_assert_ptr_nonnull(img);
            memcpy(img, gpu->ops, gpu->nops * sizeof(*img));
            mscx_gpu_mark_syncs(plan, r, img);
            struct ctx *c = calloc(1, sizeof(*c));
            ck_assert_ptr_nonnull(c);
            c->plan = plan;
            c->rank = r;
            for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                for (int dti = 0; dti < 2; dti++) {
                    enum mscx_dtype dt = dti ? MSCX_DT_FP16 : MSCX_DT_FP32;
                    for (int pk = 0; pk < 2; pk++) {
                        enum mscx_pkt_format pkt = pk ? MSCX_PKT_LL8 : MSCX_PKT_LL16;
                        if (sizes[s] < mn || sizes[s] > mx || setup(c, sizes[s], dt, pkt) != 0)
                            continue;
                        int on = mscx_gpu_compile(plan, r, img, c->rb, &c->a, &c->prog);
                        launches++;
                        if (!on)
                            continue;
                        compiled_launches++;
                        uint32_t fused = 0, folded = 0;
                        uint32_t generic = check_program(c, &entries, &fused, &folded);
                        fused_total += fused;
                        folded_total += folded;
                        /*
                         * ranks after 0 of the one-shot AllReduce unpack rank 0's packets, then fold: one
                         * entry (where a reduction compiled at all: a block whose slice ends in a part of a
                         * unit is left to the interpreter, the whole program of a one-block plan at such
                         * sizes)
                         */
                        int has_redpkt = 0;
                        for (uint32_t i = 0; i < c->prog.kbegin[gpu->ntb]; i++)
                            has_redpkt |= c->prog.entry[i].kind == MSCX_ENTRY_REDPKT;
                        if (oneshot && r > 0 && has_redpkt)
                            ck_assert_msg(fused > 0, "%s rank %u, %llu bytes: the unpack was not fused",
                                          plan->name, r, (unsigned long long)sizes[s]);
                        /* ... and read their input where they packed it into their own slot (rank 0 has
                           no such pack); an op left to the interpreter stops that (its bytes are unknown) */
                        if (oneshot)
                            ck_assert_msg(r > 0 && generic == 0 ? folded > 0 : folded == 0,
                                          "%s rank %u, %llu bytes: %u packs read flat", plan->name, r,
                                          (unsigned long long)sizes[s], folded);
                        check_encoding(c);
                        /* the one-shot plans are what small messages run: at the range ends nothing may be
                         * left */
                        if (oneshot && (sizes[s] == mn || sizes[s] == mx))
                            ck_assert_msg(generic == 0,
                                          "%s rank %u, %llu bytes: %u ops left to the interpreter",
                                          plan->name, r, (unsigned long long)sizes[s], generic);
                        /* ... and hold packet entries only: the packet kernel runs them */
                        int pkonly = mscx_gpu_program_is_packet(&c->prog, gpu->ntb);
                        packet_programs += pkonly;
                        if (oneshot && (sizes[s] == mn || sizes[s] == mx))
                            ck_assert_msg(pkonly, "%s rank %u, %llu bytes: not packet entries only",
                                          plan->name, r, (unsigned long long)sizes[s]);
                        /*
                         * and each of their blocks sends its slice to every peer from one PACK entry
                         * (prog_fuse_pack: the put-packets op has a pair per peer)
                         */
                        if (oneshot && (sizes[s] == mn || sizes[s] == mx))
                            for (uint32_t b = 0; b < gpu->ntb; b++) {
                                const struct mscx_entry *k0 = &c->prog.entry[c->prog.kbegin[b]];
                                ck_assert_msg(k0->kind == MSCX_ENTRY_PACK && k0->ndst == plan->nranks - 1,
                                              "%s rank %u block %u, %llu bytes: first entry kind %u with %u "
                                              "destinations",
                                              plan->name, r, b, (unsigned long long)sizes[s], k0->kind,
                                              k0->ndst);
                                packs_merged++;
                            }
                    }
                }
            }
            free(c);
            free(img);
        }
    }
    printf(
        "gpu compile: %zu plans, %llu launches compiled (%llu fit the program), %u entries bounds-checked, "
        "%u unpacks fused, %u packs read flat by a reduction, %u one-shot blocks with one PACK to all peers, "
        "largest encoded program %zu bytes, %u programs of packet entries only\n",
        it.n, (unsigned long long)launches, (unsigned long long)compiled_launches, entries, fused_total,
        folded_total, packs_merged, g_max_encoded, packet_programs);
    ck_assert_uint_gt(compiled_launches, launches / 2);
}
END_TEST

/* ---- mscx_gpu_program_split on hand-made programs ---- */

/* Append entry (kind, units, block's next) with operands (base, off) pairs: nsrc sources then ndst. */
static void prog_add(struct mscx_program *prog, uint32_t *nk, uint32_t *np, uint8_t kind, uint32_t units,
                     uint8_t nsrc, uint8_t ndst, const uint32_t *bo)
{
    struct mscx_entry *k = &prog->entry[(*nk)++];
    memset(k, 0, sizeof(*k));
    k->kind = kind;
    k->units = units;
    k->nsrc = nsrc;
    k->ndst = ndst;
    k->opnd = (uint16_t)*np;
    for (uint32_t j = 0; j < (uint32_t)nsrc + ndst; j++) {
        prog->opnd[*np].base = bo[2 * j];
        prog->opnd[*np].off = bo[2 * j + 1];
        (*np)++;
    }
}

/*
 * Two blocks over a 512-byte in-place buffer (LL16: 8 payload bytes per
 * line). Block b: PACK its half into scratch lines (reads bytes nothing
 * wrote yet: the input), UNPACK a peer's lines over its half, then REDUCE
 * the half named as input and as output into itself (both written by the
 * UNPACK before: the output).
 * @p variant breaks one rule: 1 block 1 reads block 0's half, 2 the reduce
 * reads a range partly written before, 3 a range nothing writes, 4 packets
 * in the user buffer.
 */
static void prog_hand(struct mscx_program *prog, int variant)
{
    uint32_t nk = 0, np = 0;
    memset(prog, 0, sizeof(*prog));
    for (uint32_t b = 0; b < 2; b++) {
        uint32_t h = 256u * b;
        prog->kbegin[b] = (uint16_t)nk;
        prog->pbegin[b] = (uint16_t)np;
        uint32_t pack[] = {MSCX_KB_IN, h, MSCX_KB_SCRATCH, 2u * h};
        prog_add(prog, &nk, &np, MSCX_ENTRY_PACK, 32, 1, 1, pack);
        uint32_t unpack[] = {MSCX_KB_RBUF, 2u * h, variant == 4 && b ? MSCX_KB_IN : MSCX_KB_SCRATCH, 4096};
        if (variant == 4 && b)
            prog_add(prog, &nk, &np, MSCX_ENTRY_FWD, 16, 1, 1, unpack);
        unpack[2] = MSCX_KB_OUT;
        unpack[3] = h;
        prog_add(prog, &nk, &np, MSCX_ENTRY_UNPACK, variant == 3 && b ? 24 : 32, 1, 1, unpack);
        uint32_t rd = variant == 1 && b ? 0 : variant == 2 && b ? h - 16 : h;
        uint32_t red[] = {MSCX_KB_IN, h, MSCX_KB_OUT, rd, MSCX_KB_OUT, h};
        prog_add(prog, &nk, &np, MSCX_ENTRY_REDUCE, variant == 3 && b ? 12 : 16, 2, 1, red);
    }
    prog->kbegin[2] = (uint16_t)nk;
    prog->pbegin[2] = (uint16_t)np;
}

/* mscx_gpu_program_is_packet: a COPY, a REDUCE or a GENERIC entry anywhere rules the packet kernel out */
START_TEST(test_packet_program)
{
    static const uint8_t other[] = {MSCX_ENTRY_COPY, MSCX_ENTRY_REDUCE, MSCX_ENTRY_GENERIC};
    struct mscx_program *prog = calloc(1, sizeof(*prog));
    ck_assert_ptr_nonnull(prog);
    prog_hand(prog, 0); /* PACK, UNPACK, REDUCE per block */
    ck_assert_int_eq(mscx_gpu_program_is_packet(prog, 2), 0);
    ck_assert_int_eq(mscx_gpu_program_is_packet(prog, 0), 1); /* no blocks: nothing to refuse */
    for (size_t o = 0; o < sizeof(other) / sizeof(other[0]); o++)
        for (uint32_t at = 0; at < 6; at++) {
            uint8_t kinds[6] = {MSCX_ENTRY_PACK,   MSCX_ENTRY_FWD,  MSCX_ENTRY_REDPKT,
                                MSCX_ENTRY_UNPACK, MSCX_ENTRY_SKIP, MSCX_ENTRY_REDPKT};
            memset(prog, 0, sizeof(*prog));
            for (uint32_t i = 0; i < 6; i++)
                prog->entry[i].kind = i == at ? other[o] : kinds[i];
            prog->kbegin[1] = 3; /* two blocks of three entries */
            prog->kbegin[2] = 6;
            ck_assert_msg(mscx_gpu_program_is_packet(prog, 2) == 0, "kind %u at entry %u not seen", other[o],
                          at);
            prog->entry[at].kind = kinds[at];
            ck_assert_int_eq(mscx_gpu_program_is_packet(prog, 2), 1);
        }
    free(prog);
}
END_TEST

/*
 * mscx_gpu_kernel_variant: the packet kernel (which sums only and has no trace) runs only whole packet
 * programs whose reduction, if any, is a sum, untraced; every other whole program runs the whole-program
 * kernel; the rest the interpreter kernel; blocks of at most 512 threads the 512-thread kernels, and only
 * they fit them.
 */
START_TEST(test_kernel_variant)
{
    static const struct {
        uint32_t whole, packet, trace_cap, reduce, op, nthreads;
        enum mscx_kernel_variant want;
    } cases[] = {
        {0, 0, 0, 1, MSCX_REDOP_SUM, 512, MSCX_KERNEL_INTERPRETER_1024},
        {0, 1, 0, 1, MSCX_REDOP_SUM, 1024, MSCX_KERNEL_INTERPRETER_1024}, /* not whole: packet ignored */
        {1, 0, 0, 1, MSCX_REDOP_SUM, 1024, MSCX_KERNEL_WHOLE_1024},
        {1, 0, 0, 1, MSCX_REDOP_SUM, 512, MSCX_KERNEL_WHOLE_512},
        {1, 1, 0, 1, MSCX_REDOP_SUM, 1024, MSCX_KERNEL_PACKET_1024},
        {1, 1, 0, 1, MSCX_REDOP_SUM, 512, MSCX_KERNEL_PACKET_512},
        {1, 1, 0, 1, MSCX_REDOP_SUM, 32, MSCX_KERNEL_PACKET_512},
        {1, 1, 0, 0, MSCX_REDOP_MAX, 1024, MSCX_KERNEL_PACKET_1024}, /* copy-only: the operator is not used */
        {1, 1, 0, 1, MSCX_REDOP_PROD, 1024, MSCX_KERNEL_WHOLE_1024},
        {1, 1, 0, 1, MSCX_REDOP_MIN, 512, MSCX_KERNEL_WHOLE_512},
        {1, 1, 0, 1, MSCX_REDOP_MAX, 513, MSCX_KERNEL_WHOLE_1024},
        {1, 1, 64, 1, MSCX_REDOP_SUM, 1024, MSCX_KERNEL_WHOLE_1024}, /* traced */
        {1, 1, 64, 0, MSCX_REDOP_SUM, 256, MSCX_KERNEL_WHOLE_512},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mscx_gpu_args a;
        memset(&a, 0, sizeof(a));
        a.whole = cases[i].whole;
        a.packet = cases[i].packet;
        a.trace_cap = cases[i].trace_cap;
        a.reduce = cases[i].reduce;
        a.op = cases[i].op;
        enum mscx_kernel_variant v = mscx_gpu_kernel_variant(&a, cases[i].nthreads);
        ck_assert_msg(v == cases[i].want, "case %zu: variant %d, want %d", i, (int)v, (int)cases[i].want);
        ck_assert(mscx_gpu_kernel_variant_fits(v, cases[i].nthreads));
    }
    ck_assert(!mscx_gpu_kernel_variant_fits(MSCX_KERNEL_PACKET_512, 513));
    ck_assert(!mscx_gpu_kernel_variant_fits(MSCX_KERNEL_WHOLE_512, 1024));
    ck_assert(mscx_gpu_kernel_variant_fits(MSCX_KERNEL_PACKET_1024, 1024));
    ck_assert(mscx_gpu_kernel_variant_fits(MSCX_KERNEL_INTERPRETER_1024, 1024));
}
END_TEST

START_TEST(test_split_rules)
{
    static struct mscx_program prog, orig;
    prog_hand(&prog, 0);
    ck_assert_int_eq(mscx_gpu_program_split(&prog, 2, 8, 512), 1);
    for (uint32_t b = 0; b < 2; b++) {
        const struct mscx_entry *k = &prog.entry[prog.kbegin[b]];
        /* PACK reads the input (nothing wrote it); UNPACK writes the output */
        ck_assert_uint_eq(prog.opnd[k[0].opnd].base, MSCX_KB_IN);
        ck_assert_uint_eq(prog.opnd[k[1].opnd + 1].base, MSCX_KB_OUT);
        /* REDUCE: both sources name bytes the UNPACK wrote before (in place, IN and OUT are one buffer) */
        ck_assert_uint_eq(prog.opnd[k[2].opnd].base, MSCX_KB_OUT);
        ck_assert_uint_eq(prog.opnd[k[2].opnd + 1].base, MSCX_KB_OUT);
        ck_assert_uint_eq(prog.opnd[k[2].opnd + 2].base, MSCX_KB_OUT);
    }
    /* a buffer larger than what is written: refused */
    prog_hand(&prog, 0);
    orig = prog;
    ck_assert_int_eq(mscx_gpu_program_split(&prog, 2, 8, 528), 0);
    ck_assert_int_eq(memcmp(&prog, &orig, sizeof(prog)), 0);
    for (int v = 1; v <= 4; v++) {
        prog_hand(&prog, v);
        orig = prog;
        ck_assert_msg(mscx_gpu_program_split(&prog, 2, 8, 512) == 0, "variant %d split", v);
        ck_assert_msg(memcmp(&prog, &orig, sizeof(prog)) == 0, "variant %d: refused but changed", v);
    }
    /* a GENERIC entry or an interpreter block: refused */
    prog_hand(&prog, 0);
    prog.entry[1].kind = MSCX_ENTRY_GENERIC;
    ck_assert_int_eq(mscx_gpu_program_split(&prog, 2, 8, 512), 0);
    prog_hand(&prog, 0);
    prog.interp_mask = 2;
    ck_assert_int_eq(mscx_gpu_program_split(&prog, 2, 8, 512), 0);
}
END_TEST

/*
 * An AllGather-like program of rank 1 of 2 (256 input bytes; in place the
 * input is bytes 256..512 of the output): PACK the input to scratch lines,
 * COPY it onto its own place in the output, UNPACK the peer's lines into
 * output bytes 0..256. @p variant: 1 the UNPACK writes the input's bytes
 * instead (after the PACK read them, no barrier), 2 the same with a
 * barrier, 3 that write in a second block, 4 a REDUCE reads output bytes
 * where the input lies without the COPY before it, 5 an entry writes the
 * input.
 */
static void prog_hand_ag(struct mscx_program *prog, int variant, uint32_t *ntb_p)
{
    uint32_t nk = 0, np = 0;
    memset(prog, 0, sizeof(*prog));
    prog->kbegin[0] = 0;
    prog->pbegin[0] = 0;
    uint32_t pack[] = {MSCX_KB_IN, 0, MSCX_KB_SCRATCH, 0};
    prog_add(prog, &nk, &np, MSCX_ENTRY_PACK, 32, 1, 1, pack);
    if (variant != 4) {
        uint32_t copy[] = {MSCX_KB_IN, 0, MSCX_KB_OUT, 256};
        prog_add(prog, &nk, &np, MSCX_ENTRY_COPY, 16, 1, 1, copy);
    }
    uint32_t unpack[] = {MSCX_KB_RBUF, 0, MSCX_KB_OUT, variant == 1 || variant == 2 ? 256u : 0u};
    if (variant != 3)
        prog_add(prog, &nk, &np, MSCX_ENTRY_UNPACK, 32, 1, 1, unpack);
    if (variant == 2)
        prog->entry[nk - 1].sync = 1;
    if (variant == 4) {
        uint32_t red[] = {MSCX_KB_OUT, 256, MSCX_KB_OUT, 0, MSCX_KB_OUT, 0};
        prog_add(prog, &nk, &np, MSCX_ENTRY_REDUCE, 16, 2, 1, red);
    }
    if (variant == 5) {
        uint32_t wr[] = {MSCX_KB_OUT, 0, MSCX_KB_IN, 0};
        prog_add(prog, &nk, &np, MSCX_ENTRY_COPY, 16, 1, 1, wr);
    }
    *ntb_p = 1;
    if (variant == 3) {
        prog->kbegin[1] = (uint16_t)nk;
        prog->pbegin[1] = (uint16_t)np;
        unpack[3] = 256;
        prog_add(prog, &nk, &np, MSCX_ENTRY_UNPACK, 32, 1, 1, unpack);
        prog->entry[nk - 1].sync = 1;
        *ntb_p = 2;
    }
    prog->kbegin[*ntb_p] = (uint16_t)nk;
    prog->pbegin[*ntb_p] = (uint16_t)np;
}

START_TEST(test_alias_rules)
{
    static struct mscx_program prog;
    static const int want[] = {1, 0, 1, 0, 0, 0};
    for (int v = 0; v <= 5; v++) {
        uint32_t ntb;
        prog_hand_ag(&prog, v, &ntb);
        ck_assert_msg(mscx_gpu_program_alias_ok(&prog, ntb, 8, 256, 0, 256) == want[v], "variant %d: want %d",
                      v, want[v]);
    }
    /* the same program where input and output do not meet (an AllGather of rank 0 would: bytes 0..256) */
    uint32_t ntb;
    prog_hand_ag(&prog, 1, &ntb);
    ck_assert_int_eq(mscx_gpu_program_alias_ok(&prog, ntb, 8, 1024, 0, 256), 1);
    /* a GENERIC entry or an interpreter block: never */
    prog_hand_ag(&prog, 0, &ntb);
    prog.entry[0].kind = MSCX_ENTRY_GENERIC;
    ck_assert_int_eq(mscx_gpu_program_alias_ok(&prog, ntb, 8, 256, 0, 256), 0);
    prog_hand_ag(&prog, 0, &ntb);
    prog.interp_mask = 1;
    ck_assert_int_eq(mscx_gpu_program_alias_ok(&prog, ntb, 8, 256, 0, 256), 0);
}
END_TEST

/* ---- prog_fold_pack: a pack into the rank's own scratch read flat by the reduction ---- */

/* Compile @p rank of @p plan for @p msg bytes (fp32, @p pkt) into c->prog, as runtime/programs.c would. */
static void compile_rank(struct ctx *c, const struct mscx_plan *plan, uint32_t rank, uint64_t msg,
                         enum mscx_pkt_format pkt)
{
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    struct mscx_dev_op *img = malloc((gpu->nops ? gpu->nops : 1) * sizeof(*img));
    ck_assert_ptr_nonnull(img);
    memcpy(img, gpu->ops, gpu->nops * sizeof(*img));
    mscx_gpu_mark_syncs(plan, rank, img);
    memset(c, 0, sizeof(*c));
    c->plan = plan;
    c->rank = rank;
    ck_assert_int_eq(setup(c, msg, MSCX_DT_FP32, pkt), 0);
    ck_assert_int_eq(mscx_gpu_compile(plan, rank, img, c->rb, &c->a, &c->prog), 1);
    free(img);
}

/* Entries of c->prog's block @p b that came from ops of @p opcode and are of @p kind. */
static uint32_t count_kind(const struct ctx *c, uint32_t b, uint32_t opcode, uint32_t kind)
{
    uint32_t n = 0;
    for (uint32_t e = c->prog.kbegin[b]; e < c->prog.kbegin[b + 1]; e++)
        n += c->prog.entry[e].opcode == opcode && c->prog.entry[e].kind == kind;
    return n;
}

/* PACK entries of block @p b that write the rank's own scratch (a cpkt's pack, merged or not). */
static uint32_t own_scratch_packs(const struct ctx *c, uint32_t b)
{
    uint32_t n = 0;
    for (uint32_t e = c->prog.kbegin[b]; e < c->prog.kbegin[b + 1]; e++) {
        const struct mscx_entry *k = &c->prog.entry[e];
        if (k->kind == MSCX_ENTRY_PACK)
            for (uint32_t j = 0; j < k->ndst; j++)
                n += c->prog.opnd[k->opnd + 1 + j].base == MSCX_KB_SCRATCH;
    }
    return n;
}

/*
 * The shipped 8-rank one-shot AllReduce at 1 KB: rank 1 packs its input
 * into its own slot (cpkt) only to fold that slot back in rank order; its
 * reduction reads the input there instead, and the pack is gone (a SKIP,
 * then dropped by prog_compact). Its puts to the 7 peers are one PACK
 * (prog_fuse_pack). Rank 0 has no such pack and keeps its program.
 */
START_TEST(test_fold_pack_oneshot)
{
    struct mscx_plan *plan = NULL;
    char err[MSCX_PLAN_ERR_LEN];
    ck_assert_msg(mscx_plan_load(mscx_test_src("plans/allreduce_n8_rpn8_oneshot_1K_16K.json"), &plan, err,
                                 sizeof(err)) == MSCX_OK,
                  "%s", err);
    struct ctx *c = calloc(1, sizeof(*c));
    ck_assert_ptr_nonnull(c);
    for (int pk = 0; pk < 2; pk++) {
        const enum mscx_pkt_format pkt = pk ? MSCX_PKT_LL8 : MSCX_PKT_LL16;
        compile_rank(c, plan, 1, 1024, pkt);
        const uint32_t ntb = plan->gpus[1].ntb;
        ck_assert_uint_gt(ntb, 0);
        for (uint32_t b = 0; b < ntb; b++) {
            ck_assert_uint_eq(own_scratch_packs(c, b), 0);
            ck_assert_uint_eq(count_kind(c, b, MSCX_OP_COPY_PACKETS, MSCX_ENTRY_SKIP), 0);
            /* the puts to the peers: one PACK with 7 destinations, then the reduction, nothing else */
            ck_assert_uint_eq(c->prog.kbegin[b + 1] - c->prog.kbegin[b], 2);
            const struct mscx_entry *p = &c->prog.entry[c->prog.kbegin[b]], *r = p + 1;
            ck_assert_uint_eq(p->kind, MSCX_ENTRY_PACK);
            ck_assert_uint_eq(p->opcode, MSCX_OP_PUT_PACKETS);
            ck_assert_uint_eq(p->ndst, 7);
            ck_assert_uint_eq(r->kind, MSCX_ENTRY_REDPKT);
            /* src[0] is slot 0's lines (the unpack fused in), src[1] was slot 1: now the input */
            ck_assert_uint_eq(r->lsrc0, 1);
            ck_assert_uint_eq(r->fsrc, 1);
            const struct mscx_entry_opnd *x = &c->prog.opnd[p->opnd], *f = &c->prog.opnd[r->opnd + r->fsrc];
            ck_assert_uint_eq(x->base, MSCX_KB_IN);
            ck_assert_uint_eq(f->base, x->base);
            ck_assert_uint_eq(f->off, x->off);
            /* the one destination is that input, in place */
            ck_assert_uint_eq(r->ndst, 1);
            ck_assert_uint_eq(c->prog.opnd[r->opnd + r->nsrc].off, x->off);
        }
        compile_rank(c, plan, 0, 1024, pkt);
        for (uint32_t b = 0; b < plan->gpus[0].ntb; b++)
            for (uint32_t e = c->prog.kbegin[b]; e < c->prog.kbegin[b + 1]; e++) {
                const struct mscx_entry *k = &c->prog.entry[e];
                ck_assert_uint_ne(k->kind, MSCX_ENTRY_SKIP);
                ck_assert_uint_eq(k->fsrc, 0);
                ck_assert_uint_eq(k->lsrc0, 0);
                ck_assert(k->kind ==
                          (k->opcode == MSCX_OP_PUT_PACKETS ? MSCX_ENTRY_PACK : MSCX_ENTRY_REDPKT));
            }
    }
    /*
     * 1028 bytes (not 16 per rank): a clipped tail leaves some ops to the
     * interpreter, whose bytes the compiler does not know; no pack is read
     * flat then, though the unpack still fuses.
     */
    compile_rank(c, plan, 1, 1028, MSCX_PKT_LL16);
    uint32_t generic = 0;
    for (uint32_t e = 0; e < c->prog.kbegin[plan->gpus[1].ntb]; e++) {
        generic += c->prog.entry[e].kind == MSCX_ENTRY_GENERIC;
        ck_assert_uint_eq(c->prog.entry[e].fsrc, 0);
        if (c->prog.entry[e].opcode == MSCX_OP_COPY_PACKETS)
            ck_assert_uint_ne(c->prog.entry[e].kind, MSCX_ENTRY_SKIP);
    }
    ck_assert_uint_gt(generic, 0);
    free(c);
    mscx_plan_destroy(plan);
}
END_TEST

/*
 * The 2-rank one-shot AllReduce written by hand (one thread block per rank),
 * with @p extra1 added to rank 1's ops after its cpkt and @p extra0 to
 * rank 0's after its ppkt (each "" or one op with a leading comma).
 */
static struct mscx_plan *hand_oneshot(const char *extra0, const char *extra1)
{
    static const char fmt[] =
        "{\"name\": \"hand_oneshot\", \"collective\": \"allreduce\", \"protocol\": \"LL\", \"inplace\": true,"
        " \"reuse_resources\": false, \"num_threads_per_block\": 512, \"use_double_scratch_buffer\": true,"
        " \"buffer_alignment\": 16, \"min_message_size\": 1024, \"max_message_size\": 16384, \"gpus\": ["
        "{\"id\": 0, \"input_chunks\": 1, \"output_chunks\": 1, \"scratch_chunks\": 2,"
        " \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [1]}],"
        " \"remote_buffers\": [{\"rank\": 1, \"type\": \"s\", \"access_channel_types\": [\"memory\"]}],"
        " \"semaphores\": [], \"threadblocks\": [{\"id\": 0, \"ops\": ["
        "{\"name\": \"ppkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}],"
        " \"dst_buff\": [{\"buffer_id\": 0, \"index\": 0, \"size\": 1}], \"channel_type\": \"memory\"}%s,"
        "{\"name\": \"repkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1},"
        " {\"type\": \"s\", \"index\": 1, \"size\": 1}],"
        " \"dst_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}], \"reduce_op\": \"sum\"}],"
        " \"channels\": [{\"channel_type\": \"memory\", \"channel_ids\": [0]}],"
        " \"remote_buffer_refs\": [{\"access_channel_type\": \"memory\", \"remote_buffer_ids\": [0]}]}]},"
        "{\"id\": 1, \"input_chunks\": 1, \"output_chunks\": 1, \"scratch_chunks\": 2,"
        " \"channels\": [{\"channel_type\": \"memory\", \"connected_to\": [0]}],"
        " \"remote_buffers\": [{\"rank\": 0, \"type\": \"s\", \"access_channel_types\": [\"memory\"]}],"
        " \"semaphores\": [], \"threadblocks\": [{\"id\": 0, \"ops\": ["
        "{\"name\": \"ppkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}],"
        " \"dst_buff\": [{\"buffer_id\": 0, \"index\": 1, \"size\": 1}], \"channel_type\": \"memory\"},"
        "{\"name\": \"cpkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}],"
        " \"dst_buff\": [{\"type\": \"s\", \"index\": 1, \"size\": 1}]}%s,"
        "{\"name\": \"upkt\", \"src_buff\": [{\"type\": \"s\", \"index\": 0, \"size\": 1}],"
        " \"dst_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}]},"
        "{\"name\": \"repkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1},"
        " {\"type\": \"s\", \"index\": 1, \"size\": 1}],"
        " \"dst_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}], \"reduce_op\": \"sum\"}],"
        " \"channels\": [{\"channel_type\": \"memory\", \"channel_ids\": [0]}],"
        " \"remote_buffer_refs\": [{\"access_channel_type\": \"memory\", \"remote_buffer_ids\": [0]}]}]}]}";
    char json[8192], err[MSCX_PLAN_ERR_LEN];
    struct mscx_plan *plan = NULL;
    int n = snprintf(json, sizeof(json), fmt, extra0, extra1);
    ck_assert(n > 0 && (size_t)n < sizeof(json));
    ck_assert_msg(mscx_plan_load_buffer(json, (size_t)n, "hand_oneshot", &plan, err, sizeof(err)) == MSCX_OK,
                  "%s", err);
    return plan;
}

/* Rank 1 of @p plan at 1 KB (LL16): 1 when its cpkt's pack was folded into the reduction (read flat). */
static int hand_folded(const struct mscx_plan *plan)
{
    struct ctx *c = calloc(1, sizeof(*c));
    ck_assert_ptr_nonnull(c);
    compile_rank(c, plan, 1, 1024, MSCX_PKT_LL16);
    uint32_t folded = 0;
    for (uint32_t e = 0; e < c->prog.kbegin[plan->gpus[1].ntb]; e++)
        folded += c->prog.entry[e].fsrc != 0;
    /* never one without the other: folded, the cpkt's pack into the own slot is gone */
    ck_assert_uint_eq(folded, !own_scratch_packs(c, 0));
    free(c);
    return folded > 0;
}

START_TEST(test_fold_pack_refused)
{
    static const struct {
        const char *extra0, *extra1; /* added to rank 0's and rank 1's ops (see hand_oneshot) */
        int folded;
    } cases[] = {
        /* the shape as generated: folded (so each refusal below is that change's doing) */
        {"", "", 1},
        /* rank 1 also forwards its slot's packets to the peer (rppkt reads them): the slot must keep them */
        {"",
         ",{\"name\": \"rppkt\", \"src_buff\": [{\"type\": \"s\", \"index\": 1, \"size\": 1}],"
         " \"dst_buff\": [{\"buffer_id\": 0, \"index\": 1, \"size\": 1}], \"channel_type\": \"memory\"}",
         0},
        /* rank 0 reads rank 1's scratch through a memory channel (get): a peer could read the slot */
        {",{\"name\": \"get\", \"src_buff\": [{\"buffer_id\": 0, \"index\": 1, \"size\": 1}],"
         " \"dst_buff\": [{\"type\": \"s\", \"index\": 1, \"size\": 1}], \"channel_type\": \"memory\"}",
         "", 0},
        /* rank 1 overwrites its input between the pack and the reduction: the pack's bytes are gone */
        {"",
         ",{\"name\": \"copy\", \"src_buff\": [{\"type\": \"s\", \"index\": 0, \"size\": 1}],"
         " \"dst_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}]}",
         0},
        /* rank 0 puts packets into rank 1's slot 1 (its ppkt aimed there): a peer writes the lines */
        {",{\"name\": \"ppkt\", \"src_buff\": [{\"type\": \"i\", \"index\": 0, \"size\": 1}],"
         " \"dst_buff\": [{\"buffer_id\": 0, \"index\": 1, \"size\": 1}], \"channel_type\": \"memory\"}",
         "", 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mscx_plan *plan = hand_oneshot(cases[i].extra0, cases[i].extra1);
        ck_assert_msg(hand_folded(plan) == cases[i].folded, "case %zu: folded %d, expected %d", i,
                      hand_folded(plan), cases[i].folded);
        mscx_plan_destroy(plan);
    }
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("launch-compile");
    TCase *tc = mscx_tcase("compile");
    tcase_add_test(tc, test_compile_shipped_plans);
    tcase_add_test(tc, test_packet_program);
    tcase_add_test(tc, test_kernel_variant);
    tcase_add_test(tc, test_split_rules);
    tcase_add_test(tc, test_alias_rules);
    tcase_add_test(tc, test_fold_pack_oneshot);
    tcase_add_test(tc, test_fold_pack_refused);
    suite_add_tcase(s, tc);
    return s;
}
