/* SPDX-License-Identifier: MIT */
/*
 * The generator's two-phase AllReduce with whole sub-chunks per block
 * (mscx-plangen --blocks G --layout rows|cols): the rows layout with G = N
 * is the MSCCL++ DSL's allreduce_pkt op for op, the cols layout keeps each
 * block on a column of its own, and both compute the allreduce on the host
 * executor at even and uneven sizes (a misplaced unpack is caught).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "test_common.h"
#include "mscx/plan.h"
#include "mscx/sim.h"
#include "plan_model.h"
#include "test_plans_int.h"

static struct mscx_plan *plangen_load(const char *args)
{
    char err[MSCX_PLAN_ERR_LEN];
    char *path = run_plangen(args, "split");
    struct mscx_plan *plan = NULL;
    ck_assert_msg(mscx_plan_load(path, &plan, err, sizeof(err)) == MSCX_OK, "%s: %s", args, err);
    unlink(path);
    free(path);
    return plan;
}

/* An operand as (owner rank, buffer type, index, size), whoever's table names it. */
struct opnd_key {
    uint32_t rank, type, index, size;
};

static struct opnd_key opnd_key(const struct mscx_plan *p, uint32_t r, const struct mscx_dev_operand *o)
{
    struct opnd_key k = {r, o->type, o->index, o->size};
    if (o->flags & MSCX_OPND_REMOTE) {
        k.rank = p->gpus[r].rbuf[o->rbuf].rank;
        k.type = p->gpus[r].rbuf[o->rbuf].type;
    }
    return k;
}

static int cmp_key(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct opnd_key));
}

/*
 * With G = N blocks and the rows layout, the generator writes the MSCCL++
 * DSL's allreduce_pkt: per rank and block the same ops (after fusion) on
 * the same chunks of the same ranks' buffers. Only the order of a fused
 * op's remote destinations may differ (the DSL lists them in its own order).
 */
START_TEST(test_plangen_rows_is_dsl_allreduce_pkt)
{
    static const uint32_t ranks[] = {2, 4, 8};
    for (size_t i = 0; i < sizeof(ranks) / sizeof(ranks[0]); i++) {
        uint32_t N = ranks[i];
        char args[256], rel[128], err[MSCX_PLAN_ERR_LEN];
        snprintf(args, sizeof(args), "--coll allreduce --algo twophase --ranks %u --blocks %u --layout rows",
                 N, N);
        struct mscx_plan *ours = plangen_load(args), *dsl = NULL;
        snprintf(rel, sizeof(rel), "mscclpp-algo-plans/allreduce_pkt_n%u.json", N);
        ck_assert_msg(mscx_plan_load(mscx_test_ref(rel), &dsl, err, sizeof(err)) == MSCX_OK, "%s: %s", rel,
                      err);
        ck_assert_uint_eq(ours->nranks, dsl->nranks);
        for (uint32_t r = 0; r < N; r++) {
            const struct mscx_gpu *a = &ours->gpus[r], *b = &dsl->gpus[r];
            ck_assert_uint_eq(a->input_chunks, b->input_chunks);
            ck_assert_uint_eq(a->scratch_chunks, b->scratch_chunks);
            ck_assert_uint_eq(a->ntb, b->ntb);
            for (uint32_t t = 0; t < a->ntb; t++) {
                ck_assert_msg(a->tb[t].nops == b->tb[t].nops, "n%u rank %u block %u: %u ops, the DSL %u", N,
                              r, t, a->tb[t].nops, b->tb[t].nops);
                for (uint32_t k = 0; k < a->tb[t].nops; k++) {
                    const struct mscx_dev_op *x = &a->ops[a->tb[t].op_begin + k],
                                             *y = &b->ops[b->tb[t].op_begin + k];
                    ck_assert_msg(x->opcode == y->opcode && x->nsrc == y->nsrc && x->ndst == y->ndst &&
                                      x->tbg_size == y->tbg_size,
                                  "n%u rank %u block %u op %u: %s/%u/%u, the DSL %s/%u/%u", N, r, t, k,
                                  mscx_opcode_name(x->opcode), x->nsrc, x->ndst, mscx_opcode_name(y->opcode),
                                  y->nsrc, y->ndst);
                    for (uint32_t j = 0; j < x->nsrc; j++) {
                        struct opnd_key kx = opnd_key(ours, r, &x->src[j]), ky = opnd_key(dsl, r, &y->src[j]);
                        ck_assert_msg(cmp_key(&kx, &ky) == 0, "n%u rank %u block %u op %u: source %u differs",
                                      N, r, t, k, j);
                    }
                    struct opnd_key dx[MSCX_MAX_OPERANDS], dy[MSCX_MAX_OPERANDS];
                    for (uint32_t j = 0; j < x->ndst; j++) {
                        dx[j] = opnd_key(ours, r, &x->dst[j]);
                        dy[j] = opnd_key(dsl, r, &y->dst[j]);
                    }
                    ck_assert_msg(cmp_key(&dx[0], &dy[0]) == 0, "n%u rank %u block %u op %u: dst 0", N, r, t,
                                  k);
                    if (x->opcode == MSCX_OP_REDUCE_SEND_PACKETS) { /* remote destinations: any order */
                        qsort(dx + 1, x->ndst - 1u, sizeof(dx[0]), cmp_key);
                        qsort(dy + 1, y->ndst - 1u, sizeof(dy[0]), cmp_key);
                    }
                    for (uint32_t j = 1; j < x->ndst; j++)
                        ck_assert_msg(cmp_key(&dx[j], &dy[j]) == 0,
                                      "n%u rank %u block %u op %u: destination %u", N, r, t, k, j);
                }
            }
        }
        mscx_plan_destroy(dsl);
        mscx_plan_destroy(ours);
    }
}
END_TEST

/*
 * The cols layout: block b of every rank works on column b alone (input
 * chunks [b*N, (b+1)*N)), so after fusion each block holds one ppkt to the
 * N-1 peers, one respkt of its own chunk (N-1 packet sources, N-1 remote
 * destinations) and the unpacks of the peers' results; no op is sliced.
 */
START_TEST(test_plangen_cols_shape)
{
    static const struct {
        uint32_t n, g;
    } cfg[] = {{8, 8}, {4, 3}, {2, 5}};
    for (size_t i = 0; i < sizeof(cfg) / sizeof(cfg[0]); i++) {
        const uint32_t N = cfg[i].n, G = cfg[i].g;
        char args[256];
        snprintf(args, sizeof(args), "--coll allreduce --algo twophase --ranks %u --blocks %u --layout cols",
                 N, G);
        struct mscx_plan *p = plangen_load(args);
        char want[96];
        snprintf(want, sizeof(want), "allreduce_n%u_rpn%u_twophase_cols%u_1K_1M", N, N, G);
        ck_assert_str_eq(mscx_plan_name(p), want);
        for (uint32_t r = 0; r < N; r++) {
            const struct mscx_gpu *gp = &p->gpus[r];
            ck_assert_uint_eq(gp->ntb, G);
            ck_assert_uint_eq(gp->input_chunks, N * G);
            ck_assert_uint_eq(gp->scratch_chunks, 2 * (N - 1) * G);
            for (uint32_t b = 0; b < G; b++) {
                const struct mscx_tb *tb = &gp->tb[b];
                uint32_t nupkt = 0, unpacked = 0;
                ck_assert_uint_ge(tb->nops, 3);
                const struct mscx_dev_op *put = &gp->ops[tb->op_begin], *red = put + 1;
                ck_assert_int_eq(put->opcode, MSCX_OP_PUT_PACKETS);
                ck_assert_uint_eq(put->ndst, N - 1);
                ck_assert_int_eq(red->opcode, MSCX_OP_REDUCE_SEND_PACKETS);
                ck_assert_uint_eq(red->nsrc, N);
                ck_assert_uint_eq(red->ndst, N);
                ck_assert_uint_eq(red->src[0].index, b * N + r);
                for (uint32_t k = 0; k < tb->nops; k++) {
                    const struct mscx_dev_op *op = &gp->ops[tb->op_begin + k];
                    ck_assert_uint_eq(op->tbg_size, 1);
                    for (uint32_t j = 0; j < op->nsrc + op->ndst; j++) {
                        const struct mscx_dev_operand *o =
                            j < op->nsrc ? &op->src[j] : &op->dst[j - op->nsrc];
                        if (!(o->flags & MSCX_OPND_REMOTE) && o->type == MSCX_BUF_INPUT)
                            ck_assert_msg(o->index >= b * N && o->index + o->size <= (b + 1) * N,
                                          "%s rank %u block %u op %u: input chunks %u+%u outside its column",
                                          want, r, b, k, o->index, o->size);
                    }
                    if (k >= 2) {
                        ck_assert_int_eq(op->opcode, MSCX_OP_UNPACK_PACKETS);
                        nupkt++;
                        unpacked += op->dst[0].size;
                    }
                }
                ck_assert_uint_eq(unpacked, N - 1);
                ck_assert_uint_eq(nupkt, (r == 0 || r == N - 1) ? 1 : 2);
            }
        }
        mscx_plan_destroy(p);
    }
}
END_TEST

/*
 * Both layouts compute the allreduce, bit-identical on every rank, at sizes
 * that split evenly and unevenly over the N * G chunks, for every datatype
 * and operator they claim (sampled), with both packet formats; and the check
 * is not vacuous: one misplaced unpack on one rank fails it.
 */
START_TEST(test_plangen_twophase_split_sim)
{
    static const char *const args[] = {
        "--coll allreduce --algo twophase --ranks 8 --blocks 8 --layout rows --min-size 64K+1 --max-size 1M",
        "--coll allreduce --algo twophase --ranks 8 --blocks 8 --layout cols --min-size 64K+1 --max-size 1M",
        "--coll allreduce --algo twophase --ranks 4 --blocks 12 --layout cols --min-size 16K+1 --max-size 1M",
        "--coll allreduce --algo twophase --ranks 4 --blocks 3 --layout rows --min-size 1K --max-size 1M",
        "--coll allreduce --algo twophase --ranks 2 --blocks 5 --layout cols --min-size 1K --max-size 256K",
    };
    uint32_t ncase = 0;
    for (size_t i = 0; i < sizeof(args) / sizeof(args[0]); i++) {
        struct mscx_plan *p = plangen_load(args[i]);
        uint64_t lo, hi;
        mscx_plan_size_range(p, &lo, &hi);
        uint32_t chunks = p->gpus[0].input_chunks;
        for (int dt = 0; dt < MSCX_DT_COUNT; dt++) {
            for (int op = 0; op < MSCX_REDOP_COUNT; op++) {
                if (!mscx_plan_supports(p, (enum mscx_dtype)dt, (enum mscx_redop)op) ||
                    (dt + op + (int)i) % 3)
                    continue;
                uint64_t u = mscx_dtype_size((enum mscx_dtype)dt);
                /* the low end, an element count off the chunk grid, and the top */
                uint64_t sizes[] = {round_up(lo, u), (round_up(lo, u) / u + chunks / 2 + 1) * u, hi / u * u};
                for (size_t s = 0; s < 3; s++) {
                    ck_assert(sizes[s] >= lo && sizes[s] <= hi);
                    sim_one(p, sizes[s], (enum mscx_dtype)dt, (enum mscx_redop)op,
                            (s + (size_t)dt) % 2 ? MSCX_PKT_LL8 : MSCX_PKT_LL16, 11 + (uint32_t)s);
                    ncase++;
                }
            }
        }
        /* fp32 sum on both formats at an uneven size (the cross-rank check runs on it) */
        uint64_t odd = (round_up(lo, 4) / 4 + 2 * chunks + 3) * 4;
        sim_one(p, odd, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL16, 21);
        sim_one(p, odd, MSCX_DT_FP32, MSCX_REDOP_SUM, MSCX_PKT_LL8, 22);
        ncase += 2;

        /* move one unpack of the last rank one chunk over: the definition check must fail */
        struct mscx_gpu *g = &p->gpus[p->nranks - 1];
        uint32_t moved = 0;
        for (uint32_t k = 0; k < g->nops && !moved; k++) {
            struct mscx_dev_op *o = &g->ops[k];
            if (o->opcode == MSCX_OP_UNPACK_PACKETS && o->dst[0].index > 0) {
                o->dst[0].index--;
                moved = 1;
            }
        }
        ck_assert_uint_eq(moved, 1);
        struct mscx_sim_case c = {.msg_bytes = round_up(lo, 4) * 2 <= hi ? round_up(lo, 4) * 2 : hi / 4 * 4,
                                  .dtype = MSCX_DT_INT32,
                                  .op = MSCX_REDOP_SUM,
                                  .pkt = MSCX_PKT_LL16,
                                  .iters = 1,
                                  .seed = 5};
        struct mscx_sim_result res;
        memset(&res, 0, sizeof(res));
        ck_assert_int_eq(mscx_sim_check(p, &c, &res), MSCX_OK);
        ck_assert_msg(!res.pass, "%s: a misplaced unpack was not caught", args[i]);
        mscx_plan_destroy(p);
    }
    ck_assert_uint_gt(ncase, 30);
}
END_TEST

void plans_add_twophase_layout_tests(TCase *tc)
{
    tcase_add_test(tc, test_plangen_rows_is_dsl_allreduce_pkt);
    tcase_add_test(tc, test_plangen_cols_shape);
    tcase_add_test(tc, test_plangen_twophase_split_sim);
}
