/* SPDX-License-Identifier: MIT */
/*
 * The GPU launch compiler's programs, run on the host: for every shipped
 * plan and every (size, dtype, operator, packet format) at which every rank's
 * program compiles whole (no GENERIC entry, no interpreter block: what a
 * whole-program kernel runs), emulate the encoded block records (exactly what a
 * kernel stages, see mscx_run_compiled and mscx_entry_run in
 * kernels/exec_ops.cuh) for two consecutive launches (flags 1 and 2, so both
 * scratch halves) and compare every rank's output and input bit for bit with
 * the host reference executor.
 *
 * The emulation: every (rank, block) is a cooperative task with a program
 * counter over its block's entries. An entry runs whole, and only once every
 * packet line it reads carries the launch's flag (LL16: both flag words of
 * the 16-byte line, LL8: the one of the 8-byte line; mscx_dline_read);
 * otherwise the task yields. Tasks are visited round robin until all are done;
 * a sweep without progress is a deadlock and fails with what each task
 * waits for. A rank starts its second launch as soon as its own blocks have
 * finished the first (as a GPU stream would), so ranks run one launch apart
 * and the double-buffered halves matter. Every operand access is checked
 * against its buffer (user buffers, the launch's half of a scratch) and its
 * alignment before it is made. Memory is laid out as runtime/ does for an
 * in-process group: scratch sized by mscx_plan_scratch_size() at the plan's
 * largest message, fixed halves, peer scratch pointers as mscx_compile_rbuf.
 * The entries themselves run in test_launch_emulation_entries.c.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "test_common.h"
#include "test_data.h"
#include "mscx/hostexec.h"
#include "mscx/plan.h"
#include "launch_abi.h"
#include "op_math.h"
#include "plan_model.h"
#include "test_launch_emulation_int.h"

#define MAX_SIZE (1u << 20)

/* Zeroed, 256-byte aligned like cudaMalloc's (operands are checked exactly, not by the allocation's size). */
static void *alloc256(uint64_t bytes)
{
    void *p = aligned_alloc(256, (bytes + 255u) & ~(uint64_t)255u);
    ck_assert_ptr_nonnull(p);
    memset(p, 0, bytes);
    return p;
}

/*
 * Per plan: scratch, op images and remote buffers as runtime/ sets them up
 * (setup_geoms, mscx_exec_add_plan, gpu_plan_finalize for an in-process
 * group: every peer's scratch reachable). @return 0, or -1 when runtime/
 * would refuse the plan (too many geometries).
 */
static int emu_plan_init(struct emu *e, const struct mscx_plan *plan, uint64_t max_msg)
{
    memset(e, 0, sizeof(*e));
    e->plan = plan;
    e->n = plan->nranks;
    ck_assert_uint_le(e->n, MAXR);
    for (uint32_t q = 0; q < e->n; q++)
        for (uint32_t i = 0; i < plan->gpus[q].nops; i++)
            e->reduces |= mscx_opcode_reduces(plan->gpus[q].ops[i].opcode);
    for (uint32_t q = 0; q < e->n; q++) {
        struct rank_st *R = &e->r[q];
        mscx_plan_scratch_size(plan, q, max_msg, &R->scratch_bytes, &R->half);
        R->scratch = R->scratch_bytes ? alloc256(R->scratch_bytes) : NULL;
    }
    for (uint32_t q = 0; q < e->n; q++) {
        struct rank_st *R = &e->r[q];
        const struct mscx_gpu *gpu = &plan->gpus[q];
        R->img = malloc((gpu->nops ? gpu->nops : 1) * sizeof(*R->img));
        R->rb = calloc(gpu->nrbuf ? gpu->nrbuf : 1, sizeof(*R->rb));
        ck_assert(R->img && R->rb);
        memcpy(R->img, gpu->ops, (size_t)gpu->nops * sizeof(*R->img));
        mscx_gpu_mark_syncs(plan, q, R->img);
        R->ngeom = 1;
        R->geom_rank[0] = q;
        for (uint32_t i = 0; i < gpu->nrbuf; i++) {
            uint32_t o = gpu->rbuf[i].rank, c;
            for (c = 0; c < R->ngeom && !mscx_gpu_same_chunks(&plan->gpus[R->geom_rank[c]], &plan->gpus[o]);
                 c++)
                ;
            if (c == R->ngeom) {
                if (R->ngeom == MSCX_GPU_MAX_GEOM)
                    return -1;
                R->geom_rank[R->ngeom++] = o;
            }
            R->rb[i].ptr = gpu->rbuf[i].type == MSCX_BUF_SCRATCH ? e->r[o].scratch : NULL;
            R->rb[i].geom = c;
            R->rb[i].half = plan->double_scratch ? e->r[o].scratch_bytes / 2u : 0;
        }
    }
    return 0;
}

static void emu_plan_fini(struct emu *e)
{
    for (uint32_t q = 0; q < e->n; q++) {
        struct rank_st *R = &e->r[q];
        free(R->scratch);
        free(R->img);
        free(R->rb);
        free(R->rec);
        free(R->alloc);
        for (int l = 0; l < LAUNCHES; l++) {
            free(R->res_out[l]);
            free(R->res_in[l]);
        }
    }
    memset(e, 0, sizeof(*e));
}

/*
 * Compile and encode every rank's program for the current (msg, dt, pkt) as
 * mscx_exec_launch does. @return 1 when every rank's program is whole (what
 * a whole-program kernel runs), 0 otherwise (*why_p says what is left).
 */
static int emu_compile(struct emu *e, const char **why_p)
{
    const struct mscx_plan *plan = e->plan;
    char err[256];
    for (uint32_t q = 0; q < e->n; q++) {
        struct rank_st *R = &e->r[q];
        const struct mscx_gpu *gpu = &plan->gpus[q];
        struct mscx_geom g;
        if (mscx_plan_geom(plan, q, e->in_bytes, e->out_bytes, e->dt, &g, err, sizeof(err)) != MSCX_OK) {
            *why_p = "size not valid";
            return 0;
        }
        ck_assert_msg(g.scratch_bytes <= R->scratch_bytes,
                      "%s: rank %u needs %llu scratch bytes, %llu allocated", e->what, q,
                      (unsigned long long)g.scratch_bytes, (unsigned long long)R->scratch_bytes);
        struct mscx_gpu_args *a = &R->a;
        memset(a, 0, sizeof(*a));
        a->scratch = R->scratch;
        a->scratch_bytes = R->scratch_bytes;
        a->scratch_half = R->half;
        a->in_bytes = g.in_bytes;
        a->out_bytes = g.out_bytes;
        for (uint32_t c = 0; c < R->ngeom; c++) {
            struct mscx_geom h = g;
            if (c > 0 && mscx_plan_geom(plan, R->geom_rank[c], e->in_bytes, e->out_bytes, e->dt, &h, err,
                                        sizeof(err)) != MSCX_OK) {
                *why_p = "size not valid";
                return 0;
            }
            a->geom[c].slot = h.slot;
            a->geom[c].in_chunk = h.in_chunk;
            a->geom[c].out_chunk = h.out_chunk;
        }
        for (uint32_t i = 0; i < gpu->nops; i++) /* runtime/upload.c's setup_geoms: per rank */
            if (mscx_opcode_reduces(gpu->ops[i].opcode))
                a->reduce = 1;
        a->pkt = e->pkt;
        a->dtype = e->dt;
        a->op = e->op;
        if (gpu->ntb == 0)
            continue;
        if (!mscx_gpu_compile(plan, q, R->img, R->rb, a, &R->prog)) {
            *why_p = "program does not fit";
            return 0;
        }
        if (R->prog.interp_mask) {
            *why_p = "interpreter blocks";
            return 0;
        }
        for (uint32_t i = 0; i < R->prog.kbegin[gpu->ntb]; i++)
            if (R->prog.entry[i].kind == MSCX_ENTRY_GENERIC) {
                *why_p = "GENERIC entries";
                return 0;
            }
        size_t cap = 16u * (1u + MSCX_PROGRAM_MAX_OPS + MSCX_PROGRAM_MAX_OPND) * (size_t)gpu->ntb;
        free(R->rec);
        R->rec = malloc(cap);
        ck_assert_ptr_nonnull(R->rec);
        size_t bytes = mscx_gpu_program_encode(&R->prog, gpu->ntb, R->scratch, R->half, R->rec, cap,
                                               &R->stride, &R->kmax, &R->pmax);
        ck_assert_msg(bytes == (size_t)R->stride * gpu->ntb, "%s: rank %u: encoding failed", e->what, q);
    }
    return 1;
}

/*
 * The programs emu_compile made, rewritten for an out-of-place call
 * (mscx_gpu_program_split, as mscx_exec_launch does) and encoded again.
 * @return 1 when every rank's program splits
 */
static int emu_split(struct emu *e)
{
    static struct mscx_program kp2;
    for (uint32_t q = 0; q < e->n; q++) {
        struct rank_st *R = &e->r[q];
        const uint32_t ntb = e->plan->gpus[q].ntb;
        if (ntb == 0)
            continue;
        kp2 = R->prog;
        if (!mscx_gpu_program_split(&kp2, ntb, e->pkt == MSCX_PKT_LL8 ? 4u : 8u, R->a.out_bytes))
            return 0;
        ck_assert_msg(memcmp(&kp2, &R->prog, sizeof(kp2)) != 0, "%s: rank %u: split changed nothing", e->what,
                      q);
        size_t cap = 16u * (1u + MSCX_PROGRAM_MAX_OPS + MSCX_PROGRAM_MAX_OPND) * (size_t)ntb;
        size_t bytes = mscx_gpu_program_encode(&kp2, ntb, R->scratch, R->half, R->rec, cap, &R->stride,
                                               &R->kmax, &R->pmax);
        ck_assert_msg(bytes == (size_t)R->stride * ntb, "%s: rank %u: encoding failed", e->what, q);
    }
    return 1;
}

/* User buffers of every rank, placed as the plan's in-place rule says (the call matches the plan: no
 * staging). */
static int emu_buffers(struct emu *e)
{
    for (uint32_t q = 0; q < e->n; q++) {
        struct rank_st *R = &e->r[q];
        uint64_t in_b = e->in_bytes, out_b = e->out_bytes;
        free(R->alloc);
        R->alloc = alloc256(in_b + out_b + 16);
        if ((!e->plan->inplace || e->split) && !e->alias) {
            R->in = R->alloc;
            R->out = R->alloc + ((in_b + 15u) & ~(uint64_t)15u);
        } else if (e->plan->coll == MSCX_COLL_ALLGATHER) {
            R->out = R->alloc;
            R->in = R->out + q * in_b;
        } else if (e->plan->coll == MSCX_COLL_REDUCESCATTER) {
            R->in = R->alloc;
            R->out = R->in + q * out_b;
        } else {
            R->in = R->out = R->alloc;
        }
        /* mscx_exec_launch runs the program only on 16-byte aligned user pointers */
        if (((uintptr_t)R->in | (uintptr_t)R->out) & 15u)
            return 0;
        for (int l = 0; l < LAUNCHES; l++) {
            free(R->res_out[l]);
            free(R->res_in[l]);
            R->res_out[l] = malloc(out_b + 1);
            R->res_in[l] = malloc(in_b + 1);
            ck_assert(R->res_out[l] && R->res_in[l]);
        }
    }
    return 1;
}

/* ---- the schedule ---- */

static void launch_begin(struct emu *e, uint32_t q)
{
    struct rank_st *R = &e->r[q];
    /* fill as the host executor's callback does: output first, then input (in place: the input wins) */
    mscx_test_data_fill(R->out, e->out_bytes, e->dt, mscx_test_data_seed(q, R->launch, 1),
                        MSCX_TEST_DATA_SPREAD);
    mscx_test_data_fill(R->in, e->in_bytes, e->dt, mscx_test_data_seed(q, R->launch, 0),
                        MSCX_TEST_DATA_SPREAD);
    R->flag = mscx_flag_next(R->launch == 0 ? 0u : R->flag);
    R->left = e->plan->gpus[q].ntb;
    memset(R->pc, 0, sizeof(R->pc));
}

static void launch_end(struct emu *e, uint32_t q)
{
    struct rank_st *R = &e->r[q];
    memcpy(R->res_out[R->launch], R->out, e->out_bytes);
    memcpy(R->res_in[R->launch], R->in, e->in_bytes);
    if (++R->launch < LAUNCHES) {
        for (uint32_t p = 0; p < e->n; p++)
            if (e->r[p].launch < R->launch) { /* a peer is still in the launch this rank just finished */
                e->skewed++;
                break;
            }
        launch_begin(e, q);
    }
}

/*
 * One visit of task (q, b): run its next entry if what it reads is there.
 * @return 1 when it made progress.
 */
static int task_step(struct emu *e, uint32_t q, uint32_t b, char *wait, size_t wlen)
{
    struct rank_st *R = &e->r[q];
    const struct mscx_record_head *h = (const struct mscx_record_head *)(R->rec + (size_t)R->stride * b);
    if (R->launch >= LAUNCHES || R->pc[b] > h->nk)
        return 0;
    if (R->pc[b] == h->nk) { /* finished this launch */
        R->pc[b]++;
        if (--R->left == 0)
            launch_end(e, q);
        return 1;
    }
    const struct mscx_entry *entries = (const struct mscx_entry *)(R->rec + (size_t)R->stride * b + 16u);
    struct loc L = {q, b, R->pc[b], &entries[R->pc[b]]};
    struct opnd P[2 * MSCX_MAX_OPERANDS];
    uint8_t is_line[2 * MSCX_MAX_OPERANDS];
    if ((uint32_t)L.k->nsrc + L.k->ndst > 2 * MSCX_MAX_OPERANDS)
        emu_fail(e, &L, "%u operands", L.k->nsrc + L.k->ndst);
    entry_operands(e, &L, P, is_line);
    if (!entry_ready(e, &L, P, is_line, wait, wlen))
        return 0;
    entry_run(e, &L, P);
    R->pc[b]++;
    return 1;
}

/* Run both launches of every rank; rotate the visiting order each sweep so that ranks drift apart. */
static void emu_run(struct emu *e, uint32_t seed)
{
    uint32_t ntask = 0, tq[MAXR * MSCX_PROGRAM_MAX_BLOCKS], tb[MAXR * MSCX_PROGRAM_MAX_BLOCKS];
    for (uint32_t q = 0; q < e->n; q++) {
        struct rank_st *R = &e->r[q];
        if (R->scratch)
            memset(R->scratch, 0, R->scratch_bytes);
        R->launch = 0;
        launch_begin(e, q);
        for (uint32_t b = 0; b < e->plan->gpus[q].ntb; b++) {
            tq[ntask] = q;
            tb[ntask++] = b;
        }
        if (e->plan->gpus[q].ntb == 0) /* nothing runs: the launches only see their buffers */
            for (int l = 0; l < LAUNCHES; l++)
                launch_end(e, q);
    }
    char wait[160];
    for (uint64_t sweep = 0;; sweep++) {
        int progress = 0, busy = 0;
        /* a stride coprime to ntask: every task once per sweep, in an order that changes */
        uint32_t stride = 1;
        if (ntask > 1)
            for (stride = (uint32_t)(mscx_test_data_mix(MSCX_TEST_DATA_SPREAD, seed + sweep) % ntask) | 1u;
                 stride > 1; stride -= 2) {
                uint32_t x = ntask, y = stride;
                while (y) {
                    uint32_t t = x % y;
                    x = y;
                    y = t;
                }
                if (x == 1)
                    break;
            }
        for (uint32_t i = 0; i < ntask; i++) {
            uint32_t t = (uint32_t)((sweep + (uint64_t)i * stride) % ntask);
            progress |= task_step(e, tq[t], tb[t], wait, sizeof(wait));
        }
        for (uint32_t q = 0; q < e->n; q++)
            busy |= e->r[q].launch < LAUNCHES;
        if (!busy)
            return;
        if (progress)
            continue;
        /* deadlock: say what every blocked task waits for */
        char msg[1024];
        size_t m = 0;
        for (uint32_t t = 0; t < ntask && m < sizeof(msg) - 200; t++) {
            const struct rank_st *R = &e->r[tq[t]];
            const struct mscx_record_head *h =
                (const struct mscx_record_head *)(R->rec + (size_t)R->stride * tb[t]);
            if (R->launch >= LAUNCHES || R->pc[tb[t]] >= h->nk)
                continue;
            task_step(e, tq[t], tb[t], wait, sizeof(wait));
            const struct mscx_entry *k =
                (const struct mscx_entry *)(R->rec + (size_t)R->stride * tb[t] + 16u) + R->pc[tb[t]];
            m += (size_t)snprintf(msg + m, sizeof(msg) - m,
                                  "\n  rank %u launch %u block %u entry %u (op %u %s, %s): %s", tq[t],
                                  R->launch + 1, tb[t], R->pc[tb[t]], k->op,
                                  mscx_opcode_name((enum mscx_opcode)k->opcode), kind_name(k->kind), wait);
        }
        ck_abort_msg("%s: deadlock: no task can run after %llu sweeps:%s", e->what, (unsigned long long)sweep,
                     msg);
    }
}

/* ---- the comparison with the host reference ---- */

static void compare(const struct emu *e, const struct mscx_test_ref *c)
{
    for (uint32_t l = 0; l < LAUNCHES; l++)
        for (uint32_t q = 0; q < e->n; q++) {
            const struct rank_st *R = &e->r[q];
            for (int which = 0; which < (e->alias ? 1 : 2); which++) { /* aliased: the input is output */
                const uint8_t *got = which ? R->res_in[l] : R->res_out[l],
                              *want = which ? mscx_test_ref_in(c, l, q) : mscx_test_ref_out(c, l, q);
                uint64_t nb = which ? e->in_bytes : e->out_bytes, at = 0;
                uint8_t *orig = NULL;
                if (which && e->split) { /* the send buffer of an out-of-place call keeps its bytes */
                    orig = malloc(nb + 1);
                    ck_assert_ptr_nonnull(orig);
                    mscx_test_data_fill(orig, nb, e->dt, mscx_test_data_seed(q, l, 0), MSCX_TEST_DATA_SPREAD);
                    want = orig;
                }
                at = mscx_test_data_diff(got, want, nb);
                if (at == nb) {
                    free(orig);
                    continue;
                }
                uint32_t g4 = 0, w4 = 0;
                memcpy(&g4, got + (at & ~(uint64_t)3), at + 4 <= nb ? 4 : 0);
                memcpy(&w4, want + (at & ~(uint64_t)3), at + 4 <= nb ? 4 : 0);
                ck_abort_msg(
                    "%s%s%s: rank %u launch %u: %s differs from the host executor's at byte %llu of %llu "
                    "(word %#010x, host %#010x)",
                    e->what, e->split ? " (out-of-place, split program)" : "",
                    e->alias ? " (in place on aliased buffers)" : "", q, l + 1, which ? "input" : "output",
                    (unsigned long long)at, (unsigned long long)nb, g4, w4);
            }
        }
}

/* ---- the test ---- */

struct stats {
    uint64_t cases, emulated, ranks, launches, entries, units, not_whole, skewed, split, nosplit, alias,
        noalias;
    uint64_t fsrc; /* of entries: reductions that read a fused pack's source flat */
};

/*
 * One (size, dtype, op, pkt) of a plan. @return 1 when emulated and
 * compared, 0 when some rank's program is not whole at this shape.
 */
static int run_case(struct emu *e, uint64_t msg, enum mscx_dtype dt, enum mscx_redop op,
                    enum mscx_pkt_format pkt, struct stats *st, const char **why_p)
{
    char err[512];
    e->msg = msg;
    e->dt = dt;
    e->op = op;
    e->pkt = pkt;
    mscx_coll_sizes(e->plan->coll, e->n, msg, &e->in_bytes, &e->out_bytes);
    snprintf(e->what, sizeof(e->what), "plan %s, %llu bytes %s %s %s", e->plan->name, (unsigned long long)msg,
             mscx_dtype_name(dt), e->reduces ? mscx_redop_name(op) : "copy",
             pkt == MSCX_PKT_LL8 ? "ll8" : "ll16");
    st->cases++;
    if (!emu_compile(e, why_p))
        return 0;
    if (!emu_buffers(e)) {
        *why_p = "user buffers not 16-byte aligned";
        return 0;
    }
    struct mscx_test_ref c;
    struct mscx_hostexec_cfg cfg = {e->in_bytes, e->out_bytes, dt, op, pkt, LAUNCHES, 0, 0, NULL, NULL, NULL};
    mscx_status_t rs = mscx_test_ref_run(e->plan, &cfg, MSCX_TEST_DATA_SPREAD, &c, err, sizeof(err));
    ck_assert_msg(rs == MSCX_OK, "%s: host executor: %s", e->what, err);
    uint64_t ent0 = e->entries_run, un0 = e->units_run, sk0 = e->skewed, fs0 = e->fsrc_run;
    emu_run(e, (uint32_t)(msg * 31u + dt * 7u + op * 3u + pkt));
    compare(e, &c);
    /* the same call out of place, as mscx_exec_launch runs it on an in-place AllReduce plan: split programs
     */
    if (e->plan->inplace && e->plan->coll == MSCX_COLL_ALLREDUCE) {
        e->split = 1;
        if (emu_split(e)) {
            ck_assert(emu_buffers(e));
            emu_run(e, (uint32_t)(msg * 17u + dt * 5u + op * 11u + pkt + 1u));
            compare(e, &c);
            st->split++;
        } else {
            st->nosplit++;
            e->nosplit++;
        }
        e->split = 0;
    }
    /* an in-place call on an out-of-place plan: where mscx_gpu_program_alias_ok allows, the programs run as
     * they are */
    if (!e->plan->inplace && e->plan->coll != MSCX_COLL_TEST) {
        int ok = 1;
        for (uint32_t q = 0; q < e->n && ok; q++) {
            const uint32_t ntb = e->plan->gpus[q].ntb;
            uint64_t in_at = e->plan->coll == MSCX_COLL_ALLGATHER ? q * e->in_bytes : 0;
            uint64_t out_at = e->plan->coll == MSCX_COLL_REDUCESCATTER ? q * e->out_bytes : 0;
            ok = ntb == 0 || mscx_gpu_program_alias_ok(&e->r[q].prog, ntb, e->pkt == MSCX_PKT_LL8 ? 4u : 8u,
                                                       in_at, out_at, e->in_bytes);
        }
        if (ok) {
            e->alias = 1;
            ck_assert(emu_buffers(e));
            emu_run(e, (uint32_t)(msg * 13u + dt * 3u + op * 7u + pkt + 2u));
            compare(e, &c);
            e->alias = 0;
            st->alias++;
        } else {
            st->noalias++;
            e->noalias++;
        }
    }
    mscx_test_ref_fini(&c);
    st->emulated++;
    st->ranks += e->n;
    st->launches += (uint64_t)e->n * LAUNCHES;
    st->entries += e->entries_run - ent0;
    st->units += e->units_run - un0;
    st->skewed += e->skewed - sk0;
    st->fsrc += e->fsrc_run - fs0;
    return 1;
}

/* One-node AllReduce one-shot or two-phase of 2, 4 or 8 ranks: its bit in the coverage mask, or -1. */
static int compiled_allreduce_bit(const struct mscx_plan *plan)
{
    int kind = strstr(plan->name, "oneshot") ? 0 : strstr(plan->name, "twophase") ? 1 : -1;
    int lg = plan->nranks == 2 ? 0 : plan->nranks == 4 ? 1 : plan->nranks == 8 ? 2 : -1;
    if (plan->coll != MSCX_COLL_ALLREDUCE || plan->ranks_per_node != plan->nranks || kind < 0 || lg < 0)
        return -1;
    return lg * 2 + kind;
}

START_TEST(test_program_emulate_shipped_plans)
{
    struct mscx_test_plans it;
    mscx_test_plans_begin(&it);
    ck_assert_uint_gt(it.n, 30);
    struct stats st = {0};
    uint32_t nqual = 0, compiled_mask = 0;
    struct emu *e = calloc(1, sizeof(*e));
    ck_assert_ptr_nonnull(e);
    for (struct mscx_plan *plan; (plan = mscx_test_plans_next(&it)) != NULL;) {
        char err[1024];
        uint64_t mn, mx;
        mscx_plan_size_range(plan, &mn, &mx);
        if (mx > MAX_SIZE)
            mx = MAX_SIZE;
        if (plan->nranks > MAXR || mscx_plan_executable(plan, err, sizeof(err)) != MSCX_OK ||
            emu_plan_init(e, plan, mx) != 0) {
            printf("  %-40s not run by the GPU executor here\n", plan->name);
            emu_plan_fini(e);
            continue;
        }
        /*
         * Sizes: the range ends (the low end rounded up to 16 bytes, and to
         * 16 bytes per input chunk (at least one chunk per rank), where the
         * chunks have no clipped tail), an odd multiple of that inside, and
         * one inside that is not a multiple of 16 bytes (its clipped tail
         * leaves ops to the interpreter: reported, not emulated). The
         * two-phase rows8 plan has 8 chunks per rank: 1 KB at 8 ranks.
         */
        const uint32_t nchunks =
            plan->gpus[0].input_chunks > plan->nranks ? plan->gpus[0].input_chunks : plan->nranks;
        const uint64_t g = 16u * nchunks, mid = (mn + mx) / 2u;
        const uint64_t sizes[] = {(mn + 15u) / 16u * 16u, (mn + g - 1u) / g * g, (mid / g | 1u) * g,
                                  mid / 16u * 16u + 4u, mx / 16u * 16u};
        int bit = compiled_allreduce_bit(plan);
        uint64_t whole = 0;
        e->nosplit = 0;
        e->noalias = 0;
        const char *why = NULL;
        char line[512] = "";
        size_t ll = 0;
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            int dup = 0;
            for (size_t t = 0; t < s; t++)
                dup |= sizes[t] == sizes[s];
            if (dup || sizes[s] < mn || sizes[s] > mx)
                continue;
            uint32_t tried = 0, ok = 0;
            const char *why_s = NULL;
            for (int dti = 0; dti < 2; dti++)
                for (int opi = 0; opi < (e->reduces ? 2 : 1); opi++)
                    for (int pk = 0; pk < 2; pk++) {
                        enum mscx_dtype dt = dti ? MSCX_DT_FP16 : MSCX_DT_FP32;
                        struct mscx_geom geo;
                        uint64_t in_b, out_b;
                        mscx_coll_sizes(plan->coll, plan->nranks, sizes[s], &in_b, &out_b);
                        if (mscx_plan_geom(plan, 0, in_b, out_b, dt, &geo, err, sizeof(err)) != MSCX_OK)
                            continue;
                        tried++;
                        const char *w = NULL;
                        if (run_case(e, sizes[s], dt, opi ? MSCX_REDOP_MAX : MSCX_REDOP_SUM,
                                     pk ? MSCX_PKT_LL8 : MSCX_PKT_LL16, &st, &w)) {
                            ok++;
                        } else {
                            st.not_whole++;
                            why = why_s = w;
                        }
                    }
            whole += ok;
            if (tried && ll < sizeof(line))
                ll += (size_t)snprintf(line + ll, sizeof(line) - ll, " %llu:%u/%u",
                                       (unsigned long long)sizes[s], ok, tried);
            /* the whole-program kernels' plans: where every chunk is a multiple of 16 bytes, nothing is left
             */
            if (bit >= 0 && sizes[s] % g == 0) {
                ck_assert_msg(e->nosplit == 0,
                              "plan %s, %llu bytes: the program does not split for "
                              "out-of-place calls",
                              plan->name, (unsigned long long)sizes[s]);
                ck_assert_msg(tried > 0 && ok == tried,
                              "plan %s, %llu bytes: %u of %u shapes not compiled whole (last: %s)",
                              plan->name, (unsigned long long)sizes[s], tried - ok, tried,
                              why_s ? why_s : "-");
            }
        }
        if (whole) {
            nqual++;
            if (bit >= 0)
                compiled_mask |= 1u << bit;
        }
        printf("  %-40s %s%s%s%s\n", plan->name, whole ? "emulated, size:whole/shapes" : "not whole anywhere",
               line, why ? "; not whole: " : "", why ? why : "");
        emu_plan_fini(e);
    }
    free(e);
    printf(
        "gpu program emulation: %u of %zu plans have whole programs; %llu shapes emulated (%llu not whole: "
        "interpreter), %llu rank programs, %llu launches (%llu started while a peer was a launch behind), "
        "%llu entries (%llu reductions reading a fused pack's source flat), %llu units: outputs and inputs "
        "bit-identical to the host executor's; out-of-place calls "
        "on in-place AllReduce plans: %llu shapes split and emulated, %llu not split (staging); in-place "
        "calls on "
        "out-of-place plans: %llu shapes emulated on aliased buffers, %llu staged\n",
        nqual, it.n, (unsigned long long)st.emulated, (unsigned long long)st.not_whole,
        (unsigned long long)st.ranks, (unsigned long long)st.launches, (unsigned long long)st.skewed,
        (unsigned long long)st.entries, (unsigned long long)st.fsrc, (unsigned long long)st.units,
        (unsigned long long)st.split, (unsigned long long)st.nosplit, (unsigned long long)st.alias,
        (unsigned long long)st.noalias);
    /* the one-node AllReduce one-shot and two-phase plans of 2, 4 and 8 ranks are all among them */
    ck_assert_msg(compiled_mask == 0x3fu, "one-node AllReduce one-shot/two-phase coverage %#x, want 0x3f",
                  compiled_mask);
    ck_assert_uint_gt(st.skewed, 0);
    /* the one-shot plans' ranks after 0 read their own input flat in the reduction (prog_fold_pack) */
    ck_assert_uint_gt(st.fsrc, 0);
    ck_assert_uint_gt(st.split, 0);
    ck_assert_uint_gt(st.alias, 0);
}
END_TEST

Suite *mscx_test_suite(void)
{
    Suite *s = suite_create("launch-emulation");
    TCase *tc = mscx_tcase("emulate");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_program_emulate_shipped_plans);
    suite_add_tcase(s, tc);
    return s;
}
