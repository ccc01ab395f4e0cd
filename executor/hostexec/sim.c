/* SPDX-License-Identifier: MIT */
/*
 * Checked simulation: deterministic exact inputs, the host executor, and a
 * bit-for-bit comparison with the collective's definition. "test" plans (and
 * collectives without a definition here) are run twice with different thread
 * schedules and the final buffers of both runs must agree. Reducing
 * collectives always get exact inputs (whatever the plan's ops); float
 * allreduce cases then run once more with rounding-sensitive inputs and
 * every rank's output must equal rank 0's.
 *
 * Packet lines that a test plan reads but no operation of the plan produces
 * (the DSL's one-op demonstrations) are seeded before each launch with exact
 * values and the launch flag, as an external producer would.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hostexec_int.h"
#include "mscx/log.h"
#include "mscx/sim.h"
#include "op_math.h"

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t elem_hash(uint32_t seed, uint32_t rank, uint32_t iter, uint64_t salt, uint64_t e)
{
    return mix64(mix64(mix64(((uint64_t)seed << 32) ^ rank) ^ ((uint64_t)iter << 40) ^ salt) ^ e);
}

static void put_float(enum mscx_dtype dt, float f, uint8_t *p)
{
    if (dt == MSCX_DT_FP32) {
        uint32_t u = mscx_f32_bits(f);
        memcpy(p, &u, 4);
    } else {
        uint16_t h = dt == MSCX_DT_FP16 ? mscx_f32_to_f16(f) : mscx_f32_to_bf16(f);
        memcpy(p, &h, 2);
    }
}

/*
 * One element. Sums: small integers, |v| * 16 exact in the type (fp16 64,
 * bf16 8, fp32 1024; integers wrap). Products: floats in {1, -1, 2} on even
 * ranks and {1, -1, 1/2} on odd ones (partial products stay within 2^+-8),
 * small integers for ints. Min/max: integers in [-64, 64].
 */
static void elem_value(enum mscx_dtype dt, enum mscx_redop op, uint32_t rank, uint64_t h, uint8_t *p)
{
    uint32_t esize = mscx_dtype_size(dt);
    bool is_float = dt == MSCX_DT_FP32 || dt == MSCX_DT_FP16 || dt == MSCX_DT_BF16;
    if (!(MSCX_DT_REDUCIBLE_MASK & (1u << dt))) {
        for (uint32_t i = 0; i < esize; i++)
            p[i] = (uint8_t)(h >> (8 * (i % 8)));
        return;
    }
    if (is_float) {
        float f;
        if (op == MSCX_REDOP_PROD) {
            static const float even[3] = {1.0f, -1.0f, 2.0f}, odd[3] = {1.0f, -1.0f, 0.5f};
            f = (rank & 1) ? odd[h % 3] : even[h % 3];
        } else if (op == MSCX_REDOP_SUM) {
            int32_t lim = dt == MSCX_DT_FP32 ? 1024 : dt == MSCX_DT_FP16 ? 64 : 8;
            f = (float)((int32_t)(h % (uint64_t)(2 * lim + 1)) - lim);
        } else {
            f = (float)((int32_t)(h % 129) - 64);
        }
        put_float(dt, f, p);
        return;
    }
    uint32_t u;
    if (op == MSCX_REDOP_SUM)
        u = (uint32_t)h;
    else if (op == MSCX_REDOP_PROD)
        u = dt == MSCX_DT_INT32 ? (uint32_t)((int32_t)(h % 7) - 3) : (uint32_t)(h % 6);
    else
        u = dt == MSCX_DT_INT32 ? (uint32_t)((int32_t)(h % 129) - 64) : (uint32_t)(h % 129);
    memcpy(p, &u, 4);
}

/*
 * Rounding-sensitive floating-point values for the cross-rank check: a
 * normal-ish value (sum of four uniforms) times 2^e with e spread over the
 * type's comfortable range, never zero (no signed-zero ties for min/max).
 * Products get factors of magnitude in [0.7, 1.4] so 16-rank products stay
 * finite in fp16.
 */
static float noisy_value(enum mscx_dtype dt, enum mscx_redop op, uint64_t h)
{
    float u = 0.0f;
    for (int i = 0; i < 4; i++)
        u += (float)((h >> (10 * i)) & 0x3ffu) / 512.0f - 1.0f;
    uint32_t e = (uint32_t)(h >> 40);
    if (op == MSCX_REDOP_PROD) {
        float f = 1.0f + 0.1f * u; /* within [0.6, 1.4] */
        if (f < 0.7f)
            f = 0.7f + (float)(e % 97) / 1000.0f;
        return (h >> 63) ? -f : f;
    }
    int32_t span = dt == MSCX_DT_FP16 ? 6 : 12;
    int32_t ex = (int32_t)(e % (uint32_t)(2 * span + 1)) - span;
    if (u > -1.0f / 64 && u < 1.0f / 64)
        u = u < 0 ? -0.5f : 0.5f;
    float scale = 1.0f;
    for (; ex > 0; ex--)
        scale *= 2.0f;
    for (; ex < 0; ex++)
        scale *= 0.5f;
    return u * scale;
}

enum fill_mode {
    FILL_BITS,  /* arbitrary bits (data movement) */
    FILL_EXACT, /* reduction-safe values: every order gives the same bits */
    FILL_NOISY  /* floats whose sums round differently in different orders */
};

/* Fill @p bytes starting at element @p first with values of @p mode. */
static void fill_values(enum mscx_dtype dt, enum mscx_redop op, uint32_t rank, uint32_t iter, uint32_t seed,
                        uint64_t salt, uint64_t first, enum fill_mode mode, uint8_t *buf, uint64_t bytes)
{
    uint32_t esize = mscx_dtype_size(dt);
    if (esize == 0)
        esize = 1;
    uint64_t n = bytes / esize;
    for (uint64_t e = 0; e < n; e++) {
        uint64_t h = elem_hash(seed, rank, iter, salt, first + e);
        if (mode == FILL_EXACT) {
            elem_value(dt, op, rank, h, buf + e * esize);
        } else if (mode == FILL_NOISY) {
            put_float(dt, noisy_value(dt, op, h), buf + e * esize);
        } else {
            for (uint32_t i = 0; i < esize; i++)
                buf[e * esize + i] = (uint8_t)(h >> (8 * (i % 8)));
        }
    }
    memset(buf + n * esize, 0, bytes - n * esize);
}

void mscx_sim_fill(enum mscx_dtype dtype, enum mscx_redop op, uint32_t nranks, uint32_t rank, uint32_t iter,
                   uint32_t seed, void *buf, uint64_t bytes)
{
    (void)nranks;
    fill_values(dtype, op, rank, iter, seed, 0, 0, FILL_EXACT, buf, bytes);
}

/* ---- the checked run ---- */

struct sim_ctx {
    const struct mscx_plan *plan;
    const struct mscx_sim_case *c;
    uint32_t nranks;
    uint64_t in_bytes, out_bytes;
    enum fill_mode mode; /* input values */
    uint8_t **got;       /* [iter * nranks + rank], out_bytes each */
    uint8_t **fin;       /* final in|out|scratch per rank (determinism runs) */
    uint64_t *fin_len;
    uint8_t **seed_line; /* per rank: 1 for packet lines to seed */
    uint64_t *seed_nlines;
    uint8_t *root_in;     /* out-of-place broadcast: the root's input as it was filled */
    uint64_t root_in_bad; /* launches after which the root's input had changed */
};

static void sim_fill_cb(void *ctx, uint32_t rank, uint32_t iter, void *in, uint64_t in_bytes, void *out,
                        uint64_t out_bytes)
{
    struct sim_ctx *s = ctx;
    if (iter == 0 && out != in)
        memset(out, 0xa5, out_bytes); /* unwritten output shows */
    if (iter == 0 && s->plan->inplace && out_bytes > in_bytes)
        memset(out, 0xa5, out_bytes);
    fill_values(s->c->dtype, s->c->op, rank, iter, s->c->seed, 0, 0, s->mode, in, in_bytes);
}

static void sim_collect_cb(void *ctx, uint32_t rank, uint32_t iter, const void *in, uint64_t in_bytes,
                           const void *out, uint64_t out_bytes)
{
    struct sim_ctx *s = ctx;
    if (s->got)
        memcpy(s->got[(uint64_t)iter * s->nranks + rank], out, out_bytes);
    if (s->root_in && rank == s->plan->root && in != out) {
        fill_values(s->c->dtype, s->c->op, rank, iter, s->c->seed, 0, 0, s->mode, s->root_in, in_bytes);
        if (memcmp(s->root_in, in, in_bytes) != 0)
            s->root_in_bad++;
    }
}

static void sim_final_cb(void *ctx, uint32_t rank, const uint8_t *in, uint64_t in_bytes, const uint8_t *out,
                         uint64_t out_bytes, const uint8_t *scratch, uint64_t scratch_bytes)
{
    struct sim_ctx *s = ctx;
    if (s->fin == NULL)
        return;
    uint8_t *p = malloc(in_bytes + out_bytes + scratch_bytes + 1);
    if (p == NULL)
        return;
    memcpy(p, in, in_bytes);
    memcpy(p + in_bytes, out, out_bytes);
    memcpy(p + in_bytes + out_bytes, scratch, scratch_bytes);
    s->fin[rank] = p;
    s->fin_len[rank] = in_bytes + out_bytes + scratch_bytes;
}

static void sim_seed_cb(void *ctx, uint32_t rank, uint32_t iter, uint32_t flag, uint8_t *scratch,
                        uint64_t scratch_bytes, uint64_t so)
{
    struct sim_ctx *s = ctx;
    uint32_t fmt = s->c->pkt, P = mscx_pkt_line(fmt), L = mscx_pkt_payload(fmt);
    uint8_t payload[8];
    if (s->seed_line == NULL || s->seed_line[rank] == NULL)
        return;
    for (uint64_t j = 0; j < s->seed_nlines[rank]; j++) {
        if (!s->seed_line[rank][j] || so + (j + 1) * P > scratch_bytes)
            continue;
        fill_values(s->c->dtype, s->c->op, rank, iter, s->c->seed, 0x5eed,
                    j * L / mscx_dtype_size(s->c->dtype), FILL_EXACT, payload, L);
        uint8_t *line = scratch + so + j * P;
        for (uint32_t h = 0; h < P / 8; h++) {
            uint32_t d;
            memcpy(&d, payload + 4 * h, 4);
            atomic_store_explicit((_Atomic uint64_t *)(void *)(line + 8 * h), mscx_pkt_half(d, flag),
                                  memory_order_release);
        }
    }
}

/* Mark packet lines [payload off, +len) of a scratch operand in @p map (1 consumed, 2 produced). */
static void mark(const struct mscx_plan *plan, const struct mscx_geom *geoms, uint8_t **map, uint64_t *nlines,
                 uint32_t rank, const struct mscx_dev_op *op, const struct mscx_dev_operand *o, uint32_t L,
                 uint8_t what)
{
    uint32_t owner = rank;
    uint8_t type = o->type;
    uint64_t off, len;
    if (o->flags & MSCX_OPND_REMOTE) {
        owner = plan->gpus[rank].rbuf[o->rbuf].rank;
        type = plan->gpus[rank].rbuf[o->rbuf].type;
    }
    if (type != MSCX_BUF_SCRATCH)
        return;
    mscx_operand_range(op, o, geoms[owner].slot, 16, &off, &len);
    for (uint64_t j = off / L; j < (off + len) / L && j < nlines[owner]; j++)
        map[owner][j] |= what;
}

static mscx_status_t plan_seeds(struct sim_ctx *s, const struct mscx_geom *geoms)
{
    const struct mscx_plan *plan = s->plan;
    uint32_t L = mscx_pkt_payload(s->c->pkt);
    s->seed_line = calloc(s->nranks, sizeof(*s->seed_line));
    s->seed_nlines = calloc(s->nranks, sizeof(*s->seed_nlines));
    if (s->seed_line == NULL || s->seed_nlines == NULL)
        return MSCX_ERR_NO_MEMORY;
    for (uint32_t r = 0; r < s->nranks; r++) {
        s->seed_nlines[r] = (uint64_t)plan->gpus[r].scratch_chunks * geoms[r].slot / L;
        s->seed_line[r] = calloc(s->seed_nlines[r] + 1, 1);
        if (s->seed_line[r] == NULL)
            return MSCX_ERR_NO_MEMORY;
    }
    for (uint32_t r = 0; r < s->nranks; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t i = 0; i < g->nops; i++) {
            const struct mscx_dev_op *op = &g->ops[i];
            uint32_t k0 = 0, kc0 = 0, kc1 = 0;
            bool port = op->chan_type == MSCX_CHAN_PORT;
            switch (op->opcode) {
            case MSCX_OP_COPY_PACKETS:
            case MSCX_OP_PUT_PACKETS:
            case MSCX_OP_READ_PUT_PACKETS:
                k0 = 0;
                break;
            case MSCX_OP_REDUCE_PACKETS:
            case MSCX_OP_REDUCE_COPY_PACKETS:
            case MSCX_OP_REDUCE_SEND_PACKETS:
            case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
                k0 = 1;
                break;
            default:
                k0 = op->ndst; /* produces no packets */
                break;
            }
            for (uint32_t k = k0; k < op->ndst; k++)
                mark(plan, geoms, s->seed_line, s->seed_nlines, r, op, &op->dst[k], L, 2);
            switch (op->opcode) {
            case MSCX_OP_UNPACK_PACKETS:
            case MSCX_OP_READ_PUT_PACKETS:
                kc0 = 0;
                kc1 = 1;
                break;
            case MSCX_OP_PUT_PACKETS:
                kc0 = 0;
                kc1 = port ? op->nsrc : 0;
                break;
            case MSCX_OP_REDUCE_PACKETS:
            case MSCX_OP_REDUCE_COPY_PACKETS:
            case MSCX_OP_REDUCE_SEND_PACKETS:
            case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
                kc0 = 1;
                kc1 = op->nsrc;
                break;
            default:
                break;
            }
            for (uint32_t k = kc0; k < kc1; k++)
                mark(plan, geoms, s->seed_line, s->seed_nlines, r, op, &op->src[k], L, 1);
        }
    }
    for (uint32_t r = 0; r < s->nranks; r++)
        for (uint64_t j = 0; j < s->seed_nlines[r]; j++)
            s->seed_line[r][j] = s->seed_line[r][j] == 1;
    return MSCX_OK;
}

/* Expected output of @p rank for launch @p iter; tmp holds in_bytes. */
static void expected(struct sim_ctx *s, uint32_t rank, uint32_t iter, uint8_t *exp, uint8_t *tmp)
{
    const struct mscx_sim_case *c = s->c;
    uint32_t N = s->nranks;
    uint64_t in = s->in_bytes, out = s->out_bytes;
    switch (s->plan->coll) {
    case MSCX_COLL_ALLREDUCE:
    case MSCX_COLL_REDUCESCATTER: {
        uint64_t at = s->plan->coll == MSCX_COLL_ALLREDUCE ? 0 : (uint64_t)rank * out;
        for (uint32_t q = 0; q < N; q++) {
            fill_values(c->dtype, c->op, q, iter, c->seed, 0, 0, FILL_EXACT, tmp, in);
            if (q == 0)
                memcpy(exp, tmp + at, out);
            else
                mscx_reduce_bytes(c->dtype, c->op, exp, tmp + at, out);
        }
        break;
    }
    case MSCX_COLL_ALLGATHER:
        for (uint32_t q = 0; q < N; q++)
            fill_values(c->dtype, c->op, q, iter, c->seed, 0, 0, s->mode, exp + (uint64_t)q * in, in);
        break;
    case MSCX_COLL_ALLTOALL: {
        uint64_t blk = in / N;
        for (uint32_t q = 0; q < N; q++) {
            fill_values(c->dtype, c->op, q, iter, c->seed, 0, 0, s->mode, tmp, in);
            memcpy(exp + (uint64_t)q * blk, tmp + (uint64_t)rank * blk, blk);
        }
        break;
    }
    default: /* broadcast: the root's input, count elements */
        fill_values(c->dtype, c->op, s->plan->root, iter, c->seed, 0, 0, s->mode, exp, out);
        break;
    }
}

static bool has_definition(enum mscx_coll coll)
{
    return coll == MSCX_COLL_ALLREDUCE || coll == MSCX_COLL_REDUCESCATTER || coll == MSCX_COLL_ALLGATHER ||
           coll == MSCX_COLL_ALLTOALL || coll == MSCX_COLL_BROADCAST;
}

static void sim_free(struct sim_ctx *s, uint32_t iters)
{
    if (s->got)
        for (uint64_t i = 0; i < (uint64_t)iters * s->nranks; i++)
            free(s->got[i]);
    free(s->got);
    if (s->fin)
        for (uint32_t r = 0; r < s->nranks; r++)
            free(s->fin[r]);
    free(s->fin);
    free(s->fin_len);
    if (s->seed_line)
        for (uint32_t r = 0; r < s->nranks; r++)
            free(s->seed_line[r]);
    free(s->seed_line);
    free(s->seed_nlines);
    free(s->root_in);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reducing collectives: inputs must reduce exactly whatever the plan's ops are (a one-rank nop reduces too).
 */
static bool coll_reduces(enum mscx_coll coll)
{
    return coll == MSCX_COLL_ALLREDUCE || coll == MSCX_COLL_REDUCESCATTER;
}

/* Run once; @return MSCX_OK, or the executor's status with the reason in res_p->msg. */
static mscx_status_t run_once(struct sim_ctx *s, uint32_t sched_seed, bool seed_pkts,
                              struct mscx_sim_result *res_p)
{
    struct mscx_hostexec_cfg cfg;
    struct hx_hooks hooks;
    memset(&cfg, 0, sizeof(cfg));
    memset(&hooks, 0, sizeof(hooks));
    cfg.in_bytes = s->in_bytes;
    cfg.out_bytes = s->out_bytes;
    cfg.dtype = s->c->dtype;
    cfg.op = s->c->op;
    cfg.pkt = s->c->pkt;
    cfg.iters = s->c->iters ? s->c->iters : 1;
    cfg.sched_seed = sched_seed;
    cfg.fill = sim_fill_cb;
    cfg.collect = sim_collect_cb;
    cfg.ctx = s;
    if (seed_pkts)
        hooks.scratch_pre = sim_seed_cb;
    hooks.final = sim_final_cb;
    return mscx_hostexec_run_hooks(s->plan, &cfg, &hooks, res_p->msg, sizeof(res_p->msg));
}

static mscx_status_t ran_status(mscx_status_t st, struct mscx_sim_result *res_p)
{
    if (st == MSCX_ERR_TIMEOUT || st == MSCX_ERR_INTERNAL || st == MSCX_ERR_REMOTE) {
        res_p->pass = 0;
        return MSCX_OK;
    }
    return st;
}

static mscx_status_t check_definition(struct sim_ctx *s, struct mscx_sim_result *res_p)
{
    uint32_t iters = s->c->iters ? s->c->iters : 1;
    uint64_t cells = (uint64_t)iters * s->nranks;
    mscx_status_t st;
    uint8_t *exp = malloc(s->out_bytes + 1), *tmp = malloc(s->in_bytes + 1);
    s->got = calloc(cells, sizeof(*s->got));
    if (exp == NULL || tmp == NULL || s->got == NULL)
        goto oom;
    for (uint64_t i = 0; i < cells; i++)
        if ((s->got[i] = malloc(s->out_bytes + 1)) == NULL)
            goto oom;
    bool check_root_in = s->plan->coll == MSCX_COLL_BROADCAST && !s->plan->inplace;
    if (check_root_in && (s->root_in = malloc(s->in_bytes + 1)) == NULL)
        goto oom;
    st = run_once(s, s->c->seed, false, res_p);
    if (st != MSCX_OK) {
        free(exp);
        free(tmp);
        return ran_status(st, res_p);
    }
    res_p->pass = 1;
    for (uint32_t it = 0; it < iters; it++) {
        for (uint32_t r = 0; r < s->nranks; r++) {
            const uint8_t *got = s->got[(uint64_t)it * s->nranks + r];
            expected(s, r, it, exp, tmp);
            for (uint64_t b = 0; b < s->out_bytes; b++) {
                if (got[b] == exp[b])
                    continue;
                if (res_p->mismatches++ == 0)
                    snprintf(res_p->msg, sizeof(res_p->msg),
                             "%s: rank %u iter %u byte offset %" PRIu64 " (of %" PRIu64
                             "): got 0x%02x expected "
                             "0x%02x",
                             mscx_coll_name(s->plan->coll), r, it, b, s->out_bytes, got[b], exp[b]);
                res_p->pass = 0;
            }
        }
    }
    if (s->root_in_bad) {
        if (res_p->mismatches++ == 0)
            snprintf(res_p->msg, sizeof(res_p->msg),
                     "broadcast: the root's (rank %u) input changed in %" PRIu64 " of %u launches",
                     s->plan->root, s->root_in_bad, iters);
        res_p->pass = 0;
    }
    free(exp);
    free(tmp);
    return MSCX_OK;
oom:
    free(exp);
    free(tmp);
    snprintf(res_p->msg, sizeof(res_p->msg), "out of memory for the simulation buffers");
    return MSCX_ERR_NO_MEMORY;
}

/*
 * Allreduce replicas must agree bit for bit even where the reduction order
 * matters (data-parallel training keeps replicas in sync through it). The
 * exact inputs cannot show that, so floating-point cases run once more with
 * rounding-sensitive inputs and every rank's output must equal rank 0's.
 * Integer reductions are associative, and the other collectives hold each
 * reduced element on one rank only (reducescatter) or move bits unchanged
 * (allgather: the definition check with arbitrary bits covers them).
 */
static bool needs_consistency(const struct sim_ctx *s)
{
    enum mscx_dtype dt = s->c->dtype;
    return !s->c->no_cross_rank && s->plan->coll == MSCX_COLL_ALLREDUCE && s->nranks > 1 &&
           (dt == MSCX_DT_FP32 || dt == MSCX_DT_FP16 || dt == MSCX_DT_BF16);
}

/*
 * Runs after check_definition, reusing its output buffers. One launch: the
 * reduction order does not depend on the launch (the definition check
 * covers back-to-back launches).
 */
static mscx_status_t check_consistent(struct sim_ctx *s, struct mscx_sim_result *res_p)
{
    uint32_t iters = 1;
    uint32_t esize = mscx_dtype_size(s->c->dtype);
    struct mscx_sim_case one = *s->c;
    const struct mscx_sim_case *saved_c = s->c;
    one.iters = 1;
    s->c = &one;
    s->mode = FILL_NOISY;
    mscx_status_t st = run_once(s, s->c->seed ^ 0x5a5au, false, res_p);
    s->mode = FILL_EXACT;
    s->c = saved_c;
    if (st != MSCX_OK)
        return ran_status(st, res_p);
    for (uint32_t it = 0; it < iters; it++) {
        const uint8_t *ref = s->got[(uint64_t)it * s->nranks];
        for (uint32_t r = 1; r < s->nranks; r++) {
            const uint8_t *got = s->got[(uint64_t)it * s->nranks + r];
            for (uint64_t b = 0; b < s->out_bytes; b++) {
                if (got[b] == ref[b])
                    continue;
                if (res_p->mismatches++ == 0) {
                    uint64_t e = b / esize;
                    uint32_t vr = 0, v0 = 0;
                    memcpy(&vr, got + e * esize, esize);
                    memcpy(&v0, ref + e * esize, esize);
                    snprintf(
                        res_p->msg, sizeof(res_p->msg),
                        "%s: ranks disagree on rounding-sensitive inputs: rank %u iter %u element %" PRIu64
                        " (byte offset %" PRIu64 " of %" PRIu64 "): 0x%0*x, rank 0 has 0x%0*x",
                        mscx_coll_name(s->plan->coll), r, it, e, e * esize, s->out_bytes, (int)(2 * esize),
                        vr, (int)(2 * esize), v0);
                }
                res_p->pass = 0;
            }
        }
    }
    return MSCX_OK;
}

static mscx_status_t check_deterministic(struct sim_ctx *s, const struct mscx_geom *geoms,
                                         struct mscx_sim_result *res_p)
{
    uint8_t **first = NULL;
    uint64_t *first_len = NULL;
    mscx_status_t st = plan_seeds(s, geoms);
    if (st != MSCX_OK)
        goto oom;
    for (int pass = 0; pass < 2; pass++) {
        s->fin = calloc(s->nranks, sizeof(*s->fin));
        s->fin_len = calloc(s->nranks, sizeof(*s->fin_len));
        if (s->fin == NULL || s->fin_len == NULL)
            goto oom;
        st = run_once(s, s->c->seed * 2u + 1u + (uint32_t)pass, true, res_p);
        if (st != MSCX_OK)
            break;
        for (uint32_t r = 0; r < s->nranks; r++)
            if (s->fin[r] == NULL)
                goto oom;
        if (pass == 0) {
            first = s->fin;
            first_len = s->fin_len;
            s->fin = NULL;
            s->fin_len = NULL;
        }
    }
    if (st == MSCX_OK) {
        res_p->pass = 1;
        for (uint32_t r = 0; r < s->nranks; r++) {
            for (uint64_t b = 0; b < first_len[r]; b++) {
                if (first[r][b] == s->fin[r][b])
                    continue;
                if (res_p->mismatches++ == 0)
                    snprintf(res_p->msg, sizeof(res_p->msg),
                             "two schedules disagree: rank %u byte offset %" PRIu64
                             " of input|output|scratch: 0x%02x then 0x%02x",
                             r, b, first[r][b], s->fin[r][b]);
                res_p->pass = 0;
            }
        }
    }
    if (first) {
        for (uint32_t r = 0; r < s->nranks; r++)
            free(first[r]);
        free(first);
        free(first_len);
    }
    return st == MSCX_OK ? MSCX_OK : ran_status(st, res_p);
oom:
    if (first) {
        for (uint32_t r = 0; r < s->nranks; r++)
            free(first[r]);
        free(first);
        free(first_len);
    }
    snprintf(res_p->msg, sizeof(res_p->msg), "out of memory for the simulation buffers");
    return MSCX_ERR_NO_MEMORY;
}

mscx_status_t mscx_sim_check(const struct mscx_plan *plan, const struct mscx_sim_case *c,
                             struct mscx_sim_result *res_p)
{
    struct sim_ctx s;
    struct mscx_geom *geoms = NULL;
    mscx_status_t st = MSCX_OK;
    double t0 = now_s();
    memset(res_p, 0, sizeof(*res_p));
    memset(&s, 0, sizeof(s));
    s.plan = plan;
    s.c = c;
    s.nranks = plan->nranks;
    mscx_coll_sizes(plan->coll, plan->nranks, c->msg_bytes, &s.in_bytes, &s.out_bytes);
    if (!has_definition(plan->coll) && plan->nranks > 0) {
        /* no definition: msg_bytes is the input; the output gets chunks of the same size */
        const struct mscx_gpu *g0 = &plan->gpus[0];
        uint32_t es = mscx_dtype_size(c->dtype) ? mscx_dtype_size(c->dtype) : 1;
        if (g0->input_chunks && g0->output_chunks)
            s.out_bytes =
                (s.in_bytes / es + g0->input_chunks - 1) / g0->input_chunks * es * g0->output_chunks;
    }
    s.mode = coll_reduces(plan->coll) || !has_definition(plan->coll) ? FILL_EXACT : FILL_BITS;
    geoms = calloc(s.nranks, sizeof(*geoms));
    if (geoms == NULL) {
        snprintf(res_p->msg, sizeof(res_p->msg), "out of memory");
        return MSCX_ERR_NO_MEMORY;
    }
    for (uint32_t r = 0; r < s.nranks; r++) {
        st = mscx_plan_geom(plan, r, s.in_bytes, s.out_bytes, c->dtype, &geoms[r], res_p->msg,
                            sizeof(res_p->msg));
        if (st != MSCX_OK)
            goto out;
    }
    if (has_definition(plan->coll)) {
        st = check_definition(&s, res_p);
        if (st == MSCX_OK && res_p->pass && needs_consistency(&s))
            st = check_consistent(&s, res_p);
    } else
        st = check_deterministic(&s, geoms, res_p);
out:
    sim_free(&s, c->iters ? c->iters : 1);
    free(geoms);
    res_p->seconds = now_s() - t0;
    if (res_p->pass)
        res_p->msg[0] = '\0';
    return st;
}
