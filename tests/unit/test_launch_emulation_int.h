/* SPDX-License-Identifier: MIT */
/*
 * Private header of the launch emulation test, shared by
 * test_launch_emulation.c and test_launch_emulation_entries.c: the
 * emulated ranks and their programs, and the functions of
 * test_launch_emulation_entries.c that the schedule calls to run one entry.
 */
#ifndef MSCX_TEST_LAUNCH_EMULATION_INT_H
#define MSCX_TEST_LAUNCH_EMULATION_INT_H

#include <stddef.h>
#include <stdint.h>

#include "launch_abi.h"
#include "plan_model.h"

#define MAXR 16
#define LAUNCHES 2

/* ---- one rank's memory and program ---- */

struct rank_st {
    uint8_t *alloc, *in, *out;    /* user buffers, aliased as the plan's placement says */
    char *scratch;                /* both halves */
    uint64_t scratch_bytes, half; /* mscx_plan_scratch_size(): what upload.c allocates, halves (0: single) */
    struct mscx_dev_op *img;      /* op image with the sync marks */
    struct mscx_compile_rbuf *rb; /* [nrbuf] */
    uint32_t ngeom, geom_rank[MSCX_GPU_MAX_GEOM];
    struct mscx_gpu_args a;
    struct mscx_program prog;
    char *rec;
    uint32_t stride, kmax, pmax;
    /* emulation */
    uint32_t launch, flag, left; /* launch running (LAUNCHES: done), its flag, blocks not finished */
    uint32_t pc[MSCX_PROGRAM_MAX_BLOCKS];
    uint8_t *res_out[LAUNCHES], *res_in[LAUNCHES];
};

struct emu {
    const struct mscx_plan *plan;
    uint32_t n;
    int reduces; /* some rank reduces: the kernel with reductions (else only the copy-only one, op unused) */
    struct rank_st r[MAXR];
    uint64_t msg, in_bytes, out_bytes;
    enum mscx_dtype dt;
    enum mscx_redop op;
    enum mscx_pkt_format pkt;
    int nosplit;    /* shapes of this plan whose programs did not split */
    int noalias;    /* shapes of this out-of-place plan whose programs may not run aliased */
    int alias;      /* an in-place call on an out-of-place plan, the same programs on aliased buffers */
    int split;      /* an out-of-place call on an in-place AllReduce plan: split programs, separate buffers */
    char what[256]; /* plan, size, dtype, operator, format: for messages */
    uint64_t entries_run, units_run, skewed;
    uint64_t fsrc_run; /* REDPKT entries run that read a fused pack's flat source (fsrc) */
};

/* Where the kernel's operand pointer lands (mscx_stage_word). */
struct opnd {
    char *p;
    uint64_t tag;
};

/* The entry being run: its rank, block, index in the block, and the entry. */
struct loc {
    uint32_t rank, block, entry;
    const struct mscx_entry *k;
};

/* test_launch_emulation_entries.c */
/* An entry kind's name (MSCX_ENTRY_*), for messages. */
const char *kind_name(uint32_t k);
/* Fail the test at entry @p L, with the entry's rank, launch, block and op before the message. */
void emu_fail(const struct emu *e, const struct loc *L, const char *fmt, ...);
/* The operands of entry @p L->k, each checked for the bytes it touches; @p is_line: packet lines. */
void entry_operands(const struct emu *e, const struct loc *L, struct opnd *P, uint8_t *is_line);
/* @return 1 when every line the entry reads carries the flag, else 0 (the first missing one in @p wait). */
int entry_ready(const struct emu *e, const struct loc *L, const struct opnd *P, const uint8_t *is_line,
                char *wait, size_t wlen);
/* Run entry @p L->k on the host as the kernel would. */
void entry_run(struct emu *e, const struct loc *L, const struct opnd *P);

#endif
