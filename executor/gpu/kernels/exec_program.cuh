/* SPDX-License-Identifier: MIT */
/*
 * The compiled program's device side (block records, struct
 * mscx_record_head, offsets resolved by the host): the entries, the entry
 * loop mscx_run_entries and its straight-line shapes, the staging of a
 * block's record in shared memory, and the block's state at the start and
 * end of a launch. Included by kernels/exec_ops.cuh after the op dispatcher
 * (mscx_dop_run, for GENERIC entries) and the flag wrap's clearing, which it
 * uses.
 */
#ifndef MSCX_EXEC_PROGRAM_CUH
#define MSCX_EXEC_PROGRAM_CUH

/*
 * The entries below run a block's slice of @p n units; @p P are the entry's
 * operands (sources, then destinations) resolved for this launch, @p flag the
 * launch's. Their semantics are the interpreter's fast paths. Loops over a
 * packet entry's line destinations are not unrolled: less code between the
 * hot paths.
 */

/* PACK: src[0] flat -> dst[0..ndst) lines; @p first: this thread's first unit, loaded (if @p has_first) */
template <uint32_t PKT>
__device__ __forceinline__ void mscx_entry_pack(const struct mscx_entry *k, char *const *P, uint32_t n,
                                                uint32_t flag, bool has_first, uint4 first)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    const char *ps = P[0];
    const uint32_t nd = k->ndst;
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
        const uint4 v = has_first && u == threadIdx.x ? first : mscx_dvload<pl>(ps + (uint64_t)u * pl);
#pragma unroll 1
        for (uint32_t j = 0; j < nd; j++)
            mscx_dline_store<PKT>(P[1 + j] + 2u * pl * u, v, flag);
    }
}

/* UNPACK: src[0] lines -> dst[0] flat. @return non-zero after giving up. */
template <uint32_t PKT>
__device__ __forceinline__ int mscx_entry_unpack(const struct mscx_dstate *s, char *const *P, uint32_t n)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    const char *sl = P[0];
    char *pd = P[1];
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
        uint4 v;
        if (mscx_dline_read<PKT>(s, sl + 2u * pl * u, &v))
            return 1;
        mscx_dvstore<pl>(pd + (uint64_t)u * pl, v);
    }
    return 0;
}

/* FWD: src[0] lines -> dst[0..ndst) lines. @return non-zero after giving up. */
template <uint32_t PKT>
__device__ __forceinline__ int mscx_entry_fwd(const struct mscx_dstate *s, const struct mscx_entry *k,
                                              char *const *P, uint32_t n, uint32_t flag)
{
    const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
    const char *sl = P[0];
    uint32_t nd = k->ndst;
    if (nd == 1) {
        char *dl = P[1];
        for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
            uint4 v;
            if (mscx_dline_read<PKT>(s, sl + 2u * pl * u, &v))
                return 1;
            mscx_dline_store<PKT>(dl + 2u * pl * u, v, flag);
        }
        return 0;
    }
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
        uint4 v;
        if (mscx_dline_read<PKT>(s, sl + 2u * pl * u, &v))
            return 1;
#pragma unroll 1
        for (uint32_t j = 0; j < nd; j++)
            mscx_dline_store<PKT>(P[1 + j] + 2u * pl * u, v, flag);
    }
    return 0;
}

/* COPY: src[0] flat -> dst[0] flat, 16-byte units */
__device__ __forceinline__ void mscx_entry_copy(char *const *P, uint32_t n)
{
    const char *ps = P[0];
    char *pd = P[1];
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x)
        *(uint4 *)(pd + (uint64_t)u * 16u) = *(const uint4 *)(ps + (uint64_t)u * 16u);
}

/* REDUCE: src[0..] flat folded -> dst[0..] flat, 16-byte units */
template <uint32_t DT>
__device__ __forceinline__ void mscx_entry_reduce(const struct mscx_dstate *s, const struct mscx_entry *k,
                                                  char *const *P, uint32_t n)
{
    const uint32_t ns = k->nsrc, nd = k->ndst, rop = s->rop;
    for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
        uint64_t x = (uint64_t)u * 16u;
        uint4 acc = *(const uint4 *)(P[0] + x);
        for (uint32_t j = 1; j < ns; j++)
            acc = mscx_dreduce<DT, 4>(rop, acc, *(const uint4 *)(P[j] + x));
        for (uint32_t j = 0; j < nd; j++)
            *(uint4 *)(P[ns + j] + x) = acc;
    }
}

/*
 * Run compiled entry @p k (of kind KIND when KIND >= 0, a compile-time
 * constant); @return non-zero after giving up.
 */
template <uint32_t PKT, uint32_t DT, bool RED, enum mscx_kernel_body BODY, uint32_t MAX_THREADS,
          int KIND = -1>
__device__ __forceinline__ int mscx_entry_run(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                              const struct mscx_entry *k, uint32_t obase, char *const *P,
                                              bool has_first = false, uint4 first = make_uint4(0, 0, 0, 0))
{
    const uint32_t n = k->units, flag = s->flag;
    const uint32_t kind = KIND >= 0 ? (uint32_t)KIND : k->kind;
    if constexpr (BODY == MSCX_BODY_PACKET) {
        /* the host runs only packet programs that sum here (mscx_gpu_kernel_variant); anything else is a bug,
           never skipped silently */
        if (!mscx_entry_is_packet(kind) || (RED && s->rop != MSCX_REDOP_SUM)) {
            mscx_dfail(s, MSCX_ERR_INTERNAL);
            return 1;
        }
    }
    switch (kind) {
    case MSCX_ENTRY_PACK:
        mscx_entry_pack<PKT>(k, P, n, flag, has_first, first);
        return 0;
    case MSCX_ENTRY_UNPACK:
        return mscx_entry_unpack<PKT>(s, P, n);
    case MSCX_ENTRY_FWD:
        return mscx_entry_fwd<PKT>(s, k, P, n, flag);
    case MSCX_ENTRY_REDPKT: {
        /*
         * REDPKT: src[0] flat, or lines if lsrc0, (+) src[1..] lines
         * (src[fsrc] flat if fsrc) -> dst[0] flat (if ndst), dst[1..] lines;
         * the packet kernel sums. Its code stays in this switch: moved
         * into a function of its own, it is scheduled differently (ptxas).
         */
        if (!RED)
            return 0;
        const uint32_t pl = PKT == MSCX_PKT_LL8 ? 4u : 8u;
        const uint32_t nw = pl / 4u;
        constexpr uint32_t BATCH = mscx_line_batch<BODY, MAX_THREADS>;
        const uint32_t ns = k->nsrc, nd = k->ndst, rop = s->rop;
        /* bit i: source i is read flat, not as lines (fsrc: a pack fused in; 0 when none) */
        const uint32_t fmask = k->fsrc ? 1u << k->fsrc : 0u;
        const char *p0 = P[0];
        const bool l0 = k->lsrc0;
        for (uint32_t u = threadIdx.x; u < n; u += blockDim.x) {
            uint64_t x = (uint64_t)u * pl;
            uint4 acc = make_uint4(0, 0, 0, 0);
            /*
             * The lines of up to BATCH sources are loaded at once, then
             * folded in source order. The flat source (fmask) is loaded where
             * it is folded, its payload being what its packed line would
             * carry: loaded with the lines, it gives the whole-program kernels a
             * stack frame; the one-shot's puts have just read the same bytes,
             * so it should mostly hit in cache.
             */
            uint32_t j = l0 ? 0u : 1u;
            if (!l0)
                acc = mscx_dvload<pl>(p0 + x);
            for (; j < ns; j += BATCH) {
                uint4 raw[BATCH];
                const uint32_t fb = fmask >> j;
#pragma unroll
                for (uint32_t q = 0; q < BATCH; q++)
                    if (j + q < ns && !(fb & (1u << q)))
                        raw[q] = mscx_dline_peek<PKT>(P[j + q] + 2u * x);
#pragma unroll
                for (uint32_t q = 0; q < BATCH; q++) {
                    if (j + q >= ns)
                        break;
                    uint4 v;
                    if (fb & (1u << q))
                        v = mscx_dvload<pl>(P[j + q] + x);
                    else if (mscx_dline_ready<PKT>(raw[q], flag))
                        v = mscx_dline_payload<PKT>(raw[q]);
                    else if (mscx_dline_read<PKT>(s, P[j + q] + 2u * x, &v))
                        return 1;
                    if (j + q == 0)
                        acc = v;
                    else if constexpr (BODY == MSCX_BODY_PACKET)
                        acc = mscx_dreduce_t<DT, MSCX_REDOP_SUM, nw>(acc, v);
                    else
                        acc = mscx_dreduce<DT, nw>(rop, acc, v);
                }
            }
            if (nd > 0)
                mscx_dvstore<pl>(P[ns] + x, acc);
#pragma unroll 1
            for (uint32_t j = 1; j < nd; j++)
                mscx_dline_store<PKT>(P[ns + j] + 2u * x, acc, flag);
        }
        return 0;
    }
    case MSCX_ENTRY_COPY:
        if constexpr (BODY != MSCX_BODY_PACKET)
            mscx_entry_copy(P, n);
        return 0; /* packet kernel: not reached (above) */
    case MSCX_ENTRY_REDUCE:
        if (RED && BODY != MSCX_BODY_PACKET)
            mscx_entry_reduce<DT>(s, k, P, n);
        return 0; /* not reduced here, or not reached (above) */
    case MSCX_ENTRY_SKIP:
        return 0;
    default: { /* GENERIC: the interpreter runs the op from the uploaded table (never in a whole-program
                  kernel) */
        if constexpr (BODY != MSCX_BODY_INTERPRETER) {
            return 0;
        } else {
            struct mscx_dpipe none = {0, 0};
            return mscx_dop_run<PKT, DT, RED>(s, &a->ops[obase + k->op], &none);
        }
    }
    }
}

/* An operand word of a record as pointers for launches of flag parity 0 and 1 (the same for user buffers). */
__device__ __forceinline__ void mscx_tagged_ptr(const struct mscx_gpu_args *a, uint4 w, char **p0, char **p1)
{
    uint64_t v0 = ((uint64_t)w.y << 32) | w.x, v1 = ((uint64_t)w.w << 32) | w.z;
    uint64_t tag = v0 >> MSCX_TAGGED_TAG_SHIFT;
    if (tag == 0) {
        *p0 = (char *)(uintptr_t)v0;
        *p1 = (char *)(uintptr_t)v1;
    } else {
        *p0 = *p1 = (tag == 1 ? (char *)a->in : (char *)a->out) + (v0 & MSCX_TAGGED_OFF_MASK);
    }
}

/*
 * One word (16 bytes) of a block's record (struct mscx_record_head), staged
 * in shared memory: the head, an entry, or an operand resolved to a pointer
 * for this launch (scratch half by flag parity, user buffers against in/out).
 */
__device__ __forceinline__ void mscx_stage_word(const struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                uint32_t t, uint4 w, struct mscx_record_head *head,
                                                struct mscx_entry *entry, char **ptr)
{
    const uint32_t km = a->kmax_ops;
    if (t == 0) {
        *head = *reinterpret_cast<const struct mscx_record_head *>(&w);
    } else if (t <= km) {
        entry[t - 1] = *reinterpret_cast<const struct mscx_entry *>(&w);
    } else {
        char *p0, *p1;
        mscx_tagged_ptr(a, w, &p0, &p1);
        ptr[t - 1 - km] = s->parity ? p1 : p0;
    }
}

/*
 * The block shapes that the packet kernel runs straight-line (see
 * mscx_run_entries), told apart before the wait from the staged record.
 */
#define MSCX_SHAPE_ANY 0u                /* the entry loop */
#define MSCX_SHAPE_PACK_REDPKT 1u        /* the one-shot's */
#define MSCX_SHAPE_PACK_REDPKT_UNPACK 2u /* the two-phase's */

/* Straight-line: entry @p k, of kind KIND, as the loop of mscx_run_entries runs it untraced. */
template <uint32_t PKT, uint32_t DT, bool RED, enum mscx_kernel_body BODY, uint32_t MAX_THREADS, int KIND>
__device__ __forceinline__ void mscx_straight_entry(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                    const struct mscx_entry *k, uint32_t obase,
                                                    char *const *sptr, bool has_first = false,
                                                    uint4 first = make_uint4(0, 0, 0, 0))
{
    s->op_index = k->op;
    s->opcode = k->opcode;
    if (k->sync)
        __syncthreads();
    mscx_entry_run<PKT, DT, RED, BODY, MAX_THREADS, KIND>(s, a, k, obase, &sptr[k->opnd], has_first, first);
}

/*
 * Entries [0, @p nk) of a block's staged program; @p sptr its operands
 * resolved for this launch. The packet kernel runs a block of a known
 * @p shape through straight-line calls whose entry kinds are compile-time
 * constants, with no entry loop, kind guard or switch on that path; every
 * operand, count, sync and flag still comes from the plan, and the entries'
 * code is the loop's.
 */
template <uint32_t PKT, uint32_t DT, bool RED, enum mscx_kernel_body BODY, uint32_t MAX_THREADS>
__device__ __forceinline__ void
mscx_run_entries(struct mscx_dstate *s, const struct mscx_gpu_args *a, struct mscx_dtrace *tr, uint32_t nk,
                 uint32_t obase, const struct mscx_entry *sentry, char *const *sptr, bool has_first = false,
                 uint4 first = make_uint4(0, 0, 0, 0), uint32_t shape = MSCX_SHAPE_ANY)
{
    if constexpr (BODY == MSCX_BODY_PACKET) {
        if (shape != MSCX_SHAPE_ANY) {
            /* as the loop below: the error state ends later entries' waits (mscx_dfail) */
            mscx_straight_entry<PKT, DT, RED, BODY, MAX_THREADS, MSCX_ENTRY_PACK>(s, a, &sentry[0], obase,
                                                                                  sptr, has_first, first);
            mscx_straight_entry<PKT, DT, RED, BODY, MAX_THREADS, MSCX_ENTRY_REDPKT>(s, a, &sentry[1], obase,
                                                                                    sptr);
            if (shape == MSCX_SHAPE_PACK_REDPKT_UNPACK)
                mscx_straight_entry<PKT, DT, RED, BODY, MAX_THREADS, MSCX_ENTRY_UNPACK>(s, a, &sentry[2],
                                                                                        obase, sptr);
            return;
        }
    }
    for (uint32_t i = 0; i < nk; i++) {
        const struct mscx_entry *k = &sentry[i];
        char *const *P = &sptr[k->opnd];
        s->op_index = k->op;
        s->opcode = k->opcode;
        /*
         * One call site for traced and untraced runs: the entry's code is
         * inlined once (two sites would double the kernel's code).
         * Traced: the block's start of the entry to its last thread's end.
         */
        const bool traced = BODY != MSCX_BODY_PACKET && tr->recs != NULL;
        if (k->sync || traced)
            __syncthreads();
        const uint64_t t0 = traced ? mscx_dtime() : 0;
        mscx_entry_run<PKT, DT, RED, BODY, MAX_THREADS>(s, a, k, obase, P, has_first && i == 0, first);
        if (traced) {
            __syncthreads();
            mscx_dtrace_rec(tr, k->op, k->opcode, t0);
        }
    }
}

/*
 * The interpreter kernel's compiled block @p blk. The block stages its
 * record in shared memory: every thread loads a different 16-byte word, all
 * loads independent (@p w0, thread t's first word, was loaded at kernel
 * entry beside the block's flag), then one barrier.
 */
template <uint32_t PKT, uint32_t DT, bool RED, uint32_t MAX_THREADS>
__device__ __forceinline__ void mscx_run_compiled(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                  struct mscx_dtrace *tr, uint32_t blk, uint4 w0)
{
    __shared__ struct mscx_record_head shead;
    __shared__ struct mscx_entry sentry[MSCX_PROGRAM_MAX_OPS];
    __shared__ char *sptr[MSCX_PROGRAM_MAX_OPND];
    const uint4 *rec = reinterpret_cast<const uint4 *>(a->program + (uint64_t)blk * a->kstride);
    const uint32_t nwords = a->kstride / 16u;
    if (threadIdx.x < nwords)
        mscx_stage_word(s, a, threadIdx.x, w0, &shead, sentry, sptr);
    for (uint32_t t = threadIdx.x + blockDim.x; t < nwords; t += blockDim.x)
        mscx_stage_word(s, a, t, __ldg(rec + t), &shead, sentry, sptr);
    __syncthreads();
    if (tr->recs)
        mscx_dtrace_rec(tr, 0, MSCX_TRACE_OP_PROLOGUE, tr->t0);
    mscx_run_entries<PKT, DT, RED, MSCX_BODY_INTERPRETER, MAX_THREADS>(s, a, tr, shead.nk, shead.obase,
                                                                       sentry, sptr);
}

/*
 * The whole-program kernels stage their record before the programmatic-launch
 * wait, each scratch operand resolved for both flag parities, since nothing
 * in the record depends on the kernel ahead; after the wait only the block's
 * flag is read, and the staging's barrier is off that path.
 */
struct mscx_staged_record {
    struct mscx_record_head head;
    struct mscx_entry entry[MSCX_PROGRAM_MAX_OPS];
    char *ptr[2][MSCX_PROGRAM_MAX_OPND]; /* [launch flag parity][operand] */
};

__device__ __forceinline__ const struct mscx_staged_record *mscx_stage_record(const struct mscx_gpu_args *a,
                                                                              uint32_t blk, uint4 w0)
{
    __shared__ struct mscx_staged_record st;
    const uint4 *rec = reinterpret_cast<const uint4 *>(a->program + (uint64_t)blk * a->kstride);
    const uint32_t nwords = a->kstride / 16u, km = a->kmax_ops;
    for (uint32_t t = threadIdx.x; t < nwords; t += blockDim.x) {
        const uint4 w = t == threadIdx.x ? w0 : __ldg(rec + t);
        if (t == 0)
            st.head = *reinterpret_cast<const struct mscx_record_head *>(&w);
        else if (t <= km)
            st.entry[t - 1] = *reinterpret_cast<const struct mscx_entry *>(&w);
        else
            mscx_tagged_ptr(a, w, &st.ptr[0][t - 1 - km], &st.ptr[1][t - 1 - km]);
    }
    __syncthreads();
    return &st;
}

/*
 * Where a block's program starts with a PACK whose source is the same for
 * both flag parities (a user buffer, not scratch), the address of this
 * thread's first unit of it (NULL: no such start, or no unit here): the
 * packet kernel loads that unit right after the wait, beside the
 * block's flag, instead of after it.
 */
__device__ __forceinline__ const char *mscx_first_unit_src(const struct mscx_staged_record *st, uint32_t pl)
{
    if (st->head.nk == 0)
        return NULL;
    const struct mscx_entry *k = &st->entry[0];
    const char *p = st->ptr[0][k->opnd];
    if (k->kind != MSCX_ENTRY_PACK || p != st->ptr[1][k->opnd] || threadIdx.x >= k->units)
        return NULL;
    return p + (uint64_t)threadIdx.x * pl;
}

/* The block's shape (MSCX_SHAPE_*) for the straight-line run of mscx_run_entries. */
__device__ __forceinline__ uint32_t mscx_block_shape(const struct mscx_staged_record *st)
{
    const uint32_t nk = st->head.nk;
    if (nk < 2 || nk > 3 || st->entry[0].kind != MSCX_ENTRY_PACK || st->entry[1].kind != MSCX_ENTRY_REDPKT)
        return MSCX_SHAPE_ANY;
    if (nk == 2)
        return MSCX_SHAPE_PACK_REDPKT;
    return st->entry[2].kind == MSCX_ENTRY_UNPACK ? MSCX_SHAPE_PACK_REDPKT_UNPACK : MSCX_SHAPE_ANY;
}

/* The load of mscx_first_unit_src, kept after the wait and before the flag's load (asm volatile). */
template <uint32_t PKT> __device__ __forceinline__ uint4 mscx_first_unit_load(const char *p)
{
    uint4 v = make_uint4(0, 0, 0, 0);
    if (PKT == MSCX_PKT_LL8)
        asm volatile("ld.global.u32 %0, [%1];" : "=r"(v.x) : "l"(p) : "memory");
    else
        asm volatile("ld.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}

/* The block's state for this launch, once the flag of its last launch @p prev is known. */
__device__ __forceinline__ void mscx_dstate_init(struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                                 uint32_t prev, uint32_t rop)
{
    s->a = a;
    s->ctx = a->ctx;
    s->flag = mscx_flag_next(prev);
    s->parity = s->flag & 1u;
    s->so = mscx_scratch_offset(s->flag, a->scratch_half);
    s->op_index = 0;
    s->opcode = 0;
    s->rop = rop;
}

/* The end of a block's launch: the wrap's clearing, then the trace position and the block's flag. */
__device__ __forceinline__ void mscx_block_end(const struct mscx_dstate *s, const struct mscx_gpu_args *a,
                                               const struct mscx_dtrace *tr)
{
    if (mscx_gpu_wrap_clear(s->flag) && a->scratch)
        mscx_dwrap_clear(s);
    if (threadIdx.x == 0) {
        if (tr->recs)
            a->trace_n[blockIdx.x] = tr->n;
        *(volatile uint32_t *)&a->bflag[blockIdx.x] = s->flag;
    }
}

#endif /* MSCX_EXEC_PROGRAM_CUH */
