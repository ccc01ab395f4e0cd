/* SPDX-License-Identifier: MIT */
/*
 * The plan object: names, accessors, lifetime (free, clone), capability
 * checks, the readable summary and the per-launch byte geometry. Parsing is
 * in plan_json.c, validation in plan_validate.c.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mscx/log.h"
#include "mscx/plan.h"
#include "plan_model.h"

/* ---- names ---- */

static const char *const dtype_names[MSCX_DT_COUNT] = {
    "fp32", "fp16", "bf16", "int32", "uint32", "int8", "uint8", "int64", "uint64", "fp64",
};
static const uint32_t dtype_sizes[MSCX_DT_COUNT] = {4, 2, 2, 4, 4, 1, 1, 8, 8, 8};
static const char *const redop_names[MSCX_REDOP_COUNT] = {"sum", "prod", "min", "max"};
static const char *const coll_names[MSCX_COLL_COUNT] = {
    "allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv", "test",
};
static const char *const opcode_names[MSCX_OP_COUNT] = {
    [MSCX_OP_NOP] = "nop",
    [MSCX_OP_BARRIER] = "barrier",
    [MSCX_OP_PUT] = "put",
    [MSCX_OP_PUT_PACKETS] = "ppkt",
    [MSCX_OP_READ_PUT_PACKETS] = "rppkt",
    [MSCX_OP_PUT_WITH_SIGNAL] = "pws",
    [MSCX_OP_PUT_WITH_SIGNAL_AND_FLUSH] = "pwsf",
    [MSCX_OP_GET] = "get",
    [MSCX_OP_COPY] = "copy",
    [MSCX_OP_COPY_PACKETS] = "cpkt",
    [MSCX_OP_UNPACK_PACKETS] = "upkt",
    [MSCX_OP_SIGNAL] = "signal",
    [MSCX_OP_WAIT] = "wait",
    [MSCX_OP_FLUSH] = "flush",
    [MSCX_OP_REDUCE] = "re",
    [MSCX_OP_REDUCE_PACKETS] = "repkt",
    [MSCX_OP_REDUCE_COPY_PACKETS] = "recpkt",
    [MSCX_OP_REDUCE_SEND] = "res",
    [MSCX_OP_REDUCE_SEND_PACKETS] = "respkt",
    [MSCX_OP_REDUCE_COPY_SEND_PACKETS] = "recspkt",
    [MSCX_OP_READ_REDUCE] = "rre",
    [MSCX_OP_READ_REDUCE_SEND] = "rres",
    [MSCX_OP_MULTI_LOAD_REDUCE_STORE] = "glres",
    [MSCX_OP_RELAXED_SIGNAL] = "rlxsignal",
    [MSCX_OP_RELAXED_WAIT] = "rlxwait",
    [MSCX_OP_PIPELINE] = "pipeline",
    [MSCX_OP_SEM_RELEASE] = "sem_release",
    [MSCX_OP_SEM_ACQUIRE] = "sem_acquire",
    [MSCX_OP_MULTI_STORE] = "gstore",
    [MSCX_OP_MULTI_STORE_PKT] = "gstorepkt",
};

uint32_t mscx_dtype_size(enum mscx_dtype dtype)
{
    return (unsigned)dtype < MSCX_DT_COUNT ? dtype_sizes[dtype] : 0;
}

const char *mscx_dtype_name(enum mscx_dtype dtype)
{
    return (unsigned)dtype < MSCX_DT_COUNT ? dtype_names[dtype] : "unknown";
}

const char *mscx_redop_name(enum mscx_redop op)
{
    return (unsigned)op < MSCX_REDOP_COUNT ? redop_names[op] : "unknown";
}

const char *mscx_coll_name(enum mscx_coll coll)
{
    return (unsigned)coll < MSCX_COLL_COUNT ? coll_names[coll] : "unknown";
}

const char *mscx_opcode_name(enum mscx_opcode op)
{
    return (unsigned)op < MSCX_OP_COUNT ? opcode_names[op] : "unknown";
}

static int name_lookup(const char *const *names, int n, const char *name)
{
    if (name == NULL)
        return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return i;
    return -1;
}

int mscx_dtype_parse(const char *name, enum mscx_dtype *dtype_p)
{
    static const struct {
        const char *alias;
        enum mscx_dtype dt;
    } aliases[] = {
        {"float32", MSCX_DT_FP32}, {"float", MSCX_DT_FP32},    {"float16", MSCX_DT_FP16},
        {"half", MSCX_DT_FP16},    {"bfloat16", MSCX_DT_BF16}, {"float64", MSCX_DT_FP64},
        {"double", MSCX_DT_FP64},
    };
    int i = name_lookup(dtype_names, MSCX_DT_COUNT, name);
    if (i < 0 && name != NULL) {
        for (size_t k = 0; k < sizeof(aliases) / sizeof(aliases[0]); k++)
            if (strcmp(aliases[k].alias, name) == 0)
                i = (int)aliases[k].dt;
    }
    if (i < 0)
        return -1;
    *dtype_p = (enum mscx_dtype)i;
    return 0;
}

int mscx_redop_parse(const char *name, enum mscx_redop *op_p)
{
    int i = name_lookup(redop_names, MSCX_REDOP_COUNT, name);
    if (i < 0)
        return -1;
    *op_p = (enum mscx_redop)i;
    return 0;
}

int mscx_coll_parse(const char *name, enum mscx_coll *coll_p)
{
    int i = name_lookup(coll_names, MSCX_COLL_COUNT, name);
    if (i < 0)
        return -1;
    *coll_p = (enum mscx_coll)i;
    return 0;
}

/* ---- accessors ---- */

const char *mscx_plan_name(const struct mscx_plan *plan)
{
    return plan->name;
}

const char *mscx_plan_origin(const struct mscx_plan *plan)
{
    return plan->origin;
}

enum mscx_coll mscx_plan_collective(const struct mscx_plan *plan)
{
    return plan->coll;
}

uint32_t mscx_plan_nranks(const struct mscx_plan *plan)
{
    return plan->nranks;
}

uint32_t mscx_plan_ranks_per_node(const struct mscx_plan *plan)
{
    return plan->ranks_per_node;
}

uint32_t mscx_plan_root(const struct mscx_plan *plan)
{
    return plan->root;
}

int mscx_plan_beats_nccl_window(const struct mscx_plan *plan)
{
    return plan->beats_nccl_window ? 1 : 0;
}

int mscx_plan_reaches_peer_user(const struct mscx_plan *plan)
{
    for (uint32_t r = 0; r < plan->nranks; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t i = 0; i < g->nrbuf; i++)
            if ((g->rbuf[i].type == MSCX_BUF_INPUT || g->rbuf[i].type == MSCX_BUF_OUTPUT) &&
                g->rbuf[i].rank != r)
                return 1;
    }
    return 0;
}

int mscx_plan_inplace(const struct mscx_plan *plan)
{
    return plan->inplace ? 1 : 0;
}

uint32_t mscx_plan_threadblocks(const struct mscx_plan *plan, uint32_t rank)
{
    return rank < plan->nranks ? plan->gpus[rank].ntb : 0;
}

uint32_t mscx_plan_threads_per_block(const struct mscx_plan *plan)
{
    return plan->nthreads;
}

void mscx_plan_size_range(const struct mscx_plan *plan, uint64_t *min_p, uint64_t *max_p)
{
    if (min_p)
        *min_p = plan->min_size;
    if (max_p)
        *max_p = plan->max_size;
}

/* Chunk count of rank @p g's buffer that holds one section per rank, 0 when there is none. Alltoall
 * sections both buffers (block j of the input goes to rank j, block q of the output came from rank q);
 * mscx_plan_geom() refuses input and output chunks that disagree, so the input's count stands for both. */
static uint32_t sectioned_chunks(const struct mscx_plan *plan, const struct mscx_gpu *g)
{
    if (plan->coll == MSCX_COLL_ALLGATHER)
        return g->output_chunks;
    if (plan->coll == MSCX_COLL_REDUCESCATTER)
        return g->input_chunks;
    if (plan->coll == MSCX_COLL_ALLTOALL)
        return g->input_chunks ? g->input_chunks : g->output_chunks;
    return 0;
}

static uint64_t gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

uint64_t mscx_plan_elem_multiple(const struct mscx_plan *plan)
{
    uint64_t m = 1;
    for (uint32_t r = 0; r < plan->nranks; r++) {
        uint64_t k = sectioned_chunks(plan, &plan->gpus[r]);
        if (k > 1)
            m = m / gcd_u64(m, k) * k;
    }
    return m;
}

/* Does any op of the plan reduce? */
static bool plan_reduces(const struct mscx_plan *plan)
{
    for (uint32_t r = 0; r < plan->nranks; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        for (uint32_t i = 0; i < g->nops; i++)
            if (mscx_opcode_reduces(g->ops[i].opcode))
                return true;
    }
    return false;
}

int mscx_plan_supports(const struct mscx_plan *plan, enum mscx_dtype dtype, enum mscx_redop op)
{
    if ((unsigned)dtype >= MSCX_DT_COUNT || !(plan->dtype_mask & (1u << dtype)))
        return 0;
    if (plan_reduces(plan)) {
        if ((unsigned)op >= MSCX_REDOP_COUNT || !(plan->redop_mask & (1u << op)))
            return 0;
        if (!(MSCX_DT_REDUCIBLE_MASK & (1u << dtype)))
            return 0;
    }
    return 1;
}

static void put_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void put_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

mscx_status_t mscx_plan_executable(const struct mscx_plan *plan, char *err, size_t errlen)
{
    if (plan->has_multicast) {
        for (uint32_t r = 0; r < plan->nranks; r++) {
            const struct mscx_gpu *g = &plan->gpus[r];
            for (uint32_t i = 0; i < g->nops; i++) {
                if (mscx_opcode_is_multicast(g->ops[i].opcode)) {
                    put_err(
                        err, errlen,
                        "plan %s: rank %u uses the multicast operation %s (NVLS switch channels), which the "
                        "executors do not run",
                        plan->name, r, mscx_opcode_name((enum mscx_opcode)g->ops[i].opcode));
                    return MSCX_ERR_UNSUPPORTED;
                }
            }
        }
        put_err(err, errlen,
                "plan %s declares switch (NVLS multicast) channels, which the executors do not run",
                plan->name);
        return MSCX_ERR_UNSUPPORTED;
    }
    return MSCX_OK;
}

/* ---- lifetime ---- */

static void gpu_free(struct mscx_gpu *g)
{
    for (int t = 0; t < MSCX_CHAN_COUNT; t++)
        free(g->chan[t]);
    if (g->switch_chan) {
        for (uint32_t s = 0; s < g->nswitch; s++) {
            struct mscx_switch_chan *sc = &g->switch_chan[s];
            if (sc->group_ranks)
                for (uint32_t k = 0; k < sc->ngroups; k++)
                    free(sc->group_ranks[k]);
            free(sc->group_ranks);
            free(sc->group_size);
        }
        free(g->switch_chan);
    }
    free(g->rbuf);
    free(g->sem_init);
    if (g->tb) {
        for (uint32_t t = 0; t < g->ntb; t++) {
            for (int c = 0; c < MSCX_CHAN_COUNT; c++) {
                free(g->tb[t].chan[c]);
                free(g->tb[t].rbuf[c]);
            }
        }
        free(g->tb);
    }
    free(g->ops);
}

void mscx_plan_free(struct mscx_plan *plan)
{
    if (plan == NULL)
        return;
    if (plan->gpus) {
        for (uint32_t r = 0; r < plan->nranks; r++)
            gpu_free(&plan->gpus[r]);
        free(plan->gpus);
    }
    free(plan->name);
    free(plan->origin);
    free(plan->collective_name);
    free(plan);
}

void mscx_plan_destroy(struct mscx_plan *plan)
{
    mscx_plan_free(plan);
}

/* Copy @p n elements of @p size bytes; NULL stays NULL, n == 0 gives NULL. */
static int dup_array(void **dst_p, const void *src, size_t n, size_t size)
{
    *dst_p = NULL;
    if (src == NULL || n == 0)
        return 0;
    *dst_p = malloc(n * size);
    if (*dst_p == NULL)
        return -1;
    memcpy(*dst_p, src, n * size);
    return 0;
}

static int dup_str(char **dst_p, const char *src)
{
    *dst_p = NULL;
    if (src == NULL)
        return 0;
    *dst_p = strdup(src);
    return *dst_p ? 0 : -1;
}

static int gpu_clone(struct mscx_gpu *d, const struct mscx_gpu *s)
{
    *d = *s;
    /* Clear every pointer first so that a failure leaves a freeable object. */
    memset(d->chan, 0, sizeof(d->chan));
    d->switch_chan = NULL;
    d->rbuf = NULL;
    d->sem_init = NULL;
    d->tb = NULL;
    d->ops = NULL;
    d->nswitch = 0;
    d->ntb = 0;
    for (int t = 0; t < MSCX_CHAN_COUNT; t++)
        if (dup_array((void **)&d->chan[t], s->chan[t], s->nchan[t], sizeof(struct mscx_chan)))
            return -1;
    if (dup_array((void **)&d->rbuf, s->rbuf, s->nrbuf, sizeof(struct mscx_rbuf)) ||
        dup_array((void **)&d->sem_init, s->sem_init, s->nsem, sizeof(int32_t)) ||
        dup_array((void **)&d->ops, s->ops, s->nops, sizeof(struct mscx_dev_op)))
        return -1;
    if (s->nswitch) {
        d->switch_chan = calloc(s->nswitch, sizeof(*d->switch_chan));
        if (d->switch_chan == NULL)
            return -1;
        d->nswitch = s->nswitch;
        for (uint32_t i = 0; i < s->nswitch; i++) {
            const struct mscx_switch_chan *ss = &s->switch_chan[i];
            struct mscx_switch_chan *ds = &d->switch_chan[i];
            ds->buf_type = ss->buf_type;
            if (ss->ngroups == 0)
                continue;
            ds->group_ranks = calloc(ss->ngroups, sizeof(uint32_t *));
            if (ds->group_ranks == NULL)
                return -1;
            ds->ngroups = ss->ngroups;
            if (dup_array((void **)&ds->group_size, ss->group_size, ss->ngroups, sizeof(uint32_t)))
                return -1;
            for (uint32_t k = 0; k < ss->ngroups; k++)
                if (dup_array((void **)&ds->group_ranks[k], ss->group_ranks[k], ss->group_size[k],
                              sizeof(uint32_t)))
                    return -1;
        }
    }
    if (s->ntb) {
        d->tb = calloc(s->ntb, sizeof(*d->tb));
        if (d->tb == NULL)
            return -1;
        d->ntb = s->ntb;
        for (uint32_t t = 0; t < s->ntb; t++) {
            d->tb[t].op_begin = s->tb[t].op_begin;
            d->tb[t].nops = s->tb[t].nops;
            for (int c = 0; c < MSCX_CHAN_COUNT; c++) {
                d->tb[t].nchan[c] = s->tb[t].nchan[c];
                d->tb[t].nrbuf[c] = s->tb[t].nrbuf[c];
                if (dup_array((void **)&d->tb[t].chan[c], s->tb[t].chan[c], s->tb[t].nchan[c],
                              sizeof(uint16_t)) ||
                    dup_array((void **)&d->tb[t].rbuf[c], s->tb[t].rbuf[c], s->tb[t].nrbuf[c],
                              sizeof(uint16_t)))
                    return -1;
            }
        }
    }
    return 0;
}

mscx_status_t mscx_plan_clone(const struct mscx_plan *plan, struct mscx_plan **copy_p)
{
    struct mscx_plan *c = calloc(1, sizeof(*c));
    if (c == NULL)
        goto err_nomem;
    *c = *plan;
    c->name = c->origin = c->collective_name = NULL;
    c->gpus = NULL;
    c->nranks = 0;
    if (dup_str(&c->name, plan->name) || dup_str(&c->origin, plan->origin) ||
        dup_str(&c->collective_name, plan->collective_name))
        goto err_free;
    if (plan->nranks) {
        c->gpus = calloc(plan->nranks, sizeof(*c->gpus));
        if (c->gpus == NULL)
            goto err_free;
        for (uint32_t r = 0; r < plan->nranks; r++) {
            c->nranks = r + 1;
            if (gpu_clone(&c->gpus[r], &plan->gpus[r]))
                goto err_free;
        }
    }
    *copy_p = c;
    return MSCX_OK;

err_free:
    mscx_plan_free(c);
err_nomem:
    MSCX_WARN("out of memory cloning plan %s", plan->name);
    return MSCX_ERR_NO_MEMORY;
}

/* ---- geometry ---- */

#define GEOM_MAX_BYTES (1ull << 40)

void mscx_coll_sizes(enum mscx_coll coll, uint32_t nranks, uint64_t msg_bytes, uint64_t *in_bytes_p,
                     uint64_t *out_bytes_p)
{
    uint64_t in = msg_bytes, out = msg_bytes;
    if (nranks == 0)
        nranks = 1;
    if (coll == MSCX_COLL_ALLGATHER)
        in = msg_bytes / nranks;
    else if (coll == MSCX_COLL_REDUCESCATTER)
        out = msg_bytes / nranks;
    *in_bytes_p = in;
    *out_bytes_p = out;
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

void mscx_plan_scratch_size(const struct mscx_plan *plan, uint32_t rank, uint64_t max_msg, uint64_t *bytes_p,
                            uint64_t *half_p)
{
    uint64_t need = 0, in, out;
    mscx_coll_sizes(plan->coll, plan->nranks, max_msg, &in, &out);
    for (int dt = 0; dt < MSCX_DT_COUNT; dt++) {
        struct mscx_geom g;
        char err[256];
        uint32_t es = mscx_dtype_size((enum mscx_dtype)dt);
        if (mscx_plan_geom(plan, rank, in / es * es, out / es * es, (enum mscx_dtype)dt, &g, err,
                           sizeof(err)) == MSCX_OK &&
            g.scratch_bytes > need)
            need = g.scratch_bytes;
    }
    *half_p = 0;
    if (plan->double_scratch && need) {
        need = (need + 255u) & ~(uint64_t)255u;
        *half_p = need / 2u;
    }
    *bytes_p = need;
}

mscx_status_t mscx_plan_geom(const struct mscx_plan *plan, uint32_t rank, uint64_t in_bytes,
                             uint64_t out_bytes, enum mscx_dtype dtype, struct mscx_geom *geom_p, char *err,
                             size_t errlen)
{
    struct mscx_geom g;
    uint32_t esize = mscx_dtype_size(dtype);
    if (esize == 0) {
        put_err(err, errlen, "caller bug: unknown datatype %d", (int)dtype);
        return MSCX_ERR_INVALID_ARG;
    }
    if (rank >= plan->nranks) {
        put_err(err, errlen, "caller bug: rank %u is not below the plan's %u ranks", rank, plan->nranks);
        return MSCX_ERR_INVALID_ARG;
    }
    if (in_bytes > GEOM_MAX_BYTES || out_bytes > GEOM_MAX_BYTES) {
        put_err(err, errlen, "caller bug: buffer of %" PRIu64 " bytes is beyond the %" PRIu64 "-byte limit",
                in_bytes > out_bytes ? in_bytes : out_bytes, (uint64_t)GEOM_MAX_BYTES);
        return MSCX_ERR_INVALID_ARG;
    }
    if (in_bytes % esize || out_bytes % esize) {
        put_err(err, errlen,
                "caller bug: %" PRIu64 " input / %" PRIu64 " output bytes are not whole %s elements",
                in_bytes, out_bytes, mscx_dtype_name(dtype));
        return MSCX_ERR_INVALID_ARG;
    }
    const struct mscx_gpu *gpu = &plan->gpus[rank];
    /* Chunks split unevenly over a buffer of rank sections would put a section's data in another
     * rank's chunks (and break the in-place aliasing): such sizes are refused, as MSCCL++ does. */
    uint32_t sect = sectioned_chunks(plan, gpu);
    uint64_t sect_bytes = plan->coll == MSCX_COLL_ALLGATHER ? out_bytes : in_bytes;
    if (sect > 1 && (sect_bytes / esize) % sect) {
        put_err(err, errlen,
                "caller bug: plan %s rank %u: the %s's %" PRIu64 "-byte %s (%" PRIu64
                " %s elements) does not "
                "split into its %u chunks evenly, so the chunks would not line up with the ranks' sections",
                plan->name, rank, mscx_coll_name(plan->coll), sect_bytes,
                plan->coll == MSCX_COLL_ALLGATHER ? "output" : "input", sect_bytes / esize,
                mscx_dtype_name(dtype), sect);
        return MSCX_ERR_INVALID_ARG;
    }
    memset(&g, 0, sizeof(g));
    g.in_bytes = in_bytes;
    g.out_bytes = out_bytes;
    g.esize = esize;
    if (gpu->input_chunks)
        g.in_chunk = (in_bytes / esize + gpu->input_chunks - 1) / gpu->input_chunks * esize;
    if (gpu->output_chunks)
        g.out_chunk = (out_bytes / esize + gpu->output_chunks - 1) / gpu->output_chunks * esize;
    if (gpu->input_chunks && gpu->output_chunks && g.in_chunk != g.out_chunk) {
        put_err(err, errlen,
                "caller bug: plan %s rank %u: input chunks of %" PRIu64 " bytes (%" PRIu64
                " over %u) and output "
                "chunks of %" PRIu64 " bytes (%" PRIu64 " over %u) disagree",
                plan->name, rank, g.in_chunk, in_bytes, gpu->input_chunks, g.out_chunk, out_bytes,
                gpu->output_chunks);
        return MSCX_ERR_INVALID_ARG;
    }
    uint64_t align = plan->alignment > 16 ? plan->alignment : 16;
    uint64_t biggest = g.in_chunk > g.out_chunk ? g.in_chunk : g.out_chunk;
    g.slot = biggest ? round_up(biggest, align) : align;
    uint64_t factor =
        ((plan->has_packet_ops || plan->protocol == MSCX_PROTO_LL) ? 2 : 1) * (plan->double_scratch ? 2 : 1);
    uint64_t max_chunks = gpu->scratch_chunks;
    if (gpu->input_chunks > max_chunks)
        max_chunks = gpu->input_chunks;
    if (gpu->output_chunks > max_chunks)
        max_chunks = gpu->output_chunks;
    if (max_chunks * g.slot * factor > GEOM_MAX_BYTES) {
        put_err(err, errlen,
                "caller bug: plan %s rank %u: %" PRIu64 "-byte chunks over %" PRIu64
                " chunks are beyond the %" PRIu64 "-byte limit",
                plan->name, rank, g.slot, max_chunks, (uint64_t)GEOM_MAX_BYTES);
        return MSCX_ERR_INVALID_ARG;
    }
    g.scratch_bytes = (uint64_t)gpu->scratch_chunks * g.slot * factor;
    g.scratch_half = plan->double_scratch ? g.scratch_bytes / 2 : 0;
    *geom_p = g;
    return MSCX_OK;
}

/* ---- summary ---- */

static const char *const chan_type_names[MSCX_CHAN_COUNT] = {"none", "memory", "port", "switch"};

void mscx_plan_describe(const struct mscx_plan *plan, FILE *out, const uint64_t *sizes, size_t nsizes)
{
    uint64_t opcount[MSCX_OP_COUNT] = {0};
    uint64_t chans[MSCX_CHAN_COUNT] = {0};
    uint32_t tb_min = UINT32_MAX, tb_max = 0;
    uint64_t total_ops = 0;

    for (uint32_t r = 0; r < plan->nranks; r++) {
        const struct mscx_gpu *g = &plan->gpus[r];
        if (g->ntb < tb_min)
            tb_min = g->ntb;
        if (g->ntb > tb_max)
            tb_max = g->ntb;
        for (uint32_t i = 0; i < g->nops; i++)
            if (g->ops[i].opcode < MSCX_OP_COUNT)
                opcount[g->ops[i].opcode]++;
        total_ops += g->nops;
        for (int t = 0; t < MSCX_CHAN_COUNT; t++)
            chans[t] += g->nchan[t];
        chans[MSCX_CHAN_SWITCH] += g->nswitch;
    }
    if (plan->nranks == 0)
        tb_min = 0;
    fprintf(out, "plan:            %s (%s)\n", plan->name, plan->origin ? plan->origin : "-");
    fprintf(out, "collective:      %s\n",
            plan->collective_name ? plan->collective_name : mscx_coll_name(plan->coll));
    fprintf(out, "ranks:           %u\n", plan->nranks);
    if (plan->ranks_per_node)
        fprintf(out, "ranks/node:      %u%s\n", plan->ranks_per_node,
                plan->ranks_per_node_given ? "" : " (inferred)");
    else
        fprintf(out, "ranks/node:      unknown\n");
    if (plan->coll == MSCX_COLL_BROADCAST)
        fprintf(out, "root:            %u%s\n", plan->root, plan->root_given ? "" : " (no mscx.root)");
    fprintf(out, "protocol:        %s%s\n", plan->protocol == MSCX_PROTO_LL ? "LL" : "Simple",
            plan->double_scratch ? ", double scratch" : "");
    fprintf(out, "inplace:         %s\n", plan->inplace ? "yes" : "no");
    fprintf(out, "size range:      %" PRIu64 " .. %" PRIu64 " bytes\n", plan->min_size, plan->max_size);
    if (tb_min == tb_max)
        fprintf(out, "thread blocks:   %u per rank\n", tb_max);
    else
        fprintf(out, "thread blocks:   %u..%u per rank\n", tb_min, tb_max);
    fprintf(out, "threads/block:   %u\n", plan->nthreads);
    fprintf(out, "ops:             %" PRIu64 " in all\n", total_ops);
    for (int op = 0; op < MSCX_OP_COUNT; op++)
        if (opcount[op])
            fprintf(out, "  %-12s   %" PRIu64 "\n", mscx_opcode_name((enum mscx_opcode)op), opcount[op]);
    fprintf(out, "channels:       ");
    for (int t = MSCX_CHAN_MEMORY; t < MSCX_CHAN_COUNT; t++)
        fprintf(out, " %s %" PRIu64 "%s", chan_type_names[t], chans[t], t + 1 < MSCX_CHAN_COUNT ? "," : "\n");
    if (plan->fused || plan->fuse.ops_before)
        fprintf(out, "fusion:          %u ops before, %u after, %u removed\n", plan->fuse.ops_before,
                plan->fuse.ops_after,
                plan->fuse.ops_before > plan->fuse.ops_after ? plan->fuse.ops_before - plan->fuse.ops_after
                                                             : 0);
    if (plan->has_multicast)
        fprintf(out, "multicast:       yes (not executable)\n");
    for (size_t i = 0; i < nsizes; i++) {
        uint64_t in, outb, most = 0;
        struct mscx_geom geom;
        char err[256];
        int ok = 1;
        mscx_coll_sizes(plan->coll, plan->nranks, sizes[i], &in, &outb);
        for (uint32_t r = 0; r < plan->nranks; r++) {
            if (mscx_plan_geom(plan, r, in, outb, MSCX_DT_INT8, &geom, err, sizeof(err)) != MSCX_OK) {
                fprintf(out, "scratch @ %" PRIu64 " B: not usable (%s)\n", sizes[i], err);
                ok = 0;
                break;
            }
            if (geom.scratch_bytes > most)
                most = geom.scratch_bytes;
        }
        if (ok)
            fprintf(out, "scratch @ %" PRIu64 " B: %" PRIu64 " bytes per rank (largest)\n", sizes[i], most);
    }
}
