/* SPDX-License-Identifier: MIT */
/*
 * The in-memory plan model: the plan module's interface to the executor's
 * other modules (not to the shim or the tools, which use mscx/plan.h).
 * A struct mscx_plan is built once by the loader (plan_json.c), checked by
 * the validator (plan_validate.c) and never modified afterwards.
 */
#ifndef MSCX_PLAN_MODEL_H
#define MSCX_PLAN_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include "mscx/plan.h"
#include "mscx/dev_types.h"

enum mscx_protocol {
    MSCX_PROTO_SIMPLE = 0,
    MSCX_PROTO_LL = 1,
};

/* A thread block: its ops are gpu->ops[op_begin, op_begin + nops). */
struct mscx_tb {
    uint32_t op_begin;
    uint32_t nops;
    /* Local channel table per channel type: local index k -> rank-level channel chan[type][k]. */
    uint16_t nchan[MSCX_CHAN_COUNT];
    uint16_t *chan[MSCX_CHAN_COUNT];
    /* Local remote-buffer table per access channel type: k -> gpu->rbuf index. */
    uint16_t nrbuf[MSCX_CHAN_COUNT];
    uint16_t *rbuf[MSCX_CHAN_COUNT];
};

/* A rank-level channel of one type (memory, port). */
struct mscx_chan {
    uint32_t peer;       /* connected_to */
    uint32_t pair;       /* the peer's channel index of the same type that pairs with this one */
    uint32_t occurrence; /* k-th channel of this type from this rank to peer */
    bool paired;         /* false when the peer declares fewer channels to us */
};

/* A switch (multicast) channel: parsed, never executed. */
struct mscx_switch_chan {
    uint8_t buf_type;
    uint32_t ngroups;
    uint32_t *group_size; /* per group */
    uint32_t **group_ranks;
};

struct mscx_rbuf {
    uint32_t rank;       /* owner */
    uint8_t type;        /* enum mscx_buf_type */
    uint8_t access_mask; /* 1u << enum mscx_chan_type */
};

struct mscx_gpu {
    uint32_t id;
    uint32_t input_chunks;
    uint32_t output_chunks;
    uint32_t scratch_chunks;
    uint32_t nchan[MSCX_CHAN_COUNT]; /* memory and port; switch counted in nswitch */
    struct mscx_chan *chan[MSCX_CHAN_COUNT];
    uint32_t nswitch;
    struct mscx_switch_chan *switch_chan;
    uint32_t nrbuf;
    struct mscx_rbuf *rbuf;
    uint32_t nsem;
    int32_t *sem_init;
    uint32_t ntb;
    struct mscx_tb *tb;
    uint32_t nops;           /* all thread blocks, pipeline bodies included */
    struct mscx_dev_op *ops; /* flattened in thread block order */
};

struct mscx_plan {
    char *name;
    char *origin;          /* file name, or the origin given to load_buffer */
    char *collective_name; /* as written */
    enum mscx_coll coll;
    enum mscx_protocol protocol;
    bool inplace;
    bool reuse_resources;
    bool double_scratch;
    bool has_packet_ops;
    bool has_multicast; /* glres, gstore, gstorepkt or switch channels */
    bool has_port;      /* any port channel */
    uint32_t nthreads;  /* num_threads_per_block */
    uint32_t alignment; /* buffer_alignment */
    uint64_t min_size;
    uint64_t max_size;
    uint32_t nranks;
    uint32_t ranks_per_node; /* from the extension, else inferred */
    bool ranks_per_node_given;
    uint32_t root; /* broadcast root: the extension's "root", else 0 */
    bool root_given;
    bool beats_nccl_window; /* the extension's "beats_nccl_window", else false */
    bool ranks_may_differ;  /* "ranks_may_differ": ranks may reduce in different orders */
    uint32_t dtype_mask;    /* 1u << enum mscx_dtype allowed */
    uint32_t redop_mask;    /* 1u << enum mscx_redop allowed */
    bool masks_given;
    uint32_t version;            /* "version" field, 0 when absent */
    struct mscx_fuse_stats fuse; /* carried in the extension object, zero when none */
    bool fused;
    struct mscx_gpu *gpus; /* [nranks], gpus[r].id == r */
};

/*
 * Validation after parsing; fills the derived fields (pairing, masks,
 * ranks_per_node, has_*). The message names the origin and path; the loader
 * adds line and column when it has them.
 * @param where_p on failure, set to a static-lifetime-free JSON path string in
 *        path_buf ("gpus[1].threadblocks[0].ops[2]")
 */
mscx_status_t mscx_plan_validate(struct mscx_plan *plan, char *path_buf, size_t path_len, char *msg,
                                 size_t msg_len);

/* Deep copy; used by the fusion pass. */
mscx_status_t mscx_plan_clone(const struct mscx_plan *plan, struct mscx_plan **copy_p);

/* Free everything the plan owns (tolerates partial construction). */
void mscx_plan_free(struct mscx_plan *plan);

/* Rank-level helpers. */
static inline const struct mscx_gpu *mscx_plan_gpu(const struct mscx_plan *plan, uint32_t rank)
{
    return &plan->gpus[rank];
}

static inline bool mscx_opcode_is_packet(unsigned op)
{
    switch (op) {
    case MSCX_OP_PUT_PACKETS:
    case MSCX_OP_READ_PUT_PACKETS:
    case MSCX_OP_COPY_PACKETS:
    case MSCX_OP_UNPACK_PACKETS:
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
    case MSCX_OP_MULTI_STORE_PKT:
        return true;
    default:
        return false;
    }
}

static inline bool mscx_opcode_is_multicast(unsigned op)
{
    return op == MSCX_OP_MULTI_LOAD_REDUCE_STORE || op == MSCX_OP_MULTI_STORE ||
           op == MSCX_OP_MULTI_STORE_PKT;
}

/* Two ranks' chunk counts are equal: their operands resolve with the same geometry. */
static inline bool mscx_gpu_same_chunks(const struct mscx_gpu *g, const struct mscx_gpu *h)
{
    return g->input_chunks == h->input_chunks && g->output_chunks == h->output_chunks &&
           g->scratch_chunks == h->scratch_chunks;
}

/*
 * The scratch that rank @p rank of @p plan allocates for messages up to
 * @p max_msg (the most any dtype needs), and, for double-buffered plans, its
 * fixed half: the size is then rounded up to 256 bytes and split in two, the
 * odd-flag launches using [0, half), the even ones [half, 2 * half),
 * whatever their message size (so a peer one launch ahead never writes
 * where this launch reads). @p half_p gets 0 for single-buffered plans.
 */
void mscx_plan_scratch_size(const struct mscx_plan *plan, uint32_t rank, uint64_t max_msg, uint64_t *bytes_p,
                            uint64_t *half_p);

static inline bool mscx_opcode_reduces(unsigned op)
{
    switch (op) {
    case MSCX_OP_REDUCE:
    case MSCX_OP_REDUCE_SEND:
    case MSCX_OP_REDUCE_PACKETS:
    case MSCX_OP_REDUCE_COPY_PACKETS:
    case MSCX_OP_REDUCE_SEND_PACKETS:
    case MSCX_OP_REDUCE_COPY_SEND_PACKETS:
    case MSCX_OP_READ_REDUCE:
    case MSCX_OP_READ_REDUCE_SEND:
    case MSCX_OP_MULTI_LOAD_REDUCE_STORE:
        return true;
    default:
        return false;
    }
}

#endif /* MSCX_PLAN_MODEL_H */
